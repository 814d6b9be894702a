//! The cases of the network-policy-api conformance suite for ClusterNetworkPolicy
//! (kubernetes-sigs/network-policy-api `conformance/tests/*.go`, with the fixtures of
//! `conformance/base/`), re-expressed as data over [`universe`]: each case is one
//! upstream `t.Run`, a sequence of steps; a step says which cluster policies and
//! NetworkPolicies are in force and which namespaces carry other labels than the
//! universe's, then pokes some connections, each expecting upstream's answer.
//!
//! Source: the 20 test files of the suite (24 `ConformanceTest`s, 92 `t.Run`s), all
//! expressed here, in the order of [`SHORT_NAMES`], each file's `t.Run`s in upstream's
//! order. Translation notes:
//!
//! - Upstream's world (`conformance/base/manifests.yaml`) is four namespaces of two pods
//!   each plus a namespace of host-network servers. Here: gryffindor = `x`, slytherin =
//!   `y`, hufflepuff = `z`, ravenclaw = `w` ([`HOUSES`]), each with pods `a`, `b`, `c`
//!   ([`crate::netpol::PODS`]): `<statefulset>-0` = `a`, `<statefulset>-1` = `b`; no
//!   poke names `c`, which only widens the matrix the checks compare with the model.
//!   forbidden-forrest = `f`, whose pods `a` and `b` (centaur-0, centaur-1) run on the
//!   host network of `node-a` and `node-b`. Upstream's labels are kept: every namespace
//!   carries `kubernetes.io/metadata.name=<our name>` (the label the API server sets)
//!   and `conformance-house=<house>`, every pod `conformance-house=<house>`.
//! - Selectors keep upstream's shapes: `kubernetes.io/metadata.name:
//!   network-policy-conformance-<house>` becomes `kubernetes.io/metadata.name: <our
//!   name>`; `conformance-house` selectors are unchanged.
//! - Ports: our pods serve 80 and 81 over TCP, UDP and SCTP, so upstream's ports map
//!   one-to-one per protocol ([`port`]): TCP 80 → 80, TCP 8080 → 81, UDP 53 → 80, UDP
//!   5353 → 81, SCTP 9003 → 80, SCTP 9005 → 81, in pokes and in policies alike. The
//!   named ports `web` (TCP 80) and `dns` (UDP 53) become our pods' names for the same
//!   ports, `serve-80-tcp` and `serve-80-udp`. The host-network servers' ports
//!   (`s.HostNetworkPorts`) map by index ([`host_port`]): 0 → TCP 80, 1 → TCP 81, 2 → UDP
//!   80, 4 → UDP 81, 6 → SCTP 80, 7 → SCTP 81 (3 and 5 are agnhost's HTTP ports, which
//!   nothing pokes).
//! - Upstream applies a test's fixtures once, then each `t.Run` mutates the live policy
//!   (swaps rules, rewrites a rule's protocols or action, changes the priority, prepends
//!   a rule) and later `t.Run`s see the earlier mutations. Each step here carries the
//!   complete set of policies in force at that point, the earlier mutations included,
//!   so a row can run alone; the mutations are made with the helpers at the end of this
//!   file, in upstream's order.
//! - The pokes are upstream's `PokeServer` calls, from the client pod to the server
//!   pod's address on a port. Upstream pokes the server's primary address only; every
//!   step here must hold in both families, which is why the inline CIDR case's prepended
//!   `networks` rule names each pod's IPv6 /128 besides its IPv4 /32 (upstream writes the
//!   address of the family its pods have).
//! - Node peers: upstream pokes centaur-1's address (its node's) from a gryffindor pod,
//!   wherever the two run. cni-ebpf never judges traffic between a pod and its own node
//!   (docs/networkpolicy.md, as NetworkPolicy), so a node peer is poked on the node the
//!   client does not run on ([`Target::OtherNode`]): the host-network server of `f`
//!   there. The Nodes carry the labels every Linux node has (`kubernetes.io/os=linux`),
//!   which upstream's node selectors pick.
//! - The inline CIDR case replaces slytherin's labels (`SetLabels`); the API server puts
//!   back `kubernetes.io/metadata.name`, so the replaced labels keep it.
//! - The integration case's NetworkPolicy has an empty `podSelector:` (null), which the
//!   API takes as the empty selector: `{}` here. Its later `t.Run`s delete it; their
//!   steps have no NetworkPolicy.
//! - Upstream's `t.Run` texts repeat across files; a case's name is the test's
//!   `ShortName` and the `t.Run` text ([`ClusterCase::name`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::{
    core::v1::{Node, Pod},
    networking::v1::NetworkPolicy,
};
use serde_json::{json, Value};

use super::{namespace, pod, Protocol, Universe, PODS};
use crate::cluster::{
    NODE_A_IP4, NODE_A_IP6, NODE_A_POD_CIDR4, NODE_A_POD_CIDR6, NODE_B_IP4, NODE_B_IP6,
    NODE_B_POD_CIDR4, NODE_B_POD_CIDR6,
};

/// Upstream's houses: (house, our namespace, upstream's StatefulSet of that house).
pub const HOUSES: [(&str, &str, &str); 4] = [
    ("gryffindor", "x", "harry-potter"),
    ("slytherin", "y", "draco-malfoy"),
    ("hufflepuff", "z", "cedric-diggory"),
    ("ravenclaw", "w", "luna-lovegood"),
];

/// The namespace of forbidden-forrest's host-network servers.
pub const HOST_NETWORK_NAMESPACE: &str = "f";

/// The label upstream's namespaces, pods and selectors use.
pub const HOUSE_LABEL: &str = "conformance-house";

/// The label the API server puts on every namespace: its name.
pub const METADATA_NAME: &str = "kubernetes.io/metadata.name";

/// The Nodes: name, addresses (IPv4, IPv6) and pod CIDRs, those of the two simulated
/// nodes of [`crate::Cluster::new`].
pub const NODES: [(&str, [&str; 2], [&str; 2]); 2] = [
    (
        "node-a",
        [NODE_A_IP4, NODE_A_IP6],
        [NODE_A_POD_CIDR4, NODE_A_POD_CIDR6],
    ),
    (
        "node-b",
        [NODE_B_IP4, NODE_B_IP6],
        [NODE_B_POD_CIDR4, NODE_B_POD_CIDR6],
    ),
];

/// Upstream's `ConformanceTest`s, in the order the cases are listed, with how many
/// `t.Run`s each has.
pub const SHORT_NAMES: [(&str, usize); 24] = [
    ("CNPAdminTierIngressTCP", 6),
    ("CNPAdminTierIngressUDP", 6),
    ("CNPAdminTierIngressSCTP", 6),
    ("CNPAdminTierIngressNamedPort", 1),
    ("CNPAdminTierEgressTCP", 6),
    ("CNPAdminTierEgressUDP", 6),
    ("CNPAdminTierEgressSCTP", 6),
    ("CNPAdminTierEgressNamedPort", 1),
    ("CNPAdminTierEgressNodePeers", 3),
    ("CNPAdminTierGress", 6),
    ("CNPAdminTierEgressInlineCIDRPeers", 2),
    ("CNPAdminTierPriorityField", 3),
    ("CNPAdminTierIntegration", 6),
    ("CNPBaselineTierIngressTCP", 4),
    ("CNPBaselineTierIngressUDP", 4),
    ("CNPBaselineTierIngressSCTP", 4),
    ("CNPBaselineTierIngressNamedPort", 1),
    ("CNPBaselineTierEgressTCP", 4),
    ("CNPBaselineTierEgressUDP", 4),
    ("CNPBaselineTierEgressSCTP", 4),
    ("CNPBaselineTierEgressNamedPort", 1),
    ("CNPBaselineTierEgressNodePeers", 2),
    ("CNPBaselineTierGress", 4),
    ("CNPBaselineTierEgressInlineCIDRPeers", 2),
];

/// One upstream `t.Run`.
#[derive(Debug, Clone)]
pub struct ClusterCase {
    /// Upstream's `ShortName` of the test.
    pub short_name: &'static str,
    /// Upstream's `t.Run` text.
    pub run: &'static str,
    /// What is in force and poked, in order.
    pub steps: Vec<ClusterStep>,
}

