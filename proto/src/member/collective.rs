//! One collective on the worker's side: which chunk to send next, when to
//! resend, what a RESULT means: [`Collective`], its [`Transmit`]s,
//! [`ResultOutcome`]s and counters, and the reference statistics
//! ([`reference_grad_stats`]).
//!
//! Invariants:
//! * Chunk i has seq `first_seq + i` (wrapping); only the collective's last
//!   chunk carries `LAST`; the shards interleave in blocks of
//!   [`interleave_block`] chunks ([`crate::member::shape`]).
//! * Every kind sends every chunk (NOVAL where the rank has no values for
//!   it) and waits for every chunk's RESULT (NOVAL where it gets none), so
//!   window, resends and restarts are the same for all of them.
//! * A new chunk is sent only while `seq − oldest_unacked < window`; the
//!   caller passes `window ≤ S` ([`crate::member::Member`] passes
//!   min(DCTCP, advertised)), so the switch can always answer a lost RESULT
//!   from its shadow copy.
//! * RTT samples follow Karn's rule: none from a resent chunk, nor from one
//!   whose timer was re-armed without a resend, except the second RESULT
//!   of a chunk resent once when it came later than the RTO after the
//!   resend: it answers the resend, and says the RTO is too short.
//! * The straggler hold ([`Collective::with_hold`]; docs/PROTOCOL.md,
//!   "Reliability"): a timeout of the oldest chunk asks for a probe
//!   ([`Collective::take_probe`]), at most one per that chunk's timeout;
//!   timeouts resend nothing only while the last probe's answer
//!   ([`Collective::on_probe_answer`]) said another rank is missing and is
//!   fresh; only the oldest's expiry resends. Off, timeouts resend as
//!   before.
//! * Time is passed in ([`Instant`]); nothing here reads a clock.
//! * A share ([`Collective::with_share`]) owns the chunks whose seq is
//!   `share` mod `shares`: it sends and awaits only those. The others
//!   count as answered from the start and stay so through restarts, so
//!   `oldest_unacked`, the window and completion are the share's own, and
//!   their RESULTs are [`ResultOutcome::Foreign`]. The window is still a
//!   seq distance, so T shares of one rank keep within every seq lane's
//!   window at the switch (docs/design/worker-threads.md, "Windows").
//! * A `stats = true` job's chunk trailers ([`GradStats`]) are kept per
//!   chunk, the first one of each chunk (a resend's is the same bits), and
//!   added in seq order once every chunk has one
//!   ([`Collective::grad_stats`]), so arrival order, loss and duplicates
//!   cannot change the collective's statistics. Their store is allocated
//!   once per collective, at its first trailer; nothing per RESULT. A
//!   collective begun again on other shares mid-way keeps the trailers the
//!   old shares got ([`Collective::take_trailers_of_shares`],
//!   [`Collective::keep_trailers`]): they are the same bits a resend's
//!   would be.

use std::time::{Duration, Instant};

use crate::member::config::TransportConfig;
use crate::member::dctcp::Dctcp;
use crate::member::rtt::RttEstimator;
use crate::member::shape::{interleave_block, Shape};
use crate::seq::serial_offset;
use crate::stats::{self, GradStats};
use crate::wire::{flags, HeaderRepr, Kind};

/// RESULTs this many chunks beyond an unanswered chunk trigger its resend.
pub const FAST_RETRANSMIT_GAP: u32 = 3;
/// Chunks resent per expiry of the resend timer (the oldest ones).
pub const TIMEOUT_RESEND_BURST: u32 = 4;
/// The straggler hold keeps to the last probe's answer for this many RTOs
/// after it came, judged at the time a timer was due (docs/PROTOCOL.md,
/// "Reliability").
pub const HOLD_FRESH_RTOS: u32 = 2;

#[derive(Debug, Clone, Copy, Default)]
struct ChunkState {
    acked: bool,
    sent: bool,
    /// Already resent early (fast retransmit) since its last timed send.
    fast_resent: bool,
    /// Its timer expired and was re-armed without a resend: its RTT would
    /// measure waiting for other ranks, not the path, so it gives no sample.
    rearmed: bool,
    /// A duplicate RESULT already gave this chunk's resend a sample.
    dup_sampled: bool,
    sent_at: Option<Instant>,
    deadline: Option<Instant>,
    resends: u32,
}

/// The straggler hold (docs/PROTOCOL.md, "Reliability"): what the last
/// probe (a HEARTBEAT about the oldest unanswered chunk) said. Held: our
/// DATA of that seq is in the switch's slot and another rank's is missing,
/// so a resend would be a duplicate into an incomplete slot.
#[derive(Debug, Clone, Copy, Default)]
struct Hold {
    /// The member can probe (a session that sends control messages) and
    /// the rule is on; off: today's resends alone.
    enabled: bool,
    /// The last answer said another rank (or a spine) is missing.
    held: bool,
    /// The last probe: its seq, when it went out, how long the chunk's
    /// timeout then was, and when the first answer to it came.
    probe: Option<Probe>,
    /// A probe to send now (a seq), taken by [`Collective::take_probe`].
    want: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    seq: u32,
    at: Instant,
    wait: Duration,
    /// When the first answer came.
    answered: Option<Instant>,
}

impl Probe {
    /// Whether it is younger than the timeout it went out with at `now`
    /// (until then no new probe goes, and its answer may still come).
    fn within_its_wait(&self, now: Instant) -> bool {
        now < self.at + self.wait
    }
}

/// What the switch said about a probed seq (a HEARTBEAT answer), as the
/// straggler hold reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// Our DATA is in; other ranks' (or the spine's) are missing.
    OthersMissing,
    /// Our DATA is missing (it was lost).
    OursMissing,
    /// Nothing is missing: the slot is complete and its RESULT was lost.
    Complete,
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
    /// The collective's kind (the DATA's flag bits 4–5).
    pub kind: Kind,
    /// The chunk's owner rank (the DATA's `window` field in kinds other
    /// than all-reduce; 0 in an all-reduce).
    pub owner: u16,
    /// Element offset in the caller's *input* of the values to send; `None`:
    /// this rank sends a NOVAL DATA for the chunk.
    pub values: Option<usize>,
}

/// What a RESULT meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultOutcome {
    /// New: copy its values (if `into` is set) into the output.
    Fresh {
        chunk: u32,
        /// Element offset of the chunk in the collective's layout (an
        /// all-reduce's tensor; a reduce-scatter's input; an all-gather's
        /// output).
        offset: usize,
        count: u16,
        /// Element offset in the caller's *output* where the RESULT's values
        /// go; `None`: a NOVAL RESULT, an acknowledgement only.
        into: Option<usize>,
        /// A reduce-scatter chunk this rank kept: the element offset in the
        /// caller's *input* of its own values, which go into the output as
        /// `RESULT + own` ([`crate::elements::add_own_le`]) instead of the
        /// RESULT's values alone.
        own: Option<usize>,
    },
    /// Already had it.
    Duplicate,
    /// Not a chunk of this collective (e.g. a late RESULT of the previous).
    Foreign,
    /// The count differs from the chunk's: the switch and worker disagree.
    CountMismatch { expected: u16, got: u16 },
    /// Another kind, or values where NOVAL was due (or the reverse): not an
    /// answer to what this rank sent; ignored.
    ShapeMismatch {
        expected: Kind,
        got: Kind,
        expected_values: bool,
    },
}

/// Where chunk `i` lies: its shard's owner, its offset within the shard and
/// in the layout, and its element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkPlace {
    owner: u16,
    within: usize,
    offset: usize,
    count: u16,
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
    /// HEARTBEATs sent about the oldest chunk when it timed out (the
    /// straggler hold's probes).
    pub probes: u64,
    /// Timeouts of the oldest chunk that resent nothing because the last
    /// probe's answer said another rank is missing.
    pub held_timeouts: u64,
}

impl CollectiveStats {
    /// Adds `o`'s counters to these.
    pub fn add(&mut self, o: &CollectiveStats) {
        self.sent += o.sent;
        self.resent += o.resent;
        self.fast_resent += o.fast_resent;
        self.results += o.results;
        self.duplicate_results += o.duplicate_results;
        self.ece_results += o.ece_results;
        self.probes += o.probes;
        self.held_timeouts += o.held_timeouts;
    }
}

/// The chunks of one collective and their transport state.
#[derive(Debug, Clone)]
pub struct Collective {
    collective: u32,
    first_seq: u32,
    shape: Shape,
    elems_per_chunk: usize,
    /// Chunks per shard.
    per_shard: usize,
    chunks: Vec<ChunkState>,
    /// Index of the first chunk without its RESULT.
    oldest_unacked: u32,
    /// Index of the first chunk never sent.
    next_new: u32,
    acked: u32,
    /// Chunks whose deadline passed, to resend before new ones.
    due: std::collections::VecDeque<u32>,
    /// Per seq lane of the switch (chunk index mod lanes: a collective's
    /// chunks have consecutive seqs), chunks of the lane below this were
    /// already checked for fast retransmit. One entry: one lane.
    fast_cursor: Vec<u32>,
    /// This collective carries the chunks whose seq is `share.0` mod
    /// `share.1` (`(0, 1)`: every chunk).
    share: (u32, u32),
    /// Lower bound of every pending deadline.
    earliest_deadline: Option<Instant>,
    last_progress: Option<Instant>,
    /// The chunks' statistics trailers (`stats = true` jobs; None until the
    /// first).
    grad: Option<stats::CollectiveStats>,
    /// The straggler hold.
    hold: Hold,
    pub stats: CollectiveStats,
}

