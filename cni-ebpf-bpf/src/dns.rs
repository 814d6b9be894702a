//! Domain names in egress rules: the addresses a pod learns from the DNS answers it
//! receives.
//!
//! A rule set whose egress rules name domains has [`TIERS_DOMAINS`] in its tiers, and its
//! names in `POLICY_DOMAINS` (see `cni_ebpf_common::dns` for the hash). Every packet
//! delivered to a pod from port 53 (UDP, or TCP with one whole message in the segment,
//! after its length or alone)
//! whose egress rule set has that flag is read here, after the node's policy admitted it
//! and before it reaches the pod, so an address is in force before the application reads
//! the answer. The reading is a program of its own, `dns_answer`, tail-called by `to_pod`
//! (so its loops are verified once, not within every program that delivers into pods);
//! a program that would redirect such an answer straight into the pod hands it to the
//! pod's host veth instead ([`wants_reading`]), whose `to_pod` then reads it: the question's name is hashed from its end, one suffix at a time, and
//! looked up as an exact name and as the part after a `*.`; when a rule names it, every
//! A and AAAA record of the answer section (which also covers the end of a CNAME chain)
//! is recorded in `POLICY_LEARNED` for the pod, under the names that matched, until the
//! record's TTL (at least the rule set's floor, at most `MAX_DNS_TTL_S`) has passed.
//! [`learned_classes`] gives an egress judgement the classes of the names an address was
//! learned under.
//!
//! Nothing here opens anything by itself: a message that cannot be read (malformed,
//! truncated, a name of more than `MAX_NAME_LABELS` labels, an error answer, a question
//! no rule names) teaches nothing and is counted (`PolicyDnsUnread`); the packet is
//! delivered as the policy decided either way. Loops are bounded by constants: the
//! question's labels, the answer records (`MAX_ANSWERS`) and the labels of a record's
//! uncompressed owner name.

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::TcContext};
use cni_ebpf_common::{
    mapped4, name_hash_step, prog, proto, LearnedName, PolicyDomainKey, PolicyEndpointKey,
    PolicyLearned, PolicyLearnedKey, Reason, DOMAIN_EXACT, DOMAIN_WILDCARD, LEARNED_NAMES,
    MAX_ANSWERS, MAX_DNS_TTL_S, MAX_NAME_LABELS, NAME_HASH_START, RULESET_CLOSED, RULESET_OPEN,
    TIERS_DOMAINS,
};

use crate::{
    maps::{count, CALLS6, POLICY_DOMAINS, POLICY_ENDPOINTS, POLICY_LEARNED, POLICY_TIERS},
    parse::{read, IP6_HLEN, IP_OFF, IP_PROTO, L4_OFF, L4_OFF6},
};

/// The DNS port, wire order.
const DNS_PORT: u16 = 53u16.to_be();
/// Length of a DNS message's header.
const HEADER_LEN: u32 = 12;
/// Bytes of a question's name the datapath reads (a name's wire form is at most 255).
const NAME_BUF: usize = 256;
/// Record types and class.
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// Per-CPU room for reading one answer (kept off the verifier's stack).
#[repr(C)]
pub(crate) struct DnsScratch {
    /// The question's name, wire form.
    name: [u8; NAME_BUF],
    /// Which bytes of `name` are a label's length byte.
    starts: [u64; NAME_BUF / 64],
    /// The rule names the question matched.
    matched: [LearnedName; LEARNED_NAMES],
    /// How many of `matched` are set (in memory, so the verifier need not tell paths
    /// apart by it).
    nmatched: u32,
    domain: PolicyDomainKey,
    endpoint: PolicyEndpointKey,
    /// [`learned_classes`]' clock and result so far.
    now: u64,
    classes: u64,
    /// What `to_pod` hands the `dns_answer` program: the pod's host veth, the slot of
    /// `POLICY_ENDPOINTS` in force, and whether the packet is IPv6.
    ifindex: u32,
    slot: u32,
    ipv6: u32,
    learned_key: PolicyLearnedKey,
    learned: PolicyLearned,
}

/// Per-CPU room for reading one answer (not pinned: nothing outlives a packet).
#[map]
static DNS_SCRATCH: PerCpuArray<DnsScratch> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn scratch() -> Option<&'static mut DnsScratch> {
    let p = DNS_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot; a program runs to its end on one CPU.
    Some(unsafe { &mut *p })
}

/// Whether the packet in `ctx` may be a DNS answer: UDP or TCP from port 53, an IPv4
/// header without options or an IPv6 header without extension headers. The cheap test
/// every delivered packet meets.
#[inline(always)]
pub(crate) fn from_dns_port(ctx: &TcContext, ipv6: bool) -> bool {
    let (next, l4) = if ipv6 {
        (read::<u8>(ctx, IP_OFF + 6), L4_OFF6)
    } else {
        if read::<u8>(ctx, IP_OFF) != Ok(0x45) {
            return false;
        }
        (read::<u8>(ctx, IP_OFF + IP_PROTO), L4_OFF)
    };
    matches!(next, Ok(proto::UDP | proto::TCP)) && read::<u16>(ctx, l4) == Ok(DNS_PORT)
}

