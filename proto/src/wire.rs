//! Wire format of the aggregation protocol, version 1 (PROTOCOL.md).
//!
//! Owns: the 22-byte aggregation header as a view over a byte buffer
//! ([`Header`]), its high-level form ([`HeaderRepr`]) with `parse`/`emit`,
//! and the payloads of JOIN, JOIN_ACK and NACK.
//!
//! Invariants: accessors of a [`Header`] made by [`Header::new_checked`] never
//! panic; [`HeaderRepr::parse`] accepts only what version 1 allows (known type,
//! no reserved flag bits, job ≠ 0, a payload length that matches the type), so
//! everything after it may trust the fields. All integers are big-endian;
//! float32 payloads are little-endian IEEE-754.

use core::fmt;

/// Protocol version carried in the high nibble of `ver_type`.
pub const VERSION: u8 = 1;
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
/// Length of a JOIN payload: n_workers, dtype, op, secret.
pub const JOIN_PAYLOAD_LEN: usize = 4 + SECRET_LEN;
/// Length of a JOIN_ACK payload: pool_slots, elems_per_chunk, n_workers.
pub const JOIN_ACK_PAYLOAD_LEN: usize = 6;
/// Length of a NACK payload: one u16 reason.
pub const NACK_PAYLOAD_LEN: usize = 2;
/// Largest `count` a DATA frame may carry at a 9000-byte MTU.
pub const MAX_ELEMS_PER_CHUNK: u16 = elems_per_chunk_for_mtu(9000);

/// Elements per chunk for a port MTU: (MTU − 20 − 8 − 22) / 4 (362 at 1500).
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
    /// Every bit version 1 defines; the others must be zero.
    pub const DEFINED: u8 = ECE | RETX | LAST;
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
            _ => return None,
        })
    }
}

/// Data types a job may aggregate (JOIN `dtype`).
pub const DTYPE_F32: u8 = 0;
/// Reduction operations (JOIN `op`).
pub const OP_SUM: u8 = 0;

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
            NackReason::BadSecret => "bad secret (check --secret against the job's secret)",
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
        })
    }
}

/// Why bytes are not a valid version-1 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: {len} bytes, need at least {need}")]
    Truncated { len: usize, need: usize },
    #[error("unsupported protocol version {0} (this build speaks version 1)")]
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
        let len = h.payload().len();
        let ok = match msg_type {
            MsgType::Data | MsgType::Result => len == h.count() as usize * 4 && h.count() > 0,
            MsgType::Join => len == JOIN_PAYLOAD_LEN,
            MsgType::JoinAck => len == JOIN_ACK_PAYLOAD_LEN,
            MsgType::Nack => len == NACK_PAYLOAD_LEN,
            MsgType::Leave | MsgType::Heartbeat => true,
        };
        if !ok {
            let what = match msg_type {
                MsgType::Data | MsgType::Result => "count × 4 (count ≥ 1)",
                MsgType::Join => "a JOIN payload (36 bytes)",
                MsgType::JoinAck => "a JOIN_ACK payload (6 bytes)",
                _ => "a NACK payload (2 bytes)",
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
}

/// JOIN payload.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinPayload {
    pub n_workers: u16,
    pub dtype: u8,
    pub op: u8,
    pub secret: [u8; SECRET_LEN],
}

