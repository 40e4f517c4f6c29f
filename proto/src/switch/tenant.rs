//! What an operator declares about a tenant (docs/PROTOCOL.md, "Tenants
//! and self-provisioned jobs"): who may create jobs by name on this switch
//! ([`TenantConfig`]), within which quotas, and the shape of the jobs it
//! creates; checked by [`TenantConfig::validate`]. Also how a job came to
//! be ([`JobOrigin`]) and a copyable label of a provisioned job's names
//! ([`JobLabel`], for events and refusal samples).
//!
//! Layering: names only [`super::config`] (prefixes, a leaf's upstream)
//! and [`super::priority`], like `config.rs`, so the table may name it.
//!
//! Invariants: a validated tenant has a non-empty `allowed_sources`, a
//! `job_ids` range inside 1..=65535 with `lo <= hi`, quotas of at least 1,
//! a lease of 1..=[`MAX_LEASE`] and at least one dtype and auth mode; its
//! key is never printed.

use std::fmt;
use std::time::Duration;

use crate::provision::{JobName, TenantKey, TenantName, JOB_NAME_LEN, TENANT_NAME_LEN};
use crate::tag::AuthMode;
use crate::wire::Dtype;

use super::config::{Ipv4Prefix, Upstream, MAX_ALLOWED_SOURCES};
use super::priority::Priority;

/// Default idle lease of a self-provisioned job.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// Longest idle lease a tenant may set.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// How a job came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOrigin {
    /// By an operator: `[[job]]` or `switchctl job add`.
    Declared,
    /// By a worker holding tenant `tenant`'s key, naming it `name`
    /// (docs/PROTOCOL.md, "Tenants and self-provisioned jobs").
    Provisioned { tenant: TenantName, name: JobName },
}

impl JobOrigin {
    /// `declared` or `provisioned`, as `switchctl jobs` shows it.
    pub fn kind(&self) -> &'static str {
        match self {
            JobOrigin::Declared => "declared",
            JobOrigin::Provisioned { .. } => "provisioned",
        }
    }
}

/// A provisioned job's tenant and name in their wire fields: `Copy`, so
/// that events and refusal samples (which are) can carry them; printed as
/// `tenant/job`. Built from checked names, or from a request's raw fields
/// (printed lossily).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JobLabel {
    pub tenant: [u8; TENANT_NAME_LEN],
    pub job: [u8; JOB_NAME_LEN],
}

impl JobLabel {
    pub fn new(tenant: &TenantName, job: &JobName) -> JobLabel {
        JobLabel {
            tenant: tenant.to_wire(),
            job: job.to_wire(),
        }
    }

    /// The field up to its padding, every byte outside the names'
    /// characters shown as `?` (a stranger's bytes never reach the log as
    /// they are: no control characters, no line breaks).
    fn text(b: &[u8]) -> String {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        b[..end]
            .iter()
            .map(|&c| {
                if c.is_ascii_alphanumeric() || b"._:-".contains(&c) {
                    char::from(c)
                } else {
                    '?'
                }
            })
            .collect()
    }

    /// The tenant's name, as text.
    pub fn tenant_str(&self) -> String {
        Self::text(&self.tenant)
    }

    /// The job's name, as text.
    pub fn job_str(&self) -> String {
        Self::text(&self.job)
    }
}

impl fmt::Display for JobLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant_str(), self.job_str())
    }
}

impl fmt::Debug for JobLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobLabel({self})")
    }
}

