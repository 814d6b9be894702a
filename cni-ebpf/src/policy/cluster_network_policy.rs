//! `ClusterNetworkPolicy` (`policy.networking.k8s.io`, the network-policy-api project's
//! CRD): the API object as the agent reads it, and the checked form the compiler uses.
//!
//! The semantics are the API's own text (`apis/v1alpha2/clusternetworkpolicy_types.go`):
//! - a policy is in the **Admin** tier (evaluated before NetworkPolicy) or the
//!   **Baseline** tier (after it), with a `priority` 0–1000 (lower first) within its
//!   tier; its rules of one direction are evaluated in written order (up to 25);
//! - its `subject` selects pods by namespace selector, or by namespace and pod selectors;
//!   host-network pods are never subjects (nor peers);
//! - a rule's action is `Accept` (final, replies and related ICMP pass), `Deny` (final)
//!   or `Pass` (skip the rest of this tier, on to the next);
//! - ingress peers are namespaces or pods; egress peers also nodes (the addresses of the
//!   Nodes a selector picks), networks (CIDRs) and domain names (Accept rules only);
//! - `protocols` (none: every port of every protocol) are TCP, UDP or SCTP with every
//!   port, one port or a range, or a destination named port (a container port's name,
//!   whatever its protocol);
//! - **failing closed**: a peer or protocol none of whose fields this binary knows (a
//!   newer CRD) makes an `Accept` rule match nothing, and a `Deny` or `Pass` rule deny
//!   everything.
//!
//! A policy that cannot be read at all (a selector, CIDR, port or action the API would
//! refuse) closes the pods its subject selects (or every pod, when even the subject cannot
//! be read), in the directions it has rules for.

use std::borrow::Cow;

use ipnet::IpNet;
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
    ClusterResourceScope,
};
use serde::Deserialize;

use super::{
    cluster::{protocol_number, Cluster, PodView},
    compile::{Dir, Port},
    selector::Selector,
    tables::AddrSet,
};

/// The API group.
pub const GROUP: &str = "policy.networking.k8s.io";
/// The API version the agent reads (the network-policy-api project's CRD).
pub const VERSION: &str = "v1alpha2";
/// The resource's plural name.
pub const PLURAL: &str = "clusternetworkpolicies";

/// A `ClusterNetworkPolicy`, as much of it as the agent reads. Unknown fields are
/// skipped; a peer or protocol made only of unknown fields fails closed (see the module
/// comment).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClusterNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<Spec>,
}

impl kube::Resource for ClusterNetworkPolicy {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        Cow::Borrowed("ClusterNetworkPolicy")
    }

    fn group((): &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version((): &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural((): &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub tier: Option<String>,
    pub priority: Option<i32>,
    pub subject: Option<RawSubject>,
    #[serde(default)]
    pub ingress: Vec<RawRule>,
    #[serde(default)]
    pub egress: Vec<RawRule>,
}

/// `spec.subject`: exactly one of its fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawSubject {
    pub namespaces: Option<LabelSelector>,
    pub pods: Option<NamespacedPod>,
}

/// Pods of the namespaces a selector picks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedPod {
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    #[serde(default)]
    pub pod_selector: LabelSelector,
}

/// An ingress or egress rule (`from` for ingress, `to` for egress).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawRule {
    #[serde(default)]
    pub name: String,
    pub action: Option<String>,
    #[serde(default)]
    pub from: Vec<RawPeer>,
    #[serde(default)]
    pub to: Vec<RawPeer>,
    pub protocols: Option<Vec<RawProtocol>>,
}

/// A peer: exactly one of its fields (ingress peers know only `namespaces` and `pods`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawPeer {
    pub namespaces: Option<LabelSelector>,
    pub pods: Option<NamespacedPod>,
    pub nodes: Option<LabelSelector>,
    pub networks: Option<Vec<String>>,
    pub domain_names: Option<Vec<String>>,
}

