//! The metrics thread: binding the listener, running hyper's HTTP/1
//! server on a current-thread tokio runtime under supervision
//! ([`serve`], [`MetricsServer`]), and the accept loop with its
//! connection limit, deadlines and backoff.
//!
//! Invariants: every connection is a task on the one thread; an `accept`
//! error never ends the thread (counted, logged at most once a second,
//! retried after `accept_backoff`); a restart after a panic serves the same
//! listening socket; dropping the [`MetricsServer`] stops the thread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};

use crate::admin::AdminCall;
use crate::ratelog::LogLimiter;
use crate::supervise::{self, Health, Policy};

use super::counters::EndpointCounters;
use super::endpoint::{Endpoint, OpenGuard};
use super::http::handle;
use super::limits::{Content, Limits};

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
    pub(super) endpoint: Arc<Endpoint>,
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
