//! End to end, every kind of traffic a Kubernetes cluster needs (the rows of
//! [`service_rows`] and [`plain_rows`]: ClusterIP, NodePort, host network, pod → pod
//! across nodes, masquerade, host ports) on two simulated nodes ([`Cluster`]), with
//! kube-proxy's rules loaded in iptables mode, in nftables mode, with no kube-proxy and
//! the agent's replacement on, and — for the rows that need no Service — with no
//! kube-proxy at all. The Service variants run twice: on nodes whose pod CIDRs the fabric
//! routes (`crossNode: routed`), and on nodes in two subnets behind a router that routes
//! no pod CIDR, joined only by the tunnel (`crossNode: tunnel`; node B is then
//! `198.19.0.3` / `fd00:198:19::3`).
//!
//! One cluster per test function. Each row is checked in turn with short bounded timeouts
//! (a broken row costs about two seconds) and reported on stderr as it goes; at the end the
//! test fails naming every row that failed and why (`timed out`, `refused`, a wrong peer
//! address), so one run shows the whole table.
//!
//! The cluster (addresses in `tests::cluster`):
//! - node A (`198.18.0.1`): pod `a1` (the endpoint of every Service, a "who am I" server
//!   on 8080 TCP+UDP, hostPort 18080 → 8080 TCP+UDP) and pod `a2` (a client);
//! - node B (`198.18.0.3`): pod `b1` (a server on 8080) and pod `b2` (a client);
//! - `ext` (`198.18.0.2`, both nodes' gateway): a server on 8080, and the external client.
//!
//! Services (both nodes render all of them, each with its own view of which endpoint is
//! local): `default/web` ClusterIP 10.96.0.10 port 80/TCP and 53/UDP (DNS-like);
//! `default/np-cluster` 10.96.0.11 NodePort 30080 (`externalTrafficPolicy: Cluster`);
//! `default/np-local` 10.96.0.12 NodePort 30081 (`Local`); each with the single endpoint
//! `a1:8080` (so the port is translated too, as with a `targetPort`).
//!
//! The row "node's own host network → its hostPort" runs its client as a process inside a
//! cgroup-v2 directory the test creates, passed to node A's plugin as `cgroupPath` (where
//! the socket-level hook for locally generated traffic attaches).
//!
//! Dual stack: the cluster is dual-stack (pods in `fd00:10:244:1::/64` and
//! `fd00:10:244:2::/64`, routed to each other; nodes `fd00:198:18::1` and `::3`, `ext`
//! `fd00:198:18::2`), and every row is also checked over IPv6: each Service has an IPv6
//! twin in `fd00:10:96::/112` (`::10`, `::11`, `::12`, the same ports and NodePorts, as a
//! dual-stack Service has), rendered by kube-proxy's IPv6 proxier (`ip6tables` /
//! `table ip6 kube-proxy`) next to the IPv4 one.

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    time::Duration,
};

use serde_json::json;
use tests::{
    apiserver::ApiServer,
    cluster::Underlay,
    kubeproxy::{Mode, Protocol, ServicePort, TrafficPolicy},
    net::{in_netns, sock_addr},
    process::Background,
    Cluster, ClusterNode, ConfBuilder, EchoServer, Pod, TestCgroup, WhoAmIServer, EXT_IP4, EXT_IP6,
};

/// Per-step bound of every client (connect, send, receive).
const T: Duration = Duration::from_secs(2);
/// The port every server listens on (TCP and UDP).
const PORT: u16 = 8080;
/// Node A's hostPort for pod `a1`'s `PORT` (TCP and UDP).
const HOST_PORT: u16 = 18080;
/// `default/web`'s ClusterIP, TCP port and UDP port.
const WEB: (&str, u16, u16) = ("10.96.0.10", 80, 53);
/// `default/np-cluster`'s ClusterIP and NodePort.
const NP_CLUSTER: (&str, u16) = ("10.96.0.11", 30080);
/// `default/np-local`'s ClusterIP and NodePort.
const NP_LOCAL: (&str, u16) = ("10.96.0.12", 30081);
/// The IPv6 ClusterIPs of `default/web`, `default/np-cluster` and `default/np-local`.
const CLUSTER_IPS6: [&str; 3] = ["fd00:10:96::10", "fd00:10:96::11", "fd00:10:96::12"];
/// The port of the echo servers (TCP) used by the long conversations.
const ECHO_PORT: u16 = 8081;
/// Round trips and bulk bytes (each way) of one long conversation.
const CONVERSATION: (usize, usize) = (200, 1 << 20);
/// The one-shot client process (see `src/bin/cni-ebpf-netclient.rs`).
const NETCLIENT: &str = env!("CARGO_BIN_EXE_cni-ebpf-netclient");

