//! NetworkPolicy: the compiler's rule sets, looked up as the datapath looks them up,
//! against the upstream e2e suite's expectations and against the reference model.
//!
//! - Every case of the upstream suite (`testbed/src/netpol/cases.rs`): the model must give
//!   each probe's expected reachability (so the model is right where upstream says what
//!   is right), and so must the compiled rule sets, over IPv4 and, where the case does
//!   not name IPv4 blocks, IPv6.
//! - Generated scenarios (random labels, selectors, ipBlocks with excepts, ports, ranges
//!   and named ports, policy types, several policies per pod): the compiled rule sets
//!   must agree with the model on every pod pair, port, protocol and family, and on
//!   addresses outside the cluster.
//! - Generated scenarios of cluster policies (Admin and Baseline tiers, priorities,
//!   Accept/Deny/Pass, namespace, pod and network peers, ports, ranges and destination
//!   named ports, peers that fail closed) mixed with NetworkPolicies, the same way.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use cni_ebpf::policy::{
    cluster_network_policy::{self, ClusterNetworkPolicy},
    compile, parse_all, Cluster, PodView, Policies, Verdicts,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};
use testbed::netpol::{
    cases::{cases, Change},
    model, pod_string, port_name, Protocol, Universe, NAMESPACES, PODS, PROTOCOLS,
};

/// The compiled policies of a cluster, looked up as the datapath does.
pub(crate) struct Compiled {
    cluster: Cluster,
    pods: BTreeMap<String, (Verdicts, Verdicts)>,
}

impl Compiled {
    fn new(universe: &Universe, policies: &[NetworkPolicy]) -> Self {
        Self::with_cluster_policies(universe, policies, &[])
    }

    /// [`Self::new`] with cluster policies too (and the universe's Nodes, which node
    /// peers pick).
    pub(crate) fn with_cluster_policies(
        universe: &Universe,
        policies: &[NetworkPolicy],
        cluster_policies: &[ClusterNetworkPolicy],
    ) -> Self {
        let mut cluster = Cluster::from_api(&universe.namespaces, &universe.pods);
        for node in &universe.nodes {
            cluster.apply_node(node);
        }
        let (parsed, broken) = parse_all(policies);
        let (tiered, broken_tiered) = cluster_network_policy::parse_all(cluster_policies);
        assert!(
            broken.is_empty() && broken_tiered.is_empty(),
            "policies the compiler refused: {:?} {:?}",
            broken.iter().map(|b| &b.error).collect::<Vec<_>>(),
            broken_tiered.iter().map(|b| &b.error).collect::<Vec<_>>()
        );
        let all = Policies {
            network: &parsed,
            broken: &broken,
            cluster: &tiered,
            broken_cluster: &broken_tiered,
        };
        let pods = cluster
            .pods()
            .map(|p| {
                let c = compile(&cluster, &all, p);
                (pod_string(&p.namespace, &p.name), (c.ingress, c.egress))
            })
            .collect();
        Self { cluster, pods }
    }

    fn pod_of(&self, ip: IpAddr) -> Option<&PodView> {
        self.cluster
            .pods()
            .find(|p| p.is_peer() && p.ips.contains(&ip))
    }

    /// The compiled verdicts of the pods at `src` (egress) and `dst` (ingress).
    pub(crate) fn explain(&self, src: IpAddr, dst: IpAddr) -> String {
        let of = |ip: IpAddr, egress: bool| {
            self.pod_of(ip).map_or_else(
                || format!("{ip} is outside"),
                |p| {
                    let v = &self.pods[&pod_string(&p.namespace, &p.name)];
                    format!(
                        "{}/{} {}: {:?}",
                        p.namespace,
                        p.name,
                        if egress { "egress" } else { "ingress" },
                        if egress { &v.1 } else { &v.0 }
                    )
                },
            )
        };
        format!("{}; {}", of(src, true), of(dst, false))
    }

    pub(crate) fn allowed(&self, src: IpAddr, dst: IpAddr, proto: Protocol, port: u16) -> bool {
        let judge = |v: &Verdicts, peer: IpAddr| match v {
            Verdicts::Open => true,
            Verdicts::Closed(_) => false,
            Verdicts::Enforced(rs) => rs.admits(peer, proto.number(), port),
        };
        let egress = self
            .pod_of(src)
            .is_none_or(|p| judge(&self.pods[&pod_string(&p.namespace, &p.name)].1, dst));
        let ingress = self
            .pod_of(dst)
            .is_none_or(|p| judge(&self.pods[&pod_string(&p.namespace, &p.name)].0, src));
        egress && ingress
    }
}

fn pod_ip(universe: &Universe, ns_pod: &str, v6: bool) -> IpAddr {
    let (ns, name) = ns_pod.split_once('/').unwrap_or_default();
    let pod = universe
        .pod(ns, name)
        .unwrap_or_else(|| panic!("no pod {ns_pod}"));
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == v6)
        .unwrap_or_else(|| panic!("{ns_pod} has no address of that family"))
}

fn apply_change(universe: &mut Universe, policies: &mut Vec<NetworkPolicy>, change: &Change) {
    let key = |p: &NetworkPolicy| (p.metadata.namespace.clone(), p.metadata.name.clone());
    match change {
        Change::Apply(np) => {
            policies.retain(|p| key(p) != key(np));
            policies.push(np.clone());
        }
        Change::Delete { namespace, name } => {
            policies.retain(|p| key(p) != (Some(namespace.clone()), Some(name.clone())));
        }
        Change::NamespaceLabels { namespace, labels } => {
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            universe.set_namespace_labels(namespace, &labels);
        }
        Change::PodLabels {
            namespace,
            pod,
            labels,
        } => {
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            universe.set_pod_labels(namespace, pod, &labels);
        }
    }
}

fn names_ip_block(policies: &[NetworkPolicy]) -> bool {
    policies.iter().any(|p| {
        serde_json::to_string(p)
            .unwrap_or_default()
            .contains("ipBlock")
    })
}

/// Runs every upstream case through `decide` (the model or the compiler) and returns
/// the mismatches, one line each.
fn run_upstream(
    decide: impl Fn(&Universe, &[NetworkPolicy], IpAddr, IpAddr, Protocol, u16) -> bool,
) -> (usize, Vec<String>) {
    let mut probes = 0;
    let mut wrong = Vec::new();
    for case in cases(&Universe::upstream()) {
        let mut universe = Universe::upstream();
        let mut policies = Vec::new();
        for (si, step) in case.steps.iter().enumerate() {
            for change in &step.changes {
                apply_change(&mut universe, &mut policies, change);
            }
            let families: &[bool] = if names_ip_block(&policies) {
                &[false]
            } else {
                &[false, true]
            };
            for probe in &step.probes {
                for ((from, to), expected) in &probe.reachability.expected {
                    if from == to {
                        continue;
                    }
                    for v6 in families {
                        probes += 1;
                        let src = pod_ip(&universe, from, *v6);
                        let dst = pod_ip(&universe, to, *v6);
                        let got =
                            decide(&universe, &policies, src, dst, probe.protocol, probe.port);
                        if got != *expected {
                            wrong.push(format!(
                                "{:?} step {si}: {from} -> {to} {}/{} over {}: expected {expected}, got {got}",
                                case.name,
                                probe.protocol.api_name(),
                                probe.port,
                                if *v6 { "IPv6" } else { "IPv4" },
                            ));
                        }
                    }
                }
            }
        }
    }
    (probes, wrong)
}

