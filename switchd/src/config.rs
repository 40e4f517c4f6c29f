//! switchd's configuration file (TOML): the switch's ports and addresses,
//! and the jobs it serves.
//!
//! ```toml
//! [switch]
//! ports = ["sw-w0", "sw-w1"]        # interfaces to attach to (required)
//! addresses = ["198.18.0.1"]        # the switch's own IPv4 addresses (required)
//! agg_port = 48879                  # UDP port of the aggregation service
//! queues = 1                        # AF_XDP sockets per port (queues 0..queues)
//! attach_mode = "auto"              # "auto" | "driver" | "skb"
//! summary_interval_secs = 5         # one log line per job this often
//! frames_per_socket = 4096          # UMEM frames per socket (4 KiB each)
//! admin_socket = "/run/aggswitch/switchd.sock"  # for switchctl
//! ecn_ring_threshold = 0.5          # ring occupancy that marks ECE (≥ 1: off)
//! dataplane_threads = 1             # sockets are dealt among the threads
//! seq_lanes = 1                     # DATA of seq s on agg_port + s mod seq_lanes (power of two ≤ 64)
//! pin_threads = true                # thread i on CPU i
//! metrics_listen = "127.0.0.1:9100" # Prometheus /metrics (the default; "off": none)
//! metrics_on_data_network = false   # true: allow a metrics_listen the workers reach
//! metrics_per_job = true            # false: no aggswitch_job_*/aggswitch_spine_* series
//! mode = "aggregate"                # "aggregate" | "echo" | "xdp-drop" (benchmarks)
//! forwarding = "xdp"                # "xdp": unicast fast path in XDP | "bridge": all via br0
//! watchdog_secs = 5                 # a stuck dataplane thread ends switchd (0: off)
//!
//! [[job]]
//! id = 1                            # 1..=65535
//! n_workers = 4
//! allowed_sources = ["198.18.0.0/24"]
//! secret = "<64 hex digits>"        # 32 bytes
//! pool_slots = 256                  # power of two
//! elems_per_chunk = 358             # default: from the ports' MTU less the RESULT's token (×2 for bf16/f16)
//! window = 256                      # default: pool_slots
//! dtype = "f32"                     # "f32" | "bf16" | "f16" (JOINs must match)
//! auth = "port"                     # "port" | "mac": a tag on every DATA/RESULT
//! stats = false                     # true: gradient statistics on every summed RESULT
//! priority = "normal"               # "low" | "normal" | "high": yields to busy higher classes
//! ```
//!
//! `/metrics` listens on loopback (`127.0.0.1:9100`) when `metrics_listen`
//! is absent; if that port is taken switchd warns and runs without it, while
//! an address the operator named that cannot be bound stops switchd. An
//! address the workers' network reaches (`0.0.0.0`, `::`, one of
//! `addresses` or `uplink`, and at start any address of a port or its
//! bridge) is refused unless `metrics_on_data_network = true`
//! ([`crate::exposure`]).
//!
//! Invariant: a [`Config`] that loaded has passed every check a job table
//! would make, so the daemon never starts half-configured. Errors name the
//! file, the line and the key.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use proto::switch::config::max_elems_for;
use proto::switch::{Ipv4Prefix, JobConfig, JobConfigError, Priority, SpineAddr, Upstream};
use proto::tag::AuthMode;
use proto::wire::{
    elems_per_chunk_for_mtu, Dtype, DEFAULT_AGG_PORT, FRAME_PAYLOAD_OFFSET, SECRET_LEN,
};
use serde::{Deserialize, Serialize};

/// Bytes of one UMEM frame.
pub const FRAME_SIZE: usize = 4096;
/// Largest chunk that fits in one received frame: AF_XDP puts received
/// data [`crate::xdp::RX_HEADROOM`] bytes into the frame. Without
/// multi-buffer, a chunk and its headers must fit in one.
pub const MAX_ELEMS_IN_FRAME: u16 =
    ((FRAME_SIZE - crate::xdp::RX_HEADROOM - FRAME_PAYLOAD_OFFSET) / 4) as u16;
/// Largest port MTU whose frames reach the XDP program and the AF_XDP
/// socket in one buffer: veth builds an XDP buffer in one 4 KiB page less
/// headroom and `skb_shared_info`. Above it switchd binds its sockets with
/// multi-buffer (`XDP_USE_SG`).
pub const SINGLE_BUFFER_MTU: u16 = 3500;
/// Largest port MTU switchd serves: a chunk of
/// [`proto::wire::MAX_ELEMS_PER_CHUNK`] floats, gathered from several
/// buffers into [`crate::xdp::MAX_PACKET`] bytes.
pub const MAX_PORT_MTU: u16 = 9000;

/// Whether ports with these MTUs need multi-buffer AF_XDP sockets.
pub fn needs_multi_buffer(ports: &[String], mtu_of: impl Fn(&str) -> Option<u16>) -> bool {
    ports
        .iter()
        .filter_map(|p| mtu_of(p))
        .any(|m| m > SINGLE_BUFFER_MTU)
}

