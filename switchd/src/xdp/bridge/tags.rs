//! Whether the XDP program sees every VLAN tag of frames a port receives
//! ([`tag_visibility`]): for a veth, its peer's transmit VLAN offload (read
//! in the peer's namespace); for a NIC or tun/tap, its own receive VLAN
//! parsing; any other kind is not judged. The measurement behind the rules
//! is in the module docs of `bridge`.
//!
//! Invariant: visible only when every relevant feature is known and off;
//! anything unknown or unreadable is `Unknown`, and the fast path stays
//! off from that port.

use super::ethtool::{features, if_name};
use super::facts::TagVisibility;
use super::netlink::Rtnl;
use super::netns::{in_netns, Namespaces, NAMED_NETNS_DIR};

/// Features that, when on, let a tag travel outside the frame's bytes.
pub(super) const PEER_TX_VLAN: [&str; 2] = ["tx-vlan-hw-insert", "tx-vlan-stag-hw-insert"];
pub(super) const OWN_RX_VLAN: [&str; 2] = ["rx-vlan-hw-parse", "rx-vlan-stag-hw-parse"];

/// Judges `names`' states on a device: visible only if every one is known
/// and off.
pub(super) fn judge(
    what: &str,
    names: &[&str],
    states: std::io::Result<Vec<Option<bool>>>,
) -> TagVisibility {
    match states {
        Err(e) => TagVisibility::Unknown(format!("reading {what}'s features: {e}")),
        Ok(states) => {
            let on: Vec<&str> = names
                .iter()
                .zip(&states)
                .filter(|(_, s)| **s != Some(false))
                .map(|(n, _)| *n)
                .collect();
            if on.is_empty() {
                TagVisibility::Visible
            } else {
                TagVisibility::Hidden(format!(
                    "{what} has {} on or unknown: VLAN tags may bypass the frame bytes XDP sees \
                     (ethtool -K DEV {} off)",
                    on.join(", "),
                    on.join(" off ")
                ))
            }
        }
    }
}

/// Whether the XDP program sees every VLAN tag of frames received on port
/// `ifname` (see the module docs for the rules and the measurement).
pub(super) fn tag_visibility(
    rtnl: &mut Rtnl,
    ns: &mut Namespaces,
    ifindex: u32,
    ifname: &str,
) -> TagVisibility {
    let link = match rtnl.link(ifindex) {
        Ok(l) => l,
        Err(e) => return TagVisibility::Unknown(format!("rtnetlink RTM_GETLINK: {e}")),
    };
    match link.kind.as_deref() {
        Some("veth") => {
            let Some(peer) = link.link.filter(|p| *p != 0) else {
                return TagVisibility::Unknown("veth without a peer ifindex".into());
            };
            let read_peer = move || match if_name(peer) {
                Some(name) => (name.clone(), features(&name, &PEER_TX_VLAN)),
                None => (
                    format!("ifindex {peer}"),
                    Err(std::io::Error::from_raw_os_error(libc::ENODEV)),
                ),
            };
            let (where_, (peer_name, states)) = match link.link_netnsid {
                None => ("this namespace".to_string(), read_peer()),
                Some(id) => {
                    let Some((path, file)) = ns.find(rtnl, id) else {
                        return TagVisibility::Unknown(format!(
                            "its veth peer is in namespace id {id}, which has no name in \
                             {NAMED_NETNS_DIR}: cannot read the peer's VLAN offload"
                        ));
                    };
                    match in_netns(file, read_peer) {
                        Ok(r) => (path.display().to_string(), r),
                        Err(e) => {
                            return TagVisibility::Unknown(format!(
                                "entering {}: {e}",
                                path.display()
                            ))
                        }
                    }
                }
            };
            judge(
                &format!("veth peer {peer_name} (in {where_})"),
                &PEER_TX_VLAN,
                states,
            )
        }
        None | Some("tun") => judge(ifname, &OWN_RX_VLAN, features(ifname, &OWN_RX_VLAN)),
        Some(other) => TagVisibility::Unknown(format!(
            "a {other} device: switchd cannot tell whether it hides VLAN tags"
        )),
    }
}
