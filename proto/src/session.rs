//! A worker's membership of one job, with no I/O: joining, what each
//! message from the switch means to a member, rejoining after the switch
//! lost the session, heartbeats and the stall decision (docs/PROTOCOL.md,
//! "Joining" and "Sessions"). quinn-proto style: the caller feeds datagrams
//! ([`WorkerSession::handle`]) and time ([`WorkerSession::handle_timeout`]),
//! sends what [`WorkerSession::poll_transmit`] gives and sleeps until
//! [`WorkerSession::poll_timeout`]. The chunks, window and resends of a
//! collective stay in [`crate::member::collective::Collective`];
//! [`crate::member::Member`] drives both.
//!
//! Decisions that live here (they were the worker library's I/O shell's):
//! * The handshake: HELLO, then JOIN once a CHALLENGE echoes this attempt's
//!   nonce (a second CHALLENGE does not change the switch nonce), each sent
//!   again every [`JOIN_RESEND`]; a JOIN_ACK counts only under the
//!   CHALLENGE's generation and with a tag that verifies under this join's
//!   session key; a CHALLENGE reporting another address, a JOIN_ACK naming
//!   an unknown auth mode or an unusable chunk or pool size, and no JOIN_ACK
//!   within the join timeout are fatal.
//! * NACKs while joining: only those echoing this attempt's nonce count;
//!   9 (stale nonce) and 7 (stale generation) start a fresh handshake, 6
//!   (job not active) is waited out, every other reason is fatal.
//! * A self-provisioned job (`JoinParams::provision`): a provisioning
//!   round ([`crate::provisioner::Provisioner`]) comes before the HELLO,
//!   and its PROVISIONED gives the job id and secret the handshake uses; a
//!   NACK 1 to our own HELLO, JOIN or probe starts another round (the
//!   switch restarted or the job ended), at most [`MAX_PROVISION_ROUNDS`]
//!   in a row without a JOIN_ACK; a refusal of the PROVISION is fatal.
//! * NACKs once joined: only those whose tag verifies under the session key
//!   or that echo the latest probe count; 6 and 7 mean the switch lost the
//!   session (rejoin), 9 is ignored, every other reason is fatal.
//!   [`nack_meaning`] is that table; a leaf's uplink to its spines sorts
//!   its spines' NACKs with it too.
//! * What makes a member probe (an unauthenticated NACK, a RESULT of
//!   another generation; at most one probe per [`PROBE_EVERY`]) and what a
//!   CHALLENGE answering the probe means (another generation: rejoin; the
//!   same: the trigger was spoofed).
//! * Which RESULTs reach the collective: the session's generation, a payload
//!   of exactly `count` elements (none for `NOVAL`), plus the statistics
//!   trailer of a `stats = true` job's summed kinds (its reserved bytes
//!   zero), plus the tag of an `auth = "mac"` job, and that tag verifying
//!   under the RESULT key (docs/PROTOCOL.md, "Gradient statistics").
//! * Whether the job has gradient statistics: the JOIN_ACK's `stats` byte,
//!   0 or 1; another value is fatal (a switch newer than this worker).
//! * HEARTBEAT timing (after [`HEARTBEAT_EVERY`] without progress, and again
//!   as often, and the member's straggler-hold probes:
//!   [`WorkerSession::ask_about`]), which HEARTBEAT answers count (the session's generation),
//!   and the stall (no progress for the stall timeout).
//! * A self-provisioned job's keepalive: while joined and idle (no
//!   collective tracked) a member sends the same empty HEARTBEAT
//!   [`keepalive_interval`] (a third of the job's lease, at most 20 s)
//!   after it last heard from or sent to the switch, so a pause between collectives longer than the
//!   lease does not end the job (docs/PROTOCOL.md, "Leases").
//! * A self-provisioned job re-made under the same generation (removed
//!   while its members lived, and provisioned again by another rank): a
//!   HEARTBEAT unanswered makes the next one probe; a probe answered under
//!   the session's generation while the HEARTBEAT sent with it stays
//!   unanswered too means the switch runs but no longer has us as a
//!   member: the session is lost ([`Lost::JobRemade`]) and provisions
//!   again. A forged NACK alone only makes it probe (docs/PROTOCOL.md,
//!   "Workers and restarts").
//! * Lane replies (docs/PROTOCOL.md, "Seq lanes"): every JOIN carries
//!   `LANE_REPLIES` while the caller asks ([`WorkerSession::set_lane_replies`]);
//!   the grant is the verified JOIN_ACK's bit ([`Joined::lane_replies`]),
//!   kept until the next JOIN_ACK and copied into a lane copy.
//! * A DATA header's session fields (rank, generation; `LAST`, `RETX`) and
//!   its tag ([`WorkerSession::data_header`], [`WorkerSession::data_tag`]),
//!   which [`crate::member::Member`] builds DATA with.
//!
//! Invariants: nothing here reads a clock or a random source (nonces come
//! from an HMAC of a caller-given key and a counter, so a run is
//! reproducible under a fixed key and unguessable under a random one); a
//! fatal decision is final: the session answers nothing afterwards.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::handshake::PROBE_EVERY;
use crate::handshake::{
    ChallengeError, Handshake, JoinAckError, JoinParams, ProbeAnswer, SessionGuard,
};
use crate::provisioner::{Outcome, ProvisionError, Provisioner};
use crate::stats::{GradStats, STATS_LEN};
use crate::tag::{AuthMode, PacketKey, Tag};
use crate::wire::{
    flags, Dtype, Header, HeaderRepr, Kind, MsgType, NackPayload, NackReason, Nonce, HEADER_LEN,
    NONCE_LEN,
};

/// An unanswered HELLO or JOIN is sent again this often.
pub const JOIN_RESEND: Duration = Duration::from_millis(200);
/// After this long without progress a member asks the switch (HEARTBEAT)
/// what the oldest chunk waits for, and again this often.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// Room for the largest control message (a PROVISION).
pub const CONTROL_LEN: usize = 192;
/// A member of a self-provisioned job provisions it at most this many
/// times in a row without a JOIN_ACK before it stops (docs/PROTOCOL.md,
/// "Workers and restarts").
pub const MAX_PROVISION_ROUNDS: u32 = 5;
/// The shortest keepalive interval ([`keepalive_interval`]): a floor
/// for a PROVISIONED naming a lease of 0 (a tenant's lease is at least
/// 1 s, whose third is longer).
pub const KEEPALIVE_MIN: Duration = Duration::from_millis(250);
/// The longest keepalive interval ([`keepalive_interval`]).
pub const KEEPALIVE_MAX: Duration = Duration::from_secs(20);

/// How often an idle member of a self-provisioned job with a lease of
/// `lease_secs` sends a keepalive HEARTBEAT: a third of the lease (so two
/// in a row may be lost before the lease runs out), at most
/// [`KEEPALIVE_MAX`] (a 60 s lease's), at least [`KEEPALIVE_MIN`].
pub fn keepalive_interval(lease_secs: u32) -> Duration {
    (Duration::from_secs(lease_secs.into()) / 3).clamp(KEEPALIVE_MIN, KEEPALIVE_MAX)
}

/// What a NACK that answers us means: it echoes our HELLO's or JOIN's
/// nonce, or, once joined, our probe's, or its tag verifies under the
/// session key (docs/PROTOCOL.md, "Joining" and "Sessions"). One table for
/// every joiner: [`WorkerSession`] and a leaf towards its spines
/// (`switch::leaf`), which differ only in what they do with a refusal
/// (a worker stops; a leaf asks again later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NackMeaning {
    /// While joining: our nonce aged or the switch restarted; start a fresh
    /// handshake now.
    Restart,
    /// While joining: the job waits for other ranks; keep resending.
    Wait,
    /// Once joined: the switch lost our session (it restarted, or the job
    /// went back to joining); join again from the resume point.
    Rejoin,
    /// Once joined: an answer to an earlier join attempt; nothing to do.
    Ignore,
    /// The job, secret, address, rank, parameters or kind are wrong.
    Refused,
}

/// The meaning of an authentic NACK with `reason`, before or after the
/// JOIN_ACK (`joined`).
///
/// NACK 1 (unknown job) is a refusal here; a member of a self-provisioned
/// job provisions again instead ([`WorkerSession`]). NACK 11 (quota) and
/// 12 (unknown tenant) answer only a PROVISION and are final refusals
/// ([`crate::provisioner::ProvisionError`] says which).
pub fn nack_meaning(reason: NackReason, joined: bool) -> NackMeaning {
    match (reason, joined) {
        (NackReason::QuotaExceeded | NackReason::UnknownTenant, _) => NackMeaning::Refused,
        (NackReason::StaleNonce | NackReason::StaleGeneration, false) => NackMeaning::Restart,
        (NackReason::JobNotActive, false) => NackMeaning::Wait,
        (NackReason::JobNotActive | NackReason::StaleGeneration, true) => NackMeaning::Rejoin,
        (NackReason::StaleNonce, true) => NackMeaning::Ignore,
        _ => NackMeaning::Refused,
    }
}

/// Timeouts of a session.
#[derive(Debug, Clone, Copy)]
pub struct SessionConfig {
    /// How long one join (HELLO to JOIN_ACK) may take: every rank must join
    /// within it.
    pub join_timeout: Duration,
    /// A collective fails after this long without progress.
    pub stall_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            join_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a session ended (final).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("the switch refused: {0}")]
    Refused(NackReason),
    #[error("joining failed: {0}")]
    Handshake(ChallengeError),
    #[error("{0}")]
    JoinAck(JoinAckError),
    #[error("the switch's chunk size {elems} or pool size {slots} is unusable")]
    BadJoinAck { elems: u16, slots: u16 },
    #[error(
        "the switch's JOIN_ACK names gradient statistics mode {0} (0 off, 1 on), which this \
         worker does not know (upgrade the worker)"
    )]
    UnknownStats(u8),
    #[error("no JOIN_ACK within {0:?}")]
    JoinTimeout(Duration),
    #[error("provisioning the job failed: {0}")]
    Provision(ProvisionError),
    #[error(
        "the switch forgot the provisioned job {rounds} times in a row before this rank could \
         join it (NACK 1 after each PROVISIONED): check that no one removes it (switchctl jobs) \
         and that the switch is not restarting in a loop"
    )]
    ProvisionedJobVanishes { rounds: u32 },
}