/// A tenant as declared (`[[tenant]]`, `switchctl tenant add`).
#[derive(Clone)]
pub struct TenantConfig {
    pub name: TenantName,
    /// 32 bytes; job secrets are derived from it
    /// ([`crate::provision::job_secret`]).
    pub key: TenantKey,
    /// Where its workers (and, on a spine, its leaves) may be.
    pub allowed_sources: Vec<Ipv4Prefix>,
    /// Jobs it may have at once.
    pub max_jobs: u16,
    /// Largest `n_workers` of one of its jobs.
    pub max_workers_per_job: u16,
    /// Slot-pool bytes all its jobs together may take
    /// ([`super::config::JobConfig::pool_bytes`]).
    pub max_pool_bytes: u64,
    /// Element types its jobs may use.
    pub dtypes: Vec<Dtype>,
    /// Auth modes its jobs may use.
    pub auth: Vec<AuthMode>,
    /// Highest class its jobs may ask for.
    pub max_priority: Priority,
    /// Job ids its jobs get, inclusive.
    pub job_ids: (u16, u16),
    /// A job without traffic this long is removed.
    pub lease: Duration,
    /// Slots of each job's pool (a power of two).
    pub pool_slots: u16,
    /// On a leaf of an aggregation tree: where its jobs' partials go; the
    /// leaf provisions each job on every spine.
    pub upstream: Option<Upstream>,
}

impl fmt::Debug for TenantConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantConfig")
            .field("name", &self.name)
            .field("key", &"<redacted>")
            .field("allowed_sources", &self.allowed_sources)
            .field("max_jobs", &self.max_jobs)
            .field("max_workers_per_job", &self.max_workers_per_job)
            .field("max_pool_bytes", &self.max_pool_bytes)
            .field("dtypes", &self.dtypes)
            .field("auth", &self.auth)
            .field("max_priority", &self.max_priority)
            .field("job_ids", &self.job_ids)
            .field("lease", &self.lease)
            .field("pool_slots", &self.pool_slots)
            .field("upstream", &self.upstream)
            .finish()
    }
}

/// Why a tenant declaration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("tenant {0}: allowed_sources is empty, no worker could provision a job")]
    NoSources(TenantName),
    #[error("tenant {0}: {1} allowed_sources prefixes, at most 256")]
    TooManySources(TenantName, usize),
    #[error("tenant {0}: {1} must be at least 1")]
    ZeroQuota(TenantName, &'static str),
    #[error("tenant {0}: job_ids [{1}, {2}] must be a range within 1..=65535 with first <= last")]
    JobIds(TenantName, u16, u16),
    #[error("tenant {0}: lease_secs must be 1..=86400, got {1}")]
    Lease(TenantName, u64),
    #[error("tenant {0}: {1} is empty: list at least one")]
    Empty(TenantName, &'static str),
    #[error("tenant {0}: pool_slots {1} must be a power of two in 1..=32768")]
    PoolSlots(TenantName, u16),
    #[error("tenant {0}: upstream: {1}")]
    Upstream(TenantName, &'static str),
    #[error("tenant {0} is already declared")]
    Duplicate(TenantName),
    #[error("tenant {0}: job_ids [{1}, {2}] overlap tenant {3}'s; give each tenant its own range")]
    Overlap(TenantName, u16, u16, TenantName),
    #[error(
        "tenant {0}: job_ids [{1}, {2}] hold declared job {3}; give the tenant a range no \
         declared job uses"
    )]
    DeclaredJobInRange(TenantName, u16, u16, u16),
    #[error("no tenant {0} (switchctl tenant list shows the tenants)")]
    Unknown(String),
    #[error(
        "tenant {0} still has {1} job(s) (switchctl jobs); they end when their ranks leave or \
         their lease runs out, or remove them with switchctl job rm ID"
    )]
    HasJobs(TenantName, usize),
}

