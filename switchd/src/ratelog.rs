//! Rate-limited log lines for events that the network drives (malformed
//! frames, refused JOINs, drops): at most one line per reason per interval,
//! and that line says how many events of the same reason were left unlogged
//! since the previous one. A sender that floods bad frames then costs a few
//! log lines a second, not one per frame. Exact totals belong in counters
//! (`DataplaneCounters`, the job table's drop counts); these lines are only
//! for a person reading the log.
//!
//! # API
//!
//! * [`LogLimiter<N>`]: `N` reasons, indices `0..N` (e.g. `MALFORMED_KINDS`
//!   positions or `DropReason as usize`), each with its own interval clock
//!   and count of suppressed events. A fixed array: no allocation, ever.
//!   * [`LogLimiter::new`] (interval [`DEFAULT_INTERVAL`], 1 s) and
//!     [`LogLimiter::with_interval`]; both `const`.
//!   * [`LogLimiter::check`]`(reason, now)` records one event and returns
//!     `Some(suppressed)` when the caller should log it now, `suppressed`
//!     being the events of `reason` not logged since its previous line, or
//!     `None` when this one is counted and not logged. The first event of a
//!     reason is always logged.
//!   * [`LogLimiter::check_many`]`(reason, n, now)`: `n` events at once (a
//!     count read from a counter), as one `check` plus `n - 1` suppressed.
//!   * [`LogLimiter::flush`]`(now, f)` calls `f(reason, suppressed)` for every
//!     reason whose interval has passed with suppressed events still
//!     unreported, for a periodic tick, so that the last burst's count is not
//!     lost when no further event comes; the next event is then logged at
//!     once.
//!   * [`LogLimiter::pending`]`(reason)`: suppressed events not yet reported.
//! * [`rate_limited_warn!`](crate::rate_limited_warn)`(limiter, reason, now, fields.., "message")`:
//!   `check`, then `tracing::warn!` with the count as field `suppressed`.
//!
//! Time is passed in as an [`Instant`], so callers read the clock once per
//! batch and tests inject time. An index `>= N` is a caller bug: debug builds
//! panic, release builds count it under reason `N - 1` (never more lines).
//! The limiter is `&mut self`: each dataplane thread owns one, so a flood
//! logs at most one line per reason per interval per thread.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use switchd::ratelog::LogLimiter;
//!
//! const MALFORMED: usize = 0;
//! let mut lim = LogLimiter::<2>::new();
//! let t0 = Instant::now();
//! assert_eq!(lim.check(MALFORMED, t0), Some(0)); // first: logged
//! assert_eq!(lim.check(MALFORMED, t0), None); // within 1 s: counted
//! assert_eq!(lim.check(MALFORMED, t0 + Duration::from_millis(999)), None);
//! // 1 s after the last line: logged, with the 2 events not logged before.
//! assert_eq!(lim.check(MALFORMED, t0 + Duration::from_secs(1)), Some(2));
//! ```

use std::time::{Duration, Instant};

/// The interval of [`LogLimiter::new`]: one line per reason per second.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

#[doc(hidden)]
pub use tracing as __tracing;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// When the last line of this reason was logged; `None` before the first.
    last: Option<Instant>,
    /// Events of this reason not logged since `last`.
    suppressed: u64,
}

const EMPTY: Slot = Slot {
    last: None,
    suppressed: 0,
};

/// At most one log line per reason per interval, for `N` reasons; see the
/// [module documentation](self).
#[derive(Debug, Clone)]
pub struct LogLimiter<const N: usize> {
    interval: Duration,
    slots: [Slot; N],
}

impl<const N: usize> Default for LogLimiter<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> LogLimiter<N> {
    /// A limiter with the [`DEFAULT_INTERVAL`] (1 s).
    pub const fn new() -> Self {
        Self::with_interval(DEFAULT_INTERVAL)
    }

    /// A limiter that logs each reason at most once per `interval`. A zero
    /// interval logs every event (with `suppressed` always 0).
    pub const fn with_interval(interval: Duration) -> Self {
        const { assert!(N > 0, "a LogLimiter needs at least one reason") };
        LogLimiter {
            interval,
            slots: [EMPTY; N],
        }
    }

