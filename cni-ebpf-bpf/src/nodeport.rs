//! Services from outside the node (`--kube-proxy-replacement`): a new flow arriving on
//! the uplink for a NodePort (on any of the node's addresses), an external IP or a
//! load-balancer address is given one backend of the Service ([`service::choose`], with
//! the frontend's `SCOPE_UPLINK` entry: under `externalTrafficPolicy: Local` it holds
//! only this node's endpoints), once, and its packets are translated from then on by
//! NAT entries like the other translated flows':
//!
//! - a backend on this node: client C:cp → frontend D:dp becomes C:cp → B:bp, delivered
//!   into the pod past the stack with the client's address kept; the reply leaves as
//!   D:dp (the host-port translation, [`hostport::dnat_to`]);
//! - a backend on another node (`externalTrafficPolicy: Cluster`): C:cp → D:dp becomes
//!   N:np → B:bp (N the node's address its route to B prefers — in tunnel modes the
//!   tunnel device's —, np a port of the SNAT range), routed out of the uplink or into
//!   the tunnel device; the reply B:bp → N:np, arriving on the uplink (or
//!   out of the tunnel, `tunnel::from_tunnel`), becomes D:dp → C:cp and is routed back out
//!   (`forward::route_out`: the kernel would drop a packet arriving with the node's own
//!   address as source). Both entries are `NatDeliver::ROUTE`.
//!
//! A frontend without a usable backend drops the flow's first packet (counted,
//! `drop_service_no_backend`). Under `sessionAffinity: ClientIP` the client is its
//! address.
//!
//! Like [`masq`]'s, a new flow's port search and its forward entry are stages of their
//! own ([`crate::uplink`] runs them one after the other).

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{
    outside_client, proto, Backend, NatDeliver, NatHook, NatKind, Reason, SCOPE_UPLINK,
};

use crate::{
    family::Family,
    maps::{count, node_config},
    masq::{self, Granted},
    nat::{alloc_port, entry, forget_new_flow, nat_add, nat_remove, rev_key},
    parse::Pkt,
    rewrite::{apply, rewrite_failed},
    service::{self, Pick},
};

/// The backend chosen for a new flow ([`new_flow`]), for the next stages.
#[derive(Default)]
pub(crate) struct Chosen<A> {
    /// 0 (none: not a Service flow), [`LOCAL`] or [`REMOTE`] (plain fields, not an
    /// `Option`: see `uplink::Leaving`).
    pub(crate) to: u8,
    pub(crate) addr: A,
    pub(crate) port: u16,
}

/// [`Chosen::to`]: a backend on this node ([`hostport::dnat_to`]).
pub(crate) const LOCAL: u8 = 1;
/// [`Chosen::to`]: a backend on another node ([`grant`], [`finish`]).
pub(crate) const REMOTE: u8 = 2;

/// A new flow from outside to a Service frontend: its backend in `out`; `Some(verdict)`
/// when it is dropped; `None` with none chosen when `p` is not one.
#[inline(always)]
pub(crate) fn new_flow<A: Family>(p: &Pkt<A>, out: &mut Chosen<A>) -> Option<i32> {
    // Only a packet that may open a flow looks for a frontend: the packets of established
    // flows (most of what reaches this stage, on its way into a pod) pay nothing here. A
    // later packet of a flow whose entries are gone goes on to the stack, which resets it.
    if !(p.natable && (p.proto == proto::TCP || p.proto == proto::UDP) && p.opens_hostport_flow()) {
        return None;
    }
    let ask = Ask {
        daddr: p.daddr.wire(),
        client: outside_client(&p.saddr.wire()),
        dport: p.dport,
        proto: p.proto,
        node_addr: p.daddr.is_node_addr(),
    };
    let mut b = Backend {
        addr: [0; 16],
        port: 0,
        _pad: 0,
    };
    match backend_for(&ask, &mut b) {
        Pick::Pass => return None,
        Pick::Refuse => {
            count(Reason::DropServiceNoBackend);
            return Some(TC_ACT_SHOT as i32);
        }
        Pick::To => {}
    }
    let Some(addr) = A::from_wire(&b.addr) else {
        count(Reason::DropServiceNoBackend);
        return Some(TC_ACT_SHOT as i32);
    };
    out.to = if addr.local_endpoint().is_some() {
        LOCAL
    } else {
        REMOTE
    };
    out.addr = addr;
    out.port = b.port;
    None
}

