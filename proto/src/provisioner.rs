//! The requesting side of self-provisioning (docs/PROTOCOL.md, "Tenants and
//! self-provisioned jobs"), with no I/O: PROVISION ask → CHALLENGE →
//! PROVISION claim → PROVISIONED. A worker's session runs it before it
//! joins a provisioned job; a leaf's uplink runs it towards its spines.
//!
//! Owns: [`Provisioner`] (the tenant, its key, the job name and shape, the
//! nonces of the current attempt, the resend timer), [`ProvisionSpec`]
//! (what a member of a provisioned job keeps across restarts),
//! [`Outcome`] and [`ProvisionError`] (a refusal, typed, naming the quota).
//!
//! Invariants: the tenant key is only ever an HMAC key (claim MAC, job
//! secret) and never appears in a message, an error or a `Debug`; nothing
//! here reads a clock or a random source (nonces come from an HMAC of a
//! caller-given key and a counter, as [`crate::session::WorkerSession`]'s);
//! a CHALLENGE or NACK counts only if it echoes this attempt's ask nonce
//! (or, for a NACK, the claim's switch nonce), and a PROVISIONED only if it
//! echoes the claim's switch nonce and its tag verifies under the job
//! secret derived here, so nobody without the tenant key or a view of our
//! traffic can steer us to another job or abort us; a final outcome is
//! final: nothing is sent afterwards until [`Provisioner::start`].

use std::fmt;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::provision::{self, JobName, ProvisionClaim, TenantKey, TenantName};
use crate::tag::AuthMode;
use crate::wire::{
    ChallengePayload, Header, HeaderRepr, MsgType, NackPayload, NackReason, Nonce,
    ProvisionPayload, ProvisionedPayload, Quota, HEADER_LEN, NONCE_LEN, PROVISIONED_CREATED,
    PROVISION_ASK, PROVISION_CLAIM, PROVISION_PAYLOAD_LEN, SECRET_LEN,
};

/// An unanswered ask or claim is sent again this often.
pub const PROVISION_RESEND: Duration = Duration::from_millis(200);
/// Bytes of a PROVISION datagram (header and payload).
pub const PROVISION_LEN: usize = HEADER_LEN + PROVISION_PAYLOAD_LEN;

/// What a member of a self-provisioned job keeps to provision it (again):
/// the tenant, its key, the job's name and the parts of its shape that a
/// join does not carry.
#[derive(Clone)]
pub struct ProvisionSpec {
    pub tenant: TenantName,
    pub key: TenantKey,
    pub job_name: JobName,
    pub auth: AuthMode,
    /// Gradient statistics (docs/PROTOCOL.md, "Gradient statistics").
    pub stats: bool,
    /// 0 low, 1 normal, 2 high (docs/PROTOCOL.md, "Priorities").
    pub priority: u8,
}

impl fmt::Debug for ProvisionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProvisionSpec")
            .field("tenant", &self.tenant.as_str())
            .field("key", &"<redacted>")
            .field("job_name", &self.job_name.as_str())
            .field("auth", &self.auth)
            .field("stats", &self.stats)
            .field("priority", &self.priority)
            .finish()
    }
}

impl ProvisionSpec {
    /// The secret of this job, as the switch derives it.
    pub fn job_secret(&self) -> [u8; SECRET_LEN] {
        provision::job_secret(&self.key, &self.tenant, &self.job_name)
    }
}

/// The rest of a PROVISION's shape and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker {
    /// The id asked for: 0 lets the switch pick (a worker).
    pub job: u16,
    /// The sender's rank (informational).
    pub rank: u16,
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    /// The sender's own IPv4 address (0.0.0.0 if unbound: the address the
    /// switch reports is used then) and UDP port.
    pub ip: [u8; 4],
    pub port: u16,
}

/// The names of a refused request, for messages (kept as wire fields so the
/// error stays `Copy`, as the session's errors are).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Names {
    tenant: [u8; 32],
    job: [u8; 64],
}

impl Names {
    fn text(b: &[u8]) -> String {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
    pub fn tenant(&self) -> String {
        Names::text(&self.tenant)
    }
    pub fn job(&self) -> String {
        Names::text(&self.job)
    }
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant(), self.job())
    }
}

