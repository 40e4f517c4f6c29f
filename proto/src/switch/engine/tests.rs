//! Tests of the slot engine on one thread (every drop reason, leaf partials,
//! reset, arrival orders against the reference and the old pool) and on
//! several (stress: every result compared bit for bit).

use std::sync::{Arc, Mutex};

use super::*;
use crate::checksum::Sum;
use crate::reference;

/// xorshift64*: deterministic pseudo-random numbers for the tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Rank `rank`'s element `i` of `seq`: magnitudes far apart, so that a sum
/// in another order would differ in its bits.
fn value(rank: u16, seq: u32, i: usize) -> f32 {
    let h = mix((u64::from(rank) << 48) ^ (u64::from(seq) << 16) ^ i as u64);
    let mant = 1.0 + (h & 0xffff) as f32 / 65536.0;
    let exp = ((h >> 16) % 14) as i32 - 7;
    let sign = if h >> 40 & 1 == 1 { -1.0 } else { 1.0 };
    sign * mant * 2f32.powi(exp)
}

/// The payload rank `rank` sends for `seq`: `count` elements of `dtype`.
fn payload(dtype: Dtype, rank: u16, seq: u32, count: u16) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count as usize {
        let v = value(rank, seq, i);
        match dtype {
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
        }
    }
    out
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// The payload inputs widened to float32, summed in rank order (a leaf's
/// partial, and a float32 job's result).
fn f32_sum(dtype: Dtype, n: u16, seq: u32, count: u16) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            let p = payload(dtype, r, seq, count);
            let mut out = vec![0f32; count as usize];
            elements::read_le(dtype, &p, &mut out);
            out
        })
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    reference::rank_order_sum(&refs)
}

/// The RESULT payload `reference` says seq's sum must be.
fn expected(dtype: Dtype, n: u16, seq: u32, count: u16) -> Vec<u8> {
    if dtype == Dtype::F32 {
        return f32_sum(dtype, n, seq, count)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    let inputs: Vec<Vec<u16>> = (0..n)
        .map(|r| u16s(&payload(dtype, r, seq, count)))
        .collect();
    let refs: Vec<&[u16]> = inputs.iter().map(|v| v.as_slice()).collect();
    reference::rank_order_sum_half(dtype, &refs)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// The RESULT payload of a `stats` engine: the reference values, then the
/// reference trailer ([`crate::stats::chunk_stats`] of the widened inputs
/// and their float32 rank-order sum).
fn expected_with_stats(dtype: Dtype, n: u16, seq: u32, count: u16) -> Vec<u8> {
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            let mut out = vec![0f32; count as usize];
            elements::read_le(dtype, &payload(dtype, r, seq, count), &mut out);
            out
        })
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let s = crate::stats::chunk_stats(&refs, &f32_sum(dtype, n, seq, count));
    let mut out = expected(dtype, n, seq, count);
    let mut t = [0u8; STATS_LEN];
    s.emit(&mut t).unwrap();
    out.extend_from_slice(&t);
    out
}

fn contribution(values: &[u8], seq: u32, rank: u16, count: u16) -> Contribution<'_> {
    Contribution {
        seq,
        rank,
        collective: 0,
        count,
        kind: Kind::AllReduce,
        owner: 0,
        noval: false,
        values,
        ce: false,
    }
}

fn send(e: &SlotEngine, dtype: Dtype, seq: u32, rank: u16, count: u16) -> Contributed {
    let p = payload(dtype, rank, seq, count);
    e.contribute(&contribution(&p, seq, rank, count))
}

