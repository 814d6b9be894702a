//! End to end on the simulated node: the eBPF datapath forwards real traffic.
//! Pod ↔ pod through `from_pod`'s redirect (proved by its counters), masquerade of pod
//! traffic leaving the cluster (TCP, UDP, ICMP echo) and none for cluster or node
//! destinations, host ports from outside with the client's address kept (also on a
//! `hostIP`), and hairpin to host ports from pods, including a pod's own.

use serde_json::Value;
use testbed::datapath::{
    add, assert_seen_as, del, dual_stack_masq_conf, endpoint, forwarded_datagrams, greet, inspect,
    known_node_addrs, list, masq_conf, nat_mentioning, num, pod_ip, pod_ip6, reason, seen_peer,
    tcp_udp, udp_error, udp_exchange, upload, wait_until, with_ports, Family, IcmpSniffer, Mode,
    TaggedServer, CLUSTER_CIDR6, GW4, T,
};
use testbed::{
    assert_ping, tcp_request, SimNode, WhoAmIServer, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6,
};

/// The `[lo, hi]` SNAT port range the datapath was configured with.
fn snat_range(doc: &Value) -> (u64, u64) {
    let r = &doc["node"]["snat_ports"];
    (r[0].as_u64().unwrap_or(0), r[1].as_u64().unwrap_or(0))
}

