//! The harness's windows: [`ResultWindow`], the window of some ranks of a
//! job as their workers see it, whose floor moves once every RESULT of a
//! seq to those ranks was encoded, by whichever thread; the feeding
//! threads do not send past it, and their sinks count RESULTs into it.
//!
//! Invariants: each seq in flight has an entry of its own on cache lines
//! of its own (seq mod W), so threads that encode neighbouring seqs share
//! no line; counting and moving the floor take no lock (atomics only) and
//! allocate nothing.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Windows shared by the threads: per rank of a job, or per seq lane.
pub(super) type Windows = Arc<[Arc<ResultWindow>]>;

/// The window of some ranks of a job as their workers see it: `[floor,
/// floor + W)`, where the floor is the lowest seq whose RESULTs to those
/// ranks are not all encoded yet. Steered, a lane's: its places are the
/// lane's seqs (seq / T).
pub(super) struct ResultWindow {
    /// Per `seq mod W`. Every seq in flight lies in the window, so no two
    /// share an entry.
    entries: Vec<WindowEntry>,
    ranks: u32,
    floor: AtomicU32,
}

/// One seq's place in a [`ResultWindow`], on cache lines of its own: the
/// threads that encode neighbouring seqs must not share a line.
#[repr(align(128))]
struct WindowEntry {
    /// 1 + the last seq whose RESULTs were all encoded (0: none yet).
    done: AtomicU32,
    /// RESULTs of the seq in flight encoded so far (back to 0 when it is
    /// marked, before the next seq can use the entry).
    count: AtomicU32,
}

impl ResultWindow {
    pub(super) fn new(window: u16, ranks: u16) -> ResultWindow {
        ResultWindow {
            entries: (0..window)
                .map(|_| WindowEntry {
                    done: AtomicU32::new(0),
                    count: AtomicU32::new(0),
                })
                .collect(),
            ranks: u32::from(ranks),
            floor: AtomicU32::new(0),
        }
    }

    fn entry(&self, seq: u32) -> &WindowEntry {
        &self.entries[(seq % self.len()) as usize]
    }

    /// W.
    pub(super) fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    pub(super) fn floor(&self) -> u32 {
        self.floor.load(Ordering::Acquire)
    }

    /// `k` more RESULTs of `seq` are encoded; the last of its `ranks`
    /// marks it.
    pub(super) fn encoded(&self, seq: u32, k: u32) {
        let e = self.entry(seq);
        if e.count.fetch_add(k, Ordering::AcqRel) + k == self.ranks {
            e.count.store(0, Ordering::Relaxed);
            // Release: the reset is seen by whoever feeds the entry's next
            // seq, which waits for this mark.
            e.done.store(seq.wrapping_add(1), Ordering::Release);
        }
    }

    /// The ranks whose RESULTs it counts.
    pub(super) fn ranks(&self) -> u16 {
        self.ranks as u16
    }

    /// RESULTs of `seq` (in flight) encoded so far.
    pub(super) fn count(&self, seq: u32) -> u32 {
        self.entry(seq).count.load(Ordering::Acquire)
    }

    /// Moves the floor past the seqs marked above it; returns it.
    pub(super) fn advance(&self) -> u32 {
        let mut f = self.floor();
        while self.entry(f).done.load(Ordering::Acquire) == f.wrapping_add(1) {
            f = match self.floor.compare_exchange_weak(
                f,
                f.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => f.wrapping_add(1),
                Err(now) => now,
            };
        }
        f
    }
}
