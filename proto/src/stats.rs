//! Gradient statistics (docs/PROTOCOL.md, "Gradient statistics"): what a
//! `stats = true` job's switch measures while it sums, how it travels, and
//! the reference every implementation must equal bit for bit.
//!
//! Owns: [`GradStats`] (the trailer of a stats job's RESULT, and of a leaf's
//! partial), [`squared_norm`] and its half-precision form (the one float64
//! order), [`chunk_stats`] and [`tree_chunk_stats`] (a chunk's reference),
//! [`CollectiveStats`] (the worker's fold of its chunks, in seq order).
//! The trailer's length, [`STATS_LEN`], is the wire format's
//! ([`crate::wire`], below this module), re-exported here.
//!
//! Invariants:
//! * Every value is a function of the inputs and of the documented order
//!   alone: per element, the widened float32 value is converted to float64
//!   (exact) and squared in float64; a vector's squares are summed in
//!   [`LANES`] lanes (element k into lane k mod 8, in increasing k), and
//!   the lanes combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
//!   a chunk's ranks are summed in rank order (trees: each leaf's ranks,
//!   then the leaves in leaf order); a collective's chunks in seq order.
//!   So every worker, every run and every arrival order gets the same bits.
//! * `square_of_sum` is the squared norm of the float32 sum before it is
//!   rounded to the job's dtype (for f32 jobs, the RESULT itself).

use crate::dtype::Dtype;
use crate::elements;
use crate::wire::WireError;
pub use crate::wire::STATS_LEN;

/// Lanes of [`squared_norm`]'s float64 sum (part of the definition).
pub const LANES: usize = 8;

/// One chunk's (or one collective's) statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GradStats {
    /// Σᵢ ‖gᵢ‖² over the contributing ranks' own values.
    pub sum_of_squares: f64,
    /// ‖Σᵢ gᵢ‖² of the float32 sum (in a leaf's partial: 0, ignored).
    pub square_of_sum: f64,
    /// How many ranks' gradients `sum_of_squares` covers (a tree's: every
    /// leaf's ranks).
    pub ranks: u32,
}

impl GradStats {
    /// Parses a trailer of exactly [`STATS_LEN`] bytes; the 4 reserved bytes
    /// must be zero.
    pub fn parse(b: &[u8]) -> Result<GradStats, WireError> {
        if b.len() != STATS_LEN {
            return Err(WireError::PayloadLength {
                len: b.len(),
                what: "a statistics trailer (24 bytes)",
            });
        }
        let f = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[r]);
            f64::from_bits(u64::from_be_bytes(a))
        };
        if b[20..24] != [0; 4] {
            return Err(WireError::PayloadLength {
                len: b.len(),
                what: "a statistics trailer whose last 4 bytes are zero",
            });
        }
        Ok(GradStats {
            sum_of_squares: f(0..8),
            square_of_sum: f(8..16),
            ranks: u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        })
    }

    /// Writes the trailer to the front of `b`; returns [`STATS_LEN`].
    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        if b.len() < STATS_LEN {
            return Err(WireError::Truncated {
                len: b.len(),
                need: STATS_LEN,
            });
        }
        b[0..8].copy_from_slice(&self.sum_of_squares.to_bits().to_be_bytes());
        b[8..16].copy_from_slice(&self.square_of_sum.to_bits().to_be_bytes());
        b[16..20].copy_from_slice(&self.ranks.to_be_bytes());
        b[20..24].fill(0);
        Ok(STATS_LEN)
    }

    /// Whether both are the same bits (NaN included), as reproducibility
    /// is checked.
    pub fn bits_eq(&self, other: &GradStats) -> bool {
        self.sum_of_squares.to_bits() == other.sum_of_squares.to_bits()
            && self.square_of_sum.to_bits() == other.square_of_sum.to_bits()
            && self.ranks == other.ranks
    }
}

/// ‖x‖² in float64, in the documented order ([`LANES`] lanes).
pub fn squared_norm(x: &[f32]) -> f64 {
    let mut lane = [0f64; LANES];
    add_squares(&mut lane, x);
    combine(&lane)
}

/// Adds the squares of `x` to `lane`, element k into lane k mod 8: the
/// documented order when `x` starts at a multiple of [`LANES`].
fn add_squares(lane: &mut [f64; LANES], x: &[f32]) {
    let mut blocks = x.chunks_exact(LANES);
    for b in &mut blocks {
        for (l, v) in lane.iter_mut().zip(b) {
            let v = f64::from(*v);
            *l += v * v;
        }
    }
    for (l, v) in lane.iter_mut().zip(blocks.remainder()) {
        let v = f64::from(*v);
        *l += v * v;
    }
}

/// [`squared_norm_le`] with no scratch from the caller: the payload is
/// widened 64 elements at a time into a buffer on the stack (a multiple of
/// [`LANES`], so element k still goes to lane k mod 8), which stays in the
/// L1 cache where a chunk-sized scratch would not: the same bits.
pub fn squared_norm_le_blocked(dtype: Dtype, payload: &[u8]) -> f64 {
    const BLOCK: usize = 8 * LANES;
    let mut buf = [0f32; BLOCK];
    let mut lane = [0f64; LANES];
    for chunk in payload.chunks(BLOCK * dtype.size()) {
        let n = chunk.len() / dtype.size();
        elements::read_le(dtype, chunk, &mut buf[..n]);
        add_squares(&mut lane, &buf[..n]);
    }
    combine(&lane)
}

