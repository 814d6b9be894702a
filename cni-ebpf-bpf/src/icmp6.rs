//! ICMPv6 errors about masqueraded flows, translated back for the pod (the IPv6 half of
//! [`crate::icmp`]): "packet too big" from a router past the node above all, without
//! which path MTU discovery of every masqueraded IPv6 flow fails.
//!
//! Unlike ICMP's, the ICMPv6 checksum covers the pseudo-header: the outer destination's
//! change is folded in as a pseudo-header change, the quoted bytes' as payload changes.
//! The quoted packet's own L4 checksum is left alone, as for IPv4 (receivers do not
//! verify it, and it may be cut off).

use aya_ebpf::{
    bindings::{BPF_F_PSEUDO_HDR, TC_ACT_OK},
    programs::TcContext,
};
use cni_ebpf_common::{proto, Addr6, NatEntry6, NatHook, NatKey6, Reason};

use crate::{
    family::Family,
    maps::count,
    parse::{
        Pkt, ICMP6_DEST_UNREACH, ICMP6_ECHO_REQUEST, ICMP6_PACKET_TOO_BIG, ICMP6_PARAM_PROB,
        ICMP6_TIME_EXCEEDED, ICMP_CSUM, ICMP_ECHO_ID, INNER6_IP_OFF, INNER6_L4_OFF, IP6_DADDR,
        IP6_SADDR, IP_OFF, L4_OFF6,
    },
    rewrite::{l4_csum_replace, rewrite_failed},
    PASS,
};

/// Whether `p` is an ICMPv6 error (about a packet sent), as opposed to an informational
/// message (echo, neighbour discovery, router advertisements, MLD).
#[inline(always)]
pub(crate) fn is_error(p: &Pkt<Addr6>) -> bool {
    p.proto == proto::ICMPV6
        && matches!(
            p.icmp_type,
            ICMP6_DEST_UNREACH | ICMP6_PACKET_TOO_BIG | ICMP6_TIME_EXCEEDED | ICMP6_PARAM_PROB
        )
}

/// An ICMPv6 error (outer `p`) arriving from outside about a packet we masqueraded on its
/// way out: the quoted packet translated back, the error handed to the stack (which
/// routes it to the pod, as every translated IPv6 reply). An error about nothing we
/// translated passes unchanged; one whose translation fails part-way is dropped.
///
/// Its own BPF function (its frame apart from the caller's lookups).
#[inline(never)]
pub(crate) fn error_in(ctx: &TcContext, p: &Pkt<Addr6>) -> i32 {
    let Some(q) = quoted_flow(ctx, p) else {
        count(Reason::PassNoMatch);
        return PASS;
    };
    if translate_quote(ctx, p, &q).is_err() {
        return rewrite_failed();
    }
    count(Reason::IcmpErrorTranslated);
    count(Reason::TranslatedToStack);
    TC_ACT_OK as i32
}

/// What an ICMPv6 error quotes of a packet we translated: its source (our node address)
/// and source port (an echo request's id), and that flow's reverse entry.
struct Quoted {
    saddr: Addr6,
    proto: u8,
    sport: u16,
    entry: NatEntry6,
}

/// Reads the quoted packet of ICMPv6 error `p` and finds its flow, if that is one we
/// translated on its way out. Writes nothing.
#[inline(always)]
fn quoted_flow(ctx: &TcContext, p: &Pkt<Addr6>) -> Option<Quoted> {
    let head: [u8; 8] = ctx.load(INNER6_IP_OFF).ok()?;
    if head[0] >> 4 != 6 {
        return None;
    }
    let next = head[6];
    let saddr: Addr6 = ctx.load(INNER6_IP_OFF + IP6_SADDR).ok()?;
    let daddr: Addr6 = ctx.load(INNER6_IP_OFF + IP6_DADDR).ok()?;
    let (sport, dport) = match next {
        proto::TCP | proto::UDP => {
            let ports: [u16; 2] = ctx.load(INNER6_L4_OFF).ok()?;
            (ports[0], ports[1])
        }
        proto::ICMPV6 => {
            // Only an echo request of the pod's is masqueraded (by its id).
            let ty: u8 = ctx.load(INNER6_L4_OFF).ok()?;
            if ty != ICMP6_ECHO_REQUEST {
                return None;
            }
            (ctx.load(INNER6_L4_OFF + ICMP_ECHO_ID).ok()?, 0)
        }
        // Extension headers in the quote: not a packet we translated.
        _ => return None,
    };
    // The error goes to the address the quoted packet came from.
    if saddr != p.daddr {
        return None;
    }
    // The reply direction of the quoted packet is what our NAT entry is keyed by.
    let key = NatKey6 {
        saddr: daddr,
        daddr: saddr,
        sport: dport,
        dport: sport,
        proto: next,
        _pad: [0; 3],
    };
    // SAFETY: copied out at once.
    let entry = unsafe { Addr6::nat().get(&key) }.copied()?;
    if entry.hook != NatHook::UPLINK_IN {
        return None;
    }
    Some(Quoted {
        saddr,
        proto: next,
        sport,
        entry,
    })
}

/// Translates ICMPv6 error `p` about quoted flow `q` back for the pod: outer destination,
/// the quoted source address and port (or echo id), with the ICMPv6 checksum. `Err` when
/// a step failed: the packet may be half translated.
#[inline(always)]
fn translate_quote(ctx: &TcContext, p: &Pkt<Addr6>, q: &Quoted) -> Result<(), i64> {
    let e = &q.entry;
    // The quoted packet as the pod sent it: from the entry's destination and port.
    let (pod, pod_port) = (e.daddr, e.dport);
    let csum = L4_OFF6 + ICMP_CSUM;
    let pseudo = BPF_F_PSEUDO_HDR as u64 | 4;

    // Outer destination → the pod (in the pseudo-header).
    ctx.store(IP_OFF + IP6_DADDR, &pod, 0)?;
    for i in 0..4 {
        if pod[i] != p.daddr[i] {
            l4_csum_replace(ctx, csum, p.daddr[i] as u64, pod[i] as u64, pseudo)?;
        }
    }
    // Quoted source → the pod (payload of the ICMPv6 message).
    ctx.store(INNER6_IP_OFF + IP6_SADDR, &pod, 0)?;
    for i in 0..4 {
        if pod[i] != q.saddr[i] {
            l4_csum_replace(ctx, csum, q.saddr[i] as u64, pod[i] as u64, 4)?;
        }
    }
    // Quoted source port, or echo id.
    let off = if q.proto == proto::ICMPV6 {
        INNER6_L4_OFF + ICMP_ECHO_ID
    } else {
        INNER6_L4_OFF
    };
    if q.sport != pod_port {
        ctx.store(off, &pod_port, 0)?;
        l4_csum_replace(ctx, csum, q.sport as u64, pod_port as u64, 2)?;
    }
    Ok(())
}
