//! What a worker counts and measures: [`WorkerStats`], the counters of its
//! session, and `Grad`, the gradient statistics of its last completed
//! collective (what [`Worker::gradient_stats`](crate::Worker::gradient_stats)
//! answers).
//!
//! Owns: the types only; the worker fills them (report.rs sums every
//! thread's counters, collectives.rs folds a collective's statistics).

use proto::stats::GradStats;

/// Counters of a worker session.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct WorkerStats {
    pub collectives: u64,
    pub chunks_sent: u64,
    /// Of those, DATA that carried values (the others were NOVAL: an
    /// all-gather's other ranks, a reduce-scatter's own kept shard).
    pub values_sent: u64,
    pub chunks_resent: u64,
    /// Of those, resent early because later RESULTs arrived.
    pub chunks_fast_resent: u64,
    /// HEARTBEATs asking what a timed-out oldest chunk waits for (the
    /// straggler hold's probes; docs/PROTOCOL.md, "Reliability"), every
    /// thread's.
    pub hold_probes: u64,
    /// Timeouts of the oldest chunk that resent nothing: the switch had
    /// this rank's DATA and waited for another rank's.
    pub held_timeouts: u64,
    /// HEARTBEATs sent: every thread's probes (thread 0 sends them all),
    /// the stall watch's and an idle provisioned job's keepalives.
    pub heartbeats_sent: u64,
    pub results: u64,
    pub duplicate_results: u64,
    pub ece_results: u64,
    pub rejoins: u64,
    pub nacks: u64,
    /// NACKs whose tag did not verify under the session key, and RESULTs
    /// of another generation, during a collective: ignored (each may make
    /// the worker probe; docs/PROTOCOL.md, "Sessions").
    pub unauthenticated_dropped: u64,
    /// HELLOs sent to ask the switch whether it restarted.
    pub probes_sent: u64,
    /// Probes the switch answered under the session's generation: what
    /// triggered them was spoofed.
    pub spoofed_triggers: u64,
    /// RESULTs whose payload was not `count` elements of the job's dtype
    /// (ignored).
    pub bad_length_results: u64,
    /// RESULTs of another collective kind than the chunk's, or with values
    /// where this rank was due a NOVAL RESULT (or the reverse): ignored.
    pub mismatched_results: u64,
    /// In an `auth = "mac"` job: RESULTs whose tag did not verify under the
    /// activation's RESULT key (ignored, never written to the tensor).
    pub bad_tag_results: u64,
    /// JOIN_ACKs whose tag did not verify under this join's session key
    /// (ignored).
    pub bad_tag_join_acks: u64,
    /// Current congestion window (chunks).
    pub window: u16,
    /// DCTCP α.
    pub alpha: f64,
    /// Smoothed RTT in microseconds (0 before any sample).
    pub srtt_us: u64,
    /// Current retransmission timeout in microseconds.
    pub rto_us: u64,
    /// DATA sent inside `UDP_SEGMENT` super-datagrams of several (udp-gso).
    pub tx_coalesced: u64,
    /// Datagrams received in `UDP_GRO` buffers holding several (udp-gso).
    pub rx_coalesced: u64,
}

/// The gradient statistics of a completed collective.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Grad {
    /// Every chunk's trailer, folded.
    Whole(GradStats),
    /// An all-gather or broadcast (or a job without statistics): nothing
    /// was measured.
    NotSummed,
    /// Summed, but a chunk's RESULT came without a trailer: the job became
    /// `stats = true` at a switch restart during the collective.
    Incomplete,
}
