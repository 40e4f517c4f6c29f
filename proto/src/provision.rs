//! Self-provisioned jobs (docs/PROTOCOL.md, "Tenants and self-provisioned
//! jobs"): the names a PROVISION carries and the cryptography both sides
//! compute from a tenant key: the job secret derived from it, the MAC of a
//! PROVISION claim and the tag of a PROVISIONED answer.
//!
//! Owns: [`TenantName`] and [`JobName`] (checked text, fixed-width on the
//! wire), [`job_secret`], [`provision_mac`] / [`verify_provision`],
//! [`provisioned_tag`] / [`verify_provisioned`].
//!
//! Invariants: the tenant key is only ever an HMAC key here: it never
//! appears in a message, an error or a `Debug`; every MAC is compared in
//! constant time; a name that left a constructor is 1..=its maximum bytes
//! of `[A-Za-z0-9._:-]`, so its zero-padded wire form is unambiguous.

use core::fmt;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::wire::{Mac, Nonce, Tag, SECRET_LEN, TAG_LEN};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a tenant name on the wire (zero-padded).
pub const TENANT_NAME_LEN: usize = 32;
/// Bytes of a job name on the wire (zero-padded).
pub const JOB_NAME_LEN: usize = 64;

const SECRET_LABEL: &[u8] = b"aggswitch v4 job secret";
const PROVISION_LABEL: &[u8] = b"aggswitch v4 provision";
const PROVISIONED_LABEL: &[u8] = b"aggswitch v4 provisioned";

/// A tenant key: 32 bytes, the same rules as a job secret
/// ([`crate::secret`]).
pub type TenantKey = [u8; SECRET_LEN];

/// A name that is not 1..=N bytes of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {text:?} is not a valid name: use 1 to {max} characters of letters, digits, \
     '.', '_', ':' and '-'"
)]
pub struct BadName {
    pub what: &'static str,
    pub text: String,
    pub max: usize,
}

fn check_name(what: &'static str, text: &str, max: usize) -> Result<(), BadName> {
    let ok = !text.is_empty()
        && text.len() <= max
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(BadName {
            what,
            text: text.chars().take(max + 8).collect(),
            max,
        })
    }
}

fn to_wire<const N: usize>(text: &str) -> [u8; N] {
    let mut b = [0u8; N];
    b[..text.len()].copy_from_slice(text.as_bytes());
    b
}

fn from_wire(what: &'static str, b: &[u8], max: usize) -> Result<String, BadName> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    // Bytes after the first zero must be zero too: one text, one encoding.
    let text = String::from_utf8_lossy(&b[..end]).into_owned();
    if b[end..].iter().any(|&c| c != 0) {
        return Err(BadName { what, text, max });
    }
    check_name(what, &text, max)?;
    Ok(text)
}

macro_rules! name_type {
    ($name:ident, $len:ident, $what:literal) => {
        /// A checked name (see the module's invariants).
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn new(text: &str) -> Result<$name, BadName> {
                check_name($what, text, $len)?;
                Ok($name(text.to_owned()))
            }

            /// The name in its wire field (zero-padded).
            pub fn to_wire(&self) -> [u8; $len] {
                to_wire(&self.0)
            }

            /// The name in a wire field; refuses anything [`Self::new`]
            /// would, and bytes after the padding starts.
            pub fn from_wire(b: &[u8; $len]) -> Result<$name, BadName> {
                from_wire($what, b, $len).map($name)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = BadName;
            fn from_str(s: &str) -> Result<$name, BadName> {
                $name::new(s)
            }
        }
    };
}

name_type!(TenantName, TENANT_NAME_LEN, "tenant name");
name_type!(JobName, JOB_NAME_LEN, "job name");

fn hmac(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts every key length"),
    }
}

/// The secret of tenant `tenant`'s job `job`: `HMAC-SHA256(key, "aggswitch
/// v4 job secret" ‖ tenant (32 B) ‖ job (64 B))`. Every rank and every
/// switch of a tree computes the same one; it is the job's secret for the
/// ordinary handshake (JOIN, LEAVE, sessions, tokens).
pub fn job_secret(key: &TenantKey, tenant: &TenantName, job: &JobName) -> [u8; SECRET_LEN] {
    let mut m = hmac(key);
    m.update(SECRET_LABEL);
    m.update(&tenant.to_wire());
    m.update(&job.to_wire());
    m.finalize().into_bytes().into()
}

/// What a PROVISION claim's MAC covers besides its payload's first
/// [`crate::wire::PROVISION_MAC_OFFSET`] bytes (names, shape, switch nonce).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProvisionClaim {
    /// The header's `job`: the id asked for, 0 to let the switch pick.
    pub job: u16,
    /// The header's `gen`: the switch's, from the CHALLENGE.
    pub gen: u32,
    /// The sender's IPv4 address and UDP port.
    pub ip: [u8; 4],
    pub port: u16,
}

fn provision_hmac(key: &TenantKey, c: &ProvisionClaim, covered: &[u8]) -> HmacSha256 {
    let mut m = hmac(key);
    m.update(PROVISION_LABEL);
    m.update(&c.job.to_be_bytes());
    m.update(&c.gen.to_be_bytes());
    m.update(covered);
    m.update(&c.ip);
    m.update(&c.port.to_be_bytes());
    m
}

