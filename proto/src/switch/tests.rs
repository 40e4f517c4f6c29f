use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;
use crate::handshake::{Handshake, JoinParams, ProbeAnswer};
use crate::reference::rank_order_sum;
use crate::wire::{write_f32s, HeaderRepr, MsgType, NackPayload, NackReason};

const SECRET: [u8; 32] = [7; 32];
const GEN: u32 = 0x1234_5678;

/// The tests' clock: one fixed start; later instants are offsets from it.
fn t0() -> Instant {
    static T0: OnceLock<Instant> = OnceLock::new();
    *T0.get_or_init(Instant::now)
}

fn table() -> JobTable {
    JobTable::new(TableConfig::new(GEN, [0x42; 32]), t0())
}

fn config(n: u16, slots: u16, elems: u16) -> JobConfig {
    JobConfig {
        id: 5,
        n_workers: n,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 24,
        }],
        secret: SECRET,
        pool_slots: slots,
        elems_per_chunk: elems,
        dtype: Default::default(),
        window: slots,
        priority: Default::default(),
        auth: Default::default(),
        upstream: None,
        stats: false,
    }
}

fn endpoint(rank: u16) -> Endpoint {
    Endpoint {
        source: Source {
            mac: [2, 0, 0, 0, (rank >> 8) as u8, rank as u8],
            ip: [198, 18, 0, (10 + rank) as u8],
            port: 40000 + rank,
        },
        ..Endpoint::default()
    }
}

/// A message as bytes: `h` (count fixed up for DATA) then `payload`.
fn frame(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    h.emit_to(&mut b).unwrap();
    b[HEADER_LEN..].copy_from_slice(payload);
    b
}

/// Every reply queued so far, encoded: (reply, header bytes as sent,
/// parsed header, payload).
fn drain_encoded(t: &mut JobTable) -> Vec<(Reply, [u8; HEADER_LEN], HeaderRepr, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(r) = t.poll_reply() {
        let mut buf = [0u8; 2048];
        let Some(e) = t.encode(&r, &mut buf) else {
            continue;
        };
        let h = crate::wire::Header::new_checked(&buf[..e.len]).unwrap();
        let hdr = HeaderRepr::parse(&h).unwrap();
        let head = *buf.first_chunk::<HEADER_LEN>().unwrap();
        let mut end = e.len;
        if hdr.msg_type == MsgType::Result {
            end -= checked_token(t, &hdr, &buf[..e.len]);
        }
        out.push((r, head, hdr, buf[HEADER_LEN..end].to_vec()));
    }
    out
}

/// Checks the token that ends an `auth = "port"` RESULT `frame` (under the
/// key a member of the job's activation derives) and returns its length,
/// for the caller to strip; 0 in a mac job, whose tests check its tags.
fn checked_token(t: &JobTable, hdr: &HeaderRepr, frame: &[u8]) -> usize {
    let job = t.get(hdr.job).expect("a RESULT of a declared job");
    if job.auth() == crate::tag::AuthMode::Mac {
        return 0;
    }
    let key = crate::tag::PacketKey::result(&job.config.secret, hdr.job, t.gen(), &job.epoch());
    let token = &frame[frame.len() - crate::tag::TAG_LEN..];
    assert!(key.verify_token(hdr, token), "the RESULT's token: {hdr:?}");
    crate::tag::TAG_LEN
}

/// Every reply queued so far, encoded: (reply, header, payload).
fn drain(t: &mut JobTable) -> Vec<(Reply, HeaderRepr, Vec<u8>)> {
    drain_encoded(t)
        .into_iter()
        .map(|(r, _, hdr, payload)| (r, hdr, payload))
        .collect()
}

fn handshake(t: &JobTable, rank: u16, from: Endpoint, secret: [u8; 32]) -> Handshake {
    let params = JoinParams {
        job: 5,
        rank,
        n_workers: t.get(5).map_or(1, |j| j.n_workers()),
        dtype: t.get(5).map_or(0, |j| j.config.dtype as u8),
        op: 0,
        secret,
        ip: from.source.ip,
        port: from.source.port,
        provision: None,
    };
    Handshake::new(params, [(rank as u8).wrapping_add(1); 16])
}

/// HELLO, and the CHALLENGE taken by `hs`; returns the HELLO's verdict.
fn hello(t: &mut JobTable, hs: &mut Handshake, from: Endpoint, now: Instant) -> Verdict {
    drain(t);
    let mut b = [0u8; 128];
    let n = hs.emit_hello(&mut b).unwrap();
    let v = t.handle(&b[..n], from, false, now);
    for (_, hdr, payload) in drain(t) {
        if hdr.msg_type == MsgType::Challenge {
            hs.on_challenge(&hdr, &payload).unwrap();
        }
    }
    v
}

fn join_bytes(hs: &Handshake, resume: (u32, u32)) -> Vec<u8> {
    let mut b = [0u8; 128];
    let n = hs.emit_join(resume.0, resume.1, &mut b).unwrap();
    b[..n].to_vec()
}

/// A whole handshake of rank `rank` from its endpoint at `now`, the JOIN's
/// replies left queued; returns the rank's handshake.
fn joined(t: &mut JobTable, rank: u16, now: Instant) -> Handshake {
    let mut hs = handshake(t, rank, endpoint(rank), SECRET);
    hello(t, &mut hs, endpoint(rank), now);
    t.handle(&join_bytes(&hs, (0, 0)), endpoint(rank), false, now);
    hs
}

/// A whole handshake at `now`; returns the JOIN's verdict and the JOIN.
fn join_full(
    t: &mut JobTable,
    rank: u16,
    from: Endpoint,
    secret: [u8; 32],
    resume: (u32, u32),
    now: Instant,
) -> (Verdict, Vec<u8>) {
    let mut hs = handshake(t, rank, from, secret);
    hello(t, &mut hs, from, now);
    let j = join_bytes(&hs, resume);
    (t.handle(&j, from, false, now), j)
}

fn join(t: &mut JobTable, rank: u16, from: Endpoint, secret: [u8; 32]) -> Verdict {
    join_full(t, rank, from, secret, (0, 0), t0()).0
}

fn active_table(n: u16, slots: u16, elems: u16) -> JobTable {
    active_table_of(config(n, slots, elems))
}

