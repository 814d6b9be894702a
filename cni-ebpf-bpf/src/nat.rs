//! NAT state: one LRU map of exact 5-tuples, one entry per direction of a translated
//! flow, tagged with the program (hook) that applies it; TCP close tracking and the
//! SNAT port search that takes back ports of finished flows.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_loop},
};
use cni_ebpf_common::{
    proto, NatEntry, NatKey, NodeConfig, Reason, NAT_CLOSED_GRACE_NS, NAT_DELIVER_DIRECT,
    NAT_F_FIN, NAT_F_FIRST_FIN, NAT_F_RST, NAT_ICMP_IDLE_NS, NAT_TCP_IDLE_NS, NAT_TIME_WAIT_NS,
    NAT_UDP_IDLE_NS,
};

use crate::{
    maps::{count, port_mapping, NAT},
    parse::{Pkt, TCP_FIN, TCP_RST},
};

/// How many random SNAT ports are tried before giving up on a flow (a `bpf_loop`, so the
/// verifier checks one try whatever the count).
pub(crate) const SNAT_TRIES: u32 = 128;

/// Looks up the NAT entry for `p` if it belongs to `hook`, refreshing its timestamp and
/// noting FIN/RST (a SYN reopening a closed flow clears them).
#[inline(always)]
pub(crate) fn nat_lookup(p: &Pkt, hook: u8) -> Option<NatEntry> {
    if !p.natable {
        return None;
    }
    let e = NAT.get_ptr_mut(p.key())?;
    // SAFETY: LRU values may be recycled under us; we copy the value and only write the
    // timestamp and close flags, which is harmless if the entry was reused.
    unsafe {
        if (*e).hook != hook {
            return None;
        }
        if p.proto == proto::TCP {
            if (*e).flags != 0 && p.is_tcp_syn() {
                // The tuple of a closed flow opens again: it is open again in both
                // directions, unless its other half is gone or now belongs to another
                // flow (its port was handed out again), when it is set up afresh.
                let o = NAT.get_ptr_mut(opposite(&*e, proto::TCP))?;
                if opposite(&*o, proto::TCP) != p.key() {
                    return None;
                }
                (*o).flags = 0;
                (*e).flags = 0;
            }
            if p.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                note_close(&mut *e, p.tcp_flags);
            }
        }
        (*e).last_seen_ns = now();
        Some(*e)
    }
}

/// The key of the entry for the other direction of `e`'s flow: its translated tuple,
/// reversed.
#[inline(always)]
pub(crate) fn opposite(e: &NatEntry, proto_: u8) -> NatKey {
    NatKey {
        saddr: e.daddr,
        daddr: e.saddr,
        sport: e.dport,
        dport: e.sport,
        proto: proto_,
        _pad: [0; 3],
    }
}

/// Records a FIN or RST seen in `e`'s direction (the first FIN of the flow also marks
/// which side closed first).
#[inline(always)]
pub(crate) fn note_close(e: &mut NatEntry, tcp_flags: u8) {
    if tcp_flags & TCP_RST != 0 {
        e.flags |= NAT_F_RST;
    }
    if tcp_flags & TCP_FIN != 0 && e.flags & NAT_F_FIN == 0 {
        // SAFETY: copied out at once.
        let peer_fin =
            unsafe { NAT.get(opposite(e, proto::TCP)) }.is_some_and(|o| o.flags & NAT_F_FIN != 0);
        e.flags |= if peer_fin {
            NAT_F_FIN
        } else {
            NAT_F_FIN | NAT_F_FIRST_FIN
        };
    }
}

/// Whether the flow holding a translated port (its reverse entry `rev`, keyed by the
/// outside peer → node:port, and its forward entry `fwd`) is over: closed (RST, or FINs
/// both ways) past its grace time, or idle past its protocol's timeout.
#[inline(always)]
pub(crate) fn flow_is_over(rev: &NatEntry, fwd: Option<&NatEntry>, proto_: u8, now: u64) -> bool {
    let (fwd_flags, fwd_seen) = fwd.map_or((0, 0), |f| (f.flags, f.last_seen_ns));
    let last = if fwd_seen > rev.last_seen_ns {
        fwd_seen
    } else {
        rev.last_seen_ns
    };
    let idle = now.saturating_sub(last);
    let limit = match proto_ {
        proto::TCP => {
            // Without a forward entry (evicted, or replaced by a reopened flow) the pod
            // side counts as closed.
            let fwd_fin = fwd.is_none() || fwd_flags & NAT_F_FIN != 0;
            if (rev.flags | fwd_flags) & NAT_F_RST != 0 {
                NAT_CLOSED_GRACE_NS
            } else if rev.flags & NAT_F_FIN != 0 && fwd_fin {
                if rev.flags & NAT_F_FIRST_FIN != 0 {
                    NAT_TIME_WAIT_NS
                } else {
                    NAT_CLOSED_GRACE_NS
                }
            } else {
                NAT_TCP_IDLE_NS
            }
        }
        proto::UDP => NAT_UDP_IDLE_NS,
        _ => NAT_ICMP_IDLE_NS,
    };
    idle >= limit
}