/// Why a job could not be provisioned (final for this attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    #[error(
        "the switch has no tenant {:?} (NACK 12): check --tenant / AGGSWITCH_TENANT, or ask the \
         operator to add it (switchctl tenant add)", .0.tenant()
    )]
    UnknownTenant(Names),
    #[error(
        "the switch does not allow this host's address for tenant {:?} (NACK 3): send from an \
         address in the tenant's allowed_sources, or ask the operator to add it", .0.tenant()
    )]
    SourceNotAllowed(Names),
    #[error(
        "the tenant key does not match the switch's for tenant {:?} (NACK 2): check \
         --tenant-key-file / AGGSWITCH_TENANT_KEY_FILE", .0.tenant()
    )]
    BadKey(Names),
    #[error(
        "tenant {:?} may not provision job {:?}: quota {} (NACK 11): {}",
        .names.tenant(), .names.job(), .quota.key(), .quota.advice()
    )]
    Quota { names: Names, quota: Quota },
    #[error(
        "a job named {:?} of tenant {:?} exists with another shape (workers, dtype, op, auth, \
         stats or priority; NACK 5): use the same settings on every rank, or another job name",
        .0.job(), .0.tenant()
    )]
    ParametersDiffer(Names),
    #[error(
        "the switch found tenant {:?}'s PROVISION for job {:?} malformed (NACK 8: a name, \
         worker count, dtype, auth or priority it does not take)", .0.tenant(), .0.job()
    )]
    Malformed(Names),
    #[error("the switch refused provisioning job {:?} of tenant {:?}: {reason}", .names.job(), .names.tenant())]
    Refused { names: Names, reason: NackReason },
    #[error(
        "the switch sees this host as {}:{} but it is bound to {}:{}; address translation \
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
}

impl ProvisionError {
    /// The NACK reason of a refusal by the switch (`None`: this side gave
    /// up, an address mismatch).
    pub fn reason(&self) -> Option<NackReason> {
        Some(match self {
            ProvisionError::UnknownTenant(_) => NackReason::UnknownTenant,
            ProvisionError::SourceNotAllowed(_) => NackReason::SourceNotAllowed,
            ProvisionError::BadKey(_) => NackReason::BadSecret,
            ProvisionError::Quota { .. } => NackReason::QuotaExceeded,
            ProvisionError::ParametersDiffer(_) => NackReason::ParametersDiffer,
            ProvisionError::Malformed(_) => NackReason::Malformed,
            ProvisionError::Refused { reason, .. } => *reason,
            ProvisionError::AddressMismatch { .. } => return None,
        })
    }

    /// The quota a NACK 11 named.
    pub fn quota(&self) -> Option<Quota> {
        match self {
            ProvisionError::Quota { quota, .. } => Some(*quota),
            _ => None,
        }
    }
}

/// What a datagram meant, once final.
#[derive(Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The switch has (or made) the job: join `job` with `secret`.
    Provisioned {
        job: u16,
        /// The switch's generation, from the PROVISIONED.
        gen: u32,
        secret: [u8; SECRET_LEN],
        lease_secs: u32,
        /// This claim created the job.
        created: bool,
    },
    Refused(ProvisionError),
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Provisioned {
                job,
                gen,
                lease_secs,
                created,
                ..
            } => f
                .debug_struct("Provisioned")
                .field("job", job)
                .field("gen", gen)
                .field("secret", &"<redacted>")
                .field("lease_secs", lease_secs)
                .field("created", created)
                .finish(),
            Outcome::Refused(e) => f.debug_tuple("Refused").field(e).finish(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Asking; then, with the CHALLENGE's switch nonce, generation and the
    /// address the MAC covers, claiming.
    Running {
        claim: Option<(Nonce, u32, [u8; 4])>,
        next_send: Instant,
    },
    Done,
}

/// Counters of a provisioner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProvisionStats {
    pub asks_sent: u64,
    pub claims_sent: u64,
    /// NACK 7 or 9: the ask started again.
    pub restarts: u64,
    /// PROVISIONEDs that echoed our claim but whose tag failed.
    pub bad_tags: u64,
}

/// One requester's provisioning of one job.
#[derive(Clone)]
pub struct Provisioner {
    spec: ProvisionSpec,
    asker: Asker,
    nonce_key: [u8; 32],
    nonces: u64,
    ask_nonce: Nonce,
    phase: Phase,
    stats: ProvisionStats,
}

