use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use proto::switch::{DataOutcome, Reply, ReplyMsg};

use super::backend::table_floor;
use super::*;

/// 4 ranks × 500 seqs = 2000 DATA per job; 16 slots and 64 frames per rank,
/// so slots and frames are reused many times over.
fn spec(backend: BackendKind, layout: Layout, threads: usize) -> Spec {
    Spec {
        backend,
        layout,
        threads,
        ranks: 4,
        elems: 64,
        slots: 16,
        window: 16,
        frames: 64,
        until: Until::Seqs(500),
        cpus: Vec::new(),
        stuck_after: Duration::from_secs(20),
        seq_lanes: 0,
    }
}

/// Seqs below 500 that are multiples of SAMPLE_EVERY (0, 61, …, 488).
const SAMPLED_SEQS: u64 = 500u64.div_ceil(SAMPLE_EVERY as u64);

#[test]
fn every_built_backend_sums_right_in_every_layout() {
    let mut built = 0;
    for backend in BackendKind::ALL {
        for layout in Layout::ALL {
            for threads in [1, 2, 3] {
                let s = spec(backend, layout, threads);
                let m = match run(&s) {
                    Err(EngineError::NotBuilt { .. }) => continue,
                    r => r.unwrap_or_else(|e| panic!("{} {threads} threads: {e}", layout.name())),
                };
                built += 1;
                let jobs = match layout {
                    Layout::Rss | Layout::RankBlocks | Layout::Steered => 1,
                    Layout::JobPerThread => threads as u64,
                };
                let what = format!("{} {} {threads} threads", backend.name(), layout.name());
                assert_eq!(m.data_taken, 2000 * jobs, "{what}");
                assert_eq!(m.data_bytes, 2000 * jobs * 64 * 4, "{what}");
                assert_eq!(m.seqs_completed, 500 * jobs, "{what}");
                assert_eq!(m.results, 2000 * jobs, "{what}");
                assert_eq!(m.results_checked, SAMPLED_SEQS * 4 * jobs, "{what}");
                assert_eq!(m.per_thread_taken.iter().sum::<u64>(), m.data_taken);
                if backend == BackendKind::Lanes {
                    // Every DATA is taken by its seq's lane, wherever it
                    // arrived: 4 ranks × the seqs s < 500 with s mod T = t.
                    let lanes: Vec<u64> = (0..threads as u64)
                        .map(|t| {
                            4 * jobs * (0..500).filter(|s| s % threads as u64 == t).count() as u64
                        })
                        .collect();
                    assert_eq!(m.per_thread_taken, lanes, "{what}");
                } else {
                    if layout == Layout::Rss && threads == 3 {
                        // Ranks 0 and 3 on thread 0, rank 1 and rank 2 alone.
                        assert_eq!(m.per_thread_taken, vec![1000, 500, 500], "{what}");
                    }
                    if layout == Layout::RankBlocks && threads == 2 {
                        // Ranks 0 and 1 on thread 0, 2 and 3 on thread 1.
                        assert_eq!(m.per_thread_taken, vec![1000, 1000], "{what}");
                    }
                    if layout == Layout::Steered && threads == 2 {
                        // Even seqs on thread 0, odd on thread 1, every rank.
                        assert_eq!(m.per_thread_taken, vec![1000, 1000], "{what}");
                    }
                }
                if backend == BackendKind::LockFree && layout != Layout::Steered {
                    // As switchd: each rank's RESULTs go out from the thread
                    // its DATA arrives on, whichever thread completed.
                    assert_eq!(m.per_thread_results, m.per_thread_taken, "{what}");
                }
            }
        }
    }
    assert!(built >= 6, "no backend ran");
}

