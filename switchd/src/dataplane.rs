//! The dataplane: receive aggregation frames from every AF_XDP socket, feed
//! them to the job table, and write JOIN_ACK / RESULT / NACK frames to the
//! transmit rings of the ports the workers are behind.
//!
//! Owns: the receive and transmit halves of every socket (one per port and
//! queue), the [`JobTable`], and the dataplane counters.
//!
//! Invariants (the hot path): no allocation per packet (frames are parsed in
//! place, replies written straight into UMEM frames), ring operations in
//! batches of up to [`RX_BATCH`], transmit rings flushed once per loop, and
//! no syscall per packet: the loop sleeps in one `poll(2)` over all sockets
//! only after several empty rounds.
//!
//! One dataplane thread serves every socket (issue 5 spreads this over
//! cores). A malformed frame is counted by kind and dropped; nothing a
//! sender can put in a frame makes this code panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto::switch::{DataOutcome, Endpoint, Job, JobState, JobTable, JoinOutcome, Verdict};
use proto::wire::{
    emit_nack, write_f32s, Header, HeaderRepr, MsgType, NackReason, WireError, HEADER_LEN,
    JOIN_ACK_PAYLOAD_LEN, L2_L4_LEN, NACK_PAYLOAD_LEN,
};

use crate::admin::{AdminCall, AdminReply, AdminRequest};
use crate::frame::{parse_udp_frame, reply_endpoint, write_udp_headers};
use crate::stats::{self, PortStats};
use crate::xdp::{XskRx, XskTx};

/// Frames taken from one receive ring per round.
pub const RX_BATCH: u32 = 64;
/// Empty rounds before the loop sleeps in poll(2).
const SPIN_ROUNDS: u32 = 64;
/// Longest sleep in poll(2), so that stop requests and ticks are seen.
const IDLE_WAIT_MS: i32 = 10;

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

/// Counters of the dataplane (not of any one job).
#[derive(Debug, Clone, Default)]
pub struct DataplaneCounters {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Replies dropped because a transmit ring or its frames were exhausted.
    pub tx_ring_full: u64,
    pub malformed: [u64; MALFORMED_KINDS.len()],
    pub results_sent: u64,
    pub join_acks_sent: u64,
    pub nacks_sent: u64,
    /// Frames taken while an AF_XDP ring was over the ECN threshold (their
    /// slots' RESULTs carry ECE).
    pub ring_congested_frames: u64,
}

impl DataplaneCounters {
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().sum()
    }
}

/// One receive half with the port and queue it serves.
pub struct RxSocket {
    pub port_idx: u32,
    pub queue: u32,
    pub rx: XskRx,
}

/// Transmit halves, indexed `[port][queue]`.
pub type TxSockets = Vec<Vec<XskTx>>;

pub struct Dataplane {
    pub table: JobTable,
    pub rxs: Vec<RxSocket>,
    pub txs: TxSockets,
    pub counters: DataplaneCounters,
    agg_port: u16,
    /// Ring occupancy (entries) above which taken contributions count as
    /// congestion-marked; u32::MAX turns it off.
    ecn_ring_entries: u32,
    /// Chunk size for jobs added without one (from the ports' MTU).
    pub default_elems: u16,
    pub started: Instant,
    admin: Option<mpsc::Receiver<AdminCall>>,
}

/// Writes one message to the transmit ring of `to`'s port and queue:
/// `body` writes the aggregation header and payload and returns its length.
fn transmit(
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
    to: &Endpoint,
    ce: bool,
    body: impl FnOnce(&mut [u8]) -> usize,
) -> bool {
    let Some(tx) = txs
        .get_mut(to.port_idx as usize)
        .and_then(|q| q.get_mut(to.queue as usize))
    else {
        counters.tx_ring_full += 1;
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
        counters.tx_frames += 1;
    } else {
        counters.tx_ring_full += 1;
    }
    ok
}

