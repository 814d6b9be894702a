//! `interface: netkit`: pods on netkit pairs, next to pods on veth pairs, through every
//! verb, pod ↔ pod both ways in both families, pod → node, pod → outside (masqueraded),
//! outside → a host port, and a pod to its own node's host port (hairpin).
//!
//! This machine's kernel has no netkit (`CONFIG_NETKIT`): here the test proves that
//! `"netkit"` is refused with a clear error that leaves nothing behind and that `"auto"`
//! falls back to a veth. `cargo xtask test` runs it again under the second kernel
//! (Debian's 6.12, which has netkit) with `CNI_EBPF_EXPECT_NETKIT=1`, where a refusal is
//! a failure and the pods run on netkit.

use std::time::Duration;

use serde_json::json;
use testbed::{
    assert_no_ping, assert_ping, fault_bin,
    inspect::{host_veths, link},
    tcp_request, CniEnv, ConfBuilder, PluginOutput, Pod, ResultView, SimNode, Snapshot,
    WhoAmIServer, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6,
};

const SERVER_PORT: u16 = 8080;
const HOST_PORT: u16 = 18080;

/// The address the "who am I" server at `addr` saw for a TCP client in `netns`.
#[track_caller]
fn seen_from(netns: &std::path::Path, addr: &str) -> String {
    let answer = tcp_request(netns, addr, b"who", Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("TCP to {addr}: {e}"));
    let peer = answer.lines().next().unwrap_or_default();
    peer.rsplit_once(':').map_or(peer, |(ip, _)| ip).to_owned()
}

/// The kind (`veth`, `netkit`) of the host device of the pod that got `r`.
fn host_kind(node: &SimNode, r: &ResultView) -> String {
    let name = &r.host_interface().name;
    link(node.netns(), name)
        .and_then(|l| l.kind)
        .unwrap_or_else(|| panic!("host device {name} is gone or has no kind"))
}

