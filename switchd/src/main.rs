//! `switchd`: run the aggregation switch.
//!
//! * `switchd run --config FILE [--stats-file PATH]`: attach to the ports,
//!   serve the jobs, log a summary per job every few seconds, and on
//!   SIGINT/SIGTERM detach everything and write the final counters.
//! * `switchd check-config --config FILE`: validate a configuration.
//! * `switchd testbed-config --env FILE --job ID:WORKERS:SECRET
//!   [--tenant NAME:KEYFILE] …`: write a
//!   config for a `scripts/testbed.sh` testbed ([`switchd::testbed_config`]);
//!   with `--topology leaf-spine --role leaf:I|spine:J`, for one switch of
//!   a leaf-spine testbed.
//!
//! A dataplane thread stuck with work pending ([`switchd::watchdog`]) ends
//! the process with status 70, for its supervisor to restart it.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use proto::switch::{human_bytes, JobTable, TableConfig};
use switchd::config::{
    AttachModeSetting, Config, DataplaneMode, ForwardingSetting, UmemHugePages, FRAME_SIZE,
};
use switchd::control::{self, ControlConfig, ControlPlane};
use switchd::dataplane::{self, DataplaneConfig, Socket};
use switchd::stats::{self, PortStats};
use switchd::watchdog;
use switchd::xdp::{self, AttachMode, ProgramOptions, SteeringProgram, XskConfig, XskError};

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
    /// Write a config for a scripts/testbed.sh testbed: its addresses from
    /// the testbed's `--print-env` lines, switchd's typed sections, checked
    /// overrides. Mode 0600 (it holds secrets).
    TestbedConfig {
        /// The testbed's `scripts/testbed.sh up --print-env` output.
        #[arg(long)]
        env: PathBuf,
        /// Where to write the config.
        #[arg(long)]
        out: PathBuf,
        /// A job: ID:WORKERS:SECRET, WORKERS `all` or e.g. `0-1,3`, SECRET
        /// `env:NAME` or `file:PATH` (repeat for several jobs; none: a
        /// switch that only forwards until `switchctl job add`).
        #[arg(long = "job")]
        jobs: Vec<switchd::testbed_config::JobSpec>,
        /// A tenant: NAME:KEYFILE (repeat for several; the job id range is
        /// then split among them). On a leaf-spine testbed it goes on every
        /// switch, the leaves' with [tenant.upstream].
        #[arg(long = "tenant")]
        tenants: Vec<switchd::testbed_config::TenantSpec>,
        /// switch.KEY=VALUE or job.ID.KEY=VALUE (VALUE in TOML, or a bare
        /// string), checked against switchd's config (repeat).
        #[arg(long = "set")]
        sets: Vec<switchd::testbed_config::Override>,
        /// Attach to the plain hosts' ports too (sw-hJ).
        #[arg(long)]
        host_ports: bool,
        /// Who is writing (the script's name), for the file's first line.
        #[arg(long, default_value = "switchd testbed-config")]
        writer: String,
        /// `single` (one switch, `testbed.sh up --workers N`) or
        /// `leaf-spine` (one switch of `testbed.sh up --leaves L --spines
        /// K`, named by --role).
        #[arg(long, value_enum, default_value = "single")]
        topology: Topology,
        /// With --topology leaf-spine: the switch, `leaf:I` or `spine:J`.
        #[arg(long)]
        role: Option<switchd::testbed_config::Role>,
        /// With --topology leaf-spine: the spines the leaves send their
        /// partials to are 0..TREES (default: every spine).
        #[arg(long)]
        trees: Option<u16>,
        /// With --topology leaf-spine: the spines' aggregation port.
        #[arg(long, default_value_t = 48879)]
        agg_port: u16,
        /// With --topology leaf-spine: the port of a leaf's uplink address.
        #[arg(long, default_value_t = 40000)]
        uplink_port: u16,
    },
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
                xdp_dropped: c.dropped,
                xdp_forwarded: c.forwarded,
                xdp_own_address_forged: c.own_address_forged,
                xdp_fwd_refused: xdp::REFUSAL_NAMES.into_iter().zip(c.refusals()).collect(),
            }
        })
        .collect()
}

