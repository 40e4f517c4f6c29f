//! Vectorised float32 kernels of the switch's data path.
//!
//! Owns: [`add_le_f32`] (fold one DATA payload, little-endian f32 bytes, into
//! a slot's sum), [`read_le_f32`] (copy a payload into floats, for rank 0 and
//! parked contributions) and [`add_f32`] (fold a parked contribution), the
//! choice of instruction set for them, made once per process, and
//! [`Backend`], which runs one given instruction set (for tests and benches).
//!
//! Each kernel handles `n = min(acc.len(), bytes.len() / 4)` elements (for
//! [`add_f32`], the shorter of the two slices), leaves the rest of
//! `acc`/`out` alone and never panics.
//!
//! Invariants:
//! * Bit-identical to the scalar loop (module [`scalar`]): element-wise
//!   IEEE-754 single-precision addition is the same operation one lane or
//!   eight at a time (nothing reassociated, no FMA, the same MXCSR/FPCR, so
//!   the same rounding and subnormal handling). The tests compare `to_bits()`
//!   against the scalar loop for every backend this CPU has: infinities,
//!   subnormals, −0.0 and NaN payloads included.
//! * One exception, which no implementation can close: when *both* operands
//!   of an addition are NaN, IEEE-754 and Rust leave open which payload the
//!   result carries (either input's, quieted), and LLVM treats `fadd` as
//!   commutative. The scalar loop itself differs with where it is inlined
//!   (measured: the same loop returned the first operand's NaN as the SSE2
//!   tail and the second's as the test's reference). The kernels return one
//!   of the two quieted inputs, as the scalar loop does.
//! * [`add_f32`] is [`add_le_f32`] run on the bytes of `src` (little-endian
//!   targets), and the kernels are never inlined, so a value folded in order
//!   (from the payload) and one folded after being parked (from floats) go
//!   through the same machine code: the engine's sums stay bit-identical
//!   whatever the arrival order, even for NaN + NaN.
//!
//! Dispatch: x86_64 uses AVX2 (8 lanes) when `is_x86_feature_detected!`
//! says so and SSE2 (4 lanes, part of the x86_64 baseline) otherwise;
//! little-endian aarch64 with NEON (the baseline of its Linux targets) uses
//! NEON; anything else runs the scalar loop. The choice is detected on first
//! use and cached in an [`AtomicU8`], so the hot path costs one relaxed load
//! and a predictable branch. Loads and stores are unaligned: payloads sit at
//! whatever offset the frame gives them.
//!
//! Why hand-written `std::arch`: the kernels are two short loops per
//! instruction set, and the alternatives cost more than they save.
//! `std::simd` is nightly-only (this workspace builds on stable). `wide`
//! picks its implementation from compile-time target features, so the
//! generic x86_64 build the switch ships as would get SSE2 and never AVX2.
//! `pulp` and `multiversion` do runtime dispatch, but bring a dependency
//! (and for `multiversion` a proc macro) for two loops with one add each.
//! LLVM auto-vectorises the scalar loop, but only for the baseline (SSE2)
//! unless built with `-C target-cpu`, which a binary meant for any x86_64
//! box cannot set. `std::arch` needs no dependency and keeps the instruction
//! choice explicit.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};

