//! End-to-end tests of the XDP forwarding fast path (`[switch] forwarding`)
//! and of the XDP_DROP benchmark baseline (`[switch] mode = "xdp-drop"`).
//! Each test makes its own testbed (prefix `fwd…`) and removes it, also on
//! failure. They need root; under `CI=true` they fail rather than skip.

use std::process::Child;
use std::time::Duration;

use agg_e2e::*;

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: u64 = 358;

#[test]
#[ignore = "needs root"]
fn fast_path_forwards_tcp_and_ping_while_an_allreduce_stays_bit_exact() {
    if !can_run("fast_path_forwards") {
        return;
    }
    let tb = Testbed::up("fwda", 4, 2);
    // forwarding = "xdp" is the default; say it anyway.
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], "forwarding = \"xdp\"\n");
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 1_000_000, 5))
        .collect();
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    ping(&tb, &h0, tb.host_addr(1));
    ping(&tb, &h1, tb.host_addr(0));
    ping(&tb, &h0, tb.switch_addr());
    tcp_transfer(&tb, &sw, 20_000_000);
    expect_verified(workers);

    let stats = stop_clean(&tb, &mut sw);
    // 20 MB in ≤ 1500-byte frames is > 13 000 frames from h0; nearly all
    // of them must have taken the fast path, not the bridge.
    let fwd_h0 = port_sum(&stats, "sw-h0", "xdp_forwarded");
    assert!(
        fwd_h0 >= 10_000,
        "fast path barely used from h0 ({fwd_h0} frames): {stats}"
    );
    assert!(
        port_sum(&stats, "sw-h1", "xdp_forwarded") > 0,
        "no ACK took the fast path: {stats}"
    );
    assert_eq!(
        port_sum(&stats, "sw-h", "xdp_steered"),
        0,
        "host traffic was steered to AF_XDP: {stats}"
    );
    assert!(port_sum(&stats, "sw-w", "xdp_steered") > 0, "{stats}");
    assert_eq!(port_sum(&stats, "sw-", "xdp_dropped"), 0, "{stats}");
    let job = &stats["jobs"][0];
    assert_eq!(job["chunks_completed"], 5 * 1_000_000u64.div_ceil(E));
}

#[test]
#[ignore = "needs root"]
fn bridge_forwarding_setting_keeps_every_frame_on_the_bridge() {
    if !can_run("bridge_forwarding") {
        return;
    }
    let tb = Testbed::up("fwdb", 1, 2);
    let mut sw = Switchd::start_with(&tb, &[], "forwarding = \"bridge\"\n");
    ping(&tb, &tb.host_ns(0), tb.host_addr(1));
    tcp_transfer(&tb, &sw, 2_000_000);
    let stats = stop_clean(&tb, &mut sw);
    assert_eq!(port_sum(&stats, "sw-", "xdp_forwarded"), 0, "{stats}");
    assert!(port_sum(&stats, "sw-h0", "xdp_passed") > 1000, "{stats}");
}

#[test]
#[ignore = "needs root"]
fn xdp_drop_mode_counts_blasted_aggregation_frames_and_passes_the_rest() {
    if !can_run("xdp_drop_mode") {
        return;
    }
    let tb = Testbed::up("fwdc", 1, 2);
    let mut sw = Switchd::start_with(&tb, &[], "mode = \"xdp-drop\"\n");
    assert!(
        !sw.log_text().contains("AF_XDP socket bound"),
        "xdp-drop mode opened AF_XDP sockets:\n{}",
        sw.log_text()
    );
    const N: usize = 400;
    let payload = "11000001000000010000000000000000000000000000000000000000";
    let (switch, agg_port) = (tb.switch_addr().to_string(), AGG_PORT.to_string());
    let mut args = vec!["udp-send", switch.as_str(), agg_port.as_str()];
    args.extend(std::iter::repeat_n(payload, N));
    assert!(probe(&tb, &tb.host_ns(0), &args).status.success());
    sw.wait_stats(10, "xdp_dropped to reach the frames sent", |s| {
        s["ports"].is_array() && port_sum(s, "sw-h0", "xdp_dropped") >= N as u64
    });

    // Everything else still crosses: ping (to a host and to the switch),
    // TCP, and UDP to the aggregation port of a host that is not the switch.
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    let h1_addr = tb.host_addr(1).to_string();
    ping(&tb, &h0, &h1_addr);
    ping(&tb, &h0, tb.switch_addr());
    tcp_transfer(&tb, &sw, 1_000_000);
    let (rx, reader) = probe_listener(&tb, &h1, &["udp-recv", &h1_addr, "48879", "3", "5"]);
    assert!(
        probe(&tb, &h0, &["udp-send", &h1_addr, "48879", "aa", "bb", "cc"])
            .status
            .success()
    );
    let mut got: Vec<String> = std::io::BufRead::lines(reader)
        .map_while(Result::ok)
        .map(|l| l.trim().to_owned())
        .collect();
    wait_with_timeout(rx, Duration::from_secs(10));
    got.sort();
    assert_eq!(got, ["aa", "bb", "cc"], "UDP to a host's port 48879 lost");

    let stats = stop_clean(&tb, &mut sw);
    assert_eq!(
        port_sum(&stats, "sw-h0", "xdp_dropped"),
        N as u64,
        "only the frames to the switch's aggregation port are dropped: {stats}"
    );
    assert_eq!(port_sum(&stats, "sw-", "xdp_steered"), 0, "{stats}");
}