/// The egress rule set and pod of the pod behind host veth `ifindex`, in `slot` of
/// `POLICY_ENDPOINTS`, and the floor of its learned addresses' lifetime, if its rules
/// name domains.
#[inline(always)]
fn learner(s: &mut DnsScratch, ifindex: u32, slot: u32) -> Option<(u32, u64, u32)> {
    s.endpoint = PolicyEndpointKey { ifindex, slot };
    // SAFETY: copied out at once.
    let (rs, pod) = unsafe { POLICY_ENDPOINTS.get(&s.endpoint) }.map(|e| (e.egress, e.pod))?;
    if rs == RULESET_OPEN || rs == RULESET_CLOSED || pod == 0 {
        return None;
    }
    // SAFETY: read at once.
    let min_ttl = unsafe { POLICY_TIERS.get(&rs) }
        .filter(|t| t.flags & TIERS_DOMAINS != 0)
        .map(|t| t.dns_min_ttl_s)?;
    Some((rs, pod, min_ttl))
}

/// Whether a packet about to be redirected straight into the pod behind host veth
/// `ifindex` is a DNS answer its rules want read: it is then handed to the pod's host
/// veth instead, whose `to_pod` reads it ([`read_delivered`]) on its way in. A function
/// of its own, so that its locals do not grow the frames of the programs that deliver.
#[inline(never)]
pub(crate) fn wants_reading(ctx: &TcContext, ifindex: u32, ipv6: bool) -> bool {
    if !from_dns_port(ctx, ipv6) {
        return false;
    }
    let (Some(s), Some((slot, _))) = (scratch(), crate::policy::enforcing()) else {
        return false;
    };
    learner(s, ifindex, slot & 1).is_some()
}

/// `to_pod` lets a packet from port 53 into the pod behind host veth `ifindex` (`slot`
/// in force): the `dns_answer` program reads it. Returns only if that program is not
/// loaded.
#[inline(always)]
pub(crate) fn read_delivered(ctx: &TcContext, ifindex: u32, slot: u32, ipv6: bool) {
    let Some(s) = scratch() else {
        return;
    };
    s.ifindex = ifindex;
    s.slot = slot;
    s.ipv6 = u32::from(ipv6);
    // SAFETY: the slot holds a tc program of this object, which takes the same context;
    // control does not come back unless the call failed.
    unsafe { CALLS6.tail_call(ctx, prog::CALL_DNS_ANSWER) };
}

/// The `dns_answer` program: reads the DNS answer `to_pod` handed it ([`read_delivered`])
/// and records what it teaches (see the module's documentation).
#[inline(always)]
pub(crate) fn answer(ctx: &TcContext) {
    let Some(s) = scratch() else {
        return;
    };
    let (ifindex, slot, ipv6) = (s.ifindex, s.slot, s.ipv6 != 0);
    let Some((rs, pod, min_ttl)) = learner(s, ifindex, slot) else {
        return;
    };
    if read_answer(ctx, s, rs, pod, min_ttl, ipv6).is_err() {
        count(Reason::PolicyDnsUnread);
    }
}

/// Where the DNS message in `ctx` starts and ends (packet offsets).
#[inline(always)]
fn message(ctx: &TcContext, ipv6: bool) -> Result<(u32, u32), ()> {
    let (l4, ip_end, next) = if ipv6 {
        let payload = u16::from_be(read::<u16>(ctx, IP_OFF + 4)?);
        (
            L4_OFF6 as u32,
            (IP_OFF + IP6_HLEN) as u32 + u32::from(payload),
            read::<u8>(ctx, IP_OFF + 6)?,
        )
    } else {
        let total = u16::from_be(read::<u16>(ctx, IP_OFF + 2)?);
        (
            L4_OFF as u32,
            IP_OFF as u32 + u32::from(total),
            read::<u8>(ctx, IP_OFF + IP_PROTO)?,
        )
    };
    if next == proto::UDP {
        let len = u16::from_be(read::<u16>(ctx, l4 as usize + 4)?);
        let end = l4 + u32::from(len);
        return if end <= ip_end {
            Ok((l4 + 8, end))
        } else {
            Err(())
        };
    }
    // TCP: one whole message in this segment, after its 2-byte length, or alone (a
    // server that writes the length apart sends it in the segment before).
    let doff = u32::from(read::<u8>(ctx, l4 as usize + 12)? >> 4) * 4;
    let start = l4 + doff;
    if doff < 20 || start + HEADER_LEN > ip_end {
        return Err(());
    }
    let len = u16::from_be(read::<u16>(ctx, start as usize)?);
    if start + 2 + u32::from(len) == ip_end {
        return Ok((start + 2, ip_end));
    }
    Ok((start, ip_end))
}

