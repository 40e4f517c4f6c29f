//! Model checks of the slot engine (loom explores every interleaving up to
//! LOOM_MAX_PREEMPTIONS). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p agg-proto --lib engine`.
//! Each checks the published sum's bits against the rank-order reference
//! and that exactly one caller completed the slot.

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::reference;

/// Values whose float32 sum depends on the order: 2^24 + 1 + 1 is 2^24 in
/// rank order, 2^24 + 2 in another.
const VALUES: [f32; 3] = [16_777_216.0, 1.0, 1.0];

fn bytes(v: f32) -> [u8; 4] {
    v.to_le_bytes()
}

fn send(e: &SlotEngine, seq: u32, rank: u16, v: f32) -> Contributed {
    let b = bytes(v);
    e.contribute(&Contribution {
        seq,
        rank,
        collective: 0,
        count: 1,
        kind: Kind::AllReduce,
        owner: 0,
        noval: false,
        values: &b,
        ce: false,
    })
}

fn rank_order(values: &[f32]) -> u32 {
    let inputs: Vec<[f32; 1]> = values.iter().map(|v| [*v]).collect();
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    reference::rank_order_sum(&refs)[0].to_bits()
}

fn result_bits(e: &SlotEngine, seq: u32) -> Option<u32> {
    e.with_result(seq, |sh, b| {
        assert_eq!(sh.seq, seq);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    })
}

fn completions(outs: &[Contributed]) -> usize {
    outs.iter()
        .filter(|o| matches!(o, Contributed::Completed { .. }))
        .count()
}

/// Ranks 0..n each on its own thread, one slot.
fn ranks_race(n: u16) {
    loom::model(move || {
        let e = Arc::new(SlotEngine::try_new(1, n, 1, Dtype::F32, false, 1).unwrap());
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let e = e.clone();
                thread::spawn(move || send(&e, 0, r, VALUES[r as usize]))
            })
            .collect();
        let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(completions(&outs), 1, "{outs:?}");
        assert!(outs
            .iter()
            .all(|o| matches!(o, Contributed::Taken | Contributed::Completed { .. })));
        assert_eq!(result_bits(&e, 0), Some(rank_order(&VALUES[..n as usize])));
        assert_eq!(e.floor(), 1);
    });
}

#[test]
fn engine_loom_two_ranks_on_two_threads() {
    ranks_race(2);
}

#[test]
fn engine_loom_three_ranks_on_three_threads() {
    ranks_race(3);
}

/// A stats engine, three ranks on three threads: the trailer's sum of
/// squares is added in rank order whoever folds (1.5², 1.5², then 2^54 is
/// 2^54 + 4; 2^54 first would give 2^54 + 8), and the rank whose row is
/// its scratch never races the folder.
#[test]
fn engine_loom_statistics_fold_in_rank_order() {
    const V: [f32; 3] = [1.5, 1.5, 134_217_728.0];
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_with_stats(1, 3, 1, Dtype::F32, false, 1, true).unwrap());
        let handles: Vec<_> = (0..3u16)
            .map(|r| {
                let e = e.clone();
                thread::spawn(move || send(&e, 0, r, V[r as usize]))
            })
            .collect();
        let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(completions(&outs), 1, "{outs:?}");
        let s = e.result(0).unwrap().stats().unwrap();
        let inputs: Vec<[f32; 1]> = V.iter().map(|v| [*v]).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = crate::stats::chunk_stats(&refs, &reference::rank_order_sum(&refs));
        assert_eq!(want.sum_of_squares, 18_014_398_509_481_988.0);
        assert!(s.bits_eq(&want), "{s:?} {want:?}");
    });
}