/// A protocol match: exactly one of its fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawProtocol {
    pub tcp: Option<RawPortMatch>,
    pub udp: Option<RawPortMatch>,
    pub sctp: Option<RawPortMatch>,
    pub destination_named_port: Option<String>,
}

/// `tcp`, `udp`, `sctp`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawPortMatch {
    pub destination_port: Option<RawPort>,
}

/// One port or a range.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawPort {
    pub number: Option<i32>,
    pub range: Option<RawRange>,
}

/// An inclusive range.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawRange {
    pub start: i32,
    pub end: i32,
}

/// The tier a policy is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Before NetworkPolicy.
    Admin,
    /// After NetworkPolicy.
    Baseline,
}

impl Tier {
    /// The API's spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

/// What a rule does with what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Accept,
    Deny,
    Pass,
}

/// A peer, checked.
#[derive(Debug, Clone)]
pub enum ClusterPeer {
    /// Pods matching `pods` in the namespaces matching `namespaces` (`namespaces` alone:
    /// every pod of them).
    Pods {
        namespaces: Selector,
        pods: Selector,
    },
    /// The addresses of the Nodes the selector picks.
    Nodes(Selector),
    /// Addresses in these CIDRs.
    Networks(AddrSet),
    /// Names (`*.` wildcards: one or more labels), lower case, without the final dot.
    DomainNames(Vec<String>),
    /// A peer with no field this binary knows: fails closed.
    Unknown,
}

/// A port match, checked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClusterPort {
    /// Numeric (every port of a protocol, one port or a range).
    Numeric(Port),
    /// A container port name, whatever its protocol.
    Named(String),
    /// A protocol match with no field this binary knows: fails closed.
    Unknown,
}

/// A rule, checked.
#[derive(Debug, Clone)]
pub struct ClusterRule {
    /// Its `name` (may be empty).
    pub name: String,
    pub action: Action,
    /// At least one.
    pub peers: Vec<ClusterPeer>,
    /// Empty: every port of every protocol (ICMP included).
    pub ports: Vec<ClusterPort>,
}

impl ClusterRule {
    /// Whether a part of the rule is unknown to this binary, so that it fails closed:
    /// an `Accept` rule then matches nothing of what that part names, a `Deny` or `Pass`
    /// rule denies everything.
    #[must_use]
    pub fn fails_closed(&self) -> bool {
        self.peers.iter().any(|p| matches!(p, ClusterPeer::Unknown))
            || self.ports.iter().any(|p| matches!(p, ClusterPort::Unknown))
    }
}

/// A `ClusterNetworkPolicy`, checked.
#[derive(Debug, Clone)]
pub struct ClusterPolicy {
    pub name: String,
    pub tier: Tier,
    pub priority: i32,
    /// The namespaces of its subject.
    pub namespaces: Selector,
    /// The pods of its subject in them (`None`: every pod).
    pub pods: Option<Selector>,
    pub ingress: Vec<ClusterRule>,
    pub egress: Vec<ClusterRule>,
}

/// A policy that cannot be read, with what it would have selected.
#[derive(Debug, Clone)]
pub struct BrokenClusterPolicy {
    pub name: String,
    /// Its subject, if that much could be read (else every pod).
    pub subject: Option<(Selector, Option<Selector>)>,
    /// The directions it has rules for.
    pub ingress: bool,
    pub egress: bool,
    pub error: String,
}

/// Whether a subject (namespaces, and pods in them) takes `pod`: never a host-network pod.
fn subject_selects(
    cluster: &Cluster,
    pod: &PodView,
    namespaces: &Selector,
    pods: Option<&Selector>,
) -> bool {
    !pod.host_network
        && cluster
            .namespace_labels(&pod.namespace)
            .is_some_and(|labels| namespaces.matches(labels))
        && pods.is_none_or(|s| s.matches(&pod.labels))
}

impl ClusterPolicy {
    /// Whether its subject selects `pod`.
    #[must_use]
    pub fn selects(&self, cluster: &Cluster, pod: &PodView) -> bool {
        subject_selects(cluster, pod, &self.namespaces, self.pods.as_ref())
    }