fn run(config_path: &Path, stats_file: Option<PathBuf>) -> Result<()> {
    let cfg = Config::load(config_path)?;
    if let Some(w) = switchd::config::secrets_exposure(config_path, &cfg) {
        tracing::warn!("{w}");
    }
    for w in &cfg.key_warnings {
        tracing::warn!("{w}");
    }
    for w in cfg.layout_warnings() {
        tracing::warn!("{w}");
    }
    if let Some(w) = check_metrics_exposure(config_path, &cfg)? {
        tracing::warn!("{w}");
    }
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
    let budget = cfg.switch.pool_budget_bytes();
    let max_elems = switchd::config::max_elems_per_chunk(cfg.multi_buffer);
    let default_elems =
        switchd::config::default_elems_per_chunk(&cfg.switch.ports, switchd::config::sysfs_mtu);
    let mut table_cfg = TableConfig::new(gen, rand::random());
    table_cfg.pool_budget = budget;
    table_cfg.seq_lanes = cfg.switch.seq_lanes;
    // A provisioned job's chunk is what a declared job gets when it leaves
    // elems_per_chunk out (JobSection::to_job_config): the ports' MTU,
    // capped by what the sockets take.
    table_cfg.max_f32_elems = default_elems.min(max_elems);
    // An auth = "mac" job's tagged RESULT leaves from one TX frame, as a
    // declared one's (JobSection::to_job_config).
    table_cfg.max_f32_elems_mac = table_cfg
        .max_f32_elems
        .min(switchd::config::MAX_ELEMS_IN_FRAME);
    let mut table = JobTable::new(table_cfg, Instant::now());
    control::declare_jobs(&mut table, &cfg.jobs, max_elems)
        .context("declaring the configured jobs")?;
    control::declare_tenants(&mut table, &cfg.tenants)
        .context("declaring the configured tenants")?;

    let xdp_drop = cfg.switch.mode == DataplaneMode::XdpDrop;
    let forward = cfg.switch.forwarding == ForwardingSetting::Xdp;
    if forward {
        warn_veth_checksum_offload(&cfg.switch.ports);
    }
    let mut prog = SteeringProgram::load_with(
        &cfg.switch.addresses,
        &ProgramOptions {
            agg_port: cfg.switch.agg_port,
            seq_lanes: cfg.switch.seq_lanes,
            drop_steerable: xdp_drop,
            forward,
        },
    )
    .context("loading the XDP steering program")?;
    // Frames to the bridge's (or any local interface's) MAC are for the
    // switch itself: the fast path leaves them to the stack. Frames *from*
    // one of them are forged or looped: dropped at ingress, in every
    // forwarding mode (`own_address_forged`).
    for mac in xdp::local_macs() {
        prog.add_local_mac(mac)
            .context("registering the switch's own MAC addresses")?;
    }
    // In xdp-drop mode the program drops what it would steer: no sockets.
    let socket_ports: &[String] = if xdp_drop { &[] } else { &cfg.switch.ports };
    let plan = cfg
        .umem_plan(switchd::config::HugePagePool::read().as_ref())
        .map_err(anyhow::Error::msg)?;
    if let Some(note) = &plan.note {
        tracing::info!("{note}");
    }
    let mut xcfg = XskConfig {
        frame_count: cfg.switch.frames_per_socket,
        ring_size: (cfg.switch.frames_per_socket / 2).min(4096),
        zero_copy: cfg.switch.zero_copy,
        frame_size: FRAME_SIZE as u32,
        multi_buffer: cfg.multi_buffer,
        huge_pages: plan.huge_pages,
    };
    tracing::info!(
        multi_buffer = cfg.multi_buffer,
        huge_pages = plan.huge_pages,
        huge_pages_taken = plan.pages,
        max_elems_per_chunk = max_elems,
        "AF_XDP sockets {}",
        if cfg.multi_buffer {
            "bound with XDP_USE_SG: a port MTU above one page, packets may span several frames"
        } else {
            "one frame per packet (every port MTU fits one page)"
        }
    );
    let mut sockets = Vec::new();
    for (i, port) in socket_ports.iter().enumerate() {
        for q in 0..cfg.switch.queues {
            let opened = match xdp::open_xsk(port, q, &xcfg) {
                // The pool had the pages when planned; someone took them
                // since. `auto`: this socket and the rest go without.
                Err(e @ XskError::HugePages { .. })
                    if cfg.switch.umem_huge_pages == UmemHugePages::Auto =>
                {
                    tracing::warn!(
                        "{e}; {port} queue {q} and the sockets after it on 4 KiB pages instead"
                    );
                    xcfg.huge_pages = false;
                    xdp::open_xsk(port, q, &xcfg)
                }
                r => r,
            };
            let (rx, tx) =
                opened.with_context(|| format!("opening AF_XDP socket on {port} queue {q}"))?;
            prog.register_socket(i as u32, q, rx.fd())
                .with_context(|| format!("registering the socket of {port} queue {q}"))?;
            sockets.push(Socket {
                port_idx: i as u32,
                queue: q,
                rx,
                tx,
            });
        }
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

    let started = Instant::now();
    let threads = cfg.switch.dataplane_threads as usize;
    let uplink = match cfg.switch.uplink {
        None => None,
        Some(addr) => Some(dataplane::uplink::open(addr).with_context(|| {
            format!(
                "opening the uplink socket on {addr} ([switch] uplink must be one of this \
                 switch's own addresses, with a free UDP port)"
            )
        })?),
    };
    let (shared, lanes) = dataplane::build(
        table,
        sockets,
        DataplaneConfig {
            agg_port: cfg.switch.agg_port,
            seq_lanes: cfg.switch.seq_lanes,
            ecn_ring_fraction: cfg.switch.ecn_ring_threshold,
            ring_size: xcfg.ring_size,
            threads,
            echo: cfg.switch.mode == DataplaneMode::Echo,
            uplink,
            own: dataplane::OwnAddresses::new(
                cfg.switch
                    .addresses
                    .iter()
                    .map(|a| a.octets())
                    .chain(cfg.switch.uplink.map(|u| u.ip().octets())),
                xdp::local_macs(),
            ),
        },
    )
    .context("creating the dataplane threads' wake-up eventfds")?;
    let (admin_tx, admin_rx) = std::sync::mpsc::channel();
    let content = switchd::metrics::Content {
        per_job: cfg.switch.metrics_per_job,
    };
    let _metrics = match cfg.switch.metrics_listen.addr() {
        Some(addr) => match switchd::metrics::serve(addr, admin_tx.clone(), content) {
            Ok(m) => Some(m),
            // The default port may be another service's (node_exporter's
            // is 9100 too): switchd runs on without /metrics.
            Err(e) if e.is_bind() && cfg.switch.metrics_listen.is_default() => {
                tracing::warn!(
                    "metrics endpoint: cannot listen on {addr}, the default of \
                     switch.metrics_listen ({}); switchd runs on without /metrics. Set \
                     [switch] metrics_listen = \"ADDR:PORT\" (a free port on a management \
                     address) to serve it there, or metrics_listen = \"off\"",
                    e.cause()
                );
                None
            }
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
    // "ready" only once every listener is up: scripts and tests wait for it.
    tracing::info!(
        generation = format_args!("{gen:#010x}"),
        ports = ?cfg.switch.ports,
        addresses = ?cfg.switch.addresses,
        agg_port = cfg.switch.agg_port,
        jobs = cfg.jobs.len(),
        tenants = cfg.tenants.len(),
        mode = ?cfg.switch.mode,
        forwarding = ?cfg.switch.forwarding,
        pool_memory = %human_bytes(budget),
        "switchd ready"
    );
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let pin = |idx: usize| {
        if cfg.switch.pin_threads && !cores.is_empty() {
            let core = cores[idx % cores.len()];
            if !core_affinity::set_for_current(core) {
                tracing::warn!(
                    thread = idx,
                    core = core.id,
                    "could not pin dataplane thread"
                );
            }
        }
    };
    let mut lane_sockets = Vec::new();
    for lane in &lanes {
        let names: Vec<String> = lane
            .sockets()
            .iter()
            .map(|(p, q)| format!("{}/{q}", cfg.switch.ports[*p as usize]))
            .collect();
        tracing::info!(
            thread = lane.index(),
            pinned = cfg.switch.pin_threads,
            sockets = ?names,
            "dataplane thread"
        );
        lane_sockets.push(names);
    }
    let _watchdog = watchdog::spawn(
        shared.clone(),
        watchdog::WatchdogConfig {
            limit: Duration::from_secs_f64(cfg.switch.watchdog_secs),
            sockets: lane_sockets,
        },
        stop.clone(),
    )
    .context("starting the dataplane watchdog thread")?;
    let every = Duration::from_secs_f64(cfg.switch.summary_interval_secs.max(0.1));
    let ports = cfg.switch.ports.clone();
    let ports_of = || port_stats(&prog, &ports);
    // The fast path's view of the bridges (port state, membership, VLAN
    // settings) follows the kernel's within a second.
    let refresh_ports = || {
        if let Err(e) = prog.refresh_ports() {
            tracing::warn!("refreshing the XDP fast path's view of the bridges: {e}");
        }
    };
    let mut control_plane = ControlPlane::new(
        &shared,
        ControlConfig {
            summary_every: every,
            stats_file: stats_file.clone(),
            default_elems,
            max_elems,
            uplink: cfg.switch.uplink,
            echo_mode: cfg.switch.mode == DataplaneMode::Echo,
            xdp_drop,
        },
        admin_rx,
        &ports_of,
        &refresh_ports,
    );
    let result = std::thread::scope(|scope| {
        let lanes: Vec<_> = lanes
            .into_iter()
            .map(|mut lane| {
                let stop = &stop;
                let pin = &pin;
                std::thread::Builder::new()
                    .name(format!("dataplane-{}", lane.index()))
                    .spawn_scoped(scope, move || {
                        pin(lane.index());
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            lane.run(stop)
                        }));
                        // One thread down stops them all: detach and exit.
                        stop.store(true, std::sync::atomic::Ordering::SeqCst);
                        r
                    })
                    .expect("spawning a dataplane thread")
            })
            .collect();
        // This thread is the control plane (not pinned: it sleeps mostly).
        let r0 =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| control_plane.run(&stop)));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if shared.stalled() {
            // The stuck thread never returns, so it cannot be joined: write
            // what can be written and exit (the kernel releases the XDP
            // links and sockets with the process).
            final_counters(&shared, &prog, &ports, stats_file.as_deref(), started);
            watchdog::exit_for_restart();
        }
        let mut result = r0;
        for h in lanes {
            match h.join() {
                Ok(Err(p)) | Err(p) => result = Err(p),
                Ok(Ok(())) => {}
            }
        }
        result
    });

    tracing::info!("stopping: detaching XDP programs");
    let detach = prog.detach_all();
    if let Some((p, e)) = final_counters(&shared, &prog, &ports, stats_file.as_deref(), started) {
        return Err(e).with_context(|| format!("writing the stats file {}", p.display()));
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    // A management thread its supervisor gave up on stopped switchd: exit
    // non-zero so that switchd's own supervisor restarts it.
    let gave_up = _metrics.as_ref().and_then(|m| m.failed());
    if let Some(why) = gave_up.or_else(|| _admin.as_ref().and_then(|a| a.failed())) {
        detach.context("detaching XDP programs")?;
        bail!("{why}");
    }
    detach.context("detaching XDP programs")?;
    Ok(())
}

