//! ethtool through `SIOCETHTOOL`: a device's active features by name
//! (`ETHTOOL_GSSET_INFO`, `GSTRINGS`, `GFEATURES`), and an ifindex's name.
//!
//! Invariant: runs in the calling thread's network namespace; a feature
//! the kernel does not know is `None`, not off.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETH_SS_FEATURES: u32 = 4;
pub(super) const ETH_GSTRING_LEN: usize = 32;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool(sock: RawFd, ifname: &str, data: *mut libc::c_void) -> std::io::Result<()> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in req.name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq whose data pointer points at a buffer
    // the caller sized for the ethtool command it holds.
    let r = unsafe { libc::ioctl(sock, SIOCETHTOOL as _, &mut req as *mut IfReq) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `Some(active)` for each of `names`, `None` where the kernel has no
/// feature of that name. Runs in the calling thread's network namespace.
pub(super) fn features(ifname: &str, names: &[&str]) -> std::io::Result<Vec<Option<bool>>> {
    // SAFETY: plain socket(2); owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[1] }
    let mut sset = [0u32; 6];
    sset[0] = ETHTOOL_GSSET_INFO;
    let mask = 1u64 << ETH_SS_FEATURES;
    sset[2] = mask as u32;
    sset[3] = (mask >> 32) as u32;
    ethtool(sock.as_raw_fd(), ifname, sset.as_mut_ptr().cast())?;
    let count = sset[4] as usize;
    if count == 0 || count > 4096 {
        return Err(std::io::Error::other(format!("{count} feature strings")));
    }
    // struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[] }
    let mut strings = vec![0u32; 3 + count * ETH_GSTRING_LEN / 4];
    strings[0] = ETHTOOL_GSTRINGS;
    strings[1] = ETH_SS_FEATURES;
    strings[2] = count as u32;
    ethtool(sock.as_raw_fd(), ifname, strings.as_mut_ptr().cast())?;
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    // struct ethtool_gfeatures { u32 cmd; u32 size; blocks { available,
    // requested, active, never_changed }[size] }
    let blocks = count.div_ceil(32);
    let mut feats = vec![0u32; 2 + 4 * blocks];
    feats[0] = ETHTOOL_GFEATURES;
    feats[1] = blocks as u32;
    ethtool(sock.as_raw_fd(), ifname, feats.as_mut_ptr().cast())?;
    Ok(names
        .iter()
        .map(|want| {
            feature_index(&bytes, count, want)
                .map(|i| feats[2 + 4 * (i / 32) + 2] & (1 << (i % 32)) != 0)
        })
        .collect())
}

/// Index of feature `want` in the ETH_SS_FEATURES string table.
pub(super) fn feature_index(table: &[u8], count: usize, want: &str) -> Option<usize> {
    (0..count).find(|i| {
        let s = &table[i * ETH_GSTRING_LEN..(i + 1) * ETH_GSTRING_LEN];
        let end = s.iter().position(|b| *b == 0).unwrap_or(s.len());
        &s[..end] == want.as_bytes()
    })
}

pub(super) fn if_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: `buf` has IFNAMSIZ bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let c = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(c.to_string_lossy().into_owned())
}
