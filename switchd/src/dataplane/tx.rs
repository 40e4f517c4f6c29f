//! Replies out: to this thread's transmit ring of the member's port and
//! queue, or, when another thread owns that socket, to its outbox (and a
//! wake-up if it sleeps).
//!
//! Owns: [`Out`] (where one thread's replies go) and [`drain_outbox`] (the
//! replies other threads handed to this one).
//!
//! Invariants: a reply is encoded straight into a UMEM frame, after the
//! Ethernet/IPv4/UDP headers; a full ring, missing socket or full outbox is
//! counted in `tx_ring_full` (the worker's resend recovers it).

use proto::switch::{JobTable, Reply, ReplyMsg};
use proto::wire::L2_L4_LEN;

use super::{lock, DataplaneCounters, DataplaneThread, Shared, TxSockets};
use crate::frame::{write_l2_l4_headers, write_udp_headers};
use crate::xdp::XskTx;

pub(super) fn socket(txs: &TxSockets, port: u32, queue: u32) -> Option<&XskTx> {
    txs.get(port as usize)
        .and_then(|q| q.get(queue as usize))
        .and_then(|t| t.as_ref())
}

pub(super) fn socket_mut(txs: &mut TxSockets, port: u32, queue: u32) -> Option<&mut XskTx> {
    txs.get_mut(port as usize)
        .and_then(|q| q.get_mut(queue as usize))
        .and_then(|t| t.as_mut())
}

/// Where one thread's replies go.
pub struct Out<'a> {
    idx: usize,
    shared: &'a Shared,
    txs: &'a mut TxSockets,
    pub counters: &'a mut DataplaneCounters,
}

impl<'a> Out<'a> {
    pub(super) fn new(
        idx: usize,
        shared: &'a Shared,
        txs: &'a mut TxSockets,
        counters: &'a mut DataplaneCounters,
    ) -> Out<'a> {
        Out {
            idx,
            shared,
            txs,
            counters,
        }
    }

    pub fn agg_port(&self) -> u16 {
        self.shared.agg_port
    }

    /// Sends every reply the table has queued.
    pub fn send_queued(&mut self, table: &mut JobTable) {
        while let Some(r) = table.poll_reply() {
            self.send(table, &r);
        }
    }

    /// Sends `r`: up to a spine, here, or via the owning thread's outbox.
    pub fn send(&mut self, table: &JobTable, r: &Reply) {
        if r.is_upstream() {
            self.send_up(table, r);
            return;
        }
        let owner = self
            .shared
            .owner
            .get(r.to.port_idx as usize)
            .and_then(|q| q.get(r.to.queue as usize))
            .copied()
            .filter(|t| *t != usize::MAX);
        match owner {
            Some(t) if t != self.idx => self.hand_off(t, *r),
            _ => self.transmit(table, r),
        }
    }

    /// A leaf's datagram to a spine, through the uplink socket (one
    /// sendto: a partial per chunk, not per worker packet).
    fn send_up(&mut self, table: &JobTable, r: &Reply) {
        let Some(sock) = self.shared.uplink.as_ref() else {
            self.counters.uplink_send_failed += 1;
            return;
        };
        let mut buf = [0u8; 9216];
        let Some(e) = table.encode(r, &mut buf) else {
            self.counters.uplink_send_failed += 1;
            return;
        };
        let to = std::net::SocketAddrV4::new(r.to.source.ip.into(), r.to.source.port);
        match sock.send_to(&buf[..e.len], to) {
            Ok(_) => self.counters.uplink_sent += 1,
            Err(_) => self.counters.uplink_send_failed += 1,
        }
    }

    fn hand_off(&mut self, thread: usize, r: Reply) {
        if self.shared.outboxes[thread].push(r).is_err() {
            self.counters.tx_ring_full += 1;
            return;
        }
        self.counters.forwarded += 1;
        if self.shared.wakers[thread].wake() {
            self.counters.thread_wakeups += 1;
        }
    }

    /// Encodes `r` into a frame of our transmit ring of its port and queue.
    fn transmit(&mut self, table: &JobTable, r: &Reply) {
        let to = r.to;
        let Some(tx) = socket_mut(self.txs, to.port_idx, to.queue) else {
            self.counters.tx_ring_full += 1;
            return;
        };
        // A tagged RESULT (auth = "mac") is header, payload and tag: it is
        // encoded whole into one frame (its chunk size is bounded so).
        let sent = if matches!(r.msg, ReplyMsg::Result { .. }) && !table.is_tagged(r.job) {
            // The payload goes from the job's shadow straight into the TX
            // frames, the headers in front of it: one copy, also when a
            // jumbo RESULT spans several frames.
            tx.send_head_tail(|buf| {
                let head = buf.get_mut(L2_L4_LEN..)?;
                let (e, payload) = table.encode_result_head(r, head)?;
                write_l2_l4_headers(buf, &to, e.ce, e.len)?;
                Some((L2_L4_LEN + e.len - payload.len(), payload))
            })
        } else {
            tx.send_with(|buf| {
                let Some(e) = buf.get_mut(L2_L4_LEN..).and_then(|b| table.encode(r, b)) else {
                    return 0;
                };
                write_udp_headers(buf, &to, e.ce, e.len).unwrap_or(0)
            })
        };
        if sent {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_ring_full += 1;
        }
    }
}

/// Writes the replies other threads handed to this one.
pub(super) fn drain_outbox(t: &mut DataplaneThread) {
    let shared = t.shared.clone();
    let outbox = &shared.outboxes[t.idx];
    if outbox.is_empty() {
        return;
    }
    let table = lock(&shared.table);
    let mut out = Out::new(t.idx, &shared, &mut t.txs, &mut t.counters);
    while let Some(r) = outbox.pop() {
        out.transmit(&table, &r);
    }
}
