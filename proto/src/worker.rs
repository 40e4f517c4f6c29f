//! The worker side of one collective, with no I/O: which chunk to send next,
//! when to resend, what a RESULT means, and how large the window is.
//!
//! Owns: [`Collective`] (the chunks of one all-reduce, their send times,
//! acknowledgements and resend deadlines), [`RttEstimator`] (RFC 6298
//! smoothed RTT and RTO, Karn's rule: no samples from resent chunks) and
//! [`Dctcp`] (docs/PROTOCOL.md's DCTCP-style window on ECE marks).
//!
//! Invariants:
//! * Chunk i of a tensor of `len` elements covers `[i·E, min((i+1)·E, len))`
//!   and has seq `first_seq + i` (wrapping); only the last may be shorter,
//!   and only it carries `LAST`.
//! * A new chunk is sent only while `seq − oldest_unacked < window`, with
//!   `window ≤ S`: the switch can then always answer a lost RESULT from its
//!   shadow copy.
//! * Time is passed in ([`Instant`]); nothing here reads a clock.

use std::time::{Duration, Instant};

use crate::seq::serial_offset;

/// RESULTs this many chunks beyond an unanswered chunk trigger its resend.
pub const FAST_RETRANSMIT_GAP: u32 = 3;
/// Chunks resent per expiry of the resend timer (the oldest ones).
pub const TIMEOUT_RESEND_BURST: u32 = 4;

/// Tunables of a worker's transport.
#[derive(Debug, Clone, Copy)]
pub struct TransportConfig {
    /// RTO before any RTT sample.
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    /// Each resend of a chunk doubles its timeout, up to this many times.
    pub max_backoff_doublings: u32,
    /// DCTCP gain g.
    pub dctcp_gain: f64,
    /// Window at the start (clamped to 1..=S); it doubles every window of
    /// unmarked RESULTs (slow start) until the first ECE.
    pub initial_window: u16,
    /// React to ECE (off: the window stays at the advertised maximum).
    pub congestion_control: bool,
    /// Testing only: send with this window whatever the switch advertises,
    /// to exercise the switch's window enforcement.
    pub window_override: Option<u16>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            initial_rto: Duration::from_millis(50),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_secs(1),
            max_backoff_doublings: 6,
            dctcp_gain: 1.0 / 16.0,
            initial_window: 16,
            congestion_control: true,
            window_override: None,
        }
    }
}

/// Smoothed RTT and retransmission timeout (RFC 6298).
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    min_rto: Duration,
    max_rto: Duration,
}

