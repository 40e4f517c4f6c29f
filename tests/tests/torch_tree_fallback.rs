//! PyTorch DDP through an aggregation tree that loses a spine: 2 leaves of
//! 2 workers and 2 spines (scripts/testbed.sh --leaves, as trees.rs), 4
//! ranks of `examples/train_ddp.py --comm switch`, one per worker
//! namespace, each joined to its leaf as the leaf's rank k of 2
//! (`AGGSWITCH_RANK`, `AGGSWITCH_WORLD_SIZE`) with gloo between all 4 for
//! DDP and the host path (`agg_e2e::torch::Ranks::spawn_tree`). A spine's
//! switchd killed mid-run stalls its chunks; every rank finishes on the
//! host path (`AGGSWITCH_TREE=2,2`: the tree's order), so the weights are
//! bit-identical to an uninterrupted run.
//!
//! Gloo's TCP between the leaves is routed by the kernels of the leaf and
//! spine namespaces (ECMP over both spines; switchd's spines run with
//! `forwarding = "bridge"`, every non-aggregation frame XDP_PASSed): killing
//! a spine's switchd stops its summing, not its routing, so gloo keeps
//! going. A dead spine *box* would take its routes with it; that is not
//! what this test makes.
//!
//! Needs root, the built binaries and the project venv (`AGG_PYTHON`, else
//! `.venv/bin/python`), as torch_ddp.rs.

use std::path::Path;
use std::time::{Duration, Instant};

use agg_e2e::torch::{venv_python, Ranks, Report, Run, WorkDir};
use agg_e2e::*;

const LEAVES: u16 = 2;
const SPINES: u16 = 2;
const WPL: u16 = 2;
const WORLD: u16 = LEAVES * WPL;
/// Enough steps that the run goes on well after the kill at step 20 (rank
/// 0 prints every 10th, read every 100 ms) and momentum carries any
/// difference in a last bit into every weight.
const STEPS: u32 = 200;
/// The step at which spine 1 is killed (about: rank 0's last printed one).
const KILL_AT: u64 = 20;

/// train_ddp.py --comm switch --steps STEPS on every worker of the tree,
/// with a short stall timeout and probe interval.
fn run(tag: &str, master_port: u16) -> Run {
    Run {
        script: "examples/train_ddp.py",
        args: ["--comm", "switch", "--steps", &STEPS.to_string()]
            .map(str::to_owned)
            .to_vec(),
        world: WORLD,
        ranks_per_ns: 1,
        master_port,
        tag: tag.to_owned(),
        env: vec![
            ("AGGSWITCH_STALL_TIMEOUT", "2".into()),
            ("AGGSWITCH_PROBE_INTERVAL", "1".into()),
        ],
    }
}

/// Counter `key` of where a rank's collectives ran (`state.stats()`).
fn stat(r: &Report, key: &str) -> u64 {
    r.json["path"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("rank {}: no counter {key} in {}", r.rank, r.json["path"]))
}

/// Every collective of the uninterrupted run ran exactly once, on the
/// switches or on the hosts: none lost, none done twice.
fn assert_every_collective_once(r: &Report, clean: &Report) {
    assert_eq!(
        stat(r, "host_collectives") + stat(r, "switch_collectives"),
        stat(clean, "switch_collectives"),
        "rank {}: every collective once, on one path: {}",
        r.rank,
        r.json["path"]
    );
}

/// Every rank's digest is the first's; prints the run.
fn same_weights(what: &str, reports: &[Report], wall: f64) {
    let digests: Vec<&str> = reports.iter().map(|r| r.digest.as_str()).collect();
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "{what}: ranks ended with different weights (sha256 per rank: {digests:?})"
    );
    eprintln!(
        "{what}: {wall:.1} s wall, median step {:.1} ms, loss {:.4}, weights sha256 {} on all \
         {WORLD} ranks",
        reports[0].step_ms_median, reports[0].loss, reports[0].digest
    );
    for r in reports {
        let keys = ["path", "fallbacks", "failed_returns", "returns"];
        let keys = keys
            .into_iter()
            .chain(["switch_collectives", "host_collectives"]);
        let counts: Vec<String> = keys.map(|k| format!("{k} {}", r.json["path"][k])).collect();
        eprintln!("  rank {}: {}", r.rank, counts.join(", "));
    }
}

