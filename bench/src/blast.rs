//! `aggblast`'s generators: a packet generator for the switch's rate
//! benchmarks (`scripts/bench allreduce`, rate section), fast enough not to be
//! what is measured. (Moved out of the worker library: it builds its own
//! frames and drives the protocol itself once the ranks have joined.)
//!
//! Why hand-written raw sockets: there is no pktgen in this kernel and
//! Debian's xdp-tools do not load on it (docs/PLATFORM.md, "Packet generators"); a
//! plain UDP `sendmmsg` reaches ≈ 0.28 Mpps from one core here, an
//! AF_PACKET socket with `PACKET_QDISC_BYPASS` and `sendmmsg` ≈ 0.7 Mpps.
//! No crate in the workspace wraps AF_PACKET transmit, and the few calls
//! needed (`socket`, `bind`, `setsockopt`, `sendmmsg`, `recvmmsg`) are
//! plain `libc`, which the worker library already uses.
//!
//! Two generators:
//! * [`blast_echo`]: open loop. Prebuilt UDP frames of a given size to the
//!   switch's aggregation port, as fast as `sendmmsg` goes, for D seconds,
//!   over K flows (source ports: without `PACKET_QDISC_BYPASS` the flow
//!   hash spreads them over the queues of a multi-queue veth; with it the
//!   kernel picks the queue from the sending CPU, see [`RawSocket::open`]).
//!   Each flow's port has a UDP socket with the smallest
//!   receive buffer, so that echoes are dropped at the socket rather than
//!   answered with ICMP. What the switch echoed is read from its counters.
//! * [`blast_aggregate`]: all N ranks of one job from one process. Each
//!   rank joins through the normal worker library (its own UDP socket, so
//!   the switch records IP:port_r), then DATA for (seq, rank) goes out as
//!   raw frames whose addresses match that rank's JOIN. Closed loop: at
//!   most W seqs in flight (W ≤ the switch's advertised window), completion
//!   learnt from rank 0's RESULTs only (`recvmmsg` batches), and a seq
//!   whose RESULT has not come within the RTO has all N ranks' DATA resent
//!   (flag RETX), so a lost frame costs a resend, not a stalled slot. The
//!   other ranks' sockets get the smallest receive buffer: their RESULTs
//!   are dropped by the kernel at the socket (no copy to user space, no
//!   wakeup), which is the cheapest way to absorb them without changing
//!   the switch.
//!
//! Hot path: no allocation; frame headers are prebuilt per rank (or flow)
//! and only seq and flags are patched; the payload is one constant buffer
//! shared by every message through a second iovec.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use proto::wire::{flags, Header, HeaderRepr, MsgType, HEADER_LEN, L2_L4_LEN};

use worker::mmsg::DatagramBatch;
use worker::{wait_readable, Worker, WorkerConfig, WorkerError};

/// Ethernet + IPv4 + UDP + aggregation header: the prebuilt part of a frame.
pub const FRAME_HDR: usize = L2_L4_LEN + HEADER_LEN;
/// Offsets of the patched header fields inside a frame.
const OFF_FLAGS: usize = L2_L4_LEN + 1;
const OFF_SEQ: usize = L2_L4_LEN + 8;
/// Messages per `sendmmsg`/`recvmmsg`.
pub const DEFAULT_BATCH: usize = 64;
/// Receive buffer per RESULT (a UDP payload of at most 22 + 4 × 362 B at
/// MTU 1500; jumbo RESULTs are cut, which only the sample check notices).
const RX_BUF: usize = 2048;

