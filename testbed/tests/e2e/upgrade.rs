//! A newer binary installed on a node with running pods carries the
//! node over — programs replaced in place through the clsact filters, tcx links and
//! cgroup links, maps kept — while pod → pod, masqueraded pod → outside and outside →
//! host port connections stay open and keep talking. A binary of another map layout
//! refuses, naming the procedure, and leaves the node as it was.
//!
//! The "newer binary" is the test build (`$CNI_EBPF_FAULT_BIN`) with
//! `CNI_EBPF_OBJECT_SALT`: same code, another object identity, so it loads its own copy
//! of every program and must move every attachment over to it.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{atomic::AtomicBool, atomic::Ordering, Arc},
    time::Duration,
};

use serde_json::{json, Value};
use testbed::{
    cgroup::TestCgroup,
    fault_bin,
    net::{converse, Conversation},
    CniEnv, ConfBuilder, EchoServer, Pod, SimNode, EXT_IP4, NODE_IP4, POD_SUBNET_V4,
};

/// This build's map layout, and the one the test build plays as "another binary".
const LAYOUT: u32 = cni_ebpf_common::LAYOUT_VERSION;
const NEXT_LAYOUT: u32 = LAYOUT + 1;

/// The object marker(s) below the network's version directory.
fn markers(node: &SimNode) -> Vec<String> {
    node.pins()
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| n.starts_with("object-"))
        .collect()
}

/// The id of the program pinned as `name`.
fn pinned_id(node: &SimNode, name: &str) -> u64 {
    let pin = node
        .pin_root()
        .join(format!("testnet/v{LAYOUT}/progs"))
        .join(name);
    let out = node.exec(&[
        "bpftool",
        "-j",
        "prog",
        "show",
        "pinned",
        &pin.to_string_lossy(),
    ]);
    let v: Value = serde_json::from_str(out.ok()).unwrap_or_default();
    v["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id for {}: {v}", pin.display()))
}

/// Program ids of our clsact filters (handle 0xcb0f…) on `dev` `hook`.
fn filter_ids(node: &SimNode, dev: &str, hook: &str) -> Vec<u64> {
    let out = node
        .exec(&["tc", "-j", "filter", "show", "dev", dev, hook])
        .stdout;
    let v: Value = serde_json::from_str(&out).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["kind"] == "bpf"
                && f["options"]["handle"]
                    .as_str()
                    .is_some_and(|h| h.starts_with("0xcb0f"))
        })
        .filter_map(|f| f["options"]["prog"]["id"].as_u64())
        .collect()
}

