//! `switchctl`: the operator's command for a running switchd, over its admin
//! socket (`switch.admin_socket` in the config).
//!
//!   switchctl jobs
//!   switchctl job add --id 2 --workers 4 --allow 198.18.0.0/24 --secret-file PATH
//!     (or the secret in AGGSWITCH_SECRET)
//!   switchctl job rm 2
//!   switchctl tenant add --name team-a --key-file /etc/aggswitch/tenants/team-a.key \
//!     --allow 198.18.0.0/24 [--max-jobs 4] [--job-ids 32768-65535] …
//!   switchctl tenant list [--json]
//!   switchctl tenant remove team-a
//!   switchctl stats [ID] [--json]   (the switch's: with a table per
//!                                    dataplane thread)
//!
//! Every argument is checked here first, so a typo gets an error naming the
//! argument and the accepted values, before switchd is asked.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ipnet::Ipv4Net;
use proto::secret;
use proto::switch::{human_bytes, CounterSchema, JobCounters, TableCounters};
use switchd::admin::{request, request_from, AdminRequest};
use switchd::config::{JobSection, TenantSection, UpstreamSection, DEFAULT_ADMIN_SOCKET};
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
    /// Add, list or remove a tenant: who may create jobs by name
    /// (docs/PROTOCOL.md, "Tenants and self-provisioned jobs").
    Tenant {
        #[command(subcommand)]
        cmd: TenantCmd,
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

#[derive(Subcommand)]
enum TenantCmd {
    /// Declare a tenant while switchd runs (until it restarts: put it in
    /// the config's [[tenant]] to keep it).
    Add(Box<TenantAdd>),
    /// Remove a tenant; refused while it has jobs.
    Remove { name: String },
    /// The tenants: sources, jobs and pool used of their quotas, dtypes,
    /// auth, priority ceiling, job ids, lease.
    List,
}

#[derive(clap::Args, Debug)]
struct TenantAdd {
    /// 1 to 32 characters of letters, digits, '.', '_', ':' and '-'.
    #[arg(long, value_parser = parse_tenant_name)]
    name: String,
    /// The tenant key: 64 hex digits, mode 0600 (`openssl rand -hex 32 >
    /// FILE; chmod 600 FILE`). switchd reads this file itself: the key
    /// never crosses the admin socket, and switchd's own checks apply.
    #[arg(long, value_name = "PATH", value_parser = parse_key_file)]
    key_file: PathBuf,
    /// Source prefixes its workers (on a spine: its leaves' uplinks) send
    /// from, comma-separated or repeated.
    #[arg(long = "allow", visible_alias = "allowed", value_name = "PREFIX[,PREFIX]", required = true, value_parser = parse_prefixes)]
    allowed: Vec<Prefixes>,
    /// Jobs it may have at once.
    #[arg(long, default_value_t = 4, value_parser = nonzero_u16)]
    max_jobs: u16,
    /// Largest n_workers of one of its jobs.
    #[arg(long, default_value_t = 256, value_parser = nonzero_u16)]
    max_workers_per_job: u16,
    /// Slot-pool bytes of all its jobs together (default 1 GiB).
    #[arg(long, value_parser = nonzero_u64, conflicts_with = "max_pool_mib")]
    max_pool_bytes: Option<u64>,
    /// The same in MiB.
    #[arg(long, value_parser = nonzero_u64)]
    max_pool_mib: Option<u64>,
    /// Element types its jobs may use: f32, bf16, f16 (comma-separated).
    #[arg(long, default_value = "f32,bf16,f16", value_parser = parse_dtypes)]
    dtypes: Names,
    /// Auth modes its jobs may use: port, mac (comma-separated).
    #[arg(long, default_value = "port,mac", value_parser = parse_auth)]
    auth: Names,
    /// Highest class its jobs may ask for: low, normal or high.
    #[arg(long, default_value = "normal", value_parser = parse_priority)]
    max_priority: String,
    /// Ids its jobs get, FIRST-LAST (default 32768-65535, which only one
    /// tenant can have).
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_job_ids)]
    job_ids: Option<[u16; 2]>,
    /// A job without traffic this long is removed (1..=86400).
    #[arg(long, default_value_t = 60, value_parser = parse_lease)]
    lease_secs: u64,
    /// Slots of each of its jobs' pools (a power of two).
    #[arg(long, default_value_t = 256, value_parser = parse_slots)]
    pool_slots: u16,
    /// On a leaf: this leaf's rank at the spines (with --leaves and
    /// --spine; needs `[switch] uplink`): its jobs are provisioned on the
    /// spines too.
    #[arg(long, requires_all = ["leaves", "spines"])]
    leaf_index: Option<u16>,
    /// On a leaf: how many leaves there are.
    #[arg(long, requires = "leaf_index")]
    leaves: Option<u16>,
    /// On a leaf: a spine's ADDR:PORT, in tree order (repeat for each).
    #[arg(long = "spine", requires = "leaf_index")]
    spines: Vec<std::net::SocketAddrV4>,
}

