//! What the NetworkPolicy API reference says a set of policies allows.
//!
//! Written from the API reference (`networking.k8s.io/v1`, NetworkPolicy: the field
//! comments of `k8s.io/api/networking/v1/types.go` and the "Network Policies" concept
//! page) alone, not from the plugin's compiler or datapath, so that both can be checked
//! against it. Everything is a linear scan over the objects; nothing is cached.
//!
//! The semantics, point by point:
//!
//! - An address belongs to a pod if it is one of the pod's `status.podIPs` (or
//!   `status.podIP`), and only pods that are running, have an address and are not on the
//!   host network count. Every other address (including a host-network pod's, which is
//!   its node's) is *outside*: only `ipBlock` peers match it, and it is never isolated.
//! - A connection is allowed iff egress from the source is allowed (when the source is a
//!   pod) and ingress to the destination is allowed (when the destination is a pod): "For
//!   a network flow between two pods to be allowed, both the egress policy on the source
//!   pod and the ingress policy on the destination pod need to allow the traffic."
//! - A pod is isolated in a direction iff some policy of its namespace selects it
//!   (`spec.podSelector`, absent or empty = every pod of the namespace) and has that
//!   direction in its effective `policyTypes`. Unset (or empty) `policyTypes` defaults to
//!   `Ingress`, plus `Egress` if the policy has at least one egress rule. A direction that
//!   is not isolated allows everything.
//! - An isolated direction allows a connection iff some rule of that direction, of some
//!   policy that selects the pod and has the direction in its `policyTypes`, matches it:
//!   a peer matches (`from`/`to` absent or empty = every peer, outside addresses
//!   included) and a port matches (`ports` absent or empty = every port and protocol).
//! - A peer: `podSelector` alone = those pods of the policy's namespace;
//!   `namespaceSelector` alone = every pod of those namespaces; both = those pods in
//!   those namespaces; `ipBlock` = addresses in `cidr` and in none of `except`, of the
//!   same family, whether or not they are a pod's.
//! - A port: `protocol` (default `TCP`) must be the connection's; `port` absent = every
//!   port; a number = that port, or `port..=endPort` with `endPort`; a name (any string,
//!   also all digits) = the `containerPort` of the *destination* pod's container port of
//!   that name and protocol (the policy's own pod for ingress, the peer for egress; never
//!   an outside destination).
//!
//! Not modelled (they are not NetworkPolicy decisions about a connection between the
//! addresses given): traffic from a pod's own node, which is always allowed, and a pod's
//! traffic to itself, which it cannot block.

use std::{collections::BTreeMap, net::IpAddr};

use ipnet::IpNet;
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod},
        networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

use super::{Protocol, Universe};

/// Whether a connection from `src` to `dst` on `port` over `protocol` is allowed by
/// `policies` in `universe` (addresses that are no pod's are outside the cluster).
#[must_use]
pub fn allowed(
    universe: &Universe,
    policies: &[NetworkPolicy],
    src: IpAddr,
    dst: IpAddr,
    protocol: Protocol,
    port: u16,
) -> bool {
    let conn = Connection::new(universe, src, dst, protocol, port);
    let egress_allowed = match conn.src_pod {
        Some(pod) => direction_allows(universe, policies, pod, Direction::Egress, &conn),
        None => true,
    };
    let ingress_allowed = match conn.dst_pod {
        Some(pod) => direction_allows(universe, policies, pod, Direction::Ingress, &conn),
        None => true,
    };
    egress_allowed && ingress_allowed
}

/// Whether `pod` is isolated for egress (`egress`) or ingress (`!egress`): some policy of
/// its namespace selects it and has that direction in its effective `policyTypes`. A pod
/// that is not a policy target (not running, no address, host network) is never
/// isolated.
#[must_use]
pub fn isolated(policies: &[NetworkPolicy], pod: &Pod, egress: bool) -> bool {
    let direction = if egress {
        Direction::Egress
    } else {
        Direction::Ingress
    };
    policies
        .iter()
        .any(|policy| selects(policy, pod) && has_policy_type(policy, direction))
}

/// The effective `policyTypes` of `policy`: the field if it is set and non-empty, else
/// `["Ingress"]` plus `"Egress"` if the policy has at least one egress rule.
#[must_use]
pub fn effective_policy_types(policy: &NetworkPolicy) -> Vec<String> {
    let spec = policy.spec.as_ref();
    if let Some(types) = spec.and_then(|s| s.policy_types.as_ref()) {
        if !types.is_empty() {
            return types.clone();
        }
    }
    let mut types = vec!["Ingress".to_owned()];
    let has_egress_rules = spec
        .and_then(|s| s.egress.as_ref())
        .is_some_and(|rules| !rules.is_empty());
    if has_egress_rules {
        types.push("Egress".to_owned());
    }
    types
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn policy_type(self) -> &'static str {
        match self {
            Self::Ingress => "Ingress",
            Self::Egress => "Egress",
        }
    }
}

/// The connection being decided, with the pods its addresses belong to.
struct Connection<'a> {
    src: IpAddr,
    dst: IpAddr,
    src_pod: Option<&'a Pod>,
    dst_pod: Option<&'a Pod>,
    protocol: Protocol,
    port: u16,
}

