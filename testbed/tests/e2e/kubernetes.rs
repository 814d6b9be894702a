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
//! The cluster (addresses in `testbed::cluster`):
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
//! More Services, for the rows of external addresses, names and ICMP errors:
//! `default/eip` (10.96.0.14, external IP 203.0.113.14, `externalTrafficPolicy:
//! Cluster`) and `default/lb` (10.96.0.15, load-balancer address 203.0.113.15, `Local`)
//! with the endpoint `a1:8080`, which `ext` routes to node A; `default/closed`
//! (10.96.0.16, UDP 53 → `a1:8082`, where nothing listens: the answer is an ICMP error);
//! `kube-system/kube-dns` (10.96.0.53, UDP and TCP 53) with the endpoint pod `b3` on
//! node B, which serves the cluster's names ([`testbed::dns::DnsServer`]): the pods resolve
//! `web.default.svc.cluster.local` through it with the C library's resolver.
//!
//! Under NetworkPolicy (the `…_under_network_policy_…` tests): the agents enforce
//! policies from the stand-in API server, where every pod is in namespace `default`
//! under `default-deny-ingress`; `servers` admits ports 8080–8082 into `a1` and `b1`,
//! `dns` port 53 into `b3`, and pod `a3` (on node A, endpoint of `default/guarded`,
//! 10.96.0.13) is admitted nothing. So every client is a pod whose ingress refuses all
//! but the replies of its own connections: each row must still pass, through every
//! translation the row's path has (kube-proxy's DNAT and masquerade, hairpin, the
//! replacement's socket translation, our masquerade), and the policy rows check that
//! what the policy refuses stays refused through a Service: `a3` unreachable through
//! its ClusterIP from both nodes, and a reply-shaped datagram from `a3` to a client that
//! tried it never delivered.
//!
//! Dual stack: the cluster is dual-stack (pods in `fd00:10:244:1::/64` and
//! `fd00:10:244:2::/64`, routed to each other; nodes `fd00:198:18::1` and `::3`, `ext`
//! `fd00:198:18::2`), and every row is also checked over IPv6: each Service has an IPv6
//! twin in `fd00:10:96::/112` (`::10`, `::11`, … the same ports and NodePorts, as a
//! dual-stack Service has; external addresses in `fd00:203::/64`), rendered by
//! kube-proxy's IPv6 proxier (`ip6tables` / `table ip6 kube-proxy`) next to the IPv4 one.

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    time::Duration,
};

