//! End-to-end tests of issue 20's management-plane findings: `/metrics`
//! attacked from a host on another port of the switch (an endless header,
//! 1 500 slow connections, and switchd under a 1 024 open-file limit) stays
//! bounded in memory, threads and fds, and answers afterwards. And where
//! `/metrics` listens: loopback by default, never where the workers'
//! network reaches unless `metrics_on_data_network = true`.
//!
//! The attacks run from host namespace h0 with `tests/mgmt_attack.py`;
//! switchd's side is read from `/proc/PID` while they run. Each test prints
//! its measurements (`MEASURED ...`) for docs and reports.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agg_e2e::*;

/// The metrics endpoint's port, on the switch's bridge address (reachable
/// from h0, so only with `metrics_on_data_network = true`).
const METRICS_PORT: u16 = 9188;

/// The metrics endpoint, `switch_addr:METRICS_PORT`.
fn metrics_addr(tb: &Testbed) -> String {
    format!("{}:{METRICS_PORT}", tb.switch_addr())
}

/// A testbed with switchd serving /metrics on [`metrics_addr`], and
/// switchd's PID.
///
/// These tests are about the endpoint itself under attack from a host on
/// another switch port: the exposure an operator accepts with
/// `metrics_on_data_network = true` (switchd refuses the switch's own
/// address otherwise, and serves on loopback by default; see
/// [`metrics_stays_off_the_data_network_unless_allowed`]).
fn start(prefix: &str) -> (Testbed, Switchd, u32) {
    let tb = Testbed::up(prefix, 2, 1);
    let sw = Switchd::start_with(
        &tb,
        &[JobSpec::new(1, 2)],
        &format!(
            "metrics_listen = \"{}\"\nmetrics_on_data_network = true\n",
            metrics_addr(&tb)
        ),
    );
    let pid = switchd_pid(&sw);
    (tb, sw, pid)
}

/// Stops switchd and checks that it exited cleanly.
fn stop(sw: &mut Switchd) {
    let (ok, _) = sw.stop();
    assert!(ok, "switchd did not stop cleanly:\n{}", sw.log_text());
}

/// switchd's PID: the process running `switchd` with this test's config.
fn switchd_pid(sw: &Switchd) -> u32 {
    let config = sw.dir.join("switchd.toml");
    let config = config.to_string_lossy();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("/switchd"))
            && args.iter().any(|a| a == config.as_ref())
        {
            return pid;
        }
    }
    panic!("no switchd process with config {config}");
}

/// What the attacks are measured by.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_kb: u64,
    threads: usize,
    fds: usize,
}

fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let count = |d: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{d}"))
            .map(|r| r.count())
            .unwrap_or(0)
    };
    Usage {
        rss_kb,
        threads: count("task"),
        fds: count("fd"),
    }
}

/// switchd's threads by name, for the log of a test.
fn thread_names(pid: u32) -> String {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names.join(", ")
}

fn max(a: Usage, b: Usage) -> Usage {
    Usage {
        rss_kb: a.rss_kb.max(b.rss_kb),
        threads: a.threads.max(b.threads),
        fds: a.fds.max(b.fds),
    }
}

fn attack_script() -> std::path::PathBuf {
    repo_root().join("tests/mgmt_attack.py")
}

/// Runs the attack helper in h0 and samples switchd every 50 ms until it
/// exits. Returns the helper's JSON lines and the peak usage.
fn attack(
    tb: &Testbed,
    pid: u32,
    args: &[&str],
    limit: Duration,
) -> (Vec<serde_json::Value>, Usage) {
    let child: Child = tb
        .cmd_in(&tb.host_ns(0), "python3")
        .arg(attack_script())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tests/mgmt_attack.py");
    let mut peak = usage(pid);
    let t0 = Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < limit,
            "mgmt_attack.py {args:?} still running after {limit:?}"
        );
        let now = usage(pid);
        if now.threads > peak.threads {
            println!(
                "switchd threads at {:?}: {}",
                t0.elapsed(),
                thread_names(pid)
            );
        }
        peak = max(peak, now);
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "mgmt_attack.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (lines, peak)
}