impl Collective {
    /// Plans all-reduce `collective` over a tensor of `len` elements whose
    /// first chunk has seq `first_seq`.
    pub fn new(collective: u32, first_seq: u32, len: usize, elems_per_chunk: u16) -> Collective {
        Collective::with_shape(
            collective,
            first_seq,
            Shape::all_reduce(len),
            elems_per_chunk,
        )
    }

    /// Plans collective `collective` of `shape` whose first chunk has seq
    /// `first_seq`.
    pub fn with_shape(
        collective: u32,
        first_seq: u32,
        shape: Shape,
        elems_per_chunk: u16,
    ) -> Collective {
        let e = (elems_per_chunk as usize).max(1);
        Collective {
            collective,
            first_seq,
            shape,
            elems_per_chunk: e,
            per_shard: shape.shard_len.div_ceil(e),
            chunks: vec![ChunkState::default(); shape.n_chunks(elems_per_chunk)],
            oldest_unacked: 0,
            next_new: 0,
            acked: 0,
            due: std::collections::VecDeque::new(),
            fast_cursor: vec![0],
            share: (0, 1),
            earliest_deadline: None,
            last_progress: None,
            grad: None,
            hold: Hold::default(),
            stats: CollectiveStats::default(),
        }
    }

    /// The switch takes this collective's DATA on `lanes` seq lanes (a
    /// power of two; docs/PROTOCOL.md, "Seq lanes"): lanes complete
    /// independently, so RESULTs of one lane may overtake another's, and
    /// fast retransmit compares a chunk only with later RESULTs of its own
    /// lane.
    pub fn with_seq_lanes(mut self, lanes: usize) -> Collective {
        self.fast_cursor = vec![0; lanes.max(1)];
        self
    }

    /// Carries only the chunks whose seq is `share` mod `shares` (a power
    /// of two dividing the switch's seq lanes, so that a share is a set of
    /// whole lanes; `share < shares`): one of T threads' part of the
    /// collective (docs/design/worker-threads.md). The other chunks are
    /// another share's: never sent, never awaited. Call it before the first
    /// [`Collective::poll_transmit`].
    ///
    /// Panics if `shares` is 0 or `share >= shares`: the caller's sizing.
    pub fn with_share(mut self, share: u32, shares: u32) -> Collective {
        assert!(share < shares, "share {share} of {shares}");
        self.share = (share, shares);
        self.mark_foreign(0);
        self.skip_answered();
        self.next_new = self.oldest_unacked;
        self
    }

    /// Which share of its collective this is, and of how many.
    pub fn share(&self) -> (u32, u32) {
        self.share
    }

    /// Whether chunk `i` is this share's (one share: every chunk, with no
    /// division on the send path).
    fn owns(&self, i: u32) -> bool {
        self.share.1 == 1 || self.first_seq.wrapping_add(i) % self.share.1 == self.share.0
    }

    /// Moves `oldest_unacked` past the answered chunks at its front.
    fn skip_answered(&mut self) {
        while (self.oldest_unacked as usize) < self.chunks.len()
            && self.chunks[self.oldest_unacked as usize].acked
        {
            self.oldest_unacked += 1;
        }
    }

    /// Marks the chunks from `from` on that are another share's as
    /// answered (they are never sent or awaited here).
    fn mark_foreign(&mut self, from: u32) {
        if self.share.1 == 1 {
            return; // Every chunk is this share's.
        }
        for i in from..self.n_chunks() {
            if !self.owns(i) {
                self.chunks[i as usize].acked = true;
                self.acked += 1;
            }
        }
    }

    /// Chunks this share sends and awaits.
    pub fn owned_chunks(&self) -> u32 {
        (0..self.n_chunks()).filter(|&i| self.owns(i)).count() as u32
    }

