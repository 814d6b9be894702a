//! Who an address is, for the flows: a pod (its namespace, name, workload and node), a
//! Service (its ClusterIPs), a node (its addresses), or the world. Kept by watchers of
//! Pods, Services and Nodes of their own, each object reduced to these few fields as it
//! arrives (nothing else of it is kept); a list (the first, or one after a `410`) replaces
//! what the one before it returned.
//!
//! What it costs: one entry per pod address, Service address and node address of the
//! cluster, its strings shared (a workload's name once for all its pods): about 150 bytes
//! per pod address, some 25 MB for a 150 000-pod cluster.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{runtime::watcher, Api, Client, ResourceExt as _};

use super::super::watch::{events, Volume};

/// What an address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Pod {
        namespace: Arc<str>,
        name: Arc<str>,
        /// The controller that owns it (`Deployment/web`, `DaemonSet/agent`), if any.
        workload: Option<Arc<str>>,
        node: Option<Arc<str>>,
    },
    Service {
        namespace: Arc<str>,
        name: Arc<str>,
    },
    Node {
        name: Arc<str>,
    },
}

/// The addresses the watchers know, by kind of object and its key.
#[derive(Debug, Default)]
struct Known {
    by_ip: HashMap<IpAddr, Identity>,
    /// Each object's addresses, by `kind/namespace/name`: what its change or deletion
    /// removes.
    ips_of: HashMap<String, Vec<IpAddr>>,
    strings: HashSet<Arc<str>>,
}

impl Known {
    fn share(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return Arc::clone(a);
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(Arc::clone(&a));
        a
    }

    fn set(&mut self, key: String, ips: Vec<IpAddr>, id: Option<Identity>) {
        self.remove(&key);
        let Some(id) = id else {
            return;
        };
        for ip in &ips {
            self.by_ip.insert(*ip, id.clone());
        }
        if !ips.is_empty() {
            self.ips_of.insert(key, ips);
        }
    }

    fn remove(&mut self, key: &str) {
        for ip in self.ips_of.remove(key).unwrap_or_default() {
            self.by_ip.remove(&ip);
        }
    }
}

/// The directory the flows are named from, shared by its watchers and the readers.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    known: Arc<Mutex<Known>>,
}

impl Directory {
    fn lock(&self) -> MutexGuard<'_, Known> {
        match self.known.lock() {
            Ok(g) => g,
            // A task that panicked aborted the process (panic = "abort").
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Who `ip` is, if known.
    #[must_use]
    pub fn lookup(&self, ip: IpAddr) -> Option<Identity> {
        self.lock().by_ip.get(&ip).cloned()
    }

    /// How many addresses it knows.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().by_ip.len()
    }

    /// Whether it knows none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A pod created or changed (a finished or host-network pod names no address of its
    /// own).
    pub fn apply_pod(&self, pod: &Pod) {
        let key = format!(
            "pod/{}/{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        );
        let mut k = self.lock();
        let status = pod.status.as_ref();
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let finished = matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let ips: Vec<IpAddr> = if host_network || finished {
            Vec::new()
        } else {
            status
                .and_then(|s| s.pod_ips.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|p| p.ip.parse().ok())
                .collect()
        };
        let id = Identity::Pod {
            namespace: k.share(&pod.namespace().unwrap_or_default()),
            name: Arc::from(pod.name_any()),
            workload: workload(pod).map(|w| k.share(&w)),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .map(|n| k.share(n)),
        };
        k.set(key, ips, Some(id));
    }

    /// A Service created or changed: its ClusterIPs.
    pub fn apply_service(&self, svc: &Service) {
        let ns = svc.namespace().unwrap_or_default();
        let key = format!("service/{ns}/{}", svc.name_any());
        let ips: Vec<IpAddr> = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ips.clone())
            .into_iter()
            .flatten()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        let mut k = self.lock();
        let id = Identity::Service {
            namespace: k.share(&ns),
            name: Arc::from(svc.name_any()),
        };
        k.set(key, ips, Some(id));
    }

    /// A Node created or changed: its addresses.
    pub fn apply_node(&self, node: &Node) {
        let key = format!("node//{}", node.name_any());
        let ips: Vec<IpAddr> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let mut k = self.lock();
        let id = Identity::Node {
            name: k.share(&node.name_any()),
        };
        k.set(key, ips, Some(id));
    }

    fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Removes every object of `kind` whose key is not in `seen` (after a list).
    fn keep_only(&self, kind: &str, seen: &HashSet<String>) {
        let mut k = self.lock();
        let prefix = format!("{kind}/");
        let gone: Vec<String> = k
            .ips_of
            .keys()
            .filter(|key| key.starts_with(&prefix) && !seen.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            k.remove(&key);
        }
        let used: HashSet<Arc<str>> = k
            .by_ip
            .values()
            .flat_map(|id| match id {
                Identity::Pod {
                    namespace,
                    workload,
                    node,
                    ..
                } => vec![Some(namespace), workload.as_ref(), node.as_ref()],
                Identity::Service { namespace, .. } => vec![Some(namespace)],
                Identity::Node { name } => vec![Some(name)],
            })
            .flatten()
            .cloned()
            .collect();
        k.strings.retain(|s| used.contains(s));
    }
}

