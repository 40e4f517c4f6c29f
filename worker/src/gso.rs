//! The worker's choice of UDP data path and the pure logic of the
//! `udp-gso` one: which consecutive DATA datagrams go out as one
//! `UDP_SEGMENT` super-datagram, and how a `UDP_GRO` receive buffer splits
//! back into RESULT datagrams. The syscalls live in [`crate::mmsg`].
//!
//! Owns: [`TransportKind`], [`plan_gso`], [`split_gro`], [`BurstLimit`]
//! (how many datagrams one super-datagram may carry while chunks are being
//! lost), the socket-option and control-message helpers, and the probe that
//! decides `auto`.
//! Invariants: a super-datagram is a run of equal-length datagrams, possibly
//! ended by one shorter one (the kernel cuts it every `gso_size` bytes), of
//! at most [`MAX_SEGMENTS`] datagrams and [`MAX_GSO_PAYLOAD`] bytes; a GRO
//! buffer splits into `gso_size` pieces, the last one possibly shorter.
//!
//! Kernel facts this relies on (checked on Linux 6.18): GSO sends work on a
//! device with transmit checksum offload off (the kernel segments and sums
//! in software before the device; older kernels refuse the send with `EIO`
//! there instead, which `auto` takes as "use mmsg"); veth drops its GSO
//! features while the peer runs an XDP program, so DATA reaches the
//! switch's XDP program as ordinary frames; loopback delivers a GSO send
//! whole to a socket with `UDP_GRO` on. UDP GRO merges only datagrams with
//! a nonzero UDP checksum that reach one NAPI poll together: switchd's
//! RESULTs carry one, but, sent by AF_XDP on veth, reach the worker's
//! namespace through the per-CPU backlog one at a time, so on the veth
//! testbed nothing coalesces (measured) and the GRO side only costs its
//! larger buffers. Hand-written on `libc`
//! because std and socket2 have no `UDP_SEGMENT`/`UDP_GRO`.

use std::io;
use std::os::fd::RawFd;

/// Most datagrams in one super-datagram (the kernel's `UDP_MAX_SEGMENTS` on
/// older kernels; newer ones allow more).
pub const MAX_SEGMENTS: usize = 64;
/// Most UDP payload bytes in one super-datagram: an IPv4 packet's limit
/// less the IPv4 and UDP headers.
pub const MAX_GSO_PAYLOAD: usize = u16::MAX as usize - 20 - 8;
/// Bytes per receive slot with GRO on: a whole coalesced buffer fits.
pub const GRO_SLOT: usize = 1 << 16;
/// Most datagrams one GRO buffer is split into (the kernel coalesces at
/// most this many: `UDP_GRO_CNT_MAX`).
pub const MAX_GRO_SEGMENTS: usize = 64;

/// Linux's `SOL_UDP` socket-option level and its GSO/GRO options
/// (include/uapi/linux/udp.h); not all in `libc` for every target.
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// How the worker moves datagrams to and from the switch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportKind {
    /// `udp-gso` when this kernel and interface take it, else `mmsg` (the
    /// reason is logged once).
    #[default]
    Auto,
    /// One datagram per `mmsghdr` in `sendmmsg`/`recvmmsg`.
    Mmsg,
    /// DATA coalesced with `UDP_SEGMENT`, RESULTs received with `UDP_GRO`,
    /// still batched with `sendmmsg`/`recvmmsg`.
    UdpGso,
}

impl TransportKind {
    /// The name the CLI and Python take and report.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Mmsg => "mmsg",
            TransportKind::UdpGso => "udp-gso",
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A transport name that is none of `auto`, `mmsg`, `udp-gso`.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {0:?}: expected \"auto\", \"mmsg\" or \"udp-gso\"")]
pub struct UnknownTransport(pub String);

impl std::str::FromStr for TransportKind {
    type Err = UnknownTransport;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(TransportKind::Auto),
            "mmsg" => Ok(TransportKind::Mmsg),
            "udp-gso" => Ok(TransportKind::UdpGso),
            other => Err(UnknownTransport(other.to_string())),
        }
    }
}

/// One super-datagram: datagrams `start..start + count` of a batch, cut by
/// the kernel every `segment` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub start: usize,
    pub count: usize,
    pub segment: usize,
}

