//! The codes header fields and payloads name: the message type, the
//! collective's kind, the reduction op, a LEAVE's reason and a NACK's
//! reason, each with its wire value and the text users read.
//!
//! Invariant: `from_*` accepts exactly the values version 4 defines and
//! `as` casts give them back, so a code round-trips through the wire.

use core::fmt;

use super::flags;

/// What a collective does with its chunks (DATA/RESULT flag bits 4–5).
///
/// Every kind completes a slot when all n ranks have sent the seq, so the
/// window, the floor, the shadow and loss recovery are all-reduce's. Kinds
/// other than all-reduce name the chunk's *owner* rank in the DATA header's
/// `window` field (a worker never sends a window); every rank names the
/// same owner for a seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Every rank sends values, every rank gets the sum.
    AllReduce = 0,
    /// Every rank sends values; the owner gets the sum, the others a
    /// [`flags::NOVAL`] RESULT.
    ReduceScatter = 1,
    /// The owner sends values, the others a [`flags::NOVAL`] DATA; the
    /// others get the owner's values copied bit for bit (never converted
    /// or summed), the owner a [`flags::NOVAL`] RESULT.
    AllGather = 2,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::AllReduce, Kind::ReduceScatter, Kind::AllGather];

    /// The kind in `flags`; `None` for the reserved value 3.
    pub const fn from_flags(flags: u8) -> Option<Kind> {
        match (flags & flags::KIND_MASK) >> flags::KIND_SHIFT {
            0 => Some(Kind::AllReduce),
            1 => Some(Kind::ReduceScatter),
            2 => Some(Kind::AllGather),
            _ => None,
        }
    }

    /// `flags` bits that carry this kind.
    pub const fn flag_bits(self) -> u8 {
        (self as u8) << flags::KIND_SHIFT
    }

    /// Whether `rank` sends values for a chunk `owner` owns (else NOVAL).
    pub const fn sends_values(self, rank: u16, owner: u16) -> bool {
        match self {
            Kind::AllReduce | Kind::ReduceScatter => true,
            Kind::AllGather => rank == owner,
        }
    }

    /// Whether `rank` may send a NOVAL DATA where [`Kind::sends_values`]
    /// says values: a reduce-scatter's owner keeps its own shard and adds
    /// it to the other ranks' sum itself (docs/PROTOCOL.md, "Collective
    /// kinds"), so its link carries (n−1)/n of the tensor, not all of it.
    pub const fn owner_may_keep_values(self, rank: u16, owner: u16) -> bool {
        matches!(self, Kind::ReduceScatter) && rank == owner
    }

    /// Whether `rank` gets values in the RESULT of a chunk `owner` owns
    /// (else a NOVAL RESULT).
    pub const fn receives_values(self, rank: u16, owner: u16) -> bool {
        match self {
            Kind::AllReduce => true,
            Kind::ReduceScatter => rank == owner,
            Kind::AllGather => rank != owner,
        }
    }

    /// The name the CLI, logs and docs use.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all-reduce",
            Kind::ReduceScatter => "reduce-scatter",
            Kind::AllGather => "all-gather",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Message types (low nibble of `ver_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    Data = 1,
    Result = 2,
    Join = 3,
    JoinAck = 4,
    Leave = 5,
    Nack = 6,
    Heartbeat = 7,
    Hello = 8,
    Challenge = 9,
    /// Worker (or leaf) → switch: ask for, or claim, a self-provisioned job
    /// (docs/PROTOCOL.md, "Tenants and self-provisioned jobs").
    Provision = 10,
    /// Switch → worker: the id of the job a PROVISION claim reached.
    Provisioned = 11,
}

impl MsgType {
    pub fn from_u8(v: u8) -> Option<MsgType> {
        Some(match v {
            1 => MsgType::Data,
            2 => MsgType::Result,
            3 => MsgType::Join,
            4 => MsgType::JoinAck,
            5 => MsgType::Leave,
            6 => MsgType::Nack,
            7 => MsgType::Heartbeat,
            8 => MsgType::Hello,
            9 => MsgType::Challenge,
            10 => MsgType::Provision,
            11 => MsgType::Provisioned,
            _ => return None,
        })
    }
}

/// Reduction operations (JOIN `op`).
pub const OP_SUM: u8 = 0;

/// A LEAVE's `count` when the member leaves to finish its job on the host
/// path (a fallback: docs/PROTOCOL.md, "Leaving"); 0 otherwise. The switch
/// counts it (`members_left_for_hosts`) and changes nothing else for it.
pub const LEAVE_FOR_HOSTS: u16 = 1;

/// Why the switch refused something (NACK payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum NackReason {
    UnknownJob = 1,
    BadSecret = 2,
    SourceNotAllowed = 3,
    RankOutOfRange = 4,
    ParametersDiffer = 5,
    JobNotActive = 6,
    StaleGeneration = 7,
    Malformed = 8,
    /// The JOIN's nonce is too old, or not one this switch issued to this
    /// rank and address: ask for a new CHALLENGE.
    StaleNonce = 9,
    /// DATA of a reduce-scatter or all-gather to a job that cannot serve
    /// it (an aggregation tree's leaf or spine).
    KindNotSupported = 10,
    /// A PROVISION would exceed one of its tenant's quotas; the NACK's
    /// `detail` names which ([`Quota`]).
    QuotaExceeded = 11,
    /// A PROVISION names a tenant this switch does not have.
    UnknownTenant = 12,
}

impl NackReason {
    pub fn from_u16(v: u16) -> Option<NackReason> {
        Some(match v {
            1 => NackReason::UnknownJob,
            2 => NackReason::BadSecret,
            3 => NackReason::SourceNotAllowed,
            4 => NackReason::RankOutOfRange,
            5 => NackReason::ParametersDiffer,
            6 => NackReason::JobNotActive,
            7 => NackReason::StaleGeneration,
            8 => NackReason::Malformed,
            9 => NackReason::StaleNonce,
            10 => NackReason::KindNotSupported,
            11 => NackReason::QuotaExceeded,
            12 => NackReason::UnknownTenant,
            _ => return None,
        })
    }
}

impl fmt::Display for NackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NackReason::UnknownJob => {
                "unknown job: not declared on the switch, or removed (switchctl jobs)"
            }
            NackReason::BadSecret => {
                "bad secret: the JOIN's MAC does not verify (check --secret against the job's secret)"
            }
            NackReason::SourceNotAllowed => {
                "source address not allowed (add it to the job's allowed_sources)"
            }
            NackReason::RankOutOfRange => "rank out of range (rank must be below n_workers)",
            NackReason::ParametersDiffer => {
                "parameters differ from the job's (n_workers, dtype, op)"
            }
            NackReason::JobNotActive => "job not active (re-join)",
            NackReason::StaleGeneration => "stale generation (the switch restarted; re-join)",
            NackReason::Malformed => "malformed message",
            NackReason::StaleNonce => "stale or unknown nonce (ask for a new CHALLENGE)",
            NackReason::KindNotSupported => {
                "collective kind not supported by this job (reduce-scatter and all-gather need a job on a single switch, not an aggregation tree)"
            }
            NackReason::QuotaExceeded => "over a quota of the tenant",
            NackReason::UnknownTenant => {
                "unknown tenant: this switch has no such tenant (switchctl tenant list)"
            }
        })
    }
}

/// Which quota of a tenant a PROVISION hit (a NACK 11's `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Quota {
    /// The tenant already has `max_jobs` jobs.
    MaxJobs = 1,
    /// `n_workers` above `max_workers_per_job`.
    MaxWorkersPerJob = 2,
    /// The job's slot pool with the tenant's other jobs' above
    /// `max_pool_bytes`.
    MaxPoolBytes = 3,
    /// A dtype the tenant may not use.
    Dtype = 4,
    /// An auth mode the tenant may not use.
    Auth = 5,
    /// A priority above the tenant's `max_priority`.
    Priority = 6,
    /// No free job id in the tenant's `job_ids` range (or the id asked
    /// for is outside it or taken).
    JobIds = 7,
    /// The switch's own pool memory budget (`[switch] pool_memory_mib`).
    SwitchPoolMemory = 8,
}

impl Quota {
    pub const ALL: [Quota; 8] = [
        Quota::MaxJobs,
        Quota::MaxWorkersPerJob,
        Quota::MaxPoolBytes,
        Quota::Dtype,
        Quota::Auth,
        Quota::Priority,
        Quota::JobIds,
        Quota::SwitchPoolMemory,
    ];

    pub fn from_u16(v: u16) -> Option<Quota> {
        Quota::ALL.into_iter().find(|q| *q as u16 == v)
    }

    /// The config key (or setting) the quota is, as operators write it.
    pub const fn key(self) -> &'static str {
        match self {
            Quota::MaxJobs => "max_jobs",
            Quota::MaxWorkersPerJob => "max_workers_per_job",
            Quota::MaxPoolBytes => "max_pool_bytes",
            Quota::Dtype => "dtypes",
            Quota::Auth => "auth",
            Quota::Priority => "max_priority",
            Quota::JobIds => "job_ids",
            Quota::SwitchPoolMemory => "pool_memory_mib",
        }
    }

    /// What a user who hit it can do (quoted in the worker's error).
    pub const fn advice(self) -> &'static str {
        match self {
            Quota::MaxJobs => "wait for one of the tenant's jobs to end (switchctl jobs), or ask the operator to raise the tenant's max_jobs",
            Quota::MaxWorkersPerJob => "use fewer ranks, or ask the operator to raise the tenant's max_workers_per_job",
            Quota::MaxPoolBytes => "use fewer ranks, or wait for another of the tenant's jobs to end, or ask the operator to raise max_pool_bytes",
            Quota::Dtype => "use a dtype the tenant allows (switchctl tenant list), or ask the operator to add it to the tenant's dtypes",
            Quota::Auth => "use an auth mode the tenant allows, or ask the operator to add it to the tenant's auth",
            Quota::Priority => "ask for a lower priority, or ask the operator to raise the tenant's max_priority",
            Quota::JobIds => "wait for one of the tenant's jobs to end, or ask the operator to widen the tenant's job_ids",
            Quota::SwitchPoolMemory => "the switch is full: wait for jobs to end, or ask the operator to raise [switch] pool_memory_mib",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}
