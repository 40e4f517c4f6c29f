//! One member of a job on the worker's side, with no I/O: [`Member`] owns
//! the membership ([`WorkerSession`]), the collective in progress
//! ([`Collective`]), the path's RTT estimate ([`RttEstimator`]), its
//! DCTCP window ([`Dctcp`]) and the window the switch advertises, as
//! quinn-proto's `Connection` owns its path's RTT, congestion and pacing
//! state. The caller moves bytes and time: it feeds datagrams
//! ([`Member::handle`]) and time ([`Member::handle_timeout`]), sends what
//! [`Member::poll_control`] and [`Member::poll_data`] give, and sleeps
//! until [`Member::poll_timeout`]. The worker library, the simulated
//! networks (proto/tests) and the fuzzer all drive this one object.
//!
//! Parts: [`config`] (the transport's tunables), [`rtt`], [`dctcp`],
//! [`shape`] (what each collective kind sends and gets), [`collective`]
//! (one collective's chunks, resends and RESULTs) and [`heartbeat`] (what
//! a HEARTBEAT answer says a stalled seq waits for).
//!
//! Invariants:
//! * The window a collective sends with is `min(DCTCP, advertised)` (or the
//!   testing override), at least 1; the advertised window comes from the
//!   last JOIN_ACK, RESULT or HEARTBEAT answer that named one, clamped to
//!   1..=S, and DCTCP's ceiling is the same bound, so the switch can always
//!   answer a lost RESULT from its shadow copy.
//! * A DATA frame is written whole into the caller's buffer: header,
//!   values (wire bytes of the job's dtype, read from the caller's input)
//!   and, in an `auth = "mac"` job, its tag; nothing is allocated per
//!   datagram.
//! * The switch losing the session (authenticated NACK 6/7, a probe
//!   answered under a new generation) starts a rejoin at once, from the
//!   current collective's oldest unanswered chunk; the JOIN_ACK's resume
//!   point comes back as [`Event::Joined`] and the caller decides what to
//!   resend ([`Member::restart_from`], or [`Member::begin`] of the previous
//!   collective).
//! * The straggler hold's probes (docs/PROTOCOL.md, "Reliability") go out
//!   as HEARTBEATs through [`Member::poll_control`] after the
//!   [`Member::poll_data`] that timed out the oldest chunk, and every
//!   HEARTBEAT answer about a seq of this member's share reaches the
//!   collective with what it says of this rank ([`ProbeAnswer`]). A lane
//!   member sends no control message: it holds only when its caller
//!   relays ([`Member::relay_probes`]): the caller takes its probes
//!   ([`Member::take_probe`]), the member whose session sends control
//!   messages asks the switch ([`Member::ask_about`]), whose answer about
//!   another share's seq comes back as [`Event::ShareProbeAnswer`], and
//!   the caller hands it to that share's member
//!   ([`Member::on_probe_answer`]). Only with
//!   [`TransportConfig::straggler_hold`] on.
//! * Nothing here reads a clock or a random source.
//!
//! One Member carries one thread's share of a job: by default every chunk
//! of its collectives. T Members can carry one collective between them
//! (docs/design/worker-threads.md): the joined Member takes share 0 of T
//! ([`Member::set_share`]) and [`Member::lane`] makes shares 1..T, each
//! with its own window, RTT and DCTCP and a lane copy of the one session
//! ([`WorkerSession::lane_copy`]); share t carries the chunks whose seq is
//! t mod T, and the RESULT of seq s belongs to share s mod T. When the
//! session is lost the caller rejoins from the oldest unanswered seq of
//! all shares ([`Member::start_join`] on the joined member; the lane
//! members go idle through theirs) and, at the JOIN_ACK, has each lane
//! member [`Member::follow`] the rejoined one before resending. The
//! joined member asks for lane replies ([`Member::ask_lane_replies`]) so
//! that the switch sends each lane's RESULTs from that lane's port, which
//! the thread owning it reads; [`Member::lane_replies`] says whether the
//! last JOIN_ACK granted them.

pub mod collective;
pub mod config;
pub mod dctcp;
pub mod heartbeat;
pub mod rtt;
pub mod shape;

use std::ops::Range;
use std::time::Instant;

