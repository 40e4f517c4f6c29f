//! What the table did with one message, and why it refused one: the
//! [`Verdict`] that [`JobTable::handle`](super::JobTable::handle) returns,
//! the [`Refusal`] of a HELLO, JOIN or PROVISION (a quota's with its
//! numbers: [`QuotaRefusal`]), and [`RefusalSample`], the last refusal of
//! a kind, for the log.
//!
//! Invariants: a refusal is counted by kind ([`Refusal::index`], below
//! [`REFUSAL_KINDS`]) with the last of each kept as a sample, never queued
//! as an event, so strangers cannot flood the log. Its text (`Display`)
//! names what differs and, where there is one, the fix (a quota's advice,
//! the world size or a resize).
//!
//! Layering: above [`job`](super::job) and [`datapath`](super::datapath)
//! (the outcomes a [`Verdict`] carries), [`tenant`](super::tenant) (a
//! provisioned job's names), [`config`](super::config) and
//! [`priority`](super::priority); below the table, which counts and
//! returns these.

use super::config::human_bytes;
use super::counters::DropReason;
use super::datapath::DataOutcome;
use super::job::JoinOutcome;
use super::priority::Priority;
use super::tenant::JobLabel;
use crate::wire::{self, NackReason, WireError};

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
    /// ([`ratelimit::HELLO_LIMIT`](super::ratelimit::HELLO_LIMIT)): dropped
    /// unanswered, counted on the table.
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
