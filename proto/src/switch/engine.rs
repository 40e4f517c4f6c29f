//! The slot engine of one job: the slot pool that several dataplane threads
//! drive at once, with `&self` methods and no lock shared across slots.
//!
//! Owns: [`SlotEngine`] (per slot an aggregation in progress, the last
//! result (the shadow) and a leaf's partial), the job's window floor (one
//! per seq lane), and [`RankSet`].
//!
//! Invariants:
//! * A slot's sum is taken in rank order (rank 0's values, plus rank 1's, …)
//!   with the kernels of [`crate::simd`] and [`crate::elements`], whatever
//!   the arrival order and whichever thread brings what: results are
//!   bit-identical to [`crate::reference`]'s rank-order sums.
//! * Collective kinds (docs/PROTOCOL.md, "Collective kinds"): a seq's kind,
//!   owner and count are those of its first contribution; a reduce-scatter
//!   is summed as an all-reduce; an all-gather's accumulator (and the
//!   owner's row, if it comes early) holds the owner's wire bytes, copied,
//!   never converted, and the other ranks' NOVAL arrivals take their turn
//!   in the fold with nothing to add. The shadow records kind and owner, so
//!   [`ResultRef::for_rank`] tells who gets values.
//! * Per slot, a small mutex (its `Meta`) guards the slot's bookkeeping and is
//!   held only for a few loads and stores, never across a copy or a sum.
//!   A contributor claims its rank under it; then, outside it, either folds
//!   its values straight into the accumulator (when it holds the slot's fold
//!   token: its rank is the next one due) or writes them, widened to
//!   float32, into its rank's row. The token holder folds every ready row
//!   that is due, in rank order, and the one that folds the last rank
//!   completes the slot. Whoever holds a row or the token is its only
//!   writer: that is what each `unsafe` block relies on.
//! * A completed result is written under the slot's result `RwLock`
//!   (readers: [`SlotEngine::with_result`]), then published in the meta and
//!   in the slot's shadow tag; the floor (an atomic) advances over every
//!   slot whose tag says it holds the floor's result. The shadow stays while
//!   the slot aggregates its next seq (resends are answered from it).
//! * Seq lanes: seq s belongs to lane s mod L (L a power of two dividing
//!   the slot count, 1 unless [`SlotEngine::try_with_lanes`] says more), so
//!   a slot belongs to one lane. Each lane has its own floor word, on its
//!   own cache line: the oldest incomplete seq of the lane. A DATA is
//!   judged (Stale, BeyondWindow) against its lane's floor, and a
//!   completion moves only its lane's floor, so threads that each take
//!   their own lanes (a NIC steering seq lanes to queues) share no line
//!   per chunk. The job's floor is the lowest lane floor.
//! * A lane's floor and the activation's epoch share one atomic word, so
//!   that a floor advance of an old activation can never land in a new one.
//!   [`SlotEngine::reset`] bumps the epoch and sets the floors; slots are
//!   emptied lazily by the first contribution of the new epoch, and
//!   everything that reads a slot treats an older epoch as empty. Work of
//!   an older epoch still in flight (a row being written, a token held) is
//!   discarded when it comes back; meanwhile the new epoch does not touch
//!   that row or the accumulator (SlotBusy: the worker resends).
//! * Lock order: result, then partial, then meta. Nothing blocks on a
//!   contributor's copy or sum except a reader of the result being replaced.
//! * Every buffer is allocated in [`SlotEngine::try_new`], fallibly; a
//!   contribution allocates nothing.
//! * Gradient statistics (a `stats` engine, summed kinds only; docs/
//!   PROTOCOL.md, "Gradient statistics"): the fold token holder adds each
//!   rank's part to the slot's running (float64 sum of squares, ranks)
//!   when it folds that rank, so in rank order like the sum. A rank's part
//!   is its squared norm ([`crate::stats::squared_norm`] of its widened
//!   values) and 1, or, for a leaf's partial at a spine, the leaf's
//!   trailer (its ranks' sum of squares and count). A parked row keeps the
//!   part in its tail, after a full chunk. The completion takes the
//!   squared norm of the float32 accumulator before rounding and writes the
//!   24-byte trailer right after the result's values (a leaf's partial:
//!   square of sum 0), where resends find it. An engine without stats pays
//!   one predictable branch per fold.
#![allow(unsafe_code)]

use std::collections::TryReserveError;

use super::counters::DropReason;
use crate::elements;
use crate::seq::serial_offset;
use crate::stats::{squared_norm, squared_norm_le_blocked, GradStats, STATS_LEN};
use crate::wire::{Dtype, Kind};

use sync::{
    AtomicU16, AtomicU64, Mutex, MutexGuard, Ordering, RwLock, RwLockReadGuard, UnsafeCell,
};

/// The synchronisation primitives: loom's when model-checking, std's (plus
/// a cell with loom's `with`/`with_mut` API) otherwise.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::{
        cell::UnsafeCell,
        sync::atomic::{AtomicU16, AtomicU64, Ordering},
        sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard},
    };
    #[cfg(not(loom))]
    pub(super) use std::sync::{
        atomic::{AtomicU16, AtomicU64, Ordering},
        Mutex, MutexGuard, RwLock, RwLockReadGuard,
    };

    /// `std::cell::UnsafeCell` with loom's closure API, so that the same
    /// code runs under the model checker.
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub(super) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        pub(super) fn new(v: T) -> UnsafeCell<T> {
            UnsafeCell(std::cell::UnsafeCell::new(v))
        }
        #[inline]
        pub(super) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }
        #[inline]
        pub(super) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

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
    fn remove(&mut self, r: u16) {
        if let Some(w) = self.words.get_mut(r as usize / 64) {
            *w &= !(1 << (r % 64));
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
    /// The collective's kind, and the chunk's owner (0 in an all-reduce):
    /// who gets values in the RESULT ([`Kind::receives_values`]).
    pub kind: Kind,
    pub owner: u16,
    /// The folded Internet checksum sum of the result's payload bytes
    /// (0 in a leaf's partial): summed once when the result is made, so
    /// that each RESULT's UDP checksum only adds its own headers. With a
    /// statistics trailer, of the values and the trailer.
    pub payload_sum: u16,
    /// The values are followed by a statistics trailer ([`STATS_LEN`]
    /// bytes): a `stats` engine's summed chunk.
    pub stats: bool,
}

/// An aggregation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregation {
    pub seq: u32,
    pub collective: u32,
    pub count: u16,
    /// Kind and owner named by the seq's first DATA; every later DATA must
    /// name the same (docs/PROTOCOL.md, "Collective kinds").
    pub kind: Kind,
    pub owner: u16,
    /// Ranks 0..next_rank are summed into the accumulator.
    pub next_rank: u16,
    /// A reduce-scatter's owner sent NOVAL: it keeps its shard, and the
    /// sum is of the other ranks ([`Kind::owner_may_keep_values`]).
    pub owner_kept: bool,
    pub ece: bool,
}

