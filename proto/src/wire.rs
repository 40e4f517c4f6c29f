//! Wire format of the aggregation protocol, version 3 (docs/PROTOCOL.md).
//!
//! Owns: the 22-byte aggregation header as a view over a byte buffer
//! ([`Header`]), its high-level form ([`HeaderRepr`]) with `parse`/`emit`,
//! and the payloads of HELLO, CHALLENGE, JOIN, JOIN_ACK, NACK and LEAVE;
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
//! panic; [`HeaderRepr::parse`] accepts only what version 3 allows (known type,
//! no reserved flag bits, job ≠ 0, a payload length that matches the type), so
//! everything after it may trust the fields, except one: the header does not
//! name a DATA/RESULT's element type, so `parse` accepts `count` elements of
//! either size (half or single precision) and the receiver, which knows its job's
//! [`Dtype`], checks `count × size` exactly ([`Dtype::payload_len`]). All
//! integers are big-endian; element payloads are little-endian IEEE-754
//! (float32, or a u16 per bf16/f16 element). Secrets and MACs never print.

use core::fmt;

pub use crate::dtype::{Dtype, UnknownDtype, DTYPE_BF16, DTYPE_F16, DTYPE_F32};
pub use crate::elements::{read_f32s, write_f32s};

// Float payloads are little-endian on the wire and copied as native bytes.
#[cfg(not(target_endian = "little"))]
compile_error!(
    "aggswitch supports little-endian targets only (float payloads are copied as native bytes)"
);

/// Protocol version carried in the high nibble of `ver_type`.
pub const VERSION: u8 = 3;
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
/// Length of a LEAVE payload: a MAC.
pub const LEAVE_PAYLOAD_LEN: usize = MAC_LEN;
/// Length of a version-1 NACK payload (sent to version-1 JOINs).
pub const V1_NACK_PAYLOAD_LEN: usize = 2;
/// Bytes of the spine block at the start of a leaf's HEARTBEAT answer
/// ([`flags::UPSTREAM`]); `count` u16 leaf indices follow it.
pub const UPSTREAM_WAIT_LEN: usize = 16;
/// What may follow a DATA/RESULT's values (or stand alone in a NOVAL one):
/// nothing, a tag (`auth = "mac"`), a statistics trailer (`stats = true`),
/// or both (docs/PROTOCOL.md, "Gradient statistics").
const TRAILERS: [usize; 4] = [0, TAG_LEN, STATS_LEN, STATS_LEN + TAG_LEN];
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

/// Header flag bits.
pub mod flags {
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
}

