//! Switch restarts at exact points of the traffic, against
//! `worker::loopback`'s stand-in with a [`ScriptedRestart`] (no timer
//! decides where the restart lands): the states that only an end-to-end
//! run under faults reached by chance before.
//!
//! * The catch-up of the previous collective (docs/PROTOCOL.md, the resume
//!   point): the switch restarts while rank 0 is already on collective
//!   c + 1 and rank 1 still lacks RESULTs of collective c (the stand-in
//!   dropped them). Both rejoin; the new switch resumes at rank 1's hole in
//!   c, so rank 0 re-contributes c from there, its chunks before the
//!   resume point answered (the new switch's floor is there: it would never
//!   answer them). Every sum stays bit-exact, on 1 and 2 threads, and on a
//!   switch back with fewer lanes.
//! * Gradient statistics across a restart (docs/PROTOCOL.md, "Gradient
//!   statistics"): a `stats = true` collective cut by a restart, on the
//!   same lanes or on fewer (the rest of it on fewer threads), gets the
//!   reference statistics bit for bit on every rank. One whose job became
//!   `stats = true` at the restart has chunks that were never measured:
//!   `gradient_stats` says so ([`GradStatsError::Incomplete`]), and the
//!   next collective's statistics are whole.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use proto::member::{reference_grad_stats, Shape};
use proto::reference::{expected_sum, fill_pattern};
use worker::loopback::{LoopbackConfig, LoopbackSwitch, ScriptedRestart, Starve};
use worker::{GradStatsError, Worker, WorkerConfig, WorkerStats};

const SECRET: [u8; 32] = [0x6d; 32];
const ELEMS: u16 = 100;
/// Chunks per collective: collective k has seqs `k·CHUNKS..(k+1)·CHUNKS`
/// (a fresh stand-in resumes the first join at collective 0, seq 0).
const CHUNKS: u32 = 200;
const LEN: usize = CHUNKS as usize * ELEMS as usize;
const ITERATIONS: u32 = 4;