#[test]
fn upstream_cases_agree_with_the_model() {
    let (probes, wrong) = run_upstream(model::allowed);
    assert!(probes > 5000, "only {probes} probes");
    assert!(
        wrong.is_empty(),
        "{} of {probes} probes:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn upstream_cases_compile_to_what_they_expect() {
    let (probes, wrong) = run_upstream(|u, p, src, dst, proto, port| {
        Compiled::new(u, p).allowed(src, dst, proto, port)
    });
    assert!(probes > 5000, "only {probes} probes");
    assert!(
        wrong.is_empty(),
        "{} of {probes} probes:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Every ordered pair of distinct addresses of one family among the pods' of `universe`
/// (both families) and `outside`.
fn end_pairs(universe: &Universe, outside: &[IpAddr]) -> Vec<(IpAddr, IpAddr)> {
    let mut ends: Vec<IpAddr> = Vec::new();
    for ns in NAMESPACES {
        for pod in PODS {
            ends.push(pod_ip(universe, &pod_string(ns, pod), false));
            ends.push(pod_ip(universe, &pod_string(ns, pod), true));
        }
    }
    ends.extend(outside);
    let mut pairs = Vec::new();
    for src in &ends {
        for dst in &ends {
            if src != dst && src.is_ipv6() == dst.is_ipv6() {
                pairs.push((*src, *dst));
            }
        }
    }
    pairs
}

/// A small deterministic generator (xorshift64*), so a failing scenario can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

const TIERS: [&str; 3] = ["web", "db", "cache"];

fn selector(rng: &mut Rng, key: &str, values: &[&str]) -> Value {
    match rng.below(6) {
        0 => json!({}),
        1 => json!({"matchLabels": {key: rng.pick(values)}}),
        2 => json!({"matchExpressions": [{"key": key, "operator": "In",
            "values": [rng.pick(values), rng.pick(values)]}]}),
        3 => json!({"matchExpressions": [{"key": key, "operator": "NotIn",
            "values": [rng.pick(values)]}]}),
        4 => json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
        _ => json!({"matchLabels": {"tier": rng.pick(&TIERS)},
            "matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}),
    }
}

fn ip_block(rng: &mut Rng) -> Value {
    let v6 = rng.chance(30);
    let (cidr, excepts): (&str, &[&str]) = match (v6, rng.below(4)) {
        (false, 0) => ("10.244.0.0/16", &["10.244.1.12/32", "10.244.1.16/30"]),
        (false, 1) => ("10.244.1.0/28", &["10.244.1.10/31"]),
        (false, 2) => ("0.0.0.0/0", &["10.244.0.0/16"]),
        (false, _) => ("192.0.2.0/24", &[]),
        (true, 0) => ("fd00:10:244::/48", &["fd00:10:244:1::c/126"]),
        (true, 1) => ("::/0", &["fd00:10:244:1::/64"]),
        (true, _) => ("fd00:10:244:1::10/124", &["fd00:10:244:1::11/128"]),
    };
    let n = rng.below(excepts.len() + 1);
    json!({"ipBlock": {"cidr": cidr, "except": excepts[..n]}})
}

fn peer(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => json!({"podSelector": selector(rng, "pod", &PODS)}),
        1 => json!({"namespaceSelector": selector(rng, "ns", &NAMESPACES)}),
        2 => json!({"podSelector": selector(rng, "pod", &PODS),
            "namespaceSelector": selector(rng, "ns", &NAMESPACES)}),
        _ => ip_block(rng),
    }
}

fn port(rng: &mut Rng) -> Value {
    let protocol = rng.pick(&PROTOCOLS).api_name();
    match rng.below(6) {
        0 => json!({"protocol": protocol}),
        1 => json!({"protocol": protocol, "port": rng.pick(&[80, 81, 82])}),
        2 => json!({"port": 80, "endPort": 81}),
        3 => json!({"protocol": protocol, "port": 79, "endPort": rng.pick(&[80, 1000])}),
        _ => {
            // Sometimes a name whose protocol differs from the rule's.
            let named = rng.pick(&PROTOCOLS);
            json!({"protocol": protocol, "port": port_name(rng.pick(&[80, 81]), named)})
        }
    }
}

fn rules(rng: &mut Rng, peer_key: &str) -> Value {
    let n = rng.below(3);
    (0..n)
        .map(|_| {
            let mut rule = serde_json::Map::new();
            if rng.chance(75) {
                let peers: Vec<Value> = (0..1 + rng.below(3)).map(|_| peer(rng)).collect();
                rule.insert(peer_key.to_owned(), Value::Array(peers));
            }
            if rng.chance(70) {
                let ports: Vec<Value> = (0..1 + rng.below(3)).map(|_| port(rng)).collect();
                rule.insert("ports".to_owned(), Value::Array(ports));
            }
            Value::Object(rule)
        })
        .collect()
}

fn policy(rng: &mut Rng, i: usize) -> NetworkPolicy {
    let mut spec = serde_json::Map::new();
    spec.insert("podSelector".to_owned(), selector(rng, "pod", &PODS));
    if rng.chance(80) {
        spec.insert("ingress".to_owned(), rules(rng, "from"));
    }
    if rng.chance(60) {
        spec.insert("egress".to_owned(), rules(rng, "to"));
    }
    match rng.below(4) {
        0 => {}
        1 => {
            spec.insert("policyTypes".to_owned(), json!(["Ingress"]));
        }
        2 => {
            spec.insert("policyTypes".to_owned(), json!(["Egress"]));
        }
        _ => {
            spec.insert("policyTypes".to_owned(), json!(["Ingress", "Egress"]));
        }
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": rng.pick(&NAMESPACES), "name": format!("p{i}")},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("generated policy: {e}"))
}

/// The seed and number of the generated scenarios (the compiler's check and the
/// end-to-end one run the same).
const GENERATED_SEED: u64 = 0x5eed_cafe_f00d_0001;
const GENERATED_ROUNDS: usize = 80;

/// Random labels on `base`'s namespaces and pods, and 1 to 7 random policies.
fn scenario(rng: &mut Rng, base: &Universe) -> (Universe, Vec<NetworkPolicy>) {
    let mut universe = base.clone();
    for ns in NAMESPACES {
        if rng.chance(40) {
            universe.set_namespace_labels(ns, &[("ns", ns), ("tier", rng.pick(&TIERS))]);
        }
        for pod in PODS {
            match rng.below(4) {
                0 => universe.set_pod_labels(ns, pod, &[("pod", pod), ("tier", rng.pick(&TIERS))]),
                1 => universe.set_pod_labels(
                    ns,
                    pod,
                    &[("pod", pod), ("tier", rng.pick(&TIERS)), ("team", "t")],
                ),
                _ => {}
            }
        }
    }
    let policies = (0..1 + rng.below(7)).map(|i| policy(rng, i)).collect();
    (universe, policies)
}

#[test]
fn generated_policies_compile_to_what_the_model_allows() {
    let outside: [IpAddr; 4] = [
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
        IpAddr::V4(Ipv4Addr::new(10, 244, 1, 200)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0x13)),
    ];
    let mut rng = Rng(GENERATED_SEED);
    let mut total_policies = 0;
    let mut checked = 0u64;
    let mut denied = 0u64;
    for round in 0..GENERATED_ROUNDS {
        let (universe, policies) = scenario(&mut rng, &Universe::upstream());
        total_policies += policies.len();
        let compiled = Compiled::new(&universe, &policies);
        for (src, dst) in &end_pairs(&universe, &outside) {
            for proto in PROTOCOLS {
                for port in [79, 80, 81, 82] {
                    let want = model::allowed(&universe, &policies, *src, *dst, proto, port);
                    let got = compiled.allowed(*src, *dst, proto, port);
                    checked += 1;
                    denied += u64::from(!want);
                    assert_eq!(
                        got,
                        want,
                        "round {round}: {src} -> {dst} {}/{port}: model says {want}\n\
                             compiled: {}\npolicies: {}",
                        proto.api_name(),
                        compiled.explain(*src, *dst),
                        serde_json::to_string(&policies).unwrap_or_default()
                    );
                }
            }
        }
    }
    assert!(total_policies >= 200, "only {total_policies} policies");
    // The scenarios must exercise both outcomes substantially.
    assert!(
        denied * 10 > checked && denied * 10 < checked * 9,
        "{denied} of {checked} denied"
    );
}

fn cluster_peer(rng: &mut Rng, egress: bool) -> Value {
    match rng.below(if egress { 6 } else { 4 }) {
        0 => json!({"namespaces": selector(rng, "ns", &NAMESPACES)}),
        1 | 2 => json!({"pods": {"namespaceSelector": selector(rng, "ns", &NAMESPACES),
            "podSelector": selector(rng, "pod", &PODS)}}),
        3 if rng.chance(15) => json!({"someFutureField": {}}),
        3 => json!({"pods": {"namespaceSelector": {}, "podSelector": selector(rng, "pod", &PODS)}}),
        _ => {
            let nets: &[&str] = rng.pick(&[
                &["10.244.0.0/16"][..],
                &["10.244.1.0/28", "fd00:10:244:1::10/124"],
                &["0.0.0.0/0"],
                &["::/0", "192.0.2.0/24"],
            ]);
            json!({"networks": nets})
        }
    }
}

fn cluster_protocol(rng: &mut Rng) -> Value {
    let key = rng.pick(&["tcp", "udp", "sctp"]);
    match rng.below(5) {
        0 => json!({key: {}}),
        1 => json!({key: {"destinationPort": {"number": rng.pick(&[80, 81, 82])}}}),
        2 => {
            json!({key: {"destinationPort": {"range": {"start": 79, "end": rng.pick(&[80, 81, 1000])}}}})
        }
        _ => json!({"destinationNamedPort": port_name(rng.pick(&[80, 81]), rng.pick(&PROTOCOLS))}),
    }
}

fn cluster_rules(rng: &mut Rng, egress: bool) -> Value {
    let n = rng.below(4);
    (0..n)
        .map(|_| {
            let mut rule = serde_json::Map::new();
            rule.insert("name".to_owned(), json!(format!("r{}", rng.below(100))));
            rule.insert(
                "action".to_owned(),
                json!(rng.pick(&["Accept", "Deny", "Pass"])),
            );
            let peers: Vec<Value> = (0..1 + rng.below(2))
                .map(|_| cluster_peer(rng, egress))
                .collect();
            rule.insert(
                (if egress { "to" } else { "from" }).to_owned(),
                Value::Array(peers),
            );
            if rng.chance(60) {
                let protocols: Vec<Value> = (0..1 + rng.below(2))
                    .map(|_| cluster_protocol(rng))
                    .collect();
                rule.insert("protocols".to_owned(), Value::Array(protocols));
            }
            Value::Object(rule)
        })
        .collect()
}

fn cluster_policy(rng: &mut Rng, i: usize) -> Value {
    let subject = if rng.chance(50) {
        json!({"namespaces": selector(rng, "ns", &NAMESPACES)})
    } else {
        json!({"pods": {"namespaceSelector": selector(rng, "ns", &NAMESPACES),
            "podSelector": selector(rng, "pod", &PODS)}})
    };
    let mut spec = serde_json::Map::new();
    spec.insert("tier".to_owned(), json!(rng.pick(&["Admin", "Baseline"])));
    // Few distinct priorities, so that equal ones (ordered by name) come up.
    spec.insert("priority".to_owned(), json!(rng.pick(&[0, 10, 10, 500])));
    spec.insert("subject".to_owned(), subject);
    if rng.chance(80) {
        spec.insert("ingress".to_owned(), cluster_rules(rng, false));
    }
    if rng.chance(60) {
        spec.insert("egress".to_owned(), cluster_rules(rng, true));
    }
    json!({"metadata": {"name": format!("c{i}")}, "spec": spec})
}

/// Generated scenarios of cluster policies mixed with NetworkPolicies.
const CLUSTER_ROUNDS: usize = 60;

#[test]
fn generated_cluster_policies_compile_to_what_the_model_allows() {
    let outside: [IpAddr; 2] = [
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
    ];
    let mut rng = Rng(GENERATED_SEED ^ 0xc1u64);
    let (mut total, mut checked, mut denied) = (0, 0u64, 0u64);
    for round in 0..CLUSTER_ROUNDS {
        let (universe, mut policies) = scenario(&mut rng, &Universe::upstream());
        policies.truncate(rng.below(3));
        let raw: Vec<Value> = (0..1 + rng.below(6))
            .map(|i| cluster_policy(&mut rng, i))
            .collect();
        total += policies.len() + raw.len();
        let cnps: Vec<ClusterNetworkPolicy> = raw
            .iter()
            .map(|v| serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let compiled = Compiled::with_cluster_policies(&universe, &policies, &cnps);
        for (src, dst) in &end_pairs(&universe, &outside) {
            for proto in PROTOCOLS {
                for port in [80, 81, 82] {
                    let want = model::allowed_with_cluster_policies(
                        &universe, &policies, &raw, *src, *dst, proto, port,
                    );
                    let got = compiled.allowed(*src, *dst, proto, port);
                    checked += 1;
                    denied += u64::from(!want);
                    assert_eq!(
                        got,
                        want,
                        "round {round}: {src} -> {dst} {}/{port}: model says {want}\n\
                             compiled: {}\ncluster policies: {}\npolicies: {}",
                        proto.api_name(),
                        compiled.explain(*src, *dst),
                        serde_json::to_string(&raw).unwrap_or_default(),
                        serde_json::to_string(&policies).unwrap_or_default()
                    );
                }
            }
        }
    }
    assert!(total >= 200, "only {total} policies");
    assert!(
        denied * 10 > checked && denied * 10 < checked * 9,
        "{denied} of {checked} denied"
    );
}

/// The changes that give the initial universe `labelled`'s labels.
fn label_changes(labelled: &Universe) -> Vec<Change> {
    let labels =
        |l: &Option<BTreeMap<String, String>>| l.clone().unwrap_or_default().into_iter().collect();
    let mut changes: Vec<Change> = labelled
        .namespaces
        .iter()
        .map(|ns| Change::NamespaceLabels {
            namespace: ns.metadata.name.clone().unwrap_or_default(),
            labels: labels(&ns.metadata.labels),
        })
        .collect();
    changes.extend(labelled.pods.iter().map(|p| Change::PodLabels {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        pod: p.metadata.name.clone().unwrap_or_default(),
        labels: labels(&p.metadata.labels),
    }));
    changes
}

/// Generated scenarios of cluster policies mixed with NetworkPolicies whose end-to-end
/// probes run on two nodes with the real agents.
const CLUSTER_E2E_ROUNDS: usize = 8;

/// Cluster policies end to end on two nodes: the agents run before the CRD exists (they
/// say so once each, and enforce NetworkPolicy meanwhile), then it is installed, and for
/// generated scenarios of cluster policies and NetworkPolicies put through the API, every
/// pod probes every other on both ports, all three protocols and both families, by the
/// pod's address and through its Service (kube-proxy's nftables rules), and each probe
/// must find what the model says.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn generated_cluster_policies_hold_end_to_end_on_two_nodes() {
    use testbed::datapath::wait_until;
    use testbed::kubeproxy::Mode;
    let mut world = MatrixWorld::new("cnp_gen", false, MatrixProxy::KubeProxy(Mode::Nftables));
    let said = |world: &MatrixWorld| {
        world
            .cluster
            .nodes()
            .iter()
            .map(|n| {
                std::fs::read_to_string(n.dir().join("agent.log"))
                    .unwrap_or_default()
                    .matches("does not serve ClusterNetworkPolicy")
                    .count()
            })
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(std::time::Duration::from_secs(5), || said(&world) == [1, 1]),
        "each agent says once that the CRD is missing: {:?}\n{}",
        said(&world),
        world.agent_logs()
    );
    // Meanwhile NetworkPolicy holds.
    let mut universe = world.initial.clone();
    let mut policies = Vec::new();
    let deny_x = Change::Apply(
        serde_json::from_value(json!({"metadata": {"namespace": "x", "name": "deny"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}))
        .unwrap_or_else(|e| panic!("{e}")),
    );
    let mut wrong = world.step(
        "without the CRD",
        &mut universe,
        &mut policies,
        &[deny_x],
        &BTreeMap::new(),
    );
    world.reset(&policies);
    world.api.install_crd("clusternetworkpolicies");
    let started = std::time::Instant::now();
    let mut rng = Rng(GENERATED_SEED ^ 0xe2e);
    let mut total = 0;
    for round in 0..CLUSTER_E2E_ROUNDS {
        let (labelled, mut generated) = scenario(&mut rng, &world.initial);
        generated.truncate(rng.below(3));
        let raw: Vec<Value> = (0..1 + rng.below(6))
            .map(|i| cluster_policy(&mut rng, i))
            .collect();
        total += generated.len() + raw.len();
        let mut changes = label_changes(&labelled);
        changes.extend(generated.into_iter().map(Change::Apply));
        world.set_cluster_policies(raw);
        let mut universe = world.initial.clone();
        let mut policies = Vec::new();
        let found = world.step(
            &format!("round {round}"),
            &mut universe,
            &mut policies,
            &changes,
            &BTreeMap::new(),
        );
        if !found.is_empty() {
            wrong.push(format!(
                "{}\ncluster policies: {}\npolicies: {}",
                found.join("\n"),
                serde_json::to_string(&world.cluster_policies).unwrap_or_default(),
                serde_json::to_string(&policies).unwrap_or_default()
            ));
        }
        world.reset(&policies);
    }
    eprintln!(
        "{CLUSTER_E2E_ROUNDS} scenarios, {total} policies, {} probes ({} retried) in {:?}",
        world.probes,
        world.retried,
        started.elapsed()
    );
    assert!(
        wrong.is_empty(),
        "probes that disagree with the model:\n{}\n{}",
        wrong.join("\n"),
        world.agent_logs()
    );
}

/// With `sameNodeFastPath: false`, same-node pod → pod goes through the node's netfilter,
/// so an add-on enforcer's FORWARD rule that drops one pod pair holds; with the fast path
/// on (the default), the same rule never sees that traffic (the datapath's own
/// NetworkPolicy is what applies there).
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn an_add_on_enforcers_forward_rules_see_same_node_traffic_when_the_fast_path_is_off() {
    use testbed::datapath::{add, greet, masq_conf, pod_ip, Mode, TaggedServer};
    use testbed::SimNode;

    for fast_path in [false, true] {
        let node = SimNode::new(if fast_path { "np_fast" } else { "np_nf" });
        let conf = masq_conf(&node).set("sameNodeFastPath", json!(fast_path));
        let (a, b, c) = (node.pod("a"), node.pod("b"), node.pod("c"));
        let (ra, rb, rc) = (
            add(&node, &a, &conf),
            add(&node, &b, &conf),
            add(&node, &c, &conf),
        );
        let (ipa, ipb, ipc) = (pod_ip(&ra), pod_ip(&rb), pod_ip(&rc));
        let _sb = TaggedServer::start(b.netns(), 8080, "b", Mode::Greet);
        let _sc = TaggedServer::start(c.netns(), 8080, "c", Mode::Greet);
        // The enforcer's verdict for the pair a → b, as kube-router writes one.
        let out = node.exec(&[
            "iptables", "-A", "FORWARD", "-s", &ipa, "-d", &ipb, "-p", "tcp", "-j", "DROP",
        ]);
        assert!(out.status.success(), "iptables: {}", out.stderr);
        let to_b = greet(a.netns(), &format!("{ipb}:8080"));
        let to_c = greet(a.netns(), &format!("{ipc}:8080"));
        assert!(
            to_c.is_ok(),
            "a → c must work (fast path {fast_path}): {to_c:?}"
        );
        if fast_path {
            assert!(
                to_b.is_ok(),
                "the fast path passes the node's FORWARD chain: {to_b:?}"
            );
        } else {
            assert!(
                to_b.is_err(),
                "a → b must be dropped by the FORWARD rule when the fast path is off"
            );
            let counters = node.exec(&["iptables", "-L", "FORWARD", "-v", "-n", "-x"]);
            let text = &counters.stdout;
            let dropped: u64 = text
                .lines()
                .find(|l| l.contains("DROP") && l.contains(&ipb))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            assert!(dropped >= 1, "the rule counted no packet:\n{text}");
        }
        let _ = &ipc;
    }
}

/// Whether a client in `netns` gets the greeting of the server at `addr` within `within`.
fn reaches(netns: &std::path::Path, addr: &str, within: std::time::Duration) -> bool {
    testbed::netpol::probe::greets(netns, addr, within)
}

/// The policy generation in force on the node's network (0: the agent never swapped).
fn generation(node: &testbed::SimNode) -> u32 {
    node.policy_generation()
}

/// A NetworkPolicy object of namespace `x` as the API serves it.
fn policy_object(name: &str, spec: Value) -> Value {
    testbed::netpol::policy_object("x", name, spec)
}

/// The agent against the stand-in API server, on one node with pods of namespace `x`:
/// policies put, changed and deleted through the API take effect within a second; it
/// recovers by itself from a dropped watch, a compacted history (410 Gone) and an API
/// server restart; a pod ADDed under a default-deny policy sends and receives nothing
/// before its own rules are in force; and a killed agent's policy stays in force, its
/// successor changing nothing.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_agent_keeps_the_watched_policies_in_force_and_recovers_by_itself() {
    use std::time::{Duration, Instant};

    use testbed::datapath::{masq_conf, pod_ip, wait_until, Mode, TaggedServer};
    use testbed::{ApiServer, Background, SimNode, EXT_IP4};

    const SOON: Duration = Duration::from_millis(300);
    let node = SimNode::new("np_agent");
    let api = ApiServer::start(node.ext_netns(), EXT_IP4);
    let ns = testbed::netpol::namespace("x", &[("ns", "x")]);
    api.put("namespaces", serde_json::to_value(&ns).unwrap_or_default());
    let conf = masq_conf(&node);
    let add = |name: &str| {
        let pod = node.pod(name);
        let env = pod
            .env("eth0")
            .with_args(&format!("K8S_POD_NAMESPACE=x;K8S_POD_NAME={name}"));
        let ip = pod_ip(&node.exec_plugin("ADD", &env, &conf.plugin()).result());
        (pod, ip)
    };
    let publish = |name: &str, ip: &str| {
        let addr: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"));
        let pod = testbed::netpol::pod("x", name, &[("app", name)], &[addr]);
        api.put("pods", serde_json::to_value(&pod).unwrap_or_default());
    };
    let (a, ipa) = add("a");
    let (b, ipb) = add("b");
    publish("a", &ipa);
    publish("b", &ipb);
    let _sb = TaggedServer::start(b.netns(), 8080, "b", Mode::Greet);
    let _sa = TaggedServer::start(a.netns(), 8080, "a", Mode::Greet);
    let to_b = format!("{ipb}:8080");

    let log = node.dir().join("agent.log");
    let start_agent = || start_agent(&node, &api, &log);
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut agent = start_agent();
    assert!(
        wait_until(Duration::from_secs(10), || generation(&node) >= 1),
        "the agent's first round never came:\n{}",
        agent_log()
    );
    assert!(reaches(a.netns(), &to_b, SOON), "no policy: a reaches b");

    // A policy through the API: b admits only app=c. In force within a second.
    let only_c = policy_object(
        "b-from-c",
        json!({"podSelector": {"matchLabels": {"app": "b"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "c"}}}]}]}),
    );
    let put_at = Instant::now();
    api.put("networkpolicies", only_c.clone());
    assert!(
        wait_until(Duration::from_secs(3), || !reaches(a.netns(), &to_b, SOON)),
        "the policy never came into force:\n{}",
        agent_log()
    );
    let took = put_at.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "API write → enforced took {took:?}"
    );
    assert!(
        reaches(b.netns(), &format!("{ipa}:8080"), SOON),
        "a is not selected"
    );

    // Why a cannot reach b, answered by one command: the policy that selects b, and the
    // refused packets.
    let state = state_dir(&node).display().to_string();
    let inspect = |extra: &[&str]| {
        let mut args = vec!["--state-dir", state.as_str()];
        args.extend_from_slice(extra);
        node.inspect_argv(&args)
    };
    let shown = node.exec(&inspect(&["--pod", "x/b"])).stdout;
    assert!(
        shown.contains("ingress: selected by x/b-from-c"),
        "inspect names the policy:\n{shown}"
    );
    let refused = format!("ingress tcp {ipa}:");
    assert!(
        shown.lines().any(|l| l.contains(&refused)
            && l.contains(&format!("-> {ipb}:8080"))
            && l.ends_with(": no NetworkPolicy rule admits it")),
        "inspect lists a's refused connection and what decided:\n{shown}"
    );
    let doc: Value = serde_json::from_str(&node.exec(&inspect(&["--pod", "x/b", "--json"])).stdout)
        .unwrap_or(Value::Null);
    assert_eq!(
        doc["policy"]["pods"][0]["ingress"]["policies"],
        json!(["x/b-from-c"]),
        "{doc}"
    );
    assert!(
        doc["policy"]["denies"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["source"] == ipa.as_str())),
        "{doc}"
    );
    // `--follow` streams a refusal made after it started.
    let follow_log = node.dir().join("follow.log");
    let follow = Background::spawn_logged(
        node.netns(),
        &inspect(&["--pod", "x/b", "--follow"]),
        &follow_log,
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = std::fs::read_to_string(&follow_log)
        .unwrap_or_default()
        .lines()
        .count();
    assert!(!reaches(a.netns(), &to_b, SOON));
    assert!(
        wait_until(Duration::from_secs(3), || {
            std::fs::read_to_string(&follow_log)
                .unwrap_or_default()
                .lines()
                .skip(before)
                .any(|l| l.contains(&refused))
        }),
        "--follow did not stream the new refusal: {}",
        std::fs::read_to_string(&follow_log).unwrap_or_default()
    );
    drop(follow);
    // The metrics credit the policy with its denials.
    let denied = || {
        testbed::net::metric_value(
            node.netns(),
            AGENT_METRICS,
            "cni_ebpf_policy_verdicts_total",
            &[
                ("policy", "b-from-c"),
                ("direction", "ingress"),
                ("verdict", "denied"),
            ],
        )
    };
    assert!(
        wait_until(Duration::from_secs(4), || denied() >= 2.0),
        "no denials credited to x/b-from-c (found {})",
        denied()
    );

    // The ServiceAccount token rotated (only the new one is accepted from now on) and
    // the watch dropped: the change after it still arrives, over the new token.
    api.rotate_token();
    api.drop_watches();
    let admit_a = policy_object(
        "b-from-c",
        json!({"podSelector": {"matchLabels": {"app": "b"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
    );
    api.put("networkpolicies", admit_a);
    assert!(
        wait_until(Duration::from_secs(5), || reaches(a.netns(), &to_b, SOON)),
        "after a dropped watch:\n{}",
        agent_log()
    );

    // History compacted while the watch is cut: 410 Gone, the agent lists again.
    api.compact();
    api.drop_watches();
    api.put("networkpolicies", only_c.clone());
    api.compact();
    assert!(
        wait_until(Duration::from_secs(8), || !reaches(a.netns(), &to_b, SOON)),
        "after a 410:\n{}",
        agent_log()
    );
    // A list, or a streaming list (a watch that sends the current objects first).
    let policy_lists = || {
        api.requests()
            .iter()
            .filter(|r| {
                [
                    "GET /apis/networking.k8s.io/v1/networkpolicies -> 200",
                    "GET /apis/networking.k8s.io/v1/networkpolicies?watch&sendInitialEvents -> 200",
                ]
                .contains(&r.as_str())
            })
            .count()
    };
    assert!(
        policy_lists() >= 2,
        "the 410 must have made the agent list again: {:?}",
        api.requests()
    );

    // An API server restart: the policy in force stays, and later changes arrive.
    api.restart(Duration::from_millis(1500));
    assert!(
        !reaches(a.netns(), &to_b, SOON),
        "unchanged while the API is away"
    );
    api.delete("networkpolicies", Some("x"), "b-from-c");
    assert!(
        wait_until(Duration::from_secs(10), || reaches(a.netns(), &to_b, SOON)),
        "after an API server restart:\n{}",
        agent_log()
    );

    // Default deny in x, ingress from app=d to a. A new pod d starts closed: nothing it
    // sends passes before its rules are in force, which its Pod object brings.
    let deny = policy_object(
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let from_d = policy_object(
        "a-from-d",
        json!({"podSelector": {"matchLabels": {"app": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "d"}}}]}]}),
    );
    api.put("networkpolicies", deny);
    api.put("networkpolicies", from_d);
    assert!(wait_until(Duration::from_secs(3), || !reaches(
        b.netns(),
        &format!("{ipa}:8080"),
        SOON
    )));
    let (d, ipd) = add("d");
    let to_a = format!("{ipa}:8080");
    let added_at = Instant::now();
    assert!(
        !reaches(d.netns(), &to_a, SOON),
        "d sent before the agent knew it"
    );
    publish("d", &ipd);
    assert!(
        wait_until(Duration::from_secs(3), || reaches(d.netns(), &to_a, SOON)),
        "d never opened:\n{}",
        agent_log()
    );
    eprintln!("ADD → d's policy in force: {:?}", added_at.elapsed());

    // The agent killed: what is in force stays; its successor swaps nothing.
    let before = generation(&node);
    drop(agent);
    assert!(reaches(d.netns(), &to_a, SOON));
    assert!(!reaches(b.netns(), &to_a, SOON));
    agent = start_agent();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        generation(&node),
        before,
        "a restarted agent changed the policy"
    );
    assert!(reaches(d.netns(), &to_a, SOON));
    assert!(!reaches(b.netns(), &to_a, SOON));
    assert!(agent.running(), "the agent exited:\n{}", agent_log());

    // A policy the datapath cannot represent closes the pods it selects, and says so with
    // an Event on each.
    api.put(
        "networkpolicies",
        policy_object(
            "broken",
            json!({"podSelector": {"matchLabels": {"app": "b"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
        ),
    );
    let reported = || {
        api.events().iter().any(|e| {
            e["reason"] == "NetworkPolicyNotEnforceable"
                && e["regarding"]["name"] == "b"
                && e["type"] == "Warning"
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), reported),
        "no Event on pod b: {:?}\n{}",
        api.events(),
        agent_log()
    );
}

/// Where the agents of these tests serve their metrics (in their node's namespace).
const AGENT_METRICS: std::net::SocketAddr =
    std::net::SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9670);

/// Where the agent on `node` writes its state files.
fn state_dir(node: &testbed::SimNode) -> std::path::PathBuf {
    node.dir().join("policy-state")
}

/// `cni-ebpf agent` on `node`, against `api`, logging to `log`.
fn start_agent(
    node: &testbed::SimNode,
    api: &testbed::ApiServer,
    log: &std::path::Path,
) -> testbed::Background {
    start_agent_as(node, api, log, &[])
}

/// [`start_agent`] with `extra` arguments. The agent runs as its container does
/// ([`testbed::process::as_agent_container`]), so every test of this file shows what it
/// does with the container's capabilities alone.
fn start_agent_as(
    node: &testbed::SimNode,
    api: &testbed::ApiServer,
    log: &std::path::Path,
    extra: &[&str],
) -> testbed::Background {
    let (listen, state) = (
        AGENT_METRICS.to_string(),
        state_dir(node).display().to_string(),
    );
    let mut args = vec![
        "agent",
        "--listen",
        &listen,
        "--probe-listen",
        &listen,
        "--state-dir",
        &state,
    ];
    args.extend_from_slice(extra);
    let argv = testbed::process::as_agent_container(api.agent_argv(
        &testbed::plugin_bin(),
        node.pin_root(),
        &args,
    ));
    testbed::process::Background::spawn_logged(node.netns(), &argv, log)
}

/// `/ready`, the DaemonSet's readiness probe: while the API server refuses the agent,
/// 503 naming both of its jobs; once NetworkPolicy and the Node watcher have made their
/// first rounds, 200; a network whose datapath is half there makes it 503 again, naming
/// the network, until it is whole (here: gone).
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_agent_is_ready_once_its_first_rounds_are_made_and_its_datapaths_are_whole() {
    use std::time::Duration;

    use testbed::datapath::wait_until;

    let node = testbed::SimNode::new("agent_ready");
    let pod = node.pod("p");
    let _ = node.add(&pod, "eth0", &node.conf());
    let api = testbed::ApiServer::start(node.ext_netns(), testbed::EXT_IP4);
    api.set_node("node-r", &["10.244.9.0/24"], &[testbed::NODE_IP4]);
    api.forbid(true);
    let log = node.dir().join("agent.log");
    let _agent = start_agent_as(&node, &api, &log, &["--node-name", "node-r"]);
    let ready = || {
        testbed::net::http_get(
            node.netns(),
            AGENT_METRICS,
            "/ready",
            Duration::from_secs(1),
        )
        .map(|(status, _, body)| (status, body))
        .unwrap_or((0, String::new()))
    };
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut seen = (0, String::new());
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen = ready();
            seen.0 == 503
        }),
        "no 503 while the API server refuses the agent: {seen:?}\n{}",
        agent_log()
    );
    assert!(
        seen.1.contains("NetworkPolicy") && seen.1.contains("Node watcher"),
        "{seen:?}"
    );

    api.forbid(false);
    assert!(
        wait_until(Duration::from_secs(30), || {
            seen = ready();
            seen.0 == 200
        }),
        "not ready 30 s after the API server let the agent in: {seen:?}\n{}",
        agent_log()
    );
    assert_eq!(seen.1, "ready\n");

    let half = node.pin_root().join("half");
    std::fs::create_dir(&half).unwrap_or_else(|e| panic!("{e}"));
    let (status, body) = ready();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("network half"), "{body}");
    std::fs::remove_dir(&half).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ready().0, 200);
}

