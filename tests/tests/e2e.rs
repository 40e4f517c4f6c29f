//! End-to-end tests: a real switchd on AF_XDP in a veth/netns testbed, real
//! worker processes, real traffic. Each test makes its own testbed (its own
//! namespace prefix) and removes it, also on failure. They need root; under
//! `CI=true` they fail rather than skip without it.

use std::process::Child;
use std::time::Duration;

use agg_e2e::*;

fn hexs(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: usize = 358;

/// Chunks a job completes for `iterations` all-reduces of each size, at
/// `E` elements per chunk.
fn chunks_for(sizes: &[usize], iterations: u32) -> u64 {
    sizes
        .iter()
        .map(|n| u64::from(iterations) * n.div_ceil(E) as u64)
        .sum()
}

fn run_sizes(tb: &Testbed, sizes: &[usize], iterations: u32) {
    for &elements in sizes {
        let children: Vec<Child> = (0..4)
            .map(|r| spawn_allreduce(tb, 1, r, 4, elements, iterations))
            .collect();
        let reports = expect_verified(children);
        for r in &reports {
            assert_eq!(r["elements"], elements as u64);
        }
    }
}

#[test]
#[ignore = "needs root"]
fn allreduce_is_bit_exact_for_one_element_a_chunk_plus_one_and_10_mib() {
    if !can_run("allreduce_sizes") {
        return;
    }
    let tb = Testbed::up("e2a", 4, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    // E + 1 is one chunk plus one element.
    let sizes = [1, E + 1, 10 * 1024 * 1024 / 4];
    run_sizes(&tb, &sizes, 2);
    let stats = stop_clean(&tb, &mut sw);
    let j = job(&stats, 1);
    // 2 iterations each of 1, 2 and ⌈2621440 / 358⌉ = 7323 chunks.
    let want = chunks_for(&sizes, 2);
    assert_eq!(j["chunks_completed"].as_u64().unwrap(), want, "{j}");
    assert_eq!(stats["malformed_total"], 0);
}

#[test]
#[ignore = "needs root"]
fn ordinary_traffic_crosses_unchanged() {
    if !can_run("ordinary_traffic") {
        return;
    }
    let tb = Testbed::up("e2b", 2, 2);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    let h1_addr = tb.host_addr(1).to_string();

    ping(&tb, &h0, &h1_addr);
    ping(&tb, &h0, tb.switch_addr());
    // 20 MB of random bytes over TCP, host to host: same SHA-256 and length.
    tcp_transfer(&tb, &sw, 20_000_000);

    // UDP to another port, and UDP to the aggregation port of a host that
    // is not the switch: both must arrive byte-identical.
    for port in ["5002", "48879"] {
        let payloads: Vec<String> = [
            vec![0u8; 1],
            (0..=255u8).collect::<Vec<u8>>(),
            (0..1400).map(|i| (i * 7 + 3) as u8).collect(),
            // Looks like an aggregation header: still not ours to take.
            vec![
                0x41, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4,
            ],
        ]
        .iter()
        .map(|p| hexs(p))
        .collect();
        let (rx, reader) = probe_listener(
            &tb,
            &h1,
            &["udp-recv", &h1_addr, port, &payloads.len().to_string(), "5"],
        );
        let mut args = vec!["udp-send", &h1_addr, port];
        args.extend(payloads.iter().map(|s| s.as_str()));
        assert!(probe(&tb, &h0, &args).status.success());
        let got: Vec<String> = std::io::BufRead::lines(reader)
            .map_while(Result::ok)
            .map(|l| l.trim().to_owned())
            .collect();
        wait_with_timeout(rx, Duration::from_secs(10));
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted = payloads.clone();
        want_sorted.sort();
        assert_eq!(
            got_sorted, want_sorted,
            "UDP to port {port} changed or lost"
        );
    }

    let stats = stop_clean(&tb, &mut sw);
    let steered: u64 = stats["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("sw-h"))
        .map(|p| p["xdp_steered"].as_u64().unwrap())
        .sum();
    assert_eq!(steered, 0, "host traffic was steered to AF_XDP: {stats}");
}

#[test]
#[ignore = "needs root"]
fn refused_joins_get_their_reason_and_the_job_still_completes() {
    if !can_run("refused_joins") {
        return;
    }
    // Job 1 allows its workers' addresses, not the host's.
    let tb = Testbed::up("e2c", 4, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 200_000, 3))
        .collect();
    let join_probe = |ns: &str, rank: &str, secret: &str, job: &str| {
        tb.cmd_in(ns, worker_bin())
            .args([
                "join",
                "--switch",
                &tb.switch_addr().to_string(),
                "--job",
                job,
                "--rank",
                rank,
            ])
            .args(["--workers", "4", "--join-timeout", "5"])
            .env(proto::secret::SECRET_ENV, secret)
            .output()
            .unwrap()
    };
    let wrong = "00".repeat(32);
    let out = join_probe(&tb.worker_ns(0), "0", &wrong, "1");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("bad secret"), "{text}");

    let out = join_probe(&tb.host_ns(0), "1", SECRET, "1");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("source address not allowed"), "{text}");

    let out = join_probe(&tb.worker_ns(1), "1", SECRET, "9");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("unknown job"), "{text}");

    expect_verified(workers);
    let stats = stop_clean(&tb, &mut sw);
    assert!(job(&stats, 1)["nacks"].as_u64().unwrap() >= 2, "{stats}");
    assert_eq!(
        job(&stats, 1)["activations"],
        1,
        "a refused JOIN disturbed the job"
    );
}

