//! The switch's one entry point for received datagrams (quinn's
//! `Endpoint::handle`): [`Switch`], the job table behind its lock and the
//! lock-free data path over the same jobs, fed one datagram at a time by
//! every shell: switchd's dataplane threads, the engine benchmark, the
//! loopback stand-in, the simulations and the fuzzer.
//!
//! Owns: [`Switch`], [`Batch`] (one thread's frames in a row: the table's
//! lock taken the first time one of them needs it, held to the batch's
//! end), [`Transmit`] (what a shell implements: which thread sends to an
//! endpoint, and the bytes out), [`Handoff`] (what one thread hands the
//! thread that owns a member's socket) and [`Handled`] (what one datagram
//! did).
//!
//! Layering: above the table (`super`, which does not re-export this file,
//! so that the two do not import each other): `proto::switch::entry::…`.
//!
//! Invariants:
//! * Every datagram tries the lock-free path ([`DataPath::on_datagram`])
//!   first; only what it hands back ([`Fast::Slow`]) reaches
//!   [`JobTable::handle`], so a DATA from a bound member of an active job
//!   never takes the table's lock, in every driver alike.
//! * Every reply is decided here, once: a completion's fan-out (one
//!   RESULT per member, in rank order), a resend, and whatever the table
//!   queued. The shell only says which thread owns the socket an endpoint
//!   is reached through ([`Transmit::route`]) and moves the bytes; a reply
//!   for another thread's socket is a [`Handoff`] that thread gives back to
//!   [`Batch::on_handoff`].
//! * A fan-out read-locks the shadow once and makes the RESULT tokens once
//!   for every member it sends to (a lock per member cost a fifth of the
//!   single-thread rate in the engine benchmark); every RESULT of it
//!   carries the window the tokens cover: the job's advertised one, its
//!   priority yield included ([`JobCore::advertised_window`]).
//! * An untagged RESULT is encoded from the job's shadow through the data
//!   path, whoever decided it; a tagged one (`auth = "mac"`) and every other
//!   reply through [`JobTable::encode`], under the lock.
//! * The priority board's clock moves once per batch ([`Switch::batch`]),
//!   never per frame.
//! * A RESULT's source port is decided with its [`Reply`]: a member granted
//!   lane replies gets the RESULT of seq s from `agg_port + (s mod L)`
//!   ([`Reply::result`], [`Reply::resend`]; docs/PROTOCOL.md, "Seq
//!   lanes"), every other reply from the port the member joined on; a
//!   shell sends from `r.to.local_port` and never changes it. The data
//!   path's resend takes the grant from the bound member it checked.
//! * Nothing here allocates or makes a syscall per datagram.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::config::Endpoint;
use super::datapath::{DataOutcome, DataPath, Fast, JobCore, ResultTokens};
use super::engine::ResultRef;
use super::reply::{Reply, ReplyMsg};
use super::{Encoded, JobTable, Verdict};
use crate::tag::Tag;
use crate::wire::HeaderRepr;

/// Threads a completed seq can be handed to once each (a bit set); a
/// thread numbered above gets a hand-off per member.
const SEQ_HANDOFF_THREADS: usize = 64;

/// What a shell implements: where an endpoint's replies leave from, and
/// the bytes out. Encoding stays in proto; the shell adds its L2–L4
/// headers (or a socket does) and sends.
pub trait Transmit {
    /// The thread that owns the socket reply `r` leaves through, after the
    /// shell points `r.to` at the socket it prefers (switchd's seq lanes
    /// send a RESULT from the completing thread's own socket on the
    /// member's port). `None`: no thread owns one; it is sent from here,
    /// where the shell counts it as not sent.
    fn route(&mut self, r: &mut Reply) -> Option<usize>;

    /// Whether a completed seq may go to another thread as one
    /// [`Handoff::Results`], which sends to every member [`Transmit::route`]
    /// gives it. False when routing depends on the thread asking (switchd's
    /// seq lanes): each member is then handed off alone.
    fn hands_off_seqs(&self) -> bool {
        true
    }

