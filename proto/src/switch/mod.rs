//! The switch side of the protocol (docs/PROTOCOL.md, version 4), as a state
//! machine fed datagrams and time, with no I/O.
//!
//! Owns: [`JobTable`] (jobs by id, the switch generation, the nonce issuer,
//! the slot-pool memory budget, the tenants and their jobs by name, the
//! queue of replies and the queue of events for the log). This file is the
//! table's core: its state, [`JobTable::handle`] with the handlers of
//! HELLO, JOIN, LEAVE, HEARTBEAT and the DATA the data path hands back,
//! the timers ([`JobTable::handle_timeout`]) and the reply queue
//! ([`JobTable::poll_reply`]). Its parts:
//! [`config`] (what an operator declares), [`tenant`] (a tenant's
//! declaration, a job's [`JobOrigin`]), `provisioning` (the tenants'
//! jobs: PROVISION asks and claims, quotas, leases, the end of a
//! self-provisioned job; docs/PROTOCOL.md, "Tenants and self-provisioned
//! jobs"), `reservation` (jobs declared, removed and resized, their pools
//! charged before they are allocated: [`Reservation`],
//! [`ResizeReservation`]),
//! [`job`] (one job's membership and DATA), [`engine`] (the sums, which
//! any number of threads feed at once), [`datapath`] (DATA taken without
//! the table's lock, by the dataplane threads),
//! `refusal` (what the table did with a message, [`Verdict`], and why it
//! refused one, [`Refusal`]), `event` (what the log should say,
//! [`Event`]), [`reply`] (what to send), `encode` (its bytes,
//! [`JobTable::encode`]), [`counters`] (the counter schema), [`uplink`]
//! (a leaf's sessions with the spines of its aggregation trees), `leaf`
//! (a leaf job's half of [`Job`]), `spine` (the table's side of a leaf
//! job's spines: what they send it, what it queues up to them) and
//! [`entry`] (the switch's one entry point, [`entry::Switch`]: the data
//! path, else this table).
//!
//! Layers: a file imports only from files below it. Bottom to top:
//! [`counters`], [`ratelimit`], [`priority`]; [`engine`], [`config`];
//! [`tenant`]; [`reply`], [`datapath`], [`uplink`]; [`job`]; `leaf`;
//! `event`, `refusal` (the types the table reports); this table with
//! `provisioning`, `reservation`, `spine` and `encode` (the table's
//! methods for tenants, for its jobs' memory, for a leaf's spines and for
//! the replies' bytes, each in a file of their own);
//! [`entry`] (not re-exported here, so that it and the table do not import
//! each other).
//!
//! How a shell uses it: through [`entry::Switch`], which owns this table
//! behind its lock and the lock-free [`DataPath`] over the same jobs:
//! [`entry::Batch::on_datagram`] each received datagram, with the shell's
//! [`entry::Transmit`] (which thread owns the socket an endpoint is reached
//! through, and the bytes out); drain [`JobTable::poll_event`] for the log.
//! The switch (the data path's completions and resends, this table's
//! queued replies, both expanded and encoded by [`entry`]) decides every
//! reply and every fan-out; shells only route and move bytes. The table
//! alone ([`JobTable::handle`], [`JobTable::poll_reply`],
//! [`JobTable::encode`]) is what [`entry`] calls for what the data path
//! hands back, and what unit tests of the table drive.
//!
//! Invariants:
//! * A rejected message changes nothing but counters, and is answered with
//!   at most one reply. Refusals of HELLO and JOIN (and the version-1 and
//!   version-2 refusals) are no larger than what they answer (a HELLO is padded to the
//!   size of its CHALLENGE); NACKs to DATA and HEARTBEAT (6, 7, and 1 for a
//!   removed job) may be larger, so they go only to sources inside the
//!   job's prefixes.
//! * Every NACK (and the version-1 refusal) is rate-limited per destination
//!   address and switch port, and so is every HELLO per source
//!   ([`ratelimit`]); what is over the limit is dropped and counted.
//! * No reply tells a member from a stranger. The replies that exist:
//!   - to HELLO: CHALLENGE (inside the prefixes, rank in range) or NACK 1,
//!     3 or 4; JOIN: NACK 1..=9 echoing its nonce, or JOIN_ACK. These
//!     depend only on the job's declaration and on the message itself
//!     (proving the secret), not on who is a member;
//!   - to DATA/HEARTBEAT of a wrong generation: NACK 7, identical for
//!     every source inside the prefixes (a worker learns that the switch
//!     restarted), and NACK 1 for a removed job, likewise;
//!   - to DATA/HEARTBEAT of the current generation: the RESULT resend, the
//!     HEARTBEAT answer and NACK 6 only to the rank's bound member (its
//!     MAC, IP and UDP port, on its switch port); a frame from anything
//!     else, a member's spoofed address on another port included, is
//!     dropped and counted and gets nothing, as from any stranger;
//!   - LEAVE is never answered.
//!
//!   Every answer leaves from the port the message came to as its shell
//!   reports it (switchd: `agg_port`), except a RESULT to a member granted
//!   lane replies (`LANE_REPLIES` on its accepted JOIN, seq lanes L > 1,
//!   not a leaf): it leaves from `agg_port + (seq mod L)`. RESULTs go only
//!   to bound members, so no stranger sees a lane port answer.
//! * Slot pools are charged against the budget before they are allocated;
//!   the sum of declared jobs' [`JobConfig::pool_bytes`] never exceeds it.
//! * A PROVISION is judged before its job is looked up (its job is 0 or
//!   one that does not exist yet) and charged to its source's HELLO budget
//!   first; its answers (CHALLENGE, NACK, PROVISIONED) are smaller than it.
//!   A self-provisioned job is in its tenant's map exactly while it is in
//!   the table; the data path never takes the table's lock for its lease.
//! * Messages that fail before membership (unknown job, malformed) get no
//!   reply, except a JOIN/HELLO for an unknown job (NACK 1, so a typo in a
//!   job id fails fast), a version-1 JOIN from a job's prefixes (a
//!   version-1 NACK) and a version-2 HELLO from them (a version-2 NACK 8
//!   echoing its nonce).

