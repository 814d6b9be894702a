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

use std::collections::BTreeSet;

use ipnet::IpNet;
use k8s_openapi::{
    api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{
    classes::{Builder, ClassOrigin, FlatRule, RunKind},
    cluster::{protocol_number, Cluster, PodView},
    cluster_network_policy::{
        Action, BrokenClusterPolicy, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, Tier,
    },
    selector::Selector,
    tables::{AddrSet, Prefix, Ruleset},
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
pub enum Port {
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
            blocks: block_of(cidr, except).into_iter().collect(),
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
pub(super) fn block_of(cidr: IpNet, mut except: Vec<Prefix>) -> Option<(Prefix, Vec<Prefix>)> {
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
    /// What each class of its rule sets stands for, per direction.
    pub ingress_classes: Vec<ClassOrigin>,
    pub egress_classes: Vec<ClassOrigin>,
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

/// Every policy that can apply to a pod: NetworkPolicies and cluster policies, checked,
/// and those that could not be (which close the pods they would select).
#[derive(Debug, Clone, Copy, Default)]
pub struct Policies<'a> {
    pub network: &'a [Policy],
    pub broken: &'a [BrokenPolicy],
    /// In evaluation order ([`super::cluster_network_policy::parse_all`]).
    pub cluster: &'a [ClusterPolicy],
    pub broken_cluster: &'a [BrokenClusterPolicy],
}

/// Compiles the NetworkPolicy of `pod` for both directions.
#[must_use]
pub fn compile_pod(
    cluster: &Cluster,
    policies: &[Policy],
    broken: &[BrokenPolicy],
    pod: &PodView,
) -> PodPolicy {
    compile(
        cluster,
        &Policies {
            network: policies,
            broken,
            ..Policies::default()
        },
        pod,
    )
}

/// Compiles every policy of `pod` (cluster policies' tiers and NetworkPolicy) for both
/// directions.
#[must_use]
pub fn compile(cluster: &Cluster, policies: &Policies<'_>, pod: &PodView) -> PodPolicy {
    let (ingress, ingress_policies, ingress_classes) =
        compile_dir(cluster, policies, pod, Dir::Ingress);
    let (egress, egress_policies, egress_classes) =
        compile_dir(cluster, policies, pod, Dir::Egress);
    PodPolicy {
        ingress,
        egress,
        ingress_policies,
        egress_policies,
        ingress_classes,
        egress_classes,
    }
}

fn compile_dir(
    cluster: &Cluster,
    policies: &Policies<'_>,
    pod: &PodView,
    dir: Dir,
) -> (Verdicts, Vec<String>, Vec<ClassOrigin>) {
    let selecting: Vec<&Policy> = policies
        .network
        .iter()
        .filter(|p| p.selects(pod, dir))
        .collect();
    let tiered: Vec<&ClusterPolicy> = policies
        .cluster
        .iter()
        .filter(|p| p.selects(cluster, pod) && !p.rules(dir).is_empty())
        .collect();
    let mut names: Vec<String> = tiered
        .iter()
        .map(|p| format!("clusternetworkpolicy/{}", p.name))
        .chain(
            selecting
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name)),
        )
        .collect();
    if let Some(b) = policies
        .broken_cluster
        .iter()
        .find(|b| b.selects(cluster, pod, dir))
    {
        names.push(format!("clusternetworkpolicy/{}", b.name));
        return (
            Verdicts::Closed(format!("cluster policy {}: {}", b.name, b.error)),
            names,
            Vec::new(),
        );
    }
    if let Some(b) = policies.broken.iter().find(|b| b.selects(pod)) {
        names.push(format!("{}/{}", b.namespace, b.name));
        return (
            Verdicts::Closed(format!("policy {}/{}: {}", b.namespace, b.name, b.error)),
            names,
            Vec::new(),
        );
    }
    if selecting.is_empty() && tiered.is_empty() {
        return (Verdicts::Open, names, Vec::new());
    }
    match ruleset(cluster, pod, dir, &selecting, &tiered) {
        Ok((rs, origins)) => (Verdicts::Enforced(rs), names, origins),
        Err(e) => (Verdicts::Closed(e), names, Vec::new()),
    }
}

/// The rule set of `pod` for `dir`: the Admin tier's runs, NetworkPolicy's, the Baseline
/// tier's.
fn ruleset(
    cluster: &Cluster,
    pod: &PodView,
    dir: Dir,
    network: &[&Policy],
    tiered: &[&ClusterPolicy],
) -> Result<(Ruleset, Vec<ClassOrigin>), String> {
    let mut b = Builder::new(pod, dir);
    tier_runs(&mut b, cluster, dir, tiered, Tier::Admin)?;
    if !network.is_empty() {
        let rules = network
            .iter()
            .flat_map(|p| p.rules(dir).into_iter().flatten().map(move |r| (*p, r)))
            .map(|(p, r)| {
                let label = format!("{}/{}", p.namespace, p.name);
                (label, network_rule(cluster, p, r, dir))
            })
            .collect();
        b.run(RunKind::NetworkPolicy, rules)?;
    }
    tier_runs(&mut b, cluster, dir, tiered, Tier::Baseline)?;
    Ok(b.finish(!tiered.is_empty()))
}

/// The runs of one tier's rules that apply to the pod: consecutive rules with one action.
fn tier_runs<'c>(
    b: &mut Builder<'c>,
    cluster: &'c Cluster,
    dir: Dir,
    tiered: &[&'c ClusterPolicy],
    tier: Tier,
) -> Result<(), String> {
    let mut run: Vec<(String, FlatRule<'c>)> = Vec::new();
    let mut action = None;
    for p in tiered.iter().filter(|p| p.tier == tier) {
        for r in p.rules(dir) {
            let Some((a, rule)) = cluster_rule(cluster, r, dir) else {
                continue;
            };
            if action.is_some_and(|x| x != a) {
                b.run(
                    RunKind::Tier(tier, action.unwrap_or(a)),
                    std::mem::take(&mut run),
                )?;
            }
            action = Some(a);
            let label = if r.name.is_empty() {
                p.name.clone()
            } else {
                format!("{}/{}", p.name, r.name)
            };
            run.push((label, rule));
        }
    }
    if let Some(a) = action {
        b.run(RunKind::Tier(tier, a), run)?;
    }
    Ok(())
}

/// One cluster policy rule with its peers resolved, and the action it takes; `None` for
/// an `Accept` rule that fails closed (it matches nothing). A `Deny` or `Pass` rule that
/// fails closed denies everything.
fn cluster_rule<'c>(
    cluster: &'c Cluster,
    r: &ClusterRule,
    dir: Dir,
) -> Option<(Action, FlatRule<'c>)> {
    if r.fails_closed() {
        return match r.action {
            Action::Accept => None,
            Action::Deny | Action::Pass => Some((
                Action::Deny,
                FlatRule {
                    addrs: AddrSet {
                        blocks: vec![(Prefix::everything(), Vec::new())],
                    },
                    pods: Vec::new(),
                    domains: Vec::new(),
                    all_ports: true,
                    numeric: BTreeSet::new(),
                    named: Vec::new(),
                },
            )),
        };
    }
    let named: Vec<(Option<u8>, String)> = r
        .ports
        .iter()
        .filter_map(|p| match p {
            ClusterPort::Named(n) => Some((None, n.clone())),
            _ => None,
        })
        .collect();
    let with_pods = !named.is_empty() && dir == Dir::Egress;
    let mut blocks = Vec::new();
    let mut pods: Vec<&PodView> = Vec::new();
    let mut domains = Vec::new();
    for peer in &r.peers {
        match peer {
            ClusterPeer::Pods {
                namespaces,
                pods: sel,
            } => {
                for p in cluster.peers_matching(cluster.namespaces_matching(namespaces), sel) {
                    blocks.extend(p.ips.iter().map(|ip| (Prefix::host(*ip), Vec::new())));
                    if with_pods {
                        pods.push(p);
                    }
                }
            }
            ClusterPeer::Nodes(sel) => {
                for (_, node) in cluster.nodes().filter(|(_, n)| sel.matches(&n.labels)) {
                    blocks.extend(node.ips.iter().map(|ip| (Prefix::host(*ip), Vec::new())));
                }
            }
            ClusterPeer::Networks(set) => {
                blocks.extend(set.blocks.iter().cloned());
                // A named port is the destination pod's, whichever peer names the pod.
                if with_pods {
                    pods.extend(cluster.peers_in(set));
                }
            }
            // The addresses are learned from the DNS answers the pod receives.
            ClusterPeer::DomainNames(names) => domains.extend(names.iter().cloned()),
            ClusterPeer::Unknown => {}
        }
    }
    let numeric: BTreeSet<Port> = r
        .ports
        .iter()
        .filter_map(|p| match p {
            ClusterPort::Numeric(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    Some((
        r.action,
        FlatRule {
            addrs: AddrSet { blocks },
            pods,
            domains,
            all_ports: r.ports.is_empty(),
            numeric,
            named,
        },
    ))
}

/// One NetworkPolicy rule with its peers resolved.
fn network_rule<'c>(cluster: &'c Cluster, policy: &Policy, rule: &Rule, dir: Dir) -> FlatRule<'c> {
    let named: Vec<(Option<u8>, String)> = rule
        .ports
        .iter()
        .filter_map(|p| match p {
            Port::Named(proto, name) => Some((Some(*proto), name.clone())),
            _ => None,
        })
        .collect();
    let (addrs, pods) = peer_set(
        cluster,
        policy,
        rule,
        !named.is_empty() && dir == Dir::Egress,
    );
    FlatRule {
        addrs,
        pods,
        domains: Vec::new(),
        all_ports: rule.ports.is_empty(),
        numeric: rule
            .ports
            .iter()
            .filter(|p| !matches!(p, Port::Named(..)))
            .cloned()
            .collect(),
        named,
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
                    pods.extend(cluster.peers_in(set));
                }
            }
            Peer::Pods {
                namespaces,
                pods: sel,
            } => {
                let names: Vec<&str> = match namespaces {
                    None => vec![policy.namespace.as_str()],
                    Some(ns) => cluster.namespaces_matching(ns).collect(),
                };
                for p in cluster.peers_matching(names, sel) {
                    blocks.extend(p.ips.iter().map(|ip| (Prefix::host(*ip), Vec::new())));
                    if with_pods {
                        pods.push(p);
                    }
                }
            }
        }
    }
    (AddrSet { blocks }, pods)
}
