//! The tunnel between nodes (`crossNode` `tunnel` and `crossSubnet`): the node's VXLAN
//! device runs in external (collect-metadata) mode, so it encapsulates to whatever
//! remote the packet's tunnel key names; these programs set and check that key.
//!
//! - `to_tunnel` (the device's tc egress): everything the node routes to the device (the
//!   agent's routes send other nodes' pod CIDRs there) is given the underlay address of
//!   the node that holds its destination, from `TUNNEL_ENDPOINTS` (longest prefix of the
//!   destination); no node holds it: dropped. Pod addresses stay the pods' own.
//!   A local pod's packet is judged by the pod's NetworkPolicy egress rules first (it
//!   leaves the node here, not by the uplink). Over an IPv4 underlay the program then
//!   encapsulates the packet itself, as the device would, and sends it from the uplink
//!   ([`encap4`]); otherwise the device encapsulates it to its tunnel key.
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
//! straight into the pod. Over an IPv4 underlay `uplink_ingress` already delivers the
//! IPv4 packets of such a flow that GRO would not merge itself, headers taken off, past
//! the device ([`decap4`]); the rest goes through the device, whose receive merges runs
//! of segments.
//! A flow netfilter translates (kube-proxy's DNAT to a pod on another node) reaches the
//! device with another tuple and keeps the kernel path.

use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_tunnel_key, BPF_ADJ_ROOM_ENCAP_L2_SHIFT,
        BPF_F_ADJ_ROOM_ENCAP_L2_ETH, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP,
        BPF_F_ADJ_ROOM_FIXED_GSO, BPF_F_TUNINFO_IPV6, BPF_F_ZERO_CSUM_TX, TC_ACT_OK, TC_ACT_SHOT,
    },
    helpers::{
        bpf_check_mtu, bpf_get_hash_recalc, bpf_get_prandom_u32, bpf_redirect, bpf_skb_change_type,
        bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key,
    },
    maps::lpm_trie::Key,
    programs::TcContext,
    EbpfContext,
};
use cni_ebpf_common::{proto, Addr6, Reason, TunnelEndpoint, TunnelKey, TUNNEL_IPV6};