impl ClusterCase {
    /// `<ShortName> <t.Run text>`.
    #[must_use]
    pub fn name(&self) -> String {
        format!("{} {}", self.short_name, self.run)
    }
}

/// What is in force, then the connections poked.
#[derive(Debug, Clone)]
pub struct ClusterStep {
    /// Every ClusterNetworkPolicy in force (`policy.networking.k8s.io/v1alpha2`, as the
    /// API takes it).
    pub cluster_policies: Vec<Value>,
    /// Every NetworkPolicy in force.
    pub policies: Vec<NetworkPolicy>,
    /// Namespaces whose labels are not the universe's: the labels they have instead.
    pub namespace_labels: Vec<(String, Vec<(String, String)>)>,
    pub pokes: Vec<Poke>,
}

/// One connection upstream makes and whether it must get through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poke {
    /// The client pod, `ns/pod`.
    pub from: String,
    pub to: Target,
    pub protocol: Protocol,
    /// Our port (see [`port`]).
    pub port: u16,
    pub expected: bool,
}

/// Where a poke goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The pod `ns/pod`.
    Pod(String),
    /// The host-network server of the node the client does not run on (a node peer).
    OtherNode,
}

/// The conformance universe: namespaces `x`, `y`, `z`, `w` (the houses) with pods `a`,
/// `b`, `c`, spread over `node-a` and `node-b` in turn (`spec.nodeName`), the first
/// node's in 10.244.1.0/24 and fd00:10:244:1::/64, the second's in 10.244.2.0/24 and
/// fd00:10:244:2::/64; namespace `f` with one host-network pod on each node (`a` on
/// `node-a`, `b` on `node-b`), whose addresses are the node's; and the two Nodes.
#[must_use]
pub fn universe() -> Universe {
    let mut u = Universe {
        namespaces: Vec::new(),
        pods: Vec::new(),
        nodes: Vec::new(),
    };
    for (ni, (house, ns, _)) in HOUSES.iter().enumerate() {
        u.namespaces
            .push(namespace(ns, &[(METADATA_NAME, ns), (HOUSE_LABEL, house)]));
        for (pi, name) in PODS.iter().enumerate() {
            let i = ni * PODS.len() + pi;
            let node = i % 2;
            let (subnet, host) = (1 + node as u8, 10 + i as u8);
            let ips = [
                IpAddr::V4(Ipv4Addr::new(10, 244, subnet, host)),
                IpAddr::V6(Ipv6Addr::new(
                    0xfd00,
                    0x10,
                    0x244,
                    subnet.into(),
                    0,
                    0,
                    0,
                    host.into(),
                )),
            ];
            let mut p = pod(ns, name, &[(HOUSE_LABEL, house)], &ips);
            if let Some(spec) = p.spec.as_mut() {
                spec.node_name = Some(NODES[node].0.to_owned());
            }
            u.pods.push(p);
        }
    }
    let ff = HOST_NETWORK_NAMESPACE;
    u.namespaces.push(namespace(
        ff,
        &[(METADATA_NAME, ff), (HOUSE_LABEL, "forbidden-forrest")],
    ));
    for ((name, ips, cidrs), pod_name) in NODES.iter().zip(["a", "b"]) {
        let addrs: Vec<IpAddr> = ips
            .iter()
            .map(|ip| ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")))
            .collect();
        let mut p = pod(ff, pod_name, &[(HOUSE_LABEL, "forbidden-forrest")], &addrs);
        if let Some(spec) = p.spec.as_mut() {
            spec.host_network = Some(true);
            spec.node_name = Some((*name).to_owned());
        }
        u.pods.push(p);
        let node = crate::apiserver::node_object(name, cidrs, ips);
        u.nodes
            .push(serde_json::from_value(node).unwrap_or_else(|e| panic!("Node {name}: {e}")));
    }
    u
}

/// `universe` with the namespace labels of `step`.
#[must_use]
pub fn universe_at(universe: &Universe, step: &ClusterStep) -> Universe {
    let mut u = universe.clone();
    for (ns, labels) in &step.namespace_labels {
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        u.set_namespace_labels(ns, &labels);
    }
    u
}

/// The Node pod `ns_pod` runs on (`spec.nodeName`; panics if it has none).
#[must_use]
pub fn node_of<'a>(universe: &'a Universe, ns_pod: &str) -> &'a Node {
    let name = pod_named(universe, ns_pod)
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_else(|| panic!("{ns_pod} has no node"));
    universe
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Node {name}"))
}

/// The host-network server a node-peer poke from `from` goes to: the one on the node
/// `from` does not run on.
#[must_use]
pub fn other_node_server<'a>(universe: &'a Universe, from: &str) -> &'a Pod {
    let own = node_of(universe, from).metadata.name.as_deref();
    universe
        .pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(HOST_NETWORK_NAMESPACE)
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != own
        })
        .unwrap_or_else(|| panic!("no host-network server off the node of {from}"))
}

/// The pod `ns/pod` of `universe` (panics if there is none).
#[must_use]
pub fn pod_named<'a>(universe: &'a Universe, ns_pod: &str) -> &'a Pod {
    let (ns, name) = ns_pod.split_once('/').unwrap_or((ns_pod, ""));
    universe
        .pod(ns, name)
        .unwrap_or_else(|| panic!("no pod {ns_pod}"))
}

/// The address of `pod` of the family of `v6` (panics if it has none).
#[must_use]
pub fn address(pod: &Pod, v6: bool) -> IpAddr {
    pod.status
        .iter()
        .flat_map(|s| s.pod_ips.iter().flatten())
        .filter_map(|ip| ip.ip.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == v6)
        .unwrap_or_else(|| {
            panic!(
                "{:?} has no address of that family",
                pod.metadata.name.as_deref()
            )
        })
}

/// The source and destination addresses of `poke` in `universe`, of the family of `v6`.
#[must_use]
pub fn poke_addresses(universe: &Universe, poke: &Poke, v6: bool) -> (IpAddr, IpAddr) {
    let src = address(pod_named(universe, &poke.from), v6);
    let dst = match &poke.to {
        Target::Pod(to) => address(pod_named(universe, to), v6),
        Target::OtherNode => address(other_node_server(universe, &poke.from), v6),
    };
    (src, dst)
}

/// Our namespace of upstream's house.
fn ns_of(house: &str) -> &'static str {
    HOUSES
        .iter()
        .find(|(h, _, _)| *h == house)
        .map(|(_, ns, _)| *ns)
        .unwrap_or_else(|| panic!("no house {house}"))
}

/// Our `ns/pod` of upstream's pod name (`harry-potter-1` → `x/b`).
fn pod_of(upstream: &str) -> String {
    let (set, index) = upstream
        .rsplit_once('-')
        .unwrap_or_else(|| panic!("not a StatefulSet pod: {upstream}"));
    let ns = HOUSES
        .iter()
        .find(|(_, _, s)| *s == set)
        .map(|(_, ns, _)| *ns)
        .unwrap_or_else(|| panic!("no StatefulSet {set}"));
    let name = match index {
        "0" => "a",
        "1" => "b",
        _ => panic!("no pod {upstream} in the conformance world"),
    };
    format!("{ns}/{name}")
}

/// Our port of upstream's `port` over `protocol`.
#[must_use]
pub fn port(protocol: Protocol, port: u16) -> u16 {
    match (protocol, port) {
        (Protocol::Tcp, 80) | (Protocol::Udp, 53) | (Protocol::Sctp, 9003) => 80,
        (Protocol::Tcp, 8080) | (Protocol::Udp, 5353) | (Protocol::Sctp, 9005) => 81,
        _ => panic!("upstream serves no {} port {port}", protocol.api_name()),
    }
}

/// Our protocol and port of upstream's `s.HostNetworkPorts[index]`.
#[must_use]
pub fn host_port(index: usize) -> (Protocol, u16) {
    match index {
        0 => (Protocol::Tcp, 80),
        1 => (Protocol::Tcp, 81),
        2 => (Protocol::Udp, 80),
        4 => (Protocol::Udp, 81),
        6 => (Protocol::Sctp, 80),
        7 => (Protocol::Sctp, 81),
        _ => panic!("HostNetworkPorts[{index}] is not a served port"),
    }
}