// ------------------------------------------------------------------------------------
// Traffic

/// How a request failed, in the words the row report uses.
fn describe(stage: &str, e: &io::Error) -> String {
    let what = match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timed out",
        io::ErrorKind::ConnectionRefused => "refused",
        io::ErrorKind::ConnectionReset => "reset",
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => "unreachable",
        _ => "failed",
    };
    format!("{stage} {what} ({e})")
}

/// The peer a "who am I" server saw (`ip:port`, first line of its answer).
fn peer_of(answer: &str) -> String {
    answer.lines().next().unwrap_or_default().trim().to_owned()
}

fn ip_part(peer: &str) -> &str {
    peer.rsplit_once(':').map_or(peer, |(ip, _)| ip)
}

/// TCP from `netns` to `addr`: the peer the server saw, or which step failed.
fn tcp(netns: &Path, addr: &str) -> Result<String, String> {
    let to = sock_addr(addr);
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&to, T).map_err(|e| describe("connect", &e))?;
        let _ = s.set_read_timeout(Some(T));
        let _ = s.set_write_timeout(Some(T));
        s.write_all(b"hello").map_err(|e| describe("send", &e))?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)
            .map_err(|e| describe("connected, but the answer", &e))?;
        if answer.is_empty() {
            return Err("connected, but the server closed without answering".to_owned());
        }
        Ok(peer_of(&answer))
    })
}

/// UDP from `netns` to `addr` (two tries): the peer the server saw and the address the
/// answer came from, or why there was none.
fn udp(netns: &Path, addr: &str) -> Result<(String, SocketAddr), String> {
    let to = sock_addr(addr);
    let bind = if to.is_ipv6() {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    };
    in_netns(netns, move || {
        let s = UdpSocket::bind(bind).map_err(|e| describe("bind", &e))?;
        let _ = s.set_read_timeout(Some(T / 2));
        let mut last = io::Error::from(io::ErrorKind::TimedOut);
        for _ in 0..2 {
            s.send_to(b"hello", to).map_err(|e| describe("send", &e))?;
            let mut buf = [0u8; 512];
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    return Ok((peer_of(&String::from_utf8_lossy(&buf[..n])), from));
                }
                Err(e) => last = e,
            }
        }
        Err(describe("answer", &last))
    })
}

/// A long TCP conversation from `netns` to an echo server at `addr`: `CONVERSATION.0`
/// small round trips, then `CONVERSATION.1` bytes sent and echoed back. Many packets each
/// way on one connection: a flow whose directions took different paths (one past
/// conntrack, one through it) would have the acknowledgements of unseen data dropped as
/// INVALID by kube-proxy's iptables rules.
fn conversation(netns: &Path, addr: &str) -> Result<String, String> {
    let to = sock_addr(addr);
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&to, T).map_err(|e| describe("connect", &e))?;
        let _ = s.set_read_timeout(Some(T));
        let _ = s.set_write_timeout(Some(T));
        let mut buf = [0u8; 64];
        for i in 0..CONVERSATION.0 {
            let msg = format!("round trip {i:08}");
            s.write_all(msg.as_bytes())
                .map_err(|e| describe(&format!("send #{i}"), &e))?;
            s.read_exact(&mut buf[..msg.len()])
                .map_err(|e| describe(&format!("echo #{i}"), &e))?;
            if &buf[..msg.len()] != msg.as_bytes() {
                return Err(format!("echo #{i} came back changed"));
            }
        }
        let bulk: Vec<u8> = (0..CONVERSATION.1).map(|i| (i % 251) as u8).collect();
        let mut reader = s.try_clone().map_err(|e| describe("clone", &e))?;
        let sender = std::thread::spawn(move || s.write_all(&bulk).map(|()| s));
        let mut back = vec![0u8; CONVERSATION.1];
        reader
            .read_exact(&mut back)
            .map_err(|e| describe("bulk echo", &e))?;
        let _ = sender.join();
        if back.iter().enumerate().any(|(i, b)| *b != (i % 251) as u8) {
            return Err("the bulk echo came back changed".to_owned());
        }
        Ok(format!(
            "{} round trips, {} KiB each way",
            CONVERSATION.0,
            CONVERSATION.1 / 1024
        ))
    })
}

