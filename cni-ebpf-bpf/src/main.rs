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
//! The tc programs of cni-ebpf, grouped by attach point:
//!
//! - a pod's host veth: `from_pod` (ingress: traffic leaving the pod) checks the source
//!   and paces, then runs the stages of [`pod`]: hairpin (pod → own node's hostPort,
//!   including its own), same-node pod → pod straight into the destination pod, traffic
//!   routed out of the uplink redirected straight to it (FIB lookup, no kernel
//!   forwarding); `to_pod` (egress) judges what the kernel delivers by NetworkPolicy;
//! - a netkit pod's pair: `from_netkit` (the pod's transmit path) and `to_netkit` (the
//!   host device's) do the same work, handing packets into other pods by `bpf_redirect`
//!   ([`forward::PodDelivery`]);
//! - the uplink ([`uplink`]): `uplink_ingress` translates back replies of masqueraded
//!   flows and ICMP errors about them, DNATs nodeIP:hostPort to the pod keeping the
//!   client's source address, sends new flows to a Service's NodePort, external IP or
//!   load-balancer address to a backend ([`nodeport`]), and delivers verified flows into
//!   their pods;
//!   `uplink_egress` masquerades pod traffic leaving the cluster and restores replies of
//!   host-port flows to nodeIP:hostPort;
//! - the tunnel device ([`tunnel`]): `to_tunnel` sets the remote node of a pod's packet,
//!   `from_tunnel` checks who sent one and delivers it;
//! - with encryption on, `uplink_egress` and `to_tunnel` hand pod traffic for other
//!   nodes to the node's WireGuard device ([`wireguard`]);
//! - the node's sockets ([`sock`]): host ports for the node's own sockets, and Services
//!   for the node's and its pods' sockets ([`service`]) (cgroup `sock_addr` programs).
//!
//! The programs attached to the veth and the uplink see both families; an IPv6 frame is
//! handed at once to the same program's IPv6 twin (`from_pod6`, `uplink_ingress6`,
//! `uplink_egress6`) by a tail call ([`v6`]). Both run the same stages, generic over the
//! family ([`family`]); the twin has the verifier's 512-byte stack to itself.
//!
//! Every program passes what it does not own unchanged (`TC_ACT_UNSPEC`: "next program",
//! then the stack; never a drop), and counts why in `REASONS`. The one exception to "never
//! a drop" for a translated packet: when its rewrite fails part-way it is no longer the
//! packet that arrived, so it is dropped (`drop_rewrite_failed`, see
//! [`rewrite::rewrite_failed`]) with the NAT entries a new flow made for it.
//!
//! One module per concern, as cilium's `bpf/lib/` keeps them apart; the stages read as a
//! short sequence of calls into them:
//! - [`parse`]: headers → [`parse::Pkt`];
//! - [`maps`]: the pinned maps and typed reads of them;
//! - [`family`]: what differs between IPv4 and IPv6, so that everything else is written
//!   once, generic over it;
//! - [`rewrite`]: tuple rewrite with checksums;
//! - [`nat`]: NAT entries, TCP close tracking, SNAT port search;
//! - [`flows`]: which pod flows may bypass the stack (living next to netfilter);
//! - [`forward`]: the routed hop, redirect into a pod or to the uplink;
//! - [`guard`]: a pod speaks only as itself; [`pacing`]: its egress rate;
//! - [`hostport`]: host-port DNAT and hairpin;
//! - [`masq`]: masquerade of pod flows leaving the cluster;
//! - [`icmp`], [`icmp6`]: ICMP and ICMPv6 errors about translated flows;
//! - [`policy`]: NetworkPolicy verdicts; [`dns`]: the addresses pods learn from DNS
//!   answers, for rules that name domains;
//! - [`observe`]: flow events, every program's packets followed at its end, after its
//!   verdict.

mod dns;
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
mod nodeport;
mod observe;
mod pacing;
mod parse;
mod pod;
mod policy;
mod rewrite;
mod service;
mod sock;
mod tunnel;
mod uplink;
mod v6;
mod wireguard;

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};
use cni_ebpf_common::{prog, Addr4, Addr6, Reason};

use crate::{
    forward::PodDelivery,
    maps::{add_stats, count},
};

/// Verdict for packets we leave untouched: "next" (`TCX_NEXT` under tcx, the next filter
/// under legacy clsact), so other tools' programs still see them; the stack gets them if
/// nobody else decides.
pub(crate) const PASS: i32 = TC_ACT_UNSPEC;

// A pod's host veth.

/// Host veth ingress: traffic leaving a pod. Its source checked and the packet paced
/// (both families), then the stages of [`pod`].
#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    leaving_pod(&ctx, PodDelivery::Peer)
}

/// A netkit pod's transmit path (the netkit peer's program): traffic leaving the pod,
/// as [`from_pod`] takes it at a host veth's ingress; the kernel has already made the
/// packet its host device's, whose ifindex it carries.
#[classifier]
pub fn from_netkit(ctx: TcContext) -> i32 {
    leaving_pod(&ctx, PodDelivery::Transmit)
}