pub use self::collective::{
    reference_grad_stats, reference_tree_grad_stats, Collective, CollectiveStats, ProbeAnswer,
    ResultOutcome, Transmit, FAST_RETRANSMIT_GAP, HOLD_FRESH_RTOS, TIMEOUT_RESEND_BURST,
};
pub use self::config::{TransportConfig, DEFAULT_DELAY_TARGET};
pub use self::dctcp::{Dctcp, DELAY_WINDOW_FLOOR};
pub use self::heartbeat::{SpineWait, Waiting};
pub use self::rtt::{RttEstimator, MIN_RTT_PERIOD};
pub use self::shape::{interleave_block, Shape};
use crate::handshake::JoinParams;
use crate::session::{self, Joined, Lost, SessionConfig, SessionError, WorkerSession};
use crate::stats::{self, GradStats};
use crate::tag::TAG_LEN;
use crate::wire::{Dtype, HeaderRepr, HEADER_LEN};

/// What a datagram or a timeout meant to the member.
#[derive(Debug, Clone)]
pub enum Event {
    /// The switch has (or made) our self-provisioned job `job`; joining it
    /// follows (docs/PROTOCOL.md, "Tenants and self-provisioned jobs").
    Provisioned {
        job: u16,
        lease_secs: u32,
        created: bool,
    },
    /// A JOIN_ACK made us a member (the first join or a rejoin): send from
    /// its resume point (`collective`, `seq`).
    Joined(Box<Joined>),
    /// An authenticated RESULT and what it meant to the collective
    /// ([`ResultOutcome::Fresh`]: copy its `values`, which lie at this range
    /// of the datagram, where the outcome says); `stats` its chunk's
    /// statistics trailer (a `stats = true` job's summed kinds), which the
    /// collective already recorded; `completed`: this RESULT was the
    /// collective's last missing one (the collective is done).
    Result {
        header: HeaderRepr,
        outcome: ResultOutcome,
        values: Range<usize>,
        stats: Option<GradStats>,
        completed: bool,
    },
    /// The switch lost our session; a rejoin has started from the oldest
    /// unanswered chunk of the current collective.
    Rejoining(Lost),
    /// A HEARTBEAT answer about `seq`, a chunk of another share of the
    /// collective (a lane member's probe that this member sent,
    /// [`Member::ask_about`]): what it says of this rank, for the caller
    /// to hand to the member of share `seq` mod T
    /// ([`Member::on_probe_answer`]).
    ShareProbeAnswer { seq: u32, answer: ProbeAnswer },
    /// The collective made no progress for the stall timeout; `waiting` is
    /// what the switch last said about this very seq (None: no answer).
    Stalled {
        collective: u32,
        seq: u32,
        waited: std::time::Duration,
        waiting: Option<Waiting>,
    },
    /// Final: the session cannot go on (a refusal with its reason, a join
    /// timeout, a bad JOIN_ACK).
    Failed(SessionError),
}

/// Where a DATA's values come from: the collective's input, as wire bytes
/// of the job's dtype. Any byte buffer is a whole input; the worker's in
/// place all-reduce instead keeps each chunk's bytes when the chunk is
/// first sent, by the thread that sends it, so that no pass over the whole
/// tensor precedes the collective.
pub trait DataInput {
    /// The input's bytes in `range` (one chunk's values). Panics if the
    /// input is shorter: the caller's sizing.
    fn values(&self, range: Range<usize>) -> &[u8];
}

impl<T: AsRef<[u8]> + ?Sized> DataInput for T {
    fn values(&self, range: Range<usize>) -> &[u8] {
        &self.as_ref()[range]
    }
}

/// A DATA frame [`Member::poll_data`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFrame {
    /// Bytes written at the start of the buffer.
    pub len: usize,
    /// The chunk's seq (its seq lane picks the switch's port).
    pub seq: u32,
    /// It carries values (else NOVAL).
    pub values: bool,
    /// It is a resend.
    pub retx: bool,
}

/// Counters of a member, over every collective it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberStats {
    /// The collectives' counters, summed.
    pub chunks: CollectiveStats,
    /// DATA that carried values (the others were NOVAL).
    pub values_sent: u64,
    /// RESULTs of another kind than the chunk's, or with values where a
    /// NOVAL RESULT was due (or the reverse): ignored.
    pub mismatched_results: u64,
    /// HEARTBEAT answers taken.
    pub heartbeat_answers: u64,
}

