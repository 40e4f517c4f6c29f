//! The data path without the table lock: DATA from a bound member of an
//! active job, taken by any number of dataplane threads at once
//! (docs/BENCHMARKS.md, "Scaling over cores", has why this design).
//!
//! Owns: [`DataPath`] (the switch generation and an RCU-style snapshot of
//! the jobs: every frame loads it, the table swaps a new one in when a job
//! is added or removed), [`JobCore`] (what the data path needs of one job:
//! its [`SlotEngine`], an admission snapshot the table swaps in whenever
//! the job's state or membership changes, and per-thread counters) and
//! [`DataOutcome`] (what one DATA did, on this path or under the table's
//! lock: both take it through `JobCore::take`).
//!
//! Layering: below `job` (a job holds its `JobCore` and publishes its
//! admission snapshots), which is why a DATA's outcome is defined here.
//!
//! Invariants:
//! * The fast path takes only DATA the table would take: the job is active
//!   and neither a leaf nor `auth = "mac"`, the message is of the current
//!   generation, from its rank's bound member (source and switch port),
//!   with the job's count and length (none for a NOVAL DATA), of any
//!   collective kind the job serves (a spine's other kinds go to the table,
//!   which answers NACK 10). Anything else is [`Fast::Slow`]: the
//!   caller hands it to [`super::JobTable::handle`] under the table lock,
//!   which counts, drops or answers it as it always did. So the rules for
//!   strangers, NACKs and refusals live in one place.
//! * An admission snapshot names the engine epoch it was made for; the
//!   engine discards a contribution whose epoch is not its current one, so
//!   DATA admitted just before a reset or an activation is never summed
//!   into the next activation.
//! * The admin path never waits for the data path, nor the data path for
//!   it: readers load snapshots (`arc-swap`), writers swap whole new ones.
//! * Counters are striped per thread (each thread writes its own cache
//!   lines); readers sum the stripes.
//! * Every admitted DATA, on either path, is judged against the priority
//!   board in [`JobCore::take`] ([`super::priority`]): relaxed loads, and a
//!   store only when a stamp or the yield flag changes. Only a DATA the
//!   engine took (not a duplicate, a resend answered from the shadow, or a
//!   drop) marks its class busy.
//! * Leaf and `auth = "mac"` jobs take the table lock for DATA: their
//!   completions touch per-job state kept under it (a partial's resend
//!   timer, the RESULT tag). So does a leaf's partial to a `stats` spine:
//!   its statistics trailer is read there.
//! * In a `stats` job the engine writes each summed result's statistics
//!   trailer after its values ([`ResultRef::bytes`] includes it), so every
//!   RESULT encoder and resend carries the same bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use super::config::Endpoint;
use super::counters::{DropReason, JobCounters, JobDrops};
use super::engine::{Contributed, Contribution, ResultRef, SlotEngine};
use super::priority::{JobPriority, PriorityBoard};
use crate::tag::{PacketKey, Tag};
use crate::wire::{flags, Dtype, Header, HeaderRepr, Kind, MsgType, NackReason, HEADER_LEN};

/// What to do after a DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOutcome {
    /// Taken into the slot; nothing to send yet.
    Taken,
    /// The slot completed: send its RESULT to every member.
    Completed { seq: u32 },
    /// A leaf's local sum of `seq` is ready: send it up to its spine.
    PartialReady { seq: u32 },
    /// The sender lost this RESULT: send the shadow copy to it, flagged RETX.
    Retransmit { seq: u32 },
    /// Refuse with a NACK to the sender (counted as a drop too).
    Nack(NackReason),
    /// Dropped and counted; send nothing.
    Dropped(DropReason),
}

/// The jobs the data path serves, by id (sorted: a handful, binary-searched).
type JobList = Vec<(u16, Arc<JobCore>)>;

/// What the dataplane threads share: the generation and the jobs.
#[derive(Debug)]
pub struct DataPath {
    gen: u32,
    jobs: ArcSwap<JobList>,
    /// RESULTs the fast path handed to the transmit path, per stripe (the
    /// table's own count is added where its counters are read).
    results_sent: Box<[PaddedCount]>,
    /// When each priority class was last busy ([`super::priority`]).
    board: Arc<PriorityBoard>,
}

