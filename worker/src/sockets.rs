//! The worker's UDP sockets: socket 0 (`open_socket`, the one a join
//! opens) and the lane sockets (threads.rs), their shared options, and the
//! wait for one to become readable.
//!
//! Owns: the sockets' setup and buffer sizing. Invariant: every data
//! socket is nonblocking and marks ECT(0) (the switch ORs CE marks into
//! its RESULTs, docs/PROTOCOL.md).

use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::config::WorkerConfig;

pub(crate) fn open_socket(cfg: &WorkerConfig) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // ECT(0): the switch ORs CE marks into its RESULTs (docs/PROTOCOL.md).
    s.set_tos(0x02)?;
    // Bursts of a whole window of RESULTs arrive at once: 256 RESULTs need
    // more than the default net.core.rmem_max (208 KiB) allows.
    size_buffers(&s, 8 << 20);
    let bind = cfg
        .bind
        .unwrap_or(SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0));
    if cfg.threads != 1 {
        // Lane sockets join this port's group (docs/design/
        // worker-threads.md); the kernel lets only this user's sockets in.
        s.set_reuse_port(true)?;
    }
    s.bind(&bind.into())?;
    s.connect(&cfg.switch.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Sets both socket buffers to `bytes`: with SO_RCVBUFFORCE/SO_SNDBUFFORCE
/// when allowed (root or CAP_NET_ADMIN), which ignore net.core.rmem_max,
/// else the plain options (capped by the sysctls; raise
/// net.core.rmem_max/wmem_max for large windows without privileges).
pub(crate) fn size_buffers(s: &socket2::Socket, bytes: usize) {
    let v = bytes as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // SAFETY: setsockopt with a valid fd and a c_int option value.
        let forced = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                force,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        } == 0;
        if !forced {
            // SAFETY: as above.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    plain,
                    &v as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
}

/// A lane socket: bound to `local`, socket 0's address and port, in its
/// `SO_REUSEPORT` group, and connected to the lane port `peer`, whose
/// datagrams the kernel then gives it alone (a connected socket's exact
/// match wins over the group).
pub(crate) fn open_lane_socket(local: SocketAddrV4, peer: SocketAddrV4) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_tos(0x02)?;
    size_buffers(&s, 8 << 20);
    s.set_reuse_port(true)?;
    s.bind(&local.into())?;
    s.connect(&peer.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Waits up to `timeout` for `fd` to become readable.
pub fn wait_readable(fd: i32, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(0, 1000) as i32;
    // SAFETY: one valid pollfd on the stack, count 1.
    unsafe {
        libc::poll(&mut p, 1, ms);
    }
}
