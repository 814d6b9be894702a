//! The agent's view of the Node objects, and what it keeps from them on this node:
//!
//! - **tunnel endpoints** (networks in `crossNode` `tunnel` or `crossSubnet` mode): every
//!   other node's pod CIDRs (`spec.podCIDRs`) → its InternalIP (IPv4 when the node has
//!   one, else IPv6), in each such network's `TUNNEL_ENDPOINTS`;
//! - **direct routes** (`proto 207`, see `crate::agent::routes`): with `--host-gw`, to every
//!   other node's pod CIDRs via its InternalIP; in `crossSubnet` mode, to those of the
//!   nodes whose InternalIP is on the uplink's own subnet (more specific than the cluster
//!   CIDRs' route to the tunnel device, so those nodes are reached without
//!   encapsulation). A node whose address moves to or from the uplink's subnet changes
//!   route at once.
//!
//! - **WireGuard peers** (networks with `encryption: wireguard`): the node's key published
//!   on its Node, every other node with a key a peer of the node's device
//!   ([`super::wireguard`]).
//!
//! The Nodes are listed once, then watched (kube-runtime's watcher and reflector: a
//! dropped watch resumes, a `410 Gone` lists again, an unreachable or refusing API server
//! is retried with backoff). Everything is reconciled after every change, whenever a
//! network's datapath appears on the node or goes ([`super::datapaths`]: the first ADD on
//! a fresh node gets its tunnel entries at once), and every `--host-gw-interval` against
//! the view it has (a route someone deleted comes back; no API request for that). While
//! the API server is away, what is in place stays.

use std::{net::IpAddr, path::Path, sync::Arc, time::Duration};

use futures::StreamExt as _;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector, watcher, WatchStreamExt as _,
    },
    Api, Resource as _,
};
use tokio::sync::Notify;

use super::{
    ready::{Job, Readiness},
    watch::{events, Volume},
    wireguard,
};
use crate::{
    agent::routes::{log, reconcile_routes, wanted_routes, HostGwArgs},
    datapath::{load, Datapath},
    error::{Error, Result},
    k8s::{self, ApiArgs, ApiClient},
    kernel::link::{Nl, RTPROT_CNI_EBPF_HOST_GW},
};

/// How long a round waits after a Node change for more changes of the same burst.
const SETTLE: Duration = Duration::from_millis(30);
/// How often the loop shows it is alive between rounds (liveness) and looks at the
/// networks' encryption setting and the WireGuard key file (turned on by an ADD, a key
/// rotated).
const TICK: Duration = Duration::from_secs(1);

/// A network in a tunnel mode.
struct TunnelNetwork {
    name: String,
    dp: Datapath,
    cross_subnet: bool,
    uplink_ifindex: u32,
    underlay: Underlay,
}

/// The address families the node's uplink can send tunnel packets on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Underlay {
    pub v4: bool,
    pub v6: bool,
}

impl Underlay {
    pub(super) fn has(self, ip: IpAddr) -> bool {
        if ip.is_ipv4() {
            self.v4
        } else {
            self.v6
        }
    }

    /// The address a node is reached at among its InternalIPs `ips`: its first IPv4 one
    /// of a family this uplink has, else its first IPv6 one (the tunnel's endpoint and
    /// the WireGuard peer's).
    pub(super) fn pick(self, ips: &[IpAddr]) -> Option<IpAddr> {
        let mut usable = ips.iter().copied().filter(|ip| self.has(*ip));
        let first = usable.next()?;
        Some(
            std::iter::once(first)
                .chain(usable)
                .find(IpAddr::is_ipv4)
                .unwrap_or(first),
        )
    }

    pub(super) fn describe(self) -> &'static str {
        match (self.v4, self.v6) {
            (true, true) => "IPv4 or IPv6",
            (true, false) => "IPv4",
            (false, true) => "IPv6",
            (false, false) => "none",
        }
    }
}

/// A Node the tunnel cannot reach, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    pub node: String,
    pub why: String,
}

/// The networks below `root` whose node configuration has a tunnel device.
fn tunnel_networks(root: &Path) -> Vec<TunnelNetwork> {
    load::network_dirs(root)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let dp = Datapath::open_at(root.join(&name)).ok().flatten()?;
            let cfg = dp.node_config_view().ok()?;
            (cfg.tunnel_ifindex != 0).then(|| TunnelNetwork {
                name,
                dp,
                cross_subnet: cfg.cross_subnet,
                uplink_ifindex: cfg.uplink_ifindex,
                underlay: Underlay {
                    v4: cfg.node_addr.is_some(),
                    v6: cfg.node_addr6.is_some(),
                },
            })
        })
        .collect()
}