    /// Its rules of `dir`, in written order.
    #[must_use]
    pub fn rules(&self, dir: Dir) -> &[ClusterRule] {
        match dir {
            Dir::Ingress => &self.ingress,
            Dir::Egress => &self.egress,
        }
    }
}

impl BrokenClusterPolicy {
    /// Whether it would select `pod` for `dir` (every pod, when not even its subject could
    /// be read).
    #[must_use]
    pub fn selects(&self, cluster: &Cluster, pod: &PodView, dir: Dir) -> bool {
        let has = match dir {
            Dir::Ingress => self.ingress,
            Dir::Egress => self.egress,
        };
        has && match &self.subject {
            Some((namespaces, pods)) => subject_selects(cluster, pod, namespaces, pods.as_ref()),
            None => !pod.host_network,
        }
    }
}

fn selector(s: &LabelSelector, field: &str) -> Result<Selector, String> {
    Selector::parse(s).map_err(|e| format!("{field}: {e}"))
}

fn subject(s: Option<&RawSubject>) -> Result<(Selector, Option<Selector>), String> {
    let s = s.ok_or("spec.subject is missing")?;
    match (&s.namespaces, &s.pods) {
        (Some(ns), None) => Ok((selector(ns, "spec.subject.namespaces")?, None)),
        (None, Some(p)) => Ok((
            selector(&p.namespace_selector, "spec.subject.pods.namespaceSelector")?,
            Some(selector(&p.pod_selector, "spec.subject.pods.podSelector")?),
        )),
        (Some(_), Some(_)) => Err("spec.subject sets both namespaces and pods".to_owned()),
        (None, None) => Err("spec.subject sets neither namespaces nor pods".to_owned()),
    }
}

/// A domain name as the API spells it (`kubernetes.io`, `*.kubernetes.io`, an optional
/// final dot), lower case and without the dot; an error for what the API's pattern
/// refuses.
pub fn domain_name(name: &str) -> Result<String, String> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let body = lower.strip_prefix("*.").unwrap_or(&lower);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if body.split('.').count() < 2 || !body.split('.').all(label_ok) || lower.len() > 253 {
        return Err(format!(
            "domain name {name:?} is not a name the API accepts"
        ));
    }
    Ok(lower)
}