/// A duplicate of the completing rank races it: one is taken, the other is
/// a Duplicate or answered from the shadow; the sum is right.
#[test]
fn engine_loom_duplicate_races_the_completion() {
    for first in [0u16, 1] {
        loom::model(move || {
            let e = Arc::new(SlotEngine::try_new(1, 2, 1, Dtype::F32, false, 1).unwrap());
            assert_eq!(
                send(&e, 0, first, VALUES[first as usize]),
                Contributed::Taken
            );
            let other = 1 - first;
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let e = e.clone();
                    thread::spawn(move || send(&e, 0, other, VALUES[other as usize]))
                })
                .collect();
            let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(completions(&outs), 1, "{outs:?}");
            assert!(outs.iter().any(|o| matches!(
                o,
                Contributed::Dropped(DropReason::Duplicate) | Contributed::Retransmit { seq: 0 }
            )));
            assert_eq!(result_bits(&e, 0), Some(rank_order(&VALUES[..2])));
        });
    }
}

fn pair(v: [f32; 2]) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&v[0].to_le_bytes());
    b[4..].copy_from_slice(&v[1].to_le_bytes());
    b
}

fn contribute(e: &SlotEngine, seq: u32, rank: u16, v: [f32; 2]) -> Contributed {
    let b = pair(v);
    e.contribute(&Contribution {
        seq,
        rank,
        collective: 0,
        count: 2,
        kind: Kind::AllReduce,
        owner: 0,
        noval: false,
        values: &b,
        ce: false,
    })
}

/// A resend of seq 0 is answered from the shadow while seq 1 (S = 1)
/// completes in the same slot: the reader sees seq 0's whole result or
/// nothing, never seq 1's or a mix.
#[test]
fn engine_loom_resend_reads_the_shadow_while_the_slot_is_reused() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 2, 2, Dtype::F32, false, 1).unwrap());
        let old = [[1.0f32, 2.0], [4.0, 8.0]];
        let new = [[16.0f32, 32.0], [64.0, 128.0]];
        contribute(&e, 0, 0, old[0]);
        contribute(&e, 0, 1, old[1]);
        let handles: Vec<_> = (0..2u16)
            .map(|r| {
                let e = e.clone();
                thread::spawn(move || contribute(&e, 1, r, new[r as usize]))
            })
            .collect();
        let seen = e.with_result(0, |sh, b| (sh.seq, b.to_vec()));
        if let Some((seq, b)) = seen {
            assert_eq!(seq, 0);
            assert_eq!(b, pair([5.0, 10.0]), "seq 0's result, whole");
        }
        let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(completions(&outs), 1, "{outs:?}");
        assert_eq!(
            e.with_result(1, |_, b| b.to_vec()),
            Some(pair([80.0, 160.0]).to_vec())
        );
        assert!(e.with_result(0, |_, _| ()).is_none());
    });
}

/// A reset races the completion of the old activation's seq 0 (whose
/// rank 0 folds rank 1's parked row), and the new activation's rank 1
/// races to write that row; then the new activation sums seq 0 again: its
/// result holds no value of the old one.
#[test]
fn engine_loom_reset_races_a_completion() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 2, 1, Dtype::F32, false, 1).unwrap());
        assert_eq!(send(&e, 0, 1, 200.0), Contributed::Taken);
        let old = {
            let e = e.clone();
            thread::spawn(move || send(&e, 0, 0, 100.0))
        };
        let fresh = {
            let e = e.clone();
            thread::spawn(move || {
                e.reset(0);
                send(&e, 0, 1, 2.0)
            })
        };
        let old_out = old.join().unwrap();
        if fresh.join().unwrap() == Contributed::Dropped(DropReason::SlotBusy) {
            // The old activation still held the row or the accumulator: resend.
            assert_eq!(send(&e, 0, 1, 2.0), Contributed::Taken);
        }
        match result_bits(&e, 0) {
            // Rank 0's DATA came after the reset: it counts in the new
            // activation, with the new rank 1.
            Some(bits) => {
                assert!(matches!(
                    old_out,
                    Contributed::Taken | Contributed::Completed { .. }
                ));
                assert_eq!(bits, 102f32.to_bits());
            }
            // It belonged to the old activation (completed or discarded):
            // nothing of it is seen after the reset.
            None => {
                assert!(
                    matches!(
                        old_out,
                        Contributed::Completed { .. } | Contributed::Dropped(DropReason::Stale)
                    ),
                    "{old_out:?}"
                );
                assert_eq!(e.floor(), 0, "the reset's floor");
                assert_eq!(
                    send(&e, 0, 0, 1.0),
                    Contributed::Completed { seq: 0, ece: false }
                );
                assert_eq!(result_bits(&e, 0), Some(3f32.to_bits()));
            }
        }
        assert_eq!(e.floor(), 1);
    });
}

