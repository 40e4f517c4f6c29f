//! End-to-end test of issue 20, finding 2: what ends or resets a collective
//! is authenticated (docs/PROTOCOL.md, "Sessions"). A host forges, with the
//! switch's MAC, IP address and UDP port, NACKs 1, 6 and 7 and RESULTs of
//! another generation to a member during a verified all-reduce: from
//! another switch port they are dropped at ingress (`own_address_forged`,
//! issue 35); sent to the member without crossing the switch, nothing ends
//! or resets, every rank verifies, and the member counts what it ignored.

use std::process::Child;

use agg_e2e::*;

#[test]
#[ignore = "needs root"]
fn spoofed_nacks_and_results_to_a_worker_are_ignored() {
    if !can_run("spoofed_control") {
        return;
    }
    let tb = Testbed::up("nk1", 4, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    // Long enough (tens of seconds on a loaded machine) that the forgeries
    // land during the all-reduces.
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 2_000_000, 40))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let gen = sw.stats()["generation"].as_u64().unwrap();
    let port = worker_port(&tb, &tb.worker_ns(1));
    let switch_mac = mac_of(&tb.switch_ns(), "br0");
    let victim_mac = mac_of(&tb.worker_ns(1), "eth0");
    let (switch_ip, agg_port) = (tb.switch_addr().to_string(), AGG_PORT.to_string());
    let (victim_ip, gen) = (tb.worker_addr(1).to_string(), gen.to_string());
    let port = port.to_string();
    let spoof = |ns: &str, iface: &str| {
        let args = [
            "spoof-control",
            iface,
            &switch_mac,
            &switch_ip,
            &agg_port,
            &victim_mac,
            &victim_ip,
            &port,
            "1",
            "1",
            &gen,
            "3",
        ];
        attack_py(&tb, ns, &args)
    };
    // From another port: dropped at the switch, whoever they are for.
    let forged = |s: &serde_json::Value| port_sum(s, "sw-h0", "xdp_own_address_forged");
    let before = forged(&sw.stats());
    let through = spoof(&tb.host_ns(0), "eth0");
    assert!(through >= 7 * 100, "only {through} forged frames sent");
    sw.wait_stats(10, "the forged frames dropped at ingress", |s| {
        forged(s) >= before + through
    });
    // Straight to the member, from its own namespace.
    let sent = spoof(&tb.worker_ns(1), "-");
    assert!(sent >= 7 * 100, "only {sent} forged frames sent");
    let reports = expect_verified(workers);
    for (rank, r) in reports.iter().enumerate() {
        assert_eq!(r["stats"]["rejoins"], 0, "rank {rank} rejoined: {r}");
    }
    let victim = &reports[1]["stats"];
    eprintln!("{sent} forged frames sent; rank 1's stats: {victim}");
    let dropped = victim["unauthenticated_dropped"].as_u64().unwrap_or(0);
    assert!(
        dropped > 0 && dropped <= sent,
        "rank 1 counts the forgeries it ignored ({sent} sent): {victim}"
    );
    let probes = victim["probes_sent"].as_u64().unwrap_or(0);
    assert!(
        probes >= 1 && probes <= dropped,
        "rank 1 probes, at most once per trigger: {victim}"
    );
    assert!(
        victim["spoofed_triggers"].as_u64().unwrap_or(0) >= 1,
        "the switch answered a probe under the same generation: {victim}"
    );
    let stats = stop_clean(&tb, &mut sw);
    assert_eq!(job(&stats, 1)["resets"], 0, "{stats}");
    assert_eq!(job(&stats, 1)["activations"], 1, "{stats}");
}