#[allow(clippy::too_many_arguments)] // the reply context is passed apart so borrows stay disjoint
fn send_result(
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
    job: &Job,
    gen: u32,
    seq: u32,
    rank: u16,
    to: &Endpoint,
    retx: bool,
) -> bool {
    let (Some(hdr), Some(res)) = (job.result_header(seq, rank, retx, gen), job.result(seq)) else {
        return false;
    };
    let ok = transmit(txs, counters, to, res.ece, |p| {
        if p.len() < HEADER_LEN + res.values.len() * 4 || hdr.emit_to(p).is_err() {
            return 0;
        }
        HEADER_LEN + write_f32s(res.values, &mut p[HEADER_LEN..])
    });
    if ok {
        counters.results_sent += 1;
    }
    ok
}

fn send_join_ack(
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
    job: &Job,
    gen: u32,
    rank: u16,
    to: &Endpoint,
) {
    let hdr = job.join_ack_header(rank, gen);
    let payload = job.join_ack_payload();
    if transmit(txs, counters, to, false, |p| {
        if hdr.emit_to(p).is_err() || payload.emit(&mut p[HEADER_LEN..]).is_err() {
            return 0;
        }
        HEADER_LEN + JOIN_ACK_PAYLOAD_LEN
    }) {
        counters.join_acks_sent += 1;
    }
}

fn send_nack(
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
    job: u16,
    rank: u16,
    gen: u32,
    reason: NackReason,
    to: &Endpoint,
) {
    let mut hdr = HeaderRepr::new(MsgType::Nack, job);
    hdr.rank = rank;
    hdr.gen = gen;
    if transmit(txs, counters, to, false, |p| {
        if hdr.emit_to(p).is_err() || emit_nack(reason, &mut p[HEADER_LEN..]).is_err() {
            return 0;
        }
        HEADER_LEN + NACK_PAYLOAD_LEN
    }) {
        counters.nacks_sent += 1;
    }
}

