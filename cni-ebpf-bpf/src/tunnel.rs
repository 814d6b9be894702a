//! The tunnel between nodes (`crossNode` `tunnel` and `crossSubnet`): the node's VXLAN
//! device runs in external (collect-metadata) mode, so it encapsulates to whatever
//! remote the packet's tunnel key names; these programs set and check that key.
//!
//! - `to_tunnel` (the device's tc egress): everything the node routes to the device (the
//!   agent's routes send other nodes' pod CIDRs there) is given the underlay address of
//!   the node that holds its destination, from `TUNNEL_ENDPOINTS` (longest prefix of the
//!   destination); no node holds it: dropped. Pod addresses stay the pods' own.
//!   A local pod's packet is judged by the pod's NetworkPolicy egress rules first (it
//!   leaves the node here, not by the uplink).
//! - `from_tunnel` (the device's tc ingress): a decapsulated packet passes when it comes
//!   from a node the agent knows (`TUNNEL_NODES`) and its source is that node's address
//!   (the node's own traffic) or inside a pod CIDR that `TUNNEL_ENDPOINTS` says that node
//!   holds; anything else is a forged source and is dropped. It is then marked as
//!   addressed to this host (the device has no neighbours: the sender's kernel put its
//!   own device's MAC as destination), and the node routes it to the pod, through
//!   `to_pod` and its NetworkPolicy check. The reply of a Service flow from outside that
//!   this node sent on to a backend on the sending node goes back to its client
//!   (`nodeport`).
//!
//! The fast path, both families, as through the uplink (`flows`): once `to_tunnel` has
//! seen a pod's flow leave as the pod sent it, `from_pod` (`from_pod6`) hands its later
//! packets straight to the device, and `from_tunnel` delivers the other direction
//! straight into the pod.
//! A flow netfilter translates (kube-proxy's DNAT to a pod on another node) reaches the
//! device with another tuple and keeps the kernel path.