/// GET /metrics from h0: (status, body).
fn get_metrics(tb: &Testbed) -> (u64, String) {
    let out = tb
        .cmd_in(&tb.host_ns(0), "python3")
        .arg(attack_script())
        .args(["get", &format!("http://{}/metrics", metrics_addr(tb))])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "GET /metrics from h0 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["status"].as_u64().unwrap(),
        v["body"].as_str().unwrap().to_string(),
    )
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in /metrics:\n{body}"))
}

/// /metrics answers 200 with the switch's counters and its own.
fn assert_answers(tb: &Testbed, when: &str) -> String {
    let (status, body) = get_metrics(tb);
    assert_eq!(status, 200, "/metrics {when}: {body}");
    for line in [
        "aggswitch_job_window{job=\"1\"} ",
        "aggswitch_job_chunks_completed_total{job=\"1\"} 0",
        "aggswitch_rx_frames_total ",
        "aggswitch_thread_rx_frames_total{thread=\"0\"} ",
        "aggswitch_thread_busy_ratio{thread=\"0\"} ",
        "aggswitch_metrics_connections_rejected_total ",
    ] {
        assert!(
            body.contains(line),
            "/metrics {when} lacks `{line}`:\n{body}"
        );
    }
    body
}

fn last_event<'a>(lines: &'a [serde_json::Value], event: &str) -> &'a serde_json::Value {
    lines
        .iter()
        .rev()
        .find(|l| l["event"] == event)
        .unwrap_or_else(|| panic!("no `{event}` line from mgmt_attack.py: {lines:?}"))
}

#[test]
#[ignore = "needs root"]
fn metrics_endless_header_keeps_memory_bounded() {
    if !can_run("metrics_endless_header") {
        return;
    }
    let (tb, mut sw, pid) = start("mg1");
    assert_answers(&tb, "before");
    let before = usage(pid);
    let (lines, peak) = attack(
        &tb,
        pid,
        &["endless", &metrics_addr(&tb), &(4 << 20).to_string()],
        Duration::from_secs(60),
    );
    let r = &lines[0];
    println!(
        "MEASURED endless header: sent {} bytes, closed by server {}, answer `{}` after {} s; \
         switchd VmRSS {} kB before, {} kB peak (+{} kB)",
        r["sent"],
        r["closed_by_server"],
        r["status"].as_str().unwrap_or(""),
        r["secs"],
        before.rss_kb,
        peak.rss_kb,
        peak.rss_kb.saturating_sub(before.rss_kb)
    );
    assert_eq!(
        r["closed_by_server"], true,
        "the server kept the connection: {r}"
    );
    assert!(
        peak.rss_kb < before.rss_kb + 32 * 1024,
        "switchd grew from {} kB to {} kB on an endless header",
        before.rss_kb,
        peak.rss_kb
    );
    let body = assert_answers(&tb, "after an endless header");
    assert!(metric(&body, "aggswitch_metrics_heads_too_large_total") >= 1);
    stop(&mut sw);
}

#[test]
#[ignore = "needs root"]
fn metrics_slow_connections_keep_threads_and_fds_bounded() {
    if !can_run("metrics_slow_connections") {
        return;
    }
    let (tb, mut sw, pid) = start("mg2");
    assert_answers(&tb, "before");
    let before = usage(pid);
    // Held past the 5 s header timeout: the server closes every one.
    let (lines, peak) = attack(
        &tb,
        pid,
        &["slow", &metrics_addr(&tb), "1500", "8"],
        Duration::from_secs(120),
    );
    let done = last_event(&lines, "done");
    println!(
        "MEASURED 1500 slow connections: {} connected ({} failed) in {} s, {} closed at once, \
         {} still open after 8 s; switchd threads {} before, {} peak; fds {} before, {} peak; \
         VmRSS {} kB before, {} kB peak",
        done["connected"],
        done["failed"],
        done["connect_secs"],
        done["closed_at_once"],
        done["still_open_after_hold"],
        before.threads,
        peak.threads,
        before.fds,
        peak.fds,
        before.rss_kb,
        peak.rss_kb
    );
    assert!(
        peak.threads <= before.threads + 2,
        "threads rose from {} to {}",
        before.threads,
        peak.threads
    );
    // The connection limit (64) and some slack for the stats file and
    // the admin socket.
    assert!(
        peak.fds <= before.fds + 64 + 16,
        "fds rose from {} to {}",
        before.fds,
        peak.fds
    );
    assert_eq!(
        done["still_open_after_hold"], 0,
        "slow connections outlived the header timeout: {done}"
    );
    let body = assert_answers(&tb, "after 1500 slow connections");
    let rejected = metric(&body, "aggswitch_metrics_connections_rejected_total");
    let timed_out = metric(&body, "aggswitch_metrics_connections_timed_out_total");
    println!("MEASURED /metrics counted {rejected} connections rejected, {timed_out} timed out");
    assert!(
        rejected >= 1000,
        "only {rejected} connections counted as rejected"
    );
    assert!(timed_out >= 1, "no connection counted as timed out");
    stop(&mut sw);
}

