//! End-to-end tests of issue 20's integrity items: DATA with a wrong UDP
//! checksum is never summed, RESULTs carry a checksum that verifies at the
//! worker, and frames claiming the switch's own address are dropped at
//! ingress. Raw frames come from tests/integrity.py.

use std::process::{Child, Output, Stdio};
use std::time::Duration;

use agg_e2e::*;

fn script() -> std::path::PathBuf {
    repo_root().join("tests/integrity.py")
}

/// Starts tests/integrity.py ARGS in namespace `ns` and waits until it
/// says it is ready.
fn start_script(tb: &Testbed, ns: &str, args: &[&str]) -> Child {
    let mut c = tb
        .cmd_in(ns, "python3")
        .arg(script())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tests/integrity.py");
    let mut line = String::new();
    let out = c.stdout.take().unwrap();
    let mut out = std::io::BufReader::new(out);
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready", "integrity.py {args:?} did not start");
    c.stdout = Some(out.into_inner());
    c
}

/// The last line a script printed, split into numbers.
fn numbers(o: &Output) -> Vec<u64> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// During a verified all-reduce of 4 workers, worker 1's namespace sends
/// copies of its own DATA for later seqs (its real addresses, generation,
/// collective and count) with one payload byte changed and the checksum
/// left wrong: had the switch summed any, the sums of every rank would be
/// wrong. Meanwhile worker 0's namespace checks every RESULT's checksum.
#[test]
#[ignore = "needs root"]
fn corrupted_data_is_not_summed_and_results_verify_at_the_worker() {
    if !can_run("integrity_checksums") {
        return;
    }
    let tb = Testbed::up("cs1", 4, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let results = start_script(&tb, &tb.worker_ns(0), &["results", "eth0", "8"]);
    let corrupt = start_script(&tb, &tb.worker_ns(1), &["corrupt", "eth0", "6", "400"]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 2_000_000, 20))
        .collect();
    let corrupt = wait_with_timeout(corrupt, Duration::from_secs(30));
    assert!(corrupt.status.success(), "corrupt: {}", text(&corrupt));
    let sent = numbers(&corrupt)[0];
    assert!(
        sent >= 16,
        "only {sent} corrupted frames sent: {}",
        text(&corrupt)
    );
    let results = wait_with_timeout(results, Duration::from_secs(30));
    assert!(results.status.success(), "results: {}", text(&results));
    let (good, zero, bad) = match numbers(&results)[..] {
        [g, z, b] => (g, z, b),
        _ => panic!("results printed no counts: {}", text(&results)),
    };
    eprintln!("{sent} corrupted DATA sent; RESULTs at worker 0: {good} verified");
    expect_verified(workers);
    let stats = stop_clean(&tb, &mut sw);
    assert!(good >= 100, "only {good} RESULTs captured at worker 0");
    assert_eq!(
        (zero, bad),
        (0, 0),
        "RESULTs without a checksum or with a wrong one ({good} right)"
    );
    // Every corrupted frame reached the switch and was counted, not summed.
    assert_eq!(counter(&stats, "bad_udp_checksum"), sent, "{stats}");
    assert_eq!(counter(&stats, "bad_ip_checksum"), 0, "{stats}");
    assert_eq!(counter(&stats, "own_source"), 0, "{stats}");
    let j = job(&stats, 1);
    assert_eq!(j["resets"], 0, "{j}");
    let log = sw.log_text();
    assert!(
        log.contains("frames with a wrong checksum dropped") && log.contains("tx off"),
        "the log says what the drops mean:\n{log}"
    );
}

/// A host on another port sends HEARTBEATs that claim the switch's own IP
/// (with its own MAC) and then a switch port's MAC (with its own IP): both
/// are dropped at ingress by the XDP program and counted on the host's
/// port (`own_address_forged`), and none is answered.
#[test]
#[ignore = "needs root"]
fn frames_claiming_the_switchs_own_address_are_dropped_at_ingress() {
    if !can_run("integrity_own_source") {
        return;
    }
    let tb = Testbed::up("cs2", 2, 1);
    let mut spec = JobSpec::new(1, 2);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    let workers: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 2_000_000, 30))
        .collect();
    // Activated (it may already have finished: the stats file is written
    // once a second); the spoofed frames are dropped whatever its state.
    sw.wait_stats(30, "job activated", |s| s["jobs"][0]["activations"] == 1);
    let (switch_mac, port_mac) = (
        mac_of(&tb.switch_ns(), "br0"),
        mac_of(&tb.switch_ns(), "sw-h0"),
    );
    let host_mac = mac_of(&tb.host_ns(0), "eth0");
    let host_ip = tb.host_addr(0).to_string();
    let switch_ip = tb.switch_addr().to_string();
    let before = sw.stats();
    let mut sent = 0;
    for (src_ip, src_mac) in [
        (switch_ip.as_str(), host_mac.as_str()),
        (host_ip.as_str(), port_mac.as_str()),
    ] {
        let out = tb
            .cmd_in(&tb.host_ns(0), "python3")
            .arg(script())
            .args([
                "own-source",
                "eth0",
                &switch_mac,
                src_ip,
                src_mac,
                &switch_ip,
                "50",
            ])
            .output()
            .expect("running tests/integrity.py");
        assert!(out.status.success(), "own-source: {}", text(&out));
        sent += numbers(&out)[0];
    }
    assert_eq!(sent, 100);
    let forged = |s: &serde_json::Value| port_sum(s, "sw-h0", "xdp_own_address_forged");
    sw.wait_stats(10, "the spoofed frames counted", |s| forged(s) >= sent);
    expect_verified(workers);
    let after = stop_clean(&tb, &mut sw);
    assert_eq!(forged(&after), sent, "{after}");
    // Dropped before they were steered: the dataplane never saw them.
    assert_eq!(counter(&after, "own_source"), 0, "{after}");
    // Not one reached the job: no NACK to a stranger, no drop counted there.
    let nacks = |s: &serde_json::Value| job(s, 1)["nacks"].as_u64().unwrap_or(0);
    assert_eq!(nacks(&after), nacks(&before), "{after}");
    assert_eq!(counter(&after, "bad_udp_checksum"), 0, "{after}");
    let log = sw.log_text();
    assert!(
        log.contains("claiming one of this switch's own addresses"),
        "the log says what the drops mean:\n{log}"
    );
}
