//! Egress rate of a pod (`runtimeConfig.bandwidth`) by earliest departure time: each
//! packet of a paced pod gets a departure time in `skb->tstamp` (monotonic clock, so it
//! survives forwarding and redirects), and the `fq` qdisc userspace puts on the uplink
//! holds it until then. The schedule is a token bucket kept in time (GCRA): a pod that
//! was idle may send its burst at once, then at its rate. A packet that would have to
//! wait more than its limit beyond the burst is dropped here, which is also
//! what bounds a paced pod's traffic to destinations without a qdisc on the way (other
//! pods on the node, delivered by `bpf_redirect_peer`) and on kernels without `fq`, where
//! userspace sets the entry to police only.

use aya_ebpf::{
    bindings::_bindgen_ty_28::BPF_SKB_TSTAMP_DELIVERY_MONO,
    helpers::{bpf_ktime_get_ns, bpf_skb_set_tstamp},
    programs::TcContext,
};
use cni_ebpf_common::PacingMode;

use crate::maps::PACING;

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
    let tat = if tat > now { tat } else { now };
    let ready = tat.saturating_sub(burst);
    let depart = if ready > now { ready } else { now };
    if depart - now > limit {
        return false;
    }
    let cost = u64::from(ctx.len()) * NSEC_PER_SEC / rate;
    // SAFETY: as above.
    unsafe { (*p).tat_ns = tat + cost };
    if depart > now && mode == PacingMode::BY_FQ {
        // SAFETY: plain helper call on this program's skb. It cannot fail for a
        // monotonic time at tc (the only error is an unknown type).
        unsafe { bpf_skb_set_tstamp(ctx.skb.skb, depart, BPF_SKB_TSTAMP_DELIVERY_MONO) };
    }
    true
}
