//! The worker's side of joining a job (docs/PROTOCOL.md, "Joining"), with
//! no I/O: HELLO → CHALLENGE → JOIN (→ JOIN_ACK), and the LEAVE that ends a
//! membership. Every worker (the library, the packet generator, the tests'
//! simulated workers) joins through this one type.
//!
//! Owns: [`Handshake`] (the job's parameters, the secret, the nonces of the
//! current attempt and the generation the switch announced) and
//! [`SessionGuard`] (after the JOIN_ACK: the session key that NACKs to us
//! must be tagged under, and the probe that tells a restarted switch from a
//! spoofed trigger; docs/PROTOCOL.md, "Sessions").
//!
//! Invariants: the secret never leaves this type except inside a MAC or the
//! session key; a CHALLENGE or NACK counts only if it echoes this attempt's
//! nonce (or, once joined, the probe's nonce, or its tag verifies under the
//! session key), so a stranger who cannot see our traffic cannot steer or
//! abort our join nor end or reset our collective.

use std::time::{Duration, Instant};

use crate::auth::{self, JoinClaim};
use crate::provisioner::{Asker, ProvisionSpec};
use crate::tag::{self, AuthMode, PacketKey};
use crate::wire::{
    seq_lanes_from_wire, ChallengePayload, HeaderRepr, HelloPayload, JoinAckPayload, JoinPayload,
    LeavePayload, MsgType, NackPayload, Nonce, WireError, HEADER_LEN, HELLO_PAYLOAD_LEN,
    JOIN_ACK_TAGGED_LEN, JOIN_PAYLOAD_LEN, LEAVE_PAYLOAD_LEN, SECRET_LEN,
};

/// At most one probe (a HELLO asking "did you restart?") this often, however
/// many unauthenticated triggers arrive.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// What a worker joins with.
#[derive(Clone)]
pub struct JoinParams {
    pub job: u16,
    pub rank: u16,
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    pub secret: [u8; SECRET_LEN],
    /// The worker's own IPv4 address (0.0.0.0 if the socket is not bound to
    /// one: the address the switch reports is used then) and UDP port.
    pub ip: [u8; 4],
    pub port: u16,
    /// A self-provisioned job (docs/PROTOCOL.md, "Tenants and
    /// self-provisioned jobs"): the session provisions it first and joins
    /// the id and derived secret the switch's PROVISIONED gives (`job` and
    /// `secret` above are replaced then); `None` for a declared job.
    pub provision: Option<ProvisionSpec>,
}

impl JoinParams {
    /// What a worker's PROVISION says besides the names: its shape and
    /// address, and job 0 (the switch picks the id).
    pub fn asker(&self) -> Asker {
        Asker {
            job: 0,
            rank: self.rank,
            n_workers: self.n_workers,
            dtype: self.dtype,
            op: self.op,
            ip: self.ip,
            port: self.port,
        }
    }
}

impl std::fmt::Debug for JoinParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinParams")
            .field("job", &self.job)
            .field("rank", &self.rank)
            .field("n_workers", &self.n_workers)
            .field("secret", &"<redacted>")
            .field("ip", &self.ip)
            .field("port", &self.port)
            .field("provision", &self.provision)
            .finish_non_exhaustive()
    }
}

/// Why a CHALLENGE was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChallengeError {
    #[error("not an answer to this HELLO")]
    NotOurs,
    #[error(
        "the switch sees this worker as {}:{} but it is bound to {}:{}; address translation \
         between worker and switch is not supported (bind to the address the switch sees)",
        std::net::Ipv4Addr::from(*observed_ip), observed_port,
        std::net::Ipv4Addr::from(*ip), port
    )]
    AddressMismatch {
        observed_ip: [u8; 4],
        observed_port: u16,
        ip: [u8; 4],
        port: u16,
    },
    #[error("bad CHALLENGE: {0}")]
    Wire(#[from] WireError),
}

/// Why a JOIN_ACK was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JoinAckError {
    #[error("not an answer to this JOIN")]
    NotOurs,
    #[error("JOIN_ACK tag does not verify under this join's session key")]
    BadTag,
    #[error(
        "the switch names auth mode {0}, which this worker does not know (upgrade the worker)"
    )]
    UnknownAuth(u8),
    #[error(
        "the switch sends auth = \"port\" RESULTs without a token (JOIN_ACK auth 0), which \
         any host could forge: upgrade switchd to a version with RESULT tokens"
    )]
    UntokenedResults,
    #[error("bad JOIN_ACK: {0}")]
    Wire(#[from] WireError),
}

