//! Flow events: every pod flow's start, end and drops, reported through the ring
//! `FLOW_EVENTS`, aggregated per flow in `FLOW_LOG` (see `cni_ebpf_common::observe`).
//!
//! Where flows are seen: at a pod's interfaces, each packet once after its verdict —
//! what the pod sends at the end of `from_pod` ([`sent`]: the packet as the pod sent it,
//! before any translation the node applies further on), what is delivered into it where
//! it is delivered (a redirect into the pod, or `to_pod` for what the kernel delivers:
//! [`received`]) — and the drops of the uplink and the tunnel device's programs
//! ([`dropped`]). A flow is keyed by the pod interface and its tuple as the pod sees it,
//! so a flow between two pods of the node is followed at each of them, as each sees it.
//!
//! What an event costs: a flow's first packet makes its `FLOW_LOG` entry and a start
//! event (a SYN without a lookup first: it nearly always opens a flow); its later
//! packets add to the entry's counters (one lookup, atomic adds, and once a kernel tick
//! that tick's time rather than a clock source read) and send nothing, but the first TCP
//! FIN or RST (an end event) and the first drop, or a drop for another reason (a drop
//! event). A TCP flow's entry goes with its RST or its last ACK (after a FIN each way):
//! its slot is free again at once, while its memory is still in the cache, and the LRU
//! never has closed connections to evict; a FIN or RST of a flow not followed starts
//! nothing. The agent reports a flow idle past its timeout as ended, from the entry's
//! counters, and removes it. Where the node's socket hooks connect pods' sockets to
//! Service backends (`FLOW_CONFIG_SOCKET_SERVICES`), a new flow's start event also names
//! the Service the pod's socket asked for ([`asked_for`]). Each CPU may send
//! `FlowConfig::events_per_sec` events a second (a token bucket `burst` deep); an event
//! beyond it, or one the full ring refuses, is counted (`flow_event_rate_limited`,
//! `flow_event_ring_full`) and not sent, its flow's counters kept. With
//! `FlowConfig::enabled` 0 (no agent turned flows on) nothing is followed: one array
//! lookup a packet.

#[cfg(target_arch = "bpf")]
use core::intrinsics::{atomic_xadd, AtomicOrdering};
use core::mem::MaybeUninit;
#[cfg(not(target_arch = "bpf"))]
use core::sync::atomic::{AtomicU64, Ordering};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_NO_WAKEUP, TC_ACT_SHOT},
    helpers::{bpf_get_socket_cookie, bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::map,
    maps::PerCpuArray,
    programs::TcContext,
    EbpfContext,
};
use cni_ebpf_common::{
    addr6, bytes6, mapped4, proto, FlowLogEntry, FlowLogKey, Reason, FLOW_CONFIG_SOCKET_SERVICES,
    FLOW_DROPPED, FLOW_ENDED, FLOW_END_FIN, FLOW_END_RST, FLOW_EVENT_DROP, FLOW_EVENT_END,
    FLOW_EVENT_START, FLOW_FIN_RECEIVED, FLOW_FIN_SENT, FLOW_IPV6, FLOW_OPENED_BY_POD, NO_CLASS,
    RULESET_OPEN,
};

use crate::{
    maps::{count, FLOW_CONFIG, FLOW_CPU, FLOW_EVENTS, FLOW_LOG},
    nat::now,
    parse::{
        read, ETH_P_IP, ETH_P_IPV6, ETH_TYPE_OFF, ICMP6_ECHO_REPLY, ICMP6_ECHO_REQUEST, ICMP_ECHO,
        ICMP_ECHO_ID, ICMP_ECHO_REPLY, IP6_DADDR, IP6_SADDR, IP_DADDR, IP_FRAG_OFF, IP_OFF,
        IP_PROTO, IP_SADDR, L4_OFF, L4_OFF6, TCP_ACK, TCP_FIN, TCP_FLAGS, TCP_RST, TCP_SYN,
    },
};

/// SCTP's protocol number (its ports are where TCP's and UDP's are).
const SCTP: u8 = 132;

