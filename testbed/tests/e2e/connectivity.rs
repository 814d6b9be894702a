//! Connectivity through the real plugin for every spec version, the dual-stack matrix:
//! pod ↔ pod on one node, pod ↔ node, pod → outside (masqueraded to the node's address of
//! the family) and outside → a host port (the client's address kept), each over IPv4 and
//! IPv6, with the Result in each version's shape.

use std::time::Duration;

use serde_json::json;
use testbed::{
    assert_no_ping, assert_ping, netns_exec_ok, tcp_request, Pod, ResultView, SimNode,
    WhoAmIServer, ALL_VERSIONS, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6,
};

const GW4: &str = "10.244.1.1";
const GW6: &str = "fd00:10:244:1::1";

fn has_check(version: &str) -> bool {
    !matches!(version, "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1")
}

/// Asserts the Result of one ADD has the shape of its `version`.
#[track_caller]
fn assert_shape(version: &str, r: &ResultView, pod: &Pod) {
    assert_eq!(r.version, version, "cniVersion: {r}");
    let (v4, v6) = (r.ip(false), r.ip(true));
    assert!(
        v4.address.ends_with("/32") && v4.address.starts_with("10.244.1."),
        "IPv4 address should be a /32 in 10.244.1.0/24: {r}"
    );
    assert!(
        v6.address.ends_with("/128") && v6.address.starts_with("fd00:10:244:1::"),
        "IPv6 address should be a /128 in fd00:10:244:1::/64: {r}"
    );
    assert_eq!(v4.gateway.as_deref(), Some(GW4), "{r}");
    assert_eq!(v6.gateway.as_deref(), Some(GW6), "{r}");
    assert_ne!(v4.ip(), GW4, "the gateway was handed out: {r}");
    for (dst, gw) in [("0.0.0.0/0", GW4), ("::/0", GW6)] {
        assert!(
            r.routes
                .iter()
                .any(|x| x.dst == dst && x.gw.as_deref() == Some(gw)),
            "no route {dst} via {gw}: {r}"
        );
    }
    let raw = &r.raw;
    if r.is_legacy() {
        for key in ["interfaces", "ips", "routes"] {
            assert!(raw.get(key).is_none(), "{version} result has `{key}`: {r}");
        }
        return;
    }
    assert!(
        raw.get("ip4").is_none() && raw.get("ip6").is_none(),
        "{version} result has legacy ip4/ip6: {r}"
    );
    assert_eq!(
        r.interfaces.len(),
        2,
        "host veth + container interface: {r}"
    );
    let host = &r.interfaces[0];
    assert!(
        testbed::inspect::is_host_veth_name(&host.name) && host.sandbox.is_none(),
        "interfaces[0] should be the host veth (ceb + 12 hex, no sandbox): {r}"
    );
    let ctr = &r.interfaces[1];
    assert_eq!(ctr.name, "eth0", "{r}");
    assert_eq!(
        ctr.sandbox.as_deref(),
        Some(pod.netns().to_string_lossy().as_ref()),
        "sandbox should be CNI_NETNS: {r}"
    );
    assert!(
        host.mac.is_some() && ctr.mac.is_some(),
        "interfaces should carry MACs: {r}"
    );
    let want_mtu = (version == "1.1.0").then_some(1500);
    for i in &r.interfaces {
        assert_eq!(i.mtu, want_mtu, "interface mtu only in 1.1.0: {r}");
    }
    let legacy_version_field = matches!(version, "0.3.0" | "0.3.1" | "0.4.0");
    for ip in &r.ips {
        assert_eq!(
            ip.interface,
            Some(1),
            "ips point at the container interface: {r}"
        );
        let want = legacy_version_field.then(|| if ip.is_v6() { "6" } else { "4" }.to_owned());
        assert_eq!(
            ip.version, want,
            "`version` in ips only for 0.3.x/0.4.0: {r}"
        );
    }
}

/// The port of the "who am I" servers in `ext` and in pod a, and pod a's host port.
const SERVER_PORT: u16 = 8080;
const HOST_PORT: u16 = 18080;