/// A DATA-shaped header with the given fields.
#[allow(clippy::too_many_arguments)]
fn agg_header(
    ver_type: u8,
    flags: u8,
    job: u16,
    rank: u16,
    count: u16,
    seq: u32,
    gen: u32,
) -> Vec<u8> {
    let mut h = vec![ver_type, flags];
    h.extend_from_slice(&job.to_be_bytes());
    h.extend_from_slice(&rank.to_be_bytes());
    h.extend_from_slice(&count.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&0u32.to_be_bytes());
    h.extend_from_slice(&0u16.to_be_bytes());
    h.extend_from_slice(&gen.to_be_bytes());
    h
}

#[test]
#[ignore = "needs root"]
fn malformed_frames_are_counted_and_dropped_while_a_job_completes() {
    if !can_run("malformed_frames") {
        return;
    }
    let tb = Testbed::up("e2d", 4, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 2_000_000, 12))
        .collect();
    sw.wait_stats(30, "job 1 active", |s| s["jobs"][0]["state"] == "active");
    let gen = sw.stats()["generation"].as_u64().unwrap() as u32;
    let payload = |n: usize| -> Vec<u8> { (0..n * 4).map(|i| i as u8).collect() };
    let with = |mut h: Vec<u8>, p: Vec<u8>| {
        h.extend(p);
        hexs(&h)
    };
    let frames = [
        // truncated header
        hexs(&agg_header(0x41, 0, 1, 0, 1, 0, gen)[..10]),
        // wrong version (a version-1 DATA)
        with(agg_header(0x11, 0, 1, 0, 1, 0, gen), payload(1)),
        // count larger than the payload
        with(agg_header(0x41, 0, 1, 0, 50, 0, gen), payload(2)),
        // nonzero reserved flags
        with(agg_header(0x41, 0x80, 1, 0, 1, 0, gen), payload(1)),
        // unknown job
        with(agg_header(0x41, 0, 77, 0, 1, 0, gen), payload(1)),
        // rank ≥ n, right job and generation
        with(agg_header(0x41, 0, 1, 9, 1, 0, gen), payload(1)),
        // spoof of rank 0 from a host: valid in every field but the source
        with(agg_header(0x41, 0, 1, 0, 1, 0, gen), payload(1)),
    ];
    const ROUNDS: usize = 20;
    // All rounds in one probe run, while the job is certainly still active.
    let (switch, agg_port) = (tb.switch_addr().to_string(), AGG_PORT.to_string());
    let mut args = vec!["udp-send", switch.as_str(), agg_port.as_str()];
    for _ in 0..ROUNDS {
        args.extend(frames.iter().map(|s| s.as_str()));
    }
    assert!(probe(&tb, &tb.host_ns(0), &args).status.success());
    expect_verified(workers);
    let stats = stop_clean(&tb, &mut sw);
    let m = &stats["malformed"];
    let at_least = |v: &serde_json::Value, what: &str| {
        assert!(
            v.as_u64().unwrap_or(0) >= ROUNDS as u64,
            "{what}: {v} < {ROUNDS}; stats: {stats}"
        );
    };
    at_least(&m["truncated"], "truncated");
    at_least(&m["bad_version"], "bad_version");
    at_least(&m["payload_length"], "count > payload");
    at_least(&m["reserved_flags"], "reserved flags");
    at_least(&stats["unknown_job"], "unknown job");
    let j = job(&stats, 1);
    // From a host outside the job's prefixes, rank 9 and the spoof of rank 0
    // are both refused before they reach a slot.
    at_least(&j["drops"]["rank_out_of_range"], "rank ≥ n");
    at_least(&j["drops"]["source_mismatch"], "spoofed source");
}

