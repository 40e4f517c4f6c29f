//! Prometheus text-format metrics at `http://metrics_listen/metrics`.
//!
//! Owns: a small HTTP server thread (tiny_http). It reads counters the same
//! way `switchctl stats` does: a request over the admin channel, answered by
//! the control thread. The dataplane's counters are plain integers owned by
//! its thread (one set per dataplane thread, summed when read), so nothing
//! on the hot path locks or shares a cache line.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::Value;

use proto::switch::{CounterSchema, JobCounters, SpineCounters, TableCounters};

use crate::admin::{AdminCall, AdminRequest};
use crate::dataplane::DataplaneCounters;

#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint: listening on {addr} failed: {message} (is the port in use? change switch.metrics_listen)")]
pub struct MetricsError {
    addr: SocketAddr,
    message: String,
}

/// The running endpoint; stops on drop.
pub struct MetricsServer {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

pub fn serve(
    addr: SocketAddr,
    calls: mpsc::Sender<AdminCall>,
) -> Result<MetricsServer, MetricsError> {
    let server = tiny_http::Server::http(addr).map_err(|e| MetricsError {
        addr,
        message: e.to_string(),
    })?;
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = stop.clone();
    let handle = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !thread_stop.load(Ordering::SeqCst) {
                let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(200)) else {
                    continue;
                };
                let response = if req.url() == "/metrics" {
                    match fetch(&calls) {
                        Some(stats) => tiny_http::Response::from_string(render(&stats))
                            .with_header(
                                "Content-Type: text/plain; version=0.0.4"
                                    .parse::<tiny_http::Header>()
                                    .expect("static header"),
                            ),
                        None => tiny_http::Response::from_string("dataplane did not answer\n")
                            .with_status_code(503),
                    }
                } else {
                    tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                };
                let _ = req.respond(response);
            }
        })
        .map_err(|e| MetricsError {
            addr,
            message: e.to_string(),
        })?;
    Ok(MetricsServer {
        stop,
        handle: Some(handle),
    })
}