    /// Sends an untagged RESULT: header `hdr`, the payload (`res.bytes()`,
    /// the shadow, read-locked while this runs; its checksum sum is
    /// `res.payload_sum()`), then `token`; CE when `res.shadow().ece`.
    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag);

    /// Sends any other reply (a tagged RESULT included, and a leaf's
    /// datagram to a spine: [`Reply::is_upstream`]): `encode` writes its
    /// aggregation header and payload into a buffer, as
    /// [`JobTable::encode`] does (None: it does not fit, or it is gone).
    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>);

    /// Gives `h` to thread `thread`, which owns its socket.
    fn hand_off(&mut self, thread: usize, h: Handoff);

    /// `r` could not be made at all (its shadow or token is gone): count
    /// it as not sent (the worker's resend recovers it).
    fn unsent(&mut self, r: &Reply);
}

/// What one thread hands the thread that owns a member's socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// A reply to a member whose socket the receiving thread owns.
    Reply(Reply),
    /// The RESULT of `seq` (completed) to every member of `job` whose
    /// socket the receiving thread owns: one hand-off per thread, not per
    /// member. Membership is read when it is sent: a member that moved to
    /// another thread's socket meanwhile misses it, and its resend is
    /// answered from the shadow.
    Results { job: u16, seq: u32 },
}

/// What one datagram did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    pub verdict: Verdict,
    /// Taken by the lock-free data path: the table's lock was not needed.
    pub lock_free: bool,
}

/// The job table and the lock-free data path over its jobs.
#[derive(Debug)]
pub struct Switch {
    table: Mutex<JobTable>,
    data_path: Arc<DataPath>,
}

impl Switch {
    pub fn new(table: JobTable) -> Switch {
        Switch {
            data_path: table.data_path(),
            table: Mutex::new(table),
        }
    }

    /// The job table, locked (control-path reads and changes; keep it
    /// short: the data path's slow frames wait meanwhile).
    pub fn table(&self) -> MutexGuard<'_, JobTable> {
        lock(&self.table)
    }

    /// The lock-free data path (counters, floors, the priority board).
    pub fn data_path(&self) -> &Arc<DataPath> {
        &self.data_path
    }

    /// The switch generation.
    pub fn gen(&self) -> u32 {
        self.data_path.gen()
    }

    /// Starts a batch of frames of thread `thread` received at `now` (and
    /// moves the priority board's clock to `now`).
    pub fn batch(&self, thread: usize, now: Instant) -> Batch<'_> {
        self.data_path.tick(now);
        Batch {
            switch: self,
            thread,
            now,
            held: None,
        }
    }

    /// One datagram as a batch of its own: [`Batch::on_datagram`].
    pub fn on_datagram(
        &self,
        thread: usize,
        datagram: &[u8],
        from: Endpoint,
        ce: bool,
        now: Instant,
        out: &mut impl Transmit,
    ) -> Handled {
        self.batch(thread, now).on_datagram(datagram, from, ce, out)
    }
}

fn lock(m: &Mutex<JobTable>) -> MutexGuard<'_, JobTable> {
    // A panicking thread stops the shell; the table it held is still
    // consistent between two messages, so keep serving.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One thread's frames in a row: the table's lock is taken the first time
/// one needs it and held until the batch is dropped.
pub struct Batch<'s> {
    switch: &'s Switch,
    thread: usize,
    now: Instant,
    held: Option<MutexGuard<'s, JobTable>>,
}

