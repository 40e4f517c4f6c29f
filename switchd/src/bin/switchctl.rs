//! `switchctl`: the operator's command for a running switchd, over its admin
//! socket (`switch.admin_socket` in the config).
//!
//!   switchctl jobs
//!   switchctl job add --id 2 --workers 4 --allow 198.18.0.0/24 --secret-file PATH
//!     (or the secret in AGGSWITCH_SECRET)
//!   switchctl job rm 2
//!   switchctl stats [ID] [--json]   (the switch's: with a table per
//!                                    dataplane thread)

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ipnet::Ipv4Net;
use proto::secret;
use proto::switch::{human_bytes, CounterSchema, JobCounters, TableCounters};
use switchd::admin::{request, request_from, AdminRequest};
use switchd::config::{JobSection, UpstreamSection, DEFAULT_ADMIN_SOCKET};
use switchd::dataplane::DataplaneCounters;

#[derive(Parser)]
#[command(version, about = "Control a running switchd")]
struct Cli {
    /// The admin socket of switchd.
    #[arg(long, global = true, default_value = DEFAULT_ADMIN_SOCKET)]
    socket: PathBuf,
    /// Take the admin socket from this switchd config file (its
    /// `admin_socket`) instead of --socket.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Print the raw JSON reply.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the jobs and their state.
    Jobs,
    /// Add, remove or resize a job.
    Job {
        #[command(subcommand)]
        cmd: JobCmd,
    },
    /// Counters of one job (chunks, bytes, retransmissions, drops by reason,
    /// ranks joined, ranks missing on the oldest incomplete seq), or of the
    /// whole switch (with a row per dataplane thread: busy share, frames,
    /// hand-offs, sockets).
    Stats { id: Option<u16> },
    /// Succeed once switchd answers on its admin socket (its dataplane
    /// threads and listeners are up): what scripts and tests wait for.
    Ready {
        /// Keep asking (every 100 ms) for up to this many seconds.
        #[arg(long, default_value_t = 0.0)]
        wait: f64,
        /// Succeed only if the switchd answering is this process (the one
        /// a script started), not another on the same socket.
        #[arg(long)]
        pid: Option<u32>,
    },
}

#[derive(Subcommand)]
enum JobCmd {
    /// Declare a job while switchd runs.
    Add {
        #[arg(long)]
        id: u16,
        #[arg(long)]
        workers: u16,
        /// Source prefixes allowed to join (repeat for several).
        #[arg(long = "allow", required = true)]
        allowed: Vec<Ipv4Net>,
        /// File holding the job's secret, 64 hex digits (mode 0600). Or set
        /// AGGSWITCH_SECRET.
        #[arg(long, value_name = "PATH")]
        secret_file: Option<PathBuf>,
        /// The job's secret as 64 hex digits. Every user of this machine can
        /// read it in /proc/PID/cmdline: prefer --secret-file or
        /// AGGSWITCH_SECRET.
        #[arg(long, value_name = "HEX")]
        secret: Option<String>,
        #[arg(long, default_value_t = 256)]
        slots: u16,
        #[arg(long)]
        elems: Option<u16>,
        #[arg(long)]
        window: Option<u16>,
        /// Element type the workers send: f32, bf16 or f16 (their JOINs
        /// must name the same).
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// How DATA and RESULT are authenticated: "port" (the member's
        /// source and switch port) or "mac" (a 16-byte tag on every one).
        #[arg(long, default_value = "port")]
        auth: String,
        /// The job's class: "low", "normal" or "high". While a job of a
        /// higher class is busy, this one's workers get a smaller window
        /// and ECE (docs/PROTOCOL.md, "Priorities").
        #[arg(long, default_value = "normal")]
        priority: String,
        /// On a leaf of a tree: this leaf's rank at the spines (with
        /// --leaves and --spine; needs `[switch] uplink`).
        #[arg(long, requires_all = ["leaves", "spines"])]
        leaf_index: Option<u16>,
        /// On a leaf: how many leaves the job has.
        #[arg(long, requires = "leaf_index")]
        leaves: Option<u16>,
        /// On a leaf: a spine's ADDR:PORT, in tree order (repeat for each).
        #[arg(long = "spine", requires = "leaf_index")]
        spines: Vec<std::net::SocketAddrV4>,
        /// Gradient statistics: every summed RESULT carries Σᵢ‖gᵢ‖² and
        /// ‖Σᵢ gᵢ‖² of its chunk (a 24-byte trailer; workers must know it).
        #[arg(long)]
        stats: bool,
    },
    /// Remove a job: frees its memory; its workers fail with "unknown job".
    Rm { id: u16 },
    /// Change a job's worker count between collectives: the job joins again
    /// with N ranks and resumes where its workers stopped (start the
    /// workers with the new world size).
    Resize { id: u16, n_workers: u16 },
}

