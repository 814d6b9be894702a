//! End to end: what the datapath leaves behind. DEL of a pod that carried
//! traffic (masquerade, host ports, hairpin, pod ↔ pod) removes every map entry, NAT
//! entry, link and pin of that pod and nothing of the others; after the last DEL only the
//! network's programs, maps and uplink links remain. And no iptables or nftables rule is
//! ever created: the node's rulesets are the same before, during and after.

use std::collections::BTreeSet;

use serde_json::Value;
use testbed::datapath::{
    add, contains_bytes, del, delete_map_key, dump_map, endpoint, greet, host_veth, inspect, list,
    masq_conf, nat_mentioning, pin_set, pod_ip, rulesets, tcp_udp, udp_exchange, with_ports, Mode,
    TaggedServer, GW4, T,
};
use testbed::{
    assert_ping, tcp_request, ConfBuilder, Pod, SimNode, WhoAmIServer, EXT_IP4, NODE_IP4,
};

/// Pods `a` (no host port) and `b` (8080 → 80 TCP and UDP, serving), after traffic of
/// every kind the datapath translates or redirects.
struct Cycle {
    conf: ConfBuilder,
    b_conf: ConfBuilder,
    a: Pod,
    b: Pod,
    ra: Value,
    rb: Value,
}

fn run_traffic(node: &SimNode) -> Cycle {
    let conf = masq_conf(node);
    let b_conf = with_ports(&conf, &tcp_udp(8080, 80, None));
    let (a, b) = (node.pod("a"), node.pod("b"));
    let ra = add(node, &a, &conf);
    let rb = add(node, &b, &b_conf);
    let (ipa, ipb) = (pod_ip(&ra), pod_ip(&rb));
    let _b_srv = WhoAmIServer::start(b.netns(), 80);
    let _ext_tcp = TaggedServer::start(node.ext_netns(), 7000, "ext", Mode::Greet);
    let _ext_udp = WhoAmIServer::start(node.ext_netns(), 7001);
    let must =
        |what: &str, r: Result<String, std::io::Error>| r.unwrap_or_else(|e| panic!("{what}: {e}"));
    for p in [&a, &b] {
        assert_ping(p.netns(), EXT_IP4);
        must(
            "TCP pod → ext",
            greet(p.netns(), &format!("{EXT_IP4}:7000")),
        );
        must(
            "UDP pod → ext",
            udp_exchange(p.netns(), &format!("{EXT_IP4}:7001"), b"x").map(|(s, _)| s),
        );
        must(
            "TCP pod → hostPort (hairpin)",
            tcp_request(p.netns(), &format!("{NODE_IP4}:8080"), b"x", T),
        );
        must(
            "UDP pod → hostPort (hairpin)",
            udp_exchange(p.netns(), &format!("{NODE_IP4}:8080"), b"x").map(|(s, _)| s),
        );
    }
    must(
        "TCP ext → hostPort",
        tcp_request(node.ext_netns(), &format!("{NODE_IP4}:8080"), b"x", T),
    );
    must(
        "UDP ext → hostPort",
        udp_exchange(node.ext_netns(), &format!("{NODE_IP4}:8080"), b"x").map(|(s, _)| s),
    );
    must(
        "TCP pod a → pod b",
        tcp_request(a.netns(), &format!("{ipb}:80"), b"x", T),
    );
    assert_ping(a.netns(), &ipb);
    assert_ping(b.netns(), &ipa);
    assert_ping(a.netns(), GW4);
    let doc = inspect(node);
    for ip in [&ipa, &ipb] {
        assert!(
            !nat_mentioning(&doc, ip).is_empty(),
            "the traffic should have left NAT state for {ip}: {:#}",
            doc["nat"]
        );
    }
    Cycle {
        conf,
        b_conf,
        a,
        b,
        ra,
        rb,
    }
}

/// How many of our clsact filters (priority 1, a bpf program, handle 0xcb0f on a host
/// veth or 0xcb0f_xxxx, per network, on the uplink) `dev` has on `hook`.
fn our_filters(node: &SimNode, dev: &str, hook: &str) -> usize {
    let out = node
        .exec(&["tc", "-j", "filter", "show", "dev", dev, hook])
        .stdout;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["kind"] == "bpf"
                && f["pref"] == 1
                && f["options"]["handle"]
                    .as_str()
                    .is_some_and(|h| h.starts_with("0xcb0f"))
        })
        .count()
}

