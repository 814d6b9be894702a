#![no_std]
#![no_main]
//! The tc programs of cni-ebpf.
//!
//! - `from_pod` (host veth ingress): same-node pod → pod redirect straight into the
//!   destination pod; hairpin (pod → own node's hostPort, including its own); traffic
//!   routed out of the uplink redirected straight to it (FIB lookup, no kernel forwarding).
//! - `uplink_ingress`: replies of masqueraded flows and ICMP errors about them back to the
//!   pod; DNAT of nodeIP:hostPort to the pod, keeping the client's source address.
//! - `uplink_egress`: masquerade (SNAT) of pod traffic leaving the cluster; replies of
//!   host-port flows restored to nodeIP:hostPort.
//!
//! Every program passes what it does not own unchanged (`TC_ACT_UNSPEC`: "next program",
//! then the stack; never a drop), and counts why in
//! `REASONS`. NAT state is one LRU map of exact 5-tuples: each translated flow has one entry
//! per direction, tagged with the program (hook) that applies it; see `cni-ebpf-common`.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as bpf_fib_lookup_t, BPF_FIB_LKUP_RET_SUCCESS, BPF_F_MARK_MANGLED_0,
        BPF_F_PSEUDO_HDR, BPF_NOEXIST, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC,
    },
    helpers::{
        bpf_check_mtu, bpf_fib_lookup, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_loop,
        bpf_redirect, bpf_redirect_peer,
    },
    macros::{classifier, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TcContext,
    EbpfContext,
};
use cni_ebpf_common::{
    proto, EndpointInfo, EndpointKey, EndpointStats, NatEntry, NatKey, NodeAddr, NodeConfig, Owner,
    PortKey, PortTarget, Reason, CFG_F_MASQ, EP_F_ACTIVE, HOOK_POD, HOOK_UPLINK_IN,
    HOOK_UPLINK_OUT, MAX_CLUSTER_CIDRS, MAX_ENDPOINTS, MAX_NAT, MAX_NODE_ADDRS, MAX_OWNERS,
    MAX_PORTMAPS, NAT_CLOSED_GRACE_NS, NAT_DNAT_FWD, NAT_DNAT_REV, NAT_F_FIN, NAT_F_FIRST_FIN,
    NAT_F_RST, NAT_HAIRPIN_FWD, NAT_HAIRPIN_REV, NAT_ICMP_IDLE_NS, NAT_SNAT_FWD, NAT_SNAT_REV,
    NAT_TCP_IDLE_NS, NAT_TIME_WAIT_NS, NAT_UDP_IDLE_NS, REASON_SLOTS,
};

// Maps are pinned by name below the directory userspace passes as the default map pin
// directory (`<bpffsRoot>/<network>/v1/maps`), so every later invocation reuses them.

/// Local pods: pod IPv4 → delivery information.
#[map]
static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> = HashMap::pinned(MAX_ENDPOINTS, 0);
/// Per-pod counters, keyed by host veth ifindex.
#[map]
static EP_STATS: PerCpuHashMap<u32, EndpointStats> = PerCpuHashMap::pinned(MAX_ENDPOINTS, 0);
/// Host ports.
#[map]
static PORTMAPS: HashMap<PortKey, PortTarget> = HashMap::pinned(MAX_PORTMAPS, 0);
/// NAT flows (both directions).
#[map]
static NAT: LruHashMap<NatKey, NatEntry> = LruHashMap::pinned(MAX_NAT, 0);
/// Node configuration (index 0).
#[map]
static NODE_CONFIG: Array<NodeConfig> = Array::pinned(1, 0);
/// The node's own IPv4 addresses.
#[map]
static NODE_ADDRS: HashMap<u32, NodeAddr> = HashMap::pinned(MAX_NODE_ADDRS, 0);
/// Per-CPU counters indexed by [`Reason`].
#[map]
static REASONS: PerCpuArray<u64> = PerCpuArray::pinned(REASON_SLOTS, 0);
/// Owner names; written and read by userspace only, declared here so it is pinned with
/// the rest.
#[map]
static OWNERS: HashMap<u64, Owner> = HashMap::pinned(MAX_OWNERS, 0);

/// Verdict for packets we leave untouched: "next" (`TCX_NEXT` under tcx, the next filter
/// under legacy clsact), so other tools' programs still see them; the stack gets them if
/// nobody else decides.
const PASS: i32 = TC_ACT_UNSPEC;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IP_OFF: usize = ETH_HLEN;
const IP_HLEN: usize = 20;
const L4_OFF: usize = IP_OFF + IP_HLEN;
/// Offset of the inner IPv4 header in an ICMP error.
const INNER_IP_OFF: usize = L4_OFF + 8;
const INNER_L4_OFF: usize = INNER_IP_OFF + IP_HLEN;

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROB: u8 = 12;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// How many random SNAT ports are tried before giving up on a flow (a `bpf_loop`, so the
/// verifier checks one try whatever the count).
const SNAT_TRIES: u32 = 128;

/// The IPv4 header (no options).
#[repr(C)]
#[derive(Clone, Copy)]
struct Iphdr {
    vihl: u8,
    tos: u8,
    tot_len: u16,
    id: u16,
    frag_off: u16,
    ttl: u8,
    proto: u8,
    csum: u16,
    saddr: u32,
    daddr: u32,
}

