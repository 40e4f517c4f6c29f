//! The dataplane: receive aggregation frames from the AF_XDP sockets, feed
//! them to the job table, and write JOIN_ACK / RESULT / NACK frames to the
//! transmit rings of the ports the workers are behind.
//!
//! Owns: [`Shared`] (the job table, which thread owns which socket, the
//! per-thread outboxes and published counters) and [`DataplaneThread`] (one
//! per pinned core: the receive and transmit halves of the sockets it owns,
//! its own counters).
//!
//! Multi-core (DESIGN.md, "Multi-core"): a socket belongs to exactly one
//! thread, and contributions to one slot arrive on different sockets, so
//! the slot state is shared: one table mutex, taken once per receive batch
//! (up to [`RX_BATCH`] frames), not per packet. A RESULT for a member whose
//! socket another thread owns goes to that thread's lock-free outbox
//! (crossbeam `ArrayQueue`, fixed capacity, no allocation) as a small
//! [`Forward`] record; that thread writes the frame from the shadow copy,
//! which stays valid until every rank has moved past the seq. A thread
//! that hands work to a sleeping thread wakes it through that thread's
//! eventfd ([`crate::wake`]; at most one write per sleep): before, the
//! RESULT waited for the sleeper's poll timeout (10 ms) or its next frame,
//! and 2 threads stalled closed loops of workers (rates benchmark, 2-core
//! VM, 2 / 4 / 8 ranks, one A/B pair of runs: 2 threads 110 / 103 / 124 k
//! DATA/s before, 130 / 147 / 132 k after).
//!
//! Why shared state and not a hand-off to a slot-owner thread: a hand-off
//! copies every payload once more between threads and still needs this
//! cross-thread transmit path for RESULTs, since members sit behind other
//! threads' sockets. The hand-off variant was not built, so it is not
//! measured. Measured (2-core VM, 4 workers on the same cores, 3 × 64 MiB,
//! two runs each): 1 thread 2.18 / 2.34 s, 2 threads 2.52 / 2.61 s, so
//! 2 threads reach 0.87–0.90 of 1 thread here: the second thread takes CPU
//! from the workers, and the lock is not the bottleneck. The default is 1
//! thread; use more where the switch has cores of its own. On the 2-core
//! VM the second thread can only share a core with the workers or the
//! generator, so 2 threads reach 0.5–0.7 of 1 thread's packet rate there
//! (docs/BENCHMARKS.md).
//!
//! Invariants (the hot path): no allocation per packet (frames are parsed in
//! place, replies written straight into UMEM frames), ring operations in
//! batches, transmit rings flushed once per round, no syscall per packet: a
//! thread sleeps in one `poll(2)` over its sockets only after many empty
//! rounds. Counters are per thread, plain integers, published under a
//! per-thread lock at most every few milliseconds and summed on read.
//! A malformed frame is counted by kind and dropped; nothing a sender can put
//! in a frame makes this code panic.
//!
//! Echo mode (`[switch] mode = "echo"`, a benchmark baseline) replaces the
//! round by [`crate::echo`]: no table, no outbox, every frame straight back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use proto::switch::{DataOutcome, Endpoint, Job, JobState, JobTable, JoinOutcome, Verdict};
use proto::wire::{
    emit_nack, write_f32s, Header, HeaderRepr, MsgType, NackReason, WireError, HEADER_LEN,
    JOIN_ACK_PAYLOAD_LEN, L2_L4_LEN, NACK_PAYLOAD_LEN,
};

use crate::admin::{AdminCall, AdminReply, AdminRequest};
use crate::frame::{parse_udp_frame, reply_endpoint, write_udp_headers};
use crate::stats::{self, PortStats, RingStats};
use crate::wake::ThreadWaker;
use crate::xdp::{XskRx, XskTx};

/// Frames taken from one receive ring per round.
pub const RX_BATCH: u32 = 64;
/// Empty rounds before a thread sleeps in poll(2).
const SPIN_ROUNDS: u32 = 64;
/// Longest sleep in poll(2), so that stop requests and ticks are seen.
const IDLE_WAIT_MS: i32 = 10;
/// Replies waiting for another thread's transmit ring.
const OUTBOX_CAPACITY: usize = 16 * 1024;
/// How often a thread publishes its counters.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// Kinds of malformed aggregation messages, one counter each.
pub const MALFORMED_KINDS: [&str; 8] = [
    "bad_frame",
    "truncated",
    "bad_version",
    "unknown_type",
    "reserved_flags",
    "zero_job",
    "payload_length",
    "wrong_port",
];

