//! A dataplane thread's heartbeat: what it publishes about its progress
//! for the watchdog ([`crate::watchdog`]), which decides from it whether
//! the thread is stuck.
//!
//! Owns: [`Heartbeat`], one per dataplane thread, held in the dataplane's
//! shared state ([`super::Shared::heartbeats`]).
//!
//! Invariants: only the thread itself writes its progress and whether it
//! has work in hand, with Relaxed stores (once per loop iteration and
//! before taking a batch, never per packet); only the watchdog thread
//! counts stalls. Nothing here takes a lock, so a thread stuck holding the
//! job table cannot stop the watchdog from reading it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What a dataplane thread publishes for the watchdog. Aligned to its own
/// cache lines so that threads' beats do not share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Heartbeat {
    /// Loop iterations so far.
    progress: AtomicU64,
    /// The thread has work in hand: it received frames in its last
    /// iteration, or found frames or hand-offs waiting and went to take
    /// them. Cleared by an iteration that received nothing.
    busy: AtomicBool,
    /// Times the watchdog found this thread stuck (written by the watchdog
    /// thread, at most once before switchd exits).
    stalls: AtomicU64,
}

impl Heartbeat {
    /// End of a loop iteration: `iteration` is the count so far, `busy`
    /// whether it received anything (more is likely waiting).
    #[inline]
    pub fn beat(&self, iteration: u64, busy: bool) {
        self.progress.store(iteration, Ordering::Relaxed);
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// The thread is about to take waiting work (before it locks anything):
    /// if it never comes back, the watchdog knows work was pending.
    #[inline]
    pub fn taking_work(&self) {
        self.busy.store(true, Ordering::Relaxed);
    }

    /// The watchdog found this thread stuck.
    pub fn count_stall(&self) {
        self.stalls.fetch_add(1, Ordering::Relaxed);
    }

    /// Times the watchdog found this thread stuck.
    pub fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::Relaxed)
    }

    /// (iterations, busy) as last published.
    pub fn sample(&self) -> (u64, bool) {
        (
            self.progress.load(Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_publishes_progress_and_work_in_hand() {
        let h = Heartbeat::default();
        h.beat(5, false);
        assert_eq!(h.sample(), (5, false));
        h.taking_work();
        assert_eq!(h.sample(), (5, true));
        h.beat(6, false);
        assert_eq!(h.sample(), (6, false));
    }
}
