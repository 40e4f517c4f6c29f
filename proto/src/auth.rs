//! The cryptography of the JOIN handshake (docs/PROTOCOL.md, "Joining"):
//! HMAC-SHA256 (RustCrypto's `hmac` and `sha2`) over fixed byte layouts.
//!
//! Owns: [`join_mac`] and [`leave_mac`] (keyed by the job secret; a worker
//! computes them, the switch checks them), [`session_key`] and the NACK tag
//! under it ([`nack_tag`], [`verify_nack`]: the switch computes it, a worker
//! or leaf checks it), and [`NonceIssuer`] (the switch's
//! nonces: unique, ordered, bound to a job, rank and address (or, for a
//! PROVISION, to a tenant, a job name and an address) by a tag under
//! a key that never leaves the switch, and carrying the time they were
//! issued, so the switch keeps no state per CHALLENGE).
//!
//! Invariants: MACs are compared in constant time; nothing here prints a
//! secret or key; time is passed in.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::wire::{Mac, NackTag, Nonce, HEADER_LEN, NACK_TAG_LEN, NONCE_LEN, SECRET_LEN};

type HmacSha256 = Hmac<Sha256>;

/// Labels keep a JOIN's MAC from ever verifying as a LEAVE's, or a nonce's.
const JOIN_LABEL: &[u8] = b"aggswitch v2 join";
const LEAVE_LABEL: &[u8] = b"aggswitch v2 leave";
const NONCE_LABEL: &[u8] = b"aggswitch v2 nonce";
const PROVISION_NONCE_LABEL: &[u8] = b"aggswitch v4 provision nonce";

/// What a JOIN's MAC covers besides the nonce (docs/PROTOCOL.md lists the
/// byte layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinClaim {
    pub job: u16,
    pub rank: u16,
    pub gen: u32,
    /// The resume point: the worker's collective and first unfinished seq.
    pub collective: u32,
    pub seq: u32,
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    /// The worker's IPv4 address and UDP port.
    pub ip: [u8; 4],
    pub port: u16,
}

fn hmac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts every key length"),
    }
}

fn join_hmac(secret: &[u8; SECRET_LEN], c: &JoinClaim, nonce: &Nonce) -> HmacSha256 {
    let mut m = hmac(secret);
    m.update(JOIN_LABEL);
    m.update(&c.job.to_be_bytes());
    m.update(&c.rank.to_be_bytes());
    m.update(&c.gen.to_be_bytes());
    m.update(&c.collective.to_be_bytes());
    m.update(&c.seq.to_be_bytes());
    m.update(&c.n_workers.to_be_bytes());
    m.update(&[c.dtype, c.op]);
    m.update(nonce);
    m.update(&c.ip);
    m.update(&c.port.to_be_bytes());
    m
}