/// Largest chunk a job may have: one frame's worth without multi-buffer,
/// the protocol's largest (a 9000-byte MTU) with it.
pub fn max_elems_per_chunk(multi_buffer: bool) -> u16 {
    if multi_buffer {
        proto::wire::MAX_ELEMS_PER_CHUNK
    } else {
        MAX_ELEMS_IN_FRAME
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// What the switch does with aggregation frames. Only `Aggregate` is a
/// switch; the others are baselines for `scripts/bench.sh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DataplaneMode {
    /// Steer to AF_XDP and aggregate (the switch).
    #[default]
    Aggregate,
    /// Steer to AF_XDP and send every frame straight back where it came
    /// from, addresses swapped: the AF_XDP I/O limit.
    Echo,
    /// Drop in XDP every frame that would be steered: the kernel's limit.
    XdpDrop,
}

/// How frames that are not aggregation traffic cross the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ForwardingSetting {
    /// Learned unicast is redirected port to port in XDP (DEVMAP); the rest
    /// (broadcast, multicast, unknown, for the switch, VLAN) goes to the bridge.
    #[default]
    Xdp,
    /// Everything is passed to the Linux bridge the ports belong to.
    Bridge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttachModeSetting {
    #[default]
    Auto,
    Driver,
    Skb,
}

fn default_agg_port() -> u16 {
    DEFAULT_AGG_PORT
}
fn default_queues() -> u32 {
    1
}
fn default_summary() -> f64 {
    5.0
}
fn default_frames() -> u32 {
    4096
}
fn default_slots() -> u16 {
    256
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    pub ports: Vec<String>,
    pub addresses: Vec<Ipv4Addr>,
    #[serde(default = "default_agg_port")]
    pub agg_port: u16,
    #[serde(default = "default_queues")]
    pub queues: u32,
    #[serde(default)]
    pub attach_mode: AttachModeSetting,
    #[serde(default = "default_summary")]
    pub summary_interval_secs: f64,
    #[serde(default = "default_frames")]
    pub frames_per_socket: u32,
    #[serde(default)]
    pub zero_copy: bool,
    /// Mark RESULTs with ECE when an AF_XDP ring is fuller than this
    /// fraction while a slot aggregates (docs/PROTOCOL.md congestion control);
    /// 1.0 or more turns ring-based marking off.
    #[serde(default = "default_ecn_threshold")]
    pub ecn_ring_threshold: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics: [`MetricsListen`]
    /// (absent: loopback, [`DEFAULT_METRICS_LISTEN`]; `"off"`).
    #[serde(default, skip_serializing_if = "MetricsListen::is_default")]
    pub metrics_listen: MetricsListen,
    /// Allow `metrics_listen` on an address the workers' network reaches
    /// (refused otherwise: [`crate::exposure`]); switchd then warns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metrics_on_data_network: bool,
    /// Serve the per-job series (`aggswitch_job_*`, `aggswitch_spine_*`)
    /// on `/metrics`; false leaves them out, keeping the switch-wide, port,
    /// socket and thread series.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub metrics_per_job: bool,
    /// Dataplane threads; the sockets (ports × queues) are dealt among them.
    #[serde(default = "default_threads")]
    pub dataplane_threads: u32,
    /// Seq lanes (docs/PROTOCOL.md, "Seq lanes"): DATA of seq s is taken on
    /// `agg_port` + (s mod seq_lanes), and the CHALLENGE tells workers, so
    /// that NIC ntuple rules can steer each lane to a queue and thread of
    /// its own (docs/NICS.md, "Seq lanes: one large job over every core").
    /// A power of two, 1..=64.
    #[serde(default = "default_seq_lanes")]
    pub seq_lanes: u16,
    /// Pin dataplane thread i to CPU i (mod the CPUs available).
    #[serde(default = "default_true")]
    pub pin_threads: bool,
    /// Unix socket of the admin interface (switchctl).
    #[serde(default = "default_admin_socket")]
    pub admin_socket: PathBuf,
    /// Aggregate (default), or a benchmark baseline.
    #[serde(default)]
    pub mode: DataplaneMode,
    /// Forwarding fast path in XDP (default) or everything via the bridge.
    #[serde(default)]
    pub forwarding: ForwardingSetting,
    /// Memory all jobs' slot pools may take, in MiB (default: a quarter of
    /// the machine's memory). A job that would not fit is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_memory_mib: Option<u64>,
    /// On a leaf of an aggregation tree: the address and UDP port partial
    /// sums go up from and spines answer to (one of this switch's own
    /// addresses that every spine routes back to; docs/PROTOCOL.md,
    /// "Aggregation trees").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<std::net::SocketAddrV4>,
    /// Seconds a dataplane thread may go without progress while it has
    /// work before switchd logs it and exits (status 70) for its supervisor
    /// to restart it; 0 turns the watchdog off.
    #[serde(default = "default_watchdog_secs")]
    pub watchdog_secs: f64,
}

/// Share of the machine's memory the slot pools may take by default.
pub const DEFAULT_POOL_MEMORY_FRACTION: u64 = 4;
/// The budget when /proc/meminfo cannot be read.
pub const FALLBACK_POOL_MEMORY: u64 = 1 << 30;

/// MemTotal of /proc/meminfo, in bytes.
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl SwitchSection {
    /// Whether `/metrics` would listen where the workers' network reaches
    /// ([`crate::exposure`]): the unspecified address, the switch's own
    /// addresses, or one of `interfaces` (the ports' and their bridges'
    /// addresses, [`crate::exposure::data_interfaces`]). `Err`: refused,
    /// the message naming the address, why and the fix; `Ok(Some)`:
    /// allowed by `metrics_on_data_network`, the warning to log.
    pub fn check_metrics_exposure(
        &self,
        interfaces: &[crate::exposure::InterfaceAddr],
    ) -> Result<Option<String>, String> {
        let Some(addr) = self.metrics_listen.addr() else {
            return Ok(None);
        };
        let why = crate::exposure::exposure(addr.ip(), &self.addresses, self.uplink, interfaces);
        crate::exposure::check(
            addr,
            why,
            crate::exposure::Policy {
                allow: self.metrics_on_data_network,
                per_job: self.metrics_per_job,
            },
        )
    }

    /// The slot-pool memory budget in bytes.
    pub fn pool_budget_bytes(&self) -> u64 {
        match self.pool_memory_mib {
            Some(mib) => mib.saturating_mul(1 << 20),
            None => {
                machine_memory().map_or(FALLBACK_POOL_MEMORY, |m| m / DEFAULT_POOL_MEMORY_FRACTION)
            }
        }
    }
}

fn default_watchdog_secs() -> f64 {
    5.0
}

fn default_threads() -> u32 {
    1
}

fn default_seq_lanes() -> u16 {
    1
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Where `/metrics` listens when `metrics_listen` is absent: loopback, on
/// the management side.
pub const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9100));

/// `[switch] metrics_listen`: absent, `"off"`, or `"ADDR:PORT"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsListen {
    /// Absent: [`DEFAULT_METRICS_LISTEN`]. If that cannot be bound (the
    /// port is taken), switchd warns and runs without `/metrics`.
    #[default]
    Default,
    /// `"off"`: no endpoint.
    Off,
    /// An address the operator named: failing to bind it is an error.
    At(SocketAddr),
}

impl MetricsListen {
    /// The address to listen on, `None` when off.
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            MetricsListen::Default => Some(DEFAULT_METRICS_LISTEN),
            MetricsListen::Off => None,
            MetricsListen::At(a) => Some(a),
        }
    }

    pub fn is_default(&self) -> bool {
        *self == MetricsListen::Default
    }
}

impl std::str::FromStr for MetricsListen {
    type Err = String;
    fn from_str(s: &str) -> Result<MetricsListen, String> {
        if s == "off" {
            return Ok(MetricsListen::Off);
        }
        s.parse().map(MetricsListen::At).map_err(|_| {
            format!(
                "metrics_listen must be \"ADDR:PORT\" (e.g. \"127.0.0.1:9100\", \"[::1]:9100\") \
                 or \"off\", got {s:?}"
            )
        })
    }
}

impl std::fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsListen::Default => write!(f, "{DEFAULT_METRICS_LISTEN}"),
            MetricsListen::Off => f.write_str("off"),
            MetricsListen::At(a) => write!(f, "{a}"),
        }
    }
}

impl Serialize for MetricsListen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MetricsListen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MetricsListen, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn default_ecn_threshold() -> f64 {
    0.5
}

/// The admin socket ([`crate::admin`], switchctl's default) when
/// `admin_socket` is absent.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/aggswitch/switchd.sock";

fn default_admin_socket() -> PathBuf {
    PathBuf::from(DEFAULT_ADMIN_SOCKET)
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    pub id: u16,
    pub n_workers: u16,
    pub allowed_sources: Vec<Ipv4Net>,
    pub secret: String,
    #[serde(default = "default_slots")]
    pub pool_slots: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elems_per_chunk: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u16>,
    /// Element type: "f32" (when absent), "bf16" or "f16".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// DATA/RESULT authentication: "port" (when absent) or "mac".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// Class against other jobs: "low", "normal" (when absent) or "high".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// On a leaf: this job's place in its trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamSection>,
    /// Gradient statistics: a 24-byte trailer on every summed RESULT
    /// (docs/PROTOCOL.md, "Gradient statistics"); false when absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stats: bool,
}

