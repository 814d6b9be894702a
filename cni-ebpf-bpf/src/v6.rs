//! The IPv6 paths of the three tc programs, each its own program (`from_pod6`,
//! `uplink_ingress6`, `uplink_egress6`), tail-called by the attached one through the
//! `CALLS6` program array as soon as it sees an IPv6 frame (cilium keeps its families
//! apart the same way). Each then has the verifier's 512-byte stack to itself: IPv6
//! keys and NAT entries are two and a half times the IPv4 ones, and the two families'
//! frames would not fit one program. A slot left empty (a datapath being loaded) passes
//! the packet unchanged, as before IPv6 had a datapath (`pass_ipv6_not_loaded`).
//!
//! They do what the IPv4 programs do, under the same netfilter rule (`flows`): same-node
//! pod → pod straight into the destination pod (`bpf_redirect_peer`; the reply of a
//! Service flow goes to the stack); a pod flow leaving the node straight to the uplink
//! once it is verified to leave untranslated (the IPv6 FIB decides, and a packet too big
//! for the uplink goes to the stack, which answers "packet too big"); masquerade at the
//! uplink, its replies (and ICMPv6 errors about them) translated back; host ports and
//! hairpin. Neighbour discovery, router advertisements and DAD carry no translatable
//! tuple and are passed untouched; so is any packet with extension headers.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use cni_ebpf_common::{prog, Addr6, FlowFlags, NatDeliver, NatHook, Reason};

use crate::{
    family::Family,
    flows,
    forward::{deliver6, deliver_verified, to_uplink6},
    hostport::{self, HairpinGrant},
    icmp6,
    maps::{count, node_config, pod_traffic_to_stack, CALLS6},
    masq::{self, Granted},
    nat::{count_translated, nat_lookup, nat_remove, sweep_if_requested},
    parse::{parse6, read, ETH_P_IPV6, ETH_TYPE_OFF},
    policy,
    rewrite::{apply, rewrite_failed},
    tunnel, PASS,
};

/// `skb->cb[0]` as `from_pod` leaves it for `from_pod6`: the packet's source is one of
/// the pod's own addresses (else one of its allow-list).
const CB_OWN_SOURCE: u32 = 1;

/// Whether the frame is IPv6.
#[inline(always)]
pub(crate) fn is_ipv6(ctx: &TcContext) -> bool {
    read::<u16>(ctx, ETH_TYPE_OFF).is_ok_and(|t| t == ETH_P_IPV6.to_be())
}

/// Tail-calls the IPv6 program at `slot` of `CALLS6`; returns only if the slot is empty.
#[inline(always)]
pub(crate) fn call(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: the slots hold tc programs of this object, which take the same context;
    // control does not come back unless the call failed.
    unsafe { CALLS6.tail_call(ctx, slot) };
    count(Reason::PassIpv6NotLoaded);
    PASS
}

/// `from_pod` hands an IPv6 packet to `from_pod6`, with its source verdict (checked, and
/// the packet paced, before: those hold for every family).
#[inline(always)]
pub(crate) fn call_from_pod6(ctx: &TcContext, own_source: bool) -> i32 {
    // SAFETY: `cb` is the tc control block, ours while the packet is in tc.
    unsafe { (*ctx.skb.skb).cb[0] = if own_source { CB_OWN_SOURCE } else { 0 } };
    call(ctx, prog::CALL6_FROM_POD)
}

/// `from_pod`, IPv6 (tail call): hairpin flows (a pod to one of the node's IPv6 addresses
/// on a host port, and their replies) translated and delivered into the pod; same-node
/// pod → pod straight into the destination pod; verified flows leaving the node straight
/// to the uplink; everything else to the stack.
///
/// Stages called one after the other (as in [`uplink_egress6`]), each parsing the
/// headers itself: a new self-hairpin flow's port search would not fit under the others.
#[classifier]
pub fn from_pod6(ctx: TcContext) -> i32 {
    policy::forget_delivery();
    let v = from_pod6_stages(&ctx);
    policy::judge_delivery6(&ctx, v)
}

/// [`from_pod6`]'s stages; a delivery into a pod they arm is judged by NetworkPolicy
/// after them, in the program's shallowest frame ([`policy::judge_delivery6`]).
#[inline(always)]
fn from_pod6_stages(ctx: &TcContext) -> i32 {
    sweep_if_requested::<Addr6>();
    // SAFETY: as in `call_from_pod6`, which wrote it.
    let own_source = unsafe { (*ctx.skb.skb).cb[0] } == CB_OWN_SOURCE;
    if let Some(v) = pod6_known_or_local(&ctx) {
        return v;
    }
    let mut g = HairpinGrant::default();
    match pod6_hairpin_grant(&ctx, &mut g) {
        Some(Ok(())) => return pod6_hairpin_finish(&ctx, &g),
        Some(Err(v)) => return v,
        None => {}
    }
    pod6_rest(&ctx, own_source)
}