/// `tcp`, and the server must have seen `want_ip`.
fn tcp_seen_as(netns: &Path, addr: &str, want_ip: &str) -> Result<String, String> {
    seen_as(&tcp(netns, addr)?, want_ip)
}

/// Whether the server saw `peer` as `want_ip`, in the words of the row report.
fn seen_as(peer: &str, want_ip: &str) -> Result<String, String> {
    if ip_part(peer) == want_ip {
        Ok(format!("seen as {peer}"))
    } else {
        Err(format!(
            "answered, but the server saw {peer}, not {want_ip}"
        ))
    }
}

/// `udp`, the server must have seen `want_ip` and the answer must come from `addr`
/// (a translated destination is translated back).
fn udp_seen_as(netns: &Path, addr: &str, want_ip: &str) -> Result<String, String> {
    let (peer, from) = udp(netns, addr)?;
    if from != sock_addr(addr) {
        return Err(format!(
            "answered from {from}, not from {addr} (reply not translated back)"
        ));
    }
    if ip_part(&peer) == want_ip {
        Ok(format!("seen as {peer}"))
    } else {
        Err(format!(
            "answered, but the server saw {peer}, not {want_ip}"
        ))
    }
}

/// Runs [`NETCLIENT`] with `proto` to `addr` inside `netns` and the cgroup `cg`: the peer
/// the server saw (and the client's socket must show `addr` as its peer), or why not.
fn client_process(
    cg: &TestCgroup,
    netns: &Path,
    proto: &str,
    addr: &str,
) -> Result<String, String> {
    process_peer(cg, netns, proto, addr).map(|peer| format!("seen as {peer}"))
}

/// [`client_process`]'s peer.
fn process_peer(cg: &TestCgroup, netns: &Path, proto: &str, addr: &str) -> Result<String, String> {
    let ms = T.as_millis().to_string();
    let out = cg.exec_in(netns, &[NETCLIENT, proto, addr, "hello", &ms]);
    if !out.success() {
        let err = out.stderr.trim();
        return Err(if err.contains("timed-out") {
            format!("timed out ({err})")
        } else if err.contains("refused") {
            format!("refused ({err})")
        } else {
            format!("failed: {out}")
        });
    }
    // The address the client's socket shows as its peer (TCP: `getpeername`, UDP: the
    // answer's source): the one it asked for, whatever the hooks sent it to.
    let mut lines = out.stdout.lines();
    let from = lines.next().unwrap_or_default();
    if from != format!("from {addr}") {
        return Err(format!("answered {from}, expected from {addr}"));
    }
    Ok(lines.next().unwrap_or_default().trim().to_owned())
}

// ------------------------------------------------------------------------------------
// Reporting

/// The outcome of every row of one test, printed as it goes.
struct Rows {
    variant: String,
    proxy: Proxy,
    results: Vec<(String, Result<String, String>)>,
}

impl Rows {
    fn new(proxy: Proxy, cross: CrossNode) -> Self {
        let name = match proxy {
            Proxy::None => "no kube-proxy".to_owned(),
            Proxy::Rules(m) => format!("kube-proxy {}", m.name()),
            Proxy::Replacement => "kube-proxy replacement".to_owned(),
        };
        Self {
            variant: match cross {
                CrossNode::Routed => name,
                CrossNode::Tunnel => format!("tunnel, {name}"),
            },
            proxy,
            results: Vec::new(),
        }
    }