/// One worker's member of a job: membership, collective, RTT, DCTCP and
/// the advertised window.
pub struct Member {
    session: WorkerSession,
    cfg: TransportConfig,
    rtt: RttEstimator,
    cc: Dctcp,
    dtype: Dtype,
    pool_slots: u16,
    elems_per_chunk: u16,
    advertised_window: u16,
    seq_lanes: u16,
    /// This member carries the chunks whose seq is `share.0` mod `share.1`.
    share: (u32, u32),
    /// A lane member whose probes the caller relays through the control
    /// member ([`Member::relay_probes`]).
    relays_probes: bool,
    coll: Collective,
    /// Counters of the collectives before the current one.
    done: CollectiveStats,
    values_sent: u64,
    mismatched_results: u64,
    heartbeat_answers: u64,
    /// The last HEARTBEAT answers of T + 1 seqs (T the collective's
    /// shares), the newest last: the stall's (the seq the session watches)
    /// and each share's straggler-hold probe (its oldest; every share's
    /// goes through this member's session), which may all differ. Fewer
    /// would let the lanes' answers push out the stall's, which names
    /// what a stall waits for.
    waiting: Vec<(u32, Waiting)>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("session", &self.session)
            .field("window", &self.window())
            .field("collective", &self.coll.collective())
            .finish_non_exhaustive()
    }
}

impl Member {
    /// A member for `params` that has not joined yet; `nonce_key` must be
    /// random (every nonce of the session derives from it).
    pub fn new(
        params: JoinParams,
        session: SessionConfig,
        transport: TransportConfig,
        nonce_key: [u8; 32],
    ) -> Member {
        Member::with_session(WorkerSession::new(params, session, nonce_key), transport)
    }

    /// A member around `session` (which may have started joining: a test's
    /// lossless join).
    pub fn with_session(session: WorkerSession, transport: TransportConfig) -> Member {
        let dtype = Dtype::from_u8(session.params().dtype).unwrap_or(Dtype::F32);
        Member {
            session,
            rtt: RttEstimator::new(&transport),
            cc: Dctcp::new(&transport, 1),
            cfg: transport,
            dtype,
            pool_slots: 1,
            elems_per_chunk: 1,
            advertised_window: 1,
            seq_lanes: 1,
            share: (0, 1),
            relays_probes: false,
            coll: Collective::new(0, 0, 0, 1),
            done: CollectiveStats::default(),
            values_sent: 0,
            mismatched_results: 0,
            heartbeat_answers: 0,
            waiting: Vec::with_capacity(2),
        }
    }

    /// Starts joining now with resume point (`collective`, `seq`).
    pub fn start_join(&mut self, collective: u32, seq: u32, now: Instant) {
        self.session.start_join(collective, seq, now);
    }

    /// Starts collective `collective` of `shape` at `first_seq` (its input
    /// is the caller's, passed to [`Member::poll_data`]): it replaces the
    /// current one, whose counters are kept.
    pub fn begin(&mut self, collective: u32, first_seq: u32, shape: Shape) {
        let next = Collective::with_shape(collective, first_seq, shape, self.elems_per_chunk)
            .with_seq_lanes(self.seq_lanes.into())
            .with_share(self.share.0, self.share.1)
            .with_hold(
                self.cfg.straggler_hold && (self.session.is_control() || self.relays_probes),
            );
        let old = std::mem::replace(&mut self.coll, next);
        self.done.add(&old.stats);
        self.waiting.clear();
        // Room for every share's probe and the stall's, once.
        self.waiting.reserve(self.share.1 as usize + 1);
    }

    /// From the next [`Member::begin`] on, carries only the chunks whose seq
    /// is `share` mod `shares` (`shares` a power of two dividing the
    /// switch's seq lanes; docs/design/worker-threads.md).
    ///
    /// Panics if `shares` is 0 or `share >= shares`: the caller's sizing.
    pub fn set_share(&mut self, share: u32, shares: u32) {
        assert!(share < shares, "share {share} of {shares}");
        self.share = (share, shares);
    }

    /// Which share of each collective this member carries, of how many.
    pub fn share(&self) -> (u32, u32) {
        self.share
    }

