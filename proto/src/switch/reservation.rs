//! The table's jobs coming and going, their memory charged before it is
//! allocated: a job declared ([`JobTable::reserve`] under the table's
//! lock, [`Reservation::build`] outside it, then [`JobTable::insert`] or
//! [`JobTable::release`]; [`JobTable::add`] in one), removed
//! ([`JobTable::remove`]), or resized to another worker count
//! ([`JobTable::reserve_resize`], [`ResizeReservation::build`], then
//! [`JobTable::resize`] or [`JobTable::release_resize`];
//! [`JobTable::resize_job`] in one; docs/PROTOCOL.md, "Elastic jobs").
//!
//! Owns: [`Reservation`], [`ResizeReservation`], [`ResizeError`] (why a
//! resize is refused) and the table's methods above.
//!
//! Invariants:
//! * Slot pools are charged against the budget before they are allocated;
//!   the sum of declared jobs' [`JobConfig::pool_bytes`] never exceeds it.
//!   A resize's new pool is charged while the old one is still allocated;
//!   the old one is given back at the swap.
//! * A reservation is settled once: inserted or released, applied or
//!   released (both are `#[must_use]`); its id is taken until then.
//! * A resize is applied only between collectives, and never to a tree's
//!   job (a leaf's or a spine's).
//! * The table's jobs change only through these methods (`provisioning`'s
//!   included), and each change is published to the data path at once
//!   (`publish_jobs`). A removed job's prefixes are kept, so that its
//!   workers' DATA gets NACK 1.
//! * A declared job's id is never in a tenant's `job_ids`.
//!
//! Layering: with the table (its methods, in a file of their own, as
//! `provisioning`).

use std::sync::Arc;

use super::config::{human_bytes, JobConfig, JobConfigError};
use super::datapath::JobCore;
use super::event::{Event, JobEnd};
use super::job::{Job, Resized};
use super::priority::PriorityBoard;
use super::JobTable;

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

impl JobTable {
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
    pub(super) fn reserve_unchecked(
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
    pub(super) fn remove_job(&mut self, id: u16, why: JobEnd) -> Option<Job> {
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
}
