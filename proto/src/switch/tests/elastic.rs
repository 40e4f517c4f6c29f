//! Elastic jobs (docs/PROTOCOL.md, "Elastic jobs"): `JobTable::resize_job`
//! between collectives, its refusals, and that the new membership never
//! sees the old one's shadows.

use super::*;

/// Job 5's DATA of `rank` for `seq` of collective `collective`.
fn data_c(t: &mut JobTable, rank: u16, seq: u32, collective: u32, vals: &[f32]) -> Verdict {
    let (mut h, p) = data_message(rank, seq, vals, GEN);
    h.collective = collective;
    t.handle(&frame(&h, &p), endpoint(rank), false, t0())
}

/// Rank `r`'s input for `seq`: distinct per rank and seq, with bits a
/// reordered sum would change.
/// The rank-order sum of ranks 0..n's inputs for `seq`.
fn sum_of(n: u16, seq: u32) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, seq)).collect();
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    rank_order_sum(&refs)
}

fn input(r: u16, seq: u32) -> Vec<f32> {
    (0..4)
        .map(|i| 0.1 + f32::from(r) * 1.37 + seq as f32 * 0.013 + i as f32 * 1e-3)
        .collect()
}

/// Every rank of an `n`-rank job sends `seq` of `collective`; the RESULT
/// every rank gets must be the rank-order sum, bit for bit.
fn all_reduce_chunk(t: &mut JobTable, n: u16, seq: u32, collective: u32) {
    drain(t);
    for r in 0..n {
        data_c(t, r, seq, collective, &input(r, seq));
    }
    let want = sum_of(n, seq);
    let results: Vec<_> = drain(t)
        .into_iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::Result)
        .collect();
    assert_eq!(
        results.len(),
        n as usize,
        "one RESULT per rank of seq {seq}"
    );
    for (reply, h, p) in results {
        assert_eq!((h.seq, h.collective), (seq, collective));
        assert!(reply.rank < n);
        let got: Vec<f32> = p
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&got), bits(&want), "seq {seq} with {n} ranks");
    }
}

/// Every rank of the resized job joins afresh (resume (0, 0), as a
/// restarted process does); returns the JOIN_ACK's resume point.
fn rejoin_all(t: &mut JobTable, n: u16) -> (u32, u32) {
    drain(t);
    for r in 0..n {
        let v = join(t, r, endpoint(r), SECRET);
        let want = if r + 1 == n {
            JoinOutcome::Activated
        } else {
            JoinOutcome::Waiting
        };
        assert_eq!(v, Verdict::Join(want), "rank {r} of {n}");
    }
    let acks: Vec<_> = drain(t)
        .into_iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::JoinAck)
        .map(|(_, h, _)| (h.collective, h.seq))
        .collect();
    assert_eq!(acks.len(), n as usize);
    assert!(acks.iter().all(|a| *a == acks[0]));
    acks[0]
}

#[test]
fn four_to_two_to_four_between_collectives_is_bit_exact_and_seqs_continue() {
    let mut t = active_table(4, 8, 4);
    let (_, in_use_4) = t.pool_memory();
    for seq in 0..3 {
        all_reduce_chunk(&mut t, 4, seq, 0);
    }
    let done_before = t.get(5).unwrap().counters().chunks_completed;

    assert_eq!(t.resize_job(5, 2), Ok(true));
    let job = t.get(5).unwrap();
    assert_eq!((job.state(), job.n_workers()), (JobState::Joining, 2));
    // Where the old members stopped: the next collective, the floor.
    assert_eq!(job.resume_point(), (1, 3));
    let mut cfg2 = job.config.clone();
    cfg2.n_workers = 2;
    assert_eq!(
        t.pool_memory().1,
        cfg2.pool_bytes(),
        "only the new pool is charged"
    );
    let events: Vec<Event> = std::iter::from_fn(|| t.poll_event()).collect();
    assert_eq!(
        events.last(),
        Some(&Event::JobResized {
            job: 5,
            from: 4,
            to: 2,
            resume: (1, 3)
        })
    );

    assert_eq!(
        rejoin_all(&mut t, 2),
        (1, 3),
        "fresh workers continue the seqs"
    );
    for seq in 3..6 {
        all_reduce_chunk(&mut t, 2, seq, 1);
    }
    // The fast path serves the new engine (its job list was swapped).
    let dp = t.data_path();
    let (h, p) = data_message(0, 6, &input(0, 6), GEN);
    assert_eq!(
        dp.on_datagram(0, &frame(&h, &p), &endpoint(0), false),
        Fast::Done(DataOutcome::Taken)
    );
    let (h, p) = data_message(1, 6, &input(1, 6), GEN);
    assert_eq!(
        dp.on_datagram(0, &frame(&h, &p), &endpoint(1), false),
        Fast::Completed { job: 5, seq: 6 }
    );
    let want = sum_of(2, 6);
    assert_eq!(
        bits(&t.get(5).unwrap().result(6).unwrap().values()),
        bits(&want)
    );

    assert_eq!(t.resize_job(5, 4), Ok(true));
    assert_eq!(t.get(5).unwrap().resume_point(), (1, 7));
    assert_eq!(t.pool_memory().1, in_use_4);
    assert_eq!(rejoin_all(&mut t, 4), (1, 7));
    for seq in 7..10 {
        all_reduce_chunk(&mut t, 4, seq, 2);
    }
    // The job's counters carry on across both swaps of its engine.
    let c = t.get(5).unwrap().counters();
    assert_eq!(c.chunks_completed, done_before + 7);
    assert!(t.remove(5).is_some());
    assert_eq!(t.pool_memory().1, 0, "the charge follows the job's n");
}