/// ‖x‖² of a DATA payload of `dtype` (little-endian elements), each element
/// widened to float32 first: the same bits as [`squared_norm`] of the
/// widened values. `scratch` holds at least the payload's elements.
pub fn squared_norm_le(dtype: Dtype, payload: &[u8], scratch: &mut [f32]) -> f64 {
    let n = payload.len() / dtype.size();
    let vals = &mut scratch[..n];
    elements::read_le(dtype, payload, vals);
    squared_norm(vals)
}

fn combine(l: &[f64; LANES]) -> f64 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// A chunk's statistics on a single switch: `inputs` are the ranks' widened
/// values in rank order, `sum` the float32 rank-order sum before rounding.
pub fn chunk_stats(inputs: &[&[f32]], sum: &[f32]) -> GradStats {
    let mut sos = 0f64;
    for x in inputs {
        sos += squared_norm(x);
    }
    GradStats {
        sum_of_squares: sos,
        square_of_sum: squared_norm(sum),
        ranks: inputs.len() as u32,
    }
}

/// A chunk's statistics at a tree's spine: `leaves[l]` are leaf l's ranks'
/// widened values in rank order, `sum` the float32 tree-order sum. A leaf's
/// part is its ranks' sum of squares in rank order; the spine adds the
/// leaves' parts in leaf order.
pub fn tree_chunk_stats(leaves: &[Vec<&[f32]>], sum: &[f32]) -> GradStats {
    let mut sos = 0f64;
    let mut ranks = 0u32;
    for leaf in leaves {
        sos += chunk_stats(leaf, &[]).sum_of_squares;
        ranks += leaf.len() as u32;
    }
    GradStats {
        sum_of_squares: sos,
        square_of_sum: squared_norm(sum),
        ranks,
    }
}

/// A worker's statistics of one collective: its chunks' trailers added in
/// seq order (chunk 0 first), whatever order their RESULTs came in.
#[derive(Debug, Clone, Default)]
pub struct CollectiveStats {
    per_chunk: Vec<Option<GradStats>>,
}

impl CollectiveStats {
    /// Starts a collective of `chunks` chunks (reuses the allocation).
    pub fn start(&mut self, chunks: usize) {
        self.per_chunk.clear();
        self.per_chunk.resize(chunks, None);
    }

    /// Records chunk `index`'s trailer (a resend's is the same; the first
    /// one stays).
    pub fn record(&mut self, index: usize, s: GradStats) {
        if let Some(slot) = self.per_chunk.get_mut(index) {
            slot.get_or_insert(s);
        }
    }

    /// Adds the trailers of `other` (the same collective's, recorded by
    /// another share) for the chunks this one has none of; returns false,
    /// adding nothing, when the two count different chunks.
    pub fn absorb(&mut self, other: &CollectiveStats) -> bool {
        if other.per_chunk.len() != self.per_chunk.len() {
            return false;
        }
        for (mine, theirs) in self.per_chunk.iter_mut().zip(&other.per_chunk) {
            if mine.is_none() {
                *mine = *theirs;
            }
        }
        true
    }

    /// The collective's statistics, once every chunk's trailer is in:
    /// sums in seq order; `ranks` is the chunks' (all equal), or `None`
    /// while one is missing.
    pub fn total(&self) -> Option<GradStats> {
        CollectiveStats::total_of(&[self])
    }