/// Upstream's poke from pod `from` to pod `to` (upstream's names) over `protocol` on
/// upstream's `upstream_port`.
fn poke(from: &str, to: &str, protocol: Protocol, upstream_port: u16, expected: bool) -> Poke {
    Poke {
        from: pod_of(from),
        to: Target::Pod(pod_of(to)),
        protocol,
        port: port(protocol, upstream_port),
        expected,
    }
}

/// Upstream's poke from pod `from` to centaur-1 on `s.HostNetworkPorts[index]`.
fn poke_node(from: &str, index: usize, expected: bool) -> Poke {
    let (protocol, port) = host_port(index);
    Poke {
        from: pod_of(from),
        to: Target::OtherNode,
        protocol,
        port,
        expected,
    }
}

/// A step with `cluster_policies` in force and nothing else.
fn step(cluster_policies: &[&Value], pokes: Vec<Poke>) -> ClusterStep {
    ClusterStep {
        cluster_policies: cluster_policies.iter().map(|p| (*p).clone()).collect(),
        policies: Vec::new(),
        namespace_labels: Vec::new(),
        pokes,
    }
}

/// The cases, in the order of [`SHORT_NAMES`].
struct Cases(Vec<ClusterCase>);

impl Cases {
    fn run(&mut self, short_name: &'static str, run: &'static str, steps: Vec<ClusterStep>) {
        self.0.push(ClusterCase {
            short_name,
            run,
            steps,
        });
    }
}

