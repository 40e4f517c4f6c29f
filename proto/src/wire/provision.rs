//! The payloads of self-provisioning (docs/PROTOCOL.md, "Tenants and
//! self-provisioned jobs"): PROVISION (an ask, then a claim) and
//! PROVISIONED.
//!
//! Invariants: every `parse` takes exactly its `*_LEN` bytes and every
//! `emit` writes them; names are kept as their raw wire fields here (the
//! receiver checks them with `crate::provision`); MACs never print.

use core::fmt;

use super::error::{array, check_len, check_room, WireError};
use super::lengths::*;

/// A PROVISION's header `count`: an ask (answered by a CHALLENGE).
pub const PROVISION_ASK: u16 = 0;
/// A PROVISION's header `count`: a claim (answered by a PROVISIONED).
pub const PROVISION_CLAIM: u16 = 1;

/// PROVISIONED `flags` bit 0: this claim created the job.
pub const PROVISIONED_CREATED: u32 = 1;

/// PROVISION payload (worker or leaf → switch).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ProvisionPayload {
    /// The tenant's name, zero-padded.
    pub tenant: [u8; 32],
    /// The job's name, zero-padded.
    pub job_name: [u8; 64],
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    /// 2 `port`, 1 `mac` ([`crate::tag::AuthMode`]).
    pub auth: u8,
    /// 0 off, 1 gradient statistics.
    pub stats: u8,
    /// 0 low, 1 normal, 2 high.
    pub priority: u8,
    /// An ask: the sender's fresh nonce (echoed in the CHALLENGE). A claim:
    /// the switch nonce from that CHALLENGE.
    pub nonce: Nonce,
    /// A claim: [`crate::provision::provision_mac`]; an ask: zero.
    pub mac: Mac,
}

impl fmt::Debug for ProvisionPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        f.debug_struct("ProvisionPayload")
            .field("tenant", &text(&self.tenant))
            .field("job_name", &text(&self.job_name))
            .field("n_workers", &self.n_workers)
            .field("dtype", &self.dtype)
            .field("auth", &self.auth)
            .field("stats", &self.stats)
            .field("priority", &self.priority)
            .field("mac", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl ProvisionPayload {
    pub fn parse(b: &[u8]) -> Result<ProvisionPayload, WireError> {
        check_len(b, PROVISION_PAYLOAD_LEN, "a PROVISION payload (152 bytes)")?;
        Ok(ProvisionPayload {
            tenant: array(b),
            job_name: array(&b[32..]),
            n_workers: u16::from_be_bytes(array(&b[96..])),
            dtype: b[98],
            op: b[99],
            auth: b[100],
            stats: b[101],
            priority: b[102],
            nonce: array(&b[104..]),
            mac: array(&b[PROVISION_MAC_OFFSET..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, PROVISION_PAYLOAD_LEN)?;
        b[..32].copy_from_slice(&self.tenant);
        b[32..96].copy_from_slice(&self.job_name);
        b[96..98].copy_from_slice(&self.n_workers.to_be_bytes());
        b[98] = self.dtype;
        b[99] = self.op;
        b[100] = self.auth;
        b[101] = self.stats;
        b[102] = self.priority;
        b[103] = 0;
        b[104..104 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[PROVISION_MAC_OFFSET..PROVISION_PAYLOAD_LEN].copy_from_slice(&self.mac);
        Ok(PROVISION_PAYLOAD_LEN)
    }

    /// The bytes a claim's MAC covers: the payload as emitted, up to the MAC.
    pub fn covered(&self) -> [u8; PROVISION_MAC_OFFSET] {
        let mut b = [0u8; PROVISION_PAYLOAD_LEN];
        // The buffer is exactly long enough: emit cannot fail.
        let _ = self.emit(&mut b);
        array(&b)
    }
}

/// PROVISIONED payload (switch → worker or leaf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProvisionedPayload {
    /// The claim's switch nonce, echoed.
    pub nonce: Nonce,
    /// The job's idle lease: removed after this many seconds without
    /// traffic (docs/PROTOCOL.md, "Leases").
    pub lease_secs: u32,
    /// [`PROVISIONED_CREATED`]; other bits zero.
    pub flags: u32,
    /// [`crate::provision::provisioned_tag`] under the job's secret.
    pub tag: Tag,
}

impl ProvisionedPayload {
    pub fn parse(b: &[u8]) -> Result<ProvisionedPayload, WireError> {
        check_len(
            b,
            PROVISIONED_PAYLOAD_LEN,
            "a PROVISIONED payload (40 bytes)",
        )?;
        Ok(ProvisionedPayload {
            nonce: array(b),
            lease_secs: u32::from_be_bytes(array(&b[NONCE_LEN..])),
            flags: u32::from_be_bytes(array(&b[NONCE_LEN + 4..])),
            tag: array(&b[NONCE_LEN + 8..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, PROVISIONED_PAYLOAD_LEN)?;
        let n = NONCE_LEN;
        b[..n].copy_from_slice(&self.nonce);
        b[n..n + 4].copy_from_slice(&self.lease_secs.to_be_bytes());
        b[n + 4..n + 8].copy_from_slice(&self.flags.to_be_bytes());
        b[n + 8..PROVISIONED_PAYLOAD_LEN].copy_from_slice(&self.tag);
        Ok(PROVISIONED_PAYLOAD_LEN)
    }
}
