//! From NetworkPolicy objects and the cluster view to each pod's rule sets.
//!
//! The semantics are the API reference's (`networking.k8s.io/v1`):
//! - a policy selects the pods of its own namespace that its `podSelector` matches (the
//!   empty selector: all of them), for the directions of its `policyTypes` (absent:
//!   `Ingress`, and `Egress` too when it has egress rules);
//! - a pod that no policy selects for a direction is open in that direction; one that
//!   some do admits what any of their rules admits (the union);
//! - a rule admits a peer that one of its peers matches (none listed: every peer) on a
//!   port that one of its ports matches (none listed: every port of every protocol);
//! - a peer is a pod selector (pods of the policy's namespace), a namespace selector (all
//!   pods of those namespaces), both (those pods of those namespaces), or an `ipBlock`
//!   (addresses in `cidr` but in none of `except`);
//! - a port is a protocol (TCP when absent) with every port, one port, a range up to
//!   `endPort`, or a container port name, resolved on the destination: the selected pod
//!   for ingress, each peer pod for egress.
//!
//! A policy this cannot represent (a malformed selector, CIDR or port, more port sets
//! than a rule set holds) closes the pods it selects in its directions: security fails
//! closed.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnet::IpNet;
use k8s_openapi::{
    api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{
    cluster::{protocol_number, Cluster, PodView},
    selector::Selector,
    tables::{peer_table, port_table, AddrSet, PortPrefix, Prefix, Ruleset, MAX_CLASSES},
};

/// A direction of traffic as seen from the pod a policy selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dir {
    /// Traffic to the pod.
    Ingress,
    /// Traffic from the pod.
    Egress,
}

impl Dir {
    /// `ingress` or `egress`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }
}

/// A policy, parsed and checked.
#[derive(Debug, Clone)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    selector: Selector,
    /// Rules per direction the policy applies to (absent: it does not apply).
    ingress: Option<Vec<Rule>>,
    egress: Option<Vec<Rule>>,
}

#[derive(Debug, Clone)]
struct Rule {
    /// Empty: every peer.
    peers: Vec<Peer>,
    /// Empty: every port of every protocol.
    ports: Vec<Port>,
}

#[derive(Debug, Clone)]
enum Peer {
    /// Pods matching `pods` in the namespaces matching `namespaces` (`None`: the
    /// policy's own namespace).
    Pods {
        namespaces: Option<Selector>,
        pods: Selector,
    },
    Block(AddrSet),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Port {
    /// Every port of the protocol.
    All(u8),
    /// `lo..=hi` of the protocol.
    Range(u8, u16, u16),
    /// A container port name of the protocol.
    Named(u8, String),
}

impl Policy {
    /// Parses an API object; a field the datapath cannot represent is an error naming
    /// it (the API server validates the same fields, so this is a policy it would have
    /// refused, or one of a newer API).
    pub fn parse(np: &NetworkPolicy) -> Result<Self, String> {
        let namespace = np.metadata.namespace.clone().unwrap_or_default();
        let name = np.metadata.name.clone().unwrap_or_default();
        let spec = np.spec.as_ref();
        let selector = match spec {
            Some(s) => s
                .pod_selector
                .as_ref()
                .map(Selector::parse)
                .transpose()
                .map_err(|e| format!("podSelector: {e}"))?
                .unwrap_or_else(Selector::everything),
            None => Selector::everything(),
        };
        let egress_rules = spec.and_then(|s| s.egress.as_ref());
        let types: Vec<&str> = match spec.and_then(|s| s.policy_types.as_ref()) {
            Some(t) if !t.is_empty() => t.iter().map(String::as_str).collect(),
            _ if egress_rules.is_some_and(|e| !e.is_empty()) => vec!["Ingress", "Egress"],
            _ => vec!["Ingress"],
        };
        let mut ingress = None;
        let mut egress = None;
        for t in types {
            match t {
                "Ingress" => {
                    let rules = spec.and_then(|s| s.ingress.as_ref());
                    ingress = Some(parse_rules(
                        rules
                            .into_iter()
                            .flatten()
                            .map(|r| (r.from.as_deref(), r.ports.as_deref())),
                        "ingress",
                    )?);
                }
                "Egress" => {
                    egress = Some(parse_rules(
                        egress_rules
                            .into_iter()
                            .flatten()
                            .map(|r| (r.to.as_deref(), r.ports.as_deref())),
                        "egress",
                    )?);
                }
                other => return Err(format!("policyTypes: unknown type {other:?}")),
            }
        }
        Ok(Self {
            namespace,
            name,
            selector,
            ingress,
            egress,
        })
    }

