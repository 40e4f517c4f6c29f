//! Priorities between jobs (issue 23): a lower class's RESULTs carry ECE
//! and advertise the yield window while a higher class is busy, on the
//! table's path and the fast path alike, while the engine keeps enforcing
//! the declared window; equal classes never affect each other.

use super::*;
use crate::switch::priority::{yield_window, Priority, BUSY_FOR};
use crate::wire::flags;

const LOW: u16 = 5;
const HIGH: u16 = 6;
const W: u16 = 16;

/// Job `id` of one rank and class `p`, window `W`.
fn job_config(id: u16, p: Priority) -> JobConfig {
    JobConfig {
        id,
        priority: p,
        ..config(1, W, 4)
    }
}

/// Job `id`'s single rank, at its own UDP port.
fn member(id: u16) -> Endpoint {
    let mut e = endpoint(0);
    e.source.port = 30000 + id;
    e
}

/// Rank 0 of job `id` joins (the job activates).
fn join_job(t: &mut JobTable, id: u16) {
    let from = member(id);
    let params = JoinParams {
        job: id,
        rank: 0,
        n_workers: 1,
        dtype: 0,
        op: 0,
        secret: SECRET,
        ip: from.source.ip,
        port: from.source.port,
        provision: None,
    };
    let mut hs = Handshake::new(params, [id as u8; 16]);
    hello(t, &mut hs, from, t0());
    let v = t.handle(&join_bytes(&hs, (0, 0)), from, false, t0());
    assert_eq!(v, Verdict::Join(JoinOutcome::Activated));
    drain(t);
}

/// A table with jobs `LOW` and `HIGH` of classes `low` and `high`, active.
fn two_jobs(low: Priority, high: Priority) -> JobTable {
    let mut t = table();
    t.add(job_config(LOW, low), 1000).unwrap();
    t.add(job_config(HIGH, high), 1000).unwrap();
    join_job(&mut t, LOW);
    join_job(&mut t, HIGH);
    t
}

fn data_bytes(id: u16, seq: u32) -> Vec<u8> {
    let mut h = HeaderRepr::new(MsgType::Data, id);
    h.seq = seq;
    h.count = 1;
    h.gen = GEN;
    frame(&h, &1f32.to_le_bytes())
}