/// Per-CPU room for a new flow's entry (not pinned: nothing outlives a packet), not on
/// the stack, where the frames of the programs that call [`observe`] leave little room.
pub(crate) struct Scratch {
    fresh: FlowLogEntry,
}

#[map]
static OBSERVE_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// How a pod interface saw a packet.
const SENT: u32 = 0;
const RECEIVED: u32 = 1;
/// A drop outside a pod's interfaces (the uplink, the tunnel device).
const ELSEWHERE: u32 = 2;

/// The end of `from_pod` (either family): the packet pod interface `ifindex` sent, and
/// what became of it (`verdict`).
#[inline(always)]
pub(crate) fn sent(ctx: &TcContext, ifindex: u32, verdict: i32) {
    observe::<SENT>(ctx, ifindex, verdict);
}

/// A packet delivered into pod interface `ifindex` (`verdict` [`TC_ACT_SHOT`]: refused
/// there).
#[inline(always)]
pub(crate) fn received(ctx: &TcContext, ifindex: u32, verdict: i32) {
    if ifindex != 0 {
        observe::<RECEIVED>(ctx, ifindex, verdict);
    }
}

/// The end of a program of the uplink or the tunnel device: a packet it drops is reported.
#[inline(always)]
pub(crate) fn dropped(ctx: &TcContext, verdict: i32) {
    if verdict == TC_ACT_SHOT as i32 {
        observe::<ELSEWHERE>(ctx, 0, verdict);
    }
}

/// Notes the drop reason of the packet being handled (called by `count` for every drop
/// reason): the drop event that may follow names it.
#[inline(always)]
pub(crate) fn note_drop(reason: Reason) {
    if let Some(c) = FLOW_CPU.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { (*c).drop_reason = reason as u32 };
    }
}

/// The drop reason noted for the packet being handled, cleared.
#[inline(always)]
fn take_drop_reason() -> u32 {
    let Some(c) = FLOW_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU value, no concurrent writer on this CPU.
    unsafe {
        let r = (*c).drop_reason;
        (*c).drop_reason = 0;
        r
    }
}

/// Follows one packet (see the module's documentation). A function of its own, so that
/// its frame is not under its callers'. Its code is the path of most packets — the key,
/// the lookup, the counters of a flow followed — and stays small: a new flow's entry
/// ([`fresh`]), an event ([`emit`]) and the keys of uncommon packets ([`load_key_any`])
/// are functions of their own, out of its way (each called from here, so that no chain
/// of calls adds a third frame to the callers').
#[inline(never)]
fn observe<const SIDE: u32>(ctx: &TcContext, ifindex: u32, verdict: i32) {
    let Some(cfg) = FLOW_CONFIG.get(0) else {
        return;
    };
    if cfg.enabled == 0 {
        return;
    }
    let socket_services = cfg.flags & FLOW_CONFIG_SOCKET_SERVICES != 0;
    // On the stack, which is in the cache: every packet's key is written and read.
    let mut key = MaybeUninit::<FlowLogKey>::uninit();
    // SAFETY: a plain-integer struct, all zeros valid, zeroed before it is referenced.
    let key = unsafe {
        zero(key.as_mut_ptr());
        key.assume_init_mut()
    };
    let Some((ipv6, tcp_flags)) = load_key(ctx, key, ifindex, SIDE == RECEIVED) else {
        return;
    };
    let key: &FlowLogKey = key;
    let dropped = verdict == TC_ACT_SHOT as i32;
    let reason = if dropped { take_drop_reason() } else { 0 };
    let syn_only = key.proto == proto::TCP && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    let end = if key.proto != proto::TCP {
        0
    } else if tcp_flags & TCP_RST != 0 {
        FLOW_END_RST
    } else if tcp_flags & TCP_FIN != 0 {
        FLOW_END_FIN
    } else {
        0
    };
    let pkt = Packet {
        sent: SIDE == SENT,
        dropped,
        reason,
        len: u64::from(ctx.len()),
        tcp_flags,
        end,
        syn_only,
    };
    let syn_first = syn_only && !dropped;
    // A new flow's entry replaces the one of an ended flow of its tuple.
    let mut replace = false;
    // A SYN almost always opens a flow not followed yet: its entry is made without a
    // lookup first, which would miss.
    if !syn_first {
        if let Some(e) = FLOW_LOG.get_ptr_mut(key) {
            if counted(e, key, &pkt) {
                return;
            }
            replace = true;
        }
        // A TCP FIN or RST passing for a flow not followed (its entry went with its end)
        // starts nothing.
        if end != 0 && !syn_only && !dropped {
            return;
        }
    }
    let Some(s) = OBSERVE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU scratch, no concurrent user on this CPU.
    let f = unsafe { &mut (*s).fresh };
    fresh::<SIDE>(ctx, key, f, ipv6, socket_services);
    let (kind, why) = if dropped {
        f.dropped_packets = 1;
        f.flags |= FLOW_DROPPED;
        f.drop_reason = reason;
        (FLOW_EVENT_DROP, reason)
    } else {
        if SIDE == SENT {
            f.sent_packets = 1;
            f.sent_bytes = pkt.len;
        } else {
            f.received_packets = 1;
            f.received_bytes = pkt.len;
        }
        (FLOW_EVENT_START, 0)
    };
    let f = &*f;
    let insert = if replace { 0 } else { BPF_NOEXIST as u64 };
    // Only the CPU whose entry went in reports the flow: two packets of a new flow on
    // two CPUs make one event. The event is the entry as it went in (no second lookup).
    if FLOW_LOG.insert(key, f, insert).is_ok() {
        emit(kind, why, key, f, f.started_ns);
        return;
    }
    // The SYN's flow is followed already: a SYN sent again, counted; or one that opens
    // the tuple of a flow that ended again, whose entry it replaces.
    if syn_first {
        if let Some(e) = FLOW_LOG.get_ptr_mut(key) {
            if !counted(e, key, &pkt) && FLOW_LOG.insert(key, f, 0).is_ok() {
                emit(kind, why, key, f, f.started_ns);
            }
        }
    }
}

