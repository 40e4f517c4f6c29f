//! Test-only fault injection: makes dataplane thread 0 stop making progress
//! after a number of received frames, so that an end-to-end test can check
//! the watchdog ([`crate::watchdog`]).
//!
//! Owns: reading the plan from the environment, and the stall itself.
//!
//! Invariants: it exists only with the cargo feature `fault-injection`,
//! which is off by default: without it [`plan`] is `None` whatever the
//! environment says, and the dataplane's hook calls are compiled out (they
//! are `#[cfg(feature = "fault-injection")]`), so a release build carries
//! no branch and reads no variable.

/// Frames thread 0 receives before it stops making progress.
pub const STALL_AFTER_ENV: &str = "AGGSWITCH_FAULT_STALL_AFTER_PACKETS";
/// Set to 1: the stop happens while the thread holds the job table (so the
/// control thread blocks too); otherwise after the batch, with it released.
pub const HOLDING_TABLE_ENV: &str = "AGGSWITCH_FAULT_STALL_HOLDING_TABLE";

/// For thread `thread`: after how many received frames it stops, and
/// whether it stops holding the table. `env` looks a variable up.
#[cfg(feature = "fault-injection")]
pub fn plan(thread: usize, env: impl Fn(&str) -> Option<String>) -> Option<(u64, bool)> {
    if thread != 0 {
        return None;
    }
    let after = env(STALL_AFTER_ENV)?.trim().parse().ok()?;
    Some((
        after,
        env(HOLDING_TABLE_ENV).is_some_and(|v| v.trim() == "1"),
    ))
}

/// Without the feature there is no fault to inject.
#[cfg(not(feature = "fault-injection"))]
pub fn plan(_thread: usize, _env: impl Fn(&str) -> Option<String>) -> Option<(u64, bool)> {
    None
}

/// A thread's plan, checked after each frame and after each round.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Default)]
pub struct Plan(Option<(u64, bool)>);

#[cfg(feature = "fault-injection")]
impl Plan {
    pub fn for_thread(thread: usize, env: impl Fn(&str) -> Option<String>) -> Plan {
        let p = plan(thread, env);
        if let Some((after, holding)) = p {
            tracing::warn!(
                thread,
                after,
                holding_table = holding,
                "FAULT INJECTION: this dataplane thread will stop after {after} received frames \
                 (a test build: cargo feature fault-injection)"
            );
        }
        Plan(p)
    }

    /// Whether the thread stops now, inside the batch, holding the table:
    /// the caller then takes the table's lock (the data path may not have
    /// needed it) before [`Plan::after_frame`] stops the thread.
    pub fn stops_holding_table(&self, rx_frames: u64) -> bool {
        self.0
            .is_some_and(|(after, holding)| holding && rx_frames >= after)
    }

    /// Stops this thread for good once `rx_frames` reached the plan's
    /// count, at the place the plan names (`in_table`: inside the batch).
    pub fn after_frame(&self, rx_frames: u64, in_table: bool) {
        if let Some((after, holding)) = self.0 {
            if holding == in_table && rx_frames >= after {
                tracing::warn!(rx_frames, "FAULT INJECTION: dataplane thread stops now");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            STALL_AFTER_ENV => Some("100".into()),
            HOLDING_TABLE_ENV => Some("1".into()),
            _ => None,
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    #[test]
    fn without_the_feature_the_environment_injects_nothing() {
        assert_eq!(plan(0, env), None);
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    fn with_the_feature_thread_0_takes_the_plan_and_others_do_not() {
        assert_eq!(plan(0, env), Some((100, true)));
        assert_eq!(plan(1, env), None);
        assert_eq!(plan(0, |_| None), None);
        assert_eq!(
            plan(0, |k| env(k).filter(|_| k == STALL_AFTER_ENV)),
            Some((100, false))
        );
    }
}
