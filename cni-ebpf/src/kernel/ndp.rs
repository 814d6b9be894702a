//! IPv6 neighbour discovery for a new pod, made independent of the kernel's deferred work.
//!
//! Adding an address with `IFA_F_NODAD` makes it usable at once, but two things the first
//! packets to a pod also need are still done by the kernel later, in work items that run
//! under the rtnl lock (and so queue behind every other netlink user on a busy node):
//!
//! - the host veth's link-local address, created when the carrier comes up; without it the
//!   node sends no neighbour solicitation out of that link;
//! - each address's solicited-node multicast group (`ff02::1:ffXX:XXXX`), joined by the
//!   address's DAD work even when DAD is skipped; until then the interface drops the
//!   solicitations for that address.
//!
//! Either one missing costs the first packet a 1 s retransmit. ADD therefore gives the host
//! veth its EUI-64 link-local itself (the address the kernel would pick, without DAD), puts
//! the pod's gateways in the pod's neighbour table permanently (the host veth's MAC is ours
//! and never changes; a chained plugin may change the pod's MAC, so the node learns that
//! one by discovery), and waits, bounded, until the pod has joined the groups of its
//! addresses.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv6Addr},
    time::{Duration, Instant},
};

use ipnet::{IpNet, Ipv6Net};

use crate::{error::Result, kernel::netns::Netns};

/// How long ADD waits for the kernel to join a new pod's solicited-node groups before it
/// goes on anyway (the pod is then reachable over IPv6 a little later, as without the
/// wait). Normally the groups are joined before ADD gets here.
pub const JOIN_WAIT: Duration = Duration::from_secs(2);

/// The EUI-64 link-local address of `mac` (RFC 4291 appendix A).
#[must_use]
pub fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let m = mac;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// [`link_local`] with its /64, as the kernel adds it.
#[must_use]
pub fn link_local_net(mac: [u8; 6]) -> IpNet {
    IpNet::V6(Ipv6Net::new_assert(link_local(mac), 64))
}

/// The solicited-node multicast group of `addr` (RFC 4291 2.7.1).
#[must_use]
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let a = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, a[13], a[14], a[15],
    ])
}

/// The IPv6 multicast groups link `ifindex` has joined, from the text of
/// `/proc/net/igmp6` (`ifindex name group-hex users flags timer` per line).
fn groups_in(igmp6: &str, ifindex: u32) -> HashSet<Ipv6Addr> {
    igmp6
        .lines()
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let index: u32 = cols.next()?.parse().ok()?;
            let group = u128::from_str_radix(cols.nth(1)?, 16).ok()?;
            (index == ifindex).then(|| Ipv6Addr::from(group))
        })
        .collect()
}

/// Waits until link `ifindex` in `netns` has joined the solicited-node group of each
/// IPv6 address in `addrs`, or `within` has passed (logged; not an error: the kernel
/// joins them later). Returns whether they were joined.
pub async fn wait_for_solicited_nodes(
    netns: &Netns,
    ifindex: u32,
    addrs: &[IpAddr],
    within: Duration,
) -> Result<bool> {
    let wanted: Vec<Ipv6Addr> = addrs
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(v6) => Some(solicited_node(*v6)),
            IpAddr::V4(_) => None,
        })
        .collect();
    if wanted.is_empty() {
        return Ok(true);
    }
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        // No such file: IPv6 is off in the pod, so there is nothing to wait for.
        let Some(text) =
            netns.run(|| Ok(std::fs::read_to_string("/proc/thread-self/net/igmp6").ok()))?
        else {
            return Ok(true);
        };
        let joined = groups_in(&text, ifindex);
        let missing: Vec<_> = wanted.iter().filter(|g| !joined.contains(g)).collect();
        if missing.is_empty() {
            return Ok(true);
        }
        if started.elapsed() >= within {
            tracing::warn!(
                ?missing,
                "the pod's interface has not joined these solicited-node groups after {within:?}; \
                 the node's first packets to the pod may wait for a neighbour retransmit"
            );
            return Ok(false);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn link_local_is_the_eui64_of_the_mac() {
        assert_eq!(
            link_local([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]),
            "fe80::42:acff:fe11:2".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            link_local([0xfe, 0x7d, 0x39, 0x77, 0x8d, 0x2c]),
            "fe80::fc7d:39ff:fe77:8d2c".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn solicited_node_keeps_the_low_24_bits() {
        assert_eq!(
            solicited_node("fd00:10:244:1::3".parse().unwrap()),
            "ff02::1:ff00:3".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            solicited_node("2001:db8::abcd:ef12:3456".parse().unwrap()),
            "ff02::1:ff12:3456".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn groups_are_read_per_interface() {
        let text = "\
1    lo              ff020000000000000000000000000001     1 0000000C 0
2    eth0            ff0200000000000000000001ff000003     1 00000004 0
2    eth0            ff020000000000000000000000000001     1 0000000C 0
3    eth1            ff0200000000000000000001ff000004     1 00000004 0
garbage
";
        let g = groups_in(text, 2);
        assert_eq!(g.len(), 2);
        assert!(g.contains(&"ff02::1:ff00:3".parse().unwrap()));
        assert!(!g.contains(&"ff02::1:ff00:4".parse().unwrap()));
    }
}
