//! The 22-byte aggregation header: [`Header`], a view over a byte buffer
//! with typed accessors, and [`HeaderRepr`], its parsed form with
//! `parse`/`emit`.
//!
//! Invariants: accessors of a [`Header`] made by [`Header::new_checked`]
//! never panic; [`HeaderRepr::parse`] accepts only what version 3 allows
//! (known type, no reserved flag bits, job ≠ 0, a payload length that
//! matches the type). All integers are big-endian.

use super::codes::{Kind, MsgType};
use super::error::WireError;
use super::flags;
use super::lengths::*;

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
        // A PROVISION may leave the id to the switch (job 0), and the
        // switch's answers to it before a job exists (a CHALLENGE, a NACK)
        // name the job the PROVISION named.
        if h.job() == 0
            && !matches!(
                msg_type,
                MsgType::Provision | MsgType::Challenge | MsgType::Nack
            )
        {
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
            MsgType::Provision => len == PROVISION_PAYLOAD_LEN,
            MsgType::Provisioned => len == PROVISIONED_PAYLOAD_LEN,
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
                MsgType::Provision => "a PROVISION payload (152 bytes)",
                MsgType::Provisioned => "a PROVISIONED payload (40 bytes)",
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
