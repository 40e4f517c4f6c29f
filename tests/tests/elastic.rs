//! End-to-end test of elastic jobs (issue 23, item 4; docs/PROTOCOL.md,
//! "Elastic jobs"): a job goes from 4 to 2 and back to 4 workers between
//! collectives with `switchctl job resize`, every result bit-exact, and a
//! worker started with the old size is refused with an error naming it;
//! and a PyTorch DDP training restarted with a new world size (what a
//! `torchrun` elastic restart does: new processes, a new `WORLD_SIZE`, the
//! same `AGGSWITCH_JOB` and secret) goes through the resized job. The
//! restart is two successive process groups, of 4 then 2 ranks, started the
//! way torchrun starts them (`agg_e2e::torch::Ranks`), not a torchrun
//! elastic agent: the agent adds nothing the switch sees.

use std::process::Child;
use std::time::{Duration, Instant};

use agg_e2e::torch::{venv_python, Ranks, Report, Run, WorkDir};
use agg_e2e::*;

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: u64 = 358;

/// GET /metrics where an operator reads it: switchd's default address,
/// loopback in the switch's namespace (the workers' network does not reach
/// it). The body, asserting a 200.
fn metrics(tb: &Testbed) -> String {
    let out = tb
        .cmd_in(&tb.switch_ns(), "python3")
        .arg(repo_root().join("tests/mgmt_attack.py"))
        .args(["get", "http://127.0.0.1:9100/metrics"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "GET /metrics in the switch's namespace failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], 200, "{v}");
    v["body"].as_str().unwrap().to_string()
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in /metrics:\n{body}"))
}

/// `n` workers of job 1 (ranks 0..n on w0..), `iterations` verified
/// all-reduces of `elements` each.
fn run_workers(tb: &Testbed, n: u16, elements: usize, iterations: u32) {
    let children: Vec<Child> = (0..n)
        .map(|r| spawn_allreduce(tb, 1, r, n, elements, iterations))
        .collect();
    expect_verified(children);
}

/// Waits until job 1 is joining (its workers left) with `n` ranks declared.
fn wait_joining(sw: &Switchd, n: u64) {
    sw.wait_stats(15, "job 1 joining", |s| {
        s["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id"] == 1))
            .is_some_and(|j| j["state"] == "joining" && j["n_workers"] == n)
    });
}

