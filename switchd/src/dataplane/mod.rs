//! The dataplane: receive aggregation frames from the AF_XDP sockets, feed
//! them to the job table, and write the replies the table queued to the
//! transmit rings of the ports the workers are behind.
//!
//! Owns: [`Shared`] (the job table, which thread owns which socket, the
//! per-thread outboxes and published counters) and [`DataplaneThread`]
//! (one per pinned core: the receive and transmit halves of the sockets it
//! owns, its own counters). Its parts: [`rx`] (one frame in: L2–L4 checks,
//! then proto's one entry point, [`proto::switch::entry::Switch`]), [`tx`]
//! (the shell's [`proto::switch::entry::Transmit`]: replies to a transmit
//! ring, or to the outbox of the thread that owns the member's socket),
//! [`counters`] (what
//! the threads publish: [`DataplaneCounters`], [`RingStats`]) and
//! [`heartbeat`] (each thread's progress, for the watchdog).
//!
//! Multi-core (docs/PLATFORM.md, "Multi-core"): a socket belongs to exactly one
//! thread, and contributions to one slot arrive on different sockets, so
//! the slot state is shared. A DATA from a bound member of an active job
//! goes through the lock-free data path ([`proto::switch::DataPath`]:
//! each job's slot engine is fed by any thread at once, with per-slot
//! synchronisation only); everything else (handshakes, heartbeats, strangers,
//! leaf and `auth = "mac"` jobs) goes to the job table under its mutex,
//! taken at most once per receive batch (up to [`RX_BATCH`] frames) and
//! only if a frame of the batch needs it ([`proto::switch::entry::Batch`]).
//! Which replies a frame causes, and their fan-out, proto decides; a reply
//! for a member whose socket another thread owns goes to that thread's
//! lock-free outbox (crossbeam `ArrayQueue`, fixed capacity) as a small
//! [`Handoff`], which that thread gives back to the switch: the
//! table's `Reply` value, or, for a completed seq, one hand-off per thread
//! that owns some member's socket, which sends the RESULT to each member
//! it owns. That thread encodes them from the shadow copy, which stays
//! valid until every rank has moved past the seq. A thread that hands work to a
//! sleeping thread wakes it through that thread's eventfd ([`crate::wake`]).
//! docs/BENCHMARKS.md has the measurements behind these choices.
//!
//! Invariants (the hot path): no allocation per packet (frames are parsed in
//! place, replies written straight into UMEM frames), ring operations in
//! batches, transmit rings flushed once per round, no syscall per packet: a
//! thread sleeps in one `poll(2)` over its sockets only after many empty
//! rounds, and times only those sleeps (its busy share, [`busy`]). No
//! control-plane work: admin requests, metrics, the stats file, BPF map
//! reads and the log of the table's events run on the control thread
//! ([`crate::control`]). Counters are per thread, plain integers,
//! published under a per-thread lock at most every few milliseconds. For
//! the watchdog ([`crate::watchdog`]) a thread stores its iteration count
//! and whether it has work in hand once per iteration and before taking a
//! batch (Relaxed stores, never per packet).
//! Nothing a sender can put in a frame makes this code panic.
//!
//! Echo mode (`[switch] mode = "echo"`, a benchmark baseline) replaces the
//! round by [`crate::echo`]: no table, no outbox, every frame straight back.

pub mod busy;
pub mod counters;
pub mod fault;
pub mod heartbeat;
pub mod rx;
pub mod tx;
pub mod uplink;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use proto::switch::entry::{Handoff, Switch};
use proto::switch::JobTable;

use crate::wake::ThreadWaker;
use crate::xdp::{XskRx, XskTx};
use heartbeat::Heartbeat;

pub use counters::{DataplaneCounters, DataplaneSnapshot, RingStats, ThreadCounters};

/// Frames taken from one receive ring per round.
pub const RX_BATCH: u32 = 64;
/// Empty rounds before a thread sleeps in poll(2).
const SPIN_ROUNDS: u32 = 64;
/// Longest sleep in poll(2), so that stop requests are seen.
const IDLE_WAIT_MS: i32 = 10;
/// Replies waiting for another thread's transmit ring.
const OUTBOX_CAPACITY: usize = 16 * 1024;
/// How often a thread publishes its counters.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);
/// How often a thread reads its sockets' kernel statistics (a getsockopt
/// each).
const KERNEL_STATS_EVERY: Duration = Duration::from_secs(1);

