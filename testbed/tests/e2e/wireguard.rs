//! `encryption: wireguard`: pod traffic between nodes only inside WireGuard, in each
//! cross-node mode, with the keys made by the agents and published on their Nodes.
//!
//! This machine's kernel has no WireGuard: here each test proves that ADD refuses the
//! mode with a clear error that leaves nothing behind. `cargo xtask test` runs them again
//! under the second kernel (Debian's 6.12, whose `wireguard` module the guest loads) with
//! `CNI_EBPF_EXPECT_WIREGUARD=1`, where a refusal is a failure and the traffic is
//! captured on the fabric: no pod payload (a known marker), no pod address, WireGuard's
//! port only.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use testbed::{
    apiserver::ApiServer,
    assert_no_ping, assert_ping,
    capture::{Capture, Frame},
    cluster::{agent_logs, Underlay, NODE_A_POD_CIDR6, NODE_B_POD_CIDR6},
    inspect::link,
    net::{converse, in_netns},
    process::Background,
    Cluster, ClusterNode, ConfBuilder, EchoServer, ResultView,
};

/// The WireGuard device's name and port (the default `wireguardPort`).
const DEVICE: &str = "cni-ebpf.wg";
const PORT: u16 = 51_872;
/// The Node annotation with a node's public key.
const KEY_ANNOTATION: &str = "cni-ebpf.io/wireguard-public-key";
const ECHO_PORT: u16 = 7070;
/// Longest wait for the agents to act.
const WAIT: Duration = Duration::from_secs(10);
/// Where each node's agent serves its metrics (in the node's namespace).
const METRICS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 19_670);
/// A payload no other traffic carries.
const MARKER: &[u8] = b"cni-ebpf-plaintext-marker-7d3f";

/// Whether this kernel has WireGuard (a device made and deleted in `node`). Where the run
/// says it has (`CNI_EBPF_EXPECT_WIREGUARD=1`), its absence fails the test.
fn kernel_has_wireguard(node: &ClusterNode) -> bool {
    let has = node
        .exec(&["ip", "link", "add", "wgprobe0", "type", "wireguard"])
        .status
        .success();
    if has {
        node.exec(&["ip", "link", "del", "wgprobe0"]).ok();
    }
    if std::env::var("CNI_EBPF_EXPECT_WIREGUARD").is_ok_and(|v| v == "1") {
        assert!(
            has,
            "CNI_EBPF_EXPECT_WIREGUARD=1 but this kernel has no WireGuard"
        );
    }
    has
}

/// The conflist of `mode` with encryption on, both families.
fn encrypted(n: &ClusterNode, mode: &str) -> ConfBuilder {
    n.conf_dual_stack()
        .set("crossNode", json!(mode))
        .set("encryption", json!("wireguard"))
}

/// Without WireGuard in the kernel: ADD with encryption is error 7 naming `encryption`
/// and what the kernel lacks, and leaves nothing on the node, in the pod or the store.
fn refused(n: &ClusterNode, mode: &str) {
    let plain = n.conf_dual_stack().set("crossNode", json!(mode));
    n.warm_up(&plain);
    let before = n.snapshot();
    let pod = n.pod("refused");
    let tried = n.exec_plugin("ADD", &pod.env("eth0"), &encrypted(n, mode).plugin());
    let e = tried.assert_error(7);
    let text = format!("{} {}", e.msg, e.details);
    assert!(
        text.contains("encryption") && text.contains("WireGuard"),
        "the error should name the option and what the kernel lacks: {e:?}"
    );
    assert!(link(pod.netns(), "eth0").is_none(), "the pod kept an eth0");
    assert!(
        link(n.netns(), DEVICE).is_none(),
        "a WireGuard device was left"
    );
    let d = n.snapshot().diff(&before);
    assert!(d.is_empty(), "the refused ADD left:\n{}", d.join("\n"));
    n.store("testnet").assert_empty("after the refused ADD");
}