/// What the programs need to know about an IPv4 packet. Addresses and ports network order.
#[derive(Clone, Copy)]
struct Pkt {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    /// ICMP type (0xff if not ICMP).
    icmp_type: u8,
    /// TCP flags (0 if not TCP).
    tcp_flags: u8,
    /// The packet has ports (TCP, UDP) or an echo id (ICMP echo): it can be translated.
    natable: bool,
}

impl Pkt {
    #[inline(always)]
    fn key(&self) -> NatKey {
        NatKey {
            saddr: self.saddr,
            daddr: self.daddr,
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            _pad: [0; 3],
        }
    }

    #[inline(always)]
    fn is_tcp_syn(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// A packet that may open a host-port flow: TCP SYN or any UDP datagram.
    #[inline(always)]
    fn opens_hostport_flow(&self) -> bool {
        (self.proto == proto::TCP && self.is_tcp_syn()) || self.proto == proto::UDP
    }
}

#[inline(always)]
fn count(reason: Reason) {
    if let Some(slot) = REASONS.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Reads a `T` at `off`: straight from the packet when those bytes are in its linear part
/// (no helper call), else with `bpf_skb_load_bytes`.
#[inline(always)]
fn read<T: Copy>(ctx: &TcContext, off: usize) -> Result<T, ()> {
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() <= ctx.data_end() {
        // SAFETY: within [data, data_end), checked just above; any alignment.
        return Ok(unsafe { core::ptr::read_unaligned((start + off) as *const T) });
    }
    ctx.load(off).map_err(|_| ())
}

/// Parses Ethernet + IPv4 (+ the L4 ports). `Err` carries the reason to pass unchanged.
#[inline(always)]
fn parse(ctx: &TcContext) -> Result<Pkt, Reason> {
    let ethertype: u16 = read(ctx, 12).map_err(|_| Reason::PassMalformed)?;
    if ethertype != ETH_P_IP.to_be() {
        return Err(Reason::PassNotIpv4);
    }
    let ip: Iphdr = read(ctx, IP_OFF).map_err(|_| Reason::PassMalformed)?;
    if ip.vihl >> 4 != 4 {
        return Err(Reason::PassMalformed);
    }
    let ihl = ip.vihl & 0x0f;
    if ihl < 5 {
        return Err(Reason::PassMalformed);
    }
    if ihl != 5 {
        return Err(Reason::PassIpOptions);
    }
    // More-fragments bit or a fragment offset.
    if ip.frag_off & 0x3fffu16.to_be() != 0 {
        return Err(Reason::PassFragment);
    }
    let tot_len = u16::from_be(ip.tot_len) as u32;
    if tot_len < IP_HLEN as u32 || tot_len + ETH_HLEN as u32 > ctx.len() {
        return Err(Reason::PassMalformed);
    }
    let mut p = Pkt {
        saddr: ip.saddr,
        daddr: ip.daddr,
        sport: 0,
        dport: 0,
        proto: ip.proto,
        icmp_type: 0xff,
        tcp_flags: 0,
        natable: false,
    };
    let l4_len = tot_len - IP_HLEN as u32;
    match ip.proto {
        proto::TCP => {
            if l4_len < 20 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.tcp_flags = read(ctx, L4_OFF + 13).map_err(|_| Reason::PassMalformed)?;
            p.natable = true;
        }
        proto::UDP => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.natable = true;
        }
        proto::ICMP => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ty: u8 = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.icmp_type = ty;
            if ty == ICMP_ECHO || ty == ICMP_ECHO_REPLY {
                let id: u16 = read(ctx, L4_OFF + 4).map_err(|_| Reason::PassMalformed)?;
                if ty == ICMP_ECHO {
                    p.sport = id;
                } else {
                    p.dport = id;
                }
                p.natable = true;
            }
        }
        _ => {}
    }
    Ok(p)
}

/// Offset of the L4 checksum and the extra flags `bpf_l4_csum_replace` needs.
#[inline(always)]
fn l4_csum(proto_: u8, l4_off: usize) -> Option<(usize, u64)> {
    match proto_ {
        proto::TCP => Some((l4_off + 16, 0)),
        proto::UDP => Some((l4_off + 6, BPF_F_MARK_MANGLED_0 as u64)),
        proto::ICMP => Some((l4_off + 2, 0)),
        _ => None,
    }
}

/// Adds the one's-complement difference of replacing 32-bit word `old` by `new` (both as
/// they are on the wire) to `sum` (RFC 1624).
#[inline(always)]
fn csum_add_change(sum: u32, old: u32, new: u32) -> u32 {
    let [a, b, c, d] = old.to_ne_bytes();
    let [e, f, g, h] = new.to_ne_bytes();
    sum + (!u16::from_be_bytes([a, b])) as u32
        + (!u16::from_be_bytes([c, d])) as u32
        + u16::from_be_bytes([e, f]) as u32
        + u16::from_be_bytes([g, h]) as u32
}

