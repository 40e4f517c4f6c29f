//! End-to-end tests of the leaf-spine testbed (`scripts/testbed.sh up
//! --leaves L --spines K --workers-per-leaf W`): a routed fabric where
//! traffic between leaves crosses a spine, flows spread over the spines by
//! ECMP, and `down` removes it all. No switchd runs here: the fabric's own
//! forwarding is under test. Each test makes its own fabric (prefix `lsp…`)
//! and removes it, also on failure. They need root; under `CI=true` they
//! fail rather than skip.

use agg_e2e::*;

/// The reply to a ping between leaves crossed three routers (the far leaf,
/// a spine, the near leaf): 64 - 3.
const TTL_ACROSS_SPINE: &str = "ttl=61";

fn ping_output(fabric: &LeafSpine, ns: &str, addr: std::net::Ipv4Addr) -> String {
    let out = fabric
        .cmd_in(ns, "ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", &addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ping {addr} from {ns} failed:\n{text}"
    );
    text
}

#[test]
#[ignore = "needs root"]
fn workers_and_hosts_under_different_leaves_reach_each_other_through_a_spine() {
    if !can_run("leafspine_reach") {
        return;
    }
    let fabric = LeafSpine::up("lspa", 2, 2, 2, 1);
    let w00 = fabric.worker_ns(0, 0);
    // A worker under leaf 0 pings a worker and a host under leaf 1; the
    // replies come back through a spine.
    for addr in [
        fabric.worker_addr(1, 0),
        fabric.worker_addr(1, 1),
        fabric.host_addr(1, 0),
    ] {
        let text = ping_output(&fabric, &w00, addr);
        assert!(
            text.contains(TTL_ACROSS_SPINE),
            "reply from {addr} did not cross leaf 1, a spine and leaf 0:\n{text}"
        );
    }
    // And the other way, and every spine's own address from both leaves.
    ping(&fabric, &fabric.host_ns(1, 0), fabric.worker_addr(0, 1));
    ping(&fabric, &w00, fabric.leaf_gateway(1));
    for j in 0..2 {
        ping(&fabric, &w00, fabric.spine_addr(j));
        ping(&fabric, &fabric.worker_ns(1, 1), fabric.spine_addr(j));
    }

    // A few MB over TCP between hosts under different leaves, both ways,
    // arrive unchanged.
    let (h0, h1) = (fabric.host_ns(0, 0), fabric.host_ns(1, 0));
    let (a0, a1) = (fabric.host_addr(0, 0), fabric.host_addr(1, 0));
    tcp_transfer_between(&fabric, &fabric.dir, &h0, &h1, a1, 5001, 4_000_000);
    tcp_transfer_between(&fabric, &fabric.dir, &h1, &h0, a0, 5002, 4_000_000);
}

#[test]
#[ignore = "needs root"]
fn flows_between_leaves_are_spread_over_both_spines() {
    if !can_run("leafspine_ecmp") {
        return;
    }
    let fabric = LeafSpine::up("lspb", 2, 2, 2, 1);
    let leaf0_ns: Vec<String> = vec![
        fabric.worker_ns(0, 0),
        fabric.worker_ns(0, 1),
        fabric.host_ns(0, 0),
    ];
    let dst_ns = fabric.host_ns(1, 0);
    let dst = fabric.host_addr(1, 0);
    // Frames toward leaf 1 leave each spine on its downlink dn-l1.
    let tx = |j: u16| fabric.if_counter(&fabric.spine_ns(j), "dn-l1", "tx_packets");
    let before = [tx(0), tx(1)];
    // 16 TCP flows (each its own ports; leaves hash L4 ports) of 256 kB:
    // ≥ 170 full-size frames each.
    const FLOWS: u16 = 16;
    for f in 0..FLOWS {
        let src = &leaf0_ns[usize::from(f) % leaf0_ns.len()];
        tcp_transfer_between(
            &fabric,
            &fabric.dir,
            src,
            &dst_ns,
            dst,
            5100 + f,
            256 * 1024,
        );
    }
    let carried = [tx(0) - before[0], tx(1) - before[1]];
    let total = carried[0] + carried[1];
    eprintln!("frames toward leaf 1 per spine: {carried:?}");
    assert!(
        total >= u64::from(FLOWS) * 170,
        "the flows did not cross the spines: {carried:?}"
    );
    for (j, n) in carried.iter().enumerate() {
        // At least one whole flow on each spine (16 flows all hashed onto
        // one spine: probability 2^-15).
        assert!(
            *n >= 150,
            "spine {j} carried {n} frames of {total}: ECMP did not use both spines"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn down_removes_every_namespace_of_the_fabric_and_nothing_else() {
    if !can_run("leafspine_down") {
        return;
    }
    // Another testbed, whose prefix starts the same way, must survive.
    let other = Testbed::up("lspcx", 1, 0);
    let fabric = LeafSpine::up("lspc", 2, 2, 2, 1);
    let ours = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|n| n.starts_with("lspc-"))
            .cloned()
            .collect()
    };
    // 2 leaves + 2 spines + 2 × (2 workers + 1 host).
    assert_eq!(ours(&netns_names()).len(), 10, "{:?}", netns_names());
    let out = fabric.down();
    assert!(out.status.success(), "testbed.sh down failed: {out:?}");
    let left = ours(&netns_names());
    assert!(left.is_empty(), "namespaces left after down: {left:?}");
    assert!(
        netns_names().contains(&other.switch_ns()),
        "down --prefix lspc removed {}",
        other.switch_ns()
    );
    // Idempotent: nothing to remove is a success.
    assert!(fabric.down().status.success());
}
