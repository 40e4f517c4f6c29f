//! What a HEARTBEAT answer carries beyond the header: a leaf's
//! [`UpstreamWaitPayload`] (which spine a seq waits for, and the leaf's
//! session with it) and lists of big-endian u16 ranks or leaves.
//!
//! Invariant: a spine session state round-trips through its (state,
//! reason) codes; an unknown code reads as `Joining`, never as a refusal.

use core::fmt;

use super::codes::{NackReason, Quota};
use super::error::{array, check_room, WireError};
use super::lengths::UPSTREAM_WAIT_LEN;

/// The start of a leaf's HEARTBEAT answer when the seq has all its local
/// contributions and waits for its spine (docs/PROTOCOL.md, "Aggregation
/// trees"): which spine, and how long it has been silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamWaitPayload {
    /// The spine's aggregation address.
    pub spine_ip: [u8; 4],
    pub spine_port: u16,
    /// Its index in the job's spine list (the tree).
    pub tree: u16,
    /// Milliseconds since the leaf last heard from that spine while the
    /// partial waited; [`UpstreamWaitPayload::NEVER`] if it never did.
    pub silent_ms: u32,
    /// The leaf's session with that spine.
    pub session: SpineSessionState,
}

/// A leaf's session with one spine, as its HEARTBEAT answers and
/// `switchctl jobs` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineSessionState {
    Joined,
    Joining,
    /// The spine refused the leaf's JOIN, or answered it with a job the
    /// leaf's does not match: the tree is declared inconsistently.
    Refused(SpineRefusal),
}

/// Why a leaf cannot join a spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineRefusal {
    /// The spine's NACK.
    Nack(NackReason),
    /// The spine's JOIN_ACK names another chunk size (`spine` elements)
    /// than the leaf's job.
    ElemsDiffer { spine: u16 },
    /// The spine's job is declared `auth = "mac"`: trees aggregate with
    /// `auth = "port"` only.
    AuthDiffers,
    /// The spine's JOIN_ACK names another `stats` (`spine`) than the leaf's
    /// job (docs/PROTOCOL.md, "Gradient statistics").
    StatsDiffer { spine: u8 },
    /// The spine refused to provision a self-provisioned job for the leaf
    /// (docs/PROTOCOL.md, "Tenants and self-provisioned jobs", Trees): its
    /// NACK to the leaf's PROVISION (a quota's is [`SpineRefusal::ProvisionQuota`]).
    ProvisionRefused(NackReason),
    /// The spine's tenant refused to provision the job over this quota
    /// (NACK 11 naming it).
    ProvisionQuota(Quota),
}

/// What the operator of a spine can do about quota `q` of its tenant
/// refusing a tree's job (a leaf asks for `n_leaves` workers, f32, auth
/// port, the leaf job's id).
fn spine_quota_advice(q: Quota) -> &'static str {
    match q {
        Quota::MaxJobs => {
            "the spine's tenant has max_jobs jobs already: raise its max_jobs there, or wait \
             for one of its jobs to end"
        }
        Quota::MaxWorkersPerJob => {
            "raise the spine tenant's max_workers_per_job to at least the tree's n_leaves"
        }
        Quota::MaxPoolBytes => {
            "raise the spine tenant's max_pool_bytes, or wait for one of its jobs to end"
        }
        Quota::Dtype => "add \"f32\" to the spine tenant's dtypes (a tree's partials are float32)",
        Quota::Auth => {
            "add \"port\" to the spine tenant's auth (trees aggregate with auth = \"port\")"
        }
        Quota::Priority => "raise the spine tenant's max_priority to the job's priority",
        Quota::JobIds => {
            "the leaf's job id is outside the spine tenant's job_ids or taken there: give the \
             tenant the same job_ids on every switch of the tree"
        }
        Quota::SwitchPoolMemory => {
            "the spine is full: raise its [switch] pool_memory_mib, or wait for jobs to end"
        }
    }
}