impl fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provisioner")
            .field("spec", &self.spec)
            .field("asker", &self.asker)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Provisioner {
    /// A provisioner for `spec` as `asker`; `nonce_key` must be random:
    /// every ask nonce derives from it. Idle until [`Provisioner::start`].
    pub fn new(spec: ProvisionSpec, asker: Asker, nonce_key: [u8; 32]) -> Provisioner {
        Provisioner {
            spec,
            asker,
            nonce_key,
            nonces: 0,
            ask_nonce: [0; NONCE_LEN],
            phase: Phase::Idle,
            stats: ProvisionStats::default(),
        }
    }

    pub fn spec(&self) -> &ProvisionSpec {
        &self.spec
    }
    pub fn asker(&self) -> &Asker {
        &self.asker
    }
    pub fn stats(&self) -> ProvisionStats {
        self.stats
    }
    /// The switch's generation once a CHALLENGE answered this attempt's ask
    /// (the switch runs and knows the tenant; the claim is under way).
    pub fn challenged(&self) -> Option<u32> {
        match self.phase {
            Phase::Running {
                claim: Some((_, gen, _)),
                ..
            } => Some(gen),
            _ => None,
        }
    }

    /// Whether an ask or claim is in progress.
    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    fn names(&self) -> Names {
        Names {
            tenant: self.spec.tenant.to_wire(),
            job: self.spec.job_name.to_wire(),
        }
    }

    fn fresh_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.nonce_key) else {
            unreachable!("HMAC accepts every key length")
        };
        m.update(b"aggswitch provision nonce");
        m.update(&self.nonces.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&full[..NONCE_LEN]);
        n
    }

    /// Starts (or starts again) with a fresh ask, sent at once.
    pub fn start(&mut self, now: Instant) {
        self.ask_nonce = self.fresh_nonce();
        self.phase = Phase::Running {
            claim: None,
            next_send: now,
        };
    }

    /// Stops: nothing more is sent or taken until [`Provisioner::start`].
    pub fn stop(&mut self) {
        self.phase = Phase::Idle;
    }

    fn payload(&self, nonce: Nonce) -> ProvisionPayload {
        let a = &self.asker;
        ProvisionPayload {
            tenant: self.spec.tenant.to_wire(),
            job_name: self.spec.job_name.to_wire(),
            n_workers: a.n_workers,
            dtype: a.dtype,
            op: a.op,
            auth: self.spec.auth as u8,
            stats: u8::from(self.spec.stats),
            priority: self.spec.priority,
            nonce,
            mac: [0; 32],
        }
    }

    /// Writes the ask or claim due now into `buf` (at least
    /// [`PROVISION_LEN`] bytes); returns its length, or `None` if nothing
    /// is due.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if !self.poll_due(now) {
            return None;
        }
        self.emit(buf)
    }

    /// Whether an ask or claim is due now; if so, it counts as sent and the
    /// resend timer starts again: [`Provisioner::emit`] writes it. (A leaf
    /// queues its sends and encodes them later, from a shared view of its
    /// table: so the two halves.)
    pub fn poll_due(&mut self, now: Instant) -> bool {
        let Phase::Running { claim, next_send } = &mut self.phase else {
            return false;
        };
        if now < *next_send {
            return false;
        }
        *next_send = now + PROVISION_RESEND;
        if claim.is_some() {
            self.stats.claims_sent += 1;
        } else {
            self.stats.asks_sent += 1;
        }
        true
    }

    /// Writes the current attempt's ask or claim into `buf` (at least
    /// [`PROVISION_LEN`] bytes), whether due or not; returns its length, or
    /// `None` when not running.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let Phase::Running { claim, .. } = self.phase else {
            return None;
        };
        let a = self.asker;
        let mut h = HeaderRepr::new(MsgType::Provision, a.job);
        h.rank = a.rank;
        let payload = match claim {
            None => {
                h.count = PROVISION_ASK;
                self.payload(self.ask_nonce)
            }
            Some((nonce, gen, ip)) => {
                h.count = PROVISION_CLAIM;
                h.gen = gen;
                let mut p = self.payload(nonce);
                let c = ProvisionClaim {
                    job: a.job,
                    gen,
                    ip,
                    port: a.port,
                };
                p.mac = provision::provision_mac(&self.spec.key, &c, &p.covered());
                p
            }
        };
        h.emit_to(buf).ok()?;
        payload.emit(buf.get_mut(HEADER_LEN..)?).ok()?;
        Some(PROVISION_LEN)
    }

    /// When the next resend is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running { next_send, .. } => Some(next_send),
            _ => None,
        }
    }

    /// Lets time pass. Provisioning has no deadline of its own (the caller's
    /// join timeout bounds it); a resend that fell due is written by the
    /// next [`Provisioner::poll_transmit`].
    pub fn handle_timeout(&mut self, _now: Instant) -> Option<Outcome> {
        None
    }

    /// Takes a datagram (header not yet parsed): `None` unless it is a
    /// final answer to this attempt.
    pub fn handle(&mut self, datagram: &[u8], now: Instant) -> Option<Outcome> {
        let h = Header::new_checked(datagram).ok()?;
        let r = HeaderRepr::parse(&h).ok()?;
        self.handle_parsed(&r, h.payload(), now)
    }

    /// [`Provisioner::handle`] with the header already parsed.
    pub fn handle_parsed(
        &mut self,
        r: &HeaderRepr,
        payload: &[u8],
        now: Instant,
    ) -> Option<Outcome> {
        let Phase::Running { claim, .. } = self.phase else {
            return None;
        };
        match r.msg_type {
            MsgType::Challenge if claim.is_none() => self.on_challenge(r, payload, now),
            MsgType::Provisioned => self.on_provisioned(r, payload, claim?),
            MsgType::Nack => {
                let nack = NackPayload::parse(payload).ok()?;
                let ours = nack.echo == self.ask_nonce || claim.is_some_and(|c| c.0 == nack.echo);
                if !ours {
                    return None;
                }
                self.on_nack(&nack, now)
            }
            _ => None,
        }
    }

    fn on_challenge(&mut self, r: &HeaderRepr, payload: &[u8], now: Instant) -> Option<Outcome> {
        let c = ChallengePayload::parse(payload).ok()?;
        if c.hello_nonce != self.ask_nonce {
            return None;
        }
        let a = self.asker;
        let unbound = a.ip == [0; 4];
        if (!unbound && c.observed_ip != a.ip) || c.observed_port != a.port {
            return Some(
                self.finish(Outcome::Refused(ProvisionError::AddressMismatch {
                    observed_ip: c.observed_ip,
                    observed_port: c.observed_port,
                    ip: a.ip,
                    port: a.port,
                })),
            );
        }
        // The claim goes at once; a second CHALLENGE does not change it.
        self.phase = Phase::Running {
            claim: Some((c.nonce, r.gen, c.observed_ip)),
            next_send: now,
        };
        None
    }

    fn on_provisioned(
        &mut self,
        r: &HeaderRepr,
        payload: &[u8],
        claim: (Nonce, u32, [u8; 4]),
    ) -> Option<Outcome> {
        let p = ProvisionedPayload::parse(payload).ok()?;
        if p.nonce != claim.0 || r.job == 0 {
            return None;
        }
        let secret = self.spec.job_secret();
        if !provision::verify_provisioned(&secret, r.job, r.gen, &p.nonce, p.lease_secs, &p.tag) {
            self.stats.bad_tags += 1;
            return None;
        }
        Some(self.finish(Outcome::Provisioned {
            job: r.job,
            gen: r.gen,
            secret,
            lease_secs: p.lease_secs,
            created: p.flags & PROVISIONED_CREATED != 0,
        }))
    }

    fn on_nack(&mut self, nack: &NackPayload, now: Instant) -> Option<Outcome> {
        let names = self.names();
        let e = match nack.reason {
            NackReason::StaleNonce | NackReason::StaleGeneration => {
                self.stats.restarts += 1;
                self.start(now);
                return None;
            }
            NackReason::UnknownTenant => ProvisionError::UnknownTenant(names),
            NackReason::SourceNotAllowed => ProvisionError::SourceNotAllowed(names),
            NackReason::BadSecret => ProvisionError::BadKey(names),
            NackReason::ParametersDiffer => ProvisionError::ParametersDiffer(names),
            NackReason::Malformed => ProvisionError::Malformed(names),
            NackReason::QuotaExceeded => match Quota::from_u16(nack.detail) {
                Some(quota) => ProvisionError::Quota { names, quota },
                None => ProvisionError::Refused {
                    names,
                    reason: nack.reason,
                },
            },
            reason => ProvisionError::Refused { names, reason },
        };
        Some(self.finish(Outcome::Refused(e)))
    }

    fn finish(&mut self, o: Outcome) -> Outcome {
        self.phase = Phase::Done;
        o
    }
}

#[cfg(test)]
pub(crate) mod fake_switch;
#[cfg(test)]
mod tests;
