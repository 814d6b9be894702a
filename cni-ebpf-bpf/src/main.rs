#![no_std]
#![no_main]
// `atomic_xadd`: the BPF target has no `core::sync::atomic` types (see `nat::add_use`).
// Host builds (`cargo clippy --workspace` on stable) use the atomic types instead.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(
        internal_features,
        reason = "core_intrinsics: atomic_xadd, see nat::add_use"
    )
)]
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
//! then the stack; never a drop), and counts why in `REASONS`. The one exception to "never
//! a drop" for a translated packet: when its rewrite fails part-way it is no longer the
//! packet that arrived, so it is dropped (`drop_rewrite_failed`, see
//! [`rewrite::rewrite_failed`]) with the NAT entries a new flow made for it.
//!
//! One module per concern, as cilium's `bpf/lib/` keeps them apart; the entry points
//! below read as a short sequence of calls into them:
//! - [`parse`]: headers → [`parse::Pkt`];
//! - [`maps`]: the pinned maps and typed reads of them;
//! - [`family`]: what differs between IPv4 and IPv6 for the flow logic, which is written
//!   once, generic over it (NAT, flow tracking, masquerade);
//! - [`rewrite`]: tuple rewrite with checksums;
//! - [`nat`]: NAT entries, TCP close tracking, SNAT port search;
//! - [`flows`]: which pod flows may bypass the stack (living next to netfilter);
//! - [`forward`]: the routed hop, redirect into a pod or to the uplink;
//! - [`hostport`]: host-port DNAT and hairpin;
//! - [`masq`]: masquerade of pod flows leaving the cluster;
//! - [`icmp`], [`icmp6`]: ICMP and ICMPv6 errors about translated flows;
//! - [`sock`]: host ports for the node's own sockets (cgroup `sock_addr` programs);
//! - [`v6`]: the IPv6 programs, tail-called by the three above (`CALLS6`).

mod family;
mod flows;
mod forward;
mod guard;
mod hostport;
mod icmp;
mod icmp6;
mod maps;
mod masq;
mod nat;
mod pacing;
mod parse;
mod policy;
mod rewrite;
mod sock;
mod tunnel;
mod v6;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC},
    macros::classifier,
    programs::TcContext,
};
use cni_ebpf_common::{prog, proto, NatDeliver, NatHook, Reason};

use crate::{
    forward::{deliver, deliver_verified, to_uplink},
    guard::{check_source, Verdict},
    maps::{
        add_stats, count, is_node_addr, local_endpoint, node_config, pod_traffic_to_stack,
        port_mapping, Source,
    },
    nat::{count_translated, nat_lookup},
    parse::{parse, ICMP_DEST_UNREACH, ICMP_PARAMETER_PROB, ICMP_TIME_EXCEEDED},
    rewrite::{apply, rewrite_failed},
};

