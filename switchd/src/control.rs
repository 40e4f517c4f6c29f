//! The control thread: everything switchd does that is not moving packets.
//! Admin requests (switchctl, the metrics endpoint), the periodic summary
//! and stats file, BPF map reads, and the log of the job table's events,
//! rate-limited (at most one line per kind per second, with the count).
//!
//! Owns: [`ControlPlane`] (the admin channel's receiving end, the summary
//! state, the log limiter).
//!
//! Invariants: the table lock is held only to copy counters or to apply a
//! change; a job's slot pool is allocated with the lock released
//! ([`proto::switch::JobTable::reserve`]); nothing here can abort switchd:
//! an allocation failure is an error reply.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto::switch::{
    Event, JobConfig, JobConfigError, JobTable, RefusalSample, ResizeError, REFUSAL_KINDS,
};

use crate::admin::{AdminCall, AdminReply, AdminRequest};
use crate::dataplane::Shared;
use crate::ratelog::LogLimiter;
use crate::stats::{self, PortStats, SwitchStats};

/// How often the table's events are drained into the log.
const EVENT_EVERY: Duration = Duration::from_millis(100);

/// Kinds of rate-limited lines: refusals by kind
/// ([`proto::switch::Refusal::index`]), then dropped-events notices.
const LOG_KINDS: usize = REFUSAL_KINDS + 1;

/// What the control thread needs from main.
pub struct ControlConfig {
    pub summary_every: Duration,
    pub stats_file: Option<PathBuf>,
    pub default_elems: u16,
    /// Largest chunk the sockets take ([`crate::config::max_elems_per_chunk`]).
    pub max_elems: u16,
    /// `[switch] uplink` (jobs added with an upstream need it).
    pub uplink: Option<std::net::SocketAddrV4>,
    pub echo_mode: bool,
    pub xdp_drop: bool,
}

pub struct ControlPlane<'a> {
    shared: &'a Shared,
    cfg: ControlConfig,
    calls: mpsc::Receiver<AdminCall>,
    port_stats: &'a (dyn Fn() -> Vec<PortStats> + Sync),
    refresh_ports: &'a (dyn Fn() + Sync),
    limiter: LogLimiter<LOG_KINDS>,
    prev_bytes: HashMap<u16, u64>,
    prev_echoed: u64,
    prev_dropped: u64,
    prev_events_dropped: u64,
    prev_refusals: [u64; REFUSAL_KINDS],
    /// bad_ip_checksum, bad_udp_checksum, own_source at the last summary.
    prev_integrity: [u64; 3],
    last_summary: Instant,
}

