//! Host ports: DNAT of nodeIP:hostPort to the pod from outside (also the DNAT of a
//! Service flow from outside to a backend on this node), and hairpin from pods.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{proto, NatHook, NatKeyOf, NatKind, Reason};

use crate::{
    family::Family,
    flows,
    forward::PodDelivery,
    maps::{count, node_config},
    nat::{alloc_port, entry, forget_new_flow, nat_add, nat_remove, rev_key, room_for_flow},
    parse::Pkt,
    rewrite::{apply, rewrite_failed},
    PASS,
};

/// What a new hairpin flow was given: its forward translation (as a NAT entry's tuple)
/// and the key of its reverse entry, already in the table.
#[derive(Default)]
pub(crate) struct HairpinGrant<A> {
    saddr: A,
    daddr: A,
    sport: u16,
    dport: u16,
    pod: u32,
    pub(crate) rev_key: NatKeyOf<A>,
}

/// Client pod A → node N:hostPort, backed by pod B:bp (possibly A itself): a new hairpin
/// flow, delivered into B past the stack. This first half puts the reverse entry in the
/// table (for a pod reaching itself, with a node port for its source) and writes the rest
/// to `out`; `Err(verdict)` when the flow is refused. Apart from [`hairpin_finish`] so that
/// the stages run them one after the other (with IPv6, their frames would not fit
/// together).
#[inline(always)]
pub(crate) fn hairpin_grant<A: Family>(
    p: &Pkt<A>,
    b: A,
    bp: u16,
    out: &mut HairpinGrant<A>,
) -> Result<(), i32> {
    let (a, ap, n, hp) = (p.saddr, p.sport, p.daddr, p.dport);
    // Charged to the client pod, which opens the flow.
    let pod = a.local_endpoint().map_or(0, |ep| ep.ifindex);
    if !room_for_flow::<A>(pod) {
        count(Reason::DropNatPodCap);
        return Err(TC_ACT_SHOT as i32);
    }
    let rev = entry(n, a, hp, ap, NatHook::POD, NatKind::HAIRPIN_REV, pod);
    if b == a {
        // A pod reaching itself through its host port: the packet must not carry its own
        // address as source (the pod would drop it as martian), so it comes from N.
        let Some(cfg) = node_config() else {
            count(Reason::PassNatInsertFailed);
            return Err(PASS);
        };
        let Some(np) = alloc_port(cfg, a, bp, n, p.proto, &rev, 0) else {
            count(Reason::DropNoSnatPort);
            return Err(TC_ACT_SHOT as i32);
        };
        out.rev_key = rev_key(a, bp, n, np, p.proto);
        (out.saddr, out.daddr, out.sport, out.dport) = (n, a, np, bp);
    } else {
        out.rev_key = NatKeyOf {
            saddr: b,
            daddr: a,
            sport: bp,
            dport: ap,
            proto: p.proto,
            _pad: [0; 3],
        };
        if !nat_add(&out.rev_key, &rev, BPF_NOEXIST as u64) {
            count(Reason::PassNatInsertFailed);
            return Err(PASS);
        }
        (out.saddr, out.daddr, out.sport, out.dport) = (a, b, ap, bp);
    }
    out.pod = pod;
    Ok(())
}

/// The second half of [`hairpin_grant`]: the forward entry, the rewrite, the delivery.
#[inline(always)]
pub(crate) fn hairpin_finish<A: Family>(
    ctx: &TcContext,
    p: &Pkt<A>,
    g: &HairpinGrant<A>,
    how: PodDelivery,
) -> i32 {
    let fwd = entry(
        g.saddr,
        g.daddr,
        g.sport,
        g.dport,
        NatHook::POD,
        NatKind::HAIRPIN_FWD,
        g.pod,
    );
    if !nat_add(&p.key(), &fwd, 0) {
        nat_remove(&g.rev_key);
        count(Reason::PassNatInsertFailed);
        return PASS;
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &g.rev_key);
        return rewrite_failed();
    }
    count(Reason::HairpinNew);
    deliver_local(ctx, fwd.daddr, how)
}

/// Into local pod `daddr` past the stack (as `how` can), else (not local any more) to
/// the stack.
#[inline(always)]
pub(crate) fn deliver_local<A: Family>(ctx: &TcContext, daddr: A, how: PodDelivery) -> i32 {
    match daddr.local_endpoint() {
        Some(ep) => A::deliver(ctx, &ep, how),
        None => {
            count(Reason::TranslatedToStack);
            TC_ACT_OK as i32
        }
    }
}

/// A new host-port flow from outside: client C:cp → N:hp (N a node address) becomes
/// C:cp → B:bp, and the reply B:bp → C:cp leaves as N:hp. `None` when `p` is not for a
/// host port. Both families.
#[inline(always)]
pub(crate) fn dnat_new<A: Family>(ctx: &TcContext, p: &Pkt<A>) -> Option<i32> {
    if !(p.natable && (p.proto == proto::TCP || p.proto == proto::UDP) && p.daddr.is_node_addr()) {
        return None;
    }
    let (b, bp) = p.daddr.host_port_target(p.dport, p.proto)?;
    if !p.opens_hostport_flow() {
        count(Reason::PassStaleHostPortFlow);
        return Some(PASS);
    }
    Some(dnat_to(ctx, p, b, bp, Reason::DnatNew))
}

/// A new flow from outside, C:cp → D:dp (a host port, or a Service frontend), sent to
/// local pod B:bp keeping the client's address: C:cp → B:bp, and the reply B:bp → C:cp
/// leaves as D:dp. Counted as `new` once on its way.
#[inline(always)]
pub(crate) fn dnat_to<A: Family>(ctx: &TcContext, p: &Pkt<A>, b: A, bp: u16, new: Reason) -> i32 {
    // Charged to the pod behind the host port (outside clients have no share of their
    // own): a flood of clients uses up that pod's share only.
    let pod = b.local_endpoint().map_or(0, |ep| ep.ifindex);
    if !room_for_flow::<A>(pod) {
        count(Reason::DropNatPodCap);
        return TC_ACT_SHOT as i32;
    }
    let (c, cp, d, dp) = (p.saddr, p.sport, p.daddr, p.dport);
    let rev_key = NatKeyOf {
        saddr: b,
        daddr: c,
        sport: bp,
        dport: cp,
        proto: p.proto,
        _pad: [0; 3],
    };
    let rev = entry(d, c, dp, cp, NatHook::UPLINK_OUT, NatKind::DNAT_REV, pod);
    let fwd = entry(c, b, cp, bp, NatHook::UPLINK_IN, NatKind::DNAT_FWD, pod);
    if !nat_add(&rev_key, &rev, 0) {
        count(Reason::PassNatInsertFailed);
        return PASS;
    }
    if !nat_add(&p.key(), &fwd, 0) {
        nat_remove(&rev_key);
        count(Reason::PassNatInsertFailed);
        return PASS;
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &rev_key);
        return rewrite_failed();
    }
    // Netfilter never sees one of these flows (delivered past the stack): its replies may
    // bypass it. Noted only once the packet is on its way, so a dropped one leaves no
    // flow state.
    flows::note_own_inbound(&rev_key);
    count(new);
    deliver_local(ctx, b, PodDelivery::Peer)
}
