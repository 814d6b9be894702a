//! NAT state: one hash map of exact 5-tuples per address family ([`Family::nat`]), one
//! entry per direction of a translated flow, tagged with the program (hook) that applies it; TCP close tracking and the
//! SNAT port search that takes back ports of finished flows.
//!
//! Fair shares: the map is not LRU, so the kernel never evicts an entry — an LRU table
//! filled by one pod's flows would evict other pods' live ones. Instead every entry is
//! charged to the pod that opened its flow (masquerade, hairpin: the sending pod; host
//! port: the pod behind it) in `NAT_USE`, whoever inserts a charged entry adds one and
//! whoever removes it gives one back ([`nat_add`], [`nat_remove`]), and a new flow is
//! refused when its pod's share is full ([`room_for_flow`]). Finished flows are removed
//! when their port is wanted again ([`reclaim`]) and by a sweep of the table in bounded
//! slices ([`sweep`]), at most one slice a second node-wide, run when a pod at its cap
//! (or a full table) asks for room: so a pod's expired flows stop counting soon after
//! its next new flows ask, without a daemon.

use core::ffi::c_void;
#[cfg(target_arch = "bpf")]
use core::intrinsics::{atomic_xadd, AtomicOrdering};
#[cfg(not(target_arch = "bpf"))]
use core::sync::atomic::{AtomicU32, Ordering};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_for_each_map_elem, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_loop},
};
use cni_ebpf_common::{
    proto, NatDeliver, NatDestKeyOf, NatEntryOf, NatFlags, NatHook, NatKeyOf, NatKind, NatUse,
    NodeConfig, Reason, NAT_CLOSED_GRACE_NS, NAT_ICMP_IDLE_NS, NAT_SWEEP_BUDGET,
    NAT_SWEEP_INTERVAL_NS, NAT_TCP_IDLE_NS, NAT_TIME_WAIT_NS, NAT_UDP_IDLE_NS,
};

use crate::{
    family::Family,
    maps::{count, NAT_USE},
    parse::{Pkt, TCP_FIN, TCP_RST},
};

/// How many random SNAT ports are tried before giving up on a flow (a `bpf_loop`, so the
/// verifier checks one try whatever the count).
pub(crate) const SNAT_TRIES: u32 = 128;

/// Looks up the NAT entry for `p` if it belongs to `hook`, refreshing its timestamp and
/// noting FIN/RST (a SYN reopening a closed flow clears them).
#[inline(always)]
pub(crate) fn nat_lookup<A: Family>(p: &Pkt<A>, hook: NatHook) -> Option<NatEntryOf<A>> {
    if !p.natable {
        return None;
    }
    let e = A::nat().get_ptr_mut(p.key())?;
    // SAFETY: the value may be removed (and its slot reused) under us; we copy the value
    // and only write the timestamp and close flags, which is harmless if it was.
    unsafe {
        if (*e).hook != hook {
            return None;
        }
        if p.proto == proto::TCP {
            if !(*e).flags.is_empty() && p.is_tcp_syn() {
                // The tuple of a closed flow opens again: it is open again in both
                // directions, unless its other half is gone or now belongs to another
                // flow (its port was handed out again), when it is set up afresh.
                let o = A::nat().get_ptr_mut(opposite(&*e, proto::TCP))?;
                if opposite(&*o, proto::TCP) != p.key() {
                    return None;
                }
                // Live again: closing gave its charges back, so they are taken again.
                recharge(&*o);
                recharge(&*e);
                (*o).flags = NatFlags::empty();
                (*e).flags = NatFlags::empty();
            }
            if p.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                note_close(&mut *e, p.tcp_flags);
                release_if_closed(&mut *e, &p.key());
            }
        }
        (*e).last_seen_ns = now();
        Some(*e)
    }
}

/// The pod `e` is charged to, or 0 (charged to nobody, or its flow's close gave the
/// charge back).
#[inline(always)]
pub(crate) fn charged_pod<A>(e: &NatEntryOf<A>) -> u32 {
    if e.flags.contains(NatFlags::UNCHARGED) {
        0
    } else {
        e.pod
    }
}