/// Without WireGuard in the kernel, an agent whose node's conflist asks for it logs why
/// every ADD will fail, and is not ready.
fn the_agent_says_the_kernel_has_no_wireguard(cluster: &Cluster, n: &ClusterNode) {
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "plugins": [{
            "type": "cni-ebpf",
            "encryption": "wireguard",
            "bpffsRoot": n.pin_root(),
            "dataDir": n.data_dir(),
        }],
    });
    std::fs::write(
        api.sa_dir().join("10-cni-ebpf.conflist"),
        conflist.to_string(),
    )
    .unwrap_or_else(|e| panic!("writing the conflist: {e}"));
    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agent = agent(n, &api, keys.path(), logs.path());
    wait(
        "the agent to say the kernel has no WireGuard",
        || {
            let text = agent_logs(logs.path());
            text.contains("encryption is \"wireguard\", but")
                && text.contains("this kernel has no WireGuard")
        },
        logs.path(),
    );
}

/// Starts each node's agent (Node watcher only) with its key in `keys`.
fn start_agents(cluster: &Cluster, api: &ApiServer, keys: &Path, logs: &Path) -> Vec<Background> {
    cluster
        .nodes()
        .iter()
        .map(|n| agent(n, api, keys, logs))
        .collect()
}

fn key_file(keys: &Path, n: &ClusterNode) -> String {
    keys.join(format!("{}/private.key", n.name()))
        .display()
        .to_string()
}

fn agent(n: &ClusterNode, api: &ApiServer, keys: &Path, logs: &Path) -> Background {
    let key = key_file(keys, n);
    n.start_agent(
        api,
        &[
            "agent",
            "--policy=false",
            "--listen",
            &METRICS.to_string(),
            "--probe-listen",
            "127.0.0.1:0",
            "--node-name",
            n.name(),
            "--host-gw-interval",
            "30",
            "--wireguard-key",
            &key,
        ],
        &logs.join(format!("agent-{}.log", n.name())),
    )
}

