//! One received frame: the L2–L4 checks the XDP program promised, its
//! checksums, that it does not claim the switch's own address, the job
//! table, and the replies the table queued, out through [`super::tx`].
//!
//! Invariants: the caller holds the table lock for the whole batch; nothing
//! here allocates, logs or makes a syscall (the table's events are logged by
//! the control thread).

use std::time::Instant;

use proto::switch::JobTable;

use super::tx::Out;
use crate::frame::{parse_udp_frame, reply_endpoint, FrameError};

/// Handles one received frame, then sends every reply it caused.
pub fn handle_frame(
    frame: &[u8],
    port_idx: u32,
    queue: u32,
    congested: bool,
    now: Instant,
    table: &mut JobTable,
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
    if f.dst_port != out.agg_port() {
        out.counters.wrong_port += 1;
        return;
    }
    if congested {
        out.counters.ring_congested_frames += 1;
    }
    let from = reply_endpoint(&f, port_idx, queue);
    table.handle(f.payload, from, f.ce || congested, now);
    out.send_queued(table);
}
