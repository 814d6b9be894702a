//! IPv6 through the datapath on the simulated node, dual-stack pods under the
//! real plugin. Pod → outside masqueraded to the node's IPv6 address (TCP, UDP, ICMPv6
//! echo; `ext` has no route to the pods' ULA prefix, so an answer proves the
//! translation both ways) and ICMPv6 errors about it reaching the pod's socket; pod ↔ pod over IPv6 into the destination pod by `from_pod6`;
//! IPv6 host ports from outside with the client's address kept, and from pods (hairpin,
//! a pod's own included); the uplink fast path (after a flow's first packet, past the
//! node's forwarding, both ways; "packet too big" from the kernel); CHECK, inspect and
//! DEL covering the IPv6 entries.

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

mod datapath_support;

use datapath_support::{
    add, assert_seen_as, del, forwarded_datagrams, greet, inspect, known_node_addrs, list, reason,
    tcp_udp, udp_error, udp_exchange, upload, with_ports, Family, CLUSTER_CIDR,
};
use serde_json::{json, Value};
use tests::{
    assert_ping, ConfBuilder, SimNode, WhoAmIServer, EXT_IP6, NODE_IP4, NODE_IP6, POD_SUBNET_V4,
    POD_SUBNET_V6,
};

/// The IPv6 cluster CIDR (the pod prefix of every node).
const CLUSTER_CIDR6: &str = "fd00:10:244::/48";

/// Dual-stack pods, masquerade on, both families' cluster CIDRs.
fn dual_stack_masq_conf(node: &SimNode) -> ConfBuilder {
    node.conf()
        .version("1.1.0")
        .subnets(&[POD_SUBNET_V4, POD_SUBNET_V6])
        .set("ipMasq", json!(true))
        .set("clusterCIDRs", json!([CLUSTER_CIDR, CLUSTER_CIDR6]))
}

