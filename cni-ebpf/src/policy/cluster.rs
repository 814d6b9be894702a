//! The agent's view of the cluster that policies are compiled against: namespaces with
//! their labels, and pods with their labels, addresses and named container ports.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::core::v1::{Namespace, Pod};

use super::selector::Labels;

/// IP protocol numbers of the protocols a NetworkPolicy port can name.
pub mod proto {
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// SCTP.
    pub const SCTP: u8 = 132;
}

/// The protocol number of an API protocol name (`TCP` when absent), or `None` for a name
/// the API does not define.
#[must_use]
pub fn protocol_number(name: Option<&str>) -> Option<u8> {
    match name.unwrap_or("TCP") {
        "TCP" => Some(proto::TCP),
        "UDP" => Some(proto::UDP),
        "SCTP" => Some(proto::SCTP),
        _ => None,
    }
}

/// A named container port of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub proto: u8,
    pub port: u16,
}

/// What policies need to know of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Labels,
    /// Its addresses (`status.podIPs`); empty until the kubelet reports them.
    pub ips: Vec<IpAddr>,
    /// Its named container ports.
    pub ports: Vec<NamedPort>,
    /// Whether it runs in the node's network namespace: such a pod is never a policy
    /// target, and its addresses are the node's.
    pub host_network: bool,
    /// Whether it has finished (`Succeeded` or `Failed`): its addresses may be reused.
    pub finished: bool,
}

impl PodView {
    /// The view of an API object; `None` without a namespace or name.
    #[must_use]
    pub fn from_api(pod: &Pod) -> Option<Self> {
        let namespace = pod.metadata.namespace.clone()?;
        let name = pod.metadata.name.clone()?;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|ip| ip.ip.parse().ok())
            .collect();
        if ips.is_empty() {
            ips.extend(
                status
                    .and_then(|s| s.pod_ip.as_deref())
                    .and_then(|ip| ip.parse::<IpAddr>().ok()),
            );
        }
        let ports = spec
            .into_iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: p.name.clone()?,
                    proto: protocol_number(p.protocol.as_deref())?,
                    port: u16::try_from(p.container_port).ok()?,
                })
            })
            .collect();
        let phase = status.and_then(|s| s.phase.as_deref());
        Some(Self {
            namespace,
            name,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ips,
            ports,
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
        })
    }

    /// Whether its addresses stand for it as a peer: it has some, they are its own (not
    /// the node's), and it has not finished.
    #[must_use]
    pub fn is_peer(&self) -> bool {
        !self.ips.is_empty() && !self.host_network && !self.finished
    }

    /// The number of its container port `name` over `proto`.
    #[must_use]
    pub fn named_port(&self, name: &str, proto: u8) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.proto == proto)
            .map(|p| p.port)
    }
}

/// Namespaces and pods, as the agent's watchers see them.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// Namespace name → its labels.
    pub namespaces: BTreeMap<String, Labels>,
    /// Every pod.
    pub pods: Vec<PodView>,
}

impl Cluster {
    /// A view of API objects.
    #[must_use]
    pub fn from_api<'a>(
        namespaces: impl IntoIterator<Item = &'a Namespace>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Self {
        Self {
            namespaces: namespaces
                .into_iter()
                .filter_map(|n| {
                    Some((
                        n.metadata.name.clone()?,
                        n.metadata.labels.clone().unwrap_or_default(),
                    ))
                })
                .collect(),
            pods: pods.into_iter().filter_map(PodView::from_api).collect(),
        }
    }

    /// The pod `namespace/name`.
    #[must_use]
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodView> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }
}