/// Answers a member's HEARTBEAT with the ranks `seq` still waits for.
fn send_heartbeat_reply(
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
    job: &Job,
    gen: u32,
    rank: u16,
    seq: u32,
    to: &Endpoint,
) {
    let mut hdr = HeaderRepr::new(MsgType::Heartbeat, job.id());
    hdr.rank = rank;
    hdr.seq = seq;
    hdr.gen = gen;
    hdr.window = job.window();
    transmit(txs, counters, to, false, |p| {
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

/// Handles one received frame. Free function so that the receive ring being
/// read and the transmit rings being written are disjoint borrows.
#[allow(clippy::too_many_arguments)] // disjoint borrows, see above
fn handle_frame(
    frame: &[u8],
    port_idx: u32,
    queue: u32,
    agg_port: u16,
    congested: bool,
    table: &mut JobTable,
    txs: &mut TxSockets,
    counters: &mut DataplaneCounters,
) {
    counters.rx_frames += 1;
    let Ok(f) = parse_udp_frame(frame) else {
        counters.malformed[0] += 1;
        return;
    };
    if f.dst_port != agg_port {
        counters.malformed[7] += 1;
        return;
    }
    let hdr = match Header::new_checked(f.payload).and_then(|h| HeaderRepr::parse(&h)) {
        Ok(h) => h,
        Err(e) => {
            counters.malformed[malformed_index(&e)] += 1;
            return;
        }
    };
    let payload = &f.payload[HEADER_LEN..];
    let from = reply_endpoint(&f, port_idx, queue);
    let gen = table.gen();
    if congested {
        counters.ring_congested_frames += 1;
    }
    let verdict = table.handle(&hdr, payload, from, f.ce || congested);
    let job_id = hdr.job;
    match verdict {
        Verdict::Join(JoinOutcome::Activated) => {
            if let Some(job) = table.get(job_id) {
                for (rank, ep) in job.members() {
                    send_join_ack(txs, counters, job, gen, rank, ep);
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
                send_join_ack(txs, counters, job, gen, hdr.rank, &from);
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
            send_nack(txs, counters, job_id, hdr.rank, gen, reason, &from);
        }
        Verdict::NackUnknownJob => {
            tracing::warn!(
                job = job_id,
                source = %std::net::Ipv4Addr::from(f.src_ip),
                "JOIN for an unknown job refused"
            );
            send_nack(
                txs,
                counters,
                job_id,
                hdr.rank,
                gen,
                NackReason::UnknownJob,
                &from,
            );
        }
        Verdict::Data(DataOutcome::Nack(reason)) => {
            send_nack(txs, counters, job_id, hdr.rank, gen, reason, &from);
        }
        Verdict::Data(DataOutcome::Completed { seq }) => {
            if let Some(job) = table.get(job_id) {
                let mut sent = 0;
                for (rank, ep) in job.members() {
                    sent += send_result(txs, counters, job, gen, seq, rank, ep, false) as u64;
                }
                if let Some(job) = table.get_mut(job_id) {
                    job.counters.results_sent += sent;
                }
            }
        }
        Verdict::Data(DataOutcome::Retransmit { seq }) => {
            if let Some(job) = table.get(job_id) {
                if let Some(ep) = job.member(hdr.rank).copied() {
                    let ok = send_result(txs, counters, job, gen, seq, hdr.rank, &ep, true);
                    if let Some(job) = table.get_mut(job_id) {
                        job.counters.results_sent += ok as u64;
                    }
                }
            }
        }
        Verdict::Heartbeat { seq } => {
            if let Some(job) = table.get(job_id) {
                send_heartbeat_reply(txs, counters, job, gen, hdr.rank, seq, &from);
            }
        }
        Verdict::Data(DataOutcome::Taken | DataOutcome::Dropped(_))
        | Verdict::Noted
        | Verdict::Dropped(_) => {}
    }
}

impl Dataplane {
    pub fn new(
        table: JobTable,
        rxs: Vec<RxSocket>,
        txs: TxSockets,
        agg_port: u16,
        default_elems: u16,
    ) -> Dataplane {
        Dataplane {
            table,
            rxs,
            txs,
            counters: DataplaneCounters::default(),
            agg_port,
            ecn_ring_entries: u32::MAX,
            default_elems,
            started: Instant::now(),
            admin: None,
        }
    }

    /// Marks ECE on slots that aggregate while a ring holds more than
    /// `fraction` of `ring_size` entries (`fraction ≥ 1`: never).
    pub fn set_ecn_threshold(&mut self, fraction: f64, ring_size: u32) {
        self.ecn_ring_entries = if fraction >= 1.0 {
            u32::MAX
        } else {
            ((ring_size as f64 * fraction) as u32).max(1)
        };
    }

    /// Occupancy of every ring: (port, queue, rx entries, tx entries).
    pub fn ring_occupancy(&self) -> Vec<stats::RingStats> {
        self.rxs
            .iter()
            .map(|s| stats::RingStats {
                port_idx: s.port_idx,
                queue: s.queue,
                rx_occupancy: s.rx.rx_ring_occupancy(),
                tx_occupancy: self
                    .txs
                    .get(s.port_idx as usize)
                    .and_then(|q| q.get(s.queue as usize))
                    .map_or(0, |t| t.tx_ring_occupancy()),
            })
            .collect()
    }

    /// Takes admin requests from this channel between receive rounds.
    pub fn set_admin(&mut self, calls: mpsc::Receiver<AdminCall>) {
        self.admin = Some(calls);
    }

    /// A full counter snapshot.
    pub fn snapshot(&self, ports: Vec<PortStats>) -> stats::SwitchStats {
        let mut s = stats::snapshot(
            &self.table,
            &self.counters,
            ports,
            self.started.elapsed().as_secs_f64(),
        );
        s.rings = self.ring_occupancy();
        s
    }

    /// Answers one admin request.
    pub fn handle_admin(
        &mut self,
        req: AdminRequest,
        port_stats: &dyn Fn() -> Vec<PortStats>,
    ) -> AdminReply {
        match req {
            AdminRequest::Jobs => {
                let mut jobs: Vec<serde_json::Value> = self
                    .table
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
            AdminRequest::Stats { job: None } => AdminReply::ok(
                serde_json::to_value(self.snapshot(port_stats())).unwrap_or_default(),
            ),
            AdminRequest::Stats { job: Some(id) } => match stats::job_stats(&self.table)
                .into_iter()
                .find(|j| j.id == id)
            {
                Some(j) => AdminReply::ok(serde_json::to_value(j).unwrap_or_default()),
                None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
            },
            AdminRequest::AddJob { job } => {
                let cfg = match job.to_job_config(self.default_elems) {
                    Ok(c) => c,
                    Err(e) => return AdminReply::err(e),
                };
                let (id, n) = (cfg.id, cfg.n_workers);
                match self.table.add(cfg, crate::config::MAX_ELEMS_IN_FRAME) {
                    Ok(()) => {
                        tracing::info!(job = id, n_workers = n, "job added");
                        AdminReply::ok(serde_json::json!({ "added": id }))
                    }
                    Err(e) => AdminReply::err(e.to_string()),
                }
            }
            AdminRequest::RemoveJob { id } => match self.table.remove(id) {
                Some(job) => {
                    tracing::info!(
                        job = id,
                        chunks_completed = job.counters.chunks_completed,
                        "job removed; its workers get NACK 1 (unknown job)"
                    );
                    AdminReply::ok(serde_json::json!({ "removed": id }))
                }
                None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
            },
        }
    }

    fn serve_admin(&mut self, port_stats: &dyn Fn() -> Vec<PortStats>) {
        let Some(rx) = self.admin.take() else {
            return;
        };
        while let Ok(call) = rx.try_recv() {
            let reply = self.handle_admin(call.request, port_stats);
            let _ = call.reply.send(reply);
        }
        self.admin = Some(rx);
    }

    /// One round over every socket; returns the frames received.
    pub fn poll_once(&mut self) -> u32 {
        let mut got = 0;
        let agg_port = self.agg_port;
        let limit = self.ecn_ring_entries;
        for s in &mut self.rxs {
            let (p, q) = (s.port_idx, s.queue);
            let table = &mut self.table;
            let txs = &mut self.txs;
            let counters = &mut self.counters;
            // Congestion of the switch's own queues (PROTOCOL.md): frames
            // waiting in this receive ring, or replies waiting to go out on
            // this port, above the threshold. Two loads, no syscall.
            let congested = limit != u32::MAX
                && (s.rx.rx_ring_occupancy() > limit
                    || txs
                        .get(p as usize)
                        .and_then(|t| t.get(q as usize))
                        .is_some_and(|t| t.tx_ring_occupancy() > limit));
            got += s.rx.recv_batch(RX_BATCH, |frame| {
                handle_frame(frame, p, q, agg_port, congested, table, txs, counters)
            });
        }
        for port in &mut self.txs {
            for tx in port {
                tx.flush();
            }
        }
        got
    }

    /// Runs until `stop` is set, calling `tick` every `tick_every`.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        tick_every: Duration,
        mut tick: impl FnMut(&Dataplane),
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
        let mut idle = 0u32;
        let mut next_tick = Instant::now() + tick_every;
        while !stop.load(Ordering::Relaxed) {
            if self.poll_once() == 0 {
                idle += 1;
                if idle >= SPIN_ROUNDS {
                    // SAFETY: `fds` is a live array of fds.len() pollfds.
                    unsafe {
                        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, IDLE_WAIT_MS);
                    }
                }
            } else {
                idle = 0;
            }
            self.serve_admin(port_stats);
            let now = Instant::now();
            if now >= next_tick {
                tick(self);
                next_tick = now + tick_every;
            }
        }
    }
}
