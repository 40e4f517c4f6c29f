//! Prometheus text-format metrics at `http://metrics_listen/metrics`.
//!
//! Owns: the metrics thread. It runs hyper's HTTP/1 server on a
//! current-thread tokio runtime, so every connection is a task on that one
//! thread (no thread per connection), and counters of its own
//! ([`EndpointCounters`]). It reads the switch's counters the way
//! `switchctl stats` does, over the control channel
//! ([`AdminCall::Snapshot`]), typed: [`render`] walks the counter schemas
//! ([`proto::switch::CounterSchema`]) and the fields of
//! [`SwitchStats`], never a map looked up by name, so a counter renamed in a
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

use std::convert::Infallible;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use proto::switch::{CounterSchema, DropReason, JobCounters, Priority, SpineCounters};

use crate::admin::AdminCall;
use crate::dataplane::DataplaneCounters;
use crate::ratelog::LogLimiter;
use crate::stats::SwitchStats;
use crate::supervise::{self, Health, Policy};

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

#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint: {call} on {addr} failed: {source} (is the port in use? change switch.metrics_listen)")]
pub struct MetricsError {
    addr: SocketAddr,
    call: &'static str,
    source: std::io::Error,
}

impl MetricsError {
    /// The listening socket could not be bound (the port is taken, the
    /// address is not this machine's): the error a default address may
    /// meet, as opposed to a thread or runtime that could not start.
    pub fn is_bind(&self) -> bool {
        self.call == "bind"
    }

    /// What failed, without the advice: `bind: Address in use (os error 98)`.
    pub fn cause(&self) -> String {
        format!("{}: {}", self.call, self.source)
    }
}

/// The running endpoint; stops on drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    health: Arc<Health>,
    handle: Option<std::thread::JoinHandle<()>>,
    #[cfg(test)]
    endpoint: Arc<Endpoint>,
}

impl MetricsServer {
    /// The address it listens on (the configured one, its port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Why its supervisor gave up on it (switchd is then stopping and
    /// exits non-zero), or `None`.
    pub fn failed(&self) -> Option<String> {
        self.health.failed()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What every connection task shares.
struct Endpoint {
    calls: mpsc::Sender<AdminCall>,
    content: Content,
    limits: Limits,
    counters: Mutex<EndpointCounters>,
    health: Arc<Health>,
    open: AtomicUsize,
    /// The switch's counters as last rendered, and when they were taken.
    rendered: Mutex<Option<(Instant, Arc<String>)>>,
    /// Tests: make the accept loop panic at its next connection.
    #[cfg(test)]
    panic_on_accept: AtomicBool,
}

impl Endpoint {
    fn count(&self, f: impl FnOnce(&mut EndpointCounters)) {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn counters(&self) -> EndpointCounters {
        let mut c = self
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        c.restarts = self.health.restarts.load(Ordering::Relaxed);
        c
    }
}

/// Releases a connection's place in the limit when its task ends.
struct OpenGuard(Arc<Endpoint>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Listens on `addr` and serves `content` at `/metrics` with
/// [`Limits::default`].
pub fn serve(
    addr: SocketAddr,
    calls: mpsc::Sender<AdminCall>,
    content: Content,
) -> Result<MetricsServer, MetricsError> {
    serve_with(addr, calls, content, Limits::default())
}

/// [`serve`] with other limits (tests use small ones).
pub fn serve_with(
    addr: SocketAddr,
    calls: mpsc::Sender<AdminCall>,
    content: Content,
    limits: Limits,
) -> Result<MetricsServer, MetricsError> {
    let err = |call| move |source| MetricsError { addr, call, source };
    // Bound here, so that a port in use is an error at startup.
    let listener = std::net::TcpListener::bind(addr).map_err(err("bind"))?;
    listener
        .set_nonblocking(true)
        .map_err(err("set_nonblocking"))?;
    let local = listener.local_addr().map_err(err("getsockname"))?;
    tracing::info!(addr = %local, "metrics at http://{local}/metrics");
    let stop = Arc::new(AtomicBool::new(false));
    let health = supervise::health();
    let endpoint = Arc::new(Endpoint {
        calls,
        content,
        limits,
        counters: Mutex::new(EndpointCounters::default()),
        health: health.clone(),
        open: AtomicUsize::new(0),
        rendered: Mutex::new(None),
        #[cfg(test)]
        panic_on_accept: AtomicBool::new(false),
    });
    let thread_stop = stop.clone();
    #[cfg(test)]
    let test_endpoint = endpoint.clone();
    let handle = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            supervise::supervise(
                "metrics",
                Policy::default(),
                &thread_stop,
                &endpoint.health.clone(),
                || run(&listener, &endpoint, &thread_stop),
                supervise::stop_switchd,
            )
        })
        .map_err(err("spawning the metrics thread"))?;
    Ok(MetricsServer {
        addr: local,
        stop,
        health,
        handle: Some(handle),
        #[cfg(test)]
        endpoint: test_endpoint,
    })
}

/// One run of the server: a fresh runtime over a duplicate of the listener
/// (so that a restart after a panic serves the same socket). Returns when
/// `stop` is set.
fn run(
    listener: &std::net::TcpListener,
    endpoint: &Arc<Endpoint>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("creating its runtime: {e}"))?;
    let listener = listener
        .try_clone()
        .map_err(|e| format!("duplicating the listening socket: {e}"))?;
    // Dropping the runtime at the end drops every connection task.
    rt.block_on(accept_loop(listener, endpoint.clone(), stop))
}

async fn accept_loop(
    listener: std::net::TcpListener,
    ep: Arc<Endpoint>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| format!("registering the listening socket: {e}"))?;
    let limits = ep.limits;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .max_buf_size(limits.max_head_bytes)
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut accept_log = LogLimiter::<1>::new();
    while !stop.load(Ordering::SeqCst) {
        // Wake now and then to see `stop`.
        let Ok(accepted) =
            tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
        else {
            continue;
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                ep.count(|c| c.accept_errors += 1);
                if let Some(suppressed) = accept_log.check(0, Instant::now()) {
                    tracing::warn!(
                        suppressed,
                        "metrics endpoint: accept failed: {e}; retrying in {:?} (EMFILE: \
                         raise switchd's open-file limit, LimitNOFILE= in its unit)",
                        limits.accept_backoff
                    );
                }
                tokio::time::sleep(limits.accept_backoff).await;
                continue;
            }
        };
        #[cfg(test)]
        if ep.panic_on_accept.swap(false, Ordering::SeqCst) {
            panic!("injected panic in the metrics accept loop");
        }
        if ep.open.load(Ordering::SeqCst) >= limits.max_connections {
            ep.count(|c| c.connections_rejected += 1);
            drop(stream);
            continue;
        }
        ep.open.fetch_add(1, Ordering::SeqCst);
        ep.count(|c| c.connections_accepted += 1);
        let guard = OpenGuard(ep.clone());
        let service_ep = ep.clone();
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |req| handle(req, service_ep.clone())),
        );
        tokio::spawn(async move {
            let ep = guard.0.clone();
            let outcome = tokio::time::timeout(limits.connection_deadline, conn).await;
            match outcome {
                Err(_) => ep.count(|c| c.connections_timed_out += 1),
                Ok(Err(e)) if e.is_timeout() => ep.count(|c| c.connections_timed_out += 1),
                Ok(Err(e)) if e.is_parse_too_large() => ep.count(|c| c.heads_too_large += 1),
                Ok(_) => {}
            }
            drop(guard);
        });
    }
    Ok(())
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