#[test]
fn a_resize_mid_collective_is_refused_and_changes_nothing() {
    let mut t = active_table(4, 8, 4);
    all_reduce_chunk(&mut t, 4, 0, 0);
    data_c(&mut t, 0, 1, 1, &input(0, 1));
    data_c(&mut t, 2, 1, 1, &input(2, 1));
    let e = t.resize_job(5, 2).unwrap_err();
    assert_eq!(e, ResizeError::Busy { id: 5, seq: 1 });
    let msg = e.to_string();
    assert!(
        msg.contains("middle of a collective") && msg.contains("resize again"),
        "{msg}"
    );
    let job = t.get(5).unwrap();
    assert_eq!((job.state(), job.n_workers()), (JobState::Active, 4));
    // A reservation taken before the collective started is refused at the
    // swap, and its charge given back.
    let mut t2 = active_table(4, 8, 4);
    let in_use = t2.pool_memory().1;
    let r = t2.reserve_resize(5, 2).unwrap().unwrap();
    let built = r.build().unwrap();
    data_c(&mut t2, 3, 0, 0, &input(3, 0));
    let Err((e, _pool)) = t2.resize(r, built) else {
        panic!("a resize while seq 0 aggregates must be refused");
    };
    assert_eq!(e, ResizeError::Busy { id: 5, seq: 0 });
    assert_eq!(t2.pool_memory().1, in_use);
    // The collective finishes with every rank's values, then the resize goes.
    for r in [1, 3] {
        data_c(&mut t, r, 1, 1, &input(r, 1));
    }
    let want = sum_of(4, 1);
    assert_eq!(
        bits(&t.get(5).unwrap().result(1).unwrap().values()),
        bits(&want)
    );
    assert_eq!(t.resize_job(5, 2), Ok(true));
    assert_eq!(t.get(5).unwrap().resume_point(), (2, 2));
}

#[test]
fn old_shadows_are_never_served_to_the_new_membership() {
    // Four slots: seqs 4..8 of the old membership are held as shadows in
    // slots 0..4 when the job is resized.
    let mut t = active_table(4, 4, 4);
    for seq in 0..8 {
        all_reduce_chunk(&mut t, 4, seq, 0);
    }
    assert!(t.get(5).unwrap().result(7).is_some());
    assert_eq!(t.resize_job(5, 2), Ok(true));
    assert!(
        t.get(5).unwrap().result(7).is_none(),
        "the old shadows are gone"
    );
    assert_eq!(rejoin_all(&mut t, 2), (1, 8));
    // A new member's DATA for a seq the old membership completed is not
    // answered with the old sum (which a retransmit would have sent).
    let v = data_c(&mut t, 1, 7, 0, &input(1, 7));
    assert!(
        !matches!(v, Verdict::Data(DataOutcome::Retransmit { .. })),
        "{v:?}"
    );
    assert!(drain(&mut t)
        .iter()
        .all(|(_, h, _)| h.msg_type != MsgType::Result));
    // Seq 8 maps to slot 0 (which held the old seq 4): summed afresh from
    // the two new ranks alone, and a lost RESULT is resent with the new sum.
    all_reduce_chunk(&mut t, 2, 8, 1);
    assert_eq!(
        data_c(&mut t, 1, 8, 1, &input(1, 8)),
        Verdict::Data(DataOutcome::Retransmit { seq: 8 })
    );
    let (_, h, p) = drain(&mut t).pop().unwrap();
    assert_eq!((h.msg_type, h.seq), (MsgType::Result, 8));
    let got: Vec<f32> = p
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(bits(&got), bits(&sum_of(2, 8)));
}