/// A leaf's spine answer: the partial's float32 values, as bytes.
fn spine_answer(e: &SlotEngine, seq: u32) -> Vec<u8> {
    e.with_partial(seq, |_, v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .expect("the partial is held")
}

fn result_of(e: &SlotEngine, seq: u32) -> Option<Vec<u8>> {
    e.with_result(seq, |sh, b| {
        assert_eq!(sh.seq, seq);
        b.to_vec()
    })
}

const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

#[test]
fn every_arrival_order_gives_the_reference_bits() {
    for dtype in DTYPES {
        for leaf in [false, true] {
            let (n, slots) = (5u16, 4u16);
            let e = SlotEngine::try_new(slots, n, 9, dtype, leaf, slots).unwrap();
            let mut rng = Rng(7 + dtype as u64);
            for seq in 0..60u32 {
                let count = 1 + (seq % 9) as u16;
                let mut order: Vec<u16> = (0..n).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i + 1));
                }
                let mut completions = 0;
                for (i, &r) in order.iter().enumerate() {
                    match send(&e, dtype, seq, r, count) {
                        Contributed::Taken => assert!(i + 1 < n as usize),
                        Contributed::Completed { seq: s, ece } => {
                            assert!(!leaf && s == seq && !ece);
                            completions += 1;
                        }
                        Contributed::PartialReady { seq: s } => {
                            assert!(leaf && s == seq);
                            completions += 1;
                        }
                        other => panic!("{dtype:?} seq {seq} rank {r}: {other:?}"),
                    }
                    // A duplicate of a rank already in changes nothing.
                    let again = order[rng.below(i + 1)];
                    let dup = send(&e, dtype, seq, again, count);
                    assert!(
                        matches!(
                            dup,
                            Contributed::Dropped(DropReason::Duplicate)
                                | Contributed::Retransmit { .. }
                        ),
                        "{dup:?}"
                    );
                }
                assert_eq!(completions, 1);
                if leaf {
                    let partial = e.with_partial(seq, |_, v| v.to_vec()).unwrap();
                    let want = f32_sum(dtype, n, seq, count);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&partial), bits(&want), "{dtype:?} partial {seq}");
                    assert_eq!(e.floor(), seq, "a partial does not move the floor");
                    assert!(e.finish_partial(seq, &spine_answer(&e, seq), false));
                }
                assert_eq!(
                    result_of(&e, seq).unwrap(),
                    expected(dtype, n, seq, count),
                    "{dtype:?} leaf {leaf} seq {seq}"
                );
                assert_eq!(e.floor(), seq + 1);
            }
        }
    }
}

/// The checksum sum recorded with a result is its payload's, whether the
/// result was summed here or came from a spine.
#[test]
fn a_result_records_its_payloads_checksum_sum() {
    for dtype in DTYPES {
        for leaf in [false, true] {
            let e = SlotEngine::try_new(4, 2, 8, dtype, leaf, 4).unwrap();
            for seq in 0..6u32 {
                let count = 5;
                assert_eq!(send(&e, dtype, seq, 1, count), Contributed::Taken);
                send(&e, dtype, seq, 0, count);
                if leaf {
                    let spine: Vec<u8> = (0..count * 4).map(|i| (i as u8) ^ seq as u8).collect();
                    assert!(e.finish_partial(seq, &spine, false));
                }
                let (sum, bytes) = e
                    .with_result(seq, |sh, b| (sh.payload_sum, b.to_vec()))
                    .unwrap();
                assert_eq!(bytes.len(), dtype.payload_len(count));
                assert_eq!(
                    sum,
                    Sum::ZERO.add_bytes(&bytes).fold(),
                    "{dtype:?} {leaf} {seq}"
                );
            }
        }
    }
}

