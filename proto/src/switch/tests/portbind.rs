//! Port binding, the stranger rule, per-source rate limits and the replayed
//! JOIN after every rank left (issue 20: findings 1, 5, 9).

use super::*;
use crate::switch::ratelimit::{HELLO_LIMIT, NACK_LIMIT};

/// `endpoint(rank)` arriving on switch port `port`.
fn on_port(rank: u16, port: u32) -> Endpoint {
    Endpoint {
        port_idx: port,
        ..endpoint(rank)
    }
}

fn heartbeat(t: &mut JobTable, rank: u16, gen: u32, from: Endpoint, now: Instant) -> Verdict {
    let mut h = HeaderRepr::new(MsgType::Heartbeat, 5);
    h.rank = rank;
    h.gen = gen;
    t.handle(&frame(&h, &[]), from, false, now)
}

/// Every rank joins through its own handshake from `from(rank)`; returns
/// the handshakes (for LEAVEs) and the JOINs sent (for replays).
fn join_all(
    t: &mut JobTable,
    n: u16,
    from: impl Fn(u16) -> Endpoint,
    leaf: bool,
) -> Vec<(Handshake, Vec<u8>)> {
    let mut out = Vec::new();
    for r in 0..n {
        let mut hs = handshake(t, r, from(r), SECRET);
        if leaf {
            hs = hs.as_leaf();
        }
        hello(t, &mut hs, from(r), t0());
        let j = join_bytes(&hs, (0, 0));
        let v = t.handle(&j, from(r), false, t0());
        assert!(matches!(
            v,
            Verdict::Join(JoinOutcome::Waiting | JoinOutcome::Activated)
        ));
        out.push((hs, j));
    }
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);
    drain(t);
    out
}

fn leave_bytes(hs: &Handshake) -> Vec<u8> {
    let mut b = [0u8; 64];
    let n = hs.emit_leave(&mut b).unwrap();
    b[..n].to_vec()
}

fn drops(t: &JobTable, r: DropReason) -> u64 {
    t.get(5).unwrap().drops().count(r)
}

#[test]
fn a_members_address_on_another_switch_port_is_dropped_as_wrong_port() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let hs = join_all(&mut t, 2, |r| on_port(r, 1 + r as u32), false);
    // Worker 1's MAC, IP and UDP port, sent from switch port 9.
    let spoof = on_port(1, 9);
    assert_eq!(
        data_from(&mut t, 1, 0, &[1e9], spoof, GEN),
        Verdict::Data(DataOutcome::Dropped(DropReason::WrongPort))
    );
    assert_eq!(
        heartbeat(&mut t, 1, GEN, spoof, t0()),
        Verdict::Dropped(Some(DropReason::WrongPort))
    );
    // Even a captured LEAVE with its right MAC.
    assert_eq!(
        t.handle(&leave_bytes(&hs[1].0), spoof, false, t0()),
        Verdict::Dropped(Some(DropReason::WrongPort))
    );
    assert!(
        drain(&mut t).is_empty(),
        "a spoofed frame is never answered"
    );
    assert_eq!(drops(&t, DropReason::WrongPort), 3);
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);
    // The real members' sum holds no trace of it.
    data_from(&mut t, 0, 0, &[1.0], on_port(0, 1), GEN);
    assert_eq!(
        data_from(&mut t, 1, 0, &[2.0], on_port(1, 2), GEN),
        Verdict::Data(DataOutcome::Completed { seq: 0 })
    );
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[3.0]);
    // The counter is in the schema every renderer walks.
    let names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
    assert!(names.contains(&"wrong_port"));
}

/// A spine's members are leaves: the same binding holds for their partials.
#[test]
fn a_spine_binds_its_leaves_to_their_ports() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    join_all(&mut t, 2, |r| on_port(r, 3 + r as u32), true);
    assert_eq!(
        data_from(&mut t, 0, 0, &[5.0], on_port(0, 4), GEN),
        Verdict::Data(DataOutcome::Dropped(DropReason::WrongPort))
    );
    data_from(&mut t, 0, 0, &[1.0], on_port(0, 3), GEN);
    data_from(&mut t, 1, 0, &[2.0], on_port(1, 4), GEN);
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values(), &[3.0]);
    assert_eq!(drops(&t, DropReason::WrongPort), 1);
}

