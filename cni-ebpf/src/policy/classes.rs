//! From the rules that apply to one pod in one direction, in evaluation order, to its
//! rule set: the classes, the tables that give them and the tiers that rank them.
//!
//! Rules come in **runs**: consecutive rules of one tier with the same action (all of
//! NetworkPolicy's rules are one run, whose action is to admit). Within a run the first
//! match and any match decide alike, so a run is a union, and its rules that share a port
//! set share a class bit. Classes are numbered in evaluation order, run after run, so the
//! lowest class a packet matches within a tier is the run that decides there
//! (`cni_ebpf_common::tiers_admit`). A rule set holds at most 64 classes.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use cni_ebpf_common::{PolicyTiers, TIERS_DOMAINS, TIERS_NETWORK_POLICY};

use super::{
    cluster::{proto, PodView},
    cluster_network_policy::{Action, Tier},
    compile::{Dir, Port},
    tables::{
        addr_bits, canonical, peer_table, port_table, AddrSet, DomainPattern, PortPrefix, Ruleset,
        MAX_CLASSES,
    },
};

/// One rule, whatever API it came from, its peers resolved.
pub(super) struct FlatRule<'c> {
    /// The addresses its peers admit.
    pub addrs: AddrSet,
    /// Its peers that are pods (for egress named ports, resolved on each).
    pub pods: Vec<&'c PodView>,
    /// The domain names its egress peers name (`example.com`, `*.example.com`; lower
    /// case), whose addresses the pod learns from DNS answers.
    pub domains: Vec<String>,
    /// Every port of every protocol (no port listed).
    pub all_ports: bool,
    /// Numeric ports (`Port::All` and `Port::Range`).
    pub numeric: BTreeSet<Port>,
    /// Container port names, with their protocol (`None`: whichever a port of that name
    /// has).
    pub named: Vec<(Option<u8>, String)>,
}

/// What a run's rules do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunKind {
    /// A cluster policy tier's rules with one action.
    Tier(Tier, Action),
    /// NetworkPolicy's rules.
    NetworkPolicy,
}

/// What a class stands for, for `inspect` and the deny log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassOrigin {
    /// `Admin`, `NetworkPolicy` or `Baseline`.
    pub tier: String,
    /// `Accept`, `Deny`, `Pass` (NetworkPolicy's: `Accept`).
    pub action: String,
    /// The rules it stands for (`policy` or `policy/rule name`).
    pub rules: Vec<String>,
}

/// Why rule set `rs` refuses a packet with peer `peer`, `proto` and destination `port`,
/// naming the tier and the rules that decided from `origins` (what each of its classes
/// stands for); `None` if it admits it.
#[must_use]
pub fn refusal(
    rs: &Ruleset,
    origins: &[ClassOrigin],
    peer: std::net::IpAddr,
    proto: u8,
    port: u16,
) -> Option<String> {
    if rs.admits(peer, proto, port) {
        return None;
    }
    let classes = rs.classes(peer, proto, port);
    let named = |bits: u64| {
        let i = bits.trailing_zeros() as usize;
        origins.get(i).map_or_else(
            || format!("class {i}"),
            |o| format!("{} tier: {} by {}", o.tier, o.action, o.rules.join(", ")),
        )
    };
    let Some(tiers) = rs.tiers else {
        return Some("no NetworkPolicy rule admits it".to_owned());
    };
    let admin = classes & tiers.admin;
    if admin != 0 && admin & admin.wrapping_neg() & tiers.deny != 0 {
        return Some(named(admin));
    }
    if tiers.flags & TIERS_NETWORK_POLICY != 0 {
        return Some("NetworkPolicy: no rule admits it".to_owned());
    }
    let baseline = classes & tiers.baseline;
    Some(if baseline == 0 {
        "no rule admits it".to_owned()
    } else {
        named(baseline)
    })
}

/// A rule set being built, run by run.
pub(super) struct Builder<'c> {
    pod: &'c PodView,
    dir: Dir,
    classes: usize,
    sets: Vec<(u64, AddrSet)>,
    ports: Vec<(u64, PortPrefix)>,
    exact: BTreeMap<(IpAddr, u8, u16), u64>,
    domains: BTreeMap<DomainPattern, u64>,
    tiers: PolicyTiers,
    origins: Vec<ClassOrigin>,
}

impl<'c> Builder<'c> {
    pub fn new(pod: &'c PodView, dir: Dir) -> Self {
        Self {
            pod,
            dir,
            classes: 0,
            sets: Vec::new(),
            ports: Vec::new(),
            exact: BTreeMap::new(),
            domains: BTreeMap::new(),
            tiers: PolicyTiers::default(),
            origins: Vec::new(),
        }
    }