/// How often thread 0 runs the table's timers (a leaf's resends to spines).
const TIMER_EVERY: Duration = Duration::from_millis(1);
/// How often thread 0 runs them on a switch without an uplink, where only
/// provisioned jobs' idle leases (whole seconds) are due.
const LEASE_TIMER_EVERY: Duration = Duration::from_millis(100);
/// Room for the largest datagram on the uplink.
const UPLINK_DATAGRAM_MAX: usize = 9216;

/// One receive half with the port and queue it serves.
pub struct RxSocket {
    pub port_idx: u32,
    pub queue: u32,
    pub rx: XskRx,
}

/// One socket (both halves) before it is given to a thread.
pub struct Socket {
    pub port_idx: u32,
    pub queue: u32,
    pub rx: XskRx,
    pub tx: XskTx,
}

/// A thread's transmit halves, indexed `[port][queue]`; `None` where
/// another thread owns the socket.
pub type TxSockets = Vec<Vec<Option<XskTx>>>;

#[derive(Default)]
struct Published {
    counters: DataplaneCounters,
    rings: Vec<RingStats>,
    busy_share: f64,
}

/// State every dataplane thread (and the control thread) shares.
pub struct Shared {
    /// The job table and the lock-free data path over its jobs.
    switch: Switch,
    agg_port: u16,
    /// Ports agg_port..agg_port + seq_lanes - 1 take aggregation traffic;
    /// above 1, RESULTs leave from the completing thread (`tx`'s docs).
    seq_lanes: u16,
    /// Ring occupancy (entries) above which taken contributions count as
    /// congestion-marked; u32::MAX turns it off.
    ecn_ring_entries: u32,
    started: Instant,
    /// Thread that owns socket `[port][queue]`.
    owner: Vec<Vec<usize>>,
    outboxes: Vec<ArrayQueue<Handoff>>,
    /// Wakes thread `i` from its poll(2) when its outbox gets work.
    wakers: Vec<ThreadWaker>,
    published: Vec<Mutex<Published>>,
    /// Echo mode (a benchmark baseline, [`crate::echo`]): no aggregation.
    echo: bool,
    /// A leaf's socket towards its spines (`[switch] uplink`): any thread
    /// sends on it, thread 0 receives.
    uplink: Option<std::net::UdpSocket>,
    /// Thread `i`'s progress, and the stalls the watchdog found in it (not
    /// in its counters: the stuck thread cannot publish), for the watchdog
    /// ([`crate::watchdog`]).
    heartbeats: Vec<Heartbeat>,
    /// The switch's own addresses: a frame that claims one as its source
    /// is dropped at ingress ([`rx`]).
    own: OwnAddresses,
}

/// The switch's own IPv4 and MAC addresses, for the ingress check: a few
/// IPs (scanned) and one MAC per interface (sorted, searched), so the
/// check is a handful of compares per frame.
#[derive(Debug, Clone, Default)]
pub struct OwnAddresses {
    ips: Vec<[u8; 4]>,
    macs: Vec<[u8; 6]>,
}

impl OwnAddresses {
    pub fn new(
        ips: impl IntoIterator<Item = [u8; 4]>,
        macs: impl IntoIterator<Item = [u8; 6]>,
    ) -> Self {
        let mut ips: Vec<[u8; 4]> = ips.into_iter().collect();
        let mut macs: Vec<[u8; 6]> = macs.into_iter().collect();
        ips.sort_unstable();
        ips.dedup();
        macs.sort_unstable();
        macs.dedup();
        OwnAddresses { ips, macs }
    }

    /// Whether `ip` or `mac` is one of the switch's own.
    pub fn claims(&self, ip: [u8; 4], mac: [u8; 6]) -> bool {
        self.ips.contains(&ip) || self.macs.binary_search(&mac).is_ok()
    }
}