/// Probes at the current generation get nothing unless they are the
/// member; a wrong generation gets the same NACK 7, byte for byte, from
/// a member's address or a stranger's.
#[test]
fn strangers_and_members_are_answered_alike() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    join_all(&mut t, 2, |r| on_port(r, 1 + r as u32), false);
    let member = on_port(1, 2);
    let spoof = on_port(1, 9);
    let mut stranger = on_port(7, 9);
    stranger.source.ip = [198, 18, 0, 200];
    let mut outside = stranger;
    outside.source.ip = [10, 1, 1, 1];

    assert_eq!(
        heartbeat(&mut t, 1, GEN, member, t0()),
        Verdict::Heartbeat { seq: 0 }
    );
    assert_eq!(drain(&mut t).len(), 1);
    for from in [spoof, stranger, outside] {
        assert!(matches!(
            heartbeat(&mut t, 1, GEN, from, t0()),
            Verdict::Dropped(Some(_))
        ));
        assert!(matches!(
            data_from(&mut t, 1, 0, &[1.0], from, GEN),
            Verdict::Data(DataOutcome::Dropped(_))
        ));
        assert!(drain(&mut t).is_empty(), "{from:?} was answered");
    }

    // Wrong generation: every source inside the prefixes gets one NACK 7,
    // the same bytes; outside, nothing.
    let encoded = |t: &mut JobTable| -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(r) = t.poll_reply() {
            let mut buf = [0u8; 256];
            let e = t.encode(&r, &mut buf).unwrap();
            out.push(buf[..e.len].to_vec());
        }
        out
    };
    let mut answers = Vec::new();
    for from in [member, spoof, stranger] {
        heartbeat(&mut t, 1, GEN + 1, from, t0());
        let hb = encoded(&mut t);
        data_from(&mut t, 1, 0, &[1.0], from, GEN + 1);
        let data = encoded(&mut t);
        assert_eq!((hb.len(), data.len()), (1, 1), "{from:?}");
        answers.push((hb, data));
    }
    // The forged member address on another port and the stranger get the
    // same bytes; the bound member's NACK differs only in its tag (under
    // its session: docs/PROTOCOL.md, "Sessions"), which nobody else sees.
    assert_eq!(answers[1], answers[2]);
    let untag = |a: &(Vec<Vec<u8>>, Vec<Vec<u8>>)| {
        let mut a = a.clone();
        for f in a.0.iter_mut().chain(a.1.iter_mut()) {
            let n = f.len();
            f[n - 16..].fill(0);
        }
        a
    };
    assert_ne!(answers[0], answers[1], "the member's NACK 7 is tagged");
    assert_eq!(untag(&answers[0]), answers[1]);
    let h = crate::wire::Header::new_checked(&answers[0].0[0][..]).unwrap();
    let nack = NackPayload::parse(h.payload()).unwrap();
    assert_eq!(nack.reason, NackReason::StaleGeneration);
    heartbeat(&mut t, 1, GEN + 1, outside, t0());
    data_from(&mut t, 1, 0, &[1.0], outside, GEN + 1);
    assert!(drain(&mut t).is_empty());
}

/// NACK 6 tells a member that its job went back to joining; nobody else
/// hears it, whatever address they claim.
#[test]
fn only_the_bound_member_hears_that_its_job_is_not_active() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    join_all(&mut t, 2, |r| on_port(r, 1 + r as u32), false);
    // Rank 1 restarts (a fresh handshake from a new UDP port): reset.
    let mut restarted = on_port(1, 2);
    restarted.source.port += 1;
    assert_eq!(
        join(&mut t, 1, restarted, SECRET),
        Verdict::Join(JoinOutcome::Waiting)
    );
    drain(&mut t);
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    let mut stranger = on_port(0, 9);
    stranger.source.ip = [198, 18, 0, 200];
    for from in [on_port(0, 9), stranger] {
        assert!(matches!(
            data_from(&mut t, 0, 0, &[1.0], from, GEN),
            Verdict::Data(DataOutcome::Dropped(_))
        ));
        assert!(matches!(
            heartbeat(&mut t, 0, GEN, from, t0()),
            Verdict::Dropped(Some(_))
        ));
    }
    assert!(drain(&mut t).is_empty());
    assert_eq!(
        data_from(&mut t, 0, 0, &[1.0], on_port(0, 1), GEN),
        Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive))
    );
    assert_eq!(
        heartbeat(&mut t, 0, GEN, on_port(0, 1), t0()),
        Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive))
    );
    let nacks = nacks_in(&drain(&mut t));
    assert_eq!(nacks.len(), 2);
    assert!(nacks.iter().all(|n| n.reason == NackReason::JobNotActive));
}