/// IPv4 datagrams spine `j`'s kernel forwarded (`Ip: ForwDatagrams` of
/// its namespace): traffic between the leaves, gloo's TCP, not the
/// aggregation frames addressed to the spine itself.
fn spine_forwarded(fabric: &LeafSpine, j: u16) -> u64 {
    let out = fabric
        .cmd_in(&fabric.spine_ns(j), "cat")
        .arg("/proc/net/snmp")
        .output()
        .expect("reading /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ip = text.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip.next().unwrap_or(""), ip.next().unwrap_or(""));
    (names.split_whitespace().zip(values.split_whitespace()))
        .find(|(n, _)| *n == "ForwDatagrams")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Ip ForwDatagrams in spine {j}'s /proc/net/snmp:\n{text}"))
}

/// `run(tag)` through the tree with spine 1's switchd killed (SIGKILL, by
/// PID) once rank 0 printed step [`KILL_AT`]; with `restart`, started again
/// once rank 0 logged its fallback. Every rank must finish with the same
/// weights.
fn run_killing_spine_1(
    fabric: &LeafSpine,
    spines: &mut [Switchd],
    py: &Path,
    dir: &Path,
    tag: &str,
    restart: bool,
) -> (Vec<Report>, f64) {
    let port = if restart { 29713 } else { 29712 };
    let mut ranks = Ranks::spawn_tree(fabric, py, dir, &run(tag, port));
    ranks.wait_for_step(KILL_AT, Duration::from_secs(120));
    let pid = spines[1].pid().expect("spine 1's switchd runs");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("switchd"),
        "PID {pid} is not spine 1's switchd"
    );
    let fwd_before = spine_forwarded(fabric, 1);
    spines[1].kill();
    let killed = Instant::now();
    let at_step = ranks.procs[0].last_step_printed();
    if restart {
        // The warning aggswitch logs when the job leaves the switch.
        while !ranks.procs[0].stderr_text().contains("run on the hosts") {
            assert!(
                killed.elapsed() < Duration::from_secs(60) && ranks.procs[0].poll().is_none(),
                "{tag}: rank 0 did not fall back to the hosts\n{}",
                ranks.all_tails()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        spines[1].start_again();
        eprintln!(
            "{tag}: spine 1 started again {:.1} s after the kill",
            killed.elapsed().as_secs_f64()
        );
    }
    let what = format!("run `{tag}` (spine 1 killed)");
    let (reports, wall) = ranks.finish(&what, Duration::from_secs(300));
    eprintln!(
        "{tag}: spine 1 (PID {pid}) killed after rank 0 printed step {at_step:?}; the ranks \
         finished {:.1} s later; spine 1's kernel forwarded {} datagrams between the leaves \
         after the kill (gloo's TCP)",
        killed.elapsed().as_secs_f64(),
        spine_forwarded(fabric, 1) - fwd_before
    );
    same_weights(&what, &reports, wall);
    (reports, wall)
}

/// An uninterrupted run through the tree, then the same run with spine 1's
/// switchd killed (SIGKILL) at about step 20: every rank falls back once,
/// finishes on the host path, and ends with the uninterrupted run's bits.
/// Then once more, with spine 1 started again after the fallback: the
/// ranks come back to the tree, with the same bits.
#[test]
#[ignore = "needs root"]
fn ddp_through_a_tree_survives_a_dead_spine_with_the_same_bits() {
    let test = "torch_tree_fallback";
    if !can_run(test) {
        return;
    }
    let Some(py) = venv_python(test) else {
        return;
    };
    let fabric = LeafSpine::up("ft1", LEAVES, SPINES, WPL, 0);
    let (mut spines, mut leaves) = fabric.start_tree("ft1");
    let dir = WorkDir::new("ft1");
    let limit = Duration::from_secs(300);

    // Uninterrupted: every collective on the switches, both spines summing.
    let r = run("clean", 29711);
    let (clean, clean_wall) =
        Ranks::spawn_tree(&fabric, &py, &dir.0, &r).finish("clean run", limit);
    same_weights("clean run", &clean, clean_wall);
    for r in &clean {
        assert_eq!(
            (stat(r, "fallbacks"), stat(r, "host_collectives")),
            (0, 0),
            "rank {}: the clean run left the switch: {}",
            r.rank,
            r.json["path"]
        );
        assert!(
            stat(r, "switch_collectives") >= u64::from(STEPS),
            "rank {}: {}",
            r.rank,
            r.json["path"]
        );
    }
    for (j, sw) in spines.iter().enumerate() {
        sw.wait_stats(10, "the spine's chunks in its stats file", |s| {
            s["jobs"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|jb| jb["id"] == 1 && jb["chunks_completed"].as_u64() > Some(0))
            })
        });
        eprintln!(
            "spine {j}: {} chunks summed in the clean run",
            job(&sw.stats(), 1)["chunks_completed"]
        );
    }

    // Spine 1 dies at about step 20; the job ends on the hosts.
    let (faulty, _) = run_killing_spine_1(&fabric, &mut spines, &py, &dir.0, "dead-spine", false);
    for r in &faulty {
        assert_eq!(
            stat(r, "fallbacks"),
            1,
            "rank {}: one fallback, at the kill: {}",
            r.rank,
            r.json["path"]
        );
        assert!(
            stat(r, "host_collectives") > 0 && stat(r, "switch_collectives") >= KILL_AT,
            "rank {}: switch until the kill, then hosts: {}",
            r.rank,
            r.json["path"]
        );
        assert_every_collective_once(r, &clean[0]);
    }
    assert_eq!(
        faulty[0].digest, clean[0].digest,
        "the run that lost spine 1 ended with other weights than the uninterrupted one (loss \
         {:.6} vs {:.6}): the host path did not sum in the tree's order",
        faulty[0].loss, clean[0].loss
    );

    // Again, and spine 1 comes back once the ranks are on the hosts: they
    // return to the tree (after failed returns while it was dead) and
    // still end with the same bits.
    spines[1].start_again();
    let (back, _) = run_killing_spine_1(&fabric, &mut spines, &py, &dir.0, "spine-back", true);
    for r in &back {
        assert!(
            stat(r, "fallbacks") == 1
                && stat(r, "returns") >= 1
                && r.json["path"]["path"] == "switch",
            "rank {}: one fallback, then back on the switches: {}",
            r.rank,
            r.json["path"]
        );
        assert_every_collective_once(r, &clean[0]);
    }
    assert_eq!(
        back[0].digest, clean[0].digest,
        "switch, hosts, switch again ended with other weights than the uninterrupted run"
    );

    for (i, sw) in leaves.iter_mut().enumerate() {
        let (ok, _) = sw.stop();
        assert!(ok, "leaf {i} did not stop cleanly:\n{}", sw.log_text());
    }
    for (j, sw) in spines.iter_mut().enumerate() {
        let (ok, _) = sw.stop();
        assert!(ok, "spine {j} did not stop cleanly:\n{}", sw.log_text());
    }
}