fn malformed_index(e: &WireError) -> usize {
    match e {
        WireError::Truncated { .. } => 1,
        WireError::BadVersion(_) => 2,
        WireError::UnknownType(_) => 3,
        WireError::ReservedFlags(_) => 4,
        WireError::ZeroJob => 5,
        WireError::PayloadLength { .. } | WireError::UnknownNackReason(_) => 6,
    }
}

/// Counters of one dataplane thread (not of any one job).
#[derive(Debug, Clone, Default)]
pub struct DataplaneCounters {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Replies dropped because a transmit ring, its frames or an outbox
    /// were exhausted (the worker's resend gets them from the shadow).
    pub tx_ring_full: u64,
    pub malformed: [u64; MALFORMED_KINDS.len()],
    pub results_sent: u64,
    pub join_acks_sent: u64,
    pub nacks_sent: u64,
    /// Frames taken while an AF_XDP ring was over the ECN threshold (their
    /// slots' RESULTs carry ECE).
    pub ring_congested_frames: u64,
    /// Replies handed to the thread that owns the member's socket.
    pub forwarded: u64,
    /// Hand-offs that found the owning thread asleep and woke it (one
    /// eventfd write each; [`crate::wake`]).
    pub thread_wakeups: u64,
    /// Echo mode: frames sent back (their drops count in `tx_ring_full`).
    pub echoed: u64,
}

impl DataplaneCounters {
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().sum()
    }

    fn add(&mut self, o: &DataplaneCounters) {
        self.rx_frames += o.rx_frames;
        self.tx_frames += o.tx_frames;
        self.tx_ring_full += o.tx_ring_full;
        for (a, b) in self.malformed.iter_mut().zip(o.malformed.iter()) {
            *a += b;
        }
        self.results_sent += o.results_sent;
        self.join_acks_sent += o.join_acks_sent;
        self.nacks_sent += o.nacks_sent;
        self.ring_congested_frames += o.ring_congested_frames;
        self.forwarded += o.forwarded;
        self.thread_wakeups += o.thread_wakeups;
        self.echoed += o.echoed;
    }
}

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

/// A reply that another thread must write, because it owns the socket of
/// the member's port and queue.
#[derive(Debug, Clone, Copy)]
pub enum Forward {
    Result {
        job: u16,
        seq: u32,
        rank: u16,
        retx: bool,
        to: Endpoint,
    },
    JoinAck {
        job: u16,
        rank: u16,
        to: Endpoint,
    },
}

#[derive(Default)]
struct Published {
    counters: DataplaneCounters,
    rings: Vec<RingStats>,
}

/// State every dataplane thread shares.
pub struct Shared {
    table: Mutex<JobTable>,
    agg_port: u16,
    /// Ring occupancy (entries) above which taken contributions count as
    /// congestion-marked; u32::MAX turns it off.
    ecn_ring_entries: u32,
    /// Chunk size for jobs added without one (from the ports' MTU).
    default_elems: u16,
    started: Instant,
    /// Thread that owns socket `[port][queue]`.
    owner: Vec<Vec<usize>>,
    outboxes: Vec<ArrayQueue<Forward>>,
    /// Wakes thread `i` from its poll(2) when its outbox gets work.
    wakers: Vec<ThreadWaker>,
    published: Vec<Mutex<Published>>,
    /// Echo mode (a benchmark baseline, [`crate::echo`]): no aggregation.
    echo: bool,
}