impl fmt::Display for SpineRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpineRefusal::Nack(NackReason::UnknownJob) => {
                f.write_str("the spine has no such job (declare it there too)")
            }
            SpineRefusal::Nack(NackReason::BadSecret) => {
                f.write_str("bad secret: the job's secret differs between leaf and spine")
            }
            SpineRefusal::Nack(NackReason::SourceNotAllowed) => {
                f.write_str("the spine's allowed_sources do not include the leaf's uplink address")
            }
            SpineRefusal::Nack(NackReason::RankOutOfRange) => {
                f.write_str("the leaf's leaf_index is not below the spine job's n_workers")
            }
            SpineRefusal::Nack(NackReason::ParametersDiffer) => f.write_str(
                "the spine job's n_workers differs from the leaves' n_leaves (or dtype/op differ)",
            ),
            SpineRefusal::Nack(r) => write!(f, "{r}"),
            SpineRefusal::AuthDiffers => f.write_str(
                "the spine's job is declared auth = \"mac\"; aggregation trees support auth = \
                 \"port\" only (declare the spine's job with auth = \"port\")",
            ),
            SpineRefusal::ElemsDiffer { spine } => write!(
                f,
                "the spine's job has {spine} elements per chunk, not the leaf's (give both \
                 jobs the same elems_per_chunk)"
            ),
            SpineRefusal::StatsDiffer { spine } => write!(
                f,
                "the spine's job is declared stats = {}, not as the leaf's (give both jobs \
                 the same stats)",
                *spine != 0
            ),
            SpineRefusal::ProvisionRefused(NackReason::UnknownTenant) => f.write_str(
                "the spine has no tenant of the job's name (declare the tenant, with the same \
                 key and job_ids, on every switch of the tree)",
            ),
            SpineRefusal::ProvisionRefused(NackReason::BadSecret) => f.write_str(
                "the spine's tenant key differs from the leaf's (give the tenant the same key on \
                 every switch of the tree)",
            ),
            SpineRefusal::ProvisionRefused(NackReason::SourceNotAllowed) => f.write_str(
                "the spine's tenant allowed_sources do not include the leaf's uplink address",
            ),
            SpineRefusal::ProvisionRefused(NackReason::ParametersDiffer) => f.write_str(
                "the spine has a job of that name with another shape or id (give the tenant the \
                 same job_ids on every switch of the tree, and every leaf the same n_leaves)",
            ),
            SpineRefusal::ProvisionRefused(r) => {
                write!(f, "the spine refused to provision the job: {r}")
            }
            SpineRefusal::ProvisionQuota(q) => write!(
                f,
                "the spine refused to provision the job over its tenant's quota {} (NACK 11): {}",
                q.key(),
                spine_quota_advice(*q)
            ),
        }
    }
}

/// `reason` of a refusal for differing chunk sizes: this bit, or-ed with
/// the spine's elements per chunk.
const ELEMS_DIFFER: u16 = 0x8000;
/// `reason` of a refusal for a spine job of `auth = "mac"` (below any
/// chunk size, which is at most 2 × 2233).
const AUTH_DIFFERS: u16 = 0x4000;
/// `reason` of a refusal for a spine job whose `stats` differs: this, plus
/// the spine's `stats` byte (0 or 1).
const STATS_DIFFER: u16 = 0x4100;
/// `reason` of a spine's refusal to provision the job: this, or-ed with
/// its NACK reason.
const PROVISION_REFUSED: u16 = 0x4200;
/// `reason` of a spine's refusal to provision the job over a quota (NACK
/// 11): this, or-ed with the quota ([`Quota`], its `detail`).
const PROVISION_QUOTA: u16 = 0x4300;