/// What a collective does with its chunks (DATA/RESULT flag bits 4–5).
///
/// Every kind completes a slot when all n ranks have sent the seq, so the
/// window, the floor, the shadow and loss recovery are all-reduce's. Kinds
/// other than all-reduce name the chunk's *owner* rank in the DATA header's
/// `window` field (a worker never sends a window); every rank names the
/// same owner for a seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Every rank sends values, every rank gets the sum.
    AllReduce = 0,
    /// Every rank sends values; the owner gets the sum, the others a
    /// [`flags::NOVAL`] RESULT.
    ReduceScatter = 1,
    /// The owner sends values, the others a [`flags::NOVAL`] DATA; the
    /// others get the owner's values copied bit for bit (never converted
    /// or summed), the owner a [`flags::NOVAL`] RESULT.
    AllGather = 2,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::AllReduce, Kind::ReduceScatter, Kind::AllGather];

    /// The kind in `flags`; `None` for the reserved value 3.
    pub const fn from_flags(flags: u8) -> Option<Kind> {
        match (flags & flags::KIND_MASK) >> flags::KIND_SHIFT {
            0 => Some(Kind::AllReduce),
            1 => Some(Kind::ReduceScatter),
            2 => Some(Kind::AllGather),
            _ => None,
        }
    }

    /// `flags` bits that carry this kind.
    pub const fn flag_bits(self) -> u8 {
        (self as u8) << flags::KIND_SHIFT
    }

    /// Whether `rank` sends values for a chunk `owner` owns (else NOVAL).
    pub const fn sends_values(self, rank: u16, owner: u16) -> bool {
        match self {
            Kind::AllReduce | Kind::ReduceScatter => true,
            Kind::AllGather => rank == owner,
        }
    }

    /// Whether `rank` may send a NOVAL DATA where [`Kind::sends_values`]
    /// says values: a reduce-scatter's owner keeps its own shard and adds
    /// it to the other ranks' sum itself (docs/PROTOCOL.md, "Collective
    /// kinds"), so its link carries (n−1)/n of the tensor, not all of it.
    pub const fn owner_may_keep_values(self, rank: u16, owner: u16) -> bool {
        matches!(self, Kind::ReduceScatter) && rank == owner
    }

    /// Whether `rank` gets values in the RESULT of a chunk `owner` owns
    /// (else a NOVAL RESULT).
    pub const fn receives_values(self, rank: u16, owner: u16) -> bool {
        match self {
            Kind::AllReduce => true,
            Kind::ReduceScatter => rank == owner,
            Kind::AllGather => rank != owner,
        }
    }

    /// The name the CLI, logs and docs use.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all-reduce",
            Kind::ReduceScatter => "reduce-scatter",
            Kind::AllGather => "all-gather",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Message types (low nibble of `ver_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    Data = 1,
    Result = 2,
    Join = 3,
    JoinAck = 4,
    Leave = 5,
    Nack = 6,
    Heartbeat = 7,
    Hello = 8,
    Challenge = 9,
}

impl MsgType {
    pub fn from_u8(v: u8) -> Option<MsgType> {
        Some(match v {
            1 => MsgType::Data,
            2 => MsgType::Result,
            3 => MsgType::Join,
            4 => MsgType::JoinAck,
            5 => MsgType::Leave,
            6 => MsgType::Nack,
            7 => MsgType::Heartbeat,
            8 => MsgType::Hello,
            9 => MsgType::Challenge,
            _ => return None,
        })
    }
}

/// Reduction operations (JOIN `op`).
pub const OP_SUM: u8 = 0;

/// A LEAVE's `count` when the member leaves to finish its job on the host
/// path (a fallback: docs/PROTOCOL.md, "Leaving"); 0 otherwise. The switch
/// counts it (`members_left_for_hosts`) and changes nothing else for it.
pub const LEAVE_FOR_HOSTS: u16 = 1;

/// Why the switch refused something (NACK payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum NackReason {
    UnknownJob = 1,
    BadSecret = 2,
    SourceNotAllowed = 3,
    RankOutOfRange = 4,
    ParametersDiffer = 5,
    JobNotActive = 6,
    StaleGeneration = 7,
    Malformed = 8,
    /// The JOIN's nonce is too old, or not one this switch issued to this
    /// rank and address: ask for a new CHALLENGE.
    StaleNonce = 9,
    /// DATA of a reduce-scatter or all-gather to a job that cannot serve
    /// it (an aggregation tree's leaf or spine).
    KindNotSupported = 10,
}

impl NackReason {
    pub fn from_u16(v: u16) -> Option<NackReason> {
        Some(match v {
            1 => NackReason::UnknownJob,
            2 => NackReason::BadSecret,
            3 => NackReason::SourceNotAllowed,
            4 => NackReason::RankOutOfRange,
            5 => NackReason::ParametersDiffer,
            6 => NackReason::JobNotActive,
            7 => NackReason::StaleGeneration,
            8 => NackReason::Malformed,
            9 => NackReason::StaleNonce,
            10 => NackReason::KindNotSupported,
            _ => return None,
        })
    }
}

impl fmt::Display for NackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NackReason::UnknownJob => {
                "unknown job: not declared on the switch, or removed (switchctl jobs)"
            }
            NackReason::BadSecret => {
                "bad secret: the JOIN's MAC does not verify (check --secret against the job's secret)"
            }
            NackReason::SourceNotAllowed => {
                "source address not allowed (add it to the job's allowed_sources)"
            }
            NackReason::RankOutOfRange => "rank out of range (rank must be below n_workers)",
            NackReason::ParametersDiffer => {
                "parameters differ from the job's (n_workers, dtype, op)"
            }
            NackReason::JobNotActive => "job not active (re-join)",
            NackReason::StaleGeneration => "stale generation (the switch restarted; re-join)",
            NackReason::Malformed => "malformed message",
            NackReason::StaleNonce => "stale or unknown nonce (ask for a new CHALLENGE)",
            NackReason::KindNotSupported => {
                "collective kind not supported by this job (reduce-scatter and all-gather need a job on a single switch, not an aggregation tree)"
            }
        })
    }
}

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

mod field {
    use core::ops::Range;
    pub const VER_TYPE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const JOB: Range<usize> = 2..4;
    pub const RANK: Range<usize> = 4..6;
    pub const COUNT: Range<usize> = 6..8;
    pub const SEQ: Range<usize> = 8..12;
    pub const COLLECTIVE: Range<usize> = 12..16;
    pub const WINDOW: Range<usize> = 16..18;
    pub const GEN: Range<usize> = 18..22;
}

/// A view of an aggregation header (and what follows it) over a buffer.
#[derive(Debug, Clone)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`Header::new_checked`] on anything received.
    pub fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps a buffer that holds at least a whole header.
    pub fn new_checked(buffer: T) -> Result<Header<T>, WireError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated {
                len,
                need: HEADER_LEN,
            });
        }
        Ok(Header { buffer })
    }

    /// The header's bytes as received (what a NACK's tag covers). All zero
    /// on a buffer too short for a header (only [`Header::new_unchecked`]
    /// makes one), which no tag verifies.
    pub fn header_bytes(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk::<HEADER_LEN>()
            .unwrap_or(&[0; HEADER_LEN])
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        let b = &self.buffer.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TYPE] >> 4
    }
    pub fn msg_type_raw(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TYPE] & 0x0f
    }
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    pub fn job(&self) -> u16 {
        self.u16_at(field::JOB)
    }
    pub fn rank(&self) -> u16 {
        self.u16_at(field::RANK)
    }
    pub fn count(&self) -> u16 {
        self.u16_at(field::COUNT)
    }
    pub fn seq(&self) -> u32 {
        self.u32_at(field::SEQ)
    }
    pub fn collective(&self) -> u32 {
        self.u32_at(field::COLLECTIVE)
    }
    pub fn window(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }
    pub fn gen(&self) -> u32 {
        self.u32_at(field::GEN)
    }
    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    fn set_u32(&mut self, r: core::ops::Range<usize>, v: u32) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_ver_type(&mut self, version: u8, ty: u8) {
        self.buffer.as_mut()[field::VER_TYPE] = (version << 4) | (ty & 0x0f);
    }
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    pub fn set_job(&mut self, v: u16) {
        self.set_u16(field::JOB, v)
    }
    pub fn set_rank(&mut self, v: u16) {
        self.set_u16(field::RANK, v)
    }
    pub fn set_count(&mut self, v: u16) {
        self.set_u16(field::COUNT, v)
    }
    pub fn set_seq(&mut self, v: u32) {
        self.set_u32(field::SEQ, v)
    }
    pub fn set_collective(&mut self, v: u32) {
        self.set_u32(field::COLLECTIVE, v)
    }
    pub fn set_window(&mut self, v: u16) {
        self.set_u16(field::WINDOW, v)
    }
    pub fn set_gen(&mut self, v: u32) {
        self.set_u32(field::GEN, v)
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The fields of a header, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderRepr {
    pub msg_type: MsgType,
    pub flags: u8,
    pub job: u16,
    pub rank: u16,
    pub count: u16,
    pub seq: u32,
    pub collective: u32,
    pub window: u16,
    pub gen: u32,
}

impl HeaderRepr {
    /// A header of type `msg_type` with every other field zero.
    pub fn new(msg_type: MsgType, job: u16) -> HeaderRepr {
        HeaderRepr {
            msg_type,
            flags: 0,
            job,
            rank: 0,
            count: 0,
            seq: 0,
            collective: 0,
            window: 0,
            gen: 0,
        }
    }

    /// Parses and validates a header and the length of its payload.
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<HeaderRepr, WireError> {
        if h.version() != VERSION {
            return Err(WireError::BadVersion(h.version()));
        }
        let ty = h.msg_type_raw();
        let msg_type = MsgType::from_u8(ty).ok_or(WireError::UnknownType(ty))?;
        let flags = h.flags();
        if flags & !flags::DEFINED != 0 {
            return Err(WireError::ReservedFlags(flags));
        }
        if h.job() == 0 {
            return Err(WireError::ZeroJob);
        }
        let elements = matches!(msg_type, MsgType::Data | MsgType::Result);
        let kind_bits = flags & (flags::KIND_MASK | flags::NOVAL);
        // Kind and NOVAL belong to DATA/RESULT only; kind 3 is reserved and
        // an all-reduce always carries values.
        if kind_bits != 0
            && (!elements
                || Kind::from_flags(flags).is_none()
                || (flags & flags::NOVAL != 0 && Kind::from_flags(flags) == Some(Kind::AllReduce)))
        {
            return Err(WireError::ReservedFlags(flags));
        }
        let len = h.payload().len();
        let ok = match msg_type {
            // Either element size, with or without a tag; the job's dtype
            // and auth mode decide which is right.
            // A stats job's trailer and a mac job's tag may follow either.
            MsgType::Data | MsgType::Result if flags & flags::NOVAL != 0 => {
                h.count() > 0 && TRAILERS.contains(&len)
            }
            MsgType::Data | MsgType::Result => {
                let n = h.count() as usize;
                n > 0
                    && TRAILERS
                        .iter()
                        .any(|t| len == n * 4 + t || len == n * 2 + t)
            }
            MsgType::Join => len == JOIN_PAYLOAD_LEN,
            MsgType::JoinAck => len == JOIN_ACK_PAYLOAD_LEN,
            MsgType::Nack => len == NACK_PAYLOAD_LEN,
            MsgType::Leave => len == LEAVE_PAYLOAD_LEN,
            MsgType::Hello | MsgType::Challenge => len == HELLO_PAYLOAD_LEN,
            // Worker → switch: empty; switch → worker: `count` u16 ranks,
            // after a spine block when a leaf says the seq waits upstream.
            MsgType::Heartbeat if flags & flags::UPSTREAM != 0 => {
                len == UPSTREAM_WAIT_LEN + h.count() as usize * 2
            }
            MsgType::Heartbeat => len == h.count() as usize * 2,
        };
        if !ok {
            let what = match msg_type {
                MsgType::Data | MsgType::Result if flags & flags::NOVAL != 0 => {
                    "no values (empty, or 24 with statistics and/or 16 with a tag) and count ≥ 1"
                }
                MsgType::Data | MsgType::Result => {
                    "count × 2 or count × 4 (count ≥ 1), plus 24 with statistics and/or 16 with a tag"
                }
                MsgType::Join => "a JOIN payload (52 bytes)",
                MsgType::JoinAck => "a JOIN_ACK payload (32 bytes)",
                MsgType::Nack => "a NACK payload (36 bytes)",
                MsgType::Leave => "a LEAVE payload (32 bytes)",
                MsgType::Hello | MsgType::Challenge => "a HELLO/CHALLENGE payload (40 bytes)",
                MsgType::Heartbeat if flags & flags::UPSTREAM != 0 => "16 + count × 2",
                MsgType::Heartbeat => "count × 2",
            };
            return Err(WireError::PayloadLength { len, what });
        }
        Ok(HeaderRepr {
            msg_type,
            flags,
            job: h.job(),
            rank: h.rank(),
            count: h.count(),
            seq: h.seq(),
            collective: h.collective(),
            window: h.window(),
            gen: h.gen(),
        })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `h`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_ver_type(VERSION, self.msg_type as u8);
        h.set_flags(self.flags);
        h.set_job(self.job);
        h.set_rank(self.rank);
        h.set_count(self.count);
        h.set_seq(self.seq);
        h.set_collective(self.collective);
        h.set_window(self.window);
        h.set_gen(self.gen);
    }

    /// Writes the header to the front of `buf`; returns [`HEADER_LEN`], or
    /// an error if `buf` is too short.
    pub fn emit_to(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut h = Header::new_checked(buf)?;
        self.emit(&mut h);
        Ok(HEADER_LEN)
    }

    pub fn has_flag(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// The collective's kind (all-reduce outside DATA/RESULT). `parse`
    /// refuses the reserved kind, so a parsed header always has one.
    pub fn kind(&self) -> Kind {
        Kind::from_flags(self.flags).unwrap_or(Kind::AllReduce)
    }

    /// A DATA's owner rank (kinds other than all-reduce; `window` field).
    pub fn owner(&self) -> u16 {
        self.window
    }

    /// Whether a DATA/RESULT carries no values ([`flags::NOVAL`]).
    pub fn no_values(&self) -> bool {
        self.has_flag(flags::NOVAL)
    }
}

/// A nonce: 16 opaque bytes.
pub type Nonce = [u8; NONCE_LEN];
/// A message authentication code (HMAC-SHA256).
pub type Mac = [u8; MAC_LEN];

fn check_len(b: &[u8], need: usize, what: &'static str) -> Result<(), WireError> {
    if b.len() != need {
        return Err(WireError::PayloadLength { len: b.len(), what });
    }
    Ok(())
}

fn check_room(b: &[u8], need: usize) -> Result<(), WireError> {
    if b.len() < need {
        return Err(WireError::Truncated { len: b.len(), need });
    }
    Ok(())
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

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

/// A NACK's tag ([`NACK_TAG_LEN`] bytes; zero: unauthenticated).
pub type NackTag = [u8; NACK_TAG_LEN];

/// NACK payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NackPayload {
    pub reason: NackReason,
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
            echo: array(&b[4..NACK_TAG_OFFSET]),
            tag: array(&b[NACK_TAG_OFFSET..]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, NACK_PAYLOAD_LEN)?;
        b[..2].copy_from_slice(&(self.reason as u16).to_be_bytes());
        b[2..4].fill(0);
        b[4..NACK_TAG_OFFSET].copy_from_slice(&self.echo);
        b[NACK_TAG_OFFSET..NACK_PAYLOAD_LEN].copy_from_slice(&self.tag);
        Ok(NACK_PAYLOAD_LEN)
    }
}

/// The start of a leaf's HEARTBEAT answer when the seq has all its local
/// contributions and waits for its spine (docs/PROTOCOL.md, "Aggregation
/// trees"): which spine, and how long it has been silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamWaitPayload {
    /// The spine's aggregation address.
    pub spine_ip: [u8; 4],
    pub spine_port: u16,
    /// Its index in the job's spine list (the tree).
    pub tree: u16,
    /// Milliseconds since the leaf last heard from that spine while the
    /// partial waited; [`UpstreamWaitPayload::NEVER`] if it never did.
    pub silent_ms: u32,
    /// The leaf's session with that spine.
    pub session: SpineSessionState,
}

/// A leaf's session with one spine, as its HEARTBEAT answers and
/// `switchctl jobs` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineSessionState {
    Joined,
    Joining,
    /// The spine refused the leaf's JOIN, or answered it with a job the
    /// leaf's does not match: the tree is declared inconsistently.
    Refused(SpineRefusal),
}

/// Why a leaf cannot join a spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineRefusal {
    /// The spine's NACK.
    Nack(NackReason),
    /// The spine's JOIN_ACK names another chunk size (`spine` elements)
    /// than the leaf's job.
    ElemsDiffer { spine: u16 },
    /// The spine's job is declared `auth = "mac"`: trees aggregate with
    /// `auth = "port"` only.
    AuthDiffers,
    /// The spine's JOIN_ACK names another `stats` (`spine`) than the leaf's
    /// job (docs/PROTOCOL.md, "Gradient statistics").
    StatsDiffer { spine: u8 },
}

impl fmt::Display for SpineRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpineRefusal::Nack(NackReason::UnknownJob) => {
                f.write_str("the spine has no such job (declare it there too)")
            }
            SpineRefusal::Nack(NackReason::BadSecret) => {
                f.write_str("bad secret: the job's secret differs between leaf and spine")
            }
            SpineRefusal::Nack(NackReason::SourceNotAllowed) => {
                f.write_str("the spine's allowed_sources do not include the leaf's uplink address")
            }
            SpineRefusal::Nack(NackReason::RankOutOfRange) => {
                f.write_str("the leaf's leaf_index is not below the spine job's n_workers")
            }
            SpineRefusal::Nack(NackReason::ParametersDiffer) => f.write_str(
                "the spine job's n_workers differs from the leaves' n_leaves (or dtype/op differ)",
            ),
            SpineRefusal::Nack(r) => write!(f, "{r}"),
            SpineRefusal::AuthDiffers => f.write_str(
                "the spine's job is declared auth = \"mac\"; aggregation trees support auth = \
                 \"port\" only (declare the spine's job with auth = \"port\")",
            ),
            SpineRefusal::ElemsDiffer { spine } => write!(
                f,
                "the spine's job has {spine} elements per chunk, not the leaf's (give both \
                 jobs the same elems_per_chunk)"
            ),
            SpineRefusal::StatsDiffer { spine } => write!(
                f,
                "the spine's job is declared stats = {}, not as the leaf's (give both jobs \
                 the same stats)",
                *spine != 0
            ),
        }
    }
}

/// `reason` of a refusal for differing chunk sizes: this bit, or-ed with
/// the spine's elements per chunk.
const ELEMS_DIFFER: u16 = 0x8000;
/// `reason` of a refusal for a spine job of `auth = "mac"` (below any
/// chunk size, which is at most 2 × 2233).
const AUTH_DIFFERS: u16 = 0x4000;
/// `reason` of a refusal for a spine job whose `stats` differs: this, plus
/// the spine's `stats` byte (0 or 1).
const STATS_DIFFER: u16 = 0x4100;

impl SpineSessionState {
    /// (state, reason) as on the wire: state 0 joined, 1 joining, 2
    /// refused; reason a NACK reason, or [`ELEMS_DIFFER`] | elements.
    fn codes(self) -> (u16, u16) {
        match self {
            SpineSessionState::Joined => (0, 0),
            SpineSessionState::Joining => (1, 0),
            SpineSessionState::Refused(SpineRefusal::Nack(r)) => (2, r as u16),
            SpineSessionState::Refused(SpineRefusal::ElemsDiffer { spine }) => {
                (2, ELEMS_DIFFER | spine)
            }
            SpineSessionState::Refused(SpineRefusal::AuthDiffers) => (2, AUTH_DIFFERS),
            SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine }) => {
                (2, STATS_DIFFER | u16::from(spine & 1))
            }
        }
    }

    fn from_codes(state: u16, reason: u16) -> SpineSessionState {
        let refused = if reason == AUTH_DIFFERS {
            Some(SpineRefusal::AuthDiffers)
        } else if reason & !1 == STATS_DIFFER {
            Some(SpineRefusal::StatsDiffer {
                spine: (reason & 1) as u8,
            })
        } else if reason & ELEMS_DIFFER != 0 {
            Some(SpineRefusal::ElemsDiffer {
                spine: reason & !ELEMS_DIFFER,
            })
        } else {
            NackReason::from_u16(reason).map(SpineRefusal::Nack)
        };
        match (state, refused) {
            (0, _) => SpineSessionState::Joined,
            (2, Some(r)) => SpineSessionState::Refused(r),
            _ => SpineSessionState::Joining,
        }
    }
}

impl UpstreamWaitPayload {
    /// `silent_ms` of a spine the leaf has not heard from at all.
    pub const NEVER: u32 = u32::MAX;

    pub fn parse(b: &[u8]) -> Result<UpstreamWaitPayload, WireError> {
        check_room(b, UPSTREAM_WAIT_LEN)?;
        Ok(UpstreamWaitPayload {
            spine_ip: array(b),
            spine_port: u16::from_be_bytes([b[4], b[5]]),
            tree: u16::from_be_bytes([b[6], b[7]]),
            silent_ms: u32::from_be_bytes(array(&b[8..])),
            session: SpineSessionState::from_codes(
                u16::from_be_bytes([b[12], b[13]]),
                u16::from_be_bytes([b[14], b[15]]),
            ),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        check_room(b, UPSTREAM_WAIT_LEN)?;
        b[..4].copy_from_slice(&self.spine_ip);
        b[4..6].copy_from_slice(&self.spine_port.to_be_bytes());
        b[6..8].copy_from_slice(&self.tree.to_be_bytes());
        b[8..12].copy_from_slice(&self.silent_ms.to_be_bytes());
        let (state, reason) = self.session.codes();
        b[12..14].copy_from_slice(&state.to_be_bytes());
        b[14..16].copy_from_slice(&reason.to_be_bytes());
        Ok(UPSTREAM_WAIT_LEN)
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

/// The job, rank and hello nonce of a whole version-2 HELLO (the one
/// version-2 message a version-3 switch answers: a version-2 worker's first
/// message), or `None`.
pub fn peek_v2_hello(b: &[u8]) -> Option<(u16, u16, Nonce)> {
    let h = Header::new_checked(b).ok()?;
    let whole = b.len() == HEADER_LEN + HELLO_PAYLOAD_LEN;
    (h.version() == 2 && h.msg_type_raw() == MsgType::Hello as u8 && whole)
        .then(|| (h.job(), h.rank(), array(&b[HEADER_LEN..])))
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

/// The first `n` big-endian u16s of `b` (as many as it holds): the ranks or
/// leaves of a HEARTBEAT answer.
pub fn read_u16s(b: &[u8], n: usize) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2)
        .take(n)
        .map(|x| u16::from_be_bytes([x[0], x[1]]))
}

/// Writes `values` into `out` as big-endian u16s, as many as fit; returns
/// how many were written.
pub fn write_u16s(values: impl IntoIterator<Item = u16>, out: &mut [u8]) -> usize {
    let mut n = 0;
    for (v, o) in values.into_iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&v.to_be_bytes());
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    // A DATA header: job 7, rank 3, count 2, seq 0x01020304, collective 9,
    // window 0, gen 0xdeadbeef, flags RETX|LAST, then 1.0f32 and -2.5f32.
    const DATA_FIXTURE: [u8; 30] = [
        0x31, 0x06, 0x00, 0x07, 0x00, 0x03, 0x00, 0x02, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
        0x09, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0,
    ];

    #[test]
    fn parse_data_fixture() {
        let h = Header::new_checked(&DATA_FIXTURE[..]).unwrap();
        let r = HeaderRepr::parse(&h).unwrap();
        assert_eq!(r.msg_type, MsgType::Data);
        assert_eq!(r.flags, flags::RETX | flags::LAST);
        assert_eq!((r.job, r.rank, r.count), (7, 3, 2));
        assert_eq!(r.seq, 0x0102_0304);
        assert_eq!(r.collective, 9);
        assert_eq!(r.gen, 0xdead_beef);
        let mut vals = [0f32; 2];
        assert_eq!(read_f32s(h.payload(), &mut vals), 2);
        assert_eq!(vals, [1.0, -2.5]);
    }

    // The same DATA from a bf16 job: 1.0 and -2.5 as little-endian bf16
    // (0x3f80, 0xc020); an f16 job's would be 0x3c00, 0xc100.
    const BF16_DATA_FIXTURE: [u8; 26] = [
        0x31, 0x06, 0x00, 0x07, 0x00, 0x03, 0x00, 0x02, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
        0x09, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x80, 0x3f, 0x20, 0xc0,
    ];

    #[test]
    fn half_precision_payloads_are_two_bytes_per_element() {
        let h = Header::new_checked(&BF16_DATA_FIXTURE[..]).unwrap();
        let r = HeaderRepr::parse(&h).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(h.payload().len(), Dtype::Bf16.payload_len(r.count));
        assert_ne!(h.payload().len(), Dtype::F32.payload_len(r.count));
        let mut vals = [0f32; 2];
        crate::elements::read_le(Dtype::Bf16, h.payload(), &mut vals);
        assert_eq!(vals, [1.0, -2.5]);
        let mut f16_bytes = [0u8; 4];
        crate::elements::round_to_le(Dtype::F16, &[1.0, -2.5], &mut f16_bytes);
        assert_eq!(f16_bytes, [0x00, 0x3c, 0x00, 0xc1]);
        // Three bytes for two elements fit no element size.
        let h = Header::new_checked(&BF16_DATA_FIXTURE[..25]).unwrap();
        assert!(matches!(
            HeaderRepr::parse(&h),
            Err(WireError::PayloadLength { len: 3, .. })
        ));
        // Dtype codes, names and chunk sizes.
        assert_eq!(Dtype::from_u8(1), Some(Dtype::Bf16));
        assert_eq!(Dtype::from_u8(2), Some(Dtype::F16));
        assert_eq!(Dtype::from_u8(3), None);
        assert_eq!("bf16".parse::<Dtype>(), Ok(Dtype::Bf16));
        assert!("float16"
            .parse::<Dtype>()
            .unwrap_err()
            .to_string()
            .contains("f32, bf16 or f16"));
        assert_eq!(elems_per_chunk_for(1500, Dtype::Bf16), 724);
        assert_eq!(elems_per_chunk_for(1500, Dtype::F32), 362);
        assert_eq!(Dtype::Bf16.scale_f32_elems(MAX_ELEMS_PER_CHUNK), 4474);
    }

    #[test]
    fn emit_reproduces_fixture() {
        let h = Header::new_checked(&DATA_FIXTURE[..]).unwrap();
        let r = HeaderRepr::parse(&h).unwrap();
        let mut buf = [0u8; 30];
        r.emit_to(&mut buf).unwrap();
        write_f32s(&[1.0, -2.5], &mut buf[HEADER_LEN..]);
        assert_eq!(buf, DATA_FIXTURE);
    }

    #[test]
    fn collective_kinds_and_novalues() {
        // The DATA fixture as a reduce-scatter chunk owned by rank 3.
        let mut b = DATA_FIXTURE;
        b[1] |= Kind::ReduceScatter.flag_bits();
        b[16..18].copy_from_slice(&3u16.to_be_bytes());
        let r = HeaderRepr::parse(&Header::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            (r.kind(), r.owner(), r.no_values()),
            (Kind::ReduceScatter, 3, false)
        );

        // A NOVAL all-gather DATA: header only (or only a tag), count kept.
        let mut h = HeaderRepr::new(MsgType::Data, 7);
        h.flags = Kind::AllGather.flag_bits() | flags::NOVAL;
        h.count = 362;
        h.window = 1;
        for extra in [0, TAG_LEN] {
            let mut buf = vec![0u8; HEADER_LEN + extra];
            h.emit_to(&mut buf).unwrap();
            let p = HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()).unwrap();
            assert_eq!(
                (p.kind(), p.count, p.owner(), p.no_values()),
                (Kind::AllGather, 362, 1, true)
            );
        }
        // ... but not with values, nor with count 0.
        let mut buf = vec![0u8; HEADER_LEN + 362 * 4];
        h.emit_to(&mut buf).unwrap();
        assert!(matches!(
            HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()),
            Err(WireError::PayloadLength { .. })
        ));
        h.count = 0;
        let mut buf = vec![0u8; HEADER_LEN];
        h.emit_to(&mut buf).unwrap();
        assert!(HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()).is_err());

        // Kind 3 is reserved; an all-reduce always has values; kinds and
        // NOVAL belong to DATA/RESULT alone.
        for bad in [0x30, flags::NOVAL] {
            let mut b = DATA_FIXTURE;
            b[1] |= bad;
            let p = HeaderRepr::parse(&Header::new_checked(&b[..]).unwrap());
            assert!(
                matches!(p, Err(WireError::ReservedFlags(_))),
                "{bad:#x}: {p:?}"
            );
        }
        let mut hb = HeaderRepr::new(MsgType::Heartbeat, 7);
        hb.flags = Kind::ReduceScatter.flag_bits();
        let mut buf = vec![0u8; HEADER_LEN];
        hb.emit_to(&mut buf).unwrap();
        assert!(matches!(
            HeaderRepr::parse(&Header::new_checked(&buf[..]).unwrap()),
            Err(WireError::ReservedFlags(_))
        ));

        // Who sends and who gets values.
        assert!(Kind::AllGather.sends_values(2, 2) && !Kind::AllGather.sends_values(1, 2));
        assert!(!Kind::AllGather.receives_values(2, 2) && Kind::AllGather.receives_values(1, 2));
        assert!(
            Kind::ReduceScatter.sends_values(1, 2) && !Kind::ReduceScatter.receives_values(1, 2)
        );
        assert!(Kind::ReduceScatter.receives_values(2, 2) && Kind::AllReduce.receives_values(1, 2));
    }

    #[test]
    fn rejects_what_version_3_forbids() {
        for (v, b0) in [(1, 0x11), (2, 0x21)] {
            let mut b = DATA_FIXTURE;
            b[0] = b0;
            let h = Header::new_checked(&b[..]).unwrap();
            assert_eq!(HeaderRepr::parse(&h), Err(WireError::BadVersion(v)));
        }

        let mut b = DATA_FIXTURE;
        b[0] = 0x3a;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::UnknownType(10)));

        let mut b = DATA_FIXTURE;
        b[1] = 0x80;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::ReservedFlags(0x80)));

        let mut b = DATA_FIXTURE;
        b[2] = 0;
        b[3] = 0;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::ZeroJob));

        // count larger than the payload
        let mut b = DATA_FIXTURE;
        b[7] = 3;
        let h = Header::new_checked(&b[..]).unwrap();
        assert!(matches!(
            HeaderRepr::parse(&h),
            Err(WireError::PayloadLength { len: 8, .. })
        ));

        assert_eq!(
            Header::new_checked(&DATA_FIXTURE[..21]).err(),
            Some(WireError::Truncated { len: 21, need: 22 })
        );
    }

    #[test]
    fn join_and_ack_round_trip() {
        let j = JoinPayload {
            n_workers: 64,
            dtype: DTYPE_F32,
            op: OP_SUM,
            nonce: [0x11; NONCE_LEN],
            mac: [0xab; MAC_LEN],
        };
        let mut b = [0u8; JOIN_PAYLOAD_LEN];
        j.emit(&mut b).unwrap();
        assert_eq!(&b[..6], &[0, 64, 0, 0, 0x11, 0x11]);
        assert_eq!(&b[20..22], &[0xab, 0xab]);
        assert_eq!(JoinPayload::parse(&b).unwrap(), j);
        assert!(!format!("{j:?}").contains("171"), "the MAC must not print");
        assert!(JoinPayload::parse(&b[..51]).is_err());

        let a = JoinAckPayload {
            pool_slots: 256,
            elems_per_chunk: 362,
            n_workers: 4,
            auth: 1,
            stats: 1,
            epoch: [0x5e; 8],
            tag: [0x7a; 16],
        };
        let mut b = [0u8; JOIN_ACK_PAYLOAD_LEN];
        a.emit(&mut b).unwrap();
        assert_eq!(b[..8], [0x01, 0x00, 0x01, 0x6a, 0x00, 0x04, 1, 1]);
        assert_eq!(b[8..16], [0x5e; 8]);
        assert_eq!(b[16..], [0x7a; 16]);
        assert_eq!(JoinAckPayload::parse(&b).unwrap(), a);
        assert!(JoinAckPayload::parse(&b[..31]).is_err());
    }

    // A CHALLENGE payload: hello nonce 0x01.., switch nonce 0x02..,
    // observed 198.18.0.2:40000, 4 seq lanes; and one of a switch before
    // seq lanes (zero bytes there): one lane.
    #[test]
    fn challenge_fixture() {
        let mut f = [0u8; CHALLENGE_PAYLOAD_LEN];
        f[..16].fill(1);
        f[16..32].fill(2);
        f[32..40].copy_from_slice(&[198, 18, 0, 2, 0x9c, 0x40, 0, 4]);
        let c = ChallengePayload::parse(&f).unwrap();
        assert_eq!(c.hello_nonce, [1; 16]);
        assert_eq!(c.nonce, [2; 16]);
        assert_eq!((c.observed_ip, c.observed_port), ([198, 18, 0, 2], 40000));
        assert_eq!(c.seq_lanes, 4);
        let mut out = [0xffu8; CHALLENGE_PAYLOAD_LEN];
        c.emit(&mut out).unwrap();
        assert_eq!(out, f);
        f[38..40].fill(0);
        assert_eq!(ChallengePayload::parse(&f).unwrap().seq_lanes, 0);
        let mut h = [0xffu8; HELLO_PAYLOAD_LEN];
        HelloPayload { nonce: [1; 16] }.emit(&mut h).unwrap();
        assert_eq!(&h[..16], &[1; 16]);
        assert_eq!(&h[16..], &[0; 24], "padding is zero");
    }

    #[test]
    fn seq_lanes_on_the_wire() {
        for (v, lanes) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 2),
            (8, 8),
            (100, 64),
            (u16::MAX, 64),
        ] {
            assert_eq!(seq_lanes_from_wire(v), lanes, "{v}");
        }
        assert_eq!(seq_lane_port(48879, 6, 4), 48881);
        assert_eq!(seq_lane_port(48879, 6, 1), 48879);
        assert_eq!(seq_lane_port(u16::MAX, 1, 2), 0, "wraps like a port");
    }

    #[test]
    fn nack_round_trip() {
        let mut b = [0u8; NACK_PAYLOAD_LEN];
        let n = NackPayload {
            reason: NackReason::StaleNonce,
            echo: [5; 16],
            tag: [7; 16],
        };
        n.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 9, 0, 0]);
        assert_eq!(&b[4..20], &[5; 16]);
        assert_eq!(&b[20..36], &[7; 16]);
        assert_eq!(NackPayload::parse(&b), Ok(n));
        b[1] = 99;
        assert_eq!(
            NackPayload::parse(&b),
            Err(WireError::UnknownNackReason(99))
        );
        assert!(NackPayload::parse(&b[..2]).is_err(), "a version-1 NACK");
        assert!(NackPayload::parse(&b[..20]).is_err(), "a version-2 NACK");
    }

    #[test]
    fn v1_refusal_is_a_version_1_nack_8() {
        let mut b = [0u8; 32];
        let n = emit_v1_refusal(5, 3, &mut b).unwrap();
        assert_eq!(n, 24);
        assert_eq!(&b[..6], &[0x16, 0, 0, 5, 0, 3]);
        assert_eq!(&b[22..24], &[0, 8]);
        assert_eq!(peek_v1(&b[..n]), Some((6, 5, 3)));
        assert_eq!(peek_v1(&DATA_FIXTURE), None);
    }

    #[test]
    fn v2_hello_gets_a_version_2_nack_8_echoing_it() {
        let mut hello = [0u8; HEADER_LEN + HELLO_PAYLOAD_LEN];
        let mut h = HeaderRepr::new(MsgType::Hello, 5);
        h.rank = 3;
        h.emit_to(&mut hello).unwrap();
        hello[0] = 0x28;
        hello[HEADER_LEN..HEADER_LEN + 16].copy_from_slice(&[7; 16]);
        assert_eq!(peek_v2_hello(&hello), Some((5, 3, [7; 16])));
        assert_eq!(peek_v2_hello(&hello[..50]), None, "only a whole HELLO");
        let mut b = [0u8; 64];
        let n = emit_v2_refusal(5, 3, &[7; 16], &mut b).unwrap();
        assert_eq!(n, 42);
        assert!(n < hello.len(), "smaller than the HELLO it answers");
        assert_eq!(&b[..6], &[0x26, 0, 0, 5, 0, 3]);
        assert_eq!(&b[22..26], &[0, 8, 0, 0]);
        assert_eq!(&b[26..42], &[7; 16]);
        hello[0] = 0x38;
        assert_eq!(peek_v2_hello(&hello), None, "a version-3 HELLO");
    }

    #[test]
    fn elems_per_chunk_matches_protocol() {
        assert_eq!(elems_per_chunk_for_mtu(1500), 362);
        assert_eq!(FRAME_PAYLOAD_OFFSET, 64);
    }

    // A leaf's HEARTBEAT answer: job 7 to rank 1, seq 5, window 64, gen 9,
    // UPSTREAM; spine 198.19.255.2:48879, tree 1, silent 4200 ms, session
    // refused with reason 2 (bad secret); waiting for leaf 3.
    const UPSTREAM_WAIT_FIXTURE: [u8; 40] = [
        0x37, 0x08, 0x00, 0x07, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x09, 198, 19, 255, 2, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00, 0x10, 0x68, 0x00, 0x02, 0x00, 0x02, 0x00, 0x03,
    ];

    #[test]
    fn upstream_wait_fixture_round_trips() {
        let h = Header::new_checked(&UPSTREAM_WAIT_FIXTURE[..]).unwrap();
        let r = HeaderRepr::parse(&h).unwrap();
        assert_eq!(r.msg_type, MsgType::Heartbeat);
        assert!(r.has_flag(flags::UPSTREAM));
        assert_eq!((r.seq, r.count, r.window, r.gen), (5, 1, 64, 9));
        let w = UpstreamWaitPayload::parse(h.payload()).unwrap();
        let want = UpstreamWaitPayload {
            spine_ip: [198, 19, 255, 2],
            spine_port: 48879,
            tree: 1,
            silent_ms: 4200,
            session: SpineSessionState::Refused(SpineRefusal::Nack(NackReason::BadSecret)),
        };
        assert_eq!(w, want);
        assert_eq!(&h.payload()[UPSTREAM_WAIT_LEN..], &[0, 3]);
        let mut buf = [0u8; 40];
        r.emit_to(&mut buf).unwrap();
        want.emit(&mut buf[HEADER_LEN..]).unwrap();
        buf[38..].copy_from_slice(&3u16.to_be_bytes());
        // Every state survives the round trip.
        for st in [
            SpineSessionState::Joined,
            SpineSessionState::Joining,
            SpineSessionState::Refused(SpineRefusal::ElemsDiffer { spine: 362 }),
            SpineSessionState::Refused(SpineRefusal::AuthDiffers),
            SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine: 0 }),
            SpineSessionState::Refused(SpineRefusal::StatsDiffer { spine: 1 }),
        ] {
            let mut b = [0u8; UPSTREAM_WAIT_LEN];
            UpstreamWaitPayload {
                session: st,
                ..want
            }
            .emit(&mut b)
            .unwrap();
            assert_eq!(UpstreamWaitPayload::parse(&b).unwrap().session, st);
        }
        assert_eq!(buf, UPSTREAM_WAIT_FIXTURE);
        // Without its spine block, the length is wrong.
        let mut short = UPSTREAM_WAIT_FIXTURE;
        short[7] = 7;
        let h = Header::new_checked(&short[..]).unwrap();
        assert!(matches!(
            HeaderRepr::parse(&h),
            Err(WireError::PayloadLength {
                what: "16 + count × 2",
                ..
            })
        ));
        assert!(UpstreamWaitPayload::parse(&[0; 15]).is_err());
    }
}