/// A table with job `cfg` declared and every rank joined.
fn active_table_of(cfg: JobConfig) -> JobTable {
    let n = cfg.n_workers;
    let mut t = table();
    t.add(cfg, 1000).unwrap();
    for r in 0..n {
        let v = join(&mut t, r, endpoint(r), SECRET);
        let want = if r + 1 == n {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(v, Verdict::Join(want));
    }
    drain(&mut t);
    t
}

fn data(t: &mut JobTable, rank: u16, seq: u32, vals: &[f32]) -> Verdict {
    data_from(t, rank, seq, vals, endpoint(rank), GEN)
}

fn data_from(
    t: &mut JobTable,
    rank: u16,
    seq: u32,
    vals: &[f32],
    from: Endpoint,
    gen: u32,
) -> Verdict {
    let (h, p) = data_message(rank, seq, vals, gen);
    t.handle(&frame(&h, &p), from, false, t0())
}

/// Job 5's DATA of `rank` for `seq` in generation `gen`: its header and
/// float32 payload.
fn data_message(rank: u16, seq: u32, vals: &[f32], gen: u32) -> (HeaderRepr, Vec<u8>) {
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.rank = rank;
    h.seq = seq;
    h.count = vals.len() as u16;
    h.gen = gen;
    let mut p = vec![0u8; vals.len() * 4];
    write_f32s(vals, &mut p);
    (h, p)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn nacks_in(replies: &[(Reply, HeaderRepr, Vec<u8>)]) -> Vec<NackPayload> {
    replies
        .iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::Nack)
        .map(|(_, _, p)| NackPayload::parse(p).unwrap())
        .collect()
}

#[test]
fn join_refusals_name_their_reason_and_change_nothing() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    // A stranger's HELLO gets NACK 3, never a CHALLENGE.
    let mut stranger = endpoint(0);
    stranger.source.ip = [10, 9, 9, 9];
    let mut hs = handshake(&t, 0, stranger, SECRET);
    assert_eq!(
        hello(&mut t, &mut hs, stranger, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::SourceNotAllowed))
    );
    assert!(!hs.challenged());
    // Wrong secret: the MAC does not verify; the NACK echoes the JOIN's nonce.
    let (v, _) = join_full(&mut t, 0, endpoint(0), [1; 32], (0, 0), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret)));
    let nacks = nacks_in(&drain(&mut t));
    assert_eq!(nacks.len(), 1);
    assert_eq!(nacks[0].reason, NackReason::BadSecret);
    assert_ne!(nacks[0].echo, [0; 16]);
    // Rank out of range: refused at the HELLO already.
    let mut hs = handshake(&t, 2, endpoint(2), SECRET);
    assert_eq!(
        hello(&mut t, &mut hs, endpoint(2), t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::RankOutOfRange))
    );
    // Unknown job.
    let mut h = HeaderRepr::new(MsgType::Hello, 9);
    h.rank = 0;
    assert_eq!(
        t.handle(&frame(&h, &[3; 40]), endpoint(0), false, t0()),
        Verdict::NackUnknownJob
    );
    let nacks = nacks_in(&drain(&mut t));
    assert_eq!(
        nacks[nacks.len() - 1].echo,
        [3; 16],
        "echoes the HELLO nonce"
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.joined_ranks(), 0);
    assert_eq!(job.counters().nacks, 3);
    assert_eq!(job.counters().join_bad_mac, 1);
}

#[test]
fn parameters_must_match() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    let mut params = hs.params().clone();
    params.n_workers = 3;
    hs = Handshake::new(params, [1; 16]);
    hello(&mut t, &mut hs, endpoint(0), t0());
    assert_eq!(
        t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::ParametersDiffer))
    );
}

#[test]
fn forged_mac_stale_nonce_and_foreign_nonce_are_refused() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(&mut t, &mut hs, endpoint(0), t0());
    // One flipped MAC bit.
    let mut j = join_bytes(&hs, (0, 0));
    let last = j.len() - 1;
    j[last] ^= 1;
    assert_eq!(
        t.handle(&j, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret))
    );
    // A changed resume point under the same MAC.
    let mut j = join_bytes(&hs, (0, 0));
    j[11] = 9;
    assert_eq!(
        t.handle(&j, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret))
    );
    // The right JOIN from another address: the nonce was issued to rank 0's.
    let mut elsewhere = endpoint(0);
    elsewhere.source.ip = [198, 18, 0, 99];
    assert_eq!(
        t.handle(&join_bytes(&hs, (0, 0)), elsewhere, false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::StaleNonce))
    );
    // The right JOIN, after the nonce lifetime.
    let late = t0() + DEFAULT_NONCE_LIFETIME + Duration::from_secs(1);
    assert_eq!(
        t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, late),
        Verdict::Join(JoinOutcome::Nack(NackReason::StaleNonce))
    );
    // A JOIN made under another switch's nonce key.
    let mut other = JobTable::new(TableConfig::new(GEN, [0x43; 32]), t0());
    other.add(config(2, 4, 8), 1000).unwrap();
    let mut hs2 = handshake(&other, 0, endpoint(0), SECRET);
    hello(&mut other, &mut hs2, endpoint(0), t0());
    assert_eq!(
        t.handle(&join_bytes(&hs2, (0, 0)), endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::StaleNonce))
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.joined_ranks(), 0, "nothing was recorded");
    assert_eq!(job.counters().join_bad_mac, 2);
    assert_eq!(job.counters().join_bad_nonce, 2);
    assert_eq!(job.counters().join_stale_nonce, 1);
    // The legitimate JOIN still works afterwards.
    assert_eq!(
        t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Waiting)
    );
}

