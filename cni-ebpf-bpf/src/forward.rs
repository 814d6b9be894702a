//! Forwarding without the kernel's forwarding path: one routed hop in place, then
//! `bpf_redirect_peer` into a local pod or `bpf_redirect` to the uplink.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as bpf_fib_lookup_t, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SKIP_NEIGH, BPF_FIB_LOOKUP_SRC, TC_ACT_OK, TC_ACT_SHOT,
    },
    helpers::{bpf_check_mtu, bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer},
    programs::TcContext,
    EbpfContext,
};
use cni_ebpf_common::{proto, Addr6, EndpointInfo, NodeConfig, Reason};

use crate::{
    family::Family,
    flows,
    maps::{add_stats, count, node_config},
    parse::{read, Pkt, IP6_HOP_LIMIT, IP_CSUM, IP_HLEN, IP_OFF, IP_PROTO, IP_TOS, IP_TTL},
    policy, PASS,
};

/// Routes the packet one hop in place: TTL decremented (header checksum fixed) and the
/// Ethernet addresses set to `dst`/`src`. `false` when the TTL would expire (counted; the
/// stack then sends the ICMP error) or the packet could not be written.
#[inline(always)]
pub(crate) fn route_hop(ctx: &TcContext, dst: &[u8; 6], src: &[u8; 6]) -> bool {
    let start = ctx.data();
    if start + IP_OFF + IP_HLEN > ctx.data_end() {
        return route_hop_slow(ctx, dst, src);
    }
    let ip = (start + IP_OFF) as *mut u8;
    // SAFETY: the Ethernet and IPv4 headers are within [data, data_end), checked above;
    // byte accesses only (no alignment), and the skb is made writable by the verifier's
    // direct-write prologue.
    unsafe {
        let ttl = *ip.add(8);
        if ttl <= 1 {
            count(Reason::PassTtlExpired);
            return false;
        }
        *ip.add(8) = ttl - 1;
        // RFC 1624 incremental update for the TTL byte (high byte of its 16-bit word)
        // going down by one, as the kernel's ip_decrease_ttl.
        let c = u16::from_be_bytes([*ip.add(10), *ip.add(11)]) as u32 + 0x0100;
        let c = ((c & 0xffff) + (c >> 16)) as u16;
        let [hi, lo] = c.to_be_bytes();
        *ip.add(10) = hi;
        *ip.add(11) = lo;
        let eth = start as *mut u8;
        for i in 0..6 {
            *eth.add(i) = dst[i];
            *eth.add(6 + i) = src[i];
        }
    }
    true
}

/// [`route_hop`] through helpers, for headers outside the packet's linear part.
#[inline(always)]
pub(crate) fn route_hop_slow(ctx: &TcContext, dst: &[u8; 6], src: &[u8; 6]) -> bool {
    let Ok(ttl) = ctx.load::<u8>(IP_OFF + IP_TTL) else {
        return false;
    };
    let Ok(ip_proto) = ctx.load::<u8>(IP_OFF + IP_PROTO) else {
        return false;
    };
    if ttl <= 1 {
        count(Reason::PassTtlExpired);
        return false;
    }
    let old = u16::from_ne_bytes([ttl, ip_proto]);
    let new = u16::from_ne_bytes([ttl - 1, ip_proto]);
    if ctx.store(IP_OFF + IP_TTL, &(ttl - 1), 0).is_err()
        || ctx
            .l3_csum_replace(IP_OFF + IP_CSUM, old as u64, new as u64, 2)
            .is_err()
    {
        return false;
    }
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(dst);
    macs[6..].copy_from_slice(src);
    ctx.store(0, &macs, 0).is_ok()
}

/// Where the program handing a packet into a local pod runs, which decides how it can.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodDelivery {
    /// At a tc ingress hook (a host veth's, the uplink's, the tunnel device's):
    /// `bpf_redirect_peer` puts the packet straight into the pod's namespace.
    Peer,
    /// In a netkit pod's transmit path, where the kernel refuses `bpf_redirect_peer`:
    /// `bpf_redirect` to the destination pod's host device, whose own transmit hands
    /// it to its pod (through `to_pod`, or `to_netkit` for a netkit pod).
    Transmit,
}

