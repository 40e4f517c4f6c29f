//! `switchd`: run the aggregation switch.
//!
//! * `switchd run --config FILE [--stats-file PATH]`: attach to the ports,
//!   serve the jobs, log a summary per job every few seconds, and on
//!   SIGINT/SIGTERM detach everything and write the final counters.
//! * `switchd check-config --config FILE`: validate a configuration.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use proto::switch::JobTable;
use switchd::config::{AttachModeSetting, Config, FRAME_SIZE};
use switchd::dataplane::{Dataplane, RxSocket};
use switchd::stats::{self, PortStats};
use switchd::xdp::{self, AttachMode, SteeringProgram, XskConfig};

#[derive(Parser)]
#[command(version, about = "In-network aggregation switch on AF_XDP")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Attach to the configured ports and serve the configured jobs.
    Run {
        #[arg(long)]
        config: PathBuf,
        /// Write every counter as JSON here, every summary interval and at exit.
        #[arg(long)]
        stats_file: Option<PathBuf>,
    },
    /// Check a configuration file and print what it declares.
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
}

fn write_stats(path: &Path, s: &stats::SwitchStats) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(s)?)
        .with_context(|| format!("writing stats file {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

fn port_stats(prog: &SteeringProgram, ports: &[String]) -> Vec<PortStats> {
    ports
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let c = prog.counters(i as u32).unwrap_or_default();
            PortStats {
                name: name.clone(),
                xdp_steered: c.steered,
                xdp_passed: c.passed,
                xdp_malformed: c.malformed,
            }
        })
        .collect()
}

