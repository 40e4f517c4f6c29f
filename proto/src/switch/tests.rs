use super::*;
use crate::reference::rank_order_sum;
use crate::wire::{write_f32s, HeaderRepr, JoinPayload, MsgType, NackReason};

const SECRET: [u8; 32] = [7; 32];
const GEN: u32 = 0x1234_5678;

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
        window: slots,
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

fn join(table: &mut JobTable, rank: u16, from: Endpoint, secret: [u8; 32]) -> Verdict {
    let mut h = HeaderRepr::new(MsgType::Join, 5);
    h.rank = rank;
    let j = JoinPayload {
        n_workers: table.get(5).map_or(0, |j| j.n_workers()),
        dtype: 0,
        op: 0,
        secret,
    };
    let mut p = [0u8; 36];
    j.emit(&mut p).unwrap();
    table.handle(&h, &p, from, false)
}

fn active_table(n: u16, slots: u16, elems: u16) -> JobTable {
    let mut t = JobTable::new(GEN);
    t.add(config(n, slots, elems), 1000).unwrap();
    for r in 0..n {
        let v = join(&mut t, r, endpoint(r), SECRET);
        let want = if r + 1 == n {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(v, Verdict::Join(want));
    }
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
    let mut h = HeaderRepr::new(MsgType::Data, 5);
    h.rank = rank;
    h.seq = seq;
    h.count = vals.len() as u16;
    h.gen = gen;
    let mut p = vec![0u8; vals.len() * 4];
    write_f32s(vals, &mut p);
    t.handle(&h, &p, from, false)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn join_refusals_name_their_reason_and_change_nothing() {
    let mut t = JobTable::new(GEN);
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut stranger = endpoint(0);
    stranger.source.ip = [10, 9, 9, 9];
    assert_eq!(
        join(&mut t, 0, stranger, SECRET),
        Verdict::Join(JoinOutcome::Nack(NackReason::SourceNotAllowed))
    );
    assert_eq!(
        join(&mut t, 0, endpoint(0), [1; 32]),
        Verdict::Join(JoinOutcome::Nack(NackReason::BadSecret))
    );
    assert_eq!(
        join(&mut t, 2, endpoint(2), SECRET),
        Verdict::Join(JoinOutcome::Nack(NackReason::RankOutOfRange))
    );
    let mut h = HeaderRepr::new(MsgType::Join, 9);
    h.rank = 0;
    assert_eq!(
        t.handle(&h, &[0; 36], endpoint(0), false),
        Verdict::NackUnknownJob
    );
    assert_eq!(t.get(5).unwrap().joined_ranks(), 0);
    assert_eq!(t.get(5).unwrap().counters.nacks, 3);
}

#[test]
fn parameters_must_match() {
    let mut t = JobTable::new(GEN);
    t.add(config(2, 4, 8), 1000).unwrap();
    let mut h = HeaderRepr::new(MsgType::Join, 5);
    h.rank = 0;
    let j = JoinPayload {
        n_workers: 3,
        dtype: 0,
        op: 0,
        secret: SECRET,
    };
    let mut p = [0u8; 36];
    j.emit(&mut p).unwrap();
    assert_eq!(
        t.handle(&h, &p, endpoint(0), false),
        Verdict::Join(JoinOutcome::Nack(NackReason::ParametersDiffer))
    );
}

#[test]
fn data_before_activation_is_nacked_6_and_wrong_gen_7() {
    let mut t = JobTable::new(GEN);
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
        let got = t.get(5).unwrap().result(0).unwrap().values.to_vec();
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
    let c = &t.get(5).unwrap().counters;
    assert_eq!(c.drop_count(DropReason::Duplicate), 1);
    assert_eq!(c.drop_count(DropReason::CountMismatch), 1);
    assert_eq!(c.drop_count(DropReason::BeyondWindow), 2);
    assert_eq!(c.drop_count(DropReason::Stale), 1);
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
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values, &[3.0]);
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

#[test]
fn resume_point_is_the_lowest_reported() {
    let mut t = JobTable::new(GEN);
    t.add(config(3, 8, 8), 1000).unwrap();
    for (r, (c, s)) in [(4u32, 90u32), (3, 80), (4, 95)].into_iter().enumerate() {
        let mut h = HeaderRepr::new(MsgType::Join, 5);
        h.rank = r as u16;
        h.collective = c;
        h.seq = s;
        let j = JoinPayload {
            n_workers: 3,
            dtype: 0,
            op: 0,
            secret: SECRET,
        };
        let mut p = [0u8; 36];
        j.emit(&mut p).unwrap();
        t.handle(&h, &p, endpoint(r as u16), false);
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
    t.handle(&h, &p, endpoint(0), true);
    h.rank = 1;
    t.handle(&h, &p, endpoint(1), false);
    let hdr = t.get(5).unwrap().result_header(0, 1, false, GEN).unwrap();
    assert!(hdr.has_flag(crate::wire::flags::ECE));
    assert_eq!(t.get(5).unwrap().counters.ece_marked, 1);
}

#[test]
fn wide_jobs_have_no_rank_ceiling() {
    let n = 300;
    let mut t = active_table_wide(n);
    for r in (0..n).rev() {
        data_from(&mut t, r, 0, &[r as f32], wide_endpoint(r), GEN);
    }
    let want: f32 = (0..n).map(|r| r as f32).fold(0.0, |a, b| a + b);
    assert_eq!(t.get(5).unwrap().result(0).unwrap().values, &[want]);
}

fn active_table_wide(n: u16) -> JobTable {
    let mut t = JobTable::new(GEN);
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
        t.handle(&h, &[], endpoint(2), false),
        Verdict::Heartbeat { seq: 0 }
    );
    let mut stranger = endpoint(2);
    stranger.source.port += 1;
    assert_ne!(
        t.handle(&h, &[], stranger, false),
        Verdict::Heartbeat { seq: 0 }
    );

    assert!(t.remove(5).is_some());
    assert_eq!(data(&mut t, 1, 0, &[1.0]), Verdict::NackUnknownJob);
    assert_eq!(t.counters.unknown_job, 1);
    // Re-declared: a fresh job again.
    t.add(config(3, 4, 8), 1000).unwrap();
    assert_eq!(t.get(5).unwrap().state(), JobState::Joining);
}
