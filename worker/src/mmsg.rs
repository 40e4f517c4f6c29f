//! Batches of datagrams for `sendmmsg(2)` / `recvmmsg(2)` on a UDP socket:
//! one syscall moves a whole batch, where a `send`/`recv` per chunk cost two
//! syscalls per chunk per worker (about 90 k syscalls per worker for a
//! 64 MiB all-reduce). Used by the worker's transport (connected socket) and
//! by `aggblast` (bench/src/blast.rs) for rank 0's RESULTs.
//!
//! Owns: [`DatagramBatch`], `capacity` slots of `slot` bytes and their
//! `iovec`/`mmsghdr`s, all allocated once in [`DatagramBatch::new`] (or
//! [`new_gso`](DatagramBatch::new_gso) / [`new_gro`](DatagramBatch::new_gro)
//! for the `udp-gso` transport, with their control-message buffers); the
//! headers point into the batch's heap buffers, which never move or grow.
//! The default batch has no slot and allocates nothing: a stand-in while
//! the real one is lent out.
//! A GSO batch sends runs of its slots as `UDP_SEGMENT` super-datagrams (one
//! `mmsghdr` over several `iovec`s, no copy); a GRO batch receives whole
//! coalesced buffers and indexes the datagrams inside them, so `len`/`get`
//! always count datagrams, whatever the mode.
//!
//! Seq lanes ([`DatagramBatch::set_lanes`]; docs/PROTOCOL.md, "Seq lanes"):
//! a switch with L lanes takes DATA of seq s on its port + (s mod L), so
//! that a NIC can steer each lane to its own queue and core. A datagram
//! queued with its seq ([`DatagramBatch::commit_seq`]) goes to its lane's
//! port: the send orders the batch by lane (a stable counting sort of the
//! `iovec`s, no copy of the data) and names the lane's address in each
//! `mmsghdr`, so a GSO super-datagram never spans two lanes. Everything
//! else goes to the connected address.
//!
//! Hand-written on `libc` because std and socket2 have no `sendmmsg` /
//! `recvmmsg`, and the calls are two: a wrapper crate would add more surface
//! than it saves.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::RawFd;

use crate::gso::{self, Cmsg};

const SOCKADDR_IN_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as _;

/// Datagrams per syscall on the worker's transport.
pub const BATCH: usize = 32;
/// Bytes per slot on the worker's transport: a jumbo-frame datagram fits.
pub const SLOT: usize = 9216;
/// Datagrams per `sendmmsg` of the udp-gso transport: a few whole
/// super-datagrams of standard-MTU DATA.
pub const GSO_BATCH: usize = 128;
/// Buffers per `recvmmsg` of the udp-gso transport: as many as the mmsg
/// transport's datagrams, so that a receive moves no fewer datagrams when
/// nothing was coalesced. Each slot is [`crate::gso::GRO_SLOT`] bytes, so
/// this many times that is its memory.
pub const GRO_BATCH: usize = BATCH;

/// Datagram buffers with their lengths and the syscall headers over them.
pub struct DatagramBatch {
    data: Vec<u8>,
    slot: usize,
    count: usize,
    /// The last receive filled every slot: more may be waiting.
    filled: bool,
    /// GSO sends: most datagrams per super-datagram ([`gso::BurstLimit`]).
    max_segments: usize,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    mode: Mode,
    /// The switch's lane ports' addresses (empty: one lane, the connected
    /// address), each queued datagram's lane, and room to sort by lane.
    lanes: Vec<libc::sockaddr_in>,
    lane_of: Vec<u8>,
    sorted: Vec<(libc::iovec, u8)>,
}

/// What the batch does beyond one datagram per `mmsghdr`.
enum Mode {
    Plain,
    /// Sends: `hdrs` are the super-datagrams of the last send, each over a
    /// run of `iov`, with its `UDP_SEGMENT` message in `ctrl`.
    Gso {
        ctrl: Vec<Cmsg>,
        coalesced: u64,
    },
    /// Receives: one coalesced buffer per slot, its `UDP_GRO` message in
    /// `ctrl`; `segs` are the datagrams of the last receive as (offset in
    /// `data`, length), at most [`gso::MAX_GRO_SEGMENTS`] per slot.
    Gro {
        ctrl: Vec<Cmsg>,
        segs: Vec<(u32, u32)>,
        coalesced: u64,
    },
}

// SAFETY: the raw pointers in `iov` and `hdrs` point only into this batch's
// own heap buffers (`data`, `iov`), which are never reallocated and move
// with the batch; nothing else holds them, so the batch may change threads.
unsafe impl Send for DatagramBatch {}

