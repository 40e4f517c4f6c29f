//! The threads of one rank that carry a collective together
//! (docs/design/worker-threads.md). Thread 0 is the caller's: it owns the
//! session (joins, probes, HEARTBEATs) and share 0. Threads 1..T are
//! started for each collective of T > 1 threads ([`std::thread::scope`]),
//! each with share t of the chunks and its own window, RTT, DCTCP and GSO
//! burst limit, and end with it.
//!
//! Owns: [`Lane`] (one lane thread's member and batches, kept between
//! collectives so that its RTT and DCTCP keep what they learnt),
//! [`LaneSockets`] (sockets 1..L of the rank, all bound to its one local
//! port), [`Progress`] (what lane threads tell thread 0),
//! [`lane_loop`], the automatic thread count ([`auto_threads`]), and the
//! steps every thread's loop takes, thread 0's included: [`drain`] (its
//! sockets' datagrams, in order), [`send_share`] and [`wait_turn`].
//!
//! Invariants:
//! * Share t carries the seqs ≡ t (mod T). T divides the switch's seq
//!   lanes L, so those are the lanes ≡ t (mod T), and with lane replies
//!   the switch sends lane l's RESULTs from its port P + l, which the
//!   kernel delivers to socket l alone (connected to P + l; socket 0 is
//!   connected to P). Thread t reads exactly the sockets of its lanes: no
//!   RESULT is handed from one thread to another.
//! * Every reply that is not a RESULT comes from P, to socket 0, which
//!   only thread 0 reads; lane threads send no control message and never
//!   rejoin. When the session is lost thread 0 stops them
//!   ([`Progress::stop`]), rejoins from the oldest unanswered seq of every
//!   share, and starts them again.
//! * No two threads write the same output bytes: each chunk's range is one
//!   seq's, each seq one share's, and a share writes a chunk at its first
//!   RESULT only ([`Output`]; its input is kept before: [`crate::buffers`]).
//! * Nothing crosses threads per datagram: a lane thread publishes its
//!   progress once per turn of its loop (four relaxed atomics).
//! * The straggler hold (docs/PROTOCOL.md, "Reliability") runs on every
//!   share. A lane's probe (its oldest chunk timed out) goes to thread 0
//!   through one word per lane ([`Progress::ask`]), and thread 0 sends it
//!   as a HEARTBEAT through the session, one per probe
//!   ([`Progress::take_probe`]); while lanes hold it wakes at their timers
//!   ([`Progress::next_lane_wake`]) to send them promptly. The answer
//!   comes to socket 0; thread 0 puts what it says of this rank in the
//!   mailbox of the seq's share ([`Progress::answer`]), which the lane
//!   reads before its next send ([`Progress::take_answer`]), looking every
//!   millisecond while an answer is due. Both are single-writer,
//!   single-reader words: no lock, no allocation.

use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proto::member::{Event as MemberEvent, Member, ProbeAnswer, ResultOutcome};
use proto::seq::serial_offset;
use proto::wire::Dtype;

use crate::buffers::{Input, Output};
use crate::gso::{self, TransportKind};
use crate::mmsg::{self, DatagramBatch};
use proto::member::DataInput;

/// A socket call of a lane that failed (the worker's `Io` error).
#[derive(Debug, thiserror::Error)]
#[error("{call} failed on the UDP socket to {peer}: {source}")]
pub struct SocketFailed {
    pub call: &'static str,
    pub peer: SocketAddrV4,
    pub source: std::io::Error,
}

fn failed(call: &'static str, peer: SocketAddrV4) -> impl FnOnce(std::io::Error) -> SocketFailed {
    move |source| SocketFailed { call, peer, source }
}

/// Most threads `threads = 0` (auto) picks: past 4 a rank's copies, not
/// its syscalls, bound it.
pub const MAX_AUTO_THREADS: usize = 4;
/// Fewest chunks each thread gets under `threads = 0`: below that,
/// starting a thread costs more than it saves.
pub const MIN_CHUNKS_PER_THREAD: u32 = 128;