/// Frees translated port `key.dport` (reverse entry `key`) if its flow is over: both
/// entries are removed. `true` when the port is free now.
#[inline(always)]
pub(crate) fn reclaim(key: &NatKey) -> bool {
    // SAFETY: copied out at once.
    let Some(rev) = (unsafe { NAT.get(*key) }).copied() else {
        return true;
    };
    let fkey = opposite(&rev, key.proto);
    // SAFETY: copied out at once.
    let fwd = unsafe { NAT.get(fkey) }.copied();
    // The forward entry belongs to this port only if it still translates to it.
    let fwd = fwd.filter(|f| f.sport == key.dport && f.saddr == key.daddr);
    if !flow_is_over(&rev, fwd.as_ref(), key.proto, now()) {
        return false;
    }
    if fwd.is_some() {
        let _ = NAT.remove(&fkey);
    }
    let _ = NAT.remove(key);
    true
}

/// Reserves a translated port on address `local` for a flow with `peer:peer_port`
/// (protocol `proto_`): inserts the reverse entry `rev`, keyed by peer → local:port, with
/// a free port of the configured SNAT range tried at random (a port whose flow is over is
/// taken back). Returns the port (network order) and the reverse entry's key.
#[inline(always)]
pub(crate) fn alloc_port(
    cfg: &NodeConfig,
    peer: u32,
    peer_port: u16,
    local: u32,
    proto_: u8,
    rev: &NatEntry,
) -> Option<(u16, NatKey)> {
    let min = cfg.snat_port_min as u32;
    let max = cfg.snat_port_max as u32;
    if min == 0 || max < min {
        return None;
    }
    let mut a = PortSearch {
        min,
        span: max - min + 1,
        key: NatKey {
            saddr: peer,
            daddr: local,
            sport: peer_port,
            dport: 0,
            proto: proto_,
            _pad: [0; 3],
        },
        rev: *rev,
        port: 0,
        found: 0,
    };
    // `bpf_loop`: the verifier checks one try, not SNAT_TRIES unrolled ones.
    // SAFETY: `port_try` has the callback signature and `a` outlives the call.
    unsafe {
        bpf_loop(
            SNAT_TRIES,
            port_try as *const () as *mut c_void,
            &mut a as *mut PortSearch as *mut c_void,
            0,
        );
    }
    if a.found == 0 {
        return None;
    }
    Some((a.port, a.key))
}

/// State of [`alloc_port`]'s search, shared with [`port_try`].
#[repr(C)]
pub(crate) struct PortSearch {
    min: u32,
    span: u32,
    key: NatKey,
    rev: NatEntry,
    port: u16,
    found: u8,
}

/// One try of [`alloc_port`]: 1 (stop) once a port is taken, else 0.
#[inline(never)]
pub(crate) extern "C" fn port_try(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `PortSearch` passed to `bpf_loop` by `alloc_port`.
    let a = unsafe { &mut *(ctx as *mut PortSearch) };
    // SAFETY: plain helper call.
    let r = unsafe { bpf_get_prandom_u32() };
    let Some(off) = r.checked_rem(a.span) else {
        return 1;
    };
    let port = ((a.min + off) as u16).to_be();
    if a.key.proto != proto::ICMP && port_mapping(a.key.daddr, port, a.key.proto).is_some() {
        return 0;
    }
    a.key.dport = port;
    if NAT.insert(&a.key, &a.rev, BPF_NOEXIST as u64).is_ok() {
        a.port = port;
        a.found = 1;
        return 1;
    }
    if reclaim(&a.key) && NAT.insert(&a.key, &a.rev, BPF_NOEXIST as u64).is_ok() {
        count(Reason::SnatPortReclaimed);
        a.port = port;
        a.found = 1;
        return 1;
    }
    0
}

/// Removes the two entries a new flow's first packet inserted — `fwd_key` (the packet's own
/// tuple) and `rev_key` (its reply's) — when that packet is dropped after all: no
/// translation is left behind for a flow that never started, and a SNAT port it reserved
/// is free again at once.
#[inline(always)]
pub(crate) fn forget_new_flow(fwd_key: &NatKey, rev_key: &NatKey) {
    let _ = NAT.remove(fwd_key);
    let _ = NAT.remove(rev_key);
}

#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(crate) fn entry(
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
    hook: u8,
    kind: u8,
) -> NatEntry {
    NatEntry {
        saddr,
        daddr,
        sport,
        dport,
        hook,
        kind,
        flags: 0,
        deliver: NAT_DELIVER_DIRECT,
        last_seen_ns: now(),
    }
}
