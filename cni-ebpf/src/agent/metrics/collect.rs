//! One scrape's reading of the pinned maps: every network below the bpffs root (or the
//! ones named), each opened read-only, read, and closed again. Nothing is kept between
//! scrapes except the count of failed reads (a counter must not forget).
//!
//! A part that cannot be read (one map view) is a failure of that network's scrape: it
//! is logged, counted and marks the network down, while every other part is still
//! reported. Nothing here can fail the scrape as a whole.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{
    agent::report::{ClusterTotalKey, SharedTotals, TotalKey},
    datapath::{load, Datapath, EndpointView, FlowSummary, MapStats, ReasonCount, SnatUsage},
    error::Result,
    ipam::{record, PodRef},
};

/// At most this many networks are read per scrape (a bound, far above real use).
pub const MAX_NETWORKS: usize = 64;

/// What one scrape read from one network.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkSnapshot {
    /// Network name (the directory below the bpffs root).
    pub name: String,
    /// Whether its datapath is loaded (every pin present).
    pub loaded: bool,
    /// The parts that could not be read, with the error (empty: the network is up).
    pub failures: Vec<(&'static str, String)>,
    /// Failed parts since the exporter started (filled in by [`Exporter::scrape`]).
    pub errors_total: u64,
    /// Endpoint entries with their counters.
    pub endpoints: Vec<EndpointView>,
    /// Reason counters.
    pub reasons: Vec<ReasonCount>,
    /// Pinned maps: fill and memory.
    pub maps: Vec<MapStats>,
    /// SNAT port use.
    pub snat: Option<SnatUsage>,
    /// Flow-tracking states.
    pub flows: Option<FlowSummary>,
    /// Attachments (container ID, ifname) holding datapath state: pods on the node.
    pub attachments: Option<u64>,
    /// Host-port entries.
    pub host_ports: Option<u64>,
    /// The pod of each endpoint (container ID, ifname) the network's IPAM store names.
    pub pods: HashMap<(String, String), PodRef>,
    /// Whether its pod traffic between nodes is encrypted (a WireGuard device).
    pub wireguard: bool,
}

/// What one scrape read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Per network, sorted by name.
    pub networks: Vec<NetworkSnapshot>,
    /// Failed listings of the bpffs root since the exporter started (only when networks
    /// are discovered rather than named).
    pub discovery_errors_total: Option<u64>,
    /// How long reading took.
    pub duration: Duration,
    /// The agent's NetworkPolicy totals (`None`: the agent does not enforce policy).
    pub policy: Option<PolicySnapshot>,
    /// The agent's own state (`None`: no agent jobs to report).
    pub agent: Option<AgentSnapshot>,
    /// The node's WireGuard peers (`None`: no WireGuard device).
    pub wireguard: Option<Vec<crate::agent::wireguard::PeerReport>>,
    /// What the flow reader counted (`None`: flows are off).
    pub flows: Option<crate::agent::flows::metrics::FlowTotals>,
}

/// The agent's own state at one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSnapshot {
    /// `/ready` would answer 200.
    pub ready: bool,
    /// `/healthz` would answer 200.
    pub alive: bool,
    /// The node's cni-ebpf conflists that disagree with the agent's settings.
    pub conflist_disagreements: u64,
    /// Per API resource: (requests, failures, bytes received) since the agent started.
    pub api: BTreeMap<String, (u64, u64, u64)>,
}

/// The agent's NetworkPolicy totals at one scrape (see `crate::agent::report`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySnapshot {
    /// Per (network, policy namespace, policy name, direction, verdict).
    pub verdicts: BTreeMap<TotalKey, u64>,
    /// Per cluster policy rule that decided, direction and verdict.
    pub cluster_verdicts: BTreeMap<ClusterTotalKey, u64>,
    /// Per network: pod interfaces closed because a policy cannot be held.
    pub closed_pods: BTreeMap<String, u64>,
    /// Per network: the policy generation in force.
    pub generation: BTreeMap<String, u32>,
}

