//! The endpoint end to end (a real listener and client): every counter
//! rendered under its schema's name, the content switch, the limits,
//! refusals, and restarts after a panic.

use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use proto::switch::{
    CounterSchema, DropReason, JobCounters, JobDrops, SpineCounters, TableCounters,
};

use crate::admin::AdminCall;
use crate::dataplane::{DataplaneCounters, RingStats};
use crate::stats::{JobStats, PortStats, SpineStats, SwitchStats, ThreadSocket, ThreadStats};

use super::text_format::esc;
use super::*;

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
