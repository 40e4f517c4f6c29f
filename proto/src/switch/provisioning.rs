//! The switch's side of self-provisioned jobs (docs/PROTOCOL.md, "Tenants
//! and self-provisioned jobs"): the table's tenants ([`JobTable::add_tenant`]
//! and the rest of its tenant API), PROVISION asks and claims
//! ([`JobTable::on_provision`], called before the table looks a message's
//! job up, since a PROVISION names a job that does not exist yet), and the
//! end of a provisioned job (its lease, its ranks leaving, `switchctl job
//! rm`: [`JobTable::expire_leases`], [`JobTable::forget_provisioned`]).
//!
//! Owns: [`Tenant`] (a tenant's declaration, its jobs by name, and the
//! serial below which its claims are replays).
//!
//! Invariants:
//! * A PROVISION is charged to its source's HELLO budget before any work
//!   (each costs one to three HMACs); over it, it is dropped unanswered and
//!   counted (`hello_rate_limited`). Every answer is smaller than the
//!   PROVISION (62-byte CHALLENGE, 58-byte NACK, 62-byte PROVISIONED against
//!   174 bytes).
//! * Nothing is stored for an ask, nor for a refused claim: only a claim
//!   whose MAC verifies under the tenant's key creates a job; the tenant's
//!   state is its job map and one serial, whatever strangers send.
//! * A claim whose nonce was issued before the tenant last lost a job is a
//!   replay (NACK 9), so a recorded claim never brings back a job that
//!   ended; a claim of a job that exists changes nothing.
//! * A provisioned job is in its tenant's map exactly while it is in the
//!   table; the sum of its tenant's jobs' pools stays within
//!   `max_pool_bytes`, and their count within `max_jobs`.
//! * Leases are sampled off the hot path: the data path never takes the
//!   table lock for them; [`JobTable::handle_timeout`] compares the DATA
//!   counts the data path keeps anyway with the last ones it saw.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::provision::{self, JobName, ProvisionClaim, TENANT_NAME_LEN};
use crate::tag::AuthMode;
use crate::wire::{
    Dtype, HeaderRepr, NackReason, Nonce, ProvisionPayload, Quota, OP_SUM, PROVISION_ASK,
    PROVISION_CLAIM,
};

use super::config::{max_elems_for, Endpoint, JobConfig, JobConfigError};
use super::priority::Priority;
use super::reply::ReplyMsg;
use super::tenant::{JobLabel, TenantConfig, TenantError};
use super::{Event, Job, JobEnd, JobTable, QuotaRefusal, Refusal, Verdict};

/// One tenant of the table.
#[derive(Debug)]
pub(super) struct Tenant {
    pub(super) config: TenantConfig,
    /// Its name's wire field, compared with a PROVISION's.
    pub(super) wire: [u8; TENANT_NAME_LEN],
    /// Its jobs by name: the id, and the switch nonce of the claim that
    /// created it (a copy of that claim is answered `created` again).
    pub(super) jobs: BTreeMap<JobName, (u16, Nonce)>,
    /// Claims with a nonce serial below this are replays: issued before
    /// the tenant last lost a job.
    pub(super) min_serial: u64,
}

/// FNV-1a, 32 bits: where a job's id search starts in its tenant's range.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// What a claim asks for, checked to be values of their fields.
struct Shape {
    n_workers: u16,
    dtype: Dtype,
    auth: AuthMode,
    stats: bool,
    priority: Priority,
}

impl Shape {
    fn of(p: &ProvisionPayload) -> Option<Shape> {
        if p.n_workers == 0 || p.op != OP_SUM || p.stats > 1 {
            return None;
        }
        Some(Shape {
            n_workers: p.n_workers,
            dtype: Dtype::from_u8(p.dtype)?,
            auth: AuthMode::from_u8(p.auth)?,
            stats: p.stats == 1,
            priority: Priority::from_u8(p.priority)?,
        })
    }

    fn matches(&self, j: &Job) -> bool {
        let c = &j.config;
        c.n_workers == self.n_workers
            && c.dtype == self.dtype
            && c.auth == self.auth
            && c.stats == self.stats
            && c.priority == self.priority
    }
}

