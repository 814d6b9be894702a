//! Pods across nodes that share no network segment: `crossNode: tunnel`. Two simulated
//! nodes on different subnets behind a router, with no route to any pod CIDR anywhere
//! ([`Cluster::across_subnets`]), so only the tunnel can carry pod traffic; the agent on
//! each node (`cni-ebpf agent`, watching the Nodes on the stand-in API server) keeps the
//! tunnel entries.
//!
//! Shown here: ADD makes the tunnel device and gives pods the uplink's MTU less the
//! encapsulation; nothing crosses before the agents know the nodes; then pods of both
//! nodes talk both ways over IPv4 and IPv6 (a 1 MiB echo each way too), the node reaches
//! the other node's pods, and the counters show encapsulation on one side and
//! decapsulation on the other; a packet injected into the tunnel from a host that is no
//! node is dropped; a node removed from the API loses its tunnel entries. Over an IPv6
//! underlay (nodes with IPv6 addresses only) pods of both families cross too, with the
//! larger overhead taken from their MTU. On 1400- and 9000-byte uplinks the pods get the
//! uplink's MTU less the encapsulation, large transfers cross at that size, and behind a
//! smaller link further on a datagram too large gets its ICMP error back through the
//! masquerade. In `crossSubnet` mode, nodes of one subnet are routed to each other
//! directly. On a fresh node, whose agent started before its first pod, the first pods
//! cross within a second of their ADD.

