//! Map types of NetworkPolicy enforcement (see `cni-ebpf/src/policy/tables.rs` for how a
//! rule set becomes these tables, and `cni-ebpf-bpf/src/policy.rs` for the lookups).

use core::mem::size_of;

/// Capacity of [`crate::map::POLICY_ENDPOINTS`]: two slots per pod interface.
pub const MAX_POLICY_ENDPOINTS: u32 = 2 * crate::MAX_ENDPOINTS;
/// Capacity of [`crate::map::POLICY_PEERS`] (prefixes of every rule set of the node).
pub const MAX_POLICY_PEERS: u32 = 262_144;
/// Capacity of [`crate::map::POLICY_PORTS`].
pub const MAX_POLICY_PORTS: u32 = 65_536;
/// Capacity of [`crate::map::POLICY_EXACT`] (egress named ports, per destination pod).
pub const MAX_POLICY_EXACT: u32 = 65_536;
/// Capacity of [`crate::map::POLICY_NAMESPACES`].
pub const MAX_POLICY_NAMESPACES: u32 = 16_384;
/// Capacity of [`crate::map::POLICY_FLOWS`] (an LRU of admitted flows).
pub const MAX_POLICY_FLOWS: u32 = 131_072;
/// Capacity of [`crate::map::POLICY_TIERS`] (one entry per rule set that cluster
/// policies take part in).
pub const MAX_POLICY_TIERS: u32 = 65_536;

/// [`PolicyEndpoint::ingress`] / [`PolicyEndpoint::egress`]: no policy selects the pod
/// for that direction, so everything passes.
pub const RULESET_OPEN: u32 = 0;
/// [`PolicyEndpoint::ingress`] / [`PolicyEndpoint::egress`]: nothing passes (but the
/// node's own traffic): a pod whose policy is not in force yet, or cannot be.
pub const RULESET_CLOSED: u32 = u32::MAX;

/// Key of [`crate::map::POLICY_ENDPOINTS`]: one pod interface in one of the two slots
/// (the slot in force is [`PolicyState::slot`]; the agent writes the other, then swaps).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyEndpointKey {
    /// Host veth ifindex, native order.
    pub ifindex: u32,
    /// 0 or 1, native order.
    pub slot: u32,
}
const _: () = assert!(size_of::<PolicyEndpointKey>() == 8);

/// Value of [`crate::map::POLICY_ENDPOINTS`]: the rule set of each direction.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyEndpoint {
    /// Rule set of traffic to the pod (native order): [`RULESET_OPEN`],
    /// [`RULESET_CLOSED`] or an id of the rule tables.
    pub ingress: u32,
    /// Rule set of traffic from the pod, as `ingress`.
    pub egress: u32,
    /// The attachment the entry was written for ([`crate::owner_id`], native order):
    /// an entry whose owner is not the one of the pod's `ENDPOINTS` entry is stale (the
    /// interface index was reused) and counts as closed.
    pub owner: u64,
    /// The pod ([`crate::fnv1a64`] of `namespace/name` as the runtime named it in
    /// `CNI_ARGS`; 0: unnamed), native order: how the agent finds a pod's interface.
    pub pod: u64,
}
const _: () = assert!(size_of::<PolicyEndpoint>() == 24);

/// Value of [`crate::map::POLICY_STATE`] (index 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyState {
    /// The slot of [`crate::map::POLICY_ENDPOINTS`] in force (0 or 1), native order.
    pub slot: u32,
    /// Bumped on every swap (native order): flows admitted under another generation are
    /// judged again.
    pub generation: u32,
}
const _: () = assert!(size_of::<PolicyState>() == 8);

/// Data of a [`crate::map::POLICY_PEERS`] key (an LPM trie; prefix length = 32 +
/// address bits, so the rule set is always matched whole).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyPeerKey {
    /// Rule set id, native order.
    pub ruleset: u32,
    /// The peer's address, IPv6 or IPv4-mapped IPv6 (`::ffff:a.b.c.d`), wire order.
    pub addr: [u8; 16],
}
const _: () = assert!(size_of::<PolicyPeerKey>() == 20);

/// Data of a [`crate::map::POLICY_PORTS`] key (an LPM trie; prefix length = 32 + 0..=24
/// bits of `proto · port`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyPortKey {
    /// Rule set id, native order.
    pub ruleset: u32,
    /// IP protocol number.
    pub proto: u8,
    /// Destination port, wire order (big-endian bytes, so a prefix is a port range).
    pub port: [u8; 2],
    /// Explicit padding, always zero (never within a prefix).
    pub _pad: u8,
}
const _: () = assert!(size_of::<PolicyPortKey>() == 8);