/// Job `id`'s DATA for `seq` at `t0 + at` through the table; the RESULT it
/// completed: (ECE set, advertised window), or None if none was sent.
fn send(t: &mut JobTable, id: u16, seq: u32, at: Duration) -> Option<(bool, u16)> {
    t.handle(&data_bytes(id, seq), member(id), false, t0() + at);
    drain(t)
        .into_iter()
        .find(|(_, h, _)| h.msg_type == MsgType::Result && h.job == id && h.seq == seq)
        .map(|(_, h, _)| (h.has_flag(flags::ECE), h.window))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_lower_class_gets_ece_and_the_yield_window_while_a_higher_class_is_busy() {
    let mut t = two_jobs(Priority::Normal, Priority::High);
    let share = yield_window(W);
    assert!(share < W);
    // Nobody above is busy: the declared window, no mark.
    assert_eq!(send(&mut t, LOW, 0, ms(0)), Some((false, W)));
    // The high job takes DATA: the low one yields from its next DATA on.
    assert_eq!(send(&mut t, HIGH, 0, ms(1)), Some((false, W)));
    assert_eq!(send(&mut t, LOW, 1, ms(2)), Some((true, share)));
    let low = t.get(LOW).unwrap();
    assert_eq!((low.window(), low.declared_window()), (share, W));
    let c = low.counters();
    assert_eq!((c.priority_marked, c.ece_marked), (1, 1));
    // The engine still enforces the declared window: DATA a worker sent
    // before it heard of the yield is taken (floor 2), not dropped and
    // resent; beyond the declared window is dropped as ever.
    assert_eq!(
        send(&mut t, LOW, 2 + u32::from(share), ms(3)),
        Some((true, share))
    );
    assert_eq!(send(&mut t, LOW, 2 + u32::from(W), ms(3)), None);
    assert_eq!(
        t.get(LOW).unwrap().drops().count(DropReason::BeyondWindow),
        1
    );
    // The high job itself is never marked nor capped.
    assert_eq!(send(&mut t, HIGH, 1, ms(4)), Some((false, W)));
    assert_eq!(t.get(HIGH).unwrap().counters().priority_marked, 0);
    // BUSY_FOR after the high job's last DATA, everything is as declared.
    let idle = ms(4) + BUSY_FOR + ms(1);
    assert_eq!(send(&mut t, LOW, 2, idle), Some((false, W)));
    assert_eq!(t.get(LOW).unwrap().window(), W);
    assert_eq!(t.get(LOW).unwrap().counters().priority_marked, 2);
}

/// Busy is earned by work: a member of the high job resending a chunk it
/// already has the RESULT of, 400 times a second (each answered from the
/// shadow, `RETX`), keeps no class busy, so the normal job runs with its
/// declared window and no ECE throughout; DATA the high job's engine takes
/// still makes the normal one yield.
#[test]
fn resends_answered_from_the_shadow_do_not_make_a_class_busy() {
    let mut t = two_jobs(Priority::Normal, Priority::High);
    assert_eq!(send(&mut t, HIGH, 0, ms(0)), Some((false, W)));
    let start = BUSY_FOR + ms(1);
    for i in 0..40u32 {
        let at = start + Duration::from_micros(2500 * u64::from(i));
        t.handle(&data_bytes(HIGH, 0), member(HIGH), false, t0() + at);
        let resent = drain(&mut t)
            .into_iter()
            .any(|(_, h, _)| h.job == HIGH && h.seq == 0 && h.has_flag(flags::RETX));
        assert!(resent, "resend {i} answered from the shadow");
        let low = send(&mut t, LOW, i, at + Duration::from_micros(100));
        assert_eq!(low, Some((false, W)), "the normal job's chunk {i}");
    }
    assert_eq!(t.get(LOW).unwrap().counters().priority_marked, 0);
    assert_eq!(t.get(HIGH).unwrap().counters().retransmits_served, 40);
    // New work of the high job does make the normal one yield.
    let at = start + ms(101);
    assert_eq!(send(&mut t, HIGH, 1, at), Some((false, W)));
    assert_eq!(
        send(&mut t, LOW, 40, at + ms(1)),
        Some((true, yield_window(W)))
    );
}

#[test]
fn equal_classes_are_unchanged() {
    for p in Priority::ALL {
        let mut t = two_jobs(p, p);
        for seq in 0..4 {
            let at = ms(u64::from(seq));
            assert_eq!(send(&mut t, HIGH, seq, at), Some((false, W)), "{p}");
            assert_eq!(send(&mut t, LOW, seq, at), Some((false, W)), "{p}");
        }
        for id in [LOW, HIGH] {
            let c = t.get(id).unwrap().counters();
            assert_eq!((c.priority_marked, c.ece_marked), (0, 0), "{p}");
        }
    }
}

#[test]
fn low_yields_to_normal_and_the_fast_path_yields_the_same() {
    let mut t = two_jobs(Priority::Low, Priority::Normal);
    let dp = t.data_path();
    // The fast path takes its time from the board's tick.
    dp.tick(t0() + ms(1));
    let on = |id: u16, seq: u32| dp.on_datagram(0, &data_bytes(id, seq), &member(id), false);
    assert_eq!(on(HIGH, 0), Fast::Completed { job: HIGH, seq: 0 });
    assert_eq!(on(LOW, 0), Fast::Completed { job: LOW, seq: 0 });
    let core = dp.job(LOW).unwrap();
    let share = yield_window(W);
    assert_eq!((core.advertised_window(), core.engine.window()), (share, W));
    let (h, _) = core
        .result_for(0, 0, false, GEN, core.advertised_window())
        .unwrap();
    assert!(h.has_flag(flags::ECE) && h.window == share);
    assert_eq!(
        on(LOW, 1 + u32::from(W)),
        Fast::Done(DataOutcome::Dropped(DropReason::BeyondWindow))
    );
    assert!(t.get(LOW).unwrap().core().priority.outranked_now());
    assert!(!t.get(HIGH).unwrap().core().priority.outranked_now());
    dp.tick(t0() + ms(1) + BUSY_FOR);
    assert!(!t.get(LOW).unwrap().core().priority.outranked_now());
    assert_eq!(on(LOW, 1), Fast::Completed { job: LOW, seq: 1 });
    assert_eq!(core.advertised_window(), W);
    let (h, _) = core
        .result_for(1, 0, false, GEN, core.advertised_window())
        .unwrap();
    assert!(!h.has_flag(flags::ECE) && h.window == W);
    assert_eq!(t.get_mut(LOW).unwrap().counters().priority_marked, 1);
}

#[test]
fn set_window_changes_the_declared_window_and_keeps_the_yield() {
    let mut t = two_jobs(Priority::Normal, Priority::High);
    send(&mut t, HIGH, 0, ms(0));
    assert_eq!(send(&mut t, LOW, 0, ms(1)), Some((true, yield_window(W))));
    t.get_mut(LOW).unwrap().set_window(8);
    let low = t.get(LOW).unwrap();
    assert_eq!((low.declared_window(), low.window()), (8, yield_window(8)));
    assert_eq!(send(&mut t, LOW, 1, ms(2)), Some((true, 1)));
    assert_eq!(low_window_after_idle(&mut t), 8);
}

fn low_window_after_idle(t: &mut JobTable) -> u16 {
    let at = ms(2) + BUSY_FOR + ms(1);
    send(t, LOW, 2, at).map_or(0, |(_, w)| w)
}

/// Every driver feeds the switch's one entry point, whose batches move the
/// board's clock: a busy higher class makes the lower class's RESULTs,
/// sent from the lock-free fan-out, advertise the yield window with ECE,
/// the very bytes the table encodes; once idle, the declared window again.
#[test]
fn the_entry_point_s_results_carry_the_yield_window() {
    use crate::switch::engine::ResultRef;
    use crate::switch::entry::{encode_result, Handoff, Switch, Transmit};
    use crate::tag::Tag;

    /// One thread; the RESULTs sent, as (header, bytes).
    struct Sent(Vec<(Reply, HeaderRepr, Vec<u8>)>);
    impl Transmit for Sent {
        fn route(&mut self, _: &mut Reply) -> Option<usize> {
            Some(0)
        }
        fn send_result(&mut self, r: &Reply, h: &HeaderRepr, res: &ResultRef<'_>, tok: &Tag) {
            let mut b = [0u8; 256];
            let e = encode_result(h, res, tok, &mut b).unwrap();
            self.0.push((*r, *h, b[..e.len].to_vec()));
        }
        fn send_reply(&mut self, r: &Reply, _: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
            panic!("{r:?}: only RESULTs here");
        }
        fn hand_off(&mut self, _: usize, h: Handoff) {
            panic!("{h:?}: one thread");
        }
        fn unsent(&mut self, r: &Reply) {
            panic!("{r:?} unsent");
        }
    }
    let s = Switch::new(two_jobs(Priority::Normal, Priority::High));
    let send = |id: u16, seq: u32, at: Duration| {
        let mut out = Sent(Vec::new());
        let h = s.on_datagram(
            0,
            &data_bytes(id, seq),
            member(id),
            false,
            t0() + at,
            &mut out,
        );
        assert!(h.lock_free, "job {id} seq {seq}");
        let [(r, hdr, ref bytes)] = out.0[..] else {
            panic!("{:?}", out.0);
        };
        let mut b = [0u8; 256];
        let e = s.table().encode(&r, &mut b).unwrap();
        assert_eq!(&b[..e.len], &bytes[..], "the table's bytes");
        (hdr.has_flag(flags::ECE), hdr.window)
    };
    let share = yield_window(W);
    assert_eq!(send(LOW, 0, ms(1)), (false, W));
    assert_eq!(send(HIGH, 0, ms(2)), (false, W));
    assert_eq!(send(LOW, 1, ms(3)), (true, share));
    assert_eq!(send(LOW, 2, ms(3) + BUSY_FOR + ms(1)), (false, W));
}