/// `inspect`'s `interface` of the endpoint entry of `ip`.
fn inspected_interface(node: &SimNode, ip: &str) -> String {
    node.endpoints("testnet")
        .iter()
        .find(|e| e["ip"] == ip)
        .and_then(|e| e["interface"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no endpoint entry for {ip}"))
}

fn conf(node: &SimNode) -> ConfBuilder {
    node.conf()
        .version("1.1.0")
        .set("ipMasq", json!(true))
        .set("clusterCIDRs", json!(["10.244.0.0/16", "fd00:10:244::/48"]))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn netkit_pods_work_where_the_kernel_has_netkit_and_are_refused_where_not() {
    let node = SimNode::new("netkit");
    let veth_conf = conf(&node);
    let netkit_conf = veth_conf.clone().set("interface", json!("netkit"));
    node.warm_up(&veth_conf);
    let before = node.snapshot();

    let a = node.pod("a");
    let tried = node.exec_plugin("ADD", &a.env("eth0"), &netkit_conf.plugin());
    if !tried.success() {
        assert!(
            std::env::var("CNI_EBPF_EXPECT_NETKIT").is_err(),
            "this kernel is expected to have netkit, but ADD failed: {}",
            tried.raw
        );
        refused_where_the_kernel_has_no_netkit(&node, &a, &tried, &before);
        return;
    }
    node.del(&a, "eth0", &netkit_conf);
    netkit_pods_work(&node, &a, &veth_conf, &netkit_conf);
}

/// Without netkit: code 7 naming the option and the kernel's lack, nothing left on the
/// node, in the pod or in the store; `"auto"` gives the pod a veth.
fn refused_where_the_kernel_has_no_netkit(
    node: &SimNode,
    a: &Pod,
    tried: &PluginOutput,
    before: &Snapshot,
) {
    let e = tried.assert_error(7);
    let text = format!("{} {}", e.msg, e.details);
    assert!(
        text.contains("interface") && text.contains("netkit") && text.contains("CONFIG_NETKIT"),
        "the error should name the option and what the kernel lacks: {e:?}"
    );
    assert!(link(a.netns(), "eth0").is_none(), "the pod kept an eth0");
    let d = node.snapshot().diff(before);
    assert!(d.is_empty(), "the refused ADD left:\n{}", d.join("\n"));
    node.store("testnet").assert_empty("after the refused ADD");

    let auto = conf(node).set("interface", json!("auto"));
    let r = node.add(a, "eth0", &auto);
    assert_eq!(host_kind(node, &r), "veth", "auto without netkit");
    assert_eq!(inspected_interface(node, &r.ip4()), "veth");
    node.check(a, "eth0", &auto, &r.raw).assert_empty_success();
    assert_ping(a.netns(), EXT_IP4);
    node.del(a, "eth0", &auto);
    node.store("testnet").assert_empty("after DEL");
}

/// With netkit: two netkit pods (one with a host port) and a veth pod on one network.
fn netkit_pods_work(node: &SimNode, a: &Pod, veth_conf: &ConfBuilder, netkit_conf: &ConfBuilder) {
    let (b, c) = (node.pod("b"), node.pod("c"));
    let _ext_server = WhoAmIServer::start(node.ext_netns(), SERVER_PORT);
    let _a_server = WhoAmIServer::start(a.netns(), SERVER_PORT);
    let _c_server = WhoAmIServer::start(c.netns(), SERVER_PORT);
    let conf_a = netkit_conf.clone().set(
        "runtimeConfig",
        json!({ "portMappings": [
            { "hostPort": HOST_PORT, "containerPort": SERVER_PORT, "protocol": "tcp" }
        ] }),
    );
    let ra = node.add(a, "eth0", &conf_a);
    let rb = node.add(&b, "eth0", netkit_conf);
    let rc = node.add(&c, "eth0", veth_conf);
    for (r, kind) in [(&ra, "netkit"), (&rb, "netkit"), (&rc, "veth")] {
        assert_eq!(host_kind(node, r), kind, "host device of {}", r.ip4());
        assert_eq!(inspected_interface(node, &r.ip4()), kind);
        assert_eq!(inspected_interface(node, &r.ip6()), kind);
    }
    for (pod, conf, r) in [
        (a, &conf_a, &ra),
        (&b, netkit_conf, &rb),
        (&c, veth_conf, &rc),
    ] {
        node.check(pod, "eth0", conf, &r.raw).assert_empty_success();
    }
    node.exec_plugin("STATUS", &CniEnv::default(), &netkit_conf.plugin())
        .assert_empty_success();
    // CHECK of a netkit pod against a veth configuration: the device is not what it asks.
    let wrong = node.check(&b, "eth0", veth_conf, &rb.raw);
    let e = wrong.error();
    assert!(
        format!("{e:?}").contains("netkit"),
        "CHECK should say the pod's device is a netkit device: {e:?}"
    );

    // pod ↔ pod, every pair both ways, both families: netkit → netkit, netkit → veth,
    // veth → netkit.
    let pods = [(a, &ra), (&b, &rb), (&c, &rc)];
    for (from, _) in pods {
        for (to, r) in pods {
            if std::ptr::eq(from, to) {
                continue;
            }
            assert_ping(from.netns(), &r.ip4());
            assert_ping(from.netns(), &r.ip6());
        }
    }
    // TCP too, the server seeing the pod's own address (no translation between pods).
    assert_eq!(
        seen_from(b.netns(), &format!("{}:{SERVER_PORT}", ra.ip4())),
        rb.ip4()
    );
    assert_eq!(
        seen_from(b.netns(), &format!("{}:{SERVER_PORT}", rc.ip4())),
        rb.ip4()
    );
    assert_eq!(
        seen_from(c.netns(), &format!("[{}]:{SERVER_PORT}", ra.ip6())),
        rc.ip6()
    );
    // pod ↔ node.
    for (pod, r) in [(a, &ra), (&b, &rb)] {
        assert_ping(pod.netns(), NODE_IP4);
        assert_ping(pod.netns(), NODE_IP6);
        assert_ping(node.netns(), &r.ip4());
        assert_ping(node.netns(), &r.ip6());
    }
    // pod → outside, masqueraded to the node's address of each family.
    for pod in [a, &b] {
        for (ext, node_ip) in [
            (format!("{EXT_IP4}:{SERVER_PORT}"), NODE_IP4),
            (format!("[{EXT_IP6}]:{SERVER_PORT}"), NODE_IP6),
        ] {
            assert_eq!(seen_from(pod.netns(), &ext), node_ip, "pod → {ext}");
        }
    }
    // outside → a's host port, the client's address kept, both families.
    for (host_port, client) in [
        (format!("{NODE_IP4}:{HOST_PORT}"), EXT_IP4),
        (format!("[{NODE_IP6}]:{HOST_PORT}"), EXT_IP6),
    ] {
        assert_eq!(
            seen_from(node.ext_netns(), &host_port),
            client,
            "ext → {host_port}"
        );
    }
    // b → its own node's host port (hairpin): a answers.
    let answer = tcp_request(
        b.netns(),
        &format!("{NODE_IP4}:{HOST_PORT}"),
        b"who",
        Duration::from_secs(3),
    )
    .unwrap_or_else(|e| panic!("b → the node's host port: {e}"));
    assert!(!answer.is_empty(), "no answer through the host port");

    // A newer binary's first ADD swaps its programs into the running pods' links (a live
    // upgrade): CHECK then finds the new programs in a's and b's links, and they talk.
    let d = node.pod("d");
    let salted = d.env("eth0").with_env("CNI_EBPF_OBJECT_SALT", "-next");
    let out = node.exec_plugin_bin(&fault_bin(), "ADD", &salted, &netkit_conf.plugin());
    let rd = ResultView::parse(&out.result());
    assert!(
        node.log().contains("replacing the programs pinned"),
        "the newer binary did not replace the programs"
    );
    for (pod, conf, r) in [(a, &conf_a, &ra), (&b, netkit_conf, &rb)] {
        node.check(pod, "eth0", conf, &r.raw).assert_empty_success();
    }
    assert_ping(a.netns(), &rb.ip4());
    assert_ping(d.netns(), &ra.ip6());
    node.del(&d, "eth0", netkit_conf);
    assert_no_ping(a.netns(), &rd.ip4());

    // CHECK reads the links: with a's program link unpinned (the pair now drops what a
    // sends), CHECK says so.
    let pin = node
        .pins()
        .into_iter()
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy() == format!("ep-{}", ra.host_interface().name))
        })
        .unwrap_or_else(|| panic!("no link pin of a's host device in {:?}", node.pins()));
    let pin = node.pin_root().join(pin);
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("removing {}: {e}", pin.display()));
    let e = node.check(a, "eth0", &conf_a, &ra.raw).error();
    assert!(
        format!("{e:?}").contains("from_netkit"),
        "CHECK should report a's missing program: {e:?}"
    );
    assert_no_ping(a.netns(), EXT_IP4);

    // GC of everything but c: a and b go, c keeps working.
    let valid = json!([{ "containerID": c.container_id(), "ifname": "eth0" }]);
    node.exec_plugin(
        "GC",
        &CniEnv::default(),
        &veth_conf
            .clone()
            .set("cni.dev/valid-attachments", valid)
            .plugin(),
    )
    .assert_empty_success();
    for (pod, r) in [(a, &ra), (&b, &rb)] {
        assert!(
            link(pod.netns(), "eth0").is_none(),
            "{} survived GC",
            r.ip4()
        );
        assert!(
            link(node.netns(), &r.host_interface().name).is_none(),
            "{}'s host device survived GC",
            r.ip4()
        );
    }
    assert_ping(c.netns(), EXT_IP4);

    // A netkit pod again, then DEL of everything: nothing left.
    let rb = node.add(&b, "eth0", netkit_conf);
    assert_eq!(host_kind(node, &rb), "netkit");
    assert_ping(b.netns(), &rc.ip4());
    node.del(&b, "eth0", netkit_conf);
    assert_no_ping(c.netns(), &rb.ip4());
    node.del(&c, "eth0", veth_conf);
    assert!(host_veths(node.netns()).is_empty(), "host devices left");
    node.store("testnet").assert_empty("after DEL of every pod");
}
