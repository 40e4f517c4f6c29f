//! The switch's arithmetic, done on a host: the sums a *host path* computes
//! so that a collective finished without the switch (it died, or the job
//! runs with `AGGSWITCH_MODE=hosts`) returns the bits the switch would have.
//!
//! Owns: [`sum`] (all-reduce and a `stats = true` reduce-scatter: rank
//! order, or a tree's order), [`kept_sum`] (a reduce-scatter owner's shard
//! when it keeps its own values) and the per-chunk gradient statistics of a
//! sum ([`sum`] with a chunk length).
//!
//! Invariants:
//! * Inputs and outputs are wire bytes: little-endian elements of the job's
//!   dtype, one slice per rank in rank order. The arithmetic is the
//!   switch's own functions ([`crate::elements`], [`crate::stats`]): each
//!   input widened exactly to float32, added in rank order starting from
//!   rank 0's value (never from zero, so −0 survives), the float32 sum
//!   rounded once to the dtype. Sums are element-wise, so how a tensor is
//!   cut into blocks here (or into shards between hosts) never changes a
//!   bit; only the statistics depend on where chunks start, which is why
//!   [`sum`] takes their length and its inputs must start at a chunk
//!   boundary of the collective.
//! * A tree (leaf sizes in leaf order) sums each leaf's ranks in rank order
//!   (its partial, float32), then the partials in leaf order, and rounds
//!   once: docs/PROTOCOL.md, "Aggregation trees".
//! * Bad shapes are errors, never panics; nothing here does I/O.

use crate::elements::{add_le, add_own_le, read_le, round_to_le};
use crate::stats::{squared_norm, squared_norm_le_blocked, GradStats};
use crate::wire::Dtype;

/// Elements summed per block when no statistics are asked for: a few
/// float32 scratch pages, in the L1/L2 cache.
const BLOCK: usize = 4096;

/// In which order a host adds the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumOrder<'a> {
    /// A single switch: rank 0 + rank 1 + … .
    Rank,
    /// An aggregation tree: workers per leaf, in leaf order (global ranks
    /// numbered leaf by leaf).
    Tree(&'a [u16]),
}

/// Why a host sum cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostSumError {
    #[error("host sum: no inputs (a collective has at least one rank)")]
    NoInputs,
    #[error(
        "host sum: rank {rank}'s input is {len} bytes, rank 0's {first}; every rank sends \
         the same length"
    )]
    LengthsDiffer {
        rank: usize,
        len: usize,
        first: usize,
    },
    #[error("host sum: {len} bytes is not a whole number of {dtype} elements")]
    NotWholeElements { len: usize, dtype: Dtype },
    #[error("host sum: the output is {out} bytes, the inputs {input} each")]
    WrongOutput { out: usize, input: usize },
    #[error(
        "host sum: the tree's leaves hold {tree} workers (sizes {sizes:?}), but there are \
         {inputs} inputs"
    )]
    TreeMismatch {
        sizes: Vec<u16>,
        tree: usize,
        inputs: usize,
    },
    #[error("host sum: owner {owner} is not one of the {n} ranks")]
    NoSuchOwner { owner: usize, n: usize },
    #[error("host sum: a chunk length of 0 elements")]
    ZeroChunk,
}

fn check(dtype: Dtype, inputs: &[&[u8]], out: &[u8]) -> Result<usize, HostSumError> {
    let first = inputs.first().ok_or(HostSumError::NoInputs)?.len();
    if let Some((rank, i)) = inputs.iter().enumerate().find(|(_, i)| i.len() != first) {
        return Err(HostSumError::LengthsDiffer {
            rank,
            len: i.len(),
            first,
        });
    }
    if !first.is_multiple_of(dtype.size()) {
        return Err(HostSumError::NotWholeElements { len: first, dtype });
    }
    if out.len() != first {
        return Err(HostSumError::WrongOutput {
            out: out.len(),
            input: first,
        });
    }
    Ok(first / dtype.size())
}

