//! Reaching another network namespace: the named namespaces in
//! `/run/netns` by the id ours gives them ([`Namespaces`]), and running a
//! closure on a short-lived thread inside one ([`in_netns`]).
//!
//! Invariant: only the helper thread changes namespace (`setns`), never a
//! thread of switchd's own; the namespaces are scanned at most once per
//! refresh.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use super::netlink::Rtnl;

/// Where `ip netns add` puts its namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";

/// Runs `f` on a thread inside the network namespace `ns`.
pub(super) fn in_netns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    let fd = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: `fd` is an open namespace file; setns only changes
            // this (short-lived) thread's network namespace.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns helper thread panicked")))
    })
}

/// Named namespaces by the id our namespace gives them, found once per
/// refresh and only when a veth peer lives elsewhere.
#[derive(Default)]
pub(super) struct Namespaces {
    scanned: bool,
    by_nsid: BTreeMap<i32, (PathBuf, File)>,
}

impl Namespaces {
    pub(super) fn find(&mut self, rtnl: &mut Rtnl, nsid: i32) -> Option<&(PathBuf, File)> {
        if !self.scanned {
            self.scanned = true;
            if let Ok(dir) = std::fs::read_dir(NAMED_NETNS_DIR) {
                for ent in dir.flatten() {
                    let path = ent.path();
                    let Ok(f) = File::open(&path) else { continue };
                    if let Ok(id) = rtnl.nsid_of(f.as_raw_fd()) {
                        if id >= 0 {
                            self.by_nsid.entry(id).or_insert((path, f));
                        }
                    }
                }
            }
        }
        self.by_nsid.get(&nsid)
    }
}