/// An authenticated JOIN_ACK: the job's parameters, the key its RESULTs
/// are checked under and, in an `auth = "mac"` job, this membership's DATA
/// key.
#[derive(Debug, Clone)]
pub struct JoinAck {
    pub payload: JoinAckPayload,
    pub auth: AuthMode,
    /// Tags our DATA.
    pub data_key: Option<PacketKey>,
    /// Checks the switch's RESULTs during this activation.
    pub result_key: Option<PacketKey>,
    /// Authenticates the switch's NACKs to this membership: keyed by the
    /// same session key that the JOIN_ACK tag verified under.
    pub session: SessionGuard,
}

/// One worker's join attempts.
#[derive(Debug, Clone)]
pub struct Handshake {
    params: JoinParams,
    hello_nonce: Nonce,
    /// The switch's nonce and generation, once a CHALLENGE came.
    challenge: Option<(Nonce, u32)>,
    /// The address the MAC covers (ours, or the observed one when unbound).
    ip: [u8; 4],
    /// Header flags of the JOIN (a leaf switch's: `UPSTREAM`; a worker
    /// asking lane replies: `LANE_REPLIES`).
    join_flags: u8,
    /// The switch's seq lanes from the last CHALLENGE (1 before one).
    seq_lanes: u16,
}

impl Handshake {
    /// `hello_nonce` must be random (it is what makes answers ours).
    pub fn new(params: JoinParams, hello_nonce: Nonce) -> Handshake {
        Handshake {
            ip: params.ip,
            params,
            hello_nonce,
            challenge: None,
            join_flags: 0,
            seq_lanes: 1,
        }
    }

    /// This joiner is a leaf switch joining a spine: its JOINs carry
    /// `UPSTREAM` (docs/PROTOCOL.md, "Aggregation trees": a restarted leaf
    /// keeps its place).
    pub fn as_leaf(mut self) -> Handshake {
        self.join_flags |= crate::wire::flags::UPSTREAM;
        self
    }

    /// Whether every JOIN from now on asks for lane replies
    /// ([`crate::wire::flags::LANE_REPLIES`]; docs/PROTOCOL.md, "Seq
    /// lanes").
    pub fn set_lane_replies(&mut self, ask: bool) {
        if ask {
            self.join_flags |= crate::wire::flags::LANE_REPLIES;
        } else {
            self.join_flags &= !crate::wire::flags::LANE_REPLIES;
        }
    }

    pub fn params(&self) -> &JoinParams {
        &self.params
    }

    /// The job a PROVISIONED named and its derived secret: what every
    /// later HELLO, JOIN and LEAVE of this handshake is for.
    pub fn set_job(&mut self, job: u16, secret: [u8; SECRET_LEN]) {
        self.params.job = job;
        self.params.secret = secret;
    }

    /// Starts a new attempt (after a NACK 7, a stale nonce, or a switch
    /// restart): a new HELLO nonce, no challenge.
    pub fn restart(&mut self, hello_nonce: Nonce) {
        self.hello_nonce = hello_nonce;
        self.challenge = None;
        self.ip = self.params.ip;
    }

    /// The switch's seq lanes as its last CHALLENGE said ([`seq_lanes_from_wire`]):
    /// where DATA of each seq goes.
    pub fn seq_lanes(&self) -> u16 {
        self.seq_lanes
    }

    /// Whether a CHALLENGE has been taken (the next message is a JOIN).
    pub fn challenged(&self) -> bool {
        self.challenge.is_some()
    }

    /// The generation the switch announced in its CHALLENGE.
    pub fn gen(&self) -> Option<u32> {
        self.challenge.map(|c| c.1)
    }

    /// Writes a HELLO into `buf`; returns its length.
    pub fn emit_hello(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_hello_with(self.hello_nonce, buf)
    }

    /// Writes a HELLO with `nonce` (a probe's) into `buf`; returns its length.
    pub fn emit_hello_with(&self, nonce: Nonce, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut h = HeaderRepr::new(MsgType::Hello, self.params.job);
        h.rank = self.params.rank;
        h.emit_to(buf)?;
        HelloPayload { nonce }.emit(buf.get_mut(HEADER_LEN..).unwrap_or_default())?;
        Ok(HEADER_LEN + HELLO_PAYLOAD_LEN)
    }

    /// The guard of the membership this attempt's JOIN made, once its
    /// JOIN_ACK came: keyed by [`auth::session_key`] over the switch's
    /// nonce and generation from the CHALLENGE. `None` before a CHALLENGE.
    pub fn session(&self) -> Option<SessionGuard> {
        Some(self.guard(self.session_key()?, self.gen()?))
    }