fn run(config_path: &Path, stats_file: Option<PathBuf>) -> Result<()> {
    let cfg = Config::load(config_path)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "switchd must run as root: it loads an XDP program and opens AF_XDP sockets \
             (sudo switchd run --config {})",
            config_path.display()
        );
    }
    for p in &cfg.switch.ports {
        if !Path::new("/sys/class/net").join(p).exists() {
            bail!(
                "no such interface `{p}` (listed in switch.ports of {}); `ip link` shows the \
                 interfaces of this network namespace",
                config_path.display()
            );
        }
    }
    let gen = loop {
        let g: u32 = rand::random();
        if g != 0 {
            break g;
        }
    };
    let mut table = JobTable::new(gen);
    for j in &cfg.jobs {
        table
            .add(j.clone(), switchd::config::MAX_ELEMS_IN_FRAME)
            .with_context(|| format!("declaring job {}", j.id))?;
    }

    let mut prog = SteeringProgram::load(&cfg.switch.addresses, cfg.switch.agg_port)
        .context("loading the XDP steering program")?;
    let xcfg = XskConfig {
        frame_count: cfg.switch.frames_per_socket,
        ring_size: (cfg.switch.frames_per_socket / 2).min(4096),
        zero_copy: cfg.switch.zero_copy,
        frame_size: FRAME_SIZE as u32,
    };
    let mut rxs = Vec::new();
    let mut txs = Vec::new();
    for (i, port) in cfg.switch.ports.iter().enumerate() {
        let mut port_txs = Vec::new();
        for q in 0..cfg.switch.queues {
            let (rx, tx) = xdp::open_xsk(port, q, &xcfg)
                .with_context(|| format!("opening AF_XDP socket on {port} queue {q}"))?;
            prog.register_socket(i as u32, q, rx.fd())
                .with_context(|| format!("registering the socket of {port} queue {q}"))?;
            rxs.push(RxSocket {
                port_idx: i as u32,
                queue: q,
                rx,
            });
            port_txs.push(tx);
        }
        txs.push(port_txs);
    }
    let mode = match cfg.switch.attach_mode {
        AttachModeSetting::Auto => AttachMode::Auto,
        AttachModeSetting::Driver => AttachMode::Driver,
        AttachModeSetting::Skb => AttachMode::Skb,
    };
    for (i, port) in cfg.switch.ports.iter().enumerate() {
        if let Err(e) = prog.attach(port, i as u32, mode) {
            let _ = prog.detach_all();
            return Err(e).with_context(|| format!("attaching to {port}"));
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handler")?;
    }
    tracing::info!(
        generation = format_args!("{gen:#010x}"),
        ports = ?cfg.switch.ports,
        addresses = ?cfg.switch.addresses,
        agg_port = cfg.switch.agg_port,
        jobs = cfg.jobs.len(),
        "switchd ready"
    );

    let started = Instant::now();
    let default_elems =
        switchd::config::default_elems_per_chunk(&cfg.switch.ports, switchd::config::sysfs_mtu);
    let mut dp = Dataplane::new(table, rxs, txs, cfg.switch.agg_port, default_elems);
    dp.set_ecn_threshold(cfg.switch.ecn_ring_threshold, xcfg.ring_size);
    let (admin_tx, admin_rx) = std::sync::mpsc::channel();
    dp.set_admin(admin_rx);
    let _metrics = match cfg.switch.metrics_listen {
        Some(addr) => match switchd::metrics::serve(addr, admin_tx.clone()) {
            Ok(m) => Some(m),
            Err(e) => {
                let _ = prog.detach_all();
                return Err(e).context("starting the metrics endpoint");
            }
        },
        None => None,
    };
    let _admin = match switchd::admin::serve(&cfg.switch.admin_socket, admin_tx) {
        Ok(a) => Some(a),
        Err(e) => {
            let _ = prog.detach_all();
            return Err(e).context("starting the admin interface");
        }
    };
    let every = Duration::from_secs_f64(cfg.switch.summary_interval_secs.max(0.1));
    let mut prev_bytes: std::collections::HashMap<u16, u64> = Default::default();
    let mut last_tick = Instant::now();
    let ports = cfg.switch.ports.clone();
    let ports_of = || port_stats(&prog, &ports);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dp.run(
            &stop,
            every,
            |dp| {
                let secs = last_tick.elapsed().as_secs_f64();
                last_tick = Instant::now();
                let snap = dp.snapshot(port_stats(&prog, &ports));
                for j in &snap.jobs {
                    let prev = prev_bytes.insert(j.id, j.bytes_aggregated).unwrap_or(0);
                    tracing::info!("{}", stats::summary_line(j, prev, secs));
                }
                if snap.malformed_total > 0 || snap.unknown_job > 0 {
                    tracing::info!(
                        malformed = snap.malformed_total,
                        unknown_job = snap.unknown_job,
                        "dropped frames that belong to no job"
                    );
                }
                if let Some(p) = &stats_file {
                    if let Err(e) = write_stats(p, &snap) {
                        tracing::warn!("{e:#}");
                    }
                }
            },
            &ports_of,
        )
    }));

    tracing::info!("stopping: detaching XDP programs");
    let detach = prog.detach_all();
    let snap = dp.snapshot(port_stats(&prog, &ports));
    for j in &snap.jobs {
        tracing::info!(
            "final: {}",
            stats::summary_line(j, 0, started.elapsed().as_secs_f64())
        );
    }
    if let Some(p) = &stats_file {
        write_stats(p, &snap)?;
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    detach.context("detaching XDP programs")?;
    Ok(())
}

fn check_config(path: &Path) -> Result<()> {
    let cfg = Config::load(path)?;
    println!(
        "{}: ok: {} ports, addresses {:?}, aggregation port {}",
        path.display(),
        cfg.switch.ports.len(),
        cfg.switch.addresses,
        cfg.switch.agg_port
    );
    for j in &cfg.jobs {
        println!(
            "  job {}: {} workers, {} slots, {} elements per chunk, window {}",
            j.id, j.n_workers, j.pool_slots, j.elems_per_chunk, j.window
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let r = match Cli::parse().cmd {
        Cmd::Run { config, stats_file } => run(&config, stats_file),
        Cmd::CheckConfig { config } => check_config(&config),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchd: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