/// Reads the answer (see [`learn`]) for the pod `pod` whose egress rule set is `rs`.
/// `Err`: nothing could be learned from it.
#[inline(always)]
fn read_answer(
    ctx: &TcContext,
    s: &mut DnsScratch,
    rs: u32,
    pod: u64,
    min_ttl: u32,
    ipv6: bool,
) -> Result<(), ()> {
    let (start, end) = message(ctx, ipv6)?;
    let header: [u16; 6] = ctx.load(start as usize).map_err(|_| ())?;
    let flags = u16::from_be(header[1]);
    // A response (QR), a standard query (opcode 0), no error (RCODE 0), one question.
    if flags & 0x8000 == 0 || flags & 0x7800 != 0 || flags & 0x000f != 0 {
        return Err(());
    }
    if u16::from_be(header[2]) != 1 {
        return Err(());
    }
    let answers = u32::from(u16::from_be(header[3]));
    let qname = start + HEADER_LEN;
    let name_len = question_name(ctx, s, qname, end)?;
    match_names(s, rs, name_len - 1)?;
    // After the name: the question's type and class.
    let mut off = qname + name_len + 4;
    s.learned_key.pod = pod;
    for i in 0..MAX_ANSWERS {
        if i >= answers || off >= end {
            break;
        }
        off = skip_name(ctx, off)?;
        let rr: [u16; 5] = ctx.load(off as usize).map_err(|_| ())?;
        off += 10;
        let (ty, class, rdlen) = (
            u16::from_be(rr[0]),
            u16::from_be(rr[1]),
            u32::from(u16::from_be(rr[4])),
        );
        let ttl = (u32::from(u16::from_be(rr[2])) << 16) | u32::from(u16::from_be(rr[3]));
        if off + rdlen > end {
            return Err(());
        }
        if class == CLASS_IN && ty == TYPE_A && rdlen == 4 {
            let a: u32 = ctx.load(off as usize).map_err(|_| ())?;
            s.learned_key.addr = mapped4(a);
            remember(s, ttl, min_ttl);
        } else if class == CLASS_IN && ty == TYPE_AAAA && rdlen == 16 {
            s.learned_key.addr = ctx.load(off as usize).map_err(|_| ())?;
            remember(s, ttl, min_ttl);
        }
        off += rdlen;
    }
    Ok(())
}

/// Copies the question's name (at packet offset `at`, the message ending at `end`) into
/// the scratch area and marks its labels' length bytes. Returns the name's length with
/// its final zero byte. `Err` for a name that runs past the message, a compression
/// pointer (never in a question) or more than `MAX_NAME_LABELS` labels.
#[inline(always)]
fn question_name(ctx: &TcContext, s: &mut DnsScratch, at: u32, end: u32) -> Result<u32, ()> {
    if at >= end {
        return Err(());
    }
    let avail = (end - at).min(NAME_BUF as u32);
    // 1..=256, in a form the verifier bounds.
    let len = ((avail.wrapping_sub(1)) & 0xff) + 1;
    // SAFETY: at most `NAME_BUF` bytes into the scratch buffer.
    let ret = unsafe {
        aya_ebpf::helpers::bpf_skb_load_bytes(
            ctx.skb.skb as *const _,
            at,
            s.name.as_mut_ptr().cast(),
            len,
        )
    };
    if ret != 0 {
        return Err(());
    }
    s.starts = [0; NAME_BUF / 64];
    let mut i: u32 = 0;
    for _ in 0..=MAX_NAME_LABELS {
        if i >= len {
            return Err(());
        }
        let l = u32::from(s.name[(i & 0xff) as usize]);
        if l == 0 {
            return Ok(i + 1);
        }
        if l > 63 {
            return Err(());
        }
        s.starts[((i >> 6) & 3) as usize] |= 1 << (i & 63);
        i += 1 + l;
    }
    Err(())
}

