//! The switch side of the protocol: the job table, membership and the slot
//! pool of every job, as a state machine fed parsed messages (no I/O).
//!
//! Owns: [`JobTable`] (jobs by id, the switch generation), [`Job`]
//! (membership, activation, resume point, window floor, counters) and
//! [`SlotPool`] (per slot: a seen-bitmap, the sum so far, contributions that
//! arrived ahead of their turn, and the shadow copy of the last result).
//!
//! Invariants:
//! * A slot's sum is taken in rank order: rank 0's values, plus rank 1's,
//!   plus …; a contribution that arrives before all lower ranks is parked and
//!   folded in when its turn comes. So a result is bit-identical whatever the
//!   arrival order, retransmissions included.
//! * A seq is taken only inside the window `[floor, floor + W)`, where
//!   `floor` is the job's oldest incomplete seq and `W ≤ S`; seqs in the
//!   window map to distinct slots, so a slot never holds two live seqs.
//! * A rejected message changes nothing but a counter.
//!
//! Choices where PROTOCOL.md is silent or ambiguous (documented in the README):
//! * The shadow copy is kept while the slot aggregates its next seq (as in
//!   SwitchML): otherwise a worker that lost the RESULT of seq s could never
//!   get it back once another rank opened seq s + S, and the job would stall.
//! * A JOIN for a rank of an active job from the same source with the same
//!   resume point is a repeat (the JOIN_ACK was lost) and gets the JOIN_ACK
//!   again; any other JOIN for that rank is a restart and sends the job back
//!   to joining.
//! * DATA that fails before membership (unknown job, malformed) gets no
//!   reply, only a counter: the switch does not answer strangers. NACK 6 and 7
//!   go only to sources inside the job's allowed prefixes.
//! * LEAVE from a member marks it gone; when every rank has left, the job
//!   returns to joining with fresh slots. Shadows stay until then so that
//!   stragglers can still fetch lost RESULTs.

use rustc_hash::FxHashMap;
use std::fmt;

use subtle::ConstantTimeEq;

use crate::seq::{serial_lt, serial_offset};
use crate::wire::{
    flags, HeaderRepr, JoinPayload, MsgType, NackReason, DTYPE_F32, OP_SUM, SECRET_LEN,
};

/// An IPv4 prefix (address, prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Prefix {
    pub addr: [u8; 4],
    pub len: u8,
}

impl Ipv4Prefix {
    pub fn contains(&self, ip: [u8; 4]) -> bool {
        if self.len == 0 {
            return true;
        }
        let len = self.len.min(32) as u32;
        let mask = u32::MAX << (32 - len);
        (u32::from_be_bytes(self.addr) & mask) == (u32::from_be_bytes(ip) & mask)
    }
}

/// Where a worker's packets come from (checked on every DATA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Source {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    pub port: u16,
}

/// How to reach a worker: its source, plus which switch port and local
/// addresses its JOIN arrived on. The engine only compares `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoint {
    pub source: Source,
    pub local_mac: [u8; 6],
    pub local_ip: [u8; 4],
    pub local_port: u16,
    /// Index of the switch port (interface) the worker is behind.
    pub port_idx: u32,
    /// Queue of that port its JOIN arrived on.
    pub queue: u32,
}

/// A job as declared to the switch.
#[derive(Clone)]
pub struct JobConfig {
    pub id: u16,
    pub n_workers: u16,
    pub allowed_sources: Vec<Ipv4Prefix>,
    pub secret: [u8; SECRET_LEN],
    /// Slots in the pool, a power of two.
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    /// Chunks in flight the switch allows (≤ pool_slots).
    pub window: u16,
}

impl fmt::Debug for JobConfig {
    // Secrets are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobConfig")
            .field("id", &self.id)
            .field("n_workers", &self.n_workers)
            .field("allowed_sources", &self.allowed_sources)
            .field("secret", &"<redacted>")
            .field("pool_slots", &self.pool_slots)
            .field("elems_per_chunk", &self.elems_per_chunk)
            .field("window", &self.window)
            .finish()
    }
}