pub mod config;
pub mod counters;
pub mod datapath;
mod encode;
pub mod engine;
pub mod entry;
mod event;
pub mod job;
mod leaf;
pub mod priority;
mod provisioning;
pub mod ratelimit;
mod refusal;
pub mod reply;
mod reservation;
mod spine;
pub mod tenant;
pub mod uplink;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::auth::NonceIssuer;
use crate::wire::{
    self, Header, HeaderRepr, HelloPayload, JoinPayload, LeavePayload, MsgType, NackReason, Nonce,
    WireError, HEADER_LEN, NONCE_LEN,
};

pub use config::{
    human_bytes, Endpoint, Ipv4Prefix, JobConfig, JobConfigError, Source, SpineAddr, Upstream,
    MAX_ALLOWED_SOURCES, MAX_POOL_SLOTS, UPSTREAM,
};
pub use counters::{
    CounterSchema, DropReason, JobCounters, JobDrops, SpineCounters, TableCounters, MALFORMED_KINDS,
};
pub use datapath::{DataOutcome, DataPath, Fast, JobCore, ResultTokens};
pub use encode::{Encoded, ResultHead, MAX_MISSING_LISTED};
pub use event::{Event, JobEnd};
pub use job::{Job, JobState, JoinContext, JoinOutcome, Resized, ResultView};
pub use priority::{Priority, PriorityBoard, UnknownPriority};
pub use refusal::{QuotaRefusal, Refusal, RefusalSample, Verdict, REFUSAL_KINDS};
pub use reply::{Reply, ReplyMsg, REPLY_QUEUE_CAPACITY};
pub use reservation::{Reservation, ResizeError, ResizeReservation};
pub use tenant::{JobLabel, JobOrigin, TenantConfig, TenantError};

use provisioning::Tenant;
use ratelimit::{RateLimiter, HELLO_LIMIT, NACK_LIMIT};
use reply::{Pending, ReplyQueue};

/// How long a CHALLENGE's nonce may be used in a JOIN.
pub const DEFAULT_NONCE_LIFETIME: Duration = Duration::from_secs(10);
/// Events kept for the log between two drains.
pub const EVENT_QUEUE_CAPACITY: usize = 256;
/// Copies of a leaf's LEAVE to each spine.
const LEAVE_COPIES: usize = 3;

/// How the table is set up.
#[derive(Clone)]
pub struct TableConfig {
    /// The switch generation: random at start, never 0.
    pub gen: u32,
    /// Key of the nonce tags: random at start, never leaves the switch.
    pub nonce_key: [u8; 32],
    pub nonce_lifetime: Duration,
    /// Bytes all slot pools together may take.
    pub pool_budget: u64,
    /// Seq lanes of every job's slot engine (a power of two; see
    /// [`engine`]'s module docs): the lanes the switch steers to its
    /// dataplane threads. 1: one floor per job.
    pub seq_lanes: u16,
    /// Float32 elements that fit the switch's frames: a provisioned job's
    /// chunk is [`config::max_elems_for`] of it for its dtype, auth and
    /// statistics, as a declared job's default.
    pub max_f32_elems: u16,
    /// The same for an `auth = "mac"` job, whose tagged RESULT must leave
    /// from one TX frame: at most [`TableConfig::max_f32_elems`], and at
    /// most one frame's worth when the sockets are multi-buffer.
    pub max_f32_elems_mac: u16,
}

