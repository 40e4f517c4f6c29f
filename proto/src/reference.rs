//! The reference all-reduce: the sum of every rank's tensor in rank order
//! (rank 0 + rank 1 + …), exactly as the switch sums a slot. Workers use it to
//! verify results bit for bit, and tests to check the switch.

/// The pattern rank `rank` contributes at `iteration`, element `index`:
/// deterministic, varied in sign and magnitude, so that rounding order shows.
pub fn pattern(rank: u16, iteration: u32, index: usize) -> f32 {
    // A cheap integer hash (splitmix-like) of the three inputs.
    let mut x =
        (index as u64) ^ ((rank as u64) << 40) ^ ((iteration as u64) << 24) ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    // Mantissa from the hash, exponent spread over a few decades, random sign.
    let m = (x & 0xffff) as f32 / 65536.0 + 0.5;
    let e = ((x >> 16) % 12) as i32 - 6;
    let s = if (x >> 32) & 1 == 1 { -1.0 } else { 1.0 };
    // 2^e built from its bits: exact, the same value as `2f32.powi(e)` for
    // -6 ≤ e ≤ 5, and without the libm call that made filling 64 MiB cost
    // more CPU than the all-reduce it feeds.
    let two_e = f32::from_bits(((e + 127) as u32) << 23);
    s * m * two_e
}

/// Fills `out` with rank `rank`'s pattern for `iteration`.
pub fn fill_pattern(rank: u16, iteration: u32, out: &mut [f32]) {
    for (i, v) in out.iter_mut().enumerate() {
        *v = pattern(rank, iteration, i);
    }
}

/// The expected result at `index`: Σ over ranks in rank order.
pub fn expected_sum(n_workers: u16, iteration: u32, index: usize) -> f32 {
    let mut s = pattern(0, iteration, index);
    for r in 1..n_workers {
        s += pattern(r, iteration, index);
    }
    s
}

/// Sums `inputs` (one slice per rank, in rank order) element-wise, rank order.
pub fn rank_order_sum(inputs: &[&[f32]]) -> Vec<f32> {
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let mut out = first.to_vec();
    for r in &inputs[1..] {
        for (o, v) in out.iter_mut().zip(r.iter()) {
            *o += *v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_matters_so_the_reference_fixes_it() {
        // Non-associativity is why a fixed order is needed at all.
        let (a, b, c) = (1e8f32, -1e8f32, 1.0f32);
        assert_ne!((a + b) + c, a + (b + c));
        assert_eq!(rank_order_sum(&[&[a], &[b], &[c]]), vec![(a + b) + c]);
    }

    #[test]
    fn pattern_scale_is_the_same_as_powi() {
        for e in -6..=5 {
            assert_eq!(
                f32::from_bits(((e + 127) as u32) << 23).to_bits(),
                2f32.powi(e).to_bits()
            );
        }
    }

    #[test]
    fn pattern_is_deterministic_and_varied() {
        assert_eq!(pattern(3, 7, 11).to_bits(), pattern(3, 7, 11).to_bits());
        let v: Vec<f32> = (0..1000).map(|i| pattern(0, 0, i)).collect();
        assert!(v.iter().any(|x| *x < 0.0) && v.iter().any(|x| *x > 0.0));
        assert!(v.iter().all(|x| x.is_finite() && *x != 0.0));
        assert_ne!(pattern(0, 0, 5), pattern(1, 0, 5));
        assert_ne!(pattern(0, 0, 5), pattern(0, 1, 5));
    }
}
