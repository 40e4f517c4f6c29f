//! What the Linux bridge would do, as the XDP fast path needs to know it:
//! for every attached port, which bridge it is enslaved to, its STP state,
//! whether that bridge filters VLANs, whether the port is isolated, and
//! whether a VLAN tag on a frame it receives is always visible to the
//! program. [`BridgeView`] writes these facts into the program's
//! `port_info` map (`struct port_info` of `ebpf/maps.h`) when a port is
//! attached and again on every [`BridgeView::refresh`]; switchd calls
//! that from its periodic tick (at least once a second), so a port moved to
//! another bridge, set to a non-forwarding state, or a bridge whose
//! `vlan_filtering` is turned on loses the fast path within about a second.
//! The program forwards only between two ports of the same bridge, both
//! forwarding, on a bridge without VLAN filtering, from a port whose tags
//! it can see; everything else goes to the bridge (ebpf/agg_xdp.c).
//!
//! # Where the facts come from
//!
//! * Bridge, state, isolation: sysfs, `/sys/class/net/PORT/brport/{bridge,
//!   state,isolated}`, and `/sys/class/net/BR/{ifindex,bridge/vlan_filtering}`.
//!   A kernel built without `CONFIG_BRIDGE_VLAN_FILTERING` has no
//!   `vlan_filtering` file and cannot filter: that counts as off. A port with
//!   no `brport` directory is in no bridge.
//! * Tag visibility (measured on kernel 6.18, 2026-11-23, with a probe XDP
//!   program counting EtherTypes on a veth while the peer sent frames whose
//!   802.1Q tag a tc program had put in skb metadata, as a VLAN device with
//!   `tx-vlan-offload` on does): the program saw the tag in the frame's bytes
//!   only when the **peer's** `tx-vlan-offload` was off; the receiving
//!   veth's own `rx-vlan-offload` made no difference, in driver and in
//!   generic (skb) mode alike. A NIC with `rx-vlan-offload` on strips the tag
//!   into the receive descriptor the same way. A redirected frame loses such
//!   a tag, so it would reach the other port untagged. Hence
//!   [`PORT_F_TAGS_VISIBLE`] is set only when:
//!   * a **veth** port's peer has `tx-vlan-hw-insert` and
//!     `tx-vlan-stag-hw-insert` off; switchd reads the peer's features in
//!     the peer's network namespace (its netnsid from rtnetlink, matched
//!     against the named namespaces in `/run/netns`, entered on a short-lived
//!     thread). A peer in an unnamed namespace cannot be checked: no fast
//!     path from that port;
//!   * a NIC (no `IFLA_INFO_KIND`) or a `tun`/`tap` has `rx-vlan-hw-parse`
//!     and `rx-vlan-stag-hw-parse` off;
//!   * any other kind of device (bond, macvlan, vxlan, …) is not judged: no
//!     fast path from it.
//!
//!   The kfunc `bpf_xdp_metadata_rx_vlan_tag` would let the program ask per
//!   frame instead, but it needs a device-bound program (one per port,
//!   loaded with `BPF_F_XDP_DEV_BOUND_ONLY`), which aya 0.14 cannot load, and
//!   it is not available in generic mode.
//!
//! # Updating a live entry
//!
//! The kernel copies a map value in with `memcpy`, so the program could read
//! half an old and half a new entry. When an entry changes, it is first set
//! to all zeros ("in no bridge": every mix of zeros with the old or the new
//! value is refused) and then to the new value.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::maps::{Array, MapData};

use super::error::XdpError;
use super::maps::{
    PortInfo, BR_STATE_BLOCKING, BR_STATE_DISABLED, BR_STATE_FORWARDING, BR_STATE_LEARNING,
    BR_STATE_LISTENING, PORT_F_ISOLATED, PORT_F_TAGS_VISIBLE, PORT_F_VLAN_FILTERING,
    PORT_F_XMIT_SG,
};

/// Where interfaces are described.
pub const SYSFS_NET: &str = "/sys/class/net";
/// Where `ip netns add` puts its namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";
/// How often switchd calls [`BridgeView::refresh`] (through
/// `SteeringProgram::refresh_ports`): the longest the fast path may lag
/// behind a change of the bridges.
pub const PORT_REFRESH_EVERY: Duration = Duration::from_secs(1);
/// At most one refusal summary log line this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// A port's membership in a Linux bridge, from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeFacts {
    pub bridge: String,
    pub bridge_ifindex: u32,
    /// `brport/state`: `BR_STATE_*`.
    pub stp_state: u8,
    pub vlan_filtering: bool,
    pub isolated: bool,
}

/// Whether a VLAN tag on a frame received on a port is always in the
/// frame's bytes, where the XDP program sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagVisibility {
    Visible,
    /// Offload may move the tag out of the frame: why.
    Hidden(String),
    /// switchd cannot tell: why.
    Unknown(String),
}