impl<'a> ControlPlane<'a> {
    pub fn new(
        shared: &'a Shared,
        cfg: ControlConfig,
        calls: mpsc::Receiver<AdminCall>,
        port_stats: &'a (dyn Fn() -> Vec<PortStats> + Sync),
        refresh_ports: &'a (dyn Fn() + Sync),
    ) -> ControlPlane<'a> {
        ControlPlane {
            shared,
            cfg,
            calls,
            port_stats,
            refresh_ports,
            limiter: LogLimiter::new(),
            prev_bytes: HashMap::new(),
            prev_echoed: 0,
            prev_dropped: 0,
            prev_events_dropped: 0,
            prev_refusals: [0; REFUSAL_KINDS],
            prev_integrity: [0; 3],
            last_summary: Instant::now(),
        }
    }

    /// Serves until `stop` is set: admin requests as they come, the table's
    /// events every [`EVENT_EVERY`], the XDP program's view of the ports
    /// every [`crate::xdp::PORT_REFRESH_EVERY`], the summary every
    /// `summary_every`.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut next_summary = Instant::now() + self.cfg.summary_every;
        let mut next_refresh = Instant::now() + crate::xdp::PORT_REFRESH_EVERY;
        while !stop.load(Ordering::Relaxed) {
            match self.calls.recv_timeout(EVENT_EVERY) {
                Ok(AdminCall::Request { request, reply }) => {
                    let _ = reply.send(self.handle_admin(request));
                }
                Ok(AdminCall::Snapshot(reply)) => reply(self.snapshot()),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // No admin socket or metrics endpoint left: keep ticking.
                Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(EVENT_EVERY),
            }
            self.log_events();
            if Instant::now() >= next_refresh {
                (self.refresh_ports)();
                next_refresh = Instant::now() + crate::xdp::PORT_REFRESH_EVERY;
            }
            if Instant::now() >= next_summary {
                self.summary();
                next_summary = Instant::now() + self.cfg.summary_every;
            }
        }
        self.log_events();
    }

    /// Every counter, now.
    pub fn snapshot(&self) -> SwitchStats {
        snapshot(self.shared, (self.port_stats)())
    }

    fn log_events(&mut self) {
        let now = Instant::now();
        let (events, dropped, refusals, samples) = {
            let mut t = self.shared.table();
            let mut v = Vec::new();
            while let Some(e) = t.poll_event() {
                v.push(e);
            }
            let samples: [Option<RefusalSample>; REFUSAL_KINDS] =
                std::array::from_fn(|k| t.last_refusal(k));
            (v, t.counters.events_dropped, *t.refusals(), samples)
        };
        for e in events {
            log_event(e);
        }
        // Every refusal passes the limiter (exact counts in its lines); the
        // line shows the last one of its kind.
        for k in 0..REFUSAL_KINDS {
            let new = refusals[k].saturating_sub(self.prev_refusals[k]);
            self.prev_refusals[k] = refusals[k];
            let Some(r) = samples[k] else {
                continue;
            };
            if let Some(suppressed) = self.limiter.check_many(k, new, now) {
                let source = std::net::Ipv4Addr::from(r.ip);
                let (job, rank, why) = (r.job, r.rank, r.why);
                tracing::warn!(job, rank, %source, suppressed, "JOIN refused: {why}");
            }
        }
        if dropped > self.prev_events_dropped {
            if let Some(suppressed) = self.limiter.check(LOG_KINDS - 1, now) {
                tracing::warn!(
                    dropped = dropped - self.prev_events_dropped,
                    suppressed,
                    "events came faster than the log takes them; counters stay exact \
                     (switchctl stats)"
                );
            }
            self.prev_events_dropped = dropped;
        }
        self.limiter.flush(now, |kind, n| {
            let what = samples
                .get(kind)
                .copied()
                .flatten()
                .map_or_else(|| "events".to_string(), |r| r.why.to_string());
            tracing::warn!(suppressed = n, "{n} more refusals not logged: {what}");
        });
    }

    fn summary(&mut self) {
        let secs = self.last_summary.elapsed().as_secs_f64().max(1e-9);
        self.last_summary = Instant::now();
        let snap = self.snapshot();
        if self.cfg.echo_mode {
            let tx = snap.counter("echoed");
            tracing::info!(
                echoed = tx,
                tx_ring_full = snap.counter("tx_ring_full"),
                rx_frames = snap.counter("rx_frames"),
                "echo mode: {:.0} frames/s echoed",
                tx.saturating_sub(self.prev_echoed) as f64 / secs
            );
            self.prev_echoed = tx;
        }
        if self.cfg.xdp_drop {
            let dropped: u64 = snap.ports.iter().map(|p| p.xdp_dropped).sum();
            tracing::info!(
                dropped,
                "xdp-drop mode: {:.0} frames/s dropped",
                dropped.saturating_sub(self.prev_dropped) as f64 / secs
            );
            self.prev_dropped = dropped;
        }
        for j in &snap.jobs {
            let prev = self.prev_bytes.insert(j.id, j.counter("bytes_aggregated"));
            tracing::info!("{}", stats::summary_line(j, prev.unwrap_or(0), secs));
        }
        if snap.malformed_total > 0 || snap.counter("unknown_job") > 0 {
            tracing::info!(
                malformed = snap.malformed_total,
                unknown_job = snap.counter("unknown_job"),
                "dropped frames that belong to no job"
            );
        }
        self.log_integrity(&snap);
        if let Some(p) = &self.cfg.stats_file {
            if let Err(e) = write_stats(p, &snap) {
                tracing::warn!(path = %p.display(), "writing the stats file failed: {e}");
            }
        }
    }

    /// One line per summary at most, when frames were dropped for a wrong
    /// checksum or a spoofed source since the last one: what it likely
    /// means and what to do.
    fn log_integrity(&mut self, snap: &SwitchStats) {
        let mut now =
            ["bad_ip_checksum", "bad_udp_checksum", "own_source"].map(|k| snap.counter(k));
        // Those the XDP program dropped before they were steered or
        // forwarded, on any port.
        now[2] += snap
            .ports
            .iter()
            .map(|p| p.xdp_own_address_forged)
            .sum::<u64>();
        let new: Vec<u64> = now
            .iter()
            .zip(self.prev_integrity)
            .map(|(n, p)| n.saturating_sub(p))
            .collect();
        self.prev_integrity = now;
        if new[0] + new[1] > 0 {
            tracing::warn!(
                bad_ip_checksum = new[0],
                bad_udp_checksum = new[1],
                "frames with a wrong checksum dropped since the last summary: a sender \
                 that leaves checksums to offload on a veth (run `ethtool -K IFACE tx off` \
                 on the sender's interface) or corruption on the path"
            );
        }
        if new[2] > 0 {
            tracing::warn!(
                own_address_forged = new[2],
                "frames claiming one of this switch's own addresses as their source dropped \
                 since the last summary: a host on a switch port is spoofing, or a loop \
                 returns the switch's frames (per port: `switchctl stats`, \
                 own_address_forged)"
            );
        }
    }

    /// Answers one admin request.
    pub fn handle_admin(&self, req: AdminRequest) -> AdminReply {
        let to_json = |v: serde_json::Result<serde_json::Value>| match v {
            Ok(v) => AdminReply::ok(v),
            Err(e) => AdminReply::err(format!("encoding the reply: {e}")),
        };
        match req {
            AdminRequest::Stats { job: None } => to_json(serde_json::to_value(self.snapshot())),
            AdminRequest::Stats { job: Some(id) } => {
                let jobs = stats::job_stats(&self.shared.table());
                match jobs.into_iter().find(|j| j.id == id) {
                    Some(j) => to_json(serde_json::to_value(j)),
                    None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
                }
            }
            AdminRequest::Jobs => {
                let table = self.shared.table();
                let mut jobs: Vec<serde_json::Value> = table
                    .jobs()
                    .map(|j| {
                        serde_json::json!({
                            "id": j.id(),
                            "state": j.state().name(),
                            "n_workers": j.n_workers(),
                            "ranks_joined": j.joined_ranks(),
                            "pool_slots": j.config.pool_slots,
                            "elems_per_chunk": j.config.elems_per_chunk,
                            "dtype": j.config.dtype.name(),
                            "auth": j.auth().name(),
                            "stats": j.config.stats,
                            "window": j.window(),
                            "priority": j.priority().name(),
                            "declared_window": j.declared_window(),
                            "yielding": j.core().priority.outranked_now(),
                            "priority_marked": j.counters().priority_marked,
                            "pool_bytes": j.config.pool_bytes(),
                            "upstream": j.uplink().map(|u| serde_json::json!({
                                "leaf_index": u.cfg.leaf_index,
                                "n_leaves": u.cfg.n_leaves,
                                "spines": crate::stats::spine_stats(j, std::time::Instant::now()),
                            })),
                        })
                    })
                    .collect();
                jobs.sort_by_key(|j| j["id"].as_u64());
                AdminReply::ok(serde_json::Value::Array(jobs))
            }
            AdminRequest::AddJob { job } => {
                match job.to_job_config(self.cfg.default_elems, self.cfg.max_elems, self.cfg.uplink)
                {
                    Err(e) => AdminReply::err(e),
                    Ok(cfg) => match add_job(self.shared, cfg, self.cfg.max_elems) {
                        Ok(id) => AdminReply::ok(serde_json::json!({ "added": id })),
                        Err(e) => AdminReply::err(e.to_string()),
                    },
                }
            }
            AdminRequest::RemoveJob { id } => {
                let removed = self.shared.table().remove(id);
                match removed {
                    Some(job) => {
                        tracing::info!(
                            job = id,
                            chunks_completed = job.counters().chunks_completed,
                            "job removed; its workers get NACK 1 (unknown job)"
                        );
                        // Its pool is freed here, with the lock released.
                        drop(job);
                        AdminReply::ok(serde_json::json!({ "removed": id }))
                    }
                    None => AdminReply::err(format!("no job {id} (switchctl jobs lists them)")),
                }
            }
            AdminRequest::ResizeJob { id, n_workers } => {
                match resize_job(self.shared, id, n_workers) {
                    Ok(resized) => AdminReply::ok(serde_json::json!({
                        "resized": id,
                        "n_workers": n_workers,
                        "changed": resized,
                    })),
                    Err(e) => AdminReply::err(e.to_string()),
                }
            }
        }
    }
}