#[test]
fn replayed_joins_change_no_state_and_are_counted() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    // Rank 0 joins twice (a first nonce, then a fresh one): both captured.
    let (_, old) = join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), t0());
    let (v, cur) = join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    join(&mut t, 1, endpoint(1), SECRET);
    drain(&mut t);
    data(&mut t, 0, 0, &[1.0]);
    // Replays from rank 0's address, while the job is active.
    for _ in 0..20 {
        assert_eq!(
            t.handle(&old, endpoint(0), false, t0()),
            Verdict::Join(JoinOutcome::Replayed)
        );
        assert_eq!(
            t.handle(&cur, endpoint(0), false, t0()),
            Verdict::Join(JoinOutcome::AckAgain)
        );
    }
    let replies = drain(&mut t);
    assert!(
        replies
            .iter()
            .all(|(r, h, _)| h.msg_type == MsgType::JoinAck && r.to == endpoint(0)),
        "a copy of the accepted JOIN gets only its JOIN_ACK, at the member's address"
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.state(), JobState::Active);
    assert_eq!(job.counters().join_replays, 20);
    assert_eq!(job.counters().join_repeats, 20);
    assert_eq!(job.counters().resets, 0);
    // The slot kept rank 0's contribution: the sum completes.
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Completed { seq: 0 })
    );
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[3.0]);
    // Even after the job went back to joining, the older nonce stays a replay.
    let (v, _) = join_full(&mut t, 1, endpoint(1), SECRET, (0, 9), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    assert_eq!(
        t.handle(&old, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Replayed)
    );
}

#[test]
fn a_job_declared_after_a_nonce_was_issued_refuses_it() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    let (_, j) = join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), t0());
    t.remove(5);
    t.add(config(1, 4, 8), 1000).unwrap();
    assert_eq!(
        t.handle(&j, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Replayed)
    );
}

#[test]
fn version_1_join_gets_a_version_1_refusal() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    // A version-1 JOIN: ver_type 0x13, job 5, rank 0, then 36 payload bytes.
    let mut v1 = vec![0u8; HEADER_LEN + 36];
    v1[0] = 0x13;
    v1[3] = 5;
    assert_eq!(
        t.handle(&v1, endpoint(0), false, t0()),
        Verdict::Malformed(crate::wire::WireError::BadVersion(1))
    );
    let r = t.poll_reply().unwrap();
    let mut buf = [0u8; 64];
    let e = t.encode(&r, &mut buf).unwrap();
    assert_eq!(
        &buf[..e.len],
        &[0x16, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8][..e.len]
    );
    assert_eq!(e.len, HEADER_LEN + 2);
    assert_eq!(t.counters.version_refused, 1);
    assert_eq!(t.malformed[1], 1);
    let k = Refusal::Version(1).index();
    assert_eq!(t.refusals()[k], 1);
    assert_eq!(t.last_refusal(k).map(|r| r.why), Some(Refusal::Version(1)));
    assert!(t.poll_event().is_none(), "refusals are counted, not queued");
    // A version-1 DATA is only counted.
    v1[0] = 0x11;
    t.handle(&v1, endpoint(0), false, t0());
    assert!(t.poll_reply().is_none());
    assert_eq!(t.malformed[1], 2);
}

/// A version-2 worker's HELLO from the job's prefixes gets a version-2
/// NACK 8 echoing its nonce (the worker reports "malformed message" at
/// once, and the switch's refusal sample says to upgrade it); from outside
/// the prefixes, nothing.
#[test]
fn version_2_hello_gets_a_version_2_refusal_it_takes_as_its_own() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    let mut hello = vec![0u8; HEADER_LEN + 40];
    hello[0] = 0x28;
    hello[3] = 5;
    hello[HEADER_LEN..HEADER_LEN + 16].copy_from_slice(&[0x77; 16]);
    assert_eq!(
        t.handle(&hello, endpoint(0), false, t0()),
        Verdict::Malformed(crate::wire::WireError::BadVersion(2))
    );
    let r = t.poll_reply().unwrap();
    let mut buf = [0u8; 64];
    let e = t.encode(&r, &mut buf).unwrap();
    assert_eq!(e.len, 42);
    assert_eq!(&buf[..6], &[0x26, 0, 0, 5, 0, 0]);
    assert_eq!(&buf[22..26], &[0, 8, 0, 0]);
    assert_eq!(&buf[26..42], &[0x77; 16]);
    assert_eq!(t.counters.version_refused, 1);
    let k = Refusal::Version(2).index();
    assert_eq!(t.last_refusal(k).map(|r| r.why), Some(Refusal::Version(2)));
    assert!(Refusal::Version(2)
        .to_string()
        .contains("protocol version 2: this switch speaks version 4"));
    let mut stranger = endpoint(0);
    stranger.source.ip = [10, 9, 9, 9];
    t.handle(&hello, stranger, false, t0());
    assert!(t.poll_reply().is_none(), "nothing outside the prefixes");

    // A version-3 worker's HELLO: a version-3 NACK 8 (58 bytes) echoing it.
    hello[0] = 0x38;
    assert_eq!(
        t.handle(&hello, endpoint(0), false, t0()),
        Verdict::Malformed(crate::wire::WireError::BadVersion(3))
    );
    let r = t.poll_reply().unwrap();
    let e = t.encode(&r, &mut buf).unwrap();
    assert_eq!(e.len, 58);
    assert_eq!(&buf[..6], &[0x36, 0, 0, 5, 0, 0]);
    assert_eq!(&buf[22..26], &[0, 8, 0, 0]);
    assert_eq!(&buf[26..42], &[0x77; 16]);
    assert_eq!(t.counters.version_refused, 2);
    let k = Refusal::Version(3).index();
    assert_eq!(t.last_refusal(k).map(|r| r.why), Some(Refusal::Version(3)));
}

/// Every refusal is rate-limited: 3000 version-2 HELLOs from one address
/// on one switch port within a millisecond get at most the HELLO burst of
/// answers (256); the rest are counted `hello_rate_limited`, and so are
/// those of version 1 on the NACK budget (a burst of 128).
#[test]
fn version_1_and_2_refusals_are_rate_limited_per_source() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    let mut hello = vec![0u8; HEADER_LEN + 40];
    hello[0] = 0x28;
    hello[3] = 5;
    let mut answered = 0;
    for i in 0..3000u32 {
        hello[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&i.to_be_bytes());
        let at = t0() + Duration::from_nanos(u64::from(i) * 300);
        t.handle(&hello, endpoint(0), false, at);
        while t.poll_reply().is_some() {
            answered += 1;
        }
    }
    assert_eq!(answered, 256, "the HELLO burst, no more");
    assert_eq!(t.counters.hello_rate_limited, 3000 - 256);
    assert_eq!(t.counters.version_refused, 3000, "every one counted");
    // Another source has its own budget.
    let mut other = endpoint(0);
    other.source.ip = [198, 18, 0, 99];
    t.handle(&hello, other, false, t0() + Duration::from_millis(1));
    assert!(t.poll_reply().is_some());
    // Version 1: on the NACK budget.
    let mut v1 = vec![0u8; HEADER_LEN + 36];
    v1[0] = 0x13;
    v1[3] = 5;
    let mut v1_answered = 0;
    for i in 0..3000u64 {
        t.handle(
            &v1,
            endpoint(1),
            false,
            t0() + Duration::from_nanos(i * 300),
        );
        while t.poll_reply().is_some() {
            v1_answered += 1;
        }
    }
    assert_eq!(v1_answered, 128, "the NACK burst, no more");
}