/// Rewrites the packet's tuple `p` into the entry's tuple `n`, fixing the IPv4 header
/// checksum and the L4 checksum (pseudo-header included for TCP/UDP). Addresses, ports
/// and the IPv4 checksum are written in place; the L4 checksum goes through
/// `bpf_l4_csum_replace`, which knows whether the skb carries a partial (offloaded) one.
#[inline(always)]
fn rewrite(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    let start = ctx.data();
    if start + L4_OFF + 8 > ctx.data_end() {
        return rewrite_slow(ctx, p, n);
    }
    let ip = (start + IP_OFF) as *mut u8;
    let l4 = (start + L4_OFF) as *mut u8;
    let pseudo = p.proto == proto::TCP || p.proto == proto::UDP;
    // SAFETY: IPv4 header and the first 8 L4 bytes are within [data, data_end), checked
    // above; byte accesses only.
    unsafe {
        if n.saddr != p.saddr || n.daddr != p.daddr {
            let mut sum = (!u16::from_be_bytes([*ip.add(10), *ip.add(11)])) as u32;
            sum = csum_add_change(sum, p.saddr, n.saddr);
            sum = csum_add_change(sum, p.daddr, n.daddr);
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            let [hi, lo] = (!(sum as u16)).to_be_bytes();
            *ip.add(10) = hi;
            *ip.add(11) = lo;
            let sa = n.saddr.to_ne_bytes();
            let da = n.daddr.to_ne_bytes();
            for i in 0..4 {
                *ip.add(12 + i) = sa[i];
                *ip.add(16 + i) = da[i];
            }
        }
        if pseudo {
            let [a, b] = n.sport.to_ne_bytes();
            let [c, d] = n.dport.to_ne_bytes();
            *l4 = a;
            *l4.add(1) = b;
            *l4.add(2) = c;
            *l4.add(3) = d;
        } else if p.icmp_type == ICMP_ECHO || p.icmp_type == ICMP_ECHO_REPLY {
            let id = if p.icmp_type == ICMP_ECHO {
                n.sport
            } else {
                n.dport
            };
            let [a, b] = id.to_ne_bytes();
            *l4.add(4) = a;
            *l4.add(5) = b;
        }
    }
    l4_csum_fix(ctx, p, n)
}

/// The L4 checksum update for [`rewrite`]: addresses (pseudo-header, TCP/UDP) and ports
/// or the echo id.
#[inline(always)]
fn l4_csum_fix(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    let Some((off, fl)) = l4_csum(p.proto, L4_OFF) else {
        return Ok(());
    };
    if p.proto == proto::TCP || p.proto == proto::UDP {
        let pf = fl | BPF_F_PSEUDO_HDR as u64 | 4;
        if n.saddr != p.saddr {
            ctx.l4_csum_replace(off, p.saddr as u64, n.saddr as u64, pf)?;
        }
        if n.daddr != p.daddr {
            ctx.l4_csum_replace(off, p.daddr as u64, n.daddr as u64, pf)?;
        }
        if n.sport != p.sport {
            ctx.l4_csum_replace(off, p.sport as u64, n.sport as u64, fl | 2)?;
        }
        if n.dport != p.dport {
            ctx.l4_csum_replace(off, p.dport as u64, n.dport as u64, fl | 2)?;
        }
    } else if p.icmp_type == ICMP_ECHO && n.sport != p.sport {
        ctx.l4_csum_replace(off, p.sport as u64, n.sport as u64, 2)?;
    } else if p.icmp_type == ICMP_ECHO_REPLY && n.dport != p.dport {
        ctx.l4_csum_replace(off, p.dport as u64, n.dport as u64, 2)?;
    }
    Ok(())
}

/// [`rewrite`] through helpers only, for headers outside the packet's linear part.
#[inline(always)]
fn rewrite_slow(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    if n.saddr != p.saddr {
        ctx.store(IP_OFF + 12, &n.saddr, 0)?;
        ctx.l3_csum_replace(IP_OFF + 10, p.saddr as u64, n.saddr as u64, 4)?;
    }
    if n.daddr != p.daddr {
        ctx.store(IP_OFF + 16, &n.daddr, 0)?;
        ctx.l3_csum_replace(IP_OFF + 10, p.daddr as u64, n.daddr as u64, 4)?;
    }
    if p.proto == proto::TCP || p.proto == proto::UDP {
        ctx.store(L4_OFF, &n.sport, 0)?;
        ctx.store(L4_OFF + 2, &n.dport, 0)?;
    } else if p.icmp_type == ICMP_ECHO {
        ctx.store(L4_OFF + 4, &n.sport, 0)?;
    } else if p.icmp_type == ICMP_ECHO_REPLY {
        ctx.store(L4_OFF + 4, &n.dport, 0)?;
    }
    l4_csum_fix(ctx, p, n)
}

#[inline(always)]
fn add_stats(ifindex: u32, bytes: u32, rx: bool) {
    if let Some(s) = EP_STATS.get_ptr_mut(ifindex) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe {
            if rx {
                (*s).rx_packets += 1;
                (*s).rx_bytes += bytes as u64;
            } else {
                (*s).tx_packets += 1;
                (*s).tx_bytes += bytes as u64;
            }
        }
    }
}

#[inline(always)]
fn local_endpoint(addr: u32) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once.
    let ep = unsafe { ENDPOINTS.get(EndpointKey { addr }) }.copied()?;
    if ep.flags & EP_F_ACTIVE == 0 {
        return None;
    }
    Some(ep)
}

