//! End-to-end tests of issue 3: several jobs at once, jobs added and removed
//! while switchd runs, a worker dying mid-collective, switchd restarting
//! mid-collective, and spoofed DATA from a stranger.

use std::process::Child;
use std::time::{Duration, Instant};

use agg_e2e::*;

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: u64 = 358;

fn job_field(sw: &Switchd, id: u64, field: &str) -> u64 {
    sw.stats()["jobs"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|j| j["id"] == id)
                .map(|j| j[field].as_u64().unwrap_or(0))
        })
        .unwrap_or(0)
}

fn wait_progress(sw: &Switchd, id: u64, chunks: u64) {
    sw.wait_stats(60, "job progress", |s| {
        s["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id"] == id))
            .is_some_and(|j| j["chunks_completed"].as_u64().unwrap_or(0) >= chunks)
    });
}

#[test]
#[ignore = "needs root"]
fn jobs_are_added_and_removed_while_switchd_runs() {
    if !can_run("jobs_add_remove") {
        return;
    }
    let tb = Testbed::up("e3a", 4, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    // Job 2 on workers 2 and 3, from their addresses only.
    let allow = allow_args(&tb.worker_sources_of(2..4));
    let mut add = vec!["job", "add", "--id", "2", "--workers", "2"];
    add.extend(allow.iter().map(String::as_str));
    add.extend(["--secret-file", secret_file(), "--slots", "128"]);
    let out = sw.switchctl(&add);
    assert!(out.status.success(), "{}", text(&out));
    let jobs = text(&sw.switchctl(&["jobs"]));
    assert!(jobs.contains("joining"), "{jobs}");
    let subnet = tb.subnet().to_string();
    let bad = sw.switchctl(&[
        "job",
        "add",
        "--id",
        "2",
        "--workers",
        "2",
        "--allow",
        &subnet,
        "--secret-file",
        secret_file(),
    ]);
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("job 2 is already declared"),
        "{}",
        text(&bad)
    );

    // Both jobs at once, on ranks w0,w1 (job 1) and w2,w3 (job 2).
    let mut children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(r), 1, r, 2, 300_000, 4))
        .collect();
    children.extend(
        (0..2).map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(2 + r), 2, r, 2, 250_000, 4)),
    );
    expect_verified(children);
    // Both ranks sent their LEAVE (authenticated by the MAC over their
    // JOIN's nonce): the job is back to joining, ready for the next run.
    sw.wait_stats(10, "job 2 joining after its ranks left", |s| {
        s["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id"] == 2))
            .is_some_and(|j| j["state"] == "joining")
    });
    let stats = text(&sw.switchctl(&["stats", "2"]));
    assert!(stats.contains("job 2: joining"), "{stats}");
    // 4 × ⌈250000/358⌉ = 2796 chunks.
    let done = 4 * 250_000u64.div_ceil(E);
    assert!(
        stats.contains(&format!("chunks_completed {done}")),
        "4 × ⌈250000/{E}⌉ chunks: {stats}"
    );

    // Remove job 2 while its workers run: they fail with a clear error.
    let victims: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(2 + r), 2, r, 2, 1_000_000, 1000))
        .collect();
    wait_progress(&sw, 2, done + 500);
    let out = sw.switchctl(&["job", "rm", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    for c in victims {
        let out = wait_with_timeout(c, Duration::from_secs(30));
        assert!(!out.status.success(), "worker of a removed job succeeded");
        let t = text(&out);
        assert!(t.contains("job 2") && t.contains("unknown job"), "{t}");
    }
    let jobs = text(&sw.switchctl(&["jobs"]));
    assert!(
        !jobs.lines().any(|l| l.trim_start().starts_with("2 ")),
        "{jobs}"
    );
    // Job 1 is untouched.
    let children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(r), 1, r, 2, 100_000, 2))
        .collect();
    expect_verified(children);
    let (ok, _) = sw.stop();
    assert!(ok);
}