use std::{
    io,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::json;
use testbed::{
    apiserver::ApiServer,
    assert_no_ping, assert_ping,
    cluster::{Underlay, NODE_A_POD_CIDR6, NODE_B_POD_CIDR6},
    net::{echo_mib, in_netns},
    process::{device_packets, ip_json},
    Cluster, ClusterNode, EchoServer, ResultView, EXT_IP4, EXT_IP6,
};

/// Longest wait for the agents to act on a Node change.
const WAIT: Duration = Duration::from_secs(5);
const ECHO_PORT: u16 = 7070;

/// Pods `pa` on node `a` and `pb` on node `b` (their ADD results `ra`, `rb`) ping each
/// other in both families, and the counters show the tunnel carried it: node A
/// encapsulated, node B decapsulated.
fn assert_pods_cross(
    (a, pa, ra): (&ClusterNode, &testbed::Pod, &ResultView),
    (b, pb, rb): (&ClusterNode, &testbed::Pod, &ResultView),
) {
    let encap_before = a.reason_count("tunnel_encap");
    let decap_before = b.reason_count("tunnel_decap");
    assert_ping(pa.netns(), &rb.ip4());
    assert_ping(pb.netns(), &ra.ip4());
    assert_ping(pa.netns(), &rb.ip6());
    assert_ping(pb.netns(), &ra.ip6());
    assert!(
        a.reason_count("tunnel_encap") > encap_before,
        "node A encapsulated nothing"
    );
    assert!(
        b.reason_count("tunnel_decap") > decap_before,
        "node B decapsulated nothing"
    );
}

fn wait(what: &str, mut f: impl FnMut() -> bool, logs: &[&Path]) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        if Instant::now() > deadline {
            let text: Vec<String> = logs
                .iter()
                .map(|l| std::fs::read_to_string(l).unwrap_or_default())
                .collect();
            panic!(
                "{what} within {WAIT:?}; agent logs:\n{}",
                text.join("\n---\n")
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A VXLAN packet (VNI 1) holding an ICMP echo request from `inner_src` to `inner_dst`.
fn vxlan_ping(inner_src: std::net::Ipv4Addr, inner_dst: std::net::Ipv4Addr) -> Vec<u8> {
    let mut p = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00]);
    let mut ip = vec![
        0x45, 0, 0, 28, 0, 1, 0, 0, 64, 1, 0, 0, // checksum below
    ];
    ip.extend_from_slice(&inner_src.octets());
    ip.extend_from_slice(&inner_dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&ip);
    p.extend_from_slice(&icmp);
    p
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The MTU of `dev` in `netns`, as `ip -j link` shows it.
fn link_mtu(netns: &Path, dev: &str) -> u64 {
    ip_json(netns, &["link", "show", dev])[0]["mtu"]
        .as_u64()
        .unwrap_or(0)
}

/// The nodes' uplink.
const UPLINK: &str = "uplink0";

/// The tunnel device's name, as the plugin makes it.
const TUNNEL_DEVICE: &str = "cni-ebpf.vxlan";

/// Sends datagrams of `size` bytes (IP header included) with "don't fragment" from
/// `netns` to `to` until the socket refuses one as too large (`EMSGSIZE`, after the path's
/// ICMP error has come back), for at most three seconds; returns the path MTU the socket
/// then knows.
fn path_mtu_learned(netns: &Path, to: SocketAddr, size: usize) -> io::Result<u32> {
    in_netns(netns, move || {
        let v6 = to.is_ipv6();
        let s = UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" })?;
        s.connect(to)?;
        let (level, discover, mtu_opt) = if v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_MTU)
        } else {
            (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_MTU)
        };
        let on: libc::c_int = if v6 {
            libc::IPV6_PMTUDISC_DO
        } else {
            libc::IP_PMTUDISC_DO
        };
        let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4);
        // SAFETY: `s` is an open socket; the option value is a live c_int of `len` bytes.
        if unsafe { libc::setsockopt(s.as_raw_fd(), level, discover, (&raw const on).cast(), len) }
            != 0
        {
            return Err(io::Error::last_os_error());
        }
        let payload = vec![0x42_u8; size - if v6 { 48 } else { 28 }];
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match s.send(&payload) {
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => break,
                Err(e) => return Err(e),
                Ok(_) if Instant::now() > deadline => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no ICMP error came back within 3 s",
                    ))
                }
                Ok(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
        let (mut mtu, mut got): (libc::c_int, libc::socklen_t) = (0, len);
        // SAFETY: as above; `mtu` and `got` outlive the call.
        if unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                level,
                mtu_opt,
                (&raw mut mtu).cast(),
                &raw mut got,
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        u32::try_from(mtu).map_err(io::Error::other)
    })
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_on_nodes_in_two_subnets_reach_each_other_only_through_the_tunnel() {
    let cluster = Cluster::across_subnets("tunnel");
    let (a, b) = (cluster.a(), cluster.b());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[b.ip4()]);
    let conf = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("tunnel"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &conf(a));
    let rb = b.add(&pb, "eth0", &conf(b));

    // The pods' MTU: the uplink's 1500 less the 50 bytes of VXLAN over IPv4.
    let mtu = |pod: &testbed::Pod| {
        let out = pod.exec(&["ip", "-j", "link", "show", "eth0"]);
        let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
        doc[0]["mtu"].as_u64().unwrap_or(0)
    };
    assert_eq!(mtu(&pa), 1450);
    assert_eq!(mtu(&pb), 1450);

    // No agent yet: the cluster CIDRs go to the tunnel device, which knows no node.
    assert_no_ping(pa.netns(), &rb.ip4());
    assert!(a.reason_count("drop_no_tunnel_endpoint") >= 1);

    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = cluster.join_by_tunnel(&api, Underlay::V4, logs.path());
    let (log_a, log_b) = (
        logs.path().join("agent-node-a.log"),
        logs.path().join("agent-node-b.log"),
    );
    let logs = [log_a.as_path(), log_b.as_path()];

    assert_pods_cross((a, &pa, &ra), (b, &pb, &rb));
    // The node itself reaches the other node's pods through the tunnel too.
    assert_ping(a.netns(), &rb.ip4());

    // 1 MiB each way over TCP, both families, through the 1450-byte path.
    let _echo_a = EchoServer::concurrent(pa.netns(), ECHO_PORT);
    let _echo_b = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    // Each transfer's flow takes the fast path once verified: the sending node hands the
    // pod's packets straight to the tunnel device (`redirect_uplink`), the receiving node
    // delivers them straight into its pod (`redirect_from_uplink`), in both families.
    // Over this IPv4 underlay the sending node's program encapsulates them itself and
    // sends them from the uplink: the device's own transmit counter stays where it was
    // but for the few packets of a next hop not yet resolved.
    for (from, to) in [
        (pa.netns(), format!("{}:{ECHO_PORT}", rb.ip4())),
        (pb.netns(), format!("{}:{ECHO_PORT}", ra.ip4())),
        (pa.netns(), format!("[{}]:{ECHO_PORT}", rb.ip6())),
    ] {
        let to: SocketAddr = to.parse().unwrap_or_else(|e| panic!("{to}: {e}"));
        let (sender, receiver) = if from == pa.netns() { (a, b) } else { (b, a) };
        let sent = sender.reason_count("redirect_uplink");
        let delivered = receiver.reason_count("redirect_from_uplink");
        let encapsulated = sender.reason_count("tunnel_encap");
        let device_sent = device_packets(sender.netns(), TUNNEL_DEVICE, "tx");
        assert_eq!(echo_mib(from, to), 1 << 20, "echo to {to}");
        let sent = sender.reason_count("redirect_uplink") - sent;
        let delivered = receiver.reason_count("redirect_from_uplink") - delivered;
        let encapsulated = sender.reason_count("tunnel_encap") - encapsulated;
        let device_sent = device_packets(sender.netns(), TUNNEL_DEVICE, "tx") - device_sent;
        assert!(
            sent >= 10 && delivered >= 10,
            "echo to {to}: {sent} packets handed to the tunnel device, {delivered} \
             delivered into the pod past the stack"
        );
        assert!(
            encapsulated >= 10 && device_sent * 10 <= encapsulated,
            "echo to {to}: {encapsulated} packets encapsulated, {device_sent} of them \
             sent by the device rather than by the program"
        );
    }

    // Small exchanges on one connection: once its flow is verified, each node's
    // program takes the headers off the packets that come out of the tunnel and
    // delivers them itself, past the device, so the uplink receives more packets than
    // the device does. (A transfer's segments, above, go through the device, whose
    // receive merges them; so do the packets of their flow right after them.)
    let arrived = |n: &ClusterNode| device_packets(n.netns(), UPLINK, "rx");
    let received = |n: &ClusterNode| device_packets(n.netns(), TUNNEL_DEVICE, "rx");
    let before = [(arrived(a), received(a)), (arrived(b), received(b))];
    let to: SocketAddr = format!("{}:{ECHO_PORT}", rb.ip4())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let (talk, h) = testbed::net::converse(pa.netns(), to, stop, Duration::from_millis(600));
    h.join()
        .unwrap_or_else(|_| panic!("the conversation panicked"));
    assert_eq!(
        *talk.failure.lock().unwrap_or_else(|e| e.into_inner()),
        None
    );
    let exchanges = talk.exchanges.load(Ordering::Relaxed);
    assert!(exchanges >= 20, "{exchanges} exchanges with {to}");
    for (n, (arrived_before, received_before)) in [a, b].into_iter().zip(before) {
        let arrived = arrived(n) - arrived_before;
        let received = received(n) - received_before;
        assert!(
            arrived >= received + exchanges / 2,
            "{} exchanges with {to}: {arrived} packets arrived on node {}'s uplink, \
             {received} of them received by its tunnel device",
            exchanges,
            n.name()
        );
    }

    // A host that is no node injects a packet into node A's tunnel, claiming a source in
    // node B's pod CIDR: dropped.
    let spoofed_before = a.reason_count("drop_tunnel_spoofed");
    let packet = vxlan_ping(
        "10.244.2.77".parse().unwrap_or_else(|e| panic!("{e}")),
        ra.ip4().parse().unwrap_or_else(|e| panic!("{e}")),
    );
    let to: SocketAddr = format!("{}:8472", a.ip4())
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    in_netns(cluster.ext_netns(), move || {
        UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(&packet, to))
    })
    .unwrap_or_else(|e| panic!("injecting into the tunnel: {e}"));
    wait(
        "the injected packet to be dropped as spoofed",
        || a.reason_count("drop_tunnel_spoofed") > spoofed_before,
        &logs,
    );

    // A Node without an address to tunnel to: no entry, a Warning Event on it and a log
    // line, and the other entries stay.
    api.set_node("node-x", &["10.244.9.0/24"], &[]);
    wait(
        "a TunnelEndpointUnknown Event on node-x",
        || {
            api.events().iter().any(|e| {
                e["reason"] == "TunnelEndpointUnknown"
                    && e["regarding"]["name"] == "node-x"
                    && e["regarding"]["kind"] == "Node"
                    && e["type"] == "Warning"
            })
        },
        &logs,
    );
    let log_a_text = std::fs::read_to_string(&log_a).unwrap_or_default();
    assert!(
        log_a_text.contains("no tunnel entry: node node-x: no InternalIP"),
        "{log_a_text}"
    );
    assert!(a.tunnels_to(b, Underlay::V4));
    assert_ping(pa.netns(), &rb.ip4());

    // Node B leaves the cluster: node A forgets its pod CIDRs, its pods are cut off.
    api.remove_node("node-b");
    wait(
        "node A to forget node B",
        || !a.tunnels_to(b, Underlay::V4),
        &logs,
    );
    assert_no_ping(pa.netns(), &rb.ip4());
}

