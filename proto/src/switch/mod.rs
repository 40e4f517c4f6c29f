//! The switch side of the protocol (docs/PROTOCOL.md, version 4), as a state
//! machine fed datagrams and time, with no I/O.
//!
//! Owns: [`JobTable`] (jobs by id, the switch generation, the nonce issuer,
//! the slot-pool memory budget, the tenants and their jobs by name, the
//! queue of replies and the queue of events for the log). Its parts:
//! [`config`] (what an operator declares), [`tenant`] (a tenant's
//! declaration, a job's [`JobOrigin`]), `provisioning` (the tenants'
//! jobs: PROVISION asks and claims, quotas, leases, the end of a
//! self-provisioned job; docs/PROTOCOL.md, "Tenants and self-provisioned
//! jobs"),
//! [`job`] (one job's membership and DATA), [`engine`] (the sums, which
//! any number of threads feed at once), [`datapath`] (DATA taken without
//! the table's lock, by the dataplane threads),
//! [`reply`] (what to send), [`counters`] (the counter schema), [`uplink`]
//! (a leaf's sessions with the spines of its aggregation trees), `leaf`
//! (a leaf job's half of [`Job`]) and [`entry`] (the switch's one entry
//! point, [`entry::Switch`]: the data path, else this table).
//!
//! Layers: a file imports only from files below it. Bottom to top:
//! [`counters`], [`ratelimit`], [`priority`]; [`engine`], [`config`];
//! [`tenant`]; [`reply`], [`datapath`], [`uplink`]; [`job`]; `leaf`; this
//! table with `provisioning` (the table's methods for tenants, in a file
//! of their own);
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
pub mod engine;
pub mod entry;
pub mod job;
mod leaf;
pub mod priority;
mod provisioning;
pub mod ratelimit;
pub mod reply;
pub mod tenant;
pub mod uplink;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::auth::NonceIssuer;
use crate::wire::{
    self, ChallengePayload, Header, HeaderRepr, HelloPayload, JoinPayload, LeavePayload, MsgType,
    NackPayload, NackReason, Nonce, ProvisionedPayload, WireError, CHALLENGE_PAYLOAD_LEN,
    HEADER_LEN, JOIN_ACK_PAYLOAD_LEN, NACK_PAYLOAD_LEN, NONCE_LEN, PROVISIONED_CREATED,
};

pub use config::{
    human_bytes, Endpoint, Ipv4Prefix, JobConfig, JobConfigError, Source, SpineAddr, Upstream,
    MAX_ALLOWED_SOURCES, MAX_POOL_SLOTS, UPSTREAM,
};
pub use counters::{
    CounterSchema, DropReason, JobCounters, JobDrops, SpineCounters, TableCounters, MALFORMED_KINDS,
};
pub use datapath::{DataOutcome, DataPath, Fast, JobCore, ResultTokens};
pub use job::{Job, JobState, JoinContext, JoinOutcome, Resized, ResultView};
pub use priority::{Priority, PriorityBoard, UnknownPriority};
pub use reply::{Reply, ReplyMsg, REPLY_QUEUE_CAPACITY};
pub use tenant::{JobLabel, JobOrigin, TenantConfig, TenantError};

use leaf::ProvisionStep;
use provisioning::Tenant;
use ratelimit::{RateLimiter, HELLO_LIMIT, NACK_LIMIT};
use reply::{Pending, ReplyQueue};

/// How long a CHALLENGE's nonce may be used in a JOIN.
pub const DEFAULT_NONCE_LIFETIME: Duration = Duration::from_secs(10);
/// Events kept for the log between two drains.
pub const EVENT_QUEUE_CAPACITY: usize = 256;
/// Copies of a leaf's LEAVE to each spine.
const LEAVE_COPIES: usize = 3;
/// Most ranks one heartbeat answer lists (it stays small whatever n is).
pub const MAX_MISSING_LISTED: usize = 512;

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

/// What the table did with one message (the replies are queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Join(JoinOutcome),
    Data(DataOutcome),
    /// A HELLO answered with a CHALLENGE.
    Challenged,
    /// LEAVE taken; nothing to send.
    Noted,
    /// HEARTBEAT from a member: answered with the ranks `seq` waits for.
    Heartbeat {
        seq: u32,
    },
    /// Dropped and counted (on the job, or on the table when the job is unknown).
    Dropped(Option<DropReason>),
    /// HELLO/JOIN for an unknown job, or DATA for a removed one: NACK 1.
    NackUnknownJob,
    /// Not a version-2 message; counted by kind.
    Malformed(WireError),
    /// A HELLO or PROVISION over its source's rate
    /// ([`ratelimit::HELLO_LIMIT`]): dropped unanswered, counted on the table.
    RateLimited,
    /// A PROVISION claim answered with PROVISIONED for job `job`;
    /// `created` if this claim created it.
    Provisioned {
        job: u16,
        created: bool,
    },
    /// A PROVISION ask or claim refused with this NACK.
    ProvisionRefused(NackReason),
}

