//! Encryption between nodes (`encryption: wireguard`): the programs steer pod traffic for
//! other nodes into the node's WireGuard device, which the agent keeps with every other
//! node's public key, address and pod CIDRs; no route or netfilter rule is involved.
//!
//! A packet is steered where it leaves the node, after NetworkPolicy let it leave: at
//! the uplink's egress (`crossNode: routed`, and the nodes `crossSubnet` reaches
//! directly) and at the tunnel device's egress (the tunnel modes: WireGuard carries the
//! packet in place of VXLAN). Everything a pod sends to another node passes one of the
//! two, whether the programs redirected it there (the fast path) or the kernel routed it
//! (kube-proxy's DNAT to a pod on another node, the node's own traffic through the
//! tunnel's gateway address).
//!
//! Steered: a packet from a cluster address (a pod, or the tunnel device's gateway
//! address) to a cluster address the node does not hold. `WIREGUARD_PEERS` (longest
//! prefix of the destination) says which node holds it and whether that node has a key:
//! keyed, the packet goes to the WireGuard device (`wireguard_encrypt`), which picks
//! the peer by its allowed prefixes (the same pod CIDRs) and sends it encrypted from
//! its UDP port; no key, or no node known to hold it: dropped
//! (`drop_no_wireguard_key`), or with `encryptionStrict: false` left to leave as it
//! would have (`wireguard_clear_to_keyless`). The node's own traffic from its own
//! addresses (kubelet, NodePort traffic sent on from the node's address) is not pod
//! traffic and is left alone.
//!
//! The WireGuard packets themselves (UDP from or to the node's address on the device's
//! port) are passed by the uplink programs at once, as the tunnel's are.

use aya_ebpf::{
    bindings::TC_ACT_SHOT, helpers::bpf_redirect, maps::lpm_trie::Key, programs::TcContext,
};
use cni_ebpf_common::{proto, Addr6, NodeFlags, Reason, TunnelKey, WIREGUARD_KEYED};

use crate::{
    family::Family,
    maps::{count, node_config, WIREGUARD_PEERS},
    parse::{
        read, Pkt, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, IP6_DADDR, IP6_SADDR, IP_DADDR, IP_OFF,
        IP_SADDR,
    },
};

/// Whether `p`, seen on the uplink, is the node's own WireGuard traffic: UDP from
/// (leaving) or to (arriving) the device's port, with `node_side` the node's address.
#[inline(always)]
pub(crate) fn is_underlay<A: Family>(p: &Pkt<A>, node_side: A, leaving: bool) -> bool {
    let Some(cfg) = node_config() else {
        return false;
    };
    let port = if leaving { p.sport } else { p.dport };
    cfg.wireguard_port != 0
        && p.proto == proto::UDP
        && u16::from_be(port) == cfg.wireguard_port
        && A::masquerade_addr(cfg) == Some(node_side)
}

/// The verdict for a packet from `src` to `dst` leaving the node, when encryption has
/// one: the WireGuard device, or dropped for a node without a key. `None`: leave it to
/// the path it was on.
#[inline(always)]
pub(crate) fn steer<A: Family>(src: A, dst: A) -> Option<i32> {
    let cfg = node_config()?;
    if !cfg.flags.contains(NodeFlags::WIREGUARD) || cfg.wireguard_ifindex == 0 {
        return None;
    }
    if !src.in_cluster(cfg) || !dst.in_cluster(cfg) {
        return None;
    }
    let keyed = WIREGUARD_PEERS
        .get(&Key::new(128, TunnelKey { addr: dst.wire() }))
        .is_some_and(|p| p.flags & WIREGUARD_KEYED != 0);
    if keyed {
        count(Reason::WireguardEncrypt);
        // SAFETY: plain helper call. The device is L3: the kernel takes the Ethernet
        // header off on the way.
        return Some(unsafe { bpf_redirect(cfg.wireguard_ifindex, 0) } as i32);
    }
    if cfg.flags.contains(NodeFlags::WIREGUARD_CLEAR_TO_KEYLESS) {
        count(Reason::WireguardClearToKeyless);
        return None;
    }
    count(Reason::DropNoWireguardKey);
    Some(TC_ACT_SHOT as i32)
}

/// [`steer`] for an Ethernet frame whose family is read from it (the tunnel device's
/// egress); anything but IPv4 and IPv6 is left alone.
#[inline(always)]
pub(crate) fn steer_frame(ctx: &TcContext) -> Option<i32> {
    let ethertype: u16 = read(ctx, ETH_TYPE_OFF).ok()?;
    if ethertype == ETH_P_IP.to_be() {
        let s: u32 = read(ctx, IP_OFF + IP_SADDR).ok()?;
        let d: u32 = read(ctx, IP_OFF + IP_DADDR).ok()?;
        steer(s, d)
    } else if ethertype == ETH_P_IPV6.to_be() {
        let s: Addr6 = read(ctx, IP_OFF + IP6_SADDR).ok()?;
        let d: Addr6 = read(ctx, IP_OFF + IP6_DADDR).ok()?;
        steer(s, d)
    } else {
        None
    }
}
