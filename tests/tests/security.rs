//! End-to-end tests of issue 11: what an attacker or a careless operator
//! does to a running switch, and what the switch must still do: every
//! result bit-exact, every bad input counted, the log kept short.

use std::process::{Child, Stdio};
use std::time::Duration;

use agg_e2e::*;

fn attack_script() -> std::path::PathBuf {
    repo_root().join("tests/attack.py")
}

fn job_counter(stats: &serde_json::Value, field: &str) -> u64 {
    job(stats, 1)[field].as_u64().unwrap_or(0)
}

#[test]
#[ignore = "needs root"]
fn replayed_joins_from_another_host_change_nothing() {
    if !can_run("replayed_joins") {
        return;
    }
    let tb = Testbed::up("sec1", 4, 1);
    let mut spec = JobSpec::new(1, 4);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    // Capture what worker 0 sends while it joins.
    let dir = std::env::temp_dir().join(format!("agg-e2e-sec1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let captured = dir.join("joins.hex");
    let cap = tb
        .cmd_in(&tb.worker_ns(0), "python3")
        .arg(attack_script())
        .args(["capture", "eth0", "4"])
        .arg(&captured)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the capture");
    std::thread::sleep(Duration::from_millis(500));
    // Long enough that the replays land while the all-reduce runs.
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 4_000_000, 40))
        .collect();
    let cap_out = wait_with_timeout(cap, Duration::from_secs(20));
    let n_captured: u64 = String::from_utf8_lossy(&cap_out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    assert!(n_captured >= 1, "no JOIN captured: {}", text(&cap_out));
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let before = sw.stats();
    // 20 rounds of every captured JOIN over 5 s, from a host that is not a
    // member, with worker 0's addresses.
    let sent = attack_py(
        &tb,
        &tb.host_ns(0),
        &["replay", "eth0", captured.to_str().unwrap(), "20", "5"],
    );
    assert_eq!(sent, 20 * n_captured);
    expect_verified(workers);
    let after = stop_clean(&tb, &mut sw);
    let answered =
        |s: &serde_json::Value| job_counter(s, "join_repeats") + job_counter(s, "join_replays");
    assert_eq!(
        answered(&after) - answered(&before),
        sent,
        "every replayed JOIN is counted as a repeat or a replay; before {before}, after {after}"
    );
    assert_eq!(job_counter(&after, "resets"), 0, "{after}");
    assert_eq!(job_counter(&after, "activations"), 1, "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root"]
fn a_job_beyond_the_memory_budget_is_refused_with_the_numbers() {
    if !can_run("memory_budget") {
        return;
    }
    let tb = Testbed::up("sec2", 2, 0);
    let mut sw = Switchd::start_with(&tb, &[JobSpec::new(1, 2)], "pool_memory_mib = 512\n");
    let workers: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 2_000_000, 20))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    // The request that made switchd abort: 3 TB of slot pool.
    let subnet = tb.subnet().to_string();
    let out = sw.switchctl(&[
        "job",
        "add",
        "--id",
        "9",
        "--workers",
        "65535",
        "--allow",
        &subnet,
        "--secret-file",
        secret_file(),
        "--slots",
        "32768",
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("job 9") && t.contains("budget is 512.0 MiB") && t.contains("TiB"),
        "the refusal names the job, the budget and the need: {t}"
    );
    expect_verified(workers);
    let stats = stop_clean(&tb, &mut sw);
    assert!(stats["jobs"].as_array().unwrap().len() == 1, "{stats}");
    assert_eq!(stats["pool_budget_bytes"], 512u64 << 20);
}

#[test]
#[ignore = "needs root"]
fn twenty_thousand_bad_secret_joins_cost_a_few_log_lines() {
    if !can_run("bad_secret_flood") {
        return;
    }
    let tb = Testbed::up("sec3", 2, 1);
    let mut spec = JobSpec::new(1, 2);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    let workers: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce(&tb, 1, r, 2, 2_000_000, 30))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let lines_before = sw.log_text().lines().count();
    let sent = attack_py(
        &tb,
        &tb.host_ns(0),
        &[
            "bad-joins",
            &tb.switch_addr().to_string(),
            &AGG_PORT.to_string(),
            "1",
            "1",
            "2",
            "20000",
        ],
    );
    assert_eq!(sent, 20_000);
    std::thread::sleep(Duration::from_millis(1500));
    let log = sw.log_text();
    let flood_lines: Vec<&str> = log
        .lines()
        .skip(lines_before)
        .filter(|l| l.contains("refused") || l.contains("not logged") || l.contains("faster"))
        .collect();
    // At most one line per second per kind, plus the count of the rest: the
    // flood takes a few seconds at most.
    assert!(
        (1..=12).contains(&flood_lines.len()),
        "{} refusal lines for 20 000 bad JOINs:\n{}",
        flood_lines.len(),
        flood_lines.join("\n")
    );
    assert!(
        flood_lines.iter().any(|l| l.contains("bad secret")),
        "{}",
        flood_lines.join("\n")
    );
    // The lines account for every refusal: logged ones plus the suppressed
    // counts they carry.
    let suppressed: u64 = flood_lines
        .iter()
        .filter_map(|l| l.split("suppressed=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    let logged = flood_lines
        .iter()
        .filter(|l| l.contains("JOIN refused"))
        .count() as u64;
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a log file");
    expect_verified(workers);
    let stats = stop_clean(&tb, &mut sw);
    // Counted exactly (a few may be lost in the kernel: the sender does not
    // wait); none changed the job.
    let bad = job_counter(&stats, "join_bad_mac");
    assert!(
        (19_000..=20_000).contains(&bad),
        "join_bad_mac {bad}: {stats}"
    );
    assert_eq!(logged + suppressed, bad, "{}", flood_lines.join("\n"));
    assert_eq!(job_counter(&stats, "resets"), 0);
}
