//! The agent's view of the cluster — Namespaces, Pods and NetworkPolicies, kept by
//! kube-runtime watchers and reflectors, never by re-listing — and the loop that puts it
//! in force on every network of the node ([`super::Reconciler`]).
//!
//! - Each watcher lists once, then watches from the list's resource version; a dropped
//!   watch resumes from the last version seen, a `410 Gone` (history compacted) lists
//!   again, an unreachable API server is retried with backoff. The reflector's store is
//!   swapped whole when a re-list is done, so a round never sees half a list.
//! - A round runs after a change (a short settling delay lets a burst of changes make one
//!   round), and once a second when the node's pod interfaces changed (a pod ADDed before
//!   its Pod object changed). Nothing runs before all three stores hold a complete list:
//!   an empty store would read as "no policies" and open every pod.
//! - Each network below the bpffs root (or each one named) is reconciled; a network
//!   without pins yet is skipped until its first pod loads it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use futures::{stream::select_all, Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::NetworkPolicy,
};
use kube::{
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher, WatchStreamExt as _,
    },
    Api, Client, Resource as _,
};
use tokio::sync::Notify;

use super::{
    ready::{Job, Readiness},
    report::{write_state, NetworkState, SharedTotals},
    Reconciler,
};
use crate::{
    datapath::Datapath,
    error::{Error, Result},
    k8s::{ApiArgs, ApiClient},
    policy::Cluster,
};

/// How long a round waits after a change for more changes of the same burst.
const SETTLE: Duration = Duration::from_millis(30);
/// How often the node's pod interfaces are looked at for new ones.
const TICK: Duration = Duration::from_secs(1);

/// The three stores the rounds read.
struct View {
    namespaces: Store<Namespace>,
    pods: Store<Pod>,
    policies: Store<NetworkPolicy>,
}

impl View {
    async fn ready(&self) -> bool {
        self.namespaces.wait_until_ready().await.is_ok()
            && self.pods.wait_until_ready().await.is_ok()
            && self.policies.wait_until_ready().await.is_ok()
    }

    fn cluster(&self) -> Cluster {
        let namespaces = self.namespaces.state();
        let pods = self.pods.state();
        Cluster::from_api(
            namespaces.iter().map(Arc::as_ref),
            pods.iter().map(Arc::as_ref),
        )
    }

    fn policies(&self) -> Vec<NetworkPolicy> {
        self.policies
            .state()
            .iter()
            .map(|p| NetworkPolicy::clone(p))
            .collect()
    }
}

/// One watcher (list, then watch; `config` narrows it) feeding `writer`'s store, whose
/// events (but the first pages of a list) wake the rounds.
pub(super) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
) -> impl Stream<Item = bool> + Send
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .map(move |event| match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => false,
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("watching {kind}: {e}; retrying");
                false
            }
        })
}

