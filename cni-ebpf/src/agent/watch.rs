//! The agent's view of the cluster — Namespaces, Pods, Nodes, NetworkPolicies and
//! ClusterNetworkPolicies, kept by kube-runtime watchers, never by re-listing — and the
//! loop that puts it in force on every network of the node ([`super::Reconciler`]).
//!
//! - Each watcher lists once, then watches from the list's resource version; a dropped
//!   watch resumes from the last version seen, a `410 Gone` (history compacted) lists
//!   again, an unreachable API server is retried with backoff.
//! - Pods and Namespaces go straight into the compact [`Cluster`] view, object by object
//!   (a Pod object is read, reduced to what policies use and dropped): every agent keeps
//!   every pod of the cluster, so nothing else of them is kept. A list in progress (the
//!   first, or one after a `410`) holds the rounds back until it is complete, and what it
//!   did not return is then removed, so a round never sees half a list.
//!   Nodes too (their labels and addresses: cluster policies' node peers). NetworkPolicies
//!   and ClusterNetworkPolicies are kept whole by reflectors (without their
//!   `managedFields`).
//! - ClusterNetworkPolicy is a CRD the operator installs: while the API server does not
//!   serve it (404), the agent says so once, enforces none, and watches for the CRD
//!   (looking again at least every [`CRD_RECHECK`]); once it is served, it is watched as
//!   the others are.
//! - A round runs after a change (a short settling delay lets a burst of changes make one
//!   round), and once a second when the node's pod interfaces changed (a pod ADDed before
//!   its Pod object changed). Nothing runs before all three hold a complete list: an
//!   empty view would read as "no policies" and open every pod.
//! - Each network below the bpffs root (or each one named) is reconciled; a network
//!   without pins yet is skipped until its first pod loads it.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::{stream::select_all, Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
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
    policy::{cluster::pod_key, cluster_network_policy::ClusterNetworkPolicy, Cluster},
};

/// The longest the agent waits before it looks again for the ClusterNetworkPolicy CRD
/// while it is not served (it watches for the CRD meanwhile, where RBAC lets it).
const CRD_RECHECK: Duration = Duration::from_secs(30);

/// How long a round waits after a change for more changes of the same burst.
const SETTLE: Duration = Duration::from_millis(30);
/// How often the node's pod interfaces are looked at for new ones.
const TICK: Duration = Duration::from_secs(1);

/// What the Pod and Namespace watchers keep.
#[derive(Debug)]
struct Fed {
    cluster: Cluster,
    /// Watchers whose list (the first, or one after a `410`) is not complete.
    listing: usize,
}

/// [`Fed`], shared by the watchers' tasks and the rounds.
type SharedFed = Arc<Mutex<Fed>>;

