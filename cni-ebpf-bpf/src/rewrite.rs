//! Rewriting a packet's tuple in place with its IPv4 and L4 checksums (RFC 1624).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_SHOT},
    programs::TcContext,
    Global,
};
use cni_ebpf_common::{proto, Addr6, NatEntry, NatEntryOf, Reason};

use crate::{
    family::Family,
    maps::count,
    parse::{
        Pkt, ICMP6_ECHO_REPLY, ICMP6_ECHO_REQUEST, ICMP_CSUM, ICMP_ECHO, ICMP_ECHO_ID,
        ICMP_ECHO_REPLY, IP6_DADDR, IP6_SADDR, IP_CSUM, IP_DADDR, IP_OFF, IP_SADDR, L4_DPORT,
        L4_OFF, L4_OFF6, L4_SPORT, L4_TRANSLATED_LEN, TCP_CSUM, UDP_CSUM,
    },
};

/// Offset of the L4 checksum and the extra flags `bpf_l4_csum_replace` needs.
#[inline(always)]
pub(crate) fn l4_csum(proto_: u8, l4_off: usize) -> Option<(usize, u64)> {
    match proto_ {
        proto::TCP => Some((l4_off + TCP_CSUM, 0)),
        proto::UDP => Some((l4_off + UDP_CSUM, BPF_F_MARK_MANGLED_0 as u64)),
        proto::ICMP | proto::ICMPV6 => Some((l4_off + ICMP_CSUM, 0)),
        _ => None,
    }
}

/// Test-only fault injection (global `cni_ebpf_common::global::FAULT_L4_CSUM`): `1` makes
/// every [`l4_csum_replace`] fail, `0` (what the plugin always loads) changes nothing.
///
/// No real packet makes the L4 checksum fix fail here (`parse` keeps the checksum field
/// inside the packet, and `BPF_PROG_TEST_RUN` builds linear, private skbs), yet in
/// production a helper can fail (e.g. no memory to pull a non-linear skb). The packet tests
/// load this same object with the value set (`EbpfLoader::override_global`) to check that
/// a failed rewrite is dropped and leaves no NAT state. It lives in `.rodata`, frozen at
/// load: the verifier reads it as a constant, so in production it is an OR with 0.
#[no_mangle]
static FAULT_L4_CSUM: Global<u32> = Global::new(0);

/// `bpf_l4_csum_replace`: every L4 checksum update of the programs goes through here.
#[inline(always)]
pub(crate) fn l4_csum_replace(
    ctx: &TcContext,
    off: usize,
    from: u64,
    to: u64,
    flags: u64,
) -> Result<(), i64> {
    // Under the test fault, an odd offset: the helper itself refuses it (-EFAULT) before
    // touching the packet, after the caller wrote the new tuple — a real failure's state.
    let fault = (FAULT_L4_CSUM.load() & 1) as usize;
    ctx.l4_csum_replace(off | fault, from, to, flags)
}

/// Adds the one's-complement difference of replacing 32-bit word `old` by `new` (both as
/// they are on the wire) to `sum` (RFC 1624).
#[inline(always)]
pub(crate) fn csum_add_change(sum: u32, old: u32, new: u32) -> u32 {
    let [a, b, c, d] = old.to_ne_bytes();
    let [e, f, g, h] = new.to_ne_bytes();
    sum + (!u16::from_be_bytes([a, b])) as u32
        + (!u16::from_be_bytes([c, d])) as u32
        + u16::from_be_bytes([e, f]) as u32
        + u16::from_be_bytes([g, h]) as u32
}