    /// From the next [`Member::begin`] on, a lane member (whose session
    /// sends no control message) holds as the control member does
    /// (docs/PROTOCOL.md, "Reliability"; with
    /// [`TransportConfig::straggler_hold`] on), because its caller relays:
    /// it takes the member's probes ([`Member::take_probe`]) to the
    /// control member ([`Member::ask_about`]), and hands back the answers
    /// that member's [`Event::ShareProbeAnswer`] gives
    /// ([`Member::on_probe_answer`]). A caller that relays nothing leaves
    /// it off: the lane then resends on every timeout.
    pub fn relay_probes(&mut self, on: bool) {
        self.relays_probes = on;
    }

    /// A lane member's probe to relay now: the seq of its oldest chunk,
    /// which just timed out (at most one per that chunk's timeout). The
    /// control member's own probes go out through [`Member::poll_control`]
    /// and are never here.
    pub fn take_probe(&mut self) -> Option<u32> {
        self.coll.take_probe()
    }

    /// Sends a HEARTBEAT about `seq` (a lane member's probe,
    /// [`Member::take_probe`]) through this member's session, as its own
    /// probes go: [`Member::poll_control`] gives it. Nothing on a lane
    /// member.
    pub fn ask_about(&mut self, seq: u32) {
        self.session.ask_about(seq);
    }

    /// The switch's answer about `seq` (an [`Event::ShareProbeAnswer`] of
    /// the control member; the caller took it at `at`), for the straggler
    /// hold of this member's collective ([`Collective::on_probe_answer`]).
    pub fn on_probe_answer(&mut self, seq: u32, answer: ProbeAnswer, at: Instant) {
        self.coll.on_probe_answer(seq, answer, at);
    }

    /// Whether the collective's last probe still waits for its answer at
    /// `now` ([`Collective::awaits_answer`]): a caller that relays answers
    /// looks for one that often.
    pub fn awaits_probe_answer(&self, now: Instant) -> bool {
        self.coll.awaits_answer(now)
    }

    /// A member for share `share` of `shares` of this joined member's
    /// collectives, on another thread: a lane copy of the session (it
    /// sends no control message), the job's parameters from the JOIN_ACK,
    /// and its own RTT and DCTCP, which start as a first join's.
    ///
    /// Panics if `shares` is 0 or `share >= shares`.
    pub fn lane(&self, share: u32, shares: u32) -> Member {
        let mut m = Member::with_session(self.session.lane_copy(), self.cfg);
        m.job_params_from(self);
        m.cc.reset(&m.cfg, m.pool_slots.min(m.advertised_window));
        m.set_share(share, shares);
        m
    }

    /// After `control` (the member whose session joins) rejoined: takes a
    /// fresh lane copy of its session and the JOIN_ACK's parameters, and
    /// keeps this member's collective, RTT and DCTCP (as a rejoin keeps
    /// what DCTCP learnt). The caller then resends from the JOIN_ACK's
    /// resume point ([`Member::restart_from`]).
    pub fn follow(&mut self, control: &Member) {
        self.session = control.session.lane_copy();
        self.job_params_from(control);
        self.cc
            .set_ceiling(self.pool_slots.min(self.advertised_window));
    }

    /// The job's parameters from the JOIN_ACK `control` took: pool, chunk
    /// size, advertised window and seq lanes.
    fn job_params_from(&mut self, control: &Member) {
        self.pool_slots = control.pool_slots;
        self.elems_per_chunk = control.elems_per_chunk;
        self.advertised_window = control.advertised_window;
        self.seq_lanes = control.seq_lanes;
    }

    /// Counts the current collective's chunks before `seq` as answered
    /// ([`Collective::answered_before`]): its shares changed mid-way.
    pub fn answered_before(&mut self, seq: u32) {
        self.coll.answered_before(seq);
    }

    /// Resends the current collective from `seq` (a JOIN_ACK's resume
    /// point); a `seq` before it restarts it whole.
    pub fn restart_from(&mut self, seq: u32) {
        self.coll.restart_from(seq);
    }

    /// The collective in progress (or the last one).
    pub fn collective(&self) -> &Collective {
        &self.coll
    }

    pub fn session(&self) -> &WorkerSession {
        &self.session
    }