impl JobTable {
    /// Adds a tenant: checks it ([`TenantConfig::validate`]) and refuses a
    /// name already declared or a `job_ids` range that overlaps another
    /// tenant's or a declared job's id.
    pub fn add_tenant(&mut self, t: TenantConfig) -> Result<(), TenantError> {
        t.validate()?;
        if self.tenants.iter().any(|o| o.config.name == t.name) {
            return Err(TenantError::Duplicate(t.name));
        }
        if let Some(o) = self.tenants.iter().find(|o| o.config.overlaps(&t)) {
            let (lo, hi) = t.job_ids;
            return Err(TenantError::Overlap(t.name, lo, hi, o.config.name.clone()));
        }
        let (lo, hi) = t.job_ids;
        if let Some(id) = self
            .jobs
            .keys()
            .chain(self.reserved.iter())
            .copied()
            .filter(|id| (lo..=hi).contains(id))
            .min()
        {
            return Err(TenantError::DeclaredJobInRange(t.name, lo, hi, id));
        }
        // Claims made before the tenant was declared (under an earlier
        // declaration of the same name) are replays.
        self.tenants.push(Tenant {
            wire: t.name.to_wire(),
            jobs: BTreeMap::new(),
            min_serial: self.issuer.next_serial(),
            config: t,
        });
        Ok(())
    }

    /// Removes tenant `name`; refused while it has jobs.
    pub fn remove_tenant(&mut self, name: &str) -> Result<TenantConfig, TenantError> {
        let i = self
            .tenants
            .iter()
            .position(|t| t.config.name.as_str() == name)
            .ok_or_else(|| TenantError::Unknown(name.to_string()))?;
        let t = &self.tenants[i];
        if !t.jobs.is_empty() {
            return Err(TenantError::HasJobs(t.config.name.clone(), t.jobs.len()));
        }
        Ok(self.tenants.remove(i).config)
    }

    /// The tenants, in the order added.
    pub fn tenants(&self) -> impl Iterator<Item = &TenantConfig> {
        self.tenants.iter().map(|t| &t.config)
    }

    /// Tenant `name`'s jobs and the slot-pool bytes they take.
    pub fn tenant_usage(&self, name: &str) -> Option<(usize, u64)> {
        let t = self
            .tenants
            .iter()
            .find(|t| t.config.name.as_str() == name)?;
        Some(self.usage_of(t))
    }

    fn usage_of(&self, t: &Tenant) -> (usize, u64) {
        let bytes = t
            .jobs
            .values()
            .filter_map(|(id, _)| self.jobs.get(id))
            .map(|j| j.config.pool_bytes())
            .sum();
        (t.jobs.len(), bytes)
    }

    /// Whether `id` is inside a tenant's `job_ids` (a declared job may not
    /// take it).
    pub(super) fn tenant_owning(&self, id: u16) -> Option<&TenantConfig> {
        self.tenants
            .iter()
            .map(|t| &t.config)
            .find(|t| (t.job_ids.0..=t.job_ids.1).contains(&id))
    }

    /// After job `job` left the table: a provisioned one leaves its
    /// tenant, whose claims issued before now become replays; the end is
    /// counted and logged.
    pub(super) fn forget_provisioned(&mut self, job: &Job, why: JobEnd) {
        let super::JobOrigin::Provisioned { tenant, name } = job.origin() else {
            return;
        };
        let floor = self.issuer.next_serial();
        if let Some(t) = self.tenants.iter_mut().find(|t| t.config.name == *tenant) {
            if t.jobs.get(name).is_some_and(|(id, _)| *id == job.id()) {
                t.jobs.remove(name);
            }
            t.min_serial = floor;
        }
        match why {
            JobEnd::Left => self.counters.jobs_ended_left += 1,
            JobEnd::Lease => self.counters.jobs_ended_lease += 1,
            JobEnd::Removed => {}
        }
        self.event(Event::JobEnded {
            job: job.id(),
            label: JobLabel::new(tenant, name),
            why,
        });
    }

