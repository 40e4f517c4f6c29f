//! The engine scaling benchmark (issue 21): T threads push pre-built DATA
//! datagrams, in memory, into the switch's state machine and encode the
//! RESULTs it answers with, as switchd's dataplane threads do, with no
//! kernel, NIC or socket in the way.
//!
//! Owns: [`Spec`] (what to run, on which [`BackendKind`] and [`Layout`])
//! and [`run`] (set up, feed, check). Its parts: the [`backend`]s
//! (backend.rs, lanes.rs), [`Sink`] (sink.rs: one thread's reply buffer,
//! counters and result check), the result windows (window.rs) and
//! [`EngineError`] (error.rs).
//!
//! Setup (untimed): a fresh `JobTable` per run, its jobs declared and every
//! rank joined the honest way (HELLO, CHALLENGE, JOIN), so each job is
//! Active; per thread, a ring of DATA datagrams of its ranks for seqs
//! `0..K` (rank r's values for seq s are `reference::pattern(r, s mod K, _)`)
//! and the rank-order reference sum of each of the K chunks.
//!
//! The timed loop, per thread: walk seqs upward, for each seq the thread's
//! ranks in order, stamping the seq into the ring's frame (reused every K
//! seqs), and hand batches of [`BATCH`] to the backend. Like a worker, a
//! thread does not run past its ranks' window: while `seq >= floor + W`
//! it hands over what it holds, then waits for the floor to move, encoding
//! meanwhile what other threads handed it ([`Backend::drain`]). The floor
//! is the harness's own [`ResultWindow`], not the backend's: a seq leaves
//! it once the RESULTs of all the ranks the thread feeds were encoded, by
//! whichever threads, as a worker moves its window on the RESULT it
//! receives (the engine's floor moves at completion, before the fan-out is
//! encoded, and a thread that reused the slot then would race an encoding
//! no real worker can race). Each thread has its ranks' window, as each
//! worker has its own, except in `steered`, where every thread feeds every
//! rank: there each thread keeps its seq lane's window and stays inside
//! the job's window over all lanes ([`JobWindow`]), reading the other
//! lanes' floors only when it reaches the edge (the workers' windows are
//! on other machines: they cost the switch's threads no shared line).
//! In `steered`, each job's engine has one seq lane per thread, elsewhere
//! one (`Spec::seq_lanes`): a lane per thread helps only where each thread
//! takes its own lanes.
//! Waiting takes no lock of the backend's. It allocates nothing and makes
//! no syscall (a long wait yields the CPU). A window that does not move
//! for [`Spec::stuck_after`] fails the run ([`EngineError::WindowStuck`]:
//! a RESULT was lost).
//!
//! Layouts: `rss`, one job of n ranks whose rank r arrives on thread
//! r mod T (what RSS does when each worker's flow hashes to its own
//! queue; the rank joined there, so that thread sends its RESULTs), so
//! every slot's contributions come from several threads; `rank-blocks`,
//! the same with rank r on thread ⌊r·T/n⌋ (switchd's deal on a testbed
//! with a port per worker, or NIC rules steering workers by source), so a
//! rank-order sum passes between threads T − 1 times per seq, not n − 1;
//! `steered`, one job whose seq s arrives, from every rank, on thread
//! s mod T (switchd's seq lanes with an ntuple rule per lane port: the
//! "slots sharded to threads" design; the completing thread sends the
//! RESULTs from its own socket, as switchd does with seq lanes);
//! `job-per-thread`,
//! T jobs, thread t feeding (and answering) every rank of job t.
//!
//! Checks (a wrong engine fails the run, never reports a number): every
//! RESULT of a seq that is a multiple of [`SAMPLE_EVERY`] is compared, bit
//! for bit, with the reference; no DATA may be refused; at the end, RESULTs
//! encoded = ranks × completed seqs of every job.

