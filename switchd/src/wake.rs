//! Wakes a dataplane thread that sleeps in `poll(2)` when another thread
//! hands it work: a RESULT or JOIN_ACK for a member behind one of its
//! sockets (the outboxes of [`crate::dataplane`]).
//!
//! Owns: [`ThreadWaker`], an eventfd that the thread polls beside its
//! sockets, and a flag that says the thread is asleep or about to be.
//!
//! Why: a thread with nothing to receive sleeps in `poll(2)` (up to 10 ms)
//! on its AF_XDP sockets only. Without a wake-up, a RESULT handed to it
//! while it slept waited for the timeout or for the next frame on its own
//! sockets, so with 2 dataplane threads a closed loop of workers stalled for
//! milliseconds at a time.
//!
//! Invariants: no wake-up is lost and no syscall is made per packet. The
//! sleeper calls [`ThreadWaker::prepare_sleep`], then checks its outbox
//! once more, then polls, then calls [`ThreadWaker::woke`]. A thread that
//! handed it work calls [`ThreadWaker::wake`] after the push: it clears the
//! flag with one atomic swap and writes the eventfd only if the flag was
//! set, so a sleep costs at most one `write(2)` whatever the number of
//! hand-offs. Both sides order their flag access and the queue access with
//! SeqCst fences, so either the sleeper's re-check sees the pushed item, or
//! the pusher sees the flag and writes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};

/// One thread's wake-up: a flag and an eventfd.
#[derive(Debug)]
pub struct ThreadWaker {
    sleeping: AtomicBool,
    fd: OwnedFd,
}

impl ThreadWaker {
    /// A nonblocking eventfd with the flag clear.
    pub fn new() -> io::Result<ThreadWaker> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new
        // fd that nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            // Keep the errno's kind (EMFILE, ENOMEM, …) for the caller.
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("eventfd: {e}")));
        }
        Ok(ThreadWaker {
            sleeping: AtomicBool::new(false),
            // SAFETY: fd is a fresh, valid descriptor owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor to poll for `POLLIN` beside the thread's sockets.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The owning thread is about to sleep. It must check for handed work
    /// after this call and before it polls.
    pub fn prepare_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The owning thread is awake again (after `poll(2)` returned, or when
    /// its re-check found work): clears the flag, and the eventfd's count
    /// when `poll(2)` reported the eventfd readable.
    pub fn woke(&self, fd_readable: bool) {
        self.sleeping.store(false, Ordering::SeqCst);
        if !fd_readable {
            return;
        }
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a local u64 from our own eventfd;
        // nonblocking, so EAGAIN (nothing written) returns at once.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut count as *mut u64).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    /// Called by another thread after it handed this thread work: wakes it
    /// if it sleeps. Returns whether an eventfd write was made.
    pub fn wake(&self) -> bool {
        fence(Ordering::SeqCst);
        // Load first: an awake thread's flag stays shared in every cache,
        // where a swap per hand-off would bounce its line between cores.
        if !self.sleeping.load(Ordering::SeqCst) || !self.sleeping.swap(false, Ordering::SeqCst) {
            return false;
        }
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local u64 to our own eventfd. It can
        // only fail with EAGAIN when the counter is near u64::MAX, which
        // one write per sleep never reaches; the thread wakes at its poll
        // timeout in any case.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn poll_in(fd: RawFd, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack.
        let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn a_sleeping_thread_is_woken_by_the_fd_not_by_its_timeout() {
        let w = Arc::new(ThreadWaker::new().expect("eventfd"));
        w.prepare_sleep();
        let pusher = {
            let w = w.clone();
            std::thread::spawn(move || w.wake())
        };
        // A minute-long poll returns readable only because of the write.
        assert!(
            poll_in(w.fd(), 60_000),
            "poll returned without the eventfd readable"
        );
        assert!(pusher.join().unwrap(), "the pusher saw the flag and wrote");
        w.woke(true);
        assert!(!poll_in(w.fd(), 0), "woke() drains the eventfd");
    }

    #[test]
    fn an_awake_thread_costs_no_write_and_one_sleep_at_most_one() {
        let w = ThreadWaker::new().expect("eventfd");
        assert!(!w.wake(), "not sleeping: no write");
        w.prepare_sleep();
        assert!(w.wake());
        assert!(!w.wake(), "the first hand-off cleared the flag");
        assert!(poll_in(w.fd(), 0));
        w.woke(true);
        assert!(!poll_in(w.fd(), 0));
    }
}