/// How to build a dataplane.
pub struct DataplaneConfig {
    pub agg_port: u16,
    pub default_elems: u16,
    /// Fraction of a ring's size above which RESULTs get ECE (≥ 1: never).
    pub ecn_ring_fraction: f64,
    pub ring_size: u32,
    pub threads: usize,
    /// Echo every steered frame instead of aggregating ([`crate::echo`]).
    pub echo: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking thread stops switchd (main re-raises it); the table it
    // held is still consistent between two messages, so keep serving reads.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds the shared state and one [`DataplaneThread`] per thread; sockets
/// are dealt round-robin in the order given. Fails only if a thread's
/// wake-up eventfd cannot be made.
pub fn build(
    table: JobTable,
    sockets: Vec<Socket>,
    cfg: &DataplaneConfig,
) -> std::io::Result<(Arc<Shared>, Vec<DataplaneThread>)> {
    let threads = cfg.threads.max(1);
    let wakers = (0..threads)
        .map(|_| ThreadWaker::new())
        .collect::<std::io::Result<Vec<_>>>()?;
    let ports = sockets
        .iter()
        .map(|s| s.port_idx as usize + 1)
        .max()
        .unwrap_or(0);
    let queues = sockets
        .iter()
        .map(|s| s.queue as usize + 1)
        .max()
        .unwrap_or(0);
    let mut owner = vec![vec![usize::MAX; queues]; ports];
    let mut per_thread: Vec<(Vec<RxSocket>, TxSockets)> = (0..threads)
        .map(|_| {
            (
                Vec::new(),
                (0..ports)
                    .map(|_| (0..queues).map(|_| None).collect())
                    .collect(),
            )
        })
        .collect();
    for (k, s) in sockets.into_iter().enumerate() {
        let t = k % threads;
        owner[s.port_idx as usize][s.queue as usize] = t;
        per_thread[t].1[s.port_idx as usize][s.queue as usize] = Some(s.tx);
        per_thread[t].0.push(RxSocket {
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
        table: Mutex::new(table),
        agg_port: cfg.agg_port,
        ecn_ring_entries,
        default_elems: cfg.default_elems,
        started: Instant::now(),
        owner,
        outboxes: (0..threads)
            .map(|_| ArrayQueue::new(OUTBOX_CAPACITY))
            .collect(),
        wakers,
        published: (0..threads).map(|_| Mutex::default()).collect(),
        echo: cfg.echo,
    });
    let workers = per_thread
        .into_iter()
        .enumerate()
        .map(|(idx, (rxs, txs))| DataplaneThread {
            idx,
            shared: shared.clone(),
            rxs,
            txs,
            counters: DataplaneCounters::default(),
            admin: None,
            last_publish: Instant::now(),
        })
        .collect();
    Ok((shared, workers))
}

/// Where replies go: this thread's transmit rings, or another's outbox.
struct Out<'a> {
    idx: usize,
    shared: &'a Shared,
    txs: &'a mut TxSockets,
    counters: &'a mut DataplaneCounters,
}

impl Out<'_> {
    fn owner_of(&self, to: &Endpoint) -> Option<usize> {
        self.shared
            .owner
            .get(to.port_idx as usize)
            .and_then(|q| q.get(to.queue as usize))
            .copied()
            .filter(|t| *t != usize::MAX)
    }

    /// Hands `f` to the thread owning `to`'s socket; false if it is ours.
    fn forward_if_foreign(&mut self, to: &Endpoint, f: Forward) -> bool {
        match self.owner_of(to) {
            Some(t) if t != self.idx => {
                if self.shared.outboxes[t].push(f).is_ok() {
                    self.counters.forwarded += 1;
                    if self.shared.wakers[t].wake() {
                        self.counters.thread_wakeups += 1;
                    }
                } else {
                    self.counters.tx_ring_full += 1;
                }
                true
            }
            _ => false,
        }
    }

    /// Writes one message to our transmit ring of `to`'s port and queue:
    /// `body` writes the aggregation header and payload, returns its length.
    fn transmit(&mut self, to: &Endpoint, ce: bool, body: impl FnOnce(&mut [u8]) -> usize) -> bool {
        let Some(tx) = self
            .txs
            .get_mut(to.port_idx as usize)
            .and_then(|q| q.get_mut(to.queue as usize))
            .and_then(|t| t.as_mut())
        else {
            self.counters.tx_ring_full += 1;
            return false;
        };
        let ok = tx.send_with(|buf| {
            if buf.len() <= L2_L4_LEN {
                return 0;
            }
            let n = body(&mut buf[L2_L4_LEN..]);
            if n == 0 {
                return 0;
            }
            write_udp_headers(buf, to, ce, n).unwrap_or(0)
        });
        if ok {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_ring_full += 1;
        }
        ok
    }