/// A batch of no slot, which allocates nothing: what an owner leaves in a
/// batch's place while it lends the batch out ([`std::mem::take`]). A
/// receive on it finds nothing; it sends nothing.
impl Default for DatagramBatch {
    fn default() -> Self {
        DatagramBatch {
            data: Vec::new(),
            slot: 0,
            count: 0,
            filled: false,
            max_segments: gso::MAX_SEGMENTS,
            iov: Vec::new(),
            hdrs: Vec::new(),
            mode: Mode::Plain,
            lanes: Vec::new(),
            lane_of: Vec::new(),
            sorted: Vec::new(),
        }
    }
}

impl DatagramBatch {
    /// `capacity` (≥ 1) slots of `slot` bytes each.
    pub fn new(capacity: usize, slot: usize) -> Self {
        let capacity = capacity.max(1);
        let mut b = DatagramBatch {
            data: vec![0u8; capacity * slot],
            slot,
            count: 0,
            filled: false,
            max_segments: gso::MAX_SEGMENTS,
            // SAFETY: iovec and mmsghdr are plain old data; all-zero is a
            // valid value (null pointers, no name, no control data).
            iov: vec![unsafe { std::mem::zeroed() }; capacity],
            hdrs: (0..capacity)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            mode: Mode::Plain,
            lanes: Vec::new(),
            lane_of: vec![0; capacity],
            // SAFETY: as above, all-zero iovecs are valid.
            sorted: vec![(unsafe { std::mem::zeroed() }, 0); capacity],
        };
        let base = b.data.as_mut_ptr();
        let iov = b.iov.as_mut_ptr();
        for i in 0..capacity {
            // SAFETY: i < capacity: inside `data` and `iov`.
            b.iov[i].iov_base = unsafe { base.add(i * slot) }.cast();
            b.iov[i].iov_len = slot;
            b.hdrs[i].msg_hdr.msg_iov = unsafe { iov.add(i) };
            b.hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        b
    }

    /// A batch that sends runs of equal-length datagrams as one
    /// `UDP_SEGMENT` super-datagram each (see [`gso::plan_gso`]).
    pub fn new_gso(capacity: usize, slot: usize) -> Self {
        let mut b = DatagramBatch::new(capacity, slot);
        b.mode = Mode::Gso {
            ctrl: vec![Cmsg::ZERO; b.capacity()],
            coalesced: 0,
        };
        b
    }

    /// A batch of `capacity` slots of [`gso::GRO_SLOT`] bytes for a socket
    /// with `UDP_GRO` on: each slot takes a whole coalesced buffer.
    pub fn new_gro(capacity: usize) -> Self {
        let mut b = DatagramBatch::new(capacity, gso::GRO_SLOT);
        let n = b.capacity();
        let mut ctrl = vec![Cmsg::ZERO; n];
        for (h, c) in b.hdrs.iter_mut().zip(ctrl.iter_mut()) {
            h.msg_hdr.msg_control = c.0.as_mut_ptr().cast();
        }
        b.mode = Mode::Gro {
            ctrl,
            segs: Vec::with_capacity(n * gso::MAX_GRO_SEGMENTS),
            coalesced: 0,
        };
        b
    }

    /// Sends datagrams queued with [`commit_seq`](Self::commit_seq) to
    /// `switch`'s port + (seq mod `lanes`) (`lanes` a power of two, as
    /// [`proto::wire::seq_lanes_from_wire`] gives; 1: everything to the
    /// connected address). Called at a join, not per send.
    pub fn set_lanes(&mut self, switch: SocketAddrV4, lanes: u16) {
        // Whatever the caller read: a power of two, at most 64.
        let lanes = proto::wire::seq_lanes_from_wire(lanes);
        self.lanes.clear();
        if lanes > 1 {
            let ip = u32::from_ne_bytes(switch.ip().octets());
            self.lanes.extend((0..lanes).map(|l| {
                // SAFETY: sockaddr_in is plain old data; all-zero is valid.
                let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                a.sin_family = libc::AF_INET as libc::sa_family_t;
                a.sin_port = switch.port().wrapping_add(l).to_be();
                a.sin_addr = libc::in_addr { s_addr: ip };
                a
            }));
        }
        for h in &mut self.hdrs {
            h.msg_hdr.msg_name = std::ptr::null_mut();
            h.msg_hdr.msg_namelen = 0;
        }
    }

    /// The lanes set by [`set_lanes`](Self::set_lanes) (1: none).
    pub fn lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    /// GSO sends: at most `n` datagrams per super-datagram from the next
    /// send on (1: one each; the batch still goes in one `sendmmsg`).
    pub fn set_max_segments(&mut self, n: usize) {
        self.max_segments = n.clamp(1, gso::MAX_SEGMENTS);
    }

    /// Datagrams that went out inside a super-datagram of several (GSO), or
    /// arrived in a buffer holding several (GRO), since the batch was made.
    pub fn coalesced(&self) -> u64 {
        match self.mode {
            Mode::Plain => 0,
            Mode::Gso { coalesced, .. } | Mode::Gro { coalesced, .. } => coalesced,
        }
    }

    /// Slots in the batch.
    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Datagrams held (queued to send, or received by the last `recv`).
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn is_full(&self) -> bool {
        self.count == self.capacity()
    }

    /// The next free slot, to be filled and then committed with
    /// [`commit`](Self::commit). None when the batch is full.
    pub fn next_slot(&mut self) -> Option<&mut [u8]> {
        if self.is_full() {
            return None;
        }
        let at = self.count * self.slot;
        Some(&mut self.data[at..at + self.slot])
    }

    /// Queues the slot [`next_slot`](Self::next_slot) returned, `len` bytes.
    pub fn commit(&mut self, len: usize) {
        self.commit_seq(len, 0);
    }

    /// [`commit`](Self::commit) for a DATA of `seq`: it goes to its seq
    /// lane's port.
    pub fn commit_seq(&mut self, len: usize, seq: u32) {
        debug_assert!(!self.is_full() && len <= self.slot);
        self.iov[self.count].iov_len = len.min(self.slot);
        self.lane_of[self.count] = (seq as usize & (self.lanes() - 1)) as u8;
        self.count += 1;
    }

    /// Orders the `n` queued datagrams by lane (stable: each lane's keep
    /// their order) and points each plain `mmsghdr` at its lane's address;
    /// `lane_of` then follows the new order.
    fn sort_by_lane(&mut self, n: usize) {
        let lanes = self.lanes();
        let mut start = [0usize; proto::wire::MAX_SEQ_LANES as usize + 1];
        for &l in &self.lane_of[..n] {
            start[l as usize + 1] += 1;
        }
        for l in 0..lanes {
            start[l + 1] += start[l];
        }
        for i in 0..n {
            let l = self.lane_of[i];
            self.sorted[start[l as usize]] = (self.iov[i], l);
            start[l as usize] += 1;
        }
        let plain = matches!(self.mode, Mode::Plain);
        let lanes = self.lanes.as_mut_ptr();
        for (i, &(v, l)) in self.sorted[..n].iter().enumerate() {
            self.iov[i] = v;
            self.lane_of[i] = l;
            if plain {
                // SAFETY: l < lanes.len() (commit_seq masks it).
                self.hdrs[i].msg_hdr.msg_name = unsafe { lanes.add(l as usize) }.cast();
                self.hdrs[i].msg_hdr.msg_namelen = SOCKADDR_IN_LEN;
            }
        }
    }

    /// Points every slot's `iovec` back at its own buffer (a lane sort
    /// moved them).
    fn restore_iov(&mut self, n: usize) {
        let base = self.data.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < capacity: inside `data`.
            self.iov[i].iov_base = unsafe { base.add(i * self.slot) }.cast();
        }
    }