/// Writes the entry of a new flow `key` into `f`, but its first packet's counts: its
/// start, its rule sets, where it came from (`socket_services`: the Service its socket
/// asked for, [`FLOW_CONFIG_SOCKET_SERVICES`]). A function of its own, out of the way
/// of the packets of flows followed already.
#[inline(never)]
fn fresh<const SIDE: u32>(
    ctx: &TcContext,
    key: &FlowLogKey,
    f: &mut FlowLogEntry,
    ipv6: bool,
    socket_services: bool,
) {
    // SAFETY: a plain-integer struct, all zeros valid; written in place, not built on
    // the stack.
    unsafe { zero(&raw mut *f) };
    let at = now();
    f.started_ns = at;
    f.last_ns = at;
    f.last_tick = ticks();
    f.egress_ruleset = RULESET_OPEN;
    f.ingress_ruleset = RULESET_OPEN;
    f.egress_class = NO_CLASS as u8;
    f.ingress_class = NO_CLASS as u8;
    if SIDE == SENT {
        f.flags = FLOW_OPENED_BY_POD;
        if socket_services {
            asked_for(ctx, key, ipv6, f);
        }
    }
    if ipv6 {
        f.flags |= FLOW_IPV6;
    }
    crate::policy::judged(key, SIDE == RECEIVED, f);
}

/// What [`counted`] needs of a packet.
struct Packet {
    /// The pod sent it (else it was delivered to the pod, or dropped elsewhere).
    sent: bool,
    dropped: bool,
    /// Its drop reason (`dropped`).
    reason: u32,
    len: u64,
    tcp_flags: u8,
    /// `FLOW_END_*` when it is a TCP FIN or RST, else 0.
    end: u32,
    /// A TCP SYN without ACK.
    syn_only: bool,
}

