//! Batches of datagrams for `sendmmsg(2)` / `recvmmsg(2)` on a UDP socket:
//! one syscall moves a whole batch, where a `send`/`recv` per chunk cost two
//! syscalls per chunk per worker (about 90 k syscalls per worker for a
//! 64 MiB all-reduce). Used by the worker's transport (connected socket) and
//! by `aggblast` (bench/src/blast.rs) for rank 0's RESULTs.
//!
//! Owns: [`DatagramBatch`], `capacity` slots of `slot` bytes and their
//! `iovec`/`mmsghdr`s, all allocated once in [`DatagramBatch::new`]; the
//! headers point into the slots' heap buffer, which never moves or grows.
//!
//! Hand-written on `libc` because std and socket2 have no `sendmmsg` /
//! `recvmmsg`, and the calls are two: a wrapper crate would add more surface
//! than it saves.

use std::io;
use std::os::fd::RawFd;

/// Datagrams per syscall on the worker's transport.
pub const BATCH: usize = 32;
/// Bytes per slot on the worker's transport: a jumbo-frame datagram fits.
pub const SLOT: usize = 9216;

/// Datagram buffers with their lengths and the syscall headers over them.
pub struct DatagramBatch {
    data: Vec<u8>,
    slot: usize,
    count: usize,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iov` and `hdrs` point only into this batch's
// own heap buffers (`data`, `iov`), which are never reallocated and move
// with the batch; nothing else holds them, so the batch may change threads.
unsafe impl Send for DatagramBatch {}

impl DatagramBatch {
    /// `capacity` (≥ 1) slots of `slot` bytes each.
    pub fn new(capacity: usize, slot: usize) -> Self {
        let capacity = capacity.max(1);
        let mut b = DatagramBatch {
            data: vec![0u8; capacity * slot],
            slot,
            count: 0,
            // SAFETY: iovec and mmsghdr are plain old data; all-zero is a
            // valid value (null pointers, no name, no control data).
            iov: vec![unsafe { std::mem::zeroed() }; capacity],
            hdrs: (0..capacity)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
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
        debug_assert!(!self.is_full() && len <= self.slot);
        self.iov[self.count].iov_len = len.min(self.slot);
        self.count += 1;
    }

    /// Datagram `i` of the batch.
    pub fn get(&self, i: usize) -> &[u8] {
        let at = i * self.slot;
        &self.data[at..at + self.iov[i].iov_len.min(self.slot)]
    }

    /// Sends every queued datagram on the connected socket `fd` and empties
    /// the batch. A full socket buffer or an ICMP error counts as loss of
    /// the datagrams not yet sent (the resend timer covers them), as with a
    /// plain `send`; any other error is returned.
    pub fn send_all(&mut self, fd: RawFd) -> io::Result<()> {
        let n = self.count;
        self.count = 0;
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

    /// Receives up to `capacity` datagrams from `fd` without blocking;
    /// returns how many arrived (0 when none was waiting). Read them with
    /// [`get`](Self::get).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.count = 0;
        for v in &mut self.iov {
            v.iov_len = self.slot;
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
                return Ok(n);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::ECONNREFUSED) => return Ok(0),
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
}