/// `[job.upstream]`: a leaf's place in a job's aggregation trees.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// This leaf's rank at the spines (leaves are summed in this order).
    pub leaf_index: u16,
    pub n_leaves: u16,
    /// The spines' aggregation addresses, in tree order: chunk seq s goes
    /// through spines[s mod K].
    pub spines: Vec<std::net::SocketAddrV4>,
}

/// The file as written: its typed sections, before the checks of
/// [`Config::parse`] (`switchd testbed-config` writes it).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub switch: SwitchSection,
    #[serde(default, rename = "job")]
    pub jobs: Vec<JobSection>,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub switch: SwitchSection,
    pub jobs: Vec<JobConfig>,
    /// Some port's MTU is above [`SINGLE_BUFFER_MTU`]: sockets are bound
    /// with multi-buffer and chunks may be up to a 9000-byte MTU's.
    pub multi_buffer: bool,
}

/// Parses a job's secret of 64 hex digits and refuses a weak one (every
/// byte the same, all zeros included): anyone guesses it at once.
pub fn parse_secret(s: &str) -> Result<[u8; SECRET_LEN], String> {
    let from = proto::secret::SecretSource::Arg;
    let secret = proto::secret::parse_secret(s, &from).map_err(|e| match e {
        proto::secret::SecretError::NotHex { detail, .. } => {
            format!("secret is not hex: {detail}")
        }
        proto::secret::SecretError::Length { got, .. } => format!(
            "secret must be {SECRET_LEN} bytes (64 hex digits), got {got} bytes; {}",
            proto::secret::HOW_TO_MAKE
        ),
        e => e.to_string(),
    })?;
    if proto::secret::is_weak(&secret) {
        return Err(format!(
            "secret is weak (every byte is {:#04x}) and is refused; {}",
            secret[0],
            proto::secret::HOW_TO_MAKE
        ));
    }
    Ok(secret)
}

/// The warning for a configuration file that declares jobs (so holds their
/// secrets) and that group or others can read; `None` when only its owner
/// can, when it declares no job, or when its mode cannot be read.
pub fn secrets_exposure(path: &Path, cfg: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if cfg.jobs.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    proto::secret::exposure_warning(path, mode)
}

impl JobSection {
    /// Turns the section into a job declaration; `default_elems` (float32
    /// elements, scaled for a half-precision dtype) comes from the ports' MTU.
    /// `uplink` is `[switch] uplink`, which a job with `upstream` needs.
    /// `max_elems` is [`max_elems_per_chunk`] for the ports' MTU.
    pub fn to_job_config(
        &self,
        default_elems: u16,
        max_elems: u16,
        uplink: Option<std::net::SocketAddrV4>,
    ) -> Result<JobConfig, String> {
        let secret = parse_secret(&self.secret).map_err(|e| format!("job {}: {e}", self.id))?;
        let dtype: Dtype = match &self.dtype {
            None => Dtype::F32,
            Some(d) => d
                .parse()
                .map_err(|e| format!("job {}: dtype: {e}", self.id))?,
        };
        let auth: AuthMode = match &self.auth {
            None => AuthMode::Port,
            Some(a) => a
                .parse()
                .map_err(|e| format!("job {}: auth: {e}", self.id))?,
        };
        let priority: Priority = match &self.priority {
            None => Priority::default(),
            Some(p) => p.parse().map_err(|e| format!("job {}: {e}", self.id))?,
        };
        // switchd sends a tagged RESULT from one TX frame (the tag follows
        // the payload), so an auth = "mac" job's chunk fits one frame.
        let max_elems = match auth {
            AuthMode::Port => max_elems,
            AuthMode::Mac => max_elems.min(MAX_ELEMS_IN_FRAME),
        };
        let mut cfg = JobConfig {
            id: self.id,
            n_workers: self.n_workers,
            allowed_sources: self
                .allowed_sources
                .iter()
                .map(|n| Ipv4Prefix {
                    addr: n.network().octets(),
                    len: n.prefix_len(),
                })
                .collect(),
            secret,
            pool_slots: self.pool_slots,
            elems_per_chunk: self.elems_per_chunk.unwrap_or(default_elems),
            dtype,
            window: self.window.unwrap_or(self.pool_slots),
            priority,
            auth,
            upstream: match (&self.upstream, uplink) {
                (None, _) => None,
                (Some(_), None) => {
                    return Err(format!(
                        "job {}: [job.upstream] needs [switch] uplink = \"ADDR:PORT\", the \
                         address partial sums go up from",
                        self.id
                    ))
                }
                (Some(u), Some(local)) => Some(Upstream {
                    leaf_index: u.leaf_index,
                    n_leaves: u.n_leaves,
                    spines: u
                        .spines
                        .iter()
                        .map(|a| SpineAddr {
                            ip: a.ip().octets(),
                            port: a.port(),
                        })
                        .collect(),
                    local_ip: local.ip().octets(),
                    local_port: local.port(),
                }),
            },
            stats: self.stats,
        };
        // A leaf's chunks are float32 towards its spines, whatever the
        // dtype; a mac job's leave room for the tag, a stats job's for the
        // statistics trailer.
        if self.elems_per_chunk.is_none() {
            let f32_elems = default_elems.min(max_elems);
            cfg.elems_per_chunk = max_elems_for(f32_elems, cfg.chunk_dtype(), auth, cfg.stats);
        }
        cfg.validate(max_elems)
            .map_err(|e: JobConfigError| e.to_string())?;
        Ok(cfg)
    }
}

/// Elements per chunk that fit every port: from the smallest MTU, capped by
/// what the sockets take (see [`max_elems_per_chunk`]). `mtu_of` reads an
/// interface's MTU (None if unknown).
pub fn default_elems_per_chunk(ports: &[String], mtu_of: impl Fn(&str) -> Option<u16>) -> u16 {
    let mtu = ports.iter().filter_map(|p| mtu_of(p)).min().unwrap_or(1500);
    let max = max_elems_per_chunk(needs_multi_buffer(ports, &mtu_of));
    elems_per_chunk_for_mtu(mtu).clamp(1, max)
}

/// Reads an interface's MTU from sysfs.
pub fn sysfs_mtu(ifname: &str) -> Option<u16> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A layout of dataplane threads, sockets, CPUs and NIC queues that runs but
/// wastes cores or loses traffic. `switchd check-config` prints these and
/// `switchd run` logs them; neither refuses the configuration (threads
/// beyond the sockets are already an error of [`Config::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutWarning {
    /// More dataplane threads than CPUs switchd may run on.
    ThreadsOverCores { threads: u32, cores: usize },
    /// The sockets (ports × queues) do not divide evenly among the threads.
    UnevenSockets {
        ports: usize,
        queues: u32,
        threads: u32,
    },
    /// `queues` asks for queues the port does not have.
    QueuesOverNic { port: String, queues: u32, nic: u32 },
    /// The port has receive queues without a socket.
    QueuesUnderNic { port: String, queues: u32, nic: u32 },
    /// Seq lanes that ntuple rules cannot map one to a queue, each queue
    /// to one thread.
    LanesNotQueues {
        lanes: u16,
        queues: u32,
        threads: u32,
    },
}