/// Changes job `id`'s worker count to `n`: checked and charged under the
/// table lock, the new pool allocated without it, swapped in under it if
/// the job is still between collectives; whichever pool is let go is freed
/// with the lock released. False: the job had `n` workers already.
pub fn resize_job(shared: &Shared, id: u16, n: u16) -> Result<bool, ResizeError> {
    let Some(r) = shared.table().reserve_resize(id, n)? else {
        return Ok(false);
    };
    let built = match r.build() {
        Ok(b) => b,
        Err(e) => {
            shared.table().release_resize(r);
            return Err(e.into());
        }
    };
    let swapped = shared.table().resize(r, built);
    match swapped {
        Ok(old) => {
            drop(old);
            Ok(true)
        }
        Err((e, new)) => {
            drop(new);
            Err(e)
        }
    }
}

/// Declares a job: checked and charged against the pool budget under the
/// table lock, allocated without it, inserted under it. `max_elems` is
/// the largest chunk the sockets take.
pub fn add_job(shared: &Shared, cfg: JobConfig, max_elems: u16) -> Result<u16, JobConfigError> {
    let (id, n) = (cfg.id, cfg.n_workers);
    let r = shared.table().reserve(&cfg, max_elems)?;
    match r.build(cfg) {
        Ok(job) => {
            shared.table().insert(r, job);
            tracing::info!(job = id, n_workers = n, "job added");
            Ok(id)
        }
        Err(e) => {
            shared.table().release(r);
            Err(e)
        }
    }
}