#[test]
fn a_fresh_join_from_another_switch_port_rebinds_the_member() {
    // The worker moved (or its link did): its fresh JOIN proves the secret,
    // so it is bound where it is now, and the old port is a stranger's.
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    join_all(&mut t, 2, |r| on_port(r, 1 + r as u32), false);
    let moved = on_port(0, 5);
    assert_eq!(
        join(&mut t, 0, moved, SECRET),
        Verdict::Join(JoinOutcome::Waiting)
    );
    join(&mut t, 1, on_port(1, 2), SECRET);
    assert_eq!(t.get(5).unwrap().member(0), Some(&moved));
    assert_eq!(
        data_from(&mut t, 0, 0, &[1.0], on_port(0, 1), GEN),
        Verdict::Data(DataOutcome::Dropped(DropReason::WrongPort))
    );
    assert_eq!(
        data_from(&mut t, 0, 0, &[1.0], moved, GEN),
        Verdict::Data(DataOutcome::Taken)
    );
}

#[test]
fn hellos_are_limited_per_source_and_switch_port() {
    let mut t = table();
    t.add(config(64, 4, 8), 1000).unwrap();
    let from = on_port(0, 1);
    let hello_at = |t: &mut JobTable, rank: u16, from: Endpoint, now: Instant| {
        let hs = handshake(t, rank, from, SECRET);
        let mut b = [0u8; 128];
        let n = hs.emit_hello(&mut b).unwrap();
        t.handle(&b[..n], from, false, now)
    };
    let burst = HELLO_LIMIT.burst as usize;
    let got: Vec<_> = (0..burst + 100)
        .map(|i| hello_at(&mut t, (i % 64) as u16, from, t0()))
        .collect();
    assert!(got[..burst].iter().all(|v| *v == Verdict::Challenged));
    assert!(got[burst..].iter().all(|v| *v == Verdict::RateLimited));
    assert_eq!(t.counters.hello_rate_limited, 100);
    let challenges = drain(&mut t)
        .iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::Challenge)
        .count();
    assert_eq!(challenges, burst);
    // Another switch port's sender is not held back by this one's flood
    // (the same address, as a spoofer would use it).
    assert_eq!(
        hello_at(&mut t, 0, on_port(0, 2), t0()),
        Verdict::Challenged
    );

    // 50 ranks behind one address, each joining for 10 s (a HELLO every
    // 200 ms): never limited.
    let mut t = table();
    t.add(config(64, 4, 8), 1000).unwrap();
    for tick in 0..50u64 {
        let now = t0() + Duration::from_millis(200 * tick);
        for rank in 0..50 {
            assert_eq!(
                hello_at(&mut t, rank, from, now),
                Verdict::Challenged,
                "rank {rank} at {tick}"
            );
        }
        drain(&mut t);
    }
    assert_eq!(t.counters.hello_rate_limited, 0);
}

#[test]
fn nacks_are_limited_per_destination() {
    let mut t = active_table(2, 4, 8);
    let burst = NACK_LIMIT.burst as usize;
    let mut stranger = on_port(1, 9);
    stranger.source.ip = [198, 18, 0, 200];
    for _ in 0..burst + 50 {
        assert_eq!(
            heartbeat(&mut t, 1, GEN + 1, stranger, t0()),
            Verdict::Data(DataOutcome::Nack(NackReason::StaleGeneration))
        );
    }
    assert_eq!(nacks_in(&drain(&mut t)).len(), burst);
    assert_eq!(t.counters.nack_rate_limited, 50);
    // The member (its own address and port) still learns of a restart.
    heartbeat(&mut t, 1, GEN + 1, endpoint(1), t0());
    assert_eq!(nacks_in(&drain(&mut t)).len(), 1);
    // A second later, the stranger's bucket has refilled by the rate.
    let later = t0() + Duration::from_secs(1);
    for _ in 0..burst {
        heartbeat(&mut t, 1, GEN + 1, stranger, later);
    }
    assert_eq!(
        nacks_in(&drain(&mut t)).len(),
        NACK_LIMIT.per_second as usize
    );
    let nack_limited = t.counters.nack_rate_limited;
    assert_eq!(nack_limited, 50 + (burst - 64) as u64);
    // HELLO refusals are limited with the HELLOs they answer, on their own
    // budget: one HELLO, at most one NACK.
    let mut outside = stranger;
    outside.source.ip = [10, 9, 9, 9];
    let mut hs = handshake(&t, 0, outside, SECRET);
    let hello_burst = HELLO_LIMIT.burst as usize;
    let verdicts: Vec<Verdict> = (0..hello_burst + 10)
        .map(|_| hello(&mut t, &mut hs, outside, later))
        .collect();
    let refused = Verdict::Join(JoinOutcome::Nack(NackReason::SourceNotAllowed));
    assert!(verdicts[..hello_burst].iter().all(|v| *v == refused));
    assert!(verdicts[hello_burst..]
        .iter()
        .all(|v| *v == Verdict::RateLimited));
    assert_eq!(t.counters.hello_rate_limited, 10);
    assert_eq!(t.counters.nack_rate_limited, nack_limited);
}

