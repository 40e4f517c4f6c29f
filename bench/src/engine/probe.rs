//! How long one cache line takes to go from one CPU to another and back:
//! the cost every cross-thread hand-over in the engine pays (a slot's lock,
//! a row, the floor, an outbox). On a virtual machine it changes while the
//! benchmark runs, as the hypervisor moves the virtual CPUs between
//! physical cores that do or do not share a cache, so the benchmark
//! measures it next to every multi-thread run and reports both.
//!
//! Owns: [`core_round_trip`]. Two threads pinned to the two CPUs pass one
//! counter back and forth through an atomic on its own cache lines; the
//! mean round trip is the time over the rounds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::pin_to;

/// Round trips per probe: a few milliseconds even when the CPUs share no
/// cache.
const ROUNDS: u64 = 20_000;

/// A counter alone on its cache lines (and the adjacent-line prefetch's).
#[repr(align(128))]
struct Line(AtomicU64);

/// The mean time, in nanoseconds, for a cache line written on CPU `a` to be
/// seen on CPU `b` and written back; None if either CPU cannot be pinned.
pub fn core_round_trip(a: usize, b: usize) -> Option<f64> {
    let line = Line(AtomicU64::new(0));
    // Set by a side that could not pin itself: the other stops waiting.
    let gave_up = AtomicBool::new(false);
    let (line, gave_up) = (&line, &gave_up);
    std::thread::scope(|s| {
        let far = s.spawn(move || {
            if !pin_to(b) {
                gave_up.store(true, Ordering::Release);
                return false;
            }
            for i in 0..ROUNDS {
                if !wait_for(line, 2 * i + 1, gave_up) {
                    return false;
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
            true
        });
        let near = s.spawn(move || {
            if !pin_to(a) {
                gave_up.store(true, Ordering::Release);
                return None;
            }
            let start = Instant::now();
            for i in 0..ROUNDS {
                line.0.store(2 * i + 1, Ordering::Release);
                if !wait_for(line, 2 * i + 2, gave_up) {
                    return None;
                }
            }
            Some(start.elapsed().as_nanos() as f64 / ROUNDS as f64)
        });
        let near = near.join().ok().flatten();
        let far = far.join().unwrap_or(false);
        near.filter(|_| far)
    })
}

/// Spins until `line` holds `want`; false if the other side gave up.
fn wait_for(line: &Line, want: u64, gave_up: &AtomicBool) -> bool {
    loop {
        if line.0.load(Ordering::Acquire) == want {
            return true;
        }
        if gave_up.load(Ordering::Relaxed) {
            return false;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_between_two_allowed_cpus_takes_time() {
        let cpus = super::super::allowed_cpus();
        let [a, b, ..] = cpus[..] else {
            // CI's machines have two CPUs or more: there, one is a failure.
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "one CPU allowed under CI: no round trip to measure"
            );
            eprintln!("skipped: one CPU allowed, no round trip to measure");
            return;
        };
        let ns = core_round_trip(a, b).expect("both CPUs are allowed");
        assert!(ns > 1.0 && ns < 1e6, "{ns} ns");
    }

    #[test]
    fn a_cpu_that_cannot_be_pinned_gives_no_number() {
        assert_eq!(core_round_trip(0, usize::MAX), None);
    }
}