/// One pod of the end-to-end matrix: where it runs, what it serves and, with the kube-proxy
/// replacement, its prober in the socket hooks' cgroup. Field order is drop order.
pub(crate) struct MatrixPod {
    pub(crate) name: String,
    prober: Option<testbed::netpol::probe::ProcessProber>,
    pub(crate) servers: testbed::netpol::probe::MatrixServer,
    pub(crate) pod: testbed::Pod,
}

/// One probe of the matrix and what it must find.
struct Cell {
    from: usize,
    to: usize,
    v6: bool,
    protocol: Protocol,
    port: u16,
    /// Through the destination pod's Service (its ClusterIP), as the upstream suite
    /// probes; else to the pod's own address.
    via_service: bool,
    expected: bool,
}

/// What translates the matrix's Services (see [`MatrixWorld`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatrixProxy {
    /// No Services: the probes go to the pods' addresses only.
    None,
    /// kube-proxy's rules in this mode on both nodes.
    KubeProxy(testbed::kubeproxy::Mode),
    /// The agents' `--kube-proxy-replacement`.
    Replacement,
}

/// The ClusterIP of the Service of the matrix pod at `index` (upstream's `s-<ns>-<pod>`).
pub(crate) fn service_ip(index: usize, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            0x10,
            0x96,
            0,
            0,
            0,
            0,
            0x100 + index as u16,
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 96, 1, 10 + index as u8))
    }
}