/// The MAC a worker puts in its JOIN.
pub fn join_mac(secret: &[u8; SECRET_LEN], claim: &JoinClaim, nonce: &Nonce) -> Mac {
    join_hmac(secret, claim, nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a JOIN's MAC in constant time.
pub fn verify_join(secret: &[u8; SECRET_LEN], claim: &JoinClaim, nonce: &Nonce, mac: &Mac) -> bool {
    join_hmac(secret, claim, nonce).verify_slice(mac).is_ok()
}

fn leave_hmac(
    secret: &[u8; SECRET_LEN],
    job: u16,
    rank: u16,
    gen: u32,
    nonce: &Nonce,
) -> HmacSha256 {
    let mut m = hmac(secret);
    m.update(LEAVE_LABEL);
    m.update(&job.to_be_bytes());
    m.update(&rank.to_be_bytes());
    m.update(&gen.to_be_bytes());
    m.update(nonce);
    m
}

/// The MAC of a LEAVE: over the job, rank, generation and the nonce of the
/// JOIN the switch accepted, so a LEAVE cannot be replayed into a later
/// membership.
pub fn leave_mac(secret: &[u8; SECRET_LEN], job: u16, rank: u16, gen: u32, nonce: &Nonce) -> Mac {
    leave_hmac(secret, job, rank, gen, nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a LEAVE's MAC in constant time.
pub fn verify_leave(
    secret: &[u8; SECRET_LEN],
    job: u16,
    rank: u16,
    gen: u32,
    nonce: &Nonce,
    mac: &Mac,
) -> bool {
    leave_hmac(secret, job, rank, gen, nonce)
        .verify_slice(mac)
        .is_ok()
}

const SESSION_LABEL: &[u8] = b"aggswitch v3 session";

/// A member's session key: what both ends of an accepted JOIN can derive and
/// nobody without the job secret can (docs/PROTOCOL.md, "Sessions"). It is
/// bound to the job, the rank, the switch generation and the switch nonce of
/// the accepted JOIN, so every join (and every switch restart) makes a new
/// one. The MACs that authenticate what the switch sends a member are keyed
/// by it, never by the secret itself.
pub fn session_key(
    secret: &[u8; SECRET_LEN],
    job: u16,
    rank: u16,
    gen: u32,
    nonce: &Nonce,
) -> [u8; 32] {
    let mut m = hmac(secret);
    m.update(SESSION_LABEL);
    m.update(&job.to_be_bytes());
    m.update(&rank.to_be_bytes());
    m.update(&gen.to_be_bytes());
    m.update(nonce);
    m.finalize().into_bytes().into()
}

const NACK_LABEL: &[u8] = b"aggswitch v3 nack";

fn nack_hmac(key: &[u8; 32], header: &[u8; HEADER_LEN], reason: u16, echo: &Nonce) -> HmacSha256 {
    let mut m = hmac(key);
    m.update(NACK_LABEL);
    m.update(header);
    m.update(&reason.to_be_bytes());
    m.update(echo);
    m
}

/// The tag of a NACK to a member (docs/PROTOCOL.md, "Sessions"): the first
/// 16 bytes of HMAC-SHA256(session key, "aggswitch v3 nack" ‖ the 22 header
/// bytes as sent ‖ reason u16 ‖ echo nonce). It binds the whole header (job,
/// rank, generation, ...), so a tag cannot be moved to another NACK.
pub fn nack_tag(key: &[u8; 32], header: &[u8; HEADER_LEN], reason: u16, echo: &Nonce) -> NackTag {
    let full = nack_hmac(key, header, reason, echo).finalize().into_bytes();
    let mut t = [0u8; NACK_TAG_LEN];
    t.copy_from_slice(&full[..NACK_TAG_LEN]);
    t
}

/// Checks a NACK's tag in constant time. A zero tag (what the switch sends
/// when it has no session with the recipient) never verifies.
pub fn verify_nack(
    key: &[u8; 32],
    header: &[u8; HEADER_LEN],
    reason: u16,
    echo: &Nonce,
    tag: &NackTag,
) -> bool {
    if *tag == [0; NACK_TAG_LEN] {
        return false;
    }
    nack_hmac(key, header, reason, echo)
        .verify_truncated_left(tag)
        .is_ok()
}

/// Bits of a nonce's serial below the millisecond it was issued in: up to
/// 2^20 nonces per millisecond keep their order.
const SERIAL_SUB_MS_BITS: u32 = 20;

/// The switch's nonces. A nonce is `serial (u64) ‖ tag (8 bytes)`: the serial
/// grows strictly (milliseconds since the issuer started, shifted, plus a
/// count), and the tag is HMAC(key, serial, job, rank, address, port)
/// truncated, so only this switch can make a nonce that verifies, and only
/// for the rank and address it was sent to.
pub struct NonceIssuer {
    key: [u8; 32],
    epoch: Instant,
    last_serial: u64,
    lifetime: Duration,
}

impl std::fmt::Debug for NonceIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NonceIssuer")
            .field("key", &"<redacted>")
            .field("last_serial", &self.last_serial)
            .field("lifetime", &self.lifetime)
            .finish()
    }
}

impl NonceIssuer {
    /// `key` must be random and private to this switch instance.
    pub fn new(key: [u8; 32], now: Instant, lifetime: Duration) -> NonceIssuer {
        NonceIssuer {
            key,
            epoch: now,
            last_serial: 0,
            lifetime,
        }
    }

    fn tag(&self, serial: u64, job: u16, rank: u16, ip: [u8; 4], port: u16) -> [u8; 8] {
        let mut m = hmac(&self.key);
        m.update(NONCE_LABEL);
        m.update(&serial.to_be_bytes());
        m.update(&job.to_be_bytes());
        m.update(&rank.to_be_bytes());
        m.update(&ip);
        m.update(&port.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut t = [0u8; 8];
        t.copy_from_slice(&full[..8]);
        t
    }

    fn provision_tag(
        &self,
        serial: u64,
        tenant: &[u8; 32],
        job_name: &[u8; 64],
        ip: [u8; 4],
        port: u16,
    ) -> [u8; 8] {
        let mut m = hmac(&self.key);
        m.update(PROVISION_NONCE_LABEL);
        m.update(&serial.to_be_bytes());
        m.update(tenant);
        m.update(job_name);
        m.update(&ip);
        m.update(&port.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut t = [0u8; 8];
        t.copy_from_slice(&full[..8]);
        t
    }

    /// A fresh nonce for a PROVISION claim of tenant `tenant`'s job
    /// `job_name` (their wire fields) from `ip`:`port`: the same serials as
    /// [`NonceIssuer::issue`], a tag under its own label, so a JOIN nonce
    /// never passes as a provisioning one nor the reverse.
    pub fn issue_provision(
        &mut self,
        now: Instant,
        tenant: &[u8; 32],
        job_name: &[u8; 64],
        ip: [u8; 4],
        port: u16,
    ) -> Nonce {
        let serial = self.serial_floor(now);
        self.last_serial = serial;
        let mut n = [0u8; NONCE_LEN];
        n[..8].copy_from_slice(&serial.to_be_bytes());
        n[8..].copy_from_slice(&self.provision_tag(serial, tenant, job_name, ip, port));
        n
    }

    /// The nonce's serial if this issuer made it by
    /// [`NonceIssuer::issue_provision`] for these names and address (its
    /// age is not checked).
    pub fn verify_provision_tag(
        &self,
        nonce: &Nonce,
        tenant: &[u8; 32],
        job_name: &[u8; 64],
        ip: [u8; 4],
        port: u16,
    ) -> Option<u64> {
        let serial = Self::serial_of(nonce);
        let tag = self.provision_tag(serial, tenant, job_name, ip, port);
        let ok = bool::from(subtle::ConstantTimeEq::ct_eq(&tag[..], &nonce[8..]));
        (ok && serial != 0).then_some(serial)
    }

    fn millis(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The serial a nonce issued now would get at least: nonces issued
    /// before this point sort below it.
    pub fn serial_floor(&self, now: Instant) -> u64 {
        (self.millis(now) << SERIAL_SUB_MS_BITS).max(self.last_serial + 1)
    }

    /// Every nonce issued from now on has a serial at least this.
    pub fn next_serial(&self) -> u64 {
        self.last_serial + 1
    }

    /// A fresh nonce for `job`/`rank` at `ip`:`port`.
    pub fn issue(&mut self, now: Instant, job: u16, rank: u16, ip: [u8; 4], port: u16) -> Nonce {
        let serial = self.serial_floor(now);
        self.last_serial = serial;
        let mut n = [0u8; NONCE_LEN];
        n[..8].copy_from_slice(&serial.to_be_bytes());
        n[8..].copy_from_slice(&self.tag(serial, job, rank, ip, port));
        n
    }

    /// The nonce's serial if this issuer made it for `job`/`rank` at
    /// `ip`:`port` (its age is not checked: [`NonceIssuer::is_expired`]).
    pub fn verify_tag(
        &self,
        nonce: &Nonce,
        job: u16,
        rank: u16,
        ip: [u8; 4],
        port: u16,
    ) -> Option<u64> {
        let serial = Self::serial_of(nonce);
        let tag = self.tag(serial, job, rank, ip, port);
        let ok = bool::from(subtle::ConstantTimeEq::ct_eq(&tag[..], &nonce[8..]));
        (ok && serial != 0).then_some(serial)
    }

    /// Whether a nonce of `serial` was issued longer ago than the lifetime.
    pub fn is_expired(&self, serial: u64, now: Instant) -> bool {
        let issued_ms = serial >> SERIAL_SUB_MS_BITS;
        self.millis(now).saturating_sub(issued_ms) > self.lifetime.as_millis() as u64
    }

    /// The serial inside a nonce (unchecked).
    pub fn serial_of(nonce: &Nonce) -> u64 {
        let mut s = [0u8; 8];
        s.copy_from_slice(&nonce[..8]);
        u64::from_be_bytes(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioning_nonces_are_bound_to_names_and_address_and_apart_from_join_nonces() {
        let t0 = Instant::now();
        let mut iss = NonceIssuer::new([3; 32], t0, Duration::from_secs(10));
        let (tenant, name) = ([1u8; 32], [2u8; 64]);
        let n = iss.issue_provision(t0, &tenant, &name, [198, 18, 0, 2], 7);
        assert!(iss
            .verify_provision_tag(&n, &tenant, &name, [198, 18, 0, 2], 7)
            .is_some());
        assert!(iss
            .verify_provision_tag(&n, &tenant, &[3u8; 64], [198, 18, 0, 2], 7)
            .is_none());
        assert!(iss
            .verify_provision_tag(&n, &tenant, &name, [198, 18, 0, 3], 7)
            .is_none());
        let j = iss.issue(t0, 1, 0, [198, 18, 0, 2], 7);
        assert!(iss
            .verify_provision_tag(&j, &tenant, &name, [198, 18, 0, 2], 7)
            .is_none());
        assert!(
            NonceIssuer::serial_of(&j) > NonceIssuer::serial_of(&n),
            "one serial order"
        );
    }

    fn claim() -> JoinClaim {
        JoinClaim {
            job: 7,
            rank: 2,
            gen: 0x1234_5678,
            collective: 3,
            seq: 900,
            n_workers: 4,
            dtype: 0,
            op: 0,
            ip: [198, 18, 0, 2],
            port: 40000,
        }
    }

    #[test]
    fn session_keys_differ_per_job_rank_gen_nonce_and_secret() {
        let secret = [0x5a; SECRET_LEN];
        let nonce = [9u8; NONCE_LEN];
        let k = session_key(&secret, 1, 2, 3, &nonce);
        assert_eq!(k, session_key(&secret, 1, 2, 3, &nonce));
        let mut other_nonce = nonce;
        other_nonce[15] ^= 1;
        for other in [
            session_key(&[0x5b; SECRET_LEN], 1, 2, 3, &nonce),
            session_key(&secret, 2, 2, 3, &nonce),
            session_key(&secret, 1, 3, 3, &nonce),
            session_key(&secret, 1, 2, 4, &nonce),
            session_key(&secret, 1, 2, 3, &other_nonce),
        ] {
            assert_ne!(k, other);
        }
    }

    fn nack_header() -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        crate::wire::HeaderRepr {
            msg_type: crate::wire::MsgType::Nack,
            flags: 0,
            job: 7,
            rank: 2,
            count: 0,
            seq: 0,
            collective: 0,
            window: 0,
            gen: 0x1234_5678,
        }
        .emit_to(&mut h)
        .unwrap();
        h
    }

    #[test]
    fn nack_tag_binds_every_header_byte_reason_and_echo() {
        let key = session_key(&[0x5a; SECRET_LEN], 7, 2, 0x1234_5678, &[9; NONCE_LEN]);
        let h = nack_header();
        let echo = [3u8; NONCE_LEN];
        let tag = nack_tag(&key, &h, 6, &echo);
        assert!(verify_nack(&key, &h, 6, &echo, &tag));
        for i in 0..HEADER_LEN {
            let mut other = h;
            other[i] ^= 1;
            assert!(
                !verify_nack(&key, &other, 6, &echo, &tag),
                "header byte {i}"
            );
        }
        assert!(!verify_nack(&key, &h, 7, &echo, &tag), "reason");
        for i in 0..NONCE_LEN {
            let mut other = echo;
            other[i] ^= 0x80;
            assert!(!verify_nack(&key, &h, 6, &other, &tag), "echo byte {i}");
        }
        for i in 0..NACK_TAG_LEN {
            let mut other = tag;
            other[i] ^= 1;
            assert!(!verify_nack(&key, &h, 6, &echo, &other), "tag byte {i}");
        }
    }

    #[test]
    fn nack_tag_fails_under_another_session_and_when_zero() {
        let secret = [0x5a; SECRET_LEN];
        let key = session_key(&secret, 7, 2, 0x1234_5678, &[9; NONCE_LEN]);
        let h = nack_header();
        let echo = [0u8; NONCE_LEN];
        let tag = nack_tag(&key, &h, 1, &echo);
        // Another join of the same rank (a new switch nonce), another rank,
        // another secret: none verifies.
        for other in [
            session_key(&secret, 7, 2, 0x1234_5678, &[8; NONCE_LEN]),
            session_key(&secret, 7, 3, 0x1234_5678, &[9; NONCE_LEN]),
            session_key(&[0x5b; SECRET_LEN], 7, 2, 0x1234_5678, &[9; NONCE_LEN]),
        ] {
            assert!(!verify_nack(&other, &h, 1, &echo, &tag));
        }
        assert!(!verify_nack(&key, &h, 1, &echo, &[0; NACK_TAG_LEN]));
    }

    #[test]
    fn join_mac_binds_every_field() {
        let secret = [0x5a; SECRET_LEN];
        let nonce = [9u8; NONCE_LEN];
        let mac = join_mac(&secret, &claim(), &nonce);
        assert!(verify_join(&secret, &claim(), &nonce, &mac));
        let variants: [fn(&mut JoinClaim); 10] = [
            |c| c.job += 1,
            |c| c.rank += 1,
            |c| c.gen += 1,
            |c| c.collective += 1,
            |c| c.seq += 1,
            |c| c.n_workers += 1,
            |c| c.dtype = 1,
            |c| c.op = 1,
            |c| c.ip[3] = 3,
            |c| c.port += 1,
        ];
        for change in variants {
            let mut c = claim();
            change(&mut c);
            assert!(!verify_join(&secret, &c, &nonce, &mac), "{c:?}");
        }
        let mut other = nonce;
        other[15] ^= 1;
        assert!(!verify_join(&secret, &claim(), &other, &mac));
        let mut wrong = secret;
        wrong[0] ^= 1;
        assert!(!verify_join(&wrong, &claim(), &nonce, &mac));
        // A JOIN MAC is not a LEAVE MAC.
        assert!(!verify_leave(&secret, 7, 2, 0x1234_5678, &nonce, &mac));
    }

    #[test]
    fn nonces_are_ordered_bound_and_expire() {
        let t0 = Instant::now();
        let mut iss = NonceIssuer::new([1; 32], t0, Duration::from_secs(10));
        let w = [198, 18, 0, 2];
        let a = iss.issue(t0, 7, 2, w, 40000);
        let b = iss.issue(t0, 7, 2, w, 40000);
        let sa = iss.verify_tag(&a, 7, 2, w, 40000).unwrap();
        let sb = iss.verify_tag(&b, 7, 2, w, 40000).unwrap();
        assert!(sb > sa, "serials grow within one millisecond");
        assert!(!iss.is_expired(sa, t0));
        assert_eq!(
            iss.verify_tag(&a, 7, 3, w, 40000),
            None,
            "bound to the rank"
        );
        assert_eq!(
            iss.verify_tag(&a, 7, 2, [198, 18, 0, 9], 40000),
            None,
            "bound to the address"
        );
        let other = NonceIssuer::new([2; 32], t0, Duration::from_secs(10));
        assert_eq!(
            other.verify_tag(&a, 7, 2, w, 40000),
            None,
            "another switch's nonce"
        );
        let later = t0 + Duration::from_secs(11);
        assert_eq!(iss.verify_tag(&a, 7, 2, w, 40000), Some(sa));
        assert!(iss.is_expired(sa, later), "older than the lifetime");
        let c = iss.issue(later, 7, 2, w, 40000);
        let sc = iss.verify_tag(&c, 7, 2, w, 40000).unwrap();
        assert!(sc > sb && !iss.is_expired(sc, later));
        assert!(iss.serial_floor(later) > sb);
    }
}