/// Groups `n` consecutive datagrams, datagram `i` being `len(i)` bytes, into
/// super-datagrams in order, calling `emit` for each: a group is a run of
/// equal lengths, possibly ended by one shorter datagram, within
/// `max_segments` (at most [`MAX_SEGMENTS`]) and [`MAX_GSO_PAYLOAD`]. A
/// longer datagram starts a new group (the kernel would cut it at the
/// earlier size).
pub fn plan_gso(
    n: usize,
    max_segments: usize,
    len: impl Fn(usize) -> usize,
    mut emit: impl FnMut(Group),
) {
    let max_segments = max_segments.clamp(1, MAX_SEGMENTS);
    let mut i = 0;
    while i < n {
        let segment = len(i);
        let (mut count, mut bytes) = (1, segment);
        while segment > 0 && i + count < n && count < max_segments {
            let l = len(i + count);
            if l > segment || bytes + l > MAX_GSO_PAYLOAD {
                break;
            }
            count += 1;
            bytes += l;
            if l < segment {
                break;
            }
        }
        emit(Group {
            start: i,
            count,
            segment,
        });
        i += count;
    }
}

/// How many datagrams one super-datagram may carry: AIMD on chunk loss.
///
/// A super-datagram leaves the socket as one burst of back-to-back frames;
/// at a bottleneck with a shallow queue (a 1 Gbit/s link, a switch port) a
/// burst of jumbo frames overflows it, one drop loses several chunks, and
/// their resends, bursts again, feed more drops. So while chunks are being
/// resent the limit halves (at most once per `limit` acknowledgements,
/// about once per burst's worth of RESULTs), down to 1 (one datagram per
/// `sendmmsg` entry, the `mmsg` transport's pacing), and it grows by one
/// for every [`BurstLimit::GROW_AFTER`] × limit RESULTs with no resend, up
/// to [`MAX_SEGMENTS`]: with no loss, udp-gso keeps its whole CPU saving.
#[derive(Debug, Clone)]
pub struct BurstLimit {
    limit: usize,
    resent: u64,
    results: u64,
    /// RESULTs since the last change of `limit`.
    since_change: u64,
}

impl Default for BurstLimit {
    fn default() -> Self {
        BurstLimit {
            limit: MAX_SEGMENTS,
            resent: 0,
            results: 0,
            since_change: 0,
        }
    }
}

impl BurstLimit {
    /// Loss-free RESULTs, in multiples of the limit, before it grows by one.
    pub const GROW_AFTER: u64 = 8;

    /// The current limit (datagrams per super-datagram).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Feeds the collective's running totals of chunks resent and RESULTs
    /// taken (they restart from 0 with each collective); returns the limit.
    pub fn update(&mut self, resent: u64, results: u64) -> usize {
        if resent < self.resent || results < self.results {
            // A new collective: new totals, nothing learnt from the change.
            (self.resent, self.results) = (resent, results);
            return self.limit;
        }
        let (lost, acked) = (resent - self.resent, results - self.results);
        (self.resent, self.results) = (resent, results);
        self.since_change += acked;
        if lost > 0 {
            if self.limit > 1 && self.since_change >= self.limit as u64 {
                self.limit /= 2;
                self.since_change = 0;
            }
        } else if self.limit < MAX_SEGMENTS
            && self.since_change >= Self::GROW_AFTER * self.limit as u64
        {
            self.limit += 1;
            self.since_change = 0;
        }
        self.limit
    }
}

/// The datagrams in a receive buffer of `len` bytes whose control message
/// said `gso_size` (0: none, the buffer is one datagram), as (offset, len).
pub fn split_gro(len: usize, gso_size: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = if gso_size == 0 || gso_size >= len {
        len.max(1)
    } else {
        gso_size
    };
    (0..len)
        .step_by(step)
        .map(move |at| (at, step.min(len - at)))
        .chain((len == 0).then_some((0, 0)))
}

/// Control-message room for one `UDP_SEGMENT` or `UDP_GRO` message, aligned
/// as `cmsghdr` needs.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Cmsg(pub [u8; 64]);

impl Cmsg {
    pub const ZERO: Cmsg = Cmsg([0; 64]);
}

