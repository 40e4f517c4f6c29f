//! Priorities between jobs (docs/PROTOCOL.md, "Priorities"): a job of a
//! lower class yields to a busy job of a higher class.
//!
//! Owns: [`Priority`] (a job's class), [`PriorityBoard`] (per class, when a
//! job of that class last took DATA, and the switch's coarse clock; one per
//! [`super::DataPath`]) and [`JobPriority`] (one job's class, and whether it
//! yields now).
//!
//! Invariants:
//! * A job yields exactly while some job of a strictly higher class took
//!   DATA within [`BUSY_FOR`]; equal classes never affect each other, so a
//!   switch whose jobs share one class behaves as one without classes.
//! * Busy is earned by work: only DATA that opened or added to a slot
//!   ([`JobPriority::took_data`]) marks a class busy. Duplicates, resends
//!   answered from the shadow, and DATA dropped for any reason do not, so a
//!   member resending one finished chunk cannot hold the lower classes at
//!   their yield share for free.
//! * While a job yields, its RESULTs advertise [`yield_window`] of its
//!   declared window, and its contributions count as CE-marked (its
//!   RESULTs carry ECE); from its first DATA after the higher classes went
//!   idle, they advertise the declared window again. The engine keeps
//!   enforcing the declared window throughout: DATA the workers sent before
//!   they heard of the yield is taken, not dropped (a drop would cost a
//!   resend timeout, and the resends, beyond the smaller window again,
//!   backed off further).
//! * The decision is made per DATA from relaxed loads of a few atomics; a
//!   store happens only when a value changes (a class's busy stamp at most
//!   once per [`GRAIN`], the flag on a transition). No lock, no
//!   allocation, no syscall, no clock read: time comes in through
//!   [`PriorityBoard::tick`] (sans-IO), which the shell calls once per
//!   batch of frames.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A job's class: a busy job of a higher class makes the lower ones yield.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Priority {
    /// Background work: yields to `normal` and `high` jobs.
    Low = 0,
    /// The default: yields to `high` jobs only.
    #[default]
    Normal = 1,
    /// Yields to nobody.
    High = 2,
}

