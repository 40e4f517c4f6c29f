//! One collective carried by T threads per rank (docs/design/
//! worker-threads.md), against `worker::loopback`'s stand-in with seq lanes
//! and lane replies: each thread has its own socket for its lanes, its own
//! share of the chunks and its own window. What must hold: the sums are
//! bit-identical to one thread's (the rank-order reference) under loss, a
//! switch restart and `auth = "mac"`; the worker reports the threads that
//! ran; a switch without lanes gets one thread, still exact.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::member::MemberStats;
use proto::reference::{expected_sum, fill_pattern};
use worker::loopback::{LoopbackConfig, LoopbackSwitch};
use worker::{AuthMode, TransportKind, Worker, WorkerConfig, WorkerStats};

const SECRET: [u8; 32] = [0x5b; 32];

fn stand_in(n: u16, lanes: u16, drop_every: u64, auth: AuthMode) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = 100;
    cfg.seq_lanes = lanes;
    cfg.drop_every = drop_every;
    cfg.auth = auth;
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// What one rank saw.
struct Ran {
    threads: usize,
    lane_replies: bool,
    stats: WorkerStats,
}

/// `threads[r]` threads for rank r; `iterations` all-reduces of `len`
/// checked bit for bit; `mid(it)` runs on rank 0 before iteration `it`.
fn run(
    sw: &LoopbackSwitch,
    kind: TransportKind,
    threads: &[usize],
    len: usize,
    iterations: u32,
    mid: impl Fn(u32) + Sync,
) -> Vec<Ran> {
    let n = threads.len() as u16;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                let mid = &mid;
                let t = threads[rank as usize];
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    cfg.transport_kind = kind;
                    cfg.threads = t;
                    let mut w = Worker::join(cfg).expect("join");
                    let mut data = vec![0f32; len];
                    for it in 0..iterations {
                        if rank == 0 {
                            mid(it);
                        }
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                expected_sum(n, it, i).to_bits(),
                                "{kind} rank {rank} ({t} threads) it {it} elem {i}"
                            );
                        }
                    }
                    Ran {
                        threads: w.threads(),
                        lane_replies: w.lane_replies(),
                        stats: w.stats(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn two_and_four_threads_are_bit_exact_on_both_transports() {
    for kind in [TransportKind::Mmsg, TransportKind::UdpGso] {
        for t in [2, 4] {
            let sw = stand_in(3, 4, 0, AuthMode::Port);
            // 500 chunks per all-reduce.
            for r in run(&sw, kind, &[t; 3], 50_000, 3, |_| {}) {
                assert_eq!(r.threads, t, "{kind}");
                assert!(r.lane_replies, "{kind}");
                assert!(r.stats.results >= 3 * 500, "{kind}: {:?}", r.stats);
            }
            // Every lane's port took DATA: each thread sends its own lanes.
            let per_lane = sw.datagrams_per_lane();
            assert!(per_lane.iter().all(|n| *n >= 3 * 3 * 125), "{per_lane:?}");
        }
    }
}

/// Ranks with different thread counts (1, 2, 4) in one job: the switch
/// sums chunks, not threads.
#[test]
fn ranks_with_different_thread_counts_agree() {
    let sw = stand_in(3, 4, 0, AuthMode::Port);
    let ran = run(&sw, TransportKind::Auto, &[1, 2, 4], 30_001, 3, |_| {});
    let got: Vec<usize> = ran.iter().map(|r| r.threads).collect();
    assert_eq!(got, [1, 2, 4]);
}

#[test]
fn four_threads_stay_exact_over_a_lossy_switch() {
    let sw = stand_in(3, 4, 13, AuthMode::Port);
    for r in run(&sw, TransportKind::Auto, &[4; 3], 40_000, 3, |_| {}) {
        assert_eq!(r.threads, 4);
        assert!(r.stats.chunks_resent > 0, "{:?}", r.stats);
    }
}

#[test]
fn two_threads_of_a_tagged_job_stay_exact_over_loss() {
    let sw = stand_in(2, 4, 11, AuthMode::Mac);
    for r in run(&sw, TransportKind::Auto, &[2; 2], 20_000, 3, |_| {}) {
        assert_eq!(r.threads, 2);
        assert_eq!(r.stats.bad_tag_results, 0, "{:?}", r.stats);
    }
}

/// A switch restart in the middle of collectives carried by 2 and 4
/// threads: thread 0 finds it, stops the lanes, rejoins from the oldest
/// unanswered seq of every share, and every thread resends; exact.
#[test]
fn a_switch_restart_mid_collective_is_rejoined_by_every_thread() {
    let sw = stand_in(2, 4, 0, AuthMode::Port);
    let restart = sw.restarter();
    let ran = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            restart();
        });
        run(&sw, TransportKind::Auto, &[2, 4], 100_000, 30, |_| {})
    });
    for r in &ran {
        assert!(r.stats.rejoins >= 1, "{:?}", r.stats);
    }
}

