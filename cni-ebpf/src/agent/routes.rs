//! Cross-node routes without a cloud: `cni-ebpf agent --host-gw` keeps, in the node's
//! network namespace, a route `<other node's pod CIDR> via <its InternalIP>` for every
//! other Node object (flannel's host-gw idea: the nodes share a layer-2 segment, so each
//! node's InternalIP is a next hop the others reach directly).
//!
//! The agent's Node watcher (`crate::agent::nodes`) reconciles the main routing table
//! after every change of the Node objects, and every [`HostGwArgs::interval`] against the
//! view it has (so a route someone deleted comes back; no API request for that):
//! - a pod CIDR of another node gets a route via that node's first InternalIP of the same
//!   family (IPv4 CIDRs via IPv4 addresses, IPv6 via IPv6); none of that family: no route;
//! - its own node (`--node-name`) never gets one;
//! - routes are marked with protocol [`RTPROT_CNI_EBPF_HOST_GW`] (207): ours are the ones
//!   with that mark, and only those are changed or removed. A route to the same destination
//!   that someone else installed (a cloud agent, an admin) is left alone and ours is not
//!   added next to it;
//! - a route of ours whose Node (or pod CIDR) is gone is removed.
//!
//! A failed watch or route change is logged and retried: the routes stay as they are
//! while the API server is unreachable. Off by default; leave it off
//! where the cloud (or BGP) already routes pod CIDRs.

use std::{collections::BTreeMap, net::IpAddr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::{
    error::{Error, Result},
    k8s,
    kernel::link::{Nl, RouteInfo, RTPROT_CNI_EBPF_HOST_GW},
};

/// Default [`HostGwArgs::interval`] in seconds.
pub const DEFAULT_INTERVAL_SECS: u64 = 30;

/// The host-gw options of the agent.
#[derive(Debug, Clone, clap::Args)]
pub struct HostGwArgs {
    /// Keep a route to every other node's pod CIDRs via its InternalIP (host-gw), read from
    /// the Node objects. Off by default: leave it off where the cloud routes pod CIDRs.
    #[arg(long = "host-gw", env = "CNI_EBPF_HOST_GW")]
    pub enabled: bool,
    /// Seconds between two checks of the routing table against the watched Node objects
    /// (the Nodes themselves are watched: a change is acted on at once).
    #[arg(long = "host-gw-interval", default_value_t = DEFAULT_INTERVAL_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub interval: u64,
}

/// A route host-gw wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The other node's pod CIDR.
    pub dst: IpNet,
    /// Its InternalIP of the same family.
    pub via: IpAddr,
    /// The node's name.
    pub node: String,
}

/// The routes `nodes` call for on node `own`, and what was skipped and why.
#[must_use]
pub fn wanted_routes(nodes: &[Node], own: &str) -> (Vec<Wanted>, Vec<String>) {
    let mut by_dst: BTreeMap<IpNet, Wanted> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| k8s::name(a).cmp(k8s::name(b)));
    for node in sorted {
        let name = k8s::name(node);
        if name == own || name.is_empty() {
            continue;
        }
        let cidrs = match k8s::pod_cidrs(node) {
            Ok(c) => c,
            Err(e) => {
                skipped.push(format!("node {name}: {e}"));
                continue;
            }
        };
        let ips = k8s::internal_ips(node);
        for dst in cidrs {
            let Some(&via) = ips.iter().find(|ip| ip.is_ipv4() == dst.addr().is_ipv4()) else {
                skipped.push(format!(
                    "node {name}: pod CIDR {dst} has no InternalIP of its family"
                ));
                continue;
            };
            if let Some(first) = by_dst.get(&dst) {
                skipped.push(format!(
                    "node {name}: pod CIDR {dst} is node {}'s too; keeping that one",
                    first.node
                ));
                continue;
            }
            by_dst.insert(
                dst,
                Wanted {
                    dst,
                    via,
                    node: name.to_owned(),
                },
            );
        }
    }
    (by_dst.into_values().collect(), skipped)
}

