//! The engines the scaling benchmark compares, each behind [`Backend`]: a
//! batch of DATA datagrams in, every reply they cause encoded out.
//!
//! Owns: [`Backend`], [`Batch`] (at most [`BATCH`] datagrams) and two of
//! the backends; [`super::BackendKind`] names them for the CLI and builds
//! them, and `lanes`, built on `lockfree`, is in lanes.rs. `table-lock`
//! ([`TableLock`]) is switchd's design before issue 21: one
//! `Mutex<JobTable>` taken per receive batch, the replies drained and
//! encoded while it is held (as `switchd/src/dataplane/rx.rs` does per
//! frame). `lockfree` ([`LockFree`]) is the lock-free DATA path of issue
//! 21 with switchd's RESULT hand-off (`switchd/src/dataplane/tx.rs`,
//! `Out::fan_out`): a RESULT goes out from the thread that owns the queue
//! its rank joined on, so the completing thread sends those of its own
//! ranks and hands the seq once to each other thread that owns some, which
//! sends them to its ranks; every thread empties its outbox before each
//! batch.
//!
//! Invariants: `feed` and `drain` allocate nothing and make no syscall;
//! every reply a batch causes is encoded (through [`Sink::reply`]) before
//! `feed` returns or is in an outbox, which its thread empties with
//! `drain`; so once every thread has stopped and drained, the RESULTs
//! counted are exactly ranks × completed seqs.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;

use proto::switch::engine::ResultRef;
use proto::switch::{
    DataOutcome, DataPath, Encoded, Endpoint, Fast, Job, JobCore, JobTable, Reply, ReplyMsg,
    ResultTokens, Verdict,
};
use proto::wire::HEADER_LEN;

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

/// The lock-free DATA path of issue 21 over `table`: what switchd's
/// dataplane threads do (`switchd/src/dataplane/rx.rs`): each DATA through
/// [`DataPath::on_datagram`], the table (locked) only for what it hands
/// back, a completion's RESULT encoded from the job's shadow for every
/// member, with no lock, by the thread that owns the member's queue.
pub(super) fn lock_free(table: JobTable, now: Instant, threads: usize) -> LockFree {
    // Room for a hand-off per seq of every job's window: none is ever
    // refused (switchd counts a refused one in tx_ring_full).
    let room = table
        .jobs()
        .map(|j| j.config.pool_slots as usize)
        .sum::<usize>()
        .max(1);
    LockFree {
        dp: table.data_path(),
        table: Mutex::new(table),
        now,
        outboxes: (0..threads).map(|_| ArrayQueue::new(room)).collect(),
    }
}

pub(super) struct LockFree {
    dp: Arc<DataPath>,
    table: Mutex<JobTable>,
    now: Instant,
    /// Per thread, the (job, seq)s other threads completed that have
    /// RESULTs for ranks on its queue.
    outboxes: Vec<ArrayQueue<(u16, u32)>>,
}

impl LockFree {
    /// The thread that sends `to`'s RESULTs: the owner of its queue, if a
    /// thread owns it.
    fn owner(&self, to: &Endpoint) -> Option<usize> {
        let q = to.queue as usize;
        (q < self.outboxes.len()).then_some(q)
    }

