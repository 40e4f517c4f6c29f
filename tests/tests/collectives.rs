//! End-to-end tests of reduce-scatter and all-gather through switchd: four
//! `worker allreduce --collective reduce-scatter|all-gather --verify`
//! processes per job, every output element checked bit for bit (the rank's
//! shard of the rank-order sum, or every rank's pattern copied), for f32
//! and bf16 jobs, on a clean testbed and under 5 % loss plus 25 %
//! reordering on every worker link (both directions, `scripts/impair.sh`
//! as in `faults.rs`); and on an aggregation tree (two leaves, one spine)
//! the leaf refuses both kinds with NACK 10, which every worker reports as
//! "needs a job on a single switch" within seconds, while all-reduce over
//! the same tree still works. Prefix `fs2…`. Needs root.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use agg_e2e::*;

const WORKERS: u16 = 4;
const ITERATIONS: u32 = 3;
/// Float32 elements per chunk at MTU 1500: (1500 − 50) / 4 less the
/// RESULT's 16-byte token.
const E: usize = 358;

/// `worker allreduce --collective KIND --dtype DTYPE --verify --json` for
/// every rank of job `job`; returns their reports once all verified.
fn run_kind(
    tb: &Testbed,
    job: u16,
    kind: &str,
    dtype: &str,
    elements: usize,
) -> Vec<serde_json::Value> {
    let flags = ["--collective", kind, "--dtype", dtype];
    let reports = run_ranks_verified(tb, job, WORKERS, (elements, ITERATIONS), 20, &flags);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["collective"], kind, "worker {i}: {r}");
        assert_eq!(r["dtype"], dtype, "worker {i}: {r}");
        assert_eq!(r["mismatches"], 0, "worker {i}: {r}");
        assert_eq!(r["stats"]["mismatched_results"], 0, "worker {i}: {r}");
    }
    reports
}

/// Chunks of one collective over `elements` (n shards, each cut into
/// chunks of `per_chunk`).
fn chunks_of(elements: usize, per_chunk: u64) -> u64 {
    let shard = elements / usize::from(WORKERS);
    u64::from(WORKERS) * shard.div_ceil(per_chunk as usize) as u64
}

fn sum(reports: &[serde_json::Value], key: &str) -> u64 {
    reports
        .iter()
        .map(|r| r["stats"][key].as_u64().unwrap_or(0))
        .sum()
}

/// Runs reduce-scatter then all-gather on an f32 job (1) and a bf16 job
/// (2), each `ITERATIONS` times; `faults` impairs every worker link first.
/// Checks the switch completed every chunk exactly once.
fn kinds_test(test: &str, prefix: &str, faults: Option<(f64, f64)>) {
    if !can_run(test) {
        return;
    }
    let tb = Testbed::up(prefix, WORKERS, 0);
    let mut bf16 = JobSpec::new(2, WORKERS);
    bf16.dtype = Some("bf16");
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, WORKERS), bf16]);
    let imp = match faults {
        None => None,
        Some((loss, reorder)) => match Impairment::apply(&tb, loss, 0.0, reorder) {
            Ok(imp) => Some(imp),
            Err(why) => return unavailable(test, &why),
        },
    };
    // Shards of 20 chunks and a short one (f32 E = 358 at MTU 1500), 10
    // and a short one in bf16 (E = 716).
    let elements = usize::from(WORKERS) * (20 * E + 5);
    let mut expected = [0u64; 2];
    let mut resent = 0;
    for (i, (job, dtype)) in [(1u16, "f32"), (2, "bf16")].into_iter().enumerate() {
        for kind in ["reduce-scatter", "all-gather"] {
            let reports = run_kind(&tb, job, kind, dtype, elements);
            let e = reports[0]["elems_per_chunk"].as_u64().unwrap();
            expected[i] += u64::from(ITERATIONS) * chunks_of(elements, e);
            resent += sum(&reports, "chunks_resent");
            eprintln!(
                "{test}: job {job} {dtype} {kind}: {} x {elements} elements verified on 4 ranks, \
                 slowest {:.3} s, resent {}, duplicate results {}",
                ITERATIONS,
                reports
                    .iter()
                    .filter_map(|r| r["seconds"].as_f64())
                    .fold(0.0, f64::max),
                sum(&reports, "chunks_resent"),
                sum(&reports, "duplicate_results"),
            );
        }
    }
    let inj = imp.as_ref().map(|i| i.injected());
    let stats = stop_clean(&tb, &mut sw);
    for (i, id) in [1u64, 2].into_iter().enumerate() {
        let j = job(&stats, id);
        assert_eq!(j["chunks_completed"].as_u64().unwrap(), expected[i], "{j}");
    }
    assert_eq!(stats["malformed_total"], 0, "{stats}");
    if let Some(inj) = inj {
        eprintln!(
            "{test}: injected over {} frames: dropped {}, delayed {}; resent {resent}",
            inj.frames, inj.dropped, inj.delayed
        );
        assert!(inj.dropped > 0 && inj.delayed > 0, "{inj:?}");
        assert!(resent > 0, "frames were lost but nothing was resent");
    }
}