/// [`from_pod`] and [`from_netkit`]: the pod's packet, where it runs handing packets
/// into other pods as `how` can.
#[inline(always)]
fn leaving_pod(ctx: &TcContext, how: PodDelivery) -> i32 {
    count(Reason::Seen);
    let ifindex = ifindex(ctx);
    add_stats(ifindex, ctx.len(), false);
    let sender = match pod::sender(ctx, ifindex, how) {
        Ok(s) => s,
        Err(v) => {
            observe::sent(ctx, ifindex, v);
            return v;
        }
    };
    if v6::is_ipv6(ctx) {
        return v6::call_from_pod6(ctx, sender);
    }
    policy::begin();
    let v = pod::stages::<Addr4>(ctx, sender);
    let v = policy::settle(ctx, v, false);
    observe::received(ctx, policy::delivered(), v);
    observe::sent(ctx, ifindex, v);
    v
}

/// `from_pod` for IPv6 (tail-called by it, the source checked and the packet paced). A
/// delivery into a pod its stages arm is judged by NetworkPolicy after them, in the
/// program's shallowest frame ([`policy::settle6`]).
#[classifier]
pub fn from_pod6(ctx: TcContext) -> i32 {
    policy::begin();
    let v = pod::stages::<Addr6>(&ctx, v6::sender(&ctx));
    let v = policy::settle6(&ctx, v);
    observe::received(&ctx, policy::delivered(), v);
    observe::sent(&ctx, ifindex(&ctx), v);
    v
}

/// Host veth egress: what the kernel's routing delivers to a pod (everything not
/// redirected into it by the programs above), judged by NetworkPolicy (see [`policy`]).
#[classifier]
pub fn to_pod(ctx: TcContext) -> i32 {
    let v = policy::to_pod(&ctx, policy::PodBy::Ifindex);
    observe::received(&ctx, ifindex(&ctx), v);
    v
}

/// A netkit pod's host device transmitting to it (the netkit primary's program): what
/// the kernel delivers to the pod, or what another netkit pod's program redirected to
/// it, judged as [`to_pod`] judges. The kernel has already made the packet the pod's
/// interface's, so the pod is found by the destination address.
#[classifier]
pub fn to_netkit(ctx: TcContext) -> i32 {
    let v = policy::to_pod(&ctx, policy::PodBy::Destination);
    observe::received(&ctx, ifindex(&ctx), v);
    v
}

/// The reader of a DNS answer `to_pod` or `to_netkit` lets into a pod whose egress rules
/// name domains (tail-called by them; see [`dns`]): learns what it teaches, then passes
/// it as they would have.
#[classifier]
pub fn dns_answer(ctx: TcContext) -> i32 {
    dns::answer(&ctx);
    PASS
}

// The uplink.

/// Uplink ingress: reverse NAT of masqueraded flows, DNAT of host ports, verified flows
/// into their pods (see [`uplink::ingress`]).
#[classifier]
pub fn uplink_ingress(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    if v6::is_ipv6(&ctx) {
        return v6::call(&ctx, prog::CALL6_UPLINK_INGRESS);
    }
    policy::begin();
    let v = uplink::ingress::<Addr4>(&ctx);
    let v = policy::settle(&ctx, v, false);
    observe::received(&ctx, policy::delivered(), v);
    observe::dropped(&ctx, v);
    v
}

/// `uplink_ingress` for IPv6 (tail-called by it), its deliveries judged as
/// [`from_pod6`]'s.
#[classifier]
pub fn uplink_ingress6(ctx: TcContext) -> i32 {
    policy::begin();
    let v = uplink::ingress::<Addr6>(&ctx);
    let v = policy::settle6(&ctx, v);
    observe::received(&ctx, policy::delivered(), v);
    observe::dropped(&ctx, v);
    v
}

/// Uplink egress: masquerade pod traffic leaving the cluster; restore replies of host-port
/// flows to nodeIP:hostPort (see [`uplink::egress`]).
#[classifier]
pub fn uplink_egress(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    if v6::is_ipv6(&ctx) {
        return v6::call(&ctx, prog::CALL6_UPLINK_EGRESS);
    }
    let v = uplink::egress::<Addr4>(&ctx);
    observe::dropped(&ctx, v);
    v
}

/// `uplink_egress` for IPv6 (tail-called by it).
#[classifier]
pub fn uplink_egress6(ctx: TcContext) -> i32 {
    let v = uplink::egress::<Addr6>(&ctx);
    observe::dropped(&ctx, v);
    v
}

// The tunnel device.

/// Tunnel device egress: a pod's packet for another node gets its tunnel key.
#[classifier]
pub fn to_tunnel(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    let v = tunnel::to_tunnel(&ctx);
    observe::dropped(&ctx, v);
    v
}

/// Tunnel device ingress: a packet from another node's pod, into its pod.
#[classifier]
pub fn from_tunnel(ctx: TcContext) -> i32 {
    count(Reason::Seen);
    let v = tunnel::from_tunnel(&ctx);
    observe::received(&ctx, policy::delivered(), v);
    observe::dropped(&ctx, v);
    v
}

/// The ifindex of the device the program runs at.
#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: reading a field of the context.
    unsafe { (*ctx.skb.skb).ifindex }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
