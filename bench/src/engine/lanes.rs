//! The `lanes` backend: software seq lanes in front of `lockfree`. Each
//! seq has a lane, `seq mod T`, and the thread of that number makes every
//! contribution to it: a thread that receives a DATA of another lane
//! copies the datagram into a ring toward that lane's thread instead of
//! taking it. So a slot's lock, rows and accumulator stay on one core
//! whatever the queue each rank arrives on (what the `steered` layout gets
//! from NIC rules), and what crosses cores is the copied bytes and one
//! ring index per batch, not a hand-over per contribution. The cost is one
//! copy of every DATA of another lane (switchd would copy it out of its
//! UMEM frame, which goes back to the fill ring at once).
//!
//! Owns: [`Lanes`]: per ordered pair of threads a single-producer,
//! single-consumer ring (`rtrb`: its chunk API publishes a whole group of
//! entries with one index store) of copied datagrams.
//!
//! Invariants: lanes decide only where a DATA is taken, never whether: the
//! engine is correct from any thread, so a datagram that does not fit a
//! ring entry, or meets a full ring, is taken where it arrived. A thread
//! takes what its rings hold before each batch and while it waits for its
//! window ([`Backend::drain`]), so nothing stays in a ring once every
//! thread has drained. Rings are allocated at setup; `feed` and `drain`
//! allocate nothing and make no syscall.

use std::mem::MaybeUninit;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rtrb::{Consumer, Producer, RingBuffer};

use proto::switch::Endpoint;
use proto::wire::Header;

use super::backend::{Backend, Batch, LockFree, BATCH};
use super::sink::Sink;

/// Datagram bytes a ring entry holds: a DATA of a 1500-byte MTU and more.
const ENTRY: usize = 2048;
/// Entries per ring: two receive batches.
const RING: usize = 2 * BATCH;

/// A copied datagram and its sender.
struct LaneFrame {
    len: u16,
    from: Endpoint,
    /// The first `len` bytes are the datagram.
    bytes: [MaybeUninit<u8>; ENTRY],
}

impl LaneFrame {
    fn datagram(&self) -> &[u8] {
        let len = usize::from(self.len).min(ENTRY);
        // SAFETY: `push` wrote the first `len` bytes before it committed
        // the entry.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), len) }
    }
}

pub(super) struct Lanes {
    inner: LockFree,
    threads: usize,
    /// `tx[from * T + to]`: thread `from`'s half of the ring toward `to`
    /// (locked only by `from`: the lock is never contended).
    tx: Box<[Mutex<Producer<LaneFrame>>]>,
    /// `rx[to * T + from]`: thread `to`'s half of the same ring.
    rx: Box<[Mutex<Consumer<LaneFrame>>]>,
}

impl Lanes {
    pub(super) fn new(inner: LockFree, threads: usize) -> Lanes {
        let t = threads.max(1);
        let mut tx: Vec<Option<Mutex<Producer<LaneFrame>>>> = (0..t * t).map(|_| None).collect();
        let mut rx: Vec<Option<Mutex<Consumer<LaneFrame>>>> = (0..t * t).map(|_| None).collect();
        for from in 0..t {
            for to in 0..t {
                // A thread's ring to itself is never used.
                let (p, c) = RingBuffer::new(if from == to { 1 } else { RING });
                tx[from * t + to] = Some(Mutex::new(p));
                rx[to * t + from] = Some(Mutex::new(c));
            }
        }
        Lanes {
            inner,
            threads: t,
            tx: tx.into_iter().flatten().collect(),
            rx: rx.into_iter().flatten().collect(),
        }
    }

    /// The lane of `datagram`: the thread that takes it (`me` for
    /// anything that is not a well-formed header).
    fn lane(&self, datagram: &[u8], me: usize) -> usize {
        Header::new_checked(datagram).map_or(me, |h| h.seq() as usize % self.threads)
    }
}

/// Copies `datagram` into `p`'s next entry and publishes it: false if it
/// does not fit an entry or the ring is full.
fn push(p: &mut Producer<LaneFrame>, datagram: &[u8], from: &Endpoint) -> bool {
    if datagram.len() > ENTRY {
        return false;
    }
    let Ok(mut chunk) = p.write_chunk_uninit(1) else {
        return false;
    };
    let (first, _) = chunk.as_mut_slices();
    let Some(slot) = first.first_mut() else {
        return false;
    };
    let e = slot.as_mut_ptr();
    // SAFETY: `e` points at the entry the chunk lends us; every field is
    // written before the commit (`bytes` is MaybeUninit, of which the first
    // `len` bytes are written, as `LaneFrame::datagram` reads them).
    unsafe {
        std::ptr::addr_of_mut!((*e).len).write(datagram.len() as u16);
        std::ptr::addr_of_mut!((*e).from).write(*from);
        std::ptr::addr_of_mut!((*e).bytes)
            .cast::<u8>()
            .copy_from_nonoverlapping(datagram.as_ptr(), datagram.len());
        chunk.commit(1);
    }
    true
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Backend for Lanes {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let me = batch.thread;
        self.drain(me, out);
        let t = self.threads;
        let mut taking = self.inner.batch(me);
        if t < 2 || me >= t {
            for (datagram, from) in batch.iter() {
                self.inner.take(&mut taking, datagram, from, out);
            }
            return;
        }
        // Other lanes first, so that their threads can start on them; a
        // DATA that cannot be handed over is taken here. One pass: a run of
        // DATA for one lane shares one lock of its ring.
        let mut local = [true; BATCH];
        let mut ring: Option<(usize, MutexGuard<'_, Producer<LaneFrame>>)> = None;
        for (i, (datagram, from)) in batch.iter().enumerate().take(BATCH) {
            let lane = self.lane(datagram, me);
            if lane == me {
                continue;
            }
            if ring.as_ref().is_none_or(|(held, _)| *held != lane) {
                ring = Some((lane, guard(&self.tx[me * t + lane])));
            }
            if let Some((_, p)) = ring.as_mut() {
                local[i] = !push(p, datagram, from);
            }
        }
        drop(ring);
        for (i, (datagram, from)) in batch.iter().enumerate() {
            if i >= BATCH || local[i] {
                self.inner.take(&mut taking, datagram, from, out);
            }
        }
    }

    fn drain(&self, thread: usize, out: &mut Sink) -> usize {
        let mut n = self.inner.drain(thread, out);
        let t = self.threads;
        if thread >= t {
            return n;
        }
        for from in (0..t).filter(|f| *f != thread) {
            let mut c = guard(&self.rx[thread * t + from]);
            let ready = c.slots();
            let Ok(chunk) = c.read_chunk(ready) else {
                continue;
            };
            let (a, b) = chunk.as_slices();
            let mut taking = self.inner.batch(thread);
            for f in a.iter().chain(b) {
                self.inner.take(&mut taking, f.datagram(), &f.from, out);
            }
            n += chunk.len();
            chunk.commit_all();
        }
        n
    }

    fn floor(&self, job: u16) -> u32 {
        self.inner.floor(job)
    }

    fn completed(&self, job: u16) -> u64 {
        self.inner.completed(job)
    }
}
