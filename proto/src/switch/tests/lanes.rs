//! Lane replies (docs/PROTOCOL.md, "Seq lanes"): a JOIN asking
//! `LANE_REPLIES` is granted when the switch has L > 1 seq lanes, its
//! JOIN_ACK says so under its tag, and every RESULT to that member (a
//! completion's, from the table or the data path, a resend, a hand-off)
//! leaves from `agg_port + (seq mod L)`; every other reply, and every reply
//! to a member that did not ask, leaves from `agg_port` with the bytes it
//! always had. A later JOIN without the flag ends the grant.

use super::entry::{data_bytes, encoded_as_the_table_does, Shell};
use super::*;
use crate::switch::entry::{Handoff, Switch};
use crate::tag::{AuthMode, PacketKey};
use crate::wire::flags;

/// The aggregation port the members joined on.
const AGG: u16 = 48879;

fn at_agg(rank: u16) -> Endpoint {
    Endpoint {
        local_port: AGG,
        ..endpoint(rank)
    }
}

fn lane_table(lanes: u16) -> JobTable {
    JobTable::new(
        TableConfig {
            seq_lanes: lanes,
            ..TableConfig::new(GEN, [0x42; 32])
        },
        t0(),
    )
}

/// A handshake of `rank` whose JOINs ask lane replies when `ask`, through
/// its CHALLENGE.
fn challenged(t: &mut JobTable, rank: u16, ask: bool, now: Instant) -> Handshake {
    let mut hs = handshake(t, rank, at_agg(rank), SECRET);
    hs.set_lane_replies(ask);
    hello(t, &mut hs, at_agg(rank), now);
    hs
}

/// Job 5 (`auth`) on a switch of `lanes` seq lanes, rank r joined asking
/// lane replies when `asks[r]`: the table (its JOIN_ACKs drained and
/// checked: the bit is set exactly for the granted, the tag verifies under
/// each rank's session, and they leave from `agg_port`), which ranks were
/// granted, and each rank's DATA key (a mac job's).
struct LanesJob {
    t: JobTable,
    granted: Vec<bool>,
    keys: Vec<Option<PacketKey>>,
}

fn lanes_job(lanes: u16, asks: &[bool], auth: AuthMode) -> LanesJob {
    let mut t = lane_table(lanes);
    t.add(
        JobConfig {
            auth,
            ..config(asks.len() as u16, 8, 4)
        },
        1000,
    )
    .unwrap();
    let mut hss = Vec::new();
    for (r, &ask) in asks.iter().enumerate() {
        let hs = challenged(&mut t, r as u16, ask, t0());
        t.handle(&join_bytes(&hs, (0, 0)), at_agg(r as u16), false, t0());
        hss.push(hs);
    }
    let granted: Vec<bool> = asks.iter().map(|&a| a && lanes > 1).collect();
    let acks: Vec<_> = drain(&mut t)
        .into_iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::JoinAck)
        .collect();
    assert_eq!(acks.len(), asks.len());
    let mut keys = vec![None; asks.len()];
    for (r, h, payload) in &acks {
        let rank = usize::from(h.rank);
        assert_eq!(h.has_flag(flags::LANE_REPLIES), granted[rank], "{h:?}");
        assert_eq!(r.to, at_agg(h.rank).with_grant(&t, h.rank));
        assert_eq!(r.to.local_port, AGG, "a JOIN_ACK leaves from agg_port");
        let ack = hss[rank]
            .on_join_ack(h, payload)
            .expect("the JOIN_ACK verifies");
        keys[rank] = ack.data_key;
    }
    LanesJob { t, granted, keys }
}

impl LanesJob {
    /// Rank `rank`'s DATA of `seq` (tagged in a mac job) in generation
    /// `gen`, through the table.
    fn data(&mut self, rank: u16, seq: u32, gen: u32) -> Verdict {
        let (h, mut p) = data_message(rank, seq, &[1.0], gen);
        if let Some(k) = &self.keys[usize::from(rank)] {
            p.extend_from_slice(&k.tag(&h, &p));
        }
        self.t.handle(&frame(&h, &p), at_agg(rank), false, t0())
    }
}