/// Routes the packet one hop in place: TTL decremented (header checksum fixed) and the
/// Ethernet addresses set to `dst`/`src`. `false` when the TTL would expire (counted; the
/// stack then sends the ICMP error) or the packet could not be written.
#[inline(always)]
fn route_hop(ctx: &TcContext, dst: &[u8; 6], src: &[u8; 6]) -> bool {
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
fn route_hop_slow(ctx: &TcContext, dst: &[u8; 6], src: &[u8; 6]) -> bool {
    let Ok(ttl) = ctx.load::<u8>(IP_OFF + 8) else {
        return false;
    };
    let Ok(ip_proto) = ctx.load::<u8>(IP_OFF + 9) else {
        return false;
    };
    if ttl <= 1 {
        count(Reason::PassTtlExpired);
        return false;
    }
    let old = u16::from_ne_bytes([ttl, ip_proto]);
    let new = u16::from_ne_bytes([ttl - 1, ip_proto]);
    if ctx.store(IP_OFF + 8, &(ttl - 1), 0).is_err()
        || ctx
            .l3_csum_replace(IP_OFF + 10, old as u64, new as u64, 2)
            .is_err()
    {
        return false;
    }
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(dst);
    macs[6..].copy_from_slice(src);
    ctx.store(0, &macs, 0).is_ok()
}

/// Delivers the packet (whose destination is a local pod) straight into that pod:
/// one routed hop, then `bpf_redirect_peer`. TTL expiry goes to the stack.
#[inline(always)]
fn deliver(ctx: &TcContext, ep: &EndpointInfo) -> i32 {
    if !route_hop(ctx, &ep.pod_mac, &ep.host_mac) {
        return TC_ACT_OK as i32;
    }
    add_stats(ep.ifindex, ctx.len(), true);
    // SAFETY: plain helper call.
    unsafe { bpf_redirect_peer(ep.ifindex, 0) as i32 }
}

/// After a translation: deliver into a local pod if the new destination is one, else hand
/// the packet to the stack.
#[inline(always)]
fn deliver_or_stack(ctx: &TcContext, daddr: u32) -> i32 {
    match local_endpoint(daddr) {
        Some(ep) => deliver(ctx, &ep),
        None => {
            count(Reason::TranslatedToStack);
            TC_ACT_OK as i32
        }
    }
}

#[inline(always)]
fn node_config() -> Option<NodeConfig> {
    NODE_CONFIG.get(0).copied()
}

#[inline(always)]
fn is_node_addr(addr: u32) -> bool {
    // SAFETY: only presence is read.
    unsafe { NODE_ADDRS.get(addr) }.is_some()
}

#[inline(always)]
fn in_cluster(cfg: &NodeConfig, addr: u32) -> bool {
    let n = cfg.n_cidrs as usize;
    for i in 0..MAX_CLUSTER_CIDRS {
        if i >= n {
            break;
        }
        let c = cfg.cluster_cidrs[i];
        if addr & c.mask == c.addr {
            return true;
        }
    }
    false
}

#[inline(always)]
fn port_mapping(daddr: u32, dport: u16, proto_: u8) -> Option<PortTarget> {
    let mut key = PortKey {
        addr: daddr,
        port: dport,
        proto: proto_,
        _pad: 0,
    };
    // SAFETY: values are copied out at once.
    if let Some(t) = unsafe { PORTMAPS.get(key) } {
        return Some(*t);
    }
    key.addr = 0;
    unsafe { PORTMAPS.get(key) }.copied()
}

/// Looks up the NAT entry for `p` if it belongs to `hook`, refreshing its timestamp and
/// noting FIN/RST (a SYN reopening a closed flow clears them).
#[inline(always)]
fn nat_lookup(p: &Pkt, hook: u8) -> Option<NatEntry> {
    if !p.natable {
        return None;
    }
    let e = NAT.get_ptr_mut(p.key())?;
    // SAFETY: LRU values may be recycled under us; we copy the value and only write the
    // timestamp and close flags, which is harmless if the entry was reused.
    unsafe {
        if (*e).hook != hook {
            return None;
        }
        if p.proto == proto::TCP {
            if (*e).flags != 0 && p.is_tcp_syn() {
                // The tuple of a closed flow opens again: it is open again in both
                // directions, unless its other half is gone or now belongs to another
                // flow (its port was handed out again), when it is set up afresh.
                let o = NAT.get_ptr_mut(opposite(&*e, proto::TCP))?;
                if opposite(&*o, proto::TCP) != p.key() {
                    return None;
                }
                (*o).flags = 0;
                (*e).flags = 0;
            }
            if p.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                note_close(&mut *e, p.tcp_flags);
            }
        }
        (*e).last_seen_ns = now();
        Some(*e)
    }
}

/// The key of the entry for the other direction of `e`'s flow: its translated tuple,
/// reversed.
#[inline(always)]
fn opposite(e: &NatEntry, proto_: u8) -> NatKey {
    NatKey {
        saddr: e.daddr,
        daddr: e.saddr,
        sport: e.dport,
        dport: e.sport,
        proto: proto_,
        _pad: [0; 3],
    }
}

/// Records a FIN or RST seen in `e`'s direction (the first FIN of the flow also marks
/// which side closed first).
#[inline(always)]
fn note_close(e: &mut NatEntry, tcp_flags: u8) {
    if tcp_flags & TCP_RST != 0 {
        e.flags |= NAT_F_RST;
    }
    if tcp_flags & TCP_FIN != 0 && e.flags & NAT_F_FIN == 0 {
        // SAFETY: copied out at once.
        let peer_fin =
            unsafe { NAT.get(opposite(e, proto::TCP)) }.is_some_and(|o| o.flags & NAT_F_FIN != 0);
        e.flags |= if peer_fin {
            NAT_F_FIN
        } else {
            NAT_F_FIN | NAT_F_FIRST_FIN
        };
    }
}

