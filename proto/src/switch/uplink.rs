//! A leaf's sessions with its spines (docs/PROTOCOL.md, "Aggregation
//! trees"): the leaf sums its local ranks' chunk, sends that partial up to
//! the chunk's spine as an ordinary worker of the spine's job (rank = the
//! leaf's index), keeps it until the spine's RESULT returns and resends it
//! on a timer; the spine is an unchanged switch whose members are leaves.
//!
//! Owns: [`Uplink`] (per spine: the join handshake, the spine's generation
//! and window, the RTT estimate) and the timers of a leaf's side
//! ([`UPLINK_JOIN_RESEND`], [`UP_HEARTBEAT_EVERY`], [`SPINE_SILENT_AFTER`],
//! [`REFUSED_RETRY`]). What an operator declares (the leaf's index, the
//! number of leaves, the spines in tree order, the leaf's own uplink
//! address: [`Upstream`]) is in [`super::config`]; the leaf's half of
//! `Job` (its partials, their timers, the spines' answers), which the table
//! calls, is in `leaf.rs`.
//!
//! A self-provisioned leaf job (its tenant has `[tenant.upstream]`)
//! provisions the job on each spine before it joins it: per spine a
//! [`Provisioner`] (the tenant, its key, the job's name, the leaf job's own
//! id, `n_leaves` workers, f32, auth port, the job's stats and priority),
//! then the HELLO and JOIN with the derived secret, which is the leaf job's
//! own (docs/PROTOCOL.md, "Tenants and self-provisioned jobs", Trees).
//!
//! Layering: a `Job` holds its [`Uplink`], so `job.rs` names this file,
//! and this file names nothing of `job.rs`: the methods that need both a
//! job and its sessions are in `leaf.rs`, above both. (They were here, and
//! the two files named each other.)
//!
//! Invariants:
//! * Chunk `seq` goes through spine `seq mod K` as that spine's seq
//!   `seq div K`, so every spine sees consecutive seqs and all leaves agree
//!   on the tree of every chunk without talking to each other.
//! * The sum is taken in tree order: ranks in order within a leaf, leaves in
//!   order at the spine; the result is bit-identical whatever the arrival
//!   order, retransmissions included.
//! * A partial stays in its slot until the spine's RESULT replaces it; the
//!   leaf's floor does not pass it, so its local ranks' window cannot run
//!   past what the spine has not answered.
//! * A provisioned job's session with a spine sends a HELLO only after a
//!   PROVISIONED from that spine ([`SpineSession::provisioned`]); every
//!   restart of the session but a rejoin of a spine that kept our session
//!   provisions again ([`Uplink::restart`]). A spine that forgets the job
//!   it just provisioned (NACK 1 before any JOIN_ACK) is asked again only
//!   after [`REFUSED_RETRY`], never in a tight loop.
//! * A provisioned job's session is given up without an authenticated
//!   word from the spine only when the spine answers a probe under the
//!   session's generation and still not the HEARTBEATs before and after it:
//!   the spine lost the job and made it again (removed, or its lease ran
//!   out there, and another leaf provisioned it) without restarting. A
//!   forged NACK alone never does it: it only makes the leaf probe.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::handshake::{Handshake, JoinParams, SessionGuard};
use crate::member::config::TransportConfig;
use crate::member::rtt::RttEstimator;
use crate::provisioner::{Asker, ProvisionSpec, Provisioner};
use crate::tag::PacketKey;
use crate::wire::{
    Nonce, SpineRefusal, SpineSessionState, DTYPE_F32, NONCE_LEN, OP_SUM, SECRET_LEN,
};

use super::config::Upstream;
use super::counters::SpineCounters;

/// How often an unanswered HELLO or JOIN to a spine is sent again.
pub const UPLINK_JOIN_RESEND: Duration = Duration::from_millis(200);
/// A partial unanswered this long makes the leaf ask its spine what the
/// chunk waits for (a HEARTBEAT), and again as often while it waits: an
/// alive spine answers, so a silent one is known within about this long.
pub const UP_HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// A spine silent this long while a partial waits for it is logged
/// ([`super::Event::SpineSilent`]).
pub const SPINE_SILENT_AFTER: Duration = Duration::from_secs(2);
/// How long a leaf waits before asking a spine that refused it again (the
/// operator may fix the declaration meanwhile; no tight refusal loop).
pub const REFUSED_RETRY: Duration = Duration::from_secs(1);