/// `name value` for every counter of `schema` that is non-zero in `v`,
/// wrapped at about 100 columns.
fn print_counters(v: &serde_json::Value, schema: &dyn CounterSchema, indent: &str) {
    let mut line = String::new();
    schema.visit(&mut |name, _, _| {
        let n = v[name].as_u64().unwrap_or(0);
        if n == 0 {
            return;
        }
        if line.len() > 100 {
            println!("{indent}{}", line.trim_end());
            line.clear();
        }
        line += &format!("{name} {n}  ");
    });
    if !line.is_empty() {
        println!("{indent}{}", line.trim_end());
    }
}

/// One line per tree of a leaf job: the spine, its session, its traffic.
fn print_spines(spines: &[serde_json::Value], indent: &str) {
    for s in spines {
        let state = match s["refused"].as_str() {
            Some(why) => format!("REFUSED: {why}"),
            None => s["state"].as_str().unwrap_or("?").to_string(),
        };
        let heard = s["last_heard_secs"]
            .as_f64()
            .map_or("never heard".to_string(), |t| format!("heard {t:.1} s ago"));
        println!(
            "{indent}tree {} {} {state}, {heard}: partials {} sent {} resent, {} results, {} heartbeats",
            s["tree"],
            s["addr"].as_str().unwrap_or("?"),
            s["partials_sent"],
            s["partials_resent"],
            s["results"],
            s["heartbeats_sent"],
        );
    }
}

fn print_job(j: &serde_json::Value) {
    println!(
        "job {}: {} ({}/{} ranks joined), priority {}{}, window {}, oldest incomplete seq {}, \
         pool {} bytes",
        j["id"],
        j["state"].as_str().unwrap_or("?"),
        j["ranks_joined"],
        j["n_workers"],
        j["priority"].as_str().unwrap_or("?"),
        if j["yielding"].as_bool().unwrap_or(false) {
            format!(" (yielding: declared window {})", j["declared_window"])
        } else {
            String::new()
        },
        j["window"],
        j["floor_seq"],
        j["pool_bytes"]
    );
    print_counters(j, &JobCounters::default(), "  ");
    if let Some(spines) = j["spines"].as_array() {
        println!("  trees:");
        print_spines(spines, "    ");
    }
    let missing = &j["ranks_missing_on_floor"];
    if missing.as_array().is_some_and(|a| !a.is_empty()) {
        println!("  seq {} waits for ranks {}", j["floor_seq"], missing);
    }
    if let Some(drops) = j["drops"].as_object() {
        let nonzero: Vec<String> = drops
            .iter()
            .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "  drops: {}",
            if nonzero.is_empty() {
                "none".to_string()
            } else {
                nonzero.join(" ")
            }
        );
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The job secret from exactly one of --secret-file, AGGSWITCH_SECRET and
/// --secret, with a warning on stderr for a command-line secret or a file
/// others can read. (switchd checks it again and refuses a weak one.)
fn job_secret(arg: Option<String>, file: Option<PathBuf>) -> Result<secret::Secret> {
    let r = secret::resolve(secret::SecretInputs {
        arg,
        file: file.map(|p| {
            let read = read_secret_file(&p);
            (p, read)
        }),
        env: std::env::var(secret::SECRET_ENV).ok(),
    })?;
    for w in &r.warnings {
        eprintln!("switchctl: warning: {w}");
    }
    Ok(r.secret)
}

/// A secret file's text and permission bits.
fn read_secret_file(path: &Path) -> std::io::Result<(String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path)?;
    let mode = f.metadata()?.permissions().mode();
    Ok((std::io::read_to_string(f)?, mode))
}