/// Takes the charge of an entry whose closed flow opens again.
#[inline(always)]
fn recharge<A>(e: &NatEntryOf<A>) {
    if e.pod != 0 && e.flags.contains(NatFlags::UNCHARGED) {
        add_use(e.pod, 1);
    }
}

/// Once a TCP flow is closed (a RST either way, or FINs both ways) its two entries stop
/// counting against their pod's share: the cap is on live flows, and the entries only
/// wait out their grace time (or the peer's TIME_WAIT) until port reuse or a sweep
/// removes them. `e` is the entry a FIN or RST was just noted in, `key` its key.
#[inline(always)]
fn release_if_closed<A: Family>(e: &mut NatEntryOf<A>, key: &NatKeyOf<A>) {
    if charged_pod(e) == 0 {
        return;
    }
    let o = A::nat()
        .get_ptr_mut(opposite(e, proto::TCP))
        // SAFETY: a map value; only its flags are read and written.
        .filter(|o| opposite(unsafe { &**o }, proto::TCP) == *key);
    // SAFETY: as above.
    let (o_flags, o_pod) = o.map_or((NatFlags::FIN, 0), |o| unsafe {
        ((*o).flags, charged_pod(&*o))
    });
    let closed =
        (e.flags | o_flags).contains(NatFlags::RST) || (e.flags & o_flags).contains(NatFlags::FIN);
    if !closed {
        return;
    }
    add_use(e.pod, u32::MAX);
    e.flags |= NatFlags::UNCHARGED;
    if let Some(o) = o {
        if o_pod != 0 {
            add_use(o_pod, u32::MAX);
            // SAFETY: as above.
            unsafe { (*o).flags |= NatFlags::UNCHARGED };
        }
    }
}