/// A device named like the tunnel that cni-ebpf did not create is never taken over: ADD
/// fails with a configuration error naming it, and the device stays as it was.
/// A fresh node, as the DaemonSet starts it: each node's agent runs before any pod, so
/// the first ADD loads the node's datapath after its agent started. The agent acts on the
/// new datapath at once (not at its next check, 30 s here): the first pods' first
/// connection across the tunnel succeeds within a second of their ADDs, both ways.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_fresh_nodes_first_pods_reach_the_other_node_within_a_second() {
    let cluster = Cluster::across_subnets("tunnel_fresh");
    let (a, b) = (cluster.a(), cluster.b());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4(), NODE_A_POD_CIDR6], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4(), NODE_B_POD_CIDR6], &[b.ip4()]);
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (log_a, log_b) = (
        logs.path().join("agent-node-a.log"),
        logs.path().join("agent-node-b.log"),
    );
    let _agents = [
        a.start_node_agent(&api, &log_a),
        b.start_node_agent(&api, &log_b),
    ];
    // The agents' first rounds, on nodes without a datapath.
    thread::sleep(Duration::from_secs(1));
    let conf = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("tunnel"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &conf(a));
    let rb = b.add(&pb, "eth0", &conf(b));
    let added = Instant::now();
    let _echo_a = EchoServer::concurrent(pa.netns(), ECHO_PORT);
    let _echo_b = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    let first_connection = |from: &Path, to: String| -> Duration {
        let to: SocketAddr = to.parse().unwrap_or_else(|e| panic!("{to}: {e}"));
        in_netns(from, move || {
            while added.elapsed() < Duration::from_secs(10) {
                if std::net::TcpStream::connect_timeout(&to, Duration::from_millis(100)).is_ok() {
                    return added.elapsed();
                }
                thread::sleep(Duration::from_millis(10));
            }
            added.elapsed()
        })
    };
    let ab = first_connection(pa.netns(), format!("{}:{ECHO_PORT}", rb.ip4()));
    let ba = first_connection(pb.netns(), format!("{}:{ECHO_PORT}", ra.ip4()));
    eprintln!("first connection after the ADDs: a → b {ab:?}, b → a {ba:?}");
    let agent_logs = || {
        [&log_a, &log_b]
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(
        ab < Duration::from_secs(1) && ba < Duration::from_secs(1),
        "the first pods waited for the agents' periodic check: a → b {ab:?}, b → a {ba:?}\n{}",
        agent_logs()
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_foreign_device_of_the_tunnels_name_is_refused_and_left_alone() {
    let node = testbed::SimNode::new("tunnel_foreign");
    let made = node.exec(&[
        "ip",
        "link",
        "add",
        "cni-ebpf.vxlan",
        "type",
        "veth",
        "peer",
        "name",
        "foreign-peer",
    ]);
    assert!(made.success(), "{made:?}");
    let pod = node.pod("p");
    let conf = node.conf().set("crossNode", json!("tunnel"));
    let out = node.exec_plugin("ADD", &pod.env("eth0"), &conf.plugin());
    let err = out.error();
    assert_eq!(err.code, 7, "{err:?}");
    assert!(
        err.msg.contains("crossNode") && err.msg.contains("did not create"),
        "{err:?}"
    );
    let shown = node
        .exec(&["ip", "-d", "link", "show", "cni-ebpf.vxlan"])
        .stdout;
    assert!(
        shown.contains("veth") && shown.contains("state DOWN"),
        "the foreign device changed: {shown}"
    );
}

/// A tunnel port another VXLAN device holds (here one with VNI 1, the default VNI too):
/// ADD fails with a configuration error naming `tunnelPort`, and leaves no tunnel device
/// and no pod interface behind; the other device stays up. On another port the same VNI
/// is no conflict (an external-mode device takes every VNI of its own port only).
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_tunnel_port_another_device_holds_is_refused_and_nothing_is_left() {
    let node = testbed::SimNode::new("tunnel_port");
    for argv in [
        &[
            "ip", "link", "add", "other0", "type", "vxlan", "id", "1", "dstport", "8472", "dev",
            "uplink0",
        ][..],
        &["ip", "link", "set", "other0", "up"],
    ] {
        let out = node.exec(argv);
        assert!(out.success(), "{out}");
    }
    let pod = node.pod("p");
    let conf = node.conf().set("crossNode", json!("tunnel"));
    let err = node
        .exec_plugin("ADD", &pod.env("eth0"), &conf.plugin())
        .error();
    assert_eq!(err.code, 7, "{err:?}");
    assert!(
        err.msg.contains("tunnelPort") && err.msg.contains("8472"),
        "{err:?}"
    );
    let left = node.exec(&["ip", "link", "show", "cni-ebpf.vxlan"]);
    assert!(!left.success(), "a tunnel device was left: {left}");
    let other = node.exec(&["ip", "-d", "link", "show", "other0"]).stdout;
    assert!(
        other.contains("vxlan id 1") && other.contains(",UP"),
        "{other}"
    );
    let links = pod.exec(&["ip", "-j", "link", "show"]);
    let links: serde_json::Value = serde_json::from_str(&links.stdout).unwrap_or_default();
    assert_eq!(
        links.as_array().map(Vec::len),
        Some(1),
        "the pod has more than its loopback: {links}"
    );

    let conf = conf.set("tunnelPort", json!(4789));
    let r = node.add(&pod, "eth0", &conf);
    assert!(!r.ip4().is_empty());
    let ours = node
        .exec(&["ip", "-d", "link", "show", "cni-ebpf.vxlan"])
        .stdout;
    assert!(
        ours.contains("dstport 4789") && ours.contains("external"),
        "{ours}"
    );
}

/// `crossNode: crossSubnet` on two nodes of one subnet: the agent routes each other's pod
/// CIDRs directly via the node's address (`proto 207`), so pod traffic crosses without
/// encapsulation (the tunnel counts nothing); the tunnel entries are kept all the same.
/// `uninstall --purge` removes the tunnel device and its routes.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cross_subnet_mode_routes_the_nodes_of_the_uplinks_subnet_directly() {
    let cluster = Cluster::without_pod_routes("crosssubnet");
    let (a, b) = (cluster.a(), cluster.b());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.set_node("node-a", &[a.pod_cidr4()], &[a.ip4()]);
    api.set_node("node-b", &[b.pod_cidr4()], &[b.ip4()]);
    let conf = |n: &ClusterNode| n.conf().set("crossNode", json!("crossSubnet"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &conf(a));
    let rb = b.add(&pb, "eth0", &conf(b));

    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (log_a, log_b) = (logs.path().join("a.log"), logs.path().join("b.log"));
    let _agent_a = a.start_node_agent(&api, &log_a);
    let _agent_b = b.start_node_agent(&api, &log_b);
    let logs = [log_a.as_path(), log_b.as_path()];
    let direct = |n: &ClusterNode, other: &ClusterNode| {
        let out = n.exec(&["ip", "route", "show", other.pod_cidr4(), "proto", "207"]);
        out.stdout.contains(&format!("via {}", other.ip4()))
    };
    wait(
        "node A's direct route to node B's pods",
        || direct(a, b),
        &logs,
    );
    wait(
        "node B's direct route to node A's pods",
        || direct(b, a),
        &logs,
    );

    let encap_before = a.reason_count("tunnel_encap");
    assert_ping(pa.netns(), &rb.ip4());
    assert_ping(pb.netns(), &ra.ip4());
    assert_eq!(
        a.reason_count("tunnel_encap"),
        encap_before,
        "a node of the same subnet went through the tunnel"
    );
    assert!(
        a.pinned_datapath()
            .tunnel_endpoints()
            .unwrap_or_default()
            .iter()
            .any(|(_, node)| node.to_string() == b.ip4()),
        "node A keeps node B's tunnel entry"
    );

    // `uninstall --purge` takes the tunnel device, and with it its routes.
    a.del(&pa, "eth0", &conf(a));
    let purge = a.uninstall_purge();
    assert!(purge.success(), "uninstall --purge: {purge}");
    let left = a.exec(&["ip", "link", "show", "cni-ebpf.vxlan"]);
    assert!(!left.success(), "the tunnel device is still there: {left}");
    let routes = a.exec(&["ip", "route", "show", "proto", "208"]).stdout;
    assert!(routes.trim().is_empty(), "tunnel routes left: {routes}");
}

/// Nodes with IPv6 addresses only: the Node objects publish IPv6 InternalIPs, so the
/// tunnel runs over IPv6, and the pods' MTU leaves room for the larger outer header
/// (1500 − 70). IPv4 and IPv6 pods cross both ways.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn pods_of_both_families_cross_an_ipv6_underlay() {
    let cluster = Cluster::across_subnets("tunnel6");
    let (a, b) = (cluster.a(), cluster.b());
    for n in [a, b] {
        let out = n.exec(&["ip", "-4", "addr", "flush", "dev", "uplink0"]);
        assert!(out.success(), "{out}");
    }
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP6);
    let conf = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("tunnel"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &conf(a));
    let rb = b.add(&pb, "eth0", &conf(b));
    assert_eq!(link_mtu(pa.netns(), "eth0"), 1430);
    assert_eq!(link_mtu(a.netns(), TUNNEL_DEVICE), 1430);

    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = cluster.join_by_tunnel(&api, Underlay::V6, logs.path());
    assert_pods_cross((a, &pa, &ra), (b, &pb, &rb));
    let _echo_b = EchoServer::concurrent(pb.netns(), ECHO_PORT);
    for to in [
        format!("{}:{ECHO_PORT}", rb.ip4()),
        format!("[{}]:{ECHO_PORT}", rb.ip6()),
    ] {
        let to: SocketAddr = to.parse().unwrap_or_else(|e| panic!("{to}: {e}"));
        assert_eq!(echo_mib(pa.netns(), to), 1 << 20, "echo to {to}");
    }
}

