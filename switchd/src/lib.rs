//! switchd: the aggregation switch daemon. The binary in `main.rs` is a thin
//! CLI over these modules.
//!
//! * [`config`]: the TOML configuration and its checks.
//! * [`admin`]: the admin Unix socket (switchctl's server side).
//! * [`xdp`]: the XDP steering program (aya) and AF_XDP sockets (xdpilone).
//! * [`frame`]: Ethernet/IPv4/UDP parsing and writing.
//! * [`dataplane`]: the receive → job table → transmit loop.
//! * [`control`]: the control thread (admin, summary, stats file, the log
//!   of the table's events).
//! * [`echo`]: echo mode, the AF_XDP I/O baseline for benchmarks.
//! * [`exposure`]: whether `/metrics` listens where the workers reach it.
//! * [`stats`]: counter snapshots for logs and the stats file.
//! * [`metrics`]: the Prometheus text endpoint.
//! * [`supervise`]: restarting the admin and metrics threads.
//! * [`ratelog`]: rate-limited log lines for events the network drives.
//! * [`wake`]: waking a sleeping dataplane thread when another hands it work.
//! * [`tenants`]: tenants as `switchctl tenant list` and check-config show them.
//! * [`watchdog`]: noticing a stuck dataplane thread and exiting for a restart.

pub mod admin;
pub mod config;
pub mod config_builder;
pub mod control;
pub mod dataplane;
pub mod echo;
pub mod exposure;
pub mod frame;
pub mod metrics;
pub mod ratelog;
pub mod stats;
pub mod supervise;
pub mod tenants;
pub mod testbed_config;
pub mod wake;
pub mod watchdog;
pub mod xdp;
