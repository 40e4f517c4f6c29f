//! Drives one collective to its end over T threads, through re-joins
//! (docs/design/worker-threads.md): thread 0 runs share 0 and every
//! control message here, lane threads run the other shares
//! (threads.rs); after a re-join every share resends from the resume
//! point, or the previous collective is contributed again first.
//!
//! Owns: which shares carry the collective (`set_shares`), thread 0's
//! loop and the lane threads' lifetime (scoped to one `drive_all`).
//! Invariants: a re-join starts from the oldest unanswered seq of every
//! share; the sockets are drained before anything is sent, and the loop
//! blocks in `poll(2)` only when it has nothing to send and nothing has
//! arrived.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use proto::member::{Event as MemberEvent, Member, Shape, Waiting};
use proto::seq::serial_offset;
use proto::session::{Lost, SessionError};
use proto::wire::NackReason;

use crate::buffers::{Input, Output};
use crate::error::io_err;
use crate::threads::{self, Lane, LaneJob, Progress};
use crate::{Worker, WorkerError};

/// What the receive loop learned.
enum Event {
    /// The collective finished.
    Completed,
    /// The switch asked us to re-join (an authenticated NACK 6/7, or a probe
    /// answered under a new gen); done, at this resume point.
    Resumed { collective: u32, seq: u32 },
}

/// How thread 0's loop ended.
enum Drive {
    /// Every share of the collective is complete.
    Completed,
    /// The switch lost our session (`why`) and the member started joining
    /// again: the caller rejoins from the oldest unanswered seq of every
    /// share.
    Lost(Lost),
    /// A lane thread failed; its error says why.
    LaneFailed,
}

impl Worker {
    /// Drives the member's current collective (`cur`: its id, first seq
    /// and shape) to its end, through re-joins; `resume`: a rejoin before
    /// it started gave this resume point.
    pub(crate) fn run_collective(
        &mut self,
        cur: (u32, u32, Shape),
        resume: Option<(u32, u32)>,
        input: Input<'_>,
        out: Option<Output<'_>>,
    ) -> Result<(), WorkerError> {
        let mut pending = resume.map(|(collective, seq)| Event::Resumed { collective, seq });
        loop {
            let ev = match pending.take() {
                Some(ev) => ev,
                None => self.drive_all(input, out)?,
            };
            match ev {
                Event::Completed => return Ok(()),
                Event::Resumed { collective, seq } => {
                    if collective == cur.0 {
                        self.restart_all(seq);
                    } else if Some(collective) == self.prev_collective
                        && serial_offset(self.prev_first_seq, seq) >= 0
                    {
                        self.catch_up_previous(seq)?;
                        // Ours again, from its first chunk.
                        self.set_shares(self.active);
                        self.begin_all(cur.0, cur.1, cur.2);
                    } else {
                        return Err(WorkerError::ResumeOutOfReach {
                            job: self.cfg.job,
                            rank: self.cfg.rank,
                            resume_collective: collective,
                            resume_seq: seq,
                            collective: cur.0,
                        });
                    }
                }
            }
        }
    }

    /// Re-contributes the previous collective from `seq` (another rank lost
    /// its last RESULTs); our own results of it are already delivered.
    fn catch_up_previous(&mut self, seq: u32) -> Result<(), WorkerError> {
        let prev = std::mem::take(&mut self.prev_input);
        let c = self.prev_collective.unwrap_or(0);
        self.set_shares(self.active);
        self.begin_all(c, self.prev_first_seq, self.prev_shape);
        // This rank has every RESULT of it: the chunks before the resume
        // point are owed to nobody (a restarted switch, whose floor is
        // there, would never answer them), those from it on are resent.
        for m in self.shares_mut() {
            m.answered_before(seq);
        }
        self.restart_all(seq);
        let r = loop {
            match self.drive_all(Input::Whole(prev.bytes()), None) {
                Ok(Event::Completed) => break Ok(()),
                Ok(Event::Resumed { collective, seq }) if collective == c => self.restart_all(seq),
                Ok(Event::Resumed { collective, seq }) => {
                    break Err(WorkerError::ResumeOutOfReach {
                        job: self.cfg.job,
                        rank: self.cfg.rank,
                        resume_collective: collective,
                        resume_seq: seq,
                        collective: c,
                    })
                }
                Err(e) => break Err(e),
            }
        };
        self.prev_input = prev;
        r
    }

