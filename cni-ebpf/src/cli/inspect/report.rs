//! What `inspect` shows, gathered once from the pinned maps, the IPAM store and the
//! agent's state file, then rendered as JSON here or as text (`text.rs`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    path::PathBuf,
};

use serde_json::{json, Value};

use super::InspectArgs;
use crate::{
    agent::report::{read_state, NetworkState, PodState},
    datapath::{
        memory::MapStats,
        policy::{describe_ruleset, DenyView, PolicyView},
        services::ServiceView,
        Datapath, EndpointView, FlowSummary, NatView, NodeConfigView, PortMappingView, ReasonCount,
    },
    error::{Error, Result},
    ipam::{record, PodRef},
    policy::{classes::refusal, Ruleset},
};

/// At most this many deny events are listed (the newest).
const SHOWN_DENIES: usize = 50;

/// The endpoints `--pod` / `--namespace` select (every one without them), with their
/// pods, host ports and NAT entries.
pub(super) struct Shown {
    /// Whether a filter was given.
    pub filtered: bool,
    /// Each endpoint's pod, by (container ID, ifname), from the IPAM store.
    pub pods: HashMap<(String, String), PodRef>,
    pub endpoints: Vec<EndpointView>,
    pub ports: Vec<PortMappingView>,
    pub nat: Vec<NatView>,
    ifindexes: HashSet<u32>,
    ips: HashSet<IpAddr>,
}

impl Shown {
    /// Reads the endpoints, host ports and NAT entries and keeps those of the pods the
    /// arguments select; none selected is an error that says how pods are known.
    pub fn select(dp: &Datapath, args: &InspectArgs) -> Result<Self> {
        let net = &args.net;
        let pods = record::pods_of(&args.data_dir.join(&net.network));
        let mut endpoints = dp.endpoints()?;
        let mut ports = dp.port_mappings()?;
        let mut nat = dp.nat_entries()?;
        let filter = args.filter();
        if let Some(filter) = &filter {
            endpoints
                .retain(|e| filter.matches(pods.get(&(e.container_id.clone(), e.ifname.clone()))));
            if endpoints.is_empty() {
                return Err(Error::datapath(
                    "inspect",
                    format!(
                        "no endpoint of network {} belongs to {filter} (pods are known by the \
                         K8S_POD_NAMESPACE/K8S_POD_NAME their runtime passed at ADD)",
                        net.network
                    ),
                ));
            }
            let owners: HashSet<(&str, &str)> = endpoints
                .iter()
                .map(|e| (e.container_id.as_str(), e.ifname.as_str()))
                .collect();
            ports.retain(|p| owners.contains(&(p.container_id.as_str(), p.ifname.as_str())));
            let ips: HashSet<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
            nat.retain(|n| {
                [n.src, n.dst, n.new_src, n.new_dst]
                    .iter()
                    .any(|a| ips.contains(a))
            });
        }
        Ok(Self {
            filtered: filter.is_some(),
            ifindexes: endpoints.iter().map(|e| e.host_ifindex).collect(),
            ips: endpoints.iter().map(|e| e.ip).collect(),
            pods,
            endpoints,
            ports,
            nat,
        })
    }

    /// The pod of an endpoint.
    pub fn pod_of(&self, container_id: &str, ifname: &str) -> Option<&PodRef> {
        self.pods.get(&(container_id.to_owned(), ifname.to_owned()))
    }

    /// The pod of a host interface shown.
    pub fn pod_of_ifindex(&self, ifindex: u32) -> Option<&PodRef> {
        self.endpoints
            .iter()
            .find(|e| e.host_ifindex == ifindex)
            .and_then(|e| self.pod_of(&e.container_id, &e.ifname))
    }

    /// Whether a refusal concerns the pods shown: one their own rules gave, or one of a
    /// packet from or to them.
    pub fn concerns(&self, d: &DenyView) -> bool {
        !self.filtered
            || self.ifindexes.contains(&d.host_ifindex)
            || self.ips.contains(&d.source)
            || self.ips.contains(&d.destination)
    }
}

/// Fills in what decided each of `denies` from the agent's `state` and the rule sets in
/// the maps (read once for all of them).
pub(super) fn explain(dp: &Datapath, state: &NetworkState, denies: &mut [DenyView]) -> Result<()> {
    if denies.is_empty() {
        return Ok(());
    }
    let rulesets = dp.policy_rulesets()?;
    for d in denies {
        d.decided_by = decided_by(d, state, &rulesets);
    }
    Ok(())
}

/// What decided a refusal, from the agent's state of the pod whose rules refused it:
/// why it is closed, or the tier and rules of the class that refused (when the rule set is
/// still the one the state names).
fn decided_by(
    d: &DenyView,
    state: &NetworkState,
    rulesets: &BTreeMap<u32, Ruleset>,
) -> Option<String> {
    let pod = state.pods.iter().find(|p| p.ifindex == d.host_ifindex)?;
    let (side, peer) = if d.direction == "egress" {
        (&pod.egress, d.destination)
    } else {
        (&pod.ingress, d.source)
    };
    if side.ruleset != d.ruleset_id {
        return None;
    }
    if let Some(why) = &side.closed {
        return Some(format!("closed: {why}"));
    }
    let rs = rulesets.get(&d.ruleset_id)?;
    refusal(rs, &side.classes, peer, d.proto, d.destination_port)
}

