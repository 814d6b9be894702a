//! The uplink's two directions (`uplink_ingress`, `uplink_egress`, and their IPv6
//! programs): the decisions written once for both families.
//!
//! Ingress, in order: the node's own tunnel traffic passes; an ICMP error is translated
//! back if it is about a translated flow; a packet of a translated flow (a masqueraded
//! flow's reply, a host-port flow) is translated back and delivered; a new flow to a host
//! port is DNATed to its pod, keeping the client's address; anything else for a local pod
//! goes straight in when its flow is verified both ways, else to the stack, a flow
//! opened from outside noted (its replies are never masqueraded).
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
    forward::{deliver_verified, Handover},
    hostport,
    maps::{count, node_config},
    masq::{self, Granted},
    nat::{count_translated, nat_lookup, nat_remove, sweep_if_requested},
    policy,
    rewrite::{apply, rewrite_failed},
    tunnel, PASS,
};

/// The ingress stages of a packet of family `A`.
#[inline(always)]
pub(crate) fn ingress<A: Family>(ctx: &TcContext) -> i32 {
    if A::SWEEP_DEFERRED {
        sweep_if_requested::<A>();
    }
    match ingress_known::<A>(ctx) {
        Known::Verdict(v) => return v,
        Known::IcmpError => return ingress_icmp_error::<A>(ctx),
        Known::No => {}
    }
    if let Some(v) = ingress_dnat::<A>(ctx) {
        return v;
    }
    ingress_rest::<A>(ctx)
}

/// What [`ingress_known`] found.
enum Known {
    /// A packet of a translated flow, the node's own tunnel traffic, or one that cannot
    /// be parsed: its verdict.
    Verdict(i32),
    /// An ICMP error: [`ingress_icmp_error`]'s.
    IcmpError,
    /// Neither.
    No,
}

/// A packet of a translated flow, translated back and delivered (into the pod past the
/// stack, unless netfilter saw the flow's other direction).
#[inline(never)]
fn ingress_known<A: Family>(ctx: &TcContext) -> Known {
    let p = match A::parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Known::Verdict(PASS);
        }
    };
    if tunnel::is_underlay(&p, p.daddr) {
        return Known::Verdict(PASS);
    }
    if A::is_icmp_error(&p) {
        return Known::IcmpError;
    }
    let Some(n) = nat_lookup(&p, NatHook::UPLINK_IN) else {
        return Known::No;
    };
    if !apply(ctx, &p, &n) {
        return Known::Verdict(rewrite_failed());
    }
    if n.deliver == NatDeliver::STACK {
        count(Reason::SnatReplyToStack);
        return Known::Verdict(TC_ACT_OK as i32);
    }
    count_translated(n.kind);
    Known::Verdict(hostport::deliver_local(ctx, n.daddr, Handover::Peer))
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

/// Anything else for a local pod: straight in when its flow is verified both ways, else
/// to the stack, a flow from outside noted.
#[inline(never)]
fn ingress_rest<A: Family>(ctx: &TcContext) -> i32 {
    if let Ok(p) = A::parse(ctx) {
        if let Some(ep) = p.daddr.local_endpoint() {
            if let Some(v) = deliver_verified(ctx, &p, &ep) {
                return v;
            }
            if let Some(cfg) = node_config() {
                flows::note_inbound(&p, cfg);
            }
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

/// The verdict before any flow lookup, if there is one: the node's own tunnel traffic
/// passes ([`tunnel::is_underlay`]); a local pod's packet that NetworkPolicy does not let
/// leave the node is dropped (see [`policy::admits_leaving`]). A packet that cannot be
/// parsed is the next stage's.
#[inline(never)]
fn egress_first<A: Family>(ctx: &TcContext) -> Option<i32> {
    let p = A::parse(ctx).ok()?;
    if tunnel::is_underlay(&p, p.saddr) {
        return Some(PASS);
    }
    (!policy::admits_leaving(ctx, p.saddr, A::IPV6)).then_some(TC_ACT_SHOT as i32)
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
