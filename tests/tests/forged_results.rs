//! End-to-end tests of issue 35: nothing a host on another port, or a
//! co-tenant, forges reaches a worker or steals another job's window.
//!
//! * RESULTs forged from the switch's own address by a host on another
//!   switch port are dropped at ingress (`own_address_forged`); forged
//!   RESULTs that reach a worker without crossing the switch, standing in
//!   for chunks whose DATA the victim holds back (a gate drops its DATA),
//!   fail their token (`bad_tag_results`), and every rank still verifies.
//! * A member of a high-priority job resending a finished chunk 400 times
//!   a second keeps no class busy: the normal job's RESULTs carry no
//!   priority ECE.
//! * 3000 version-2 HELLOs get no more refusals than the HELLO budget.
//!
//! The frames come from tests/attack_port.py and tests/attack_member.py.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use agg_e2e::*;
use proto::wire::{flags, HeaderRepr, MsgType, HEADER_LEN};

/// Elements per chunk of a job on 1500-byte ports: (MTU − 50) / 4 less
/// the RESULT's 16-byte token (docs/PROTOCOL.md, "Limits").
const ELEMS: u32 = 358;
const TENSOR: u32 = 4_000_000;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes `lines` to a file of the test's own and returns its path.
fn lines_file(tag: &str, name: &str, lines: &[String]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agg-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, lines.join("\n")).unwrap();
    file
}

/// RESULTs of job 1 to `rank` for `seqs`, as the switch would send them
/// (the chunk's collective, count and LAST; generation `gen`), each value
/// 1e9, and a guessed token (16 zero bytes) where the switch's goes: UDP
/// payloads, hex, one per line.
fn forged_results(rank: u16, gen: u32, seqs: std::ops::Range<u32>) -> Vec<String> {
    let per_collective = TENSOR.div_ceil(ELEMS);
    seqs.map(|seq| {
        let mut h = HeaderRepr::new(MsgType::Result, 1);
        h.rank = rank;
        h.gen = gen;
        h.seq = seq;
        h.collective = seq / per_collective;
        h.window = 256;
        let offset = (seq % per_collective) * ELEMS;
        h.count = ELEMS.min(TENSOR - offset) as u16;
        if offset + ELEMS >= TENSOR {
            h.flags |= flags::LAST;
        }
        let mut b = vec![0u8; HEADER_LEN];
        h.emit_to(&mut b).unwrap();
        b.extend(1e9f32.to_le_bytes().repeat(h.count as usize));
        b.extend([0u8; 16]);
        hex(&b)
    })
    .collect()
}

fn floor_of(s: &serde_json::Value) -> u32 {
    job(s, 1)["floor_seq"].as_u64().unwrap() as u32
}

/// scripts/impair.sh on `ns`'s eth0; panics with what it said if it fails.
fn impair(ns: &str, args: &[&str]) {
    if let Err(e) = impair_sh(ns, args) {
        panic!("impair.sh {ns} {args:?}: {e}");
    }
}