#[test]
fn workers_of_the_old_size_are_told_clearly() {
    let mut t = active_table(4, 8, 4);
    all_reduce_chunk(&mut t, 4, 0, 0);
    assert_eq!(t.resize_job(5, 2), Ok(true));
    // A former member's DATA (rank 1, still in range; rank 3, no longer):
    // an authenticated NACK 6 to it, so it joins again...
    for r in [1u16, 3] {
        assert_eq!(
            data_c(&mut t, r, 1, 1, &input(r, 1)),
            Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive)),
            "rank {r}"
        );
        let replies = drain(&mut t);
        let nacks = nacks_in(&replies);
        assert_eq!(nacks.len(), 1);
        assert_ne!(nacks[0].tag, [0; 16], "tagged under its session");
    }
    // ...where rank 3 hears NACK 4 and rank 1, joining with the old n,
    // NACK 5, and the switch's log names both worker counts.
    let mut hs = handshake(&t, 3, endpoint(3), SECRET);
    assert_eq!(
        hello(&mut t, &mut hs, endpoint(3), t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::RankOutOfRange))
    );
    let mut params = handshake(&t, 1, endpoint(1), SECRET).params().clone();
    params.n_workers = 4;
    let mut hs = Handshake::new(params, [9; 16]);
    hello(&mut t, &mut hs, endpoint(1), t0());
    assert_eq!(
        t.handle(&join_bytes(&hs, (1, 1)), endpoint(1), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::ParametersDiffer))
    );
    let k = NackReason::ParametersDiffer as usize;
    let sample = t.last_refusal(k).unwrap();
    assert_eq!(sample.why, Refusal::WorkersDiffer { job: 2, join: 4 });
    let line = sample.why.to_string();
    assert!(
        line.contains("n_workers 4") && line.contains("the job has 2"),
        "{line}"
    );
    // Once the resized job is active, rank 3's DATA still gets NACK 6 (never
    // a slot: the new engine has no row for it).
    rejoin_all(&mut t, 2);
    assert_eq!(
        data_c(&mut t, 3, 1, 1, &input(3, 1)),
        Verdict::Data(DataOutcome::Nack(NackReason::JobNotActive))
    );
}