impl Aggregation {
    /// Whether rank `r` brought no values (its turn in the fold is empty):
    /// an all-gather's other ranks, a reduce-scatter's owner that kept
    /// its shard. Known for every rank that is ready.
    fn is_empty_turn(&self, r: u16) -> bool {
        match self.kind {
            Kind::AllGather => r != self.owner,
            Kind::ReduceScatter => self.owner_kept && r == self.owner,
            Kind::AllReduce => false,
        }
    }

    /// The rank whose values start the sum (copied into the accumulator;
    /// the later ones are added): rank 0, or rank 1 when rank 0 is a
    /// reduce-scatter's owner that kept its shard. Known once rank 0 is
    /// ready, so before any rank is folded.
    fn first_valued(&self) -> u16 {
        u16::from(self.is_empty_turn(0))
    }
}

/// A leaf's local sum of one seq, sent up to its spine and kept until the
/// spine's RESULT comes back (docs/PROTOCOL.md, "Aggregation trees"): what
/// a shadow records, for a sum that is not final yet.
pub type Partial = Shadow;

/// A completed result, read-locked: no completion can overwrite it while
/// this is held ([`SlotEngine::result`]).
pub struct ResultRef<'a> {
    held: RwLockReadGuard<'a, Held>,
    shadow: Shadow,
    len: usize,
    /// The view of a rank that gets no values ([`ResultRef::for_rank`]).
    noval: bool,
}

impl ResultRef<'_> {
    /// The result's metadata.
    pub fn shadow(&self) -> Shadow {
        self.shadow
    }

    /// The RESULT payload before any tag: `count` elements in the dtype's
    /// wire encoding (none in the view of a rank that gets a NOVAL RESULT),
    /// then the statistics trailer if the result has one.
    pub fn bytes(&self) -> &[u8] {
        let bytes: &[u8] = bytemuck::cast_slice(&self.held.values);
        let end = (self.len + self.trailer_len()).min(bytes.len());
        let start = if self.noval { self.len.min(end) } else { 0 };
        &bytes[start..end]
    }

    /// The statistics trailer's bytes (empty when the result has none).
    pub fn trailer(&self) -> &[u8] {
        let bytes: &[u8] = bytemuck::cast_slice(&self.held.values);
        let end = (self.len + self.trailer_len()).min(bytes.len());
        &bytes[self.len.min(end)..end]
    }

    /// The chunk's statistics, if the result carries them.
    pub fn stats(&self) -> Option<GradStats> {
        GradStats::parse(self.trailer()).ok()
    }

    fn trailer_len(&self) -> usize {
        if self.shadow.stats {
            STATS_LEN
        } else {
            0
        }
    }

    /// The folded checksum sum of [`ResultRef::bytes`] (made once, when the
    /// result was; a NOVAL view's trailer, 24 bytes, is summed here).
    pub fn payload_sum(&self) -> u16 {
        if !self.noval {
            self.shadow.payload_sum
        } else if self.shadow.stats {
            crate::checksum::Sum::ZERO.add_bytes(self.trailer()).fold()
        } else {
            0
        }
    }

    /// Whether this view carries no values (a NOVAL RESULT).
    pub fn no_values(&self) -> bool {
        self.noval
    }

    /// The view of `rank`: the values, or none when the collective's kind
    /// gives `rank` a NOVAL RESULT for this chunk.
    pub fn for_rank(mut self, rank: u16) -> Self {
        self.set_rank(rank);
        self
    }

    /// Makes this the view of `rank` ([`ResultRef::for_rank`] in place):
    /// one read lock serves every member of a fan-out.
    pub fn set_rank(&mut self, rank: u16) {
        self.noval = !self.shadow.kind.receives_values(rank, self.shadow.owner);
    }
}

/// What one slot holds, as one consistent snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotState {
    pub agg: Option<Aggregation>,
    pub shadow: Option<Shadow>,
    /// A leaf's partial sum awaiting its spine.
    pub partial: Option<Partial>,
}

/// One contribution: a DATA's header fields and payload.
#[derive(Debug, Clone, Copy)]
pub struct Contribution<'a> {
    pub seq: u32,
    pub rank: u16,
    pub collective: u32,
    pub count: u16,
    /// The collective's kind and the chunk's owner (the DATA's `window`
    /// field; ignored in an all-reduce).
    pub kind: Kind,
    pub owner: u16,
    /// A NOVAL DATA: the rank's arrival without values (`values` empty).
    pub noval: bool,
    /// Little-endian elements of the job's dtype: `payload_len(count)` bytes
    /// (none when `noval`).
    pub values: &'a [u8],
    /// The DATA's IP header was CE-marked.
    pub ce: bool,
}

/// What the engine did with one contribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contributed {
    /// Counted as a contribution.
    Taken,
    /// This call completed the slot: the shadow is published and the floor
    /// advanced.
    Completed { seq: u32, ece: bool },
    /// (A leaf) this call completed the slot into a partial.
    PartialReady { seq: u32 },
    /// `seq`'s shadow is held: answer from it.
    Retransmit { seq: u32 },
    /// Not counted. `Stale` also stands for a contribution that a
    /// [`SlotEngine::reset`] overtook while it was being summed.
    Dropped(DropReason),
}

