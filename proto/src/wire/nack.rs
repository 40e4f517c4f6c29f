//! The NACK payload: the reason and its detail, the echoed nonce and the tag under the
//! recipient's session key.
//!
//! Invariant: `parse` takes exactly [`NACK_PAYLOAD_LEN`] bytes and refuses
//! an unknown reason; the tag's offset is [`NACK_TAG_OFFSET`].

use super::codes::NackReason;
use super::error::{array, check_len, check_room, WireError};
use super::lengths::*;

/// NACK payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NackPayload {
    pub reason: NackReason,
    /// What the reason refers to: for NACK 11 the [`super::Quota`] hit;
    /// 0 otherwise (bytes 2–3, reserved zero before version 4).
    pub detail: u16,
    /// The nonce of the refused HELLO or JOIN; zero for other messages.
    pub echo: Nonce,
    /// HMAC under the recipient's session key over the header as sent, the
    /// reason and the echo ([`crate::auth::nack_tag`]); zero when the switch
    /// has no session with the recipient (docs/PROTOCOL.md, "Sessions").
    pub tag: NackTag,
}

/// Offset of the tag in a NACK payload.
pub const NACK_TAG_OFFSET: usize = 4 + NONCE_LEN;

impl NackPayload {
    pub fn new(reason: NackReason) -> NackPayload {
        NackPayload {
            reason,
            detail: 0,
            echo: [0; NONCE_LEN],
            tag: [0; NACK_TAG_LEN],
        }
    }

    /// A NACK echoing `echo`, with a zero tag.
    pub fn echoing(reason: NackReason, echo: Nonce) -> NackPayload {
        NackPayload {
            echo,
            ..NackPayload::new(reason)
        }
    }

    pub fn parse(b: &[u8]) -> Result<NackPayload, WireError> {
        check_len(b, NACK_PAYLOAD_LEN, "a NACK payload (36 bytes)")?;
        let v = u16::from_be_bytes([b[0], b[1]]);
        let reason = NackReason::from_u16(v).ok_or(WireError::UnknownNackReason(v))?;
        Ok(NackPayload {
            reason,
            detail: u16::from_be_bytes([b[2], b[3]]),
            echo: array(&b[4..NACK_TAG_OFFSET]),
            tag: array(&b[NACK_TAG_OFFSET..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, NACK_PAYLOAD_LEN)?;
        b[..2].copy_from_slice(&(self.reason as u16).to_be_bytes());
        b[2..4].copy_from_slice(&self.detail.to_be_bytes());
        b[4..NACK_TAG_OFFSET].copy_from_slice(&self.echo);
        b[NACK_TAG_OFFSET..NACK_PAYLOAD_LEN].copy_from_slice(&self.tag);
        Ok(NACK_PAYLOAD_LEN)
    }
}