#[test]
fn resize_refusals_say_what_to_do() {
    let mut t = active_table(2, 8, 4);
    let e = t.resize_job(9, 2).unwrap_err();
    assert_eq!(e, ResizeError::UnknownJob(9));
    assert!(e.to_string().contains("switchctl jobs"));
    let e = t.resize_job(5, 0).unwrap_err();
    assert_eq!(e, ResizeError::NoWorkers(5));
    assert!(e.to_string().contains("switchctl job rm 5"));
    assert_eq!(t.resize_job(5, 2), Ok(false), "already 2: nothing to do");
    assert_eq!(t.get(5).unwrap().state(), JobState::Active);

    // Growing needs the new pool while the old is allocated.
    let cfg = config(2, 8, 4);
    let mut tight = JobTable::new(
        TableConfig {
            pool_budget: cfg.pool_bytes() * 3,
            ..TableConfig::new(GEN, [0x42; 32])
        },
        t0(),
    );
    tight.add(cfg, 1000).unwrap();
    let e = tight.resize_job(5, 64).unwrap_err();
    assert!(
        matches!(e, ResizeError::OverBudget { id: 5, n: 64, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("pool_memory_mib"), "{e}");
    assert_eq!(tight.get(5).unwrap().n_workers(), 2);
    assert_eq!(tight.resize_job(5, 3), Ok(true), "fits beside the old pool");

    // A leaf of a tree.
    let mut leaf = config(2, 8, 4);
    leaf.upstream = Some(Upstream {
        leaf_index: 0,
        n_leaves: 2,
        spines: vec![SpineAddr {
            ip: [198, 18, 1, 1],
            port: 48879,
        }],
        local_ip: [198, 18, 1, 2],
        local_port: 48879,
    });
    let mut t = table();
    t.add(leaf, 1000).unwrap();
    let e = t.resize_job(5, 3).unwrap_err();
    assert_eq!(e, ResizeError::Leaf(5));
    assert!(e.to_string().contains("every switch of the tree"));

    // A spine: its members are leaves (they joined with UPSTREAM).
    let mut t = table();
    t.add(config(2, 8, 4), 1000).unwrap();
    let from = endpoint(0);
    let mut hs = handshake(&t, 0, from, SECRET).as_leaf();
    hello(&mut t, &mut hs, from, t0());
    t.handle(&join_bytes(&hs, (0, 0)), from, false, t0());
    assert_eq!(t.resize_job(5, 3).unwrap_err(), ResizeError::Spine(5));
}

#[test]
fn a_joining_job_resizes_and_its_waiting_members_are_refused() {
    let mut t = table();
    t.add(config(4, 8, 4), 1000).unwrap();
    // Ranks 0 and 1 joined with n = 4 and wait; the job shrinks to 2.
    let (_, j0) = join_full(&mut t, 0, endpoint(0), SECRET, (0, 0), t0());
    join_full(&mut t, 1, endpoint(1), SECRET, (0, 0), t0());
    assert_eq!(t.resize_job(5, 2), Ok(true));
    let job = t.get(5).unwrap();
    assert_eq!((job.joined_ranks(), job.resume_point()), (0, (0, 0)));
    // The resend of rank 0's JOIN (n = 4) is refused, not counted as a member.
    assert_eq!(
        t.handle(&j0, endpoint(0), false, t0()),
        Verdict::Join(JoinOutcome::Nack(NackReason::ParametersDiffer))
    );
    assert_eq!(rejoin_all(&mut t, 2), (0, 0));
    all_reduce_chunk(&mut t, 2, 0, 0);
}

#[test]
fn a_mac_job_resizes_and_its_new_members_get_sessions() {
    let mut cfg = config(3, 8, 4);
    cfg.auth = crate::tag::AuthMode::Mac;
    let mut t = active_table_of(cfg);
    assert_eq!(t.resize_job(5, 2), Ok(true));
    rejoin_all(&mut t, 2);
    let job = t.get(5).unwrap();
    assert_eq!(job.state(), JobState::Active);
    for r in 0..2 {
        assert!(job.session_key(r).is_some());
    }
    assert!(job.session_key(2).is_none(), "rank 2 is gone");
}

/// Resizes while two dataplane threads feed the fast path: the table takes
/// the resize only between chunks (Busy otherwise), nothing panics or
/// blocks, the threads' later DATA is handed to the table (Slow: the new
/// job is joining), and the resized job then sums exactly.
#[test]
fn a_resize_under_fast_path_traffic_swaps_the_engine_safely() {
    let mut t = active_table(2, 8, 4);
    let dp = t.data_path();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let resized = std::thread::scope(|sc| {
        for rank in 0..2u16 {
            let (dp, stop) = (&dp, &stop);
            sc.spawn(move || {
                let mut seq = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && seq < 200_000 {
                    let (h, p) = data_message(rank, seq, &input(rank, seq), GEN);
                    match dp.on_datagram(rank as usize, &frame(&h, &p), &endpoint(rank), false) {
                        // The partner may lag: resend until this seq is done.
                        Fast::Done(DataOutcome::Dropped(_)) => continue,
                        Fast::Slow => return,
                        _ => seq += 1,
                    }
                }
            });
        }
        let mut busy = 0u32;
        let resized = loop {
            match t.resize_job(5, 3) {
                Ok(true) => break true,
                Err(ResizeError::Busy { .. }) => busy += 1,
                other => panic!("{other:?}"),
            }
            if busy > 100_000 {
                break false;
            }
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        resized
    });
    if !resized {
        // Every try landed mid-chunk (the window keeps chunks in flight):
        // the threads stopped, possibly one rank ahead of the other. The
        // lagging rank finishes what is open; then the resize goes.
        while let Some(seq) = t.get(5).unwrap().aggregating() {
            let mut missing = Vec::new();
            t.get(5)
                .unwrap()
                .core()
                .engine
                .missing(seq, |r| missing.push(r));
            for r in missing {
                data(&mut t, r, seq, &input(r, seq));
            }
        }
        assert_eq!(t.resize_job(5, 3), Ok(true));
    }
    let job = t.get(5).unwrap();
    assert_eq!((job.state(), job.n_workers()), (JobState::Joining, 3));
    let (c, s) = rejoin_all(&mut t, 3);
    all_reduce_chunk(&mut t, 3, s, c);
}

/// A `stats = true` job keeps its statistics through a resize: its new
/// pool sums them, and every RESULT after the resize carries the trailer
/// its JOIN_ACK promises (the new pool was once built without them).
#[test]
fn a_stats_job_keeps_its_statistics_through_a_resize() {
    let mut cfg = config(4, 8, 4);
    cfg.stats = true;
    let mut t = active_table_of(cfg);
    assert!(t.get(5).unwrap().core().engine.stats());
    assert_eq!(t.resize_job(5, 2), Ok(true));
    let (collective, seq) = rejoin_all(&mut t, 2);
    assert!(
        t.get(5).unwrap().core().engine.stats(),
        "the resized pool sums statistics"
    );
    drain(&mut t);
    for r in 0..2 {
        data_c(&mut t, r, seq, collective, &input(r, seq));
    }
    let results: Vec<_> = drain(&mut t)
        .into_iter()
        .filter(|(_, h, _)| h.msg_type == MsgType::Result)
        .collect();
    assert_eq!(results.len(), 2);
    for (_, h, p) in results {
        assert_eq!(
            p.len(),
            usize::from(h.count) * 4 + crate::stats::STATS_LEN,
            "values and the statistics trailer"
        );
    }
}