impl Batch<'_> {
    /// The table, locked until the batch ends.
    pub fn table(&mut self) -> &mut JobTable {
        let table = &self.switch.table;
        self.held.get_or_insert_with(|| lock(table))
    }

    /// Whether the batch has taken the table's lock.
    pub fn holds_table(&self) -> bool {
        self.held.is_some()
    }

    /// One received datagram (a UDP payload) from `from`, `ce` if it or
    /// the queue it waited in was congestion-marked: the lock-free path,
    /// else the table; every reply it causes goes to `out`.
    #[inline]
    pub fn on_datagram(
        &mut self,
        datagram: &[u8],
        from: Endpoint,
        ce: bool,
        out: &mut impl Transmit,
    ) -> Handled {
        let dp = &*self.switch.data_path;
        let fast = |o: DataOutcome| Handled {
            verdict: Verdict::Data(o),
            lock_free: true,
        };
        match dp.on_datagram(self.thread, datagram, &from, ce) {
            Fast::Slow => {
                let now = self.now;
                let verdict = self.table().handle(datagram, from, ce, now);
                self.send_queued(out);
                Handled {
                    verdict,
                    lock_free: false,
                }
            }
            Fast::Done(o) => fast(o),
            Fast::Completed { job, seq } => {
                self.fan_out(job, seq, out);
                fast(DataOutcome::Completed { seq })
            }
            Fast::Retransmit {
                job,
                rank,
                seq,
                result_lanes,
            } => {
                // To where the DATA came from, under the member's grant.
                let to = Endpoint {
                    result_lanes,
                    ..from
                };
                self.resend(Reply::resend(to, job, rank, seq), out);
                fast(DataOutcome::Retransmit { seq })
            }
        }
    }

    /// The table's timers (a leaf's resends to its spines), and the
    /// replies they queue.
    pub fn on_timeout(&mut self, out: &mut impl Transmit) {
        let now = self.now;
        self.table().handle_timeout(now);
        self.send_queued(out);
    }

    /// What another thread handed this one ([`Transmit::hand_off`]).
    pub fn on_handoff(&mut self, h: Handoff, out: &mut impl Transmit) {
        match h {
            Handoff::Reply(r) => {
                if !self.send_untagged_result(&r, out) {
                    let t = self.table();
                    out.send_reply(&r, |b| t.encode(&r, b));
                }
            }
            Handoff::Results { job, seq } => self.own_results(job, seq, out),
        }
    }

    /// Sends every reply the table has queued (after a message or timers
    /// of its own, e.g. a control-path change).
    pub fn send_queued(&mut self, out: &mut impl Transmit) {
        let thread = self.thread;
        let sw = self.switch;
        let dp = &*sw.data_path;
        let t = self.table();
        while let Some(r) = t.poll_reply() {
            send(dp, thread, t, r, out);
        }
    }

    /// The RESULT of `seq` to every member of `job` (the data path
    /// completed it), each from here or via its socket's owner: one
    /// [`Handoff::Results`] per other thread that owns members, when the
    /// shell allows ([`Transmit::hands_off_seqs`]).
    fn fan_out(&self, job: u16, seq: u32, out: &mut impl Transmit) {
        let dp = &*self.switch.data_path;
        let me = self.thread;
        dp.with_job(job, |core| {
            let mut n = 0;
            let mut others = 0u64;
            let batch_seqs = out.hands_off_seqs();
            // One read lock of the shadow, one window and one token, for
            // every RESULT sent from here.
            let mut res = core.engine.result(seq);
            let tokens = tokens_for(dp, core, res.as_ref(), seq);
            core.for_each_member(|rank, to| {
                let mut r = Reply::result(*to, job, rank, seq);
                match out.route(&mut r) {
                    Some(t) if t != me && t < SEQ_HANDOFF_THREADS && batch_seqs => others |= 1 << t,
                    Some(t) if t != me => out.hand_off(t, Handoff::Reply(r)),
                    _ => send_fanned(dp, core, &r, res.as_mut(), tokens.as_ref(), out),
                }
                n += 1;
            });
            while others != 0 {
                let t = others.trailing_zeros() as usize;
                others &= others - 1;
                out.hand_off(t, Handoff::Results { job, seq });
            }
            dp.count_results_sent(me, core, n);
        });
    }

    /// The RESULT of `seq` to every member of `job` whose socket this
    /// thread owns (another thread completed it: [`Handoff::Results`]).
    fn own_results(&self, job: u16, seq: u32, out: &mut impl Transmit) {
        let dp = &*self.switch.data_path;
        let me = self.thread;
        dp.with_job(job, |core| {
            let mut res = core.engine.result(seq);
            let tokens = tokens_for(dp, core, res.as_ref(), seq);
            core.for_each_member(|rank, to| {
                let mut r = Reply::result(*to, job, rank, seq);
                if out.route(&mut r) == Some(me) {
                    send_fanned(dp, core, &r, res.as_mut(), tokens.as_ref(), out);
                }
            });
        });
    }

    /// A RESULT the data path decided to send again (to its sender only).
    fn resend(&self, mut r: Reply, out: &mut impl Transmit) {
        let dp = &*self.switch.data_path;
        let me = self.thread;
        dp.with_job(r.job, |core| {
            match out.route(&mut r) {
                Some(t) if t != me => out.hand_off(t, Handoff::Reply(r)),
                _ => send_result(dp, core, &r, out),
            }
            dp.count_results_sent(me, core, 1);
        });
    }

    /// Sends `r` from the data path if it is an untagged RESULT: whether
    /// it was one (sent, or counted unsent).
    fn send_untagged_result(&self, r: &Reply, out: &mut impl Transmit) -> bool {
        untagged_result(&self.switch.data_path, r, out)
    }
}