/// Why a job declaration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobConfigError {
    #[error("job id 0 is invalid (use 1..=65535)")]
    ZeroId,
    #[error("job {0}: n_workers must be at least 1")]
    NoWorkers(u16),
    #[error("job {0}: pool_slots {1} must be a power of two ≥ 1")]
    PoolSlots(u16, u16),
    #[error("job {0}: elems_per_chunk must be 1..={2}, got {1}")]
    ElemsPerChunk(u16, u16, u16),
    #[error("job {0}: window must be 1..=pool_slots ({2}), got {1}")]
    Window(u16, u16, u16),
    #[error("job {0} is already declared")]
    Duplicate(u16),
    #[error("job {0}: allowed_sources is empty, no worker could join")]
    NoSources(u16),
}

impl JobConfig {
    /// Checks the declaration; `max_elems` is what fits in the switch's frames.
    pub fn validate(&self, max_elems: u16) -> Result<(), JobConfigError> {
        if self.id == 0 {
            return Err(JobConfigError::ZeroId);
        }
        if self.n_workers == 0 {
            return Err(JobConfigError::NoWorkers(self.id));
        }
        if !self.pool_slots.is_power_of_two() {
            return Err(JobConfigError::PoolSlots(self.id, self.pool_slots));
        }
        if self.elems_per_chunk == 0 || self.elems_per_chunk > max_elems {
            return Err(JobConfigError::ElemsPerChunk(
                self.id,
                self.elems_per_chunk,
                max_elems,
            ));
        }
        if self.window == 0 || self.window > self.pool_slots {
            return Err(JobConfigError::Window(
                self.id,
                self.window,
                self.pool_slots,
            ));
        }
        if self.allowed_sources.is_empty() {
            return Err(JobConfigError::NoSources(self.id));
        }
        Ok(())
    }
}

/// Why DATA (or another message) was dropped, one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum DropReason {
    /// This rank's contribution to this seq was already taken.
    Duplicate = 0,
    /// Older than the slot's shadow copy: nothing left to answer with.
    Stale,
    /// A newer seq for a slot that still aggregates an older one.
    SlotBusy,
    /// `count` differs from the slot's (or exceeds the job's chunk size).
    CountMismatch,
    /// `collective` differs from the slot's.
    CollectiveMismatch,
    /// seq − floor ≥ window.
    BeyondWindow,
    /// Source MAC/IP/port is not the rank's recorded one.
    SourceMismatch,
    /// rank ≥ n_workers.
    RankOutOfRange,
    /// Job is not active (answered with NACK 6 when the source is allowed).
    NotActive,
    /// `gen` is not the switch's (answered with NACK 7 when allowed).
    StaleGeneration,
    /// Source outside the job's prefixes, on a message that needs membership.
    SourceNotAllowed,
    /// A message type the switch does not take (RESULT, JOIN_ACK, NACK).
    UnexpectedType,
}

impl DropReason {
    pub const COUNT: usize = 12;
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Duplicate,
        DropReason::Stale,
        DropReason::SlotBusy,
        DropReason::CountMismatch,
        DropReason::CollectiveMismatch,
        DropReason::BeyondWindow,
        DropReason::SourceMismatch,
        DropReason::RankOutOfRange,
        DropReason::NotActive,
        DropReason::StaleGeneration,
        DropReason::SourceNotAllowed,
        DropReason::UnexpectedType,
    ];

    /// Stable name, for counters and metrics.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Duplicate => "duplicate",
            DropReason::Stale => "stale",
            DropReason::SlotBusy => "slot_busy",
            DropReason::CountMismatch => "count_mismatch",
            DropReason::CollectiveMismatch => "collective_mismatch",
            DropReason::BeyondWindow => "beyond_window",
            DropReason::SourceMismatch => "source_mismatch",
            DropReason::RankOutOfRange => "rank_out_of_range",
            DropReason::NotActive => "not_active",
            DropReason::StaleGeneration => "stale_generation",
            DropReason::SourceNotAllowed => "source_not_allowed",
            DropReason::UnexpectedType => "unexpected_type",
        }
    }
}

