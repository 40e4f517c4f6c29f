//! What the endpoint serves and how much it takes: [`Content`] (which
//! series) and [`Limits`] (request head size, connections, timeouts,
//! snapshot reuse), each with the default switchd uses.
//!
//! Invariant: plain values, read once when the server starts; the
//! defaults are docs/PROTOCOL.md's "Limits".

use std::time::Duration;

/// Which series `/metrics` serves; [`Content::default`] serves all.
#[derive(Debug, Clone, Copy)]
pub struct Content {
    /// The per-job series: `aggswitch_job_*` and a leaf's per-spine
    /// `aggswitch_spine_*` (labelled by job). `[switch] metrics_per_job`;
    /// false leaves them out, keeping the switch-wide, port, socket and
    /// thread series.
    pub per_job: bool,
}

impl Default for Content {
    fn default() -> Content {
        Content { per_job: true }
    }
}

/// The endpoint's limits; [`Limits::default`] is what switchd uses.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request head (request line and headers) read.
    pub max_head_bytes: usize,
    /// Connections open at once; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// Time a connection has to send a complete request head.
    pub header_timeout: Duration,
    /// Longest a connection stays open, however busy.
    pub connection_deadline: Duration,
    /// Pause after a failed `accept`.
    pub accept_backoff: Duration,
    /// Time the control thread has to answer a snapshot request.
    pub snapshot_timeout: Duration,
    /// A rendered snapshot younger than this answers further requests
    /// (the dataplane publishes its counters every 20 ms anyway), so a
    /// flood of requests costs the control thread nothing.
    pub snapshot_reuse: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head_bytes: 16 * 1024,
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            connection_deadline: Duration::from_secs(30),
            accept_backoff: Duration::from_millis(100),
            snapshot_timeout: Duration::from_secs(5),
            snapshot_reuse: Duration::from_millis(100),
        }
    }
}