/// The verdict of a packet that is for a local pod (the reply of an existing hairpin
/// flow, else pod → pod), that belongs to an existing hairpin flow to a node address, or
/// that cannot be parsed; `None` for anything else. The local pod is looked up here only.
#[inline(never)]
fn pod6_known_or_local(ctx: &TcContext) -> Option<i32> {
    let p = match parse6(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Some(PASS);
        }
    };
    // Hairpin flows only ever go to a node address (client → hostPort) or to a local pod
    // (the replies).
    let local = p.daddr.local_endpoint();
    if local.is_none() && !p.daddr.is_node_addr() {
        return None;
    }
    if let Some(n) = nat_lookup(&p, NatHook::POD) {
        if !apply(ctx, &p, &n) {
            return Some(rewrite_failed());
        }
        count(Reason::HairpinForward);
        return Some(hostport::deliver_local(ctx, n.daddr));
    }
    let ep = local?;
    // Same-node pod → pod, unless netfilter must see it.
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
    Some(deliver6(ctx, &ep))
}

/// A new hairpin flow (the pod to one of the node's IPv6 addresses on a host port): its
/// grant in `g` (see [`hostport::hairpin_grant`]), or `Err(verdict)`; `None` when the
/// packet opens no hairpin flow.
#[inline(never)]
fn pod6_hairpin_grant(ctx: &TcContext, g: &mut HairpinGrant<Addr6>) -> Option<Result<(), i32>> {
    let p = parse6(ctx).ok()?;
    if !(p.natable && p.opens_hostport_flow() && p.daddr.is_node_addr()) {
        return None;
    }
    let (b, bp) = p.daddr.host_port_target(p.dport, p.proto)?;
    Some(hostport::hairpin_grant(&p, b, bp, g))
}