fn fetch(calls: &mpsc::Sender<AdminCall>) -> Option<Value> {
    let (tx, rx) = mpsc::channel();
    calls
        .send(AdminCall {
            request: AdminRequest::Stats { job: None },
            reply: tx,
        })
        .ok()?;
    let reply = rx.recv_timeout(Duration::from_secs(5)).ok()?;
    reply.ok.then_some(reply.data)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Names and help texts of a counter schema.
fn schema_of(c: &dyn CounterSchema) -> Vec<(&'static str, &'static str)> {
    let mut v = Vec::new();
    c.visit(&mut |name, help, _| v.push((name, help)));
    v
}

/// Renders a switch stats snapshot (the JSON of `switchctl stats --json`)
/// in the Prometheus text format. Counters come from their schemas
/// ([`JobCounters`], [`DataplaneCounters`], [`TableCounters`]): each is
/// `aggswitch_job_<name>_total{job}` or `aggswitch_<name>_total`, with the
/// schema's help text; the gauges are listed here.
pub fn render(s: &Value) -> String {
    let mut o = String::new();
    let jobs = s["jobs"].as_array().cloned().unwrap_or_default();
    for (field, help) in schema_of(&JobCounters::default()) {
        let name = format!("aggswitch_job_{field}_total");
        family(&mut o, &name, "counter", help);
        for j in &jobs {
            let _ = writeln!(o, "{name}{{job=\"{}\"}} {}", j["id"], num(&j[field]));
        }
    }
    for (name, field, help) in [
        (
            "aggswitch_job_window",
            "window",
            "Chunks in flight the switch allows.",
        ),
        (
            "aggswitch_job_ranks_joined",
            "ranks_joined",
            "Ranks joined under this generation.",
        ),
        ("aggswitch_job_workers", "n_workers", "Ranks the job has."),
        (
            "aggswitch_job_pool_bytes",
            "pool_bytes",
            "Slot-pool memory of the job.",
        ),
    ] {
        family(&mut o, name, "gauge", help);
        for j in &jobs {
            let _ = writeln!(o, "{name}{{job=\"{}\"}} {}", j["id"], num(&j[field]));
        }
    }
    family(
        &mut o,
        "aggswitch_job_active",
        "gauge",
        "1 when every rank has joined.",
    );
    for j in &jobs {
        let _ = writeln!(
            o,
            "aggswitch_job_active{{job=\"{}\"}} {}",
            j["id"],
            (j["state"] == "active") as u8
        );
    }
    family(
        &mut o,
        "aggswitch_job_drops_total",
        "counter",
        "Messages of the job dropped, by reason.",
    );
    for j in &jobs {
        if let Some(d) = j["drops"].as_object() {
            for (reason, v) in d {
                let _ = writeln!(
                    o,
                    "aggswitch_job_drops_total{{job=\"{}\",reason=\"{reason}\"}} {}",
                    j["id"],
                    num(v)
                );
            }
        }
    }
    // A leaf's trees: one series per spine.
    for (field, help) in schema_of(&SpineCounters::default()) {
        let name = format!("aggswitch_spine_{field}_total");
        family(&mut o, &name, "counter", help);
        for j in &jobs {
            for sp in j["spines"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    o,
                    "{name}{{job=\"{}\",tree=\"{}\",spine=\"{}\"}} {}",
                    j["id"],
                    sp["tree"],
                    sp["addr"].as_str().unwrap_or("?"),
                    num(&sp[field])
                );
            }
        }
    }
    family(
        &mut o,
        "aggswitch_spine_joined",
        "gauge",
        "1 when the leaf's session with the spine is up.",
    );
    for j in &jobs {
        for sp in j["spines"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "aggswitch_spine_joined{{job=\"{}\",tree=\"{}\",spine=\"{}\"}} {}",
                j["id"],
                sp["tree"],
                sp["addr"].as_str().unwrap_or("?"),
                (sp["state"] == "joined") as u8
            );
        }
    }
    let ports = s["ports"].as_array().cloned().unwrap_or_default();
    for (name, field, help) in [
        (
            "aggswitch_port_xdp_steered_total",
            "xdp_steered",
            "Frames the XDP program steered to AF_XDP.",
        ),
        (
            "aggswitch_port_xdp_passed_total",
            "xdp_passed",
            "Frames the XDP program passed on unchanged.",
        ),
        (
            "aggswitch_port_xdp_malformed_total",
            "xdp_malformed",
            "Passed frames that claimed IPv4/UDP but were malformed.",
        ),
        (
            "aggswitch_port_xdp_dropped_total",
            "xdp_dropped",
            "Steerable frames dropped in XDP (xdp-drop benchmark mode).",
        ),
        (
            "aggswitch_port_xdp_forwarded_total",
            "xdp_forwarded",
            "Frames the XDP fast path forwarded to another port (by ingress port).",
        ),
    ] {
        family(&mut o, name, "counter", help);
        for p in &ports {
            let _ = writeln!(
                o,
                "{name}{{port=\"{}\"}} {}",
                p["name"].as_str().unwrap_or("?"),
                num(&p[field])
            );
        }
    }
    family(
        &mut o,
        "aggswitch_port_xdp_fwd_refused_total",
        "counter",
        "Frames the fast path left to the bridge, by the first rule they failed (by ingress port).",
    );
    for p in &ports {
        if let Some(r) = p["xdp_fwd_refused"].as_object() {
            for (reason, v) in r {
                let _ = writeln!(
                    o,
                    "aggswitch_port_xdp_fwd_refused_total{{port=\"{}\",reason=\"{reason}\"}} {}",
                    p["name"].as_str().unwrap_or("?"),
                    num(v)
                );
            }
        }
    }
    let rings = s["rings"].as_array().cloned().unwrap_or_default();
    for (name, kind, field, help) in [
        (
            "aggswitch_ring_rx_occupancy",
            "gauge",
            "rx_occupancy",
            "Frames waiting in the AF_XDP receive ring.",
        ),
        (
            "aggswitch_ring_tx_occupancy",
            "gauge",
            "tx_occupancy",
            "Frames waiting in the AF_XDP transmit ring.",
        ),
        (
            "aggswitch_ring_kernel_rx_dropped_total",
            "counter",
            "kernel_rx_dropped",
            "Frames the kernel dropped for the socket (ring full, fill ring empty, bad descriptors).",
        ),
        (
            "aggswitch_ring_kernel_rx_ring_full_total",
            "counter",
            "kernel_rx_ring_full",
            "Frames the kernel dropped because the AF_XDP receive ring was full.",
        ),
        (
            "aggswitch_ring_kernel_fill_ring_empty_total",
            "counter",
            "kernel_fill_ring_empty",
            "Times the kernel found the fill ring empty.",
        ),
    ] {
        family(&mut o, name, kind, help);
        for r in &rings {
            let port = ports
                .get(num(&r["port_idx"]) as usize)
                .and_then(|p| p["name"].as_str())
                .unwrap_or("?");
            let _ = writeln!(
                o,
                "{name}{{port=\"{port}\",queue=\"{}\"}} {}",
                r["queue"],
                num(&r[field])
            );
        }
    }
    let switch_counters = schema_of(&DataplaneCounters::default())
        .into_iter()
        .chain(schema_of(&TableCounters::default()));
    for (field, help) in switch_counters {
        let name = format!("aggswitch_{field}_total");
        family(&mut o, &name, "counter", help);
        let _ = writeln!(o, "{name} {}", num(&s[field]));
    }
    family(
        &mut o,
        "aggswitch_malformed_total",
        "counter",
        "Malformed aggregation frames, by kind.",
    );
    if let Some(m) = s["malformed"].as_object() {
        for (kind, v) in m {
            let _ = writeln!(o, "aggswitch_malformed_total{{kind=\"{kind}\"}} {}", num(v));
        }
    }
    for (name, field, help) in [
        (
            "aggswitch_generation",
            "generation",
            "Switch generation (random at start).",
        ),
        (
            "aggswitch_pool_budget_bytes",
            "pool_budget_bytes",
            "Slot-pool memory budget.",
        ),
        (
            "aggswitch_pool_in_use_bytes",
            "pool_in_use_bytes",
            "Slot-pool memory of declared jobs.",
        ),
    ] {
        family(&mut o, name, "gauge", help);
        let _ = writeln!(o, "{name} {}", num(&s[field]));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_labels() {
        let s = serde_json::json!({
            "generation": 7, "rx_frames": 10, "tx_frames": 9, "tx_ring_full": 0,
            "ring_congested_frames": 2, "unknown_job": 1,
            "forwarded": 11, "thread_wakeups": 4,
            "malformed": {"truncated": 3},
            "jobs": [{"id": 4, "state": "active", "n_workers": 2, "ranks_joined": 2,
                      "window": 64, "chunks_completed": 5, "bytes_aggregated": 40,
                      "results_sent": 10, "retransmits_served": 1, "ece_marked": 2, "nacks": 0,
                      "drops": {"duplicate": 3},
                      "spines": [{"tree": 1, "addr": "198.19.255.2:48879", "state": "joined",
                                  "partials_sent": 12, "partials_resent": 1, "results": 12,
                                  "heartbeats_sent": 0, "refusals": 0}]}],
            "ports": [{"name": "sw-w0", "xdp_steered": 8, "xdp_passed": 1, "xdp_malformed": 0,
                       "xdp_dropped": 5, "xdp_forwarded": 6,
                       "xdp_fwd_refused": {"fwd_other_bridge": 7}}],
            "rings": [{"port_idx": 0, "queue": 0, "rx_occupancy": 12, "tx_occupancy": 3,
                       "kernel_rx_dropped": 2}],
        });
        let t = render(&s);
        for line in [
            "aggswitch_job_chunks_completed_total{job=\"4\"} 5",
            "aggswitch_job_drops_total{job=\"4\",reason=\"duplicate\"} 3",
            "aggswitch_job_window{job=\"4\"} 64",
            "aggswitch_job_ece_marked_total{job=\"4\"} 2",
            "aggswitch_job_active{job=\"4\"} 1",
            "aggswitch_port_xdp_steered_total{port=\"sw-w0\"} 8",
            "aggswitch_forwarded_total 11",
            "aggswitch_job_join_replays_total{job=\"4\"} 0",
            "aggswitch_thread_wakeups_total 4",
            "aggswitch_port_xdp_dropped_total{port=\"sw-w0\"} 5",
            "aggswitch_port_xdp_forwarded_total{port=\"sw-w0\"} 6",
            "aggswitch_port_xdp_fwd_refused_total{port=\"sw-w0\",reason=\"fwd_other_bridge\"} 7",
            "aggswitch_ring_rx_occupancy{port=\"sw-w0\",queue=\"0\"} 12",
            "aggswitch_malformed_total{kind=\"truncated\"} 3",
            "aggswitch_ring_kernel_rx_dropped_total{port=\"sw-w0\",queue=\"0\"} 2",
            "# TYPE aggswitch_ring_kernel_rx_dropped_total counter",
            "# TYPE aggswitch_job_window gauge",
            "aggswitch_spine_partials_sent_total{job=\"4\",tree=\"1\",spine=\"198.19.255.2:48879\"} 12",
            "aggswitch_spine_partials_resent_total{job=\"4\",tree=\"1\",spine=\"198.19.255.2:48879\"} 1",
            "aggswitch_spine_joined{job=\"4\",tree=\"1\",spine=\"198.19.255.2:48879\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in:\n{t}");
        }
    }
}
