//! End-to-end tests of issue 4: ECE marking (CE on contributions, and the
//! switch's own ring occupancy), the worker's DCTCP reaction, window
//! advertisement and enforcement, and the Prometheus metrics endpoint.

use std::process::Child;

use agg_e2e::*;

/// Elements per chunk at MTU 1500: (1500 − 50) / 4 floats less the
/// RESULT's 16-byte token.
const E: u64 = 358;

#[test]
#[ignore = "needs root"]
fn ce_marked_data_yields_ece_results_and_the_window_shrinks() {
    if !can_run("ce_marking") {
        return;
    }
    let tb = Testbed::up("e4a", 2, 0);
    // Ring-based marking off: only the CE marks set below can cause ECE.
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 2)], "ecn_ring_threshold = 1.0\n");
    // Rank 0's DATA leaves its host CE-marked, as if a queue on the way had
    // marked it: a phantom queue with a 1-byte threshold marks every packet.
    if let Err(e) = impair_sh(
        &tb.worker_ns(0),
        &["--rate", "100000", "--ecn-threshold", "1"],
    ) {
        panic!("{e}");
    }
    // Capture one RESULT on rank 1's side: its IP header must carry CE too.
    let dump = tb
        .cmd_in(&tb.worker_ns(1), "timeout")
        .args(["20", "tcpdump", "-i", "eth0", "-c", "1", "-nn", "-v"])
        .arg("udp src port 48879 and (ip[1] & 3) == 3")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 500_000, 4))
        .collect();
    let reports = expect_verified(children);
    let dump = wait_with_timeout(dump, std::time::Duration::from_secs(25));
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains("CE"),
        "no CE-marked RESULT seen: {}",
        String::from_utf8_lossy(&dump.stdout)
    );
    for (r, rep) in reports.iter().enumerate() {
        let st = &rep["stats"];
        assert!(st["ece_results"].as_u64().unwrap() > 0, "rank {r}: {rep}");
        assert!(
            st["alpha"].as_f64().unwrap() > 0.5,
            "rank {r}: α should approach 1: {rep}"
        );
        assert!(
            st["window"].as_u64().unwrap() < 16,
            "rank {r}: window did not shrink: {rep}"
        );
    }
    let (_, stats) = sw.stop();
    assert!(
        stats["jobs"][0]["ece_marked"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

#[test]
#[ignore = "needs root"]
fn ring_occupancy_marks_ece_when_over_the_threshold() {
    if !can_run("ring_marking") {
        return;
    }
    let tb = Testbed::up("e4b", 4, 0);
    // A threshold of one entry: any backlog in a ring marks.
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 4)], "ecn_ring_threshold = 0.0001\n");
    let children: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 2_000_000, 3))
        .collect();
    expect_verified(children);
    let (_, stats) = sw.stop();
    assert!(
        stats["ring_congested_frames"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert!(
        stats["jobs"][0]["ece_marked"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

#[test]
#[ignore = "needs root"]
fn the_switch_advertises_its_window_and_drops_data_beyond_it() {
    if !can_run("window") {
        return;
    }
    let tb = Testbed::up("e4c", 2, 0);
    let mut spec = JobSpec::new(1, 2);
    spec.window = Some(8);
    let mut sw = Switchd::start(&tb, &[spec]);
    // Well-behaved workers honour the advertised window: nothing dropped.
    let children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 300_000, 2))
        .collect();
    for rep in expect_verified(children) {
        assert!(rep["stats"]["window"].as_u64().unwrap() <= 8, "{rep}");
    }
    let before = sw.stats()["jobs"][0]["drops"]["beyond_window"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(before, 0);
    // Workers that ignore it get DATA dropped (counted), and still finish
    // bit-exact because what was dropped is resent. Fewer elements than
    // above: 277 chunks are still over 4 windows of 64, and a window of
    // 64 against 8 takes 20-50 ms per chunk in timer resends (300 000
    // elements took 22-92 s).
    let children: Vec<Child> = (0..2)
        .map(|r| {
            tb.cmd_in(&tb.worker_ns(r), worker_bin())
                .args([
                    "allreduce",
                    "--switch",
                    &tb.switch_addr().to_string(),
                    "--job",
                    "1",
                ])
                .args(["--rank", &r.to_string(), "--workers", "2"])
                .env(proto::secret::SECRET_ENV, SECRET)
                .args([
                    "--elements",
                    "100000",
                    "--iterations",
                    "2",
                    "--verify",
                    "--json",
                ])
                .args(["--stall-timeout", "20", "--window-override", "64"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    expect_verified(children);
    let (_, stats) = sw.stop();
    let j = &stats["jobs"][0];
    assert!(j["drops"]["beyond_window"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["window"], 8);
}

#[test]
#[ignore = "needs root"]
fn metrics_endpoint_serves_the_same_counters() {
    if !can_run("metrics") {
        return;
    }
    let tb = Testbed::up("e4d", 2, 0);
    let mut sw = Switchd::start_with(
        &tb,
        &[JobSpec::new(1, 2)],
        "metrics_listen = \"127.0.0.1:9187\"\n",
    );
    let children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 100_000, 2))
        .collect();
    expect_verified(children);
    let out = tb
        .cmd_in(&tb.switch_ns(), "python3")
        .args([
            "-c",
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9187/metrics',timeout=5).read().decode())",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2 iterations × ⌈100000/358⌉ = 560 chunks.
    let done = 2 * 100_000u64.div_ceil(E);
    let completed = format!("aggswitch_job_chunks_completed_total{{job=\"1\"}} {done}");
    for line in [
        completed.as_str(),
        "aggswitch_job_window{job=\"1\"} 256",
        "aggswitch_port_xdp_steered_total{port=\"sw-w0\"}",
        "aggswitch_ring_rx_occupancy{port=\"sw-w1\",queue=\"0\"}",
        "aggswitch_job_drops_total{job=\"1\",reason=\"beyond_window\"}",
    ] {
        assert!(text.contains(line), "metrics lack `{line}`:\n{text}");
    }
    let ctl = sw.switchctl(&["stats", "1"]);
    let ctl = String::from_utf8_lossy(&ctl.stdout).to_string();
    assert!(ctl.contains(&format!("chunks_completed {done}")), "{ctl}");
    let (ok, _) = sw.stop();
    assert!(ok);
}
