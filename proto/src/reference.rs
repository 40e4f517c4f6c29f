//! The reference all-reduce: the sum of every rank's tensor in rank order
//! (rank 0 + rank 1 + …), exactly as the switch sums a slot. Workers use it to
//! verify results bit for bit, and tests to check the switch.
//!
//! An aggregation tree (PROTOCOL.md, "Aggregation trees") sums in tree order
//! instead: each leaf sums its own ranks in rank order (its *partial*), then
//! the partials are summed in leaf order. Its workers are numbered by a
//! *global rank*, the sizes of the earlier leaves plus the local rank
//! ([`tree_global_rank`]); the patterns they contribute use the global rank.
//!
//! A half-precision job (bf16, f16) sums the same way in float32, each
//! input widened exactly, and rounds the sum once to its dtype
//! ([`rank_order_sum_half`], [`expected_sum_dtype`]); its workers contribute
//! the pattern rounded to the dtype ([`pattern_dtype`]).

use crate::dtype::Dtype;
use crate::elements::round_f32;

/// The pattern rank `rank` contributes at `iteration`, element `index`:
/// deterministic, varied in sign and magnitude, so that rounding order shows.
pub fn pattern(rank: u16, iteration: u32, index: usize) -> f32 {
    // A cheap integer hash (splitmix-like) of the three inputs.
    let mut x =
        (index as u64) ^ ((rank as u64) << 40) ^ ((iteration as u64) << 24) ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    // Mantissa from the hash, exponent spread over a few decades, random sign.
    let m = (x & 0xffff) as f32 / 65536.0 + 0.5;
    let e = ((x >> 16) % 12) as i32 - 6;
    let s = if (x >> 32) & 1 == 1 { -1.0 } else { 1.0 };
    // 2^e built from its bits: exact, the same value as `2f32.powi(e)` for
    // -6 ≤ e ≤ 5, and without the libm call that made filling 64 MiB cost
    // more CPU than the all-reduce it feeds.
    let two_e = f32::from_bits(((e + 127) as u32) << 23);
    s * m * two_e
}

/// Fills `out` with rank `rank`'s pattern for `iteration`.
pub fn fill_pattern(rank: u16, iteration: u32, out: &mut [f32]) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = pattern(rank, iteration, i);
    }
}

/// The pattern rounded to `dtype` (widened back to float32): what a worker
/// of a `dtype` job contributes. Its values span several binades, so sums of
/// them need rounding in bf16 and f16 too.
pub fn pattern_dtype(dtype: Dtype, rank: u16, iteration: u32, index: usize) -> f32 {
    round_f32(dtype, pattern(rank, iteration, index))
}

/// The expected result of a `dtype` job at `index`: the ranks'
/// [`pattern_dtype`] values summed in rank order in float32, rounded once to
/// `dtype` (for f32, [`expected_sum`]).
pub fn expected_sum_dtype(dtype: Dtype, n_workers: u16, iteration: u32, index: usize) -> f32 {
    let mut s = pattern_dtype(dtype, 0, iteration, index);
    for r in 1..n_workers {
        s += pattern_dtype(dtype, r, iteration, index);
    }
    round_f32(dtype, s)
}

/// The expected reduce-scatter result at `index` for `owner`, the rank
/// that owns the element and keeps its values (docs/PROTOCOL.md,
/// "Collective kinds"): the other ranks' [`pattern_dtype`] values summed
/// in rank order in float32 and rounded to `dtype` (the RESULT), then the
/// owner's added in float32 and rounded again. With one rank, the owner's
/// own value.
pub fn expected_kept_sum_dtype(
    dtype: Dtype,
    n_workers: u16,
    owner: u16,
    iteration: u32,
    index: usize,
) -> f32 {
    let mine = pattern_dtype(dtype, owner, iteration, index);
    let mut others = (0..n_workers)
        .filter(|&r| r != owner)
        .map(|r| pattern_dtype(dtype, r, iteration, index));
    let Some(first) = others.next() else {
        return mine;
    };
    let partial = round_f32(dtype, others.fold(first, |s, v| s + v));
    round_f32(dtype, partial + mine)
}

/// Sums half-precision inputs (`dtype` bits, one slice per rank in rank
/// order) as the switch does: each widened to float32, summed in rank order
/// in float32, the sum rounded once to `dtype`. Returns `dtype` bits.
///
/// # Panics
/// If `dtype` is f32 (use [`rank_order_sum`]).
pub fn rank_order_sum_half(dtype: Dtype, inputs: &[&[u16]]) -> Vec<u16> {
    assert!(dtype != Dtype::F32, "rank_order_sum_half of f32 inputs");
    let widen = |b: u16| -> f32 {
        match dtype {
            Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
            _ => half::f16::from_bits(b).to_f32(),
        }
    };
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let mut acc: Vec<f32> = first.iter().map(|&b| widen(b)).collect();
    for r in &inputs[1..] {
        for (a, &b) in acc.iter_mut().zip(r.iter()) {
            *a += widen(b);
        }
    }
    acc.iter()
        .map(|&v| match dtype {
            Dtype::Bf16 => half::bf16::from_f32(v).to_bits(),
            _ => half::f16::from_f32(v).to_bits(),
        })
        .collect()
}