#[test]
fn leave_needs_the_mac_of_the_accepted_join() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(&mut t, &mut hs, endpoint(0), t0());
    t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0());
    let mut b = [0u8; 64];
    let n = hs.emit_leave(&mut b).unwrap();
    let mut forged = b[..n].to_vec();
    forged[n - 1] ^= 1;
    assert_eq!(
        t.handle(&forged, endpoint(0), false, t0()),
        Verdict::Dropped(Some(DropReason::Unauthenticated))
    );
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);
    assert_eq!(t.handle(&b[..n], endpoint(0), false, t0()), Verdict::Noted);
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
}

#[test]
fn a_leave_for_the_host_path_is_counted_and_otherwise_a_leave() {
    // config(n, ...) makes job 5; one rank joins, leaves "for the hosts"
    // (LEAVE count 1): counted once, and the job goes back to joining as
    // on any LEAVE. A plain LEAVE (count 0) is not counted.
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    for (round, (for_hosts, counted)) in [(true, 1), (false, 1)].into_iter().enumerate() {
        let mut hs = handshake(&t, 0, endpoint(0), SECRET);
        let at = t0() + Duration::from_secs(round as u64);
        hello(&mut t, &mut hs, endpoint(0), at);
        t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, at);
        assert_eq!(t.get(5).unwrap().state(), JobState::Active);
        let mut b = [0u8; 64];
        let n = if for_hosts {
            hs.emit_leave_because(crate::wire::LEAVE_FOR_HOSTS, &mut b)
        } else {
            hs.emit_leave(&mut b)
        }
        .unwrap();
        assert_eq!(t.handle(&b[..n], endpoint(0), false, at), Verdict::Noted);
        assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
        assert_eq!(t.get(5).unwrap().counters().members_left_for_hosts, counted);
    }
}

#[test]
fn memory_budget_refuses_with_numbers_and_frees_on_remove() {
    let mut cfg = TableConfig::new(GEN, [1; 32]);
    cfg.pool_budget = 64 << 20;
    let mut t = JobTable::new(cfg, t0());
    let mut huge = config(65535, 32768, 362);
    huge.id = 9;
    let err = t.add(huge, 1000).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, JobConfigError::OverBudget { id: 9, .. }),
        "{msg}"
    );
    assert!(msg.contains("64.0 MiB") && msg.contains("TiB"), "{msg}");
    let small = config(4, 64, 362);
    let need = small.pool_bytes();
    t.add(small, 1000).unwrap();
    assert_eq!(t.pool_memory(), (64 << 20, need));
    t.remove(5);
    assert_eq!(t.pool_memory().1, 0);
    let mut bad = config(4, 65535, 362);
    bad.window = 1;
    assert!(matches!(
        t.add(bad, 1000),
        Err(JobConfigError::PoolSlots(5, 65535))
    ));
}

#[test]
fn data_before_activation_is_nacked_6_and_wrong_gen_7() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    join(&mut t, 0, endpoint(0), SECRET);
    assert_eq!(
        data(&mut t, 0, 0, &[1.0]),
        Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive))
    );
    join(&mut t, 1, endpoint(1), SECRET);
    assert_eq!(
        data_from(&mut t, 0, 0, &[1.0], endpoint(0), GEN + 1),
        Verdict::Data(DataOutcome::Nack(NackReason::StaleGeneration))
    );
}

#[test]
fn a_completed_chunk_is_sent_to_every_member_once() {
    let mut t = active_table(3, 4, 8);
    data(&mut t, 2, 0, &[1.0, 2.0]);
    data(&mut t, 0, 0, &[1.0, 2.0]);
    assert!(drain(&mut t).is_empty());
    data(&mut t, 1, 0, &[1.0, 2.0]);
    let sent = drain(&mut t);
    let ranks: Vec<u16> = sent.iter().map(|(r, _, _)| r.rank).collect();
    assert_eq!(ranks, [0, 1, 2]);
    for (r, h, p) in &sent {
        assert_eq!(r.to, endpoint(r.rank));
        assert_eq!(
            (h.msg_type, h.rank, h.count, h.seq),
            (MsgType::Result, r.rank, 2, 0)
        );
        assert_eq!(&p[..], &[0, 0, 0x40, 0x40, 0, 0, 0xc0, 0x40]);
    }
    assert_eq!(t.counters.results_sent, 3);
    assert_eq!(t.get(5).unwrap().counters().results_sent, 3);
    // A lost RESULT is answered to its rank alone, flagged RETX.
    data(&mut t, 1, 0, &[1.0, 2.0]);
    let again = drain(&mut t);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0.rank, 1);
    assert!(again[0].1.has_flag(crate::wire::flags::RETX));
}

