//! Prometheus text-format metrics at `http://metrics_listen/metrics`.
//!
//! Owns: the metrics thread. It runs hyper's HTTP/1 server on a
//! current-thread tokio runtime, so every connection is a task on that one
//! thread (no thread per connection), and counters of its own
//! ([`EndpointCounters`]). It reads the switch's counters the way
//! `switchctl stats` does, over the control channel
//! ([`AdminCall::Snapshot`](crate::admin::AdminCall::Snapshot)), typed: [`render`] walks the counter schemas
//! ([`proto::switch::CounterSchema`]) and the fields of
//! [`SwitchStats`](crate::stats::SwitchStats), never a map looked up by name, so a counter renamed in a
//! schema is rendered under its new name and a renamed field fails to
//! compile. The dataplane's counters are plain integers owned by its
//! threads, so nothing on the hot path locks or shares a cache line.
//!
//! Limits ([`Limits`], defaults in docs/PROTOCOL.md "Limits"): a request
//! head larger than `max_head_bytes` gets 431 and the connection is closed;
//! at most `max_connections` connections are open, and one beyond is closed
//! at once and counted; a request head must arrive within
//! `header_timeout`; a connection (keep-alive included) lives at most
//! `connection_deadline`. An `accept` error (EMFILE, ENFILE, ENOMEM...)
//! never ends the thread: it is counted, logged at most once a second, and
//! accepting resumes after `accept_backoff`. Only `GET`/`HEAD /metrics` is
//! served: another path is a 404, another method a 405.
//!
//! Content ([`Content`]): with `[switch] metrics_per_job = false` the
//! per-job series (`aggswitch_job_*`, a leaf's `aggswitch_spine_*`) are
//! left out. Where it listens: [`crate::config::MetricsListen`] (loopback
//! by default), never where the workers' network reaches unless the
//! operator allows it ([`crate::exposure`]).
//!
//! Supervision ([`crate::supervise`]): a panic or an unexpected return of
//! the server is logged and the server restarted on the same listener, with
//! backoff; after too many failures switchd stops and exits non-zero (its
//! supervisor restarts it) rather than run on with `/metrics` dead.
//!
//! Files, bottom up (each imports only those before it): `limits`
//! ([`Content`], [`Limits`]), `counters` ([`EndpointCounters`]),
//! `text_format` (the Prometheus text format's pieces), `render`
//! ([`render`] a snapshot), `endpoint` (what connection tasks share), `http`
//! (one request), `server` ([`serve`], [`MetricsServer`], the accept loop).
//! Everything public is re-exported here as `crate::metrics::X`.

mod counters;
mod endpoint;
mod http;
mod limits;
mod render;
mod server;
#[cfg(test)]
mod tests;
mod text_format;

pub use counters::EndpointCounters;
pub use limits::{Content, Limits};
pub use render::render;
pub use server::{serve, serve_with, MetricsError, MetricsServer};
