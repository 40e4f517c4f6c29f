//! The engines the scaling benchmark compares, each behind [`Backend`]: a
//! batch of DATA datagrams in, every reply they cause encoded out.
//!
//! Owns: [`Backend`], [`BackendKind`] (the names the CLI takes) and the
//! backends themselves. `table-lock` ([`TableLock`]) is switchd's design
//! before issue 21: one `Mutex<JobTable>` taken per receive batch, the
//! replies drained and encoded while it is held (as
//! `switchd/src/dataplane/rx.rs` does per frame). `lockfree` is the
//! lock-free DATA path of issue 21: [`lock_free`] is where it plugs in.
//!
//! Invariants: `feed` allocates nothing and makes no syscall; every reply a
//! batch causes is encoded (through [`Sink::reply`]) before `feed` returns,
//! so that when every thread has stopped, the RESULTs counted are exactly
//! ranks × completed seqs.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use proto::switch::{Endpoint, Job, JobTable};

use super::{EngineError, Sink};

/// One engine under test, shared by every feeding thread.
pub trait Backend: Sync {
    /// Feeds `batch` (DATA of job `job`, from one thread) to the engine,
    /// reports each verdict with [`Sink::data`] and encodes every reply it
    /// causes with [`Sink::reply`]; returns job `job`'s window floor after
    /// the batch (its oldest incomplete seq).
    fn feed(&self, job: u16, batch: &Batch<'_>, out: &mut Sink) -> u32;

    /// Job `job`'s window floor now (read after the run, for the count of
    /// RESULTs).
    fn floor(&self, job: u16) -> u32;
}

/// Which engine to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    TableLock,
    LockFree,
}

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::TableLock, BackendKind::LockFree];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::TableLock => "table-lock",
            BackendKind::LockFree => "lockfree",
        }
    }

    /// The engine over `table` (every job declared and active), whose
    /// `handle` calls are made at `now`.
    pub fn build(self, table: JobTable, now: Instant) -> Result<Box<dyn Backend>, EngineError> {
        match self {
            BackendKind::TableLock => Ok(Box::new(TableLock {
                table: Mutex::new(table),
                now,
            })),
            BackendKind::LockFree => lock_free(table, now),
        }
    }
}

/// The lock-free DATA path of issue 21 over `table`. Until it exists, the
/// benchmark says so rather than report a number for it.
fn lock_free(_table: JobTable, _now: Instant) -> Result<Box<dyn Backend>, EngineError> {
    Err(EngineError::NotBuilt {
        backend: BackendKind::LockFree.name(),
    })
}

/// Today's switchd: one table mutex, held for a whole batch.
struct TableLock {
    table: Mutex<JobTable>,
    now: Instant,
}

impl Backend for TableLock {
    fn feed(&self, job: u16, batch: &Batch<'_>, out: &mut Sink) -> u32 {
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for (datagram, from) in batch.iter() {
            let v = t.handle(datagram, *from, false, self.now);
            out.data(v);
            while let Some(r) = t.poll_reply() {
                out.reply(&r, |buf| t.encode(&r, buf));
            }
        }
        t.get(job).map_or(0, Job::floor)
    }

    fn floor(&self, job: u16) -> u32 {
        let t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        t.get(job).map_or(0, Job::floor)
    }
}

/// Up to [`super::BATCH`] DATA datagrams of one thread, in the order
/// received: slices of the thread's frame ring, each with its sender.
pub struct Batch<'a> {
    pub(super) ring: &'a [u8],
    pub(super) stride: usize,
    pub(super) len: usize,
    /// Per datagram: its frame in the ring, and its sender's index in `from`.
    pub(super) items: &'a [(u32, u16)],
    pub(super) from: &'a [Endpoint],
}

impl<'a> Batch<'a> {
    /// Each datagram (the UDP payload) with the endpoint it came from.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a Endpoint)> + '_ {
        self.items.iter().map(|&(frame, sender)| {
            let at = frame as usize * self.stride;
            (&self.ring[at..at + self.len], &self.from[sender as usize])
        })
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