impl RttEstimator {
    pub fn new(cfg: &TransportConfig) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: cfg.initial_rto,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
        }
    }

    pub fn on_sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(rtt);
        self.rto = (srtt + self.rttvar * 4).clamp(self.min_rto, self.max_rto);
    }

    pub fn rto(&self) -> Duration {
        self.rto
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

/// DCTCP-style window (docs/PROTOCOL.md, congestion control): per window of
/// RESULTs, α ← (1−g)·α + g·F; W ← W·(1−α/2) if F > 0, else W + 1;
/// 1 ≤ W ≤ ceiling. Before the first mark the window doubles per round
/// (slow start) from a small initial window: docs/PROTOCOL.md does not say where
/// W starts, and starting at S bursts a whole pool into the network at once.
#[derive(Debug, Clone, Copy)]
pub struct Dctcp {
    window: f64,
    alpha: f64,
    gain: f64,
    ceiling: u16,
    results_in_round: u32,
    marked_in_round: u32,
    enabled: bool,
    /// Doubling per round until the first ECE, as TCP's slow start.
    slow_start: bool,
}

impl Dctcp {
    pub fn new(cfg: &TransportConfig, ceiling: u16) -> Dctcp {
        let ceiling = ceiling.max(1);
        Dctcp {
            window: cfg.initial_window.clamp(1, ceiling) as f64,
            alpha: 0.0,
            gain: cfg.dctcp_gain,
            ceiling,
            results_in_round: 0,
            marked_in_round: 0,
            enabled: cfg.congestion_control,
            slow_start: true,
        }
    }

    /// Starts afresh under `ceiling` (a first JOIN_ACK told S and the
    /// advertised window): the window opens at the initial window, which
    /// defaults to the whole ceiling, and α returns to 0.
    pub fn reset(&mut self, cfg: &TransportConfig, ceiling: u16) {
        *self = Dctcp::new(cfg, ceiling);
    }

    /// Sets the ceiling (the smaller of S and the switch's advertised window).
    pub fn set_ceiling(&mut self, ceiling: u16) {
        self.ceiling = ceiling.max(1);
        self.window = self.window.min(self.ceiling as f64);
        if !self.enabled {
            self.window = self.ceiling as f64;
        }
    }

    pub fn on_result(&mut self, ece: bool) {
        if !self.enabled {
            return;
        }
        self.results_in_round += 1;
        if ece {
            self.marked_in_round += 1;
        }
        if self.results_in_round as f64 >= self.window.floor().max(1.0) {
            let f = self.marked_in_round as f64 / self.results_in_round as f64;
            self.alpha = (1.0 - self.gain) * self.alpha + self.gain * f;
            if f > 0.0 {
                self.slow_start = false;
                self.window *= 1.0 - self.alpha / 2.0;
            } else if self.slow_start {
                self.window *= 2.0;
            } else {
                self.window += 1.0;
            }
            self.window = self.window.clamp(1.0, self.ceiling as f64);
            self.results_in_round = 0;
            self.marked_in_round = 0;
        }
    }

    pub fn window(&self) -> u16 {
        self.window as u16
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ChunkState {
    acked: bool,
    sent: bool,
    /// Already resent early (fast retransmit) since its last timed send.
    fast_resent: bool,
    /// Its timer expired and was re-armed without a resend: its RTT would
    /// measure waiting for other ranks, not the path, so it gives no sample.
    rearmed: bool,
    sent_at: Option<Instant>,
    deadline: Option<Instant>,
    resends: u32,
}

/// One chunk to put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub seq: u32,
    pub chunk: u32,
    /// Element offset of the chunk in the tensor.
    pub offset: usize,
    pub count: u16,
    pub last: bool,
    pub retx: bool,
}

/// What a RESULT meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultOutcome {
    /// New: copy its values into the tensor at `offset`.
    Fresh {
        chunk: u32,
        offset: usize,
        count: u16,
    },
    /// Already had it.
    Duplicate,
    /// Not a chunk of this collective (e.g. a late RESULT of the previous).
    Foreign,
    /// The count differs from the chunk's: the switch and worker disagree.
    CountMismatch { expected: u16, got: u16 },
}

/// Counters of one collective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectiveStats {
    pub sent: u64,
    pub resent: u64,
    /// Resends triggered by later RESULTs rather than a timer.
    pub fast_resent: u64,
    pub results: u64,
    pub duplicate_results: u64,
    pub ece_results: u64,
}

/// The chunks of one all-reduce and their transport state.
#[derive(Debug, Clone)]
pub struct Collective {
    collective: u32,
    first_seq: u32,
    len: usize,
    elems_per_chunk: usize,
    chunks: Vec<ChunkState>,
    /// Index of the first chunk without its RESULT.
    oldest_unacked: u32,
    /// Index of the first chunk never sent.
    next_new: u32,
    acked: u32,
    /// Chunks whose deadline passed, to resend before new ones.
    due: std::collections::VecDeque<u32>,
    /// Chunks below this were already checked for fast retransmit.
    fast_cursor: u32,
    /// Lower bound of every pending deadline.
    earliest_deadline: Option<Instant>,
    last_progress: Option<Instant>,
    pub stats: CollectiveStats,
}

impl Collective {
    /// Plans collective `collective` over a tensor of `len` elements whose
    /// first chunk has seq `first_seq`.
    pub fn new(collective: u32, first_seq: u32, len: usize, elems_per_chunk: u16) -> Collective {
        let e = (elems_per_chunk as usize).max(1);
        let n = len.div_ceil(e);
        Collective {
            collective,
            first_seq,
            len,
            elems_per_chunk: e,
            chunks: vec![ChunkState::default(); n],
            oldest_unacked: 0,
            next_new: 0,
            acked: 0,
            due: std::collections::VecDeque::new(),
            fast_cursor: 0,
            earliest_deadline: None,
            last_progress: None,
            stats: CollectiveStats::default(),
        }
    }

