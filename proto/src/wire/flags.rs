//! Header flag bits (the `flags` byte): what each bit means and which
//! are defined.
//!
//! Invariant: [`DEFINED`] is the union of every bit here; a message with
//! any other bit set is refused by `HeaderRepr::parse`. A bit may mean
//! different things in different message types ([`LANE_REPLIES`] is
//! [`RETX`]'s bit, on JOIN and JOIN_ACK only).

/// Congestion echo (switch → worker).
pub const ECE: u8 = 0x01;
/// Retransmission (DATA, RESULT).
pub const RETX: u8 = 0x02;
/// JOIN: the worker asks for lane replies; JOIN_ACK: the switch granted
/// them (the JOIN_ACK's tag covers the header, so only the switch can set
/// it). A granted member's RESULT of seq s leaves from the switch's port
/// `agg_port + (s mod L)`, L its seq lanes; every other reply from
/// `agg_port` (docs/PROTOCOL.md, "Seq lanes"). The bit of [`RETX`], which
/// a JOIN and a JOIN_ACK never carried: a switch that does not know it
/// ignores it and never sets it.
pub const LANE_REPLIES: u8 = 0x02;
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