/// The scalar loops: the reference every vector kernel must equal bit for
/// bit (NaN + NaN aside, see the module invariants), and the fallback on
/// targets without a vector kernel.
pub mod scalar {
    /// `acc[i] += f32::from_le_bytes(bytes[4i..4i + 4])`, one element at a time.
    #[inline]
    pub fn add_le_f32(acc: &mut [f32], bytes: &[u8]) {
        for (a, b) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
            *a += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    /// `out[i] = f32::from_le_bytes(bytes[4i..4i + 4])`, one element at a time.
    #[inline]
    pub fn read_le_f32(bytes: &[u8], out: &mut [f32]) {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    /// `acc[i] += src[i]`, one element at a time.
    #[inline]
    pub fn add_f32(acc: &mut [f32], src: &[f32]) {
        for (a, s) in acc.iter_mut().zip(src) {
            *a += *s;
        }
    }
}

/// `acc[i] += f32::from_le_bytes(bytes[4i..4i + 4])` for
/// `i < min(acc.len(), bytes.len() / 4)`; the rest of `acc` is left alone.
#[inline]
pub fn add_le_f32(acc: &mut [f32], bytes: &[u8]) {
    Backend::detected().add_le_f32(acc, bytes)
}

/// `out[i] = f32::from_le_bytes(bytes[4i..4i + 4])` for
/// `i < min(out.len(), bytes.len() / 4)`; the rest of `out` is left alone.
#[inline]
pub fn read_le_f32(bytes: &[u8], out: &mut [f32]) {
    Backend::detected().read_le_f32(bytes, out)
}

/// `acc[i] += src[i]` for `i < min(acc.len(), src.len())`.
#[inline]
pub fn add_f32(acc: &mut [f32], src: &[f32]) {
    Backend::detected().add_f32(acc, src)
}

/// An instruction set this CPU has. Only [`Backend::detected`],
/// [`Backend::scalar`] and [`Backend::available`] make one, so holding a
/// `Backend` proves its instructions may run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend(Level);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Scalar,
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    Sse2,
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    Avx2,
    #[cfg(all(
        target_arch = "aarch64",
        target_endian = "little",
        target_feature = "neon"
    ))]
    Neon,
}

/// The detected [`Level`] + 1; 0 until the first call.
static DETECTED: AtomicU8 = AtomicU8::new(0);

impl Level {
    const fn code(self) -> u8 {
        match self {
            Level::Scalar => 1,
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Sse2 => 2,
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Avx2 => 3,
            #[cfg(all(
                target_arch = "aarch64",
                target_endian = "little",
                target_feature = "neon"
            ))]
            Level::Neon => 4,
        }
    }

    /// The best level this CPU runs.
    fn detect() -> Level {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                Level::Avx2
            } else {
                Level::Sse2
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_endian = "little",
            target_feature = "neon"
        ))]
        {
            Level::Neon
        }
        #[cfg(not(any(
            all(target_arch = "x86_64", target_feature = "sse2"),
            all(
                target_arch = "aarch64",
                target_endian = "little",
                target_feature = "neon"
            )
        )))]
        {
            Level::Scalar
        }
    }
}

