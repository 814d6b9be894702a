//! The uplink's two directions (`uplink_ingress`, `uplink_egress`, and their IPv6
//! programs): the decisions written once for both families.
//!
//! Ingress, in order: the node's own tunnel traffic passes; an ICMP error is translated
//! back if it is about a translated flow; a packet of a translated flow (a masqueraded
//! flow's reply, a host-port or Service flow) is translated back and delivered (or, for
//! a Service flow sent on to another node, routed out again); a new flow to a host port
//! is DNATed to its pod, keeping the client's address; a new flow to a Service frontend
//! is sent to one of its backends ([`nodeport`]); anything else for a local pod goes
//! straight in when its flow is verified both ways, else to the stack, a flow opened
//! from outside noted (its replies are never masqueraded).
//!
//! Egress, in order: the node's own tunnel traffic passes; a local pod's packet that
//! NetworkPolicy does not let leave the node is dropped; a packet of a translated flow is
//! translated; a new pod flow leaving the cluster is masqueraded.
//!
//! As in [`crate::pod`], each stage is a BPF function of its own that parses the headers
//! itself: nested, the IPv6 frames would not fit the verifier's 512 bytes. A new flow's
//! port search (under which the search's callback runs) and its forward entry and rewrite
//! are two stages for the same reason; the later stages parse again, which costs less
//! than the stack it saves, and only on a flow's first packet.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{FlowFlags, NatDeliver, NatHook, Reason};

use crate::{
    family::Family,
    flows,
    forward::{self, deliver_verified, PodDelivery},
    hostport,
    maps::{count, node_config},
    masq::{self, Granted},
    nat::{count_translated, nat_lookup, nat_remove, sweep_if_requested},
    nodeport, policy,
    rewrite::{apply, rewrite_failed},
    tunnel, wireguard, PASS,
};

/// The ingress stages of a packet of family `A`.
#[inline(always)]
pub(crate) fn ingress<A: Family>(ctx: &TcContext) -> i32 {
    if A::SWEEP_DEFERRED {
        sweep_if_requested::<A>();
    }
    match ingress_known::<A>(ctx) {
        FlowMatch::Verdict(v) => return v,
        FlowMatch::Underlay if A::IPV6 => return PASS,
        FlowMatch::Underlay => return tunnel::decap4(ctx),
        FlowMatch::IcmpError => return ingress_icmp_error::<A>(ctx),
        FlowMatch::Route => return route_out::<A>(ctx),
        FlowMatch::No => {}
    }
    if let Some(v) = ingress_dnat::<A>(ctx) {
        return v;
    }
    let mut chosen = nodeport::Chosen::<A>::default();
    if let Some(v) = ingress_service(ctx, &mut chosen) {
        return v;
    }
    match chosen.to {
        nodeport::LOCAL => ingress_service_local(ctx, &chosen),
        nodeport::REMOTE => ingress_service_remote(ctx, &chosen),
        _ => ingress_rest::<A>(ctx),
    }
}

/// A new Service flow to a backend on another node: granted a port, its entries
/// written, the packet rewritten and routed out, one stage after the other. A function
/// of its own, so that the grant is in its frame, not the program's.
#[inline(never)]
fn ingress_service_remote<A: Family>(ctx: &TcContext, chosen: &nodeport::Chosen<A>) -> i32 {
    let mut src = A::default();
    let mut g = Granted::<A>::default();
    if forward::source_towards(ctx, &chosen.addr, &mut src) {
        g.prefer(src);
    }
    if let Some(v) = ingress_service_grant(ctx, chosen, &mut g) {
        return v;
    }
    if let Some(v) = ingress_service_finish(ctx, chosen, &g) {
        return v;
    }
    route_out::<A>(ctx)
}

/// What [`ingress_known`] (or [`tunnel_service_reply`]) found.
pub(crate) enum FlowMatch {
    /// A packet of a translated flow, or one that cannot be parsed: its verdict.
    Verdict(i32),
    /// An ICMP error: [`ingress_icmp_error`]'s.
    IcmpError,
    /// A packet of a Service flow sent on to another node, translated: [`route_out`]'s.
    Route,
    /// The node's own tunnel traffic: over IPv4 for `tunnel::decap4` (called from the
    /// program's own frame), else passed.
    Underlay,
    /// Neither.
    No,
}

