//! The Internet checksum (RFC 1071) of IPv4 headers and UDP datagrams: the
//! switch checks it on every frame it takes and writes it on every frame it
//! sends.
//!
//! Owns: [`Sum`], a ones'-complement sum in progress, and the helpers that
//! verify or build a UDP checksum from its parts.
//!
//! Invariants: a [`Sum`] holds the sum of big-endian 16-bit words, so parts
//! can be summed apart and added later (RFC 1071's associativity), which is
//! how a RESULT's payload is summed once per chunk and its per-destination
//! headers are added per frame. [`Sum::add_bytes`] takes bytes that start at
//! an even offset of the checksummed data (the caller swaps the bytes of a
//! part that starts at an odd one, [`Sum::add_folded_at`]). Nothing here
//! allocates; the byte loop reads 8-byte words and accumulates their 32-bit
//! halves into a u64, which cannot overflow below 2^32 words; on x86_64 a
//! payload-sized input runs an AVX2 build of that loop when the CPU has it
//! (the one `unsafe`: its call after the runtime check).
#![allow(unsafe_code)]

/// A ones'-complement sum of big-endian 16-bit words, not yet folded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sum(u64);

impl Sum {
    pub const ZERO: Sum = Sum(0);

    /// Adds `bytes`, which start at an even offset of the data (an odd
    /// length is padded with one zero byte, as RFC 768 pads the datagram).
    #[inline]
    pub fn add_bytes(self, bytes: &[u8]) -> Sum {
        // On a little-endian host the native sum is the wire sum byte-swapped.
        Sum(self.0 + u64::from(u16::from_be(fold_native(bytes))))
    }

    /// Adds one 16-bit word (host order value, summed as on the wire).
    #[inline]
    pub fn add_u16(self, v: u16) -> Sum {
        Sum(self.0 + u64::from(v))
    }

    /// Adds the folded sum of a part that starts `offset` bytes into the
    /// data: at an odd offset its bytes fall into the other half of each
    /// word, which swaps the sum's bytes (RFC 1071, "byte order
    /// independence").
    #[inline]
    pub fn add_folded_at(self, folded: u16, offset: usize) -> Sum {
        let v = if offset % 2 == 1 {
            folded.swap_bytes()
        } else {
            folded
        };
        self.add_u16(v)
    }

    /// The sum folded to 16 bits (end-around carries added back).
    #[inline]
    pub fn fold(self) -> u16 {
        fold64(self.0)
    }

    /// The checksum to write: the complement of the folded sum. For UDP,
    /// use [`Sum::udp_checksum`] (a zero result is sent as 0xffff).
    #[inline]
    pub fn checksum(self) -> u16 {
        !self.fold()
    }

    /// The UDP checksum field: [`Sum::checksum`], with 0 sent as 0xffff
    /// because 0 on the wire means "no checksum" (RFC 768).
    #[inline]
    pub fn udp_checksum(self) -> u16 {
        match self.checksum() {
            0 => 0xffff,
            c => c,
        }
    }

    /// Whether data whose checksum field is included in this sum verifies:
    /// its folded sum is all ones.
    #[inline]
    pub fn verifies(self) -> bool {
        self.fold() == 0xffff
    }
}

/// The sum of the IPv4 pseudo-header of a UDP datagram of `udp_len` bytes
/// (header included) from `src` to `dst`.
#[inline]
pub fn udp_pseudo_header(src: [u8; 4], dst: [u8; 4], udp_len: u16) -> Sum {
    let word = |a: [u8; 4]| {
        u64::from(u16::from_be_bytes([a[0], a[1]])) + u64::from(u16::from_be_bytes([a[2], a[3]]))
    };
    Sum(word(src) + word(dst) + 17 + u64::from(udp_len))
}

/// Whether a UDP datagram (`udp`: its header and payload, `udp.len()` its
/// length field) from `src` to `dst` carries a correct checksum or none
/// (checksum field 0, which IPv4 allows).
#[inline]
pub fn udp_verifies(src: [u8; 4], dst: [u8; 4], udp: &[u8]) -> bool {
    if udp.len() < 8 || udp.len() > usize::from(u16::MAX) {
        return false;
    }
    if udp[6] == 0 && udp[7] == 0 {
        return true;
    }
    udp_pseudo_header(src, dst, udp.len() as u16)
        .add_bytes(udp)
        .verifies()
}

/// Whether an IPv4 header (all of it, options included) carries a
/// correct header checksum.
#[inline]
pub fn ipv4_header_verifies(header: &[u8]) -> bool {
    Sum::ZERO.add_bytes(header).verifies()
}

/// The folded ones'-complement sum of `bytes` read as native-endian words
/// (so on a little-endian host, byte-swapped relative to the wire order).
/// A payload-sized input takes the AVX2 build of the same loop where the
/// CPU has it (twice the words per instruction).
#[inline]
fn fold_native(bytes: &[u8]) -> u16 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= 64 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return fold64(unsafe { sum_words_avx2(bytes) });
    }
    fold64(sum_words(bytes))
}

/// [`sum_words`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_words_avx2(bytes: &[u8]) -> u64 {
    sum_words(bytes)
}