impl TenantConfig {
    /// Checks the declaration on its own (the table checks overlaps with
    /// other tenants).
    pub fn validate(&self) -> Result<(), TenantError> {
        let name = || self.name.clone();
        if self.allowed_sources.is_empty() {
            return Err(TenantError::NoSources(name()));
        }
        if self.allowed_sources.len() > MAX_ALLOWED_SOURCES {
            return Err(TenantError::TooManySources(
                name(),
                self.allowed_sources.len(),
            ));
        }
        for (v, what) in [
            (u64::from(self.max_jobs), "max_jobs"),
            (u64::from(self.max_workers_per_job), "max_workers_per_job"),
            (self.max_pool_bytes, "max_pool_bytes"),
        ] {
            if v == 0 {
                return Err(TenantError::ZeroQuota(name(), what));
            }
        }
        let (lo, hi) = self.job_ids;
        if lo == 0 || lo > hi {
            return Err(TenantError::JobIds(name(), lo, hi));
        }
        if self.lease.is_zero() || self.lease > MAX_LEASE {
            return Err(TenantError::Lease(name(), self.lease.as_secs()));
        }
        if self.dtypes.is_empty() {
            return Err(TenantError::Empty(name(), "dtypes"));
        }
        if self.auth.is_empty() {
            return Err(TenantError::Empty(name(), "auth"));
        }
        if !self.pool_slots.is_power_of_two() || self.pool_slots > super::config::MAX_POOL_SLOTS {
            return Err(TenantError::PoolSlots(name(), self.pool_slots));
        }
        if let Some(u) = &self.upstream {
            if u.spines.is_empty() || u.spines.len() > super::config::MAX_SPINES {
                return Err(TenantError::Upstream(name(), "list 1 to 64 spines"));
            }
            if u.n_leaves == 0 || u.leaf_index >= u.n_leaves {
                return Err(TenantError::Upstream(
                    name(),
                    "leaf_index must be below n_leaves",
                ));
            }
            if u.local_port == 0 {
                return Err(TenantError::Upstream(
                    name(),
                    "the uplink's local UDP port must not be 0 (set [switch] uplink)",
                ));
            }
        }
        Ok(())
    }

    /// Whether `ip` is in the tenant's prefixes.
    pub fn source_allowed(&self, ip: [u8; 4]) -> bool {
        self.allowed_sources.iter().any(|p| p.contains(ip))
    }

    /// Whether its job id range and `other`'s share an id.
    pub fn overlaps(&self, other: &TenantConfig) -> bool {
        self.job_ids.0 <= other.job_ids.1 && other.job_ids.0 <= self.job_ids.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tenant(name: &str, ids: (u16, u16)) -> TenantConfig {
        TenantConfig {
            name: TenantName::new(name).unwrap(),
            key: [0x5a; 32],
            allowed_sources: vec![Ipv4Prefix {
                addr: [198, 18, 0, 0],
                len: 15,
            }],
            max_jobs: 2,
            max_workers_per_job: 8,
            max_pool_bytes: 1 << 30,
            dtypes: Dtype::ALL.to_vec(),
            auth: vec![AuthMode::Port, AuthMode::Mac],
            max_priority: Priority::Normal,
            job_ids: ids,
            lease: DEFAULT_LEASE,
            pool_slots: 256,
            upstream: None,
        }
    }

    #[test]
    fn validate_names_what_is_wrong() {
        assert!(tenant("a", (1000, 1999)).validate().is_ok());
        let mut t = tenant("a", (1000, 1999));
        t.allowed_sources.clear();
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("allowed_sources is empty"));
        let mut t = tenant("a", (2000, 1999));
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("job_ids [2000, 1999]"));
        t.job_ids = (0, 5);
        assert!(t.validate().is_err());
        let mut t = tenant("a", (1, 2));
        t.max_jobs = 0;
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max_jobs must be at least 1"));
        let mut t = tenant("a", (1, 2));
        t.lease = Duration::ZERO;
        assert!(t.validate().unwrap_err().to_string().contains("lease_secs"));
        let mut t = tenant("a", (1, 2));
        t.dtypes.clear();
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("dtypes is empty"));
        let mut t = tenant("a", (1, 2));
        t.pool_slots = 100;
        assert!(t.validate().is_err());
    }

    #[test]
    fn a_label_prints_only_name_characters() {
        let mut l = JobLabel::new(
            &TenantName::new("vision").unwrap(),
            &JobName::new("run-1").unwrap(),
        );
        assert_eq!(l.to_string(), "vision/run-1");
        l.job[..4].copy_from_slice(b"a\nb\x1b");
        assert_eq!(l.job_str(), "a?b?1");
    }

    #[test]
    fn ranges_overlap_when_they_share_an_id_and_the_key_never_prints() {
        let a = tenant("a", (1000, 1999));
        assert!(a.overlaps(&tenant("b", (1999, 2500))));
        assert!(!a.overlaps(&tenant("b", (2000, 2500))));
        assert!(!format!("{a:?}").contains("90"), "0x5a = 90 never prints");
    }
}