#[test]
fn a_result_head_and_its_payload_are_the_whole_encoded_result() {
    let mut t = active_table(2, 4, 8);
    data(&mut t, 0, 0, &[1.0, 2.0, 3.0]);
    data(&mut t, 1, 0, &[0.5, 0.25, -3.0]);
    let mut seen = 0;
    while let Some(r) = t.poll_reply() {
        let mut whole = [0u8; 256];
        let e = t.encode(&r, &mut whole).unwrap();
        let mut head = [0u8; HEADER_LEN];
        let rh = t.encode_result_head(&r, &mut head).unwrap();
        let payload = rh.payload();
        assert_eq!((rh.encoded.len, rh.encoded.ce), (e.len, e.ce));
        assert_eq!(&whole[..HEADER_LEN], &head[..]);
        // The payload, then the token.
        let end = e.len - crate::tag::TAG_LEN;
        assert_eq!(&whole[HEADER_LEN..end], payload);
        assert_eq!(&whole[end..e.len], &rh.token[..]);
        assert_eq!(payload, bytemuck::cast_slice::<f32, u8>(&[1.5, 2.25, 0.0]));
        // The sum made once per result is the payload's.
        assert_eq!(
            rh.payload_sum,
            crate::checksum::Sum::ZERO.add_bytes(payload).fold()
        );
        seen += 1;
    }
    assert_eq!(seen, 2);
    // Not a RESULT: no head-only form.
    let r = Reply {
        to: endpoint(0),
        job: 5,
        rank: 0,
        msg: ReplyMsg::JoinAck,
    };
    assert!(t.encode_result_head(&r, &mut [0u8; 64]).is_none());
}

#[test]
fn sum_is_rank_order_whatever_the_arrival_order() {
    // Values chosen so that float addition order changes the bits.
    let inputs: [[f32; 3]; 4] = [
        [1e8, 0.1, -3.0],
        [-1e8, 1e-8, 7.5],
        [1.0, 0.2, 1e20],
        [3.3, -0.3, -1e20],
    ];
    let refs: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
    let want = rank_order_sum(&refs);
    let orders: [[u16; 4]; 5] = [
        [0, 1, 2, 3],
        [3, 2, 1, 0],
        [2, 0, 3, 1],
        [1, 3, 0, 2],
        [3, 0, 2, 1],
    ];
    for order in orders {
        let mut t = active_table(4, 4, 8);
        for (i, r) in order.iter().enumerate() {
            let v = data(&mut t, *r, 0, &inputs[*r as usize]);
            if i == 3 {
                assert_eq!(v, Verdict::Data(DataOutcome::Completed { seq: 0 }));
            } else {
                assert_eq!(v, Verdict::Data(DataOutcome::Taken));
            }
        }
        let got = t.get(5).unwrap().result(0).unwrap().values();
        assert_eq!(bits(&got), bits(&want), "order {order:?}");
    }
}

#[test]
fn duplicates_stale_and_window_are_dropped_and_counted() {
    let mut t = active_table(2, 4, 8);
    assert_eq!(
        data(&mut t, 0, 0, &[1.0]),
        Verdict::Data(DataOutcome::Taken)
    );
    assert_eq!(
        data(&mut t, 0, 0, &[1.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::Duplicate))
    );
    assert_eq!(
        data(&mut t, 1, 0, &[2.0, 3.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::CountMismatch))
    );
    // seq 4 is floor + S: beyond the window.
    assert_eq!(
        data(&mut t, 0, 4, &[1.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::BeyondWindow))
    );
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Completed { seq: 0 })
    );
    // Lost RESULT: DATA for the shadow's seq is answered from the shadow.
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Retransmit { seq: 0 })
    );
    // The floor moved to 1: seq 5 is beyond the window, seq 4 is not.
    assert_eq!(
        data(&mut t, 0, 5, &[5.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::BeyondWindow))
    );
    for s in 1..4 {
        data(&mut t, 0, s, &[1.0]);
        data(&mut t, 1, s, &[1.0]);
    }
    assert_eq!(t.get(5).unwrap().floor(), 4);
    assert_eq!(
        data(&mut t, 0, 4, &[5.0]),
        Verdict::Data(DataOutcome::Taken)
    );
    // The shadow of seq 0 outlives the start of seq 4 in the same slot.
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Retransmit { seq: 0 })
    );
    assert_eq!(
        data(&mut t, 1, 4, &[1.0]),
        Verdict::Data(DataOutcome::Completed { seq: 4 })
    );
    assert_eq!(
        data(&mut t, 1, 0, &[2.0]),
        Verdict::Data(DataOutcome::Dropped(DropReason::Stale))
    );
    let j = t.get(5).unwrap();
    let (c, d) = (&j.counters(), &j.drops());
    assert_eq!(d.count(DropReason::Duplicate), 1);
    assert_eq!(d.count(DropReason::CountMismatch), 1);
    assert_eq!(d.count(DropReason::BeyondWindow), 2);
    assert_eq!(d.count(DropReason::Stale), 1);
    assert_eq!(c.retransmits_served, 2);
    assert_eq!(c.chunks_completed, 5);
}

#[test]
fn spoofed_source_changes_no_sum() {
    let mut t = active_table(2, 4, 8);
    let mut spoof = endpoint(1);
    spoof.source.ip = [198, 18, 0, 100];
    assert_eq!(
        data_from(&mut t, 1, 0, &[1e9], spoof, GEN),
        Verdict::Data(DataOutcome::Dropped(DropReason::SourceMismatch))
    );
    data(&mut t, 0, 0, &[1.0]);
    data(&mut t, 1, 0, &[2.0]);
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[3.0]);
}

#[test]
fn repeated_join_gets_ack_again_and_restart_rejoins_everyone() {
    let mut t = active_table(2, 4, 8);
    assert_eq!(
        join(&mut t, 1, endpoint(1), SECRET),
        Verdict::Join(JoinOutcome::AckAgain)
    );
    data(&mut t, 0, 0, &[1.0]);
    // Rank 1 restarted (new UDP port): the job goes back to joining.
    let mut restarted = endpoint(1);
    restarted.source.port += 1;
    assert_eq!(
        join(&mut t, 1, restarted, SECRET),
        Verdict::Join(JoinOutcome::Waiting)
    );
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    assert_eq!(
        data(&mut t, 0, 0, &[1.0]),
        Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive))
    );
    assert_eq!(
        join(&mut t, 0, endpoint(0), SECRET),
        Verdict::Join(JoinOutcome::Activated)
    );
    // Slots were cleared: seq 0 starts afresh.
    assert_eq!(
        data(&mut t, 0, 0, &[1.0]),
        Verdict::Data(DataOutcome::Taken)
    );
    assert_eq!(
        data_from(&mut t, 1, 0, &[2.0], restarted, GEN),
        Verdict::Data(DataOutcome::Completed { seq: 0 })
    );
}

