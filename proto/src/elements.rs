//! Elements on the wire: the float32 payload codec, widening bf16/f16
//! payloads to the float32 a slot sums in, and rounding a finished float32
//! sum once to the job's dtype.
//!
//! Owns: [`write_f32s`] and [`read_f32s`] (float32 values to and from
//! little-endian payload bytes; `wire` re-exports them under their old
//! paths), [`read_le`] (widen a payload, for rank 0 and parked
//! contributions), [`add_le`] (widen and fold a payload into a sum),
//! [`round_to_le`] (the one rounding of a completed sum into payload bytes)
//! and [`round_f32`] (the same rounding, kept in float32, for references).
//!
//! Layering: below the wire format; it names only [`crate::dtype`] and
//! [`crate::simd`].
//!
//! Invariants:
//! * Widening is exact: every bf16 and f16 value, infinity included, is a
//!   float32 value, so a contribution enters the sum unchanged; a NaN widens
//!   to a NaN (a bf16 one keeps its bits, the float32 addition quiets it).
//! * Rounding is to nearest, ties to even (the `half` crate's conversion),
//!   done once per completed slot, so a result depends only on the inputs in
//!   rank order, never on arrival order.
//! * [`add_le`] on a payload equals [`read_le`] into a scratch then
//!   element-wise float32 addition in index order; the engine folds parked
//!   contributions with that addition, so both paths give the same bits.
//! * Float32 payloads are only copied here ([`write_f32s`], [`read_f32s`]);
//!   their kernels are [`crate::simd`]. Each half-precision function
//!   handles `min(out.len(), bytes.len() / 2)` elements; none panics.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::dtype::Dtype;

/// Elements widened per step of [`add_le`] (a stack scratch, no allocation).
const STEP: usize = 256;

fn u16s(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// Widens little-endian `dtype` elements of `bytes` into `out`.
pub fn read_le(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::F32 => crate::simd::read_le_f32(bytes, out),
        Dtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(u16s(bytes)) {
                // A bf16 is the high half of the float32 with the same value.
                *o = f32::from_bits(u32::from(b) << 16);
            }
        }
        Dtype::F16 => {
            let mut tmp = [f16::ZERO; STEP];
            for (o, b) in out.chunks_mut(STEP).zip(bytes.chunks(STEP * 2)) {
                let n = o.len().min(b.len() / 2);
                for (t, v) in tmp.iter_mut().zip(u16s(&b[..n * 2])) {
                    *t = f16::from_bits(v);
                }
                tmp[..n].convert_to_f32_slice(&mut o[..n]);
            }
        }
    }
}

/// `acc[i] += widen(bytes element i)`, in float32, index order.
pub fn add_le(dtype: Dtype, acc: &mut [f32], bytes: &[u8]) {
    if dtype == Dtype::F32 {
        return crate::simd::add_le_f32(acc, bytes);
    }
    let mut tmp = [0f32; STEP];
    let size = dtype.size();
    for (a, b) in acc.chunks_mut(STEP).zip(bytes.chunks(STEP * size)) {
        let n = a.len().min(b.len() / size);
        read_le(dtype, &b[..n * size], &mut tmp[..n]);
        crate::simd::add_f32(&mut a[..n], &tmp[..n]);
    }
}