/// Sets switchd's soft open-file limit to `n`, its hard limit to 1024 (a
/// hard limit, once lowered, cannot be raised again here).
fn prlimit_nofile(pid: u32, n: usize) {
    let st = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={n}:1024")])
        .status()
        .expect("running prlimit");
    assert!(st.success(), "prlimit --nofile={n} on switchd failed");
}

#[test]
#[ignore = "needs root"]
fn metrics_survives_the_open_file_limit() {
    if !can_run("metrics_open_file_limit") {
        return;
    }
    let (tb, mut sw, pid) = start("mg3");
    // systemd's default soft limit.
    prlimit_nofile(pid, 1024);
    assert_answers(&tb, "before");
    let before = usage(pid);
    let (lines, peak) = attack(
        &tb,
        pid,
        &["slow", &metrics_addr(&tb), "1500", "2"],
        Duration::from_secs(120),
    );
    let done = last_event(&lines, "done");
    println!(
        "MEASURED ulimit -n 1024, 1500 connections: {} connected, fds {} before, {} peak; \
         threads {} before, {} peak",
        done["connected"], before.fds, peak.fds, before.threads, peak.threads
    );
    assert!(!sw.log_text().contains("panicked"), "{}", sw.log_text());
    assert_answers(&tb, "after 1500 connections under ulimit -n 1024");

    // Now a limit the connections do reach: accept fails with EMFILE, which
    // is counted and waited out, never fatal.
    let now = usage(pid).fds;
    prlimit_nofile(pid, now + 8);
    let (lines, _) = attack(
        &tb,
        pid,
        &["slow", &metrics_addr(&tb), "100", "2"],
        Duration::from_secs(120),
    );
    let done = last_event(&lines, "done");
    prlimit_nofile(pid, 1024);
    let body = assert_answers(&tb, "after running out of file descriptors");
    let accept_errors = metric(&body, "aggswitch_metrics_accept_errors_total");
    println!(
        "MEASURED fd limit at {} (open fds + 8), 100 connections ({} connected): \
         {accept_errors} accept errors counted",
        now + 8,
        done["connected"]
    );
    assert!(
        accept_errors >= 1,
        "EMFILE never hit: the test did not test it"
    );
    let log = sw.log_text();
    assert!(!log.contains("panicked"), "{log}");
    // Logged at most once a second, however many accepts fail.
    let stamps: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("metrics endpoint: accept failed"))
        .filter_map(|l| seconds_of_day(l.split_whitespace().next()?))
        .collect();
    let span = stamps.last().unwrap_or(&0.0) - stamps.first().unwrap_or(&0.0);
    println!(
        "MEASURED {} accept-failure lines logged over {span:.1} s for {accept_errors} failures",
        stamps.len()
    );
    assert!(!stamps.is_empty(), "EMFILE was not logged:\n{log}");
    assert!(
        stamps.len() as f64 <= span + 2.0,
        "{} accept-failure lines in {span:.1} s: not rate-limited:\n{log}",
        stamps.len()
    );
    stop(&mut sw);
}

/// Seconds since midnight of a log line's RFC 3339 timestamp
/// (`2026-11-25T18:25:11.164671Z`).
fn seconds_of_day(stamp: &str) -> Option<f64> {
    let time = stamp.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// switchd's CPU time so far (user + system), in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime is the
    // 12th, stime the 13th of them.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz
}