/// The expected result at `index`: Σ over ranks in rank order.
pub fn expected_sum(n_workers: u16, iteration: u32, index: usize) -> f32 {
    ranks_sum(Dtype::F32, 0, n_workers, iteration, index)
}

/// Σ in rank order, in float32, of the [`pattern_dtype`] values of ranks
/// `first..first + n` (rank `first` alone if `n` is 0, as
/// `expected_sum(0, …)` always was).
fn ranks_sum(dtype: Dtype, first: u16, n: u16, iteration: u32, index: usize) -> f32 {
    let mut s = pattern_dtype(dtype, first, iteration, index);
    for r in 1..n {
        s += pattern_dtype(dtype, first + r, iteration, index);
    }
    s
}

/// The expected result at `index` of an aggregation tree whose leaves have
/// `leaf_sizes` workers (in leaf order), every worker contributing the
/// pattern of its global rank: each leaf's partial (its ranks in order), then
/// the partials in leaf order. `leaf_sizes` must be a tree [`check_tree`]
/// accepts; a one-leaf tree gives [`expected_sum`].
///
/// # Panics
/// If the sizes sum to more than 65535 workers.
pub fn expected_tree_sum(leaf_sizes: &[u16], iteration: u32, index: usize) -> f32 {
    expected_tree_sum_dtype(Dtype::F32, leaf_sizes, iteration, index)
}

/// [`expected_tree_sum`] of a `dtype` job: every worker contributes its
/// [`pattern_dtype`]; the leaves' partials and the spines' sums stay
/// float32, and the leaf rounds the final sum once to `dtype`.
///
/// # Panics
/// If the sizes sum to more than 65535 workers.
pub fn expected_tree_sum_dtype(
    dtype: Dtype,
    leaf_sizes: &[u16],
    iteration: u32,
    index: usize,
) -> f32 {
    assert!(
        leaf_sizes.iter().map(|&n| u32::from(n)).sum::<u32>() <= u32::from(u16::MAX),
        "a tree of more than 65535 workers"
    );
    let mut total: Option<f32> = None;
    let mut first = 0u16;
    for &size in leaf_sizes.iter().filter(|&&n| n > 0) {
        let partial = ranks_sum(dtype, first, size, iteration, index);
        total = Some(match total {
            None => partial,
            Some(t) => t + partial,
        });
        first += size;
    }
    round_f32(dtype, total.unwrap_or(0.0))
}

/// Sums `inputs` (one slice per rank, in rank order) element-wise, rank order.
pub fn rank_order_sum(inputs: &[&[f32]]) -> Vec<f32> {
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let mut out = first.to_vec();
    for r in &inputs[1..] {
        for (o, v) in out.iter_mut().zip(r.iter()) {
            *o += *v;
        }
    }
    out
}

/// Sums a tree's inputs in tree order: `leaves[i]` holds leaf `i`'s inputs,
/// one slice per local rank in rank order. Each leaf's partial is the
/// [`rank_order_sum`] of its inputs, and the result the [`rank_order_sum`] of
/// the partials in leaf order: `(l0r0 + l0r1 + …) + (l1r0 + l1r1 + …) + …`.
/// A leaf without inputs contributes nothing.
pub fn tree_order_sum(leaves: &[Vec<&[f32]>]) -> Vec<f32> {
    let partials: Vec<Vec<f32>> = leaves
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| rank_order_sum(l))
        .collect();
    let partials: Vec<&[f32]> = partials.iter().map(Vec::as_slice).collect();
    rank_order_sum(&partials)
}

/// What is wrong with a tree's shape or a place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("the tree has no leaves")]
    NoLeaves,
    #[error("leaf {leaf} has no workers (every leaf needs at least one)")]
    EmptyLeaf { leaf: usize },
    #[error("the leaves have {total} workers in all, more than 65535 (global ranks are 16 bits)")]
    TooManyWorkers { total: u64 },
    #[error("there is no leaf {leaf}: the tree has {n_leaves} leaves, numbered from 0")]
    NoSuchLeaf { leaf: usize, n_leaves: usize },
    #[error("there is no local rank {rank} in leaf {leaf}: it has {size} workers, ranks 0 to {}", .size - 1)]
    NoSuchRank { leaf: usize, rank: u16, size: u16 },
}