impl Backend {
    /// The best instruction set of this CPU, detected on the first call.
    #[inline]
    pub fn detected() -> Backend {
        let code = DETECTED.load(Ordering::Relaxed);
        // Only `detect_and_cache` stores a code, and only `Level::detect`'s.
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        if code == Level::Avx2.code() {
            return Backend(Level::Avx2);
        } else if code == Level::Sse2.code() {
            return Backend(Level::Sse2);
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_endian = "little",
            target_feature = "neon"
        ))]
        if code == Level::Neon.code() {
            return Backend(Level::Neon);
        }
        if code == Level::Scalar.code() {
            return Backend(Level::Scalar);
        }
        Backend::detect_and_cache()
    }

    #[cold]
    #[inline(never)]
    fn detect_and_cache() -> Backend {
        let level = Level::detect();
        // Racing first calls store the same value; Relaxed is enough.
        DETECTED.store(level.code(), Ordering::Relaxed);
        Backend(level)
    }

    /// The scalar loops.
    pub fn scalar() -> Backend {
        Backend(Level::Scalar)
    }

    /// Every instruction set this CPU runs, scalar first.
    pub fn available() -> Vec<Backend> {
        #[allow(unused_mut)]
        let mut v = vec![Backend(Level::Scalar)];
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        {
            v.push(Backend(Level::Sse2));
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Backend(Level::Avx2));
            }
        }
        #[cfg(all(
            target_arch = "aarch64",
            target_endian = "little",
            target_feature = "neon"
        ))]
        v.push(Backend(Level::Neon));
        v
    }

    /// "scalar", "sse2", "avx2" or "neon".
    pub fn name(self) -> &'static str {
        match self.0 {
            Level::Scalar => "scalar",
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Sse2 => "sse2",
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Avx2 => "avx2",
            #[cfg(all(
                target_arch = "aarch64",
                target_endian = "little",
                target_feature = "neon"
            ))]
            Level::Neon => "neon",
        }
    }

    /// [`add_le_f32`] with this instruction set.
    #[inline]
    pub fn add_le_f32(self, acc: &mut [f32], bytes: &[u8]) {
        match self.0 {
            Level::Scalar => scalar_add_le_f32(acc, bytes),
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Sse2 => x86::add_le_f32_sse2(acc, bytes),
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            // SAFETY: a Backend(Level::Avx2) is only made after
            // is_x86_feature_detected!("avx2") returned true on this CPU.
            Level::Avx2 => unsafe { x86::add_le_f32_avx2(acc, bytes) },
            #[cfg(all(
                target_arch = "aarch64",
                target_endian = "little",
                target_feature = "neon"
            ))]
            Level::Neon => neon::add_le_f32(acc, bytes),
        }
    }

    /// [`read_le_f32`] with this instruction set.
    #[inline]
    pub fn read_le_f32(self, bytes: &[u8], out: &mut [f32]) {
        match self.0 {
            Level::Scalar => scalar_read_le_f32(bytes, out),
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            Level::Sse2 => x86::read_le_f32_sse2(bytes, out),
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            // SAFETY: a Backend(Level::Avx2) is only made after
            // is_x86_feature_detected!("avx2") returned true on this CPU.
            Level::Avx2 => unsafe { x86::read_le_f32_avx2(bytes, out) },
            #[cfg(all(
                target_arch = "aarch64",
                target_endian = "little",
                target_feature = "neon"
            ))]
            Level::Neon => neon::read_le_f32(bytes, out),
        }
    }

    /// [`add_f32`] with this instruction set: [`Backend::add_le_f32`] on
    /// the bytes of `src`, so both fold a value with the same code.
    #[inline]
    pub fn add_f32(self, acc: &mut [f32], src: &[f32]) {
        #[cfg(target_endian = "little")]
        {
            self.add_le_f32(acc, f32_bytes(src))
        }
        #[cfg(not(target_endian = "little"))]
        {
            let _ = self;
            scalar_add_f32(acc, src)
        }
    }
}

/// The bytes of `v` in memory order: its little-endian encoding on a
/// little-endian target.
#[cfg(target_endian = "little")]
#[inline]
fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

// The scalar loops behind `Level::Scalar` and the AVX2 tails, never
// inlined: one copy of the code per kernel (see the module invariants).
#[inline(never)]
fn scalar_add_le_f32(acc: &mut [f32], bytes: &[u8]) {
    scalar::add_le_f32(acc, bytes)
}

#[inline(never)]
fn scalar_read_le_f32(bytes: &[u8], out: &mut [f32]) {
    scalar::read_le_f32(bytes, out)
}

#[cfg(not(target_endian = "little"))]
#[inline(never)]
fn scalar_add_f32(acc: &mut [f32], src: &[f32]) {
    scalar::add_f32(acc, src)
}