    /// Whether the policy selects `pod` for `dir`.
    #[must_use]
    pub fn selects(&self, pod: &PodView, dir: Dir) -> bool {
        *pod.namespace == *self.namespace
            && !pod.host_network
            && self.rules(dir).is_some()
            && self.selector.matches(&pod.labels)
    }

    fn rules(&self, dir: Dir) -> Option<&Vec<Rule>> {
        match dir {
            Dir::Ingress => self.ingress.as_ref(),
            Dir::Egress => self.egress.as_ref(),
        }
    }
}

fn parse_rules<'a>(
    rules: impl Iterator<
        Item = (
            Option<&'a [NetworkPolicyPeer]>,
            Option<&'a [NetworkPolicyPort]>,
        ),
    >,
    what: &str,
) -> Result<Vec<Rule>, String> {
    rules
        .enumerate()
        .map(|(i, (peers, ports))| {
            let peers = peers
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(j, p)| parse_peer(p).map_err(|e| format!("{what}[{i}].peers[{j}]: {e}")))
                .collect::<Result<_, _>>()?;
            let ports = ports
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(j, p)| parse_port(p).map_err(|e| format!("{what}[{i}].ports[{j}]: {e}")))
                .collect::<Result<_, _>>()?;
            Ok(Rule { peers, ports })
        })
        .collect()
}

fn parse_peer(p: &NetworkPolicyPeer) -> Result<Peer, String> {
    if let Some(b) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err("ipBlock cannot be combined with a selector".to_owned());
        }
        let cidr: IpNet = b
            .cidr
            .parse()
            .map_err(|_| format!("ipBlock.cidr {:?} is not a CIDR", b.cidr))?;
        let except = b
            .except
            .iter()
            .flatten()
            .map(|e| {
                e.parse::<IpNet>()
                    .map(|n| Prefix::of_net(&n))
                    .map_err(|_| format!("ipBlock.except {e:?} is not a CIDR"))
            })
            .collect::<Result<_, _>>()?;
        return Ok(Peer::Block(AddrSet {
            blocks: ipv6_block_without_ipv4(cidr, except).into_iter().collect(),
        }));
    }
    let namespaces = p
        .namespace_selector
        .as_ref()
        .map(Selector::parse)
        .transpose()
        .map_err(|e| format!("namespaceSelector: {e}"))?;
    let pods = match &p.pod_selector {
        Some(s) => Selector::parse(s).map_err(|e| format!("podSelector: {e}"))?,
        None if namespaces.is_some() => Selector::everything(),
        None => return Err("a peer needs podSelector, namespaceSelector or ipBlock".to_owned()),
    };
    Ok(Peer::Pods { namespaces, pods })
}

/// The block `cidr` less `except`, as the tables hold it. IPv4 addresses are kept
/// IPv4-mapped, so an IPv6 block that covers the mapped range (`::/0`, `::/64`, …) is
/// kept without it (an IPv6 block never admits an IPv4 peer), and one inside it admits
/// nothing.
fn ipv6_block_without_ipv4(cidr: IpNet, mut except: Vec<Prefix>) -> Option<(Prefix, Vec<Prefix>)> {
    let block = Prefix::of_net(&cidr);
    if let IpNet::V6(_) = cidr {
        let mapped = Prefix::ipv4_mapped();
        if mapped.covers(&block) {
            return None;
        }
        if block.covers(&mapped) {
            except.push(mapped);
        }
    }
    Some((block, except))
}

fn parse_port(p: &NetworkPolicyPort) -> Result<Port, String> {
    let proto = protocol_number(p.protocol.as_deref())
        .ok_or_else(|| format!("protocol {:?} is not TCP, UDP or SCTP", p.protocol))?;
    let number = |n: i32| {
        u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("port {n} is not in 1-65535"))
    };
    match (&p.port, p.end_port) {
        (None, None) => Ok(Port::All(proto)),
        (None, Some(_)) => Err("endPort needs a port".to_owned()),
        (Some(IntOrString::Int(n)), end) => {
            let lo = number(*n)?;
            let hi = match end {
                Some(e) => number(e)?,
                None => lo,
            };
            if hi < lo {
                return Err(format!("endPort {hi} is below port {lo}"));
            }
            Ok(Port::Range(proto, lo, hi))
        }
        (Some(IntOrString::String(_)), Some(_)) => {
            Err("endPort needs a numeric port, not a name".to_owned())
        }
        (Some(IntOrString::String(name)), None) => Ok(Port::Named(proto, name.clone())),
    }
}

