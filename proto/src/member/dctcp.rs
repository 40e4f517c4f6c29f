//! DCTCP-style congestion window on ECE marks and on queueing delay:
//! [`Dctcp`] (docs/PROTOCOL.md, "Congestion control").
//!
//! Invariants: 1 ≤ window ≤ ceiling (the smaller of S and the switch's
//! advertised window, which [`crate::member::Member`] sets); with
//! congestion control off the window is the ceiling; delay alone never
//! takes the window below [`DELAY_WINDOW_FLOOR`], ECE can.

use std::time::Duration;

use crate::member::config::TransportConfig;

/// Delay alone never takes the window below this many chunks: RTT noise of
/// a busy host must not starve a job; ECE still can.
pub const DELAY_WINDOW_FLOOR: f64 = 4.0;

/// DCTCP-style window (docs/PROTOCOL.md, congestion control): per window of
/// RESULTs, α ← (1−g)·α + g·F; W ← W·(1−α/2) if F > 0, else W + 1;
/// 1 ≤ W ≤ ceiling. Before the first mark the window doubles per round
/// (slow start) from a small initial window: docs/PROTOCOL.md does not say where
/// W starts, and starting at S bursts a whole pool into the network at once.
#[derive(Debug, Clone, Copy)]
pub struct Dctcp {
    window: f64,
    alpha: f64,
    gain: f64,
    ceiling: u16,
    results_in_round: u32,
    marked_in_round: u32,
    enabled: bool,
    delay_target: Option<Duration>,
    /// Doubling per round until the first ECE, as TCP's slow start.
    slow_start: bool,
}

impl Dctcp {
    pub fn new(cfg: &TransportConfig, ceiling: u16) -> Dctcp {
        let ceiling = ceiling.max(1);
        Dctcp {
            window: cfg.initial_window.clamp(1, ceiling) as f64,
            alpha: 0.0,
            gain: cfg.dctcp_gain,
            ceiling,
            results_in_round: 0,
            marked_in_round: 0,
            enabled: cfg.congestion_control,
            delay_target: cfg.delay_target,
            slow_start: true,
        }
    }

    /// Starts afresh under `ceiling` (a first JOIN_ACK told S and the
    /// advertised window): the window opens at the initial window, which
    /// defaults to the whole ceiling, and α returns to 0.
    pub fn reset(&mut self, cfg: &TransportConfig, ceiling: u16) {
        *self = Dctcp::new(cfg, ceiling);
    }

    /// Sets the ceiling (the smaller of S and the switch's advertised window).
    pub fn set_ceiling(&mut self, ceiling: u16) {
        self.ceiling = ceiling.max(1);
        self.window = self.window.min(self.ceiling as f64);
        if !self.enabled {
            self.window = self.ceiling as f64;
        }
    }

    pub fn on_result(&mut self, ece: bool) {
        self.on_result_delay(ece, None, None);
    }

    /// A RESULT with ECE or not, and the RTT sample it gave (none for a
    /// resent chunk) against the path's minimum: a sample more than the
    /// delay target above the minimum counts as a mark while the window is
    /// above [`DELAY_WINDOW_FLOOR`].
    pub fn on_result_delay(
        &mut self,
        ece: bool,
        sample: Option<Duration>,
        min_rtt: Option<Duration>,
    ) {
        if !self.enabled {
            return;
        }
        self.results_in_round += 1;
        let delayed = match (self.delay_target, sample, min_rtt) {
            (Some(target), Some(rtt), Some(min)) => {
                rtt > min + target && self.window > DELAY_WINDOW_FLOOR
            }
            _ => false,
        };
        if ece || delayed {
            self.marked_in_round += 1;
        }
        if self.results_in_round as f64 >= self.window.floor().max(1.0) {
            let f = self.marked_in_round as f64 / self.results_in_round as f64;
            self.alpha = (1.0 - self.gain) * self.alpha + self.gain * f;
            if f > 0.0 {
                self.slow_start = false;
                self.window *= 1.0 - self.alpha / 2.0;
            } else if self.slow_start {
                self.window *= 2.0;
            } else {
                self.window += 1.0;
            }
            self.window = self.window.clamp(1.0, self.ceiling as f64);
            self.results_in_round = 0;
            self.marked_in_round = 0;
        }
    }

    pub fn window(&self) -> u16 {
        self.window as u16
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::config::DEFAULT_DELAY_TARGET;

    #[test]
    fn dctcp_grows_without_marks_and_shrinks_with_them() {
        let cfg = TransportConfig {
            initial_window: 4,
            ..TransportConfig::default()
        };
        let mut cc = Dctcp::new(&cfg, 64);
        for _ in 0..4 {
            cc.on_result(false);
        }
        // Slow start doubled it.
        assert_eq!(cc.window(), 8);
        for _ in 0..8 {
            cc.on_result(true);
        }
        // α = g·1 = 1/16; W = 8·(1 − 1/32) = 7.75; slow start is over.
        assert!((cc.alpha() - 1.0 / 16.0).abs() < 1e-12);
        assert_eq!(cc.window(), 7);
        for _ in 0..7 {
            cc.on_result(false);
        }
        // Additive increase now: 7.75 + 1.
        assert_eq!(cc.window(), 8);
        let mut floor = Dctcp::new(&cfg, 64);
        for _ in 0..10_000 {
            floor.on_result(true);
        }
        assert_eq!(floor.window(), 1);
        let mut ceil = Dctcp::new(&cfg, 6);
        for _ in 0..10_000 {
            ceil.on_result(false);
        }
        assert_eq!(ceil.window(), 6);
    }

    #[test]
    fn delay_above_the_target_counts_as_a_mark_down_to_the_floor() {
        let cfg = TransportConfig {
            initial_window: 64,
            ..TransportConfig::default()
        };
        let min = Some(Duration::from_micros(100));
        let queued = Some(DEFAULT_DELAY_TARGET + Duration::from_millis(3));
        let near = Some(DEFAULT_DELAY_TARGET);
        let mut cc = Dctcp::new(&cfg, 64);
        for _ in 0..64 {
            cc.on_result_delay(false, queued, min);
        }
        assert!(
            cc.window() < 64,
            "a round of queued samples shrinks the window"
        );
        for _ in 0..10_000 {
            cc.on_result_delay(false, queued, min);
        }
        assert_eq!(
            cc.window(),
            DELAY_WINDOW_FLOOR as u16,
            "delay alone stops at the floor"
        );
        // ECE still takes it lower.
        for _ in 0..10_000 {
            cc.on_result_delay(true, queued, min);
        }
        assert_eq!(cc.window(), 1);
        // Within the target, or without a sample (a resent chunk): no mark.
        let mut calm = Dctcp::new(&cfg, 64);
        for i in 0..1_000 {
            calm.on_result_delay(false, if i % 2 == 0 { near } else { None }, min);
        }
        assert_eq!(calm.window(), 64);
        assert_eq!(calm.alpha(), 0.0);
        // Off: queued samples change nothing.
        let off = TransportConfig {
            delay_target: None,
            ..cfg
        };
        let mut ecn_only = Dctcp::new(&off, 64);
        for _ in 0..1_000 {
            ecn_only.on_result_delay(false, queued, min);
        }
        assert_eq!(ecn_only.window(), 64);
    }
}
