//! One job's state machine: membership by authenticated JOIN, activation,
//! the resume point, the window floor, and DATA into the slot pool.
//!
//! Owns: [`Job`] (its declaration, members, pool and counters) and the
//! outcome of a JOIN ([`JoinOutcome`]); the table turns outcomes into
//! queued replies. A DATA's outcome ([`DataOutcome`]) is the data path's.
//!
//! Layering: above `datapath` (a job's [`JobCore`]) and `uplink` (a leaf
//! job's [`Uplink`] sessions); the methods of a leaf job that drive those
//! sessions are in `leaf.rs`, above this module.
//!
//! Invariants:
//! * A seq is taken only inside the window `[floor, floor + W)`, where
//!   `floor` is the job's oldest incomplete seq and `W ≤ S`; seqs in the
//!   window map to distinct slots, so a slot never holds two live seqs.
//! * A rejected message changes nothing but a counter.
//! * Membership changes only on a JOIN that proves the secret over a nonce
//!   this switch issued to that rank and address, newer than any the rank
//!   used before and younger than the nonce lifetime (docs/PROTOCOL.md,
//!   "Joining"). A copy of the accepted JOIN changes nothing (an active job
//!   answers it with the JOIN_ACK again, to the member's recorded address);
//!   an older one is a replay: counted, unanswered.
//! * A member is bound by its accepted JOIN to its source (MAC, IP, UDP
//!   port) and to the switch port the JOIN arrived on. DATA, HEARTBEAT and
//!   LEAVE for its rank from anything else are dropped and counted
//!   (`source_mismatch`, or `wrong_port` when only the switch port differs:
//!   a spoofed frame from another host), never summed, never answered.
//!   LEAVE carries a MAC over the accepted nonce. The accepted JOIN's lane
//!   replies grant (`Endpoint::result_lanes`, decided by the table) is part
//!   of the recorded endpoint: the next accepted JOIN replaces it, a copy
//!   of the accepted one changes nothing, and the JOIN_ACK says it
//!   (`LANE_REPLIES`, under its tag).
//! * The binding, with the session key its JOIN made, outlives a reset to
//!   joining (the rank's last accepted JOIN under this generation), so that
//!   only the member itself hears NACK 6, authenticated (docs/PROTOCOL.md,
//!   "Sessions"). A LEAVE spends the accepted nonce: a copy of that JOIN
//!   afterwards is a replay, not a new membership.
//! * Answers at the current generation never tell a member's address from
//!   a stranger's: only the bound member (its source on its switch port)
//!   is answered (HEARTBEAT, RESULT resend, NACK 6); everyone else gets
//!   nothing. A wrong generation is answered the same way (NACK 7) for any
//!   source inside the prefixes, member or not.
//! * In an `auth = "mac"` job a DATA is summed only if, after the source
//!   binding above admits it, its tag verifies under the member's DATA key
//!   (derived from the session key of its latest accepted JOIN); a slot's
//!   RESULT tag is computed once, when it completes, under the activation's
//!   RESULT key, and kept with the shadow, so every member and every resend
//!   gets the same bytes (docs/PROTOCOL.md, "Per-packet authentication").
//!   A reduce-scatter's or all-gather's chunk also has its NOVAL RESULT,
//!   tagged once beside it.
//! * Reduce-scatter and all-gather are served by a job that is neither a
//!   leaf nor a spine (a job whose member joined with `UPSTREAM`); those
//!   answer such DATA from the bound member with NACK 10, rate-limited like
//!   every NACK, and never let it reach a slot.
//! * A resize ([`Job::apply_resize`], docs/PROTOCOL.md, "Elastic jobs")
//!   swaps in a new slot engine for the new n: no shadow of the old
//!   membership can answer a DATA of the new one. It clears the members
//!   (the job joins again) and keeps the ranks' bindings and accepted
//!   serials, so a former member, even of a rank the new n no longer has,
//!   hears an authenticated NACK 6 and old JOINs stay replays; ranks the
//!   old n did not have take only nonces issued after the resize.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{self, JoinClaim, NonceIssuer};
use crate::seq::serial_lt;
use crate::tag::{self, AuthMode, PacketKey, Tag, TokenCache, EPOCH_LEN, TAG_LEN};
use crate::wire::{
    flags, Dtype, HeaderRepr, JoinAckPayload, JoinPayload, Kind, LeavePayload, MsgType, NackReason,
    Nonce, OP_SUM,
};

use super::config::{Endpoint, JobConfig, JobConfigError};
use super::counters::{DropReason, JobCounters, JobDrops};
use super::datapath::{Admission, DataOutcome, JobCore};
use super::engine::{ResultRef, SlotEngine};
use super::priority::{JobPriority, Priority, PriorityBoard};
use super::tenant::JobOrigin;
use super::uplink::Uplink;
use crate::provision::{JobName, TenantName};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for all ranks to JOIN under the current generation.
    Joining,
    /// All ranks joined; DATA is taken.
    Active,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Joining => "joining",
            JobState::Active => "active",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    endpoint: Endpoint,
    resume_collective: u32,
    resume_seq: u32,
    /// The nonce of the JOIN accepted for this membership (LEAVE's MAC
    /// covers it).
    nonce: Nonce,
    left: bool,
    /// Joined with `UPSTREAM`: a leaf switch, so this job is a spine's.
    upstream: bool,
}

/// Bytes an `auth = "mac"` job keeps besides those of an `auth = "port"`
/// one, per rank (its DATA key) and per slot (its RESULT tag); see
/// [`JobConfig::pool_bytes`].
#[cfg(test)]
pub(super) fn mac_bytes() -> (usize, usize) {
    (
        std::mem::size_of::<Option<PacketKey>>(),
        std::mem::size_of::<Option<ResultTags>>(),
    )
}

/// Bytes a job keeps per rank besides its pool (see [`JobConfig::pool_bytes`]).
#[cfg(test)]
pub(super) fn per_rank_bytes() -> usize {
    std::mem::size_of::<Option<Member>>()
        + std::mem::size_of::<u64>()
        + std::mem::size_of::<Option<Bound>>()
}

/// The rank's last accepted JOIN under this generation: where it is bound
/// (its source and the switch port the JOIN came in on) and the session key
/// it made (docs/PROTOCOL.md, "Sessions"). Kept when the job goes back to
/// joining, so only the member itself hears NACK 6, authenticated.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Bound {
    endpoint: Endpoint,
    key: [u8; 32],
    /// Its LEAVE verified: the accepted nonce is spent.
    left: bool,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("endpoint", &self.endpoint)
            .field("key", &"<redacted>")
            .field("left", &self.left)
            .finish()
    }
}

