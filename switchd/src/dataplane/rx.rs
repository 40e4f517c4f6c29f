//! One received frame: the L2–L4 checks the XDP program promised, its
//! checksums, that it does not claim the switch's own address, then the
//! switch's one entry point ([`proto::switch::entry::Batch::on_datagram`]:
//! the lock-free data path, else the job table under its lock), which
//! sends every reply it decides through [`super::tx::Out`].
//!
//! Invariants: a DATA from a bound member of an active job never takes the
//! table lock; the lock, when a frame of the batch needs it, is taken once
//! and held to the end of the batch ([`proto::switch::entry::Batch`]);
//! nothing here allocates, logs or makes a syscall (the table's events are
//! logged by the control thread).

use proto::switch::entry::Batch;

use super::tx::Out;
use crate::frame::{parse_udp_frame, reply_endpoint, FrameError};

/// Handles one received frame, then sends every reply it caused.
pub fn handle_frame(
    frame: &[u8],
    (port_idx, queue): (u32, u32),
    congested: bool,
    batch: &mut Batch<'_>,
    out: &mut Out<'_>,
) {
    out.counters.rx_frames += 1;
    let f = match parse_udp_frame(frame) {
        Ok(f) => f,
        Err(FrameError::Ipv4Checksum) => {
            out.counters.bad_ip_checksum += 1;
            return;
        }
        Err(FrameError::UdpChecksum) => {
            out.counters.bad_udp_checksum += 1;
            return;
        }
        Err(_) => {
            out.counters.bad_frame += 1;
            return;
        }
    };
    // The switch never sends to itself: such a frame is spoofed (or
    // looped back), and answering it would talk to ourselves.
    if out.own().claims(f.src_ip, f.src_mac) {
        out.counters.own_source += 1;
        return;
    }
    if !out.is_agg_port(f.dst_port) {
        out.counters.wrong_port += 1;
        return;
    }
    if congested {
        out.counters.ring_congested_frames += 1;
    }
    let mut from = reply_endpoint(&f, port_idx, queue);
    // Replies come from the aggregation port, whichever lane's port the
    // message came to: a worker's socket is connected to that one. Only a
    // RESULT to a member granted lane replies leaves from its lane's port
    // (proto sets its `to.local_port`).
    from.local_port = out.agg_port();
    let ce = f.ce || congested;
    batch.on_datagram(f.payload, from, ce, out);
}
