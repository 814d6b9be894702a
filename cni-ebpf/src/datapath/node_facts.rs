//! What the programs need to know about the node: uplink, its IPv4 and IPv6 addresses,
//! every local address, the SNAT port range. Read with the caller's netlink connection, on the
//! caller's runtime: ADD reads them on the connection it builds the pod with, so an ADD
//! starts no second runtime or thread for them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{
    error::{Error, Result},
    kernel::link::Nl,
};

/// What the kernel says about the node's network, gathered in one netlink session: the
/// uplink, its IPv4 address and every node address. (Read from the node; what is written
/// to the programs is a [`super::NodeConfigSpec`].)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UplinkFacts {
    /// Uplink name and ifindex.
    pub uplink: Option<(String, u32)>,
    /// First global IPv4 address of the uplink (masquerade source).
    pub uplink_addr: Option<Ipv4Addr>,
    /// First usable global IPv6 address of the uplink (IPv6 masquerade source): global
    /// scope, not tentative, deprecated or failed DAD.
    pub uplink_addr6: Option<Ipv6Addr>,
    /// Every address of the node (both families) with its ifindex.
    pub addrs: Vec<(IpAddr, u32)>,
    /// The uplink's MTU.
    pub uplink_mtu: u32,
}

/// The MTU a pod gets: `mtu` when the configuration sets it, else the path's — the
/// uplink's MTU (`uplink_mtu`), less the encapsulation in the tunnel modes and with
/// encryption (an IPv6 underlay's when the uplink has no IPv4 address). The second value is a warning when
/// a configured MTU exceeds the path's (its packets to other nodes then rely on
/// fragmentation or path-MTU discovery).
#[must_use]
pub fn pod_mtu(
    conf: &crate::cni::config::NetConf,
    uplink_mtu: u32,
    ipv4_underlay: bool,
) -> (u32, Option<String>) {
    use crate::cni::config::CrossNode;
    let (tunnel, wireguard) = if ipv4_underlay {
        (
            cni_ebpf_common::VXLAN_OVERHEAD4,
            cni_ebpf_common::WIREGUARD_OVERHEAD4,
        )
    } else {
        (
            cni_ebpf_common::VXLAN_OVERHEAD6,
            cni_ebpf_common::WIREGUARD_OVERHEAD6,
        )
    };
    // With encryption a pod's packet to another node goes into WireGuard in place of the
    // tunnel, or through the tunnel to a node that has no key (`encryptionStrict:
    // false`): the larger of the two overheads of the paths it may take.
    let overhead = match (conf.cross_node, conf.encryption.is_some()) {
        (CrossNode::Routed, false) => 0,
        (CrossNode::Routed, true) => wireguard,
        (_, false) => tunnel,
        (_, true) => tunnel.max(wireguard),
    };
    let path = uplink_mtu.saturating_sub(overhead).max(68);
    match conf.mtu {
        Some(m) if m > path => (
            m,
            Some(format!(
                "mtu {m} is larger than the path's {path} (the uplink's {uplink_mtu}{}): \
                 packets to other nodes rely on fragmentation and path-MTU discovery",
                if overhead > 0 {
                    format!(" less {overhead} bytes of tunnel or WireGuard headers")
                } else {
                    String::new()
                }
            )),
        ),
        Some(m) => (m, None),
        None => (path, None),
    }
}

/// How often (seconds) ADD lists every node address rather than the uplink's only.
pub const NODE_ADDRS_EVERY_S: u32 = 10;

/// `CLOCK_BOOTTIME` in whole seconds (never 0).
#[must_use]
pub fn boottime_s() -> u32 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(1, |t| u32::try_from(t.tv_sec()).unwrap_or(u32::MAX).max(1))
}