/// A job's slot pool and rank tables for a new worker count, allocated
/// before they are swapped in ([`Job::try_resized`], [`Job::apply_resize`]).
#[derive(Debug)]
pub struct Resized {
    core: Arc<JobCore>,
    members: Vec<Option<Member>>,
    accepted_serial: Vec<u64>,
    bound: Vec<Option<Bound>>,
    data_keys: Option<Vec<Option<PacketKey>>>,
}

impl Resized {
    /// The worker count it was made for.
    pub fn n_workers(&self) -> u16 {
        self.members.len() as u16
    }

    /// Its data-path half (the pool), to be dropped where it costs nothing.
    pub fn into_core(self) -> Arc<JobCore> {
        self.core
    }
}

/// What to do after a JOIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    /// Refuse: send a NACK with this reason to the sender.
    Nack(NackReason),
    /// Recorded (or a copy of the recorded JOIN); waiting for the other
    /// ranks. Send nothing.
    Waiting,
    /// The job just became active: send JOIN_ACK to every member.
    Activated,
    /// A copy of an active member's JOIN: send its JOIN_ACK again.
    AckAgain,
    /// A nonce older than the rank's accepted one: dropped, unanswered.
    Replayed,
}

/// A completed or cached result, ready to be sent; no completion can
/// overwrite it while this is held.
pub struct ResultView<'a> {
    pub seq: u32,
    pub collective: u32,
    pub ece: bool,
    pub window: u16,
    pub count: u16,
    pub dtype: Dtype,
    /// The collective's kind and the chunk's owner.
    pub kind: Kind,
    pub owner: u16,
    /// The view of a rank that gets a NOVAL RESULT: no payload.
    pub no_values: bool,
    /// The shadow, read-locked: its payload is [`ResultView::payload`].
    data: ResultRef<'a>,
    /// The payload's folded Internet checksum sum, made once per result
    /// ([`crate::checksum`]).
    pub payload_sum: u16,
    /// In an `auth = "mac"` job: the tag that follows the payload.
    pub tag: Option<Tag>,
}

impl ResultView<'_> {
    /// The RESULT payload: `count` little-endian elements of `dtype`
    /// (none in a NOVAL RESULT).
    pub fn payload(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The result's values, widened to float32 (for tests and tools;
    /// empty in a NOVAL RESULT).
    pub fn values(&self) -> Vec<f32> {
        if self.no_values {
            return Vec::new();
        }
        let mut v = vec![0f32; self.count as usize];
        crate::elements::read_le(self.dtype, self.payload(), &mut v);
        v
    }
}

/// What the switch knows when it judges a JOIN.
pub struct JoinContext<'a> {
    pub gen: u32,
    pub issuer: &'a NonceIssuer,
    pub now: Instant,
    /// The epoch this JOIN's activation would use ([`tag::epoch`]): never
    /// the same twice within a generation.
    pub epoch: [u8; EPOCH_LEN],
}

/// An `auth = "mac"` job's DATA keys and RESULT tags.
#[derive(Debug)]
struct MacState {
    /// Per rank, the DATA key of its accepted JOIN.
    data_keys: Vec<Option<PacketKey>>,
    /// Per slot: the tags of its shadow's RESULT.
    result_tags: Vec<Option<ResultTags>>,
}

/// The tags of one completed seq's RESULT, made once when it completes.
#[derive(Debug, Clone, Copy)]
struct ResultTags {
    seq: u32,
    /// The window the tags cover (resends carry it too).
    window: u16,
    /// The tag of the RESULT with values.
    values: Tag,
    /// A reduce-scatter's or all-gather's: the tag of its NOVAL RESULT.
    noval: Option<Tag>,
}

/// One job: its declaration, members, slots and counters.
#[derive(Debug)]
pub struct Job {
    pub config: JobConfig,
    state: JobState,
    members: Vec<Option<Member>>,
    /// Per rank, the serial of the newest nonce accepted from it (never
    /// reset while the job exists: replays stay replays).
    accepted_serial: Vec<u64>,
    /// Per rank, where its last accepted JOIN bound it and its session key
    /// (kept across resets). With `members` and `accepted_serial`, under the
    /// n × 192 bytes per job that [`JobConfig::pool_bytes`] charges for its
    /// ranks.
    bound: Vec<Option<Bound>>,
    /// Nonces issued before the job was declared are replays.
    min_serial: u64,
    joined: u16,
    pub(super) resume_collective: u32,
    pub(super) resume_seq: u32,
    /// Set by a resize: the point the old members stopped at. The next
    /// activation resumes there unless a member reports a later point
    /// (fresh workers report (0, 0)), so seq numbering continues.
    resize_point: Option<(u32, u32)>,
    /// What the data path shares: the slot engine (window, floor, sums),
    /// the admission snapshot and the data-path counters.
    pub(super) core: Arc<JobCore>,
    /// A leaf's spine sessions, and per slot its partial's resend timer.
    pub(super) uplink: Option<Uplink>,
    pub(super) up_timers: Vec<UpTimer>,
    /// The RESULT epoch of the current (or last) activation.
    epoch: [u8; EPOCH_LEN],
    /// The RESULT key of the current activation, in either auth mode: it
    /// tags a mac job's RESULTs and makes a port job's tokens.
    result_key: Option<PacketKey>,
    /// The last token `result_key` made: a fan-out the table encodes
    /// RESULT by RESULT makes one (cleared with every new key).
    last_token: TokenCache,
    mac: Option<MacState>,
    /// Counts of the control path (under the table lock); the data path's
    /// are in `core` ([`Job::counters`] sums both).
    pub(super) ctl: JobCounters,
    pub(super) ctl_drops: JobDrops,
    /// Declared by the operator or provisioned by a tenant's worker.
    origin: JobOrigin,
    /// A provisioned job's idle lease; `None` for a declared job.
    lease: Option<Lease>,
}

/// A provisioned job's idle lease (docs/PROTOCOL.md, "Leases"). Activity
/// is sampled, not recorded per packet: the table compares the data
/// path's DATA counts with the last value it saw ([`Job::lease_tick`]), and
/// notes what it handles itself (JOIN, HEARTBEAT, claims).
#[derive(Debug, Clone, Copy)]
struct Lease {
    lease: Duration,
    last_active: Instant,
    /// DATA counted by the data path when last sampled.
    seen: u64,
}

