//! The dataplane watchdog end to end: a switchd built with the test-only
//! cargo feature `fault-injection` stops dataplane thread 0 after some
//! received frames of a verified all-reduce; the watchdog must notice
//! within `watchdog_secs`, log the thread and its port/queue, and switchd
//! must exit with status 70 (for its supervisor to restart it), leaving no
//! XDP program attached.
//!
//! The feature build goes to its own target directory
//! (`target/fault-injection`), so the release binaries the other tests use
//! never carry the hook; the test runs that build itself (minutes the first
//! time). Testbeds `op1` and `op2`, two workers each. Needs root; under
//! `CI=true` it fails rather than skips when something is missing.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agg_e2e::*;

/// The watchdog's limit in these tests.
const WATCHDOG_SECS: u64 = 2;
/// The switchd grace after a stall before the watchdog exits by itself
/// (switchd's `watchdog::EXIT_GRACE`), plus the 500 ms check period and
/// slack for a loaded machine.
const EXIT_SLACK: Duration = Duration::from_secs(5);
/// Frames thread 0 handles before it stops: the job is joined and the
/// all-reduce under way by then.
const STALL_AFTER: &str = "300";

/// Builds switchd with the fault-injection feature (once per test process).
fn fault_switchd() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = repo_root().join("target/fault-injection");
        let out = Command::new(env!("CARGO"))
            .current_dir(repo_root())
            .args(["build", "--release", "-p", "switchd"])
            .args(["--features", "fault-injection", "--bins", "--target-dir"])
            .arg(&dir)
            .output()
            .expect("running cargo build");
        assert!(
            out.status.success(),
            "building switchd with --features fault-injection failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir.join("release/switchd")
    })
    .clone()
}

/// Runs a 2-worker all-reduce through a switchd whose thread 0 stops after
/// [`STALL_AFTER`] frames; returns the switchd (exited) and its log.
/// With `sigterm`, switchd is asked to stop right after the thread stops
/// (before the watchdog fires): the shutdown must not hang on the thread.
fn stall_run(prefix: &str, holding_table: bool, sigterm: bool) -> (Testbed, Switchd) {
    let bin = fault_switchd();
    let tb = Testbed::up(prefix, 2, 0);
    let mut env = vec![("AGGSWITCH_FAULT_STALL_AFTER_PACKETS", STALL_AFTER)];
    if holding_table {
        env.push(("AGGSWITCH_FAULT_STALL_HOLDING_TABLE", "1"));
    }
    let mut sw = Switchd::start_custom(
        &tb,
        &[JobSpec::new(1, 2)],
        &format!("watchdog_secs = {WATCHDOG_SECS}\n"),
        &bin,
        &env,
    );
    assert!(
        sw.log_text().contains("FAULT INJECTION"),
        "the feature build announces the fault:\n{}",
        sw.log_text()
    );
    let workers: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_with(&tb, &tb.worker_ns(r), 1, r, 2, 1_000_000, 3, 60))
        .collect();
    // When the thread stops (it logs it), the clock starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sw.log_text().contains("dataplane thread stops now") {
        assert!(
            Instant::now() < deadline,
            "thread 0 never reached {STALL_AFTER} frames:\n{}",
            sw.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = Instant::now();
    if sigterm {
        let pid = sw.pid().expect("switchd runs").to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    }
    let status = sw.wait_exit(Duration::from_secs(WATCHDOG_SECS) + EXIT_SLACK);
    let took = stopped.elapsed();
    for w in workers {
        // They cannot finish: the switch is gone. Their outcome is not the
        // point here; end them.
        let _ = wait_with_timeout(w, Duration::ZERO);
    }
    let log = sw.log_text();
    let status = status
        .unwrap_or_else(|| panic!("switchd still runs {took:?} after thread 0 stopped:\n{log}"));
    assert_eq!(status.code(), Some(70), "exit status after a stall:\n{log}");
    assert!(
        took >= Duration::from_secs(WATCHDOG_SECS),
        "exited after {took:?}, before the {WATCHDOG_SECS} s limit:\n{log}"
    );
    eprintln!(
        "watchdog ({prefix}, holding table: {holding_table}): exit 70 {took:?} after the stall"
    );
    assert!(
        log.contains("dataplane thread 0 (port/queue sw-w0/0, sw-w1/0) made no progress"),
        "the log names the stuck thread and its sockets:\n{log}"
    );
    assert!(
        log.contains("its supervisor should restart it"),
        "the last line tells the operator why:\n{log}"
    );
    let left = tb.ports_with_xdp();
    assert!(left.is_empty(), "XDP program left attached on {left:?}");
    (tb, sw)
}

