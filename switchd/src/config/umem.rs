//! Whether the AF_XDP sockets' UMEMs lie on 2 MiB HugeTLB pages (`[switch]
//! umem_huge_pages`): what they take, whether the pool has it, and the
//! command that reserves it.
//!
//! Why: switchd reads and writes frames spread over every socket's UMEM
//! (16 MiB each by default); on 4 KiB pages that is a TLB entry per frame,
//! on huge pages one per 2 MiB. Measured at MTU 9000 (docs/BENCHMARKS.md):
//! 3–8 % less switchd CPU. Without reserved pages the UMEM asks for
//! transparent huge pages (xsk.rs), which gave about as much where the
//! kernel had them; reserved pages are the ones nobody else can take.
//! Frames stay 4 KiB: the kernel takes no larger UMEM chunk, huge pages or
//! not.
//!
//! Invariant: [`plan_umem`] uses huge pages only when the pool has every
//! page all sockets need free (so `auto` never starts half the sockets on
//! them by its own choice), and says why not, with the `sysctl` that would
//! reserve them, whenever `auto` or `on` does not get them.

use super::file::{Config, DataplaneMode, UmemHugePages};
use super::mtu::FRAME_SIZE;
use crate::xdp::huge_pages_for;

/// The sysfs folder of the 2 MiB huge page pool.
const HUGE_2MB_SYSFS: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// The 2 MiB huge page pool, as sysfs counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePagePool {
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages no one has mapped (`free_hugepages`).
    pub free: u64,
    /// Free pages already promised to mappings (`resv_hugepages`).
    pub reserved: u64,
    /// Whether 2 MiB is the default huge page size, the one
    /// `vm.nr_hugepages` sets.
    pub default_size: bool,
}

impl HugePagePool {
    /// Reads the pool; None if the kernel has no 2 MiB huge pages.
    pub fn read() -> Option<HugePagePool> {
        let num = |name: &str| -> Option<u64> {
            std::fs::read_to_string(format!("{HUGE_2MB_SYSFS}/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let default_size = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("Hugepagesize:"))
                    .map(|l| l.split_whitespace().nth(1) == Some("2048"))
            })
            .unwrap_or(false);
        Some(HugePagePool {
            total: num("nr_hugepages")?,
            free: num("free_hugepages")?,
            reserved: num("resv_hugepages")?,
            default_size,
        })
    }

    /// Pages a new mapping can take.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved)
    }

    /// The command that makes `need` pages free on top of what the pool's
    /// other users hold.
    pub fn reserve_command(&self, need: u64) -> String {
        let n = self.total + need.saturating_sub(self.available());
        if self.default_size {
            format!("sysctl vm.nr_hugepages={n}")
        } else {
            format!("echo {n} > {HUGE_2MB_SYSFS}/nr_hugepages")
        }
    }
}

/// The sockets' UMEM backing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UmemPlan {
    /// On 2 MiB HugeTLB pages.
    pub huge_pages: bool,
    /// Huge pages all sockets take (0 without them).
    pub pages: u64,
    /// Why the UMEMs are on 4 KiB pages though the setting is `auto`, and
    /// what to do: logged once at start.
    pub note: Option<String>,
}

/// Huge pages `sockets` UMEMs of `frames` frames each take.
pub fn huge_pages_needed(sockets: usize, frames: u32) -> u64 {
    (sockets * huge_pages_for(frames as usize * FRAME_SIZE)) as u64
}

/// Why `sockets` sockets cannot have the `need` pages they take, and the
/// command that reserves them.
pub fn shortage_message(pool: Option<&HugePagePool>, need: u64, sockets: usize) -> String {
    match pool {
        None => format!(
            "AF_XDP UMEM: this kernel has no 2 MiB huge pages; {sockets} sockets would take \
             {need}"
        ),
        Some(p) => format!(
            "AF_XDP UMEM: {} free 2 MiB huge pages, {sockets} sockets take {need}: reserve \
             them with `{}`",
            p.available(),
            p.reserve_command(need)
        ),
    }
}