pub mod backend;
mod error;
mod lanes;
pub mod probe;
mod sink;
mod window;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use proto::handshake::{Handshake, JoinParams};
use proto::reference::fill_pattern;
use proto::switch::{
    Endpoint, Ipv4Prefix, JobConfig, JobTable, JoinOutcome, Source, TableConfig, Verdict,
};
use proto::wire::{
    write_f32s, Header, HeaderRepr, MsgType, DTYPE_F32, HEADER_LEN, MAX_ELEMS_PER_CHUNK, OP_SUM,
};
use serde::Serialize;

use backend::{lock_free, table_lock};
use lanes::Lanes;
use sink::Reference;
use window::{ResultWindow, Windows};

pub use backend::{Backend, Batch, BATCH};
pub use error::EngineError;
pub use sink::{Sink, SAMPLE_EVERY};

const GEN: u32 = 0x5ca1_ab1e;
const SECRET: [u8; 32] = [0x5c; 32];

/// Where each rank's DATA arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One job; rank r's frames on thread r mod T.
    Rss,
    /// One job; rank r's frames on thread ⌊r·T/n⌋: neighbouring ranks on
    /// one thread.
    RankBlocks,
    /// One job; seq s's frames, of every rank, on thread s mod T.
    Steered,
    /// T jobs; thread t feeds every rank of job t.
    JobPerThread,
}

impl Layout {
    pub const ALL: [Layout; 4] = [
        Layout::Rss,
        Layout::RankBlocks,
        Layout::Steered,
        Layout::JobPerThread,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Rss => "rss",
            Layout::RankBlocks => "rank-blocks",
            Layout::Steered => "steered",
            Layout::JobPerThread => "job-per-thread",
        }
    }
}

/// Which engine to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    TableLock,
    LockFree,
    /// `lockfree` behind software seq lanes ([`Lanes`]).
    Lanes,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [
        BackendKind::TableLock,
        BackendKind::LockFree,
        BackendKind::Lanes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::TableLock => "table-lock",
            BackendKind::LockFree => "lockfree",
            BackendKind::Lanes => "lanes",
        }
    }

    /// The engine over `table` (every job declared and active), fed by
    /// `threads` threads (`table-lock`'s `handle` calls are made at `now`;
    /// the others', as switchd's, at the time each batch is taken; thread
    /// q owns queue q of every port; a member that joined on another queue
    /// is answered by the thread that completes its seq).
    pub fn build(
        self,
        table: JobTable,
        now: Instant,
        threads: usize,
    ) -> Result<Box<dyn Backend>, EngineError> {
        match self {
            BackendKind::TableLock => Ok(Box::new(table_lock(table, now))),
            BackendKind::LockFree => Ok(Box::new(lock_free(table, threads))),
            BackendKind::Lanes => Ok(Box::new(Lanes::new(lock_free(table, threads), threads))),
        }
    }
}

/// When the feeding threads stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Until {
    /// After this long (the benchmark).
    Elapsed(Duration),
    /// After every thread fed seqs `0..n` of its ranks (tests).
    Seqs(u32),
}

/// One measurement.
#[derive(Debug, Clone)]
pub struct Spec {
    pub backend: BackendKind,
    pub layout: Layout,
    pub threads: usize,
    /// Ranks per job.
    pub ranks: u16,
    /// float32 elements per DATA.
    pub elems: u16,
    /// Slots per job's pool.
    pub slots: u16,
    /// Each job's window (≤ `slots`).
    pub window: u16,
    /// K: seqs of pre-built frames per rank, reused cyclically.
    pub frames: u32,
    pub until: Until,
    /// CPUs to pin thread t to (`cpus[t]`); no pinning when fewer than
    /// `threads`.
    pub cpus: Vec<usize>,
    /// A window that does not move for this long fails the run.
    pub stuck_after: Duration,
    /// Seq lanes of each job's engine (0: as a switch would configure
    /// them: one per thread where seqs are steered to threads by lane,
    /// else 1).
    pub seq_lanes: u16,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// From the threads' start to the last one's stop.
    pub seconds: f64,
    /// DATA datagrams the engine took (summed into a slot).
    pub data_taken: u64,
    /// Their payload bytes (what was summed).
    pub data_bytes: u64,
    /// RESULTs encoded (one per rank per completed seq).
    pub results: u64,
    /// RESULTs compared bit for bit with the reference.
    pub results_checked: u64,
    /// Seqs completed, all jobs together.
    pub seqs_completed: u64,
    /// CPU time the feeding threads used, together (less than `seconds` ×
    /// threads when other load had their CPUs or a thread slept on a lock).
    pub cpu_seconds: f64,
    /// Whether every thread was pinned to its own CPU.
    pub pinned: bool,
    /// DATA taken per thread.
    pub per_thread_taken: Vec<u64>,
    /// RESULTs encoded per thread.
    pub per_thread_results: Vec<u64>,
}