/// Every upstream case, over `universe` (whose pod addresses the inline CIDR cases use).
#[must_use]
#[expect(
    clippy::too_many_lines,
    reason = "the suite as one table, in upstream's order"
)]
pub fn cluster_cases(universe: &Universe) -> Vec<ClusterCase> {
    use Protocol::{Sctp, Tcp, Udp};
    let mut c = Cases(Vec::new());

    // CNPAdminTierIngressTCP: base/admin_tier/standard-ingress-tcp-rules.yaml.
    let s = "CNPAdminTierIngressTCP";
    let mut p = standard(
        "ingress-tcp",
        Tier::Admin,
        3,
        "gryffindor",
        &[(
            Dir::Ingress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Tcp, 80)]),
                ("hufflepuff", &[(Tcp, 80)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-ingress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-0", Tcp, 80, true),
        poke("luna-lovegood-1", "harry-potter-0", Tcp, 8080, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Tcp, 80, true),
                poke("cedric-diggory-1", "harry-potter-1", Tcp, 8080, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-1", Tcp, 80, false),
        poke("luna-lovegood-1", "harry-potter-1", Tcp, 8080, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 2);
    c.run(s, "Should support an 'pass-ingress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-0", Tcp, 80, true),
        poke("luna-lovegood-1", "harry-potter-0", Tcp, 8080, true),
    ])]);
    swap(&mut p, Dir::Ingress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-ingress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, true),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
            ],
        )],
    );

    // CNPAdminTierIngressUDP: base/admin_tier/standard-ingress-udp-rules.yaml.
    let s = "CNPAdminTierIngressUDP";
    let ingress_udp = standard(
        "ingress-udp",
        Tier::Admin,
        4,
        "hufflepuff",
        &[(
            Dir::Ingress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Udp, 5353)]),
                ("gryffindor", &[(Udp, 53)]),
            ),
        )],
    );
    let mut p = ingress_udp.clone();
    c.run(s, "Should support an 'allow-ingress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "cedric-diggory-0", Udp, 53, true),
        poke("luna-lovegood-1", "cedric-diggory-0", Udp, 5353, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Udp, 53, true),
                poke("harry-potter-1", "cedric-diggory-1", Udp, 5353, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "cedric-diggory-1", Udp, 53, false),
        poke("luna-lovegood-1", "cedric-diggory-1", Udp, 5353, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "cedric-diggory-0", Udp, 5353, false),
                poke("draco-malfoy-1", "cedric-diggory-0", Udp, 53, true),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 2);
    c.run(s, "Should support an 'pass-ingress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "cedric-diggory-1", Udp, 5353, true),
        poke("luna-lovegood-1", "cedric-diggory-1", Udp, 53, true),
    ])]);
    swap(&mut p, Dir::Ingress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-ingress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "cedric-diggory-0", Udp, 5353, true),
                poke("draco-malfoy-1", "cedric-diggory-0", Udp, 53, true),
            ],
        )],
    );

    // CNPAdminTierIngressSCTP: base/admin_tier/standard-ingress-sctp-rules.yaml.
    let s = "CNPAdminTierIngressSCTP";
    let mut p = standard(
        "ingress-sctp",
        Tier::Admin,
        5,
        "ravenclaw",
        &[(
            Dir::Ingress,
            everything_at(
                "gryffindor",
                ("slytherin", &[(Sctp, 9003)]),
                ("hufflepuff", &[(Sctp, 9003)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-ingress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-0", Sctp, 9003, true),
        poke("harry-potter-1", "luna-lovegood-0", Sctp, 9005, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "luna-lovegood-1", Sctp, 9003, true),
                poke("cedric-diggory-1", "luna-lovegood-1", Sctp, 9005, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-1", Sctp, 9003, false),
        poke("harry-potter-1", "luna-lovegood-1", Sctp, 9005, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "luna-lovegood-0", Sctp, 9003, false),
                poke("draco-malfoy-1", "luna-lovegood-0", Sctp, 9005, true),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 2);
    c.run(s, "Should support an 'pass-ingress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-1", Sctp, 9003, true),
        poke("harry-potter-1", "luna-lovegood-1", Sctp, 9005, true),
    ])]);
    swap(&mut p, Dir::Ingress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-ingress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "luna-lovegood-0", Sctp, 9003, true),
                poke("draco-malfoy-1", "luna-lovegood-0", Sctp, 9005, true),
            ],
        )],
    );

    // CNPAdminTierIngressNamedPort: the UDP fixture, its Accept rule at UDP 53 rewritten
    // as the named port `dns`.
    let mut p = ingress_udp;
    set_protocols(
        &mut p,
        Dir::Ingress,
        5,
        json!([{"destinationNamedPort": "serve-80-udp"}]),
    );
    c.run(
        "CNPAdminTierIngressNamedPort",
        "Should support an 'allow-ingress' policy for named port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Udp, 53, true),
                poke("harry-potter-1", "cedric-diggory-1", Udp, 5353, false),
            ],
        )],
    );

    // CNPAdminTierEgressTCP: base/admin_tier/standard-egress-tcp-rules.yaml.
    let s = "CNPAdminTierEgressTCP";
    let egress_tcp = standard(
        "egress-tcp",
        Tier::Admin,
        6,
        "gryffindor",
        &[(
            Dir::Egress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Tcp, 80)]),
                ("hufflepuff", &[(Tcp, 8080)]),
            ),
        )],
    );
    let mut p = egress_tcp.clone();
    c.run(s, "Should support an 'allow-egress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-0", Tcp, 80, true),
        poke("harry-potter-1", "luna-lovegood-0", Tcp, 8080, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Tcp, 8080, true),
                poke("harry-potter-1", "cedric-diggory-1", Tcp, 80, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-1", Tcp, 80, false),
        poke("harry-potter-1", "luna-lovegood-1", Tcp, 8080, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 2);
    c.run(s, "Should support an 'pass-egress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-0", Tcp, 80, true),
        poke("harry-potter-1", "luna-lovegood-0", Tcp, 8080, true),
    ])]);
    swap(&mut p, Dir::Egress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-egress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, true),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
            ],
        )],
    );

    // CNPAdminTierEgressUDP: base/admin_tier/standard-egress-udp-rules.yaml.
    let s = "CNPAdminTierEgressUDP";
    let mut p = standard(
        "egress-udp",
        Tier::Admin,
        7,
        "hufflepuff",
        &[(
            Dir::Egress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Udp, 5353)]),
                ("gryffindor", &[(Udp, 53)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-egress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("cedric-diggory-0", "luna-lovegood-0", Udp, 53, true),
        poke("cedric-diggory-1", "luna-lovegood-0", Udp, 5353, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Udp, 53, true),
                poke("cedric-diggory-1", "harry-potter-1", Udp, 5353, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("cedric-diggory-0", "luna-lovegood-1", Udp, 53, false),
        poke("cedric-diggory-1", "luna-lovegood-1", Udp, 5353, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "draco-malfoy-0", Udp, 5353, false),
                poke("cedric-diggory-1", "draco-malfoy-0", Udp, 53, true),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 2);
    c.run(s, "Should support an 'pass-egress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("cedric-diggory-0", "luna-lovegood-1", Udp, 5353, true),
        poke("cedric-diggory-1", "luna-lovegood-1", Udp, 53, true),
    ])]);
    swap(&mut p, Dir::Egress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-egress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "draco-malfoy-0", Udp, 5353, true),
                poke("cedric-diggory-1", "draco-malfoy-0", Udp, 53, true),
            ],
        )],
    );

    // CNPAdminTierEgressSCTP: base/admin_tier/standard-egress-sctp-rules.yaml.
    let s = "CNPAdminTierEgressSCTP";
    let mut p = standard(
        "egress-sctp",
        Tier::Admin,
        8,
        "ravenclaw",
        &[(
            Dir::Egress,
            everything_at(
                "gryffindor",
                ("slytherin", &[(Sctp, 9003)]),
                ("hufflepuff", &[(Sctp, 9003)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-egress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-0", Sctp, 9003, true),
        poke("luna-lovegood-1", "harry-potter-0", Sctp, 9005, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("luna-lovegood-0", "cedric-diggory-1", Sctp, 9003, true),
                poke("luna-lovegood-1", "cedric-diggory-1", Sctp, 9005, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-1", Sctp, 9003, false),
        poke("luna-lovegood-1", "harry-potter-1", Sctp, 9005, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("luna-lovegood-0", "draco-malfoy-0", Sctp, 9003, false),
                poke("luna-lovegood-1", "draco-malfoy-0", Sctp, 9005, true),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 2);
    c.run(s, "Should support an 'pass-egress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-1", Sctp, 9003, true),
        poke("luna-lovegood-1", "harry-potter-1", Sctp, 9005, true),
    ])]);
    swap(&mut p, Dir::Egress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-egress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("luna-lovegood-0", "draco-malfoy-0", Sctp, 9003, true),
                poke("luna-lovegood-1", "draco-malfoy-0", Sctp, 9005, true),
            ],
        )],
    );

    // CNPAdminTierEgressNamedPort: the TCP fixture, its Accept rule at TCP 8080 rewritten
    // as the named port `web` (TCP 80).
    let mut p = egress_tcp;
    set_protocols(
        &mut p,
        Dir::Egress,
        5,
        json!([{"destinationNamedPort": "serve-80-tcp"}]),
    );
    c.run(
        "CNPAdminTierEgressNamedPort",
        "Should support an 'allow-egress' policy for named port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Tcp, 80, true),
                poke("harry-potter-1", "cedric-diggory-1", Tcp, 8080, false),
            ],
        )],
    );

    // CNPAdminTierEgressNodePeers: base/admin_tier/experimental-egress-selector-rules.yaml.
    let s = "CNPAdminTierEgressNodePeers";
    let linux = json!({"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}});
    let p = cnp(
        "node-and-cidr-as-peers-example",
        Tier::Admin,
        75,
        &pods_subject("gryffindor"),
        &[(
            Dir::Egress,
            vec![
                rule(
                    "allow-egress-to-80-on-nodes",
                    "Accept",
                    Dir::Egress,
                    std::slice::from_ref(&linux),
                    Some(&[number(host_port(0))]),
                ),
                rule(
                    "pass-egress-to-80-on-nodes",
                    "Pass",
                    Dir::Egress,
                    std::slice::from_ref(&linux),
                    Some(&[number(host_port(2))]),
                ),
                rule(
                    "deny-egress-to-slytherin-and-nodes-and-internet",
                    "Deny",
                    Dir::Egress,
                    &[
                        pods_peer("slytherin"),
                        linux.clone(),
                        json!({"networks": ["0.0.0.0/0", "::/0"]}),
                    ],
                    None,
                ),
            ],
        )],
    );
    c.run(
        s,
        "Should support an 'allow-egress' rule policy for egress-node-peer",
        vec![step(&[&p], vec![poke_node("harry-potter-1", 0, true)])],
    );
    c.run(
        s,
        "Should support a 'pass-egress' rule policy for egress-node-peer",
        vec![step(&[&p], vec![poke_node("harry-potter-1", 2, true)])],
    );
    c.run(
        s,
        "Should support a 'deny-egress' rule policy for egress-node-peer",
        vec![step(
            &[&p],
            vec![
                poke_node("harry-potter-1", 1, false),
                poke_node("harry-potter-1", 4, false),
                poke_node("harry-potter-1", 6, false),
            ],
        )],
    );

    // CNPAdminTierGress: base/admin_tier/standard-gress-rules-combined.yaml.
    let every = [(Tcp, 80), (Udp, 53), (Sctp, 9003)];
    let mut p = standard(
        "gress-rules",
        Tier::Admin,
        15,
        "gryffindor",
        &[
            (
                Dir::Egress,
                everything_at(
                    "ravenclaw",
                    ("slytherin", &every),
                    ("hufflepuff", &[(Tcp, 8080), (Udp, 5353), (Sctp, 9003)]),
                ),
            ),
            (
                Dir::Ingress,
                everything_at(
                    "ravenclaw",
                    ("slytherin", &every),
                    ("hufflepuff", &[(Tcp, 80), (Udp, 5353), (Sctp, 9003)]),
                ),
            ),
        ],
    );
    gress_rows(&mut c, "CNPAdminTierGress", &mut p, true);

    // CNPAdminTierEgressInlineCIDRPeers: base/admin_tier/standard-egress-inline-cidr-rules.yaml.
    let p = cnp(
        "inline-cidr-as-peers-example",
        Tier::Admin,
        85,
        &pods_subject("gryffindor"),
        &[(Dir::Egress, cidr_rules())],
    );
    inline_cidr_rows(&mut c, "CNPAdminTierEgressInlineCIDRPeers", p, universe);

    // CNPAdminTierPriorityField: base/admin_tier/standard-priority-field.yaml.
    let s = "CNPAdminTierPriorityField";
    let both = |name: &str, tier: Tier, priority: i64, action: &str, verb: &str| {
        cnp(
            name,
            tier,
            priority,
            &pods_subject("gryffindor"),
            &[
                (
                    Dir::Ingress,
                    vec![rule(
                        &format!("{verb}-all-ingress-from-slytherin"),
                        action,
                        Dir::Ingress,
                        &[pods_peer("slytherin")],
                        None,
                    )],
                ),
                (
                    Dir::Egress,
                    vec![rule(
                        &format!("{verb}-all-egress-to-slytherin"),
                        action,
                        Dir::Egress,
                        &[pods_peer("slytherin")],
                        None,
                    )],
                ),
            ],
        )
    };
    let deny_50 = both("priority-50-example", Tier::Admin, 50, "Deny", "deny");
    let mut pass_60 = both(
        "old-priority-60-new-priority-40-example",
        Tier::Admin,
        60,
        "Pass",
        "pass",
    );
    let accept = both("default", Tier::Baseline, 10, "Accept", "allow");
    c.run(
        s,
        "Should Deny traffic from slytherin to gryffindor respecting admin CNP",
        vec![step(
            &[&deny_50, &pass_60, &accept],
            vec![
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, false),
            ],
        )],
    );
    c.run(
        s,
        "Should Deny traffic to slytherin from gryffindor respecting admin CNP",
        vec![step(
            &[&deny_50, &pass_60, &accept],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, false),
            ],
        )],
    );
    pass_60["spec"]["priority"] = json!(40);
    c.run(s, "Should respect admin CNP priority field; thus passing both ingress and egress traffic over to baseline CNP", vec![step(&[&deny_50, &pass_60, &accept], vec![
        poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, true),
        poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
        poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, true),
        poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
    ])]);

    // CNPAdminTierIntegration: base/api_integration/standard-anp-np-banp.yaml.
    let s = "CNPAdminTierIntegration";
    let slytherin = json!({"namespaces": house_selector("slytherin")});
    let gress = |name: &str, tier: Tier, priority: i64| {
        cnp(
            name,
            tier,
            priority,
            &json!({"namespaces": house_selector("gryffindor")}),
            &[
                (
                    Dir::Ingress,
                    vec![rule(
                        "deny-all-ingress-from-slytherin",
                        "Deny",
                        Dir::Ingress,
                        std::slice::from_ref(&slytherin),
                        None,
                    )],
                ),
                (
                    Dir::Egress,
                    vec![rule(
                        "deny-all-egress-to-slytherin",
                        "Deny",
                        Dir::Egress,
                        std::slice::from_ref(&slytherin),
                        None,
                    )],
                ),
            ],
        )
    };
    let mut admin = gress("pass-example", Tier::Admin, 10);
    let baseline = gress("default", Tier::Baseline, 10);
    let np: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": ns_of("gryffindor"), "name": "allow-gress-from-to-slytherin-to-gryffindor"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": house_selector("slytherin")}]}],
            "egress": [{"to": [{"namespaceSelector": house_selector("slytherin")}]}],
        },
    }))
    .unwrap_or_else(|e| panic!("the integration NetworkPolicy: {e}"));
    let with_np = |cnps: &[&Value], pokes| ClusterStep {
        policies: vec![np.clone()],
        ..step(cnps, pokes)
    };
    c.run(
        s,
        "Should Deny traffic from slytherin to gryffindor respecting admin CNP",
        vec![with_np(
            &[&admin, &baseline],
            vec![
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, false),
            ],
        )],
    );
    c.run(
        s,
        "Should Deny traffic to slytherin from gryffindor respecting admin CNP",
        vec![with_np(
            &[&admin, &baseline],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, false),
            ],
        )],
    );
    set_action(&mut admin, Dir::Ingress, 0, "Pass");
    c.run(s, "Should support a 'pass-ingress' policy for admin CNP and respect the match for network policy", vec![with_np(&[&admin, &baseline], vec![
        poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, true),
        poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
    ])]);
    set_action(&mut admin, Dir::Egress, 0, "Pass");
    c.run(s, "Should support a 'pass-egress' policy for admin CNP and respect the match for network policy", vec![with_np(&[&admin, &baseline], vec![
        poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, true),
        poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
    ])]);
    c.run(s, "Should support a 'pass-ingress' policy for admin CNP and respect the match for baseline cluster network policy", vec![step(&[&admin, &baseline], vec![
        poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
        poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, false),
    ])]);
    c.run(s, "Should support a 'pass-egress' policy for admin CNP and respect the match for baseline cluster network policy", vec![step(&[&admin, &baseline], vec![
        poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
        poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, false),
    ])]);

    // CNPBaselineTierIngressTCP: base/baseline_tier/standard-ingress-tcp-rules.yaml.
    let s = "CNPBaselineTierIngressTCP";
    let baseline_ingress_tcp = standard(
        "default",
        Tier::Baseline,
        10,
        "gryffindor",
        &[(
            Dir::Ingress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Tcp, 80)]),
                ("hufflepuff", &[(Tcp, 80)]),
            ),
        )],
    );
    let mut p = baseline_ingress_tcp.clone();
    c.run(s, "Should support an 'allow-ingress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-0", Tcp, 80, true),
        poke("luna-lovegood-1", "harry-potter-0", Tcp, 8080, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Tcp, 80, true),
                poke("cedric-diggory-1", "harry-potter-1", Tcp, 8080, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-1", Tcp, 80, false),
        poke("luna-lovegood-1", "harry-potter-1", Tcp, 8080, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
            ],
        )],
    );

    // CNPBaselineTierIngressUDP: base/baseline_tier/standard-ingress-udp-rules.yaml.
    let s = "CNPBaselineTierIngressUDP";
    let mut p = standard(
        "default",
        Tier::Baseline,
        10,
        "hufflepuff",
        &[(
            Dir::Ingress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Udp, 5353)]),
                ("gryffindor", &[(Udp, 53)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-ingress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "cedric-diggory-0", Udp, 53, true),
        poke("luna-lovegood-1", "cedric-diggory-0", Udp, 5353, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Udp, 53, true),
                poke("harry-potter-1", "cedric-diggory-1", Udp, 5353, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "cedric-diggory-1", Udp, 53, false),
        poke("luna-lovegood-1", "cedric-diggory-1", Udp, 5353, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "cedric-diggory-0", Udp, 5353, false),
                poke("draco-malfoy-1", "cedric-diggory-0", Udp, 53, true),
            ],
        )],
    );

    // CNPBaselineTierIngressSCTP: base/baseline_tier/standard-ingress-sctp-rules.yaml.
    let s = "CNPBaselineTierIngressSCTP";
    let mut p = standard(
        "default",
        Tier::Baseline,
        10,
        "ravenclaw",
        &[(
            Dir::Ingress,
            everything_at(
                "gryffindor",
                ("slytherin", &[(Sctp, 9003)]),
                ("hufflepuff", &[(Sctp, 9003)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-ingress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-0", Sctp, 9003, true),
        poke("harry-potter-1", "luna-lovegood-0", Sctp, 9005, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-ingress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "luna-lovegood-1", Sctp, 9003, true),
                poke("cedric-diggory-1", "luna-lovegood-1", Sctp, 9005, false),
            ],
        )],
    );
    swap(&mut p, Dir::Ingress, 0, 1);
    c.run(s, "Should support an 'deny-ingress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-1", Sctp, 9003, false),
        poke("harry-potter-1", "luna-lovegood-1", Sctp, 9005, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-ingress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("draco-malfoy-0", "luna-lovegood-0", Sctp, 9003, false),
                poke("draco-malfoy-1", "luna-lovegood-0", Sctp, 9005, true),
            ],
        )],
    );

    // CNPBaselineTierIngressNamedPort: the TCP fixture, its Accept rule at TCP 80
    // rewritten as the named port `web`.
    let mut p = baseline_ingress_tcp;
    set_protocols(
        &mut p,
        Dir::Ingress,
        3,
        json!([{"destinationNamedPort": "serve-80-tcp"}]),
    );
    c.run(
        "CNPBaselineTierIngressNamedPort",
        "Should support an 'allow-ingress' policy for named port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Tcp, 80, true),
                poke("cedric-diggory-1", "harry-potter-1", Tcp, 8080, false),
            ],
        )],
    );

    // CNPBaselineTierEgressTCP: base/baseline_tier/standard-egress-tcp-rules.yaml.
    let s = "CNPBaselineTierEgressTCP";
    let mut p = standard(
        "default",
        Tier::Baseline,
        10,
        "gryffindor",
        &[(
            Dir::Egress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Tcp, 80)]),
                ("hufflepuff", &[(Tcp, 8080)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-egress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-0", Tcp, 80, true),
        poke("harry-potter-1", "luna-lovegood-0", Tcp, 8080, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Tcp, 8080, true),
                poke("harry-potter-1", "cedric-diggory-1", Tcp, 80, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for TCP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("harry-potter-0", "luna-lovegood-1", Tcp, 80, false),
        poke("harry-potter-1", "luna-lovegood-1", Tcp, 8080, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for TCP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
            ],
        )],
    );

    // CNPBaselineTierEgressUDP: base/baseline_tier/standard-egress-udp-rules.yaml.
    let s = "CNPBaselineTierEgressUDP";
    let baseline_egress_udp = standard(
        "default",
        Tier::Baseline,
        10,
        "hufflepuff",
        &[(
            Dir::Egress,
            everything_at(
                "ravenclaw",
                ("slytherin", &[(Udp, 5353)]),
                ("gryffindor", &[(Udp, 53)]),
            ),
        )],
    );
    let mut p = baseline_egress_udp.clone();
    c.run(s, "Should support an 'allow-egress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("cedric-diggory-0", "luna-lovegood-0", Udp, 53, true),
        poke("cedric-diggory-1", "luna-lovegood-0", Udp, 5353, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Udp, 53, true),
                poke("cedric-diggory-1", "harry-potter-1", Udp, 5353, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for UDP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("cedric-diggory-0", "luna-lovegood-1", Udp, 53, false),
        poke("cedric-diggory-1", "luna-lovegood-1", Udp, 5353, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for UDP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "draco-malfoy-0", Udp, 5353, false),
                poke("cedric-diggory-1", "draco-malfoy-0", Udp, 53, true),
            ],
        )],
    );

    // CNPBaselineTierEgressSCTP: base/baseline_tier/standard-egress-sctp-rules.yaml.
    let s = "CNPBaselineTierEgressSCTP";
    let mut p = standard(
        "default",
        Tier::Baseline,
        10,
        "ravenclaw",
        &[(
            Dir::Egress,
            everything_at(
                "gryffindor",
                ("slytherin", &[(Sctp, 9003)]),
                ("hufflepuff", &[(Sctp, 9003)]),
            ),
        )],
    );
    c.run(s, "Should support an 'allow-egress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-0", Sctp, 9003, true),
        poke("luna-lovegood-1", "harry-potter-0", Sctp, 9005, true),
    ])]);
    c.run(
        s,
        "Should support an 'allow-egress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("luna-lovegood-0", "cedric-diggory-1", Sctp, 9003, true),
                poke("luna-lovegood-1", "cedric-diggory-1", Sctp, 9005, false),
            ],
        )],
    );
    swap(&mut p, Dir::Egress, 0, 1);
    c.run(s, "Should support an 'deny-egress' policy for SCTP protocol; ensure rule ordering is respected", vec![step(&[&p], vec![
        poke("luna-lovegood-0", "harry-potter-1", Sctp, 9003, false),
        poke("luna-lovegood-1", "harry-potter-1", Sctp, 9005, false),
    ])]);
    c.run(
        s,
        "Should support a 'deny-egress' policy for SCTP protocol at the specified port",
        vec![step(
            &[&p],
            vec![
                poke("luna-lovegood-0", "draco-malfoy-0", Sctp, 9003, false),
                poke("luna-lovegood-1", "draco-malfoy-0", Sctp, 9005, true),
            ],
        )],
    );

    // CNPBaselineTierEgressNamedPort: the UDP fixture, its Accept rule at UDP 53
    // rewritten as the named port `dns`.
    let mut p = baseline_egress_udp;
    set_protocols(
        &mut p,
        Dir::Egress,
        3,
        json!([{"destinationNamedPort": "serve-80-udp"}]),
    );
    c.run(
        "CNPBaselineTierEgressNamedPort",
        "Should support an 'allow-egress' policy for named port",
        vec![step(
            &[&p],
            vec![
                poke("cedric-diggory-0", "harry-potter-1", Udp, 53, true),
                poke("cedric-diggory-1", "harry-potter-1", Udp, 5353, false),
            ],
        )],
    );

    // CNPBaselineTierEgressNodePeers: base/baseline_tier/experimental-egress-selector-rules.yaml.
    let s = "CNPBaselineTierEgressNodePeers";
    let (_, first) = host_port(0);
    let (_, last) = host_port(1);
    let p = cnp(
        "default",
        Tier::Baseline,
        10,
        &json!({"namespaces": name_selector("gryffindor")}),
        &[(
            Dir::Egress,
            vec![
                rule(
                    "allow-egress-to-80-on-nodes",
                    "Accept",
                    Dir::Egress,
                    std::slice::from_ref(&linux),
                    Some(&[
                        json!({"tcp": {"destinationPort": {"range": {"start": first, "end": last}}}}),
                    ]),
                ),
                rule(
                    "deny-egress-to-nodes-and-internet",
                    "Deny",
                    Dir::Egress,
                    &[linux, json!({"networks": ["0.0.0.0/0", "::/0"]})],
                    None,
                ),
            ],
        )],
    );
    c.run(
        s,
        "Should support an 'allow-egress' rule policy for egress-node-peer",
        vec![step(
            &[&p],
            vec![
                poke_node("harry-potter-0", 0, true),
                poke_node("harry-potter-1", 1, true),
            ],
        )],
    );
    c.run(
        s,
        "Should support a 'deny-egress' rule policy for egress-node-peer",
        vec![step(
            &[&p],
            vec![
                poke_node("harry-potter-1", 4, false),
                poke_node("harry-potter-1", 6, false),
            ],
        )],
    );

    // CNPBaselineTierGress: base/baseline_tier/standard-gress-rules-combined.yaml.
    let mut p = standard(
        "default",
        Tier::Baseline,
        10,
        "gryffindor",
        &[
            (
                Dir::Egress,
                everything_at(
                    "ravenclaw",
                    ("slytherin", &every),
                    ("hufflepuff", &[(Tcp, 8080), (Udp, 5353), (Sctp, 9003)]),
                ),
            ),
            (
                Dir::Ingress,
                everything_at(
                    "ravenclaw",
                    ("slytherin", &every),
                    ("hufflepuff", &[(Tcp, 80), (Udp, 5353), (Sctp, 9003)]),
                ),
            ),
        ],
    );
    gress_rows(&mut c, "CNPBaselineTierGress", &mut p, false);

    // CNPBaselineTierEgressInlineCIDRPeers: base/baseline_tier/standard-egress-inline-cidr-rules.yaml.
    let p = cnp(
        "default",
        Tier::Baseline,
        10,
        &json!({"namespaces": name_selector("gryffindor")}),
        &[(Dir::Egress, cidr_rules())],
    );
    inline_cidr_rows(&mut c, "CNPBaselineTierEgressInlineCIDRPeers", p, universe);

    c.0
}

