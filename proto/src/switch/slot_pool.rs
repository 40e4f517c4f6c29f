//! The slot pool of one job: per slot an aggregation in progress (maybe) and
//! the last result (the shadow copy, maybe), with every buffer allocated
//! when the job is declared.
//!
//! Owns: [`SlotPool`], [`RankSet`].
//!
//! Invariants:
//! * A slot's sum is taken in rank order: rank 0's values, plus rank 1's,
//!   plus …; a contribution that arrives before all lower ranks is parked and
//!   folded in when its turn comes. So a result is bit-identical whatever the
//!   arrival order, retransmissions included.
//! * The shadow copy is kept while the slot aggregates its next seq (as in
//!   SwitchML): otherwise a worker that lost the RESULT of seq s could never
//!   get it back once another rank opened seq s + S.
//! * A half-precision job's contributions are widened to float32 (exactly)
//!   and summed in float32; the sum is rounded once to the dtype when the
//!   slot completes, and the shadow holds the rounded payload bytes, so
//!   resends carry the very bits the first RESULT did. A leaf does not round
//!   its partial (it goes up as float32): it rounds the spine's float32
//!   result, once.
//! * Allocation is fallible ([`SlotPool::try_new`]): a pool the machine
//!   cannot hold is an error, never an abort.

use std::collections::TryReserveError;

use crate::elements;
use crate::wire::Dtype;

/// A bitmap of ranks (no worker ceiling).
#[derive(Debug, Clone, Default)]
pub struct RankSet {
    words: Vec<u64>,
}

impl RankSet {
    fn try_with_ranks(n: u16) -> Result<RankSet, TryReserveError> {
        Ok(RankSet {
            words: try_vec(0u64, (n as usize).div_ceil(64))?,
        })
    }
    pub fn contains(&self, r: u16) -> bool {
        self.words
            .get(r as usize / 64)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }
    fn insert(&mut self, r: u16) {
        if let Some(w) = self.words.get_mut(r as usize / 64) {
            *w |= 1 << (r % 64);
        }
    }
    fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
}

/// `vec![v; len]` that reports an allocation failure instead of aborting.
fn try_vec<T: Clone>(v: T, len: usize) -> Result<Vec<T>, TryReserveError> {
    let mut out = Vec::new();
    out.try_reserve_exact(len)?;
    out.resize(len, v);
    Ok(out)
}

/// A summed chunk: the last completed result of a slot (its shadow), or a
/// leaf's partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shadow {
    pub seq: u32,
    pub collective: u32,
    pub count: u16,
    pub ece: bool,
    /// The folded Internet checksum sum of the result's payload bytes
    /// (0 in a leaf's partial): summed once when the result is made, so
    /// that each RESULT's UDP checksum only adds its own headers.
    pub payload_sum: u16,
}

/// An aggregation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregation {
    pub seq: u32,
    pub collective: u32,
    pub count: u16,
    /// Ranks 0..next_rank are summed into `acc`.
    pub next_rank: u16,
    pub ece: bool,
}

/// A leaf's local sum of one seq, sent up to its spine and kept until the
/// spine's RESULT comes back (docs/PROTOCOL.md, "Aggregation trees"): what
/// a shadow records, for a sum that is not final yet.
pub type Partial = Shadow;

/// One slot.
#[derive(Debug, Clone)]
pub struct Slot {
    pub agg: Option<Aggregation>,
    pub shadow: Option<Shadow>,
    /// A leaf's partial sum awaiting its spine (kept apart from the shadow,
    /// which ranks may still need).
    pub partial: Option<Partial>,
    pub seen: RankSet,
    /// Contributions parked until their turn in rank order.
    parked: RankSet,
    acc: Vec<f32>,
    result: Vec<f32>,
    /// A leaf's partial values (empty on a switch without upstream).
    partial_values: Vec<f32>,
}

impl Slot {
    /// The values of the partial sum awaiting the spine.
    pub fn partial_values(&self) -> &[f32] {
        let n = self.partial.map_or(0, |p| p.count as usize);
        &self.partial_values[..n.min(self.partial_values.len())]
    }

    /// The payload bytes of the shadow copy: `count` elements of `dtype`
    /// (a half-precision sum is stored rounded, in its wire encoding).
    pub fn result_bytes(&self, dtype: Dtype) -> &[u8] {
        let n = self.shadow.map_or(0, |s| dtype.payload_len(s.count));
        let bytes: &[u8] = bytemuck::cast_slice(&self.result);
        &bytes[..n.min(bytes.len())]
    }