/// What a pod gets in one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdicts {
    /// No policy selects it for this direction: everything passes.
    Open,
    /// Only what the rule set admits passes.
    Enforced(Ruleset),
    /// Nothing passes: a policy that selects it cannot be represented (the reason).
    Closed(String),
}

/// One pod's compiled policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPolicy {
    pub ingress: Verdicts,
    pub egress: Verdicts,
    /// The policies that select it (`namespace/name`), per direction.
    pub ingress_policies: Vec<String>,
    pub egress_policies: Vec<String>,
}

/// Parses every policy; the ones that fail come back with their error, so that the pods
/// they would select can be closed.
#[must_use]
pub fn parse_all(policies: &[NetworkPolicy]) -> (Vec<Policy>, Vec<BrokenPolicy>) {
    let mut ok = Vec::new();
    let mut broken = Vec::new();
    for np in policies {
        match Policy::parse(np) {
            Ok(p) => ok.push(p),
            Err(error) => broken.push(BrokenPolicy {
                namespace: np.metadata.namespace.clone().unwrap_or_default(),
                name: np.metadata.name.clone().unwrap_or_default(),
                selector: np
                    .spec
                    .as_ref()
                    .map(|s| match &s.pod_selector {
                        Some(sel) => Selector::parse(sel).ok(),
                        None => Some(Selector::everything()),
                    })
                    .unwrap_or_else(|| Some(Selector::everything())),
                error,
            }),
        }
    }
    (ok, broken)
}

/// A policy that cannot be represented.
#[derive(Debug, Clone)]
pub struct BrokenPolicy {
    pub namespace: String,
    pub name: String,
    /// Its pod selector, if that much parsed (else it closes every pod of its namespace).
    selector: Option<Selector>,
    pub error: String,
}

impl BrokenPolicy {
    fn selects(&self, pod: &PodView) -> bool {
        *pod.namespace == *self.namespace
            && !pod.host_network
            && self
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(&pod.labels))
    }
}

/// Compiles the policy of `pod` for both directions.
#[must_use]
pub fn compile_pod(
    cluster: &Cluster,
    policies: &[Policy],
    broken: &[BrokenPolicy],
    pod: &PodView,
) -> PodPolicy {
    let (ingress, ingress_policies) = compile_dir(cluster, policies, broken, pod, Dir::Ingress);
    let (egress, egress_policies) = compile_dir(cluster, policies, broken, pod, Dir::Egress);
    PodPolicy {
        ingress,
        egress,
        ingress_policies,
        egress_policies,
    }
}

fn compile_dir(
    cluster: &Cluster,
    policies: &[Policy],
    broken: &[BrokenPolicy],
    pod: &PodView,
    dir: Dir,
) -> (Verdicts, Vec<String>) {
    let selecting: Vec<&Policy> = policies.iter().filter(|p| p.selects(pod, dir)).collect();
    let mut names: Vec<String> = selecting
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    if let Some(b) = broken.iter().find(|b| b.selects(pod)) {
        names.push(format!("{}/{}", b.namespace, b.name));
        return (
            Verdicts::Closed(format!("policy {}/{}: {}", b.namespace, b.name, b.error)),
            names,
        );
    }
    if selecting.is_empty() {
        return (Verdicts::Open, names);
    }
    let rules = selecting
        .iter()
        .flat_map(|p| p.rules(dir).into_iter().flatten().map(move |r| (*p, r)));
    match ruleset(cluster, pod, dir, rules) {
        Ok(rs) => (Verdicts::Enforced(rs), names),
        Err(e) => (Verdicts::Closed(e), names),
    }
}

