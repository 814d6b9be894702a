//! NetworkPolicy: whether the node's policy admits a packet.
//!
//! Each pod interface has a rule set per direction in `POLICY_ENDPOINTS` (open, closed,
//! or an id of the rule tables), in two slots: the agent writes the slot not in force and
//! then swaps `POLICY_STATE`, so a packet sees one whole policy, the old or the new. A
//! rule set matches a packet on the classes `POLICY_PEERS(peer) & POLICY_PORTS(proto ·
//! port)` and `POLICY_EXACT(peer, port, proto)` give; with NetworkPolicy alone, any class
//! admits; a rule set that cluster policies take part in has a `POLICY_TIERS` entry that
//! ranks its classes, tier by tier (`cni_ebpf_common::tiers_admit`). Four lookups
//! whatever the number of policies and tiers (`cni-ebpf/src/policy/tables.rs` builds
//! them).
//!
//! Where the node judges:
//! - **delivery into a local pod** (`forward::deliver`, every redirect into a pod, and
//!   `to_pod` on the host veth's egress, every packet the kernel delivers): the
//!   destination pod's ingress and, when the source is a local pod, its egress;
//! - **the uplink's egress** (`uplink_egress`): a local pod's packet leaving the node,
//!   judged by the pod's egress before masquerade, after netfilter (so a Service's
//!   address is already its backend's).
//!
//! Traffic with the node itself is never judged (the API reference: traffic to and from
//! the node where a pod runs is always allowed): a packet from one of the node's
//! addresses to a pod, or from a pod to one. Before the agent's first swap (generation
//! 0) on a network that enforces policy (`NodeFlags::ENFORCE_POLICY`), every pod is
//! closed: the cluster's policy is not in force yet (a boot, a purge or a new layout made
//! the maps since the agent last swapped), so nothing but the node's traffic reaches or
//! leaves a pod until it is. On a network that does not enforce policy, nothing is
//! judged.
//!
//! An admitted flow is recorded in `POLICY_FLOWS` with the generation it was judged
//! under: its later packets and its replies pass on that one lookup, and a flow recorded
//! under an older generation is judged again, so a verdict never outlives the policy
//! that gave it.
//!
//! Replies through the node's address translation. A reply that netfilter translates on
//! its way to a pod (kube-proxy's un-DNAT of a Service reply: the backend's address
//! becomes the ClusterIP; the un-SNAT of a flow it masqueraded) reaches `to_pod` with a
//! tuple no flow was recorded under. So the reply is judged where it is seen *before* the
//! stack translates it, with the tuple the flow was admitted under: where a program hands
//! a packet for a local pod or for one of the node's addresses to the stack
//! ([`note_to_stack`], then [`settle`]: `from_pod`, `uplink_ingress`, `from_tunnel`), a
//! packet that is the reply of an admitted flow gets [`REPLY_MARK`] in `skb->mark`, and
//! `to_pod` lets a marked packet in without judging it again. The mark is the verdict,
//! carried across the translation: nothing else sets it (a pod's packets cross a veth
//! into the node's namespace, which clears the mark), and a packet that is no such reply
//! is not marked and is judged by `to_pod` as it arrives. A flow the node itself opens
//! to a pod (its own sockets, or a pod's connection netfilter masqueraded to a node
//! address) is recorded with generation [`NODE_OPENED`] where it leaves the node's stack
//! (`to_pod`, `uplink_egress`, `to_tunnel`), so that its replies, addressed to the node,
//! carry the mark to the pod netfilter translates them back to.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    maps::lpm_trie::Key,
    programs::TcContext,
};
use cni_ebpf_common::{
    proto, tiers_decide, Addr6, EndpointInfo, FlowLogEntry, FlowLogKey, NodeFlags,
    PolicyClassCounts, PolicyClassKey, PolicyCounts, PolicyEndpointKey, PolicyExactKey, PolicyFlow,
    PolicyFlowKey, PolicyLearnedKey, PolicyPeerKey, PolicyPortKey, Reason, NO_CLASS,
    POLICY_DENY_SLOTS, RULESET_CLOSED, RULESET_OPEN,
};

use crate::{
    family::Family,
    icmp,
    maps::{
        count, node_config, POLICY_CLASS_COUNTS, POLICY_COUNTS, POLICY_DENIES, POLICY_ENDPOINTS,
        POLICY_EXACT, POLICY_FLOWS, POLICY_PEERS, POLICY_PORTS, POLICY_SCRATCH, POLICY_STATE,
        POLICY_TIERS,
    },
    parse::{
        byte_or_zero, read, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, ICMP6_DEST_UNREACH,
        ICMP6_ECHO_REPLY, ICMP6_ECHO_REQUEST, ICMP6_PACKET_TOO_BIG, ICMP6_PARAM_PROB,
        ICMP6_TIME_EXCEEDED, ICMP_ECHO, ICMP_ECHO_ID, ICMP_ECHO_REPLY, INNER6_IP_OFF,
        INNER6_L4_OFF, INNER_IP_OFF, INNER_L4_OFF, IP6_DADDR, IP6_SADDR, IP_DADDR, IP_FRAG_OFF,
        IP_OFF, IP_PROTO, IP_SADDR, L4_OFF, L4_OFF6,
    },
    PASS,
};

/// SCTP's protocol number (its ports sit where TCP's and UDP's do).
const SCTP: u8 = 132;

/// The bit of `skb->mark` by which a packet handed to the node's stack carries its
/// verdict, "the reply of an admitted flow", across netfilter's translation to `to_pod`
/// (see the module's documentation). Bit 21: clear of kube-proxy's masquerade and drop
/// bits (14, 15) and of the low bits admins and service meshes use.
pub(crate) const REPLY_MARK: u32 = 1 << 21;

/// [`PolicyFlow::generation`] of a flow the node itself opened to a pod: never judged,
/// its replies always pass (no swap ever puts generation 0 in force).
const NODE_OPENED: u32 = 0;