    pub fn is_joined(&self) -> bool {
        self.session.is_joined()
    }

    /// Whether the current collective has every RESULT.
    pub fn is_complete(&self) -> bool {
        self.coll.is_complete()
    }

    /// The window new chunks go under: `min(DCTCP, advertised)`, at least 1
    /// (the testing override, when set, instead).
    pub fn window(&self) -> u16 {
        if let Some(w) = self.cfg.window_override {
            return w.max(1);
        }
        self.cc.window().min(self.advertised_window).max(1)
    }

    /// The window the switch advertised last (JOIN_ACK, RESULT, HEARTBEAT).
    pub fn advertised_window(&self) -> u16 {
        self.advertised_window
    }
    pub fn pool_slots(&self) -> u16 {
        self.pool_slots
    }
    pub fn elems_per_chunk(&self) -> u16 {
        self.elems_per_chunk
    }
    /// The switch's seq lanes (1 before a join).
    pub fn seq_lanes(&self) -> u16 {
        self.seq_lanes
    }

    /// Whether every JOIN from now on asks for lane replies
    /// ([`WorkerSession::set_lane_replies`]): a worker whose threads read
    /// each seq lane's RESULTs on their own sockets asks. Call it on the
    /// member whose session joins.
    pub fn ask_lane_replies(&mut self, ask: bool) {
        self.session.set_lane_replies(ask);
    }