    /// Drives the collective the shares began to its end over
    /// `self.active` threads, through re-joins (performed here).
    fn drive_all(
        &mut self,
        input: Input<'_>,
        out: Option<Output<'_>>,
    ) -> Result<Event, WorkerError> {
        let t = self.active;
        let sock0 = self.sock.as_raw_fd();
        let fds: Vec<Vec<RawFd>> = (0..t)
            .map(|i| self.lane_socks.fds_of(sock0, i, t))
            .collect();
        if t <= 1 {
            return match self.drive(&fds[0], input, out, None)? {
                Drive::Lost(why) => self.rejoin(why),
                _ => Ok(Event::Completed),
            };
        }
        let mut lanes = std::mem::take(&mut self.lanes);
        let progress = Progress::new(t);
        let job = LaneJob {
            switch: self.cfg.switch,
            dtype: self.cfg.dtype,
            input,
            out,
            progress: &progress,
        };
        let (r0, rest) = std::thread::scope(|s| {
            let handles: Vec<_> = lanes[..t - 1]
                .iter_mut()
                .zip(&fds[1..])
                .enumerate()
                .map(|(i, (lane, fds))| {
                    s.spawn(move || {
                        let r = threads::lane_loop(i + 1, lane, fds, job);
                        if r.is_err() {
                            job.progress.stop();
                        }
                        r
                    })
                })
                .collect();
            let r0 = self.drive(&fds[0], input, out, Some(&progress));
            // Whatever thread 0 saw, the lanes end now (after a completion
            // they have ended already).
            progress.stop();
            let rest: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (r0, rest)
        });
        self.lanes = lanes;
        // A lane's failure first: it is why thread 0 stopped.
        for r in rest {
            match r {
                Ok(r) => r?,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        match r0? {
            Drive::Completed => Ok(Event::Completed),
            Drive::Lost(why) => self.rejoin(why),
            Drive::LaneFailed => unreachable!("a lane's error is returned above"),
        }
    }

    /// Thread 0's loop: sends and receives share 0 of the collective on
    /// `fds` (socket 0 and its lanes' sockets), takes every control
    /// message, and watches the lane threads (`progress`) until every share
    /// is complete, the switch loses the session, or a lane fails.
    fn drive(
        &mut self,
        fds: &[RawFd],
        input: Input<'_>,
        out: Option<Output<'_>>,
        progress: Option<&Progress>,
    ) -> Result<Drive, WorkerError> {
        let lanes_done = |p: Option<&Progress>| p.is_none_or(|p| p.lanes_done());
        while !self.member.is_complete() || !lanes_done(progress) {
            if progress.is_some_and(|p| p.stopped()) {
                return Ok(Drive::LaneFailed);
            }
            // Results first: a worker that was not scheduled for a while has
            // RESULTs waiting, and its resend timers must not fire for them.
            // The batch is lent out of `self` for the drain, as
            // `on_datagram` needs the rest of it (the placeholder allocates
            // nothing; the transport, which may replace the batch, is
            // settled at the first join, before any collective).
            debug_assert!(!self.probe_gso, "the transport is settled");
            let mut rxb = std::mem::take(&mut self.rxb);
            let lost = threads::drain(&mut rxb, fds, self.cfg.switch, |d| {
                self.on_datagram(d, input, out, progress)
            });
            self.rxb = rxb;
            if let Some(lost) = lost? {
                return Ok(Drive::Lost(lost));
            }
            let now = Instant::now();
            if !self.member.is_complete() {
                threads::send_share(
                    &mut self.member,
                    &mut self.txb,
                    &mut self.burst,
                    self.sock.as_raw_fd(),
                    input,
                    now,
                )
                .map_err(io_err("sendmmsg", self.cfg.switch))?;
            }
            if self.member.is_complete() && lanes_done(progress) {
                break;
            }
            let now = Instant::now();
            let c = self.member.collective();
            let own = (!c.is_complete())
                .then(|| (c.oldest_unacked_seq(), c.last_progress().unwrap_or(now)));
            let watched = match progress {
                Some(p) => p.watched(own),
                None => own,
            };
            match self.member.handle_timeout_watching(now, watched) {
                Some(MemberEvent::Stalled {
                    collective,
                    seq,
                    waited,
                    waiting,
                }) => {
                    let (missing, upstream) = match waiting {
                        Some(Waiting::Ranks(r)) => (Some(r), None),
                        Some(Waiting::Spine(w)) => (None, Some(w)),
                        None => (None, None),
                    };
                    return Err(WorkerError::Stalled {
                        job: self.cfg.job,
                        rank: self.cfg.rank,
                        collective,
                        seq,
                        waited,
                        missing,
                        upstream,
                    });
                }
                Some(MemberEvent::Failed(e)) => return Err(self.session_failed(e)),
                // The switch made our provisioned job again without us.
                Some(MemberEvent::Rejoining(why)) => return Ok(Drive::Lost(why)),
                _ => {}
            }
            // The lanes' probes go out as share 0's do, one HEARTBEAT each
            // (the session's own probe went with share 0's send).
            if let Some(p) = progress {
                for t in 1..self.active {
                    if let Some(seq) = p.take_probe(t) {
                        self.member.ask_about(seq);
                    }
                }
            }
            // A HEARTBEAT, when the member wants one.
            self.send_control(now)?;
            // Every socket is drained: sleep until a datagram or the next
            // timer (a RESULT that came meanwhile returns at once). At a
            // bottleneck each wake then costs one receive, one send and
            // this poll. Lanes that hold wake this thread at their timers,
            // whose expiry may ask for a probe.
            let own = match self.member.collective().next_timeout() {
                Some(d) if !self.member.is_complete() => Some(d),
                _ => None,
            };
            let lanes = progress
                .filter(|_| self.cfg.transport.straggler_hold)
                .and_then(|p| p.next_lane_wake(now));
            let until = match (own, lanes) {
                (Some(a), Some(b)) => a.min(b).saturating_duration_since(now),
                (Some(a), None) => a.saturating_duration_since(now),
                // Share 0 is complete and the lanes are not: a lane's
                // completion wakes nothing here, so look again soon
                // (the collective ends at most this much after its
                // last share).
                _ if progress.is_some() => Duration::from_millis(1),
                _ => Duration::from_millis(50),
            };
            threads::wait_turn(fds, until);
        }
        Ok(Drive::Completed)
    }

    /// Handles `datagram`, one of thread 0's turn (`input`: the
    /// collective's, for a reduce-scatter's kept shard; `progress`: the
    /// lane threads', which a HEARTBEAT answer about their seq goes to);
    /// the session lost, if the datagram said so.
    fn on_datagram(
        &mut self,
        datagram: &[u8],
        input: Input<'_>,
        out: Option<Output<'_>>,
        progress: Option<&Progress>,
    ) -> Result<Option<Lost>, WorkerError> {
        let now = Instant::now();
        let ev = self.member.handle(datagram, now);
        // A probe, if the datagram made the session ask the switch.
        self.send_control(now)?;
        match ev {
            Some(ev @ MemberEvent::Result { .. }) => {
                threads::write_result(&ev, datagram, self.cfg.dtype, input, out);
                Ok(None)
            }
            Some(MemberEvent::Rejoining(why)) => Ok(Some(why)),
            // A lane's probe answered: its thread holds on it.
            Some(MemberEvent::ShareProbeAnswer { seq, answer }) => {
                if let Some(p) = progress {
                    p.answer(seq, answer, now);
                }
                Ok(None)
            }
            Some(MemberEvent::Failed(SessionError::Refused(NackReason::KindNotSupported))) => {
                Err(WorkerError::KindNotSupported {
                    job: self.cfg.job,
                    rank: self.cfg.rank,
                    kind: self.member.collective().shape().kind(),
                })
            }
            Some(MemberEvent::Failed(e)) => Err(self.session_failed(e)),
            _ => Ok(None),
        }
    }

    /// The member lost its session (`why`) and started joining again: joins
    /// (blocking, as the first join) from the oldest unanswered seq of
    /// every share, and returns the resume point. With one share the
    /// member's own join is that; with more, a lane's hole may lie below
    /// share 0's, and a rejoin from share 0's would leave it below the new
    /// switch's floor (docs/design/worker-threads.md).
    fn rejoin(&mut self, why: Lost) -> Result<Event, WorkerError> {
        let c = self.member.collective();
        let (collective, first) = (c.collective(), c.first_seq());
        let oldest = threads::oldest_seq(
            first,
            std::iter::once(c.oldest_unacked_seq()).chain(
                self.lanes[..self.active - 1]
                    .iter()
                    .map(|l| l.member.collective().oldest_unacked_seq()),
            ),
        );
        tracing::info!(
            job = self.cfg.job,
            rank = self.cfg.rank,
            collective,
            seq = oldest,
            ?why,
            "switch lost our session (restart, re-join or job made again); joining again"
        );
        if self.active > 1 && oldest != c.oldest_unacked_seq() {
            self.member.start_join(collective, oldest, Instant::now());
        }
        let (collective, seq) = self.join_round()?;
        Ok(Event::Resumed { collective, seq })
    }

    /// Threads for a collective of `chunks` chunks: the configured count
    /// (or [`threads::auto_threads`]'s), a power of two no larger than the
    /// lanes whose replies the switch grants, nor than the chunks.
    pub(crate) fn threads_for(&self, chunks: u32) -> usize {
        let lanes = self.lane_socks.lanes();
        if lanes <= 1 {
            return 1;
        }
        let want = match self.cfg.threads {
            0 => {
                let (cpus, local) = threads::host_share();
                threads::auto_threads(chunks, cpus, local)
            }
            t => t.min(chunks.max(1) as usize),
        };
        threads::pow2_floor(want.min(lanes))
    }

    /// Shares 0..`t` for the collectives from now on (fewer when the last
    /// join granted fewer lanes): the member carries share 0, lane `i`
    /// share `i + 1`, each lane following the session of the last join.
    pub(crate) fn set_shares(&mut self, t: usize) {
        // Both powers of two: the smaller divides the larger.
        let t = t.min(self.lane_socks.lanes()).max(1);
        self.active = t;
        self.member.set_share(0, t as u32);
        let lanes = self.member.seq_lanes();
        while self.lanes.len() < t - 1 {
            let share = self.lanes.len() as u32 + 1;
            let mut member = self.member.lane(share, t as u32);
            // Thread 0 sends its probes and hands it their answers
            // (threads::Progress): the lane holds as share 0 does.
            member.relay_probes(true);
            let mut lane = Lane::new(member, self.kind, self.cfg.switch, lanes);
            lane.followed = self.joins;
            self.lanes.push(lane);
        }
        for (i, lane) in self.lanes[..t - 1].iter_mut().enumerate() {
            lane.member.set_share(i as u32 + 1, t as u32);
            if lane.followed != self.joins {
                lane.member.follow(&self.member);
                lane.txb.set_lanes(self.cfg.switch, lanes);
                lane.followed = self.joins;
            }
        }
    }

    /// The members of the shares carrying the collective: share 0's and the
    /// active lanes'.
    fn shares_mut(&mut self) -> impl Iterator<Item = &mut Member> {
        std::iter::once(&mut self.member).chain(
            self.lanes[..self.active - 1]
                .iter_mut()
                .map(|l| &mut l.member),
        )
    }

    /// Every share of this collective begins collective `collective` of
    /// `shape` at `first_seq`.
    pub(crate) fn begin_all(&mut self, collective: u32, first_seq: u32, shape: Shape) {
        for m in self.shares_mut() {
            m.begin(collective, first_seq, shape);
        }
    }

    /// Every share resends from `seq` (a JOIN_ACK's resume point), after
    /// following the session that joined. A switch that came back with
    /// fewer lanes than this collective's threads gets the rest of it on
    /// fewer threads: every share begins it again, counts the chunks
    /// before `seq` as answered (their RESULTs are here: `seq` is at most
    /// this rank's oldest unanswered one) and resends from `seq`. A
    /// `stats = true` job's trailers that the old shares got go to the new
    /// share 0, so the collective's statistics are whole again once the
    /// rest is answered (docs/PROTOCOL.md, "Gradient statistics").
    fn restart_all(&mut self, seq: u32) {
        let before = self.active;
        self.set_shares(before);
        if self.active != before {
            let c = self.member.collective();
            let (collective, first, shape) = (c.collective(), c.first_seq(), c.shape());
            tracing::info!(
                job = self.cfg.job,
                rank = self.cfg.rank,
                threads = self.active,
                "the switch came back with fewer seq lanes: the rest of the collective runs on \
                 fewer threads"
            );
            let trailers = {
                let mut old: Vec<&mut Member> = std::iter::once(&mut self.member)
                    .chain(self.lanes[..before - 1].iter_mut().map(|l| &mut l.member))
                    .collect();
                Member::take_trailers_of_shares(&mut old)
            };
            self.begin_all(collective, first, shape);
            if let Some(t) = trailers {
                self.member.keep_trailers(t);
            }
            for m in self.shares_mut() {
                m.answered_before(seq);
            }
        }
        for m in self.shares_mut() {
            m.restart_from(seq);
        }
    }
}