/// A counter on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCount(AtomicU64);

impl DataPath {
    pub(super) fn new(gen: u32, now: Instant) -> DataPath {
        DataPath {
            gen,
            jobs: ArcSwap::from_pointee(Vec::new()),
            results_sent: (0..STRIPES).map(|_| PaddedCount::default()).collect(),
            board: Arc::new(PriorityBoard::new(now)),
        }
    }

    /// The priority board the jobs' classes are judged on.
    pub fn board(&self) -> &Arc<PriorityBoard> {
        &self.board
    }

    /// Moves the priority clock to `now`: call it once per batch of frames,
    /// before handing them to [`DataPath::on_datagram`].
    pub fn tick(&self, now: Instant) {
        self.board.tick(now);
    }

    /// Counts `n` RESULTs of `job` handed to the transmit path by `thread`
    /// (a fan-out or a resend the fast path decided).
    pub fn count_results_sent(&self, thread: usize, job: &JobCore, n: u64) {
        job.counters
            .stripe(thread)
            .results_sent
            .fetch_add(n, Ordering::Relaxed);
        self.results_sent[thread & (STRIPES - 1)]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// RESULTs the fast path has handed to the transmit path, in all.
    pub(super) fn results_sent(&self) -> u64 {
        self.results_sent
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Swaps in a new job list (the table's add and remove: control path).
    pub(super) fn publish(&self, jobs: impl Iterator<Item = Arc<JobCore>>) {
        let mut list: JobList = jobs.map(|j| (j.id, j)).collect();
        list.sort_unstable_by_key(|(id, _)| *id);
        self.jobs.store(Arc::new(list));
    }

    /// The switch generation.
    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// The data-path half of job `id`, if it is declared.
    pub fn job(&self, id: u16) -> Option<Arc<JobCore>> {
        self.with_job(id, Arc::clone)
    }

    /// Runs `f` on job `id`'s data-path half without taking a reference
    /// count (the per-frame lookup).
    pub fn with_job<R>(&self, id: u16, f: impl FnOnce(&Arc<JobCore>) -> R) -> Option<R> {
        let jobs = self.jobs.load();
        let i = jobs.binary_search_by_key(&id, |(j, _)| *j).ok()?;
        Some(f(&jobs[i].1))
    }

    /// One received datagram (a UDP payload) on dataplane thread `thread`:
    /// a DATA taken here, or [`Fast::Slow`] for the table.
    pub fn on_datagram(&self, thread: usize, datagram: &[u8], from: &Endpoint, ce: bool) -> Fast {
        let Ok(h) = Header::new_checked(datagram) else {
            return Fast::Slow;
        };
        let Ok(hdr) = HeaderRepr::parse(&h) else {
            return Fast::Slow;
        };
        if hdr.msg_type != MsgType::Data || hdr.gen != self.gen {
            return Fast::Slow;
        }
        let payload = &datagram[HEADER_LEN..];
        self.with_job(hdr.job, |job| job.on_data(thread, &hdr, payload, from, ce))
            .unwrap_or(Fast::Slow)
    }
}

/// What the fast path did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fast {
    /// Not for the fast path: hand it to the table, under its lock.
    Slow,
    /// Taken, or dropped and counted: nothing to send.
    Done(DataOutcome),
    /// This DATA completed `seq`: send its RESULT to every member
    /// ([`JobCore::for_each_member`]).
    Completed { job: u16, seq: u32 },
    /// The sender (rank `rank`) lost `seq`'s RESULT: send it again, to the
    /// sender only, under its lane replies (its bound endpoint's
    /// [`Endpoint::result_lanes`]).
    Retransmit {
        job: u16,
        rank: u16,
        seq: u32,
        result_lanes: u16,
    },
}

/// Who may send DATA to a job now, as of the table's last change.
#[derive(Debug, Default)]
pub(super) struct Admission {
    /// The job is active, neither a leaf nor `auth = "mac"`.
    pub(super) fast: bool,
    /// The engine epoch this snapshot was made for.
    pub(super) epoch: u32,
    /// Kinds other than all-reduce are served (false on a spine: its
    /// members are leaves, and trees serve all-reduce alone).
    pub(super) kinds: bool,
    /// Per rank, its bound member while the job is active.
    pub(super) members: Box<[Option<Endpoint>]>,
    /// The RESULT key of the activation, while the job is active: it makes
    /// the tokens of an `auth = "port"` job's RESULTs.
    pub(super) result_key: Option<PacketKey>,
}

/// The tokens of one chunk's RESULTs (docs/PROTOCOL.md, "RESULT tokens"),
/// made once per fan-out or resend: a token leaves out `rank` and `RETX`,
/// so the RESULTs with values share one and the NOVAL ones another.
#[derive(Debug, Clone, Copy)]
pub struct ResultTokens {
    /// The window the tokens cover: every RESULT they go with carries it.
    pub window: u16,
    values: Tag,
    /// The NOVAL RESULT's (a reduce-scatter's or all-gather's chunk).
    noval: Option<Tag>,
}

impl ResultTokens {
    /// The token of the RESULT with header `hdr` (one of this chunk's).
    pub fn for_header(&self, hdr: &HeaderRepr) -> &Tag {
        match &self.noval {
            Some(t) if hdr.no_values() => t,
            _ => &self.values,
        }
    }
}

/// The data-path half of one job, shared by the table and the threads.
#[derive(Debug)]
pub struct JobCore {
    pub id: u16,
    pub dtype: Dtype,
    pub elems_per_chunk: u16,
    /// `auth = "mac"`: its RESULTs carry a tag the table keeps, so they
    /// are encoded by the table, under its lock.
    pub tagged: bool,
    pub engine: SlotEngine,
    /// Its class, and whether it yields to a busy higher class now.
    pub priority: JobPriority,
    admission: ArcSwap<Admission>,
    counters: StripedCounters,
}

impl JobCore {
    pub(super) fn new(
        id: u16,
        dtype: Dtype,
        elems_per_chunk: u16,
        tagged: bool,
        engine: SlotEngine,
        priority: JobPriority,
    ) -> JobCore {
        JobCore {
            id,
            dtype,
            elems_per_chunk,
            tagged,
            engine,
            priority,
            admission: ArcSwap::from_pointee(Admission::default()),
            counters: StripedCounters::new(),
        }
    }

    /// The RESULT of `seq` for `rank`: its header (`window`: the job's, or
    /// the one a mac job's tag covers; the chunk's kind, and `NOVAL` when
    /// the kind gives `rank` no values) and the shadow, read-locked (no
    /// completion overwrites it while held), as `rank` gets it: without
    /// values in a NOVAL RESULT.
    pub fn result_for(
        &self,
        seq: u32,
        rank: u16,
        retx: bool,
        gen: u32,
        window: u16,
    ) -> Option<(HeaderRepr, ResultRef<'_>)> {
        let mut res = self.engine.result(seq)?;
        let hdr = self.result_header(&mut res, seq, rank, retx, gen, window);
        Some((hdr, res))
    }

    /// Makes `res` (the shadow of `seq`, [`SlotEngine::result`]) the view
    /// of `rank` and returns the header of its RESULT to `rank`, as
    /// [`JobCore::result_for`] does: a fan-out takes the read lock once
    /// and calls this per member.
    pub fn result_header(
        &self,
        res: &mut ResultRef<'_>,
        seq: u32,
        rank: u16,
        retx: bool,
        gen: u32,
        window: u16,
    ) -> HeaderRepr {
        res.set_rank(rank);
        let mut h = self.values_header(res, seq, gen, window);
        h.rank = rank;
        if res.no_values() {
            h.flags |= flags::NOVAL;
        }
        if retx {
            h.flags |= flags::RETX;
        }
        h
    }

    /// The header of `res`'s RESULT with values, to rank 0, not a resend.
    fn values_header(&self, res: &ResultRef<'_>, seq: u32, gen: u32, window: u16) -> HeaderRepr {
        let sh = res.shadow();
        let mut f = sh.kind.flag_bits();
        if sh.ece {
            f |= flags::ECE;
        }
        HeaderRepr {
            msg_type: MsgType::Result,
            flags: f,
            job: self.id,
            rank: 0,
            count: sh.count,
            seq,
            collective: sh.collective,
            window,
            gen,
        }
    }

    /// The token of the one RESULT with header `hdr`, as sent (a resend, or
    /// a RESULT the table queued): `None` when [`JobCore::result_tokens`]
    /// gives none.
    pub fn result_token(&self, hdr: &HeaderRepr) -> Option<Tag> {
        let a = self.admission.load();
        a.result_key.as_ref().map(|k| k.token(hdr))
    }

    /// The tokens of `res`'s RESULTs (the shadow of `seq`) sent with
    /// `window` under generation `gen`: `None` in an `auth = "mac"` job
    /// (the table tags its RESULTs) or while the job is not active, when no
    /// RESULT is sent.
    pub fn result_tokens(
        &self,
        res: &ResultRef<'_>,
        seq: u32,
        gen: u32,
        window: u16,
    ) -> Option<ResultTokens> {
        let a = self.admission.load();
        let key = a.result_key.as_ref()?;
        let mut h = self.values_header(res, seq, gen, window);
        let values = key.token(&h);
        let noval = (res.shadow().kind != Kind::AllReduce).then(|| {
            h.flags |= flags::NOVAL;
            key.token(&h)
        });
        Some(ResultTokens {
            window,
            values,
            noval,
        })
    }

    /// The window its RESULTs advertise now: the declared one (which the
    /// engine enforces), or its yield share while a job of a higher class
    /// is busy ([`super::priority`]).
    pub fn advertised_window(&self) -> u16 {
        self.priority.advertise(self.engine.window())
    }

    /// Publishes who may send DATA now (the table, after a change).
    pub(super) fn admit(&self, a: Admission) {
        self.admission.store(Arc::new(a));
    }

    /// Whether the job serves kinds other than all-reduce, as of the last
    /// admission snapshot ([`super::Job::serves_kinds`]).
    pub fn serves_kinds(&self) -> bool {
        self.admission.load().kinds
    }

    /// Calls `f(rank, endpoint)` for every member of the active job, in
    /// rank order (a RESULT's fan-out).
    pub fn for_each_member(&self, mut f: impl FnMut(u16, &Endpoint)) {
        let a = self.admission.load();
        for (r, m) in a.members.iter().enumerate() {
            if let Some(m) = m {
                f(r as u16, m);
            }
        }
    }

    /// A DATA on the fast path (module docs).
    fn on_data(
        &self,
        thread: usize,
        hdr: &HeaderRepr,
        payload: &[u8],
        from: &Endpoint,
        ce: bool,
    ) -> Fast {
        let a = self.admission.load();
        if !a.fast {
            return Fast::Slow;
        }
        let bound = a.members.get(hdr.rank as usize).copied().flatten();
        if bound.is_none_or(|b| b.source != from.source || b.port_idx != from.port_idx) {
            return Fast::Slow;
        }
        let len = if hdr.no_values() {
            0
        } else {
            self.dtype.payload_len(hdr.count)
        };
        if hdr.count > self.elems_per_chunk || payload.len() != len {
            return Fast::Slow;
        }
        if hdr.kind() != Kind::AllReduce && !a.kinds {
            // A spine: the table refuses it (NACK 10, rate-limited).
            return Fast::Slow;
        }
        match self.take(thread, hdr, payload, ce, a.epoch, None) {
            DataOutcome::Completed { seq } => Fast::Completed { job: self.id, seq },
            DataOutcome::Retransmit { seq } => Fast::Retransmit {
                job: self.id,
                rank: hdr.rank,
                seq,
                result_lanes: bound.map_or(0, |b| b.result_lanes),
            },
            out => Fast::Done(out),
        }
    }

    /// Takes an admitted DATA (`values`: the payload without a tag or
    /// trailer; `part`: a leaf's trailer at a stats spine) into the engine
    /// and counts it on `thread`'s stripe; the table's path (under its
    /// lock) and the fast path both end here.
    pub(super) fn take(
        &self,
        thread: usize,
        hdr: &HeaderRepr,
        values: &[u8],
        ce: bool,
        epoch: u32,
        part: Option<(f64, u32)>,
    ) -> DataOutcome {
        let c = self.counters.stripe(thread);
        // A busy job of a higher class: this one's RESULT is marked and
        // advertises the yield window (module docs of [`super::priority`]).
        let yielding = self.priority.on_data();
        let ce = ce || yielding;
        let contribution = Contribution {
            seq: hdr.seq,
            rank: hdr.rank,
            collective: hdr.collective,
            count: hdr.count,
            kind: hdr.kind(),
            owner: hdr.owner(),
            noval: hdr.no_values(),
            values,
            ce,
        };
        let out = self.engine.contribute_with_part(&contribution, epoch, part);
        match out {
            Contributed::Dropped(r) => {
                c.drops[r as usize].fetch_add(1, Ordering::Relaxed);
                return DataOutcome::Dropped(r);
            }
            Contributed::Retransmit { seq } => {
                c.retransmits_served.fetch_add(1, Ordering::Relaxed);
                return DataOutcome::Retransmit { seq };
            }
            _ => {}
        }
        // Opened or added to a slot: only this makes the class busy.
        self.priority.took_data();
        c.contributions.fetch_add(1, Ordering::Relaxed);
        c.bytes_aggregated
            .fetch_add(values.len() as u64, Ordering::Relaxed);
        match out {
            Contributed::Completed { seq, ece } => {
                c.chunks_completed.fetch_add(1, Ordering::Relaxed);
                if ece {
                    c.ece_marked.fetch_add(1, Ordering::Relaxed);
                }
                if yielding {
                    c.priority_marked.fetch_add(1, Ordering::Relaxed);
                }
                DataOutcome::Completed { seq }
            }
            Contributed::PartialReady { seq } => DataOutcome::PartialReady { seq },
            _ => DataOutcome::Taken,
        }
    }

    /// Adds the data path's counts to `c` and `d` (a snapshot).
    pub(super) fn add_counts(&self, c: &mut JobCounters, d: &mut JobDrops) {
        self.counters.add_to(c, d);
    }

    /// DATA the data path took into a sum or answered with a resend, so
    /// far: what a provisioned job's lease samples (read off the hot path;
    /// the data path writes these counters anyway).
    pub(super) fn activity(&self) -> u64 {
        self.counters.activity()
    }
}

/// Stripes of data-path counters: thread `t` writes stripe `t mod
/// STRIPES`. A power of two; more threads than stripes share some.
const STRIPES: usize = 16;

/// One thread's data-path counters of one job, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    contributions: AtomicU64,
    bytes_aggregated: AtomicU64,
    chunks_completed: AtomicU64,
    ece_marked: AtomicU64,
    priority_marked: AtomicU64,
    retransmits_served: AtomicU64,
    results_sent: AtomicU64,
    drops: [AtomicU64; DropReason::COUNT],
}

#[derive(Debug)]
struct StripedCounters {
    stripes: Box<[Stripe]>,
}

impl StripedCounters {
    fn new() -> StripedCounters {
        StripedCounters {
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    fn stripe(&self, thread: usize) -> &Stripe {
        &self.stripes[thread & (STRIPES - 1)]
    }

    fn activity(&self) -> u64 {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.stripes
            .iter()
            .map(|s| get(&s.contributions) + get(&s.retransmits_served))
            .sum()
    }

    fn add_to(&self, c: &mut JobCounters, d: &mut JobDrops) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for s in self.stripes.iter() {
            c.contributions += get(&s.contributions);
            c.bytes_aggregated += get(&s.bytes_aggregated);
            c.chunks_completed += get(&s.chunks_completed);
            c.ece_marked += get(&s.ece_marked);
            c.priority_marked += get(&s.priority_marked);
            c.retransmits_served += get(&s.retransmits_served);
            c.results_sent += get(&s.results_sent);
            for (k, v) in s.drops.iter().enumerate() {
                d.0[k] += get(v);
            }
        }
    }
}