#[test]
#[ignore = "needs root"]
fn a_stuck_dataplane_thread_ends_switchd_with_status_70_and_counts_the_stall() {
    if !can_run("watchdog_stall") {
        return;
    }
    let (_tb, sw) = stall_run("op1", false, false);
    // The table was free: main wrote the final counters before exiting.
    let stats = sw.stats();
    assert_eq!(stats["dataplane_stalls"], 1, "final stats: {stats}");
    // Counted against the thread that was stuck (the only one here).
    assert_eq!(stats["threads"][0]["dataplane_stalls"], 1, "{stats}");
    // The stuck thread's own counters stop at its last publication; the
    // table's show the all-reduce got as far as the fault let it. Thread 0
    // stops after the round (up to 64 frames from each of its 2 sockets)
    // that takes it to STALL_AFTER frames. Some of those frames are not
    // contributions (each rank's HELLO and JOIN, a resend dropped as a
    // duplicate), so a round that ends right at the count leaves fewer than
    // STALL_AFTER (296 in one CI run). A final-stats file that did not read
    // the table would show none.
    let stall_after: u64 = STALL_AFTER.parse().unwrap();
    let contributions = job(&stats, 1)["contributions"].as_u64().unwrap_or(0);
    assert!(
        contributions >= stall_after / 2 && contributions <= stall_after + 2 * 64,
        "{contributions} contributions for a thread stopped after {stall_after} frames \
         (rounds of up to 2 × 64): {stats}"
    );
}

#[test]
#[ignore = "needs root"]
fn a_thread_stuck_holding_the_job_table_still_ends_switchd() {
    if !can_run("watchdog_stall_holding_table") {
        return;
    }
    // The control thread blocks on the table too: the watchdog thread must
    // end the process itself.
    let (_tb, sw) = stall_run("op2", true, false);
    assert!(
        sw.log_text()
            .contains("the final counters could not be written"),
        "{}",
        sw.log_text()
    );
}

#[test]
#[ignore = "needs root"]
fn a_stop_request_while_a_thread_is_stuck_does_not_hang() {
    if !can_run("watchdog_stall_then_sigterm") {
        return;
    }
    // SIGTERM stops the healthy threads; main would wait for the stuck one
    // forever, so the watchdog still has to end switchd.
    stall_run("op5", false, true);
}

#[test]
#[ignore = "needs root"]
fn an_idle_switch_is_not_a_stall() {
    if !can_run("watchdog_idle") {
        return;
    }
    // The release build (no fault hook), a short limit, an all-reduce and
    // then nothing: threads asleep in poll(2) must not trip the watchdog.
    let tb = Testbed::up("op3", 2, 0);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 2)], "watchdog_secs = 1\n");
    let workers: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 100_000, 2))
        .collect();
    expect_verified(workers);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(sw.wait_exit(Duration::ZERO), None, "{}", sw.log_text());
    let stats = stop_clean(&tb, &mut sw);
    assert_eq!(stats["dataplane_stalls"], 0, "{stats}");
    assert!(
        !sw.log_text().contains("made no progress"),
        "{}",
        sw.log_text()
    );
}
