//! Fault-injection end-to-end tests: the same all-reduce as `e2e.rs`, but
//! with packet loss, duplication and reordering on every worker link, and one
//! job of 64 workers. Each test makes its own testbed (prefix `f3…`) and
//! removes it, also on failure. They need root; under `CI=true` they fail
//! rather than skip when something they need is missing.
//!
//! Where the faults are injected: on `eth0` inside every worker namespace,
//! egress (worker → switch) AND ingress (switch → worker). Not on the
//! switch-side port `sw-wI`: switchd transmits through AF_XDP, which hands
//! frames straight to the driver and never passes the port's egress qdisc
//! (an HTB on `sw-w0` counted 0 packets while its worker received every
//! RESULT), so a qdisc there would impair nothing but bridged traffic.
//!
//! How: with `scripts/impair.sh … --udp-port 48879` (the tc-BPF program
//! `tests/impair/impair.bpf.c`), once per direction: it drops and duplicates
//! aggregation frames at random and sends the reordered share through an HTB
//! class limited to 100 Mbit/s (on ingress behind an ifb), so those frames
//! arrive after frames sent later. ARP and everything else stay reliable.
//! `impair.sh --stats` reports what it did, which the tests check and print.
//! `tc netem` is not used: CI kernels may lack `sch_netem` (the 6.18 VM this
//! was written on does).
//!
//! The `…_on_2_queues_and_2_threads` variants run the same faults on a
//! testbed of 2 queues per veth with switchd at `queues = 2`,
//! `dataplane_threads = 2` (prefixes `mt1`..`mt4`): contributions to one
//! slot then arrive on different threads, and the test checks that both
//! threads received a share ([`Testbed::assert_spread_over_queues`]). The
//! `…_on_2_seq_lanes` variant adds `seq_lanes = 2` (prefix `sl1`).
//!
//! Every fault test first runs the same all-reduce on the clean testbed, then
//! impairs it and runs it again, and prints one summary line with both times
//! (`cargo test … -- --nocapture`). Times are printed, never asserted.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Instant;

use agg_e2e::*;

/// 2 MiB of float32 per worker.
const ELEMENTS: usize = 512 * 1024;
const ITERATIONS: u32 = 3;
const WORKERS: u16 = 4;

// ---------------------------------------------------------------------------
// Helpers (the shared ones live in tests/src/lib.rs).

/// One all-reduce run of job 1 on ranks 0..n.
struct RunResult {
    wall: f64,
    /// The slowest worker's `seconds` (time inside all_reduce, no join).
    worker_max: f64,
    resent: u64,
    duplicate_results: u64,
    rejoins: u64,
    elems_per_chunk: u64,
    /// The seq lanes every worker reported (they all learnt the same).
    seq_lanes: u64,
}

fn run_job(tb: &Testbed, n: u16, elements: usize, iterations: u32) -> RunResult {
    let t = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|r| spawn_allreduce(tb, 1, r, n, elements, iterations))
        .collect();
    let reports = expect_verified(children);
    let wall = t.elapsed().as_secs_f64();
    let sum = |k: &str| -> u64 {
        reports
            .iter()
            .map(|r| r["stats"][k].as_u64().unwrap_or(0))
            .sum()
    };
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["elements"], elements as u64, "worker {i}: {r}");
        assert_eq!(r["iterations"], iterations, "worker {i}: {r}");
        assert_eq!(r["mismatches"], 0, "worker {i}: {r}");
    }
    RunResult {
        wall,
        worker_max: reports
            .iter()
            .filter_map(|r| r["seconds"].as_f64())
            .fold(0.0, f64::max),
        resent: sum("chunks_resent"),
        duplicate_results: sum("duplicate_results"),
        rejoins: sum("rejoins"),
        elems_per_chunk: reports[0]["elems_per_chunk"].as_u64().unwrap(),
        seq_lanes: reports
            .iter()
            .map(|r| r["seq_lanes"].as_u64().unwrap_or(0))
            .min()
            .unwrap_or(0),
    }
}

// ---------------------------------------------------------------------------
// Fault injection

#[derive(Clone, Copy)]
struct Faults {
    loss_pct: f64,
    dup_pct: f64,
    reorder_pct: f64,
}