async fn handle(
    req: Request<Incoming>,
    ep: Arc<Endpoint>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/metrics" {
        ep.count(|c| c.requests_refused += 1);
        return Ok(text(StatusCode::NOT_FOUND, "see /metrics\n"));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        ep.count(|c| c.requests_refused += 1);
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "/metrics takes GET or HEAD\n",
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Ok(r);
    }
    match switch_text(&ep).await {
        Ok(switch) => {
            ep.count(|c| c.requests_served += 1);
            let mut body = String::with_capacity(switch.len() + 2048);
            body.push_str(&switch);
            render_endpoint(&mut body, &ep.counters());
            Ok(text(StatusCode::OK, body))
        }
        Err(why) => Ok(text(StatusCode::SERVICE_UNAVAILABLE, why)),
    }
}

/// The switch's counters rendered: reused while younger than
/// [`Limits::snapshot_reuse`], else a fresh snapshot from the control
/// thread.
async fn switch_text(ep: &Endpoint) -> Result<Arc<String>, String> {
    let fresh = |cached: &Option<(Instant, Arc<String>)>| {
        cached
            .as_ref()
            .filter(|(at, _)| at.elapsed() < ep.limits.snapshot_reuse)
            .map(|(_, t)| t.clone())
    };
    if let Some(t) = fresh(&ep.rendered.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(t);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let call = AdminCall::Snapshot(Box::new(move |s| {
        let _ = tx.send(s);
    }));
    if ep.calls.send(call).is_err() {
        return Err("switchd is stopping\n".into());
    }
    let taken = Instant::now();
    match tokio::time::timeout(ep.limits.snapshot_timeout, rx).await {
        Ok(Ok(stats)) => {
            let t = Arc::new(render_switch(&stats, ep.content));
            *ep.rendered.lock().unwrap_or_else(|e| e.into_inner()) = Some((taken, t.clone()));
            Ok(t)
        }
        _ => Err(format!(
            "switchd's control thread did not answer in {:?}\n",
            ep.limits.snapshot_timeout
        )),
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped (the text format's rule).
fn esc(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

fn sample(out: &mut String, name: &str, labels: &str, v: impl std::fmt::Display) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {v}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// `(name, help, value)` of one counter.
type Counter = (&'static str, &'static str, u64);

/// Every counter of a schema, in its order.
fn values(c: &dyn CounterSchema) -> Vec<Counter> {
    let mut v = Vec::new();
    c.visit(&mut |name, help, value| v.push((name, help, value)));
    v
}

/// One counter family per counter of schema `T`, named
/// `{prefix}{counter}_total`, with one sample per `(labels, counters)` row.
fn schema_families<T: CounterSchema + Default>(
    out: &mut String,
    prefix: &str,
    rows: &[(String, &T)],
) {
    let rows: Vec<(&str, Vec<Counter>)> = rows
        .iter()
        .map(|(labels, c)| (labels.as_str(), values(*c)))
        .collect();
    for (i, (counter, help, _)) in values(&T::default()).into_iter().enumerate() {
        let name = format!("{prefix}{counter}_total");
        family(out, &name, "counter", help);
        for (labels, vals) in &rows {
            sample(out, &name, labels, vals[i].2);
        }
    }
}

/// Renders a switch stats snapshot in the Prometheus text format, with the
/// endpoint's own counters. Counters come from their schemas ([`JobCounters`],
/// [`SpineCounters`], [`DataplaneCounters`], [`proto::switch::TableCounters`],
/// [`EndpointCounters`]): each is `aggswitch_job_<name>_total{job}`,
/// `aggswitch_spine_<name>_total{job,tree,spine}`, `aggswitch_<name>_total`
/// (dataplane counters summed over the threads, and the table's),
/// `aggswitch_thread_<name>_total{thread}` (each dataplane thread's own)
/// or `aggswitch_metrics_<name>_total`, with the schema's help text; the
/// gauges and labelled families are the fields of [`SwitchStats`]. Without
/// [`Content::per_job`], no `aggswitch_job_*` or `aggswitch_spine_*` series.
pub fn render(s: &SwitchStats, endpoint: &EndpointCounters, content: Content) -> String {
    let mut o = render_switch(s, content);
    render_endpoint(&mut o, endpoint);
    o
}

/// The endpoint's own counters ([`EndpointCounters`]).
fn render_endpoint(o: &mut String, endpoint: &EndpointCounters) {
    schema_families(o, "aggswitch_metrics_", &[(String::new(), endpoint)]);
}

/// Everything of [`render`] but the endpoint's own counters.
fn render_switch(s: &SwitchStats, content: Content) -> String {
    let mut o = String::new();
    if content.per_job {
        render_jobs(&mut o, s);
    }
    render_switch_wide(&mut o, s);
    o
}

/// The per-job series: `aggswitch_job_*`, and `aggswitch_spine_*` (a
/// leaf's, labelled by job).
fn render_jobs(o: &mut String, s: &SwitchStats) {
    let job_label = |id: u16| format!("job=\"{id}\"");
    let job_rows: Vec<(String, &JobCounters)> = s
        .jobs
        .iter()
        .map(|j| (job_label(j.id), &j.job_counters))
        .collect();
    schema_families(o, "aggswitch_job_", &job_rows);
    type JobGauge = fn(&crate::stats::JobStats) -> u64;
    let job_gauges: [(&str, &str, JobGauge); 8] = [
        (
            "aggswitch_job_window",
            "Chunks in flight the job's RESULTs advertise (the yield share while it yields).",
            |j| j.window.into(),
        ),
        (
            "aggswitch_job_ranks_joined",
            "Ranks joined under this generation.",
            |j| j.ranks_joined.into(),
        ),
        ("aggswitch_job_workers", "Ranks the job has.", |j| {
            j.n_workers.into()
        }),
        (
            "aggswitch_job_pool_bytes",
            "Slot-pool memory of the job.",
            |j| j.pool_bytes,
        ),
        (
            "aggswitch_job_active",
            "1 when every rank has joined.",
            |j| j.active.into(),
        ),
        (
            "aggswitch_job_priority",
            "The job's class: 0 low, 1 normal, 2 high.",
            |j| j.priority.parse::<Priority>().map_or(1, |p| p as u64),
        ),
        (
            "aggswitch_job_declared_window",
            "Chunks in flight the switch allows: the declared window.",
            |j| j.declared_window.into(),
        ),
        (
            "aggswitch_job_yielding",
            "1 while a job of a higher class is busy: this job's RESULTs carry ECE and a smaller window.",
            |j| j.yielding.into(),
        ),
    ];
    for (name, help, get) in job_gauges {
        family(o, name, "gauge", help);
        for j in &s.jobs {
            sample(o, name, &job_label(j.id), get(j));
        }
    }
    family(
        o,
        "aggswitch_job_drops_total",
        "counter",
        "Messages of the job dropped, by reason.",
    );
    for j in &s.jobs {
        for r in DropReason::ALL {
            let labels = format!("job=\"{}\",reason=\"{}\"", j.id, r.name());
            sample(
                o,
                "aggswitch_job_drops_total",
                &labels,
                j.drop_counts.count(r),
            );
        }
    }
    // A leaf's trees: one series per spine.
    let spine_rows: Vec<(String, &SpineCounters, bool)> = s
        .jobs
        .iter()
        .flat_map(|j| {
            j.spines.iter().map(move |sp| {
                (
                    format!(
                        "job=\"{}\",tree=\"{}\",spine=\"{}\"",
                        j.id,
                        sp.tree,
                        esc(&sp.addr)
                    ),
                    &sp.spine_counters,
                    sp.joined,
                )
            })
        })
        .collect();
    let rows: Vec<(String, &SpineCounters)> =
        spine_rows.iter().map(|(l, c, _)| (l.clone(), *c)).collect();
    schema_families(o, "aggswitch_spine_", &rows);
    family(
        o,
        "aggswitch_spine_joined",
        "gauge",
        "1 when the leaf's session with the spine is up.",
    );
    for (labels, _, joined) in &spine_rows {
        sample(o, "aggswitch_spine_joined", labels, u8::from(*joined));
    }
}

/// Everything but the per-job series: ports, sockets, the dataplane's
/// counters (switch-wide and per thread), the table's and the gauges.
fn render_switch_wide(o: &mut String, s: &SwitchStats) {
    type PortCounter = fn(&crate::stats::PortStats) -> u64;
    let port_counters: [(&str, &str, PortCounter); 6] = [
        (
            "aggswitch_port_xdp_steered_total",
            "Frames the XDP program steered to AF_XDP.",
            |p| p.xdp_steered,
        ),
        (
            "aggswitch_port_xdp_passed_total",
            "Frames the XDP program passed on unchanged.",
            |p| p.xdp_passed,
        ),
        (
            "aggswitch_port_xdp_malformed_total",
            "Passed frames that claimed IPv4/UDP but were malformed.",
            |p| p.xdp_malformed,
        ),
        (
            "aggswitch_port_xdp_dropped_total",
            "Steerable frames dropped in XDP (xdp-drop benchmark mode).",
            |p| p.xdp_dropped,
        ),
        (
            "aggswitch_port_xdp_forwarded_total",
            "Frames the XDP fast path forwarded to another port (by ingress port).",
            |p| p.xdp_forwarded,
        ),
        (
            "aggswitch_port_xdp_own_address_forged_total",
            "Frames dropped in XDP for claiming one of the switch's own addresses as their source.",
            |p| p.xdp_own_address_forged,
        ),
    ];
    for (name, help, get) in port_counters {
        family(o, name, "counter", help);
        for p in &s.ports {
            sample(o, name, &format!("port=\"{}\"", esc(&p.name)), get(p));
        }
    }
    family(
        o,
        "aggswitch_port_xdp_fwd_refused_total",
        "counter",
        "Frames the fast path left to the bridge, by the first rule they failed (by ingress port).",
    );
    for p in &s.ports {
        for (reason, v) in &p.xdp_fwd_refused {
            let labels = format!("port=\"{}\",reason=\"{reason}\"", esc(&p.name));
            sample(o, "aggswitch_port_xdp_fwd_refused_total", &labels, v);
        }
    }
    type RingValue = fn(&crate::dataplane::RingStats) -> u64;
    let ring_values: [(&str, &str, &str, RingValue); 5] = [
        (
            "aggswitch_ring_rx_occupancy",
            "gauge",
            "Frames waiting in the AF_XDP receive ring.",
            |r| r.rx_occupancy.into(),
        ),
        (
            "aggswitch_ring_tx_occupancy",
            "gauge",
            "Frames waiting in the AF_XDP transmit ring.",
            |r| r.tx_occupancy.into(),
        ),
        (
            "aggswitch_ring_kernel_rx_dropped_total",
            "counter",
            "Frames the kernel dropped for the socket (ring full, fill ring empty, bad descriptors).",
            |r| r.kernel_rx_dropped,
        ),
        (
            "aggswitch_ring_kernel_rx_ring_full_total",
            "counter",
            "Frames the kernel dropped because the AF_XDP receive ring was full.",
            |r| r.kernel_rx_ring_full,
        ),
        (
            "aggswitch_ring_kernel_fill_ring_empty_total",
            "counter",
            "Times the kernel found the fill ring empty.",
            |r| r.kernel_fill_ring_empty,
        ),
    ];
    for (name, kind, help, get) in ring_values {
        family(o, name, kind, help);
        for r in &s.rings {
            let port = s
                .ports
                .get(r.port_idx as usize)
                .map_or_else(|| r.port_idx.to_string(), |p| esc(&p.name));
            let labels = format!("port=\"{port}\",queue=\"{}\"", r.queue);
            sample(o, name, &labels, get(r));
        }
    }
    schema_families::<DataplaneCounters>(o, "aggswitch_", &[(String::new(), &s.dataplane)]);
    // The same counters per dataplane thread, under their own names so
    // that the totals above stay (summing both would count twice).
    let thread_label = |t: &crate::stats::ThreadStats| format!("thread=\"{}\"", t.thread);
    let thread_rows: Vec<(String, &DataplaneCounters)> = s
        .threads
        .iter()
        .map(|t| (thread_label(t), &t.dataplane))
        .collect();
    schema_families(o, "aggswitch_thread_", &thread_rows);
    family(
        o,
        "aggswitch_thread_busy_ratio",
        "gauge",
        "Share of the last second the dataplane thread was awake, not asleep in poll(2).",
    );
    for t in &s.threads {
        sample(
            o,
            "aggswitch_thread_busy_ratio",
            &thread_label(t),
            t.busy_share,
        );
    }
    family(
        o,
        "aggswitch_thread_socket",
        "gauge",
        "1 for each AF_XDP socket (port, queue) the dataplane thread serves.",
    );
    for t in &s.threads {
        for so in &t.sockets {
            let labels = format!(
                "{},port=\"{}\",queue=\"{}\"",
                thread_label(t),
                esc(&so.port),
                so.queue
            );
            sample(o, "aggswitch_thread_socket", &labels, 1);
        }
    }
    schema_families(o, "aggswitch_", &[(String::new(), &s.table)]);
    family(
        o,
        "aggswitch_malformed_total",
        "counter",
        "Malformed aggregation frames, by kind.",
    );
    for (kind, v) in &s.malformed {
        sample(
            o,
            "aggswitch_malformed_total",
            &format!("kind=\"{kind}\""),
            v,
        );
    }
    for (name, help, v) in [
        (
            "aggswitch_generation",
            "Switch generation (random at start).",
            u64::from(s.generation),
        ),
        (
            "aggswitch_pool_budget_bytes",
            "Slot-pool memory budget.",
            s.pool_budget_bytes,
        ),
        (
            "aggswitch_pool_in_use_bytes",
            "Slot-pool memory of declared jobs.",
            s.pool_in_use_bytes,
        ),
    ] {
        family(o, name, "gauge", help);
        sample(o, name, "", v);
    }
    family(
        o,
        "aggswitch_uptime_seconds",
        "gauge",
        "Seconds since switchd started.",
    );
    sample(o, "aggswitch_uptime_seconds", "", s.uptime_secs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::RingStats;
    use crate::stats::{JobStats, PortStats, SpineStats, ThreadSocket, ThreadStats};
    use proto::switch::{JobDrops, TableCounters};
    use std::collections::BTreeMap;
    use std::io::{Read, Write as _};

    /// Sets every counter of `c` to a distinct value from `next`, and
    /// returns `(name, value)` of each.
    fn fill(
        next: &mut u64,
        f: impl FnOnce(&mut dyn FnMut(&'static str, &mut u64)),
    ) -> Vec<(&'static str, u64)> {
        let mut set = Vec::new();
        f(&mut |name, v| {
            *next += 1;
            *v = *next;
            set.push((name, *next));
        });
        set
    }

    fn job(id: u16, next: &mut u64) -> (JobStats, Vec<(&'static str, u64)>) {
        let mut c = JobCounters::default();
        let set = fill(next, |f| c.visit_mut(f));
        let mut drops = JobDrops::default();
        for r in DropReason::ALL {
            *next += 1;
            drops.0[r as usize] = *next;
        }
        let mut sc = SpineCounters::default();
        fill(next, |f| sc.visit_mut(f));
        let j = JobStats {
            id,
            state: "active",
            n_workers: 4,
            ranks_joined: 3,
            window: 64,
            priority: "low",
            declared_window: 512,
            yielding: true,
            floor_seq: 0,
            pool_bytes: 1 << 20,
            ranks_missing_on_floor: vec![],
            counters: BTreeMap::new(),
            drops: BTreeMap::new(),
            spines: vec![SpineStats {
                tree: 1,
                addr: "198.19.255.2:48879".into(),
                state: "joined",
                refused: None,
                last_heard_secs: None,
                counters: BTreeMap::new(),
                spine_counters: sc,
                joined: true,
            }],
            job_counters: c,
            drop_counts: drops,
            active: true,
        };
        (j, set)
    }

    fn stats() -> SwitchStats {
        let mut next = 1000;
        let mut dp = DataplaneCounters::default();
        fill(&mut next, |f| dp.visit_mut(f));
        let mut table = TableCounters::default();
        fill(&mut next, |f| table.visit_mut(f));
        let threads = (0..2)
            .map(|i| {
                let mut c = DataplaneCounters::default();
                fill(&mut next, |f| c.visit_mut(f));
                ThreadStats {
                    thread: i,
                    sockets: vec![ThreadSocket {
                        port: "sw-w0".into(),
                        queue: i as u32,
                    }],
                    busy_share: 0.25 * (i + 1) as f64,
                    counters: BTreeMap::new(),
                    dataplane: c,
                }
            })
            .collect();
        SwitchStats {
            generation: 7,
            uptime_secs: 1.5,
            counters: BTreeMap::new(),
            dataplane: dp,
            table,
            malformed: [("truncated", 3)].into_iter().collect(),
            malformed_total: 3,
            pool_budget_bytes: 1 << 30,
            pool_in_use_bytes: 1 << 20,
            jobs: vec![job(4, &mut next).0, job(9, &mut next).0],
            ports: vec![PortStats {
                name: "sw-w0".into(),
                xdp_steered: 8,
                xdp_passed: 1,
                xdp_malformed: 0,
                xdp_dropped: 5,
                xdp_forwarded: 6,
                xdp_own_address_forged: 3,
                xdp_fwd_refused: [("fwd_other_bridge", 7)].into_iter().collect(),
            }],
            rings: vec![RingStats {
                port_idx: 0,
                queue: 0,
                rx_occupancy: 12,
                tx_occupancy: 3,
                kernel_rx_dropped: 2,
                kernel_rx_ring_full: 1,
                kernel_fill_ring_empty: 0,
            }],
            threads,
        }
    }

    fn has(t: &str, line: &str) {
        assert!(t.lines().any(|l| l == line), "missing `{line}` in:\n{t}");
    }

    #[test]
    fn every_counter_of_every_schema_is_rendered_with_its_value() {
        let s = stats();
        let mut ep = EndpointCounters::default();
        let mut next = 90_000;
        let ep_set = fill(&mut next, |f| ep.visit_mut(f));
        let t = render(&s, &ep, Content::default());
        for j in &s.jobs {
            j.job_counters.visit(&mut |name, help, v| {
                has(
                    &t,
                    &format!("aggswitch_job_{name}_total{{job=\"{}\"}} {v}", j.id),
                );
                has(&t, &format!("# HELP aggswitch_job_{name}_total {help}"));
                has(&t, &format!("# TYPE aggswitch_job_{name}_total counter"));
            });
            for r in DropReason::ALL {
                has(
                    &t,
                    &format!(
                        "aggswitch_job_drops_total{{job=\"{}\",reason=\"{}\"}} {}",
                        j.id,
                        r.name(),
                        j.drop_counts.count(r)
                    ),
                );
            }
            for sp in &j.spines {
                sp.spine_counters.visit(&mut |name, _, v| {
                    has(
                        &t,
                        &format!(
                            "aggswitch_spine_{name}_total{{job=\"{}\",tree=\"1\",spine=\"198.19.255.2:48879\"}} {v}",
                            j.id
                        ),
                    );
                });
            }
        }
        let mut switch_wide = 0;
        for schema in [&s.dataplane as &dyn CounterSchema, &s.table] {
            schema.visit(&mut |name, help, v| {
                has(&t, &format!("aggswitch_{name}_total {v}"));
                has(&t, &format!("# HELP aggswitch_{name}_total {help}"));
                switch_wide += 1;
            });
        }
        assert!(switch_wide > 5, "the schemas list their counters");
        for th in &s.threads {
            th.dataplane.visit(&mut |name, help, v| {
                has(
                    &t,
                    &format!(
                        "aggswitch_thread_{name}_total{{thread=\"{}\"}} {v}",
                        th.thread
                    ),
                );
                has(&t, &format!("# HELP aggswitch_thread_{name}_total {help}"));
                has(&t, &format!("# TYPE aggswitch_thread_{name}_total counter"));
            });
        }
        for (name, v) in ep_set {
            // `restarts` included: render takes the counters as given.
            has(&t, &format!("aggswitch_metrics_{name}_total {v}"));
        }
        // Every value set was distinct: a counter rendered from another's
        // field would have shown up as a missing line above.
        let values: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("aggswitch_job_") && l.contains("_total{job=\"4\"}"))
            .filter_map(|l| l.rsplit(' ').next())
            .collect();
        let mut dedup = values.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(values.len(), dedup.len(), "values repeat: {values:?}");
    }

    #[test]
    fn renders_the_gauges_and_labelled_families() {
        let t = render(&stats(), &EndpointCounters::default(), Content::default());
        for line in [
            "aggswitch_job_window{job=\"4\"} 64",
            "aggswitch_job_ranks_joined{job=\"4\"} 3",
            "aggswitch_job_workers{job=\"9\"} 4",
            "aggswitch_job_pool_bytes{job=\"4\"} 1048576",
            "aggswitch_job_active{job=\"4\"} 1",
            "aggswitch_job_priority{job=\"4\"} 0",
            "aggswitch_job_declared_window{job=\"4\"} 512",
            "aggswitch_job_yielding{job=\"4\"} 1",
            "aggswitch_spine_joined{job=\"4\",tree=\"1\",spine=\"198.19.255.2:48879\"} 1",
            "aggswitch_port_xdp_steered_total{port=\"sw-w0\"} 8",
            "aggswitch_port_xdp_dropped_total{port=\"sw-w0\"} 5",
            "aggswitch_port_xdp_own_address_forged_total{port=\"sw-w0\"} 3",
            "aggswitch_port_xdp_forwarded_total{port=\"sw-w0\"} 6",
            "aggswitch_port_xdp_fwd_refused_total{port=\"sw-w0\",reason=\"fwd_other_bridge\"} 7",
            "aggswitch_ring_rx_occupancy{port=\"sw-w0\",queue=\"0\"} 12",
            "aggswitch_ring_kernel_rx_dropped_total{port=\"sw-w0\",queue=\"0\"} 2",
            "aggswitch_ring_kernel_rx_ring_full_total{port=\"sw-w0\",queue=\"0\"} 1",
            "aggswitch_malformed_total{kind=\"truncated\"} 3",
            "aggswitch_thread_busy_ratio{thread=\"0\"} 0.25",
            "aggswitch_thread_busy_ratio{thread=\"1\"} 0.5",
            "aggswitch_thread_socket{thread=\"1\",port=\"sw-w0\",queue=\"1\"} 1",
            "# TYPE aggswitch_thread_busy_ratio gauge",
            "aggswitch_generation 7",
            "aggswitch_pool_budget_bytes 1073741824",
            "# TYPE aggswitch_ring_kernel_rx_dropped_total counter",
            "# TYPE aggswitch_job_window gauge",
        ] {
            has(&t, line);
        }
    }

    #[test]
    fn without_per_job_series_no_job_or_spine_line_is_rendered_and_the_rest_is() {
        let s = stats();
        let ep = EndpointCounters::default();
        let t = render(&s, &ep, Content { per_job: false });
        for l in t.lines() {
            assert!(
                !l.contains("aggswitch_job_")
                    && !l.contains("aggswitch_spine_")
                    && !l.contains("job=\""),
                "a per-job line with metrics_per_job = false: `{l}`"
            );
        }
        // The switch-wide schemas, ports, sockets, threads and gauges stay.
        for schema in [&s.dataplane as &dyn CounterSchema, &s.table] {
            schema.visit(&mut |name, _, v| has(&t, &format!("aggswitch_{name}_total {v}")));
        }
        for line in [
            "aggswitch_port_xdp_steered_total{port=\"sw-w0\"} 8",
            "aggswitch_ring_rx_occupancy{port=\"sw-w0\",queue=\"0\"} 12",
            "aggswitch_thread_busy_ratio{thread=\"1\"} 0.5",
            "aggswitch_malformed_total{kind=\"truncated\"} 3",
            "aggswitch_generation 7",
            "aggswitch_pool_in_use_bytes 1048576",
            "aggswitch_metrics_requests_served_total 0",
        ] {
            has(&t, line);
        }
        // Exactly the full page less its per-job lines.
        let full = render(&s, &ep, Content::default());
        let kept: Vec<&str> = full
            .lines()
            .filter(|l| !l.contains("aggswitch_job_") && !l.contains("aggswitch_spine_"))
            .collect();
        assert!(kept.len() < full.lines().count());
        assert_eq!(kept, t.lines().collect::<Vec<_>>());
    }

    #[test]
    fn the_endpoint_serves_what_its_content_says() {
        let (calls, _control) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content { per_job: false },
            limits(),
        )
        .unwrap();
        let body = http(
            m.local_addr(),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(!body.contains("aggswitch_job_"), "{body}");
        assert!(body.contains("\naggswitch_generation 7\n"), "{body}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// A control thread stand-in: answers snapshot calls with `stats()`,
    /// counting them.
    fn fake_control() -> (mpsc::Sender<AdminCall>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::channel::<AdminCall>();
        let snapshots = Arc::new(AtomicUsize::new(0));
        let n = snapshots.clone();
        std::thread::spawn(move || {
            while let Ok(call) = rx.recv() {
                if let AdminCall::Snapshot(reply) = call {
                    n.fetch_add(1, Ordering::SeqCst);
                    reply(stats());
                }
            }
        });
        (tx, snapshots)
    }

    #[test]
    fn a_panic_in_the_server_is_counted_and_it_is_restarted() {
        let (calls, _snapshots) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            limits(),
        )
        .unwrap();
        m.endpoint.panic_on_accept.store(true, Ordering::SeqCst);
        // This connection meets the panic: closed unanswered.
        let lost = http(
            m.local_addr(),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(lost.is_empty(), "{lost}");
        // The restarted server answers on the same socket, and says so.
        assert_eq!(
            metric(m.local_addr(), "aggswitch_metrics_restarts_total"),
            1
        );
        assert!(m.failed().is_none());
    }

    #[test]
    fn a_busy_keep_alive_connection_ends_at_its_deadline() {
        let (calls, _snapshots) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            limits(),
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect(m.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = Instant::now();
        let mut answered = 0;
        // Requests well within the header timeout, one after another.
        let closed_at = loop {
            if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .is_err()
            {
                break t0.elapsed();
            }
            let mut buf = vec![0u8; 1 << 20];
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break t0.elapsed(),
                Ok(_) => answered += 1,
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "never closed");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(answered >= 5, "only {answered} answers before the close");
        // limits(): a 2 s deadline.
        assert!(
            closed_at >= Duration::from_millis(1900) && closed_at < Duration::from_secs(4),
            "closed after {closed_at:?}"
        );
        assert_eq!(
            metric(
                m.local_addr(),
                "aggswitch_metrics_connections_timed_out_total"
            ),
            1
        );
    }

    #[test]
    fn a_request_flood_takes_one_snapshot_per_reuse_interval() {
        let (calls, snapshots) = fake_control();
        let lim = Limits {
            snapshot_reuse: Duration::from_millis(300),
            ..limits()
        };
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            lim,
        )
        .unwrap();
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(
                metric(m.local_addr(), "aggswitch_job_window{job=\"4\"}"),
                64
            );
        }
        let served = metric(m.local_addr(), "aggswitch_metrics_requests_served_total");
        // The endpoint's own counters are fresh in every answer.
        assert_eq!(served, 6);
        if t0.elapsed() < Duration::from_millis(300) {
            assert_eq!(snapshots.load(Ordering::SeqCst), 1);
        }
        std::thread::sleep(Duration::from_millis(350));
        metric(m.local_addr(), "aggswitch_generation");
        assert!(
            snapshots.load(Ordering::SeqCst) >= 2,
            "a stale snapshot was served"
        );
    }

    fn http(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn metric(addr: SocketAddr, name: &str) -> u64 {
        let body = http(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
    }

    fn limits() -> Limits {
        Limits {
            max_connections: 4,
            header_timeout: Duration::from_millis(300),
            connection_deadline: Duration::from_secs(2),
            ..Limits::default()
        }
    }

    #[test]
    fn serves_get_metrics_and_refuses_other_paths_and_methods() {
        let (calls, _control) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            limits(),
        )
        .unwrap();
        let ok = http(
            m.local_addr(),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("aggswitch_job_window{job=\"4\"} 64"), "{ok}");
        let nf = http(
            m.local_addr(),
            b"GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
        let na = http(
            m.local_addr(),
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert!(na.starts_with("HTTP/1.1 405"), "{na}");
        assert_eq!(
            metric(m.local_addr(), "aggswitch_metrics_requests_refused_total"),
            2
        );
    }

    #[test]
    fn an_endless_header_is_cut_off_at_the_head_limit() {
        let (calls, _control) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            limits(),
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect(m.local_addr()).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Long: ");
        let chunk = [b'a'; 4096];
        let mut sent = 0;
        // The server closes the connection long before 4 MB.
        while sent < 4 << 20 {
            if s.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.is_empty() || out.starts_with("HTTP/1.1 431"),
            "unexpected answer: {out}"
        );
        assert_eq!(
            metric(m.local_addr(), "aggswitch_metrics_heads_too_large_total"),
            1
        );
    }

    #[test]
    fn connections_beyond_the_limit_are_closed_and_counted_then_it_answers() {
        let (calls, _control) = fake_control();
        let m = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            calls,
            Content::default(),
            limits(),
        )
        .unwrap();
        // Silent clients: 4 fill the limit, 6 more are closed at once.
        let idle: Vec<_> = (0..10)
            .map(|_| std::net::TcpStream::connect(m.local_addr()).unwrap())
            .collect();
        let t0 = Instant::now();
        let mut closed = 0;
        for mut s in idle {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 64];
            // Closed by the server: at once (rejected) or at the header timeout.
            if matches!(s.read(&mut b), Ok(0) | Err(_)) {
                closed += 1;
            }
        }
        assert_eq!(closed, 10);
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(
            metric(
                m.local_addr(),
                "aggswitch_metrics_connections_rejected_total"
            ),
            6
        );
        assert_eq!(
            metric(
                m.local_addr(),
                "aggswitch_metrics_connections_timed_out_total"
            ),
            4
        );
    }
}