/// A leaf switch's fresh JOIN (flag UPSTREAM) after it restarted: if the
/// spine still holds every result from its resume point, it keeps its place
/// (no reset, the other leaves go on) and its resends are answered from the
/// shadows; if not, the job goes back to joining as for a restarted worker.
#[test]
fn a_restarted_leaf_keeps_its_place_while_its_results_are_held() {
    let mut t = active_table(2, 4, 8);
    for seq in 0..3 {
        data(&mut t, 0, seq, &[1.0]);
        data(&mut t, 1, seq, &[2.0]);
    }
    drain(&mut t);
    let leaf_join = |t: &mut JobTable, resume: (u32, u32)| {
        let from = endpoint(1);
        let mut hs = handshake(t, 1, from, SECRET).as_leaf();
        hello(t, &mut hs, from, t0());
        t.handle(&join_bytes(&hs, resume), from, false, t0())
    };
    assert_eq!(
        leaf_join(&mut t, (0, 1)),
        Verdict::Join(JoinOutcome::AckAgain)
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.state(), JobState::Active);
    assert_eq!(
        (job.counters().rejoins_in_place, job.counters().resets),
        (1, 0)
    );
    // Its resend of seq 1 is answered from the shadow, with the sum.
    assert_eq!(
        data(&mut t, 1, 1, &[2.0]),
        Verdict::Data(DataOutcome::Retransmit { seq: 1 })
    );
    let replies = drain(&mut t);
    let (_, h, p) = replies.last().unwrap();
    assert_eq!((h.msg_type, h.seq), (MsgType::Result, 1));
    assert_eq!(
        bits(&[f32::from_le_bytes(p[..4].try_into().unwrap())]),
        bits(&[3.0])
    );

    // Four more chunks: seq 0's slot now holds seq 4. Resuming at 0 cannot
    // be served: everyone joins again.
    for seq in 3..7 {
        data(&mut t, 0, seq, &[1.0]);
        data(&mut t, 1, seq, &[2.0]);
    }
    assert_eq!(
        leaf_join(&mut t, (0, 0)),
        Verdict::Join(JoinOutcome::Waiting)
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.state(), JobState::Joining);
    assert_eq!(
        (job.counters().rejoins_in_place, job.counters().resets),
        (1, 1)
    );
}

#[test]
fn resume_point_is_the_lowest_reported() {
    let mut t = table();
    t.add(config(3, 8, 8), 1000).unwrap();
    for (r, resume) in [(4u32, 90u32), (3, 80), (4, 95)].into_iter().enumerate() {
        join_full(&mut t, r as u16, endpoint(r as u16), SECRET, resume, t0());
    }
    let job = t.get(5).unwrap();
    assert_eq!(job.resume_point(), (3, 80));
    assert_eq!(job.floor(), 80);
    let ack = job.join_ack_header(2, GEN);
    assert_eq!((ack.collective, ack.seq, ack.gen), (3, 80, GEN));
}

#[test]
fn ce_mark_on_any_contribution_sets_ece() {
    let mut t = active_table(2, 4, 8);
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.count = 1;
    h.gen = GEN;
    let p = 1.0f32.to_le_bytes();
    t.handle(&frame(&h, &p), endpoint(0), true, t0());
    h.rank = 1;
    t.handle(&frame(&h, &p), endpoint(1), false, t0());
    let hdr = t.get(5).unwrap().result_header(0, 1, false, GEN).unwrap();
    assert!(hdr.has_flag(crate::wire::flags::ECE));
    assert_eq!(t.get(5).unwrap().counters().ece_marked, 1);
}

#[test]
fn wide_jobs_have_no_rank_ceiling() {
    let n = 300;
    let mut t = active_table_wide(n);
    for r in (0..n).rev() {
        data_from(&mut t, r, 0, &[r as f32], wide_endpoint(r), GEN);
    }
    let want: f32 = (0..n).map(|r| r as f32).fold(0.0, |a, b| a + b);
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[want]);
}

fn active_table_wide(n: u16) -> JobTable {
    let mut t = table();
    let mut c = config(n, 2, 4);
    c.allowed_sources = vec![Ipv4Prefix {
        addr: [0, 0, 0, 0],
        len: 0,
    }];
    t.add(c, 1000).unwrap();
    for r in 0..n {
        join(&mut t, r, wide_endpoint(r), SECRET);
    }
    t
}

fn wide_endpoint(r: u16) -> Endpoint {
    let mut e = endpoint(r);
    e.source.ip = [10, 0, (r >> 8) as u8, r as u8];
    e
}

#[test]
fn removed_job_nacks_its_workers_and_heartbeat_names_missing_ranks() {
    let mut t = active_table(3, 4, 8);
    data(&mut t, 0, 0, &[1.0]);
    data(&mut t, 2, 0, &[1.0]);
    let mut out = [0u8; 16];
    let job = t.get(5).unwrap();
    assert_eq!(job.write_missing_ranks(0, &mut out), 1);
    assert_eq!(&out[..2], &[0, 1]);
    // seq 1 has not started: every rank is missing.
    assert_eq!(job.write_missing_ranks(1, &mut out), 3);
    let mut h = HeaderRepr::new(MsgType::Heartbeat, 5);
    h.rank = 2;
    h.gen = GEN;
    assert_eq!(
        t.handle(&frame(&h, &[]), endpoint(2), false, t0()),
        Verdict::Heartbeat { seq: 0 }
    );
    let answer = drain(&mut t);
    assert_eq!(answer.len(), 1);
    assert_eq!(
        (answer[0].1.msg_type, &answer[0].2[..]),
        (MsgType::Heartbeat, &[0u8, 1][..])
    );
    let mut stranger = endpoint(2);
    stranger.source.port += 1;
    assert_ne!(
        t.handle(&frame(&h, &[]), stranger, false, t0()),
        Verdict::Heartbeat { seq: 0 }
    );

    assert!(t.remove(5).is_some());
    assert_eq!(data(&mut t, 1, 0, &[1.0]), Verdict::NackUnknownJob);
    assert_eq!(t.counters.unknown_job, 1);
    // Re-declared: a fresh job again.
    t.add(config(3, 4, 8), 1000).unwrap();
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
}

