//! A point-in-time view of every counter of the switch, for the periodic
//! log line, the `--stats-file` JSON, switchctl and the metrics endpoint.
//! Counters come from their one schema ([`CounterSchema`]): a counter added
//! there appears here, under its name, with no code in this file.

use std::collections::BTreeMap;

use proto::switch::{CounterSchema, DropReason, JobTable, MALFORMED_KINDS};
use serde::Serialize;

use crate::dataplane::DataplaneCounters;

/// Every counter of a schema, by name.
pub fn counter_map(c: &dyn CounterSchema) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    c.visit(&mut |name, _, v| {
        m.insert(name, v);
    });
    m
}

#[derive(Debug, Clone, Serialize)]
pub struct JobStats {
    pub id: u16,
    pub state: &'static str,
    pub n_workers: u16,
    pub ranks_joined: u16,
    pub window: u16,
    pub floor_seq: u32,
    /// Slot-pool memory this job takes (charged against the budget).
    pub pool_bytes: u64,
    /// Ranks that have not sent the oldest incomplete seq (while it aggregates).
    pub ranks_missing_on_floor: Vec<u16>,
    /// [`proto::switch::JobCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    pub drops: BTreeMap<&'static str, u64>,
    /// On a leaf: its trees, one entry per spine in tree order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub spines: Vec<SpineStats>,
}

/// A leaf's session with one spine (one tree of a job).
#[derive(Debug, Clone, Serialize)]
pub struct SpineStats {
    pub tree: u16,
    pub addr: String,
    /// "joined", "joining" or "refused".
    pub state: &'static str,
    /// Why the spine refuses the leaf (state "refused").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Seconds since anything came from the spine (None: never).
    pub last_heard_secs: Option<f64>,
    /// [`proto::switch::SpineCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
}

/// A leaf job's spines as [`SpineStats`] (empty for other jobs).
pub fn spine_stats(j: &proto::switch::Job, now: std::time::Instant) -> Vec<SpineStats> {
    use proto::wire::SpineSessionState;
    let Some(u) = j.uplink() else {
        return Vec::new();
    };
    u.cfg
        .spines
        .iter()
        .zip(&u.spines)
        .enumerate()
        .map(|(tree, (addr, s))| {
            let state = s.state();
            SpineStats {
                tree: tree as u16,
                addr: addr.to_string(),
                state: match state {
                    SpineSessionState::Joined => "joined",
                    SpineSessionState::Joining => "joining",
                    SpineSessionState::Refused(_) => "refused",
                },
                refused: match state {
                    SpineSessionState::Refused(why) => Some(why.to_string()),
                    _ => None,
                },
                last_heard_secs: s
                    .last_heard
                    .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                counters: counter_map(&s.counters),
            }
        })
        .collect()
}

impl JobStats {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
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
    /// Frames the fast path left to the bridge, by the first rule they
    /// failed ([`crate::xdp::REFUSAL_NAMES`]; docs/FASTPATH.md).
    pub xdp_fwd_refused: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RingStats {
    pub port_idx: u32,
    pub queue: u32,
    pub rx_occupancy: u32,
    pub tx_occupancy: u32,
    /// The kernel's count of frames it dropped for this socket (receive
    /// ring full, fill ring empty, bad descriptors): traffic that reached
    /// the port but never the switch's counters. Read once a second.
    pub kernel_rx_dropped: u64,
    pub kernel_rx_ring_full: u64,
    pub kernel_fill_ring_empty: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SwitchStats {
    pub generation: u32,
    pub uptime_secs: f64,
    /// [`DataplaneCounters`] summed over threads, then
    /// [`proto::switch::TableCounters`], by name.
    #[serde(flatten)]
    pub counters: BTreeMap<&'static str, u64>,
    /// Malformed aggregation frames by kind.
    pub malformed: BTreeMap<&'static str, u64>,
    pub malformed_total: u64,
    /// Slot-pool memory: the budget and what declared jobs take.
    pub pool_budget_bytes: u64,
    pub pool_in_use_bytes: u64,
    pub jobs: Vec<JobStats>,
    pub ports: Vec<PortStats>,
    pub rings: Vec<RingStats>,
}

impl SwitchStats {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

pub fn job_stats(table: &JobTable) -> Vec<JobStats> {
    let now = std::time::Instant::now();
    let mut jobs: Vec<JobStats> = table
        .jobs()
        .map(|j| JobStats {
            id: j.id(),
            state: j.state().name(),
            n_workers: j.n_workers(),
            ranks_joined: j.joined_ranks(),
            window: j.window(),
            floor_seq: j.floor(),
            pool_bytes: j.config.pool_bytes(),
            ranks_missing_on_floor: j.missing_on_floor(),
            counters: counter_map(&j.counters),
            drops: DropReason::ALL
                .iter()
                .map(|r| (r.name(), j.drops.count(*r)))
                .collect(),
            spines: spine_stats(j, now),
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
    let mut counters = counter_map(dp);
    counters.extend(counter_map(&table.counters));
    let mut malformed: BTreeMap<&'static str, u64> = MALFORMED_KINDS
        .iter()
        .zip(table.malformed.iter())
        .map(|(k, v)| (*k, *v))
        .collect();
    malformed.insert("bad_frame", dp.bad_frame);
    malformed.insert("wrong_port", dp.wrong_port);
    let (budget, in_use) = table.pool_memory();
    SwitchStats {
        generation: table.gen(),
        uptime_secs,
        counters,
        malformed_total: malformed.values().sum(),
        malformed,
        pool_budget_bytes: budget,
        pool_in_use_bytes: in_use,
        jobs: job_stats(table),
        ports,
        rings: Vec::new(),
    }
}

/// One line per job for the log: state, progress and non-zero drops.
pub fn summary_line(j: &JobStats, prev_bytes: u64, secs: f64) -> String {
    let bytes = j.counter("bytes_aggregated");
    let rate = (bytes.saturating_sub(prev_bytes)) as f64 * 8.0 / secs.max(1e-9) / 1e9;
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
        j.counter("chunks_completed"),
        rate,
        j.counter("retransmits_served"),
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