/// Uplinks (and the whole fabric) at `uplink` bytes, no `mtu` in the conflist: pods and
/// the tunnel device get `uplink` − 50; 1 MiB crosses each way between pods of the two
/// nodes and to the outside, in both families. Then the router's link towards `ext`
/// carries only `path` bytes: a datagram between `path` and the pod's MTU, sent with
/// "don't fragment" from node B's pod to `ext` (masqueraded), gets the router's
/// "fragmentation needed" / "packet too big" back through node B's translation, so the
/// pod's socket learns `path`; and 1 MiB still crosses each way over TCP.
fn mtu_follows_the_uplink(test: &str, uplink: u32, path: u32) {
    let cluster = Cluster::across_subnets(test);
    cluster.set_mtu(uplink);
    let (a, b) = (cluster.a(), cluster.b());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    let conf = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("tunnel"));
    let (pa, pb) = (a.pod("pa"), b.pod("pb"));
    let ra = a.add(&pa, "eth0", &conf(a));
    let rb = b.add(&pb, "eth0", &conf(b));
    let pod_mtu = uplink - 50;
    for (ns, dev) in [
        (pa.netns(), "eth0"),
        (pb.netns(), "eth0"),
        (a.netns(), "cni-ebpf.vxlan"),
    ] {
        assert_eq!(link_mtu(ns, dev), u64::from(pod_mtu), "MTU of {dev}");
    }
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _agents = cluster.join_by_tunnel(&api, Underlay::V4, logs.path());

    let _echo = [
        EchoServer::concurrent(pa.netns(), ECHO_PORT),
        EchoServer::concurrent(pb.netns(), ECHO_PORT),
        EchoServer::concurrent(cluster.ext_netns(), ECHO_PORT),
    ];
    let to_ext = [
        format!("{EXT_IP4}:{ECHO_PORT}"),
        format!("[{EXT_IP6}]:{ECHO_PORT}"),
    ];
    let transfers = |pairs: &[(&Path, String)]| {
        for (from, to) in pairs {
            let to: SocketAddr = to.parse().unwrap_or_else(|e| panic!("{to}: {e}"));
            assert_eq!(echo_mib(from, to), 1 << 20, "1 MiB echo to {to}");
        }
    };
    transfers(&[
        (pa.netns(), format!("{}:{ECHO_PORT}", rb.ip4())),
        (pb.netns(), format!("{}:{ECHO_PORT}", ra.ip4())),
        (pa.netns(), format!("[{}]:{ECHO_PORT}", rb.ip6())),
        (pb.netns(), to_ext[0].clone()),
        (pb.netns(), to_ext[1].clone()),
    ]);

    // A smaller link further on: the router forwards at most `path` bytes towards `ext`.
    let router = cluster.fabric_netns();
    for (family, dst) in [
        ("-4", format!("{EXT_IP4}/32")),
        ("-6", format!("{EXT_IP6}/128")),
    ] {
        let out = testbed::process::netns_exec(
            router,
            &[
                "ip",
                family,
                "route",
                "replace",
                &dst,
                "dev",
                "br0",
                "mtu",
                "lock",
                &path.to_string(),
            ],
        );
        assert!(out.success(), "{out}");
    }
    let size = usize::try_from((path + pod_mtu) / 2).unwrap_or(0);
    for ext in [EXT_IP4, EXT_IP6] {
        let to: SocketAddr = if ext.contains(':') {
            format!("[{ext}]:9")
        } else {
            format!("{ext}:9")
        }
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
        let learned = path_mtu_learned(pb.netns(), to, size)
            .unwrap_or_else(|e| panic!("a {size}-byte datagram to {to}: {e}"));
        assert_eq!(
            learned, path,
            "the path MTU node B's pod learned towards {to}"
        );
    }
    transfers(&[
        (pb.netns(), to_ext[0].clone()),
        (pb.netns(), to_ext[1].clone()),
    ]);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn on_1400_byte_uplinks_pods_get_1350_and_a_smaller_path_is_found() {
    mtu_follows_the_uplink("mtu1400", 1400, 1300);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn on_9000_byte_uplinks_pods_get_8950_and_a_smaller_path_is_found() {
    mtu_follows_the_uplink("mtu9000", 9000, 1500);
}

/// `crossSubnet` on three nodes: A and C share a subnet, B sits behind the router. The
/// agents route A ↔ C directly (`proto 207`) and tunnel everything to and from B; every
/// ordered pair of pods talks, and the tunnel counters move exactly for the pairs that
/// involve B.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cross_subnet_encapsulates_only_the_pairs_across_the_router() {
    let cluster = Cluster::three_nodes_across_subnets("xsub3");
    let nodes = [cluster.a(), cluster.b(), cluster.c()];
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    for n in nodes {
        api.set_node(n.name(), &[n.pod_cidr4(), n.pod_cidr6()], &[n.ip4()]);
    }
    let conf = |n: &ClusterNode| n.conf_dual_stack().set("crossNode", json!("crossSubnet"));
    let pods: Vec<(testbed::Pod, String)> = nodes
        .iter()
        .map(|n| {
            let pod = n.pod("p");
            let r = n.add(&pod, "eth0", &conf(n));
            (pod, r.ip4())
        })
        .collect();
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log_paths: Vec<_> = nodes
        .iter()
        .map(|n| logs.path().join(format!("{}.log", n.name())))
        .collect();
    let _agents: Vec<_> = nodes
        .iter()
        .zip(&log_paths)
        .map(|(n, log)| n.start_node_agent(&api, log))
        .collect();
    let logs: Vec<&Path> = log_paths.iter().map(PathBuf::as_path).collect();
    let direct = |n: &ClusterNode, other: &ClusterNode| {
        let out = n.exec(&["ip", "route", "show", other.pod_cidr4(), "proto", "207"]);
        out.stdout.contains(&format!("via {}", other.ip4()))
    };
    let (a, b, c) = (nodes[0], nodes[1], nodes[2]);
    wait("A's direct route to C", || direct(a, c), &logs);
    wait("C's direct route to A", || direct(c, a), &logs);
    for (n, other) in [(a, b), (c, b), (b, a), (b, c)] {
        wait(
            &format!("{}'s tunnel entry for {}", n.name(), other.name()),
            || n.tunnels_to(other, Underlay::V4),
            &logs,
        );
    }
    assert!(!direct(a, b) && !direct(b, a) && !direct(b, c) && !direct(c, b));

    let mut report = Vec::new();
    for (i, from) in nodes.iter().enumerate() {
        for (j, to) in nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            let across = from.name() == "node-b" || to.name() == "node-b";
            let (encap, decap) = (
                from.reason_count("tunnel_encap"),
                to.reason_count("tunnel_decap"),
            );
            assert_ping(pods[i].0.netns(), &pods[j].1);
            let (encap, decap) = (
                from.reason_count("tunnel_encap") - encap,
                to.reason_count("tunnel_decap") - decap,
            );
            report.push(format!(
                "{} → {}: {encap} encapsulated, {decap} decapsulated",
                from.name(),
                to.name()
            ));
            assert_eq!(
                (encap > 0, decap > 0),
                (across, across),
                "{} → {}: {encap} encapsulated, {decap} decapsulated; expected {}",
                from.name(),
                to.name(),
                if across {
                    "the tunnel"
                } else {
                    "a direct route"
                }
            );
        }
    }
    eprintln!("{}", report.join("\n"));
}