/// The leaf's session with one spine.
#[derive(Debug, Clone)]
pub struct SpineSession {
    pub hs: Handshake,
    /// Generation the spine announced in its JOIN_ACK (None: not joined).
    pub joined_gen: Option<u32>,
    /// The session the accepted JOIN made (set with `joined_gen`): what the
    /// spine's NACKs must be tagged under, and the probe after an
    /// unauthenticated one (docs/PROTOCOL.md, "Sessions").
    pub guard: Option<SessionGuard>,
    /// The spine's RESULT key of that activation: its RESULTs' tokens are
    /// checked under it (docs/PROTOCOL.md, "RESULT tokens").
    pub(super) result_key: Option<PacketKey>,
    /// Probes so far (a counter in the probe's nonce).
    probes: u64,
    /// Window the spine allows, and the RTT to it.
    pub window: u16,
    pub rtt: RttEstimator,
    /// When the HELLO or JOIN of the current attempt goes out again.
    pub join_due: Option<Instant>,
    /// Attempts so far (a counter in the hello nonce).
    attempts: u64,
    /// When the leaf last heard anything from this spine.
    pub last_heard: Option<Instant>,
    /// When it last sent the spine a HEARTBEAT.
    pub(super) last_heartbeat: Option<Instant>,
    /// When the spine last answered one (as a member's: under our
    /// session's generation).
    pub(super) last_answer: Option<Instant>,
    /// A probe of this session was answered under its generation since the
    /// spine last answered a HEARTBEAT: the spine runs on, but (if its
    /// HEARTBEAT answers stay away) it no longer counts us a member.
    pub(super) probed_alive: bool,
    /// The spine's last HEARTBEAT answer: its seq and the leaves that seq
    /// waits for.
    pub waiting_for: Option<(u32, Vec<u16>)>,
    /// Logged as silent since then, and not heard from since.
    pub(super) silent_since: Option<Instant>,
    /// The spine refused our last JOIN (or its job does not match ours):
    /// why. Cleared when it accepts one.
    pub refused: Option<SpineRefusal>,
    /// What went to and came from this spine.
    pub counters: SpineCounters,
    /// A self-provisioned job's requester of the job on this spine
    /// (`None`: a declared job, which the spine has by declaration).
    pub(super) prov: Option<Provisioner>,
    /// The spine has the job for this session (its PROVISIONED came, or the
    /// job is declared): the HELLO may go.
    pub provisioned: bool,
    /// When the next provisioning round starts (`None`: none pending).
    pub(super) provision_due: Option<Instant>,
    /// A JOIN_ACK came since the last PROVISIONED: the spine knew the job
    /// then, so a NACK 1 now means it lost it (restarted), and the leaf
    /// provisions again at once.
    pub(super) joined_since_provision: bool,
}

impl SpineSession {
    /// Since when the spine has said nothing while a partial sent at
    /// `sent` waited for it (None: neither happened).
    pub(super) fn quiet_since(&self, sent: Option<Instant>) -> Option<Instant> {
        sent.max(self.last_heard)
    }

    /// How long a spine reported silent has been (None: not reported).
    pub fn silent_for(&self, now: Instant) -> Option<Duration> {
        self.silent_since.map(|t| now.saturating_duration_since(t))
    }

    /// Whether the leaf provisions the job on this spine (a
    /// self-provisioned job) and has no PROVISIONED for this session yet.
    pub fn provisioning(&self) -> bool {
        self.prov.is_some() && !self.provisioned
    }

    /// Joined, joining, or refused (and why).
    pub fn state(&self) -> SpineSessionState {
        match (self.joined_gen, self.refused) {
            (Some(_), _) => SpineSessionState::Joined,
            (None, Some(r)) => SpineSessionState::Refused(r),
            (None, None) => SpineSessionState::Joining,
        }
    }
}

