//! The endpoint's own counters ([`EndpointCounters`], rendered as
//! `aggswitch_metrics_<name>_total`), declared once as a counter schema.
//!
//! Invariant: a counter added here shows in `/metrics` with its help text
//! and nothing else to change.

proto::counter_schema! {
    /// The metrics endpoint's own counters (`aggswitch_metrics_<name>_total`).
    pub struct EndpointCounters {
        /// Connections accepted and served.
        connections_accepted,
        /// Connections closed as soon as accepted because the connection limit was reached.
        connections_rejected,
        /// Connections closed because a request head did not arrive within the header timeout, or the connection outlived its deadline.
        connections_timed_out,
        /// Connections closed because a request head exceeded the size limit (answered 431).
        heads_too_large,
        /// Failed accept calls (EMFILE, ENFILE, ENOMEM...), each followed by a pause.
        accept_errors,
        /// Requests answered with the metrics.
        requests_served,
        /// Requests answered 404 or 405 (another path or method than GET /metrics).
        requests_refused,
        /// Restarts of the metrics server after it panicked or stopped unexpectedly.
        restarts,
    }
}
