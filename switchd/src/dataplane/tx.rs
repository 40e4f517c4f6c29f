//! Replies out, as [`proto::switch::entry::Switch`] decides them: [`Out`]
//! is this thread's [`Transmit`], which says which thread owns the socket
//! a member is reached through and writes the L2–L4 headers in front of
//! what proto encodes. A reply goes to this thread's transmit ring of the
//! member's port and queue, or, when another thread owns that socket, to
//! its outbox (and a wake-up if it sleeps). With seq lanes (`[switch]
//! seq_lanes` > 1) a RESULT leaves from this thread's own socket on the
//! member's port when it has one (threads ≤ queues: each serves a queue of
//! every port), so the thread that completes a lane's chunk sends its
//! RESULTs with no hand-off per chunk; the frames leave on its queue
//! instead of the one the member joined on, which the worker cannot tell.
//!
//! Owns: [`Out`] (where one thread's replies go) and [`drain_outbox`] (the
//! replies other threads handed to this one, given back to the switch).
//!
//! Invariants: a reply is encoded straight into a UMEM frame, after the
//! Ethernet/IPv4/UDP headers, from UDP port `to.local_port` (proto's
//! choice: `agg_port`, or a lane's port for a RESULT to a member granted
//! lane replies); an untagged RESULT as a head and the
//! shadow's payload (one copy, also when a jumbo RESULT spans several
//! frames), with the payload's checksum sum made once per result; a full
//! ring, missing socket, full outbox or a RESULT that could not be made is
//! counted in `tx_ring_full` (the worker's resend recovers it). Which
//! replies exist, their encoding, and a fan-out's single read lock of the
//! shadow are proto's ([`proto::switch::entry`]); a leaf's datagrams to a
//! spine leave through the uplink socket.

use proto::checksum::Sum;
use proto::switch::engine::ResultRef;
use proto::switch::entry::{Handoff, Transmit};
use proto::switch::{Encoded, Endpoint, JobTable, Reply, ReplyMsg};
use proto::tag::Tag;
use proto::wire::{HeaderRepr, HEADER_LEN, L2_L4_LEN};

use super::{DataplaneCounters, DataplaneThread, Shared, TxSockets};
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
    shared: &'a Shared,
    txs: &'a mut TxSockets,
    pub counters: &'a mut DataplaneCounters,
}

impl<'a> Out<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        txs: &'a mut TxSockets,
        counters: &'a mut DataplaneCounters,
    ) -> Out<'a> {
        Out {
            shared,
            txs,
            counters,
        }
    }

    pub fn agg_port(&self) -> u16 {
        self.shared.agg_port
    }

    /// Whether `port` is one of the aggregation service's: agg_port or a
    /// seq lane's port after it.
    pub fn is_agg_port(&self, port: u16) -> bool {
        port.wrapping_sub(self.shared.agg_port) < self.shared.seq_lanes
    }

    /// The switch's own addresses (the ingress check).
    pub fn own(&self) -> &super::OwnAddresses {
        &self.shared.own
    }

    /// With seq lanes, points RESULT `r` at this thread's own socket on
    /// its member's port, if it has one (module docs); otherwise leaves it
    /// at the queue the member joined on.
    fn steer_to_own_socket(&self, r: &mut Reply) {
        if self.shared.seq_lanes <= 1 || !matches!(r.msg, ReplyMsg::Result { .. }) {
            return;
        }
        let own = self
            .txs
            .get(r.to.port_idx as usize)
            .and_then(|queues| queues.iter().position(Option::is_some));
        if let Some(q) = own {
            r.to.queue = q as u32;
        }
    }

    /// A leaf's datagram to a spine, through the uplink socket (one
    /// sendto: a partial per chunk, not per worker packet).
    fn send_up(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        let Some(sock) = self.shared.uplink.as_ref() else {
            self.counters.uplink_send_failed += 1;
            return;
        };
        let mut buf = [0u8; 9216];
        let Some(e) = encode(&mut buf) else {
            self.counters.uplink_send_failed += 1;
            return;
        };
        let to = std::net::SocketAddrV4::new(r.to.source.ip.into(), r.to.source.port);
        match sock.send_to(&buf[..e.len], to) {
            Ok(_) => self.counters.uplink_sent += 1,
            Err(_) => self.counters.uplink_send_failed += 1,
        }
    }
}