/// Sums `inputs` (one per rank, rank order; in a tree, global rank order)
/// into `out` as the switch does, rounded once to `dtype`. With
/// `stats_chunk = Some(E)` it also returns each chunk's gradient
/// statistics (chunks of E elements from the start of the inputs, the last
/// one shorter), the bits the switch's RESULT trailers would carry;
/// otherwise an empty list.
pub fn sum(
    dtype: Dtype,
    order: SumOrder<'_>,
    inputs: &[&[u8]],
    out: &mut [u8],
    stats_chunk: Option<usize>,
) -> Result<Vec<GradStats>, HostSumError> {
    let elems = check(dtype, inputs, out)?;
    if let SumOrder::Tree(sizes) = order {
        let tree: usize = sizes.iter().map(|&s| usize::from(s)).sum();
        if tree != inputs.len() || sizes.contains(&0) {
            return Err(HostSumError::TreeMismatch {
                sizes: sizes.to_vec(),
                tree,
                inputs: inputs.len(),
            });
        }
    }
    let block = match stats_chunk {
        Some(0) => return Err(HostSumError::ZeroChunk),
        Some(e) => e,
        None => BLOCK,
    };
    let size = dtype.size();
    let mut acc = vec![0f32; block.min(elems)];
    let mut partial = match order {
        SumOrder::Tree(_) => vec![0f32; acc.len()],
        SumOrder::Rank => Vec::new(),
    };
    let mut stats = Vec::new();
    let mut start = 0;
    while start < elems {
        let n = block.min(elems - start);
        let bytes = start * size..(start + n) * size;
        let acc = &mut acc[..n];
        let mut sos = 0f64;
        match order {
            SumOrder::Rank => {
                read_le(dtype, &inputs[0][bytes.clone()], acc);
                for input in &inputs[1..] {
                    add_le(dtype, acc, &input[bytes.clone()]);
                }
                if stats_chunk.is_some() {
                    for input in inputs {
                        sos += squared_norm_le_blocked(dtype, &input[bytes.clone()]);
                    }
                }
            }
            SumOrder::Tree(sizes) => {
                let partial = &mut partial[..n];
                let mut first_rank = 0;
                for (leaf, &size) in sizes.iter().enumerate() {
                    let ranks = &inputs[first_rank..first_rank + usize::from(size)];
                    first_rank += usize::from(size);
                    // The leaf's partial, float32, rank order; the spine adds
                    // the partials in leaf order from the first one.
                    if leaf == 0 {
                        leaf_partial(dtype, ranks, bytes.clone(), acc);
                    } else {
                        leaf_partial(dtype, ranks, bytes.clone(), partial);
                        crate::simd::add_f32(acc, partial);
                    }
                    if stats_chunk.is_some() {
                        let mut leaf_sos = 0f64;
                        for input in ranks {
                            leaf_sos += squared_norm_le_blocked(dtype, &input[bytes.clone()]);
                        }
                        sos += leaf_sos;
                    }
                }
            }
        }
        if stats_chunk.is_some() {
            stats.push(GradStats {
                sum_of_squares: sos,
                square_of_sum: squared_norm(acc),
                ranks: inputs.len() as u32,
            });
        }
        round_to_le(dtype, acc, &mut out[bytes]);
        start += n;
    }
    Ok(stats)
}

/// A leaf's partial of the elements at `bytes`: its ranks' values in rank
/// order, float32, not rounded.
fn leaf_partial(dtype: Dtype, ranks: &[&[u8]], bytes: std::ops::Range<usize>, into: &mut [f32]) {
    read_le(dtype, &ranks[0][bytes.clone()], into);
    for input in &ranks[1..] {
        add_le(dtype, into, &input[bytes.clone()]);
    }
}