/// Per-CPU room for the keys of one judgement (kept off the verifier's stack).
#[repr(C)]
pub(crate) struct Scratch {
    flow: PolicyFlowKey,
    rev: PolicyFlowKey,
    peer: Key<PolicyPeerKey>,
    port: Key<PolicyPortKey>,
    exact: PolicyExactKey,
    endpoint: PolicyEndpointKey,
    /// The pod of the egress rule set [`ruleset`] found last, and the address an egress
    /// judgement asks about: the key of what the pod learned from DNS answers.
    pub(crate) learned: PolicyLearnedKey,
    admitted: PolicyFlow,
    /// The pod an IPv6 program's stage armed a redirect into ([`note_delivery`]): its
    /// host veth (0: none) and owner, and whether the redirect skips its host veth (the
    /// flow is followed here, not by `to_pod`).
    delivery_ifindex: u32,
    delivery_owner: u64,
    delivery_peer: bool,
    /// The pod a redirect past its host veth was admitted into ([`delivered`]).
    delivered: u32,
    /// The rule sets the last [`admits`] found for the egress and the ingress of `flow`.
    judged_egress: u32,
    judged_ingress: u32,
    /// This CPU's count of refused packets (the last `PolicyDeny::seq` written) and a key of
    /// `POLICY_COUNTS`, with a zeroed value to create its entry from.
    denies: u64,
    /// Whether the packet in `flow` opens a connection (a TCP SYN without ACK, an SCTP
    /// INIT): never a reply, whatever a recorded flow the other way says.
    opens: bool,
    /// Whether `flow` is the tuple quoted by an ICMP error (reversed), not the packet's.
    quoted: bool,
    /// A stage handed the packet to the stack for a local pod or a node address
    /// ([`note_to_stack`]): [`settle`] marks it if it is a reply.
    to_stack: bool,
    counts_key: u32,
    counts_zero: PolicyCounts,
    /// The class whose cluster policy rule decided the last [`rules_admit`]
    /// (`NO_CLASS`: none), and those of the last [`judge`]'s egress and ingress.
    decided: u32,
    egress_class: u32,
    ingress_class: u32,
    /// The class of the side that refused the packet the forward judgement refused.
    refused_class: u32,
    class_key: PolicyClassKey,
    class_zero: PolicyClassCounts,
}

/// A local pod on one side of a packet: its host veth, and the owner its `ENDPOINTS`
/// entry names (0: not compared; the host veth itself is known).
#[derive(Clone, Copy)]
pub(crate) struct Side {
    pub(crate) ifindex: u32,
    pub(crate) owner: u64,
}

impl Side {
    /// Not a local pod (or a side the node does not judge).
    pub(crate) const NONE: Self = Self {
        ifindex: 0,
        owner: 0,
    };
}

/// The slot and generation in force, or `None` when nothing is judged: the network does
/// not enforce policy, or no policy was ever swapped in. Generation 0 on a network that
/// enforces policy: every pod is closed ([`admits`]).
#[inline(always)]
pub(crate) fn enforcing() -> Option<(u32, u32)> {
    let st = POLICY_STATE.get(0)?;
    if st.generation == 0
        && !node_config().is_some_and(|c| c.flags.contains(NodeFlags::ENFORCE_POLICY))
    {
        return None;
    }
    Some((st.slot & 1, st.generation))
}

/// IPv4 wire-order address bytes mapped into IPv6.
#[inline(always)]
fn mapped(addr: u32) -> [u8; 16] {
    cni_ebpf_common::mapped4(addr)
}

/// The ports of a packet whose L4 header starts at `l4` (ICMP echo: the identifier as the
/// requester's port, as `parse` keys it; other protocols: none).
#[inline(always)]
fn ports(ctx: &TcContext, l4: usize, proto_: u8, echo: u8, echo_reply: u8) -> Option<(u16, u16)> {
    match proto_ {
        proto::TCP | proto::UDP | SCTP => {
            let p: [u16; 2] = read(ctx, l4).ok()?;
            Some((p[0], p[1]))
        }
        _ if proto_ == proto::ICMP || proto_ == proto::ICMPV6 => {
            let ty: u8 = read(ctx, l4).ok()?;
            if ty == echo {
                Some((read(ctx, l4 + ICMP_ECHO_ID).ok()?, 0))
            } else if ty == echo_reply {
                Some((0, read(ctx, l4 + ICMP_ECHO_ID).ok()?))
            } else {
                Some((0, 0))
            }
        }
        _ => Some((0, 0)),
    }
}

/// Whether the packet whose L4 header starts at `l4` opens a connection: a TCP SYN
/// without ACK, or an SCTP packet whose first chunk is INIT.
#[inline(always)]
fn opens(ctx: &TcContext, l4: usize, proto_: u8) -> bool {
    match proto_ {
        proto::TCP => byte_or_zero(ctx, l4 + 13) & 0x12 == 0x02,
        SCTP => byte_or_zero(ctx, l4 + 12) == 1,
        _ => false,
    }
}

