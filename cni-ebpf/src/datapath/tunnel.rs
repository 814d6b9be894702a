//! The node's tunnel device (`crossNode` `tunnel` and `crossSubnet`; see
//! `cni-ebpf-bpf/src/tunnel.rs` for its programs): one VXLAN device per node in external
//! mode, created by the first ADD that needs it, its programs attached, and the cluster
//! CIDRs routed to it (`proto 208`). The pods of this node have their own more specific
//! routes, so only other nodes' pods go into the tunnel; the agent keeps, from the Node
//! objects, which node holds which pod CIDR (`TUNNEL_ENDPOINTS`), and in `crossSubnet` mode
//! routes the nodes of the uplink's own subnet directly (more specific routes again).
//!
//! A device of that name that cni-ebpf did not create (its alias says so) is never taken
//! over or changed: ADD fails naming it.

use aya::{maps::lpm_trie::Key, programs::TcAttachType};
use cni_ebpf_common::{map as map_name, prog, TunnelEndpoint, TunnelKey, TUNNEL_IPV6};
use ipnet::IpNet;

use super::{
    attach::{self},
    load, maps,
    pins::Direction,
    Datapath,
};
use crate::{
    cni::config::{CrossNode, NetConf},
    error::{Error, Result},
    kernel::link::{Nl, RTPROT_CNI_EBPF_TUNNEL},
};

/// The tunnel device's name.
pub const TUNNEL_DEVICE: &str = "cni-ebpf.vxlan";
/// The alias that marks the device as ours.
const TUNNEL_ALIAS: &str = "cni-ebpf tunnel";

/// The tunnel programs and where they go.
const TUNNEL_PROGS: [(&str, Direction, TcAttachType); 2] = [
    (prog::FROM_TUNNEL, Direction::Ingress, TcAttachType::Ingress),
    (prog::TO_TUNNEL, Direction::Egress, TcAttachType::Egress),
];

/// What the node's tunnel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelState {
    pub ifindex: u32,
    pub vni: u32,
    pub port: u16,
    pub cross_subnet: bool,
}

impl Datapath {
    /// The tunnel the configuration asks for, made ready: the device (created with MTU
    /// `mtu` if missing), its programs, the cluster CIDRs' routes. `None` in routed mode.
    /// `known`: the device ifindex the node configuration holds (0: none), so that a
    /// node whose tunnel is in place costs one lookup.
    pub(super) async fn ensure_tunnel(
        &self,
        nl: &Nl,
        conf: &NetConf,
        mtu: u32,
        known: u32,
    ) -> Result<Option<TunnelState>> {
        let cross_subnet = match conf.cross_node {
            CrossNode::Routed => return Ok(None),
            CrossNode::Tunnel => false,
            CrossNode::CrossSubnet => true,
        };
        let foreign = |why: String| {
            Error::config(
                "crossNode",
                format!(
                    "an interface named {TUNNEL_DEVICE} exists that cni-ebpf did not create \
                     ({why}); rename or remove it"
                ),
            )
        };
        let mut dev = match nl.link_by_name(TUNNEL_DEVICE).await? {
            Some(d) => d,
            None => {
                let _lock = load::LoadLock::acquire(&self.pins)?;
                match nl.link_by_name(TUNNEL_DEVICE).await? {
                    Some(d) => d,
                    None => {
                        nl.create_vxlan(TUNNEL_DEVICE, conf.tunnel.port, mtu)
                            .await
                            .map_err(|e| {
                                Error::config(
                                    "tunnelPort",
                                    format!(
                                        "the tunnel device could not be created on UDP port \
                                         {}: {e}",
                                        conf.tunnel.port
                                    ),
                                )
                            })?;
                        nl.link_by_name(TUNNEL_DEVICE).await?.ok_or_else(|| {
                            Error::netlink("creating the tunnel device", "it vanished")
                        })?
                    }
                }
            }
        };
        // Made but not yet labelled and up: by the creation above, or by one that died
        // between the two steps (an external VXLAN device of our name on our port, down,
        // without an alias). Setting it up binds the port; when another device holds the
        // port, the device goes again and nothing is left changed.
        let unlabelled_veths = dev.alias.as_deref().is_none_or(str::is_empty)
            && dev.vxlan == Some((conf.tunnel.port, true))
            && !dev.up;
        if unlabelled_veths {
            if let Err(e) = nl.label_and_set_up(dev.index, TUNNEL_ALIAS).await {
                nl.del_link(dev.index).await?;
                return Err(Error::config(
                    "tunnelPort",
                    format!(
                        "the tunnel device could not bind UDP port {} (is the port taken by \
                         another device?): {e}",
                        conf.tunnel.port
                    ),
                ));
            }
            dev.alias = Some(TUNNEL_ALIAS.to_owned());
            dev.up = true;
        }
        if dev.alias.as_deref() != Some(TUNNEL_ALIAS) {
            return Err(foreign(format!(
                "alias {:?}",
                dev.alias.unwrap_or_default()
            )));
        }
        match dev.vxlan {
            Some((port, true)) if port == conf.tunnel.port => {}
            Some((port, true)) => {
                return Err(Error::config(
                    "tunnelPort",
                    format!(
                        "{} differs from the node's tunnel device's port {port}: one port per \
                         node",
                        conf.tunnel.port
                    ),
                ))
            }
            _ => return Err(foreign("not a VXLAN device in external mode".into())),
        }
        if dev.index != known || !self.tunnel_attached(dev.index)? {
            self.attach_tunnel(dev.index)?;
            if !dev.up {
                nl.set_up(dev.index).await?;
            }
            for cidr in &conf.cluster_cidrs {
                nl.replace_device_route(cidr.trunc(), dev.index, RTPROT_CNI_EBPF_TUNNEL)
                    .await?;
            }
        }
        Ok(Some(TunnelState {
            ifindex: dev.index,
            vni: conf.tunnel.vni,
            port: conf.tunnel.port,
            cross_subnet,
        }))
    }