/// Rewrites the packet's tuple `p` into the entry's tuple `n`, fixing the IPv4 header
/// checksum and the L4 checksum (pseudo-header included for TCP/UDP). Addresses, ports
/// and the IPv4 checksum are written in place; the L4 checksum goes through
/// `bpf_l4_csum_replace`, which knows whether the skb carries a partial (offloaded) one.
#[inline(always)]
pub(crate) fn rewrite(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    let start = ctx.data();
    if start + L4_OFF + L4_TRANSLATED_LEN > ctx.data_end() {
        return rewrite_slow(ctx, p, n);
    }
    let ip = (start + IP_OFF) as *mut u8;
    let l4 = (start + L4_OFF) as *mut u8;
    let pseudo = p.proto == proto::TCP || p.proto == proto::UDP;
    // SAFETY: IPv4 header and the first 8 L4 bytes are within [data, data_end), checked
    // above; byte accesses only.
    unsafe {
        if n.saddr != p.saddr || n.daddr != p.daddr {
            let mut sum = (!u16::from_be_bytes([*ip.add(IP_CSUM), *ip.add(IP_CSUM + 1)])) as u32;
            sum = csum_add_change(sum, p.saddr, n.saddr);
            sum = csum_add_change(sum, p.daddr, n.daddr);
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            let [hi, lo] = (!(sum as u16)).to_be_bytes();
            *ip.add(IP_CSUM) = hi;
            *ip.add(IP_CSUM + 1) = lo;
            let sa = n.saddr.to_ne_bytes();
            let da = n.daddr.to_ne_bytes();
            for i in 0..4 {
                *ip.add(IP_SADDR + i) = sa[i];
                *ip.add(IP_DADDR + i) = da[i];
            }
        }
        if pseudo {
            let [a, b] = n.sport.to_ne_bytes();
            let [c, d] = n.dport.to_ne_bytes();
            *l4.add(L4_SPORT) = a;
            *l4.add(L4_SPORT + 1) = b;
            *l4.add(L4_DPORT) = c;
            *l4.add(L4_DPORT + 1) = d;
        } else if p.icmp_type == ICMP_ECHO || p.icmp_type == ICMP_ECHO_REPLY {
            let id = if p.icmp_type == ICMP_ECHO {
                n.sport
            } else {
                n.dport
            };
            let [a, b] = id.to_ne_bytes();
            *l4.add(ICMP_ECHO_ID) = a;
            *l4.add(ICMP_ECHO_ID + 1) = b;
        }
    }
    l4_csum_fix(ctx, p, n)
}

/// The L4 checksum update for [`rewrite`]: addresses (pseudo-header, TCP/UDP) and ports
/// or the echo id.
#[inline(always)]
pub(crate) fn l4_csum_fix(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    let Some((off, fl)) = l4_csum(p.proto, L4_OFF) else {
        return Ok(());
    };
    if p.proto == proto::TCP || p.proto == proto::UDP {
        let pf = fl | BPF_F_PSEUDO_HDR as u64 | 4;
        if n.saddr != p.saddr {
            l4_csum_replace(ctx, off, p.saddr as u64, n.saddr as u64, pf)?;
        }
        if n.daddr != p.daddr {
            l4_csum_replace(ctx, off, p.daddr as u64, n.daddr as u64, pf)?;
        }
        if n.sport != p.sport {
            l4_csum_replace(ctx, off, p.sport as u64, n.sport as u64, fl | 2)?;
        }
        if n.dport != p.dport {
            l4_csum_replace(ctx, off, p.dport as u64, n.dport as u64, fl | 2)?;
        }
    } else if p.icmp_type == ICMP_ECHO && n.sport != p.sport {
        l4_csum_replace(ctx, off, p.sport as u64, n.sport as u64, 2)?;
    } else if p.icmp_type == ICMP_ECHO_REPLY && n.dport != p.dport {
        l4_csum_replace(ctx, off, p.dport as u64, n.dport as u64, 2)?;
    }
    Ok(())
}

/// [`rewrite`] through helpers only, for headers outside the packet's linear part.
#[inline(always)]
pub(crate) fn rewrite_slow(ctx: &TcContext, p: &Pkt, n: &NatEntry) -> Result<(), i64> {
    if n.saddr != p.saddr {
        ctx.store(IP_OFF + IP_SADDR, &n.saddr, 0)?;
        ctx.l3_csum_replace(IP_OFF + IP_CSUM, p.saddr as u64, n.saddr as u64, 4)?;
    }
    if n.daddr != p.daddr {
        ctx.store(IP_OFF + IP_DADDR, &n.daddr, 0)?;
        ctx.l3_csum_replace(IP_OFF + IP_CSUM, p.daddr as u64, n.daddr as u64, 4)?;
    }
    if p.proto == proto::TCP || p.proto == proto::UDP {
        ctx.store(L4_OFF + L4_SPORT, &n.sport, 0)?;
        ctx.store(L4_OFF + L4_DPORT, &n.dport, 0)?;
    } else if p.icmp_type == ICMP_ECHO {
        ctx.store(L4_OFF + ICMP_ECHO_ID, &n.sport, 0)?;
    } else if p.icmp_type == ICMP_ECHO_REPLY {
        ctx.store(L4_OFF + ICMP_ECHO_ID, &n.dport, 0)?;
    }
    l4_csum_fix(ctx, p, n)
}