/// When a leaf's partial went up, and when it goes again.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct UpTimer {
    pub(super) sent_at: Option<Instant>,
    pub(super) deadline: Option<Instant>,
    pub(super) resends: u32,
    /// Resent early once already ([`Job::up_fast_retransmit`]).
    pub(super) fast_resent: bool,
}

/// The slot engine of `config`'s job for `n` ranks, allocated fallibly:
/// one place for a new job and a resized one, so that a resize keeps
/// everything the job declared (its statistics, its seq lanes).
fn job_engine(
    config: &JobConfig,
    n: u16,
    seq_lanes: u16,
) -> Result<SlotEngine, std::collections::TryReserveError> {
    SlotEngine::try_with_stats(
        config.pool_slots,
        n,
        config.elems_per_chunk,
        config.dtype,
        config.upstream.is_some(),
        config.window.min(config.pool_slots),
        config.stats,
    )?
    .try_with_lanes(seq_lanes)
}

impl Job {
    /// Allocates the job (its pool is the bulk; see
    /// [`JobConfig::pool_bytes`]); nonces below `min_serial` are replays.
    pub fn try_new(
        config: JobConfig,
        min_serial: u64,
        nonce_key: [u8; 32],
        board: Arc<PriorityBoard>,
        seq_lanes: u16,
    ) -> Result<Job, JobConfigError> {
        let oom = JobConfigError::OutOfMemory {
            id: config.id,
            need: config.pool_bytes(),
        };
        let leaf = config.upstream.is_some();
        let engine = job_engine(&config, config.n_workers, seq_lanes).map_err(|_| oom.clone())?;
        let core = Arc::new(JobCore::new(
            config.id,
            config.dtype,
            config.elems_per_chunk,
            config.auth == AuthMode::Mac,
            engine,
            JobPriority::new(config.priority, board),
        ));
        let uplink = config
            .upstream
            .clone()
            .map(|u| Uplink::new(u, config.id, config.secret, nonce_key));
        let mut up_timers = Vec::new();
        if leaf {
            up_timers
                .try_reserve_exact(config.pool_slots as usize)
                .map_err(|_| oom.clone())?;
            up_timers.resize(config.pool_slots as usize, UpTimer::default());
        }
        let n = config.n_workers as usize;
        let mut members = Vec::new();
        members.try_reserve_exact(n).map_err(|_| oom.clone())?;
        members.resize(n, None);
        let mut accepted_serial = Vec::new();
        accepted_serial
            .try_reserve_exact(n)
            .map_err(|_| oom.clone())?;
        accepted_serial.resize(n, 0);
        let mut bound = Vec::new();
        bound.try_reserve_exact(n).map_err(|_| oom.clone())?;
        bound.resize(n, None);
        let mac = match config.auth {
            AuthMode::Port => None,
            AuthMode::Mac => {
                let mut data_keys = Vec::new();
                data_keys.try_reserve_exact(n).map_err(|_| oom.clone())?;
                data_keys.resize(n, None);
                let mut result_tags = Vec::new();
                let slots = config.pool_slots as usize;
                result_tags.try_reserve_exact(slots).map_err(|_| oom)?;
                result_tags.resize(slots, None);
                Some(MacState {
                    data_keys,
                    result_tags,
                })
            }
        };
        Ok(Job {
            members,
            accepted_serial,
            bound,
            min_serial,
            state: JobState::Joining,
            joined: 0,
            resume_collective: 0,
            resume_seq: 0,
            resize_point: None,
            core,
            uplink,
            up_timers,
            epoch: [0; EPOCH_LEN],
            result_key: None,
            last_token: TokenCache::default(),
            mac,
            ctl: JobCounters::default(),
            ctl_drops: JobDrops::default(),
            origin: JobOrigin::Declared,
            lease: None,
            config,
        })
    }

