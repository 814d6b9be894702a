//! Egress rate of a pod (`runtimeConfig.bandwidth`) by earliest departure time: each
//! packet of a paced pod gets a departure time in `skb->tstamp` (monotonic clock, so it
//! survives forwarding and redirects), and the `fq` qdisc userspace puts on the uplink
//! holds it until then. The schedule is a token bucket kept in time (GCRA): a pod that
//! was idle may send its burst at once, then at its rate. A packet that would have to
//! wait more than its limit beyond the burst is dropped here, which is also
//! what bounds a paced pod's traffic to destinations without a qdisc on the way and on
//! kernels without `fq`, where userspace sets the entry to police only.
//!
//! Traffic that stays on the node (for a local pod, delivered by `bpf_redirect_peer`, or
//! for one of the node's addresses) never passes the uplink's `fq`: a departure time
//! would not hold it back, and the short limit that suits a queue `fq` drains would then
//! police TCP to a fraction of its rate (5 of 20 Mbit/s, measured on a kernel with `fq`).
//! Such packets are policed with [`PACING_POLICE_LIMIT_NS`] instead, as everywhere on a
//! kernel without `fq`; the schedule is the same one.

use aya_ebpf::{
    bindings::_bindgen_ty_28::BPF_SKB_TSTAMP_DELIVERY_MONO,
    helpers::{bpf_ktime_get_ns, bpf_skb_set_tstamp},
    programs::TcContext,
};
use cni_ebpf_common::{Addr4, Addr6, PacingMode, PACING_POLICE_LIMIT_NS};

use crate::{
    family::Family,
    maps::PACING,
    parse::{read, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, IP_OFF},
};

/// Offsets of the destination address in an IPv4 and an IPv6 header.
const IP4_DADDR_OFF: usize = IP_OFF + 16;
const IP6_DADDR_OFF: usize = IP_OFF + 24;

const NSEC_PER_SEC: u64 = 1_000_000_000;

/// Schedules the packet of the pod behind host veth `ifindex`; `false` when it must be
/// dropped. A pod without a [`PACING`] entry is not limited.
#[inline(always)]
pub(crate) fn pace(ctx: &TcContext, ifindex: u32) -> bool {
    let Some(p) = PACING.get_ptr_mut(&ifindex) else {
        return true;
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a map value pointer, valid for this run. CPUs sending for the same pod at
    // once may lose an update of `tat_ns`; the rate is then exceeded by that packet.
    let (rate, burst, tat, limit, mode) = unsafe {
        (
            (*p).bytes_per_s,
            (*p).burst_ns,
            (*p).tat_ns,
            (*p).limit_ns,
            (*p).mode,
        )
    };
    if rate == 0 {
        return true;
    }
    // In fq mode, a packet that stays on the node passes no fq: policed, never stamped.
    let unheld = mode == PacingMode::BY_FQ && stays_on_node(ctx);
    let limit = if unheld {
        PACING_POLICE_LIMIT_NS
    } else {
        limit
    };
    let tat = if tat > now { tat } else { now };
    let ready = tat.saturating_sub(burst);
    let depart = if ready > now { ready } else { now };
    if depart - now > limit {
        return false;
    }
    let cost = u64::from(ctx.len()) * NSEC_PER_SEC / rate;
    // SAFETY: as above.
    unsafe { (*p).tat_ns = tat + cost };
    if depart > now && mode == PacingMode::BY_FQ && !unheld {
        // SAFETY: plain helper call on this program's skb. It cannot fail for a
        // monotonic time at tc (the only error is an unknown type).
        unsafe { bpf_skb_set_tstamp(ctx.skb.skb, depart, BPF_SKB_TSTAMP_DELIVERY_MONO) };
    }
    true
}

/// Whether the packet is for a local pod or one of the node's addresses (so no qdisc of
/// the uplink will hold it). Anything else, or what cannot be read, leaves the node.
#[inline(always)]
fn stays_on_node(ctx: &TcContext) -> bool {
    match read::<u16>(ctx, ETH_TYPE_OFF) {
        Ok(t) if t == ETH_P_IP.to_be() => read::<Addr4>(ctx, IP4_DADDR_OFF).is_ok_and(is_local),
        Ok(t) if t == ETH_P_IPV6.to_be() => read::<Addr6>(ctx, IP6_DADDR_OFF).is_ok_and(is_local),
        _ => false,
    }
}

#[inline(always)]
fn is_local<A: Family>(addr: A) -> bool {
    addr.local_endpoint().is_some() || addr.is_node_addr()
}
