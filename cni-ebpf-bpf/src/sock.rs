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
//! The hooks are attached to a cgroup (by default the cgroup2 root), which may hold
//! processes of every network namespace on the machine: they only act on sockets of the
//! node's namespace (`NodeConfig::netns_cookie`) and leave everything else unchanged.

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use cni_ebpf_common::{proto, PortTarget, Reason, SockRevKey, SockRevValue};

use crate::maps::{count, is_node_addr, node_config, port_mapping, SOCK_REVNAT};

/// Verdict of a `sock_addr` program that lets the call go on.
const ALLOW: i32 = 1;

/// Whether a network-order IPv4 address is in 127.0.0.0/8.
#[inline(always)]
fn is_loopback(addr: u32) -> bool {
    addr.to_ne_bytes()[0] == 127
}

/// The host port `addr:port` (network order) of protocol `proto_` maps to, if the socket
/// belongs to the node's network namespace.
#[inline(always)]
fn host_port_target(ctx: &SockAddrContext, addr: u32, port: u16, proto_: u8) -> Option<PortTarget> {
    if proto_ != proto::TCP && proto_ != proto::UDP {
        return None;
    }
    let cfg = node_config()?;
    // SAFETY: plain helper call on our context.
    if cfg.netns_cookie == 0 || unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != cfg.netns_cookie {
        return None;
    }
    if is_loopback(addr) {
        // Only mappings without a hostIP answer on the loopback addresses.
        port_mapping(0, port, proto_)
    } else if is_node_addr(addr) {
        port_mapping(addr, port, proto_)
    } else {
        None
    }
}

/// Rewrites the socket call's destination to the pod behind the host port it names, and
/// remembers the host port for the reverse mapping. `false` when nothing applies.
#[inline(always)]
fn translate(ctx: &SockAddrContext) -> bool {
    // SAFETY: `sock_addr` points at the kernel's context for the whole call.
    let sa = unsafe { &mut *ctx.sock_addr };
    let (addr, port) = (sa.user_ip4, sa.user_port as u16);
    let Some(t) = host_port_target(ctx, addr, port, sa.protocol as u8) else {
        return false;
    };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        addr: t.addr,
        port: t.port,
        _pad: 0,
    };
    let orig = SockRevValue {
        addr,
        port,
        _pad: 0,
    };
    let _ = SOCK_REVNAT.insert(&key, &orig, 0);
    sa.user_ip4 = t.addr;
    sa.user_port = t.port as u32;
    count(Reason::SockHostPort);
    true
}

/// Maps a pod address seen by a node socket back to the host port the socket asked for.
#[inline(always)]
fn reverse(ctx: &SockAddrContext) {
    // SAFETY: as in `translate`.
    let sa = unsafe { &mut *ctx.sock_addr };
    // SAFETY: plain helper call on our context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        addr: sa.user_ip4,
        port: sa.user_port as u16,
        _pad: 0,
    };
    // SAFETY: copied out at once.
    if let Some(orig) = unsafe { SOCK_REVNAT.get(key) }.copied() {
        sa.user_ip4 = orig.addr;
        sa.user_port = orig.port as u32;
    }
}

/// `connect()` of a node socket (TCP, or connected UDP) to a host port.
#[cgroup_sock_addr(connect4)]
pub fn sock_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx);
    ALLOW
}

/// `sendmsg()` of an unconnected node UDP socket to a host port.
#[cgroup_sock_addr(sendmsg4)]
pub fn sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx);
    ALLOW
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
