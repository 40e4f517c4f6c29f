//! End-to-end tests of jumbo frames (MTU 9000): the XDP program loaded
//! with frags, AF_XDP sockets bound with multi-buffer, chunks of a
//! 9000-byte MTU, the sockets' UMEMs on 2 MiB huge pages when reserved
//! (and the line that says how to reserve them when not), and ordinary
//! jumbo traffic crossing the switch unchanged with either `forwarding`
//! setting. Each test makes its own testbed
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

/// Free pages of the 2 MiB huge page pool.
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The "AF_XDP socket bound" lines of a switchd log that say `huge_pages=want`.
fn sockets_bound(log: &str, huge: bool) -> usize {
    log.lines()
        .filter(|l| l.contains("AF_XDP socket bound"))
        .filter(|l| l.contains(&format!("huge_pages={huge}")))
        .count()
}

#[test]
#[ignore = "needs root"]
fn jumbo_allreduce_on_huge_pages_when_reserved_else_says_how_to_reserve_them() {
    if !can_run("jumbo_huge_pages") {
        return;
    }
    // 4 sockets (one per worker port) of 4096 frames of 4 KiB: 16 MiB,
    // 8 huge pages each.
    let (sockets, pages) = (4usize, 32u64);
    let tb = Testbed::up_with_mtu("e2jh", 4, 0, MTU);
    // No pool: `auto` (the default) goes on 4 KiB pages and says how many
    // pages to reserve.
    {
        let _none = HugePages::set(0);
        let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
        let log = sw.log_text();
        assert!(
            log.contains(&format!("sysctl vm.nr_hugepages={pages}"))
                || log.contains(&format!("echo {pages} > /sys/kernel/mm/hugepages")),
            "switchd did not say how to reserve {pages} huge pages:\n{log}"
        );
        assert_eq!(sockets_bound(&log, false), sockets, "{log}");
        run_ranks_verified(&tb, 1, 4, (100_000, 1), 30, &[]);
        stop_clean(&tb, &mut sw);
    }
    let Some(_pages) = HugePages::reserve(pages) else {
        unavailable(
            "jumbo_huge_pages",
            &format!("the kernel found no {pages} free 2 MiB huge pages"),
        );
        return;
    };
    let free_before = free_huge_pages();
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], "umem_huge_pages = \"on\"\n");
    assert_eq!(
        free_before - free_huge_pages(),
        pages,
        "switchd's sockets did not take {pages} huge pages"
    );
    let log = sw.log_text();
    assert_eq!(sockets_bound(&log, true), sockets, "{log}");
    assert!(log.contains("bound with XDP_USE_SG"), "{log}");

    let (elements, iterations) = (1_000_000u64, 3u32);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, elements as usize, iterations))
        .collect();
    let reports = expect_verified(workers);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["elems_per_chunk"], JUMBO_CHUNK, "worker {i}: {r}");
    }
    let stats = stop_clean(&tb, &mut sw);
    // The kernel unpins a UMEM in deferred work, just after the exit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while free_huge_pages() < free_before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        free_huge_pages(),
        free_before,
        "switchd did not give its pages back"
    );
    let job = job(&stats, 1);
    let chunks = u64::from(iterations) * elements.div_ceil(JUMBO_CHUNK);
    assert_eq!(job["chunks_completed"], chunks, "{job}");
    // Still 4 KiB frames: every full DATA gathered from several buffers.
    let full = 4 * u64::from(iterations) * (elements / JUMBO_CHUNK);
    assert!(counter(&stats, "rx_multi_buffer") >= full, "{stats}");
    assert_eq!(counter(&stats, "rx_too_many_buffers"), 0, "{stats}");
}
