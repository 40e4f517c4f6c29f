//! Ethernet/IPv4/UDP framing of aggregation messages, on the dataplane's
//! hot path: parse a received frame into addresses and UDP payload, and
//! write the headers of a reply in place. Uses etherparse's slice views and
//! header types (no allocation).
//!
//! Checksums (docs/PROTOCOL.md, "Details a peer needs"): a frame whose IPv4
//! header checksum or UDP checksum is wrong is refused here, so it is never
//! summed; a UDP checksum of 0 ("none", IPv4) is taken. Every frame written
//! carries a UDP checksum; a RESULT's payload is summed once per result by
//! the job table ([`proto::switch::ResultHead::payload_sum`]), so one RESULT
//! frame sums only its 42 + 22 header bytes and the pseudo-header.

use etherparse::{
    EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpEcn, IpNumber, Ipv4Header, Ipv4HeaderSlice,
    UdpHeader, UdpHeaderSlice,
};
use proto::checksum::{self, Sum};
use proto::switch::Endpoint;
use proto::wire::L2_L4_LEN;

/// Why a frame steered to us is not an IPv4/UDP datagram we can read. The
/// XDP program already checked most of this; a failure here is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("truncated Ethernet header")]
    Ethernet,
    #[error("not IPv4")]
    NotIpv4,
    #[error("bad IPv4 header")]
    Ipv4,
    #[error("IPv4 options or fragment")]
    Ipv4Shape,
    #[error("not UDP")]
    NotUdp,
    #[error("bad UDP header or length")]
    Udp,
    #[error("wrong IPv4 header checksum")]
    Ipv4Checksum,
    #[error("wrong UDP checksum")]
    UdpChecksum,
}

/// The fields of a received datagram the switch needs.
#[derive(Debug, Clone, Copy)]
pub struct UdpFrame<'a> {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    /// The IP ECN field said CE.
    pub ce: bool,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: &'a [u8],
}

/// Parses and checks a received frame: Ethernet II, IPv4 without options
/// or fragments, UDP, both checksums right (a UDP checksum of 0 is none).
pub fn parse_udp_frame(frame: &[u8]) -> Result<UdpFrame<'_>, FrameError> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| FrameError::Ethernet)?;
    if eth.ether_type() != EtherType::IPV4 {
        return Err(FrameError::NotIpv4);
    }
    let l3 = &frame[Ethernet2Header::LEN..];
    let ip = Ipv4HeaderSlice::from_slice(l3).map_err(|_| FrameError::Ipv4)?;
    if ip.ihl() != 5 || ip.is_fragmenting_payload() {
        return Err(FrameError::Ipv4Shape);
    }
    if ip.protocol() != IpNumber::UDP {
        return Err(FrameError::NotUdp);
    }
    if !checksum::ipv4_header_verifies(ip.slice()) {
        return Err(FrameError::Ipv4Checksum);
    }
    let total = ip.total_len() as usize;
    if total < 20 + UdpHeader::LEN || total > l3.len() {
        return Err(FrameError::Udp);
    }
    let l4 = &l3[20..total];
    let udp = UdpHeaderSlice::from_slice(l4).map_err(|_| FrameError::Udp)?;
    let ulen = udp.length() as usize;
    if ulen < UdpHeader::LEN || ulen > l4.len() {
        return Err(FrameError::Udp);
    }
    if !checksum::udp_verifies(ip.source(), ip.destination(), &l4[..ulen]) {
        return Err(FrameError::UdpChecksum);
    }
    Ok(UdpFrame {
        src_mac: eth.source(),
        dst_mac: eth.destination(),
        src_ip: ip.source(),
        dst_ip: ip.destination(),
        ce: ip.ecn() == IpEcn::CongestionExperienced,
        src_port: udp.source_port(),
        dst_port: udp.destination_port(),
        payload: &l4[UdpHeader::LEN..ulen],
    })
}

/// Writes Ethernet, IPv4 and UDP headers for a datagram to `to` into
/// `buf[..42]`; the UDP payload of `payload_len` bytes must already be at
/// `buf[42..]` (it is summed whole for the UDP checksum: for the small
/// replies). Returns the frame length, or None if `buf` is too short.
pub fn write_udp_headers(
    buf: &mut [u8],
    to: &Endpoint,
    ce: bool,
    payload_len: usize,
) -> Option<usize> {
    let total = L2_L4_LEN + payload_len;
    let payload_sum = Sum::ZERO.add_bytes(buf.get(L2_L4_LEN..total)?);
    write_l2_l4_headers(buf, to, ce, payload_len, payload_sum)?;
    Some(total)
}

/// Writes the Ethernet, IPv4 and UDP headers of a datagram of
/// `payload_len` bytes to `to` into `buf[..42]` only: for a frame whose
/// payload is written elsewhere (a multi-buffer frame's later buffers).
/// `payload_sum` is the checksum sum of the whole UDP payload, which the
/// caller may have made from parts ([`Sum::add_folded_at`]).
/// None if `buf` is shorter than the headers or the datagram too long.
pub fn write_l2_l4_headers(
    buf: &mut [u8],
    to: &Endpoint,
    ce: bool,
    payload_len: usize,
    payload_sum: Sum,
) -> Option<()> {
    let buf = buf.get_mut(..L2_L4_LEN)?;
    let eth = Ethernet2Header {
        source: to.local_mac,
        destination: to.source.mac,
        ether_type: EtherType::IPV4,
    };
    let udp_len = u16::try_from(UdpHeader::LEN + payload_len).ok()?;
    let mut ip = Ipv4Header::new(udp_len, 64, IpNumber::UDP, to.local_ip, to.source.ip).ok()?;
    ip.ecn = if ce {
        IpEcn::CongestionExperienced
    } else {
        IpEcn::Ect0
    };
    ip.header_checksum = ip.calc_header_checksum();
    let mut udp = UdpHeader {
        source_port: to.local_port,
        destination_port: to.source.port,
        length: udp_len,
        checksum: 0,
    };
    udp.checksum = checksum::udp_pseudo_header(to.local_ip, to.source.ip, udp_len)
        .add_bytes(&udp.to_bytes())
        .add_u16(payload_sum.fold())
        .udp_checksum();
    buf[..14].copy_from_slice(&eth.to_bytes());
    buf[14..34].copy_from_slice(&ip.to_bytes());
    buf[34..42].copy_from_slice(&udp.to_bytes());
    Some(())
}

