//! The engines the scaling benchmark compares, each behind [`Backend`]: a
//! batch of DATA datagrams in, every reply they cause encoded out.
//!
//! Owns: [`Backend`], [`Batch`] (at most [`BATCH`] datagrams) and two of
//! the backends; [`super::BackendKind`] names them for the CLI and builds
//! them, and `lanes`, built on `lockfree`, is in lanes.rs. `table-lock`
//! ([`TableLock`]) is switchd's design before issue 21: one
//! `Mutex<JobTable>` taken per receive batch, the replies drained and
//! encoded while it is held (as switchd did per frame). `lockfree` ([`LockFree`]) is switchd's dataplane since issue
//! 21, through the same entry point ([`Switch::on_datagram`]: the
//! lock-free DATA path, the table for what it hands back, the fan-out and
//! its hand-offs decided in proto): a RESULT goes out from the thread that
//! owns the queue its rank joined on, so the completing thread sends those
//! of its own ranks and hands the seq once to each other thread that owns
//! some, which sends them to its ranks; every thread empties its outbox
//! before each batch. Only the routing (queue `t` is thread `t`'s) and the
//! bytes out (into the [`Sink`]) are this file's.
//!
//! Invariants: `feed` and `drain` allocate nothing and make no syscall;
//! every reply a batch causes is encoded (through [`Sink::reply`]) before
//! `feed` returns or is in an outbox, which its thread empties with
//! `drain`; so once every thread has stopped and drained, the RESULTs
//! counted are exactly ranks × completed seqs.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;

use proto::switch::engine::ResultRef;
use proto::switch::entry::{encode_result, Batch as SwitchBatch, Handoff, Switch, Transmit};
use proto::switch::{Encoded, Endpoint, Job, JobTable, Reply, ReplyMsg};
use proto::tag::Tag;
use proto::wire::HeaderRepr;

use super::sink::Sink;

/// Datagrams per hand-over to the backend (switchd's `RX_BATCH`).
pub const BATCH: usize = 64;

/// One engine under test, shared by every feeding thread.
pub trait Backend: Sync {
    /// Feeds `batch` (DATA of one job, from one thread) to the engine,
    /// reports each verdict with [`Sink::data`] and encodes every reply it
    /// causes with [`Sink::reply`] before it returns.
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink);

    /// Takes what other threads handed to thread `thread` (replies to
    /// encode, DATA to take), if the backend hands any over: how many
    /// items it took.
    fn drain(&self, _thread: usize, _out: &mut Sink) -> usize {
        0
    }

    /// Job `job`'s window floor now (read after the run, for the count of
    /// RESULTs).
    fn floor(&self, job: u16) -> u32;

    /// Seqs of job `job` completed so far: the floor, and those completed
    /// above it (threads fed by seq lane complete out of order).
    fn completed(&self, job: u16) -> u64 {
        u64::from(self.floor(job))
    }
}

/// The lock-free DATA path of issue 21 over `table`, through the entry
/// point switchd runs ([`Switch`]): each DATA tries the data path, the
/// table (locked) takes only what it hands back, and a completion's RESULT
/// is encoded from the job's shadow for every member, with no lock, by the
/// thread that owns the member's queue.
pub(super) fn lock_free(table: JobTable, threads: usize) -> LockFree {
    // Room for a hand-off per seq of every job's window: none is ever
    // refused (switchd counts a refused one in tx_ring_full).
    let room = table
        .jobs()
        .map(|j| j.config.pool_slots as usize)
        .sum::<usize>()
        .max(1);
    LockFree {
        switch: Switch::new(table),
        outboxes: (0..threads)
            .map(|_| Outbox {
                seqs: ArrayQueue::new(room),
                replies: ArrayQueue::new(room),
            })
            .collect(),
    }
}

pub(super) struct LockFree {
    switch: Switch,
    /// Per thread, what other threads handed it.
    outboxes: Vec<Outbox>,
}

/// What other threads handed one thread: the (job, seq)s they completed
/// that have RESULTs for ranks on its queue (a [`Handoff::Results`] in 8
/// bytes, the hand-off of every completion here), and single replies.
struct Outbox {
    seqs: ArrayQueue<(u16, u32)>,
    replies: ArrayQueue<Reply>,
}

/// One feeding thread's [`Transmit`]: a RESULT goes out from the thread
/// that owns the queue its rank joined on (queue `t` is thread `t`'s);
/// every reply is encoded whole into the sink.
struct Shell<'a> {
    outboxes: &'a [Outbox],
    out: &'a mut Sink,
}