/// How to build a dataplane.
pub struct DataplaneConfig {
    pub agg_port: u16,
    /// Seq lanes (docs/PROTOCOL.md, "Seq lanes"): DATA also comes to the
    /// next seq_lanes - 1 ports.
    pub seq_lanes: u16,
    /// Fraction of a ring's size above which RESULTs get ECE (≥ 1: never).
    pub ecn_ring_fraction: f64,
    pub ring_size: u32,
    pub threads: usize,
    /// Echo every steered frame instead of aggregating ([`crate::echo`]).
    pub echo: bool,
    /// A leaf's uplink socket, bound and nonblocking.
    pub uplink: Option<std::net::UdpSocket>,
    /// The switch's own addresses (frames claiming them are dropped).
    pub own: OwnAddresses,
}

/// The thread that serves socket `k` of `n` (port by port, queue by queue;
/// `queues` per port) among `threads`. With no more threads than queues,
/// round-robin: thread t serves queue t (mod threads) of every port, which
/// the queues' interrupt affinity can follow. With more threads than
/// queues (a port per worker, as on a testbed), in contiguous blocks: each
/// thread serves neighbouring ports, so that a job whose ranks sit on
/// consecutive ports passes its rank-order sum between threads as few
/// times as there are threads, not once per rank (docs/BENCHMARKS.md,
/// "Scaling over cores").
pub fn deal(k: usize, n: usize, threads: usize, queues: usize) -> usize {
    if threads <= queues || n == 0 {
        k % threads.max(1)
    } else {
        k * threads / n
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread stops switchd (main re-raises it); the table it
    // held is still consistent between two messages, so keep serving reads.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds the shared state and one [`DataplaneThread`] per thread; sockets
/// are dealt as [`deal`] says, in the order given. Fails only if a thread's
/// wake-up eventfd cannot be made.
pub fn build(
    table: JobTable,
    sockets: Vec<Socket>,
    cfg: DataplaneConfig,
) -> std::io::Result<(Arc<Shared>, Vec<DataplaneThread>)> {
    let threads = cfg.threads.max(1);
    let wakers = (0..threads)
        .map(|_| ThreadWaker::new())
        .collect::<std::io::Result<Vec<_>>>()?;
    let ports = sockets.iter().map(|s| s.port_idx as usize + 1).max();
    let queues = sockets.iter().map(|s| s.queue as usize + 1).max();
    let (ports, queues) = (ports.unwrap_or(0), queues.unwrap_or(0));
    let mut owner = vec![vec![usize::MAX; queues]; ports];
    let mut rxs: Vec<Vec<RxSocket>> = (0..threads).map(|_| Vec::new()).collect();
    let mut txs: Vec<TxSockets> = (0..threads)
        .map(|_| {
            (0..ports)
                .map(|_| (0..queues).map(|_| None).collect())
                .collect()
        })
        .collect();
    let n = sockets.len();
    for (k, s) in sockets.into_iter().enumerate() {
        let t = deal(k, n, threads, queues);
        let (p, q) = (s.port_idx as usize, s.queue as usize);
        owner[p][q] = t;
        txs[t][p][q] = Some(s.tx);
        rxs[t].push(RxSocket {
            port_idx: s.port_idx,
            queue: s.queue,
            rx: s.rx,
        });
    }
    let ecn_ring_entries = if cfg.ecn_ring_fraction >= 1.0 {
        u32::MAX
    } else {
        ((cfg.ring_size as f64 * cfg.ecn_ring_fraction) as u32).max(1)
    };
    let shared = Arc::new(Shared {
        switch: Switch::new(table),
        agg_port: cfg.agg_port,
        seq_lanes: cfg.seq_lanes.max(1),
        ecn_ring_entries,
        started: Instant::now(),
        owner,
        outboxes: (0..threads)
            .map(|_| ArrayQueue::new(OUTBOX_CAPACITY))
            .collect(),
        wakers,
        published: (0..threads).map(|_| Mutex::default()).collect(),
        echo: cfg.echo,
        uplink: cfg.uplink,
        heartbeats: (0..threads).map(|_| Heartbeat::default()).collect(),
        own: cfg.own,
    });
    let lanes = rxs
        .into_iter()
        .zip(txs)
        .enumerate()
        .map(|(idx, (rxs, txs))| DataplaneThread {
            idx,
            shared: shared.clone(),
            rxs,
            txs,
            counters: DataplaneCounters::default(),
            last_publish: Instant::now(),
            kernel_stats: Vec::new(),
            last_kernel_stats: None,
            scratch: vec![0u8; UPLINK_DATAGRAM_MAX],
            last_timers: Instant::now(),
            #[cfg(feature = "fault-injection")]
            fault: fault::Plan::for_thread(idx, |k| std::env::var(k).ok()),
        })
        .collect();
    Ok((shared, lanes))
}

impl Shared {
    /// The job table, locked (the control thread's reads and admin changes;
    /// keep it short: the dataplane waits meanwhile).
    pub fn table(&self) -> MutexGuard<'_, JobTable> {
        self.switch.table()
    }

    /// Dataplane counters as the threads last published them: per thread
    /// (with the sockets it serves) and summed, and the ring gauges of
    /// every socket.
    pub fn dataplane_counters(&self) -> DataplaneSnapshot {
        let mut snap = DataplaneSnapshot::default();
        for (i, (p, beat)) in self.published.iter().zip(&self.heartbeats).enumerate() {
            let p = lock(p);
            let mut counters = p.counters.clone();
            counters.dataplane_stalls = beat.stalls();
            snap.total.add(&counters);
            snap.rings.extend(p.rings.iter().cloned());
            snap.threads.push(ThreadCounters {
                counters,
                sockets: self.sockets_of(i),
                busy_share: p.busy_share,
            });
        }
        snap.rings.sort_by_key(|r| (r.port_idx, r.queue));
        snap
    }

    /// The sockets thread `t` owns, as (port index, queue).
    fn sockets_of(&self, t: usize) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for (p, queues) in self.owner.iter().enumerate() {
            for (q, owner) in queues.iter().enumerate() {
                if *owner == t {
                    v.push((p as u32, q as u32));
                }
            }
        }
        v
    }

    /// Every dataplane thread's heartbeat, in thread order.
    pub fn heartbeats(&self) -> &[Heartbeat] {
        &self.heartbeats
    }

    /// The watchdog found thread `thread` stuck.
    pub fn count_stall(&self, thread: usize) {
        if let Some(h) = self.heartbeats.get(thread) {
            h.count_stall();
        }
    }

    /// Whether the watchdog found a thread stuck (switchd must then exit
    /// through [`crate::watchdog::exit_for_restart`]).
    pub fn stalled(&self) -> bool {
        self.heartbeats.iter().any(|h| h.stalls() > 0)
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// One dataplane thread: the sockets it owns and its counters.
pub struct DataplaneThread {
    idx: usize,
    shared: Arc<Shared>,
    rxs: Vec<RxSocket>,
    txs: TxSockets,
    counters: DataplaneCounters,
    last_publish: Instant,
    /// Each socket's kernel statistics, as last read, and when.
    kernel_stats: Vec<crate::xdp::XskStats>,
    last_kernel_stats: Option<Instant>,
    /// A datagram to or from the uplink (allocated once).
    scratch: Vec<u8>,
    last_timers: Instant,
    /// Test-only: when this thread stops making progress on purpose.
    #[cfg(feature = "fault-injection")]
    fault: fault::Plan,
}

impl DataplaneThread {
    pub fn index(&self) -> usize {
        self.idx
    }

    /// Sockets this thread serves, as (port, queue).
    pub fn sockets(&self) -> Vec<(u32, u32)> {
        self.rxs.iter().map(|s| (s.port_idx, s.queue)).collect()
    }

    /// Runs until `stop` is set: rounds over the sockets, and a sleep in
    /// poll(2) after [`SPIN_ROUNDS`] empty ones.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut fds = self.poll_fds();
        let mut idle = 0u32;
        let mut iterations = 0u64;
        let mut busy = busy::BusyShare::new(Instant::now());
        let shared = self.shared.clone();
        let heartbeat = &shared.heartbeats[self.idx];
        while !stop.load(Ordering::Relaxed) {
            let got = if self.shared.echo {
                self.echo_once()
            } else {
                self.poll_once()
            };
            // The watchdog's view: one beat per iteration, whether it slept
            // in poll(2) or not (the sleep is bounded by IDLE_WAIT_MS).
            iterations += 1;
            heartbeat.beat(iterations, got > 0);
            idle = if got == 0 { idle + 1 } else { 0 };
            if idle >= SPIN_ROUNDS {
                let asleep = Instant::now();
                self.sleep(&mut fds);
                busy.slept(asleep.elapsed());
            }
            if self.last_publish.elapsed() >= PUBLISH_EVERY {
                self.publish(busy.share(Instant::now()));
            }
        }
        tx::drain_outbox(self, Instant::now());
        self.flush_all();
        self.publish(busy.share(Instant::now()));
        // Returned: idle for good, never a stall.
        heartbeat.beat(iterations + 1, false);
    }

    /// One round over this thread's sockets; returns the frames received.
    pub fn poll_once(&mut self) -> u32 {
        let shared = self.shared.clone();
        let heartbeat = &shared.heartbeats[self.idx];
        if !shared.outboxes[self.idx].is_empty() {
            heartbeat.taking_work();
        }
        let now = Instant::now();
        // Each batch moves the priority board's clock: one relaxed load (a
        // store at most every 100 µs) per batch, never per frame.
        tx::drain_outbox(self, now);
        let mut got = 0;
        if self.idx == 0 {
            if shared.uplink.is_some() {
                got += self.uplink_round(now);
            } else {
                self.timers_round(now);
            }
        }
        for i in 0..self.rxs.len() {
            let (p, q) = (self.rxs[i].port_idx, self.rxs[i].queue);
            let waiting = self.rxs[i].rx.rx_ring_occupancy();
            if waiting == 0 {
                continue;
            }
            let congested = self.congested(p, q, waiting);
            heartbeat.taking_work();
            // The table's lock only if a frame of the batch needs it.
            let mut batch = shared.switch.batch(self.idx, now);
            let mut out = tx::Out::new(&shared, &mut self.txs, &mut self.counters);
            #[cfg(feature = "fault-injection")]
            let fault = &self.fault;
            got += self.rxs[i].rx.recv_batch(RX_BATCH, |frame| {
                rx::handle_frame(frame, (p, q), congested, &mut batch, &mut out);
                #[cfg(feature = "fault-injection")]
                if fault.stops_holding_table(out.counters.rx_frames) {
                    batch.table();
                }
                #[cfg(feature = "fault-injection")]
                fault.after_frame(out.counters.rx_frames, true);
            });
        }
        #[cfg(feature = "fault-injection")]
        self.fault.after_frame(self.counters.rx_frames, false);
        self.flush_all();
        got
    }

    /// Thread 0 on a switch without an uplink: the table's timers every
    /// [`LEASE_TIMER_EVERY`], so that a provisioned job whose ranks went
    /// silent ends with its lease (docs/PROTOCOL.md, "Leases") even when no
    /// frame arrives (the sleep in poll(2) is bounded by [`IDLE_WAIT_MS`]).
    fn timers_round(&mut self, now: Instant) {
        if now.duration_since(self.last_timers) < LEASE_TIMER_EVERY {
            return;
        }
        self.last_timers = now;
        let shared = self.shared.clone();
        let mut batch = shared.switch.batch(self.idx, now);
        let mut out = tx::Out::new(&shared, &mut self.txs, &mut self.counters);
        batch.on_timeout(&mut out);
    }

    /// Thread 0 on a leaf: datagrams from the spines into the table, and
    /// the table's timers (resends up) every [`TIMER_EVERY`].
    fn uplink_round(&mut self, now: Instant) -> u32 {
        let shared = self.shared.clone();
        let Some(sock) = shared.uplink.as_ref() else {
            return 0;
        };
        let timers_due = now.duration_since(self.last_timers) >= TIMER_EVERY;
        // The table is locked only when a datagram came or timers are due.
        let mut first = uplink::recv(sock, &mut self.scratch);
        if first.is_none() && !timers_due {
            return 0;
        }
        if first.is_some() {
            shared.heartbeats[self.idx].taking_work();
        }
        let mut batch = shared.switch.batch(self.idx, now);
        let mut out = tx::Out::new(&shared, &mut self.txs, &mut self.counters);
        let mut got = 0;
        while let Some((n, from, ce)) = first.take() {
            got += 1;
            out.counters.uplink_received += 1;
            if let std::net::SocketAddr::V4(from) = from {
                let from = proto::switch::Endpoint {
                    source: proto::switch::Source {
                        mac: [0; 6],
                        ip: from.ip().octets(),
                        port: from.port(),
                    },
                    port_idx: proto::switch::UPSTREAM,
                    ..Default::default()
                };
                // A spine's datagram: the table's (the data path hands it
                // back).
                batch.on_datagram(&self.scratch[..n], from, ce, &mut out);
            }
            if got < RX_BATCH {
                first = uplink::recv(sock, &mut self.scratch);
            }
        }
        if timers_due {
            self.last_timers = now;
            batch.on_timeout(&mut out);
        }
        got
    }

    /// Congestion of the switch's own queues (docs/PROTOCOL.md): frames waiting
    /// in this receive ring, or replies waiting to go out on this port, above
    /// the threshold. Loads only, no syscall.
    fn congested(&self, port: u32, queue: u32, waiting: u32) -> bool {
        let limit = self.shared.ecn_ring_entries;
        limit != u32::MAX
            && (waiting > limit
                || tx::socket(&self.txs, port, queue)
                    .is_some_and(|t| t.tx_ring_occupancy() > limit))
    }

    fn flush_all(&mut self) {
        for port in &mut self.txs {
            for tx in port.iter_mut().flatten() {
                tx.flush();
            }
        }
    }

    /// Echo mode's round: every socket's frames back out of its own
    /// transmit ring, swapped ([`crate::echo`]); returns the frames received.
    fn echo_once(&mut self) -> u32 {
        let mut got = 0;
        let heartbeat = &self.shared.heartbeats[self.idx];
        for s in &mut self.rxs {
            let Some(tx) = tx::socket_mut(&mut self.txs, s.port_idx, s.queue) else {
                continue;
            };
            if s.rx.rx_ring_occupancy() > 0 {
                heartbeat.taking_work();
            }
            let o = crate::echo::echo_batch(&mut s.rx, tx, RX_BATCH);
            got += o.received;
            let c = &mut self.counters;
            c.rx_frames += u64::from(o.received);
            c.echoed += u64::from(o.echoed);
            c.tx_frames += u64::from(o.echoed);
            c.tx_ring_full += u64::from(o.tx_full);
            c.bad_frame += u64::from(o.malformed);
            // Also when nothing came: copy mode may have left frames in
            // the ring (at most 32 leave per kick).
            tx.flush();
        }
        got
    }

    fn poll_fds(&self) -> Vec<libc::pollfd> {
        let fd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds: Vec<libc::pollfd> = self.rxs.iter().map(|s| fd(s.rx.fd())).collect();
        if self.idx == 0 {
            if let Some(u) = &self.shared.uplink {
                fds.push(fd(std::os::fd::AsRawFd::as_raw_fd(u)));
            }
        }
        // Last: the eventfd other threads write when they hand us work.
        fds.push(fd(self.shared.wakers[self.idx].fd()));
        fds
    }

    /// Sleeps in poll(2) until a frame or a hand-off comes (or a short
    /// timeout). Replies from other threads must not wait for our sleep:
    /// announce it, look at the outbox once more, and let a thread that
    /// hands us work later write the eventfd ([`crate::wake`]).
    fn sleep(&mut self, fds: &mut [libc::pollfd]) {
        let waker = &self.shared.wakers[self.idx];
        waker.prepare_sleep();
        let mut handed_work = false;
        if self.shared.outboxes[self.idx].is_empty() {
            // SAFETY: `fds` is a live array of fds.len() pollfds.
            let n =
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, IDLE_WAIT_MS) };
            handed_work = n > 0 && fds.last().is_some_and(|p| p.revents & libc::POLLIN != 0);
        }
        waker.woke(handed_work);
    }

    /// Publishes the counters, the ring gauges and `busy_share` for the
    /// control thread.
    fn publish(&mut self, busy_share: f64) {
        let now = Instant::now();
        // The sockets count these themselves; this thread owns the sums.
        let (gathered, too_many) = self.rxs.iter().fold((0, 0), |(g, d), s| {
            let (sg, sd) = s.rx.gather_stats();
            (g + sg, d + sd)
        });
        self.counters.rx_multi_buffer = gathered;
        self.counters.rx_too_many_buffers = too_many;
        self.counters.tx_multi_buffer = self
            .txs
            .iter()
            .flatten()
            .flatten()
            .map(|t| t.multi_buffer_sent())
            .sum();
        if self
            .last_kernel_stats
            .is_none_or(|t| now.duration_since(t) >= KERNEL_STATS_EVERY)
        {
            self.kernel_stats = self
                .rxs
                .iter()
                .map(|s| s.rx.stats().unwrap_or_default())
                .collect();
            self.last_kernel_stats = Some(now);
        }
        let rings = self
            .rxs
            .iter()
            .zip(self.kernel_stats.iter())
            .map(|(s, k)| RingStats {
                port_idx: s.port_idx,
                queue: s.queue,
                rx_occupancy: s.rx.rx_ring_occupancy(),
                tx_occupancy: tx::socket(&self.txs, s.port_idx, s.queue)
                    .map_or(0, |t| t.tx_ring_occupancy()),
                kernel_rx_dropped: k.rx_dropped,
                kernel_rx_ring_full: k.rx_ring_full,
                kernel_fill_ring_empty: k.rx_fill_ring_empty_descs,
            })
            .collect();
        let mut p = lock(&self.shared.published[self.idx]);
        p.counters = self.counters.clone();
        p.rings = rings;
        p.busy_share = busy_share;
        self.last_publish = now;
    }
}