/// Writes the tuple of the IPv4 packet in `ctx` (header without options, not a
/// fragment: as `parse` admits it) to the scratch area. `None` when it cannot be read.
#[inline(always)]
pub(crate) fn load_tuple4(ctx: &TcContext) -> Option<()> {
    let s = scratch()?;
    let saddr: u32 = read(ctx, IP_OFF + IP_SADDR).ok()?;
    let daddr: u32 = read(ctx, IP_OFF + IP_DADDR).ok()?;
    let proto_: u8 = read(ctx, IP_OFF + IP_PROTO).ok()?;
    let vihl: u8 = read(ctx, IP_OFF).ok()?;
    let frag_off: u16 = read(ctx, IP_OFF + IP_FRAG_OFF).ok()?;
    // A later fragment, or a header with options, has no ports where they would be: it
    // is judged with none (only rules that admit every port of its protocol admit it).
    let whole = vihl & 0x0f == 5 && frag_off & 0x1fffu16.to_be() == 0;
    let (sport, dport) = if whole {
        ports(ctx, L4_OFF, proto_, ICMP_ECHO, ICMP_ECHO_REPLY)?
    } else {
        (0, 0)
    };
    s.opens = whole && opens(ctx, L4_OFF, proto_);
    s.quoted = false;
    s.flow = PolicyFlowKey {
        saddr: mapped(saddr),
        daddr: mapped(daddr),
        sport,
        dport,
        proto: proto_,
        _pad: [0; 3],
    };
    if proto_ == proto::ICMP && sport == 0 && dport == 0 {
        let ty: u8 = read(ctx, L4_OFF).ok()?;
        if icmp::is_error_type(ty) {
            quoted4(ctx, s);
        }
    }
    Some(())
}

/// An ICMP error is judged as a reply of the packet it quotes: its tuple becomes the
/// quoted packet's, reversed (so an error about an admitted flow passes as its reply, and
/// one about anything else is judged as a packet of that flow's other direction). Left as
/// it is when the quote cannot be read.
#[inline(always)]
fn quoted4(ctx: &TcContext, s: &mut Scratch) {
    let (Ok(qs), Ok(qd), Ok(qp)) = (
        read::<u32>(ctx, INNER_IP_OFF + IP_SADDR),
        read::<u32>(ctx, INNER_IP_OFF + IP_DADDR),
        read::<u8>(ctx, INNER_IP_OFF + IP_PROTO),
    ) else {
        return;
    };
    let Some((qsport, qdport)) = ports(ctx, INNER_L4_OFF, qp, ICMP_ECHO, ICMP_ECHO_REPLY) else {
        return;
    };
    s.flow.saddr = mapped(qd);
    s.flow.daddr = mapped(qs);
    s.flow.sport = qdport;
    s.flow.dport = qsport;
    s.flow.proto = qp;
    s.quoted = true;
}

/// [`quoted4`] for an ICMPv6 error.
#[inline(always)]
fn quoted6(ctx: &TcContext, s: &mut Scratch) {
    let (Ok(qs), Ok(qd), Ok(qp)) = (
        read::<Addr6>(ctx, INNER6_IP_OFF + IP6_SADDR),
        read::<Addr6>(ctx, INNER6_IP_OFF + IP6_DADDR),
        read::<u8>(ctx, INNER6_IP_OFF + 6),
    ) else {
        return;
    };
    let Some((qsport, qdport)) =
        ports(ctx, INNER6_L4_OFF, qp, ICMP6_ECHO_REQUEST, ICMP6_ECHO_REPLY)
    else {
        return;
    };
    s.flow.saddr = cni_ebpf_common::bytes6(&qd);
    s.flow.daddr = cni_ebpf_common::bytes6(&qs);
    s.flow.sport = qdport;
    s.flow.dport = qsport;
    s.flow.proto = qp;
    s.quoted = true;
}

/// [`load_tuple6`] or [`load_tuple4`], by family.
#[inline(always)]
fn load_tuple(ctx: &TcContext, ipv6: bool) -> Option<()> {
    if ipv6 {
        load_tuple6(ctx)
    } else {
        load_tuple4(ctx)
    }
}

/// [`load_tuple4`] for an IPv6 packet without extension headers.
#[inline(always)]
pub(crate) fn load_tuple6(ctx: &TcContext) -> Option<()> {
    let s = scratch()?;
    let saddr: Addr6 = read(ctx, IP_OFF + IP6_SADDR).ok()?;
    let daddr: Addr6 = read(ctx, IP_OFF + IP6_DADDR).ok()?;
    let next: u8 = read(ctx, IP_OFF + 6).ok()?;
    let (sport, dport) = ports(ctx, L4_OFF6, next, ICMP6_ECHO_REQUEST, ICMP6_ECHO_REPLY)?;
    s.opens = opens(ctx, L4_OFF6, next);
    s.quoted = false;
    s.flow = PolicyFlowKey {
        saddr: cni_ebpf_common::bytes6(&saddr),
        daddr: cni_ebpf_common::bytes6(&daddr),
        sport,
        dport,
        proto: next,
        _pad: [0; 3],
    };
    if next == proto::ICMPV6 && sport == 0 && dport == 0 {
        let ty: u8 = read(ctx, L4_OFF6).ok()?;
        if matches!(
            ty,
            ICMP6_DEST_UNREACH | ICMP6_PACKET_TOO_BIG | ICMP6_TIME_EXCEEDED | ICMP6_PARAM_PROB
        ) {
            quoted6(ctx, s);
        }
    }
    Some(())
}

#[inline(always)]
pub(crate) fn scratch() -> Option<&'static mut Scratch> {
    let p = POLICY_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot; a program runs to its end on one CPU.
    Some(unsafe { &mut *p })
}

/// The rule set of pod interface `side` for one direction in `slot`.
#[inline(always)]
fn ruleset(s: &mut Scratch, side: Side, slot: u32, egress: bool) -> u32 {
    if side.ifindex == 0 {
        return RULESET_OPEN;
    }
    s.endpoint.ifindex = side.ifindex;
    s.endpoint.slot = slot;
    // SAFETY: copied out at once.
    match unsafe { POLICY_ENDPOINTS.get(&s.endpoint) } {
        None => RULESET_OPEN,
        Some(e) if side.owner != 0 && e.owner != side.owner => RULESET_CLOSED,
        Some(e) if egress => {
            s.learned.pod = e.pod;
            e.egress
        }
        Some(e) => e.ingress,
    }
}

/// Which address of the tuples in the scratch area a rule set is asked about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PeerOf {
    /// `flow`'s destination (an egress rule set's peer).
    FlowDst,
    /// `flow`'s source (an ingress rule set's peer).
    FlowSrc,
    /// `rev`'s destination.
    RevDst,
    /// `rev`'s source.
    RevSrc,
}