/// Why a join attempt was refused (for the log; counters hold the totals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Nack(NackReason),
    /// NACK 5 because the JOIN's dtype is not the job's.
    DtypeDiffers {
        job: wire::Dtype,
        join: u8,
    },
    /// NACK 5 because the JOIN's n_workers is not the job's (a worker of
    /// the size before a resize, or a resize not made yet).
    WorkersDiffer {
        job: u16,
        join: u16,
    },
    /// A JOIN with a nonce older than the rank's accepted one.
    Replayed,
    /// A JOIN of another protocol version.
    Version(u8),
    /// A PROVISION claim over a quota of its tenant (NACK 11).
    Quota(QuotaRefusal),
    /// A PROVISION ask or claim refused for another reason (NACK `1`),
    /// naming the tenant and job it asked for.
    Provision(JobLabel, NackReason),
}

/// A PROVISION claim refused by a quota, with the numbers for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaRefusal {
    pub label: JobLabel,
    pub quota: wire::Quota,
    /// What the claim asked for: its dtype, auth or priority's wire value,
    /// its n_workers, the job count it would make, its pool's bytes, the
    /// job id asked for (0: any).
    pub asked: u64,
    /// The limit: max_jobs, max_workers_per_job, max_pool_bytes,
    /// max_priority's wire value, the switch's pool budget; for `job_ids`
    /// the range's last id.
    pub limit: u64,
    /// What is in use: the tenant's pool bytes, the switch's; for
    /// `job_ids` the range's first id.
    pub in_use: u64,
}

impl std::fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use wire::Quota as Q;
        let (t, j) = (self.label.tenant_str(), self.label.job_str());
        let key = self.quota.key();
        match self.quota {
            Q::MaxJobs => write!(
                f,
                "tenant {t}: job {j} would be its {}; {key} is {}",
                ordinal(self.asked),
                self.limit
            ),
            Q::MaxWorkersPerJob => write!(
                f,
                "tenant {t}: job {j} asks for {} workers; {key} is {}",
                self.asked, self.limit
            ),
            Q::MaxPoolBytes => write!(
                f,
                "tenant {t}: job {j}'s slot pool needs {} with {} in use by its other jobs; \
                 {key} is {}",
                human_bytes(self.asked),
                human_bytes(self.in_use),
                human_bytes(self.limit)
            ),
            Q::Dtype => write!(
                f,
                "tenant {t}: job {j} asks for dtype {}, which the tenant's {key} do not list",
                wire::Dtype::describe(self.asked as u8)
            ),
            Q::Auth => write!(
                f,
                "tenant {t}: job {j} asks for auth {}, which the tenant's {key} does not list \
                 (or the tenant's jobs are leaves of a tree, which take auth port only)",
                crate::tag::AuthMode::from_u8(self.asked as u8)
                    .map_or_else(|| format!("{}", self.asked), |a| a.to_string())
            ),
            Q::Priority => write!(
                f,
                "tenant {t}: job {j} asks for priority {}; {key} is {}",
                Priority::from_u8(self.asked as u8)
                    .map_or_else(|| format!("{}", self.asked), |p| p.to_string()),
                Priority::from_u8(self.limit as u8)
                    .map_or_else(|| format!("{}", self.limit), |p| p.to_string())
            ),
            Q::JobIds if self.asked != 0 => write!(
                f,
                "tenant {t}: job {j} asks for id {}, outside {key} [{}, {}] or taken",
                self.asked, self.in_use, self.limit
            ),
            Q::JobIds => write!(
                f,
                "tenant {t}: job {j}: no free id left in {key} [{}, {}]",
                self.in_use, self.limit
            ),
            Q::SwitchPoolMemory => write!(
                f,
                "tenant {t}: job {j}'s slot pool needs {}, but the switch's {key} budget is {} \
                 with {} in use",
                human_bytes(self.asked),
                human_bytes(self.limit),
                human_bytes(self.in_use)
            ),
        }?;
        write!(f, " ({})", self.quota.advice())
    }
}

/// "1st", "2nd", "3rd", "4th", ..., "11th", "12th", "21st".
fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Kinds of [`Refusal`], for per-kind totals and rate-limited logging.
pub const REFUSAL_KINDS: usize = 14;

impl Refusal {
    /// A small index per kind: 0 replayed, 1..=12 the NACK reason (a
    /// PROVISION's refusals under theirs: 11 quota, 12 unknown tenant), 13
    /// version.
    pub fn index(self) -> usize {
        match self {
            Refusal::Replayed => 0,
            Refusal::Nack(r) | Refusal::Provision(_, r) => (r as usize).min(REFUSAL_KINDS - 2),
            Refusal::DtypeDiffers { .. } => NackReason::ParametersDiffer as usize,
            Refusal::WorkersDiffer { .. } => NackReason::ParametersDiffer as usize,
            Refusal::Quota(_) => NackReason::QuotaExceeded as usize,
            Refusal::Version(_) => REFUSAL_KINDS - 1,
        }
    }
}

