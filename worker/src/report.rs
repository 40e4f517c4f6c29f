//! What a worker tells about itself, read-only: the session it joined
//! (rank, job, dtype, generation, chunk and pool size, authentication,
//! lanes, transport), the resume point, the last input, its counters
//! (every thread's) and the last collective's gradient statistics.
//!
//! Owns: nothing of its own; every answer is read from the worker's
//! fields and its members.

use std::net::UdpSocket;

use proto::member::{Member, MemberStats};
use proto::stats::GradStats;
use proto::tag::AuthMode;
use proto::wire::Dtype;

use crate::stats::Grad;
use crate::{GradStatsError, TransportKind, Worker, WorkerStats};

impl Worker {
    pub fn rank(&self) -> u16 {
        self.cfg.rank
    }

    /// The job's id: the declared one, or the one the switch gave a
    /// self-provisioned job.
    pub fn job(&self) -> u16 {
        self.cfg.job
    }

    /// The job's element type (what this worker joined with).
    pub fn dtype(&self) -> Dtype {
        self.cfg.dtype
    }

    /// The switch generation this worker joined under.
    pub fn generation(&self) -> u32 {
        self.member.session().gen()
    }

    pub fn elems_per_chunk(&self) -> u16 {
        self.member.elems_per_chunk()
    }

    pub fn pool_slots(&self) -> u16 {
        self.member.pool_slots()
    }

    /// The window the switch advertised in its last JOIN_ACK, RESULT or
    /// HEARTBEAT answer.
    pub fn advertised_window(&self) -> u16 {
        self.member.advertised_window()
    }

    /// How the job authenticates DATA and RESULT (from the switch's
    /// JOIN_ACK, whose tag proves it came from the switch that took our
    /// JOIN).
    pub fn auth(&self) -> AuthMode {
        self.member.session().auth()
    }

    /// The switch's seq lanes (from its CHALLENGE): DATA of seq s goes to
    /// its port + (s mod lanes).
    pub fn seq_lanes(&self) -> usize {
        self.txb.lanes()
    }

    /// Whether the switch granted lane replies at the last join (its
    /// RESULTs come from its lane ports, and more than one thread may
    /// carry a collective).
    pub fn lane_replies(&self) -> bool {
        self.lane_socks.lanes() > 1
    }

    /// The transport in use (`Mmsg` or `UdpGso`, never `Auto`).
    pub fn transport(&self) -> TransportKind {
        self.kind
    }

    /// The UDP socket to the switch (connected, nonblocking): for tools
    /// that drive the protocol themselves after joining (`aggblast`, bench/).
    /// With the udp-gso transport it has `UDP_GRO` on (a receive may hold
    /// several datagrams): such tools join with [`TransportKind::Mmsg`].
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Threads that carried the current or last collective (1 before the
    /// first; docs/design/worker-threads.md).
    pub fn threads(&self) -> usize {
        self.active
    }

    /// The next chunk's seq and collective (the resume point after a join).
    pub fn next_seq(&self) -> (u32, u32) {
        (self.next_seq, self.next_collective)
    }

    /// The input of the last collective this worker ran, completed or
    /// failed, as wire bytes (a reduce-scatter's whole input, an
    /// all-gather's shard); empty before the first. An all-reduce writes its
    /// RESULTs into its buffer as they come, so after a failed one only this
    /// copy still holds what the rank contributed: a host path that finishes
    /// the collective without the switch starts from it.
    pub fn last_input(&self) -> &[u8] {
        if self.last_failed {
            self.input.bytes()
        } else {
            self.prev_input.bytes()
        }
    }

    /// The counters of this worker: every thread's chunks, and share 0's
    /// window, DCTCP α and RTT (each lane thread has its own).
    pub fn stats(&self) -> WorkerStats {
        let mut s = self.stats;
        for ms in std::iter::once(&self.member)
            .chain(self.lanes.iter().map(|l| &l.member))
            .map(Member::stats)
        {
            s.chunks_sent += ms.chunks.sent;
            s.values_sent += ms.values_sent;
            s.chunks_resent += ms.chunks.resent;
            s.chunks_fast_resent += ms.chunks.fast_resent;
            s.hold_probes += ms.chunks.probes;
            s.held_timeouts += ms.chunks.held_timeouts;
            s.results += ms.chunks.results;
            s.duplicate_results += ms.chunks.duplicate_results;
            s.ece_results += ms.chunks.ece_results;
            s.mismatched_results += ms.mismatched_results;
        }
        let ss = self.member.session().stats();
        s.heartbeats_sent = ss.heartbeats_sent;
        s.rejoins = ss.rejoins;
        s.nacks = ss.nacks;
        s.unauthenticated_dropped = ss.unauthenticated_dropped;
        s.probes_sent = ss.probes_sent;
        s.spoofed_triggers = ss.spoofed_triggers;
        s.bad_length_results = ss.bad_length_results;
        s.bad_tag_results = ss.bad_tag_results;
        s.bad_tag_join_acks = ss.bad_tag_join_acks;
        s.window = self.member.window();
        s.alpha = self.member.dctcp().alpha();
        s.srtt_us = self.member.rtt().srtt().map_or(0, |d| d.as_micros() as u64);
        s.rto_us = self.member.rtt().rto().as_micros() as u64;
        s.tx_coalesced = self.txb.coalesced();
        s.rx_coalesced = self.rxb.coalesced();
        for l in &self.lanes {
            s.tx_coalesced += l.txb.coalesced();
            s.rx_coalesced += l.rxb.coalesced();
        }
        s
    }

    /// Each thread's counters over every collective it carried: share 0's
    /// member first, then each lane thread's (those kept from a collective
    /// of more threads than the last included). [`Worker::stats`] sums
    /// their chunks.
    pub fn share_stats(&self) -> Vec<MemberStats> {
        std::iter::once(&self.member)
            .chain(self.lanes.iter().map(|l| &l.member))
            .map(Member::stats)
            .collect()
    }

    /// Whether the job is `stats = true` (the switch's JOIN_ACK says).
    pub fn has_gradient_stats(&self) -> bool {
        self.member.session().grad_stats()
    }

    /// The gradient statistics of the last completed collective, an
    /// all-reduce or reduce-scatter of a `stats = true` job: Σᵢ‖gᵢ‖² over
    /// every rank's own input, ‖Σᵢ gᵢ‖² of their float32 sum (before
    /// rounding to the job's dtype) and the ranks they cover, the same bits
    /// on every rank (docs/PROTOCOL.md, "Gradient statistics"). Both are of
    /// the raw sum: an average is the caller's division. A reduce-scatter's
    /// cover the whole n·m input, every shard.
    pub fn gradient_stats(&self) -> Result<GradStats, GradStatsError> {
        let (job, rank) = (self.cfg.job, self.cfg.rank);
        if !self.member.session().grad_stats() {
            return Err(GradStatsError::NotAStatsJob { job, rank });
        }
        match self.last_grad {
            None => Err(GradStatsError::NoCollective { job, rank }),
            Some((collective, Grad::NotSummed)) => Err(GradStatsError::NotSummed {
                job,
                rank,
                collective,
            }),
            Some((collective, Grad::Incomplete)) => Err(GradStatsError::Incomplete {
                job,
                rank,
                collective,
            }),
            Some((_, Grad::Whole(s))) => Ok(s),
        }
    }
}