/// The Service ports of the matrix pod at `index` as kube-proxy sees them: upstream's
/// `model.go` gives each pod a Service with ports 80 and 81 over TCP, UDP and SCTP, each
/// to the same container port, in both families.
fn matrix_services(
    pods: &[(String, &testbed::ClusterNode, [IpAddr; 2])],
) -> Vec<testbed::kubeproxy::ServicePort> {
    use testbed::kubeproxy::{Protocol as P, ServicePort};
    let mut out = Vec::new();
    for (i, (name, node, ips)) in pods.iter().enumerate() {
        let (ns, pod) = name.split_once('/').unwrap_or(("", name));
        for (v6, ip) in [(false, ips[0]), (true, ips[1])] {
            for port in testbed::netpol::PORTS {
                for (proto, p) in [
                    (Protocol::Tcp, P::Tcp),
                    (Protocol::Udp, P::Udp),
                    (Protocol::Sctp, P::Sctp),
                ] {
                    let ep = std::net::SocketAddr::new(ip, port).to_string();
                    out.push(
                        ServicePort::new(
                            &format!("{ns}/s-{ns}-{pod}"),
                            &port_name(port, proto),
                            p,
                            &service_ip(i, v6).to_string(),
                            port,
                        )
                        .endpoint(&ep, node.name()),
                    );
                }
            }
        }
    }
    out
}