fn lock(fed: &SharedFed) -> MutexGuard<'_, Fed> {
    match fed.lock() {
        Ok(g) => g,
        // A task that panicked aborted the process (panic = "abort").
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// What the rounds read.
struct View {
    fed: SharedFed,
    policies: Store<NetworkPolicy>,
    cluster_policies: Store<ClusterNetworkPolicy>,
}

impl View {
    /// Waits until every watcher has completed its first list (`false`: they stopped).
    async fn ready(&self) -> bool {
        while lock(&self.fed).listing > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.policies.wait_until_ready().await.is_ok()
            && self.cluster_policies.wait_until_ready().await.is_ok()
    }

    fn policies(&self) -> Vec<NetworkPolicy> {
        self.policies
            .state()
            .iter()
            .map(|p| NetworkPolicy::clone(p))
            .collect()
    }

    fn cluster_policies(&self) -> Vec<ClusterNetworkPolicy> {
        self.cluster_policies
            .state()
            .iter()
            .map(|p| ClusterNetworkPolicy::clone(p))
            .collect()
    }
}

/// How a kind of object goes into [`Cluster`].
trait Feed: kube::Resource + Sized {
    /// Its key among its kind.
    fn key(&self) -> u64;
    fn apply(&self, c: &mut Cluster);
    fn delete(&self, c: &mut Cluster);
    /// Removes every object of the kind whose key is not in `seen`.
    fn keep_only(c: &mut Cluster, seen: &HashSet<u64>);
}

impl Feed for Pod {
    fn key(&self) -> u64 {
        pod_key(
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    fn apply(&self, c: &mut Cluster) {
        c.apply_pod(self);
    }

    fn delete(&self, c: &mut Cluster) {
        if let (Some(ns), Some(name)) = (&self.metadata.namespace, &self.metadata.name) {
            c.delete_pod(ns, name);
        }
    }

    fn keep_only(c: &mut Cluster, seen: &HashSet<u64>) {
        c.retain_pods(|p| seen.contains(&p.key()));
    }
}

impl Feed for Namespace {
    fn key(&self) -> u64 {
        pod_key("", self.metadata.name.as_deref().unwrap_or_default())
    }

    fn apply(&self, c: &mut Cluster) {
        c.apply_namespace(self);
    }

    fn delete(&self, c: &mut Cluster) {
        if let Some(name) = &self.metadata.name {
            c.delete_namespace(name);
        }
    }

    fn keep_only(c: &mut Cluster, seen: &HashSet<u64>) {
        c.retain_namespaces(|n| seen.contains(&pod_key("", n)));
    }
}

impl Feed for Node {
    fn key(&self) -> u64 {
        pod_key("", self.metadata.name.as_deref().unwrap_or_default())
    }

    fn apply(&self, c: &mut Cluster) {
        c.apply_node(self);
    }

    fn delete(&self, c: &mut Cluster) {
        if let Some(name) = &self.metadata.name {
            c.delete_node(name);
        }
    }

    fn keep_only(c: &mut Cluster, seen: &HashSet<u64>) {
        c.retain_nodes(|n| seen.contains(&pod_key("", n)));
    }
}

/// What a watcher can watch and a reflector keep.
pub(super) trait Watched:
    kube::Resource<DynamicType: Default + Eq + std::hash::Hash + Clone>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType: Default + Eq + std::hash::Hash + Clone>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// How many objects of a kind a list may bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Volume {
    /// A handful per node at most (Namespaces, NetworkPolicies, Services): without
    /// streaming lists, one list from the watch cache (`resourceVersion=0`).
    Small,
    /// Grows with the cluster (Pods, EndpointSlices, Nodes): without streaming lists, a
    /// paged list of [`PAGE`] objects a page, so no answer holds the whole cluster (the
    /// watch cache answers `resourceVersion=0` whole, whatever `limit` says).
    Large,
}

/// Objects per page of a paged list.
const PAGE: u32 = 500;

/// Whether `e` is the API server refusing a streaming list (`sendInitialEvents`) as a
/// server without the `WatchList` feature does (422, or 400 from older ones).
fn refuses_streaming_lists(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 422 || s.code == 400)
}

/// The events of `K` as kube-runtime's watcher delivers them (with its backoff): the first
/// list, and every one after a `410 Gone`, is a streaming list — the objects arrive one by
/// one on the watch itself, so no answer holds them all — and where the server refuses
/// those, a list as `volume` says, then watches from its version.
pub(super) fn events<K>(
    api: Api<K>,
    config: watcher::Config,
    volume: Volume,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Watched,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let fallback = match volume {
        Volume::Small => config.clone().any_semantic(),
        Volume::Large => config.clone().page_size(PAGE),
    };
    watcher(api.clone(), config.streaming_lists())
        .default_backoff()
        .take_while(move |event| {
            let refused = matches!(event, Err(e) if refuses_streaming_lists(e));
            if refused {
                tracing::info!("the API server offers no streaming lists; listing {kind} instead");
            }
            std::future::ready(!refused)
        })
        .chain(watcher(api, fallback).default_backoff())
}

/// One watcher of `K` feeding `fed`, whose events (but those of a list in progress) wake
/// the rounds. Counted in `fed.listing` from its start until its first list is complete.
fn feed<K>(
    api: Api<K>,
    config: watcher::Config,
    volume: Volume,
    fed: SharedFed,
) -> impl Stream<Item = bool> + Send
where
    K: Feed + Watched,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    // The keys a list in progress returned; `None` between lists.
    let mut seen: Option<HashSet<u64>> = None;
    let mut listed_once = false;
    events(api, config, volume).map(move |event| {
        let mut f = lock(&fed);
        match event {
            Ok(watcher::Event::Init) => {
                if seen.is_none() && listed_once {
                    f.listing += 1;
                }
                seen = Some(HashSet::new());
                false
            }
            Ok(watcher::Event::InitApply(o)) => {
                o.apply(&mut f.cluster);
                if let Some(s) = seen.as_mut() {
                    s.insert(o.key());
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(s) = seen.take() {
                    K::keep_only(&mut f.cluster, &s);
                }
                listed_once = true;
                f.listing = f.listing.saturating_sub(1);
                true
            }
            Ok(watcher::Event::Apply(o)) => {
                o.apply(&mut f.cluster);
                true
            }
            Ok(watcher::Event::Delete(o)) => {
                o.delete(&mut f.cluster);
                true
            }
            Err(e) => {
                tracing::warn!("watching {kind}: {e}; retrying");
                false
            }
        }
    })
}

/// Drops from `o` what is written by and for the API server's clients that apply:
/// nothing the agent reads.
pub(super) fn without_apply_fields<K: kube::Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
    if let Some(a) = o.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// One watcher (list, then watch; `config` narrows it) feeding `writer`'s store, each
/// object reduced by `slim` before it is kept, whose events (but the first pages of a
/// list) wake the rounds.
pub(super) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    volume: Volume,
    slim: fn(&mut K),
    writer: reflector::store::Writer<K>,
) -> impl Stream<Item = bool> + Send
where
    K: Watched,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    events(api, config, volume)
        .modify(slim)
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
    let fed = Arc::new(Mutex::new(Fed {
        cluster: Cluster::default(),
        listing: 3,
    }));
    let (policies, np_w) = reflector::store();
    let (cluster_policies, cnp_w) = reflector::store();
    let streams = select_all([
        feed(
            Api::<Namespace>::all(client.clone()),
            config.clone(),
            Volume::Small,
            Arc::clone(&fed),
        )
        .boxed(),
        feed(
            Api::<Pod>::all(client.clone()),
            config.clone(),
            Volume::Large,
            Arc::clone(&fed),
        )
        .boxed(),
        feed(
            Api::<Node>::all(client.clone()),
            config.clone(),
            Volume::Large,
            Arc::clone(&fed),
        )
        .boxed(),
        watch(
            Api::<NetworkPolicy>::all(client.clone()),
            config.clone(),
            Volume::Small,
            without_apply_fields,
            np_w,
        )
        .boxed(),
        watch_crd(
            Api::<ClusterNetworkPolicy>::all(client.clone()),
            client.clone(),
            config.clone(),
            cnp_w,
        )
        .boxed(),
    ]);
    (
        View {
            fed,
            policies,
            cluster_policies,
        },
        streams,
    )
}