use aya_ebpf::{
    bindings::{bpf_tunnel_key, BPF_F_TUNINFO_IPV6, BPF_F_ZERO_CSUM_TX, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_skb_change_type, bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use cni_ebpf_common::{proto, Addr6, Reason, TunnelEndpoint, TunnelKey, TUNNEL_IPV6};

use crate::{
    family::Family,
    flows,
    forward::deliver_verified,
    maps::{count, node_config, TUNNEL_ENDPOINTS, TUNNEL_NODES},
    parse::{
        parse, parse6, read, Pkt, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, IP6_DADDR, IP6_SADDR,
        IP_DADDR, IP_OFF, IP_SADDR,
    },
    policy,
    uplink::{self, Known},
    v6,
};

/// Whether `p`, seen on the uplink, is the node's own tunnel traffic: UDP to the tunnel
/// port, with `node_side` (its source leaving, its destination arriving) the node's
/// address. The uplink programs pass it at once: it carries no pod flow of its own (the
/// flows inside are judged at the tunnel device), no host port or masqueraded flow can
/// use that port (the SNAT range leaves it out, a host port on it is refused), and every
/// lookup they would make for it is a miss paid on each packet of every cross-node flow.
#[inline(always)]
pub(crate) fn is_underlay<A: Family>(p: &Pkt<A>, node_side: A) -> bool {
    let Some(cfg) = node_config() else {
        return false;
    };
    cfg.tunnel_port != 0
        && p.proto == proto::UDP
        && u16::from_be(p.dport) == cfg.tunnel_port
        && A::masquerade_addr(cfg) == Some(node_side)
}

/// `PACKET_HOST` (`skb->pkt_type` of a packet addressed to this host).
const PACKET_HOST: u32 = 0;
/// Hop limit of the outer header.
const OUTER_TTL: u8 = 64;

/// The inner packet's source (`source`) or destination address as a trie key: IPv4
/// mapped into IPv6. `None` for anything but IPv4 and IPv6.
#[inline(always)]
fn inner_addr(ctx: &TcContext, source: bool) -> Option<[u8; 16]> {
    let ethertype: u16 = read(ctx, ETH_TYPE_OFF).ok()?;
    if ethertype == ETH_P_IP.to_be() {
        let off = if source { IP_SADDR } else { IP_DADDR };
        let a: u32 = read(ctx, IP_OFF + off).ok()?;
        Some(cni_ebpf_common::mapped4(a))
    } else if ethertype == ETH_P_IPV6.to_be() {
        let off = if source { IP6_SADDR } else { IP6_DADDR };
        let a: [u8; 16] = read(ctx, IP_OFF + off).ok()?;
        Some(a)
    } else {
        None
    }
}

#[inline(always)]
fn endpoint(addr: [u8; 16]) -> Option<&'static TunnelEndpoint> {
    TUNNEL_ENDPOINTS.get(&Key::new(128, TunnelKey { addr }))
}

/// Whether the node's NetworkPolicy lets the packet leave (a local pod's: its egress).
#[inline(always)]
fn egress_admitted(ctx: &TcContext) -> bool {
    let Ok(ethertype) = read::<u16>(ctx, ETH_TYPE_OFF) else {
        return false;
    };
    if ethertype == ETH_P_IP.to_be() {
        read::<u32>(ctx, IP_OFF + IP_SADDR).is_ok_and(|s| policy::admits_leaving(ctx, s, false))
    } else {
        read::<Addr6>(ctx, IP_OFF + IP6_SADDR).is_ok_and(|s| policy::admits_leaving(ctx, s, true))
    }
}

/// `to_tunnel`: the tunnel key of the node that holds the destination.
#[inline(always)]
pub(crate) fn to_tunnel(ctx: &TcContext) -> i32 {
    let Some(dst) = inner_addr(ctx, false) else {
        return TC_ACT_SHOT as i32;
    };
    if !egress_admitted(ctx) {
        return TC_ACT_SHOT as i32;
    }
    let Some(ep) = endpoint(dst) else {
        count(Reason::DropNoTunnelEndpoint);
        return TC_ACT_SHOT as i32;
    };
    let vni = node_config().map_or(0, |c| c.tunnel_vni);
    // SAFETY: an all-zero `bpf_tunnel_key` is valid (integers and unions of integers).
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    key.tunnel_id = vni;
    key.tunnel_ttl = OUTER_TTL;
    let flags = if ep.flags & TUNNEL_IPV6 != 0 {
        let mut words = [0u32; 4];
        for (i, w) in words.iter_mut().enumerate() {
            *w = u32::from_ne_bytes([
                ep.node[4 * i],
                ep.node[4 * i + 1],
                ep.node[4 * i + 2],
                ep.node[4 * i + 3],
            ]);
        }
        key.__bindgen_anon_1.remote_ipv6 = words;
        u64::from(BPF_F_TUNINFO_IPV6)
    } else {
        // The helper takes the IPv4 remote in host order.
        key.__bindgen_anon_1.remote_ipv4 =
            u32::from_be_bytes([ep.node[12], ep.node[13], ep.node[14], ep.node[15]]);
        // No outer UDP checksum over IPv4, as the kernel's VXLAN device sends by default
        // (RFC 7348): the inner packet carries its own. Over IPv6 the checksum stays,
        // which receivers require unless told otherwise (RFC 6935).
        u64::from(BPF_F_ZERO_CSUM_TX)
    };
    // SAFETY: `key` is a `bpf_tunnel_key` on our stack, its size passed along.
    let rc = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            &mut key,
            core::mem::size_of::<bpf_tunnel_key>() as u32,
            flags,
        )
    };
    if rc != 0 {
        count(Reason::DropNoTunnelEndpoint);
        return TC_ACT_SHOT as i32;
    }
    count(Reason::TunnelEncap);
    // A pod's flow seen leaving as it was sent: verified, so its later packets are
    // handed from `from_pod` (`from_pod6`) straight to this device.
    seen_leaving(ctx);
    TC_ACT_OK as i32
}

/// [`flows::seen_leaving`] for the packet `to_tunnel` sends, of either family. A
/// function of its own: the IPv6 tuple does not grow `to_tunnel`'s frame.
#[inline(never)]
fn seen_leaving(ctx: &TcContext) {
    if v6::is_ipv6(ctx) {
        if let Ok(p) = parse6(ctx) {
            let _ = flows::seen_leaving(&p);
        }
    } else if let Ok(p) = parse(ctx) {
        let _ = flows::seen_leaving(&p);
    }
}

