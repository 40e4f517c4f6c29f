//! PyTorch DDP through a switch that has a tenant and no job (issue 37):
//! `examples/train_ddp.py --comm switch` run as 4 ranks (one per worker
//! namespace, the torchrun environment of `agg_e2e::torch`) with only
//! `AGGSWITCH_SWITCH`, `AGGSWITCH_TENANT` and `AGGSWITCH_TENANT_KEY_FILE`:
//! no job id, no secret, no job name. `aggswitch.torch` names the job
//! itself (rank 0 puts a fresh name in the process group's store), every
//! rank provisions that one job, and a second run gets a job of its own.
//!
//! Needs root, the built binaries and the project venv with torch and
//! `aggswitch` (`AGG_PYTHON`); under `CI=true` a missing one is a failure.

use std::time::Duration;

use agg_e2e::tenants::*;
use agg_e2e::torch::{venv_python, Ranks, Run, WorkDir};
use agg_e2e::*;

const WORLD: u16 = 4;

/// The names of the jobs switchd's log says it provisioned, in order.
fn provisioned_names(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("job provisioned"))
        .filter_map(|l| l.split(" name=").nth(1))
        .filter_map(|v| v.split_whitespace().next())
        .map(|v| v.trim_matches('"').to_owned())
        .collect()
}

#[test]
#[ignore = "needs root"]
fn ddp_with_only_the_tenant_variables_is_bit_identical_and_each_run_gets_its_own_job() {
    let test = "ddp_by_tenant";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let started = std::time::Instant::now();
    let tb = Testbed::up("tnt", WORLD, 0);
    let keys = KeyDir::new("tnt");
    let a = keys.key("team-a");
    let cfg = SwitchConfig::for_testbed(&tb).tenant(tenant(&a, &tb.worker_sources()));
    let mut sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    let dir = WorkDir::new("tnt");
    let mut digests = Vec::new();
    for (tag, master_port) in [("first", 29541), ("second", 29542)] {
        let run = Run {
            script: "examples/train_ddp.py",
            args: ["--comm", "switch", "--steps", "20"]
                .map(String::from)
                .to_vec(),
            world: WORLD,
            ranks_per_ns: 1,
            master_port,
            tag: tag.to_owned(),
            env: vec![
                ("AGGSWITCH_TENANT", a.name.clone()),
                ("AGGSWITCH_TENANT_KEY_FILE", a.path_str().to_owned()),
                // Nothing else names the job: the harness's declared job
                // and secret are removed.
                ("AGGSWITCH_JOB", String::new()),
                ("AGGSWITCH_SECRET", String::new()),
                ("AGGSWITCH_JOB_NAME", String::new()),
                // No quiet fall back to the hosts: the switch must sum.
                ("AGGSWITCH_FALLBACK", "off".into()),
            ],
        };
        let what = format!("run `{tag}`");
        let (reports, wall) =
            Ranks::spawn(&tb, &py, &dir.0, &run).finish(&what, Duration::from_secs(240));
        let d: Vec<&str> = reports.iter().map(|r| r.digest.as_str()).collect();
        assert!(
            d.iter().all(|x| *x == d[0]),
            "{what}: ranks ended with different weights: {d:?}"
        );
        eprintln!(
            "{what}: {wall:.1} s, loss {:.4}, weights sha256 {} on all {WORLD} ranks",
            reports[0].loss, d[0]
        );
        digests.push(d[0].to_owned());
        // Every rank left: the run's job is gone.
        wait_jobs(&sw, 10.0, "the run's job gone after its ranks left", |j| {
            j.is_empty()
        });
    }
    // Each run provisioned exactly one job (all ranks reached it), named
    // by rank 0 for that run only.
    let names = provisioned_names(&sw.log_text());
    assert_eq!(names.len(), 2, "one job per run: {names:?}");
    assert_ne!(names[0], names[1], "a new run names a new job: {names:?}");
    let stats = sw.live_stats();
    assert_eq!(counter(&stats, "provisioned_jobs"), 2, "{stats}");
    assert_eq!(counter(&stats, "jobs_ended_left"), 2, "{stats}");
    // The same training twice through the switch: the same weights.
    assert_eq!(digests[0], digests[1], "two identical runs differ");
    eprintln!("jobs {names:?}; test took {:.1?}", started.elapsed());
    stop_clean(&tb, &mut sw);
}