/// x86_64 kernels. x86_64 is little-endian, so LE bytes are f32 in memory
/// order and an unaligned f32 load of the bytes is `from_le_bytes`.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod x86 {
    use super::scalar;
    use std::arch::x86_64::*;

    // Every kernel: n elements in bounds, vectors over [0, n - n % LANES),
    // the scalar loop over the tail. Written acc + incoming, as the scalar
    // `*a += b` (the compiler may swap the operands of either: only a
    // NaN + NaN shows it, see the module invariants).

    /// 8 lanes.
    #[target_feature(enable = "avx2")]
    #[inline(never)]
    pub(super) fn add_le_f32_avx2(acc: &mut [f32], bytes: &[u8]) {
        let n = acc.len().min(bytes.len() / 4);
        let v = n - n % 8;
        let (a, b) = (acc.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 8 <= v <= n, so acc[i..i + 8] and
            // bytes[4i..4i + 32] are in bounds (n <= acc.len(),
            // 4n <= bytes.len()); loadu/storeu accept any alignment; acc and
            // bytes are a &mut and a & borrow, so they do not overlap; AVX is
            // enabled on this function.
            unsafe {
                let x = _mm256_loadu_ps(a.add(i));
                let y = _mm256_loadu_ps(b.add(4 * i).cast::<f32>());
                _mm256_storeu_ps(a.add(i), _mm256_add_ps(x, y));
            }
            i += 8;
        }
        // Out of line: inlined here, LLVM turns the tail into masked AVX
        // loads/stores, which measured ~10% slower at 362 floats.
        super::scalar_add_le_f32(&mut acc[v..n], &bytes[4 * v..4 * n]);
    }

    /// 8 lanes.
    #[target_feature(enable = "avx2")]
    #[inline(never)]
    pub(super) fn read_le_f32_avx2(bytes: &[u8], out: &mut [f32]) {
        let n = out.len().min(bytes.len() / 4);
        let v = n - n % 8;
        let (o, b) = (out.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 8 <= v <= n: out[i..i + 8] and bytes[4i..4i + 32]
            // are in bounds; unaligned loads/stores; no overlap (& and &mut);
            // AVX is enabled on this function.
            unsafe {
                let y = _mm256_loadu_ps(b.add(4 * i).cast::<f32>());
                _mm256_storeu_ps(o.add(i), y);
            }
            i += 8;
        }
        super::scalar_read_le_f32(&bytes[4 * v..4 * n], &mut out[v..n]);
    }

    /// 4 lanes; SSE2 is part of every x86_64 (checked by the module's cfg).
    #[inline(never)]
    pub(super) fn add_le_f32_sse2(acc: &mut [f32], bytes: &[u8]) {
        let n = acc.len().min(bytes.len() / 4);
        let v = n - n % 4;
        let (a, b) = (acc.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 4 <= v <= n: acc[i..i + 4] and bytes[4i..4i + 16]
            // are in bounds; loadu/storeu accept any alignment; no overlap
            // (& and &mut); SSE2 is enabled for the whole crate (cfg).
            unsafe {
                let x = _mm_loadu_ps(a.add(i));
                let y = _mm_loadu_ps(b.add(4 * i).cast::<f32>());
                _mm_storeu_ps(a.add(i), _mm_add_ps(x, y));
            }
            i += 4;
        }
        scalar::add_le_f32(&mut acc[v..n], &bytes[4 * v..4 * n]);
    }

    /// 4 lanes.
    #[inline(never)]
    pub(super) fn read_le_f32_sse2(bytes: &[u8], out: &mut [f32]) {
        let n = out.len().min(bytes.len() / 4);
        let v = n - n % 4;
        let (o, b) = (out.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 4 <= v <= n: in bounds; unaligned loads/stores; no
            // overlap; SSE2 is enabled for the whole crate.
            unsafe {
                let y = _mm_loadu_ps(b.add(4 * i).cast::<f32>());
                _mm_storeu_ps(o.add(i), y);
            }
            i += 4;
        }
        scalar::read_le_f32(&bytes[4 * v..4 * n], &mut out[v..n]);
    }
}

/// Little-endian aarch64 kernels, 4 lanes. NEON is enabled for the whole
/// crate (the module's cfg), so no runtime check is needed. The bytes are
/// loaded as u8 vectors (no alignment requirement) and reinterpreted.
#[cfg(all(
    target_arch = "aarch64",
    target_endian = "little",
    target_feature = "neon"
))]
mod neon {
    use super::scalar;
    use std::arch::aarch64::*;

    #[inline(never)]
    pub(super) fn add_le_f32(acc: &mut [f32], bytes: &[u8]) {
        let n = acc.len().min(bytes.len() / 4);
        let v = n - n % 4;
        let (a, b) = (acc.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 4 <= v <= n: acc[i..i + 4] and bytes[4i..4i + 16]
            // are in bounds; vld1q/vst1q on f32 and u8 pointers need only
            // element alignment, which &[f32] and &[u8] have; no overlap
            // (& and &mut); NEON is enabled for the whole crate (cfg).
            unsafe {
                let x = vld1q_f32(a.add(i));
                let y = vreinterpretq_f32_u8(vld1q_u8(b.add(4 * i)));
                vst1q_f32(a.add(i), vaddq_f32(x, y));
            }
            i += 4;
        }
        scalar::add_le_f32(&mut acc[v..n], &bytes[4 * v..4 * n]);
    }