/// Two seqs of neighbouring slots complete at once (one rank, so each
/// contribution completes its seq): the floor moves over both, whichever
/// thread publishes first.
#[test]
fn engine_loom_neighbouring_completions_move_the_floor_over_both() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(2, 1, 1, Dtype::F32, false, 2).unwrap());
        let handles: Vec<_> = (0..2u32)
            .map(|seq| {
                let e = e.clone();
                thread::spawn(move || send(&e, seq, 0, VALUES[seq as usize]))
            })
            .collect();
        for (seq, h) in handles.into_iter().enumerate() {
            let seq = seq as u32;
            assert_eq!(
                h.join().unwrap(),
                Contributed::Completed { seq, ece: false }
            );
        }
        assert_eq!(e.floor(), 2);
    });
}

/// A reset races an old activation's contribution that parks its row (rank
/// 1 before rank 0): the new activation's rank 0 never sums that row.
#[test]
fn engine_loom_reset_races_a_parked_row() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 2, 1, Dtype::F32, false, 1).unwrap());
        let old = {
            let e = e.clone();
            thread::spawn(move || send(&e, 0, 1, 200.0))
        };
        let fresh = {
            let e = e.clone();
            thread::spawn(move || {
                e.reset(0);
                send(&e, 0, 0, 1.0)
            })
        };
        let old_out = old.join().unwrap();
        let fresh_out = fresh.join().unwrap();
        match result_bits(&e, 0) {
            // Rank 1's DATA came after the reset: it counts with the new rank 0.
            Some(bits) => {
                assert!(matches!(
                    old_out,
                    Contributed::Taken | Contributed::Completed { .. }
                ));
                assert_eq!(bits, 201f32.to_bits());
            }
            None => {
                if fresh_out == Contributed::Dropped(DropReason::SlotBusy) {
                    assert_eq!(send(&e, 0, 0, 1.0), Contributed::Taken);
                }
                assert_eq!(
                    send(&e, 0, 1, 2.0),
                    Contributed::Completed { seq: 0, ece: false }
                );
                assert_eq!(result_bits(&e, 0), Some(3f32.to_bits()));
            }
        }
        assert_eq!(e.floor(), 1);
    });
}

/// A DATA admitted under the activation a reset ends (its admission
/// snapshot named the old epoch: `contribute_admitted`) races that reset:
/// it lands in the old activation or is dropped as Stale, never in the new
/// one, whose sum holds only its own contributions.
#[test]
fn engine_loom_data_admitted_before_a_reset_never_reaches_the_next_activation() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 2, 1, Dtype::F32, false, 1).unwrap());
        let admitted = e.epoch();
        let old = {
            let e = e.clone();
            thread::spawn(move || {
                let b = bytes(100.0);
                let c = Contribution {
                    seq: 0,
                    rank: 0,
                    collective: 0,
                    count: 1,
                    kind: Kind::AllReduce,
                    owner: 0,
                    noval: false,
                    values: &b,
                    ce: false,
                };
                e.contribute_admitted(&c, admitted)
            })
        };
        let resetter = {
            let e = e.clone();
            thread::spawn(move || e.reset(0))
        };
        let old_out = old.join().unwrap();
        resetter.join().unwrap();
        assert!(
            matches!(
                old_out,
                Contributed::Taken | Contributed::Dropped(DropReason::Stale)
            ),
            "{old_out:?}"
        );
        assert_ne!(e.epoch(), admitted);
        assert_eq!(send(&e, 0, 0, 1.0), Contributed::Taken);
        assert_eq!(
            send(&e, 0, 1, 2.0),
            Contributed::Completed { seq: 0, ece: false }
        );
        assert_eq!(result_bits(&e, 0), Some(3f32.to_bits()));
    });
}

