//! Host ports: DNAT of nodeIP:hostPort to the pod from outside, and hairpin from pods.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{proto, Addr4, NatHook, NatKey, NatKeyOf, NatKind, PortTarget, Reason};

use crate::{
    family::Family,
    flows,
    forward::deliver_or_stack,
    maps::{count, local_endpoint, node_config},
    nat::{alloc_port, entry, forget_new_flow, nat_add, nat_remove, rev_key, room_for_flow},
    parse::Pkt,
    rewrite::{apply, rewrite_failed},
    PASS,
};

/// Client pod A → node N:hostPort, backed by pod B (possibly A itself).
#[inline(always)]
pub(crate) fn hairpin_new(ctx: &TcContext, p: &Pkt, t: &PortTarget) -> i32 {
    let (a, ap, n, hp) = (p.saddr, p.sport, p.daddr, p.dport);
    let (b, bp) = (t.addr, t.port);
    // Charged to the client pod, which opens the flow.
    let pod = local_endpoint(a).map_or(0, |ep| ep.ifindex);
    if !room_for_flow::<Addr4>(pod) {
        count(Reason::DropNatPodCap);
        return TC_ACT_SHOT as i32;
    }
    let (rev_key, fwd) = if b == a {
        // A pod reaching itself through its host port: the packet must not carry its own
        // address as source (the pod would drop it as martian), so it comes from N.
        let Some(cfg) = node_config() else {
            count(Reason::PassNatInsertFailed);
            return PASS;
        };
        let rev = entry(n, a, hp, ap, NatHook::POD, NatKind::HAIRPIN_REV, pod);
        let Some(np) = alloc_port(cfg, a, bp, n, p.proto, &rev, 0) else {
            count(Reason::DropNoSnatPort);
            return TC_ACT_SHOT as i32;
        };
        (
            rev_key(a, bp, n, np, p.proto),
            entry(n, a, np, bp, NatHook::POD, NatKind::HAIRPIN_FWD, pod),
        )
    } else {
        let rev_key = NatKey {
            saddr: b,
            daddr: a,
            sport: bp,
            dport: ap,
            proto: p.proto,
            _pad: [0; 3],
        };
        let rev = entry(n, a, hp, ap, NatHook::POD, NatKind::HAIRPIN_REV, pod);
        if !nat_add(&rev_key, &rev, BPF_NOEXIST as u64) {
            count(Reason::PassNatInsertFailed);
            return PASS;
        }
        (
            rev_key,
            entry(a, b, ap, bp, NatHook::POD, NatKind::HAIRPIN_FWD, pod),
        )
    };
    if !nat_add(&p.key(), &fwd, 0) {
        nat_remove(&rev_key);
        count(Reason::PassNatInsertFailed);
        return PASS;
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &rev_key);
        return rewrite_failed();
    }
    count(Reason::HairpinNew);
    deliver_or_stack(ctx, fwd.daddr)
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
    // Charged to the pod behind the host port (outside clients have no share of their
    // own): a flood of clients uses up that pod's share only.
    let pod = b.local_endpoint().map_or(0, |ep| ep.ifindex);
    if !room_for_flow::<A>(pod) {
        count(Reason::DropNatPodCap);
        return Some(TC_ACT_SHOT as i32);
    }
    let (c, cp, n, hp) = (p.saddr, p.sport, p.daddr, p.dport);
    let rev_key = NatKeyOf {
        saddr: b,
        daddr: c,
        sport: bp,
        dport: cp,
        proto: p.proto,
        _pad: [0; 3],
    };
    let rev = entry(n, c, hp, cp, NatHook::UPLINK_OUT, NatKind::DNAT_REV, pod);
    let fwd = entry(c, b, cp, bp, NatHook::UPLINK_IN, NatKind::DNAT_FWD, pod);
    if !nat_add(&rev_key, &rev, 0) {
        count(Reason::PassNatInsertFailed);
        return Some(PASS);
    }
    if !nat_add(&p.key(), &fwd, 0) {
        nat_remove(&rev_key);
        count(Reason::PassNatInsertFailed);
        return Some(PASS);
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &rev_key);
        return Some(rewrite_failed());
    }
    // Netfilter never sees an IPv4 one of these flows (delivered past the stack): its
    // replies may bypass it. Noted only once the packet is on its way, so a dropped one
    // leaves no flow state. (An IPv6 one goes through the stack both ways.)
    flows::note_own_inbound(&rev_key);
    count(Reason::DnatNew);
    Some(A::deliver_translated(ctx, b))
}