use serde_json::json;
use testbed::{
    apiserver::ApiServer,
    cluster::Underlay,
    dns::{DnsServer, Record},
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
/// `default/guarded`'s ClusterIPs (IPv4, IPv6): pod `a3`, which its policy closes.
const GUARDED: [&str; 2] = ["10.96.0.13", "fd00:10:96::13"];
/// `default/eip`: ClusterIPs and external IPs (IPv4, IPv6), `externalTrafficPolicy:
/// Cluster`, port 80.
const EIP: [(&str, &str); 2] = [
    ("10.96.0.14", "203.0.113.14"),
    ("fd00:10:96::14", "fd00:203::14"),
];
/// `default/lb`: ClusterIPs and load-balancer addresses, `externalTrafficPolicy: Local`.
const LB: [(&str, &str); 2] = [
    ("10.96.0.15", "203.0.113.15"),
    ("fd00:10:96::15", "fd00:203::15"),
];
/// `default/closed`'s ClusterIPs: UDP 53 → `a1:CLOSED_PORT`.
const CLOSED: [&str; 2] = ["10.96.0.16", "fd00:10:96::16"];
/// A port of `a1` that its policy admits and nothing listens on.
const CLOSED_PORT: u16 = 8082;
/// `kube-system/kube-dns`'s ClusterIPs (UDP and TCP 53 → pod `b3`).
const DNS: [&str; 2] = ["10.96.0.53", "fd00:10:96::53"];
/// The name of `default/web` the cluster DNS answers.
const WEB_NAME: &str = "web.default.svc.cluster.local";
/// Where `ext` routes the external and load-balancer addresses: to node A.
const EXTERNAL_NETS: [&str; 2] = ["203.0.113.0/24", "fd00:203::/64"];
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
fn process_peer(cg: &TestCgroup, netns: &Path, proto: &str, addr: &str) -> Result<String, String> {
    process_peer_from(cg, netns, proto, addr, None)
}

/// [`process_peer`] with the client's socket bound to source address `bind`, if given
/// (as `curl --interface` binds it).
fn process_peer_from(
    cg: &TestCgroup,
    netns: &Path,
    proto: &str,
    addr: &str,
    bind: Option<&str>,
) -> Result<String, String> {
    let ms = T.as_millis().to_string();
    let source = bind.map(|b| format!("CNI_EBPF_NETCLIENT_BIND={b}"));
    let mut argv = vec!["env"];
    argv.extend(source.as_deref());
    argv.extend([NETCLIENT, proto, addr, "hello", &ms]);
    let out = cg.exec_in(netns, &argv);
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
    fn new(proxy: Proxy, cross: CrossNode, policy: Policy) -> Self {
        let mut name = match proxy {
            Proxy::None => "no kube-proxy".to_owned(),
            Proxy::Rules(m) => format!("kube-proxy {}", m.name()),
            Proxy::Replacement => "kube-proxy replacement".to_owned(),
        };
        if policy == Policy::Enforced {
            name.push_str(", NetworkPolicy");
        }
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

    /// This family's entry of a table of both families (IPv4 first).
    fn of<T: Copy>(self, both: [T; 2]) -> T {
        match self {
            Fam::V4 => both[0],
            Fam::V6 => both[1],
        }
    }
}

/// Whether the agents enforce NetworkPolicy in the world (see the module's documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// No agent enforces any: the datapath judges nothing.
    Off,
    /// Every pod under `default-deny-ingress`, the servers opened on their ports.
    Enforced,
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
    _dns: DnsServer,
    _agents: Vec<Background>,
    _api: Option<ApiServer>,
    _agent_logs: Option<tempfile::TempDir>,
    /// The pods' resolver configurations (`resolv.conf` of each family, over UDP and over
    /// TCP), naming the cluster DNS Service.
    resolv: tempfile::TempDir,
    cross: CrossNode,
    proxy: Proxy,
    policy: Policy,
    a1: Running,
    a2: Running,
    b1: Running,
    b2: Running,
    /// Under NetworkPolicy: the endpoint of `default/guarded`, closed by its policy.
    a3: Option<Running>,
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

    /// The addresses the C library's resolver in `netns` finds for [`WEB_NAME`] with the
    /// resolver configuration `conf` (a process in the test's cgroup, where the
    /// replacement's socket hooks are).
    fn resolve(&self, netns: &Path, conf: &Path) -> Result<Vec<String>, String> {
        let ms = (4 * T).as_millis().to_string();
        let conf = conf.display().to_string();
        let out = self
            .cgroup
            .exec_in(netns, &[NETCLIENT, "resolve", WEB_NAME, &conf, &ms]);
        if !out.success() {
            return Err(format!(
                "resolving {WEB_NAME} failed: {}",
                out.stderr.trim()
            ));
        }
        Ok(out.stdout.lines().map(|l| l.trim().to_owned()).collect())
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

/// ADDs pod `default/<name>` on `node` (named in `CNI_ARGS`, as kubelet names it).
fn add(node: &testbed::ClusterNode, name: &str, conf: &ConfBuilder) -> Running {
    let pod = node.pod(name);
    let env = pod
        .env("eth0")
        .with_args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
    let r = testbed::ResultView::parse(&node.exec_plugin("ADD", &env, &conf.plugin()).result());
    Running {
        pod,
        ip4: r.ip4(),
        ip6: r.ip6(),
    }
}

/// The Services of the table in both families (a dual-stack Service: a ClusterIP and an
/// endpoint per family, one NodePort): all but the cluster DNS with the single endpoint
/// `a1:PORT` on node A (`default/closed`: `a1:CLOSED_PORT`), the cluster DNS with `b3:53`,
/// `default/guarded` (under NetworkPolicy) with `a3:PORT`.
fn services(a1: &Running, a3: Option<&Running>, b3: &Running) -> Vec<ServicePort> {
    [Fam::V4, Fam::V6]
        .into_iter()
        .flat_map(|f| {
            let ep = f.join(a1.ip(f), PORT);
            let dns_ep = f.join(b3.ip(f), 53);
            let [web, np_cluster, np_local] = f.cluster_ips();
            let ((eip_cip, eip), (lb_cip, lb)) = (f.of(EIP), f.of(LB));
            let mut ports = vec![
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
                ServicePort::new("default/eip", "http", Protocol::Tcp, eip_cip, WEB.1)
                    .endpoint(&ep, "node-a")
                    .external_ip(eip, TrafficPolicy::Cluster),
                ServicePort::new("default/lb", "http", Protocol::Tcp, lb_cip, WEB.1)
                    .endpoint(&ep, "node-a")
                    .load_balancer_ip(lb, TrafficPolicy::Local),
                ServicePort::new("default/closed", "dns", Protocol::Udp, f.of(CLOSED), WEB.2)
                    .endpoint(&f.join(a1.ip(f), CLOSED_PORT), "node-a"),
                ServicePort::new("kube-system/kube-dns", "dns", Protocol::Udp, f.of(DNS), 53)
                    .endpoint(&dns_ep, "node-b"),
                ServicePort::new(
                    "kube-system/kube-dns",
                    "dns-tcp",
                    Protocol::Tcp,
                    f.of(DNS),
                    53,
                )
                .endpoint(&dns_ep, "node-b"),
            ];
            if let Some(a3) = a3 {
                let guarded = f.join(a3.ip(f), PORT);
                ports.push(
                    ServicePort::new(
                        "default/guarded",
                        "http",
                        Protocol::Tcp,
                        f.of(GUARDED),
                        WEB.1,
                    )
                    .endpoint(&guarded, "node-a"),
                );
                ports.push(
                    ServicePort::new(
                        "default/guarded",
                        "dns",
                        Protocol::Udp,
                        f.of(GUARDED),
                        WEB.2,
                    )
                    .endpoint(&guarded, "node-a"),
                );
            }
            ports
        })
        .collect()
}

/// The NetworkPolicy objects of the world under NetworkPolicy (see the module's
/// documentation), and its namespace and pods (`role` labels) as the API holds them.
fn policy_objects(w: &[(&str, &str, &Running)]) -> Vec<(&'static str, serde_json::Value)> {
    use testbed::netpol::{namespace, pod};
    let mut out = vec![(
        "namespaces",
        serde_json::to_value(namespace(
            "default",
            &[("kubernetes.io/metadata.name", "default")],
        ))
        .unwrap_or_default(),
    )];
    for (name, role, r) in w {
        let ips: Vec<std::net::IpAddr> = [&r.ip4, &r.ip6]
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        out.push((
            "pods",
            serde_json::to_value(pod("default", name, &[("role", role)], &ips)).unwrap_or_default(),
        ));
    }
    let policy = |name: &str, spec: serde_json::Value| {
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "name": name, "namespace": "default" },
            "spec": spec,
        })
    };
    let ports = |ports: &[(&str, u16)]| -> Vec<serde_json::Value> {
        ports
            .iter()
            .map(|(p, n)| json!({ "protocol": p, "port": n }))
            .collect()
    };
    out.push((
        "networkpolicies",
        policy(
            "default-deny-ingress",
            json!({ "podSelector": {}, "policyTypes": ["Ingress"] }),
        ),
    ));
    out.push((
        "networkpolicies",
        policy(
            "servers",
            json!({
                "podSelector": { "matchLabels": { "role": "server" } },
                "ingress": [{ "ports": ports(&[
                    ("TCP", PORT), ("UDP", PORT), ("TCP", ECHO_PORT),
                    ("TCP", CLOSED_PORT), ("UDP", CLOSED_PORT),
                ]) }],
            }),
        ),
    ));
    out.push((
        "networkpolicies",
        policy(
            "dns",
            json!({
                "podSelector": { "matchLabels": { "role": "dns" } },
                "ingress": [{ "ports": ports(&[("UDP", 53), ("TCP", 53)]) }],
            }),
        ),
    ));
    out
}