    /// Samples every provisioned job's traffic and removes those whose
    /// idle lease ran out (their pools go back to the budget).
    pub(super) fn expire_leases(&mut self, now: Instant) {
        if self.tenants.is_empty() {
            return;
        }
        // No allocation unless a job expires.
        let mut expired = Vec::new();
        for j in self.jobs.values_mut() {
            if j.lease_tick(now) {
                expired.push(j.id());
            }
        }
        for id in expired {
            // Dropped here: the pool is freed under the table lock, on the
            // slow path, at most once per lease.
            drop(self.remove_job(id, JobEnd::Lease));
        }
    }

    /// A PROVISION (docs/PROTOCOL.md, "Tenants and self-provisioned
    /// jobs"): an ask is answered with a CHALLENGE, a claim with
    /// PROVISIONED (creating the job if its tenant has none of that name),
    /// anything refused with a NACK echoing its nonce.
    pub(super) fn on_provision(
        &mut self,
        hdr: &HeaderRepr,
        payload: &[u8],
        from: Endpoint,
        now: Instant,
    ) -> Verdict {
        // The header checked the payload's length: this cannot fail.
        let Ok(p) = ProvisionPayload::parse(payload) else {
            return Verdict::Dropped(None);
        };
        // Before any work: an ask costs an HMAC, a claim three.
        if !self.hello_allowed(&from, now) {
            return Verdict::RateLimited;
        }
        let Some(ti) = self.tenants.iter().position(|t| t.wire == p.tenant) else {
            return self.refuse_provision(hdr, &p, from, NackReason::UnknownTenant);
        };
        let src = from.source;
        if !self.tenants[ti].config.source_allowed(src.ip) {
            return self.refuse_provision(hdr, &p, from, NackReason::SourceNotAllowed);
        }
        match hdr.count {
            PROVISION_ASK => {
                if JobName::from_wire(&p.job_name).is_err() {
                    return self.refuse_provision(hdr, &p, from, NackReason::Malformed);
                }
                let nonce =
                    self.issuer
                        .issue_provision(now, &p.tenant, &p.job_name, src.ip, src.port);
                self.counters.provision_challenges += 1;
                let msg = ReplyMsg::ProvisionChallenge {
                    ask_nonce: p.nonce,
                    nonce,
                };
                self.reply(from, hdr.job, hdr.rank, msg);
                Verdict::Challenged
            }
            PROVISION_CLAIM => self.on_claim(hdr, &p, ti, from, now),
            _ => self.refuse_provision(hdr, &p, from, NackReason::Malformed),
        }
    }

    /// A claim of tenant `ti`'s job, in the spec's order of checks.
    fn on_claim(
        &mut self,
        hdr: &HeaderRepr,
        p: &ProvisionPayload,
        ti: usize,
        from: Endpoint,
        now: Instant,
    ) -> Verdict {
        let src = from.source;
        if hdr.gen != self.gen {
            return self.refuse_provision(hdr, p, from, NackReason::StaleGeneration);
        }
        let (Ok(name), Some(shape)) = (JobName::from_wire(&p.job_name), Shape::of(p)) else {
            return self.refuse_provision(hdr, p, from, NackReason::Malformed);
        };
        let serial = self
            .issuer
            .verify_provision_tag(&p.nonce, &p.tenant, &p.job_name, src.ip, src.port)
            .filter(|s| !self.issuer.is_expired(*s, now));
        let Some(serial) = serial else {
            return self.refuse_provision(hdr, p, from, NackReason::StaleNonce);
        };
        let claim = ProvisionClaim {
            job: hdr.job,
            gen: hdr.gen,
            ip: src.ip,
            port: src.port,
        };
        let t = &self.tenants[ti];
        if !provision::verify_provision(&t.config.key, &claim, &p.covered(), &p.mac) {
            return self.refuse_provision(hdr, p, from, NackReason::BadSecret);
        }
        if serial < t.min_serial {
            return self.refuse_provision(hdr, p, from, NackReason::StaleNonce);
        }
        if let Some(&(id, created_by)) = t.jobs.get(&name) {
            let same = self.jobs.get(&id).is_some_and(|j| shape.matches(j))
                && (hdr.job == 0 || hdr.job == id);
            if !same {
                return self.refuse_provision(hdr, p, from, NackReason::ParametersDiffer);
            }
            if let Some(j) = self.jobs.get_mut(&id) {
                j.note_activity(now);
            }
            self.counters.provision_repeats += 1;
            let created = created_by == p.nonce;
            self.reply(
                from,
                id,
                hdr.rank,
                ReplyMsg::Provisioned {
                    nonce: p.nonce,
                    created,
                },
            );
            return Verdict::Provisioned { job: id, created };
        }
        self.create(hdr, p, ti, name, shape, from, now)
    }