/// Whether the flow holding a translated port (its reverse entry `rev`, keyed by the
/// outside peer → node:port, and its forward entry `fwd`) is over: closed (RST, or FINs
/// both ways) past its grace time, or idle past its protocol's timeout.
#[inline(always)]
fn flow_is_over(rev: &NatEntry, fwd: Option<&NatEntry>, proto_: u8, now: u64) -> bool {
    let (fwd_flags, fwd_seen) = fwd.map_or((0, 0), |f| (f.flags, f.last_seen_ns));
    let last = if fwd_seen > rev.last_seen_ns {
        fwd_seen
    } else {
        rev.last_seen_ns
    };
    let idle = now.saturating_sub(last);
    let limit = match proto_ {
        proto::TCP => {
            // Without a forward entry (evicted, or replaced by a reopened flow) the pod
            // side counts as closed.
            let fwd_fin = fwd.is_none() || fwd_flags & NAT_F_FIN != 0;
            if (rev.flags | fwd_flags) & NAT_F_RST != 0 {
                NAT_CLOSED_GRACE_NS
            } else if rev.flags & NAT_F_FIN != 0 && fwd_fin {
                if rev.flags & NAT_F_FIRST_FIN != 0 {
                    NAT_TIME_WAIT_NS
                } else {
                    NAT_CLOSED_GRACE_NS
                }
            } else {
                NAT_TCP_IDLE_NS
            }
        }
        proto::UDP => NAT_UDP_IDLE_NS,
        _ => NAT_ICMP_IDLE_NS,
    };
    idle >= limit
}

/// Frees translated port `key.dport` (reverse entry `key`) if its flow is over: both
/// entries are removed. `true` when the port is free now.
#[inline(always)]
fn reclaim(key: &NatKey) -> bool {
    // SAFETY: copied out at once.
    let Some(rev) = (unsafe { NAT.get(*key) }).copied() else {
        return true;
    };
    let fkey = opposite(&rev, key.proto);
    // SAFETY: copied out at once.
    let fwd = unsafe { NAT.get(fkey) }.copied();
    // The forward entry belongs to this port only if it still translates to it.
    let fwd = fwd.filter(|f| f.sport == key.dport && f.saddr == key.daddr);
    if !flow_is_over(&rev, fwd.as_ref(), key.proto, now()) {
        return false;
    }
    if fwd.is_some() {
        let _ = NAT.remove(&fkey);
    }
    let _ = NAT.remove(key);
    true
}

/// Inserts the reverse entry `rev_key → rev` with a free port in `rev_key.dport`, trying
/// random ports of the configured SNAT range; a port whose flow is over is taken back.
/// Returns the chosen port (network order).
#[inline(always)]
fn alloc_port(cfg: &NodeConfig, rev_key: &mut NatKey, rev: &NatEntry) -> Option<u16> {
    let min = cfg.snat_port_min as u32;
    let max = cfg.snat_port_max as u32;
    if min == 0 || max < min {
        return None;
    }
    let mut a = PortSearch {
        min,
        span: max - min + 1,
        key: *rev_key,
        rev: *rev,
        port: 0,
        found: 0,
    };
    // `bpf_loop`: the verifier checks one try, not SNAT_TRIES unrolled ones.
    // SAFETY: `port_try` has the callback signature and `a` outlives the call.
    unsafe {
        bpf_loop(
            SNAT_TRIES,
            port_try as *const () as *mut c_void,
            &mut a as *mut PortSearch as *mut c_void,
            0,
        );
    }
    if a.found == 0 {
        return None;
    }
    *rev_key = a.key;
    Some(a.port)
}

/// State of [`alloc_port`]'s search, shared with [`port_try`].
#[repr(C)]
struct PortSearch {
    min: u32,
    span: u32,
    key: NatKey,
    rev: NatEntry,
    port: u16,
    found: u8,
}