#[test]
#[ignore = "needs root"]
fn metrics_request_flood_costs_little_cpu() {
    if !can_run("metrics_request_flood") {
        return;
    }
    let (tb, mut sw, pid) = start("mg4");
    assert_answers(&tb, "before");
    // switchd's idle cost (the dataplane threads poll) over the same time.
    let c0 = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(5));
    let idle = cpu_secs(pid) - c0;
    let c1 = cpu_secs(pid);
    let (lines, peak) = attack(
        &tb,
        pid,
        &["flood", &metrics_addr(&tb), "5"],
        Duration::from_secs(60),
    );
    let busy = cpu_secs(pid) - c1;
    let r = &lines[0];
    let served = r["ok"].as_f64().unwrap();
    let secs = r["secs"].as_f64().unwrap();
    let per_request_us = (busy - idle).max(0.0) / served * 1e6;
    println!(
        "MEASURED request flood: {served} requests in {secs} s ({} /s, {} refused, {} reconnects); \
         switchd CPU {busy:.2} s busy against {idle:.2} s idle over 5 s: {:.2} of a core for \
         /metrics, {per_request_us:.0} us per request; threads {}",
        r["per_sec"],
        r["other"],
        r["reconnects"],
        (busy - idle).max(0.0) / secs,
        peak.threads
    );
    assert!(served > 100.0, "only {served} requests answered: {r}");
    assert_eq!(r["other"], 0, "requests refused: {r}");
    // Generous (tiny_http and string lookups took 280 us a request); the
    // point is that a scrape flood cannot take whole cores.
    assert!(
        per_request_us < 500.0,
        "{per_request_us:.0} us of switchd CPU per /metrics request"
    );
    stop(&mut sw);
}

/// GET `url` from inside namespace `ns`: `Some((status, body))`, `None`
/// when nothing answers there.
fn get_in(tb: &Testbed, ns: &str, url: &str) -> Option<(u64, String)> {
    let out = tb
        .cmd_in(ns, "python3")
        .arg(attack_script())
        .args(["get", url])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Some((
        v["status"].as_u64().unwrap(),
        v["body"].as_str().unwrap().to_string(),
    ))
}

/// `switchd SUBCOMMAND --config` in the switch's namespace on `config` (a
/// `[switch]` for `tb` with `extra` lines, job 1): its output.
fn switchd_on(tb: &Testbed, dir: &std::path::Path, sub: &str, extra: &str) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let text = SwitchConfig::for_testbed(tb)
        .set("admin_socket", dir.join("admin.sock").display().to_string())
        .set_lines(extra)
        .job(Job::new(1, 2, &tb.worker_sources()))
        .render();
    let cfg = dir.join("switchd.toml");
    std::fs::write(&cfg, text).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    tb.cmd_in(&tb.switch_ns(), switchd_bin())
        .args([sub, "--config"])
        .arg(&cfg)
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs root"]
fn metrics_listens_on_loopback_by_default_and_runs_on_when_that_port_is_taken() {
    if !can_run("metrics_default_loopback") {
        return;
    }
    let tb = Testbed::up("mg5", 2, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    // The operator reads it in the switch's namespace (or on its host).
    let (status, body) = get_in(&tb, &tb.switch_ns(), "http://127.0.0.1:9100/metrics")
        .expect("nothing answers at 127.0.0.1:9100 in the switch's namespace");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("aggswitch_job_window{job=\"1\"} "), "{body}");
    // A host on a switch port finds nothing on the switch's address.
    let url = format!("http://{}:9100/metrics", tb.switch_addr());
    assert_eq!(get_in(&tb, &tb.host_ns(0), &url), None, "h0 reached {url}");
    stop(&mut sw);

    // Without the per-job series: the switch-wide ones stay.
    let mut sw = Switchd::start_with(
        &tb,
        &[JobSpec::new(1, 2)],
        "metrics_listen = \"127.0.0.1:9189\"\nmetrics_per_job = false\n",
    );
    let (status, body) = get_in(&tb, &tb.switch_ns(), "http://127.0.0.1:9189/metrics")
        .expect("nothing answers at 127.0.0.1:9189");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("aggswitch_job_"), "{body}");
    for line in [
        "aggswitch_rx_frames_total ",
        "aggswitch_port_xdp_steered_total{port=\"sw-w0\"} ",
        "aggswitch_thread_busy_ratio{thread=\"0\"} ",
        "aggswitch_generation ",
    ] {
        assert!(body.contains(line), "no `{line}` in:\n{body}");
    }
    stop(&mut sw);

    // Another service has the default port (node_exporter's is 9100 too):
    // switchd says so once, with the fix, and runs without /metrics. (The
    // holder reuses the address: the GET above left 127.0.0.1:9100 in
    // TIME_WAIT.)
    let mut holder = tb
        .cmd_in(&tb.switch_ns(), "python3")
        .args([
            "-c",
            "import socket,time\ns=socket.socket()\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('127.0.0.1',9100))\ns.listen()\n\
             print('ready',flush=True)\ntime.sleep(300)",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    let log = sw.log_text();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot listen on 127.0.0.1:9100"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("the default of switch.metrics_listen")
            && warned[0].contains("metrics_listen = \"ADDR:PORT\"")
            && warned[0].contains("metrics_listen = \"off\""),
        "{log}"
    );
    run_ranks_ok(&tb);
    stop(&mut sw);
    // A port the operator named that is taken stops switchd.
    let dir = std::env::temp_dir().join(format!("agg-e2e-mg5-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = switchd_on(&tb, &dir, "run", "metrics_listen = \"127.0.0.1:9100\"\n");
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let err = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("starting the metrics endpoint") && err.contains("127.0.0.1:9100"),
        "{err}"
    );
    assert!(tb.ports_with_xdp().is_empty());
}

