//! What the simulated networks share: a deterministic generator, the
//! faults of a link and the delivery times they give one datagram, and
//! message framing.

use std::time::Duration;

use proto::wire::{HeaderRepr, HEADER_LEN};

/// xorshift64*: a tiny deterministic generator, enough for schedules.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a link does to datagrams: loss, duplication, reordering (each a
/// probability).
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
}

pub const CLEAN: Faults = Faults {
    loss: 0.0,
    dup: 0.0,
    reorder: 0.0,
};

impl Faults {
    /// When the copies of one datagram sent at `now` arrive: none (lost),
    /// one, or two (duplicated); 100–150 µs, plus up to 3 ms when reordered.
    pub fn deliveries(&self, rng: &mut Rng, now: Duration) -> Vec<Duration> {
        if rng.chance(self.loss) {
            return Vec::new();
        }
        let copies = if rng.chance(self.dup) { 2 } else { 1 };
        (0..copies)
            .map(|_| {
                let mut delay = Duration::from_micros(100 + rng.below(50));
                if rng.chance(self.reorder) {
                    delay += Duration::from_micros(rng.below(3000));
                }
                now + delay
            })
            .collect()
    }
}

/// A message as bytes: `h` then `payload`.
pub fn frame(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    h.emit_to(&mut b).expect("header fits");
    b[HEADER_LEN..].copy_from_slice(payload);
    b
}
