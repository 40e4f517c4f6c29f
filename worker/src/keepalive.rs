//! Between collectives: a self-provisioned job's lease kept while the
//! caller is idle ([`Worker::keepalive`](crate::Worker::keepalive)), and a
//! session lost meanwhile joined again by the next collective.
//!
//! Owns: when the worker's `rejoin_due` and `failed` are set (while idle)
//! and how the next collective acts on them. Invariants: the keepalive
//! never blocks, so a rejoin waits for the next collective (the other
//! ranks may stay idle longer than a join may take); a session failed for
//! good fails every later call with the same error.

use std::time::{Duration, Instant};

use proto::member::Event as MemberEvent;
use proto::session::{Lost, SessionError};

use crate::{Worker, WorkerError};

impl Worker {
    /// How often [`Worker::keepalive`] should run while this worker is idle
    /// between collectives: a third of a self-provisioned job's lease, at
    /// most 20 s (docs/PROTOCOL.md, "Leases"). `None` for a declared
    /// job, which has no lease.
    pub fn keepalive_interval(&self) -> Option<Duration> {
        self.member.session().keepalive()
    }

    /// Keeps a self-provisioned job's lease while the caller is idle
    /// between collectives (evaluation, checkpointing): takes what the
    /// switch sent, and sends the keepalive HEARTBEAT when one is due. It
    /// never blocks; call it at least every [`Worker::keepalive_interval`]
    /// (more often is harmless: it sends only when due). A declared job
    /// needs none: this does nothing then but take stray datagrams.
    ///
    /// If the switch lost the job meanwhile (removed, restarted, or made
    /// again by another rank), the next collective joins it again first,
    /// from where this rank stopped; the error is only a socket failure or
    /// a final refusal.
    pub fn keepalive(&mut self) -> Result<(), WorkerError> {
        if let Some(e) = self.failed {
            return Err(self.session_failed(e));
        }
        if self.rejoin_due {
            return Ok(());
        }
        while let Some(n) = self.recv()? {
            match self.member.handle(&self.rx[..n], Instant::now()) {
                Some(MemberEvent::Rejoining(why)) => return self.defer_rejoin(why),
                Some(MemberEvent::Failed(e)) => return Err(self.failed_idle(e)),
                // Late RESULTs of the last collective, HEARTBEAT answers.
                _ => {}
            }
            self.send_control(Instant::now())?;
        }
        let now = Instant::now();
        match self.member.handle_timeout(now) {
            Some(MemberEvent::Rejoining(why)) => return self.defer_rejoin(why),
            Some(MemberEvent::Failed(e)) => return Err(self.failed_idle(e)),
            _ => {}
        }
        self.send_control(now)
    }

    /// The session failed for good while idle: kept, so that the next
    /// collective fails with the same error instead of waiting.
    fn failed_idle(&mut self, e: SessionError) -> WorkerError {
        self.failed = Some(e);
        self.session_failed(e)
    }

    /// The session was lost while idle: the rejoin waits for the next
    /// collective (the other ranks may stay idle longer than a join may
    /// take), which starts it afresh.
    fn defer_rejoin(&mut self, why: Lost) -> Result<(), WorkerError> {
        tracing::info!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            ?why,
            "switch lost our session between collectives; the next collective joins again"
        );
        self.rejoin_due = true;
        Ok(())
    }

    /// Joins again before collective `collective` (at `first_seq`) if the
    /// session was lost while idle ([`Worker::keepalive`]); returns the
    /// JOIN_ACK's resume point then.
    pub(crate) fn rejoin_if_due(
        &mut self,
        collective: u32,
        first_seq: u32,
    ) -> Result<Option<(u32, u32)>, WorkerError> {
        if !std::mem::take(&mut self.rejoin_due) {
            return Ok(None);
        }
        self.member
            .start_join(collective, first_seq, Instant::now());
        self.join_round().map(Some)
    }
}
