//! Whether `/metrics` would listen where the workers' network reaches it.
//!
//! `/metrics` shows every job's progress (chunks, windows, drops), which
//! helps a host on the data network time attacks on a job, so
//! `[switch] metrics_listen` must be a management address unless the
//! operator sets `metrics_on_data_network = true`. On the data network are:
//! the unspecified addresses (`0.0.0.0`, `::`: every interface), the
//! switch's own addresses (`[switch] addresses`, `uplink`), and, read from
//! the machine at start ([`data_interfaces`]), every address of a port in
//! `[switch] ports` or of the bridge a port is enslaved to. A loopback
//! address never is.
//!
//! Owns: [`Exposure`] (why an address is on the data network), [`check`]
//! (the refusal or the warning, with its fix) and [`data_interfaces`] (the
//! ports' and bridges' addresses, best effort: an interface that cannot be
//! read adds nothing).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

/// An address of an interface the workers' network reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The interface holding the address: a port, or a port's bridge.
    pub ifname: String,
    /// The port of `[switch] ports` it is, or whose bridge it is.
    pub port: String,
    pub addr: IpAddr,
}

/// Why an address is reachable from the workers' network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposure {
    /// `0.0.0.0` or `::`: every interface, the ports included.
    Unspecified,
    /// One of `[switch] addresses`.
    OwnAddress,
    /// The address of `[switch] uplink`.
    Uplink,
    /// Assigned to a port, or to the bridge of one.
    Interface(InterfaceAddr),
}

impl std::fmt::Display for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exposure::Unspecified => write!(
                f,
                "the unspecified address, which listens on every interface, the switch's ports \
                 included"
            ),
            Exposure::OwnAddress => write!(
                f,
                "one of the switch's own aggregation addresses (switch.addresses), which the \
                 workers' network reaches"
            ),
            Exposure::Uplink => write!(
                f,
                "the address of switch.uplink, which the spines' network reaches"
            ),
            Exposure::Interface(i) if i.ifname == i.port => write!(
                f,
                "an address of {}, one of switch.ports, which the workers' network reaches",
                i.ifname
            ),
            Exposure::Interface(i) => write!(
                f,
                "an address of {}, the bridge of port {}, which the workers' network reaches",
                i.ifname, i.port
            ),
        }
    }
}

/// Why `ip` is on the data network, or `None` for a management address.
/// `own`: `[switch] addresses`; `uplink`: `[switch] uplink`; `interfaces`:
/// the ports' and their bridges' addresses ([`data_interfaces`], or none
/// when checking the file alone).
pub fn exposure(
    ip: IpAddr,
    own: &[Ipv4Addr],
    uplink: Option<SocketAddrV4>,
    interfaces: &[InterfaceAddr],
) -> Option<Exposure> {
    // `::ffff:a.b.c.d` is a.b.c.d.
    let ip = ip.to_canonical();
    // No other host reaches a loopback address (the kernel drops 127/8
    // and ::1 arriving on a wire), whatever interface holds it.
    if ip.is_loopback() {
        return None;
    }
    if ip.is_unspecified() {
        return Some(Exposure::Unspecified);
    }
    if own.iter().any(|a| IpAddr::V4(*a) == ip) {
        return Some(Exposure::OwnAddress);
    }
    if uplink.is_some_and(|u| IpAddr::V4(*u.ip()) == ip) {
        return Some(Exposure::Uplink);
    }
    interfaces
        .iter()
        .find(|i| i.addr.to_canonical() == ip)
        .map(|i| Exposure::Interface(i.clone()))
}

/// The operator's choice about `/metrics` on the data network.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// `metrics_on_data_network`.
    pub allow: bool,
    /// `metrics_per_job`.
    pub per_job: bool,
}

/// `Err`: `/metrics` at `addr` would be on the data network (`why`) and
/// the operator did not allow it; the message names the address, why, and
/// the fix. `Ok(Some)`: it is, allowed; the warning to log once. `Ok(None)`:
/// a management address.
pub fn check(
    addr: SocketAddr,
    why: Option<Exposure>,
    policy: Policy,
) -> Result<Option<String>, String> {
    let Some(why) = why else {
        return Ok(None);
    };
    if !policy.allow {
        return Err(format!(
            "switch.metrics_listen = \"{addr}\" is {why}: any host there could read every \
             job's progress from /metrics (per-job chunk counters, windows, drops) and time \
             attacks on it. Bind a management address instead (leave metrics_listen out for \
             127.0.0.1:9100, or name the management interface's address, or \"off\"), or, if \
             that network is trusted, set metrics_on_data_network = true"
        ));
    }
    let mitigate = if policy.per_job {
        "; set metrics_per_job = false to leave the per-job series out"
    } else {
        " (metrics_per_job = false: without the per-job series)"
    };
    Ok(Some(format!(
        "switch.metrics_listen = \"{addr}\" is {why}, and metrics_on_data_network = true: \
         /metrics is served to any host there{mitigate}, or bind a management address"
    )))
}

