//! Wire format of the aggregation protocol, version 4 (docs/PROTOCOL.md).
//!
//! Owns: the 22-byte aggregation header as a view over a byte buffer
//! ([`Header`]), its high-level form ([`HeaderRepr`]) with `parse`/`emit`,
//! and the payloads of HELLO, CHALLENGE, JOIN, JOIN_ACK, NACK, LEAVE,
//! PROVISION and PROVISIONED;
//! the lengths of what may follow a DATA/RESULT's values or end a JOIN_ACK
//! ([`TAG_LEN`], [`EPOCH_LEN`], [`STATS_LEN`]), which `parse` checks
//! payload lengths with (`tag` and `stats`, which make those bytes,
//! re-export them under their old paths). It re-exports, under their old paths, the element types
//! of [`crate::dtype`] and the float32 codec of [`crate::elements`].
//!
//! Layering: it imports only those two; everything that makes or reads
//! messages (`tag`, `auth`, `stats`, the state machines) is above it.
//!
//! Invariants: accessors of a [`Header`] made by [`Header::new_checked`] never
//! panic; [`HeaderRepr::parse`] accepts only what version 4 allows (known type,
//! no reserved flag bits, job ≠ 0 but on a PROVISION, a payload length that matches the type), so
//! everything after it may trust the fields, except one: the header does not
//! name a DATA/RESULT's element type, so `parse` accepts `count` elements of
//! either size (half or single precision) and the receiver, which knows its job's
//! [`Dtype`], checks `count × size` exactly ([`Dtype::payload_len`]). All
//! integers are big-endian; element payloads are little-endian IEEE-754
//! (float32, or a u16 per bf16/f16 element). Secrets and MACs never print.
//!
//! Files, bottom up (each imports only those before it): `lengths` (sizes,
//! chunk size per MTU, the byte arrays), `flags` (header flag bits),
//! `codes` (message type, kind, op, NACK reason), `error` ([`WireError`]
//! and the length checks), `header` ([`Header`], [`HeaderRepr`]),
//! `membership` (HELLO, CHALLENGE, JOIN, JOIN_ACK, LEAVE), `nack`,
//! `provision` (PROVISION, PROVISIONED), `heartbeat` (a leaf's upstream wait, u16 lists), `legacy` (refusing
//! versions 1, 2 and 3). Everything is re-exported here, so `crate::wire::X`
//! is the one path users name.

pub use crate::dtype::{Dtype, UnknownDtype, DTYPE_BF16, DTYPE_F16, DTYPE_F32};
pub use crate::elements::{read_f32s, write_f32s};

// Float payloads are little-endian on the wire and copied as native bytes.
#[cfg(not(target_endian = "little"))]
compile_error!(
    "aggswitch supports little-endian targets only (float payloads are copied as native bytes)"
);

mod codes;
mod error;
pub mod flags;
mod header;
mod heartbeat;
mod legacy;
mod lengths;
mod membership;
mod nack;
mod provision;
#[cfg(test)]
mod tests;

pub use codes::{Kind, MsgType, NackReason, Quota, LEAVE_FOR_HOSTS, OP_SUM};
pub use error::WireError;
pub use header::{Header, HeaderRepr};
pub use heartbeat::{read_u16s, write_u16s, SpineRefusal, SpineSessionState, UpstreamWaitPayload};
pub use legacy::{
    emit_old_refusal, emit_v1_refusal, emit_v2_refusal, peek_old_hello, peek_v1,
    V2_NACK_PAYLOAD_LEN,
};
pub use lengths::*;
pub use membership::{
    seq_lane_port, seq_lanes_from_wire, ChallengePayload, HelloPayload, JoinAckPayload,
    JoinPayload, LeavePayload, JOIN_ACK_TAGGED_LEN, MAX_SEQ_LANES,
};
pub use nack::{NackPayload, NACK_TAG_OFFSET};
pub use provision::{
    ProvisionPayload, ProvisionedPayload, PROVISIONED_CREATED, PROVISION_ASK, PROVISION_CLAIM,
};
