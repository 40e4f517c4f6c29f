//! switchd's configuration file (TOML): the switch's ports and addresses,
//! the jobs it serves, and the tenants that may create jobs by name.
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
//! umem_huge_pages = "auto"          # UMEM on 2 MiB huge pages: "auto" (if reserved) | "on" | "off"
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
//!
//! [[tenant]]                        # docs/PROTOCOL.md, "Tenants and self-provisioned jobs"
//! name = "team-a"                   # 1..=32 of [A-Za-z0-9._:-]
//! key_file = "/etc/aggswitch/tenants/team-a.key"  # 64 hex digits, mode 0600
//! allowed_sources = ["198.18.0.0/24"]
//! max_jobs = 4                      # and max_workers_per_job, max_pool_bytes, dtypes,
//! job_ids = [32768, 65535]          # auth, max_priority, lease_secs, pool_slots,
//!                                   # [tenant.upstream] (the table there)
//! ```
//!
//! A config with tenants and no `[[job]]` is whole: the jobs come when the
//! tenants' workers provision them.
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
//!
//! Files, bottom up (each imports only those before it): `mtu` (frame and
//! chunk sizes from the ports' MTU), `file` (the TOML schema and the
//! checked [`Config`]'s fields), `umem` (the sockets' UMEM on huge pages
//! or not), `secrets` (a job secret, a tenant key
//! file and the weak-key rule, a readable file's warning), `check`
//! (loading and every check), `layout` (warnings about threads, queues and
//! lanes); tests in `tests.rs` and, for `[[tenant]]`, `tenant_tests.rs`. Everything is re-exported here, so
//! `crate::config::X` is the one path users name.

mod check;
mod file;
mod layout;
mod mtu;
mod secrets;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;
mod umem;

pub use check::{
    admin_socket_in, check_tenants, machine_memory, ConfigError, DEFAULT_POOL_MEMORY_FRACTION,
    FALLBACK_POOL_MEMORY,
};
pub use file::{
    AttachModeSetting, Config, ConfigFile, DataplaneMode, ForwardingSetting, JobSection,
    MetricsListen, SwitchSection, TenantSection, UmemHugePages, UpstreamSection,
    DEFAULT_ADMIN_SOCKET, DEFAULT_METRICS_LISTEN, DEFAULT_TENANT_JOB_IDS,
};
pub use layout::{
    lane_warnings, layout_warnings, nic_queue_warnings, sysfs_rx_queues, LayoutWarning,
};
pub use mtu::{
    default_elems_per_chunk, max_elems_per_chunk, needs_multi_buffer, sysfs_mtu, FRAME_SIZE,
    MAX_ELEMS_IN_FRAME, MAX_PORT_MTU, SINGLE_BUFFER_MTU,
};
pub use secrets::{
    key_file_warning, parse_secret, parse_tenant_key, read_tenant_key, secrets_exposure,
};
pub use umem::{HugePagePool, UmemPlan};