mod auth_mac;
mod dtypes;
mod elastic;
mod entry;
mod kinds;
mod lanes;
mod priority;
mod provisioning;

/// Encodes every queued reply: (header bytes as sent, parsed header, payload).
fn drain_raw(t: &mut JobTable) -> Vec<([u8; HEADER_LEN], HeaderRepr, Vec<u8>)> {
    drain_encoded(t)
        .into_iter()
        .map(|(_, head, hdr, payload)| (head, hdr, payload))
        .collect()
}

/// Rank 1 restarts (a new handshake, a new resume point) in job 5 of two or
/// more active ranks: the job goes back to joining.
fn restart_rank_1(t: &mut JobTable) {
    let later = t0() + Duration::from_millis(5);
    let (v, _) = join_full(t, 1, endpoint(1), SECRET, (1, 9), later);
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    drain(t);
}

/// The one reply queued, a NACK 6 (job not active): its header bytes as
/// sent and its payload.
fn the_nack_6(t: &mut JobTable) -> ([u8; HEADER_LEN], NackPayload) {
    let out = drain_raw(t);
    assert_eq!(out.len(), 1);
    let (head, hdr, payload) = &out[0];
    assert_eq!(hdr.msg_type, MsgType::Nack);
    let nack = NackPayload::parse(payload).unwrap();
    assert_eq!(nack.reason, NackReason::JobNotActive);
    (*head, nack)
}

/// A NACK to a member's recorded source carries a tag under the session its
/// accepted JOIN made, also after the job went back to joining (a NACK 6 to
/// a former member); a stranger's NACK has a zero tag; a guard of another
/// session refuses the tag.
#[test]
fn nacks_to_members_are_tagged_under_their_session() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut guards = Vec::new();
    for r in 0..2 {
        let hs = joined(&mut t, r, t0());
        guards.push(hs.session().expect("challenged"));
    }
    drain(&mut t);
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);
    restart_rank_1(&mut t);
    // Rank 0's DATA now gets NACK 6, tagged under rank 0's session.
    data(&mut t, 0, 0, &[1.0; 8]);
    let (head, nack) = the_nack_6(&mut t);
    assert_ne!(nack.tag, [0; 16]);
    assert!(guards[0].nack_is_authentic(&head, &nack));
    // Another session's guard (rank 1's old one) refuses it.
    assert!(!guards[1].nack_is_authentic(&head, &nack));
    // Another address in the prefixes gets no NACK 6 at all (the stranger
    // rule), and a stale generation from it an untagged NACK 7.
    let mut other = endpoint(0);
    other.source.port += 1;
    data_from(&mut t, 0, 0, &[1.0; 8], other, GEN);
    assert!(drain_raw(&mut t).is_empty());
    data_from(&mut t, 0, 0, &[1.0; 8], other, GEN ^ 1);
    let out = drain_raw(&mut t);
    let nack = NackPayload::parse(&out[0].2).unwrap();
    assert_eq!(nack.reason, NackReason::StaleGeneration);
    assert_eq!(nack.tag, [0; 16]);
    assert!(!guards[0].nack_is_authentic(&out[0].0, &nack));
    // A stale generation from the member's source is tagged too (the
    // switch did not restart: the worker must not think it did).
    data_from(&mut t, 0, 0, &[1.0; 8], endpoint(0), GEN ^ 1);
    let out = drain_raw(&mut t);
    let nack = NackPayload::parse(&out[0].2).unwrap();
    assert_eq!(nack.reason, NackReason::StaleGeneration);
    assert!(guards[0].nack_is_authentic(&out[0].0, &nack));
}

/// A probe is sent at most once per PROBE_EVERY; the switch's CHALLENGE to
/// it says "same generation" (the trigger was spoofed) or, from a restarted
/// switch, "restarted"; a CHALLENGE to another nonce is not an answer; a
/// NACK echoing the probe (the job is gone) is authentic.
#[test]
fn probes_tell_a_restart_from_a_spoofed_trigger() {
    let t = active_table(1, 4, 8);
    let mut t = t;
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(&mut t, &mut hs, endpoint(0), t0());
    t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0());
    drain(&mut t);
    let mut g = hs.session().unwrap();
    let now = t0() + Duration::from_secs(1);
    let nonce = g.probe(now, [0xa5; 16]).expect("first probe goes");
    assert_eq!(g.probe(now + Duration::from_millis(100), [0xa6; 16]), None);
    let mut b = [0u8; 128];
    let n = hs.emit_hello_with(nonce, &mut b).unwrap();
    let ask = |t: &mut JobTable| {
        t.handle(&b[..n], endpoint(0), false, now);
        drain(t)
            .into_iter()
            .find(|(_, h, _)| h.msg_type == MsgType::Challenge)
            .map(|(_, h, p)| (h, p))
            .unwrap()
    };
    let (h, p) = ask(&mut t);
    // An answer to someone else's HELLO is not ours.
    let mut other = p.clone();
    other[0] ^= 1;
    assert_eq!(g.on_challenge(&h, &other), ProbeAnswer::NotOurs);
    assert_eq!(g.on_challenge(&h, &p), ProbeAnswer::SameGeneration);
    assert_eq!(
        g.on_challenge(&h, &p),
        ProbeAnswer::NotOurs,
        "answered once"
    );
    // A restarted switch (another generation) answers the next probe.
    let mut restarted = JobTable::new(TableConfig::new(GEN ^ 0xff, [0x43; 32]), t0());
    restarted.add(config(1, 4, 8), 1000).unwrap();
    let later = now + Duration::from_millis(250);
    assert_eq!(g.probe(later, nonce), Some(nonce));
    let (h, p) = ask(&mut restarted);
    assert_eq!(
        g.on_challenge(&h, &p),
        ProbeAnswer::Restarted { gen: GEN ^ 0xff }
    );
    // A switch without the job refuses the probe: NACK 1 echoing its nonce.
    let mut empty = table();
    g.probe(later + Duration::from_millis(250), nonce);
    empty.handle(&b[..n], endpoint(0), false, now);
    let out = drain_raw(&mut empty);
    let nack = NackPayload::parse(&out[0].2).unwrap();
    assert_eq!(nack.reason, NackReason::UnknownJob);
    assert_eq!(nack.tag, [0; 16]);
    assert!(g.nack_is_authentic(&out[0].0, &nack));
}