    /// RESULT of `seq` to `rank` at `to`; true if written here.
    fn result(
        &mut self,
        job: &Job,
        gen: u32,
        seq: u32,
        rank: u16,
        to: &Endpoint,
        retx: bool,
    ) -> bool {
        let fwd = Forward::Result {
            job: job.id(),
            seq,
            rank,
            retx,
            to: *to,
        };
        if self.forward_if_foreign(to, fwd) {
            return false;
        }
        let (Some(hdr), Some(res)) = (job.result_header(seq, rank, retx, gen), job.result(seq))
        else {
            return false;
        };
        let ok = self.transmit(to, res.ece, |p| {
            if p.len() < HEADER_LEN + res.values.len() * 4 || hdr.emit_to(p).is_err() {
                return 0;
            }
            HEADER_LEN + write_f32s(res.values, &mut p[HEADER_LEN..])
        });
        if ok {
            self.counters.results_sent += 1;
        }
        ok
    }

    fn join_ack(&mut self, job: &Job, gen: u32, rank: u16, to: &Endpoint) {
        if self.forward_if_foreign(
            to,
            Forward::JoinAck {
                job: job.id(),
                rank,
                to: *to,
            },
        ) {
            return;
        }
        let hdr = job.join_ack_header(rank, gen);
        let payload = job.join_ack_payload();
        if self.transmit(to, false, |p| {
            if hdr.emit_to(p).is_err() || payload.emit(&mut p[HEADER_LEN..]).is_err() {
                return 0;
            }
            HEADER_LEN + JOIN_ACK_PAYLOAD_LEN
        }) {
            self.counters.join_acks_sent += 1;
        }
    }

    fn nack(&mut self, job: u16, rank: u16, gen: u32, reason: NackReason, to: &Endpoint) {
        let mut hdr = HeaderRepr::new(MsgType::Nack, job);
        hdr.rank = rank;
        hdr.gen = gen;
        if self.transmit(to, false, |p| {
            if hdr.emit_to(p).is_err() || emit_nack(reason, &mut p[HEADER_LEN..]).is_err() {
                return 0;
            }
            HEADER_LEN + NACK_PAYLOAD_LEN
        }) {
            self.counters.nacks_sent += 1;
        }
    }

    /// Answers a member's HEARTBEAT with the ranks `seq` still waits for.
    fn heartbeat_reply(&mut self, job: &Job, gen: u32, rank: u16, seq: u32, to: &Endpoint) {
        let mut hdr = HeaderRepr::new(MsgType::Heartbeat, job.id());
        hdr.rank = rank;
        hdr.seq = seq;
        hdr.gen = gen;
        hdr.window = job.window();
        self.transmit(to, false, |p| {
            // At most 512 ranks: the reply stays small whatever n is.
            let room = (p.len().saturating_sub(HEADER_LEN)).min(1024);
            let n = job.write_missing_ranks(seq, &mut p[HEADER_LEN..HEADER_LEN + room]);
            hdr.count = n as u16;
            if hdr.emit_to(p).is_err() {
                return 0;
            }
            HEADER_LEN + 2 * n
        });
    }
}