fn peer(p: &RawPeer, egress: bool, field: &str) -> Result<ClusterPeer, String> {
    let set = [
        p.namespaces.is_some(),
        p.pods.is_some(),
        p.nodes.is_some(),
        p.networks.is_some(),
        p.domain_names.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set > 1 {
        return Err(format!("{field} sets more than one field"));
    }
    if let Some(ns) = &p.namespaces {
        return Ok(ClusterPeer::Pods {
            namespaces: selector(ns, &format!("{field}.namespaces"))?,
            pods: Selector::everything(),
        });
    }
    if let Some(pods) = &p.pods {
        return Ok(ClusterPeer::Pods {
            namespaces: selector(
                &pods.namespace_selector,
                &format!("{field}.pods.namespaceSelector"),
            )?,
            pods: selector(&pods.pod_selector, &format!("{field}.pods.podSelector"))?,
        });
    }
    if !egress {
        // Nodes, networks and domain names are not ingress peers: a field this binary
        // does not know there.
        return Ok(ClusterPeer::Unknown);
    }
    if let Some(nodes) = &p.nodes {
        return Ok(ClusterPeer::Nodes(selector(
            nodes,
            &format!("{field}.nodes"),
        )?));
    }
    if let Some(networks) = &p.networks {
        let mut blocks = Vec::new();
        for (i, n) in networks.iter().enumerate() {
            let net: IpNet = n
                .parse()
                .map_err(|_| format!("{field}.networks[{i}] {n:?} is not a CIDR"))?;
            blocks.extend(super::compile::block_of(net, Vec::new()));
        }
        return Ok(ClusterPeer::Networks(AddrSet { blocks }));
    }
    if let Some(names) = &p.domain_names {
        let names = names
            .iter()
            .map(|n| domain_name(n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{field}.domainNames: {e}"))?;
        return Ok(ClusterPeer::DomainNames(names));
    }
    Ok(ClusterPeer::Unknown)
}

fn port_number(n: i32, field: &str) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{field} {n} is not in 1-65535"))
}

fn protocol(p: &RawProtocol, field: &str) -> Result<ClusterPort, String> {
    let named = p.destination_named_port.as_ref();
    let matches = [
        ("TCP", p.tcp.as_ref()),
        ("UDP", p.udp.as_ref()),
        ("SCTP", p.sctp.as_ref()),
    ];
    let set = matches.iter().filter(|(_, m)| m.is_some()).count() + usize::from(named.is_some());
    if set > 1 {
        return Err(format!("{field} sets more than one field"));
    }
    if let Some(name) = named {
        return Ok(ClusterPort::Named(name.clone()));
    }
    let Some((name, Some(m))) = matches.iter().find(|(_, m)| m.is_some()) else {
        return Ok(ClusterPort::Unknown);
    };
    let proto = protocol_number(Some(name)).ok_or_else(|| format!("{field}: {name}"))?;
    let field = format!("{field}.{}.destinationPort", name.to_ascii_lowercase());
    Ok(ClusterPort::Numeric(match &m.destination_port {
        None => Port::All(proto),
        Some(RawPort {
            number: Some(n),
            range: None,
        }) => {
            let n = port_number(*n, &format!("{field}.number"))?;
            Port::Range(proto, n, n)
        }
        Some(RawPort {
            number: None,
            range: Some(r),
        }) => {
            let lo = port_number(r.start, &format!("{field}.range.start"))?;
            let hi = port_number(r.end, &format!("{field}.range.end"))?;
            if lo >= hi {
                return Err(format!("{field}.range: start {lo} is not below end {hi}"));
            }
            Port::Range(proto, lo, hi)
        }
        Some(_) => return Err(format!("{field} sets neither or both of number and range")),
    }))
}

fn rule(r: &RawRule, egress: bool, field: &str) -> Result<ClusterRule, String> {
    let action = match r.action.as_deref() {
        Some("Accept") => Action::Accept,
        Some("Deny") => Action::Deny,
        Some("Pass") => Action::Pass,
        other => {
            return Err(format!(
                "{field}.action {other:?} is not Accept, Deny or Pass"
            ))
        }
    };
    let (raw_peers, what) = if egress {
        (&r.to, "to")
    } else {
        (&r.from, "from")
    };
    if raw_peers.is_empty() {
        return Err(format!("{field}.{what} is empty"));
    }
    let peers = raw_peers
        .iter()
        .enumerate()
        .map(|(i, p)| peer(p, egress, &format!("{field}.{what}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    if action != Action::Accept
        && peers
            .iter()
            .any(|p| matches!(p, ClusterPeer::DomainNames(_)))
    {
        return Err(format!("{field}: domainNames are only for Accept rules"));
    }
    let ports = r
        .protocols
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| protocol(p, &format!("{field}.protocols[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterRule {
        name: r.name.clone(),
        action,
        peers,
        ports,
    })
}

/// Checks a policy; an error names the field the datapath cannot represent.
pub fn parse(cnp: &ClusterNetworkPolicy) -> Result<ClusterPolicy, String> {
    let spec = cnp.spec.as_ref().ok_or("spec is missing")?;
    let tier = match spec.tier.as_deref() {
        Some("Admin") => Tier::Admin,
        Some("Baseline") => Tier::Baseline,
        other => return Err(format!("spec.tier {other:?} is not Admin or Baseline")),
    };
    let priority = spec.priority.unwrap_or(0);
    if !(0..=1000).contains(&priority) {
        return Err(format!("spec.priority {priority} is not in 0-1000"));
    }
    let (namespaces, pods) = subject(spec.subject.as_ref())?;
    for (rules, what) in [
        (&spec.ingress, "spec.ingress"),
        (&spec.egress, "spec.egress"),
    ] {
        if rules.len() > 25 {
            return Err(format!("{what} has {} rules; at most 25", rules.len()));
        }
    }
    let ingress = spec
        .ingress
        .iter()
        .enumerate()
        .map(|(i, r)| rule(r, false, &format!("spec.ingress[{i}]")))
        .collect::<Result<_, _>>()?;
    let egress = spec
        .egress
        .iter()
        .enumerate()
        .map(|(i, r)| rule(r, true, &format!("spec.egress[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(ClusterPolicy {
        name: cnp.metadata.name.clone().unwrap_or_default(),
        tier,
        priority,
        namespaces,
        pods,
        ingress,
        egress,
    })
}

/// Checks every policy; those that fail come back with their error and what they would
/// have selected, so that those pods can be closed.
#[must_use]
pub fn parse_all(
    policies: &[ClusterNetworkPolicy],
) -> (Vec<ClusterPolicy>, Vec<BrokenClusterPolicy>) {
    let mut ok = Vec::new();
    let mut broken = Vec::new();
    for cnp in policies {
        match parse(cnp) {
            Ok(p) => ok.push(p),
            Err(error) => {
                let spec = cnp.spec.as_ref();
                broken.push(BrokenClusterPolicy {
                    name: cnp.metadata.name.clone().unwrap_or_default(),
                    subject: spec.and_then(|s| subject(s.subject.as_ref()).ok()),
                    ingress: spec.is_none_or(|s| !s.ingress.is_empty()),
                    egress: spec.is_none_or(|s| !s.egress.is_empty()),
                    error,
                });
            }
        }
    }
    // Evaluation order: by tier, priority, then name (the API leaves policies of one
    // priority unordered; the name makes it the same on every node).
    ok.sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
    (ok, broken)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::panic, reason = "tests")]
mod tests {
    use std::net::IpAddr;

    use k8s_openapi::api::{
        core::v1::{Namespace, Pod},
        networking::v1::NetworkPolicy,
    };
    use serde_json::{json, Value};

    use super::*;
    use crate::policy::{cluster::proto, compile, parse_all as parse_network, Policies, Verdicts};

    /// Namespaces `x` and `y` (label `ns=<name>`), pods `a` (10.0.0.1, named port
    /// `web` 80/TCP) and `b` (10.0.0.2) in `x`, `c` (10.0.1.3) in `y`.
    fn cluster() -> Cluster {
        let ns = |n: &str| -> Namespace {
            serde_json::from_value(json!({"metadata": {"name": n, "labels": {"ns": n}}})).unwrap()
        };
        let pod = |ns: &str, n: &str, ip: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": n, "labels": {"pod": n}},
                "spec": {"containers": [{"name": "c", "ports": [
                    {"name": "web", "containerPort": 80, "protocol": "TCP"}]}]},
                "status": {"podIP": ip, "podIPs": [{"ip": ip}], "phase": "Running"}
            }))
            .unwrap()
        };
        Cluster::from_api(
            &[ns("x"), ns("y")],
            &[
                pod("x", "a", "10.0.0.1"),
                pod("x", "b", "10.0.0.2"),
                pod("y", "c", "10.0.1.3"),
            ],
        )
    }

    fn cnp(
        name: &str,
        tier: &str,
        priority: i32,
        subject: Value,
        ingress: Value,
    ) -> ClusterNetworkPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"tier": tier, "priority": priority, "subject": subject, "ingress": ingress}
        }))
        .unwrap()
    }

    fn np(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}))
            .unwrap()
    }

    /// Whether pod `x/a` admits `from` on TCP `port`, with these policies.
    fn a_admits(
        cnps: &[ClusterNetworkPolicy],
        nps: &[NetworkPolicy],
        from: &str,
        port: u16,
    ) -> bool {
        let c = cluster();
        let (tiered, broken_tiered) = parse_all(cnps);
        assert!(broken_tiered.is_empty(), "{broken_tiered:?}");
        let (network, broken) = parse_network(nps);
        let all = Policies {
            network: &network,
            broken: &broken,
            cluster: &tiered,
            broken_cluster: &broken_tiered,
        };
        let pod = c.pod("x", "a").unwrap();
        let from: IpAddr = from.parse().unwrap();
        match compile(&c, &all, pod).ingress {
            Verdicts::Open => true,
            Verdicts::Closed(why) => panic!("closed: {why}"),
            Verdicts::Enforced(rs) => rs.admits(from, proto::TCP, port),
        }
    }

    fn all_of_x() -> Value {
        json!({"namespaces": {"matchLabels": {"ns": "x"}}})
    }

    fn from_ns(ns: &str, action: &str) -> Value {
        json!({"action": action, "from": [{"namespaces": {"matchLabels": {"ns": ns}}}]})
    }

    const C: &str = "10.0.1.3";
    const B: &str = "10.0.0.2";

    #[test]
    fn admin_deny_overrides_a_network_policy_that_admits() {
        let allow_all = np("x", "all", json!({"podSelector": {}, "ingress": [{}]}));
        let deny_y = cnp(
            "deny-y",
            "Admin",
            10,
            all_of_x(),
            json!([from_ns("y", "Deny")]),
        );
        assert!(a_admits(&[], std::slice::from_ref(&allow_all), C, 80));
        assert!(!a_admits(
            std::slice::from_ref(&deny_y),
            &[allow_all],
            C,
            80
        ));
        assert!(
            a_admits(&[deny_y], &[], B, 80),
            "other peers fall through to allow"
        );
    }

    #[test]
    fn admin_pass_hands_the_decision_to_network_policy() {
        let pass_y = cnp(
            "pass-y",
            "Admin",
            5,
            all_of_x(),
            json!([from_ns("y", "Pass")]),
        );
        let deny_y = cnp(
            "deny-y",
            "Admin",
            10,
            all_of_x(),
            json!([from_ns("y", "Deny")]),
        );
        let only_x = np(
            "x",
            "only-x",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
        );
        // Pass first: the lower-precedence Deny is skipped, NetworkPolicy decides.
        assert!(a_admits(&[pass_y.clone(), deny_y.clone()], &[], C, 80));
        assert!(!a_admits(
            &[pass_y.clone(), deny_y.clone()],
            std::slice::from_ref(&only_x),
            C,
            80
        ));
        assert!(a_admits(&[pass_y, deny_y], &[only_x], B, 80));
    }

    #[test]
    fn priority_then_written_order_decides_within_the_admin_tier() {
        let accept = cnp(
            "accept-y",
            "Admin",
            1,
            all_of_x(),
            json!([from_ns("y", "Accept")]),
        );
        let deny = cnp(
            "deny-y",
            "Admin",
            2,
            all_of_x(),
            json!([from_ns("y", "Deny")]),
        );
        assert!(a_admits(&[deny.clone(), accept.clone()], &[], C, 80));
        let accept_later = cnp(
            "accept-y",
            "Admin",
            3,
            all_of_x(),
            json!([from_ns("y", "Accept")]),
        );
        assert!(!a_admits(&[deny, accept_later], &[], C, 80));
        let both = cnp(
            "both",
            "Admin",
            1,
            all_of_x(),
            json!([
                {"action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
                from_ns("y", "Accept"),
            ]),
        );
        assert!(!a_admits(std::slice::from_ref(&both), &[], C, 80));
        assert!(a_admits(&[both], &[], C, 81));
    }

    #[test]
    fn baseline_holds_only_where_no_network_policy_selects_the_pod() {
        let deny_y = cnp(
            "deny-y",
            "Baseline",
            0,
            all_of_x(),
            json!([from_ns("y", "Deny")]),
        );
        assert!(!a_admits(std::slice::from_ref(&deny_y), &[], C, 80));
        let allow_y = np(
            "x",
            "allow-y",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        );
        assert!(a_admits(&[deny_y], &[allow_y], C, 80));
    }

    #[test]
    fn a_rule_with_an_unknown_peer_fails_closed() {
        let unknown_accept = cnp(
            "a",
            "Baseline",
            0,
            all_of_x(),
            json!([{"action": "Accept", "from": [{"someNewPeer": {}}]}, from_ns("x", "Deny")]),
        );
        assert!(
            !a_admits(&[unknown_accept], &[], B, 80),
            "the Accept matches nothing"
        );
        let unknown_deny = cnp(
            "d",
            "Admin",
            0,
            all_of_x(),
            json!([{"action": "Pass", "from": [{"someNewPeer": {}}]}]),
        );
        assert!(
            !a_admits(std::slice::from_ref(&unknown_deny), &[], B, 80),
            "the Pass denies everything"
        );
        assert!(!a_admits(&[unknown_deny], &[], C, 443));
    }

    #[test]
    fn a_destination_named_port_is_the_pods_own() {
        let web = cnp(
            "web",
            "Admin",
            0,
            all_of_x(),
            json!([{"action": "Deny", "from": [{"namespaces": {}}],
                    "protocols": [{"destinationNamedPort": "web"}]}]),
        );
        assert!(!a_admits(std::slice::from_ref(&web), &[], C, 80));
        assert!(a_admits(&[web], &[], C, 81));
    }

    #[test]
    fn a_refusal_names_the_tier_and_the_rule_that_decided() {
        let c = cluster();
        let raw = [
            cnp(
                "deny-y",
                "Admin",
                10,
                all_of_x(),
                json!([
                    {"name": "no-y", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}]}
                ]),
            ),
            cnp(
                "base",
                "Baseline",
                0,
                all_of_x(),
                json!([from_ns("x", "Deny")]),
            ),
        ];
        let (tiered, broken) = parse_all(&raw);
        assert!(broken.is_empty());
        let all = Policies {
            cluster: &tiered,
            ..Policies::default()
        };
        let compiled = compile(&c, &all, c.pod("x", "a").unwrap());
        let Verdicts::Enforced(rs) = &compiled.ingress else {
            panic!("{:?}", compiled.ingress)
        };
        let why = |from: &str| {
            crate::policy::classes::refusal(
                rs,
                &compiled.ingress_classes,
                from.parse().unwrap(),
                proto::TCP,
                80,
            )
        };
        assert_eq!(why(C).as_deref(), Some("Admin tier: Deny by deny-y/no-y"));
        assert_eq!(why(B).as_deref(), Some("Baseline tier: Deny by base"));
        assert_eq!(why("192.0.2.1"), None, "admitted");
        assert_eq!(
            compiled.ingress_policies,
            ["clusternetworkpolicy/deny-y", "clusternetworkpolicy/base"]
        );
    }

    #[test]
    fn what_the_api_refuses_is_an_error_naming_the_field() {
        let bad = |spec: Value| {
            parse(
                &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap(),
            )
            .unwrap_err()
        };
        let subject = all_of_x();
        assert!(
            bad(json!({"tier": "Middle", "priority": 1, "subject": subject})).contains("spec.tier")
        );
        assert!(
            bad(json!({"tier": "Admin", "priority": 1001, "subject": subject}))
                .contains("spec.priority")
        );
        assert!(
            bad(json!({"tier": "Admin", "priority": 1, "subject": subject,
            "egress": [{"action": "Deny", "to": [{"domainNames": ["example.com"]}]}]}))
            .contains("only for Accept")
        );
        assert!(
            bad(json!({"tier": "Admin", "priority": 1, "subject": subject,
            "egress": [{"action": "Accept", "to": [{"networks": ["10.0.0.0/33"]}]}]}))
            .contains("spec.egress[0].to[0].networks[0]")
        );
        assert!(domain_name("*.Kubernetes.io.").is_ok_and(|n| n == "*.kubernetes.io"));
        assert!(domain_name("kubernetes").is_err());
    }
}