/// The `t.Run`s of the combined ingress and egress tests (Admin: all six; Baseline: the
/// first four, its policy having no Pass rules).
fn gress_rows(c: &mut Cases, s: &'static str, p: &mut Value, admin: bool) {
    use Protocol::{Sctp, Tcp, Udp};
    c.run(
        s,
        "Should support an 'allow-gress' policy across different protocols",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "luna-lovegood-0", Tcp, 80, true),
                poke("harry-potter-1", "luna-lovegood-0", Udp, 53, true),
                poke("harry-potter-0", "luna-lovegood-0", Sctp, 9003, true),
                poke("luna-lovegood-0", "harry-potter-0", Tcp, 80, true),
                poke("luna-lovegood-1", "harry-potter-0", Udp, 53, true),
                poke("luna-lovegood-1", "harry-potter-0", Sctp, 9003, true),
            ],
        )],
    );
    c.run(
        s,
        "Should support an 'allow-gress' policy across different protocols at the specified ports",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "cedric-diggory-1", Tcp, 8080, true),
                poke("harry-potter-1", "cedric-diggory-1", Tcp, 80, false),
                poke("harry-potter-0", "cedric-diggory-1", Udp, 5353, true),
                poke("harry-potter-1", "cedric-diggory-1", Udp, 53, false),
                poke("harry-potter-0", "cedric-diggory-1", Sctp, 9003, true),
                poke("harry-potter-1", "cedric-diggory-1", Sctp, 9005, false),
                poke("cedric-diggory-0", "harry-potter-1", Tcp, 80, true),
                poke("cedric-diggory-1", "harry-potter-1", Tcp, 8080, false),
                poke("cedric-diggory-0", "harry-potter-1", Udp, 5353, true),
                poke("cedric-diggory-1", "harry-potter-1", Udp, 53, false),
                poke("cedric-diggory-0", "harry-potter-1", Sctp, 9003, true),
                poke("cedric-diggory-1", "harry-potter-1", Sctp, 9005, false),
            ],
        )],
    );
    swap(p, Dir::Egress, 0, 1);
    swap(p, Dir::Ingress, 0, 1);
    c.run(
        s,
        "Should support an 'deny-gress' policy across different protocols",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "luna-lovegood-1", Tcp, 80, false),
                poke("harry-potter-1", "luna-lovegood-1", Udp, 53, false),
                poke("harry-potter-0", "luna-lovegood-1", Sctp, 9003, false),
                poke("luna-lovegood-0", "harry-potter-1", Tcp, 80, false),
                poke("luna-lovegood-1", "harry-potter-1", Udp, 53, false),
                poke("luna-lovegood-1", "harry-potter-1", Sctp, 9003, false),
            ],
        )],
    );
    c.run(
        s,
        "Should support a 'deny-gress' policy across different protocols at the specified ports",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, false),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
                poke("harry-potter-0", "draco-malfoy-0", Udp, 53, false),
                poke("harry-potter-1", "draco-malfoy-0", Udp, 5353, true),
                poke("harry-potter-0", "draco-malfoy-0", Sctp, 9003, false),
                poke("harry-potter-1", "draco-malfoy-0", Sctp, 9005, true),
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, false),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
                poke("draco-malfoy-0", "harry-potter-0", Udp, 53, false),
                poke("draco-malfoy-1", "harry-potter-0", Udp, 5353, true),
                poke("draco-malfoy-0", "harry-potter-0", Sctp, 9003, false),
                poke("draco-malfoy-1", "harry-potter-0", Sctp, 9005, true),
            ],
        )],
    );
    if !admin {
        return;
    }
    swap(p, Dir::Egress, 0, 2);
    swap(p, Dir::Ingress, 0, 2);
    c.run(
        s,
        "Should support an 'pass-gress' policy across different protocols",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "luna-lovegood-0", Tcp, 80, true),
                poke("harry-potter-0", "luna-lovegood-0", Udp, 5353, true),
                poke("harry-potter-0", "luna-lovegood-0", Sctp, 9003, true),
                poke("luna-lovegood-0", "harry-potter-0", Tcp, 80, true),
                poke("luna-lovegood-1", "harry-potter-0", Udp, 53, true),
                poke("luna-lovegood-1", "harry-potter-0", Sctp, 9003, true),
            ],
        )],
    );
    swap(p, Dir::Egress, 3, 4);
    swap(p, Dir::Ingress, 3, 4);
    c.run(
        s,
        "Should support a 'pass-gress' policy across different protocols at the specified ports",
        vec![step(
            &[p],
            vec![
                poke("harry-potter-0", "draco-malfoy-0", Tcp, 80, true),
                poke("harry-potter-1", "draco-malfoy-0", Tcp, 8080, true),
                poke("harry-potter-0", "draco-malfoy-0", Udp, 53, true),
                poke("harry-potter-1", "draco-malfoy-0", Udp, 5353, true),
                poke("harry-potter-0", "draco-malfoy-0", Sctp, 9003, true),
                poke("harry-potter-1", "draco-malfoy-0", Sctp, 9005, true),
                poke("draco-malfoy-0", "harry-potter-0", Tcp, 80, true),
                poke("draco-malfoy-1", "harry-potter-0", Tcp, 8080, true),
                poke("draco-malfoy-0", "harry-potter-0", Udp, 53, true),
                poke("draco-malfoy-1", "harry-potter-0", Udp, 5353, true),
                poke("draco-malfoy-0", "harry-potter-0", Sctp, 9003, true),
                poke("draco-malfoy-1", "harry-potter-0", Sctp, 9005, true),
            ],
        )],
    );
}