/// An all-gather: the owner (rank 1, not yet due when it comes first) parks
/// its bytes in its row while the other ranks' NOVAL arrivals, which write
/// nothing, race it to the fold token. Exactly one caller completes, and
/// the result is the owner's bytes (a signalling NaN) unchanged.
#[test]
fn engine_loom_noval_arrivals_race_the_owners_values() {
    const SNAN: u32 = 0x7f80_0001;
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 3, 1, Dtype::F32, false, 1).unwrap());
        let handles: Vec<_> = (0..3u16)
            .map(|r| {
                let e = e.clone();
                thread::spawn(move || {
                    let b = SNAN.to_le_bytes();
                    let owner = r == 1;
                    e.contribute(&Contribution {
                        seq: 0,
                        rank: r,
                        collective: 0,
                        count: 1,
                        kind: Kind::AllGather,
                        owner: 1,
                        noval: !owner,
                        values: if owner { &b } else { &[] },
                        ce: false,
                    })
                })
            })
            .collect();
        let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(completions(&outs), 1, "{outs:?}");
        assert_eq!(result_bits(&e, 0), Some(SNAN));
        assert_eq!(e.floor(), 1);
    });
}

/// A reduce-scatter whose owner (rank 0) keeps its shard: its NOVAL
/// arrival races the other ranks' values, so whichever of ranks 1 and 2
/// folds first must start the sum (copy, not add to what the accumulator
/// held before: the slot's earlier sums, 2^24). The result is rank 1 +
/// rank 2 in rank order, and rank 0's value never enters it.
#[test]
fn engine_loom_a_kept_shard_races_the_other_ranks_values() {
    loom::model(|| {
        let e = Arc::new(SlotEngine::try_new(1, 3, 1, Dtype::F32, false, 1).unwrap());
        // Two all-reduces first: the result buffers swap, so the
        // accumulator then holds seq 0's sum.
        for seq in 0..2 {
            for r in 0..3u16 {
                send(&e, seq, r, VALUES[r as usize]);
            }
        }
        let handles: Vec<_> = (0..3u16)
            .map(|r| {
                let e = e.clone();
                thread::spawn(move || {
                    let b = bytes(VALUES[r as usize]);
                    let kept = r == 0;
                    e.contribute(&Contribution {
                        seq: 2,
                        rank: r,
                        collective: 0,
                        count: 1,
                        kind: Kind::ReduceScatter,
                        owner: 0,
                        noval: kept,
                        values: if kept { &[] } else { &b },
                        ce: false,
                    })
                })
            })
            .collect();
        let outs: Vec<Contributed> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(completions(&outs), 1, "{outs:?}");
        assert_eq!(result_bits(&e, 2), Some(rank_order(&VALUES[1..])));
        assert_eq!(e.floor(), 3);
    });
}

/// A reset races completions in two seq lanes (one rank, so each DATA
/// completes its seq): every lane ends in the reset's activation, at its
/// first seq from the reset point, so no old floor advance lands in the
/// new activation, and the new seqs complete with their own values.
#[test]
fn engine_loom_a_reset_races_completions_in_two_lanes() {
    loom::model(|| {
        let e = Arc::new(
            SlotEngine::try_new(4, 1, 1, Dtype::F32, false, 4)
                .unwrap()
                .try_with_lanes(2)
                .unwrap(),
        );
        let handles: Vec<_> = (0..2u32)
            .map(|seq| {
                let e = e.clone();
                thread::spawn(move || send(&e, seq, 0, VALUES[seq as usize]))
            })
            .collect();
        e.reset(4);
        for h in handles {
            let out = h.join().unwrap();
            assert!(
                matches!(
                    out,
                    Contributed::Completed { .. } | Contributed::Dropped(DropReason::Stale)
                ),
                "{out:?}"
            );
        }
        assert_eq!(e.floor(), 4);
        assert_eq!(e.epoch_of(0), e.epoch_of(1), "one activation in both lanes");
        for seq in [5u32, 4] {
            assert_eq!(
                send(&e, seq, 0, 3.0),
                Contributed::Completed { seq, ece: false }
            );
            assert_eq!(result_bits(&e, seq), Some(3f32.to_bits()));
        }
        assert_eq!(e.floor(), 6);
    });
}