    fn check(&mut self, row: &str, outcome: Result<String, String>) {
        match &outcome {
            Ok(detail) => eprintln!("[{}] ok      {row}: {detail}", self.variant),
            Err(why) => eprintln!("[{}] FAILED  {row}: {why}", self.variant),
        }
        self.results.push((row.to_owned(), outcome));
    }

    /// Panics listing every failed row (and which passed). Before that, in iptables mode,
    /// prints the DROP/REJECT rules of each node that matched packets: a row broken by a
    /// fast path that skipped conntrack shows up there (e.g. `--ctstate INVALID -j DROP`).
    #[track_caller]
    fn assert_all_answered(self, cluster: &Cluster) {
        let any_failed = self.results.iter().any(|(_, r)| r.is_err());
        if any_failed && self.proxy == Proxy::Rules(Mode::Iptables) {
            for (node, tool) in cluster
                .nodes()
                .into_iter()
                .flat_map(|n| [(n, "iptables-save"), (n, "ip6tables-save")])
            {
                let save = node.exec(&[tool, "-c"]);
                let hits: Vec<&str> = save
                    .stdout
                    .lines()
                    .filter(|l| l.starts_with('[') && !l.starts_with("[0:0]"))
                    .filter(|l| l.contains("-j DROP") || l.contains("-j REJECT"))
                    .collect();
                eprintln!(
                    "[{}] {} ({tool}): DROP/REJECT rules that matched packets \
                     [packets:bytes]:\n  {}",
                    self.variant,
                    node.name(),
                    if hits.is_empty() {
                        "none".to_owned()
                    } else {
                        hits.join("\n  ")
                    }
                );
            }
        }
        let failed: Vec<String> = self
            .results
            .iter()
            .filter_map(|(row, r)| r.as_ref().err().map(|why| format!("  {row}: {why}")))
            .collect();
        let passed: Vec<&str> = self
            .results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(row, _)| row.as_str())
            .collect();
        assert!(
            failed.is_empty(),
            "{}: {} of {} rows failed:\n{}\npassed: {passed:#?}",
            self.variant,
            failed.len(),
            self.results.len(),
            failed.join("\n")
        );
    }
}

// ------------------------------------------------------------------------------------
// The cluster of these tests

/// A running pod: its namespace and addresses.
struct Running {
    pod: Pod,
    ip4: String,
    ip6: String,
}

impl Running {
    /// The pod's address of family `f`.
    fn ip(&self, f: Fam) -> &str {
        match f {
            Fam::V4 => &self.ip4,
            Fam::V6 => &self.ip6,
        }
    }
}

/// The address family a row runs over.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fam {
    V4,
    V6,
}

impl Fam {
    /// `ip:port`, or `[ip]:port` for IPv6.
    fn join(self, ip: &str, port: u16) -> String {
        match self {
            Fam::V4 => format!("{ip}:{port}"),
            Fam::V6 => format!("[{ip}]:{port}"),
        }
    }

    /// What a row's name starts with.
    fn label(self) -> &'static str {
        match self {
            Fam::V4 => "",
            Fam::V6 => "[IPv6] ",
        }
    }

    /// `ext`'s address.
    fn ext(self) -> &'static str {
        match self {
            Fam::V4 => EXT_IP4,
            Fam::V6 => EXT_IP6,
        }
    }

    /// Node A's and node B's addresses in `cluster`.
    fn nodes(self, cluster: &Cluster) -> (&'static str, &'static str) {
        let ip = |n: &ClusterNode| match self {
            Fam::V4 => n.ip4(),
            Fam::V6 => n.ip6(),
        };
        (ip(cluster.a()), ip(cluster.b()))
    }

    /// The ClusterIPs of `default/web`, `default/np-cluster`, `default/np-local`.
    fn cluster_ips(self) -> [&'static str; 3] {
        match self {
            Fam::V4 => [WEB.0, NP_CLUSTER.0, NP_LOCAL.0],
            Fam::V6 => CLUSTER_IPS6,
        }
    }
}

/// What translates Services on the nodes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Proxy {
    /// Nothing: only the rows without a Service run.
    None,
    /// kube-proxy's rules in this mode.
    Rules(Mode),
    /// The agent's `--kube-proxy-replacement`, from Services and EndpointSlices in the
    /// stand-in API server.
    Replacement,
}