/// A client of the API server `api` names, retried every 2 s until one can be made (`job`
/// names who waits in the log).
pub(super) async fn client(api: &ApiArgs, job: &str) -> Client {
    loop {
        match ApiClient::new(api) {
            Ok(c) => return c.client(),
            Err(e) => {
                tracing::warn!("{job}: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// The agent's Event recorder on `client`.
pub(super) fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: "cni-ebpf-agent".into(),
            instance: std::env::var("NODE_NAME").ok(),
        },
    )
}

/// Drives `events` on a task of its own; the returned `Notify` is woken by each event
/// that asks for a round.
pub(super) fn wake_on(
    mut events: impl Stream<Item = bool> + Send + Unpin + 'static,
) -> Arc<Notify> {
    let changed = Arc::new(Notify::new());
    let notify = Arc::clone(&changed);
    tokio::spawn(async move {
        while let Some(wake) = events.next().await {
            if wake {
                notify.notify_one();
            }
        }
    });
    changed
}

fn start(client: &Client, config: &watcher::Config) -> (View, impl Stream<Item = bool> + Send) {
    let (namespaces, ns_w) = reflector::store();
    let (pods, pod_w) = reflector::store();
    let (policies, np_w) = reflector::store();
    let streams = select_all([
        watch(Api::<Namespace>::all(client.clone()), config.clone(), ns_w).boxed(),
        watch(Api::<Pod>::all(client.clone()), config.clone(), pod_w).boxed(),
        watch(
            Api::<NetworkPolicy>::all(client.clone()),
            config.clone(),
            np_w,
        )
        .boxed(),
    ]);
    (
        View {
            namespaces,
            pods,
            policies,
        },
        streams,
    )
}

/// The networks to reconcile: those named, else every directory below `root`.
pub(super) fn networks(root: &Path, named: &[String]) -> Vec<PathBuf> {
    if !named.is_empty() {
        return named.iter().map(|n| root.join(n)).collect();
    }
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(std::result::Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// What a network's pod interfaces are now (for the tick): (ifindex, owner, pod) of the
/// slot in force.
fn interfaces(dp: &Datapath) -> Vec<(u32, u64, u64)> {
    let Ok(state) = dp.policy_state() else {
        return Vec::new();
    };
    let mut v: Vec<(u32, u64, u64)> = dp
        .policy_endpoints()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.slot == state.slot & 1)
        .map(|(k, e)| (k.ifindex, e.owner, e.pod))
        .collect();
    v.sort_unstable();
    v
}

/// One network: its datapath, its reconciler, the interfaces of its last round and the
/// state that round left.
type Network = (Datapath, Reconciler, Vec<(u32, u64, u64)>, NetworkState);

/// Every network the agent enforces policy on.
struct Enforcer {
    root: PathBuf,
    named: Vec<String>,
    networks: BTreeMap<PathBuf, Network>,
    /// Pods closed by a policy the datapath cannot hold, and why: each reported once
    /// (an Event on the pod) until the reason changes.
    closed: BTreeSet<(String, String)>,
    /// Where each network's state file goes.
    state_dir: PathBuf,
    /// Verdict totals per policy, for the metrics.
    totals: SharedTotals,
    /// How long each renewal of the agent's lease on a network's policy holds.
    lease: Duration,
}

/// Renews the agent's lease on `dp`'s policy for `lease` after a round that kept it
/// current: while it holds, ADD lets a pod of a namespace without policies start open;
/// once it runs out (no agent, or rounds that keep failing), ADD closes new pods.
fn renew(dp: &Datapath, network: &str, lease: Duration) {
    let secs = u32::try_from(lease.as_secs()).unwrap_or(u32::MAX);
    let until = crate::datapath::node::boottime_s().saturating_add(secs);
    if let Err(e) = dp.renew_agent_lease(until) {
        tracing::warn!("{network}: renewing the policy lease: {e}");
    }
}

impl Enforcer {
    /// A round on every network; `only_if_interfaces_changed` for the tick. Returns the
    /// pods closed by a policy that cannot be held and not reported yet (`ns/name`, why).
    fn round(&mut self, view: &View, only_if_interfaces_changed: bool) -> Vec<(String, String)> {
        let mut fresh = Vec::new();
        for dir in networks(&self.root, &self.named) {
            if !self.networks.contains_key(&dir) {
                match Datapath::open_at(&dir) {
                    Ok(Some(dp)) => match Reconciler::resume(&dp) {
                        Ok(r) => {
                            self.networks
                                .insert(dir.clone(), (dp, r, Vec::new(), NetworkState::default()));
                        }
                        Err(e) => {
                            tracing::warn!("{}: reading the policy maps: {e}", dir.display());
                            continue;
                        }
                    },
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!("{}: {e}", dir.display());
                        continue;
                    }
                }
            }
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Some((dp, rec, seen, state)) = self.networks.get_mut(&dir) else {
                continue;
            };
            let now = interfaces(dp);
            if only_if_interfaces_changed && now == *seen {
                account(&self.totals, &name, dp, state);
                renew(dp, &name, self.lease);
                continue;
            }
            let cluster = view.cluster();
            let policies = view.policies();
            match rec.reconcile(dp, &cluster, &policies) {
                Ok(round) => {
                    *seen = interfaces(dp);
                    let fresh_state = NetworkState {
                        generation: round.generation,
                        pods: round.pods.clone(),
                        broken: round.broken.clone(),
                    };
                    if fresh_state != *state {
                        if let Err(e) = write_state(&self.state_dir, &name, &fresh_state) {
                            tracing::warn!("{name}: the policy state file: {e}");
                        }
                        *state = fresh_state;
                    }
                    account(&self.totals, &name, dp, state);
                    renew(dp, &name, self.lease);
                    for (pod, why) in round.closed {
                        if self.closed.insert((pod.clone(), why.clone())) {
                            tracing::warn!("pod {pod} is closed: {why}");
                            fresh.push((pod, why));
                        }
                    }
                    for (policy, why) in &round.broken {
                        tracing::warn!("policy {policy} cannot be enforced: {why}");
                    }
                    if round.swapped {
                        tracing::info!(
                            "{}: policy generation {} in force ({} of {} pod interfaces \
                             selected, {} rule sets)",
                            dir.display(),
                            round.generation,
                            round.selected,
                            round.interfaces,
                            round.rulesets
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!("{}: policy round failed: {e}", dir.display());
                    // Opened afresh next time (the pins may have been replaced).
                    self.networks.remove(&dir);
                }
            }
        }
        fresh
    }
}

/// Adds what `network`'s interfaces counted since the last reading to the totals.
fn account(totals: &SharedTotals, network: &str, dp: &Datapath, state: &NetworkState) {
    match dp.policy_counts() {
        Ok(counts) => match totals.lock() {
            Ok(mut t) => t.account(network, state, &counts),
            Err(poisoned) => poisoned.into_inner().account(network, state, &counts),
        },
        Err(e) => tracing::warn!("{network}: reading the policy counts: {e}"),
    }
}

/// A Warning Event on each pod in `closed` (`ns/name`, why), as `kubectl describe pod`
/// shows it. An Event that cannot be written is logged; the pod stays closed either way.
async fn report(recorder: &Recorder, view: &View, closed: Vec<(String, String)>) {
    for (pod, why) in closed {
        let Some((ns, name)) = pod.split_once('/') else {
            continue;
        };
        let Some(object) = view.pods.state().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        }) else {
            continue;
        };
        let mut note = format!("closed to all traffic but its node's: {why}");
        note.truncate(1000);
        let event = Event {
            type_: EventType::Warning,
            reason: "NetworkPolicyNotEnforceable".into(),
            note: Some(note),
            action: "EnforceNetworkPolicy".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!("an Event on pod {pod}: {e}");
        }
    }
}

/// Keeps NetworkPolicy in force on the networks below `root` (all, or `named`), forever,
/// on the calling thread; writes each network's state file below `state_dir`, renews its
/// lease on each network's policy for `lease` after each round, keeps `totals`, and
/// tells `readiness` when its first round is made.
pub fn run(
    root: &Path,
    named: &[String],
    api: &ApiArgs,
    state_dir: &Path,
    lease: Duration,
    totals: SharedTotals,
    readiness: &Readiness,
) -> Result<()> {
    let rt = crate::link::runtime()?;
    rt.block_on(async {
        let mut enforcer = Enforcer {
            root: root.to_owned(),
            named: named.to_vec(),
            networks: BTreeMap::new(),
            closed: BTreeSet::new(),
            state_dir: state_dir.to_owned(),
            totals,
            lease,
        };
        let client = client(api, "NetworkPolicy").await;
        let recorder = recorder(&client);
        let (view, events) = start(&client, &api.watcher_config());
        let changed = wake_on(events);
        if !view.ready().await {
            return Err(Error::datapath("NetworkPolicy", "the watchers stopped"));
        }
        tracing::info!("NetworkPolicy: namespaces, pods and policies listed; watching");
        let closed = enforcer.round(&view, false);
        readiness.done(Job::Policy);
        report(&recorder, &view, closed).await;
        let mut tick = tokio::time::interval(TICK);
        loop {
            let closed = tokio::select! {
                () = changed.notified() => {
                    tokio::time::sleep(SETTLE).await;
                    enforcer.round(&view, false)
                }
                _ = tick.tick() => enforcer.round(&view, true),
            };
            crate::faults::hang("agent-policy-loop");
            readiness.beat(Job::Policy);
            report(&recorder, &view, closed).await;
        }
    })
}
