//! Smoothed RTT and retransmission timeout (RFC 6298) and the path's
//! minimum RTT: [`RttEstimator`].
//!
//! Invariants: the RTO stays within `min_rto..=max_rto`; the minimum RTT
//! is the smallest sample of the last one to two [`MIN_RTT_PERIOD`]s, so a
//! lasting change of path is learnt. Karn's rule (no samples from resent
//! chunks) is the caller's ([`crate::member::collective`]): this file takes
//! the samples it is given. Time is passed in.

use std::time::{Duration, Instant};

use crate::member::config::TransportConfig;

/// The minimum RTT is the smallest sample of the last one to two of these
/// periods, so a lasting change of path is learnt.
pub const MIN_RTT_PERIOD: Duration = Duration::from_secs(10);

/// Smoothed RTT and retransmission timeout (RFC 6298), and the path's
/// minimum RTT over the last one to two [`MIN_RTT_PERIOD`]s.
#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    min_rto: Duration,
    max_rto: Duration,
    /// Smallest sample of the current period and of the one before.
    min_now: Option<Duration>,
    min_before: Option<Duration>,
    period_start: Option<Instant>,
}

impl RttEstimator {
    pub fn new(cfg: &TransportConfig) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: cfg.initial_rto,
            min_rto: cfg.min_rto,
            max_rto: cfg.max_rto,
            min_now: None,
            min_before: None,
            period_start: None,
        }
    }

    /// [`RttEstimator::on_sample`], also counting the sample, taken at
    /// `now`, towards the minimum RTT.
    pub fn on_sample_at(&mut self, rtt: Duration, now: Instant) {
        let start = *self.period_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= MIN_RTT_PERIOD {
            self.min_before = self.min_now;
            self.min_now = None;
            self.period_start = Some(now);
        }
        self.min_now = Some(self.min_now.map_or(rtt, |m| m.min(rtt)));
        self.on_sample(rtt);
    }

    /// The smallest sample of the last one to two [`MIN_RTT_PERIOD`]s.
    pub fn min_rtt(&self) -> Option<Duration> {
        match (self.min_now, self.min_before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn on_sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(rtt);
        self.rto = (srtt + self.rttvar * 4).clamp(self.min_rto, self.max_rto);
    }

    pub fn rto(&self) -> Duration {
        self.rto
    }

    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_rtt_is_the_smallest_sample_of_the_last_one_to_two_periods() {
        let cfg = TransportConfig::default();
        let mut rtt = RttEstimator::new(&cfg);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(rtt.min_rtt(), None);
        rtt.on_sample_at(ms(4), t0);
        rtt.on_sample_at(ms(1), t0 + ms(10));
        rtt.on_sample_at(ms(6), t0 + ms(20));
        assert_eq!(rtt.min_rtt(), Some(ms(1)));
        // One period on, the old minimum still counts.
        rtt.on_sample_at(ms(8), t0 + MIN_RTT_PERIOD);
        assert_eq!(rtt.min_rtt(), Some(ms(1)));
        // Two periods on, a path that got slower is learnt.
        rtt.on_sample_at(ms(9), t0 + MIN_RTT_PERIOD * 2);
        assert_eq!(rtt.min_rtt(), Some(ms(8)));
        rtt.on_sample_at(ms(7), t0 + MIN_RTT_PERIOD * 2 + ms(1));
        assert_eq!(rtt.min_rtt(), Some(ms(7)));
    }
}