#[test]
fn each_drop_reason_is_reported() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(4, 2, 4, d, false, 2).unwrap();
    let drop = |r| Contributed::Dropped(r);
    assert_eq!(send(&e, d, 2, 0, 3), drop(DropReason::BeyondWindow));
    assert_eq!(send(&e, d, 0, 0, 3), Contributed::Taken);
    assert_eq!(send(&e, d, 0, 0, 3), drop(DropReason::Duplicate));
    assert_eq!(send(&e, d, 0, 1, 2), drop(DropReason::CountMismatch));
    assert_eq!(send(&e, d, 0, 1, 5), drop(DropReason::CountMismatch));
    assert_eq!(send(&e, d, 0, 2, 3), drop(DropReason::RankOutOfRange));
    let p = payload(d, 1, 0, 3);
    let mut c = contribution(&p, 0, 1, 3);
    c.collective = 9;
    assert_eq!(e.contribute(&c), drop(DropReason::CollectiveMismatch));
    c.collective = 0;
    c.values = &p[..11];
    assert_eq!(e.contribute(&c), drop(DropReason::PayloadLength));
    // None of those was counted: rank 1 still completes seq 0.
    assert_eq!(
        send(&e, d, 0, 1, 3),
        Contributed::Completed { seq: 0, ece: false }
    );
    assert_eq!(send(&e, d, 0, 0, 3), Contributed::Retransmit { seq: 0 });
    e.set_window(40);
    assert_eq!(e.window(), 4, "the window is at most the slots");
    for seq in 1..4 {
        for r in 0..2 {
            send(&e, d, seq, r, 3);
        }
    }
    assert_eq!(e.floor(), 4);
    assert_eq!(send(&e, d, 8, 0, 3), drop(DropReason::BeyondWindow));
    assert_eq!(send(&e, d, 7, 0, 3), Contributed::Taken);
    assert_eq!(send(&e, d, 3, 0, 3), Contributed::Retransmit { seq: 3 });
    // Once seq 4 replaces seq 0's shadow, nothing is left to answer seq 0.
    assert_eq!(send(&e, d, 0, 0, 3), Contributed::Retransmit { seq: 0 });
    send(&e, d, 4, 0, 3);
    send(&e, d, 4, 1, 3);
    assert_eq!(send(&e, d, 0, 0, 3), drop(DropReason::Stale));
}

#[test]
fn the_floor_moves_over_results_completed_out_of_order() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(2, 2, 4, d, false, 2).unwrap();
    assert_eq!(send(&e, d, 0, 0, 1), Contributed::Taken);
    assert_eq!(send(&e, d, 1, 0, 1), Contributed::Taken);
    assert_eq!(
        send(&e, d, 1, 1, 1),
        Contributed::Completed { seq: 1, ece: false }
    );
    assert_eq!(e.floor(), 0, "seq 0 holds the floor");
    assert_eq!(
        send(&e, d, 2, 0, 1),
        Contributed::Dropped(DropReason::BeyondWindow)
    );
    assert_eq!(
        send(&e, d, 0, 1, 1),
        Contributed::Completed { seq: 0, ece: false }
    );
    assert_eq!(e.floor(), 2, "the floor moved over seq 1's shadow too");
    // Seq 2 reuses slot 0 while seq 0's shadow still answers resends.
    assert_eq!(send(&e, d, 2, 0, 1), Contributed::Taken);
    assert_eq!(send(&e, d, 0, 0, 1), Contributed::Retransmit { seq: 0 });
    assert_eq!(result_of(&e, 0).unwrap(), expected(d, 2, 0, 1));
}

/// With W ≤ S a slot never holds two live seqs of one activation, so
/// SlotBusy comes from work of an older activation still in flight (a row
/// being written, the fold token held); on one thread, set those by hand.
#[test]
fn slot_busy_while_an_old_activation_is_in_flight() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(2, 2, 4, d, false, 2).unwrap();
    lock(&e.slots[0].meta).writing.insert(1);
    assert_eq!(
        send(&e, d, 0, 1, 1),
        Contributed::Dropped(DropReason::SlotBusy)
    );
    assert_eq!(
        send(&e, d, 0, 0, 1),
        Contributed::Taken,
        "other rows are free"
    );
    lock(&e.slots[0].meta).writing.remove(1);
    assert_eq!(
        send(&e, d, 0, 1, 1),
        Contributed::Completed { seq: 0, ece: false }
    );
    let old = lock(&e.slots[1].meta).epoch;
    e.reset(1);
    lock(&e.slots[1].meta).folding = Some(old);
    assert_eq!(
        send(&e, d, 1, 0, 1),
        Contributed::Dropped(DropReason::SlotBusy)
    );
    assert_eq!(
        send(&e, d, 1, 1, 1),
        Contributed::Dropped(DropReason::SlotBusy)
    );
    lock(&e.slots[1].meta).folding = None;
    assert_eq!(send(&e, d, 1, 1, 1), Contributed::Taken);
    assert_eq!(
        send(&e, d, 1, 0, 1),
        Contributed::Completed { seq: 1, ece: false }
    );
    assert_eq!(result_of(&e, 1).unwrap(), expected(d, 2, 1, 1));
}

