//! rtnetlink, one request at a time ([`Rtnl`]): a link's kind, its peer
//! (`IFLA_LINK`) and the peer's netnsid, the netnsid of a namespace file,
//! and whether a redirect to a link may carry multi-buffer frames.
//!
//! Invariant: a reply is matched to its request by sequence number; a
//! malformed or truncated reply is an error, never read past its end.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
pub(super) const IFLA_LINK: u16 = 5;
pub(super) const IFLA_LINKINFO: u16 = 18;
pub(super) const IFLA_INFO_KIND: u16 = 1;
pub(super) const IFLA_LINK_NETNSID: u16 = 37;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes (type, payload) in `buf`, netlink-aligned; stops at the
/// first malformed one.
pub(super) fn attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
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
pub(super) fn parse_link(payload: &[u8]) -> LinkInfo {
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
pub(super) struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

impl Rtnl {
    pub(super) fn open() -> std::io::Result<Rtnl> {
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

    pub(super) fn link(&mut self, ifindex: u32) -> std::io::Result<LinkInfo> {
        // struct ifinfomsg { u8 family, u8 pad, u16 type, i32 index, u32 flags, u32 change }
        let mut body = [0u8; 16];
        body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let reply = self.request(RTM_GETLINK, &body, RTM_NEWLINK)?;
        Ok(parse_link(&reply))
    }

    /// The id our namespace gives the namespace `fd` refers to (-1: none).
    pub(super) fn nsid_of(&mut self, fd: RawFd) -> std::io::Result<i32> {
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

/// Whether a DEVMAP redirect to `ifindex` carries a frame in several
/// buffers. veth sets NETDEV_XDP_ACT_NDO_XMIT_SG together with
/// NDO_XMIT; other drivers would need their `xdp_features` read (netdev
/// generic netlink), which switchd does not do: not assumed.
pub(super) fn transmits_multi_buffer(rtnl: &mut Rtnl, ifindex: u32) -> bool {
    rtnl.link(ifindex)
        .is_ok_and(|l| l.kind.as_deref() == Some("veth"))
}
