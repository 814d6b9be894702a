//! Masquerade: a local pod's flow towards a destination outside `clusterCIDRs` leaves
//! with the node's address and a port of the SNAT range.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use cni_ebpf_common::{
    proto, FlowFlags, NatDeliver, NatDestKeyOf, NatHook, NatKeyOf, NatKind, NodeFlags, Reason,
};

use crate::{
    family::Family,
    maps::{count, node_config},
    nat::{
        alloc_port, dest_room, entry, forget_new_flow, nat_add, nat_remove, rev_key, room_for_flow,
        sweep,
    },
    parse::{Pkt, TCP_ACK, TCP_SYN},
    rewrite::{apply, rewrite_failed},
    PASS,
};

/// A packet leaving through the uplink with no NAT entry: a new masqueraded flow if a
/// local pod opened it towards the outside, else passed unchanged. `flow` is what
/// [`crate::flows::seen_leaving`] knows of it: `None` when netfilter translated the packet on
/// its way here, so the replies go back through the stack after our reverse NAT.
///
/// This first half decides whether the flow is to be masqueraded, and if so finds its
/// port and puts the reverse entry in the table, written to `out` (`Err(verdict)`
/// otherwise; written in place, not returned: an IPv6 one is 64 bytes of the frame). Apart
/// from the second half ([`finish_new_flow`]) so that the stages run them one after the
/// other, not one inside the other: with IPv6, their frames would not fit together.
#[inline(always)]
pub(crate) fn grant<A: Family + Default>(
    p: &Pkt<A>,
    flow: Option<FlowFlags>,
    out: &mut Granted<A>,
) -> Result<(), i32> {
    let cfg = match node_config() {
        Some(c) => c,
        None => {
            count(Reason::PassNoMatch);
            return Err(PASS);
        }
    };
    let echo_request = p.proto == A::ICMP && p.icmp_type == A::ECHO_REQUEST;
    let Some(node) = A::masquerade_addr(cfg) else {
        count(Reason::PassNoMatch);
        return Err(PASS);
    };
    if !cfg.flags.contains(NodeFlags::MASQ)
        || !p.natable
        || !(p.proto == proto::TCP || p.proto == proto::UDP || echo_request)
    {
        count(Reason::PassNoMatch);
        return Err(PASS);
    }
    let Some(ep) = p.saddr.local_endpoint() else {
        count(Reason::PassNoMatch);
        return Err(PASS);
    };
    if p.daddr.in_cluster(cfg) || p.daddr.is_node_addr() {
        count(Reason::PassNoMatch);
        return Err(PASS);
    }
    // MASQUERADE semantics: a pod's replies in a flow opened from outside keep the pod's
    // address (a SYN-ACK never opens one).
    if flow.is_some_and(|f| f.contains(FlowFlags::INBOUND))
        || (p.proto == proto::TCP && p.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK)
    {
        count(Reason::PassInboundReply);
        return Err(PASS);
    }
    // The pod's share of the NAT table: a pod holding all of it gets its own new flows
    // refused (dropped: passed on, the packet would leave with the pod's address), and
    // nobody else's.
    if !room_for_flow::<A>(ep.ifindex) {
        count(Reason::DropNatPodCap);
        return Err(TC_ACT_SHOT as i32);
    }
    // And its share of the ports towards this destination, so that it cannot take every
    // port other pods need to reach it.
    let dest = NatDestKeyOf {
        pod: ep.ifindex,
        daddr: p.daddr,
        dport: p.dport,
        proto: p.proto,
        _pad: 0,
    };
    // At the cap, the flow may still take back a port of the pod's own towards this
    // destination whose flow is over (closed ports count until they leave the table).
    let only_pod = if dest_room(&dest, cfg.snat_dest_cap) {
        0
    } else {
        ep.ifindex
    };
    // pod P:pp → X:xp becomes N:np → X:xp; the reply X:xp → N:np goes back to P:pp.
    let mut rev = entry(
        p.daddr,
        p.saddr,
        p.dport,
        p.sport,
        NatHook::UPLINK_IN,
        NatKind::SNAT_REV,
        ep.ifindex,
    );
    if flow.is_none() {
        rev.deliver = NatDeliver::STACK;
    }
    let Some(np) = alloc_port(cfg, p.daddr, p.dport, node, p.proto, &rev, only_pod) else {
        if only_pod != 0 {
            count(Reason::DropSnatDestCap);
            return Err(TC_ACT_SHOT as i32);
        }
        return Err(no_port::<A>());
    };
    out.set(
        node,
        np,
        ep.ifindex,
        rev_key(p.daddr, p.dport, node, np, p.proto),
    );
    Ok(())
}

/// No SNAT port for a new flow (or a full table): dropped, and finished flows are swept
/// out for the next try.
#[inline(always)]
pub(crate) fn no_port<A: Family>() -> i32 {
    sweep::<A>();
    count(Reason::DropNoSnatPort);
    TC_ACT_SHOT as i32
}

/// The table refused a new flow's forward entry (its reverse one is gone again): passed
/// unchanged, and finished flows are swept out for the next try (by the caller of
/// [`finish_new_flow`], not inside it: their frames would stack up).
#[inline(always)]
pub(crate) fn table_refused<A: Family>() -> i32 {
    sweep::<A>();
    count(Reason::PassNatInsertFailed);
    PASS
}

/// What a new masqueraded flow was given: the node address and port it leaves with, the
/// pod it is charged to, and the key of its reverse entry (already in the table).
#[derive(Default)]
pub(crate) struct Granted<A> {
    node: A,
    port: u16,
    pod: u32,
    pub(crate) rev_key: NatKeyOf<A>,
}

impl<A: Copy> Granted<A> {
    /// A grant of `node:port` (`port` network order), charged to `pod`, whose reverse
    /// entry is at `rev_key`.
    #[inline(always)]
    pub(crate) fn set(&mut self, node: A, port: u16, pod: u32, rev_key: NatKeyOf<A>) {
        self.node = node;
        self.port = port;
        self.pod = pod;
        self.rev_key = rev_key;
    }

    /// Prefers `node` as the address the flow is sent from (before it is granted).
    #[inline(always)]
    pub(crate) fn prefer(&mut self, node: A) {
        self.node = node;
    }

    /// The node address and port the flow is sent from.
    #[inline(always)]
    pub(crate) fn source(&self) -> (A, u16) {
        (self.node, self.port)
    }
}

/// The rest of a new masqueraded flow, once its port and reverse entry are in: the
/// forward entry, and the packet's rewrite. `None` when the table refused the forward
/// entry (the reverse one is removed again).
///
#[inline(always)]
pub(crate) fn finish_new_flow<A: Family>(
    ctx: &TcContext,
    p: &Pkt<A>,
    g: &Granted<A>,
) -> Option<i32> {
    let fwd = entry(
        g.node,
        p.daddr,
        g.port,
        p.dport,
        NatHook::UPLINK_OUT,
        NatKind::SNAT_FWD,
        g.pod,
    );
    if !nat_add(&p.key(), &fwd, 0) {
        nat_remove(&g.rev_key);
        return None;
    }
    if !apply(ctx, p, &fwd) {
        forget_new_flow(&p.key(), &g.rev_key);
        return Some(rewrite_failed());
    }
    count(Reason::SnatNew);
    Some(TC_ACT_OK as i32)
}
