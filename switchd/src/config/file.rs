//! The configuration file's schema: the `[switch]`, `[[job]]` and
//! `[[tenant]]` sections as serde types ([`ConfigFile`], [`SwitchSection`],
//! [`JobSection`], [`UpstreamSection`], [`TenantSection`]) with every
//! default, and [`Config`], the checked form that `Config::parse` (in
//! `check`) makes of them.
//!
//! Invariant: the serde types refuse unknown keys (`deny_unknown_fields`)
//! and hold the file as written; nothing here checks values, so a
//! [`Config`] is only ever made by `Config::parse`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use ipnet::Ipv4Net;
use proto::switch::tenant::TenantConfig;
use proto::switch::JobConfig;
use proto::wire::DEFAULT_AGG_PORT;
use serde::{Deserialize, Serialize};

/// What the switch does with aggregation frames. Only `Aggregate` is a
/// switch; the others are baselines for `scripts/bench allreduce`.
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

/// Whether the AF_XDP sockets' UMEMs lie on 2 MiB HugeTLB pages (fewer
/// TLB misses reading and writing frames; the config `umem` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UmemHugePages {
    /// On huge pages when the pool has every page the sockets take free;
    /// else on 4 KiB pages, with one log line that says how to reserve them.
    #[default]
    Auto,
    /// On huge pages; switchd refuses to start when the pool is short.
    On,
    /// On 4 KiB pages.
    Off,
}

impl UmemHugePages {
    /// The default: left out of a written config.
    pub fn is_auto(&self) -> bool {
        *self == UmemHugePages::Auto
    }
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
    /// The sockets' UMEMs on 2 MiB HugeTLB pages ([`UmemHugePages`]).
    #[serde(default, skip_serializing_if = "UmemHugePages::is_auto")]
    pub umem_huge_pages: UmemHugePages,
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

pub(super) fn default_admin_socket() -> PathBuf {
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

/// The job ids of the one tenant that gives no `job_ids` (docs/PROTOCOL.md,
/// "Tenants and self-provisioned jobs"): the upper half of the id space.
pub const DEFAULT_TENANT_JOB_IDS: [u16; 2] = [32768, 65535];

fn default_max_jobs() -> u16 {
    4
}
fn default_max_workers_per_job() -> u16 {
    256
}
fn default_max_pool_bytes() -> u64 {
    1 << 30
}
fn default_tenant_dtypes() -> Vec<String> {
    ["f32", "bf16", "f16"].map(String::from).to_vec()
}
fn default_tenant_auth() -> Vec<String> {
    ["port", "mac"].map(String::from).to_vec()
}
fn default_max_priority() -> String {
    "normal".into()
}
fn default_lease_secs() -> u64 {
    proto::switch::tenant::DEFAULT_LEASE.as_secs()
}

/// `[[tenant]]`: who may create jobs by name on this switch, and within
/// which quotas (docs/PROTOCOL.md, "Tenants and self-provisioned jobs",
/// has the table of keys and defaults). Also what `switchctl tenant add`
/// sends.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    pub name: String,
    /// The tenant key's file: 64 hex digits, mode 0600. A relative path is
    /// taken from the config file's directory.
    pub key_file: PathBuf,
    pub allowed_sources: Vec<Ipv4Net>,
    #[serde(default = "default_max_jobs")]
    pub max_jobs: u16,
    #[serde(default = "default_max_workers_per_job")]
    pub max_workers_per_job: u16,
    #[serde(default = "default_max_pool_bytes")]
    pub max_pool_bytes: u64,
    /// Element types: "f32", "bf16", "f16".
    #[serde(default = "default_tenant_dtypes")]
    pub dtypes: Vec<String>,
    /// Auth modes: "port", "mac".
    #[serde(default = "default_tenant_auth")]
    pub auth: Vec<String>,
    /// "low", "normal" or "high".
    #[serde(default = "default_max_priority")]
    pub max_priority: String,
    /// `[first, last]`; absent: [`DEFAULT_TENANT_JOB_IDS`] when this is the
    /// only tenant without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_ids: Option<[u16; 2]>,
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
    #[serde(default = "default_slots")]
    pub pool_slots: u16,
    /// On a leaf: its jobs are leaf jobs, provisioned on these spines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamSection>,
}

/// The file as written: its typed sections, before the checks of
/// [`Config::parse`] (`switchd testbed-config` writes it).
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub switch: SwitchSection,
    #[serde(default, rename = "job", skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobSection>,
    #[serde(default, rename = "tenant", skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantSection>,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub switch: SwitchSection,
    pub jobs: Vec<JobConfig>,
    /// The tenants, keys read and checked.
    pub tenants: Vec<TenantConfig>,
    /// One line per tenant key file that group or others can read (logged
    /// at start, printed by `switchd check-config`).
    pub key_warnings: Vec<String>,
    /// Some port's MTU is above [`SINGLE_BUFFER_MTU`](super::SINGLE_BUFFER_MTU): sockets are bound
    /// with multi-buffer and chunks may be up to a 9000-byte MTU's.
    pub multi_buffer: bool,
}