    fn guard(&self, key: [u8; 32], gen: u32) -> SessionGuard {
        SessionGuard {
            key,
            gen,
            job: self.params.job,
            rank: self.params.rank,
            probe: None,
            last_probe: None,
        }
    }

    /// Takes a CHALLENGE (header already parsed).
    pub fn on_challenge(&mut self, hdr: &HeaderRepr, payload: &[u8]) -> Result<(), ChallengeError> {
        let c = ChallengePayload::parse(payload)?;
        if c.hello_nonce != self.hello_nonce
            || hdr.job != self.params.job
            || hdr.rank != self.params.rank
        {
            return Err(ChallengeError::NotOurs);
        }
        let p = &self.params;
        let unbound = p.ip == [0; 4];
        if (!unbound && c.observed_ip != p.ip) || c.observed_port != p.port {
            return Err(ChallengeError::AddressMismatch {
                observed_ip: c.observed_ip,
                observed_port: c.observed_port,
                ip: p.ip,
                port: p.port,
            });
        }
        self.ip = c.observed_ip;
        self.challenge = Some((c.nonce, hdr.gen));
        self.seq_lanes = seq_lanes_from_wire(c.seq_lanes);
        Ok(())
    }

    /// Whether a NACK answers this attempt (it echoes our HELLO's or our
    /// JOIN's nonce).
    pub fn nack_is_ours(&self, nack: &NackPayload) -> bool {
        nack.echo == self.hello_nonce || self.challenge.is_some_and(|c| c.0 == nack.echo)
    }

    /// Writes the JOIN proving the secret for resume point
    /// (`collective`, `seq`); `None` before a CHALLENGE.
    pub fn emit_join(&self, collective: u32, seq: u32, buf: &mut [u8]) -> Option<usize> {
        let (nonce, gen) = self.challenge?;
        let p = &self.params;
        let mut h = HeaderRepr::new(MsgType::Join, p.job);
        h.flags = self.join_flags;
        h.rank = p.rank;
        h.gen = gen;
        h.collective = collective;
        h.seq = seq;
        let claim = JoinClaim {
            job: p.job,
            rank: p.rank,
            gen,
            collective,
            seq,
            n_workers: p.n_workers,
            dtype: p.dtype,
            op: p.op,
            ip: self.ip,
            port: p.port,
        };
        let payload = JoinPayload {
            n_workers: p.n_workers,
            dtype: p.dtype,
            op: p.op,
            nonce,
            mac: auth::join_mac(&p.secret, &claim, &nonce),
        };
        h.emit_to(buf).ok()?;
        payload.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
        Some(HEADER_LEN + JOIN_PAYLOAD_LEN)
    }

    /// The session key of this attempt's JOIN ([`auth::session_key`]), once
    /// a CHALLENGE came: what the switch's JOIN_ACK tag and, in an
    /// `auth = "mac"` job, the DATA key derive from.
    pub fn session_key(&self) -> Option<[u8; 32]> {
        let (nonce, gen) = self.challenge?;
        let p = &self.params;
        Some(auth::session_key(&p.secret, p.job, p.rank, gen, &nonce))
    }

    /// Takes a JOIN_ACK (header already parsed) if it answers this
    /// attempt's JOIN: its generation and its tag under our session key.
    pub fn on_join_ack(&self, hdr: &HeaderRepr, payload: &[u8]) -> Result<JoinAck, JoinAckError> {
        let ack = JoinAckPayload::parse(payload)?;
        let session = self.session_key().ok_or(JoinAckError::NotOurs)?;
        if self.gen() != Some(hdr.gen) || hdr.job != self.params.job || hdr.rank != self.params.rank
        {
            return Err(JoinAckError::NotOurs);
        }
        if !tag::verify_join_ack(&session, hdr, &payload[..JOIN_ACK_TAGGED_LEN], &ack.tag) {
            return Err(JoinAckError::BadTag);
        }
        if ack.auth == tag::AUTH_PORT_UNTOKENED {
            return Err(JoinAckError::UntokenedResults);
        }
        let auth = AuthMode::from_u8(ack.auth).ok_or(JoinAckError::UnknownAuth(ack.auth))?;
        // Every RESULT is checked under this key: a mac job's tag, a port
        // job's token.
        let result_key = Some(PacketKey::result(
            &self.params.secret,
            hdr.job,
            hdr.gen,
            &ack.epoch,
        ));
        let data_key = match auth {
            AuthMode::Port => None,
            AuthMode::Mac => Some(PacketKey::data(&session)),
        };
        Ok(JoinAck {
            payload: ack,
            auth,
            data_key,
            result_key,
            session: self.guard(session, hdr.gen),
        })
    }