/// Everything [`BridgeView`] knows about one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    /// `Ok(None)`: in no bridge. `Err`: could not be read.
    pub bridge: Result<Option<BridgeFacts>, String>,
    pub tags: TagVisibility,
    /// A redirect to the port carries a frame in several buffers
    /// ([`PORT_F_XMIT_SG`]): known for veth only.
    pub xmit_multi_buffer: bool,
}

fn state_name(state: u8) -> &'static str {
    match u32::from(state) {
        BR_STATE_DISABLED => "disabled",
        BR_STATE_LISTENING => "listening",
        BR_STATE_LEARNING => "learning",
        BR_STATE_FORWARDING => "forwarding",
        BR_STATE_BLOCKING => "blocking",
        _ => "unknown",
    }
}

impl PortFacts {
    /// The `port_info` entry the program reads.
    pub fn port_info(&self) -> PortInfo {
        let Ok(Some(b)) = &self.bridge else {
            return PortInfo::default();
        };
        let mut flags = 0u32;
        if b.vlan_filtering {
            flags |= PORT_F_VLAN_FILTERING;
        }
        if b.isolated {
            flags |= PORT_F_ISOLATED;
        }
        if self.tags == TagVisibility::Visible {
            flags |= PORT_F_TAGS_VISIBLE;
        }
        if self.xmit_multi_buffer {
            flags |= PORT_F_XMIT_SG;
        }
        PortInfo {
            bridge_ifindex: b.bridge_ifindex,
            stp_state: b.stp_state,
            flags: flags as u8,
            _pad: 0,
        }
    }

    /// One line for the log: whether the fast path may use the port, and if
    /// not every reason why (for forwarding from it; forwarding to it needs
    /// only bridge and state).
    pub fn describe(&self) -> String {
        let b = match &self.bridge {
            Err(e) => return format!("off: bridge membership unreadable ({e})"),
            Ok(None) => return "off: in no bridge".to_string(),
            Ok(Some(b)) => b,
        };
        let mut why = Vec::new();
        if u32::from(b.stp_state) != BR_STATE_FORWARDING {
            why.push(format!(
                "port state {} ({})",
                state_name(b.stp_state),
                b.stp_state
            ));
        }
        if b.vlan_filtering {
            why.push(format!("bridge {} has vlan_filtering on", b.bridge));
        }
        match &self.tags {
            TagVisibility::Visible => {}
            TagVisibility::Hidden(r) | TagVisibility::Unknown(r) => {
                why.push(format!("not from this port: {r}"))
            }
        }
        if b.isolated {
            why.push("isolated (not to other isolated ports)".to_string());
        }
        if why.is_empty() {
            format!("on (bridge {})", b.bridge)
        } else {
            format!("restricted in bridge {}: {}", b.bridge, why.join("; "))
        }
    }
}

fn read_trimmed(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read_num<T: std::str::FromStr>(path: &Path) -> Result<T, String> {
    let s = read_trimmed(path)?;
    s.parse()
        .map_err(|_| format!("{}: not a number: {s:?}", path.display()))
}

/// Bridge membership of `ifname` as `sysfs` (normally [`SYSFS_NET`]) shows it.
pub fn read_bridge_facts(sysfs: &Path, ifname: &str) -> Result<Option<BridgeFacts>, String> {
    let dev = sysfs.join(ifname);
    if !dev.exists() {
        return Err(format!("{} does not exist", dev.display()));
    }
    let brport = dev.join("brport");
    if !brport.is_dir() {
        return Ok(None);
    }
    let link = std::fs::read_link(brport.join("bridge"))
        .map_err(|e| format!("{}: {e}", brport.join("bridge").display()))?;
    let bridge = link
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: odd link {}", brport.display(), link.display()))?
        .to_string();
    let br = sysfs.join(&bridge);
    let bridge_ifindex: u32 = read_num(&br.join("ifindex"))?;
    let stp_state: u8 = read_num(&brport.join("state"))?;
    let vf = br.join("bridge/vlan_filtering");
    let vlan_filtering = if vf.exists() {
        read_num::<u8>(&vf)? != 0
    } else if br.join("bridge").is_dir() {
        false // built without CONFIG_BRIDGE_VLAN_FILTERING: cannot filter
    } else {
        return Err(format!("{} is not a bridge", br.display()));
    };
    let iso = brport.join("isolated");
    let isolated = iso.exists() && read_num::<u8>(&iso)? != 0;
    if bridge_ifindex == 0 {
        return Err(format!("{}: ifindex 0", br.display()));
    }
    Ok(Some(BridgeFacts {
        bridge,
        bridge_ifindex,
        stp_state,
        vlan_filtering,
        isolated,
    }))
}

// ---------------------------------------------------------------------------
// rtnetlink: a link's kind, its peer (IFLA_LINK) and the peer's netnsid, and
// the netnsid of a namespace file.

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes (type, payload) in `buf`, netlink-aligned; stops at the
/// first malformed one.
fn attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= buf.len() {
        let len = u16::from_ne_bytes([buf[at], buf[at + 1]]) as usize;
        let ty = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]) & NLA_TYPE_MASK;
        if len < 4 || at + len > buf.len() {
            break;
        }
        out.push((ty, &buf[at + 4..at + len]));
        at += align4(len);
    }
    out
}

