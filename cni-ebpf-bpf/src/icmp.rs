//! ICMP errors about translated flows, translated back for the pod.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use cni_ebpf_common::{proto, NatDeliver, NatEntry, NatHook, NatKey, Reason};

use crate::{
    forward::PodDelivery,
    hostport::deliver_local,
    maps::{count, NAT},
    parse::{
        Iphdr, Pkt, ICMP_CSUM, ICMP_DEST_UNREACH, ICMP_ECHO, ICMP_ECHO_ID, ICMP_ECHO_REPLY,
        ICMP_PARAMETER_PROB, ICMP_TIME_EXCEEDED, INNER_IP_OFF, INNER_L4_OFF, IP_CSUM, IP_DADDR,
        IP_OFF, IP_SADDR, L4_DPORT, L4_OFF,
    },
    rewrite::{l4_csum_replace, rewrite_failed},
    PASS,
};

/// Whether ICMP type `ty` is an error about a packet sent (destination unreachable, time
/// exceeded, parameter problem), which quotes that packet.
#[inline(always)]
pub(crate) fn is_error_type(ty: u8) -> bool {
    matches!(
        ty,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROB
    )
}

/// Whether `p` is an ICMP error (see [`is_error_type`]).
#[inline(always)]
pub(crate) fn is_error(p: &Pkt) -> bool {
    p.proto == proto::ICMP && is_error_type(p.icmp_type)
}

/// An ICMP error (outer `p`) arriving from outside about a packet we translated on its
/// way out: translate the quoted packet back and deliver the error to the pod. An error
/// about nothing we translated passes unchanged; one whose translation fails part-way is
/// dropped (its outer destination may already be the pod's, with stale checksums).
#[inline(always)]
pub(crate) fn icmp_error_in(ctx: &TcContext, p: &Pkt) -> i32 {
    let Some(q) = quoted_flow(ctx, p) else {
        count(Reason::PassNoMatch);
        return PASS;
    };
    if translate_quote(ctx, p, &q).is_err() {
        return rewrite_failed();
    }
    count(Reason::IcmpErrorTranslated);
    if q.entry.deliver == NatDeliver::STACK {
        return TC_ACT_OK as i32;
    }
    deliver_local(ctx, q.entry.daddr, PodDelivery::Peer)
}

/// What an ICMP error quotes of a packet we translated, and that flow's reverse entry.
struct Quoted {
    /// The quoted IPv4 header.
    ip: Iphdr,
    /// The quoted source and destination ports (echo id as in [`NatKey`]), network order.
    sport: u16,
    dport: u16,
    /// The reverse NAT entry of the quoted packet's flow.
    entry: NatEntry,
}

/// Reads the quoted packet of ICMP error `p` and finds the flow it belongs to, if that is
/// one we translated on its way out. Writes nothing.
#[inline(always)]
fn quoted_flow(ctx: &TcContext, p: &Pkt) -> Option<Quoted> {
    let ip: Iphdr = ctx.load(INNER_IP_OFF).ok()?;
    if ip.vihl != 0x45 || ip.frag_off & 0x3fffu16.to_be() != 0 {
        return None;
    }
    // The quoted packet's tuple as we sent it.
    let (sport, dport) = match ip.proto {
        proto::TCP | proto::UDP => {
            let ports: [u16; 2] = ctx.load(INNER_L4_OFF).ok()?;
            (ports[0], ports[1])
        }
        proto::ICMP => {
            let ty: u8 = ctx.load(INNER_L4_OFF).ok()?;
            let id: u16 = ctx.load(INNER_L4_OFF + ICMP_ECHO_ID).ok()?;
            match ty {
                ICMP_ECHO => (id, 0),
                ICMP_ECHO_REPLY => (0, id),
                _ => return None,
            }
        }
        _ => return None,
    };
    if ip.saddr != p.daddr {
        return None;
    }
    // The reply direction of the quoted packet is what our NAT entry is keyed by.
    let key = NatKey {
        saddr: ip.daddr,
        daddr: ip.saddr,
        sport: dport,
        dport: sport,
        proto: ip.proto,
        _pad: [0; 3],
    };
    // SAFETY: copied out at once.
    let entry = unsafe { NAT.get(key) }.copied()?;
    if entry.hook != NatHook::UPLINK_IN {
        return None;
    }
    Some(Quoted {
        ip,
        sport,
        dport,
        entry,
    })
}

/// Translates ICMP error `p` about quoted flow `q` back for the pod: outer destination,
/// quoted addresses and ports, with every checksum. `Err` when a step failed: the packet
/// may be half translated.
#[inline(always)]
fn translate_quote(ctx: &TcContext, p: &Pkt, q: &Quoted) -> Result<(), i64> {
    let (ip, isport, idport, e) = (&q.ip, q.sport, q.dport, &q.entry);
    // New quoted tuple: the entry's translation, reversed.
    let (nsaddr, ndaddr, nsport, ndport) = (e.daddr, e.saddr, e.dport, e.sport);
    let icmp_csum = L4_OFF + ICMP_CSUM;

    // Outer destination → the pod.
    ctx.store(IP_OFF + IP_DADDR, &nsaddr, 0)?;
    ctx.l3_csum_replace(IP_OFF + IP_CSUM, p.daddr as u64, nsaddr as u64, 4)?;

    // Quoted addresses, with the quoted header checksum; every changed byte of the ICMP
    // payload is folded into the ICMP checksum.
    let old_icsum: u16 = ctx.load(INNER_IP_OFF + IP_CSUM)?;
    if nsaddr != ip.saddr {
        ctx.store(INNER_IP_OFF + IP_SADDR, &nsaddr, 0)?;
        ctx.l3_csum_replace(INNER_IP_OFF + IP_CSUM, ip.saddr as u64, nsaddr as u64, 4)?;
        l4_csum_replace(ctx, icmp_csum, ip.saddr as u64, nsaddr as u64, 4)?;
    }
    if ndaddr != ip.daddr {
        ctx.store(INNER_IP_OFF + IP_DADDR, &ndaddr, 0)?;
        ctx.l3_csum_replace(INNER_IP_OFF + IP_CSUM, ip.daddr as u64, ndaddr as u64, 4)?;
        l4_csum_replace(ctx, icmp_csum, ip.daddr as u64, ndaddr as u64, 4)?;
    }
    let new_icsum: u16 = ctx.load(INNER_IP_OFF + IP_CSUM)?;
    if new_icsum != old_icsum {
        l4_csum_replace(ctx, icmp_csum, old_icsum as u64, new_icsum as u64, 2)?;
    }
    // Quoted ports / echo id (the quoted L4 checksum is left alone: receivers do not
    // verify it, and it may be cut off).
    if ip.proto == proto::ICMP {
        let (old, new) = if isport != 0 {
            (isport, nsport)
        } else {
            (idport, ndport)
        };
        if old != new {
            ctx.store(INNER_L4_OFF + ICMP_ECHO_ID, &new, 0)?;
            l4_csum_replace(ctx, icmp_csum, old as u64, new as u64, 2)?;
        }
    } else {
        if nsport != isport {
            ctx.store(INNER_L4_OFF, &nsport, 0)?;
            l4_csum_replace(ctx, icmp_csum, isport as u64, nsport as u64, 2)?;
        }
        if ndport != idport {
            ctx.store(INNER_L4_OFF + L4_DPORT, &ndport, 0)?;
            l4_csum_replace(ctx, icmp_csum, idport as u64, ndport as u64, 2)?;
        }
    }
    Ok(())
}