/// Classes, lowest first.
pub const CLASSES: usize = 3;

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; CLASSES] = [Priority::Low, Priority::Normal, Priority::High];

    /// The class a PROVISION's `priority` byte names (0 low, 1 normal, 2
    /// high), if any.
    pub const fn from_u8(v: u8) -> Option<Priority> {
        match v {
            0 => Some(Priority::Low),
            1 => Some(Priority::Normal),
            2 => Some(Priority::High),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A priority that is not one of the classes' names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("priority {0:?} is not one of \"low\", \"normal\" (the default), \"high\"")]
pub struct UnknownPriority(pub String);

impl core::str::FromStr for Priority {
    type Err = UnknownPriority;
    fn from_str(s: &str) -> Result<Priority, UnknownPriority> {
        match s {
            "low" => Ok(Priority::Low),
            "normal" => Ok(Priority::Normal),
            "high" => Ok(Priority::High),
            _ => Err(UnknownPriority(s.to_string())),
        }
    }
}

/// A class counts as busy this long after a job of it last took DATA:
/// longer than a worker's gap between two windows of chunks (so a job in a
/// collective stays busy), shorter than a compute phase between steps (so
/// a job that computes lets the others run).
pub const BUSY_FOR: Duration = Duration::from_millis(5);

/// A class's busy stamp and the clock move in steps of this much: at most
/// one store per step, whatever the packet rate.
pub const GRAIN: Duration = Duration::from_micros(100);

/// The window a job yields to: an eighth of its declared window, at least 1
/// (a chunk in flight keeps the job's collective moving).
pub fn yield_window(declared: u16) -> u16 {
    (declared / 8).max(1)
}

/// A value alone on its cache line (each class's stamp is written by the
/// threads serving that class only).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Line(AtomicU64);

/// When each class was last busy, on the switch's coarse clock.
#[derive(Debug)]
pub struct PriorityBoard {
    base: Instant,
    /// Nanoseconds since `base`, as of the last tick.
    clock: Line,
    /// Per class: the clock + 1 when a job of it last took DATA (0: never).
    busy: [Line; CLASSES],
}

const GRAIN_NS: u64 = GRAIN.as_nanos() as u64;
const BUSY_NS: u64 = BUSY_FOR.as_nanos() as u64;

impl PriorityBoard {
    /// A board whose clock starts at `base`.
    pub fn new(base: Instant) -> PriorityBoard {
        PriorityBoard {
            base,
            clock: Line::default(),
            busy: Default::default(),
        }
    }

    /// Moves the clock to `now` (once per batch of frames; a store at most
    /// once per [`GRAIN`]).
    pub fn tick(&self, now: Instant) {
        let ns =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        if ns
            >= self
                .clock
                .0
                .load(Ordering::Relaxed)
                .saturating_add(GRAIN_NS)
        {
            self.clock.0.store(ns, Ordering::Relaxed);
        }
    }

    /// A job of `class` took DATA now.
    fn mark_busy(&self, class: Priority, now: u64) {
        let b = &self.busy[class as usize].0;
        let stamp = now + 1;
        let last = b.load(Ordering::Relaxed);
        if last == 0 || stamp >= last.saturating_add(GRAIN_NS) {
            b.store(stamp, Ordering::Relaxed);
        }
    }

    /// Whether a job of a class above `class` took DATA within
    /// [`BUSY_FOR`] of `now`.
    fn outranked_at(&self, class: Priority, now: u64) -> bool {
        self.busy[class as usize + 1..].iter().any(|b| {
            let last = b.0.load(Ordering::Relaxed);
            last != 0 && (now + 1).saturating_sub(last) < BUSY_NS
        })
    }

    /// Whether a job of `class` yields now (for readers: metrics, switchctl).
    pub fn outranked(&self, class: Priority) -> bool {
        self.outranked_at(class, self.clock.0.load(Ordering::Relaxed))
    }

    /// Whether a job of `class` was busy within [`BUSY_FOR`] (for readers).
    pub fn busy(&self, class: Priority) -> bool {
        let now = self.clock.0.load(Ordering::Relaxed);
        let last = self.busy[class as usize].0.load(Ordering::Relaxed);
        last != 0 && (now + 1).saturating_sub(last) < BUSY_NS
    }
}

/// One job's class, and whether it yields now.
#[derive(Debug)]
pub struct JobPriority {
    class: Priority,
    board: std::sync::Arc<PriorityBoard>,
    /// Yielding as of the job's last DATA.
    yielding: AtomicBool,
}

impl JobPriority {
    pub(super) fn new(class: Priority, board: std::sync::Arc<PriorityBoard>) -> JobPriority {
        JobPriority {
            class,
            board,
            yielding: AtomicBool::new(false),
        }
    }

    pub fn class(&self) -> Priority {
        self.class
    }

    /// Whether the job yielded at its last DATA (its RESULTs carry ECE and
    /// the yield window).
    pub fn yielding(&self) -> bool {
        self.yielding.load(Ordering::Relaxed)
    }

    /// Whether a job of a higher class is busy now (for readers: the flag
    /// of [`JobPriority::yielding`] is as of the job's last DATA).
    pub fn outranked_now(&self) -> bool {
        self.class < Priority::High && self.board.outranked(self.class)
    }

    /// The window to advertise for a job of declared window `declared`.
    pub fn advertise(&self, declared: u16) -> u16 {
        if self.yielding() {
            yield_window(declared)
        } else {
            declared
        }
    }

    /// A DATA of this job arrived: tells whether it yields now (the flag
    /// is stored only when it changes). Marks nothing: only
    /// [`JobPriority::took_data`] makes the class busy.
    pub(super) fn on_data(&self) -> bool {
        let now = self.board.clock.0.load(Ordering::Relaxed);
        let y = self.class < Priority::High && self.board.outranked_at(self.class, now);
        if self.yielding.load(Ordering::Relaxed) != y {
            self.yielding.store(y, Ordering::Relaxed);
        }
        y
    }

    /// A DATA of this job opened or added to a slot: its class is busy.
    pub(super) fn took_data(&self) {
        let now = self.board.clock.0.load(Ordering::Relaxed);
        self.board.mark_busy(self.class, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_a_typo_names_the_choices() {
        for p in Priority::ALL {
            assert_eq!(p.name().parse::<Priority>(), Ok(p));
        }
        let e = "hgih".parse::<Priority>().unwrap_err().to_string();
        assert!(e.contains("\"hgih\"") && e.contains("\"high\""), "{e}");
        assert_eq!(Priority::default(), Priority::Normal);
    }

    #[test]
    fn a_class_is_busy_for_busy_for_after_its_data_then_idle() {
        let t0 = Instant::now();
        let b = std::sync::Arc::new(PriorityBoard::new(t0));
        let low = JobPriority::new(Priority::Normal, b.clone());
        let high = JobPriority::new(Priority::High, b.clone());
        assert!(!low.on_data(), "nobody above is busy yet");
        assert!(!high.on_data(), "the top class never yields");
        assert!(
            !low.on_data(),
            "a DATA the high job did not take marks nothing"
        );
        high.took_data();
        assert!(low.on_data());
        assert_eq!((low.advertise(64), high.advertise(64)), (8, 64));
        b.tick(t0 + BUSY_FOR / 2);
        assert!(low.on_data(), "still within BUSY_FOR");
        assert!(b.busy(Priority::High) && b.outranked(Priority::Normal));
        b.tick(t0 + BUSY_FOR + GRAIN);
        assert!(!low.on_data(), "the high class went idle");
        assert!(!low.yielding());
        assert_eq!(low.advertise(64), 64);
        assert!(!b.outranked(Priority::Normal));
    }

    #[test]
    fn yield_window_is_an_eighth_and_at_least_one() {
        assert_eq!(yield_window(256), 32);
        assert_eq!(yield_window(8), 1);
        assert_eq!(yield_window(1), 1);
    }
}