impl Transmit for Shell<'_> {
    fn route(&mut self, r: &mut Reply) -> Option<usize> {
        let q = r.to.queue as usize;
        (q < self.outboxes.len()).then_some(q)
    }

    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        self.out.reply(r, |buf| encode_result(hdr, res, token, buf));
    }

    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        self.out.reply(r, encode);
    }

    fn hand_off(&mut self, thread: usize, h: Handoff) {
        let outbox = &self.outboxes[thread];
        let refused = match h {
            Handoff::Results { job, seq } => outbox.seqs.push((job, seq)).err(),
            Handoff::Reply(r) => outbox.replies.push(r).err().map(|r| match r.msg {
                ReplyMsg::Result { seq, .. } => (r.job, seq),
                _ => (r.job, 0),
            }),
        };
        if let Some((job, seq)) = refused {
            self.out.hand_off_refused(job, seq);
        }
    }

    /// No shadow (overwritten: a bug here) fails the encoding, and the run.
    fn unsent(&mut self, r: &Reply) {
        self.out.reply(r, |_| None);
    }
}

impl LockFree {
    /// A batch of thread `thread`'s datagrams, received now: the table's
    /// lock at most once, and the priority board's clock moved, as
    /// switchd's receive loop does per batch.
    pub(super) fn batch(&self, thread: usize) -> SwitchBatch<'_> {
        self.switch.batch(thread, Instant::now())
    }

    /// One datagram of `batch` (of thread `thread`), as switchd's receive
    /// loop takes it.
    pub(super) fn take(
        &self,
        batch: &mut SwitchBatch<'_>,
        datagram: &[u8],
        from: &Endpoint,
        out: &mut Sink,
    ) {
        let mut shell = Shell {
            outboxes: &self.outboxes,
            out,
        };
        let h = batch.on_datagram(datagram, *from, false, &mut shell);
        shell.out.data(h.verdict);
    }
}

impl Backend for LockFree {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let thread = batch.thread;
        self.drain(thread, out);
        let mut b = self.batch(thread);
        for (datagram, from) in batch.iter() {
            self.take(&mut b, datagram, from, out);
        }
    }

    fn drain(&self, thread: usize, out: &mut Sink) -> usize {
        let Some(outbox) = self.outboxes.get(thread) else {
            return 0;
        };
        if outbox.seqs.is_empty() && outbox.replies.is_empty() {
            return 0;
        }
        let mut b = self.batch(thread);
        let mut shell = Shell {
            outboxes: &self.outboxes,
            out,
        };
        let mut n = 0;
        while let Some(r) = outbox.replies.pop() {
            b.on_handoff(Handoff::Reply(r), &mut shell);
            n += 1;
        }
        while let Some((job, seq)) = outbox.seqs.pop() {
            b.on_handoff(Handoff::Results { job, seq }, &mut shell);
            n += 1;
        }
        n
    }

    fn floor(&self, job: u16) -> u32 {
        self.switch
            .data_path()
            .with_job(job, |core| core.engine.floor())
            .unwrap_or(0)
    }

    fn completed(&self, job: u16) -> u64 {
        self.switch
            .data_path()
            .with_job(job, |core| {
                let e = &core.engine;
                let f = e.floor();
                let above = (0..e.len() as u32)
                    .filter(|k| e.shadow(f.wrapping_add(*k)).is_some())
                    .count();
                u64::from(f) + above as u64
            })
            .unwrap_or(0)
    }
}

/// switchd before issue 21 over `table`, whose `handle` calls are made at
/// `now`.
pub(super) fn table_lock(table: JobTable, now: Instant) -> TableLock {
    TableLock {
        table: Mutex::new(table),
        now,
    }
}

/// switchd before issue 21: one table mutex, held for a whole batch.
pub(super) struct TableLock {
    table: Mutex<JobTable>,
    now: Instant,
}

impl Backend for TableLock {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        for (datagram, from) in batch.iter() {
            let v = t.handle(datagram, *from, false, self.now);
            out.data(v);
            while let Some(r) = t.poll_reply() {
                out.reply(&r, |buf| t.encode(&r, buf));
            }
        }
    }

    fn floor(&self, job: u16) -> u32 {
        table_floor(&self.table, job)
    }

    fn completed(&self, job: u16) -> u64 {
        let t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        t.get(job).map_or(0, |j| {
            let f = j.floor();
            let above = (0..j.config.pool_slots as u32)
                .filter(|k| j.result(f.wrapping_add(*k)).is_some())
                .count();
            u64::from(f) + above as u64
        })
    }
}

/// Up to [`BATCH`] DATA datagrams of one thread, in the order
/// received: slices of the thread's frame ring, each with its sender.
pub struct Batch<'a> {
    /// The feeding thread's index in the run (0..T): the queue it owns,
    /// and its counter stripe.
    pub thread: usize,
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

/// Job `job`'s window floor in a locked table (0 if it has no such job):
/// the floor of every backend built on one `Mutex<JobTable>`. A poisoned
/// lock still answers: the run already failed, and the count is read after.
pub(super) fn table_floor(table: &Mutex<JobTable>, job: u16) -> u32 {
    let t = table.lock().unwrap_or_else(PoisonError::into_inner);
    t.get(job).map_or(0, Job::floor)
}
