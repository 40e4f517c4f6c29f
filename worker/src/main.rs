//! `worker`: the command line over the worker library, for testbeds and
//! benchmarks. (The raw-frame packet generator of the rate benchmarks is
//! `aggblast`, in `bench/`.)
//!
//! * `worker allreduce …`: join a job and run K all-reduces of E elements
//!   (`--dtype` f32, bf16 or f16), optionally verifying every element bit for
//!   bit against the rank-order sum (for bf16/f16: the float32 sum of the
//!   inputs, rounded once; in a tree, the float32 tree-order sum rounded
//!   once)
//!   (or, for one leaf of an aggregation tree, `--tree-leaves` and `--leaf`,
//!   against the tree-order sum over all leaves).
//!   `--transport auto|mmsg|udp-gso` picks the UDP data path (see the
//!   library's docs); the report says which one ran.
//!   `--collective reduce-scatter|all-gather` runs that kind instead
//!   (`--elements` is then the whole n·m tensor: the reduce-scatter's input,
//!   the all-gather's output); `--verify` checks every output element: the
//!   rank's shard of the rank-order sum, or every rank's pattern copied bit
//!   for bit.
//!   In a `stats = true` job every all-reduce and reduce-scatter reports the
//!   switch's gradient statistics (Σᵢ‖gᵢ‖², ‖Σᵢ gᵢ‖², ranks); `--verify`
//!   checks them bit for bit against `proto::member::reference_grad_stats`
//!   of every rank's pattern (in a tree, `reference_tree_grad_stats` over
//!   every leaf's ranks).
//! * `worker join …`: join once, report the switch's answer and leave (a
//!   probe for operators: bad secret, wrong source, unknown job all print
//!   their reason). Exit status 0: joined and left; 3: refused; 1: any
//!   other error, a LEAVE that could not be sent included (the answer is
//!   printed first).
//!
//! The job secret comes from `--secret-file PATH` or `AGGSWITCH_SECRET`;
//! `--secret HEX` still works but warns (other users see it in
//! /proc/PID/cmdline). [`proto::secret`] holds the rules. A self-provisioned
//! job (docs/PROTOCOL.md, "Tenants and self-provisioned jobs") is named
//! instead by `--tenant T --tenant-key-file F --job-name NAME` (the key by
//! the same rules, or `AGGSWITCH_TENANT_KEY`): exactly one of the two ways.

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use proto::member::{reference_grad_stats, reference_tree_grad_stats, Shape};
use proto::provision::{JobName, TenantName};
use proto::reference::{
    expected_kept_sum_dtype, expected_sum_dtype, expected_tree_sum_dtype, pattern, pattern_dtype,
    tree_global_rank,
};
use proto::secret;
use proto::tag::AuthMode;
use proto::wire::{Dtype, DEFAULT_AGG_PORT, SECRET_LEN};
use worker::{
    Element, GradStats, Kind, ProvisionSpec, TransportKind, Worker, WorkerConfig, WorkerError,
};

/// `--collective`: which collective the iterations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CollectiveArg {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl CollectiveArg {
    fn kind(self) -> Kind {
        match self {
            CollectiveArg::AllReduce => Kind::AllReduce,
            CollectiveArg::ReduceScatter => Kind::ReduceScatter,
            CollectiveArg::AllGather => Kind::AllGather,
        }
    }
}

#[derive(Parser)]
#[command(
    version,
    about = "Aggregation-switch worker: all-reduce f32, bf16 or f16 tensors through the switch"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Join a job and run all-reduces, reporting throughput.
    Allreduce(AllreduceArgs),
    /// Join a job once, print the switch's answer and leave the job again.
    ///
    /// Exit status: 0 joined and left, 3 refused (the reason is printed),
    /// 1 any other error. A LEAVE that could not be sent is an error too,
    /// after the answer is printed: the switch then keeps this rank as a
    /// member, and the rank's next process may be taken for it.
    Join(JobArgs),
}

/// The switch and the job: what every subcommand that joins needs.
#[derive(Args, Clone)]
struct SwitchJobArgs {
    /// The switch's IPv4 address.
    #[arg(long)]
    switch: Ipv4Addr,
    /// The switch's aggregation UDP port.
    #[arg(long, default_value_t = DEFAULT_AGG_PORT)]
    port: u16,
    /// The id of a declared job (with its secret: --secret-file or
    /// AGGSWITCH_SECRET). Or, for a self-provisioned job: --tenant,
    /// --tenant-key-file and --job-name instead.
    #[arg(long)]
    job: Option<u16>,
    /// A self-provisioned job: the tenant the operator declared on the
    /// switch (in place of --job and the secret).
    #[arg(long, value_name = "T")]
    tenant: Option<String>,
    /// File holding the tenant's key: 64 hex digits, mode 0600. Or set
    /// AGGSWITCH_TENANT_KEY. The key never crosses the wire.
    #[arg(long, value_name = "PATH")]
    tenant_key_file: Option<PathBuf>,
    /// A self-provisioned job's name, the same on every rank of a run
    /// (1..=64 of letters, digits, '.', '_', ':' and '-'): the switch
    /// creates the job on the first rank's request.
    #[arg(long, value_name = "NAME")]
    job_name: Option<String>,
    /// A self-provisioned job's auth mode: port or mac (a declared job's
    /// comes from its declaration).
    #[arg(long, value_name = "port|mac")]
    auth: Option<String>,
    /// A self-provisioned job's priority: low, normal or high.
    #[arg(long, value_name = "low|normal|high")]
    priority: Option<String>,
    /// A self-provisioned job with gradient statistics.
    #[arg(long)]
    stats: bool,
    /// Number of workers in the job.
    #[arg(long)]
    workers: u16,
    /// File holding the job's secret: 64 hex digits (32 bytes), mode 0600.
    /// Or set AGGSWITCH_SECRET.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
    /// The job's secret as 64 hex digits. Every user of this machine can read
    /// it in /proc/PID/cmdline: prefer --secret-file or AGGSWITCH_SECRET.
    #[arg(long, value_name = "HEX")]
    secret: Option<String>,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 30.0)]
    join_timeout: f64,
    /// Element type of the job: f32, bf16 or f16 (the job's declaration
    /// must name the same).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
}

/// One rank of a job.
#[derive(Args, Clone)]
struct JobArgs {
    #[command(flatten)]
    target: SwitchJobArgs,
    #[arg(long)]
    rank: u16,
    /// Seconds without progress before a collective fails.
    #[arg(long, default_value_t = 5.0)]
    stall_timeout: f64,
}