impl TableConfig {
    /// Defaults: nonce lifetime [`DEFAULT_NONCE_LIFETIME`], no budget.
    pub fn new(gen: u32, nonce_key: [u8; 32]) -> TableConfig {
        TableConfig {
            gen,
            nonce_key,
            nonce_lifetime: DEFAULT_NONCE_LIFETIME,
            pool_budget: u64::MAX,
            seq_lanes: 1,
            // What a 1500-byte MTU carries: fits every port switchd serves.
            max_f32_elems: wire::elems_per_chunk_for_mtu(1500),
            max_f32_elems_mac: wire::elems_per_chunk_for_mtu(1500),
        }
    }
}

/// Every job of the switch.
#[derive(Debug)]
pub struct JobTable {
    gen: u32,
    issuer: NonceIssuer,
    /// The key leaves derive their uplink hello nonces from (and RESULT
    /// epochs: [`crate::tag::epoch`]).
    uplink_key: [u8; 32],
    /// JOINs judged so far: each gets its own epoch, so no two activations
    /// within this generation share one.
    joins_judged: u64,
    jobs: FxHashMap<u16, Job>,
    /// The jobs' data-path halves, for the dataplane threads.
    data_path: Arc<DataPath>,
    /// Jobs removed while running, with their allowed prefixes: their
    /// workers' DATA gets NACK 1 (so they fail with a clear error instead
    /// of stalling), strangers' nothing.
    removed: HashMap<u16, Vec<Ipv4Prefix>>,
    /// The LEAVEs to its spines of a provisioned leaf job that ended when
    /// its last rank left (job, spine → the encoded LEAVE): the job is gone
    /// before its queued [`ReplyMsg::UpLeave`]s are encoded, so they are
    /// encoded from here. Cleared when no reply waits any more
    /// ([`JobTable::handle_timeout`]) or the id is used again.
    departing: HashMap<(u16, u16), Vec<u8>>,
    /// Ids reserved but not yet inserted.
    reserved: HashSet<u16>,
    pool_budget: u64,
    pool_in_use: u64,
    seq_lanes: u16,
    replies: ReplyQueue,
    /// Per-source limits on HELLOs taken and NACKs sent.
    hello_limit: RateLimiter,
    nack_limit: RateLimiter,
    events: VecDeque<Event>,
    /// Refused join attempts by kind ([`Refusal::index`]), and the last of each.
    refusals: [u64; REFUSAL_KINDS],
    last_refusal: [Option<RefusalSample>; REFUSAL_KINDS],
    pub counters: TableCounters,
    /// Malformed messages by kind ([`MALFORMED_KINDS`]).
    pub malformed: [u64; MALFORMED_KINDS.len()],
    /// Tenants, in the order added, with their jobs by name
    /// ([`provisioning`]).
    tenants: Vec<Tenant>,
    /// [`TableConfig::max_f32_elems`] and [`TableConfig::max_f32_elems_mac`].
    max_f32_elems: u16,
    max_f32_elems_mac: u16,
}

fn malformed_index(e: &WireError) -> usize {
    match e {
        WireError::Truncated { .. } => 0,
        WireError::BadVersion(_) => 1,
        WireError::UnknownType(_) => 2,
        WireError::ReservedFlags(_) => 3,
        WireError::ZeroJob => 4,
        WireError::PayloadLength { .. } | WireError::UnknownNackReason(_) => 5,
    }
}

const ZERO_NONCE: Nonce = [0; NONCE_LEN];

impl JobTable {
    pub fn new(cfg: TableConfig, now: Instant) -> JobTable {
        JobTable {
            data_path: Arc::new(DataPath::new(cfg.gen.max(1), now)),
            gen: cfg.gen.max(1),
            issuer: NonceIssuer::new(cfg.nonce_key, now, cfg.nonce_lifetime),
            uplink_key: cfg.nonce_key,
            joins_judged: 0,
            jobs: FxHashMap::default(),
            removed: HashMap::new(),
            departing: HashMap::new(),
            reserved: HashSet::new(),
            pool_budget: cfg.pool_budget,
            pool_in_use: 0,
            seq_lanes: crate::wire::seq_lanes_from_wire(cfg.seq_lanes),
            replies: ReplyQueue::new(),
            hello_limit: RateLimiter::new(HELLO_LIMIT, &cfg.nonce_key, b"hello", now),
            nack_limit: RateLimiter::new(NACK_LIMIT, &cfg.nonce_key, b"nack", now),
            events: VecDeque::with_capacity(EVENT_QUEUE_CAPACITY),
            refusals: [0; REFUSAL_KINDS],
            last_refusal: [None; REFUSAL_KINDS],
            counters: TableCounters::default(),
            malformed: [0; MALFORMED_KINDS.len()],
            tenants: Vec::new(),
            max_f32_elems: cfg.max_f32_elems,
            max_f32_elems_mac: cfg.max_f32_elems_mac.min(cfg.max_f32_elems),
        }
    }

    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// The lock-free data path over these jobs ([`datapath`]): dataplane
    /// threads try it first and hand the table only what it returns as
    /// [`Fast::Slow`].
    pub fn data_path(&self) -> Arc<DataPath> {
        self.data_path.clone()
    }

