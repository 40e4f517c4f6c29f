//! What every connection task of the server shares ([`Endpoint`]: the
//! control channel, the limits, the endpoint's counters, the open
//! connections, the last rendered snapshot) and [`OpenGuard`], a
//! connection's place in the limit.
//!
//! Invariant: `open` counts the connections whose task is alive: an
//! [`OpenGuard`] is made with each increment and gives it back on drop.

#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use crate::admin::AdminCall;
use crate::supervise::Health;

use super::counters::EndpointCounters;
use super::limits::{Content, Limits};

/// What every connection task shares.
pub(super) struct Endpoint {
    pub(super) calls: mpsc::Sender<AdminCall>,
    pub(super) content: Content,
    pub(super) limits: Limits,
    pub(super) counters: Mutex<EndpointCounters>,
    pub(super) health: Arc<Health>,
    pub(super) open: AtomicUsize,
    /// The switch's counters as last rendered, and when they were taken.
    pub(super) rendered: Mutex<Option<(Instant, Arc<String>)>>,
    /// Tests: make the accept loop panic at its next connection.
    #[cfg(test)]
    pub(super) panic_on_accept: AtomicBool,
}

impl Endpoint {
    pub(super) fn count(&self, f: impl FnOnce(&mut EndpointCounters)) {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(super) fn counters(&self) -> EndpointCounters {
        let mut c = self
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        c.restarts = self.health.restarts.load(Ordering::Relaxed);
        c
    }
}

/// Releases a connection's place in the limit when its task ends.
pub(super) struct OpenGuard(pub(super) Arc<Endpoint>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}