/// Sends `r`, which the table queued: up to a spine, here, or via the
/// owning thread.
fn send(dp: &DataPath, me: usize, table: &JobTable, mut r: Reply, out: &mut impl Transmit) {
    if r.is_upstream() {
        out.send_reply(&r, |b| table.encode(&r, b));
        return;
    }
    match out.route(&mut r) {
        Some(t) if t != me => out.hand_off(t, Handoff::Reply(r)),
        _ => {
            if !untagged_result(dp, &r, out) {
                out.send_reply(&r, |b| table.encode(&r, b));
            }
        }
    }
}

/// Sends `r` from the data path if it is a RESULT of an untagged job:
/// false if it is anything else (it needs the table).
fn untagged_result(dp: &DataPath, r: &Reply, out: &mut impl Transmit) -> bool {
    if !matches!(r.msg, ReplyMsg::Result { .. }) {
        return false;
    }
    dp.with_job(r.job, |core| {
        if core.tagged {
            return false;
        }
        send_result(dp, core, r, out);
        true
    })
    .unwrap_or(false)
}

/// Sends `core`'s untagged RESULT `r` alone, from the job's shadow, with
/// its own token.
fn send_result(dp: &DataPath, core: &JobCore, r: &Reply, out: &mut impl Transmit) {
    let ReplyMsg::Result { seq, retx } = r.msg else {
        return;
    };
    let Some(mut res) = core.engine.result(seq) else {
        out.unsent(r);
        return;
    };
    let window = core.advertised_window();
    let hdr = core.result_header(&mut res, seq, r.rank, retx, dp.gen(), window);
    match core.result_token(&hdr) {
        Some(token) => out.send_result(r, &hdr, &res, &token),
        None => out.unsent(r),
    }
}

/// Sends one member's RESULT of a fan-out from `res`, the shadow the
/// fan-out read-locked once, with the fan-out's `tokens` (None: the
/// shadow is gone or the job is no longer active: not sent).
fn send_fanned(
    dp: &DataPath,
    core: &JobCore,
    r: &Reply,
    res: Option<&mut ResultRef<'_>>,
    tokens: Option<&ResultTokens>,
    out: &mut impl Transmit,
) {
    let (Some(res), Some(tokens), ReplyMsg::Result { seq, retx }) = (res, tokens, r.msg) else {
        out.unsent(r);
        return;
    };
    let hdr = core.result_header(res, seq, r.rank, retx, dp.gen(), tokens.window);
    out.send_result(r, &hdr, res, tokens.for_header(&hdr));
}

/// The tokens of `seq`'s RESULTs (`res`, its shadow) as the switch sends
/// them now: its generation and the job's advertised window.
fn tokens_for(
    dp: &DataPath,
    core: &JobCore,
    res: Option<&ResultRef<'_>>,
    seq: u32,
) -> Option<ResultTokens> {
    core.result_tokens(res?, seq, dp.gen(), core.advertised_window())
}

/// Writes an untagged RESULT whole into `buf` (header `hdr`, the payload
/// from `res`, then `token`), for shells that send a datagram from one
/// buffer ([`Transmit::send_result`]): None if it does not fit.
#[inline]
pub fn encode_result(
    hdr: &HeaderRepr,
    res: &ResultRef<'_>,
    token: &Tag,
    buf: &mut [u8],
) -> Option<Encoded> {
    use crate::wire::HEADER_LEN;
    hdr.emit_to(buf).ok()?;
    let payload = res.bytes();
    let end = HEADER_LEN + payload.len();
    buf.get_mut(HEADER_LEN..end)?.copy_from_slice(payload);
    buf.get_mut(end..end + token.len())?.copy_from_slice(token);
    Some(Encoded {
        len: end + token.len(),
        ce: res.shadow().ece,
    })
}
