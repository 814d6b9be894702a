//! Cross-node routes without a cloud. Two simulated nodes
//! ([`Cluster::without_pod_routes`]: no static routes to each other's pod CIDR) each run
//! `cni-ebpf agent --host-gw`, as the DaemonSet's main container does with host-gw
//! switched on, against the stand-in API server (`testbed::apiserver`) listening on the
//! `ext` namespace's 198.18.0.2, which both nodes reach over the fabric.
//!
//! Shown here: pod → pod across nodes fails before and works once the routes are there
//! (IPv4 and IPv6 pod CIDRs, each via the InternalIP of its family, marked `proto 207`);
//! a node never routes its own pod CIDR; a route to a pod CIDR that someone else installed,
//! and an unrelated foreign route, are left exactly as they were; a Node deleted from the
//! API server has its routes removed and its pods are unreachable again; a Node whose
//! InternalIP changes has its route replaced; while the API server refuses, the routes stay.
//! The routing table is checked against the view only every 30 s here, so every change
//! seen within [`WAIT`] came by the Node watch.

use std::{
    collections::BTreeSet,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use testbed::{
    apiserver::ApiServer, assert_no_ping, assert_ping, ip_json, process::Background, Cluster,
    ClusterNode, EXT_IP4,
};

/// The protocol number host-gw marks its routes with (`link::RTPROT_CNI_EBPF_HOST_GW`).
const PROTO: &str = "207";
/// Longest wait for a route change (it comes by watch, within milliseconds).
const WAIT: Duration = Duration::from_secs(5);

type Routes = BTreeSet<(String, String)>;

/// The node's host-gw routes of both families: (destination, gateway).
fn hostgw_routes(netns: &Path) -> Routes {
    let mut out = Routes::new();
    for family in ["-4", "-6"] {
        let routes = ip_json(netns, &[family, "route", "show", "proto", PROTO]);
        for r in routes.as_array().into_iter().flatten() {
            out.insert((
                r["dst"].as_str().unwrap_or_default().to_owned(),
                r["gateway"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    out
}

fn routes(list: &[(&str, &str)]) -> Routes {
    list.iter()
        .map(|(d, g)| ((*d).to_owned(), (*g).to_owned()))
        .collect()
}

/// Waits (bounded by [`WAIT`]) until `node`'s host-gw routes are `want`.
#[track_caller]
fn wait_for_routes(node: &ClusterNode, want: &Routes, log: &Path) {
    let deadline = Instant::now() + WAIT;
    let mut last = hostgw_routes(node.netns());
    while last != *want {
        if Instant::now() >= deadline {
            panic!(
                "{}: host-gw routes after {WAIT:?}: {last:?}, expected {want:?}\nlog:\n{}",
                node.name(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(200));
        last = hostgw_routes(node.netns());
    }
}

/// `ip route show <dst>` in `netns` as one line of JSON (the route's full description).
fn route_to(netns: &Path, dst: &str) -> String {
    ip_json(netns, &["route", "show", dst]).to_string()
}

/// Starts `cni-ebpf agent --policy=false --flows=false --host-gw` in `node`'s namespace,
/// logging to `log`: an agent that keeps routes and nothing else, whose every request to
/// the API server is its Node watcher's.
fn start_host_gw(node: &ClusterNode, api: &ApiServer, log: &Path) -> Background {
    node.start_agent(
        api,
        &[
            "agent",
            "--policy=false",
            "--flows=false",
            "--listen",
            "127.0.0.1:0",
            "--host-gw",
            "--node-name",
            node.name(),
            "--host-gw-interval",
            "30",
        ],
        log,
    )
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn host_gw_routes_other_nodes_pod_cidrs_and_forgets_deleted_nodes() {
    let cluster = Cluster::without_pod_routes("hostgw");
    let (a, b) = (cluster.a(), cluster.b());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.set_node(
        "node-a",
        &[a.pod_cidr4(), "fd00:10:244:1::/64"],
        &[a.ip4(), a.ip6()],
    );
    api.set_node(
        "node-b",
        &[b.pod_cidr4(), "fd00:10:244:2::/64"],
        &[b.ip4(), b.ip6()],
    );
    // A third node with only an IPv4 InternalIP: no IPv6 route can go to it.
    api.set_node(
        "node-c",
        &["10.244.3.0/24", "fd00:10:244:3::/64"],
        &["198.18.0.4"],
    );

    let pa = a.pod("pa");
    let pb = b.pod("pb");
    let ip_a = a.add(&pa, "eth0", &a.conf()).ip4();
    let ip_b = b.add(&pb, "eth0", &b.conf()).ip4();
    assert_no_ping(pa.netns(), &ip_b);

    // Someone else's routes on node A: one to node C's pod CIDR, one unrelated.
    for argv in [
        [
            "ip",
            "route",
            "add",
            "10.244.3.0/24",
            "via",
            EXT_IP4,
            "proto",
            "static",
        ],
        [
            "ip",
            "route",
            "add",
            "10.99.0.0/24",
            "via",
            EXT_IP4,
            "proto",
            "boot",
        ],
    ] {
        a.exec(&argv).ok();
    }
    let foreign_c = route_to(a.netns(), "10.244.3.0/24");
    let foreign_other = route_to(a.netns(), "10.99.0.0/24");

    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (log_a, log_b) = (logs.path().join("a.log"), logs.path().join("b.log"));
    let _hgw_a = start_host_gw(a, &api, &log_a);
    let _hgw_b = start_host_gw(b, &api, &log_b);

    // Each node: the other nodes' pod CIDRs via their InternalIP of the same family, never
    // its own; node A none to node C (a foreign route is there), no IPv6 route to node C.
    wait_for_routes(
        a,
        &routes(&[
            ("10.244.2.0/24", "198.18.0.3"),
            ("fd00:10:244:2::/64", "fd00:198:18::3"),
        ]),
        &log_a,
    );
    wait_for_routes(
        b,
        &routes(&[
            ("10.244.1.0/24", "198.18.0.1"),
            ("10.244.3.0/24", "198.18.0.4"),
            ("fd00:10:244:1::/64", "fd00:198:18::1"),
        ]),
        &log_b,
    );
    assert_ping(pa.netns(), &ip_b);
    assert_ping(pb.netns(), &ip_a);
    let log = std::fs::read_to_string(&log_a).unwrap_or_default();
    assert!(
        log.contains("a route to 10.244.3.0/24 exists that cni-ebpf did not install"),
        "{log}"
    );
    assert!(
        log.contains("fd00:10:244:3::/64 has no InternalIP of its family"),
        "{log}"
    );

    // The API server refuses (RBAC taken away) when the watch is cut and taken up again:
    // the routes stay as they are, pods keep talking, and the log says why nothing is
    // updated.
    api.forbid(true);
    api.drop_watches();
    let refused = || {
        let log = std::fs::read_to_string(&log_a).unwrap_or_default();
        log.contains("forbidden") && log.contains("routes left as they are")
    };
    let deadline = Instant::now() + WAIT;
    while !refused() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        refused(),
        "{}",
        std::fs::read_to_string(&log_a).unwrap_or_default()
    );
    assert_eq!(hostgw_routes(a.netns()).len(), 2);
    assert_ping(pa.netns(), &ip_b);
    api.forbid(false);

    // Node C's InternalIP changes: node B's route to it is replaced, not duplicated.
    api.set_node(
        "node-c",
        &["10.244.3.0/24", "fd00:10:244:3::/64"],
        &["198.18.0.5"],
    );
    wait_for_routes(
        b,
        &routes(&[
            ("10.244.1.0/24", "198.18.0.1"),
            ("10.244.3.0/24", "198.18.0.5"),
            ("fd00:10:244:1::/64", "fd00:198:18::1"),
        ]),
        &log_b,
    );

    // Node B leaves the cluster: node A forgets its routes, its pods are cut off again.
    api.remove_node("node-b");
    wait_for_routes(a, &Routes::new(), &log_a);
    assert_no_ping(pa.netns(), &ip_b);
    // Node B's own routes are its business: still there, the API server still lists A, C.
    assert_eq!(hostgw_routes(b.netns()).len(), 3);

    // Foreign routes untouched through all of it.
    assert_eq!(route_to(a.netns(), "10.244.3.0/24"), foreign_c);
    assert_eq!(route_to(a.netns(), "10.99.0.0/24"), foreign_other);
    assert!(
        api.requests()
            .iter()
            .all(|r| r.starts_with("GET /api/v1/nodes")),
        "{:?}",
        api.requests()
    );
}