/// Every spine session of one leaf job, and the transport tunables.
#[derive(Debug, Clone)]
pub struct Uplink {
    pub cfg: Upstream,
    pub spines: Vec<SpineSession>,
    pub transport: TransportConfig,
    /// Key of the hello nonces (derived from the switch's nonce key).
    nonce_key: [u8; 32],
    /// When `heartbeat_spines` next walks the partials.
    pub(super) heartbeat_pass_due: Option<Instant>,
}

impl Uplink {
    pub fn new(cfg: Upstream, job: u16, secret: [u8; SECRET_LEN], nonce_key: [u8; 32]) -> Uplink {
        let transport = TransportConfig::default();
        let spines = (0..cfg.spines.len())
            .map(|_| SpineSession {
                hs: Handshake::new(
                    JoinParams {
                        job,
                        rank: cfg.leaf_index,
                        n_workers: cfg.n_leaves,
                        dtype: DTYPE_F32,
                        op: OP_SUM,
                        secret,
                        ip: cfg.local_ip,
                        port: cfg.local_port,
                        provision: None,
                    },
                    [0; NONCE_LEN],
                )
                .as_leaf(),
                joined_gen: None,
                guard: None,
                result_key: None,
                probes: 0,
                window: 1,
                rtt: RttEstimator::new(&transport),
                join_due: None,
                attempts: 0,
                last_heard: None,
                last_heartbeat: None,
                last_answer: None,
                probed_alive: false,
                waiting_for: None,
                silent_since: None,
                refused: None,
                counters: SpineCounters::default(),
                prov: None,
                provisioned: true,
                provision_due: None,
                joined_since_provision: false,
            })
            .collect();
        Uplink {
            cfg,
            spines,
            transport,
            nonce_key,
            heartbeat_pass_due: None,
        }
    }