/// The lock-free data path takes a member's DATA of an active job, as the
/// table would (same sums, same counters), on any thread; everything else
/// (another switch port, another generation, a job gone back to joining or
/// removed) it hands to the table.
#[test]
fn the_fast_path_takes_only_what_the_table_would() {
    let mut t = active_table(2, 4, 8);
    let dp = t.data_path();
    let msg = |rank: u16, seq: u32, v: f32, gen: u32| {
        let (h, p) = data_message(rank, seq, &[v], gen);
        frame(&h, &p)
    };
    let mut elsewhere = endpoint(1);
    elsewhere.port_idx = 9;
    let on = |thread: usize, d: &[u8], from: &Endpoint| dp.on_datagram(thread, d, from, false);
    assert_eq!(on(0, &msg(1, 0, 2.0, GEN), &elsewhere), Fast::Slow);
    assert_eq!(on(0, &msg(1, 0, 2.0, GEN ^ 1), &endpoint(1)), Fast::Slow);
    assert_eq!(
        on(0, &msg(0, 0, 1.0, GEN), &endpoint(0)),
        Fast::Done(DataOutcome::Taken)
    );
    assert_eq!(
        on(1, &msg(1, 0, 2.0, GEN), &endpoint(1)),
        Fast::Completed { job: 5, seq: 0 }
    );
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[3.0]);
    // A copy after the RESULT: answered to its sender only.
    assert_eq!(
        on(1, &msg(1, 0, 2.0, GEN), &endpoint(1)),
        Fast::Retransmit {
            job: 5,
            rank: 1,
            seq: 0,
            result_lanes: 0
        }
    );
    let c = t.get(5).unwrap().counters();
    assert_eq!(
        (c.contributions, c.chunks_completed, c.retransmits_served),
        (2, 1, 1)
    );
    let mut members = Vec::new();
    dp.with_job(5, |j| j.for_each_member(|r, e| members.push((r, *e))));
    assert_eq!(members, vec![(0, endpoint(0)), (1, endpoint(1))]);
    // Rank 1 re-joins: the job waits for the others, its DATA is the
    // table's again (which answers NACK 6).
    restart_rank_1(&mut t);
    assert_eq!(on(0, &msg(0, 1, 1.0, GEN), &endpoint(0)), Fast::Slow);
    assert!(t.remove(5).is_some());
    assert_eq!(on(0, &msg(0, 1, 1.0, GEN), &endpoint(0)), Fast::Slow);
}

/// The CI failure of a removed job's worker stalling instead of being
/// told: a member's window of DATA (and its resends) answered with NACK 1
/// spends the NACK budget, and the probe that follows must still get its
/// answer, a NACK 1 echoing the probe's nonce, on every round.
#[test]
fn a_window_of_data_to_a_removed_job_does_not_starve_the_probes_answer() {
    let mut t = active_table(1, 4, 8);
    let mut hs = handshake(&t, 0, endpoint(0), SECRET);
    hello(&mut t, &mut hs, endpoint(0), t0());
    t.handle(&join_bytes(&hs, (0, 0)), endpoint(0), false, t0());
    drain(&mut t);
    let mut g = hs.session().unwrap();
    assert!(t.remove(5).is_some());
    let mut now = t0() + Duration::from_secs(1);
    for round in 0..5u8 {
        // A window (and more) of DATA, as a worker's resends after an RTO.
        for seq in 0..1000 {
            let (h, p) = data_message(0, seq, &[1.0], GEN);
            t.handle(&frame(&h, &p), endpoint(0), false, now);
        }
        let untagged = nacks_in(&drain(&mut t));
        assert!(
            !untagged.is_empty() && untagged.len() < 1000,
            "{}",
            untagged.len()
        );
        let probe = g.probe(now, [round; 16]).expect("one probe per round");
        let mut b = [0u8; 128];
        let n = hs.emit_hello_with(probe, &mut b).unwrap();
        t.handle(&b[..n], endpoint(0), false, now);
        let out = drain_raw(&mut t);
        assert_eq!(out.len(), 1, "round {round}: the probe is answered");
        let nack = NackPayload::parse(&out[0].2).unwrap();
        assert_eq!(nack.reason, NackReason::UnknownJob);
        assert!(g.nack_is_authentic(&out[0].0, &nack));
        now += Duration::from_millis(300);
    }
    assert!(t.counters.nack_rate_limited > 0);
}

/// What a job keeps per rank (membership, last session, accepted serial)
/// fits the n × 192 bytes `JobConfig::pool_bytes` charges for it.
#[test]
fn per_rank_state_fits_what_the_budget_charges() {
    let per_rank = super::job::per_rank_bytes();
    assert!(per_rank <= 192, "{per_rank} bytes per rank");
}

/// What an `auth = "mac"` job keeps on top (per rank a DATA key, per slot
/// a RESULT tag) fits what `JobConfig::pool_bytes` charges on top for it.
#[test]
fn mac_state_fits_what_the_budget_charges() {
    let (per_rank, per_slot) = super::job::mac_bytes();
    let port = config(4, 8, 8);
    let mac = JobConfig {
        auth: crate::tag::AuthMode::Mac,
        ..port.clone()
    };
    let extra = mac.pool_bytes() - port.pool_bytes();
    let want =
        u64::from(port.n_workers) * per_rank as u64 + u64::from(port.pool_slots) * per_slot as u64;
    assert!(extra >= want, "charged {extra} bytes for {want}");
}
mod portbind;

/// A rank waiting for the others resends its JOIN every 200 ms: the log
/// hears "rank joined" once, not once per copy.
#[test]
fn a_waiting_rank_s_resent_join_is_logged_once() {
    let mut t = table();
    t.add(config(2, 8, 64), 1000).unwrap();
    let (v, j) = join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    for k in 1..=10u64 {
        let now = t0() + Duration::from_millis(200 * k);
        let v = t.handle(&j, endpoint(0), false, now);
        assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    }
    let mut joined = 0;
    while let Some(e) = t.poll_event() {
        if matches!(e, Event::RankJoined { .. }) {
            joined += 1;
        }
    }
    assert_eq!(joined, 1);
}
