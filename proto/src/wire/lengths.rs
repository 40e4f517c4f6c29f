//! Sizes on the wire: the header's and every payload's length, the
//! trailers that may follow a DATA/RESULT's values, the chunk size per MTU,
//! and the fixed-size byte arrays (nonce, MAC, tags) of those lengths.
//!
//! Invariants: these lengths are what `HeaderRepr::parse` checks a payload
//! against, so the payload types' `parse`/`emit` agree with them; nothing
//! here depends on another file of `wire`.

use crate::dtype::Dtype;

/// Protocol version carried in the high nibble of `ver_type`.
pub const VERSION: u8 = 4;
/// Length of the aggregation header.
pub const HEADER_LEN: usize = 22;
/// Default UDP port of the switch's aggregation service (0xBEEF).
pub const DEFAULT_AGG_PORT: u16 = 48879;
/// Bytes of Ethernet + IPv4 (no options) + UDP in front of the header.
pub const L2_L4_LEN: usize = 14 + 20 + 8;
/// The payload starts this many bytes into a frame.
pub const FRAME_PAYLOAD_OFFSET: usize = L2_L4_LEN + HEADER_LEN;
/// Length of a job secret.
pub const SECRET_LEN: usize = 32;
/// Length of a nonce (the switch's in CHALLENGE/JOIN, the worker's in HELLO).
pub const NONCE_LEN: usize = 16;
/// Length of a MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the tag after an `auth = "mac"` DATA or RESULT payload, and at
/// the end of a JOIN_ACK (`tag` makes and checks them, and re-exports this).
pub const TAG_LEN: usize = 16;
/// A tag.
pub type Tag = [u8; TAG_LEN];
/// Length of a job's RESULT epoch (JOIN_ACK).
pub const EPOCH_LEN: usize = 8;
/// Bytes of the statistics trailer: `sum_of_squares` f64, `square_of_sum`
/// f64, `ranks` u32, 4 zero bytes; big-endian, as every header integer
/// (`stats` parses and writes it, and re-exports this).
pub const STATS_LEN: usize = 24;
/// Length of a CHALLENGE payload: hello nonce, switch nonce, observed
/// source address and port, 2 reserved bytes.
pub const CHALLENGE_PAYLOAD_LEN: usize = 2 * NONCE_LEN + 4 + 2 + 2;
/// Length of a HELLO payload: the worker's nonce, then zero padding so that
/// a HELLO is as long as the CHALLENGE it asks for (no amplification).
pub const HELLO_PAYLOAD_LEN: usize = CHALLENGE_PAYLOAD_LEN;
/// Length of a JOIN payload: n_workers, dtype, op, switch nonce, MAC.
pub const JOIN_PAYLOAD_LEN: usize = 4 + NONCE_LEN + MAC_LEN;
/// Length of a JOIN_ACK payload: pool_slots, elems_per_chunk, n_workers,
/// auth, stats, the RESULT epoch (8 B) and a tag (16 B) under the
/// member's session key.
pub const JOIN_ACK_PAYLOAD_LEN: usize = 6 + 2 + EPOCH_LEN + TAG_LEN;
/// Length of a NACK's tag: the first 16 bytes of an HMAC-SHA256 under the
/// recipient's session key ([`crate::auth::nack_tag`]).
pub const NACK_TAG_LEN: usize = 16;
/// Length of a NACK payload: u16 reason, 2 reserved bytes, the nonce of the
/// refused HELLO or JOIN (zero for other messages), the tag (zero when the
/// switch has no session with the recipient).
pub const NACK_PAYLOAD_LEN: usize = 4 + NONCE_LEN + NACK_TAG_LEN;
/// Length of a PROVISION payload: tenant name (32), job name (64), the
/// shape (n_workers u16, dtype, op, auth, stats, priority, 1 reserved), a
/// nonce (16) and a MAC (32).
pub const PROVISION_PAYLOAD_LEN: usize = 32 + 64 + 8 + NONCE_LEN + MAC_LEN;
/// Offset of the MAC in a PROVISION payload: the MAC covers every byte
/// before it.
pub const PROVISION_MAC_OFFSET: usize = PROVISION_PAYLOAD_LEN - MAC_LEN;
/// Length of a PROVISIONED payload: the claim's switch nonce echoed (16),
/// lease_secs u32, flags u32, a tag (16).
pub const PROVISIONED_PAYLOAD_LEN: usize = NONCE_LEN + 4 + 4 + TAG_LEN;
/// Length of a LEAVE payload: a MAC.
pub const LEAVE_PAYLOAD_LEN: usize = MAC_LEN;
/// Length of a version-1 NACK payload (sent to version-1 JOINs).
pub const V1_NACK_PAYLOAD_LEN: usize = 2;
/// Bytes of the spine block at the start of a leaf's HEARTBEAT answer
/// ([`super::flags::UPSTREAM`]); `count` u16 leaf indices follow it.
pub const UPSTREAM_WAIT_LEN: usize = 16;
/// What may follow a DATA/RESULT's values (or stand alone in a NOVAL one):
/// nothing, a tag (`auth = "mac"`), a statistics trailer (`stats = true`),
/// or both (docs/PROTOCOL.md, "Gradient statistics").
pub(super) const TRAILERS: [usize; 4] = [0, TAG_LEN, STATS_LEN, STATS_LEN + TAG_LEN];
/// Largest `count` a DATA frame may carry at a 9000-byte MTU.
pub const MAX_ELEMS_PER_CHUNK: u16 = elems_per_chunk_for_mtu(9000);

/// Elements per chunk of a job of `dtype` for a port MTU: the float32 chunk
/// in the same bytes, so a half-precision chunk holds twice the elements.
pub const fn elems_per_chunk_for(mtu: u16, dtype: Dtype) -> u16 {
    dtype.scale_f32_elems(elems_per_chunk_for_mtu(mtu))
}

/// Float32 elements per chunk for a port MTU: (MTU − 20 − 8 − 22) / 4 (362 at 1500).
pub const fn elems_per_chunk_for_mtu(mtu: u16) -> u16 {
    if mtu < 54 {
        0
    } else {
        (mtu - 20 - 8 - HEADER_LEN as u16) / 4
    }
}

/// A nonce: 16 opaque bytes.
pub type Nonce = [u8; NONCE_LEN];
/// A message authentication code (HMAC-SHA256).
pub type Mac = [u8; MAC_LEN];
/// A NACK's tag ([`NACK_TAG_LEN`] bytes; zero: unauthenticated).
pub type NackTag = [u8; NACK_TAG_LEN];