#[test]
#[ignore = "needs root"]
fn reduce_scatter_and_all_gather_are_bit_exact_through_switchd() {
    kinds_test("collectives_clean", "fs2a", None);
}

#[test]
#[ignore = "needs root"]
fn reduce_scatter_and_all_gather_survive_5_percent_loss_and_25_percent_reordering() {
    kinds_test("collectives_faults", "fs2b", Some((5.0, 25.0)));
}

/// A tree of 2 leaves of 2 workers and one spine (`trees.rs` has the full
/// story): what the leaves and the spine need to run job 1.
const LEAVES: u16 = 2;
const WPL: u16 = 2;

/// Every worker of the tree running `worker allreduce --collective kind`.
fn spawn_tree(fabric: &LeafSpine, kind: &str) -> Vec<Child> {
    let sizes = vec![WPL.to_string(); LEAVES as usize].join(",");
    (0..LEAVES)
        .flat_map(|i| (0..WPL).map(move |k| (i, k)))
        .map(|(i, k)| {
            fabric
                .cmd_in(&fabric.worker_ns(i, k), worker_bin())
                .args(["allreduce", "--switch", &fabric.leaf_gateway(i).to_string()])
                .args(["--job", "1", "--rank", &k.to_string()])
                .args(["--workers", &WPL.to_string()])
                .env(proto::secret::SECRET_ENV, SECRET)
                .args(["--tree-leaves", &sizes, "--leaf", &i.to_string()])
                .args(["--collective", kind, "--elements", "4000"])
                .args(["--verify", "--json", "--stall-timeout", "20"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting worker")
        })
        .collect()
}

#[test]
#[ignore = "needs root"]
fn a_tree_refuses_reduce_scatter_and_all_gather_with_a_clear_error() {
    if !can_run("collectives_tree") {
        return;
    }
    let fabric = LeafSpine::up("fs2t", LEAVES, 1, WPL, 0);
    let mut spine = Switchd::start_in(
        &fabric.spine_ns(0),
        "fs2t-s0",
        &spine_config(&fabric, 0, LEAVES),
    );
    let mut leaves: Vec<Switchd> = (0..LEAVES)
        .map(|i| {
            let cfg = leaf_config(&fabric, i, WPL, LEAVES, 1);
            Switchd::start_in(&fabric.leaf_ns(i), &format!("fs2t-l{i}"), &cfg)
        })
        .collect();
    for kind in ["reduce-scatter", "all-gather"] {
        let t = Instant::now();
        for (w, c) in spawn_tree(&fabric, kind).into_iter().enumerate() {
            let out = wait_with_timeout(c, Duration::from_secs(60));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "worker {w} ran a {kind} on a tree: {err}"
            );
            let refused =
                format!("the switch refused a {kind} (NACK 10, collective kind not supported)");
            for want in [
                refused.as_str(),
                "need a job on a single switch, not an aggregation tree",
            ] {
                assert!(
                    err.contains(want),
                    "worker {w}: {want:?} missing from: {err}"
                );
            }
        }
        // Refused at once, not after the 20 s stall timeout.
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "{kind}: refused after {took:?}"
        );
        eprintln!("collectives_tree: {kind} refused by the leaves in {took:?}");
    }
    // The same tree still all-reduces, bit-exact.
    expect_verified(spawn_tree(&fabric, "all-reduce"));
    for (i, sw) in leaves.iter_mut().enumerate() {
        let (ok, stats) = sw.stop();
        assert!(ok, "leaf {i} did not stop cleanly:\n{}", sw.log_text());
        let j = job(&stats, 1);
        let drops = &j["drops"];
        assert!(
            drops["kind_not_supported"].as_u64().unwrap_or(0) > 0,
            "leaf {i} counted its refusals: {drops}"
        );
        // A refused worker LEAVEs before it exits, so each run's ranks
        // find the job joining and activate it afresh. Without the LEAVE
        // the next run's first JOIN reset the still active job, and a
        // rank whose new process got its old UDP port was taken for the
        // old one asking again and went on alone.
        assert_eq!(
            (&j["activations"], &j["resets"]),
            (&serde_json::json!(3), &serde_json::json!(0)),
            "leaf {i}: one activation per run and no reset: {j}"
        );
    }
    let (ok, _) = spine.stop();
    assert!(ok, "the spine did not stop cleanly:\n{}", spine.log_text());
}