#[derive(Args)]
struct AllreduceArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Elements (of --dtype) per tensor. For reduce-scatter and all-gather
    /// the whole tensor of n shards (a multiple of --workers): the
    /// reduce-scatter's input, the all-gather's output.
    #[arg(long)]
    elements: usize,
    /// The collective to run: all-reduce, reduce-scatter (each rank gets
    /// its shard of the sum) or all-gather (each rank gets every rank's
    /// shard). Reduce-scatter and all-gather need a job on one switch, not
    /// an aggregation tree.
    #[arg(long, value_enum, default_value = "all-reduce")]
    collective: CollectiveArg,
    /// Number of all-reduces in a row.
    #[arg(long, default_value_t = 1)]
    iterations: u32,
    /// Untimed all-reduces before the timed ones (not in the report's
    /// seconds, nor in --machine-cpu).
    #[arg(long, default_value_t = 0)]
    warmup: u32,
    /// Fill each iteration's deterministic pattern and check every element
    /// bit for bit against the rank-order sum. Without it, the first
    /// iteration reduces iteration 0's pattern and every later one the
    /// previous result (so nothing runs between the timed all-reduces).
    #[arg(long)]
    verify: bool,
    /// Aggregation tree: workers per leaf, in leaf order (`2,2`: two leaves
    /// of two). With `--leaf`, this worker is local rank `--rank` of that
    /// leaf's job (`--workers` is that leaf's size); its pattern is that of
    /// its global rank (the earlier leaves' sizes plus `--rank`), and
    /// `--verify` checks against the tree-order sum over all leaves.
    #[arg(long, value_delimiter = ',', value_name = "W0,W1,...")]
    tree_leaves: Option<Vec<u16>>,
    /// This worker's leaf in `--tree-leaves`, from 0.
    #[arg(long, value_name = "I")]
    leaf: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// For benchmarks: report the whole machine's busy CPU time (every CPU,
    /// kernel and softirq included, from /proc/stat) when the first
    /// all-reduce starts and when the last one ends, so that a script can
    /// charge all the processes' CPU to the all-reduces alone (the earliest
    /// start and the latest end over the ranks).
    #[arg(long)]
    machine_cpu: bool,
    /// For benchmarks, with `--machine-cpu`: also report the CPU seconds
    /// (user + system of every thread, /proc/PID/stat) of process PID,
    /// switchd's on a testbed, at the same two points, so that a script
    /// can charge the switch's CPU to the timed all-reduces apart from the
    /// workers' (`switchd_cpu_s`).
    #[arg(long, value_name = "PID", requires = "machine_cpu")]
    switchd_pid: Option<u32>,
    /// The UDP data path: `udp-gso` (DATA coalesced with UDP_SEGMENT,
    /// RESULTs with UDP_GRO), `mmsg` (one datagram per message), or `auto`
    /// (udp-gso when the kernel takes it, else mmsg).
    #[arg(long, default_value = "auto", value_name = "auto|mmsg|udp-gso")]
    transport: TransportKind,
    /// Threads that carry each collective, each with its own socket,
    /// window and share of the chunks: `auto` picks them from the tensor's
    /// size and the cores this process may use; more than 1 needs a switch
    /// with `seq_lanes` ≥ T (docs/design/worker-threads.md).
    #[arg(long, default_value = "auto", value_name = "auto|T", value_parser = parse_threads)]
    threads: usize,
    /// Disable the DCTCP window reaction to ECE.
    #[arg(long)]
    no_congestion_control: bool,
    /// Count a RESULT as marked, as ECE, when its RTT exceeds the path's
    /// minimum by more than this many milliseconds (0: ECE alone).
    #[arg(long, default_value_t = 2.0, value_name = "MS", value_parser = delay_target_ms)]
    delay_target: f64,
    /// Testing only: keep this many chunks in flight whatever the switch
    /// advertises (to exercise the switch's window enforcement).
    #[arg(long, hide = true)]
    window_override: Option<u16>,
}

/// `--threads`: `auto` (0) or a count in 1..=64.
fn parse_threads(s: &str) -> Result<usize, String> {
    if s == "auto" {
        return Ok(0);
    }
    match s.parse::<usize>() {
        Ok(n @ 1..=64) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a thread count: give `auto` or a number from 1 to 64"
        )),
    }
}

/// The job secret from exactly one of --secret-file, AGGSWITCH_SECRET and
/// --secret; warns (once, on stderr) about a command-line secret or a file
/// others can read.
fn job_secret(t: &SwitchJobArgs) -> Result<[u8; SECRET_LEN]> {
    let r = secret::resolve(secret::SecretInputs {
        arg: t.secret.clone(),
        file: t
            .secret_file
            .as_ref()
            .map(|p| (p.clone(), read_secret_file(p))),
        env: std::env::var(secret::SECRET_ENV).ok(),
    })?;
    for w in &r.warnings {
        tracing::warn!("{w}");
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

/// Where a worker sits in an aggregation tree (`--tree-leaves`, `--leaf`).
#[derive(Debug, PartialEq)]
struct TreePlace {
    /// Workers per leaf, in leaf order.
    sizes: Vec<u16>,
    leaf: usize,
    /// The earlier leaves' sizes plus the local rank.
    global_rank: u16,
}

/// Checks `--tree-leaves` and `--leaf` (both or neither) against the local
/// `--rank` and `--workers`; `None` without them.
fn tree_place(
    sizes: Option<&[u16]>,
    leaf: Option<usize>,
    rank: u16,
    workers: u16,
) -> Result<Option<TreePlace>> {
    let (sizes, leaf) = match (sizes, leaf) {
        (None, None) => return Ok(None),
        (Some(_), None) => bail!("--tree-leaves needs --leaf (this worker's leaf, from 0)"),
        (None, Some(_)) => bail!("--leaf needs --tree-leaves (workers per leaf, in leaf order)"),
        (Some(s), Some(l)) => (s, l),
    };
    let list = sizes
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let global_rank = tree_global_rank(sizes, leaf, rank)
        .with_context(|| format!("--tree-leaves {list} --leaf {leaf} --rank {rank}"))?;
    if workers != sizes[leaf] {
        bail!(
            "--workers {workers} is not the size of leaf {leaf} in --tree-leaves {list} ({}): \
             --workers is the number of ranks of this worker's leaf",
            sizes[leaf]
        );
    }
    Ok(Some(TreePlace {
        sizes: sizes.to_vec(),
        leaf,
        global_rank,
    }))
}

/// The machine's busy CPU time so far, in seconds summed over every CPU:
/// user, nice, system, irq, softirq and steal of /proc/stat's "cpu" line
/// (idle and iowait are not busy; guest time is already in user).
fn machine_busy_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse_machine_busy_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .context("/proc/stat has no well-formed \"cpu\" line")
}

/// This process's CPU time so far (user + system of every thread, from
/// /proc/self/stat), in seconds: the worker's own share of an all-reduce,
/// where the whole machine's also counts the switch and the kernel's other
/// work (docs/BENCHMARKS.md, "How CPU is counted").
fn process_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    parse_process_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .context("/proc/self/stat has no utime and stime after the command")
}

/// Process `pid`'s CPU time so far (user + system of every thread, from
/// /proc/PID/stat), in seconds: `--switchd-pid`.
fn pid_cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path} (--switchd-pid: is process {pid} running?)"))?;
    parse_process_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .with_context(|| format!("{path} has no utime and stime after the command"))
}

fn parse_process_ticks(stat: &str) -> Option<u64> {
    // Fields after the command's closing parenthesis (it may hold spaces);
    // utime and stime are the 14th and 15th of the whole line.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// /proc/stat counts in USER_HZ ticks, which Linux fixes at 100 for user
/// space whatever the kernel's HZ.
const USER_HZ: f64 = 100.0;

fn parse_machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let at = |i: usize| f.get(i).copied();
    Some(at(0)? + at(1)? + at(2)? + at(5)? + at(6)? + at(7)?)
}

