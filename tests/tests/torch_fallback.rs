//! The host path and fallback of `aggswitch.torch.AggSwitchState` through a
//! real switchd: `examples/train_ddp.py` and `examples/train_fsdp.py` run as
//! 4 ranks, one process per worker namespace, while the test kills switchd
//! (SIGKILL) or stops it (SIGSTOP) at step 20 and starts or continues it at
//! step 40, or cuts the last rank's link to it for 10 s. Every rank must finish, having left the switch once (every rank
//! moves to the host path at the same collective, by the state's vote) and
//! come back once (the prober saw the switch again), with weights
//! bit-identical to an uninterrupted run through the switch and (DDP) to a
//! run with `AGGSWITCH_MODE=hosts` (the host path sums as the switch does).
//! A fallback before the outage that came back (the first collective's
//! probe, or a stall, on a loaded machine) is allowed and printed; the
//! outage must then add exactly one.
//! Each test makes its own testbed (prefix `fb…`) and removes it, also on
//! failure; every rank is killed by PID when its guard drops
//! (`agg_e2e::torch::Ranks`), switchd by its PID when its guard drops.
//!
//! They need root, the built binaries and the project venv with torch and
//! `aggswitch` (`AGG_PYTHON`, else `.venv/bin/python`); under `CI=true` a
//! missing one is a failure, otherwise a printed skip.
//!
//! Timing: the interrupted runs pause `STEP_SLEEP` after each step
//! (`--step-sleep`; the weights do not depend on it) so that the test can
//! act at a step: rank 0 prints every 10th step, and 60 unpaced steps of
//! the small MLP take well under a second. `AGGSWITCH_STALL_TIMEOUT=2` and
//! `AGGSWITCH_PROBE_INTERVAL=1` keep the fallback and the return quick; the
//! 20 paced steps after the restart (over 6 s) leave room for switchd's
//! start, the prober's interval and the rejoin (measured: 0.6 to 3.5 s on
//! a loaded 2-core VM). The counters checked are the ones each rank's
//! `--out` JSON records under `path` (the state's `stats()`).

use std::path::Path;
use std::time::{Duration, Instant};

use agg_e2e::torch::{venv_python, Ranks, Report, Run, WorkDir};
use agg_e2e::*;

const WORLD: u16 = 4;
const JOB: u16 = 1;
const STEPS: u32 = 60;
/// The switch goes away once rank 0 printed this step...
const DOWN_AT: u64 = 20;
/// ...and comes back once it printed this one.
const BACK_AT: u64 = 40;
/// Seconds each rank pauses after a step in the interrupted runs.
const STEP_SLEEP: &str = "0.3";
/// A whole run, spawn to exit (python and torch start in a few seconds).
const RUN_LIMIT: Duration = Duration::from_secs(150);

/// What the ranks log (python/aggswitch/_path.py) when they leave the
/// switch, and when they are back on it.
const FELL_BACK: &str = "run on the hosts over the process group";
const CAME_BACK: &str = "the switch is back";

// ---------------------------------------------------------------------------
// Helpers (the ranks' processes: agg_e2e::torch)

/// `script --comm switch --steps STEPS ARGS` on every worker, one rank each.
fn run(script: &'static str, tag: &str, master_port: u16, args: &[&str]) -> Run {
    let mut all: Vec<String> = ["--comm", "switch", "--steps", &STEPS.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.extend(args.iter().map(|s| s.to_string()));
    Run {
        script,
        args: all,
        world: WORLD,
        ranks_per_ns: 1,
        master_port,
        tag: tag.to_owned(),
        env: Vec::new(),
    }
}

/// The run paced and with the quick stall timeout and probe interval.
fn interrupted(mut r: Run) -> Run {
    r.args.extend(["--step-sleep".into(), STEP_SLEEP.into()]);
    r.env.push(("AGGSWITCH_STALL_TIMEOUT", "2".into()));
    r.env.push(("AGGSWITCH_PROBE_INTERVAL", "1".into()));
    r
}

/// Every rank ended with the same weights; returns their digest.
fn same_weights(what: &str, reports: &[Report], wall: f64) -> String {
    let digests: Vec<&str> = reports.iter().map(|r| r.digest.as_str()).collect();
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "{what}: ranks ended with different weights (sha256 per rank: {digests:?}); \
         the ranks must stay in lockstep"
    );
    eprintln!(
        "{what}: {wall:.1} s wall, median step {:.1} ms, loss {:.6}, {} params, weights sha256 \
         {} on all {} ranks",
        reports[0].step_ms_median,
        reports[0].loss,
        reports[0].params,
        reports[0].digest,
        reports.len()
    );
    digests[0].to_owned()
}

