//! End-to-end tests of the XDP fast path's bridge rules (issue 11): switchd
//! with `forwarding = "xdp"` forwards in XDP only between ports of the same
//! Linux bridge, both in forwarding state, from ports whose VLAN tags the
//! program can see; everything else goes to the bridge and is counted as a
//! refusal by reason. Each test makes its own testbed (prefix `brg…`,
//! addresses as scripts/testbed.sh --print-env gives them) plus, inside its
//! switch namespace, a second bridge; all of it goes when the testbed's namespaces
//! are deleted, also on failure. The program's counters are read from its
//! `counters` map with bpftool (the refusals are not in the stats file).
//! They need root, bpftool and ethtool; under `CI=true` they fail rather
//! than skip.

use std::process::{Command, Output};
use std::time::Duration;

use agg_e2e::*;

/// How long a change of the bridges may take to reach the program: switchd
/// refreshes `port_info` every second; the rest is room for a busy machine.
const REFRESH_WAIT: Duration = Duration::from_secs(2);

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ip -n NS ARGS`.
fn ip(ns: &str, args: &[&str]) -> Output {
    run(Command::new("ip").args(["-n", ns]).args(args))
}

/// A second bridge `name` in the switch namespace, set up like testbed.sh's
/// br0 (no STP, forwarding at once), with `ports` moved into it.
fn add_bridge(tb: &Testbed, name: &str, ports: &[&str]) {
    let sw = tb.switch_ns();
    ip(
        &sw,
        &[
            "link",
            "add",
            name,
            "type",
            "bridge",
            "forward_delay",
            "0",
            "stp_state",
            "0",
            "ageing_time",
            "30000",
        ],
    );
    ip(&sw, &["link", "set", name, "up"]);
    for p in ports {
        ip(&sw, &["link", "set", p, "master", name]);
    }
}

/// `bridge link set dev PORT state STATE` in the switch namespace (with STP
/// off the bridge keeps only `disabled` (0); other states fall back to
/// forwarding at once).
fn set_port_state(tb: &Testbed, port: &str, state: u8) {
    run(tb.cmd_in(&tb.switch_ns(), "bridge").args([
        "link",
        "set",
        "dev",
        port,
        "state",
        &state.to_string(),
    ]));
    let now = run(tb
        .cmd_in(&tb.switch_ns(), "cat")
        .arg(format!("/sys/class/net/{port}/brport/state")));
    assert_eq!(
        String::from_utf8_lossy(&now.stdout).trim(),
        state.to_string(),
        "the bridge did not take state {state} for {port}"
    );
}

fn mac_of(ns: &str, dev: &str) -> String {
    let out = ip(ns, &["-j", "link", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no MAC for {dev} in {ns}: {v}"))
        .to_owned()
}

/// Permanent neighbour entries between every pair of `hosts`, so that
/// unicast flows without ARP (which the bridges would answer or not on
/// their own) and even across the bridges.
fn static_neighbours(tb: &Testbed, hosts: &[u16]) {
    let macs: Vec<String> = hosts
        .iter()
        .map(|h| mac_of(&tb.host_ns(*h), "eth0"))
        .collect();
    for &a in hosts {
        for (i, &b) in hosts.iter().enumerate() {
            if a != b {
                ip(
                    &tb.host_ns(a),
                    &[
                        "neigh",
                        "replace",
                        &tb.host_addr(b).to_string(),
                        "lladdr",
                        &macs[i],
                        "dev",
                        "eth0",
                        "nud",
                        "permanent",
                    ],
                );
            }
        }
    }
}

/// Three pings from host `from` to host `to`; true if any was answered.
fn pings(tb: &Testbed, from: u16, to: u16) -> bool {
    tb.cmd_in(&tb.host_ns(from), "ping")
        .args([
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            &tb.host_addr(to).to_string(),
        ])
        .output()
        .expect("running ping")
        .status
        .success()
}

/// A `CNT_*` value from ebpf/maps.h, the header the program is built from.
fn counter_kind(name: &str) -> u32 {
    let header = std::fs::read_to_string(repo_root().join("ebpf/maps.h")).unwrap();
    header
        .lines()
        .find_map(|l| {
            let (k, v) = l.trim().trim_end_matches(',').split_once('=')?;
            (k.trim() == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("{name} not in ebpf/maps.h"))
}

/// The program's `counters` map (per port and kind, summed over CPUs), found
/// from the program attached to a port of the switch namespace.
struct XdpCounters {
    map_id: u64,
    per_port: u32,
}

fn json_of(cmd: &mut Command) -> serde_json::Value {
    serde_json::from_slice(&run(cmd).stdout).unwrap()
}

impl XdpCounters {
    fn find(tb: &Testbed, port: &str) -> XdpCounters {
        let link = json_of(Command::new("ip").args([
            "-n",
            &tb.switch_ns(),
            "-j",
            "-d",
            "link",
            "show",
            "dev",
            port,
        ]));
        let prog = link[0]["xdp"]["prog"]["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("no XDP program on {port}: {link}"));
        let info = json_of(
            Command::new("bpftool")
                .args(["-j", "prog", "show", "id"])
                .arg(prog.to_string()),
        );
        let map_id = info["map_ids"]
            .as_array()
            .unwrap_or_else(|| panic!("no maps: {info}"))
            .iter()
            .filter_map(|m| m.as_u64())
            .find(|m| {
                json_of(
                    Command::new("bpftool")
                        .args(["-j", "map", "show", "id"])
                        .arg(m.to_string()),
                )["name"]
                    == "counters"
            })
            .unwrap_or_else(|| panic!("program {prog} has no `counters` map: {info}"));
        XdpCounters {
            map_id,
            per_port: counter_kind("CNT_PER_PORT"),
        }
    }

    /// Counter `kind` (a `CNT_*` name) of port `port_idx`.
    fn get(&self, port_idx: u32, kind: &str) -> u64 {
        let key = (port_idx * self.per_port + counter_kind(kind)).to_le_bytes();
        let key: Vec<String> = key.iter().map(|b| b.to_string()).collect();
        let v = json_of(
            Command::new("bpftool")
                .args(["-j", "map", "lookup", "id", &self.map_id.to_string(), "key"])
                .args(&key),
        );
        v["values"]
            .as_array()
            .unwrap_or_else(|| panic!("odd lookup result: {v}"))
            .iter()
            .map(|c| {
                let bytes: Vec<u8> = c["value"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| {
                        u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16)
                            .unwrap()
                    })
                    .collect();
                u64::from_ne_bytes(bytes.try_into().unwrap())
            })
            .sum()
    }
}

fn port_idx(tb: &Testbed, port: &str) -> u32 {
    tb.ports()
        .iter()
        .position(|p| p == port)
        .unwrap_or_else(|| panic!("{port} is not a port of the testbed")) as u32
}

/// Root, binaries, bpftool and ethtool, or a skip (a failure under CI=true).
fn can_run_here(test: &str) -> bool {
    if !can_run(test) {
        return false;
    }
    for tool in ["bpftool", "ethtool"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            unavailable(
                test,
                &format!("needs {tool} (scripts/setup.sh installs it)"),
            );
            return false;
        }
    }
    true
}

#[test]
#[ignore = "needs root"]
fn frames_never_cross_between_two_bridges_while_each_keeps_its_fast_path() {
    if !can_run_here("frames_never_cross_between_two_bridges") {
        return;
    }
    // h0, h1 (and w0) stay in br0; h2, h3 go to br1. One subnet, two L2
    // domains: only a leak could connect them.
    let tb = Testbed::up("brga", 1, 4);
    add_bridge(&tb, "br1", &["sw-h2", "sw-h3"]);
    static_neighbours(&tb, &[0, 1, 2, 3]);
    let mut sw = Switchd::start_with(&tb, &[], "forwarding = \"xdp\"\n");
    let log = sw.log_text();
    assert_eq!(
        (
            log.matches("XDP fast path for this port: on (bridge br0)")
                .count(),
            log.matches("XDP fast path for this port: on (bridge br1)")
                .count()
        ),
        (3, 2),
        "switchd did not see the ports' bridges at start:\n{log}"
    );
    let c = XdpCounters::find(&tb, "sw-h0");
    let (h0, h2) = (port_idx(&tb, "sw-h0"), port_idx(&tb, "sw-h2"));

    // Within each bridge: reachable, and the fast path carries it (the
    // first round teaches the program both MACs, the second is forwarded).
    for _ in 0..2 {
        assert!(pings(&tb, 0, 1), "h0 -> h1 inside br0 failed");
        assert!(pings(&tb, 2, 3), "h2 -> h3 inside br1 failed");
    }
    let fwd_h0 = c.get(h0, "CNT_FORWARDED");
    let fwd_h2 = c.get(h2, "CNT_FORWARDED");
    assert!(
        fwd_h0 >= 2,
        "fast path unused inside br0: forwarded {fwd_h0}"
    );
    assert!(
        fwd_h2 >= 2,
        "fast path unused inside br1: forwarded {fwd_h2}"
    );

    // Across the bridges: nothing, in either direction, although both ends
    // have static neighbour entries and the program has learned both MACs.
    let other_h0 = c.get(h0, "CNT_FWD_OTHER_BRIDGE");
    let other_h2 = c.get(h2, "CNT_FWD_OTHER_BRIDGE");
    assert!(!pings(&tb, 0, 2), "h0 (br0) reached h2 (br1)");
    assert!(!pings(&tb, 2, 0), "h2 (br1) reached h0 (br0)");
    // One direction alone, with a control: h2 hears h3 (same bridge) but
    // not h0.
    let h2_addr = tb.host_addr(2).to_string();
    let (rx, reader) = probe_listener(
        &tb,
        &tb.host_ns(2),
        &["udp-recv", &h2_addr, "7001", "4", "3"],
    );
    assert!(
        probe(&tb, &tb.host_ns(3), &["udp-send", &h2_addr, "7001", "a3"])
            .status
            .success()
    );
    assert!(probe(
        &tb,
        &tb.host_ns(0),
        &["udp-send", &h2_addr, "7001", "b0", "b1", "b2"]
    )
    .status
    .success());
    let got: Vec<String> = std::io::BufRead::lines(reader)
        .map_while(Result::ok)
        .map(|l| l.trim().to_owned())
        .collect();
    wait_with_timeout(rx, Duration::from_secs(10));
    assert_eq!(
        got,
        ["a3"],
        "h2 got datagrams from the other bridge (or none from its own)"
    );

    let refused_h0 = c.get(h0, "CNT_FWD_OTHER_BRIDGE") - other_h0;
    let refused_h2 = c.get(h2, "CNT_FWD_OTHER_BRIDGE") - other_h2;
    assert!(
        refused_h0 >= 3 + 3,
        "h0's pings and datagrams to h2 were not refused as other_bridge: {refused_h0}"
    );
    assert!(
        refused_h2 >= 3,
        "h2's pings to h0 were not refused as other_bridge: {refused_h2}"
    );
    assert_eq!(c.get(h0, "CNT_FORWARDED"), fwd_h0, "h0 forwarded across");
    assert_eq!(c.get(h2, "CNT_FORWARDED"), fwd_h2, "h2 forwarded across");

    let stats = stop_clean(&tb, &mut sw);
    assert!(
        port_sum(&stats, "sw-h0", "xdp_forwarded") >= fwd_h0,
        "{stats}"
    );
}

#[test]
#[ignore = "needs root"]
fn a_port_that_stops_forwarding_or_changes_bridge_loses_the_fast_path_within_a_second() {
    if !can_run_here("a_port_that_stops_forwarding") {
        return;
    }
    let tb = Testbed::up("brgb", 1, 2);
    static_neighbours(&tb, &[0, 1]);
    let mut sw = Switchd::start_with(&tb, &[], "forwarding = \"xdp\"\n");
    let c = XdpCounters::find(&tb, "sw-h0");
    let h0 = port_idx(&tb, "sw-h0");
    for _ in 0..2 {
        assert!(pings(&tb, 0, 1), "h0 -> h1 failed");
    }
    let fwd = c.get(h0, "CNT_FORWARDED");
    assert!(fwd >= 2, "fast path unused: forwarded {fwd}");

    // Disabled: the bridge stops forwarding to sw-h1, and so must XDP (the
    // program still has h1's MAC learned on it).
    set_port_state(&tb, "sw-h1", 0);
    std::thread::sleep(REFRESH_WAIT);
    let refused = c.get(h0, "CNT_FWD_NOT_FORWARDING");
    assert!(!pings(&tb, 0, 1), "h0 reached h1 through a disabled port");
    assert!(
        c.get(h0, "CNT_FWD_NOT_FORWARDING") - refused >= 3,
        "pings to the disabled port not refused as not_forwarding"
    );
    assert_eq!(
        c.get(h0, "CNT_FORWARDED"),
        fwd,
        "forwarded to a disabled port"
    );

    // Forwarding again: the fast path is back.
    set_port_state(&tb, "sw-h1", 3);
    std::thread::sleep(REFRESH_WAIT);
    assert!(
        pings(&tb, 0, 1),
        "h0 -> h1 failed after re-enabling the port"
    );
    let fwd = {
        let now = c.get(h0, "CNT_FORWARDED");
        assert!(now > fwd, "fast path not back after re-enabling sw-h1");
        now
    };

    // Moved to another bridge: h1 is out of h0's reach, in XDP too.
    add_bridge(&tb, "br1", &["sw-h1"]);
    std::thread::sleep(REFRESH_WAIT);
    let refused = c.get(h0, "CNT_FWD_OTHER_BRIDGE");
    assert!(!pings(&tb, 0, 1), "h0 reached h1 after it moved to br1");
    assert!(
        c.get(h0, "CNT_FWD_OTHER_BRIDGE") - refused >= 3,
        "pings to the moved port not refused as other_bridge"
    );
    assert_eq!(c.get(h0, "CNT_FORWARDED"), fwd, "forwarded into br1");
    assert!(
        sw.log_text().contains("port state disabled (0)"),
        "the state change was not logged:\n{}",
        sw.log_text()
    );
    stop_clean(&tb, &mut sw);
}

#[test]
#[ignore = "needs root"]
fn a_veth_whose_peer_may_hide_vlan_tags_is_not_forwarded_from() {
    if !can_run_here("a_veth_whose_peer_may_hide_vlan_tags") {
        return;
    }
    let tb = Testbed::up("brgc", 1, 2);
    static_neighbours(&tb, &[0, 1]);
    let mut sw = Switchd::start_with(&tb, &[], "forwarding = \"xdp\"\n");
    let c = XdpCounters::find(&tb, "sw-h0");
    let (h0, h1) = (port_idx(&tb, "sw-h0"), port_idx(&tb, "sw-h1"));
    for _ in 0..2 {
        assert!(pings(&tb, 0, 1), "h0 -> h1 failed");
    }
    let (fwd0, fwd1) = (c.get(h0, "CNT_FORWARDED"), c.get(h1, "CNT_FORWARDED"));
    assert!(fwd0 >= 2 && fwd1 >= 2, "fast path unused: {fwd0} {fwd1}");

    // h0's eth0 may now put VLAN tags into skb metadata, where XDP on sw-h0
    // cannot see them: frames from sw-h0 go through the bridge (which still
    // delivers them), frames to it keep the fast path.
    let ethtool = |on: &str| {
        run(tb
            .cmd_in(&tb.host_ns(0), "ethtool")
            .args(["-K", "eth0", "txvlan", on]));
    };
    ethtool("on");
    std::thread::sleep(REFRESH_WAIT);
    let hidden = c.get(h0, "CNT_FWD_VLAN_HIDDEN");
    assert!(pings(&tb, 0, 1), "the bridge did not carry h0's pings");
    assert!(
        c.get(h0, "CNT_FWD_VLAN_HIDDEN") - hidden >= 3,
        "h0's pings not refused as vlan_hidden"
    );
    assert_eq!(c.get(h0, "CNT_FORWARDED"), fwd0, "forwarded from sw-h0");
    assert!(
        c.get(h1, "CNT_FORWARDED") > fwd1,
        "replies to h0 lost the fast path"
    );
    assert!(
        sw.log_text().contains("has tx-vlan-hw-insert on"),
        "the reason was not logged:\n{}",
        sw.log_text()
    );

    ethtool("off");
    std::thread::sleep(REFRESH_WAIT);
    assert!(pings(&tb, 0, 1));
    assert!(
        c.get(h0, "CNT_FORWARDED") > fwd0,
        "fast path from sw-h0 not back"
    );
    stop_clean(&tb, &mut sw);
}