/// Reads one network's datapath (read-only) below `root`.
#[must_use]
pub fn network(root: &Path, data_dir: Option<&Path>, name: &str) -> NetworkSnapshot {
    let mut out = NetworkSnapshot {
        name: name.to_owned(),
        pods: data_dir
            .map(|d| record::pods_of(&d.join(name)))
            .unwrap_or_default(),
        ..NetworkSnapshot::default()
    };
    if let Err(e) = load::check_bpffs(root) {
        out.failures.push(("bpffs", e.to_string()));
        return out;
    }
    let dp = match Datapath::open_read_only_at(root.join(name)) {
        Ok(Some(dp)) => dp,
        Ok(None) => return out,
        Err(e) => {
            out.failures.push(("open", e.to_string()));
            return out;
        }
    };
    out.loaded = true;
    fn part<T>(out: &mut NetworkSnapshot, what: &'static str, r: Result<T>) -> Option<T> {
        r.map_err(|e| out.failures.push((what, e.to_string()))).ok()
    }
    let n = |len: usize| u64::try_from(len).unwrap_or(u64::MAX);
    out.endpoints = part(&mut out, "endpoints", dp.endpoints()).unwrap_or_default();
    out.reasons = part(&mut out, "reasons", dp.reason_counts()).unwrap_or_default();
    out.maps = part(&mut out, "maps", dp.map_stats()).unwrap_or_default();
    out.snat = part(&mut out, "snat", dp.snat_usage());
    out.flows = part(&mut out, "flows", dp.flow_summary());
    out.attachments = part(&mut out, "attachments", dp.attachments()).map(|a| n(a.len()));
    out.host_ports = part(&mut out, "host_ports", dp.port_mappings()).map(|p| n(p.len()));
    out.wireguard = dp
        .node_config_view()
        .is_ok_and(|c| c.wireguard_ifindex != 0);
    out
}

/// The networks below `root`: directories (sorted, at most [`MAX_NETWORKS`]). A root that
/// does not exist yet (no network loaded since bpffs was mounted) has none.
pub fn discover(root: &Path) -> Result<Vec<String>> {
    load::check_bpffs(root)?;
    let mut names = load::network_dirs(root)
        .map_err(|e| crate::Error::io(format!("listing bpffs root {}", root.display()), e))?;
    names.sort();
    names.truncate(MAX_NETWORKS);
    Ok(names)
}

/// The exporter: where to read, and the only state it keeps, the failure counts.
#[derive(Debug)]
pub struct Exporter {
    root: PathBuf,
    /// Networks named on the command line; empty: every network found below `root`.
    networks: Vec<String>,
    errors: Mutex<Errors>,
    /// The agent's NetworkPolicy totals, when it enforces policy.
    policy: Option<SharedTotals>,
    /// The agent's jobs, for `/ready` (none: the datapath alone decides) and `/healthz`.
    readiness: Option<std::sync::Arc<crate::agent::ready::Readiness>>,
    /// The bounds `/healthz` holds the jobs to (none: always alive).
    liveness: Option<crate::agent::liveness::Bounds>,
    /// `dataDir` of the networks, whose IPAM stores name each endpoint's pod.
    data_dir: Option<PathBuf>,
    wireguard_key: Option<PathBuf>,
    /// What the flow reader counts, when flows are on.
    flows: Option<crate::agent::flows::metrics::SharedFlowTotals>,
}

#[derive(Debug, Default)]
struct Errors {
    per_network: BTreeMap<String, u64>,
    discovery: u64,
}

impl Exporter {
    /// An exporter of the networks below `root` (`networks` empty: all of them).
    #[must_use]
    pub fn new(root: PathBuf, mut networks: Vec<String>) -> Self {
        networks.sort();
        networks.dedup();
        networks.truncate(MAX_NETWORKS);
        Self {
            root,
            networks,
            errors: Mutex::new(Errors::default()),
            policy: None,
            readiness: None,
            liveness: None,
            data_dir: None,
            wireguard_key: None,
            flows: None,
        }
    }

    /// Also reports the node's WireGuard peers, named from the agent's files next to
    /// `key_file`.
    #[must_use]
    pub fn with_wireguard(mut self, key_file: PathBuf) -> Self {
        self.wireguard_key = Some(key_file);
        self
    }

    /// Labels endpoints with their pods, from the IPAM stores below `dir`.
    #[must_use]
    pub fn with_data_dir(mut self, dir: PathBuf) -> Self {
        self.data_dir = Some(dir);
        self
    }

    /// Also answers `/ready` for the agent's jobs.
    #[must_use]
    pub fn with_readiness(mut self, r: std::sync::Arc<crate::agent::ready::Readiness>) -> Self {
        self.readiness = Some(r);
        self
    }