    /// A new class bit, recorded as standing for `kind`.
    fn class(&mut self, kind: RunKind) -> Result<u64, String> {
        if self.classes >= MAX_CLASSES {
            return Err(format!(
                "the policies that select {}/{} for {} need more than {MAX_CLASSES} classes \
                 (distinct port sets per run of rules with one action)",
                self.pod.namespace,
                self.pod.name,
                self.dir.as_str()
            ));
        }
        let bit = 1u64 << self.classes;
        self.classes += 1;
        let (tier, action) = match kind {
            RunKind::NetworkPolicy => {
                self.tiers.network_policy |= bit;
                ("NetworkPolicy", "Accept")
            }
            RunKind::Tier(tier, action) => {
                match tier {
                    Tier::Admin => self.tiers.admin |= bit,
                    Tier::Baseline => self.tiers.baseline |= bit,
                }
                match action {
                    Action::Accept => self.tiers.accept |= bit,
                    Action::Deny => self.tiers.deny |= bit,
                    Action::Pass => {}
                }
                (
                    tier.as_str(),
                    match action {
                        Action::Accept => "Accept",
                        Action::Deny => "Deny",
                        Action::Pass => "Pass",
                    },
                )
            }
        };
        self.origins.push(ClassOrigin {
            tier: tier.to_owned(),
            action: action.to_owned(),
            rules: Vec::new(),
        });
        Ok(bit)
    }

    /// Adds a run: `rules` (each with the name `inspect` gives it) as one union.
    pub fn run(&mut self, kind: RunKind, rules: Vec<(String, FlatRule<'c>)>) -> Result<(), String> {
        if kind == RunKind::NetworkPolicy {
            self.tiers.flags |= TIERS_NETWORK_POLICY;
        }
        let mut by_ports: BTreeMap<BTreeSet<Port>, u64> = BTreeMap::new();
        let mut named_class = None;
        for (label, rule) in rules {
            let mut numeric = rule.numeric;
            let mut named_hits = Vec::new();
            for (protocol, name) in &rule.named {
                match self.dir {
                    // The destination is the pod itself.
                    Dir::Ingress => {
                        for p in protocols(*protocol) {
                            if let Some(n) = self.pod.named_port(name, p) {
                                numeric.insert(Port::Range(p, n, n));
                            }
                        }
                    }
                    // The destination is each peer pod: one entry per pod address.
                    Dir::Egress => {
                        for peer in &rule.pods {
                            for p in protocols(*protocol) {
                                let Some(n) = peer.named_port(name, p) else {
                                    continue;
                                };
                                for ip in &*peer.ips {
                                    if rule.addrs.contains_bits(addr_bits(*ip)) {
                                        named_hits.push((canonical(*ip), p, n));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            if !named_hits.is_empty() {
                let bit = match named_class {
                    Some(b) => b,
                    None => {
                        let b = self.class(kind)?;
                        named_class = Some(b);
                        b
                    }
                };
                self.note(bit, &label);
                for hit in named_hits {
                    *self.exact.entry(hit).or_default() |= bit;
                }
            }
            if rule.all_ports {
                // Every port of every protocol: the class of the empty set stands for it.
                numeric.clear();
            } else if numeric.is_empty() {
                // Only named ports, resolved above (or to nothing).
                continue;
            }
            let bit = match by_ports.get(&numeric) {
                Some(b) => *b,
                None => {
                    let b = self.class(kind)?;
                    by_ports.insert(numeric, b);
                    b
                }
            };
            self.note(bit, &label);
            for name in &rule.domains {
                if let Some(pattern) = DomainPattern::of(name) {
                    *self.domains.entry(pattern).or_default() |= bit;
                }
            }
            self.sets.push((bit, rule.addrs));
        }
        for (set, class) in by_ports {
            if set.is_empty() {
                self.ports.push((class, PortPrefix::everything()));
            }
            for port in set {
                match port {
                    Port::All(p) => self.ports.push((class, PortPrefix::protocol(p))),
                    Port::Range(p, lo, hi) => self
                        .ports
                        .extend(PortPrefix::range(p, lo, hi).into_iter().map(|x| (class, x))),
                    Port::Named(..) => {}
                }
            }
        }
        Ok(())
    }

    fn note(&mut self, bit: u64, label: &str) {
        let i = bit.trailing_zeros() as usize;
        if let Some(o) = self.origins.get_mut(i) {
            if !o.rules.iter().any(|r| r == label) {
                o.rules.push(label.to_owned());
            }
        }
    }

    /// The rule set, with its tiers when cluster policies took part (`tiered`), and what
    /// each class stands for.
    pub fn finish(mut self, tiered: bool) -> (Ruleset, Vec<ClassOrigin>) {
        let refs: Vec<(u64, &AddrSet)> = self.sets.iter().map(|(c, s)| (*c, s)).collect();
        if !self.domains.is_empty() {
            self.tiers.flags |= TIERS_DOMAINS;
        }
        (
            Ruleset {
                peers: peer_table(&refs),
                ports: port_table(&self.ports),
                exact: self.exact,
                domains: self.domains,
                tiers: tiered.then_some(self.tiers),
            },
            self.origins,
        )
    }
}

/// The protocols a named port may be over: the one given, or any.
fn protocols(p: Option<u8>) -> Vec<u8> {
    match p {
        Some(p) => vec![p],
        None => vec![proto::TCP, proto::UDP, proto::SCTP],
    }
}