/// One `--allow` value: its prefixes.
#[derive(Debug, Clone)]
struct Prefixes(Vec<Ipv4Net>);

/// A checked comma-separated list of names (`--dtypes`, `--auth`).
#[derive(Debug, Clone)]
struct Names(Vec<String>);

fn parse_tenant_name(s: &str) -> Result<String, String> {
    proto::provision::TenantName::new(s)
        .map(|n| n.to_string())
        .map_err(|e| e.to_string())
}

/// The key file as an absolute path (switchd runs elsewhere): it must
/// exist; switchd reads and checks it.
fn parse_key_file(s: &str) -> Result<PathBuf, String> {
    std::fs::canonicalize(s).map_err(|e| {
        format!("{s}: {e} (make one with `openssl rand -hex 32 > {s}; chmod 600 {s}`)")
    })
}

fn parse_prefixes(s: &str) -> Result<Prefixes, String> {
    s.split(',')
        .map(|p| {
            p.trim().parse::<Ipv4Net>().map_err(|e| {
                format!("`{p}` is not an IPv4 prefix ({e}): write ADDR/LEN, e.g. 198.18.0.0/24")
            })
        })
        .collect::<Result<_, _>>()
        .map(Prefixes)
}

fn nonzero_u16(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("{e}: a whole number 1..=65535")),
    }
}

fn nonzero_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("{e}: a whole number of at least 1")),
    }
}

/// A comma-separated list, each checked by `parse`, duplicates kept once.
fn list_of<E: std::fmt::Display>(
    s: &str,
    parse: impl Fn(&str) -> Result<(), E>,
) -> Result<Names, String> {
    let mut out: Vec<String> = Vec::new();
    for v in s.split(',').map(str::trim) {
        parse(v).map_err(|e| e.to_string())?;
        if !out.iter().any(|o| o == v) {
            out.push(v.to_owned());
        }
    }
    Ok(Names(out))
}

fn parse_dtypes(s: &str) -> Result<Names, String> {
    list_of(s, |v| v.parse::<proto::wire::Dtype>().map(drop))
}

fn parse_auth(s: &str) -> Result<Names, String> {
    list_of(s, |v| v.parse::<proto::tag::AuthMode>().map(drop))
}

fn parse_priority(s: &str) -> Result<String, String> {
    s.parse::<proto::switch::Priority>()
        .map(|p| p.name().to_string())
        .map_err(|e| e.to_string())
}

fn parse_job_ids(s: &str) -> Result<[u16; 2], String> {
    let bad = || {
        format!("`{s}`: write FIRST-LAST, two ids 1..=65535 with FIRST <= LAST, e.g. 40000-40999")
    };
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    match (a.trim().parse::<u16>(), b.trim().parse::<u16>()) {
        (Ok(a), Ok(b)) if a >= 1 && a <= b => Ok([a, b]),
        _ => Err(bad()),
    }
}

fn parse_lease(s: &str) -> Result<u64, String> {
    let max = proto::switch::tenant::MAX_LEASE.as_secs();
    match s.parse::<u64>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(format!("`{s}`: seconds, 1..={max}")),
    }
}

fn parse_slots(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(v) if v.is_power_of_two() => Ok(v),
        _ => Err(format!("`{s}`: a power of two, e.g. 256")),
    }
}

