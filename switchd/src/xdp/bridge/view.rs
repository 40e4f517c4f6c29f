//! [`BridgeView`]: the program's `port_info` map and the ports it
//! describes. It writes each watched port's facts when the port is
//! attached and again on every refresh, logs what changed, and logs the
//! program's refusal counters when they grow.
//!
//! Invariant: an entry that changes is first set to all zeros and then to
//! the new value, so the program, which may read a half-copied value, only
//! ever sees the old entry, the new one, or a mix with zeros (refused).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aya::maps::{Array, MapData};

use crate::xdp::error::XdpError;
use crate::xdp::maps::PortInfo;

use super::ethtool::if_name;
use super::facts::{PortFacts, TagVisibility};
use super::netlink::{transmits_multi_buffer, Rtnl};
use super::netns::Namespaces;
use super::sysfs::{read_bridge_facts, SYSFS_NET};
use super::tags::tag_visibility;

/// How often switchd calls [`BridgeView::refresh`] (through
/// `SteeringProgram::refresh_ports`): the longest the fast path may lag
/// behind a change of the bridges.
pub const PORT_REFRESH_EVERY: Duration = Duration::from_secs(1);
/// At most one refusal summary log line this often.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

struct Watched {
    ifindex: u32,
    /// Name at attach (for logs; the current name is looked up by ifindex).
    name: String,
    written: PortInfo,
    described: String,
}

/// Refusal counters of one port, in [`REFUSAL_NAMES`] order.
pub type Refusals = [u64; REFUSAL_NAMES.len()];
/// Names of the refusal counters (as in `SteerCounters` and the log).
pub const REFUSAL_NAMES: [&str; 7] = [
    "fwd_not_bridged",
    "fwd_other_bridge",
    "fwd_not_forwarding",
    "fwd_vlan_filtering",
    "fwd_vlan_hidden",
    "fwd_isolated",
    "fwd_multi_buffer",
];

/// The program's `port_info` map and the ports it describes.
pub struct BridgeView {
    map: Array<MapData, PortInfo>,
    ports: BTreeMap<u32, Watched>,
    sysfs: PathBuf,
    last_refusal_log: Option<Instant>,
    logged_refusals: BTreeMap<u32, Refusals>,
}

impl std::fmt::Debug for BridgeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeView")
            .field("ports", &self.ports.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl BridgeView {
    pub(crate) fn new(map: Array<MapData, PortInfo>) -> BridgeView {
        BridgeView {
            map,
            ports: BTreeMap::new(),
            sysfs: PathBuf::from(SYSFS_NET),
            last_refusal_log: None,
            logged_refusals: BTreeMap::new(),
        }
    }

    /// Ports described, by port index.
    pub fn ports(&self) -> impl Iterator<Item = (u32, &str)> {
        self.ports.iter().map(|(i, w)| (*i, w.name.as_str()))
    }

    /// Writes one entry as is (the refresh logic's primitive; tests use it
    /// to put the program in a given situation).
    pub(in crate::xdp) fn set(&mut self, port_idx: u32, info: PortInfo) -> Result<(), XdpError> {
        self.map.set(port_idx, info, 0).map_err(|e| XdpError::Map {
            map: "port_info",
            detail: format!("setting port {port_idx}: {e}"),
        })
    }

    /// Reads the facts of every port in `which` and writes the entries that
    /// changed (zeros first, see the module docs). Logs each change.
    fn update(&mut self, which: &[u32]) -> Result<usize, XdpError> {
        let mut rtnl = Rtnl::open().map_err(|e| XdpError::Map {
            map: "port_info",
            detail: format!("opening an rtnetlink socket: {e}"),
        });
        let mut ns = Namespaces::default();
        let mut changed = 0;
        for &idx in which {
            let Some(w) = self.ports.get(&idx) else {
                continue;
            };
            let ifindex = w.ifindex;
            let facts = match if_name(ifindex) {
                None => PortFacts {
                    bridge: Err(format!("ifindex {ifindex} is gone")),
                    tags: TagVisibility::Unknown("interface gone".into()),
                    xmit_multi_buffer: false,
                },
                Some(name) => PortFacts {
                    bridge: read_bridge_facts(&self.sysfs, &name),
                    tags: match rtnl.as_mut() {
                        Ok(r) => tag_visibility(r, &mut ns, ifindex, &name),
                        Err(e) => TagVisibility::Unknown(e.to_string()),
                    },
                    xmit_multi_buffer: rtnl
                        .as_mut()
                        .is_ok_and(|r| transmits_multi_buffer(r, ifindex)),
                },
            };
            let info = facts.port_info();
            let described = facts.describe();
            let (old, old_desc) = (w.written, w.described.clone());
            if info != old {
                if old != PortInfo::default() {
                    self.set(idx, PortInfo::default())?;
                }
                self.set(idx, info)?;
                changed += 1;
            }
            let w = self.ports.get_mut(&idx).expect("looked up above");
            w.written = info;
            if described != old_desc {
                tracing::info!(
                    port = %w.name,
                    port_idx = idx,
                    "XDP fast path for this port: {described}"
                );
                w.described = described;
            }
        }
        Ok(changed)
    }

    /// Starts describing port `port_idx` (interface `ifindex`, `name`) and
    /// writes its entry at once: call before attaching the program to it.
    pub(crate) fn watch(
        &mut self,
        port_idx: u32,
        ifindex: u32,
        name: &str,
    ) -> Result<(), XdpError> {
        self.ports.insert(
            port_idx,
            Watched {
                ifindex,
                name: name.to_string(),
                written: PortInfo::default(),
                described: String::new(),
            },
        );
        self.set(port_idx, PortInfo::default())?;
        self.update(&[port_idx]).map(|_| ())
    }

    /// Stops describing `port_idx` and zeroes its entry.
    pub(crate) fn unwatch(&mut self, port_idx: u32) {
        if self.ports.remove(&port_idx).is_some() {
            let _ = self.set(port_idx, PortInfo::default());
        }
        self.logged_refusals.remove(&port_idx);
    }

    /// Re-reads every watched port's facts and rewrites the entries that
    /// changed; returns how many did. Call it at least once a second.
    pub fn refresh(&mut self) -> Result<usize, XdpError> {
        let which: Vec<u32> = self.ports.keys().copied().collect();
        self.update(&which)
    }

    /// Logs the refusal counters (frames the fast path left to the bridge
    /// because of its rules) when they grew, at most every 10 s.
    pub(crate) fn log_refusals(&mut self, now: Instant, counts: BTreeMap<u32, Refusals>) {
        if self
            .last_refusal_log
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        if counts.iter().all(|(i, c)| {
            self.logged_refusals
                .get(i)
                .unwrap_or(&[0; REFUSAL_NAMES.len()])
                == c
        }) {
            return;
        }
        let parts: Vec<String> = counts
            .iter()
            .filter(|(_, c)| c.iter().any(|v| *v > 0))
            .map(|(i, c)| {
                let name = self.ports.get(i).map_or("?", |w| w.name.as_str());
                let kv: Vec<String> = REFUSAL_NAMES
                    .iter()
                    .zip(c)
                    .filter(|(_, v)| **v > 0)
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                format!("{name}: {}", kv.join(" "))
            })
            .collect();
        tracing::info!(
            "XDP fast path refusals since start (frames left to the bridge by its rules): {}",
            parts.join("; ")
        );
        self.last_refusal_log = Some(now);
        self.logged_refusals = counts;
    }
}
