//! Echo mode (`[switch] mode = "echo"`), a benchmark baseline: every frame
//! the XDP program steers to a socket goes straight back out of the same
//! port and queue with its Ethernet, IPv4 and UDP source and destination
//! swapped. No job table, no parsing beyond the offsets of the three
//! headers. Its rate is what AF_XDP I/O alone allows on this machine, so
//! that `scripts/bench allreduce` can report the aggregation rate as a fraction
//! of it.
//!
//! Checksums: swapping the two IPv4 addresses and the two UDP ports only
//! permutes 16-bit words of the sums, so the IPv4 header checksum and the
//! UDP checksum stay valid unchanged.
//!
//! The received frame is copied into a transmit frame rather than sent
//! from where it lies: the xsk layer gives each half of a socket its own
//! frames (RX frames are recycled into the fill ring inside
//! `recv_batch`), and on veth, copy mode copies every frame into an skb
//! anyway, so the extra memcpy of one frame is small next to that (a jumbo
//! frame on a multi-buffer socket is gathered and scattered by
//! [`crate::xdp::xsk`] like any other: echo sees one contiguous frame). Batched
//! like the aggregation path: up to [`crate::dataplane::RX_BATCH`] frames per
//! ring operation, one flush (and at most the copy-mode kicks) per round, no
//! allocation.

use crate::xdp::{XskRx, XskTx};

/// Offsets of the fields swapped (Ethernet II, IPv4 without options, UDP).
const ETH_DST: usize = 0;
const ETH_SRC: usize = 6;
const ETHERTYPE: usize = 12;
const IP: usize = 14;
const IP_SRC: usize = IP + 12;
const IP_DST: usize = IP + 16;
const UDP: usize = IP + 20;
/// Shortest frame that can be swapped: Ethernet + IPv4 + UDP headers.
pub const MIN_ECHO_FRAME: usize = UDP + 8;

/// Swaps Ethernet, IPv4 and UDP source and destination in place. Returns
/// false (and leaves the frame alone) unless it is a long enough IPv4
/// frame without IP options carrying UDP; the XDP program steers only such
/// frames, so false means a bug or a frame that must not be echoed.
pub fn swap_addresses(frame: &mut [u8]) -> bool {
    if frame.len() < MIN_ECHO_FRAME
        || frame[ETHERTYPE..ETHERTYPE + 2] != [0x08, 0x00]
        || frame[IP] != 0x45
        || frame[IP + 9] != 17
    {
        return false;
    }
    for i in 0..6 {
        frame.swap(ETH_DST + i, ETH_SRC + i);
    }
    for i in 0..4 {
        frame.swap(IP_SRC + i, IP_DST + i);
    }
    for i in 0..2 {
        frame.swap(UDP + i, UDP + 2 + i);
    }
    true
}

/// What one [`echo_batch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EchoOutcome {
    pub received: u32,
    pub echoed: u32,
    /// No free transmit frame or the transmit ring was full.
    pub tx_full: u32,
    /// Not an IPv4/UDP frame (not echoed).
    pub malformed: u32,
}

/// Takes up to `max` frames from `rx` and queues each, swapped, on `tx`
/// (the same socket's transmit half). The caller flushes `tx`.
pub fn echo_batch(rx: &mut XskRx, tx: &mut XskTx, max: u32) -> EchoOutcome {
    let mut o = EchoOutcome::default();
    o.received = rx.recv_batch(max, |frame| {
        let mut bad = false;
        let ok = tx.send_with(|buf| {
            if frame.len() > buf.len() {
                bad = true;
                return 0;
            }
            let out = &mut buf[..frame.len()];
            out.copy_from_slice(frame);
            if swap_addresses(out) {
                frame.len()
            } else {
                bad = true;
                0
            }
        });
        if ok {
            o.echoed += 1;
        } else if bad {
            o.malformed += 1;
        } else {
            o.tx_full += 1;
        }
    });
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-byte DATA frame 02:..:0a 198.18.0.10:40000 -> 02:..:01
    /// 198.18.0.1:48879, with a correct IPv4 and UDP checksum.
    fn fixture() -> Vec<u8> {
        let mut f = vec![
            // Ethernet: dst, src, type
            0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x00,
            // IPv4: ver/ihl, tos (ECT0), len 50, id, flags/frag, ttl, proto, csum
            0x45, 0x02, 0x00, 0x32, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 198, 18, 0, 10,
            198, 18, 0, 1, // UDP: 40000 -> 48879, len 30, csum
            0x9c, 0x40, 0xbe, 0xef, 0x00, 0x1e, 0x00, 0x00,
        ];
        // Aggregation header (22 B): DATA, job 1, rank 0, count 0, seq 7.
        f.extend_from_slice(&[0x11, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7]);
        f.extend_from_slice(&[0; 10]);
        assert_eq!(f.len(), 64);
        let (ip, udp) = checksums(&f);
        f[24..26].copy_from_slice(&ip.to_be_bytes());
        f[40..42].copy_from_slice(&udp.to_be_bytes());
        f
    }

    /// The IPv4 header and UDP checksums the frame's contents call for,
    /// computed by etherparse.
    fn checksums(f: &[u8]) -> (u16, u16) {
        let (ip, rest) = etherparse::Ipv4Header::from_slice(&f[14..]).unwrap();
        let (udp, payload) = etherparse::UdpHeader::from_slice(rest).unwrap();
        (
            ip.calc_header_checksum(),
            udp.calc_checksum_ipv4(&ip, payload).unwrap(),
        )
    }

    #[test]
    fn swaps_addresses_and_ports_checksums_stay_valid() {
        let orig = fixture();
        let mut f = orig.clone();
        assert!(swap_addresses(&mut f));
        assert_eq!(&f[0..6], &orig[6..12]);
        assert_eq!(&f[6..12], &orig[0..6]);
        assert_eq!(&f[26..30], &[198, 18, 0, 1]);
        assert_eq!(&f[30..34], &[198, 18, 0, 10]);
        assert_eq!(u16::from_be_bytes([f[34], f[35]]), 48879);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 40000);
        // Everything else is unchanged, checksums included, and both still
        // verify (the ones' complement sum over the covered bytes is 0xffff).
        assert_eq!(&f[12..26], &orig[12..26]);
        assert_eq!(&f[38..], &orig[38..]);
        let stored = (
            u16::from_be_bytes([f[24], f[25]]),
            u16::from_be_bytes([f[40], f[41]]),
        );
        assert_eq!(checksums(&f), stored);
        // Swapping twice gives the frame back.
        assert!(swap_addresses(&mut f));
        assert_eq!(f, orig);
    }

    #[test]
    fn refuses_what_it_cannot_swap() {
        let orig = fixture();
        for (at, v) in [(12, 0x86), (14, 0x46), (23, 6)] {
            let mut f = orig.clone();
            f[at] = v;
            let before = f.clone();
            assert!(!swap_addresses(&mut f));
            assert_eq!(f, before, "left alone");
        }
        for len in 0..MIN_ECHO_FRAME {
            let mut f = orig[..len].to_vec();
            assert!(!swap_addresses(&mut f));
        }
    }
}