/// Probes `cells` from the pods' namespaces, all at once (a thread each), and returns
/// what each found. A probe through a Service translated at the socket (the
/// replacement's) is made by the source pod's prober, a process in the hooks' cgroup.
fn probe_cells(
    pods: &[MatrixPod],
    universe: &Universe,
    cells: &[&Cell],
    timeout: std::time::Duration,
) -> Vec<bool> {
    use testbed::netpol::probe::{probe, Target};
    std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let (src, dst) = (&pods[c.from], &pods[c.to]);
                    let addr = if c.via_service {
                        service_ip(c.to, c.v6)
                    } else {
                        pod_ip(universe, &dst.name, c.v6)
                    };
                    if let (true, Some(p)) = (c.via_service, &src.prober) {
                        return p.probe(
                            std::net::SocketAddr::new(addr, c.port),
                            c.protocol,
                            timeout,
                        );
                    }
                    let target = Target {
                        addr,
                        port: c.port,
                        server: &dst.servers,
                    };
                    probe(src.pod.netns(), target, c.protocol, timeout)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect()
    })
}

/// The one-shot client process (see `src/bin/cni-ebpf-netclient.rs`).
const NETCLIENT: &str = env!("CARGO_BIN_EXE_cni-ebpf-netclient");

/// The end-to-end world: two nodes, the nine pods of x, y and z spread over them (ADDed
/// by the plugin, dual-stack, each serving TCP, UDP and SCTP on ports 80 and 81), an
/// agent on each node watching the stand-in API server, which holds the namespaces and
/// pods as [`Universe`] objects with the pods' real addresses. [`MatrixWorld::of`] makes
/// it of another universe's namespaces, pods and Nodes. Field order is drop order:
/// the agents stop before their nodes' directories go (an agent still running writes its
/// policy state there, and would make the directory again), the pods' servers before
/// their namespaces.
pub(crate) struct MatrixWorld {
    _agents: [testbed::Background; 2],
    pub(crate) pods: Vec<MatrixPod>,
    pub(crate) api: testbed::ApiServer,
    /// The replacement's socket hooks' cgroup (the pods' probers run in it; removed once
    /// they are gone).
    _cgroup: Option<testbed::TestCgroup>,
    pub(crate) cluster: testbed::Cluster,
    proxy: MatrixProxy,
    pub(crate) initial: Universe,
    /// The cluster policies in force (as the API holds them), which the model's
    /// expectations take in.
    cluster_policies: Vec<Value>,
    pub(crate) probes: usize,
    pub(crate) retried: usize,
}

