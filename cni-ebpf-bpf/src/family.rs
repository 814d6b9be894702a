//! What differs between IPv4 and IPv6 for the flow logic: the address type, the maps keyed
//! by it, the ICMP numbers, the node facts looked up by address, and the few steps that
//! read or route a frame of the family (parsing, the FIB, ICMP errors).
//!
//! The NAT rules (port search, close tracking, shares, sweep), the flow tracking next to
//! netfilter and masquerade are written once, generic over [`Family`], which is
//! implemented by the address types themselves ([`Addr4`], [`Addr6`]): a key or a parsed
//! packet names its family through its address type, so every call infers it.

use aya_ebpf::{
    maps::{HashMap, LruHashMap},
    programs::TcContext,
};
use cni_ebpf_common::{
    proto, Addr4, Addr6, EndpointFlags, EndpointInfo, EndpointKey6, FlowEntry, NatDestKeyOf,
    NatEntryOf, NatKeyOf, NodeConfig, Reason, SockKeyOf, SockPeerOf, MAX_CLUSTER_CIDRS,
};

use crate::{
    forward::{deliver, deliver6, route_out, route_out6, to_uplink, to_uplink6, PodDelivery},
    icmp, icmp6,
    maps::{
        in_cluster, is_node_addr, local_endpoint, port_mapping, port_mapping6, ENDPOINTS6, FLOWS,
        FLOWS6, NAT, NAT6, NAT_DEST_USE, NAT_DEST_USE6, NODE_ADDRS6, NODE_CONFIG6, STACK_SOCKETS,
        STACK_SOCKETS6,
    },
    parse::{parse, parse6, Pkt, ICMP6_ECHO_REQUEST, ICMP_ECHO},
    rewrite,
};

/// An address family, implemented by its address type (wire order).
pub(crate) trait Family: Copy + PartialEq + Default + 'static {
    /// Whether this is IPv6 (for the calls that read the packet's tuple themselves).
    const IPV6: bool;
    /// The ICMP protocol number of the family (`ICMP` or `ICMPV6`).
    const ICMP: u8;
    /// The ICMP type of an echo request.
    const ECHO_REQUEST: u8;
    /// The `NAT_USE` key of the sweep clock of this family's NAT table.
    const SWEEP_CLOCK: u32;
    /// A sweep asked for deep in a path is only noted, and run by the next packet at the
    /// top of its program (`nat::sweep_if_requested`): the IPv6 frames leave no room for
    /// the sweep's callback under them within the verifier's 512 bytes.
    const SWEEP_DEFERRED: bool;

    /// The family's NAT table.
    fn nat() -> &'static HashMap<NatKeyOf<Self>, NatEntryOf<Self>>;
    /// SNAT ports each pod holds towards each destination (see `nat::dest_room`).
    fn nat_dest_use() -> &'static HashMap<NatDestKeyOf<Self>, u32>;
    /// Pod flows and whether each may bypass the stack (see `flows`).
    fn flows() -> &'static LruHashMap<NatKeyOf<Self>, FlowEntry>;
    /// Pod sockets that talk through the stack, and their peer (see `flows`).
    fn stack_sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockPeerOf<Self>>;

    /// The local pod with this address, if it is active.
    fn local_endpoint(self) -> Option<EndpointInfo>;
    /// Whether this is one of the node's own addresses.
    fn is_node_addr(self) -> bool;
    /// Whether this address is inside `clusterCIDRs`.
    fn in_cluster(self, cfg: &NodeConfig) -> bool;
    /// The node address masqueraded flows leave with, if the node has one.
    fn masquerade_addr(cfg: &NodeConfig) -> Option<Self>;
    /// Whether `self:port` (network order) is a host port of protocol `proto_`.
    fn is_host_port(self, port: u16, proto_: u8) -> bool;
    /// The pod address and port behind host port `self:port` of `proto_`, if there is one.
    fn host_port_target(self, port: u16, proto_: u8) -> Option<(Self, u16)>;
    /// Delivers the packet into local pod `ep` (past the node's stack), as `how` can.
    fn deliver(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery) -> i32;

    /// Rewrites packet `p`'s tuple into `n`'s in place, with every checksum the family
    /// has. `Err` when a step failed (see `rewrite::apply`).
    fn rewrite(ctx: &TcContext, p: &Pkt<Self>, n: &NatEntryOf<Self>) -> Result<(), i64>;

    /// The headers of a frame of this family (`Err`: why the packet is passed).
    fn parse(ctx: &TcContext) -> Result<Pkt<Self>, Reason>;
    /// A pod's packet leaving the node: straight to the uplink (or the tunnel device) the
    /// family's FIB names, else to the stack (see `forward::to_uplink`).
    fn to_uplink(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32, own_source: bool) -> i32;
    /// A translated packet from outside (or its reply), its source a node address: routed
    /// out as the family's FIB says (see `forward::route_out`).
    fn route_out(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32) -> i32;
    /// The address in the one layout of both families (IPv6, or IPv4-mapped), wire order.
    fn wire(self) -> [u8; 16];
    /// The address of this family in `b` (that layout), if it is one.
    fn from_wire(b: &[u8; 16]) -> Option<Self>;
    /// The address as `struct bpf_fib_lookup` holds it (IPv4: the first word).
    fn words(self) -> [u32; 4];
    /// The address from `struct bpf_fib_lookup`'s words.
    fn from_words(w: [u32; 4]) -> Self;
    /// Whether `p` is an ICMP error of the family (about a packet sent).
    fn is_icmp_error(p: &Pkt<Self>) -> bool;
    /// An ICMP error arriving at the uplink, about a translated flow or not (see
    /// `icmp::icmp_error_in`).
    fn icmp_error_in(ctx: &TcContext, p: &Pkt<Self>) -> i32;
}