    /// Whether the last JOIN_ACK granted lane replies (false before a
    /// join; a lane member has its control member's, from
    /// [`Member::lane`] or [`Member::follow`]).
    pub fn lane_replies(&self) -> bool {
        self.session.lane_replies()
    }
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }
    pub fn dctcp(&self) -> &Dctcp {
        &self.cc
    }
    /// The current collective's gradient statistics (see
    /// [`Collective::grad_stats`]).
    pub fn grad_stats(&self) -> Option<GradStats> {
        self.coll.grad_stats()
    }

    /// The gradient statistics of the collective that `members`, the
    /// shares of one rank, carry together
    /// ([`Collective::grad_stats_of_shares`]).
    pub fn grad_stats_of_shares(members: &[&Member]) -> Option<GradStats> {
        let colls: Vec<&Collective> = members.iter().map(|m| &m.coll).collect();
        Collective::grad_stats_of_shares(&colls)
    }

    /// The statistics trailers that `members`, the shares of one rank's
    /// current collective, got so far, taken out of them
    /// ([`Collective::take_trailers_of_shares`]): before the collective is
    /// begun again on other shares ([`Member::answered_before`]), whose
    /// share 0 keeps them ([`Member::keep_trailers`]).
    pub fn take_trailers_of_shares(members: &mut [&mut Member]) -> Option<stats::CollectiveStats> {
        let mut colls: Vec<&mut Collective> = members.iter_mut().map(|m| &mut m.coll).collect();
        Collective::take_trailers_of_shares(&mut colls)
    }

    /// Keeps `trailers` in the current collective
    /// ([`Collective::keep_trailers`]).
    pub fn keep_trailers(&mut self, trailers: stats::CollectiveStats) {
        self.coll.keep_trailers(trailers);
    }

    pub fn stats(&self) -> MemberStats {
        let mut chunks = self.done;
        chunks.add(&self.coll.stats);
        MemberStats {
            chunks,
            values_sent: self.values_sent,
            mismatched_results: self.mismatched_results,
            heartbeat_answers: self.heartbeat_answers,
        }
    }

    /// The next control message to send now (HELLO, JOIN, probe,
    /// HEARTBEAT).
    pub fn poll_control(&mut self, now: Instant) -> Option<session::Transmit> {
        self.session.poll_transmit(now)
    }

    /// Writes the next DATA to send now, if the window or a resend timer
    /// allows one, into `buf` (room for a header, a chunk's values and a
    /// tag: `HEADER_LEN + E·size + TAG_LEN`); its values are read from
    /// `input`, the collective's input as wire bytes of the job's dtype
    /// ([`DataInput`]: a byte slice, or the worker's input kept chunk by
    /// chunk).
    ///
    /// Panics if `buf` is too short or `input` shorter than the shape's
    /// input: both are the caller's sizing.
    pub fn poll_data<I: DataInput + ?Sized>(
        &mut self,
        now: Instant,
        input: &I,
        buf: &mut [u8],
    ) -> Option<DataFrame> {
        if !self.session.is_joined() {
            return None;
        }
        let window = self.window();
        let t = self.coll.poll_transmit(now, window, &self.rtt, &self.cfg);
        if self.session.is_control() {
            if let Some(seq) = self.coll.take_probe() {
                // The straggler hold asks what the oldest chunk waits for
                // (a lane member's probe waits for its caller to relay it).
                self.session.ask_about(seq);
            }
        }
        let t = t?;
        // Kind, owner and NOVAL as the chunk's shape says.
        let h = self.session.data_header(&t, self.coll.collective());
        h.emit_to(buf).expect("the buffer holds a header");
        let size = self.dtype.size();
        let values = match t.values {
            Some(at) => {
                self.values_sent += 1;
                input.values(at * size..(at + t.count as usize) * size)
            }
            None => &[],
        };
        let end = HEADER_LEN + values.len();
        buf[HEADER_LEN..end].copy_from_slice(values);
        let len = match self.session.data_tag(&h, values) {
            Some(tag) => {
                buf[end..end + TAG_LEN].copy_from_slice(&tag);
                end + TAG_LEN
            }
            None => end,
        };
        Some(DataFrame {
            len,
            seq: t.seq,
            values: t.values.is_some(),
            retx: t.retx,
        })
    }

    /// When [`Member::handle_timeout`] or [`Member::poll_data`] next has
    /// something to do (a resend, a JOIN, a HEARTBEAT, the stall).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let coll = self
            .session
            .is_joined()
            .then(|| self.coll.next_timeout())
            .flatten();
        match (coll, self.session.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Lets time pass: the join's deadline, heartbeats and the stall of the
    /// current collective, and an idle self-provisioned job's keepalive
    /// (call it between collectives too, by [`Member::poll_timeout`]); a
    /// provisioned job the switch made again without us starts a rejoin
    /// ([`Event::Rejoining`]). A stall is reported again at every call while
    /// the collective makes no progress: the worker library fails the
    /// collective at the first.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Event> {
        let own = (!self.coll.is_complete()).then(|| {
            let since = self.coll.last_progress().unwrap_or(now);
            (self.coll.oldest_unacked_seq(), since)
        });
        self.handle_timeout_watching(now, own)
    }

    /// [`Member::handle_timeout`] for the member whose session the threads
    /// of one rank share (docs/design/worker-threads.md): it watches
    /// `watched`, the oldest unanswered seq of the current collective and
    /// when it last made progress, of whichever share has waited longest
    /// (`None`: every share is complete), instead of its own share's. Its
    /// HEARTBEATs then ask about that seq, and a stall names it.
    pub fn handle_timeout_watching(
        &mut self,
        now: Instant,
        watched: Option<(u32, Instant)>,
    ) -> Option<Event> {
        match watched {
            Some((seq, since)) if self.session.is_joined() => {
                self.session.track(self.coll.collective(), seq, Some(since));
            }
            _ => self.session.track(0, 0, None),
        }
        match self.session.handle_timeout(now)? {
            session::Event::Stalled {
                collective,
                seq,
                waited,
            } => Some(Event::Stalled {
                collective,
                seq,
                waited,
                waiting: self
                    .waiting
                    .iter()
                    .position(|(s, _)| *s == seq)
                    .map(|i| self.waiting.remove(i).1),
            }),
            session::Event::Failed(e) => Some(Event::Failed(e)),
            // A provisioned job the switch made again without us.
            session::Event::SessionLost(lost) => Some(self.rejoin(lost, now)),
            // A timeout gives nothing else.
            _ => None,
        }
    }

    /// The switch lost our session: a rejoin from the oldest unanswered
    /// chunk of the current collective starts now.
    fn rejoin(&mut self, lost: Lost, now: Instant) -> Event {
        self.session
            .start_join(self.coll.collective(), self.coll.oldest_unacked_seq(), now);
        Event::Rejoining(lost)
    }

    /// Takes a datagram from the switch.
    pub fn handle(&mut self, datagram: &[u8], now: Instant) -> Option<Event> {
        match self.session.handle(datagram, now)? {
            session::Event::Provisioned {
                job,
                lease_secs,
                created,
            } => Some(Event::Provisioned {
                job,
                lease_secs,
                created,
            }),
            session::Event::Joined(j) => {
                self.on_joined(&j);
                Some(Event::Joined(j))
            }
            session::Event::Result {
                header,
                values,
                stats,
            } => {
                self.advertise(header.window);
                let outcome = self.coll.on_result_with_stats(
                    &header,
                    stats,
                    now,
                    &mut self.rtt,
                    &mut self.cc,
                );
                if let ResultOutcome::ShapeMismatch { .. } = outcome {
                    self.mismatched_results += 1;
                }
                let completed =
                    matches!(outcome, ResultOutcome::Fresh { .. }) && self.coll.is_complete();
                Some(Event::Result {
                    header,
                    outcome,
                    values,
                    stats,
                    completed,
                })
            }
            session::Event::Waiting { header, payload } => {
                self.advertise(header.window);
                self.heartbeat_answers += 1;
                let w = Waiting::parse(&header, &datagram[payload]);
                let rank = self.session.params().rank;
                let answer = match &w {
                    Waiting::Ranks(r) if r.contains(&rank) => ProbeAnswer::OursMissing,
                    Waiting::Ranks(r) if r.is_empty() => ProbeAnswer::Complete,
                    Waiting::Ranks(_) | Waiting::Spine(_) => ProbeAnswer::OthersMissing,
                };
                let (share, shares) = self.coll.share();
                self.waiting.retain(|(s, _)| *s != header.seq);
                if self.waiting.len() > shares as usize {
                    self.waiting.remove(0);
                }
                self.waiting.push((header.seq, w));
                if header.seq % shares != share {
                    // Another share's seq: its member holds on it.
                    return Some(Event::ShareProbeAnswer {
                        seq: header.seq,
                        answer,
                    });
                }
                self.coll.on_probe_answer(header.seq, answer, now);
                None
            }
            session::Event::SessionLost(lost) => Some(self.rejoin(lost, now)),
            session::Event::Stalled { .. } => None,
            session::Event::Failed(e) => Some(Event::Failed(e)),
        }
    }

    /// A JOIN_ACK's parameters: S, E, the advertised window and the seq
    /// lanes; the first opens DCTCP at its initial window under the
    /// ceiling, a rejoin keeps what DCTCP has learnt.
    fn on_joined(&mut self, j: &Joined) {
        self.pool_slots = j.pool_slots.max(1);
        self.elems_per_chunk = j.elems_per_chunk;
        self.advertised_window = j.window.clamp(1, self.pool_slots);
        self.seq_lanes = crate::wire::seq_lanes_from_wire(j.seq_lanes).max(1);
        let ceiling = self.pool_slots.min(self.advertised_window);
        if j.first {
            self.cc.reset(&self.cfg, ceiling);
        } else {
            self.cc.set_ceiling(ceiling);
        }
    }

    /// The window a RESULT or HEARTBEAT answer advertises (0: none).
    fn advertise(&mut self, window: u16) {
        if window != 0 {
            self.advertised_window = window.clamp(1, self.pool_slots);
            self.cc
                .set_ceiling(self.pool_slots.min(self.advertised_window));
        }
    }

    /// The LEAVE to send when done (None before a join).
    pub fn emit_leave(&self, buf: &mut [u8]) -> Option<usize> {
        self.session.emit_leave(buf)
    }

    /// [`Member::emit_leave`] for a member whose job goes on without the
    /// switch, on the host path (`LEAVE_FOR_HOSTS`).
    pub fn emit_leave_for_hosts(&self, buf: &mut [u8]) -> Option<usize> {
        self.session.emit_leave_for_hosts(buf)
    }
}