#[test]
fn ce_marks_the_result() {
    let d = Dtype::Bf16;
    let e = SlotEngine::try_new(2, 2, 4, d, false, 2).unwrap();
    let p = payload(d, 1, 0, 2);
    let mut c = contribution(&p, 0, 1, 2);
    c.ce = true;
    assert_eq!(e.contribute(&c), Contributed::Taken);
    assert_eq!(
        send(&e, d, 0, 0, 2),
        Contributed::Completed { seq: 0, ece: true }
    );
    assert!(e.shadow(0).unwrap().ece);
}

#[test]
fn missing_and_state_follow_the_slot() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(2, 3, 4, d, false, 2).unwrap();
    let missing = |seq| {
        let mut v = Vec::new();
        e.missing(seq, |r| v.push(r));
        v
    };
    assert_eq!(missing(0), [0, 1, 2], "not started: all");
    send(&e, d, 0, 1, 2);
    assert_eq!(missing(0), [0, 2]);
    assert_eq!(missing(1), [0, 1, 2]);
    let st = e.state_at(0);
    assert_eq!(
        st.agg.map(|a| (a.seq, a.count, a.next_rank)),
        Some((0, 2, 0))
    );
    send(&e, d, 0, 0, 2);
    assert_eq!(
        e.state_at(0).agg.unwrap().next_rank,
        2,
        "rank 1 was folded after 0"
    );
    send(&e, d, 0, 2, 2);
    assert_eq!(missing(0), Vec::<u16>::new(), "complete: none");
    let st = e.state_at(0);
    assert_eq!(
        (st.agg, st.shadow.map(|s| s.seq), st.partial),
        (None, Some(0), None)
    );
    assert_eq!(e.state_at(9), SlotState::default());
}

