//! What the log should say: [`Event`], which the table queues (at most
//! [`EVENT_QUEUE_CAPACITY`](super::EVENT_QUEUE_CAPACITY) between two
//! drains of [`JobTable::poll_event`](super::JobTable::poll_event), more
//! counted as `events_dropped`), and [`JobEnd`], why a provisioned job was
//! removed.
//!
//! Invariant: only members' handshakes make events, so strangers cannot
//! flood the queue; refusals are counted per kind instead (`refusal`).
//!
//! Layering: above [`config`](super::config) and [`tenant`](super::tenant)
//! (the spine addresses and job names an event carries); below the table.

use std::time::Duration;

use super::config::SpineAddr;
use super::tenant::JobLabel;
use crate::wire;

/// Something the log should say. Only members' handshakes make events, so
/// strangers cannot flood the queue; refusals are counted per kind instead
/// ([`JobTable::refusals`](super::JobTable::refusals)), with the last one
/// kept as a sample.
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