/// Handles one received frame (the table is locked by the caller).
fn handle_frame(
    frame: &[u8],
    port_idx: u32,
    queue: u32,
    congested: bool,
    table: &mut JobTable,
    out: &mut Out<'_>,
) {
    out.counters.rx_frames += 1;
    let Ok(f) = parse_udp_frame(frame) else {
        out.counters.malformed[0] += 1;
        return;
    };
    if f.dst_port != out.shared.agg_port {
        out.counters.malformed[7] += 1;
        return;
    }
    let hdr = match Header::new_checked(f.payload).and_then(|h| HeaderRepr::parse(&h)) {
        Ok(h) => h,
        Err(e) => {
            out.counters.malformed[malformed_index(&e)] += 1;
            return;
        }
    };
    let payload = &f.payload[HEADER_LEN..];
    let from = reply_endpoint(&f, port_idx, queue);
    let gen = table.gen();
    if congested {
        out.counters.ring_congested_frames += 1;
    }
    let verdict = table.handle(&hdr, payload, from, f.ce || congested);
    let job_id = hdr.job;
    match verdict {
        Verdict::Join(JoinOutcome::Activated) => {
            if let Some(job) = table.get(job_id) {
                for (rank, ep) in job.members() {
                    out.join_ack(job, gen, rank, ep);
                }
                tracing::info!(
                    job = job_id,
                    ranks = job.n_workers(),
                    resume_collective = job.resume_point().0,
                    resume_seq = job.resume_point().1,
                    "job active: every rank joined"
                );
            }
        }
        Verdict::Join(JoinOutcome::AckAgain) => {
            if let Some(job) = table.get(job_id) {
                out.join_ack(job, gen, hdr.rank, &from);
            }
        }
        Verdict::Join(JoinOutcome::Waiting) => {
            if let Some(job) = table.get(job_id) {
                tracing::info!(
                    job = job_id,
                    rank = hdr.rank,
                    joined = job.joined_ranks(),
                    of = job.n_workers(),
                    "rank joined"
                );
            }
        }
        Verdict::Join(JoinOutcome::Nack(reason)) => {
            tracing::warn!(
                job = job_id,
                rank = hdr.rank,
                source = %std::net::Ipv4Addr::from(f.src_ip),
                %reason,
                "JOIN refused"
            );
            out.nack(job_id, hdr.rank, gen, reason, &from);
        }
        Verdict::NackUnknownJob => {
            tracing::debug!(
                job = job_id,
                source = %std::net::Ipv4Addr::from(f.src_ip),
                "message for an unknown or removed job refused"
            );
            out.nack(job_id, hdr.rank, gen, NackReason::UnknownJob, &from);
        }
        Verdict::Data(DataOutcome::Nack(reason)) => {
            out.nack(job_id, hdr.rank, gen, reason, &from);
        }
        Verdict::Data(DataOutcome::Completed { seq }) => {
            if let Some(job) = table.get(job_id) {
                let mut sent = 0;
                for (rank, ep) in job.members() {
                    sent += out.result(job, gen, seq, rank, ep, false) as u64;
                }
                if let Some(job) = table.get_mut(job_id) {
                    job.counters.results_sent += sent;
                }
            }
        }
        Verdict::Data(DataOutcome::Retransmit { seq }) => {
            if let Some(job) = table.get(job_id) {
                if let Some(ep) = job.member(hdr.rank).copied() {
                    let ok = out.result(job, gen, seq, hdr.rank, &ep, true);
                    if let Some(job) = table.get_mut(job_id) {
                        job.counters.results_sent += ok as u64;
                    }
                }
            }
        }
        Verdict::Heartbeat { seq } => {
            if let Some(job) = table.get(job_id) {
                out.heartbeat_reply(job, gen, hdr.rank, seq, &from);
            }
        }
        Verdict::Data(DataOutcome::Taken | DataOutcome::Dropped(_))
        | Verdict::Noted
        | Verdict::Dropped(_) => {}
    }
}

impl Shared {
    /// A full counter snapshot: jobs from the table, dataplane counters and
    /// ring gauges summed over the threads' last publication.
    pub fn snapshot(&self, ports: Vec<PortStats>) -> stats::SwitchStats {
        let mut sum = DataplaneCounters::default();
        let mut rings = Vec::new();
        for p in &self.published {
            let p = lock(p);
            sum.add(&p.counters);
            rings.extend(p.rings.iter().cloned());
        }
        rings.sort_by_key(|r| (r.port_idx, r.queue));
        let table = lock(&self.table);
        let mut s = stats::snapshot(&table, &sum, ports, self.started.elapsed().as_secs_f64());
        s.rings = rings;
        s
    }

