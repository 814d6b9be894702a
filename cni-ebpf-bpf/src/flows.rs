//! Living next to netfilter: which pod flows may bypass the node's stack.
//!
//! The rule (docs/kubernetes.md, "Living next to kube-proxy"): a fast path never bypasses
//! netfilter for a flow that netfilter translates — kube-proxy's DNAT of a ClusterIP or
//! NodePort and its un-DNAT of the replies, a portmap-style rule, an admin's NAT. We cannot
//! read netfilter's decisions, but for pod traffic leaving the node we own a hook on each
//! side of the stack: `from_pod` before it, `uplink_egress` after it. So we watch what the
//! stack does to a flow's first packets ("own flow tracking"):
//!
//! - A pod's packet leaving the node (not for a local pod) on a flow that is not verified
//!   goes to the stack, and `from_pod` records its tuple as pending in `FLOWS`. A TCP SYN
//!   always does, so a new connection on a reused tuple is judged afresh.
//! - When `uplink_egress` sees a pending tuple leave exactly as the pod sent it, netfilter
//!   left the flow alone: it is verified, and its later packets take the fast path
//!   (`forward::to_uplink`). A translated flow leaves with another tuple (or not through
//!   the uplink at all) and stays on the kernel path for as long as it lives.
//! - Same-node pod → pod packets are redirected from the first packet — unless they are
//!   for a pod socket that talks through the stack to another peer (`STACK_SOCKETS`): then
//!   they are the replies of a Service flow (endpoint → client) that netfilter must
//!   un-DNAT, and go to the stack.
//! - `uplink_ingress` redirects a packet for a local pod straight into it when its flow's
//!   other direction (the pod's packets) is verified: both directions of such a flow
//!   bypass the stack. Half a flow through the stack would not do: conntrack would see
//!   one direction's data only and call the other's acknowledgements INVALID, which
//!   kube-proxy's iptables rules drop.
//! - `uplink_ingress` marks flows opened from outside the cluster towards a pod as
//!   inbound, so that masquerade leaves the pod's replies alone (iptables MASQUERADE only
//!   translates connections the pod opened).
//!
//! The alternative, asking the kernel's conntrack (`bpf_skb_ct_lookup`), needs kfunc calls
//! that aya 0.14 cannot relocate, and conntrack entries exist only where a netfilter user
//! enabled conntrack in the namespace; tracking at our own hooks works on every node and
//! costs one LRU lookup per fast-pathed packet. What it gives up: after its first packets a
//! fast-pathed flow is no longer seen by netfilter (FORWARD rules, conntrack), see
//! docs/kubernetes.md.

use cni_ebpf_common::{
    proto, FlowEntry, FlowFlags, NatKeyOf, NodeConfig, Reason, SockKeyOf, SockPeerOf,
};

use crate::{family::Family, maps::count, nat::now, parse::Pkt};

/// A new `FLOWS` entry with `flags`, seen now.
#[inline(always)]
fn fresh(flags: FlowFlags) -> FlowEntry {
    FlowEntry {
        flags,
        merged_at: 0,
        last_seen_ns: now(),
    }
}

/// The `STACK_SOCKETS` key of a pod socket.
#[inline(always)]
fn socket<A>(addr: A, port: u16, proto_: u8) -> SockKeyOf<A> {
    SockKeyOf {
        addr,
        port,
        proto: proto_,
        _pad: 0,
    }
}

/// Whether a pod's packet leaving the node may skip the stack: its flow was verified to
/// leave untranslated, and it is not a TCP SYN.
#[inline(always)]
pub(crate) fn may_bypass_stack<A: Family>(p: &Pkt<A>) -> bool {
    if !p.natable || (p.proto == proto::TCP && p.is_tcp_syn()) {
        return false;
    }
    let Some(f) = A::flows().get_ptr_mut(p.key()) else {
        return false;
    };
    // SAFETY: LRU values may be recycled under us; only the timestamp is written.
    unsafe {
        if !(*f).flags.contains(FlowFlags::VERIFIED) {
            return false;
        }
        (*f).last_seen_ns = now();
    }
    true
}

