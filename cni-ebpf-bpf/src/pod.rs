//! A pod's packet at its host veth's ingress (`from_pod`, and `from_pod6` for IPv6): who
//! sent it ([`sender`]: the source check and pacing, once for both families), then the
//! decisions on where it goes ([`stages`]), written once for both families.
//!
//! In order: the packet of an existing hairpin flow, or for a local pod (same-node
//! pod → pod straight into the destination pod, unless netfilter must see it); a new
//! hairpin flow (the pod to one of the node's addresses on a host port); else a flow
//! leaving the node, straight to the uplink once it is verified to leave untranslated,
//! or to the stack.
//!
//! Each stage is a BPF function of its own that parses the headers itself, called one
//! after the other, not one inside the other: with IPv6 keys and NAT entries, a new
//! hairpin flow's port search would not fit under the others in the verifier's 512 bytes.
//! Parsing again costs less than the stack it saves, and only packets that get past the
//! first stage pay it.

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use cni_ebpf_common::{NatHook, Reason};

use crate::{
    family::Family,
    flows,
    forward::PodDelivery,
    guard::{check_source, Verdict},
    hostport::{self, HairpinGrant},
    maps::{count, pod_traffic_to_stack, Source},
    nat::{nat_lookup, nat_remove, sweep_if_requested},
    pacing, policy,
    rewrite::{apply, rewrite_failed},
    PASS,
};

/// What the entry point learnt of the packet's sender before these stages.
#[derive(Clone, Copy)]
pub(crate) struct Sender {
    /// The source is one of the pod's own addresses (else one of its allow-list).
    pub(crate) own_source: bool,
    /// The pod holds host ports (or the source is allow-listed): replies of hairpin flows
    /// may come from it.
    pub(crate) host_ports: bool,
    /// How a packet of this pod's is handed into another local pod: from a veth's tc
    /// ingress, or from a netkit pod's transmit path.
    pub(crate) handover: PodDelivery,
}

/// Who sent the packet, for every family: a pod speaks only as itself, and a pod with an
/// egress rate has every packet it sends scheduled, whatever path it takes. `Err`: the
/// packet is dropped (a spoofed source, or over the rate).
///
/// A source that is not the pod's is dropped here, whatever path the packet would take
/// (fast path or kernel, IPv4 or IPv6, fragment or not). The verdict is kept: only the
/// pod's own address may take the uplink fast path or be recorded in the flow tables,
/// and nothing needs to look it up again. Its own BPF function: the stages run under the
/// program's frame, not under this one.
#[inline(never)]
pub(crate) fn sender(ctx: &TcContext, ifindex: u32, handover: PodDelivery) -> Result<Sender, i32> {
    let source = match check_source(ctx, ifindex) {
        Verdict::Allowed(s) => s,
        Verdict::Spoofed => {
            count(Reason::DropSpoofedSource);
            return Err(TC_ACT_SHOT as i32);
        }
    };
    // Only another source than the pod's own costs the extra lookup of the rate.
    let (paced, host_ports) = match source {
        Source::Own { paced, host_ports } => (paced, host_ports),
        Source::AllowListed => (true, true),
    };
    if paced && !pacing::pace(ctx, ifindex) {
        count(Reason::DropEgressRate);
        return Err(TC_ACT_SHOT as i32);
    }
    Ok(Sender {
        own_source: matches!(source, Source::Own { .. }),
        host_ports,
        handover,
    })
}

/// The stages of a pod's packet of family `A`.
#[inline(always)]
pub(crate) fn stages<A: Family>(ctx: &TcContext, sender: Sender) -> i32 {
    if A::SWEEP_DEFERRED {
        sweep_if_requested::<A>();
    }
    let mut to_node = false;
    if let Some(v) = known_or_local::<A>(ctx, sender, &mut to_node) {
        return v;
    }
    if to_node {
        let mut g = HairpinGrant::<A>::default();
        match hairpin_grant(ctx, &mut g) {
            Some(Ok(())) => return hairpin_finish(ctx, &g, sender.handover),
            Some(Err(v)) => return v,
            None => {}
        }
    }
    leaving::<A>(ctx, sender)
}