    /// The table's counters, with the RESULTs the fast path sent.
    pub fn table_counters(&self) -> TableCounters {
        let mut c = self.counters.clone();
        c.results_sent += self.data_path.results_sent();
        c
    }

    pub fn get(&self, id: u16) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub fn get_mut(&mut self, id: u16) -> Option<&mut Job> {
        self.jobs.get_mut(&id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    fn queue(&mut self, p: Pending) {
        enqueue(&mut self.replies, &mut self.counters, p);
    }

    /// The lane replies a JOIN with header `hdr` is granted
    /// ([`Endpoint::result_lanes`]): the switch's seq lanes when it asks
    /// ([`wire::flags::LANE_REPLIES`]) and there are more than one, 0
    /// otherwise. A leaf's JOIN (`UPSTREAM`) is never granted: a leaf takes
    /// its spines' RESULTs from their aggregation port only. The grant
    /// lives in the member's endpoint, so the next accepted JOIN replaces
    /// it, and one without the flag ends it.
    fn lane_replies_for(&self, hdr: &HeaderRepr) -> u16 {
        let asks = hdr.has_flag(wire::flags::LANE_REPLIES) && !hdr.has_flag(wire::flags::UPSTREAM);
        if asks && self.seq_lanes > 1 {
            self.seq_lanes
        } else {
            0
        }
    }

    fn reply(&mut self, to: Endpoint, job: u16, rank: u16, msg: ReplyMsg) {
        self.queue(Pending::One(Reply { to, job, rank, msg }));
    }

    /// Queues a NACK unless its destination's rate is spent (then counts
    /// it): every NACK goes through here, whatever it answers.
    fn nack(
        &mut self,
        to: Endpoint,
        job: u16,
        rank: u16,
        reason: NackReason,
        echo: Nonce,
        now: Instant,
    ) {
        if self.nack_allowed(&to, now) {
            self.reply(to, job, rank, ReplyMsg::Nack { reason, echo });
        }
    }

    /// Refuses a HELLO or JOIN with a NACK echoing its nonce; false if the
    /// source's handshake budget is spent. Charged to the HELLO limit, not
    /// the NACK limit: a worker whose job was removed learns it from the
    /// answer to its probe (a HELLO), which reaches us behind a window of
    /// its DATA; were that DATA's NACKs and the probe's answer one budget,
    /// the DATA would spend it first on every round and the worker would
    /// stall instead of being told (docs/PROTOCOL.md, "Limits").
    fn refuse_handshake(
        &mut self,
        to: Endpoint,
        job: u16,
        rank: u16,
        reason: NackReason,
        echo: Nonce,
        now: Instant,
    ) -> bool {
        if !self.hello_allowed(&to, now) {
            return false;
        }
        self.reply(to, job, rank, ReplyMsg::Nack { reason, echo });
        true
    }

    /// Whether a HELLO from `from` (or the refusal of one, or of a JOIN) is
    /// within its source's rate; counts it if not.
    fn hello_allowed(&mut self, from: &Endpoint, now: Instant) -> bool {
        let ok = self.hello_limit.allow(from.source.ip, from.port_idx, now);
        if !ok {
            self.counters.hello_rate_limited += 1;
        }
        ok
    }

    fn nack_allowed(&mut self, to: &Endpoint, now: Instant) -> bool {
        let ok = self.nack_limit.allow(to.source.ip, to.port_idx, now);
        if !ok {
            self.counters.nack_rate_limited += 1;
        }
        ok
    }

    fn refused(&mut self, job: u16, rank: u16, ip: [u8; 4], why: Refusal) {
        let k = why.index();
        self.refusals[k] += 1;
        self.last_refusal[k] = Some(RefusalSample { job, rank, ip, why });
    }

    /// Refused join attempts so far, by kind ([`Refusal::index`]).
    pub fn refusals(&self) -> &[u64; REFUSAL_KINDS] {
        &self.refusals
    }

    /// The last refusal of kind `k`, if any.
    pub fn last_refusal(&self, k: usize) -> Option<RefusalSample> {
        self.last_refusal.get(k).copied().flatten()
    }

    fn event(&mut self, e: Event) {
        if self.events.len() >= EVENT_QUEUE_CAPACITY {
            self.counters.events_dropped += 1;
        } else {
            self.events.push_back(e);
        }
    }

    /// Feeds one datagram (the UDP payload) from `from`; `ce` is whether its
    /// IP header carried CE (or the switch's own queues were congested).
    pub fn handle(&mut self, datagram: &[u8], from: Endpoint, ce: bool, now: Instant) -> Verdict {
        self.data_path.board().tick(now);
        let hdr = match Header::new_checked(datagram).and_then(|h| HeaderRepr::parse(&h)) {
            Ok(h) => h,
            Err(e) => {
                self.malformed[malformed_index(&e)] += 1;
                // Only a whole version-1 JOIN (36-byte payload) of a job
                // this source may join: the refusal is smaller than it.
                if let Some((ty, job, rank)) = wire::peek_v1(datagram) {
                    let allowed = self
                        .jobs
                        .get(&job)
                        .is_some_and(|j| j.source_allowed(from.source.ip));
                    if ty == MsgType::Join as u8 && datagram.len() == HEADER_LEN + 36 && allowed {
                        self.counters.version_refused += 1;
                        if self.nack_allowed(&from, now) {
                            self.reply(from, job, rank, ReplyMsg::VersionRefusal);
                        }
                        self.refused(job, rank, from.source.ip, Refusal::Version(1));
                    }
                }
                // A version-2 or version-3 worker's HELLO: refused in its
                // own version, so that it names the problem instead of timing
                // out; on the HELLO budget, as every refusal of a HELLO.
                if let Some((version, job, rank, echo)) = wire::peek_old_hello(datagram) {
                    let allowed = self
                        .jobs
                        .get(&job)
                        .is_some_and(|j| j.source_allowed(from.source.ip));
                    if allowed {
                        self.counters.version_refused += 1;
                        if self.hello_allowed(&from, now) {
                            let msg = ReplyMsg::OldRefusal { version, echo };
                            self.reply(from, job, rank, msg);
                        }
                        self.refused(job, rank, from.source.ip, Refusal::Version(version));
                    }
                }
                return Verdict::Malformed(e);
            }
        };
        let payload = &datagram[HEADER_LEN..];
        // A PROVISION names a job that need not exist (or 0): handled
        // before the job is looked up.
        if hdr.msg_type == MsgType::Provision {
            return self.on_provision(&hdr, payload, from, now);
        }
        let gen = self.gen;
        let Some(job) = self.jobs.get_mut(&hdr.job) else {
            self.counters.unknown_job += 1;
            let handshake = match hdr.msg_type {
                MsgType::Hello => HelloPayload::parse(payload).map(|h| h.nonce).ok(),
                MsgType::Join => JoinPayload::parse(payload).map(|j| j.nonce).ok(),
                _ => None,
            };
            if let Some(echo) = handshake {
                if !self.refuse_handshake(
                    from,
                    hdr.job,
                    hdr.rank,
                    NackReason::UnknownJob,
                    echo,
                    now,
                ) {
                    return Verdict::RateLimited;
                }
                return Verdict::NackUnknownJob;
            }
            let removed = matches!(hdr.msg_type, MsgType::Data | MsgType::Heartbeat)
                && self
                    .removed
                    .get(&hdr.job)
                    .is_some_and(|prefixes| prefixes.iter().any(|p| p.contains(from.source.ip)));
            if !removed {
                return Verdict::Dropped(None);
            }
            self.nack(
                from,
                hdr.job,
                hdr.rank,
                NackReason::UnknownJob,
                ZERO_NONCE,
                now,
            );
            return Verdict::NackUnknownJob;
        };
        let (job_id, rank) = (hdr.job, hdr.rank);
        // What a switch sends, from one of this leaf's spines.
        if matches!(
            hdr.msg_type,
            MsgType::Result
                | MsgType::JoinAck
                | MsgType::Nack
                | MsgType::Challenge
                | MsgType::Heartbeat
                | MsgType::Provisioned
        ) {
            let src = from.source;
            if let Some(spine) = job.uplink().and_then(|u| u.cfg.spine_at(src.ip, src.port)) {
                let head = datagram
                    .first_chunk::<HEADER_LEN>()
                    .unwrap_or(&[0; HEADER_LEN]);
                return self.on_spine_message(&hdr, head, payload, spine, ce, now);
            }
        }
        match hdr.msg_type {
            MsgType::Data => {
                let out = job.on_data(&hdr, payload, &from, ce, gen);
                match out {
                    DataOutcome::Completed { seq } => self.queue(Pending::ResultToAll {
                        job: job_id,
                        seq,
                        next_rank: 0,
                    }),
                    DataOutcome::Retransmit { seq } => {
                        // To where the DATA came from, under the member's
                        // grant (the DATA was admitted: it is the member).
                        let result_lanes = job.member(rank).map_or(0, |m| m.result_lanes);
                        let to = Endpoint {
                            result_lanes,
                            ..from
                        };
                        self.queue(Pending::One(Reply::resend(to, job_id, rank, seq)));
                    }
                    DataOutcome::Nack(reason) => {
                        self.nack(from, job_id, rank, reason, ZERO_NONCE, now)
                    }
                    DataOutcome::PartialReady { seq } => {
                        if let Some(spine) = job.partial_ready(seq, now) {
                            let msg = ReplyMsg::UpData {
                                spine: spine as u16,
                                seq,
                                retx: false,
                            };
                            self.up(job_id, spine, msg);
                        }
                    }
                    DataOutcome::Taken | DataOutcome::Dropped(_) => {}
                }
                Verdict::Data(out)
            }
            MsgType::Hello => self.on_hello(&hdr, payload, from, now),
            MsgType::Join => self.on_join(&hdr, payload, from, now),
            MsgType::Leave => {
                let Ok(leave) = LeavePayload::parse(payload) else {
                    return Verdict::Dropped(None);
                };
                match job.on_leave(&hdr, &leave, &from, gen) {
                    None => {
                        // A provisioned job ends when every member left.
                        let ended = job.lease().is_some()
                            && job.state() == JobState::Joining
                            && job.joined_ranks() == 0;
                        // A leaf whose ranks all left leaves its spines too,
                        // so their slots start afresh with its next ranks.
                        if job.state() == JobState::Joining {
                            // LEAVE is not acknowledged: a few copies make
                            // its loss rare (docs/PROTOCOL.md, "Leaving").
                            for spine in job.leave_uplink() {
                                if ended {
                                    // Encoded now: the job is removed
                                    // before its replies are encoded.
                                    self.keep_leave(job_id, spine);
                                }
                                let msg = ReplyMsg::UpLeave {
                                    spine: spine as u16,
                                };
                                for _ in 0..LEAVE_COPIES {
                                    self.up(job_id, spine, msg);
                                }
                            }
                        }
                        if ended {
                            drop(self.remove_job(job_id, JobEnd::Left));
                        }
                        Verdict::Noted
                    }
                    Some(r) => Verdict::Dropped(Some(r)),
                }
            }
            MsgType::Heartbeat => match job.admit(&hdr, &from, gen) {
                None => {
                    job.note_activity(now);
                    let answer = job
                        .upstream_wait(hdr.seq, now)
                        .unwrap_or(ReplyMsg::Missing { seq: hdr.seq });
                    self.reply(from, job_id, rank, answer);
                    Verdict::Heartbeat { seq: hdr.seq }
                }
                Some(DataOutcome::Nack(reason)) => {
                    self.nack(from, job_id, rank, reason, ZERO_NONCE, now);
                    Verdict::Data(DataOutcome::Nack(reason))
                }
                Some(DataOutcome::Dropped(r)) => Verdict::Dropped(Some(r)),
                Some(other) => Verdict::Data(other),
            },
            MsgType::Result
            | MsgType::JoinAck
            | MsgType::Nack
            | MsgType::Challenge
            | MsgType::Provision
            | MsgType::Provisioned => {
                job.ctl_drops.bump(DropReason::UnexpectedType);
                self.counters.unexpected_type += 1;
                Verdict::Dropped(Some(DropReason::UnexpectedType))
            }
        }
    }

    fn on_hello(
        &mut self,
        hdr: &HeaderRepr,
        payload: &[u8],
        from: Endpoint,
        now: Instant,
    ) -> Verdict {
        let Ok(hello) = HelloPayload::parse(payload) else {
            return Verdict::Dropped(None);
        };
        // Before any work: each CHALLENGE costs HMACs.
        if !self.hello_allowed(&from, now) {
            return Verdict::RateLimited;
        }
        let Some(job) = self.jobs.get_mut(&hdr.job) else {
            return Verdict::Dropped(None);
        };
        let src = from.source;
        // A refusal is no larger than the HELLO: no amplification, and an
        // operator's typo in allowed_sources is named at once.
        let refusal = if !job.source_allowed(src.ip) {
            Some(NackReason::SourceNotAllowed)
        } else if hdr.rank >= job.n_workers() {
            Some(NackReason::RankOutOfRange)
        } else {
            None
        };
        if let Some(reason) = refusal {
            job.ctl.nacks += 1;
            // The HELLO limit was charged above, once for the HELLO.
            let msg = ReplyMsg::Nack {
                reason,
                echo: hello.nonce,
            };
            self.reply(from, hdr.job, hdr.rank, msg);
            self.refused(hdr.job, hdr.rank, src.ip, Refusal::Nack(reason));
            return Verdict::Join(JoinOutcome::Nack(reason));
        }
        job.ctl.challenges += 1;
        let nonce = self.issuer.issue(now, hdr.job, hdr.rank, src.ip, src.port);
        let msg = ReplyMsg::Challenge {
            hello_nonce: hello.nonce,
            nonce,
        };
        self.reply(from, hdr.job, hdr.rank, msg);
        Verdict::Challenged
    }

    fn on_join(
        &mut self,
        hdr: &HeaderRepr,
        payload: &[u8],
        mut from: Endpoint,
        now: Instant,
    ) -> Verdict {
        let Ok(join) = JoinPayload::parse(payload) else {
            return Verdict::Dropped(None);
        };
        from.result_lanes = self.lane_replies_for(hdr);
        self.joins_judged += 1;
        let cx = JoinContext {
            gen: self.gen,
            issuer: &self.issuer,
            now,
            epoch: crate::tag::epoch(&self.uplink_key, self.joins_judged),
        };
        let Some(job) = self.jobs.get_mut(&hdr.job) else {
            return Verdict::Dropped(None);
        };
        let resets = job.ctl.resets;
        let repeats = job.ctl.join_repeats;
        let job_dtype = job.config.dtype;
        let job_n = job.n_workers();
        let outcome = job.on_join(hdr, &join, from, &cx);
        // A waiting rank resends its JOIN every 200 ms: said once, not per copy.
        let repeat = job.ctl.join_repeats != repeats;
        if matches!(
            outcome,
            JoinOutcome::Activated | JoinOutcome::Waiting | JoinOutcome::AckAgain
        ) {
            job.note_activity(now);
        }
        let reset = job.ctl.resets != resets;
        let (n, joined, resume) = (job.n_workers(), job.joined_ranks(), job.resume_point());
        let (job_id, rank, ip) = (hdr.job, hdr.rank, from.source.ip);
        if reset {
            self.event(Event::JobReset { job: job_id, rank });
        }
        match outcome {
            JoinOutcome::Nack(reason) => {
                self.refuse_handshake(from, job_id, rank, reason, join.nonce, now);
                let why = match reason {
                    NackReason::ParametersDiffer if join.dtype != job_dtype as u8 => {
                        Refusal::DtypeDiffers {
                            job: job_dtype,
                            join: join.dtype,
                        }
                    }
                    NackReason::ParametersDiffer if join.n_workers != job_n => {
                        Refusal::WorkersDiffer {
                            job: job_n,
                            join: join.n_workers,
                        }
                    }
                    _ => Refusal::Nack(reason),
                };
                self.refused(job_id, rank, ip, why);
            }
            JoinOutcome::Replayed => self.refused(job_id, rank, ip, Refusal::Replayed),
            JoinOutcome::Activated => {
                self.queue(Pending::JoinAckToAll {
                    job: job_id,
                    next_rank: 0,
                });
                if let Some(job) = self.jobs.get_mut(&job_id) {
                    job.start_uplink(now);
                }
                self.handle_timeout(now);
                self.event(Event::JobActive {
                    job: job_id,
                    ranks: n,
                    resume,
                });
            }
            JoinOutcome::AckAgain => {
                if let Some(to) = self.jobs.get(&job_id).and_then(|j| j.member(rank)).copied() {
                    self.reply(to, job_id, rank, ReplyMsg::JoinAck);
                }
            }
            JoinOutcome::Waiting => {
                if !reset && !repeat && joined > 0 {
                    self.event(Event::RankJoined {
                        job: job_id,
                        rank,
                        joined,
                        of: n,
                    });
                }
            }
        }
        Verdict::Join(outcome)
    }

    /// Sends what is due by `now` on every leaf's uplink: HELLOs and JOINs to
    /// spines not joined, partials their spine has not answered in time.
    /// Shells call it every few milliseconds (cheap when nothing is due).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire_leases(now);
        if !self.departing.is_empty() && self.replies.is_empty() {
            // Every queued LEAVE of an ended leaf job went out.
            self.departing.clear();
        }
        let replies = &mut self.replies;
        let counters = &mut self.counters;
        let events = &mut self.events;
        for job in self.jobs.values_mut() {
            let Some(u) = job.uplink() else {
                continue;
            };
            let (id, rank) = (job.id(), u.cfg.leaf_index);
            let silent = job.up_timeout(now, &mut |addr, msg| {
                let to = addr.endpoint();
                let reply = Reply {
                    to,
                    job: id,
                    rank,
                    msg,
                };
                enqueue(replies, counters, Pending::One(reply));
            });
            let Some(u) = job.uplink() else {
                continue;
            };
            for (tree, s) in u.spines.iter().enumerate() {
                let Some(silent) = s.silent_for(now).filter(|_| silent & (1 << tree) != 0) else {
                    continue;
                };
                if events.len() < EVENT_QUEUE_CAPACITY {
                    events.push_back(Event::SpineSilent {
                        job: id,
                        tree: tree as u16,
                        spine: u.cfg.spines[tree],
                        silent,
                    });
                }
            }
        }
    }

    /// The next reply to send, if any. Replies to every member are expanded
    /// here, one rank per call.
    pub fn poll_reply(&mut self) -> Option<Reply> {
        loop {
            let (job, next_rank, msg) = match *self.replies.front_mut()? {
                Pending::One(r) => {
                    self.replies.pop();
                    self.count_reply(&r, true);
                    return Some(r);
                }
                Pending::ResultToAll {
                    job,
                    seq,
                    next_rank,
                } => (job, next_rank, ReplyMsg::Result { seq, retx: false }),
                Pending::JoinAckToAll { job, next_rank } => (job, next_rank, ReplyMsg::JoinAck),
            };
            // One lookup per reply: the member, and the job's count.
            let found = self.jobs.get_mut(&job).and_then(|j| {
                let m = j.member_from(next_rank)?;
                if matches!(msg, ReplyMsg::Result { .. }) {
                    j.ctl.results_sent += 1;
                }
                Some(m)
            });
            let Some((rank, to)) = found else {
                // Past the last member.
                self.replies.pop();
                continue;
            };
            match (self.replies.front_mut(), rank.checked_add(1)) {
                (
                    Some(
                        Pending::ResultToAll { next_rank, .. }
                        | Pending::JoinAckToAll { next_rank, .. },
                    ),
                    Some(next),
                ) => *next_rank = next,
                _ => self.replies.pop(),
            }
            let r = match msg {
                ReplyMsg::Result { seq, .. } => Reply::result(to, job, rank, seq),
                _ => Reply { to, job, rank, msg },
            };
            self.count_reply(&r, false);
            return Some(r);
        }
    }

    /// Counts `r` on the table (and on its job when `per_job`; a fan-out
    /// counts its job where it looks the member up).
    fn count_reply(&mut self, r: &Reply, per_job: bool) {
        match r.msg {
            ReplyMsg::Result { .. } => {
                self.counters.results_sent += 1;
                if per_job {
                    if let Some(j) = self.jobs.get_mut(&r.job) {
                        j.ctl.results_sent += 1;
                    }
                }
            }
            ReplyMsg::JoinAck => self.counters.join_acks_sent += 1,
            ReplyMsg::Challenge { .. } | ReplyMsg::ProvisionChallenge { .. } => {
                self.counters.challenges_sent += 1
            }
            ReplyMsg::Nack { .. }
            | ReplyMsg::VersionRefusal
            | ReplyMsg::OldRefusal { .. }
            | ReplyMsg::ProvisionRefusal { .. } => self.counters.nacks_sent += 1,
            ReplyMsg::Provisioned { .. } => {}
            ReplyMsg::Missing { .. } | ReplyMsg::UpstreamWait { .. } => {}
            ReplyMsg::UpHello { .. }
            | ReplyMsg::UpProbe { .. }
            | ReplyMsg::UpJoin { .. }
            | ReplyMsg::UpData { .. }
            | ReplyMsg::UpLeave { .. }
            | ReplyMsg::UpHeartbeat { .. }
            | ReplyMsg::UpProvision { .. } => {}
        }
    }

    /// Whether replies are waiting.
    pub fn has_replies(&self) -> bool {
        !self.replies.is_empty()
    }

    /// The next event for the log, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

/// Queues `p`, or counts it when the queue is full. Apart from `JobTable`
/// so that the closures lent to a leaf job's uplink (which borrows the job
/// out of the table) can queue as [`JobTable::queue`] does.
fn enqueue(replies: &mut ReplyQueue, counters: &mut TableCounters, p: Pending) {
    if !replies.push(p) {
        counters.reply_queue_full += 1;
    }
}

#[cfg(test)]
mod tests;