/// Key of [`crate::map::POLICY_EXACT`]: a destination an egress rule's named port names
/// (the value: the classes of the rules that name it).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyExactKey {
    /// Rule set id, native order.
    pub ruleset: u32,
    /// Destination address as in [`PolicyPeerKey::addr`].
    pub addr: [u8; 16],
    /// Destination port, wire order.
    pub port: [u8; 2],
    /// IP protocol number.
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<PolicyExactKey>() == 24);

/// Key of [`crate::map::POLICY_FLOWS`]: a flow as its first packet carried it (IPv4
/// addresses mapped into IPv6, so both families share the table).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyFlowKey {
    /// Source address, wire order.
    pub saddr: [u8; 16],
    /// Destination address, wire order.
    pub daddr: [u8; 16],
    /// Source port (ICMP echo: the identifier), wire order.
    pub sport: u16,
    /// Destination port (ICMP echo: the identifier), wire order.
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<PolicyFlowKey>() == 40);

/// Value of [`crate::map::POLICY_FLOWS`]: a flow the node's policy admitted.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyFlow {
    /// [`PolicyState::generation`] it was admitted under, native order.
    pub generation: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<PolicyFlow>() == 8);

/// Value of [`crate::map::POLICY_TIERS`], keyed by rule set id: how the classes of a rule
/// set that cluster policies (`ClusterNetworkPolicy`) take part in decide, tier by tier.
/// The classes are numbered in the order of evaluation: the Admin tier's rules first (by
/// priority, then as written), then NetworkPolicy's, then the Baseline tier's, so the
/// lowest class a packet matches within a tier is the rule that decides there. A rule set
/// without an entry is NetworkPolicy's alone: any class admits.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyTiers {
    /// The Admin tier's classes, native order.
    pub admin: u64,
    /// NetworkPolicy's classes (they all accept).
    pub network_policy: u64,
    /// The Baseline tier's classes.
    pub baseline: u64,
    /// The classes whose rules accept (of the Admin and Baseline tiers; a class of either
    /// tier in neither `accept` nor `deny` passes to the next tier).
    pub accept: u64,
    /// The classes whose rules deny.
    pub deny: u64,
    /// [`TIERS_NETWORK_POLICY`]: a NetworkPolicy selects the pod in this direction, so
    /// its tier decides whatever reaches it. [`TIERS_DOMAINS`]: rules name domains.
    pub flags: u32,
    /// With [`TIERS_DOMAINS`]: the floor of a learned address's lifetime, seconds
    /// (native order); else zero.
    pub dns_min_ttl_s: u32,
}
const _: () = assert!(size_of::<PolicyTiers>() == 48);

/// [`PolicyTiers::flags`]: a NetworkPolicy selects the pod in the rule set's direction.
pub const TIERS_NETWORK_POLICY: u32 = 1;
/// [`PolicyTiers::flags`]: egress rules of the rule set name domains
/// ([`crate::map::POLICY_DOMAINS`]): the DNS answers its pod receives are read, and the
/// addresses it learned from them ([`crate::map::POLICY_LEARNED`]) are its peers too.
pub const TIERS_DOMAINS: u32 = 2;

/// Whether a packet matching `classes` of a rule set is admitted, as `tiers` ranks them
/// (see [`PolicyTiers`]): the Admin tier's first matching rule accepts or denies, or
/// passes; then NetworkPolicy decides if one selects the pod (admitted when one of its
/// classes matches); then the Baseline tier's first matching rule; then the packet is
/// admitted. The datapath and userspace both decide with this.
#[must_use]
#[inline(always)]
pub fn tiers_admit(classes: u64, tiers: &PolicyTiers) -> bool {
    tiers_decide(classes, tiers).0
}

/// [`tiers_admit`], and the class whose rule decided: the first matching class of the
/// Admin or Baseline tier that accepted or denied, or [`NO_CLASS`] when NetworkPolicy
/// decided or nothing matched.
#[must_use]
#[inline(always)]
pub fn tiers_decide(classes: u64, tiers: &PolicyTiers) -> (bool, u32) {
    let admin = classes & tiers.admin;
    if admin != 0 {
        let first = admin & admin.wrapping_neg();
        if first & tiers.accept != 0 {
            return (true, first.trailing_zeros());
        }
        if first & tiers.deny != 0 {
            return (false, first.trailing_zeros());
        }
    }
    if tiers.flags & TIERS_NETWORK_POLICY != 0 {
        return (classes & tiers.network_policy != 0, NO_CLASS);
    }
    let baseline = classes & tiers.baseline;
    if baseline != 0 {
        let first = baseline & baseline.wrapping_neg();
        if first & tiers.deny != 0 {
            return (false, first.trailing_zeros());
        }
        if first & tiers.accept != 0 {
            return (true, first.trailing_zeros());
        }
    }
    (true, NO_CLASS)
}