/// Every other node's pod CIDRs → its underlay address (its first IPv4 InternalIP, else
/// its first IPv6 one, of the families `underlay` has), and the nodes skipped and why.
#[must_use]
pub fn tunnel_entries(
    nodes: &[Node],
    own: &str,
    underlay: Underlay,
) -> (Vec<(IpNet, IpAddr)>, Vec<Skipped>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    for node in nodes {
        let name = k8s::name(node);
        if name == own || name.is_empty() {
            continue;
        }
        let skip = |why: String| Skipped {
            node: name.to_owned(),
            why,
        };
        let ips = k8s::internal_ips(node);
        let Some(address) = underlay.pick(&ips) else {
            skipped.push(skip(if ips.is_empty() {
                "no InternalIP to tunnel to".to_owned()
            } else {
                format!(
                    "no InternalIP of a family this node's uplink has ({}); it has {}",
                    underlay.describe(),
                    ips.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }));
            continue;
        };
        match k8s::pod_cidrs(node) {
            Ok(cidrs) => out.extend(cidrs.into_iter().map(|c| (c, address))),
            Err(e) => skipped.push(skip(e.to_string())),
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    (out, skipped)
}

/// A Warning Event `TunnelEndpointUnknown` on each Node in `skipped` that was not in
/// `reported` (as `kubectl describe node` shows it), and a log line; `reported` becomes
/// `skipped`. An Event that cannot be written is logged.
async fn report(
    recorder: &Recorder,
    nodes: &[Node],
    skipped: &[Skipped],
    reported: &mut Vec<Skipped>,
) {
    for s in skipped.iter().filter(|s| !reported.contains(s)) {
        log(&format!("no tunnel entry: node {}: {}", s.node, s.why));
        let Some(node) = nodes.iter().find(|n| k8s::name(n) == s.node) else {
            continue;
        };
        let mut note = format!(
            "pods on this node are unreachable through the tunnel: {}",
            s.why
        );
        note.truncate(1000);
        let event = Event {
            type_: EventType::Warning,
            reason: "TunnelEndpointUnknown".into(),
            note: Some(note),
            action: "ProgramTunnel".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &node.object_ref(&())).await {
            log(&format!("an Event on node {}: {e}", s.node));
        }
    }
    *reported = skipped.to_vec();
}

/// One round over `nodes`.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state, passed through"
)]
async fn round(
    nodes: &[Node],
    nl: &Nl,
    own: &str,
    args: &HostGwArgs,
    root: &Path,
    last_skipped: &mut Vec<String>,
    (recorder, reported): (&Recorder, &mut Vec<Skipped>),
    (keeper, node_api): (&mut wireguard::Keeper, &Api<Node>),
) {
    keeper.round(nodes, own, root, nl, node_api).await;
    let tunnels = tunnel_networks(root);
    let mut unreachable = Vec::new();
    for t in &tunnels {
        let (entries, skipped) = tunnel_entries(nodes, own, t.underlay);
        unreachable.extend(skipped);
        match t.dp.set_tunnel_endpoints(&entries) {
            Ok(0) => {}
            Ok(n) => log(&format!(
                "{}: {n} tunnel entries changed ({} pod CIDRs of other nodes)",
                t.name,
                entries.len()
            )),
            Err(e) => log(&format!("{}: the tunnel entries: {e}", t.name)),
        }
    }
    unreachable.sort();
    unreachable.dedup();
    report(recorder, nodes, &unreachable, reported).await;
    if !args.enabled && !tunnels.iter().any(|t| t.cross_subnet) {
        return;
    }
    let mut skipped = Vec::new();
    let (mut wanted, route_skipped) = wanted_routes(nodes, own);
    if !args.enabled {
        // crossSubnet only: the nodes on the uplink's own subnet.
        let mut subnets: Vec<IpNet> = Vec::new();
        for t in tunnels.iter().filter(|t| t.cross_subnet) {
            subnets.extend(nl.addresses(t.uplink_ifindex).await.unwrap_or_default());
        }
        wanted.retain(|w| subnets.iter().any(|s| s.contains(&w.via)));
    }
    skipped.extend(route_skipped);
    reconcile_routes(nl, &wanted, skipped, last_skipped).await;
}

/// Runs the Node watcher forever on the calling thread (its own current-thread runtime),
/// in the calling thread's network namespace; tells `readiness` when its first round is
/// made.
#[expect(
    clippy::too_many_arguments,
    reason = "the job's settings, passed through"
)]
pub fn run(
    args: &HostGwArgs,
    wg: &wireguard::WireguardArgs,
    conf_dir: &Path,
    api: &ApiArgs,
    own: &str,
    root: &Path,
    readiness: &Readiness,
    mut datapaths: tokio::sync::watch::Receiver<u64>,
) -> Result<()> {
    let rt = crate::kernel::link::runtime()?;
    rt.block_on(async {
        let nl = Nl::connect()?;
        let mut last_skipped = Vec::new();
        log(&format!(
            "node {own}: watching the Nodes for tunnel entries{}; checked every {} s",
            if args.enabled {
                format!(
                    " and routes to the other nodes' pod CIDRs (proto {RTPROT_CNI_EBPF_HOST_GW})"
                )
            } else {
                String::new()
            },
            args.interval
        ));
        let client = loop {
            match ApiClient::new(api) {
                Ok(c) => break c.client(),
                Err(e) => log(&format!("{e}; retrying")),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "cni-ebpf-agent".into(),
                instance: Some(own.to_owned()),
            },
        );
        let mut reported = Vec::new();
        let mut keeper = wireguard::Keeper::new(wg, conf_dir);
        let node_api = Api::<Node>::all(client.clone());
        let (store, writer) = reflector::store::<Node>();
        let changed = Arc::new(Notify::new());
        {
            let changed = Arc::clone(&changed);
            let events = events(
                Api::<Node>::all(client),
                api.watcher_config(),
                Volume::Large,
            )
            .modify(k8s::slim_node)
            .reflect(writer);
            tokio::spawn(async move {
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                        Ok(_) => changed.notify_one(),
                        Err(e) => log(&format!("{e}; routes left as they are, retrying")),
                    }
                }
            });
        }
        if store.wait_until_ready().await.is_err() {
            return Err(Error::datapath("host-gw", "the Node watcher stopped"));
        }
        loop {
            let nodes: Vec<Node> = store.state().iter().map(|n| Node::clone(n)).collect();
            round(
                &nodes,
                &nl,
                own,
                args,
                root,
                &mut last_skipped,
                (&recorder, &mut reported),
                (&mut keeper, &node_api),
            )
            .await;
            readiness.done(Job::Nodes);
            let next = tokio::time::Instant::now() + Duration::from_secs(args.interval);
            loop {
                tokio::select! {
                    // Alive between rounds, however long the interval; and encryption
                    // turned on or off by an ADD, or its key rotated.
                    () = tokio::time::sleep(TICK) => {
                        crate::faults::hang("agent-nodes-loop");
                        readiness.beat(Job::Nodes);
                        if keeper.due(root) {
                            let nodes: Vec<Node> =
                                store.state().iter().map(|n| Node::clone(n)).collect();
                            keeper.round(&nodes, own, root, &nl, &node_api).await;
                        }
                    }
                    () = changed.notified() => {
                        tokio::time::sleep(SETTLE).await;
                        break;
                    }
                    // A network loaded (or gone) on the node: its tunnel entries now.
                    Ok(()) = datapaths.changed() => break,
                    () = tokio::time::sleep_until(next) => break,
                }
            }
        }
    })
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": ips.iter().map(|a| serde_json::json!({"type": "InternalIP", "address": a})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    #[test]
    fn every_other_nodes_pod_cidrs_go_to_its_first_ipv4_internal_ip() {
        let nodes = [
            node("a", &["10.244.1.0/24"], &["198.18.0.1"]),
            node(
                "b",
                &["10.244.2.0/24", "fd00:10:244:2::/64"],
                &["fd00::3", "198.19.0.3"],
            ),
            node("c", &["fd00:10:244:3::/64"], &["fd00::4"]),
            node("d", &["10.244.4.0/24"], &[]),
        ];
        let (entries, skipped) = tunnel_entries(&nodes, "a", Underlay { v4: true, v6: true });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            entries,
            vec![
                (net("10.244.2.0/24"), ip("198.19.0.3")),
                (net("fd00:10:244:2::/64"), ip("198.19.0.3")),
                (net("fd00:10:244:3::/64"), ip("fd00::4")),
            ]
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(skipped[0].node, "d", "{skipped:?}");
    }

    #[test]
    fn a_node_is_reached_only_over_a_family_the_uplink_has() {
        let nodes = [
            node("b", &["10.244.2.0/24"], &["198.19.0.3", "fd00::3"]),
            node("c", &["10.244.3.0/24"], &["198.19.0.4"]),
        ];
        let v6_only = Underlay {
            v4: false,
            v6: true,
        };
        let (entries, skipped) = tunnel_entries(&nodes, "a", v6_only);
        assert_eq!(
            entries,
            vec![(
                "10.244.2.0/24".parse::<IpNet>().unwrap(),
                "fd00::3".parse::<IpAddr>().unwrap()
            )]
        );
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(skipped[0].node, "c");
        assert!(
            skipped[0].why.contains("(IPv6)") && skipped[0].why.contains("198.19.0.4"),
            "{skipped:?}"
        );
    }
}
