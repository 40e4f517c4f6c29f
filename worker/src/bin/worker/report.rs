//! What `worker allreduce` prints: the [`Report`], one JSON object with
//! `--json`, else a line of text, and a [`StatsLine`] per collective of a
//! `stats = true` job.
//!
//! The JSON keys are read by the benchmark harness (`bench/harness/`) and
//! the e2e tests: renaming one is an interface change.

use anyhow::Result;
use worker::Kind;

#[derive(serde::Serialize)]
pub(crate) struct Report {
    pub(crate) job: u16,
    pub(crate) rank: u16,
    pub(crate) workers: u16,
    pub(crate) dtype: &'static str,
    /// "all-reduce", "reduce-scatter" or "all-gather".
    pub(crate) collective: &'static str,
    pub(crate) elements: usize,
    pub(crate) iterations: u32,
    pub(crate) seconds: f64,
    pub(crate) gbit_per_s: f64,
    pub(crate) chunks_per_s: f64,
    pub(crate) verified: bool,
    pub(crate) mismatches: u64,
    /// With `--tree-leaves`: workers per leaf, this worker's leaf and its
    /// global rank (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tree_leaves: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) leaf: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) global_rank: Option<u16>,
    pub(crate) elems_per_chunk: u16,
    pub(crate) pool_slots: u16,
    /// The switch's seq lanes: DATA of seq s went to its port + s mod this.
    pub(crate) seq_lanes: usize,
    /// The transport that ran: "mmsg" or "udp-gso".
    pub(crate) transport: &'static str,
    /// Threads that carried the last collective (docs/design/
    /// worker-threads.md), and whether the switch granted lane replies.
    pub(crate) threads: usize,
    pub(crate) lane_replies: bool,
    /// How the job authenticates DATA/RESULT: "port" or "mac".
    pub(crate) auth: &'static str,
    pub(crate) stats: worker::WorkerStats,
    /// In a `stats = true` job: each timed all-reduce's or reduce-scatter's
    /// gradient statistics, in order (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gradient_stats: Option<Vec<StatsLine>>,
    /// Collectives whose statistics differ from the reference (`--verify`).
    pub(crate) stats_mismatches: u64,
    /// With `--machine-cpu`: the machine's busy CPU seconds (summed over
    /// CPUs, since boot) at the start of the first all-reduce and at the
    /// end of the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) machine_busy_cpu_s: Option<[f64; 2]>,
    /// With `--machine-cpu`: this worker process's CPU seconds (user +
    /// system) at the same two points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) process_cpu_s: Option<[f64; 2]>,
    /// With `--switchd-pid`: that process's CPU seconds (user + system) at
    /// the same two points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) switchd_cpu_s: Option<[f64; 2]>,
    /// Each timed iteration's seconds, in order (tail latencies per
    /// all-reduce: `scripts/bench priority`); omitted past 10 000.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) iteration_seconds: Vec<f64>,
}

/// One collective's gradient statistics as the report shows them.
#[derive(Debug, serde::Serialize)]
pub(crate) struct StatsLine {
    pub(crate) iteration: u32,
    pub(crate) sum_of_squares: f64,
    pub(crate) square_of_sum: f64,
    pub(crate) ranks: u32,
    /// With `--verify` on a single switch: whether they are the reference's
    /// bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) verified: Option<bool>,
}

impl Report {
    /// Prints the report on stdout: one JSON object with `json`, else a
    /// line of text for `who` (this worker's rank, and leaf in a tree) and
    /// a line per collective's gradient statistics; `verify`: whether
    /// `--verify` checked the collectives.
    pub(crate) fn print(&self, json: bool, who: &str, kind: Kind, verify: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            let job = self.job;
            println!(
                "job {job} {who}: {} x {kind} of {} elements in {:.3} s: {:.3} Gbit/s, {:.0} chunks/s, transport {}, threads {}, resent {} (held {} timeouts, {} probes), verified: {}",
                self.iterations, self.elements, self.seconds, self.gbit_per_s, self.chunks_per_s, self.transport, self.threads,
                self.stats.chunks_resent, self.stats.held_timeouts, self.stats.hold_probes,
                if verify { if self.mismatches == 0 && self.stats_mismatches == 0 { "yes" } else { "NO" } } else { "not checked" }
            );
            for l in self.gradient_stats.iter().flatten() {
                println!(
                    "  {kind} {}: sum_of_squares {:e}, square_of_sum {:e}, ranks {}{}",
                    l.iteration,
                    l.sum_of_squares,
                    l.square_of_sum,
                    l.ranks,
                    match l.verified {
                        Some(true) => ", verified",
                        Some(false) => ", NOT the reference",
                        None => "",
                    }
                );
            }
        }
        Ok(())
    }
}