#[cfg(test)]
mod tests {
    use super::{deal, OwnAddresses};

    /// Threads per socket (port by port, queue by queue) for `ports` ×
    /// `queues` sockets.
    fn dealt(ports: usize, queues: usize, threads: usize) -> Vec<usize> {
        let n = ports * queues;
        (0..n).map(|k| deal(k, n, threads, queues)).collect()
    }

    #[test]
    fn sockets_go_by_queue_when_queues_suffice_and_in_port_blocks_otherwise() {
        // One port, a queue per thread: thread t on queue t.
        assert_eq!(dealt(1, 4, 4), [0, 1, 2, 3]);
        // Queue t of every port on thread t (interrupt affinity follows).
        assert_eq!(dealt(2, 2, 2), [0, 1, 0, 1]);
        assert_eq!(dealt(2, 4, 2), [0, 1, 0, 1, 0, 1, 0, 1]);
        // A port per worker: neighbouring ports on one thread, so ranks
        // 0-1 and 2-3 each sum on one thread.
        assert_eq!(dealt(4, 1, 2), [0, 0, 1, 1]);
        assert_eq!(dealt(4, 2, 4), [0, 0, 1, 1, 2, 2, 3, 3]);
        // Uneven: every thread gets one, none more than one over another.
        assert_eq!(dealt(3, 1, 2), [0, 0, 1]);
        assert_eq!(dealt(5, 1, 3), [0, 0, 1, 1, 2]);
        assert_eq!(dealt(3, 1, 3), [0, 1, 2]);
    }

    /// Any one of the switch's IPs or MACs is claimed, whatever the other
    /// address; a host's own pair is not.
    #[test]
    fn own_addresses_are_recognised_by_ip_or_mac() {
        let macs = (1..=90u8).map(|i| [2, 0, 0, 0, 1, i]).rev();
        let own = OwnAddresses::new([[198, 18, 0, 1], [198, 19, 255, 1]], macs);
        let host = ([198, 18, 0, 100], [2, 0, 0, 0, 9, 9]);
        assert!(!own.claims(host.0, host.1));
        assert!(own.claims([198, 18, 0, 1], host.1));
        assert!(own.claims([198, 19, 255, 1], host.1));
        for i in [1u8, 45, 90] {
            assert!(own.claims(host.0, [2, 0, 0, 0, 1, i]), "port MAC {i}");
        }
        assert!(!own.claims(host.0, [2, 0, 0, 0, 1, 91]));
        assert!(!OwnAddresses::default().claims(host.0, host.1));
    }
}
