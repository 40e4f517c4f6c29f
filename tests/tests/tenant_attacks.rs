//! End-to-end tests of issue 37's safety rules for self-provisioned jobs
//! (docs/PROTOCOL.md, "Tenants and self-provisioned jobs": Replays, What
//! this costs a stranger): an attacker on a testbed host, on another
//! switch port than the workers, without the tenant key, replays recorded
//! PROVISION claims, floods the switch with claims and guesses job names
//! (`tests/attack.py`, which builds the frames from the spec). What must
//! hold: no job is created, nothing is learned, the switch keeps no state
//! per request (its memory), its log stays short and it never answers with
//! more bytes than it was sent. The measured numbers are printed.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use agg_e2e::tenants::*;
use agg_e2e::*;

/// Starts `tests/attack.py ARGS` in `ns`; with `ready`, waits for its
/// "ready" line.
fn attack_spawn(
    tb: &Testbed,
    ns: &str,
    args: &[&str],
    ready: bool,
) -> (Child, BufReader<ChildStdout>) {
    let mut c = tb
        .cmd_in(ns, "python3")
        .arg(repo_root().join("tests/attack.py"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tests/attack.py");
    let mut r = BufReader::new(c.stdout.take().unwrap());
    if ready {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "attack.py {args:?} did not start");
    }
    (c, r)
}

/// Waits for an attack.py started by [`attack_spawn`]; the JSON of its
/// last line.
fn attack_json(c: Child, mut out: BufReader<ChildStdout>, what: &str) -> serde_json::Value {
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let done = wait_with_timeout(c, Duration::from_secs(120));
    assert!(
        done.status.success(),
        "attack.py {what} failed: {rest}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let last = rest.lines().last().unwrap_or("");
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("attack.py {what}: not JSON ({e}): {rest}"))
}

fn kind_count(v: &serde_json::Value, kind: &str) -> u64 {
    v["kinds"][kind].as_u64().unwrap_or(0)
}

#[test]
#[ignore = "needs root"]
fn replayed_provision_claims_after_the_job_ended_create_nothing() {
    if !can_run("tenant_claim_replay") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("ta1", 2, 1);
    let keys = KeyDir::new("ta1");
    let a = keys.key("team-a");
    let cfg = SwitchConfig::for_testbed(&tb).tenant(tenant(&a, &tb.worker_sources()));
    let mut sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    // Capture worker 0's PROVISION claims (type 10, count 1) while a short
    // run provisions its job, runs and leaves.
    let captured = keys.dir.join("claims.hex");
    let (cap, cap_out) = attack_spawn(
        &tb,
        &tb.worker_ns(0),
        &[
            "capture",
            "eth0",
            "2.5",
            captured.to_str().unwrap(),
            "0x4a",
            "1",
        ],
        true,
    );
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            let job = Named::new(&a, "recorded", r, 2).size(50_000, 2);
            spawn_piped(provisioned_cmd(
                &tb,
                &tb.worker_ns(r),
                tb.switch_addr(),
                &job,
            ))
        })
        .collect();
    expect_verified(ranks);
    let n_captured: u64 = {
        let mut rest = String::new();
        let mut out = cap_out;
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        let _ = wait_with_timeout(cap, Duration::from_secs(10));
        rest.lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(n_captured >= 1, "no PROVISION claim captured");
    wait_jobs(
        &sw,
        10.0,
        "the recorded job gone after its ranks left",
        |j| j.is_empty(),
    );
    let before = sw.live_stats();

    // Replay every claim byte for byte, 5 rounds, from the host (another
    // switch port), with worker 0's addresses, well within the 10 s the
    // claim's switch nonce lives. Whatever answers come back reach worker
    // 0's or the host's interface: both are watched.
    let watchers: Vec<_> = [tb.worker_ns(0), tb.host_ns(0)]
        .iter()
        .map(|ns| attack_spawn(&tb, ns, &["watch", "eth0", "3"], true))
        .collect();
    let sent = attack_py(
        &tb,
        &tb.host_ns(0),
        &["replay", "eth0", captured.to_str().unwrap(), "5", "1"],
    );
    assert_eq!(sent, 5 * n_captured);
    let seen: Vec<serde_json::Value> = watchers
        .into_iter()
        .map(|(c, out)| attack_json(c, out, "watch"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let listed = jobs_listing(&sw);
    assert!(listed.is_empty(), "a replayed claim made a job: {listed:?}");
    let after = sw.live_stats();
    let delta = |k: &str| counter(&after, k) - counter(&before, k);
    assert_eq!(delta("provisioned_jobs"), 0, "{after}");
    let mut answers = 0;
    for w in &seen {
        for (kind, n) in w["kinds"].as_object().unwrap() {
            assert_eq!(
                kind, "nack_9",
                "a replayed claim is answered at most with NACK 9 (stale nonce): {w}"
            );
            answers += n.as_u64().unwrap();
        }
    }
    assert!(answers <= sent, "{answers} answers to {sent} replays");
    eprintln!(
        "replay: {n_captured} claims captured, {sent} replayed, answers {seen:?}, \
         provision_refused +{}, provisioned_jobs +0; test took {:.1?}",
        delta("provision_refused"),
        started.elapsed()
    );
    stop_clean(&tb, &mut sw);
}

#[test]
#[ignore = "needs root"]
fn a_claim_flood_and_guessed_names_cost_no_state_no_amplification_and_few_log_lines() {
    if !can_run("tenant_claim_flood") {
        return;
    }
    let started = Instant::now();
    let tb = Testbed::up("ta2", 2, 1);
    let keys = KeyDir::new("ta2");
    let a = keys.key("team-a");
    // The attacker's host is inside the tenant's prefixes (the worst
    // case: its asks are answered), on its own switch port.
    let cfg = SwitchConfig::for_testbed(&tb).tenant(tenant(&a, &[tb.subnet()]));
    let mut sw = Switchd::start_in(&tb.switch_ns(), &tb.prefix, &cfg);
    let pid = sw.pid().expect("switchd runs");
    // The victim: rank 0 of a 2-rank job provisions it and waits for rank
    // 1, which starts after the attacks.
    let victim = "victim";
    let rank0 = {
        let job = Named::new(&a, victim, 0, 2).size(100_000, 3);
        let mut c = provisioned_cmd(&tb, &tb.worker_ns(0), tb.switch_addr(), &job);
        c.args(["--join-timeout", "90"]);
        spawn_piped(c)
    };
    wait_jobs(&sw, 20.0, "the victim job provisioned", |j| {
        j.iter().any(|j| j["job_name"] == victim)
    });
    let (switch, port) = (tb.switch_addr().to_string(), AGG_PORT.to_string());

    // (c) 1000 asks for random names of team-a, every 50th the victim's:
    // the same answer either way; then claims without the key.
    let (c, out) = attack_spawn(
        &tb,
        &tb.host_ns(0),
        &[
            "guess-names",
            &switch,
            &port,
            "team-a",
            "1000",
            victim,
            "3.5",
        ],
        false,
    );
    let guess = attack_json(c, out, "guess-names");
    eprintln!("guessed names: {guess}");
    let known = &guess["answers"]["known"];
    let unknown = &guess["answers"]["unknown"];
    assert_eq!(
        known["challenge"], 20,
        "every ask for the victim's name: {guess}"
    );
    assert_eq!(
        unknown["challenge"], 980,
        "every ask for a random name: {guess}"
    );
    assert_eq!(
        guess["challenge_sizes"],
        serde_json::json!([62]),
        "one answer size for names that exist and names that do not: {guess}"
    );
    assert_eq!(
        guess["kinds"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec!["nack_2"],
        "claims without the key: bad key (NACK 2) or nothing: {guess}"
    );
    let listed = jobs_listing(&sw);
    assert_eq!(listed.len(), 1, "only the victim: {listed:?}");

    // (b) 100 000 claims with wrong keys: an ask per 1000 claims, every
    // 5th claim a garbage nonce.
    std::thread::sleep(Duration::from_millis(1100)); // the budget refills
    let rss_before = rss_kib(pid);
    let log_before = sw.log_text().lines().count();
    let stats_before = sw.live_stats();
    let flood_started = Instant::now();
    let (c, out) = attack_spawn(
        &tb,
        &tb.host_ns(0),
        &[
            "provision-flood",
            &switch,
            &port,
            "team-a",
            victim,
            "100000",
            "1000",
            "5",
        ],
        false,
    );
    let flood = attack_json(c, out, "provision-flood");
    let flood_secs = flood_started.elapsed();
    std::thread::sleep(Duration::from_millis(1500));
    let rss_after = rss_kib(pid);
    let log = sw.log_text();
    let new_lines: Vec<&str> = log.lines().skip(log_before).collect();
    let flood_lines: Vec<&&str> = new_lines
        .iter()
        .filter(|l| l.contains("PROVISION") || l.contains("refused") || l.contains("suppressed"))
        .collect();
    let stats_after = sw.live_stats();
    let delta = |k: &str| counter(&stats_after, k) - counter(&stats_before, k);
    let (sent, sent_bytes) = (
        flood["sent"].as_u64().unwrap(),
        flood["sent_bytes"].as_u64().unwrap(),
    );
    let (recv, recv_bytes) = (
        flood["recv"].as_u64().unwrap(),
        flood["recv_bytes"].as_u64().unwrap(),
    );
    eprintln!(
        "flood: {sent} messages ({sent_bytes} B) sent in {flood_secs:.1?}, {recv} answers \
         ({recv_bytes} B) received: {}; switchd VmRSS {rss_before} KiB before, {rss_after} KiB \
         after ({:+} KiB); log +{} lines, {} of them about the flood; provision_refused +{}, \
         hello_rate_limited +{}",
        flood["kinds"],
        rss_after as i64 - rss_before as i64,
        new_lines.len(),
        flood_lines.len(),
        delta("provision_refused"),
        delta("hello_rate_limited"),
    );
    for l in &flood_lines {
        eprintln!("  log: {l}");
    }
    assert!(sent >= 100_000, "{flood}");
    assert!(
        recv_bytes <= sent_bytes,
        "the switch sent more ({recv_bytes} B) than the attacker did ({sent_bytes} B)"
    );
    assert!(
        kind_count(&flood, "provisioned") == 0,
        "a claim without the key was provisioned: {flood}"
    );
    assert!(
        rss_after <= rss_before + 2048,
        "switchd grew by {} KiB under the flood",
        rss_after as i64 - rss_before as i64
    );
    // At most a line a second per kind of refusal (bad key, stale nonce)
    // and their closing counts, and together they account for every
    // refusal: the lines' own plus the counts they say were not logged.
    let bound = 2 * (flood_secs.as_secs() + 3);
    assert!(
        flood_lines.len() as u64 <= bound,
        "{} log lines about a flood of {flood_secs:.1?} (at most {bound}):\n{}",
        flood_lines.len(),
        new_lines.join("\n")
    );
    let suppressed: u64 = flood_lines
        .iter()
        .filter_map(|l| l.split("suppressed=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    let logged = flood_lines
        .iter()
        .filter(|l| l.contains("refused") && !l.contains("not logged"))
        .count() as u64;
    eprintln!(
        "flood log: {logged} refusals logged, {suppressed} counted as not logged, \
         provision_refused +{}",
        delta("provision_refused")
    );
    assert_eq!(
        logged + suppressed,
        delta("provision_refused"),
        "the log accounts for every refusal:\n{}",
        new_lines.join("\n")
    );
    assert_eq!(delta("provisioned_jobs"), 0, "{stats_after}");
    let listed = jobs_listing(&sw);
    assert_eq!(listed.len(), 1, "only the victim: {listed:?}");

    // The victim's run completes, verified.
    let rank1 = {
        let job = Named::new(&a, victim, 1, 2).size(100_000, 3);
        spawn_piped(provisioned_cmd(
            &tb,
            &tb.worker_ns(1),
            tb.switch_addr(),
            &job,
        ))
    };
    expect_verified(vec![rank0, rank1]);
    eprintln!("test took {:.1?}", started.elapsed());
    stop_clean(&tb, &mut sw);
}