/// Builds the cluster, ADDs the pods through the real plugin, loads kube-proxy's rules in
/// `mode` (after the pods exist, as kube-proxy syncs once endpoints are ready) and starts
/// the servers. `CrossNode::Tunnel`: the nodes sit in two subnets behind a router with no
/// route to any pod CIDR ([`Cluster::across_subnets`]), the pods' conflist says
/// `crossNode: tunnel`, and each node runs the agent, whose Node watcher (against the
/// stand-in API server in `ext`) keeps the tunnel entries.
fn world(test: &str, proxy: Proxy, cross: CrossNode, policy: Policy) -> World {
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
    if proxy == Proxy::Rules(Mode::Ipvs) {
        // IPVS-mode kube-proxy runs before any pod: its Service addresses are on the
        // node when the pods' datapath first lists the node's addresses.
        let vips: Vec<std::net::IpAddr> = [Fam::V4, Fam::V6]
            .into_iter()
            .flat_map(|f| {
                let mut v = f.cluster_ips().to_vec();
                v.extend([
                    f.of(GUARDED),
                    f.of(CLOSED),
                    f.of(DNS),
                    f.of(EIP).0,
                    f.of(LB).0,
                ]);
                v
            })
            .filter_map(|ip| ip.parse().ok())
            .collect();
        for n in cluster.nodes() {
            testbed::kubeproxy::bind_ipvs_addresses(n.netns(), &vips);
        }
    }
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
    let a3 = (policy == Policy::Enforced).then(|| add(a, "a3", &conf_a));
    let b1 = add(b, "b1", &conf_b);
    let b2 = add(b, "b2", &conf_b);
    let b3 = add(b, "b3", &conf_b);
    let svcs = services(&a1, a3.as_ref(), &b3);
    let (mut agents, mut api, mut agent_logs) = (Vec::new(), None, None);
    if cross == CrossNode::Tunnel || proxy == Proxy::Replacement || policy == Policy::Enforced {
        let server = ApiServer::start(cluster.ext_netns(), EXT_IP4);
        #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
        let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("a log directory: {e}"));
        let underlay = (cross == CrossNode::Tunnel).then_some(Underlay::V4);
        let replaced = (proxy == Proxy::Replacement).then_some(svcs.as_slice());
        if policy == Policy::Enforced {
            let mut pods = vec![("a1", "server", &a1), ("a2", "client", &a2)];
            pods.extend(a3.as_ref().map(|r| ("a3", "guarded", r)));
            pods.extend([
                ("b1", "server", &b1),
                ("b2", "client", &b2),
                ("b3", "dns", &b3),
            ]);
            for (resource, obj) in policy_objects(&pods) {
                server.put(resource, obj);
            }
            agents.extend(cluster.start_policy_agents(&server, underlay, replaced, logs.path()));
        } else {
            if let Some(u) = underlay {
                agents.extend(cluster.join_by_tunnel(&server, u, logs.path()));
            }
            if let Some(svcs) = replaced {
                agents.extend(cluster.replace_kube_proxy(&server, svcs, logs.path()));
            }
        }
        api = Some(server);
        agent_logs = Some(logs);
    }
    if let Proxy::Rules(mode) = proxy {
        cluster.install_kube_proxy(mode, &svcs);
    }
    // The outside world reaches the external and load-balancer addresses through node A.
    for (net, via) in EXTERNAL_NETS.iter().zip([a.ip4(), a.ip6()]) {
        let out = testbed::netns_exec(
            cluster.ext_netns(),
            &["ip", "route", "add", net, "via", via],
        );
        assert!(out.success(), "route to {net} in ext: {out}");
    }
    let dns = DnsServer::start(b3.pod.netns());
    let web_ips = [WEB.0, CLUSTER_IPS6[0]].map(|ip| ip.parse().map(|a| Record::Addr(a, 30)));
    dns.set(
        WEB_NAME,
        web_ips.into_iter().filter_map(Result::ok).collect(),
    );
    let resolv = resolver_configs();
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
        _dns: dns,
        _agents: agents,
        _api: api,
        _agent_logs: agent_logs,
        resolv,
        cross,
        proxy,
        policy,
        a1,
        a2,
        b1,
        b2,
        a3,
        cgroup,
        cluster,
    }
}