fn stand_in(n: u16, lanes: u16, stats: bool, script: ScriptedRestart) -> LoopbackSwitch {
    let mut cfg = LoopbackConfig::new(1, n, SECRET);
    cfg.elems_per_chunk = ELEMS;
    cfg.seq_lanes = lanes;
    cfg.stats = stats;
    cfg.script = Some(script);
    LoopbackSwitch::start(cfg, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// What one rank saw.
struct Ran {
    threads: usize,
    stats: WorkerStats,
}

/// Ranks of `threads[r]` threads each all-reduce [`ITERATIONS`] tensors of
/// [`LEN`], every element checked bit for bit against the rank-order sum,
/// and in a `stats = true` job every collective's gradient statistics
/// against [`reference_grad_stats`].
fn run(sw: &LoopbackSwitch, threads: &[usize], stats: bool) -> Vec<Ran> {
    let n = threads.len() as u16;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let addr = sw.addr();
                let t = threads[rank as usize];
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, n, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    cfg.threads = t;
                    let mut w = Worker::join(cfg).expect("join");
                    assert_eq!(w.next_seq(), (0, 0), "the script's seqs assume it");
                    let mut data = vec![0f32; LEN];
                    for it in 0..ITERATIONS {
                        fill_pattern(rank, it, &mut data);
                        if let Err(e) = w.all_reduce(&mut data) {
                            panic!("rank {rank} ({t} threads) collective {it}: {e}");
                        }
                        for (i, v) in data.iter().enumerate() {
                            assert_eq!(
                                v.to_bits(),
                                expected_sum(n, it, i).to_bits(),
                                "rank {rank} ({t} threads) collective {it} elem {i}"
                            );
                        }
                        if stats {
                            let got = w.gradient_stats().unwrap_or_else(|e| {
                                panic!("rank {rank} ({t} threads) collective {it}: {e}")
                            });
                            let want = reference(n, it);
                            assert!(
                                got.bits_eq(&want),
                                "rank {rank} ({t} threads) collective {it}: {got:?} != {want:?}"
                            );
                        }
                    }
                    Ran {
                        threads: w.threads(),
                        stats: w.stats(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The statistics every rank must get for collective `it` of `n` ranks.
fn reference(n: u16, it: u32) -> worker::GradStats {
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            let mut v = vec![0f32; LEN];
            fill_pattern(r, it, &mut v);
            v
        })
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    reference_grad_stats(Shape::all_reduce(LEN), ELEMS, &refs).unwrap()
}

/// The switch restarts when rank 0's first DATA of collective 2 arrives
/// (rank 0 has every RESULT of collective 1), after it dropped rank 1's
/// RESULT of collective 1's last chunk; `lanes`: the new switch's seq
/// lanes. Only the last: rank 1 has then sent every chunk of collective 1
/// (the switch completed it), where a hole further back could keep rank
/// 1's window from reaching the end of the collective, and rank 0 from
/// ever getting there. The resume point is that last chunk (or a little
/// before, if rank 1 had RESULTs still unread when it rejoined), so rank
/// 0's catch-up has nearly the whole collective before it.
fn catch_up_script(lanes: Option<u16>) -> ScriptedRestart {
    ScriptedRestart {
        at: (2, 2 * CHUNKS),
        lanes,
        stats: None,
        starve: Some(Starve {
            rank: 1,
            collective: 1,
            from_seq: 2 * CHUNKS - 1,
        }),
    }
}

/// A script whose restart never fires (the test restarts the stand-in
/// itself, or not at all): it only keeps `starve`'s RESULTs from its rank.
fn starving_only(starve: Option<Starve>) -> ScriptedRestart {
    ScriptedRestart {
        at: (u32::MAX, 0),
        lanes: None,
        stats: None,
        starve,
    }
}

/// The restart fired where the script put it: rank 1 had lost RESULTs of
/// collective 1, and both ranks rejoined.
fn assert_caught_up(sw: &LoopbackSwitch, ran: &[Ran], what: &str) {
    assert_eq!(sw.restarts(), 1, "{what}: the scripted restart fired once");
    assert!(
        sw.starved_results() > 0,
        "{what}: rank 1 lost RESULTs of collective 1"
    );
    for (r, ran) in ran.iter().enumerate() {
        assert!(ran.stats.rejoins >= 1, "{what} rank {r}: {:?}", ran.stats);
    }
}

/// One thread per rank: rank 0, a collective ahead, re-contributes
/// collective 1 from rank 1's hole; exact.
#[test]
fn a_rank_a_collective_ahead_catches_up_on_one_thread() {
    let sw = stand_in(2, 1, false, catch_up_script(None));
    let ran = run(&sw, &[1, 1], false);
    assert_caught_up(&sw, &ran, "T = 1");
}

/// The same on two threads per rank: every share of rank 0 counts its
/// chunks of collective 1 before the resume point as answered.
#[test]
fn a_rank_a_collective_ahead_catches_up_on_two_threads() {
    let sw = stand_in(2, 2, false, catch_up_script(None));
    let ran = run(&sw, &[2, 2], false);
    assert_caught_up(&sw, &ran, "T = 2");
    for r in &ran {
        assert_eq!(r.threads, 2);
    }
}

/// The same, the switch back with one seq lane: the catch-up, and the
/// collectives after it, run on one thread.
#[test]
fn a_rank_a_collective_ahead_catches_up_on_a_switch_back_with_fewer_lanes() {
    let sw = stand_in(2, 2, false, catch_up_script(Some(1)));
    let ran = run(&sw, &[2, 2], false);
    assert_caught_up(&sw, &ran, "T = 2 → 1");
    for r in &ran {
        assert_eq!(r.threads, 1);
    }
}

/// The catch-up in a `stats = true` job: rank 0's statistics of
/// collective 1 were taken before the restart, rank 1's come from the
/// trailers it had and the new switch's of the rest (on a switch back with
/// fewer lanes, its new share 0 keeps its old shares' trailers); both are
/// the reference's, as are every later collective's.
#[test]
fn statistics_stay_exact_through_the_catch_up() {
    for (t, lanes, after) in [(1, 1, None), (2, 2, None), (2, 2, Some(1))] {
        let sw = stand_in(2, lanes, true, catch_up_script(after));
        let ran = run(&sw, &[t, t], true);
        assert_caught_up(
            &sw,
            &ran,
            &format!("stats, T = {t}, lanes {lanes} → {after:?}"),
        );
    }
}

/// The switch restarts in the middle of collective 1 (at the first DATA of
/// its chunk 120, seq 320, share 0's on 1, 2 or 4 threads: its sender's
/// share 0 had every answer below chunk 120 − the window (64), so the
/// switch had sent every rank the RESULT of chunk 0, which precedes the
/// new switch's answers on socket 0: the resume point is past the first
/// chunk), then comes back with `lanes_after` seq lanes.
fn mid_collective(lanes_after: Option<u16>) -> ScriptedRestart {
    ScriptedRestart {
        at: (1, CHUNKS + 120),
        lanes: lanes_after,
        stats: None,
        starve: None,
    }
}

/// A `stats = true` collective cut by a restart keeps its statistics: on
/// one thread, on two over the same lanes, and on 4 threads of a switch
/// back with 2 lanes or 1 (the rest of the collective on fewer threads,
/// whose shares take the old shares' trailers of the chunks before the
/// resume point).
#[test]
fn statistics_stay_exact_through_a_restart_mid_collective() {
    for (t, lanes, after) in [
        (1, 1, None),
        (1, 4, Some(1)),
        (2, 2, None),
        (4, 4, Some(2)),
        (4, 4, Some(1)),
    ] {
        let what = format!("T = {t}, lanes {lanes} → {after:?}");
        let sw = stand_in(2, lanes, true, mid_collective(after));
        let ran = run(&sw, &[t, t], true);
        assert_eq!(sw.restarts(), 1, "{what}");
        for r in &ran {
            assert!(r.stats.rejoins >= 1, "{what}: {:?}", r.stats);
            let want = if t == 1 {
                1
            } else {
                usize::from(after.unwrap_or(lanes))
            };
            assert_eq!(r.threads, want, "{what}");
        }
    }
}

/// A job declared `stats = true` at a switch restart in the middle of
/// collective 1 (an operator changed its declaration): collective 0 has no
/// statistics (not a stats job then), collective 1 is summed but its chunks
/// before the resume point were never measured (`Incomplete`, which names
/// it; not `NotSummed`, which says all-gather), collective 2's are the
/// reference's; on one thread and on two.
#[test]
fn statistics_turned_on_by_a_restart_mid_collective_are_incomplete_then_whole() {
    for t in [1, 2] {
        let script = ScriptedRestart {
            stats: Some(true),
            ..mid_collective(None)
        };
        let sw = stand_in(2, 2, false, script);
        let got: Vec<Vec<Result<worker::GradStats, GradStatsError>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2u16)
                .map(|rank| {
                    let addr = sw.addr();
                    s.spawn(move || {
                        let mut cfg = WorkerConfig::new(addr, 1, rank, 2, SECRET);
                        cfg.join_timeout = Duration::from_secs(20);
                        cfg.threads = t;
                        let mut w = Worker::join(cfg).expect("join");
                        let mut data = vec![0f32; LEN];
                        (0..3)
                            .map(|it| {
                                fill_pattern(rank, it, &mut data);
                                w.all_reduce(&mut data).expect("all_reduce");
                                for (i, v) in data.iter().enumerate() {
                                    assert_eq!(v.to_bits(), expected_sum(2, it, i).to_bits());
                                }
                                w.gradient_stats()
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(sw.restarts(), 1, "T = {t}");
        for (rank, g) in got.iter().enumerate() {
            let rank = rank as u16;
            assert_eq!(g[0], Err(GradStatsError::NotAStatsJob { job: 1, rank }));
            let e = g[1].unwrap_err();
            assert_eq!(
                e,
                GradStatsError::Incomplete {
                    job: 1,
                    rank,
                    collective: 1
                },
                "T = {t}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("collective 1 was summed") && msg.contains("switch restarted"),
                "{msg}"
            );
            let want = reference(2, 2);
            let whole = g[2].expect("collective 2 is measured whole");
            assert!(
                whole.bits_eq(&want),
                "T = {t} rank {rank}: {whole:?} != {want:?}"
            );
        }
    }
}

/// A collective that failed does not replace the kept input of the last
/// one that completed: rank 0 completes collective 1, then its collective
/// 2 (other values) stalls, since rank 1 still waits for collective 1's
/// last RESULT (the stand-in drops it). The switch restarts and resumes at
/// rank 1's hole in collective 1: rank 0's catch-up must send collective
/// 1's values, not those of the collective that failed. Then rank 0 runs
/// collective 2 again, and every sum of both ranks is exact. The failed
/// collective's input stays what `last_input` gives (a host path's).
#[test]
fn a_failed_collective_keeps_the_last_completed_input_for_a_catch_up() {
    let starve = catch_up_script(None).starve;
    let sw = stand_in(2, 1, false, starving_only(starve));
    let restart = sw.restarter();
    let stalled = std::thread::scope(|s| {
        let addr = sw.addr();
        let rank0 = s.spawn(move || {
            let (mut w, mut data) = exact_collectives(addr, 0, 2, Duration::from_secs(1));
            // Values of no collective: any of them in a sum shows.
            fill_pattern(0, 77, &mut data);
            let sent = data.clone();
            let e = w
                .all_reduce(&mut data)
                .expect_err("rank 1 never sends collective 2");
            // What a host path redoes the failed collective from.
            assert!(
                w.last_input() == bytemuck::cast_slice::<f32, u8>(&sent),
                "last_input is the failed collective's input"
            );
            restart();
            fill_pattern(0, 2, &mut data);
            w.all_reduce(&mut data).expect("rank 0, collective 2 again");
            assert_exact(0, 2, &data);
            e
        });
        let rank1 = s.spawn(move || exact_collectives(addr, 1, 3, Duration::from_secs(30)));
        rank1.join().unwrap();
        rank0.join().unwrap()
    });
    assert!(
        matches!(stalled, worker::WorkerError::Stalled { collective: 2, .. }),
        "{stalled}"
    );
    assert_eq!(sw.restarts(), 1);
    assert!(
        sw.starved_results() > 0,
        "rank 1 lost collective 1's last RESULT"
    );
}

/// Rank `rank` of 2 joins (a stall fails its collective after `stall`)
/// and runs `count` exact all-reduces; the worker and its tensor.
fn exact_collectives(
    addr: SocketAddrV4,
    rank: u16,
    count: u32,
    stall: Duration,
) -> (Worker, Vec<f32>) {
    let mut cfg = WorkerConfig::new(addr, 1, rank, 2, SECRET);
    cfg.join_timeout = Duration::from_secs(20);
    cfg.stall_timeout = stall;
    let mut w = Worker::join(cfg).expect("join");
    let mut data = vec![0f32; LEN];
    for it in 0..count {
        fill_pattern(rank, it, &mut data);
        w.all_reduce(&mut data)
            .unwrap_or_else(|e| panic!("rank {rank} collective {it}: {e}"));
        assert_exact(rank, it, &data);
    }
    (w, data)
}

fn assert_exact(rank: u16, it: u32, data: &[f32]) {
    for (i, v) in data.iter().enumerate() {
        assert_eq!(
            v.to_bits(),
            expected_sum(2, it, i).to_bits(),
            "rank {rank} collective {it} elem {i}"
        );
    }
}

/// A failed all-reduce whose RESULTs had written part of the tensor: rank
/// 0 gets no RESULT from chunk 100 on (the stand-in drops them), so it
/// stalls with chunks 0..100 summed in its tensor and the chunks past its
/// window never sent. `last_input` is still its whole input, bit for bit:
/// the chunks it sent were kept before their RESULTs came, the rest are
/// kept from the tensor when the collective ends.
#[test]
fn a_failed_all_reduce_leaves_its_whole_input_for_a_host_path() {
    let starve = Starve {
        rank: 0,
        collective: 0,
        from_seq: 100,
    };
    let sw = stand_in(2, 1, false, starving_only(Some(starve)));
    std::thread::scope(|s| {
        let addr = sw.addr();
        let ranks: Vec<_> = (0..2u16)
            .map(|rank| {
                s.spawn(move || {
                    let mut cfg = WorkerConfig::new(addr, 1, rank, 2, SECRET);
                    cfg.join_timeout = Duration::from_secs(20);
                    cfg.stall_timeout = Duration::from_secs(1);
                    let mut w = Worker::join(cfg).expect("join");
                    let mut data = vec![0f32; LEN];
                    fill_pattern(rank, 0, &mut data);
                    let sent = data.clone();
                    let r = w.all_reduce(&mut data);
                    (rank, r.is_err(), sent, data, w.last_input().to_vec())
                })
            })
            .collect();
        for h in ranks {
            let (rank, failed, sent, data, last) = h.join().unwrap();
            if rank != 0 {
                continue;
            }
            assert!(failed, "rank 0 lacks RESULTs from chunk 100 on");
            let e = usize::from(ELEMS);
            assert!(
                (0..100 * e).all(|i| data[i].to_bits() == expected_sum(2, 0, i).to_bits()),
                "chunks 0..100 were summed in the tensor"
            );
            assert!(
                last == bytemuck::cast_slice::<f32, u8>(&sent),
                "last_input is the whole input"
            );
        }
    });
    assert!(sw.starved_results() > 0);
}