/// How pods reach the other node's pods: the fabric's static routes (`routed`), or the
/// VXLAN tunnel between nodes in different subnets (`tunnel`, see [`world`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CrossNode {
    Routed,
    Tunnel,
}

/// The cluster, its pods and servers. Field order is drop order: servers stop before
/// their namespaces go, the agents before their nodes, the cgroup is removed before the
/// cluster.
struct World {
    _servers: Vec<WhoAmIServer>,
    _echo: Vec<EchoServer>,
    _agents: Vec<Background>,
    _api: Option<ApiServer>,
    _agent_logs: Option<tempfile::TempDir>,
    cross: CrossNode,
    proxy: Proxy,
    a1: Running,
    a2: Running,
    b1: Running,
    b2: Running,
    cgroup: TestCgroup,
    cluster: Cluster,
}

impl World {
    /// TCP from `netns` to a Service address: from this process, or with the kube-proxy
    /// replacement from a process in the test's cgroup (where the socket hooks are).
    fn service_tcp(&self, netns: &Path, addr: &str) -> Result<String, String> {
        if self.proxy == Proxy::Replacement {
            process_peer(&self.cgroup, netns, "tcp", addr)
        } else {
            tcp(netns, addr)
        }
    }

    /// [`Self::service_tcp`]; the server must have seen `want_ip`.
    fn service_tcp_seen_as(
        &self,
        netns: &Path,
        addr: &str,
        want_ip: &str,
    ) -> Result<String, String> {
        seen_as(&self.service_tcp(netns, addr)?, want_ip)
    }

    /// UDP as [`Self::service_tcp`] (with the replacement: both a connected socket and
    /// `sendto` on an unconnected one); the server must have seen `want_ip` and the answer
    /// must come from `addr`.
    fn service_udp_seen_as(
        &self,
        netns: &Path,
        addr: &str,
        want_ip: &str,
    ) -> Result<String, String> {
        if self.proxy != Proxy::Replacement {
            return udp_seen_as(netns, addr, want_ip);
        }
        let mut seen = Vec::new();
        for proto in ["udp", "udp-sendto"] {
            let peer = process_peer(&self.cgroup, netns, proto, addr)
                .map_err(|e| format!("{proto}: {e}"))?;
            if ip_part(&peer) != want_ip {
                return Err(format!("{proto}: the server saw {peer}, not {want_ip}"));
            }
            seen.push(format!("{proto} seen as {peer}"));
        }
        Ok(seen.join(", "))
    }
}

fn add(node: &tests::ClusterNode, name: &str, conf: &ConfBuilder) -> Running {
    let pod = node.pod(name);
    let r = node.add(&pod, "eth0", conf);
    Running {
        pod,
        ip4: r.ip4(),
        ip6: r.ip6(),
    }
}

/// The Services of the table, all with the single endpoint `a1:PORT` on node A, in both
/// families (a dual-stack Service: a ClusterIP and an endpoint per family, one NodePort).
fn services(a1: &Running) -> Vec<ServicePort> {
    [Fam::V4, Fam::V6]
        .into_iter()
        .flat_map(|f| {
            let ep = f.join(a1.ip(f), PORT);
            let [web, np_cluster, np_local] = f.cluster_ips();
            [
                ServicePort::new("default/web", "http", Protocol::Tcp, web, WEB.1)
                    .endpoint(&ep, "node-a"),
                ServicePort::new("default/web", "dns", Protocol::Udp, web, WEB.2)
                    .endpoint(&ep, "node-a"),
                ServicePort::new("default/np-cluster", "tcp", Protocol::Tcp, np_cluster, PORT)
                    .endpoint(&ep, "node-a")
                    .node_port(NP_CLUSTER.1, TrafficPolicy::Cluster),
                ServicePort::new("default/np-local", "tcp", Protocol::Tcp, np_local, PORT)
                    .endpoint(&ep, "node-a")
                    .node_port(NP_LOCAL.1, TrafficPolicy::Local),
            ]
        })
        .collect()
}