/// One direction of a UDP flow at Ethernet level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Writes Ethernet, IPv4 (ECT(0), DF, TTL 64, checksummed) and UDP
/// (checksum 0, which IPv4 allows) headers for a datagram with
/// `udp_payload` bytes of payload into `buf[..42]`.
pub fn write_l2_l4(buf: &mut [u8], f: &Flow, udp_payload: usize) {
    let ip_len = (20 + 8 + udp_payload) as u16;
    buf[0..6].copy_from_slice(&f.dst_mac);
    buf[6..12].copy_from_slice(&f.src_mac);
    buf[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut buf[14..34];
    ip[0] = 0x45;
    ip[1] = 0x02; // ECT(0), as PROTOCOL.md asks of workers
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&[0, 0]);
    ip[6..8].copy_from_slice(&[0x40, 0]); // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&f.src_ip.octets());
    ip[16..20].copy_from_slice(&f.dst_ip.octets());
    let c = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut buf[34..42];
    udp[0..2].copy_from_slice(&f.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&f.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&(8 + udp_payload as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
}

/// The 64-byte head of a DATA frame of `count` elements for `hdr`'s rank.
pub fn data_head(f: &Flow, hdr: &HeaderRepr) -> [u8; FRAME_HDR] {
    let mut b = [0u8; FRAME_HDR];
    write_l2_l4(&mut b, f, HEADER_LEN + 4 * hdr.count as usize);
    hdr.emit_to(&mut b[L2_L4_LEN..])
        .expect("FRAME_HDR holds a header");
    b
}

fn last_err(call: &'static str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call}: {e}"))
}

fn setsockopt_int(fd: i32, level: i32, opt: i32, v: i32) -> io::Result<()> {
    // SAFETY: valid fd, a c_int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(last_err("setsockopt"))
    }
}

/// Shrinks a socket's receive buffer to the kernel's minimum: datagrams
/// beyond it are dropped at the socket (counted in RcvbufErrors).
pub fn shrink_rcvbuf(sock: &UdpSocket) {
    let _ = setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 0)
        .or_else(|_| setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 0));
}

/// A transmit-only AF_PACKET socket on one interface, bypassing the qdisc.
pub struct RawSocket {
    fd: OwnedFd,
}

impl RawSocket {
    /// `qdisc_bypass`: `PACKET_QDISC_BYPASS`, which also makes the kernel
    /// pick the transmit queue from the sending CPU (`cpu % queues`), so
    /// one generator thread feeds one queue. Without it the flow hash
    /// picks the queue (flows spread over a multi-queue veth); veth's
    /// default qdisc is `noqueue`, so little is lost.
    pub fn open(ifname: &str, qdisc_bypass: bool) -> io::Result<RawSocket> {
        let name = CString::new(ifname).map_err(|_| io::Error::other("bad interface name"))?;
        // SAFETY: a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::other(format!("no interface {ifname}")));
        }
        // Protocol 0: the socket transmits only; it never gets a copy of
        // received frames.
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(last_err("socket(AF_PACKET) (needs root or CAP_NET_RAW)"));
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: a valid sockaddr_ll of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(last_err("bind(AF_PACKET)"));
        }
        if qdisc_bypass {
            setsockopt_int(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                1,
            )?;
        }
        let _ = setsockopt_int(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            8 << 20,
        );
        Ok(RawSocket { fd })
    }

    /// One `sendmmsg` of `msgs`; returns how many left, and counts a
    /// message the stack refused (ENOBUFS/EAGAIN: device queue full) as
    /// sent-and-lost so that the caller moves on (`(sent, refused)`).
    fn send(&self, msgs: &mut [libc::mmsghdr]) -> io::Result<(usize, usize)> {
        // SAFETY: every mmsghdr points at iovecs and buffers owned by the
        // caller's `Batch`, alive and unchanged for the call.
        let r = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                msgs.len() as libc::c_uint,
                0,
            )
        };
        if r >= 0 {
            return Ok((r as usize, 0));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOBUFS | libc::EAGAIN | libc::EBUSY) => Ok((0, 1)),
            _ => Err(io::Error::new(e.kind(), format!("sendmmsg: {e}"))),
        }
    }
}