/// The public key on Node `name`, if published.
fn published(api: &ApiServer, name: &str) -> Option<String> {
    api.get("nodes", None, name)?["metadata"]["annotations"][KEY_ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

/// `inspect --json`'s `wireguard` section on `n`, its peers named from the agent's key
/// directory `keys`.
fn inspected(n: &ClusterNode, keys: &Path) -> Value {
    let bin = testbed::plugin::plugin_bin().display().to_string();
    let root = n.pin_root().display().to_string();
    let key = key_file(keys, n);
    let out = n.exec(&[
        bin.as_str(),
        "inspect",
        "--network",
        "testnet",
        "--bpffs-root",
        &root,
        "--wireguard-key",
        &key,
        "--json",
    ]);
    let doc: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("inspect: {e}: {out:?}"));
    doc["wireguard"].clone()
}

/// `n`'s WireGuard peers as `inspect` shows them: (node, public key, endpoint).
fn device_peers(n: &ClusterNode, keys: &Path) -> Vec<(String, String, String)> {
    let w = inspected(n, keys);
    w["peers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let s = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
                    (s("node"), s("publicKey"), s("endpoint"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[track_caller]
fn wait(what: &str, mut f: impl FnMut() -> bool, logs: &Path) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} after {WAIT:?}; agent logs:\n{}",
            agent_logs(logs)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends the marker over TCP (an echo, both ways) and UDP from `from` to `to`.
fn send_marker(from: &Path, to: IpAddr) {
    let addr = SocketAddr::new(to, ECHO_PORT);
    let back = in_netns(from, move || -> std::io::Result<Vec<u8>> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut payload = Vec::new();
        for _ in 0..2000 {
            payload.extend_from_slice(MARKER);
        }
        s.write_all(&payload)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut back = Vec::new();
        s.read_to_end(&mut back)?;
        let u = std::net::UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        for _ in 0..20 {
            u.send_to(MARKER, SocketAddr::new(to, ECHO_PORT + 1))?;
        }
        Ok(back)
    })
    .unwrap_or_else(|e| panic!("the marker to {addr}: {e}"));
    assert_eq!(back.len(), MARKER.len() * 2000, "echoed by {addr}");
}

/// What the capture shows: no frame carries the marker or a pod address, and WireGuard's
/// packets between the nodes' addresses were seen. Returns how many of those.
#[track_caller]
fn only_wireguard(frames: &[Frame]) -> usize {
    let pod = |ip: &IpAddr| match ip {
        IpAddr::V4(a) => a.octets()[..2] == [10, 244],
        IpAddr::V6(a) => a.segments()[..3] == [0xfd00, 0x10, 0x244],
    };
    let mut wireguard = 0;
    for f in frames {
        assert!(
            !f.contains(MARKER),
            "the marker crossed the wire in clear: {:?}",
            f.ip()
        );
        if let Some((src, dst, proto, sport, dport)) = f.ip() {
            assert!(
                !pod(&src) && !pod(&dst),
                "a pod's packet crossed the wire in clear: {src} → {dst} (protocol {proto})"
            );
            if proto == 17 && (sport == PORT || dport == PORT) {
                wireguard += 1;
            }
        }
    }
    wireguard
}

/// Both pods' addresses in both families.
fn addrs(r: &ResultView) -> [IpAddr; 2] {
    let p = |s: String| s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    [p(r.ip4()), p(r.ip6())]
}

/// A two-node cluster in `mode`, pods on both with encryption, the agents keyed: pod
/// traffic crosses only as WireGuard, and each node's packets for the other's pods
/// went into its device.
fn pods_cross_only_inside_wireguard(cluster: &Cluster, mode: &str) {
    let (a, b) = (cluster.a(), cluster.b());
    if !kernel_has_wireguard(a) {
        refused(a, mode);
        return;
    }
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    let underlay = |n: &ClusterNode| n.underlay_ip(Underlay::V4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[underlay(a)]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[underlay(b)]);
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &encrypted(a, mode));
    let rb = b.add(&pb, "eth0", &encrypted(b, mode));

    // The pods' MTU: the uplink's 1500 less WireGuard's 60 bytes over IPv4 (which
    // replace the tunnel's 50 in the tunnel modes).
    let dev = link(a.netns(), DEVICE).unwrap_or_else(|| panic!("no {DEVICE} on node A"));
    assert_eq!(dev.kind.as_deref(), Some("wireguard"));
    assert_eq!(dev.mtu, 1440);
    assert_eq!(link(pa.netns(), "eth0").map(|l| l.mtu), Some(1440));

    // No agent yet, so no key anywhere: strict mode drops, nothing leaves in clear.
    let dropped = a.reason_count("drop_no_wireguard_key");
    assert_no_ping(pa.netns(), &rb.ip4());
    assert!(a.reason_count("drop_no_wireguard_key") > dropped);

    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = start_agents(cluster, &api, keys.path(), logs.path());
    wait(
        "both nodes' keys published",
        || published(&api, "node-a").is_some() && published(&api, "node-b").is_some(),
        logs.path(),
    );
    // The private key stays on its node, mode 0600; the Node has its public key.
    let file = key_file(keys.path(), a);
    let mode_bits = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .permissions(),
    );
    assert_eq!(mode_bits & 0o777, 0o600);
    let private = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(!api
        .get("nodes", None, "node-a")
        .map(|n| n.to_string())
        .unwrap_or_default()
        .contains(private.trim()));
    wait(
        "each node's device has the other as its peer",
        || device_peers(a, keys.path()).len() == 1 && device_peers(b, keys.path()).len() == 1,
        logs.path(),
    );
    let ka = published(&api, "node-a").unwrap_or_default();
    let (node, key, endpoint) = device_peers(b, keys.path()).remove(0);
    assert_eq!(node, "node-a", "inspect names the peer's node");
    assert_eq!(key, ka, "node B's peer is node A's published key");
    assert_eq!(
        endpoint,
        format!("{}:{PORT}", underlay(a)),
        "node B reaches node A at its InternalIP"
    );
    wait(
        "pod A reaches pod B",
        || testbed::net::ping(pa.netns(), &rb.ip4(), 1),
        logs.path(),
    );

    let _echo_a = EchoServer::concurrent(pa.netns(), ECHO_PORT);
    let _echo_b = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    let sent = [
        a.reason_count("wireguard_encrypt"),
        b.reason_count("wireguard_encrypt"),
    ];
    let capture = Capture::start(cluster.fabric_netns());
    for (from, to) in [(&pa, &rb), (&pb, &ra)] {
        for ip in addrs(to) {
            send_marker(from.netns(), ip);
        }
    }
    assert_ping(pa.netns(), &rb.ip6());
    let frames = capture.stop();
    let wireguard = only_wireguard(&frames);
    assert!(
        wireguard >= 40,
        "{wireguard} WireGuard packets of {} frames on the fabric",
        frames.len()
    );
    let encrypted_a = a.reason_count("wireguard_encrypt") - sent[0];
    let encrypted_b = b.reason_count("wireguard_encrypt") - sent[1];
    assert!(
        encrypted_a >= 20 && encrypted_b >= 20,
        "packets handed to WireGuard: node A {encrypted_a}, node B {encrypted_b}"
    );
    // The node's own traffic from its own address is not pod traffic: untouched.
    assert_ping(a.netns(), underlay(b));

    // The metrics: the peer, its handshake and bytes each way, named by its node.
    let metric = |family: &str, labels: &[(&str, &str)]| {
        testbed::net::metric_value(a.netns(), METRICS, family, labels)
    };
    let peer = [("node", "node-b")];
    assert!(metric("cni_ebpf_wireguard_peer_sent_bytes_total", &peer) > 20_000.0);
    assert!(metric("cni_ebpf_wireguard_peer_received_bytes_total", &peer) > 20_000.0);
    assert!(metric("cni_ebpf_wireguard_peer_last_handshake_seconds", &peer) > 1.0e9);
    let inspected = inspected(a, keys.path());
    assert_eq!(
        inspected["publicKey"].as_str(),
        published(&api, "node-a").as_deref()
    );
    assert!(
        inspected["peers"][0]["lastHandshake"].as_u64().is_some(),
        "{inspected}"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn routed_pod_traffic_crosses_only_inside_wireguard() {
    pods_cross_only_inside_wireguard(&Cluster::new("wg_routed"), "routed");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn tunnel_pod_traffic_crosses_only_inside_wireguard() {
    pods_cross_only_inside_wireguard(&Cluster::across_subnets("wg_tunnel"), "tunnel");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cross_subnet_pod_traffic_crosses_only_inside_wireguard() {
    pods_cross_only_inside_wireguard(&Cluster::new("wg_xsubnet"), "crossSubnet");
}

/// A key rotated during a conversation, a node without a key, a Node removed, and a
/// node reached in clear only where the operator opted out.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn keys_rotate_and_nodes_come_and_go_without_cleartext() {
    let cluster = Cluster::new("wg_keys");
    let (a, b) = (cluster.a(), cluster.b());
    if !kernel_has_wireguard(a) {
        refused(a, "routed");
        the_agent_says_the_kernel_has_no_wireguard(&cluster, a);
        return;
    }
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[b.ip4()]);
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    a.add(&pa, "eth0", &encrypted(a, "routed"));
    let rb = b.add(&pb, "eth0", &encrypted(b, "routed"));
    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = start_agents(&cluster, &api, keys.path(), logs.path());
    wait(
        "pod A reaches pod B",
        || testbed::net::ping(pa.netns(), &rb.ip4(), 1),
        logs.path(),
    );

    // An agent restart keeps the node's key pair.
    let published_a = published(&api, "node-a");
    drop(_agents);
    let _agents = start_agents(&cluster, &api, keys.path(), logs.path());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        published(&api, "node-a"),
        published_a,
        "the key after a restart"
    );
    assert_eq!(
        inspected(a, keys.path())["publicKey"].as_str(),
        published_a.as_deref(),
        "the device's key after a restart"
    );
    assert_ping(pa.netns(), &rb.ip4());

    // Node A's key rotates in the middle of a conversation: the new key is on its Node
    // and in node B's device within a second, and the conversation goes on.
    let _echo = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    let to: SocketAddr = format!("{}:{ECHO_PORT}", rb.ip4())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let (talk, h) = converse(pa.netns(), to, Arc::clone(&stop), Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(500));
    let old = published(&api, "node-a").unwrap_or_default();
    let bin = testbed::plugin::plugin_bin().display().to_string();
    let key = key_file(keys.path(), a);
    let out = a.exec(&[
        bin.as_str(),
        "wireguard",
        "rotate-key",
        "--wireguard-key",
        &key,
    ]);
    assert!(out.status.success(), "rotate-key: {out:?}");
    let rotated = Instant::now();
    wait(
        "node A's new key on its Node and in node B's device",
        || {
            published(&api, "node-a").is_some_and(|k| k != old)
                && device_peers(b, keys.path())
                    .first()
                    .is_some_and(|p| Some(&p.1) == published(&api, "node-a").as_ref())
        },
        logs.path(),
    );
    let took = rotated.elapsed();
    assert!(took < Duration::from_secs(3), "the rotation took {took:?}");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    h.join()
        .unwrap_or_else(|_| panic!("the conversation panicked"));
    assert_eq!(
        *talk.failure.lock().unwrap_or_else(|e| e.into_inner()),
        None,
        "the conversation across the rotation"
    );
    let before = talk.exchanges.load(Ordering::Relaxed);
    assert!(before >= 100, "{before} exchanges");

    // A node that publishes no key: its pods are unreachable, nothing goes to it in clear.
    api.set_node("node-x", &["10.244.9.0/24"], &["198.18.0.9"]);
    wait(
        "node A to log node-x as keyless",
        || {
            agent_logs(logs.path())
                .contains("no WireGuard peer: node node-x: no WireGuard key published")
        },
        logs.path(),
    );
    let dropped = a.reason_count("drop_no_wireguard_key");
    let capture = Capture::start(cluster.fabric_netns());
    assert_no_ping(pa.netns(), "10.244.9.7");
    let frames = capture.stop();
    only_wireguard(&frames);
    assert!(a.reason_count("drop_no_wireguard_key") > dropped);
    let drops = testbed::net::metric_value(
        a.netns(),
        METRICS,
        "cni_ebpf_reason_packets_total",
        &[("reason", "drop_no_wireguard_key")],
    );
    assert!(
        drops >= 1.0,
        "{drops} drops for a node without a key in the metrics"
    );
    assert!(
        inspected(a, keys.path())["keyless"]["node-x"]
            .as_str()
            .is_some_and(|why| why.contains("no WireGuard key published")),
        "inspect names the keyless node"
    );

    // Node B leaves: node A's device forgets it, its pods are cut off.
    api.remove_node("node-b");
    wait(
        "node A to drop node B's peer",
        || device_peers(a, keys.path()).is_empty(),
        logs.path(),
    );
    assert_no_ping(pa.netns(), &rb.ip4());
}

/// `encryptionStrict: false` on node A, and node B without encryption (no key): A's pods
/// reach B's in clear, counted and logged as such.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_keyless_node_is_reached_in_clear_only_when_the_operator_opts_out() {
    let cluster = Cluster::new("wg_optout");
    let (a, b) = (cluster.a(), cluster.b());
    if !kernel_has_wireguard(a) {
        refused(a, "routed");
        return;
    }
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[b.ip4()]);
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    a.add(
        &pa,
        "eth0",
        &encrypted(a, "routed").set("encryptionStrict", json!(false)),
    );
    let rb = b.add(&pb, "eth0", &b.conf_dual_stack());
    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = start_agents(&cluster, &api, keys.path(), logs.path());
    wait(
        "node A to log node B as reached in clear",
        || {
            agent_logs(logs.path())
                .contains("node node-b: no WireGuard key published; its pods are reached IN CLEAR")
        },
        logs.path(),
    );
    assert!(
        published(&api, "node-b").is_none(),
        "node B has no encryption"
    );
    let clear = a.reason_count("wireguard_clear_to_keyless");
    assert_ping(pa.netns(), &rb.ip4());
    assert!(a.reason_count("wireguard_clear_to_keyless") > clear);
}