    /// `Ok` when the agent's jobs have made their first rounds and every datapath is
    /// loaded, else why not.
    ///
    /// # Errors
    /// The reasons it is not ready.
    pub fn ready(&self) -> std::result::Result<(), String> {
        match &self.readiness {
            Some(r) => r.check(&self.root, &self.networks),
            None => crate::agent::ready::Readiness::default().check(&self.root, &self.networks),
        }
    }

    /// Also answers `/healthz` for the agent's jobs, by `bounds`.
    #[must_use]
    pub fn with_liveness(mut self, bounds: crate::agent::liveness::Bounds) -> Self {
        self.liveness = Some(bounds);
        self
    }

    /// `Ok` while the agent's jobs are alive (see [`crate::agent::liveness`]), else why
    /// not.
    ///
    /// # Errors
    /// Why the agent is starting or stuck.
    pub fn alive(&self) -> std::result::Result<(), String> {
        match (&self.readiness, self.liveness) {
            (Some(r), Some(bounds)) => crate::agent::liveness::check(
                r,
                crate::k8s::traffic::traffic(),
                bounds,
                std::time::Instant::now(),
            ),
            _ => Ok(()),
        }
    }

    /// Also serves what the flow reader counts.
    #[must_use]
    pub fn with_flows(mut self, totals: crate::agent::flows::metrics::SharedFlowTotals) -> Self {
        self.flows = Some(totals);
        self
    }

    /// Also serves the agent's NetworkPolicy totals.
    #[must_use]
    pub fn with_policy(mut self, totals: SharedTotals) -> Self {
        self.policy = Some(totals);
        self
    }

    /// Reads everything once; failures are logged and counted, never returned.
    #[must_use]
    pub fn scrape(&self) -> Snapshot {
        let started = Instant::now();
        let mut discovery_failed = false;
        let names = if self.networks.is_empty() {
            discover(&self.root).unwrap_or_else(|e| {
                tracing::warn!("metrics: {e}");
                discovery_failed = true;
                Vec::new()
            })
        } else {
            self.networks.clone()
        };
        let mut networks: Vec<NetworkSnapshot> = names
            .iter()
            .map(|n| network(&self.root, self.data_dir.as_deref(), n))
            .collect();
        for n in &networks {
            for (what, e) in &n.failures {
                tracing::warn!("metrics: network {}: reading {what}: {e}", n.name);
            }
        }
        let mut errors = match self.errors.lock() {
            Ok(g) => g,
            // A worker that panicked aborted the process (panic = "abort"); if one ever
            // unwinds, its counts are still the best we have.
            Err(poisoned) => poisoned.into_inner(),
        };
        if discovery_failed {
            errors.discovery += 1;
        }
        let errors_discovery = errors.discovery;
        for n in &mut networks {
            let total = errors.per_network.entry(n.name.clone()).or_default();
            *total += u64::try_from(n.failures.len()).unwrap_or(u64::MAX);
            n.errors_total = *total;
        }
        let policy = self.policy.as_ref().map(|t| {
            let t = match t.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            PolicySnapshot {
                verdicts: t.verdicts.clone(),
                cluster_verdicts: t.cluster_verdicts.clone(),
                closed_pods: t.closed_pods.clone(),
                generation: t.generation.clone(),
            }
        });
        drop(errors);
        let agent = self.readiness.as_ref().map(|r| AgentSnapshot {
            ready: self.ready().is_ok(),
            alive: self.alive().is_ok(),
            conflist_disagreements: r.conflist_disagreements().len() as u64,
            api: crate::k8s::traffic::traffic()
                .snapshot()
                .into_iter()
                .map(|(resource, e)| (resource, (e.requests, e.failures, e.bytes)))
                .collect(),
        });
        // A device in use, or one the agent prepared (it made the key): asking a kernel
        // without WireGuard on every scrape would have it look for the module each time.
        let wireguard = self
            .wireguard_key
            .as_deref()
            .filter(|key| networks.iter().any(|n| n.wireguard) || key.exists())
            .and_then(crate::agent::wireguard::report)
            .map(|(_, _, peers)| peers);
        Snapshot {
            networks,
            discovery_errors_total: self.networks.is_empty().then_some(errors_discovery),
            duration: started.elapsed(),
            policy,
            agent,
            wireguard,
            flows: self.flows.as_ref().map(|t| {
                t.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            }),
        }
    }
}
