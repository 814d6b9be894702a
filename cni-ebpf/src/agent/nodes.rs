//! The agent's view of the Node objects, and what it keeps from them on this node:
//!
//! - **tunnel endpoints** (networks in `crossNode` `tunnel` or `crossSubnet` mode): every
//!   other node's pod CIDRs (`spec.podCIDRs`) → its InternalIP (IPv4 when the node has
//!   one, else IPv6), in each such network's `TUNNEL_ENDPOINTS`;
//! - **direct routes** (`proto 207`, see `crate::cli::hostgw`): with `--host-gw`, to every
//!   other node's pod CIDRs via its InternalIP; in `crossSubnet` mode, to those of the
//!   nodes whose InternalIP is on the uplink's own subnet (more specific than the cluster
//!   CIDRs' route to the tunnel device, so those nodes are reached without
//!   encapsulation). A node whose address moves to or from the uplink's subnet changes
//!   route at once.
//!
//! The Nodes are listed once, then watched (kube-runtime's watcher and reflector: a
//! dropped watch resumes, a `410 Gone` lists again, an unreachable or refusing API server
//! is retried with backoff). Everything is reconciled after every change, and every
//! `--host-gw-interval` against the view it has (a route someone deleted comes back; no
//! API request for that). While the API server is away, what is in place stays.

use std::{net::IpAddr, path::Path, sync::Arc, time::Duration};

use futures::StreamExt as _;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    runtime::{reflector, watcher, WatchStreamExt as _},
    Api,
};
use tokio::sync::Notify;

use crate::{
    cli::hostgw::{log, reconcile_routes, wanted_routes, HostGwArgs},
    datapath::Datapath,
    error::{Error, Result},
    k8s::{self, ApiClient},
    link::{Nl, RTPROT_CNI_EBPF_HOST_GW},
};

/// How long a round waits after a Node change for more changes of the same burst.
const SETTLE: Duration = Duration::from_millis(30);

/// A network in a tunnel mode.
struct TunnelNetwork {
    name: String,
    dp: Datapath,
    cross_subnet: bool,
    uplink_ifindex: u32,
}

/// The networks below `root` whose node configuration has a tunnel device.
fn tunnel_networks(root: &Path) -> Vec<TunnelNetwork> {
    let Ok(dirs) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    dirs.filter_map(std::result::Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let dp = Datapath::open_at(e.path()).ok().flatten()?;
            let cfg = dp.node_config_view().ok()?;
            (cfg.tunnel_ifindex != 0).then(|| TunnelNetwork {
                name: e.file_name().to_string_lossy().into_owned(),
                dp,
                cross_subnet: cfg.cross_subnet,
                uplink_ifindex: cfg.uplink_ifindex,
            })
        })
        .collect()
}

/// Every other node's pod CIDRs → its underlay address (its first IPv4 InternalIP, else
/// its first IPv6 one), and what was skipped and why.
#[must_use]
pub fn tunnel_entries(nodes: &[Node], own: &str) -> (Vec<(IpNet, IpAddr)>, Vec<String>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    for node in nodes {
        let name = k8s::name(node);
        if name == own || name.is_empty() {
            continue;
        }
        let ips = k8s::internal_ips(node);
        let Some(underlay) = ips
            .iter()
            .find(|ip| ip.is_ipv4())
            .or_else(|| ips.first())
            .copied()
        else {
            skipped.push(format!("node {name}: no InternalIP to tunnel to"));
            continue;
        };
        match k8s::pod_cidrs(node) {
            Ok(cidrs) => out.extend(cidrs.into_iter().map(|c| (c, underlay))),
            Err(e) => skipped.push(format!("node {name}: {e}")),
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    (out, skipped)
}

/// One round over `nodes`.
async fn round(
    nodes: &[Node],
    nl: &Nl,
    own: &str,
    args: &HostGwArgs,
    root: &Path,
    last_skipped: &mut Vec<String>,
) {
    let tunnels = tunnel_networks(root);
    let (entries, mut skipped) = tunnel_entries(nodes, own);
    for t in &tunnels {
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
    if !args.enabled && !tunnels.iter().any(|t| t.cross_subnet) {
        if tunnels.is_empty() {
            skipped.clear();
        }
        if skipped != *last_skipped {
            for s in &skipped {
                log(&format!("no tunnel entry: {s}"));
            }
            *last_skipped = skipped;
        }
        return;
    }
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

/// Whether the Node watcher has work on this node: host-gw asked for, or a network
/// below `root` in a tunnel mode (which a later ADD may also create, so the watcher
/// starts whenever the node's name is known).
#[must_use]
pub fn wanted(args: &HostGwArgs) -> bool {
    args.enabled || args.node_name.as_deref().is_some_and(|n| !n.is_empty())
}

/// Runs the Node watcher forever on the calling thread (its own current-thread runtime),
/// in the calling thread's network namespace.
pub fn run(args: &HostGwArgs, own: &str, root: &Path) -> Result<()> {
    let rt = crate::link::runtime()?;
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
            match ApiClient::new(&args.api) {
                Ok(c) => break c.client(),
                Err(e) => log(&format!("{e}; retrying")),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        let (store, writer) = reflector::store::<Node>();
        let changed = Arc::new(Notify::new());
        {
            let changed = Arc::clone(&changed);
            let events = watcher(Api::<Node>::all(client), watcher::Config::default())
                .default_backoff()
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
            round(&nodes, &nl, own, args, root, &mut last_skipped).await;
            tokio::select! {
                () = changed.notified() => tokio::time::sleep(SETTLE).await,
                () = tokio::time::sleep(Duration::from_secs(args.interval)) => {}
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
        let (entries, skipped) = tunnel_entries(&nodes, "a");
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
        assert!(skipped[0].contains("node d"), "{skipped:?}");
    }
}