/// Redirects the packet to pod `ep` as `how` can.
#[inline(always)]
fn redirect_into(ep: &EndpointInfo, how: PodDelivery) -> i32 {
    // SAFETY: plain helper calls.
    unsafe {
        match how {
            PodDelivery::Peer => bpf_redirect_peer(ep.ifindex, 0) as i32,
            PodDelivery::Transmit => bpf_redirect(ep.ifindex, 0) as i32,
        }
    }
}

/// Delivers the packet (whose destination is a local pod) straight into that pod:
/// one routed hop, then a redirect as `how` can. TTL expiry goes to the stack. A packet
/// the node's NetworkPolicy refuses is dropped (see [`policy::admits_delivery`]).
#[inline(always)]
pub(crate) fn deliver(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery) -> i32 {
    if !policy::admits_delivery(ctx, ep.ifindex, ep.owner, false) {
        return TC_ACT_SHOT as i32;
    }
    if !route_hop(ctx, &ep.pod_mac, &ep.host_mac) {
        return TC_ACT_OK as i32;
    }
    add_stats(ep.ifindex, ctx.len(), true);
    let how = through_to_pod(ctx, ep, how, false);
    if matches!(how, PodDelivery::Peer) {
        // Past the pod's host veth: followed by the program, not by `to_pod`.
        policy::note_delivered(ep.ifindex);
    }
    redirect_into(ep, how)
}

/// `how`, or [`PodDelivery::Transmit`] (through the pod's host veth, whose `to_pod`
/// reads it) for a DNS answer the pod's egress rules want read
/// ([`crate::dns::wants_reading`]).
#[inline(always)]
fn through_to_pod(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery, ipv6: bool) -> PodDelivery {
    if crate::dns::wants_reading(ctx, ep.ifindex, ipv6) {
        PodDelivery::Transmit
    } else {
        how
    }
}

/// A packet for local pod `ep` (from the uplink or out of the tunnel) in a flow whose
/// other direction was verified to leave untranslated ([`flows::inbound_may_bypass_stack`]):
/// delivered straight into the pod. `None`: it goes through the stack.
#[inline(always)]
pub(crate) fn deliver_verified<A: Family>(
    ctx: &TcContext,
    p: &Pkt<A>,
    ep: &EndpointInfo,
) -> Option<i32> {
    if !flows::inbound_may_bypass_stack(p) {
        return None;
    }
    count(Reason::RedirectFromUplink);
    Some(A::deliver(ctx, ep, PodDelivery::Peer))
}

/// [`route_hop`] for IPv6: the hop limit decremented (IPv6 has no header checksum).
#[inline(always)]
pub(crate) fn route_hop6(ctx: &TcContext, dst: &[u8; 6], src: &[u8; 6]) -> bool {
    let Ok(hl) = read::<u8>(ctx, IP_OFF + IP6_HOP_LIMIT) else {
        return false;
    };
    if hl <= 1 {
        count(Reason::PassTtlExpired);
        return false;
    }
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(dst);
    macs[6..].copy_from_slice(src);
    ctx.store(IP_OFF + IP6_HOP_LIMIT, &(hl - 1), 0).is_ok() && ctx.store(0, &macs, 0).is_ok()
}

/// [`deliver`] for IPv6 (its NetworkPolicy judgement: [`policy::judge_delivery6`]).
#[inline(always)]
pub(crate) fn deliver6(ctx: &TcContext, ep: &EndpointInfo, how: PodDelivery) -> i32 {
    if !route_hop6(ctx, &ep.pod_mac, &ep.host_mac) {
        return TC_ACT_OK as i32;
    }
    add_stats(ep.ifindex, ctx.len(), true);
    // Judged by NetworkPolicy (and then followed as a flow) once the IPv6 program's
    // stages are done (their frames leave no room for it here).
    let how = through_to_pod(ctx, ep, how, true);
    policy::note_delivery(ep, matches!(how, PodDelivery::Peer));
    redirect_into(ep, how)
}

/// `struct bpf_fib_lookup`. Addresses and ports network order.
#[repr(C)]
pub(crate) struct FibLookup {
    family: u8,
    l4_protocol: u8,
    sport: u16,
    dport: u16,
    /// In: `tot_len` (0: the kernel checks the skb against the egress MTU, GSO-aware).
    /// Out: the egress MTU.
    tot_len: u16,
    /// In: ingress ifindex. Out: egress ifindex.
    ifindex: u32,
    /// IPv4: the TOS byte. IPv6: the flow information (traffic class and flow label,
    /// network order).
    tos: u32,
    src: [u32; 4],
    /// In: destination. Out: the next hop (IPv4 only: the IPv6 lookup leaves it).
    dst: [u32; 4],
    vlan: u32,
    smac: [u8; 6],
    dmac: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<FibLookup>() == 64);

pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// The flow information bits of an IPv6 header's first word (network order): the traffic
/// class and flow label, without the version.
const IP6_FLOWINFO_MASK: u32 = 0x0fff_ffff_u32.to_be();

/// `bpf_check_mtu` flag: check every GSO segment, not the whole packet.
pub(crate) const BPF_MTU_CHK_SEGS: u64 = 1;

/// `bpf_check_mtu` result: fits.
pub(crate) const BPF_MTU_CHK_RET_SUCCESS: i64 = 0;

/// Pod traffic whose route leads out of the uplink is handed straight to the uplink's
/// egress (where `uplink_egress` masquerades it), skipping the kernel's forwarding path;
/// likewise traffic whose route leads into the tunnel device (where `to_tunnel` gives it
/// its tunnel key).
/// Everything else — other routes, an unresolved next hop, a packet too big for the
/// uplink, an expiring TTL, a source address that is not this pod's — goes to the stack
/// unchanged, which routes, fragments or answers it as before.
#[inline(always)]
pub(crate) fn to_uplink(ctx: &TcContext, p: &Pkt, ifindex: u32, own_source: bool) -> i32 {
    let fib = fib_uplink(ctx, p, ifindex, own_source, false).map(|(f, _)| f);
    redirect_to_uplink(ctx, fib, route_hop)
}

/// [`to_uplink`] for IPv6: the same decision, by the IPv6 FIB; the hop limit decremented.
#[inline(always)]
pub(crate) fn to_uplink6(ctx: &TcContext, p: &Pkt<Addr6>, ifindex: u32, own_source: bool) -> i32 {
    let fib = fib_uplink6(ctx, p, ifindex, own_source, false).map(|(f, _)| f);
    redirect_to_uplink(ctx, fib, route_hop6)
}

/// A packet from outside that a Service translation sends on to a backend on another
/// node, or that backend's reply on its way back to the client (see `nodeport`), its
/// source now one of the node's addresses: one routed hop out of the uplink or into the
/// tunnel device, as the FIB says, past the kernel's forwarding path (which drops a
/// packet arriving with the node's own address as its source). A next hop not resolved
/// yet is resolved by `bpf_redirect_neigh`. No such route, a packet too big for it or an
/// expiring TTL: dropped.
#[inline(always)]
pub(crate) fn route_out(ctx: &TcContext, p: &Pkt, ifindex: u32) -> i32 {
    route_out_with(ctx, fib_uplink(ctx, p, ifindex, true, true), route_hop)
}

/// [`route_out`] for IPv6.
#[inline(always)]
pub(crate) fn route_out6(ctx: &TcContext, p: &Pkt<Addr6>, ifindex: u32) -> i32 {
    route_out_with(ctx, fib_uplink6(ctx, p, ifindex, true, true), route_hop6)
}

/// The address the node sends from towards `dst`: the preferred source of its route (in
/// tunnel modes, the tunnel device's address for another node's pod, so that the answer
/// comes back through the tunnel), as the FIB tells it (`BPF_FIB_LOOKUP_SRC`, Linux
/// 6.7), written to `out`. `false` when the kernel does not tell. A BPF function of its
/// own: the lookup's 64 bytes stay out of its caller's frame.
#[inline(never)]
pub(crate) fn source_towards<A: Family>(ctx: &TcContext, dst: &A, out: &mut A) -> bool {
    let Some(cfg) = node_config() else {
        return false;
    };
    let family = if A::IPV6 { AF_INET6 } else { AF_INET };
    let flags = BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH;
    let Some(fib) = node_route(ctx, cfg, family, dst.words(), flags) else {
        return false;
    };
    let src = A::from_words(fib.src);
    if src == A::default() {
        return false;
    }
    *out = src;
    true
}