/// Whether the API server serves `K` (a CRD's resource): `Some(false)` for a 404, `None`
/// when it cannot tell (unreachable, forbidden: asked again).
async fn served<K: Watched>(api: &Api<K>) -> Option<bool> {
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Some(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Some(false),
        Err(e) => {
            tracing::warn!(
                "looking for {}: {e}; retrying",
                K::plural(&K::DynamicType::default())
            );
            None
        }
    }
}

/// The name of the CRD that defines `K`.
fn crd_name<K: Watched>() -> String {
    let dt = K::DynamicType::default();
    format!("{}.{}", K::plural(&dt), K::group(&dt))
}

/// Returns once the CRD `name` is there (a watch of CustomResourceDefinitions narrowed to
/// it), or after [`CRD_RECHECK`] (also at once when the CRDs cannot be watched: no RBAC
/// for them, in which case the caller just asks again after that long).
async fn crd_appears(client: &Client, name: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config));
    let arrived = async {
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitApply(_) | watcher::Event::Apply(_)) => return,
                Ok(_) => {}
                Err(_) => {
                    tokio::time::sleep(CRD_RECHECK).await;
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(CRD_RECHECK, arrived).await;
}

/// [`watch`] of a CRD's resource once the API server serves it. Until then `writer`'s
/// store is complete and empty (the agent says so once), and the agent waits for the CRD
/// to appear ([`crd_appears`]) before it asks again.
fn watch_crd<K>(
    api: Api<K>,
    client: Client,
    config: watcher::Config,
    mut writer: reflector::store::Writer<K>,
) -> impl Stream<Item = bool> + Send
where
    K: Watched,
{
    futures::stream::once(async move {
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let crd = crd_name::<K>();
        let mut said = false;
        loop {
            match served(&api).await {
                Some(true) => break,
                Some(false) => {
                    if !said {
                        tracing::warn!(
                            "the API server does not serve {kind} (its CRD {crd} is not \
                             installed): no cluster policy is enforced until it is"
                        );
                        // The rounds may run meanwhile: none is the complete list.
                        writer.apply_watcher_event(&watcher::Event::Init);
                        writer.apply_watcher_event(&watcher::Event::InitDone);
                        said = true;
                    }
                    crd_appears(&client, &crd).await;
                }
                None => tokio::time::sleep(Duration::from_secs(2)).await,
            }
        }
        if said {
            tracing::info!("the API server serves {kind} now; watching it");
        }
        watch(api, config, Volume::Small, without_apply_fields, writer)
    })
    .flatten()
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

/// One network the agent enforces policy on.
struct Network {
    dp: Datapath,
    reconciler: Reconciler,
    /// The pod interfaces of its last round (ifindex, owner, pod key).
    seen: Vec<(u32, u64, u64)>,
    /// The state that round left (what the state file holds).
    state: NetworkState,
}

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
    /// How long leases and learned addresses hold.
    holds: Holds,
}