/// Counters of one job. Plain integers: each dataplane thread owns its jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobCounters {
    pub chunks_completed: u64,
    /// Float32 payload bytes taken into sums.
    pub bytes_aggregated: u64,
    pub contributions: u64,
    pub results_sent: u64,
    pub retransmits_served: u64,
    pub ece_marked: u64,
    pub joins: u64,
    pub nacks: u64,
    pub activations: u64,
    pub drops: [u64; DropReason::COUNT],
}

impl JobCounters {
    pub fn drop_count(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }
}

/// A growable bitmap of ranks (no worker ceiling).
#[derive(Debug, Clone, Default)]
struct RankSet {
    words: Vec<u64>,
}

impl RankSet {
    fn with_ranks(n: u16) -> RankSet {
        RankSet {
            words: vec![0; (n as usize).div_ceil(64)],
        }
    }
    fn contains(&self, r: u16) -> bool {
        self.words
            .get(r as usize / 64)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }
    fn insert(&mut self, r: u16) {
        if let Some(w) = self.words.get_mut(r as usize / 64) {
            *w |= 1 << (r % 64);
        }
    }
    fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shadow {
    seq: u32,
    collective: u32,
    count: u16,
    ece: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Aggregation {
    seq: u32,
    collective: u32,
    count: u16,
    /// Ranks 0..next_rank are summed into `acc`.
    next_rank: u16,
    ece: bool,
}

/// One slot: an aggregation in progress (maybe) and the last result (maybe).
#[derive(Debug, Clone)]
struct Slot {
    agg: Option<Aggregation>,
    shadow: Option<Shadow>,
    seen: RankSet,
    /// Contributions parked until their turn in rank order.
    parked: RankSet,
    acc: Vec<f32>,
    result: Vec<f32>,
}

/// The pool of slots of one job, with every buffer allocated up front.
#[derive(Debug, Clone)]
pub struct SlotPool {
    slots: Vec<Slot>,
    /// Parked contributions: slot-major, then rank, then element.
    parked_values: Vec<f32>,
    n: u16,
    elems: usize,
}

/// What the pool did with one contribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Pending,
    Completed,
}

impl SlotPool {
    pub fn new(slots: u16, n: u16, elems: u16) -> SlotPool {
        let e = elems as usize;
        let slot = Slot {
            agg: None,
            shadow: None,
            seen: RankSet::with_ranks(n),
            parked: RankSet::with_ranks(n),
            acc: vec![0.0; e],
            result: vec![0.0; e],
        };
        SlotPool {
            slots: vec![slot; slots as usize],
            parked_values: vec![0.0; slots as usize * n as usize * e],
            n,
            elems: e,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn index(&self, seq: u32) -> usize {
        (seq as usize) & (self.slots.len() - 1)
    }

    fn clear(&mut self) {
        for s in &mut self.slots {
            s.agg = None;
            s.shadow = None;
            s.seen.clear();
            s.parked.clear();
        }
    }

    /// Folds `values` (little-endian f32 bytes) into the slot's sum as rank
    /// `rank`'s contribution, in rank order.
    fn take(&mut self, idx: usize, rank: u16, values: &[u8]) -> Taken {
        let n = self.n as usize;
        let e = self.elems;
        let slot = &mut self.slots[idx];
        let Some(agg) = slot.agg.as_mut() else {
            return Taken::Pending;
        };
        let count = agg.count as usize;
        slot.seen.insert(rank);
        if rank != agg.next_rank {
            let base = (idx * n + rank as usize) * e;
            crate::simd::read_le_f32(values, &mut self.parked_values[base..base + count]);
            slot.parked.insert(rank);
            return Taken::Pending;
        }
        if rank == 0 {
            crate::simd::read_le_f32(values, &mut slot.acc[..count]);
        } else {
            crate::simd::add_le_f32(&mut slot.acc[..count], values);
        }
        agg.next_rank += 1;
        while agg.next_rank < self.n && slot.parked.contains(agg.next_rank) {
            let base = (idx * n + agg.next_rank as usize) * e;
            // The same kernel as a contribution folded on arrival, so the
            // bits are the same whichever way a value came in.
            crate::simd::add_f32(
                &mut slot.acc[..count],
                &self.parked_values[base..base + count],
            );
            agg.next_rank += 1;
        }
        if agg.next_rank == self.n {
            let done = *agg;
            core::mem::swap(&mut slot.acc, &mut slot.result);
            slot.shadow = Some(Shadow {
                seq: done.seq,
                collective: done.collective,
                count: done.count,
                ece: done.ece,
            });
            slot.agg = None;
            slot.seen.clear();
            slot.parked.clear();
            Taken::Completed
        } else {
            Taken::Pending
        }
    }
}

/// A completed or cached result, ready to be sent.
#[derive(Debug, Clone, Copy)]
pub struct ResultView<'a> {
    pub seq: u32,
    pub collective: u32,
    pub ece: bool,
    pub window: u16,
    pub values: &'a [f32],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for all ranks to JOIN under the current generation.
    Joining,
    /// All ranks joined; DATA is taken.
    Active,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    endpoint: Endpoint,
    resume_collective: u32,
    resume_seq: u32,
    left: bool,
}

/// One job: its declaration, members, slots and counters.
#[derive(Debug)]
pub struct Job {
    pub config: JobConfig,
    state: JobState,
    members: Vec<Option<Member>>,
    joined: u16,
    resume_collective: u32,
    resume_seq: u32,
    /// Oldest incomplete seq.
    floor: u32,
    window: u16,
    pool: SlotPool,
    pub counters: JobCounters,
}

/// What to do after a JOIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    /// Refuse: send a NACK with this reason to the sender.
    Nack(NackReason),
    /// Recorded; waiting for the other ranks. Send nothing.
    Waiting,
    /// The job just became active: send JOIN_ACK to every member.
    Activated,
    /// A repeated JOIN to an active job: send JOIN_ACK to this rank again.
    AckAgain,
}

/// What to do after a DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOutcome {
    /// Taken into the slot; nothing to send yet.
    Taken,
    /// The slot completed: send its RESULT to every member.
    Completed { seq: u32 },
    /// The sender lost this RESULT: send the shadow copy to it, flagged RETX.
    Retransmit { seq: u32 },
    /// Refuse with a NACK to the sender (counted as a drop too).
    Nack(NackReason),
    /// Dropped and counted; send nothing.
    Dropped(DropReason),
}