#[test]
#[ignore = "needs root"]
fn forged_results_are_dropped_at_the_switch_and_refused_by_the_worker() {
    if !can_run("forged_results") {
        return;
    }
    let tb = Testbed::up("fr1", 4, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let victim = 1u16;
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce_with(&tb, &tb.worker_ns(r), 1, r, 4, TENSOR as usize, 60, 60))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let vns = tb.worker_ns(victim);
    let vport = worker_port(&tb, &vns);
    let dest = format!(
        "{},{},{vport}",
        mac_of(&vns, "eth0"),
        tb.worker_addr(victim)
    );
    let switch_ip = tb.switch_addr();

    // 1. Through the switch: a host on another port sends RESULTs from the
    // switch's own address and port (with its own MAC, then the switch's)
    // for the chunks around the floor, racing those in flight.
    let up = |s: &serde_json::Value| s["uptime_secs"].as_f64().unwrap();
    let s1 = sw.stats();
    sw.wait_stats(5, "a newer stats snapshot", |s| up(s) >= up(&s1) + 1.0);
    let before = sw.stats();
    let gen = before["generation"].as_u64().unwrap() as u32;
    let floor = floor_of(&before);
    let file = lines_file(
        "fr1",
        "through.hex",
        &forged_results(victim, gen, floor..floor + 512),
    );
    let host_mac = mac_of(&tb.host_ns(0), "eth0");
    let switch_mac = mac_of(&tb.switch_ns(), "br0");
    let mut sent_through = 0u64;
    for mac in [&host_mac, &switch_mac] {
        let src = format!("{mac},{switch_ip},{AGG_PORT}");
        let n: u64 = attack_port_py(
            &tb,
            &tb.host_ns(0),
            &["flood", "eth0", &src, &dest, file.to_str().unwrap(), "1.5"],
        )
        .trim()
        .parse()
        .unwrap();
        sent_through += n;
    }
    std::thread::sleep(Duration::from_millis(1200));
    let after_through = sw.stats();
    let forged = |s: &serde_json::Value| port_sum(s, "sw-h", "xdp_own_address_forged");
    let dropped = forged(&after_through) - forged(&before);
    eprintln!("{sent_through} RESULTs forged from the switch's address through it: {dropped} dropped at ingress");
    assert!(
        sent_through > 512 && dropped > 0 && dropped <= sent_through,
        "own_address_forged rose by {dropped} for {sent_through} forged RESULTs: {after_through}"
    );
    let shown = text(&sw.switchctl(&["stats"]));
    assert!(
        shown.contains("own_address_forged"),
        "switchctl stats: {shown}"
    );

    // 2. Not through the switch: the victim's DATA is held back at its own
    // interface (the gate), so the job's floor stops at its oldest chunk;
    // RESULTs forged from the switch's address for every chunk it has in
    // flight reach its socket directly (from its own namespace, as a host
    // on its segment could). Without the token it would take them and move
    // on while the other ranks wait for its DATA forever.
    let port = AGG_PORT.to_string();
    impair(&vns, &["--loss", "100", "--udp-port", &port]);
    std::thread::sleep(Duration::from_millis(300));
    let s_gate = sw.stats();
    sw.wait_stats(5, "a snapshot after the gate", |s| {
        up(s) >= up(&s_gate) + 1.0
    });
    let held = floor_of(&sw.stats());
    let file = lines_file(
        "fr1",
        "direct.hex",
        &forged_results(victim, gen, held..held + 300),
    );
    let src = format!("{switch_mac},{switch_ip},{AGG_PORT}");
    let sent_direct: u64 = attack_port_py(
        &tb,
        &vns,
        &["local", &src, &dest, file.to_str().unwrap(), "1.5"],
    )
    .trim()
    .parse()
    .unwrap();
    impair(&vns, &["--clear"]);
    assert!(sent_direct >= 300, "{sent_direct} sent");

    let reports = expect_verified(workers);
    let refused = reports[victim as usize]["stats"]["bad_tag_results"]
        .as_u64()
        .unwrap();
    eprintln!(
        "{sent_direct} RESULTs forged for seqs {held}..+300 straight to the victim: \
         {refused} refused for their token; every rank verified"
    );
    assert!(
        refused > 0 && refused <= sent_direct,
        "bad_tag_results {refused} for {sent_direct} forged: {}",
        reports[victim as usize]
    );
    for (r, rep) in reports.iter().enumerate() {
        if r != victim as usize {
            assert_eq!(rep["stats"]["bad_tag_results"], 0, "rank {r}: {rep}");
        }
    }
    stop_clean(&tb, &mut sw);
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
#[ignore = "needs root"]
fn a_member_resending_a_finished_chunk_keeps_no_class_busy() {
    if !can_run("resent_priority") {
        return;
    }
    let tb = Testbed::up("fr2", 2, 1);
    let host = format!("{}/32", tb.host_addr(0));
    let config = SwitchConfig::for_testbed(&tb)
        .set("agg_port", i64::from(AGG_PORT))
        .job(Job::new(1, 2, &tb.worker_sources()))
        .job(Job::new(3, 1, &[host]).set("priority", "high"));
    let mut sw = Switchd::start_in(&tb.switch_ns(), "fr2", &config);
    // The high job's one member joins, completes chunk 0, then resends it
    // 400 times a second while the normal job runs.
    let mut member = tb
        .cmd_in(&tb.host_ns(0), "python3")
        .arg(repo_root().join("tests/attack_member.py"))
        .args([
            "resend",
            &tb.switch_addr().to_string(),
            &AGG_PORT.to_string(),
        ])
        .args(["3", "0", "1", SECRET, "400", "12"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tests/attack_member.py");
    let mut lines = BufReader::new(member.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(ready, "ready", "the member did not join: {}", sw.log_text());
    // Past the 5 ms for which its real chunk made its class busy.
    std::thread::sleep(Duration::from_millis(50));
    let normal: Vec<Child> = (0..2)
        .map(|r| spawn_allreduce_with(&tb, &tb.worker_ns(r), 1, r, 2, 2_000_000, 20, 30))
        .collect();
    expect_verified(normal);
    let mid = sw.stats();
    let report = lines.last().and_then(Result::ok).unwrap_or_default();
    let _ = member.wait();
    let v: serde_json::Value =
        serde_json::from_str(&report).unwrap_or_else(|e| panic!("{e}: {report:?}"));
    let (resent, answered) = (
        v["resent"].as_u64().unwrap(),
        v["answered"].as_u64().unwrap(),
    );
    let stats = stop_clean(&tb, &mut sw);
    let served = job(&stats, 3)["retransmits_served"].as_u64().unwrap();
    let marked = job(&mid, 1)["priority_marked"].as_u64().unwrap();
    eprintln!(
        "the high member resent chunk 0 {resent} times ({answered} answered from the shadow, \
         {served} served); the normal job's RESULTs marked for priority: {marked}"
    );
    assert!(
        resent >= 2000 && answered * 10 >= resent * 9 && served >= answered,
        "the attack did not run as meant: resent {resent}, answered {answered}, served {served}"
    );
    assert_eq!(
        marked,
        0,
        "the normal job yielded to resends: {}",
        job(&mid, 1)
    );
    assert_eq!(job(&stats, 1)["priority_marked"], 0, "{stats}");
}

#[test]
#[ignore = "needs root"]
fn version_2_hellos_are_answered_within_the_hello_budget() {
    if !can_run("v2_hello_budget") {
        return;
    }
    let tb = Testbed::up("fr3", 4, 1);
    // The job takes the whole subnet, so the host is inside its prefixes
    // (a refusal is only ever sent there).
    let mut spec = JobSpec::new(1, 4);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, TENSOR as usize, 20))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    // A version-2 HELLO: 22-byte header (version 2, type 8), 40 bytes.
    let mut hello = vec![0u8; 62];
    hello[0] = 0x28;
    hello[3] = 1;
    hello[HEADER_LEN..HEADER_LEN + 16].copy_from_slice(&[0x5a; 16]);
    let src = format!(
        "{},{},40999",
        mac_of(&tb.host_ns(0), "eth0"),
        tb.host_addr(0)
    );
    let dest = format!(
        "{},{},{AGG_PORT}",
        mac_of(&tb.switch_ns(), "br0"),
        tb.switch_addr()
    );
    let limited_before = sw.stats()["hello_rate_limited"].as_u64().unwrap_or(0);
    let flood = 3000u64;
    let started = std::time::Instant::now();
    let line = attack_port_py(
        &tb,
        &tb.host_ns(0),
        &[
            "probe",
            "eth0",
            &src,
            &dest,
            &hex(&hello),
            &flood.to_string(),
            "0.5",
        ],
    );
    let secs = started.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let answered = v["replies"].as_array().unwrap().len() as u64;
    std::thread::sleep(Duration::from_millis(1200));
    let limited = sw.stats()["hello_rate_limited"].as_u64().unwrap_or(0) - limited_before;
    // The HELLO budget per address and port: bursts of 256, 256 a second.
    let budget = 256 + (256.0 * secs).ceil() as u64;
    eprintln!(
        "{flood} version-2 HELLOs in {secs:.2} s: {answered} refusals came back (budget {budget}), \
         {limited} rate-limited"
    );
    assert!(answered > 0, "the refusal itself was never sent");
    assert!(
        answered <= budget && limited > 0 && answered + limited <= flood,
        "{answered} answered and {limited} limited for {flood} HELLOs in {secs:.2} s"
    );
    expect_verified(workers);
    stop_clean(&tb, &mut sw);
}