/// Adds packet `p` to the followed flow `key` whose entry is `e`, sending the event it
/// makes (a drop, an end), and removes the entry when `p` closes the flow. `false`: `p`
/// is a SYN opening the tuple of a flow that ended, counted nowhere: a new flow's entry
/// is to replace `e`.
#[inline(always)]
fn counted(e: *mut FlowLogEntry, key: &FlowLogKey, p: &Packet) -> bool {
    // SAFETY: LRU values may be recycled under us; counters are added atomically, flags
    // and times written whole.
    unsafe {
        if p.syn_only && (*e).flags & FLOW_ENDED != 0 {
            return false;
        }
        if p.dropped {
            add(&raw mut (*e).dropped_packets, 1);
            if (*e).flags & FLOW_DROPPED == 0 || (*e).drop_reason != p.reason {
                (*e).flags |= FLOW_DROPPED;
                (*e).drop_reason = p.reason;
                emit(FLOW_EVENT_DROP, p.reason, key, e, now());
            }
            return true;
        }
        // Only the idle timeout reads it: the last tick's time does.
        if let Some(at) = new_tick(&raw mut (*e).last_tick) {
            (*e).last_ns = at;
        }
        if p.sent {
            add(&raw mut (*e).sent_packets, 1);
            add(&raw mut (*e).sent_bytes, p.len);
        } else {
            add(&raw mut (*e).received_packets, 1);
            add(&raw mut (*e).received_bytes, p.len);
        }
        let flags = (*e).flags;
        if p.end != 0 && flags & FLOW_ENDED == 0 {
            (*e).flags |= FLOW_ENDED;
            emit(FLOW_EVENT_END, p.end, key, e, now());
        }
        if p.tcp_flags & TCP_FIN != 0 {
            (*e).flags |= if p.sent {
                FLOW_FIN_SENT
            } else {
                FLOW_FIN_RECEIVED
            };
        }
        // The conversation is over — a RST, or the last ACK after a FIN each way: the
        // entry goes at once (its end was reported), so that a busy node's closed
        // connections leave room and nothing for the LRU to evict.
        let closed = FLOW_FIN_SENT | FLOW_FIN_RECEIVED;
        if p.end == FLOW_END_RST
            || (flags & closed == closed && p.tcp_flags & (TCP_SYN | TCP_FIN) == 0)
        {
            let _ = FLOW_LOG.remove(key);
        }
    }
    true
}

/// Fills `f`'s Service from the socket hooks' reverse map when the pod's socket that
/// sent the packet asked for a Service (or a host port) and was connected to `key`'s
/// peer instead (`sock.rs`; the socket travels with its packets into `from_pod`).
#[inline(always)]
fn asked_for(ctx: &TcContext, key: &FlowLogKey, ipv6: bool, f: &mut FlowLogEntry) {
    // SAFETY: plain helper call on our context (0: the packet has no socket).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if cookie == 0 {
        return;
    }
    let peer = addr6(&key.peer);
    if ipv6 {
        if let Some(v) = crate::sock::recall6(cookie, peer, key.peer_port) {
            f.service = bytes6(&v.addr);
            f.service_port = v.port;
        }
    } else if let Some(v) = crate::sock::recall(cookie, peer[3], key.peer_port) {
        f.service = mapped4(v.addr);
        f.service_port = v.port;
    }
}