impl TenantAdd {
    /// The section switchd checks, as a `[[tenant]]` of its config.
    fn section(self) -> TenantSection {
        TenantSection {
            name: self.name,
            key_file: self.key_file,
            allowed_sources: self.allowed.into_iter().flat_map(|p| p.0).collect(),
            max_jobs: self.max_jobs,
            max_workers_per_job: self.max_workers_per_job,
            max_pool_bytes: match (self.max_pool_bytes, self.max_pool_mib) {
                (Some(b), _) => b,
                (None, Some(mib)) => mib.saturating_mul(1 << 20),
                (None, None) => 1 << 30,
            },
            dtypes: self.dtypes.0,
            auth: self.auth.0,
            max_priority: self.max_priority,
            job_ids: self.job_ids,
            lease_secs: self.lease_secs,
            pool_slots: self.pool_slots,
            upstream: self.leaf_index.map(|leaf_index| UpstreamSection {
                leaf_index,
                n_leaves: self.leaves.unwrap_or(0),
                spines: self.spines,
            }),
        }
    }
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
    for l in switchd::stats::spine_lines(spines, indent) {
        println!("{l}");
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
        Cmd::Tenant {
            cmd: TenantCmd::List,
        } => AdminRequest::Tenants,
        Cmd::Tenant {
            cmd: TenantCmd::Remove { name },
        } => AdminRequest::RemoveTenant { name },
        Cmd::Tenant {
            cmd: TenantCmd::Add(add),
        } => AdminRequest::AddTenant {
            tenant: Box::new(add.section()),
        },
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
            for l in switchd::stats::jobs_table(&jobs) {
                println!("{l}");
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
        AdminRequest::Tenants => {
            let rows: Vec<switchd::tenants::TenantRow> =
                serde_json::from_value(reply.data).context("switchd's tenant list")?;
            if rows.is_empty() {
                println!("no tenants");
            } else {
                for l in switchd::tenants::table(&rows) {
                    println!("{l}");
                }
            }
        }
        AdminRequest::AddTenant { tenant } => {
            for w in reply.data["warnings"].as_array().into_iter().flatten() {
                eprintln!("switchctl: warning: {}", w.as_str().unwrap_or_default());
            }
            let ids = &reply.data["job_ids"];
            println!(
                "tenant {} added: job ids {}-{}, until switchd restarts (add a [[tenant]] to \
                 its config to keep it)",
                tenant.name, ids[0], ids[1]
            );
        }
        AdminRequest::RemoveTenant { name } => println!("tenant {name} removed"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `switchctl tenant add ARGS` as parsed, or clap's error text.
    fn add(args: &[&str]) -> Result<TenantSection, String> {
        let mut argv = vec!["switchctl", "tenant", "add"];
        argv.extend(args);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                cmd: Cmd::Tenant {
                    cmd: TenantCmd::Add(a),
                },
                ..
            }) => Ok(a.section()),
            Ok(_) => Err("another command".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn key_file() -> String {
        let p = std::env::temp_dir().join(format!("switchctl-test-{}.key", std::process::id()));
        std::fs::write(&p, "x").unwrap();
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn tenant_add_takes_every_setting_and_defaults_the_rest() {
        let key = key_file();
        let t = add(&[
            "--name",
            "team-a",
            "--key-file",
            &key,
            "--allow",
            "198.18.0.0/24",
        ])
        .unwrap();
        assert_eq!(t.name, "team-a");
        assert!(t.key_file.is_absolute());
        assert_eq!(t.allowed_sources.len(), 1);
        assert_eq!(
            (t.max_jobs, t.max_workers_per_job, t.max_pool_bytes),
            (4, 256, 1 << 30)
        );
        assert_eq!(
            (t.dtypes.join(","), t.auth.join(",")),
            ("f32,bf16,f16".into(), "port,mac".into())
        );
        assert_eq!(
            (
                t.max_priority.as_str(),
                t.job_ids,
                t.lease_secs,
                t.pool_slots
            ),
            ("normal", None, 60, 256)
        );
        let t = add(&[
            "--name",
            "b",
            "--key-file",
            &key,
            "--allowed",
            "198.18.0.0/24,198.18.1.0/24",
            "--allowed",
            "198.18.2.7/32",
            "--max-jobs",
            "2",
            "--max-workers-per-job",
            "16",
            "--max-pool-mib",
            "64",
            "--dtypes",
            "bf16,f32,bf16",
            "--auth",
            "mac",
            "--max-priority",
            "high",
            "--job-ids",
            "40000-40999",
            "--lease-secs",
            "600",
            "--pool-slots",
            "64",
            "--leaf-index",
            "1",
            "--leaves",
            "2",
            "--spine",
            "198.19.255.1:48879",
        ])
        .unwrap();
        assert_eq!(t.allowed_sources.len(), 3);
        assert_eq!(
            (t.max_jobs, t.max_workers_per_job, t.max_pool_bytes),
            (2, 16, 64 << 20)
        );
        assert_eq!(t.dtypes, ["bf16", "f32"]);
        assert_eq!(
            (t.auth.join(","), t.max_priority.as_str()),
            ("mac".into(), "high")
        );
        assert_eq!(
            (t.job_ids, t.lease_secs, t.pool_slots),
            (Some([40000, 40999]), 600, 64)
        );
        let up = t.upstream.unwrap();
        assert_eq!((up.leaf_index, up.n_leaves, up.spines.len()), (1, 2, 1));
        let t = add(&[
            "--name",
            "c",
            "--key-file",
            &key,
            "--allowed",
            "198.18.0.0/24",
            "--max-pool-bytes",
            "4096",
        ])
        .unwrap();
        assert_eq!(t.max_pool_bytes, 4096);
    }

    #[test]
    fn every_bad_tenant_argument_gets_its_own_error() {
        let key = key_file();
        let base = [
            "--name",
            "a",
            "--key-file",
            key.as_str(),
            "--allowed",
            "198.18.0.0/24",
        ];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend(extra);
            add(&v).unwrap_err()
        };
        for (extra, want) in [
            (&["--max-jobs", "0"][..], "--max-jobs"),
            (&["--max-jobs", "many"], "a whole number"),
            (&["--max-workers-per-job", "70000"], "--max-workers-per-job"),
            (&["--max-pool-bytes", "0"], "must be at least 1"),
            (
                &["--max-pool-bytes", "1", "--max-pool-mib", "1"],
                "cannot be used with",
            ),
            (&["--dtypes", "f32,f64"], "f64"),
            (&["--auth", "port,none"], "none"),
            (&["--max-priority", "urgent"], "urgent"),
            (&["--job-ids", "500"], "write FIRST-LAST"),
            (&["--job-ids", "9-1"], "FIRST <= LAST"),
            (&["--job-ids", "0-9"], "1..=65535"),
            (&["--lease-secs", "0"], "1..=86400"),
            (&["--lease-secs", "86401"], "1..=86400"),
            (&["--pool-slots", "100"], "a power of two"),
            (&["--leaf-index", "0"], "--leaves"),
            (&["--max-jbos", "2"], "--max-jbos"),
        ] {
            let e = with(extra);
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        let e = add(&[
            "--name",
            "team a",
            "--key-file",
            &key,
            "--allowed",
            "198.18.0.0/24",
        ])
        .unwrap_err();
        assert!(e.contains("not a valid name"), "{e}");
        let e = add(&[
            "--name",
            "a",
            "--key-file",
            "/nonexistent/k",
            "--allowed",
            "198.18.0.0/24",
        ])
        .unwrap_err();
        assert!(
            e.contains("/nonexistent/k") && e.contains("openssl rand -hex 32"),
            "{e}"
        );
        let e = add(&[
            "--name",
            "a",
            "--key-file",
            &key,
            "--allowed",
            "198.18.0.0/24,10.0.0.0/33",
        ])
        .unwrap_err();
        assert!(e.contains("`10.0.0.0/33` is not an IPv4 prefix"), "{e}");
        let e = add(&["--name", "a", "--key-file", &key]).unwrap_err();
        assert!(e.contains("--allow"), "{e}");
    }

    #[test]
    fn tenant_list_and_remove_parse() {
        let cli = Cli::try_parse_from(["switchctl", "--json", "tenant", "list"]).unwrap();
        assert!(
            cli.json
                && matches!(
                    cli.cmd,
                    Cmd::Tenant {
                        cmd: TenantCmd::List
                    }
                )
        );
        let cli = Cli::try_parse_from(["switchctl", "tenant", "remove", "team-a"]).unwrap();
        assert!(
            matches!(cli.cmd, Cmd::Tenant { cmd: TenantCmd::Remove { ref name } } if name == "team-a")
        );
        assert!(Cli::try_parse_from(["switchctl", "tenant", "remove"]).is_err());
        assert!(Cli::try_parse_from(["switchctl", "tenant", "rm", "a"]).is_err());
    }
}
