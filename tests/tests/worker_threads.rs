//! End-to-end tests of one collective carried by T worker threads (issue
//! 38; docs/design/worker-threads.md): every rank runs `worker allreduce
//! --threads T` against switchd with `seq_lanes` ≥ T, which grants lane
//! replies (the RESULT of seq s comes from port P + s mod L), so each thread
//! sends and receives its own lanes on its own socket.
//!
//! * T = 2 on 2 seq lanes, and T = 4 on 4, under loss, duplication and
//!   reordering on every worker's eth0, both directions: every rank
//!   verifies the sum bit for bit and reports the threads that carried it.
//! * T = 2 on 2 seq lanes under the same faults with switchd killed
//!   (SIGKILL by PID) mid-run and started again: every rank rejoins the new
//!   generation and verifies.
//! * T = 2 against switchd with `seq_lanes = 1`: no lane replies, so the
//!   worker falls back to one thread, verifies and reports 1.
//!
//! The faults are `scripts/impair.sh` on every IPv4 packet of the workers'
//! eth0 ([`Impairment::apply_every_port`]), not only UDP 48879's as in
//! faults.rs: lane l's DATA goes to 48879 + l and its RESULTs come from
//! there. Each test makes its own testbed (prefix `wth…`) and removes it,
//! also on failure. They need root; under `CI=true` they fail rather than
//! skip when something they need is missing.

use std::process::Child;

use agg_e2e::*;

/// 1 MiB of float32 per rank: 733 chunks of 358 elements, an odd number,
/// so the threads' shares differ by one chunk and the last one is short.
const ELEMENTS: usize = 262_144;
const ITERATIONS: u32 = 3;
const WORKERS: u16 = 4;
/// Elements per chunk at MTU 1500 (jobs.rs says how).
const E: usize = 358;

/// 5 % loss, 1 % duplication, 25 % reordering, each direction.
const LOSS_PCT: f64 = 5.0;
const DUP_PCT: f64 = 1.0;
const REORDER_PCT: f64 = 25.0;

/// Two queues and two dataplane threads, as faults.rs's seq-lane test,
/// with `seq_lanes` lanes.
fn lanes(seq_lanes: u16) -> Lanes {
    Lanes {
        queues: 2,
        threads: 2,
        seq_lanes,
    }
}

/// The `worker allreduce` flags for `threads` threads.
fn threads_flag(threads: u16) -> [String; 2] {
    ["--threads".into(), threads.to_string()]
}

/// A report's number `key`, or a panic naming the rank and the report.
fn number(r: &serde_json::Value, key: &str, rank: usize) -> u64 {
    r[key]
        .as_u64()
        .unwrap_or_else(|| panic!("rank {rank}: no number {key:?} in its report: {r}"))
}

/// Every rank's report says the run was verified bit for bit, with the
/// switch's `seq_lanes`.
fn assert_verified(reports: &[serde_json::Value], seq_lanes: u16) {
    assert_eq!(reports.len(), usize::from(WORKERS));
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["verified"], true, "rank {i}: {r}");
        assert_eq!(r["mismatches"], 0, "rank {i}: {r}");
        assert_eq!(number(r, "seq_lanes", i), u64::from(seq_lanes), "rank {i}");
    }
}

/// Every rank's report says `threads` threads carried its last collective
/// (`--threads` asked for `asked`). Checked last, after the sums and the
/// switch's counters.
fn assert_threads(reports: &[serde_json::Value], asked: u16, threads: u16) {
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(
            number(r, "threads", i),
            u64::from(threads),
            "rank {i}: --threads {asked} against seq_lanes = {}: {r}",
            r["seq_lanes"]
        );
    }
}

/// Sums `key` of every report's `stats`.
fn stats_sum(reports: &[serde_json::Value], key: &str) -> u64 {
    reports
        .iter()
        .map(|r| r["stats"][key].as_u64().unwrap_or(0))
        .sum()
}

/// `threads` threads per rank on `seq_lanes` lanes under every fault at
/// once: bit-exact, every chunk completed once at the switch, the faults
/// really there.
fn faults_test(test: &str, prefix: &str, seq_lanes: u16, threads: u16) {
    if !can_run(test) {
        return;
    }
    let lanes = lanes(seq_lanes);
    let tb = Testbed::up_lanes(prefix, WORKERS, 0, lanes);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, WORKERS)], &lanes.switch_toml());
    let imp = match Impairment::apply_every_port(&tb, LOSS_PCT, DUP_PCT, REORDER_PCT) {
        Ok(imp) => imp,
        Err(why) => return unavailable(test, &why),
    };
    let reports = run_ranks_verified(
        &tb,
        1,
        WORKERS,
        (ELEMENTS, ITERATIONS),
        20,
        &threads_flag(threads).each_ref().map(String::as_str),
    );
    let inj = imp.injected();
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    eprintln!(
        "{threads} threads on {seq_lanes} seq lanes: resent {}, duplicate results {}, rejoins {}; \
         switch: retransmits served {}, duplicates dropped {}; injected over {} frames: \
         dropped {}, duplicated {}, delayed {}",
        stats_sum(&reports, "chunks_resent"),
        stats_sum(&reports, "duplicate_results"),
        stats_sum(&reports, "rejoins"),
        j["retransmits_served"],
        j["drops"]["duplicate"],
        inj.frames,
        inj.dropped,
        inj.duplicated,
        inj.delayed,
    );
    assert_verified(&reports, seq_lanes);
    // Every chunk completed exactly once at the switch, whatever was lost,
    // duplicated or reordered, whichever thread sent it.
    let chunks = ELEMENTS.div_ceil(E) as u64;
    assert_eq!(
        j["chunks_completed"].as_u64(),
        Some(u64::from(ITERATIONS) * chunks),
        "{j}"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");
    // The faults were really there, on every lane's port.
    assert!(inj.frames > 0, "the impairment saw no frames: {inj:?}");
    assert!(inj.dropped > 0, "{inj:?}");
    assert!(inj.duplicated > 0, "{inj:?}");
    assert!(inj.delayed > 0, "{inj:?}");
    assert!(
        stats_sum(&reports, "chunks_resent") > 0,
        "frames were lost but nothing was resent"
    );
    tb.assert_spread_over_queues(&stats, lanes);
    assert_threads(&reports, threads, threads);
}