/// Asks switchd for its counters until it (process `pid`, if given)
/// answers or `wait` seconds pass.
fn wait_ready(socket: &Path, wait: f64, pid: Option<u32>) -> Result<()> {
    let wait = Duration::try_from_secs_f64(wait)
        .map_err(|_| anyhow::anyhow!("--wait must be a number of seconds ≥ 0, not {wait}"))?;
    let deadline = Instant::now() + wait;
    loop {
        let err = match request_from(socket, &AdminRequest::Stats { job: None }) {
            Ok((_, peer)) if pid.is_some_and(|p| p != peer) => anyhow::anyhow!(
                "another switchd (pid {peer}) answers on {}, not pid {}: give each switchd \
                 its own admin_socket",
                socket.display(),
                pid.unwrap_or(0)
            ),
            Ok((r, _)) if r.ok => return Ok(()),
            Ok((r, _)) => anyhow::anyhow!("{}", r.error.unwrap_or_else(|| "refused".into())),
            Err(e) => anyhow::Error::new(e),
        };
        if Instant::now() >= deadline {
            return Err(err).with_context(|| {
                format!(
                    "switchd is not ready on {} (waited {:.1} s): is it running, with \
                     admin_socket = {:?} in its config?",
                    socket.display(),
                    wait.as_secs_f64(),
                    socket.display().to_string()
                )
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run() -> Result<()> {
    let mut cli = Cli::parse();
    if let Some(cfg) = &cli.config {
        cli.socket = switchd::config::admin_socket_in(cfg)?;
    }
    let req = match cli.cmd {
        Cmd::Ready { wait, pid } => {
            wait_ready(&cli.socket, wait, pid)?;
            if !cli.json {
                println!("switchd ready on {}", cli.socket.display());
            }
            return Ok(());
        }
        Cmd::Jobs => AdminRequest::Jobs,
        Cmd::Stats { id } => AdminRequest::Stats { job: id },
        Cmd::Job {
            cmd: JobCmd::Rm { id },
        } => AdminRequest::RemoveJob { id },
        Cmd::Job {
            cmd: JobCmd::Resize { id, n_workers },
        } => AdminRequest::ResizeJob { id, n_workers },
        Cmd::Job {
            cmd:
                JobCmd::Add {
                    id,
                    workers,
                    allowed,
                    secret_file,
                    secret,
                    slots,
                    elems,
                    window,
                    dtype,
                    auth,
                    priority,
                    leaf_index,
                    leaves,
                    spines,
                    stats,
                },
        } => AdminRequest::AddJob {
            job: JobSection {
                id,
                n_workers: workers,
                allowed_sources: allowed,
                secret: hex::encode(job_secret(secret, secret_file)?),
                pool_slots: slots,
                elems_per_chunk: elems,
                window,
                dtype: Some(dtype),
                auth: Some(auth),
                priority: Some(priority),
                upstream: leaf_index.map(|leaf_index| UpstreamSection {
                    leaf_index,
                    n_leaves: leaves.unwrap_or(0),
                    spines,
                }),
                stats,
            },
        },
    };
    let reply = request(&cli.socket, &req).context("asking switchd")?;
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_else(|| "failed".into()));
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&reply.data)?);
        return Ok(());
    }
    match req {
        AdminRequest::Jobs => {
            let jobs = reply.data.as_array().cloned().unwrap_or_default();
            if jobs.is_empty() {
                println!("no jobs");
            }
            // "window" is what RESULTs advertise now: below "declared"
            // while the job yields to a busy higher class; "marked" counts
            // its chunks marked for priority so far. Auth stays last (tests read it).
            println!(
                "{:>6}  {:<8} {:>7} {:>7} {:>6} {:>6} {:>8} {:>5} {:>6} {:<6} {:>8} {:>5} {:>4}",
                "job",
                "state",
                "ranks",
                "joined",
                "slots",
                "window",
                "declared",
                "dtype",
                "elems",
                "class",
                "marked",
                "stats",
                "auth"
            );
            for j in jobs {
                println!(
                    "{:>6}  {:<8} {:>7} {:>7} {:>6} {:>6} {:>8} {:>5} {:>6} {:<6} {:>8} {:>5} {:>4}",
                    // Numbers, not JSON values: Value's Display ignores widths.
                    j["id"].as_u64().unwrap_or(0),
                    j["state"].as_str().unwrap_or("?"),
                    j["n_workers"].as_u64().unwrap_or(0),
                    j["ranks_joined"].as_u64().unwrap_or(0),
                    j["pool_slots"].as_u64().unwrap_or(0),
                    j["window"].as_u64().unwrap_or(0),
                    j["declared_window"].as_u64().unwrap_or(0),
                    j["dtype"].as_str().unwrap_or("?"),
                    j["elems_per_chunk"].as_u64().unwrap_or(0),
                    j["priority"].as_str().unwrap_or("?"),
                    j["priority_marked"].as_u64().unwrap_or(0),
                    if j["stats"].as_bool().unwrap_or(false) {
                        "on"
                    } else {
                        "off"
                    },
                    j["auth"].as_str().unwrap_or("?")
                );
                let up = &j["upstream"];
                if let Some(spines) = up["spines"].as_array() {
                    println!(
                        "        leaf {} of {}, spines in tree order:",
                        up["leaf_index"], up["n_leaves"]
                    );
                    print_spines(spines, "          ");
                }
            }
        }
        AdminRequest::Stats { job: Some(_) } => print_job(&reply.data),
        AdminRequest::Stats { job: None } => {
            let d = &reply.data;
            println!(
                "switch generation {:#010x}, up {:.0} s, malformed {}, slot-pool memory {} of {}",
                d["generation"].as_u64().unwrap_or(0),
                d["uptime_secs"].as_f64().unwrap_or(0.0),
                d["malformed_total"],
                human_bytes(d["pool_in_use_bytes"].as_u64().unwrap_or(0)),
                human_bytes(d["pool_budget_bytes"].as_u64().unwrap_or(0)),
            );
            print_counters(d, &DataplaneCounters::default(), "  ");
            print_counters(d, &TableCounters::default(), "  ");
            let threads = switchd::stats::thread_table(d);
            if !threads.is_empty() {
                println!("dataplane threads (busy: share of the last second not asleep in poll):");
                for l in threads {
                    println!("  {l}");
                }
            }
            for p in d["ports"].as_array().cloned().unwrap_or_default() {
                let refused: Vec<String> = p["xdp_fwd_refused"]
                    .as_object()
                    .map(|r| {
                        r.iter()
                            .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "port {}: XDP steered {}, passed {}, malformed {}, dropped {}, forwarded {}, \
                     own_address_forged {}{}",
                    p["name"].as_str().unwrap_or("?"),
                    p["xdp_steered"],
                    p["xdp_passed"],
                    p["xdp_malformed"],
                    p["xdp_dropped"],
                    p["xdp_forwarded"],
                    p["xdp_own_address_forged"],
                    if refused.is_empty() {
                        String::new()
                    } else {
                        format!(", left to the bridge: {}", refused.join(" "))
                    }
                );
            }
            let ports = d["ports"].as_array().cloned().unwrap_or_default();
            for r in d["rings"].as_array().cloned().unwrap_or_default() {
                if r["kernel_rx_dropped"].as_u64().unwrap_or(0) > 0 {
                    let port = ports
                        .get(r["port_idx"].as_u64().unwrap_or(0) as usize)
                        .and_then(|p| p["name"].as_str())
                        .unwrap_or("?");
                    println!(
                        "socket {port}/{}: the kernel dropped {} frames before switchd saw them \
                         ({} with the receive ring full, fill ring empty {} times)",
                        r["queue"],
                        r["kernel_rx_dropped"],
                        r["kernel_rx_ring_full"],
                        r["kernel_fill_ring_empty"]
                    );
                }
            }
            for j in d["jobs"].as_array().cloned().unwrap_or_default() {
                print_job(&j);
            }
        }
        AdminRequest::AddJob { job } => println!("job {} added", job.id),
        AdminRequest::RemoveJob { id } => println!("job {id} removed"),
        AdminRequest::ResizeJob { id, n_workers } => {
            if reply.data["changed"].as_bool() == Some(false) {
                println!("job {id} has {n_workers} workers already");
            } else {
                println!(
                    "job {id} resized to {n_workers} workers: it joins again, start its \
                     {n_workers} workers with that world size"
                );
            }
        }
    }
    Ok(())
}
