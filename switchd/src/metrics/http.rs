//! Answering one HTTP request: `GET`/`HEAD /metrics` with the switch's
//! counters (a snapshot from the control thread, reused while fresh) and
//! the endpoint's own; 404 for another path, 405 for another method, 503
//! when the control thread does not answer.
//!
//! Invariant: a request never waits longer than `snapshot_timeout` for the
//! control thread, and a flood of requests takes at most one snapshot per
//! `snapshot_reuse`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use crate::admin::AdminCall;

use super::endpoint::Endpoint;
use super::render::{render_endpoint, render_switch};

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

pub(super) async fn handle(
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