impl Measured {
    /// Million DATA datagrams taken per second.
    pub fn mpps(&self) -> f64 {
        self.data_taken as f64 / self.seconds / 1e6
    }

    /// Payload bytes summed per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        self.data_bytes as f64 / self.seconds / 1e9
    }

    /// Million RESULTs encoded per second.
    pub fn results_mps(&self) -> f64 {
        self.results as f64 / self.seconds / 1e6
    }

    /// Million DATA taken per CPU-second of the feeding threads.
    pub fn mpps_per_cpu_s(&self) -> f64 {
        self.data_taken as f64 / self.cpu_seconds / 1e6
    }

    /// The share of their CPUs the feeding threads got: CPU time over
    /// wall time × threads that fed (1.0 on an idle machine).
    pub fn cpu_share(&self) -> f64 {
        let feeding = self.per_thread_taken.iter().filter(|t| **t > 0).count();
        self.cpu_seconds / (self.seconds * feeding.max(1) as f64)
    }
}

/// The frames one thread feeds: its ranks' DATA (of one job) for K of
/// the seqs it feeds, densely, as a NIC's receive ring holds them (frame
/// `j * ranks + i` is rank `ranks[i]`'s for the seq at [`Feeder::place`] j).
struct Feeder {
    /// This thread's index in the run (0..T), and its job.
    thread: usize,
    job: u16,
    /// Steered: (this thread's lane, lanes): it feeds the seqs of its lane.
    lane: Option<(u32, u32)>,
    /// Steered: every lane's window, for the job's window over them all.
    job_window: Option<JobWindow>,
    ranks: Vec<u16>,
    from: Vec<Endpoint>,
    ring: Vec<u8>,
    stride: usize,
    len: usize,
}

impl Feeder {
    /// `lane`: steered, (this thread's lane, lanes), and every lane's
    /// window.
    fn new(
        thread: usize,
        job: u16,
        ranks: Vec<u16>,
        lane: Option<(u32, u32, Windows)>,
        spec: &Spec,
    ) -> Feeder {
        let (lane, job_window) = match lane {
            Some((i, t, lanes)) => (
                Some((i, t)),
                Some(JobWindow {
                    lanes,
                    floor: 0,
                    len: u32::from(spec.window),
                }),
            ),
            None => (None, None),
        };
        let len = HEADER_LEN + 4 * spec.elems as usize;
        // Each datagram on its own cache lines, as in UMEM frames.
        let stride = len.next_multiple_of(64);
        let mut ring = vec![0u8; stride * ranks.len() * spec.frames as usize];
        let mut values = vec![0f32; spec.elems as usize];
        let (first, step) = lane.unwrap_or((0, 1));
        for j in 0..spec.frames {
            // The j-th seq this thread feeds, and the pattern of its values
            // (what `Reference` sums for every seq ≡ k mod K).
            let seq = first + j * step;
            let k = seq % spec.frames;
            for (i, &rank) in ranks.iter().enumerate() {
                let mut h = HeaderRepr::new(MsgType::Data, job);
                h.rank = rank;
                h.count = spec.elems;
                h.seq = seq;
                h.gen = GEN;
                let at = (j as usize * ranks.len() + i) * stride;
                let d = &mut ring[at..at + len];
                // The buffer is HEADER_LEN or longer: emit cannot fail.
                let _ = h.emit_to(d);
                fill_pattern(rank, k, &mut values);
                write_f32s(&values, &mut d[HEADER_LEN..]);
            }
        }
        Feeder {
            thread,
            job,
            lane,
            job_window,
            from: ranks.iter().map(|&r| endpoint(spec, job, r)).collect(),
            ranks,
            ring,
            stride,
            len,
        }
    }