#[test]
fn a_leaf_holds_its_partial_until_the_spine_answers() {
    for dtype in DTYPES {
        let e = SlotEngine::try_new(2, 2, 4, dtype, true, 2).unwrap();
        assert_eq!(send(&e, dtype, 0, 0, 3), Contributed::Taken);
        assert_eq!(
            send(&e, dtype, 0, 1, 3),
            Contributed::PartialReady { seq: 0 }
        );
        assert_eq!(
            send(&e, dtype, 0, 1, 3),
            Contributed::Dropped(DropReason::Duplicate)
        );
        assert_eq!(e.state_at(0).partial.map(|p| p.seq), Some(0));
        assert!(e.shadow(0).is_none() && e.with_result(0, |_, _| ()).is_none());
        assert!(!e.finish_partial(1, &[0; 12], false), "no partial of seq 1");
        assert!(!e.finish_partial(0, &[0; 8], false), "wrong length");
        // The spine's answer, rounded once: 1.00390625 is not a bf16.
        let spine: Vec<u8> = [1.003_906_2f32, -2.5, 65504.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(e.finish_partial(0, &spine, true));
        assert!(e.state_at(0).partial.is_none());
        let sh = e.shadow(0).unwrap();
        assert!(sh.ece, "the spine's ECE is OR-ed in");
        let want: Vec<u8> = [1.003_906_2f32, -2.5, 65504.0]
            .iter()
            .flat_map(|&v| match dtype {
                Dtype::F32 => v.to_le_bytes().to_vec(),
                Dtype::Bf16 => half::bf16::from_f32(v).to_bits().to_le_bytes().to_vec(),
                Dtype::F16 => half::f16::from_f32(v).to_bits().to_le_bytes().to_vec(),
            })
            .collect();
        assert_eq!(result_of(&e, 0).unwrap(), want);
        assert_eq!(e.floor(), 1);
        assert_eq!(send(&e, dtype, 0, 0, 3), Contributed::Retransmit { seq: 0 });
    }
}

#[test]
fn reset_empties_every_slot_and_sets_the_floor() {
    let d = Dtype::F16;
    let e = SlotEngine::try_new(4, 2, 4, d, false, 4).unwrap();
    for seq in 0..3 {
        send(&e, d, seq, 0, 2);
    }
    send(&e, d, 0, 1, 2);
    assert!(e.shadow(0).is_some());
    e.reset(100);
    assert_eq!(e.floor(), 100);
    assert!(e.shadow(0).is_none() && result_of(&e, 0).is_none());
    for i in 0..4 {
        assert_eq!(e.state_at(i), SlotState::default(), "slot {i}");
    }
    assert_eq!(
        send(&e, d, 1, 1, 2),
        Contributed::Dropped(DropReason::Stale)
    );
    // Seq 101's slot held seq 1's rank 0 before: the new activation needs
    // both ranks again, and sums only its own values.
    assert_eq!(send(&e, d, 101, 1, 2), Contributed::Taken);
    assert_eq!(send(&e, d, 100, 0, 2), Contributed::Taken);
    assert_eq!(
        send(&e, d, 100, 1, 2),
        Contributed::Completed {
            seq: 100,
            ece: false
        }
    );
    assert_eq!(
        send(&e, d, 101, 0, 2),
        Contributed::Completed {
            seq: 101,
            ece: false
        }
    );
    assert_eq!(result_of(&e, 101).unwrap(), expected(d, 2, 101, 2));
    assert_eq!(e.floor(), 102);
}

#[test]
fn seqs_wrap_around() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(4, 2, 4, d, false, 4).unwrap();
    e.reset(u32::MAX - 1);
    for seq in [u32::MAX - 1, u32::MAX, 0, 1, 2] {
        send(&e, d, seq, 1, 1);
        assert!(matches!(
            send(&e, d, seq, 0, 1),
            Contributed::Completed { .. }
        ));
        assert_eq!(result_of(&e, seq).unwrap(), expected(d, 2, seq, 1));
    }
    assert_eq!(e.floor(), 3);
}

