//! Services without kube-proxy (`--kube-proxy-replacement`): which backend a new
//! connection to a frontend gets, chosen once per connection (uniformly, or the client's
//! remembered one under `sessionAffinity: ClientIP`).
//!
//! At the socket ([`pick`]): a `connect()` or `sendmsg()` to a ClusterIP (or, from inside
//! the node, to a NodePort on one of its addresses, an external IP or a load-balancer
//! address) is sent to the backend. The packets then carry the backend's address from
//! the first one on: plain pod → pod traffic, with no NAT per packet and no conntrack
//! entry. `sock.rs` calls this and keeps the reverse mapping for `getpeername()` and
//! `recvmsg()`. Only sockets of the node's own network namespace and of the pods ADD
//! recorded (`SERVICE_NETNS`) are translated: the cgroup the hooks sit on may hold
//! processes of other namespaces that are not this node's.
//!
//! At the uplink, for flows from outside, `nodeport.rs` looks the frontend up with
//! `SCOPE_UPLINK` and chooses with [`choose`].

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_ktime_get_ns},
    programs::SockAddrContext,
    EbpfContext,
};
use cni_ebpf_common::{
    proto, Affinity, AffinityKey, Backend, BackendSlot, MemberKey, Service, ServiceKey,
    ANY_NODE_ADDR4, ANY_NODE_ADDR6, SCOPE_SOCKET,
};

use crate::maps::{
    node_config, SERVICES, SERVICE_AFFINITY, SERVICE_BACKENDS, SERVICE_MEMBERS, SERVICE_NETNS,
};

/// What becomes of a socket call to an address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Not a Service frontend (or not a socket of ours): left as it is.
    Pass,
    /// A frontend with no ready backend: refused at once.
    Refuse,
    /// A frontend: sent to the backend written to `pick`'s `to`.
    To,
}

/// No backend (what `to` holds unless [`Pick::To`]).
pub(crate) const NO_BACKEND: Backend = Backend {
    addr: [0; 16],
    port: 0,
    _pad: 0,
};

/// The network namespace cookie of the socket if its calls may be translated: TCP or
/// UDP, of the node's namespace or a pod's.
#[inline(always)]
fn client(ctx: &SockAddrContext, proto_: u8) -> Option<u64> {
    if proto_ != proto::TCP && proto_ != proto::UDP {
        return None;
    }
    // SAFETY: plain helper call on our context.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let node = node_config().is_some_and(|c| c.netns_cookie != 0 && c.netns_cookie == netns);
    // SAFETY: only tested for presence.
    (node || unsafe { SERVICE_NETNS.get(&netns) }.is_some()).then_some(netns)
}

/// The frontend `addr:port` (wire order) of `proto_` in `scope`, if there is one; else,
/// when `node_addr` says `addr` is one of the node's addresses, its NodePort.
#[inline(always)]
pub(crate) fn frontend(
    addr: [u8; 16],
    port: u16,
    proto_: u8,
    scope: u8,
    node_addr: bool,
) -> Option<Service> {
    let mut key = ServiceKey {
        addr,
        port,
        proto: proto_,
        scope,
    };
    // SAFETY: copied out at once.
    if let Some(s) = unsafe { SERVICES.get(&key) } {
        return Some(*s);
    }
    if !node_addr {
        return None;
    }
    key.addr = if cni_ebpf_common::unmapped4(&addr).is_some() {
        ANY_NODE_ADDR4
    } else {
        ANY_NODE_ADDR6
    };
    // SAFETY: as above.
    unsafe { SERVICES.get(&key) }.copied()
}

/// Where a socket call of protocol `proto_` to `addr:port` (wire order) goes; the
/// backend, if any, in `to`. `node_addr`: `addr` is one of the node's addresses (its
/// NodePorts apply). (An out-parameter: an enum carrying the backend left bytes the
/// verifier saw as unread on the paths without one.)
#[inline(always)]
pub(crate) fn pick(
    ctx: &SockAddrContext,
    addr: [u8; 16],
    port: u16,
    proto_: u8,
    node_addr: bool,
    to: &mut Backend,
) -> Pick {
    let Some(svc) = frontend(addr, port, proto_, SCOPE_SOCKET, node_addr) else {
        return Pick::Pass;
    };
    let Some(netns) = client(ctx, proto_) else {
        return Pick::Pass;
    };
    choose(&svc, netns, to)
}

/// The backend of frontend `svc` for a new connection of `client` (a network namespace
/// cookie, or `outside_client` of an address), in `to`. A BPF function of its own: its
/// keys and values do not add to its callers' frames.
#[inline(never)]
pub(crate) fn choose(svc: &Service, client: u64, to: &mut Backend) -> Pick {
    if svc.count == 0 {
        return Pick::Refuse;
    }
    if svc.affinity_secs == 0 {
        return chosen(svc.id, svc.count, to);
    }
    let akey = AffinityKey {
        netns: client,
        id: svc.id,
        _pad: 0,
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: copied out at once.
    if let Some(a) = unsafe { SERVICE_AFFINITY.get(&akey) }.copied() {
        let fresh = now.wrapping_sub(a.last_ns) < u64::from(svc.affinity_secs) * 1_000_000_000;
        let member = MemberKey {
            id: svc.id,
            backend: a.backend,
        };
        // SAFETY: only tested for presence.
        if fresh && unsafe { SERVICE_MEMBERS.get(&member) }.is_some() {
            *to = a.backend;
            remember_affinity(&akey, a.backend, now);
            return Pick::To;
        }
    }
    let p = chosen(svc.id, svc.count, to);
    if p == Pick::To {
        remember_affinity(&akey, *to, now);
    }
    p
}

/// A backend of frontend `id` drawn uniformly among its `count` slots. A slot the agent
/// is rewriting may be missing for an instant: slot 0 then stands in.
#[inline(always)]
fn chosen(id: u32, count: u32, to: &mut Backend) -> Pick {
    // SAFETY: plain helper call.
    let index = unsafe { bpf_get_prandom_u32() } % count;
    // SAFETY: copied out at once.
    if let Some(b) = unsafe { SERVICE_BACKENDS.get(&BackendSlot { id, index }) } {
        *to = *b;
        return Pick::To;
    }
    // SAFETY: as above.
    match unsafe { SERVICE_BACKENDS.get(&BackendSlot { id, index: 0 }) } {
        Some(b) => {
            *to = *b;
            Pick::To
        }
        None => Pick::Refuse,
    }
}

#[inline(always)]
fn remember_affinity(key: &AffinityKey, backend: Backend, now: u64) {
    let value = Affinity {
        backend,
        _pad: 0,
        last_ns: now,
    };
    let _ = SERVICE_AFFINITY.insert(key, &value, 0);
}
