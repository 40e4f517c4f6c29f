//! End-to-end tests of issue 20, findings 1 and 5: a host on another port of
//! the switch forges a member's MAC, IP and UDP port. Its DATA is never
//! summed (every rank still verifies) and is counted as `wrong_port`; its
//! probing HEARTBEATs get the same answers whether the address it claims is
//! a member's or a stranger's, and NACKs to it are rate-limited.
//! The frames come from tests/attack_port.py in the host's namespace.

use std::process::Child;
use std::time::Duration;

use agg_e2e::*;
use proto::wire::{self, HeaderRepr, MsgType, NackPayload, NackReason, HEADER_LEN};

/// Worker `rank`'s "MAC,IP,UDP port", as a host that saw its traffic
/// would know it: its interface's MAC, its address, and the local port of
/// its UDP socket to the switch.
fn worker_source(tb: &Testbed, rank: u16) -> String {
    let ns = tb.worker_ns(rank);
    let port = worker_port(tb, &ns);
    format!("{},{},{port}", mac_of(&ns, "eth0"), tb.worker_addr(rank))
}

fn switch_dest(tb: &Testbed) -> String {
    format!(
        "{},{},{AGG_PORT}",
        mac_of(&tb.switch_ns(), "br0"),
        tb.switch_addr()
    )
}

/// A source no one on the testbed has: deliberately not the testbed's (no
/// namespace answers for it), inside its subnet (the job's prefixes).
const STRANGER: &str = "02:00:00:00:00:32,198.18.0.50,40050";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn message(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    h.emit_to(&mut b).unwrap();
    b[HEADER_LEN..].copy_from_slice(payload);
    b
}

fn drop_count(stats: &serde_json::Value, reason: &str) -> u64 {
    job(stats, 1)["drops"][reason].as_u64().unwrap_or(0)
}

/// Elements per chunk of a job on 1500-byte ports (switchd's default,
/// (MTU − 50) / 4 less the RESULT's 16-byte token, docs/PROTOCOL.md
/// "Limits"), and the tensor the workers sum: the forged DATA carries the
/// chunk's real collective and count, so only the binding stops it.
const ELEMS: u32 = 358;
const TENSOR: u32 = 4_000_000;