    /// Feeds seqs upward until `stop` (or `until`'s seq count); returns
    /// the sink. `window` is the job's window as its workers see it.
    fn run(
        &mut self,
        backend: &dyn Backend,
        spec: &Spec,
        stop: &AtomicBool,
        window: &ResultWindow,
        mut sink: Sink,
    ) -> Sink {
        let frames = spec.frames;
        let last = match spec.until {
            Until::Seqs(n) => Some(n),
            Until::Elapsed(_) => None,
        };
        let nr = self.ranks.len();
        let mut items = [(0u32, 0u16); BATCH];
        let mut n = 0;
        let mut floor = 0u32;
        let mut seq = 0u32;
        'feed: while nr > 0 && Some(seq) != last {
            // Steered: another thread's seq (skipped before the window
            // check: it may already be below the floor).
            if self.lane.is_some_and(|(i, t)| seq % t != i) {
                seq = seq.wrapping_add(1);
                continue;
            }
            // The window: send nothing at or past floor + W (steered: its
            // lane's window, and the job's over every lane).
            let mut spins = 0u32;
            let mut since: Option<(u32, Instant)> = None;
            let at = self.lane.map_or(seq, |(_, t)| seq / t);
            while at.wrapping_sub(floor) >= window.len()
                || self.job_window.as_mut().is_some_and(|j| !j.admits(seq))
            {
                if n > 0 {
                    floor = self.feed(backend, &items[..n], &mut sink, window);
                    n = 0;
                    continue;
                }
                if stop.load(Ordering::Relaxed) {
                    break 'feed;
                }
                // The RESULTs other threads handed this one may be what
                // holds the floor.
                backend.drain(self.thread, &mut sink);
                sink.flush();
                floor = window.advance();
                spins += 1;
                if spins.is_multiple_of(64) {
                    if let Some(e) = self.stuck(&mut since, floor, &sink, spec) {
                        sink.wrong = Some(e);
                        break 'feed;
                    }
                    std::thread::yield_now();
                } else {
                    // Back off: a waiting thread that keeps reading the
                    // window's lines slows the threads that write them.
                    for _ in 0..(1u32 << spins.min(8)) {
                        std::hint::spin_loop();
                    }
                }
            }
            let j = self.place(seq, frames);
            for i in 0..nr {
                let frame = j * nr as u32 + i as u32;
                let at = frame as usize * self.stride;
                Header::new_unchecked(&mut self.ring[at..at + HEADER_LEN]).set_seq(seq);
                items[n] = (frame, i as u16);
                n += 1;
                if n == BATCH {
                    floor = self.feed(backend, &items, &mut sink, window);
                    n = 0;
                    if stop.load(Ordering::Relaxed) || sink.wrong.is_some() {
                        break 'feed;
                    }
                }
            }
            seq = seq.wrapping_add(1);
        }
        if n > 0 {
            self.feed(backend, &items[..n], &mut sink, window);
        }
        sink
    }

    /// Where in the ring `seq`'s frames lie: the seqs a thread feeds are
    /// its lane's (steered) or all, and frame place j holds the j-th of
    /// them (its place in the thread's window), mod K. Place j's values are those of the seq mod K it holds,
    /// the same for every seq that comes back to it.
    fn place(&self, seq: u32, frames: u32) -> u32 {
        match self.lane {
            Some((_, lanes)) => (seq / lanes) % frames,
            None => seq % frames,
        }
    }

    /// How long this thread's window has stood at `floor` (`since`
    /// remembers where and from when): once that is past
    /// `spec.stuck_after`, the error, naming the job's window that is
    /// furthest behind (the others wait for its seq) and how many of that
    /// seq's RESULTs it counted.
    fn stuck(
        &self,
        since: &mut Option<(u32, Instant)>,
        floor: u32,
        sink: &Sink,
        spec: &Spec,
    ) -> Option<EngineError> {
        let now = Instant::now();
        let (at, from) = match *since {
            Some((at, from)) if at == floor => (at, from),
            _ => {
                *since = Some((floor, now));
                return None;
            }
        };
        let waited = now.saturating_duration_since(from);
        if waited < spec.stuck_after {
            return None;
        }
        let behind = sink
            .windows
            .iter()
            .min_by_key(|w| w.floor().wrapping_sub(at) as i32)?;
        let seq = behind.floor();
        Some(EngineError::WindowStuck {
            backend: sink.backend,
            job: self.job,
            seq,
            encoded: behind.count(seq),
            ranks: behind.ranks(),
            secs: waited.as_secs_f64(),
        })
    }

    /// Hands `items` to the backend, counts the RESULTs this thread
    /// encoded in the window and returns its floor.
    fn feed(
        &self,
        backend: &dyn Backend,
        items: &[(u32, u16)],
        sink: &mut Sink,
        window: &ResultWindow,
    ) -> u32 {
        let batch = Batch {
            thread: self.thread,
            ring: &self.ring,
            stride: self.stride,
            len: self.len,
            items,
            from: &self.from,
        };
        backend.feed(&batch, sink);
        sink.flush();
        window.advance()
    }
}