/// The addresses a rule's peers admit, and, when `with_pods` (an egress rule with named
/// ports, resolved on each peer pod), the pods among them. Pod selectors are looked up in
/// the namespaces they name, not among every pod of the cluster.
fn peer_set<'c>(
    cluster: &'c Cluster,
    policy: &Policy,
    rule: &Rule,
    with_pods: bool,
) -> (AddrSet, Vec<&'c PodView>) {
    if rule.peers.is_empty() {
        let pods = if with_pods {
            cluster.pods().filter(|p| p.is_peer()).collect()
        } else {
            Vec::new()
        };
        return (
            AddrSet {
                blocks: vec![(Prefix::everything(), Vec::new())],
            },
            pods,
        );
    }
    let mut blocks = Vec::new();
    let mut pods: Vec<&PodView> = Vec::new();
    for peer in &rule.peers {
        match peer {
            Peer::Block(set) => {
                blocks.extend(set.blocks.iter().cloned());
                if with_pods {
                    pods.extend(cluster.pods().filter(|p| {
                        p.is_peer()
                            && p.ips
                                .iter()
                                .any(|ip| set.contains_bits(super::tables::addr_bits(*ip)))
                    }));
                }
            }
            Peer::Pods {
                namespaces,
                pods: sel,
            } => {
                let names: Vec<&str> = match namespaces {
                    None => vec![policy.namespace.as_str()],
                    Some(ns) => cluster
                        .namespaces()
                        .filter(|(_, labels)| ns.matches(*labels))
                        .map(|(name, _)| name)
                        .collect(),
                };
                for name in names {
                    for p in cluster.pods_in(name).filter(|p| p.is_peer()) {
                        if sel.matches(&p.labels) {
                            blocks.extend(p.ips.iter().map(|ip| (Prefix::host(*ip), Vec::new())));
                            if with_pods {
                                pods.push(p);
                            }
                        }
                    }
                }
            }
        }
    }
    (AddrSet { blocks }, pods)
}

fn ruleset<'a>(
    cluster: &Cluster,
    pod: &PodView,
    dir: Dir,
    rules: impl Iterator<Item = (&'a Policy, &'a Rule)>,
) -> Result<Ruleset, String> {
    // Port sets (numeric, resolved) → class bit.
    let mut classes: BTreeMap<BTreeSet<Port>, u64> = BTreeMap::new();
    let mut sets: Vec<(u64, AddrSet)> = Vec::new();
    let mut exact = BTreeSet::new();
    for (policy, rule) in rules {
        let named = rule.ports.iter().any(|p| matches!(p, Port::Named(..)));
        let (addrs, peer_pods) = peer_set(cluster, policy, rule, named && dir == Dir::Egress);
        let mut numeric = BTreeSet::new();
        for port in &rule.ports {
            match port {
                Port::Named(proto, name) => match dir {
                    // The destination is the pod itself.
                    Dir::Ingress => {
                        if let Some(n) = pod.named_port(name, *proto) {
                            numeric.insert(Port::Range(*proto, n, n));
                        }
                    }
                    // The destination is each peer pod: one entry per pod address.
                    Dir::Egress => {
                        for peer in &peer_pods {
                            if let Some(n) = peer.named_port(name, *proto) {
                                for ip in &peer.ips {
                                    if addrs.contains_bits(super::tables::addr_bits(*ip)) {
                                        exact.insert((*ip, *proto, n));
                                    }
                                }
                            }
                        }
                    }
                },
                other => {
                    numeric.insert(other.clone());
                }
            }
        }
        if rule.ports.is_empty() {
            // Every port of every protocol: the class of the empty set stands for it.
            numeric.clear();
        } else if numeric.is_empty() {
            // Only named ports, resolved above (or to nothing).
            continue;
        }
        let next = 1u64.checked_shl(classes.len() as u32).unwrap_or(0);
        let class = *classes.entry(numeric).or_insert(next);
        if class == 0 || classes.len() > MAX_CLASSES {
            return Err(format!(
                "the policies that select {}/{} for {dir:?} have more than {MAX_CLASSES} \
                 different port sets",
                pod.namespace, pod.name
            ));
        }
        sets.push((class, addrs));
    }
    let mut ports = Vec::new();
    for (set, class) in &classes {
        if set.is_empty() {
            ports.push((*class, PortPrefix::everything()));
        }
        for port in set {
            match port {
                Port::All(proto) => ports.push((*class, PortPrefix::protocol(*proto))),
                Port::Range(proto, lo, hi) => ports.extend(
                    PortPrefix::range(*proto, *lo, *hi)
                        .into_iter()
                        .map(|p| (*class, p)),
                ),
                Port::Named(..) => {}
            }
        }
    }
    let refs: Vec<(u64, &AddrSet)> = sets.iter().map(|(c, s)| (*c, s)).collect();
    Ok(Ruleset {
        peers: peer_table(&refs),
        ports: port_table(&ports),
        exact: exact
            .into_iter()
            .map(|(ip, proto, port): (IpAddr, u8, u16)| (super::tables::canonical(ip), proto, port))
            .collect(),
    })
}