fn attr_u32(buf: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(..4)?.try_into().ok()?))
}

/// What rtnetlink says about a link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkInfo {
    /// `IFLA_INFO_KIND` ("veth", "tun", …); `None` for a plain device (a NIC).
    pub kind: Option<String>,
    /// `IFLA_LINK`: for a veth, the peer's ifindex (in the peer's namespace).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the namespace of `link`, if not ours.
    pub link_netnsid: Option<i32>,
}

/// Parses an `RTM_NEWLINK` payload (`struct ifinfomsg` then attributes).
fn parse_link(payload: &[u8]) -> LinkInfo {
    let mut info = LinkInfo::default();
    for (ty, data) in attrs(payload.get(16..).unwrap_or(&[])) {
        match ty {
            IFLA_LINK => info.link = attr_u32(data),
            IFLA_LINK_NETNSID => info.link_netnsid = attr_u32(data).map(|v| v as i32),
            IFLA_LINKINFO => {
                for (t, d) in attrs(data) {
                    if t == IFLA_INFO_KIND {
                        let end = d.iter().position(|b| *b == 0).unwrap_or(d.len());
                        info.kind = Some(String::from_utf8_lossy(&d[..end]).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    info
}

/// A NETLINK_ROUTE socket for one request at a time.
struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

impl Rtnl {
    fn open() -> std::io::Result<Rtnl> {
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval for the duration of the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Rtnl { fd, seq: 0 })
    }

    /// Sends one request and returns the payload of its reply of type
    /// `want` (a negative errno reply becomes an error).
    fn request(&mut self, ty: u16, body: &[u8], want: u16) -> std::io::Result<Vec<u8>> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        // SAFETY: `msg` is a valid buffer of msg.len() bytes; the kernel
        // address is the default (zeroed sockaddr_nl is not needed for send).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is a writable buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = n as usize;
            if n > buf.len() {
                return Err(std::io::Error::other(format!(
                    "rtnetlink reply of {n} bytes truncated"
                )));
            }
            let mut at = 0;
            while at + NLMSG_HDRLEN <= n {
                let h = &buf[at..n];
                let mlen = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
                let mty = u16::from_ne_bytes([h[4], h[5]]);
                let mseq = u32::from_ne_bytes(h[8..12].try_into().unwrap());
                if mlen < NLMSG_HDRLEN || mlen > h.len() {
                    return Err(std::io::Error::other("malformed rtnetlink reply"));
                }
                if mseq == self.seq {
                    let payload = &h[NLMSG_HDRLEN..mlen];
                    if mty == NLMSG_ERROR {
                        let code = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .unwrap_or(-libc::EIO);
                        return Err(std::io::Error::from_raw_os_error(-code));
                    }
                    if mty == want {
                        return Ok(payload.to_vec());
                    }
                }
                at += align4(mlen);
            }
        }
    }

    fn link(&mut self, ifindex: u32) -> std::io::Result<LinkInfo> {
        // struct ifinfomsg { u8 family, u8 pad, u16 type, i32 index, u32 flags, u32 change }
        let mut body = [0u8; 16];
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let reply = self.request(RTM_GETLINK, &body, RTM_NEWLINK)?;
        Ok(parse_link(&reply))
    }

    /// The id our namespace gives the namespace `fd` refers to (-1: none).
    fn nsid_of(&mut self, fd: RawFd) -> std::io::Result<i32> {
        // struct rtgenmsg { u8 family } padded to 4, then NETNSA_FD.
        let mut body = vec![0u8; 4];
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&NETNSA_FD.to_ne_bytes());
        body.extend_from_slice(&(fd as u32).to_ne_bytes());
        let reply = self.request(RTM_GETNSID, &body, RTM_NEWNSID)?;
        attrs(reply.get(4..).unwrap_or(&[]))
            .into_iter()
            .find(|(t, _)| *t == NETNSA_NSID)
            .and_then(|(_, d)| attr_u32(d))
            .map(|v| v as i32)
            .ok_or_else(|| std::io::Error::other("RTM_NEWNSID without NETNSA_NSID"))
    }
}

// ---------------------------------------------------------------------------
// ethtool: active features by name (ETHTOOL_GSSET_INFO/GSTRINGS/GFEATURES).

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool(sock: RawFd, ifname: &str, data: *mut libc::c_void) -> std::io::Result<()> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in req.name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq whose data pointer points at a buffer
    // the caller sized for the ethtool command it holds.
    let r = unsafe { libc::ioctl(sock, SIOCETHTOOL as _, &mut req as *mut IfReq) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `Some(active)` for each of `names`, `None` where the kernel has no
/// feature of that name. Runs in the calling thread's network namespace.
fn features(ifname: &str, names: &[&str]) -> std::io::Result<Vec<Option<bool>>> {
    // SAFETY: plain socket(2); owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[1] }
    let mut sset = [0u32; 6];
    sset[0] = ETHTOOL_GSSET_INFO;
    let mask = 1u64 << ETH_SS_FEATURES;
    sset[2] = mask as u32;
    sset[3] = (mask >> 32) as u32;
    ethtool(sock.as_raw_fd(), ifname, sset.as_mut_ptr().cast())?;
    let count = sset[4] as usize;
    if count == 0 || count > 4096 {
        return Err(std::io::Error::other(format!("{count} feature strings")));
    }
    // struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[] }
    let mut strings = vec![0u32; 3 + count * ETH_GSTRING_LEN / 4];
    strings[0] = ETHTOOL_GSTRINGS;
    strings[1] = ETH_SS_FEATURES;
    strings[2] = count as u32;
    ethtool(sock.as_raw_fd(), ifname, strings.as_mut_ptr().cast())?;
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    // struct ethtool_gfeatures { u32 cmd; u32 size; blocks { available,
    // requested, active, never_changed }[size] }
    let blocks = count.div_ceil(32);
    let mut feats = vec![0u32; 2 + 4 * blocks];
    feats[0] = ETHTOOL_GFEATURES;
    feats[1] = blocks as u32;
    ethtool(sock.as_raw_fd(), ifname, feats.as_mut_ptr().cast())?;
    Ok(names
        .iter()
        .map(|want| {
            feature_index(&bytes, count, want)
                .map(|i| feats[2 + 4 * (i / 32) + 2] & (1 << (i % 32)) != 0)
        })
        .collect())
}

/// Index of feature `want` in the ETH_SS_FEATURES string table.
fn feature_index(table: &[u8], count: usize, want: &str) -> Option<usize> {
    (0..count).find(|i| {
        let s = &table[i * ETH_GSTRING_LEN..(i + 1) * ETH_GSTRING_LEN];
        let end = s.iter().position(|b| *b == 0).unwrap_or(s.len());
        &s[..end] == want.as_bytes()
    })
}

fn if_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: `buf` has IFNAMSIZ bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let c = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(c.to_string_lossy().into_owned())
}

/// Features that, when on, let a tag travel outside the frame's bytes.
const PEER_TX_VLAN: [&str; 2] = ["tx-vlan-hw-insert", "tx-vlan-stag-hw-insert"];
const OWN_RX_VLAN: [&str; 2] = ["rx-vlan-hw-parse", "rx-vlan-stag-hw-parse"];

/// Judges `names`' states on a device: visible only if every one is known
/// and off.
fn judge(what: &str, names: &[&str], states: std::io::Result<Vec<Option<bool>>>) -> TagVisibility {
    match states {
        Err(e) => TagVisibility::Unknown(format!("reading {what}'s features: {e}")),
        Ok(states) => {
            let on: Vec<&str> = names
                .iter()
                .zip(&states)
                .filter(|(_, s)| **s != Some(false))
                .map(|(n, _)| *n)
                .collect();
            if on.is_empty() {
                TagVisibility::Visible
            } else {
                TagVisibility::Hidden(format!(
                    "{what} has {} on or unknown: VLAN tags may bypass the frame bytes XDP sees \
                     (ethtool -K DEV {} off)",
                    on.join(", "),
                    on.join(" off ")
                ))
            }
        }
    }
}

/// Runs `f` on a thread inside the network namespace `ns`.
fn in_netns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    let fd = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: `fd` is an open namespace file; setns only changes
            // this (short-lived) thread's network namespace.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns helper thread panicked")))
    })
}