    /// Answers one admin request.
    pub fn handle_admin(
        &self,
        req: AdminRequest,
        port_stats: &dyn Fn() -> Vec<PortStats>,
    ) -> AdminReply {
        match req {
            AdminRequest::Stats { job: None } => AdminReply::ok(
                serde_json::to_value(self.snapshot(port_stats())).unwrap_or_default(),
            ),
            AdminRequest::Jobs => {
                let table = lock(&self.table);
                let mut jobs: Vec<serde_json::Value> = table
                    .jobs()
                    .map(|j| {
                        serde_json::json!({
                            "id": j.id(),
                            "state": match j.state() {
                                JobState::Joining => "joining",
                                JobState::Active => "active",
                            },
                            "n_workers": j.n_workers(),
                            "ranks_joined": j.joined_ranks(),
                            "pool_slots": j.config.pool_slots,
                            "elems_per_chunk": j.config.elems_per_chunk,
                            "window": j.window(),
                        })
                    })
                    .collect();
                jobs.sort_by_key(|j| j["id"].as_u64());
                AdminReply::ok(serde_json::Value::Array(jobs))
            }
            AdminRequest::Stats { job: Some(id) } => {
                let table = lock(&self.table);
                match stats::job_stats(&table).into_iter().find(|j| j.id == id) {
                    Some(j) => AdminReply::ok(serde_json::to_value(j).unwrap_or_default()),
                    None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
                }
            }
            AdminRequest::AddJob { job } => {
                let cfg = match job.to_job_config(self.default_elems) {
                    Ok(c) => c,
                    Err(e) => return AdminReply::err(e),
                };
                let (id, n) = (cfg.id, cfg.n_workers);
                match lock(&self.table).add(cfg, crate::config::MAX_ELEMS_IN_FRAME) {
                    Ok(()) => {
                        tracing::info!(job = id, n_workers = n, "job added");
                        AdminReply::ok(serde_json::json!({ "added": id }))
                    }
                    Err(e) => AdminReply::err(e.to_string()),
                }
            }
            AdminRequest::RemoveJob { id } => {
                let removed = lock(&self.table).remove(id);
                match removed {
                    Some(job) => {
                        tracing::info!(
                            job = id,
                            chunks_completed = job.counters.chunks_completed,
                            "job removed; its workers get NACK 1 (unknown job)"
                        );
                        AdminReply::ok(serde_json::json!({ "removed": id }))
                    }
                    None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
                }
            }
        }
    }
}

/// One dataplane thread: the sockets it owns and its counters.
pub struct DataplaneThread {
    idx: usize,
    shared: Arc<Shared>,
    rxs: Vec<RxSocket>,
    txs: TxSockets,
    counters: DataplaneCounters,
    admin: Option<mpsc::Receiver<AdminCall>>,
    last_publish: Instant,
}

impl DataplaneThread {
    pub fn index(&self) -> usize {
        self.idx
    }

    /// Sockets this thread serves, as (port, queue).
    pub fn sockets(&self) -> Vec<(u32, u32)> {
        self.rxs.iter().map(|s| (s.port_idx, s.queue)).collect()
    }

    /// Takes admin requests from this channel between receive rounds.
    pub fn set_admin(&mut self, calls: mpsc::Receiver<AdminCall>) {
        self.admin = Some(calls);
    }

    fn publish(&mut self) {
        let rings = self
            .rxs
            .iter()
            .map(|s| RingStats {
                port_idx: s.port_idx,
                queue: s.queue,
                rx_occupancy: s.rx.rx_ring_occupancy(),
                tx_occupancy: self
                    .txs
                    .get(s.port_idx as usize)
                    .and_then(|q| q.get(s.queue as usize))
                    .and_then(|t| t.as_ref())
                    .map_or(0, |t| t.tx_ring_occupancy()),
            })
            .collect();
        let mut p = lock(&self.shared.published[self.idx]);
        p.counters = self.counters.clone();
        p.rings = rings;
        self.last_publish = Instant::now();
    }

    /// Writes the replies other threads handed to this one.
    fn drain_outbox(&mut self) {
        let shared = self.shared.clone();
        let outbox = &shared.outboxes[self.idx];
        if outbox.is_empty() {
            return;
        }
        let mut table = lock(&shared.table);
        let gen = table.gen();
        let mut out = Out {
            idx: self.idx,
            shared: &shared,
            txs: &mut self.txs,
            counters: &mut self.counters,
        };
        while let Some(f) = outbox.pop() {
            match f {
                Forward::Result {
                    job,
                    seq,
                    rank,
                    retx,
                    to,
                } => {
                    let ok = table
                        .get(job)
                        .is_some_and(|j| out.result(j, gen, seq, rank, &to, retx));
                    if let Some(j) = table.get_mut(job) {
                        j.counters.results_sent += ok as u64;
                    }
                }
                Forward::JoinAck { job, rank, to } => {
                    if let Some(j) = table.get(job) {
                        out.join_ack(j, gen, rank, &to);
                    }
                }
            }
        }
    }