#[test]
fn a_switch_restart_between_collectives_keeps_the_threads() {
    let sw = stand_in(2, 4, 0, AuthMode::Port);
    let restart = sw.restarter();
    let ran = run(&sw, TransportKind::Auto, &[4, 4], 20_000, 4, move |it| {
        if it == 2 {
            restart();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    for r in &ran {
        assert_eq!(r.threads, 4);
    }
}

/// A switch without seq lanes grants no lane replies: one thread carries
/// every collective, whatever was asked, and the sums are exact.
#[test]
fn a_switch_without_lanes_gets_one_thread() {
    let sw = stand_in(2, 1, 0, AuthMode::Port);
    for r in run(&sw, TransportKind::Auto, &[4, 2], 20_000, 2, |_| {}) {
        assert_eq!(r.threads, 1);
        assert!(!r.lane_replies);
    }
}

/// More threads than the switch's lanes: clamped to its lanes.
#[test]
fn threads_are_clamped_to_the_switchs_lanes() {
    let sw = stand_in(2, 2, 0, AuthMode::Port);
    for r in run(&sw, TransportKind::Auto, &[8, 3], 20_000, 2, |_| {}) {
        assert_eq!(r.threads, 2);
    }
}

/// A rank that dies after the first collective: the next one stalls on
/// every thread of the other rank, and thread 0, watching the lanes too,
/// fails it with the stall error that names the missing rank.
#[test]
fn a_dead_rank_stalls_every_thread_and_the_error_names_it() {
    let sw = stand_in(2, 4, 0, AuthMode::Port);
    let addr = sw.addr();
    let join = |rank: u16| {
        let mut cfg = WorkerConfig::new(addr, 1, rank, 2, SECRET);
        cfg.threads = 4;
        cfg.stall_timeout = Duration::from_secs(1);
        Worker::join(cfg).expect("join")
    };
    let (w0, e) = std::thread::scope(|s| {
        let dead = s.spawn(move || {
            let mut w = join(1);
            let mut data = vec![1f32; 20_000];
            w.all_reduce(&mut data).expect("first all_reduce");
            // Gone without a LEAVE.
        });
        let mut w0 = join(0);
        let mut data = vec![1f32; 20_000];
        w0.all_reduce(&mut data).expect("first all_reduce");
        assert!(data.iter().all(|v| *v == 2.0));
        dead.join().unwrap();
        let e = w0.all_reduce(&mut data).expect_err("rank 1 is gone");
        (w0, e)
    });
    assert_eq!(w0.threads(), 4);
    let msg = e.to_string();
    assert!(
        matches!(e, worker::WorkerError::Stalled { ref missing, .. } if missing.as_deref() == Some(&[1][..])),
        "{msg}"
    );
    assert!(msg.contains("waiting for ranks [1]"), "{msg}");
    assert!(w0.stats().probes_sent == 0, "a stall is no restart");
}

/// The switch restarts mid-collective with fewer seq lanes (an operator
/// changed `seq_lanes`): the ranks' threads rejoin, the rest of the
/// collective runs on as many threads as the new switch's lanes, and the
/// sums stay exact.
#[test]
fn a_switch_back_with_fewer_lanes_gets_fewer_threads() {
    for lanes in [2, 1] {
        let sw = stand_in(2, 4, 0, AuthMode::Port);
        let restart = sw.restarter_with_lanes(lanes);
        let ran = std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(150));
                restart();
            });
            run(&sw, TransportKind::Auto, &[4, 4], 100_000, 30, |_| {})
        });
        for r in &ran {
            assert!(r.stats.rejoins >= 1, "{:?}", r.stats);
            assert_eq!(r.threads, usize::from(lanes), "lanes {lanes}");
            assert_eq!(r.lane_replies, lanes > 1);
        }
    }
}

