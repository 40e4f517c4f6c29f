//! Loads and attaches the XDP steering program (`ebpf/agg_xdp.c`) with aya.
//!
//! Owns the program, its links and its five maps (`xsks`, `ports`,
//! `own_addrs`, `config`, `counters`). Invariants:
//! * `load` refuses to run without root and fills `own_addrs` and `config`
//!   before anything is attached, so the program never sees a half-set config.
//! * Every successful `attach` is recorded; `detach_all` (and `Drop`) removes
//!   exactly those links and their `ports` entries, nothing else. Links are
//!   bpf_link fds owned by this process, so the kernel also detaches them if
//!   the process dies.
//! * A program someone else left on an interface is never replaced: attach
//!   fails with [`XdpError::AlreadyAttached`] naming the command that removes
//!   it.
//! * XSKMAP slot for (port, queue) is `port * MAX_QUEUES + queue`
//!   ([`xsk_slot`]), matching the C program.

use std::collections::HashMap as StdHashMap;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, XskMap};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{ProgramError, Xdp, XdpMode};
use aya::{include_bytes_aligned, Ebpf};

/// Ports (interfaces) the program can serve; `port_idx` is `0..MAX_PORTS`.
pub const MAX_PORTS: u32 = 64;
/// Receive queues per port that have an XSKMAP slot; queue ids `0..MAX_QUEUES`.
pub const MAX_QUEUES: u32 = 64;
/// Counters per port in the `counters` map (3 used, 1 spare).
const COUNTERS_PER_PORT: u32 = 4;
const CNT_STEERED: u32 = 0;
const CNT_PASSED: u32 = 1;
const CNT_MALFORMED: u32 = 2;

const PROGRAM_NAME: &str = "agg_xdp";

static AGG_XDP_OBJ: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agg_xdp.o"));

/// Per-port counters from the XDP program, summed over CPUs.
///
/// `passed` counts every frame passed up the stack on this port (including
/// steerable frames whose queue has no socket); `malformed` is the subset of
/// `passed` that claimed IPv4/UDP but was truncated or had a bad IHL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteerCounters {
    pub steered: u64,
    pub passed: u64,
    pub malformed: u64,
}

/// How to attach the program to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Native (driver) XDP; fails if the driver lacks it.
    Driver,
    /// Generic (skb) XDP; works everywhere, slower.
    Skb,
    /// Try driver mode, fall back to skb mode; logs which one was used.
    #[default]
    Auto,
}

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

/// What to do about a failed attach with errno `code`.
fn attach_hint(ifname: &str, code: Option<i32>) -> String {
    match code {
        Some(libc::EOPNOTSUPP) => {
            "the driver has no native XDP: use skb (generic) or auto mode".to_string()
        }
        Some(libc::EPERM) | Some(libc::EACCES) => "run as root".to_string(),
        _ => format!(
            "run as root; another XDP program may already be attached: \
             `ip link set dev {ifname} xdp off`"
        ),
    }
}

/// The XSKMAP slot the C program redirects (port, queue) to.
pub fn xsk_slot(port_idx: u32, queue: u32) -> Result<u32, XdpError> {
    if port_idx >= MAX_PORTS {
        return Err(XdpError::PortOutOfRange(port_idx));
    }
    if queue >= MAX_QUEUES {
        return Err(XdpError::QueueOutOfRange(queue));
    }
    Ok(port_idx * MAX_QUEUES + queue)
}

/// The `counters` map key of counter `which` (0 steered, 1 passed, 2 malformed).
fn counter_key(port_idx: u32, which: u32) -> u32 {
    port_idx * COUNTERS_PER_PORT + which
}

/// `own_addrs` key: the address in network byte order, as the C program reads
/// `iphdr.daddr` (a big-endian `__be32` loaded as a native u32).
fn addr_key(addr: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(addr.octets())
}

/// `config` value: `{ __u16 agg_port (network order); __u16 pad }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AggConfig {
    agg_port_be: u16,
    _pad: u16,
}

// SAFETY: `AggConfig` is `repr(C)`, made of plain integers, has no padding
// bytes and every bit pattern is valid, as `aya::Pod` requires.
unsafe impl aya::Pod for AggConfig {}

impl AggConfig {
    fn new(agg_port: u16) -> Self {
        AggConfig {
            // Stored so that its in-memory bytes are big-endian.
            agg_port_be: agg_port.to_be(),
            _pad: 0,
        }
    }
}

