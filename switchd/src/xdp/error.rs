//! The errors of the XDP steering program's loader ([`super::loader`])
//! and of the bridge facts it writes into `port_info` ([`super::bridge`]),
//! which the loader's calls pass on.
//!
//! Owns: [`XdpError`]. Each variant names the failing call and object and
//! says what to do.

use super::maps::{MAX_PORTS, MAX_QUEUES};

/// Errors of the XDP loader. Each names the failing call and object and
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("loading the XDP program requires root (euid is {euid}): run switchd as root")]
    NotRoot { euid: u32 },
    #[error("loading the XDP program failed: {detail} (kernel lacks BPF or not root)")]
    Load { detail: String },
    #[error("XDP object has no {what} `{name}`: rebuild switchd (ebpf/agg_xdp.c and loader.rs disagree)")]
    Object { what: &'static str, name: String },
    #[error("writing BPF map `{map}` failed: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("no such interface `{0}`")]
    NoSuchInterface(String),
    #[error("port index {0} out of range (0..{MAX_PORTS})")]
    PortOutOfRange(u32),
    #[error("queue {0} out of range (0..{MAX_QUEUES})")]
    QueueOutOfRange(u32),
    #[error("port index {port_idx} is already used by interface `{other}`")]
    PortInUse { port_idx: u32, other: String },
    #[error("interface `{0}` is already attached by this switch")]
    InterfaceInUse(String),
    #[error(
        "attaching XDP program to interface {ifname} failed: another XDP program is already \
         attached ({detail}); inspect with `ip link show dev {ifname}` and remove it with \
         `ip link set dev {ifname} xdp off` (or `xdpgeneric off`)"
    )]
    AlreadyAttached { ifname: String, detail: String },
    #[error(
        "attaching XDP program to interface {ifname} in {mode} mode failed: {detail} ({hint})"
    )]
    Attach {
        ifname: String,
        mode: &'static str,
        detail: String,
        hint: String,
    },
    #[error("detaching XDP program from interface {ifname} failed: {detail} (remove it by hand: `ip link set dev {ifname} xdp off`)")]
    Detach { ifname: String, detail: String },
    #[error("reading BPF map `counters` for port {port_idx} failed: {detail}")]
    Counters { port_idx: u32, detail: String },
}
