//! A leaf's kernel UDP socket towards its spines (`[switch] uplink`).
//!
//! Owns: opening it (bound to the configured address, large buffers,
//! nonblocking) and receiving from it with the IP header's ECN field.
//! Partials leave with ECT(0), so that a marking queue on a leaf–spine link
//! can say CE; the spines' RESULTs arrive with their ECN field in an
//! `IP_TOS` control message, so a CE on the way down reaches the table as it
//! does for a frame on an AF_XDP port (docs/PROTOCOL.md, "Aggregation
//! trees": ECN is OR-ed along the whole path).
//!
//! Invariant: the socket is used by dataplane thread 0 only, one `recvmsg`
//! per datagram from a spine and one `sendto` per partial (per chunk, not
//! per worker packet).

use std::io;
use std::mem::MaybeUninit;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

use socket2::{Domain, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, SockRef, Socket, Type};

/// Receive and send buffer of the socket: a window of partials answered
/// at once by the spines overflows the default (about 200 KiB).
const BUFFER_BYTES: usize = 8 << 20;
/// ECT(0) in the IP header's ECN field (RFC 3168).
const ECT0: u32 = 0x02;
/// The ECN field's CE codepoint.
const CE: u8 = 0x03;

/// Opens the uplink socket bound to `addr`.
pub fn open(addr: SocketAddrV4) -> io::Result<UdpSocket> {
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = sock.set_recv_buffer_size(BUFFER_BYTES);
    let _ = sock.set_send_buffer_size(BUFFER_BYTES);
    // root may exceed net.core.{r,w}mem_max; ignored when not allowed.
    force_buffer(&sock, libc::SO_RCVBUFFORCE);
    force_buffer(&sock, libc::SO_SNDBUFFORCE);
    sock.set_tos(ECT0)?;
    sock.set_recv_tos(true)?;
    sock.bind(&addr.into())?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// Sets a socket buffer with SO_RCVBUFFORCE/SO_SNDBUFFORCE (socket2 has
/// only the capped setters).
fn force_buffer(sock: &Socket, opt: libc::c_int) {
    let v = BUFFER_BYTES as libc::c_int;
    // SAFETY: setsockopt on a live fd with a c_int value of the right size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// One datagram from the uplink socket, if one is waiting:
/// (length, sender, whether its IP header said CE).
pub fn recv(sock: &UdpSocket, buf: &mut [u8]) -> Option<(usize, SocketAddr, bool)> {
    // A cmsghdr and its one byte of TOS, with room to spare.
    let mut control = [MaybeUninit::<u8>::uninit(); 64];
    let mut from = SockAddr::from(SocketAddrV4::new([0, 0, 0, 0].into(), 0));
    // SAFETY: the kernel writes initialised bytes only; `buf` stays as
    // initialised as it was.
    let data: &mut [MaybeUninit<u8>] = unsafe { &mut *(buf as *mut [u8] as *mut _) };
    let mut bufs = [MaybeUninitSlice::new(data)];
    let mut msg = MsgHdrMut::new()
        .with_addr(&mut from)
        .with_buffers(&mut bufs)
        .with_control(&mut control);
    let n = SockRef::from(sock).recvmsg(&mut msg, 0).ok()?;
    let control_len = msg.control_len();
    // SAFETY: the kernel initialised the first `control_len` bytes.
    let control: &[u8] =
        unsafe { &*(&control[..control_len] as *const [MaybeUninit<u8>] as *const [u8]) };
    Some((
        n,
        from.as_socket()?,
        tos_of(control).is_some_and(|t| t & CE == CE),
    ))
}

/// The TOS byte of an `IP_TOS` control message in `control`, if any.
/// (Walked by hand: libc's CMSG_* macros need a `msghdr`, and the layout is
/// three native-endian fields, `cmsg_len` counting the header.)
fn tos_of(control: &[u8]) -> Option<u8> {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    const ALIGN: usize = std::mem::size_of::<usize>();
    let mut rest = control;
    while rest.len() >= HDR {
        // SAFETY: `rest` holds at least a cmsghdr; read unaligned.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(rest.as_ptr().cast()) };
        let len = h.cmsg_len as usize;
        if len < HDR || len > rest.len() {
            return None;
        }
        if h.cmsg_level == libc::IPPROTO_IP && h.cmsg_type == libc::IP_TOS && len > HDR {
            return Some(rest[HDR]);
        }
        rest = rest.get(len.next_multiple_of(ALIGN)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram sent with CE in its TOS is reported as CE, one with
    /// ECT(0) is not: the control message is found and read.
    #[test]
    fn recv_reports_ce_from_the_ip_header() {
        let rx = open(SocketAddrV4::new([127, 0, 0, 1].into(), 0)).unwrap();
        let to = rx.local_addr().unwrap();
        let tx = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        let mut buf = [0u8; 64];
        for (tos, want_ce) in [(0x03u32, true), (0x02, false)] {
            tx.set_tos(tos).unwrap();
            tx.send_to(b"partial", &to.into()).unwrap();
            let got = (0..1000).find_map(|_| {
                recv(&rx, &mut buf).or_else(|| {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    None
                })
            });
            let (n, from, ce) = got.expect("the datagram arrives on loopback");
            assert_eq!(&buf[..n], b"partial");
            assert_eq!(from.ip(), std::net::Ipv4Addr::LOCALHOST);
            assert_eq!(ce, want_ce, "tos {tos:#x}");
        }
    }

    #[test]
    fn tos_of_ignores_truncated_or_foreign_messages() {
        assert_eq!(tos_of(&[]), None);
        assert_eq!(tos_of(&[1, 2, 3]), None);
        // A header whose length runs past the buffer.
        let mut c = vec![0u8; std::mem::size_of::<libc::cmsghdr>()];
        c[0] = 200;
        assert_eq!(tos_of(&c), None);
    }
}