/// Sends an event of `kind` for the flow `key` whose entry is `e` (copied as it is now),
/// happening `at`, if the CPU's rate allows and the ring has room.
#[inline(never)]
fn emit(kind: u8, reason: u32, key: &FlowLogKey, e: *const FlowLogEntry, at: u64) {
    if !take_token() {
        count(Reason::FlowEventRateLimited);
        return;
    }
    let Some(mut slot) = FLOW_EVENTS.reserve::<cni_ebpf_common::FlowEvent>(0) else {
        count(Reason::FlowEventRingFull);
        return;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` is the reserved record, written whole before it is submitted; `e` a
    // live map value.
    unsafe {
        first_byte(&raw mut (*ev).kind, kind);
        (*ev).reason = reason;
        (*ev).time_ns = at;
        // Copied map to ring, not through the stack.
        core::ptr::copy_nonoverlapping(key, &raw mut (*ev).key, 1);
        (*ev)._pad2 = 0;
        core::ptr::copy_nonoverlapping(e, &raw mut (*ev).entry, 1);
    }
    // The agent reads the ring on a timer and never waits on it: no wakeup to send.
    slot.submit(BPF_RB_NO_WAKEUP as u64);
}

/// Takes one event from the CPU's bucket, filled at `events_per_sec` up to `burst`.
#[inline(always)]
fn take_token() -> bool {
    let Some(cfg) = FLOW_CONFIG.get(0).copied() else {
        return false;
    };
    let Some(c) = FLOW_CPU.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU value, no concurrent writer on this CPU.
    unsafe {
        // Filled by the millisecond from the last tick's time.
        if let Some(at) = new_tick(&raw mut (*c).tick) {
            let depth = u64::from(cfg.burst.max(1)) * 1000;
            let elapsed = at.saturating_sub((*c).filled_ns).min(1_000_000_000_000);
            // Thousandths of an event: `rate` events/s is `rate` thousandths per ms.
            let gained = elapsed / 1_000_000 * u64::from(cfg.events_per_sec);
            if gained > 0 {
                (*c).tokens_milli = ((*c).tokens_milli + gained).min(depth);
                (*c).filled_ns = at;
            }
        }
        if (*c).tokens_milli < 1000 {
            return false;
        }
        (*c).tokens_milli -= 1000;
    }
    true
}

/// The low 32 bits of the kernel's tick count (`jiffies`): one load (the verifier
/// inlines the helper), where [`tick_now`] is a call that reads the clock.
#[inline(always)]
fn ticks() -> u32 {
    // SAFETY: plain helper call.
    unsafe { bpf_jiffies64() as u32 }
}

/// The last tick's time ([`tick_now`]) when the tick count ([`ticks`]) has moved since
/// the one `*seen` holds (written there), else `None`: that time only moves at a tick.
///
/// # Safety
/// `seen` must be valid for reads and writes.
#[inline(always)]
unsafe fn new_tick(seen: *mut u32) -> Option<u64> {
    let tick = ticks();
    if *seen == tick {
        return None;
    }
    *seen = tick;
    Some(tick_now())
}

/// The kernel's coarse monotonic clock: the time of the last tick (1–4 ms behind at
/// most), read without the clock source that `now` reads (tens of ns on a busy node).
#[inline(always)]
fn tick_now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Zeroes `*p` a word at a time (8 bytes, or 4 for a type of size or alignment 4).
/// `write_bytes` (and a loop of plain stores, which LLVM turns back into one) is a call
/// to `memset`, which in BPF writes a byte at a time: a hundred-odd instructions for an
/// entry, on every new flow.
///
/// # Safety
/// `p` must be valid for writes, and all zeros a valid `T`.
#[inline(always)]
unsafe fn zero<T>(p: *mut T) {
    const {
        assert!(size_of::<T>().is_multiple_of(4) && align_of::<T>() >= 4);
    }
    if size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8 {
        let w = p.cast::<u64>();
        let mut i = 0;
        while i < size_of::<T>() / 8 {
            w.add(i).write_volatile(0);
            i += 1;
        }
    } else {
        let w = p.cast::<u32>();
        let mut i = 0;
        while i < size_of::<T>() / 4 {
            w.add(i).write_volatile(0);
            i += 1;
        }
    }
}

/// Writes `v` into the byte at `p` and zeroes the three after it, as one 4-byte store
/// (three zero bytes alone would be a call to `memset`, see [`zero`]).
///
/// # Safety
/// `p` must be 4-byte aligned and followed by three bytes of padding of the same value.
#[inline(always)]
unsafe fn first_byte(p: *mut u8, v: u8) {
    p.cast::<u32>().write(u32::from_ne_bytes([v, 0, 0, 0]));
}

/// Atomically adds `delta` to `*p`.
///
/// # Safety
/// `p` must be a valid, aligned `u64` inside a map value.
#[inline(always)]
unsafe fn add(p: *mut u64, delta: u64) {
    #[cfg(target_arch = "bpf")]
    atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta);
    #[cfg(not(target_arch = "bpf"))]
    AtomicU64::from_ptr(p).fetch_add(delta, Ordering::Relaxed);
}

/// Writes the key of the packet's flow as pod interface `ifindex` sees it (`received`:
/// the pod is the destination) into `key`; `(ipv6, tcp flags)`. `None`: not IP. An IPv4
/// packet with options, a later fragment or an IPv6 packet with extension headers is
/// keyed without ports.
#[inline(always)]
fn load_key(
    ctx: &TcContext,
    key: &mut FlowLogKey,
    ifindex: u32,
    received: bool,
) -> Option<(bool, u8)> {
    if let Some(flags) = load_key4(ctx, key, ifindex, received) {
        return Some((false, flags));
    }
    load_key_any(ctx, key, ifindex, received)
}

/// [`load_key`] of most packets: IPv4 without options, TCP, UDP or SCTP, not a later
/// fragment, whose headers up to the TCP flags are in the linear data, read after one
/// bounds check and copied into the key byte by byte (the packet's alignment is not
/// known: a wider read would be assembled from bytes anyway). Its TCP flags; `None`:
/// another packet, for [`load_key_any`].
#[inline(always)]
fn load_key4(ctx: &TcContext, key: &mut FlowLogKey, ifindex: u32, received: bool) -> Option<u8> {
    let start = ctx.data();
    if start + L4_OFF + TCP_FLAGS + 1 > ctx.data_end() {
        return None;
    }
    let at = |off: usize| (start + off) as *const u8;
    // SAFETY: every packet read below is within [data, data + L4_OFF + TCP_FLAGS + 1),
    // which lies within [data, data_end) (checked just above); every write is within
    // the key.
    unsafe {
        let ethertype = core::ptr::read_unaligned(at(ETH_TYPE_OFF).cast::<u16>());
        let vihl = *at(IP_OFF);
        let frag = core::ptr::read_unaligned(at(IP_OFF + IP_FRAG_OFF).cast::<u16>());
        let p = *at(IP_OFF + IP_PROTO);
        if ethertype != ETH_P_IP.to_be()
            || vihl != 0x45
            || frag & 0x1fffu16.to_be() != 0
            || !(p == proto::TCP || p == proto::UDP || p == SCTP)
        {
            return None;
        }
        let (src, dst, sport, dport) = if received {
            (
                &raw mut key.peer,
                &raw mut key.pod,
                (&raw mut key.peer_port).cast::<u8>(),
                (&raw mut key.pod_port).cast::<u8>(),
            )
        } else {
            (
                &raw mut key.pod,
                &raw mut key.peer,
                (&raw mut key.pod_port).cast::<u8>(),
                (&raw mut key.peer_port).cast::<u8>(),
            )
        };
        set_addr(src, [0, 0, MAPPED4_PREFIX, 0]);
        copy_bytes::<4>(at(IP_OFF + IP_SADDR), src.cast::<u8>().add(12));
        set_addr(dst, [0, 0, MAPPED4_PREFIX, 0]);
        copy_bytes::<4>(at(IP_OFF + IP_DADDR), dst.cast::<u8>().add(12));
        copy_bytes::<2>(at(L4_OFF), sport);
        copy_bytes::<2>(at(L4_OFF + 2), dport);
        key.ifindex = ifindex;
        first_byte(&raw mut key.proto, p);
        Some(if p == proto::TCP {
            *at(L4_OFF + TCP_FLAGS)
        } else {
            0
        })
    }
}

/// Copies `N` bytes from `from` to `to`, one load and one store each.
///
/// # Safety
/// `from` must be valid for `N` reads and `to` for `N` writes.
#[inline(always)]
unsafe fn copy_bytes<const N: usize>(from: *const u8, to: *mut u8) {
    for i in 0..N {
        to.add(i).write(from.add(i).read());
    }
}

/// [`load_key`] of any packet, each header field read on its own (in the linear data
/// or through `bpf_skb_load_bytes`).
#[inline(never)]
fn load_key_any(
    ctx: &TcContext,
    key: &mut FlowLogKey,
    ifindex: u32,
    received: bool,
) -> Option<(bool, u8)> {
    let ethertype = read::<u16>(ctx, ETH_TYPE_OFF).ok()?;
    // The addresses go straight into the key, word by word (not through the stack).
    let (src, dst) = if received {
        (&raw mut key.peer, &raw mut key.pod)
    } else {
        (&raw mut key.pod, &raw mut key.peer)
    };
    let (ipv6, proto_, (sport, dport, flags)) = if ethertype == ETH_P_IP.to_be() {
        let vihl = read::<u8>(ctx, IP_OFF).ok()?;
        let frag = read::<u16>(ctx, IP_OFF + IP_FRAG_OFF).ok()?;
        let p = read::<u8>(ctx, IP_OFF + IP_PROTO).ok()?;
        let s = read::<u32>(ctx, IP_OFF + IP_SADDR).ok()?;
        let d = read::<u32>(ctx, IP_OFF + IP_DADDR).ok()?;
        // SAFETY: `src` and `dst` are the key's address fields (4-byte aligned: the key
        // is `repr(C)` of alignment 4 and they sit at offsets 8 and 24).
        unsafe {
            set_addr(src, [0, 0, MAPPED4_PREFIX, s]);
            set_addr(dst, [0, 0, MAPPED4_PREFIX, d]);
        }
        let ports = if vihl == 0x45 && frag & 0x1fffu16.to_be() == 0 {
            l4_fields::<L4_OFF>(ctx, p, false)
        } else {
            (0, 0, 0)
        };
        (false, p, ports)
    } else if ethertype == ETH_P_IPV6.to_be() {
        let p = read::<u8>(ctx, IP_OFF + 6).ok()?;
        let s = read::<[u32; 4]>(ctx, IP_OFF + IP6_SADDR).ok()?;
        let d = read::<[u32; 4]>(ctx, IP_OFF + IP6_DADDR).ok()?;
        // SAFETY: as above.
        unsafe {
            set_addr(src, s);
            set_addr(dst, d);
        }
        (true, p, l4_fields::<L4_OFF6>(ctx, p, true))
    } else {
        return None;
    };
    key.ifindex = ifindex;
    // SAFETY: `proto` and `_pad` are the 4 bytes at offset 40 of the `repr(C)` key of
    // alignment 4.
    unsafe { first_byte(&raw mut key.proto, proto_) };
    (key.pod_port, key.peer_port) = if received {
        (dport, sport)
    } else {
        (sport, dport)
    };
    Some((ipv6, flags))
}

/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`), wire bytes as a
/// native `u32`.
const MAPPED4_PREFIX: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// Writes address `words` (wire bytes as native `u32`s) to `*at`.
///
/// # Safety
/// `at` must be a writable, 4-byte aligned address field.
#[inline(always)]
unsafe fn set_addr(at: *mut [u8; 16], words: [u32; 4]) {
    let w = at.cast::<u32>();
    for (i, v) in words.into_iter().enumerate() {
        w.add(i).write(v);
    }
}

/// The source and destination ports (ICMP: an echo's identifier, else the type and code,
/// both ways) and the TCP flags of a packet whose L4 header of protocol `proto_` is at
/// `L4` (a constant: the verifier checks every read at a known offset).
#[inline(always)]
fn l4_fields<const L4: usize>(ctx: &TcContext, proto_: u8, ipv6: bool) -> (u16, u16, u8) {
    match proto_ {
        proto::TCP | proto::UDP | SCTP => {
            let sport = read::<u16>(ctx, L4).unwrap_or(0);
            let dport = read::<u16>(ctx, L4 + 2).unwrap_or(0);
            let flags = if proto_ == proto::TCP {
                read::<u8>(ctx, L4 + TCP_FLAGS).unwrap_or(0)
            } else {
                0
            };
            (sport, dport, flags)
        }
        proto::ICMP | proto::ICMPV6 => {
            let ty = read::<u8>(ctx, L4).unwrap_or(0);
            let echo = if ipv6 {
                ty == ICMP6_ECHO_REQUEST || ty == ICMP6_ECHO_REPLY
            } else {
                ty == ICMP_ECHO || ty == ICMP_ECHO_REPLY
            };
            let id = if echo {
                read::<u16>(ctx, L4 + ICMP_ECHO_ID).unwrap_or(0)
            } else {
                read::<u16>(ctx, L4).unwrap_or(0)
            };
            (id, id, 0)
        }
        _ => (0, 0, 0),
    }
}