impl Faults {
    fn label(&self) -> String {
        let parts = [
            ("loss", self.loss_pct),
            ("duplicate", self.dup_pct),
            ("reorder", self.reorder_pct),
        ];
        let parts: Vec<String> = parts
            .iter()
            .filter(|(_, pct)| *pct > 0.0)
            .map(|(what, pct)| format!("{what} {pct}%"))
            .collect();
        parts.join(" + ")
    }
}

// ---------------------------------------------------------------------------
// The fault tests

fn fault_test(test: &str, prefix: &str, f: Faults, lanes: Lanes) {
    if !can_run(test) {
        return;
    }
    let tb = Testbed::up_lanes(prefix, WORKERS, 0, lanes);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, WORKERS)], &lanes.switch_toml());

    let clean = run_job(&tb, WORKERS, ELEMENTS, ITERATIONS);

    let imp = match Impairment::apply(&tb, f.loss_pct, f.dup_pct, f.reorder_pct) {
        Ok(imp) => imp,
        Err(why) => return unavailable(test, &why),
    };
    let faulty = run_job(&tb, WORKERS, ELEMENTS, ITERATIONS);
    let inj = imp.injected();
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);

    eprintln!(
        "{} ({lanes:?}): {:.2} s (clean {:.2} s), worker {:.3} s (clean {:.3} s), resent {} (clean {}), \
         duplicate results {}, rejoins {}; switch: retransmits served {}, duplicates dropped {}; \
         injected over {} frames: dropped {}, duplicated {}, delayed {}",
        f.label(),
        faulty.wall,
        clean.wall,
        faulty.worker_max,
        clean.worker_max,
        faulty.resent,
        clean.resent,
        faulty.duplicate_results,
        faulty.rejoins,
        j["retransmits_served"],
        j["drops"]["duplicate"],
        inj.frames,
        inj.dropped,
        inj.duplicated,
        inj.delayed,
    );

    // Every chunk of both runs completed exactly once, whatever was lost,
    // duplicated or reordered on the way.
    let chunks = ELEMENTS.div_ceil(faulty.elems_per_chunk as usize) as u64;
    assert_eq!(
        j["chunks_completed"].as_u64().unwrap(),
        2 * u64::from(ITERATIONS) * chunks,
        "{j}"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");

    // The faults were really there.
    assert!(inj.frames > 0, "the impairment saw no frames: {inj:?}");
    assert_eq!(inj.dropped > 0, f.loss_pct > 0.0, "{inj:?}");
    assert_eq!(inj.duplicated > 0, f.dup_pct > 0.0, "{inj:?}");
    assert_eq!(inj.delayed > 0, f.reorder_pct > 0.0, "{inj:?}");
    if f.loss_pct > 0.0 {
        assert!(faulty.resent > 0, "frames were lost but nothing was resent");
    }
    if lanes.threads > 1 {
        tb.assert_spread_over_queues(&stats, lanes);
    }
    // Every worker learnt the switch's lanes from its CHALLENGE (and the
    // chunks sent to the other lanes' ports completed, above).
    assert_eq!(faulty.seq_lanes, u64::from(lanes.seq_lanes));
    assert_eq!(clean.seq_lanes, u64::from(lanes.seq_lanes));
    if lanes.threads > 1 {
        // Hand-offs between threads: with seq lanes, the completing thread
        // sends every RESULT from its own socket on the member's port, so
        // only control replies cross (docs/PROTOCOL.md, "Seq lanes").
        let sum = |k: &str| -> u64 {
            stats["threads"]
                .as_array()
                .map_or(0, |ts| ts.iter().map(|t| t[k].as_u64().unwrap_or(0)).sum())
        };
        let (handed, sent) = (sum("forwarded"), sum("tx_frames"));
        eprintln!("hand-offs between threads: {handed} of {sent} frames sent");
        if lanes.seq_lanes > 1 {
            assert!(
                handed * 100 < sent,
                "{handed} hand-offs for {sent} frames sent"
            );
        }
    }
}