/// Named namespaces by the id our namespace gives them, found once per
/// refresh and only when a veth peer lives elsewhere.
#[derive(Default)]
struct Namespaces {
    scanned: bool,
    by_nsid: BTreeMap<i32, (PathBuf, File)>,
}

impl Namespaces {
    fn find(&mut self, rtnl: &mut Rtnl, nsid: i32) -> Option<&(PathBuf, File)> {
        if !self.scanned {
            self.scanned = true;
            if let Ok(dir) = std::fs::read_dir(NAMED_NETNS_DIR) {
                for ent in dir.flatten() {
                    let path = ent.path();
                    let Ok(f) = File::open(&path) else { continue };
                    if let Ok(id) = rtnl.nsid_of(f.as_raw_fd()) {
                        if id >= 0 {
                            self.by_nsid.entry(id).or_insert((path, f));
                        }
                    }
                }
            }
        }
        self.by_nsid.get(&nsid)
    }
}

/// Whether the XDP program sees every VLAN tag of frames received on port
/// `ifname` (see the module docs for the rules and the measurement).
fn tag_visibility(
    rtnl: &mut Rtnl,
    ns: &mut Namespaces,
    ifindex: u32,
    ifname: &str,
) -> TagVisibility {
    let link = match rtnl.link(ifindex) {
        Ok(l) => l,
        Err(e) => return TagVisibility::Unknown(format!("rtnetlink RTM_GETLINK: {e}")),
    };
    match link.kind.as_deref() {
        Some("veth") => {
            let Some(peer) = link.link.filter(|p| *p != 0) else {
                return TagVisibility::Unknown("veth without a peer ifindex".into());
            };
            let read_peer = move || match if_name(peer) {
                Some(name) => (name.clone(), features(&name, &PEER_TX_VLAN)),
                None => (
                    format!("ifindex {peer}"),
                    Err(std::io::Error::from_raw_os_error(libc::ENODEV)),
                ),
            };
            let (where_, (peer_name, states)) = match link.link_netnsid {
                None => ("this namespace".to_string(), read_peer()),
                Some(id) => {
                    let Some((path, file)) = ns.find(rtnl, id) else {
                        return TagVisibility::Unknown(format!(
                            "its veth peer is in namespace id {id}, which has no name in \
                             {NAMED_NETNS_DIR}: cannot read the peer's VLAN offload"
                        ));
                    };
                    match in_netns(file, read_peer) {
                        Ok(r) => (path.display().to_string(), r),
                        Err(e) => {
                            return TagVisibility::Unknown(format!(
                                "entering {}: {e}",
                                path.display()
                            ))
                        }
                    }
                }
            };
            judge(
                &format!("veth peer {peer_name} (in {where_})"),
                &PEER_TX_VLAN,
                states,
            )
        }
        None | Some("tun") => judge(ifname, &OWN_RX_VLAN, features(ifname, &OWN_RX_VLAN)),
        Some(other) => TagVisibility::Unknown(format!(
            "a {other} device: switchd cannot tell whether it hides VLAN tags"
        )),
    }
}