use crate::{
    family::Family,
    flows,
    forward::{
        self, deliver_verified, PodDelivery, UnderlayHop, BPF_MTU_CHK_RET_SUCCESS, BPF_MTU_CHK_SEGS,
    },
    maps::{count, node_config, TUNNEL_ENDPOINTS, TUNNEL_NODES},
    parse::{
        parse, parse6, read, Iphdr, Pkt, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, IP6_DADDR,
        IP6_SADDR, IP_DADDR, IP_HLEN, IP_OFF, IP_SADDR, IP_TOS, TCP_FLAGS,
    },
    policy,
    uplink::{self, FlowMatch},
    v6, wireguard,
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

/// Whether a packet out of the tunnel with (inner) source `src` may come from the node
/// at underlay address `node` (both IPv4-mapped): a node the agent knows, and `src` its
/// own address or inside a pod CIDR it holds.
#[inline(always)]
fn from_its_node(src: [u8; 16], node: [u8; 16]) -> bool {
    // SAFETY: presence only.
    let known = unsafe { TUNNEL_NODES.get(&TunnelKey { addr: node }) }.is_some();
    known && (src == node || endpoint(src).is_some_and(|ep| ep.node == node))
}

/// Whether the node's NetworkPolicy lets the packet leave (a local pod's: its egress).
#[inline(always)]
fn egress_admitted(ctx: &TcContext) -> bool {
    let Ok(ethertype) = read::<u16>(ctx, ETH_TYPE_OFF) else {
        return false;
    };
    if ethertype == ETH_P_IP.to_be() {
        let (Ok(s), Ok(d)) = (
            read::<u32>(ctx, IP_OFF + IP_SADDR),
            read::<u32>(ctx, IP_OFF + IP_DADDR),
        ) else {
            return false;
        };
        policy::admits_leaving(ctx, s, d, false)
    } else {
        let (Ok(s), Ok(d)) = (
            read::<Addr6>(ctx, IP_OFF + IP6_SADDR),
            read::<Addr6>(ctx, IP_OFF + IP6_DADDR),
        ) else {
            return false;
        };
        policy::admits_leaving(ctx, s, d, true)
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
    if let Some(v) = wireguard::steer_frame(ctx) {
        return v;
    }
    let Some(ep) = endpoint(dst) else {
        count(Reason::DropNoTunnelEndpoint);
        return TC_ACT_SHOT as i32;
    };
    let vni = node_config().map_or(0, |c| c.tunnel_vni);
    count(Reason::TunnelEncap);
    // A pod's flow seen leaving as it was sent: verified, so its later packets are
    // handed from `from_pod` (`from_pod6`) straight to this device.
    seen_leaving(ctx);
    if ep.flags & TUNNEL_IPV6 == 0 {
        let node = u32::from_ne_bytes([ep.node[12], ep.node[13], ep.node[14], ep.node[15]]);
        match encap4(ctx, node, vni) {
            // SAFETY: plain helper call.
            Encap::Sent(uplink) => return unsafe { bpf_redirect(uplink, 0) } as i32,
            Encap::Failed => {
                count(Reason::DropRewriteFailed);
                return TC_ACT_SHOT as i32;
            }
            Encap::NotTaken => {}
        }
    }
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
    TC_ACT_OK as i32
}

/// What [`encap4`] did with the packet.
enum Encap {
    /// Encapsulated, for the uplink of this index.
    Sent(u32),
    /// Left as it was, for the device to encapsulate.
    NotTaken,
    /// Encapsulation failed part-way: the packet is neither the old one nor the new one.
    Failed,
}

/// What the encapsulation over IPv4 adds in front of the inner packet's IP header: the
/// outer IPv4, UDP and VXLAN headers and the inner Ethernet header (the packet's own
/// Ethernet header becomes the outer one).
const ENCAP4_LEN: usize = IP_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
const UDP_HLEN: usize = 8;
const VXLAN_HLEN: usize = 8;
/// The shortest TCP header.
const TCP_HLEN: usize = 20;
/// The VXLAN header's flags word: a valid VNI follows (RFC 7348).
const VXLAN_FLAG_VNI: u8 = 0x08;
/// The source ports the outer UDP header takes, by the hash of the inner flow: the
/// kernel's default local port range, which its VXLAN device uses unless told otherwise.
const SRC_PORT_MIN: u32 = 32768;
const SRC_PORT_MAX: u32 = 60999;
/// TCP's PSH flag: the sender has no more data queued just now.
const TCP_PSH: u8 = 0x08;
/// `bpf_skb_adjust_room` flags: the inner Ethernet header's length, in the top byte.
const ENCAP_L2_ETH_LEN: u64 = (ETH_HLEN as u64) << BPF_ADJ_ROOM_ENCAP_L2_SHIFT;
/// `bpf_skb_store_bytes`: keep a `CHECKSUM_COMPLETE` packet's checksum right.
const BPF_F_RECOMPUTE_CSUM: u64 = 1;
/// ECN bits of the IPv4 TOS byte and IPv6 traffic class, and their "congestion
/// experienced" and "ECT(0)" values (RFC 3168).
const ECN_MASK: u8 = 0x03;
const ECN_CE: u8 = 0x03;
const ECN_ECT0: u8 = 0x02;

/// Encapsulates the packet for `node` (an IPv4 underlay address, network order) itself,
/// as the node's VXLAN device would, and returns the uplink to send it from: no route
/// lookup with a metadata destination, no pass through the device and the node's
/// netfilter hooks for the outer packet. The outer header is what the device writes:
/// the route's preferred source (which must be the node's address, the one the uplink
/// programs recognise as tunnel traffic), UDP to the tunnel port with no checksum and a
/// source port from the inner flow's hash, the inner packet's ECN bits, no "don't
/// fragment", TTL 64. GSO packets stay GSO (`SKB_GSO_UDP_TUNNEL`), segmented where the
/// device they leave by cannot carry them whole.
///
/// Left to the device ([`Encap::NotTaken`], nothing changed): a next hop not resolved
/// yet (the device's own send resolves it), another route or source for that node, a
/// packet whose segments do not fit the tunnel device's MTU or that MTU plus the
/// encapsulation not the uplink's, and a packet too long for a 16-bit length.
/// Not inlined: the headers it builds stay out of `to_tunnel`'s frame.
#[inline(never)]
fn encap4(ctx: &TcContext, node: u32, vni: u32) -> Encap {
    let Some(cfg) = node_config() else {
        return Encap::NotTaken;
    };
    let inner_len = (ctx.len() as usize).saturating_sub(ETH_HLEN);
    if inner_len + ENCAP4_LEN > u16::MAX as usize {
        return Encap::NotTaken;
    }
    let Ok(inner_eth) = read::<[u8; ETH_HLEN]>(ctx, 0) else {
        return Encap::NotTaken;
    };
    let ethertype = u16::from_be_bytes([inner_eth[12], inner_eth[13]]);
    let tos = if ethertype == ETH_P_IP {
        read::<u8>(ctx, IP_OFF + IP_TOS)
    } else if ethertype == ETH_P_IPV6 {
        read::<[u8; 2]>(ctx, IP_OFF).map(|b| (b[0] << 4) | (b[1] >> 4))
    } else {
        return Encap::NotTaken;
    };
    let Ok(tos) = tos else {
        return Encap::NotTaken;
    };
    let mut hop = UnderlayHop::default();
    if !forward::underlay_hop4(ctx, node, &mut hop) || hop.src != cfg.node_addr {
        return Encap::NotTaken;
    }
    let mut tunnel_mtu: u32 = 0;
    // SAFETY: plain helper call with a pointer to our stack (ifindex 0: the tunnel
    // device, where the packet is).
    let fits = unsafe { bpf_check_mtu(ctx.as_ptr(), 0, &mut tunnel_mtu, 0, BPF_MTU_CHK_SEGS) };
    if fits != BPF_MTU_CHK_RET_SUCCESS || tunnel_mtu + ENCAP4_LEN as u32 > hop.mtu {
        return Encap::NotTaken;
    }
    // The inner flow's hash picks the source port, so that the underlay spreads flows
    // as it would the device's packets (the kernel's `udp_flow_src_port`).
    // SAFETY: plain helper call on our packet.
    let hash = unsafe { bpf_get_hash_recalc(ctx.skb.skb) };
    let hash = hash ^ (hash << 16);
    let sport =
        ((u64::from(hash) * u64::from(SRC_PORT_MAX - SRC_PORT_MIN)) >> 32) as u32 + SRC_PORT_MIN;
    // SAFETY: plain helper call.
    let id = unsafe { bpf_get_prandom_u32() } as u16;
    let ecn = tos & ECN_MASK;
    let outer_tos = if ecn == ECN_CE { ECN_ECT0 } else { ecn };

    let mut h = [0u8; ETH_HLEN + ENCAP4_LEN];
    h[..6].copy_from_slice(&hop.dmac);
    h[6..12].copy_from_slice(&hop.smac);
    h[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
    let ip = ETH_HLEN;
    let total = (inner_len + ENCAP4_LEN) as u16;
    h[ip] = 0x45;
    h[ip + 1] = outer_tos;
    h[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
    h[ip + 4..ip + 6].copy_from_slice(&id.to_ne_bytes());
    h[ip + 8] = OUTER_TTL;
    h[ip + 9] = proto::UDP;
    h[ip + 12..ip + 16].copy_from_slice(&hop.src.to_ne_bytes());
    h[ip + 16..ip + 20].copy_from_slice(&node.to_ne_bytes());
    let mut sum: u32 = 0;
    for i in 0..IP_HLEN / 2 {
        sum += u32::from(u16::from_be_bytes([h[ip + 2 * i], h[ip + 2 * i + 1]]));
    }
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    h[ip + 10..ip + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp = ip + IP_HLEN;
    h[udp..udp + 2].copy_from_slice(&(sport as u16).to_be_bytes());
    h[udp + 2..udp + 4].copy_from_slice(&cfg.tunnel_port.to_be_bytes());
    h[udp + 4..udp + 6].copy_from_slice(&(total - IP_HLEN as u16).to_be_bytes());
    let vx = udp + UDP_HLEN;
    h[vx] = VXLAN_FLAG_VNI;
    h[vx + 4..vx + 7].copy_from_slice(&vni.to_be_bytes()[1..]);
    h[vx + VXLAN_HLEN..].copy_from_slice(&inner_eth);

    let flags = u64::from(BPF_F_ADJ_ROOM_FIXED_GSO)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV4)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L4_UDP)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L2_ETH)
        | ENCAP_L2_ETH_LEN;
    if ctx
        .adjust_room(ENCAP4_LEN as i32, BPF_ADJ_ROOM_MAC, flags)
        .is_err()
    {
        return Encap::NotTaken;
    }
    if ctx.store(0, &h, BPF_F_RECOMPUTE_CSUM).is_err() {
        return Encap::Failed;
    }
    Encap::Sent(hop.ifindex)
}

/// Where the headers of a VXLAN packet over IPv4 lie as it arrives on the uplink.
const VXLAN_OFF: usize = IP_OFF + IP_HLEN + UDP_HLEN;
const TUNNELLED_ETH_OFF: usize = VXLAN_OFF + VXLAN_HLEN;
const TUNNELLED_IP_OFF: usize = TUNNELLED_ETH_OFF + ETH_HLEN;
const TUNNELLED_L4_OFF: usize = TUNNELLED_IP_OFF + IP_HLEN;

/// `uplink_ingress` on a VXLAN packet for this node over IPv4 ([`is_underlay`]): when it
/// carries a packet the device and `from_tunnel` would hand straight into a local pod,
/// the program takes the headers off and delivers it itself, past the device's receive
/// (its socket, its per-packet metadata destination, its queue) and a second pass
/// through the node's receive path. Everything else is passed, for the device.
#[inline(never)]
pub(crate) fn decap4(ctx: &TcContext) -> i32 {
    decap4_into_pod(ctx).unwrap_or(crate::PASS)
}

/// [`decap4`]'s delivery, when every condition holds: a plain VXLAN header, an inner
/// IPv4 packet of TCP or UDP without options or fragmentation, outer ECN not "congestion
/// experienced" (which the device would carry into the inner header), for a local pod,
/// in a flow verified both ways (as `from_tunnel`'s fast path requires), sent by a node
/// the agent knows from a source that node holds (as `from_tunnel` checks). A packet
/// merged by GRO already, and a TCP segment of data without PSH (one of a run the
/// device's GRO merges), goes through the device, and so do its flow's packets for a
/// millisecond after it, so that none overtakes it ([`flows::inbound_may_skip_device`]).
/// The pod's NetworkPolicy judges the packet as it would at `from_tunnel`. `None`:
/// nothing was changed.
#[inline(always)]
fn decap4_into_pod(ctx: &TcContext) -> Option<i32> {
    // Merged already (GRO), a packet keeps the tunnel's segmentation state, which only
    // the device can clear on this kernel.
    // SAFETY: reading a field of our own context.
    let mut merged = unsafe { (*ctx.skb.skb).gso_size } != 0;
    let vx: [u8; VXLAN_HLEN] = read(ctx, VXLAN_OFF).ok()?;
    if vx[0] != VXLAN_FLAG_VNI || vx[1] | vx[2] | vx[3] | vx[7] != 0 {
        return None;
    }
    let ethertype: u16 = read(ctx, TUNNELLED_ETH_OFF + ETH_TYPE_OFF).ok()?;
    let outer_tos: u8 = read(ctx, IP_OFF + IP_TOS).ok()?;
    if ethertype != ETH_P_IP.to_be() || outer_tos & ECN_MASK == ECN_CE {
        return None;
    }
    let ip: Iphdr = read(ctx, TUNNELLED_IP_OFF).ok()?;
    let tot_len = u32::from(u16::from_be(ip.tot_len));
    if ip.vihl != 0x45
        || ip.frag_off & 0x3fffu16.to_be() != 0
        || tot_len + TUNNELLED_IP_OFF as u32 > ctx.len()
        || !((ip.proto == proto::TCP && tot_len >= (IP_HLEN + TCP_HLEN) as u32)
            || (ip.proto == proto::UDP && tot_len >= (IP_HLEN + UDP_HLEN) as u32))
    {
        return None;
    }
    let ports: [u16; 2] = read(ctx, TUNNELLED_L4_OFF).ok()?;
    let tcp_flags = if ip.proto == proto::TCP {
        // Data offset and flags.
        let [offset, flags] = read::<[u8; 2]>(ctx, TUNNELLED_L4_OFF + TCP_FLAGS - 1).ok()?;
        let header = u32::from(offset >> 4) * 4;
        // A segment in the middle of a run of data: the device's receive merges it with
        // the next ones (GRO), which costs less than each alone in the pod.
        merged |= tot_len > IP_HLEN as u32 + header && flags & TCP_PSH == 0;
        flags
    } else {
        0
    };
    let p = Pkt {
        saddr: ip.saddr,
        daddr: ip.daddr,
        sport: ports[0],
        dport: ports[1],
        proto: ip.proto,
        icmp_type: 0xff,
        tcp_flags,
        natable: true,
    };
    // The flow first: for a segment the device merges, it is the one lookup made.
    if !flows::inbound_may_skip_device(&p, merged) {
        return None;
    }
    let ep = p.daddr.local_endpoint()?;
    let node = cni_ebpf_common::mapped4(read::<u32>(ctx, IP_OFF + IP_SADDR).ok()?);
    if !from_its_node(cni_ebpf_common::mapped4(p.saddr), node) {
        return None;
    }
    // The outer IPv4, UDP and VXLAN headers and the inner Ethernet header go; the outer
    // Ethernet header, addressed to this node and typed IPv4, stays in front of the
    // inner packet.
    if ctx
        .adjust_room(-(ENCAP4_LEN as i32), BPF_ADJ_ROOM_MAC, 0)
        .is_err()
    {
        return None;
    }
    count(Reason::TunnelDecap);
    count(Reason::RedirectFromUplink);
    Some(forward::deliver(ctx, &ep, PodDelivery::Peer))
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
    if !from_its_node(src, node) {
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
        FlowMatch::Verdict(v) => return v,
        FlowMatch::Route if ipv6 => return uplink::route_out::<Addr6>(ctx),
        FlowMatch::Route => return uplink::route_out::<cni_ebpf_common::Addr4>(ctx),
        FlowMatch::IcmpError | FlowMatch::Underlay | FlowMatch::No => {}
    }
    // For a local pod, in a flow whose packets from the pod were seen leaving
    // untranslated: straight into the pod, judged by its NetworkPolicy on the way.
    policy::begin();
    if v6::is_ipv6(ctx) {
        let v = parse6(ctx).map_or(TC_ACT_OK as i32, |p| into_pod(ctx, &p));
        return policy::settle6(ctx, v);
    }
    let v = parse(ctx).map_or(TC_ACT_OK as i32, |p| into_pod(ctx, &p));
    policy::settle(ctx, v, false)
}

/// `from_tunnel`'s packet `p` into its local pod when its flow is verified
/// ([`deliver_verified`]; for IPv6 `deliver6` arms the NetworkPolicy judgement made once
/// `from_tunnel` returns), else to the stack, noted for [`policy::settle`] when it is
/// for a local pod or, from another node's pod, for one of this node's addresses. Not
/// inlined: the IPv6 tuple does not grow `from_tunnel`'s frame.
#[inline(never)]
fn into_pod<A: Family>(ctx: &TcContext, p: &Pkt<A>) -> i32 {
    if let Some(ep) = p.daddr.local_endpoint() {
        policy::note_to_stack();
        return deliver_verified(ctx, p, &ep).unwrap_or(TC_ACT_OK as i32);
    }
    if p.daddr.is_node_addr() && node_config().is_some_and(|c| p.saddr.in_cluster(c)) {
        policy::note_to_stack();
    }
    TC_ACT_OK as i32
}