/// Rewrites an IPv6 packet's tuple `p` into `n`'s. IPv6 has no header checksum; the L4
/// checksum of TCP, UDP and ICMPv6 alike covers the pseudo-header, so a changed address
/// goes into it word by word (`BPF_F_PSEUDO_HDR`), then the ports or the echo id.
#[inline(always)]
pub(crate) fn rewrite6(ctx: &TcContext, p: &Pkt<Addr6>, n: &NatEntryOf<Addr6>) -> Result<(), i64> {
    let Some((off, fl)) = l4_csum(p.proto, L4_OFF6) else {
        return Ok(());
    };
    let pf = fl | BPF_F_PSEUDO_HDR as u64 | 4;
    if n.saddr != p.saddr {
        ctx.store(IP_OFF + IP6_SADDR, &n.saddr, 0)?;
        for i in 0..4 {
            if n.saddr[i] != p.saddr[i] {
                l4_csum_replace(ctx, off, p.saddr[i] as u64, n.saddr[i] as u64, pf)?;
            }
        }
    }
    if n.daddr != p.daddr {
        ctx.store(IP_OFF + IP6_DADDR, &n.daddr, 0)?;
        for i in 0..4 {
            if n.daddr[i] != p.daddr[i] {
                l4_csum_replace(ctx, off, p.daddr[i] as u64, n.daddr[i] as u64, pf)?;
            }
        }
    }
    if p.proto == proto::TCP || p.proto == proto::UDP {
        if n.sport != p.sport {
            ctx.store(L4_OFF6 + L4_SPORT, &n.sport, 0)?;
            l4_csum_replace(ctx, off, p.sport as u64, n.sport as u64, fl | 2)?;
        }
        if n.dport != p.dport {
            ctx.store(L4_OFF6 + L4_DPORT, &n.dport, 0)?;
            l4_csum_replace(ctx, off, p.dport as u64, n.dport as u64, fl | 2)?;
        }
    } else if p.icmp_type == ICMP6_ECHO_REQUEST && n.sport != p.sport {
        ctx.store(L4_OFF6 + ICMP_ECHO_ID, &n.sport, 0)?;
        l4_csum_replace(ctx, off, p.sport as u64, n.sport as u64, 2)?;
    } else if p.icmp_type == ICMP6_ECHO_REPLY && n.dport != p.dport {
        ctx.store(L4_OFF6 + ICMP_ECHO_ID, &n.dport, 0)?;
        l4_csum_replace(ctx, off, p.dport as u64, n.dport as u64, 2)?;
    }
    Ok(())
}

/// Applies entry `n` to packet `p` (the family's rewrite, [`rewrite`] for IPv4). `false`
/// when a step failed: the packet may then carry new addresses or ports under a stale
/// checksum (they are written before the L4 checksum is fixed), so the caller drops it
/// with [`rewrite_failed`].
#[inline(always)]
pub(crate) fn apply<A: Family>(ctx: &TcContext, p: &Pkt<A>, n: &NatEntryOf<A>) -> bool {
    A::rewrite(ctx, p, n).is_ok()
}

/// Verdict for a packet whose rewrite failed part-way: dropped, counted as
/// `drop_rewrite_failed`. Passing it would send on a packet that is neither the one that
/// arrived nor a correct translation (wrong checksum, or a tuple its peer never sees
/// again); "pass what we do not own" does not apply to a packet we already changed. The
/// sender retransmits, and the retransmission is translated afresh.
#[inline(always)]
pub(crate) fn rewrite_failed() -> i32 {
    count(Reason::DropRewriteFailed);
    TC_ACT_SHOT as i32
}