impl Job {
    pub fn new(config: JobConfig) -> Job {
        let pool = SlotPool::new(config.pool_slots, config.n_workers, config.elems_per_chunk);
        Job {
            members: vec![None; config.n_workers as usize],
            window: config.window.min(config.pool_slots),
            state: JobState::Joining,
            joined: 0,
            resume_collective: 0,
            resume_seq: 0,
            floor: 0,
            pool,
            counters: JobCounters::default(),
            config,
        }
    }

    pub fn id(&self) -> u16 {
        self.config.id
    }
    pub fn state(&self) -> JobState {
        self.state
    }
    pub fn n_workers(&self) -> u16 {
        self.config.n_workers
    }
    pub fn window(&self) -> u16 {
        self.window
    }
    /// Sets the window the switch allows (clamped to 1..=S).
    pub fn set_window(&mut self, w: u16) {
        self.window = w.clamp(1, self.config.pool_slots);
    }
    /// Oldest incomplete seq.
    pub fn floor(&self) -> u32 {
        self.floor
    }
    /// The resume point sent in JOIN_ACKs: (collective, seq).
    pub fn resume_point(&self) -> (u32, u32) {
        (self.resume_collective, self.resume_seq)
    }
    /// Ranks that have joined under the current generation.
    pub fn joined_ranks(&self) -> u16 {
        self.joined
    }
    /// Where rank `rank` is, if it has joined.
    pub fn member(&self, rank: u16) -> Option<&Endpoint> {
        self.members
            .get(rank as usize)
            .and_then(|m| m.as_ref())
            .map(|m| &m.endpoint)
    }
    /// Endpoints of all joined members, with their rank.
    pub fn members(&self) -> impl Iterator<Item = (u16, &Endpoint)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(r, m)| m.as_ref().map(|m| (r as u16, &m.endpoint)))
    }

    /// Ranks that have not contributed to the oldest incomplete seq (empty
    /// if that seq has not started aggregating, i.e. nobody sent it yet).
    pub fn missing_on_floor(&self) -> Vec<u16> {
        let slot = &self.pool.slots[self.pool.index(self.floor)];
        match slot.agg {
            Some(a) if a.seq == self.floor => (0..self.config.n_workers)
                .filter(|r| !slot.seen.contains(*r))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Writes, as big-endian u16s into `out`, the ranks whose contribution to
    /// `seq` the switch has not taken (none if `seq` is complete; all if it
    /// has not started). Returns how many were written (as many as fit).
    pub fn write_missing_ranks(&self, seq: u32, out: &mut [u8]) -> usize {
        let slot = &self.pool.slots[self.pool.index(seq)];
        if slot.shadow.is_some_and(|s| s.seq == seq) {
            return 0;
        }
        let started = slot.agg.is_some_and(|a| a.seq == seq);
        let mut n = 0;
        for (r, o) in (0..self.config.n_workers)
            .filter(|r| !(started && slot.seen.contains(*r)))
            .zip(out.chunks_exact_mut(2))
        {
            o.copy_from_slice(&r.to_be_bytes());
            n += 1;
        }
        n
    }

    /// The result of `seq`, if the slot still holds it.
    pub fn result(&self, seq: u32) -> Option<ResultView<'_>> {
        let slot = &self.pool.slots[self.pool.index(seq)];
        let sh = slot.shadow?;
        (sh.seq == seq).then(|| ResultView {
            seq,
            collective: sh.collective,
            ece: sh.ece,
            window: self.window,
            values: &slot.result[..sh.count as usize],
        })
    }

    pub fn source_allowed(&self, ip: [u8; 4]) -> bool {
        self.config.allowed_sources.iter().any(|p| p.contains(ip))
    }

    fn reset_to_joining(&mut self) {
        self.state = JobState::Joining;
        self.members.iter_mut().for_each(|m| *m = None);
        self.joined = 0;
        self.pool.clear();
    }

    fn drop(&mut self, r: DropReason) -> DataOutcome {
        self.counters.drops[r as usize] += 1;
        DataOutcome::Dropped(r)
    }

    fn nack(&mut self, r: DropReason, reason: NackReason) -> DataOutcome {
        self.counters.drops[r as usize] += 1;
        self.counters.nacks += 1;
        DataOutcome::Nack(reason)
    }

    fn on_join(&mut self, hdr: &HeaderRepr, join: &JoinPayload, from: Endpoint) -> JoinOutcome {
        self.counters.joins += 1;
        let outcome = self.judge_join(hdr, join, from);
        if matches!(outcome, JoinOutcome::Nack(_)) {
            self.counters.nacks += 1;
        }
        outcome
    }

    fn judge_join(&mut self, hdr: &HeaderRepr, join: &JoinPayload, from: Endpoint) -> JoinOutcome {
        if !self.source_allowed(from.source.ip) {
            return JoinOutcome::Nack(NackReason::SourceNotAllowed);
        }
        if !bool::from(join.secret.ct_eq(&self.config.secret)) {
            return JoinOutcome::Nack(NackReason::BadSecret);
        }
        if hdr.rank >= self.config.n_workers {
            return JoinOutcome::Nack(NackReason::RankOutOfRange);
        }
        if join.n_workers != self.config.n_workers || join.dtype != DTYPE_F32 || join.op != OP_SUM {
            return JoinOutcome::Nack(NackReason::ParametersDiffer);
        }
        let rank = hdr.rank as usize;
        let member = Member {
            endpoint: from,
            resume_collective: hdr.collective,
            resume_seq: hdr.seq,
            left: false,
        };
        if self.state == JobState::Active {
            if let Some(m) = &self.members[rank] {
                if m.endpoint.source == from.source
                    && m.resume_collective == hdr.collective
                    && m.resume_seq == hdr.seq
                    && !m.left
                {
                    return JoinOutcome::AckAgain;
                }
            }
            // That worker restarted: everyone joins again.
            self.reset_to_joining();
        }
        if self.members[rank].is_none() {
            self.joined += 1;
        }
        self.members[rank] = Some(member);
        if self.joined < self.config.n_workers {
            return JoinOutcome::Waiting;
        }
        self.activate();
        JoinOutcome::Activated
    }

    fn activate(&mut self) {
        // The resume point is the lowest (collective, seq) any rank reported.
        let mut lowest: Option<(u32, u32)> = None;
        for m in self.members.iter().flatten() {
            let p = (m.resume_collective, m.resume_seq);
            lowest = Some(match lowest {
                None => p,
                Some(l) if serial_lt(p.0, l.0) || (p.0 == l.0 && serial_lt(p.1, l.1)) => p,
                Some(l) => l,
            });
        }
        let (c, s) = lowest.unwrap_or((0, 0));
        self.resume_collective = c;
        self.resume_seq = s;
        self.floor = s;
        self.pool.clear();
        self.state = JobState::Active;
        self.counters.activations += 1;
    }

    fn on_leave(&mut self, hdr: &HeaderRepr, from: &Endpoint) -> Option<DropReason> {
        let Some(Some(m)) = self.members.get_mut(hdr.rank as usize) else {
            return Some(DropReason::RankOutOfRange);
        };
        if m.endpoint.source != from.source {
            return Some(DropReason::SourceMismatch);
        }
        m.left = true;
        if self.members.iter().flatten().all(|m| m.left) {
            self.reset_to_joining();
        }
        None
    }

    /// Takes one DATA. `values` are the payload bytes (count × 4, checked by
    /// [`HeaderRepr::parse`]); `ce` tells whether its IP header was CE-marked.
    fn on_data(
        &mut self,
        hdr: &HeaderRepr,
        values: &[u8],
        from: &Source,
        ce: bool,
        gen: u32,
    ) -> DataOutcome {
        if hdr.gen != gen {
            if self.source_allowed(from.ip) {
                return self.nack(DropReason::StaleGeneration, NackReason::StaleGeneration);
            }
            return self.drop(DropReason::SourceNotAllowed);
        }
        if self.state != JobState::Active {
            if self.source_allowed(from.ip) {
                return self.nack(DropReason::NotActive, NackReason::JobNotActive);
            }
            return self.drop(DropReason::SourceNotAllowed);
        }
        let Some(Some(member)) = self.members.get(hdr.rank as usize) else {
            return self.drop(DropReason::RankOutOfRange);
        };
        if member.endpoint.source != *from {
            return self.drop(DropReason::SourceMismatch);
        }
        if hdr.count > self.config.elems_per_chunk {
            return self.drop(DropReason::CountMismatch);
        }
        let idx = self.pool.index(hdr.seq);
        let slot = &self.pool.slots[idx];
        if slot.shadow.is_some_and(|s| s.seq == hdr.seq) {
            self.counters.retransmits_served += 1;
            return DataOutcome::Retransmit { seq: hdr.seq };
        }
        let ahead = serial_offset(self.floor, hdr.seq);
        if ahead < 0 {
            return self.drop(DropReason::Stale);
        }
        if ahead >= self.window as i64 {
            return self.drop(DropReason::BeyondWindow);
        }
        let agg = slot.agg;
        let already_seen = slot.seen.contains(hdr.rank);
        match agg {
            Some(a) if a.seq != hdr.seq => return self.drop(DropReason::SlotBusy),
            Some(_) if already_seen => return self.drop(DropReason::Duplicate),
            Some(a) if a.count != hdr.count => return self.drop(DropReason::CountMismatch),
            Some(a) if a.collective != hdr.collective => {
                return self.drop(DropReason::CollectiveMismatch)
            }
            Some(_) => {}
            None => {
                self.pool.slots[idx].agg = Some(Aggregation {
                    seq: hdr.seq,
                    collective: hdr.collective,
                    count: hdr.count,
                    next_rank: 0,
                    ece: false,
                });
            }
        }
        if ce {
            if let Some(a) = self.pool.slots[idx].agg.as_mut() {
                a.ece = true;
            }
        }
        self.counters.contributions += 1;
        self.counters.bytes_aggregated += values.len() as u64;
        match self.pool.take(idx, hdr.rank, values) {
            Taken::Pending => DataOutcome::Taken,
            Taken::Completed => {
                self.counters.chunks_completed += 1;
                if self.pool.slots[idx].shadow.is_some_and(|s| s.ece) {
                    self.counters.ece_marked += 1;
                }
                self.advance_floor();
                DataOutcome::Completed { seq: hdr.seq }
            }
        }
    }

    fn advance_floor(&mut self) {
        for _ in 0..self.pool.len() {
            let slot = &self.pool.slots[self.pool.index(self.floor)];
            if slot.shadow.is_some_and(|s| s.seq == self.floor) {
                self.floor = self.floor.wrapping_add(1);
            } else {
                break;
            }
        }
    }

    /// Builds the header of a RESULT of `seq` for `rank`.
    pub fn result_header(&self, seq: u32, rank: u16, retx: bool, gen: u32) -> Option<HeaderRepr> {
        let r = self.result(seq)?;
        let mut f = 0;
        if r.ece {
            f |= flags::ECE;
        }
        if retx {
            f |= flags::RETX;
        }
        Some(HeaderRepr {
            msg_type: MsgType::Result,
            flags: f,
            job: self.config.id,
            rank,
            count: r.values.len() as u16,
            seq,
            collective: r.collective,
            window: self.window,
            gen,
        })
    }

    /// Builds the header of a JOIN_ACK for `rank`.
    pub fn join_ack_header(&self, rank: u16, gen: u32) -> HeaderRepr {
        HeaderRepr {
            msg_type: MsgType::JoinAck,
            flags: 0,
            job: self.config.id,
            rank,
            count: 0,
            seq: self.resume_seq,
            collective: self.resume_collective,
            window: self.window,
            gen,
        }
    }

    pub fn join_ack_payload(&self) -> crate::wire::JoinAckPayload {
        crate::wire::JoinAckPayload {
            pool_slots: self.config.pool_slots,
            elems_per_chunk: self.config.elems_per_chunk,
            n_workers: self.config.n_workers,
        }
    }
}

