//! The payloads of joining and leaving a job: HELLO, CHALLENGE (with the
//! switch's seq lanes), JOIN, JOIN_ACK and LEAVE.
//!
//! Invariants: every `parse` takes exactly its `*_LEN` bytes and every
//! `emit` writes them; secrets and MACs never print (`Debug` hides them).

use core::fmt;

use super::error::{array, check_len, check_room, WireError};
use super::lengths::*;

/// HELLO payload (worker → switch): asks for a CHALLENGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloPayload {
    /// Random per HELLO; echoed in the CHALLENGE or NACK that answers it,
    /// so a worker takes only answers to its own HELLO.
    pub nonce: Nonce,
}

impl HelloPayload {
    pub fn parse(b: &[u8]) -> Result<HelloPayload, WireError> {
        check_len(b, HELLO_PAYLOAD_LEN, "a HELLO payload (40 bytes)")?;
        Ok(HelloPayload { nonce: array(b) })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, HELLO_PAYLOAD_LEN)?;
        b[..NONCE_LEN].copy_from_slice(&self.nonce);
        b[NONCE_LEN..HELLO_PAYLOAD_LEN].fill(0);
        Ok(HELLO_PAYLOAD_LEN)
    }
}

/// CHALLENGE payload (switch → worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengePayload {
    /// The HELLO's nonce, echoed.
    pub hello_nonce: Nonce,
    /// The switch's nonce, to be proven in the JOIN.
    pub nonce: Nonce,
    /// The worker's source address and UDP port as the switch saw them
    /// (for diagnostics: a worker behind NAT learns why its MAC fails).
    pub observed_ip: [u8; 4],
    pub observed_port: u16,
    /// The switch's seq lanes, L: it takes DATA of seq s on its UDP port
    /// plus s mod L (docs/PROTOCOL.md, "Seq lanes"). 0 (what switches
    /// before seq lanes sent: reserved zero bytes) and 1 mean one port.
    pub seq_lanes: u16,
}

impl ChallengePayload {
    pub fn parse(b: &[u8]) -> Result<ChallengePayload, WireError> {
        check_len(b, CHALLENGE_PAYLOAD_LEN, "a CHALLENGE payload (40 bytes)")?;
        Ok(ChallengePayload {
            hello_nonce: array(b),
            nonce: array(&b[NONCE_LEN..]),
            observed_ip: array(&b[2 * NONCE_LEN..]),
            observed_port: u16::from_be_bytes(array(&b[2 * NONCE_LEN + 4..])),
            seq_lanes: u16::from_be_bytes(array(&b[2 * NONCE_LEN + 6..])),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, CHALLENGE_PAYLOAD_LEN)?;
        let n = NONCE_LEN;
        b[..n].copy_from_slice(&self.hello_nonce);
        b[n..2 * n].copy_from_slice(&self.nonce);
        b[2 * n..2 * n + 4].copy_from_slice(&self.observed_ip);
        b[2 * n + 4..2 * n + 6].copy_from_slice(&self.observed_port.to_be_bytes());
        b[2 * n + 6..CHALLENGE_PAYLOAD_LEN].copy_from_slice(&self.seq_lanes.to_be_bytes());
        Ok(CHALLENGE_PAYLOAD_LEN)
    }
}

/// Most seq lanes a switch may have (docs/PROTOCOL.md, "Seq lanes").
pub const MAX_SEQ_LANES: u16 = 64;

/// The seq lanes a CHALLENGE's `seq_lanes` field means: 0 and 1 are one
/// lane; anything else is rounded down to a power of two, at most
/// [`MAX_SEQ_LANES`] (a worker never sends beyond the lanes it believes).
pub fn seq_lanes_from_wire(v: u16) -> u16 {
    let v = v.clamp(1, MAX_SEQ_LANES);
    1 << v.ilog2()
}

/// The UDP port a DATA of `seq` goes to on a switch whose aggregation port
/// is `port` and whose seq lanes are `lanes` (a power of two): `port +
/// (seq mod lanes)`.
pub fn seq_lane_port(port: u16, seq: u32, lanes: u16) -> u16 {
    let lane = seq & u32::from(lanes.max(1) - 1);
    port.wrapping_add(lane as u16)
}

/// JOIN payload: the job's parameters and the proof of the secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JoinPayload {
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    /// The switch's nonce from the CHALLENGE.
    pub nonce: Nonce,
    /// [`crate::auth::join_mac`] over the header, these fields and the
    /// worker's address.
    pub mac: Mac,
}