#[test]
#[ignore = "needs root"]
fn port_spoofed_data_is_never_summed() {
    if !can_run("port_spoofed_data") {
        return;
    }
    let tb = Testbed::up("sc1", 4, 1);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 4)]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, TENSOR as usize, 40))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    // Where the sums are and how fast they go, as an attacker would learn
    // it from the traffic: aim at the chunks the floor reaches 1 to 2 s
    // from now (the stats file is written every second) and keep sending
    // them for 3 s, while it passes there.
    let floor_of = |s: &serde_json::Value| job(s, 1)["floor_seq"].as_u64().unwrap();
    let up = |s: &serde_json::Value| s["uptime_secs"].as_f64().unwrap();
    let s1 = sw.stats();
    sw.wait_stats(5, "a newer stats snapshot", |s| up(s) >= up(&s1) + 1.0);
    let before = sw.stats();
    let rate = (floor_of(&before) - floor_of(&s1)) as f64 / (up(&before) - up(&s1));
    let gen = before["generation"].as_u64().unwrap() as u32;
    let target = floor_of(&before) as u32 + (rate * 2.0) as u32;
    let per_collective = TENSOR.div_ceil(ELEMS);
    let values = 1e9f32.to_le_bytes().repeat(ELEMS as usize);
    let lines: Vec<String> = (target..target + 256)
        .map(|seq| {
            let mut h = HeaderRepr::new(MsgType::Data, 1);
            h.rank = 1;
            h.gen = gen;
            h.seq = seq;
            h.collective = seq / per_collective;
            let offset = (seq % per_collective) * ELEMS;
            h.count = ELEMS.min(TENSOR - offset) as u16;
            if offset + ELEMS >= TENSOR {
                h.flags |= wire::flags::LAST;
            }
            hex(&message(&h, &values[..h.count as usize * 4]))
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("agg-e2e-sc1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data.hex");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let victim = worker_source(&tb, 1);
    let sent: u64 = attack_port_py(
        &tb,
        &tb.host_ns(0),
        &[
            "flood",
            "eth0",
            &victim,
            &switch_dest(&tb),
            file.to_str().unwrap(),
            "3",
        ],
    )
    .trim()
    .parse()
    .unwrap();
    assert!(sent > 256, "{sent} sent");
    expect_verified(workers);
    std::thread::sleep(Duration::from_millis(1200));
    let shown = text(&sw.switchctl(&["stats", "1"]));
    let after = stop_clean(&tb, &mut sw);
    let rose = drop_count(&after, "wrong_port") - drop_count(&before, "wrong_port");
    eprintln!(
        "spoofed DATA for seqs {target}..+256 (floor at {}, {rate:.0} chunks/s): {sent} sent, wrong_port rose by {rose}",
        floor_of(&before)
    );
    assert!(
        rose > 0 && rose <= sent,
        "wrong_port rose by {rose} for {sent} spoofed DATA: {after}"
    );
    assert!(
        shown.contains(&format!("wrong_port={}", drop_count(&after, "wrong_port"))),
        "switchctl stats shows wrong_port: {shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root"]
fn probing_heartbeats_tell_members_from_strangers_nothing() {
    if !can_run("probing_heartbeats") {
        return;
    }
    let tb = Testbed::up("sc2", 4, 1);
    // The job takes the whole subnet, so the stranger is inside its
    // prefixes and only membership tells it from a member.
    let mut spec = JobSpec::new(1, 4);
    spec.allowed = Some(vec![tb.subnet()]);
    let mut sw = Switchd::start(&tb, &[spec]);
    let workers: Vec<Child> = (0..4)
        .map(|r| spawn_allreduce(&tb, 1, r, 4, 4_000_000, 60))
        .collect();
    sw.wait_stats(30, "job active", |s| s["jobs"][0]["state"] == "active");
    let gen = sw.stats()["generation"].as_u64().unwrap() as u32;
    let member = worker_source(&tb, 1);
    // Inside the job's prefixes, no member, no address on the testbed.
    let stranger = STRANGER.to_owned();
    let stranger_ip: std::net::Ipv4Addr = STRANGER.split(',').nth(1).unwrap().parse().unwrap();
    assert!(
        tb.subnet().contains(&stranger_ip) && !tb.addresses().contains(&stranger_ip),
        "{stranger_ip} must be inside {} and no testbed address",
        tb.subnet()
    );
    let dest = switch_dest(&tb);
    let probe = |src: &str, gen: u32, count: u32| -> Vec<Vec<u8>> {
        let mut h = HeaderRepr::new(MsgType::Heartbeat, 1);
        h.rank = 1;
        h.gen = gen;
        let line = attack_port_py(
            &tb,
            &tb.host_ns(0),
            &[
                "probe",
                "eth0",
                src,
                &dest,
                &hex(&message(&h, &[])),
                &count.to_string(),
                "0.5",
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["replies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| unhex(r.as_str().unwrap()))
            .collect()
    };
    // The current generation: nothing, for the member's address (from
    // another port) as for a stranger's.
    for src in [&member, &stranger] {
        let got = probe(src, gen, 5);
        assert!(got.is_empty(), "{src} at gen {gen} was answered: {got:?}");
    }
    // A wrong generation: the same NACK 7, byte for byte, to both.
    let wrong = gen.wrapping_add(1).max(1);
    let to_member = probe(&member, wrong, 5);
    let to_stranger = probe(&stranger, wrong, 5);
    assert_eq!(to_member.len(), 5, "{to_member:?}");
    assert_eq!(to_member, to_stranger);
    let h = wire::Header::new_checked(&to_member[0][..]).unwrap();
    let hdr = HeaderRepr::parse(&h).unwrap();
    assert_eq!(hdr.msg_type, MsgType::Nack);
    let nack = NackPayload::parse(h.payload()).unwrap();
    assert_eq!(nack.reason, NackReason::StaleGeneration);

    // A flood of them: NACKs to one address are rate-limited, and counted.
    let limited_before = sw.stats()["nack_rate_limited"].as_u64().unwrap_or(0);
    let flood = 1000;
    let answered = probe(&stranger, wrong, flood).len() as u64;
    std::thread::sleep(Duration::from_millis(1200));
    let limited = sw.stats()["nack_rate_limited"].as_u64().unwrap_or(0) - limited_before;
    eprintln!("{flood} probing HEARTBEATs: {answered} NACKs came back, {limited} rate-limited");
    assert!(
        answered < 400 && limited > 0 && answered + limited <= flood as u64,
        "{answered} NACKs sent and {limited} limited for {flood} HEARTBEATs"
    );
    expect_verified(workers);
    stop_clean(&tb, &mut sw);
}