/// The address the "who am I" server at `addr` saw for a TCP client in `netns`.
#[track_caller]
fn seen_from(netns: &std::path::Path, addr: &str, what: &str) -> String {
    let answer = tcp_request(netns, addr, b"who", Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{what}: TCP to {addr}: {e}"));
    let peer = answer.lines().next().unwrap_or_default();
    peer.rsplit_once(':').map_or(peer, |(ip, _)| ip).to_owned()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_reach_each_other_and_the_node_in_every_version() {
    let node = SimNode::new("connectivity");
    let (a, b) = (node.pod("a"), node.pod("b"));
    let _ext_server = WhoAmIServer::start(node.ext_netns(), SERVER_PORT);
    let _pod_server = WhoAmIServer::start(a.netns(), SERVER_PORT);
    let mut last = None;
    for version in ALL_VERSIONS {
        let conf = node
            .conf()
            .version(version)
            .set("ipMasq", json!(true))
            .set("clusterCIDRs", json!(["10.244.0.0/16", "fd00:10:244::/48"]));
        // Pod a has a host port in both families (no hostIP).
        let conf_a = conf.clone().set(
            "runtimeConfig",
            json!({ "portMappings": [
                { "hostPort": HOST_PORT, "containerPort": SERVER_PORT, "protocol": "tcp" }
            ] }),
        );
        let ra = node.add(&a, "eth0", &conf_a);
        let rb = node.add(&b, "eth0", &conf);
        assert_shape(version, &ra, &a);
        assert_shape(version, &rb, &b);
        assert_ne!(ra.ip4(), rb.ip4(), "two pods got one address");
        if has_check(version) {
            for (pod, c, r) in [(&a, &conf_a, &ra), (&b, &conf, &rb)] {
                node.check(pod, "eth0", c, &r.raw).assert_empty_success();
            }
        }

        // pod ↔ pod, both directions, both families.
        for (from, to) in [(&a, &rb), (&b, &ra)] {
            assert_ping(from.netns(), &to.ip4());
            assert_ping(from.netns(), &to.ip6());
        }
        // pod ↔ node (the node's own uplink addresses and the gateways).
        for pod in [&a, &b] {
            for dst in [NODE_IP4, NODE_IP6, GW4, GW6] {
                assert_ping(pod.netns(), dst);
            }
        }
        for r in [&ra, &rb] {
            assert_ping(node.netns(), &r.ip4());
            assert_ping(node.netns(), &r.ip6());
        }
        // pod → outside, masqueraded to the node's address of each family.
        for pod in [&a, &b] {
            for (ext, node_ip) in [
                (format!("{EXT_IP4}:{SERVER_PORT}"), NODE_IP4),
                (format!("[{EXT_IP6}]:{SERVER_PORT}"), NODE_IP6),
            ] {
                let seen = seen_from(pod.netns(), &ext, version);
                assert_eq!(seen, node_ip, "{version}: pod → {ext} must be masqueraded");
            }
        }
        // outside → the host port, in both families, the client's address kept.
        for (host_port, client) in [
            (format!("{NODE_IP4}:{HOST_PORT}"), EXT_IP4),
            (format!("[{NODE_IP6}]:{HOST_PORT}"), EXT_IP6),
        ] {
            let seen = seen_from(node.ext_netns(), &host_port, version);
            assert_eq!(seen, client, "{version}: ext → {host_port}");
        }

        node.del(&a, "eth0", &conf_a);
        node.del(&b, "eth0", &conf);
        last = Some(ra);
    }
    // After DEL the addresses are unreachable (checked once: each miss costs a timeout).
    let Some(ra) = last else {
        panic!("no version ran")
    };
    assert_no_ping(node.netns(), &ra.ip4());
    assert!(
        testbed::inspect::host_veths(node.netns()).is_empty(),
        "host veths left after DEL"
    );
    node.store("testnet").assert_empty("after DEL of every pod");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_new_pod_is_reachable_over_ipv6_at_once() {
    // No DAD delay: the pod's IPv6 address is usable the moment ADD returns,
    // also for traffic the node forwards to it (from another pod), not only for the node's
    // own. One probe, one second.
    let node = SimNode::new("ipv6_at_once");
    let conf = node.conf();
    let (a, b) = (node.pod("a"), node.pod("b"));
    node.add(&a, "eth0", &conf);
    // a's neighbour entry for its gateway is resolved before b exists.
    assert_ping(a.netns(), GW6);
    let rb = node.add(&b, "eth0", &conf);
    // What makes that hold without racing the kernel's deferred address work (which runs
    // under the rtnl lock and can lag on a busy node), checked right after ADD returns:
    let host = rb.host_interface();
    let host_mac = host.mac.clone().unwrap_or_default();
    // b's gateways are in b's neighbour table for good, at the host veth's MAC: b never
    // solicits them.
    for gw in [GW4, GW6] {
        let neigh = netns_exec_ok(b.netns(), &["ip", "neigh", "show", "dev", "eth0", gw]);
        assert!(
            neigh.contains(&host_mac) && neigh.contains("PERMANENT"),
            "b's neighbour entry for its gateway {gw} should be permanent at {host_mac}: {neigh:?}"
        );
    }
    // The host veth has a usable link-local address: the node's solicitations for b come
    // from it.
    let ll = node
        .exec(&[
            "ip", "-6", "addr", "show", "dev", &host.name, "scope", "link",
        ])
        .ok()
        .to_owned();
    assert!(
        ll.contains("inet6 fe80::") && !ll.contains("tentative"),
        "the host veth {} has no usable link-local address: {ll}",
        host.name
    );
    // b listens on the solicited-node group of its address: the node's solicitation for
    // b reaches it.
    let low24 = rb.ip6().rsplit(':').next().unwrap_or_default().to_owned();
    let group = format!("ff02::1:ff00:{low24}");
    let maddr = netns_exec_ok(b.netns(), &["ip", "-6", "maddr", "show", "dev", "eth0"]);
    assert!(
        maddr.contains(&format!("inet6 {group}")),
        "b has not joined {group} when ADD returns: {maddr}"
    );
    assert!(
        testbed::ping(a.netns(), &rb.ip6(), 1),
        "the first IPv6 echo from pod a to the new pod b ({}) got no answer within 1 s",
        rb.ip6()
    );
    assert!(
        testbed::ping(a.netns(), &rb.ip4(), 1),
        "the first IPv4 echo from pod a to the new pod b got no answer within 1 s"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn single_stack_networks_connect_pods_and_node() {
    let node = SimNode::new("single_stack");
    for (net, subnet, v6) in [
        ("v4only", "10.244.2.0/24", false),
        ("v6only", "fd00:10:244:2::/64", true),
    ] {
        let conf = node.conf().name(net).subnets(&[subnet]);
        let (a, b) = (node.pod(&format!("{net}a")), node.pod(&format!("{net}b")));
        let ra = node.add(&a, "eth0", &conf);
        let rb = node.add(&b, "eth0", &conf);
        assert_eq!(ra.ips.len(), 1, "{net}: one address: {ra}");
        assert_eq!(ra.ips[0].is_v6(), v6, "{net}: {ra}");
        assert_eq!(ra.routes.len(), 1, "{net}: one default route: {ra}");
        node.check(&a, "eth0", &conf, &ra.raw)
            .assert_empty_success();
        let (pa, pb) = (ra.ips[0].ip().to_owned(), rb.ips[0].ip().to_owned());
        assert_ping(a.netns(), &pb);
        assert_ping(b.netns(), &pa);
        assert_ping(a.netns(), if v6 { NODE_IP6 } else { NODE_IP4 });
        assert_ping(node.netns(), &pa);
        node.del(&a, "eth0", &conf);
        node.del(&b, "eth0", &conf);
        node.store(net).assert_empty(&format!("{net}: after DEL"));
    }
}