/// Declares the configured jobs into a table before the dataplane starts.
pub fn declare_jobs(
    table: &mut JobTable,
    jobs: &[JobConfig],
    max_elems: u16,
) -> Result<(), JobConfigError> {
    for j in jobs {
        table.add(j.clone(), max_elems)?;
    }
    Ok(())
}

fn log_event(e: Event) {
    match e {
        Event::RankJoined {
            job,
            rank,
            joined,
            of,
        } => tracing::info!(job, rank, joined, of, "rank joined"),
        Event::JobActive { job, ranks, resume } => tracing::info!(
            job,
            ranks,
            resume_collective = resume.0,
            resume_seq = resume.1,
            "job active: every rank joined"
        ),
        Event::JobResized {
            job,
            from,
            to,
            resume,
        } => tracing::info!(
            job,
            from,
            to,
            resume_collective = resume.0,
            resume_seq = resume.1,
            "job resized: every rank joins again with the new worker count"
        ),
        Event::JobReset { job, rank } => tracing::info!(
            job,
            rank,
            "rank joined anew (worker restarted): every rank joins again"
        ),
        Event::SpineSilent {
            job,
            tree,
            spine,
            silent,
        } => tracing::warn!(
            job,
            tree,
            %spine,
            silent_s = silent.as_secs_f64(),
            "spine silent while partials wait for it: the job's chunks of this tree stall; \
             check that switch is running and reachable from this leaf (ranks get an error \
             naming it after their stall timeout)"
        ),
        Event::JobProvisioned {
            job,
            label,
            n_workers,
            lease,
        } => tracing::info!(
            job,
            tenant = %label.tenant_str(),
            name = %label.job_str(),
            n_workers,
            lease_s = lease.as_secs(),
            "job provisioned by its tenant's worker"
        ),
        Event::JobEnded { job, label, why } => tracing::info!(
            job,
            tenant = %label.tenant_str(),
            name = %label.job_str(),
            why = why.name(),
            "provisioned job ended; its pool memory is back in the budget"
        ),
        Event::SpineAnswering { job, tree, spine } => {
            tracing::info!(job, tree, %spine, "spine answers again")
        }
        Event::SpineRefused {
            job,
            tree,
            spine,
            why,
        } => tracing::warn!(
            job,
            tree,
            %spine,
            "spine refuses this leaf: {why}; fix the job's declaration on the leaf or the \
             spine (this leaf asks again every second)"
        ),
    }
}

/// A full counter snapshot.
pub fn snapshot(shared: &Shared, ports: Vec<PortStats>) -> SwitchStats {
    let dp = shared.dataplane_counters();
    let threads = stats::thread_stats(&dp.threads, &ports);
    let table = shared.table();
    let mut s = stats::snapshot(&table, &dp.total, ports, shared.uptime().as_secs_f64());
    s.rings = dp.rings;
    s.threads = threads;
    s
}

/// Writes `s` as JSON to `path` ([`stats::write_stats_file`]: atomic, never
/// through a symlink, mode 0640).
pub fn write_stats(path: &Path, s: &SwitchStats) -> std::io::Result<()> {
    stats::write_stats_file(path, s)
}