/// One change to the routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Add `dst via`.
    Add(IpNet, IpAddr),
    /// Our route to `dst` goes via another address: replace it.
    Replace(IpNet, IpAddr),
    /// Our route `dst via` is no longer wanted: delete it.
    Remove(IpNet, IpAddr),
    /// Someone else's route to `dst` exists: leave it, add none.
    Foreign(IpNet),
}

/// What to do to go from the main table's `routes` to `wanted`.
#[must_use]
pub fn plan(routes: &[RouteInfo], wanted: &[Wanted]) -> Vec<Change> {
    let ours = |r: &&RouteInfo| r.protocol == RTPROT_CNI_EBPF_HOST_GW;
    let mut changes = Vec::new();
    let mut kept: Vec<IpNet> = Vec::new();
    for w in wanted {
        if routes.iter().any(|r| r.dst == w.dst && !ours(&r)) {
            changes.push(Change::Foreign(w.dst));
            continue;
        }
        match routes.iter().filter(ours).find(|r| r.dst == w.dst) {
            Some(r) if r.gw == Some(w.via) => {}
            Some(_) => changes.push(Change::Replace(w.dst, w.via)),
            None => changes.push(Change::Add(w.dst, w.via)),
        }
        kept.push(w.dst);
    }
    for r in routes.iter().filter(ours) {
        if !kept.contains(&r.dst) {
            if let Some(gw) = r.gw {
                changes.push(Change::Remove(r.dst, gw));
            }
        }
    }
    changes
}

/// Applies `changes`; returns the errors (one failed route does not stop the others).
async fn apply(nl: &Nl, changes: &[Change]) -> Vec<Error> {
    let mut errors = Vec::new();
    for c in changes {
        let done = match *c {
            Change::Add(dst, via) => {
                nl.add_gateway_route(dst, via, RTPROT_CNI_EBPF_HOST_GW, false)
                    .await
            }
            Change::Replace(dst, via) => {
                nl.add_gateway_route(dst, via, RTPROT_CNI_EBPF_HOST_GW, true)
                    .await
            }
            Change::Remove(dst, via) => {
                nl.del_gateway_route(dst, via, RTPROT_CNI_EBPF_HOST_GW)
                    .await
            }
            Change::Foreign(_) => Ok(()),
        };
        if let Err(e) = done {
            errors.push(e);
        }
    }
    errors
}

pub(crate) fn log(msg: &str) {
    eprintln!("cni-ebpf host-gw: {msg}");
}

/// Makes the node's host-gw routes (`proto 207`) exactly `wanted`; logs what it did and
/// what `skipped` holds when that changed since `last_skipped`.
pub(crate) async fn reconcile_routes(
    nl: &Nl,
    wanted: &[Wanted],
    skipped: Vec<String>,
    last_skipped: &mut Vec<String>,
) {
    if skipped != *last_skipped {
        for s in &skipped {
            log(&format!("no route: {s}"));
        }
        *last_skipped = skipped;
    }
    let routes = match main_table_routes(nl).await {
        Ok(r) => r,
        Err(e) => {
            log(&format!("{e}"));
            return;
        }
    };
    let changes = plan(&routes, wanted);
    for c in &changes {
        match c {
            Change::Add(d, v) => log(&format!("adding {d} via {v}")),
            Change::Replace(d, v) => log(&format!("replacing {d}: now via {v}")),
            Change::Remove(d, v) => log(&format!("removing {d} via {v} (its node is gone)")),
            Change::Foreign(d) => log(&format!(
                "a route to {d} exists that cni-ebpf did not install; leaving it"
            )),
        }
    }
    for e in apply(nl, &changes).await {
        log(&format!("{e}"));
    }
}