/// Whether rule set `rs` admits the peer `which` names on its tuple's protocol and
/// destination port: the classes it matches, ranked by the rule set's tiers when cluster
/// policies take part in it. The keys are built in the scratch area field by field: this
/// runs under the IPv6 programs' deepest frames, where the verifier's 512 bytes are
/// nearly spent.
#[inline(always)]
fn rules_admit(s: &mut Scratch, rs: u32, which: PeerOf) -> bool {
    let (t, dst) = match which {
        PeerOf::FlowDst => (&s.flow, true),
        PeerOf::FlowSrc => (&s.flow, false),
        PeerOf::RevDst => (&s.rev, true),
        PeerOf::RevSrc => (&s.rev, false),
    };
    let proto_ = t.proto;
    let port = t.dport.to_ne_bytes();
    s.peer.prefix_len = 32 + 128;
    s.peer.data.ruleset = rs;
    s.peer.data.addr = if dst { t.daddr } else { t.saddr };
    s.exact.addr = s.peer.data.addr;
    // An egress peer may be an address the pod learned from a DNS answer, for a name its
    // rules name.
    let mut classes = if dst {
        s.learned.addr = s.peer.data.addr;
        crate::dns::learned_classes(rs)
    } else {
        0
    };
    classes |= POLICY_PEERS.get(&s.peer).copied().unwrap_or(0);
    if classes != 0 {
        s.port.prefix_len = 32 + 24;
        s.port.data.ruleset = rs;
        s.port.data.proto = proto_;
        s.port.data.port = port;
        s.port.data._pad = 0;
        classes &= POLICY_PORTS.get(&s.port).copied().unwrap_or(0);
    }
    s.exact.ruleset = rs;
    s.exact.port = port;
    s.exact.proto = proto_;
    s.exact._pad = 0;
    // SAFETY: copied out at once.
    classes |= unsafe { POLICY_EXACT.get(&s.exact) }.copied().unwrap_or(0);
    // SAFETY: read at once.
    match unsafe { POLICY_TIERS.get(&rs) } {
        None => {
            s.decided = NO_CLASS;
            classes != 0
        }
        Some(tiers) => {
            let (admitted, class) = tiers_decide(classes, tiers);
            s.decided = class;
            admitted
        }
    }
}

/// Why a flow is refused, or `Ok` when both rule sets admit it (`reversed`: the tuple
/// in `rev`).
#[inline(always)]
fn judge(s: &mut Scratch, egress: u32, ingress: u32, reversed: bool) -> Result<(), Reason> {
    let (to, from) = if reversed {
        (PeerOf::RevDst, PeerOf::RevSrc)
    } else {
        (PeerOf::FlowDst, PeerOf::FlowSrc)
    };
    s.egress_class = NO_CLASS;
    s.ingress_class = NO_CLASS;
    if egress == RULESET_CLOSED {
        return Err(Reason::DropPolicyEgress);
    }
    if egress != RULESET_OPEN {
        let admitted = rules_admit(s, egress, to);
        s.egress_class = s.decided;
        if !admitted {
            return Err(Reason::DropPolicyEgress);
        }
    }
    if ingress == RULESET_CLOSED {
        return Err(Reason::DropPolicyIngress);
    }
    if ingress != RULESET_OPEN {
        let admitted = rules_admit(s, ingress, from);
        s.ingress_class = s.decided;
        if !admitted {
            return Err(Reason::DropPolicyIngress);
        }
    }
    Ok(())
}

/// Whether the node's policy admits the packet whose tuple [`load_tuple4`] or
/// [`load_tuple6`] wrote, sent by a local pod (egress; `src_ifindex` 0: none) to a local
/// pod (ingress; `dst_ifindex` 0: none), with the owners their `ENDPOINTS` entries name
/// (0: not compared). `state` is [`enforcing`]'s `(slot, generation)`. A function of its
/// own (a BPF-to-BPF call), so that its frame and code are not repeated at each caller.
#[inline(never)]
pub(crate) fn admits(
    src_ifindex: u32,
    src_owner: u64,
    dst_ifindex: u32,
    dst_owner: u64,
    state: u64,
) -> bool {
    let (slot, gen) = ((state >> 32) as u32, state as u32);
    let src = Side {
        ifindex: src_ifindex,
        owner: src_owner,
    };
    let dst = Side {
        ifindex: dst_ifindex,
        owner: dst_owner,
    };
    let Some(s) = scratch() else {
        return false;
    };
    let (egress, ingress) = if gen == 0 {
        // The cluster's policy is not in force yet: every local pod is closed.
        let closed = |side: Side| {
            if side.ifindex == 0 {
                RULESET_OPEN
            } else {
                RULESET_CLOSED
            }
        };
        (closed(src), closed(dst))
    } else {
        (ruleset(s, src, slot, true), ruleset(s, dst, slot, false))
    };
    s.judged_egress = egress;
    s.judged_ingress = ingress;
    s.egress_class = NO_CLASS;
    s.ingress_class = NO_CLASS;
    // SAFETY: copied out at once.
    let recorded = unsafe { POLICY_FLOWS.get(&s.flow) }.is_some_and(|f| f.generation == gen);
    if egress == RULESET_OPEN && ingress == RULESET_OPEN {
        // Admitted by no rule; its replies meet the other direction's rules, which must
        // know it as a flow it opened.
        if !recorded
            && (ruleset(s, dst, slot, true) != RULESET_OPEN
                || ruleset(s, src, slot, false) != RULESET_OPEN)
        {
            s.admitted = PolicyFlow {
                generation: gen,
                _pad: 0,
            };
            let _ = POLICY_FLOWS.insert(&s.flow, &s.admitted, 0);
        }
        return true;
    }
    if recorded {
        return true;
    }
    let refused = match judge(s, egress, ingress, false) {
        Ok(()) => {
            s.admitted = PolicyFlow {
                generation: gen,
                _pad: 0,
            };
            let _ = POLICY_FLOWS.insert(&s.flow, &s.admitted, 0);
            count(Reason::PolicyAdmitted);
            if egress != RULESET_OPEN {
                tally(s, src_ifindex, Tally::EgressAdmitted);
            }
            if ingress != RULESET_OPEN {
                tally(s, dst_ifindex, Tally::IngressAdmitted);
            }
            tally_classes(egress, ingress, CLASSES_ADMITTED);
            return true;
        }
        Err(r) => {
            s.refused_class = if r == Reason::DropPolicyEgress {
                s.egress_class
            } else {
                s.ingress_class
            };
            r
        }
    };
    // A reply of a flow admitted the other way: recorded under this generation, or
    // admitted again by the policy in force (the destination sent it, the source
    // receives it). A packet that opens a connection is no reply, even when it reuses
    // the tuple of an old flow the other way.
    if s.opens {
        return refuse(s, refused, src_ifindex, egress, dst_ifindex, ingress);
    }
    s.rev.saddr = s.flow.daddr;
    s.rev.daddr = s.flow.saddr;
    s.rev.sport = s.flow.dport;
    s.rev.dport = s.flow.sport;
    s.rev.proto = s.flow.proto;
    s.rev._pad = [0; 3];
    if let Some(f) = POLICY_FLOWS.get_ptr_mut(&s.rev) {
        // SAFETY: LRU values may be recycled under us; only the generation is written.
        if unsafe { (*f).generation } == gen {
            return true;
        }
        let back_egress = ruleset(s, dst, slot, true);
        let back_ingress = ruleset(s, src, slot, false);
        if judge(s, back_egress, back_ingress, true).is_ok() {
            // SAFETY: as above.
            unsafe { (*f).generation = gen };
            return true;
        }
    }
    refuse(s, refused, src_ifindex, egress, dst_ifindex, ingress)
}