/// Everything `inspect` shows.
pub(super) struct Report {
    pub node: NodeConfigView,
    pub shown: Shown,
    pub flows: FlowSummary,
    /// NetworkPolicy in force for the interfaces shown, and the rule sets they name.
    pub policy: PolicyView,
    /// The agent's state file, when there is one.
    pub agent: Option<NetworkState>,
    /// Where it was looked for.
    pub state_dir: PathBuf,
    /// The latest refusals concerning the pods shown, oldest first.
    pub denies: Vec<DenyView>,
    pub services: Vec<ServiceView>,
    pub maps: Vec<MapStats>,
    pub reasons: Vec<ReasonCount>,
    /// The node's WireGuard device (encryption on): its key and peers.
    pub wireguard: Option<WireguardView>,
}

/// The node's WireGuard device as `inspect` shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireguardView {
    pub device: &'static str,
    pub public_key: Option<String>,
    pub port: u16,
    /// This network's programs send pod traffic for other nodes through it.
    pub encrypting: bool,
    pub strict: bool,
    pub peers: Vec<crate::agent::wireguard::PeerReport>,
    /// Nodes without a peer, and why (as the agent last wrote it).
    pub keyless: std::collections::BTreeMap<String, String>,
}

impl Report {
    /// Reads the rest of the datapath and the agent's state for `shown`.
    pub fn gather(dp: &Datapath, args: &InspectArgs, shown: Shown) -> Result<Self> {
        let mut policy = dp.policy_view()?;
        policy
            .endpoints
            .retain(|e| shown.ifindexes.contains(&e.host_ifindex));
        let named: HashSet<String> = policy
            .endpoints
            .iter()
            .flat_map(|e| [e.ingress.clone(), e.egress.clone()])
            .collect();
        policy
            .rulesets
            .retain(|id, _| named.contains(&describe_ruleset(*id)));
        let mut denies = dp.policy_denies()?;
        denies.retain(|d| shown.concerns(d));
        let mut denies = denies.split_off(denies.len().saturating_sub(SHOWN_DENIES));
        let agent = read_state(&args.state_dir, &args.net.network);
        if let Some(state) = &agent {
            explain(dp, state, &mut denies)?;
        }
        let node = dp.node_config_view()?;
        // The node's device, whether this network's programs use it yet or the agent
        // has only prepared it (its conflist asks for encryption, no ADD turned it on).
        let wireguard = crate::agent::wireguard::report(&args.wireguard.key).map(
            |(public_key, port, peers)| WireguardView {
                device: crate::datapath::wireguard::WIREGUARD_DEVICE,
                public_key,
                port,
                encrypting: node.wireguard_ifindex != 0,
                strict: node.wireguard_strict,
                peers,
                keyless: crate::agent::wireguard::PeerNames::read(&args.wireguard.key).keyless,
            },
        );
        Ok(Self {
            node,
            wireguard,
            flows: dp.flow_summary()?,
            policy,
            agent,
            state_dir: args.state_dir.clone(),
            denies,
            services: dp.service_views()?,
            maps: dp.map_stats()?,
            reasons: dp.reason_counts()?,
            shown,
        })
    }

    /// The agent's record of the pod behind a host interface: the policies that select it.
    pub fn selecting(&self, ifindex: u32) -> Option<&PodState> {
        self.agent
            .as_ref()
            .and_then(|s| s.pods.iter().find(|p| p.ifindex == ifindex))
    }

    /// The report as `inspect --json` prints it.
    pub fn to_json(&self) -> Value {
        let endpoints: Vec<Value> = self
            .shown
            .endpoints
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
                if let (Some(obj), Some(pod)) = (
                    v.as_object_mut(),
                    self.shown.pod_of(&e.container_id, &e.ifname),
                ) {
                    obj.insert(
                        "pod".into(),
                        serde_json::to_value(pod).unwrap_or(Value::Null),
                    );
                }
                v
            })
            .collect();
        let pods: Vec<&PodState> = self
            .policy
            .endpoints
            .iter()
            .filter_map(|e| self.selecting(e.host_ifindex))
            .collect();
        let mut policy = serde_json::to_value(&self.policy).unwrap_or(Value::Null);
        if let Some(obj) = policy.as_object_mut() {
            obj.insert(
                "pods".into(),
                serde_json::to_value(&pods).unwrap_or_default(),
            );
            obj.insert(
                "denies".into(),
                serde_json::to_value(&self.denies).unwrap_or_default(),
            );
        }
        json!({
            "node": self.node,
            "endpoints": endpoints,
            "portMappings": self.shown.ports,
            "nat": self.shown.nat,
            "flows": self.flows,
            "policy": policy,
            "services": self.services,
            "reasons": self.reasons,
            "maps": self.maps,
            "wireguard": self.wireguard,
        })
    }
}