/// Hashes the question's name in the scratch area from its end (`zero`: the position of
/// its zero byte) and looks each suffix up for rule set `rs`: the whole name as an exact
/// name, each shorter suffix starting at a label as the part after a `*.`. The names a
/// rule names are kept in `matched`. `Err` when none is.
#[inline(always)]
fn match_names(s: &mut DnsScratch, rs: u32, zero: u32) -> Result<(), ()> {
    s.nmatched = 0;
    let mut h = NAME_HASH_START;
    for k in 0..NAME_BUF as u32 {
        if k >= zero {
            break;
        }
        let i = zero - 1 - k;
        h = name_hash_step(h, s.name[(i & 0xff) as usize]);
        if s.starts[((i >> 6) & 3) as usize] & (1 << (i & 63)) == 0 {
            continue;
        }
        s.domain = PolicyDomainKey {
            ruleset: rs,
            kind: if i == 0 {
                DOMAIN_EXACT
            } else {
                DOMAIN_WILDCARD
            },
            hash: h,
        };
        // SAFETY: presence only.
        if unsafe { POLICY_DOMAINS.get(&s.domain) }.is_none() {
            continue;
        }
        let n = s.nmatched;
        if n < LEARNED_NAMES as u32 {
            s.matched[n as usize] = LearnedName {
                hash: h,
                expires_ns: 0,
                kind: s.domain.kind,
                _pad: 0,
            };
            s.nmatched = n + 1;
        }
    }
    if s.nmatched == 0 {
        Err(())
    } else {
        Ok(())
    }
}

/// The offset past the name at `off`: a compression pointer (2 bytes), or labels ending
/// with a zero byte or a pointer.
#[inline(always)]
fn skip_name(ctx: &TcContext, mut off: u32) -> Result<u32, ()> {
    for _ in 0..=MAX_NAME_LABELS {
        let l: u8 = ctx.load(off as usize).map_err(|_| ())?;
        if l == 0 {
            return Ok(off + 1);
        }
        if l & 0xc0 == 0xc0 {
            return Ok(off + 2);
        }
        if l > 63 {
            return Err(());
        }
        off += 1 + u32::from(l);
    }
    Err(())
}

/// Records the address in `learned_key` under the names in `matched`, for `ttl` seconds
/// (at least `min_ttl`, at most `MAX_DNS_TTL_S`): a name it already has is renewed, a new
/// one takes a free or expired slot, else the slot that expires first.
#[inline(always)]
fn remember(s: &mut DnsScratch, ttl: u32, min_ttl: u32) {
    // SAFETY: a helper without arguments.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    let expires = now + u64::from(ttl.max(min_ttl).min(MAX_DNS_TTL_S)) * 1_000_000_000;
    let v = match POLICY_LEARNED.get_ptr_mut(&s.learned_key) {
        Some(v) => v,
        None => {
            s.learned = PolicyLearned::default();
            if POLICY_LEARNED
                .insert(&s.learned_key, &s.learned, 0)
                .is_err()
            {
                return;
            }
            let Some(v) = POLICY_LEARNED.get_ptr_mut(&s.learned_key) else {
                return;
            };
            v
        }
    };
    // SAFETY: an LRU value another CPU may write at the same time: at worst a name is
    // learned again by the next answer.
    let names = unsafe { &mut (*v).names };
    for m in 0..LEARNED_NAMES {
        if m as u32 >= s.nmatched {
            break;
        }
        let want = s.matched[m];
        let mut slot = 0;
        let mut soonest = u64::MAX;
        for (j, n) in names.iter().enumerate() {
            if n.hash == want.hash && n.kind == want.kind {
                slot = j;
                break;
            }
            let at = if n.hash == 0 || n.expires_ns <= now {
                0
            } else {
                n.expires_ns
            };
            if at < soonest {
                soonest = at;
                slot = j;
            }
        }
        names[slot & (LEARNED_NAMES - 1)] = LearnedName {
            expires_ns: expires,
            ..want
        };
    }
    count(Reason::PolicyDnsLearned);
}

/// The classes egress rule set `rs` gives the address its pod learned (the judgement's
/// `learned` key): those of the rule names it was learned under that have not expired;
/// none if the rule set names no domain. A function of its own, with a small frame: it
/// runs under the deepest frames of the programs that judge.
#[inline(never)]
pub(crate) fn learned_classes(rs: u32) -> u64 {
    // SAFETY: read at once.
    if !unsafe { POLICY_TIERS.get(&rs) }.is_some_and(|t| t.flags & TIERS_DOMAINS != 0) {
        return 0;
    }
    let (Some(s), Some(judging)) = (scratch(), crate::policy::scratch()) else {
        return 0;
    };
    let Some(learned) = POLICY_LEARNED.get_ptr(&judging.learned) else {
        return 0;
    };
    // What the loop carries lives in the scratch area, not in spilled registers.
    // SAFETY: a helper without arguments.
    s.now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    s.classes = 0;
    s.domain.ruleset = rs;
    for j in 0..LEARNED_NAMES {
        // SAFETY: an LRU value, read field by field (nothing copied to the stack).
        let n = unsafe { &(*learned).names[j] };
        if n.hash == 0 || n.expires_ns <= s.now {
            continue;
        }
        s.domain.kind = n.kind;
        s.domain.hash = n.hash;
        // SAFETY: copied out at once.
        s.classes |= unsafe { POLICY_DOMAINS.get(&s.domain) }
            .copied()
            .unwrap_or(0);
    }
    s.classes
}