impl std::fmt::Display for LayoutWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutWarning::ThreadsOverCores { threads, cores } => write!(
                f,
                "switch.dataplane_threads = {threads} but switchd may run on only {cores} CPUs \
                 here (its CPU affinity and cgroup quota): the threads share CPUs and each spins \
                 before it sleeps, so they slow one another down; set dataplane_threads to \
                 {cores} or fewer"
            ),
            LayoutWarning::UnevenSockets {
                ports,
                queues,
                threads,
            } => {
                let sockets = *ports as u32 * queues;
                let (base, extra) = (sockets / threads, sockets % threads);
                let divisor = (1..=*threads)
                    .rev()
                    .find(|t| sockets.is_multiple_of(*t))
                    .unwrap_or(1);
                // The smallest queue count at or above `queues` that deals
                // evenly (there is always one: queues = threads).
                let even_queues =
                    (*queues..=64).find(|q| (*ports as u32 * q).is_multiple_of(*threads));
                write!(
                    f,
                    "{sockets} AF_XDP sockets ({ports} ports × {queues} queues) dealt among \
                     {threads} dataplane threads: {extra} of them serve {} sockets and {} serve \
                     {base}, so under even traffic the busier ones limit the switch; set \
                     dataplane_threads = {divisor}",
                    base + 1,
                    threads - extra,
                )?;
                if let Some(q) = even_queues {
                    write!(f, ", or queues = {q} (and the NICs' queues to match)")?;
                }
                Ok(())
            }
            LayoutWarning::QueuesOverNic { port, queues, nic } => write!(
                f,
                "switch.queues = {queues} but {port} has {}: its AF_XDP socket for {} cannot \
                 bind and switchd does not start (or, where the NIC has more transmit queues, \
                 it receives nothing); give it {queues} queues (ethtool -L {port} combined \
                 {queues}) or set queues = {nic}",
                receive_queues(*nic),
                queue_range(*nic, queues - 1),
            ),
            LayoutWarning::QueuesUnderNic { port, queues, nic } => write!(
                f,
                "{port} has {} but switch.queues = {queues}: RSS hashes some workers' flows to \
                 its {}, which no AF_XDP socket serves, so the XDP program passes their frames \
                 to the kernel and they are never aggregated; set its queues to {queues} \
                 (ethtool -L {port} combined {queues}) or queues = {nic}",
                receive_queues(*nic),
                queue_range(*queues, nic - 1),
            ),
            LayoutWarning::LanesNotQueues {
                lanes,
                queues,
                threads,
            } => write!(
                f,
                "switch.seq_lanes = {lanes} with queues = {queues} and dataplane_threads = \
                 {threads}: each lane needs a queue of its own (an ntuple rule per lane) served \
                 by one thread (thread q serves queue q of every port only when threads ≤ \
                 queues); otherwise a chunk's DATA reach more than one thread and the lanes \
                 gain nothing; set seq_lanes = queues = dataplane_threads (or seq_lanes = 1)"
            ),
        }
    }
}

/// Warnings about seq lanes (more than one) that do not map one to one
/// onto queues served, queue q by thread q, on every port: lane l's rule
/// steers to queue l, so lanes must equal queues, with no more threads
/// than queues ([`crate::dataplane::deal`]).
pub fn lane_warnings(lanes: u16, queues: u32, threads: u32) -> Vec<LayoutWarning> {
    if lanes > 1 && (u32::from(lanes) != queues || threads > queues) {
        vec![LayoutWarning::LanesNotQueues {
            lanes,
            queues,
            threads,
        }]
    } else {
        Vec::new()
    }
}

fn receive_queues(n: u32) -> String {
    if n == 1 {
        "1 receive queue".into()
    } else {
        format!("{n} receive queues")
    }
}

/// "queue 3" or "queues 3..7".
fn queue_range(first: u32, last: u32) -> String {
    if first == last {
        format!("queue {first}")
    } else {
        format!("queues {first}..{last}")
    }
}

/// Warnings about threads, CPUs and sockets: more threads than `cores`
/// (None: unknown, no warning), or `ports × queues` sockets that the
/// threads cannot share evenly.
pub fn layout_warnings(
    cores: Option<usize>,
    ports: usize,
    queues: u32,
    threads: u32,
) -> Vec<LayoutWarning> {
    let mut w = Vec::new();
    if let Some(cores) = cores {
        if threads as usize > cores {
            w.push(LayoutWarning::ThreadsOverCores { threads, cores });
        }
    }
    let sockets = ports as u32 * queues;
    if threads > 0 && threads <= sockets && !sockets.is_multiple_of(threads) {
        w.push(LayoutWarning::UnevenSockets {
            ports,
            queues,
            threads,
        });
    }
    w
}

/// Warnings about each port whose receive queue count (`rx_queues_of`,
/// None: unknown, no warning) differs from `queues`.
pub fn nic_queue_warnings(
    ports: &[String],
    queues: u32,
    rx_queues_of: impl Fn(&str) -> Option<u32>,
) -> Vec<LayoutWarning> {
    ports
        .iter()
        .filter_map(|p| {
            let nic = rx_queues_of(p)?;
            let (port, queues) = (p.clone(), queues);
            match queues.cmp(&nic) {
                std::cmp::Ordering::Greater => {
                    Some(LayoutWarning::QueuesOverNic { port, queues, nic })
                }
                std::cmp::Ordering::Less => {
                    Some(LayoutWarning::QueuesUnderNic { port, queues, nic })
                }
                std::cmp::Ordering::Equal => None,
            }
        })
        .collect()
}

/// An interface's active receive queues: the `rx-N` entries of
/// `/sys/class/net/IF/queues` (what `ethtool -L` sets). None when the
/// interface is not in this network namespace.
pub fn sysfs_rx_queues(ifname: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    let n = dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    (n > 0).then_some(n as u32)
}

impl Config {
    /// [`layout_warnings`] and [`nic_queue_warnings`] for this machine:
    /// its CPUs (`std::thread::available_parallelism`) and the ports'
    /// queues in sysfs. In xdp-drop mode there are no sockets to check.
    pub fn layout_warnings(&self) -> Vec<LayoutWarning> {
        let sw = &self.switch;
        let cores = std::thread::available_parallelism().ok().map(|n| n.get());
        if sw.mode == DataplaneMode::XdpDrop {
            return layout_warnings(cores, 1, 1, sw.dataplane_threads);
        }
        let mut w = layout_warnings(cores, sw.ports.len(), sw.queues, sw.dataplane_threads);
        w.extend(lane_warnings(sw.seq_lanes, sw.queues, sw.dataplane_threads));
        w.extend(nic_queue_warnings(&sw.ports, sw.queues, sysfs_rx_queues));
        w
    }
}

