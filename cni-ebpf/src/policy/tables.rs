//! The form a compiled rule set takes in the datapath, and its lookup.
//!
//! A rule set is the union of the rules that apply to one pod in one direction. Each
//! rule admits a set of peers (addresses) on a set of ports. Rules that share a port
//! set share a **class** (one bit of a `u64`), and the rule set becomes three tables:
//!
//! - **peers**: address prefixes → the classes whose rules admit the addresses of that
//!   prefix that no longer prefix of the table covers. Read by longest-prefix match, so
//!   an `ipBlock.except` is a longer prefix with fewer classes, and a pod is a /32 or
//!   /128 with the classes of every rule that selects it.
//! - **ports**: prefixes of the 24-bit string `protocol · port` → the classes that admit
//!   them (all protocols: length 0; one protocol, every port: 8; one port: 24; an
//!   `endPort` range: the aligned blocks that cover it).
//! - **exact**: (address, protocol, port) → the classes whose egress rules' named ports
//!   name it (a named port means a different number on each destination pod).
//! - **domains**: domain names egress rules name → their classes; an address the pod
//!   learned from a DNS answer for such a name (in the datapath) is a peer of them.
//!
//! A packet matches the classes `(peers(addr) | learned(pod, addr)) & ports(proto, port)
//! | exact(addr, proto, port)`. With NetworkPolicy alone any class admits it; when cluster policies take part,
//! the rule set's **tiers** ([`PolicyTiers`]) rank the classes (`tiers_admit`): four
//! lookups, however many policies, rules and tiers there are (with domain names, an
//! egress judgement adds one for the learned address and one per name it was learned
//! under, at most `LEARNED_NAMES`). IPv4 addresses are kept as
//! IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`), so one table serves both families.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use cni_ebpf_common::{name_hash, tiers_admit, PolicyTiers, DOMAIN_EXACT, DOMAIN_WILDCARD};
use ipnet::IpNet;

/// How many port classes one rule set can hold (the bits of a class mask).
pub const MAX_CLASSES: usize = 64;

/// An address prefix, IPv4 mapped into IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    /// The address bits (host bits zero).
    pub addr: u128,
    /// Prefix length, 0..=128.
    pub len: u8,
}

const V4_MAPPED: u128 = 0xffff << 32;

/// `addr` as a 128-bit value (IPv4 mapped into IPv6).
#[must_use]
pub fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => V4_MAPPED | u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

impl Prefix {
    /// The prefix of `bits` of length `len`.
    #[must_use]
    pub fn new(bits: u128, len: u8) -> Self {
        Self {
            addr: bits & mask128(len),
            len: len.min(128),
        }
    }

    /// The prefix a network covers (IPv4 networks mapped).
    #[must_use]
    pub fn of_net(net: &IpNet) -> Self {
        match net {
            IpNet::V4(n) => Self::new(addr_bits(IpAddr::V4(n.network())), 96 + n.prefix_len()),
            IpNet::V6(n) => Self::new(addr_bits(IpAddr::V6(n.network())), n.prefix_len()),
        }
    }

    /// The host prefix of one address.
    #[must_use]
    pub fn host(addr: IpAddr) -> Self {
        Self::new(addr_bits(addr), 128)
    }

    /// The IPv4-mapped range `::ffff:0:0/96`, where the tables keep IPv4 addresses.
    #[must_use]
    pub fn ipv4_mapped() -> Self {
        Self::new(V4_MAPPED, 96)
    }

    /// Every address (both families).
    #[must_use]
    pub fn everything() -> Self {
        Self::new(0, 0)
    }

    /// Whether `bits` lies in this prefix.
    #[must_use]
    pub fn contains_bits(&self, bits: u128) -> bool {
        bits & mask128(self.len) == self.addr
    }

    /// Whether `other` lies wholly in this prefix.
    #[must_use]
    pub fn covers(&self, other: &Prefix) -> bool {
        self.len <= other.len && self.contains_bits(other.addr)
    }
}

/// A prefix of the 24-bit string `protocol (8 bits) · port (16 bits)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortPrefix {
    /// The bits, right-aligned in 24 (the bits past `len` zero).
    pub bits: u32,
    /// Prefix length, 0..=24.
    pub len: u8,
}

impl PortPrefix {
    /// The prefix of length `len` (0..=24) of `bits` (the bits past it dropped).
    #[must_use]
    pub fn from_bits(bits: u32, len: u8) -> Self {
        Self::new(bits, len)
    }

    fn new(bits: u32, len: u8) -> Self {
        let len = len.min(24);
        let mask = if len == 0 {
            0
        } else {
            (0xff_ffff_u32 << (24 - u32::from(len))) & 0xff_ffff
        };
        Self {
            bits: bits & mask,
            len,
        }
    }

    /// Every protocol and port.
    #[must_use]
    pub fn everything() -> Self {
        Self::new(0, 0)
    }