/// Counts and logs a refused packet; `false`.
#[inline(always)]
fn refuse(
    s: &mut Scratch,
    refused: Reason,
    src_ifindex: u32,
    egress: u32,
    dst_ifindex: u32,
    ingress: u32,
) -> bool {
    count(refused);
    if refused == Reason::DropPolicyEgress {
        tally(s, src_ifindex, Tally::EgressDenied);
        log_deny(s, src_ifindex, egress, true);
        s.egress_class = s.refused_class;
        tally_classes(egress, RULESET_OPEN, 0);
    } else {
        tally(s, dst_ifindex, Tally::IngressDenied);
        log_deny(s, dst_ifindex, ingress, false);
        s.ingress_class = s.refused_class;
        tally_classes(RULESET_OPEN, ingress, 0);
    }
    false
}

/// [`tally_classes`]: the verdict was to admit (else: to refuse).
const CLASSES_ADMITTED: u32 = 1;

/// Adds the verdict (`how`: [`CLASSES_ADMITTED`] or not) to the counts of the classes
/// that decided it in rule sets `egress` and `ingress` (the scratch area's
/// `egress_class` and `ingress_class`), where a cluster policy rule decided. A function
/// of its own with a small frame: it runs under the deepest frames of the programs.
#[inline(never)]
fn tally_classes(egress: u32, ingress: u32, how: u32) {
    let Some(s) = scratch() else {
        return;
    };
    for (rs, class, dir) in [
        (egress, s.egress_class, 1u8),
        (ingress, s.ingress_class, 0u8),
    ] {
        if rs == RULESET_OPEN || rs == RULESET_CLOSED || class >= NO_CLASS {
            continue;
        }
        s.class_key.ruleset = rs;
        s.class_key.class = class as u8;
        s.class_key.egress = dir;
        s.class_key._pad = [0; 2];
        let mut p = POLICY_CLASS_COUNTS.get_ptr_mut(&s.class_key);
        if p.is_none() {
            s.class_zero = PolicyClassCounts::default();
            let _ = POLICY_CLASS_COUNTS.insert(&s.class_key, &s.class_zero, 0);
            p = POLICY_CLASS_COUNTS.get_ptr_mut(&s.class_key);
        }
        let Some(c) = p else {
            continue;
        };
        // SAFETY: this CPU's value; a program runs to its end on one CPU.
        unsafe {
            if how == CLASSES_ADMITTED {
                (*c).admitted += 1;
            } else {
                (*c).denied += 1;
            }
        }
    }
}

/// A field of [`PolicyCounts`].
#[derive(Clone, Copy)]
enum Tally {
    IngressAdmitted,
    IngressDenied,
    EgressAdmitted,
    EgressDenied,
}

/// Adds one to `field` of pod interface `ifindex`'s counts (its entry created on its
/// first verdict).
#[inline(always)]
fn tally(s: &mut Scratch, ifindex: u32, field: Tally) {
    s.counts_key = ifindex;
    let mut p = POLICY_COUNTS.get_ptr_mut(&s.counts_key);
    if p.is_none() {
        s.counts_zero = PolicyCounts::default();
        let _ = POLICY_COUNTS.insert(&s.counts_key, &s.counts_zero, 0);
        p = POLICY_COUNTS.get_ptr_mut(&s.counts_key);
    }
    let Some(c) = p else {
        return;
    };
    // SAFETY: this CPU's value; a program runs to its end on one CPU.
    unsafe {
        match field {
            Tally::IngressAdmitted => (*c).ingress_admitted += 1,
            Tally::IngressDenied => (*c).ingress_denied += 1,
            Tally::EgressAdmitted => (*c).egress_admitted += 1,
            Tally::EgressDenied => (*c).egress_denied += 1,
        }
    }
}