/// Whether a DEVMAP redirect to `ifindex` carries a frame in several
/// buffers. veth sets NETDEV_XDP_ACT_NDO_XMIT_SG together with
/// NDO_XMIT; other drivers would need their `xdp_features` read (netdev
/// generic netlink), which switchd does not do: not assumed.
fn transmits_multi_buffer(rtnl: &mut Rtnl, ifindex: u32) -> bool {
    rtnl.link(ifindex)
        .is_ok_and(|l| l.kind.as_deref() == Some("veth"))
}

// ---------------------------------------------------------------------------

struct Watched {
    ifindex: u32,
    /// Name at attach (for logs; the current name is looked up by ifindex).
    name: String,
    written: PortInfo,
    described: String,
}

/// Refusal counters of one port, in [`REFUSAL_NAMES`] order.
pub type Refusals = [u64; REFUSAL_NAMES.len()];
/// Names of the refusal counters (as in `SteerCounters` and the log).
pub const REFUSAL_NAMES: [&str; 7] = [
    "fwd_not_bridged",
    "fwd_other_bridge",
    "fwd_not_forwarding",
    "fwd_vlan_filtering",
    "fwd_vlan_hidden",
    "fwd_isolated",
    "fwd_multi_buffer",
];

/// The program's `port_info` map and the ports it describes.
pub struct BridgeView {
    map: Array<MapData, PortInfo>,
    ports: BTreeMap<u32, Watched>,
    sysfs: PathBuf,
    last_refusal_log: Option<Instant>,
    logged_refusals: BTreeMap<u32, Refusals>,
}