/// The last refusal of one kind, as a sample for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalSample {
    pub job: u16,
    pub rank: u16,
    pub ip: [u8; 4],
    pub why: Refusal,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Nack(r) => write!(f, "{r}"),
            Refusal::DtypeDiffers { job, join } => write!(
                f,
                "{}: the JOIN asks for dtype {}, the job is declared {job}",
                NackReason::ParametersDiffer,
                wire::Dtype::describe(*join)
            ),
            Refusal::WorkersDiffer { job, join } => write!(
                f,
                "{}: the JOIN names n_workers {join}, the job has {job} (start the workers \
                 with world size {job}, or resize the job: switchctl job resize JOB {join})",
                NackReason::ParametersDiffer
            ),
            Refusal::Replayed => {
                f.write_str("replayed JOIN (nonce older than the rank's accepted one)")
            }
            Refusal::Version(v) => write!(
                f,
                "protocol version {v}: this switch speaks version {} (upgrade the worker)",
                wire::VERSION
            ),
            Refusal::Quota(q) => write!(f, "PROVISION refused, over a quota: {q}"),
            Refusal::Provision(label, r) => {
                write!(
                    f,
                    "PROVISION of tenant {}'s job {} refused: ",
                    label.tenant_str(),
                    label.job_str()
                )?;
                // The NACK reasons' own texts speak of JOINs and job
                // secrets; a claim is checked against the tenant's key.
                match r {
                    NackReason::BadSecret => f.write_str(
                        "the claim's MAC does not verify under the tenant's key (the worker's \
                         tenant key file differs from the switch's key_file, or a host without \
                         the key is guessing)",
                    ),
                    NackReason::StaleNonce => f.write_str(
                        "stale, forged or replayed nonce (a claim from before the tenant's \
                         last job ended is a replay)",
                    ),
                    NackReason::SourceNotAllowed => f.write_str(
                        "source address not allowed (add it to the tenant's allowed_sources)",
                    ),
                    NackReason::ParametersDiffer => f.write_str(
                        "a job of that name exists with another shape or id (n_workers, \
                         dtype, auth, stats, priority)",
                    ),
                    r => write!(f, "{r}"),
                }
            }
        }
    }
}

/// Something the log should say. Only members' handshakes make events, so
/// strangers cannot flood the queue; refusals are counted per kind instead
/// ([`JobTable::refusals`]), with the last one kept as a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    RankJoined {
        job: u16,
        rank: u16,
        joined: u16,
        of: u16,
    },
    JobActive {
        job: u16,
        ranks: u16,
        resume: (u32, u32),
    },
    /// An active job went back to joining: `rank` joined anew.
    JobReset { job: u16, rank: u16 },
    /// The job's worker count changed (`switchctl job resize`): it joins
    /// again with `to` ranks and resumes at `resume`.
    JobResized {
        job: u16,
        from: u16,
        to: u16,
        resume: (u32, u32),
    },
    /// A leaf's partial has waited for spine `spine` (tree `tree`), which
    /// has said nothing for `silent`: dead or unreachable.
    SpineSilent {
        job: u16,
        tree: u16,
        spine: SpineAddr,
        silent: Duration,
    },
    /// A spine reported silent answers again.
    SpineAnswering {
        job: u16,
        tree: u16,
        spine: SpineAddr,
    },
    /// A tenant's worker created job `job` by name (docs/PROTOCOL.md,
    /// "Tenants and self-provisioned jobs").
    JobProvisioned {
        job: u16,
        label: JobLabel,
        n_workers: u16,
        lease: Duration,
    },
    /// A provisioned job was removed: `why` says what ended it.
    JobEnded {
        job: u16,
        label: JobLabel,
        why: JobEnd,
    },
    /// A spine refused a leaf job's JOIN: the tree is declared
    /// inconsistently (`why` says how). The leaf asks again every second.
    SpineRefused {
        job: u16,
        tree: u16,
        spine: SpineAddr,
        why: wire::SpineRefusal,
    },
}

/// Why a provisioned job was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// Every member that joined left.
    Left,
    /// No traffic for its idle lease.
    Lease,
    /// Removed by the operator (`switchctl job rm`).
    Removed,
}

impl JobEnd {
    /// As `jobs_ended{why}` names it.
    pub fn name(self) -> &'static str {
        match self {
            JobEnd::Left => "left",
            JobEnd::Lease => "lease",
            JobEnd::Removed => "removed",
        }
    }
}

/// A reply written by [`JobTable::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// Bytes of aggregation header and payload written.
    pub len: usize,
    /// Send with CE set in the IP header (a RESULT whose sum saw congestion).
    pub ce: bool,
}

/// A RESULT's aggregation header, written by
/// [`JobTable::encode_result_head`], and what follows it.
pub struct ResultHead<'a> {
    /// The header's and the payload's bytes together.
    pub encoded: Encoded,
    /// The shadow, read-locked while this is held.
    data: ResultView<'a>,
    /// The payload's folded Internet checksum sum ([`crate::checksum`]),
    /// made when the result was.
    pub payload_sum: u16,
    /// The RESULT token, sent after the payload (docs/PROTOCOL.md, "RESULT
    /// tokens").
    pub token: crate::tag::Tag,
}

impl ResultHead<'_> {
    /// The payload (the shadow's bytes), sent after the header.
    pub fn payload(&self) -> &[u8] {
        self.data.payload()
    }
}

/// A job's memory, charged against the budget before it is allocated
/// ([`JobTable::reserve`]).
#[derive(Debug)]
#[must_use = "insert or release the reservation"]
pub struct Reservation {
    id: u16,
    bytes: u64,
    min_serial: u64,
    nonce_key: [u8; 32],
    /// The data path's priority board (the job's class is judged on it).
    board: Arc<PriorityBoard>,
    seq_lanes: u16,
}

impl Reservation {
    /// Allocates the job, outside any lock the caller holds on the table.
    pub fn build(&self, config: JobConfig) -> Result<Job, JobConfigError> {
        Job::try_new(
            config,
            self.min_serial,
            self.nonce_key,
            self.board.clone(),
            self.seq_lanes,
        )
    }
}

