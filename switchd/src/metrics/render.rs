//! Rendering a switch stats snapshot as `/metrics`' body: the per-job and
//! per-spine series, the switch-wide ones (ports, sockets, dataplane
//! threads, the table, gauges), and the endpoint's own counters.
//!
//! Invariant: counters are walked through their schemas and the fields of
//! [`SwitchStats`], never looked up by name, so a renamed counter renders
//! under its new name and a renamed field fails to compile.

use proto::switch::{DropReason, JobCounters, Priority, SpineCounters};

use crate::dataplane::DataplaneCounters;
use crate::stats::SwitchStats;

use super::counters::EndpointCounters;
use super::limits::Content;
use super::text_format::{esc, family, sample, schema_families};

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
pub(super) fn render_endpoint(o: &mut String, endpoint: &EndpointCounters) {
    schema_families(o, "aggswitch_metrics_", &[(String::new(), endpoint)]);
}

/// Everything of [`render`] but the endpoint's own counters.
pub(super) fn render_switch(s: &SwitchStats, content: Content) -> String {
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