/// The next hop out of the uplink towards the IPv4 underlay address `node` (network
/// order), for a packet the node sends itself (the tunnel's encapsulation, `tunnel`):
/// its Ethernet addresses, the source address the node's route prefers and the uplink's
/// MTU. `false` unless the route leads out of the uplink and its neighbour is resolved.
#[inline(always)]
pub(crate) fn underlay_hop4(ctx: &TcContext, node: u32, hop: &mut UnderlayHop) -> bool {
    let Some(cfg) = node_config() else {
        return false;
    };
    let Some(fib) = node_route(ctx, cfg, AF_INET, [node, 0, 0, 0], BPF_FIB_LOOKUP_SRC) else {
        return false;
    };
    if fib.ifindex != cfg.uplink_ifindex {
        return false;
    }
    hop.ifindex = fib.ifindex;
    hop.src = fib.src[0];
    hop.mtu = u32::from(fib.tot_len);
    hop.smac = fib.smac;
    hop.dmac = fib.dmac;
    true
}

/// The FIB's answer, asked with `flags`, for a packet the node itself sends to `dst`
/// (addresses of `family`, network order) as if it came in on the uplink; `None` unless
/// the lookup succeeded.
#[inline(always)]
fn node_route(
    ctx: &TcContext,
    cfg: &NodeConfig,
    family: u8,
    dst: [u32; 4],
    flags: u32,
) -> Option<FibLookup> {
    let mut fib = FibLookup {
        family,
        l4_protocol: 0,
        sport: 0,
        dport: 0,
        tot_len: 0,
        ifindex: cfg.uplink_ifindex,
        tos: 0,
        src: [0; 4],
        dst,
        vlan: 0,
        smac: [0; 6],
        dmac: [0; 6],
    };
    // SAFETY: `fib` is a correctly sized `struct bpf_fib_lookup` on our stack.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            &mut fib as *mut FibLookup as *mut bpf_fib_lookup_t,
            core::mem::size_of::<FibLookup>() as i32,
            flags,
        )
    };
    (rc == BPF_FIB_LKUP_RET_SUCCESS as i64).then_some(fib)
}

/// What [`underlay_hop4`] finds.
#[derive(Default)]
pub(crate) struct UnderlayHop {
    /// The device it leaves by (the uplink).
    pub(crate) ifindex: u32,
    /// The route's preferred source, network order.
    pub(crate) src: u32,
    /// That device's MTU.
    pub(crate) mtu: u32,
    pub(crate) smac: [u8; 6],
    pub(crate) dmac: [u8; 6],
}

#[inline(always)]
fn route_out_with(
    ctx: &TcContext,
    fib: Option<(FibLookup, bool)>,
    hop: impl Fn(&TcContext, &[u8; 6], &[u8; 6]) -> bool,
) -> i32 {
    let Some((fib, resolved)) = fib else {
        count(Reason::DropServiceUnroutable);
        return TC_ACT_SHOT as i32;
    };
    if !hop(ctx, &fib.dmac, &fib.smac) {
        count(Reason::DropServiceUnroutable);
        return TC_ACT_SHOT as i32;
    }
    count(Reason::ServiceRouted);
    // SAFETY: plain helper calls (no neighbour parameters: the helper looks the next hop
    // up itself).
    unsafe {
        if resolved {
            bpf_redirect(fib.ifindex, 0) as i32
        } else {
            bpf_redirect_neigh(fib.ifindex, core::ptr::null_mut(), 0, 0) as i32
        }
    }
}

/// Redirects the packet to the uplink the FIB found (after `hop`: the routed hop of its
/// family), or leaves it to the kernel's route.
#[inline(always)]
fn redirect_to_uplink(
    ctx: &TcContext,
    fib: Option<FibLookup>,
    // Generic, not a function pointer: BPF has no indirect calls.
    hop: impl Fn(&TcContext, &[u8; 6], &[u8; 6]) -> bool,
) -> i32 {
    match fib {
        Some(fib) if hop(ctx, &fib.dmac, &fib.smac) => {
            count(Reason::RedirectUplink);
            // SAFETY: plain helper call.
            unsafe { bpf_redirect(fib.ifindex, 0) as i32 }
        }
        _ => {
            count(Reason::PassKernelRoute);
            PASS
        }
    }
}

/// The devices a pod's packet may be handed to: the uplink, and the tunnel device when
/// the node has one (else 0, no device's index).
#[derive(Clone, Copy)]
struct Exits {
    uplink: u32,
    tunnel: u32,
}

