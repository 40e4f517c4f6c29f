//! The worker's side of joining a job (docs/PROTOCOL.md, "Joining"), with
//! no I/O: HELLO → CHALLENGE → JOIN (→ JOIN_ACK), and the LEAVE that ends a
//! membership. Every worker (the library, the packet generator, the tests'
//! simulated workers) joins through this one type.
//!
//! Owns: [`Handshake`] (the job's parameters, the secret, the nonces of the
//! current attempt and the generation the switch announced).
//!
//! Invariants: the secret never leaves this type except inside a MAC; a
//! CHALLENGE or NACK counts only if it echoes this attempt's nonce, so a
//! stranger who cannot see our traffic cannot steer or abort our join.

use crate::auth::{self, JoinClaim};
use crate::tag::{self, AuthMode, PacketKey};
use crate::wire::{
    ChallengePayload, HeaderRepr, HelloPayload, JoinAckPayload, JoinPayload, LeavePayload, MsgType,
    NackPayload, Nonce, WireError, HEADER_LEN, HELLO_PAYLOAD_LEN, JOIN_ACK_TAGGED_LEN,
    JOIN_PAYLOAD_LEN, LEAVE_PAYLOAD_LEN, SECRET_LEN,
};

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
    #[error("bad JOIN_ACK: {0}")]
    Wire(#[from] WireError),
}

/// An authenticated JOIN_ACK: the job's parameters and, in an
/// `auth = "mac"` job, the keys of this membership's DATA and RESULTs.
#[derive(Debug, Clone)]
pub struct JoinAck {
    pub payload: JoinAckPayload,
    pub auth: AuthMode,
    /// Tags our DATA.
    pub data_key: Option<PacketKey>,
    /// Checks the switch's RESULTs during this activation.
    pub result_key: Option<PacketKey>,
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
    /// Header flags of the JOIN (a leaf switch's: `UPSTREAM`).
    join_flags: u8,
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
        }
    }

    /// This joiner is a leaf switch joining a spine: its JOINs carry
    /// `UPSTREAM` (docs/PROTOCOL.md, "Aggregation trees": a restarted leaf
    /// keeps its place).
    pub fn as_leaf(mut self) -> Handshake {
        self.join_flags |= crate::wire::flags::UPSTREAM;
        self
    }

    pub fn params(&self) -> &JoinParams {
        &self.params
    }

    /// Starts a new attempt (after a NACK 7, a stale nonce, or a switch
    /// restart): a new HELLO nonce, no challenge.
    pub fn restart(&mut self, hello_nonce: Nonce) {
        self.hello_nonce = hello_nonce;
        self.challenge = None;
        self.ip = self.params.ip;
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
        let mut h = HeaderRepr::new(MsgType::Hello, self.params.job);
        h.rank = self.params.rank;
        h.emit_to(buf)?;
        HelloPayload {
            nonce: self.hello_nonce,
        }
        .emit(&mut buf[HEADER_LEN..])?;
        Ok(HEADER_LEN + HELLO_PAYLOAD_LEN)
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
        let auth = AuthMode::from_u8(ack.auth).ok_or(JoinAckError::UnknownAuth(ack.auth))?;
        let (data_key, result_key) = match auth {
            AuthMode::Port => (None, None),
            AuthMode::Mac => (
                Some(PacketKey::data(&session)),
                Some(PacketKey::result(
                    &self.params.secret,
                    hdr.job,
                    hdr.gen,
                    &ack.epoch,
                )),
            ),
        };
        Ok(JoinAck {
            payload: ack,
            auth,
            data_key,
            result_key,
        })
    }

    /// Writes a LEAVE for the membership this attempt's JOIN made; `None`
    /// before a CHALLENGE.
    pub fn emit_leave(&self, buf: &mut [u8]) -> Option<usize> {
        let (nonce, gen) = self.challenge?;
        let p = &self.params;
        let mut h = HeaderRepr::new(MsgType::Leave, p.job);
        h.rank = p.rank;
        h.gen = gen;
        h.emit_to(buf).ok()?;
        let mac = auth::leave_mac(&p.secret, p.job, p.rank, gen, &nonce);
        LeavePayload { mac }.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
        Some(HEADER_LEN + LEAVE_PAYLOAD_LEN)
    }
}