trait WithGrant {
    fn with_grant(self, t: &JobTable, rank: u16) -> Endpoint;
}

impl WithGrant for Endpoint {
    /// This endpoint as the table recorded it for `rank` (its grant).
    fn with_grant(self, t: &JobTable, rank: u16) -> Endpoint {
        Endpoint {
            result_lanes: t.get(5).unwrap().member(rank).unwrap().result_lanes,
            ..self
        }
    }
}

/// The port a RESULT of `seq` to a member leaves from.
fn result_port(granted: bool, seq: u32, lanes: u16) -> u16 {
    if granted {
        AGG + (seq % u32::from(lanes)) as u16
    } else {
        AGG
    }
}

#[test]
fn granted_only_when_asked_and_the_switch_has_lanes() {
    for lanes in [1, 2, 4] {
        let LanesJob { t, granted, .. } = lanes_job(lanes, &[true, false, true], AuthMode::Port);
        let job = t.get(5).unwrap();
        for (r, g) in granted.iter().enumerate() {
            let want = if *g { lanes } else { 0 };
            assert_eq!(job.member(r as u16).unwrap().result_lanes, want);
        }
        assert_eq!(granted, [lanes > 1, false, lanes > 1]);
    }
}

/// A leaf's JOIN (`UPSTREAM`) is never granted: it takes its spines'
/// RESULTs from their aggregation port.
#[test]
fn a_leafs_join_is_not_granted() {
    let mut t = lane_table(4);
    t.add(config(1, 8, 4), 1000).unwrap();
    let mut hs = handshake(&t, 0, at_agg(0), SECRET).as_leaf();
    hs.set_lane_replies(true);
    hello(&mut t, &mut hs, at_agg(0), t0());
    let j = join_bytes(&hs, (0, 0));
    let h = HeaderRepr::parse(&crate::wire::Header::new_checked(&j[..]).unwrap()).unwrap();
    assert!(h.has_flag(flags::UPSTREAM) && h.has_flag(flags::LANE_REPLIES));
    t.handle(&j, at_agg(0), false, t0());
    let acks = drain(&mut t);
    assert_eq!(acks.len(), 1);
    assert!(!acks[0].1.has_flag(flags::LANE_REPLIES));
    assert_eq!(t.get(5).unwrap().member(0).unwrap().result_lanes, 0);
}