/// Writes the refused packet whose tuple is in the scratch area to this CPU's ring of
/// `POLICY_DENIES`, over the oldest entry.
#[inline(always)]
fn log_deny(s: &mut Scratch, ifindex: u32, ruleset: u32, egress: bool) {
    s.denies = s.denies.wrapping_add(1);
    let Some(e) = POLICY_DENIES.get_ptr_mut((s.denies % u64::from(POLICY_DENY_SLOTS)) as u32)
    else {
        return;
    };
    // SAFETY: this CPU's slot; a program runs to its end on one CPU.
    unsafe {
        (*e).seq = s.denies;
        (*e).time_ns = aya_ebpf::helpers::bpf_ktime_get_ns();
        (*e).flow = s.flow;
        (*e).ruleset = ruleset;
        (*e).ifindex = ifindex;
        (*e).egress = u8::from(egress);
        (*e)._pad = [0; 7];
    }
}

/// [`admits`] for a packet whose tuple is loaded, with [`enforcing`]'s state.
#[inline(always)]
pub(crate) fn admits_sides(src: Side, dst: Side, slot: u32, gen: u32) -> bool {
    admits(
        src.ifindex,
        src.owner,
        dst.ifindex,
        dst.owner,
        (u64::from(slot) << 32) | u64::from(gen),
    )
}

/// Whether the node's policy admits the packet in `ctx` (after any translation of ours)
/// into the local pod behind host veth `ifindex` (whose `ENDPOINTS` entry names
/// `owner`), straight past the stack: the pod's ingress, and the egress of the pod whose
/// host veth the packet came in by, if it came from one (the uplink has no entry, so
/// traffic from outside is judged by ingress alone).
#[inline(always)]
pub(crate) fn admits_delivery(ctx: &TcContext, ifindex: u32, owner: u64, ipv6: bool) -> bool {
    let Some((slot, gen)) = enforcing() else {
        return true;
    };
    if load_tuple(ctx, ipv6).is_none() {
        return false;
    }
    // SAFETY: reading a field of the context.
    let from = unsafe { (*ctx.skb.skb).ifindex };
    admits_sides(
        Side {
            ifindex: from,
            owner: 0,
        },
        Side { ifindex, owner },
        slot,
        gen,
    )
}

/// A new flow's entry `f` (key `key`, `received`: the pod is the destination) gets the
/// rule sets and the deciding classes of the last judgement, when it was of this flow's
/// tuple (the packet that makes the entry, or an earlier one of the flow).
#[inline(always)]
pub(crate) fn judged(key: &FlowLogKey, received: bool, f: &mut FlowLogEntry) {
    let Some(s) = scratch() else {
        return;
    };
    let (src, dst, sport, dport) = if received {
        (&key.peer, &key.pod, key.peer_port, key.pod_port)
    } else {
        (&key.pod, &key.peer, key.pod_port, key.peer_port)
    };
    if s.flow.proto != key.proto
        || s.flow.sport != sport
        || s.flow.dport != dport
        || s.flow.saddr != *src
        || s.flow.daddr != *dst
    {
        return;
    }
    f.egress_ruleset = s.judged_egress;
    f.ingress_ruleset = s.judged_ingress;
    f.egress_class = s.egress_class as u8;
    f.ingress_class = s.ingress_class as u8;
}

/// The programs that hand packets into pods or to the stack, first thing: no delivery
/// armed yet ([`note_delivery`]), no packet noted as going to the stack
/// ([`note_to_stack`]).
#[inline(always)]
pub(crate) fn begin() {
    if let Some(s) = scratch() {
        s.delivery_ifindex = 0;
        s.to_stack = false;
    }
}

/// A stage hands the packet to the stack, and it is for a local pod, or for one of the
/// node's addresses (which netfilter may translate back to a local pod: the reply of a
/// flow it masqueraded). [`settle`] marks it when it is the reply of an admitted flow.
#[inline(always)]
pub(crate) fn note_to_stack() {
    if let Some(s) = scratch() {
        s.to_stack = true;
    }
}

/// The last step of `from_pod`, `uplink_ingress` and `from_tunnel` (of either family):
/// a packet a stage noted ([`note_to_stack`]) that goes to the stack (`verdict` `PASS`
/// or `TC_ACT_OK`) gets [`REPLY_MARK`] when it is the reply of a flow the node admitted,
/// judged on its tuple as it is now, before netfilter translates it. A function of its
/// own: its frame is not under the stages'.
#[inline(never)]
pub(crate) fn settle(ctx: &TcContext, verdict: i32, ipv6: bool) -> i32 {
    let Some(s) = scratch() else {
        return verdict;
    };
    let noted = s.to_stack;
    s.to_stack = false;
    if !noted || (verdict != PASS && verdict != TC_ACT_OK as i32) {
        return verdict;
    }
    let Some((slot, gen)) = enforcing() else {
        return verdict;
    };
    if load_tuple(ctx, ipv6).is_none() {
        return verdict;
    }
    let reply = if ipv6 {
        is_admitted_reply::<Addr6>(slot, gen)
    } else {
        is_admitted_reply::<u32>(slot, gen)
    };
    if reply {
        // SAFETY: writing a field of the context, which tc programs may.
        unsafe { (*ctx.skb.skb).mark |= REPLY_MARK };
        count(Reason::PolicyReplyMarked);
    }
    verdict
}