/// Three ranks of two threads on a stand-in with two seq lanes; rank 1
/// starts each of 6 all-reduces (400 chunks) `LATE` late (a slow GPU);
/// the straggler hold on or off. Every sum is checked bit for bit; returns
/// each rank's counters and its threads' (share 0's, then the lane's).
fn straggle(hold: bool) -> Vec<(WorkerStats, Vec<MemberStats>)> {
    const LATE: [u64; 3] = [60, 150, 100];
    let sw = stand_in(3, 2, 0, AuthMode::Port);
    let (n, len, iterations) = (3u16, 40_000, 6u32);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    cfg.threads = 2;
                    cfg.transport.straggler_hold = hold;
                    let mut w = Worker::join(cfg).expect("join");
                    let mut data = vec![0f32; len];
                    for it in 0..iterations {
                        if rank == 1 {
                            std::thread::sleep(Duration::from_millis(LATE[it as usize % 3]));
                        }
                        fill_pattern(rank, it, &mut data);
                        w.all_reduce(&mut data).expect("all_reduce");
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                expected_sum(n, it, i).to_bits(),
                                "rank {rank} it {it} elem {i} (hold {hold})"
                            );
                        }
                    }
                    assert_eq!(w.threads(), 2);
                    (w.stats(), w.share_stats())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A straggler with two threads per rank: the other ranks' lane threads
/// hold too. Each lane's probe goes out through thread 0's session, the
/// answer comes back to socket 0 and is handed to the lane, and the lane's
/// timeouts resend nothing while it says rank 1 is missing; thread 0 sends
/// no more HEARTBEATs than the probes of both threads and the stall watch
/// ask for. Without the lane's hold (share 0's only) the lane shares hold
/// nothing, and this fails.
#[test]
fn a_straggler_costs_the_other_ranks_lane_threads_fewer_resends() {
    let off = straggle(false);
    let on = straggle(true);
    let others = |ran: &[(WorkerStats, Vec<MemberStats>)], share: usize| {
        let mut t = (0, 0, 0);
        for (r, (_, shares)) in ran.iter().enumerate() {
            if r != 1 {
                let c = shares[share].chunks;
                t = (t.0 + c.resent, t.1 + c.probes, t.2 + c.held_timeouts);
            }
        }
        t
    };
    let (lane_off, lane_on) = (others(&off, 1), others(&on, 1));
    let (zero_off, zero_on) = (others(&off, 0), others(&on, 0));
    eprintln!(
        "ranks 0 and 2, (resent, probes, held): lane shares {lane_off:?} without the hold, \
         {lane_on:?} with it; share 0 {zero_off:?} without, {zero_on:?} with"
    );
    assert!(
        lane_on.1 > 0 && lane_on.2 > 0,
        "the lane threads held: {lane_on:?}"
    );
    assert_eq!(lane_off.1 + lane_off.2, 0, "no probes without the hold");
    assert!(
        lane_on.0 * 2 <= lane_off.0,
        "the lane threads resent {} chunks with the hold, {} without",
        lane_on.0,
        lane_off.0
    );
    for (r, (stats, shares)) in on.iter().enumerate() {
        // Every thread's probes and held timeouts are in the rank's report.
        let probes: u64 = shares.iter().map(|s| s.chunks.probes).sum();
        let held: u64 = shares.iter().map(|s| s.chunks.held_timeouts).sum();
        assert_eq!((stats.hold_probes, stats.held_timeouts), (probes, held));
        // One HEARTBEAT per probe, plus the stall watch's (one per 500 ms
        // without progress: none here, the straggler is 150 ms late at most).
        assert!(
            stats.heartbeats_sent <= probes,
            "rank {r}: {} HEARTBEATs for {probes} probes",
            stats.heartbeats_sent
        );
    }
}
