//! A pod speaks only as itself: the source address of every IPv4 and IPv6 packet a pod
//! sends is checked at `from_pod`, before anything else looks at the packet.
//!
//! - IPv4: one of the pod's own addresses on this very veth (`ENDPOINTS`, which the
//!   forwarding decisions need anyway, so the pod's own address costs no extra lookup),
//!   else a prefix of its allow-list (`SRC_ALLOW`).
//! - IPv6: the unspecified address `::` (duplicate address detection), a link-local
//!   address `fe80::/10` (neighbour discovery; the kernel never forwards either), else
//!   one longest-prefix lookup in `SRC_ALLOW6`, which holds the pod's own addresses (/128)
//!   and its allow-list together.
//! - Anything else (ARP, other ethertypes) carries no IP source and is passed on.

use aya_ebpf::{maps::lpm_trie::Key, programs::TcContext};
use cni_ebpf_common::{SrcAllow6Key, SRC6_ALLOWED, SRC6_OWN};

use crate::{
    maps::{source_of, Source, SRC_ALLOW6},
    parse::{read, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, IP6_SADDR, IP_OFF, IP_SADDR},
};

/// What [`check_source`] makes of a pod's frame.
pub(crate) enum Verdict {
    /// Sent from a source the pod may use.
    Allowed(Source),
    /// Sent from a source the pod may not use: drop it.
    Spoofed,
}

/// Checks the source address of the frame the pod behind host veth `ifindex` sent.
#[inline(always)]
pub(crate) fn check_source(ctx: &TcContext, ifindex: u32) -> Verdict {
    let Ok(ethertype) = read::<u16>(ctx, ETH_TYPE_OFF) else {
        return Verdict::Allowed(Source::AllowListed);
    };
    if ethertype == ETH_P_IP.to_be() {
        // A frame too short for the source (or not version 4) is the kernel's to drop.
        let Ok(vihl) = read::<u8>(ctx, IP_OFF) else {
            return Verdict::Allowed(Source::AllowListed);
        };
        if vihl >> 4 != 4 {
            return Verdict::Allowed(Source::AllowListed);
        }
        let Ok(saddr) = read::<u32>(ctx, IP_OFF + IP_SADDR) else {
            return Verdict::Allowed(Source::AllowListed);
        };
        return match source_of(saddr, ifindex) {
            Some(s) => Verdict::Allowed(s),
            None => Verdict::Spoofed,
        };
    }
    if ethertype == ETH_P_IPV6.to_be() {
        let Ok(saddr) = read::<[u64; 2]>(ctx, IP_OFF + IP6_SADDR) else {
            return Verdict::Allowed(Source::AllowListed);
        };
        return match source6(&saddr, ifindex) {
            // The pod's own address: its flows may be recorded. Whether it is paced is
            // looked up, and it may have host ports (`ENDPOINTS6` is not read here).
            Some(SRC6_OWN) => Verdict::Allowed(Source::Own {
                paced: true,
                host_ports: true,
            }),
            Some(_) => Verdict::Allowed(Source::AllowListed),
            None => Verdict::Spoofed,
        };
    }
    Verdict::Allowed(Source::AllowListed)
}

/// Whether the pod behind host veth `ifindex` may send IPv6 from `saddr` (the address's
/// 16 bytes in wire order, read as two native words), and as what: `SRC6_OWN`, or
/// `SRC6_ALLOWED` (an allow-listed prefix, a link-local address or `::`); `None` when it
/// may not.
#[inline(always)]
fn source6(saddr: &[u64; 2], ifindex: u32) -> Option<u32> {
    let bytes = saddr[0].to_ne_bytes();
    // fe80::/10: neighbour discovery, router solicitations, MLD; never forwarded.
    if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 {
        return Some(SRC6_ALLOWED);
    }
    // `::`: duplicate address detection before the pod has an address.
    if saddr[0] | saddr[1] == 0 {
        return Some(SRC6_ALLOWED);
    }
    // SAFETY: two u64 and sixteen u8 have the same size, and every bit pattern is valid.
    let addr: [u8; 16] = unsafe { core::mem::transmute(*saddr) };
    let key = Key::new(
        160,
        SrcAllow6Key {
            ifindex_be: ifindex.to_be(),
            addr,
        },
    );
    SRC_ALLOW6.get(key).copied()
}