/// [`tiers_decide`]: no cluster policy rule decided.
pub const NO_CLASS: u32 = 64;

/// Capacity of [`crate::map::POLICY_CLASS_COUNTS`] (an LRU).
pub const MAX_POLICY_CLASS_COUNTS: u32 = 65_536;

/// Key of [`crate::map::POLICY_CLASS_COUNTS`]: a cluster policy rule's class of a rule
/// set, in one direction.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyClassKey {
    /// Rule set id, native order.
    pub ruleset: u32,
    /// The class (0..64).
    pub class: u8,
    /// 1: the rule set judged a pod's egress; 0: its ingress.
    pub egress: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<PolicyClassKey>() == 8);

/// Value of [`crate::map::POLICY_CLASS_COUNTS`] (per CPU): the verdicts a cluster policy
/// rule's class decided, native order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyClassCounts {
    /// Flows it admitted (counted once per flow, on its first packet).
    pub admitted: u64,
    /// Packets it refused.
    pub denied: u64,
}
const _: () = assert!(size_of::<PolicyClassCounts>() == 16);

/// Slots of each CPU's ring in [`crate::map::POLICY_DENIES`]: the latest refused packets
/// a CPU judged, the oldest overwritten first.
pub const POLICY_DENY_SLOTS: u32 = 256;
/// Capacity of [`crate::map::POLICY_COUNTS`] (an LRU, one entry per pod interface).
pub const MAX_POLICY_COUNTS: u32 = crate::MAX_ENDPOINTS;

/// Value of [`crate::map::POLICY_DENIES`]: one packet the node's policy refused.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyDeny {
    /// Position in its CPU's ring, from 1 (0: the slot was never written), native order.
    pub seq: u64,
    /// When, in `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`), native order.
    pub time_ns: u64,
    /// The packet's tuple (an ICMP error's: the flow it quotes, reversed).
    pub flow: PolicyFlowKey,
    /// The rule set that refused it: an id of the rule tables, or [`RULESET_CLOSED`].
    pub ruleset: u32,
    /// Host veth ifindex of the pod whose rule set refused it, native order.
    pub ifindex: u32,
    /// 1: the pod's egress refused it (the pod sent it); 0: its ingress.
    pub egress: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 7],
}
const _: () = assert!(size_of::<PolicyDeny>() == 72);

/// Value of [`crate::map::POLICY_COUNTS`] (per CPU), keyed by a pod's host veth ifindex:
/// the node policy's verdicts at that pod, native order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    /// Flows its ingress rules admitted (counted once per flow, on its first packet).
    pub ingress_admitted: u64,
    /// Packets its ingress rules refused.
    pub ingress_denied: u64,
    /// Flows its egress rules admitted.
    pub egress_admitted: u64,
    /// Packets its egress rules refused.
    pub egress_denied: u64,
}
const _: () = assert!(size_of::<PolicyCounts>() == 32);

/// The IPv4-mapped IPv6 form of a wire-order IPv4 address (as the eBPF side reads it:
/// the wire bytes as a native `u32`).
#[must_use]
pub fn mapped4(addr: u32) -> [u8; 16] {
    let b = addr.to_ne_bytes();
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, b[0], b[1], b[2], b[3],
    ]
}

/// The IPv4 address (network-order `u32`) inside an IPv4-mapped address, if `a` is one
/// ([`mapped4`] undone).
#[must_use]
#[inline(always)]
pub fn unmapped4(a: &[u8; 16]) -> Option<u32> {
    let mapped = a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff;
    mapped.then(|| u32::from_ne_bytes([a[12], a[13], a[14], a[15]]))
}

/// An IPv6 address as the programs hold it (four network-order words) in wire order.
#[must_use]
#[inline(always)]
pub fn bytes6(a: &crate::Addr6) -> [u8; 16] {
    let mut out = [0u8; 16];
    for i in 0..4 {
        let w = a[i].to_ne_bytes();
        out[4 * i] = w[0];
        out[4 * i + 1] = w[1];
        out[4 * i + 2] = w[2];
        out[4 * i + 3] = w[3];
    }
    out
}

/// [`bytes6`] undone.
#[must_use]
#[inline(always)]
pub fn addr6(b: &[u8; 16]) -> crate::Addr6 {
    [
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
    ]
}