/// The table's paths (what a leaf or `auth = "mac"` job always takes, and
/// the slow path of every job): the completion's RESULT to every member,
/// a resend of a completed chunk, a NACK 7 to a DATA and a HEARTBEAT
/// answer. Rank 0 asked, rank 1 did not; rank 1 gets exactly what a table
/// where nobody asked sends.
#[test]
fn the_tables_results_leave_from_the_lane_port_and_nothing_else_does() {
    for auth in [AuthMode::Port, AuthMode::Mac] {
        let mut job = lanes_job(4, &[true, false], auth);
        assert_eq!(job.granted, [true, false]);
        let granted = job.granted.clone();
        let mut plain = lanes_job(4, &[false, false], auth);
        for seq in 0..6 {
            for rank in 0..2 {
                let v = job.data(rank, seq, GEN);
                plain.data(rank, seq, GEN);
                if rank == 1 {
                    assert_eq!(v, Verdict::Data(DataOutcome::Completed { seq }));
                }
            }
            let out = drain_encoded(&mut job.t);
            let base = drain_encoded(&mut plain.t);
            assert_eq!((out.len(), base.len()), (2, 2));
            for ((r, head, h, payload), (br, bhead, _, bpayload)) in out.iter().zip(&base) {
                assert_eq!(h.msg_type, MsgType::Result);
                let g = granted[usize::from(r.rank)];
                assert_eq!(r.to.local_port, result_port(g, seq, 4), "{auth:?} {r:?}");
                // The header and values every member always got (a mac
                // tag after them is the activation's).
                assert_eq!((head, &payload[..4]), (bhead, &bpayload[..4]));
                if !g {
                    assert_eq!(r, br, "an ungranted member's reply is unchanged");
                }
            }
        }
        // Resends of a completed chunk: to the sender alone, from its lane
        // port when granted.
        for rank in 0..2 {
            for seq in [4, 5] {
                let v = job.data(rank, seq, GEN);
                assert_eq!(v, Verdict::Data(DataOutcome::Retransmit { seq }));
                let out = drain_encoded(&mut job.t);
                let [(r, _, h, _)] = &out[..] else {
                    panic!("{out:?}")
                };
                assert!(h.has_flag(flags::RETX) && h.rank == rank);
                let g = granted[usize::from(rank)];
                assert_eq!(r.to.local_port, result_port(g, seq, 4), "{auth:?}");
                assert_eq!(r.to.source, at_agg(rank).source);
            }
        }
        // Every other reply to the granted member leaves from agg_port.
        let mut hb = HeaderRepr::new(MsgType::Heartbeat, 5);
        hb.rank = 0;
        hb.gen = GEN;
        hb.seq = 7;
        assert!(matches!(
            job.t.handle(&frame(&hb, &[]), at_agg(0), false, t0()),
            Verdict::Heartbeat { .. }
        ));
        let stale = job.data(0, 6, GEN ^ 1);
        assert_eq!(
            stale,
            Verdict::Data(DataOutcome::Nack(NackReason::StaleGeneration))
        );
        let out = drain(&mut job.t);
        let types: Vec<MsgType> = out.iter().map(|(_, h, _)| h.msg_type).collect();
        assert_eq!(types, [MsgType::Heartbeat, MsgType::Nack], "{auth:?}");
        for (r, h, _) in &out {
            assert_eq!(r.to.local_port, AGG, "{h:?}");
            assert!(!h.has_flag(flags::LANE_REPLIES));
        }
    }
}

/// The data path (switchd's and the stand-in's): the fan-out from the
/// completing thread, the seq handed to another thread, a member handed
/// off alone, and the resend of a completed chunk.
#[test]
fn the_data_paths_results_leave_from_the_lane_port() {
    let LanesJob { t, granted, .. } = lanes_job(4, &[true, false, true, false], AuthMode::Port);
    let s = Switch::new(t);
    for seq_hand_offs in [true, false] {
        let seqs = if seq_hand_offs { 0..4 } else { 4..8 };
        for seq in seqs {
            // Rank r's socket is thread r mod 2's; thread 0 completes.
            let mut on0 = Shell::new(0, 2);
            on0.seq_hand_offs = seq_hand_offs;
            for rank in 0..4 {
                let h = s.on_datagram(
                    0,
                    &data_bytes(rank, seq),
                    at_agg(rank),
                    false,
                    t0(),
                    &mut on0,
                );
                assert!(h.lock_free);
            }
            let mut on1 = Shell::new(1, 2);
            let mut batch = s.batch(1, t0());
            for (thread, h) in on0.handoffs.drain(..) {
                assert_eq!(thread, 1);
                if !seq_hand_offs {
                    assert!(matches!(h, Handoff::Reply(_)), "{h:?}");
                }
                batch.on_handoff(h, &mut on1);
            }
            drop(batch);
            let sent: Vec<_> = on0.sent.iter().chain(&on1.sent).cloned().collect();
            assert_eq!(sent.len(), 4);
            for (_, r, _) in &sent {
                let g = granted[usize::from(r.rank)];
                assert_eq!(r.to.local_port, result_port(g, seq, 4), "seq {seq}: {r:?}");
                assert_eq!(r.to.source, at_agg(r.rank).source);
                assert_eq!(r.to.result_lanes, 0, "the grant is applied once");
            }
            encoded_as_the_table_does(&s, &sent);
        }
    }
    // Rank 2 (granted, thread 0's) and rank 3 (not, thread 1's) lost
    // seq 6's RESULT: the resend goes to the sender alone.
    for rank in [2, 3] {
        let mut on0 = Shell::new(0, 2);
        let h = s.on_datagram(0, &data_bytes(rank, 6), at_agg(rank), false, t0(), &mut on0);
        assert_eq!(h.verdict, Verdict::Data(DataOutcome::Retransmit { seq: 6 }));
        let r = match (&on0.sent[..], &on0.handoffs[..]) {
            ([(_, r, _)], []) => *r,
            ([], [(1, Handoff::Reply(r))]) => *r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.rank, rank);
        let g = granted[usize::from(rank)];
        assert_eq!(r.to.local_port, result_port(g, 6, 4));
    }
}

