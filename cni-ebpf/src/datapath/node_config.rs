//! Node-wide state the programs read: the `NODE_CONFIG` entry (masquerade address, uplink,
//! `ipMasq`, clusterCIDRs, SNAT ports; written from [`NodeConfigSpec`]), its IPv6 half
//! `NODE_CONFIG6` (IPv6 masquerade address and clusterCIDRs), and the set of addresses
//! the programs treat as "this node" (`NODE_ADDRS`, `NODE_ADDRS6`). Gathering the facts from
//! the node is [`super::node_facts`]'s job.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use cni_ebpf_common::{
    map as map_name, Cidr4, Cidr6, NodeAddr, NodeConfig, NodeConfig6, NodeFlags, NodeState,
    MAX_CLUSTER_CIDRS, MAX_NODE_ADDRS,
};
use ipnet::{Ipv4Net, Ipv6Net};

use super::{
    maps::{self, ipv4_to_map, ipv6_to_map},
    Datapath,
};
use crate::error::Result;

/// What userspace wants the `NODE_CONFIG` map to hold, in its own types: one concept,
/// three forms — this spec, written as the kernel's [`NodeConfig`], read back for
/// `inspect` as a [`super::NodeConfigView`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfigSpec {
    /// Masquerade source address; `None` disables masquerading.
    pub node_addr: Option<Ipv4Addr>,
    /// Uplink ifindex.
    pub uplink_ifindex: u32,
    /// `ipMasq`.
    pub ip_masq: bool,
    /// `sameNodeFastPath`: same-node pod → pod redirected past the stack (else through
    /// the node's netfilter).
    pub same_node_fast_path: bool,
    /// `networkPolicy`: pods are closed until the agent's first swap of the network's
    /// policy ([`NodeFlags::ENFORCE_POLICY`]).
    pub network_policy: bool,
    /// IPv4 `clusterCIDRs`: the first [`MAX_CLUSTER_CIDRS`] are written (parsing the
    /// configuration refuses more, naming `clusterCIDRs`).
    pub cluster_cidrs: Vec<Ipv4Net>,
    /// IPv6 masquerade source address (`NODE_CONFIG6`); `None` disables IPv6 masquerading.
    pub node_addr6: Option<Ipv6Addr>,
    /// IPv6 `clusterCIDRs` (at most [`MAX_CLUSTER_CIDRS`], as the IPv4 ones).
    pub cluster_cidrs6: Vec<Ipv6Net>,
    /// SNAT port range (inclusive).
    pub snat_ports: (u16, u16),
    /// Most SNAT ports one pod may hold towards one destination (0: no cap); see
    /// [`snat_dest_cap`].
    pub snat_dest_cap: u32,
    /// Cookie of the node's network namespace, for the socket hooks (0: they translate
    /// nothing).
    pub netns_cookie: u64,
    /// The node's tunnel (`None`: other nodes' pods are routed).
    pub tunnel: Option<super::tunnel::TunnelState>,
    /// The node's WireGuard device (`None`: no encryption).
    pub wireguard: Option<super::wireguard::WireguardState>,
}

/// The SNAT ports one pod may hold towards one destination on a node whose SNAT range is
/// `ports`: `natPortsPerDestination` (`configured`; at most the range), by default half
/// the range (rounded up). Half leaves the other pods at least as many ports towards any
/// destination as the busiest pod gets, and one pod still far more than any client
/// needs (16 000 with the usual range: at one connection per millisecond, a client that
/// closes first frees its ports after a second's grace). 0 when the range is empty.
#[must_use]
pub fn snat_dest_cap(configured: Option<u32>, ports: (u16, u16)) -> u32 {
    let size = if ports.0 == 0 || ports.1 < ports.0 {
        0
    } else {
        u32::from(ports.1 - ports.0) + 1
    };
    configured.map_or(size.div_ceil(2), |c| c.min(size))
}