/// Counters for messages that never reached a job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableCounters {
    pub unknown_job: u64,
    pub unexpected_type: u64,
}

/// What the switch should do with one parsed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Join(JoinOutcome),
    Data(DataOutcome),
    /// LEAVE taken; nothing to send.
    Noted,
    /// HEARTBEAT from a member: answer it with the ranks `seq` waits for
    /// ([`Job::write_missing_ranks`]).
    Heartbeat {
        seq: u32,
    },
    /// Dropped and counted (on the job, or on the table when the job is unknown).
    Dropped(Option<DropReason>),
    /// JOIN for an unknown job, or DATA for a removed one: NACK 1 to the
    /// sender.
    NackUnknownJob,
}

/// Every job of the switch, and the switch generation.
#[derive(Debug)]
pub struct JobTable {
    gen: u32,
    jobs: FxHashMap<u16, Job>,
    /// Ids of jobs removed while running: their workers' DATA gets NACK 1
    /// (so they fail with a clear error instead of stalling).
    removed: std::collections::HashSet<u16>,
    pub counters: TableCounters,
}

impl JobTable {
    /// `gen` is the switch generation: random at start, never 0.
    pub fn new(gen: u32) -> JobTable {
        JobTable {
            gen: gen.max(1),
            jobs: FxHashMap::default(),
            removed: Default::default(),
            counters: TableCounters::default(),
        }
    }

    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// Declares a job.
    pub fn add(&mut self, config: JobConfig, max_elems: u16) -> Result<(), JobConfigError> {
        config.validate(max_elems)?;
        if self.jobs.contains_key(&config.id) {
            return Err(JobConfigError::Duplicate(config.id));
        }
        self.removed.remove(&config.id);
        self.jobs.insert(config.id, Job::new(config));
        Ok(())
    }