impl Transmit for Out<'_> {
    /// The thread that owns `r`'s socket (seq lanes: this thread's own on
    /// the member's port, for a RESULT).
    fn route(&mut self, r: &mut Reply) -> Option<usize> {
        self.steer_to_own_socket(r);
        self.shared
            .owner
            .get(r.to.port_idx as usize)
            .and_then(|q| q.get(r.to.queue as usize))
            .copied()
            .filter(|t| *t != usize::MAX)
    }

    /// With seq lanes a member's route depends on the thread asking (its
    /// own socket): a whole-seq hand-off would send again what this thread
    /// sent, so each member is handed off alone.
    fn hands_off_seqs(&self) -> bool {
        self.shared.seq_lanes <= 1
    }

    /// Queues RESULT `r` (header `hdr`, the payload from `res`, then
    /// `token`) on our transmit ring of its port and queue.
    fn send_result(&mut self, r: &Reply, hdr: &HeaderRepr, res: &ResultRef<'_>, token: &Tag) {
        let sent = socket_mut(self.txs, r.to.port_idx, r.to.queue).is_some_and(|tx| {
            tx.send_head_tail(|buf| result_frame_head(hdr, res, token, &r.to, buf))
        });
        if sent {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_ring_full += 1;
        }
    }

    /// Encodes `r` into a frame of our transmit ring of its port and
    /// queue (a tagged RESULT, header, payload and tag, whole into one
    /// frame: its chunk size is bounded so), or up to a spine.
    fn send_reply(&mut self, r: &Reply, encode: impl FnOnce(&mut [u8]) -> Option<Encoded>) {
        if r.is_upstream() {
            self.send_up(r, encode);
            return;
        }
        let sent = socket_mut(self.txs, r.to.port_idx, r.to.queue)
            .is_some_and(|tx| tx.send_with(|buf| encoded_frame(r, buf, encode)));
        if sent {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_ring_full += 1;
        }
    }

    fn hand_off(&mut self, thread: usize, h: Handoff) {
        if self.shared.outboxes[thread].push(h).is_err() {
            self.counters.tx_ring_full += 1;
            return;
        }
        self.counters.forwarded += 1;
        if self.shared.wakers[thread].wake() {
            self.counters.thread_wakeups += 1;
        }
    }

    fn unsent(&mut self, _: &Reply) {
        self.counters.tx_ring_full += 1;
    }
}