struct Attached {
    port_idx: u32,
    ifindex: u32,
    link: XdpLinkId,
}

/// The loaded steering program and its maps.
pub struct SteeringProgram {
    // Maps first: they are plain fds, dropping them in any order is fine.
    xsks: XskMap<MapData>,
    ports: HashMap<MapData, u32, u32>,
    counters: PerCpuArray<MapData, u64>,
    // Kept for later updates; the program also holds references to them.
    _own_addrs: HashMap<MapData, u32, u8>,
    _config: Array<MapData, AggConfig>,
    attached: StdHashMap<String, Attached>,
    ebpf: Ebpf,
}

impl std::fmt::Debug for SteeringProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteeringProgram")
            .field("attached", &self.attached.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn errno_in(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        if let Some(nl) = e.downcast_ref::<aya::sys::NetlinkError>() {
            if let Some(code) = nl.raw_os_error() {
                return Some(code);
            }
        }
        cur = e.source();
    }
    None
}

fn program_errno(err: &ProgramError) -> Option<i32> {
    match err {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        other => errno_in(other),
    }
}

fn detail(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let m = e.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = e.source();
    }
    s
}

fn ifindex_of(ifname: &str) -> Result<u32, XdpError> {
    let c = std::ffi::CString::new(ifname)
        .map_err(|_| XdpError::NoSuchInterface(ifname.to_string()))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(XdpError::NoSuchInterface(ifname.to_string()));
    }
    Ok(idx)
}

fn take<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    conv: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, XdpError> {
    let map = ebpf.take_map(name).ok_or(XdpError::Object {
        what: "map",
        name: name.to_string(),
    })?;
    conv(map).map_err(|e| XdpError::Map {
        map: name,
        detail: detail(&e),
    })
}

