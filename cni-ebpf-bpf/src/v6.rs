//! The IPv6 twins of the programs attached to the veth and the uplink: `from_pod6`,
//! `uplink_ingress6` and `uplink_egress6`, each its own program, tail-called by the
//! attached one through the `CALLS6` program array as soon as it sees an IPv6 frame
//! (cilium keeps its families apart the same way). Each then has the verifier's 512-byte
//! stack to itself: IPv6 keys and NAT entries are two and a half times the IPv4 ones, and
//! the two families' frames would not fit one program. They run the same stages as the
//! IPv4 programs ([`crate::pod`], [`crate::uplink`]). A slot left empty (a datapath being
//! loaded) passes the packet unchanged (`pass_ipv6_not_loaded`).
//!
//! Neighbour discovery, router advertisements and DAD carry no translatable tuple and
//! are passed untouched; so is any packet with extension headers (see `parse::parse6`).

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{prog, Reason};

use crate::{
    forward::PodDelivery,
    maps::{count, CALLS6},
    parse::{read, ETH_P_IPV6, ETH_TYPE_OFF},
    pod::Sender,
    PASS,
};

/// `skb->cb[0]` as `from_pod` leaves it for `from_pod6`: the packet's source is one of
/// the pod's own addresses (else one of its allow-list)...
const CB_OWN_SOURCE: u32 = 1;
/// ... and the pod holds host ports (see [`Sender`])...
const CB_HOST_PORTS: u32 = 2;
/// ... and the program runs in a netkit pod's transmit path ([`PodDelivery::Transmit`]).
const CB_TRANSMIT: u32 = 4;

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

/// `from_pod` hands an IPv6 packet to `from_pod6`, with what it learnt of the sender
/// (the source checked, and the packet paced, before: those hold for every family).
#[inline(always)]
pub(crate) fn call_from_pod6(ctx: &TcContext, sender: Sender) -> i32 {
    let mut cb = 0;
    if sender.own_source {
        cb |= CB_OWN_SOURCE;
    }
    if sender.host_ports {
        cb |= CB_HOST_PORTS;
    }
    if sender.handover == PodDelivery::Transmit {
        cb |= CB_TRANSMIT;
    }
    // SAFETY: `cb` is the tc control block, ours while the packet is in tc.
    unsafe { (*ctx.skb.skb).cb[0] = cb };
    call(ctx, prog::CALL6_FROM_POD)
}

/// What `from_pod` left in the control block for `from_pod6` ([`call_from_pod6`]).
#[inline(always)]
pub(crate) fn sender(ctx: &TcContext) -> Sender {
    // SAFETY: as in `call_from_pod6`, which wrote it.
    let cb = unsafe { (*ctx.skb.skb).cb[0] };
    Sender {
        own_source: cb & CB_OWN_SOURCE != 0,
        host_ports: cb & CB_HOST_PORTS != 0,
        handover: if cb & CB_TRANSMIT != 0 {
            PodDelivery::Transmit
        } else {
            PodDelivery::Peer
        },
    }
}