    /// Every port of `proto` (and any other packet of that protocol, portless or not).
    #[must_use]
    pub fn protocol(proto: u8) -> Self {
        Self::new(u32::from(proto) << 16, 8)
    }

    /// The aligned blocks that cover `lo..=hi` of `proto`.
    #[must_use]
    pub fn range(proto: u8, lo: u16, hi: u16) -> Vec<Self> {
        let mut out = Vec::new();
        let (mut lo, hi) = (u32::from(lo), u32::from(hi));
        while lo <= hi {
            // The largest aligned block starting at `lo` that ends by `hi`.
            let mut size = if lo == 0 {
                1 << 16
            } else {
                lo & lo.wrapping_neg()
            };
            while lo + size - 1 > hi {
                size >>= 1;
            }
            let len = 24 - size.trailing_zeros() as u8;
            out.push(Self::new((u32::from(proto) << 16) | lo, len));
            lo += size;
        }
        out
    }

    fn contains_bits(&self, bits: u32) -> bool {
        Self::new(bits, self.len).bits == self.bits
    }

    fn covers(&self, other: &PortPrefix) -> bool {
        self.len <= other.len && self.contains_bits(other.bits)
    }

    /// The lookup key of a packet.
    #[must_use]
    pub fn key(proto: u8, port: u16) -> u32 {
        (u32::from(proto) << 16) | u32::from(port)
    }
}

/// One pod's rules for one direction, as the datapath holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ruleset {
    /// Longest-prefix-match table of peers → class mask.
    pub peers: BTreeMap<Prefix, u64>,
    /// Longest-prefix-match table of `protocol · port` → class mask.
    pub ports: BTreeMap<PortPrefix, u64>,
    /// (peer address, protocol, port) → the classes whose named ports name it.
    pub exact: BTreeMap<(IpAddr, u8, u16), u64>,
    /// Domain names egress rules name → their classes (the addresses are learned in the
    /// datapath from the DNS answers the pod receives).
    pub domains: BTreeMap<DomainPattern, u64>,
    /// How the classes decide when cluster policies take part (`None`: any class
    /// admits).
    pub tiers: Option<PolicyTiers>,
}

impl Ruleset {
    /// Whether a packet with peer `addr`, `proto` and (destination) `port` is admitted:
    /// the datapath's lookups.
    #[must_use]
    pub fn admits(&self, addr: IpAddr, proto: u8, port: u16) -> bool {
        let classes = self.classes(addr, proto, port);
        match &self.tiers {
            None => classes != 0,
            Some(tiers) => tiers_admit(classes, tiers),
        }
    }

    /// The classes a packet with peer `addr`, `proto` and (destination) `port` matches.
    #[must_use]
    pub fn classes(&self, addr: IpAddr, proto: u8, port: u16) -> u64 {
        let bits = addr_bits(addr);
        let peer = self
            .peers
            .iter()
            .filter(|(p, _)| p.contains_bits(bits))
            .max_by_key(|(p, _)| p.len)
            .map_or(0, |(_, m)| *m);
        let key = PortPrefix::key(proto, port);
        let ports = self
            .ports
            .iter()
            .filter(|(p, _)| p.contains_bits(key))
            .max_by_key(|(p, _)| p.len)
            .map_or(0, |(_, m)| *m);
        peer & ports
            | self
                .exact
                .get(&(canonical(addr), proto, port))
                .copied()
                .unwrap_or(0)
    }

    /// Entries in all three tables.
    #[must_use]
    pub fn entries(&self) -> usize {
        self.peers.len()
            + self.ports.len()
            + self.exact.len()
            + self.domains.len()
            + usize::from(self.tiers.is_some())
    }
}

/// A domain name of an egress rule as the datapath matches it: the hash of the name, or of
/// the part after `*.` (`cni_ebpf_common::dns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainPattern {
    /// `DOMAIN_EXACT` or `DOMAIN_WILDCARD`.
    pub kind: u32,
    /// `name_hash` of the name (of a wildcard: of the part after `*.`).
    pub hash: u64,
}

impl DomainPattern {
    /// The pattern of a name as `cluster_network_policy::domain_name` gives it;
    /// `None` for a name that is not one.
    #[must_use]
    pub fn of(name: &str) -> Option<Self> {
        let (kind, body) = match name.strip_prefix("*.") {
            Some(rest) => (DOMAIN_WILDCARD, rest),
            None => (DOMAIN_EXACT, name),
        };
        Some(Self {
            kind,
            hash: name_hash(body)?,
        })
    }
}

/// IPv4-mapped IPv6 addresses as IPv4, so both spellings of an address meet.
#[must_use]
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        IpAddr::V4(_) => addr,
    }
}