    /// Removes a job and frees its memory; its workers then get NACK 1.
    pub fn remove(&mut self, id: u16) -> Option<Job> {
        let job = self.jobs.remove(&id)?;
        self.removed.insert(id);
        Some(job)
    }

    pub fn get(&self, id: u16) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub fn get_mut(&mut self, id: u16) -> Option<&mut Job> {
        self.jobs.get_mut(&id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// Feeds one parsed message from `from`. `payload` is what follows the
    /// header; `ce` is whether the IP header carried CE.
    pub fn handle(
        &mut self,
        hdr: &HeaderRepr,
        payload: &[u8],
        from: Endpoint,
        ce: bool,
    ) -> Verdict {
        let gen = self.gen;
        let Some(job) = self.jobs.get_mut(&hdr.job) else {
            return match hdr.msg_type {
                MsgType::Join => {
                    self.counters.unknown_job += 1;
                    Verdict::NackUnknownJob
                }
                MsgType::Data | MsgType::Heartbeat if self.removed.contains(&hdr.job) => {
                    self.counters.unknown_job += 1;
                    Verdict::NackUnknownJob
                }
                _ => {
                    self.counters.unknown_job += 1;
                    Verdict::Dropped(None)
                }
            };
        };
        match hdr.msg_type {
            MsgType::Data => Verdict::Data(job.on_data(hdr, payload, &from.source, ce, gen)),
            MsgType::Join => match JoinPayload::parse(payload) {
                Ok(j) => Verdict::Join(job.on_join(hdr, &j, from)),
                // parse() of the header already checked the length.
                Err(_) => Verdict::Dropped(None),
            },
            MsgType::Leave => match job.on_leave(hdr, &from) {
                None => Verdict::Noted,
                Some(r) => {
                    job.counters.drops[r as usize] += 1;
                    Verdict::Dropped(Some(r))
                }
            },
            MsgType::Heartbeat => {
                let member = job.member(hdr.rank).map(|e| e.source);
                if job.state() == JobState::Active && member == Some(from.source) {
                    Verdict::Heartbeat { seq: hdr.seq }
                } else if job.source_allowed(from.source.ip) {
                    job.counters.nacks += 1;
                    Verdict::Data(DataOutcome::Nack(if hdr.gen != gen {
                        NackReason::StaleGeneration
                    } else {
                        NackReason::JobNotActive
                    }))
                } else {
                    job.counters.drops[DropReason::SourceNotAllowed as usize] += 1;
                    Verdict::Dropped(Some(DropReason::SourceNotAllowed))
                }
            }
            MsgType::Result | MsgType::JoinAck | MsgType::Nack => {
                job.counters.drops[DropReason::UnexpectedType as usize] += 1;
                self.counters.unexpected_type += 1;
                Verdict::Dropped(Some(DropReason::UnexpectedType))
            }
        }
    }
}

#[cfg(test)]
mod tests;