/// Job 1's two workers all-reduce once, verified.
fn run_ranks_ok(tb: &Testbed) {
    let children: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(tb, 1, r, 2, 1000, 1))
        .collect();
    expect_verified(children);
}

#[test]
#[ignore = "needs root"]
fn metrics_stays_off_the_data_network_unless_allowed() {
    if !can_run("metrics_data_network") {
        return;
    }
    let tb = Testbed::up("mg6", 2, 1);
    let dir = std::env::temp_dir().join(format!("agg-e2e-mg6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let own = format!("{}:9188", tb.switch_addr());
    // The switch's own address and the unspecified one: refused by
    // check-config and by run, naming the address, why and the fix.
    for (listen, why) in [
        (
            own.as_str(),
            "is one of the switch's own aggregation addresses",
        ),
        ("0.0.0.0:9188", "is the unspecified address"),
    ] {
        for sub in ["check-config", "run"] {
            let out = switchd_on(&tb, &dir, sub, &format!("metrics_listen = \"{listen}\"\n"));
            let err = text(&out);
            assert!(!out.status.success(), "{sub} {listen}: {err}");
            assert!(
                err.contains(&format!("switch.metrics_listen = \"{listen}\" {why}"))
                    && err.contains("set metrics_on_data_network = true"),
                "{sub} {listen}: {err}"
            );
        }
    }
    // An address of the ports' bridge that is not an aggregation address:
    // found on the machine at start.
    let bridge = tb.env("switch_bridge");
    let st = Command::new("ip")
        .args([
            "-n",
            &tb.switch_ns(),
            "addr",
            "add",
            "192.0.2.77/32",
            "dev",
            &bridge,
        ])
        .status()
        .unwrap();
    assert!(st.success(), "ip addr add on {bridge}");
    for sub in ["check-config", "run"] {
        let out = switchd_on(&tb, &dir, sub, "metrics_listen = \"192.0.2.77:9188\"\n");
        let err = text(&out);
        assert!(!out.status.success(), "{sub}: {err}");
        assert!(
            err.contains(&format!(
                "switch.metrics_listen = \"192.0.2.77:9188\" is an address of {bridge}, the \
                 bridge of port sw-w0"
            )),
            "{sub}: {err}"
        );
    }
    assert!(tb.ports_with_xdp().is_empty());
    // Allowed by the operator: switchd starts and warns once.
    let mut sw = Switchd::start_with(
        &tb,
        &[JobSpec::new(1, 2)],
        "metrics_listen = \"192.0.2.77:9188\"\nmetrics_on_data_network = true\n",
    );
    let log = sw.log_text();
    let warned = log
        .lines()
        .filter(|l| l.contains("metrics_on_data_network = true: /metrics is served"))
        .count();
    assert_eq!(warned, 1, "{log}");
    stop(&mut sw);
    let _ = std::fs::remove_dir_all(&dir);
}