/// Waits (5 s at most) for switchd to log `want` (its events are logged
/// every 100 ms).
fn wait_log(sw: &Switchd, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sw.log_text().contains(want) {
        assert!(
            Instant::now() < deadline,
            "switchd did not log `{want}`:\n{}",
            sw.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn resize(sw: &Switchd, n: u16) -> String {
    let out = sw.switchctl(&["job", "resize", "1", &n.to_string()]);
    let t = text(&out);
    assert!(out.status.success(), "switchctl job resize 1 {n}: {t}");
    t
}

#[test]
#[ignore = "needs root"]
fn a_job_goes_from_4_to_2_to_4_workers_bit_exact() {
    if !can_run("elastic_resize") {
        return;
    }
    let tb = Testbed::up("el1", 4, 1);
    // /metrics at its default, 127.0.0.1:9100.
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    // 100 000 elements: 280 chunks of 358 per all-reduce.
    let (elements, iterations) = (100_000, 3);
    let chunks = (elements as u64).div_ceil(E) * u64::from(iterations);

    run_workers(&tb, 4, elements, iterations);
    wait_joining(&sw, 4);
    let done_4 = job(&sw.live_stats(), 1)["chunks_completed"]
        .as_u64()
        .unwrap();
    assert_eq!(done_4, chunks);

    // 4 -> 2. The job keeps its id, secret and counters.
    let said = resize(&sw, 2);
    assert!(said.contains("resized to 2 workers"), "{said}");
    let jobs = text(&sw.switchctl(&["jobs"]));
    let row = jobs
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no job 1 in:\n{jobs}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cols[1], cols[2]), ("joining", "2"), "{jobs}");
    let body = metrics(&tb);
    assert_eq!(metric(&body, "aggswitch_job_workers{job=\"1\"}"), 2);
    assert_eq!(
        metric(&body, "aggswitch_job_chunks_completed_total{job=\"1\"}"),
        done_4
    );

    // A worker started with the old size is refused, and told why.
    let stale = spawn_allreduce(&tb, 1, 0, 4, elements, 1);
    let out = wait_with_timeout(stale, Duration::from_secs(30));
    assert!(!out.status.success(), "a worker of the old size joined");
    let t = text(&out);
    assert!(
        t.contains("parameters differ") && t.contains("n_workers 4"),
        "{t}"
    );
    wait_log(&sw, "the JOIN names n_workers 4, the job has 2");

    run_workers(&tb, 2, elements, iterations);
    wait_joining(&sw, 2);
    // The seqs continued: the 2-worker run resumed where the 4 stopped.
    wait_log(
        &sw,
        &format!(
            "job active: every rank joined job=1 ranks=2 resume_collective=3 resume_seq={chunks}"
        ),
    );

    // 2 -> 4, and the first four workers' run again.
    resize(&sw, 4);
    run_workers(&tb, 4, elements, iterations);
    wait_joining(&sw, 4);
    let body = metrics(&tb);
    assert_eq!(metric(&body, "aggswitch_job_workers{job=\"1\"}"), 4);
    assert_eq!(
        metric(&body, "aggswitch_job_chunks_completed_total{job=\"1\"}"),
        3 * chunks,
        "every chunk of the three runs, counted on the one job"
    );
    // Resizing to the size it has changes nothing; 0 is refused, saying why.
    assert!(resize(&sw, 4).contains("has 4 workers already"));
    let bad = sw.switchctl(&["job", "resize", "1", "0"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("switchctl job rm 1"), "{}", text(&bad));
    let bad = sw.switchctl(&["job", "resize", "7", "2"]);
    assert!(text(&bad).contains("no job 7"), "{}", text(&bad));
    let (ok, _) = sw.stop();
    assert!(ok, "{}", sw.log_text());
}

/// `examples/train_ddp.py --comm switch` on `world` ranks; asserts every
/// rank ended with the same weights (DDP in lockstep through the switch).
fn train(tb: &Testbed, py: &std::path::Path, dir: &WorkDir, world: u16, steps: u32) -> Vec<Report> {
    let run = Run {
        script: "examples/train_ddp.py",
        args: vec![
            "--comm".into(),
            "switch".into(),
            "--steps".into(),
            steps.to_string(),
        ],
        world,
        ranks_per_ns: 1,
        master_port: 29530 + world,
        tag: format!("world{world}"),
        env: Vec::new(),
    };
    let what = format!("train_ddp.py on {world} ranks");
    let (reports, _) = Ranks::spawn(tb, py, &dir.0, &run).finish(&what, Duration::from_secs(240));
    assert_eq!(reports.len(), usize::from(world));
    assert!(
        reports.iter().all(|r| r.digest == reports[0].digest),
        "{what}: ranks ended with different weights"
    );
    reports
}

#[test]
#[ignore = "needs root"]
fn ddp_restarted_with_a_new_world_size_goes_through_the_resized_job() {
    let test = "elastic_ddp_restart";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let tb = Testbed::up("el2", 4, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let dir = WorkDir::new("el2");
    const STEPS: u32 = 20;

    let four = train(&tb, &py, &dir, 4, STEPS);
    wait_joining(&sw, 4);
    resize(&sw, 2);
    let two = train(&tb, &py, &dir, 2, STEPS);
    wait_joining(&sw, 2);

    // Every gradient of both process groups was summed in the switch, on
    // the one job: 4 ranks' float32 gradients for the first run's steps,
    // then 2 ranks' for the second's, each chunk from all of its ranks.
    // Asked of switchd itself: the stats file, rewritten every second, can
    // miss the last chunks of ranks that exit at once.
    let stats = sw.live_stats();
    let j = job(&stats, 1);
    let params = four[0].params;
    assert_eq!(two[0].params, params);
    let bytes = j["bytes_aggregated"].as_u64().unwrap();
    assert_eq!(
        bytes,
        (4 + 2) * u64::from(STEPS) * params * 4,
        "the switch did not sum every gradient of both runs exactly once: {j}"
    );
    let chunks = j["chunks_completed"].as_u64().unwrap();
    let contributions = j["contributions"].as_u64().unwrap();
    // Both runs send the same chunks per step: half of them came from 4 ranks.
    assert_eq!(contributions, (4 + 2) * chunks / 2, "{j}");
    eprintln!(
        "4 ranks then 2 on job 1: losses {:.4} then {:.4}, {chunks} chunks, {bytes} bytes",
        four[0].loss, two[0].loss
    );
    let (ok, _) = sw.stop();
    assert!(ok, "{}", sw.log_text());
}