/// The backing for `setting`, `sockets` sockets of `frames` frames each,
/// and the huge page `pool` (None: the kernel has none). `Err` (the
/// message) when the setting is `on` and the pool is short.
pub fn plan_umem(
    setting: UmemHugePages,
    sockets: usize,
    frames: u32,
    pool: Option<&HugePagePool>,
) -> Result<UmemPlan, String> {
    let small = |note| UmemPlan {
        huge_pages: false,
        pages: 0,
        note,
    };
    if setting == UmemHugePages::Off || sockets == 0 {
        return Ok(small(None));
    }
    let need = huge_pages_needed(sockets, frames);
    if pool.is_some_and(|p| p.available() >= need) {
        return Ok(UmemPlan {
            huge_pages: true,
            pages: need,
            note: None,
        });
    }
    let short = shortage_message(pool, need, sockets);
    match setting {
        UmemHugePages::On => Err(format!(
            "{short}; switch.umem_huge_pages = \"on\" needs them (\"auto\" goes on without)"
        )),
        _ => Ok(small(Some(format!(
            "{short} (switch.umem_huge_pages = \"auto\": meanwhile on transparent huge pages \
             where the kernel has them free, else 4 KiB pages; \"off\" silences this)"
        )))),
    }
}

impl Config {
    /// [`plan_umem`] for this config's sockets (one per port and queue;
    /// none in xdp-drop mode, where the program drops what it would
    /// steer) and the huge page `pool`.
    pub fn umem_plan(&self, pool: Option<&HugePagePool>) -> Result<UmemPlan, String> {
        let sockets = match self.switch.mode {
            DataplaneMode::XdpDrop => 0,
            _ => self.switch.ports.len() * self.switch.queues as usize,
        };
        plan_umem(
            self.switch.umem_huge_pages,
            sockets,
            self.switch.frames_per_socket,
            pool,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(total: u64, free: u64, reserved: u64) -> HugePagePool {
        HugePagePool {
            total,
            free,
            reserved,
            default_size: true,
        }
    }

    #[test]
    fn four_default_sockets_take_32_pages() {
        // 4096 frames of 4 KiB: 16 MiB, 8 pages each.
        assert_eq!(huge_pages_needed(4, 4096), 32);
        assert_eq!(huge_pages_needed(1, 64), 1, "a part of a page is a page");
    }

    #[test]
    fn auto_takes_huge_pages_only_when_every_socket_gets_them() {
        let plan = plan_umem(UmemHugePages::Auto, 4, 4096, Some(&pool(32, 32, 0))).unwrap();
        assert_eq!((plan.huge_pages, plan.pages, plan.note), (true, 32, None));
        // One page short (another mapping holds a reservation).
        let plan = plan_umem(UmemHugePages::Auto, 4, 4096, Some(&pool(32, 32, 1))).unwrap();
        assert!(!plan.huge_pages);
        let note = plan.note.expect("auto says why not");
        assert!(
            note.contains("31 free 2 MiB huge pages, 4 sockets take 32"),
            "{note}"
        );
        assert!(note.contains("`sysctl vm.nr_hugepages=33`"), "{note}");
    }

    #[test]
    fn on_refuses_a_short_pool_and_off_never_asks() {
        let e = plan_umem(UmemHugePages::On, 4, 4096, Some(&pool(0, 0, 0))).unwrap_err();
        assert!(e.contains("`sysctl vm.nr_hugepages=32`"), "{e}");
        assert!(e.contains("umem_huge_pages = \"on\""), "{e}");
        let e = plan_umem(UmemHugePages::On, 4, 4096, None).unwrap_err();
        assert!(e.contains("no 2 MiB huge pages"), "{e}");
        let plan = plan_umem(UmemHugePages::Off, 4, 4096, Some(&pool(64, 64, 0))).unwrap();
        assert_eq!((plan.huge_pages, plan.note), (false, None));
        let plan = plan_umem(UmemHugePages::On, 0, 4096, None).unwrap();
        assert!(!plan.huge_pages, "no sockets (xdp-drop): nothing to map");
    }

    #[test]
    fn the_reserve_command_keeps_what_others_hold() {
        // 10 pages, 4 of them mapped by someone else: 6 free; 32 needed.
        assert_eq!(
            pool(10, 6, 0).reserve_command(32),
            "sysctl vm.nr_hugepages=36"
        );
        // Enough already: the pool as it is.
        assert_eq!(
            pool(40, 40, 0).reserve_command(32),
            "sysctl vm.nr_hugepages=40"
        );
        let other_default = HugePagePool {
            default_size: false,
            ..pool(0, 0, 0)
        };
        assert_eq!(
            other_default.reserve_command(8),
            format!("echo 8 > {HUGE_2MB_SYSFS}/nr_hugepages")
        );
    }
}