/// The workload that owns `pod`: its controller, a ReplicaSet of a Deployment named as
/// its Deployment (the ReplicaSet's name less the pod template hash).
fn workload(pod: &Pod) -> Option<String> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    if owner.kind == "ReplicaSet" {
        if let Some(deployment) = hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}"))) {
            return Some(format!("Deployment/{deployment}"));
        }
    }
    Some(format!("{}/{}", owner.kind, owner.name))
}

/// Keeps `dir` from the API server: Pods, Services and Nodes watched until the stream
/// ends (never: the watchers retry with backoff).
pub fn watch(
    client: &Client,
    config: &watcher::Config,
    dir: &Directory,
) -> impl Stream<Item = ()> + Send + 'static {
    let config = config.clone();
    futures::stream::select_all([
        keep(
            Api::<Pod>::all(client.clone()),
            config.clone(),
            dir.clone(),
            "pod",
            |d, p| d.apply_pod(p),
        )
        .boxed(),
        keep(
            Api::<Service>::all(client.clone()),
            config.clone(),
            dir.clone(),
            "service",
            |d, s| d.apply_service(s),
        )
        .boxed(),
        keep(
            Api::<Node>::all(client.clone()),
            config,
            dir.clone(),
            "node",
            |d, n| d.apply_node(n),
        )
        .boxed(),
    ])
}

/// One watcher of `K` keeping `dir`'s entries of `kind`.
fn keep<K>(
    api: Api<K>,
    config: watcher::Config,
    dir: Directory,
    kind: &'static str,
    apply: fn(&Directory, &K),
) -> impl Stream<Item = ()> + Send
where
    K: super::super::watch::Watched + kube::ResourceExt,
{
    let key = move |o: &K| {
        format!(
            "{kind}/{}/{}",
            o.namespace().unwrap_or_default(),
            o.name_any()
        )
    };
    let mut seen: Option<HashSet<String>> = None;
    events(api, config, Volume::Large).map(move |event| match event {
        Ok(watcher::Event::Init) => seen = Some(HashSet::new()),
        Ok(watcher::Event::InitApply(o)) => {
            apply(&dir, &o);
            if let Some(s) = seen.as_mut() {
                s.insert(key(&o));
            }
        }
        Ok(watcher::Event::InitDone) => {
            if let Some(s) = seen.take() {
                dir.keep_only(kind, &s);
            }
        }
        Ok(watcher::Event::Apply(o)) => apply(&dir, &o),
        Ok(watcher::Event::Delete(o)) => dir.remove(&key(&o)),
        Err(e) => tracing::warn!("flows: watching {kind}s: {e}; retrying"),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use serde_json::json;

    use super::*;

    fn pod(name: &str, ip: &str, owner: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": name,
                "labels": {"pod-template-hash": "5d8f7"}, "ownerReferences": owner},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIPs": [{"ip": ip}]},
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_named_with_their_workload_and_go_with_their_object() {
        let d = Directory::default();
        let rs = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f7",
            "uid": "u", "controller": true}]);
        d.apply_pod(&pod("web-5d8f7-abcde", "10.244.1.2", rs));
        let ds = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
            "uid": "v", "controller": true}]);
        d.apply_pod(&pod("agent-x", "10.244.1.3", ds));
        d.apply_pod(&pod("bare", "10.244.1.4", json!([])));
        let workload_of = |ip: &str| match d.lookup(ip.parse().unwrap()) {
            Some(Identity::Pod { workload, .. }) => workload.map(|w| w.to_string()),
            other => panic!("{other:?}"),
        };
        assert_eq!(workload_of("10.244.1.2").as_deref(), Some("Deployment/web"));
        assert_eq!(
            workload_of("10.244.1.3").as_deref(),
            Some("DaemonSet/agent")
        );
        assert_eq!(workload_of("10.244.1.4"), None);
        // A new address replaces the old one; a list without the pod removes it.
        d.apply_pod(&pod("bare", "10.244.1.9", json!([])));
        assert!(d.lookup("10.244.1.4".parse().unwrap()).is_none());
        let seen: HashSet<String> = ["pod/shop/agent-x".to_owned()].into();
        d.keep_only("pod", &seen);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn services_and_nodes_are_named_by_their_addresses() {
        let d = Directory::default();
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "db"},
            "spec": {"clusterIPs": ["10.96.0.10", "fd00:96::a"]},
        }))
        .unwrap();
        d.apply_service(&svc);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node-a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"},
                {"type": "Hostname", "address": "node-a"}]},
        }))
        .unwrap();
        d.apply_node(&node);
        assert!(matches!(
            d.lookup("fd00:96::a".parse().unwrap()),
            Some(Identity::Service { name, .. }) if &*name == "db"
        ));
        assert!(matches!(
            d.lookup("198.18.0.2".parse().unwrap()),
            Some(Identity::Node { name }) if &*name == "node-a"
        ));
        assert_eq!(d.len(), 3);
    }
}