/// The sum of `bytes` as native-endian u64 words (zero-padded at the end),
/// each added as its two 32-bit halves so that nothing carries out.
#[inline(always)]
fn sum_words(bytes: &[u8]) -> u64 {
    let mut acc = 0u64;
    let mut words = bytes.chunks_exact(8);
    for w in words.by_ref() {
        // One 8-byte load (chunks_exact: the fallback never runs).
        let v = u64::from_ne_bytes(w.try_into().unwrap_or([0; 8]));
        acc += (v & 0xffff_ffff) + (v >> 32);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        let v = u64::from_ne_bytes(last);
        acc += (v & 0xffff_ffff) + (v >> 32);
    }
    acc
}

#[inline]
fn fold64(mut v: u64) -> u16 {
    v = (v & 0xffff_ffff) + (v >> 32);
    v = (v & 0xffff_ffff) + (v >> 32);
    v = (v & 0xffff) + (v >> 16);
    v = (v & 0xffff) + (v >> 16);
    v = (v & 0xffff) + (v >> 16);
    v as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 as written: 16-bit big-endian words, carries folded.
    fn reference(bytes: &[u8]) -> u16 {
        let mut s = 0u32;
        for c in bytes.chunks(2) {
            let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
            s += u32::from(w);
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The AVX2 build and the portable loop agree, at every length and
    /// alignment around the vector widths.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_build_matches_the_portable_loop() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let b: Vec<u8> = (0..2100).map(|i| (i * 167 + 13) as u8).collect();
        for start in 0..8 {
            for len in (0..200).chain([1447, 1448, 2048, 2090]) {
                let part = &b[start..start + len];
                // SAFETY: AVX2 was detected above.
                let v = unsafe { sum_words_avx2(part) };
                assert_eq!(v, sum_words(part), "start {start} len {len}");
            }
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        let b = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(Sum::ZERO.add_bytes(&b).fold(), 0xddf2);
        assert_eq!(Sum::ZERO.add_bytes(&b).checksum(), !0xddf2);
    }

    proptest! {
        #[test]
        fn sum_matches_the_word_by_word_definition(b in proptest::collection::vec(any::<u8>(), 0..2000)) {
            prop_assert_eq!(Sum::ZERO.add_bytes(&b).fold() % 0xffff, reference(&b) % 0xffff);
        }

        #[test]
        fn parts_summed_apart_equal_the_whole(
            b in proptest::collection::vec(any::<u8>(), 0..600),
            cut in 0usize..600,
        ) {
            let cut = cut.min(b.len());
            let whole = Sum::ZERO.add_bytes(&b).fold() % 0xffff;
            let tail = Sum::ZERO.add_bytes(&b[cut..]).fold();
            let head = Sum::ZERO.add_bytes(&b[..cut]);
            // An odd cut only works through add_folded_at: an even one
            // works either way.
            let parts = head.add_folded_at(tail, cut).fold() % 0xffff;
            prop_assert_eq!(parts, whole);
        }
    }

    /// A datagram with the checksum of the definition verifies; any one
    /// flipped bit makes it fail; a zero checksum means none.
    #[test]
    fn udp_checksums_agree_with_the_definition() {
        let (src, dst) = ([198, 18, 0, 10], [198, 18, 0, 1]);
        for len in [0usize, 1, 7, 8, 9, 22, 23, 1400, 1401, 8970] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
            let udp_len = (8 + len) as u16;
            let mut d = Vec::with_capacity(udp_len as usize);
            d.extend_from_slice(&40000u16.to_be_bytes());
            d.extend_from_slice(&48879u16.to_be_bytes());
            d.extend_from_slice(&udp_len.to_be_bytes());
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&payload);
            let c = udp_pseudo_header(src, dst, udp_len)
                .add_bytes(&d)
                .udp_checksum();
            let ip = reference_udp_checksum(src, dst, udp_len, &payload);
            assert_eq!(c, ip, "len {len}");
            d[6..8].copy_from_slice(&c.to_be_bytes());
            assert!(udp_verifies(src, dst, &d), "len {len}");
            for bit in [0usize, 9, 8 * d.len() - 1] {
                let mut bad = d.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(!udp_verifies(src, dst, &bad), "len {len} bit {bit}");
            }
            let mut none = d.clone();
            none[6..8].copy_from_slice(&[0, 0]);
            assert!(udp_verifies(src, dst, &none));
        }
    }

    /// The UDP checksum by the word-by-word definition.
    fn reference_udp_checksum(src: [u8; 4], dst: [u8; 4], udp_len: u16, payload: &[u8]) -> u16 {
        let mut b = Vec::new();
        b.extend_from_slice(&src);
        b.extend_from_slice(&dst);
        b.extend_from_slice(&[0, 17]);
        b.extend_from_slice(&udp_len.to_be_bytes());
        b.extend_from_slice(&40000u16.to_be_bytes());
        b.extend_from_slice(&48879u16.to_be_bytes());
        b.extend_from_slice(&udp_len.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(payload);
        match !reference(&b) {
            0 => 0xffff,
            c => c,
        }
    }

    #[test]
    fn ipv4_header_checksum_is_checked() {
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        let c = Sum::ZERO.add_bytes(&h).checksum();
        assert_eq!(c, 0xb861); // the well-known example header
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert!(ipv4_header_verifies(&h));
        h[15] ^= 0x10;
        assert!(!ipv4_header_verifies(&h));
    }
}