#[test]
fn a_timed_run_stops_and_counts() {
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 2);
    s.until = Until::Elapsed(Duration::from_millis(100));
    let m = run(&s).unwrap();
    assert!(m.seconds >= 0.1 && m.seconds < 5.0, "{}", m.seconds);
    assert!(m.data_taken > 0 && m.results_checked > 0);
    assert_eq!(m.results, 4 * m.seqs_completed);
    assert!(m.mpps() > 0.0 && m.gbps() > 0.0);
    assert!(m.cpu_seconds > 0.0 && m.cpu_share() <= 1.05, "{m:?}");
}

/// A table-lock engine whose encoding is broken in one of two ways.
struct Broken {
    table: Mutex<JobTable>,
    now: Instant,
    /// Flip a bit of seq 122's RESULT payload (else: lose rank 2's RESULT
    /// of seq 7).
    corrupt: bool,
}

impl Backend for Broken {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let mut t = self.table.lock().unwrap();
        for (d, from) in batch.iter() {
            let v = t.handle(d, *from, false, self.now);
            out.data(v);
            while let Some(r) = t.poll_reply() {
                let seq = match r.msg {
                    ReplyMsg::Result { seq, .. } => seq,
                    _ => u32::MAX,
                };
                if !self.corrupt && seq == 7 && r.rank == 2 {
                    continue;
                }
                out.reply(&r, |buf| {
                    let e = t.encode(&r, buf)?;
                    if self.corrupt && seq == 122 {
                        buf[HEADER_LEN + 8] ^= 1;
                    }
                    Some(e)
                });
            }
        }
    }

    fn floor(&self, job: u16) -> u32 {
        table_floor(&self.table, job)
    }
}

fn run_broken(corrupt: bool) -> Result<Measured, EngineError> {
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 2);
    // A lost RESULT holds the window for good: no need to wait long.
    s.stuck_after = Duration::from_millis(500);
    run_broken_on(&s, corrupt)
}

fn run_broken_on(s: &Spec, corrupt: bool) -> Result<Measured, EngineError> {
    run_on(s, |table, now| {
        Ok(Box::new(Broken {
            table: Mutex::new(table),
            now,
            corrupt,
        }))
    })
}

#[test]
fn a_wrong_sum_fails_the_run_naming_seq_and_element() {
    match run_broken(true) {
        Err(EngineError::WrongResult { seq, what, .. }) => {
            assert_eq!(seq, 122);
            assert!(what.starts_with("element 2 "), "{what}");
        }
        other => panic!("want WrongResult, got {other:?}"),
    }
}

#[test]
fn a_lost_result_fails_the_run_naming_the_seq_it_holds() {
    match run_broken(false) {
        Err(EngineError::WindowStuck {
            seq,
            encoded,
            ranks,
            ..
        }) => assert_eq!(
            (seq, encoded, ranks),
            (7, 1, 2),
            "rank 2 is on thread 0, with rank 0"
        ),
        other => panic!("want WindowStuck, got {other:?}"),
    }
}

/// In a timed run, a lost RESULT that the run ends before noticing is
/// still caught by the count.
#[test]
fn a_lost_result_in_a_timed_run_fails_the_count() {
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 2);
    s.until = Until::Elapsed(Duration::from_millis(100));
    match run_broken_on(&s, false) {
        Err(EngineError::ResultCount { results, seqs, .. }) => {
            assert_eq!(results + 1, seqs * 4);
        }
        other => panic!("want ResultCount, got {other:?}"),
    }
}

#[test]
fn bad_parameters_are_refused_before_setup() {
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 1);
    s.window = 17;
    let e = run(&s).unwrap_err();
    assert!(e.to_string().contains("window 17"), "{e}");
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 1);
    s.frames = 8;
    assert!(matches!(run(&s), Err(EngineError::Spec(_))));
    let mut s = spec(BackendKind::TableLock, Layout::Rss, 0);
    s.threads = 0;
    assert!(matches!(run(&s), Err(EngineError::Spec(_))));
}

/// Panics in its first batch on thread "rank 1" (rss, 2 threads).
struct Panics(Mutex<JobTable>, Instant);