/// The admin socket a config file names (its `[switch] admin_socket`, or
/// the default), without checking the rest: what `switchctl --config`
/// needs to find a running switchd.
pub fn admin_socket_in(path: &Path) -> Result<PathBuf, ConfigError> {
    #[derive(Deserialize)]
    struct Switch {
        #[serde(default = "default_admin_socket")]
        admin_socket: PathBuf,
    }
    #[derive(Deserialize)]
    struct File {
        switch: Switch,
    }
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let f: File = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    Ok(f.switch.admin_socket)
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path, sysfs_mtu)
    }

    pub fn parse(
        text: &str,
        path: &Path,
        mtu_of: impl Fn(&str) -> Option<u16>,
    ) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let sw = &file.switch;
        if sw.ports.is_empty() {
            return Err(invalid(
                "switch.ports is empty: list the interfaces to attach to".into(),
            ));
        }
        if sw.ports.len() > 64 {
            return Err(invalid(format!(
                "switch.ports: at most 64 ports, got {}",
                sw.ports.len()
            )));
        }
        if sw.addresses.is_empty() {
            return Err(invalid(
                "switch.addresses is empty: give the switch's own IPv4 address(es)".into(),
            ));
        }
        if sw.queues == 0 || sw.queues > 64 {
            return Err(invalid(format!(
                "switch.queues must be 1..=64, got {}",
                sw.queues
            )));
        }
        if sw.ecn_ring_threshold.is_nan() || sw.ecn_ring_threshold <= 0.0 {
            return Err(invalid(format!(
                "switch.ecn_ring_threshold must be above 0 (1.0 turns ring marking off), got {}",
                sw.ecn_ring_threshold
            )));
        }
        let sockets = sw.ports.len() as u32 * sw.queues;
        if sw.dataplane_threads == 0 || sw.dataplane_threads > sockets {
            return Err(invalid(format!(
                "switch.dataplane_threads must be 1..={sockets} (one socket per port and queue \
                 at least per thread), got {}",
                sw.dataplane_threads
            )));
        }
        if !sw.watchdog_secs.is_finite() || sw.watchdog_secs < 0.0 {
            return Err(invalid(format!(
                "switch.watchdog_secs must be 0 (off) or more seconds, got {}",
                sw.watchdog_secs
            )));
        }
        if sw.agg_port == 0 {
            return Err(invalid("switch.agg_port must not be 0".into()));
        }
        if !sw.seq_lanes.is_power_of_two() || sw.seq_lanes > proto::wire::MAX_SEQ_LANES {
            return Err(invalid(format!(
                "switch.seq_lanes must be a power of two in 1..={}, got {} (set it to \
                 switch.queues, one lane per NIC queue)",
                proto::wire::MAX_SEQ_LANES,
                sw.seq_lanes
            )));
        }
        if u32::from(sw.agg_port) + u32::from(sw.seq_lanes) - 1 > u32::from(u16::MAX) {
            return Err(invalid(format!(
                "switch.agg_port {} + seq_lanes {} runs past UDP port 65535: lower agg_port",
                sw.agg_port, sw.seq_lanes
            )));
        }
        if !sw.frames_per_socket.is_power_of_two() || sw.frames_per_socket < 64 {
            return Err(invalid(format!(
                "switch.frames_per_socket must be a power of two ≥ 64, got {}",
                sw.frames_per_socket
            )));
        }
        for p in &sw.ports {
            match mtu_of(p) {
                Some(m) if m > MAX_PORT_MTU => {
                    return Err(invalid(format!(
                        "switch.ports: {p} has MTU {m}; switchd serves ports up to MTU \
                         {MAX_PORT_MTU} (ip link set {p} mtu {MAX_PORT_MTU})"
                    )))
                }
                _ => {}
            }
        }
        // The file alone: the ports' own addresses are checked at start
        // ([`SwitchSection::check_metrics_exposure`]).
        sw.check_metrics_exposure(&[]).map_err(invalid)?;
        let multi_buffer = needs_multi_buffer(&sw.ports, &mtu_of);
        let max_elems = max_elems_per_chunk(multi_buffer);
        let default_elems = default_elems_per_chunk(&sw.ports, &mtu_of);
        let mut jobs = Vec::new();
        let budget = sw.pool_budget_bytes();
        let mut in_use = 0u64;
        for j in &file.jobs {
            if jobs.iter().any(|c: &JobConfig| c.id == j.id) {
                return Err(invalid(format!("job {} is declared twice", j.id)));
            }
            let cfg = j
                .to_job_config(default_elems, max_elems, sw.uplink)
                .map_err(invalid)?;
            let need = cfg.pool_bytes();
            if need > budget.saturating_sub(in_use) {
                let e = JobConfigError::OverBudget {
                    id: cfg.id,
                    need,
                    budget,
                    in_use,
                };
                return Err(invalid(e.to_string()));
            }
            in_use += need;
            jobs.push(cfg);
        }
        Ok(Config {
            switch: file.switch,
            jobs,
            multi_buffer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[switch]
ports = ["sw-w0", "sw-w1"]
addresses = ["198.18.0.1"]

[[job]]
id = 1
n_workers = 2
allowed_sources = ["198.18.0.0/24"]
secret = "0000000000000000000000000000000000000000000000000000000000000001"
"#;

    fn parse(t: &str) -> Result<Config, ConfigError> {
        Config::parse(t, Path::new("test.toml"), |_| Some(1500))
    }

    #[test]
    fn defaults_fill_in() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.switch.agg_port, 48879);
        // (1500 - 50) / 4 floats less the RESULT's token (4 floats' room).
        assert_eq!(c.jobs[0].elems_per_chunk, 358);
        assert_eq!(c.jobs[0].pool_slots, 256);
        assert_eq!(c.jobs[0].window, 256);
        assert_eq!(c.jobs[0].secret[31], 1);
    }

    #[test]
    fn errors_name_line_and_key() {
        let e = parse(&GOOD.replace("n_workers = 2", "n_workers = \"two\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 8") && e.contains("n_workers"), "{e}");
        let e = parse(&GOOD.replace("ports =", "portz ="))
            .unwrap_err()
            .to_string();
        assert!(e.contains("portz"), "{e}");
        let e = parse(&GOOD.replace("secret = \"00", "secret = \"zz"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("job 1") && e.contains("hex"), "{e}");
        let e = parse(&format!("{GOOD}pool_slots = 100\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("power of two"), "{e}");
        let e = parse(&GOOD.replace(
            "allowed_sources = [\"198.18.0.0/24\"]",
            "allowed_sources = [\"198.18.0.0/33\"]",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("allowed_sources"), "{e}");
    }

    #[test]
    fn weak_secrets_are_refused_naming_the_job_and_how_to_make_one() {
        for weak in ["00".repeat(32), "ab".repeat(32), "FF".repeat(32)] {
            let e = parse(&GOOD.replace(
                "0000000000000000000000000000000000000000000000000000000000000001",
                &weak,
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("job 1") && e.contains("weak"), "{e}");
            assert!(
                e.contains("openssl rand -hex 32") && e.contains("head -c32 /dev/urandom"),
                "{e}"
            );
        }
        // The admin path (switchctl job add) goes through the same check.
        let mut j = JobSection {
            id: 7,
            n_workers: 2,
            allowed_sources: vec!["198.18.0.0/24".parse().unwrap()],
            secret: "00".repeat(32),
            pool_slots: 16,
            elems_per_chunk: None,
            window: None,
            dtype: None,
            upstream: None,
            auth: None,
            stats: false,
            priority: None,
        };
        let e = j.to_job_config(362, 362, None).unwrap_err();
        assert!(e.contains("job 7") && e.contains("weak"), "{e}");
        j.secret = format!("{}01", "00".repeat(31));
        assert!(j.to_job_config(362, 362, None).is_ok());
    }

    #[test]
    fn a_config_with_secrets_that_others_can_read_gets_a_chmod_warning() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("switchd-cfg-{}.toml", std::process::id()));
        std::fs::write(&path, GOOD).unwrap();
        let check = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let cfg = Config::parse(GOOD, &path, |_| Some(1500)).unwrap();
            let no_jobs = Config {
                jobs: Vec::new(),
                ..cfg.clone()
            };
            (
                secrets_exposure(&path, &cfg),
                secrets_exposure(&path, &no_jobs),
            )
        };
        let (open, no_jobs) = check(0o644);
        let (group, _) = check(0o640);
        let (private, _) = check(0o600);
        std::fs::remove_file(&path).unwrap();
        let w = open.expect("0644 with secrets warns");
        assert!(
            w.contains(&format!("chmod 600 {}", path.display())) && w.contains("0644"),
            "{w}"
        );
        assert!(group.is_some(), "group-readable warns");
        assert_eq!(private, None);
        assert_eq!(no_jobs, None, "a file without jobs holds no secret");
    }

    #[test]
    fn watchdog_defaults_to_5_s_takes_0_for_off_and_refuses_negatives() {
        assert_eq!(parse(GOOD).unwrap().switch.watchdog_secs, 5.0);
        let with = |v: &str| {
            parse(&GOOD.replace("[switch]\n", &format!("[switch]\nwatchdog_secs = {v}\n")))
        };
        assert_eq!(with("0").unwrap().switch.watchdog_secs, 0.0);
        assert_eq!(with("2.5").unwrap().switch.watchdog_secs, 2.5);
        let e = with("-1").unwrap_err().to_string();
        assert!(e.contains("watchdog_secs"), "{e}");
    }

    /// GOOD with `extra` lines at the top of `[switch]`.
    fn with_switch(extra: &str) -> String {
        GOOD.replace("[switch]\n", &format!("[switch]\n{extra}\n"))
    }

    #[test]
    fn metrics_listen_defaults_to_loopback_and_off_turns_it_off() {
        let sw = parse(GOOD).unwrap().switch;
        assert_eq!(sw.metrics_listen, MetricsListen::Default);
        assert_eq!(
            sw.metrics_listen.addr(),
            Some("127.0.0.1:9100".parse().unwrap())
        );
        assert!(sw.metrics_per_job && !sw.metrics_on_data_network);
        assert_eq!(sw.check_metrics_exposure(&[]), Ok(None));
        let off = parse(&with_switch("metrics_listen = \"off\"")).unwrap();
        assert_eq!(off.switch.metrics_listen, MetricsListen::Off);
        assert_eq!(off.switch.metrics_listen.addr(), None);
        for (text, addr) in [
            ("127.0.0.1:9200", "127.0.0.1:9200"),
            ("[::1]:9100", "[::1]:9100"),
        ] {
            let c = parse(&with_switch(&format!("metrics_listen = \"{text}\""))).unwrap();
            assert_eq!(
                c.switch.metrics_listen,
                MetricsListen::At(addr.parse().unwrap())
            );
        }
        for bad in ["\"localhost:9100\"", "\"Off\"", "\"127.0.0.1\"", "9100"] {
            let e = parse(&with_switch(&format!("metrics_listen = {bad}")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("metrics_listen"), "{bad}: {e}");
        }
        let e = parse(&with_switch("metrics_listen = \"localhost:9100\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"ADDR:PORT\"") && e.contains("or \"off\""),
            "{e}"
        );
    }

    #[test]
    fn metrics_on_the_data_network_is_refused_naming_the_address_why_and_the_fix() {
        let leaf = "uplink = \"198.19.0.2:40000\"";
        for (listen, why) in [
            (
                "0.0.0.0:9100",
                "is the unspecified address, which listens on every interface",
            ),
            ("[::]:9100", "is the unspecified address"),
            (
                "198.18.0.1:9100",
                "is one of the switch's own aggregation addresses (switch.addresses)",
            ),
            ("198.19.0.2:9100", "is the address of switch.uplink"),
        ] {
            let text = with_switch(&format!("{leaf}\nmetrics_listen = \"{listen}\""));
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.starts_with("config test.toml: ")
                    && e.contains(&format!("switch.metrics_listen = \"{listen}\" {why}"))
                    && e.contains("read every job's progress")
                    && e.contains("leave metrics_listen out for 127.0.0.1:9100")
                    && e.contains("set metrics_on_data_network = true"),
                "{listen}: {e}"
            );
            // The operator's override: loaded, with a warning to log.
            let c =
                parse(&text.replace("[switch]\n", "[switch]\nmetrics_on_data_network = true\n"))
                    .unwrap();
            let w = c.switch.check_metrics_exposure(&[]).unwrap().unwrap();
            assert!(
                w.contains(&format!("\"{listen}\" {why}"))
                    && w.contains("metrics_on_data_network = true")
                    && w.contains("set metrics_per_job = false"),
                "{w}"
            );
        }
        // A management address is not refused.
        assert!(parse(&with_switch("metrics_listen = \"10.9.8.7:9100\"")).is_ok());
        // An address the machine has on a port's bridge, found at start.
        let c = parse(&with_switch("metrics_listen = \"10.9.8.7:9100\"")).unwrap();
        let br = crate::exposure::InterfaceAddr {
            ifname: "br0".into(),
            port: "sw-w1".into(),
            addr: "10.9.8.7".parse().unwrap(),
        };
        let e = c.switch.check_metrics_exposure(&[br]).unwrap_err();
        assert!(
            e.contains("\"10.9.8.7:9100\" is an address of br0, the bridge of port sw-w1"),
            "{e}"
        );
    }

    #[test]
    fn metrics_per_job_defaults_to_true_and_the_metrics_keys_round_trip() {
        assert!(parse(GOOD).unwrap().switch.metrics_per_job);
        let c = parse(&with_switch("metrics_per_job = false")).unwrap();
        assert!(!c.switch.metrics_per_job);
        // Written back (switchd testbed-config, the e2e configs): defaults
        // left out, the rest as read.
        let file = |extra: &str| toml::from_str::<ConfigFile>(&with_switch(extra)).unwrap();
        let out = |extra: &str| toml::to_string(&file(extra)).unwrap();
        let plain = out("");
        assert!(!plain.contains("metrics"), "{plain}");
        let set =
            "metrics_listen = \"off\"\nmetrics_per_job = false\nmetrics_on_data_network = true";
        let text = out(set);
        for line in set.lines() {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        let back: ConfigFile = toml::from_str(&text).unwrap();
        assert_eq!(back.switch.metrics_listen, MetricsListen::Off);
        let at = out("metrics_listen = \"[::1]:9100\"");
        assert!(at.contains("metrics_listen = \"[::1]:9100\""), "{at}");
    }

    #[test]
    fn forwarding_defaults_to_xdp_and_can_be_turned_off() {
        assert_eq!(
            parse(GOOD).unwrap().switch.forwarding,
            ForwardingSetting::Xdp
        );
        let c = parse(&GOOD.replace("[switch]\n", "[switch]\nforwarding = \"bridge\"\n")).unwrap();
        assert_eq!(c.switch.forwarding, ForwardingSetting::Bridge);
        let e = parse(&GOOD.replace("[switch]\n", "[switch]\nforwarding = \"fast\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("forwarding"), "{e}");
        let c = parse(&GOOD.replace("[switch]\n", "[switch]\nmode = \"xdp-drop\"\n")).unwrap();
        assert_eq!(c.switch.mode, DataplaneMode::XdpDrop);
    }

    #[test]
    fn mtu_sets_chunk_size_and_frames_cap_it() {
        // A frame's floats less the RESULT's token (16 bytes).
        let c = Config::parse(GOOD, Path::new("t"), |_| Some(3500)).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(3500) - 4);
        assert!(!c.multi_buffer);
        let c = Config::parse(GOOD, Path::new("t"), |_| Some(3826)).unwrap();
        assert!(c.multi_buffer, "above one page needs multi-buffer");
        assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(3826) - 4);
        let c = Config::parse(GOOD, Path::new("t"), |p| {
            Some(if p == "sw-w1" { 1000 } else { 1500 })
        })
        .unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(1000) - 4);
    }

    #[test]
    fn jumbo_mtu_grants_the_9000_byte_chunk_and_refuses_larger_mtus() {
        let c = Config::parse(GOOD, Path::new("t"), |_| Some(9000)).unwrap();
        assert!(c.multi_buffer);
        // 2237 floats less the RESULT's token.
        assert_eq!(c.jobs[0].elems_per_chunk, 2233);
        let e = Config::parse(GOOD, Path::new("t"), |p| {
            Some(if p == "sw-w1" { 9216 } else { 9000 })
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("sw-w1 has MTU 9216"), "{e}");
        assert!(e.contains("ip link set sw-w1 mtu 9000"), "{e}");
        // Without multi-buffer a chunk must fit one frame.
        let big = GOOD.replace("[[job]]\n", "[[job]]\nelems_per_chunk = 2000\n");
        assert!(Config::parse(&big, Path::new("t"), |_| Some(1500)).is_err());
        let c = Config::parse(&big, Path::new("t"), |_| Some(9000)).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, 2000);
    }

    #[test]
    fn priority_defaults_to_normal_and_a_typo_names_the_job_and_the_classes() {
        assert_eq!(parse(GOOD).unwrap().jobs[0].priority, Priority::Normal);
        let c = parse(&format!("{GOOD}priority = \"high\"\n")).unwrap();
        assert_eq!(c.jobs[0].priority, Priority::High);
        let e = parse(&format!("{GOOD}priority = \"urgent\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("job 1: priority \"urgent\"")
                && e.contains("\"low\", \"normal\" (the default), \"high\""),
            "{e}"
        );
        // A number is not a class: serde names the key and the type.
        let e = parse(&format!("{GOOD}priority = 3\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("priority"), "{e}");
    }

    #[test]
    fn auth_mac_leaves_room_for_the_tag_and_a_wrong_value_names_the_choices() {
        assert_eq!(parse(GOOD).unwrap().jobs[0].auth, AuthMode::Port);
        let mac = format!("{GOOD}auth = \"mac\"\n");
        let c = parse(&mac).unwrap();
        assert_eq!(c.jobs[0].auth, AuthMode::Mac);
        // 16 bytes less payload: 362 - 4 floats at MTU 1500, 724 - 8 bf16.
        assert_eq!(c.jobs[0].elems_per_chunk, 358);
        let c = parse(&format!("{mac}dtype = \"bf16\"\n")).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, 716);
        // A tagged RESULT is sent from one frame, jumbo ports or not.
        let c = Config::parse(&mac, Path::new("t"), |_| Some(9000)).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, MAX_ELEMS_IN_FRAME - 4);
        let e = parse(&format!("{mac}elems_per_chunk = 941\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("elems_per_chunk must be 1..=940"), "{e}");
        let e = parse(&format!("{GOOD}auth = \"hmac\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("job 1: auth") && e.contains("\"port\" or \"mac\""),
            "{e}"
        );
        let leaf = GOOD.replace("[switch]\n", "[switch]\nuplink = \"198.19.0.2:48880\"\n");
        let leaf = format!(
            "{leaf}auth = \"mac\"\n[job.upstream]\nleaf_index = 0\nn_leaves = 2\n\
             spines = [\"198.19.0.1:48879\"]\n"
        );
        let e = parse(&leaf).unwrap_err().to_string();
        assert!(e.contains("not supported on a leaf"), "{e}");
    }

    #[test]
    fn stats_leaves_room_for_the_trailer_and_is_off_by_default() {
        assert!(!parse(GOOD).unwrap().jobs[0].stats);
        let st = format!("{GOOD}stats = true\n");
        let c = parse(&st).unwrap();
        assert!(c.jobs[0].stats);
        // 24 bytes less payload, and the RESULT's 16-byte token or tag
        // (either auth mode): 362 - 10 floats at MTU 1500, 724 - 20 bf16.
        assert_eq!(c.jobs[0].elems_per_chunk, 352);
        let c = parse(&format!("{st}dtype = \"bf16\"\n")).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, 704);
        let c = parse(&format!("{st}auth = \"mac\"\n")).unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, 352);
        // The limit (a frame's floats, 944) leaves room for them too.
        let e = parse(&format!("{st}elems_per_chunk = 935\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("elems_per_chunk must be 1..=934"), "{e}");
        // switchctl's section says it only when on (older switchds refuse
        // unknown keys).
        let mut j = toml::from_str::<ConfigFile>(&st).unwrap().jobs[0].clone();
        assert!(serde_json::to_string(&j)
            .unwrap()
            .contains("\"stats\":true"));
        j.stats = false;
        assert!(!serde_json::to_string(&j).unwrap().contains("stats"));
    }

    #[test]
    fn dtype_is_declared_with_the_job_and_doubles_the_chunk() {
        assert_eq!(parse(GOOD).unwrap().jobs[0].dtype, Dtype::F32);
        for (name, dtype) in [("bf16", Dtype::Bf16), ("f16", Dtype::F16)] {
            let c = parse(&format!("{GOOD}dtype = \"{name}\"\n")).unwrap();
            assert_eq!(c.jobs[0].dtype, dtype);
            assert_eq!(
                c.jobs[0].elems_per_chunk, 716,
                "twice the f32 chunk at MTU 1500 (the token's room less)"
            );
            // So does the jumbo chunk (multi-buffer sockets).
            let c = Config::parse(
                &format!("{GOOD}dtype = \"{name}\"\n"),
                Path::new("t"),
                |_| Some(9000),
            )
            .unwrap();
            assert_eq!(c.jobs[0].elems_per_chunk, 2 * 2233);
        }
        // A leaf's partials go up as float32: its default chunk is float32's.
        let leaf = GOOD.replace("[switch]\n", "[switch]\nuplink = \"198.19.0.2:48880\"\n");
        let leaf = format!(
            "{leaf}dtype = \"bf16\"\n[job.upstream]\nleaf_index = 0\nn_leaves = 2\n\
             spines = [\"198.19.0.1:48879\"]\n"
        );
        let c = parse(&leaf).unwrap();
        assert_eq!(
            (c.jobs[0].dtype, c.jobs[0].elems_per_chunk),
            (Dtype::Bf16, 358)
        );
        let e = parse(&format!("{GOOD}dtype = \"fp8\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("job 1") && e.contains("f32, bf16 or f16"), "{e}");
        // A frame's 944 floats, as bf16, less the RESULT's token (8 elements).
        let e = parse(&format!("{GOOD}dtype = \"bf16\"\nelems_per_chunk = 2000\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("elems_per_chunk must be 1..=1880"), "{e}");
    }

    #[test]
    fn seq_lanes_are_a_power_of_two_within_the_ports() {
        let with = |extra: &str| GOOD.replace("[switch]\n", &format!("[switch]\n{extra}\n"));
        assert_eq!(parse(GOOD).unwrap().switch.seq_lanes, 1);
        assert_eq!(parse(&with("seq_lanes = 4")).unwrap().switch.seq_lanes, 4);
        for bad in ["seq_lanes = 3", "seq_lanes = 0", "seq_lanes = 128"] {
            let e = parse(&with(bad)).unwrap_err().to_string();
            assert!(
                e.contains("switch.seq_lanes must be a power of two in 1..=64"),
                "{bad}: {e}"
            );
        }
        let e = parse(&with("agg_port = 65534\nseq_lanes = 4"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("runs past UDP port 65535"), "{e}");
    }

    #[test]
    fn lanes_that_do_not_match_queues_and_threads_get_a_warning() {
        assert_eq!(lane_warnings(1, 1, 4), vec![]);
        assert_eq!(lane_warnings(4, 4, 4), vec![]);
        assert_eq!(
            lane_warnings(4, 4, 2),
            vec![],
            "thread t serves queues t, t + 2"
        );
        for (lanes, queues, threads) in [(4, 2, 2), (2, 2, 4)] {
            let w = lane_warnings(lanes, queues, threads);
            assert_eq!(w.len(), 1, "{lanes} {queues} {threads}");
            let msg = w[0].to_string();
            assert!(
                msg.contains(&format!("seq_lanes = {lanes}"))
                    && msg.contains("set seq_lanes = queues = dataplane_threads"),
                "{msg}"
            );
        }
    }

    #[test]
    fn threads_beyond_the_cpus_get_a_warning_that_names_both_and_the_fix() {
        assert_eq!(layout_warnings(Some(4), 2, 2, 4), vec![]);
        let w = layout_warnings(Some(2), 4, 1, 4);
        assert_eq!(
            w,
            vec![LayoutWarning::ThreadsOverCores {
                threads: 4,
                cores: 2
            }]
        );
        let msg = w[0].to_string();
        assert!(
            msg.contains("dataplane_threads = 4") && msg.contains("set dataplane_threads to 2"),
            "{msg}"
        );
        // CPUs unknown: nothing to compare.
        assert_eq!(layout_warnings(None, 4, 1, 4), vec![]);
    }

    #[test]
    fn sockets_that_do_not_divide_among_the_threads_get_a_warning_with_even_choices() {
        // 3 ports × 1 queue over 2 threads: one thread serves 2, one 1.
        let w = layout_warnings(Some(16), 3, 1, 2);
        assert_eq!(
            w,
            vec![LayoutWarning::UnevenSockets {
                ports: 3,
                queues: 1,
                threads: 2
            }]
        );
        let msg = w[0].to_string();
        assert!(
            msg.contains("3 AF_XDP sockets (3 ports × 1 queues)")
                && msg.contains("1 of them serve 2 sockets and 1 serve 1")
                && msg.contains("dataplane_threads = 1")
                && msg.contains("queues = 2"),
            "{msg}"
        );
        // 2 ports × 3 queues over 4 threads: 3 threads would divide the 6
        // sockets, and 4 queues make 8, the next multiple of 4.
        let msg = layout_warnings(Some(16), 2, 3, 4)[0].to_string();
        assert!(
            msg.contains("2 of them serve 2 sockets and 2 serve 1")
                && msg.contains("dataplane_threads = 3")
                && msg.contains("queues = 4"),
            "{msg}"
        );
        // Even deals, one socket per thread or several: no warning.
        for (ports, queues, threads) in [(1, 4, 4), (4, 1, 2), (2, 2, 4), (3, 2, 3), (5, 1, 1)] {
            assert_eq!(
                layout_warnings(Some(16), ports, queues, threads),
                vec![],
                "{ports} ports × {queues} queues over {threads} threads"
            );
        }
        // Both at once.
        assert_eq!(layout_warnings(Some(2), 3, 1, 3).len(), 1);
        assert_eq!(layout_warnings(Some(2), 5, 1, 3).len(), 2);
    }

    #[test]
    fn queues_that_differ_from_the_nics_get_a_warning_naming_the_port_and_ethtool() {
        let ports = vec!["ens1f0".to_string(), "ens1f1".to_string(), "veth9".into()];
        let nic = |p: &str| match p {
            "ens1f0" => Some(8),
            "ens1f1" => Some(2),
            _ => None,
        };
        let w = nic_queue_warnings(&ports, 4, nic);
        assert_eq!(
            w,
            vec![
                LayoutWarning::QueuesUnderNic {
                    port: "ens1f0".into(),
                    queues: 4,
                    nic: 8
                },
                LayoutWarning::QueuesOverNic {
                    port: "ens1f1".into(),
                    queues: 4,
                    nic: 2
                },
            ]
        );
        let under = w[0].to_string();
        assert!(
            under.contains("queues 4..7")
                && under.contains("never aggregated")
                && under.contains("ethtool -L ens1f0 combined 4"),
            "{under}"
        );
        let over = w[1].to_string();
        assert!(
            over.contains("socket for queues 2..3 cannot bind")
                && over.contains("ethtool -L ens1f1 combined 4"),
            "{over}"
        );
        assert_eq!(nic_queue_warnings(&ports, 8, |_| Some(8)), vec![]);
    }

    #[test]
    fn rx_queues_are_counted_from_sysfs_and_unknown_for_a_missing_port() {
        // Loopback exists in every namespace and has one receive queue.
        assert_eq!(sysfs_rx_queues("lo"), Some(1));
        assert_eq!(sysfs_rx_queues("no-such-if0"), None);
    }

    #[test]
    fn the_admin_socket_is_found_in_a_config_file_or_defaulted() {
        let dir = std::env::temp_dir().join(format!("switchd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let named = dir.join("named.toml");
        std::fs::write(
            &named,
            "[switch]\nports = [\"a\"]\nadmin_socket = \"/tmp/x.sock\"\n",
        )
        .unwrap();
        assert_eq!(
            admin_socket_in(&named).unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        let plain = dir.join("plain.toml");
        std::fs::write(&plain, "[switch]\nports = [\"a\"]\n").unwrap();
        assert_eq!(
            admin_socket_in(&plain).unwrap(),
            PathBuf::from(DEFAULT_ADMIN_SOCKET)
        );
        let e = admin_socket_in(&dir.join("missing.toml")).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