#[cfg(test)]
mod tests {
    //! A member against the real switch table, in virtual time.
    use std::time::Duration;

    use super::*;
    use crate::session::HEARTBEAT_EVERY;
    use crate::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
    use crate::tag::AuthMode;
    use crate::wire::OP_SUM;

    fn endpoint(rank: u16) -> Endpoint {
        Endpoint {
            source: Source {
                mac: [2, 0, 0, 0, 0, rank as u8],
                ip: [198, 18, 0, 10],
                port: 1000 + rank,
            },
            ..Endpoint::default()
        }
    }

    /// Two ranks of job 1, 8 slots of 2 float32 elements.
    fn table(now: Instant) -> JobTable {
        let mut t = JobTable::new(TableConfig::new(1, [5; 32]), now);
        let job = JobConfig {
            id: 1,
            n_workers: 2,
            allowed_sources: vec![Ipv4Prefix {
                addr: [198, 18, 0, 0],
                len: 24,
            }],
            secret: [3; 32],
            pool_slots: 8,
            elems_per_chunk: 2,
            dtype: Dtype::F32,
            window: 8,
            priority: Default::default(),
            auth: AuthMode::Port,
            upstream: None,
            stats: false,
        };
        t.add(job, 64).unwrap();
        t
    }

    fn member(rank: u16) -> Member {
        let e = endpoint(rank);
        let params = JoinParams {
            job: 1,
            rank,
            n_workers: 2,
            dtype: Dtype::F32 as u8,
            op: OP_SUM,
            secret: [3; 32],
            ip: e.source.ip,
            port: e.source.port,
            provision: None,
        };
        let cfg = SessionConfig {
            join_timeout: Duration::from_secs(3),
            stall_timeout: Duration::from_secs(2),
        };
        Member::new(
            params,
            cfg,
            TransportConfig::default(),
            [rank as u8 + 9; 32],
        )
    }

