//! What switchd knows about one port: its bridge membership
//! ([`BridgeFacts`]), whether VLAN tags on its frames are visible to the
//! XDP program ([`TagVisibility`]), and the `port_info` entry and log line
//! those make ([`PortFacts`]).
//!
//! Invariant: a port whose bridge could not be read, or that is in no
//! bridge, gets the all-zero entry ("in no bridge"): the program forwards
//! nothing from or to it.

use crate::xdp::maps::{
    PortInfo, BR_STATE_BLOCKING, BR_STATE_DISABLED, BR_STATE_FORWARDING, BR_STATE_LEARNING,
    BR_STATE_LISTENING, PORT_F_ISOLATED, PORT_F_TAGS_VISIBLE, PORT_F_VLAN_FILTERING,
    PORT_F_XMIT_SG,
};

/// A port's membership in a Linux bridge, from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeFacts {
    pub bridge: String,
    pub bridge_ifindex: u32,
    /// `brport/state`: `BR_STATE_*`.
    pub stp_state: u8,
    pub vlan_filtering: bool,
    pub isolated: bool,
}

/// Whether a VLAN tag on a frame received on a port is always in the
/// frame's bytes, where the XDP program sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagVisibility {
    Visible,
    /// Offload may move the tag out of the frame: why.
    Hidden(String),
    /// switchd cannot tell: why.
    Unknown(String),
}

/// Everything [`BridgeView`](super::BridgeView) knows about one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    /// `Ok(None)`: in no bridge. `Err`: could not be read.
    pub bridge: Result<Option<BridgeFacts>, String>,
    pub tags: TagVisibility,
    /// A redirect to the port carries a frame in several buffers
    /// ([`PORT_F_XMIT_SG`]): known for veth only.
    pub xmit_multi_buffer: bool,
}

fn state_name(state: u8) -> &'static str {
    match u32::from(state) {
        BR_STATE_DISABLED => "disabled",
        BR_STATE_LISTENING => "listening",
        BR_STATE_LEARNING => "learning",
        BR_STATE_FORWARDING => "forwarding",
        BR_STATE_BLOCKING => "blocking",
        _ => "unknown",
    }
}

impl PortFacts {
    /// The `port_info` entry the program reads.
    pub fn port_info(&self) -> PortInfo {
        let Ok(Some(b)) = &self.bridge else {
            return PortInfo::default();
        };
        let mut flags = 0u32;
        if b.vlan_filtering {
            flags |= PORT_F_VLAN_FILTERING;
        }
        if b.isolated {
            flags |= PORT_F_ISOLATED;
        }
        if self.tags == TagVisibility::Visible {
            flags |= PORT_F_TAGS_VISIBLE;
        }
        if self.xmit_multi_buffer {
            flags |= PORT_F_XMIT_SG;
        }
        PortInfo {
            bridge_ifindex: b.bridge_ifindex,
            stp_state: b.stp_state,
            flags: flags as u8,
            _pad: 0,
        }
    }

    /// One line for the log: whether the fast path may use the port, and if
    /// not every reason why (for forwarding from it; forwarding to it needs
    /// only bridge and state).
    pub fn describe(&self) -> String {
        let b = match &self.bridge {
            Err(e) => return format!("off: bridge membership unreadable ({e})"),
            Ok(None) => return "off: in no bridge".to_string(),
            Ok(Some(b)) => b,
        };
        let mut why = Vec::new();
        if u32::from(b.stp_state) != BR_STATE_FORWARDING {
            why.push(format!(
                "port state {} ({})",
                state_name(b.stp_state),
                b.stp_state
            ));
        }
        if b.vlan_filtering {
            why.push(format!("bridge {} has vlan_filtering on", b.bridge));
        }
        match &self.tags {
            TagVisibility::Visible => {}
            TagVisibility::Hidden(r) | TagVisibility::Unknown(r) => {
                why.push(format!("not from this port: {r}"))
            }
        }
        if b.isolated {
            why.push("isolated (not to other isolated ports)".to_string());
        }
        if why.is_empty() {
            format!("on (bridge {})", b.bridge)
        } else {
            format!("restricted in bridge {}: {}", b.bridge, why.join("; "))
        }
    }
}
