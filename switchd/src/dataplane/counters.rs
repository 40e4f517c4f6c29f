//! The dataplane's counters, as its threads publish them and everything
//! else reads them: [`DataplaneCounters`] (one thread's, the schema behind
//! the `aggswitch_*` dataplane series, the stats file and switchctl),
//! [`RingStats`] (one socket's ring gauges), [`ThreadCounters`] (one
//! thread's, with the sockets it serves) and [`DataplaneSnapshot`] (all of
//! them, read in one pass over the threads).
//!
//! Plain data, defined once here: the dataplane ([`super`]) fills them,
//! [`crate::stats`], [`crate::metrics`] and switchctl read them. A counter
//! added to the schema appears in all of those by its name, with no code
//! elsewhere.

use serde::Serialize;

proto::counter_schema! {
    /// Counters of one dataplane thread (not of any one job).
    pub struct DataplaneCounters {
        /// Frames taken from the AF_XDP receive rings.
        rx_frames,
        /// Frames written to the AF_XDP transmit rings.
        tx_frames,
        /// Replies dropped because a transmit ring, its frames or an outbox were exhausted (the worker's resend recovers them).
        tx_ring_full,
        /// Steered frames that are not Ethernet/IPv4/UDP as the program promised.
        bad_frame,
        /// Steered frames to another UDP port than the aggregation port.
        wrong_port,
        /// Frames taken while an AF_XDP ring was over the ECN threshold (their slots' RESULTs carry ECE).
        ring_congested_frames,
        /// Hand-offs to the thread that owns a member's socket: one per reply, or one per completed seq and thread for its members' RESULTs.
        forwarded,
        /// Hand-offs that found the owning thread asleep and woke it.
        thread_wakeups,
        /// Echo mode: frames sent back.
        echoed,
        /// A leaf's datagrams to its spines (HELLO, JOIN, partial sums).
        uplink_sent,
        /// Of those, not sent: the uplink socket's buffer was full or the
        /// route failed (the timers resend them).
        uplink_send_failed,
        /// Datagrams from the spines (CHALLENGE, JOIN_ACK, RESULT, NACK).
        uplink_received,
        /// Frames received in several AF_XDP buffers and gathered into one (jumbo frames).
        rx_multi_buffer,
        /// Frames dropped because they came in more buffers than the gather buffer holds.
        rx_too_many_buffers,
        /// Frames sent in several AF_XDP buffers (jumbo frames).
        tx_multi_buffer,
        /// Dataplane threads the watchdog found stuck with work pending (switchd then exits for its supervisor to restart it).
        dataplane_stalls,
        /// Steered frames dropped for a wrong IPv4 header checksum (corrupted on the way: never summed).
        bad_ip_checksum,
        /// Steered frames dropped for a wrong UDP checksum (corrupted on the way: never summed; a checksum of 0 means none and is taken).
        bad_udp_checksum,
        /// Steered frames dropped because their source IPv4 or MAC address is one of the switch's own (spoofed: the switch never sends to itself).
        own_source,
    }
}

/// One AF_XDP socket's ring gauges and the kernel's drop counts for it,
/// as its thread last published them.
#[derive(Debug, Clone, Serialize)]
pub struct RingStats {
    pub port_idx: u32,
    pub queue: u32,
    pub rx_occupancy: u32,
    pub tx_occupancy: u32,
    /// The kernel's count of frames it dropped for this socket (receive
    /// ring full, fill ring empty, bad descriptors): traffic that reached
    /// the port but never the switch's counters. Read once a second.
    pub kernel_rx_dropped: u64,
    pub kernel_rx_ring_full: u64,
    pub kernel_fill_ring_empty: u64,
}

/// One dataplane thread's counters as last published.
#[derive(Debug, Clone, Default)]
pub struct ThreadCounters {
    /// Its own counters; `dataplane_stalls` counts the watchdog's finds of
    /// this thread stuck.
    pub counters: DataplaneCounters,
    /// The sockets it serves, as (port index, queue).
    pub sockets: Vec<(u32, u32)>,
    /// Share of the last second it was awake ([`super::busy::BusyShare`]).
    pub busy_share: f64,
}

/// Every dataplane counter, read in one pass over the threads.
#[derive(Debug, Clone, Default)]
pub struct DataplaneSnapshot {
    /// Summed over the threads.
    pub total: DataplaneCounters,
    /// Every socket's ring gauges, by (port, queue).
    pub rings: Vec<RingStats>,
    /// Per thread, in thread order (the sum of these is `total`).
    pub threads: Vec<ThreadCounters>,
}