/// The main table's routes: host-gw routes live there; a route in another table routes
/// nothing here unless a rule says so, and is not ours to judge.
async fn main_table_routes(nl: &Nl) -> Result<Vec<RouteInfo>> {
    Ok(nl
        .routes()
        .await?
        .into_iter()
        .filter(|r| r.table == crate::kernel::link::RT_TABLE_MAIN)
        .collect())
}

/// `uninstall --purge`: removes every host-gw route (`proto 207`: host-gw's and
/// crossSubnet's direct routes), nobody else's; the number removed.
pub(crate) async fn remove_all_routes(nl: &Nl) -> Result<usize> {
    let changes = plan(&main_table_routes(nl).await?, &[]);
    match apply(nl, &changes).await.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(changes.len()),
    }
}

#[cfg(test)]
#[expect(clippy::panic, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> Node {
        let addrs: Vec<_> = ips
            .iter()
            .map(|a| serde_json::json!({"type": "InternalIP", "address": a}))
            .chain(std::iter::once(
                serde_json::json!({"type": "Hostname", "address": name}),
            ))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": addrs}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn route(dst: &str, gw: &str, protocol: u8) -> RouteInfo {
        RouteInfo {
            dst: net(dst),
            gw: Some(ip(gw)),
            oif: Some(2),
            table: crate::kernel::link::RT_TABLE_MAIN,
            scope: 0,
            protocol,
        }
    }

    #[test]
    fn every_other_node_by_family_never_our_own() {
        let nodes = [
            node(
                "b",
                &["10.244.2.0/24", "fd00:2::/64"],
                &["198.18.0.3", "fd00::3"],
            ),
            node(
                "a",
                &["10.244.1.0/24", "fd00:1::/64"],
                &["198.18.0.1", "fd00::1"],
            ),
            node("c", &["10.244.3.0/24", "fd00:3::/64"], &["198.18.0.4"]),
            node("d", &["10.244.2.0/24"], &["198.18.0.5"]),
        ];
        let (wanted, skipped) = wanted_routes(&nodes, "a");
        let got: Vec<(IpNet, IpAddr)> = wanted.iter().map(|w| (w.dst, w.via)).collect();
        assert_eq!(
            got,
            vec![
                (net("10.244.2.0/24"), ip("198.18.0.3")),
                (net("10.244.3.0/24"), ip("198.18.0.4")),
                (net("fd00:2::/64"), ip("fd00::3")),
            ]
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("fd00:3::/64 has no InternalIP"));
        assert!(skipped[1].contains("is node b's too"));
    }

    #[test]
    fn the_plan_touches_only_our_routes() {
        let p = RTPROT_CNI_EBPF_HOST_GW;
        let routes = [
            route("10.244.2.0/24", "198.18.0.3", p), // ours, right
            route("10.244.3.0/24", "198.18.0.9", p), // ours, moved
            route("10.244.4.0/24", "198.18.0.4", p), // ours, node gone
            route("10.244.5.0/24", "198.18.0.2", 4), // foreign, wanted
            route("10.99.0.0/24", "198.18.0.2", 3),  // foreign, not ours
        ];
        let wanted = [
            ("10.244.2.0/24", "198.18.0.3"),
            ("10.244.3.0/24", "198.18.0.4"),
            ("10.244.5.0/24", "198.18.0.5"),
            ("10.244.6.0/24", "198.18.0.6"),
        ]
        .map(|(d, v)| Wanted {
            dst: net(d),
            via: ip(v),
            node: String::new(),
        });
        assert_eq!(
            plan(&routes, &wanted),
            vec![
                Change::Replace(net("10.244.3.0/24"), ip("198.18.0.4")),
                Change::Foreign(net("10.244.5.0/24")),
                Change::Add(net("10.244.6.0/24"), ip("198.18.0.6")),
                Change::Remove(net("10.244.4.0/24"), ip("198.18.0.4")),
            ]
        );
    }
}