/// Writes a `UDP_SEGMENT` control message for `segment` into `buf`; returns
/// the `msg_controllen` to use.
pub fn write_segment_cmsg(buf: &mut Cmsg, segment: u16) -> usize {
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure size computations.
    let (space, clen) = unsafe {
        (
            libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize,
            libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize,
        )
    };
    debug_assert!(space <= buf.0.len());
    // SAFETY: `buf` is aligned for cmsghdr and holds `space` bytes; a fake
    // msghdr over it lets the libc macros place header and data.
    unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_control = buf.0.as_mut_ptr().cast();
        m.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = clen as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
    }
    space
}

/// The `UDP_GRO` segment size in a received message's control data (0:
/// none, the datagram arrived alone).
///
/// # Safety
/// `m.msg_control`/`m.msg_controllen` describe control data the kernel
/// wrote (or `msg_controllen` is 0).
pub unsafe fn gro_segment(m: &libc::msghdr) -> usize {
    let mut c = libc::CMSG_FIRSTHDR(m);
    while !c.is_null() {
        if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
            let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
            return v.max(0) as usize;
        }
        c = libc::CMSG_NXTHDR(m, c);
    }
    0
}

/// Turns `UDP_GRO` on or off on `fd`.
pub fn set_gro(fd: RawFd, on: bool) -> io::Result<()> {
    let v: libc::c_int = on.into();
    // SAFETY: setsockopt with a valid fd and a c_int option value.
    let r = unsafe {
        libc::setsockopt(
            fd,
            SOL_UDP,
            UDP_GRO,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `datagram` on the connected socket `fd` with a `UDP_SEGMENT`
/// control message of its own length: one segment, so it leaves as an
/// ordinary datagram, but through the kernel's GSO checks for this route and
/// device. The probe of `auto`, done with the first HELLO of a join.
pub fn send_probe(fd: RawFd, datagram: &[u8]) -> io::Result<()> {
    let mut ctrl = Cmsg::ZERO;
    let clen = write_segment_cmsg(&mut ctrl, datagram.len() as u16);
    let mut iov = libc::iovec {
        iov_base: datagram.as_ptr() as *mut libc::c_void,
        iov_len: datagram.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid (no name).
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl.0.as_mut_ptr().cast();
    m.msg_controllen = clen as _;
    loop {
        // SAFETY: `m` points at `iov` and `ctrl`, alive for the call.
        let r = unsafe { libc::sendmsg(fd, &m, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The checks passed; the datagram was lost like any other.
            Some(libc::EAGAIN | libc::ENOBUFS | libc::ECONNREFUSED) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// Receives one datagram from `fd` into `buf` without blocking, cutting a
/// `UDP_GRO` buffer at its first datagram; returns its length.
pub fn recv_first(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    let mut ctrl = Cmsg::ZERO;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is valid (no name).
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl.0.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    loop {
        // SAFETY: `m` points at `iov` (over `buf`) and `ctrl`, alive for
        // the call.
        let r = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) };
        if r >= 0 {
            let n = (r as usize).min(buf.len());
            // SAFETY: the kernel wrote `m`'s control data.
            let seg = unsafe { gro_segment(&m) };
            return Ok(split_gro(n, seg).next().map_or(0, |(_, l)| l));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Why a kernel refused GSO or GRO with `e`, and what an operator can do
/// about it: (reason, fix).
pub fn unavailable_hint(e: &io::Error) -> (&'static str, &'static str) {
    const OTHER: &str = "use transport \"mmsg\" or \"auto\"";
    match e.raw_os_error() {
        Some(libc::EIO) => (
            "the kernel refuses UDP GSO on an interface with transmit checksum offload off \
             (older kernels do)",
            "turn it on toward the switch (ethtool -K DEV tx on) or use transport \"mmsg\" or \
             \"auto\"",
        ),
        Some(libc::ENOPROTOOPT | libc::EINVAL | libc::EOPNOTSUPP) => (
            "this kernel lacks UDP GSO/GRO (it needs Linux 5.0 or later)",
            OTHER,
        ),
        _ => ("the kernel refused it", OTHER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(lens: &[usize]) -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        plan_gso(
            lens.len(),
            MAX_SEGMENTS,
            |i| lens[i],
            |g| v.push((g.start, g.count, g.segment)),
        );
        v
    }

    #[test]
    fn a_burst_limit_caps_the_groups() {
        let mut v = Vec::new();
        plan_gso(8, 3, |_| 9000, |g| v.push((g.start, g.count)));
        assert_eq!(v, [(0, 3), (3, 3), (6, 2)]);
        v.clear();
        plan_gso(3, 0, |_| 9000, |g| v.push((g.start, g.count)));
        assert_eq!(v, [(0, 1), (1, 1), (2, 1)], "0 means one datagram each");
    }

    #[test]
    fn the_burst_limit_halves_under_loss_and_regrows_without() {
        let mut b = BurstLimit::default();
        assert_eq!(b.update(0, 10), MAX_SEGMENTS, "no loss: whole bursts");
        // Resends while RESULTs come back: halve, at most once per limit
        // RESULTs (so one loss event does not collapse it at once).
        assert_eq!(
            b.update(3, 20),
            MAX_SEGMENTS,
            "fewer than a limit of RESULTs so far"
        );
        assert_eq!(b.update(4, 170), MAX_SEGMENTS / 2);
        assert_eq!(
            b.update(5, 171),
            MAX_SEGMENTS / 2,
            "not again within the same burst's RESULTs"
        );
        let (mut resent, mut results) = (5, 171);
        while b.limit() > 1 {
            resent += 1;
            results += b.limit() as u64;
            b.update(resent, results);
        }
        assert_eq!(
            b.update(resent + 1, results + 10),
            1,
            "never below one datagram"
        );
        // Loss-free RESULTs grow it by one per GROW_AFTER x limit.
        results += 10;
        assert_eq!(b.update(resent + 1, results + BurstLimit::GROW_AFTER), 2);
        // A new collective restarts the totals: no loss is inferred from it.
        assert_eq!(b.update(0, 0), 2);
        assert_eq!(b.update(0, 5), 2);
    }

    #[test]
    fn equal_datagrams_and_a_shorter_tail_form_one_super_datagram() {
        assert_eq!(plan(&[1470, 1470, 1470, 300]), [(0, 4, 1470)]);
        assert_eq!(plan(&[1470]), [(0, 1, 1470)]);
        assert!(plan(&[]).is_empty());
    }

    #[test]
    fn a_shorter_datagram_ends_its_group_and_a_longer_one_starts_one() {
        assert_eq!(
            plan(&[100, 100, 50, 100, 200, 200]),
            [(0, 3, 100), (3, 1, 100), (4, 2, 200)]
        );
    }

    #[test]
    fn groups_respect_the_segment_and_byte_limits() {
        let small = vec![100; 130];
        assert_eq!(
            plan(&small),
            [
                (0, MAX_SEGMENTS, 100),
                (64, MAX_SEGMENTS, 100),
                (128, 2, 100)
            ]
        );
        // 1470-byte datagrams: 44 fit in the IPv4 payload limit, 45 do not.
        let big = vec![1470; 50];
        let g = plan(&big);
        assert_eq!(g, [(0, 44, 1470), (44, 6, 1470)]);
        // Jumbo datagrams: seven per group.
        assert_eq!(plan(&[9000; 8]), [(0, 7, 9000), (7, 1, 9000)]);
    }

    #[test]
    fn a_gro_buffer_splits_into_its_datagrams() {
        let got: Vec<_> = split_gro(1470 * 3 + 10, 1470).collect();
        assert_eq!(got, [(0, 1470), (1470, 1470), (2940, 1470), (4410, 10)]);
        let exact: Vec<_> = split_gro(300, 100).collect();
        assert_eq!(exact, [(0, 100), (100, 100), (200, 100)]);
        assert_eq!(split_gro(500, 0).collect::<Vec<_>>(), [(0, 500)]);
        assert_eq!(split_gro(500, 1470).collect::<Vec<_>>(), [(0, 500)]);
        assert_eq!(split_gro(0, 0).collect::<Vec<_>>(), [(0, 0)]);
    }

    #[test]
    fn transport_names_round_trip_and_a_bad_one_says_what_is_allowed() {
        for k in [
            TransportKind::Auto,
            TransportKind::Mmsg,
            TransportKind::UdpGso,
        ] {
            assert_eq!(k.name().parse::<TransportKind>().unwrap(), k);
        }
        let e = "gso".parse::<TransportKind>().unwrap_err().to_string();
        assert!(e.contains("\"gso\"") && e.contains("\"udp-gso\""), "{e}");
    }
}
