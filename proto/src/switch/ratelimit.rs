//! Per-source rate limits for what costs the switch work or sends bytes to
//! whoever asks: HELLOs (each CHALLENGE costs an HMAC) and NACKs (some are
//! larger than the frame they answer). docs/PROTOCOL.md, "Limits".
//!
//! Owns: [`RateLimiter`], a fixed table of token buckets (GCRA: one
//! "theoretical arrival time" per bucket) indexed by SipHash-1-3 of the
//! source IPv4 address and the switch port it arrived on, under a key only
//! the switch knows.
//!
//! Invariants:
//! * Memory is fixed when the limiter is made; `allow` never allocates.
//! * Sources that share a bucket share its tokens: a collision only makes
//!   their limit stricter, never looser.
//! * Time is passed in (sans-IO); a clock that goes backwards grants nothing.
//! * The switch port is part of the key: a host spoofing a member's address
//!   from another port spends its own bucket, not the member's.

use std::hash::Hasher;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use siphasher::sip::SipHasher13;

/// Buckets per limiter (a power of two).
pub const RATE_BUCKETS: usize = 4096;

/// A sustained rate and the burst allowed above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub per_second: u32,
    pub burst: u32,
}

/// HELLOs per (source address, switch port). A joining worker sends one
/// every 200 ms (5/s): this lets about 50 ranks behind one address join at
/// once, and a burst of 256 lets them all start together.
pub const HELLO_LIMIT: Limit = Limit {
    per_second: 256,
    burst: 256,
};

/// NACKs per (destination address, switch port). A worker needs one NACK
/// to learn the switch restarted or its job reset (it then re-joins); the
/// burst covers a window of its DATA answered at once.
pub const NACK_LIMIT: Limit = Limit {
    per_second: 64,
    burst: 128,
};

/// Token buckets keyed by (IPv4, switch port); see the module docs.
#[derive(Clone)]
pub struct RateLimiter {
    hasher: SipHasher13,
    /// Microseconds between two tokens.
    interval_us: u64,
    /// How far ahead of now a bucket's arrival time may run (the burst).
    tolerance_us: u64,
    base: Instant,
    /// Per bucket: when it will be full again, in µs since `base`.
    tat: Box<[u64]>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval_us", &self.interval_us)
            .field("tolerance_us", &self.tolerance_us)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// A limiter whose bucket index is keyed from `key` and `label` (so two
    /// limiters of one switch collide on different sources).
    pub fn new(limit: Limit, key: &[u8; 32], label: &[u8], now: Instant) -> RateLimiter {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
        mac.update(b"aggswitch rate-limit buckets: ");
        mac.update(label);
        let k = mac.finalize().into_bytes();
        let k0 = u64::from_le_bytes(k[..8].try_into().expect("8 bytes"));
        let k1 = u64::from_le_bytes(k[8..16].try_into().expect("8 bytes"));
        let per_second = u64::from(limit.per_second.max(1));
        let interval_us = 1_000_000 / per_second;
        RateLimiter {
            hasher: SipHasher13::new_with_keys(k0, k1),
            interval_us,
            tolerance_us: interval_us * u64::from(limit.burst.max(1)),
            base: now,
            tat: vec![0; RATE_BUCKETS].into_boxed_slice(),
        }
    }

    fn bucket(&self, ip: [u8; 4], port_idx: u32) -> usize {
        let mut h = self.hasher;
        h.write(&ip);
        h.write(&port_idx.to_le_bytes());
        h.finish() as usize & (RATE_BUCKETS - 1)
    }

    /// Takes one token for (`ip`, `port_idx`) at `now`; false when its
    /// bucket is empty (the caller drops and counts).
    pub fn allow(&mut self, ip: [u8; 4], port_idx: u32, now: Instant) -> bool {
        let t = micros(now.saturating_duration_since(self.base));
        let i = self.bucket(ip, port_idx);
        let next = self.tat[i].max(t) + self.interval_us;
        if next - t > self.tolerance_us {
            return false;
        }
        self.tat[i] = next;
        true
    }

    /// Whether two sources share a bucket (tests pick ones that do not).
    pub fn shares_bucket(&self, a: ([u8; 4], u32), b: ([u8; 4], u32)) -> bool {
        self.bucket(a.0, a.1) == self.bucket(b.0, b.1)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Limit = Limit {
        per_second: 10,
        burst: 5,
    };

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(LIMIT, &[1; 32], b"t", t0);
        let ip = [198, 18, 0, 1];
        let allowed = (0..20).filter(|_| l.allow(ip, 0, t0)).count();
        assert_eq!(allowed, 5, "the burst, then nothing at the same instant");
        // 10/s: one token every 100 ms.
        assert!(!l.allow(ip, 0, t0 + Duration::from_millis(99)));
        assert!(l.allow(ip, 0, t0 + Duration::from_millis(100)));
        assert!(!l.allow(ip, 0, t0 + Duration::from_millis(150)));
        // Over 10 s at 50/s offered, 10/s get through (plus the refill).
        let mut ok = 0;
        for ms in (200..10_200).step_by(20) {
            ok += l.allow(ip, 0, t0 + Duration::from_millis(ms)) as u32;
        }
        assert!((100..=101).contains(&ok), "{ok} allowed in 10 s");
        // Idle long enough, the whole burst is back, and no more.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| l.allow(ip, 0, later)).count(), 5);
    }

    #[test]
    fn sources_and_ports_have_their_own_buckets() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(LIMIT, &[2; 32], b"t", t0);
        let a = ([198, 18, 0, 1], 0);
        // The same address on another switch port, and another address,
        // chosen so that they do not share a bucket with `a`.
        let other_port = (1..)
            .map(|p| (a.0, p))
            .find(|b| !l.shares_bucket(a, *b))
            .unwrap();
        let other_ip = (2..=254u8)
            .map(|x| ([198, 18, 0, x], 0))
            .find(|b| !l.shares_bucket(a, *b) && !l.shares_bucket(other_port, *b))
            .unwrap();
        while l.allow(a.0, a.1, t0) {}
        assert!(l.allow(other_port.0, other_port.1, t0));
        assert!(l.allow(other_ip.0, other_ip.1, t0));
        assert!(!l.allow(a.0, a.1, t0));
    }

    #[test]
    fn a_clock_going_back_grants_nothing() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(5);
        let mut l = RateLimiter::new(LIMIT, &[3; 32], b"t", t0);
        let ip = [198, 18, 0, 1];
        while l.allow(ip, 0, later) {}
        assert!(!l.allow(ip, 0, t0));
        assert!(!l.allow(ip, 0, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn keys_decide_the_buckets() {
        let t0 = Instant::now();
        let a = RateLimiter::new(LIMIT, &[4; 32], b"hello", t0);
        let b = RateLimiter::new(LIMIT, &[4; 32], b"nack", t0);
        let differ = (0..=255u8)
            .filter(|x| a.bucket([10, 0, 0, *x], 0) != b.bucket([10, 0, 0, *x], 0))
            .count();
        assert!(differ > 200, "labels must key the index ({differ} differ)");
    }
}