/// `uplink_ingress`: whether a packet for a local pod may skip the stack: the pod's side
/// of its flow was verified to leave untranslated, and it is not a TCP SYN.
#[inline(always)]
pub(crate) fn inbound_may_bypass_stack<A: Family>(p: &Pkt<A>) -> bool {
    inbound_verified(p).is_some()
}

/// The `FLOWS` entry of the flow of inbound packet `p` (keyed by the pod's side) when it
/// is verified and `p` is not a TCP SYN.
#[inline(always)]
fn inbound_verified<A: Family>(p: &Pkt<A>) -> Option<*mut FlowEntry> {
    if !p.natable || (p.proto == proto::TCP && p.is_tcp_syn()) {
        return None;
    }
    let f = A::flows().get_ptr_mut(p.key().reversed())?;
    // SAFETY: LRU values may be recycled under us; a flag is read.
    unsafe { (*f).flags.contains(FlowFlags::VERIFIED) }.then_some(f)
}

/// How long the packets of a flow follow a segment the tunnel device merges (GRO)
/// through the device, in units of 1024 ns (about a millisecond, at least seven eighths
/// of it): longer than a packet waits in the device's receive queue, so that none
/// delivered past the device overtakes one queued there.
const DEVICE_HOLD: u32 = 1000;

/// `tunnel::decap4`: whether a packet for a local pod that came out of the tunnel may be
/// delivered past the tunnel device: as [`inbound_may_bypass_stack`], and no segment of
/// its flow went through the device to be merged within [`DEVICE_HOLD`]. A packet that
/// is such a segment (`merged`) goes through the device, and the flow's next packets
/// follow it.
#[inline(always)]
pub(crate) fn inbound_may_skip_device<A: Family>(p: &Pkt<A>, merged: bool) -> bool {
    let Some(f) = inbound_verified(p) else {
        return false;
    };
    let at = (now() >> 10) as u32;
    // SAFETY: LRU values may be recycled under us; only the merge time is written.
    unsafe {
        if merged {
            // Written at most every eighth of the hold: a transfer's segments would
            // otherwise write the entry on every packet.
            if at.wrapping_sub((*f).merged_at) >= DEVICE_HOLD / 8 {
                (*f).merged_at = at;
            }
            return false;
        }
        // Wrapping: once every 73 minutes a packet may go through the device needlessly.
        at.wrapping_sub((*f).merged_at) >= DEVICE_HOLD
    }
}

/// Records that a pod's packet goes to the stack: its flow is pending verification, and
/// its socket addresses this peer through the stack. Only a packet from the pod's own
/// address (`own_source`, as `from_pod` found it) is recorded: an allow-listed foreign
/// source cannot steer another pod's flows.
#[inline(always)]
pub(crate) fn to_stack<A: Family>(p: &Pkt<A>, own_source: bool) {
    count(Reason::PassUnverifiedFlow);
    if !p.natable || !own_source {
        return;
    }
    let key = p.key();
    let syn = p.proto == proto::TCP && p.is_tcp_syn();
    let mut inbound = false;
    match A::flows().get_ptr_mut(key) {
        // SAFETY: as in `may_bypass_stack`; a SYN starts the flow afresh (the pod opens it).
        Some(f) => unsafe {
            inbound = (*f).flags.contains(FlowFlags::INBOUND);
            (*f).flags = if syn {
                FlowFlags::PENDING
            } else {
                ((*f).flags - FlowFlags::VERIFIED) | FlowFlags::PENDING
            };
            (*f).last_seen_ns = now();
        },
        None => {
            let _ = A::flows().insert(&key, &fresh(FlowFlags::PENDING), 0);
        }
    }
    // Only a client's socket is recorded: a server's listening port (answering clients
    // outside through the stack) must not send its local clients' requests to the stack.
    // A TCP socket is a client from its SYN on (later packets refresh the record); a UDP
    // or ICMP one unless it answers a flow opened from outside.
    let sock = socket(p.saddr, p.sport, p.proto);
    let client = if p.proto == proto::TCP {
        // SAFETY: copied out at once (presence only).
        syn || unsafe { A::stack_sockets().get(sock) }.is_some()
    } else {
        !inbound
    };
    if client {
        let peer = SockPeerOf {
            addr: p.daddr,
            port: p.dport,
            _pad: 0,
        };
        let _ = A::stack_sockets().insert(&sock, &peer, 0);
    }
}