/// Whether the packet whose tuple is in the scratch area is the reply of a flow the node
/// admitted: the flow the other way is recorded under the generation in force, or was
/// opened by the node ([`NODE_OPENED`]), or is admitted again by the policy in force
/// (recorded under an older one). A packet that opens a connection is never a reply.
/// Nothing is counted or logged: a packet that is not a reply is judged by `to_pod`.
#[inline(always)]
fn is_admitted_reply<A: Family>(slot: u32, gen: u32) -> bool {
    let Some(s) = scratch() else {
        return false;
    };
    if s.opens {
        return false;
    }
    s.rev.saddr = s.flow.daddr;
    s.rev.daddr = s.flow.saddr;
    s.rev.sport = s.flow.dport;
    s.rev.dport = s.flow.sport;
    s.rev.proto = s.flow.proto;
    s.rev._pad = [0; 3];
    let Some(f) = POLICY_FLOWS.get_ptr_mut(&s.rev) else {
        return false;
    };
    // SAFETY: LRU values may be recycled under us; only the generation is read and written.
    let recorded = unsafe { (*f).generation };
    if recorded == gen || recorded == NODE_OPENED {
        return true;
    }
    // The flow's source is this packet's destination, its destination this packet's source.
    let from = side_of::<A>(&s.rev.saddr);
    let to = side_of::<A>(&s.rev.daddr);
    let back_egress = ruleset(s, from, slot, true);
    let back_ingress = ruleset(s, to, slot, false);
    if judge(s, back_egress, back_ingress, true).is_err() {
        return false;
    }
    // SAFETY: as above.
    unsafe { (*f).generation = gen };
    true
}

/// The local pod with address `wire` (the tuples' layout), as a side of a judgement.
#[inline(always)]
fn side_of<A: Family>(wire: &[u8; 16]) -> Side {
    match A::from_wire(wire).and_then(Family::local_endpoint) {
        Some(ep) => Side {
            ifindex: ep.ifindex,
            owner: ep.owner,
        },
        None => Side::NONE,
    }
}

/// Records the packet in `ctx`, which one of the node's addresses sends to a pod, as a
/// flow the node opened ([`NODE_OPENED`]), unless it is recorded already: its replies are
/// marked on their way back ([`settle`]). ICMP errors open nothing.
#[inline(always)]
fn note_node_flow(ctx: &TcContext, ipv6: bool) {
    if load_tuple(ctx, ipv6).is_none() {
        return;
    }
    let Some(s) = scratch() else {
        return;
    };
    if s.quoted {
        return;
    }
    // SAFETY: presence and the generation are read, copied out at once.
    if unsafe { POLICY_FLOWS.get(&s.flow) }.is_some_and(|f| f.generation == NODE_OPENED) {
        return;
    }
    s.admitted = PolicyFlow {
        generation: NODE_OPENED,
        _pad: 0,
    };
    let _ = POLICY_FLOWS.insert(&s.flow, &s.admitted, 0);
}

/// `deliver6`: the packet is about to be redirected into `ep`.
#[inline(always)]
pub(crate) fn note_delivery(ep: &EndpointInfo, peer: bool) {
    if let Some(s) = scratch() {
        s.delivery_ifindex = ep.ifindex;
        s.delivery_owner = ep.owner;
        s.delivery_peer = peer;
    }
}

/// A redirect into pod interface `ifindex` past its host veth was admitted.
#[inline(always)]
pub(crate) fn note_delivered(ifindex: u32) {
    if let Some(s) = scratch() {
        s.delivered = ifindex;
    }
}

/// The last step of the programs that redirect into pods: the pod interface an admitted
/// redirect puts the packet into past its host veth (0: none; cleared), for the program
/// to follow as received, in its shallowest frame.
#[inline(always)]
pub(crate) fn delivered() -> u32 {
    let Some(s) = scratch() else {
        return 0;
    };
    let d = s.delivered;
    s.delivered = 0;
    d
}

/// The IPv6 programs, last thing: [`judge_delivery6`], then [`settle`].
#[inline(always)]
pub(crate) fn settle6(ctx: &TcContext, verdict: i32) -> i32 {
    let v = judge_delivery6(ctx, verdict);
    settle(ctx, v, true)
}

/// A redirect into a pod an IPv6 program's stages armed stands if the node's policy
/// admits it ([`admits_delivery`]), else the packet is dropped. A function of its own, so
/// that the tuple it reads does not grow the program's frame, under which the stages run.
#[inline(never)]
fn judge_delivery6(ctx: &TcContext, verdict: i32) -> i32 {
    let Some(s) = scratch() else {
        return verdict;
    };
    let (ifindex, owner) = (s.delivery_ifindex, s.delivery_owner);
    s.delivery_ifindex = 0;
    if ifindex == 0 || verdict != TC_ACT_REDIRECT as i32 {
        return verdict;
    }
    if admits_delivery(ctx, ifindex, owner, true) {
        if s.delivery_peer {
            note_delivered(ifindex);
        }
        verdict
    } else {
        TC_ACT_SHOT as i32
    }
}

/// Whether the node's policy admits a local pod's packet leaving the node (`uplink_egress`,
/// before masquerade; `to_tunnel`): the pod's egress. `saddr` and `daddr` are the
/// packet's addresses; a packet that is no local pod's is not judged here. One the node
/// sends to a pod (from its own socket, or a pod's flow netfilter masqueraded) is
/// recorded as opened by the node ([`note_node_flow`]).
#[inline(always)]
pub(crate) fn admits_leaving<A: Family>(ctx: &TcContext, saddr: A, daddr: A, ipv6: bool) -> bool {
    let Some((slot, gen)) = enforcing() else {
        return true;
    };
    let Some(ep) = saddr.local_endpoint() else {
        if node_config().is_some_and(|c| daddr.in_cluster(c)) && saddr.is_node_addr() {
            note_node_flow(ctx, ipv6);
        }
        return true;
    };
    if load_tuple(ctx, ipv6).is_none() {
        return false;
    }
    admits_sides(
        Side {
            ifindex: ep.ifindex,
            owner: ep.owner,
        },
        Side::NONE,
        slot,
        gen,
    )
}

/// How `to_pod` finds the pod a packet is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodBy {
    /// The packet's device: a host veth, at its egress.
    Ifindex,
    /// The destination address: in a netkit pod's host device's transmit path the packet
    /// is already the pod's interface's, whose index means nothing outside the pod.
    Destination,
}