/// Builds the cluster, ADDs the pods through the real plugin, loads kube-proxy's rules in
/// `mode` (after the pods exist, as kube-proxy syncs once endpoints are ready) and starts
/// the servers. `CrossNode::Tunnel`: the nodes sit in two subnets behind a router with no
/// route to any pod CIDR ([`Cluster::across_subnets`]), the pods' conflist says
/// `crossNode: tunnel`, and each node runs the agent, whose Node watcher (against the
/// stand-in API server in `ext`) keeps the tunnel entries.
fn world(test: &str, proxy: Proxy, cross: CrossNode) -> World {
    let cluster = match cross {
        CrossNode::Routed => Cluster::new(test),
        CrossNode::Tunnel => Cluster::across_subnets(test),
    };
    let (a, b) = (cluster.a(), cluster.b());
    let cgroup = TestCgroup::create(cluster.tag());
    let cross_node = match cross {
        CrossNode::Routed => "routed",
        CrossNode::Tunnel => "tunnel",
    };
    let in_cgroup = json!(cgroup.path().to_string_lossy());
    let conf_a = a
        .conf_dual_stack()
        .set("crossNode", json!(cross_node))
        .set("cgroupPath", in_cgroup.clone());
    // The replacement translates the pods' sockets, and the node's, on both nodes: node
    // B's hooks go on the test's cgroup too, and the Service rows' clients run in it.
    let mut conf_b = b.conf_dual_stack().set("crossNode", json!(cross_node));
    if proxy == Proxy::Replacement {
        conf_b = conf_b.set("cgroupPath", in_cgroup);
    }
    let mappings: Vec<_> = ["tcp", "udp"]
        .iter()
        .map(|p| json!({ "hostPort": HOST_PORT, "containerPort": PORT, "protocol": p }))
        .collect();
    let a1 = add(
        a,
        "a1",
        &conf_a
            .clone()
            .set("runtimeConfig", json!({ "portMappings": mappings })),
    );
    let a2 = add(a, "a2", &conf_a);
    let b1 = add(b, "b1", &conf_b);
    let b2 = add(b, "b2", &conf_b);
    let (mut agents, mut api, mut agent_logs) = (Vec::new(), None, None);
    if cross == CrossNode::Tunnel || proxy == Proxy::Replacement {
        let server = ApiServer::start(cluster.ext_netns(), EXT_IP4);
        #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
        let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("a log directory: {e}"));
        if cross == CrossNode::Tunnel {
            agents.extend(cluster.join_by_tunnel(&server, Underlay::V4, logs.path()));
        }
        if proxy == Proxy::Replacement {
            agents.extend(cluster.replace_kube_proxy(&server, &services(&a1), logs.path()));
        }
        api = Some(server);
        agent_logs = Some(logs);
    }
    if let Proxy::Rules(mode) = proxy {
        cluster.install_kube_proxy(mode, &services(&a1));
    }
    let echo: Vec<EchoServer> = [a1.pod.netns(), b1.pod.netns(), cluster.ext_netns()]
        .into_iter()
        .map(|ns| EchoServer::concurrent(ns, ECHO_PORT))
        .collect();
    let servers = vec![
        WhoAmIServer::start(a1.pod.netns(), PORT),
        WhoAmIServer::start(b1.pod.netns(), PORT),
        WhoAmIServer::start(cluster.ext_netns(), PORT),
    ];
    World {
        _servers: servers,
        _echo: echo,
        _agents: agents,
        _api: api,
        _agent_logs: agent_logs,
        cross,
        proxy,
        a1,
        a2,
        b1,
        b2,
        cgroup,
        cluster,
    }
}

// ------------------------------------------------------------------------------------
// The rows