impl SteeringProgram {
    /// Loads the embedded object, verifies it in the kernel and fills
    /// `own_addrs` and `config`. Nothing is attached yet.
    pub fn load(own_addrs: &[Ipv4Addr], agg_port: u16) -> Result<Self, XdpError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(XdpError::NotRoot { euid });
        }
        let mut ebpf =
            Ebpf::load(AGG_XDP_OBJ).map_err(|e| XdpError::Load { detail: detail(&e) })?;
        {
            let prog: &mut Xdp = ebpf
                .program_mut(PROGRAM_NAME)
                .ok_or(XdpError::Object {
                    what: "program",
                    name: PROGRAM_NAME.to_string(),
                })?
                .try_into()
                .map_err(|e: ProgramError| XdpError::Load { detail: detail(&e) })?;
            prog.load()
                .map_err(|e| XdpError::Load { detail: detail(&e) })?;
        }

        let mut addrs: HashMap<MapData, u32, u8> = take(&mut ebpf, "own_addrs", HashMap::try_from)?;
        for a in own_addrs {
            addrs
                .insert(addr_key(*a), 1u8, 0)
                .map_err(|e| XdpError::Map {
                    map: "own_addrs",
                    detail: format!("inserting {a}: {}", detail(&e)),
                })?;
        }
        let mut config: Array<MapData, AggConfig> = take(&mut ebpf, "config", Array::try_from)?;
        config
            .set(0, AggConfig::new(agg_port), 0)
            .map_err(|e| XdpError::Map {
                map: "config",
                detail: detail(&e),
            })?;
        let xsks = take(&mut ebpf, "xsks", XskMap::try_from)?;
        let ports = take(&mut ebpf, "ports", HashMap::try_from)?;
        let counters = take(&mut ebpf, "counters", PerCpuArray::try_from)?;
        tracing::debug!(?own_addrs, agg_port, "XDP steering program loaded");
        Ok(SteeringProgram {
            xsks,
            ports,
            counters,
            _own_addrs: addrs,
            _config: config,
            attached: StdHashMap::new(),
            ebpf,
        })
    }

    fn program(&mut self) -> Result<&mut Xdp, XdpError> {
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(XdpError::Object {
                what: "program",
                name: PROGRAM_NAME.to_string(),
            })?
            .try_into()
            .map_err(|e: ProgramError| XdpError::Load { detail: detail(&e) })
    }

    /// Attaches to interface `ifname` as port index `port_idx`; records it for
    /// detach. The `ports` entry is written before the program is attached, so
    /// the program counts from the first frame. Sockets may be registered
    /// before or after this call.
    pub fn attach(
        &mut self,
        ifname: &str,
        port_idx: u32,
        mode: AttachMode,
    ) -> Result<(), XdpError> {
        if port_idx >= MAX_PORTS {
            return Err(XdpError::PortOutOfRange(port_idx));
        }
        if self.attached.contains_key(ifname) {
            return Err(XdpError::InterfaceInUse(ifname.to_string()));
        }
        if let Some((other, _)) = self.attached.iter().find(|(_, a)| a.port_idx == port_idx) {
            return Err(XdpError::PortInUse {
                port_idx,
                other: other.clone(),
            });
        }
        let ifindex = ifindex_of(ifname)?;
        self.ports
            .insert(ifindex, port_idx, 0)
            .map_err(|e| XdpError::Map {
                map: "ports",
                detail: format!("inserting {ifname} (ifindex {ifindex}): {}", detail(&e)),
            })?;

        let result = self.attach_link(ifname, ifindex, mode);
        match result {
            Ok(link) => {
                self.attached.insert(
                    ifname.to_string(),
                    Attached {
                        port_idx,
                        ifindex,
                        link,
                    },
                );
                Ok(())
            }
            Err(e) => {
                let _ = self.ports.remove(&ifindex);
                Err(e)
            }
        }
    }

    fn attach_link(
        &mut self,
        ifname: &str,
        ifindex: u32,
        mode: AttachMode,
    ) -> Result<XdpLinkId, XdpError> {
        let ifname_owned = ifname.to_string();
        let classify = move |e: ProgramError, mode_name: &'static str| -> XdpError {
            match program_errno(&e) {
                // EBUSY: a program/link is attached in this mode;
                // EEXIST: one is attached in the other (native vs generic) mode.
                Some(libc::EBUSY) | Some(libc::EEXIST) => XdpError::AlreadyAttached {
                    ifname: ifname_owned.clone(),
                    detail: detail(&e),
                },
                Some(libc::ENODEV) => XdpError::NoSuchInterface(ifname_owned.clone()),
                code => XdpError::Attach {
                    ifname: ifname_owned.clone(),
                    mode: mode_name,
                    detail: detail(&e),
                    hint: attach_hint(&ifname_owned, code),
                },
            }
        };
        let prog = self.program()?;
        match mode {
            AttachMode::Driver => {
                let link = prog
                    .attach_to_if_index(ifindex, XdpMode::Driver)
                    .map_err(|e| classify(e, "driver"))?;
                tracing::info!(ifname, "XDP program attached in driver (native) mode");
                Ok(link)
            }
            AttachMode::Skb => {
                let link = prog
                    .attach_to_if_index(ifindex, XdpMode::Skb)
                    .map_err(|e| classify(e, "skb"))?;
                tracing::info!(ifname, "XDP program attached in skb (generic) mode");
                Ok(link)
            }
            AttachMode::Auto => match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                Ok(link) => {
                    tracing::info!(ifname, "XDP program attached in driver (native) mode");
                    Ok(link)
                }
                Err(e) => {
                    let first = classify(e, "driver");
                    if matches!(
                        first,
                        XdpError::AlreadyAttached { .. } | XdpError::NoSuchInterface(_)
                    ) {
                        return Err(first);
                    }
                    let link = prog
                        .attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(|e| classify(e, "skb"))?;
                    tracing::info!(ifname, reason = %first, "XDP program attached in skb (generic) mode; driver mode failed");
                    Ok(link)
                }
            },
        }
    }

    /// Puts an AF_XDP socket fd into `xsks` at `port_idx * MAX_QUEUES + queue`.
    /// The socket must already be bound to that port's interface and queue
    /// (the kernel rejects the redirect otherwise). Closing the socket removes
    /// its entry; registering another fd at the same slot replaces it.
    pub fn register_socket(
        &mut self,
        port_idx: u32,
        queue: u32,
        fd: RawFd,
    ) -> Result<(), XdpError> {
        let slot = xsk_slot(port_idx, queue)?;
        self.xsks.set(slot, fd, 0).map_err(|e| XdpError::Map {
            map: "xsks",
            detail: format!(
                "setting slot {slot} (port {port_idx} queue {queue}) to fd {fd}: {}",
                detail(&e)
            ),
        })
    }

    /// Removes the socket registered for (`port_idx`, `queue`), if any.
    pub fn unregister_socket(&mut self, port_idx: u32, queue: u32) -> Result<(), XdpError> {
        let slot = xsk_slot(port_idx, queue)?;
        match self.xsks.unset(slot) {
            Ok(()) => Ok(()),
            Err(e) if errno_in(&e) == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(XdpError::Map {
                map: "xsks",
                detail: format!("clearing slot {slot}: {}", detail(&e)),
            }),
        }
    }

    /// Per-port counters, summed over CPUs.
    pub fn counters(&self, port_idx: u32) -> Result<SteerCounters, XdpError> {
        if port_idx >= MAX_PORTS {
            return Err(XdpError::PortOutOfRange(port_idx));
        }
        let read = |which: u32| -> Result<u64, XdpError> {
            let values = self
                .counters
                .get(&counter_key(port_idx, which), 0)
                .map_err(|e| XdpError::Counters {
                    port_idx,
                    detail: detail(&e),
                })?;
            Ok(values.iter().fold(0u64, |acc, v| acc.wrapping_add(*v)))
        };
        Ok(SteerCounters {
            steered: read(CNT_STEERED)?,
            passed: read(CNT_PASSED)?,
            malformed: read(CNT_MALFORMED)?,
        })
    }

    /// Interfaces currently attached, with their port index.
    pub fn attached(&self) -> impl Iterator<Item = (&str, u32)> {
        self.attached.iter().map(|(n, a)| (n.as_str(), a.port_idx))
    }

    /// Detaches from every interface it attached to (also done in Drop).
    /// Idempotent. Tries every interface even if one fails; returns the first
    /// error.
    pub fn detach_all(&mut self) -> Result<(), XdpError> {
        let mut first_err = None;
        let attached: Vec<(String, Attached)> = self.attached.drain().collect();
        for (ifname, a) in attached {
            let _ = self.ports.remove(&a.ifindex);
            let res = self.program().and_then(|p| {
                p.detach(a.link).map_err(|e| XdpError::Detach {
                    ifname: ifname.clone(),
                    detail: detail(&e),
                })
            });
            match res {
                Ok(()) => tracing::info!(ifname, "XDP program detached"),
                Err(e) => {
                    tracing::warn!(ifname, error = %e, "XDP detach failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for SteeringProgram {
    fn drop(&mut self) {
        let _ = self.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_layout_matches_c_program() {
        assert_eq!(xsk_slot(0, 0).unwrap(), 0);
        assert_eq!(xsk_slot(0, 63).unwrap(), 63);
        assert_eq!(xsk_slot(1, 0).unwrap(), 64);
        assert_eq!(xsk_slot(63, 63).unwrap(), 64 * 64 - 1);
        assert!(matches!(xsk_slot(64, 0), Err(XdpError::PortOutOfRange(64))));
        assert!(matches!(
            xsk_slot(0, 64),
            Err(XdpError::QueueOutOfRange(64))
        ));
    }

    #[test]
    fn counter_keys() {
        assert_eq!(counter_key(0, CNT_STEERED), 0);
        assert_eq!(counter_key(0, CNT_MALFORMED), 2);
        assert_eq!(counter_key(3, CNT_PASSED), 13);
        assert!(counter_key(MAX_PORTS - 1, 3) < MAX_PORTS * COUNTERS_PER_PORT);
    }

    #[test]
    fn keys_are_network_byte_order_in_memory() {
        let k = addr_key(Ipv4Addr::new(198, 18, 99, 1));
        assert_eq!(k.to_ne_bytes(), [198, 18, 99, 1]);
        let c = AggConfig::new(0x1234);
        assert_eq!(c.agg_port_be.to_ne_bytes(), [0x12, 0x34]);
    }

    #[test]
    fn embedded_object_is_bpf_elf() {
        assert_eq!(&AGG_XDP_OBJ[..4], b"\x7fELF");
        // e_machine at offset 18: EM_BPF = 247.
        let machine = u16::from_le_bytes([AGG_XDP_OBJ[18], AGG_XDP_OBJ[19]]);
        assert_eq!(machine, 247);
    }

    #[test]
    fn error_messages_say_what_to_do() {
        let e = XdpError::Attach {
            ifname: "sw-w0".into(),
            mode: "driver",
            detail: "boom".into(),
            hint: attach_hint("sw-w0", Some(libc::EINVAL)),
        };
        let m = e.to_string();
        assert!(
            m.contains("sw-w0") && m.contains("ip link set dev sw-w0 xdp off"),
            "{m}"
        );
        assert_eq!(
            XdpError::NoSuchInterface("foo".into()).to_string(),
            "no such interface `foo`"
        );
    }
}
