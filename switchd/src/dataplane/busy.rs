//! A dataplane thread's busy share: the part of wall time it was awake
//! (receiving, sending, or spinning on empty rings before it sleeps) rather
//! than asleep in poll(2), over the last [`BUSY_WINDOW`].
//!
//! Owns: [`BusyShare`], one per thread, kept by that thread. Invariant: it
//! costs two clock reads per sleep and nothing per packet or per busy
//! round; a thread that never sleeps is busy 1.0. A sleep is counted in
//! the window in which it ends (a window is far longer than one sleep).

use std::time::{Duration, Instant};

/// The span one busy share is measured over.
pub const BUSY_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct BusyShare {
    window_start: Instant,
    asleep: Duration,
    /// The share of the last whole window (None before the first ends).
    last: Option<f64>,
}

impl BusyShare {
    pub fn new(now: Instant) -> BusyShare {
        BusyShare {
            window_start: now,
            asleep: Duration::ZERO,
            last: None,
        }
    }

    /// The thread slept for `d`.
    #[inline]
    pub fn slept(&mut self, d: Duration) {
        self.asleep += d;
    }

    /// The share of the last whole window, closing the current one if it
    /// is [`BUSY_WINDOW`] old; before the first window ends, the share so
    /// far. In `0.0..=1.0`.
    pub fn share(&mut self, now: Instant) -> f64 {
        let span = now.saturating_duration_since(self.window_start);
        let of_span = |asleep: Duration| {
            if span.is_zero() {
                0.0
            } else {
                (1.0 - asleep.as_secs_f64() / span.as_secs_f64()).clamp(0.0, 1.0)
            }
        };
        if span >= BUSY_WINDOW {
            self.last = Some(of_span(self.asleep));
            self.window_start = now;
            self.asleep = Duration::ZERO;
        }
        self.last.unwrap_or_else(|| of_span(self.asleep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn share_is_the_awake_part_of_the_last_whole_window() {
        let t0 = Instant::now();
        let mut b = BusyShare::new(t0);
        // 250 ms asleep in the first second: busy 0.75, reported once the
        // second is over and until the next one is.
        b.slept(ms(100));
        b.slept(ms(150));
        assert!((b.share(t0 + ms(1000)) - 0.75).abs() < 1e-9);
        b.slept(ms(900));
        assert!((b.share(t0 + ms(1500)) - 0.75).abs() < 1e-9);
        // The second window: 900 ms asleep of 1000.
        assert!((b.share(t0 + ms(2000)) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn before_the_first_window_ends_it_is_the_share_so_far() {
        let t0 = Instant::now();
        let mut b = BusyShare::new(t0);
        assert_eq!(b.share(t0), 0.0);
        b.slept(ms(100));
        assert!((b.share(t0 + ms(400)) - 0.75).abs() < 1e-9);
    }

    #[test]
    fn a_thread_that_never_sleeps_is_busy_one_and_one_asleep_throughout_zero() {
        let t0 = Instant::now();
        let mut spinning = BusyShare::new(t0);
        assert_eq!(spinning.share(t0 + ms(1000)), 1.0);
        let mut idle = BusyShare::new(t0);
        // A sleep counted past the window's end (it began in the last
        // window) does not make the share negative.
        idle.slept(ms(1010));
        assert_eq!(idle.share(t0 + ms(1000)), 0.0);
    }
}