impl fmt::Debug for JoinPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinPayload")
            .field("n_workers", &self.n_workers)
            .field("dtype", &self.dtype)
            .field("op", &self.op)
            .field("mac", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl JoinPayload {
    pub fn parse(b: &[u8]) -> Result<JoinPayload, WireError> {
        check_len(b, JOIN_PAYLOAD_LEN, "a JOIN payload (52 bytes)")?;
        Ok(JoinPayload {
            n_workers: u16::from_be_bytes([b[0], b[1]]),
            dtype: b[2],
            op: b[3],
            nonce: array(&b[4..]),
            mac: array(&b[4 + NONCE_LEN..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, JOIN_PAYLOAD_LEN)?;
        b[0..2].copy_from_slice(&self.n_workers.to_be_bytes());
        b[2] = self.dtype;
        b[3] = self.op;
        b[4..4 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[4 + NONCE_LEN..JOIN_PAYLOAD_LEN].copy_from_slice(&self.mac);
        Ok(JOIN_PAYLOAD_LEN)
    }
}

/// JOIN_ACK payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAckPayload {
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    pub n_workers: u16,
    /// The job's [`crate::tag::AuthMode`] as its byte (an unknown value is
    /// the receiver's to refuse).
    pub auth: u8,
    /// 1 when the job is `stats = true` (its RESULTs carry a statistics
    /// trailer: docs/PROTOCOL.md, "Gradient statistics"), else 0; another
    /// value is the receiver's to refuse.
    pub stats: u8,
    /// The RESULT epoch of this activation ([`crate::tag::PacketKey::result`]).
    pub epoch: [u8; EPOCH_LEN],
    /// [`crate::tag::join_ack_tag`] under the member's session key, over the
    /// header and the payload before it.
    pub tag: Tag,
}

/// Bytes of a JOIN_ACK payload before its tag (what the tag covers).
pub const JOIN_ACK_TAGGED_LEN: usize = JOIN_ACK_PAYLOAD_LEN - TAG_LEN;

impl JoinAckPayload {
    pub fn parse(b: &[u8]) -> Result<JoinAckPayload, WireError> {
        if b.len() != JOIN_ACK_PAYLOAD_LEN {
            return Err(WireError::PayloadLength {
                len: b.len(),
                what: "a JOIN_ACK payload (32 bytes)",
            });
        }
        Ok(JoinAckPayload {
            pool_slots: u16::from_be_bytes([b[0], b[1]]),
            elems_per_chunk: u16::from_be_bytes([b[2], b[3]]),
            n_workers: u16::from_be_bytes([b[4], b[5]]),
            auth: b[6],
            stats: b[7],
            epoch: array(&b[8..]),
            tag: array(&b[JOIN_ACK_TAGGED_LEN..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        if b.len() < JOIN_ACK_PAYLOAD_LEN {
            return Err(WireError::Truncated {
                len: b.len(),
                need: JOIN_ACK_PAYLOAD_LEN,
            });
        }
        b[0..2].copy_from_slice(&self.pool_slots.to_be_bytes());
        b[2..4].copy_from_slice(&self.elems_per_chunk.to_be_bytes());
        b[4..6].copy_from_slice(&self.n_workers.to_be_bytes());
        b[6] = self.auth;
        b[7] = self.stats;
        b[8..JOIN_ACK_TAGGED_LEN].copy_from_slice(&self.epoch);
        b[JOIN_ACK_TAGGED_LEN..JOIN_ACK_PAYLOAD_LEN].copy_from_slice(&self.tag);
        Ok(JOIN_ACK_PAYLOAD_LEN)
    }
}

/// LEAVE payload: [`crate::auth::leave_mac`], so that nobody without the
/// secret can make a member leave.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LeavePayload {
    pub mac: Mac,
}

impl fmt::Debug for LeavePayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeavePayload { mac: <redacted> }")
    }
}

impl LeavePayload {
    pub fn parse(b: &[u8]) -> Result<LeavePayload, WireError> {
        check_len(b, LEAVE_PAYLOAD_LEN, "a LEAVE payload (32 bytes)")?;
        Ok(LeavePayload { mac: array(b) })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, LEAVE_PAYLOAD_LEN)?;
        b[..MAC_LEN].copy_from_slice(&self.mac);
        Ok(LEAVE_PAYLOAD_LEN)
    }
}