/// The same at a leaf of an aggregation tree (2 leaves of 2 workers, 1
/// spine): a host under leaf 0 forges, with the spine's address and port,
/// NACKs 1, 6 and 7 and RESULTs of another generation to leaf 0's uplink
/// during a verified all-reduce. Leaf 0 keeps its session with the spine,
/// counts them, probes the spine (answered under the same generation), and
/// every worker verifies.
#[test]
#[ignore = "needs root"]
fn spoofed_spine_nacks_and_results_to_a_leaf_are_ignored() {
    if !can_run("spoofed_control_leaf") {
        return;
    }
    let fabric = LeafSpine::up("nk2", 2, 1, 2, 1);
    let mut spine = Switchd::start_in(&fabric.spine_ns(0), "nk2-s0", &spine_config(&fabric, 0, 2));
    let mut leaves: Vec<Switchd> = (0..2)
        .map(|i| {
            let cfg = leaf_config(&fabric, i, 2, 2, 1);
            Switchd::start_in(&fabric.leaf_ns(i), &format!("nk2-l{i}"), &cfg)
        })
        .collect();
    let workers: Vec<Child> = (0..2u16)
        .flat_map(|i| (0..2u16).map(move |k| (i, k)))
        .map(|(i, k)| {
            fabric
                .cmd_in(&fabric.worker_ns(i, k), worker_bin())
                .args(["allreduce", "--switch", &fabric.leaf_gateway(i).to_string()])
                .args(["--job", "1", "--rank", &k.to_string()])
                .args(["--workers", "2", "--secret", SECRET])
                .args(["--tree-leaves", "2,2", "--leaf", &i.to_string()])
                .args(["--elements", "2000000", "--iterations", "20"])
                .args(["--verify", "--json", "--stall-timeout", "20"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starting worker")
        })
        .collect();
    spine.wait_stats(60, "the spine summing", |s| {
        s["jobs"].as_array().is_some_and(|jobs| {
            jobs.iter()
                .any(|j| j["id"] == 1 && j["chunks_completed"].as_u64() > Some(500))
        })
    });
    let gen = spine.stats()["generation"].as_u64().unwrap();
    let host = fabric.host_ns(0, 0);
    let sent = attack_py(
        &fabric,
        &host,
        &[
            "spoof-control",
            "eth0",
            &mac_of(&host, "eth0"),
            &fabric.spine_addr(0).to_string(),
            &AGG_PORT.to_string(),
            &mac_of(&fabric.leaf_ns(0), "br0"),
            &fabric.leaf_gateway(0).to_string(),
            &UPLINK_PORT.to_string(),
            "1",
            "0",
            &gen.to_string(),
            "4",
        ],
    );
    assert!(sent >= 7 * 100, "only {sent} forged frames sent");
    expect_verified(workers);
    let leaf = leaves[0].stats();
    let leaf_job = job(&leaf, 1);
    let s = &leaf_job["spines"][0];
    eprintln!("{sent} forged frames sent; leaf 0's session with the spine: {s}");
    // The session stays up through the attack. Once the workers are done
    // their LEAVEs take the leaf's job back to joining, and a leaf whose
    // ranks all left leaves its spines too: then "joining" is that, not a
    // forged frame's doing (no refusal, no probed restart, below).
    if s["state"] != "joined" {
        assert_eq!(
            leaf_job["state"], "joining",
            "the leaf's session with the spine is down while its ranks are still in the job: \
             {s}"
        );
    }
    assert_eq!(s["refusals"], 0, "{s}");
    let counted = s["unauthenticated"].as_u64().unwrap_or(0);
    assert!(counted > 0 && counted <= sent, "{s}");
    let probes = s["probes_sent"].as_u64().unwrap_or(0);
    assert!(probes >= 1 && probes <= counted, "{s}");
    assert!(s["spoofed_triggers"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert_eq!(s["probed_restarts"], 0, "{s}");
    let sp = spine.stats();
    assert_eq!(job(&sp, 1)["resets"], 0, "{sp}");
    for sw in leaves.iter_mut().chain(std::iter::once(&mut spine)) {
        let (ok, _) = sw.stop();
        assert!(ok, "switchd did not stop cleanly:\n{}", sw.log_text());
    }
}