/// The egress rules of both inline CIDR fixtures: Accept to slytherin's pods, then Deny
/// to every address.
fn cidr_rules() -> Vec<Value> {
    vec![
        rule(
            "allow-egress-to-slytherin",
            "Accept",
            Dir::Egress,
            &[pods_peer("slytherin")],
            None,
        ),
        rule(
            "deny-egress-to-internet",
            "Deny",
            Dir::Egress,
            &[json!({"networks": ["0.0.0.0/0", "::/0"]})],
            None,
        ),
    ]
}

/// The two `t.Run`s of the inline CIDR tests: slytherin relabelled and back within the
/// first; the second with a rule to two pods' addresses prepended.
fn inline_cidr_rows(c: &mut Cases, s: &'static str, mut p: Value, universe: &Universe) {
    use Protocol::{Sctp, Tcp, Udp};
    let to = |server: &str, expected: bool| {
        [(Tcp, 80), (Udp, 53), (Sctp, 9003)]
            .into_iter()
            .map(|(protocol, port)| poke("harry-potter-1", server, protocol, port, expected))
            .collect::<Vec<_>>()
    };
    let slytherin = ns_of("slytherin");
    let relabelled = |house: &str| ClusterStep {
        namespace_labels: vec![(
            slytherin.to_owned(),
            vec![
                (METADATA_NAME.to_owned(), slytherin.to_owned()),
                (HOUSE_LABEL.to_owned(), house.to_owned()),
            ],
        )],
        ..step(&[&p], to("draco-malfoy-0", house == "slytherin"))
    };
    let first = [
        to("luna-lovegood-0", false),
        to("cedric-diggory-0", false),
        to("draco-malfoy-0", true),
    ]
    .concat();
    c.run(
        s,
        "Should support a 'deny-egress' rule policy for egress-cidr-peer",
        vec![
            step(&[&p], first),
            relabelled("denied-namespace-label"),
            relabelled("slytherin"),
        ],
    );
    let networks: Vec<String> = ["luna-lovegood-0", "cedric-diggory-0"]
        .iter()
        .flat_map(|server| {
            let pod = pod_named(universe, &pod_of(server));
            [
                format!("{}/32", address(pod, false)),
                format!("{}/128", address(pod, true)),
            ]
        })
        .collect();
    prepend(
        &mut p,
        Dir::Egress,
        rule(
            "allow-egress-to-specific-podIPs",
            "Accept",
            Dir::Egress,
            &[json!({"networks": networks})],
            None,
        ),
    );
    let pokes = [
        to("luna-lovegood-0", true),
        to("cedric-diggory-0", true),
        to("luna-lovegood-1", false),
        to("cedric-diggory-1", false),
    ]
    .concat();
    c.run(
        s,
        "Should support an 'allow-egress' rule policy for egress-cidr-peer",
        vec![step(&[&p], pokes)],
    );
}