/// The thread count `threads = 0` picks for a collective of `chunks`
/// chunks, when this process may use `cpus` CPUs and `local_ranks` ranks
/// share this host's (torchrun's `LOCAL_WORLD_SIZE`): a power of two, at
/// most [`MAX_AUTO_THREADS`], a CPU per thread, and at least
/// [`MIN_CHUNKS_PER_THREAD`] chunks per thread.
pub fn auto_threads(chunks: u32, cpus: usize, local_ranks: usize) -> usize {
    let by_cores = cpus / local_ranks.max(1);
    let by_size = (chunks / MIN_CHUNKS_PER_THREAD) as usize;
    pow2_floor(by_cores.min(by_size).clamp(1, MAX_AUTO_THREADS))
}

/// The CPUs this process may use (affinity and cgroup quota) and the
/// ranks on this host (`LOCAL_WORLD_SIZE`, as torchrun sets it; 1 when
/// unset or not a number).
pub fn host_share() -> (usize, usize) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1);
    (cpus, local)
}

/// The largest power of two ≤ `n` (1 for 0).
pub fn pow2_floor(n: usize) -> usize {
    if n <= 1 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

/// Sockets 1..L of a rank with lane replies: each bound to the rank's
/// local address and port (`SO_REUSEPORT`, like socket 0) and connected
/// to the switch's lane port P + l, so that the kernel's exact 4-tuple
/// match gives it lane l's RESULTs and nothing else.
#[derive(Default)]
pub struct LaneSockets {
    socks: Vec<UdpSocket>,
}

impl LaneSockets {
    /// Sockets for lanes 1..`lanes` of `switch`, bound to `local`.
    pub fn open(
        local: SocketAddrV4,
        switch: SocketAddrV4,
        lanes: u16,
        gro: bool,
    ) -> Result<LaneSockets, SocketFailed> {
        let mut socks = Vec::with_capacity(usize::from(lanes).saturating_sub(1));
        for l in 1..lanes {
            let port = switch.port().wrapping_add(l);
            let peer = SocketAddrV4::new(*switch.ip(), port);
            let s = crate::sockets::open_lane_socket(local, peer)
                .map_err(failed("opening a lane socket", peer))?;
            if gro {
                gso::set_gro(s.as_raw_fd(), true)
                    .map_err(failed("setsockopt(UDP_GRO) on a lane socket", peer))?;
            }
            socks.push(s);
        }
        Ok(LaneSockets { socks })
    }

    /// Lanes these sockets serve, socket 0 included (1: none open).
    pub fn lanes(&self) -> usize {
        self.socks.len() + 1
    }

    /// The descriptors thread `t` of `threads` reads: socket 0 (`sock0`)
    /// and the lanes ≡ t (mod threads).
    pub fn fds_of(&self, sock0: RawFd, t: usize, threads: usize) -> Vec<RawFd> {
        (0..self.lanes())
            .filter(|l| l % threads == t)
            .map(|l| match l {
                0 => sock0,
                l => self.socks[l - 1].as_raw_fd(),
            })
            .collect()
    }
}

/// One lane thread's share of every collective (share t of T, t ≥ 1): its
/// member and its batches.
pub struct Lane {
    pub member: Member,
    pub txb: DatagramBatch,
    pub rxb: DatagramBatch,
    pub burst: gso::BurstLimit,
    /// The control session's join this lane last followed.
    pub followed: u64,
}

impl Lane {
    /// A lane carrying `member`'s share, with batches for `kind` (the
    /// transport socket 0 settled on), sending DATA of seq s to `switch`'s
    /// port + (s mod `lanes`).
    pub fn new(member: Member, kind: TransportKind, switch: SocketAddrV4, lanes: u16) -> Lane {
        let (mut txb, rxb) = match kind {
            TransportKind::UdpGso => (
                DatagramBatch::new_gso(mmsg::GSO_BATCH, mmsg::SLOT),
                DatagramBatch::new_gro(mmsg::GRO_BATCH),
            ),
            _ => (
                DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
                DatagramBatch::new(mmsg::BATCH, mmsg::SLOT),
            ),
        };
        txb.set_lanes(switch, lanes);
        Lane {
            member,
            txb,
            rxb,
            burst: gso::BurstLimit::default(),
            followed: 0,
        }
    }
}

/// Writes what a RESULT event brought into `out`: a fresh RESULT's values
/// at its chunk (`datagram` the RESULT, `input` the collective's input, for
/// a reduce-scatter's kept shard).
pub fn write_result(
    ev: &MemberEvent,
    datagram: &[u8],
    dtype: Dtype,
    input: Input<'_>,
    out: Option<Output<'_>>,
) {
    let (
        Some(out),
        MemberEvent::Result {
            outcome:
                ResultOutcome::Fresh {
                    into: Some(at),
                    count,
                    own,
                    ..
                },
            values,
            ..
        },
    ) = (out, ev)
    else {
        return;
    };
    let size = dtype.size();
    let n = *count as usize * size;
    let Some(got) = datagram.get(values.clone()).and_then(|v| v.get(..n)) else {
        return;
    };
    let mine = own.map(|o| input.values(o * size..o * size + n));
    input.before_output(at * size);
    out.write_chunk(dtype, at * size, got, mine);
}

/// What one lane thread last said: its oldest unanswered seq, when its
/// collective last made progress, whether its share is complete and when
/// its next timer runs out; and the straggler hold's two words between it
/// and thread 0.
#[derive(Default)]
struct LaneState {
    oldest: AtomicU32,
    /// Nanoseconds after [`Progress`]'s base; `u64::MAX`: not yet.
    since_ns: AtomicU64,
    done: AtomicBool,
    /// Its next resend timer, nanoseconds after the base (`u64::MAX`:
    /// none).
    next_ns: AtomicU64,
    /// A probe for thread 0 to send: [`PENDING`] | seq (0: none). Written
    /// by the lane, taken by thread 0.
    probe: AtomicU64,
    /// The answer to a probe: [`PENDING`] | kind << 32 | seq (0: none),
    /// and when it came (`answer_ns`, written first). Written by thread 0,
    /// taken by the lane.
    answer: AtomicU64,
    answer_ns: AtomicU64,
}

/// How soon thread 0 looks again at a lane whose timer passed before it
/// took its turn ([`Progress::next_lane_wake`]).
const LANE_LATE_LOOK: Duration = Duration::from_millis(1);

/// The bit that marks a [`LaneState`] word as holding something.
const PENDING: u64 = 1 << 63;

fn answer_kind(a: ProbeAnswer) -> u64 {
    match a {
        ProbeAnswer::OthersMissing => 1,
        ProbeAnswer::OursMissing => 2,
        ProbeAnswer::Complete => 3,
    }
}

fn answer_of(kind: u64) -> Option<ProbeAnswer> {
    match kind {
        1 => Some(ProbeAnswer::OthersMissing),
        2 => Some(ProbeAnswer::OursMissing),
        3 => Some(ProbeAnswer::Complete),
        _ => None,
    }
}

/// What lane threads 1..T tell thread 0 during one collective (their
/// progress and probes), thread 0's answers to their probes, and thread
/// 0's (or a failed lane's) order to stop.
pub struct Progress {
    base: Instant,
    stop: AtomicBool,
    lanes: Vec<LaneState>,
}

impl Progress {
    /// For `threads` threads (lanes 1..threads).
    pub fn new(threads: usize) -> Progress {
        Progress {
            base: Instant::now(),
            stop: AtomicBool::new(false),
            lanes: (1..threads)
                .map(|_| LaneState {
                    since_ns: AtomicU64::new(u64::MAX),
                    next_ns: AtomicU64::new(u64::MAX),
                    ..LaneState::default()
                })
                .collect(),
        }
    }

    /// `at` in nanoseconds after the base (0 before it).
    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// The instant `ns` nanoseconds after the base ([`Progress::ns`]'s
    /// inverse).
    fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Lane `t` (≥ 1) publishes where its member stands.
    fn publish(&self, t: usize, m: &Member) {
        let s = &self.lanes[t - 1];
        let c = m.collective();
        s.oldest.store(c.oldest_unacked_seq(), Ordering::Relaxed);
        let ns = c.last_progress().map_or(u64::MAX, |p| self.ns(p));
        s.since_ns.store(ns, Ordering::Relaxed);
        let next = c.next_timeout().map_or(u64::MAX, |d| self.ns(d));
        s.next_ns.store(next, Ordering::Relaxed);
        s.done.store(c.is_complete(), Ordering::Release);
    }

    /// Lane `t` (≥ 1) asks thread 0 to probe `seq` (its oldest chunk timed
    /// out): it replaces a probe not yet taken, which a newer one of the
    /// same share supersedes.
    pub fn ask(&self, t: usize, seq: u32) {
        self.lanes[t - 1]
            .probe
            .store(PENDING | u64::from(seq), Ordering::Release);
    }

    /// Thread 0 takes lane `t`'s probe, if it asked for one since.
    pub fn take_probe(&self, t: usize) -> Option<u32> {
        let w = self.lanes[t - 1].probe.swap(0, Ordering::Acquire);
        (w & PENDING != 0).then_some(w as u32)
    }

    /// Thread 0 hands the switch's answer about `seq`, which came `at`, to
    /// the lane whose share `seq` is (`seq` mod T; share 0's own are no
    /// lane's and are ignored). It replaces an answer not yet taken.
    pub fn answer(&self, seq: u32, answer: ProbeAnswer, at: Instant) {
        let t = seq as usize % (self.lanes.len() + 1);
        let Some(s) = t.checked_sub(1).and_then(|i| self.lanes.get(i)) else {
            return;
        };
        s.answer_ns.store(self.ns(at), Ordering::Relaxed);
        s.answer.store(
            PENDING | answer_kind(answer) << 32 | u64::from(seq),
            Ordering::Release,
        );
    }

    /// Lane `t` (≥ 1) takes the answer handed to it, if any: the seq, what
    /// it says and when it came. (A second answer written between the two
    /// loads lends the first its time: later by at most one turn of thread
    /// 0, and the lane then takes the second too.)
    pub fn take_answer(&self, t: usize) -> Option<(u32, ProbeAnswer, Instant)> {
        let s = &self.lanes[t - 1];
        let w = s.answer.swap(0, Ordering::Acquire);
        if w & PENDING == 0 {
            return None;
        }
        let at = self.instant(s.answer_ns.load(Ordering::Relaxed));
        Some((w as u32, answer_of((w >> 32) & 3)?, at))
    }

    /// When thread 0 wakes for the lanes not yet complete at `now`: at the
    /// earliest of their next timers, to send the probe its timeout may ask
    /// for. A timer already past means its lane has not yet taken its turn
    /// at it (it publishes a later one when it has): then a millisecond
    /// from now, not at once, so that thread 0 does not spin while that
    /// lane waits for a CPU.
    pub fn next_lane_wake(&self, now: Instant) -> Option<Instant> {
        self.lanes
            .iter()
            .filter(|s| !s.done.load(Ordering::Acquire))
            .map(|s| s.next_ns.load(Ordering::Relaxed))
            .filter(|&ns| ns != u64::MAX)
            .min()
            .map(|ns| self.instant(ns))
            .map(|t| if t > now { t } else { now + LANE_LATE_LOOK })
    }

    /// Whether every lane thread's share is complete.
    pub fn lanes_done(&self) -> bool {
        self.lanes.iter().all(|s| s.done.load(Ordering::Acquire))
    }

    /// The share that has waited longest for a RESULT, of `own` (thread
    /// 0's, `None` when complete) and the lanes': its oldest unanswered
    /// seq and its last progress. A lane that has not sent yet counts from
    /// the collective's start.
    pub fn watched(&self, own: Option<(u32, Instant)>) -> Option<(u32, Instant)> {
        let lanes = self.lanes.iter().filter_map(|s| {
            if s.done.load(Ordering::Acquire) {
                return None;
            }
            let ns = s.since_ns.load(Ordering::Relaxed);
            let since = match ns {
                u64::MAX => self.base,
                ns => self.instant(ns),
            };
            Some((s.oldest.load(Ordering::Relaxed), since))
        });
        own.into_iter().chain(lanes).min_by_key(|(_, since)| *since)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// The oldest of `seqs`, all of one collective starting at `first`.
pub fn oldest_seq(first: u32, seqs: impl Iterator<Item = u32>) -> u32 {
    seqs.min_by_key(|s| serial_offset(first, *s))
        .unwrap_or(first)
}

/// Receives from each of `fds` in turn until it is empty, handing every
/// datagram to `each` in the order it came; stops at the first datagram
/// `each` answers `Some` for (the rest of that batch is not handed on) and
/// returns that answer. Thread 0 and every lane thread take their turn's
/// datagrams through this, each with its own batch `rxb`. A batch that
/// comes back short found its socket drained: asking again would only find
/// it empty, so one `recvmmsg` per socket and turn is the rule when
/// nothing is waiting. A failed receive is `recvmmsg`'s [`SocketFailed`]
/// to `peer`.
pub fn drain<B, E: From<SocketFailed>>(
    rxb: &mut DatagramBatch,
    fds: &[RawFd],
    peer: SocketAddrV4,
    mut each: impl FnMut(&[u8]) -> Result<Option<B>, E>,
) -> Result<Option<B>, E> {
    for &fd in fds {
        loop {
            let n = rxb.recv(fd).map_err(failed("recvmmsg", peer))?;
            if n == 0 {
                break;
            }
            for i in 0..n {
                if let Some(b) = each(rxb.get(i))? {
                    return Ok(Some(b));
                }
            }
            if !rxb.filled() {
                break;
            }
        }
    }
    Ok(None)
}

/// Waits for a share's next turn once its sockets are drained: until one
/// of `fds` is readable or `until` (its next timer) has passed, taken as 1
/// to 50 ms (poll(2) counts milliseconds; the loops look at their stop and
/// the lanes' progress at least that often).
pub fn wait_turn(fds: &[RawFd], until: Duration) {
    wait_readable_any(
        fds,
        until.clamp(Duration::from_millis(1), Duration::from_millis(50)),
    );
}

/// Waits up to `timeout` (at most 1 s) for any of `fds` to be readable.
fn wait_readable_any(fds: &[RawFd], timeout: Duration) {
    let mut p = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 64];
    let n = fds.len().min(p.len());
    for (slot, fd) in p.iter_mut().zip(fds) {
        slot.fd = *fd;
    }
    let ms = timeout.as_millis().clamp(0, 1000) as i32;
    // SAFETY: `n` valid pollfds on the stack.
    unsafe {
        libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms);
    }
}

/// Sends the DATA `member`'s window and resend timers allow at `now` on
/// `fd`, batched in `txb` (flushed whenever full and at the end), with the
/// GSO burst limit following the share's resends. Thread 0 and every lane
/// thread send their share through this.
pub fn send_share(
    member: &mut Member,
    txb: &mut DatagramBatch,
    burst: &mut gso::BurstLimit,
    fd: RawFd,
    input: Input<'_>,
    now: Instant,
) -> std::io::Result<()> {
    let c = member.collective();
    txb.set_max_segments(burst.update(c.stats.resent, c.stats.results));
    loop {
        if txb.is_full() {
            txb.send_all(fd)?;
        }
        let slot = txb.next_slot().expect("flushed when full");
        let Some(f) = member.poll_data(now, &input, slot) else {
            break;
        };
        txb.commit_seq(f.len, f.seq);
    }
    if !txb.is_empty() {
        txb.send_all(fd)?;
    }
    Ok(())
}

/// What a lane thread needs besides its lane.
#[derive(Clone, Copy)]
pub struct LaneJob<'a> {
    pub switch: SocketAddrV4,
    pub dtype: Dtype,
    pub input: Input<'a>,
    pub out: Option<Output<'a>>,
    pub progress: &'a Progress,
}