#[test]
#[ignore = "needs root"]
fn two_threads_on_2_seq_lanes_are_bit_exact_under_loss_duplication_and_reordering() {
    faults_test("worker_threads_2_faults", "wth1", 2, 2);
}

#[test]
#[ignore = "needs root"]
fn four_threads_on_4_seq_lanes_are_bit_exact_under_loss_duplication_and_reordering() {
    faults_test("worker_threads_4_faults", "wth2", 4, 4);
}

/// Two threads per rank under the same faults; switchd is killed by PID
/// mid-run and started again: every rank rejoins the new generation from
/// the oldest chunk any of its threads still waits for, and verifies.
#[test]
#[ignore = "needs root"]
fn two_threads_rejoin_a_restarted_switchd_and_stay_bit_exact() {
    const TEST: &str = "worker_threads_restart";
    if !can_run(TEST) {
        return;
    }
    // Long enough that the kill lands mid-run: 10 × 733 chunks.
    const ITERS: u32 = 10;
    let lanes = lanes(2);
    let tb = Testbed::up_lanes("wth3", WORKERS, 0, lanes);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, WORKERS)], &lanes.switch_toml());
    let imp = match Impairment::apply_every_port(&tb, LOSS_PCT, DUP_PCT, REORDER_PCT) {
        Ok(imp) => imp,
        Err(why) => return unavailable(TEST, &why),
    };
    let children: Vec<Child> = (0..WORKERS)
        .map(|r| {
            let mut c = allreduce_cmd(&tb, &tb.worker_ns(r), 1, r, WORKERS, ELEMENTS, ITERS, 30);
            c.args(threads_flag(2));
            spawn_piped(c)
        })
        .collect();
    // Mid-run: past the first collectives, well before the last.
    let total = u64::from(ITERS) * ELEMENTS.div_ceil(E) as u64;
    sw.wait_stats(120, "a third of the run's chunks", |s| {
        s["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id"] == 1))
            .and_then(|j| j["chunks_completed"].as_u64())
            .is_some_and(|c| c >= total / 3)
    });
    let old_gen = sw.stats()["generation"].as_u64().expect("a generation");
    let done_before = job(&sw.live_stats(), 1)["chunks_completed"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        done_before < total,
        "the run ended before the kill: {done_before} of {total} chunks"
    );
    sw.kill();
    sw.start_again();
    let reports = expect_verified(children);
    let inj = imp.injected();
    let stats = sw.live_stats();
    let new_gen = stats["generation"].as_u64().expect("a generation");
    assert_ne!(
        old_gen, new_gen,
        "switchd started again under a new generation"
    );
    eprintln!(
        "restart with 2 threads: killed after {done_before} of {total} chunks; resent {}, \
         rejoins {}; injected over {} frames: dropped {}, duplicated {}, delayed {}",
        stats_sum(&reports, "chunks_resent"),
        stats_sum(&reports, "rejoins"),
        inj.frames,
        inj.dropped,
        inj.duplicated,
        inj.delayed,
    );
    assert_verified(&reports, 2);
    for (r, rep) in reports.iter().enumerate() {
        assert!(
            rep["stats"]["rejoins"].as_u64().unwrap_or(0) >= 1,
            "rank {r} never re-joined: {rep}"
        );
    }
    // The new generation completed what was left, and the job came back.
    let j = job(&stats, 1);
    assert!(
        j["chunks_completed"].as_u64().unwrap_or(0) > 0,
        "the restarted switchd completed nothing: {j}"
    );
    assert!(j["activations"].as_u64().unwrap_or(0) >= 1, "{j}");
    assert!(
        inj.dropped > 0 && inj.duplicated > 0 && inj.delayed > 0,
        "{inj:?}"
    );
    let (ok, _) = sw.stop();
    assert!(ok, "switchd did not stop cleanly:\n{}", sw.log_text());
    assert_threads(&reports, 2, 2);
}

/// `--threads 2` against a switch of one seq lane: it grants no lane
/// replies, so the worker runs one thread, verifies and says 1.
#[test]
#[ignore = "needs root"]
fn two_threads_fall_back_to_one_on_a_switch_of_1_seq_lane() {
    const TEST: &str = "worker_threads_fallback";
    if !can_run(TEST) {
        return;
    }
    let tb = Testbed::up("wth4", WORKERS, 0);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, WORKERS)], &Lanes::ONE.switch_toml());
    let reports = run_ranks_verified(
        &tb,
        1,
        WORKERS,
        (ELEMENTS, ITERATIONS),
        20,
        &["--threads", "2"],
    );
    assert_verified(&reports, 1);
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    assert_eq!(
        j["chunks_completed"].as_u64(),
        Some(u64::from(ITERATIONS) * ELEMENTS.div_ceil(E) as u64),
        "{j}"
    );
    assert_threads(&reports, 2, 1);
}