/// A worker-like driver of the ranks `ranks` of one engine: each rank sends
/// the seqs of its window in random order, resends some, and checks every
/// result (bit for bit, against the reference) before moving its window.
fn drive(e: &SlotEngine, spine: &Mutex<()>, ranks: &[u16], seqs: u32, seed: u64) -> u64 {
    let (n, dtype, w) = (e.n, e.dtype, e.len() as u32);
    let count_of = |seq: u32| 1 + (seq.wrapping_mul(7) % e.elems as u32) as u16;
    let check = |seq: u32| {
        e.with_result(seq, |sh, b| {
            assert_eq!(sh.count, count_of(seq));
            let want = if e.stats() {
                expected_with_stats(dtype, n, seq, sh.count)
            } else {
                expected(dtype, n, seq, sh.count)
            };
            assert_eq!(b, want, "seq {seq}");
        })
    };
    let mut rng = Rng(seed);
    let mut base = vec![0u32; ranks.len()];
    let mut sent = vec![vec![false; seqs as usize]; ranks.len()];
    let mut checked = 0u64;
    while base.iter().any(|b| *b < seqs) {
        let i = rng.below(ranks.len());
        if base[i] >= seqs {
            continue;
        }
        let r = ranks[i];
        if sent[i][base[i] as usize] && check(base[i]).is_some() {
            checked += 1;
            base[i] += 1;
            continue;
        }
        let seq = base[i] + rng.below(w as usize) as u32;
        if seq >= seqs {
            std::thread::yield_now();
            continue;
        }
        let resend = sent[i][seq as usize];
        if resend && rng.below(4) != 0 {
            // Nothing new to send: let the other ranks' threads run.
            std::thread::yield_now();
            continue;
        }
        let count = count_of(seq);
        let p = payload(dtype, r, seq, count);
        match e.contribute(&contribution(&p, seq, r, count)) {
            out if resend => assert!(
                matches!(
                    out,
                    Contributed::Dropped(DropReason::Duplicate) | Contributed::Retransmit { .. }
                ),
                "resend of {seq} by {r}: {out:?}"
            ),
            Contributed::Taken => sent[i][seq as usize] = true,
            Contributed::Completed { seq: s, .. } => {
                assert_eq!(s, seq);
                sent[i][seq as usize] = true;
                check(seq).expect("a completed result is held");
            }
            Contributed::PartialReady { seq: s } => {
                assert_eq!(s, seq);
                sent[i][seq as usize] = true;
                let _one = spine.lock().unwrap();
                let partial = spine_answer(e, seq);
                let want: Vec<u8> = f32_sum(dtype, n, seq, count)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                assert_eq!(partial, want, "partial {seq}");
                assert!(e.finish_partial(seq, &partial, false));
            }
            Contributed::Dropped(DropReason::BeyondWindow | DropReason::SlotBusy) => {
                std::thread::yield_now()
            }
            out => panic!("seq {seq} rank {r}: {out:?}"),
        }
    }
    checked
}

#[test]
fn threads_sharing_one_job_get_the_reference_bits() {
    let seqs = 2000;
    for (k, (dtype, leaf, n, threads)) in [
        (Dtype::F32, false, 6u16, 3usize),
        (Dtype::Bf16, false, 8, 4),
        (Dtype::F16, true, 4, 2),
        (Dtype::F32, true, 5, 3),
    ]
    .into_iter()
    .enumerate()
    {
        let e = Arc::new(SlotEngine::try_new(8, n, 16, dtype, leaf, 8).unwrap());
        let spine = Arc::new(Mutex::new(()));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (e, spine) = (e.clone(), spine.clone());
                // Thread t drives ranks t, t + threads, …
                let ranks: Vec<u16> = (0..n).filter(|r| *r as usize % threads == t).collect();
                std::thread::spawn(move || drive(&e, &spine, &ranks, seqs, 1 + (k * 16 + t) as u64))
            })
            .collect();
        let checked: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(
            checked,
            u64::from(seqs) * u64::from(n),
            "each rank checked each seq"
        );
        assert_eq!(e.floor(), seqs);
    }
}

/// Several threads folding one stats job's ranks: every trailer is the
/// reference's, bit for bit (the norms are added in rank order whichever
/// thread folds which rank, on arrival or from a parked row).
#[test]
fn threads_sharing_a_stats_job_get_the_reference_statistics() {
    let seqs = 1000;
    for (k, (dtype, n, threads)) in [
        (Dtype::F32, 6u16, 3usize),
        (Dtype::Bf16, 8, 4),
        (Dtype::F16, 4, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let e = Arc::new(SlotEngine::try_with_stats(8, n, 16, dtype, false, 8, true).unwrap());
        let spine = Arc::new(Mutex::new(()));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (e, spine) = (e.clone(), spine.clone());
                let ranks: Vec<u16> = (0..n).filter(|r| *r as usize % threads == t).collect();
                std::thread::spawn(move || {
                    drive(&e, &spine, &ranks, seqs, 50 + (k * 16 + t) as u64)
                })
            })
            .collect();
        let checked: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(checked, u64::from(seqs) * u64::from(n));
        assert_eq!(e.floor(), seqs);
    }
}