/// Lane thread `t` (≥ 1): carries its share of the collective its member
/// began, reading `fds` (its lanes' sockets) and sending on the first,
/// until the share is complete or thread 0 says stop. Its only errors are
/// its sockets'.
pub fn lane_loop(
    t: usize,
    lane: &mut Lane,
    fds: &[RawFd],
    job: LaneJob<'_>,
) -> Result<(), SocketFailed> {
    // Every thread reads at least its first lane's socket (T ≤ the lanes
    // open); without one it has nothing to carry.
    let Some(&send_fd) = fds.first() else {
        return Ok(());
    };
    loop {
        if job.progress.stopped() {
            return Ok(());
        }
        // A lane copy's session takes RESULTs only; anything else here is
        // dropped by it. Nothing stops a lane's drain early.
        drain(&mut lane.rxb, fds, job.switch, |d| {
            if let Some(ev) = lane.member.handle(d, Instant::now()) {
                write_result(&ev, d, job.dtype, job.input, job.out);
            }
            Ok::<_, SocketFailed>(None::<std::convert::Infallible>)
        })?;
        if lane.member.is_complete() {
            job.progress.publish(t, &lane.member);
            return Ok(());
        }
        // The answer to the share's probe, before the send that may time
        // its oldest chunk out again (the hold decides that send).
        if let Some((seq, answer, at)) = job.progress.take_answer(t) {
            lane.member.on_probe_answer(seq, answer, at);
        }
        send_share(
            &mut lane.member,
            &mut lane.txb,
            &mut lane.burst,
            send_fd,
            job.input,
            Instant::now(),
        )
        .map_err(failed("sendmmsg", job.switch))?;
        // Thread 0 sends the share's probe, as it sends its own.
        if let Some(seq) = lane.member.take_probe() {
            job.progress.ask(t, seq);
        }
        job.progress.publish(t, &lane.member);
        // Every socket is drained: sleep until a datagram or the next timer
        // (a millisecond while an answer is due: nothing wakes this thread
        // when thread 0 hands it one).
        let now = Instant::now();
        let until = match lane.member.collective().next_timeout() {
            _ if lane.member.awaits_probe_answer(now) => Duration::from_millis(1),
            Some(d) => d.saturating_duration_since(now),
            None => Duration::from_millis(50),
        };
        wait_turn(fds, until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_threads_wants_a_cpu_and_enough_chunks_per_thread() {
        // A 64 MiB f32 tensor at MTU 9000: about 7 600 chunks.
        assert_eq!(auto_threads(7600, 16, 1), 4, "capped at MAX_AUTO_THREADS");
        assert_eq!(auto_threads(7600, 16, 8), 2, "8 ranks share 16 CPUs");
        assert_eq!(auto_threads(7600, 2, 4), 1, "4 ranks on 2 CPUs");
        assert_eq!(auto_threads(7600, 3, 1), 2, "a power of two");
        assert_eq!(auto_threads(300, 16, 1), 2, "300 chunks: 2 of 128");
        assert_eq!(auto_threads(100, 16, 1), 1, "too small to split");
        assert_eq!(auto_threads(0, 0, 0), 1);
    }

    #[test]
    fn pow2_floor_rounds_down() {
        let got: Vec<usize> = [0, 1, 2, 3, 4, 5, 7, 8, 63, 64].map(pow2_floor).into();
        assert_eq!(got, [1, 1, 2, 2, 4, 4, 4, 8, 32, 64]);
    }

    #[test]
    fn the_oldest_seq_is_in_serial_order_across_a_wrap() {
        let first = u32::MAX - 2;
        assert_eq!(oldest_seq(first, [1, u32::MAX, 4].into_iter()), u32::MAX);
        assert_eq!(oldest_seq(7, std::iter::empty()), 7);
    }

    /// Two connected loopback pairs: `n[k]` datagrams (each its index and
    /// socket) sent to receiver k; the receivers' descriptors.
    fn waiting(n: [u8; 2]) -> (Vec<std::net::UdpSocket>, Vec<RawFd>) {
        let mut socks = Vec::new();
        for (k, &count) in n.iter().enumerate() {
            let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            a.connect(b.local_addr().unwrap()).unwrap();
            b.connect(a.local_addr().unwrap()).unwrap();
            b.set_nonblocking(true).unwrap();
            for i in 0..count {
                a.send(&[k as u8, i]).unwrap();
            }
            socks.push(b);
        }
        // Loopback delivers at send; wait anyway until each has its first.
        for s in socks.iter().zip(n).filter(|(_, c)| *c > 0).map(|(s, _)| s) {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 2];
            let _ = s.peek(&mut b);
            s.set_nonblocking(true).unwrap();
        }
        let fds = socks.iter().map(|s| s.as_raw_fd()).collect();
        (socks, fds)
    }

    fn peer() -> SocketAddrV4 {
        SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9)
    }

    /// Every datagram of every socket, in order, through full batches
    /// (10 datagrams in batches of 4) and a short one.
    #[test]
    fn drain_hands_on_every_datagram_in_order() {
        let (_socks, fds) = waiting([10, 3]);
        let mut rxb = DatagramBatch::new(4, 64);
        let mut got = Vec::new();
        let r = drain(&mut rxb, &fds, peer(), |d| {
            got.push((d[0], d[1]));
            Ok::<_, SocketFailed>(None::<()>)
        });
        assert!(matches!(r, Ok(None)));
        let want: Vec<_> = (0..10)
            .map(|i| (0, i))
            .chain((0..3).map(|i| (1, i)))
            .collect();
        assert_eq!(got, want);
    }

    /// The handler's `Some` ends the drain at that datagram: the rest of its
    /// batch is not handed on, the later sockets are not read.
    #[test]
    fn drain_stops_where_the_handler_says() {
        let (_socks, fds) = waiting([10, 3]);
        let mut rxb = DatagramBatch::new(4, 64);
        let mut got = Vec::new();
        let r = drain(&mut rxb, &fds, peer(), |d| {
            got.push(d[1]);
            Ok::<_, SocketFailed>((d[1] == 5).then_some("lost"))
        });
        assert!(matches!(r, Ok(Some("lost"))));
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        // The next drain starts at the next batch (datagrams 8 and 9) and
        // goes on to the second socket.
        got.clear();
        let r = drain(&mut rxb, &fds, peer(), |d| {
            got.push(d[1]);
            Ok::<_, SocketFailed>(None::<()>)
        });
        assert!(matches!(r, Ok(None)));
        assert_eq!(got, [8, 9, 0, 1, 2]);
    }

    /// A failed receive is recvmmsg's, to the peer named; a handler's error
    /// is returned as it is.
    #[test]
    fn drain_errors_say_what_failed() {
        let mut rxb = DatagramBatch::new(4, 64);
        let r = drain(&mut rxb, &[-1], peer(), |_| {
            Ok::<_, SocketFailed>(None::<()>)
        });
        let e = r.unwrap_err();
        assert_eq!((e.call, e.peer), ("recvmmsg", peer()));
        assert_eq!(e.source.raw_os_error(), Some(libc::EBADF));
        let (_socks, fds) = waiting([2, 0]);
        let r = drain(
            &mut rxb,
            &fds,
            peer(),
            |_| -> Result<Option<()>, SocketFailed> {
                Err(SocketFailed {
                    call: "handler",
                    peer: peer(),
                    source: std::io::ErrorKind::Other.into(),
                })
            },
        );
        assert_eq!(r.unwrap_err().call, "handler");
    }

    #[test]
    fn progress_watches_the_share_waiting_longest() {
        let p = Progress::new(3);
        let now = Instant::now();
        assert!(!p.lanes_done());
        // Lanes that have not published count from the start: older than
        // thread 0's progress now.
        assert_eq!(p.watched(Some((10, now))).map(|w| w.0), Some(0));
        p.lanes[0].oldest.store(11, Ordering::Relaxed);
        p.lanes[0].since_ns.store(5, Ordering::Relaxed);
        p.lanes[1].done.store(true, Ordering::Release);
        assert_eq!(p.watched(None).map(|w| w.0), Some(11));
        p.lanes[0].done.store(true, Ordering::Release);
        assert!(p.lanes_done());
        assert_eq!(p.watched(None), None);
        assert!(!p.stopped());
        p.stop();
        assert!(p.stopped());
    }

    /// A lane's probe reaches thread 0 once; an answer reaches the lane of
    /// its seq's share once, with its kind and time; share 0's are no
    /// lane's. The lanes' next timer is the earliest of those not done.
    #[test]
    fn probes_and_answers_cross_between_thread_0_and_the_lanes() {
        let p = Progress::new(4);
        assert_eq!(p.take_probe(2), None);
        p.ask(2, 0xffff_fffe);
        p.ask(3, 7);
        assert_eq!(p.take_probe(2), Some(0xffff_fffe));
        assert_eq!(p.take_probe(2), None, "taken once");
        assert_eq!(p.take_probe(3), Some(7));
        let at = p.base + Duration::from_millis(3);
        p.answer(4, ProbeAnswer::OthersMissing, at);
        assert!(
            (1..4).all(|t| p.take_answer(t).is_none()),
            "seq 4 is share 0's"
        );
        for (seq, answer) in [
            (9, ProbeAnswer::OthersMissing),
            (10, ProbeAnswer::OursMissing),
            (u32::MAX, ProbeAnswer::Complete),
        ] {
            p.answer(seq, answer, at);
            let t = seq as usize % 4;
            assert_eq!(p.take_answer(t), Some((seq, answer, at)));
            assert_eq!(p.take_answer(t), None);
        }
        // A newer answer replaces one not taken.
        p.answer(5, ProbeAnswer::OthersMissing, at);
        p.answer(9, ProbeAnswer::OursMissing, at);
        assert_eq!(p.take_answer(1), Some((9, ProbeAnswer::OursMissing, at)));
        let now = p.base;
        assert_eq!(p.next_lane_wake(now), None);
        p.lanes[0].next_ns.store(9_000, Ordering::Relaxed);
        p.lanes[2].next_ns.store(5_000, Ordering::Relaxed);
        assert_eq!(
            p.next_lane_wake(now),
            Some(p.base + Duration::from_micros(5))
        );
        p.lanes[2].done.store(true, Ordering::Release);
        assert_eq!(
            p.next_lane_wake(now),
            Some(p.base + Duration::from_micros(9))
        );
        // Past (the lane has not yet taken its turn): a millisecond on, not
        // at once.
        let later = p.base + Duration::from_micros(10);
        assert_eq!(p.next_lane_wake(later), Some(later + LANE_LATE_LOOK));
    }
}
