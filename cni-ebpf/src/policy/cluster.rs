//! The agent's view of the cluster that policies are compiled against: namespaces with
//! their labels, pods with their labels, addresses and named container ports, and nodes
//! with their labels and addresses (cluster policies' node peers).
//!
//! It is kept for the whole cluster on every node (a policy on this node's pods may name
//! any pod as a peer), so it holds only what policies read, compactly: a pod is its
//! namespace (shared), name, labels (each key and value shared by every pod that has it:
//! a Deployment's pods share theirs), addresses and named ports, a few hundred bytes. It is
//! changed object by object as the watchers report ([`Cluster::apply_pod`],
//! [`Cluster::delete_pod`], …), never rebuilt, and indexed by namespace, so a rule's peers
//! are found among the pods of the namespaces it names.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

use super::{
    selector::{LabelSet, Selector},
    tables::{addr_bits, AddrSet},
};

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

/// The key a pod's `namespace/name` has in the datapath's policy entries
/// (`PolicyEndpoint::pod`) and in [`Cluster`] (never 0).
#[must_use]
pub fn pod_key(namespace: &str, name: &str) -> u64 {
    match cni_ebpf_common::fnv1a64(&[namespace.as_bytes(), name.as_bytes()], b'/') {
        0 => 1,
        h => h,
    }
}

/// A label set's (key, value) pairs, sorted by key.
type LabelPairs = Arc<[(Arc<str>, Arc<str>)]>;

/// Strings shared by every object that holds them (label keys and values, namespace and
/// port names). Strings no object holds any more are dropped now and then.
#[derive(Debug, Default, Clone)]
pub struct Strings {
    set: HashSet<Arc<str>>,
    /// Label sets: the pods of a Deployment (of a ReplicaSet, a DaemonSet, a Job) share
    /// theirs, so a pod holds one pointer instead of its own list.
    label_sets: HashSet<LabelPairs>,
    /// Named port lists, shared as label sets are.
    port_lists: HashSet<Arc<[NamedPort]>>,
    /// How many the set held after the last sweep.
    swept: usize,
}

impl Strings {
    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.set.get(s) {
            return Arc::clone(a);
        }
        let a: Arc<str> = Arc::from(s);
        self.set.insert(Arc::clone(&a));
        a
    }

    /// The shared copy of the label set `v` (sorted).
    fn labels(&mut self, v: Vec<(Arc<str>, Arc<str>)>) -> LabelPairs {
        if let Some(a) = self.label_sets.get(v.as_slice()) {
            return Arc::clone(a);
        }
        let a: LabelPairs = Arc::from(v);
        self.label_sets.insert(Arc::clone(&a));
        a
    }

    /// The shared copy of the port list `v`.
    fn ports(&mut self, v: Vec<NamedPort>) -> Arc<[NamedPort]> {
        if let Some(a) = self.port_lists.get(v.as_slice()) {
            return Arc::clone(a);
        }
        let a: Arc<[NamedPort]> = Arc::from(v);
        self.port_lists.insert(Arc::clone(&a));
        a
    }

    /// Drops the strings, label sets and port lists only the sets hold, once they have
    /// doubled since the last sweep (a rollout's new label values replace the old ones).
    fn sweep(&mut self) {
        let held = self.set.len() + self.label_sets.len() + self.port_lists.len();
        if held < 2 * self.swept + 4096 {
            return;
        }
        self.label_sets.retain(|a| Arc::strong_count(a) > 1);
        self.port_lists.retain(|a| Arc::strong_count(a) > 1);
        self.set.retain(|a| Arc::strong_count(a) > 1);
        self.swept = self.set.len() + self.label_sets.len() + self.port_lists.len();
    }

    /// How many strings are held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// The labels of an object, sorted by key; the set, and each key and value, shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels(LabelPairs);

impl Default for Labels {
    fn default() -> Self {
        Self(Arc::from(Vec::new()))
    }
}

impl Labels {
    /// `map`'s labels, their strings shared through `strings`.
    pub fn new<'a>(
        map: impl IntoIterator<Item = (&'a String, &'a String)>,
        strings: &mut Strings,
    ) -> Self {
        let mut v: Vec<(Arc<str>, Arc<str>)> = map
            .into_iter()
            .map(|(k, v)| (strings.get(k), strings.get(v)))
            .collect();
        v.sort_unstable();
        Self(strings.labels(v))
    }

    /// Every (key, value), sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

impl LabelSet for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }
}

/// A named container port of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: Arc<str>,
    pub proto: u8,
    pub port: u16,
}