impl SpineSessionState {
    /// (state, reason) as on the wire: state 0 joined, 1 joining, 2
    /// refused; reason a NACK reason, or [`ELEMS_DIFFER`] | elements, or
    /// one of the other codes above.
    fn codes(self) -> (u16, u16) {
        match self {
            SpineSessionState::Joined => (0, 0),
            SpineSessionState::Joining => (1, 0),
            SpineSessionState::Refused(SpineRefusal::Nack(r)) => (2, r as u16),
            SpineSessionState::Refused(SpineRefusal::ElemsDiffer { spine }) => {
                (2, ELEMS_DIFFER | spine)
            }
            SpineSessionState::Refused(SpineRefusal::AuthDiffers) => (2, AUTH_DIFFERS),
            SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine }) => {
                (2, STATS_DIFFER | u16::from(spine & 1))
            }
            SpineSessionState::Refused(SpineRefusal::ProvisionRefused(r)) => {
                (2, PROVISION_REFUSED | (r as u16 & 0xff))
            }
            SpineSessionState::Refused(SpineRefusal::ProvisionQuota(q)) => {
                (2, PROVISION_QUOTA | (q as u16 & 0xff))
            }
        }
    }

    fn from_codes(state: u16, reason: u16) -> SpineSessionState {
        let refused = if reason == AUTH_DIFFERS {
            Some(SpineRefusal::AuthDiffers)
        } else if reason & !1 == STATS_DIFFER {
            Some(SpineRefusal::StatsDiffer {
                spine: (reason & 1) as u8,
            })
        } else if reason & 0xff00 == PROVISION_REFUSED {
            NackReason::from_u16(reason & 0xff).map(SpineRefusal::ProvisionRefused)
        } else if reason & 0xff00 == PROVISION_QUOTA {
            Quota::from_u16(reason & 0xff).map(SpineRefusal::ProvisionQuota)
        } else if reason & ELEMS_DIFFER != 0 {
            Some(SpineRefusal::ElemsDiffer {
                spine: reason & !ELEMS_DIFFER,
            })
        } else {
            NackReason::from_u16(reason).map(SpineRefusal::Nack)
        };
        match (state, refused) {
            (0, _) => SpineSessionState::Joined,
            (2, Some(r)) => SpineSessionState::Refused(r),
            _ => SpineSessionState::Joining,
        }
    }
}

impl UpstreamWaitPayload {
    /// `silent_ms` of a spine the leaf has not heard from at all.
    pub const NEVER: u32 = u32::MAX;

    pub fn parse(b: &[u8]) -> Result<UpstreamWaitPayload, WireError> {
        check_room(b, UPSTREAM_WAIT_LEN)?;
        Ok(UpstreamWaitPayload {
            spine_ip: array(b),
            spine_port: u16::from_be_bytes([b[4], b[5]]),
            tree: u16::from_be_bytes([b[6], b[7]]),
            silent_ms: u32::from_be_bytes(array(&b[8..])),
            session: SpineSessionState::from_codes(
                u16::from_be_bytes([b[12], b[13]]),
                u16::from_be_bytes([b[14], b[15]]),
            ),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, UPSTREAM_WAIT_LEN)?;
        b[..4].copy_from_slice(&self.spine_ip);
        b[4..6].copy_from_slice(&self.spine_port.to_be_bytes());
        b[6..8].copy_from_slice(&self.tree.to_be_bytes());
        b[8..12].copy_from_slice(&self.silent_ms.to_be_bytes());
        let (state, reason) = self.session.codes();
        b[12..14].copy_from_slice(&state.to_be_bytes());
        b[14..16].copy_from_slice(&reason.to_be_bytes());
        Ok(UPSTREAM_WAIT_LEN)
    }
}

/// The first `n` big-endian u16s of `b` (as many as it holds): the ranks or
/// leaves of a HEARTBEAT answer.
pub fn read_u16s(b: &[u8], n: usize) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2)
        .take(n)
        .map(|x| u16::from_be_bytes([x[0], x[1]]))
}

/// Writes `values` into `out` as big-endian u16s, as many as fit; returns
/// how many were written.
pub fn write_u16s(values: impl IntoIterator<Item = u16>, out: &mut [u8]) -> usize {
    let mut n = 0;
    for (v, o) in values.into_iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&v.to_be_bytes());
        n += 1;
    }
    n
}
