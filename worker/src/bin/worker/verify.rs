//! The references of `--verify` that the CLI computes itself: the
//! gradient statistics every rank must get, on one switch or through a
//! tree, and [`CliElement`], how a tensor of f32, bf16 or f16 is filled
//! from the float32 pattern and widened back to compare. (The element sums
//! are [`proto::reference`]'s.)
//!
//! Every reference is of each rank's pattern as that rank sent it, rounded
//! to the dtype, so that the comparison is bit for bit.

use proto::member::{reference_grad_stats, reference_tree_grad_stats, Shape};
use proto::reference::pattern_dtype;
use proto::wire::Dtype;
use worker::{Element, GradStats, Kind};

/// The statistics every rank must get for iteration `it` of `kind` on a
/// single switch: [`reference_grad_stats`] of every rank's pattern rounded
/// to `dtype` and widened back (what each rank sent), `elements` the whole
/// layout (n·m for a reduce-scatter), chunks of `elems_per_chunk`.
pub(crate) fn expected_stats(
    kind: Kind,
    dtype: Dtype,
    n: u16,
    elements: usize,
    elems_per_chunk: u16,
    it: u32,
) -> Option<GradStats> {
    let shape = match kind {
        Kind::AllReduce => Shape::all_reduce(elements),
        Kind::ReduceScatter => Shape::reduce_scatter(0, n, elements / usize::from(n)),
        Kind::AllGather => return None,
    };
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..elements)
                .map(|i| pattern_dtype(dtype, r, it, i))
                .collect()
        })
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    reference_grad_stats(shape, elems_per_chunk, &refs)
}

/// [`expected_stats`] of an all-reduce through a tree whose leaves have
/// `sizes` workers: every global rank's pattern, grouped by leaf.
pub(crate) fn expected_tree_stats(
    dtype: Dtype,
    sizes: &[u16],
    elements: usize,
    elems_per_chunk: u16,
    it: u32,
) -> Option<GradStats> {
    let mut global = 0u16;
    let leaves: Vec<Vec<Vec<f32>>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    let r = global;
                    global += 1;
                    (0..elements)
                        .map(|i| pattern_dtype(dtype, r, it, i))
                        .collect()
                })
                .collect()
        })
        .collect();
    let refs: Vec<Vec<&[f32]>> = leaves
        .iter()
        .map(|l| l.iter().map(Vec::as_slice).collect())
        .collect();
    reference_tree_grad_stats(elements, elems_per_chunk, &refs)
}

/// An element the CLI fills and verifies: converted from the float32
/// pattern (rounded to nearest even) and widened back to compare.
pub(crate) trait CliElement: Element {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl CliElement for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl CliElement for half::bf16 {
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl CliElement for half::f16 {
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::reference::pattern;

    /// The CLI's reference statistics are of every rank's pattern rounded
    /// to the dtype: the same chunking as an all-reduce gives a
    /// reduce-scatter the same bits when the shards end on chunk
    /// boundaries, other chunks other bits; bf16 inputs are the rounded
    /// values; an all-gather has none.
    #[test]
    fn expected_stats_follow_the_chunks_and_the_dtype() {
        let (n, elements) = (4u16, 4 * 60);
        let s = |kind, dtype, e| expected_stats(kind, dtype, n, elements, e, 2).unwrap();
        let ar = s(Kind::AllReduce, Dtype::F32, 20);
        assert_eq!(ar.ranks, 4);
        assert!(s(Kind::ReduceScatter, Dtype::F32, 20).bits_eq(&ar));
        assert!(!s(Kind::ReduceScatter, Dtype::F32, 7).bits_eq(&ar));
        assert!(!s(Kind::AllReduce, Dtype::Bf16, 20).bits_eq(&ar));
        // By hand for one rank, one chunk of five elements, one per lane.
        let one = expected_stats(Kind::AllReduce, Dtype::F32, 1, 5, 8, 0).unwrap();
        let q: Vec<f64> = (0..5)
            .map(|i| f64::from(pattern(0, 0, i)).powi(2))
            .collect();
        let want = ((q[0] + q[1]) + (q[2] + q[3])) + q[4];
        assert_eq!(one.sum_of_squares.to_bits(), want.to_bits());
        assert_eq!(one.square_of_sum.to_bits(), want.to_bits());
        assert_eq!(
            expected_stats(Kind::AllGather, Dtype::F32, n, elements, 20, 2),
            None
        );
        // A one-leaf tree is the single switch; two leaves of two count
        // the same ranks, in tree order.
        let tree = |sizes: &[u16]| expected_tree_stats(Dtype::F32, sizes, elements, 20, 2).unwrap();
        assert!(tree(&[4]).bits_eq(&ar));
        assert_eq!(tree(&[2, 2]).ranks, 4);
    }
}