/// The MAC of a PROVISION claim: `HMAC-SHA256(tenant key, "aggswitch v4
/// provision" ‖ job u16 ‖ gen u32 ‖ payload[0..120] ‖ IPv4 ‖ UDP port)`,
/// where `covered` is the payload up to the MAC.
pub fn provision_mac(key: &TenantKey, claim: &ProvisionClaim, covered: &[u8]) -> Mac {
    provision_hmac(key, claim, covered)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a PROVISION claim's MAC in constant time.
pub fn verify_provision(
    key: &TenantKey,
    claim: &ProvisionClaim,
    covered: &[u8],
    mac: &Mac,
) -> bool {
    provision_hmac(key, claim, covered)
        .verify_slice(mac)
        .is_ok()
}

fn provisioned_hmac(
    secret: &[u8; SECRET_LEN],
    job: u16,
    gen: u32,
    nonce: &Nonce,
    lease_secs: u32,
) -> HmacSha256 {
    let mut m = hmac(secret);
    m.update(PROVISIONED_LABEL);
    m.update(&job.to_be_bytes());
    m.update(&gen.to_be_bytes());
    m.update(nonce);
    m.update(&lease_secs.to_be_bytes());
    m
}

/// The tag of a PROVISIONED: the first 16 bytes of `HMAC-SHA256(job
/// secret, "aggswitch v4 provisioned" ‖ job u16 ‖ gen u32 ‖ nonce ‖
/// lease_secs u32)`. Only a holder of the job's secret (the switch, or a
/// holder of the tenant key) makes it, so a worker never takes a job id
/// from anyone else.
pub fn provisioned_tag(
    secret: &[u8; SECRET_LEN],
    job: u16,
    gen: u32,
    nonce: &Nonce,
    lease_secs: u32,
) -> Tag {
    let full = provisioned_hmac(secret, job, gen, nonce, lease_secs)
        .finalize()
        .into_bytes();
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&full[..TAG_LEN]);
    t
}

/// Checks a PROVISIONED's tag in constant time.
pub fn verify_provisioned(
    secret: &[u8; SECRET_LEN],
    job: u16,
    gen: u32,
    nonce: &Nonce,
    lease_secs: u32,
    tag: &Tag,
) -> bool {
    provisioned_hmac(secret, job, gen, nonce, lease_secs)
        .verify_truncated_left(tag)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_exactly_the_documented_characters_and_lengths() {
        assert!(TenantName::new("vision-team_1.a:b").is_ok());
        assert!(TenantName::new(&"a".repeat(32)).is_ok());
        assert!(TenantName::new(&"a".repeat(33)).is_err());
        assert!(JobName::new(&"j".repeat(64)).is_ok());
        assert!(JobName::new(&"j".repeat(65)).is_err());
        for bad in ["", "a b", "a/b", "é", "a\0b", "x;rm"] {
            let e = JobName::new(bad).unwrap_err();
            assert!(e.to_string().contains("letters, digits"), "{e}");
        }
    }

    #[test]
    fn wire_names_round_trip_and_refuse_junk_after_the_padding() {
        let j = JobName::new("run-42").unwrap();
        let w = j.to_wire();
        assert_eq!(JobName::from_wire(&w).unwrap(), j);
        let mut junk = w;
        junk[63] = b'x';
        assert!(JobName::from_wire(&junk).is_err());
        assert!(JobName::from_wire(&[0u8; 64]).is_err(), "empty");
    }

    #[test]
    fn the_job_secret_depends_on_key_tenant_and_name() {
        let k = [7u8; 32];
        let t = TenantName::new("a").unwrap();
        let j = JobName::new("x").unwrap();
        let s = job_secret(&k, &t, &j);
        assert_eq!(s, job_secret(&k, &t, &j));
        assert_ne!(s, job_secret(&[8u8; 32], &t, &j));
        assert_ne!(s, job_secret(&k, &TenantName::new("b").unwrap(), &j));
        assert_ne!(s, job_secret(&k, &t, &JobName::new("y").unwrap()));
        assert_ne!(&s, &k, "the key itself is never the secret");
    }

    #[test]
    fn a_claim_verifies_only_with_its_key_fields_and_bytes() {
        let k = [1u8; 32];
        let c = ProvisionClaim {
            job: 0,
            gen: 9,
            ip: [198, 18, 0, 2],
            port: 4000,
        };
        let covered = [3u8; 120];
        let mac = provision_mac(&k, &c, &covered);
        assert!(verify_provision(&k, &c, &covered, &mac));
        assert!(!verify_provision(&[2u8; 32], &c, &covered, &mac));
        assert!(!verify_provision(
            &k,
            &ProvisionClaim { port: 4001, ..c },
            &covered,
            &mac
        ));
        assert!(!verify_provision(
            &k,
            &ProvisionClaim { job: 5, ..c },
            &covered,
            &mac
        ));
        let mut other = covered;
        other[100] ^= 1;
        assert!(!verify_provision(&k, &c, &other, &mac));
    }

    #[test]
    fn a_provisioned_tag_binds_job_gen_nonce_and_lease() {
        let s = [4u8; 32];
        let n = [5u8; 16];
        let t = provisioned_tag(&s, 1000, 7, &n, 60);
        assert!(verify_provisioned(&s, 1000, 7, &n, 60, &t));
        assert!(!verify_provisioned(&s, 1001, 7, &n, 60, &t));
        assert!(!verify_provisioned(&s, 1000, 8, &n, 60, &t));
        assert!(!verify_provisioned(&s, 1000, 7, &[6u8; 16], 60, &t));
        assert!(!verify_provisioned(&s, 1000, 7, &n, 61, &t));
        assert!(!verify_provisioned(&[0u8; 32], 1000, 7, &n, 60, &t));
    }
}
