//! Serial-number arithmetic on u32 sequence numbers (RFC 1982 style): seqs
//! wrap, and `a` is before `b` when `b − a` (mod 2³²) is below 2³¹.

/// `to − from` as a signed distance: negative when `to` is before `from`.
#[inline]
pub fn serial_offset(from: u32, to: u32) -> i64 {
    to.wrapping_sub(from) as i32 as i64
}

/// `a` comes before `b`.
#[inline]
pub fn serial_lt(a: u32, b: u32) -> bool {
    serial_offset(b, a) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert_eq!(serial_offset(u32::MAX, 1), 2);
        assert_eq!(serial_offset(1, u32::MAX), -2);
        assert!(serial_lt(u32::MAX - 3, 2));
        assert!(!serial_lt(2, u32::MAX - 3));
        assert!(!serial_lt(5, 5));
    }
}
