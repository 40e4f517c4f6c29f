//! Chunk sizes from the ports' MTU: the UMEM frame, the largest MTU one
//! AF_XDP buffer takes and the largest switchd serves, whether the sockets
//! need multi-buffer, and the default and largest elements per chunk.
//!
//! Invariant: a chunk no larger than [`max_elems_per_chunk`] fits what the
//! sockets receive (one frame, or several gathered with multi-buffer).

use proto::wire::{elems_per_chunk_for_mtu, FRAME_PAYLOAD_OFFSET};

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