    /// Writes a LEAVE for the membership this attempt's JOIN made; `None`
    /// before a CHALLENGE.
    pub fn emit_leave(&self, buf: &mut [u8]) -> Option<usize> {
        self.emit_leave_because(0, buf)
    }

    /// [`Handshake::emit_leave`] with `count` = `reason` (0, or
    /// [`crate::wire::LEAVE_FOR_HOSTS`]).
    pub fn emit_leave_because(&self, reason: u16, buf: &mut [u8]) -> Option<usize> {
        let (nonce, gen) = self.challenge?;
        let p = &self.params;
        let mut h = HeaderRepr::new(MsgType::Leave, p.job);
        h.rank = p.rank;
        h.gen = gen;
        h.count = reason;
        h.emit_to(buf).ok()?;
        let mac = auth::leave_mac(&p.secret, p.job, p.rank, gen, &nonce);
        LeavePayload { mac }.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
        Some(HEADER_LEN + LEAVE_PAYLOAD_LEN)
    }
}

/// What a joined member (worker, or a leaf towards a spine) trusts during a
/// collective (docs/PROTOCOL.md, "Sessions"): a NACK whose tag verifies
/// under the session key, or one that echoes the nonce of its latest probe.
/// Anything else that would end or reset the collective (an unauthenticated
/// NACK, a RESULT of another generation) only makes it probe: a HELLO with
/// a fresh nonce, whose CHALLENGE proves that whoever answers sees our
/// traffic and tells whether the switch's generation changed.
#[derive(Clone)]
pub struct SessionGuard {
    key: [u8; 32],
    gen: u32,
    job: u16,
    rank: u16,
    /// The nonce of the latest probe, and when it went.
    probe: Option<Nonce>,
    last_probe: Option<Instant>,
}

impl std::fmt::Debug for SessionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGuard")
            .field("key", &"<redacted>")
            .field("gen", &self.gen)
            .field("probe", &self.probe.is_some())
            .finish_non_exhaustive()
    }
}

/// What a CHALLENGE says to a joined member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// Not an answer to our latest probe: ignore it.
    NotOurs,
    /// The switch answers under another generation: it restarted; join again.
    Restarted { gen: u32 },
    /// The switch answers under our generation: what made us probe was
    /// spoofed; go on.
    SameGeneration,
}

impl SessionGuard {
    /// The generation the session was made under.
    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// Whether `nack`, which arrived with header bytes `header`, is from the
    /// switch: its tag verifies under the session key, or it echoes our
    /// latest probe's nonce (a refusal of the probe: the job is gone, or we
    /// are no longer allowed).
    pub fn nack_is_authentic(&self, header: &[u8; HEADER_LEN], nack: &NackPayload) -> bool {
        let echoes_probe = self
            .probe
            .is_some_and(|p| bool::from(subtle::ConstantTimeEq::ct_eq(&p[..], &nack.echo[..])));
        echoes_probe
            || auth::verify_nack(&self.key, header, nack.reason as u16, &nack.echo, &nack.tag)
    }

    /// Something unauthenticated asked us to end or reset the collective:
    /// returns the nonce of a probe to send now, or `None` if one went less
    /// than [`PROBE_EVERY`] ago. `fresh` must be random (or otherwise
    /// unguessable by others).
    pub fn probe(&mut self, now: Instant, fresh: Nonce) -> Option<Nonce> {
        if self
            .last_probe
            .is_some_and(|t| now.saturating_duration_since(t) < PROBE_EVERY)
        {
            return None;
        }
        self.last_probe = Some(now);
        self.probe = Some(fresh);
        Some(fresh)
    }

    /// The nonce of the latest probe still unanswered.
    pub fn probe_nonce(&self) -> Option<Nonce> {
        self.probe
    }

    /// Judges a CHALLENGE (header already parsed) against our latest probe.
    pub fn on_challenge(&mut self, hdr: &HeaderRepr, payload: &[u8]) -> ProbeAnswer {
        let Ok(c) = ChallengePayload::parse(payload) else {
            return ProbeAnswer::NotOurs;
        };
        if self.probe != Some(c.hello_nonce) || hdr.job != self.job || hdr.rank != self.rank {
            return ProbeAnswer::NotOurs;
        }
        // One answer per probe: a copy of the CHALLENGE counts once.
        self.probe = None;
        if hdr.gen != self.gen {
            ProbeAnswer::Restarted { gen: hdr.gen }
        } else {
            ProbeAnswer::SameGeneration
        }
    }
}
