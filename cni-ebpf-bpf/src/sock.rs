//! Host ports for the node's own sockets.
//!
//! A process on the node that connects to nodeIP:hostPort (or 127.0.0.1:hostPort, as the
//! reference `portmap` plugin offers through netfilter's OUTPUT chain) sends packets that
//! are routed locally and never pass a tc hook on their way in. The eBPF way is to
//! translate at the socket (cgroup `sock_addr` hooks, as Cilium's socket LB does): the
//! socket is connected (or a UDP datagram sent) straight to the pod, and the pod's address
//! is mapped back to the host port for `getpeername()` and `recvmsg()`, so the process
//! never sees the pod's address.
//!
//! Both families: an IPv4 socket to an IPv4 host port (`*4` hooks, `SOCK_REVNAT`); an IPv6
//! socket to an IPv6 host port on a node address or `::1` (`*6` hooks, `SOCK_REVNAT6`), or
//! to an IPv4 one through an IPv4-mapped address (`::ffff:a.b.c.d`, as a dual-stack socket
//! reaches IPv4; translated to the pod's mapped IPv4 address, `SOCK_REVNAT`).
//!
//! The hooks are attached to a cgroup (by default the cgroup2 root), which may hold
//! processes of every network namespace on the machine: they only act on sockets of the
//! node's namespace (`NodeConfig::netns_cookie`) and leave everything else unchanged.

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use cni_ebpf_common::{
    addr6, bytes6, mapped4, proto, unmapped4, Addr6, PortTarget, PortTarget6, Reason, SockRevKey,
    SockRevKey6, SockRevValue, SockRevValue6,
};

use crate::{
    family::Family,
    maps::{
        count, is_node_addr, node_config, port_mapping, port_mapping6, SOCK_REVNAT, SOCK_REVNAT6,
    },
    service::{self, Pick},
};

/// Verdict of a `sock_addr` program that lets the call go on.
const ALLOW: i32 = 1;
/// Verdict of a `sock_addr` program that fails the call (with the value set by
/// `bpf_set_retval`, else `EPERM`).
const REJECT: i32 = 0;
/// `ECONNREFUSED` on Linux.
const ECONNREFUSED: i32 = 111;

/// Whether a network-order IPv4 address is in 127.0.0.0/8.
#[inline(always)]
fn is_loopback(addr: u32) -> bool {
    addr.to_ne_bytes()[0] == 127
}

/// `::1`, network order.
const LOOPBACK6: Addr6 = [0, 0, 0, 1u32.to_be()];