/// The pod's IPv6 address (no prefix) in an ADD result.
#[track_caller]
fn pod_ip6(result: &Value) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':'))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no IPv6 address in the result: {result}"))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pod_to_ext_over_ipv6_is_masqueraded_to_the_node_ipv6_address() {
    let node = SimNode::new("dp_masq6");
    let conf = dual_stack_masq_conf(&node);
    let a = node.pod("a");
    let r = add(&node, &a, &conf);
    let ip6 = pod_ip6(&r);
    let doc = inspect(&node);
    assert_eq!(doc["node"]["node_addr6"], NODE_IP6, "{:#}", doc["node"]);
    assert!(
        doc["node"]["cluster_cidrs"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == CLUSTER_CIDR6)),
        "the IPv6 clusterCIDR is configured, not dropped: {:#}",
        doc["node"]
    );
    assert!(
        list(&doc, "endpoints")
            .iter()
            .any(|e| e["ip"] == ip6.as_str()),
        "inspect lists the pod's IPv6 endpoint: {:#}",
        doc["endpoints"]
    );

    let server = WhoAmIServer::start(node.ext_netns(), 8086);
    let ext = format!("[{EXT_IP6}]:8086");
    // TCP.
    let answer = greet(a.netns(), &ext).unwrap_or_else(|e| panic!("TCP pod → [ext]: {e}"));
    assert_seen_as(
        &answer,
        NODE_IP6,
        "TCP over IPv6: ext must see the node's address",
    );
    // UDP; the answer comes back from ext's own address and port.
    let (answer, from) =
        udp_exchange(a.netns(), &ext, b"who").unwrap_or_else(|e| panic!("UDP pod → [ext]: {e}"));
    assert_seen_as(&answer, NODE_IP6, "UDP over IPv6");
    assert_eq!(from.to_string(), ext, "reply source as the pod sees it");
    // An ICMPv6 error about a masqueraded flow (port unreachable from ext) is translated
    // back and reaches the pod's socket.
    let refused = udp_error(a.netns(), &format!("[{EXT_IP6}]:9"));
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "UDP to a closed port of ext over IPv6: the error must reach the pod: {refused:?}"
    );
    assert!(reason(&inspect(&node), "icmp_error_translated") >= 1);
    // ICMPv6 echo (its NAT entry below shows it was masqueraded by identifier).
    assert_ping(a.netns(), EXT_IP6);

    let doc = inspect(&node);
    for proto in ["tcp", "udp", "icmpv6"] {
        assert!(
            list(&doc, "nat").iter().any(|n| n["kind"] == "snat"
                && n["protocol"] == proto
                && n["src"] == ip6.as_str()
                && n["new_src"] == NODE_IP6
                && n["dst"] == EXT_IP6),
            "no {proto} SNAT entry {ip6} → {EXT_IP6} rewritten to {NODE_IP6}: {:#}",
            doc["nat"]
        );
    }
    assert!(reason(&doc, "snat_new") >= 3, "{:#}", doc["reasons"]);
    assert_eq!(
        reason(&doc, "pass_ipv6_not_loaded"),
        0,
        "{:#}",
        doc["reasons"]
    );

    // CHECK reads the IPv6 entry and the IPv6 programs' slots.
    node.check(&a, "eth0", &conf, &r).assert_empty_success();

    drop(server);
    del(&node, &a, &conf);
    let doc = inspect(&node);
    assert!(
        !list(&doc, "nat")
            .iter()
            .any(|n| n["src"] == ip6.as_str() || n["new_dst"] == ip6.as_str()),
        "DEL must purge the pod's IPv6 flows: {:#}",
        doc["nat"]
    );
    assert!(list(&doc, "endpoints").is_empty(), "{:#}", doc["endpoints"]);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_talk_over_ipv6_straight_into_each_other() {
    let node = SimNode::new("dp_pod6");
    let conf = dual_stack_masq_conf(&node);
    let (a, b) = (node.pod("a"), node.pod("b"));
    add(&node, &a, &conf);
    let rb = add(&node, &b, &conf);
    let b6 = pod_ip6(&rb);
    let server = WhoAmIServer::start(b.netns(), 8087);
    let before = reason(&inspect(&node), "redirect_pod");
    let answer = greet(a.netns(), &format!("[{b6}]:8087"))
        .unwrap_or_else(|e| panic!("TCP pod a → [pod b]: {e}"));
    let doc = inspect(&node);
    let a6 = list(&doc, "endpoints")
        .iter()
        .find(|e| e["ip"].as_str().is_some_and(|ip| ip.contains(':')) && e["ip"] != b6.as_str())
        .and_then(|e| e["ip"].as_str())
        .unwrap_or_else(|| panic!("pod a's IPv6 endpoint: {:#}", doc["endpoints"]))
        .to_owned();
    assert_seen_as(&answer, &a6, "pod b must see pod a's own IPv6 address");
    let grew = reason(&doc, "redirect_pod") - before;
    assert!(
        grew >= 2,
        "redirect_pod grew by {grew}: IPv6 pod → pod must be redirected by from_pod6"
    );
    drop(server);
    del(&node, &a, &conf);
    del(&node, &b, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ext_reaches_a_pod_through_an_ipv6_host_port_with_its_own_address() {
    let node = SimNode::new("dp_hostport6");
    let conf = with_ports(&dual_stack_masq_conf(&node), &tcp_udp(8088, 80, None));
    let a = node.pod("a");
    let r = add(&node, &a, &conf);
    let doc = inspect(&node);
    let ports = list(&doc, "portMappings");
    assert_eq!(
        ports.len(),
        4,
        "no hostIP on a dual-stack pod: TCP and UDP in both families: {ports:#?}"
    );
    let server = WhoAmIServer::start(a.netns(), 80);
    let hostport = format!("[{NODE_IP6}]:8088");
    let answer =
        greet(node.ext_netns(), &hostport).unwrap_or_else(|e| panic!("TCP ext → {hostport}: {e}"));
    assert_seen_as(
        &answer,
        EXT_IP6,
        "the pod must see the client's IPv6 address",
    );
    let (answer, from) = udp_exchange(node.ext_netns(), &hostport, b"who")
        .unwrap_or_else(|e| panic!("UDP ext → {hostport}: {e}"));
    assert_seen_as(&answer, EXT_IP6, "UDP: the client's address kept");
    assert_eq!(
        from.to_string(),
        hostport,
        "the reply comes from the host port"
    );
    assert!(reason(&inspect(&node), "dnat_new") >= 2);
    node.check(&a, "eth0", &conf, &r).assert_empty_success();

    // Hairpin: another pod, and the pod itself, through the node's IPv6 host port.
    let plain = dual_stack_masq_conf(&node);
    let b = node.pod("b");
    let rb = add(&node, &b, &plain);
    let answer =
        greet(b.netns(), &hostport).unwrap_or_else(|e| panic!("TCP pod b → {hostport}: {e}"));
    assert_seen_as(
        &answer,
        pod_ip6(&rb),
        "pod a must see pod b's own IPv6 address",
    );
    let answer = greet(a.netns(), &hostport)
        .unwrap_or_else(|e| panic!("TCP pod a → its own {hostport}: {e}"));
    assert_seen_as(&answer, NODE_IP6, "a pod reaching itself sees the node");
    assert!(reason(&inspect(&node), "hairpin_new") >= 2);
    del(&node, &b, &plain);

    drop(server);
    del(&node, &a, &conf);
    let doc = inspect(&node);
    assert!(
        list(&doc, "portMappings").is_empty(),
        "{:#}",
        doc["portMappings"]
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ipv6_traffic_leaving_through_the_uplink_skips_the_kernel_forwarding_path() {
    let node = SimNode::new("dp_fast6");
    let conf = dual_stack_masq_conf(&node);
    let a = node.pod("a");
    add(&node, &a, &conf);
    // The first packet resolves the uplink's next hop (neighbour discovery) in the kernel.
    assert_ping(a.netns(), EXT_IP6);

    let (before, fwd_before) = (inspect(&node), forwarded_datagrams(&node, Family::V6));
    let server = WhoAmIServer::start(node.ext_netns(), 8087);
    let ext = format!("[{EXT_IP6}]:8087");
    for i in 0..20 {
        let answer = greet(a.netns(), &ext).unwrap_or_else(|e| panic!("TCP pod → [ext] #{i}: {e}"));
        assert_seen_as(&answer, NODE_IP6, "still masqueraded");
    }
    assert_ping(a.netns(), EXT_IP6);
    let (after, fwd_after) = (inspect(&node), forwarded_datagrams(&node, Family::V6));
    let grew = |name: &str| reason(&after, name) - reason(&before, name);
    // Per connection at least SYN, ACK and FIN leave the pod; plus the echo requests.
    assert!(
        grew("redirect_uplink") >= 60,
        "redirect_uplink grew by {}, expected ≥ 60: {:#}",
        grew("redirect_uplink"),
        after["reasons"]
    );
    // The replies, translated back, go straight into the pod too.
    assert!(
        grew("snat_reply") >= 40,
        "snat_reply grew by {}, expected ≥ 40 (delivered into the pod): {:#}",
        grew("snat_reply"),
        after["reasons"]
    );
    // Each flow's first packet goes through the node's stack so that netfilter sees it;
    // everything after it bypasses the kernel's forwarding: 20 connections + 1 ping
    // flow, and a little slack for retransmissions.
    let flows = 20 + 1;
    assert!(
        fwd_after - fwd_before <= flows + 2,
        "the node's kernel forwarded {} IPv6 packets for {flows} flows; after its first \
         packet pod → ext must bypass it",
        fwd_after - fwd_before
    );
    let first = grew("pass_unverified_flow");
    assert!(
        (flows..=flows + 2).contains(&first),
        "pass_unverified_flow grew by {first}, expected one per flow ({flows}): {:#}",
        after["reasons"]
    );
    drop(server);

    // Too big for the uplink: the kernel gets the packet and sends the pod "packet too
    // big" (a blind redirect never would), after which the upload completes.
    let out = node.exec(&["ip", "link", "set", "dev", tests::UPLINK, "mtu", "1400"]);
    assert!(out.status.success(), "{out:?}");
    let sent = 256 * 1024;
    assert_eq!(
        upload(&node, a.netns(), &format!("[{EXT_IP6}]:8088"), sent),
        sent
    );
    let route = a.exec(&["ip", "-6", "route", "get", EXT_IP6]);
    let route = route.stdout.clone();
    assert!(
        route.contains("mtu 1400"),
        "the pod must have learned the uplink's MTU 1400: {route}"
    );
    del(&node, &a, &conf);
}

/// The gateways of an ADD result.
fn gateways(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["gateway"].as_str().map(str::to_owned))
        .collect()
}

/// A node can carry more addresses than the node-address maps hold (256 per family):
/// kube-proxy's IPVS mode binds every ClusterIP to `kube-ipvs0`, and every host veth has
/// its own IPv6 link-local, so a node with a few hundred pods used to fail every ADD once
/// the periodic full listing ran (`E2BIG` from `NODE_ADDRS6`, code 103). Now ADD works
/// on such a node, also when the full listing runs again with the maps full: the uplink's
/// addresses and the pods' gateways are tracked (host ports on them answer), the overflow
/// is warned about, and no IPv6 link-local address takes a slot.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_node_with_more_addresses_than_the_maps_hold_still_starts_pods() {
    let node = SimNode::new("dp_many_addrs");
    // Before the first ADD, which lists every address: 300 IPv4, 300 global IPv6 and 300
    // link-local IPv6 addresses on a side interface.
    let mut batch = String::new();
    for i in 0..300u32 {
        batch += &format!("addr add 100.64.{}.{}/32 dev side0\n", i / 250, i % 250 + 1);
        batch += &format!("addr add fd99::{:x}/128 dev side0 nodad\n", i + 1);
        batch += &format!("addr add fe80::99:{:x}/64 dev side0 nodad\n", i + 1);
    }
    let script = format!(
        "ip link add side0 type veth peer name side1 && ip link set side0 up && \
         ip -batch - <<'EOF'\n{batch}EOF\n"
    );
    let out = node.exec(&["sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");

    let conf = with_ports(&dual_stack_masq_conf(&node), &tcp_udp(8088, 80, None));
    let a = node.pod("a");
    let ra = add(&node, &a, &conf);
    let known = known_node_addrs(&node);
    let (v6, v4): (Vec<&String>, Vec<&String>) = known.iter().partition(|a| a.contains(':'));
    assert!(
        v4.len() <= 256 && v6.len() <= 256,
        "{} IPv4 and {} IPv6 node addresses tracked",
        v4.len(),
        v6.len()
    );
    assert!(
        !known.iter().any(|a| a.starts_with("fe80:")),
        "an IPv6 link-local address took a slot: {known:?}"
    );
    for want in [NODE_IP4, NODE_IP6]
        .into_iter()
        .map(str::to_owned)
        .chain(gateways(&ra))
    {
        assert!(known.contains(&want), "{want} is not tracked: {known:?}");
    }
    assert!(
        node.log().contains("is full"),
        "the overflow is not warned about: {}",
        node.log()
    );
    let server = WhoAmIServer::start(a.netns(), 80);
    for hostport in [format!("{NODE_IP4}:8088"), format!("[{NODE_IP6}]:8088")] {
        greet(node.ext_netns(), &hostport).unwrap_or_else(|e| panic!("TCP ext → {hostport}: {e}"));
    }

    // The next full listing (10 s later) finds the maps full: the next pod still starts,
    // and what was tracked stays tracked.
    std::thread::sleep(std::time::Duration::from_secs(11));
    let b = node.pod("b");
    let plain = dual_stack_masq_conf(&node);
    let rb = add(&node, &b, &plain);
    let again = known_node_addrs(&node);
    for want in [NODE_IP4, NODE_IP6]
        .into_iter()
        .map(str::to_owned)
        .chain(gateways(&rb))
    {
        assert!(
            again.contains(&want),
            "{want} is no longer tracked: {again:?}"
        );
    }
    assert_ping(b.netns(), &pod_ip6(&ra));
    drop(server);
    del(&node, &b, &plain);
    del(&node, &a, &conf);
}