impl Backend for Panics {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        let mut t = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (d, from) in batch.iter() {
            assert!(from.source.port != 40001, "a backend bug");
            out.data(t.handle(d, *from, false, self.1));
            while let Some(r) = t.poll_reply() {
                out.reply(&r, |buf| t.encode(&r, buf));
            }
        }
    }

    fn floor(&self, job: u16) -> u32 {
        table_floor(&self.0, job)
    }
}

#[test]
fn a_panicking_backend_fails_the_run_instead_of_hanging_it() {
    let s = spec(BackendKind::TableLock, Layout::Rss, 2);
    let r = std::panic::catch_unwind(|| {
        run_on(&s, |table, now| {
            Ok(Box::new(Panics(Mutex::new(table), now)))
        })
    });
    assert!(r.is_err(), "the panic reaches the caller");
}

/// A table-lock engine that, after completing seq [`STALLED`], lets go of
/// the table for a while before it encodes that seq's RESULTs (as a
/// completer preempted between completion and fan-out), and records the
/// highest seq any thread fed meanwhile.
struct SlowFanOut {
    table: Mutex<JobTable>,
    now: Instant,
    highest_fed: AtomicU32,
    highest_during_stall: Arc<AtomicU32>,
}

const STALLED: u32 = 5;

impl Backend for SlowFanOut {
    fn feed(&self, batch: &Batch<'_>, out: &mut Sink) {
        for (d, from) in batch.iter() {
            let seq = Header::new_checked(d).map_or(0, |h| h.seq());
            self.highest_fed.fetch_max(seq, Ordering::SeqCst);
            let mut t = self.table.lock().unwrap();
            let v = t.handle(d, *from, false, self.now);
            out.data(v);
            if v == Verdict::Data(DataOutcome::Completed { seq: STALLED }) {
                // The fan-out is this thread's: taken out of the table's
                // queue before the stall, so no other thread encodes it.
                let fan_out: Vec<Reply> = std::iter::from_fn(|| t.poll_reply()).collect();
                drop(t);
                std::thread::sleep(Duration::from_millis(50));
                let seen = self.highest_fed.load(Ordering::SeqCst);
                self.highest_during_stall.store(seen, Ordering::SeqCst);
                t = self.table.lock().unwrap();
                for r in fan_out {
                    out.reply(&r, |buf| t.encode(&r, buf));
                }
            }
            while let Some(r) = t.poll_reply() {
                out.reply(&r, |buf| t.encode(&r, buf));
            }
        }
    }

    fn floor(&self, job: u16) -> u32 {
        table_floor(&self.table, job)
    }
}

/// The engine's floor moves when a seq completes; a worker's only when its
/// RESULT arrives. The harness must follow the worker: while a completer
/// stalls before its fan-out, no thread may feed the seq a window later,
/// whose DATA would reuse the slot being encoded. Steered (the other
/// thread holds every rank of the next seqs, one window per job) and rss
/// (each thread's window is its ranks').
#[test]
fn no_thread_runs_a_window_past_a_fan_out_not_yet_encoded() {
    for layout in [Layout::Steered, Layout::Rss] {
        let s = spec(BackendKind::TableLock, layout, 2);
        let during = Arc::new(AtomicU32::new(0));
        let m = run_on(&s, |table, now| {
            Ok(Box::new(SlowFanOut {
                table: Mutex::new(table),
                now,
                highest_fed: AtomicU32::new(0),
                highest_during_stall: during.clone(),
            }))
        })
        .unwrap();
        assert_eq!(m.seqs_completed, 500);
        let during = during.load(Ordering::SeqCst);
        let name = layout.name();
        assert!(
            during < STALLED + u32::from(s.window),
            "{name}: seq {during} was fed while seq {STALLED}'s RESULTs were not encoded \
             (window {})",
            s.window
        );
        assert!(
            during > STALLED,
            "{name}: the other thread never ran ahead: {during}"
        );
    }
}