impl Family for Addr4 {
    const IPV6: bool = false;
    const ICMP: u8 = proto::ICMP;
    const ECHO_REQUEST: u8 = ICMP_ECHO;
    const SWEEP_CLOCK: u32 = 0;
    const SWEEP_DEFERRED: bool = false;

    #[inline(always)]
    fn nat() -> &'static HashMap<NatKeyOf<Self>, NatEntryOf<Self>> {
        &NAT
    }

    #[inline(always)]
    fn nat_dest_use() -> &'static HashMap<NatDestKeyOf<Self>, u32> {
        &NAT_DEST_USE
    }

    #[inline(always)]
    fn flows() -> &'static LruHashMap<NatKeyOf<Self>, FlowEntry> {
        &FLOWS
    }

    #[inline(always)]
    fn stack_sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockPeerOf<Self>> {
        &STACK_SOCKETS
    }

    #[inline(always)]
    fn local_endpoint(self) -> Option<EndpointInfo> {
        local_endpoint(self)
    }

    #[inline(always)]
    fn is_node_addr(self) -> bool {
        is_node_addr(self)
    }

    #[inline(always)]
    fn in_cluster(self, cfg: &NodeConfig) -> bool {
        in_cluster(cfg, self)
    }

    #[inline(always)]
    fn masquerade_addr(cfg: &NodeConfig) -> Option<Self> {
        (cfg.node_addr != 0).then_some(cfg.node_addr)
    }

    #[inline(always)]
    fn is_host_port(self, port: u16, proto_: u8) -> bool {
        port_mapping(self, port, proto_).is_some()
    }

    #[inline(always)]
    fn host_port_target(self, port: u16, proto_: u8) -> Option<(Self, u16)> {
        port_mapping(self, port, proto_).map(|t| (t.addr, t.port))
    }

    #[inline(always)]
    fn deliver(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery) -> i32 {
        deliver(ctx, ep, how)
    }

    #[inline(always)]
    fn rewrite(ctx: &TcContext, p: &Pkt<Self>, n: &NatEntryOf<Self>) -> Result<(), i64> {
        rewrite::rewrite(ctx, p, n)
    }

    #[inline(always)]
    fn parse(ctx: &TcContext) -> Result<Pkt<Self>, Reason> {
        parse(ctx)
    }

    #[inline(always)]
    fn to_uplink(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32, own_source: bool) -> i32 {
        to_uplink(ctx, p, ifindex, own_source)
    }

    #[inline(always)]
    fn route_out(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32) -> i32 {
        route_out(ctx, p, ifindex)
    }

    #[inline(always)]
    fn wire(self) -> [u8; 16] {
        cni_ebpf_common::mapped4(self)
    }

    #[inline(always)]
    fn from_wire(b: &[u8; 16]) -> Option<Self> {
        cni_ebpf_common::unmapped4(b)
    }

    #[inline(always)]
    fn words(self) -> [u32; 4] {
        [self, 0, 0, 0]
    }

    #[inline(always)]
    fn from_words(w: [u32; 4]) -> Self {
        w[0]
    }

    #[inline(always)]
    fn is_icmp_error(p: &Pkt<Self>) -> bool {
        icmp::is_error(p)
    }

    #[inline(always)]
    fn icmp_error_in(ctx: &TcContext, p: &Pkt<Self>) -> i32 {
        icmp::icmp_error_in(ctx, p)
    }
}