/// The exits a pod's packet may be handed to and the ports of its FIB lookup: `None`
/// unless the packet is from the pod's own address (an allow-listed foreign source, a
/// router pod's `allowedSourceCIDRs`, goes through the kernel and its reverse path
/// filter; other sources were dropped on entry to `from_pod`) and the node has an uplink.
#[inline(always)]
fn fib_prelude<A>(p: &Pkt<A>, own_source: bool) -> Option<(Exits, u16, u16)> {
    if !own_source {
        return None;
    }
    let cfg = node_config()?;
    if cfg.uplink_ifindex == 0 {
        return None;
    }
    let (sport, dport) = if p.proto == proto::TCP || p.proto == proto::UDP {
        (p.sport, p.dport)
    } else {
        (0, 0)
    };
    let exits = Exits {
        uplink: cfg.uplink_ifindex,
        tunnel: cfg.tunnel_ifindex,
    };
    Some((exits, sport, dport))
}

/// The kernel's forwarding decision for `p` arriving on `ifindex`, if it is "out of the
/// uplink (or into the tunnel device), fits", and whether its next hop is resolved (only
/// resolved ones unless `unresolved_ok`).
#[inline(always)]
fn fib_uplink(
    ctx: &TcContext,
    p: &Pkt,
    ifindex: u32,
    own_source: bool,
    unresolved_ok: bool,
) -> Option<(FibLookup, bool)> {
    let (exits, sport, dport) = fib_prelude(p, own_source)?;
    let tos: u8 = read(ctx, IP_OFF + IP_TOS).ok()?;
    let fib = FibLookup {
        family: AF_INET,
        l4_protocol: p.proto,
        sport,
        dport,
        tot_len: 0,
        ifindex,
        tos: tos as u32,
        src: [p.saddr, 0, 0, 0],
        dst: [p.daddr, 0, 0, 0],
        vlan: 0,
        smac: [0; 6],
        dmac: [0; 6],
    };
    fib_check(ctx, fib, exits, unresolved_ok)
}

/// Asks the FIB for `fib`; the result if the route leads out of one of `exits` with its
/// next hop resolved (the tunnel device's neighbour entries are made by the stack on a
/// flow's first packets), or not resolved yet if `unresolved_ok`, and the packet (each
/// GSO segment) fits that device's MTU; with it, whether the next hop is resolved.
#[inline(always)]
fn fib_check(
    ctx: &TcContext,
    mut fib: FibLookup,
    exits: Exits,
    unresolved_ok: bool,
) -> Option<(FibLookup, bool)> {
    // SAFETY: `fib` is a correctly sized `struct bpf_fib_lookup` on our stack.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            &mut fib as *mut FibLookup as *mut bpf_fib_lookup_t,
            core::mem::size_of::<FibLookup>() as i32,
            0,
        )
    };
    let resolved = rc == BPF_FIB_LKUP_RET_SUCCESS as i64;
    if !(resolved || unresolved_ok && rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64)
        || fib.ifindex == 0
        || (fib.ifindex != exits.uplink && fib.ifindex != exits.tunnel)
    {
        return None;
    }
    // The lookup's own MTU check lets every GSO packet through; check each segment
    // against the device's MTU so that the stack answers "fragmentation needed" (IPv4)
    // or "packet too big" (IPv6).
    let mut mtu: u32 = 0;
    // SAFETY: plain helper call with a pointer to our stack.
    let rc = unsafe { bpf_check_mtu(ctx.as_ptr(), fib.ifindex, &mut mtu, 0, BPF_MTU_CHK_SEGS) };
    if rc != BPF_MTU_CHK_RET_SUCCESS {
        return None;
    }
    Some((fib, resolved))
}

/// [`fib_uplink`] for IPv6.
#[inline(always)]
fn fib_uplink6(
    ctx: &TcContext,
    p: &Pkt<Addr6>,
    ifindex: u32,
    own_source: bool,
    unresolved_ok: bool,
) -> Option<(FibLookup, bool)> {
    let (exits, sport, dport) = fib_prelude(p, own_source)?;
    let first: u32 = read(ctx, IP_OFF).ok()?;
    let fib = FibLookup {
        family: AF_INET6,
        l4_protocol: p.proto,
        sport,
        dport,
        tot_len: 0,
        ifindex,
        tos: first & IP6_FLOWINFO_MASK,
        src: p.saddr,
        dst: p.daddr,
        vlan: 0,
        smac: [0; 6],
        dmac: [0; 6],
    };
    fib_check(ctx, fib, exits, unresolved_ok)
}
