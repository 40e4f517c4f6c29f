//! What the Linux bridge would do, as the XDP fast path needs to know it:
//! for every attached port, which bridge it is enslaved to, its STP state,
//! whether that bridge filters VLANs, whether the port is isolated, and
//! whether a VLAN tag on a frame it receives is always visible to the
//! program. [`BridgeView`] writes these facts into the program's
//! `port_info` map (`struct port_info` of `ebpf/maps.h`) when a port is
//! attached and again on every [`BridgeView::refresh`]; switchd calls
//! that from its periodic tick (at least once a second), so a port moved to
//! another bridge, set to a non-forwarding state, or a bridge whose
//! `vlan_filtering` is turned on loses the fast path within about a second.
//! The program forwards only between two ports of the same bridge, both
//! forwarding, on a bridge without VLAN filtering, from a port whose tags
//! it can see; everything else goes to the bridge (ebpf/agg_xdp.c).
//!
//! # Where the facts come from
//!
//! * Bridge, state, isolation: sysfs, `/sys/class/net/PORT/brport/{bridge,
//!   state,isolated}`, and `/sys/class/net/BR/{ifindex,bridge/vlan_filtering}`.
//!   A kernel built without `CONFIG_BRIDGE_VLAN_FILTERING` has no
//!   `vlan_filtering` file and cannot filter: that counts as off. A port with
//!   no `brport` directory is in no bridge.
//! * Tag visibility (measured on kernel 6.18, 2026-11-23, with a probe XDP
//!   program counting EtherTypes on a veth while the peer sent frames whose
//!   802.1Q tag a tc program had put in skb metadata, as a VLAN device with
//!   `tx-vlan-offload` on does): the program saw the tag in the frame's bytes
//!   only when the **peer's** `tx-vlan-offload` was off; the receiving
//!   veth's own `rx-vlan-offload` made no difference, in driver and in
//!   generic (skb) mode alike. A NIC with `rx-vlan-offload` on strips the tag
//!   into the receive descriptor the same way. A redirected frame loses such
//!   a tag, so it would reach the other port untagged. Hence
//!   [`PORT_F_TAGS_VISIBLE`](super::maps::PORT_F_TAGS_VISIBLE) is set only when:
//!   * a **veth** port's peer has `tx-vlan-hw-insert` and
//!     `tx-vlan-stag-hw-insert` off; switchd reads the peer's features in
//!     the peer's network namespace (its netnsid from rtnetlink, matched
//!     against the named namespaces in `/run/netns`, entered on a short-lived
//!     thread). A peer in an unnamed namespace cannot be checked: no fast
//!     path from that port;
//!   * a NIC (no `IFLA_INFO_KIND`) or a `tun`/`tap` has `rx-vlan-hw-parse`
//!     and `rx-vlan-stag-hw-parse` off;
//!   * any other kind of device (bond, macvlan, vxlan, …) is not judged: no
//!     fast path from it.
//!
//!   The kfunc `bpf_xdp_metadata_rx_vlan_tag` would let the program ask per
//!   frame instead, but it needs a device-bound program (one per port,
//!   loaded with `BPF_F_XDP_DEV_BOUND_ONLY`), which aya 0.14 cannot load, and
//!   it is not available in generic mode.
//!
//! # Updating a live entry
//!
//! The kernel copies a map value in with `memcpy`, so the program could read
//! half an old and half a new entry. When an entry changes, it is first set
//! to all zeros ("in no bridge": every mix of zeros with the old or the new
//! value is refused) and then to the new value.
//!
//! # Files
//!
//! Bottom up (each imports only those before it): `facts` (what is known
//! about a port, and the entry it makes), `sysfs` (bridge membership),
//! `netlink` (rtnetlink requests), `ethtool` (device features), `netns`
//! (reaching a peer's namespace), `tags` (VLAN tag visibility), `view`
//! ([`BridgeView`], the map writer). Everything public is re-exported here
//! as `crate::xdp::bridge::X`.

mod ethtool;
mod facts;
mod netlink;
mod netns;
mod sysfs;
mod tags;
#[cfg(test)]
mod tests;
mod view;

pub use facts::{BridgeFacts, PortFacts, TagVisibility};
pub use netlink::LinkInfo;
pub use netns::NAMED_NETNS_DIR;
pub use sysfs::{read_bridge_facts, SYSFS_NET};
pub use view::{BridgeView, Refusals, PORT_REFRESH_EVERY, REFUSAL_NAMES};