/// Logs every job's final summary and writes the stats file; returns the
/// path and error if that write failed.
fn final_counters<'a>(
    shared: &switchd::dataplane::Shared,
    prog: &SteeringProgram,
    ports: &[String],
    stats_file: Option<&'a Path>,
    started: Instant,
) -> Option<(&'a Path, std::io::Error)> {
    let snap = control::snapshot(shared, port_stats(prog, ports));
    for j in &snap.jobs {
        tracing::info!(
            "final: {}",
            stats::summary_line(j, 0, started.elapsed().as_secs_f64())
        );
    }
    let p = stats_file?;
    control::write_stats(p, &snap).err().map(|e| (p, e))
}

/// The file's `metrics_listen` against the addresses this machine has on
/// the switch's ports and their bridges now (the file alone was checked at
/// load): an error when the workers' network reaches it and the operator
/// did not allow that, else the warning to give when allowed.
fn check_metrics_exposure(path: &Path, cfg: &Config) -> Result<Option<String>> {
    let interfaces = switchd::exposure::data_interfaces(&cfg.switch.ports);
    cfg.switch
        .check_metrics_exposure(&interfaces)
        .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
}

fn check_config(path: &Path) -> Result<()> {
    let cfg = Config::load(path)?;
    if let Some(w) = switchd::config::secrets_exposure(path, &cfg) {
        tracing::warn!("{w}");
    }
    for w in &cfg.key_warnings {
        eprintln!("{}: warning: {w}", path.display());
    }
    if let Some(w) = check_metrics_exposure(path, &cfg)? {
        eprintln!("{}: warning: {w}", path.display());
    }
    println!(
        "{}: ok: {} ports, addresses {:?}, aggregation port {}, slot-pool memory budget {}",
        path.display(),
        cfg.switch.ports.len(),
        cfg.switch.addresses,
        cfg.switch.agg_port,
        human_bytes(cfg.switch.pool_budget_bytes())
    );
    println!(
        "  dataplane: {} ports × {} queues = {} AF_XDP sockets over {} threads",
        cfg.switch.ports.len(),
        cfg.switch.queues,
        cfg.switch.ports.len() as u32 * cfg.switch.queues,
        cfg.switch.dataplane_threads
    );
    if cfg.switch.seq_lanes > 1 {
        let (port, lanes) = (cfg.switch.agg_port, cfg.switch.seq_lanes);
        let queues = cfg.switch.queues.max(1);
        println!(
            "  seq lanes: {lanes}: DATA of chunk seq s on UDP port {port} + s mod {lanes} \
             ({port}..={}); on a NIC, steer lane l to queue l mod {queues}:",
            port + (lanes - 1)
        );
        for p in &cfg.switch.ports {
            println!(
                "    ethtool -K {p} ntuple on; for l in $(seq 0 {}); do ethtool -N {p} \
                 flow-type udp4 dst-port $(({port} + l)) action $((l % {queues})); done",
                lanes - 1
            );
        }
    }
    // Warnings, not errors: the layout runs, but wastes cores or traffic.
    for w in cfg.layout_warnings() {
        eprintln!("{}: warning: {w}", path.display());
    }
    println!(
        "  AF_XDP sockets: {} (chunks up to {} elements)",
        if cfg.multi_buffer {
            "multi-buffer (XDP_USE_SG): a port MTU is above 3500; needs AF_XDP multi-buffer \
             (Linux 6.6 or later in copy mode)"
        } else {
            "one frame per packet: every port MTU is 3500 or less"
        },
        switchd::config::max_elems_per_chunk(cfg.multi_buffer)
    );
    let pool = switchd::config::HugePagePool::read();
    match cfg.umem_plan(pool.as_ref()) {
        Ok(plan) if plan.huge_pages => println!(
            "  UMEM: on 2 MiB huge pages, {} of the {} free now",
            plan.pages,
            pool.map_or(0, |p| p.available())
        ),
        Ok(plan) => println!(
            "  UMEM: on 4 KiB pages{}",
            plan.note.map(|n| format!(": {n}")).unwrap_or_default()
        ),
        // A config that cannot start here, but is not wrong: the pool is
        // the machine's, and may be reserved before switchd starts.
        Err(e) => eprintln!("{}: warning: {e}", path.display()),
    }
    match cfg.switch.metrics_listen.addr() {
        None => println!("  metrics: off"),
        Some(addr) => println!(
            "  metrics: http://{addr}/metrics{}, {}",
            if cfg.switch.metrics_listen.is_default() {
                " (the default; if the port is taken switchd runs without it)"
            } else {
                ""
            },
            if cfg.switch.metrics_per_job {
                "per-job series included"
            } else {
                "without per-job series"
            }
        ),
    }
    for j in &cfg.jobs {
        println!(
            "  job {}: {} workers, {} slots, {} {} elements per chunk, window {}, pool {}, \
             auth {}",
            j.id,
            j.n_workers,
            j.pool_slots,
            j.elems_per_chunk,
            j.dtype,
            j.window,
            human_bytes(j.pool_bytes()),
            j.auth
        );
    }
    for t in &cfg.tenants {
        println!("  tenant {}", switchd::tenants::describe(t));
    }
    if cfg.jobs.is_empty() && cfg.tenants.is_empty() {
        println!(
            "  no jobs and no tenants: the switch forwards until `switchctl job add` or \
             `switchctl tenant add`"
        );
    }
    Ok(())
}