    /// The interval this limiter was made with.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn slot(&mut self, reason: usize) -> &mut Slot {
        debug_assert!(reason < N, "reason index {reason} >= {N}");
        &mut self.slots[reason.min(N - 1)]
    }

    /// Records one event of `reason` at `now`. `Some(suppressed)`: log it
    /// now, saying that `suppressed` events of this reason were not logged
    /// since its previous line. `None`: it was counted instead of logged.
    pub fn check(&mut self, reason: usize, now: Instant) -> Option<u64> {
        let interval = self.interval;
        let slot = self.slot(reason);
        let due = match slot.last {
            None => true,
            // A clock that went backwards (never for Instant) is not due.
            Some(last) => now.checked_duration_since(last).unwrap_or_default() >= interval,
        };
        if due {
            let suppressed = std::mem::take(&mut slot.suppressed);
            slot.last = Some(now);
            Some(suppressed)
        } else {
            slot.suppressed = slot.suppressed.saturating_add(1);
            None
        }
    }

    /// Records `n` events of `reason` that happened together at `now`: the
    /// first as [`LogLimiter::check`] does, the others counted as
    /// suppressed (an interval has not passed since the first). `None` when
    /// `n` is 0.
    pub fn check_many(&mut self, reason: usize, n: u64, now: Instant) -> Option<u64> {
        if n == 0 {
            return None;
        }
        let logged = self.check(reason, now);
        let slot = self.slot(reason);
        slot.suppressed = slot.suppressed.saturating_add(n - 1);
        logged
    }

    /// Suppressed events of `reason` not yet reported in a line.
    pub fn pending(&self, reason: usize) -> u64 {
        debug_assert!(reason < N, "reason index {reason} >= {N}");
        self.slots[reason.min(N - 1)].suppressed
    }

    /// For a periodic tick: calls `f(reason, suppressed)`, in index order,
    /// for every reason whose interval has passed since its last line and
    /// that has suppressed events still unreported, and resets those counts.
    /// Such a reason's next event is then logged at once (its `suppressed`
    /// is 0, those having been reported here).
    pub fn flush(&mut self, now: Instant, mut f: impl FnMut(usize, u64)) {
        for (reason, slot) in self.slots.iter_mut().enumerate() {
            let Some(last) = slot.last else { continue };
            if slot.suppressed == 0
                || now.checked_duration_since(last).unwrap_or_default() < self.interval
            {
                continue;
            }
            f(reason, std::mem::take(&mut slot.suppressed));
            // Not `Some(now)`: a summary is not an event's line, so the next
            // event still gets its own line immediately.
            slot.last = None;
        }
    }
}

