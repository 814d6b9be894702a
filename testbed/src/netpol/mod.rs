//! NetworkPolicy test support: the cluster the upstream e2e suite probes, the cases of
//! that suite as table rows, and a reference model of the API's semantics.
//!
//! - [`Universe`]: 3 namespaces (`x`, `y`, `z`) × 3 pods (`a`, `b`, `c`), each pod serving
//!   ports 80 and 81 over TCP, UDP and SCTP with the container ports named as upstream's
//!   `model.go` names them (`serve-80-tcp`, …), dual-stack addresses, as Kubernetes
//!   objects (`k8s-openapi` types).
//! - [`cases`]: the cases of kubernetes `test/e2e/network/netpol/network_policy.go`,
//!   re-expressed as data: the policies (as the API takes them), label changes, and the
//!   reachability each probe expects.
//! - [`cluster_cases`]: the cases of the network-policy-api conformance suite for
//!   ClusterNetworkPolicy, re-expressed as data over a four-namespace universe with two
//!   Nodes: the policies in force at each step, label changes, and the connections
//!   upstream pokes with what each must find.
//! - [`model`]: which connections the API reference says a set of policies allows,
//!   written from the reference alone (it shares no code with the plugin's compiler), so
//!   that the compiler and the datapath can be checked against it.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use k8s_openapi::{
    api::core::v1::{Container, ContainerPort, Namespace, Node, Pod, PodIP, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

pub mod cases;
pub mod cluster_cases;
pub mod model;
pub mod probe;

/// The namespaces of the upstream suite.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
/// The pods of each namespace.
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// The ports every pod serves.
pub const PORTS: [u16; 2] = [80, 81];
/// The protocols every port is served over.
pub const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// A transport protocol a NetworkPolicy port can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The API's spelling (`TCP`, `UDP`, `SCTP`).
    #[must_use]
    pub fn api_name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }

    /// The IP protocol number.
    #[must_use]
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
            Self::Sctp => 132,
        }
    }
}

/// Upstream's name of the container port serving `port` over `protocol`.
#[must_use]
pub fn port_name(port: u16, protocol: Protocol) -> String {
    format!("serve-{port}-{}", protocol.api_name().to_lowercase())
}

/// `ns/pod`, the way upstream names a pod in its reachability tables.
#[must_use]
pub fn pod_string(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{pod}")
}

/// The objects of a cluster: namespaces and pods, with their labels, and the Nodes (whose
/// labels and addresses cluster policies' node peers pick).
#[derive(Debug, Clone)]
pub struct Universe {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
}

impl Universe {
    /// Upstream's cluster: namespaces labelled `ns=<name>`, pods labelled `pod=<name>`,
    /// each pod with one IPv4 address in 10.244.0.0/16 and one IPv6 address in
    /// fd00:10:244::/48; no Nodes.
    #[must_use]
    pub fn upstream() -> Self {
        let mut namespaces = Vec::new();
        let mut pods = Vec::new();
        for (ni, ns) in NAMESPACES.iter().enumerate() {
            namespaces.push(namespace(ns, &[("ns", ns)]));
            for (pi, name) in PODS.iter().enumerate() {
                let n = (ni * PODS.len() + pi + 10) as u8;
                let v4 = IpAddr::V4(Ipv4Addr::new(10, 244, 1, n));
                let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, n.into()));
                pods.push(pod(ns, name, &[("pod", name)], &[v4, v6]));
            }
        }
        Self {
            namespaces,
            pods,
            nodes: Vec::new(),
        }
    }

    /// The namespace called `name`.
    #[must_use]
    pub fn namespace(&self, name: &str) -> Option<&Namespace> {
        self.namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// The pod `namespace/name`.
    #[must_use]
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    /// Replaces the labels of namespace `name` (panics if it does not exist).
    pub fn set_namespace_labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        let Some(ns) = self
            .namespaces
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(name))
        else {
            panic!("no namespace {name}");
        };
        ns.metadata.labels = Some(label_map(labels));
    }

    /// Replaces the labels of pod `namespace/name` (panics if it does not exist).
    pub fn set_pod_labels(&mut self, namespace: &str, name: &str, labels: &[(&str, &str)]) {
        let Some(p) = self.pods.iter_mut().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        }) else {
            panic!("no pod {namespace}/{name}");
        };
        p.metadata.labels = Some(label_map(labels));
    }
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// ADDs `pod` on `node` with `conf` as the kubelet would (`CNI_ARGS` naming it
/// `namespace/name`) and publishes its Pod object, labelled `app=<name>`, with the address
/// ADD gave it: that address.
#[track_caller]
pub fn add_published(
    node: &crate::SimNode,
    api: &crate::ApiServer,
    conf: &serde_json::Value,
    pod: &crate::node::Pod,
    namespace: &str,
    name: &str,
) -> String {
    let env = pod.env("eth0").with_args(&format!(
        "K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
    ));
    let ip = crate::datapath::pod_ip(&node.exec_plugin("ADD", &env, conf).result());
    let addr: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"));
    let obj = self::pod(namespace, name, &[("app", name)], &[addr]);
    api.put("pods", serde_json::to_value(&obj).unwrap_or_default());
    ip
}

/// A NetworkPolicy object of `namespace` as the API serves it.
#[must_use]
pub fn policy_object(namespace: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    })
}

/// A Namespace object.
#[must_use]
pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(label_map(labels)),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// A running Pod object with upstream's containers: one per port and protocol, each with
/// its named container port.
#[must_use]
pub fn pod(namespace: &str, name: &str, labels: &[(&str, &str)], ips: &[IpAddr]) -> Pod {
    let containers = PORTS
        .iter()
        .flat_map(|port| PROTOCOLS.iter().map(move |proto| (*port, *proto)))
        .map(|(port, proto)| Container {
            name: format!("cont-{port}-{}", proto.api_name().to_lowercase()),
            ports: Some(vec![ContainerPort {
                container_port: i32::from(port),
                name: Some(port_name(port, proto)),
                protocol: Some(proto.api_name().to_owned()),
                ..ContainerPort::default()
            }]),
            ..Container::default()
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(label_map(labels)),
            uid: Some(format!("uid-{namespace}-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            pod_ip: ips.first().map(ToString::to_string),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..PodStatus::default()
        }),
    }
}