/// The addresses of each port in `ports` and of the bridge it is enslaved
/// to (sysfs `brport/bridge`), in this network namespace, as
/// `getifaddrs(3)` reports them now. Best effort: nothing for an interface
/// that does not exist or cannot be read.
pub fn data_interfaces(ports: &[String]) -> Vec<InterfaceAddr> {
    let sysfs = Path::new(crate::xdp::bridge::SYSFS_NET);
    let mut names: Vec<(String, String)> = Vec::new();
    for p in ports {
        names.push((p.clone(), p.clone()));
        if let Ok(Some(facts)) = crate::xdp::bridge::read_bridge_facts(sysfs, p) {
            if !names.iter().any(|(n, _)| *n == facts.bridge) {
                names.push((facts.bridge, p.clone()));
            }
        }
    }
    interface_addresses()
        .into_iter()
        .filter_map(|(ifname, addr)| {
            let (_, port) = names.iter().find(|(n, _)| *n == ifname)?;
            Some(InterfaceAddr {
                port: port.clone(),
                ifname,
                addr,
            })
        })
        .collect()
}

/// Every IPv4 and IPv6 address of this network namespace's interfaces, as
/// `(interface, address)`; empty if `getifaddrs(3)` fails.
pub fn interface_addresses() -> Vec<(String, IpAddr)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes the head of a list it allocates into
    // `head`; it is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which
        // stays valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of the family it names
        // (sockaddr_in for AF_INET, sockaddr_in6 for AF_INET6); ifa_name
        // to a NUL-terminated name.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(sin6.sin6_addr.s6_addr.into())
                }
                _ => continue,
            }
        };
        // SAFETY: as above.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        out.push((name.to_string_lossy().into_owned(), addr));
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Vec<Ipv4Addr> {
        vec![Ipv4Addr::new(198, 18, 0, 1)]
    }

    #[test]
    fn unspecified_own_uplink_and_interface_addresses_are_on_the_data_network() {
        let up: SocketAddrV4 = "198.19.0.2:40000".parse().unwrap();
        let br = InterfaceAddr {
            ifname: "br0".into(),
            port: "sw-w0".into(),
            addr: "10.0.0.1".parse().unwrap(),
        };
        let ex = |ip: &str| {
            exposure(
                ip.parse().unwrap(),
                &own(),
                Some(up),
                std::slice::from_ref(&br),
            )
        };
        assert_eq!(ex("0.0.0.0"), Some(Exposure::Unspecified));
        assert_eq!(ex("::"), Some(Exposure::Unspecified));
        assert_eq!(ex("::ffff:0.0.0.0"), Some(Exposure::Unspecified));
        assert_eq!(ex("198.18.0.1"), Some(Exposure::OwnAddress));
        assert_eq!(ex("::ffff:198.18.0.1"), Some(Exposure::OwnAddress));
        assert_eq!(ex("198.19.0.2"), Some(Exposure::Uplink));
        assert_eq!(ex("10.0.0.1"), Some(Exposure::Interface(br.clone())));
        assert_eq!(ex("127.0.0.1"), None);
        let lo = InterfaceAddr {
            ifname: "lo".into(),
            port: "lo".into(),
            addr: "127.0.0.1".parse().unwrap(),
        };
        assert_eq!(
            exposure("127.0.0.1".parse().unwrap(), &own(), None, &[lo]),
            None
        );
        assert_eq!(ex("::1"), None);
        assert_eq!(ex("192.0.2.7"), None);
    }

    #[test]
    fn a_bridge_address_is_refused_naming_the_bridge_the_port_and_the_fix() {
        let i = InterfaceAddr {
            ifname: "br0".into(),
            port: "sw-w1".into(),
            addr: "10.0.0.1".parse().unwrap(),
        };
        let addr: SocketAddr = "10.0.0.1:9100".parse().unwrap();
        let policy = Policy {
            allow: false,
            per_job: true,
        };
        let e = check(addr, Some(Exposure::Interface(i.clone())), policy).unwrap_err();
        assert!(
            e.contains("metrics_listen = \"10.0.0.1:9100\"")
                && e.contains("br0, the bridge of port sw-w1")
                && e.contains("metrics_on_data_network = true"),
            "{e}"
        );
        let port = InterfaceAddr {
            ifname: "sw-w1".into(),
            ..i
        };
        let e = check(addr, Some(Exposure::Interface(port)), policy).unwrap_err();
        assert!(
            e.contains("an address of sw-w1, one of switch.ports"),
            "{e}"
        );
        assert_eq!(check(addr, None, policy), Ok(None));
        let allowed = Policy {
            allow: true,
            ..policy
        };
        let w = check(addr, Some(Exposure::Unspecified), allowed)
            .unwrap()
            .unwrap();
        assert!(w.contains("metrics_per_job = false"), "{w}");
    }

    #[test]
    fn loopback_is_among_the_interface_addresses() {
        // Every namespace has lo; a fresh one may have it down without an
        // address, so only check what is there.
        for (name, addr) in interface_addresses() {
            if addr == IpAddr::V4(Ipv4Addr::LOCALHOST) {
                assert_eq!(name, "lo");
            }
        }
        // A "port" named lo reports lo's addresses as its own.
        let lo = data_interfaces(&["lo".into()]);
        let all = interface_addresses();
        for (name, addr) in all.iter().filter(|(n, _)| n == "lo") {
            assert!(
                lo.contains(&InterfaceAddr {
                    ifname: name.clone(),
                    port: "lo".into(),
                    addr: *addr,
                }),
                "{lo:?}"
            );
        }
        assert_eq!(lo.len(), all.iter().filter(|(n, _)| n == "lo").count());
        // No port: nothing to report.
        assert_eq!(data_interfaces(&[]), vec![]);
        assert_eq!(data_interfaces(&["no-such-if0".into()]), vec![]);
    }
}