/// Encryption turned on, then off, on a running cluster, under a conversation between
/// two pods made before. The rollout first changes the nodes' conflists: the agents
/// prepare their nodes (device, key, peers) while the programs still send in clear; each
/// node's next ADD then turns its programs on. The conversation goes on across both
/// changes with no exchange slower than 2 s: inside WireGuard while the nodes encrypt,
/// in clear after.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn turning_encryption_on_and_off_keeps_open_connections() {
    let cluster = Cluster::new("wg_switch");
    let (a, b) = (cluster.a(), cluster.b());
    if !kernel_has_wireguard(a) {
        refused(a, "routed");
        return;
    }
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[b.ip4()]);
    let plain = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("routed"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    a.add(&pa, "eth0", &plain(a));
    let rb = b.add(&pb, "eth0", &plain(b));
    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = start_agents(&cluster, &api, keys.path(), logs.path());
    let _echo = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    let to: SocketAddr = format!("{}:{ECHO_PORT}", rb.ip4())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let (talk, h) = converse(pa.netns(), to, Arc::clone(&stop), Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let encrypted_so_far =
        || a.reason_count("wireguard_encrypt") + b.reason_count("wireguard_encrypt");
    assert_eq!(encrypted_so_far(), 0);

    // The rollout: the conflist (the agents' configuration directory here) asks for
    // encryption, and the agents prepare both nodes; nothing is encrypted yet.
    let conflist = api.sa_dir().join("10-cni-ebpf.conflist");
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "plugins": [{"type": "cni-ebpf", "encryption": "wireguard"}],
    });
    std::fs::write(&conflist, conf.to_string()).unwrap_or_else(|e| panic!("{e}"));
    wait(
        "both nodes prepared: each device has the other as its peer",
        || device_peers(a, keys.path()).len() == 1 && device_peers(b, keys.path()).len() == 1,
        logs.path(),
    );
    assert_eq!(encrypted_so_far(), 0, "prepared, not encrypting");

    // On: the next ADD on each node, with the conflist asking for it.
    b.add(&b.pod("on-b"), "eth0", &encrypted(b, "routed"));
    a.add(&a.pod("on-a"), "eth0", &encrypted(a, "routed"));
    let on = encrypted_so_far();
    wait(
        "100 packets of the conversation encrypted",
        || encrypted_so_far() >= on + 100,
        logs.path(),
    );

    // Off again: the conflist back as it was, then each node's next ADD.
    std::fs::remove_file(&conflist).unwrap_or_else(|e| panic!("{e}"));
    b.add(&b.pod("off-b"), "eth0", &plain(b));
    a.add(&a.pod("off-a"), "eth0", &plain(a));
    std::thread::sleep(Duration::from_millis(300));
    let off = encrypted_so_far();
    let exchanges = talk.exchanges.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(encrypted_so_far(), off, "nothing encrypted once off");
    assert!(
        talk.exchanges.load(Ordering::Relaxed) >= exchanges + 50,
        "in clear again"
    );
    stop.store(true, Ordering::Relaxed);
    h.join()
        .unwrap_or_else(|_| panic!("the conversation panicked"));
    assert_eq!(
        *talk.failure.lock().unwrap_or_else(|e| e.into_inner()),
        None,
        "the conversation across both changes"
    );
}