/// A packet of a translated flow, translated back and delivered (into the pod past the
/// stack, unless netfilter saw the flow's other direction).
#[inline(never)]
fn ingress_known<A: Family>(ctx: &TcContext) -> FlowMatch {
    let p = match A::parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return FlowMatch::Verdict(PASS);
        }
    };
    if tunnel::is_underlay(&p, p.daddr) {
        return FlowMatch::Underlay;
    }
    if wireguard::is_underlay(&p, p.daddr, false) {
        return FlowMatch::Verdict(PASS);
    }
    if A::is_icmp_error(&p) {
        return FlowMatch::IcmpError;
    }
    let Some(n) = nat_lookup(&p, NatHook::UPLINK_IN) else {
        return FlowMatch::No;
    };
    if !apply(ctx, &p, &n) {
        return FlowMatch::Verdict(rewrite_failed());
    }
    if n.deliver == NatDeliver::ROUTE {
        return FlowMatch::Route;
    }
    if n.deliver == NatDeliver::STACK {
        count(Reason::SnatReplyToStack);
        policy::note_to_stack();
        return FlowMatch::Verdict(TC_ACT_OK as i32);
    }
    count_translated(n.kind);
    FlowMatch::Verdict(hostport::deliver_local(ctx, n.daddr, PodDelivery::Peer))
}

/// An ICMP error, about a translated flow or not ([`Family::icmp_error_in`]). Its own
/// stage: its frame would not fit under [`ingress_known`]'s.
#[inline(never)]
fn ingress_icmp_error<A: Family>(ctx: &TcContext) -> i32 {
    match A::parse(ctx) {
        Ok(p) => A::icmp_error_in(ctx, &p),
        Err(_) => PASS,
    }
}

/// A new flow to a host port ([`hostport::dnat_new`]); `None` when not one.
#[inline(never)]
fn ingress_dnat<A: Family>(ctx: &TcContext) -> Option<i32> {
    let p = A::parse(ctx).ok()?;
    hostport::dnat_new(ctx, &p)
}

/// A new flow to a Service frontend: its backend in `chosen` ([`nodeport::new_flow`]).
#[inline(never)]
fn ingress_service<A: Family>(ctx: &TcContext, chosen: &mut nodeport::Chosen<A>) -> Option<i32> {
    let p = A::parse(ctx).ok()?;
    nodeport::new_flow(&p, chosen)
}

/// A new Service flow to a backend on this node: DNATed to it, the client's address
/// kept ([`hostport::dnat_to`]).
#[inline(never)]
fn ingress_service_local<A: Family>(ctx: &TcContext, chosen: &nodeport::Chosen<A>) -> i32 {
    match A::parse(ctx) {
        Ok(p) => hostport::dnat_to(ctx, &p, chosen.addr, chosen.port, Reason::ServiceNew),
        Err(_) => PASS,
    }
}

/// A new Service flow to another node: its port and reverse entry ([`nodeport::grant`]),
/// from the address `g` prefers, if any.
#[inline(never)]
fn ingress_service_grant<A: Family>(
    ctx: &TcContext,
    remote: &nodeport::Chosen<A>,
    g: &mut Granted<A>,
) -> Option<i32> {
    let Ok(p) = A::parse(ctx) else {
        return Some(PASS);
    };
    nodeport::grant(&p, remote, g).err()
}

/// A new Service flow to another node, granted: its forward entry and rewrite
/// ([`nodeport::finish`]); `None`: to be routed out.
#[inline(never)]
fn ingress_service_finish<A: Family>(
    ctx: &TcContext,
    remote: &nodeport::Chosen<A>,
    g: &Granted<A>,
) -> Option<i32> {
    let Ok(p) = A::parse(ctx) else {
        // The same bytes parsed a moment ago: not reached; the reverse entry goes.
        nat_remove(&g.rev_key);
        return Some(PASS);
    };
    nodeport::finish(ctx, &p, remote, g)
}

/// A translated packet of a Service flow sent on to another node, or of its reply:
/// routed out ([`Family::route_out`]).
#[inline(never)]
pub(crate) fn route_out<A: Family>(ctx: &TcContext) -> i32 {
    let (Ok(p), Some(cfg)) = (A::parse(ctx), node_config()) else {
        return TC_ACT_SHOT as i32;
    };
    A::route_out(ctx, &p, cfg.uplink_ifindex)
}

/// A reply of a Service flow sent on to a backend on another node, come out of the
/// tunnel (`tunnel::from_tunnel`): translated back, [`FlowMatch::Route`] (the caller routes
/// it out to the client, [`route_out`]: not from here, whose frame would add to it).
/// [`FlowMatch::No`] when the packet is not one.
#[inline(never)]
pub(crate) fn tunnel_service_reply<A: Family>(ctx: &TcContext) -> FlowMatch {
    let Ok(p) = A::parse(ctx) else {
        return FlowMatch::No;
    };
    if !p.daddr.is_node_addr() {
        return FlowMatch::No;
    }
    let Some(n) = nat_lookup(&p, NatHook::UPLINK_IN) else {
        return FlowMatch::No;
    };
    if n.deliver != NatDeliver::ROUTE {
        return FlowMatch::No;
    }
    if !apply(ctx, &p, &n) {
        return FlowMatch::Verdict(rewrite_failed());
    }
    FlowMatch::Route
}

