//! The bridge facts from a fake sysfs, the `port_info` entries and log
//! lines they make, the feature judgement, the rtnetlink parser, and the
//! refusal counters' names.

use std::path::PathBuf;

use crate::xdp::maps::{
    PortInfo, BR_STATE_FORWARDING, PORT_F_ISOLATED, PORT_F_TAGS_VISIBLE, PORT_F_VLAN_FILTERING,
    PORT_F_XMIT_SG,
};

use super::ethtool::{feature_index, ETH_GSTRING_LEN};
use super::netlink::{parse_link, IFLA_INFO_KIND, IFLA_LINK, IFLA_LINKINFO, IFLA_LINK_NETNSID};
use super::tags::judge;
use super::*;

/// A fake /sys/class/net under a temp dir.
struct FakeSys(PathBuf);

impl FakeSys {
    fn new(name: &str) -> FakeSys {
        let p = std::env::temp_dir().join(format!("brg-sysfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        FakeSys(p)
    }
    fn write(&self, rel: &str, text: &str) {
        let f = self.0.join(rel);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }
    fn bridge(&self, br: &str, ifindex: u32, vlan_filtering: Option<u8>) {
        self.write(&format!("{br}/ifindex"), &format!("{ifindex}\n"));
        std::fs::create_dir_all(self.0.join(br).join("bridge")).unwrap();
        if let Some(v) = vlan_filtering {
            self.write(&format!("{br}/bridge/vlan_filtering"), &format!("{v}\n"));
        }
    }
    fn port(&self, port: &str, br: &str, state: u8, isolated: Option<u8>) {
        self.write(&format!("{port}/ifindex"), "7\n");
        self.write(&format!("{port}/brport/state"), &format!("{state}\n"));
        if let Some(i) = isolated {
            self.write(&format!("{port}/brport/isolated"), &format!("{i}\n"));
        }
        std::os::unix::fs::symlink(
            format!("../../{br}"),
            self.0.join(port).join("brport/bridge"),
        )
        .unwrap();
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn facts(b: Option<BridgeFacts>, tags: TagVisibility) -> PortFacts {
    PortFacts {
        bridge: Ok(b),
        tags,
        xmit_multi_buffer: false,
    }
}

#[test]
fn reads_bridge_state_isolation_and_vlan_filtering() {
    let s = FakeSys::new("a");
    s.bridge("br0", 5, Some(0));
    s.bridge("br1", 9, Some(1));
    s.bridge("br2", 11, None); // no CONFIG_BRIDGE_VLAN_FILTERING
    s.port("p0", "br0", 3, Some(0));
    s.port("p1", "br1", 0, Some(1));
    s.port("p2", "br2", 4, None);
    s.write("lone/ifindex", "12\n");
    assert_eq!(
        read_bridge_facts(&s.0, "p0").unwrap(),
        Some(BridgeFacts {
            bridge: "br0".into(),
            bridge_ifindex: 5,
            stp_state: 3,
            vlan_filtering: false,
            isolated: false
        })
    );
    let p1 = read_bridge_facts(&s.0, "p1").unwrap().unwrap();
    assert_eq!(
        (p1.bridge.as_str(), p1.bridge_ifindex, p1.stp_state),
        ("br1", 9, 0)
    );
    assert!(p1.vlan_filtering && p1.isolated);
    let p2 = read_bridge_facts(&s.0, "p2").unwrap().unwrap();
    assert!(!p2.vlan_filtering && !p2.isolated);
    assert_eq!(p2.stp_state, 4);
    assert_eq!(read_bridge_facts(&s.0, "lone").unwrap(), None);
    assert!(read_bridge_facts(&s.0, "gone").is_err());
}

#[test]
fn a_master_that_is_not_a_bridge_or_garbage_is_an_error() {
    let s = FakeSys::new("b");
    s.write("notbr/ifindex", "5\n"); // no bridge/ directory
    s.port("p0", "notbr", 3, None);
    assert!(read_bridge_facts(&s.0, "p0")
        .unwrap_err()
        .contains("not a bridge"));
    s.bridge("br0", 6, Some(0));
    s.port("p1", "br0", 3, None);
    s.write("p1/brport/state", "forwarding\n");
    assert!(read_bridge_facts(&s.0, "p1")
        .unwrap_err()
        .contains("not a number"));
}

#[test]
fn port_info_carries_bridge_state_and_flags() {
    let b = BridgeFacts {
        bridge: "br0".into(),
        bridge_ifindex: 5,
        stp_state: BR_STATE_FORWARDING as u8,
        vlan_filtering: false,
        isolated: false,
    };
    let f = facts(Some(b.clone()), TagVisibility::Visible);
    assert_eq!(
        f.port_info(),
        PortInfo {
            bridge_ifindex: 5,
            stp_state: 3,
            flags: PORT_F_TAGS_VISIBLE as u8,
            _pad: 0
        }
    );
    assert_eq!(f.describe(), "on (bridge br0)");

    let f = facts(
        Some(BridgeFacts {
            vlan_filtering: true,
            isolated: true,
            stp_state: 0,
            ..b.clone()
        }),
        TagVisibility::Hidden("peer has tx-vlan-hw-insert on".into()),
    );
    let pi = f.port_info();
    assert_eq!(
        u32::from(pi.flags),
        PORT_F_VLAN_FILTERING | PORT_F_ISOLATED,
        "no TAGS_VISIBLE when hidden"
    );
    let d = f.describe();
    for want in [
        "disabled",
        "vlan_filtering",
        "tx-vlan-hw-insert",
        "isolated",
    ] {
        assert!(d.contains(want), "{want} missing from {d}");
    }
    let f = facts(
        Some(b.clone()),
        TagVisibility::Unknown("a bond device".into()),
    );
    assert_eq!(f.port_info().flags, 0);
    // A veth takes redirected jumbo frames.
    let f = PortFacts {
        xmit_multi_buffer: true,
        ..facts(Some(b), TagVisibility::Visible)
    };
    assert_eq!(
        u32::from(f.port_info().flags),
        PORT_F_TAGS_VISIBLE | PORT_F_XMIT_SG
    );

    // Not in a bridge, or unreadable: all zeros, which the program
    // treats as "in no bridge".
    assert_eq!(
        facts(None, TagVisibility::Visible).port_info(),
        PortInfo::default()
    );
    let err = PortFacts {
        bridge: Err("gone".into()),
        tags: TagVisibility::Visible,
        xmit_multi_buffer: true,
    };
    assert_eq!(err.port_info(), PortInfo::default());
    assert!(err.describe().contains("unreadable"));
}

#[test]
fn judging_features() {
    let names = ["a", "b"];
    assert_eq!(
        judge("x", &names, Ok(vec![Some(false), Some(false)])),
        TagVisibility::Visible
    );
    let TagVisibility::Hidden(why) = judge("x", &names, Ok(vec![Some(false), Some(true)])) else {
        panic!("one on must hide")
    };
    assert!(why.contains("b on") && !why.contains("a,"), "{why}");
    assert!(matches!(
        judge("x", &names, Ok(vec![None, Some(false)])),
        TagVisibility::Hidden(_)
    ));
    assert!(matches!(
        judge(
            "x",
            &names,
            Err(std::io::Error::from_raw_os_error(libc::ENODEV))
        ),
        TagVisibility::Unknown(_)
    ));
}

#[test]
fn feature_table_lookup() {
    let mut table = vec![0u8; 3 * ETH_GSTRING_LEN];
    for (i, n) in ["rx-gro", "tx-vlan-hw-insert", "rx-vlan-hw-parse"]
        .iter()
        .enumerate()
    {
        table[i * ETH_GSTRING_LEN..i * ETH_GSTRING_LEN + n.len()].copy_from_slice(n.as_bytes());
    }
    assert_eq!(feature_index(&table, 3, "tx-vlan-hw-insert"), Some(1));
    assert_eq!(feature_index(&table, 3, "rx-vlan-hw-parse"), Some(2));
    assert_eq!(feature_index(&table, 3, "rx-vlan"), None);
}

#[test]
fn parses_an_rtm_newlink_payload() {
    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(data);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }
    let mut p = vec![0u8; 16]; // ifinfomsg
    p.extend(attr(3, b"sw-h0\0")); // IFLA_IFNAME, ignored
    p.extend(attr(IFLA_LINK, &42u32.to_ne_bytes()));
    let kind = attr(IFLA_INFO_KIND, b"veth\0");
    p.extend(attr(IFLA_LINKINFO | 0x8000, &kind)); // NLA_F_NESTED
    p.extend(attr(IFLA_LINK_NETNSID, &3i32.to_ne_bytes()));
    assert_eq!(
        parse_link(&p),
        LinkInfo {
            kind: Some("veth".into()),
            link: Some(42),
            link_netnsid: Some(3)
        }
    );
    // A NIC: no linkinfo; a truncated attribute stops the walk.
    let mut q = vec![0u8; 16];
    q.extend(attr(IFLA_LINK, &9u32.to_ne_bytes()));
    q.extend_from_slice(&[200, 0, 5, 0]);
    assert_eq!(
        parse_link(&q),
        LinkInfo {
            kind: None,
            link: Some(9),
            link_netnsid: None
        }
    );
}

#[test]
fn refusal_names_match_the_counter_kinds() {
    use super::super::maps::*;
    let kinds = [
        CNT_FWD_NOT_BRIDGED,
        CNT_FWD_OTHER_BRIDGE,
        CNT_FWD_NOT_FORWARDING,
        CNT_FWD_VLAN_FILTERING,
        CNT_FWD_VLAN_HIDDEN,
        CNT_FWD_ISOLATED,
        CNT_FWD_MULTI_BUFFER,
    ];
    // Consecutive, in REFUSAL_NAMES order, inside a port's block.
    for (i, k) in kinds.iter().enumerate() {
        assert_eq!(*k, CNT_FWD_NOT_BRIDGED + i as u32);
        assert!(*k < CNT_PER_PORT);
    }
    assert_eq!(REFUSAL_NAMES.len(), kinds.len());
}