/// A reduce-scatter owner's shard when it keeps its own values (the
/// default outside `stats = true` jobs): the other ranks' values summed in
/// rank order and rounded once (the RESULT the switch sends it), then
/// `owner`'s own added in float32 and rounded again. With one rank, the
/// owner sends its values and gets them back rounded: [`sum`] of one.
pub fn kept_sum(
    dtype: Dtype,
    inputs: &[&[u8]],
    owner: usize,
    out: &mut [u8],
) -> Result<(), HostSumError> {
    check(dtype, inputs, out)?;
    if owner >= inputs.len() {
        return Err(HostSumError::NoSuchOwner {
            owner,
            n: inputs.len(),
        });
    }
    if inputs.len() == 1 {
        return sum(dtype, SumOrder::Rank, inputs, out, None).map(drop);
    }
    let others: Vec<&[u8]> = (inputs.iter().enumerate())
        .filter(|&(r, _)| r != owner)
        .map(|(_, i)| *i)
        .collect();
    let mut partial = vec![0u8; out.len()];
    sum(dtype, SumOrder::Rank, &others, &mut partial, None)?;
    add_own_le(dtype, &partial, inputs[owner], out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elements::round_f32;
    use crate::reference::{rank_order_sum, tree_order_sum};
    use crate::stats::{chunk_stats, tree_chunk_stats};

    const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

    /// Values that test rounding and IEEE corners: −0, subnormals of every
    /// dtype, infinities, NaN, large and tiny magnitudes, and a pseudo-random
    /// spread (so sums need rounding in every dtype).
    fn value(rank: usize, i: usize) -> f32 {
        const CORNERS: [f32; 12] = [
            -0.0,
            0.0,
            1.0e-40,  // an f32 subnormal
            -3.0e-41, // another
            6.0e-8,   // an f16 subnormal
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            65504.0,
            -1.0e38,
            1.0e38,
            1.0e-45,
        ];
        let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (rank as u64 * 0x1234_5677);
        match x % 7 {
            0 => CORNERS[(x >> 8) as usize % CORNERS.len()],
            _ => crate::reference::pattern(rank as u16, 3, i),
        }
    }

    /// Rank `rank`'s input: `elems` values rounded to `dtype`, as wire bytes.
    fn input(dtype: Dtype, rank: usize, elems: usize) -> (Vec<f32>, Vec<u8>) {
        let vals: Vec<f32> = (0..elems)
            .map(|i| round_f32(dtype, value(rank, i)))
            .collect();
        let mut bytes = vec![0u8; elems * dtype.size()];
        round_to_le(dtype, &vals, &mut bytes);
        (vals, bytes)
    }

    fn widen(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
        let mut v = vec![0f32; bytes.len() / dtype.size()];
        read_le(dtype, bytes, &mut v);
        v
    }

    /// Equal bits, or both NaN (a NaN's payload depends on which operand
    /// the hardware keeps, which the reference does not pin down).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    fn assert_same(dtype: Dtype, got: &[u8], want: &[f32], what: &str) {
        for (i, (g, w)) in widen(dtype, got).iter().zip(want).enumerate() {
            let w = round_f32(dtype, *w);
            assert!(
                same(*g, w),
                "{what}: element {i}: got {g:e} ({:#x}), want {w:e} ({:#x})",
                g.to_bits(),
                w.to_bits()
            );
        }
    }

    #[test]
    fn rank_order_sum_matches_the_reference_for_every_dtype_and_n_1_to_8() {
        // 5 000 elements: more than one block, a block's tail too.
        let elems = 5_000;
        for dtype in DTYPES {
            for n in 1..=8 {
                let ins: Vec<_> = (0..n).map(|r| input(dtype, r, elems)).collect();
                let bytes: Vec<&[u8]> = ins.iter().map(|(_, b)| b.as_slice()).collect();
                let vals: Vec<&[f32]> = ins.iter().map(|(v, _)| v.as_slice()).collect();
                let mut out = vec![0u8; elems * dtype.size()];
                sum(dtype, SumOrder::Rank, &bytes, &mut out, None).unwrap();
                assert_same(
                    dtype,
                    &out,
                    &rank_order_sum(&vals),
                    &format!("{dtype} n={n}"),
                );
            }
        }
    }

    #[test]
    fn negative_zero_survives_a_sum_of_negative_zeros() {
        for dtype in DTYPES {
            let (_, z) = input(dtype, 0, 0);
            assert!(z.is_empty());
            let mut neg = vec![0u8; 4 * dtype.size()];
            round_to_le(dtype, &[-0.0; 4], &mut neg);
            let mut out = vec![0xffu8; neg.len()];
            sum(dtype, SumOrder::Rank, &[&neg, &neg, &neg], &mut out, None).unwrap();
            assert_eq!(out, neg, "{dtype}: -0 + -0 + -0 must stay -0");
        }
    }

    #[test]
    fn tree_order_sum_matches_the_reference() {
        let elems = 1_000;
        for dtype in DTYPES {
            for sizes in [&[1u16][..], &[2, 2], &[1, 3], &[3, 1, 2], &[2, 2, 2, 2]] {
                let n: usize = sizes.iter().map(|&s| usize::from(s)).sum();
                let ins: Vec<_> = (0..n).map(|r| input(dtype, r, elems)).collect();
                let bytes: Vec<&[u8]> = ins.iter().map(|(_, b)| b.as_slice()).collect();
                let mut leaves = Vec::new();
                let mut r = 0;
                for &s in sizes {
                    leaves.push(
                        (r..r + usize::from(s))
                            .map(|i| ins[i].0.as_slice())
                            .collect::<Vec<_>>(),
                    );
                    r += usize::from(s);
                }
                let mut out = vec![0u8; elems * dtype.size()];
                sum(dtype, SumOrder::Tree(sizes), &bytes, &mut out, None).unwrap();
                assert_same(
                    dtype,
                    &out,
                    &tree_order_sum(&leaves),
                    &format!("{dtype} tree {sizes:?}"),
                );
            }
        }
    }

    #[test]
    fn kept_sum_is_the_others_rounded_then_the_owners_added() {
        let elems = 700;
        for dtype in DTYPES {
            for n in 1..=8 {
                for owner in [0, n / 2, n - 1] {
                    let ins: Vec<_> = (0..n).map(|r| input(dtype, r, elems)).collect();
                    let bytes: Vec<&[u8]> = ins.iter().map(|(_, b)| b.as_slice()).collect();
                    let mut out = vec![0u8; elems * dtype.size()];
                    kept_sum(dtype, &bytes, owner, &mut out).unwrap();
                    let want: Vec<f32> = (0..elems)
                        .map(|i| {
                            let mine = ins[owner].0[i];
                            let others: Vec<f32> = (0..n)
                                .filter(|&r| r != owner)
                                .map(|r| ins[r].0[i])
                                .collect();
                            match others.split_first() {
                                None => mine,
                                Some((f, rest)) => {
                                    let p = round_f32(dtype, rest.iter().fold(*f, |s, v| s + v));
                                    p + mine
                                }
                            }
                        })
                        .collect();
                    assert_same(dtype, &out, &want, &format!("{dtype} n={n} owner={owner}"));
                }
            }
        }
    }

    #[test]
    fn chunk_statistics_are_the_switchs_bits() {
        let (elems, e) = (2_500, 358);
        for dtype in DTYPES {
            for n in 1..=5 {
                let ins: Vec<_> = (0..n).map(|r| input(dtype, r + 20, elems)).collect();
                let bytes: Vec<&[u8]> = ins.iter().map(|(_, b)| b.as_slice()).collect();
                let mut out = vec![0u8; elems * dtype.size()];
                let got = sum(dtype, SumOrder::Rank, &bytes, &mut out, Some(e)).unwrap();
                assert_eq!(got.len(), elems.div_ceil(e));
                for (c, g) in got.iter().enumerate() {
                    let r = c * e..((c + 1) * e).min(elems);
                    let vals: Vec<&[f32]> = ins.iter().map(|(v, _)| &v[r.clone()]).collect();
                    let want = chunk_stats(&vals, &rank_order_sum(&vals));
                    assert!(
                        g.bits_eq(&want)
                            || (g.square_of_sum.is_nan() && want.square_of_sum.is_nan()),
                        "{dtype} n={n} chunk {c}: {g:?} != {want:?}"
                    );
                }
                // A tree's: leaf parts summed in leaf order.
                let sizes = [1u16, (n - 1) as u16];
                if n > 1 {
                    let got =
                        sum(dtype, SumOrder::Tree(&sizes), &bytes, &mut out, Some(e)).unwrap();
                    for (c, g) in got.iter().enumerate() {
                        let r = c * e..((c + 1) * e).min(elems);
                        let leaves = vec![
                            vec![&ins[0].0[r.clone()]],
                            (1..n).map(|i| &ins[i].0[r.clone()]).collect::<Vec<_>>(),
                        ];
                        let want = tree_chunk_stats(&leaves, &tree_order_sum(&leaves));
                        assert!(
                            g.bits_eq(&want)
                                || (g.square_of_sum.is_nan() && want.square_of_sum.is_nan()),
                            "{dtype} tree chunk {c}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let a = [0u8; 8];
        let b = [0u8; 4];
        let mut out = [0u8; 8];
        assert_eq!(
            sum(Dtype::F32, SumOrder::Rank, &[], &mut out, None),
            Err(HostSumError::NoInputs)
        );
        assert!(matches!(
            sum(Dtype::F32, SumOrder::Rank, &[&a, &b], &mut out, None),
            Err(HostSumError::LengthsDiffer { rank: 1, .. })
        ));
        assert!(matches!(
            sum(Dtype::F32, SumOrder::Rank, &[&a[..6]], &mut out[..6], None),
            Err(HostSumError::NotWholeElements { .. })
        ));
        assert!(matches!(
            sum(Dtype::F32, SumOrder::Rank, &[&a], &mut out[..4], None),
            Err(HostSumError::WrongOutput { .. })
        ));
        assert!(matches!(
            sum(
                Dtype::F32,
                SumOrder::Tree(&[1, 2]),
                &[&a, &a],
                &mut out,
                None
            ),
            Err(HostSumError::TreeMismatch { .. })
        ));
        assert_eq!(
            sum(Dtype::F32, SumOrder::Rank, &[&a], &mut out, Some(0)),
            Err(HostSumError::ZeroChunk)
        );
        assert!(matches!(
            kept_sum(Dtype::F32, &[&a, &a], 2, &mut out),
            Err(HostSumError::NoSuchOwner { .. })
        ));
    }
}