/// One try of [`alloc_port`]: 1 (stop) once a port is taken, else 0.
#[inline(never)]
extern "C" fn port_try(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `PortSearch` passed to `bpf_loop` by `alloc_port`.
    let a = unsafe { &mut *(ctx as *mut PortSearch) };
    // SAFETY: plain helper call.
    let r = unsafe { bpf_get_prandom_u32() };
    let Some(off) = r.checked_rem(a.span) else {
        return 1;
    };
    let port = ((a.min + off) as u16).to_be();
    if a.key.proto != proto::ICMP && port_mapping(a.key.daddr, port, a.key.proto).is_some() {
        return 0;
    }
    a.key.dport = port;
    if NAT.insert(&a.key, &a.rev, BPF_NOEXIST as u64).is_ok() {
        a.port = port;
        a.found = 1;
        return 1;
    }
    if reclaim(&a.key) && NAT.insert(&a.key, &a.rev, BPF_NOEXIST as u64).is_ok() {
        count(Reason::SnatPortReclaimed);
        a.port = port;
        a.found = 1;
        return 1;
    }
    0
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn entry(saddr: u32, daddr: u32, sport: u16, dport: u16, hook: u8, kind: u8) -> NatEntry {
    NatEntry {
        saddr,
        daddr,
        sport,
        dport,
        hook,
        kind,
        flags: 0,
        _pad: 0,
        last_seen_ns: now(),
    }
}

#[inline(always)]
fn apply(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> bool {
    rewrite(ctx, p, n).is_ok()
}

// ---------------------------------------------------------------------------------------
// from_pod

/// Host veth ingress: traffic leaving a pod.
#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    // SAFETY: reading a field of the context.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    add_stats(ifindex, ctx.len(), false);
    match try_from_pod(&ctx, ifindex) {
        Ok(v) | Err(v) => v,
    }
}

#[inline(always)]
fn try_from_pod(ctx: &TcContext, ifindex: u32) -> Result<i32, i32> {
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    // Hairpin flows only ever go to a node address (client → hostPort) or to a local pod
    // (the replies): traffic leaving the node skips their lookups.
    let dst_ep = local_endpoint(p.daddr);
    let to_node = dst_ep.is_none() && is_node_addr(p.daddr);
    if dst_ep.is_some() || to_node {
        // An existing hairpin flow.
        if let Some(n) = nat_lookup(&p, HOOK_POD) {
            if !apply(ctx, &p, &n) {
                return Ok(TC_ACT_OK as i32);
            }
            count(Reason::HairpinForward);
            return Ok(deliver_or_stack(ctx, n.daddr));
        }
    }

    // A new hairpin flow: a pod to one of this node's addresses on a host port.
    if to_node && p.natable && p.opens_hostport_flow() {
        if let Some(t) = port_mapping(p.daddr, p.dport, p.proto) {
            return Ok(hairpin_new(ctx, &p, &t));
        }
    }

    // Same-node pod → pod.
    if let Some(ep) = dst_ep {
        count(Reason::RedirectPod);
        return Ok(deliver(ctx, &ep));
    }

    // Leaving the node through the uplink.
    Ok(to_uplink(ctx, &p, ifindex))
}

/// `struct bpf_fib_lookup` (IPv4 use). Addresses and ports network order.
#[repr(C)]
struct FibLookup {
    family: u8,
    l4_protocol: u8,
    sport: u16,
    dport: u16,
    /// In: `tot_len` (0: the kernel checks the skb against the egress MTU, GSO-aware).
    /// Out: the egress MTU.
    tot_len: u16,
    /// In: ingress ifindex. Out: egress ifindex.
    ifindex: u32,
    tos: u32,
    src: [u32; 4],
    /// In: destination. Out (IPv4): the next hop.
    dst: [u32; 4],
    vlan: u32,
    smac: [u8; 6],
    dmac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<FibLookup>() == 64);

const AF_INET: u8 = 2;
/// `bpf_check_mtu` flag: check every GSO segment, not the whole packet.
const BPF_MTU_CHK_SEGS: u64 = 1;
/// `bpf_check_mtu` result: fits.
const BPF_MTU_CHK_RET_SUCCESS: i64 = 0;

/// Pod traffic whose route leads out of the uplink is handed straight to the uplink's
/// egress (where `uplink_egress` masquerades it), skipping the kernel's forwarding path.
/// Everything else — other routes, an unresolved next hop, a packet too big for the
/// uplink, an expiring TTL, a source address that is not this pod's — goes to the stack
/// unchanged, which routes, fragments or answers it as before.
#[inline(always)]
fn to_uplink(ctx: &TcContext, p: &Pkt, ifindex: u32) -> i32 {
    match fib_uplink(ctx, p, ifindex) {
        Some(fib) if route_hop(ctx, &fib.dmac, &fib.smac) => {
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

/// The kernel's forwarding decision for `p` arriving on `ifindex`, if it is "out of the
/// uplink, next hop resolved, fits".
#[inline(always)]
fn fib_uplink(ctx: &TcContext, p: &Pkt, ifindex: u32) -> Option<FibLookup> {
    let cfg = node_config()?;
    if cfg.uplink_ifindex == 0 {
        return None;
    }
    // Anti-spoofing: only the pod's own address takes the fast path (the stack's reverse
    // path filter still judges anything else).
    match local_endpoint(p.saddr) {
        Some(ep) if ep.ifindex == ifindex => {}
        _ => return None,
    }
    let tos: u8 = read(ctx, IP_OFF + 1).ok()?;
    let (sport, dport) = if p.proto == proto::TCP || p.proto == proto::UDP {
        (p.sport, p.dport)
    } else {
        (0, 0)
    };
    let mut fib = FibLookup {
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
    // SAFETY: `fib` is a correctly sized `struct bpf_fib_lookup` on our stack.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            &mut fib as *mut FibLookup as *mut bpf_fib_lookup_t,
            core::mem::size_of::<FibLookup>() as i32,
            0,
        )
    };
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 || fib.ifindex != cfg.uplink_ifindex {
        return None;
    }
    // The lookup's own MTU check lets every GSO packet through; check each segment
    // against the uplink's MTU so that the stack answers "fragmentation needed".
    let mut mtu: u32 = 0;
    // SAFETY: plain helper call with a pointer to our stack.
    let rc = unsafe { bpf_check_mtu(ctx.as_ptr(), fib.ifindex, &mut mtu, 0, BPF_MTU_CHK_SEGS) };
    if rc != BPF_MTU_CHK_RET_SUCCESS {
        return None;
    }
    Some(fib)
}

/// Client pod A → node N:hostPort, backed by pod B (possibly A itself).
#[inline(always)]
fn hairpin_new(ctx: &TcContext, p: &Pkt, t: &PortTarget) -> i32 {
    let (a, ap, n, hp) = (p.saddr, p.sport, p.daddr, p.dport);
    let (b, bp) = (t.addr, t.port);
    let fwd = if b == a {
        // A pod reaching itself through its host port: the packet must not carry its own
        // address as source (the pod would drop it as martian), so it comes from N.
        let Some(cfg) = node_config() else {
            count(Reason::PassNatInsertFailed);
            return PASS;
        };
        let rev = entry(n, a, hp, ap, HOOK_POD, NAT_HAIRPIN_REV);
        let mut rev_key = NatKey {
            saddr: a,
            daddr: n,
            sport: bp,
            dport: 0,
            proto: p.proto,
            _pad: [0; 3],
        };
        let Some(np) = alloc_port(&cfg, &mut rev_key, &rev) else {
            count(Reason::DropNoSnatPort);
            return TC_ACT_SHOT as i32;
        };
        entry(n, a, np, bp, HOOK_POD, NAT_HAIRPIN_FWD)
    } else {
        let rev_key = NatKey {
            saddr: b,
            daddr: a,
            sport: bp,
            dport: ap,
            proto: p.proto,
            _pad: [0; 3],
        };
        let rev = entry(n, a, hp, ap, HOOK_POD, NAT_HAIRPIN_REV);
        if NAT.insert(&rev_key, &rev, BPF_NOEXIST as u64).is_err() {
            count(Reason::PassNatInsertFailed);
            return PASS;
        }
        entry(a, b, ap, bp, HOOK_POD, NAT_HAIRPIN_FWD)
    };
    if NAT.insert(&p.key(), &fwd, 0).is_err() {
        count(Reason::PassNatInsertFailed);
        return PASS;
    }
    if !apply(ctx, p, &fwd) {
        return TC_ACT_OK as i32;
    }
    count(Reason::HairpinNew);
    deliver_or_stack(ctx, fwd.daddr)
}

// ---------------------------------------------------------------------------------------
// uplink_ingress

/// Uplink ingress: reverse NAT of masqueraded flows, DNAT of host ports.
#[classifier]
pub fn uplink_ingress(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    match try_uplink_ingress(&ctx) {
        Ok(v) | Err(v) => v,
    }
}

#[inline(always)]
fn try_uplink_ingress(ctx: &TcContext) -> Result<i32, i32> {
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    if p.proto == proto::ICMP
        && (p.icmp_type == ICMP_DEST_UNREACH
            || p.icmp_type == ICMP_TIME_EXCEEDED
            || p.icmp_type == ICMP_PARAMETER_PROB)
    {
        return Ok(icmp_error_in(ctx, &p));
    }

    if let Some(n) = nat_lookup(&p, HOOK_UPLINK_IN) {
        if !apply(ctx, &p, &n) {
            return Ok(TC_ACT_OK as i32);
        }
        count(if n.kind == NAT_SNAT_REV {
            Reason::SnatReply
        } else {
            Reason::DnatForward
        });
        return Ok(deliver_or_stack(ctx, n.daddr));
    }

    if p.natable && (p.proto == proto::TCP || p.proto == proto::UDP) && is_node_addr(p.daddr) {
        if let Some(t) = port_mapping(p.daddr, p.dport, p.proto) {
            if !p.opens_hostport_flow() {
                count(Reason::PassStaleHostPortFlow);
                return Ok(PASS);
            }
            // client C:cp → N:hp becomes C:cp → B:bp; the reply B:bp → C:cp leaves as N:hp.
            let (c, cp, n, hp) = (p.saddr, p.sport, p.daddr, p.dport);
            let rev_key = NatKey {
                saddr: t.addr,
                daddr: c,
                sport: t.port,
                dport: cp,
                proto: p.proto,
                _pad: [0; 3],
            };
            let rev = entry(n, c, hp, cp, HOOK_UPLINK_OUT, NAT_DNAT_REV);
            let fwd = entry(c, t.addr, cp, t.port, HOOK_UPLINK_IN, NAT_DNAT_FWD);
            if NAT.insert(&rev_key, &rev, 0).is_err() || NAT.insert(&p.key(), &fwd, 0).is_err() {
                count(Reason::PassNatInsertFailed);
                return Ok(PASS);
            }
            if !apply(ctx, &p, &fwd) {
                return Ok(TC_ACT_OK as i32);
            }
            count(Reason::DnatNew);
            return Ok(deliver_or_stack(ctx, fwd.daddr));
        }
    }
    count(Reason::PassNoMatch);
    Ok(PASS)
}

/// An ICMP error (outer `p`) arriving from outside about a packet we translated on its
/// way out: translate the quoted packet back and deliver the error to the pod.
#[inline(always)]
fn icmp_error_in(ctx: &TcContext, p: &Pkt) -> i32 {
    match icmp_error_in_inner(ctx, p) {
        Some(v) => v,
        None => {
            count(Reason::PassNoMatch);
            PASS
        }
    }
}

#[inline(always)]
fn icmp_error_in_inner(ctx: &TcContext, p: &Pkt) -> Option<i32> {
    let ip: Iphdr = ctx.load(INNER_IP_OFF).ok()?;
    if ip.vihl != 0x45 || ip.frag_off & 0x3fffu16.to_be() != 0 {
        return None;
    }
    // The quoted packet's tuple as we sent it.
    let (isport, idport) = match ip.proto {
        proto::TCP | proto::UDP => {
            let ports: [u16; 2] = ctx.load(INNER_L4_OFF).ok()?;
            (ports[0], ports[1])
        }
        proto::ICMP => {
            let ty: u8 = ctx.load(INNER_L4_OFF).ok()?;
            let id: u16 = ctx.load(INNER_L4_OFF + 4).ok()?;
            match ty {
                ICMP_ECHO => (id, 0),
                ICMP_ECHO_REPLY => (0, id),
                _ => return None,
            }
        }
        _ => return None,
    };
    if ip.saddr != p.daddr {
        return None;
    }
    // The reply direction of the quoted packet is what our NAT entry is keyed by.
    let key = NatKey {
        saddr: ip.daddr,
        daddr: ip.saddr,
        sport: idport,
        dport: isport,
        proto: ip.proto,
        _pad: [0; 3],
    };
    // SAFETY: copied out at once.
    let e = unsafe { NAT.get(key) }.copied()?;
    if e.hook != HOOK_UPLINK_IN {
        return None;
    }
    // New quoted tuple: the entry's translation, reversed.
    let (nsaddr, ndaddr, nsport, ndport) = (e.daddr, e.saddr, e.dport, e.sport);
    let icmp_csum = L4_OFF + 2;

    // Outer destination → the pod.
    ctx.store(IP_OFF + 16, &nsaddr, 0).ok()?;
    ctx.l3_csum_replace(IP_OFF + 10, p.daddr as u64, nsaddr as u64, 4)
        .ok()?;

    // Quoted addresses, with the quoted header checksum; every changed byte of the ICMP
    // payload is folded into the ICMP checksum.
    let old_icsum: u16 = ctx.load(INNER_IP_OFF + 10).ok()?;
    if nsaddr != ip.saddr {
        ctx.store(INNER_IP_OFF + 12, &nsaddr, 0).ok()?;
        ctx.l3_csum_replace(INNER_IP_OFF + 10, ip.saddr as u64, nsaddr as u64, 4)
            .ok()?;
        ctx.l4_csum_replace(icmp_csum, ip.saddr as u64, nsaddr as u64, 4)
            .ok()?;
    }
    if ndaddr != ip.daddr {
        ctx.store(INNER_IP_OFF + 16, &ndaddr, 0).ok()?;
        ctx.l3_csum_replace(INNER_IP_OFF + 10, ip.daddr as u64, ndaddr as u64, 4)
            .ok()?;
        ctx.l4_csum_replace(icmp_csum, ip.daddr as u64, ndaddr as u64, 4)
            .ok()?;
    }
    let new_icsum: u16 = ctx.load(INNER_IP_OFF + 10).ok()?;
    if new_icsum != old_icsum {
        ctx.l4_csum_replace(icmp_csum, old_icsum as u64, new_icsum as u64, 2)
            .ok()?;
    }
    // Quoted ports / echo id (the quoted L4 checksum is left alone: receivers do not
    // verify it, and it may be cut off).
    if ip.proto == proto::ICMP {
        let (old, new) = if isport != 0 {
            (isport, nsport)
        } else {
            (idport, ndport)
        };
        if old != new {
            ctx.store(INNER_L4_OFF + 4, &new, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, old as u64, new as u64, 2)
                .ok()?;
        }
    } else {
        if nsport != isport {
            ctx.store(INNER_L4_OFF, &nsport, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, isport as u64, nsport as u64, 2)
                .ok()?;
        }
        if ndport != idport {
            ctx.store(INNER_L4_OFF + 2, &ndport, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, idport as u64, ndport as u64, 2)
                .ok()?;
        }
    }
    count(Reason::IcmpErrorTranslated);
    Some(deliver_or_stack(ctx, nsaddr))
}

// ---------------------------------------------------------------------------------------
// uplink_egress

/// Uplink egress: masquerade pod traffic leaving the cluster; restore replies of host-port
/// flows to nodeIP:hostPort.
#[classifier]
pub fn uplink_egress(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    match try_uplink_egress(&ctx) {
        Ok(v) | Err(v) => v,
    }
}

#[inline(always)]
fn try_uplink_egress(ctx: &TcContext) -> Result<i32, i32> {
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    if let Some(n) = nat_lookup(&p, HOOK_UPLINK_OUT) {
        if apply(ctx, &p, &n) {
            count(if n.kind == NAT_SNAT_FWD {
                Reason::SnatForward
            } else {
                Reason::DnatReply
            });
        }
        return Ok(TC_ACT_OK as i32);
    }

    // Masquerade: a local pod talking to something outside the cluster.
    let cfg = match node_config() {
        Some(c) => c,
        None => {
            count(Reason::PassNoMatch);
            return Ok(PASS);
        }
    };
    let echo_request = p.proto == proto::ICMP && p.icmp_type == ICMP_ECHO;
    if cfg.flags & CFG_F_MASQ == 0
        || cfg.node_addr == 0
        || !p.natable
        || !(p.proto == proto::TCP || p.proto == proto::UDP || echo_request)
        || local_endpoint(p.saddr).is_none()
        || in_cluster(&cfg, p.daddr)
        || is_node_addr(p.daddr)
    {
        count(Reason::PassNoMatch);
        return Ok(PASS);
    }
    // pod P:pp → X:xp becomes N:np → X:xp; the reply X:xp → N:np goes back to P:pp.
    let node = cfg.node_addr;
    let rev = entry(
        p.daddr,
        p.saddr,
        p.dport,
        p.sport,
        HOOK_UPLINK_IN,
        NAT_SNAT_REV,
    );
    let mut rev_key = NatKey {
        saddr: p.daddr,
        daddr: node,
        sport: p.dport,
        dport: 0,
        proto: p.proto,
        _pad: [0; 3],
    };
    let Some(np) = alloc_port(&cfg, &mut rev_key, &rev) else {
        count(Reason::DropNoSnatPort);
        return Ok(TC_ACT_SHOT as i32);
    };
    let fwd = entry(node, p.daddr, np, p.dport, HOOK_UPLINK_OUT, NAT_SNAT_FWD);
    if NAT.insert(&p.key(), &fwd, 0).is_err() {
        let _ = NAT.remove(&rev_key);
        count(Reason::PassNatInsertFailed);
        return Ok(PASS);
    }
    if apply(ctx, &p, &fwd) {
        count(Reason::SnatNew);
    }
    Ok(TC_ACT_OK as i32)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
