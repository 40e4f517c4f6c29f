//! The tunables of a worker's transport ([`TransportConfig`]) and their
//! defaults: the resend timer's bounds, DCTCP's gain and first window, the
//! delay target. Plain data; every part of [`crate::member`] reads it.

use std::time::Duration;

/// Tunables of a worker's transport.
#[derive(Debug, Clone, Copy)]
pub struct TransportConfig {
    /// RTO before any RTT sample.
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    /// Each resend of a chunk doubles its timeout, up to this many times.
    pub max_backoff_doublings: u32,
    /// DCTCP gain g.
    pub dctcp_gain: f64,
    /// Window at the start (clamped to 1..=S); it doubles every window of
    /// unmarked RESULTs (slow start) until the first ECE.
    pub initial_window: u16,
    /// React to ECE (off: the window stays at the advertised maximum).
    pub congestion_control: bool,
    /// A RESULT whose RTT sample exceeds the path's minimum RTT by more
    /// than this counts as marked, as ECE does, while the window is above
    /// [`DELAY_WINDOW_FLOOR`](crate::member::dctcp::DELAY_WINDOW_FLOOR);
    /// `None`: ECE alone. A queue at a bottleneck that marks nothing
    /// (tail-drop shapers, most NICs) otherwise grows until it drops, and
    /// the resends of a full window follow.
    pub delay_target: Option<Duration>,
    /// Testing only: send with this window whatever the switch advertises,
    /// to exercise the switch's window enforcement.
    pub window_override: Option<u16>,
    /// The straggler hold (docs/PROTOCOL.md, "Reliability"): a timeout of
    /// the oldest chunk probes the switch (a HEARTBEAT about its seq), and
    /// while the answer says our DATA is in and another rank's is missing,
    /// timeouts resend nothing. Off: timeouts resend as before (a
    /// simulation's baseline).
    pub straggler_hold: bool,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            initial_rto: Duration::from_millis(50),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_secs(1),
            max_backoff_doublings: 6,
            dctcp_gain: 1.0 / 16.0,
            initial_window: 16,
            congestion_control: true,
            delay_target: Some(DEFAULT_DELAY_TARGET),
            window_override: None,
            straggler_hold: true,
        }
    }
}

/// Default [`TransportConfig::delay_target`]: a few scheduling hiccups of a
/// loaded host above the minimum, yet far below a shaper's queue.
pub const DEFAULT_DELAY_TARGET: Duration = Duration::from_millis(2);