/// The rows of pods to a ClusterIP, over family `f`.
fn pod_cluster_ip_rows(w: &World, rows: &mut Rows, f: Fam) {
    let [web_ip, _, _] = f.cluster_ips();
    let web = f.join(web_ip, WEB.1);
    let dns = f.join(web_ip, WEB.2);
    let l = f.label();

    rows.check(
        &format!("{l}pod → ClusterIP → pod, same node (TCP): endpoint sees the client pod"),
        w.service_tcp_seen_as(w.a2.pod.netns(), &web, w.a2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → ClusterIP → pod, same node (UDP): endpoint sees the client pod"),
        w.service_udp_seen_as(w.a2.pod.netns(), &dns, w.a2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → ClusterIP → pod, other node (TCP): endpoint sees the client pod"),
        w.service_tcp_seen_as(w.b2.pod.netns(), &web, w.b2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → ClusterIP → pod, other node (UDP): endpoint sees the client pod"),
        w.service_udp_seen_as(w.b2.pod.netns(), &dns, w.b2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → ClusterIP → itself (hairpin)"),
        w.service_tcp(w.a1.pod.netns(), &web)
            .map(|p| format!("seen as {p}")),
    );
}

/// The rows of traffic from outside the cluster to a NodePort, over family `f`.
fn node_port_rows(w: &World, rows: &mut Rows, f: Fam) {
    let ext = w.cluster.ext_netns();
    let (node_a, node_b) = f.nodes(&w.cluster);
    let l = f.label();
    rows.check(
        &format!("{l}external → NodePort, externalTrafficPolicy Cluster"),
        tcp(ext, &f.join(node_a, NP_CLUSTER.1)).map(|p| format!("seen as {p}")),
    );
    rows.check(
        &format!("{l}external → NodePort, externalTrafficPolicy Local: pod sees the client"),
        tcp_seen_as(ext, &f.join(node_a, NP_LOCAL.1), f.ext()),
    );
    rows.check(
        &format!("{l}external → NodePort on node B → endpoint on node A"),
        tcp(ext, &f.join(node_b, NP_CLUSTER.1)).map(|p| format!("seen as {p}")),
    );
}

/// The rows of the node's own processes to a ClusterIP, over family `f`.
fn host_cluster_ip_rows(w: &World, rows: &mut Rows, f: Fam) {
    let (a, b) = (w.cluster.a(), w.cluster.b());
    let [web_ip, _, _] = f.cluster_ips();
    let web = f.join(web_ip, WEB.1);
    let l = f.label();
    rows.check(
        &format!("{l}node host network → ClusterIP (endpoint on this node)"),
        w.service_tcp(a.netns(), &web)
            .map(|p| format!("seen as {p}")),
    );
    rows.check(
        &format!("{l}node host network → ClusterIP (endpoint on the other node) [extra]"),
        w.service_tcp(b.netns(), &web)
            .map(|p| format!("seen as {p}")),
    );
}

/// The rows that need no Service, over family `f`: routing between nodes, masquerade,
/// host ports.
fn plain_rows(w: &World, rows: &mut Rows, f: Fam) {
    let (a, b, ext) = (w.cluster.a(), w.cluster.b(), w.cluster.ext_netns());
    let (node_a, node_b) = f.nodes(&w.cluster);
    let host_port = f.join(node_a, HOST_PORT);
    let l = f.label();

    // Through the tunnel, node B's own traffic leaves from its tunnel address (its pods'
    // gateway, which the tunnel device owns), so that the answer returns through the
    // tunnel.
    let b_as_seen = match (w.cross, f) {
        (CrossNode::Routed, _) => node_b.to_owned(),
        (CrossNode::Tunnel, Fam::V4) => b.gateway4(),
        (CrossNode::Tunnel, Fam::V6) => b.gateway6(),
    };
    rows.check(
        &format!("{l}other node's host network → pod: pod sees that node's address"),
        tcp_seen_as(b.netns(), &f.join(w.a1.ip(f), PORT), &b_as_seen),
    );
    rows.check(
        &format!("{l}pod → pod across nodes (B → A): source kept"),
        tcp_seen_as(w.b2.pod.netns(), &f.join(w.a1.ip(f), PORT), w.b2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → pod across nodes (A → B): source kept"),
        tcp_seen_as(w.a2.pod.netns(), &f.join(w.b1.ip(f), PORT), w.a2.ip(f)),
    );
    rows.check(
        &format!("{l}pod → pod across nodes (B → A): long conversation"),
        conversation(w.b2.pod.netns(), &f.join(w.a1.ip(f), ECHO_PORT)),
    );
    rows.check(
        &format!("{l}other node's host network → pod: long conversation"),
        conversation(b.netns(), &f.join(w.a1.ip(f), ECHO_PORT)),
    );
    rows.check(
        &format!("{l}pod → outside: long conversation"),
        conversation(w.a2.pod.netns(), &f.join(f.ext(), ECHO_PORT)),
    );
    rows.check(
        &format!("{l}pod → outside (node A): masqueraded to node A's address"),
        tcp_seen_as(w.a2.pod.netns(), &f.join(f.ext(), PORT), node_a),
    );
    rows.check(
        &format!("{l}pod → outside (node B): masqueraded to node B's address"),
        tcp_seen_as(w.b2.pod.netns(), &f.join(f.ext(), PORT), node_b),
    );
    rows.check(
        &format!("{l}external → hostPort: client address kept"),
        tcp_seen_as(ext, &host_port, f.ext()),
    );
    rows.check(
        &format!("{l}pod on node B → hostPort on node A"),
        tcp(w.b2.pod.netns(), &host_port).map(|p| format!("seen as {p}")),
    );
    // The node's own processes: its address, the loopback address portmap offers (IPv6:
    // `::1`), and for IPv4 also a dual-stack IPv6 socket reaching it by its IPv4-mapped
    // form (`sock_connect6` translating to the pod's mapped IPv4 address).
    let local = match f {
        Fam::V4 => vec![
            ("node address", host_port.clone()),
            ("127.0.0.1", format!("127.0.0.1:{HOST_PORT}")),
            (
                "::ffff:127.0.0.1 (an IPv6 socket) [extra]",
                format!("[::ffff:127.0.0.1]:{HOST_PORT}"),
            ),
        ],
        Fam::V6 => vec![
            ("node address", host_port.clone()),
            ("::1", format!("[::1]:{HOST_PORT}")),
        ],
    };
    for (what, addr) in local {
        for proto in ["tcp", "udp"] {
            rows.check(
                &format!(
                    "{l}node's own host network → its hostPort via {what} ({})",
                    proto.to_uppercase()
                ),
                client_process(&w.cgroup, a.netns(), proto, &addr),
            );
        }
    }
}

/// Every row a proxy (or none) has, over both families: the Service rows with kube-proxy
/// and with the agent's replacement.
fn all_rows(w: &World, rows: &mut Rows, proxy: Proxy) {
    for f in [Fam::V4, Fam::V6] {
        match proxy {
            Proxy::Rules(_) | Proxy::Replacement => {
                pod_cluster_ip_rows(w, rows, f);
                node_port_rows(w, rows, f);
                host_cluster_ip_rows(w, rows, f);
            }
            Proxy::None => {}
        }
        plain_rows(w, rows, f);
    }
}

/// Builds the world of `test` with `proxy` and `cross`, checks every row it has and fails
/// naming the rows that failed.
fn every_row(test: &str, proxy: Proxy, cross: CrossNode) {
    let w = world(test, proxy, cross);
    let mut rows = Rows::new(proxy, cross);
    all_rows(&w, &mut rows, proxy);
    rows.assert_all_answered(&w.cluster);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_kube_proxy_iptables() {
    every_row("k8s_ipt", Proxy::Rules(Mode::Iptables), CrossNode::Routed);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_kube_proxy_nftables() {
    every_row("k8s_nft", Proxy::Rules(Mode::Nftables), CrossNode::Routed);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_rows_without_a_service_with_no_kube_proxy() {
    every_row("k8s_none", Proxy::None, CrossNode::Routed);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_kube_proxy_iptables() {
    every_row(
        "k8s_tun_ipt",
        Proxy::Rules(Mode::Iptables),
        CrossNode::Tunnel,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_kube_proxy_nftables() {
    every_row(
        "k8s_tun_nft",
        Proxy::Rules(Mode::Nftables),
        CrossNode::Tunnel,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_the_kube_proxy_replacement() {
    every_row("k8s_kpr", Proxy::Replacement, CrossNode::Routed);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_the_kube_proxy_replacement() {
    every_row("k8s_tun_kpr", Proxy::Replacement, CrossNode::Tunnel);
}