/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`), network order.
const V4_MAPPED: u32 = 0xffffu32.to_be();

/// The IPv4 address inside an IPv4-mapped IPv6 address, if `a` is one.
#[inline(always)]
fn v4_mapped(a: &Addr6) -> Option<u32> {
    (a[0] == 0 && a[1] == 0 && a[2] == V4_MAPPED).then_some(a[3])
}

/// Whether the socket may be translated: TCP or UDP, of the node's network namespace.
#[inline(always)]
fn node_socket(ctx: &SockAddrContext, proto_: u8) -> bool {
    if proto_ != proto::TCP && proto_ != proto::UDP {
        return false;
    }
    let Some(cfg) = node_config() else {
        return false;
    };
    // SAFETY: plain helper call on our context.
    cfg.netns_cookie != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == cfg.netns_cookie
}

/// The host port `addr:port` (network order) of protocol `proto_` maps to, if the socket
/// belongs to the node's network namespace.
#[inline(always)]
fn host_port_target(ctx: &SockAddrContext, addr: u32, port: u16, proto_: u8) -> Option<PortTarget> {
    if !node_socket(ctx, proto_) {
        return None;
    }
    // The node's addresses and the loopback ones: a mapping with that hostIP, else one
    // without (as portmap's DNAT in the OUTPUT chain matches every local address).
    if is_loopback(addr) || is_node_addr(addr) {
        port_mapping(addr, port, proto_)
    } else {
        None
    }
}

/// Rewrites the socket call's destination to the pod behind the host port it names, or
/// to a backend of the Service frontend it names, and remembers what was asked for the
/// reverse mapping. Returns the hook's verdict (a frontend without backends refuses).
#[inline(always)]
fn translate(ctx: &SockAddrContext) -> i32 {
    // SAFETY: `sock_addr` points at the kernel's context for the whole call.
    let sa = unsafe { &mut *ctx.sock_addr };
    let (addr, port, proto_) = (sa.user_ip4, sa.user_port as u16, sa.protocol as u8);
    let (to_addr, to_port) = match host_port_target(ctx, addr, port, proto_) {
        Some(t) => {
            count(Reason::SockHostPort);
            (t.addr, t.port)
        }
        None => {
            let mut b = service::NO_BACKEND;
            let node_addr = is_node_addr(addr);
            match service::pick(ctx, mapped4(addr), port, proto_, node_addr, &mut b) {
                Pick::Pass => return ALLOW,
                Pick::Refuse => return refuse(),
                Pick::To => match unmapped4(&b.addr) {
                    Some(a) => {
                        count(Reason::SockService);
                        (a, b.port)
                    }
                    None => return ALLOW,
                },
            }
        }
    };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    remember(cookie, (to_addr, to_port), addr, port);
    sa.user_ip4 = to_addr;
    sa.user_port = u32::from(to_port);
    ALLOW
}

/// Refuses the call with `ECONNREFUSED`, as kube-proxy's reject rule makes a connection
/// to a Service without endpoints fail at once.
#[inline(always)]
fn refuse() -> i32 {
    count(Reason::SockServiceRefused);
    // SAFETY: plain helper call (cgroup programs may set the call's return value).
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    REJECT
}

/// Maps a pod address seen by a node socket back to the host port the socket asked for.
#[inline(always)]
fn reverse(ctx: &SockAddrContext) {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *ctx.sock_addr };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some(orig) = recall(cookie, sa.user_ip4, sa.user_port as u16) {
        sa.user_ip4 = orig.addr;
        sa.user_port = orig.port as u32;
    }
}

/// Notes that the socket `cookie`, which asked for `addr:port`, now talks to `to` (IPv4
/// address and port, network order).
#[inline(always)]
fn remember(cookie: u64, to: (u32, u16), addr: u32, port: u16) {
    let key = SockRevKey {
        cookie,
        addr: to.0,
        port: to.1,
        _pad: 0,
    };
    let orig = SockRevValue {
        addr,
        port,
        _pad: 0,
    };
    let _ = SOCK_REVNAT.insert(&key, &orig, 0);
}

/// What the socket `cookie` asked for before it was sent to `addr:port` (IPv4), if the
/// hooks translated it.
#[inline(always)]
pub(crate) fn recall(cookie: u64, addr: u32, port: u16) -> Option<SockRevValue> {
    let key = SockRevKey {
        cookie,
        addr,
        port,
        _pad: 0,
    };
    // SAFETY: copied out at once.
    unsafe { SOCK_REVNAT.get(key) }.copied()
}

/// [`host_port_target`] for an IPv6 address: one of the node's IPv6 addresses, or `::1`
/// from a socket bound to one of them. The reference `portmap` reaches `::1` only so:
/// its DNAT in the OUTPUT chain keeps the source, and the kernel never routes a packet
/// from `::1` off the loopback device (IPv6 has no `route_localnet`), so a socket that
/// lets the kernel choose its source times out. Host ports are reachable exactly where
/// the reference makes them reachable.
#[inline(always)]
fn host_port_target6(
    ctx: &SockAddrContext,
    addr: Addr6,
    port: u16,
    proto_: u8,
) -> Option<PortTarget6> {
    if !node_socket(ctx, proto_) {
        return None;
    }
    let reachable = if addr == LOOPBACK6 {
        bound_off_loopback(ctx)
    } else {
        addr.is_node_addr()
    };
    if reachable {
        port_mapping6(addr, port, proto_)
    } else {
        None
    }
}

/// Whether the IPv6 socket of the call is bound to an address that is neither `::` nor
/// `::1`.
#[inline(always)]
fn bound_off_loopback(ctx: &SockAddrContext) -> bool {
    // SAFETY: `sock_addr` points at the kernel's context for the whole call, and its `sk`
    // at the calling socket; 4-byte reads of `src_ip6`, which the verifier allows.
    let src: Addr6 = unsafe {
        let sk = (*ctx.sock_addr).__bindgen_anon_1.sk;
        [
            core::ptr::read_volatile(&raw const (*sk).src_ip6[0]),
            core::ptr::read_volatile(&raw const (*sk).src_ip6[1]),
            core::ptr::read_volatile(&raw const (*sk).src_ip6[2]),
            core::ptr::read_volatile(&raw const (*sk).src_ip6[3]),
        ]
    };
    src != [0; 4] && src != LOOPBACK6
}

/// The destination of an IPv6 socket call (network order).
#[inline(always)]
fn user_ip6(ctx: &SockAddrContext) -> Addr6 {
    // SAFETY: `sock_addr` points at the kernel's context for the whole call; 4-byte reads
    // of `user_ip6`, which the verifier allows.
    unsafe {
        let sa = ctx.sock_addr;
        [
            core::ptr::read_volatile(&raw const (*sa).user_ip6[0]),
            core::ptr::read_volatile(&raw const (*sa).user_ip6[1]),
            core::ptr::read_volatile(&raw const (*sa).user_ip6[2]),
            core::ptr::read_volatile(&raw const (*sa).user_ip6[3]),
        ]
    }
}

/// Sets the destination (or, in `recvmsg`/`getpeername`, the peer) of an IPv6 socket
/// call.
#[inline(always)]
fn set_user_ip6(ctx: &SockAddrContext, a: Addr6, port: u16) {
    // SAFETY: as in `user_ip6`; 4-byte writes, which the verifier allows.
    unsafe {
        let sa = ctx.sock_addr;
        core::ptr::write_volatile(&raw mut (*sa).user_ip6[0], a[0]);
        core::ptr::write_volatile(&raw mut (*sa).user_ip6[1], a[1]);
        core::ptr::write_volatile(&raw mut (*sa).user_ip6[2], a[2]);
        core::ptr::write_volatile(&raw mut (*sa).user_ip6[3], a[3]);
        (*sa).user_port = port as u32;
    }
}

/// [`translate`] for an IPv6 socket: an IPv6 host port or Service, or an IPv4 one through
/// its IPv4-mapped address.
#[inline(always)]
fn translate6(ctx: &SockAddrContext) -> i32 {
    let addr = user_ip6(ctx);
    // SAFETY: as in `user_ip6`.
    let (port, proto_) = unsafe {
        (
            (*ctx.sock_addr).user_port as u16,
            (*ctx.sock_addr).protocol as u8,
        )
    };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some(a4) = v4_mapped(&addr) {
        if let Some(t) = host_port_target(ctx, a4, port, proto_) {
            count(Reason::SockHostPort);
            remember(cookie, (t.addr, t.port), a4, port);
            set_user_ip6(ctx, [0, 0, V4_MAPPED, t.addr], t.port);
            return ALLOW;
        }
    } else if let Some(t) = host_port_target6(ctx, addr, port, proto_) {
        count(Reason::SockHostPort);
        remember6(cookie, (t.addr, t.port), addr, port);
        set_user_ip6(ctx, t.addr, t.port);
        return ALLOW;
    }
    let mut b = service::NO_BACKEND;
    let node_addr = match v4_mapped(&addr) {
        Some(a4) => is_node_addr(a4),
        None => addr.is_node_addr(),
    };
    match service::pick(ctx, bytes6(&addr), port, proto_, node_addr, &mut b) {
        Pick::Pass => return ALLOW,
        Pick::Refuse => return refuse(),
        Pick::To => count(Reason::SockService),
    }
    match (v4_mapped(&addr), unmapped4(&b.addr)) {
        (Some(a4), Some(b4)) => {
            remember(cookie, (b4, b.port), a4, port);
            set_user_ip6(ctx, [0, 0, V4_MAPPED, b4], b.port);
        }
        (None, None) => {
            let b6 = addr6(&b.addr);
            remember6(cookie, (b6, b.port), addr, port);
            set_user_ip6(ctx, b6, b.port);
        }
        // A backend of the other family (the agent writes none): left as it is.
        _ => {}
    }
    ALLOW
}

/// [`reverse`] for an IPv6 socket.
#[inline(always)]
fn reverse6(ctx: &SockAddrContext) {
    let addr = user_ip6(ctx);
    // SAFETY: as in `user_ip6`.
    let port = unsafe { (*ctx.sock_addr).user_port as u16 };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some(a4) = v4_mapped(&addr) {
        if let Some(orig) = recall(cookie, a4, port) {
            set_user_ip6(ctx, [0, 0, V4_MAPPED, orig.addr], orig.port);
        }
    } else if let Some(orig) = recall6(cookie, addr, port) {
        set_user_ip6(ctx, orig.addr, orig.port);
    }
}

/// [`remember`] for an IPv6 pod address (`SOCK_REVNAT6`).
#[inline(always)]
fn remember6(cookie: u64, to: (Addr6, u16), addr: Addr6, port: u16) {
    let key = SockRevKey6 {
        cookie,
        addr: to.0,
        port: to.1,
        _pad: 0,
        _pad2: 0,
    };
    let orig = SockRevValue6 {
        addr,
        port,
        _pad: 0,
    };
    let _ = SOCK_REVNAT6.insert(&key, &orig, 0);
}

/// [`recall`] for an IPv6 pod address (`SOCK_REVNAT6`).
#[inline(always)]
pub(crate) fn recall6(cookie: u64, addr: Addr6, port: u16) -> Option<SockRevValue6> {
    let key = SockRevKey6 {
        cookie,
        addr,
        port,
        _pad: 0,
        _pad2: 0,
    };
    // SAFETY: copied out at once.
    unsafe { SOCK_REVNAT6.get(key) }.copied()
}

/// `connect()` of a node socket (TCP, or connected UDP) to a host port.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx)
}

/// `sendmsg()` of an unconnected node UDP socket to a host port.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx)
}

/// `recvmsg()` of an unconnected node UDP socket: the pod's reply shows as the host port.
#[cgroup_sock_addr(recvmsg4)]
pub fn sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    ALLOW
}

/// `getpeername()` of a node socket connected to a host port: the host port, not the pod.
#[cgroup_sock_addr(getpeername4)]
pub fn sock_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    ALLOW
}

/// `connect()` of a node IPv6 socket (TCP, or connected UDP) to a host port.
#[cgroup_sock_addr(connect6)]
pub fn sock_connect6(ctx: SockAddrContext) -> i32 {
    translate6(&ctx)
}

/// `sendmsg()` of an unconnected node IPv6 UDP socket to a host port.
#[cgroup_sock_addr(sendmsg6)]
pub fn sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate6(&ctx)
}

/// `recvmsg()` of an unconnected node IPv6 UDP socket: the pod's reply shows as the host
/// port.
#[cgroup_sock_addr(recvmsg6)]
pub fn sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx);
    ALLOW
}

/// `getpeername()` of a node IPv6 socket connected to a host port.
#[cgroup_sock_addr(getpeername6)]
pub fn sock_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx);
    ALLOW
}