impl<'a> Connection<'a> {
    fn new(
        universe: &'a Universe,
        src: IpAddr,
        dst: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Self {
        Self {
            src,
            dst,
            src_pod: pod_with_address(universe, src),
            dst_pod: pod_with_address(universe, dst),
            protocol,
            port,
        }
    }
}

/// One rule of either direction: its peers (`from` or `to`) and its ports.
struct Rule<'a> {
    peers: Option<&'a [NetworkPolicyPeer]>,
    ports: Option<&'a [NetworkPolicyPort]>,
}

/// Whether `direction` of `pod` allows `conn` (`pod` is `conn`'s source for egress, its
/// destination for ingress).
fn direction_allows(
    universe: &Universe,
    policies: &[NetworkPolicy],
    pod: &Pod,
    direction: Direction,
    conn: &Connection<'_>,
) -> bool {
    let applying: Vec<&NetworkPolicy> = policies
        .iter()
        .filter(|policy| selects(policy, pod) && has_policy_type(policy, direction))
        .collect();
    if applying.is_empty() {
        // Not isolated in this direction.
        return true;
    }
    applying.iter().any(|policy| {
        rules(policy, direction)
            .iter()
            .any(|rule| rule_matches(universe, policy, rule, direction, conn))
    })
}

/// The rules of `policy` for `direction` (none if the field is absent).
fn rules(policy: &NetworkPolicy, direction: Direction) -> Vec<Rule<'_>> {
    let Some(spec) = policy.spec.as_ref() else {
        return Vec::new();
    };
    match direction {
        Direction::Ingress => spec
            .ingress
            .iter()
            .flatten()
            .map(|rule| Rule {
                peers: rule.from.as_deref(),
                ports: rule.ports.as_deref(),
            })
            .collect(),
        Direction::Egress => spec
            .egress
            .iter()
            .flatten()
            .map(|rule| Rule {
                peers: rule.to.as_deref(),
                ports: rule.ports.as_deref(),
            })
            .collect(),
    }
}

fn rule_matches(
    universe: &Universe,
    policy: &NetworkPolicy,
    rule: &Rule<'_>,
    direction: Direction,
    conn: &Connection<'_>,
) -> bool {
    // The peer is the other end: the source for ingress, the destination for egress.
    let (peer_addr, peer_pod) = match direction {
        Direction::Ingress => (conn.src, conn.src_pod),
        Direction::Egress => (conn.dst, conn.dst_pod),
    };
    let peer_ok = match rule.peers {
        None | Some([]) => true,
        Some(peers) => peers
            .iter()
            .any(|peer| peer_matches(universe, policy, peer, peer_addr, peer_pod)),
    };
    // Named ports are looked up on the connection's destination in both directions.
    let port_ok = match rule.ports {
        None | Some([]) => true,
        Some(ports) => ports
            .iter()
            .any(|p| port_matches(p, conn.protocol, conn.port, conn.dst_pod)),
    };
    peer_ok && port_ok
}

fn peer_matches(
    universe: &Universe,
    policy: &NetworkPolicy,
    peer: &NetworkPolicyPeer,
    addr: IpAddr,
    pod: Option<&Pod>,
) -> bool {
    // The API forbids ipBlock together with a selector; an ipBlock peer is its ipBlock.
    if let Some(block) = &peer.ip_block {
        return ip_block_contains(block, addr);
    }
    let Some(pod) = pod else {
        // Selectors only ever match pods.
        return false;
    };
    match (&peer.namespace_selector, &peer.pod_selector) {
        // The API requires at least one field; an empty peer matches nothing here.
        (None, None) => false,
        (None, Some(pod_selector)) => {
            namespace_name(pod) == policy_namespace(policy)
                && selector_matches(pod_selector, pod.metadata.labels.as_ref())
        }
        (Some(namespace_selector), pod_selector) => {
            let namespace_ok = namespace_of(universe, pod).is_some_and(|ns| {
                selector_matches(namespace_selector, ns.metadata.labels.as_ref())
            });
            let pod_ok = match pod_selector {
                None => true,
                Some(selector) => selector_matches(selector, pod.metadata.labels.as_ref()),
            };
            namespace_ok && pod_ok
        }
    }
}

/// `addr` is in `cidr` and in none of `except`, of the same family. A block with an
/// unparsable CIDR (which the API rejects) matches nothing.
fn ip_block_contains(block: &IPBlock, addr: IpAddr) -> bool {
    let Some(cidr) = parse_cidr(&block.cidr) else {
        return false;
    };
    let mut excepts = Vec::new();
    for except in block.except.iter().flatten() {
        let Some(net) = parse_cidr(except) else {
            return false;
        };
        excepts.push(net);
    }
    cidr_contains(cidr, addr) && !excepts.iter().any(|net| cidr_contains(*net, addr))
}

fn parse_cidr(cidr: &str) -> Option<IpNet> {
    cidr.parse().ok()
}

/// Whether `addr` is in `net`; an address of the other family never is.
fn cidr_contains(net: IpNet, addr: IpAddr) -> bool {
    match (net, addr) {
        (IpNet::V4(net), IpAddr::V4(addr)) => net.trunc().contains(&addr),
        (IpNet::V6(net), IpAddr::V6(addr)) => net.trunc().contains(&addr),
        _ => false,
    }
}

