//! End to end: ownership of host ports. A host port held by one container cannot
//! be taken by another (ADD fails naming the owner and leaves nothing behind); DEL frees
//! it; a new pod on the same host port gets new connections, and a flow of the old pod
//! never reaches it.

use std::{io::Write, time::Duration};

use serde_json::{json, Value};
use testbed::datapath::{
    add, assert_seen_as, connect, greet, inspect, ip_of, list, masq_conf, nat_mentioning, pin_set,
    pod_ip, read_line, reason, seen_peer, wait_until, with_ports, Mode, TaggedServer,
};
use testbed::{Pod, SimNode, EXT_IP4, NODE_IP4};

/// Host veths in the node whose alias names `pod`.
fn veths_of(node: &SimNode, pod: &Pod) -> Vec<String> {
    let links = testbed::ip_json(node.netns(), &["link", "show"]);
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            l["ifalias"]
                .as_str()
                .is_some_and(|a| a.contains(pod.container_id()))
        })
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

/// Store files (relative paths) that mention `needle` in their name or content.
fn store_mentions(node: &SimNode, needle: &str) -> Vec<String> {
    node.store_files()
        .into_iter()
        .filter(|p| {
            let full = node.data_dir().join(p);
            p.to_string_lossy().contains(needle)
                || std::fs::read_to_string(&full).is_ok_and(|s| s.contains(needle))
        })
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_taken_host_port_fails_add_and_del_hands_it_to_the_next_pod() {
    let node = SimNode::new("dp_hp_owner");
    let base = masq_conf(&node);
    let mapping = json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }]);
    let conf = with_ports(&base, &mapping);
    let (p1, p2) = (node.pod("one"), node.pod("two"));
    let r1 = add(&node, &p1, &conf);
    let ip1 = pod_ip(&r1);
    let srv1 = TaggedServer::start(p1.netns(), 80, "one", Mode::Echo);
    let pins_before = pin_set(&node);
    let mappings_before = list(&inspect(&node), "portMappings").to_vec();

    // The same host port for another container: wildcard, and on the node's address.
    for (what, m) in [
        ("the same hostPort", mapping.clone()),
        (
            "the same hostPort on hostIP",
            json!([{ "hostPort": 8080, "containerPort": 81, "protocol": "tcp", "hostIP": NODE_IP4 }]),
        ),
    ] {
        let out = node.exec_plugin("ADD", &p2.env("eth0"), &with_ports(&base, &m).plugin());
        let e = out.assert_error(103);
        let text = format!("{} {}", e.msg, e.details);
        assert!(
            text.contains(p1.container_id()) && text.contains("8080"),
            "{what}: the error must name the port and its owner {}: {e:?}",
            p1.container_id()
        );
        // Nothing of pod two stays behind.
        assert!(
            veths_of(&node, &p2).is_empty(),
            "{what}: host veth left: {:?}",
            veths_of(&node, &p2)
        );
        let links = testbed::ip_json(p2.netns(), &["link", "show"]);
        let names: Vec<&str> = links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str())
            .collect();
        assert_eq!(names, ["lo"], "{what}: pod two's namespace keeps links");
        let left = store_mentions(&node, p2.container_id());
        assert!(left.is_empty(), "{what}: IPAM kept {left:?}");
        let doc = inspect(&node);
        let eps: Vec<&Value> = list(&doc, "endpoints").iter().collect();
        assert!(
            eps.len() == 1 && eps[0]["container_id"] == p1.container_id(),
            "{what}: only pod one's endpoint may exist: {eps:#?}"
        );
        assert_eq!(
            list(&doc, "portMappings"),
            mappings_before.as_slice(),
            "{what}: the host ports must be unchanged"
        );
        assert_eq!(pin_set(&node), pins_before, "{what}: pins changed");
    }

    // The same port number over UDP is another host port.
    let udp = json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "udp" }]);
    add(&node, &p2, &with_ports(&base, &udp));
    testbed::datapath::del(&node, &p2, &with_ports(&base, &udp));

    // A long-lived flow ext → node:8080 → pod one.
    let old = connect(node.ext_netns(), &format!("{NODE_IP4}:8080"))
        .unwrap_or_else(|e| panic!("ext → {NODE_IP4}:8080 (pod one): {e}"));
    let hello = read_line(&old).unwrap_or_default();
    assert_eq!(
        hello.split(' ').next(),
        Some("one"),
        "greeting of pod one: {hello:?}"
    );
    assert_eq!(ip_of(&seen_peer(&hello)), EXT_IP4, "{hello:?}");

    // DEL frees the host port (and the flow's NAT state).
    testbed::datapath::del(&node, &p1, &conf);
    let doc = inspect(&node);
    assert!(
        list(&doc, "portMappings").is_empty(),
        "DEL must remove the host port: {:#}",
        doc["portMappings"]
    );
    let nat = nat_mentioning(&doc, &ip1);
    assert!(nat.is_empty(), "NAT state of pod one left: {nat:#?}");

    // A new pod on the same host port gets new connections.
    let p3 = node.pod("three");
    let ip3 = pod_ip(&add(&node, &p3, &conf));
    let srv3 = TaggedServer::start(p3.netns(), 80, "three", Mode::Echo);
    let doc = inspect(&node);
    let pms = list(&doc, "portMappings");
    assert!(
        pms.len() == 1
            && pms[0]["container_id"] == p3.container_id()
            && pms[0]["pod_ip"] == ip3.as_str(),
        "the host port must now be pod three's: {pms:#?}"
    );
    let answer = greet(node.ext_netns(), &format!("{NODE_IP4}:8080"))
        .unwrap_or_else(|e| panic!("ext → {NODE_IP4}:8080 (pod three): {e}"));
    assert_eq!(
        answer.split(' ').next(),
        Some("three"),
        "a new connection must reach pod three: {answer:?}"
    );
    assert_seen_as(&answer, EXT_IP4, "pod three must see the client's address");

    // The old flow goes on talking: none of it may reach pod three.
    let stale_before = reason(&inspect(&node), "pass_stale_hostport_flow");
    let mut old_w = &old;
    let _ = old_w.write_all(b"late data of the old flow\n");
    let grew = wait_until(Duration::from_secs(3), || {
        reason(&inspect(&node), "pass_stale_hostport_flow") > stale_before
    });
    assert!(
        grew,
        "the old flow's packet should be passed as stale (pass_stale_hostport_flow)"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        srv3.accepted(),
        1,
        "pod three accepted something besides the new connection: {:?}",
        srv3.peers()
    );
    assert!(
        srv3.received().is_empty(),
        "old-flow data reached pod three: {:?}",
        srv3.received()
    );
    assert!(
        srv1.received().is_empty(),
        "old-flow data reached pod one after its DEL: {:?}",
        srv1.received()
    );
    drop(old);
    drop((srv1, srv3));
    testbed::datapath::del(&node, &p3, &conf);
    assert!(
        list(&inspect(&node), "portMappings").is_empty(),
        "host ports left after the last DEL"
    );
}
