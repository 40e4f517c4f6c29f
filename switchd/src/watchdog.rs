//! The dataplane watchdog: notices a dataplane thread that stopped making
//! progress while it had work, and ends switchd so that its supervisor
//! (systemd `Restart=on-failure`) restarts it, rather than leave a switch
//! that answers its admin socket but moves no packet.
//!
//! Owns: [`Watchdog`] (the decision, fed samples and time, no I/O) and the
//! watchdog thread ([`spawn`]), which every [`CHECK_EVERY`] samples the
//! dataplane threads' [`Heartbeat`]s ([`crate::dataplane::heartbeat`]: one
//! per thread, its progress written by that thread only, its stall count
//! by the watchdog thread).
//!
//! Invariants: a dataplane thread writes its heartbeat once per loop
//! iteration and once per receive batch (Relaxed stores, never per packet);
//! the watchdog thread takes no lock a dataplane thread may hold (only
//! these atomics), so a thread stuck holding the job table cannot stop it.
//! An idle thread is never a stall: its loop wakes from poll(2) at least
//! every few milliseconds and beats, and it reports no pending work.
//! switchd leaves through [`exit_for_restart`] only, once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dataplane::heartbeat::Heartbeat;
use crate::dataplane::Shared;

/// How often the watchdog looks at the heartbeats.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// After a stall, how long main may take to write the final counters
/// before the watchdog thread ends the process itself (main waits on the
/// job table, which the stuck thread may hold).
pub const EXIT_GRACE: Duration = Duration::from_secs(2);
/// The exit status after a stall (EX_SOFTWARE): non-zero, so that a
/// supervisor restarts switchd.
pub const STALL_EXIT_CODE: i32 = 70;

/// A thread found stuck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub thread: usize,
    /// Since its last progress.
    pub stuck_for: Duration,
}

/// The decision: a thread whose progress has not moved for `limit` while
/// it reports work in hand is stalled.
#[derive(Debug)]
pub struct Watchdog {
    limit: Duration,
    /// Per thread: progress last seen, and when it last moved.
    seen: Vec<(u64, Instant)>,
}

impl Watchdog {
    pub fn new(threads: usize, limit: Duration, now: Instant) -> Watchdog {
        Watchdog {
            limit,
            seen: vec![(0, now); threads],
        }
    }

    /// Feeds one sample per thread (in thread order); returns the first
    /// stalled thread, if any. A zero limit disables the watchdog.
    pub fn check(&mut self, now: Instant, samples: &[(u64, bool)]) -> Option<Stall> {
        let mut stalled = None;
        for (i, (&(progress, busy), seen)) in samples.iter().zip(&mut self.seen).enumerate() {
            if progress != seen.0 {
                *seen = (progress, now);
                continue;
            }
            let stuck_for = now.saturating_duration_since(seen.1);
            if !self.limit.is_zero() && busy && stuck_for >= self.limit && stalled.is_none() {
                stalled = Some(Stall {
                    thread: i,
                    stuck_for,
                });
            }
        }
        stalled
    }
}

/// What the watchdog thread needs to name a thread.
pub struct WatchdogConfig {
    pub limit: Duration,
    /// Per dataplane thread: the sockets it serves ("PORT/QUEUE", …).
    pub sockets: Vec<Vec<String>>,
}

