//! End-to-end tests of reduce-scatter and all-gather through switchd: four
//! `worker allreduce --collective reduce-scatter|all-gather --verify`
//! processes per job, every output element checked bit for bit (the rank's
//! shard of the rank-order sum, or every rank's pattern copied), for f32
//! and bf16 jobs, on a clean testbed and under 5 % loss plus 25 %
//! reordering on every worker link (both directions, `scripts/impair.sh`
//! as in `faults.rs`). Prefix `fs2…`. Needs root.

use std::process::Child;

use agg_e2e::*;

const WORKERS: u16 = 4;
const ITERATIONS: u32 = 3;

/// `worker allreduce --collective KIND --dtype DTYPE --verify --json` for
/// every rank of job `job`; returns their reports once all verified.
fn run_kind(
    tb: &Testbed,
    job: u16,
    kind: &str,
    dtype: &str,
    elements: usize,
) -> Vec<serde_json::Value> {
    let children: Vec<Child> = (0..WORKERS)
        .map(|r| {
            let mut c = allreduce_cmd(
                tb,
                &tb.worker_ns(r),
                job,
                r,
                WORKERS,
                elements,
                ITERATIONS,
                20,
            );
            c.args(["--collective", kind, "--dtype", dtype]);
            spawn_piped(c)
        })
        .collect();
    let reports = expect_verified(children);
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
    // Shards of 20 chunks and a short one (f32 E = 362 at MTU 1500), 10
    // and a short one in bf16 (E = 724).
    let elements = usize::from(WORKERS) * (20 * 362 + 5);
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
