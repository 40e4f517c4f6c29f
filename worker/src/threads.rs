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
//! [`lane_loop`] and the automatic thread count ([`auto_threads`]).
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
//!   progress once per turn of its loop (three relaxed atomics).

use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proto::member::{Event as MemberEvent, Member, ResultOutcome};
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
/// collective last made progress, and whether its share is complete.
#[derive(Default)]
struct LaneState {
    oldest: AtomicU32,
    /// Nanoseconds after [`Progress`]'s base; `u64::MAX`: not yet.
    since_ns: AtomicU64,
    done: AtomicBool,
}

/// What lane threads 1..T tell thread 0 during one collective, and thread
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
                    ..LaneState::default()
                })
                .collect(),
        }
    }

    /// Lane `t` (≥ 1) publishes where its member stands.
    fn publish(&self, t: usize, m: &Member) {
        let s = &self.lanes[t - 1];
        let c = m.collective();
        s.oldest.store(c.oldest_unacked_seq(), Ordering::Relaxed);
        let ns = c.last_progress().map_or(u64::MAX, |p| {
            p.saturating_duration_since(self.base).as_nanos() as u64
        });
        s.since_ns.store(ns, Ordering::Relaxed);
        s.done.store(c.is_complete(), Ordering::Release);
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
                ns => self.base + Duration::from_nanos(ns),
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
        for &fd in fds {
            loop {
                let n = lane.rxb.recv(fd).map_err(failed("recvmmsg", job.switch))?;
                if n == 0 {
                    break;
                }
                for i in 0..n {
                    let d = lane.rxb.get(i);
                    // A lane copy's session takes RESULTs only; anything
                    // else here is dropped by it.
                    if let Some(ev) = lane.member.handle(d, Instant::now()) {
                        write_result(&ev, d, job.dtype, job.input, job.out);
                    }
                }
                if !lane.rxb.filled() {
                    break;
                }
            }
        }
        if lane.member.is_complete() {
            job.progress.publish(t, &lane.member);
            return Ok(());
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
        job.progress.publish(t, &lane.member);
        // Every socket is drained: sleep until a datagram or the next timer.
        let now = Instant::now();
        let until = lane
            .member
            .collective()
            .next_timeout()
            .map_or(Duration::from_millis(50), |d| {
                d.saturating_duration_since(now)
            });
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
}