/// Starts the watchdog thread (none when the limit is zero); it runs until
/// the process ends. On a stall it logs the thread and its sockets, counts
/// it, asks everything to stop, and if main has not ended the process
/// within [`EXIT_GRACE`], ends it.
pub fn spawn(
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Option<std::thread::JoinHandle<()>>> {
    if cfg.limit.is_zero() {
        tracing::info!("dataplane watchdog off ([switch] watchdog_secs = 0)");
        return Ok(None);
    }
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let mut dog = Watchdog::new(cfg.sockets.len(), cfg.limit, Instant::now());
            let mut samples = Vec::with_capacity(cfg.sockets.len());
            // It keeps watching while switchd stops (a thread stuck then
            // would hang the shutdown); a thread that returned is idle.
            loop {
                std::thread::sleep(CHECK_EVERY);
                samples.clear();
                samples.extend(shared.heartbeats().iter().map(Heartbeat::sample));
                let Some(s) = dog.check(Instant::now(), &samples) else {
                    continue;
                };
                let sockets = cfg
                    .sockets
                    .get(s.thread)
                    .map_or(String::new(), |v| v.join(", "));
                tracing::error!(
                    thread = s.thread,
                    sockets = %sockets,
                    stuck_secs = s.stuck_for.as_secs_f64(),
                    "dataplane thread {} (port/queue {sockets}) made no progress for {:.1} s \
                     while its rings held work: it is stuck; stopping switchd",
                    s.thread,
                    s.stuck_for.as_secs_f64()
                );
                shared.count_stall(s.thread);
                stop.store(true, Ordering::SeqCst);
                std::thread::sleep(EXIT_GRACE);
                tracing::error!(
                    "the final counters could not be written within {:.0} s (the stuck thread \
                     may hold the job table)",
                    EXIT_GRACE.as_secs_f64()
                );
                exit_for_restart();
            }
        })
        .map(Some)
}

static EXITING: AtomicBool = AtomicBool::new(false);

/// Ends switchd with [`STALL_EXIT_CODE`] after a stall, saying that its
/// supervisor should restart it. The kernel releases the XDP links and
/// AF_XDP sockets with the process. Called by main (after the final
/// counters) or by the watchdog thread (when main is stuck); the second
/// caller waits for the first's exit.
pub fn exit_for_restart() -> ! {
    if EXITING.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    tracing::error!(
        "switchd exits with status {STALL_EXIT_CODE} after a dataplane stall; its supervisor \
         should restart it (systemd: Restart=on-failure)"
    );
    std::process::exit(STALL_EXIT_CODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_busy_thread_without_progress_is_a_stall_after_the_limit_not_before() {
        let t0 = Instant::now();
        let mut d = Watchdog::new(2, LIMIT, t0);
        // Thread 1 keeps moving; thread 0 freezes at 7 with work in hand.
        assert_eq!(d.check(at(t0, 0), &[(7, true), (1, false)]), None);
        assert_eq!(d.check(at(t0, 4_900), &[(7, true), (50, false)]), None);
        assert_eq!(
            d.check(at(t0, 5_000), &[(7, true), (90, true)]),
            Some(Stall {
                thread: 0,
                stuck_for: LIMIT
            })
        );
    }

    #[test]
    fn an_idle_thread_without_progress_is_not_a_stall() {
        let t0 = Instant::now();
        let mut d = Watchdog::new(1, LIMIT, t0);
        d.check(t0, &[(3, false)]);
        assert_eq!(d.check(at(t0, 600_000), &[(3, false)]), None);
    }

    #[test]
    fn a_busy_thread_that_progresses_is_never_a_stall() {
        let t0 = Instant::now();
        let mut d = Watchdog::new(1, LIMIT, t0);
        for k in 0..100u64 {
            assert_eq!(d.check(at(t0, k * 500), &[(k, true)]), None);
        }
    }

    #[test]
    fn progress_restarts_the_clock() {
        let t0 = Instant::now();
        let mut d = Watchdog::new(1, LIMIT, t0);
        d.check(t0, &[(1, true)]);
        d.check(at(t0, 4_000), &[(2, true)]);
        assert_eq!(
            d.check(at(t0, 8_000), &[(2, true)]),
            None,
            "4 s since it moved"
        );
        assert!(d.check(at(t0, 9_000), &[(2, true)]).is_some());
    }

    #[test]
    fn a_zero_limit_disables_it() {
        let t0 = Instant::now();
        let mut d = Watchdog::new(1, Duration::ZERO, t0);
        d.check(t0, &[(1, true)]);
        assert_eq!(d.check(at(t0, 3_600_000), &[(1, true)]), None);
    }
}