    pub fn collective(&self) -> u32 {
        self.collective
    }
    pub fn first_seq(&self) -> u32 {
        self.first_seq
    }
    pub fn n_chunks(&self) -> u32 {
        self.chunks.len() as u32
    }
    /// The seq the next collective starts at.
    pub fn end_seq(&self) -> u32 {
        self.first_seq.wrapping_add(self.n_chunks())
    }
    pub fn is_complete(&self) -> bool {
        self.acked as usize == self.chunks.len()
    }
    /// The seq of the oldest chunk without a RESULT (the resume point to
    /// report in a JOIN), or `end_seq` when complete.
    pub fn oldest_unacked_seq(&self) -> u32 {
        self.first_seq.wrapping_add(self.oldest_unacked)
    }
    /// When the last RESULT that made progress arrived.
    pub fn last_progress(&self) -> Option<Instant> {
        self.last_progress
    }
    /// Chunks sent but not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.next_new - self.oldest_unacked
    }

    fn chunk_range(&self, i: u32) -> (usize, u16) {
        let off = i as usize * self.elems_per_chunk;
        let count = (self.len - off).min(self.elems_per_chunk);
        (off, count as u16)
    }

    fn deadline_for(&self, rtt: &RttEstimator, cfg: &TransportConfig, resends: u32) -> Duration {
        // Backoff is per chunk: each resend of a chunk doubles its wait. A
        // global backoff (RFC 6298 §5.5) starves a windowed sender of fresh
        // RTT samples under loss; the simulated-network tests show it.
        let mult = 1u32 << resends.min(cfg.max_backoff_doublings);
        (rtt.rto() * mult).min(cfg.max_rto.max(rtt.rto()))
    }

    /// Moves the oldest chunks whose deadline passed (at most
    /// [`TIMEOUT_RESEND_BURST`]) into the resend queue and re-arms the
    /// other expired ones for another RTO. Like TCP's RTO, which resends
    /// the first unacknowledged segment only: a chunk that times out most
    /// often waits for another rank, and resending a whole window of them
    /// only floods the switch with duplicates. Holes further up are found
    /// by fast retransmit.
    fn collect_due(&mut self, now: Instant, rto: Duration) {
        match self.earliest_deadline {
            Some(d) if d <= now => {}
            _ => return,
        }
        let mut earliest: Option<Instant> = None;
        let mut taken = 0;
        for i in self.oldest_unacked..self.next_new {
            let c = &mut self.chunks[i as usize];
            if c.acked || !c.sent {
                continue;
            }
            match c.deadline {
                Some(d) if d <= now && taken < TIMEOUT_RESEND_BURST => {
                    c.sent = false;
                    taken += 1;
                    self.due.push_back(i);
                }
                Some(d) => {
                    let d = if d <= now {
                        c.rearmed = true;
                        now + rto
                    } else {
                        d
                    };
                    c.deadline = Some(d);
                    earliest = Some(earliest.map_or(d, |e: Instant| e.min(d)));
                }
                None => {}
            }
        }
        self.earliest_deadline = earliest;
    }

    /// The next chunk to send now, if any: a resend whose timer expired,
    /// else a new chunk if the window allows. The caller sends it at once.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        window: u16,
        rtt: &RttEstimator,
        cfg: &TransportConfig,
    ) -> Option<Transmit> {
        if self.last_progress.is_none() {
            self.last_progress = Some(now);
        }
        self.collect_due(now, rtt.rto());
        let (i, retx) = loop {
            if let Some(i) = self.due.pop_front() {
                if self.chunks[i as usize].acked {
                    continue;
                }
                break (i, true);
            }
            let n = self.n_chunks();
            if self.next_new < n && self.next_new - self.oldest_unacked < window.max(1) as u32 {
                self.next_new += 1;
                break (
                    self.next_new - 1,
                    self.chunks[(self.next_new - 1) as usize].resends > 0,
                );
            }
            return None;
        };
        if retx {
            self.chunks[i as usize].resends += 1;
            self.stats.resent += 1;
        }
        let fast = self.chunks[i as usize].fast_resent;
        let wait = self.deadline_for(rtt, cfg, self.chunks[i as usize].resends);
        let c = &mut self.chunks[i as usize];
        c.sent = true;
        c.fast_resent = fast && retx;
        c.sent_at = Some(now);
        let deadline = now + wait;
        c.deadline = Some(deadline);
        self.earliest_deadline = Some(self.earliest_deadline.map_or(deadline, |e| e.min(deadline)));
        self.stats.sent += 1;
        let (offset, count) = self.chunk_range(i);
        Some(Transmit {
            seq: self.first_seq.wrapping_add(i),
            chunk: i,
            offset,
            count,
            last: i + 1 == self.n_chunks(),
            retx,
        })
    }

    /// The earliest instant at which [`Collective::poll_transmit`] may have a
    /// resend to offer.
    pub fn next_timeout(&self) -> Option<Instant> {
        if self.is_complete() {
            return None;
        }
        self.earliest_deadline
    }

    /// Takes a RESULT for `seq` carrying `count` values.
    pub fn on_result(
        &mut self,
        seq: u32,
        count: u16,
        ece: bool,
        now: Instant,
        rtt: &mut RttEstimator,
        cc: &mut Dctcp,
    ) -> ResultOutcome {
        let off = serial_offset(self.first_seq, seq);
        if off < 0 || off >= self.n_chunks() as i64 {
            return ResultOutcome::Foreign;
        }
        let i = off as u32;
        let (offset, expected) = self.chunk_range(i);
        if count != expected {
            return ResultOutcome::CountMismatch {
                expected,
                got: count,
            };
        }
        let c = &mut self.chunks[i as usize];
        if c.acked {
            self.stats.duplicate_results += 1;
            return ResultOutcome::Duplicate;
        }
        c.acked = true;
        if c.resends == 0 && !c.rearmed {
            if let Some(t) = c.sent_at {
                rtt.on_sample(now.saturating_duration_since(t));
            }
        }
        self.acked += 1;
        self.stats.results += 1;
        if ece {
            self.stats.ece_results += 1;
        }
        cc.on_result(ece);
        self.last_progress = Some(now);
        while (self.oldest_unacked as usize) < self.chunks.len()
            && self.chunks[self.oldest_unacked as usize].acked
        {
            self.oldest_unacked += 1;
        }
        if self.next_new < self.oldest_unacked {
            self.next_new = self.oldest_unacked;
        }
        self.fast_retransmit(i);
        ResultOutcome::Fresh {
            chunk: i,
            offset,
            count,
        }
    }

    /// RESULTs for chunks [`FAST_RETRANSMIT_GAP`] or more beyond an
    /// unanswered one mean it (or its RESULT) was most likely lost: resend
    /// it now instead of waiting for its timer, once per send (as TCP's fast
    /// retransmit does on three duplicate ACKs). Without it each loss holds
    /// the window for a full RTO while every other rank resends its copy.
    fn fast_retransmit(&mut self, answered: u32) {
        let Some(end) = answered.checked_sub(FAST_RETRANSMIT_GAP) else {
            return;
        };
        // Every chunk is looked at once: the cursor only moves forward.
        let start = self.oldest_unacked.max(self.fast_cursor);
        for j in start..=end {
            let c = &mut self.chunks[j as usize];
            if !c.acked && c.sent && !c.fast_resent {
                c.sent = false;
                c.fast_resent = true;
                self.stats.fast_resent += 1;
                self.due.push_back(j);
            }
        }
        self.fast_cursor = self.fast_cursor.max(end + 1);
    }

    /// Restarts from `seq` after a re-join: every chunk from there on is
    /// sent again (its RESULT may come again; it is bit-identical). A `seq`
    /// before this collective restarts it from its first chunk.
    pub fn restart_from(&mut self, seq: u32) {
        let off = serial_offset(self.first_seq, seq).clamp(0, self.n_chunks() as i64) as u32;
        for c in &mut self.chunks[off as usize..] {
            if c.acked {
                self.acked -= 1;
            }
            *c = ChunkState::default();
        }
        self.oldest_unacked = self.oldest_unacked.min(off);
        self.next_new = off;
        self.fast_cursor = self.fast_cursor.min(off);
        // Chunks before `off` that were still unacked stay owed; make them
        // due now.
        self.due.clear();
        for i in self.oldest_unacked..off {
            let c = &mut self.chunks[i as usize];
            if !c.acked {
                c.sent = false;
                self.due.push_back(i);
            }
        }
        self.earliest_deadline = None;
        self.last_progress = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (TransportConfig, RttEstimator, Dctcp) {
        let cfg = TransportConfig::default();
        (cfg, RttEstimator::new(&cfg), Dctcp::new(&cfg, 8))
    }

    #[test]
    fn chunking_covers_tensor_with_partial_last() {
        let (cfg, rtt, _) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 100, 10, 4);
        assert_eq!(c.n_chunks(), 3);
        let sent: Vec<Transmit> =
            std::iter::from_fn(|| c.poll_transmit(t0, 8, &rtt, &cfg)).collect();
        assert_eq!(
            sent.iter()
                .map(|t| (t.seq, t.offset, t.count, t.last))
                .collect::<Vec<_>>(),
            vec![(100, 0, 4, false), (101, 4, 4, false), (102, 8, 2, true)]
        );
        assert_eq!(c.end_seq(), 103);
    }

    #[test]
    fn window_limits_new_chunks_relative_to_oldest_unacked() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 0, 100, 1);
        let n = std::iter::from_fn(|| c.poll_transmit(t0, 4, &rtt, &cfg)).count();
        assert_eq!(n, 4);
        // RESULT for seq 1 does not move the oldest unacked (seq 0).
        c.on_result(1, 1, false, t0, &mut rtt, &mut cc);
        assert!(c.poll_transmit(t0, 4, &rtt, &cfg).is_none());
        c.on_result(0, 1, false, t0, &mut rtt, &mut cc);
        let more: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t0, 4, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(more, vec![4, 5]);
    }

    #[test]
    fn resend_after_timeout_with_backoff() {
        let (cfg, rtt, _) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 0, 1, 1);
        let first = c.poll_transmit(t0, 4, &rtt, &cfg).unwrap();
        assert!(!first.retx);
        assert!(c
            .poll_transmit(t0 + cfg.initial_rto / 2, 4, &rtt, &cfg)
            .is_none());
        let t1 = t0 + cfg.initial_rto;
        let again = c.poll_transmit(t1, 4, &rtt, &cfg).unwrap();
        assert!(again.retx);
        assert_eq!(again.seq, 0);
        // Backed off: twice the RTO this time.
        assert!(c
            .poll_transmit(t1 + cfg.initial_rto + cfg.initial_rto / 2, 4, &rtt, &cfg)
            .is_none());
        assert!(c
            .poll_transmit(t1 + cfg.initial_rto * 2, 4, &rtt, &cfg)
            .is_some());
    }

    #[test]
    fn rtt_samples_shrink_the_rto_and_karn_ignores_resends() {
        let cfg = TransportConfig {
            min_rto: Duration::from_millis(5),
            ..TransportConfig::default()
        };
        let (mut rtt, mut cc) = (RttEstimator::new(&cfg), Dctcp::new(&cfg, 8));
        let t0 = Instant::now();
        let mut c = Collective::new(0, 0, 3, 1);
        c.poll_transmit(t0, 4, &rtt, &cfg).unwrap();
        c.on_result(
            0,
            1,
            false,
            t0 + Duration::from_millis(1),
            &mut rtt,
            &mut cc,
        );
        assert_eq!(rtt.srtt(), Some(Duration::from_millis(1)));
        // srtt + 4·rttvar = 3 ms, raised to the 5 ms floor.
        assert_eq!(rtt.rto(), Duration::from_millis(5));
        // Chunk 1 is resent; its RESULT gives no sample.
        let t1 = t0 + Duration::from_millis(2);
        c.poll_transmit(t1, 1, &rtt, &cfg).unwrap();
        let t2 = t1 + Duration::from_millis(5);
        assert!(c.poll_transmit(t2, 1, &rtt, &cfg).unwrap().retx);
        c.on_result(
            1,
            1,
            false,
            t2 + Duration::from_millis(40),
            &mut rtt,
            &mut cc,
        );
        assert_eq!(rtt.srtt(), Some(Duration::from_millis(1)));
    }

    #[test]
    fn duplicate_foreign_and_mismatched_results() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 10, 5, 4);
        while c.poll_transmit(t0, 8, &rtt, &cfg).is_some() {}
        assert_eq!(
            c.on_result(11, 1, false, t0, &mut rtt, &mut cc),
            ResultOutcome::Fresh {
                chunk: 1,
                offset: 4,
                count: 1
            }
        );
        assert_eq!(
            c.on_result(11, 1, false, t0, &mut rtt, &mut cc),
            ResultOutcome::Duplicate
        );
        assert_eq!(
            c.on_result(9, 4, false, t0, &mut rtt, &mut cc),
            ResultOutcome::Foreign
        );
        assert_eq!(
            c.on_result(10, 3, false, t0, &mut rtt, &mut cc),
            ResultOutcome::CountMismatch {
                expected: 4,
                got: 3
            }
        );
        assert!(!c.is_complete());
        c.on_result(10, 4, false, t0, &mut rtt, &mut cc);
        assert!(c.is_complete());
    }

    #[test]
    fn restart_resends_from_resume_point() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(3, 50, 6, 1);
        while c.poll_transmit(t0, 8, &rtt, &cfg).is_some() {}
        for s in 50..54 {
            c.on_result(s, 1, false, t0, &mut rtt, &mut cc);
        }
        c.restart_from(52);
        assert_eq!(c.oldest_unacked_seq(), 52);
        let again: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t0, 8, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(again, vec![52, 53, 54, 55]);
    }

    #[test]
    fn window_opens_at_the_ceiling_once_it_is_known() {
        let cfg = TransportConfig::default();
        // Before JOIN_ACK the ceiling is unknown (1); after it, the window
        // starts at the whole pool, not at 1.
        let mut cc = Dctcp::new(&cfg, 1);
        assert_eq!(cc.window(), 1);
        cc.reset(&cfg, 256);
        assert_eq!(cc.window(), 16);
        // Slow start: doubles per unmarked round up to the ceiling.
        for _ in 0..16 {
            cc.on_result(false);
        }
        assert_eq!(cc.window(), 32);
        cc.set_ceiling(20);
        assert_eq!(cc.window(), 20);
    }

    #[test]
    fn later_results_resend_a_hole_without_waiting_for_its_timer() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 0, 10, 1);
        while c.poll_transmit(t0, 8, &rtt, &cfg).is_some() {}
        // Chunk 0 is lost; 1 and 2 answered: not yet (and chunk 0 still
        // holds the window, so nothing new goes either).
        c.on_result(1, 1, false, t0, &mut rtt, &mut cc);
        c.on_result(2, 1, false, t0, &mut rtt, &mut cc);
        assert_eq!(c.poll_transmit(t0, 8, &rtt, &cfg), None);
        // A third later RESULT: chunk 0 goes again at once, flagged RETX.
        c.on_result(3, 1, false, t0, &mut rtt, &mut cc);
        let t = c.poll_transmit(t0, 8, &rtt, &cfg).unwrap();
        assert_eq!((t.seq, t.retx), (0, true));
        // Only once per send: more RESULTs do not resend it again.
        c.on_result(4, 1, false, t0, &mut rtt, &mut cc);
        assert_eq!(c.poll_transmit(t0, 8, &rtt, &cfg), None);
        assert_eq!(c.stats.fast_resent, 1);
        // Its RESULT arrives: the window slides past 0..4.
        c.on_result(0, 1, false, t0, &mut rtt, &mut cc);
        assert_eq!(c.poll_transmit(t0, 8, &rtt, &cfg).map(|t| t.seq), Some(8));
    }

    #[test]
    fn dctcp_grows_without_marks_and_shrinks_with_them() {
        let cfg = TransportConfig {
            initial_window: 4,
            ..TransportConfig::default()
        };
        let mut cc = Dctcp::new(&cfg, 64);
        for _ in 0..4 {
            cc.on_result(false);
        }
        // Slow start doubled it.
        assert_eq!(cc.window(), 8);
        for _ in 0..8 {
            cc.on_result(true);
        }
        // α = g·1 = 1/16; W = 8·(1 − 1/32) = 7.75; slow start is over.
        assert!((cc.alpha() - 1.0 / 16.0).abs() < 1e-12);
        assert_eq!(cc.window(), 7);
        for _ in 0..7 {
            cc.on_result(false);
        }
        // Additive increase now: 7.75 + 1.
        assert_eq!(cc.window(), 8);
        let mut floor = Dctcp::new(&cfg, 64);
        for _ in 0..10_000 {
            floor.on_result(true);
        }
        assert_eq!(floor.window(), 1);
        let mut ceil = Dctcp::new(&cfg, 6);
        for _ in 0..10_000 {
            ceil.on_result(false);
        }
        assert_eq!(ceil.window(), 6);
    }
}
