//! End-to-end test of gradient statistics (docs/PROTOCOL.md, "Gradient
//! statistics") on a single switch: stats jobs declared at run time with
//! `switchctl job add --stats` (f32, bf16, and f32 with `auth = "mac"`),
//! four `worker allreduce --verify --json` ranks each, with loss,
//! duplication and reordering on every worker link (`Impairment`, as in
//! `faults.rs`). Each worker checks every collective's statistics bit for
//! bit against `proto::member::reference_grad_stats` of every rank's
//! pattern; the test checks that every rank reported them, the same bits on
//! every rank, that frames were really lost, and that a job without
//! `--stats` reports none (prefix `sw1`). And a stats tree of 2 leaves of
//! 2 workers and 2 spines (prefix `sw2`): every worker checks the statistics
//! against `reference_tree_grad_stats`, the leaves' ranks added in leaf
//! order. Needs root.

use std::process::{Child, Stdio};

use agg_e2e::*;

const WORKERS: u16 = 4;
/// A bit over 100 chunks of f32, with a short last chunk.
const ELEMENTS: usize = 36_001;
const ITERATIONS: u32 = 3;

/// `switchctl job add` of job `id` (4 workers) with extra flags.
fn add_job(tb: &Testbed, sw: &Switchd, id: u16, extra: &[&str]) {
    let id = id.to_string();
    let allow = allow_args(&tb.worker_sources());
    let mut args = vec!["job", "add", "--id", &id, "--workers", "4"];
    args.extend(allow.iter().map(String::as_str));
    args.extend_from_slice(&["--secret-file", secret_file()]);
    args.extend_from_slice(extra);
    let out = sw.switchctl(&args);
    assert!(
        out.status.success(),
        "switchctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs job `job`'s ranks on `elements` with `extra` worker flags; returns
/// their reports (each exited 0 with `verified: true`: values and
/// statistics).
fn run(tb: &Testbed, job: u16, elements: usize, extra: &[&str]) -> Vec<serde_json::Value> {
    run_ranks_verified(tb, job, WORKERS, (elements, ITERATIONS), 30, extra)
}

/// Checks a stats job's reports: every collective's statistics present,
/// checked by the worker, the same bits on every rank; returns the chunks
/// resent over the ranks.
fn check_stats(what: &str, reports: &[serde_json::Value]) -> u64 {
    let lines = |r: &serde_json::Value| r["gradient_stats"].as_array().cloned();
    let first = lines(&reports[0]).unwrap_or_else(|| panic!("{what}: no gradient_stats"));
    assert_eq!(first.len(), ITERATIONS as usize, "{what}: {}", reports[0]);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["stats_mismatches"], 0, "{what} rank {i}: {r}");
        let l = lines(r).unwrap_or_else(|| panic!("{what} rank {i}: no gradient_stats: {r}"));
        for s in &l {
            assert_eq!(s["verified"], true, "{what} rank {i}: {s}");
            assert_eq!(s["ranks"], u64::from(WORKERS), "{what} rank {i}: {s}");
            assert!(s["sum_of_squares"].as_f64().unwrap() > 0.0, "{s}");
        }
        // serde_json prints the shortest string that reads back as the
        // same f64, so equal text is equal bits.
        assert_eq!(l, first, "{what}: rank {i} differs from rank 0");
    }
    let distinct: std::collections::HashSet<String> = first
        .iter()
        .map(|s| s["sum_of_squares"].to_string())
        .collect();
    assert_eq!(
        distinct.len(),
        first.len(),
        "{what}: each iteration's input differs"
    );
    reports
        .iter()
        .map(|r| r["stats"]["chunks_resent"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
#[ignore = "needs root"]
fn stats_jobs_give_every_rank_the_reference_statistics_under_loss() {
    if !can_run("stats") {
        return;
    }
    let tb = Testbed::up("sw1", WORKERS, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(4, WORKERS)]);
    add_job(&tb, &sw, 1, &["--stats"]);
    add_job(&tb, &sw, 2, &["--stats", "--dtype", "bf16"]);
    add_job(&tb, &sw, 3, &["--stats", "--auth", "mac"]);
    let jobs = sw.switchctl(&["--json", "jobs"]);
    let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    let stats_of = |id: u64| {
        jobs.as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .map(|j| j["stats"].as_bool())
    };
    assert_eq!(
        [1, 2, 3, 4].map(stats_of),
        [
            Some(Some(true)),
            Some(Some(true)),
            Some(Some(true)),
            Some(Some(false))
        ],
        "{jobs}"
    );

    let imp = match Impairment::apply(&tb, 3.0, 1.0, 10.0) {
        Ok(imp) => imp,
        Err(why) => return unavailable("stats", &why),
    };
    let mut resent = 0;
    // A reduce-scatter's input is n shards of the same length.
    let shards = ELEMENTS - ELEMENTS % usize::from(WORKERS);
    for (what, job, elements, extra) in [
        ("f32 all-reduce", 1u16, ELEMENTS, &[][..]),
        ("bf16 all-reduce", 2, ELEMENTS, &["--dtype", "bf16"][..]),
        ("f32 mac all-reduce", 3, ELEMENTS, &[][..]),
        (
            "f32 reduce-scatter",
            1,
            shards,
            &["--collective", "reduce-scatter"][..],
        ),
    ] {
        let reports = run(&tb, job, elements, extra);
        let r = check_stats(what, &reports);
        eprintln!(
            "{what}: statistics verified on every rank, E {}, resent {r}, first {}",
            reports[0]["elems_per_chunk"], reports[0]["gradient_stats"][0]
        );
        resent += r;
    }
    // A job without statistics reports none.
    let plain = run(&tb, 4, ELEMENTS, &[]);
    assert!(plain[0].get("gradient_stats").is_none(), "{}", plain[0]);
    let inj = imp.injected();
    let stats = stop_clean(&tb, &mut sw);
    assert!(inj.dropped > 0 && inj.duplicated > 0, "{inj:?}");
    assert!(resent > 0, "frames were lost but nothing was resent");
    assert_eq!(stats["malformed_total"], 0, "{stats}");
    for id in 1..=4 {
        let drops = &job(&stats, id)["drops"];
        assert_eq!(drops["payload_length"].as_u64().unwrap_or(0), 0, "{drops}");
    }
}

const LEAVES: u16 = 2;
const SPINES: u16 = 2;
const WPL: u16 = 2;

#[test]
#[ignore = "needs root"]
fn a_stats_tree_gives_every_worker_the_tree_order_statistics() {
    if !can_run("stats_tree") {
        return;
    }
    let fabric = LeafSpine::up("sw2", LEAVES, SPINES, WPL, 0);
    let _spines: Vec<Switchd> = (0..SPINES)
        .map(|j| {
            Switchd::start_in(
                &fabric.spine_ns(j),
                &format!("sw2-s{j}"),
                &spine_config(&fabric, j, LEAVES).set_jobs("stats", true),
            )
        })
        .collect();
    let _leaves: Vec<Switchd> = (0..LEAVES)
        .map(|i| {
            Switchd::start_in(
                &fabric.leaf_ns(i),
                &format!("sw2-l{i}"),
                &leaf_config(&fabric, i, WPL, LEAVES, SPINES).set_jobs("stats", true),
            )
        })
        .collect();
    let sizes = vec![WPL.to_string(); LEAVES as usize].join(",");
    let workers: Vec<Child> = (0..LEAVES)
        .flat_map(|i| (0..WPL).map(move |k| (i, k)))
        .map(|(i, k)| {
            fabric
                .cmd_in(&fabric.worker_ns(i, k), worker_bin())
                .args(["allreduce", "--switch", &fabric.leaf_gateway(i).to_string()])
                .args(["--job", "1", "--rank", &k.to_string()])
                .args(["--workers", &WPL.to_string()])
                .env(proto::secret::SECRET_ENV, SECRET)
                .args(["--tree-leaves", &sizes, "--leaf", &i.to_string()])
                .args(["--elements", &ELEMENTS.to_string()])
                .args(["--iterations", &ITERATIONS.to_string()])
                .args(["--verify", "--json", "--stall-timeout", "20"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting worker")
        })
        .collect();
    let reports = expect_verified(workers);
    check_stats("tree all-reduce", &reports);
    eprintln!(
        "tree: statistics verified on all {} workers, first {}",
        reports.len(),
        reports[0]["gradient_stats"][0]
    );
}