/// A policy's tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Admin,
    Baseline,
}

/// A direction of a policy's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    fn key(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }

    /// The key of a rule's peers, and the word rule names use for it.
    fn peers(self) -> &'static str {
        match self {
            Self::Ingress => "from",
            Self::Egress => "to",
        }
    }
}

/// A ClusterNetworkPolicy with `rules` per direction.
fn cnp(
    name: &str,
    tier: Tier,
    priority: i64,
    subject: &Value,
    rules: &[(Dir, Vec<Value>)],
) -> Value {
    let mut spec = json!({
        "tier": match tier {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        },
        "priority": priority,
        "subject": subject,
    });
    for (dir, r) in rules {
        spec[dir.key()] = json!(r);
    }
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// What the standard fixtures' rules of one direction are made of: a house whose every
/// connection the first rules decide, a house denied (and passed) at some ports, and a
/// house accepted at some ports and denied the rest.
struct Standard<'a> {
    everything: &'a str,
    denied: (&'a str, &'a [(Protocol, u16)]),
    accepted: (&'a str, &'a [(Protocol, u16)]),
}

fn everything_at<'a>(
    everything: &'a str,
    denied: (&'a str, &'a [(Protocol, u16)]),
    accepted: (&'a str, &'a [(Protocol, u16)]),
) -> Standard<'a> {
    Standard {
        everything,
        denied,
        accepted,
    }
}