/// Rounds `sum` once to `dtype` (nearest, ties to even) and writes it into
/// `out` as little-endian elements; returns the bytes written.
pub fn round_to_le(dtype: Dtype, sum: &[f32], out: &mut [u8]) -> usize {
    let size = dtype.size();
    let n = sum.len().min(out.len() / size);
    match dtype {
        Dtype::F32 => return write_f32s(&sum[..n], out),
        Dtype::Bf16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(&sum[..n]) {
                o.copy_from_slice(&bf16_bits(*v).to_le_bytes());
            }
        }
        Dtype::F16 => {
            let mut tmp = [f16::ZERO; STEP];
            for (o, s) in out[..n * 2].chunks_mut(STEP * 2).zip(sum[..n].chunks(STEP)) {
                let t = &mut tmp[..s.len()];
                t.convert_from_f32_slice(s);
                for (ob, v) in o.chunks_exact_mut(2).zip(t.iter()) {
                    ob.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
        }
    }
    n * size
}

/// A reduce-scatter owner's output element-wise: `partial` (the other
/// ranks' sum, as the RESULT carries it) plus `own` (its kept values),
/// widened, added in float32 and rounded once to `dtype` into `out`
/// (docs/PROTOCOL.md, "Collective kinds"). Float32 is one addition. Handles
/// as many elements as the shortest of the three holds; returns the bytes
/// written.
pub fn add_own_le(dtype: Dtype, partial: &[u8], own: &[u8], out: &mut [u8]) -> usize {
    let size = dtype.size();
    let n = (partial.len().min(own.len()).min(out.len())) / size;
    let mut tmp = [0f32; STEP];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(STEP);
        let (a, b) = (done * size, (done + k) * size);
        read_le(dtype, &partial[a..b], &mut tmp[..k]);
        add_le(dtype, &mut tmp[..k], &own[a..b]);
        round_to_le(dtype, &tmp[..k], &mut out[a..b]);
        done += k;
    }
    n * size
}

/// `v` rounded to bf16, nearest even: the bits `half::bf16::from_f32`
/// gives, without its branches, so that the loop over a chunk vectorises.
#[inline]
fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    // Adding just under half an ulp, plus the kept lsb, rounds ties to even;
    // a carry into the exponent is the right overflow (to infinity).
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    // NaN keeps its sign and high payload, made quiet.
    let nan = (x >> 16) | 0x40;
    let is_nan = x & 0x7fff_ffff > 0x7f80_0000;
    (if is_nan { nan } else { rounded }) as u16
}

/// `v` rounded to `dtype` and widened back: the value a RESULT carries.
pub fn round_f32(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::F32 => v,
        Dtype::Bf16 => bf16::from_f32(v).to_f32(),
        Dtype::F16 => f16::from_f32(v).to_f32(),
    }
}

/// Writes `values` as little-endian float32 into `out`; returns bytes written.
/// `out` must hold `values.len() * 4` bytes (it is truncated otherwise).
pub fn write_f32s(values: &[f32], out: &mut [u8]) -> usize {
    let n = values.len().min(out.len() / 4);
    // The f32 side is cast (always aligned); payload bytes may not be.
    out[..n * 4].copy_from_slice(bytemuck::cast_slice(&values[..n]));
    n * 4
}