/// A slot's bookkeeping, guarded by its mutex.
#[derive(Debug)]
struct Meta {
    /// The activation these contents belong to; older is empty.
    epoch: u32,
    agg: Option<Aggregation>,
    shadow: Option<Shadow>,
    partial: Option<Partial>,
    /// Ranks claimed for `agg`.
    seen: RankSet,
    /// Ranks whose row is written and not yet folded.
    ready: RankSet,
    /// Rows being written outside the lock (any epoch: kept by a reset, so
    /// a new epoch never writes a row an old contributor still writes).
    writing: RankSet,
    /// The epoch of the fold token's holder, if held (kept by a reset, for
    /// the same reason, for the accumulator and the rows being folded).
    folding: Option<u32>,
}

impl Meta {
    /// Empties the slot for activation `epoch` (what is in flight stays
    /// marked, see `writing` and `folding`).
    fn renew(&mut self, epoch: u32) {
        self.epoch = epoch;
        self.agg = None;
        self.shadow = None;
        self.partial = None;
        self.seen.clear();
        self.ready.clear();
    }
}

/// A summed chunk's values, under the slot's `RwLock`: what readers see.
#[derive(Debug)]
struct Held {
    what: Option<Shadow>,
    epoch: u32,
    /// The result: the dtype's wire encoding in the first `payload_len`
    /// bytes; a partial: float32 values.
    values: Vec<f32>,
}

impl Held {
    fn get(&self, seq: u32, epoch: u32) -> Option<Shadow> {
        self.what.filter(|s| s.seq == seq && self.epoch == epoch)
    }
}

/// One slot. Aligned so that two slots' locks never share a cache line.
#[repr(align(64))]
#[derive(Debug)]
struct Slot {
    meta: Mutex<Meta>,
    /// `tag(epoch, seq)` of the published shadow (0: none), read by floor
    /// advances without taking the meta lock.
    shadow_tag: AtomicU64,
    /// The running sum: the fold token holder's.
    acc: UnsafeCell<Vec<f32>>,
    /// A `stats` engine's running Σ of the folded ranks' squared norms, in
    /// rank order, and how many ranks it covers: the fold token holder's,
    /// like `acc`.
    sos: UnsafeCell<(f64, u32)>,
    /// One row per rank: contributions parked until their turn, widened to
    /// float32; written only by the rank's claimant, read only by the token
    /// holder once the row is ready.
    rows: Vec<UnsafeCell<Vec<f32>>>,
    result: RwLock<Held>,
    /// A leaf's partial (values empty on a switch without upstream).
    partial: RwLock<Held>,
}

// SAFETY: the `UnsafeCell`s of a slot are reached only by the thread that
// holds the right to them under the slot's mutex (a rank's row: the rank's
// claim while it is in `writing`, then the fold token; the accumulator and
// ready rows: the fold token), as the module invariants describe. Everything
// else is behind a `Mutex`, a `RwLock` or an atomic.
unsafe impl Sync for Slot {}

/// The concurrent slot pool of one job. `Send + Sync`: share it with `Arc`.
#[derive(Debug)]
pub struct SlotEngine {
    slots: Vec<Slot>,
    /// Per seq lane, `tag(epoch, floor)`: the activation and the lane's
    /// oldest incomplete seq. Each on a cache line of its own: every
    /// completion in the lane writes it, and neither another lane's word
    /// nor the fields every contribution reads may move with it.
    lanes: Vec<CacheLine<AtomicU64>>,
    /// Serialises resets, so that every lane ends in the same activation.
    resets: Mutex<()>,
    window: AtomicU16,
    n: u16,
    elems: usize,
    dtype: Dtype,
    partials: bool,
    /// Gradient statistics of summed chunks (module docs).
    stats: bool,
}

/// A value alone on its cache line.
#[repr(align(64))]
#[derive(Debug)]
struct CacheLine<T>(T);

impl<T> core::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The floor words of `lanes` seq lanes of a new engine: epoch 1, lane l
/// from seq l.
fn floor_words(lanes: usize) -> Result<Vec<CacheLine<AtomicU64>>, TryReserveError> {
    let mut words = Vec::new();
    words.try_reserve_exact(lanes)?;
    words.extend((0..lanes).map(|l| CacheLine(AtomicU64::new(tag(1, l as u32)))));
    Ok(words)
}

fn tag(epoch: u32, seq: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(seq)
}

fn split(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// The fold that completed `slot` under activation `epoch` is over: gives
/// the token back and empties the aggregation, returning the meta (still
/// locked) to publish the sum in; None if a reset came meanwhile (the sum
/// is discarded).
fn settle(slot: &Slot, epoch: u32) -> Option<MutexGuard<'_, Meta>> {
    let mut m = lock(&slot.meta);
    m.folding = None;
    if m.epoch != epoch {
        return None;
    }
    m.agg = None;
    m.seen.clear();
    m.ready.clear();
    Some(m)
}