impl fmt::Debug for JoinPayload {
    // Secrets are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinPayload")
            .field("n_workers", &self.n_workers)
            .field("dtype", &self.dtype)
            .field("op", &self.op)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl JoinPayload {
    pub fn parse(b: &[u8]) -> Result<JoinPayload, WireError> {
        if b.len() != JOIN_PAYLOAD_LEN {
            return Err(WireError::PayloadLength {
                len: b.len(),
                what: "a JOIN payload (36 bytes)",
            });
        }
        let mut secret = [0u8; SECRET_LEN];
        secret.copy_from_slice(&b[4..]);
        Ok(JoinPayload {
            n_workers: u16::from_be_bytes([b[0], b[1]]),
            dtype: b[2],
            op: b[3],
            secret,
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, WireError> {
        if b.len() < JOIN_PAYLOAD_LEN {
            return Err(WireError::Truncated {
                len: b.len(),
                need: JOIN_PAYLOAD_LEN,
            });
        }
        b[0..2].copy_from_slice(&self.n_workers.to_be_bytes());
        b[2] = self.dtype;
        b[3] = self.op;
        b[4..JOIN_PAYLOAD_LEN].copy_from_slice(&self.secret);
        Ok(JOIN_PAYLOAD_LEN)
    }
}

/// JOIN_ACK payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAckPayload {
    pub pool_slots: u16,
    pub elems_per_chunk: u16,
    pub n_workers: u16,
}

impl JoinAckPayload {
    pub fn parse(b: &[u8]) -> Result<JoinAckPayload, WireError> {
        if b.len() != JOIN_ACK_PAYLOAD_LEN {
            return Err(WireError::PayloadLength {
                len: b.len(),
                what: "a JOIN_ACK payload (6 bytes)",
            });
        }
        Ok(JoinAckPayload {
            pool_slots: u16::from_be_bytes([b[0], b[1]]),
            elems_per_chunk: u16::from_be_bytes([b[2], b[3]]),
            n_workers: u16::from_be_bytes([b[4], b[5]]),
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
        Ok(JOIN_ACK_PAYLOAD_LEN)
    }
}

/// Parses a NACK payload.
pub fn parse_nack(b: &[u8]) -> Result<NackReason, WireError> {
    if b.len() != NACK_PAYLOAD_LEN {
        return Err(WireError::PayloadLength {
            len: b.len(),
            what: "a NACK payload (2 bytes)",
        });
    }
    let v = u16::from_be_bytes([b[0], b[1]]);
    NackReason::from_u16(v).ok_or(WireError::UnknownNackReason(v))
}

/// Writes a NACK payload.
pub fn emit_nack(reason: NackReason, b: &mut [u8]) -> Result<usize, WireError> {
    if b.len() < NACK_PAYLOAD_LEN {
        return Err(WireError::Truncated {
            len: b.len(),
            need: NACK_PAYLOAD_LEN,
        });
    }
    b[..2].copy_from_slice(&(reason as u16).to_be_bytes());
    Ok(NACK_PAYLOAD_LEN)
}

/// Writes `values` as little-endian float32 into `out`; returns bytes written.
/// `out` must hold `values.len() * 4` bytes (it is truncated otherwise).
pub fn write_f32s(values: &[f32], out: &mut [u8]) -> usize {
    let mut n = 0;
    for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
        n += 4;
    }
    n
}

/// Reads little-endian float32 from `bytes` into `out` (as many as fit).
pub fn read_f32s(bytes: &[u8], out: &mut [f32]) -> usize {
    let mut n = 0;
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
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
        0x11, 0x06, 0x00, 0x07, 0x00, 0x03, 0x00, 0x02, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
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
    fn rejects_what_version_1_forbids() {
        let mut b = DATA_FIXTURE;
        b[0] = 0x21;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::BadVersion(2)));

        let mut b = DATA_FIXTURE;
        b[0] = 0x19;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::UnknownType(9)));

        let mut b = DATA_FIXTURE;
        b[1] = 0x08;
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(HeaderRepr::parse(&h), Err(WireError::ReservedFlags(8)));

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
            secret: [0xab; 32],
        };
        let mut b = [0u8; JOIN_PAYLOAD_LEN];
        j.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 64, 0, 0]);
        assert_eq!(JoinPayload::parse(&b).unwrap(), j);
        assert!(!format!("{j:?}").contains("171"), "secret must not print");

        let a = JoinAckPayload {
            pool_slots: 256,
            elems_per_chunk: 362,
            n_workers: 4,
        };
        let mut b = [0u8; 6];
        a.emit(&mut b).unwrap();
        assert_eq!(b, [0x01, 0x00, 0x01, 0x6a, 0x00, 0x04]);
        assert_eq!(JoinAckPayload::parse(&b).unwrap(), a);
    }

    #[test]
    fn nack_round_trip() {
        let mut b = [0u8; 2];
        emit_nack(NackReason::StaleGeneration, &mut b).unwrap();
        assert_eq!(b, [0, 7]);
        assert_eq!(parse_nack(&b), Ok(NackReason::StaleGeneration));
        assert_eq!(parse_nack(&[0, 99]), Err(WireError::UnknownNackReason(99)));
    }

    #[test]
    fn elems_per_chunk_matches_protocol() {
        assert_eq!(elems_per_chunk_for_mtu(1500), 362);
        assert_eq!(FRAME_PAYLOAD_OFFSET, 64);
    }
}