/// Reads little-endian float32 from `bytes` into `out` (as many as fit).
pub fn read_f32s(bytes: &[u8], out: &mut [f32]) -> usize {
    let n = out.len().min(bytes.len() / 4);
    bytemuck::cast_slice_mut::<f32, u8>(&mut out[..n]).copy_from_slice(&bytes[..n * 4]);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(bits: &[u16]) -> Vec<u8> {
        bits.iter().flat_map(|b| b.to_le_bytes()).collect()
    }

    #[test]
    fn widening_is_exact_for_every_half_value() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let bytes = le(&all);
        let mut out = vec![0f32; all.len()];
        read_le(Dtype::Bf16, &bytes, &mut out);
        for (b, v) in all.iter().zip(&out) {
            let want = bf16::from_bits(*b).to_f32();
            // A NaN stays a NaN (the first addition quiets a signalling one).
            assert!(
                v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()),
                "bf16 {b:#06x}: {v} vs {want}"
            );
        }
        read_le(Dtype::F16, &bytes, &mut out);
        for (b, v) in all.iter().zip(&out) {
            let want = f16::from_bits(*b).to_f32();
            assert!(
                v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()),
                "f16 {b:#06x}: {v} vs {want}"
            );
        }
    }

    #[test]
    fn add_equals_widen_then_add() {
        // Odd lengths cross the scratch boundary.
        let bits: Vec<u16> = (0..700u32).map(|i| (i * 97 + 0x3c00) as u16).collect();
        let bytes = le(&bits);
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let mut acc: Vec<f32> = (0..700).map(|i| i as f32 * 0.37 - 50.0).collect();
            let mut want = acc.clone();
            let mut w = vec![0f32; 700];
            read_le(dtype, &bytes, &mut w);
            for (a, v) in want.iter_mut().zip(&w) {
                *a += v;
            }
            add_le(dtype, &mut acc, &bytes);
            let a: Vec<u32> = acc.iter().map(|v| v.to_bits()).collect();
            let b: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(a, b, "{dtype}");
        }
    }

    #[test]
    fn branchless_bf16_rounding_is_halfs() {
        // Every sign, exponent and high mantissa, with the low halves where
        // rounding decides (below, at and above the tie, either lsb).
        let lows = [
            0u32, 1, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xffff,
        ];
        for high in 0..=u16::MAX as u32 {
            for low in lows {
                let v = f32::from_bits(high << 16 | low);
                assert_eq!(
                    bf16_bits(v),
                    bf16::from_f32(v).to_bits(),
                    "{:#010x}",
                    v.to_bits()
                );
            }
        }
    }

    #[test]
    fn rounding_is_nearest_even_once() {
        // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7):
        // ties go to the even mantissa, 1.
        let halfway = 1.0 + 2f32.powi(-8);
        let mut out = [0u8; 2];
        assert_eq!(round_to_le(Dtype::Bf16, &[halfway], &mut out), 2);
        assert_eq!(u16::from_le_bytes(out), 0x3f80);
        // Just above halfway rounds up.
        round_to_le(Dtype::Bf16, &[halfway + 2f32.powi(-20)], &mut out);
        assert_eq!(u16::from_le_bytes(out), 0x3f81);
        // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        round_to_le(Dtype::F16, &[1.0 + 2f32.powi(-11)], &mut out);
        assert_eq!(u16::from_le_bytes(out), 0x3c00);
        // Overflow of the f16 range is infinity; NaN stays NaN.
        round_to_le(Dtype::F16, &[70000.0], &mut out);
        assert_eq!(u16::from_le_bytes(out), 0x7c00);
        round_to_le(Dtype::Bf16, &[f32::NAN], &mut out);
        assert!(bf16::from_bits(u16::from_le_bytes(out)).is_nan());
        assert_eq!(round_f32(Dtype::Bf16, halfway), 1.0);
    }

    #[test]
    fn an_owners_kept_values_are_added_to_the_partial_and_rounded_once() {
        // More than one STEP of elements, so the blocks join up.
        let n = STEP * 2 + 3;
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let size = dtype.size();
            let value = |i: usize, salt: f32| (i as f32 * 0.37 + salt).sin() * 3.0;
            let enc = |salt: f32| {
                let v: Vec<f32> = (0..n).map(|i| value(i, salt)).collect();
                let mut b = vec![0u8; n * size];
                round_to_le(dtype, &v, &mut b);
                b
            };
            let (partial, own) = (enc(0.5), enc(1.25));
            let mut out = vec![0u8; n * size];
            assert_eq!(add_own_le(dtype, &partial, &own, &mut out), n * size);
            let (mut p, mut o, mut got) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            read_le(dtype, &partial, &mut p);
            read_le(dtype, &own, &mut o);
            read_le(dtype, &out, &mut got);
            for i in 0..n {
                let want = round_f32(dtype, p[i] + o[i]);
                assert_eq!(got[i].to_bits(), want.to_bits(), "{dtype:?} element {i}");
            }
        }
        // 1 + (2^-8 + 2^-9) in bf16: the float32 sum rounds once, up.
        let bits = |v: f32| bf16::from_f32(v).to_bits().to_le_bytes();
        let mut out = [0u8; 2];
        add_own_le(
            Dtype::Bf16,
            &bits(1.0),
            &bits(2f32.powi(-8) + 2f32.powi(-9)),
            &mut out,
        );
        assert_eq!(u16::from_le_bytes(out), 0x3f81);
        // Short buffers: the shortest decides, nothing panics.
        assert_eq!(add_own_le(Dtype::F32, &[0; 8], &[0; 4], &mut [0; 8]), 4);
    }
}