/// One thread, every arrival order: the trailer follows the values, equals
/// the reference, is covered by the checksum sum, and a stats engine's
/// all-gather carries none.
#[test]
fn a_stats_engine_writes_the_reference_trailer_in_every_arrival_order() {
    for dtype in DTYPES {
        let (n, slots) = (5u16, 4u16);
        let e = SlotEngine::try_with_stats(slots, n, 9, dtype, false, slots, true).unwrap();
        let mut rng = Rng(70 + dtype as u64);
        for seq in 0..60u32 {
            let count = 1 + (seq % 9) as u16;
            let mut order: Vec<u16> = (0..n).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            for &r in &order {
                send(&e, dtype, seq, r, count);
            }
            let (sum, bytes, st) = e
                .with_result(seq, |sh, b| (sh.payload_sum, b.to_vec(), sh.stats))
                .unwrap();
            assert!(st);
            assert_eq!(
                bytes,
                expected_with_stats(dtype, n, seq, count),
                "{dtype:?} {seq}"
            );
            assert_eq!(sum, Sum::ZERO.add_bytes(&bytes).fold());
            let res = e.result(seq).unwrap();
            assert_eq!(res.trailer(), &bytes[dtype.payload_len(count)..]);
            assert_eq!(res.stats().unwrap().ranks, u32::from(n));
        }
        // An all-gather moves bytes: nothing is summed, no trailer.
        let seq = 60;
        let p = payload(dtype, 1, seq, 3);
        for r in 0..n {
            let c = Contribution {
                kind: Kind::AllGather,
                owner: 1,
                noval: r != 1,
                ..contribution(if r == 1 { &p } else { &[] }, seq, r, 3)
            };
            e.contribute(&c);
        }
        let res = e.result(seq).unwrap();
        assert!(!res.shadow().stats && res.trailer().is_empty() && res.stats().is_none());
        assert_eq!(res.bytes(), &p[..]);
    }
}