/// The underlay address the packet in `ctx` came from (IPv4 mapped), from its tunnel key.
#[inline(always)]
fn sender(ctx: &TcContext) -> Option<[u8; 16]> {
    // SAFETY: as in `to_tunnel`.
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<bpf_tunnel_key>() as u32;
    // SAFETY: `key` is on our stack, its size passed along.
    if unsafe { bpf_skb_get_tunnel_key(ctx.skb.skb, &mut key, size, 0) } == 0 {
        // SAFETY: the IPv4 member was written.
        let a = unsafe { key.__bindgen_anon_1.remote_ipv4 };
        return Some(cni_ebpf_common::mapped4(a.to_be()));
    }
    // SAFETY: as above.
    let rc = unsafe {
        bpf_skb_get_tunnel_key(ctx.skb.skb, &mut key, size, u64::from(BPF_F_TUNINFO_IPV6))
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: the IPv6 member was written.
    let words: Addr6 = unsafe { key.__bindgen_anon_1.remote_ipv6 };
    let mut out = [0u8; 16];
    for i in 0..4 {
        let b = words[i].to_ne_bytes();
        out[4 * i..4 * i + 4].copy_from_slice(&b);
    }
    Some(out)
}

/// `from_tunnel`: the packet's source must be the sending node or one of its pods.
#[inline(always)]
pub(crate) fn from_tunnel(ctx: &TcContext) -> i32 {
    let (Some(src), Some(node)) = (inner_addr(ctx, true), sender(ctx)) else {
        count(Reason::DropTunnelSpoofed);
        return TC_ACT_SHOT as i32;
    };
    // SAFETY: presence only.
    let known = unsafe { TUNNEL_NODES.get(&TunnelKey { addr: node }) }.is_some();
    let from_its_node = known && (src == node || endpoint(src).is_some_and(|ep| ep.node == node));
    if !from_its_node {
        count(Reason::DropTunnelSpoofed);
        return TC_ACT_SHOT as i32;
    }
    // SAFETY: plain helper call on our packet.
    if unsafe { bpf_skb_change_type(ctx.skb.skb, PACKET_HOST) } != 0 {
        return TC_ACT_SHOT as i32;
    }
    count(Reason::TunnelDecap);
    // The reply of a Service flow from outside that this node sent on to a backend on
    // the sending node: back to its client.
    let ipv6 = v6::is_ipv6(ctx);
    let reply = if ipv6 {
        uplink::tunnel_service_reply::<Addr6>(ctx)
    } else {
        uplink::tunnel_service_reply::<cni_ebpf_common::Addr4>(ctx)
    };
    match reply {
        Known::Verdict(v) => return v,
        Known::Route if ipv6 => return uplink::route_out::<Addr6>(ctx),
        Known::Route => return uplink::route_out::<cni_ebpf_common::Addr4>(ctx),
        Known::IcmpError | Known::No => {}
    }
    // For a local pod, in a flow whose packets from the pod were seen leaving
    // untranslated: straight into the pod, judged by its NetworkPolicy on the way.
    if v6::is_ipv6(ctx) {
        policy::forget_delivery();
        let v = parse6(ctx).map_or(TC_ACT_OK as i32, |p| into_pod(ctx, &p));
        return policy::judge_delivery6(ctx, v);
    }
    parse(ctx).map_or(TC_ACT_OK as i32, |p| into_pod(ctx, &p))
}

/// `from_tunnel`'s packet `p` into its local pod when its flow is verified
/// ([`deliver_verified`]; for IPv6 `deliver6` arms the NetworkPolicy judgement made once
/// `from_tunnel` returns), else to the stack. Not inlined: the IPv6 tuple does not grow
/// `from_tunnel`'s frame.
#[inline(never)]
fn into_pod<A: Family>(ctx: &TcContext, p: &Pkt<A>) -> i32 {
    p.daddr
        .local_endpoint()
        .and_then(|ep| deliver_verified(ctx, p, &ep))
        .unwrap_or(TC_ACT_OK as i32)
}