    /// Datagram `i` of the batch.
    pub fn get(&self, i: usize) -> &[u8] {
        if let Mode::Gro { segs, .. } = &self.mode {
            let (at, len) = segs[i];
            return &self.data[at as usize..(at + len) as usize];
        }
        let at = i * self.slot;
        &self.data[at..at + self.iov[i].iov_len.min(self.slot)]
    }

    /// Points `hdrs[..]` at the super-datagrams of the queued `n` datagrams
    /// (with lanes: sorted by lane, none spanning two); returns how many
    /// there are.
    fn plan_groups(&mut self, n: usize) -> usize {
        let Mode::Gso { ctrl, coalesced } = &mut self.mode else {
            return n;
        };
        let (iov, hdrs) = (&mut self.iov, &mut self.hdrs);
        let lens: &[libc::iovec] = iov;
        let base = lens.as_ptr() as *mut libc::iovec;
        let lanes = self.lanes.as_mut_ptr();
        let many = !self.lanes.is_empty();
        let mut groups = 0;
        let mut run = 0;
        while run < n {
            let lane = self.lane_of[run];
            let end = run
                + self.lane_of[run..n]
                    .iter()
                    .take_while(|&&l| l == lane)
                    .count();
            gso::plan_gso(
                end - run,
                self.max_segments,
                |i| lens[run + i].iov_len,
                |g| {
                    let h = &mut hdrs[groups].msg_hdr;
                    // SAFETY: run + g.start < n ≤ capacity: inside `iov`.
                    h.msg_iov = unsafe { base.add(run + g.start) };
                    if many {
                        // SAFETY: lane < lanes.len() (commit_seq masks it).
                        h.msg_name = unsafe { lanes.add(lane as usize) }.cast();
                        h.msg_namelen = SOCKADDR_IN_LEN;
                    }
                    h.msg_iovlen = g.count as _;
                    if g.count > 1 {
                        let clen = gso::write_segment_cmsg(&mut ctrl[groups], g.segment as u16);
                        h.msg_control = ctrl[groups].0.as_mut_ptr().cast();
                        h.msg_controllen = clen as _;
                        *coalesced += g.count as u64;
                    } else {
                        h.msg_control = std::ptr::null_mut();
                        h.msg_controllen = 0;
                    }
                    groups += 1;
                },
            );
            run = end;
        }
        groups
    }