fn lock(m: &Mutex<Meta>) -> MutexGuard<'_, Meta> {
    // A panic elsewhere leaves the meta consistent (it is only stored to in
    // short sequences that cannot panic), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SlotEngine {
    /// Allocates an engine of `slots` slots (a power of two) for `n` ranks
    /// and chunks of `elems` elements of `dtype`, window `window` (clamped
    /// to 1..=slots), floor 0. With `partials` (a leaf), completed sums are
    /// held as partials for the spine.
    pub fn try_new(
        slots: u16,
        n: u16,
        elems: u16,
        dtype: Dtype,
        partials: bool,
        window: u16,
    ) -> Result<SlotEngine, TryReserveError> {
        Self::try_with_stats(slots, n, elems, dtype, partials, window, false)
    }

    /// [`SlotEngine::try_new`], with gradient statistics when `stats`
    /// (docs/PROTOCOL.md, "Gradient statistics"): each summed result (or
    /// a leaf's partial) carries its trailer after its values.
    pub fn try_with_stats(
        slots: u16,
        n: u16,
        elems: u16,
        dtype: Dtype,
        partials: bool,
        window: u16,
        stats: bool,
    ) -> Result<SlotEngine, TryReserveError> {
        debug_assert!(slots.is_power_of_two(), "slots must be a power of two");
        let e = elems as usize;
        // Room for the trailer after a full chunk's float32 values, in the
        // buffers that become a result or a partial (they swap with `acc`).
        let held = if stats { e + STATS_LEN / 4 } else { e };
        // A parked row's tail holds the rank's statistics part.
        let row = if stats { e + PART_FLOATS } else { e };
        let mut all = Vec::new();
        all.try_reserve_exact(slots as usize)?;
        for _ in 0..slots {
            let mut rows = Vec::new();
            rows.try_reserve_exact(n as usize)?;
            for _ in 0..n {
                rows.push(UnsafeCell::new(try_vec(0.0, row)?));
            }
            all.push(Slot {
                meta: Mutex::new(Meta {
                    epoch: 1,
                    agg: None,
                    shadow: None,
                    partial: None,
                    seen: RankSet::try_with_ranks(n)?,
                    ready: RankSet::try_with_ranks(n)?,
                    writing: RankSet::try_with_ranks(n)?,
                    folding: None,
                }),
                shadow_tag: AtomicU64::new(0),
                acc: UnsafeCell::new(try_vec(0.0, held)?),
                sos: UnsafeCell::new((0.0, 0)),
                rows,
                result: RwLock::new(Held {
                    what: None,
                    epoch: 1,
                    values: try_vec(0.0, held)?,
                }),
                partial: RwLock::new(Held {
                    what: None,
                    epoch: 1,
                    values: try_vec(0.0, if partials { held } else { 0 })?,
                }),
            });
        }
        Ok(SlotEngine {
            lanes: floor_words(1)?,
            resets: Mutex::new(()),
            window: AtomicU16::new(window.clamp(1, slots.max(1))),
            slots: all,
            n,
            elems: e,
            dtype,
            partials,
            stats,
        })
    }

    /// This engine with `lanes` seq lanes (module docs), rounded down to a
    /// power of two and clamped to 1..=slots; floors from seq 0, epoch 1.
    /// The switch's lanes match how it steers seqs to threads.
    pub fn try_with_lanes(mut self, lanes: u16) -> Result<SlotEngine, TryReserveError> {
        let most = self.slots.len().max(1);
        let lanes = usize::from(lanes).clamp(1, most);
        self.lanes = floor_words(1usize << lanes.ilog2())?;
        Ok(self)
    }

    /// Whether summed chunks carry gradient statistics.
    pub fn stats(&self) -> bool {
        self.stats
    }

    /// Slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Ranks.
    pub fn n(&self) -> u16 {
        self.n
    }

    /// Elements a chunk holds at most.
    pub fn elems(&self) -> usize {
        self.elems
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The slot `seq` maps to: `seq mod S`.
    pub fn index(&self, seq: u32) -> usize {
        (seq as usize) & (self.slots.len() - 1)
    }

    /// The seq lanes (a power of two).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The floor word of `seq`'s lane (or of slot `seq`'s: a slot index is
    /// in the lane of the seqs it holds).
    fn lane(&self, seq: u32) -> &AtomicU64 {
        &self.lanes[seq as usize & (self.lanes.len() - 1)]
    }

    /// The oldest incomplete seq: the lowest lane floor (a reader on
    /// another thread may see it a little behind: only ever too low).
    /// Reads every lane: not for the data path.
    pub fn floor(&self) -> u32 {
        let first = split(self.lanes[0].load(Ordering::Acquire)).1;
        let lowest = self.lanes[1..]
            .iter()
            .map(|w| serial_offset(first, split(w.load(Ordering::Acquire)).1))
            .fold(0, i64::min);
        first.wrapping_add(lowest as u32)
    }

    pub fn window(&self) -> u16 {
        self.window.load(Ordering::Relaxed)
    }

    /// Sets the window, clamped to 1..=S (W ≤ S keeps one live seq a slot).
    pub fn set_window(&self, w: u16) {
        let s = u16::try_from(self.slots.len()).unwrap_or(u16::MAX);
        self.window.store(w.clamp(1, s.max(1)), Ordering::Relaxed);
    }

    /// The current activation (bumped by every [`SlotEngine::reset`]).
    pub fn epoch(&self) -> u32 {
        split(self.lanes[0].load(Ordering::Acquire)).0
    }

    /// The activation of `seq`'s lane (the same as [`SlotEngine::epoch`]
    /// but while a reset is under way; read where the data path reads).
    fn epoch_of(&self, seq: u32) -> u32 {
        split(self.lane(seq).load(Ordering::Acquire)).0
    }

    /// The oldest seq of the current activation that is aggregating (some
    /// rank's DATA taken, not yet complete), if any: `None` means the job
    /// is between collectives as far as the switch can see (what a resize
    /// waits for). Locks each slot's meta in turn: control path only.
    pub fn aggregating(&self) -> Option<u32> {
        let floor = self.floor();
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let epoch = self.epoch_of(i as u32);
                let m = lock(&s.meta);
                m.agg.filter(|_| m.epoch == epoch).map(|a| a.seq)
            })
            .min_by_key(|seq| seq.wrapping_sub(floor))
    }

    /// A new activation: every slot empty, floor = `floor` (each lane's:
    /// its first seq from `floor` on). Contributions that began before it
    /// are discarded; it never waits for them.
    pub fn reset(&self, floor: u32) {
        let _one = self.resets.lock().unwrap_or_else(|e| e.into_inner());
        let next = match self.epoch().wrapping_add(1) {
            0 => 1,
            e => e,
        };
        let mask = (self.lanes.len() - 1) as u32;
        for (l, w) in self.lanes.iter().enumerate() {
            let first = floor.wrapping_add((l as u32).wrapping_sub(floor) & mask);
            // A swap, not a store: a floor advance's compare-exchange of
            // the old word that comes after it fails.
            w.swap(tag(next, first), Ordering::AcqRel);
        }
    }

    /// Takes one contribution (see [`Contributed`]). Checks, in order, as a
    /// job always has: the shadow (Retransmit), a leaf's partial
    /// (Duplicate), the window (Stale, BeyondWindow), then the slot's
    /// aggregation (SlotBusy, Duplicate, CountMismatch, CollectiveMismatch).
    pub fn contribute(&self, c: &Contribution<'_>) -> Contributed {
        self.contribute_in(c, None, None)
    }

    /// [`SlotEngine::contribute`] for a DATA admitted under activation
    /// `epoch` ([`SlotEngine::epoch`], as the admission snapshot recorded
    /// it): if a reset came since, it is Stale, never summed into the new
    /// activation.
    pub fn contribute_admitted(&self, c: &Contribution<'_>, epoch: u32) -> Contributed {
        self.contribute_in(c, Some(epoch), None)
    }

    /// [`SlotEngine::contribute_admitted`] for a leaf's partial at a stats
    /// spine: `part` is its trailer's (sum of squares, ranks), folded in
    /// the leaf's rank order in place of a squared norm of its values.
    pub fn contribute_with_part(
        &self,
        c: &Contribution<'_>,
        epoch: u32,
        part: Option<(f64, u32)>,
    ) -> Contributed {
        self.contribute_in(c, Some(epoch), part)
    }

    fn contribute_in(
        &self,
        c: &Contribution<'_>,
        admitted: Option<u32>,
        part: Option<(f64, u32)>,
    ) -> Contributed {
        use Contributed::Dropped;
        if c.rank >= self.n {
            return Dropped(DropReason::RankOutOfRange);
        }
        if c.count as usize > self.elems {
            return Dropped(DropReason::CountMismatch);
        }
        let len = if c.noval {
            0
        } else {
            self.dtype.payload_len(c.count)
        };
        if c.values.len() != len {
            return Dropped(DropReason::PayloadLength);
        }
        // The DATA against itself: an owner in range, values exactly when
        // the kind says this rank sends them (an all-reduce: always).
        let kind = c.kind;
        let owner = if kind == Kind::AllReduce { 0 } else { c.owner };
        let shape_ok = if c.noval {
            // A reduce-scatter's owner may keep its shard while another
            // rank sends values (a job of one rank would sum nothing).
            !kind.sends_values(c.rank, owner)
                || (kind.owner_may_keep_values(c.rank, owner) && self.n > 1)
        } else {
            kind.sends_values(c.rank, owner)
        };
        if !shape_ok || owner >= self.n {
            return Dropped(DropReason::KindMismatch);
        }
        if self.partials && kind != Kind::AllReduce {
            // A leaf's sums go up as all-reduce partials; the job refuses
            // other kinds before they get here (NACK 10).
            return Dropped(DropReason::KindNotSupported);
        }
        let slot = &self.slots[self.index(c.seq)];
        let mut m = lock(&slot.meta);
        // Read under the lock: at least the floor this slot's contents were
        // admitted under, so a seq older than them is Stale. The lane's:
        // the slot is in it, and no other lane's progress matters here.
        let (epoch, floor) = split(self.lane(c.seq).load(Ordering::Acquire));
        if admitted.is_some_and(|a| a != epoch) {
            // Admitted under an activation a reset has ended.
            return Dropped(DropReason::Stale);
        }
        if m.epoch != epoch {
            m.renew(epoch);
        }
        if let Some(s) = m.shadow.filter(|s| s.seq == c.seq) {
            // A resend is answered from the shadow only if it names what
            // the seq was (an all-reduce's count is not checked, as ever).
            if (s.kind, s.owner) != (kind, owner) || (kind != Kind::AllReduce && s.count != c.count)
            {
                return Dropped(DropReason::KindMismatch);
            }
            return Contributed::Retransmit { seq: c.seq };
        }
        if m.partial.is_some_and(|p| p.seq == c.seq) {
            // Summed and sent up; the spine's RESULT answers it.
            return Dropped(DropReason::Duplicate);
        }
        let ahead = serial_offset(floor, c.seq);
        if ahead < 0 {
            return Dropped(DropReason::Stale);
        }
        if ahead >= i64::from(self.window()) {
            return Dropped(DropReason::BeyondWindow);
        }
        match m.agg {
            Some(a) if a.seq != c.seq => return Dropped(DropReason::SlotBusy),
            Some(_) if m.seen.contains(c.rank) => return Dropped(DropReason::Duplicate),
            Some(a) if (a.kind, a.owner) != (kind, owner) => {
                return Dropped(DropReason::KindMismatch)
            }
            Some(a) if a.count != c.count && kind == Kind::AllReduce => {
                return Dropped(DropReason::CountMismatch)
            }
            Some(a) if a.count != c.count => return Dropped(DropReason::KindMismatch),
            Some(a) if a.collective != c.collective => {
                return Dropped(DropReason::CollectiveMismatch)
            }
            _ => {}
        }
        // Work of an older activation still on this rank's row or on the
        // accumulator: leave them alone (the worker resends).
        if m.writing.contains(c.rank) || m.folding.is_some_and(|e| e != epoch) {
            return Dropped(DropReason::SlotBusy);
        }
        let a = m.agg.get_or_insert(Aggregation {
            seq: c.seq,
            collective: c.collective,
            count: c.count,
            kind,
            owner,
            next_rank: 0,
            owner_kept: false,
            ece: false,
        });
        a.ece |= c.ce;
        a.owner_kept |= c.noval && kind == Kind::ReduceScatter;
        let next = a.next_rank;
        let due = next == c.rank;
        // Used only when due: then rank 0 has come, and `owner_kept` is known.
        let first = c.rank == a.first_valued();
        m.seen.insert(c.rank);
        if c.noval {
            // Nothing to write: the rank's turn in the fold is empty.
            m.ready.insert(c.rank);
            if m.folding.is_none() && m.ready.contains(next) {
                m.folding = Some(epoch);
                return self.fold(slot, m, epoch);
            }
            return Contributed::Taken;
        }
        let count = c.count as usize;
        if due && m.folding.is_none() {
            m.folding = Some(epoch);
            drop(m);
            slot.acc.with_mut(|acc| {
                // SAFETY: this thread holds the fold token (`folding`), the
                // only right to the accumulator.
                let acc = unsafe { &mut *acc };
                // Float32 calls its kernels directly: its hot path is as
                // in the single-threaded pool.
                match (kind, self.dtype, first) {
                    // The owner's bytes, as they came (never converted).
                    (Kind::AllGather, _, _) => copy_bytes(acc, c.values),
                    (_, Dtype::F32, true) => crate::simd::read_le_f32(c.values, &mut acc[..count]),
                    (_, Dtype::F32, false) => crate::simd::add_le_f32(&mut acc[..count], c.values),
                    (_, d, true) => elements::read_le(d, c.values, &mut acc[..count]),
                    (_, d, false) => elements::add_le(d, &mut acc[..count], c.values),
                }
            });
            if self.stats && kind != Kind::AllGather {
                // From the payload (its own small scratch: a chunk-sized one
                // would cost a cache miss per packet).
                let part =
                    part.unwrap_or_else(|| (squared_norm_le_blocked(self.dtype, c.values), 1));
                // SAFETY: the fold token gives `sos`, as `acc`.
                slot.sos
                    .with_mut(|sos| unsafe { fold_part(&mut *sos, first, part) });
            }
            let mut m = lock(&slot.meta);
            if m.epoch != epoch {
                return self.discard_token(m);
            }
            if let Some(a) = m.agg.as_mut() {
                a.next_rank += 1;
            }
            return self.fold(slot, m, epoch);
        }
        m.writing.insert(c.rank);
        drop(m);
        slot.rows[c.rank as usize].with_mut(|row| {
            // SAFETY: this thread claimed the rank under the lock and marked
            // its row `writing`: no other claimant (same seq: Duplicate;
            // another activation: SlotBusy) and no folder (the row is not
            // ready) touches it until the mark is removed.
            let row = unsafe { &mut *row };
            if kind == Kind::AllGather {
                copy_bytes(row, c.values);
            } else {
                elements::read_le(self.dtype, c.values, &mut row[..count]);
                if self.stats {
                    park_part(row, self.elems, part);
                }
            }
        });
        let mut m = lock(&slot.meta);
        m.writing.remove(c.rank);
        if m.epoch != epoch {
            return Dropped(DropReason::Stale);
        }
        m.ready.insert(c.rank);
        let next = m.agg.map_or(self.n, |a| a.next_rank);
        if m.folding.is_none() && m.ready.contains(next) {
            m.folding = Some(epoch);
            return self.fold(slot, m, epoch);
        }
        Contributed::Taken
    }

    /// Gives back the fold token of an activation a reset ended.
    fn discard_token(&self, mut m: MutexGuard<'_, Meta>) -> Contributed {
        m.folding = None;
        Contributed::Dropped(DropReason::Stale)
    }

    /// With the fold token of `epoch` (and the lock, `m`): folds every ready
    /// row that is due, in rank order, then completes the slot or gives the
    /// token back.
    fn fold<'s>(&self, slot: &'s Slot, mut m: MutexGuard<'s, Meta>, epoch: u32) -> Contributed {
        loop {
            let Some(a) = m.agg else {
                m.folding = None;
                return Contributed::Taken;
            };
            let from = a.next_rank;
            let mut to = from;
            while to < self.n && m.ready.contains(to) {
                to += 1;
            }
            if to == from {
                if from >= self.n {
                    return self.complete(slot, m, epoch, a);
                }
                m.folding = None;
                return Contributed::Taken;
            }
            drop(m);
            let count = a.count as usize;
            let first = a.first_valued();
            slot.acc.with_mut(|acc| {
                // SAFETY: the fold token gives the accumulator, and the rows
                // from..to are ready (their claimants are done, and a reset
                // does not let anyone claim them while the token is held).
                let acc = unsafe { &mut *acc };
                for r in from..to {
                    if a.is_empty_turn(r) {
                        // A NOVAL arrival: nothing in its row.
                        continue;
                    }
                    slot.rows[r as usize].with(|row| {
                        // SAFETY: as above: row `r` is ready, only read.
                        let row = unsafe { &*row };
                        if a.kind == Kind::AllGather {
                            let len = self.dtype.payload_len(a.count);
                            let bytes: &[u8] = bytemuck::cast_slice(row);
                            copy_bytes(acc, &bytes[..len]);
                        } else if r == first {
                            acc[..count].copy_from_slice(&row[..count]);
                        } else {
                            // The same kernel as a contribution folded on
                            // arrival, so the bits are the same either way.
                            crate::simd::add_f32(&mut acc[..count], &row[..count]);
                        }
                        if self.stats && a.kind != Kind::AllGather {
                            let part = parked_part(row, self.elems)
                                .unwrap_or_else(|| (squared_norm(&row[..count]), 1));
                            // SAFETY: the fold token gives `sos`, as `acc`.
                            slot.sos
                                .with_mut(|sos| unsafe { fold_part(&mut *sos, r == first, part) });
                        }
                    });
                }
            });
            m = lock(&slot.meta);
            if m.epoch != epoch {
                return self.discard_token(m);
            }
            if let Some(a) = m.agg.as_mut() {
                a.next_rank = to;
            }
        }
    }

    /// Every rank of `a` is folded: writes the result (or a leaf's partial)
    /// and publishes it, gives the token back, advances the floor.
    fn complete(
        &self,
        slot: &Slot,
        m: MutexGuard<'_, Meta>,
        epoch: u32,
        a: Aggregation,
    ) -> Contributed {
        // Lock order is result/partial before meta.
        drop(m);
        let done = Shadow {
            seq: a.seq,
            collective: a.collective,
            count: a.count,
            ece: a.ece,
            kind: a.kind,
            owner: a.owner,
            payload_sum: 0,
            stats: self.stats && a.kind != Kind::AllGather,
        };
        let count = a.count as usize;
        // SAFETY: the fold token gives `sos`.
        let (sos, ranks) = slot.sos.with(|s| unsafe { *s });
        if self.partials {
            let mut held = slot.partial.write().unwrap_or_else(|e| e.into_inner());
            slot.acc.with_mut(|acc| {
                // SAFETY: the fold token gives the accumulator.
                core::mem::swap(unsafe { &mut *acc }, &mut held.values);
            });
            if done.stats {
                // A leaf's part: its ranks' sum of squares (the spine
                // squares the tree's sum).
                let t = GradStats {
                    sum_of_squares: sos,
                    square_of_sum: 0.0,
                    ranks,
                };
                write_trailer(&mut held.values, count * 4, &t);
            }
            held.what = Some(done);
            held.epoch = epoch;
            let Some(mut m) = settle(slot, epoch) else {
                return Contributed::Dropped(DropReason::Stale);
            };
            m.partial = Some(done);
            return Contributed::PartialReady { seq: a.seq };
        }
        let mut held = slot.result.write().unwrap_or_else(|e| e.into_inner());
        let stats = slot.acc.with_mut(|acc| {
            // SAFETY: the fold token gives the accumulator.
            let acc = unsafe { &mut *acc };
            let stats = done.stats.then(|| GradStats {
                sum_of_squares: sos,
                // Of the float32 sum, before it is rounded.
                square_of_sum: squared_norm(&acc[..count]),
                ranks,
            });
            // An all-gather's accumulator holds the owner's wire bytes.
            if self.dtype == Dtype::F32 || a.kind == Kind::AllGather {
                core::mem::swap(acc, &mut held.values);
            } else {
                // The one rounding: the float32 sum into the dtype's bytes.
                let out: &mut [u8] = bytemuck::cast_slice_mut(&mut held.values);
                elements::round_to_le(self.dtype, &acc[..count], out);
            }
            stats
        });
        if let Some(t) = &stats {
            write_trailer(&mut held.values, self.dtype.payload_len(a.count), t);
        }
        let sh = Shadow {
            payload_sum: payload_sum(&held, self.dtype, a.count, done.stats),
            ..done
        };
        held.what = Some(sh);
        held.epoch = epoch;
        let Some(mut m) = settle(slot, epoch) else {
            return Contributed::Dropped(DropReason::Stale);
        };
        m.shadow = Some(sh);
        slot.shadow_tag.store(tag(epoch, a.seq), Ordering::Release);
        drop(m);
        drop(held);
        self.advance_floor(a.seq);
        Contributed::Completed {
            seq: a.seq,
            ece: a.ece,
        }
    }

    /// Moves the floor of `seq`'s lane over every slot that holds the
    /// lane floor's result. Called after a shadow is published. Each read
    /// of the word is a read-modify-write, so that of two threads
    /// completing neighbouring seqs of a lane at once, one always sees the
    /// other's shadow tag: either this thread's RMW comes after the other's
    /// floor move (and reads it), or the other's later RMW synchronises
    /// with this one (and sees this thread's tag). A plain load could miss
    /// both ways.
    fn advance_floor(&self, seq: u32) {
        let word = self.lane(seq);
        let step = self.lanes.len() as u32;
        loop {
            let w = word.fetch_add(0, Ordering::AcqRel);
            let (epoch, floor) = split(w);
            let slot = &self.slots[self.index(floor)];
            if slot.shadow_tag.load(Ordering::Acquire) != tag(epoch, floor) {
                return;
            }
            // Fails if another thread moved the floor or a reset came: look again.
            let _ = word.compare_exchange(
                w,
                tag(epoch, floor.wrapping_add(step)),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The shadow's metadata if slot(seq) holds seq's completed result.
    pub fn shadow(&self, seq: u32) -> Option<Shadow> {
        let m = lock(&self.slots[self.index(seq)].meta);
        let epoch = self.epoch_of(seq);
        m.shadow.filter(|s| s.seq == seq && m.epoch == epoch)
    }

    /// Runs `f` on the shadow of `seq` and its payload bytes (the dtype's
    /// wire encoding, `dtype.payload_len(count)` bytes) while no completion
    /// can overwrite them; None if slot(seq) does not hold seq's result.
    pub fn with_result<R>(&self, seq: u32, f: impl FnOnce(&Shadow, &[u8]) -> R) -> Option<R> {
        let res = self.result(seq)?;
        Some(f(&res.shadow, res.bytes()))
    }

    /// The shadow of `seq` and its payload, read-locked until the returned
    /// value is dropped (a transmit path copies the payload straight into
    /// its frames); None if slot(seq) does not hold seq's result.
    pub fn result(&self, seq: u32) -> Option<ResultRef<'_>> {
        let held = self.slots[self.index(seq)]
            .result
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let shadow = held.get(seq, self.epoch_of(seq))?;
        let len = self.dtype.payload_len(shadow.count);
        Some(ResultRef {
            held,
            shadow,
            len,
            noval: false,
        })
    }

    /// Calls `f` with each rank that has not contributed to `seq`,
    /// ascending: all when it has not started, none when its shadow is
    /// held. `f` runs under the slot's lock: keep it short, and do not call
    /// the engine from it.
    pub fn missing(&self, seq: u32, mut f: impl FnMut(u16)) {
        let m = lock(&self.slots[self.index(seq)].meta);
        let live = m.epoch == self.epoch_of(seq);
        if live && m.shadow.is_some_and(|s| s.seq == seq) {
            return;
        }
        let started = live && m.agg.is_some_and(|a| a.seq == seq);
        for r in 0..self.n {
            if !(started && m.seen.contains(r)) {
                f(r);
            }
        }
    }

    /// What slot `idx` holds now, as one snapshot (for a leaf's timers).
    pub fn state_at(&self, idx: usize) -> SlotState {
        let Some(slot) = self.slots.get(idx) else {
            return SlotState::default();
        };
        let m = lock(&slot.meta);
        if m.epoch != self.epoch_of(idx as u32) {
            return SlotState::default();
        }
        SlotState {
            agg: m.agg,
            shadow: m.shadow,
            partial: m.partial,
        }
    }

    /// (A leaf) runs `f` on the partial of `seq` and its float32 values.
    pub fn with_partial<R>(&self, seq: u32, f: impl FnOnce(&Partial, &[f32]) -> R) -> Option<R> {
        let held = self.slots[self.index(seq)]
            .partial
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let p = held.get(seq, self.epoch_of(seq))?;
        let n = (p.count as usize).min(held.values.len());
        Some(f(&p, &held.values[..n]))
    }

    /// (A leaf) the partial of `seq` as it goes up: its float32 values
    /// (little-endian) and, in a stats engine, its trailer after them.
    pub fn with_partial_wire<R>(
        &self,
        seq: u32,
        f: impl FnOnce(&Partial, &[u8]) -> R,
    ) -> Option<R> {
        let held = self.slots[self.index(seq)]
            .partial
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let p = held.get(seq, self.epoch_of(seq))?;
        let bytes: &[u8] = bytemuck::cast_slice(&held.values);
        let len = p.count as usize * 4 + if p.stats { STATS_LEN } else { 0 };
        Some(f(&p, bytes.get(..len)?))
    }

    /// (A leaf) the spine's RESULT for the partial of `seq` (float32
    /// little-endian, whatever the job's dtype) becomes the shadow: rounded
    /// once to a half-precision dtype, `ece` OR-ed along the tree; the floor
    /// advances. False if the slot holds no partial of `seq` or `values`
    /// has another length. Callers serialise these calls.
    pub fn finish_partial(&self, seq: u32, values: &[u8], ece: bool) -> bool {
        self.finish_partial_with_stats(seq, values, None, ece)
    }

    /// [`SlotEngine::finish_partial`] in a stats engine: the spine's
    /// trailer `stats` goes to the local ranks unchanged, after the values
    /// (false without one, or with one in an engine without stats).
    pub fn finish_partial_with_stats(
        &self,
        seq: u32,
        values: &[u8],
        stats: Option<GradStats>,
        ece: bool,
    ) -> bool {
        if stats.is_some() != self.stats {
            return false;
        }
        let dtype = self.dtype;
        let slot = &self.slots[self.index(seq)];
        let epoch = self.epoch_of(seq);
        let mut res = slot.result.write().unwrap_or_else(|e| e.into_inner());
        let mut part = slot.partial.write().unwrap_or_else(|e| e.into_inner());
        let Some(p) = part.get(seq, epoch) else {
            return false;
        };
        let count = p.count as usize;
        if values.len() != count * 4 || res.values.len() < count {
            return false;
        }
        if dtype == Dtype::F32 {
            crate::simd::read_le_f32(values, &mut res.values[..count]);
        } else {
            let mut sum = [0f32; 256];
            let out: &mut [u8] = bytemuck::cast_slice_mut(&mut res.values);
            for (i, chunk) in values.chunks(sum.len() * 4).enumerate() {
                let n = chunk.len() / 4;
                crate::simd::read_le_f32(chunk, &mut sum[..n]);
                let at = i * sum.len() * dtype.size();
                elements::round_to_le(dtype, &sum[..n], &mut out[at..at + n * dtype.size()]);
            }
        }
        if let Some(t) = &stats {
            write_trailer(&mut res.values, dtype.payload_len(p.count), t);
        }
        let sh = Shadow {
            ece: p.ece || ece,
            payload_sum: payload_sum(&res, dtype, p.count, stats.is_some()),
            stats: stats.is_some(),
            ..p
        };
        res.what = Some(sh);
        res.epoch = epoch;
        part.what = None;
        let mut m = lock(&slot.meta);
        if m.epoch != epoch || m.partial != Some(p) {
            return false;
        }
        m.partial = None;
        m.shadow = Some(sh);
        slot.shadow_tag.store(tag(epoch, seq), Ordering::Release);
        drop(m);
        drop(part);
        drop(res);
        self.advance_floor(seq);
        true
    }
}

/// Copies wire bytes into the front of a float32 buffer as they are: an
/// all-gather's values are moved, never read as numbers.
fn copy_bytes(to: &mut [f32], from: &[u8]) {
    let to: &mut [u8] = bytemuck::cast_slice_mut(to);
    to[..from.len()].copy_from_slice(from);
}

/// The folded checksum sum of a result's payload bytes (with `trailer`,
/// its values and the statistics trailer after them).
fn payload_sum(held: &Held, dtype: Dtype, count: u16, trailer: bool) -> u16 {
    let bytes: &[u8] = bytemuck::cast_slice(&held.values);
    let len = dtype.payload_len(count) + if trailer { STATS_LEN } else { 0 };
    let n = len.min(bytes.len());
    crate::checksum::Sum::ZERO.add_bytes(&bytes[..n]).fold()
}

/// Writes the statistics trailer at byte `at` of a result's (or partial's)
/// buffer, right after its values (the buffer has room: `try_with_stats`).
fn write_trailer(values: &mut [f32], at: usize, t: &GradStats) {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(values);
    if let Some(b) = bytes.get_mut(at..) {
        // Emit fails only on a short buffer, which the allocation rules out.
        let _ = t.emit(b);
    }
}

/// Adds rank `rank`'s part (sum of squares, ranks) to a slot's running
/// one in rank order: the first valued rank starts it from 0 (as the
/// reference does).
#[inline]
fn fold_part(sos: &mut (f64, u32), first: bool, part: (f64, u32)) {
    if first {
        *sos = (0.0, 0);
    }
    sos.0 += part.0;
    sos.1 = sos.1.saturating_add(part.1);
}

/// Floats after a full chunk in a stats engine's row: a parked rank's
/// part, given (a leaf's trailer) or not (computed from the values).
const PART_FLOATS: usize = 4;

/// Writes the part a parked contribution brought (if any) into its row's
/// tail, after `elems` floats: sum of squares (f64), ranks (u32), 1 if
/// given (u32).
fn park_part(row: &mut [f32], elems: usize, part: Option<(f64, u32)>) {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(row);
    if let Some(t) = bytes.get_mut(elems * 4..elems * 4 + PART_FLOATS * 4) {
        let (sos, ranks) = part.unwrap_or((0.0, 0));
        t[..8].copy_from_slice(&sos.to_ne_bytes());
        t[8..12].copy_from_slice(&ranks.to_ne_bytes());
        t[12..].copy_from_slice(&u32::from(part.is_some()).to_ne_bytes());
    }
}

/// The part [`park_part`] left in a row, if one was given.
fn parked_part(row: &[f32], elems: usize) -> Option<(f64, u32)> {
    let bytes: &[u8] = bytemuck::cast_slice(row);
    let t = bytes.get(elems * 4..elems * 4 + PART_FLOATS * 4)?;
    if t[12..] != 1u32.to_ne_bytes() {
        return None;
    }
    let sos = f64::from_ne_bytes(t[..8].try_into().ok()?);
    let ranks = u32::from_ne_bytes(t[8..12].try_into().ok()?);
    Some((sos, ranks))
}

#[cfg(all(test, not(loom)))]
mod tests;