/// `resolv.conf` files naming the cluster DNS Service of each family, over UDP
/// (`udp4.conf`, `udp6.conf`) and over TCP (`tcp4.conf`, `tcp6.conf`: `use-vc`), with
/// short timeouts.
fn resolver_configs() -> tempfile::TempDir {
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a resolver directory: {e}"));
    for f in [Fam::V4, Fam::V6] {
        let n = if f == Fam::V4 { 4 } else { 6 };
        for (proto, extra) in [("udp", ""), ("tcp", " use-vc")] {
            let path = dir.path().join(format!("{proto}{n}.conf"));
            let text = format!(
                "nameserver {}\noptions timeout:1 attempts:2{extra}\n",
                f.of(DNS)
            );
            #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    dir
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

/// The rows of pods and the outside to a Service's external IP (`externalTrafficPolicy:
/// Cluster`) and load-balancer address (`Local`), over family `f`.
fn external_address_rows(w: &World, rows: &mut Rows, f: Fam) {
    let ((_, eip), (_, lb)) = (f.of(EIP), f.of(LB));
    let (eip, lb) = (f.join(eip, WEB.1), f.join(lb, WEB.1));
    let l = f.label();
    for (who, pod) in [("same node", &w.a2), ("other node", &w.b2)] {
        rows.check(
            &format!("{l}pod → external IP (Cluster) → pod, {who}"),
            w.service_tcp(pod.pod.netns(), &eip)
                .map(|p| format!("seen as {p}")),
        );
        rows.check(
            &format!("{l}pod → load-balancer address (Local) → pod, {who}"),
            w.service_tcp(pod.pod.netns(), &lb)
                .map(|p| format!("seen as {p}")),
        );
    }
    let ext = w.cluster.ext_netns();
    rows.check(
        &format!("{l}external → external IP (Cluster)"),
        tcp(ext, &eip).map(|p| format!("seen as {p}")),
    );
    rows.check(
        &format!("{l}external → load-balancer address (Local): pod sees the client"),
        tcp_seen_as(ext, &lb, f.ext()),
    );
}

/// The rows of the cluster's names and ICMP errors through Services, over family `f`:
/// pods on both nodes resolve `default/web`'s name through the cluster DNS Service (on
/// node B) with the C library's resolver, over UDP and over TCP, and reach what it
/// answered; a datagram to a Service port whose endpoint nothing listens on is refused
/// at once (the endpoint's ICMP error, translated back, reaches the client's socket).
fn name_and_error_rows(w: &World, rows: &mut Rows, f: Fam) {
    let l = f.label();
    let n = if f == Fam::V4 { 4 } else { 6 };
    let want = f.cluster_ips()[0].to_owned();
    for (who, pod) in [("other node", &w.a2), ("same node", &w.b2)] {
        for proto in ["udp", "tcp"] {
            let conf = w.resolv.path().join(format!("{proto}{n}.conf"));
            let resolved = w.resolve(pod.pod.netns(), &conf).and_then(|addrs| {
                if addrs.contains(&want) {
                    Ok(addrs)
                } else {
                    Err(format!("resolved to {addrs:?}, not {want}"))
                }
            });
            rows.check(
                &format!(
                    "{l}pod → cluster DNS ({}, {who}) → the name's ClusterIP → pod",
                    proto.to_uppercase()
                ),
                resolved.and_then(|_| {
                    w.service_tcp(pod.pod.netns(), &f.join(&want, WEB.1))
                        .map(|p| format!("resolved {WEB_NAME} to {want}, seen as {p}"))
                }),
            );
        }
    }
    let closed = f.join(f.of(CLOSED), WEB.2);
    rows.check(
        &format!("{l}pod → ClusterIP → a port nothing listens on (UDP): refused at once"),
        match process_peer(&w.cgroup, w.a2.pod.netns(), "udp", &closed) {
            Err(e) if e.starts_with("refused") => Ok(e),
            Err(e) => Err(format!("not refused: {e}")),
            Ok(p) => Err(format!("answered ({p})")),
        },
    );
}

/// The rows of what NetworkPolicy refuses through a Service, over family `f`: pod `a3`
/// (admitted nothing) through its ClusterIP from both nodes, TCP and UDP; and a
/// datagram shaped as the reply of such a refused request, sent by `a3` itself to the
/// client's port, never reaches the client.
fn refused_rows(w: &World, rows: &mut Rows, f: Fam) {
    let Some(a3) = &w.a3 else {
        return;
    };
    let l = f.label();
    let (tcp_to, udp_to) = (f.join(f.of(GUARDED), WEB.1), f.join(f.of(GUARDED), WEB.2));
    for (who, pod) in [("same node", &w.a2), ("other node", &w.b2)] {
        rows.check(
            &format!("{l}pod → ClusterIP of a pod its policy closes (TCP, {who}): refused"),
            refused(w.service_tcp(pod.pod.netns(), &tcp_to)),
        );
        rows.check(
            &format!("{l}pod → ClusterIP of a pod its policy closes (UDP, {who}): refused"),
            refused(w.service_udp_seen_as(pod.pod.netns(), &udp_to, pod.ip(f))),
        );
    }
    rows.check(
        &format!("{l}a reply-shaped datagram from the refused endpoint never reaches the client"),
        reply_shaped(
            w.a2.pod.netns(),
            &udp_to,
            a3.pod.netns(),
            &f.join(a3.ip(f), PORT),
            w.a2.ip(f),
        ),
    );
}

/// A row that must find no answer: `Ok` naming why there was none.
fn refused(outcome: Result<String, String>) -> Result<String, String> {
    match outcome {
        Ok(p) => Err(format!("answered ({p}), though the policy refuses it")),
        Err(e) => Ok(format!("no answer, as the policy says ({e})")),
    }
}

/// From `client_ns`, a datagram to the Service address `service` (whose endpoint's
/// policy refuses it); then, from `server_ns`, a datagram from `endpoint` (the endpoint's
/// own address and port) to the client's address and port: the tuple of a reply, which
/// conntrack translates back to the Service's address. The client must receive nothing.
fn reply_shaped(
    client_ns: &Path,
    service: &str,
    server_ns: &Path,
    endpoint: &str,
    client_ip: &str,
) -> Result<String, String> {
    let to = sock_addr(service);
    let bind = if to.is_ipv6() {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
    };
    let client =
        in_netns(client_ns, move || UdpSocket::bind(bind)).map_err(|e| describe("bind", &e))?;
    let port = client
        .local_addr()
        .map_err(|e| describe("local address", &e))?
        .port();
    client
        .send_to(b"hello", to)
        .map_err(|e| describe("send", &e))?;
    std::thread::sleep(Duration::from_millis(200));
    let from = sock_addr(endpoint);
    let dest = sock_addr(&if to.is_ipv6() {
        format!("[{client_ip}]:{port}")
    } else {
        format!("{client_ip}:{port}")
    });
    in_netns(server_ns, move || -> io::Result<()> {
        let s = UdpSocket::bind(from)?;
        for _ in 0..3 {
            s.send_to(b"reply-shaped", dest)?;
        }
        Ok(())
    })
    .map_err(|e| describe("the endpoint's send", &e))?;
    let _ = client.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 64];
    match client.recv_from(&mut buf) {
        Ok((n, src)) => Err(format!(
            "the client received {:?} from {src}",
            String::from_utf8_lossy(&buf[..n])
        )),
        Err(_) => Ok("nothing arrived in 1 s".to_owned()),
    }
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
    // `::1`, from a socket bound to the node's address, as portmap reaches it: see
    // `host_ports_bound_to_an_address_are_reachable_where_portmap_makes_them`), and for
    // IPv4 also a dual-stack IPv6 socket reaching it by its IPv4-mapped form
    // (`sock_connect6` translating to the pod's mapped IPv4 address).
    let local = match f {
        Fam::V4 => vec![
            ("node address", host_port.clone(), None),
            ("127.0.0.1", format!("127.0.0.1:{HOST_PORT}"), None),
            (
                "::ffff:127.0.0.1 (an IPv6 socket) [extra]",
                format!("[::ffff:127.0.0.1]:{HOST_PORT}"),
                None,
            ),
        ],
        Fam::V6 => vec![
            ("node address", host_port.clone(), None),
            (
                "::1, bound to the node's address",
                format!("[::1]:{HOST_PORT}"),
                Some(node_a),
            ),
        ],
    };
    for (what, addr, bind) in local {
        for proto in ["tcp", "udp"] {
            rows.check(
                &format!(
                    "{l}node's own host network → its hostPort via {what} ({})",
                    proto.to_uppercase()
                ),
                process_peer_from(&w.cgroup, a.netns(), proto, &addr, bind)
                    .map(|peer| format!("seen as {peer}")),
            );
        }
    }
}

/// Every row a proxy (or none) has, over both families: the Service rows with kube-proxy
/// and with the agent's replacement; under NetworkPolicy the refused rows too.
fn all_rows(w: &World, rows: &mut Rows, proxy: Proxy) {
    for f in [Fam::V4, Fam::V6] {
        match proxy {
            Proxy::Rules(_) | Proxy::Replacement => {
                pod_cluster_ip_rows(w, rows, f);
                // IPVS mode is rendered for ClusterIPs only (testbed::kubeproxy::ipvs).
                if proxy != Proxy::Rules(Mode::Ipvs) {
                    node_port_rows(w, rows, f);
                    external_address_rows(w, rows, f);
                }
                host_cluster_ip_rows(w, rows, f);
                name_and_error_rows(w, rows, f);
                if w.policy == Policy::Enforced {
                    refused_rows(w, rows, f);
                }
            }
            Proxy::None => {}
        }
        plain_rows(w, rows, f);
    }
}

/// Builds the world of `test` with `proxy`, `cross` and `policy`, checks every row it
/// has and fails naming the rows that failed.
fn every_row(test: &str, proxy: Proxy, cross: CrossNode, policy: Policy) {
    let w = world(test, proxy, cross, policy);
    let mut rows = Rows::new(proxy, cross, policy);
    all_rows(&w, &mut rows, proxy);
    rows.assert_all_answered(&w.cluster);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_kube_proxy_iptables() {
    every_row(
        "k8s_ipt",
        Proxy::Rules(Mode::Iptables),
        CrossNode::Routed,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_kube_proxy_nftables() {
    every_row(
        "k8s_nft",
        Proxy::Rules(Mode::Nftables),
        CrossNode::Routed,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_rows_without_a_service_with_no_kube_proxy() {
    every_row("k8s_none", Proxy::None, CrossNode::Routed, Policy::Off);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_kube_proxy_iptables() {
    every_row(
        "k8s_tun_ipt",
        Proxy::Rules(Mode::Iptables),
        CrossNode::Tunnel,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_kube_proxy_nftables() {
    every_row(
        "k8s_tun_nft",
        Proxy::Rules(Mode::Nftables),
        CrossNode::Tunnel,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_with_the_kube_proxy_replacement() {
    every_row(
        "k8s_kpr",
        Proxy::Replacement,
        CrossNode::Routed,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_through_the_tunnel_with_the_kube_proxy_replacement() {
    every_row(
        "k8s_tun_kpr",
        Proxy::Replacement,
        CrossNode::Tunnel,
        Policy::Off,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_under_network_policy_with_kube_proxy_iptables() {
    every_row(
        "k8s_np_ipt",
        Proxy::Rules(Mode::Iptables),
        CrossNode::Routed,
        Policy::Enforced,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_under_network_policy_through_the_tunnel_with_kube_proxy_nftables() {
    every_row(
        "k8s_np_tun_nft",
        Proxy::Rules(Mode::Nftables),
        CrossNode::Tunnel,
        Policy::Enforced,
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_every_row_under_network_policy_with_the_kube_proxy_replacement() {
    every_row(
        "k8s_np_kpr",
        Proxy::Replacement,
        CrossNode::Routed,
        Policy::Enforced,
    );
}

// ------------------------------------------------------------------------------------
// Host ports bound to an address, side by side with the reference plugins

/// The host ports of [`host_ports_bound_to_an_address_are_reachable_where_portmap_makes_them`]:
/// `(pod, hostPort, protocol, hostIP)` with `"A4"` / `"A6"` for node A's addresses; every
/// mapping's containerPort is 80. The first three are the upstream conformance test's
/// ("HostPort validates that there is no conflict between pods with same hostPort but
/// different hostIP and protocol"): one port on 127.0.0.1 and on the node's address over
/// TCP, and on the node's address over UDP, each a pod of its own.
const BOUND_PORTS: [(&str, u16, &str, &str); 7] = [
    ("hp1", 54323, "tcp", "127.0.0.1"),
    ("hp2", 54323, "tcp", "A4"),
    ("hp3", 54323, "udp", "A4"),
    ("hp4", 54324, "tcp", "::1"),
    ("hp5", 54324, "tcp", "A6"),
    ("hp6", 54325, "tcp", "0.0.0.0"),
    ("hp7", 54325, "tcp", "::"),
];

/// Who answered a probe: the pod's name, or why nothing did.
type Answer = Result<String, String>;

/// One client of the host-port table: its name, namespace, the source address it binds
/// (`"A4"`/`"A6"`: node A's; `None`: the kernel's choice) and the families it uses.
struct HostPortClient<'a> {
    name: &'static str,
    netns: &'a Path,
    bind: Option<&'static str>,
}

/// The host-port world on `cluster`: the pods of [`BOUND_PORTS`] on node A, with a
/// matrix server each, networked by cni-ebpf (`reference: false`, its socket hooks on
/// `cgroup`) or by the reference `bridge` + `host-local` + `portmap` chain through libcni;
/// a client pod on each node networked the same way. Returns the pods (kept alive) and
/// the client pods.
fn host_port_world(
    cluster: &Cluster,
    cgroup: &TestCgroup,
    reference: bool,
) -> (Vec<(Pod, testbed::netpol::probe::MatrixServer)>, Vec<Pod>) {
    let (a, b) = (cluster.a(), cluster.b());
    let resolve = |host_ip: &str| match host_ip {
        "A4" => a.ip4().to_owned(),
        "A6" => a.ip6().to_owned(),
        other => other.to_owned(),
    };
    let add = |node: &ClusterNode, name: &str, ports: Vec<serde_json::Value>| -> Pod {
        let pod = node.pod(name);
        if reference {
            let conflist = reference_conflist(node);
            let out = node.libcni(
                "add",
                &conflist,
                &pod.env("eth0"),
                Some(&json!({ "portMappings": ports })),
            );
            assert!(out.success(), "reference ADD of {name}: {out:?}");
        } else {
            let conf = node
                .conf_dual_stack()
                .set("cgroupPath", json!(cgroup.path().to_string_lossy()))
                .set("capabilities", json!({ "portMappings": true }))
                .set("runtimeConfig", json!({ "portMappings": ports }));
            let _ = node.add(&pod, "eth0", &conf);
        }
        pod
    };
    let mut servers = Vec::new();
    for (name, host_port, proto, host_ip) in BOUND_PORTS {
        let mapping = json!({
            "hostPort": host_port,
            "containerPort": 80,
            "protocol": proto,
            "hostIP": resolve(host_ip),
        });
        let pod = add(a, name, vec![mapping]);
        let server = testbed::netpol::probe::MatrixServer::start(pod.netns(), name);
        servers.push((pod, server));
    }
    let clients = vec![add(a, "hpc-a", Vec::new()), add(b, "hpc-b", Vec::new())];
    (servers, clients)
}

/// The reference chain's conflist for `node` (its pod CIDRs, dual stack).
fn reference_conflist(node: &ClusterNode) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "refnet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": node.pod_cidr4() }], [{ "subnet": node.pod_cidr6() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
                    "dataDir": node.dir().join("host-local").to_string_lossy(),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true },
        ],
    })
}

/// Every probe of the host-port table in `cluster` (clients: node A's processes with the
/// kernel's source and bound to node A's address, node B's processes, a pod on each node,
/// `ext`; destinations: the loopback addresses and node A's, on every port of
/// [`BOUND_PORTS`] and its protocol): `(probe, who answered)`.
fn host_port_table(
    cluster: &Cluster,
    cgroup: &TestCgroup,
    clients: &[Pod],
) -> Vec<(String, Answer)> {
    let (a, b) = (cluster.a(), cluster.b());
    let mut who: Vec<HostPortClient> = vec![
        HostPortClient {
            name: "node A",
            netns: a.netns(),
            bind: None,
        },
        HostPortClient {
            name: "node A bound to its IPv4 address",
            netns: a.netns(),
            bind: Some("A4"),
        },
        HostPortClient {
            name: "node A bound to its IPv6 address",
            netns: a.netns(),
            bind: Some("A6"),
        },
        HostPortClient {
            name: "node B",
            netns: b.netns(),
            bind: None,
        },
        HostPortClient {
            name: "ext",
            netns: cluster.ext_netns(),
            bind: None,
        },
    ];
    who.push(HostPortClient {
        name: "pod on node A",
        netns: clients[0].netns(),
        bind: None,
    });
    who.push(HostPortClient {
        name: "pod on node B",
        netns: clients[1].netns(),
        bind: None,
    });
    let mut ports: Vec<(u16, &str)> = BOUND_PORTS
        .iter()
        .map(|(_, p, proto, _)| (*p, *proto))
        .collect();
    ports.dedup();
    let mut out = Vec::new();
    for c in &who {
        let bind = c.bind.map(|b| if b == "A4" { a.ip4() } else { a.ip6() });
        for dst in ["127.0.0.1", "::1", a.ip4(), a.ip6()] {
            let v6 = dst.contains(':');
            if bind.is_some_and(|b| b.contains(':') != v6) {
                continue;
            }
            for (port, proto) in &ports {
                let addr = if v6 {
                    format!("[{dst}]:{port}")
                } else {
                    format!("{dst}:{port}")
                };
                let ms = (T / 2).as_millis().to_string();
                let mut argv: Vec<String> = vec!["env".into()];
                if let Some(b) = bind {
                    argv.push(format!("CNI_EBPF_NETCLIENT_BIND={b}"));
                }
                // TCP: the matrix server speaks first (no payload); UDP: a datagram.
                let payload = if *proto == "tcp" { "" } else { "hostport" };
                argv.extend([
                    NETCLIENT.into(),
                    (*proto).into(),
                    addr.clone(),
                    payload.into(),
                    ms,
                ]);
                let run = cgroup.exec_in(c.netns, &argv);
                let answer = if run.success() {
                    Ok(run
                        .stdout
                        .lines()
                        .nth(1)
                        .unwrap_or_default()
                        .trim()
                        .to_owned())
                } else {
                    Err(run
                        .stderr
                        .trim()
                        .split(':')
                        .nth(1)
                        .unwrap_or("failed")
                        .trim()
                        .to_owned())
                };
                out.push((format!("{} → {addr}/{proto}", c.name), answer));
            }
        }
    }
    out
}

/// Host ports with a `hostIP`: 127.0.0.1, ::1, node A's addresses and 0.0.0.0 / ::, from
/// the node's own processes (with the kernel's source address and bound to the node's
/// address, as `curl --interface` does), from the other node, from pods on both nodes
/// and from outside. Every probe must find what the reference plugins (`bridge` +
/// `host-local` + `portmap` through libcni, on a cluster of their own) find: the same pod
/// answering, or no answer. And the upstream conformance test holds: 127.0.0.1:54323/TCP
/// (bound to the node's address), nodeIP:54323/TCP and nodeIP:54323/UDP reach three
/// different pods.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn host_ports_bound_to_an_address_are_reachable_where_portmap_makes_them() {
    let ours = Cluster::new("hp_ebpf");
    let ours_cg = TestCgroup::create(ours.tag());
    let (_ours_pods, ours_clients) = host_port_world(&ours, &ours_cg, false);
    let ours_table = host_port_table(&ours, &ours_cg, &ours_clients);

    let reference = Cluster::new("hp_ref");
    let ref_cg = TestCgroup::create(reference.tag());
    let (_ref_pods, ref_clients) = host_port_world(&reference, &ref_cg, true);
    let ref_table = host_port_table(&reference, &ref_cg, &ref_clients);

    let reached = |a: &Answer| a.as_ref().ok().cloned();
    let mut differ = Vec::new();
    for ((probe, got), (_, want)) in ours_table.iter().zip(&ref_table) {
        let line = format!("{probe}: cni-ebpf {got:?}, reference {want:?}");
        eprintln!("{line}");
        if reached(got) != reached(want) {
            differ.push(line);
        }
    }
    let a4 = ours.a().ip4();
    for (probe, want) in [
        (
            "node A bound to its IPv4 address → 127.0.0.1:54323/tcp".to_owned(),
            "hp1",
        ),
        (format!("node A → {a4}:54323/tcp"), "hp2"),
        (format!("node A → {a4}:54323/udp"), "hp3"),
    ] {
        let got = ours_table
            .iter()
            .find(|(p, _)| *p == probe)
            .map(|(_, a)| a.clone());
        assert_eq!(
            got,
            Some(Ok(want.to_owned())),
            "the conformance test's probe {probe} must reach {want}"
        );
    }
    assert!(
        differ.is_empty(),
        "{} of {} probes found otherwise than with the reference plugins:\n{}",
        differ.len(),
        ours_table.len(),
        differ.join("\n")
    );
}

/// The ClusterIP rows (pods same node and other node, hairpin, the node's own processes,
/// names through the cluster DNS, an ICMP error) and the rows without a Service, under
/// NetworkPolicy, with kube-proxy in IPVS mode: the replies come back through IPVS's
/// un-DNAT, and what the policy refuses stays refused though the Services' addresses are
/// bound to the node (on `kube-ipvs0`). This machine's kernel has no IPVS: here the test
/// only says so; `cargo xtask test` runs it again under the second kernel (Debian's 6.12,
/// with IPVS as modules) with `CNI_EBPF_EXPECT_IPVS=1`, where its absence is a failure.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kubernetes_service_rows_under_network_policy_with_kube_proxy_ipvs() {
    let probe = testbed::NetNs::create(&format!("k8s-ipvs-probe-{}", std::process::id()));
    if !testbed::kubeproxy::ipvs_available(probe.path()) {
        assert!(
            std::env::var("CNI_EBPF_EXPECT_IPVS").is_err(),
            "this kernel is expected to have IPVS"
        );
        eprintln!("this kernel has no IPVS: the IPVS rows run under the second kernel");
        return;
    }
    drop(probe);
    every_row(
        "k8s_np_ipvs",
        Proxy::Rules(Mode::Ipvs),
        CrossNode::Routed,
        Policy::Enforced,
    );
}