impl MatrixWorld {
    /// The world on nodes whose pod CIDRs the fabric routes (`tunnel: false`), or on
    /// nodes in two subnets joined only by the tunnel (`crossNode: tunnel`, the agents
    /// also keeping the tunnel entries from the Node objects). With `proxy`, each pod has
    /// a Service (upstream's `s-<ns>-<pod>`: ports 80 and 81 over TCP, UDP and SCTP, both
    /// families), translated by kube-proxy's rules or the agents' replacement, and every
    /// step probes each pod both by its address and through its Service.
    fn new(test: &str, tunnel: bool, proxy: MatrixProxy) -> Self {
        Self::of(test, tunnel, proxy, &Universe::upstream())
    }

    /// The world of `template`'s namespaces, pods and Nodes, as they are (labels, node
    /// placement by `spec.nodeName`, `node-a` or `node-b`; pods without one alternate,
    /// first on `node-a`): each pod that is not on the host network ADDed by the plugin and
    /// published with the addresses ADD gave it; host-network pods and Nodes published as
    /// the template has them.
    pub(crate) fn of(test: &str, tunnel: bool, proxy: MatrixProxy, template: &Universe) -> Self {
        use std::time::Duration;

        use serde_json::json;
        use testbed::datapath::wait_until;
        use testbed::{netpol::probe::MatrixServer, ApiServer, Cluster, EXT_IP4};

        let cluster = if tunnel {
            Cluster::across_subnets(test)
        } else {
            Cluster::new(test)
        };
        let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
        if tunnel {
            for n in cluster.nodes() {
                api.set_node(n.name(), &[n.pod_cidr4(), n.pod_cidr6()], &[n.ip4()]);
            }
        }
        let cgroup =
            (proxy == MatrixProxy::Replacement).then(|| testbed::TestCgroup::create(cluster.tag()));
        let conf = |n: &testbed::ClusterNode| {
            let mut conf = n.conf_dual_stack();
            if tunnel {
                conf = conf.set("crossNode", json!("tunnel"));
            }
            if let Some(cg) = &cgroup {
                conf = conf.set("cgroupPath", json!(cg.path().to_string_lossy()));
            }
            conf
        };
        let mut initial = Universe {
            namespaces: Vec::new(),
            pods: Vec::new(),
            nodes: Vec::new(),
        };
        for obj in &template.namespaces {
            api.put("namespaces", serde_json::to_value(obj).unwrap_or_default());
            initial.namespaces.push(obj.clone());
        }
        for node in &template.nodes {
            api.put_node(serde_json::to_value(node).unwrap_or_default());
            initial.nodes.push(node.clone());
        }
        let mut pods = Vec::new();
        let mut endpoints = Vec::new();
        let host_network = |p: &k8s_openapi::api::core::v1::Pod| {
            p.spec.as_ref().and_then(|s| s.host_network) == Some(true)
        };
        for p in template.pods.iter().filter(|p| host_network(p)) {
            api.put("pods", serde_json::to_value(p).unwrap_or_default());
            initial.pods.push(p.clone());
        }
        for (i, template_pod) in template
            .pods
            .iter()
            .filter(|p| !host_network(p))
            .enumerate()
        {
            let ns = template_pod
                .metadata
                .namespace
                .as_deref()
                .unwrap_or_default();
            let name = template_pod.metadata.name.as_deref().unwrap_or_default();
            let node_name = template_pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref());
            let node = match node_name {
                Some(n) if n == cluster.a().name() => cluster.a(),
                Some(n) if n == cluster.b().name() => cluster.b(),
                Some(n) => panic!("{ns}/{name} is on {n}, which is no node of the world"),
                None if i % 2 == 0 => cluster.a(),
                None => cluster.b(),
            };
            let handle = node.pod(&format!("{ns}-{name}"));
            let env = handle
                .env("eth0")
                .with_args(&format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"));
            let result = node.exec_plugin("ADD", &env, &conf(node).plugin()).result();
            let ips: Vec<IpAddr> = result["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
                .collect();
            assert_eq!(ips.len(), 2, "{ns}/{name} is not dual-stack: {result}");
            let labels: Vec<(&str, &str)> = template_pod
                .metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut obj = testbed::netpol::pod(ns, name, &labels, &ips);
            if let Some(spec) = obj.spec.as_mut() {
                spec.node_name = node_name.map(str::to_owned);
            }
            api.put("pods", serde_json::to_value(&obj).unwrap_or_default());
            endpoints.push((pod_string(ns, name), node, [ips[0], ips[1]]));
            initial.pods.push(obj);
            let servers = MatrixServer::start(handle.netns(), &pod_string(ns, name));
            let prober = cgroup.as_ref().map(|cg| {
                testbed::netpol::probe::ProcessProber::start(
                    std::path::Path::new(NETCLIENT),
                    handle.netns(),
                    cg,
                )
            });
            pods.push(MatrixPod {
                name: pod_string(ns, name),
                prober,
                servers,
                pod: handle,
            });
        }
        let services = matrix_services(&endpoints);
        match proxy {
            MatrixProxy::None => {}
            MatrixProxy::KubeProxy(mode) => cluster.install_kube_proxy(mode, &services),
            MatrixProxy::Replacement => {
                for (resource, obj) in testbed::service_objects::objects(&services) {
                    api.put(resource, obj);
                }
            }
        }
        let agent = |n: &testbed::ClusterNode| {
            let log = n.dir().join("agent.log");
            let mut extra = Vec::new();
            if tunnel {
                extra.extend(["--node-name", n.name()]);
            }
            if proxy == MatrixProxy::Replacement {
                extra.push("--kube-proxy-replacement=true");
            }
            start_agent_as(n, &api, &log, &extra)
        };
        let agents = [agent(cluster.a()), agent(cluster.b())];
        let world = Self {
            cluster,
            api,
            _cgroup: cgroup,
            proxy,
            initial,
            cluster_policies: Vec::new(),
            pods,
            _agents: agents,
            probes: 0,
            retried: 0,
        };
        assert!(
            wait_until(Duration::from_secs(10), || world
                .cluster
                .nodes()
                .iter()
                .all(|n| generation(n) >= 1)),
            "the agents' first rounds never came:\n{}",
            world.agent_logs()
        );
        if tunnel {
            use testbed::cluster::Underlay;
            let (a, b) = (world.cluster.a(), world.cluster.b());
            assert!(
                wait_until(Duration::from_secs(10), || a.tunnels_to(b, Underlay::V4)
                    && b.tunnels_to(a, Underlay::V4)),
                "the agents never made the tunnel entries:\n{}",
                world.agent_logs()
            );
        }
        world
    }

    pub(crate) fn agent_logs(&self) -> String {
        self.cluster
            .nodes()
            .iter()
            .map(|n| std::fs::read_to_string(n.dir().join("agent.log")).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- node b ---\n")
    }

    pub(crate) fn index(&self, name: &str) -> usize {
        self.pods
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// Makes `changes` through the API (and to `universe` and `policies`), then probes
    /// the whole matrix: each probe must find `upstream`'s expectation where it has one
    /// (IPv4), the model's elsewhere. Disagreeing probes are retried for a few seconds
    /// (the agents take effect within a second). Returns the probes that still disagree.
    fn step(
        &mut self,
        what: &str,
        universe: &mut Universe,
        policies: &mut Vec<NetworkPolicy>,
        changes: &[Change],
        upstream: &BTreeMap<(usize, usize, Protocol, u16), bool>,
    ) -> Vec<String> {
        use std::time::{Duration, Instant};

        for change in changes {
            apply_change(universe, policies, change);
            publish_change(&self.api, universe, change);
        }
        let mut cells = Vec::new();
        for from in 0..self.pods.len() {
            for to in (0..self.pods.len()).filter(|t| *t != from) {
                for (v6, via_service) in self.reaches() {
                    for protocol in PROTOCOLS {
                        // The replacement translates no SCTP (docs/services.md): no Service
                        // cell for it there.
                        if via_service
                            && protocol == Protocol::Sctp
                            && self.proxy == MatrixProxy::Replacement
                        {
                            continue;
                        }
                        for port in testbed::netpol::PORTS {
                            let expected = upstream
                                .get(&(from, to, protocol, port))
                                .filter(|_| !v6)
                                .copied()
                                .unwrap_or_else(|| {
                                    model::allowed_with_cluster_policies(
                                        universe,
                                        policies,
                                        &self.cluster_policies,
                                        pod_ip(universe, &self.pods[from].name, v6),
                                        pod_ip(universe, &self.pods[to].name, v6),
                                        protocol,
                                        port,
                                    )
                                });
                            cells.push(Cell {
                                from,
                                to,
                                v6,
                                protocol,
                                port,
                                via_service,
                                expected,
                            });
                        }
                    }
                }
            }
        }
        self.probes += cells.len();
        // The agents' round (a settling delay, then a swap) before the first probes.
        std::thread::sleep(Duration::from_millis(150));
        let mut pending: Vec<&Cell> = cells.iter().collect();
        let deadline = Instant::now() + Duration::from_secs(6);
        let mut timeout = Duration::from_millis(250);
        loop {
            let found = probe_cells(&self.pods, universe, &pending, timeout);
            pending = pending
                .into_iter()
                .zip(found)
                .filter(|(c, got)| *got != c.expected)
                .map(|(c, _)| c)
                .collect();
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            self.retried += pending.len();
            timeout = Duration::from_secs(1);
            std::thread::sleep(Duration::from_millis(200));
        }
        pending
            .into_iter()
            .map(|c| {
                format!(
                    "{what}: {} -> {}{} {}/{} over {}: expected {}, found the opposite",
                    self.pods[c.from].name,
                    self.pods[c.to].name,
                    if c.via_service { " (its Service)" } else { "" },
                    c.protocol.api_name(),
                    c.port,
                    if c.v6 { "IPv6" } else { "IPv4" },
                    c.expected,
                )
            })
            .collect()
    }

    /// The ClusterNetworkPolicies in force (as the last [`Self::set_cluster_policies`]
    /// put them).
    pub(crate) fn cluster_policies(&self) -> &[Value] {
        &self.cluster_policies
    }

    /// Makes `cluster_policies` the ClusterNetworkPolicies in force, through the API:
    /// those of the last call that none of these replaces deleted, those that differ from
    /// the last call's put (a policy of the same name replaced in one update, so that no
    /// step passes through a state without it).
    pub(crate) fn set_cluster_policies(&mut self, cluster_policies: Vec<Value>) {
        let name = |p: &Value| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        for old in &self.cluster_policies {
            if !cluster_policies.iter().any(|p| name(p) == name(old)) {
                self.api.delete("clusternetworkpolicies", None, &name(old));
            }
        }
        for p in &cluster_policies {
            if !self.cluster_policies.contains(p) {
                self.api.put("clusternetworkpolicies", p.clone());
            }
        }
        self.cluster_policies = cluster_policies;
    }

    /// The (IPv6, through the Service) combinations each step probes.
    fn reaches(&self) -> Vec<(bool, bool)> {
        let via: &[bool] = if self.proxy == MatrixProxy::None {
            &[false]
        } else {
            &[false, true]
        };
        [false, true]
            .into_iter()
            .flat_map(|v6| via.iter().map(move |s| (v6, *s)))
            .collect()
    }

    /// Back to the initial cluster: no policy, the original labels.
    fn reset(&self, policies: &[NetworkPolicy]) {
        for p in policies {
            self.api.delete(
                "networkpolicies",
                p.metadata.namespace.as_deref(),
                p.metadata.name.as_deref().unwrap_or_default(),
            );
        }
        for ns in &self.initial.namespaces {
            self.api
                .put("namespaces", serde_json::to_value(ns).unwrap_or_default());
        }
        for p in &self.initial.pods {
            self.api
                .put("pods", serde_json::to_value(p).unwrap_or_default());
        }
    }
}

/// Every case of the upstream NetworkPolicy suite, end to end in a [`MatrixWorld`]: each
/// step's changes go through the API; then every pod probes every other on both ports,
/// all three protocols and both families (SCTP is an INIT chunk and its INIT-ACK on raw
/// sockets: see `testbed::netpol::probe`), by the pod's address and through its Service
/// (kube-proxy's iptables rules), and each probe must find what upstream expects where
/// upstream probes it, and what the model says elsewhere.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn upstream_cases_hold_end_to_end_on_two_nodes() {
    use testbed::kubeproxy::Mode;
    upstream_cases_end_to_end("np_e2e", false, MatrixProxy::KubeProxy(Mode::Iptables));
}

/// [`upstream_cases_hold_end_to_end_on_two_nodes`] on nodes in two subnets joined only by
/// the tunnel, with kube-proxy's nftables rules: egress judged where a packet enters the
/// tunnel, ingress after it leaves.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn upstream_cases_hold_end_to_end_across_the_tunnel() {
    use testbed::kubeproxy::Mode;
    upstream_cases_end_to_end("np_e2e_tun", true, MatrixProxy::KubeProxy(Mode::Nftables));
}

/// [`upstream_cases_hold_end_to_end_on_two_nodes`] with the agents' kube-proxy
/// replacement translating the Services at the pods' sockets (its probes through a
/// Service run as processes in the hooks' cgroup; no SCTP through a Service, which the
/// replacement does not translate).
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn upstream_cases_hold_end_to_end_with_the_kube_proxy_replacement() {
    upstream_cases_end_to_end("np_e2e_kpr", false, MatrixProxy::Replacement);
}

fn upstream_cases_end_to_end(test: &str, tunnel: bool, proxy: MatrixProxy) {
    let mut world = MatrixWorld::new(test, tunnel, proxy);
    let started = std::time::Instant::now();
    let mut steps = 0;
    let mut wrong = Vec::new();
    let all = cases(&world.initial);
    for case in &all {
        let mut universe = world.initial.clone();
        let mut policies: Vec<NetworkPolicy> = Vec::new();
        for (si, step) in case.steps.iter().enumerate() {
            steps += 1;
            let upstream: BTreeMap<(usize, usize, Protocol, u16), bool> = step
                .probes
                .iter()
                .flat_map(|p| {
                    p.reachability.expected.iter().map(|((f, t), e)| {
                        ((world.index(f), world.index(t), p.protocol, p.port), *e)
                    })
                })
                .collect();
            wrong.extend(world.step(
                &format!("{:?} step {si}", case.name),
                &mut universe,
                &mut policies,
                &step.changes,
                &upstream,
            ));
        }
        world.reset(&policies);
    }
    eprintln!(
        "{} cases, {steps} steps, {} probes ({} retried) in {:?}",
        all.len(),
        world.probes,
        world.retried,
        started.elapsed()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} probes found the wrong answer:\n{}\n{}",
        wrong.len(),
        world.probes,
        wrong.join("\n"),
        world.agent_logs()
    );
}