/// The dummy device kube-proxy's IPVS mode binds the Services' addresses to.
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// Reads the node facts through `nl` (a connection in the node's namespace). `uplink` is
/// the configured uplink; `None` means the device of the IPv4 default route. `all`: every
/// IPv4 address of the node in `addrs`, else the uplink's only.
pub async fn read(nl: &Nl, uplink: Option<&str>, all: bool) -> Result<UplinkFacts> {
    let dev = match uplink {
        Some(name) => nl.link_by_name(name).await?.ok_or_else(|| {
            Error::config("uplink", format!("no interface named {name} on the node"))
        })?,
        None => {
            let idx = nl.default_route_device().await?.ok_or_else(|| {
                Error::config(
                    "uplink",
                    "not set and the node has no IPv4 default route to take it from",
                )
            })?;
            nl.link_by_index(idx).await?.ok_or_else(|| {
                Error::netlink(
                    "finding the default route's device",
                    format!("ifindex {idx} vanished"),
                )
            })?
        }
    };
    let (addrs, addrs6) = if all {
        // kube-proxy's IPVS mode binds every ClusterIP, external IP and load-balancer
        // address to its dummy device: those are Services, not the node. Counted as node
        // addresses, a Service reply would pass as the node's own traffic, unjudged by
        // NetworkPolicy, and a pod's flow to one would take the hairpin path.
        let vips = nl.link_by_name(IPVS_DUMMY).await?.map(|l| l.index);
        let mut addrs = nl.ipv4_addresses(None).await?;
        let mut addrs6 = nl.ipv6_addresses(None).await?;
        addrs.retain(|(_, i)| Some(*i) != vips);
        addrs6.retain(|(_, i, _)| Some(*i) != vips);
        (addrs, addrs6)
    } else {
        let strict = Nl::connect_strict()?;
        (
            strict.ipv4_addresses(Some(dev.index)).await?,
            strict.ipv6_addresses(Some(dev.index)).await?,
        )
    };
    let uplink_addr = addrs
        .iter()
        .find(|(a, i)| *i == dev.index && !a.is_link_local() && !a.is_loopback())
        .map(|(a, _)| *a);
    let uplink_addr6 = addrs6
        .iter()
        .find(|(_, i, usable)| *i == dev.index && *usable)
        .map(|(a, _, _)| *a);
    // IPv6 link-local addresses are left out: they mean something on one link only (no
    // host port is offered on one, no packet to one is forwarded), and every host veth
    // has its own, so a node with a few hundred pods would fill the node-address map
    // with them. (IPv4 link-local addresses stay: 169.254.20.10 of NodeLocal DNSCache
    // is a node address that pods reach through their gateway.)
    let addrs = addrs
        .into_iter()
        .map(|(a, i)| (IpAddr::V4(a), i))
        .chain(
            addrs6
                .into_iter()
                .filter(|(a, _, _)| !a.is_unicast_link_local())
                .map(|(a, i, _)| (IpAddr::V6(a), i)),
        )
        .collect();
    Ok(UplinkFacts {
        uplink: Some((dev.name, dev.index)),
        uplink_addr,
        uplink_addr6,
        addrs,
        uplink_mtu: dev.mtu,
    })
}

/// The SNAT port range: ports the kernel never picks for the node's own connections,
/// i.e. outside `net.ipv4.ip_local_port_range` — the larger of the gaps below it (from
/// 1024) and above it. With the default 32768–60999 that is 1024–32767: a node service
/// listening on such a port is unaffected, since a masqueraded flow only ever shares a
/// full 4-tuple with a node socket if the outside peer connects from the flow's own
/// destination port.
/// The tunnel's and WireGuard's UDP ports (`avoid`), when the node has them, are left
/// out of it: the uplink programs hand every packet to those ports on the node to them.
pub fn snat_port_range(avoid: &[u16]) -> (u16, u16) {
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().filter_map(|p| p.parse::<u32>().ok());
            Some((it.next()?, it.next()?))
        })
        .unwrap_or((32768, 60999));
    avoid
        .iter()
        .fold(pick_range(lo, hi), |range, port| leave_out(range, *port))
}

/// The larger part of `range` on either side of `port` (`range` itself when `port` is
/// outside it).
fn leave_out((lo, hi): (u16, u16), port: u16) -> (u16, u16) {
    if port < lo || port > hi {
        (lo, hi)
    } else if hi - port >= port - lo {
        (port.saturating_add(1).min(hi), hi)
    } else {
        (lo, port.saturating_sub(1).max(lo))
    }
}

fn pick_range(lo: u32, hi: u32) -> (u16, u16) {
    let clamp = |v: u32| u16::try_from(v.min(65535)).unwrap_or(u16::MAX);
    let above = 65535u32.saturating_sub(hi);
    let below = lo.saturating_sub(1024);
    if above.max(below) < 1024 {
        // No room outside the local range: share it (documented limitation).
        (clamp(lo.max(1024)), clamp(hi))
    } else if above >= below {
        (clamp(hi + 1), 65535)
    } else {
        (1024, clamp(lo - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::{leave_out, pick_range};

    #[test]
    fn snat_range_avoids_local_ports() {
        assert_eq!(pick_range(32768, 60999), (1024, 32767));
        assert_eq!(pick_range(10000, 65535), (1024, 9999));
        assert_eq!(pick_range(50000, 52000), (1024, 49999));
        assert_eq!(pick_range(1024, 50000), (50001, 65535));
        assert_eq!(pick_range(1500, 65000), (1500, 65000));
        assert_eq!(pick_range(1024, 65535), (1024, 65535));
    }

    #[test]
    fn snat_range_leaves_out_the_tunnel_port() {
        assert_eq!(leave_out((1024, 32767), 8472), (8473, 32767));
        assert_eq!(leave_out((1024, 32767), 30000), (1024, 29999));
        assert_eq!(leave_out((61000, 65535), 8472), (61000, 65535));
        assert_eq!(leave_out((1024, 65535), 1024), (1025, 65535));
        assert_eq!(leave_out((1024, 65535), 65535), (1024, 65534));
    }
}