/// The endpoint a reply to `f` (received on `port_idx`/`queue`) goes to.
pub fn reply_endpoint(f: &UdpFrame<'_>, port_idx: u32, queue: u32) -> Endpoint {
    Endpoint {
        source: proto::switch::Source {
            mac: f.src_mac,
            ip: f.src_ip,
            port: f.src_port,
        },
        local_mac: f.dst_mac,
        local_ip: f.dst_ip,
        local_port: f.dst_port,
        port_idx,
        queue,
        // The table grants lane replies on a JOIN.
        result_lanes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_headers_parse_back() {
        let to = endpoint();
        let mut buf = [0u8; 128];
        buf[42..46].copy_from_slice(b"abcd");
        let n = write_udp_headers(&mut buf, &to, true, 4).unwrap();
        assert_eq!(n, 46);
        let f = parse_udp_frame(&buf[..n]).unwrap();
        assert_eq!(f.src_ip, [198, 18, 0, 1]);
        assert_eq!(f.dst_ip, [198, 18, 0, 10]);
        assert_eq!((f.src_port, f.dst_port), (48879, 40000));
        assert!(f.ce);
        assert_eq!(f.payload, b"abcd");
        // A correct IPv4 header checksum: the ones' complement sum is 0xffff.
        let mut sum = 0u32;
        for c in buf[14..34].chunks(2) {
            sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            source: proto::switch::Source {
                mac: [2, 0, 0, 0, 0, 10],
                ip: [198, 18, 0, 10],
                port: 40000,
            },
            local_mac: [2, 0, 0, 0, 0, 1],
            local_ip: [198, 18, 0, 1],
            local_port: 48879,
            port_idx: 0,
            queue: 0,
            result_lanes: 0,
        }
    }

    /// The UDP checksum etherparse computes for a frame's contents.
    fn etherparse_udp_checksum(frame: &[u8]) -> u16 {
        let ip = Ipv4Header::from_slice(&frame[14..]).unwrap().0;
        let udp = UdpHeader::from_slice(&frame[34..]).unwrap().0;
        let end = 34 + udp.length as usize;
        udp.calc_checksum_ipv4(&ip, &frame[42..end]).unwrap()
    }

    /// Written frames carry the UDP checksum etherparse computes (never
    /// 0), for odd and even payload lengths.
    #[test]
    fn written_frames_carry_a_udp_checksum() {
        for len in [0usize, 1, 4, 23, 1400, 1401] {
            let mut buf = vec![0u8; L2_L4_LEN + len];
            for (i, b) in buf[L2_L4_LEN..].iter_mut().enumerate() {
                *b = (i * 91 + 3) as u8;
            }
            let n = write_udp_headers(&mut buf, &endpoint(), false, len).unwrap();
            let stored = u16::from_be_bytes([buf[40], buf[41]]);
            assert_ne!(stored, 0, "len {len}");
            assert_eq!(stored, etherparse_udp_checksum(&buf[..n]), "len {len}");
            assert!(parse_udp_frame(&buf[..n]).is_ok(), "len {len}");
        }
    }

    /// One flipped payload bit is a checksum error, not a frame; a frame
    /// with no UDP checksum (0) is taken; a wrong IPv4 header checksum is
    /// its own error.
    #[test]
    fn wrong_checksums_are_refused_and_zero_means_none() {
        let mut buf = [0u8; 64];
        buf[42..50].copy_from_slice(b"abcdefgh");
        let n = write_udp_headers(&mut buf, &endpoint(), false, 8).unwrap();
        let good = buf;
        buf[45] ^= 0x01;
        assert_eq!(
            parse_udp_frame(&buf[..n]).unwrap_err(),
            FrameError::UdpChecksum
        );
        buf[40..42].copy_from_slice(&[0, 0]);
        assert_eq!(parse_udp_frame(&buf[..n]).unwrap().payload[3], b'd' ^ 1);
        let mut ip_bad = good;
        ip_bad[22] ^= 0x01; // the TTL
        assert_eq!(
            parse_udp_frame(&ip_bad[..n]).unwrap_err(),
            FrameError::Ipv4Checksum
        );
        // A checksum over a shorter datagram than the frame carries (an
        // Ethernet pad after it) is still right: only the UDP length counts.
        let mut padded = [0u8; 80];
        padded[..n].copy_from_slice(&good[..n]);
        padded[n..].fill(0xee);
        let ip_total = u16::from_be_bytes([padded[16], padded[17]]);
        assert_eq!(ip_total as usize, n - 14);
        assert!(parse_udp_frame(&padded).is_ok());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for len in 0..80 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let _ = parse_udp_frame(&junk);
        }
        let mut buf = [0u8; 64];
        buf[12] = 0x08;
        buf[14] = 0x45;
        buf[16] = 0xff; // total_len beyond the frame
        buf[23] = 17;
        assert!(parse_udp_frame(&buf).is_err());
    }
}