/// The verdict of a packet that is for a local pod (the reply of an existing hairpin
/// flow, else pod → pod), that belongs to an existing hairpin flow to a node address, or
/// that cannot be parsed; `None` for anything else, with `to_node` set when the packet is
/// for one of the node's addresses.
#[inline(never)]
fn known_or_local<A: Family>(ctx: &TcContext, sender: Sender, to_node: &mut bool) -> Option<i32> {
    let p = match A::parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Some(PASS);
        }
    };
    // Hairpin flows only ever go to a node address (client → hostPort) or to a local pod
    // (the replies, sent by the pod behind the host port): traffic leaving the node, and a
    // pod without host ports talking to another pod, skip their lookups.
    let local = p.daddr.local_endpoint();
    *to_node = local.is_none() && p.daddr.is_node_addr();
    if local.is_none() && !*to_node {
        return None;
    }
    // Should it go to the stack, netfilter may translate it on to a local pod (its
    // un-DNAT of a Service reply, its un-SNAT of a flow it masqueraded to a node address):
    // noted, so that the reply of an admitted flow is marked as one (`policy::settle`).
    policy::note_to_stack();
    if sender.host_ports || *to_node {
        if let Some(n) = nat_lookup(&p, NatHook::POD) {
            if !apply(ctx, &p, &n) {
                return Some(rewrite_failed());
            }
            count(Reason::HairpinForward);
            return Some(hostport::deliver_local(ctx, n.daddr, sender.handover));
        }
    }
    let ep = local?;
    // Same-node pod → pod, unless netfilter must see it (the reply of a Service flow, or
    // a packet whose flow we cannot tell).
    if !p.natable || flows::is_translated_reply(&p) {
        count(Reason::PassTranslatedReply);
        return Some(PASS);
    }
    if pod_traffic_to_stack() {
        count(Reason::PassPodTrafficToStack);
        return Some(PASS);
    }
    flows::opens_direct(&p);
    count(Reason::RedirectPod);
    Some(A::deliver(ctx, &ep, sender.handover))
}

/// A packet for one of the node's addresses that opens a new hairpin flow (to a host
/// port): its grant in `g` (see [`hostport::hairpin_grant`]), or `Err(verdict)`; `None`
/// when the packet opens no hairpin flow.
#[inline(never)]
fn hairpin_grant<A: Family>(ctx: &TcContext, g: &mut HairpinGrant<A>) -> Option<Result<(), i32>> {
    let p = A::parse(ctx).ok()?;
    if !(p.natable && p.opens_hostport_flow()) {
        return None;
    }
    let (b, bp) = p.daddr.host_port_target(p.dport, p.proto)?;
    Some(hostport::hairpin_grant(&p, b, bp, g))
}

/// A granted hairpin flow: its forward entry, rewrite and delivery.
#[inline(never)]
fn hairpin_finish<A: Family>(ctx: &TcContext, g: &HairpinGrant<A>, how: PodDelivery) -> i32 {
    match A::parse(ctx) {
        Ok(p) => hostport::hairpin_finish(ctx, &p, g, how),
        // The same bytes parsed a moment ago: not reached; the reverse entry goes.
        Err(_) => {
            nat_remove(&g.rev_key);
            PASS
        }
    }
}

/// A packet not for a local pod: a flow leaving the node straight to the uplink once it
/// is verified to leave untranslated; else to the stack.
#[inline(never)]
fn leaving<A: Family>(ctx: &TcContext, sender: Sender) -> i32 {
    let Ok(p) = A::parse(ctx) else {
        return PASS;
    };
    if flows::may_bypass_stack(&p) {
        // SAFETY: reading a field of the context.
        let ifindex = unsafe { (*ctx.skb.skb).ifindex };
        return A::to_uplink(ctx, &p, ifindex, sender.own_source);
    }
    flows::to_stack(&p, sender.own_source);
    PASS
}