/// Anything else for a local pod: straight in when its flow is verified both ways, else
/// to the stack, a flow from outside noted. A packet to the stack for a local pod, or
/// from another node's pod for one of this node's addresses, is noted for
/// [`policy::settle`] (netfilter may translate a reply of it back to a pod).
#[inline(never)]
fn ingress_rest<A: Family>(ctx: &TcContext) -> i32 {
    if let (Ok(p), Some(cfg)) = (A::parse(ctx), node_config()) {
        if let Some(ep) = p.daddr.local_endpoint() {
            if let Some(v) = deliver_verified(ctx, &p, &ep) {
                return v;
            }
            flows::note_inbound(&p, cfg);
            policy::note_to_stack();
        } else if p.saddr.in_cluster(cfg) && p.daddr.is_node_addr() {
            policy::note_to_stack();
        }
    }
    count(Reason::PassNoMatch);
    PASS
}

/// The egress stages of a packet of family `A`.
#[inline(always)]
pub(crate) fn egress<A: Family>(ctx: &TcContext) -> i32 {
    if A::SWEEP_DEFERRED {
        sweep_if_requested::<A>();
    }
    if let Some(v) = egress_first::<A>(ctx) {
        return v;
    }
    let mut flow = Leaving::default();
    if let Some(v) = egress_known::<A>(ctx, &mut flow) {
        return v;
    }
    let mut g = Granted::<A>::default();
    if let Some(v) = egress_grant(ctx, &flow, &mut g) {
        return v;
    }
    egress_finish(ctx, &g)
}

/// The verdict before any flow lookup, if there is one: the node's own tunnel and
/// WireGuard traffic passes ([`tunnel::is_underlay`], [`wireguard::is_underlay`]); a
/// local pod's packet that NetworkPolicy does not let leave the node is dropped (see
/// [`policy::admits_leaving`]); with encryption on, pod traffic for another node goes
/// into WireGuard ([`wireguard::steer`]). A packet that cannot be parsed is the next
/// stage's.
#[inline(never)]
fn egress_first<A: Family>(ctx: &TcContext) -> Option<i32> {
    let p = A::parse(ctx).ok()?;
    if tunnel::is_underlay(&p, p.saddr) || wireguard::is_underlay(&p, p.saddr, true) {
        return Some(PASS);
    }
    if !policy::admits_leaving(ctx, p.saddr, p.daddr, A::IPV6) {
        return Some(TC_ACT_SHOT as i32);
    }
    wireguard::steer(p.saddr, p.daddr)
}

/// What [`egress_known`] learnt of a flow with no NAT entry, for [`egress_grant`]: the
/// flags of the pod flow it belongs to, if a pod sent exactly this tuple (see
/// [`flows::seen_leaving`]). Plain fields, not an `Option`: an `Option` written or returned
/// across stages leaves part of a register undefined, which the verifier refuses.
#[derive(Default)]
struct Leaving {
    pod_flow: bool,
    flags: FlowFlags,
}

/// A packet of a translated flow: its verdict (`PASS` too when it cannot be parsed).
/// `None` when the flow has no NAT entry, with what the flow table knows of it in `flow`.
#[inline(never)]
fn egress_known<A: Family>(ctx: &TcContext, flow: &mut Leaving) -> Option<i32> {
    let p = match A::parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Some(PASS);
        }
    };
    if let Some(flags) = flows::seen_leaving(&p) {
        flow.pod_flow = true;
        flow.flags = flags;
    }
    let n = nat_lookup(&p, NatHook::UPLINK_OUT)?;
    if !apply(ctx, &p, &n) {
        return Some(rewrite_failed());
    }
    count_translated(n.kind);
    Some(TC_ACT_OK as i32)
}

/// A packet with no NAT entry: a verdict, or a new masqueraded flow's port in `g` (see
/// [`masq::grant`]).
#[inline(never)]
fn egress_grant<A: Family>(ctx: &TcContext, flow: &Leaving, g: &mut Granted<A>) -> Option<i32> {
    let p = A::parse(ctx).ok()?;
    masq::grant(&p, flow.pod_flow.then_some(flow.flags), g).err()
}

/// A new masqueraded flow, granted: its forward entry and the packet's rewrite (see
/// [`masq::finish_new_flow`]).
#[inline(never)]
fn egress_finish<A: Family>(ctx: &TcContext, g: &Granted<A>) -> i32 {
    let Ok(p) = A::parse(ctx) else {
        // The same bytes parsed a moment ago: not reached; the reverse entry goes.
        nat_remove(&g.rev_key);
        return PASS;
    };
    match masq::finish_new_flow(ctx, &p, g) {
        Some(v) => v,
        None => masq::table_refused::<A>(),
    }
}