/// The job's window over every seq lane, steered: a worker's window is
/// one, over every seq, but the worker is another machine, so the
/// threads' lanes should not meet on a cache line per seq for it. Each
/// thread keeps its lane's window ([`ResultWindow`], over the lane's seqs)
/// and does not send past the job's floor (the lowest lane floor) + W;
/// it reads the other lanes' floors only when the floor it saw last stops
/// it.
struct JobWindow {
    lanes: Windows,
    /// The job's floor as last read (only ever too low).
    floor: u32,
    len: u32,
}

impl JobWindow {
    /// Whether `seq` is inside the job's window (reads the lanes' floors
    /// when it is not, as last seen).
    fn admits(&mut self, seq: u32) -> bool {
        if seq.wrapping_sub(self.floor) < self.len {
            return true;
        }
        let t = self.lanes.len() as u32;
        let mut lowest: Option<u32> = None;
        for (l, w) in self.lanes.iter().enumerate() {
            // The lane's floor, as a seq: place f of lane l is seq f·T + l.
            let f = w.floor().wrapping_mul(t).wrapping_add(l as u32);
            lowest = Some(match lowest {
                Some(m) if (f.wrapping_sub(m) as i32) >= 0 => m,
                _ => f,
            });
        }
        self.floor = lowest.unwrap_or(self.floor);
        seq.wrapping_sub(self.floor) < self.len
    }
}

/// The queue job `job`'s rank `rank` joins on: the thread its DATA
/// arrives on (rss, job-per-thread), or one no thread owns (steered).
fn queue_of(spec: &Spec, job: u16, rank: u16) -> u32 {
    match spec.layout {
        Layout::Rss => u32::from(rank) % spec.threads as u32,
        Layout::RankBlocks => (usize::from(rank) * spec.threads / usize::from(spec.ranks)) as u32,
        Layout::Steered => u32::MAX,
        Layout::JobPerThread => u32::from(job) - 1,
    }
}

/// Job `job`'s rank `rank`: its own MAC, address and port in 198.18.0.0/15,
/// behind queue [`queue_of`].
fn endpoint(spec: &Spec, job: u16, rank: u16) -> Endpoint {
    let [jh, jl] = job.to_be_bytes();
    let [rh, rl] = rank.to_be_bytes();
    Endpoint {
        source: Source {
            mac: [2, 0, jh, jl, rh, rl],
            ip: [198, 18 | (rh & 1), jl, rl],
            port: 40000u16.wrapping_add(rank),
        },
        queue: queue_of(spec, job, rank),
        ..Endpoint::default()
    }
}