/// What [`backend_for`] is asked: a new packet's destination, in the one layout of both
/// families, and its client.
struct Ask {
    daddr: [u8; 16],
    client: u64,
    dport: u16,
    proto: u8,
    /// The destination is one of the node's addresses (its NodePorts apply).
    node_addr: bool,
}

/// What becomes of the flow `ask` describes: not a frontend in `SCOPE_UPLINK` (`Pass`),
/// one without a usable backend (`Refuse`), or its backend, in `to`.
/// A BPF function of its own: the frontend's key and value, and the choice's, do not
/// add to the stage's frame, which holds the parsed packet.
#[inline(never)]
fn backend_for(ask: &Ask, to: &mut Backend) -> Pick {
    match service::frontend(ask.daddr, ask.dport, ask.proto, SCOPE_UPLINK, ask.node_addr) {
        Some(svc) => service::choose(&svc, ask.client, to),
        None => Pick::Pass,
    }
}

/// The first half of a new flow to backend `r` on another node: the node address and
/// port it is sent from, its reverse entry in the table (written to `out`); `Err` with
/// the verdict when refused. The address is the one `out` prefers on entry (the node's
/// route to the backend prefers it, `forward::source_towards`), else the node's own.
#[inline(always)]
pub(crate) fn grant<A: Family>(p: &Pkt<A>, r: &Chosen<A>, out: &mut Granted<A>) -> Result<(), i32> {
    let Some(cfg) = node_config() else {
        count(Reason::DropServiceUnroutable);
        return Err(TC_ACT_SHOT as i32);
    };
    let (src, _) = out.source();
    let node = if src != A::default() {
        src
    } else if let Some(a) = A::masquerade_addr(cfg) {
        a
    } else {
        count(Reason::DropServiceUnroutable);
        return Err(TC_ACT_SHOT as i32);
    };
    // B:bp → N:np goes back to the client as D:dp → C:cp. Charged to no pod: the flow is
    // no local pod's (the table's size bounds it).
    let mut rev = entry(
        p.daddr,
        p.saddr,
        p.dport,
        p.sport,
        NatHook::UPLINK_IN,
        NatKind::SERVICE_REV,
        0,
    );
    rev.deliver = NatDeliver::ROUTE;
    let Some(np) = alloc_port(cfg, r.addr, r.port, node, p.proto, &rev, 0) else {
        return Err(masq::no_port::<A>());
    };
    out.set(node, np, 0, rev_key(r.addr, r.port, node, np, p.proto));
    Ok(())
}

/// The second half: the forward entry and the packet's rewrite. `None` when the packet
/// is to be routed out now ([`crate::uplink`]'s next stage); else its verdict.
#[inline(always)]
pub(crate) fn finish<A: Family>(
    ctx: &TcContext,
    p: &Pkt<A>,
    r: &Chosen<A>,
    g: &Granted<A>,
) -> Option<i32> {
    let (node, np) = g.source();
    let mut fwd = entry(
        node,
        r.addr,
        np,
        r.port,
        NatHook::UPLINK_IN,
        NatKind::SERVICE_FWD,
        0,
    );
    fwd.deliver = NatDeliver::ROUTE;
    if !nat_add(&p.key(), &fwd, BPF_NOEXIST as u64) {
        nat_remove(&g.rev_key);
        return Some(masq::table_refused::<A>());
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &g.rev_key);
        return Some(rewrite_failed());
    }
    count(Reason::ServiceNewRouted);
    None
}