    #[inline(never)]
    pub(super) fn read_le_f32(bytes: &[u8], out: &mut [f32]) {
        let n = out.len().min(bytes.len() / 4);
        let v = n - n % 4;
        let (o, b) = (out.as_mut_ptr(), bytes.as_ptr());
        let mut i = 0;
        while i < v {
            // SAFETY: i + 4 <= v <= n: in bounds; element-aligned pointers;
            // no overlap; NEON is enabled for the whole crate.
            unsafe {
                let y = vreinterpretq_f32_u8(vld1q_u8(b.add(4 * i)));
                vst1q_f32(o.add(i), y);
            }
            i += 4;
        }
        scalar::read_le_f32(&bytes[4 * v..4 * n], &mut out[v..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit patterns where IEEE-754 addition has edge cases.
    const SPECIAL: [u32; 24] = [
        0x0000_0000, // +0
        0x8000_0000, // -0
        0x7f80_0000, // +inf
        0xff80_0000, // -inf
        0x7fc0_0000, // quiet NaN
        0xffc0_0000, // negative quiet NaN
        0x7fc1_2345, // quiet NaN with payload
        0xffd5_5555, // negative quiet NaN with payload
        0x7f80_0001, // signalling NaN
        0x7fa0_beef, // signalling NaN with payload
        0xff80_0042, // negative signalling NaN
        0x0000_0001, // smallest subnormal
        0x8000_0001, // -smallest subnormal
        0x007f_ffff, // largest subnormal
        0x807f_ffff, // -largest subnormal
        0x0080_0000, // smallest normal
        0x8080_0000, // -smallest normal
        0x7f7f_ffff, // f32::MAX
        0xff7f_ffff, // f32::MIN
        0x3f80_0000, // 1.0
        0xbf80_0000, // -1.0
        0x3400_0000, // 2^-23: 1.0 + this rounds
        0x3380_0000, // 2^-24: a tie at 1.0
        0x4b80_0000, // 2^24
    ];

    /// The reference: the engine's loop, one element at a time.
    fn reference_add(acc: &mut [f32], bytes: &[u8]) {
        let n = acc.len().min(bytes.len() / 4);
        for i in 0..n {
            let b = &bytes[4 * i..4 * i + 4];
            acc[i] += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn le_bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn floats(v: &[u32]) -> Vec<f32> {
        v.iter().map(|x| f32::from_bits(*x)).collect()
    }

    fn is_nan(x: u32) -> bool {
        f32::from_bits(x).is_nan()
    }

    fn quiet(x: u32) -> u32 {
        x | 0x0040_0000
    }

    /// `got` equals the scalar `want` bit for bit, except that where both
    /// addends are NaN it may carry either one's payload, quieted.
    fn assert_sums(name: &str, acc: &[u32], src: &[u32], got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in bits(got).into_iter().zip(bits(want)).enumerate() {
            let both_nan = i < src.len() && is_nan(acc[i]) && is_nan(src[i]);
            if both_nan {
                assert!(
                    g == quiet(acc[i]) || g == quiet(src[i]),
                    "{name}: lane {i}: {:#x} + {:#x} gave {g:#x}",
                    acc[i],
                    src[i]
                );
            } else {
                assert_eq!(
                    g,
                    w,
                    "{name}: lane {i}: {:#x} + {:?} gave {g:#x}, scalar {w:#x}",
                    acc[i],
                    src.get(i)
                );
            }
        }
    }

    /// Runs the kernels of every backend (and the dispatched ones) on `acc`
    /// and `src` (at byte offset `shift`, so that loads are misaligned) and
    /// checks them against the scalar reference, lanes past `n` included.
    fn check_all(acc: &[u32], src: &[u32], shift: usize) {
        let mut raw = vec![0xa5u8; shift];
        raw.extend(le_bytes(src));
        let bytes = &raw[shift..];
        let acc_f = floats(acc);
        let src_f = floats(src);

        let mut want_add = acc_f.clone();
        reference_add(&mut want_add, bytes);
        let mut want_read = acc_f.clone();
        let n = acc.len().min(src.len());
        want_read[..n].copy_from_slice(&src_f[..n]);

        type Kernels = (
            &'static str,
            Box<dyn Fn(&mut [f32], &[u8])>,
            Box<dyn Fn(&[u8], &mut [f32])>,
            Box<dyn Fn(&mut [f32], &[f32])>,
        );
        let mut runs: Vec<Kernels> = Backend::available()
            .into_iter()
            .map(|be| -> Kernels {
                (
                    be.name(),
                    Box::new(move |a, b| be.add_le_f32(a, b)),
                    Box::new(move |b, o| be.read_le_f32(b, o)),
                    Box::new(move |a, s| be.add_f32(a, s)),
                )
            })
            .collect();
        runs.push((
            "dispatched",
            Box::new(add_le_f32),
            Box::new(read_le_f32),
            Box::new(add_f32),
        ));
        for (name, add_le, read_le, add) in runs {
            let mut summed = acc_f.clone();
            add_le(&mut summed, bytes);
            assert_sums(name, acc, src, &summed, &want_add);

            let mut got = acc_f.clone();
            read_le(bytes, &mut got);
            assert_eq!(bits(&got), bits(&want_read), "{name}: read_le_f32");

            // Folding floats must equal folding their bytes, NaN + NaN too:
            // the engine's in-order and parked paths must agree.
            let mut got = acc_f.clone();
            add(&mut got, &src_f);
            assert_eq!(bits(&got), bits(&summed), "{name}: add_f32");
        }
    }

    #[test]
    fn every_pair_of_special_values() {
        let mut acc = Vec::new();
        let mut src = Vec::new();
        for a in SPECIAL {
            for b in SPECIAL {
                acc.push(a);
                src.push(b);
            }
        }
        for shift in 0..4 {
            check_all(&acc, &src, shift);
        }
    }

    #[test]
    fn every_short_length_and_offset() {
        // Every tail length of every vector width, at every byte offset.
        for len in 0..=40usize {
            let acc: Vec<u32> = (0..len as u32).map(|i| 0x3f80_0000 + i * 77).collect();
            let src: Vec<u32> = (0..len).map(|i| SPECIAL[i % SPECIAL.len()]).collect();
            for shift in 0..4 {
                check_all(&acc, &src, shift);
                check_all(&acc[..len / 2], &src, shift);
                check_all(&acc, &src[..len / 2], shift);
            }
        }
    }

    #[test]
    fn a_partial_float_at_the_end_is_ignored() {
        let mut acc = [1.0f32; 3];
        add_le_f32(&mut acc, &[0, 0, 0x80, 0x3f, 0, 0, 0]);
        assert_eq!(acc, [2.0, 1.0, 1.0]);
        let mut out = [5.0f32; 2];
        read_le_f32(&[0, 0, 0x80, 0x3f, 0xff], &mut out);
        assert_eq!(out, [1.0, 5.0]);
    }

    #[test]
    fn detection_is_cached_and_the_best_available() {
        let d = Backend::detected();
        assert_eq!(Backend::detected(), d);
        assert_eq!(Backend::available().last(), Some(&d));
        assert_eq!(Backend::available()[0], Backend::scalar());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            d.name(),
            if std::arch::is_x86_feature_detected!("avx2") {
                "avx2"
            } else {
                "sse2"
            }
        );
    }

    /// Any bit pattern, with the special ones, subnormals and NaNs often.
    fn pattern() -> impl Strategy<Value = u32> {
        prop_oneof![
            3 => any::<u32>(),
            2 => proptest::sample::select(&SPECIAL[..]),
            1 => (any::<bool>(), 1u32..0x0080_0000).prop_map(|(s, m)| (s as u32) << 31 | m),
            1 => (any::<bool>(), 1u32..0x0080_0000)
                .prop_map(|(s, m)| (s as u32) << 31 | 0x7f80_0000 | m),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn bit_identical_to_scalar(
            acc in proptest::collection::vec(pattern(), 0..2000),
            src in proptest::collection::vec(pattern(), 0..2000),
            shift in 0usize..4,
        ) {
            // Equal lengths, as in the engine (count floats, count × 4 bytes).
            let n = acc.len().min(src.len());
            check_all(&acc[..n], &src[..n], shift);
            // And unequal ones: only the common prefix may change.
            check_all(&acc, &src, shift);
        }
    }
}