/// Writes a RESULT's Ethernet, IPv4, UDP and aggregation headers (`hdr`)
/// for `to` into `buf` and returns their length and what follows them: the
/// payload (the shadow `res`, read-locked), then `token`. The UDP checksum
/// adds the payload's sum, made once per result by the engine, to the sum
/// of this destination's headers and the token: no pass over the payload
/// per destination.
pub fn result_frame_head<'r>(
    hdr: &HeaderRepr,
    res: &'r ResultRef<'_>,
    token: &'r Tag,
    to: &Endpoint,
    buf: &mut [u8],
) -> Option<(usize, [&'r [u8]; 2])> {
    let sh = res.shadow();
    let payload = res.bytes();
    hdr.emit_to(buf.get_mut(L2_L4_LEN..)?).ok()?;
    let token_at = HEADER_LEN + payload.len();
    let token_sum = Sum::ZERO.add_bytes(token).fold();
    let sum = Sum::ZERO
        .add_bytes(buf.get(L2_L4_LEN..L2_L4_LEN + HEADER_LEN)?)
        .add_folded_at(res.payload_sum(), HEADER_LEN)
        .add_folded_at(token_sum, token_at);
    write_l2_l4_headers(buf, to, sh.ece, token_at + token.len(), sum)?;
    Some((L2_L4_LEN + HEADER_LEN, [payload, &token[..]]))
}

/// Writes any other reply whole into `buf` (its UDP checksum summed over
/// it: these are small); returns the frame length, 0 if it cannot be sent.
pub fn reply_frame(table: &JobTable, r: &Reply, buf: &mut [u8]) -> usize {
    encoded_frame(r, buf, |b| table.encode(r, b))
}

/// [`reply_frame`] with `encode` writing the aggregation header and
/// payload (the table's encoder, under its lock).
fn encoded_frame(
    r: &Reply,
    buf: &mut [u8],
    encode: impl FnOnce(&mut [u8]) -> Option<Encoded>,
) -> usize {
    let Some(e) = buf.get_mut(L2_L4_LEN..).and_then(encode) else {
        return 0;
    };
    write_udp_headers(buf, &r.to, e.ce, e.len).unwrap_or(0)
}

/// Gives the replies other threads handed to this one back to the switch,
/// which sends them through this thread's [`Out`] (the table's lock only
/// for what is not an untagged RESULT).
pub(super) fn drain_outbox(t: &mut DataplaneThread, now: std::time::Instant) {
    let shared = t.shared.clone();
    let outbox = &shared.outboxes[t.idx];
    if outbox.is_empty() {
        return;
    }
    let mut batch = shared.switch.batch(t.idx, now);
    let mut out = Out::new(&shared, &mut t.txs, &mut t.counters);
    while let Some(h) = outbox.pop() {
        batch.on_handoff(h, &mut out);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proto::handshake::{Handshake, JoinParams};
    use proto::switch::{Endpoint, Ipv4Prefix, JobConfig, Source, TableConfig};
    use proto::tag::{AuthMode, PacketKey, TAG_LEN};
    use proto::wire::{
        write_f32s, Dtype, Header, HeaderRepr, MsgType, DTYPE_BF16, HEADER_LEN, OP_SUM,
    };

    use super::*;
    use crate::frame::{parse_udp_frame, FrameError};

    const JOB: u16 = 5;
    const SECRET: [u8; 32] = [7; 32];
    const GEN: u32 = 0x1234_5678;

    fn endpoint(rank: u16) -> Endpoint {
        Endpoint {
            source: Source {
                mac: [2, 0, 0, 0, 0, 10 + rank as u8],
                ip: [198, 18, 0, 10 + rank as u8],
                port: 40001 + 2 * rank,
            },
            local_mac: [2, 0, 0, 0, 0, 1],
            local_ip: [198, 18, 0, 1],
            local_port: 48879,
            port_idx: 0,
            queue: 0,
            result_lanes: 0,
        }
    }

    /// Frames the table's replies as the dataplane does (an untagged RESULT
    /// from its head and payload, anything else, a tagged RESULT included,
    /// whole), checks that each parses with its UDP checksum verified, and
    /// returns them with their aggregation headers.
    fn drain(t: &mut JobTable) -> Vec<(HeaderRepr, Vec<u8>)> {
        drain_from(t)
            .into_iter()
            .map(|(_, h, payload)| (h, payload))
            .collect()
    }

    /// [`drain`], with each frame's UDP source port.
    fn drain_from(t: &mut JobTable) -> Vec<(u16, HeaderRepr, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(r) = t.poll_reply() {
            let mut buf = [0u8; 4096];
            let frame = if matches!(r.msg, ReplyMsg::Result { .. }) && !t.is_tagged(r.job) {
                let ReplyMsg::Result { seq, retx } = r.msg else {
                    unreachable!()
                };
                let core = t.data_path().job(r.job).expect("the job");
                let window = core.advertised_window();
                let (hdr, res) = core
                    .result_for(seq, r.rank, retx, t.gen(), window)
                    .expect("the shadow");
                let tokens = core
                    .result_tokens(&res, seq, t.gen(), window)
                    .expect("an active port job's tokens");
                let token = tokens.for_header(&hdr);
                let (head, [payload, token]) =
                    result_frame_head(&hdr, &res, token, &r.to, &mut buf).expect("RESULT head");
                let mut f = buf[..head].to_vec();
                f.extend_from_slice(payload);
                f.extend_from_slice(token);
                f
            } else {
                let n = reply_frame(t, &r, &mut buf);
                assert!(n > 0, "{r:?} was framed");
                buf[..n].to_vec()
            };
            assert_ne!(u16::from_be_bytes([frame[40], frame[41]]), 0, "{r:?}");
            let f = parse_udp_frame(&frame).unwrap_or_else(|e| panic!("{r:?}: {e}"));
            assert_eq!(f.dst_ip, r.to.source.ip);
            // A single bit flipped anywhere in the datagram is caught.
            let mut bad = frame.clone();
            *bad.last_mut().unwrap() ^= 0x40;
            assert_eq!(parse_udp_frame(&bad).unwrap_err(), FrameError::UdpChecksum);
            assert_eq!(f.src_port, r.to.local_port);
            let h = HeaderRepr::parse(&Header::new_checked(f.payload).unwrap()).unwrap();
            out.push((f.src_port, h, f.payload.to_vec()));
        }
        out
    }

    /// Whether a RESULT's last 16 bytes are its tag (mac) or token (port).
    fn authentic(auth: AuthMode, k: &PacketKey, h: &HeaderRepr, vals: &[u8], tag: &[u8]) -> bool {
        match auth {
            AuthMode::Mac => k.verify(h, vals, tag),
            AuthMode::Port => k.verify_token(h, tag) && !k.verify_token(h, &[0; TAG_LEN]),
        }
    }

    fn table(dtype: Dtype, n: u16, auth: AuthMode) -> JobTable {
        table_with_stats(dtype, n, auth, false)
    }

    fn table_with_stats(dtype: Dtype, n: u16, auth: AuthMode, stats: bool) -> JobTable {
        table_of(dtype, n, auth, stats, 1)
    }

    fn table_of(dtype: Dtype, n: u16, auth: AuthMode, stats: bool, seq_lanes: u16) -> JobTable {
        let cfg = TableConfig {
            seq_lanes,
            ..TableConfig::new(GEN, [9; 32])
        };
        let mut t = JobTable::new(cfg, Instant::now());
        t.add(
            JobConfig {
                id: JOB,
                n_workers: n,
                allowed_sources: vec![Ipv4Prefix {
                    addr: [198, 18, 0, 0],
                    len: 24,
                }],
                secret: SECRET,
                pool_slots: 4,
                elems_per_chunk: 64,
                dtype,
                window: 4,
                priority: Default::default(),
                upstream: None,
                stats,
                auth,
            },
            1000,
        )
        .unwrap();
        t
    }

    /// Joins ranks 0..n of the test job through the handshake (rank by
    /// rank: HELLO, CHALLENGE, JOIN; the last JOIN activates the job).
    /// Returns each rank's JOIN_ACK, indexed by rank, and the type of every
    /// reply the switch sent on the way (each frame's checksum verified by
    /// `drain`).
    fn join_all(
        t: &mut JobTable,
        n: u16,
        wire_dtype: u8,
    ) -> (Vec<proto::handshake::JoinAck>, Vec<MsgType>) {
        join_all_asking(t, n, wire_dtype, &[])
    }

    /// [`join_all`], rank r asking lane replies when `asks[r]` (none past
    /// its end).
    fn join_all_asking(
        t: &mut JobTable,
        n: u16,
        wire_dtype: u8,
        asks: &[bool],
    ) -> (Vec<proto::handshake::JoinAck>, Vec<MsgType>) {
        let now = Instant::now();
        let mut hss = Vec::new();
        let mut kinds = Vec::new();
        let mut acks: Vec<Option<proto::handshake::JoinAck>> = (0..n).map(|_| None).collect();
        for rank in 0..n {
            let ep = endpoint(rank);
            let mut hs = Handshake::new(
                JoinParams {
                    job: JOB,
                    rank,
                    n_workers: n,
                    dtype: wire_dtype,
                    op: OP_SUM,
                    secret: SECRET,
                    ip: ep.source.ip,
                    port: ep.source.port,
                    provision: None,
                },
                [rank as u8 + 1; 16],
            );
            hs.set_lane_replies(asks.get(usize::from(rank)).copied().unwrap_or(false));
            let mut b = [0u8; 256];
            let len = hs.emit_hello(&mut b).unwrap();
            t.handle(&b[..len], ep, false, now);
            let replies = drain(t);
            let (h, p) = &replies[0];
            hs.on_challenge(h, &p[HEADER_LEN..]).unwrap();
            kinds.extend(replies.iter().map(|(h, _)| h.msg_type));
            let len = hs.emit_join(0, 0, &mut b).unwrap();
            t.handle(&b[..len], ep, false, now);
            hss.push(hs);
            for (h, p) in drain(t) {
                kinds.push(h.msg_type);
                if h.msg_type == MsgType::JoinAck {
                    let ack = hss[h.rank as usize]
                        .on_join_ack(&h, &p[HEADER_LEN..])
                        .expect("JOIN_ACK");
                    acks[h.rank as usize] = Some(ack);
                }
            }
        }
        let acks = acks
            .into_iter()
            .enumerate()
            .map(|(r, a)| a.unwrap_or_else(|| panic!("rank {r} got no JOIN_ACK")))
            .collect();
        (acks, kinds)
    }

    /// Reduce-scatter and all-gather RESULTs leave per rank as the
    /// dataplane frames them: the values to the ranks that get them, a
    /// NOVAL RESULT (the header, and a tag in an `auth = "mac"` job) to
    /// the others, each with a UDP checksum that verifies, first sends and
    /// resends alike.
    #[test]
    fn reduce_scatter_and_all_gather_results_are_framed_per_rank() {
        use proto::wire::{flags, Kind};
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let n = 3;
            let mut t = table(Dtype::F32, n, auth);
            let (acks, _) = join_all(&mut t, n, proto::wire::DTYPE_F32);
            let now = Instant::now();
            let vals: Vec<u8> = [1.5f32, f32::from_bits(0x7f80_0001), -2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            for (seq, kind) in [(0u32, Kind::ReduceScatter), (1, Kind::AllGather)] {
                let owner = 1;
                let mut resent = false;
                for rank in (0..n).chain([2]) {
                    let mut h = HeaderRepr::new(MsgType::Data, JOB);
                    h.rank = rank;
                    h.seq = seq;
                    h.count = 3;
                    h.gen = GEN;
                    h.window = owner;
                    h.flags = kind.flag_bits();
                    let mut p = vec![0u8; HEADER_LEN];
                    if kind.sends_values(rank, owner) {
                        p.extend_from_slice(&vals);
                    } else {
                        h.flags |= flags::NOVAL;
                    }
                    h.emit_to(&mut p).unwrap();
                    if let Some(k) = &acks[rank as usize].data_key {
                        let tag = k.tag(&h, &p[HEADER_LEN..]);
                        p.extend_from_slice(&tag);
                    }
                    t.handle(&p, endpoint(rank), false, now);
                    let out = drain(&mut t);
                    // The last rank completes the seq; its copy is a resend.
                    let want = if resent {
                        1
                    } else if rank + 1 == n {
                        n as usize
                    } else {
                        0
                    };
                    assert_eq!(out.len(), want, "{kind} {auth} rank {rank}");
                    resent |= rank + 1 == n;
                    for (h, p) in out {
                        let r = h.rank;
                        let gets = kind.receives_values(r, owner);
                        assert_eq!((h.kind(), h.no_values()), (kind, !gets));
                        assert_eq!(h.has_flag(flags::RETX), want == 1);
                        let body = &p[HEADER_LEN..];
                        let len = if gets { vals.len() } else { 0 };
                        assert_eq!(body.len(), len + TAG_LEN, "{kind} {auth} to {r}");
                        let (v, tag) = body.split_at(len);
                        let k = acks[r as usize].result_key.as_ref().unwrap();
                        assert!(authentic(auth, k, &h, v, tag), "{kind}: the tag verifies");
                        if kind == Kind::AllGather && gets {
                            assert_eq!(v, &vals[..], "the owner's bytes, the sNaN too");
                        }
                    }
                }
            }
        }
    }

    /// A stats job's RESULTs leave with the statistics trailer after the
    /// values (a NOVAL RESULT: the trailer alone), written into the frame
    /// from the shadow with the rest of the payload and covered by the UDP
    /// checksum; first sends and resends carry the same trailer, equal to
    /// the reference's.
    #[test]
    fn a_stats_job_s_result_frames_carry_the_trailer() {
        use proto::stats::{chunk_stats, GradStats, STATS_LEN};
        use proto::wire::{flags, Kind};
        for (dtype, wire_dtype) in [
            (Dtype::F32, proto::wire::DTYPE_F32),
            (Dtype::Bf16, DTYPE_BF16),
        ] {
            let n = 3;
            let mut t = table_with_stats(dtype, n, AuthMode::Port, true);
            let (acks, _) = join_all(&mut t, n, wire_dtype);
            assert!(acks.iter().all(|a| a.payload.stats == 1));
            let now = Instant::now();
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| vec![1.5 + f32::from(r), -0.25 * f32::from(r), 1e3])
                .collect();
            let refs: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
            let want = chunk_stats(&refs, &proto::reference::rank_order_sum(&refs));
            for (seq, kind) in [(0u32, Kind::AllReduce), (1, Kind::ReduceScatter)] {
                let owner = 2;
                let mut trailers = Vec::new();
                for rank in (0..n).chain([0]) {
                    let mut h = HeaderRepr::new(MsgType::Data, JOB);
                    (h.rank, h.seq, h.count, h.gen) = (rank, seq, 3, GEN);
                    h.window = owner;
                    h.flags = kind.flag_bits();
                    let mut p = vec![0u8; HEADER_LEN + dtype.payload_len(3)];
                    proto::elements::round_to_le(
                        dtype,
                        &inputs[rank as usize],
                        &mut p[HEADER_LEN..],
                    );
                    h.emit_to(&mut p).unwrap();
                    t.handle(&p, endpoint(rank), false, now);
                    for (h, p) in drain(&mut t) {
                        let gets = kind.receives_values(h.rank, owner);
                        assert_eq!(h.no_values(), !gets);
                        let body = &p[HEADER_LEN..];
                        let len = if gets { dtype.payload_len(3) } else { 0 };
                        assert_eq!(
                            body.len(),
                            len + STATS_LEN + TAG_LEN,
                            "{kind} {dtype:?} to {}",
                            h.rank
                        );
                        let s = GradStats::parse(&body[len..len + STATS_LEN]).unwrap();
                        assert!(s.bits_eq(&want), "{kind} {dtype:?}: {s:?} {want:?}");
                        trailers
                            .push((h.has_flag(flags::RETX), body[len..len + STATS_LEN].to_vec()));
                    }
                }
                assert_eq!(
                    trailers.len(),
                    n as usize + 1,
                    "{kind}: n RESULTs and a resend"
                );
                assert!(trailers.last().unwrap().0, "the last one is a resend");
                assert!(trailers.windows(2).all(|w| w[0].1 == w[1].1));
            }
        }
    }

    /// Lane replies (docs/PROTOCOL.md, "Seq lanes"): the frames of a
    /// RESULT to a member granted them (rank 0) leave from UDP port
    /// agg_port + (seq mod 4), with a checksum that verifies, first sends
    /// and resends, untagged (head and payload) and tagged (whole); its
    /// JOIN_ACK, HEARTBEAT answer and NACK, and everything to rank 1 (which
    /// did not ask), from agg_port.
    #[test]
    fn a_granted_members_result_frames_leave_from_its_seq_lane_port() {
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let now = Instant::now();
            let mut t = table_of(Dtype::F32, 2, auth, false, 4);
            let (acks, _) = join_all_asking(&mut t, 2, proto::wire::DTYPE_F32, &[true, false]);
            let keys: Vec<Option<PacketKey>> = acks.into_iter().map(|a| a.data_key).collect();
            let mut results = 0;
            for seq in 0..6u32 {
                for rank in 0..2u16 {
                    let mut h = HeaderRepr::new(MsgType::Data, JOB);
                    (h.rank, h.seq, h.count, h.gen) = (rank, seq, 2, GEN);
                    let mut p = vec![0u8; HEADER_LEN + 8];
                    h.emit_to(&mut p).unwrap();
                    write_f32s(&[1.5, -2.0], &mut p[HEADER_LEN..]);
                    if let Some(k) = &keys[usize::from(rank)] {
                        let tag = k.tag(&h, &p[HEADER_LEN..]);
                        p.extend_from_slice(&tag);
                    }
                    t.handle(&p, endpoint(rank), false, now);
                    if rank == 1 {
                        // Sent again after completion: the RESULT resent.
                        t.handle(&p, endpoint(rank), false, now);
                    }
                }
                for (port, h, _) in drain_from(&mut t) {
                    assert_eq!(h.msg_type, MsgType::Result);
                    let want = if h.rank == 0 {
                        48879 + (seq % 4) as u16
                    } else {
                        48879
                    };
                    assert_eq!(port, want, "{auth}: {h:?}");
                    results += 1;
                }
            }
            // Per seq: two first sends and rank 1's resend.
            assert_eq!(results, 6 * 3, "{auth}");
            let mut h = HeaderRepr::new(MsgType::Heartbeat, JOB);
            (h.gen, h.seq) = (GEN, 9);
            let mut p = [0u8; HEADER_LEN];
            h.emit_to(&mut p).unwrap();
            t.handle(&p, endpoint(0), false, now);
            h.gen = GEN ^ 1;
            h.emit_to(&mut p).unwrap();
            t.handle(&p, endpoint(0), false, now);
            let others = drain_from(&mut t);
            let kinds: Vec<MsgType> = others.iter().map(|(_, h, _)| h.msg_type).collect();
            assert_eq!(kinds, [MsgType::Heartbeat, MsgType::Nack], "{auth}");
            assert!(others.iter().all(|(port, _, _)| *port == 48879), "{auth}");
        }
    }

    /// Every kind of reply the switch sends to a worker leaves with a
    /// correct, non-zero UDP checksum: CHALLENGE, JOIN_ACK, RESULT (float32
    /// and bf16, odd element counts, first sends and resends, untagged and
    /// tagged by an `auth = "mac"` job), the HEARTBEAT answer, and NACK.
    #[test]
    fn every_reply_frame_carries_a_udp_checksum_that_verifies() {
        for (dtype, wire_dtype, auth) in [
            (Dtype::F32, proto::wire::DTYPE_F32, AuthMode::Port),
            (Dtype::Bf16, DTYPE_BF16, AuthMode::Port),
            (Dtype::F32, proto::wire::DTYPE_F32, AuthMode::Mac),
            (Dtype::Bf16, DTYPE_BF16, AuthMode::Mac),
        ] {
            let now = Instant::now();
            let mut t = table(dtype, 2, auth);
            let (acks, mut kinds) = join_all(&mut t, 2, wire_dtype);
            let mut result_key: Option<PacketKey> = None;
            // Per rank, the DATA key its JOIN_ACK gave (auth = "mac").
            let data_keys: Vec<Option<PacketKey>> = (acks.into_iter())
                .map(|ack| {
                    assert_eq!(ack.auth, auth);
                    result_key = ack.result_key.or(result_key.take());
                    ack.data_key
                })
                .collect();
            if auth == AuthMode::Mac {
                assert!(data_keys.iter().all(Option::is_some) && result_key.is_some());
            }
            for (seq, count) in [1u16, 3, 64].into_iter().enumerate() {
                for rank in 0..2u16 {
                    let mut h = HeaderRepr::new(MsgType::Data, JOB);
                    h.rank = rank;
                    h.seq = seq as u32;
                    h.count = count;
                    h.gen = GEN;
                    let vals: Vec<f32> =
                        (0..count).map(|i| i as f32 * 0.37 - rank as f32).collect();
                    let len = dtype.payload_len(count);
                    let mut p = vec![0u8; HEADER_LEN + len + auth.data_tag_len()];
                    h.emit_to(&mut p).unwrap();
                    if dtype == Dtype::F32 {
                        write_f32s(&vals, &mut p[HEADER_LEN..]);
                    } else {
                        for (i, v) in vals.iter().enumerate() {
                            // bf16: the upper half of the float32 (truncated).
                            let b = ((v.to_bits() >> 16) as u16).to_le_bytes();
                            p[HEADER_LEN + 2 * i..HEADER_LEN + 2 * i + 2].copy_from_slice(&b);
                        }
                    }
                    if let Some(k) = &data_keys[rank as usize] {
                        let (body, tag) = p[HEADER_LEN..].split_at_mut(len);
                        tag.copy_from_slice(&k.tag(&h, body));
                    }
                    t.handle(&p, endpoint(rank), false, now);
                    // Sent again after completion: the RESULT is resent (RETX).
                    if rank == 1 {
                        t.handle(&p, endpoint(rank), false, now);
                    }
                    kinds.extend(drain(&mut t).into_iter().map(|(h, p)| {
                        if h.msg_type == MsgType::Result {
                            let body = &p[HEADER_LEN..];
                            assert_eq!(body.len(), dtype.payload_len(h.count) + TAG_LEN);
                            let k = result_key.as_ref().unwrap();
                            let (vals, tag) = body.split_at(body.len() - TAG_LEN);
                            assert!(authentic(auth, k, &h, vals, tag), "{auth}: RESULT tag");
                        }
                        h.msg_type
                    }));
                }
            }
            // A member's HEARTBEAT, and one of a stale generation from a
            // stranger inside the prefix (a NACK).
            let mut h = HeaderRepr::new(MsgType::Heartbeat, JOB);
            h.gen = GEN;
            h.seq = 9;
            let mut p = [0u8; HEADER_LEN];
            h.emit_to(&mut p).unwrap();
            t.handle(&p, endpoint(0), false, now);
            h.gen = GEN ^ 1;
            h.emit_to(&mut p).unwrap();
            t.handle(&p, endpoint(7), false, now);
            kinds.extend(drain(&mut t).into_iter().map(|(h, _)| h.msg_type));
            for want in [
                MsgType::Challenge,
                MsgType::JoinAck,
                MsgType::Result,
                MsgType::Heartbeat,
                MsgType::Nack,
            ] {
                assert!(
                    kinds.contains(&want),
                    "{dtype:?} {auth}: no {want:?} in {kinds:?}"
                );
            }
            assert_eq!(
                kinds.iter().filter(|k| **k == MsgType::Result).count(),
                3 * 3,
                "{dtype:?} {auth}: 2 RESULTs and a resend per chunk"
            );
        }
    }
}
