//! Why bytes are not a valid version-3 message ([`WireError`]), and the
//! length checks every payload's `parse` and `emit` share.
//!
//! Invariant: a parse or emit fails with [`WireError`] and never panics on
//! a short buffer: `check_len`/`check_room` run before any indexing.

/// Why bytes are not a valid version-3 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: {len} bytes, need at least {need}")]
    Truncated { len: usize, need: usize },
    #[error("unsupported protocol version {0} (this build speaks version 3)")]
    BadVersion(u8),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("reserved flag bits set: {0:#04x}")]
    ReservedFlags(u8),
    #[error("job id 0 is invalid")]
    ZeroJob,
    #[error("payload of {len} bytes does not match {what}")]
    PayloadLength { len: usize, what: &'static str },
    #[error("unknown NACK reason {0}")]
    UnknownNackReason(u16),
}

impl WireError {
    /// Short stable name, for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::BadVersion(_) => "bad_version",
            WireError::UnknownType(_) => "unknown_type",
            WireError::ReservedFlags(_) => "reserved_flags",
            WireError::ZeroJob => "zero_job",
            WireError::PayloadLength { .. } => "payload_length",
            WireError::UnknownNackReason(_) => "unknown_nack_reason",
        }
    }
}

pub(super) fn check_len(b: &[u8], need: usize, what: &'static str) -> Result<(), WireError> {
    if b.len() != need {
        return Err(WireError::PayloadLength { len: b.len(), what });
    }
    Ok(())
}

pub(super) fn check_room(b: &[u8], need: usize) -> Result<(), WireError> {
    if b.len() < need {
        return Err(WireError::Truncated { len: b.len(), need });
    }
    Ok(())
}

/// The first `N` bytes of `b` as an array; the caller checked the length.
pub(super) fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}