/// What policies need to know of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: Arc<str>,
    pub name: Box<str>,
    pub labels: Labels,
    /// Its addresses (`status.podIPs`); empty until the kubelet reports them.
    pub ips: Box<[IpAddr]>,
    /// Its named container ports (shared by the pods that have the same).
    pub ports: Arc<[NamedPort]>,
    /// Whether it runs in the node's network namespace: such a pod is never a policy
    /// target, and its addresses are the node's.
    pub host_network: bool,
    /// Whether it has finished (`Succeeded` or `Failed`): its addresses may be reused.
    pub finished: bool,
}

impl PodView {
    /// The view of an API object, its strings shared through `strings`; `None` without a
    /// namespace or name.
    #[must_use]
    pub fn from_api(pod: &Pod, strings: &mut Strings) -> Option<Self> {
        let namespace = strings.get(pod.metadata.namespace.as_deref()?);
        let name = pod.metadata.name.as_deref()?.into();
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
        let ports: Vec<NamedPort> = spec
            .into_iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: strings.get(p.name.as_deref()?),
                    proto: protocol_number(p.protocol.as_deref())?,
                    port: u16::try_from(p.container_port).ok()?,
                })
            })
            .collect();
        let phase = status.and_then(|s| s.phase.as_deref());
        Some(Self {
            namespace,
            name,
            labels: Labels::new(pod.metadata.labels.iter().flatten(), strings),
            ips: ips.into_boxed_slice(),
            ports: strings.ports(ports),
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
            .find(|p| &*p.name == name && p.proto == proto)
            .map(|p| p.port)
    }

    /// Its key in the datapath's policy entries and in [`Cluster`].
    #[must_use]
    pub fn key(&self) -> u64 {
        pod_key(&self.namespace, &self.name)
    }
}

/// Namespaces and pods, as the agent's watchers see them.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// Namespace name → its labels.
    namespaces: BTreeMap<Arc<str>, Labels>,
    /// Every pod, by [`PodView::key`].
    pods: BTreeMap<u64, PodView>,
    /// Namespace name → the keys of its pods.
    by_namespace: BTreeMap<Arc<str>, BTreeSet<u64>>,
    /// Node name → its labels and addresses.
    nodes: BTreeMap<Box<str>, NodeView>,
    strings: Strings,
}

/// What cluster policies need to know of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub labels: Labels,
    /// Its addresses (`status.addresses` that are IPs: InternalIP, ExternalIP).
    pub ips: Box<[IpAddr]>,
}