/// `rate_limited_warn!(limiter, reason, now, fields.., "message", args..)`:
/// records one event of `reason` in `limiter` (a [`LogLimiter`]) at `now`
/// and, when it is due, emits `tracing::warn!(suppressed = <count>, fields..,
/// "message", args..)`. Evaluates to `true` when it logged. The fields and
/// message are only evaluated when it logs.
///
/// ```
/// use std::time::Instant;
/// use switchd::{rate_limited_warn, ratelog::LogLimiter};
///
/// let mut lim = LogLimiter::<8>::new();
/// let source = std::net::Ipv4Addr::new(198, 18, 0, 10);
/// let logged = rate_limited_warn!(lim, 3, Instant::now(), %source, kind = "short", "malformed frame");
/// assert!(logged);
/// ```
#[macro_export]
macro_rules! rate_limited_warn {
    ($limiter:expr, $reason:expr, $now:expr, $($arg:tt)+) => {
        match $limiter.check($reason, $now) {
            ::core::option::Option::Some(suppressed) => {
                $crate::ratelog::__tracing::warn!(suppressed, $($arg)+);
                true
            }
            ::core::option::Option::None => false,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[test]
    fn many_events_at_once_count_like_one_call_each() {
        let t0 = Instant::now();
        let (mut one, mut many) = (LogLimiter::<1>::new(), LogLimiter::<1>::new());
        let mut lines_one = Vec::new();
        for _ in 0..5 {
            lines_one.extend(one.check(0, t0));
        }
        assert_eq!(many.check_many(0, 5, t0), Some(0));
        assert_eq!(lines_one, [0]);
        assert_eq!(many.pending(0), one.pending(0));
        assert_eq!(many.pending(0), 4);
        assert_eq!(many.check_many(0, 0, t0), None);
        let t1 = t0 + DEFAULT_INTERVAL;
        assert_eq!(many.check_many(0, 3, t1), Some(4));
        assert_eq!(many.pending(0), 2);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn first_event_logs_then_one_line_per_interval_with_the_suppressed_count() {
        let mut lim = LogLimiter::<3>::new();
        assert_eq!(lim.interval(), Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(lim.check(1, t0), Some(0));
        for i in 1..=999 {
            assert_eq!(lim.check(1, t0 + ms(i)), None, "at {i} ms");
        }
        assert_eq!(lim.pending(1), 999);
        assert_eq!(lim.check(1, t0 + ms(1000)), Some(999));
        assert_eq!(lim.pending(1), 0);
        // The next window is measured from the line just logged.
        assert_eq!(lim.check(1, t0 + ms(1500)), None);
        assert_eq!(lim.check(1, t0 + ms(1999)), None);
        assert_eq!(lim.check(1, t0 + ms(2000)), Some(2));
        // A quiet reason logs its next event at once, with nothing suppressed.
        assert_eq!(lim.check(1, t0 + ms(60_000)), Some(0));
    }

    #[test]
    fn reasons_are_independent() {
        let mut lim = LogLimiter::<3>::new();
        let t0 = Instant::now();
        assert_eq!(lim.check(0, t0), Some(0));
        assert_eq!(lim.check(0, t0), None);
        assert_eq!(lim.check(2, t0 + ms(1)), Some(0));
        assert_eq!(lim.check(2, t0 + ms(2)), None);
        assert_eq!(lim.check(2, t0 + ms(3)), None);
        assert_eq!((lim.pending(0), lim.pending(1), lim.pending(2)), (1, 0, 2));
        assert_eq!(lim.check(0, t0 + ms(1000)), Some(1));
        assert_eq!(
            lim.check(2, t0 + ms(1000)),
            None,
            "2's window began at 1 ms"
        );
        assert_eq!(lim.check(2, t0 + ms(1001)), Some(3));
    }

    #[test]
    fn interval_is_configurable_and_zero_logs_everything() {
        let mut lim = LogLimiter::<1>::with_interval(ms(100));
        let t0 = Instant::now();
        assert_eq!(lim.check(0, t0), Some(0));
        assert_eq!(lim.check(0, t0 + ms(99)), None);
        assert_eq!(lim.check(0, t0 + ms(100)), Some(1));

        let mut all = LogLimiter::<1>::with_interval(Duration::ZERO);
        for _ in 0..5 {
            assert_eq!(all.check(0, t0), Some(0));
        }
    }

    #[test]
    fn a_clock_going_backwards_suppresses_rather_than_floods() {
        let mut lim = LogLimiter::<1>::new();
        let t0 = Instant::now() + Duration::from_secs(10);
        assert_eq!(lim.check(0, t0), Some(0));
        assert_eq!(lim.check(0, t0 - ms(5000)), None);
        assert_eq!(lim.check(0, t0 + ms(1000)), Some(1));
    }

    #[test]
    fn flush_reports_due_counts_once_and_the_next_event_logs_at_once() {
        let mut lim = LogLimiter::<4>::new();
        let t0 = Instant::now();
        lim.check(0, t0);
        lim.check(0, t0 + ms(10));
        lim.check(0, t0 + ms(20));
        lim.check(2, t0 + ms(500));
        lim.check(2, t0 + ms(600));
        lim.check(3, t0); // logged, nothing suppressed after it

        let mut seen = Vec::new();
        lim.flush(t0 + ms(999), |r, n| seen.push((r, n)));
        assert!(seen.is_empty(), "nothing is due yet: {seen:?}");
        lim.flush(t0 + ms(1000), |r, n| seen.push((r, n)));
        assert_eq!(seen, [(0, 2)], "2's window ends at 1500 ms");
        lim.flush(t0 + ms(1500), |r, n| seen.push((r, n)));
        assert_eq!(seen, [(0, 2), (2, 1)]);
        lim.flush(t0 + ms(5000), |r, n| seen.push((r, n)));
        assert_eq!(seen.len(), 2, "each count is reported once");
        assert_eq!(lim.pending(0), 0);
        assert_eq!(lim.check(0, t0 + ms(1001)), Some(0));
    }

    #[test]
    fn counts_saturate() {
        let mut lim = LogLimiter::<1>::new();
        let t0 = Instant::now();
        lim.check(0, t0);
        lim.slots[0].suppressed = u64::MAX - 1;
        assert_eq!(lim.check(0, t0), None);
        assert_eq!(lim.check(0, t0), None);
        assert_eq!(lim.pending(0), u64::MAX);
    }

    #[test]
    #[should_panic(expected = "reason index 2 >= 2")]
    #[cfg(debug_assertions)]
    fn an_out_of_range_reason_panics_in_debug_builds() {
        LogLimiter::<2>::new().check(2, Instant::now());
    }

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    #[test]
    fn the_macro_logs_due_events_with_the_suppressed_field() {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        let mut lim = LogLimiter::<2>::new();
        let t0 = Instant::now();
        let mut evaluated = 0;
        let logged: Vec<bool> = tracing::subscriber::with_default(subscriber, || {
            (0..5u64)
                .map(|i| {
                    let now = t0 + ms(if i < 4 { i } else { 1000 });
                    rate_limited_warn!(
                        lim,
                        1,
                        now,
                        frame = {
                            evaluated += 1;
                            i
                        },
                        "malformed frame"
                    )
                })
                .collect()
        });
        assert_eq!(logged, [true, false, false, false, true]);
        assert_eq!(
            evaluated, 2,
            "fields of suppressed events are not evaluated"
        );
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("WARN"), "{text}");
        assert!(
            lines[0].contains("malformed frame suppressed=0 frame=0"),
            "{text}"
        );
        assert!(
            lines[1].contains("malformed frame suppressed=3 frame=4"),
            "{text}"
        );
    }
}