/// What the session's JOIN_ACK said.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The switch's generation.
    pub gen: u32,
    /// The job's resume point: every rank (re)sends from here.
    pub collective: u32,
    pub seq: u32,
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    /// The window the switch advertised, within 1..=pool_slots.
    pub window: u16,
    pub auth: AuthMode,
    /// The job is `stats = true`: its summed RESULTs carry a statistics
    /// trailer ([`Event::Result`]'s `stats`).
    pub stats: bool,
    /// Tags our DATA (`auth = "mac"` jobs).
    pub data_key: Option<PacketKey>,
    /// The first JOIN_ACK of this session object (not a rejoin).
    pub first: bool,
    /// The switch's seq lanes (its CHALLENGE's): DATA of seq s goes to its
    /// port + (s mod seq_lanes) ([`crate::wire::seq_lane_port`]).
    pub seq_lanes: u16,
    /// The JOIN_ACK granted lane replies ([`flags::LANE_REPLIES`], under
    /// its tag): the switch sends the RESULT of seq s from its port + (s
    /// mod seq_lanes), every other reply from its port (docs/PROTOCOL.md,
    /// "Seq lanes"). Only ever set when our JOIN asked
    /// ([`WorkerSession::set_lane_replies`]).
    pub lane_replies: bool,
}

/// Why the switch no longer has our session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// An authenticated NACK with this reason (6 or 7).
    Nack(NackReason),
    /// A CHALLENGE answering our probe under another generation.
    Restarted { gen: u32 },
    /// A self-provisioned job: the switch answered our probe under the
    /// session's generation but not the HEARTBEATs before and after it: it
    /// lost the job and it was made again without us (provision again).
    JobRemade,
}

/// What a datagram or a timeout meant.
#[derive(Debug, Clone)]
pub enum Event {
    /// The switch has (or made) the self-provisioned job: the session joins
    /// job `job` now (the id may differ from a previous round's).
    Provisioned {
        job: u16,
        lease_secs: u32,
        /// This rank's claim created the job.
        created: bool,
    },
    /// A JOIN_ACK made us a member: send from its resume point.
    Joined(Box<Joined>),
    /// An authenticated RESULT: `header.seq`, `header.count` and its flags
    /// for the collective; `values` is where its values lie in the datagram
    /// (empty for `NOVAL`); `stats` its chunk's statistics trailer (a
    /// `stats = true` job's all-reduce and reduce-scatter RESULTs; `None`
    /// otherwise).
    Result {
        header: HeaderRepr,
        values: Range<usize>,
        stats: Option<GradStats>,
    },
    /// The switch's answer to our HEARTBEAT for `header.seq`: `payload` is
    /// where its body (the ranks, or a leaf's spine block) lies in the
    /// datagram.
    Waiting {
        header: HeaderRepr,
        payload: Range<usize>,
    },
    /// The switch lost our session: call [`WorkerSession::start_join`] with
    /// the oldest unanswered chunk as resume point.
    SessionLost(Lost),
    /// The tracked collective made no progress for the stall timeout.
    Stalled {
        collective: u32,
        seq: u32,
        waited: Duration,
    },
    /// Final: the session cannot go on.
    Failed(SessionError),
}

/// A control message to send (HELLO, JOIN, HEARTBEAT, LEAVE).
#[derive(Clone, Copy)]
pub struct Transmit {
    pub msg_type: MsgType,
    /// A HELLO that probes a joined session (not a join's).
    pub probe: bool,
    buf: [u8; CONTROL_LEN],
    len: usize,
}

impl Transmit {
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The header's seq (a HEARTBEAT's: the chunk it asks about).
    fn seq(&self) -> u32 {
        crate::wire::Header::new_unchecked(&self.buf[..]).seq()
    }
}

impl std::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transmit")
            .field("msg_type", &self.msg_type)
            .field("probe", &self.probe)
            .field("len", &self.len)
            .finish()
    }
}

/// Counters of a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub rejoins: u64,
    pub nacks: u64,
    /// Unauthenticated NACKs and RESULTs of another generation, once joined.
    pub unauthenticated_dropped: u64,
    pub probes_sent: u64,
    /// Probes answered under the session's generation.
    pub spoofed_triggers: u64,
    pub bad_length_results: u64,
    pub bad_tag_results: u64,
    pub bad_tag_join_acks: u64,
    pub heartbeats_sent: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not started, or waiting for [`WorkerSession::start_join`] after the
    /// session was lost.
    Idle,
    /// A self-provisioned job: asking the switch for it (the provisioner
    /// sends), then joining from `resume`.
    Provisioning {
        resume: (u32, u32),
        deadline: Instant,
    },
    Joining {
        resume: (u32, u32),
        deadline: Instant,
        next_send: Instant,
    },
    Joined,
    Failed,
}

/// The collective whose progress the session watches.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    collective: u32,
    seq: u32,
    since: Instant,
    last_heartbeat: Option<Instant>,
}

/// One worker's membership of a job (or a simulated worker's).
pub struct WorkerSession {
    cfg: SessionConfig,
    dtype: Dtype,
    hs: Handshake,
    guard: Option<SessionGuard>,
    nonce_key: [u8; 32],
    nonces: u64,
    phase: Phase,
    joined_once: bool,
    gen: u32,
    auth: AuthMode,
    /// The last JOIN_ACK's `stats` byte was 1.
    grad_stats: bool,
    /// The last JOIN_ACK granted lane replies.
    lane_replies: bool,
    data_key: Option<PacketKey>,
    result_key: Option<PacketKey>,
    tracked: Option<Tracked>,
    queue: VecDeque<Transmit>,
    stats: SessionStats,
    /// This session sends control messages (HELLO, JOIN, HEARTBEAT) and
    /// joins; false in a [`WorkerSession::lane_copy`], which only frames
    /// DATA and checks RESULTs.
    control: bool,
    /// A self-provisioned job's provisioner (control sessions only).
    prov: Option<Provisioner>,
    /// The handshake's job id and secret come from a PROVISIONED the switch
    /// has not since disowned (NACK 1).
    provisioned: bool,
    /// Provisioning rounds since the last JOIN_ACK.
    prov_rounds: u32,
    /// The last HEARTBEAT got no answer (yet).
    heartbeat_unanswered: bool,
    /// A probe sent while a HEARTBEAT was unanswered came back under the
    /// session's generation: the switch is up (a provisioned job only).
    probed_alive: bool,
    /// A self-provisioned job's keepalive interval (from its lease).
    keepalive: Option<Duration>,
    /// When the session last sent a HEARTBEAT or took an authentic answer
    /// (JOIN_ACK, RESULT, HEARTBEAT answer): the keepalive counts from it.
    last_active: Option<Instant>,
    /// The seq of the last tracked chunk: an idle keepalive names it.
    last_seq: u32,
}

impl std::fmt::Debug for WorkerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSession")
            .field("params", self.hs.params())
            .field("phase", &self.phase)
            .field("gen", &self.gen)
            .finish_non_exhaustive()
    }
}

impl WorkerSession {
    /// A session for `params`; `nonce_key` must be random: every nonce this
    /// session sends derives from it. RESULT lengths are checked against
    /// `params.dtype` (an unknown dtype counts as float32: the switch
    /// refuses such a JOIN with NACK 5 anyway).
    pub fn new(params: JoinParams, cfg: SessionConfig, nonce_key: [u8; 32]) -> WorkerSession {
        let dtype = Dtype::from_u8(params.dtype).unwrap_or(Dtype::F32);
        let mut s = WorkerSession {
            cfg,
            dtype,
            hs: Handshake::new(params, [0; NONCE_LEN]),
            guard: None,
            nonce_key,
            nonces: 0,
            phase: Phase::Idle,
            joined_once: false,
            gen: 0,
            auth: AuthMode::Port,
            grad_stats: false,
            lane_replies: false,
            data_key: None,
            result_key: None,
            tracked: None,
            queue: VecDeque::new(),
            stats: SessionStats::default(),
            control: true,
            prov: None,
            provisioned: false,
            prov_rounds: 0,
            heartbeat_unanswered: false,
            probed_alive: false,
            keepalive: None,
            last_active: None,
            last_seq: 0,
        };
        if let Some(spec) = s.hs.params().provision.clone() {
            let asker = s.hs.params().asker();
            // The provisioner's nonces derive from two of ours.
            let mut key = [0u8; 32];
            key[..NONCE_LEN].copy_from_slice(&s.fresh_nonce());
            key[NONCE_LEN..].copy_from_slice(&s.fresh_nonce());
            s.prov = Some(Provisioner::new(spec, asker, key));
        }
        let n = s.fresh_nonce();
        s.hs.restart(n);
        s
    }