impl Datapath {
    pub(super) fn node_config_raw(&self) -> Result<NodeConfig> {
        let mut m = self.maps()?;
        let arr = m.node_config()?;
        arr.get(&0, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG, "read", e))
    }

    /// Whether the network enforces NetworkPolicy (its pods closed until the agent's
    /// first swap: `networkPolicy`).
    pub fn enforces_policy(&self) -> Result<bool> {
        Ok(self
            .node_config_raw()?
            .flags
            .contains(NodeFlags::ENFORCE_POLICY))
    }

    /// Writes the node configuration the programs use.
    pub fn configure_node(&self, s: &NodeConfigSpec) -> Result<()> {
        self.write_node_config(&self.node_config_raw()?, s)
    }

    /// Writes the node configuration for `s` over `old` (the current one). Nothing is
    /// written when nothing changes.
    pub(super) fn write_node_config(&self, old: &NodeConfig, s: &NodeConfigSpec) -> Result<()> {
        let mut cfg = NodeConfig {
            node_addr: s.node_addr.map_or(0, ipv4_to_map),
            uplink_ifindex: s.uplink_ifindex,
            flags: {
                let mut f = NodeFlags::empty();
                f.set(NodeFlags::MASQ, s.ip_masq);
                f.set(NodeFlags::POD_TRAFFIC_TO_STACK, !s.same_node_fast_path);
                f.set(NodeFlags::ENFORCE_POLICY, s.network_policy);
                f.set(
                    NodeFlags::CROSS_SUBNET,
                    s.tunnel.is_some_and(|t| t.cross_subnet),
                );
                f.set(NodeFlags::WIREGUARD, s.wireguard.is_some());
                f.set(
                    NodeFlags::WIREGUARD_CLEAR_TO_KEYLESS,
                    s.wireguard.is_some_and(|w| !w.strict),
                );
                f
            },
            n_cidrs: u32::try_from(s.cluster_cidrs.len()).unwrap_or(0),
            snat_port_min: s.snat_ports.0,
            snat_port_max: s.snat_ports.1,
            snat_dest_cap: s.snat_dest_cap,
            tunnel_ifindex: s.tunnel.map_or(0, |t| t.ifindex),
            tunnel_vni: s.tunnel.map_or(0, |t| t.vni),
            tunnel_port: s.tunnel.map_or(0, |t| t.port),
            wireguard_port: s.wireguard.map_or(0, |w| w.port),
            cluster_cidrs: [Cidr4::default(); MAX_CLUSTER_CIDRS],
            wireguard_ifindex: s.wireguard.map_or(0, |w| w.ifindex),
            netns_cookie: s.netns_cookie,
        };
        for (slot, c) in cfg.cluster_cidrs.iter_mut().zip(&s.cluster_cidrs) {
            *slot = Cidr4 {
                addr: ipv4_to_map(c.network()),
                mask: ipv4_to_map(c.netmask()),
            };
        }
        // The IPv6 half first: the IPv4 entry's `ipMasq` and SNAT ports apply to it too.
        self.write_node_config6(s)?;
        if cfg == *old {
            return Ok(());
        }
        let mut m = self.maps()?;
        let mut arr = m.node_config()?;
        arr.set(0, cfg, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG, "write", e))
    }

    /// Writes `NODE_CONFIG6` for `s` (nothing when nothing changes).
    fn write_node_config6(&self, s: &NodeConfigSpec) -> Result<()> {
        let mut cfg = NodeConfig6 {
            node_addr: s.node_addr6.map_or([0; 4], ipv6_to_map),
            n_cidrs: u32::try_from(s.cluster_cidrs6.len().min(MAX_CLUSTER_CIDRS)).unwrap_or(0),
            _pad: 0,
            cluster_cidrs: [Cidr6::default(); MAX_CLUSTER_CIDRS],
        };
        for (slot, c) in cfg.cluster_cidrs.iter_mut().zip(&s.cluster_cidrs6) {
            *slot = Cidr6 {
                addr: ipv6_to_map(c.network()),
                mask: ipv6_to_map(c.netmask()),
            };
        }
        let mut m = self.maps()?;
        let mut arr = m.node_config6()?;
        if arr.get(&0, 0).is_ok_and(|old| old == cfg) {
            return Ok(());
        }
        arr.set(0, cfg, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG6, "write", e))
    }

    /// The `NODE_CONFIG6` entry as the programs read it.
    pub(super) fn node_config6_raw(&self) -> Result<NodeConfig6> {
        let mut m = self.maps()?;
        let arr = m.node_config6()?;
        arr.get(&0, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG6, "read", e))
    }

    /// The node's bookkeeping ([`NodeState`]).
    fn node_state(&self) -> Result<NodeState> {
        let mut m = self.maps()?;
        let arr = m.node_state()?;
        arr.get(&0, 0)
            .map_err(|e| maps::err(map_name::NODE_STATE, "read", e))
    }

    /// Changes the node's bookkeeping with `f`. ADD (the address listing) and the agent
    /// (its lease) each change their own field: a write between this read and write
    /// puts back the other field's value of a moment ago, which costs at most a listing
    /// of the addresses again, or a lease a second older than it was.
    fn change_node_state(&self, f: impl FnOnce(&mut NodeState)) -> Result<()> {
        let mut state = self.node_state()?;
        f(&mut state);
        let mut m = self.maps()?;
        let mut arr = m.node_state()?;
        arr.set(0, state, 0)
            .map_err(|e| maps::err(map_name::NODE_STATE, "write", e))
    }

    /// When every node address was last listed (`CLOCK_BOOTTIME` seconds; 0: never).
    pub(super) fn addrs_listed_s(&self) -> Result<u32> {
        Ok(self.node_state()?.addrs_listed_s)
    }

    /// Notes that every node address was listed at `now_s` (`CLOCK_BOOTTIME` seconds).
    pub(super) fn set_addrs_listed_s(&self, now_s: u32) -> Result<()> {
        self.change_node_state(|s| s.addrs_listed_s = now_s)
    }

    /// Until when the agent's lease on the network's policy runs (`CLOCK_BOOTTIME`
    /// seconds; 0: never held).
    pub fn agent_lease_s(&self) -> Result<u32> {
        Ok(self.node_state()?.agent_lease_s)
    }

    /// The agent's lease: held until `until_s` (`CLOCK_BOOTTIME` seconds).
    pub fn renew_agent_lease(&self, until_s: u32) -> Result<()> {
        self.change_node_state(|s| s.agent_lease_s = until_s)
    }

    /// Replaces the set of addresses the programs treat as "this node" (host-port
    /// destinations, never masqueraded). If the node has more than a map holds, the
    /// uplink's addresses (on `uplink_ifindex`) and those already tracked come first, and
    /// [`NODE_ADDRS_RESERVE`] slots stay free for the gateways of new pods.
    pub fn set_node_addrs(&self, addrs: &[(IpAddr, u32)], uplink_ifindex: u32) -> Result<()> {
        let (v4, v6) = split_addrs(addrs);
        let mut m = self.maps()?;
        replace_all(
            &mut m.node_addrs()?,
            map_name::NODE_ADDRS,
            v4,
            uplink_ifindex,
        )?;
        replace_all(
            &mut m.node_addrs6()?,
            map_name::NODE_ADDRS6,
            v6,
            uplink_ifindex,
        )
    }

    /// Whether `a` is in the node-address map.
    pub(super) fn is_node_addr(&self, a: IpAddr) -> Result<bool> {
        let mut m = self.maps()?;
        Ok(match a {
            IpAddr::V4(a) => {
                maps::get(&m.node_addrs()?, &ipv4_to_map(a), map_name::NODE_ADDRS)?.is_some()
            }
            IpAddr::V6(a) => {
                maps::get(&m.node_addrs6()?, &ipv6_to_map(a), map_name::NODE_ADDRS6)?.is_some()
            }
        })
    }

    /// Adds addresses to the set the programs treat as "this node" (the uplink's, and the
    /// gateway addresses ADD puts on a new host veth), without removing any: `open_or_load`
    /// replaces the whole set from a full listing at most every
    /// [`super::node_facts::NODE_ADDRS_EVERY_S`].
    pub fn add_node_addrs(&self, addrs: &[(IpAddr, u32)]) -> Result<()> {
        let (v4, v6) = split_addrs(addrs);
        let mut m = self.maps()?;
        add_missing(&mut m.node_addrs()?, map_name::NODE_ADDRS, v4)?;
        add_missing(&mut m.node_addrs6()?, map_name::NODE_ADDRS6, v6)
    }
}