fn job_config(id: u16, spec: &Spec) -> JobConfig {
    JobConfig {
        id,
        n_workers: spec.ranks,
        allowed_sources: vec![Ipv4Prefix {
            addr: [198, 18, 0, 0],
            len: 15,
        }],
        secret: SECRET,
        pool_slots: spec.slots,
        elems_per_chunk: spec.elems,
        dtype: Default::default(),
        window: spec.window,
        priority: Default::default(),
        auth: Default::default(),
        upstream: None,
        stats: false,
    }
}

/// HELLO, CHALLENGE and JOIN of `job`'s `rank` at `now`; the table's
/// replies are drained.
fn join(
    t: &mut JobTable,
    spec: &Spec,
    job: u16,
    rank: u16,
    now: Instant,
) -> Result<Verdict, EngineError> {
    let ranks = spec.ranks;
    let from = endpoint(spec, job, rank);
    let params = JoinParams {
        job,
        rank,
        n_workers: ranks,
        dtype: DTYPE_F32,
        op: OP_SUM,
        secret: SECRET,
        ip: from.source.ip,
        port: from.source.port,
        provision: None,
    };
    let [jh, jl] = job.to_be_bytes();
    let [rh, rl] = rank.to_be_bytes();
    let mut hs = Handshake::new(
        params,
        [jh, jl, rh, rl, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    );
    let mut b = [0u8; 256];
    let no_challenge = || EngineError::NoChallenge { job, rank };
    let n = hs.emit_hello(&mut b).map_err(|_| no_challenge())?;
    t.handle(&b[..n], from, false, now);
    let r = t.poll_reply().ok_or_else(no_challenge)?;
    let e = t.encode(&r, &mut b).ok_or_else(no_challenge)?;
    let h = Header::new_checked(&b[..e.len])
        .and_then(|h| HeaderRepr::parse(&h))
        .map_err(|_| no_challenge())?;
    hs.on_challenge(&h, &b[HEADER_LEN..e.len])
        .map_err(|_| no_challenge())?;
    let n = hs.emit_join(0, 0, &mut b).ok_or_else(no_challenge)?;
    let v = t.handle(&b[..n], from, false, now);
    while t.poll_reply().is_some() {}
    Ok(v)
}

/// A table with `jobs` declared and every rank of each joined.
fn active_table(jobs: &[u16], spec: &Spec, now: Instant) -> Result<JobTable, EngineError> {
    let lanes = match (spec.seq_lanes, spec.layout) {
        (0, Layout::Steered) => spec.threads as u16,
        (0, _) => 1,
        (l, _) => l,
    };
    let mut t = JobTable::new(
        TableConfig {
            seq_lanes: lanes,
            ..TableConfig::new(GEN, [0x42; 32])
        },
        now,
    );
    for &job in jobs {
        t.add(job_config(job, spec), MAX_ELEMS_PER_CHUNK)
            .map_err(|e| EngineError::AddJob {
                job,
                why: e.to_string(),
            })?;
        for rank in 0..spec.ranks {
            let want = if rank + 1 == spec.ranks {
                JoinOutcome::Activated
            } else {
                JoinOutcome::Waiting
            };
            let verdict = join(&mut t, spec, job, rank, now)?;
            if verdict != Verdict::Join(want) {
                return Err(EngineError::Join {
                    job,
                    rank,
                    verdict,
                    want,
                });
            }
        }
    }
    Ok(t)
}

fn validate(spec: &Spec) -> Result<(), EngineError> {
    let bad = |s: String| Err(EngineError::Spec(s));
    if spec.threads == 0 {
        return bad("--threads needs at least 1 thread".into());
    }
    if spec.threads > 64 {
        return bad(format!("--threads {} is over 64", spec.threads));
    }
    if spec.ranks == 0 || spec.ranks > 512 {
        return bad(format!("--ranks {} is not in 1..=512", spec.ranks));
    }
    if spec.window == 0 || spec.window > spec.slots {
        return bad(format!(
            "window {} is not in 1..=slots ({})",
            spec.window, spec.slots
        ));
    }
    if (spec.frames as usize) < BATCH {
        return bad(format!(
            "--frames {} is below {BATCH} (a batch must not reuse a frame it holds)",
            spec.frames
        ));
    }
    Ok(())
}

/// Stops the other threads when a feeding thread panics, so that none
/// waits forever for a floor the panicked one would have moved.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Pins the calling thread to `cpu`; whether that worked.
pub(crate) fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays inside it
    // for cpu < CPU_SETSIZE (checked), and sched_setaffinity(0) only reads it.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity(0) fills the zeroed set it is given;
    // CPU_ISSET reads inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Sets up a fresh table, runs `spec` and checks what the engine answered.
pub fn run(spec: &Spec) -> Result<Measured, EngineError> {
    run_on(spec, |table, now| {
        spec.backend.build(table, now, spec.threads)
    })
}

/// [`run`] on the backend `build` makes of the set-up table.
fn run_on(
    spec: &Spec,
    build: impl FnOnce(JobTable, Instant) -> Result<Box<dyn Backend>, EngineError>,
) -> Result<Measured, EngineError> {
    validate(spec)?;
    let name = spec.backend.name();
    let t = spec.threads;
    // Thread i's job and ranks.
    let plan: Vec<(u16, Vec<u16>)> = match spec.layout {
        Layout::Rss | Layout::RankBlocks => (0..t)
            .map(|i| {
                let ranks = (0..spec.ranks)
                    .filter(|r| queue_of(spec, 1, *r) as usize == i)
                    .collect();
                (1, ranks)
            })
            .collect(),
        Layout::Steered => (0..t).map(|_| (1, (0..spec.ranks).collect())).collect(),
        Layout::JobPerThread => (0..t)
            .map(|i| (i as u16 + 1, (0..spec.ranks).collect()))
            .collect(),
    };
    // Steered: thread i takes the seqs ≡ i mod T.
    let lanes = spec.layout == Layout::Steered;
    let mut jobs: Vec<u16> = plan.iter().map(|p| p.0).collect();
    jobs.dedup();
    let now = Instant::now();
    let table = active_table(&jobs, spec, now)?;
    let backend = build(table, now)?;
    let reference = Arc::new(Reference::new(spec.ranks, spec.elems, spec.frames));
    let pin = spec.cpus.len() >= t;
    let stop = AtomicBool::new(false);
    // Threads that have stopped feeding (see below).
    let fed = AtomicUsize::new(0);
    // Per thread, the window of the ranks it feeds (steered: of its lane,
    // W / T of the lane's seqs, and the job's over every lane, W), and per
    // rank of its job (steered: per lane), the window that counts that
    // rank's RESULTs.
    let lane_len = (spec.window / t as u16).max(1);
    let windows: Vec<Arc<ResultWindow>> = plan
        .iter()
        .map(|(_, ranks)| match lanes {
            true => Arc::new(ResultWindow::new(lane_len, spec.ranks)),
            false => Arc::new(ResultWindow::new(spec.window, ranks.len() as u16)),
        })
        .collect();
    let every_lane: Windows = windows.iter().cloned().collect();
    let by_rank: Vec<Windows> = plan
        .iter()
        .map(|(job, _)| {
            if lanes {
                return every_lane.clone();
            }
            (0..spec.ranks)
                .map(|r| {
                    // The thread that feeds rank r of this job.
                    let feeder = plan
                        .iter()
                        .position(|(j, rs)| j == job && rs.contains(&r))
                        .unwrap_or(0);
                    windows[feeder].clone()
                })
                .collect()
        })
        .collect();
    // The threads and this one: frames built, then all start together.
    let ready = Barrier::new(t + 1);
    let backend = &*backend;
    let (sinks, ends, cpu, pinned, start) = std::thread::scope(|s| {
        let handles: Vec<_> = plan
            .into_iter()
            .enumerate()
            .map(|(i, (job, ranks))| {
                let (stop, fed, ready) = (&stop, &fed, &ready);
                let reference = reference.clone();
                let window = windows[i].clone();
                let by_rank = by_rank[i].clone();
                let every_lane = every_lane.clone();
                s.spawn(move || {
                    let _guard = StopOnPanic(stop);
                    let pinned = pin && pin_to(spec.cpus[i]);
                    let lane = lanes.then_some((i as u32, t as u32, every_lane));
                    let mut feeder = Feeder::new(i, job, ranks, lane, spec);
                    let by = if lanes { t as u32 } else { 0 };
                    let sink = Sink::new(name, spec.frames, reference, by_rank, by);
                    ready.wait();
                    let cpu = thread_cpu_time();
                    let mut sink = feeder.run(backend, spec, stop, &window, sink);
                    if sink.wrong.is_some() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    // A backend that hands DATA between threads (lanes) may
                    // hold another thread's next seq here: take what comes
                    // until every thread has stopped feeding.
                    fed.fetch_add(1, Ordering::AcqRel);
                    while fed.load(Ordering::Acquire) < t && !stop.load(Ordering::Relaxed) {
                        if backend.drain(i, &mut sink) == 0 {
                            std::thread::yield_now();
                        }
                        sink.flush();
                    }
                    let end = Instant::now();
                    (sink, end, thread_cpu_time().saturating_sub(cpu), pinned)
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        if let Until::Elapsed(d) = spec.until {
            // Wake often, so that a wrong result stops the run early.
            while start.elapsed() < d && !handles.iter().all(|h| h.is_finished()) {
                std::thread::sleep(
                    (d.saturating_sub(start.elapsed())).min(Duration::from_millis(10)),
                );
            }
            stop.store(true, Ordering::Relaxed);
        }
        let mut sinks = Vec::new();
        let mut ends = Vec::new();
        let mut cpu = Duration::ZERO;
        let mut pinned = true;
        for h in handles {
            // A panicking thread is a bug in the harness or the engine.
            let (sink, end, c, p) = h.join().expect("feeding thread panicked");
            sinks.push(sink);
            ends.push(end);
            cpu += c;
            pinned &= p;
        }
        // What other threads handed each one after it stopped: every
        // thread has stopped feeding, but what one drains may hand more to
        // another (a DATA taken from a lane completes a seq), so until a
        // round takes nothing.
        while sinks
            .iter_mut()
            .enumerate()
            .map(|(i, sink)| backend.drain(i, sink))
            .sum::<usize>()
            > 0
        {}
        (sinks, ends, cpu, pinned, start)
    });
    let seconds = ends
        .iter()
        .map(|e| e.saturating_duration_since(start))
        .max()
        .unwrap_or_default()
        .as_secs_f64();
    let mut m = Measured {
        seconds,
        data_taken: 0,
        data_bytes: 0,
        results: 0,
        results_checked: 0,
        seqs_completed: 0,
        cpu_seconds: cpu.as_secs_f64(),
        pinned,
        per_thread_taken: Vec::new(),
        per_thread_results: Vec::new(),
    };
    let (mut refused, mut first_refusal) = (0, None);
    let (mut unexpected, mut first_unexpected) = (0, None);
    for s in sinks {
        if let Some(e) = s.wrong {
            return Err(e);
        }
        m.data_taken += s.taken;
        m.data_bytes += s.taken * s.payload_len;
        m.results += s.results;
        m.results_checked += s.checked;
        m.per_thread_taken.push(s.taken);
        m.per_thread_results.push(s.results);
        refused += s.refused;
        first_refusal = first_refusal.or(s.first_refusal);
        unexpected += s.unexpected;
        first_unexpected = first_unexpected.or(s.first_unexpected);
    }
    if let Some(first) = first_refusal {
        return Err(EngineError::Refused {
            backend: name,
            count: refused,
            first,
        });
    }
    if unexpected > 0 {
        return Err(EngineError::UnexpectedReply {
            backend: name,
            count: unexpected,
            first: first_unexpected,
        });
    }
    m.seqs_completed = jobs.iter().map(|&j| backend.completed(j)).sum();
    if m.seqs_completed == 0 {
        return Err(EngineError::NothingCompleted { backend: name });
    }
    if m.results != m.seqs_completed * spec.ranks as u64 {
        return Err(EngineError::ResultCount {
            backend: name,
            results: m.results,
            seqs: m.seqs_completed,
            ranks: spec.ranks,
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests;