/// Runs to completion; the digest all ranks agree on, and their reports.
fn train(tb: &Testbed, py: &Path, dir: &Path, run: &Run) -> (String, Vec<Report>) {
    let what = format!("run `{}` ({})", run.tag, run.args.join(" "));
    let (reports, wall) = Ranks::spawn(tb, py, dir, run).finish(&what, RUN_LIMIT);
    (same_weights(&what, &reports, wall), reports)
}

/// Rank `r`'s counter `key` under `path` in its report (the state's
/// `stats()`).
fn counter(r: &Report, key: &str) -> u64 {
    r.json["path"][key].as_u64().unwrap_or_else(|| {
        panic!(
            "rank {}: no counter `{key}` in its report's `path`: {}",
            r.rank, r.json["path"]
        )
    })
}

/// Every rank's collectives all ran on `path` ("switch" or "hosts").
fn assert_all_on(what: &str, reports: &[Report], path: &str) {
    let (own, other) = if path == "switch" {
        ("switch_collectives", "host_collectives")
    } else {
        ("host_collectives", "switch_collectives")
    };
    for r in reports {
        let st = &r.json["path"];
        assert!(
            st["path"] == path
                && counter(r, own) > 0
                && counter(r, other) == 0
                && counter(r, "fallbacks") == 0,
            "{what}: rank {} should have run every collective on the {path}: {st}",
            r.rank
        );
    }
}

/// Every rank left the switch `times` times and came back as often (once
/// for the outage, plus any fallback before it: [`train_through_outage`]):
/// the same counters on every rank (they move together, by vote),
/// collectives on both paths, back on the switch at the end.
fn assert_left_and_came_back(what: &str, reports: &[Report], times: u64) {
    for r in reports {
        let st = &r.json["path"];
        assert!(
            counter(r, "fallbacks") == times
                && counter(r, "returns") == times
                && counter(r, "host_collectives") > 0
                && counter(r, "switch_collectives") > 0
                && st["path"] == "switch",
            "{what}: rank {} should have left the switch {times} time(s) and come back as often \
             (fallbacks {times}, returns {times}, collectives on both paths, back on the \
             switch): {st}",
            r.rank
        );
        for key in [
            "fallbacks",
            "returns",
            "failed_returns",
            "host_collectives",
            "switch_collectives",
        ] {
            assert_eq!(
                counter(r, key),
                counter(&reports[0], key),
                "{what}: rank {} and rank 0 disagree on `{key}`: the ranks did not move \
                 together\nrank {}: {st}\nrank 0: {}",
                r.rank,
                r.rank,
                reports[0].json["path"]
            );
        }
    }
}

/// How many times rank 0's stderr says `text`.
fn logged(ranks: &Ranks, text: &str) -> usize {
    ranks.procs[0].stderr_text().matches(text).count()
}