/// Whether `p` matches `port` over `protocol` towards `dst_pod` (for named ports).
fn port_matches(
    p: &NetworkPolicyPort,
    protocol: Protocol,
    port: u16,
    dst_pod: Option<&Pod>,
) -> bool {
    if p.protocol.as_deref().unwrap_or("TCP") != protocol.api_name() {
        return false;
    }
    match &p.port {
        None => true,
        Some(IntOrString::Int(start)) => {
            let end = p.end_port.unwrap_or(*start);
            (*start..=end).contains(&i32::from(port))
        }
        // A string is a port name, even if it is all digits (the API's port names must
        // contain a letter, so such a name matches nothing).
        Some(IntOrString::String(name)) => {
            dst_pod.is_some_and(|pod| has_named_port(pod, name, protocol, port))
        }
    }
}

/// Whether `pod` has a container port called `name` over `protocol` whose number is
/// `port`. The pod's ports are those of its containers and of its sidecar containers
/// (init containers with `restartPolicy: Always`), which run alongside them.
fn has_named_port(pod: &Pod, name: &str, protocol: Protocol, port: u16) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .any(|cp| {
            cp.name.as_deref() == Some(name)
                && cp.protocol.as_deref().unwrap_or("TCP") == protocol.api_name()
                && cp.container_port == i32::from(port)
        })
}

/// Whether `policy` selects `pod`: same namespace, `spec.podSelector` (absent = empty =
/// every pod) matches, and the pod is a policy target at all.
fn selects(policy: &NetworkPolicy, pod: &Pod) -> bool {
    if !is_target(pod) || namespace_name(pod) != policy_namespace(policy) {
        return false;
    }
    match policy.spec.as_ref().and_then(|s| s.pod_selector.as_ref()) {
        None => true,
        Some(selector) => selector_matches(selector, pod.metadata.labels.as_ref()),
    }
}

fn has_policy_type(policy: &NetworkPolicy, direction: Direction) -> bool {
    effective_policy_types(policy)
        .iter()
        .any(|t| t == direction.policy_type())
}

/// A label selector: `matchLabels` and `matchExpressions`, all ANDed; an empty selector
/// matches everything. An unknown operator (which the API rejects) matches nothing.
fn selector_matches(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let label = |key: &str| labels.and_then(|l| l.get(key));
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| label(key) == Some(value));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = label(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

/// A pod that policies can select and selectors can match: running, with an address,
/// not on the host network.
fn is_target(pod: &Pod) -> bool {
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Running");
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    running && !host_network && !pod_addresses(pod).is_empty()
}

/// The pod's addresses: `status.podIPs` (whose first entry is `status.podIP`).
fn pod_addresses(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    status
        .pod_ips
        .iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// The policy target that owns `addr`, if any (otherwise the address is outside).
fn pod_with_address(universe: &Universe, addr: IpAddr) -> Option<&Pod> {
    universe
        .pods
        .iter()
        .find(|pod| is_target(pod) && pod_addresses(pod).contains(&addr))
}

/// The Namespace object of `pod`'s namespace (a selector matches no namespace without
/// one).
fn namespace_of<'a>(universe: &'a Universe, pod: &Pod) -> Option<&'a Namespace> {
    universe.namespace(namespace_name(pod))
}