    /// Sends the members' control messages to `t` and feeds every reply
    /// to its rank's member; returns rank 0's events.
    fn exchange(ms: &mut [Member], t: &mut JobTable, now: Instant) -> Vec<Event> {
        for (rank, m) in ms.iter_mut().enumerate() {
            while let Some(x) = m.poll_control(now) {
                t.handle(x.bytes(), endpoint(rank as u16), false, now);
            }
        }
        let mut ev = Vec::new();
        let mut b = [0u8; 2048];
        while let Some(r) = t.poll_reply() {
            let e = t.encode(&r, &mut b).unwrap();
            let got = ms[r.rank as usize].handle(&b[..e.len], now);
            if r.rank == 0 {
                ev.extend(got);
            }
        }
        ev
    }

    /// Rank 0 sends its chunks; rank 1 never does. The switch's HEARTBEAT
    /// answer names rank 1 and advertises a window that has shrunk since
    /// the JOIN_ACK: the member's window follows it, and its stall names
    /// rank 1.
    #[test]
    fn a_heartbeat_answer_sets_the_window_and_names_who_a_stall_waits_for() {
        let t0 = Instant::now();
        let mut t = table(t0);
        let mut ms = [member(0), member(1)];
        for m in &mut ms {
            m.start_join(0, 0, t0);
        }
        // HELLO → CHALLENGE, then JOIN → JOIN_ACK once both joined.
        exchange(&mut ms, &mut t, t0);
        let ev = exchange(&mut ms, &mut t, t0);
        assert!(ev.iter().any(|e| matches!(e, Event::Joined(_))), "{ev:?}");
        let a = &mut ms[0];
        assert_eq!((a.advertised_window(), a.elems_per_chunk()), (8, 2));
        a.begin(0, 0, Shape::all_reduce(8));
        let input = [0u8; 32];
        let mut buf = [0u8; 64];
        let mut sent = 0;
        while let Some(f) = a.poll_data(t0, &input, &mut buf) {
            assert_eq!(f.len, HEADER_LEN + 8);
            t.handle(&buf[..f.len], endpoint(0), false, t0);
            sent += 1;
        }
        assert_eq!(sent, 4);
        t.get_mut(1).unwrap().set_window(3);
        let later = t0 + HEARTBEAT_EVERY;
        assert!(a.poll_timeout().unwrap() <= later);
        assert!(a.handle_timeout(later).is_none());
        assert!(exchange(&mut ms, &mut t, later).is_empty());
        let a = &mut ms[0];
        assert_eq!(a.advertised_window(), 3);
        assert!(a.window() <= 3);
        assert_eq!(a.stats().heartbeat_answers, 1);
        match a.handle_timeout(t0 + Duration::from_secs(2)) {
            Some(Event::Stalled { seq, waiting, .. }) => {
                assert_eq!(seq, 0);
                assert_eq!(waiting, Some(Waiting::Ranks(vec![1])));
            }
            other => panic!("no stall: {other:?}"),
        }
    }
}