const LOSS: Faults = Faults {
    loss_pct: 5.0,
    dup_pct: 0.0,
    reorder_pct: 0.0,
};
const DUPLICATION: Faults = Faults {
    loss_pct: 0.0,
    dup_pct: 1.0,
    reorder_pct: 0.0,
};
const REORDERING: Faults = Faults {
    loss_pct: 0.0,
    dup_pct: 0.0,
    reorder_pct: 25.0,
};
const ALL_AT_ONCE: Faults = Faults {
    loss_pct: 5.0,
    dup_pct: 1.0,
    reorder_pct: 25.0,
};

#[test]
#[ignore = "needs root"]
fn allreduce_survives_5_percent_loss() {
    fault_test("faults_loss", "f3loss", LOSS, Lanes::ONE);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_1_percent_duplication() {
    fault_test("faults_duplicate", "f3dup", DUPLICATION, Lanes::ONE);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_25_percent_reordering() {
    fault_test("faults_reorder", "f3reo", REORDERING, Lanes::ONE);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_loss_duplication_and_reordering_at_once() {
    fault_test("faults_all", "f3all", ALL_AT_ONCE, Lanes::ONE);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_5_percent_loss_on_2_queues_and_2_threads() {
    fault_test("faults_loss_2_threads", "mt1", LOSS, Lanes::TWO);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_1_percent_duplication_on_2_queues_and_2_threads() {
    fault_test("faults_duplicate_2_threads", "mt2", DUPLICATION, Lanes::TWO);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_25_percent_reordering_on_2_queues_and_2_threads() {
    fault_test("faults_reorder_2_threads", "mt3", REORDERING, Lanes::TWO);
}

#[test]
#[ignore = "needs root"]
fn allreduce_survives_all_faults_at_once_on_2_queues_and_2_threads() {
    fault_test("faults_all_2_threads", "mt4", ALL_AT_ONCE, Lanes::TWO);
}

/// Seq lanes: every worker learns them from its CHALLENGE and sends odd
/// seqs to port 48880, which the XDP program and switchd take as DATA; the
/// impairment (on port 48879) hits the even seqs' DATA and every RESULT.
#[test]
#[ignore = "needs root"]
fn allreduce_survives_all_faults_at_once_on_2_seq_lanes() {
    fault_test(
        "faults_all_seq_lanes",
        "sl1",
        ALL_AT_ONCE,
        Lanes::TWO_SEQ_LANES,
    );
}

// ---------------------------------------------------------------------------
// One job of 64 workers

#[test]
#[ignore = "needs root"]
fn one_job_of_64_workers_is_bit_exact() {
    const N: u16 = 64;
    const ELEMS: usize = 100_000;
    const ITERS: u32 = 2;
    if !can_run("faults_64_workers") {
        return;
    }
    let tb = Testbed::up("f3w", N, 0);
    // The job's sources are its 64 workers' addresses (JobSpec's default),
    // more than one prefix holds.
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, N)]);
    let r = run_job(&tb, N, ELEMS, ITERS);
    let rss = switchd_rss_kib(&tb);
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    eprintln!(
        "64 workers x {ELEMS} float32 x {ITERS}: all verified, {:.2} s wall, slowest worker {:.3} s, \
         resent {}, rejoins {}; switch: {} chunks, {} contributions, RSS {} MiB",
        r.wall,
        r.worker_max,
        r.resent,
        r.rejoins,
        j["chunks_completed"],
        j["contributions"],
        rss / 1024
    );
    let chunks = ELEMS.div_ceil(r.elems_per_chunk as usize) as u64;
    assert_eq!(
        j["chunks_completed"].as_u64().unwrap(),
        u64::from(ITERS) * chunks,
        "{j}"
    );
    assert_eq!(j["activations"], 1, "{j}");
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}

/// VmRSS (KiB) of the switchd running in `tb`'s switch namespace, 0 if not found.
fn switchd_rss_kib(tb: &Testbed) -> u64 {
    let Ok(out) = Command::new("ip")
        .args(["netns", "pids", &tb.switch_ns()])
        .output()
    else {
        return 0;
    };
    let switchd = switchd_bin();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if !same_file(&exe, &switchd) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(kib) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
        {
            return kib;
        }
    }
    0
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