/// Why `switchctl job resize` is refused (docs/PROTOCOL.md, "Elastic jobs").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    #[error("no job {0} (switchctl jobs lists them)")]
    UnknownJob(u16),
    #[error(
        "job {0}: cannot resize to 0 workers, a job needs at least 1 (to end the job: \
         switchctl job rm {0})"
    )]
    NoWorkers(u16),
    #[error(
        "job {0} is a leaf of an aggregation tree: resizing a tree's job is not supported; \
         remove the job and declare it again, with the new worker count, on every switch of \
         the tree"
    )]
    Leaf(u16),
    #[error(
        "job {0} is a spine's (its members are leaf switches): its n is the tree's leaf \
         count, which a resize cannot change; remove the job and declare it again on every \
         switch of the tree"
    )]
    Spine(u16),
    #[error(
        "job {id} is in the middle of a collective (seq {seq} is aggregating): a resize \
         happens between collectives; let the workers finish the collective (or stop them), \
         then run switchctl job resize again"
    )]
    Busy { id: u16, seq: u32 },
    #[error(
        "job {id}: resizing to {n} workers needs a new slot pool of {} while the old one ({}) \
         is still allocated, but the switch's pool memory budget is {} with {} in use; \
         remove a job, or raise [switch] pool_memory_mib",
        human_bytes(*need), human_bytes(*old), human_bytes(*budget), human_bytes(*in_use)
    )]
    OverBudget {
        id: u16,
        n: u16,
        need: u64,
        old: u64,
        budget: u64,
        in_use: u64,
    },
    #[error(
        "job {0} changed while its new pool was allocated (removed, or resized by another \
         call): run switchctl job resize again"
    )]
    Changed(u16),
    #[error(transparent)]
    Alloc(#[from] JobConfigError),
}

/// A resize's new pool, charged against the budget before it is allocated
/// ([`JobTable::reserve_resize`]).
#[derive(Debug)]
#[must_use = "apply the resize or release the reservation"]
pub struct ResizeReservation {
    id: u16,
    from: u16,
    n: u16,
    bytes: u64,
    config: JobConfig,
    old_ranks: usize,
    /// The data path's priority board (the resized job keeps its class).
    board: Arc<PriorityBoard>,
    seq_lanes: u16,
}

impl ResizeReservation {
    /// Allocates the new pool, outside any lock the caller holds on the
    /// table.
    pub fn build(&self) -> Result<Resized, JobConfigError> {
        Job::try_resized(
            &self.config,
            self.n,
            self.old_ranks,
            self.board.clone(),
            self.seq_lanes,
        )
    }