/// A granted hairpin flow: its forward entry, rewrite and delivery.
#[inline(never)]
fn pod6_hairpin_finish(ctx: &TcContext, g: &HairpinGrant<Addr6>) -> i32 {
    match parse6(ctx) {
        Ok(p) => hostport::hairpin_finish(ctx, &p, g),
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
fn pod6_rest(ctx: &TcContext, own_source: bool) -> i32 {
    let Ok(p) = parse6(ctx) else {
        return PASS;
    };
    if flows::may_bypass_stack(&p) {
        // SAFETY: reading a field of the context.
        let ifindex = unsafe { (*ctx.skb.skb).ifindex };
        return to_uplink6(ctx, &p, ifindex, own_source);
    }
    flows::to_stack(&p, own_source);
    PASS
}

/// `uplink_ingress`, IPv6 (tail call): replies of masqueraded flows, and ICMPv6 errors
/// about them, translated back; new flows to an IPv6 host port DNATed to the pod, keeping
/// the client's address; both delivered into the pod past the stack unless netfilter saw
/// the flow's other direction. Packets for a local pod whose flow is verified both ways
/// go straight in; flows opened from outside towards a pod are noted, so that its
/// replies are never masqueraded.
///
/// Stages called one after the other (as in [`uplink_egress6`]), each parsing the
/// headers itself: nested, their IPv6 frames would not fit the verifier's 512 bytes.
#[classifier]
pub fn uplink_ingress6(ctx: TcContext) -> i32 {
    policy::forget_delivery();
    let v = uplink_ingress6_stages(&ctx);
    policy::judge_delivery6(&ctx, v)
}

/// [`uplink_ingress6`]'s stages (see [`from_pod6_stages`]).
#[inline(always)]
fn uplink_ingress6_stages(ctx: &TcContext) -> i32 {
    sweep_if_requested::<Addr6>();
    match ingress6_known(&ctx) {
        Known::Verdict(v) => return v,
        Known::IcmpError => return ingress6_icmp_error(&ctx),
        Known::No => {}
    }
    if let Some(v) = ingress6_dnat(&ctx) {
        return v;
    }
    ingress6_rest(&ctx)
}

/// What [`ingress6_known`] found.
enum Known {
    /// A packet of a translated flow (or one that cannot be parsed): its verdict.
    Verdict(i32),
    /// An ICMPv6 error: [`ingress6_icmp_error`]'s.
    IcmpError,
    /// Neither.
    No,
}

/// A packet of a translated flow, translated back and delivered.
#[inline(never)]
fn ingress6_known(ctx: &TcContext) -> Known {
    let p = match parse6(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Known::Verdict(PASS);
        }
    };
    if tunnel::is_underlay(&p, p.daddr) {
        return Known::Verdict(PASS);
    }
    if icmp6::is_error(&p) {
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
    Known::Verdict(hostport::deliver_local(ctx, n.daddr))
}

/// An ICMPv6 error, about a translated flow or not (see [`icmp6::error_in`]). Its own
/// stage: its frame would not fit under [`ingress6_known`]'s.
#[inline(never)]
fn ingress6_icmp_error(ctx: &TcContext) -> i32 {
    match parse6(ctx) {
        Ok(p) => icmp6::error_in(ctx, &p),
        Err(_) => PASS,
    }
}

/// A new flow to an IPv6 host port ([`hostport::dnat_new`]); `None` when not one.
#[inline(never)]
fn ingress6_dnat(ctx: &TcContext) -> Option<i32> {
    let p = parse6(ctx).ok()?;
    hostport::dnat_new(ctx, &p)
}

/// Anything else for a local pod: straight in when its flow is verified both ways, else
/// to the stack, a flow from outside noted.
#[inline(never)]
fn ingress6_rest(ctx: &TcContext) -> i32 {
    if let Ok(p) = parse6(ctx) {
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

/// `uplink_egress`, IPv6 (tail call): masquerade of pod flows leaving the cluster.
///
/// Three BPF functions called one after the other, not one inside the other: the
/// lookup's frame, a new flow's port search (under which the search's callback runs)
/// and its forward entry and rewrite would not fit the verifier's 512 bytes stacked,
/// with IPv6 keys and entries. The later stages parse the headers again, which costs
/// less than the stack it saves, and only on a flow's first packet. A sweep of the NAT
/// table asked for by a new flow runs here, on the next packet
/// (`Family::SWEEP_DEFERRED`).
#[classifier]
pub fn uplink_egress6(ctx: TcContext) -> i32 {
    sweep_if_requested::<Addr6>();
    if let Some(v) = egress6_first(&ctx) {
        return v;
    }
    let flow = match egress6_known(&ctx) {
        Ok(v) => return v,
        Err(flow) => flow,
    };
    let mut g = Granted::default();
    if let Some(v) = egress6_grant(&ctx, flow, &mut g) {
        return v;
    }
    egress6_finish(&ctx, &g)
}

/// The verdict before any flow lookup, if there is one: the node's own tunnel traffic
/// passes ([`tunnel::is_underlay`]); a local pod's packet that NetworkPolicy does not let
/// leave the node is dropped (see [`policy::admits_leaving`]). A packet that cannot be
/// parsed is the next stage's.
#[inline(never)]
fn egress6_first(ctx: &TcContext) -> Option<i32> {
    let p = parse6(ctx).ok()?;
    if tunnel::is_underlay(&p, p.saddr) {
        return Some(PASS);
    }
    (!policy::admits_leaving(ctx, p.saddr, true)).then_some(TC_ACT_SHOT as i32)
}

/// A packet of a translated flow (`Ok(verdict)`; `Ok(PASS)` too when it cannot be
/// parsed), or what the flow table knows of a flow with no NAT entry (`Err`, see
/// [`flows::seen_leaving`]).
#[inline(never)]
fn egress6_known(ctx: &TcContext) -> Result<i32, Option<FlowFlags>> {
    let p = match parse6(ctx) {
        Ok(p) => p,
        Err(r) => {
            count(r);
            return Ok(PASS);
        }
    };
    let flow = flows::seen_leaving(&p);
    let Some(n) = nat_lookup(&p, NatHook::UPLINK_OUT) else {
        return Err(flow);
    };
    if !apply(ctx, &p, &n) {
        return Ok(rewrite_failed());
    }
    count_translated(n.kind);
    Ok(TC_ACT_OK as i32)
}

/// A packet with no NAT entry: a verdict, or a new masqueraded flow's port in `g` (see
/// [`masq::grant`]).
#[inline(never)]
fn egress6_grant(ctx: &TcContext, flow: Option<FlowFlags>, g: &mut Granted<Addr6>) -> Option<i32> {
    let p = parse6(ctx).ok()?;
    masq::grant(&p, flow, g).err()
}

/// A new masqueraded flow, granted: its forward entry and the packet's rewrite (see
/// [`masq::finish_new_flow`]).
#[inline(never)]
fn egress6_finish(ctx: &TcContext, g: &Granted<Addr6>) -> i32 {
    let Ok(p) = parse6(ctx) else {
        // The same bytes parsed a moment ago: not reached; the reverse entry goes.
        nat_remove(&g.rev_key);
        return PASS;
    };
    match masq::finish_new_flow(ctx, &p, g) {
        Some(v) => v,
        None => masq::table_refused::<Addr6>(),
    }
}
