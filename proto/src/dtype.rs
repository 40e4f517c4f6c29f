//! The element types of a job's DATA and RESULT payloads (JOIN `dtype`).
//!
//! Owns: [`Dtype`] (float32, bfloat16, IEEE binary16: size, name, the JOIN
//! byte) and the bytes that name each on the wire ([`DTYPE_F32`],
//! [`DTYPE_BF16`], [`DTYPE_F16`]).
//!
//! It is the bottom of the crate's layers: it names nothing else of the
//! crate, so the wire format (`wire`, which re-exports all of it under its
//! old paths), the element conversions (`elements`) and the statistics
//! (`stats`) all name a dtype without naming each other.
//!
//! Invariants: a dtype's discriminant is its JOIN byte; [`Dtype::from_u8`]
//! accepts exactly those bytes, and [`Dtype::name`] is what configs, CLIs
//! and logs parse back ([`core::str::FromStr`]).

use core::fmt;

/// Data types a job may aggregate (JOIN `dtype`).
pub const DTYPE_F32: u8 = 0;
/// bfloat16, a little-endian u16 per element.
pub const DTYPE_BF16: u8 = 1;
/// IEEE binary16, a little-endian u16 per element.
pub const DTYPE_F16: u8 = 2;

/// The element type of a job's DATA and RESULT payloads. The switch sums
/// every type in float32 (half-precision values widen exactly) and rounds a
/// half-precision sum once, to nearest even, when its slot completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Dtype {
    #[default]
    F32 = DTYPE_F32,
    Bf16 = DTYPE_BF16,
    F16 = DTYPE_F16,
}

/// A dtype name that is not `f32`, `bf16` or `f16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?} (expected f32, bf16 or f16)")]
pub struct UnknownDtype(pub String);

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

    /// The dtype a JOIN's `dtype` byte names, if any.
    pub const fn from_u8(v: u8) -> Option<Dtype> {
        match v {
            DTYPE_F32 => Some(Dtype::F32),
            DTYPE_BF16 => Some(Dtype::Bf16),
            DTYPE_F16 => Some(Dtype::F16),
            _ => None,
        }
    }

    /// Bytes per element on the wire.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The name used in configs, CLIs and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// Bytes of a DATA/RESULT payload of `count` elements.
    pub const fn payload_len(self, count: u16) -> usize {
        count as usize * self.size()
    }

    /// Elements of this type in the bytes of `f32_elems` float32 elements
    /// (saturating at u16::MAX).
    pub const fn scale_f32_elems(self, f32_elems: u16) -> u16 {
        let v = f32_elems as usize * 4 / self.size();
        if v > u16::MAX as usize {
            u16::MAX
        } else {
            v as u16
        }
    }

    /// Names a JOIN's `dtype` byte for a log or an error: the type's name,
    /// or the unknown number.
    pub fn describe(v: u8) -> String {
        match Dtype::from_u8(v) {
            Some(d) => d.name().to_string(),
            None => format!("unknown dtype {v}"),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Dtype {
    type Err = UnknownDtype;
    fn from_str(s: &str) -> Result<Dtype, UnknownDtype> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDtype(s.to_string()))
    }
}