/// A pod's TCP SYN straight to a local pod: its socket now talks to that peer directly,
/// so a record of it talking through the stack is stale (a reused ephemeral port) and
/// would send this connection's replies to the stack.
#[inline(always)]
pub(crate) fn opens_direct<A: Family>(p: &Pkt<A>) {
    if p.proto == proto::TCP && p.is_tcp_syn() {
        let sock = socket(p.saddr, p.sport, p.proto);
        let _ = A::stack_sockets().remove(&sock);
    }
}

/// Whether `p`, for a local pod, is a reply that netfilter must un-NAT: the destination
/// socket sent through the stack to a peer other than `p`'s source.
#[inline(always)]
pub(crate) fn is_translated_reply<A: Family>(p: &Pkt<A>) -> bool {
    let sock = socket(p.daddr, p.dport, p.proto);
    // SAFETY: copied out at once.
    match unsafe { A::stack_sockets().get(sock) } {
        Some(peer) => peer.addr != p.saddr || peer.port != p.sport,
        None => false,
    }
}

/// `uplink_egress`: the flags of `p`'s flow if a pod sent exactly this tuple (`None`: it
/// reached the uplink translated by netfilter, or from the node itself). A pending flow
/// becomes verified.
///
/// A TCP SYN whose entry is not pending was not sent with this tuple: every SYN a pod
/// sends goes to the stack and marks its tuple pending (`to_stack`). It is a new
/// connection netfilter translated onto the tuple of an earlier one that ended here (a
/// source port used once towards an endpoint directly, then again for its ClusterIP).
/// That entry is dropped, or its replies would bypass the stack's un-DNAT.
#[inline(always)]
pub(crate) fn seen_leaving<A: Family>(p: &Pkt<A>) -> Option<FlowFlags> {
    if !p.natable {
        return None;
    }
    let key = p.key();
    let f = A::flows().get_ptr_mut(key)?;
    // SAFETY: as in `may_bypass_stack`.
    unsafe {
        let flags = (*f).flags;
        if flags.contains(FlowFlags::PENDING) {
            (*f).flags = (flags - FlowFlags::PENDING) | FlowFlags::VERIFIED;
            count(Reason::FlowVerified);
        } else if p.proto == proto::TCP && p.is_tcp_syn() {
            let _ = A::flows().remove(key);
            return None;
        }
        Some(flags)
    }
}

/// `uplink_ingress`: a packet for local pod `p.daddr` that goes to the stack. If it comes
/// from outside the cluster, its flow is marked inbound so that the pod's replies are not
/// masqueraded; a TCP SYN opens the flow afresh (and unverified).
#[inline(always)]
pub(crate) fn note_inbound<A: Family>(p: &Pkt<A>, cfg: &NodeConfig) {
    if !p.natable || p.saddr.in_cluster(cfg) {
        return;
    }
    let key = p.key().reversed();
    let syn = p.proto == proto::TCP && p.is_tcp_syn();
    match A::flows().get_ptr_mut(key) {
        // SAFETY: as in `may_bypass_stack`.
        Some(f) => unsafe {
            if syn {
                (*f).flags = FlowFlags::INBOUND;
            } else {
                (*f).flags |= FlowFlags::INBOUND;
            }
            (*f).last_seen_ns = now();
        },
        None => {
            let _ = A::flows().insert(&key, &fresh(FlowFlags::INBOUND), 0);
        }
    }
}

/// A flow we translate ourselves and deliver without the stack (a host port): its replies
/// from the pod (`reply`, as the pod sends them) may bypass the stack at once and are
/// never masqueraded.
#[inline(always)]
pub(crate) fn note_own_inbound<A: Family>(reply: &NatKeyOf<A>) {
    let _ = A::flows().insert(reply, &fresh(FlowFlags::VERIFIED | FlowFlags::INBOUND), 0);
}
