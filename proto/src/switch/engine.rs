//! TEMPORARY stand-in (lead's integration scaffold, replaced by the
//! concurrent engine): the old SlotPool behind one mutex, with the engine's
//! API.

use std::collections::TryReserveError;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::counters::DropReason;
use super::slot_pool::{Aggregation, SlotPool, Taken};
pub use super::slot_pool::{Partial, Shadow};
use crate::seq::serial_offset;
use crate::wire::Dtype;

#[derive(Debug)]
pub struct SlotEngine {
    pool: Mutex<SlotPool>,
    floor: AtomicU32,
    window: AtomicU16,
    epoch: AtomicU32,
    slots: usize,
    dtype: Dtype,
    leaf: bool,
}

pub struct Contribution<'a> {
    pub seq: u32,
    pub rank: u16,
    pub collective: u32,
    pub count: u16,
    pub values: &'a [u8],
    pub ce: bool,
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contributed {
    Taken,
    Completed { seq: u32, ece: bool },
    PartialReady { seq: u32 },
    Retransmit { seq: u32 },
    Dropped(DropReason),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SlotState {
    pub agg: Option<Aggregation>,
    pub shadow: Option<Shadow>,
    pub partial: Option<Partial>,
}

pub struct ResultRef<'a> {
    pool: MutexGuard<'a, SlotPool>,
    seq: u32,
    dtype: Dtype,
}

impl ResultRef<'_> {
    pub fn shadow(&self) -> Shadow {
        self.pool.slot(self.seq).shadow.unwrap_or(Shadow {
            seq: 0,
            collective: 0,
            count: 0,
            ece: false,
            payload_sum: 0,
        })
    }
    pub fn bytes(&self) -> &[u8] {
        self.pool.slot(self.seq).result_bytes(self.dtype)
    }
}

impl SlotEngine {
    pub fn try_new(
        slots: u16,
        n: u16,
        elems: u16,
        dtype: Dtype,
        partials: bool,
        window: u16,
    ) -> Result<SlotEngine, TryReserveError> {
        Ok(SlotEngine {
            pool: Mutex::new(SlotPool::try_new(slots, n, elems, dtype, partials)?),
            floor: AtomicU32::new(0),
            window: AtomicU16::new(window),
            epoch: AtomicU32::new(0),
            slots: slots as usize,
            dtype,
            leaf: partials,
        })
    }
    fn lock(&self) -> MutexGuard<'_, SlotPool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn len(&self) -> usize {
        self.slots
    }
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }
    pub fn index(&self, seq: u32) -> usize {
        seq as usize & (self.slots - 1)
    }
    pub fn floor(&self) -> u32 {
        self.floor.load(Ordering::Acquire)
    }
    pub fn window(&self) -> u16 {
        self.window.load(Ordering::Relaxed)
    }
    pub fn set_window(&self, w: u16) {
        self.window.store(w, Ordering::Relaxed)
    }
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }
    pub fn reset(&self, floor: u32) {
        let mut p = self.lock();
        p.clear();
        self.floor.store(floor, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
    pub fn contribute(&self, c: &Contribution<'_>) -> Contributed {
        let mut pool = self.lock();
        if c.epoch != self.epoch() {
            return Contributed::Dropped(DropReason::SlotBusy);
        }
        let slot = pool.slot(c.seq);
        if slot.shadow.is_some_and(|s| s.seq == c.seq) {
            return Contributed::Retransmit { seq: c.seq };
        }
        if slot.partial.is_some_and(|p| p.seq == c.seq) {
            return Contributed::Dropped(DropReason::Duplicate);
        }
        let floor = self.floor();
        let ahead = serial_offset(floor, c.seq);
        if ahead < 0 {
            return Contributed::Dropped(DropReason::Stale);
        }
        if ahead >= self.window() as i64 {
            return Contributed::Dropped(DropReason::BeyondWindow);
        }
        let agg = slot.agg;
        let seen = slot.seen.contains(c.rank);
        match agg {
            Some(a) if a.seq != c.seq => return Contributed::Dropped(DropReason::SlotBusy),
            Some(_) if seen => return Contributed::Dropped(DropReason::Duplicate),
            Some(a) if a.count != c.count => {
                return Contributed::Dropped(DropReason::CountMismatch)
            }
            Some(a) if a.collective != c.collective => {
                return Contributed::Dropped(DropReason::CollectiveMismatch)
            }
            Some(_) => {}
            None => {
                pool.slot_mut(c.seq).agg = Some(Aggregation {
                    seq: c.seq,
                    collective: c.collective,
                    count: c.count,
                    next_rank: 0,
                    ece: false,
                });
            }
        }
        if c.ce {
            if let Some(a) = pool.slot_mut(c.seq).agg.as_mut() {
                a.ece = true;
            }
        }
        match pool.take(c.seq, c.rank, c.values, self.leaf) {
            Taken::Pending => Contributed::Taken,
            Taken::Completed if self.leaf => Contributed::PartialReady { seq: c.seq },
            Taken::Completed => {
                let ece = pool.slot(c.seq).shadow.is_some_and(|s| s.ece);
                self.advance_floor(&pool);
                Contributed::Completed { seq: c.seq, ece }
            }
        }
    }
    fn advance_floor(&self, pool: &SlotPool) {
        let mut f = self.floor();
        for _ in 0..self.slots {
            if pool.slot(f).shadow.is_some_and(|s| s.seq == f) {
                f = f.wrapping_add(1);
            } else {
                break;
            }
        }
        self.floor.store(f, Ordering::Release);
    }
    pub fn shadow(&self, seq: u32) -> Option<Shadow> {
        self.lock().slot(seq).shadow.filter(|s| s.seq == seq)
    }
    pub fn result(&self, seq: u32) -> Option<ResultRef<'_>> {
        let pool = self.lock();
        pool.slot(seq).shadow.filter(|s| s.seq == seq)?;
        Some(ResultRef {
            pool,
            seq,
            dtype: self.dtype,
        })
    }
    pub fn missing(&self, seq: u32, mut f: impl FnMut(u16)) {
        let pool = self.lock();
        let slot = pool.slot(seq);
        if slot.shadow.is_some_and(|s| s.seq == seq) {
            return;
        }
        let started = slot.agg.is_some_and(|a| a.seq == seq);
        for r in 0..pool.n() {
            if !(started && slot.seen.contains(r)) {
                f(r)
            }
        }
    }
    pub fn state_at(&self, idx: usize) -> SlotState {
        let pool = self.lock();
        let s = pool.slots_at(idx);
        SlotState {
            agg: s.agg,
            shadow: s.shadow,
            partial: s.partial,
        }
    }
    pub fn with_partial<R>(&self, seq: u32, f: impl FnOnce(&Partial, &[f32]) -> R) -> Option<R> {
        let pool = self.lock();
        let s = pool.slot(seq);
        let p = s.partial.filter(|p| p.seq == seq)?;
        Some(f(&p, s.partial_values()))
    }
    pub fn finish_partial(&self, seq: u32, values: &[u8], ece: bool) -> bool {
        let mut pool = self.lock();
        if !pool.finish_partial(seq, values, ece) {
            return false;
        }
        self.advance_floor(&pool);
        true
    }
}