/// Seconds from `since` until rank 0's stderr says `text` more than
/// `times` times, or None when the ranks exited first or `limit` passed
/// (the counters then say why).
fn wait_for_log(
    ranks: &mut Ranks,
    text: &str,
    times: usize,
    since: Instant,
    limit: Duration,
) -> Option<f64> {
    while since.elapsed() < limit {
        if logged(ranks, text) > times {
            return Some(since.elapsed().as_secs_f64());
        }
        if ranks.procs.iter_mut().all(|p| p.poll().is_some()) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Rank 0's slowest steps, "step N: S s" (the fallback's stall and the
/// return's join show here).
fn slowest_steps(r: &Report) -> String {
    let mut t: Vec<(usize, f64)> = (r.json["step_times"].as_array())
        .map(|a| a.iter().filter_map(|v| v.as_f64()).enumerate().collect())
        .unwrap_or_default();
    t.sort_by(|a, b| b.1.total_cmp(&a.1));
    t.iter()
        .take(3)
        .map(|(i, s)| format!("step {i}: {s:.2} s"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the switch goes away and comes back.
#[derive(Clone, Copy)]
enum Outage {
    /// SIGKILL, then a new switchd with the same configuration (a new
    /// generation: the job's state is lost).
    Crash,
    /// SIGSTOP, then SIGCONT: the same switchd goes on with its state.
    Freeze,
    /// Every aggregation frame (UDP port 48879) on the last rank's link
    /// dropped, both ways, for [`LINK_DOWN`]: only that rank loses the
    /// switch (gloo's TCP between the ranks goes on); the switch runs on.
    LinkLoss,
}

/// How long [`Outage::LinkLoss`] cuts the last rank off the switch.
const LINK_DOWN: Duration = Duration::from_secs(10);

impl Outage {
    fn went(self) -> &'static str {
        match self {
            Outage::Crash => "killed (SIGKILL)",
            Outage::Freeze => "stopped (SIGSTOP)",
            Outage::LinkLoss => "cut off from the last rank (100 % loss)",
        }
    }
    fn came(self) -> &'static str {
        match self {
            Outage::Crash => "started again",
            Outage::Freeze => "continued (SIGCONT)",
            Outage::LinkLoss => "reachable again",
        }
    }
}

/// Runs `r` (paced), takes the switch away at step DOWN_AT and brings it
/// back at BACK_AT; once every rank finished with the same weights, having
/// left the switch for the outage and come back, returns their digest and
/// the fallbacks (each returned) that came before the outage (0 but on a
/// loaded machine).
fn train_through_outage(
    tb: &Testbed,
    sw: &mut Switchd,
    py: &Path,
    dir: &Path,
    r: &Run,
    outage: Outage,
) -> (String, u64) {
    let what = format!("run `{}` ({})", r.tag, r.args.join(" "));
    let mut ranks = Ranks::spawn(tb, py, dir, r);
    ranks.wait_for_step(DOWN_AT, RUN_LIMIT);
    // The job must be on the switch when it goes away. A fallback before
    // (the first collective's probe, or a stall, on a loaded machine) that
    // came back is allowed and said; the outage must then add one.
    let (left, back) = (logged(&ranks, FELL_BACK), logged(&ranks, CAME_BACK));
    assert_eq!(
        left,
        back,
        "{what}: the job was on the hosts at step {DOWN_AT}, before the switch went away \
         ({left} fallbacks, {back} returns): the outage would test nothing\n{}",
        ranks.all_tails()
    );
    if left > 0 {
        eprintln!(
            "{what}: NOTE: {left} fallback(s) and return(s) before the switch went away; rank \
             0's stderr:\n{}",
            ranks.procs[0].stderr_text()
        );
    }
    let pid = sw.pid().expect("switchd runs");
    let down = Instant::now();
    let mut cut = None;
    match outage {
        Outage::Crash => sw.kill(),
        Outage::Freeze => sw.pause(),
        Outage::LinkLoss => {
            let last = (tb.worker_ns(WORLD - 1), "eth0".to_owned());
            cut = Some(
                Impairment::apply_on(vec![last], 100.0, 0.0, 0.0)
                    .unwrap_or_else(|e| panic!("{what}: cutting the last rank off: {e}")),
            );
        }
    }
    let at = ranks.procs[0].last_step_printed();
    let fell_back = wait_for_log(&mut ranks, FELL_BACK, left, down, Duration::from_secs(30));
    assert!(
        fell_back.is_some(),
        "{what}: rank 0 did not log `{FELL_BACK}` within 30 s of the switch going away \
         (switchd {})\n{}",
        outage.went(),
        ranks.all_tails()
    );
    match outage {
        Outage::LinkLoss => std::thread::sleep(LINK_DOWN.saturating_sub(down.elapsed())),
        _ => ranks.wait_for_step(BACK_AT, RUN_LIMIT),
    }
    let up = Instant::now();
    match outage {
        Outage::Crash => sw.start_again(),
        Outage::Freeze => sw.resume(),
        Outage::LinkLoss => {
            let cut = cut.take().expect("the link was cut");
            let lost = cut.injected();
            cut.clear();
            eprintln!(
                "{what}: the cut dropped {} of {} aggregation frames",
                lost.dropped, lost.frames
            );
            assert!(lost.dropped > 0, "{what}: the cut dropped nothing");
        }
    }
    let ready = up.elapsed().as_secs_f64();
    let came_back = wait_for_log(&mut ranks, CAME_BACK, back, up, Duration::from_secs(60));
    eprintln!(
        "{what}: switchd (PID {pid}) {} after rank 0 printed step {at:?}; rank 0 logged the \
         fallback {fell_back:?} s later; switchd {} {} ({ready:.2} s to ready), rank 0 \
         logged the return {came_back:?} s after that",
        outage.went(),
        outage.came(),
        match outage {
            Outage::LinkLoss => format!("{LINK_DOWN:?} after the cut"),
            _ => format!("after step {BACK_AT}"),
        },
    );
    let (reports, wall) = ranks.finish(&what, RUN_LIMIT);
    let digest = same_weights(&what, &reports, wall);
    eprintln!(
        "{what}: rank 0's counters {}; slowest steps {}",
        reports[0].json["path"],
        slowest_steps(&reports[0])
    );
    assert_left_and_came_back(&what, &reports, 1 + left as u64);
    (digest, left as u64)
}

/// The (restarted or continued) switch summed chunks of the job after the
/// return: its stats file shows job 1 with chunks completed beyond `before`.
fn assert_switch_summed_again(sw: &Switchd, before: u64) {
    sw.wait_stats(10, "job 1's chunks after the return", |s| {
        s["jobs"].as_array().is_some_and(|a| {
            a.iter().any(|j| {
                j["id"] == JOB && j["chunks_completed"].as_u64().is_some_and(|c| c > before)
            })
        })
    });
}

fn chunks_completed(stats: &serde_json::Value) -> u64 {
    stats["jobs"]
        .as_array()
        .and_then(|a| a.iter().find(|j| j["id"] == JOB))
        .and_then(|j| j["chunks_completed"].as_u64())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Tests

/// DDP, 4 ranks, 60 steps: switchd is killed (SIGKILL) at step 20 and a new
/// one started at step 40. Every rank finishes with the weights of an
/// uninterrupted run through the switch and of a run on the hosts
/// (`AGGSWITCH_MODE=hosts`), having fallen back once and returned once.
#[test]
#[ignore = "needs root"]
fn ddp_switchd_killed_and_restarted_ends_with_the_switchs_bits() {
    let test = "fallback_ddp_kill";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let tb = Testbed::up("fb1", WORLD, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(JOB, WORLD)]);
    let dir = WorkDir::new("fb1");
    const SCRIPT: &str = "examples/train_ddp.py";

    let (reference, refs) = train(&tb, &py, &dir.0, &run(SCRIPT, "switch", 29711, &[]));
    assert_all_on("uninterrupted run", &refs, "switch");
    let mut r = run(SCRIPT, "hosts", 29712, &[]);
    r.env.push(("AGGSWITCH_MODE", "hosts".into()));
    let (hosts, reps) = train(&tb, &py, &dir.0, &r);
    assert_all_on("hosts-mode run", &reps, "hosts");

    let r = interrupted(run(SCRIPT, "killed", 29713, &[]));
    let (killed, _) = train_through_outage(&tb, &mut sw, &py, &dir.0, &r, Outage::Crash);
    // The new switchd (its chunk counters start at 0) took the job back.
    assert_switch_summed_again(&sw, 0);
    let chunks = chunks_completed(&sw.stats());
    let stats = stop_clean(&tb, &mut sw);
    eprintln!(
        "weights sha256: uninterrupted through the switch {reference}, hosts mode {hosts}, \
         switchd killed and restarted {killed}; the restarted switchd completed {chunks} chunks"
    );
    assert_eq!(
        hosts, reference,
        "AGGSWITCH_MODE=hosts ended with other weights than the switch: the host path does \
         not sum as the switch does"
    );
    assert_eq!(
        killed, reference,
        "switchd killed at step {DOWN_AT} and restarted at step {BACK_AT}: the weights differ \
         from the uninterrupted run's (a gradient lost, counted twice, or summed differently)"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}

/// DDP with bf16 gradients (`bf16_compress_hook`, a job declared bf16):
/// switchd stopped (SIGSTOP) at step 20 and continued (SIGCONT) at step 40.
/// The ranks leave the frozen switch, come back to the same switchd, and
/// end with the bits of an uninterrupted run and of a bf16 run on the hosts.
#[test]
#[ignore = "needs root"]
fn ddp_bf16_switchd_stopped_and_continued_ends_with_the_switchs_bits() {
    let test = "fallback_ddp_stop_bf16";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let tb = Testbed::up("fb2", WORLD, 0);
    let mut sw = Switchd::start(
        &tb,
        &[JobSpec {
            dtype: Some("bf16"),
            ..JobSpec::new(JOB, WORLD)
        }],
    );
    let dir = WorkDir::new("fb2");
    const SCRIPT: &str = "examples/train_ddp.py";
    let bf16 = ["--dtype", "bf16"];

    let (reference, refs) = train(&tb, &py, &dir.0, &run(SCRIPT, "switch", 29721, &bf16));
    assert_all_on("uninterrupted bf16 run", &refs, "switch");
    assert_eq!(refs[0].json["dtype"], "bf16", "{}", refs[0].json["dtype"]);
    let mut r = run(SCRIPT, "hosts", 29722, &bf16);
    r.env.push(("AGGSWITCH_MODE", "hosts".into()));
    let (hosts, reps) = train(&tb, &py, &dir.0, &r);
    assert_all_on("bf16 hosts-mode run", &reps, "hosts");

    let before = chunks_completed(&sw.live_stats());
    let r = interrupted(run(SCRIPT, "stopped", 29723, &bf16));
    let (stopped, earlier) = train_through_outage(&tb, &mut sw, &py, &dir.0, &r, Outage::Freeze);
    // The same switchd, continued, took the job back.
    assert_switch_summed_again(&sw, before);
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, u64::from(JOB));
    eprintln!(
        "bf16 weights sha256: uninterrupted through the switch {reference}, hosts mode {hosts}, \
         switchd stopped and continued {stopped}; switchd completed {} chunks in all, \
         members left for the hosts {}, activations {}",
        chunks_completed(&stats),
        j["members_left_for_hosts"],
        j["activations"]
    );
    assert_eq!(
        hosts, reference,
        "bf16: AGGSWITCH_MODE=hosts ended with other weights than the switch"
    );
    assert_eq!(
        stopped, reference,
        "bf16: switchd stopped at step {DOWN_AT} and continued at step {BACK_AT}: the weights \
         differ from the uninterrupted run's"
    );
    // The frozen switchd took each rank's LEAVE (for the hosts) once it
    // continued, and then their JOINs (a fallback before the outage adds
    // its own; the counts are then only shown above).
    if earlier == 0 {
        assert!(
            j["members_left_for_hosts"] == WORLD && j["activations"] == 3,
            "switchd continued should have counted {WORLD} members left for the hosts and 3 \
             activations (the uninterrupted run, the interrupted one, its return): {j}"
        );
    }
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}

/// DDP, 4 ranks: the last rank's link to the switch loses every
/// aggregation frame for 10 s from step 20 (the switch runs on; only that
/// rank loses it, gloo between the ranks is untouched). The other ranks
/// stall waiting for it, every rank falls back at the same collective, and
/// all come back once the last rank's prober hears the switch again: the
/// uninterrupted run's bits.
#[test]
#[ignore = "needs root"]
fn ddp_one_ranks_link_lost_for_10_s_ends_with_the_switchs_bits() {
    let test = "fallback_ddp_link";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let tb = Testbed::up("fb4", WORLD, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(JOB, WORLD)]);
    let dir = WorkDir::new("fb4");
    const SCRIPT: &str = "examples/train_ddp.py";

    let (reference, refs) = train(&tb, &py, &dir.0, &run(SCRIPT, "switch", 29741, &[]));
    assert_all_on("uninterrupted run", &refs, "switch");
    let before = chunks_completed(&sw.live_stats());
    let r = interrupted(run(SCRIPT, "cut", 29742, &[]));
    let (cut, _) = train_through_outage(&tb, &mut sw, &py, &dir.0, &r, Outage::LinkLoss);
    assert_switch_summed_again(&sw, before);
    let stats = stop_clean(&tb, &mut sw);
    eprintln!(
        "weights sha256: uninterrupted {reference}, last rank cut off for {LINK_DOWN:?} {cut}; \
         members left for the hosts {}",
        job(&stats, u64::from(JOB))["members_left_for_hosts"]
    );
    assert_eq!(
        cut, reference,
        "one rank cut off the switch for {LINK_DOWN:?}: the weights differ from the \
         uninterrupted run's"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}

/// FSDP2 (every layer `fully_shard`ed; reduce-scatters and all-gathers on
/// the switch), 4 ranks: switchd killed at step 20 and started again at
/// step 40. The full parameters end bit-identical to an uninterrupted FSDP
/// run through the switch.
#[test]
#[ignore = "needs root"]
fn fsdp_switchd_killed_and_restarted_ends_with_the_switchs_bits() {
    let test = "fallback_fsdp_kill";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let tb = Testbed::up("fb3", WORLD, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(JOB, WORLD)]);
    let dir = WorkDir::new("fb3");
    const SCRIPT: &str = "examples/train_fsdp.py";
    let small = ["--hidden", "64", "--seed", "7"];

    let (reference, refs) = train(&tb, &py, &dir.0, &run(SCRIPT, "switch", 29731, &small));
    assert_all_on("uninterrupted FSDP run", &refs, "switch");

    let r = interrupted(run(SCRIPT, "killed", 29732, &small));
    let (killed, _) = train_through_outage(&tb, &mut sw, &py, &dir.0, &r, Outage::Crash);
    assert_switch_summed_again(&sw, 0);
    let stats = stop_clean(&tb, &mut sw);
    eprintln!(
        "FSDP full parameters sha256: uninterrupted through the switch {reference}, switchd \
         killed and restarted {killed}"
    );
    assert_eq!(
        killed, reference,
        "FSDP: switchd killed at step {DOWN_AT} and restarted at step {BACK_AT}: the full \
         parameters differ from the uninterrupted run's"
    );
    assert_eq!(stats["malformed_total"], 0, "{stats}");
}
