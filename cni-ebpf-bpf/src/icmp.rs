//! ICMP errors about translated flows, translated back for the pod.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use cni_ebpf_common::{proto, NatKey, Reason, HOOK_UPLINK_IN, NAT_DELIVER_STACK};

use crate::{
    forward::deliver_or_stack,
    maps::{count, NAT},
    parse::{Iphdr, Pkt, ICMP_ECHO, ICMP_ECHO_REPLY, INNER_IP_OFF, INNER_L4_OFF, IP_OFF, L4_OFF},
    PASS,
};

/// An ICMP error (outer `p`) arriving from outside about a packet we translated on its
/// way out: translate the quoted packet back and deliver the error to the pod.
#[inline(always)]
pub(crate) fn icmp_error_in(ctx: &TcContext, p: &Pkt) -> i32 {
    match icmp_error_in_inner(ctx, p) {
        Some(v) => v,
        None => {
            count(Reason::PassNoMatch);
            PASS
        }
    }
}

#[inline(always)]
pub(crate) fn icmp_error_in_inner(ctx: &TcContext, p: &Pkt) -> Option<i32> {
    let ip: Iphdr = ctx.load(INNER_IP_OFF).ok()?;
    if ip.vihl != 0x45 || ip.frag_off & 0x3fffu16.to_be() != 0 {
        return None;
    }
    // The quoted packet's tuple as we sent it.
    let (isport, idport) = match ip.proto {
        proto::TCP | proto::UDP => {
            let ports: [u16; 2] = ctx.load(INNER_L4_OFF).ok()?;
            (ports[0], ports[1])
        }
        proto::ICMP => {
            let ty: u8 = ctx.load(INNER_L4_OFF).ok()?;
            let id: u16 = ctx.load(INNER_L4_OFF + 4).ok()?;
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
        sport: idport,
        dport: isport,
        proto: ip.proto,
        _pad: [0; 3],
    };
    // SAFETY: copied out at once.
    let e = unsafe { NAT.get(key) }.copied()?;
    if e.hook != HOOK_UPLINK_IN {
        return None;
    }
    // New quoted tuple: the entry's translation, reversed.
    let (nsaddr, ndaddr, nsport, ndport) = (e.daddr, e.saddr, e.dport, e.sport);
    let icmp_csum = L4_OFF + 2;

    // Outer destination → the pod.
    ctx.store(IP_OFF + 16, &nsaddr, 0).ok()?;
    ctx.l3_csum_replace(IP_OFF + 10, p.daddr as u64, nsaddr as u64, 4)
        .ok()?;

    // Quoted addresses, with the quoted header checksum; every changed byte of the ICMP
    // payload is folded into the ICMP checksum.
    let old_icsum: u16 = ctx.load(INNER_IP_OFF + 10).ok()?;
    if nsaddr != ip.saddr {
        ctx.store(INNER_IP_OFF + 12, &nsaddr, 0).ok()?;
        ctx.l3_csum_replace(INNER_IP_OFF + 10, ip.saddr as u64, nsaddr as u64, 4)
            .ok()?;
        ctx.l4_csum_replace(icmp_csum, ip.saddr as u64, nsaddr as u64, 4)
            .ok()?;
    }
    if ndaddr != ip.daddr {
        ctx.store(INNER_IP_OFF + 16, &ndaddr, 0).ok()?;
        ctx.l3_csum_replace(INNER_IP_OFF + 10, ip.daddr as u64, ndaddr as u64, 4)
            .ok()?;
        ctx.l4_csum_replace(icmp_csum, ip.daddr as u64, ndaddr as u64, 4)
            .ok()?;
    }
    let new_icsum: u16 = ctx.load(INNER_IP_OFF + 10).ok()?;
    if new_icsum != old_icsum {
        ctx.l4_csum_replace(icmp_csum, old_icsum as u64, new_icsum as u64, 2)
            .ok()?;
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
            ctx.store(INNER_L4_OFF + 4, &new, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, old as u64, new as u64, 2)
                .ok()?;
        }
    } else {
        if nsport != isport {
            ctx.store(INNER_L4_OFF, &nsport, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, isport as u64, nsport as u64, 2)
                .ok()?;
        }
        if ndport != idport {
            ctx.store(INNER_L4_OFF + 2, &ndport, 0).ok()?;
            ctx.l4_csum_replace(icmp_csum, idport as u64, ndport as u64, 2)
                .ok()?;
        }
    }
    count(Reason::IcmpErrorTranslated);
    if e.deliver == NAT_DELIVER_STACK {
        return Some(TC_ACT_OK as i32);
    }
    Some(deliver_or_stack(ctx, nsaddr))
}