impl std::fmt::Debug for BridgeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeView")
            .field("ports", &self.ports.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl BridgeView {
    pub(crate) fn new(map: Array<MapData, PortInfo>) -> BridgeView {
        BridgeView {
            map,
            ports: BTreeMap::new(),
            sysfs: PathBuf::from(SYSFS_NET),
            last_refusal_log: None,
            logged_refusals: BTreeMap::new(),
        }
    }

    /// Ports described, by port index.
    pub fn ports(&self) -> impl Iterator<Item = (u32, &str)> {
        self.ports.iter().map(|(i, w)| (*i, w.name.as_str()))
    }

    /// Writes one entry as is (the refresh logic's primitive; tests use it
    /// to put the program in a given situation).
    pub(super) fn set(&mut self, port_idx: u32, info: PortInfo) -> Result<(), XdpError> {
        self.map.set(port_idx, info, 0).map_err(|e| XdpError::Map {
            map: "port_info",
            detail: format!("setting port {port_idx}: {e}"),
        })
    }

    /// Reads the facts of every port in `which` and writes the entries that
    /// changed (zeros first, see the module docs). Logs each change.
    fn update(&mut self, which: &[u32]) -> Result<usize, XdpError> {
        let mut rtnl = Rtnl::open().map_err(|e| XdpError::Map {
            map: "port_info",
            detail: format!("opening an rtnetlink socket: {e}"),
        });
        let mut ns = Namespaces::default();
        let mut changed = 0;
        for &idx in which {
            let Some(w) = self.ports.get(&idx) else {
                continue;
            };
            let ifindex = w.ifindex;
            let facts = match if_name(ifindex) {
                None => PortFacts {
                    bridge: Err(format!("ifindex {ifindex} is gone")),
                    tags: TagVisibility::Unknown("interface gone".into()),
                    xmit_multi_buffer: false,
                },
                Some(name) => PortFacts {
                    bridge: read_bridge_facts(&self.sysfs, &name),
                    tags: match rtnl.as_mut() {
                        Ok(r) => tag_visibility(r, &mut ns, ifindex, &name),
                        Err(e) => TagVisibility::Unknown(e.to_string()),
                    },
                    xmit_multi_buffer: rtnl
                        .as_mut()
                        .is_ok_and(|r| transmits_multi_buffer(r, ifindex)),
                },
            };
            let info = facts.port_info();
            let described = facts.describe();
            let (old, old_desc) = (w.written, w.described.clone());
            if info != old {
                if old != PortInfo::default() {
                    self.set(idx, PortInfo::default())?;
                }
                self.set(idx, info)?;
                changed += 1;
            }
            let w = self.ports.get_mut(&idx).expect("looked up above");
            w.written = info;
            if described != old_desc {
                tracing::info!(
                    port = %w.name,
                    port_idx = idx,
                    "XDP fast path for this port: {described}"
                );
                w.described = described;
            }
        }
        Ok(changed)
    }

    /// Starts describing port `port_idx` (interface `ifindex`, `name`) and
    /// writes its entry at once: call before attaching the program to it.
    pub(crate) fn watch(
        &mut self,
        port_idx: u32,
        ifindex: u32,
        name: &str,
    ) -> Result<(), XdpError> {
        self.ports.insert(
            port_idx,
            Watched {
                ifindex,
                name: name.to_string(),
                written: PortInfo::default(),
                described: String::new(),
            },
        );
        self.set(port_idx, PortInfo::default())?;
        self.update(&[port_idx]).map(|_| ())
    }

    /// Stops describing `port_idx` and zeroes its entry.
    pub(crate) fn unwatch(&mut self, port_idx: u32) {
        if self.ports.remove(&port_idx).is_some() {
            let _ = self.set(port_idx, PortInfo::default());
        }
        self.logged_refusals.remove(&port_idx);
    }

    /// Re-reads every watched port's facts and rewrites the entries that
    /// changed; returns how many did. Call it at least once a second.
    pub fn refresh(&mut self) -> Result<usize, XdpError> {
        let which: Vec<u32> = self.ports.keys().copied().collect();
        self.update(&which)
    }

    /// Logs the refusal counters (frames the fast path left to the bridge
    /// because of its rules) when they grew, at most every 10 s.
    pub(crate) fn log_refusals(&mut self, now: Instant, counts: BTreeMap<u32, Refusals>) {
        if self
            .last_refusal_log
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        if counts.iter().all(|(i, c)| {
            self.logged_refusals
                .get(i)
                .unwrap_or(&[0; REFUSAL_NAMES.len()])
                == c
        }) {
            return;
        }
        let parts: Vec<String> = counts
            .iter()
            .filter(|(_, c)| c.iter().any(|v| *v > 0))
            .map(|(i, c)| {
                let name = self.ports.get(i).map_or("?", |w| w.name.as_str());
                let kv: Vec<String> = REFUSAL_NAMES
                    .iter()
                    .zip(c)
                    .filter(|(_, v)| **v > 0)
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                format!("{name}: {}", kv.join(" "))
            })
            .collect();
        tracing::info!(
            "XDP fast path refusals since start (frames left to the bridge by its rules): {}",
            parts.join("; ")
        );
        self.last_refusal_log = Some(now);
        self.logged_refusals = counts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /sys/class/net under a temp dir.
    struct FakeSys(PathBuf);

    impl FakeSys {
        fn new(name: &str) -> FakeSys {
            let p = std::env::temp_dir().join(format!("brg-sysfs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            FakeSys(p)
        }
        fn write(&self, rel: &str, text: &str) {
            let f = self.0.join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        fn bridge(&self, br: &str, ifindex: u32, vlan_filtering: Option<u8>) {
            self.write(&format!("{br}/ifindex"), &format!("{ifindex}\n"));
            std::fs::create_dir_all(self.0.join(br).join("bridge")).unwrap();
            if let Some(v) = vlan_filtering {
                self.write(&format!("{br}/bridge/vlan_filtering"), &format!("{v}\n"));
            }
        }
        fn port(&self, port: &str, br: &str, state: u8, isolated: Option<u8>) {
            self.write(&format!("{port}/ifindex"), "7\n");
            self.write(&format!("{port}/brport/state"), &format!("{state}\n"));
            if let Some(i) = isolated {
                self.write(&format!("{port}/brport/isolated"), &format!("{i}\n"));
            }
            std::os::unix::fs::symlink(
                format!("../../{br}"),
                self.0.join(port).join("brport/bridge"),
            )
            .unwrap();
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn facts(b: Option<BridgeFacts>, tags: TagVisibility) -> PortFacts {
        PortFacts {
            bridge: Ok(b),
            tags,
            xmit_multi_buffer: false,
        }
    }

    #[test]
    fn reads_bridge_state_isolation_and_vlan_filtering() {
        let s = FakeSys::new("a");
        s.bridge("br0", 5, Some(0));
        s.bridge("br1", 9, Some(1));
        s.bridge("br2", 11, None); // no CONFIG_BRIDGE_VLAN_FILTERING
        s.port("p0", "br0", 3, Some(0));
        s.port("p1", "br1", 0, Some(1));
        s.port("p2", "br2", 4, None);
        s.write("lone/ifindex", "12\n");
        assert_eq!(
            read_bridge_facts(&s.0, "p0").unwrap(),
            Some(BridgeFacts {
                bridge: "br0".into(),
                bridge_ifindex: 5,
                stp_state: 3,
                vlan_filtering: false,
                isolated: false
            })
        );
        let p1 = read_bridge_facts(&s.0, "p1").unwrap().unwrap();
        assert_eq!(
            (p1.bridge.as_str(), p1.bridge_ifindex, p1.stp_state),
            ("br1", 9, 0)
        );
        assert!(p1.vlan_filtering && p1.isolated);
        let p2 = read_bridge_facts(&s.0, "p2").unwrap().unwrap();
        assert!(!p2.vlan_filtering && !p2.isolated);
        assert_eq!(p2.stp_state, 4);
        assert_eq!(read_bridge_facts(&s.0, "lone").unwrap(), None);
        assert!(read_bridge_facts(&s.0, "gone").is_err());
    }

    #[test]
    fn a_master_that_is_not_a_bridge_or_garbage_is_an_error() {
        let s = FakeSys::new("b");
        s.write("notbr/ifindex", "5\n"); // no bridge/ directory
        s.port("p0", "notbr", 3, None);
        assert!(read_bridge_facts(&s.0, "p0")
            .unwrap_err()
            .contains("not a bridge"));
        s.bridge("br0", 6, Some(0));
        s.port("p1", "br0", 3, None);
        s.write("p1/brport/state", "forwarding\n");
        assert!(read_bridge_facts(&s.0, "p1")
            .unwrap_err()
            .contains("not a number"));
    }

    #[test]
    fn port_info_carries_bridge_state_and_flags() {
        let b = BridgeFacts {
            bridge: "br0".into(),
            bridge_ifindex: 5,
            stp_state: BR_STATE_FORWARDING as u8,
            vlan_filtering: false,
            isolated: false,
        };
        let f = facts(Some(b.clone()), TagVisibility::Visible);
        assert_eq!(
            f.port_info(),
            PortInfo {
                bridge_ifindex: 5,
                stp_state: 3,
                flags: PORT_F_TAGS_VISIBLE as u8,
                _pad: 0
            }
        );
        assert_eq!(f.describe(), "on (bridge br0)");

        let f = facts(
            Some(BridgeFacts {
                vlan_filtering: true,
                isolated: true,
                stp_state: 0,
                ..b.clone()
            }),
            TagVisibility::Hidden("peer has tx-vlan-hw-insert on".into()),
        );
        let pi = f.port_info();
        assert_eq!(
            u32::from(pi.flags),
            PORT_F_VLAN_FILTERING | PORT_F_ISOLATED,
            "no TAGS_VISIBLE when hidden"
        );
        let d = f.describe();
        for want in [
            "disabled",
            "vlan_filtering",
            "tx-vlan-hw-insert",
            "isolated",
        ] {
            assert!(d.contains(want), "{want} missing from {d}");
        }
        let f = facts(
            Some(b.clone()),
            TagVisibility::Unknown("a bond device".into()),
        );
        assert_eq!(f.port_info().flags, 0);
        // A veth takes redirected jumbo frames.
        let f = PortFacts {
            xmit_multi_buffer: true,
            ..facts(Some(b), TagVisibility::Visible)
        };
        assert_eq!(
            u32::from(f.port_info().flags),
            PORT_F_TAGS_VISIBLE | PORT_F_XMIT_SG
        );

        // Not in a bridge, or unreadable: all zeros, which the program
        // treats as "in no bridge".
        assert_eq!(
            facts(None, TagVisibility::Visible).port_info(),
            PortInfo::default()
        );
        let err = PortFacts {
            bridge: Err("gone".into()),
            tags: TagVisibility::Visible,
            xmit_multi_buffer: true,
        };
        assert_eq!(err.port_info(), PortInfo::default());
        assert!(err.describe().contains("unreadable"));
    }

    #[test]
    fn judging_features() {
        let names = ["a", "b"];
        assert_eq!(
            judge("x", &names, Ok(vec![Some(false), Some(false)])),
            TagVisibility::Visible
        );
        let TagVisibility::Hidden(why) = judge("x", &names, Ok(vec![Some(false), Some(true)]))
        else {
            panic!("one on must hide")
        };
        assert!(why.contains("b on") && !why.contains("a,"), "{why}");
        assert!(matches!(
            judge("x", &names, Ok(vec![None, Some(false)])),
            TagVisibility::Hidden(_)
        ));
        assert!(matches!(
            judge(
                "x",
                &names,
                Err(std::io::Error::from_raw_os_error(libc::ENODEV))
            ),
            TagVisibility::Unknown(_)
        ));
    }

    #[test]
    fn feature_table_lookup() {
        let mut table = vec![0u8; 3 * ETH_GSTRING_LEN];
        for (i, n) in ["rx-gro", "tx-vlan-hw-insert", "rx-vlan-hw-parse"]
            .iter()
            .enumerate()
        {
            table[i * ETH_GSTRING_LEN..i * ETH_GSTRING_LEN + n.len()].copy_from_slice(n.as_bytes());
        }
        assert_eq!(feature_index(&table, 3, "tx-vlan-hw-insert"), Some(1));
        assert_eq!(feature_index(&table, 3, "rx-vlan-hw-parse"), Some(2));
        assert_eq!(feature_index(&table, 3, "rx-vlan"), None);
    }

    #[test]
    fn parses_an_rtm_newlink_payload() {
        fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
            let mut v = Vec::new();
            v.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            v.extend_from_slice(&ty.to_ne_bytes());
            v.extend_from_slice(data);
            while v.len() % 4 != 0 {
                v.push(0);
            }
            v
        }
        let mut p = vec![0u8; 16]; // ifinfomsg
        p.extend(attr(3, b"sw-h0\0")); // IFLA_IFNAME, ignored
        p.extend(attr(IFLA_LINK, &42u32.to_ne_bytes()));
        let kind = attr(IFLA_INFO_KIND, b"veth\0");
        p.extend(attr(IFLA_LINKINFO | 0x8000, &kind)); // NLA_F_NESTED
        p.extend(attr(IFLA_LINK_NETNSID, &3i32.to_ne_bytes()));
        assert_eq!(
            parse_link(&p),
            LinkInfo {
                kind: Some("veth".into()),
                link: Some(42),
                link_netnsid: Some(3)
            }
        );
        // A NIC: no linkinfo; a truncated attribute stops the walk.
        let mut q = vec![0u8; 16];
        q.extend(attr(IFLA_LINK, &9u32.to_ne_bytes()));
        q.extend_from_slice(&[200, 0, 5, 0]);
        assert_eq!(
            parse_link(&q),
            LinkInfo {
                kind: None,
                link: Some(9),
                link_netnsid: None
            }
        );
    }

    #[test]
    fn refusal_names_match_the_counter_kinds() {
        use super::super::maps::*;
        let kinds = [
            CNT_FWD_NOT_BRIDGED,
            CNT_FWD_OTHER_BRIDGE,
            CNT_FWD_NOT_FORWARDING,
            CNT_FWD_VLAN_FILTERING,
            CNT_FWD_VLAN_HIDDEN,
            CNT_FWD_ISOLATED,
            CNT_FWD_MULTI_BUFFER,
        ];
        // Consecutive, in REFUSAL_NAMES order, inside a port's block.
        for (i, k) in kinds.iter().enumerate() {
            assert_eq!(*k, CNT_FWD_NOT_BRIDGED + i as u32);
            assert!(*k < CNT_PER_PORT);
        }
        assert_eq!(REFUSAL_NAMES.len(), kinds.len());
    }
}