    /// The worker count it resizes to.
    pub fn n_workers(&self) -> u16 {
        self.n
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

    /// Swaps the data path's job list for the current one.
    fn publish_jobs(&self) {
        self.data_path
            .publish(self.jobs.values().map(|j| j.core().clone()));
    }

    /// (budget, bytes in use) of slot-pool memory.
    pub fn pool_memory(&self) -> (u64, u64) {
        (self.pool_budget, self.pool_in_use)
    }

    /// Checks a declaration and charges its pool against the budget. Cheap:
    /// call it under the table's lock, then [`Reservation::build`] outside
    /// it, then [`JobTable::insert`] (or [`JobTable::release`]).
    /// A declared job's id may not be in a tenant's `job_ids`.
    pub fn reserve(
        &mut self,
        config: &JobConfig,
        max_elems: u16,
    ) -> Result<Reservation, JobConfigError> {
        if let Some(t) = self.tenant_owning(config.id) {
            return Err(JobConfigError::InTenantRange(
                config.id,
                t.name.to_string(),
                t.job_ids.0,
                t.job_ids.1,
            ));
        }
        self.reserve_unchecked(config, max_elems)
    }

    /// [`JobTable::reserve`] without the tenant ranges (a provisioned
    /// job's id is in its tenant's).
    fn reserve_unchecked(
        &mut self,
        config: &JobConfig,
        max_elems: u16,
    ) -> Result<Reservation, JobConfigError> {
        config.validate(max_elems)?;
        if self.jobs.contains_key(&config.id) || self.reserved.contains(&config.id) {
            return Err(JobConfigError::Duplicate(config.id));
        }
        let need = config.pool_bytes();
        if need > self.pool_budget.saturating_sub(self.pool_in_use) {
            return Err(JobConfigError::OverBudget {
                id: config.id,
                need,
                budget: self.pool_budget,
                in_use: self.pool_in_use,
            });
        }
        self.pool_in_use += need;
        self.reserved.insert(config.id);
        Ok(Reservation {
            id: config.id,
            bytes: need,
            min_serial: self.issuer.next_serial(),
            nonce_key: self.uplink_key,
            board: self.data_path.board().clone(),
            seq_lanes: self.seq_lanes,
        })
    }

    /// Gives back a reservation whose job was not built.
    pub fn release(&mut self, r: Reservation) {
        self.pool_in_use -= r.bytes;
        self.reserved.remove(&r.id);
    }

    /// Declares a job built from `r`.
    pub fn insert(&mut self, r: Reservation, job: Job) {
        self.reserved.remove(&r.id);
        self.removed.remove(&r.id);
        self.departing.retain(|(id, _), _| *id != r.id);
        job.publish_admission();
        self.jobs.insert(r.id, job);
        self.publish_jobs();
    }

    /// Declares a job: reserve, build and insert in one (for callers with
    /// no lock to keep short).
    pub fn add(&mut self, config: JobConfig, max_elems: u16) -> Result<(), JobConfigError> {
        let r = self.reserve(&config, max_elems)?;
        match r.build(config) {
            Ok(job) => {
                self.insert(r, job);
                Ok(())
            }
            Err(e) => {
                self.release(r);
                Err(e)
            }
        }
    }

    /// Removes a job and frees its memory; its workers then get NACK 1. A
    /// provisioned job leaves its tenant, and claims made before now can no
    /// longer bring it back (docs/PROTOCOL.md, "Replays").
    pub fn remove(&mut self, id: u16) -> Option<Job> {
        self.remove_job(id, JobEnd::Removed)
    }

    /// Removes job `id`; a provisioned one leaves its tenant with `why`.
    fn remove_job(&mut self, id: u16, why: JobEnd) -> Option<Job> {
        let job = self.jobs.remove(&id)?;
        self.publish_jobs();
        self.pool_in_use -= job.config.pool_bytes();
        self.removed.insert(id, job.config.allowed_sources.clone());
        self.forget_provisioned(&job, why);
        Some(job)
    }

    /// Checks a resize of job `id` to `n` workers and charges its new pool
    /// against the budget (the old one stays allocated until the swap).
    /// Cheap: call it under the table's lock, then
    /// [`ResizeReservation::build`] outside it, then [`JobTable::resize`]
    /// (or [`JobTable::release_resize`]). `Ok(None)`: the job has `n`
    /// workers already, nothing to do.
    pub fn reserve_resize(
        &mut self,
        id: u16,
        n: u16,
    ) -> Result<Option<ResizeReservation>, ResizeError> {
        let job = self.jobs.get(&id).ok_or(ResizeError::UnknownJob(id))?;
        if n == 0 {
            return Err(ResizeError::NoWorkers(id));
        }
        if job.uplink().is_some() {
            return Err(ResizeError::Leaf(id));
        }
        if !job.serves_kinds() {
            return Err(ResizeError::Spine(id));
        }
        if n == job.n_workers() {
            return Ok(None);
        }
        if let Some(seq) = job.aggregating() {
            return Err(ResizeError::Busy { id, seq });
        }
        let mut config = job.config.clone();
        config.n_workers = n;
        let need = config.pool_bytes();
        if need > self.pool_budget.saturating_sub(self.pool_in_use) {
            return Err(ResizeError::OverBudget {
                id,
                n,
                need,
                old: job.config.pool_bytes(),
                budget: self.pool_budget,
                in_use: self.pool_in_use,
            });
        }
        self.pool_in_use += need;
        Ok(Some(ResizeReservation {
            id,
            from: job.n_workers(),
            n,
            bytes: need,
            old_ranks: job.bound_ranks(),
            config,
            board: self.data_path.board().clone(),
            seq_lanes: self.seq_lanes,
        }))
    }

    /// Gives back a resize reservation that was not applied.
    pub fn release_resize(&mut self, r: ResizeReservation) {
        self.pool_in_use -= r.bytes;
    }

    /// Applies a resize reserved by [`JobTable::reserve_resize`] with the
    /// pool `built` from it, if the job is still between collectives: it
    /// joins again with the new n and resumes where its members stopped
    /// (docs/PROTOCOL.md, "Elastic jobs"). On success returns the old
    /// data-path half, on failure the new one: drop either outside the
    /// table lock (it holds the pool). The reservation is settled either way.
    pub fn resize(
        &mut self,
        r: ResizeReservation,
        built: Resized,
    ) -> Result<Arc<JobCore>, (ResizeError, Arc<JobCore>)> {
        let id = r.id;
        let refusal = match self.jobs.get(&id) {
            None => Some(ResizeError::Changed(id)),
            Some(j) if j.n_workers() != r.from || built.n_workers() != r.n => {
                Some(ResizeError::Changed(id))
            }
            Some(j) => j.aggregating().map(|seq| ResizeError::Busy { id, seq }),
        };
        if let Some(e) = refusal {
            self.release_resize(r);
            return Err((e, built.into_core()));
        }
        let min_serial = self.issuer.next_serial();
        let Some(job) = self.jobs.get_mut(&id) else {
            self.release_resize(r);
            return Err((ResizeError::Changed(id), built.into_core()));
        };
        let old_bytes = job.config.pool_bytes();
        let old = job.apply_resize(built, min_serial);
        let resume = job.resume_point();
        self.pool_in_use -= old_bytes;
        self.publish_jobs();
        self.event(Event::JobResized {
            job: id,
            from: r.from,
            to: r.n,
            resume,
        });
        Ok(old)
    }

    /// Resizes job `id` to `n` workers: reserve, build and apply in one
    /// (for callers with no lock to keep short). False: it had `n` already.
    pub fn resize_job(&mut self, id: u16, n: u16) -> Result<bool, ResizeError> {
        let Some(r) = self.reserve_resize(id, n)? else {
            return Ok(false);
        };
        match r.build() {
            Ok(built) => self.resize(r, built).map(|_| true).map_err(|(e, _)| e),
            Err(e) => {
                self.release_resize(r);
                Err(e.into())
            }
        }
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

    /// Queues `msg` up to spine `spine` of job `job`.
    /// Keeps the LEAVE of leaf job `job` to spine `spine`, encoded, for
    /// [`JobTable::encode`] after the job is removed.
    fn keep_leave(&mut self, job: u16, spine: usize) {
        let Some(s) = self
            .jobs
            .get(&job)
            .and_then(|j| j.uplink())
            .and_then(|u| u.spines.get(spine))
        else {
            return;
        };
        let mut buf = [0u8; HEADER_LEN + crate::wire::LEAVE_PAYLOAD_LEN];
        if let Some(n) = s.hs.emit_leave(&mut buf) {
            self.departing
                .insert((job, spine as u16), buf[..n].to_vec());
        }
    }

    fn up(&mut self, job: u16, spine: usize, msg: ReplyMsg) {
        let Some(u) = self.jobs.get(&job).and_then(|j| j.uplink()) else {
            return;
        };
        let Some(addr) = u.cfg.spines.get(spine).copied() else {
            return;
        };
        let rank = u.cfg.leaf_index;
        self.reply(addr.endpoint(), job, rank, msg);
    }

    /// A message from spine `spine` of a leaf job.
    fn on_spine_message(
        &mut self,
        hdr: &HeaderRepr,
        head: &[u8; HEADER_LEN],
        payload: &[u8],
        spine: usize,
        ce: bool,
        now: Instant,
    ) -> Verdict {
        let job_id = hdr.job;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Verdict::Dropped(None);
        };
        // Anything from the spine proves it alive.
        if job.heard_from_spine(spine, now) {
            if let Some(addr) = job.uplink().map(|u| u.cfg.spines[spine]) {
                self.event(Event::SpineAnswering {
                    job: job_id,
                    tree: spine as u16,
                    spine: addr,
                });
            }
        }
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Verdict::Dropped(None);
        };
        // While a self-provisioned job is provisioned on this spine, its
        // CHALLENGE, NACK and PROVISIONED answer the leaf's PROVISION.
        if matches!(
            hdr.msg_type,
            MsgType::Challenge | MsgType::Nack | MsgType::Provisioned
        ) && job.provisioning_on(spine)
        {
            return match job.on_spine_provision(spine, hdr, payload, now) {
                ProvisionStep::Ignored => Verdict::Noted,
                ProvisionStep::Progress | ProvisionStep::Provisioned => {
                    self.handle_timeout(now);
                    Verdict::Noted
                }
                ProvisionStep::Refused(why) => {
                    self.spine_refused(job_id, spine, why);
                    Verdict::Noted
                }
            };
        }
        match hdr.msg_type {
            MsgType::Heartbeat => {
                job.on_spine_heartbeat(spine, hdr, payload, now);
                Verdict::Noted
            }
            MsgType::Challenge => {
                if job.on_spine_challenge(spine, hdr, payload, now) {
                    self.up(
                        job_id,
                        spine,
                        ReplyMsg::UpJoin {
                            spine: spine as u16,
                        },
                    );
                }
                Verdict::Noted
            }
            MsgType::JoinAck => {
                let refused = job.on_spine_join_ack(spine, hdr, payload, now);
                self.spine_refused(job_id, spine, refused);
                self.handle_timeout(now);
                Verdict::Noted
            }
            MsgType::Nack => {
                if let Ok(n) = NackPayload::parse(payload) {
                    let out = job.on_spine_nack(spine, head, &n, now);
                    self.spine_refused(job_id, spine, out.refused);
                    if out.probe {
                        self.up_probe(job_id, spine);
                    }
                    if out.ours {
                        self.handle_timeout(now);
                    }
                }
                Verdict::Noted
            }
            MsgType::Result if job.spine_gen(spine) != Some(hdr.gen) => {
                if job.on_foreign_spine_result(spine, now) {
                    self.up_probe(job_id, spine);
                }
                Verdict::Dropped(Some(DropReason::StaleGeneration))
            }
            MsgType::Result => match job.on_spine_result(spine, hdr, payload, ce, now) {
                Some(seq) => {
                    if let Some(rank) = job.uplink().map(|u| u.cfg.leaf_index) {
                        let (replies, counters) = (&mut self.replies, &mut self.counters);
                        job.up_fast_retransmit(spine, hdr.seq, now, &mut |addr, msg| {
                            let to = addr.endpoint();
                            let reply = Reply {
                                to,
                                job: job_id,
                                rank,
                                msg,
                            };
                            enqueue(replies, counters, Pending::One(reply));
                        });
                    }
                    self.queue(Pending::ResultToAll {
                        job: job_id,
                        seq,
                        next_rank: 0,
                    });
                    Verdict::Data(DataOutcome::Completed { seq })
                }
                None => Verdict::Dropped(Some(DropReason::Duplicate)),
            },
            // A copy of a PROVISIONED already taken.
            MsgType::Provisioned => Verdict::Noted,
            // What only a worker sends (the caller passes none of these).
            MsgType::Data
            | MsgType::Join
            | MsgType::Leave
            | MsgType::Hello
            | MsgType::Provision => Verdict::Dropped(Some(DropReason::UnexpectedType)),
        }
    }