/// A set of addresses: prefixes it includes, each less the prefixes excepted from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrSet {
    /// (included prefix, prefixes excepted from it).
    pub blocks: Vec<(Prefix, Vec<Prefix>)>,
}

impl AddrSet {
    /// Whether `bits` is in the set.
    #[must_use]
    pub fn contains_bits(&self, bits: u128) -> bool {
        self.blocks
            .iter()
            .any(|(p, ex)| p.contains_bits(bits) && !ex.iter().any(|e| e.contains_bits(bits)))
    }
}

/// Builds the peers table from each class's address sets: every prefix that any set
/// names (included or excepted) gets the classes whose sets contain the addresses it
/// alone covers. Those addresses are all in or all out of each set: prefixes are nested
/// or disjoint, so the set's prefixes that contain one of them are exactly those that
/// contain the whole prefix.
#[must_use]
pub fn peer_table(sets: &[(u64, &AddrSet)]) -> BTreeMap<Prefix, u64> {
    // prefix → (class, block index, is an exception)
    let mut named: BTreeMap<Prefix, Vec<(u64, usize, usize, bool)>> = BTreeMap::new();
    for (si, (class, set)) in sets.iter().enumerate() {
        for (bi, (p, ex)) in set.blocks.iter().enumerate() {
            named.entry(*p).or_default().push((*class, si, bi, false));
            for e in ex {
                named.entry(*e).or_default().push((*class, si, bi, true));
            }
        }
    }
    let mut table = BTreeMap::new();
    for p in named.keys() {
        // The set's prefixes that contain `p`: its ancestors in `named`, `p` included.
        let mut included: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut excepted: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut classes: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        for len in 0..=p.len {
            let Some(refs) = named.get(&Prefix::new(p.addr, len)) else {
                continue;
            };
            for (class, si, bi, except) in refs {
                if *except {
                    excepted.insert((*si, *bi));
                } else {
                    included.insert((*si, *bi));
                    classes.insert((*si, *bi), *class);
                }
            }
        }
        let mask = included
            .difference(&excepted)
            .filter_map(|b| classes.get(b))
            .fold(0, |m, c| m | c);
        table.insert(*p, mask);
    }
    table
}

/// Builds the ports table: each prefix gets the classes of every prefix that covers it.
#[must_use]
pub fn port_table(entries: &[(u64, PortPrefix)]) -> BTreeMap<PortPrefix, u64> {
    let prefixes: BTreeSet<PortPrefix> = entries.iter().map(|(_, p)| *p).collect();
    prefixes
        .iter()
        .map(|p| {
            let mask = entries
                .iter()
                .filter(|(_, q)| q.covers(p))
                .fold(0, |m, (c, _)| m | c);
            (*p, mask)
        })
        .collect()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn ranges_split_into_aligned_blocks() {
        let blocks = PortPrefix::range(6, 80, 81);
        assert_eq!(blocks, vec![PortPrefix::new((6 << 16) | 80, 23)]);
        let blocks = PortPrefix::range(6, 79, 82);
        assert_eq!(blocks.len(), 3);
        let all = PortPrefix::range(17, 0, 65535);
        assert_eq!(all, vec![PortPrefix::protocol(17)]);
        for (lo, hi) in [(1, 65535), (1000, 2000), (5, 5), (65535, 65535), (0, 3)] {
            let blocks = PortPrefix::range(6, lo, hi);
            for port in 0..=65535u16 {
                let key = PortPrefix::key(6, port);
                let n = blocks.iter().filter(|b| b.contains_bits(key)).count();
                assert_eq!(
                    n,
                    usize::from((lo..=hi).contains(&port)),
                    "{lo}-{hi} port {port}"
                );
            }
        }
    }

    #[test]
    fn excepts_punch_holes_that_longer_includes_fill() {
        let net = |s: &str| Prefix::of_net(&s.parse().unwrap());
        let a = AddrSet {
            blocks: vec![(net("10.0.0.0/8"), vec![net("10.1.0.0/16")])],
        };
        let b = AddrSet {
            blocks: vec![(net("10.1.2.3/32"), vec![])],
        };
        let table = peer_table(&[(1, &a), (2, &b)]);
        let rs = Ruleset {
            peers: table,
            ports: port_table(&[(1, PortPrefix::everything()), (2, PortPrefix::everything())]),
            exact: BTreeMap::new(),
            domains: BTreeMap::new(),
            tiers: None,
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(rs.admits(ip("10.2.0.1"), 6, 80));
        assert!(!rs.admits(ip("10.1.0.1"), 6, 80));
        assert!(rs.admits(ip("10.1.2.3"), 6, 80));
        assert!(!rs.admits(ip("11.0.0.1"), 6, 80));
        assert!(!rs.admits(ip("::ffff:11.0.0.1"), 6, 80));
        assert!(rs.admits(ip("::ffff:10.2.0.1"), 6, 80));
    }
}