    /// [`CollectiveStats::total`] of one collective whose chunks were
    /// recorded by several shares (docs/design/worker-threads.md): chunk
    /// i's trailer is the first share's that has one, and the fold is in
    /// seq order as one share's would be, so it is the same bits. `None`
    /// while a chunk has no trailer in any share, or if the shares count
    /// different chunks.
    pub fn total_of(shares: &[&CollectiveStats]) -> Option<GradStats> {
        let n = shares.first()?.per_chunk.len();
        if shares.iter().any(|s| s.per_chunk.len() != n) {
            return None;
        }
        let mut t = GradStats::default();
        for i in 0..n {
            let s = shares.iter().find_map(|c| c.per_chunk[i])?;
            t.sum_of_squares += s.sum_of_squares;
            t.square_of_sum += s.square_of_sum;
            t.ranks = s.ranks;
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{pattern, rank_order_sum};

    #[test]
    fn trailer_round_trips_big_endian_and_refuses_a_wrong_length() {
        let s = GradStats {
            sum_of_squares: 1.5,
            square_of_sum: -0.0,
            ranks: 4,
        };
        let mut b = [0xffu8; STATS_LEN];
        assert_eq!(s.emit(&mut b).unwrap(), STATS_LEN);
        assert_eq!(b[..8], 1.5f64.to_bits().to_be_bytes());
        assert_eq!(b[8], 0x80, "-0.0 keeps its sign bit");
        assert_eq!(b[16..], [0, 0, 0, 4, 0, 0, 0, 0]);
        assert!(GradStats::parse(&b).unwrap().bits_eq(&s));
        assert!(GradStats::parse(&b[..23]).is_err());
        b[23] = 1;
        assert!(GradStats::parse(&b).is_err(), "reserved bytes must be zero");
        assert!(s.emit(&mut [0u8; 23]).is_err());
    }

    #[test]
    fn squared_norm_follows_the_lane_order_not_the_naive_one() {
        // Values whose float64 squares round differently when summed in
        // another order, so a kernel that reorders is caught.
        let x: Vec<f32> = (0..37).map(|i| pattern(1, 7, i) * 1e3).collect();
        let mut lane = [0f64; LANES];
        for (k, v) in x.iter().enumerate() {
            lane[k % LANES] += f64::from(*v) * f64::from(*v);
        }
        let want = ((lane[0] + lane[1]) + (lane[2] + lane[3]))
            + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        assert_eq!(squared_norm(&x).to_bits(), want.to_bits());
        assert_eq!(squared_norm(&[]), 0.0);
        assert_eq!(squared_norm(&[3.0]), 9.0);
    }

    #[test]
    fn half_precision_norm_is_the_norm_of_the_widened_values() {
        let vals: Vec<f32> = (0..20)
            .map(|i| elements::round_f32(Dtype::Bf16, pattern(0, 3, i)))
            .collect();
        let mut bytes = vec![0u8; vals.len() * 2];
        elements::round_to_le(Dtype::Bf16, &vals, &mut bytes);
        let mut scratch = [0f32; 64];
        assert_eq!(
            squared_norm_le(Dtype::Bf16, &bytes, &mut scratch).to_bits(),
            squared_norm(&vals).to_bits()
        );
    }

    #[test]
    fn the_blocked_norm_has_the_same_bits() {
        // Lengths around the 64-element blocks and the 8 lanes, values of
        // far-apart magnitudes (so another lane order would show).
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for len in [0usize, 1, 7, 8, 63, 64, 65, 130, 356, 712] {
                let vals: Vec<f32> = (0..len)
                    .map(|i| elements::round_f32(dtype, pattern(2, 5, i) * 37.0))
                    .collect();
                let mut bytes = vec![0u8; len * dtype.size()];
                elements::round_to_le(dtype, &vals, &mut bytes);
                assert_eq!(
                    squared_norm_le_blocked(dtype, &bytes).to_bits(),
                    squared_norm(&vals).to_bits(),
                    "{dtype:?} {len}"
                );
            }
        }
    }

    #[test]
    fn chunk_and_collective_statistics_match_their_definitions() {
        let a: Vec<f32> = (0..10).map(|i| pattern(0, 1, i)).collect();
        let b: Vec<f32> = (0..10).map(|i| pattern(1, 1, i)).collect();
        let sum = rank_order_sum(&[&a, &b]);
        let s = chunk_stats(&[&a, &b], &sum);
        assert_eq!(s.ranks, 2);
        assert_eq!(
            s.sum_of_squares.to_bits(),
            (squared_norm(&a) + squared_norm(&b)).to_bits()
        );
        assert_eq!(s.square_of_sum.to_bits(), squared_norm(&sum).to_bits());
        let t = tree_chunk_stats(&[vec![&a], vec![&b]], &sum);
        assert!(t.bits_eq(&s), "one rank per leaf adds in the same order");

        let mut c = CollectiveStats::default();
        c.start(3);
        let chunk = |v: f64| GradStats {
            sum_of_squares: v,
            square_of_sum: 2.0 * v,
            ranks: 2,
        };
        c.record(2, chunk(1e-17));
        c.record(0, chunk(1.0));
        assert_eq!(c.total(), None, "chunk 1 is missing");
        c.record(1, chunk(-1.0));
        c.record(1, chunk(5.0));
        let t = c.total().unwrap();
        // Seq order: (1.0 + -1.0) + 1e-17, not 1.0 + (1e-17 + -1.0).
        assert_eq!(t.sum_of_squares, 1e-17);
        assert_eq!(t.ranks, 2);

        // Two shares' trailers in one store: each chunk's first one stays,
        // a store of another collective's size is refused whole.
        let mut a = CollectiveStats::default();
        a.start(3);
        a.record(1, chunk(7.0));
        let mut b = CollectiveStats::default();
        b.start(3);
        b.record(0, chunk(1.0));
        b.record(1, chunk(-1.0));
        assert!(a.absorb(&b));
        assert_eq!(a.total(), None, "chunk 2 is missing");
        a.record(2, chunk(1e-17));
        assert_eq!(a.total().unwrap().sum_of_squares, (1.0 + 7.0) + 1e-17);
        let mut other = CollectiveStats::default();
        other.start(4);
        other.record(3, chunk(2.0));
        assert!(!a.absorb(&other));
        assert_eq!(a.total().unwrap().sum_of_squares, (1.0 + 7.0) + 1e-17);
    }
}
