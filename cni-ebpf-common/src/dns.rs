//! Domain names in egress rules (`ClusterNetworkPolicy` `domainNames`): the keys the agent
//! writes for a rule set's names, the addresses a pod learned from the DNS answers it
//! received, and the hash both sides compute over a name.
//!
//! A name is matched by hash. [`name_hash`] folds the name's wire form (length-prefixed
//! labels) from its last byte to its first, lowercased; its value after a label's length
//! byte is the hash of the suffix starting at that label. So one pass over a name from the
//! end gives the hashes of every suffix: the whole name is looked up as an exact name
//! ([`DOMAIN_EXACT`]), each shorter suffix as the part after a `*.` ([`DOMAIN_WILDCARD`]:
//! a wildcard matches one or more whole labels).

use core::mem::size_of;

/// Capacity of [`crate::map::POLICY_DOMAINS`] (names of every rule set of the node).
pub const MAX_POLICY_DOMAINS: u32 = 65_536;
/// Capacity of [`crate::map::POLICY_LEARNED`] (an LRU of (pod, address) pairs).
pub const MAX_POLICY_LEARNED: u32 = 65_536;
/// The names one learned address remembers for its pod (the most recently learned win).
pub const LEARNED_NAMES: usize = 4;
/// Labels of a name the datapath reads; an answer about a longer name teaches nothing.
pub const MAX_NAME_LABELS: u32 = 32;
/// Answer records of one DNS message the datapath reads.
pub const MAX_ANSWERS: u32 = 16;
/// The default floor of a learned address's lifetime, in seconds: an answer with a
/// shorter TTL is kept this long (resolvers and runtimes cache answers for a while past
/// their TTL; the agent's `--dns-min-ttl` sets it).
pub const DEFAULT_DNS_MIN_TTL_S: u32 = 30;
/// The longest a learned address is kept, in seconds, whatever the answer's TTL.
pub const MAX_DNS_TTL_S: u32 = 86_400;

/// [`PolicyDomainKey::kind`]: the name itself.
pub const DOMAIN_EXACT: u32 = 0;
/// [`PolicyDomainKey::kind`]: the part after `*.`; matches names with one or more labels
/// before it.
pub const DOMAIN_WILDCARD: u32 = 1;

/// Key of [`crate::map::POLICY_DOMAINS`] (the value: the classes of the rules that name
/// it).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyDomainKey {
    /// Rule set id, native order.
    pub ruleset: u32,
    /// [`DOMAIN_EXACT`] or [`DOMAIN_WILDCARD`], native order.
    pub kind: u32,
    /// [`name_hash`] of the name (of a wildcard: of the part after `*.`), native order.
    pub hash: u64,
}
const _: () = assert!(size_of::<PolicyDomainKey>() == 16);

/// Key of [`crate::map::POLICY_LEARNED`]: an address a pod learned.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyLearnedKey {
    /// The pod ([`crate::PolicyEndpoint::pod`]), native order: every interface and family
    /// of the pod shares what it learned.
    pub pod: u64,
    /// The address, IPv6 or IPv4-mapped IPv6, wire order.
    pub addr: [u8; 16],
}
const _: () = assert!(size_of::<PolicyLearnedKey>() == 24);

/// A name a learned address was an answer for.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LearnedName {
    /// The [`PolicyDomainKey::hash`] of the rule's name it matched (0: unused slot),
    /// native order.
    pub hash: u64,
    /// When it expires, `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`), native order.
    pub expires_ns: u64,
    /// [`PolicyDomainKey::kind`] of the rule's name, native order.
    pub kind: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<LearnedName>() == 24);

/// Value of [`crate::map::POLICY_LEARNED`]: the rule names the address was learned under.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyLearned {
    pub names: [LearnedName; LEARNED_NAMES],
}
const _: () = assert!(size_of::<PolicyLearned>() == 24 * LEARNED_NAMES);

const HASH_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const HASH_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The hash of nothing: where [`name_hash_step`] starts.
pub const NAME_HASH_START: u64 = HASH_OFFSET;

/// Folds one byte of a name's wire form into `h` (ASCII letters lowercased: names match
/// without regard to case).
#[inline(always)]
#[must_use]
pub fn name_hash_step(h: u64, byte: u8) -> u64 {
    let b = if byte.is_ascii_uppercase() {
        byte | 0x20
    } else {
        byte
    };
    (h ^ u64::from(b)).wrapping_mul(HASH_PRIME)
}

/// The hash of a dotted name (`example.com`, no `*.`, no trailing dot): its wire form
/// (`\x07example\x03com`) folded from the last byte to the first. `None` for a name
/// with an empty label or a label longer than 63 bytes.
#[must_use]
pub fn name_hash(name: &str) -> Option<u64> {
    let mut h = NAME_HASH_START;
    for label in name.rsplit('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| (1..=63).contains(l))?;
        for b in label.bytes().rev() {
            h = name_hash_step(h, b);
        }
        h = name_hash_step(h, len);
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::{name_hash, name_hash_step, NAME_HASH_START};

    /// The hash of a wire-form name folded from the end, as the datapath folds it.
    fn wire_hash(wire: &[u8]) -> u64 {
        wire.iter()
            .rev()
            .fold(NAME_HASH_START, |h, b| name_hash_step(h, *b))
    }

    #[test]
    fn a_suffix_hash_is_the_fold_up_to_its_label() {
        let wire = b"\x03www\x07example\x03com";
        assert_eq!(name_hash("www.example.com"), Some(wire_hash(wire)));
        assert_eq!(name_hash("example.com"), Some(wire_hash(&wire[4..])));
        assert_eq!(name_hash("com"), Some(wire_hash(&wire[12..])));
        assert_eq!(name_hash("WWW.Example.COM"), name_hash("www.example.com"));
        assert_ne!(name_hash("example.co"), name_hash("example.com"));
        // Label boundaries are part of the name.
        assert_ne!(name_hash("ab.c"), name_hash("a.bc"));
        assert_eq!(name_hash("a..b"), None);
        assert_eq!(name_hash(&"a".repeat(64)), None);
    }
}