    /// Queues a probe (a HELLO with its guard's probe nonce) to spine `spine`.
    fn up_probe(&mut self, job: u16, spine: usize) {
        let msg = ReplyMsg::UpProbe {
            spine: spine as u16,
        };
        self.up(job, spine, msg);
    }

    /// Logs a spine's new refusal of a leaf job (once per reason).
    fn spine_refused(&mut self, job: u16, tree: usize, why: Option<wire::SpineRefusal>) {
        let Some(why) = why else {
            return;
        };
        let addr = self
            .jobs
            .get(&job)
            .and_then(|j| j.uplink())
            .map(|u| u.cfg.spines[tree]);
        if let Some(spine) = addr {
            self.event(Event::SpineRefused {
                job,
                tree: tree as u16,
                spine,
                why,
            });
        }
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

    /// Whether job `job`'s RESULTs carry a tag (`auth = "mac"`): they are
    /// encoded whole by [`JobTable::encode`], not by
    /// [`JobTable::encode_result_head`].
    pub fn is_tagged(&self, job: u16) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.auth() == crate::tag::AuthMode::Mac)
    }

    /// For a RESULT: writes only its aggregation header into `buf` and
    /// returns the payload that follows it (the shadow's bytes) and the
    /// token after that, so that a shell can copy the payload once,
    /// straight to where it is sent; `Encoded::len` counts all three. With
    /// it comes the payload's checksum sum, made once per result, so that a
    /// shell sums only the headers per destination. `None` for any other reply, if the header does not fit,
    /// or if the result is gone (as [`encode`]).
    ///
    /// [`encode`]: JobTable::encode
    pub fn encode_result_head(&self, r: &Reply, buf: &mut [u8]) -> Option<ResultHead<'_>> {
        let ReplyMsg::Result { seq, retx } = r.msg else {
            return None;
        };
        let job = self.jobs.get(&r.job)?;
        let hdr = job.result_header(seq, r.rank, retx, self.gen)?;
        let res = job.result_to(seq, r.rank)?;
        if res.tag.is_some() {
            // The shell copies one slice; a tagged RESULT goes through
            // `encode`.
            return None;
        }
        let token = job.result_trailer(&hdr, &res)?;
        hdr.emit_to(buf).ok()?;
        Some(ResultHead {
            encoded: Encoded {
                len: HEADER_LEN + res.payload().len() + token.len(),
                ce: res.ece,
            },
            payload_sum: res.payload_sum,
            token,
            data: res,
        })
    }

    /// Writes `r`'s aggregation header and payload into `buf`; `None` if it
    /// does not fit or its result is gone (the worker's resend recovers).
    pub fn encode(&self, r: &Reply, buf: &mut [u8]) -> Option<Encoded> {
        let gen = self.gen;
        let mut hdr = HeaderRepr::new(MsgType::Nack, r.job);
        hdr.rank = r.rank;
        hdr.gen = gen;
        let body = buf.get_mut(HEADER_LEN..)?;
        let (len, ce) = match r.msg {
            ReplyMsg::Result { seq, retx } => {
                let job = self.jobs.get(&r.job)?;
                hdr = job.result_header(seq, r.rank, retx, gen)?;
                let res = job.result_to(seq, r.rank)?;
                let n = res.payload().len();
                body.get_mut(..n)?.copy_from_slice(res.payload());
                // A mac job's tag or a port job's token.
                let t = job.result_trailer(&hdr, &res)?;
                body.get_mut(n..n + t.len())?.copy_from_slice(&t);
                (n + t.len(), res.ece)
            }
            ReplyMsg::JoinAck => {
                let job = self.jobs.get(&r.job)?;
                hdr = job.join_ack_header(r.rank, gen);
                (job.join_ack_payload(r.rank, &hdr)?.emit(body).ok()?, false)
            }
            ReplyMsg::Nack { reason, echo } => {
                // The tag covers the header as sent: write it first.
                hdr.emit_to(buf).ok()?;
                let mut nack = NackPayload::echoing(reason, echo);
                let key = self
                    .jobs
                    .get(&r.job)
                    .and_then(|j| j.session_key_for(r.rank, &r.to));
                if let (Some(key), Some(h)) = (key, buf.first_chunk::<HEADER_LEN>()) {
                    nack.tag = crate::auth::nack_tag(key, h, reason as u16, &echo);
                }
                let n = nack.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
                return Some(Encoded {
                    len: HEADER_LEN + n,
                    ce: false,
                });
            }
            ReplyMsg::ProvisionRefusal {
                reason,
                detail,
                echo,
            } => {
                // No session yet: untagged.
                let nack = NackPayload {
                    detail,
                    ..NackPayload::echoing(reason, echo)
                };
                (nack.emit(body).ok()?, false)
            }
            ReplyMsg::Provisioned { nonce, created } => {
                let job = self.jobs.get(&r.job)?;
                let lease_secs = u32::try_from(job.lease()?.as_secs()).unwrap_or(u32::MAX);
                hdr.msg_type = MsgType::Provisioned;
                let p = ProvisionedPayload {
                    nonce,
                    lease_secs,
                    flags: if created { PROVISIONED_CREATED } else { 0 },
                    tag: crate::provision::provisioned_tag(
                        &job.config.secret,
                        r.job,
                        gen,
                        &nonce,
                        lease_secs,
                    ),
                };
                (p.emit(body).ok()?, false)
            }
            ReplyMsg::Challenge { .. } | ReplyMsg::ProvisionChallenge { .. } => {
                let (hello_nonce, nonce) = match r.msg {
                    ReplyMsg::Challenge { hello_nonce, nonce } => (hello_nonce, nonce),
                    ReplyMsg::ProvisionChallenge { ask_nonce, nonce } => (ask_nonce, nonce),
                    _ => return None,
                };
                hdr.msg_type = MsgType::Challenge;
                let p = ChallengePayload {
                    hello_nonce,
                    nonce,
                    observed_ip: r.to.source.ip,
                    observed_port: r.to.source.port,
                    // One lane is sent as 0, as before seq lanes.
                    seq_lanes: if self.seq_lanes > 1 {
                        self.seq_lanes
                    } else {
                        0
                    },
                };
                (p.emit(body).ok()?, false)
            }
            ReplyMsg::Missing { seq } => {
                let job = self.jobs.get(&r.job)?;
                hdr.msg_type = MsgType::Heartbeat;
                hdr.seq = seq;
                hdr.window = job.window();
                let room = body.len().min(2 * MAX_MISSING_LISTED);
                let n = job.write_missing_ranks(seq, &mut body[..room]);
                hdr.count = n as u16;
                (2 * n, false)
            }
            ReplyMsg::UpstreamWait {
                seq,
                spine,
                silent_ms,
            } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                let addr = u.cfg.spines.get(spine as usize)?;
                hdr.msg_type = MsgType::Heartbeat;
                hdr.flags = wire::flags::UPSTREAM;
                hdr.seq = seq;
                hdr.window = job.window();
                let block = wire::UpstreamWaitPayload {
                    spine_ip: addr.ip,
                    spine_port: addr.port,
                    tree: spine,
                    silent_ms,
                    session: u.spines.get(spine as usize)?.state(),
                };
                let mut len = block.emit(body).ok()?;
                // The leaves the spine said this chunk waits for, if it
                // answered about this very chunk.
                let spine_seq = u.cfg.route(seq).1;
                let leaves = u.spines[spine as usize]
                    .waiting_for
                    .as_ref()
                    .filter(|(s, _)| *s == spine_seq)
                    .map_or(&[][..], |(_, l)| &l[..]);
                let n = wire::write_u16s(
                    leaves.iter().copied().take(MAX_MISSING_LISTED),
                    body.get_mut(len..)?,
                );
                len += 2 * n;
                hdr.count = n as u16;
                (len, false)
            }
            ReplyMsg::UpHeartbeat { spine, seq } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                hdr = HeaderRepr::new(MsgType::Heartbeat, r.job);
                hdr.rank = u.cfg.leaf_index;
                hdr.gen = u.spines.get(spine as usize)?.joined_gen?;
                hdr.seq = seq;
                (0, false)
            }
            ReplyMsg::VersionRefusal => {
                let n = wire::emit_v1_refusal(r.job, r.rank, buf).ok()?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::OldRefusal { version, echo } => {
                let n = wire::emit_old_refusal(version, r.job, r.rank, &echo, buf).ok()?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpLeave { spine } if !self.jobs.contains_key(&r.job) => {
                // A provisioned leaf job that ended with its last rank.
                let kept = self.departing.get(&(r.job, spine))?;
                let at = buf.get_mut(..kept.len())?;
                at.copy_from_slice(kept);
                return Some(Encoded {
                    len: kept.len(),
                    ce: false,
                });
            }
            ReplyMsg::UpHello { spine }
            | ReplyMsg::UpProbe { spine }
            | ReplyMsg::UpJoin { spine }
            | ReplyMsg::UpLeave { spine } => {
                let job = self.jobs.get(&r.job)?;
                let s = job.uplink()?.spines.get(spine as usize)?;
                let n = if matches!(r.msg, ReplyMsg::UpProbe { .. }) {
                    let nonce = s.guard.as_ref()?.probe_nonce()?;
                    s.hs.emit_hello_with(nonce, buf).ok()?
                } else if matches!(r.msg, ReplyMsg::UpHello { .. }) {
                    s.hs.emit_hello(buf).ok()?
                } else if matches!(r.msg, ReplyMsg::UpLeave { .. }) {
                    s.hs.emit_leave(buf)?
                } else {
                    let (c, seq) = job.spine_resume(spine as usize);
                    s.hs.emit_join(c, seq, buf)?
                };
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpProvision { spine } => {
                let job = self.jobs.get(&r.job)?;
                let s = job.uplink()?.spines.get(spine as usize)?;
                let n = s.prov.as_ref()?.emit(buf)?;
                return Some(Encoded { len: n, ce: false });
            }
            ReplyMsg::UpData { spine, seq, retx } => {
                let job = self.jobs.get(&r.job)?;
                let u = job.uplink()?;
                let gen = u.spines.get(spine as usize)?.joined_gen?;
                // The values, and a stats job's trailer after them.
                let (p, len) = job.with_partial_wire(seq, |p, bytes| {
                    let at = body.get_mut(..bytes.len())?;
                    at.copy_from_slice(bytes);
                    Some((*p, bytes.len()))
                })??;
                hdr = HeaderRepr::new(MsgType::Data, r.job);
                hdr.rank = u.cfg.leaf_index;
                hdr.seq = u.cfg.route(seq).1;
                hdr.collective = p.collective;
                hdr.count = p.count;
                hdr.gen = gen;
                if retx {
                    hdr.flags |= wire::flags::RETX;
                }
                (len, p.ece)
            }
        };
        hdr.emit_to(buf).ok()?;
        Some(Encoded {
            len: HEADER_LEN + len,
            ce,
        })
    }
}

// Compile-time checks of the sizes the encoder relies on.
const _: () = assert!(NACK_PAYLOAD_LEN == 36 && CHALLENGE_PAYLOAD_LEN == 40);
const _: () = assert!(JOIN_ACK_PAYLOAD_LEN == 32);

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