#[test]
#[ignore = "needs root"]
fn a_dead_worker_is_named_others_fail_in_time_and_the_job_rejoins() {
    if !can_run("dead_worker") {
        return;
    }
    let tb = Testbed::up("e3b", 6, 0);
    let mut job2 = JobSpec::new(2, 2);
    job2.allowed = Some(tb.worker_sources_of(4..6));
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4), job2]);
    let mut victims: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce_with(&tb, &tb.worker_ns(r), 1, r, 4, 1_000_000, 1000, 3))
        .collect();
    // Job 2 keeps running next to it throughout.
    let bystanders: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(4 + r), 2, r, 2, 500_000, 30))
        .collect();
    wait_progress(&sw, 1, 3000);
    let mut dead = victims.pop().unwrap();
    dead.kill().unwrap();
    let _ = dead.wait();
    let killed_at = Instant::now();
    for (rank, c) in victims.into_iter().enumerate() {
        let out = wait_with_timeout(c, Duration::from_secs(30));
        let waited = killed_at.elapsed();
        assert!(
            !out.status.success(),
            "rank {rank} did not notice the dead rank"
        );
        let t = text(&out);
        assert!(
            t.contains("job 1") && t.contains("stalled at seq") && t.contains("ranks [3]"),
            "rank {rank}: {t}"
        );
        // Deadline 3 s; generous margin for a loaded 2-core machine.
        assert!(
            waited < Duration::from_secs(20),
            "rank {rank} took {waited:?} to fail"
        );
    }
    let stats = text(&sw.switchctl(&["stats", "1"]));
    assert!(stats.contains("waits for ranks [3]"), "{stats}");
    expect_verified(bystanders);
    // The job can be rejoined.
    let children: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce_from(&tb, &tb.worker_ns(r), 1, r, 4, 200_000, 2))
        .collect();
    expect_verified(children);
    let (ok, _) = sw.stop();
    assert!(ok);
}

#[test]
#[ignore = "needs root"]
fn switchd_restart_mid_collective_completes_bit_exact() {
    restart_mid_collective("switchd_restart", "e3c", Lanes::ONE);
}

/// The same on 2 queues per veth and 2 dataplane threads: the new switchd's
/// threads pick up the rejoin and the resent window on both queues.
#[test]
#[ignore = "needs root"]
fn switchd_restart_mid_collective_completes_bit_exact_on_2_threads() {
    restart_mid_collective("switchd_restart_2_threads", "mt5", Lanes::TWO);
}

fn restart_mid_collective(test: &str, prefix: &str, lanes: Lanes) {
    if !can_run(test) {
        return;
    }
    let tb = Testbed::up_lanes(prefix, 4, 0, lanes);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], &lanes.switch_toml());
    let children: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 1_000_000, 40))
        .collect();
    wait_progress(&sw, 1, 5000);
    let old_gen = sw.stats()["generation"].as_u64().unwrap();
    sw.restart();
    let reports = expect_verified(children);
    let new_gen = sw.stats()["generation"].as_u64().unwrap();
    assert_ne!(old_gen, new_gen);
    for (r, rep) in reports.iter().enumerate() {
        assert!(
            rep["stats"]["rejoins"].as_u64().unwrap() >= 1,
            "rank {r} never re-joined: {rep}"
        );
    }
    assert!(job_field(&sw, 1, "activations") >= 1);
    let (ok, stats) = sw.stop();
    assert!(ok);
    if lanes.threads > 1 {
        tb.assert_spread_over_queues(&stats, lanes);
    }
}

#[test]
#[ignore = "needs root"]
fn spoofed_data_from_an_allowed_host_changes_no_sum() {
    if !can_run("spoofed_data") {
        return;
    }
    // The host is inside the job's prefixes, so only the recorded source of
    // each rank tells the spoof apart.
    let tb = Testbed::up("e3d", 2, 1);
    let mut spec = JobSpec::new(1, 2);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    let children: Vec<Child> = (0..2)
        // Long enough (several seconds) that the once-a-second stats file
        // shows the job active while the spoof still has slots to hit.
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 2_000_000, 60))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let gen = sw.stats()["generation"].as_u64().unwrap() as u32;
    // DATA for every rank and the first seqs, huge values: if any were
    // taken, the verified sums would be wrong.
    let mut frames = Vec::new();
    for seq in 0u32..200 {
        for rank in 0u16..2 {
            let mut h = vec![0x41, 0];
            h.extend_from_slice(&1u16.to_be_bytes());
            h.extend_from_slice(&rank.to_be_bytes());
            h.extend_from_slice(&1u16.to_be_bytes());
            h.extend_from_slice(&seq.to_be_bytes());
            h.extend_from_slice(&0u32.to_be_bytes());
            h.extend_from_slice(&0u16.to_be_bytes());
            h.extend_from_slice(&gen.to_be_bytes());
            h.extend_from_slice(&1e30f32.to_le_bytes());
            frames.push(h.iter().map(|b| format!("{b:02x}")).collect::<String>());
        }
    }
    let (switch, agg_port) = (tb.switch_addr().to_string(), AGG_PORT.to_string());
    let mut args = vec!["udp-send", switch.as_str(), agg_port.as_str()];
    args.extend(frames.iter().map(|s| s.as_str()));
    assert!(probe(&tb, &tb.host_ns(0), &args).status.success());
    expect_verified(children);
    let (_, stats) = sw.stop();
    let drops = stats["jobs"][0]["drops"]["source_mismatch"]
        .as_u64()
        .unwrap();
    assert_eq!(drops, 400, "every spoofed DATA is counted: {stats}");
}
