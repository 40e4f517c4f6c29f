//! A port's bridge membership as sysfs shows it:
//! `/sys/class/net/PORT/brport/{bridge,state,isolated}` and
//! `/sys/class/net/BR/{ifindex,bridge/vlan_filtering}`.
//!
//! Invariant: a port with no `brport` directory is in no bridge; a kernel
//! without `vlan_filtering` cannot filter (off); anything unreadable or
//! odd is an error naming the file, never a guess.

use std::path::Path;

use super::facts::BridgeFacts;

/// Where interfaces are described.
pub const SYSFS_NET: &str = "/sys/class/net";

fn read_trimmed(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read_num<T: std::str::FromStr>(path: &Path) -> Result<T, String> {
    let s = read_trimmed(path)?;
    s.parse()
        .map_err(|_| format!("{}: not a number: {s:?}", path.display()))
}

/// Bridge membership of `ifname` as `sysfs` (normally [`SYSFS_NET`]) shows it.
pub fn read_bridge_facts(sysfs: &Path, ifname: &str) -> Result<Option<BridgeFacts>, String> {
    let dev = sysfs.join(ifname);
    if !dev.exists() {
        return Err(format!("{} does not exist", dev.display()));
    }
    let brport = dev.join("brport");
    if !brport.is_dir() {
        return Ok(None);
    }
    let link = std::fs::read_link(brport.join("bridge"))
        .map_err(|e| format!("{}: {e}", brport.join("bridge").display()))?;
    let bridge = link
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: odd link {}", brport.display(), link.display()))?
        .to_string();
    let br = sysfs.join(&bridge);
    let bridge_ifindex: u32 = read_num(&br.join("ifindex"))?;
    let stp_state: u8 = read_num(&brport.join("state"))?;
    let vf = br.join("bridge/vlan_filtering");
    let vlan_filtering = if vf.exists() {
        read_num::<u8>(&vf)? != 0
    } else if br.join("bridge").is_dir() {
        false // built without CONFIG_BRIDGE_VLAN_FILTERING: cannot filter
    } else {
        return Err(format!("{} is not a bridge", br.display()));
    };
    let iso = brport.join("isolated");
    let isolated = iso.exists() && read_num::<u8>(&iso)? != 0;
    if bridge_ifindex == 0 {
        return Err(format!("{}: ifindex 0", br.display()));
    }
    Ok(Some(BridgeFacts {
        bridge,
        bridge_ifindex,
        stp_state,
        vlan_filtering,
        isolated,
    }))
}