    /// Sends every queued datagram on the connected socket `fd` and empties
    /// the batch. A full socket buffer or an ICMP error counts as loss of
    /// the datagrams not yet sent (the resend timer covers them), as with a
    /// plain `send`; any other error is returned.
    pub fn send_all(&mut self, fd: RawFd) -> io::Result<()> {
        let queued = self.count;
        if !self.lanes.is_empty() {
            self.sort_by_lane(queued);
        }
        let n = self.plan_groups(queued);
        self.count = 0;
        let r = self.send_groups(fd, n);
        if !self.lanes.is_empty() {
            self.restore_iov(queued);
        }
        r
    }

    /// `sendmmsg` of `hdrs[..n]`, until all went or the kernel refused.
    fn send_groups(&mut self, fd: RawFd, n: usize) -> io::Result<()> {
        let mut sent = 0;
        while sent < n {
            // SAFETY: hdrs[sent..n] are valid mmsghdrs whose iovecs point
            // into `data`, which outlives the call.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs.as_mut_ptr().add(sent),
                    (n - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ENOBUFS | libc::ECONNREFUSED) => break,
                _ => return Err(e),
            }
        }
        Ok(())
    }

    /// In GRO mode, indexes the datagrams inside the `n` buffers received
    /// and sets `count` to how many there are.
    fn split_received(&mut self, n: usize) {
        let Mode::Gro {
            segs, coalesced, ..
        } = &mut self.mode
        else {
            return;
        };
        segs.clear();
        for i in 0..n {
            // SAFETY: the kernel wrote this header's control data.
            let gso_size = unsafe { gso::gro_segment(&self.hdrs[i].msg_hdr) };
            let len = self.iov[i].iov_len;
            let base = i * self.slot;
            let before = segs.len();
            for (at, l) in gso::split_gro(len, gso_size).take(gso::MAX_GRO_SEGMENTS) {
                segs.push(((base + at) as u32, l as u32));
            }
            let got = segs.len() - before;
            if got > 1 {
                *coalesced += got as u64;
            }
        }
        self.count = segs.len();
    }

    /// Whether the last [`DatagramBatch::recv`] filled every slot: more
    /// datagrams may be waiting. A receive that did not fill them found the
    /// socket drained (it never blocks): the caller need not ask again
    /// before it waits.
    pub fn filled(&self) -> bool {
        self.filled
    }

    /// Receives up to `capacity` datagrams (GRO mode: buffers, each holding
    /// one or more datagrams) from `fd` without blocking; returns how many
    /// datagrams arrived (0 when none was waiting). Read them with
    /// [`get`](Self::get).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.count = 0;
        for v in &mut self.iov {
            v.iov_len = self.slot;
        }
        if let Mode::Gro { ctrl, .. } = &self.mode {
            for (h, c) in self.hdrs.iter_mut().zip(ctrl) {
                h.msg_hdr.msg_controllen = std::mem::size_of_val(c) as _;
            }
        }
        loop {
            // SAFETY: `capacity` valid mmsghdrs whose iovecs point into
            // `data`; no timeout.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    self.hdrs.len() as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                let n = r as usize;
                for i in 0..n {
                    self.iov[i].iov_len = (self.hdrs[i].msg_len as usize).min(self.slot);
                }
                self.count = n;
                self.filled = n == self.hdrs.len();
                self.split_received(n);
                return Ok(self.count);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ECONNREFUSED) => {
                    self.filled = false;
                    return Ok(0);
                }
                _ => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_batch_crosses_loopback_intact_and_in_order() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        let mut tx = DatagramBatch::new(BATCH, SLOT);
        let mut want = Vec::new();
        for i in 0..BATCH {
            let len = 1 + i * 37;
            let payload: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            tx.next_slot().unwrap()[..len].copy_from_slice(&payload);
            tx.commit(len);
            want.push(payload);
        }
        assert!(tx.is_full() && tx.next_slot().is_none());
        tx.send_all(a.as_raw_fd()).unwrap();
        assert!(tx.is_empty());

        let mut rx = DatagramBatch::new(BATCH, SLOT);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < BATCH && std::time::Instant::now() < deadline {
            let n = rx.recv(b.as_raw_fd()).unwrap();
            got.extend((0..n).map(|i| rx.get(i).to_vec()));
        }
        assert_eq!(got, want);
        assert_eq!(rx.recv(b.as_raw_fd()).unwrap(), 0, "nothing more waiting");
    }

    /// The stand-in left while a batch is lent out takes nothing from the
    /// socket: what is waiting stays there for the real batch.
    #[test]
    fn the_default_batch_receives_nothing() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.set_nonblocking(true).unwrap();
        a.send(&[3u8; 10]).unwrap();
        let mut none = DatagramBatch::default();
        assert_eq!(none.capacity(), 0);
        assert_eq!(none.recv(b.as_raw_fd()).unwrap(), 0);
        let mut rx = DatagramBatch::new(4, 64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while rx.recv(b.as_raw_fd()).unwrap() == 0 && std::time::Instant::now() < deadline {}
        assert_eq!(rx.get(0), [3u8; 10]);
    }

    #[test]
    fn a_long_datagram_is_cut_to_the_slot() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        a.send(&[7u8; 100]).unwrap();
        let mut rx = DatagramBatch::new(4, 64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut n = 0;
        while n == 0 && std::time::Instant::now() < deadline {
            n = rx.recv(b.as_raw_fd()).unwrap();
        }
        assert_eq!(n, 1);
        assert_eq!(rx.get(0), &[7u8; 64][..]);
    }

    /// Payloads of `lens` bytes, each distinct.
    fn payloads(lens: &[usize]) -> Vec<Vec<u8>> {
        lens.iter()
            .enumerate()
            .map(|(i, &l)| (0..l).map(|k| (k * 13 + i * 7) as u8).collect())
            .collect()
    }

    fn send_gso(a: &UdpSocket, want: &[Vec<u8>]) -> DatagramBatch {
        let mut tx = DatagramBatch::new_gso(BATCH, SLOT);
        for p in want {
            tx.next_slot().unwrap()[..p.len()].copy_from_slice(p);
            tx.commit(p.len());
        }
        tx.send_all(a.as_raw_fd()).unwrap();
        tx
    }

    fn recv_until(rx: &mut DatagramBatch, fd: RawFd, n: usize) -> Vec<Vec<u8>> {
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < n && std::time::Instant::now() < deadline {
            let k = rx.recv(fd).unwrap();
            got.extend((0..k).map(|i| rx.get(i).to_vec()));
        }
        got
    }

    /// Loopback hands a GSO send whole to a socket with UDP_GRO on: one
    /// buffer, which the batch splits back into the datagrams sent.
    #[test]
    fn a_gso_send_arrives_whole_at_a_gro_socket_and_splits_into_its_datagrams() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        gso::set_gro(b.as_raw_fd(), true).unwrap();
        let mut lens = vec![1000; 20];
        lens.push(300);
        lens.extend([700; 5]);
        let want = payloads(&lens);
        let tx = send_gso(&a, &want);
        assert_eq!(tx.coalesced(), 26, "two super-datagrams of 21 and 5");

        let mut rx = DatagramBatch::new_gro(4);
        let got = recv_until(&mut rx, b.as_raw_fd(), want.len());
        assert_eq!(got, want);
        assert_eq!(rx.coalesced(), 26, "both arrived whole, not segmented");
    }

    /// A socket without UDP_GRO gets a GSO send as separate datagrams.
    #[test]
    fn a_gso_send_reaches_a_plain_socket_as_separate_datagrams() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        let want = payloads(&[1470, 1470, 1470, 90]);
        send_gso(&a, &want);
        let mut rx = DatagramBatch::new(BATCH, SLOT);
        assert_eq!(recv_until(&mut rx, b.as_raw_fd(), want.len()), want);
    }
}