/// The generated scenarios of [`generated_policies_compile_to_what_the_model_allows`]
/// (the same seed: at least 200 policies), end to end in a [`MatrixWorld`]: each
/// scenario's labels and policies go through the API, and the whole matrix must be what
/// the model says.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn generated_policies_hold_end_to_end_on_two_nodes() {
    use testbed::kubeproxy::Mode;
    let mut world = MatrixWorld::new("np_gen", false, MatrixProxy::KubeProxy(Mode::Nftables));
    let started = std::time::Instant::now();
    let mut rng = Rng(GENERATED_SEED);
    let (mut total_policies, mut wrong) = (0, Vec::new());
    for round in 0..GENERATED_ROUNDS {
        let (labelled, generated) = scenario(&mut rng, &world.initial);
        total_policies += generated.len();
        let mut changes = label_changes(&labelled);
        changes.extend(generated.into_iter().map(Change::Apply));
        let mut universe = world.initial.clone();
        let mut policies = Vec::new();
        let found = world.step(
            &format!("round {round}"),
            &mut universe,
            &mut policies,
            &changes,
            &BTreeMap::new(),
        );
        if !found.is_empty() {
            wrong.push(format!(
                "{}\npolicies: {}",
                found.join("\n"),
                serde_json::to_string(&policies).unwrap_or_default()
            ));
        }
        world.reset(&policies);
    }
    eprintln!(
        "{GENERATED_ROUNDS} scenarios, {total_policies} policies, {} probes ({} retried) in {:?}",
        world.probes,
        world.retried,
        started.elapsed()
    );
    assert!(total_policies >= 200, "only {total_policies} policies");
    assert!(
        wrong.is_empty(),
        "{} scenarios found wrong answers:\n{}\n{}",
        wrong.len(),
        wrong.join("\n"),
        world.agent_logs()
    );
}

/// Sends one case change to the API server: the policy, or the changed object as it now
/// is in `universe`.
fn publish_change(api: &testbed::ApiServer, universe: &Universe, change: &Change) {
    match change {
        Change::Apply(np) => api.put(
            "networkpolicies",
            serde_json::to_value(np).unwrap_or_default(),
        ),
        Change::Delete { namespace, name } => {
            api.delete("networkpolicies", Some(namespace), name);
        }
        Change::NamespaceLabels { namespace, .. } => {
            let ns = universe
                .namespace(namespace)
                .unwrap_or_else(|| panic!("no namespace {namespace}"));
            api.put("namespaces", serde_json::to_value(ns).unwrap_or_default());
        }
        Change::PodLabels { namespace, pod, .. } => {
            let p = universe
                .pod(namespace, pod)
                .unwrap_or_else(|| panic!("no pod {namespace}/{pod}"));
            api.put("pods", serde_json::to_value(p).unwrap_or_default());
        }
    }
}