#[test]
fn one_job_per_thread() {
    let handles: Vec<_> = DTYPES
        .into_iter()
        .enumerate()
        .map(|(t, dtype)| {
            std::thread::spawn(move || {
                let e = SlotEngine::try_new(4, 5, 8, dtype, t == 1, 4).unwrap();
                let ranks: Vec<u16> = (0..5).collect();
                let checked = drive(&e, &Mutex::new(()), &ranks, 1500, 40 + t as u64);
                assert_eq!(checked, 1500 * 5);
                assert_eq!(e.floor(), 1500);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn the_engine_is_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<SlotEngine>();
}

/// A DATA admitted under an activation that a reset has since ended is
/// Stale and changes nothing; admitted under the current one, it is taken.
#[test]
fn a_contribution_admitted_before_a_reset_is_not_summed_after_it() {
    let e = SlotEngine::try_new(4, 2, 4, Dtype::F32, false, 4).unwrap();
    let before = e.epoch();
    e.reset(0);
    let p = payload(Dtype::F32, 0, 0, 2);
    let c = contribution(&p, 0, 0, 2);
    assert_eq!(
        e.contribute_admitted(&c, before),
        Contributed::Dropped(DropReason::Stale)
    );
    let mut missing = Vec::new();
    e.missing(0, |r| missing.push(r));
    assert_eq!(missing, [0, 1], "nothing was taken");
    assert_eq!(e.contribute_admitted(&c, e.epoch()), Contributed::Taken);
}

/// With seq lanes, each lane has its own floor: a lane runs ahead of a
/// stalled one (Stale and BeyondWindow are judged against the lane's
/// floor), the job's floor is the lowest lane floor, and a reset puts
/// every lane at its first seq from the reset point, in one activation.
#[test]
fn seq_lanes_keep_a_floor_each() {
    let d = Dtype::F32;
    let e = SlotEngine::try_new(8, 2, 4, d, false, 4)
        .unwrap()
        .try_with_lanes(2)
        .unwrap();
    assert_eq!(e.lanes(), 2);
    // Seq 0 (lane 0) stalls on rank 1; lane 1 completes seqs 1 and 3.
    assert_eq!(send(&e, d, 0, 0, 1), Contributed::Taken);
    for seq in [1, 3] {
        assert_eq!(send(&e, d, seq, 0, 1), Contributed::Taken);
        assert!(matches!(
            send(&e, d, seq, 1, 1),
            Contributed::Completed { .. }
        ));
    }
    assert_eq!(e.floor(), 0, "seq 0 holds the job's floor");
    // Lane 1's floor is 5: seq 5 is inside its window (5 < 5 + 4) and
    // seq 9 past it; lane 0's floor is still 0, so seq 4 is past its.
    assert_eq!(send(&e, d, 5, 0, 1), Contributed::Taken);
    assert_eq!(
        send(&e, d, 9, 0, 1),
        Contributed::Dropped(DropReason::BeyondWindow)
    );
    assert_eq!(
        send(&e, d, 4, 0, 1),
        Contributed::Dropped(DropReason::BeyondWindow)
    );
    assert_eq!(send(&e, d, 1, 1, 1), Contributed::Retransmit { seq: 1 });
    assert_eq!(result_of(&e, 3).unwrap(), expected(d, 2, 3, 1));
    // Seq 0 completes: the job's floor jumps to lane 0's next seq, 2,
    // the lowest of 2 and 5.
    assert!(matches!(
        send(&e, d, 0, 1, 1),
        Contributed::Completed { .. }
    ));
    assert_eq!(e.floor(), 2);
    assert_eq!(result_of(&e, 0).unwrap(), expected(d, 2, 0, 1));

    let before = e.epoch();
    e.reset(7);
    assert_ne!(e.epoch(), before);
    assert_eq!(e.floor(), 7, "lane 1 from 7, lane 0 from 8");
    assert_eq!(
        send(&e, d, 6, 0, 1),
        Contributed::Dropped(DropReason::Stale)
    );
    assert_eq!(
        send(&e, d, 5, 1, 1),
        Contributed::Dropped(DropReason::Stale)
    );
    for seq in [8, 7] {
        assert_eq!(send(&e, d, seq, 1, 1), Contributed::Taken);
        assert!(matches!(
            send(&e, d, seq, 0, 1),
            Contributed::Completed { .. }
        ));
        assert_eq!(result_of(&e, seq).unwrap(), expected(d, 2, seq, 1));
    }
    assert_eq!(e.floor(), 9);
}

/// Lanes are rounded down to a power of two and never outnumber slots.
#[test]
fn seq_lanes_are_a_power_of_two_up_to_the_slots() {
    let make = |slots, lanes| {
        SlotEngine::try_new(slots, 1, 1, Dtype::F32, false, slots)
            .unwrap()
            .try_with_lanes(lanes)
            .unwrap()
            .lanes()
    };
    assert_eq!(make(8, 0), 1);
    assert_eq!(make(8, 3), 2);
    assert_eq!(make(8, 8), 8);
    assert_eq!(make(4, 16), 4);
}

/// Threads that each take their own seq lanes (a NIC steering lanes to
/// queues), and threads that take any seq, get the reference bits.
#[test]
fn threads_on_seq_lanes_get_the_reference_bits() {
    let seqs = 2000;
    let (n, threads) = (4u16, 2usize);
    let e = Arc::new(
        SlotEngine::try_new(8, n, 16, Dtype::F32, false, 8)
            .unwrap()
            .try_with_lanes(2)
            .unwrap(),
    );
    let spine = Arc::new(Mutex::new(()));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (e, spine) = (e.clone(), spine.clone());
            let ranks: Vec<u16> = (0..n).filter(|r| *r as usize % threads == t).collect();
            std::thread::spawn(move || drive(&e, &spine, &ranks, seqs, 77 + t as u64))
        })
        .collect();
    let checked: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(checked, u64::from(seqs) * u64::from(n));
    assert_eq!(e.floor(), seqs);
}