/// Checks a tree's shape (`leaf_sizes`: workers per leaf, in leaf order): at
/// least one leaf, at least one worker per leaf, at most 65535 workers in
/// all. Returns the number of workers in all.
pub fn check_tree(leaf_sizes: &[u16]) -> Result<u16, TreeError> {
    if leaf_sizes.is_empty() {
        return Err(TreeError::NoLeaves);
    }
    if let Some(leaf) = leaf_sizes.iter().position(|&n| n == 0) {
        return Err(TreeError::EmptyLeaf { leaf });
    }
    let total: u64 = leaf_sizes.iter().map(|&n| u64::from(n)).sum();
    u16::try_from(total).map_err(|_| TreeError::TooManyWorkers { total })
}

/// The global rank of local rank `local_rank` of leaf `leaf` in a tree whose
/// leaves have `leaf_sizes` workers: the sizes of leaves `0..leaf` plus
/// `local_rank`. It is the rank whose [`pattern`] that worker contributes,
/// and its place in the tree-order sum. Checks the tree ([`check_tree`]),
/// that `leaf` is one of its leaves and `local_rank` one of that leaf's ranks.
pub fn tree_global_rank(
    leaf_sizes: &[u16],
    leaf: usize,
    local_rank: u16,
) -> Result<u16, TreeError> {
    check_tree(leaf_sizes)?;
    let Some(&size) = leaf_sizes.get(leaf) else {
        return Err(TreeError::NoSuchLeaf {
            leaf,
            n_leaves: leaf_sizes.len(),
        });
    };
    if local_rank >= size {
        return Err(TreeError::NoSuchRank {
            leaf,
            rank: local_rank,
            size,
        });
    }
    // Cannot overflow: the whole tree fits in u16 (checked above).
    Ok(leaf_sizes[..leaf].iter().sum::<u16>() + local_rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_shard_is_added_last_and_rounded_again() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let mut differs = 0;
            for i in 0..2000 {
                let owner = (i % 4) as u16;
                let kept = expected_kept_sum_dtype(dtype, 4, owner, 3, i);
                let others: Vec<f32> = (0..4u16)
                    .filter(|&r| r != owner)
                    .map(|r| pattern_dtype(dtype, r, 3, i))
                    .collect();
                let partial = round_f32(dtype, others[0] + others[1] + others[2]);
                let want = round_f32(dtype, partial + pattern_dtype(dtype, owner, 3, i));
                assert_eq!(kept.to_bits(), want.to_bits(), "{dtype:?} {i}");
                differs +=
                    usize::from(kept.to_bits() != expected_sum_dtype(dtype, 4, 3, i).to_bits());
            }
            // Another order than the all-reduce's: some bits differ, so a
            // check against the wrong reference fails.
            assert!(differs > 0, "{dtype:?}");
        }
        assert_eq!(
            expected_kept_sum_dtype(Dtype::F32, 1, 0, 3, 7).to_bits(),
            pattern(0, 3, 7).to_bits()
        );
    }

    #[test]
    fn order_matters_so_the_reference_fixes_it() {
        // Non-associativity is why a fixed order is needed at all.
        let (a, b, c) = (1e8f32, -1e8f32, 1.0f32);
        assert_ne!((a + b) + c, a + (b + c));
        assert_eq!(rank_order_sum(&[&[a], &[b], &[c]]), vec![(a + b) + c]);
    }

    #[test]
    fn pattern_scale_is_the_same_as_powi() {
        for e in -6..=5 {
            assert_eq!(
                f32::from_bits(((e + 127) as u32) << 23).to_bits(),
                2f32.powi(e).to_bits()
            );
        }
    }

    #[test]
    fn pattern_is_deterministic_and_varied() {
        assert_eq!(pattern(3, 7, 11).to_bits(), pattern(3, 7, 11).to_bits());
        let v: Vec<f32> = (0..1000).map(|i| pattern(0, 0, i)).collect();
        assert!(v.iter().any(|x| *x < 0.0) && v.iter().any(|x| *x > 0.0));
        assert!(v.iter().all(|x| x.is_finite() && *x != 0.0));
        assert_ne!(pattern(0, 0, 5), pattern(1, 0, 5));
        assert_ne!(pattern(0, 0, 5), pattern(0, 1, 5));
    }

    #[test]
    fn a_one_leaf_tree_is_the_rank_order_sum() {
        let inputs: Vec<Vec<f32>> = (0..5u16)
            .map(|r| (0..300).map(|i| pattern(r, 2, i)).collect())
            .collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let flat: Vec<u32> = rank_order_sum(&refs).iter().map(|x| x.to_bits()).collect();
        let tree: Vec<u32> = tree_order_sum(&[refs])
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(tree, flat);
        for i in 0..300 {
            assert_eq!(
                expected_tree_sum(&[5], 2, i).to_bits(),
                expected_sum(5, 2, i).to_bits()
            );
        }
    }

    #[test]
    fn tree_order_groups_by_leaf_not_by_rank() {
        let (a, b, c) = (1.0f32, 1e8f32, -1e8f32);
        // Flat rank order: (1 + 1e8) - 1e8 = 0 (1 is lost in 1e8's rounding).
        assert_eq!(rank_order_sum(&[&[a], &[b], &[c]]), vec![0.0]);
        // Leaves [1.0] and [1e8, -1e8]: 1 + (1e8 - 1e8) = 1.
        let t = tree_order_sum(&[vec![&[a][..]], vec![&[b][..], &[c][..]]]);
        assert_eq!(t, vec![1.0]);
        // Leaves [1e8] and [-1e8, 1.0]: 1e8 + (-1e8 + 1) = 0, where flat
        // rank order (1e8 - 1e8) + 1 gives 1.
        assert_eq!(rank_order_sum(&[&[b], &[c], &[a]]), vec![1.0]);
        let t = tree_order_sum(&[vec![&[b][..]], vec![&[c][..], &[a][..]]]);
        assert_eq!(t, vec![0.0]);
        // Element-wise, and over three leaves: ((a) + (b + c)) + (a).
        let t = tree_order_sum(&[
            vec![&[a, b][..]],
            vec![&[b, c][..], &[c, a][..]],
            vec![&[a, a][..]],
        ]);
        assert_eq!(t, vec![(a + (b + c)) + a, (b + (c + a)) + a]);
        assert_eq!(tree_order_sum(&[]), Vec::<f32>::new());
    }

    #[test]
    fn expected_tree_sum_is_tree_order_sum_of_global_rank_patterns() {
        let sizes = [2u16, 3, 1];
        let (it, len) = (4, 2000);
        let leaves: Vec<Vec<Vec<f32>>> = sizes
            .iter()
            .enumerate()
            .map(|(leaf, &n)| {
                (0..n)
                    .map(|r| {
                        let g = tree_global_rank(&sizes, leaf, r).unwrap();
                        (0..len).map(|i| pattern(g, it, i)).collect()
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<Vec<&[f32]>> = leaves
            .iter()
            .map(|l| l.iter().map(Vec::as_slice).collect())
            .collect();
        let want = tree_order_sum(&refs);
        let mut differs_from_flat = 0;
        for (i, w) in want.iter().enumerate() {
            assert_eq!(expected_tree_sum(&sizes, it, i).to_bits(), w.to_bits());
            differs_from_flat += usize::from(expected_sum(6, it, i).to_bits() != w.to_bits());
        }
        // The patterns are varied enough for the grouping to show.
        assert!(differs_from_flat > 0);
    }

    #[test]
    fn global_rank_is_earlier_leaves_plus_local_rank() {
        let sizes = [2u16, 3, 1];
        let all: Vec<u16> = sizes
            .iter()
            .enumerate()
            .flat_map(|(l, &n)| (0..n).map(move |r| tree_global_rank(&sizes, l, r).unwrap()))
            .collect();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(tree_global_rank(&[7], 0, 6), Ok(6));
        assert_eq!(tree_global_rank(&[65534, 1], 1, 0), Ok(65534));
        assert_eq!(check_tree(&[65534, 1]), Ok(65535));
    }

    #[test]
    fn bad_trees_and_places_are_refused() {
        use TreeError::*;
        assert_eq!(check_tree(&[]), Err(NoLeaves));
        assert_eq!(check_tree(&[2, 0, 1]), Err(EmptyLeaf { leaf: 1 }));
        assert_eq!(
            check_tree(&[65535, 1]),
            Err(TooManyWorkers { total: 65536 })
        );
        assert_eq!(
            tree_global_rank(&[2, 2], 2, 0),
            Err(NoSuchLeaf {
                leaf: 2,
                n_leaves: 2
            })
        );
        assert_eq!(
            tree_global_rank(&[2, 3], 1, 3),
            Err(NoSuchRank {
                leaf: 1,
                rank: 3,
                size: 3
            })
        );
        // The tree is checked even when the place itself would be fine.
        assert_eq!(
            tree_global_rank(&[1, 65535], 0, 0),
            Err(TooManyWorkers { total: 65536 })
        );
        assert_eq!(
            NoSuchRank {
                leaf: 1,
                rank: 3,
                size: 3
            }
            .to_string(),
            "there is no local rank 3 in leaf 1: it has 3 workers, ranks 0 to 2"
        );
    }
}