#[track_caller]
fn port_of(peer: &str) -> u64 {
    peer.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{peer:?} is not ip:port"))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pod_to_pod_on_one_node_is_redirected_by_from_pod() {
    let node = SimNode::new("dp_pod_pod");
    let conf = masq_conf(&node);
    let (a, b) = (node.pod("a"), node.pod("b"));
    let (ra, rb) = (add(&node, &a, &conf), add(&node, &b, &conf));
    let (ipa, ipb) = (pod_ip(&ra), pod_ip(&rb));
    let before = inspect(&node);
    for ip in [&ipa, &ipb] {
        assert!(
            endpoint(&before, ip).is_some(),
            "no endpoint entry for {ip}: {before:#}"
        );
    }

    assert_ping(a.netns(), &ipb);
    assert_ping(b.netns(), &ipa);
    let srv = TaggedServer::start(b.netns(), 8080, "b", Mode::Greet);
    let answer = greet(a.netns(), &format!("{ipb}:8080"))
        .unwrap_or_else(|e| panic!("TCP from pod a to pod b {ipb}:8080: {e}"));
    assert_seen_as(
        &answer,
        &ipa,
        "pod b must see pod a's own address (no NAT between pods)",
    );
    assert_eq!(srv.accepted(), 1);

    let after = inspect(&node);
    // Ping both ways (request + reply each) and a TCP handshake, data and close: every one
    // of these packets is redirected by from_pod, none goes through the node's stack.
    let redirected = reason(&after, "redirect_pod") - reason(&before, "redirect_pod");
    assert!(
        redirected >= 8,
        "redirect_pod grew by {redirected}, expected ≥ 8 (2 pings both ways + TCP): {:#}",
        after["reasons"]
    );
    for (ip, name) in [(&ipa, "a"), (&ipb, "b")] {
        let (b0, a0) = (
            endpoint(&before, ip).map_or(0, |e| num(e, "rx_packets")),
            endpoint(&after, ip).map_or(0, |e| num(e, "rx_packets")),
        );
        assert!(
            a0 >= b0 + 4,
            "pod {name} ({ip}): rx_packets (redirected into it) went {b0} → {a0}, expected ≥ +4: {after:#}"
        );
        let tx = endpoint(&after, ip).map_or(0, |e| num(e, "tx_packets"));
        assert!(tx >= 4, "pod {name} ({ip}): tx_packets {tx}: {after:#}");
    }
    for ip in [&ipa, &ipb] {
        let nat = nat_mentioning(&after, ip);
        assert!(nat.is_empty(), "pod ↔ pod must not be translated: {nat:#?}");
    }
    drop(srv);
    del(&node, &a, &conf);
    del(&node, &b, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pod_to_ext_is_masqueraded_to_the_node_address_for_tcp_udp_and_icmp() {
    let node = SimNode::new("dp_masq");
    let conf = masq_conf(&node);
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    let doc = inspect(&node);
    assert_eq!(doc["node"]["ip_masq"], true, "{doc:#}");
    assert_eq!(doc["node"]["node_addr"], NODE_IP4, "{doc:#}");
    let (lo, hi) = snat_range(&doc);

    // TCP: ext's server sees the node, on a port of the SNAT range.
    let tcp = TaggedServer::start(node.ext_netns(), 8080, "ext", Mode::Greet);
    let answer = greet(a.netns(), &format!("{EXT_IP4}:8080"))
        .unwrap_or_else(|e| panic!("TCP pod → ext: {e}"));
    assert_masqueraded(&answer, (lo, hi), "TCP pod → ext");

    // UDP: likewise, and the answer comes back from ext's own address and port.
    let udp = WhoAmIServer::start(node.ext_netns(), 8081);
    let (answer, from) = udp_exchange(a.netns(), &format!("{EXT_IP4}:8081"), b"who")
        .unwrap_or_else(|e| panic!("UDP pod → ext: {e}"));
    assert_masqueraded(&answer, (lo, hi), "UDP pod → ext");
    assert_eq!(
        from.to_string(),
        format!("{EXT_IP4}:8081"),
        "reply source as the pod sees it"
    );

    // An ICMP error about a masqueraded flow (port unreachable from ext) is translated
    // back and reaches the pod's socket.
    let before_err = reason(&inspect(&node), "icmp_error_translated");
    let refused = udp_error(a.netns(), &format!("{EXT_IP4}:9"));
    assert!(
        matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "UDP to a closed port of ext: the port-unreachable error must reach the pod: {refused:?}"
    );
    let grew = reason(&inspect(&node), "icmp_error_translated") - before_err;
    assert!(grew >= 1, "icmp_error_translated grew by {grew}");

    // ICMP echo: every request arriving in ext comes from the node (ext has no route to
    // the pods, so an untranslated reply could not come back either).
    let sniffer = IcmpSniffer::start(node.ext_netns());
    assert_ping(a.netns(), EXT_IP4);
    let seen = sniffer.take();
    let requests: Vec<_> = seen.iter().filter(|(_, t)| *t == 8).collect();
    assert!(!requests.is_empty(), "ext saw no echo request: {seen:?}");
    assert!(
        requests.iter().all(|(src, _)| src.to_string() == NODE_IP4),
        "every echo request must come from {NODE_IP4}, pod is {ip}: {seen:?}"
    );

    let doc = inspect(&node);
    for proto in ["tcp", "udp", "icmp"] {
        let snat: Vec<&Value> = list(&doc, "nat")
            .iter()
            .filter(|n| n["kind"] == "snat" && n["protocol"] == proto && n["src"] == ip.as_str())
            .collect();
        assert!(
            snat.iter()
                .any(|n| n["new_src"] == NODE_IP4 && n["dst"] == EXT_IP4),
            "no {proto} SNAT entry {ip} → {EXT_IP4} rewritten to {NODE_IP4}: {:#}",
            doc["nat"]
        );
    }
    for r in ["snat_new", "snat_reply"] {
        assert!(
            reason(&doc, r) >= 3,
            "{r} = {}, expected ≥ 3 (one per protocol): {:#}",
            reason(&doc, r),
            doc["reasons"]
        );
    }
    assert!(
        tcp.peers()
            .iter()
            .all(|p| p.ip().to_canonical().to_string() == NODE_IP4),
        "{:?}",
        tcp.peers()
    );
    drop((tcp, udp));
    del(&node, &a, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cluster_and_node_destinations_are_not_masqueraded() {
    let node = SimNode::new("dp_nomasq");
    let conf = masq_conf(&node);
    // Another node's pod, simulated in ext: an address of the clusterCIDR, routed there
    // by the node's default route, and a route back to this node's pods.
    let remote_pod = "10.244.2.5";
    node.ext_exec(&[
        "ip",
        "addr",
        "add",
        &format!("{remote_pod}/32"),
        "dev",
        "eth0",
    ])
    .ok();
    node.ext_exec(&["ip", "route", "add", "10.244.1.0/24", "via", NODE_IP4])
        .ok();
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    let before = inspect(&node);

    let ext = TaggedServer::start(node.ext_netns(), 8080, "ext", Mode::Greet);
    let answer = greet(a.netns(), &format!("{remote_pod}:8080"))
        .unwrap_or_else(|e| panic!("TCP pod → clusterCIDR {remote_pod}: {e}"));
    assert_seen_as(
        &answer,
        &ip,
        "a clusterCIDR destination must see the pod address",
    );
    let ext_udp = WhoAmIServer::start(node.ext_netns(), 8081);
    // (The answer's source is whatever ext's wildcard-bound socket picks: not ours.)
    let (answer, _) = udp_exchange(a.netns(), &format!("{remote_pod}:8081"), b"x")
        .unwrap_or_else(|e| panic!("UDP pod → clusterCIDR {remote_pod}: {e}"));
    assert_seen_as(&answer, &ip, format_args!("UDP to {remote_pod}"));

    let node_srv = TaggedServer::start(node.netns(), 8090, "node", Mode::Greet);
    for dst in [NODE_IP4, GW4] {
        let answer = greet(a.netns(), &format!("{dst}:8090"))
            .unwrap_or_else(|e| panic!("TCP pod → node {dst}: {e}"));
        assert_seen_as(
            &answer,
            &ip,
            format_args!("the node ({dst}) must see the pod address"),
        );
    }
    let udp = WhoAmIServer::start(node.netns(), 8091);
    let (answer, _) = udp_exchange(a.netns(), &format!("{NODE_IP4}:8091"), b"x")
        .unwrap_or_else(|e| panic!("UDP pod → node: {e}"));
    assert_seen_as(&answer, &ip, "UDP to the node");

    let after = inspect(&node);
    assert_eq!(
        reason(&after, "snat_new"),
        reason(&before, "snat_new"),
        "nothing may have been masqueraded: {:#}",
        after["reasons"]
    );
    let nat = nat_mentioning(&after, &ip);
    assert!(nat.is_empty(), "no NAT entry may involve the pod: {nat:#?}");
    drop((ext, ext_udp, node_srv, udp));
    del(&node, &a, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ext_reaches_a_pod_through_a_host_port_with_its_own_address() {
    let node = SimNode::new("dp_hostport");
    let conf = with_ports(&masq_conf(&node), &tcp_udp(8080, 80, None));
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    let _srv = WhoAmIServer::start(a.netns(), 80);
    let before = inspect(&node);
    let pms = list(&before, "portMappings");
    assert_eq!(pms.len(), 2, "a TCP and a UDP host port: {pms:#?}");
    for pm in pms {
        assert_eq!(pm["host_port"], 8080, "{pm}");
        assert_eq!(pm["pod_ip"], ip.as_str(), "{pm}");
        assert_eq!(pm["container_port"], 80, "{pm}");
        assert!(pm["host_ip"].is_null(), "no hostIP: {pm}");
    }

    let answer = tcp_request(node.ext_netns(), &format!("{NODE_IP4}:8080"), b"hello", T)
        .unwrap_or_else(|e| panic!("TCP ext → {NODE_IP4}:8080: {e}"));
    // The handshake completing proves the replies came back from node:hostPort.
    assert_seen_as(&answer, EXT_IP4, "the pod must see the client's address");
    assert!(answer.ends_with("hello"), "payload echoed: {answer:?}");

    let (answer, from) = udp_exchange(node.ext_netns(), &format!("{NODE_IP4}:8080"), b"hi")
        .unwrap_or_else(|e| panic!("UDP ext → {NODE_IP4}:8080: {e}"));
    assert_seen_as(&answer, EXT_IP4, "the pod must see the client's address");
    assert_eq!(
        from.to_string(),
        format!("{NODE_IP4}:8080"),
        "the UDP reply must come from node:hostPort"
    );

    let after = inspect(&node);
    for r in ["dnat_new", "dnat_reply"] {
        let grew = reason(&after, r) - reason(&before, r);
        assert!(grew >= 2, "{r} grew by {grew}: {:#}", after["reasons"]);
    }
    let dnat: Vec<_> = list(&after, "nat")
        .iter()
        .filter(|n| n["kind"] == "dnat" && n["src"] == EXT_IP4)
        .collect();
    assert!(
        dnat.iter().all(|n| n["new_dst"] == ip.as_str()
            && n["new_dport"] == 80
            && n["new_src"] == EXT_IP4),
        "DNAT keeps the client and targets the pod: {dnat:#?}"
    );
    assert!(
        dnat.len() >= 2,
        "TCP and UDP DNAT entries: {:#}",
        after["nat"]
    );
    del(&node, &a, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_host_port_on_a_host_ip_answers_only_there() {
    let node = SimNode::new("dp_hostip");
    let host_ip = "198.18.0.11";
    // A second node address on the uplink, there before the ADD that maps it.
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{host_ip}/24"),
        "dev",
        testbed::UPLINK,
    ])
    .ok();
    let conf = with_ports(&masq_conf(&node), &tcp_udp(9090, 80, Some(host_ip)));
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    let _srv = WhoAmIServer::start(a.netns(), 80);
    let doc = inspect(&node);
    let pms = list(&doc, "portMappings");
    assert!(
        pms.len() == 2
            && pms
                .iter()
                .all(|p| p["host_ip"] == host_ip && p["pod_ip"] == ip.as_str()),
        "two mappings on {host_ip}: {pms:#?}"
    );

    let answer = tcp_request(node.ext_netns(), &format!("{host_ip}:9090"), b"hello", T)
        .unwrap_or_else(|e| panic!("TCP ext → {host_ip}:9090: {e}"));
    assert_seen_as(&answer, EXT_IP4, format_args!("TCP ext → {host_ip}:9090"));
    let (answer, from) = udp_exchange(node.ext_netns(), &format!("{host_ip}:9090"), b"hi")
        .unwrap_or_else(|e| panic!("UDP ext → {host_ip}:9090: {e}"));
    assert_seen_as(&answer, EXT_IP4, format_args!("UDP ext → {host_ip}:9090"));
    assert_eq!(
        from.to_string(),
        format!("{host_ip}:9090"),
        "the reply must come from hostIP:hostPort"
    );

    // The node's other address does not have this host port.
    let other = tcp_request(node.ext_netns(), &format!("{NODE_IP4}:9090"), b"x", T);
    assert!(
        other.is_err(),
        "{NODE_IP4}:9090 must not be mapped (hostIP is {host_ip}): {other:?}"
    );
    let other = udp_exchange(node.ext_netns(), &format!("{NODE_IP4}:9090"), b"x");
    assert!(other.is_err(), "UDP {NODE_IP4}:9090 answered: {other:?}");
    del(&node, &a, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_reach_host_ports_of_their_own_node_including_their_own() {
    let node = SimNode::new("dp_hairpin");
    let base = masq_conf(&node);
    let (a, b) = (node.pod("a"), node.pod("b"));
    let ipa = pod_ip(&add(&node, &a, &base));
    let ipb = pod_ip(&add(
        &node,
        &b,
        &with_ports(&base, &tcp_udp(8080, 80, None)),
    ));
    let _srv = WhoAmIServer::start(b.netns(), 80);
    let before = inspect(&node);

    // Pod a → node:hostPort → pod b: b sees a (the client's address is kept).
    for dst in [NODE_IP4, GW4] {
        let answer = tcp_request(a.netns(), &format!("{dst}:8080"), b"hello", T)
            .unwrap_or_else(|e| panic!("TCP pod a → {dst}:8080 (hairpin to b): {e}"));
        assert_seen_as(
            &answer,
            &ipa,
            format_args!("pod b must see pod a through {dst}:8080"),
        );
    }
    let (answer, from) = udp_exchange(a.netns(), &format!("{NODE_IP4}:8080"), b"hi")
        .unwrap_or_else(|e| panic!("UDP pod a → {NODE_IP4}:8080: {e}"));
    assert_seen_as(&answer, &ipa, "UDP pod a → node:hostPort");
    assert_eq!(
        from.to_string(),
        format!("{NODE_IP4}:8080"),
        "the reply must come from node:hostPort"
    );

    // Pod b → its own host port: it arrives from the node (a pod would drop a packet
    // carrying its own address as source), and the reply comes from node:hostPort.
    let answer = tcp_request(b.netns(), &format!("{NODE_IP4}:8080"), b"self", T)
        .unwrap_or_else(|e| panic!("TCP pod b → its own host port {NODE_IP4}:8080: {e}"));
    assert_seen_as(&answer, NODE_IP4, "pod b reaching itself sees the node");
    let (answer, from) = udp_exchange(b.netns(), &format!("{NODE_IP4}:8080"), b"self")
        .unwrap_or_else(|e| panic!("UDP pod b → its own host port: {e}"));
    assert_seen_as(&answer, NODE_IP4, "UDP pod b → its own host port");
    assert_eq!(from.to_string(), format!("{NODE_IP4}:8080"));
    assert_ne!(ipa, ipb);

    let after = inspect(&node);
    let grew = reason(&after, "hairpin_new") - reason(&before, "hairpin_new");
    assert!(
        grew >= 5,
        "hairpin_new grew by {grew}, expected ≥ 5 (3 TCP + 2 UDP flows): {:#}",
        after["reasons"]
    );
    del(&node, &a, &base);
    del(&node, &b, &base);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn traffic_leaving_through_the_uplink_skips_the_kernel_forwarding_path() {
    let node = SimNode::new("dp_fast");
    let conf = masq_conf(&node);
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    // The first packet resolves the uplink's next hop through the kernel.
    assert_ping(a.netns(), EXT_IP4);

    let (before, fwd_before) = (inspect(&node), forwarded_datagrams(&node, Family::V4));
    let srv = TaggedServer::start(node.ext_netns(), 8080, "ext", Mode::Greet);
    for i in 0..20 {
        let answer = greet(a.netns(), &format!("{EXT_IP4}:8080"))
            .unwrap_or_else(|e| panic!("TCP pod → ext #{i}: {e}"));
        assert_seen_as(&answer, NODE_IP4, "still masqueraded");
    }
    assert_ping(a.netns(), EXT_IP4);
    let (after, fwd_after) = (inspect(&node), forwarded_datagrams(&node, Family::V4));
    let fast = reason(&after, "redirect_uplink") - reason(&before, "redirect_uplink");
    // Per connection at least SYN, ACK and FIN leave the pod; plus the echo requests.
    assert!(
        fast >= 60,
        "redirect_uplink grew by {fast}, expected ≥ 60: {:#}",
        after["reasons"]
    );
    // Each flow's first packet (the SYN, the first echo request) goes through the node's
    // stack so that netfilter sees it; everything after it bypasses the kernel's
    // forwarding: 20 connections + 1 ping flow, and a little slack for retransmissions.
    let flows = 20 + 1;
    assert!(
        fwd_after - fwd_before <= flows + 2,
        "the node's kernel forwarded {} packets for {flows} flows; after its first packet \
         pod → ext must bypass it",
        fwd_after - fwd_before
    );
    let first = reason(&after, "pass_unverified_flow") - reason(&before, "pass_unverified_flow");
    assert!(
        first >= flows && first <= flows + 2,
        "pass_unverified_flow grew by {first}, expected one per flow ({flows}): {:#}",
        after["reasons"]
    );
    drop(srv);

    // A source address that is not the pod's own is dropped at the pod's veth:
    // nothing leaves, the reason is counted.
    let spoofed = "10.244.1.250";
    let out = a.exec(&["ip", "addr", "add", &format!("{spoofed}/32"), "dev", "eth0"]);
    assert!(out.status.success(), "{out:?}");
    let before = inspect(&node);
    let fwd_before = forwarded_datagrams(&node, Family::V4);
    let sock = testbed::net::in_netns(a.netns(), move || {
        let s = std::net::UdpSocket::bind((spoofed, 0))?;
        s.send_to(b"x", (EXT_IP4, 9))
    });
    assert!(sock.is_ok(), "sending from {spoofed}: {sock:?}");
    let dropped = wait_until(std::time::Duration::from_secs(2), || {
        reason(&inspect(&node), "drop_spoofed_source") > reason(&before, "drop_spoofed_source")
    });
    assert!(
        dropped,
        "a packet from {spoofed} (pod is {ip}) was not dropped as spoofed"
    );
    assert_eq!(
        forwarded_datagrams(&node, Family::V4),
        fwd_before,
        "a spoofed packet was forwarded by the node"
    );
    let out = a.exec(&["ip", "addr", "del", &format!("{spoofed}/32"), "dev", "eth0"]);
    assert!(out.status.success(), "{out:?}");

    // Too big for the uplink: the kernel gets the packet and tells the pod the path MTU
    // (a blind redirect would never), after which the upload completes on the fast path.
    let out = node.exec(&["ip", "link", "set", "dev", testbed::UPLINK, "mtu", "1400"]);
    assert!(out.status.success(), "{out:?}");
    let sent = 256 * 1024;
    assert_eq!(
        upload(&node, a.netns(), &format!("{EXT_IP4}:8082"), sent),
        sent
    );
    let route = a.exec(&["ip", "-4", "route", "get", EXT_IP4]);
    let route = route.stdout.clone();
    assert!(
        route.contains("mtu 1400"),
        "the pod must have learned the uplink's MTU 1400: {route}"
    );
    del(&node, &a, &conf);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn node_addresses_are_relisted_for_an_unknown_host_ip_and_every_ten_seconds() {
    let node = SimNode::new("dp_addrs");
    // A node interface that is neither the uplink nor a pod's.
    let out = node.exec(&[
        "ip", "link", "add", "side0", "type", "veth", "peer", "name", "side1",
    ]);
    assert!(out.status.success(), "{out:?}");
    let conf = masq_conf(&node);
    let a = node.pod("a");
    add(&node, &a, &conf);
    assert!(known_node_addrs(&node).contains(&NODE_IP4.to_owned()));

    // Added right after that ADD: the next ADD lists the uplink's addresses only...
    for addr in ["192.0.2.7/32", "192.0.2.8/32"] {
        let out = node.exec(&["ip", "addr", "add", addr, "dev", "side0"]);
        assert!(out.status.success(), "{out:?}");
    }
    let b = node.pod("b");
    add(&node, &b, &conf);
    let known = known_node_addrs(&node);
    assert!(
        !known.contains(&"192.0.2.8".to_owned()),
        "listed again within 10 s: {known:?}"
    );
    // ...unless a hostIP is not known yet: then every address is listed at once.
    let c = node.pod("c");
    let host_ip_conf = with_ports(&conf, &tcp_udp(9191, 80, Some("192.0.2.7")));
    add(&node, &c, &host_ip_conf);
    let known = known_node_addrs(&node);
    for want in ["192.0.2.7", "192.0.2.8", NODE_IP4] {
        assert!(
            known.contains(&want.to_owned()),
            "{want} missing: {known:?}"
        );
    }

    // A removed address goes at the first ADD 10 s after the last full listing.
    let out = node.exec(&["ip", "addr", "del", "192.0.2.8/32", "dev", "side0"]);
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(std::time::Duration::from_secs(11));
    let d = node.pod("d");
    add(&node, &d, &conf);
    let known = known_node_addrs(&node);
    assert!(
        !known.contains(&"192.0.2.8".to_owned()) && known.contains(&"192.0.2.7".to_owned()),
        "after 10 s the listing is complete again: {known:?}"
    );
    for (p, cf) in [(&a, &conf), (&b, &conf), (&c, &host_ip_conf), (&d, &conf)] {
        del(&node, p, cf);
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn only_an_allow_listed_pod_may_send_from_a_foreign_prefix() {
    let node = SimNode::new("dp_allow");
    let base = masq_conf(&node);
    // Pod r routes 192.0.2.0/24 (a VPN or router pod): its attachment allows it.
    let router_conf = base.clone().set(
        "runtimeConfig",
        serde_json::json!({ "allowedSourceCIDRs": ["192.0.2.0/24"] }),
    );
    let (r, p) = (node.pod("r"), node.pod("p"));
    let rr = add(&node, &r, &router_conf);
    let rp = add(&node, &p, &base);
    let r_ip = pod_ip(&rr);
    // The outside and the node route the prefix back to pod r, as a router pod's
    // operator would set up.
    for (ns_exec, via) in [(true, NODE_IP4.to_owned()), (false, r_ip.clone())] {
        let argv = ["ip", "route", "add", "192.0.2.0/24", "via", &via];
        let out = if ns_exec {
            node.ext_exec(&argv)
        } else {
            node.exec(&argv)
        };
        assert!(out.status.success(), "{argv:?}: {out:?}");
    }
    let srv = TaggedServer::start(node.ext_netns(), 8086, "ext", Mode::Greet);
    for (pod, who) in [(&r, "r"), (&p, "p")] {
        let out = pod.exec(&["ip", "addr", "add", "192.0.2.7/32", "dev", "eth0"]);
        assert!(out.status.success(), "pod {who}: {out:?}");
    }
    let from = |ns: &std::path::Path| {
        testbed::net::in_netns(ns, move || -> std::io::Result<String> {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.bind(
                &"192.0.2.7:0"
                    .parse::<std::net::SocketAddr>()
                    .map_err(std::io::Error::other)?
                    .into(),
            )?;
            let to: std::net::SocketAddr = format!("{EXT_IP4}:8086")
                .parse()
                .map_err(std::io::Error::other)?;
            s.connect_timeout(&to.into(), T)?;
            let s: std::net::TcpStream = s.into();
            s.set_read_timeout(Some(T))?;
            testbed::datapath::read_line(&s)
        })
    };
    let answer = from(r.netns()).unwrap_or_else(|e| panic!("pod r from 192.0.2.7: {e}"));
    assert_seen_as(
        &answer,
        "192.0.2.7",
        "an allow-listed source leaves as itself (it is not the pod's address: never masqueraded)",
    );
    let before = inspect(&node);
    let refused = from(p.netns());
    assert!(
        refused.is_err(),
        "pod p without an allow-list got through: {refused:?}"
    );
    let after = inspect(&node);
    assert!(
        reason(&after, "drop_spoofed_source") > reason(&before, "drop_spoofed_source"),
        "{:#}",
        after["reasons"]
    );
    drop(srv);
    let _ = rp;
    del(&node, &p, &base);
    del(&node, &r, &router_conf);
}

/// Panics unless `answer` says the server saw the node's address, on a port of the SNAT
/// range `(lo, hi)`.
#[track_caller]
fn assert_masqueraded(answer: &str, (lo, hi): (u64, u64), what: &str) {
    assert_seen_as(
        answer,
        NODE_IP4,
        format_args!("{what}: ext must see the node address"),
    );
    let peer = seen_peer(answer);
    assert!(
        (lo..=hi).contains(&port_of(&peer)),
        "{what}: SNAT port of {peer} outside the range {lo}-{hi}"
    );
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
    let out = node.exec(&["ip", "link", "set", "dev", testbed::UPLINK, "mtu", "1400"]);
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