/// A standard fixture (the ingress, egress and combined tests of both tiers), whose
/// subject is the namespace of `subject` by name. Its rules of each direction, in order:
/// Accept, Deny and (Admin tier only) Pass of everything with `everything`; Deny and
/// (Admin only) Pass with `denied` at its ports; Accept with `accepted` at its ports,
/// then Deny of the rest with it. Houses are named by `kubernetes.io/metadata.name`.
fn standard(
    name: &str,
    tier: Tier,
    priority: i64,
    subject: &str,
    dirs: &[(Dir, Standard<'_>)],
) -> Value {
    let rules = dirs
        .iter()
        .map(|(dir, st)| {
            let (w, pass) = (dir.peers(), tier == Tier::Admin);
            let peer = |house: &str| [json!({"namespaces": name_selector(house)})];
            let ports = |ports: &[(Protocol, u16)]| {
                let numbers: Vec<String> = ports.iter().map(|(_, p)| p.to_string()).collect();
                let protocols: Vec<Value> = ports
                    .iter()
                    .map(|(proto, p)| number((*proto, port(*proto, *p))))
                    .collect();
                (numbers.join("-"), protocols)
            };
            let (denied_names, denied_protocols) = ports(st.denied.1);
            let (accepted_names, accepted_protocols) = ports(st.accepted.1);
            let mut r = vec![
                rule(
                    &format!("allow-{w}-{}-everything", st.everything),
                    "Accept",
                    *dir,
                    &peer(st.everything),
                    None,
                ),
                rule(
                    &format!("deny-{w}-{}-everything", st.everything),
                    "Deny",
                    *dir,
                    &peer(st.everything),
                    None,
                ),
            ];
            if pass {
                r.push(rule(
                    &format!("pass-{w}-{}-everything", st.everything),
                    "Pass",
                    *dir,
                    &peer(st.everything),
                    None,
                ));
            }
            let denied = format!("{w}-{}-at-port-{denied_names}", st.denied.0);
            r.push(rule(
                &format!("deny-{denied}"),
                "Deny",
                *dir,
                &peer(st.denied.0),
                Some(&denied_protocols),
            ));
            if pass {
                r.push(rule(
                    &format!("pass-{denied}"),
                    "Pass",
                    *dir,
                    &peer(st.denied.0),
                    Some(&denied_protocols),
                ));
            }
            r.push(rule(
                &format!("allow-{w}-{}-at-port-{accepted_names}", st.accepted.0),
                "Accept",
                *dir,
                &peer(st.accepted.0),
                Some(&accepted_protocols),
            ));
            r.push(rule(
                &format!("deny-{w}-{}-everything-else", st.accepted.0),
                "Deny",
                *dir,
                &peer(st.accepted.0),
                None,
            ));
            (*dir, r)
        })
        .collect::<Vec<_>>();
    cnp(
        name,
        tier,
        priority,
        &json!({"namespaces": name_selector(subject)}),
        &rules,
    )
}

/// A rule; `protocols` absent: every port of every protocol.
fn rule(name: &str, action: &str, dir: Dir, peers: &[Value], protocols: Option<&[Value]>) -> Value {
    let mut r = json!({"name": name, "action": action});
    r[dir.peers()] = json!(peers);
    if let Some(protocols) = protocols {
        r["protocols"] = json!(protocols);
    }
    r
}

/// A protocol match of one port (ours).
fn number((protocol, port): (Protocol, u16)) -> Value {
    json!({protocol.api_name().to_lowercase(): {"destinationPort": {"number": port}}})
}

/// The namespace of `house` by the API server's name label.
fn name_selector(house: &str) -> Value {
    json!({"matchLabels": {METADATA_NAME: ns_of(house)}})
}

/// Namespaces or pods of `house` by upstream's house label.
fn house_selector(house: &str) -> Value {
    json!({"matchLabels": {HOUSE_LABEL: house}})
}

/// The pods of `house` in the namespace of `house`, both by the house label.
fn pods_peer(house: &str) -> Value {
    json!({"pods": {"namespaceSelector": house_selector(house), "podSelector": house_selector(house)}})
}

/// A subject of the pods of `house`, as [`pods_peer`] selects them.
fn pods_subject(house: &str) -> Value {
    pods_peer(house)
}

/// The rules of `dir` of policy `p` (panics if it has none).
fn rules_mut(p: &mut Value, dir: Dir) -> &mut Vec<Value> {
    p["spec"][dir.key()]
        .as_array_mut()
        .unwrap_or_else(|| panic!("a policy without {} rules", dir.key()))
}

/// Swaps rules `i` and `j` of `dir` (upstream's rule-order mutations).
fn swap(p: &mut Value, dir: Dir, i: usize, j: usize) {
    rules_mut(p, dir).swap(i, j);
}

/// Replaces the protocols of rule `i` of `dir`.
fn set_protocols(p: &mut Value, dir: Dir, i: usize, protocols: Value) {
    rules_mut(p, dir)[i]["protocols"] = protocols;
}

/// Replaces the action of rule `i` of `dir`.
fn set_action(p: &mut Value, dir: Dir, i: usize, action: &str) {
    rules_mut(p, dir)[i]["action"] = json!(action);
}

/// Puts `rule` before the rules of `dir`.
fn prepend(p: &mut Value, dir: Dir, rule: Value) {
    rules_mut(p, dir).insert(0, rule);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_upstream_case_once() {
        let all = cluster_cases(&universe());
        assert_eq!(all.len(), 92);
        let names: BTreeSet<_> = all.iter().map(ClusterCase::name).collect();
        assert_eq!(names.len(), all.len(), "case names must be unique");
        let mut at = 0;
        for (short, runs) in SHORT_NAMES {
            let of: Vec<_> = all[at..at + runs].iter().map(|c| c.short_name).collect();
            assert!(of.iter().all(|s| *s == short), "{short}: {of:?}");
            at += runs;
        }
        assert_eq!(at, all.len());
    }

    #[test]
    fn cases_are_well_formed() {
        let u = universe();
        let pokes: usize = cluster_cases(&u)
            .iter()
            .flat_map(|c| &c.steps)
            .map(|s| s.pokes.len())
            .sum();
        // Upstream's PokeServer calls.
        assert_eq!(pokes, 301);
        for case in cluster_cases(&u) {
            assert!(!case.steps.is_empty(), "{}", case.name());
            for step in &case.steps {
                assert!(!step.pokes.is_empty(), "{}", case.name());
                for p in &step.cluster_policies {
                    let name = p["metadata"]["name"].as_str().unwrap_or_default();
                    let same = step
                        .cluster_policies
                        .iter()
                        .filter(|q| q["metadata"]["name"] == name)
                        .count();
                    assert_eq!(same, 1, "{}: two policies {name}", case.name());
                    for dir in ["ingress", "egress"] {
                        let rules = p["spec"][dir].as_array().map_or(0, Vec::len);
                        assert!(rules <= 25, "{}", case.name());
                    }
                }
                for poke in &step.pokes {
                    for v6 in [false, true] {
                        let (src, dst) = poke_addresses(&u, poke, v6);
                        assert_ne!(src, dst, "{}", case.name());
                    }
                }
            }
        }
    }

    #[test]
    fn node_pokes_leave_the_clients_node() {
        let u = universe();
        for from in ["x/a", "x/b"] {
            let server = other_node_server(&u, from);
            assert_ne!(
                server.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                node_of(&u, from).metadata.name.as_deref()
            );
            let node_ip: IpAddr = NODES
                .iter()
                .find(|(n, _, _)| {
                    Some(*n) == server.spec.as_ref().and_then(|s| s.node_name.as_deref())
                })
                .map(|(_, ips, _)| ips[0].parse().unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|| panic!("no node"));
            assert_eq!(address(server, false), node_ip);
        }
    }

    #[test]
    fn translations() {
        assert_eq!(pod_of("harry-potter-0"), "x/a");
        assert_eq!(pod_of("luna-lovegood-1"), "w/b");
        assert_eq!(port(Protocol::Udp, 5353), 81);
        assert_eq!(port(Protocol::Sctp, 9003), 80);
        assert_eq!(host_port(4), (Protocol::Udp, 81));
        // The mutations accumulate: the last Admin TCP ingress row has both swaps.
        let all = cluster_cases(&universe());
        let last = all
            .iter()
            .find(|c| {
                c.short_name == "CNPAdminTierIngressTCP"
                    && c.run.contains("'pass-ingress' policy for TCP protocol at")
            })
            .unwrap_or_else(|| panic!("row missing"));
        let names: Vec<&str> = last.steps[0].cluster_policies[0]["spec"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "pass-from-ravenclaw-everything",
                "allow-from-ravenclaw-everything",
                "deny-from-ravenclaw-everything",
                "pass-from-slytherin-at-port-80",
                "deny-from-slytherin-at-port-80",
                "allow-from-hufflepuff-at-port-80",
                "deny-from-hufflepuff-everything-else",
            ]
        );
    }
}