/// Program ids attached to the cgroup at `path`.
fn cgroup_ids(path: &Path) -> Vec<u64> {
    let out = testbed::process::run(&["bpftool", "-j", "cgroup", "show", &path.to_string_lossy()]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    let mut ids: Vec<u64> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

fn host_veth(node: &SimNode, pod: &Pod) -> String {
    testbed::inspect::host_veths(node.netns())
        .into_iter()
        .find(|l| {
            l.alias
                .as_deref()
                .is_some_and(|a| a.contains(pod.container_id()))
        })
        .map(|l| l.name)
        .unwrap_or_else(|| panic!("no host veth for {}", pod.container_id()))
}

fn ip_of(r: &testbed::ResultView) -> String {
    r.ips[0]
        .address
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[track_caller]
fn assert_alive(what: &str, c: &Conversation) {
    if let Ok(f) = c.failure.lock() {
        assert!(f.is_none(), "{what} broke: {f:?}");
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_newer_binary_takes_over_running_pods_and_open_flows_in_place() {
    let node = SimNode::new("upgrade");
    let cgroup = TestCgroup::create(node.tag());
    let conf = node
        .conf()
        .version("1.0.0")
        .subnets(&[POD_SUBNET_V4])
        .masquerading("10.244.0.0/16")
        .set("cgroupPath", json!(cgroup.path().to_string_lossy()));
    let with_port = |c: &ConfBuilder| {
        c.clone().set(
            "runtimeConfig",
            json!({ "portMappings": [{ "hostPort": 8080, "containerPort": 7000, "protocol": "tcp" }] }),
        )
    };
    let a = node.pod("a");
    let b = node.pod("b");
    let ra = node.add(&a, "eth0", &conf);
    let rb = node.add(&b, "eth0", &with_port(&conf));
    let old_markers = markers(&node);
    assert_eq!(old_markers.len(), 1, "one object marker: {:?}", node.pins());
    let old_from_pod = pinned_id(&node, "from_pod");
    let (veth_a, veth_b) = (host_veth(&node, &a), host_veth(&node, &b));
    assert_eq!(filter_ids(&node, &veth_a, "ingress"), [old_from_pod]);
    let old_cgroup = cgroup_ids(cgroup.path());
    assert_eq!(
        old_cgroup.len(),
        cni_ebpf_common::prog::SOCK.len(),
        "the socket programs of both families on the cgroup"
    );

    // Open flows of every kind: pod → pod, pod → outside (masqueraded), outside → host port.
    let stop = Arc::new(AtomicBool::new(false));
    let limit = Duration::from_secs(60);
    let servers = [
        EchoServer::concurrent(b.netns(), 7000),
        EchoServer::concurrent(node.ext_netns(), 7001),
    ];
    let to = |s: String| -> SocketAddr { s.parse().unwrap_or_else(|e| panic!("{s}: {e}")) };
    let flows = [
        (
            "pod → pod",
            converse(
                a.netns(),
                to(format!("{}:7000", ip_of(&rb))),
                stop.clone(),
                limit,
            ),
        ),
        (
            "pod → outside",
            converse(
                a.netns(),
                to(format!("{EXT_IP4}:7001")),
                stop.clone(),
                limit,
            ),
        ),
        (
            "outside → host port",
            converse(
                node.ext_netns(),
                to(format!("{NODE_IP4}:8080")),
                stop.clone(),
                limit,
            ),
        ),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let before: Vec<u64> = flows
        .iter()
        .map(|(_, (c, _))| c.exchanges.load(Ordering::Relaxed))
        .collect();
    assert!(
        before.iter().all(|n| *n > 0),
        "flows talk before the upgrade: {before:?}"
    );

    // Pods an older binary ADDed have no namespace recorded for the Service translation.
    let netns = |node: &SimNode| testbed::datapath::dump_map(node, "SERVICE_NETNS");
    assert_eq!(netns(&node).len(), 2);
    for (key, _) in netns(&node) {
        testbed::datapath::delete_map_key(&node, "SERVICE_NETNS", &key);
    }
    assert_eq!(netns(&node).len(), 0);

    // The newer binary's first ADD carries the node over.
    let newer = fault_bin();
    let salted = |env: CniEnv| CniEnv {
        extra: vec![("CNI_EBPF_OBJECT_SALT".into(), "-next".into())],
        ..env
    };
    let c = node.pod("c");
    let out = node.exec_plugin_bin(&newer, "ADD", &salted(c.env("eth0")), &conf.plugin());
    let _ = testbed::ResultView::parse(&out.result());
    let new_markers = markers(&node);
    assert_eq!(
        new_markers.len(),
        1,
        "one marker after the upgrade: {new_markers:?}"
    );
    // The carry-over recorded the namespaces of the pods it found (a, b), and the ADD its
    // own pod's (c).
    assert_eq!(
        netns(&node).len(),
        3,
        "the pods' namespaces after the upgrade"
    );
    assert_eq!(new_markers[0], format!("{}-next", old_markers[0]));
    let new_from_pod = pinned_id(&node, "from_pod");
    assert_ne!(new_from_pod, old_from_pod, "from_pod was not replaced");
    let new_to_pod = pinned_id(&node, "to_pod");
    for v in [&veth_a, &veth_b, &host_veth(&node, &c)] {
        assert_eq!(
            filter_ids(&node, v, "ingress"),
            [new_from_pod],
            "from_pod on {v}"
        );
        assert_eq!(
            filter_ids(&node, v, "egress"),
            [new_to_pod],
            "to_pod on {v}"
        );
    }
    for (hook, prog) in [("ingress", "uplink_ingress"), ("egress", "uplink_egress")] {
        assert_eq!(
            filter_ids(&node, "uplink0", hook),
            [pinned_id(&node, prog)],
            "{prog} on the uplink"
        );
    }
    let new_cgroup = cgroup_ids(cgroup.path());
    assert_eq!(
        new_cgroup.len(),
        cni_ebpf_common::prog::SOCK.len(),
        "still every socket program: {new_cgroup:?}"
    );
    assert!(
        new_cgroup.iter().all(|id| !old_cgroup.contains(id)),
        "the cgroup links swapped their programs: {old_cgroup:?} → {new_cgroup:?}"
    );

    // The flows went on through the swap, and keep going.
    std::thread::sleep(Duration::from_millis(500));
    for (i, (what, (c, _))) in flows.iter().enumerate() {
        assert_alive(what, c);
        assert!(
            c.exchanges.load(Ordering::Relaxed) > before[i] + 20,
            "{what} stopped talking after the upgrade"
        );
    }
    testbed::assert_ping(c.netns(), &ip_of(&rb));
    testbed::assert_ping(c.netns(), EXT_IP4);
    // CHECK of a pod added before the upgrade passes with the newer binary.
    let check = conf.clone().set("prevResult", ra.raw.clone());
    node.exec_plugin_bin(&newer, "CHECK", &salted(a.env("eth0")), &check.plugin())
        .assert_empty_success();

    // A binary of another map layout (the test build playing the next layout) refuses, names
    // the way out, and changes nothing: the flows keep talking.
    let next_layout = |env: CniEnv| CniEnv {
        extra: vec![("CNI_EBPF_LAYOUT_VERSION".into(), NEXT_LAYOUT.to_string())],
        ..env
    };
    let d = node.pod("d");
    let pins_before = node.pins();
    let e = node
        .exec_plugin_bin(&newer, "ADD", &next_layout(d.env("eth0")), &conf.plugin())
        .error();
    let text = format!("{} {}", e.msg, e.details);
    assert!(
        text.contains(&format!("map layout v{LAYOUT}")) && text.contains("uninstall --purge"),
        "the refusal names both layouts and the procedure: {text}"
    );
    assert_eq!(node.pins(), pins_before, "the refused ADD changed the pins");
    let n = flows[0].1 .0.exchanges.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    for (what, (c, _)) in &flows {
        assert_alive(what, c);
    }
    assert!(
        flows[0].1 .0.exchanges.load(Ordering::Relaxed) > n,
        "pod → pod stopped"
    );

    stop.store(true, Ordering::Relaxed);
    for (_, (_, h)) in flows {
        let _ = h.join();
    }
    drop(servers);
    // The documented procedure: drain (every pod deleted), purge with the old binary,
    // then the new layout's binary networks pods.
    for (p, cf) in [
        (&a, conf.clone()),
        (&b, with_port(&conf)),
        (&c, conf.clone()),
    ] {
        let out = node.exec_plugin_bin(&newer, "DEL", &salted(p.env("eth0")), &cf.plugin());
        out.assert_empty_success();
    }
    node.store("testnet").assert_empty("after the DELs");
    let purge = node.uninstall_purge();
    assert!(purge.success(), "uninstall --purge: {purge}");
    let e = node.pod("e");
    let out = node.exec_plugin_bin(&newer, "ADD", &next_layout(e.env("eth0")), &conf.plugin());
    let _ = testbed::ResultView::parse(&out.result());
    assert!(
        node.pins()
            .iter()
            .any(|p| p.starts_with(format!("testnet/v{NEXT_LAYOUT}"))),
        "the new layout is pinned: {:?}",
        node.pins()
    );
    testbed::assert_ping(e.netns(), EXT_IP4);
    node.exec_plugin_bin(&newer, "DEL", &next_layout(e.env("eth0")), &conf.plugin())
        .assert_empty_success();
    drop(d);
}