fn ifindex(node: &SimNode, dev: &str) -> u32 {
    let links = testbed::ip_json(node.netns(), &["link", "show", "dev", dev]);
    links[0]["ifindex"]
        .as_u64()
        .and_then(|i| u32::try_from(i).ok())
        .unwrap_or_else(|| panic!("no ifindex for {dev}: {links}"))
}

fn link_names(node: &SimNode) -> BTreeSet<String> {
    testbed::ip_json(node.netns(), &["link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

fn octets(ip: &str) -> Vec<u8> {
    ip.parse::<std::net::Ipv4Addr>()
        .map(|a| a.octets().to_vec())
        .unwrap_or_else(|e| panic!("{ip}: {e}"))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn del_leaves_no_map_entry_link_or_pin_of_the_pod() {
    let node = SimNode::new("dp_del_clean");
    let node_before = node.snapshot();
    let c = run_traffic(&node);
    let (ipa, ipb) = (pod_ip(&c.ra), pod_ip(&c.rb));
    let (host_a, host_b) = (host_veth(&c.ra), host_veth(&c.rb));
    let (idx_a, idx_b) = (ifindex(&node, &host_a), ifindex(&node, &host_b));
    let loaded = pin_set(&node);
    for h in [&host_a, &host_b] {
        assert_eq!(
            our_filters(&node, h, "ingress"),
            1,
            "ADD should attach from_pod to {h} as a clsact filter (attach: tc)"
        );
    }

    del(&node, &c.b, &c.b_conf);
    // Idempotent: a second DEL changes nothing and succeeds.
    del(&node, &c.b, &c.b_conf);

    let doc = inspect(&node);
    assert!(
        endpoint(&doc, &ipb).is_none(),
        "b's endpoint entry survived DEL: {:#}",
        doc["endpoints"]
    );
    assert!(
        endpoint(&doc, &ipa).is_some(),
        "a's endpoint entry must stay: {:#}",
        doc["endpoints"]
    );
    assert!(
        list(&doc, "portMappings").is_empty(),
        "b's host ports survived DEL: {:#}",
        doc["portMappings"]
    );
    let nat = nat_mentioning(&doc, &ipb);
    assert!(nat.is_empty(), "NAT entries of b survived DEL: {nat:#?}");
    let eps = dump_map(&node, "ENDPOINTS");
    assert!(
        eps.iter().all(|(k, _)| *k != octets(&ipb)),
        "ENDPOINTS still has {ipb}"
    );
    let owners = dump_map(&node, "OWNERS");
    assert!(
        !owners
            .iter()
            .any(|(_, v)| contains_bytes(v, c.b.container_id().as_bytes())),
        "OWNERS still names {}",
        c.b.container_id()
    );
    assert!(
        owners
            .iter()
            .any(|(_, v)| contains_bytes(v, c.a.container_id().as_bytes())),
        "OWNERS lost a ({})",
        c.a.container_id()
    );
    let stats: Vec<Vec<u8>> = dump_map(&node, "EP_STATS")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(
        !stats.contains(&idx_b.to_ne_bytes().to_vec()),
        "EP_STATS still counts b's host veth (ifindex {idx_b})"
    );
    assert!(
        stats.contains(&idx_a.to_ne_bytes().to_vec()),
        "EP_STATS lost a's counters"
    );
    assert!(
        dump_map(&node, "PORTMAPS").is_empty(),
        "PORTMAPS not empty after DEL of the only host-port owner"
    );
    let links = link_names(&node);
    assert!(
        !links.contains(&host_b),
        "host veth {host_b} survived DEL: {links:?}"
    );
    assert!(links.contains(&host_a), "a's host veth vanished: {links:?}");
    let routes = node.exec(&["ip", "route", "show"]).stdout;
    assert!(
        !routes.contains(&ipb),
        "node route to {ipb} survived:\n{routes}"
    );
    let pins = pin_set(&node);
    assert_eq!(pins, loaded, "DEL of b must leave the pins as they were");

    // a is untouched.
    assert_ping(c.a.netns(), EXT_IP4);

    del(&node, &c.a, &c.conf);
    let pins = pin_set(&node);
    let mut want = loaded;
    want.retain(|p| !p.starts_with("links/ep-"));
    assert_eq!(
        pins, want,
        "after the last DEL: programs, maps, uplink links"
    );
    let link_pins: Vec<&String> = pins.iter().filter(|p| p.starts_with("links/")).collect();
    assert!(
        link_pins.is_empty(),
        "no tcx link pins with attach: tc: {link_pins:?}"
    );
    for hook in ["ingress", "egress"] {
        assert_eq!(
            our_filters(&node, testbed::UPLINK, hook),
            1,
            "the uplink programs stay attached ({hook})"
        );
    }
    for map in [
        "ENDPOINTS",
        "EP_STATS",
        "PORTMAPS",
        "OWNERS",
        "NAT",
        "SRC_ALLOW",
        "SRC_ALLOW6",
        "NAT_USE",
        "ENDPOINTS6",
        "PORTMAPS6",
        "NAT6",
        "POLICY_ENDPOINTS",
    ] {
        let mut left = dump_map(&node, map);
        // NAT_USE keys 0 and u32::MAX are the IPv4 and IPv6 tables' sweep clocks, not
        // pods' shares.
        left.retain(|(k, _)| {
            !(map == "NAT_USE" && (k.iter().all(|b| *b == 0) || k.iter().all(|b| *b == 0xff)))
        });
        assert!(
            left.is_empty(),
            "{map} keeps {} entries after the last DEL",
            left.len()
        );
    }
    let d = node.snapshot().diff(&node_before);
    assert!(
        d.is_empty(),
        "the node's links, addresses and routes differ from before the first ADD:\n{}",
        d.join("\n")
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn no_iptables_or_nftables_rule_is_ever_created() {
    let node = SimNode::new("dp_rules");
    let before = rulesets(&node);
    let c = run_traffic(&node);
    let during = rulesets(&node);
    assert_eq!(
        during, before,
        "the rulesets changed while pods were attached and carrying traffic"
    );
    del(&node, &c.a, &c.conf);
    del(&node, &c.b, &c.b_conf);
    assert_eq!(
        rulesets(&node),
        before,
        "the rulesets differ after the full ADD/traffic/DEL cycle"
    );
}

/// Flows charged to a pod without a NAT share are orphans: a removal took the pod's
/// entries and share and stopped before its purge without leaving a tombstone (an earlier
/// version dropped the endpoint entries first). GC removes them and nothing else. Here the
/// share of pod `a`, still valid, is deleted by hand to make its flows orphans; `b`'s stay.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn gc_removes_flows_of_pods_that_are_gone_and_keeps_the_others() {
    let node = SimNode::new("dp_orphans");
    let c = run_traffic(&node);
    let ipa = pod_ip(&c.ra);
    let (idx_a, idx_b) = (
        ifindex(&node, &host_veth(&c.ra)),
        ifindex(&node, &host_veth(&c.rb)),
    );
    let charged_to = |doc: &Value, idx: u32| -> Vec<Value> {
        list(doc, "nat")
            .iter()
            .filter(|n| n["pod_ifindex"] == idx)
            .cloned()
            .collect()
    };
    let doc = inspect(&node);
    let before_b = charged_to(&doc, idx_b);
    assert!(
        !before_b.is_empty(),
        "b's traffic should have left flows charged to it"
    );
    assert!(
        list(&doc, "nat").iter().any(|n| n["pod_ifindex"] == idx_a),
        "a's traffic should have left flows charged to it: {:#}",
        doc["nat"]
    );
    delete_map_key(&node, "NAT_USE", &idx_a.to_ne_bytes());

    let valid: Vec<_> = [&c.a, &c.b]
        .iter()
        .map(|p| serde_json::json!({ "containerID": p.container_id(), "ifname": "eth0" }))
        .collect();
    let gc_conf = c
        .conf
        .clone()
        .set("cni.dev/valid-attachments", serde_json::json!(valid));
    node.exec_plugin("GC", &testbed::CniEnv::default(), &gc_conf.plugin())
        .assert_empty_success();

    let doc = inspect(&node);
    let charged_a = charged_to(&doc, idx_a);
    assert!(
        charged_a.is_empty(),
        "flows charged to a's missing share survived GC: {charged_a:#?}"
    );
    let key = |n: &Value| {
        format!(
            "{}{}{}{}{}",
            n["kind"], n["src"], n["sport"], n["dst"], n["dport"]
        )
    };
    let after_b: BTreeSet<String> = charged_to(&doc, idx_b).iter().map(key).collect();
    let before_b: BTreeSet<String> = before_b.iter().map(key).collect();
    assert_eq!(after_b, before_b, "GC touched flows charged to b");
    assert!(endpoint(&doc, &ipa).is_some(), "GC removed valid pod a");
    assert!(
        !node.log().contains("GC: removed 0 NAT"),
        "a count of zero is not logged"
    );
    assert!(
        node.log().contains("NAT entries of pods that are gone"),
        "GC says what it removed: {}",
        node.log()
    );
}