/// How the job is named: exactly one of a declared job (`--job` and its
/// secret) and a self-provisioned one (`--tenant`, the tenant key,
/// `--job-name`).
const ONE_WAY: &str = "name the job one way: --job ID with --secret-file (a declared job), or \
                       --tenant T --tenant-key-file F --job-name NAME (a self-provisioned job)";

/// The self-provisioned job's spec, or `None` for a declared job; refuses a
/// mix of the two ways and a half-given one.
fn provision_spec(t: &SwitchJobArgs) -> Result<Option<ProvisionSpec>> {
    let declared = t.job.is_some() || t.secret.is_some() || t.secret_file.is_some();
    let provisioned = t.tenant.is_some() || t.tenant_key_file.is_some() || t.job_name.is_some();
    let shape = t.auth.is_some() || t.priority.is_some() || t.stats;
    match (declared, provisioned) {
        (true, true) => {
            bail!("both a declared job and a self-provisioned one are given: {ONE_WAY}")
        }
        (false, false) => bail!("no job: {ONE_WAY}"),
        (true, false) if shape => bail!(
            "--auth, --priority and --stats shape a self-provisioned job; a declared job's \
             come from its declaration: drop them, or {ONE_WAY}"
        ),
        (true, false) => {
            if t.job.is_none() {
                bail!("a secret without --job: {ONE_WAY}");
            }
            return Ok(None);
        }
        (false, true) => {}
    }
    let (Some(tenant), Some(job_name)) = (&t.tenant, &t.job_name) else {
        bail!("a self-provisioned job needs --tenant and --job-name: {ONE_WAY}");
    };
    let tenant = TenantName::new(tenant).context("--tenant")?;
    let job_name = JobName::new(job_name).context("--job-name")?;
    let r = secret::resolve_tenant_key(
        t.tenant_key_file
            .as_ref()
            .map(|p| (p.clone(), read_secret_file(p))),
        std::env::var(secret::TENANT_KEY_ENV).ok(),
    )?;
    for w in &r.warnings {
        tracing::warn!("{w}");
    }
    let auth = match t.auth.as_deref() {
        None | Some("port") => AuthMode::Port,
        Some("mac") => AuthMode::Mac,
        Some(o) => bail!("--auth {o:?}: use port or mac"),
    };
    let priority = match t.priority.as_deref() {
        Some("low") => 0,
        None | Some("normal") => 1,
        Some("high") => 2,
        Some(o) => bail!("--priority {o:?}: use low, normal or high"),
    };
    Ok(Some(ProvisionSpec {
        tenant,
        key: r.key,
        job_name,
        auth,
        stats: t.stats,
        priority,
    }))
}

/// How messages name the job before the switch gave it an id.
fn job_label(t: &SwitchJobArgs) -> String {
    match (t.job, &t.tenant, &t.job_name) {
        (Some(id), _, _) => format!("job {id}"),
        (None, Some(tenant), Some(name)) => format!("job {name:?} of tenant {tenant:?}"),
        _ => "the job".into(),
    }
}

fn config(a: &JobArgs) -> Result<WorkerConfig> {
    let t = &a.target;
    if a.rank >= t.workers {
        bail!("--rank {} must be below --workers {}", a.rank, t.workers);
    }
    let switch = SocketAddrV4::new(t.switch, t.port);
    let mut c = match (provision_spec(t)?, t.job) {
        (Some(spec), _) => WorkerConfig::provisioned(switch, spec, a.rank, t.workers),
        (None, Some(job)) => WorkerConfig::new(switch, job, a.rank, t.workers, job_secret(t)?),
        (None, None) => bail!("no job: {ONE_WAY}"),
    };
    c.dtype = t.dtype;
    c.join_timeout = Duration::from_secs_f64(t.join_timeout);
    c.stall_timeout = Duration::from_secs_f64(a.stall_timeout);
    Ok(c)
}

#[derive(serde::Serialize)]
struct Report {
    job: u16,
    rank: u16,
    workers: u16,
    dtype: &'static str,
    /// "all-reduce", "reduce-scatter" or "all-gather".
    collective: &'static str,
    elements: usize,
    iterations: u32,
    seconds: f64,
    gbit_per_s: f64,
    chunks_per_s: f64,
    verified: bool,
    mismatches: u64,
    /// With `--tree-leaves`: workers per leaf, this worker's leaf and its
    /// global rank (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    tree_leaves: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    leaf: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    global_rank: Option<u16>,
    elems_per_chunk: u16,
    pool_slots: u16,
    /// The switch's seq lanes: DATA of seq s went to its port + s mod this.
    seq_lanes: usize,
    /// The transport that ran: "mmsg" or "udp-gso".
    transport: &'static str,
    /// Threads that carried the last collective (docs/design/
    /// worker-threads.md), and whether the switch granted lane replies.
    threads: usize,
    lane_replies: bool,
    /// How the job authenticates DATA/RESULT: "port" or "mac".
    auth: &'static str,
    stats: worker::WorkerStats,
    /// In a `stats = true` job: each timed all-reduce's or reduce-scatter's
    /// gradient statistics, in order (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    gradient_stats: Option<Vec<StatsLine>>,
    /// Collectives whose statistics differ from the reference (`--verify`).
    stats_mismatches: u64,
    /// With `--machine-cpu`: the machine's busy CPU seconds (summed over
    /// CPUs, since boot) at the start of the first all-reduce and at the
    /// end of the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    machine_busy_cpu_s: Option<[f64; 2]>,
    /// With `--machine-cpu`: this worker process's CPU seconds (user +
    /// system) at the same two points.
    #[serde(skip_serializing_if = "Option::is_none")]
    process_cpu_s: Option<[f64; 2]>,
    /// With `--switchd-pid`: that process's CPU seconds (user + system) at
    /// the same two points.
    #[serde(skip_serializing_if = "Option::is_none")]
    switchd_cpu_s: Option<[f64; 2]>,
    /// Each timed iteration's seconds, in order (tail latencies per
    /// all-reduce: `scripts/bench priority`); omitted past 10 000.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    iteration_seconds: Vec<f64>,
}

/// One collective's gradient statistics as the report shows them.
#[derive(Debug, serde::Serialize)]
struct StatsLine {
    iteration: u32,
    sum_of_squares: f64,
    square_of_sum: f64,
    ranks: u32,
    /// With `--verify` on a single switch: whether they are the reference's
    /// bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
}

/// The statistics every rank must get for iteration `it` of `kind` on a
/// single switch: [`reference_grad_stats`] of every rank's pattern rounded
/// to `dtype` and widened back (what each rank sent), `elements` the whole
/// layout (n·m for a reduce-scatter), chunks of `elems_per_chunk`.
fn expected_stats(
    kind: Kind,
    dtype: Dtype,
    n: u16,
    elements: usize,
    elems_per_chunk: u16,
    it: u32,
) -> Option<GradStats> {
    let shape = match kind {
        Kind::AllReduce => Shape::all_reduce(elements),
        Kind::ReduceScatter => Shape::reduce_scatter(0, n, elements / usize::from(n)),
        Kind::AllGather => return None,
    };
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..elements)
                .map(|i| pattern_dtype(dtype, r, it, i))
                .collect()
        })
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    reference_grad_stats(shape, elems_per_chunk, &refs)
}