/// A namespaced object without a namespace is in `default`, as the API server places it.
fn namespace_name(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn policy_namespace(policy: &NetworkPolicy) -> &str {
    policy.metadata.namespace.as_deref().unwrap_or("default")
}

/// Whether a connection is allowed by `cluster_policies` (`ClusterNetworkPolicy` objects,
/// `policy.networking.k8s.io/v1alpha2`, as JSON) and `policies` together. Written from the
/// API's text (`apis/v1alpha2/clusternetworkpolicy_types.go`) alone:
///
/// - each direction is decided at its pod as NetworkPolicy's is (the source's egress, the
///   destination's ingress; an outside end decides nothing);
/// - tiers in order: Admin, NetworkPolicy, Baseline, then allowed. Within a tier, the
///   policies whose `subject` selects the pod, by `priority` (lower first; equal ones by
///   name, one of the orders the API leaves free), each one's rules of the direction in
///   written order; the first rule that matches decides: `Accept` allows, `Deny` denies,
///   `Pass` ends the tier. The NetworkPolicy tier decides whenever a NetworkPolicy
///   isolates the pod in the direction;
/// - a subject: `namespaces` = every pod of the namespaces the selector matches; `pods`
///   = the pods `podSelector` matches in the namespaces `namespaceSelector` matches;
///   host-network pods never;
/// - a rule matches when a peer matches and (`protocols` absent) any port, or a protocol
///   entry matches: `tcp`/`udp`/`sctp` with no `destinationPort` = every port of it, a
///   `number`, or a `range` `start..=end`; `destinationNamedPort` = the destination
///   pod's container port of that name (any protocol);
/// - peers: `namespaces`, `pods` as for subjects (pods only); `nodes` = the addresses
///   (`status.addresses`) of the universe's Nodes whose labels the selector matches;
///   `networks` = addresses in one of the CIDRs, of the same family; `domainNames` =
///   what a DNS answer taught (none here). Ingress peers have only `namespaces` and
///   `pods`;
/// - a peer none of whose fields is known fails closed: an `Accept` rule with one matches
///   nothing, a `Deny` or `Pass` rule with one denies everything.
#[must_use]
pub fn allowed_with_cluster_policies(
    universe: &Universe,
    policies: &[NetworkPolicy],
    cluster_policies: &[serde_json::Value],
    src: IpAddr,
    dst: IpAddr,
    protocol: Protocol,
    port: u16,
) -> bool {
    let conn = Connection::new(universe, src, dst, protocol, port);
    let decide = |pod: &Pod, direction: Direction| {
        let tier =
            |name: &str| tier_decides(universe, cluster_policies, name, pod, direction, &conn);
        if let Some(verdict) = tier("Admin") {
            return verdict;
        }
        if isolated(policies, pod, direction == Direction::Egress) {
            return direction_allows(universe, policies, pod, direction, &conn);
        }
        tier("Baseline").unwrap_or(true)
    };
    conn.src_pod.is_none_or(|p| decide(p, Direction::Egress))
        && conn.dst_pod.is_none_or(|p| decide(p, Direction::Ingress))
}

/// The verdict of tier `tier` for `pod`'s `direction`: `Some` when an `Accept` or `Deny`
/// rule decides, `None` when none matches or a `Pass` does.
fn tier_decides(
    universe: &Universe,
    cluster_policies: &[serde_json::Value],
    tier: &str,
    pod: &Pod,
    direction: Direction,
    conn: &Connection<'_>,
) -> Option<bool> {
    let mut applying: Vec<&serde_json::Value> = cluster_policies
        .iter()
        .filter(|p| {
            p["spec"]["tier"] == tier && subject_selects(universe, &p["spec"]["subject"], pod)
        })
        .collect();
    applying.sort_by_key(|p| {
        (
            p["spec"]["priority"].as_i64().unwrap_or(0),
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    });
    let key = match direction {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    };
    for policy in applying {
        for rule in policy["spec"][key].as_array().into_iter().flatten() {
            let action = rule["action"].as_str().unwrap_or_default();
            if fails_closed(rule, direction) {
                // An Accept rule then matches nothing; a Deny or a Pass denies all.
                if action == "Accept" {
                    continue;
                }
                return Some(false);
            }
            if cluster_rule_matches(universe, rule, direction, conn) {
                return match action {
                    "Accept" => Some(true),
                    "Deny" => Some(false),
                    _ => None,
                };
            }
        }
    }
    None
}

fn label_selector(v: &serde_json::Value) -> Option<LabelSelector> {
    serde_json::from_value(v.clone()).ok()
}

/// Whether a subject (or a `pods`/`namespaces` peer) takes `pod`.
fn subject_selects(universe: &Universe, subject: &serde_json::Value, pod: &Pod) -> bool {
    if !is_target(pod) {
        return false;
    }
    let ns_labels = namespace_of(universe, pod).and_then(|ns| ns.metadata.labels.as_ref());
    let labels = pod.metadata.labels.as_ref();
    if let Some(sel) = subject.get("namespaces").and_then(label_selector) {
        return selector_matches(&sel, ns_labels);
    }
    if let Some(pods) = subject.get("pods") {
        let ns_sel = label_selector(&pods["namespaceSelector"]).unwrap_or_default();
        let pod_sel = label_selector(&pods["podSelector"]).unwrap_or_default();
        return selector_matches(&ns_sel, ns_labels) && selector_matches(&pod_sel, labels);
    }
    false
}

/// Whether a rule has a peer none of whose fields the API defines for its direction.
fn fails_closed(rule: &serde_json::Value, direction: Direction) -> bool {
    let (peers, fields): (&serde_json::Value, &[&str]) = match direction {
        Direction::Ingress => (&rule["from"], &["namespaces", "pods"]),
        Direction::Egress => (
            &rule["to"],
            &["namespaces", "pods", "nodes", "networks", "domainNames"],
        ),
    };
    peers
        .as_array()
        .into_iter()
        .flatten()
        .any(|peer| !fields.iter().any(|f| peer.get(*f).is_some()))
}

fn cluster_rule_matches(
    universe: &Universe,
    rule: &serde_json::Value,
    direction: Direction,
    conn: &Connection<'_>,
) -> bool {
    let (peers, peer_addr, peer_pod) = match direction {
        Direction::Ingress => (&rule["from"], conn.src, conn.src_pod),
        Direction::Egress => (&rule["to"], conn.dst, conn.dst_pod),
    };
    let peer_ok = peers.as_array().into_iter().flatten().any(|peer| {
        if peer.get("namespaces").is_some() || peer.get("pods").is_some() {
            return peer_pod.is_some_and(|p| subject_selects(universe, peer, p));
        }
        if let Some(nodes) = peer.get("nodes") {
            let Some(sel) = label_selector(nodes) else {
                return false;
            };
            return universe.nodes.iter().any(|node| {
                selector_matches(&sel, node.metadata.labels.as_ref())
                    && node_addresses(node).contains(&peer_addr)
            });
        }
        if let Some(networks) = peer.get("networks").and_then(|n| n.as_array()) {
            return networks
                .iter()
                .filter_map(|n| n.as_str()?.parse::<IpNet>().ok())
                .any(|net| cidr_contains(net, peer_addr));
        }
        false
    });
    let port_ok = match rule.get("protocols").and_then(|p| p.as_array()) {
        None => true,
        Some(protocols) => protocols.iter().any(|p| {
            if let Some(name) = p["destinationNamedPort"].as_str() {
                return conn.dst_pod.is_some_and(|pod| {
                    PROTOCOLS_ALL.iter().any(|proto| {
                        *proto == conn.protocol && has_named_port(pod, name, *proto, conn.port)
                    })
                });
            }
            let Some(m) = p.get(match conn.protocol {
                Protocol::Tcp => "tcp",
                Protocol::Udp => "udp",
                Protocol::Sctp => "sctp",
            }) else {
                return false;
            };
            let dport = &m["destinationPort"];
            if dport.is_null() {
                return true;
            }
            if let Some(n) = dport["number"].as_i64() {
                return n == i64::from(conn.port);
            }
            let (start, end) = (
                dport["range"]["start"].as_i64(),
                dport["range"]["end"].as_i64(),
            );
            matches!((start, end), (Some(s), Some(e)) if (s..=e).contains(&i64::from(conn.port)))
        }),
    };
    peer_ok && port_ok
}

/// The addresses a Node publishes (`status.addresses` that are IP addresses).
fn node_addresses(node: &Node) -> Vec<IpAddr> {
    node.status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// Every protocol a port can be over.
const PROTOCOLS_ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use k8s_openapi::api::{
        core::v1::{Container, ContainerPort, Pod},
        networking::v1::NetworkPolicy,
    };
    use serde_json::{json, Value};

    use super::{allowed, allowed_with_cluster_policies, effective_policy_types, isolated};
    use crate::netpol::{Protocol, Universe};

    const OUTSIDE_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    const OUTSIDE_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));

    /// A policy in `namespace` with `spec` (JSON, as the API takes it).
    fn policy(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "namespace": namespace, "name": name },
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("bad policy {namespace}/{name}: {e}"))
    }

    fn pod_of<'a>(u: &'a Universe, ns_pod: &str) -> &'a Pod {
        let (ns, name) = ns_pod.split_once('/').unwrap_or((ns_pod, ""));
        u.pod(ns, name).unwrap_or_else(|| panic!("no pod {ns_pod}"))
    }

    /// The address of `ns/pod` of the family of `v6`.
    fn addr(u: &Universe, ns_pod: &str, v6: bool) -> IpAddr {
        let pod = pod_of(u, ns_pod);
        pod.status
            .iter()
            .flat_map(|s| s.pod_ips.iter().flatten())
            .filter_map(|ip| ip.ip.parse::<IpAddr>().ok())
            .find(|ip| ip.is_ipv6() == v6)
            .unwrap_or_else(|| panic!("{ns_pod} has no address of that family"))
    }

    fn v4(u: &Universe, ns_pod: &str) -> IpAddr {
        addr(u, ns_pod, false)
    }

    fn v6(u: &Universe, ns_pod: &str) -> IpAddr {
        addr(u, ns_pod, true)
    }

    /// TCP from `from` to `to` on `port`, over IPv4 and IPv6 (which must agree).
    fn tcp(u: &Universe, policies: &[NetworkPolicy], from: &str, to: &str, port: u16) -> bool {
        let a = allowed(u, policies, v4(u, from), v4(u, to), Protocol::Tcp, port);
        let b = allowed(u, policies, v6(u, from), v6(u, to), Protocol::Tcp, port);
        assert_eq!(a, b, "{from} -> {to}: the families disagree");
        a
    }

    /// A TCP connection on `port` between addresses.
    fn tcp_ip(
        u: &Universe,
        policies: &[NetworkPolicy],
        src: IpAddr,
        dst: IpAddr,
        port: u16,
    ) -> bool {
        allowed(u, policies, src, dst, Protocol::Tcp, port)
    }

    #[test]
    fn no_policies_allow_everything() {
        let u = Universe::upstream();
        assert!(tcp(&u, &[], "x/a", "y/b", 80));
        let a = pod_of(&u, "x/a");
        assert!(!isolated(&[], a, false) && !isolated(&[], a, true));
        let (a4, a6) = (v4(&u, "x/a"), v6(&u, "x/a"));
        assert!(allowed(&u, &[], OUTSIDE_V4, a4, Protocol::Udp, 9));
        assert!(allowed(&u, &[], a6, OUTSIDE_V6, Protocol::Sctp, 9));
    }

    #[test]
    fn policy_types_default() {
        let ingress_only = policy("x", "p", json!({ "podSelector": {} }));
        assert_eq!(effective_policy_types(&ingress_only), ["Ingress"]);
        let empty_egress = policy("x", "p", json!({ "podSelector": {}, "egress": [] }));
        assert_eq!(effective_policy_types(&empty_egress), ["Ingress"]);
        let with_egress = policy("x", "p", json!({ "podSelector": {}, "egress": [{}] }));
        assert_eq!(effective_policy_types(&with_egress), ["Ingress", "Egress"]);
        let explicit = policy(
            "x",
            "p",
            json!({ "podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}] }),
        );
        assert_eq!(effective_policy_types(&explicit), ["Egress"]);

        let u = Universe::upstream();
        // Egress rules without policyTypes: isolated both ways; no ingress rule, so all
        // ingress is denied, egress is allowed by its allow-all rule.
        let ps = [with_egress];
        assert!(isolated(&ps, pod_of(&u, "x/a"), false));
        assert!(isolated(&ps, pod_of(&u, "x/a"), true));
        assert!(!tcp(&u, &ps, "y/a", "x/a", 80));
        assert!(tcp(&u, &ps, "x/a", "y/a", 80));
        // policyTypes [Egress] with an ingress rule: ingress is not isolated, egress
        // denies everything.
        let ps = [explicit];
        assert!(!isolated(&ps, pod_of(&u, "x/a"), false));
        assert!(tcp(&u, &ps, "y/a", "x/a", 80));
        assert!(!tcp(&u, &ps, "x/a", "y/a", 80));
        // Egress of the source and ingress of the destination must both allow: x/a -> x/b
        // is stopped by x/a's egress although x/b's ingress is not isolated.
        assert!(!tcp(&u, &ps, "x/a", "x/b", 80));
    }

    #[test]
    fn empty_pod_selector_selects_the_whole_namespace_only() {
        let u = Universe::upstream();
        let ps = [policy("x", "deny", json!({ "podSelector": {} }))];
        for pod in ["x/a", "x/b", "x/c"] {
            assert!(!tcp(&u, &ps, "y/a", pod, 80), "{pod}");
            assert!(!tcp(&u, &ps, "x/a", pod, 80), "{pod}");
        }
        assert!(tcp(&u, &ps, "x/a", "y/b", 80));
        assert!(tcp(&u, &ps, "z/c", "y/b", 80));
        assert!(!isolated(&ps, pod_of(&u, "y/a"), false));
        // An absent spec.podSelector is the empty selector.
        let ps = [policy("x", "deny", json!({}))];
        assert!(!tcp(&u, &ps, "y/a", "x/c", 80));
    }

    #[test]
    fn namespace_and_pod_selector_in_one_peer_vs_two_peers() {
        let u = Universe::upstream();
        let one_peer = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "ingress": [{ "from": [{
                    "namespaceSelector": { "matchLabels": { "ns": "y" } },
                    "podSelector": { "matchLabels": { "pod": "b" } },
                }] }],
            }),
        )];
        assert!(tcp(&u, &one_peer, "y/b", "x/a", 80));
        assert!(!tcp(&u, &one_peer, "y/a", "x/a", 80));
        assert!(!tcp(&u, &one_peer, "x/b", "x/a", 80));
        assert!(!tcp(&u, &one_peer, "z/b", "x/a", 80));

        let two_peers = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "ingress": [{ "from": [
                    { "namespaceSelector": { "matchLabels": { "ns": "y" } } },
                    { "podSelector": { "matchLabels": { "pod": "b" } } },
                ] }],
            }),
        )];
        assert!(tcp(&u, &two_peers, "y/b", "x/a", 80));
        assert!(tcp(&u, &two_peers, "y/a", "x/a", 80));
        assert!(tcp(&u, &two_peers, "y/c", "x/a", 80));
        // podSelector alone: the policy's namespace only.
        assert!(tcp(&u, &two_peers, "x/b", "x/a", 80));
        assert!(!tcp(&u, &two_peers, "z/b", "x/a", 80));
        assert!(!tcp(&u, &two_peers, "x/c", "x/a", 80));
        // Selectors never match outside addresses.
        assert!(!tcp_ip(&u, &two_peers, OUTSIDE_V4, v4(&u, "x/a"), 80));
    }

    #[test]
    fn ip_block_except() {
        let u = Universe::upstream();
        // x/a is 10.244.1.10, x/b 10.244.1.11.
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "policyTypes": ["Egress"],
                "egress": [{ "to": [{ "ipBlock": {
                    "cidr": "10.244.0.0/16",
                    "except": ["10.244.1.11/32", "10.244.1.16/30"],
                } }] }],
            }),
        )];
        let a = v4(&u, "x/a");
        let to = |addr: IpAddr| allowed(&u, &ps, a, addr, Protocol::Tcp, 80);
        assert!(to(v4(&u, "x/c")));
        assert!(!to(v4(&u, "x/b")));
        assert!(to(v4(&u, "y/b"))); // .14
        assert!(to(v4(&u, "y/c"))); // .15
        assert!(!to(v4(&u, "z/a"))); // .16
        assert!(!to(v4(&u, "z/c"))); // .18
        assert!(to(IpAddr::V4(Ipv4Addr::new(10, 244, 200, 1))));
        assert!(!to(OUTSIDE_V4));
        // Host bits in the CIDR do not matter.
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": {},
                "ingress": [{ "from": [{ "ipBlock": { "cidr": "192.0.2.77/24" } }] }],
            }),
        )];
        assert!(tcp_ip(&u, &ps, OUTSIDE_V4, v4(&u, "x/b"), 80));
        assert!(!tcp(&u, &ps, "y/a", "x/b", 80));
    }

    #[test]
    fn end_port_is_an_inclusive_range_of_one_protocol() {
        let u = Universe::upstream();
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": {},
                "ingress": [{ "ports": [{ "port": 80, "endPort": 81 }] }],
            }),
        )];
        assert!(!tcp(&u, &ps, "y/a", "x/a", 79));
        assert!(tcp(&u, &ps, "y/a", "x/a", 80));
        assert!(tcp(&u, &ps, "y/a", "x/a", 81));
        assert!(!tcp(&u, &ps, "y/a", "x/a", 82));
        // The protocol defaults to TCP.
        let (src, dst) = (v4(&u, "y/a"), v4(&u, "x/a"));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Udp, 80));
        // A port without a number: every port of its protocol.
        let ps = [policy(
            "x",
            "p",
            json!({ "podSelector": {}, "ingress": [{ "ports": [{ "protocol": "UDP" }] }] }),
        )];
        assert!(allowed(&u, &ps, src, dst, Protocol::Udp, 4242));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Tcp, 4242));
    }

    /// The upstream universe plus `z/d` and `z/e`, both with a TCP port named `web`: 8080
    /// on `z/d`, 9090 on `z/e`.
    fn web_universe() -> Universe {
        let mut u = Universe::upstream();
        for (name, n, port) in [("d", 50, 8080), ("e", 51, 9090)] {
            let ips = [
                IpAddr::V4(Ipv4Addr::new(10, 244, 2, n)),
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, n.into())),
            ];
            let mut pod = crate::netpol::pod("z", name, &[("pod", name)], &ips);
            if let Some(spec) = pod.spec.as_mut() {
                spec.containers = vec![Container {
                    name: "web".to_owned(),
                    ports: Some(vec![ContainerPort {
                        container_port: port,
                        name: Some("web".to_owned()),
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }];
            }
            u.pods.push(pod);
        }
        u
    }

    #[test]
    fn named_port_is_resolved_on_the_destination() {
        let u = web_universe();
        let web = json!([{ "port": "web" }]);
        // Ingress: the policy's own pod.
        let ps = [policy(
            "z",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "d" } },
                "ingress": [{ "ports": web }],
            }),
        )];
        assert!(tcp(&u, &ps, "x/a", "z/d", 8080));
        assert!(!tcp(&u, &ps, "x/a", "z/d", 9090));
        let (src, dst) = (v4(&u, "x/a"), v4(&u, "z/d"));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Udp, 8080));

        // Egress: the peer, whichever pod it is.
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "policyTypes": ["Egress"],
                "egress": [{ "ports": web }],
            }),
        )];
        assert!(tcp(&u, &ps, "x/a", "z/d", 8080));
        assert!(!tcp(&u, &ps, "x/a", "z/d", 9090));
        assert!(tcp(&u, &ps, "x/a", "z/e", 9090));
        assert!(!tcp(&u, &ps, "x/a", "z/e", 8080));
        // Pods without a port of that name, and outside destinations, never match.
        assert!(!tcp(&u, &ps, "x/a", "y/a", 8080));
        assert!(!tcp_ip(&u, &ps, v4(&u, "x/a"), OUTSIDE_V4, 8080));

        // Upstream's names carry the protocol: serve-81-udp is UDP 81 only.
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "policyTypes": ["Egress"],
                "egress": [{ "ports": [{ "protocol": "UDP", "port": "serve-81-udp" }] }],
            }),
        )];
        let (src, dst) = (v6(&u, "x/a"), v6(&u, "y/b"));
        assert!(allowed(&u, &ps, src, dst, Protocol::Udp, 81));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Udp, 80));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Tcp, 81));
        // A named port whose protocol is not the rule's does not resolve.
        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "policyTypes": ["Egress"],
                "egress": [{ "ports": [{ "port": "serve-81-udp" }] }],
            }),
        )];
        assert!(!allowed(&u, &ps, src, dst, Protocol::Udp, 81));
        assert!(!allowed(&u, &ps, src, dst, Protocol::Tcp, 81));
    }

    #[test]
    fn policies_are_a_union() {
        let u = Universe::upstream();
        let from = |pod: &str| {
            json!({
                "podSelector": { "matchLabels": { "pod": "a" } },
                "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "pod": pod } } }] }],
            })
        };
        let ps = [
            policy("x", "from-b", from("b")),
            policy("x", "from-c", from("c")),
        ];
        assert!(tcp(&u, &ps, "x/b", "x/a", 80));
        assert!(tcp(&u, &ps, "x/c", "x/a", 80));
        assert!(!tcp(&u, &ps, "y/a", "x/a", 80));
        // A policy of another namespace selects nothing here.
        let ps = [
            policy("y", "deny", json!({ "podSelector": {} })),
            ps[0].clone(),
        ];
        assert!(tcp(&u, &ps, "x/b", "x/a", 80));
        assert!(!tcp(&u, &ps, "x/c", "x/a", 80));
        assert!(!tcp(&u, &ps, "x/a", "y/a", 80));
    }

    #[test]
    fn ip_block_family_must_match() {
        let u = Universe::upstream();
        let egress_to = |cidr: &str| {
            [policy(
                "x",
                "p",
                json!({
                    "podSelector": {},
                    "policyTypes": ["Egress"],
                    "egress": [{ "to": [{ "ipBlock": { "cidr": cidr } }] }],
                }),
            )]
        };
        let ps = egress_to("0.0.0.0/0");
        assert!(tcp_ip(&u, &ps, v4(&u, "x/a"), OUTSIDE_V4, 80));
        assert!(tcp_ip(&u, &ps, v4(&u, "x/a"), v4(&u, "y/a"), 80));
        assert!(!tcp_ip(&u, &ps, v6(&u, "x/a"), OUTSIDE_V6, 80));
        assert!(!tcp_ip(&u, &ps, v6(&u, "x/a"), v6(&u, "y/a"), 80));
        let ps = egress_to("::/0");
        assert!(!tcp_ip(&u, &ps, v4(&u, "x/a"), OUTSIDE_V4, 80));
        assert!(tcp_ip(&u, &ps, v6(&u, "x/a"), OUTSIDE_V6, 80));
        assert!(tcp_ip(&u, &ps, v6(&u, "x/a"), v6(&u, "z/c"), 80));
    }

    #[test]
    fn match_expressions_not_in_and_does_not_exist_match_a_missing_key() {
        let mut u = Universe::upstream();
        u.set_pod_labels("x", "b", &[("pod", "b"), ("team", "red")]);
        u.set_pod_labels("x", "c", &[("pod", "c"), ("team", "blue")]);
        let from = |expr: Value| {
            [policy(
                "x",
                "p",
                json!({
                    "podSelector": { "matchLabels": { "pod": "a" } },
                    "ingress": [{ "from": [{
                        "namespaceSelector": {},
                        "podSelector": { "matchExpressions": [expr] },
                    }] }],
                }),
            )]
        };
        let ps = from(json!({ "key": "team", "operator": "NotIn", "values": ["red"] }));
        assert!(!tcp(&u, &ps, "x/b", "x/a", 80));
        assert!(tcp(&u, &ps, "x/c", "x/a", 80));
        assert!(tcp(&u, &ps, "y/a", "x/a", 80)); // no team label
        let ps = from(json!({ "key": "team", "operator": "In", "values": ["red", "green"] }));
        assert!(tcp(&u, &ps, "x/b", "x/a", 80));
        assert!(!tcp(&u, &ps, "x/c", "x/a", 80));
        assert!(!tcp(&u, &ps, "y/a", "x/a", 80));
        let ps = from(json!({ "key": "team", "operator": "DoesNotExist" }));
        assert!(!tcp(&u, &ps, "x/b", "x/a", 80));
        assert!(tcp(&u, &ps, "z/b", "x/a", 80));
        let ps = from(json!({ "key": "team", "operator": "Exists" }));
        assert!(tcp(&u, &ps, "x/c", "x/a", 80));
        assert!(!tcp(&u, &ps, "z/b", "x/a", 80));
        // An empty namespaceSelector with a podSelector: those pods in every namespace.
        u.set_pod_labels("z", "b", &[("team", "blue")]);
        assert!(tcp(&u, &ps, "z/b", "x/a", 80));
    }

    #[test]
    fn host_network_and_stopped_pods_are_outside() {
        let mut u = Universe::upstream();
        let node = IpAddr::V4(Ipv4Addr::new(172, 18, 0, 2));
        let mut host = crate::netpol::pod("x", "h", &[("pod", "h")], &[node]);
        if let Some(spec) = host.spec.as_mut() {
            spec.host_network = Some(true);
        }
        u.pods.push(host);
        let stopped_ip = IpAddr::V4(Ipv4Addr::new(10, 244, 9, 9));
        let mut stopped = crate::netpol::pod("x", "s", &[("pod", "s")], &[stopped_ip]);
        if let Some(status) = stopped.status.as_mut() {
            status.phase = Some("Succeeded".to_owned());
        }
        u.pods.push(stopped);

        let ps = [policy(
            "x",
            "p",
            json!({
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{ "from": [{ "podSelector": {} }] }],
                "egress": [{ "to": [{ "ipBlock": { "cidr": "172.18.0.0/16" } }] }],
            }),
        )];
        // Not selected by the empty podSelector: the host-network pod is not isolated.
        assert!(!isolated(&ps, pod_of(&u, "x/h"), false));
        assert!(!isolated(&ps, pod_of(&u, "x/s"), true));
        // Not matched by a podSelector peer, but by an ipBlock.
        let a = v4(&u, "x/a");
        assert!(!allowed(&u, &ps, node, a, Protocol::Tcp, 80));
        assert!(allowed(&u, &ps, a, node, Protocol::Tcp, 80));
        assert!(!allowed(&u, &ps, stopped_ip, a, Protocol::Tcp, 80));
        assert!(allowed(&u, &ps, OUTSIDE_V4, stopped_ip, Protocol::Tcp, 80));
        // Egress from x's pods reaches the node range only.
        assert!(!tcp(&u, &ps, "x/b", "x/a", 80));
        // `podSelector: {}` alone is every pod of the policy's namespace, and no other.
        assert!(!tcp(&u, &ps, "y/b", "x/a", 80));
    }
    #[test]
    fn node_peers_are_the_addresses_of_the_nodes_a_selector_picks() {
        let mut u = Universe::upstream();
        let node = |name: &str, os: &str, ip: &str| {
            let mut n = crate::apiserver::node_object(name, &[], &[ip]);
            n["metadata"]["labels"]["kubernetes.io/os"] = json!(os);
            serde_json::from_value(n).unwrap_or_else(|e| panic!("{e}"))
        };
        u.nodes = vec![
            node("linux", "linux", "198.18.0.1"),
            node("windows", "windows", "198.18.0.3"),
        ];
        let cnp = json!({
            "metadata": {"name": "nodes"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                "egress": [{"name": "r", "action": "Deny", "to": [{"nodes": {
                    "matchLabels": {"kubernetes.io/os": "linux"}}}]}]},
        });
        let to = |ip: &str| {
            let dst: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{e}"));
            allowed_with_cluster_policies(
                &u,
                &[],
                std::slice::from_ref(&cnp),
                v4(&u, "x/a"),
                dst,
                Protocol::Tcp,
                80,
            )
        };
        assert!(!to("198.18.0.1"));
        assert!(to("198.18.0.3"));
        assert!(to("198.18.0.2"));
        // A Node's name (a Hostname entry) is no address; pods are never node peers.
        let (src, dst) = (v4(&u, "x/a"), v4(&u, "y/a"));
        assert!(allowed_with_cluster_policies(
            &u,
            &[],
            &[cnp],
            src,
            dst,
            Protocol::Tcp,
            80
        ));
    }
}