    /// A hello nonce no one else can guess: HMAC of the switch's key over
    /// the job, spine and attempt (proto reads no random source).
    fn hello_nonce(&self, job: u16, spine: usize, attempt: u64) -> Nonce {
        let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.nonce_key) else {
            unreachable!("HMAC accepts every key length")
        };
        m.update(b"aggswitch v2 uplink hello");
        m.update(&job.to_be_bytes());
        m.update(&(spine as u32).to_be_bytes());
        m.update(&attempt.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&full[..NONCE_LEN]);
        n
    }

    /// Makes this a self-provisioned job's uplink: before it joins a spine,
    /// the leaf provisions `spec`'s job there with its own id `job`, as
    /// worker `leaf_index` of `n_leaves`, f32, from its uplink address.
    /// `serial` (the table's nonce serial at the job's creation) keeps the
    /// provisioners' nonces apart from those of an earlier job of the same
    /// id.
    pub(super) fn provision_with(&mut self, spec: ProvisionSpec, job: u16, serial: u64) {
        let asker = Asker {
            job,
            rank: self.cfg.leaf_index,
            n_workers: self.cfg.n_leaves,
            dtype: DTYPE_F32,
            op: OP_SUM,
            ip: self.cfg.local_ip,
            port: self.cfg.local_port,
        };
        for k in 0..self.spines.len() {
            let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.nonce_key) else {
                unreachable!("HMAC accepts every key length")
            };
            m.update(b"aggswitch v4 uplink provision");
            m.update(&job.to_be_bytes());
            m.update(&(k as u32).to_be_bytes());
            m.update(&serial.to_be_bytes());
            let mut key = [0u8; 32];
            key.copy_from_slice(&m.finalize().into_bytes());
            let s = &mut self.spines[k];
            s.prov = Some(Provisioner::new(spec.clone(), asker, key));
            s.provisioned = false;
        }
    }

    /// Whether the leaf provisions its job on its spines (a
    /// self-provisioned job).
    pub fn is_provisioned_job(&self) -> bool {
        self.spines.iter().any(|s| s.prov.is_some())
    }

    /// Starts a session with spine `spine` now: a self-provisioned job
    /// provisions the job there first ([`Uplink::start_provision`]), a
    /// declared one joins ([`Uplink::start_join`]).
    pub(super) fn restart(&mut self, job: u16, spine: usize, now: Instant) {
        if self.spines[spine].prov.is_some() {
            self.start_provision(spine, now);
        } else {
            self.start_join(job, spine, now);
        }
    }

    /// Drops the session with spine `spine` and provisions the job there
    /// again, now (a round: ask, claim; [`super::JobTable::handle_timeout`]
    /// sends them).
    pub(super) fn start_provision(&mut self, spine: usize, now: Instant) {
        let s = &mut self.spines[spine];
        if let Some(p) = &mut s.prov {
            // Answers to the last round count no more.
            p.stop();
        }
        s.provisioned = false;
        s.joined_gen = None;
        s.guard = None;
        s.result_key = None;
        s.join_due = None;
        s.probed_alive = false;
        s.provision_due = Some(now);
    }

    /// Spine `spine` has the job (its PROVISIONED verified): join it now.
    pub(super) fn provisioned_by(&mut self, job: u16, spine: usize, now: Instant) {
        let s = &mut self.spines[spine];
        s.provisioned = true;
        s.provision_due = None;
        s.joined_since_provision = false;
        self.start_join(job, spine, now);
    }

    /// Starts (or restarts) joining spine `spine` now.
    pub fn start_join(&mut self, job: u16, spine: usize, now: Instant) {
        let attempt = self.spines[spine].attempts + 1;
        let nonce = self.hello_nonce(job, spine, attempt);
        let s = &mut self.spines[spine];
        s.attempts = attempt;
        s.hs.restart(nonce);
        s.probed_alive = false;
        s.joined_gen = None;
        s.guard = None;
        s.result_key = None;
        s.join_due = Some(now);
    }

    /// Spine `spine` refused us for `why`: ask again in [`REFUSED_RETRY`]
    /// (a self-provisioned job provisions again then).
    /// Returns `why` if it is news (not the refusal already recorded).
    pub(super) fn refused_by(
        &mut self,
        job: u16,
        spine: usize,
        why: SpineRefusal,
        now: Instant,
    ) -> Option<SpineRefusal> {
        self.retry_later(job, spine, now);
        let s = &mut self.spines[spine];
        (s.refused.replace(why) != Some(why)).then_some(why)
    }

    /// Spine `spine` would not have us: drop the session and start it
    /// again in [`REFUSED_RETRY`]. Counted as a refusal.
    pub(super) fn retry_later(&mut self, job: u16, spine: usize, now: Instant) {
        self.restart(job, spine, now);
        let s = &mut self.spines[spine];
        if s.prov.is_some() {
            s.provision_due = Some(now + REFUSED_RETRY);
        } else {
            s.join_due = Some(now + REFUSED_RETRY);
        }
        s.counters.refusals += 1;
    }

    /// Whether to probe spine `spine` now (at most one per
    /// [`crate::handshake::PROBE_EVERY`]); if so its guard holds the probe's
    /// nonce, which [`ReplyMsg::UpProbe`](super::ReplyMsg::UpProbe) sends.
    pub(super) fn want_probe(&mut self, job: u16, spine: usize, now: Instant) -> bool {
        let n = self.spines[spine].probes + 1;
        // Apart from the hello nonces' counter space (top bit set).
        let nonce = self.hello_nonce(job, spine, n | 1 << 63);
        let s = &mut self.spines[spine];
        let Some(g) = s.guard.as_mut() else {
            return false;
        };
        if g.probe(now, nonce).is_none() {
            return false;
        }
        s.probes = n;
        s.counters.probes_sent += 1;
        true
    }

    /// Whether every spine has answered our JOIN.
    pub fn all_joined(&self) -> bool {
        self.spines.iter().all(|s| s.joined_gen.is_some())
    }

    /// The retransmission timeout towards spine `spine` after `resends`.
    pub fn rto(&self, spine: usize, resends: u32) -> Duration {
        let base = self.spines[spine].rtt.rto();
        let doublings = resends.min(self.transport.max_backoff_doublings);
        (base * 2u32.pow(doublings)).min(self.transport.max_rto)
    }
}