/// `addrs` per family, keyed as the maps key them.
fn split_addrs(addrs: &[(IpAddr, u32)]) -> (BTreeMap<u32, u32>, BTreeMap<[u32; 4], u32>) {
    let mut v4 = BTreeMap::new();
    let mut v6 = BTreeMap::new();
    for (a, i) in addrs {
        match a {
            IpAddr::V4(a) => {
                v4.insert(ipv4_to_map(*a), *i);
            }
            IpAddr::V6(a) => {
                v6.insert(ipv6_to_map(*a), *i);
            }
        }
    }
    (v4, v6)
}

/// Slots of a node-address map a full listing leaves free for the addresses ADD adds
/// itself (a new pod's gateway), when the node has more addresses than the map holds.
pub const NODE_ADDRS_RESERVE: usize = 16;

/// Makes node-address map `h` hold exactly `want`, as far as it has room: the uplink's
/// addresses first, then those it holds already (rewriting a key needs no room), then the
/// others up to [`MAX_NODE_ADDRS`] less [`NODE_ADDRS_RESERVE`].
fn replace_all<K: aya::Pod + Ord>(
    h: &mut aya::maps::HashMap<&mut aya::maps::MapData, K, NodeAddr>,
    name: &str,
    want: BTreeMap<K, u32>,
    uplink_ifindex: u32,
) -> Result<()> {
    let have: BTreeMap<K, u32> = maps::entries(h)
        .into_iter()
        .map(|(k, v)| (k, v.ifindex))
        .collect();
    for k in have.keys() {
        if !want.contains_key(k) {
            maps::remove(h, k, name)?;
        }
    }
    let mut order: Vec<(K, u32)> = want.into_iter().collect();
    order.sort_by_key(|(k, i)| (*i != uplink_ifindex, !have.contains_key(k)));
    let cap = usize::try_from(MAX_NODE_ADDRS).unwrap_or(usize::MAX);
    let room = cap.saturating_sub(NODE_ADDRS_RESERVE);
    let mut full = Full::default();
    for (n, (k, i)) in order.into_iter().enumerate() {
        let kept = i == uplink_ifindex || have.contains_key(&k);
        if !kept && n >= room {
            full.0 += 1;
            continue;
        }
        if have.get(&k) == Some(&i) {
            continue;
        }
        insert_node_addr(h, name, k, i, &mut full)?;
    }
    full.warn(name);
    Ok(())
}