    /// Encodes `seq`'s RESULT for each member of job `job` (`core`) that
    /// thread `me` sends: those on its queue, and, when it completed the
    /// seq, those on a queue no thread owns. Returns the other threads that
    /// send some, as a bit set (the spec has at most 64 threads), and the
    /// members.
    fn send_results(
        &self,
        (job, core): (u16, &JobCore),
        seq: u32,
        me: usize,
        completed: bool,
        out: &mut Sink,
    ) -> (u64, u64) {
        let gen = self.dp.gen();
        let (mut others, mut members) = (0u64, 0u64);
        // One read lock, one window and one token for every member this
        // thread sends to, as switchd's fan-out takes them.
        let mut res = core.engine.result(seq);
        let tokens = res
            .as_ref()
            .and_then(|res| core.result_tokens(res, seq, gen, core.advertised_window()));
        core.for_each_member(|rank, to| {
            members += 1;
            match self.owner(to) {
                Some(t) if t == me => {}
                None if completed => {}
                Some(t) if completed => {
                    others |= 1 << t;
                    return;
                }
                _ => return,
            }
            let r = Reply::result(*to, job, rank, seq);
            // No shadow (overwritten: a bug here) fails the encoding, and
            // the run.
            out.reply(&r, |buf| {
                encode_result(core, gen, &r, res.as_mut()?, tokens.as_ref()?, buf)
            });
        });
        (others, members)
    }

    /// One datagram received by thread `thread`, as switchd's receive loop
    /// takes it.
    pub(super) fn take(&self, thread: usize, datagram: &[u8], from: &Endpoint, out: &mut Sink) {
        match self.dp.on_datagram(thread, datagram, from, false) {
            Fast::Slow => {
                let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
                out.data(t.handle(datagram, *from, false, self.now));
                while let Some(r) = t.poll_reply() {
                    out.reply(&r, |buf| t.encode(&r, buf));
                }
            }
            Fast::Done(o) => out.data(Verdict::Data(o)),
            Fast::Completed { job, seq } => {
                out.data(Verdict::Data(DataOutcome::Completed { seq }));
                self.dp.with_job(job, |core| {
                    let (mut others, members) =
                        self.send_results((job, core), seq, thread, true, out);
                    while others != 0 {
                        let t = others.trailing_zeros() as usize;
                        others &= others - 1;
                        if self.outboxes[t].push((job, seq)).is_err() {
                            out.hand_off_refused(job, seq);
                        }
                    }
                    self.dp.count_results_sent(thread, core, members);
                });
            }
            Fast::Retransmit { seq, .. } => {
                out.data(Verdict::Data(DataOutcome::Retransmit { seq }))
            }
        }
    }
}

/// Writes the RESULT `r` of `core`'s job whole into `buf` from `res` (the
/// shadow of `r`'s seq, read-locked once for the fan-out) and the fan-out's
/// `tokens`, as switchd's transmit path does (header, the shadow's payload,
/// the token).
fn encode_result(
    core: &JobCore,
    gen: u32,
    r: &Reply,
    res: &mut ResultRef<'_>,
    tokens: &ResultTokens,
    buf: &mut [u8],
) -> Option<Encoded> {
    let ReplyMsg::Result { seq, retx } = r.msg else {
        return None;
    };
    let hdr = core.result_header(res, seq, r.rank, retx, gen, tokens.window);
    hdr.emit_to(buf).ok()?;
    let payload = res.bytes();
    let token = tokens.for_header(&hdr);
    let end = HEADER_LEN + payload.len();
    buf.get_mut(HEADER_LEN..end)?.copy_from_slice(payload);
    buf.get_mut(end..end + token.len())?.copy_from_slice(token);
    Some(Encoded {
        len: end + token.len(),
        ce: res.shadow().ece,
    })
}

impl Backend for LockFree {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let thread = batch.thread;
        self.drain(thread, out);
        for (datagram, from) in batch.iter() {
            self.take(thread, datagram, from, out);
        }
    }

    fn drain(&self, thread: usize, out: &mut Sink) -> usize {
        let Some(outbox) = self.outboxes.get(thread) else {
            return 0;
        };
        let mut n = 0;
        while let Some((job, seq)) = outbox.pop() {
            self.dp.with_job(job, |core| {
                self.send_results((job, core), seq, thread, false, out);
            });
            n += 1;
        }
        n
    }

    fn floor(&self, job: u16) -> u32 {
        self.dp
            .with_job(job, |core| core.engine.floor())
            .unwrap_or(0)
    }

    fn completed(&self, job: u16) -> u64 {
        self.dp
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