/// Verdict for packets we leave untouched: "next" (`TCX_NEXT` under tcx, the next filter
/// under legacy clsact), so other tools' programs still see them; the stack gets them if
/// nobody else decides.
pub(crate) const PASS: i32 = TC_ACT_UNSPEC;

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
    // A pod speaks only as itself: whatever path the packet would take (fast path or
    // kernel, IPv4 or IPv6, fragment or not), a source that is not the pod's is dropped
    // here. The verdict is kept: only the pod's own IPv4 address may take the uplink fast
    // path or be recorded in the flow tables, and nothing needs to look it up again.
    // (Not IPv4: `parse` passes it on below; nothing is recorded for it.)
    let source = match check_source(ctx, ifindex) {
        Verdict::Allowed(s) => s,
        Verdict::Spoofed => {
            count(Reason::DropSpoofedSource);
            return Ok(TC_ACT_SHOT as i32);
        }
    };
    // A pod with an egress rate: every packet it sends is scheduled (or dropped), whatever
    // path it takes. Only another source than its own costs the extra lookup.
    let (paced, host_ports) = match source {
        Source::Own { paced, host_ports } => (paced, host_ports),
        Source::AllowListed => (true, true),
    };
    if paced && !pacing::pace(ctx, ifindex) {
        count(Reason::DropEgressRate);
        return Ok(TC_ACT_SHOT as i32);
    }
    let own_source = matches!(source, Source::Own { .. });
    if v6::is_ipv6(ctx) {
        return Ok(v6::call_from_pod6(ctx, own_source));
    }
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    // Hairpin flows only ever go to a node address (client → hostPort) or to a local pod
    // (the replies, sent by the pod behind the host port): traffic leaving the node, and
    // a pod without host ports talking to another pod, skip their lookups.
    let dst_ep = local_endpoint(p.daddr);
    let to_node = dst_ep.is_none() && is_node_addr(p.daddr);
    if (dst_ep.is_some() && host_ports) || to_node {
        // An existing hairpin flow.
        if let Some(n) = nat_lookup(&p, NatHook::POD) {
            if !apply(ctx, &p, &n) {
                return Ok(rewrite_failed());
            }
            count(Reason::HairpinForward);
            return Ok(hostport::deliver_local(ctx, n.daddr));
        }
    }

    // A new hairpin flow: a pod to one of this node's addresses on a host port.
    if to_node && p.natable && p.opens_hostport_flow() {
        if let Some(t) = port_mapping(p.daddr, p.dport, p.proto) {
            return Ok(hostport::hairpin_new(ctx, &p, t.addr, t.port));
        }
    }

    // Same-node pod → pod, unless netfilter must see it (the reply of a Service flow, or
    // a packet whose flow we cannot tell).
    if let Some(ep) = dst_ep {
        if !p.natable || flows::is_translated_reply(&p) {
            count(Reason::PassTranslatedReply);
            return Ok(PASS);
        }
        if pod_traffic_to_stack() {
            count(Reason::PassPodTrafficToStack);
            return Ok(PASS);
        }
        flows::opens_direct(&p);
        count(Reason::RedirectPod);
        return Ok(deliver(ctx, &ep));
    }

    // Leaving the node (or for the node itself): straight to the uplink once the flow is
    // known to leave untranslated, else through the stack.
    if flows::may_bypass_stack(&p) {
        return Ok(to_uplink(ctx, &p, ifindex, own_source));
    }
    flows::to_stack(&p, own_source);
    Ok(PASS)
}

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
    if v6::is_ipv6(ctx) {
        return Ok(v6::call(ctx, prog::CALL6_UPLINK_INGRESS));
    }
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    if tunnel::is_underlay(&p, p.daddr) {
        return Ok(PASS);
    }
    if p.proto == proto::ICMP
        && matches!(
            p.icmp_type,
            ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROB
        )
    {
        return Ok(icmp::icmp_error_in(ctx, &p));
    }

    if let Some(n) = nat_lookup(&p, NatHook::UPLINK_IN) {
        if !apply(ctx, &p, &n) {
            return Ok(rewrite_failed());
        }
        if n.deliver == NatDeliver::STACK {
            count(Reason::SnatReplyToStack);
            return Ok(TC_ACT_OK as i32);
        }
        count_translated(n.kind);
        return Ok(hostport::deliver_local(ctx, n.daddr));
    }

    if let Some(v) = hostport::dnat_new(ctx, &p) {
        return Ok(v);
    }
    // For a local pod: straight in when the flow is verified both ways, else to the stack
    // (noting flows opened from outside, whose replies are never masqueraded).
    if let Some(ep) = local_endpoint(p.daddr) {
        if let Some(v) = deliver_verified(ctx, &p, &ep) {
            return Ok(v);
        }
        if let Some(cfg) = node_config() {
            flows::note_inbound(&p, &cfg);
        }
    }
    count(Reason::PassNoMatch);
    Ok(PASS)
}

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
    if v6::is_ipv6(ctx) {
        return Ok(v6::call(ctx, prog::CALL6_UPLINK_EGRESS));
    }
    let p = match parse(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };

    if tunnel::is_underlay(&p, p.saddr) {
        return Ok(PASS);
    }
    if !policy::admits_leaving(ctx, p.saddr, false) {
        return Ok(TC_ACT_SHOT as i32);
    }
    let flow = flows::seen_leaving(&p);
    if let Some(n) = nat_lookup(&p, NatHook::UPLINK_OUT) {
        if !apply(ctx, &p, &n) {
            return Ok(rewrite_failed());
        }
        count_translated(n.kind);
        return Ok(TC_ACT_OK as i32);
    }

    Ok(masq::masquerade_new(ctx, &p, flow))
}

/// Host veth egress: what the kernel's routing delivers to a pod (everything not
/// redirected into it by the programs above), judged by NetworkPolicy (see [`policy`]).
#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    policy::to_pod(&ctx)
}

#[classifier]
pub fn to_tunnel(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    tunnel::to_tunnel(&ctx)
}

#[classifier]
pub fn from_tunnel(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    tunnel::from_tunnel(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