/// The testbed shape `switchd testbed-config` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Topology {
    Single,
    LeafSpine,
}

fn testbed_config(
    env: &Path,
    out: &Path,
    req: switchd::testbed_config::Request,
    fabric: Option<switchd::testbed_config::Fabric>,
) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let text = std::fs::read_to_string(env)
        .with_context(|| format!("reading the testbed env {}", env.display()))?;
    let env = switchd::testbed_config::TestbedEnv::parse(&text)?;
    let config = match fabric {
        None => switchd::testbed_config::write(&env, &req)?,
        Some(f) => switchd::testbed_config::write_leaf_spine(&env, &req, &f)?,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    f.write_all(config.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let r = match Cli::parse().cmd {
        Cmd::Run { config, stats_file } => run(&config, stats_file),
        Cmd::CheckConfig { config } => check_config(&config),
        Cmd::TestbedConfig {
            env,
            out,
            jobs,
            tenants,
            sets,
            host_ports,
            writer,
            topology,
            role,
            trees,
            agg_port,
            uplink_port,
        } => {
            let fabric = match (topology, role) {
                (Topology::LeafSpine, Some(role)) => Ok(Some(switchd::testbed_config::Fabric {
                    role,
                    trees,
                    agg_port,
                    uplink_port,
                })),
                (Topology::LeafSpine, None) => Err(anyhow::anyhow!(
                    "--topology leaf-spine needs --role leaf:I or spine:J"
                )),
                (Topology::Single, _) if role.is_some() || trees.is_some() => Err(anyhow::anyhow!(
                    "--role and --trees are for --topology leaf-spine"
                )),
                (Topology::Single, _) => Ok(None),
            };
            fabric.and_then(|fabric| {
                testbed_config(
                    &env,
                    &out,
                    switchd::testbed_config::Request {
                        writer,
                        host_ports,
                        jobs,
                        tenants,
                        overrides: sets,
                    },
                    fabric,
                )
            })
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchd: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A veth peer that leaves TCP/UDP checksums to offload hands the switch
/// frames whose checksum is only a pseudo-header sum; the bridge carries that
/// state along, an XDP redirect cannot, so forwarded segments arrive with bad
/// checksums and are dropped (ping still works). switchd cannot see into the
/// peers' namespaces, so it says so once instead of guessing.
fn warn_veth_checksum_offload(ports: &[String]) {
    let veths: Vec<&str> = ports
        .iter()
        .filter(|p| is_veth_like(p))
        .map(String::as_str)
        .collect();
    if !veths.is_empty() {
        tracing::warn!(
            ports = ?veths,
            "forwarding = \"xdp\" on veth ports: turn off transmit checksum offload on each \
             port's peer (ethtool -K PEER tx off, as scripts/testbed.sh does), or forwarded \
             TCP/UDP arrive with bad checksums; or set forwarding = \"bridge\""
        );
    }
}

/// True when `ifname` has no hardware behind it and is linked to another
/// interface (`iflink` ≠ `ifindex`): a veth (or a similar virtual pair).
fn is_veth_like(ifname: &str) -> bool {
    let read = |f: &str| std::fs::read_to_string(format!("/sys/class/net/{ifname}/{f}"));
    let no_device = std::fs::metadata(format!("/sys/class/net/{ifname}/device")).is_err();
    match (read("ifindex"), read("iflink")) {
        (Ok(i), Ok(l)) => no_device && i.trim() != l.trim(),
        _ => false,
    }
}
