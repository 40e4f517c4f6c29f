//! Header flag bits (the `flags` byte): what each bit means and which
//! are defined.
//!
//! Invariant: [`DEFINED`] is the union of every bit here; a version-3
//! message with any other bit set is refused by `HeaderRepr::parse`.

/// Congestion echo (switch → worker).
pub const ECE: u8 = 0x01;
/// Retransmission.
pub const RETX: u8 = 0x02;
/// Last chunk of a collective.
pub const LAST: u8 = 0x04;
/// HEARTBEAT answer of a leaf: the seq waits for a spine, and the payload
/// starts with an [`UpstreamWaitPayload`](super::UpstreamWaitPayload).
pub const UPSTREAM: u8 = 0x08;
/// DATA/RESULT: the collective's kind, two bits ([`Kind`](super::Kind));
/// 0 (all-reduce) in every other message.
pub const KIND_MASK: u8 = 0x30;
/// Shift of [`KIND_MASK`].
pub const KIND_SHIFT: u8 = 4;
/// DATA/RESULT without values: `count` still names the chunk's elements,
/// the payload is empty (or only the tag of an `auth = "mac"` job). A
/// reduce-scatter's RESULT to a rank that does not own the chunk, an
/// all-gather's DATA from a rank that does not own it and its RESULT to
/// the owner.
pub const NOVAL: u8 = 0x40;
/// Every bit the protocol defines; the others must be zero.
pub const DEFINED: u8 = ECE | RETX | LAST | UPSTREAM | KIND_MASK | NOVAL;