/// `n` messages, each a 64-byte head of its own plus a shared payload.
/// The iovecs and mmsghdrs point into the heads and payload, which are
/// allocated once and never move (the Vecs never grow).
struct Batch {
    heads: Vec<[u8; FRAME_HDR]>,
    iovs: Vec<[libc::iovec; 2]>,
    msgs: Vec<libc::mmsghdr>,
    _payload: Vec<u8>,
}

impl Batch {
    /// `head_len` bytes of each head (≤ 64) then the whole payload.
    fn new(n: usize, head_len: usize, payload: Vec<u8>) -> Batch {
        let mut b = Batch {
            heads: vec![[0u8; FRAME_HDR]; n],
            // SAFETY: iovec and mmsghdr are plain C structs; zero is valid
            // (null pointers, zero lengths), filled in below.
            iovs: vec![unsafe { std::mem::zeroed() }; n],
            msgs: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            _payload: payload,
        };
        let pay_ptr = b._payload.as_ptr() as *mut libc::c_void;
        let pay_len = b._payload.len();
        for i in 0..n {
            b.iovs[i][0] = libc::iovec {
                iov_base: b.heads[i].as_mut_ptr() as *mut libc::c_void,
                iov_len: head_len.min(FRAME_HDR),
            };
            b.iovs[i][1] = libc::iovec {
                iov_base: pay_ptr,
                iov_len: pay_len,
            };
            let m = &mut b.msgs[i].msg_hdr;
            m.msg_iov = b.iovs[i].as_mut_ptr();
            m.msg_iovlen = if pay_len > 0 { 2 } else { 1 };
        }
        b
    }

    /// Sends messages `0..n` (retrying partial sends); returns (sent,
    /// refused by the stack).
    fn send(&mut self, sock: &RawSocket, n: usize) -> io::Result<(u64, u64)> {
        let (mut at, mut refused) = (0usize, 0u64);
        while at < n {
            let (s, r) = sock.send(&mut self.msgs[at..n])?;
            at += s + r;
            refused += r as u64;
        }
        Ok(((n as u64) - refused, refused))
    }
}

/// Reads the MAC address of `ifname` from sysfs.
pub fn mac_of(ifname: &str) -> io::Result<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/address"))?;
    parse_mac(s.trim()).ok_or_else(|| io::Error::other(format!("bad MAC of {ifname}: {s}")))
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// The MAC of `ip` from the kernel's neighbour table, asking for it (one
/// UDP datagram to the discard port) if needed; waits up to 2 s.
pub fn resolve_mac(ip: Ipv4Addr, ifname: &str) -> io::Result<[u8; 6]> {
    let lookup = || -> Option<[u8; 6]> {
        let t = std::fs::read_to_string("/proc/net/arp").ok()?;
        t.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[0] == ip.to_string() && f[5] == ifname && f[2] != "0x0")
                .then(|| parse_mac(f[3]))
                .flatten()
                .filter(|m| *m != [0; 6])
        })
    };
    if let Some(m) = lookup() {
        return Ok(m);
    }
    let s = UdpSocket::bind("0.0.0.0:0")?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let _ = s.send_to(b"arp", SocketAddrV4::new(ip, 9));
        std::thread::sleep(Duration::from_millis(50));
        if let Some(m) = lookup() {
            return Ok(m);
        }
    }
    Err(io::Error::other(format!(
        "no neighbour entry for {ip} on {ifname}: give --dst-mac"
    )))
}

/// What the open-loop generator did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EchoReport {
    pub mode: &'static str,
    pub frame_bytes: usize,
    pub flows: usize,
    pub qdisc_bypass: bool,
    pub seconds: f64,
    pub frames_sent: u64,
    /// Frames the stack refused (device queue full): not on the wire.
    pub frames_refused: u64,
    pub sent_per_s: f64,
}