/// How long what the policy job writes holds.
#[derive(Debug, Clone, Copy)]
pub struct Holds {
    /// Each renewal of the agent's lease on a network's policy.
    pub lease: Duration,
    /// The floor of an address a pod learned from a DNS answer (seconds).
    pub dns_min_ttl_s: u32,
}

/// Renews the agent's lease on `dp`'s policy for `lease` after a round that kept it
/// current: while it holds, ADD lets a pod of a namespace without policies start open;
/// once it runs out (no agent, or rounds that keep failing), ADD closes new pods.
fn renew(dp: &Datapath, network: &str, lease: Duration) {
    let secs = u32::try_from(lease.as_secs()).unwrap_or(u32::MAX);
    let until = crate::datapath::node_facts::boottime_s().saturating_add(secs);
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
                    Ok(Some(dp)) => match Reconciler::resume(&dp, self.holds.dns_min_ttl_s) {
                        Ok(reconciler) => {
                            let network = Network {
                                dp,
                                reconciler,
                                seen: Vec::new(),
                                state: NetworkState::default(),
                            };
                            self.networks.insert(dir.clone(), network);
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
            let Some(Network {
                dp,
                reconciler,
                seen,
                state,
            }) = self.networks.get_mut(&dir)
            else {
                continue;
            };
            let now = interfaces(dp);
            if only_if_interfaces_changed && now == *seen {
                account(&self.totals, &name, dp, state);
                renew(dp, &name, self.holds.lease);
                continue;
            }
            let fed = lock(&view.fed);
            if fed.listing > 0 {
                // A list in progress: the last complete view stays in force.
                renew(dp, &name, self.holds.lease);
                continue;
            }
            let policies = view.policies();
            let cluster_policies = view.cluster_policies();
            match reconciler.reconcile_all(dp, &fed.cluster, &policies, &cluster_policies) {
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
                    renew(dp, &name, self.holds.lease);
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

/// Adds what `network`'s interfaces and cluster policy rules counted since the last
/// reading to the totals.
fn account(totals: &SharedTotals, network: &str, dp: &Datapath, state: &NetworkState) {
    match dp.policy_counts() {
        Ok(counts) => match totals.lock() {
            Ok(mut t) => t.account(network, state, &counts),
            Err(poisoned) => poisoned.into_inner().account(network, state, &counts),
        },
        Err(e) => tracing::warn!("{network}: reading the policy counts: {e}"),
    }
    match dp.policy_class_counts() {
        Ok(counts) => match totals.lock() {
            Ok(mut t) => t.account_classes(network, state, &counts),
            Err(poisoned) => poisoned
                .into_inner()
                .account_classes(network, state, &counts),
        },
        Err(e) => tracing::warn!("{network}: reading the cluster policy counts: {e}"),
    }
}

/// A Warning Event on each pod in `closed` (`ns/name`, why), as `kubectl describe pod`
/// shows it. An Event that cannot be written is logged; the pod stays closed either way.
async fn report(recorder: &Recorder, client: &Client, closed: Vec<(String, String)>) {
    for (pod, why) in closed {
        let Some((ns, name)) = pod.split_once('/') else {
            continue;
        };
        // The view keeps no Pod objects: the Event's subject is read from the API.
        let object = match Api::<Pod>::namespaced(client.clone(), ns).get(name).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("an Event on pod {pod}: reading it: {e}");
                continue;
            }
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
/// lease on each network's policy for `holds.lease` after each round, keeps `totals`, and
/// tells `readiness` when its first round is made.
pub fn run(
    root: &Path,
    named: &[String],
    api: &ApiArgs,
    state_dir: &Path,
    holds: Holds,
    totals: SharedTotals,
    readiness: &Readiness,
) -> Result<()> {
    let rt = crate::kernel::link::runtime()?;
    rt.block_on(async {
        let mut enforcer = Enforcer {
            root: root.to_owned(),
            named: named.to_vec(),
            networks: BTreeMap::new(),
            closed: BTreeSet::new(),
            state_dir: state_dir.to_owned(),
            totals,
            holds,
        };
        let client = client(api, "NetworkPolicy").await;
        let recorder = recorder(&client);
        let (view, events) = start(&client, &api.watcher_config());
        let changed = wake_on(events);
        if !view.ready().await {
            return Err(Error::datapath("NetworkPolicy", "the watchers stopped"));
        }
        tracing::info!("NetworkPolicy: namespaces, pods, nodes and policies listed; watching");
        let closed = enforcer.round(&view, false);
        readiness.done(Job::Policy);
        report(&recorder, &client, closed).await;
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
            report(&recorder, &client, closed).await;
        }
    })
}