    pub fn id(&self) -> u16 {
        self.config.id
    }
    /// How the job came to be.
    pub fn origin(&self) -> &JobOrigin {
        &self.origin
    }
    /// What is left of a provisioned job's idle lease at `now` (as of the
    /// table's last look at its traffic, [`super::JobTable::handle_timeout`]);
    /// `None` for a declared job, which has no lease.
    pub fn lease_left(&self, now: Instant) -> Option<Duration> {
        let l = self.lease?;
        Some(
            l.lease
                .saturating_sub(now.saturating_duration_since(l.last_active)),
        )
    }
    /// A provisioned job's idle lease, `None` for a declared one.
    pub fn lease(&self) -> Option<Duration> {
        self.lease.map(|l| l.lease)
    }
    /// Marks the job provisioned by `tenant` as `name`, its lease starting
    /// at `now`.
    pub(super) fn set_provisioned(
        &mut self,
        tenant: TenantName,
        name: JobName,
        lease: Duration,
        now: Instant,
    ) {
        self.origin = JobOrigin::Provisioned { tenant, name };
        self.lease = Some(Lease {
            lease,
            last_active: now,
            seen: self.data_activity(),
        });
    }
    /// Something the table handled for this job (a JOIN, a HEARTBEAT, a
    /// claim) renews its lease.
    pub(super) fn note_activity(&mut self, now: Instant) {
        if let Some(l) = &mut self.lease {
            l.last_active = l.last_active.max(now);
        }
    }
    /// DATA taken or answered so far, on either path: what a lease samples.
    fn data_activity(&self) -> u64 {
        self.ctl.contributions + self.ctl.retransmits_served + self.core.activity()
    }
    /// Samples the job's DATA counts: renews the lease if they moved since
    /// the last look. True when a provisioned job's lease has run out.
    pub(super) fn lease_tick(&mut self, now: Instant) -> bool {
        let Some(mut l) = self.lease else {
            return false;
        };
        let seen = self.data_activity();
        if seen != l.seen {
            l.seen = seen;
            l.last_active = l.last_active.max(now);
        }
        self.lease = Some(l);
        now.saturating_duration_since(l.last_active) >= l.lease
    }
    pub fn state(&self) -> JobState {
        self.state
    }
    pub fn n_workers(&self) -> u16 {
        self.config.n_workers
    }
    /// The window RESULTs and JOIN_ACKs advertise now (smaller than the
    /// declared one while the job yields to a busy higher class).
    pub fn window(&self) -> u16 {
        self.core.advertised_window()
    }
    /// Sets the window the switch allows (clamped to 1..=S): the declared
    /// one, which the engine enforces and RESULTs advertise while the job
    /// does not yield.
    pub fn set_window(&mut self, w: u16) {
        self.core
            .engine
            .set_window(w.clamp(1, self.config.pool_slots));
    }
    /// The window declared for the job, which the engine enforces.
    pub fn declared_window(&self) -> u16 {
        self.core.engine.window()
    }
    /// The job's class.
    pub fn priority(&self) -> Priority {
        self.core.priority.class()
    }
    /// Oldest incomplete seq.
    pub fn floor(&self) -> u32 {
        self.core.engine.floor()
    }
    /// The data-path half, shared with the dataplane threads.
    pub fn core(&self) -> &Arc<JobCore> {
        &self.core
    }
    /// The job's counters: the control path's and every thread's data path's.
    pub fn counters(&self) -> JobCounters {
        let (c, _) = self.counts();
        c
    }
    /// The job's drops by reason, control and data path.
    pub fn drops(&self) -> JobDrops {
        let (_, d) = self.counts();
        d
    }
    /// Both, from one pass over the data path's stripes.
    pub fn counts(&self) -> (JobCounters, JobDrops) {
        let (mut c, mut d) = (self.ctl.clone(), self.ctl_drops.clone());
        self.core.add_counts(&mut c, &mut d);
        (c, d)
    }
    /// Publishes who may send DATA on the fast path now: call after any
    /// change of state or membership (module docs of [`super::datapath`]).
    pub(super) fn publish_admission(&self) {
        let fast = self.state == JobState::Active && self.uplink.is_none() && self.mac.is_none();
        let kinds = self.serves_kinds();
        // A stats spine's leaves send trailers, which the table takes.
        let members = self
            .members
            .iter()
            .map(|m| {
                m.as_ref()
                    .filter(|m| fast && !(self.config.stats && m.upstream))
                    .map(|m| m.endpoint)
            })
            .collect();
        // Tokens (auth = "port") are made only while the job is active (its
        // key is this activation's); a RESULT without one is not sent. A mac
        // job's RESULTs are tagged by the table.
        let result_key = (self.state == JobState::Active && self.mac.is_none())
            .then(|| self.result_key.clone())
            .flatten();
        self.core.admit(Admission {
            fast,
            kinds,
            epoch: self.core.engine.epoch(),
            members,
            result_key,
        });
    }
    /// Whether this job serves collective kinds other than all-reduce: not
    /// on a leaf (it has an uplink) nor on a spine (a member joined with
    /// `UPSTREAM`, i.e. is a leaf): trees serve all-reduce alone.
    pub fn serves_kinds(&self) -> bool {
        self.uplink.is_none() && !self.members.iter().flatten().any(|m| m.upstream)
    }
    /// The resume point sent in JOIN_ACKs: (collective, seq).
    pub fn resume_point(&self) -> (u32, u32) {
        (self.resume_collective, self.resume_seq)
    }
    /// Ranks that have joined under the current generation.
    pub fn joined_ranks(&self) -> u16 {
        self.joined
    }
    /// Where rank `rank` is, if it has joined.
    pub fn member(&self, rank: u16) -> Option<&Endpoint> {
        self.members
            .get(rank as usize)
            .and_then(|m| m.as_ref())
            .map(|m| &m.endpoint)
    }
    /// Endpoints of all joined members, with their rank.
    pub fn members(&self) -> impl Iterator<Item = (u16, &Endpoint)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(r, m)| m.as_ref().map(|m| (r as u16, &m.endpoint)))
    }
    /// The first joined member at rank ≥ `from`.
    pub fn member_from(&self, from: u16) -> Option<(u16, Endpoint)> {
        self.members
            .iter()
            .enumerate()
            .skip(from as usize)
            .find_map(|(r, m)| m.as_ref().map(|m| (r as u16, m.endpoint)))
    }

    /// The session key of `rank`'s last accepted JOIN, if `to` is exactly
    /// the source and switch port that JOIN came from: what a NACK to `to`
    /// is tagged with (docs/PROTOCOL.md, "Sessions"). Kept after the job
    /// went back to joining, so a NACK 6 to a former member is authenticated
    /// too; a host forging the member's address on another port gets the
    /// untagged NACK a stranger gets.
    pub fn session_key_for(&self, rank: u16, to: &Endpoint) -> Option<&[u8; 32]> {
        self.bound
            .get(rank as usize)?
            .as_ref()
            .filter(|b| same_binding(&b.endpoint, to))
            .map(|b| &b.key)
    }

    pub fn source_allowed(&self, ip: [u8; 4]) -> bool {
        self.config.allowed_sources.iter().any(|p| p.contains(ip))
    }

    /// Ranks that have not contributed to the oldest incomplete seq (empty
    /// if that seq has not started aggregating, i.e. nobody sent it yet).
    pub fn missing_on_floor(&self) -> Vec<u16> {
        let floor = self.floor();
        let mut out = Vec::new();
        if self
            .core
            .engine
            .state_at(self.core.engine.index(floor))
            .agg
            .is_some_and(|a| a.seq == floor)
        {
            self.core.engine.missing(floor, |r| out.push(r));
        }
        out
    }

    /// Writes, as big-endian u16s into `out`, the ranks whose contribution to
    /// `seq` the switch has not taken (none if `seq` is complete; all if it
    /// has not started). Returns how many were written (as many as fit).
    pub fn write_missing_ranks(&self, seq: u32, out: &mut [u8]) -> usize {
        let mut n = 0;
        self.core.engine.missing(seq, |r| {
            if let Some(at) = out.get_mut(2 * n..2 * n + 2) {
                at.copy_from_slice(&r.to_be_bytes());
                n += 1;
            }
        });
        n
    }

    /// The result of `seq` with its values, if the slot still holds it
    /// (and, in an `auth = "mac"` job, its tag).
    pub fn result(&self, seq: u32) -> Option<ResultView<'_>> {
        self.view(seq, None)
    }

    /// The RESULT of `seq` as rank `rank` gets it: the values, or none (a
    /// NOVAL RESULT) when the chunk's kind gives `rank` none; with the tag
    /// of that RESULT in an `auth = "mac"` job.
    pub fn result_to(&self, seq: u32, rank: u16) -> Option<ResultView<'_>> {
        self.view(seq, Some(rank))
    }

    fn view(&self, seq: u32, rank: Option<u16>) -> Option<ResultView<'_>> {
        let mut data = self.core.engine.result(seq)?;
        if let Some(r) = rank {
            data = data.for_rank(r);
        }
        let sh = data.shadow();
        let no_values = data.no_values();
        let (window, tag) = match &self.mac {
            None => (self.window(), None),
            Some(_) => {
                let t = self.result_tag(seq)?;
                let tag = if no_values { t.noval? } else { t.values };
                (t.window, Some(tag))
            }
        };
        Some(ResultView {
            seq,
            collective: sh.collective,
            ece: sh.ece,
            window,
            count: sh.count,
            dtype: self.config.dtype,
            kind: sh.kind,
            owner: sh.owner,
            no_values,
            payload_sum: data.payload_sum(),
            tag,
            data,
        })
    }

    /// Sets the activation's RESULT key, and forgets the last token.
    fn set_result_key(&mut self, key: Option<PacketKey>) {
        self.result_key = key;
        self.last_token.clear();
    }

    /// The 16 bytes that follow the payload of the RESULT `view` sent with
    /// header `hdr`: its tag in an `auth = "mac"` job, its token in an
    /// `auth = "port"` job (docs/PROTOCOL.md, "RESULT tokens"); `None`
    /// before the job's first activation (nothing is sent then).
    pub fn result_trailer(&self, hdr: &HeaderRepr, view: &ResultView<'_>) -> Option<Tag> {
        match self.config.auth {
            AuthMode::Mac => view.tag,
            AuthMode::Port => self
                .result_key
                .as_ref()
                .map(|k| k.token_cached(hdr, &self.last_token)),
        }
    }

    /// In an `auth = "mac"` job, the window and tags of `seq`'s RESULT, if
    /// its slot still holds them.
    fn result_tag(&self, seq: u32) -> Option<ResultTags> {
        let m = self.mac.as_ref()?;
        let t = m
            .result_tags
            .get(self.core.engine.index(seq))
            .copied()
            .flatten()?;
        (t.seq == seq).then_some(t)
    }

    /// The job's auth mode.
    pub fn auth(&self) -> AuthMode {
        self.config.auth
    }

    /// The RESULT epoch of the current activation (JOIN_ACK).
    pub fn epoch(&self) -> [u8; EPOCH_LEN] {
        self.epoch
    }

    /// The session key of rank `rank`'s accepted JOIN (its JOIN_ACK's tag
    /// is keyed by it).
    pub fn session_key(&self, rank: u16) -> Option<&[u8; 32]> {
        self.members.get(rank as usize)?.as_ref()?;
        self.bound.get(rank as usize)?.as_ref().map(|b| &b.key)
    }

    /// Binds rank `rank` to `from` with the session key of its newly
    /// accepted JOIN (the one key its JOIN_ACK and NACK tags and, in a mac
    /// job, its DATA key derive from; docs/PROTOCOL.md, "Sessions").
    fn set_session(&mut self, rank: usize, from: Endpoint, nonce: &Nonce, gen: u32) {
        let key = auth::session_key(&self.config.secret, self.config.id, rank as u16, gen, nonce);
        if let Some(m) = &mut self.mac {
            m.data_keys[rank] = Some(PacketKey::data(&key));
        }
        self.bound[rank] = Some(Bound {
            endpoint: from,
            key,
            left: false,
        });
    }

    /// Tags the RESULT of `seq` that just completed (a mac job's), once for
    /// every member and every resend.
    fn tag_result(&mut self, seq: u32) {
        let Some(hdr) = self.result_header(seq, 0, false, 0) else {
            return;
        };
        let i = self.core.engine.index(seq);
        let window = self.window();
        let Some(res) = self.core.engine.result(seq) else {
            return;
        };
        let Some(m) = &mut self.mac else {
            return;
        };
        let Some(key) = &self.result_key else {
            return;
        };
        // The header as sent, but `window` as of now: resends carry it.
        // A reduce-scatter or all-gather also has its NOVAL RESULT, whose
        // flags (and so GMAC nonce) differ and whose payload is empty.
        let mut h = hdr;
        h.window = window;
        h.flags &= !flags::NOVAL;
        // Both cover the statistics trailer of a stats job (its NOVAL
        // RESULT's whole payload).
        let values = key.tag(&h, res.bytes());
        let noval = (res.shadow().kind != Kind::AllReduce).then(|| {
            h.flags |= flags::NOVAL;
            key.tag(&h, res.trailer())
        });
        m.result_tags[i] = Some(ResultTags {
            seq,
            window,
            values,
            noval,
        });
    }

    /// Whether every chunk from `seq` up to the floor still has its result
    /// in the pool (a member resuming at `seq` can be answered from it).
    fn serves_from(&self, seq: u32) -> bool {
        let behind = self.floor().wrapping_sub(seq);
        behind <= u32::from(self.config.pool_slots)
            && (0..behind).all(|i| self.result(seq.wrapping_add(i)).is_some())
    }

    /// Where the members stopped: the floor, in the collective after the
    /// newest completed chunk's (or the activation's resume point when no
    /// chunk completed since).
    fn stopped_at(&self) -> (u32, u32) {
        let floor = self.floor();
        match self.core.engine.shadow(floor.wrapping_sub(1)) {
            Some(sh) if floor != self.resume_seq => (sh.collective.wrapping_add(1), floor),
            _ => (self.resume_collective, floor),
        }
    }

    /// The oldest seq aggregating now, if any: a resize waits until there
    /// is none (docs/PROTOCOL.md, "Elastic jobs").
    pub fn aggregating(&self) -> Option<u32> {
        match self.state {
            JobState::Active => self.core.engine.aggregating(),
            JobState::Joining => None,
        }
    }

    /// Allocates the slot pool and rank tables of `config`'s job for `n`
    /// workers (fallibly, outside the table lock); `old_ranks` is how many
    /// rank bindings the job keeps now ([`Job::bound_ranks`]).
    pub fn try_resized(
        config: &JobConfig,
        n: u16,
        old_ranks: usize,
        board: Arc<PriorityBoard>,
        seq_lanes: u16,
    ) -> Result<Resized, JobConfigError> {
        let mut resized_config = config.clone();
        resized_config.n_workers = n;
        let oom = JobConfigError::OutOfMemory {
            id: config.id,
            need: resized_config.pool_bytes(),
        };
        let engine = job_engine(config, n, seq_lanes).map_err(|_| oom.clone())?;
        let core = Arc::new(JobCore::new(
            config.id,
            config.dtype,
            config.elems_per_chunk,
            config.auth == AuthMode::Mac,
            engine,
            JobPriority::new(config.priority, board),
        ));
        let n = n as usize;
        let mut members = Vec::new();
        members.try_reserve_exact(n).map_err(|_| oom.clone())?;
        members.resize(n, None);
        let mut accepted_serial = Vec::new();
        accepted_serial
            .try_reserve_exact(n)
            .map_err(|_| oom.clone())?;
        accepted_serial.resize(n, 0);
        let ranks = n.max(old_ranks);
        let mut bound = Vec::new();
        bound.try_reserve_exact(ranks).map_err(|_| oom.clone())?;
        bound.resize(ranks, None);
        let data_keys = match config.auth {
            AuthMode::Port => None,
            AuthMode::Mac => {
                let mut k = Vec::new();
                k.try_reserve_exact(n).map_err(|_| oom)?;
                k.resize(n, None);
                Some(k)
            }
        };
        Ok(Resized {
            core,
            members,
            accepted_serial,
            bound,
            data_keys,
        })
    }

    /// Rank bindings kept (at least n; more after a resize down).
    pub fn bound_ranks(&self) -> usize {
        self.bound.len()
    }

    /// Swaps in `r` (made by [`Job::try_resized`] for this job): the job
    /// now has `r`'s n workers and is joining, to resume where its members
    /// stopped. `min_serial` is the issuer's next serial: ranks the old n
    /// did not have take no nonce issued before. Returns the old data-path
    /// half, to be dropped outside the table lock. The caller checked that
    /// nothing is aggregating ([`Job::aggregating`]); a DATA that the data
    /// path takes meanwhile goes into the old engine and is discarded, as
    /// on any reset.
    pub fn apply_resize(&mut self, r: Resized, min_serial: u64) -> Arc<JobCore> {
        let stopped = match self.state {
            JobState::Active => self.stopped_at(),
            JobState::Joining => (self.resume_collective, self.resume_seq),
        };
        let Resized {
            core,
            members,
            mut accepted_serial,
            mut bound,
            data_keys,
        } = r;
        let n = members.len();
        let keep = n.min(self.accepted_serial.len());
        accepted_serial[..keep].copy_from_slice(&self.accepted_serial[..keep]);
        accepted_serial[keep..].fill(min_serial);
        for (b, old) in bound.iter_mut().zip(&self.bound) {
            *b = *old;
        }
        self.set_result_key(None);
        if let (Some(m), Some(keys)) = (&mut self.mac, data_keys) {
            m.data_keys = keys;
            m.result_tags.iter_mut().for_each(|t| *t = None);
        }
        core.engine.set_window(self.window());
        core.engine.reset(stopped.1);
        // The old engine's counts stay the job's; its fan-out names nobody.
        self.core.add_counts(&mut self.ctl, &mut self.ctl_drops);
        self.core.admit(Admission::default());
        let old = std::mem::replace(&mut self.core, core);
        self.members = members;
        self.accepted_serial = accepted_serial;
        self.bound = bound;
        self.config.n_workers = n as u16;
        self.state = JobState::Joining;
        self.joined = 0;
        (self.resume_collective, self.resume_seq) = stopped;
        self.resize_point = Some(stopped);
        self.publish_admission();
        old
    }

    fn reset_to_joining(&mut self) {
        // While joining, the resume point is where the members stopped (a
        // resize starts the next members there).
        (self.resume_collective, self.resume_seq) = self.stopped_at();
        self.state = JobState::Joining;
        self.members.iter_mut().for_each(|m| *m = None);
        self.joined = 0;
        self.core.engine.reset(self.floor());
        self.up_timers
            .iter_mut()
            .for_each(|t| *t = UpTimer::default());
        self.publish_admission();
    }

    fn drop(&mut self, r: DropReason) -> DataOutcome {
        self.ctl_drops.bump(r);
        DataOutcome::Dropped(r)
    }

    fn nack(&mut self, r: DropReason, reason: NackReason) -> DataOutcome {
        self.ctl_drops.bump(r);
        self.ctl.nacks += 1;
        DataOutcome::Nack(reason)
    }

    /// Judges a JOIN (docs/PROTOCOL.md, "Joining").
    pub fn on_join(
        &mut self,
        hdr: &HeaderRepr,
        join: &JoinPayload,
        from: Endpoint,
        cx: &JoinContext<'_>,
    ) -> JoinOutcome {
        self.ctl.joins += 1;
        let outcome = self.judge_join(hdr, join, from, cx);
        match outcome {
            JoinOutcome::Nack(_) => self.ctl.nacks += 1,
            JoinOutcome::Replayed => self.ctl.join_replays += 1,
            _ => {}
        }
        // A member may have moved (a leaf restarted in place) or the job
        // (re)activated: the fast path must see it before its next DATA.
        self.publish_admission();
        outcome
    }

    fn judge_join(
        &mut self,
        hdr: &HeaderRepr,
        join: &JoinPayload,
        from: Endpoint,
        cx: &JoinContext<'_>,
    ) -> JoinOutcome {
        let src = from.source;
        if !self.source_allowed(src.ip) {
            return JoinOutcome::Nack(NackReason::SourceNotAllowed);
        }
        if hdr.gen != cx.gen {
            return JoinOutcome::Nack(NackReason::StaleGeneration);
        }
        if hdr.rank >= self.config.n_workers {
            return JoinOutcome::Nack(NackReason::RankOutOfRange);
        }
        if join.n_workers != self.config.n_workers
            || join.dtype != self.config.dtype as u8
            || join.op != OP_SUM
        {
            return JoinOutcome::Nack(NackReason::ParametersDiffer);
        }
        let Some(serial) = cx
            .issuer
            .verify_tag(&join.nonce, hdr.job, hdr.rank, src.ip, src.port)
        else {
            self.ctl.join_bad_nonce += 1;
            return JoinOutcome::Nack(NackReason::StaleNonce);
        };
        let claim = JoinClaim {
            job: hdr.job,
            rank: hdr.rank,
            gen: hdr.gen,
            collective: hdr.collective,
            seq: hdr.seq,
            n_workers: join.n_workers,
            dtype: join.dtype,
            op: join.op,
            ip: src.ip,
            port: src.port,
        };
        if !auth::verify_join(&self.config.secret, &claim, &join.nonce, &join.mac) {
            self.ctl.join_bad_mac += 1;
            return JoinOutcome::Nack(NackReason::BadSecret);
        }
        let rank = hdr.rank as usize;
        let accepted = self.accepted_serial[rank];
        // A nonce older than the rank's accepted one, or its accepted one
        // after a LEAVE ended that membership (without this, a copy replayed
        // within the nonce lifetime after every rank left would make a
        // member nobody is behind).
        let spent = serial == accepted && self.bound[rank].is_some_and(|b| b.left);
        if serial < accepted || serial < self.min_serial || spent {
            return JoinOutcome::Replayed;
        }
        let recorded = self.members[rank].filter(|m| m.nonce == join.nonce);
        if serial == accepted && recorded.is_some() {
            // The rank's own resend (its JOIN_ACK is late or lost), or a
            // replay of it: the same answer, nothing changes.
            self.ctl.join_repeats += 1;
            return match self.state {
                JobState::Active => JoinOutcome::AckAgain,
                JobState::Joining => JoinOutcome::Waiting,
            };
        }
        // A nonce newer than the rank's last (or its last, after the job went
        // back to joining without it): it must be young.
        if cx.issuer.is_expired(serial, cx.now) {
            self.ctl.join_stale_nonce += 1;
            return JoinOutcome::Nack(NackReason::StaleNonce);
        }
        self.accepted_serial[rank] = serial;
        self.set_session(rank, from, &join.nonce, cx.gen);
        let member = Member {
            endpoint: from,
            resume_collective: hdr.collective,
            resume_seq: hdr.seq,
            nonce: join.nonce,
            left: false,
            upstream: hdr.has_flag(flags::UPSTREAM),
        };
        if self.state == JobState::Active {
            if let Some(m) = &mut self.members[rank] {
                let same_place = (m.resume_collective, m.resume_seq) == (hdr.collective, hdr.seq);
                if same_binding(&m.endpoint, &from) && !m.left && same_place {
                    // A fresh handshake asking for what it has: keep the
                    // job, remember the newer nonce (LEAVE's MAC and the
                    // session keys use it).
                    m.nonce = join.nonce;
                    m.endpoint = from;
                    return JoinOutcome::AckAgain;
                }
            }
            // A restarted leaf switch: its partials are a function of its
            // ranks' inputs, which did not change, so what its previous
            // incarnation contributed stands. It keeps its place when every
            // chunk from its resume point is still answerable.
            if hdr.has_flag(flags::UPSTREAM)
                && self.members[rank].is_some_and(|m| same_binding(&m.endpoint, &from) && !m.left)
                && self.serves_from(hdr.seq)
            {
                self.ctl.rejoins_in_place += 1;
                self.members[rank] = Some(member);
                return JoinOutcome::AckAgain;
            }
            // That worker restarted: everyone joins again.
            self.ctl.resets += 1;
            self.reset_to_joining();
        }
        if self.members[rank].is_none() {
            self.joined += 1;
        }
        self.members[rank] = Some(member);
        if self.joined < self.config.n_workers {
            return JoinOutcome::Waiting;
        }
        self.activate(cx);
        JoinOutcome::Activated
    }

    fn activate(&mut self, cx: &JoinContext<'_>) {
        self.epoch = cx.epoch;
        self.set_result_key(Some(PacketKey::result(
            &self.config.secret,
            self.config.id,
            cx.gen,
            &cx.epoch,
        )));
        if let Some(m) = &mut self.mac {
            m.result_tags.iter_mut().for_each(|t| *t = None);
        }
        // The resume point is the lowest (collective, seq) any rank reported.
        let mut lowest: Option<(u32, u32)> = None;
        for m in self.members.iter().flatten() {
            let p = (m.resume_collective, m.resume_seq);
            lowest = Some(match lowest {
                None => p,
                Some(l) if serial_lt(p.0, l.0) || (p.0 == l.0 && serial_lt(p.1, l.1)) => p,
                Some(l) => l,
            });
        }
        let (mut c, mut s) = lowest.unwrap_or((0, 0));
        // After a resize, fresh workers (at (0, 0)) continue where the old
        // members stopped.
        if let Some((rc, rs)) = self.resize_point.take() {
            if serial_lt(c, rc) || (c == rc && serial_lt(s, rs)) {
                (c, s) = (rc, rs);
            }
        }
        self.resume_collective = c;
        self.resume_seq = s;
        self.core.engine.reset(s);
        self.up_timers
            .iter_mut()
            .for_each(|t| *t = UpTimer::default());
        self.state = JobState::Active;
        self.ctl.activations += 1;
        self.publish_admission();
    }

    /// A LEAVE: the member is marked gone when its MAC verifies; when every
    /// rank has left, the job returns to joining with fresh slots (shadows
    /// stay until then, so stragglers can still fetch lost RESULTs).
    pub fn on_leave(
        &mut self,
        hdr: &HeaderRepr,
        leave: &LeavePayload,
        from: &Endpoint,
        gen: u32,
    ) -> Option<DropReason> {
        let secret = self.config.secret;
        let Some(Some(m)) = self.members.get_mut(hdr.rank as usize) else {
            self.ctl_drops.bump(DropReason::RankOutOfRange);
            return Some(DropReason::RankOutOfRange);
        };
        let why = if let Some(r) = binding_mismatch(&m.endpoint, from) {
            Some(r)
        } else if !auth::verify_leave(&secret, hdr.job, hdr.rank, gen, &m.nonce, &leave.mac) {
            Some(DropReason::Unauthenticated)
        } else {
            m.left = true;
            if let Some(b) = &mut self.bound[hdr.rank as usize] {
                b.left = true;
            }
            if hdr.count == crate::wire::LEAVE_FOR_HOSTS {
                self.ctl.members_left_for_hosts += 1;
            }
            None
        };
        match why {
            Some(r) => self.ctl_drops.bump(r),
            None if self.members.iter().flatten().all(|m| m.left) => self.reset_to_joining(),
            None => {}
        }
        why
    }

    /// The stranger rule for DATA and HEARTBEAT (module docs): `None` when
    /// the message is from the rank's bound member at the switch's
    /// generation and the job is active (go on); else what to do, counted.
    /// Only the bound member hears NACK 6; NACK 7 goes to any source inside
    /// the prefixes, so its answer tells nothing about membership.
    pub fn admit(&mut self, hdr: &HeaderRepr, from: &Endpoint, gen: u32) -> Option<DataOutcome> {
        // The prefixes are looked at only off the fast path (a job may
        // list 256 of them).
        if hdr.gen != gen {
            return Some(if self.source_allowed(from.source.ip) {
                self.nack(DropReason::StaleGeneration, NackReason::StaleGeneration)
            } else {
                self.drop(DropReason::SourceNotAllowed)
            });
        }
        let Some(bound) = self.bound.get(hdr.rank as usize) else {
            return Some(self.drop(DropReason::RankOutOfRange));
        };
        let mismatch = match bound {
            Some(b) => binding_mismatch(&b.endpoint, from),
            None if !self.source_allowed(from.source.ip) => Some(DropReason::SourceNotAllowed),
            None if self.state == JobState::Active => Some(DropReason::SourceMismatch),
            None => Some(DropReason::NotActive),
        };
        if let Some(r) = mismatch {
            return Some(self.drop(r));
        }
        // A bound rank the job no longer has (it was resized down) is a
        // former member: told to join again, it learns its rank is gone.
        if self.state != JobState::Active || hdr.rank >= self.config.n_workers {
            return Some(self.nack(DropReason::NotActive, NackReason::JobNotActive));
        }
        None
    }

    /// Takes one DATA. `values` are the payload bytes ([`HeaderRepr::parse`]
    /// allows either element size; this checks count × the job's element
    /// size); `ce` tells whether its IP header was CE-marked.
    pub fn on_data(
        &mut self,
        hdr: &HeaderRepr,
        values: &[u8],
        from: &Endpoint,
        ce: bool,
        gen: u32,
    ) -> DataOutcome {
        if let Some(out) = self.admit(hdr, from, gen) {
            return out;
        }
        if hdr.kind() != Kind::AllReduce && !self.core.serves_kinds() {
            return self.nack(DropReason::KindNotSupported, NackReason::KindNotSupported);
        }
        if hdr.count > self.config.elems_per_chunk {
            return self.drop(DropReason::CountMismatch);
        }
        let len = if hdr.no_values() {
            0
        } else {
            self.config.dtype.payload_len(hdr.count)
        };
        // A leaf's partial to a stats spine carries its trailer (docs/
        // PROTOCOL.md, "Gradient statistics"); nothing else does.
        let from_leaf = self
            .members
            .get(hdr.rank as usize)
            .and_then(Option::as_ref)
            .is_some_and(|m| m.upstream);
        let trailer = if self.config.stats && from_leaf {
            crate::stats::STATS_LEN
        } else {
            0
        };
        if values.len() != len + trailer + self.config.auth.data_tag_len() {
            return self.drop(DropReason::PayloadLength);
        }
        let (values, tag) = values.split_at(len + trailer);
        let (values, trailer) = values.split_at(len);
        let part = match trailer {
            [] => None,
            t => match crate::stats::GradStats::parse(t) {
                Ok(s) => Some((s.sum_of_squares, s.ranks)),
                Err(_) => return self.drop(DropReason::PayloadLength),
            },
        };
        if let Some(m) = &self.mac {
            let ok = m.data_keys[hdr.rank as usize]
                .as_ref()
                .is_some_and(|k| k.verify(hdr, values, tag));
            if !ok {
                return self.drop(DropReason::BadTag);
            }
        }
        // The table's path takes the lock: any stripe will do.
        let epoch = self.core.engine.epoch();
        let out = self.core.take(0, hdr, values, ce, epoch, part);
        if let DataOutcome::Completed { seq } = out {
            if self.mac.is_some() {
                self.tag_result(seq);
            }
        }
        out
    }

    /// The header of a RESULT of `seq` for `rank`.
    pub fn result_header(&self, seq: u32, rank: u16, retx: bool, gen: u32) -> Option<HeaderRepr> {
        // A mac job's RESULT carries the window its tag covers.
        let window = self.result_tag(seq).map_or(self.window(), |t| t.window);
        let (h, _) = self.core.result_for(seq, rank, retx, gen, window)?;
        Some(h)
    }

    /// The header of a JOIN_ACK for `rank`: `LANE_REPLIES` when its
    /// accepted JOIN was granted lane replies ([`Endpoint::result_lanes`]).
    pub fn join_ack_header(&self, rank: u16, gen: u32) -> HeaderRepr {
        let granted = self.member(rank).is_some_and(|m| m.result_lanes > 1);
        HeaderRepr {
            msg_type: MsgType::JoinAck,
            flags: if granted { flags::LANE_REPLIES } else { 0 },
            job: self.config.id,
            rank,
            count: 0,
            seq: self.resume_seq,
            collective: self.resume_collective,
            window: self.window(),
            gen,
        }
    }

    /// The JOIN_ACK payload for `rank` under header `hdr`
    /// ([`Job::join_ack_header`]), tagged with the rank's session key;
    /// `None` if the rank has not joined.
    pub fn join_ack_payload(&self, rank: u16, hdr: &HeaderRepr) -> Option<JoinAckPayload> {
        let session = self.session_key(rank)?;
        let mut p = JoinAckPayload {
            pool_slots: self.config.pool_slots,
            elems_per_chunk: self.config.elems_per_chunk,
            n_workers: self.config.n_workers,
            auth: self.config.auth as u8,
            stats: u8::from(self.config.stats),
            epoch: self.epoch,
            tag: [0; TAG_LEN],
        };
        let mut body = [0u8; crate::wire::JOIN_ACK_PAYLOAD_LEN];
        p.emit(&mut body).ok()?;
        p.tag = tag::join_ack_tag(session, hdr, &body[..crate::wire::JOIN_ACK_TAGGED_LEN]);
        Some(p)
    }
}

/// Whether `from` is where `bound` was bound: the same source on the same
/// switch port.
fn same_binding(bound: &Endpoint, from: &Endpoint) -> bool {
    binding_mismatch(bound, from).is_none()
}

/// Why a message from `from` is not from the member bound at `bound`.
fn binding_mismatch(bound: &Endpoint, from: &Endpoint) -> Option<DropReason> {
    if bound.source != from.source {
        Some(DropReason::SourceMismatch)
    } else if bound.port_idx != from.port_idx {
        Some(DropReason::WrongPort)
    } else {
        None
    }
}
