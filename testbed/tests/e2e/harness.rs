//! Proves the harness itself: simulated node wiring and cleanup, the libcni client, and
//! what libcni 1.1.2 does with the versions and runtime arguments we rely on.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{json, Value};
use testbed::{
    assert_no_ping, assert_ping,
    kubeproxy::{self, Mode, Protocol, ProxyNode, ServicePort, TrafficPolicy},
    process::run,
    tcp_request, udp_request, Cluster, CniEnv, SimNode, TestCgroup, WhoAmIServer, ALL_VERSIONS,
    EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6, UPLINK,
};

/// Every path a node and its pods own, to check after drop that none is left.
fn owned_paths(node: &SimNode, pods: &[&testbed::Pod]) -> Vec<PathBuf> {
    let mut v = vec![
        node.netns().to_path_buf(),
        node.ext_netns().to_path_buf(),
        node.pin_root().to_path_buf(),
        node.dir().to_path_buf(),
    ];
    v.extend(pods.iter().map(|p| p.netns().to_path_buf()));
    v
}

#[track_caller]
fn assert_gone(paths: &[PathBuf], tag: &str) {
    let left: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "left behind after drop: {left:?}");
    let list = run(&["ip", "netns", "list"]);
    assert!(
        !list.ok().contains(tag),
        "`ip netns list` still shows namespaces tagged {tag}:\n{}",
        list.stdout
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn two_pods_wired_by_hand_can_ping_and_everything_is_removed() {
    let node = SimNode::new("two_pods");
    let (a, b) = (node.pod("a"), node.pod("b"));

    // The node reaches the outside world over its uplink, both families.
    assert_ping(node.netns(), EXT_IP4);
    assert_ping(node.netns(), EXT_IP6);
    assert_ping(node.ext_netns(), NODE_IP4);
    assert_ping(node.ext_netns(), NODE_IP6);

    // A veth between the two pods, by hand (the plugin is not involved here).
    run(&[
        "ip",
        "-n",
        a.name(),
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        b.name(),
    ])
    .ok();
    for (pod, v4, v6) in [
        (&a, "10.99.0.1/24", "fd00:99::1/64"),
        (&b, "10.99.0.2/24", "fd00:99::2/64"),
    ] {
        pod.exec(&["ip", "addr", "add", v4, "dev", "eth0"]).ok();
        pod.exec(&["ip", "addr", "add", v6, "dev", "eth0", "nodad"])
            .ok();
        pod.exec(&["ip", "link", "set", "eth0", "up"]).ok();
    }
    assert_ping(a.netns(), "10.99.0.2");
    assert_ping(b.netns(), "fd00:99::1");
    assert_no_ping(a.netns(), "10.99.0.3");
    // Pods are isolated from the node: no route from a pod to it.
    assert_no_ping(a.netns(), NODE_IP4);

    // Snapshots are stable when nothing changes, and see the node's uplink.
    let before = node.snapshot();
    assert!(
        before
            .links
            .iter()
            .any(|l| l.contains(&format!("\"ifname\":\"{UPLINK}\""))),
        "snapshot misses {UPLINK}:\n{before}"
    );
    node.snapshot().assert_same_as(&before);
    // ... and notice a new link.
    node.exec(&[
        "ip", "link", "add", "leak0", "type", "veth", "peer", "name", "leak1",
    ])
    .ok();
    let diff = node.snapshot().diff(&before);
    assert!(
        diff.iter()
            .any(|d| d.starts_with("+ link") && d.contains("leak0")),
        "{diff:?}"
    );

    // The per-test pin root is removed with the node (the plugin would create it).
    std::fs::create_dir_all(node.pin_root().join("testnet")).ok();
    assert!(
        node.pin_root().is_dir(),
        "bpffs not mounted at /sys/fs/bpf?"
    );

    let paths = owned_paths(&node, &[&a, &b]);
    let tag = node.tag().to_owned();
    drop((a, b));
    drop(node);
    assert_gone(&paths, &tag);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ext_servers_see_the_node_address_over_tcp_and_udp() {
    let node = SimNode::new("ext_servers");
    let server = WhoAmIServer::start(node.ext_netns(), 8080);
    let t = Duration::from_secs(2);
    for (ext, me) in [
        (EXT_IP4.to_owned(), NODE_IP4),
        (format!("[{EXT_IP6}]"), NODE_IP6),
    ] {
        let to = format!("{ext}:{}", server.port());
        let tcp =
            tcp_request(node.netns(), &to, b"hello", t).unwrap_or_else(|e| panic!("tcp {to}: {e}"));
        assert!(
            tcp.starts_with(&format!("{me}:")) && tcp.ends_with("hello"),
            "{tcp:?}"
        );
        let udp =
            udp_request(node.netns(), &to, b"hi", t).unwrap_or_else(|e| panic!("udp {to}: {e}"));
        assert!(
            udp.starts_with(&format!("{me}:")) && udp.ends_with("hi"),
            "{udp:?}"
        );
    }
    // Nothing listens on 8081: refused, promptly.
    let refused = tcp_request(node.netns(), &format!("{EXT_IP4}:8081"), b"", t);
    assert!(refused.is_err(), "{refused:?}");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_panicking_test_still_cleans_up() {
    let mut seen: Option<(Vec<PathBuf>, String)> = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let node = SimNode::new("panics");
        let pod = node.pod("p");
        std::fs::create_dir_all(node.pin_root()).ok();
        seen = Some((owned_paths(&node, &[&pod]), node.tag().to_owned()));
        let unreachable = Path::new("/nonexistent");
        assert!(unreachable.exists(), "deliberate failure inside a test");
    }));
    assert!(outcome.is_err(), "the closure should have panicked");
    let (paths, tag) = seen.unwrap_or_default();
    assert!(!paths.is_empty());
    assert_gone(&paths, &tag);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_cluster_routes_pod_cidrs_applies_kube_proxy_rules_and_cleans_up() {
    let (paths, tag) = {
        let cluster = Cluster::new("cluster");
        let (a, b) = (cluster.a(), cluster.b());
        let t = Duration::from_secs(2);

        // Static routes: each node reaches the other's pod CIDR through the other node.
        // (No plugin here: node A's pod gateway address stands in for a pod, on `lo`.)
        let gw_a = a.gateway4();
        a.exec(&["ip", "addr", "add", &format!("{gw_a}/32"), "dev", "lo"])
            .ok();
        assert_ping(b.netns(), &gw_a);
        for (node, peer) in [(a, b), (b, a)] {
            let route = node.exec(&["ip", "route", "show", peer.pod_cidr4()]);
            assert!(
                route.ok().contains(&format!("via {}", peer.ip4())),
                "{}: no route to {} via {}: {route}",
                node.name(),
                peer.pod_cidr4(),
                peer.ip4()
            );
            let default = node.exec(&["ip", "route", "show", "default"]);
            assert!(default.ok().contains(EXT_IP4), "{default}");
        }

        // kube-proxy's rules translate: a ClusterIP whose endpoint is node A's host
        // network, reached from node A (iptables mode, local endpoint) and node B
        // (nftables mode, remote endpoint, masqueraded to node B's address).
        let server = WhoAmIServer::start(a.netns(), 8080);
        let svc = ServicePort::new("default/host", "http", Protocol::Tcp, "10.96.0.50", 80)
            .endpoint(&format!("{gw_a}:{}", server.port()), a.name());
        a.install_kube_proxy(Mode::Iptables, std::slice::from_ref(&svc));
        b.install_kube_proxy(Mode::Nftables, std::slice::from_ref(&svc));
        let save = a.exec(&["iptables-save"]);
        assert!(
            save.ok().contains("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
            "{save}"
        );
        let table = b.exec(&["nft", "list", "table", "ip", "kube-proxy"]);
        assert!(table.ok().contains("service-ips"), "{table}");
        // The IPv6 rule sets load too (ip6tables-restore, `table ip6 kube-proxy`).
        let svc6 = ServicePort::new("default/host", "http", Protocol::Tcp, "fd00:10:96::50", 80)
            .endpoint(&format!("[{}]:8080", a.ip6()), a.name())
            .node_port(30080, TrafficPolicy::Local);
        for (node, mode) in [(a, Mode::Iptables), (b, Mode::Nftables)] {
            let proxy = ProxyNode::new(
                node.name(),
                &[node.ip6()],
                "fd00:10:244::/56",
                "fd00:10:96::/112",
            );
            kubeproxy::install(node.netns(), mode, &proxy, std::slice::from_ref(&svc6));
        }
        let save6 = a.exec(&["ip6tables-save"]);
        assert!(save6.ok().contains("KUBE-SVL-"), "{save6}");
        let via_a = tcp_request(a.netns(), "10.96.0.50:80", b"hi", t)
            .unwrap_or_else(|e| panic!("node-a → ClusterIP (iptables mode): {e}"));
        assert!(via_a.ends_with("hi"), "{via_a:?}");
        let via_b = tcp_request(b.netns(), "10.96.0.50:80", b"hi", t)
            .unwrap_or_else(|e| panic!("node-b → ClusterIP (nftables mode): {e}"));
        assert!(
            via_b.starts_with(&format!("{}:", b.ip4())),
            "the endpoint must see node-b's address: {via_b:?}"
        );

        // A process started in the test's cgroup is in it.
        let cgroup = TestCgroup::create(cluster.tag());
        let inside = cgroup.exec_in(a.netns(), &["cat", "/proc/self/cgroup"]);
        let name = cgroup
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        assert!(
            inside
                .ok()
                .lines()
                .any(|l| l.starts_with("0::/") && l.ends_with(&name)),
            "{inside}"
        );

        let mut paths = vec![
            cluster.ext_netns().to_path_buf(),
            cluster.fabric_netns().to_path_buf(),
            cgroup.path().to_path_buf(),
        ];
        for node in cluster.nodes() {
            paths.extend(owned_paths(node, &[]));
        }
        (paths, cluster.tag().to_owned())
    };
    assert_gone(&paths, &tag);
}

/// An IP counter of the namespace `netns` from `snmp` (`Ip`) or `netstat` (`IpExt`) in
/// `/proc/thread-self/net` (`/proc/net` is the process's namespace, not the thread's).
fn ip_counter(netns: &Path, file: &'static str, table: &'static str, name: &'static str) -> u64 {
    let text = testbed::net::in_netns(netns, move || std::fs::read_to_string(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    testbed::net::proc_net_counter(&text, table, name)
        .unwrap_or_else(|| panic!("no {table} {name} in {file}:\n{text}"))
}

/// The links between the fabric and a node behave as a wire and a NIC: node A's 1 MiB
/// reaches node B's port as frames of the MTU, and node B's uplink merges them again
/// before its stack (IP counts far more segments than packets).
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cluster_links_carry_frames_of_the_mtu_and_the_uplink_merges_them() {
    let cluster = Cluster::new("nic");
    let (a, b) = (cluster.a(), cluster.b());
    let _echo = testbed::EchoServer::start(b.netns(), 7070, testbed::Serving::Concurrently)
        .unwrap_or_else(|e| panic!("echo server on node B: {e}"));
    let to = testbed::net::sock_addr(&format!("{}:7070", b.ip4()));
    let port_before = testbed::process::device_packets(cluster.fabric_netns(), "to-b", "tx");
    let received = |name| ip_counter(b.netns(), "/proc/thread-self/net/snmp", "Ip", name);
    let segments = |name| ip_counter(b.netns(), "/proc/thread-self/net/netstat", "IpExt", name);
    let (packets_before, segments_before) = (received("InReceives"), segments("InNoECTPkts"));
    assert_eq!(
        testbed::net::echo_mib(a.netns(), to),
        1 << 20,
        "1 MiB echo to {to}"
    );
    let frames =
        testbed::process::device_packets(cluster.fabric_netns(), "to-b", "tx") - port_before;
    let packets = received("InReceives") - packets_before;
    let segs = segments("InNoECTPkts") - segments_before;
    // 1 MiB in segments of at most 1448 bytes is at least 725 frames.
    assert!(
        frames >= 725,
        "node A's 1 MiB reached node B's port in {frames} frames, not cut to the MTU"
    );
    assert!(
        segs >= 4 * packets,
        "node B's stack received {segs} segments in {packets} packets: its uplink merged \
         (almost) nothing"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn libcni_client_reports_versions_and_surfaces_the_plugins_add_outcome() {
    let node = SimNode::new("libcni_add");

    // VERSION, directly and through libcni's GetVersionInfo.
    let direct = node
        .exec_plugin(
            "VERSION",
            &CniEnv::default(),
            &json!({ "cniVersion": "1.0.0" }),
        )
        .result();
    assert_eq!(direct["cniVersion"], "1.0.0", "{direct}");
    let via = node.libcni_version("cni-ebpf").result();
    let versions: Vec<&str> = via["supportedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for v in ALL_VERSIONS {
        assert!(
            versions.contains(v),
            "libcni sees {versions:?}, missing {v}"
        );
    }

    // ADD of a conflist (cni-ebpf, then the reference `tuning`). Whatever the plugin
    // answers when run directly is what the client must surface: a result, or the same
    // error.
    let pod = node.pod("p");
    let conf = node.conf().version("1.0.0");
    let env = pod.env("eth0");
    let direct = node.exec_plugin("ADD", &env, &conf.plugin());
    if direct.success() {
        node.exec_plugin("DEL", &env, &conf.plugin())
            .assert_empty_success();
    }
    let conflist = conf
        .clone()
        .then(json!({ "type": "tuning", "sysctl": {} }))
        .conflist();
    let add = node.libcni("add", &conflist, &env, None);
    if direct.success() {
        let result = add.result();
        assert_eq!(result["cniVersion"], "1.0.0", "{result}");
        node.libcni("check", &conflist, &env, None).assert_success();
        node.libcni("del", &conflist, &env, None).assert_success();
    } else {
        let want = direct.error();
        let got = add.failure();
        assert_eq!((got.code, &got.msg), (want.code, &want.msg), "{}", add.raw);
        assert!(
            got.error.contains("plugin type=\"cni-ebpf\" failed (add)"),
            "{got:?}"
        );
        // A runtime cleans up a failed ADD with DEL; that must succeed once DEL exists.
        let _ = node.libcni("del", &conflist, &env, None);
    }
}

/// A stand-in plugin that records its stdin and `CNI_*` environment per command and
/// answers ADD with a result in `$STUB_RESULT_VERSION`.
const STUB: &str = r#"#!/bin/sh
d=$(dirname "$0")
cat > "$d/stdin.$CNI_COMMAND"
env | grep '^CNI_' | sort > "$d/env.$CNI_COMMAND"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}' ;;
ADD) printf '{"cniVersion":"%s","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"10.244.1.9/24","gateway":"10.244.1.1","interface":0}]}\n' "$STUB_RESULT_VERSION" "$CNI_NETNS" ;;
esac
"#;

fn read_json(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    serde_json::from_str(&s).unwrap_or(Value::Null)
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn libcni_passes_runtime_args_and_prev_result_and_stops_at_1_0_0() {
    use std::os::unix::fs::PermissionsExt;

    let node = SimNode::new("libcni_stub");
    let bin = node.dir().join("stub-bin");
    let stub = bin.join("stub");
    std::fs::create_dir(&bin).ok();
    std::fs::write(&stub, STUB).ok();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).ok();

    let pod = node.pod("p");
    let conflist = |version: &str| {
        json!({ "cniVersion": version, "name": "stubnet", "plugins": [
            { "type": "stub", "capabilities": { "portMappings": true, "mac": false } } ] })
    };
    let caps = json!({
        "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }],
        "mac": "02:00:00:00:00:01",
    });
    let env = |version: &str| {
        pod.env("eth0")
            .with_args("IP=10.244.1.9;K8S_POD_NAME=p")
            .with_env("STUB_RESULT_VERSION", version)
            .with_path(&bin)
    };

    // 1.0.0: the full cycle, with runtimeConfig filtered by capabilities and CNI_ARGS.
    let e = env("1.0.0");
    let result = node
        .libcni("add", &conflist("1.0.0"), &e, Some(&caps))
        .result();
    assert_eq!(result["ips"][0]["address"], "10.244.1.9/24", "{result}");
    let stdin = read_json(&bin.join("stdin.ADD"));
    assert_eq!(
        stdin["runtimeConfig"],
        json!({ "portMappings": caps["portMappings"] }),
        "mac must be filtered out (capability false): {stdin}"
    );
    assert_eq!(stdin["name"], "stubnet");
    let env_add = std::fs::read_to_string(bin.join("env.ADD")).unwrap_or_default();
    assert!(
        env_add.contains("CNI_ARGS=IP=10.244.1.9;K8S_POD_NAME=p"),
        "{env_add}"
    );
    assert!(
        env_add.contains(&format!("CNI_NETNS={}", pod.netns().display())),
        "{env_add}"
    );

    let cached = node.libcni("cached", &conflist("1.0.0"), &e, None).result();
    assert_eq!(cached, result);
    node.libcni("check", &conflist("1.0.0"), &e, Some(&caps))
        .assert_success();
    let check_in = read_json(&bin.join("stdin.CHECK"));
    assert_eq!(check_in["prevResult"]["ips"], result["ips"], "{check_in}");
    node.libcni("del", &conflist("1.0.0"), &e, Some(&caps))
        .assert_success();
    let del_in = read_json(&bin.join("stdin.DEL"));
    assert_eq!(del_in["prevResult"]["ips"], result["ips"], "{del_in}");

    // 1.1.0: libcni 1.1.2 calls the plugin but cannot parse a 1.1.0 result.
    let e = env("1.1.0");
    let add = node.libcni("add", &conflist("1.1.0"), &e, None);
    let f = add.failure();
    assert_eq!(f.code, 0, "a libcni error, not the plugin's: {}", add.raw);
    assert!(
        f.error.contains("unsupported CNI result version \"1.1.0\""),
        "{f:?}"
    );

    // GC and STATUS do not exist in libcni 1.1.2.
    let gc = node.libcni_raw(&["gc"], &[]);
    assert_eq!(gc.raw.status.code(), Some(2), "{}", gc.raw);
}
