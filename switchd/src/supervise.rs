//! Supervision of switchd's management threads (the admin socket, the
//! metrics endpoint): a thread whose body panics or returns while switchd
//! is not stopping is logged and its body run again, after a pause that
//! doubles from [`Policy::first_backoff`] up to [`Policy::max_backoff`].
//!
//! Restarts are bounded: more than [`Policy::max_failures`] failures within
//! [`Policy::window`] mean the fault is not transient, and the supervisor
//! gives up, calling its `give_up` action. switchd's action records why and
//! stops switchd as SIGTERM does (detaching its XDP programs), and switchd
//! then exits non-zero, so that its own supervisor (systemd) restarts the
//! whole process. A management plane that stays dead while the dataplane
//! runs on is what this module exists to prevent.
//!
//! Invariants: the body owns nothing that a restart must free (each run
//! makes what it needs from what the thread holds, e.g. a listener); the
//! stop flag is checked between runs, so a stopping switchd never restarts
//! anything.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often and how fast a thread is restarted.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Failures allowed within `window`; one more gives up.
    pub max_failures: u32,
    pub window: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_failures: 5,
            window: Duration::from_secs(60),
        }
    }
}

/// What a supervised thread reports to its owner.
#[derive(Debug, Default)]
pub struct Health {
    /// Restarts so far (rendered in `/metrics`).
    pub restarts: AtomicU64,
    /// Why the supervisor gave up, once it has.
    pub failed: Mutex<Option<String>>,
}

impl Health {
    pub fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Runs `body` until `stop` is set, restarting it as [`Policy`] says when
/// it panics, returns an error, or returns while `stop` is unset. `body`
/// returns `Ok(())` when it saw `stop`. Returns after `stop`, or after
/// giving up (having called `give_up` with the reason).
pub fn supervise(
    name: &str,
    policy: Policy,
    stop: &AtomicBool,
    health: &Health,
    mut body: impl FnMut() -> Result<(), String>,
    give_up: impl FnOnce(String),
) {
    let mut failures: Vec<Instant> = Vec::new();
    let mut backoff = policy.first_backoff;
    loop {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut body));
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let why = match outcome {
            Ok(Ok(())) => "returned unexpectedly".to_string(),
            Ok(Err(e)) => format!("failed: {e}"),
            Err(panic) => format!("panicked: {}", panic_message(&*panic)),
        };
        let now = Instant::now();
        // A run that lasted a whole window was healthy: start afresh.
        if now.duration_since(started) >= policy.window {
            backoff = policy.first_backoff;
        }
        failures.retain(|t| now.duration_since(*t) < policy.window);
        failures.push(now);
        if failures.len() as u32 > policy.max_failures {
            let reason = format!(
                "the {name} thread {why}, {} times within {:?}; giving up",
                failures.len(),
                policy.window
            );
            tracing::error!("{reason}");
            *health.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
            give_up(reason);
            return;
        }
        health.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            thread = name,
            restart_in_ms = backoff.as_millis() as u64,
            "the {name} thread {why}; restarting it"
        );
        // Sleep in small steps so that a stopping switchd is not held up.
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20).min(backoff));
        }
        backoff = (backoff * 2).min(policy.max_backoff);
    }
}

/// switchd's give-up action: stop the process as SIGTERM does (switchd
/// then detaches and exits non-zero, see [`Health::failed`]).
pub fn stop_switchd(_reason: String) {
    // SAFETY: kill and getpid have no preconditions; switchd handles
    // SIGTERM by setting its stop flag (signal_hook).
    unsafe {
        libc::kill(libc::getpid(), libc::SIGTERM);
    }
}

/// A shared [`Health`] for a supervised thread.
pub fn health() -> Arc<Health> {
    Arc::new(Health::default())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn quick() -> Policy {
        Policy {
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
            max_failures: 3,
            window: Duration::from_secs(60),
        }
    }

    /// Runs `body` under [`supervise`] as thread "test" with [`quick`]'s
    /// policy; returns the thread's health.
    fn supervise_quick(
        stop: &AtomicBool,
        body: impl FnMut() -> Result<(), String>,
        give_up: impl FnOnce(String),
    ) -> Health {
        let health = Health::default();
        supervise("test", quick(), stop, &health, body, give_up);
        health
    }

    #[test]
    fn a_panicking_body_is_restarted_then_given_up_on() {
        let stop = AtomicBool::new(false);
        let runs = Cell::new(0);
        let gave_up = Cell::new(None);
        let health = supervise_quick(
            &stop,
            || {
                runs.set(runs.get() + 1);
                panic!("boom {}", runs.get());
            },
            |why| gave_up.set(Some(why)),
        );
        // 3 failures restarted, the 4th gives up.
        assert_eq!(runs.get(), 4);
        assert_eq!(health.restarts.load(Ordering::Relaxed), 3);
        let why = gave_up.take().expect("gave up");
        assert!(why.contains("test thread panicked: boom 4"), "{why}");
        assert_eq!(health.failed().as_deref(), Some(why.as_str()));
    }

    #[test]
    fn a_body_that_recovers_runs_on_until_stop() {
        let stop = AtomicBool::new(false);
        let runs = Cell::new(0);
        let health = supervise_quick(
            &stop,
            || {
                runs.set(runs.get() + 1);
                match runs.get() {
                    1 => Err("accept loop ended".into()),
                    2 => Ok(()), // returned without stop: also a failure
                    _ => {
                        stop.store(true, Ordering::SeqCst);
                        Ok(())
                    }
                }
            },
            |why| panic!("gave up: {why}"),
        );
        assert_eq!(runs.get(), 3);
        assert_eq!(health.restarts.load(Ordering::Relaxed), 2);
        assert!(health.failed().is_none());
    }
}