/// [`expected_stats`] of an all-reduce through a tree whose leaves have
/// `sizes` workers: every global rank's pattern, grouped by leaf.
fn expected_tree_stats(
    dtype: Dtype,
    sizes: &[u16],
    elements: usize,
    elems_per_chunk: u16,
    it: u32,
) -> Option<GradStats> {
    let mut global = 0u16;
    let leaves: Vec<Vec<Vec<f32>>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    let r = global;
                    global += 1;
                    (0..elements)
                        .map(|i| pattern_dtype(dtype, r, it, i))
                        .collect()
                })
                .collect()
        })
        .collect();
    let refs: Vec<Vec<&[f32]>> = leaves
        .iter()
        .map(|l| l.iter().map(Vec::as_slice).collect())
        .collect();
    reference_tree_grad_stats(elements, elems_per_chunk, &refs)
}

/// An element the CLI fills and verifies: converted from the float32
/// pattern (rounded to nearest even) and widened back to compare.
trait CliElement: Element {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl CliElement for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl CliElement for half::bf16 {
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl CliElement for half::f16 {
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// What the iterations measured.
struct Outcome {
    busy: Duration,
    mismatches: u64,
    /// With `--machine-cpu`: the machine's busy CPU seconds when the first
    /// all-reduce started and when the last one ended.
    machine_cpu: [f64; 2],
    /// With `--machine-cpu`: this process's CPU seconds at the same points.
    process_cpu: [f64; 2],
    /// With `--switchd-pid`: that process's CPU seconds at the same points.
    switchd_cpu: Option<[f64; 2]>,
    /// In a stats job: each timed collective's statistics.
    grad: Option<Vec<StatsLine>>,
    stats_mismatches: u64,
    /// Each timed iteration's seconds (up to [`MAX_ITERATION_TIMES`]).
    times: Vec<f64>,
}

/// Most per-iteration times a report lists.
const MAX_ITERATION_TIMES: usize = 10_000;

/// Lengths of a rank's input and output for `--collective` over a whole
/// tensor of `elements` (n·m for reduce-scatter and all-gather).
fn io_lengths(kind: Kind, elements: usize, n: u16) -> Result<(usize, usize)> {
    if kind != Kind::AllReduce && !elements.is_multiple_of(n.into()) {
        bail!(
            "--elements {elements} is not a multiple of --workers {n}: {kind} needs n shards of \
             the same length (try --elements {})",
            elements.next_multiple_of(n.into())
        );
    }
    Ok(match kind {
        Kind::AllReduce => (elements, elements),
        Kind::ReduceScatter => (elements, elements / usize::from(n)),
        Kind::AllGather => (elements / usize::from(n), elements),
    })
}

/// One collective of `kind`: an all-reduce in place in `input`, else from
/// `input` into `output`.
fn run_one<T: CliElement>(
    w: &mut Worker,
    kind: Kind,
    input: &mut [T],
    output: &mut [T],
) -> Result<(), WorkerError> {
    match kind {
        Kind::AllReduce => w.all_reduce(input),
        Kind::ReduceScatter => w.reduce_scatter(input, output),
        Kind::AllGather => w.all_gather(input, output),
    }
}

/// Runs the collectives on tensors of `T`: the input is `pattern_rank`'s
/// pattern (rounded to `T`), every output element checked against
/// `expected` with `--verify`.
/// In a stats job, `expected_grad` gives iteration `it`'s reference
/// statistics (None: not checked).
fn iterate<T: CliElement>(
    w: &mut Worker,
    a: &AllreduceArgs,
    pattern_rank: u16,
    expected: &dyn Fn(u32, usize) -> f32,
    expected_grad: &dyn Fn(&Worker, u32) -> Option<GradStats>,
    what: &str,
) -> Result<Outcome> {
    let kind = a.collective.kind();
    let (in_len, out_len) = io_lengths(kind, a.elements, a.job.target.workers)?;
    let fill = |it: u32, out: &mut [T]| {
        for (i, v) in out.iter_mut().enumerate() {
            *v = T::from_f32(pattern(pattern_rank, it, i));
        }
    };
    let mut data = vec![T::from_f32(0.0); in_len];
    let mut output = if kind == Kind::AllReduce {
        Vec::new()
    } else {
        vec![T::from_f32(0.0); out_len]
    };
    fill(0, &mut data);
    // Untimed, as MPI benchmarks warm up: the first all-reduces pay for
    // page faults on the library's buffers and the window's slow start.
    for it in 0..a.warmup {
        run_one(w, kind, &mut data, &mut output)
            .with_context(|| format!("warm-up {kind} {it} of {what}"))?;
    }
    let mut busy = Duration::ZERO;
    let mut times = Vec::with_capacity((a.iterations as usize).min(MAX_ITERATION_TIMES));
    let mut mismatches = 0u64;
    let mut machine_cpu = [0.0f64; 2];
    let mut process_cpu = [0.0f64; 2];
    let mut switchd_cpu = a.switchd_pid.map(|_| [0.0f64; 2]);
    let summed = kind != Kind::AllGather;
    let mut grad = (w.has_gradient_stats() && summed).then(Vec::new);
    let mut stats_mismatches = 0u64;
    for it in 0..a.iterations {
        // Without --verify every iteration reduces the previous result:
        // nothing is generated or copied between the timed all-reduces,
        // which on a shared machine would slow the other ranks' and count
        // in --machine-cpu.
        if a.verify {
            fill(it, &mut data);
        }
        if a.machine_cpu && it == 0 {
            machine_cpu[0] = machine_busy_cpu_seconds()?;
            process_cpu[0] = process_cpu_seconds()?;
            if let (Some(pid), Some(s)) = (a.switchd_pid, &mut switchd_cpu) {
                s[0] = pid_cpu_seconds(pid)?;
            }
        }
        let t = Instant::now();
        run_one(w, kind, &mut data, &mut output)
            .with_context(|| format!("{kind} {it} of {what}"))?;
        let took = t.elapsed();
        busy += took;
        if times.len() < MAX_ITERATION_TIMES {
            times.push(took.as_secs_f64());
        }
        if a.machine_cpu && it + 1 == a.iterations {
            machine_cpu[1] = machine_busy_cpu_seconds()?;
            process_cpu[1] = process_cpu_seconds()?;
            if let (Some(pid), Some(s)) = (a.switchd_pid, &mut switchd_cpu) {
                s[1] = pid_cpu_seconds(pid)?;
            }
        }
        if let Some(lines) = &mut grad {
            let got = w
                .gradient_stats()
                .with_context(|| format!("{kind} {it} of {what}"))?;
            let verified = a
                .verify
                .then(|| expected_grad(w, it))
                .flatten()
                .map(|want| {
                    let ok = got.bits_eq(&want);
                    if !ok {
                        stats_mismatches += 1;
                        if stats_mismatches <= 10 {
                            eprintln!(
                                "MISMATCH {what} iteration {it} gradient statistics: got \
                                 {got:?}, expected {want:?}"
                            );
                        }
                    }
                    ok
                });
            lines.push(StatsLine {
                iteration: it,
                sum_of_squares: got.sum_of_squares,
                square_of_sum: got.square_of_sum,
                ranks: got.ranks,
                verified,
            });
        }
        if a.verify {
            let got = if kind == Kind::AllReduce {
                &data
            } else {
                &output
            };
            for (i, v) in got.iter().enumerate() {
                let (got, want) = (v.to_f32(), expected(it, i));
                if got.to_bits() != want.to_bits() {
                    if mismatches < 10 {
                        eprintln!(
                            "MISMATCH {what} iteration {it} element {i}: got {got:e} ({:#010x}), expected {want:e} ({:#010x})",
                            got.to_bits(),
                            want.to_bits()
                        );
                    }
                    mismatches += 1;
                }
            }
        }
    }
    Ok(Outcome {
        busy,
        mismatches,
        machine_cpu,
        process_cpu,
        switchd_cpu,
        grad,
        stats_mismatches,
        times,
    })
}

fn allreduce(a: AllreduceArgs) -> Result<ExitCode> {
    let tree = tree_place(
        a.tree_leaves.as_deref(),
        a.leaf,
        a.job.rank,
        a.job.target.workers,
    )?;
    let dtype = a.job.target.dtype;
    let mut cfg = config(&a.job)?;
    cfg.transport.congestion_control = !a.no_congestion_control;
    cfg.transport.delay_target =
        (a.delay_target > 0.0).then(|| Duration::from_secs_f64(a.delay_target / 1e3));
    cfg.transport.window_override = a.window_override;
    cfg.transport_kind = a.transport;
    cfg.threads = a.threads;
    let (rank, n) = (cfg.rank, cfg.n_workers);
    let label = job_label(&a.job.target);
    let kind = a.collective.kind();
    // Refuse a bad --elements before joining (the other ranks would wait).
    let (_, out_len) = io_lengths(kind, a.elements, n)?;
    // In a tree the pattern is the global rank's, and the reference the
    // tree-order sum over every leaf; otherwise the rank-order sum. A
    // reduce-scatter's output is this rank's shard of that sum; an
    // all-gather's, shard r is rank r's pattern (in a tree the switch
    // refuses both: NACK 10).
    let pattern_rank = tree.as_ref().map_or(rank, |t| t.global_rank);
    let mut w = Worker::join(cfg).with_context(|| format!("joining {label} as rank {rank}"))?;
    // A self-provisioned job's id is the switch's.
    let job = w.job();
    // A reduce-scatter rank keeps its own shard (the others' sum plus its
    // own), as the library decides.
    let keeps = kind == Kind::ReduceScatter && w.reduce_scatter_shape(out_len).owner_keeps();
    let expected = |it: u32, i: usize| match (kind, &tree) {
        (Kind::ReduceScatter, _) if keeps => {
            expected_kept_sum_dtype(dtype, n, rank, it, usize::from(rank) * out_len + i)
        }
        (Kind::ReduceScatter, _) => {
            expected_sum_dtype(dtype, n, it, usize::from(rank) * out_len + i)
        }
        (Kind::AllGather, _) => {
            let m = out_len / usize::from(n);
            pattern_dtype(dtype, (i / m) as u16, it, i % m)
        }
        (Kind::AllReduce, Some(t)) => expected_tree_sum_dtype(dtype, &t.sizes, it, i),
        (Kind::AllReduce, None) => expected_sum_dtype(dtype, n, it, i),
    };
    let (who, reference) = match &tree {
        Some(t) => (
            format!(
                "leaf {} rank {rank} (global rank {})",
                t.leaf, t.global_rank
            ),
            "tree-order sum",
        ),
        None => (format!("rank {rank}"), "rank-order sum"),
    };
    let reference = match kind {
        Kind::AllReduce => reference,
        Kind::ReduceScatter if keeps => "others' rank-order sum plus the rank's own shard",
        Kind::ReduceScatter => "rank's shard of the rank-order sum",
        Kind::AllGather => "ranks' inputs",
    };
    let what = format!("job {job} ({who})");
    // In a tree the spine adds the leaves' parts in leaf order.
    let expected_grad = |w: &Worker, it: u32| match &tree {
        Some(t) => expected_tree_stats(dtype, &t.sizes, a.elements, w.elems_per_chunk(), it),
        None => expected_stats(kind, dtype, n, a.elements, w.elems_per_chunk(), it),
    };
    let outcome = match dtype {
        Dtype::F32 => iterate::<f32>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what),
        Dtype::Bf16 => {
            iterate::<half::bf16>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what)
        }
        Dtype::F16 => {
            iterate::<half::f16>(&mut w, &a, pattern_rank, &expected, &expected_grad, &what)
        }
    };
    let Outcome {
        busy,
        mismatches,
        machine_cpu,
        process_cpu,
        switchd_cpu,
        grad,
        stats_mismatches,
        times,
    } = match outcome {
        Ok(o) => o,
        Err(e) => {
            // This process is done with the job: say so, so that the
            // switch does not keep its membership. Otherwise the next
            // process of this rank, if the kernel gives it the same UDP
            // port, is taken for this one asking again and goes on alone,
            // while the other ranks' JOINs reset the job it thinks active.
            let _ = w.leave();
            return Err(e);
        }
    };
    let stats = w.stats();
    // Reduce-scatter and all-gather cut each of the n shards into chunks.
    let shards = if kind == Kind::AllReduce { 1 } else { n };
    let shard = a.elements / usize::from(shards);
    let chunks_per_coll =
        (usize::from(shards) * shard.div_ceil(w.elems_per_chunk() as usize)) as f64;
    let secs = busy.as_secs_f64().max(1e-9);
    let report = Report {
        job,
        rank,
        workers: n,
        dtype: dtype.name(),
        collective: kind.name(),
        elements: a.elements,
        iterations: a.iterations,
        seconds: secs,
        gbit_per_s: (a.elements as f64 * dtype.size() as f64 * 8.0 * a.iterations as f64)
            / secs
            / 1e9,
        chunks_per_s: chunks_per_coll * a.iterations as f64 / secs,
        verified: a.verify && mismatches == 0 && stats_mismatches == 0,
        mismatches,
        tree_leaves: tree.as_ref().map(|t| t.sizes.clone()),
        leaf: tree.as_ref().map(|t| t.leaf),
        global_rank: tree.as_ref().map(|t| t.global_rank),
        elems_per_chunk: w.elems_per_chunk(),
        pool_slots: w.pool_slots(),
        seq_lanes: w.seq_lanes(),
        transport: w.transport().name(),
        threads: w.threads(),
        lane_replies: w.lane_replies(),
        auth: w.auth().name(),
        stats,
        gradient_stats: grad,
        stats_mismatches,
        machine_busy_cpu_s: a.machine_cpu.then_some(machine_cpu),
        process_cpu_s: a.machine_cpu.then_some(process_cpu),
        switchd_cpu_s: switchd_cpu,
        iteration_seconds: times,
    };
    let _ = w.leave();
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "job {job} {who}: {} x {kind} of {} elements in {:.3} s: {:.3} Gbit/s, {:.0} chunks/s, transport {}, threads {}, resent {} (held {} timeouts, {} probes), verified: {}",
            a.iterations, a.elements, secs, report.gbit_per_s, report.chunks_per_s, report.transport, report.threads,
            stats.chunks_resent, stats.held_timeouts, stats.hold_probes,
            if a.verify { if mismatches == 0 && stats_mismatches == 0 { "yes" } else { "NO" } } else { "not checked" }
        );
        for l in report.gradient_stats.iter().flatten() {
            println!(
                "  {kind} {}: sum_of_squares {:e}, square_of_sum {:e}, ranks {}{}",
                l.iteration,
                l.sum_of_squares,
                l.square_of_sum,
                l.ranks,
                match l.verified {
                    Some(true) => ", verified",
                    Some(false) => ", NOT the reference",
                    None => "",
                }
            );
        }
    }
    if mismatches > 0 {
        eprintln!("FAILED: {mismatches} elements differ from the {reference}");
        return Ok(ExitCode::from(2));
    }
    if stats_mismatches > 0 {
        eprintln!(
            "FAILED: the gradient statistics of {stats_mismatches} collectives differ from the \
             reference (proto::member::reference_grad_stats of every rank's pattern)"
        );
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

fn join(a: JobArgs) -> Result<ExitCode> {
    let cfg = config(&a)?;
    match Worker::join(cfg) {
        Ok(w) => {
            println!(
                "joined job {} as rank {}: gen {:#010x}, {} slots, {} {} elements per chunk, \
                 transport {}, auth {}, gradient statistics {}",
                w.job(),
                a.rank,
                w.generation(),
                w.pool_slots(),
                w.elems_per_chunk(),
                w.dtype(),
                w.transport(),
                w.auth(),
                if w.has_gradient_stats() { "on" } else { "off" }
            );
            // Done with the job (docs/PROTOCOL.md, "LEAVE"): a member that
            // exits without it stays one, and this rank's next run (a
            // `worker allreduce`) would be taken for it asking again.
            let (job, rank) = (w.job(), a.rank);
            w.leave().with_context(|| {
                format!(
                    "joined job {job} as rank {rank}, but sending the LEAVE failed: the switch \
                     keeps rank {rank} as a member of job {job}"
                )
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ (WorkerError::Refused { .. } | WorkerError::Provision { .. })) => {
            println!("refused: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let r = match Cli::parse().cmd {
        Cmd::Allreduce(a) => allreduce(a),
        Cmd::Join(a) => join(a),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--delay-target`: milliseconds, 0 (off) up to one second.
fn delay_target_ms(s: &str) -> Result<f64, String> {
    let ms: f64 = s.parse().map_err(|_| {
        format!("'{s}' is not a number of milliseconds (0 turns the delay signal off)")
    })?;
    if !(0.0..=1000.0).contains(&ms) {
        return Err(format!(
            "{ms} ms is outside 0..=1000 (0 turns the delay signal off)"
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn delay_target_takes_milliseconds_and_says_what_is_wrong() {
        assert_eq!(delay_target_ms("0"), Ok(0.0));
        assert_eq!(delay_target_ms("2.5"), Ok(2.5));
        let e = delay_target_ms("2ms").unwrap_err();
        assert!(e.contains("'2ms' is not a number of milliseconds"), "{e}");
        let e = delay_target_ms("5000").unwrap_err();
        assert!(e.contains("outside 0..=1000"), "{e}");
        assert!(delay_target_ms("-1").is_err());
    }

    #[test]
    fn secret_file_is_read_with_its_newline_and_a_missing_one_names_path_and_errno() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("worker-secret-{}", std::process::id()));
        let hex = "0123456789abcdef".repeat(4);
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let args = |p: &Path| {
            let mut a = allreduce_args(&[]).unwrap().job.target;
            a.secret = None;
            a.secret_file = Some(p.to_owned());
            a
        };
        let got = job_secret(&args(&path));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(got.unwrap()[..2], [0x01, 0x23]);
        let e = format!("{:#}", job_secret(&args(&path)).unwrap_err());
        assert!(
            e.contains(&path.display().to_string()) && e.contains("os error 2"),
            "{e}"
        );
    }

    /// `worker join` leaves the job it joined: the one rank of a job on the
    /// loopback stand-in joins and leaves, and the job has no member left.
    /// A join without its LEAVE (the library's, the worker dropped) keeps
    /// its member: what `worker join` did before it left.
    #[test]
    fn join_leaves_the_job_again() {
        use std::net::{Ipv4Addr, SocketAddrV4};
        use worker::loopback::{LoopbackConfig, LoopbackSwitch};
        let secret = [7u8; SECRET_LEN];
        let sw = LoopbackSwitch::start(
            LoopbackConfig::new(1, 1, secret),
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        )
        .unwrap();
        let (port, hex) = (sw.addr().port().to_string(), hex::encode(secret));
        let argv = [
            "worker",
            "join",
            "--switch",
            "127.0.0.1",
            "--port",
            &port,
            "--job",
            "1",
            "--rank",
            "0",
            "--workers",
            "1",
            "--secret",
            &hex,
            "--join-timeout",
            "5",
        ];
        let Cmd::Join(a) = Cli::try_parse_from(argv).unwrap().cmd else {
            unreachable!("parsed as worker join");
        };
        // The switch takes the LEAVE after the join returns: wait for it.
        let settles_at = |want: u16| {
            let deadline = Instant::now() + Duration::from_secs(2);
            while sw.joined_ranks() != want && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            sw.joined_ranks()
        };
        assert_eq!(join(a.clone()).unwrap(), ExitCode::SUCCESS);
        assert_eq!(settles_at(0), 0, "worker join left rank 0 a member");

        let w = Worker::join(config(&a).unwrap()).unwrap();
        drop(w);
        assert_eq!(settles_at(1), 1, "a join without LEAVE keeps its member");
    }

    /// `worker allreduce` of a self-provisioned job, without its key.
    fn provisioned_args(extra: &[&str]) -> SwitchJobArgs {
        let mut argv = vec![
            "worker",
            "allreduce",
            "--switch",
            "198.18.0.1",
            "--rank",
            "1",
            "--workers",
            "3",
            "--elements",
            "8",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().cmd {
            Cmd::Allreduce(a) => a.job.target,
            Cmd::Join(_) => unreachable!(),
        }
    }

    #[test]
    fn a_self_provisioned_job_is_named_by_tenant_key_file_and_job_name_and_only_one_way() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("worker-tenant-key-{}", std::process::id()));
        let hex = "0123456789abcdef".repeat(4);
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = path.to_str().unwrap();
        let base = [
            "--tenant",
            "vision",
            "--tenant-key-file",
            key,
            "--job-name",
            "run-7",
        ];
        let spec = provision_spec(&provisioned_args(&base)).unwrap().unwrap();
        assert_eq!(
            (spec.tenant.as_str(), spec.job_name.as_str()),
            ("vision", "run-7")
        );
        assert_eq!(spec.key[..2], [0x01, 0x23]);
        assert_eq!(
            (spec.auth, spec.stats, spec.priority),
            (AuthMode::Port, false, 1)
        );
        let mut shaped = base.to_vec();
        shaped.extend(["--auth", "mac", "--priority", "high", "--stats"]);
        let spec = provision_spec(&provisioned_args(&shaped)).unwrap().unwrap();
        assert_eq!(
            (spec.auth, spec.stats, spec.priority),
            (AuthMode::Mac, true, 2)
        );
        let a = provisioned_args(&base);
        assert_eq!(job_label(&a), "job \"run-7\" of tenant \"vision\"");
        let cfg = config(&JobArgs {
            target: a,
            rank: 1,
            stall_timeout: 5.0,
        })
        .unwrap();
        assert_eq!(cfg.job, 0);
        assert!(cfg.provision.is_some());

        let err = |extra: &[&str]| {
            format!(
                "{:#}",
                provision_spec(&provisioned_args(extra)).unwrap_err()
            )
        };
        // Both ways, neither, half of one.
        let mut both = base.to_vec();
        both.extend(["--job", "3"]);
        let e = err(&both);
        assert!(
            e.contains("both a declared job and a self-provisioned one")
                && e.contains("--tenant-key-file F"),
            "{e}"
        );
        let e = err(&[]);
        assert!(
            e.contains("no job") && e.contains("--job ID with --secret-file"),
            "{e}"
        );
        let e = err(&["--tenant", "vision", "--tenant-key-file", key]);
        assert!(e.contains("needs --tenant and --job-name"), "{e}");
        let e = err(&[
            "--tenant",
            "vision",
            "--tenant-key-file",
            key,
            "--job-name",
            "a b",
        ]);
        assert!(
            e.contains("--job-name") && e.contains("not a valid name"),
            "{e}"
        );
        let e = err(&["--job", "3", "--secret", "00", "--stats"]);
        assert!(e.contains("shape a self-provisioned job"), "{e}");
        let mut bad = base.to_vec();
        bad.extend(["--auth", "gmac"]);
        assert!(err(&bad).contains("use port or mac"));
        std::fs::remove_file(&path).unwrap();
        // The key file is read by the secret rules: a missing one names it.
        let e = err(&base);
        assert!(
            e.contains("reading the tenant key file") && e.contains(key),
            "{e}"
        );
    }

    fn allreduce_args(extra: &[&str]) -> Result<AllreduceArgs, clap::Error> {
        let mut argv = vec![
            "worker",
            "allreduce",
            "--switch",
            "198.18.0.1",
            "--job",
            "1",
            "--rank",
            "1",
            "--workers",
            "3",
            "--secret",
            "00",
            "--elements",
            "8",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.cmd {
            Cmd::Allreduce(a) => Ok(a),
            Cmd::Join(_) => unreachable!(),
        }
    }

    #[test]
    fn threads_flag_takes_auto_or_a_count_and_refuses_the_rest() {
        assert_eq!(allreduce_args(&[]).unwrap().threads, 0);
        assert_eq!(allreduce_args(&["--threads", "auto"]).unwrap().threads, 0);
        assert_eq!(allreduce_args(&["--threads", "4"]).unwrap().threads, 4);
        for bad in ["0", "65", "two"] {
            let e = allreduce_args(&["--threads", bad])
                .err()
                .unwrap_or_else(|| panic!("--threads {bad} is refused"))
                .to_string();
            assert!(e.contains("`auto` or a number from 1 to 64"), "{e}");
        }
    }

    #[test]
    fn switchd_pid_needs_machine_cpu_and_reads_that_process() {
        assert_eq!(allreduce_args(&[]).unwrap().switchd_pid, None);
        let a = allreduce_args(&["--machine-cpu", "--switchd-pid", "42"]).unwrap();
        assert_eq!(a.switchd_pid, Some(42));
        let e = allreduce_args(&["--switchd-pid", "42"])
            .err()
            .expect("--switchd-pid without --machine-cpu is refused")
            .to_string();
        assert!(e.contains("--machine-cpu"), "{e}");
        assert!(allreduce_args(&["--machine-cpu", "--switchd-pid", "x"]).is_err());
        // This process stands in for switchd: its own CPU, read by PID.
        let own = pid_cpu_seconds(std::process::id()).unwrap();
        assert!(own >= 0.0 && own <= process_cpu_seconds().unwrap() + 1.0 / USER_HZ);
        let e = pid_cpu_seconds(u32::MAX).unwrap_err().to_string();
        assert!(
            e.contains(&format!("/proc/{}/stat", u32::MAX)) && e.contains("--switchd-pid"),
            "{e}"
        );
    }

    #[test]
    fn transport_flag_takes_the_three_names_and_defaults_to_auto() {
        assert_eq!(allreduce_args(&[]).unwrap().transport, TransportKind::Auto);
        for (name, kind) in [
            ("mmsg", TransportKind::Mmsg),
            ("udp-gso", TransportKind::UdpGso),
        ] {
            assert_eq!(
                allreduce_args(&["--transport", name]).unwrap().transport,
                kind
            );
        }
        let e = allreduce_args(&["--transport", "gso"])
            .err()
            .expect("an unknown transport is refused")
            .to_string();
        assert!(e.contains("udp-gso"), "{e}");
    }

    fn place_of(a: &AllreduceArgs) -> Result<Option<TreePlace>> {
        tree_place(
            a.tree_leaves.as_deref(),
            a.leaf,
            a.job.rank,
            a.job.target.workers,
        )
    }

    #[test]
    fn collective_flag_takes_the_three_kinds_and_refuses_others_naming_them() {
        assert_eq!(
            allreduce_args(&[]).unwrap().collective,
            CollectiveArg::AllReduce
        );
        for (name, kind) in [
            ("all-reduce", Kind::AllReduce),
            ("reduce-scatter", Kind::ReduceScatter),
            ("all-gather", Kind::AllGather),
        ] {
            let a = allreduce_args(&["--collective", name]).unwrap();
            assert_eq!(a.collective.kind(), kind);
            // The report and errors use the same names.
            assert_eq!(kind.name(), name);
        }
        let e = allreduce_args(&["--collective", "allgather"])
            .err()
            .expect("an unknown collective is refused")
            .to_string();
        for want in ["allgather", "all-reduce", "reduce-scatter", "all-gather"] {
            assert!(e.contains(want), "{want:?} missing from: {e}");
        }
    }

    #[test]
    fn sharded_collectives_split_elements_into_n_shards() {
        assert_eq!(io_lengths(Kind::AllReduce, 10, 3).unwrap(), (10, 10));
        assert_eq!(io_lengths(Kind::ReduceScatter, 12, 3).unwrap(), (12, 4));
        assert_eq!(io_lengths(Kind::AllGather, 12, 3).unwrap(), (4, 12));
        let e = format!("{:#}", io_lengths(Kind::AllGather, 10, 4).unwrap_err());
        assert_eq!(
            e,
            "--elements 10 is not a multiple of --workers 4: all-gather needs n shards of \
             the same length (try --elements 12)"
        );
    }

    #[test]
    fn dtype_defaults_to_f32_and_names_the_choices() {
        assert_eq!(allreduce_args(&[]).unwrap().job.target.dtype, Dtype::F32);
        let a = allreduce_args(&["--dtype", "bf16"]).unwrap();
        assert_eq!(a.job.target.dtype, Dtype::Bf16);
        let Err(e) = allreduce_args(&["--dtype", "fp16"]) else {
            panic!("--dtype fp16 was taken");
        };
        let e = e.to_string();
        assert!(e.contains("f32, bf16 or f16"), "{e}");
        // And the reference it verifies against rounds once: some sums of
        // the pattern in bf16 are not the f32 sum.
        let rounds = (0..1000).any(|i| {
            expected_sum_dtype(Dtype::Bf16, 4, 0, i)
                != (0..4)
                    .map(|r| proto::reference::pattern_dtype(Dtype::Bf16, r, 0, i))
                    .sum::<f32>()
        });
        assert!(rounds, "the verify pattern must make bf16 sums round");
    }

    #[test]
    fn without_the_tree_options_nothing_changes() {
        let a = allreduce_args(&["--verify"]).unwrap();
        assert_eq!((a.tree_leaves.as_ref(), a.leaf), (None, None));
        assert_eq!(place_of(&a).unwrap(), None);
    }

    #[test]
    fn tree_leaves_parse_as_a_comma_list_and_map_to_the_global_rank() {
        // Rank 1 of leaf 1 of leaves 2, 3, 1: global rank 2 + 1.
        let a = allreduce_args(&["--tree-leaves", "2,3,1", "--leaf", "1"]).unwrap();
        assert_eq!(a.tree_leaves.as_deref(), Some(&[2u16, 3, 1][..]));
        assert_eq!(
            place_of(&a).unwrap(),
            Some(TreePlace {
                sizes: vec![2, 3, 1],
                leaf: 1,
                global_rank: 3
            })
        );
        // Leaf 0: the global rank is the local rank.
        let p = tree_place(Some(&[3, 3]), Some(0), 2, 3).unwrap().unwrap();
        assert_eq!(p.global_rank, 2);
        let p = tree_place(Some(&[3, 3]), Some(1), 2, 3).unwrap().unwrap();
        assert_eq!(p.global_rank, 5);
    }

    #[test]
    fn tree_leaves_that_are_not_numbers_are_refused_by_the_parser() {
        for bad in ["2,x", "2,70000", "-1"] {
            assert!(
                allreduce_args(&["--tree-leaves", bad, "--leaf", "0"]).is_err(),
                "{bad}"
            );
        }
    }

    fn err(sizes: Option<&[u16]>, leaf: Option<usize>, rank: u16, workers: u16) -> String {
        format!("{:#}", tree_place(sizes, leaf, rank, workers).unwrap_err())
    }

    #[test]
    fn process_ticks_are_utime_plus_stime_whatever_the_command_name() {
        let stat = "4242 (worker (rank 1)) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0 20 0 1 0 5 6 7";
        assert_eq!(parse_process_ticks(stat), Some(345));
        assert_eq!(parse_process_ticks("4242 (worker) S 1 2"), None);
        assert!(process_cpu_seconds().unwrap() >= 0.0);
    }

    #[test]
    fn machine_busy_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  10 2 30 4000 50 6 7 8 9 0\ncpu0 5 1 15 2000 25 3 3 4 0 0\nintr 1\n";
        assert_eq!(
            parse_machine_busy_ticks(stat),
            Some(10 + 2 + 30 + 6 + 7 + 8)
        );
        assert_eq!(parse_machine_busy_ticks("cpu0 1 2 3\n"), None);
        assert_eq!(parse_machine_busy_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(parse_machine_busy_ticks("cpu  1 2 3 4 5\n"), None);
    }

    #[test]
    fn bad_tree_options_say_what_is_wrong() {
        assert_eq!(
            err(Some(&[2, 2]), None, 0, 2),
            "--tree-leaves needs --leaf (this worker's leaf, from 0)"
        );
        assert_eq!(
            err(None, Some(0), 0, 2),
            "--leaf needs --tree-leaves (workers per leaf, in leaf order)"
        );
        assert_eq!(
            err(Some(&[2, 2]), Some(2), 0, 2),
            "--tree-leaves 2,2 --leaf 2 --rank 0: there is no leaf 2: the tree has 2 leaves, numbered from 0"
        );
        assert_eq!(
            err(Some(&[2, 3]), Some(0), 2, 3),
            "--tree-leaves 2,3 --leaf 0 --rank 2: there is no local rank 2 in leaf 0: it has 2 workers, ranks 0 to 1"
        );
        assert_eq!(
            err(Some(&[65535, 1]), Some(1), 0, 1),
            "--tree-leaves 65535,1 --leaf 1 --rank 0: the leaves have 65536 workers in all, more than 65535 (global ranks are 16 bits)"
        );
        assert_eq!(
            err(Some(&[2, 0]), Some(0), 0, 2),
            "--tree-leaves 2,0 --leaf 0 --rank 0: leaf 1 has no workers (every leaf needs at least one)"
        );
        assert_eq!(
            err(Some(&[2, 3]), Some(1), 1, 2),
            "--workers 2 is not the size of leaf 1 in --tree-leaves 2,3 (3): \
             --workers is the number of ranks of this worker's leaf"
        );
        // The largest tree there may be is accepted.
        let p = tree_place(Some(&[65534, 1]), Some(1), 0, 1)
            .unwrap()
            .unwrap();
        assert_eq!(p.global_rank, 65534);
    }

    /// The CLI's reference statistics are of every rank's pattern rounded
    /// to the dtype: the same chunking as an all-reduce gives a
    /// reduce-scatter the same bits when the shards end on chunk
    /// boundaries, other chunks other bits; bf16 inputs are the rounded
    /// values; an all-gather has none.
    #[test]
    fn expected_stats_follow_the_chunks_and_the_dtype() {
        let (n, elements) = (4u16, 4 * 60);
        let s = |kind, dtype, e| expected_stats(kind, dtype, n, elements, e, 2).unwrap();
        let ar = s(Kind::AllReduce, Dtype::F32, 20);
        assert_eq!(ar.ranks, 4);
        assert!(s(Kind::ReduceScatter, Dtype::F32, 20).bits_eq(&ar));
        assert!(!s(Kind::ReduceScatter, Dtype::F32, 7).bits_eq(&ar));
        assert!(!s(Kind::AllReduce, Dtype::Bf16, 20).bits_eq(&ar));
        // By hand for one rank, one chunk of five elements, one per lane.
        let one = expected_stats(Kind::AllReduce, Dtype::F32, 1, 5, 8, 0).unwrap();
        let q: Vec<f64> = (0..5)
            .map(|i| f64::from(pattern(0, 0, i)).powi(2))
            .collect();
        let want = ((q[0] + q[1]) + (q[2] + q[3])) + q[4];
        assert_eq!(one.sum_of_squares.to_bits(), want.to_bits());
        assert_eq!(one.square_of_sum.to_bits(), want.to_bits());
        assert_eq!(
            expected_stats(Kind::AllGather, Dtype::F32, n, elements, 20, 2),
            None
        );
        // A one-leaf tree is the single switch; two leaves of two count
        // the same ranks, in tree order.
        let tree = |sizes: &[u16]| expected_tree_stats(Dtype::F32, sizes, elements, 20, 2).unwrap();
        assert!(tree(&[4]).bits_eq(&ar));
        assert_eq!(tree(&[2, 2]).ranks, 4);
    }
}