    /// Records the checksum sum of the shadow's payload, once per result.
    fn seal_shadow(&mut self, dtype: Dtype) {
        let sum = crate::checksum::Sum::ZERO
            .add_bytes(self.result_bytes(dtype))
            .fold();
        if let Some(sh) = self.shadow.as_mut() {
            sh.payload_sum = sum;
        }
    }
}

/// What the pool did with one contribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Pending,
    Completed,
}

/// The pool of slots of one job.
#[derive(Debug, Clone)]
pub struct SlotPool {
    slots: Vec<Slot>,
    /// Parked contributions: slot-major, then rank, then element.
    parked_values: Vec<f32>,
    n: u16,
    elems: usize,
    dtype: Dtype,
}

impl SlotPool {
    /// Allocates a pool of `slots` slots (a power of two) for `n` ranks and
    /// chunks of `elems` elements of `dtype` (summed as floats).
    /// With `partials`, each slot also keeps a leaf's partial sum.
    pub fn try_new(
        slots: u16,
        n: u16,
        elems: u16,
        dtype: Dtype,
        partials: bool,
    ) -> Result<SlotPool, TryReserveError> {
        let e = elems as usize;
        let mut all = Vec::new();
        all.try_reserve_exact(slots as usize)?;
        for _ in 0..slots {
            all.push(Slot {
                agg: None,
                shadow: None,
                partial: None,
                seen: RankSet::try_with_ranks(n)?,
                parked: RankSet::try_with_ranks(n)?,
                acc: try_vec(0.0, e)?,
                result: try_vec(0.0, e)?,
                partial_values: try_vec(0.0, if partials { e } else { 0 })?,
            });
        }
        Ok(SlotPool {
            slots: all,
            parked_values: try_vec(0.0, slots as usize * n as usize * e)?,
            n,
            elems: e,
            dtype,
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn n(&self) -> u16 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The slot `seq` maps to.
    pub fn index(&self, seq: u32) -> usize {
        (seq as usize) & (self.slots.len() - 1)
    }

    pub fn slot(&self, seq: u32) -> &Slot {
        &self.slots[self.index(seq)]
    }

    /// The slot at index `idx` (`seq mod S`).
    pub fn slots_at(&self, idx: usize) -> &Slot {
        &self.slots[idx]
    }

    pub fn slot_mut(&mut self, seq: u32) -> &mut Slot {
        let i = self.index(seq);
        &mut self.slots[i]
    }

    pub fn clear(&mut self) {
        for s in &mut self.slots {
            s.agg = None;
            s.shadow = None;
            s.partial = None;
            s.seen.clear();
            s.parked.clear();
        }
    }

    /// Folds `values` (little-endian elements of the pool's dtype) into the slot of `seq` as
    /// rank `rank`'s contribution, in rank order. The caller has opened the
    /// aggregation and checked that the rank is not yet seen. With `hold`
    /// (a leaf), a completed sum becomes the slot's partial, not its shadow.
    pub fn take(&mut self, seq: u32, rank: u16, values: &[u8], hold: bool) -> Taken {
        let idx = self.index(seq);
        let n = self.n as usize;
        let e = self.elems;
        let slot = &mut self.slots[idx];
        let Some(agg) = slot.agg.as_mut() else {
            return Taken::Pending;
        };
        let count = agg.count as usize;
        slot.seen.insert(rank);
        if rank != agg.next_rank {
            let base = (idx * n + rank as usize) * e;
            elements::read_le(
                self.dtype,
                values,
                &mut self.parked_values[base..base + count],
            );
            slot.parked.insert(rank);
            return Taken::Pending;
        }
        // Float32 calls its kernels directly: its hot path is as it was.
        match (self.dtype, rank) {
            (Dtype::F32, 0) => crate::simd::read_le_f32(values, &mut slot.acc[..count]),
            (Dtype::F32, _) => crate::simd::add_le_f32(&mut slot.acc[..count], values),
            (d, 0) => elements::read_le(d, values, &mut slot.acc[..count]),
            (d, _) => elements::add_le(d, &mut slot.acc[..count], values),
        }
        agg.next_rank += 1;
        while agg.next_rank < self.n && slot.parked.contains(agg.next_rank) {
            let base = (idx * n + agg.next_rank as usize) * e;
            // The same kernel as a contribution folded on arrival, so the
            // bits are the same whichever way a value came in.
            crate::simd::add_f32(
                &mut slot.acc[..count],
                &self.parked_values[base..base + count],
            );
            agg.next_rank += 1;
        }
        if agg.next_rank < self.n {
            return Taken::Pending;
        }
        let done = Shadow {
            seq: agg.seq,
            collective: agg.collective,
            count: agg.count,
            ece: agg.ece,
            payload_sum: 0,
        };
        slot.agg = None;
        slot.seen.clear();
        slot.parked.clear();
        if hold && slot.partial_values.len() == slot.acc.len() {
            core::mem::swap(&mut slot.acc, &mut slot.partial_values);
            slot.partial = Some(done);
        } else if self.dtype != Dtype::F32 {
            // The one rounding: the float32 sum into the dtype's bytes.
            let out: &mut [u8] = bytemuck::cast_slice_mut(&mut slot.result);
            elements::round_to_le(self.dtype, &slot.acc[..count], out);
            slot.shadow = Some(done);
            slot.seal_shadow(self.dtype);
        } else {
            core::mem::swap(&mut slot.acc, &mut slot.result);
            slot.shadow = Some(done);
            slot.seal_shadow(self.dtype);
        }
        Taken::Completed
    }

    /// The spine's RESULT for the partial of `seq` (float32, whatever the
    /// job's dtype): it becomes the slot's shadow (the final sum, rounded
    /// once to a half-precision dtype, `ece` OR-ed along the tree). False if
    /// the slot holds no partial of `seq` or `values` has another length.
    pub fn finish_partial(&mut self, seq: u32, values: &[u8], ece: bool) -> bool {
        let dtype = self.dtype;
        let slot = self.slot_mut(seq);
        let Some(p) = slot.partial.filter(|p| p.seq == seq) else {
            return false;
        };
        let count = p.count as usize;
        if values.len() != count * 4 || slot.result.len() < count {
            return false;
        }
        if dtype == Dtype::F32 {
            crate::simd::read_le_f32(values, &mut slot.result[..count]);
        } else {
            let mut sum = [0f32; 256];
            let out: &mut [u8] = bytemuck::cast_slice_mut(&mut slot.result);
            for (i, part) in values.chunks(sum.len() * 4).enumerate() {
                let n = part.len() / 4;
                crate::simd::read_le_f32(part, &mut sum[..n]);
                let at = i * sum.len() * dtype.size();
                elements::round_to_le(dtype, &sum[..n], &mut out[at..at + n * dtype.size()]);
            }
        }
        slot.partial = None;
        slot.shadow = Some(Shadow {
            ece: p.ece || ece,
            ..p
        });
        slot.seal_shadow(dtype);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::Sum;

    fn open(pool: &mut SlotPool, seq: u32, count: u16) {
        pool.slot_mut(seq).agg = Some(Aggregation {
            seq,
            collective: 0,
            count,
            next_rank: 0,
            ece: false,
        });
    }

    /// The checksum sum recorded with a result is its payload's, whether
    /// the result was summed here (float32, bf16) or came from a spine.
    #[test]
    fn a_result_records_its_payloads_checksum_sum() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for leaf in [false, true] {
                let mut pool = SlotPool::try_new(4, 2, 8, dtype, leaf).unwrap();
                let count = 5u16;
                let size = dtype.payload_len(count);
                let vals: Vec<u8> = (0..size).map(|i| (i * 29 + 3) as u8 & 0x3f).collect();
                for seq in 0..6u32 {
                    open(&mut pool, seq, count);
                    assert_eq!(pool.take(seq, 1, &vals, leaf), Taken::Pending);
                    assert_eq!(pool.take(seq, 0, &vals, leaf), Taken::Completed);
                    if leaf {
                        let spine: Vec<u8> =
                            (0..count * 4).map(|i| (i as u8) ^ seq as u8).collect();
                        assert!(pool.finish_partial(seq, &spine, false));
                    }
                    let slot = pool.slot(seq);
                    let sh = slot.shadow.unwrap();
                    assert_eq!(sh.seq, seq);
                    let payload = slot.result_bytes(dtype);
                    assert_eq!(payload.len(), size);
                    assert_eq!(
                        sh.payload_sum,
                        Sum::ZERO.add_bytes(payload).fold(),
                        "{dtype:?} leaf {leaf} seq {seq}"
                    );
                }
            }
        }
    }
}