impl Cluster {
    /// A view of API objects.
    #[must_use]
    pub fn from_api<'a>(
        namespaces: impl IntoIterator<Item = &'a Namespace>,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Self {
        let mut c = Self::default();
        for n in namespaces {
            c.apply_namespace(n);
        }
        for p in pods {
            c.apply_pod(p);
        }
        c
    }

    /// A Namespace created or changed.
    pub fn apply_namespace(&mut self, ns: &Namespace) {
        let Some(name) = ns.metadata.name.as_deref() else {
            return;
        };
        let name = self.strings.get(name);
        let labels = Labels::new(ns.metadata.labels.iter().flatten(), &mut self.strings);
        self.namespaces.insert(name, labels);
    }

    /// A Node created or changed.
    pub fn apply_node(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        let ips = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| a.address.parse::<IpAddr>().ok())
            .collect::<Vec<_>>()
            .into_boxed_slice();
        let labels = Labels::new(node.metadata.labels.iter().flatten(), &mut self.strings);
        self.nodes.insert(name.into(), NodeView { labels, ips });
    }

    /// The Node `name` deleted.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Removes every Node for which `keep` does not hold.
    pub fn retain_nodes(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.nodes.retain(|name, _| keep(name));
    }

    /// The names of the namespaces whose labels `selector` matches.
    pub fn namespaces_matching<'a: 's, 's>(
        &'a self,
        selector: &'s Selector,
    ) -> impl Iterator<Item = &'a str> + 's {
        self.namespaces()
            .filter(|(_, labels)| selector.matches(*labels))
            .map(|(name, _)| name)
    }

    /// The pods that stand for their addresses as peers ([`PodView::is_peer`]) in
    /// `namespaces` whose labels `pods` matches.
    pub fn peers_matching<'a: 's, 's>(
        &'a self,
        namespaces: impl IntoIterator<Item = &'s str> + 's,
        pods: &'s Selector,
    ) -> impl Iterator<Item = &'a PodView> + 's {
        namespaces.into_iter().flat_map(move |ns| {
            self.pods_in(ns)
                .filter(move |p| p.is_peer() && pods.matches(&p.labels))
        })
    }

    /// The pods that stand for their addresses as peers with an address in `set`.
    pub fn peers_in<'a: 's, 's>(
        &'a self,
        set: &'s AddrSet,
    ) -> impl Iterator<Item = &'a PodView> + 's {
        self.pods()
            .filter(|p| p.is_peer() && p.ips.iter().any(|ip| set.contains_bits(addr_bits(*ip))))
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeView)> {
        self.nodes.iter().map(|(n, v)| (&**n, v))
    }

    /// The Namespace `name` deleted (its pods go with their own deletions).
    pub fn delete_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// A Pod created or changed.
    pub fn apply_pod(&mut self, pod: &Pod) {
        let Some(view) = PodView::from_api(pod, &mut self.strings) else {
            return;
        };
        let key = view.key();
        self.by_namespace
            .entry(Arc::clone(&view.namespace))
            .or_default()
            .insert(key);
        self.pods.insert(key, view);
        self.strings.sweep();
    }

    /// The Pod `namespace/name` deleted.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        let key = pod_key(namespace, name);
        if self.pods.remove(&key).is_none() {
            return;
        }
        if let Some(keys) = self.by_namespace.get_mut(namespace) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
    }

    /// Keeps only the pods `keep` says yes to (what a complete list still holds).
    pub fn retain_pods(&mut self, mut keep: impl FnMut(&PodView) -> bool) {
        let gone: Vec<(Arc<str>, Box<str>)> = self
            .pods
            .values()
            .filter(|p| !keep(p))
            .map(|p| (Arc::clone(&p.namespace), p.name.clone()))
            .collect();
        for (ns, name) in gone {
            self.delete_pod(&ns, &name);
        }
    }

    /// Keeps only the namespaces `keep` says yes to.
    pub fn retain_namespaces(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.namespaces.retain(|n, _| keep(n));
    }

    /// Every pod, in key order.
    pub fn pods(&self) -> impl Iterator<Item = &PodView> {
        self.pods.values()
    }

    /// The pods of namespace `namespace`.
    pub fn pods_in<'a>(&'a self, namespace: &str) -> impl Iterator<Item = &'a PodView> + 'a {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k))
    }

    /// Every namespace and its labels.
    pub fn namespaces(&self) -> impl Iterator<Item = (&str, &Labels)> {
        self.namespaces.iter().map(|(n, l)| (&**n, l))
    }

    /// The labels of namespace `name`, if it exists.
    #[must_use]
    pub fn namespace_labels(&self, name: &str) -> Option<&Labels> {
        self.namespaces.get(name)
    }

    /// The pod whose [`PodView::key`] is `key`.
    #[must_use]
    pub fn pod_by_key(&self, key: u64) -> Option<&PodView> {
        self.pods.get(&key)
    }

    /// The pod `namespace/name`.
    #[must_use]
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodView> {
        self.pod_by_key(pod_key(namespace, name))
            .filter(|p| &*p.namespace == namespace && &*p.name == name)
    }

    /// How many pods it holds.
    #[must_use]
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// How many shared strings it holds.
    #[must_use]
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name,
                         "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "status": {"podIPs": [{"ip": ip}], "phase": "Running"},
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_changed_one_by_one_indexed_by_namespace_and_share_their_strings() {
        let mut c = Cluster::default();
        c.apply_pod(&pod("x", "a", &[("app", "web")], "10.0.0.1"));
        c.apply_pod(&pod("x", "b", &[("app", "web")], "10.0.0.2"));
        c.apply_pod(&pod("y", "a", &[("app", "db")], "10.0.0.3"));
        assert_eq!(c.pod_count(), 3);
        assert_eq!(c.pods_in("x").count(), 2);
        let (a, b) = (c.pod("x", "a").unwrap(), c.pod("x", "b").unwrap());
        let ptr = |p: &PodView| p.labels.iter().next().map(|(_, v)| v.as_ptr());
        assert_eq!(ptr(a), ptr(b), "one copy of app=web");
        assert_eq!(c.pod("x", "a").unwrap().labels.label("app"), Some("web"));
        // A change replaces the pod; a delete removes it from its namespace too.
        c.apply_pod(&pod("x", "a", &[("app", "api")], "10.0.0.9"));
        assert_eq!(c.pod("x", "a").unwrap().ips[0].to_string(), "10.0.0.9");
        assert_eq!(c.pod_count(), 3);
        c.delete_pod("x", "a");
        c.delete_pod("x", "b");
        assert_eq!(c.pods_in("x").count(), 0);
        assert!(c.pod("x", "a").is_none());
        c.retain_pods(|p| &*p.namespace != "y");
        assert_eq!(c.pod_count(), 0);
    }
}