    /// The node's tunnel device, as [`Datapath::open_or_load_with`] made it ready (`None`
    /// in routed mode, and on handles opened otherwise).
    #[must_use]
    pub fn tunnel_ifindex(&self) -> Option<u32> {
        (self.tunnel_ifindex != 0).then_some(self.tunnel_ifindex)
    }

    /// `uninstall --purge`: deletes the node's tunnel device if this network made one and
    /// it is ours (its alias says so); its routes go with it. Returns whether it did.
    pub fn remove_tunnel(&self) -> Result<bool> {
        if self.node_config_raw()?.tunnel_ifindex == 0 {
            return Ok(false);
        }
        remove_ours(TUNNEL_DEVICE, TUNNEL_ALIAS)
    }

    fn tunnel_attached(&self, ifindex: u32) -> Result<bool> {
        for (p, dir, tc_dir) in TUNNEL_PROGS {
            let id = attach::pinned_program_id(&self.pins.prog(p))?;
            let mode = attach::attached(
                TUNNEL_DEVICE,
                ifindex,
                tc_dir,
                id,
                &self.pins.tunnel_link(dir),
                attach::uplink_handle(self.pins.network_dir()),
            )?;
            if mode.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn attach_tunnel(&self, ifindex: u32) -> Result<()> {
        let _lock = load::LoadLock::acquire(&self.pins)?;
        for (p, dir, tc_dir) in TUNNEL_PROGS {
            let mut program = self.program(p)?;
            attach::attach(
                &mut program,
                TUNNEL_DEVICE,
                ifindex,
                tc_dir,
                &self.pins.tunnel_link(dir),
                attach::uplink_handle(self.pins.network_dir()),
                self.attach,
            )?;
        }
        Ok(())
    }

    /// Makes `TUNNEL_ENDPOINTS` hold exactly `entries` (pod CIDR → the underlay address
    /// of the node that holds it) and `TUNNEL_NODES` exactly those nodes (written first,
    /// removed last). Returns how many entries changed.
    pub fn set_tunnel_endpoints(&self, entries: &[(IpNet, std::net::IpAddr)]) -> Result<usize> {
        let node_key = |ip: &std::net::IpAddr| TunnelKey {
            addr: match ip {
                std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(a) => a.octets(),
            },
        };
        let nodes: Vec<TunnelKey> = entries.iter().map(|(_, ip)| node_key(ip)).collect();
        {
            let mut m = self.maps()?;
            let mut h = m.tunnel_nodes()?;
            for k in &nodes {
                h.insert(k, 1, 0)
                    .map_err(|e| maps::err(map_name::TUNNEL_NODES, "insert", e))?;
            }
        }
        let changed = self.set_tunnel_prefixes(entries)?;
        let mut m = self.maps()?;
        let mut h = m.tunnel_nodes()?;
        maps::remove_where(&mut h, map_name::TUNNEL_NODES, |k, _| {
            !nodes.iter().any(|n| n.addr == k.addr)
        })?;
        Ok(changed)
    }

    fn set_tunnel_prefixes(&self, entries: &[(IpNet, std::net::IpAddr)]) -> Result<usize> {
        let value = |ip: &std::net::IpAddr| match ip {
            std::net::IpAddr::V4(a) => TunnelEndpoint {
                node: a.to_ipv6_mapped().octets(),
                flags: 0,
                _pad: 0,
            },
            std::net::IpAddr::V6(a) => TunnelEndpoint {
                node: a.octets(),
                flags: TUNNEL_IPV6,
                _pad: 0,
            },
        };
        let wanted = entries.iter().map(|(n, ip)| (*n, value(ip))).collect();
        let mut m = self.maps()?;
        let mut trie = m.tunnel_endpoints()?;
        sync_trie(&mut trie, map_name::TUNNEL_ENDPOINTS, wanted)
    }

    /// `TUNNEL_ENDPOINTS` as (pod CIDR, node address).
    pub fn tunnel_endpoints(&self) -> Result<Vec<(IpNet, std::net::IpAddr)>> {
        let mut m = self.maps()?;
        let trie = m.tunnel_endpoints()?;
        let mut out = Vec::new();
        for item in trie.iter() {
            let (k, v) = item.map_err(|e| maps::err(map_name::TUNNEL_ENDPOINTS, "read", e))?;
            let net = trie_net(&k);
            let node = std::net::Ipv6Addr::from(v.node);
            let node = if v.flags & TUNNEL_IPV6 == 0 {
                node.to_ipv4_mapped().map_or(node.into(), Into::into)
            } else {
                node.into()
            };
            if let Some(net) = net {
                out.push((net, node));
            }
        }
        out.sort();
        Ok(out)
    }
}

/// Deletes the node's device `name` if it carries our `alias` (`uninstall --purge`);
/// whether it did.
pub(super) fn remove_ours(name: &str, alias: &str) -> Result<bool> {
    crate::kernel::link::runtime()?.block_on(async {
        let nl = Nl::connect()?;
        match nl.link_by_name(name).await? {
            Some(dev) if dev.alias.as_deref() == Some(alias) => {
                nl.del_link(dev.index).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    })
}

/// The trie key of a prefix: IPv4 mapped into IPv6 (a /24 is a /120).
pub(super) fn trie_key(net: &IpNet) -> Key<TunnelKey> {
    let (addr, len) = match net {
        IpNet::V4(n) => (n.network().to_ipv6_mapped().octets(), 96 + n.prefix_len()),
        IpNet::V6(n) => (n.network().octets(), n.prefix_len()),
    };
    Key::new(u32::from(len), TunnelKey { addr })
}

/// The prefix of a trie key ([`trie_key`]'s inverse).
pub(super) fn trie_net(k: &Key<TunnelKey>) -> Option<IpNet> {
    let addr = std::net::Ipv6Addr::from(k.data().addr);
    let len = u8::try_from(k.prefix_len()).unwrap_or(128);
    match addr.to_ipv4_mapped() {
        Some(v4) if len >= 96 => IpNet::new(v4.into(), len - 96),
        _ => IpNet::new(addr.into(), len),
    }
    .ok()
}

/// Makes the LPM trie `trie` (the map `name`) hold exactly `wanted` (prefix → value):
/// new and changed entries written first, then the stale ones removed, so a lookup
/// never misses a prefix that stays. Returns how many entries changed. Linear in the
/// entries (a cluster of 5 000 nodes has as many prefixes per family).
pub(super) fn sync_trie<V: aya::Pod + PartialEq>(
    trie: &mut aya::maps::LpmTrie<&mut aya::maps::MapData, TunnelKey, V>,
    name: &str,
    wanted: std::collections::BTreeMap<IpNet, V>,
) -> Result<usize> {
    let now: std::collections::BTreeMap<IpNet, V> = trie
        .iter()
        .filter_map(std::result::Result::ok)
        .filter_map(|(k, v)| Some((trie_net(&k)?, v)))
        .collect();
    let mut changed = 0;
    for (net, v) in &wanted {
        if now.get(net) == Some(v) {
            continue;
        }
        trie.insert(&trie_key(net), v, 0)
            .map_err(|e| maps::err(name, "insert", e))?;
        changed += 1;
    }
    for net in now.keys().filter(|n| !wanted.contains_key(n)) {
        trie.remove(&trie_key(net))
            .map_err(|e| maps::err(name, "delete", e))?;
        changed += 1;
    }
    Ok(changed)
}