/// Policy churn through the API while the agent is killed and restarted: policies that
/// never change what `a` and `c` may send to `b` come and go (others selecting `b`, `a`
/// or `c`), and probes all along must find `a` → `b` admitted and `c` → `b` refused,
/// every time. After the restart, the churn's last state is in force.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn verdicts_never_change_wrongly_while_the_agent_restarts_during_policy_churn() {
    use std::{
        sync::atomic::{AtomicBool, AtomicUsize, Ordering},
        time::{Duration, Instant},
    };

    use testbed::datapath::{masq_conf, wait_until, Mode, TaggedServer};
    use testbed::{netpol::add_published, ApiServer, SimNode, EXT_IP4};

    let node = SimNode::new("np_churn");
    let api = ApiServer::start(node.ext_netns(), EXT_IP4);
    let ns = testbed::netpol::namespace("x", &[("ns", "x")]);
    api.put("namespaces", serde_json::to_value(&ns).unwrap_or_default());
    let conf = masq_conf(&node);
    let mut pods = Vec::new();
    for name in ["a", "b", "c"] {
        let pod = node.pod(name);
        let ip = add_published(&node, &api, &conf.plugin(), &pod, "x", name);
        pods.push((pod, ip));
    }
    let _server = TaggedServer::start(pods[1].0.netns(), 8080, "b", Mode::Greet);
    let to_b = format!("{}:8080", pods[1].1);
    let b_from = |name: &str, app: &str| {
        policy_object(
            name,
            json!({"podSelector": {"matchLabels": {"app": "b"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": app}}}]}]}),
        )
    };
    api.put("networkpolicies", b_from("b-from-a", "a"));
    let log = node.dir().join("agent.log");
    let mut agent = Some(start_agent(&node, &api, &log));
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(10), || generation(&node) >= 1
            && !reaches(pods[2].0.netns(), &to_b, Duration::from_millis(300))),
        "the policy never came into force:\n{}",
        agent_log()
    );

    // Probes all along: a → b admitted (one retry against a slow machine), c → b never.
    let stop = AtomicBool::new(false);
    let (probes, wrong) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let churn = |i: usize| match i % 4 {
        0 => api.put("networkpolicies", b_from(&format!("b-from-d{i}"), "d")),
        1 => api.put(
            "networkpolicies",
            policy_object(
                &format!("a-only-from-b{i}"),
                json!({"podSelector": {"matchLabels": {"app": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]}),
            ),
        ),
        2 => api.delete("networkpolicies", Some("x"), &format!("b-from-d{}", i - 2)),
        _ => api.put(
            "networkpolicies",
            policy_object(
                &format!("c-egress-to-b{i}"),
                json!({"podSelector": {"matchLabels": {"app": "c"}},
                       "policyTypes": ["Egress"],
                       "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]}),
            ),
        ),
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                let a_ok = reaches(pods[0].0.netns(), &to_b, Duration::from_secs(1))
                    || reaches(pods[0].0.netns(), &to_b, Duration::from_secs(2));
                let c_in = reaches(pods[2].0.netns(), &to_b, Duration::from_millis(200));
                probes.fetch_add(1, Ordering::Relaxed);
                if !a_ok || c_in {
                    wrong.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "wrong verdict at {:?}: a→b {a_ok}, c→b {c_in}",
                        started.elapsed()
                    );
                }
            }
        });
        for i in 0..40 {
            churn(i);
            if i == 12 {
                agent = None;
            }
            if i == 24 {
                agent = Some(start_agent(&node, &api, &log));
            }
            std::thread::sleep(Duration::from_millis(60));
        }
        // The last state is in force once the restarted agent has caught up.
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
    });
    let (probes, wrong) = (probes.into_inner(), wrong.into_inner());
    assert!(probes >= 10, "only {probes} probe rounds");
    assert_eq!(
        wrong,
        0,
        "{wrong} of {probes} probe rounds found a wrong verdict:\n{}",
        agent_log()
    );
    // Still right after the churn, and the last policy (c's egress) is known.
    assert!(reaches(pods[0].0.netns(), &to_b, Duration::from_secs(1)));
    assert!(!reaches(
        pods[2].0.netns(),
        &to_b,
        Duration::from_millis(300)
    ));
    assert!(
        agent.as_mut().is_some_and(|a| a.running()),
        "the restarted agent exited:\n{}",
        agent_log()
    );
    let state = std::fs::read_to_string(state_dir(&node).join("testnet.json")).unwrap_or_default();
    assert!(
        state.contains("x/c-egress-to-b39"),
        "the churn's last policy is not in force: {state}"
    );
}

/// Fail closed before the first sync. On a network that enforces policy
/// (`networkPolicy`), pods ADDed while no agent has put the cluster's policy in force —
/// here no agent runs at all — send and receive nothing but their node's traffic, from
/// the moment their interface exists: probed continuously from right after each ADD
/// (a policy-free peer, the node's kubelet-like probe, the outside). Once the agent
/// runs, they open as their policies say (b admits only a). Then a reboot, simulated:
/// the agent stops, the pods' namespaces and the pins go (bpffs is empty after a boot),
/// new pods are ADDed: closed again from their first moment, until the agent is back.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_stay_closed_until_the_agent_has_put_the_policy_in_force_also_after_a_reboot() {
    use std::time::{Duration, Instant};

    use testbed::datapath::{masq_conf, wait_until, Mode, TaggedServer};
    use testbed::{netpol::add_published, ApiServer, SimNode, EXT_IP4};

    let node = SimNode::new("np_closed");
    let api = ApiServer::start(node.ext_netns(), EXT_IP4);
    let ns = testbed::netpol::namespace("x", &[("ns", "x")]);
    api.put("namespaces", serde_json::to_value(&ns).unwrap_or_default());
    api.put(
        "networkpolicies",
        policy_object(
            "b-from-a",
            json!({"podSelector": {"matchLabels": {"app": "b"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
        ),
    );
    let conf = masq_conf(&node).set("networkPolicy", json!(true));
    let ext_server = TaggedServer::start(node.ext_netns(), 8080, "ext", Mode::Greet);
    let to_ext = format!("{EXT_IP4}:8080");
    let log = node.dir().join("agent.log");
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // One generation of pods a, b, c: ADDed with the agent down, b's server started, and
    // every probe of the closed state made from the moment b exists until `open_at`.
    let round = |gen: usize| {
        let mut pods = Vec::new();
        for name in ["a", "b", "c"] {
            let pod = node.pod(&format!("{name}{gen}"));
            let ip = add_published(&node, &api, &conf.plugin(), &pod, "x", name);
            pods.push((pod, ip));
        }
        let server = TaggedServer::start(pods[1].0.netns(), 8080, "b", Mode::Greet);
        (pods, server)
    };
    // While no policy is in force: nothing from a or c reaches b, nor b or a the outside;
    // the node reaches b. Probed for `span`, a probe every 100 ms or so.
    let closed_for = |pods: &[(testbed::Pod, String)], span: Duration| {
        let to_b = format!("{}:8080", pods[1].1);
        let started = Instant::now();
        let mut probes = 0;
        while started.elapsed() < span {
            assert!(
                !reaches(pods[0].0.netns(), &to_b, Duration::from_millis(100)),
                "a reached b before any policy was in force"
            );
            assert!(
                !reaches(pods[2].0.netns(), &to_b, Duration::from_millis(100)),
                "c reached b before any policy was in force"
            );
            assert!(
                !reaches(pods[0].0.netns(), &to_ext, Duration::from_millis(100)),
                "a reached the outside before any policy was in force"
            );
            assert!(
                reaches(node.netns(), &to_b, Duration::from_secs(1)),
                "the node's own probe of b failed: the node's traffic must always pass"
            );
            probes += 4;
        }
        probes
    };
    let opens = |pods: &[(testbed::Pod, String)]| {
        let to_b = format!("{}:8080", pods[1].1);
        assert!(
            wait_until(Duration::from_secs(10), || reaches(
                pods[0].0.netns(),
                &to_b,
                Duration::from_millis(300)
            )),
            "a never reached b once the agent ran:\n{}",
            agent_log()
        );
        assert!(
            reaches(pods[0].0.netns(), &to_ext, Duration::from_secs(1)),
            "a (no egress policy) never reached the outside"
        );
        assert!(
            !reaches(pods[2].0.netns(), &to_b, Duration::from_millis(300)),
            "c reached b, which admits only a"
        );
    };

    let (pods, _b) = round(1);
    let probes = closed_for(&pods, Duration::from_secs(2));
    let agent = start_agent(&node, &api, &log);
    let started = Instant::now();
    opens(&pods);
    eprintln!(
        "first pods: closed for {probes} probes before the agent, open as the policy says {:?} after it started",
        started.elapsed()
    );

    // The reboot: the agent and the pods go, and bpffs is empty.
    drop(agent);
    drop(pods);
    std::fs::remove_dir_all(node.pin_root().join("testnet"))
        .unwrap_or_else(|e| panic!("wiping the pins: {e}"));
    let (pods, _b) = round(2);
    let probes = closed_for(&pods, Duration::from_secs(2));
    let agent = start_agent(&node, &api, &log);
    let started = Instant::now();
    opens(&pods);
    eprintln!(
        "after the reboot: closed for {probes} probes, open as the policy says {:?} after the agent started",
        started.elapsed()
    );
    drop(agent);
    drop(ext_server);
}