/// What the open-loop generator sends.
#[derive(Debug, Clone)]
pub struct EchoConfig {
    pub ifname: String,
    /// The switch's address and aggregation port.
    pub to: SocketAddrV4,
    pub dst_mac: [u8; 6],
    /// Bytes per frame (Ethernet header included, FCS not); at least 64.
    pub frame_bytes: usize,
    /// Source ports to spread the frames over.
    pub flows: usize,
    pub secs: f64,
    /// Messages per `sendmmsg`.
    pub batch: usize,
    /// See [`RawSocket::open`].
    pub qdisc_bypass: bool,
}

/// Open loop: `frame_bytes`-byte frames (≥ 64) to `to` from `flows`
/// source ports of this host for `secs` seconds.
pub fn blast_echo(cfg: &EchoConfig) -> io::Result<EchoReport> {
    let EchoConfig {
        ref ifname,
        to,
        dst_mac,
        frame_bytes,
        flows,
        secs,
        batch,
        qdisc_bypass,
    } = *cfg;
    let ifname = ifname.as_str();
    let frame_bytes = frame_bytes.max(FRAME_HDR);
    let flows = flows.max(1);
    let src_mac = mac_of(ifname)?;
    // One UDP socket per flow: owns the source port, and drops the echoes
    // (smallest receive buffer) instead of letting the kernel send ICMP.
    let mut socks = Vec::with_capacity(flows);
    for _ in 0..flows {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect(to)?;
        shrink_rcvbuf(&s);
        socks.push(s);
    }
    let src_ip = match socks[0].local_addr()? {
        std::net::SocketAddr::V4(a) => *a.ip(),
        a => return Err(io::Error::other(format!("not IPv4: {a}"))),
    };
    let payload_len = frame_bytes - FRAME_HDR;
    let batch = batch.max(flows);
    let mut b = Batch::new(batch, FRAME_HDR, vec![0u8; payload_len]);
    for (i, head) in b.heads.iter_mut().enumerate() {
        let port = socks[i % flows].local_addr()?.port();
        let f = Flow {
            src_mac,
            dst_mac,
            src_ip,
            dst_ip: *to.ip(),
            src_port: port,
            dst_port: to.port(),
        };
        // A DATA-shaped header (job 1) whose count matches the payload when
        // it is a whole number of floats; echo mode reads none of it.
        let mut h = HeaderRepr::new(MsgType::Data, 1);
        h.count = (payload_len / 4) as u16;
        h.seq = i as u32;
        write_l2_l4(head, &f, HEADER_LEN + payload_len);
        h.emit_to(&mut head[L2_L4_LEN..])
            .expect("FRAME_HDR holds a header");
    }
    let sock = RawSocket::open(ifname, qdisc_bypass)?;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let (mut sent, mut refused) = (0u64, 0u64);
    loop {
        let (s, r) = b.send(&sock, batch)?;
        sent += s;
        refused += r;
        if Instant::now() >= end {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(EchoReport {
        mode: "echo",
        frame_bytes,
        flows,
        qdisc_bypass,
        seconds,
        frames_sent: sent,
        frames_refused: refused,
        sent_per_s: sent as f64 / seconds,
    })
}

/// How to drive one job with all its ranks.
#[derive(Debug, Clone)]
pub struct AggConfig {
    pub ifname: String,
    pub dst_mac: Option<[u8; 6]>,
    /// Rank 0's config; the others differ only in `rank`.
    pub worker: WorkerConfig,
    pub secs: f64,
    /// Seqs in flight at most (capped by the switch's window).
    pub window: Option<u16>,
    pub rto: Duration,
    pub value: f32,
    /// Check every this many completed chunks' RESULT payload (0: never).
    pub verify_every: u64,
    pub batch: usize,
    /// See [`RawSocket::open`].
    pub qdisc_bypass: bool,
}

/// What the closed-loop generator did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AggReport {
    pub mode: &'static str,
    pub job: u16,
    pub ranks: u16,
    pub elems_per_chunk: u16,
    pub pool_slots: u16,
    pub window: u16,
    pub qdisc_bypass: bool,
    pub seconds: f64,
    /// DATA frames sent (resends included).
    pub data_sent: u64,
    pub data_refused: u64,
    pub data_per_s: f64,
    /// Seqs whose RESULT reached rank 0.
    pub chunks_completed: u64,
    pub chunks_per_s: f64,
    /// chunks/s × E × N: float32 contributions summed per second.
    pub contributed_elems_per_s: f64,
    /// chunks/s × E: float32 results produced per second.
    pub result_elems_per_s: f64,
    /// Seqs resent after an RTO (each resend is N DATA frames).
    pub seq_resends: u64,
    pub results_received: u64,
    pub nacks: u64,
    pub ece_results: u64,
    pub verify_checked: u64,
    pub verify_failed: u64,
}

/// Joins all `n` ranks at once (one thread each, since a JOIN_ACK comes
/// only when every rank has joined); returns them in rank order.
pub fn join_all(cfg: &WorkerConfig) -> Result<Vec<Worker>, WorkerError> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.n_workers)
            .map(|r| {
                let mut c = cfg.clone();
                c.rank = r;
                s.spawn(move || Worker::join(c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("join thread panicked"))
            .collect()
    })
}