/// No reply to a stranger is larger than what it answers unless it is a
/// NACK, and those are rate-limited (above).
#[test]
fn no_unlimited_reply_to_a_stranger_is_larger_than_its_request() {
    let mut t = active_table(2, 4, 8);
    let mut stranger = on_port(1, 9);
    stranger.source.ip = [198, 18, 0, 200];
    let hs = handshake(&t, 1, stranger, SECRET);
    let mut b = [0u8; 128];
    let n = hs.emit_hello(&mut b).unwrap();
    let mut hb = HeaderRepr::new(MsgType::Heartbeat, 5);
    hb.rank = 1;
    let mut requests = vec![b[..n].to_vec()];
    for gen in [GEN, GEN + 1] {
        hb.gen = gen;
        requests.push(frame(&hb, &[]));
    }
    let mut data = hb;
    data.msg_type = MsgType::Data;
    data.count = 1;
    for gen in [GEN, GEN + 1] {
        data.gen = gen;
        requests.push(frame(&data, &[0; 4]));
    }
    for req in requests {
        t.handle(&req, stranger, false, t0());
        for (_, h, p) in drain(&mut t) {
            let len = HEADER_LEN + p.len();
            assert!(
                len <= req.len() || h.msg_type == MsgType::Nack,
                "{:?} of {len} bytes answers {} bytes",
                h.msg_type,
                req.len()
            );
        }
    }
}

/// Issue 20, finding 9: a JOIN replayed within the nonce lifetime after
/// every rank left was accepted without the secret, leaving a phantom
/// member. A LEAVE spends the nonce of the JOIN it ends.
#[test]
fn a_join_replayed_after_every_rank_left_is_refused() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let hs = join_all(&mut t, 2, endpoint, false);
    for (r, (h, _)) in hs.iter().enumerate() {
        assert_eq!(
            t.handle(&leave_bytes(h), endpoint(r as u16), false, t0()),
            Verdict::Noted
        );
    }
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    // Rank 0's JOIN again, from its address, well within the lifetime.
    let soon = t0() + Duration::from_secs(1);
    assert_eq!(
        t.handle(&hs[0].1, endpoint(0), false, soon),
        Verdict::Join(JoinOutcome::Replayed)
    );
    let job = t.get(5).unwrap();
    assert_eq!(job.joined_ranks(), 0, "a phantom member");
    assert!(job.member(0).is_none());
    assert!(drain(&mut t).is_empty());
    // Restarted workers join as before: a fresh handshake each.
    assert_eq!(
        join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), soon).0,
        Verdict::Join(JoinOutcome::Waiting)
    );
    assert_eq!(
        join_full(&mut t, 1, endpoint(1), SECRET, (0, 0), soon).0,
        Verdict::Join(JoinOutcome::Activated)
    );
}

/// What still works: a member whose JOIN_ACK was lost keeps sending the
/// same JOIN; when another rank's restart reset the job meanwhile, that
/// JOIN (not ended by a LEAVE) is taken again.
#[test]
fn an_unended_join_still_counts_after_a_reset() {
    let mut t = table();
    t.add(config(2, 4, 8), 1000).unwrap();
    let hs = join_all(&mut t, 2, endpoint, false);
    let mut restarted = endpoint(1);
    restarted.source.port += 1;
    join(&mut t, 1, restarted, SECRET);
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
    assert_eq!(
        t.handle(&hs[0].1, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Activated)
    );
}

#[test]
fn version_1_refusals_are_limited_like_nacks() {
    let mut t = table();
    t.add(config(1, 4, 8), 1000).unwrap();
    let mut v1 = vec![0u8; HEADER_LEN + 36];
    v1[0] = 0x13;
    v1[3] = 5;
    let burst = NACK_LIMIT.burst as usize;
    for _ in 0..burst + 7 {
        t.handle(&v1, endpoint(0), false, t0());
    }
    let mut sent = 0;
    while t.poll_reply().is_some() {
        sent += 1;
    }
    assert_eq!(sent, burst);
    assert_eq!(t.counters.version_refused, (burst + 7) as u64);
    assert_eq!(t.counters.nack_rate_limited, 7);
}
