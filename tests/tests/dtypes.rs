//! End-to-end tests of half-precision jobs: switchd with bf16 and f16 jobs
//! declared in its config, four `worker allreduce --dtype … --verify`
//! processes per job (bit-exact against the float32 rank-order sum rounded
//! once), chunks of twice the float32 element count, and a JOIN of the
//! wrong dtype refused with both dtypes named; and a bf16 job over a tree
//! of two leaves and a spine (float32 partials, rounded once at the leaf).
//! Needs root.

use std::process::Child;
use std::time::{Duration, Instant};

use agg_e2e::*;

/// Float32 elements per chunk at MTU 1500: (1500 − 50) / 4 less the
/// RESULT's 16-byte token.
const E: u64 = 358;
/// Half-precision elements per chunk: the same bytes.
const E16: u64 = 2 * E;

/// `worker allreduce --dtype DTYPE --verify --json` for rank `rank` of job
/// `job` (4 ranks), in the rank's namespace.
fn spawn_typed(tb: &Testbed, job: u16, dtype: &str, rank: u16, elements: usize) -> Child {
    tb.cmd_in(&tb.worker_ns(rank), worker_bin())
        .args(["allreduce", "--switch", &tb.switch_addr().to_string()])
        .args(["--job", &job.to_string(), "--rank", &rank.to_string()])
        .args(["--workers", "4", "--dtype", dtype])
        .env(proto::secret::SECRET_ENV, SECRET)
        .args(["--elements", &elements.to_string(), "--iterations", "2"])
        .args(["--verify", "--json", "--stall-timeout", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting worker")
}

#[test]
#[ignore = "needs root"]
fn bf16_and_f16_jobs_are_bit_exact_with_twice_the_elements_per_chunk() {
    if !can_run("dtypes") {
        return;
    }
    let tb = Testbed::up("e2h", 4, 0);
    let mut f32_job = JobSpec::new(1, 4);
    f32_job.pool_slots = 64;
    let mut bf16_job = JobSpec::new(2, 4);
    bf16_job.dtype = Some("bf16");
    let mut f16_job = JobSpec::new(3, 4);
    f16_job.dtype = Some("f16");
    let mut sw = Switchd::start(&tb, &[f32_job, bf16_job, f16_job]);

    // A chunk and a bit more than 100 chunks, and a short last chunk.
    let elements = 100 * E16 as usize + 5;
    let mut per_chunk = Vec::new();
    for (job, dtype) in [(1u16, "f32"), (2, "bf16"), (3, "f16")] {
        let children: Vec<Child> = (0..4)
            .map(|r| spawn_typed(&tb, job, dtype, r, elements))
            .collect();
        let reports = expect_verified(children);
        for r in &reports {
            assert_eq!(r["dtype"], dtype, "{r}");
            assert_eq!(r["mismatches"], 0, "{r}");
        }
        per_chunk.push(reports[0]["elems_per_chunk"].as_u64().unwrap());
    }
    // MTU 1500: 358 float32 elements, 716 half-precision ones (same bytes).
    assert_eq!(per_chunk, vec![E, E16, E16]);

    // A worker joining the bf16 job as f32 is refused, both sides naming
    // the dtypes.
    let out = tb
        .cmd_in(&tb.worker_ns(0), worker_bin())
        .args(["join", "--switch", &tb.switch_addr().to_string()])
        .args(["--job", "2", "--rank", "0"])
        .args(["--workers", "4", "--join-timeout", "5"])
        .env(proto::secret::SECRET_ENV, SECRET)
        .args(["--dtype", "f32"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("parameters differ") && text.contains("dtype f32"),
        "{text}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let want = "the JOIN asks for dtype f32, the job is declared bf16";
    while !sw.log_text().contains(want) {
        assert!(
            Instant::now() < deadline,
            "switchd did not log the dtype refusal:\n{}",
            sw.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Declared at run time: switchctl job add --dtype.
    let subnet = tb.subnet().to_string();
    let add = |dtype: &str| {
        sw.switchctl(&[
            "job",
            "add",
            "--id",
            "4",
            "--workers",
            "4",
            "--allow",
            &subnet,
            "--secret-file",
            secret_file(),
            "--dtype",
            dtype,
        ])
    };
    let out = add("fp16");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("f32, bf16 or f16"), "{err}");
    let out = add("f16");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let jobs = sw.switchctl(&["--json", "jobs"]);
    let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    let dtypes: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["dtype"].as_str().unwrap())
        .collect();
    assert_eq!(dtypes, ["f32", "bf16", "f16", "f16"]);
    assert_eq!(jobs[3]["elems_per_chunk"], E16, "{jobs}");

    let stats = stop_clean(&tb, &mut sw);
    for (id, per) in [(1, E), (2, E16), (3, E16)] {
        let j = job(&stats, id);
        let chunks = 2 * (elements as u64).div_ceil(per);
        assert_eq!(j["chunks_completed"].as_u64().unwrap(), chunks, "{j}");
    }
    // Every DATA had the job's element size.
    assert_eq!(stats["malformed_total"], 0);
    for id in 1..=3 {
        let drops = &job(&stats, id)["drops"];
        assert_eq!(drops["payload_length"].as_u64().unwrap_or(0), 0, "{drops}");
    }
}

#[test]
#[ignore = "needs root"]
fn a_bf16_tree_is_the_float32_tree_order_sum_rounded_once() {
    if !can_run("dtypes_tree") {
        return;
    }
    const LEAVES: u16 = 2;
    const WPL: u16 = 2;
    let fabric = LeafSpine::up("e2ht", LEAVES, 1, WPL, 0);
    // The spine's job is float32: it sums the leaves' float32 partials.
    let mut spine = Switchd::start_in(
        &fabric.spine_ns(0),
        "e2ht-s0",
        &spine_config(&fabric, 0, LEAVES),
    );
    let mut leaves: Vec<Switchd> = (0..LEAVES)
        .map(|i| {
            let cfg = leaf_config(&fabric, i, WPL, LEAVES, 1).set_jobs("dtype", "bf16");
            Switchd::start_in(&fabric.leaf_ns(i), &format!("e2ht-l{i}"), &cfg)
        })
        .collect();
    let elements = 50_000;
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
                .args(["--dtype", "bf16", "--tree-leaves", &sizes])
                .args([
                    "--leaf",
                    &i.to_string(),
                    "--elements",
                    &elements.to_string(),
                ])
                .args([
                    "--iterations",
                    "2",
                    "--verify",
                    "--json",
                    "--stall-timeout",
                    "20",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starting worker")
        })
        .collect();
    let reports = expect_verified(workers);
    for r in &reports {
        assert_eq!(r["dtype"], "bf16", "{r}");
        // A leaf's chunk is bounded by its float32 partials.
        assert_eq!(r["elems_per_chunk"], E, "{r}");
    }
    let chunks = 2 * (elements as u64).div_ceil(E);
    for (i, sw) in leaves.iter_mut().enumerate() {
        let (ok, stats) = sw.stop();
        assert!(ok, "leaf {i} did not stop cleanly:\n{}", sw.log_text());
        let j = job(&stats, 1);
        assert_eq!(
            j["chunks_completed"].as_u64(),
            Some(chunks),
            "leaf {i}: {j}"
        );
        assert_eq!(j["drops"]["payload_length"].as_u64().unwrap_or(0), 0, "{j}");
    }
    let (ok, stats) = spine.stop();
    assert!(ok, "the spine did not stop cleanly:\n{}", spine.log_text());
    let j = job(&stats, 1);
    assert_eq!(j["chunks_completed"].as_u64(), Some(chunks), "spine: {j}");
    // The partials were float32: four bytes per element.
    assert_eq!(
        j["bytes_aggregated"].as_u64(),
        Some(u64::from(LEAVES) * 2 * elements as u64 * 4),
        "spine: {j}"
    );
}