    /// Echo mode's round: every socket's frames back out of its own
    /// transmit ring, swapped ([`crate::echo`]); returns the frames received.
    fn echo_once(&mut self) -> u32 {
        let mut got = 0;
        for s in &mut self.rxs {
            let Some(tx) = self
                .txs
                .get_mut(s.port_idx as usize)
                .and_then(|q| q.get_mut(s.queue as usize))
                .and_then(|t| t.as_mut())
            else {
                continue;
            };
            let o = crate::echo::echo_batch(&mut s.rx, tx, RX_BATCH);
            got += o.received;
            let c = &mut self.counters;
            c.rx_frames += u64::from(o.received);
            c.echoed += u64::from(o.echoed);
            c.tx_frames += u64::from(o.echoed);
            c.tx_ring_full += u64::from(o.tx_full);
            c.malformed[0] += u64::from(o.malformed);
            // Also when nothing came: copy mode may have left frames in
            // the ring (at most 32 leave per kick).
            tx.flush();
        }
        got
    }

    /// One round over this thread's sockets; returns the frames received.
    pub fn poll_once(&mut self) -> u32 {
        if self.shared.echo {
            return self.echo_once();
        }
        self.drain_outbox();
        let shared = self.shared.clone();
        let limit = shared.ecn_ring_entries;
        let mut got = 0;
        for s in &mut self.rxs {
            let waiting = s.rx.rx_ring_occupancy();
            if waiting == 0 {
                continue;
            }
            let (p, q) = (s.port_idx, s.queue);
            // Congestion of the switch's own queues (PROTOCOL.md): frames
            // waiting in this receive ring, or replies waiting to go out on
            // this port, above the threshold. Loads only, no syscall.
            let congested = limit != u32::MAX
                && (waiting > limit
                    || self
                        .txs
                        .get(p as usize)
                        .and_then(|t| t.get(q as usize))
                        .and_then(|t| t.as_ref())
                        .is_some_and(|t| t.tx_ring_occupancy() > limit));
            let mut table = lock(&shared.table);
            let mut out = Out {
                idx: self.idx,
                shared: &shared,
                txs: &mut self.txs,
                counters: &mut self.counters,
            };
            got += s.rx.recv_batch(RX_BATCH, |frame| {
                handle_frame(frame, p, q, congested, &mut table, &mut out)
            });
        }
        for port in &mut self.txs {
            for tx in port.iter_mut().flatten() {
                tx.flush();
            }
        }
        got
    }

    /// Runs until `stop` is set. Thread 0 also answers admin requests and
    /// calls `tick` every `tick_every`.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        tick_every: Duration,
        mut tick: impl FnMut(&Shared),
        port_stats: &dyn Fn() -> Vec<PortStats>,
    ) {
        let mut fds: Vec<libc::pollfd> = self
            .rxs
            .iter()
            .map(|s| libc::pollfd {
                fd: s.rx.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Last: the eventfd other threads write when they hand us work.
        fds.push(libc::pollfd {
            fd: self.shared.wakers[self.idx].fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let mut idle = 0u32;
        let mut next_tick = Instant::now() + tick_every;
        while !stop.load(Ordering::Relaxed) {
            if self.poll_once() == 0 {
                idle += 1;
                if idle >= SPIN_ROUNDS {
                    // Replies from other threads must not wait for our
                    // sleep: announce it, look at the outbox once more, and
                    // let a thread that hands us work later write the
                    // eventfd (crate::wake).
                    let waker = &self.shared.wakers[self.idx];
                    waker.prepare_sleep();
                    let mut handed_work = false;
                    if self.shared.outboxes[self.idx].is_empty() {
                        // SAFETY: `fds` is a live array of fds.len() pollfds.
                        let n = unsafe {
                            libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, IDLE_WAIT_MS)
                        };
                        handed_work =
                            n > 0 && fds.last().is_some_and(|p| p.revents & libc::POLLIN != 0);
                    }
                    waker.woke(handed_work);
                }
            } else {
                idle = 0;
            }
            let now = Instant::now();
            if now.duration_since(self.last_publish) >= PUBLISH_EVERY {
                self.publish();
            }
            if let Some(rx) = self.admin.take() {
                while let Ok(call) = rx.try_recv() {
                    self.publish();
                    let reply = self.shared.handle_admin(call.request, port_stats);
                    let _ = call.reply.send(reply);
                }
                self.admin = Some(rx);
            }
            if self.idx == 0 && now >= next_tick {
                self.publish();
                tick(&self.shared);
                next_tick = now + tick_every;
            }
        }
        self.drain_outbox();
        for port in &mut self.txs {
            for tx in port.iter_mut().flatten() {
                tx.flush();
            }
        }
        self.publish();
    }
}
