//! Refusing earlier protocol versions: recognising a version-1 frame or a
//! version-2 or version-3 HELLO, and writing the NACK that version understands.
//!
//! Invariant: each refusal is no longer than what it answers (no
//! amplification) and is written in the old version's own layout.

use super::codes::{MsgType, NackReason};
use super::error::{array, check_room, WireError};
use super::header::{Header, HeaderRepr};
use super::lengths::{
    Nonce, HEADER_LEN, HELLO_PAYLOAD_LEN, NACK_PAYLOAD_LEN, NONCE_LEN, V1_NACK_PAYLOAD_LEN,
};
use super::nack::NackPayload;

/// A version-1 frame's header fields needed to refuse it: `(type, job,
/// rank)`, or `None` if `b` is not a version-1 header.
pub fn peek_v1(b: &[u8]) -> Option<(u8, u16, u16)> {
    let h = Header::new_checked(b).ok()?;
    (h.version() == 1).then(|| (h.msg_type_raw(), h.job(), h.rank()))
}

/// Writes a version-1 NACK (reason 8, "malformed message", the one refusal
/// every version-1 worker reports) for a version-1 JOIN of `job`/`rank`;
/// returns its length.
pub fn emit_v1_refusal(job: u16, rank: u16, b: &mut [u8]) -> Result<usize, WireError> {
    let len = HEADER_LEN + V1_NACK_PAYLOAD_LEN;
    check_room(b, len)?;
    let mut hdr = HeaderRepr::new(MsgType::Nack, job);
    hdr.rank = rank;
    hdr.emit_to(b)?;
    b[0] = (1 << 4) | MsgType::Nack as u8;
    b[HEADER_LEN..len].copy_from_slice(&(NackReason::Malformed as u16).to_be_bytes());
    Ok(len)
}

/// The version, job, rank and hello nonce of a whole version-2 or
/// version-3 HELLO (the one message of those versions a version-4 switch
/// answers: an old worker's first message; both versions' HELLOs have this
/// layout), or `None`.
pub fn peek_old_hello(b: &[u8]) -> Option<(u8, u16, u16, Nonce)> {
    let h = Header::new_checked(b).ok()?;
    let whole = b.len() == HEADER_LEN + HELLO_PAYLOAD_LEN;
    let old = matches!(h.version(), 2 | 3);
    (old && h.msg_type_raw() == MsgType::Hello as u8 && whole)
        .then(|| (h.version(), h.job(), h.rank(), array(&b[HEADER_LEN..])))
}

/// Writes NACK 8 ("malformed message") in the layout of `version` (2 or
/// 3), echoing an old HELLO's nonce, which an old worker reports as a
/// refusal of its join instead of waiting for its join timeout; returns its
/// length (42 or 58 bytes, less than the HELLO). Other versions: an error.
pub fn emit_old_refusal(
    version: u8,
    job: u16,
    rank: u16,
    echo: &Nonce,
    b: &mut [u8],
) -> Result<usize, WireError> {
    match version {
        2 => emit_v2_refusal(job, rank, echo, b),
        3 => {
            // Version 3's NACK is version 4's: reason, 2 zero bytes, echo,
            // a 16-byte tag (zero: no session).
            let len = HEADER_LEN + NACK_PAYLOAD_LEN;
            check_room(b, len)?;
            let mut hdr = HeaderRepr::new(MsgType::Nack, job);
            hdr.rank = rank;
            hdr.emit_to(b)?;
            b[0] = (3 << 4) | MsgType::Nack as u8;
            NackPayload::echoing(NackReason::Malformed, *echo).emit(&mut b[HEADER_LEN..])?;
            Ok(len)
        }
        _ => Err(WireError::BadVersion(version)),
    }
}

/// Length of a version-2 NACK payload: reason, 2 reserved bytes, echo.
pub const V2_NACK_PAYLOAD_LEN: usize = 4 + NONCE_LEN;

/// Writes a version-2 NACK 8 ("malformed message") echoing a version-2
/// HELLO's nonce, which a version-2 worker reports as a refusal of its join
/// instead of waiting for its join timeout; returns its length (42 bytes,
/// less than the HELLO).
pub fn emit_v2_refusal(
    job: u16,
    rank: u16,
    echo: &Nonce,
    b: &mut [u8],
) -> Result<usize, WireError> {
    let len = HEADER_LEN + V2_NACK_PAYLOAD_LEN;
    check_room(b, len)?;
    let mut hdr = HeaderRepr::new(MsgType::Nack, job);
    hdr.rank = rank;
    hdr.emit_to(b)?;
    b[0] = (2 << 4) | MsgType::Nack as u8;
    b[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&(NackReason::Malformed as u16).to_be_bytes());
    b[HEADER_LEN + 2..HEADER_LEN + 4].fill(0);
    b[HEADER_LEN + 4..len].copy_from_slice(echo);
    Ok(len)
}