impl Family for Addr6 {
    const IPV6: bool = true;
    const ICMP: u8 = proto::ICMPV6;
    const ECHO_REQUEST: u8 = ICMP6_ECHO_REQUEST;
    // Never an ifindex (those are positive `int`s), nor key 0 (IPv4's clock).
    const SWEEP_CLOCK: u32 = u32::MAX;
    const SWEEP_DEFERRED: bool = true;

    #[inline(always)]
    fn nat() -> &'static HashMap<NatKeyOf<Self>, NatEntryOf<Self>> {
        &NAT6
    }

    #[inline(always)]
    fn nat_dest_use() -> &'static HashMap<NatDestKeyOf<Self>, u32> {
        &NAT_DEST_USE6
    }

    #[inline(always)]
    fn flows() -> &'static LruHashMap<NatKeyOf<Self>, FlowEntry> {
        &FLOWS6
    }

    #[inline(always)]
    fn stack_sockets() -> &'static LruHashMap<SockKeyOf<Self>, SockPeerOf<Self>> {
        &STACK_SOCKETS6
    }

    #[inline(always)]
    fn local_endpoint(self) -> Option<EndpointInfo> {
        // SAFETY: the value is copied out at once.
        let ep = unsafe { ENDPOINTS6.get(EndpointKey6 { addr: self }) }.copied()?;
        ep.flags.contains(EndpointFlags::ACTIVE).then_some(ep)
    }

    #[inline(always)]
    fn is_node_addr(self) -> bool {
        // SAFETY: only presence is read.
        unsafe { NODE_ADDRS6.get(self) }.is_some()
    }

    /// The IPv6 prefixes are in `NODE_CONFIG6`, not in `_cfg`.
    #[inline(always)]
    fn in_cluster(self, _cfg: &NodeConfig) -> bool {
        let Some(c6) = NODE_CONFIG6.get(0) else {
            return false;
        };
        let n = c6.n_cidrs as usize;
        for i in 0..MAX_CLUSTER_CIDRS {
            if i >= n {
                break;
            }
            if c6.cluster_cidrs[i].contains(&self) {
                return true;
            }
        }
        false
    }

    #[inline(always)]
    fn masquerade_addr(_cfg: &NodeConfig) -> Option<Self> {
        let a = NODE_CONFIG6.get(0)?.node_addr;
        (a != [0; 4]).then_some(a)
    }

    #[inline(always)]
    fn is_host_port(self, port: u16, proto_: u8) -> bool {
        port_mapping6(self, port, proto_).is_some()
    }

    #[inline(always)]
    fn host_port_target(self, port: u16, proto_: u8) -> Option<(Self, u16)> {
        port_mapping6(self, port, proto_).map(|t| (t.addr, t.port))
    }

    #[inline(always)]
    fn deliver(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery) -> i32 {
        deliver6(ctx, ep, how)
    }

    #[inline(always)]
    fn rewrite(ctx: &TcContext, p: &Pkt<Self>, n: &NatEntryOf<Self>) -> Result<(), i64> {
        rewrite::rewrite6(ctx, p, n)
    }

    #[inline(always)]
    fn parse(ctx: &TcContext) -> Result<Pkt<Self>, Reason> {
        parse6(ctx)
    }

    #[inline(always)]
    fn to_uplink(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32, own_source: bool) -> i32 {
        to_uplink6(ctx, p, ifindex, own_source)
    }

    #[inline(always)]
    fn route_out(ctx: &TcContext, p: &Pkt<Self>, ifindex: u32) -> i32 {
        route_out6(ctx, p, ifindex)
    }

    #[inline(always)]
    fn wire(self) -> [u8; 16] {
        cni_ebpf_common::bytes6(&self)
    }

    #[inline(always)]
    fn from_wire(b: &[u8; 16]) -> Option<Self> {
        // An IPv4-mapped address is IPv4's.
        cni_ebpf_common::unmapped4(b)
            .is_none()
            .then(|| cni_ebpf_common::addr6(b))
    }

    #[inline(always)]
    fn words(self) -> [u32; 4] {
        self
    }

    #[inline(always)]
    fn from_words(w: [u32; 4]) -> Self {
        w
    }

    #[inline(always)]
    fn is_icmp_error(p: &Pkt<Self>) -> bool {
        icmp6::is_error(p)
    }

    #[inline(always)]
    fn icmp_error_in(ctx: &TcContext, p: &Pkt<Self>) -> i32 {
        icmp6::error_in(ctx, p)
    }
}