#[test]
#[ignore = "needs root"]
fn no_xdp_program_is_left_after_switchd_stops() {
    if !can_run("no_xdp_left") {
        return;
    }
    let tb = Testbed::up("e2e", 2, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    let attached = tb.ports_with_xdp();
    assert_eq!(
        attached.len(),
        3,
        "expected XDP on every port while running: {attached:?}"
    );
    stop_clean(&tb, &mut sw);
    assert!(sw.log_text().contains("detaching"), "{}", sw.log_text());
}

#[test]
#[ignore = "needs root"]
fn switchd_errors_say_what_to_do() {
    if !can_run("switchd_errors") {
        return;
    }
    let tb = Testbed::up("e2f", 1, 0);
    let dir = std::env::temp_dir().join(format!("agg-e2e-errs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    // Written by hand: SwitchConfig refuses what switchd must refuse here.
    let (port, addr) = (tb.worker_switch_port(0), tb.switch_addr());
    std::fs::write(
        &cfg,
        format!("[switch]\nports = [\"{port}\", \"nosuch0\"]\naddresses = [\"{addr}\"]\n"),
    )
    .unwrap();
    let out = tb
        .cmd_in(&tb.switch_ns(), switchd_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no such interface `nosuch0`"), "{err}");

    std::fs::write(
        &cfg,
        format!("[switch]\nports = [\"{port}\"]\naddresses = [\"{addr}\"]\nagg_port = \"x\"\n"),
    )
    .unwrap();
    let out = tb
        .cmd_in(&tb.switch_ns(), switchd_bin())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 4") && err.contains("agg_port"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(tb.ports_with_xdp().is_empty());
}

#[test]
#[ignore = "needs root"]
fn two_dataplane_threads_hand_results_across_and_sum_exactly() {
    if !can_run("two_dataplane_threads") {
        return;
    }
    // Four ports dealt over two threads in blocks (sw-w0 and sw-w1 to
    // thread 0, sw-w2 and sw-w3 to thread 1): whichever thread takes a
    // chunk's last DATA hands the RESULTs of the other thread's members
    // over its outbox.
    let tb = Testbed::up("e2t", 4, 0);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], "dataplane_threads = 2\n");
    let sizes = [1, E + 1, 4 * 1024 * 1024 / 4];
    run_sizes(&tb, &sizes, 2);
    // The operator's view: one table row per thread, with its sockets.
    let ctl = sw.switchctl(&["stats"]);
    let table = String::from_utf8_lossy(&ctl.stdout);
    assert!(ctl.status.success(), "switchctl stats: {table}");
    for (thread, sockets) in [("0", "sw-w0/0 sw-w1/0"), ("1", "sw-w2/0 sw-w3/0")] {
        assert!(
            table.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&thread) && l.trim_end().ends_with(sockets)
            }),
            "no row for thread {thread} serving {sockets} in switchctl stats:\n{table}"
        );
    }
    let stats = stop_clean(&tb, &mut sw);
    // Per thread: each took frames from its own sockets, and the switch's
    // counters are the threads' sums.
    let threads = stats["threads"]
        .as_array()
        .expect("threads in the stats file");
    assert_eq!(threads.len(), 2, "{stats}");
    for name in ["rx_frames", "tx_frames", "forwarded", "thread_wakeups"] {
        let per: Vec<u64> = threads.iter().map(|t| t[name].as_u64().unwrap()).collect();
        assert_eq!(
            per.iter().sum::<u64>(),
            stats[name].as_u64().unwrap(),
            "{name} per thread {per:?}"
        );
    }
    for t in threads {
        assert!(t["rx_frames"].as_u64().unwrap() > 0, "an idle thread: {t}");
        let busy = t["busy_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&busy), "{t}");
    }
    let j = job(&stats, 1);
    let want = chunks_for(&sizes, 2);
    assert_eq!(j["chunks_completed"].as_u64().unwrap(), want, "{j}");
    let forwarded = stats["forwarded"].as_u64().unwrap_or(0);
    assert!(
        forwarded > 0,
        "no RESULT crossed between the threads; stats: {stats}"
    );
    // Every RESULT of every completed chunk went out, from one thread or
    // the other (workers' resends can add served retransmissions).
    assert!(j["results_sent"].as_u64().unwrap() >= 4 * want, "{j}");
    assert!(
        stats["thread_wakeups"].as_u64().unwrap_or(0) <= forwarded,
        "at most one wake-up per hand-off: {stats}"
    );
}