/// Whether a RESULT's payload holds `e` float32 elements, each with the bits
/// `want`. Only the values are read: what follows them (the RESULT token
/// of an `auth = "port"` job, the tag of an `auth = "mac"` one, a stats
/// trailer) is not part of the sum.
fn result_holds(payload: &[u8], count: u16, e: u16, want: u32) -> bool {
    let Some(values) = payload.get(..usize::from(e) * 4) else {
        return false;
    };
    count == e
        && values
            .chunks_exact(4)
            .all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == want)
}

/// All ranks of one job from this process; see the module docs.
pub fn blast_aggregate(cfg: &AggConfig) -> anyhow::Result<AggReport> {
    use anyhow::Context;
    let wc = &cfg.worker;
    let n = wc.n_workers as usize;
    let workers = join_all(wc).context("joining every rank")?;
    let w0 = &workers[0];
    let (e, slots, gen) = (w0.elems_per_chunk(), w0.pool_slots(), w0.generation());
    let (first_seq, collective) = w0.next_seq();
    let mut adv = w0.advertised_window().max(1);
    let ceiling = cfg.window.unwrap_or(slots).clamp(1, slots);
    let dst_mac = match cfg.dst_mac {
        Some(m) => m,
        None => resolve_mac(*wc.switch.ip(), &cfg.ifname)?,
    };
    let src_mac = mac_of(&cfg.ifname)?;
    let mut heads = Vec::with_capacity(n);
    for (r, w) in workers.iter().enumerate() {
        let std::net::SocketAddr::V4(local) = w.socket().local_addr()? else {
            anyhow::bail!("rank {r}: socket is not IPv4");
        };
        let f = Flow {
            src_mac,
            dst_mac,
            src_ip: *local.ip(),
            dst_ip: *wc.switch.ip(),
            src_port: local.port(),
            dst_port: wc.switch.port(),
        };
        let mut h = HeaderRepr::new(MsgType::Data, wc.job);
        h.rank = r as u16;
        h.count = e;
        h.collective = collective;
        h.gen = gen;
        heads.push(data_head(&f, &h));
        if r > 0 {
            shrink_rcvbuf(w.socket());
        }
    }
    let payload: Vec<u8> = std::iter::repeat_n(cfg.value.to_le_bytes(), e as usize)
        .flatten()
        .collect();
    let want = (n as f32 * cfg.value).to_bits();
    // Room for whole seqs: every seq is N messages.
    let per_batch = (cfg.batch.max(n) / n).max(1);
    let mut b = Batch::new(per_batch * n, FRAME_HDR, payload);
    let mut rx = DatagramBatch::new(cfg.batch, RX_BUF);
    let sock = RawSocket::open(&cfg.ifname, cfg.qdisc_bypass)?;
    let sock0 = workers[0].socket();

    // Per-slot state of the seqs in flight, indexed seq mod S.
    let s_mask = u32::from(slots) - 1;
    let mut done = vec![false; slots as usize];
    let mut sent_at = vec![Instant::now(); slots as usize];
    let mut base = first_seq; // oldest incomplete
    let mut next = first_seq; // next never sent
    let mut resend: Vec<u32> = Vec::with_capacity(slots as usize);

    let mut rep = AggReport {
        mode: "aggregate",
        job: wc.job,
        ranks: wc.n_workers,
        elems_per_chunk: e,
        pool_slots: slots,
        window: ceiling.min(adv),
        qdisc_bypass: cfg.qdisc_bypass,
        seconds: 0.0,
        data_sent: 0,
        data_refused: 0,
        data_per_s: 0.0,
        chunks_completed: 0,
        chunks_per_s: 0.0,
        contributed_elems_per_s: 0.0,
        result_elems_per_s: 0.0,
        seq_resends: 0,
        results_received: 0,
        nacks: 0,
        ece_results: 0,
        verify_checked: 0,
        verify_failed: 0,
    };
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(cfg.secs);
    let mut next_scan = start + cfg.rto;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        // Resends: seqs in flight past their RTO, scanned at most every RTO/4.
        if now >= next_scan {
            let mut s = base;
            while s != next {
                let i = (s & s_mask) as usize;
                if !done[i]
                    && now.duration_since(sent_at[i]) >= cfg.rto
                    && resend.len() < resend.capacity()
                {
                    resend.push(s);
                }
                s = s.wrapping_add(1);
            }
            next_scan = now + cfg.rto / 4;
        }
        // Fill a batch: resends first, then new seqs within the window.
        let window = u32::from(ceiling.min(adv).max(1));
        let mut k = 0usize;
        while k < per_batch {
            let (seq, retx) = if let Some(s) = resend.pop() {
                rep.seq_resends += 1;
                (s, true)
            } else if next.wrapping_sub(base) < window {
                let s = next;
                next = next.wrapping_add(1);
                (s, false)
            } else {
                break;
            };
            let i = (seq & s_mask) as usize;
            if !retx {
                done[i] = false;
            }
            sent_at[i] = now;
            for (h, head) in b.heads[k * n..(k + 1) * n].iter_mut().zip(&heads) {
                *h = *head;
                h[OFF_SEQ..OFF_SEQ + 4].copy_from_slice(&seq.to_be_bytes());
                if retx {
                    h[OFF_FLAGS] = flags::RETX;
                }
            }
            k += 1;
        }
        if k > 0 {
            let (s, r) = b.send(&sock, k * n)?;
            rep.data_sent += s;
            rep.data_refused += r;
        }
        // Rank 0's RESULTs.
        let got = rx
            .recv(sock0.as_raw_fd())
            .map_err(|e| io::Error::new(e.kind(), format!("recvmmsg: {e}")))?;
        for j in 0..got {
            let m = rx.get(j);
            let Ok(h) = Header::new_checked(m) else {
                continue;
            };
            let Ok(r) = HeaderRepr::parse(&h) else {
                continue;
            };
            if r.job != wc.job {
                continue;
            }
            match r.msg_type {
                MsgType::Result if r.gen == gen => {
                    rep.results_received += 1;
                    if r.has_flag(flags::ECE) {
                        rep.ece_results += 1;
                    }
                    adv = r.window.clamp(1, slots);
                    let off = r.seq.wrapping_sub(base);
                    if off >= next.wrapping_sub(base) {
                        continue; // old or duplicate
                    }
                    let i = (r.seq & s_mask) as usize;
                    if done[i] {
                        continue;
                    }
                    done[i] = true;
                    rep.chunks_completed += 1;
                    if cfg.verify_every > 0
                        && rep.chunks_completed % cfg.verify_every == 1 % cfg.verify_every
                    {
                        rep.verify_checked += 1;
                        if !result_holds(h.payload(), r.count, e, want) {
                            rep.verify_failed += 1;
                        }
                    }
                }
                MsgType::Result => anyhow::bail!(
                    "a RESULT of generation {:#x}, not {gen:#x}: the switch restarted",
                    r.gen
                ),
                MsgType::Nack => rep.nacks += 1,
                _ => {}
            }
        }
        while base != next && done[(base & s_mask) as usize] {
            done[(base & s_mask) as usize] = false;
            base = base.wrapping_add(1);
        }
        if got == 0 && k == 0 {
            // Window full and nothing arrived: sleep until a RESULT or 1 ms.
            wait_readable(sock0.as_raw_fd(), Duration::from_millis(1));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    rep.seconds = secs;
    rep.window = ceiling.min(adv);
    rep.data_per_s = rep.data_sent as f64 / secs;
    rep.chunks_per_s = rep.chunks_completed as f64 / secs;
    rep.result_elems_per_s = rep.chunks_per_s * f64::from(e);
    rep.contributed_elems_per_s = rep.result_elems_per_s * n as f64;
    for w in workers {
        let _ = w.leave();
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        Flow {
            src_mac: [2, 0, 0, 0, 0, 10],
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_ip: Ipv4Addr::new(198, 18, 0, 10),
            dst_ip: Ipv4Addr::new(198, 18, 0, 1),
            src_port: 40000,
            dst_port: 48879,
        }
    }

    /// A RESULT of an `auth = "port"` job ends in its 16-byte token: the
    /// check reads the sums and not the token (reading the token too made
    /// every sampled RESULT a failure).
    #[test]
    fn a_result_is_checked_on_its_values_not_its_token() {
        let want = (4.0f32 * 1.5).to_bits();
        let mut p: Vec<u8> = std::iter::repeat_n(want.to_le_bytes(), 3)
            .flatten()
            .collect();
        p.extend([0xa5; 16]);
        assert!(result_holds(&p, 3, 3, want));
        p[4] ^= 1;
        assert!(!result_holds(&p, 3, 3, want), "a wrong sum is caught");
        assert!(
            !result_holds(&p[..8], 3, 3, want),
            "a short payload is caught"
        );
        assert!(!result_holds(&p, 2, 3, want), "a short count is caught");
    }

    #[test]
    fn data_head_is_a_valid_frame_head() {
        let mut h = HeaderRepr::new(MsgType::Data, 7);
        h.rank = 3;
        h.count = 362;
        h.seq = 0x01020304;
        h.gen = 0xdeadbeef;
        let b = data_head(&flow(), &h);
        assert_eq!(&b[0..6], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&b[12..14], &[8, 0]);
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), 20 + 8 + 22 + 1448);
        assert_eq!(ipv4_checksum(&b[14..34]), 0, "checksum verifies");
        assert_eq!(u16::from_be_bytes([b[38], b[39]]), 8 + 22 + 1448);
        assert_eq!(&b[OFF_SEQ..OFF_SEQ + 4], &[1, 2, 3, 4]);
        let mut frame = b.to_vec();
        frame.extend(std::iter::repeat_n(0u8, 1448));
        assert_eq!(frame.len(), 1512);
        let hv = Header::new_checked(&frame[L2_L4_LEN..]).unwrap();
        let r = HeaderRepr::parse(&hv).unwrap();
        assert_eq!(r, h);
    }

    #[test]
    fn macs_parse() {
        assert_eq!(parse_mac("02:ab:00:00:00:0f"), Some([2, 0xab, 0, 0, 0, 15]));
        assert_eq!(parse_mac("02:ab:00:00:00"), None);
        assert_eq!(parse_mac("02:ab:00:00:00:0f:00"), None);
    }
}