    /// Creates tenant `ti`'s job `name` within its quotas, checked in the
    /// spec's order.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        hdr: &HeaderRepr,
        p: &ProvisionPayload,
        ti: usize,
        name: JobName,
        shape: Shape,
        from: Endpoint,
        now: Instant,
    ) -> Verdict {
        let t = &self.tenants[ti];
        let c = &t.config;
        let label = JobLabel::new(&c.name, &name);
        let over = |quota, asked: u64, limit: u64, in_use: u64| QuotaRefusal {
            label,
            quota,
            asked,
            limit,
            in_use,
        };
        let (count, tenant_pool) = self.usage_of(t);
        let mut cfg = JobConfig {
            id: hdr.job,
            n_workers: shape.n_workers,
            allowed_sources: c.allowed_sources.clone(),
            secret: provision::job_secret(&c.key, &c.name, &name),
            pool_slots: c.pool_slots,
            elems_per_chunk: 0,
            dtype: shape.dtype,
            // As a declared job without a window: the whole pool.
            window: c.pool_slots,
            priority: shape.priority,
            auth: shape.auth,
            upstream: c.upstream.clone(),
            stats: shape.stats,
        };
        let f32_elems = match shape.auth {
            AuthMode::Port => self.max_f32_elems,
            AuthMode::Mac => self.max_f32_elems_mac,
        };
        cfg.elems_per_chunk = max_elems_for(f32_elems, cfg.chunk_dtype(), shape.auth, shape.stats);
        let need = cfg.pool_bytes();
        let refusal = if !c.dtypes.contains(&shape.dtype) {
            Some(over(Quota::Dtype, u64::from(p.dtype), 0, 0))
        } else if !c.auth.contains(&shape.auth)
            || (c.upstream.is_some() && shape.auth == AuthMode::Mac)
        {
            Some(over(Quota::Auth, u64::from(p.auth), 0, 0))
        } else if shape.priority > c.max_priority {
            let limit = c.max_priority as u64;
            Some(over(Quota::Priority, u64::from(p.priority), limit, 0))
        } else if shape.n_workers > c.max_workers_per_job {
            let limit = u64::from(c.max_workers_per_job);
            Some(over(
                Quota::MaxWorkersPerJob,
                u64::from(shape.n_workers),
                limit,
                0,
            ))
        } else if count >= usize::from(c.max_jobs) {
            let limit = u64::from(c.max_jobs);
            Some(over(Quota::MaxJobs, count as u64 + 1, limit, count as u64))
        } else if tenant_pool.saturating_add(need) > c.max_pool_bytes {
            Some(over(
                Quota::MaxPoolBytes,
                need,
                c.max_pool_bytes,
                tenant_pool,
            ))
        } else {
            None
        };
        if let Some(q) = refusal {
            return self.refuse_quota(hdr, p, from, q);
        }
        let Some(id) = self.free_id(c, hdr.job, &name) else {
            let (lo, hi) = c.job_ids;
            let q = over(
                Quota::JobIds,
                u64::from(hdr.job),
                u64::from(hi),
                u64::from(lo),
            );
            return self.refuse_quota(hdr, p, from, q);
        };
        cfg.id = id;
        let (budget, in_use) = (self.pool_budget, self.pool_in_use);
        let over_budget = over(Quota::SwitchPoolMemory, need, budget, in_use);
        let (tenant, lease, key) = (c.name.clone(), c.lease, c.key);
        // The pool is allocated here, under the table's lock, on the slow
        // path: a claim that passed the tenant's MAC and quotas, once per
        // job (a declared job is built outside the lock by switchd; a
        // provisioned one cannot be, since the claim arrives on the data
        // path's slow path, which holds the lock).
        let r = match self.reserve_unchecked(&cfg, f32_elems) {
            Ok(r) => r,
            Err(JobConfigError::OverBudget { .. }) => {
                return self.refuse_quota(hdr, p, from, over_budget);
            }
            // The tenant's declaration was validated and the shape checked:
            // what is left cannot happen; refused as malformed if it does.
            Err(_) => return self.refuse_provision(hdr, p, from, NackReason::Malformed),
        };
        let mut job = match r.build(cfg) {
            Ok(job) => job,
            Err(_) => {
                self.release(r);
                return self.refuse_quota(hdr, p, from, over_budget);
            }
        };
        let n_workers = job.n_workers();
        job.set_provisioned(tenant, name.clone(), lease, now);
        // On a leaf (the tenant has an upstream), the job provisions itself
        // on the spines before it joins them.
        job.provision_uplink(&key, self.issuer.next_serial());
        self.insert(r, job);
        self.tenants[ti].jobs.insert(name, (id, p.nonce));
        self.counters.provisioned_jobs += 1;
        self.event(Event::JobProvisioned {
            job: id,
            label,
            n_workers,
            lease,
        });
        self.reply(
            from,
            id,
            hdr.rank,
            ReplyMsg::Provisioned {
                nonce: p.nonce,
                created: true,
            },
        );
        Verdict::Provisioned {
            job: id,
            created: true,
        }
    }

    /// The id a new job of tenant `c` named `name` gets: `asked` if it is
    /// free and in the tenant's range, or for 0 the first free id from
    /// `first + (FNV-1a-32 of the name mod the range's size)` on, wrapping.
    fn free_id(&self, c: &TenantConfig, asked: u16, name: &JobName) -> Option<u16> {
        let (lo, hi) = c.job_ids;
        let free = |id: u16| !self.jobs.contains_key(&id) && !self.reserved.contains(&id);
        if asked != 0 {
            return ((lo..=hi).contains(&asked) && free(asked)).then_some(asked);
        }
        let size = u32::from(hi - lo) + 1;
        let start = fnv1a32(name.as_str().as_bytes()) % size;
        (0..size)
            .map(|k| lo + ((start + k) % size) as u16)
            .find(|&id| free(id))
    }

    /// Refuses a PROVISION with NACK `reason` echoing its nonce (the HELLO
    /// budget was charged for it already), counted and sampled for the log.
    fn refuse_provision(
        &mut self,
        hdr: &HeaderRepr,
        p: &ProvisionPayload,
        from: Endpoint,
        reason: NackReason,
    ) -> Verdict {
        let label = JobLabel {
            tenant: p.tenant,
            job: p.job_name,
        };
        self.counters.provision_refused += 1;
        let msg = ReplyMsg::ProvisionRefusal {
            reason,
            detail: 0,
            echo: p.nonce,
        };
        self.reply(from, hdr.job, hdr.rank, msg);
        let why = Refusal::Provision(label, reason);
        self.refused(hdr.job, hdr.rank, from.source.ip, why);
        Verdict::ProvisionRefused(reason)
    }

    /// Refuses a claim over quota `q` with NACK 11 naming it.
    fn refuse_quota(
        &mut self,
        hdr: &HeaderRepr,
        p: &ProvisionPayload,
        from: Endpoint,
        q: QuotaRefusal,
    ) -> Verdict {
        self.counters.provision_refused += 1;
        let msg = ReplyMsg::ProvisionRefusal {
            reason: NackReason::QuotaExceeded,
            detail: q.quota as u16,
            echo: p.nonce,
        };
        self.reply(from, hdr.job, hdr.rank, msg);
        self.refused(hdr.job, hdr.rank, from.source.ip, Refusal::Quota(q));
        Verdict::ProvisionRefused(NackReason::QuotaExceeded)
    }
}

#[cfg(test)]
mod tests {
    use super::fnv1a32;

    #[test]
    fn fnv1a32_is_the_standard_one() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }
}