/// The pod `to_pod` judges for when it is found by destination (`pod`): the local pod
/// of the address at `off`, `Err` (a drop) when no pod has it; `None` when the device
/// tells.
#[inline(always)]
fn pod_by<A: Family + Copy>(
    ctx: &TcContext,
    pod: PodBy,
    off: usize,
) -> Result<Option<EndpointInfo>, ()> {
    match pod {
        PodBy::Ifindex => Ok(None),
        PodBy::Destination => read::<A>(ctx, off)?.local_endpoint().map(Some).ok_or(()),
    }
}

/// `to_pod` (the host veth's egress; `to_netkit`, a netkit pod's host device's
/// transmit path): a packet the kernel delivers to the pod, judged by the pod's ingress
/// and, when a local pod sent it (through the stack: a Service after kube-proxy's DNAT),
/// that pod's egress. A packet marked as the reply of an admitted flow before the stack
/// translated it ([`REPLY_MARK`]) passes. The node's own traffic passes: from one of its
/// addresses (recorded as a flow the node opened, [`note_node_flow`]), and IPv6
/// link-local or multicast (neighbour discovery). Found by destination (`pod`), a packet
/// for no pod's address is dropped while policy is enforced.
///
/// A DNS answer it lets in is read first ([`crate::dns::read_delivered`]).
#[inline(always)]
pub(crate) fn to_pod(ctx: &TcContext, pod: PodBy) -> i32 {
    let Some((slot, gen)) = enforcing() else {
        return PASS;
    };
    let verdict = judge_to_pod(ctx, pod, slot, gen);
    if verdict == PASS {
        learn_delivered(ctx, pod, slot);
    }
    verdict
}

/// [`crate::dns::read_delivered`] for a packet `to_pod` lets in, if it is from port 53:
/// the pod is the device's, or the one of the destination address (`pod`).
#[inline(always)]
fn learn_delivered(ctx: &TcContext, pod: PodBy, slot: u32) {
    let Ok(ethertype) = read::<u16>(ctx, ETH_TYPE_OFF) else {
        return;
    };
    let ipv6 = if ethertype == ETH_P_IP.to_be() {
        false
    } else if ethertype == ETH_P_IPV6.to_be() {
        true
    } else {
        return;
    };
    if !crate::dns::from_dns_port(ctx, ipv6) {
        return;
    }
    let ifindex = match pod {
        // SAFETY: reading a field of the context (the host veth: this is its egress).
        PodBy::Ifindex => unsafe { (*ctx.skb.skb).ifindex },
        PodBy::Destination if ipv6 => match pod_by::<Addr6>(ctx, pod, IP_OFF + IP6_DADDR) {
            Ok(Some(ep)) => ep.ifindex,
            _ => return,
        },
        PodBy::Destination => match pod_by::<u32>(ctx, pod, IP_OFF + IP_DADDR) {
            Ok(Some(ep)) => ep.ifindex,
            _ => return,
        },
    };
    crate::dns::read_delivered(ctx, ifindex, slot, ipv6);
}

/// `to_pod`'s verdict under the slot and generation in force.
#[inline(always)]
fn judge_to_pod(ctx: &TcContext, pod: PodBy, slot: u32, gen: u32) -> i32 {
    // SAFETY: reading a field of the context.
    let mark = unsafe { (*ctx.skb.skb).mark };
    if mark & REPLY_MARK != 0 {
        // Judged before the stack translated it: the reply of an admitted flow.
        // SAFETY: writing a field of the context, which tc programs may.
        unsafe { (*ctx.skb.skb).mark = mark & !REPLY_MARK };
        count(Reason::PolicyReplyPassed);
        return PASS;
    }
    let Ok(ethertype) = read::<u16>(ctx, ETH_TYPE_OFF) else {
        return PASS;
    };
    let (src, dst) = if ethertype == ETH_P_IP.to_be() {
        let Ok(saddr) = read::<u32>(ctx, IP_OFF + IP_SADDR) else {
            return PASS;
        };
        if saddr.is_node_addr() {
            note_node_flow(ctx, false);
            return PASS;
        }
        if load_tuple4(ctx).is_none() {
            return TC_ACT_SHOT as i32;
        }
        let Ok(dst) = pod_by::<u32>(ctx, pod, IP_OFF + IP_DADDR) else {
            return TC_ACT_SHOT as i32;
        };
        (saddr.local_endpoint(), dst)
    } else if ethertype == ETH_P_IPV6.to_be() {
        let Ok(saddr) = read::<Addr6>(ctx, IP_OFF + IP6_SADDR) else {
            return PASS;
        };
        let Ok(daddr0) = read::<u8>(ctx, IP_OFF + IP6_DADDR) else {
            return PASS;
        };
        let s0 = saddr[0].to_ne_bytes();
        if (s0[0] == 0xfe && s0[1] & 0xc0 == 0x80) || daddr0 == 0xff {
            return PASS;
        }
        if saddr.is_node_addr() {
            note_node_flow(ctx, true);
            return PASS;
        }
        if load_tuple6(ctx).is_none() {
            return TC_ACT_SHOT as i32;
        }
        let Ok(dst) = pod_by::<Addr6>(ctx, pod, IP_OFF + IP6_DADDR) else {
            return TC_ACT_SHOT as i32;
        };
        (saddr.local_endpoint(), dst)
    } else {
        return PASS;
    };
    let src = src.map_or(Side::NONE, |ep| Side {
        ifindex: ep.ifindex,
        owner: ep.owner,
    });
    let dst = match dst {
        Some(ep) => Side {
            ifindex: ep.ifindex,
            owner: 0,
        },
        // SAFETY: reading a field of the context (the host veth: this is its egress).
        None => Side {
            ifindex: unsafe { (*ctx.skb.skb).ifindex },
            owner: 0,
        },
    };
    if admits_sides(src, dst, slot, gen) {
        PASS
    } else {
        TC_ACT_SHOT as i32
    }
}