    fn fresh_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.nonce_key) else {
            unreachable!("HMAC accepts every key length")
        };
        m.update(b"aggswitch worker nonce");
        m.update(&self.nonces.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&full[..NONCE_LEN]);
        n
    }

    /// A copy of this joined session for another thread of the same rank
    /// (docs/design/worker-threads.md): it frames DATA and checks RESULTs
    /// under the same generation, keys and membership, but never sends a
    /// control message, joins or watches for stalls. It has no nonce key
    /// (every nonce stays this session's own). When the session is lost, a
    /// lane copy goes idle ([`WorkerSession::start_join`]) until the caller
    /// replaces it by a fresh copy of the rejoined session.
    pub fn lane_copy(&self) -> WorkerSession {
        WorkerSession {
            cfg: self.cfg,
            dtype: self.dtype,
            hs: self.hs.clone(),
            guard: self.guard.clone(),
            nonce_key: [0; 32],
            nonces: 0,
            // Only a joined session's copy frames anything; a copy taken
            // while joining waits, idle, for the next copy.
            phase: if self.phase == Phase::Joined {
                Phase::Joined
            } else {
                Phase::Idle
            },
            joined_once: self.joined_once,
            gen: self.gen,
            auth: self.auth,
            grad_stats: self.grad_stats,
            lane_replies: self.lane_replies,
            data_key: self.data_key.clone(),
            result_key: self.result_key.clone(),
            tracked: None,
            queue: VecDeque::new(),
            stats: SessionStats::default(),
            control: false,
            prov: None,
            provisioned: self.provisioned,
            prov_rounds: 0,
            heartbeat_unanswered: false,
            probed_alive: false,
            keepalive: None,
            last_active: None,
            last_seq: 0,
        }
    }

    /// Whether this session sends control messages (false: a lane copy).
    pub fn is_control(&self) -> bool {
        self.control
    }

    /// Whether every JOIN this session sends from now on asks for lane
    /// replies ([`flags::LANE_REPLIES`]; docs/PROTOCOL.md, "Seq lanes"): a
    /// worker that reads each seq lane's RESULTs on its own socket asks.
    /// Whether the switch granted them is [`Joined::lane_replies`].
    pub fn set_lane_replies(&mut self, ask: bool) {
        self.hs.set_lane_replies(ask);
    }

    /// Whether the last JOIN_ACK granted lane replies (false before a
    /// join): RESULTs then come from the switch's lane ports.
    pub fn lane_replies(&self) -> bool {
        self.lane_replies
    }

    /// Starts joining now (a fresh handshake) with resume point
    /// (`collective`, `seq`): the first join, or a rejoin after
    /// [`Event::SessionLost`]. A lane copy goes idle instead: the control
    /// session rejoins.
    pub fn start_join(&mut self, collective: u32, seq: u32, now: Instant) {
        if self.phase == Phase::Failed {
            return;
        }
        if !self.control {
            self.phase = Phase::Idle;
            return;
        }
        let n = self.fresh_nonce();
        self.hs.restart(n);
        self.queue.clear();
        let resume = (collective, seq);
        let deadline = now + self.cfg.join_timeout;
        if self.prov.is_some() && !self.provisioned {
            self.provision(resume, deadline, now);
            return;
        }
        self.phase = Phase::Joining {
            resume,
            deadline,
            next_send: now,
        };
    }

    /// Starts a provisioning round (ask, claim) for a self-provisioned job.
    fn provision(&mut self, resume: (u32, u32), deadline: Instant, now: Instant) {
        let Some(p) = &mut self.prov else {
            return;
        };
        p.start(now);
        self.prov_rounds += 1;
        self.provisioned = false;
        self.phase = Phase::Provisioning { resume, deadline };
    }

    /// A NACK 1 (unknown job) to our own HELLO, JOIN or probe: a
    /// self-provisioned job is provisioned again (at most
    /// [`MAX_PROVISION_ROUNDS`] rounds without a JOIN_ACK); `None` if this
    /// is no self-provisioned job.
    fn job_vanished(
        &mut self,
        resume: (u32, u32),
        deadline: Instant,
        now: Instant,
    ) -> Option<Option<Event>> {
        self.prov.as_ref()?;
        if self.prov_rounds >= MAX_PROVISION_ROUNDS {
            return Some(Some(self.fail(SessionError::ProvisionedJobVanishes {
                rounds: self.prov_rounds,
            })));
        }
        self.provision(resume, deadline, now);
        Some(None)
    }

    /// Whether this session provisions its job (a self-provisioned job).
    pub fn is_provisioned_job(&self) -> bool {
        self.hs.params().provision.is_some()
    }

    pub fn is_joined(&self) -> bool {
        self.phase == Phase::Joined
    }
    pub fn is_failed(&self) -> bool {
        self.phase == Phase::Failed
    }
    /// The generation of the last JOIN_ACK (0 before one).
    pub fn gen(&self) -> u32 {
        self.gen
    }
    pub fn auth(&self) -> AuthMode {
        self.auth
    }
    /// Whether the job is `stats = true` (the last JOIN_ACK's `stats`).
    pub fn grad_stats(&self) -> bool {
        self.grad_stats
    }
    pub fn params(&self) -> &JoinParams {
        self.hs.params()
    }
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// The header of a DATA for chunk `t` of `collective`, under this
    /// session: its kind, and in kinds other than all-reduce the chunk's
    /// owner in `window` and `NOVAL` when `t` carries no values
    /// (docs/PROTOCOL.md, "Collective kinds").
    pub fn data_header(
        &self,
        t: &crate::member::collective::Transmit,
        collective: u32,
    ) -> HeaderRepr {
        let p = self.hs.params();
        let mut h = HeaderRepr::new(MsgType::Data, p.job);
        h.rank = p.rank;
        h.count = t.count;
        h.seq = t.seq;
        h.collective = collective;
        h.gen = self.gen;
        h.flags |= t.kind.flag_bits();
        if t.kind != crate::wire::Kind::AllReduce {
            h.window = t.owner;
        }
        if t.values.is_none() {
            h.flags |= flags::NOVAL;
        }
        if t.last {
            h.flags |= flags::LAST;
        }
        if t.retx {
            h.flags |= flags::RETX;
        }
        h
    }

    /// The tag a DATA with header `h` and values `payload` carries in an
    /// `auth = "mac"` job (None otherwise).
    pub fn data_tag(&self, h: &HeaderRepr, payload: &[u8]) -> Option<Tag> {
        self.data_key.as_ref().map(|k| k.tag(h, payload))
    }

    /// Reports the collective in progress: its id, the seq of its oldest
    /// unanswered chunk and when it last made progress (`None`: no
    /// collective is running, nothing to watch).
    pub fn track(&mut self, collective: u32, seq: u32, since: Option<Instant>) {
        let Some(since) = since else {
            self.tracked = None;
            return;
        };
        let last_heartbeat = self
            .tracked
            .filter(|t| t.collective == collective)
            .and_then(|t| t.last_heartbeat);
        if self.tracked.is_none_or(|t| t.since != since) {
            // Progress: the switch is there.
            self.heartbeat_unanswered = false;
            self.probed_alive = false;
        }
        self.last_seq = seq;
        self.tracked = Some(Tracked {
            collective,
            seq,
            since,
            last_heartbeat,
        });
    }

    /// The next control message to send now, if any.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if !self.control {
            return None;
        }
        if let Some(t) = self.queue.pop_front() {
            return Some(t);
        }
        if let Phase::Provisioning { .. } = self.phase {
            let mut t = Transmit {
                msg_type: MsgType::Provision,
                probe: false,
                buf: [0; CONTROL_LEN],
                len: 0,
            };
            t.len = self.prov.as_mut()?.poll_transmit(now, &mut t.buf)?;
            return Some(t);
        }
        let Phase::Joining {
            resume, next_send, ..
        } = &mut self.phase
        else {
            return None;
        };
        if now < *next_send {
            return None;
        }
        *next_send = now + JOIN_RESEND;
        let (collective, seq) = *resume;
        let mut t = Transmit {
            msg_type: MsgType::Hello,
            probe: false,
            buf: [0; CONTROL_LEN],
            len: 0,
        };
        let len = if self.hs.challenged() {
            t.msg_type = MsgType::Join;
            self.hs.emit_join(collective, seq, &mut t.buf)
        } else {
            self.hs.emit_hello(&mut t.buf).ok()
        };
        t.len = len?;
        Some(t)
    }

    /// When [`WorkerSession::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.control {
            return None;
        }
        match self.phase {
            Phase::Joining {
                deadline,
                next_send,
                ..
            } => Some(deadline.min(next_send)),
            Phase::Provisioning { deadline, .. } => Some(
                self.prov
                    .as_ref()
                    .and_then(Provisioner::poll_timeout)
                    .map_or(deadline, |t| t.min(deadline)),
            ),
            Phase::Joined => match self.tracked {
                Some(t) => {
                    let stall = t.since + self.cfg.stall_timeout;
                    Some(stall.min(self.next_heartbeat(&t)))
                }
                None => self.next_keepalive(),
            },
            Phase::Idle | Phase::Failed => None,
        }
    }

    /// When an idle member of a self-provisioned job next sends its
    /// keepalive HEARTBEAT (None: not such a member).
    pub fn next_keepalive(&self) -> Option<Instant> {
        if !self.control || self.phase != Phase::Joined {
            return None;
        }
        Some(self.last_active? + self.keepalive?)
    }

    /// The keepalive interval of a self-provisioned job (from the lease its
    /// PROVISIONED named; None for a declared job or before it).
    pub fn keepalive(&self) -> Option<Duration> {
        self.keepalive
    }

    fn next_heartbeat(&self, t: &Tracked) -> Instant {
        let first = t.since + HEARTBEAT_EVERY;
        t.last_heartbeat
            .map_or(first, |h| first.max(h + HEARTBEAT_EVERY))
    }

    /// Lets time pass: the join's deadline, heartbeats, the stall.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Event> {
        if !self.control {
            return None;
        }
        match self.phase {
            Phase::Joining { deadline, .. } | Phase::Provisioning { deadline, .. }
                if now >= deadline =>
            {
                Some(self.fail(SessionError::JoinTimeout(self.cfg.join_timeout)))
            }
            Phase::Joined => {
                let Some(t) = self.tracked else {
                    // Idle: keep a provisioned job's lease.
                    if self.next_keepalive().is_some_and(|k| now >= k) {
                        return self.beat(now, self.last_seq);
                    }
                    return None;
                };
                if now >= t.since + self.cfg.stall_timeout {
                    // Reported once; a new `track` watches again.
                    self.tracked = None;
                    return Some(Event::Stalled {
                        collective: t.collective,
                        seq: t.seq,
                        waited: self.cfg.stall_timeout,
                    });
                }
                if now >= self.next_heartbeat(&t) {
                    if let Some(ev) = self.beat(now, t.seq) {
                        return Some(ev);
                    }
                    if let Some(t) = &mut self.tracked {
                        t.last_heartbeat = Some(now);
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// A HEARTBEAT for `seq` is due (a stalled chunk's, or an idle
    /// keepalive). A switch that restarted without our provisioned job
    /// answers neither DATA nor HEARTBEAT of it: a second HEARTBEAT in a
    /// row unanswered makes such a member probe; when the probe came back
    /// under our generation and the HEARTBEAT sent with it is unanswered as
    /// well, the switch lost the job and it was made again without us: the
    /// session is lost and provisions again (docs/PROTOCOL.md, "Workers and
    /// restarts").
    fn beat(&mut self, now: Instant, seq: u32) -> Option<Event> {
        if self.prov.is_some() && self.heartbeat_unanswered {
            if self.probed_alive {
                self.provisioned = false;
                return Some(self.lost(Lost::JobRemade));
            }
            self.probe(now);
        }
        self.heartbeat_unanswered = true;
        self.heartbeat(seq);
        self.last_active = Some(now);
        None
    }

    /// Queues a HEARTBEAT about `seq` now: a member's probe of a chunk
    /// that timed out (the straggler hold, docs/PROTOCOL.md,
    /// "Reliability"), its own or a lane share's (one rank's threads probe
    /// through the session of thread 0, docs/design/worker-threads.md).
    /// Unlike the stall's it leaves the provisioned job's liveness watch
    /// alone, and it queues nothing while a HEARTBEAT about the same seq
    /// is still queued (so the queue holds at most one per share's
    /// oldest), or when this session sends no control messages or is not
    /// joined.
    pub fn ask_about(&mut self, seq: u32) {
        if !self.control
            || self.phase != Phase::Joined
            || self
                .queue
                .iter()
                .any(|t| t.msg_type == MsgType::Heartbeat && t.seq() == seq)
        {
            return;
        }
        self.heartbeat(seq);
    }

    fn heartbeat(&mut self, seq: u32) {
        let p = self.hs.params();
        let mut h = HeaderRepr::new(MsgType::Heartbeat, p.job);
        h.rank = p.rank;
        h.seq = seq;
        h.gen = self.gen;
        let mut t = Transmit {
            msg_type: MsgType::Heartbeat,
            probe: false,
            buf: [0; CONTROL_LEN],
            len: HEADER_LEN,
        };
        if h.emit_to(&mut t.buf).is_ok() {
            self.stats.heartbeats_sent += 1;
            self.queue.push_back(t);
        }
    }

    fn fail(&mut self, e: SessionError) -> Event {
        self.phase = Phase::Failed;
        self.queue.clear();
        self.tracked = None;
        Event::Failed(e)
    }

    /// Takes a datagram from the switch.
    pub fn handle(&mut self, datagram: &[u8], now: Instant) -> Option<Event> {
        let h = Header::new_checked(datagram).ok()?;
        let r = HeaderRepr::parse(&h).ok()?;
        if let Phase::Provisioning { resume, deadline } = self.phase {
            // Answers to an ask carry the id asked for (0), a PROVISIONED
            // the job's: the provisioner judges them by their nonces.
            let outcome = self.prov.as_mut()?.handle_parsed(&r, h.payload(), now)?;
            return Some(self.provisioned(outcome, resume, deadline, now));
        }
        if r.job != self.hs.params().job {
            return None;
        }
        match self.phase {
            Phase::Joining { .. } => self.on_joining(&h, &r, now),
            Phase::Provisioning { .. } => None,
            Phase::Joined => self.on_joined(&h, &r, now),
            Phase::Idle | Phase::Failed => None,
        }
    }

    fn on_joining(&mut self, h: &Header<&[u8]>, r: &HeaderRepr, now: Instant) -> Option<Event> {
        if r.rank != self.hs.params().rank {
            return None;
        }
        match r.msg_type {
            MsgType::Challenge if !self.hs.challenged() => {
                match self.hs.on_challenge(r, h.payload()) {
                    Ok(()) => {
                        // The JOIN goes at once.
                        if let Phase::Joining { next_send, .. } = &mut self.phase {
                            *next_send = now;
                        }
                        None
                    }
                    Err(e @ ChallengeError::AddressMismatch { .. }) => {
                        Some(self.fail(SessionError::Handshake(e)))
                    }
                    Err(_) => None,
                }
            }
            MsgType::JoinAck if self.hs.gen() == Some(r.gen) => {
                let ack = match self.hs.on_join_ack(r, h.payload()) {
                    Ok(a) => a,
                    Err(JoinAckError::BadTag) => {
                        self.stats.bad_tag_join_acks += 1;
                        return None;
                    }
                    Err(e @ (JoinAckError::UnknownAuth(_) | JoinAckError::UntokenedResults)) => {
                        return Some(self.fail(SessionError::JoinAck(e)))
                    }
                    Err(_) => return None,
                };
                let p = ack.payload;
                if p.elems_per_chunk == 0 || !p.pool_slots.is_power_of_two() {
                    return Some(self.fail(SessionError::BadJoinAck {
                        elems: p.elems_per_chunk,
                        slots: p.pool_slots,
                    }));
                }
                let stats = match p.stats {
                    0 => false,
                    1 => true,
                    other => return Some(self.fail(SessionError::UnknownStats(other))),
                };
                let first = !self.joined_once;
                self.joined_once = true;
                self.prov_rounds = 0;
                self.phase = Phase::Joined;
                self.heartbeat_unanswered = false;
                self.probed_alive = false;
                self.last_active = Some(now);
                self.gen = r.gen;
                self.guard = Some(ack.session);
                self.auth = ack.auth;
                self.grad_stats = stats;
                self.lane_replies = r.has_flag(flags::LANE_REPLIES);
                self.data_key = ack.data_key.clone();
                self.result_key = ack.result_key;
                Some(Event::Joined(Box::new(Joined {
                    gen: r.gen,
                    collective: r.collective,
                    seq: r.seq,
                    pool_slots: p.pool_slots,
                    elems_per_chunk: p.elems_per_chunk,
                    window: r.window.clamp(1, p.pool_slots),
                    auth: ack.auth,
                    stats,
                    data_key: ack.data_key,
                    first,
                    seq_lanes: self.hs.seq_lanes(),
                    lane_replies: self.lane_replies,
                })))
            }
            MsgType::Nack => {
                self.stats.nacks += 1;
                let nack = NackPayload::parse(h.payload()).ok()?;
                if !self.hs.nack_is_ours(&nack) {
                    // Left over from an earlier attempt, or not for us.
                    return None;
                }
                if nack.reason == NackReason::UnknownJob {
                    if let Phase::Joining {
                        resume, deadline, ..
                    } = self.phase
                    {
                        if let Some(ev) = self.job_vanished(resume, deadline, now) {
                            return ev;
                        }
                    }
                }
                match nack_meaning(nack.reason, false) {
                    NackMeaning::Restart => {
                        let n = self.fresh_nonce();
                        self.hs.restart(n);
                        if let Phase::Joining { next_send, .. } = &mut self.phase {
                            *next_send = now;
                        }
                        None
                    }
                    // The JOIN is resent until the others joined.
                    NackMeaning::Wait | NackMeaning::Ignore => None,
                    NackMeaning::Rejoin | NackMeaning::Refused => {
                        Some(self.fail(SessionError::Refused(nack.reason)))
                    }
                }
            }
            _ => None,
        }
    }

    fn on_joined(&mut self, h: &Header<&[u8]>, r: &HeaderRepr, now: Instant) -> Option<Event> {
        match r.msg_type {
            // Not from this session's switch (a restarted switch sends no
            // RESULT to a non-member): ask whether it restarted.
            MsgType::Result if r.gen != self.gen => {
                self.unauthenticated(now);
                None
            }
            MsgType::Result => {
                let n = if r.no_values() {
                    0
                } else {
                    self.dtype.payload_len(r.count)
                };
                // Summed kinds of a stats job carry the trailer; an
                // all-gather (broadcast too) sums nothing and carries none.
                let trailer = if self.grad_stats && r.kind() != Kind::AllGather {
                    STATS_LEN
                } else {
                    0
                };
                let payload = h.payload();
                if payload.len() != n + trailer + self.auth.result_tag_len() {
                    self.stats.bad_length_results += 1;
                    return None;
                }
                // A mac job's tag covers the values (and trailer); a port
                // job's token only the header (docs/PROTOCOL.md, "RESULT
                // tokens"). Without the key nothing is taken.
                let (covered, tag) = payload.split_at(n + trailer);
                let authentic = self.result_key.as_ref().is_some_and(|k| match self.auth {
                    AuthMode::Mac => k.verify(r, covered, tag),
                    AuthMode::Port => k.verify_token(r, tag),
                });
                if !authentic {
                    self.stats.bad_tag_results += 1;
                    return None;
                }
                let stats = if trailer == 0 {
                    None
                } else {
                    match GradStats::parse(&covered[n..]) {
                        Ok(s) => Some(s),
                        // Nonzero reserved bytes: not a trailer we know.
                        Err(_) => {
                            self.stats.bad_length_results += 1;
                            return None;
                        }
                    }
                };
                // The switch has us: the keepalive counts from here.
                self.last_active = Some(now);
                self.heartbeat_unanswered = false;
                self.probed_alive = false;
                Some(Event::Result {
                    header: *r,
                    values: HEADER_LEN..HEADER_LEN + n,
                    stats,
                })
            }
            MsgType::Heartbeat if r.gen == self.gen => {
                self.heartbeat_unanswered = false;
                self.probed_alive = false;
                self.last_active = Some(now);
                Some(Event::Waiting {
                    header: *r,
                    payload: HEADER_LEN..HEADER_LEN + h.payload().len(),
                })
            }
            MsgType::Nack => {
                self.stats.nacks += 1;
                let nack = NackPayload::parse(h.payload()).ok()?;
                let authentic = self
                    .guard
                    .as_ref()
                    .is_some_and(|g| g.nack_is_authentic(h.header_bytes(), &nack));
                if !authentic {
                    // Anyone on the path could have sent it: ask the switch.
                    self.unauthenticated(now);
                    return None;
                }
                if nack.reason == NackReason::UnknownJob && self.prov.is_some() {
                    // The switch restarted or the job ended while we were
                    // away: provision it again at the rejoin.
                    self.provisioned = false;
                    return Some(self.lost(Lost::Nack(nack.reason)));
                }
                match nack_meaning(nack.reason, true) {
                    NackMeaning::Rejoin | NackMeaning::Restart => {
                        Some(self.lost(Lost::Nack(nack.reason)))
                    }
                    NackMeaning::Ignore | NackMeaning::Wait => None,
                    NackMeaning::Refused => Some(self.fail(SessionError::Refused(nack.reason))),
                }
            }
            MsgType::Challenge if r.rank == self.hs.params().rank => {
                let answer = self
                    .guard
                    .as_mut()
                    .map_or(ProbeAnswer::NotOurs, |g| g.on_challenge(r, h.payload()));
                match answer {
                    ProbeAnswer::Restarted { gen } => Some(self.lost(Lost::Restarted { gen })),
                    ProbeAnswer::SameGeneration => {
                        self.stats.spoofed_triggers += 1;
                        // A provisioned job watches whether the switch
                        // still answers its HEARTBEATs (`beat`).
                        self.probed_alive = self.prov.is_some() && self.heartbeat_unanswered;
                        None
                    }
                    ProbeAnswer::NotOurs => None,
                }
            }
            _ => None,
        }
    }

    fn provisioned(
        &mut self,
        outcome: Outcome,
        resume: (u32, u32),
        deadline: Instant,
        now: Instant,
    ) -> Event {
        match outcome {
            Outcome::Provisioned {
                job,
                secret,
                lease_secs,
                created,
                ..
            } => {
                self.hs.set_job(job, secret);
                self.provisioned = true;
                self.keepalive = Some(keepalive_interval(lease_secs));
                let n = self.fresh_nonce();
                self.hs.restart(n);
                self.phase = Phase::Joining {
                    resume,
                    deadline,
                    next_send: now,
                };
                Event::Provisioned {
                    job,
                    lease_secs,
                    created,
                }
            }
            Outcome::Refused(e) => self.fail(SessionError::Provision(e)),
        }
    }

    fn lost(&mut self, why: Lost) -> Event {
        self.stats.rejoins += 1;
        self.phase = Phase::Idle;
        self.queue.clear();
        self.tracked = None;
        Event::SessionLost(why)
    }

    /// An unauthenticated NACK or a RESULT of another generation arrived:
    /// count it and probe (at most one per [`PROBE_EVERY`]), so that a real
    /// switch restart is still noticed.
    fn unauthenticated(&mut self, now: Instant) {
        self.stats.unauthenticated_dropped += 1;
        self.probe(now);
    }

    /// Queues a probe (a HELLO with a fresh nonce), at most one per
    /// [`PROBE_EVERY`].
    fn probe(&mut self, now: Instant) {
        let fresh = self.fresh_nonce();
        let Some(nonce) = self.guard.as_mut().and_then(|g| g.probe(now, fresh)) else {
            return;
        };
        let mut t = Transmit {
            msg_type: MsgType::Hello,
            probe: true,
            buf: [0; CONTROL_LEN],
            len: 0,
        };
        if let Ok(len) = self.hs.emit_hello_with(nonce, &mut t.buf) {
            t.len = len;
            self.stats.probes_sent += 1;
            self.queue.push_back(t);
        }
    }

    /// Writes the LEAVE that ends this membership into `buf` (None before a
    /// CHALLENGE).
    pub fn emit_leave(&self, buf: &mut [u8]) -> Option<usize> {
        self.hs.emit_leave(buf)
    }

    /// The LEAVE of a member that goes on with its job on the host path
    /// (`count` = [`crate::wire::LEAVE_FOR_HOSTS`]).
    pub fn emit_leave_for_hosts(&self, buf: &mut [u8]) -> Option<usize> {
        self.hs
            .emit_leave_because(crate::wire::LEAVE_FOR_HOSTS, buf)
    }
}

#[cfg(test)]
mod provision_tests;

#[cfg(test)]
mod tests {
    //! Sessions against the real switch table, in virtual time; lost,
    //! duplicated and forged messages are made by the tests.
    use super::*;
    use crate::auth;
    use crate::switch::{Endpoint, Ipv4Prefix, JobConfig, JobTable, Source, TableConfig};
    use crate::tag::TAG_LEN;
    use crate::wire::{ChallengePayload, HelloPayload, NACK_PAYLOAD_LEN, OP_SUM};

    const JOB: u16 = 1;
    const SECRET: [u8; 32] = [3; 32];

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

    /// The tests' job: `n` ranks, 4 slots of 2 float32 elements.
    fn job_config(n: u16, auth: AuthMode) -> JobConfig {
        JobConfig {
            id: JOB,
            n_workers: n,
            allowed_sources: vec![Ipv4Prefix {
                addr: [198, 18, 0, 0],
                len: 24,
            }],
            secret: SECRET,
            pool_slots: 4,
            elems_per_chunk: 2,
            dtype: Dtype::F32,
            window: 4,
            priority: Default::default(),
            auth,
            upstream: None,
            stats: false,
        }
    }

    fn table(gen: u32, n: u16, auth: AuthMode, now: Instant) -> JobTable {
        let mut t = JobTable::new(TableConfig::new(gen, [5; 32]), now);
        t.add(job_config(n, auth), 64).unwrap();
        t
    }

    fn session(rank: u16, n: u16) -> WorkerSession {
        let e = endpoint(rank);
        let params = JoinParams {
            job: JOB,
            rank,
            n_workers: n,
            dtype: Dtype::F32 as u8,
            op: OP_SUM,
            secret: SECRET,
            ip: e.source.ip,
            port: e.source.port,
            provision: None,
        };
        let cfg = SessionConfig {
            join_timeout: Duration::from_secs(3),
            stall_timeout: Duration::from_secs(2),
        };
        WorkerSession::new(params, cfg, [rank as u8 + 7; 32])
    }

    /// Everything the table would send now, encoded.
    fn replies(t: &mut JobTable) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(r) = t.poll_reply() {
            let mut b = vec![0u8; 2048];
            if let Some(e) = t.encode(&r, &mut b) {
                b.truncate(e.len);
                out.push(b);
            }
        }
        out
    }

    /// Sends what the session has for the switch now; returns the replies.
    fn exchange(s: &mut WorkerSession, t: &mut JobTable, now: Instant) -> Vec<Vec<u8>> {
        let rank = s.params().rank;
        while let Some(x) = s.poll_transmit(now) {
            t.handle(x.bytes(), endpoint(rank), false, now);
        }
        replies(t)
    }

    fn msg_type(b: &[u8]) -> MsgType {
        HeaderRepr::parse(&Header::new_checked(b).unwrap())
            .unwrap()
            .msg_type
    }

    fn feed(s: &mut WorkerSession, msgs: &[Vec<u8>], now: Instant) -> Vec<Event> {
        msgs.iter().filter_map(|m| s.handle(m, now)).collect()
    }

    fn joined(ev: &[Event]) -> Option<&Joined> {
        ev.iter().find_map(|e| match e {
            Event::Joined(j) => Some(&**j),
            _ => None,
        })
    }

    /// A clean join of a one-rank job; returns the switch nonce of the
    /// accepted JOIN (for the session key).
    fn join(s: &mut WorkerSession, t: &mut JobTable, resume: (u32, u32), now: Instant) -> Nonce {
        s.start_join(resume.0, resume.1, now);
        let challenge = exchange(s, t, now);
        let nonce = ChallengePayload::parse(&challenge[0][HEADER_LEN..])
            .unwrap()
            .nonce;
        assert!(feed(s, &challenge, now).is_empty());
        let acks = exchange(s, t, now);
        let ev = feed(s, &acks, now);
        assert!(joined(&ev).is_some(), "{ev:?}");
        nonce
    }

    fn hello_nonce(t: &Transmit) -> Nonce {
        assert_eq!(t.msg_type, MsgType::Hello);
        HelloPayload::parse(&t.bytes()[HEADER_LEN..]).unwrap().nonce
    }

    fn nack(gen: u32, reason: NackReason, echo: Nonce, key: Option<&[u8; 32]>) -> Vec<u8> {
        let mut h = HeaderRepr::new(MsgType::Nack, JOB);
        h.gen = gen;
        let mut b = vec![0u8; HEADER_LEN + NACK_PAYLOAD_LEN];
        h.emit_to(&mut b).unwrap();
        let mut p = NackPayload::new(reason);
        p.echo = echo;
        if let Some(k) = key {
            let hb: [u8; HEADER_LEN] = b[..HEADER_LEN].try_into().unwrap();
            p.tag = auth::nack_tag(k, &hb, reason as u16, &echo);
        }
        p.emit(&mut b[HEADER_LEN..]).unwrap();
        b
    }

    fn all_reasons() -> Vec<NackReason> {
        (0..=32).filter_map(NackReason::from_u16).collect()
    }

    #[test]
    fn joins_through_lost_duplicated_and_forged_hellos_challenges_joins_and_join_acks() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        s.start_join(0, 5, t0);
        // The first HELLO is lost; the same HELLO goes again after 200 ms.
        let lost = s.poll_transmit(t0).unwrap();
        assert!(s.poll_transmit(t0).is_none());
        assert_eq!(s.poll_timeout(), Some(t0 + JOIN_RESEND));
        let t1 = t0 + JOIN_RESEND;
        let again = s.poll_transmit(t1).unwrap();
        assert_eq!(lost.bytes(), again.bytes());
        // Duplicated on the way: two CHALLENGEs, each with its own switch
        // nonce.
        t.handle(again.bytes(), endpoint(0), false, t1);
        t.handle(again.bytes(), endpoint(0), false, t1);
        let ch = replies(&mut t);
        assert_eq!(ch.len(), 2);
        assert_eq!(msg_type(&ch[0]), MsgType::Challenge);
        let nonce_of = |b: &[u8]| ChallengePayload::parse(&b[HEADER_LEN..]).unwrap().nonce;
        assert_ne!(nonce_of(&ch[0]), nonce_of(&ch[1]));

        // A forged CHALLENGE (another hello nonce) is ignored: still a HELLO.
        let mut forged = ch[0].clone();
        forged[HEADER_LEN] ^= 1;
        assert!(s.handle(&forged, t1).is_none());
        assert_eq!(s.poll_timeout(), Some(t1 + JOIN_RESEND));

        // The real ones: the JOIN goes at once and proves the first's switch
        // nonce; the second does not change it (switching after the JOIN
        // went out would make every resend a replay).
        assert!(s.handle(&ch[0], t1).is_none());
        let join = s.poll_transmit(t1).unwrap();
        assert_eq!(join.msg_type, MsgType::Join);
        assert!(s.handle(&ch[1], t1).is_none());
        let proves = |b: &[u8]| {
            crate::wire::JoinPayload::parse(&b[HEADER_LEN..])
                .unwrap()
                .nonce
        };
        assert_eq!(proves(join.bytes()), nonce_of(&ch[0]));
        // The JOIN is lost; the same JOIN goes again.
        let t2 = t1 + JOIN_RESEND;
        let join2 = s.poll_transmit(t2).unwrap();
        assert_eq!(join.bytes(), join2.bytes());
        t.handle(join2.bytes(), endpoint(0), false, t2);
        let acks = replies(&mut t);
        assert_eq!(msg_type(&acks[0]), MsgType::JoinAck);

        // A JOIN_ACK with a bad tag is counted and ignored.
        let mut bad = acks[0].clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(s.handle(&bad, t2).is_none());
        assert_eq!(s.stats().bad_tag_join_acks, 1);
        assert!(!s.is_joined());

        // The JOIN_ACK itself is lost: the JOIN goes again and the switch
        // answers the copy with the JOIN_ACK again.
        let t3 = t2 + JOIN_RESEND;
        assert_eq!(s.poll_timeout(), Some(t3));
        let join3 = s.poll_transmit(t3).unwrap();
        assert_eq!(join3.bytes(), join.bytes());
        t.handle(join3.bytes(), endpoint(0), false, t3);
        let acks = replies(&mut t);
        let ev = feed(&mut s, &acks, t3);
        let j = joined(&ev).expect("joined");
        assert_eq!((j.collective, j.seq, j.gen), (0, 5, 1));
        assert_eq!((j.pool_slots, j.elems_per_chunk, j.window), (4, 2, 4));
        assert!(j.first);
        assert!(s.is_joined());
        // A copy of the JOIN_ACK changes nothing; nothing more to send.
        assert!(s.handle(&acks[0], t3).is_none());
        assert!(s.poll_transmit(t3 + JOIN_RESEND * 3).is_none());
    }

    #[test]
    fn an_address_mismatch_is_fatal_and_no_join_ack_times_out() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        // Bound to port 1000, the switch sees 1001 (a NAT).
        let mut s = session(0, 1);
        s.start_join(0, 0, t0);
        let hello = s.poll_transmit(t0).unwrap();
        t.handle(hello.bytes(), endpoint(1), false, t0);
        let ch = replies(&mut t);
        // The CHALLENGE for rank 1 is not ours; rewritten to rank 0 it is,
        // and it reports another port.
        let ev = feed(&mut s, &ch, t0);
        match &ev[..] {
            [Event::Failed(SessionError::Handshake(ChallengeError::AddressMismatch {
                observed_port: 1001,
                port: 1000,
                ..
            }))] => {}
            other => panic!("{other:?}"),
        }
        assert!(s.is_failed());
        assert!(s.poll_transmit(t0 + JOIN_RESEND).is_none());

        let mut s = session(0, 1);
        s.start_join(0, 0, t0);
        let mut now = t0;
        while let Some(d) = s.poll_timeout() {
            now = d;
            while s.poll_transmit(now).is_some() {}
            if let Some(e) = s.handle_timeout(now) {
                assert!(matches!(e, Event::Failed(SessionError::JoinTimeout(_))));
                break;
            }
        }
        assert_eq!(now, t0 + Duration::from_secs(3));
        assert!(s.is_failed());
    }

    #[test]
    fn each_nack_reason_while_joining() {
        let t0 = Instant::now();
        for reason in all_reasons() {
            let mut s = session(0, 2);
            s.start_join(0, 0, t0);
            let hello = s.poll_transmit(t0).unwrap();
            let echo = hello_nonce(&hello);
            // A NACK that does not echo our nonce is never ours.
            assert!(s.handle(&nack(0, reason, [9; 16], None), t0).is_none());
            let ev = s.handle(&nack(0, reason, echo, None), t0);
            match reason {
                NackReason::StaleNonce | NackReason::StaleGeneration => {
                    assert!(ev.is_none(), "{reason:?}");
                    // A fresh handshake at once.
                    let h = s.poll_transmit(t0).unwrap();
                    assert_ne!(hello_nonce(&h), echo, "{reason:?}");
                }
                NackReason::JobNotActive => {
                    assert!(ev.is_none());
                    assert!(s.poll_transmit(t0).is_none());
                }
                _ => {
                    assert!(
                        matches!(ev, Some(Event::Failed(SessionError::Refused(r))) if r == reason),
                        "{reason:?}: {ev:?}"
                    );
                }
            }
            assert_eq!(s.stats().nacks, 2);
        }
    }

    #[test]
    fn each_nack_reason_once_joined_and_unauthenticated_ones_probe() {
        let t0 = Instant::now();
        for reason in all_reasons() {
            let mut t = table(1, 1, AuthMode::Port, t0);
            let mut s = session(0, 1);
            let nonce = join(&mut s, &mut t, (0, 0), t0);
            let key = auth::session_key(&SECRET, JOB, 0, 1, &nonce);
            // Untagged, or tagged under another key: ignored, counted, and
            // a probe goes (one per 200 ms).
            for (i, k) in [None, Some(&[1u8; 32])].into_iter().enumerate() {
                assert!(s.handle(&nack(1, reason, [0; 16], k), t0).is_none());
                assert_eq!(s.stats().unauthenticated_dropped, i as u64 + 1);
            }
            let probe = s.poll_transmit(t0).unwrap();
            assert!(probe.probe);
            assert!(s.poll_transmit(t0).is_none());
            assert_eq!(s.stats().probes_sent, 1);
            assert!(s.is_joined());

            let ev = s.handle(&nack(1, reason, [0; 16], Some(&key)), t0);
            match reason {
                NackReason::JobNotActive | NackReason::StaleGeneration => {
                    assert!(
                        matches!(ev, Some(Event::SessionLost(Lost::Nack(r))) if r == reason),
                        "{ev:?}"
                    );
                    assert_eq!(s.stats().rejoins, 1);
                    assert!(!s.is_joined());
                }
                NackReason::StaleNonce => assert!(ev.is_none() && s.is_joined()),
                _ => assert!(
                    matches!(ev, Some(Event::Failed(SessionError::Refused(r))) if r == reason),
                    "{reason:?}: {ev:?}"
                ),
            }
        }
    }

    #[test]
    fn a_nack_echoing_the_probe_is_a_real_refusal() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        join(&mut s, &mut t, (0, 0), t0);
        assert!(s
            .handle(&nack(1, NackReason::UnknownJob, [0; 16], None), t0)
            .is_none());
        let probe = s.poll_transmit(t0).unwrap();
        let echo = hello_nonce(&probe);
        let ev = s.handle(&nack(1, NackReason::UnknownJob, echo, None), t0);
        assert!(matches!(
            ev,
            Some(Event::Failed(SessionError::Refused(NackReason::UnknownJob)))
        ));
    }

    /// The switch restarts (a new generation, no sessions): its untagged
    /// NACK makes the worker probe, the CHALLENGE to the probe shows the new
    /// generation, and the worker joins again from its resume point.
    /// Lane replies (docs/PROTOCOL.md, "Seq lanes"): the JOIN carries
    /// `LANE_REPLIES` only when asked; `Joined::lane_replies` is the
    /// JOIN_ACK's bit, which a switch with lanes sets for a JOIN that asked;
    /// the bit flipped on the way breaks the JOIN_ACK's tag (refused as any
    /// bad tag); a lane copy has the grant; a later JOIN without asking
    /// ends it.
    #[test]
    fn lane_replies_are_asked_by_the_join_and_granted_under_the_join_acks_tag() {
        let t0 = Instant::now();
        for (lanes, ask) in [(1, false), (1, true), (4, false), (4, true)] {
            let mut t = JobTable::new(
                TableConfig {
                    seq_lanes: lanes,
                    ..TableConfig::new(1, [5; 32])
                },
                t0,
            );
            t.add(job_config(1, AuthMode::Port), 64).unwrap();
            let mut s = session(0, 1);
            s.set_lane_replies(ask);
            assert!(!s.lane_replies(), "nothing is granted before a join");
            s.start_join(0, 0, t0);
            let ch = exchange(&mut s, &mut t, t0);
            assert!(feed(&mut s, &ch, t0).is_empty());
            let join = s.poll_transmit(t0).unwrap();
            assert_eq!(join.msg_type, MsgType::Join);
            let h = HeaderRepr::parse(&Header::new_checked(join.bytes()).unwrap()).unwrap();
            assert_eq!(h.flags, if ask { flags::LANE_REPLIES } else { 0 });
            t.handle(join.bytes(), endpoint(0), false, t0);
            let acks = replies(&mut t);
            assert_eq!(acks.len(), 1);
            let granted = ask && lanes > 1;
            assert_eq!(acks[0][1] & flags::LANE_REPLIES != 0, granted);
            // The bit flipped (a grant forged, or one taken away): the tag
            // no longer verifies.
            let mut flipped = acks[0].clone();
            flipped[1] ^= flags::LANE_REPLIES;
            assert!(s.handle(&flipped, t0).is_none());
            assert_eq!(s.stats().bad_tag_join_acks, 1);
            assert!(!s.is_joined() && !s.lane_replies());
            let ev = feed(&mut s, &acks, t0);
            let j = joined(&ev).expect("joined");
            assert_eq!(j.lane_replies, granted, "lanes {lanes}, asked {ask}");
            assert_eq!(j.seq_lanes, lanes);
            assert_eq!(s.lane_replies(), granted);
            assert_eq!(s.lane_copy().lane_replies(), granted);
            // Asking no more: the next JOIN (a fresh handshake) carries no
            // flag, and its JOIN_ACK grants nothing.
            s.set_lane_replies(false);
            let t1 = t0 + Duration::from_millis(10);
            s.start_join(0, 0, t1);
            let ch = exchange(&mut s, &mut t, t1);
            assert!(feed(&mut s, &ch, t1).is_empty());
            let join = s.poll_transmit(t1).unwrap();
            assert_eq!(join.bytes()[1] & flags::LANE_REPLIES, 0);
            t.handle(join.bytes(), endpoint(0), false, t1);
            let ev = feed(&mut s, &replies(&mut t), t1);
            assert!(!joined(&ev).expect("joined again").lane_replies);
            assert!(!s.lane_replies());
        }
    }

    #[test]
    fn a_switch_restart_is_found_by_a_probe_and_rejoined() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        join(&mut s, &mut t, (0, 0), t0);

        // A spoofed trigger first: the probe's answer has our generation.
        assert!(s
            .handle(&nack(1, NackReason::StaleGeneration, [0; 16], None), t0)
            .is_none());
        let ch = exchange(&mut s, &mut t, t0);
        assert!(feed(&mut s, &ch, t0).is_empty());
        assert_eq!(s.stats().spoofed_triggers, 1);
        assert!(s.is_joined());

        let t1 = t0 + Duration::from_secs(1);
        let mut t = table(2, 1, AuthMode::Port, t1);
        let c = crate::member::collective::Collective::new(3, 40, 8, 2);
        let tx = crate::member::collective::Transmit {
            seq: 41,
            chunk: 1,
            offset: 2,
            count: 2,
            last: false,
            retx: false,
            kind: crate::wire::Kind::AllReduce,
            owner: 0,
            values: Some(2),
        };
        let h = s.data_header(&tx, c.collective());
        let mut b = vec![0u8; HEADER_LEN + 8];
        h.emit_to(&mut b).unwrap();
        t.handle(&b, endpoint(0), false, t1);
        let nacks = replies(&mut t);
        assert_eq!(msg_type(&nacks[0]), MsgType::Nack);
        assert!(feed(&mut s, &nacks, t1).is_empty());
        assert_eq!(s.stats().unauthenticated_dropped, 2);
        // A copy of the CHALLENGE counts once.
        let ch = exchange(&mut s, &mut t, t1);
        let ev = feed(&mut s, &[ch[0].clone(), ch[0].clone()], t1);
        match &ev[..] {
            [Event::SessionLost(Lost::Restarted { gen: 2 })] => {}
            other => panic!("{other:?}"),
        }
        s.start_join(3, 41, t1);
        let ch = exchange(&mut s, &mut t, t1);
        feed(&mut s, &ch, t1);
        let acks = exchange(&mut s, &mut t, t1);
        let ev = feed(&mut s, &acks, t1);
        let j = joined(&ev).expect("rejoined");
        assert_eq!((j.gen, j.collective, j.seq, j.first), (2, 3, 41, false));
        assert_eq!(s.gen(), 2);
        assert_eq!(s.data_header(&tx, 3).gen, 2);
    }

    /// Probes of two shares' oldest chunks (a rank's threads probe through
    /// one session) both go out; a second ask about a seq still queued
    /// adds nothing; a lane copy never sends one.
    #[test]
    fn asks_about_different_seqs_queue_one_heartbeat_each() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        join(&mut s, &mut t, (0, 0), t0);
        s.ask_about(8);
        s.ask_about(9);
        s.ask_about(8);
        let seqs: Vec<u32> = std::iter::from_fn(|| s.poll_transmit(t0))
            .map(|hb| {
                assert_eq!(hb.msg_type, MsgType::Heartbeat);
                HeaderRepr::parse(&Header::new_checked(hb.bytes()).unwrap())
                    .unwrap()
                    .seq
            })
            .collect();
        assert_eq!(seqs, [8, 9]);
        assert_eq!(s.stats().heartbeats_sent, 2);
        // Sent: the same seq may be asked about again.
        s.ask_about(8);
        assert!(s.poll_transmit(t0).is_some());
        let mut lane = s.lane_copy();
        lane.ask_about(10);
        assert!(lane.poll_transmit(t0).is_none());
    }

    #[test]
    fn heartbeats_after_half_a_second_without_progress_then_the_stall() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        join(&mut s, &mut t, (0, 0), t0);
        assert_eq!(
            s.poll_timeout(),
            None,
            "nothing to watch between collectives"
        );
        s.track(0, 7, Some(t0));
        let ms = Duration::from_millis;
        assert_eq!(s.poll_timeout(), Some(t0 + HEARTBEAT_EVERY));
        assert!(s.handle_timeout(t0 + ms(499)).is_none());
        assert!(s.poll_transmit(t0 + ms(499)).is_none());
        assert!(s.handle_timeout(t0 + ms(500)).is_none());
        let hb = s.poll_transmit(t0 + ms(500)).unwrap();
        assert_eq!(hb.msg_type, MsgType::Heartbeat);
        let r = HeaderRepr::parse(&Header::new_checked(hb.bytes()).unwrap()).unwrap();
        assert_eq!((r.seq, r.gen, r.rank), (7, 1, 0));
        // The switch answers: what seq 7 waits for.
        t.handle(hb.bytes(), endpoint(0), false, t0 + ms(500));
        let ans = replies(&mut t);
        match s.handle(&ans[0], t0 + ms(500)) {
            Some(Event::Waiting { header, .. }) => assert_eq!(header.seq, 7),
            other => panic!("{other:?}"),
        }
        // Again every 500 ms while nothing moves.
        s.track(0, 7, Some(t0));
        assert_eq!(s.poll_timeout(), Some(t0 + ms(1000)));
        assert!(s.handle_timeout(t0 + ms(800)).is_none());
        assert!(s.poll_transmit(t0 + ms(800)).is_none());
        s.handle_timeout(t0 + ms(1000));
        assert!(s.poll_transmit(t0 + ms(1000)).is_some());
        // Progress: quiet for another 500 ms.
        s.track(0, 9, Some(t0 + ms(1200)));
        s.handle_timeout(t0 + ms(1600));
        assert!(s.poll_transmit(t0 + ms(1600)).is_none());
        assert_eq!(s.poll_timeout(), Some(t0 + ms(1700)));
        assert_eq!(s.stats().heartbeats_sent, 2);
        // No progress for the stall timeout: reported once.
        let stall = t0 + ms(1200) + Duration::from_secs(2);
        assert!(s.poll_timeout().unwrap() <= stall);
        match s.handle_timeout(stall) {
            Some(Event::Stalled {
                collective: 0,
                seq: 9,
                waited,
            }) => assert_eq!(waited, Duration::from_secs(2)),
            other => panic!("{other:?}"),
        }
        assert!(s.handle_timeout(stall + ms(1)).is_none());
    }

    /// A job resized while a worker of the old size waits mid-collective
    /// (docs/PROTOCOL.md, "Elastic jobs"): its HEARTBEAT gets the
    /// authenticated NACK 6, it joins again, and its JOIN (the old n) is
    /// refused for good with NACK 5, which the worker reports; a worker of
    /// the new size joins and continues the seqs.
    #[test]
    fn a_worker_of_the_old_size_is_refused_after_a_resize() {
        let t0 = Instant::now();
        let mut t = table(1, 1, AuthMode::Port, t0);
        let mut s = session(0, 1);
        join(&mut s, &mut t, (0, 0), t0);
        assert_eq!(t.resize_job(JOB, 2), Ok(true));
        s.track(0, 7, Some(t0));
        let t1 = t0 + HEARTBEAT_EVERY;
        assert!(s.handle_timeout(t1).is_none());
        let nack6 = exchange(&mut s, &mut t, t1);
        match &feed(&mut s, &nack6, t1)[..] {
            [Event::SessionLost(Lost::Nack(NackReason::JobNotActive))] => {}
            other => panic!("{other:?}"),
        }
        s.start_join(0, 7, t1);
        let ch = exchange(&mut s, &mut t, t1);
        assert!(feed(&mut s, &ch, t1).is_empty());
        let refusal = exchange(&mut s, &mut t, t1);
        match &feed(&mut s, &refusal, t1)[..] {
            [Event::Failed(SessionError::Refused(NackReason::ParametersDiffer))] => {}
            other => panic!("{other:?}"),
        }
        assert!(s.is_failed());
        // Workers of the new size: a fresh start resumes where it stopped.
        let mut fresh: Vec<WorkerSession> = (0..2).map(|r| session(r, 2)).collect();
        let mut acks = Vec::new();
        for f in &mut fresh {
            f.start_join(0, 0, t1);
            let ch = exchange(f, &mut t, t1);
            feed(f, &ch, t1);
            acks = exchange(f, &mut t, t1);
        }
        assert_eq!(acks.len(), 2, "a JOIN_ACK to each rank once both joined");
        let ev = feed(&mut fresh[0], &acks[..1], t1);
        let j = joined(&ev).expect("joined the resized job");
        assert_eq!((j.collective, j.seq), (0, 0), "nothing completed before");
    }

    /// A RESULT reaches the collective only under the session's generation,
    /// with exactly `count` values and, in a mac job, a tag that verifies.
    #[test]
    fn results_are_checked_before_the_collective_sees_them() {
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let t0 = Instant::now();
            let mut t = table(1, 1, auth, t0);
            let mut s = session(0, 1);
            join(&mut s, &mut t, (0, 0), t0);
            let tx = crate::member::collective::Transmit {
                seq: 0,
                chunk: 0,
                offset: 0,
                count: 2,
                last: true,
                retx: false,
                kind: crate::wire::Kind::AllReduce,
                owner: 0,
                values: Some(0),
            };
            let h = s.data_header(&tx, 0);
            assert!(h.has_flag(flags::LAST));
            let values: Vec<u8> = [1.5f32, -2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let mut b = vec![0u8; HEADER_LEN];
            h.emit_to(&mut b).unwrap();
            b.extend_from_slice(&values);
            b.extend(s.data_tag(&h, &values).into_iter().flatten());
            assert_eq!(b.len(), HEADER_LEN + 8 + auth.data_tag_len());
            t.handle(&b, endpoint(0), false, t0);
            let res = replies(&mut t);
            assert_eq!(msg_type(&res[0]), MsgType::Result);
            match s.handle(&res[0], t0) {
                Some(Event::Result {
                    header,
                    values: v,
                    stats,
                }) => {
                    assert_eq!((header.seq, header.count), (0, 2));
                    assert_eq!(stats, None, "not a stats job");
                    assert_eq!(&res[0][v], &values[..]);
                }
                other => panic!("{other:?}"),
            }
            // One byte short.
            assert!(s.handle(&res[0][..res[0].len() - 1], t0).is_none());
            // A changed value fails the tag in a mac job (a port job's
            // token does not cover the values: only a host that sees the
            // RESULT can make that change).
            let mut changed = res[0].clone();
            changed[HEADER_LEN] ^= 1;
            let ev = s.handle(&changed, t0);
            match auth {
                AuthMode::Mac => {
                    assert!(ev.is_none());
                    assert_eq!(s.stats().bad_tag_results, 1);
                }
                AuthMode::Port => assert!(matches!(ev, Some(Event::Result { .. }))),
            }
            // A RESULT forged without the key (its token guessed, or left
            // out) is ignored in both modes, whatever the values.
            let before = s.stats().bad_tag_results;
            let mut forged = res[0].clone();
            let n = forged.len();
            forged[n - 1] ^= 0x40;
            assert!(s.handle(&forged, t0).is_none());
            let mut zero = res[0].clone();
            zero[n - TAG_LEN..].fill(0);
            assert!(s.handle(&zero, t0).is_none());
            assert_eq!(s.stats().bad_tag_results, before + 2);
            // Without the 16 bytes: the wrong length.
            assert!(s.handle(&res[0][..n - TAG_LEN], t0).is_none());
            // Another generation: not ours; probe.
            let mut other = res[0].clone();
            let mut r = HeaderRepr::parse(&Header::new_checked(&other[..]).unwrap()).unwrap();
            r.gen = 2;
            r.emit_to(&mut other).unwrap();
            assert!(s.handle(&other, t0).is_none());
            assert_eq!(s.stats().unauthenticated_dropped, 1);
            assert!(s.poll_transmit(t0).is_some_and(|p| p.probe));
        }
    }

    /// Joins a one-rank job whose JOIN_ACK's `stats` byte is rewritten to
    /// `byte` (and tagged again under the session key, as a switch of a
    /// stats job would send it); returns the events and the ack's epoch.
    fn join_with_stats_byte(
        s: &mut WorkerSession,
        t: &mut JobTable,
        byte: u8,
        now: Instant,
    ) -> (Vec<Event>, [u8; 8]) {
        use crate::wire::JOIN_ACK_TAGGED_LEN;
        s.start_join(0, 0, now);
        let challenge = exchange(s, t, now);
        let nonce = ChallengePayload::parse(&challenge[0][HEADER_LEN..])
            .unwrap()
            .nonce;
        feed(s, &challenge, now);
        let mut ack = exchange(s, t, now).remove(0);
        let hdr = HeaderRepr::parse(&Header::new_checked(&ack[..]).unwrap()).unwrap();
        assert_eq!(hdr.msg_type, MsgType::JoinAck);
        ack[HEADER_LEN + 7] = byte;
        let key = auth::session_key(&SECRET, JOB, 0, hdr.gen, &nonce);
        let body = HEADER_LEN..HEADER_LEN + JOIN_ACK_TAGGED_LEN;
        let tag = crate::tag::join_ack_tag(&key, &hdr, &ack[body.clone()]);
        ack[body.end..].copy_from_slice(&tag);
        let epoch = ack[HEADER_LEN + 8..HEADER_LEN + 16].try_into().unwrap();
        (feed(s, &[ack], now), epoch)
    }

    /// The JOIN_ACK's `stats` byte: 1 turns statistics on, 0 leaves them
    /// off, any other value is a typed, final error.
    #[test]
    fn the_join_acks_stats_byte_is_recorded_and_an_unknown_one_is_fatal() {
        let t0 = Instant::now();
        for (byte, want) in [(0u8, Some(false)), (1, Some(true)), (2, None), (255, None)] {
            let mut t = table(1, 1, AuthMode::Port, t0);
            let mut s = session(0, 1);
            let (ev, _) = join_with_stats_byte(&mut s, &mut t, byte, t0);
            match want {
                Some(on) => {
                    assert_eq!(joined(&ev).map(|j| j.stats), Some(on), "{ev:?}");
                    assert_eq!(s.grad_stats(), on);
                }
                None => {
                    assert!(
                        matches!(ev[..], [Event::Failed(SessionError::UnknownStats(b))] if b == byte),
                        "{ev:?}"
                    );
                    assert!(s.is_failed());
                    let msg = SessionError::UnknownStats(byte).to_string();
                    assert!(msg.contains(&format!("mode {byte}")) && msg.contains("upgrade"));
                }
            }
        }
    }

    /// In a stats job a summed RESULT must carry the 24-byte trailer
    /// (before the tag, which covers it) and its reserved bytes must be
    /// zero; an all-gather RESULT carries none. Anything else is ignored
    /// and counted as a wrong length.
    #[test]
    fn a_stats_jobs_results_carry_the_trailer_where_the_protocol_says() {
        use crate::stats::GradStats;
        use crate::tag::PacketKey;
        let trailer = GradStats {
            sum_of_squares: 12.5,
            square_of_sum: 3.0,
            ranks: 1,
        };
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let t0 = Instant::now();
            let mut t = table(1, 1, auth, t0);
            let mut s = session(0, 1);
            let (ev, epoch) = join_with_stats_byte(&mut s, &mut t, 1, t0);
            assert!(joined(&ev).is_some_and(|j| j.stats), "{ev:?}");
            let key = PacketKey::result(&SECRET, JOB, 1, &epoch);
            // A RESULT of `kind` with `values` (none: NOVAL) and `extra`
            // after them, tagged in a mac job, with a token in a port job.
            let result = |kind: Kind, values: &[f32], extra: &[u8]| {
                let mut h = HeaderRepr::new(MsgType::Result, JOB);
                h.gen = 1;
                h.count = values.len().max(2) as u16;
                h.flags = kind.flag_bits() | if values.is_empty() { flags::NOVAL } else { 0 };
                let mut b = vec![0u8; HEADER_LEN];
                h.emit_to(&mut b).unwrap();
                b.extend(values.iter().flat_map(|v| v.to_le_bytes()));
                b.extend_from_slice(extra);
                let tag = match auth {
                    AuthMode::Mac => key.tag(&h, &b[HEADER_LEN..]),
                    AuthMode::Port => key.token(&h),
                };
                b.extend_from_slice(&tag);
                b
            };
            let mut tb = [0u8; STATS_LEN];
            trailer.emit(&mut tb).unwrap();
            let mut bad = 0;
            for (kind, values, extra, want) in [
                (
                    Kind::AllReduce,
                    &[1.5f32, 2.0][..],
                    &tb[..],
                    Some(Some(trailer)),
                ),
                (Kind::ReduceScatter, &[][..], &tb[..], Some(Some(trailer))),
                (
                    Kind::ReduceScatter,
                    &[1.0, 2.0][..],
                    &tb[..],
                    Some(Some(trailer)),
                ),
                (Kind::AllGather, &[1.0, 2.0][..], &[][..], Some(None)),
                (Kind::AllGather, &[][..], &[][..], Some(None)),
                // No trailer where one belongs, one where none does, one
                // byte short (the header check drops it, uncounted),
                // reserved bytes set.
                (Kind::AllReduce, &[1.5, 2.0][..], &[][..], None),
                (Kind::ReduceScatter, &[][..], &[][..], None),
                (Kind::AllGather, &[1.0, 2.0][..], &tb[..], None),
                (Kind::AllReduce, &[1.5, 2.0][..], &tb[..23], None),
                (
                    Kind::AllReduce,
                    &[1.5, 2.0][..],
                    &[&tb[..23], &[1][..]].concat()[..],
                    None,
                ),
            ] {
                let b = result(kind, values, extra);
                let ev = s.handle(&b, t0);
                match (want, ev) {
                    (
                        Some(want),
                        Some(Event::Result {
                            header,
                            values: v,
                            stats,
                        }),
                    ) => {
                        assert_eq!(header.kind(), kind);
                        assert_eq!(v.len(), values.len() * 4);
                        assert_eq!(stats.map(|s| s.bits_eq(&trailer)), want.map(|_| true));
                    }
                    (None, None) => bad += u64::from(extra.len() != 23),
                    (want, ev) => panic!("{auth:?} {kind:?} {want:?}: {ev:?}"),
                }
                assert_eq!(s.stats().bad_length_results, bad, "{auth:?} {kind:?}");
            }
            assert_eq!(s.stats().bad_tag_results, 0);
            if auth == AuthMode::Mac {
                // The tag covers the trailer: a changed trailer fails it.
                let mut b = result(Kind::AllReduce, &[1.5, 2.0], &tb);
                b[HEADER_LEN + 8] ^= 1;
                assert!(s.handle(&b, t0).is_none());
                assert_eq!(s.stats().bad_tag_results, 1);
            }
        }
    }

    /// Against the real switch table of a `stats = true` job: the JOIN_ACK
    /// turns statistics on and a RESULT carries its chunk's statistics,
    /// those of `proto::stats::chunk_stats`, in both auth modes.
    #[test]
    fn a_stats_switchs_results_reach_the_collective_with_their_trailer() {
        for auth in [AuthMode::Port, AuthMode::Mac] {
            let t0 = Instant::now();
            let mut t = JobTable::new(TableConfig::new(1, [5; 32]), t0);
            let cfg = JobConfig {
                stats: true,
                ..job_config(1, auth)
            };
            t.add(cfg, 64).unwrap();
            let mut s = session(0, 1);
            s.start_join(0, 0, t0);
            let challenge = exchange(&mut s, &mut t, t0);
            feed(&mut s, &challenge, t0);
            let acks = exchange(&mut s, &mut t, t0);
            let ev = feed(&mut s, &acks, t0);
            assert!(joined(&ev).is_some_and(|j| j.stats), "{ev:?}");
            let tx = crate::member::collective::Transmit {
                seq: 0,
                chunk: 0,
                offset: 0,
                count: 2,
                last: true,
                retx: false,
                kind: Kind::AllReduce,
                owner: 0,
                values: Some(0),
            };
            let h = s.data_header(&tx, 0);
            let vals = [1.5f32, -3.0];
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut b = vec![0u8; HEADER_LEN];
            h.emit_to(&mut b).unwrap();
            b.extend_from_slice(&bytes);
            b.extend(s.data_tag(&h, &bytes).into_iter().flatten());
            t.handle(&b, endpoint(0), false, t0);
            let res = replies(&mut t);
            let want = crate::stats::chunk_stats(&[&vals], &vals);
            match s.handle(&res[0], t0) {
                Some(Event::Result { values, stats, .. }) => {
                    assert_eq!(&res[0][values], &bytes[..]);
                    assert!(stats.is_some_and(|g| g.bits_eq(&want)), "{stats:?}");
                }
                other => panic!("{auth:?}: {other:?}"),
            }
        }
    }
}