/// A member that joins again without the flag ends its grant (its JOIN_ACK
/// and RESULTs are a plain member's again); asking again grants it again.
#[test]
fn a_later_join_without_the_flag_ends_the_grant() {
    let s = Switch::new(lanes_job(4, &[true, false], AuthMode::Port).t);
    for (round, ask) in [false, true, false].into_iter().enumerate() {
        // A fresh handshake of rank 0 asking for what it has: it keeps the
        // job (AckAgain), with the new JOIN's grant.
        let now = t0() + Duration::from_millis(10 * (round as u64 + 1));
        {
            let mut t = s.table();
            let hs = challenged(&mut t, 0, ask, now);
            let v = t.handle(&join_bytes(&hs, (0, 0)), at_agg(0), false, now);
            assert_eq!(v, Verdict::Join(JoinOutcome::AckAgain));
            let out = drain(&mut t);
            let [(r, h, payload)] = &out[..] else {
                panic!("{out:?}")
            };
            assert_eq!(h.msg_type, MsgType::JoinAck);
            assert_eq!(h.has_flag(flags::LANE_REPLIES), ask);
            assert_eq!(r.to.local_port, AGG);
            hs.on_join_ack(h, payload).expect("the JOIN_ACK verifies");
            let want = if ask { 4 } else { 0 };
            assert_eq!(t.get(5).unwrap().member(0).unwrap().result_lanes, want);
        }
        // The data path sees it at once.
        let seq = 1 + round as u32;
        let mut sh = Shell::new(0, 1);
        for rank in 0..2 {
            s.on_datagram(
                0,
                &data_bytes(rank, seq),
                at_agg(rank),
                false,
                t0(),
                &mut sh,
            );
        }
        let ports: Vec<(u16, u16)> = sh
            .sent
            .iter()
            .map(|(_, r, _)| (r.rank, r.to.local_port))
            .collect();
        assert_eq!(ports, [(0, result_port(ask, seq, 4)), (1, AGG)]);
    }
}

/// After a restart of another rank (the job goes back to joining and
/// activates again), the asking member's new JOIN is granted again and
/// the new activation's RESULTs use it.
#[test]
fn after_a_rejoin_the_grant_is_the_new_joins() {
    let mut t = lanes_job(4, &[true, true], AuthMode::Port).t;
    let later = t0() + Duration::from_millis(5);
    // Rank 1 restarts (a new resume point) without asking; rank 0 rejoins
    // asking.
    let hs1 = challenged(&mut t, 1, false, later);
    let v = t.handle(&join_bytes(&hs1, (1, 9)), at_agg(1), false, later);
    assert_eq!(v, Verdict::Join(JoinOutcome::Waiting));
    let hs0 = challenged(&mut t, 0, true, later);
    let v = t.handle(&join_bytes(&hs0, (0, 0)), at_agg(0), false, later);
    assert_eq!(v, Verdict::Join(JoinOutcome::Activated));
    let acks = drain(&mut t);
    let bits: Vec<(u16, bool)> = acks
        .iter()
        .map(|(_, h, _)| (h.rank, h.has_flag(flags::LANE_REPLIES)))
        .collect();
    assert_eq!(bits, [(0, true), (1, false)]);
    for seq in 0..4 {
        for rank in 0..2 {
            data_from(&mut t, rank, seq, &[1.0], at_agg(rank), GEN);
        }
        let ports: Vec<(u16, u16)> = drain(&mut t)
            .iter()
            .map(|(r, _, _)| (r.rank, r.to.local_port))
            .collect();
        assert_eq!(ports, [(0, result_port(true, seq, 4)), (1, AGG)]);
    }
}