/// Three nodes in `crossSubnet` mode (A and C on one segment, B behind the router): a
/// conversation between A's and C's pods goes on, inside WireGuard, while node B rotates
/// its key, moves to another address and back, and leaves and joins again, each picked
/// up by A and C within a second.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn another_nodes_changes_leave_a_conversation_between_two_nodes_alone() {
    let cluster = Cluster::three_nodes_across_subnets("wg_three");
    let (a, b, c) = (cluster.a(), cluster.b(), cluster.c());
    if !kernel_has_wireguard(a) {
        refused(a, "crossSubnet");
        return;
    }
    let api = ApiServer::start(cluster.ext_netns(), testbed::EXT_IP4);
    let publish = |n: &ClusterNode, ip: &str| {
        api.set_node(n.name(), &[n.pod_cidr4(), n.pod_cidr6()], &[ip]);
    };
    for n in [a, b, c] {
        publish(n, n.ip4());
    }
    let (pa, pb, pc) = (a.pod("pa"), b.pod("pb"), c.pod("pc"));
    a.add(&pa, "eth0", &encrypted(a, "crossSubnet"));
    let rb = b.add(&pb, "eth0", &encrypted(b, "crossSubnet"));
    let rc = c.add(&pc, "eth0", &encrypted(c, "crossSubnet"));
    let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents: Vec<Background> = [a, b, c]
        .iter()
        .map(|n| agent(n, &api, keys.path(), logs.path()))
        .collect();
    let peer_of = |n: &ClusterNode, of: &str| {
        device_peers(n, keys.path())
            .into_iter()
            .find(|(node, _, _)| node == of)
    };
    wait(
        "every node's device has the two others as peers",
        || {
            [a, b, c]
                .iter()
                .all(|n| device_peers(n, keys.path()).len() == 2)
        },
        logs.path(),
    );
    wait(
        "pod A reaches pods B and C",
        || {
            testbed::net::ping(pa.netns(), &rb.ip4(), 1)
                && testbed::net::ping(pa.netns(), &rc.ip4(), 1)
        },
        logs.path(),
    );

    let _echo = EchoServer::concurrent(pc.netns(), ECHO_PORT);
    let to: SocketAddr = format!("{}:{ECHO_PORT}", rc.ip4())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    // Read before the conversation starts: its first exchanges must not be counted in
    // the figure they are compared with.
    let encrypted_before = a.reason_count("wireguard_encrypt");
    let stop = Arc::new(AtomicBool::new(false));
    let (talk, h) = converse(pa.netns(), to, Arc::clone(&stop), Duration::from_secs(40));
    let within_a_second = |what: &str, f: &dyn Fn() -> bool| {
        let started = Instant::now();
        wait(what, f, logs.path());
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{what} took {took:?}");
    };

    // B rotates its key.
    let old = published(&api, "node-b").unwrap_or_default();
    let bin = testbed::plugin::plugin_bin().display().to_string();
    let key = key_file(keys.path(), b);
    let out = b.exec(&[
        bin.as_str(),
        "wireguard",
        "rotate-key",
        "--wireguard-key",
        &key,
    ]);
    assert!(out.status.success(), "rotate-key: {out:?}");
    within_a_second("A and C to take B's new key", &|| {
        let new = published(&api, "node-b").filter(|k| *k != old);
        new.is_some()
            && [a, c]
                .iter()
                .all(|n| peer_of(n, "node-b").map(|p| p.1) == new)
    });

    // B moves to another address (as a Node update says), and back.
    publish(b, "198.19.0.33");
    within_a_second("A's peer B at B's new address", &|| {
        peer_of(a, "node-b").is_some_and(|p| p.2 == format!("198.19.0.33:{PORT}"))
    });
    publish(b, b.ip4());
    within_a_second("A's peer B back at B's address", &|| {
        peer_of(a, "node-b").is_some_and(|p| p.2 == format!("{}:{PORT}", b.ip4()))
    });

    // B leaves, then joins again (its agent publishes its key on the new Node).
    api.remove_node("node-b");
    within_a_second("A and C to drop B", &|| {
        peer_of(a, "node-b").is_none() && peer_of(c, "node-b").is_none()
    });
    assert_no_ping(pa.netns(), &rb.ip4());
    publish(b, b.ip4());
    within_a_second("A and C to take B back", &|| {
        peer_of(a, "node-b").is_some() && peer_of(c, "node-b").is_some()
    });
    wait(
        "pod A reaches pod B again",
        || testbed::net::ping(pa.netns(), &rb.ip4(), 1),
        logs.path(),
    );

    stop.store(true, Ordering::Relaxed);
    h.join()
        .unwrap_or_else(|_| panic!("the conversation panicked"));
    assert_eq!(
        *talk.failure.lock().unwrap_or_else(|e| e.into_inner()),
        None,
        "the conversation between A and C while B changed"
    );
    let exchanges = talk.exchanges.load(Ordering::Relaxed);
    assert!(exchanges >= 100, "{exchanges} exchanges");
    assert!(
        a.reason_count("wireguard_encrypt") >= encrypted_before + exchanges,
        "the conversation went through WireGuard"
    );
}
