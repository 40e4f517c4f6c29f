//! End-to-end tests of jumbo frames (MTU 9000): the XDP program loaded
//! with frags, AF_XDP sockets bound with multi-buffer, chunks of a
//! 9000-byte MTU, and ordinary jumbo traffic crossing the switch unchanged
//! with either `forwarding` setting. Each test makes its own testbed
//! (prefix `e2j…`) and removes it, also on failure. They need root; under
//! `CI=true` they fail rather than skip.

use std::process::Child;

use agg_e2e::*;

const MTU: u16 = 9000;
/// Floats in a chunk at MTU 9000: (9000 − 20 − 8 − 22) / 4 less the
/// RESULT's 16-byte token.
const JUMBO_CHUNK: u64 = 2233;

/// Three pings of `size` payload bytes with DF set (`-M do`), so a frame
/// the path cannot carry fails instead of being fragmented.
fn jumbo_ping(tb: &Testbed, ns: &str, addr: &str, size: u32) {
    let out = tb
        .cmd_in(ns, "ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", "-M", "do"])
        .args(["-s", &size.to_string(), addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ping -s {size} {addr} from {ns} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An interface counter of `dev` in namespace `ns` (sysfs statistics).
fn if_stat(tb: &Testbed, ns: &str, dev: &str, stat: &str) -> u64 {
    let out = tb
        .cmd_in(ns, "cat")
        .arg(format!("/sys/class/net/{dev}/statistics/{stat}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no {stat} of {dev} in {ns}: {out:?}"))
}

#[test]
#[ignore = "needs root"]
fn jumbo_allreduce_is_bit_exact_with_9000_mtu_chunks_and_jumbo_traffic_crosses() {
    if !can_run("jumbo_allreduce") {
        return;
    }
    let tb = Testbed::up_with_mtu("e2ja", 4, 2, MTU);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], "forwarding = \"xdp\"\n");
    let log = sw.log_text();
    assert!(
        log.contains("bound with XDP_USE_SG"),
        "switchd did not say it binds multi-buffer sockets:\n{log}"
    );
    let (elements, iterations) = (1_000_000u64, 3u32);
    let rx0 = (
        if_stat(&tb, &tb.worker_ns(0), "eth0", "rx_bytes"),
        if_stat(&tb, &tb.worker_ns(0), "eth0", "rx_packets"),
    );
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, elements as usize, iterations))
        .collect();
    // Jumbo frames between the hosts meanwhile: through the fast path
    // (once both MACs are learned) and, the first ones, the bridge.
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    jumbo_ping(&tb, &h0, &tb.host_addr(1).to_string(), 8000);
    jumbo_ping(&tb, &h1, &tb.host_addr(0).to_string(), 8000);
    jumbo_ping(&tb, &h0, &tb.switch_addr().to_string(), 8000);
    tcp_transfer(&tb, &sw, 20_000_000);
    let reports = expect_verified(workers);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(
            r["elems_per_chunk"], JUMBO_CHUNK,
            "worker {i} was not granted the MTU-9000 chunk: {r}"
        );
    }
    // The RESULTs a worker received were jumbo frames: bytes per packet
    // on its link above one 4 KiB page.
    let rx1 = (
        if_stat(&tb, &tb.worker_ns(0), "eth0", "rx_bytes"),
        if_stat(&tb, &tb.worker_ns(0), "eth0", "rx_packets"),
    );
    let per_packet = (rx1.0 - rx0.0) / (rx1.1 - rx0.1).max(1);
    assert!(
        per_packet > 4096,
        "worker 0 received {per_packet} B per packet, not jumbo frames"
    );

    let stats = stop_clean(&tb, &mut sw);
    let job = job(&stats, 1);
    let chunks = u64::from(iterations) * elements.div_ceil(JUMBO_CHUNK);
    assert_eq!(job["chunks_completed"], chunks, "{job}");
    // Every full chunk is a 8996-byte DATA frame and a 9012-byte RESULT
    // (its token): several AF_XDP buffers each way (the last chunk of each
    // all-reduce is small).
    let full = 4 * u64::from(iterations) * (elements / JUMBO_CHUNK);
    assert!(
        counter(&stats, "rx_multi_buffer") >= full,
        "fewer gathered frames than full DATA chunks ({full}): {stats}"
    );
    assert!(
        counter(&stats, "tx_multi_buffer") >= full,
        "fewer multi-buffer RESULTs than full chunks ({full}): {stats}"
    );
    assert_eq!(counter(&stats, "rx_too_many_buffers"), 0, "{stats}");
    assert_eq!(port_sum(&stats, "sw-h", "xdp_steered"), 0, "{stats}");
    assert!(
        port_sum(&stats, "sw-h0", "xdp_forwarded") > 0,
        "no jumbo frame from h0 took the fast path: {stats}"
    );
    // veth ports redirect multi-buffer frames: none was left to the bridge
    // for that reason.
    for p in stats["ports"].as_array().unwrap() {
        assert_eq!(p["xdp_fwd_refused"]["fwd_multi_buffer"], 0, "{p}");
    }
}

#[test]
#[ignore = "needs root"]
fn jumbo_traffic_crosses_with_bridge_forwarding() {
    if !can_run("jumbo_bridge_forwarding") {
        return;
    }
    let tb = Testbed::up_with_mtu("e2jb", 1, 2, MTU);
    let mut sw = Switchd::start_with(&tb, &[], "forwarding = \"bridge\"\n");
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    jumbo_ping(&tb, &h0, &tb.host_addr(1).to_string(), 8000);
    jumbo_ping(&tb, &h1, &tb.host_addr(0).to_string(), 8000);
    jumbo_ping(&tb, &h0, &tb.switch_addr().to_string(), 8000);
    tcp_transfer(&tb, &sw, 20_000_000);
    let stats = stop_clean(&tb, &mut sw);
    assert_eq!(port_sum(&stats, "sw-", "xdp_forwarded"), 0, "{stats}");
    assert!(port_sum(&stats, "sw-h0", "xdp_passed") > 0, "{stats}");
}