    pub fn collective(&self) -> u32 {
        self.collective
    }
    pub fn shape(&self) -> Shape {
        self.shape
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

    fn place(&self, i: u32) -> ChunkPlace {
        // Shards interleave in blocks of `interleave_block` chunks
        // (docs/PROTOCOL.md, "Collective kinds"): every owner's chunks are
        // in flight at once, so every rank's link works through the whole
        // collective, not only during its own shard; a block keeps runs of
        // equal-sized DATA for GSO where chunks are small. Every shard has
        // per_shard chunks; the last round of blocks may be shorter.
        let (i, shards) = (i as usize, self.shape.shards as usize);
        let b = interleave_block(self.elems_per_chunk);
        let round = b * shards;
        let (r, k) = (i / round, i % round);
        // Rounds before the last are whole; the last has `rest` chunks per shard.
        let rest = (self.per_shard - r * b).min(b);
        let (shard, j) = (k / rest, r * b + k % rest);
        let within = j * self.elems_per_chunk;
        let count = (self.shape.shard_len - within).min(self.elems_per_chunk);
        let owner = match (self.shape.kind, self.shape.root) {
            (Kind::AllReduce, _) => 0,
            (_, Some(root)) => root,
            (_, None) => shard as u16,
        };
        ChunkPlace {
            owner,
            within,
            offset: shard * self.shape.shard_len + within,
            count: count as u16,
        }
    }

    /// Where this rank's values for chunk `p` lie in its input (None: NOVAL).
    fn values_at(&self, p: &ChunkPlace) -> Option<usize> {
        let s = &self.shape;
        if self.keeps(p) {
            return None;
        }
        s.kind.sends_values(s.rank, p.owner).then_some(
            // An all-gather's input is the rank's own shard alone.
            if s.kind == Kind::AllGather && s.root.is_none() {
                p.within
            } else {
                p.offset
            },
        )
    }

    /// Whether this rank owns chunk `p` of a reduce-scatter and keeps its
    /// values: it sends NOVAL and adds them to the RESULT's.
    fn keeps(&self, p: &ChunkPlace) -> bool {
        self.shape.owner_keeps && p.owner == self.shape.rank
    }

    /// Where chunk `p`'s RESULT values go in this rank's output (None: it
    /// gets a NOVAL RESULT).
    fn result_at(&self, p: &ChunkPlace) -> Option<usize> {
        let s = &self.shape;
        s.kind.receives_values(s.rank, p.owner).then_some(
            // A reduce-scatter's output is the rank's own shard alone.
            if s.kind == Kind::ReduceScatter {
                p.within
            } else {
                p.offset
            },
        )
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
    ///
    /// With the straggler hold on ([`Collective::with_hold`]; docs/PROTOCOL.md,
    /// "Reliability"):
    /// * an expiry of the oldest chunk also asks the switch what its seq
    ///   waits for (a probe, [`Collective::take_probe`]), at most once per
    ///   the chunk's timeout;
    /// * while the last answer said our DATA is in and another rank's is
    ///   missing, and it is fresh (it came less than [`HOLD_FRESH_RTOS`]
    ///   RTOs before the expiry was due, however late its timer ran; or
    ///   the probe after it is younger than its timeout),
    ///   every expiry re-arms without a resend, the oldest for its own
    ///   (backed-off) timeout, the others for an RTO;
    /// * only an expiry of the oldest resends: a later chunk that times out
    ///   alone (the oldest's timer backed off) waits for what the oldest
    ///   waits for, and is resent by fast retransmit, by a probe's answer,
    ///   or once it is the oldest.
    fn collect_due(&mut self, now: Instant, rtt: &RttEstimator, cfg: &TransportConfig) {
        // When the earliest timer was due (however late it runs now).
        let due = match self.earliest_deadline {
            Some(d) if d <= now => d,
            _ => return,
        };
        let rto = rtt.rto();
        let o = self.oldest_unacked;
        let oldest_expired = self.chunks.get(o as usize).is_some_and(|c| {
            o < self.next_new && !c.acked && c.sent && c.deadline.is_some_and(|d| d <= now)
        });
        let on = self.hold.enabled;
        // The last probe is within the timeout it went out with: no new
        // one yet, and its answer may still come.
        let recent = self.hold.probe.is_some_and(|p| p.within_its_wait(now));
        // Fresh when the timer was due, not when it ran: a timer that
        // fires late (by a scheduler's millisecond, on a path whose RTT is
        // tens of microseconds) would otherwise find every answer stale
        // and resend what the switch said it has. Not longer than that:
        // the hold also keeps a later chunk whose own DATA was lost from
        // resending on its timeout.
        let fresh = self
            .hold
            .probe
            .is_some_and(|p| p.answered.is_some_and(|t| due <= t + rto * HOLD_FRESH_RTOS));
        let hold = on && self.hold.held && (fresh || recent);
        if !hold {
            // Never kept without a fresh answer.
            self.hold.held = false;
        }
        let rearm_only = hold || (on && !oldest_expired);
        if hold && oldest_expired {
            self.stats.held_timeouts += 1;
        }
        // The oldest's timeout as it stands (held expiries do not double
        // it: each costs a probe only, and an answer naming our rank
        // resends at once).
        let wait = self
            .chunks
            .get(o as usize)
            .map(|c| self.deadline_for(rtt, cfg, c.resends));
        if let (true, true, false, Some(wait)) = (on, oldest_expired, recent, wait) {
            let seq = self.first_seq.wrapping_add(o);
            self.hold.probe = Some(Probe {
                seq,
                at: now,
                wait,
                answered: None,
            });
            self.hold.want = Some(seq);
            self.stats.probes += 1;
        }
        let mut earliest: Option<Instant> = None;
        let mut taken = 0;
        for i in self.oldest_unacked..self.next_new {
            let c = &mut self.chunks[i as usize];
            if c.acked || !c.sent {
                continue;
            }
            match c.deadline {
                Some(d) if d <= now && !rearm_only && taken < TIMEOUT_RESEND_BURST => {
                    c.sent = false;
                    taken += 1;
                    self.due.push_back(i);
                }
                Some(d) => {
                    let d = if d <= now {
                        c.rearmed = true;
                        match wait {
                            Some(w) if i == o && hold => now + w,
                            _ => now + rto,
                        }
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

    /// Turns the straggler hold on or off for this collective (on: the
    /// caller sends the probes [`Collective::take_probe`] asks for and
    /// passes their answers to [`Collective::on_probe_answer`], itself or,
    /// for a lane share of a worker's threads, through the thread that
    /// sends control messages; off: resends alone, as a member whose
    /// probes nobody sends does).
    pub fn with_hold(mut self, on: bool) -> Collective {
        self.hold.enabled = on;
        self
    }

    /// The seq to send a probe about now (a HEARTBEAT), if the straggler
    /// hold wants one; taken once.
    pub fn take_probe(&mut self) -> Option<u32> {
        self.hold.want.take()
    }

    /// Whether the last probe still waits for its answer at `now`: none
    /// came, and it is younger than the timeout it went out with (after
    /// that a timeout no longer waits for it). A caller that is handed
    /// answers by another thread looks for one at least that often.
    pub fn awaits_answer(&self, now: Instant) -> bool {
        self.hold.enabled
            && self
                .hold
                .probe
                .is_some_and(|p| p.answered.is_none() && p.within_its_wait(now))
    }

    /// The switch's answer about `seq` (a HEARTBEAT answer): if it answers
    /// the latest probe, the first answer to it decides the hold. Others
    /// missing: held (timeouts re-arm without resending until an answer
    /// says otherwise or none comes). Ours missing (our DATA was lost) or
    /// nothing missing (the RESULT was lost): the hold ends and the probed
    /// chunk, if still unanswered, is resent at once.
    pub fn on_probe_answer(&mut self, seq: u32, answer: ProbeAnswer, now: Instant) {
        let Some(p) = self.hold.probe.as_mut() else {
            return;
        };
        if !self.hold.enabled || p.seq != seq || p.answered.is_some() {
            return;
        }
        p.answered = Some(now);
        let probed_at = p.at;
        let off = serial_offset(self.first_seq, seq);
        if off < 0 || off >= self.n_chunks() as i64 {
            return;
        }
        let i = off as u32;
        if answer == ProbeAnswer::OthersMissing {
            // Also when the chunk's RESULT came meanwhile (its slot then
            // completed): when the switch answered, it waited for another
            // rank with our DATA in, and the chunks after it most likely
            // wait for the same one (a straggler completes slot after
            // slot).
            self.hold.held = true;
            return;
        }
        if self.chunks[i as usize].acked {
            // The RESULT came meanwhile: the answer says nothing about the
            // chunks still waiting; the hold stays as it was.
            return;
        }
        self.hold.held = false;
        let c = &mut self.chunks[i as usize];
        // A chunk resent with the probe or since needs no other resend.
        if i < self.next_new && !c.acked && c.sent && c.sent_at.is_some_and(|t| t < probed_at) {
            c.sent = false;
            self.due.push_back(i);
        }
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
        self.collect_due(now, rtt, cfg);
        let (i, retx) = loop {
            if let Some(i) = self.due.pop_front() {
                if self.chunks[i as usize].acked {
                    continue;
                }
                break (i, true);
            }
            let n = self.n_chunks();
            // Another share's chunks are never sent here.
            while self.next_new < n && !self.owns(self.next_new) {
                self.next_new += 1;
            }
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
        let p = self.place(i);
        Some(Transmit {
            seq: self.first_seq.wrapping_add(i),
            chunk: i,
            offset: p.offset,
            count: p.count,
            last: i + 1 == self.n_chunks(),
            retx,
            kind: self.shape.kind,
            owner: p.owner,
            values: self.values_at(&p),
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

    /// Takes an all-reduce RESULT for `seq` carrying `count` values.
    pub fn on_result(
        &mut self,
        seq: u32,
        count: u16,
        ece: bool,
        now: Instant,
        rtt: &mut RttEstimator,
        cc: &mut Dctcp,
    ) -> ResultOutcome {
        self.take_result(seq, count, (Kind::AllReduce, false), ece, now, rtt, cc)
    }

    /// Takes a parsed RESULT header of any kind (its seq, count, kind,
    /// NOVAL and ECE); the caller copies the values where
    /// [`ResultOutcome::Fresh`] says.
    pub fn on_result_header(
        &mut self,
        r: &HeaderRepr,
        now: Instant,
        rtt: &mut RttEstimator,
        cc: &mut Dctcp,
    ) -> ResultOutcome {
        self.on_result_with_stats(r, None, now, rtt, cc)
    }

    /// [`Collective::on_result_header`] for a RESULT that may carry its
    /// chunk's statistics trailer (`proto::session`'s `Event::Result`
    /// gives it): a fresh chunk's trailer is recorded for
    /// [`Collective::grad_stats`]; a duplicate's is not looked at (the
    /// switch resends the same bits).
    pub fn on_result_with_stats(
        &mut self,
        r: &HeaderRepr,
        trailer: Option<GradStats>,
        now: Instant,
        rtt: &mut RttEstimator,
        cc: &mut Dctcp,
    ) -> ResultOutcome {
        let ece = r.has_flag(flags::ECE);
        let got = (r.kind(), r.no_values());
        let outcome = self.take_result(r.seq, r.count, got, ece, now, rtt, cc);
        if let (ResultOutcome::Fresh { chunk, .. }, Some(s)) = (outcome, trailer) {
            let n = self.chunks.len();
            self.grad
                .get_or_insert_with(|| {
                    let mut g = stats::CollectiveStats::default();
                    g.start(n);
                    g
                })
                .record(chunk as usize, s);
        }
        outcome
    }

    /// The collective's gradient statistics: every chunk's trailer added in
    /// seq order (docs/PROTOCOL.md, "Gradient statistics"). `None` until
    /// every chunk's RESULT came with a trailer (incomplete, a job without
    /// statistics, or an all-gather).
    pub fn grad_stats(&self) -> Option<GradStats> {
        self.grad.as_ref()?.total()
    }

    /// The gradient statistics of one collective carried by `shares`
    /// ([`Collective::with_share`]): every chunk's trailer, from the share
    /// that has it (the one that owns it, or the one that kept an earlier
    /// share's: [`Collective::keep_trailers`]), added in seq order, the
    /// same bits as one whole collective's [`Collective::grad_stats`].
    /// `None` until every chunk has its trailer in some share (a share
    /// with none yet adds nothing).
    pub fn grad_stats_of_shares(shares: &[&Collective]) -> Option<GradStats> {
        let grads: Vec<&stats::CollectiveStats> =
            shares.iter().filter_map(|c| c.grad.as_ref()).collect();
        stats::CollectiveStats::total_of(&grads)
    }

    /// The statistics trailers that `shares`, the shares of one collective
    /// ([`Collective::with_share`]), got so far, taken out of them into one
    /// store (each chunk's first one; `None`: none yet, or a job without
    /// statistics): for a collective begun again on other shares mid-way,
    /// whose new shares keep them ([`Collective::keep_trailers`]). A share
    /// of another collective than the first's is left alone.
    pub fn take_trailers_of_shares(
        shares: &mut [&mut Collective],
    ) -> Option<stats::CollectiveStats> {
        let (id, first) = {
            let c = shares.first()?;
            (c.collective, c.first_seq)
        };
        let mut all: Option<stats::CollectiveStats> = None;
        for c in shares.iter_mut() {
            if c.collective != id || c.first_seq != first {
                continue;
            }
            let Some(g) = c.grad.take() else { continue };
            match all.as_mut() {
                Some(a) => {
                    a.absorb(&g);
                }
                None => all = Some(g),
            }
        }
        all
    }

    /// Keeps `trailers` ([`Collective::take_trailers_of_shares`] of this
    /// collective's earlier shares) as if this share had recorded them: the chunks
    /// answered before the shares changed count in the statistics, which
    /// [`Collective::grad_stats_of_shares`] then finds here. Trailers of a
    /// collective of another size are dropped.
    pub fn keep_trailers(&mut self, trailers: stats::CollectiveStats) {
        let n = self.chunks.len();
        let g = self.grad.get_or_insert_with(|| {
            let mut g = stats::CollectiveStats::default();
            g.start(n);
            g
        });
        g.absorb(&trailers);
    }

    #[allow(clippy::too_many_arguments)]
    fn take_result(
        &mut self,
        seq: u32,
        count: u16,
        (kind, no_values): (Kind, bool),
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
        if !self.owns(i) {
            return ResultOutcome::Foreign;
        }
        let p = self.place(i);
        let (offset, expected) = (p.offset, p.count);
        if count != expected {
            return ResultOutcome::CountMismatch {
                expected,
                got: count,
            };
        }
        let into = self.result_at(&p);
        if kind != self.shape.kind || no_values == into.is_some() {
            return ResultOutcome::ShapeMismatch {
                expected: self.shape.kind,
                got: kind,
                expected_values: into.is_some(),
            };
        }
        let c = &mut self.chunks[i as usize];
        if c.acked {
            self.stats.duplicate_results += 1;
            // A second RESULT of a chunk resent once answers the resend
            // (the first answered the original), and the switch answered
            // it from a complete slot, so its RTT is the path's alone, with
            // no other rank's lateness in it. When that RTT exceeds the RTO
            // the timer fires early on this path: it is the sample Karn's
            // rule withheld. Without it a rank whose RESULTs queue behind a
            // bottleneck times out every chunk, gets no sample and keeps
            // resending, and the answers to its resends lengthen the queue
            // (docs/PROTOCOL.md, "Congestion control"). Shorter ones carry
            // no news and are left out, as Karn's rule says.
            if c.resends == 1 && !c.dup_sampled {
                if let Some(t) = c.sent_at {
                    let s = now.saturating_duration_since(t);
                    if s > rtt.rto() {
                        c.dup_sampled = true;
                        rtt.on_sample_at(s, now);
                    }
                }
            }
            return ResultOutcome::Duplicate;
        }
        c.acked = true;
        let mut sample = None;
        if c.resends == 0 && !c.rearmed {
            if let Some(t) = c.sent_at {
                let s = now.saturating_duration_since(t);
                rtt.on_sample_at(s, now);
                sample = Some(s);
            }
        }
        self.acked += 1;
        self.stats.results += 1;
        if ece {
            self.stats.ece_results += 1;
        }
        cc.on_result_delay(ece, sample, rtt.min_rtt());
        self.last_progress = Some(now);
        self.skip_answered();
        if self.next_new < self.oldest_unacked {
            self.next_new = self.oldest_unacked;
        }
        self.fast_retransmit(i);
        ResultOutcome::Fresh {
            chunk: i,
            offset,
            count,
            into,
            own: self.keeps(&p).then_some(offset),
        }
    }

    /// RESULTs for chunks [`FAST_RETRANSMIT_GAP`] or more beyond an
    /// unanswered one of the same seq lane mean it (or its RESULT) was most
    /// likely lost: resend it now instead of waiting for its timer, once
    /// per send (as TCP's fast retransmit does on three duplicate ACKs).
    /// Without it each loss holds the window for a full RTO while every
    /// other rank resends its copy.
    fn fast_retransmit(&mut self, answered: u32) {
        let lanes = self.fast_cursor.len() as u32;
        let lane = (answered % lanes) as usize;
        let Some(end) = answered.checked_sub(FAST_RETRANSMIT_GAP * lanes) else {
            return;
        };
        // Every chunk is looked at once: the lane's cursor only moves
        // forward, in steps of the lane's chunks.
        let from = self.oldest_unacked.max(self.fast_cursor[lane]);
        if from > end {
            return;
        }
        // The lane's first chunk from `from` on (answered ≥ end ≥ from).
        let start = from + (answered - from) % lanes;
        for j in (start..=end).step_by(lanes as usize) {
            let c = &mut self.chunks[j as usize];
            if !c.acked && c.sent && !c.fast_resent {
                c.sent = false;
                c.fast_resent = true;
                self.stats.fast_resent += 1;
                self.due.push_back(j);
            }
        }
        self.fast_cursor[lane] = self.fast_cursor[lane].max(end + 1);
    }

    /// Counts every chunk before `seq` as answered: a rank whose threads
    /// changed in the middle of this collective (a switch back with fewer
    /// seq lanes) began it again on the new shares, and every chunk before
    /// the JOIN_ACK's resume point had its RESULT, taken by the share that
    /// carried it. [`Collective::restart_from`] with the same `seq` follows.
    /// (A `stats = true` job's trailers of those chunks were the old
    /// shares': the caller moves them here with
    /// [`Collective::take_trailers_of_shares`] and
    /// [`Collective::keep_trailers`].)
    pub fn answered_before(&mut self, seq: u32) {
        let off = serial_offset(self.first_seq, seq).clamp(0, self.n_chunks() as i64) as usize;
        for c in &mut self.chunks[..off] {
            if !c.acked {
                c.acked = true;
                self.acked += 1;
            }
        }
        self.skip_answered();
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
        self.mark_foreign(off);
        self.oldest_unacked = self.oldest_unacked.min(off);
        self.skip_answered();
        self.next_new = off;
        self.fast_cursor.iter_mut().for_each(|c| *c = (*c).min(off));
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
        self.hold = Hold {
            enabled: self.hold.enabled,
            ..Hold::default()
        };
    }
}

/// The statistics every rank of a `stats = true` job must get for a
/// collective of `shape` on a single switch (docs/PROTOCOL.md, "Gradient
/// statistics"): `inputs` are the ranks' inputs in rank order, widened to
/// float32, each the collective's whole layout (an all-reduce's tensor; a
/// reduce-scatter's n·m input). Per chunk [`stats::chunk_stats`] over the
/// chunk's elements of every rank and of their float32 rank-order sum; the
/// chunks added in seq order. `None` for an all-gather or broadcast (nothing
/// is summed) and when an input is not the layout's length.
pub fn reference_grad_stats(
    shape: Shape,
    elems_per_chunk: u16,
    inputs: &[&[f32]],
) -> Option<GradStats> {
    if shape.kind() == Kind::AllGather || inputs.iter().any(|x| x.len() != shape.layout_len()) {
        return None;
    }
    let c = Collective::with_shape(0, 0, shape, elems_per_chunk);
    let mut fold = stats::CollectiveStats::default();
    fold.start(c.chunks.len());
    let mut parts: Vec<&[f32]> = Vec::with_capacity(inputs.len());
    for i in 0..c.n_chunks() {
        let p = c.place(i);
        let r = p.offset..p.offset + p.count as usize;
        parts.clear();
        parts.extend(inputs.iter().map(|x| &x[r.clone()]));
        let sum = crate::reference::rank_order_sum(&parts);
        fold.record(i as usize, stats::chunk_stats(&parts, &sum));
    }
    fold.total()
}

/// [`reference_grad_stats`] of an all-reduce of `len` elements through an
/// aggregation tree: `leaves[l]` are leaf l's ranks' inputs in rank order
/// (widened to float32), the leaves in leaf order; per chunk
/// [`stats::tree_chunk_stats`] over the float32 tree-order sum, the chunks
/// added in seq order. `None` when an input is not `len` long.
pub fn reference_tree_grad_stats(
    len: usize,
    elems_per_chunk: u16,
    leaves: &[Vec<&[f32]>],
) -> Option<GradStats> {
    if leaves.iter().flatten().any(|x| x.len() != len) {
        return None;
    }
    let c = Collective::new(0, 0, len, elems_per_chunk);
    let mut fold = stats::CollectiveStats::default();
    fold.start(c.chunks.len());
    for i in 0..c.n_chunks() {
        let p = c.place(i);
        let r = p.offset..p.offset + p.count as usize;
        let parts: Vec<Vec<&[f32]>> = leaves
            .iter()
            .map(|l| l.iter().map(|x| &x[r.clone()]).collect())
            .collect();
        let sum = crate::reference::tree_order_sum(&parts);
        fold.record(i as usize, stats::tree_chunk_stats(&parts, &sum));
    }
    fold.total()
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

    /// Every chunk of `c` as (seq, owner, layout offset, count, last,
    /// input offset of the values).
    fn plan(c: &mut Collective) -> Vec<(u32, u16, usize, u16, bool, Option<usize>)> {
        let (cfg, rtt, _) = setup();
        let t0 = Instant::now();
        std::iter::from_fn(|| c.poll_transmit(t0, u16::MAX, &rtt, &cfg))
            .map(|t| (t.seq, t.owner, t.offset, t.count, t.last, t.values))
            .collect()
    }

    /// A RESULT header of `kind` for `seq`, NOVAL or not.
    fn result(kind: Kind, seq: u32, count: u16, noval: bool) -> HeaderRepr {
        let mut h = HeaderRepr::new(crate::wire::MsgType::Result, 1);
        h.flags = kind.flag_bits() | if noval { flags::NOVAL } else { 0 };
        h.seq = seq;
        h.count = count;
        h
    }

    #[test]
    fn sharded_layout_cuts_each_shard_into_chunks_and_only_the_last_is_last() {
        // 3 shards of 5 elements, E = 2: chunks of 2, 2, 1 per shard, shard
        // 0's first; the owner is the shard; a reduce-scatter sends values
        // from the n·m input for every chunk but its own shard's, which it
        // keeps (NOVAL).
        let mut rs = Collective::with_shape(7, 40, Shape::reduce_scatter(1, 3, 5), 2);
        assert_eq!(rs.n_chunks(), 9);
        assert_eq!(
            plan(&mut rs),
            vec![
                (40, 0, 0, 2, false, Some(0)),
                (41, 0, 2, 2, false, Some(2)),
                (42, 0, 4, 1, false, Some(4)),
                (43, 1, 5, 2, false, None),
                (44, 1, 7, 2, false, None),
                (45, 1, 9, 1, false, None),
                (46, 2, 10, 2, false, Some(10)),
                (47, 2, 12, 2, false, Some(12)),
                (48, 2, 14, 1, true, Some(14)),
            ]
        );
        // An all-gather: rank 1 sends values only for its own shard, read
        // from its m-element input; NOVAL for the others.
        let mut ag = Collective::with_shape(7, 40, Shape::all_gather(1, 3, 5), 2);
        let values: Vec<_> = plan(&mut ag).into_iter().map(|t| (t.1, t.5)).collect();
        assert_eq!(
            values,
            vec![
                (0, None),
                (0, None),
                (0, None),
                (1, Some(0)),
                (1, Some(2)),
                (1, Some(4)),
                (2, None),
                (2, None),
                (2, None),
            ]
        );
        assert_eq!(ag.end_seq(), 49);
        // Shard length a multiple of E: no short chunks; n = 1 is one shard.
        let mut even = Collective::with_shape(0, 0, Shape::all_gather(0, 2, 4), 2);
        assert_eq!(
            plan(&mut even)
                .iter()
                .map(|t| (t.1, t.3, t.4))
                .collect::<Vec<_>>(),
            vec![(0, 2, false), (0, 2, false), (1, 2, false), (1, 2, true)]
        );
        let mut one = Collective::with_shape(0, 0, Shape::reduce_scatter(0, 1, 3), 2);
        assert_eq!(plan(&mut one).len(), 2);
        // Empty shards: nothing to send, complete at once.
        let empty = Collective::with_shape(0, 9, Shape::reduce_scatter(0, 4, 0), 2);
        assert!(empty.is_complete() && empty.end_seq() == 9);
    }

    #[test]
    fn shards_interleave_in_blocks_of_about_4096_elements() {
        assert_eq!(interleave_block(2), 2048);
        assert_eq!(interleave_block(356), 11);
        assert_eq!(interleave_block(2237), 1);
        assert_eq!(interleave_block(9000), 1);
        assert_eq!(interleave_block(0), 4096);
        // E = 1024: blocks of 4 chunks. 3 shards of 11 chunks (the last
        // one 5 elements): rounds of 4 chunks of each shard, then the last
        // 3 of each.
        let (e, m) = (1024, 10 * 1024 + 5);
        let mut ag = Collective::with_shape(0, 0, Shape::all_gather(2, 3, m), e as u16);
        let got: Vec<(u16, usize)> = plan(&mut ag).iter().map(|t| (t.1, t.2)).collect();
        let mut want = Vec::new();
        for (first, len) in [(0, 4), (4, 4), (8, 3)] {
            for shard in 0..3u16 {
                for c in first..first + len {
                    want.push((shard, shard as usize * m + c * e));
                }
            }
        }
        assert_eq!(got, want);
        // E = 4096: one chunk of each shard in turn; every element once,
        // LAST on the collective's last chunk only, counts as cut.
        let (e, m) = (4096, 3 * 4096 + 1);
        let mut rs = Collective::with_shape(0, 0, Shape::reduce_scatter(0, 4, m), e as u16);
        let sent = plan(&mut rs);
        assert_eq!(
            sent.iter().map(|t| t.1).collect::<Vec<_>>(),
            [0, 1, 2, 3].repeat(4)
        );
        let mut covered = vec![0u8; 4 * m];
        for t in &sent {
            covered[t.2..t.2 + t.3 as usize]
                .iter_mut()
                .for_each(|x| *x += 1);
        }
        assert!(covered.iter().all(|&x| x == 1));
        assert_eq!(sent.iter().filter(|t| t.4).count(), 1);
        assert!(sent.last().unwrap().4);
        assert_eq!(sent.last().unwrap().3, 1);
    }

    #[test]
    fn reduce_scatter_results_land_in_the_owners_shard_and_others_are_acks() {
        let (_, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        // Rank 1 of 2, shards of 3, E = 2: chunks (owner 0: 0..2, 2..3),
        // (owner 1: 3..5, 5..6).
        let mut c = Collective::with_shape(0, 0, Shape::reduce_scatter(1, 2, 3), 2);
        // Values for rank 0's chunks; rank 1 keeps its own (NOVAL DATA).
        assert_eq!(
            plan(&mut c).iter().map(|t| (t.1, t.5)).collect::<Vec<_>>(),
            vec![(0, Some(0)), (0, Some(2)), (1, None), (1, None)]
        );
        // Chunk 0 is rank 0's: a NOVAL RESULT acknowledges it.
        assert_eq!(
            c.on_result_header(
                &result(Kind::ReduceScatter, 0, 2, true),
                t0,
                &mut rtt,
                &mut cc
            ),
            ResultOutcome::Fresh {
                chunk: 0,
                offset: 0,
                count: 2,
                into: None,
                own: None
            }
        );
        // Values for a chunk another rank owns are not ours: ignored.
        assert_eq!(
            c.on_result_header(
                &result(Kind::ReduceScatter, 1, 1, false),
                t0,
                &mut rtt,
                &mut cc
            ),
            ResultOutcome::ShapeMismatch {
                expected: Kind::ReduceScatter,
                got: Kind::ReduceScatter,
                expected_values: false
            }
        );
        // Our own chunks' sums go to the m-element output at their offset
        // within the shard.
        assert_eq!(
            c.on_result_header(
                &result(Kind::ReduceScatter, 3, 1, false),
                t0,
                &mut rtt,
                &mut cc
            ),
            ResultOutcome::Fresh {
                chunk: 3,
                offset: 5,
                count: 1,
                into: Some(2),
                own: Some(5)
            }
        );
        // A NOVAL where our sum was due, or another kind: ignored.
        assert!(matches!(
            c.on_result_header(
                &result(Kind::ReduceScatter, 2, 2, true),
                t0,
                &mut rtt,
                &mut cc
            ),
            ResultOutcome::ShapeMismatch {
                expected_values: true,
                ..
            }
        ));
        assert!(matches!(
            c.on_result_header(&result(Kind::AllReduce, 2, 2, false), t0, &mut rtt, &mut cc),
            ResultOutcome::ShapeMismatch {
                got: Kind::AllReduce,
                ..
            }
        ));
        assert_eq!(
            c.on_result_header(
                &result(Kind::ReduceScatter, 2, 2, false),
                t0,
                &mut rtt,
                &mut cc
            ),
            ResultOutcome::Fresh {
                chunk: 2,
                offset: 3,
                count: 2,
                into: Some(0),
                own: Some(3)
            }
        );
        assert!(!c.is_complete());
        c.on_result_header(
            &result(Kind::ReduceScatter, 1, 1, true),
            t0,
            &mut rtt,
            &mut cc,
        );
        assert!(c.is_complete());
    }

    #[test]
    fn all_gather_results_land_in_other_shards_and_the_own_shard_is_acked() {
        let (_, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::with_shape(0, 100, Shape::all_gather(1, 3, 2), 2);
        plan(&mut c);
        let mut got = Vec::new();
        for (seq, noval) in [(100, false), (101, true), (102, false)] {
            match c.on_result_header(
                &result(Kind::AllGather, seq, 2, noval),
                t0,
                &mut rtt,
                &mut cc,
            ) {
                ResultOutcome::Fresh { into, .. } => got.push(into),
                other => panic!("seq {seq}: {other:?}"),
            }
        }
        // Shard 0 to output 0, our own shard 1 acknowledged, shard 2 to 4.
        assert_eq!(got, vec![Some(0), None, Some(4)]);
        assert!(c.is_complete());
    }

    #[test]
    fn broadcast_is_an_all_gather_from_one_root() {
        let (_, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut root = Collective::with_shape(0, 0, Shape::broadcast(2, 2, 5), 2);
        let mut leaf = Collective::with_shape(0, 0, Shape::broadcast(0, 2, 5), 2);
        let r = plan(&mut root);
        let l = plan(&mut leaf);
        assert_eq!(
            r.iter().map(|t| (t.1, t.3, t.5)).collect::<Vec<_>>(),
            vec![(2, 2, Some(0)), (2, 2, Some(2)), (2, 1, Some(4))]
        );
        assert!(l.iter().all(|t| t.1 == 2 && t.5.is_none()));
        assert_eq!(
            leaf.on_result_header(&result(Kind::AllGather, 1, 2, false), t0, &mut rtt, &mut cc),
            ResultOutcome::Fresh {
                chunk: 1,
                offset: 2,
                count: 2,
                into: Some(2),
                own: None
            }
        );
        assert_eq!(
            root.on_result_header(&result(Kind::AllGather, 1, 2, true), t0, &mut rtt, &mut cc),
            ResultOutcome::Fresh {
                chunk: 1,
                offset: 2,
                count: 2,
                into: None,
                own: None
            }
        );
    }

    #[test]
    fn a_restarted_sharded_collective_resends_with_the_same_owners() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::with_shape(0, 10, Shape::all_gather(0, 2, 2), 1);
        let first = plan(&mut c);
        for s in 10..12 {
            c.on_result_header(&result(Kind::AllGather, s, 1, true), t0, &mut rtt, &mut cc);
        }
        c.restart_from(11);
        let again: Vec<_> = std::iter::from_fn(|| c.poll_transmit(t0, 8, &rtt, &cfg))
            .map(|t| (t.seq, t.owner, t.offset, t.count, t.last, t.values))
            .collect();
        assert_eq!(again, first[1..]);
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

    /// The straggler hold, step by step: the oldest's first timeout resends
    /// and probes; an answer naming another rank holds the next timeouts
    /// (a probe each, no resend); an answer naming ours resends at once and
    /// ends the hold; a probe left unanswered for its timeout falls back to
    /// resending.
    #[test]
    fn the_hold_follows_the_answers_to_its_probes() {
        let (cfg, rtt, _) = setup();
        let rto = cfg.initial_rto;
        let t0 = Instant::now();
        let mut c = Collective::new(0, 100, 4, 1).with_hold(true);
        let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t0, 4, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(sent, [100, 101, 102, 103]);
        assert_eq!(c.take_probe(), None);
        // First timeout: the burst from the oldest, and a probe of it.
        let t1 = t0 + rto;
        let burst: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t1, 4, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(burst, [100, 101, 102, 103]);
        assert_eq!(c.take_probe(), Some(100));
        assert_eq!(c.take_probe(), None, "taken once");
        assert!(c.awaits_answer(t1), "the probe waits for its answer");
        // Others missing: the next timeout (the resends' backed-off one)
        // resends nothing and probes again.
        c.on_probe_answer(100, ProbeAnswer::OthersMissing, t1);
        assert!(!c.awaits_answer(t1), "answered");
        let t2 = t1 + rto * 2;
        assert!(c.poll_transmit(t2, 4, &rtt, &cfg).is_none());
        assert_eq!(c.take_probe(), Some(100));
        assert_eq!((c.stats.held_timeouts, c.stats.probes), (1, 2));
        // Still others missing: held again at the next expiry.
        c.on_probe_answer(100, ProbeAnswer::OthersMissing, t2);
        let t3 = t2 + rto * 2;
        assert!(c.poll_transmit(t3, 4, &rtt, &cfg).is_none());
        assert_eq!(c.take_probe(), Some(100));
        // Our DATA was lost: the oldest goes at once, the hold ends.
        c.on_probe_answer(100, ProbeAnswer::OursMissing, t3);
        let t = c.poll_transmit(t3, 4, &rtt, &cfg).unwrap();
        assert_eq!((t.seq, t.retx), (100, true));
        assert!(c.poll_transmit(t3, 4, &rtt, &cfg).is_none());
        // A later answer to the same probe changes nothing.
        c.on_probe_answer(100, ProbeAnswer::OthersMissing, t3);
        // Next expiry: not held, so the oldest resends (the burst) and the
        // probe goes with it; nobody answers it, so the one after resends
        // again, with no hold.
        let t4 = t3 + rto * 4;
        assert!(c.poll_transmit(t4, 4, &rtt, &cfg).is_some());
        assert_eq!(c.take_probe(), Some(100));
        // Unanswered: awaited for the timeout it went out with (the
        // chunk's, backed off by its resends), then no longer.
        assert!(c.awaits_answer(t4 + rto * 4 - Duration::from_millis(1)));
        assert!(!c.awaits_answer(t4 + rto * 4));
        let resent = c.stats.resent;
        let t5 = t4 + rto * 8;
        assert!(c.poll_transmit(t5, 4, &rtt, &cfg).is_some());
        assert!(c.stats.resent > resent);
        // Off: the same timeouts resend and never probe.
        let mut off = Collective::new(0, 100, 4, 1);
        while off.poll_transmit(t0, 4, &rtt, &cfg).is_some() {}
        assert!(off.poll_transmit(t1, 4, &rtt, &cfg).is_some());
        assert_eq!((off.take_probe(), off.stats.probes), (None, 0));
        assert!(!off.awaits_answer(t1));
    }

    /// A held timeout whose timer fires late (a scheduler's delay, longer
    /// than the path's RTT) is still held: the answer's freshness is
    /// judged at the time the timer was due. Without an answer to the
    /// next probe, the hold ends and the oldest resends.
    #[test]
    fn a_late_timer_still_finds_the_answer_fresh() {
        let (cfg, rtt, _) = setup();
        let rto = cfg.initial_rto;
        let t0 = Instant::now();
        let mut c = Collective::new(0, 100, 1, 1).with_hold(true);
        assert!(c.poll_transmit(t0, 4, &rtt, &cfg).is_some());
        // First timeout: resent (backed off to 2 RTOs) and probed; the
        // answer comes at once (an RTT far below the timers' lateness).
        let t1 = t0 + rto;
        assert!(c.poll_transmit(t1, 4, &rtt, &cfg).is_some());
        assert_eq!(c.take_probe(), Some(100));
        c.on_probe_answer(100, ProbeAnswer::OthersMissing, t1);
        // The next expiry, due at t1 + 2 RTOs, runs a little late.
        let late = rto / 4;
        let t2 = t1 + rto * 2 + late;
        assert!(
            c.poll_transmit(t2, 4, &rtt, &cfg).is_none(),
            "a late timer resent what the switch said it has"
        );
        assert_eq!(c.stats.held_timeouts, 1);
        assert_eq!(c.take_probe(), Some(100));
        // The probe of t2 unanswered past its timeout, and the answer of
        // t1 no longer fresh: the hold ends, the oldest resends.
        let t3 = t2 + rto * 4;
        assert!(c.poll_transmit(t3, 4, &rtt, &cfg).is_some());
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
                count: 1,
                into: Some(4),
                own: None
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

    /// Two shares of one collective: each sends and awaits only its own
    /// seqs (odd or even), the other's RESULTs are foreign to it, and the
    /// window counts seq distance, so each share has half the chunks in
    /// flight that one whole collective would.
    /// A collective begun again on other shares mid-way: the chunks before
    /// the resume point count as answered, the rest are sent again, and it
    /// completes on their RESULTs alone.
    #[test]
    fn answered_before_a_resume_point_is_not_sent_again() {
        let (cfg, rtt, _) = setup();
        let now = Instant::now();
        let mut c = Collective::new(1, 100, 10, 1).with_share(1, 2);
        c.answered_before(106);
        c.restart_from(106);
        assert_eq!(c.oldest_unacked_seq(), 107, "106 is the other share's");
        let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(now, 16, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(sent, [107, 109]);
        assert!(!c.is_complete());
    }

    #[test]
    fn shares_split_a_collective_by_seq_and_window_by_seq_distance() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        // 9 chunks, seqs 7..16: share 0 of 2 owns 8, 10, 12, 14.
        let whole = Collective::new(0, 7, 9, 1);
        let mut even = whole.clone().with_share(0, 2);
        let mut odd = whole.clone().with_share(1, 2);
        assert_eq!((even.owned_chunks(), odd.owned_chunks()), (4, 5));
        assert_eq!(even.oldest_unacked_seq(), 8);
        let sent: Vec<(u32, usize, bool)> =
            std::iter::from_fn(|| even.poll_transmit(t0, 4, &rtt, &cfg))
                .map(|t| (t.seq, t.offset, t.last))
                .collect();
        assert_eq!(
            sent,
            vec![(8, 1, false), (10, 3, false)],
            "window 4: seqs 8..12"
        );
        assert_eq!(
            even.on_result(9, 1, false, t0, &mut rtt, &mut cc),
            ResultOutcome::Foreign,
            "seq 9 is the odd share's"
        );
        assert_eq!(
            odd.on_result(8, 1, false, t0, &mut rtt, &mut cc),
            ResultOutcome::Foreign
        );
        even.on_result(8, 1, false, t0, &mut rtt, &mut cc);
        let more: Vec<u32> = std::iter::from_fn(|| even.poll_transmit(t0, 4, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(more, vec![12], "oldest unanswered is 10: seqs up to 13");
        for s in [10, 12] {
            even.on_result(s, 1, false, t0, &mut rtt, &mut cc);
        }
        let last: Vec<u32> = std::iter::from_fn(|| even.poll_transmit(t0, 4, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(last, vec![14]);
        assert!(!even.is_complete());
        even.on_result(14, 1, false, t0, &mut rtt, &mut cc);
        assert!(even.is_complete(), "complete without any odd seq");
        // The odd share carries the collective's last chunk and its LAST.
        let odd_sent: Vec<(u32, bool)> =
            std::iter::from_fn(|| odd.poll_transmit(t0, 16, &rtt, &cfg))
                .map(|t| (t.seq, t.last))
                .collect();
        assert_eq!(
            odd_sent,
            vec![(7, false), (9, false), (11, false), (13, false), (15, true)]
        );
    }

    /// A share restarted from a resume point resends its own chunks from
    /// there and owes nothing of the other share's.
    #[test]
    fn a_restarted_share_resends_only_its_own_chunks() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(3, 50, 8, 1).with_share(1, 2);
        while c.poll_transmit(t0, 16, &rtt, &cfg).is_some() {}
        for s in [51, 53] {
            c.on_result(s, 1, false, t0, &mut rtt, &mut cc);
        }
        c.restart_from(52);
        assert_eq!(c.oldest_unacked_seq(), 53);
        let again: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t0, 16, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(again, vec![53, 55, 57]);
        for s in [53, 55, 57] {
            c.on_result(s, 1, false, t0, &mut rtt, &mut cc);
        }
        assert!(c.is_complete());
        // Restarting before the collective resends the whole share.
        c.restart_from(40);
        let whole: Vec<u32> = std::iter::from_fn(|| c.poll_transmit(t0, 16, &rtt, &cfg))
            .map(|t| t.seq)
            .collect();
        assert_eq!(whole, vec![51, 53, 55, 57]);
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

    /// With seq lanes, RESULTs of another lane overtaking a chunk resend
    /// nothing (lanes complete on their own cores); later RESULTs of its
    /// own lane do.
    #[test]
    fn fast_retransmit_looks_within_a_seq_lane() {
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(0, 0, 12, 1).with_seq_lanes(2);
        while c.poll_transmit(t0, 8, &rtt, &cfg).is_some() {}
        for i in [0, 2, 4, 6] {
            c.on_result(i, 1, false, t0, &mut rtt, &mut cc);
        }
        assert_eq!(c.stats.fast_resent, 0, "lane 0 overtaking lane 1");
        for i in [3, 5] {
            c.on_result(i, 1, false, t0, &mut rtt, &mut cc);
        }
        assert_eq!(c.stats.fast_resent, 0, "two later RESULTs of lane 1");
        c.on_result(7, 1, false, t0, &mut rtt, &mut cc);
        assert_eq!(c.stats.fast_resent, 1, "the third: chunk 1 goes again");
        let t = c.poll_transmit(t0, 8, &rtt, &cfg).unwrap();
        assert_eq!((t.seq, t.retx), (1, true));
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

    /// Loss and reordering at a steady RTT leave the window alone (what a
    /// loss-reactive window got wrong in a tree: late partials look like
    /// losses); RTT samples that grow past the target shrink it.
    #[test]
    fn a_collective_shrinks_its_window_on_queueing_delay_not_on_reordering() {
        let cfg = TransportConfig {
            initial_window: 32,
            ..TransportConfig::default()
        };
        let run = |rtt_of: &dyn Fn(u32) -> Duration, order: &dyn Fn(&mut Vec<u32>)| {
            let (mut rtt, mut cc) = (RttEstimator::new(&cfg), Dctcp::new(&cfg, 32));
            let mut c = Collective::new(0, 0, 2_000, 1);
            let mut now = Instant::now();
            for _round in 0..60 {
                let sent: Vec<u32> =
                    std::iter::from_fn(|| c.poll_transmit(now, cc.window(), &rtt, &cfg))
                        .filter(|t| !t.retx)
                        .map(|t| t.seq)
                        .collect();
                if sent.is_empty() {
                    break;
                }
                let mut answered = sent.clone();
                order(&mut answered);
                for seq in answered {
                    let at = now + rtt_of(seq);
                    c.on_result(seq, 1, false, at, &mut rtt, &mut cc);
                }
                now += rtt_of(sent[sent.len() - 1]) + Duration::from_micros(10);
            }
            cc.window()
        };
        let steady = |_| Duration::from_micros(200);
        let reversed = |v: &mut Vec<u32>| v.reverse();
        assert_eq!(run(&steady, &reversed), 32, "reordering at a steady RTT");
        // The RTT climbs with the sequence, as a standing queue grows.
        let growing = |seq: u32| Duration::from_micros(200 + 40 * seq as u64);
        assert!(
            run(&growing, &|_| ()) < 32,
            "a growing queue shrinks the window"
        );
    }

    /// Rank `r`'s input of `len` elements: the reference pattern, each run
    /// of 4 elements scaled by another power of two, so that float64 sums
    /// of its chunks' squares round differently in another order.
    fn stats_input(r: u16, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| crate::reference::pattern(r, 5, i) * (1u64 << ((i / 4) * 7 % 40)) as f32)
            .collect()
    }

    /// The trailer a single switch sends for the elements `range` of every
    /// rank's input (written out here, not through the chunk planner).
    fn trailer_of(inputs: &[Vec<f32>], range: std::ops::Range<usize>) -> GradStats {
        let parts: Vec<&[f32]> = inputs.iter().map(|x| &x[range.clone()]).collect();
        stats::chunk_stats(&parts, &crate::reference::rank_order_sum(&parts))
    }

    /// A small deterministic shuffle (xorshift), so the test is
    /// reproducible.
    fn shuffled(n: u32, seed: u64) -> Vec<u32> {
        let mut x = seed;
        let mut v: Vec<u32> = (0..n).collect();
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
        v
    }

    /// A stats job's RESULTs arriving out of order, some lost (and resent
    /// after the timer), some twice with a forged second trailer: the
    /// collective's statistics are the first trailers added in seq order,
    /// bit for bit [`reference_grad_stats`]; the arrival-order sum is
    /// other bits, so the order is what the test checks.
    #[test]
    fn gradient_statistics_are_the_seq_order_fold_under_loss_duplicates_and_reordering() {
        let (n, len, e) = (3u16, 50usize, 4u16);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| stats_input(r, len)).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let want = reference_grad_stats(Shape::all_reduce(len), e, &refs).unwrap();
        assert_eq!(want.ranks, 3);
        let e = e as usize;
        let trailer = |i: u32| trailer_of(&inputs, i as usize * e..((i as usize + 1) * e).min(len));

        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut c = Collective::new(9, 100, len, e as u16);
        while c.poll_transmit(t0, u16::MAX, &rtt, &cfg).is_some() {}
        let count = |i: u32| (((i as usize + 1) * e).min(len) - i as usize * e) as u16;
        let res = |i: u32| result(Kind::AllReduce, 100 + i, count(i), false);
        let order = shuffled(c.n_chunks(), 0x9e37_79b9);
        let mut arrival = GradStats::default();
        for &i in &order {
            if i % 3 == 0 {
                continue; // lost
            }
            let out = c.on_result_with_stats(&res(i), Some(trailer(i)), t0, &mut rtt, &mut cc);
            assert!(matches!(out, ResultOutcome::Fresh { .. }), "{out:?}");
            arrival.sum_of_squares += trailer(i).sum_of_squares;
            arrival.square_of_sum += trailer(i).square_of_sum;
            if i % 5 == 1 {
                let forged = GradStats {
                    sum_of_squares: 1.0,
                    ..trailer(i)
                };
                let dup = c.on_result_with_stats(&res(i), Some(forged), t0, &mut rtt, &mut cc);
                assert_eq!(dup, ResultOutcome::Duplicate);
            }
        }
        assert_eq!(
            c.grad_stats(),
            None,
            "the lost chunks' trailers are missing"
        );
        // The timers expire; the lost chunks go again and their RESULTs come
        // back, last first.
        let later = t0 + Duration::from_secs(2);
        let mut resent = Vec::new();
        while resent.len() < order.iter().filter(|&&i| i % 3 == 0).count() {
            let t = c.poll_transmit(later, u16::MAX, &rtt, &cfg).unwrap();
            assert!(t.retx);
            resent.push(t.chunk);
        }
        for &i in resent.iter().rev() {
            c.on_result_with_stats(&res(i), Some(trailer(i)), later, &mut rtt, &mut cc);
            arrival.sum_of_squares += trailer(i).sum_of_squares;
            arrival.square_of_sum += trailer(i).square_of_sum;
        }
        assert!(c.is_complete());
        let got = c.grad_stats().unwrap();
        assert!(got.bits_eq(&want), "{got:?} != {want:?}");
        assert_ne!(
            (
                arrival.sum_of_squares.to_bits(),
                arrival.square_of_sum.to_bits()
            ),
            (got.sum_of_squares.to_bits(), got.square_of_sum.to_bits()),
            "the inputs must make the order matter"
        );
        // A re-join's restart resends chunks; their trailers stay.
        c.restart_from(100);
        assert!(c.grad_stats().unwrap().bits_eq(&want));
    }

    /// Two shares of one collective: each records its own chunks'
    /// trailers, in another order; the fold over both is the one
    /// collective's seq-order fold, bit for bit, and is missing while one
    /// share lacks a trailer.
    #[test]
    fn shares_gradient_statistics_fold_in_seq_order_across_shares() {
        let (n, len, e) = (3u16, 50usize, 4u16);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| stats_input(r, len)).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let want = reference_grad_stats(Shape::all_reduce(len), e, &refs).unwrap();
        let e = e as usize;
        let trailer = |i: u32| trailer_of(&inputs, i as usize * e..((i as usize + 1) * e).min(len));
        let count = |i: u32| (((i as usize + 1) * e).min(len) - i as usize * e) as u16;
        let res = |i: u32| result(Kind::AllReduce, 101 + i, count(i), false);

        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let whole = Collective::new(9, 101, len, e as u16);
        let mut shares: Vec<Collective> = (0..2).map(|t| whole.clone().with_share(t, 2)).collect();
        for c in &mut shares {
            while c.poll_transmit(t0, u16::MAX, &rtt, &cfg).is_some() {}
        }
        let order = shuffled(whole.n_chunks(), 0x5eed);
        for &i in &order {
            // Chunk i has seq 101 + i: share (101 + i) mod 2.
            let c = &mut shares[((101 + i) % 2) as usize];
            let out = c.on_result_with_stats(&res(i), Some(trailer(i)), t0, &mut rtt, &mut cc);
            assert!(matches!(out, ResultOutcome::Fresh { .. }), "{out:?}");
            if i == order[order.len() / 2] {
                let both: Vec<&Collective> = shares.iter().collect();
                assert_eq!(Collective::grad_stats_of_shares(&both), None);
            }
        }
        assert!(shares.iter().all(Collective::is_complete));
        assert_eq!(shares[0].grad_stats(), None, "one share alone has half");
        let both: Vec<&Collective> = shares.iter().collect();
        let got = Collective::grad_stats_of_shares(&both).unwrap();
        assert!(got.bits_eq(&want), "{got:?} != {want:?}");
    }

    /// A collective begun again on fewer shares mid-way (a switch back with
    /// fewer seq lanes): the old shares' trailers, taken out and kept by
    /// the new share 0, count with the trailers the new shares get after
    /// the resume point; the fold is the reference's bits. Without them
    /// (what the worker did before) there are no statistics; a new share
    /// that gets no trailer after the resume point adds nothing and takes
    /// nothing away.
    #[test]
    fn trailers_kept_across_fewer_shares_give_the_whole_statistics() {
        // 17 chunks, seqs 200..=216.
        let (n, len, e) = (2u16, 68usize, 4u16);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| stats_input(r, len)).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let want = reference_grad_stats(Shape::all_reduce(len), e, &refs).unwrap();
        let e = e as usize;
        let trailer = |i: u32| trailer_of(&inputs, i as usize * e..((i as usize + 1) * e).min(len));
        let res = |i: u32| result(Kind::AllReduce, 200 + i, e as u16, false);
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let whole = Collective::new(3, 200, len, e as u16);
        let chunks = whole.n_chunks();
        // The resume point: mid-way; at the last chunk (seq 216, new share
        // 0's: new share 1 gets no trailer after it).
        for resume in [7u32, chunks - 1] {
            let mut old: Vec<Collective> = (0..4).map(|t| whole.clone().with_share(t, 4)).collect();
            for c in &mut old {
                while c.poll_transmit(t0, u16::MAX, &rtt, &cfg).is_some() {}
            }
            // The old shares got every chunk before the resume point, and
            // one after it (its RESULT came again from the new switch).
            for i in (0..resume).chain([resume + 1]).filter(|i| *i < chunks) {
                let c = &mut old[((200 + i) % 4) as usize];
                c.on_result_with_stats(&res(i), Some(trailer(i)), t0, &mut rtt, &mut cc);
            }
            let mut refs: Vec<&mut Collective> = old.iter_mut().collect();
            let kept = Collective::take_trailers_of_shares(&mut refs).unwrap();
            assert!(old.iter().all(|c| c.grad.is_none()), "taken out");
            let mut new: Vec<Collective> = (0..2).map(|t| whole.clone().with_share(t, 2)).collect();
            new[0].keep_trailers(kept);
            for c in &mut new {
                c.answered_before(200 + resume);
                c.restart_from(200 + resume);
                while c.poll_transmit(t0, u16::MAX, &rtt, &cfg).is_some() {}
            }
            let ends = |new: &[Collective]| {
                let refs: Vec<&Collective> = new.iter().collect();
                Collective::grad_stats_of_shares(&refs)
            };
            let mut without: Vec<Collective> = new.clone();
            without[0] = whole.clone().with_share(0, 2);
            without[0].answered_before(200 + resume);
            for i in resume..chunks {
                for set in [&mut new, &mut without] {
                    let c = &mut set[((200 + i) % 2) as usize];
                    c.on_result_with_stats(&res(i), Some(trailer(i)), t0, &mut rtt, &mut cc);
                }
            }
            assert!(new.iter().all(Collective::is_complete), "resume {resume}");
            assert_eq!(
                new[1].grad.is_none(),
                resume == chunks - 1,
                "resume {resume}"
            );
            let got = ends(&new).expect("every chunk's trailer is in a share");
            assert!(got.bits_eq(&want), "resume {resume}: {got:?} != {want:?}");
            assert_eq!(
                ends(&without),
                None,
                "resume {resume}: the old trailers are missing"
            );
        }
        // Shares of another collective than the first's are left alone.
        let mut a = whole.clone();
        let mut b = Collective::new(4, 200 + chunks, len, e as u16);
        b.on_result_with_stats(&res(chunks), Some(trailer(0)), t0, &mut rtt, &mut cc);
        let mut refs = [&mut a, &mut b];
        assert!(Collective::take_trailers_of_shares(&mut refs).is_none());
        assert!(b.grad.is_some());
    }

    /// A reduce-scatter: the rank's own chunks' RESULTs and the NOVAL
    /// acknowledgements of the others' all carry trailers, and the
    /// statistics cover the whole n·m layout, shard by shard. Without
    /// trailers (a job without statistics) there are none.
    #[test]
    fn reduce_scatter_statistics_cover_every_shard_and_plain_jobs_have_none() {
        let (n, m, e) = (3u16, 7usize, 3usize);
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| stats_input(r, n as usize * m)).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let shape = Shape::reduce_scatter(1, n, m);
        let want = reference_grad_stats(shape, e as u16, &refs).unwrap();
        // Chunks of each shard: 0..3, 3..6, 6..7 within it.
        let mut chunks = Vec::new();
        for s in 0..n as usize {
            for j in (0..m).step_by(e) {
                chunks.push((s, s * m + j..s * m + (j + e).min(m)));
            }
        }
        let (cfg, mut rtt, mut cc) = setup();
        let t0 = Instant::now();
        let mut with = Collective::with_shape(0, 0, shape, e as u16);
        let mut without = Collective::with_shape(0, 0, shape, e as u16);
        for c in [&mut with, &mut without] {
            while c.poll_transmit(t0, u16::MAX, &rtt, &cfg).is_some() {}
        }
        for (i, (s, r)) in chunks.iter().enumerate().rev() {
            let h = result(Kind::ReduceScatter, i as u32, r.len() as u16, *s != 1);
            let t = trailer_of(&inputs, r.clone());
            let out = with.on_result_with_stats(&h, Some(t), t0, &mut rtt, &mut cc);
            assert!(matches!(out, ResultOutcome::Fresh { .. }), "{out:?}");
            without.on_result_header(&h, t0, &mut rtt, &mut cc);
        }
        assert!(with.is_complete() && without.is_complete());
        assert!(with.grad_stats().unwrap().bits_eq(&want));
        assert_eq!(without.grad_stats(), None);
        // An all-gather sums nothing; a wrong input length has no reference.
        assert_eq!(
            reference_grad_stats(Shape::all_gather(0, n, m), e as u16, &refs),
            None
        );
        assert_eq!(reference_grad_stats(Shape::all_reduce(5), 2, &refs), None);
    }

    /// A tree's reference: one leaf of every rank is the single switch's;
    /// two leaves add the leaves' partial sums, which rounds otherwise.
    #[test]
    fn tree_reference_statistics_sum_in_tree_order() {
        let len = 90;
        // Ranks of very different magnitudes, so that the order of the
        // ranks' additions shows in float32 and in float64.
        let inputs: Vec<Vec<f32>> = (0..4u16)
            .map(|r| {
                (0..len)
                    .map(|i| crate::reference::pattern(r, 1, i) * (1u32 << (7 * r)) as f32)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let single = reference_grad_stats(Shape::all_reduce(len), 8, &refs).unwrap();
        let one_leaf = reference_tree_grad_stats(len, 8, std::slice::from_ref(&refs)).unwrap();
        assert!(one_leaf.bits_eq(&single));
        let two =
            reference_tree_grad_stats(len, 8, &[refs[..2].to_vec(), refs[2..].to_vec()]).unwrap();
        assert_eq!(two.ranks, 4);
        assert!(!two.bits_eq(&single), "the tree order is another order");
        assert_eq!(reference_tree_grad_stats(len + 1, 8, &[refs]), None);
    }
}
