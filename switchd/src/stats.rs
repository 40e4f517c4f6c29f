//! A point-in-time view of every counter of the switch, for the periodic
//! log line, the `--stats-file` JSON and (later) the metrics endpoint.
//! Reading it never touches the hot path's state beyond plain loads.

use std::collections::BTreeMap;

use proto::switch::{DropReason, JobState, JobTable};
use serde::Serialize;

use crate::dataplane::{DataplaneCounters, MALFORMED_KINDS};

#[derive(Debug, Clone, Serialize)]
pub struct JobStats {
    pub id: u16,
    pub state: &'static str,
    pub n_workers: u16,
    pub ranks_joined: u16,
    pub window: u16,
    pub floor_seq: u32,
    /// Ranks that have not sent the oldest incomplete seq (while it aggregates).
    pub ranks_missing_on_floor: Vec<u16>,
    pub chunks_completed: u64,
    pub bytes_aggregated: u64,
    pub contributions: u64,
    pub results_sent: u64,
    pub retransmits_served: u64,
    pub ece_marked: u64,
    pub joins: u64,
    pub nacks: u64,
    pub activations: u64,
    pub drops: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortStats {
    pub name: String,
    pub xdp_steered: u64,
    pub xdp_passed: u64,
    pub xdp_malformed: u64,
    /// Steerable frames dropped in XDP (mode = "xdp-drop" only).
    pub xdp_dropped: u64,
    /// Frames the forwarding fast path redirected to another port.
    pub xdp_forwarded: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RingStats {
    pub port_idx: u32,
    pub queue: u32,
    pub rx_occupancy: u32,
    pub tx_occupancy: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct SwitchStats {
    pub generation: u32,
    pub uptime_secs: f64,
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub tx_ring_full: u64,
    pub results_sent: u64,
    pub join_acks_sent: u64,
    pub nacks_sent: u64,
    pub ring_congested_frames: u64,
    /// Replies one dataplane thread handed to another (the member's socket
    /// belongs to it), and how many of those woke it from poll(2).
    pub forwarded: u64,
    pub thread_wakeups: u64,
    /// Echo mode only: frames sent back (drops are in `tx_ring_full`).
    pub echoed: u64,
    pub unknown_job: u64,
    pub malformed: BTreeMap<&'static str, u64>,
    pub malformed_total: u64,
    pub jobs: Vec<JobStats>,
    pub ports: Vec<PortStats>,
    pub rings: Vec<RingStats>,
}

pub fn job_stats(table: &JobTable) -> Vec<JobStats> {
    let mut jobs: Vec<JobStats> = table
        .jobs()
        .map(|j| {
            let c = &j.counters;
            JobStats {
                id: j.id(),
                state: match j.state() {
                    JobState::Joining => "joining",
                    JobState::Active => "active",
                },
                n_workers: j.n_workers(),
                ranks_joined: j.joined_ranks(),
                window: j.window(),
                floor_seq: j.floor(),
                ranks_missing_on_floor: j.missing_on_floor(),
                chunks_completed: c.chunks_completed,
                bytes_aggregated: c.bytes_aggregated,
                contributions: c.contributions,
                results_sent: c.results_sent,
                retransmits_served: c.retransmits_served,
                ece_marked: c.ece_marked,
                joins: c.joins,
                nacks: c.nacks,
                activations: c.activations,
                drops: DropReason::ALL
                    .iter()
                    .map(|r| (r.name(), c.drop_count(*r)))
                    .collect(),
            }
        })
        .collect();
    jobs.sort_by_key(|j| j.id);
    jobs
}

pub fn snapshot(
    table: &JobTable,
    dp: &DataplaneCounters,
    ports: Vec<PortStats>,
    uptime_secs: f64,
) -> SwitchStats {
    SwitchStats {
        generation: table.gen(),
        uptime_secs,
        rx_frames: dp.rx_frames,
        tx_frames: dp.tx_frames,
        tx_ring_full: dp.tx_ring_full,
        results_sent: dp.results_sent,
        join_acks_sent: dp.join_acks_sent,
        nacks_sent: dp.nacks_sent,
        ring_congested_frames: dp.ring_congested_frames,
        forwarded: dp.forwarded,
        thread_wakeups: dp.thread_wakeups,
        echoed: dp.echoed,
        unknown_job: table.counters.unknown_job,
        malformed: MALFORMED_KINDS
            .iter()
            .zip(dp.malformed.iter())
            .map(|(k, v)| (*k, *v))
            .collect(),
        malformed_total: dp.malformed_total(),
        jobs: job_stats(table),
        ports,
        rings: Vec::new(),
    }
}

/// One line per job for the log: state, progress and non-zero drops.
pub fn summary_line(j: &JobStats, prev_bytes: u64, secs: f64) -> String {
    let rate = (j.bytes_aggregated.saturating_sub(prev_bytes)) as f64 * 8.0 / secs.max(1e-9) / 1e9;
    let drops: Vec<String> = j
        .drops
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!(
        "job {}: {} {}/{} ranks, {} chunks, {:.2} Gbit/s in, {} retransmits served, window {}, drops [{}]{}",
        j.id,
        j.state,
        j.ranks_joined,
        j.n_workers,
        j.chunks_completed,
        rate,
        j.retransmits_served,
        j.window,
        drops.join(" "),
        if j.ranks_missing_on_floor.is_empty() {
            String::new()
        } else {
            format!(
                ", seq {} waits for ranks {:?}",
                j.floor_seq, j.ranks_missing_on_floor
            )
        }
    )
}