/// The key of the entry for the other direction of `e`'s flow: its translated tuple,
/// reversed.
#[inline(always)]
pub(crate) fn opposite<A: Copy>(e: &NatEntryOf<A>, proto_: u8) -> NatKeyOf<A> {
    NatKeyOf {
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
pub(crate) fn note_close<A: Family>(e: &mut NatEntryOf<A>, tcp_flags: u8) {
    if tcp_flags & TCP_RST != 0 {
        e.flags |= NatFlags::RST;
    }
    if tcp_flags & TCP_FIN != 0 && !e.flags.contains(NatFlags::FIN) {
        // SAFETY: copied out at once.
        let peer_fin = unsafe { A::nat().get(opposite(e, proto::TCP)) }
            .is_some_and(|o| o.flags.contains(NatFlags::FIN));
        e.flags |= if peer_fin {
            NatFlags::FIN
        } else {
            NatFlags::FIN | NatFlags::FIRST_FIN
        };
    }
}

/// Whether the flow holding a translated port (its reverse entry `rev`, keyed by the
/// outside peer → node:port, and its forward entry `fwd`) is over: closed (RST, or FINs
/// both ways) past its grace time, or idle past its protocol's timeout.
#[inline(always)]
pub(crate) fn flow_is_over<A>(
    rev: &NatEntryOf<A>,
    fwd: Option<&NatEntryOf<A>>,
    proto_: u8,
    now: u64,
) -> bool {
    let (fwd_flags, fwd_seen) = fwd.map_or((NatFlags::empty(), 0), |f| (f.flags, f.last_seen_ns));
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
            let fwd_fin = fwd.is_none() || fwd_flags.contains(NatFlags::FIN);
            if (rev.flags | fwd_flags).contains(NatFlags::RST) {
                NAT_CLOSED_GRACE_NS
            } else if rev.flags.contains(NatFlags::FIN) && fwd_fin {
                if rev.flags.contains(NatFlags::FIRST_FIN) {
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
pub(crate) fn reclaim<A: Family>(key: &NatKeyOf<A>) -> bool {
    // Read in place, not copied (the entries are 56 bytes each for IPv6, and this runs
    // under the port search's frames). A removal racing us at worst misjudges one port
    // for one try; the references are not used after our own removals.
    // SAFETY: map values, valid for the program run.
    let Some(rev) = (unsafe { A::nat().get(key) }) else {
        return true;
    };
    let fkey = opposite(rev, key.proto);
    // SAFETY: as above.
    let fwd = unsafe { A::nat().get(&fkey) };
    // The forward entry belongs to this port only if it still translates to it.
    let fwd = fwd.filter(|f| f.sport == key.dport && f.saddr == key.daddr);
    if !flow_is_over(rev, fwd, key.proto, now()) {
        return false;
    }
    if fwd.is_some() {
        nat_remove(&fkey);
    }
    nat_remove(key);
    true
}

/// Reserves a translated port on address `local` for a flow with `peer:peer_port`
/// (protocol `proto_`): inserts the reverse entry `rev`, keyed by peer → local:port, with
/// a free port of the configured SNAT range tried at random (a port whose flow is over is
/// taken back). Returns the port (network order); the reverse entry's key is
/// [`rev_key`] of it.
///
/// `only_pod` (a host ifindex, else 0): the pod is at its cap of ports towards this peer,
/// so only a port it holds itself, in a masqueraded flow that is over, may be taken (its
/// count stays as it is); free ports are passed over.
#[inline(always)]
pub(crate) fn alloc_port<A: Family>(
    cfg: &NodeConfig,
    peer: A,
    peer_port: u16,
    local: A,
    proto_: u8,
    rev: &NatEntryOf<A>,
    only_pod: u32,
) -> Option<u16> {
    let min = cfg.snat_port_min as u32;
    let max = cfg.snat_port_max as u32;
    if min == 0 || max < min {
        return None;
    }
    let mut a = PortSearch {
        min,
        span: max - min + 1,
        key: NatKeyOf {
            saddr: peer,
            daddr: local,
            sport: peer_port,
            dport: 0,
            proto: proto_,
            _pad: [0; 3],
        },
        rev,
        only_pod,
        port: 0,
        found: 0,
    };
    // `bpf_loop`: the verifier checks one try, not SNAT_TRIES unrolled ones.
    // SAFETY: `port_try` has the callback signature and `a` outlives the call.
    unsafe {
        bpf_loop(
            SNAT_TRIES,
            port_try::<A> as *const () as *mut c_void,
            &mut a as *mut PortSearch<'_, A> as *mut c_void,
            0,
        );
    }
    if a.found == 0 {
        return None;
    }
    Some(a.port)
}

/// The key of the reverse entry [`alloc_port`] inserted for `peer:peer_port` → `local`
/// with `port` (the key is rebuilt, not returned: an IPv6 one is 40 bytes of the frame).
#[inline(always)]
pub(crate) fn rev_key<A>(peer: A, peer_port: u16, local: A, port: u16, proto_: u8) -> NatKeyOf<A> {
    NatKeyOf {
        saddr: peer,
        daddr: local,
        sport: peer_port,
        dport: port,
        proto: proto_,
        _pad: [0; 3],
    }
}

/// State of [`alloc_port`]'s search, shared with [`port_try`]. The entry is the
/// caller's, not a copy (an IPv6 one is 56 bytes of the verifier's 512).
#[repr(C)]
pub(crate) struct PortSearch<'a, A> {
    min: u32,
    span: u32,
    key: NatKeyOf<A>,
    rev: &'a NatEntryOf<A>,
    only_pod: u32,
    port: u16,
    found: u8,
}

/// One try of [`alloc_port`]: 1 (stop) once a port is taken, else 0.
#[inline(never)]
pub(crate) extern "C" fn port_try<A: Family>(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `PortSearch` passed to `bpf_loop` by `alloc_port`.
    let a = unsafe { &mut *(ctx as *mut PortSearch<'_, A>) };
    // SAFETY: plain helper call.
    let r = unsafe { bpf_get_prandom_u32() };
    let Some(off) = r.checked_rem(a.span) else {
        return 1;
    };
    let port = ((a.min + off) as u16).to_be();
    if a.key.proto != A::ICMP && a.key.daddr.is_host_port(port, a.key.proto) {
        return 0;
    }
    a.key.dport = port;
    if a.only_pod != 0 {
        // SAFETY: copied out at once.
        let own = unsafe { A::nat().get(a.key) }
            .is_some_and(|e| e.kind == NatKind::SNAT_REV && e.pod == a.only_pod);
        if !own {
            return 0;
        }
    } else if nat_add(&a.key, a.rev, BPF_NOEXIST as u64) {
        a.port = port;
        a.found = 1;
        return 1;
    }
    if reclaim(&a.key) && nat_add(&a.key, a.rev, BPF_NOEXIST as u64) {
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
pub(crate) fn forget_new_flow<A: Family>(fwd_key: &NatKeyOf<A>, rev_key: &NatKeyOf<A>) {
    nat_remove(fwd_key);
    nat_remove(rev_key);
}

/// Inserts NAT entry `e` at `key` (`flags`: `BPF_ANY` or `BPF_NOEXIST`), charging it to
/// its pod (and a masquerade reverse entry's port to its destination, [`dest_key`]) and
/// giving back the charges of an entry it replaces. `false` when the map refused it (the
/// key exists under `BPF_NOEXIST`, or the table is full).
#[inline(always)]
pub(crate) fn nat_add<A: Family>(key: &NatKeyOf<A>, e: &NatEntryOf<A>, flags: u64) -> bool {
    // SAFETY: copied out at once.
    let (old, old_dest) = if flags == BPF_NOEXIST as u64 {
        (0, None)
    } else {
        unsafe { A::nat().get(*key) }.map_or((0, None), |o| (charged_pod(o), dest_key(key, o)))
    };
    if A::nat().insert(key, e, flags).is_err() {
        return false;
    }
    if e.pod != 0 {
        add_use(e.pod, 1);
    }
    if let Some(d) = dest_key(key, e) {
        add_dest_use(&d, 1);
    }
    if old != 0 {
        add_use(old, u32::MAX);
    }
    if let Some(d) = old_dest {
        add_dest_use(&d, u32::MAX);
    }
    true
}

/// Removes NAT entry `key` and gives back its charges (only the remover that succeeded
/// does, so two CPUs removing one entry give them back once).
#[inline(always)]
pub(crate) fn nat_remove<A: Family>(key: &NatKeyOf<A>) {
    // SAFETY: copied out at once.
    let (pod, dest) =
        unsafe { A::nat().get(*key) }.map_or((0, None), |e| (charged_pod(e), dest_key(key, e)));
    if A::nat().remove(key).is_err() {
        return;
    }
    if pod != 0 {
        add_use(pod, u32::MAX);
    }
    if let Some(d) = dest {
        add_dest_use(&d, u32::MAX);
    }
}

/// The destination whose SNAT ports entry `e` (at `key`) holds one of, charged to its
/// pod: for a masquerade reverse entry (keyed destination → node:port), the pod and
/// that destination. Unlike the pod's share of the table, the port stays charged after
/// its flow closed, until the entry goes: the port is held until then.
#[inline(always)]
fn dest_key<A: Copy>(key: &NatKeyOf<A>, e: &NatEntryOf<A>) -> Option<NatDestKeyOf<A>> {
    if e.kind != NatKind::SNAT_REV || e.pod == 0 {
        return None;
    }
    Some(NatDestKeyOf {
        pod: e.pod,
        daddr: key.saddr,
        dport: key.sport,
        proto: key.proto,
        _pad: 0,
    })
}

/// Adds `delta` (`1` or `u32::MAX`, −1) to the SNAT ports pod `d.pod` holds towards
/// `d`'s destination, atomically; the key is removed by whoever takes the count to zero.
/// (A port taken in the instant between may go uncounted: the count errs low, never
/// high, so a pod is never refused ports it does not hold.)
#[inline(always)]
fn add_dest_use<A: Family>(d: &NatDestKeyOf<A>, delta: u32) {
    if let Some(c) = A::nat_dest_use().get_ptr_mut(d) {
        // SAFETY: a valid, aligned `u32` map value, only ever updated atomically.
        unsafe { atomic_add(c, delta) };
        // Read after the add, not returned by it (a fetch-add with a result needs BPF
        // v3): of CPUs racing here, one at least sees zero; one that adds after sees
        // its own one and keeps the key.
        // SAFETY: as above; a plain read of an aligned `u32`.
        if delta == u32::MAX && (unsafe { core::ptr::read_volatile(c) } as i32) <= 0 {
            let _ = A::nat_dest_use().remove(d);
        }
        return;
    }
    if delta != 1 {
        return;
    }
    if A::nat_dest_use().insert(d, &1, BPF_NOEXIST as u64).is_err() {
        // Another CPU made the key first (or the map is full: the port goes uncounted).
        if let Some(c) = A::nat_dest_use().get_ptr_mut(d) {
            // SAFETY: as above.
            unsafe { atomic_add(c, 1) };
        }
    }
}

/// Whether the pod of `d` may take one more SNAT port towards `d`'s destination
/// (`cap`: `natPortsPerDestination`, 0 for no cap). When it may not, the table is swept
/// for finished flows (at most once a second node-wide) and the count looked at again.
#[inline(always)]
pub(crate) fn dest_room<A: Family>(d: &NatDestKeyOf<A>, cap: u32) -> bool {
    if has_dest_room(d, cap) {
        return true;
    }
    sweep::<A>() && has_dest_room(d, cap)
}

#[inline(always)]
fn has_dest_room<A: Family>(d: &NatDestKeyOf<A>, cap: u32) -> bool {
    if cap == 0 {
        return true;
    }
    // SAFETY: copied out at once.
    let held = unsafe { A::nat_dest_use().get(d) }.copied().unwrap_or(0);
    // Signed, as for the pod's share.
    (held as i32) < cap as i32
}

/// Atomically adds `delta` to `*p` (the old value is not returned: that needs BPF v3).
///
/// # Safety
/// `p` must be a valid, aligned `u32` that is only ever updated atomically.
#[inline(always)]
unsafe fn atomic_add(p: *mut u32, delta: u32) {
    // `core::sync::atomic` has no types for the BPF target; the intrinsic is what
    // `AtomicU32::fetch_add` lowers to (a BPF atomic add, its result unused).
    #[cfg(target_arch = "bpf")]
    atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(p, delta);
    #[cfg(not(target_arch = "bpf"))]
    AtomicU32::from_ptr(p).fetch_add(delta, Ordering::Relaxed);
}

/// Adds `delta` (wrapping: `u32::MAX` is −1) to pod `pod`'s charged entries, atomically.
/// A pod without a share (its interface is gone) is left alone.
#[inline(always)]
fn add_use(pod: u32, delta: u32) {
    if let Some(u) = NAT_USE.get_ptr_mut(pod) {
        // SAFETY: a valid, aligned `u32` inside the map value, which lives as long as
        // the map; only ever updated atomically by the programs.
        unsafe { atomic_add(&raw mut (*u).entries, delta) };
    }
}

/// Whether pod `pod` (host veth ifindex) may open one more translated flow (two
/// entries) within its share. When it may not, the table is swept for finished flows
/// (at most once a second node-wide) and the share looked at again. A pod with no share
/// recorded (0, or an interface ADD did not finish) is not limited. The sweep is of
/// family `A`'s table, the one the new flow goes into.
#[inline(always)]
pub(crate) fn room_for_flow<A: Family>(pod: u32) -> bool {
    if has_room(pod) {
        return true;
    }
    sweep::<A>() && has_room(pod)
}

#[inline(always)]
fn has_room(pod: u32) -> bool {
    // SAFETY: copied out at once.
    let Some(u) = (unsafe { NAT_USE.get(pod) }).copied() else {
        return true;
    };
    // Signed: a give-back racing a removal elsewhere may leave it just below zero.
    (u.entries as i32).saturating_add(2) <= u.cap as i32
}

/// Asks for a slice of the sweep ([`sweep_now`]): runs it at once, or, for a family
/// whose sweep is deferred ([`Family::SWEEP_DEFERRED`]), notes the request for the next
/// packet's [`sweep_if_requested`] and answers `false` (nothing was freed yet: the caller
/// refuses this packet, and the flow's next try finds the room).
#[inline(always)]
pub(crate) fn sweep<A: Family>() -> bool {
    if !A::SWEEP_DEFERRED {
        return sweep_now::<A>();
    }
    if let Some(c) = sweep_clock::<A>() {
        // SAFETY: a map value; `cap` is unused by the clock keys otherwise.
        unsafe { (*c).cap = 1 };
    }
    false
}

/// Runs the slice a deferred [`sweep`] asked for, if any: at the top of a program, where
/// the sweep's frames fit. The request stays until a slice ran (one at most per
/// [`NAT_SWEEP_INTERVAL_NS`]).
#[inline(always)]
pub(crate) fn sweep_if_requested<A: Family>() {
    let Some(c) = NAT_USE.get_ptr_mut(A::SWEEP_CLOCK) else {
        return;
    };
    // SAFETY: a map value; two CPUs racing here at worst both try a slice.
    if unsafe { (*c).cap } != 0 && sweep_now::<A>() {
        // SAFETY: as above.
        unsafe { (*c).cap = 0 };
    }
}

/// The family's sweep clock (`NAT_USE` key [`Family::SWEEP_CLOCK`]), made on first use.
#[inline(always)]
fn sweep_clock<A: Family>() -> Option<*mut NatUse> {
    if let Some(c) = NAT_USE.get_ptr_mut(A::SWEEP_CLOCK) {
        return Some(c);
    }
    let first = NatUse {
        entries: 1,
        ..NatUse::default()
    };
    let _ = NAT_USE.insert(&A::SWEEP_CLOCK, &first, BPF_NOEXIST as u64);
    NAT_USE.get_ptr_mut(A::SWEEP_CLOCK)
}

/// Runs one slice of the sweep that removes finished flows from the NAT table, at most
/// once per [`NAT_SWEEP_INTERVAL_NS`] node-wide and family (the clock is `NAT_USE` key
/// [`Family::SWEEP_CLOCK`]). `true` when a slice ran.
///
/// A slice walks the table (`bpf_for_each_map_elem`) from its start, but looks closely —
/// reads the flow's other entry — at no more than [`NAT_SWEEP_BUDGET`] entries, then
/// stops. An entry found live is stamped with the pass number, so the next slices of the
/// same pass skip it for the price of a visit and get further; a slice that reaches the
/// end of the table ends the pass. Entries seen more recently than the shortest time any
/// flow of their protocol takes to be over are skipped without a look. So one packet
/// pays for at most a bounded number of lookups plus one walk over the table.
#[inline(always)]
pub(crate) fn sweep_now<A: Family>() -> bool {
    let t = now();
    let Some(clock) = sweep_clock::<A>() else {
        return false;
    };
    // SAFETY: a map value; two CPUs racing here at worst both run a slice.
    let pass = unsafe {
        if (*clock).swept_ns != 0 && t.saturating_sub((*clock).swept_ns) < NAT_SWEEP_INTERVAL_NS {
            return false;
        }
        (*clock).swept_ns = t;
        (*clock).entries
    };
    count(Reason::NatSweep);
    let mut c = SweepCtx {
        now: t,
        pass,
        budget: NAT_SWEEP_BUDGET,
        stopped: 0,
    };
    // SAFETY: the NAT table is a map definition (the helper takes its address as the
    // map), `sweep_one` has the callback signature and `c` outlives the call.
    unsafe {
        bpf_for_each_map_elem(
            A::nat() as *const _ as *mut c_void,
            sweep_one::<A> as *const () as *mut c_void,
            &mut c as *mut SweepCtx as *mut c_void,
            0,
        );
    }
    if c.stopped == 0 {
        // The whole table was looked at: the next slice starts a new pass (never 0,
        // which new entries carry).
        // SAFETY: as above.
        unsafe {
            (*clock).entries = match pass.wrapping_add(1) {
                0 => 1,
                n => n,
            };
        }
    }
    true
}

/// State of [`sweep`], shared with [`sweep_one`].
#[repr(C)]
struct SweepCtx {
    now: u64,
    pass: u32,
    budget: u32,
    stopped: u32,
}

/// One entry of [`sweep`]: removed with its flow's other entry when the flow is over.
#[inline(never)]
extern "C" fn sweep_one<A: Family>(
    _map: *mut c_void,
    key: *mut NatKeyOf<A>,
    value: *mut NatEntryOf<A>,
    ctx: *mut c_void,
) -> i64 {
    // Read in place, not copied: the callback's stack adds to the deepest program's
    // (uplink_ingress → host-port DNAT → sweep), which the verifier caps at 512 bytes.
    // SAFETY: the helper passes this entry's key and (writable) value and `sweep`'s
    // context; all valid for the call.
    let (k, e, c) = unsafe { (&*key, &mut *value, &mut *(ctx as *mut SweepCtx)) };
    if e.swept == c.pass {
        return 0;
    }
    // No flow is over before it has been idle this long (closed TCP: the grace time).
    let soonest = match k.proto {
        proto::TCP => NAT_CLOSED_GRACE_NS,
        proto::UDP => NAT_UDP_IDLE_NS,
        _ => NAT_ICMP_IDLE_NS,
    };
    if c.now.saturating_sub(e.last_seen_ns) < soonest {
        return 0;
    }
    if c.budget == 0 {
        c.stopped = 1;
        return 1;
    }
    c.budget -= 1;
    let proto_ = k.proto;
    let okey = opposite(e, proto_);
    // SAFETY: a map value, read at once (a removal racing us at worst misjudges one flow
    // for one pass).
    let other = unsafe { A::nat().get(okey) }.filter(|o| opposite(o, proto_) == *k);
    // [`flow_is_over`] reads its first entry as the one keyed by the outside peer (which
    // closed first decides the TIME_WAIT wait); a sweep does not know which of the two
    // that is (host-port flows are the other way round), so the flow must be over read
    // either way.
    let over = flow_is_over(e, other, proto_, c.now)
        && other.is_none_or(|o| flow_is_over(o, Some(&*e), proto_, c.now));
    if over {
        let key_copy = *k;
        if other.is_some() {
            nat_remove(&okey);
            count(Reason::NatSweptEntry);
        }
        nat_remove(&key_copy);
        count(Reason::NatSweptEntry);
    } else {
        e.swept = c.pass;
    }
    0
}

/// Counts a packet of an existing flow translated by entry kind `kind`.
#[inline(always)]
pub(crate) fn count_translated(kind: NatKind) {
    count(match kind {
        NatKind::SNAT_FWD => Reason::SnatForward,
        NatKind::SNAT_REV => Reason::SnatReply,
        NatKind::DNAT_FWD => Reason::DnatForward,
        NatKind::DNAT_REV => Reason::DnatReply,
        NatKind::SERVICE_FWD | NatKind::SERVICE_REV => return,
        _ => Reason::HairpinForward,
    });
}

#[inline(always)]
pub(crate) fn now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub(crate) fn entry<A>(
    saddr: A,
    daddr: A,
    sport: u16,
    dport: u16,
    hook: NatHook,
    kind: NatKind,
    pod: u32,
) -> NatEntryOf<A> {
    NatEntryOf {
        saddr,
        daddr,
        sport,
        dport,
        hook,
        kind,
        flags: NatFlags::empty(),
        deliver: NatDeliver::DIRECT,
        last_seen_ns: now(),
        pod,
        swept: 0,
    }
}