/// Adds the addresses of `add` that node-address map `h` lacks, as far as it has room.
fn add_missing<K: aya::Pod + Ord>(
    h: &mut aya::maps::HashMap<&mut aya::maps::MapData, K, NodeAddr>,
    name: &str,
    add: BTreeMap<K, u32>,
) -> Result<()> {
    let mut full = Full::default();
    for (k, i) in add {
        if maps::get(h, &k, name)?.is_some() {
            continue;
        }
        insert_node_addr(h, name, k, i, &mut full)?;
    }
    full.warn(name);
    Ok(())
}

/// Addresses a full node-address map turned away.
#[derive(Default)]
struct Full(usize);

impl Full {
    fn warn(&self, name: &str) {
        if self.0 > 0 {
            tracing::warn!(
                "map {name} is full: {} node address(es) are not tracked; host ports are not \
                 served on them and pod traffic to them is not recognised as the node's",
                self.0
            );
        }
    }
}

/// Inserts one node address. A node can carry more addresses than the map holds (kube-proxy
/// in IPVS mode binds every ClusterIP to `kube-ipvs0`): a full map is counted in `full`
/// and warned about, never an error, since failing ADD for it would stop every pod on
/// the node from starting. What an untracked address costs: no host port on it, and a
/// pod's packet to it is routed by the kernel like any other.
fn insert_node_addr<K: aya::Pod>(
    h: &mut aya::maps::HashMap<&mut aya::maps::MapData, K, NodeAddr>,
    name: &str,
    k: K,
    ifindex: u32,
    full: &mut Full,
) -> Result<()> {
    match h.insert(k, NodeAddr { ifindex }, 0) {
        Ok(()) => Ok(()),
        Err(e) if maps::is_full(&e) => {
            full.0 += 1;
            Ok(())
        }
        Err(e) => Err(maps::err(name, "insert", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::snat_dest_cap;

    #[test]
    fn the_cap_per_destination_is_half_the_range_unless_configured() {
        assert_eq!(snat_dest_cap(None, (32768, 60999)), 14116);
        assert_eq!(snat_dest_cap(None, (1024, 32767)), 15872);
        assert_eq!(snat_dest_cap(None, (65535, 65535)), 1, "rounded up");
        assert_eq!(snat_dest_cap(Some(100), (1024, 32767)), 100);
        assert_eq!(
            snat_dest_cap(Some(60000), (1024, 32767)),
            31744,
            "at most the range"
        );
        assert_eq!(snat_dest_cap(None, (0, 0)), 0, "no range: nothing to cap");
    }
}
