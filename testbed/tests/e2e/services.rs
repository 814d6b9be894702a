//! The agent's kube-proxy replacement (`agent --kube-proxy-replacement`) on two simulated
//! nodes with no kube-proxy, beyond the rows of the Kubernetes matrix
//! (`kubernetes.rs`): how backends are chosen (uniformly, ready before terminating,
//! `sessionAffinity: ClientIP`, `internalTrafficPolicy: Local`), a Service without
//! endpoints refusing at once, NodePorts from outside to backends on either node (TCP
//! and UDP, a long conversation), `externalTrafficPolicy: Local` with its health-check
//! node port, an external IP and a load-balancer address, NetworkPolicy on Service flows
//! (judged by the backend's address and port), connections that live through
//! endpoint churn, an agent restart, the switch over from kube-proxy and back, the Event
//! on a Service field the mode does not translate, and 10 000 Services with 100 000
//! endpoints.
//!
//! Services and EndpointSlices are written to the stand-in API server in `ext`; each
//! node's agent watches them. Every client runs as a process inside the test's cgroup,
//! where both nodes' socket hooks are attached.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use cni_ebpf::datapath::services::{frontend_key, At, Scope};
use serde_json::{json, Value};
use testbed::{
    apiserver::ApiServer,
    kubeproxy::{Mode, Protocol, ServicePort},
    process::Background,
    service_objects::endpoint,
    Cluster, ClusterNode, EchoServer, Pod, TestCgroup, WhoAmIServer, EXT_IP4,
};

/// The port every server listens on ("who am I", TCP and UDP).
const PORT: u16 = 8080;
/// The port of the echo servers (TCP).
const ECHO_PORT: u16 = 8081;
/// The one-shot client process (see `src/bin/cni-ebpf-netclient.rs`).
const NETCLIENT: &str = env!("CARGO_BIN_EXE_cni-ebpf-netclient");

/// A pod and its addresses.
struct Running {
    pod: Pod,
    ip4: String,
}

/// The cluster: pods `a1`, `a2`, `a3` on node A and `b1`, `b2` on node B; servers in `a1`,
/// `a3` and `b1`; an agent with the replacement on each node. Field order is drop order.
struct World {
    _servers: Vec<WhoAmIServer>,
    _echo: Vec<EchoServer>,
    agents: Vec<Background>,
    api: ApiServer,
    logs: tempfile::TempDir,
    a1: Running,
    a2: Running,
    a3: Running,
    b1: Running,
    b2: Running,
    cgroup: TestCgroup,
    cluster: Cluster,
}

fn world(test: &str) -> World {
    build_world(test, false)
}

/// [`world`] with NetworkPolicy enforced by the agents too: each pod is ADDed as
/// `default/<name>` and published as a Pod with labels `app: web` (the servers `a1`,
/// `a3`, `b1`), `role: client` (`a2`) or `role: other` (`b2`).
fn policy_world(test: &str) -> World {
    build_world(test, true)
}

fn build_world(test: &str, policy: bool) -> World {
    let cluster = Cluster::new(test);
    let cgroup = TestCgroup::create(cluster.tag());
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    if policy {
        let namespace = testbed::netpol::namespace("default", &[("ns", "default")]);
        api.put(
            "namespaces",
            serde_json::to_value(&namespace).unwrap_or_default(),
        );
    }
    let conf = |n: &ClusterNode| {
        n.conf_dual_stack()
            .set("cgroupPath", json!(cgroup.path().to_string_lossy()))
    };
    let add = |n: &ClusterNode, name: &str, label: (&str, &str)| {
        let pod = n.pod(name);
        if !policy {
            let r = n.add(&pod, "eth0", &conf(n));
            return Running { pod, ip4: r.ip4() };
        }
        let env = pod
            .env("eth0")
            .with_args(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"));
        let r = testbed::ResultView::parse(&n.exec_plugin("ADD", &env, &conf(n).plugin()).result());
        let ips: Vec<IpAddr> = [r.ip4(), r.ip6()]
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        let object = testbed::netpol::pod("default", name, &[label], &ips);
        api.put("pods", serde_json::to_value(&object).unwrap_or_default());
        Running { pod, ip4: r.ip4() }
    };
    let (a, b) = (cluster.a(), cluster.b());
    let (web, client, other) = (("app", "web"), ("role", "client"), ("role", "other"));
    let (a1, a2, a3, b1, b2) = (
        add(a, "a1", web),
        add(a, "a2", client),
        add(a, "a3", web),
        add(b, "b1", web),
        add(b, "b2", other),
    );
    let servers = [&a1, &a3, &b1]
        .iter()
        .map(|p| WhoAmIServer::named(p.pod.netns(), PORT, &p.ip4))
        .collect();
    let echo = [&a1, &a3, &b1]
        .iter()
        .map(|p| EchoServer::concurrent(p.pod.netns(), ECHO_PORT))
        .collect();
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("a log directory: {e}"));
    let agents = if policy {
        let log = |n: &ClusterNode| logs.path().join(format!("agent-{}.log", n.name()));
        vec![
            a.start_policy_service_agent(&api, &log(a)),
            b.start_policy_service_agent(&api, &log(b)),
        ]
    } else {
        cluster.replace_kube_proxy(&api, &[], logs.path()).into()
    };
    World {
        _servers: servers,
        _echo: echo,
        agents,
        api,
        logs,
        a1,
        a2,
        a3,
        b1,
        b2,
        cgroup,
        cluster,
    }
}

impl World {
    /// Stops both agents and starts new ones, with the replacement `on` or off.
    fn restart_agents(&mut self, on: bool) {
        self.agents.clear();
        let log = |n: &str| self.logs.path().join(format!("agent-{n}.log"));
        self.agents = vec![
            self.cluster
                .a()
                .start_service_agent(&self.api, on, &log("node-a")),
            self.cluster
                .b()
                .start_service_agent(&self.api, on, &log("node-b")),
        ];
    }

    /// Both agents' logs.
    fn agent_logs(&self) -> String {
        testbed::cluster::agent_logs(self.logs.path())
    }

    /// Writes the Service `name` with one TCP port (`PORT` → `PORT`) on `ip`, and `spec`'s
    /// fields over the defaults.
    fn put_service(&self, name: &str, ip: &str, spec: &Value) {
        let mut s = json!({
            "clusterIP": ip,
            "clusterIPs": [ip],
            "type": "ClusterIP",
            "ports": [{ "name": "http", "protocol": "TCP", "port": PORT, "targetPort": PORT }],
        });
        if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
            s.extend(extra.clone());
        }
        self.api.put(
            "services",
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": { "name": name, "namespace": "default" },
                "spec": s,
            }),
        );
    }

    /// Writes the IPv4 EndpointSlice of Service `name` with `endpoints` (port `PORT` over
    /// TCP as `http` and over UDP as `udp`, and `ECHO_PORT` as `echo`).
    fn put_slice(&self, name: &str, endpoints: &[Value]) {
        self.api.put(
            "endpointslices",
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{name}-ipv4"),
                    "namespace": "default",
                    "labels": { "kubernetes.io/service-name": name },
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [
                    { "name": "http", "protocol": "TCP", "port": PORT },
                    { "name": "udp", "protocol": "UDP", "port": PORT },
                    { "name": "echo", "protocol": "TCP", "port": ECHO_PORT },
                ],
            }),
        );
    }

    /// Waits until `node`'s maps give frontend `ip:port` (TCP) exactly `backends`
    /// (`ip:port`, any order). Panics with the agents' logs after ten seconds.
    #[track_caller]
    fn wait_for(&self, node: &ClusterNode, ip: &str, port: u16, backends: &[String]) {
        let at = At::Ip(ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])));
        self.wait_for_frontend(node, at, port, Scope::Socket, backends);
    }

    /// [`Self::wait_for`] for frontend `at:port` (TCP) in `scope`.
    #[track_caller]
    fn wait_for_frontend(
        &self,
        node: &ClusterNode,
        at: At,
        port: u16,
        scope: Scope,
        backends: &[String],
    ) {
        let mut want: Vec<String> = backends.to_vec();
        want.sort();
        let key = frontend_key(at, port, cni_ebpf_common::proto::TCP, scope);
        let (ip, port) = (format!("{at:?} ({scope:?})"), port);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let frontend = node.pinned_datapath().service_frontend(&key).ok().flatten();
            let have: Option<Vec<String>> = frontend.map(|f| {
                let mut v: Vec<String> = f
                    .backends
                    .iter()
                    .map(|b| cni_ebpf::datapath::services::backend_addr(b).to_string())
                    .collect();
                v.sort();
                v
            });
            if have.as_ref() == Some(&want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: frontend {ip}:{port} has {have:?}, not {want:?}, after 10 s; agent logs:\n{}",
                node.name(),
                self.agent_logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Self::wait_for`] on both nodes.
    #[track_caller]
    fn wait_everywhere(&self, ip: &str, port: u16, backends: &[String]) {
        for n in self.cluster.nodes() {
            self.wait_for(n, ip, port, backends);
        }
    }

    /// One TCP request from `netns` (a process in the test's cgroup) to `addr`: the
    /// server's IP, or why not.
    fn served_by(&self, netns: &Path, addr: &str) -> Result<String, String> {
        self.ask(netns, "tcp", addr).map(|(_, server)| server)
    }

    /// One request over `proto` (`tcp`, `udp`) from `netns` (a process in the test's
    /// cgroup) to `addr`: the client's address as the server saw it and the server's IP,
    /// or why not.
    fn ask(&self, netns: &Path, proto: &str, addr: &str) -> Result<(String, String), String> {
        self.ask_within(netns, proto, addr, Duration::from_secs(2))
    }

    /// [`Self::ask`], giving up after `timeout`.
    fn ask_within(
        &self,
        netns: &Path,
        proto: &str,
        addr: &str,
        timeout: Duration,
    ) -> Result<(String, String), String> {
        let ms = timeout.as_millis().to_string();
        let out = self
            .cgroup
            .exec_in(netns, &[NETCLIENT, proto, addr, "hello", &ms]);
        if !out.success() {
            return Err(out.stderr.trim().to_owned());
        }
        let mut lines = out.stdout.lines();
        let from = lines.next().unwrap_or_default();
        if from != format!("from {addr}") {
            return Err(format!("getpeername showed {from}, not {addr}"));
        }
        // The who-am-I server answers the client's address, then its name (its address).
        let client = lines.next().unwrap_or_default().trim();
        let server = lines.next().unwrap_or_default().trim();
        // `ip:port`, the IPv6 address unbracketed: the port is the last field.
        let client = client.rsplit_once(':').map_or(client, |(ip, _)| ip);
        Ok((client.to_owned(), server.to_owned()))
    }

    /// `n` requests from `netns` to `addr`: how many each server answered.
    #[track_caller]
    fn spread(&self, netns: &Path, addr: &str, n: usize) -> BTreeMap<String, usize> {
        let mut seen = BTreeMap::new();
        for i in 0..n {
            match self.served_by(netns, addr) {
                Ok(ip) => *seen.entry(ip).or_insert(0) += 1,
                Err(e) => panic!("request {i} of {n} to {addr}: {e}"),
            }
        }
        seen
    }
}

/// `ip:PORT`.
fn at(ip: &str) -> String {
    format!("{ip}:{PORT}")
}

/// A ready endpoint `ip` on `node`.
fn ready(ip: &str, node: &str) -> Value {
    endpoint(ip, node, true, false)
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn new_connections_spread_over_ready_endpoints_and_fall_back_to_terminating_ones() {
    let w = world("svc_spread");
    let vip = "10.96.1.1";
    w.put_service("spread", vip, &json!({}));
    w.put_slice(
        "spread",
        &[
            ready(&w.a1.ip4, "node-a"),
            ready(&w.a3.ip4, "node-a"),
            ready(&w.b1.ip4, "node-b"),
        ],
    );
    let all = [at(&w.a1.ip4), at(&w.a3.ip4), at(&w.b1.ip4)];
    w.wait_everywhere(vip, PORT, &all);
    // `inspect` shows the frontend with its backends.
    let doc = testbed::datapath::inspect(w.cluster.a());
    let shown = doc["services"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["frontend"] == json!(at(vip))))
        .cloned()
        .unwrap_or_default();
    assert_eq!(shown["protocol"], "tcp", "{doc:#}");
    let mut backends: Vec<String> = shown["backends"]
        .as_array()
        .map(|b| {
            b.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    backends.sort();
    let mut want = all.to_vec();
    want.sort();
    assert_eq!(backends, want, "{shown:#}");
    // Uniform: 90 connections, each of 3 backends expects 30 (σ ≈ 4.5); fewer than 12 is
    // four σ off.
    let seen = w.spread(w.a2.pod.netns(), &at(vip), 90);
    eprintln!("90 connections from a2: {seen:?}");
    for ip in [&w.a1.ip4, &w.a3.ip4, &w.b1.ip4] {
        let n = seen.get(ip.as_str()).copied().unwrap_or(0);
        assert!(n >= 12, "{ip} got {n} of 90: {seen:?}");
    }
    // From the other node and from the node's own processes: every backend reachable.
    let seen = w.spread(w.b2.pod.netns(), &at(vip), 30);
    assert_eq!(seen.len(), 3, "from b2: {seen:?}");
    let seen = w.spread(w.cluster.a().netns(), &at(vip), 30);
    assert_eq!(seen.len(), 3, "from node A: {seen:?}");

    // b1 terminating: no new connection goes to it while others are ready.
    w.put_slice(
        "spread",
        &[
            ready(&w.a1.ip4, "node-a"),
            ready(&w.a3.ip4, "node-a"),
            endpoint(&w.b1.ip4, "node-b", false, true),
        ],
    );
    w.wait_everywhere(vip, PORT, &all[..2]);
    let seen = w.spread(w.b2.pod.netns(), &at(vip), 30);
    assert!(!seen.contains_key(&w.b1.ip4), "{seen:?}");
    // Nothing ready: the terminating endpoint serves.
    w.put_slice("spread", &[endpoint(&w.b1.ip4, "node-b", false, true)]);
    w.wait_everywhere(vip, PORT, &all[2..]);
    let seen = w.spread(w.a2.pod.netns(), &at(vip), 10);
    assert_eq!(seen.keys().collect::<Vec<_>>(), [&w.b1.ip4], "{seen:?}");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_service_without_endpoints_refuses_at_once() {
    let w = world("svc_refuse");
    let vip = "10.96.1.2";
    w.put_service("empty", vip, &node_port_spec(30120, &json!({})));
    w.put_slice("empty", &[]);
    w.wait_everywhere(vip, PORT, &[]);
    let node_port = format!("{}:30120", w.cluster.a().ip4());
    for (who, netns, addr) in [
        ("pod a2", w.a2.pod.netns(), at(vip)),
        ("node A", w.cluster.a().netns(), at(vip)),
        (
            "pod a2 via the NodePort",
            w.a2.pod.netns(),
            node_port.clone(),
        ),
        (
            "outside via the NodePort",
            w.cluster.ext_netns(),
            node_port.clone(),
        ),
    ] {
        for proto in ["tcp", "udp"] {
            let started = Instant::now();
            let out = w
                .cgroup
                .exec_in(netns, &[NETCLIENT, proto, &addr, "hello", "3000"]);
            let took = started.elapsed();
            assert!(
                !out.success() && out.stderr.contains("refused"),
                "{who} {proto}: not refused: {out}"
            );
            assert!(
                took < Duration::from_secs(1),
                "{who} {proto}: refused after {took:?}"
            );
            eprintln!("{who} {proto}: refused in {took:?}");
        }
    }
    // An endpoint appears: served, from outside too.
    w.put_slice("empty", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_everywhere(vip, PORT, &[at(&w.a1.ip4)]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at(vip)),
        Ok(w.a1.ip4.clone())
    );
    let a = w.cluster.a();
    w.wait_for_frontend(
        a,
        At::Node { ipv6: false },
        30120,
        Scope::Uplink,
        &[at(&w.a1.ip4)],
    );
    assert_eq!(
        w.ask(w.cluster.ext_netns(), "udp", &node_port),
        Ok((EXT_IP4.to_owned(), w.a1.ip4.clone()))
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn client_ip_affinity_keeps_each_client_on_one_backend() {
    let w = world("svc_affinity");
    let vip = "10.96.1.3";
    w.put_service(
        "sticky",
        vip,
        &json!({
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": { "clientIP": { "timeoutSeconds": 600 } },
        }),
    );
    let eps = [
        ready(&w.a1.ip4, "node-a"),
        ready(&w.a3.ip4, "node-a"),
        ready(&w.b1.ip4, "node-b"),
    ];
    w.put_slice("sticky", &eps);
    w.wait_everywhere(vip, PORT, &[at(&w.a1.ip4), at(&w.a3.ip4), at(&w.b1.ip4)]);
    let mut chosen = Vec::new();
    for (who, netns) in [("a2", w.a2.pod.netns()), ("b2", w.b2.pod.netns())] {
        let seen = w.spread(netns, &at(vip), 20);
        assert_eq!(
            seen.len(),
            1,
            "{who} was sent to several backends: {seen:?}"
        );
        chosen.push(seen.keys().next().cloned().unwrap_or_default());
    }
    // a2's backend leaves: a2 moves to another one, and stays there.
    let gone = chosen[0].clone();
    let rest: Vec<Value> = eps
        .iter()
        .filter(|e| e["addresses"][0] != json!(gone))
        .cloned()
        .collect();
    w.put_slice("sticky", &rest);
    let rest_at: Vec<String> = [&w.a1.ip4, &w.a3.ip4, &w.b1.ip4]
        .iter()
        .filter(|ip| ***ip != gone)
        .map(|ip| at(ip))
        .collect();
    w.wait_everywhere(vip, PORT, &rest_at);
    let seen = w.spread(w.a2.pod.netns(), &at(vip), 20);
    assert_eq!(seen.len(), 1, "a2 after its backend left: {seen:?}");
    assert!(!seen.contains_key(&gone), "{seen:?}");
    // Without affinity the same client spreads again.
    w.put_service("sticky", vip, &json!({ "sessionAffinity": "None" }));
    std::thread::sleep(Duration::from_millis(500));
    let seen = w.spread(w.a2.pod.netns(), &at(vip), 30);
    assert_eq!(seen.len(), 2, "a2 without affinity: {seen:?}");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn internal_traffic_policy_local_serves_only_this_nodes_endpoints() {
    let w = world("svc_itp");
    let vip = "10.96.1.4";
    w.put_service("local", vip, &json!({ "internalTrafficPolicy": "Local" }));
    w.put_slice("local", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_for(w.cluster.a(), vip, PORT, &[at(&w.a1.ip4)]);
    w.wait_for(w.cluster.b(), vip, PORT, &[]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at(vip)),
        Ok(w.a1.ip4.clone())
    );
    let from_b = w.served_by(w.b2.pod.netns(), &at(vip));
    assert!(
        from_b.as_ref().is_err_and(|e| e.contains("refused")),
        "node B has no local endpoint, yet: {from_b:?}"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn connections_live_through_endpoint_churn_an_agent_restart_and_the_switch_back() {
    let mut w = world("svc_churn");
    let vip = "10.96.1.5";
    w.put_service(
        "churn",
        vip,
        &json!({
            "ports": [{ "name": "echo", "protocol": "TCP", "port": ECHO_PORT, "targetPort": ECHO_PORT }],
        }),
    );
    w.put_slice("churn", &[ready(&w.a1.ip4, "node-a")]);
    let echo_at = |ip: &str| format!("{ip}:{ECHO_PORT}");
    w.wait_everywhere(vip, ECHO_PORT, &[echo_at(&w.a1.ip4)]);
    // Two long conversations (from a pod on each node), 120 round trips 50 ms apart.
    let conversations: Vec<_> = [w.a2.pod.netns(), w.b2.pod.netns()]
        .into_iter()
        .map(|netns| {
            let mut cmd = std::process::Command::new(NETCLIENT);
            cmd.args(["converse", &echo_at(vip), "120", "50"]);
            testbed::process::in_netns(&mut cmd, netns);
            w.cgroup.enter_on_exec(&mut cmd);
            std::thread::spawn(move || {
                testbed::process::run_cmd(cmd, None, Duration::from_secs(60))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Churn that keeps a1: others come and go.
    w.put_slice(
        "churn",
        &[
            ready(&w.a1.ip4, "node-a"),
            ready(&w.a3.ip4, "node-a"),
            ready(&w.b1.ip4, "node-b"),
        ],
    );
    w.wait_everywhere(
        vip,
        ECHO_PORT,
        &[echo_at(&w.a1.ip4), echo_at(&w.a3.ip4), echo_at(&w.b1.ip4)],
    );
    w.put_slice(
        "churn",
        &[ready(&w.a1.ip4, "node-a"), ready(&w.b1.ip4, "node-b")],
    );
    w.wait_everywhere(vip, ECHO_PORT, &[echo_at(&w.a1.ip4), echo_at(&w.b1.ip4)]);
    // The agents restart: what they find pinned stays, and the next change lands.
    let before = w.cluster.a().pinned_datapath().service_table().ok();
    w.restart_agents(true);
    // Its first round (from the full lists) leaves the maps as they were.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(w.cluster.a().pinned_datapath().service_table().ok(), before);
    w.put_slice("churn", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_everywhere(vip, ECHO_PORT, &[echo_at(&w.a1.ip4)]);
    // Back to kube-proxy: agents without the mode empty the maps.
    w.restart_agents(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.cluster.nodes().iter().any(|n| {
        !n.pinned_datapath()
            .service_table()
            .unwrap_or_default()
            .is_empty()
    }) {
        assert!(
            Instant::now() < deadline,
            "Service maps not emptied; logs:\n{}",
            w.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, c) in conversations.into_iter().enumerate() {
        let out = c
            .join()
            .unwrap_or_else(|_| panic!("conversation {i} panicked"));
        assert!(
            out.success() && out.stdout.contains("120 round trips"),
            "conversation {i}: {out}"
        );
        assert!(
            out.stdout.starts_with(&format!("from {}", echo_at(vip))),
            "conversation {i}: {out}"
        );
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn switching_over_from_kube_proxy_keeps_established_connections() {
    let mut w = world("svc_switch");
    // A node as it runs before the switch: kube-proxy's rules (nftables mode), agents
    // without the replacement.
    w.restart_agents(false);
    let vip = "10.96.1.7";
    let svc = ServicePort::new("default/switch", "echo", Protocol::Tcp, vip, ECHO_PORT)
        .endpoint(&format!("{}:{ECHO_PORT}", w.a1.ip4), "node-a");
    w.cluster
        .install_kube_proxy(Mode::Nftables, std::slice::from_ref(&svc));
    for (resource, obj) in testbed::service_objects::objects(std::slice::from_ref(&svc)) {
        w.api.put(resource, obj);
    }
    let addr = format!("{vip}:{ECHO_PORT}");
    // Conversations through kube-proxy's DNAT, from a pod on each node: 60 round trips,
    // 50 ms apart.
    let conversations: Vec<_> = [w.a2.pod.netns(), w.b2.pod.netns()]
        .into_iter()
        .map(|netns| {
            let mut cmd = std::process::Command::new(NETCLIENT);
            cmd.args(["converse", &addr, "60", "50"]);
            testbed::process::in_netns(&mut cmd, netns);
            w.cgroup.enter_on_exec(&mut cmd);
            std::thread::spawn(move || {
                testbed::process::run_cmd(cmd, None, Duration::from_secs(60))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    // The switch: agents with the replacement fill the maps while the conversations go on.
    w.restart_agents(true);
    w.wait_everywhere(vip, ECHO_PORT, &[format!("{}:{ECHO_PORT}", w.a1.ip4)]);
    for (i, c) in conversations.into_iter().enumerate() {
        let out = c
            .join()
            .unwrap_or_else(|_| panic!("conversation {i} panicked"));
        assert!(
            out.success() && out.stdout.contains("60 round trips"),
            "conversation {i} across the switch: {out}"
        );
    }
    // kube-proxy's rules go (as `kube-proxy --cleanup` removes them): new connections are
    // translated at the socket alone.
    for n in w.cluster.nodes() {
        n.exec(&["nft", "delete table ip kube-proxy"]).ok();
    }
    for netns in [w.a2.pod.netns(), w.b2.pod.netns(), w.cluster.b().netns()] {
        let out = w
            .cgroup
            .exec_in(netns, &[NETCLIENT, "converse", &addr, "3", "0"]);
        assert!(out.success(), "after kube-proxy's rules went: {out}");
    }
}

/// `nsenter --net=<netns> ip route add <dst> via <via>`: the outside world's route to an
/// external IP or a load-balancer address through a node, as a router or a load balancer
/// in front of the cluster would hold it.
fn route_via(netns: &Path, dst: &str, via: &str) {
    let net = format!("--net={}", netns.display());
    let out = testbed::process::run(&["nsenter", &net, "ip", "route", "replace", dst, "via", via]);
    assert!(
        out.success(),
        "ip route replace {dst} via {via}: {}",
        out.stderr
    );
}

/// A Service with one TCP and one UDP port `PORT`, both with NodePort `node_port`.
fn node_port_spec(node_port: u16, extra: &Value) -> Value {
    let mut s = json!({
        "type": "NodePort",
        "externalTrafficPolicy": "Cluster",
        "ports": [
            { "name": "http", "protocol": "TCP", "port": PORT, "nodePort": node_port },
            { "name": "udp", "protocol": "UDP", "port": PORT, "nodePort": node_port },
        ],
    });
    if let (Some(s), Some(extra)) = (s.as_object_mut(), extra.as_object()) {
        s.extend(extra.clone());
    }
    s
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn node_ports_from_outside_reach_backends_on_either_node() {
    let w = world("svc_np");
    w.put_service("np", "10.96.1.20", &node_port_spec(30100, &json!({})));
    w.put_slice(
        "np",
        &[ready(&w.a1.ip4, "node-a"), ready(&w.b1.ip4, "node-b")],
    );
    let both = [at(&w.a1.ip4), at(&w.b1.ip4)];
    for n in w.cluster.nodes() {
        for scope in [Scope::Socket, Scope::Uplink] {
            w.wait_for_frontend(n, At::Node { ipv6: false }, 30100, scope, &both);
        }
    }
    let ext = w.cluster.ext_netns();
    for node in w.cluster.nodes() {
        let (local, remote) = if node.name() == "node-a" {
            (&w.a1.ip4, &w.b1.ip4)
        } else {
            (&w.b1.ip4, &w.a1.ip4)
        };
        let addr = format!("{}:30100", node.ip4());
        for proto in ["tcp", "udp"] {
            // Which clients each backend saw.
            let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for i in 0..30 {
                match w.ask(ext, proto, &addr) {
                    Ok((client, server)) => seen.entry(server).or_default().push(client),
                    Err(e) => panic!("{proto} request {i} to {addr}: {e}\n{}", w.agent_logs()),
                }
            }
            eprintln!("{proto} {addr}: {seen:?}");
            // The backend on the node the flow arrived at sees the client; the one on the
            // other node sees the node that sent it on.
            let of = |s: &str| seen.get(s).cloned().unwrap_or_default();
            assert!(!of(local).is_empty() && !of(remote).is_empty(), "{seen:?}");
            assert!(of(local).iter().all(|c| c == EXT_IP4), "{seen:?}");
            assert!(of(remote).iter().all(|c| c == node.ip4()), "{seen:?}");
        }
        assert!(node.reason_count("service_new") > 0);
        assert!(node.reason_count("service_new_routed") > 0);
    }
    // From inside, the node's own NodePort is translated at the socket.
    let (_, server) = w
        .ask(
            w.a2.pod.netns(),
            "tcp",
            &format!("{}:30100", w.cluster.a().ip4()),
        )
        .unwrap_or_else(|e| panic!("pod → its node's NodePort: {e}"));
    assert!(
        both.iter().any(|b| b.starts_with(&format!("{server}:"))),
        "{server}"
    );
    // A long conversation through the other node's NodePort.
    let echo = format!("{}:30101", w.cluster.b().ip4());
    w.put_service(
        "np-echo",
        "10.96.1.22",
        &json!({
            "type": "NodePort",
            "ports": [{ "name": "echo", "protocol": "TCP", "port": ECHO_PORT, "nodePort": 30101 }],
        }),
    );
    w.put_slice("np-echo", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_for_frontend(
        w.cluster.b(),
        At::Node { ipv6: false },
        30101,
        Scope::Uplink,
        &[format!("{}:{ECHO_PORT}", w.a1.ip4)],
    );
    let out = w
        .cgroup
        .exec_in(ext, &[NETCLIENT, "converse", &echo, "120", "50"]);
    assert!(
        out.success(),
        "120 round trips through {echo}: {}",
        out.stderr
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn external_traffic_policy_local_keeps_the_client_and_answers_the_health_check() {
    let w = world("svc_etp");
    let (lb, external) = ("203.0.113.21", "203.0.113.22");
    let spec = node_port_spec(
        30102,
        &json!({
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32102,
            "externalIPs": [external],
        }),
    );
    w.api.put(
        "services",
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": "lb", "namespace": "default" },
            "spec": spec.as_object().map(|o| {
                let mut o = o.clone();
                o.insert("clusterIP".into(), json!("10.96.1.23"));
                o.insert("clusterIPs".into(), json!(["10.96.1.23"]));
                o
            }),
            "status": { "loadBalancer": { "ingress": [{ "ip": lb }] } },
        }),
    );
    w.put_slice("lb", &[ready(&w.a1.ip4, "node-a")]);
    let (a, b) = (w.cluster.a(), w.cluster.b());
    w.wait_for_frontend(
        a,
        At::Node { ipv6: false },
        30102,
        Scope::Uplink,
        &[at(&w.a1.ip4)],
    );
    w.wait_for_frontend(b, At::Node { ipv6: false }, 30102, Scope::Uplink, &[]);
    let ext = w.cluster.ext_netns();
    // Node A has the endpoint: the pod sees the client.
    route_via(ext, &format!("{lb}/32"), a.ip4());
    route_via(ext, &format!("{external}/32"), a.ip4());
    for addr in [format!("{}:30102", a.ip4()), at(lb), at(external)] {
        for proto in ["tcp", "udp"] {
            assert_eq!(
                w.ask(ext, proto, &addr),
                Ok((EXT_IP4.to_owned(), w.a1.ip4.clone())),
                "{proto} {addr}"
            );
        }
    }
    // Node B has none: flows from outside are dropped there, not sent to node A.
    let before = b.reason_count("drop_service_no_backend");
    assert!(w.ask(ext, "tcp", &format!("{}:30102", b.ip4())).is_err());
    assert!(b.reason_count("drop_service_no_backend") > before);
    // From inside, the policy does not apply: a pod on node B reaches node B's NodePort,
    // the load-balancer address and the external IP.
    for addr in [format!("{}:30102", b.ip4()), at(lb), at(external)] {
        assert_eq!(
            w.served_by(w.b2.pod.netns(), &addr),
            Ok(w.a1.ip4.clone()),
            "{addr}"
        );
    }
    // The health check: 200 where an endpoint is, 503 where none is.
    let health = |node: &ClusterNode| {
        let addr = format!("{}:32102", node.ip4())
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        testbed::net::http_get(ext, addr, "/healthz", Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("GET {addr}: {e}\n{}", w.agent_logs()))
    };
    let (status, head, body) = health(a);
    assert_eq!(status, 200, "{head}\n{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
    assert_eq!(body["localEndpoints"], 1, "{body}");
    assert_eq!(body["service"]["name"], "lb", "{body}");
    assert_eq!(health(b).0, 503);
    // An endpoint on node B too: node B serves from outside with its own, the client kept.
    w.put_slice(
        "lb",
        &[ready(&w.a1.ip4, "node-a"), ready(&w.b1.ip4, "node-b")],
    );
    w.wait_for_frontend(
        b,
        At::Node { ipv6: false },
        30102,
        Scope::Uplink,
        &[at(&w.b1.ip4)],
    );
    assert_eq!(
        w.ask(ext, "tcp", &format!("{}:30102", b.ip4())),
        Ok((EXT_IP4.to_owned(), w.b1.ip4.clone()))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while health(b).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "node B's health check still fails"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes the NetworkPolicy `name` of namespace `default`: the `app: web` pods admit
/// `from` (a list of peers) on `ports` (`(protocol, port)`) and nothing else.
fn put_web_policy(api: &ApiServer, name: &str, from: &Value, ports: &[(&str, u16)]) {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(protocol, port)| json!({ "protocol": protocol, "port": port }))
        .collect();
    api.put(
        "networkpolicies",
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "namespace": "default", "name": name },
            "spec": {
                "podSelector": { "matchLabels": { "app": "web" } },
                "policyTypes": ["Ingress"],
                "ingress": [{ "from": from, "ports": ports }],
            },
        }),
    );
}

/// One request of a policy test: from `netns` over `proto` to `addr`, which must be
/// `served` (`Some((client as the server saw it, server))`), or not at all (`None`).
struct Expect<'a> {
    what: &'a str,
    netns: &'a Path,
    proto: &'a str,
    addr: String,
    served: Option<(String, String)>,
}

impl World {
    /// Asks each of `expect` until its answer is the expected one (the agents put a
    /// policy change in force within a second), then once more, which must agree: a
    /// verdict that flips back fails too. Panics with the agents' logs after 10 s.
    #[track_caller]
    fn settle(&self, step: &str, expect: &[Expect<'_>]) {
        let timeout = Duration::from_millis(800);
        for e in expect {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut confirmed = 0;
            loop {
                let got = self.ask_within(e.netns, e.proto, &e.addr, timeout).ok();
                if got == e.served {
                    confirmed += 1;
                    if confirmed == 2 {
                        break;
                    }
                    continue;
                }
                assert!(
                    confirmed == 0 && Instant::now() < deadline,
                    "{step}: {} ({} {}) got {got:?}, not {:?}; agent logs:\n{}",
                    e.what,
                    e.proto,
                    e.addr,
                    e.served,
                    self.agent_logs()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// NetworkPolicy judges a Service flow by the backend pod's real address and port, not
/// by the Service's: flows from pods to a ClusterIP (translated at the socket) and from
/// outside to a NodePort (translated in the uplink; the client kept when the backend is
/// on the node the flow arrived at, the node's own address when it was sent on to the
/// other node), TCP and UDP, as policies are put, changed and widened.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn network_policy_judges_service_flows_by_the_backends_address_and_port() {
    let w = policy_world("svc_netpol");
    let (a, b) = (w.cluster.a(), w.cluster.b());
    // One Service per server, so that each request's backend is known: port 80 to the
    // pods' 8080, NodePort 30110 for `a1` (node A) and 30111 for `b1` (node B).
    let services = [
        ("web-a", "10.96.1.30", 30110, &w.a1, "node-a"),
        ("web-b", "10.96.1.31", 30111, &w.b1, "node-b"),
    ];
    for (name, ip, node_port, backend, node) in services {
        let port = |name: &str, protocol: &str| {
            json!({
                "name": name, "protocol": protocol, "port": 80, "targetPort": PORT,
                "nodePort": node_port,
            })
        };
        w.put_service(
            name,
            ip,
            &json!({ "type": "NodePort", "ports": [port("http", "TCP"), port("udp", "UDP")] }),
        );
        w.put_slice(name, &[ready(&backend.ip4, node)]);
    }
    for n in [a, b] {
        for (_, ip, node_port, backend, _) in services {
            w.wait_for(n, ip, 80, &[at(&backend.ip4)]);
            let at_node = At::Node { ipv6: false };
            w.wait_for_frontend(n, at_node, node_port, Scope::Uplink, &[at(&backend.ip4)]);
        }
    }
    let ext = w.cluster.ext_netns();
    let (a2, b2) = (w.a2.pod.netns(), w.b2.pod.netns());
    let (web_a, web_b) = ("10.96.1.30:80".to_owned(), "10.96.1.31:80".to_owned());
    let a1_via_a = format!("{}:30110", a.ip4());
    let b1_via_a = format!("{}:30111", a.ip4());
    let b1_via_b = format!("{}:30111", b.ip4());
    let served = |client: &str, server: &Running| Some((client.to_owned(), server.ip4.clone()));
    let expect = |what, netns, proto, addr: &String, served| Expect {
        what,
        netns,
        proto,
        addr: addr.clone(),
        served,
    };
    let (client, other) = (&w.a2.ip4, &w.b2.ip4);
    // No policy: everything is served; from outside, the backend on the receiving node
    // sees the client, the one on the other node sees the receiving node.
    w.settle(
        "no policy",
        &[
            expect("client → web-a", a2, "tcp", &web_a, served(client, &w.a1)),
            expect("client → web-b", a2, "tcp", &web_b, served(client, &w.b1)),
            expect("other → web-a", b2, "tcp", &web_a, served(other, &w.a1)),
            expect(
                "ext → a1 via A",
                ext,
                "tcp",
                &a1_via_a,
                served(EXT_IP4, &w.a1),
            ),
            expect(
                "ext → b1 via A",
                ext,
                "udp",
                &b1_via_a,
                served(a.ip4(), &w.b1),
            ),
            expect(
                "ext → b1 via B",
                ext,
                "tcp",
                &b1_via_b,
                served(EXT_IP4, &w.b1),
            ),
        ],
    );
    // The web pods admit the `role: client` pods on TCP 8080 only.
    let clients = json!([{ "podSelector": { "matchLabels": { "role": "client" } } }]);
    put_web_policy(&w.api, "clients", &clients, &[("TCP", PORT)]);
    w.settle(
        "clients on TCP 8080",
        &[
            expect("client → web-a", a2, "tcp", &web_a, served(client, &w.a1)),
            expect("client → web-b", a2, "tcp", &web_b, served(client, &w.b1)),
            expect("client → web-a over UDP", a2, "udp", &web_a, None),
            expect("other → web-a", b2, "tcp", &web_a, None),
            expect("other → web-b", b2, "tcp", &web_b, None),
            expect("ext → a1 via A", ext, "tcp", &a1_via_a, None),
            expect("ext → b1 via A", ext, "tcp", &b1_via_a, None),
            expect("ext → b1 via B", ext, "udp", &b1_via_b, None),
        ],
    );
    // The Service port and the NodePort are not the pods' ports: admitting them admits
    // nothing.
    let outside = json!([{ "ipBlock": { "cidr": format!("{EXT_IP4}/32") } }]);
    put_web_policy(&w.api, "clients", &clients, &[("TCP", 80), ("TCP", 30110)]);
    put_web_policy(
        &w.api,
        "outside",
        &outside,
        &[("TCP", 80), ("TCP", 30110), ("UDP", 30111)],
    );
    w.settle(
        "the Service's ports",
        &[
            expect("client → web-a", a2, "tcp", &web_a, None),
            expect("ext → a1 via A", ext, "tcp", &a1_via_a, None),
            expect("ext → b1 via B", ext, "udp", &b1_via_b, None),
        ],
    );
    // The outside client on the pods' port: admitted where the backend sees it, not
    // where the flow was sent on from node A (the backend sees node A).
    put_web_policy(&w.api, "clients", &clients, &[("TCP", PORT)]);
    put_web_policy(&w.api, "outside", &outside, &[("TCP", PORT), ("UDP", PORT)]);
    w.settle(
        "the outside client on 8080",
        &[
            expect("client → web-a", a2, "tcp", &web_a, served(client, &w.a1)),
            expect(
                "ext → a1 via A",
                ext,
                "tcp",
                &a1_via_a,
                served(EXT_IP4, &w.a1),
            ),
            expect(
                "ext → a1 via A",
                ext,
                "udp",
                &a1_via_a,
                served(EXT_IP4, &w.a1),
            ),
            expect(
                "ext → b1 via B",
                ext,
                "tcp",
                &b1_via_b,
                served(EXT_IP4, &w.b1),
            ),
            expect("ext → b1 via A", ext, "tcp", &b1_via_a, None),
            expect("other → web-b", b2, "tcp", &web_b, None),
        ],
    );
    // Node A's address admitted: what it sends on is served.
    let node_a = json!([{ "ipBlock": { "cidr": format!("{}/32", a.ip4()) } }]);
    put_web_policy(&w.api, "node-a", &node_a, &[("TCP", PORT)]);
    w.settle(
        "node A admitted",
        &[
            expect(
                "ext → b1 via A",
                ext,
                "tcp",
                &b1_via_a,
                served(a.ip4(), &w.b1),
            ),
            expect("ext → b1 via A", ext, "udp", &b1_via_a, None),
        ],
    );
    assert!(a.reason_count("service_new_routed") > 0);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_field_the_mode_does_not_translate_is_reported_on_the_service() {
    let w = world("svc_event");
    w.put_service(
        "np",
        "10.96.1.6",
        &json!({
            "type": "NodePort",
            "ports": [
                { "name": "http", "protocol": "TCP", "port": PORT, "nodePort": 30999 },
                { "name": "sctp", "protocol": "SCTP", "port": 9999 },
            ],
        }),
    );
    w.put_slice("np", &[ready(&w.a1.ip4, "node-a")]);
    // The ClusterIP part works …
    w.wait_everywhere("10.96.1.6", PORT, &[at(&w.a1.ip4)]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at("10.96.1.6")),
        Ok(w.a1.ip4.clone())
    );
    // … and the SCTP port is named in a Warning Event on the Service.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<Value> = w
            .api
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "ServiceFieldNotHandled")
            .collect();
        if let Some(e) = events.first() {
            let text = e.to_string();
            assert!(text.contains("protocol SCTP (port 9999)"), "{text}");
            assert!(text.contains("\"np\""), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ServiceFieldNotHandled Event after 10 s; logs:\n{}",
            w.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_pods_namespace_is_forgotten_with_the_pod() {
    let w = world("svc_netns");
    let count = |n: &ClusterNode| {
        n.pinned_datapath()
            .map_stats()
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.name == cni_ebpf_common::map::SERVICE_NETNS)
            .and_then(|m| m.entries)
    };
    assert_eq!(count(w.cluster.a()), Some(3));
    assert_eq!(count(w.cluster.b()), Some(2));
    w.cluster
        .a()
        .del(&w.a2.pod, "eth0", &w.cluster.a().conf_dual_stack());
    assert_eq!(count(w.cluster.a()), Some(2));
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ten_thousand_services_with_a_hundred_thousand_endpoints() {
    let w = world("svc_scale");
    const SERVICES: usize = 10_000;
    const PER: usize = 10;
    let started = Instant::now();
    for i in 0..SERVICES {
        let name = format!("s{i}");
        let vip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
        w.put_service(&name, &vip, &json!({}));
        // Nine endpoints that do not exist (never connected to) and one real one.
        let mut eps: Vec<Value> = (0..PER - 1)
            .map(|j| ready(&format!("10.250.{}.{}", i % 250, j + 1), "node-b"))
            .collect();
        eps.push(ready(&w.a1.ip4, "node-a"));
        w.put_slice(&name, &eps);
    }
    eprintln!(
        "{SERVICES} Services and {} endpoints written to the API in {:?}",
        SERVICES * PER,
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let loaded = |n: &ClusterNode| {
        let t = n.pinned_datapath().service_table().unwrap_or_default();
        t.len() == SERVICES && t.values().all(|f| f.backends.len() == PER)
    };
    while !w.cluster.nodes().iter().all(|n| loaded(n)) {
        assert!(
            Instant::now() < deadline,
            "not loaded after 120 s; logs:\n{}",
            w.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "loaded on both nodes {:?} after the first write",
        started.elapsed()
    );
    // One change reaches the datapath of a node holding 10 000 Services.
    let changed = Instant::now();
    w.put_slice("s4321", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_for(w.cluster.a(), "10.97.17.72", PORT, &[at(&w.a1.ip4)]);
    eprintln!(
        "one EndpointSlice change in force after {:?}",
        changed.elapsed()
    );
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at("10.97.17.72")),
        Ok(w.a1.ip4.clone())
    );
    let stats = w
        .cluster
        .a()
        .pinned_datapath()
        .map_stats()
        .unwrap_or_default();
    for m in stats.iter().filter(|m| m.name.starts_with("SERVICE")) {
        eprintln!(
            "{}: {:?} entries, {} KiB",
            m.name,
            m.entries,
            m.memlock_bytes / 1024
        );
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_flow_to_a_service_names_the_service_and_the_backend_it_was_sent_to() {
    // The socket hooks connect a2's socket straight to the backend: its packets carry
    // b1's address from the first one on. Node A's flow record still names the Service
    // a2 asked for, beside the backend it got.
    let w = world("svc_flows");
    // Node A's agent turns flows on from a thread of lower priority than its Services'.
    let on = testbed::datapath::wait_until(Duration::from_secs(15), || {
        w.cluster.a().flows_on_of("testnet")
    });
    assert!(on, "node A never turned flows on:\n{}", w.agent_logs());
    let vip = "10.96.1.7";
    w.put_service("named", vip, &json!({}));
    w.put_slice("named", &[ready(&w.b1.ip4, "node-b")]);
    w.wait_everywhere(vip, PORT, &[at(&w.b1.ip4)]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at(vip)).as_deref(),
        Ok(w.b1.ip4.as_str())
    );
    // A direct connection to the backend, for contrast: no Service on its record.
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at(&w.b1.ip4)).as_deref(),
        Ok(w.b1.ip4.as_str())
    );
    w.api.add_user("svc-flows-reader", "alice");
    w.api.grant("alice", "get", "/flows");
    let log = w.logs.path().join("agent-node-a.log");
    let mut listen = String::new();
    let found = testbed::datapath::wait_until(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        listen = text
            .lines()
            .find_map(|l| l.split("serving /flows on http://").nth(1))
            .unwrap_or_default()
            .trim()
            .to_owned();
        !listen.is_empty()
    });
    assert!(found, "node A's agent serves no flows:\n{}", w.agent_logs());
    let records = |filter: &[&str]| -> Vec<Value> {
        let mut argv: Vec<String> = vec![
            testbed::plugin_bin().display().to_string(),
            "observe".into(),
            "--node".into(),
            listen.clone(),
            "--token".into(),
            "svc-flows-reader".into(),
            "-o".into(),
            "json".into(),
            "--kind".into(),
            "start".into(),
        ];
        argv.extend(filter.iter().map(|a| (*a).to_owned()));
        let out = testbed::process::netns_exec(w.cluster.a().netns(), &argv);
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let mut seen = Vec::new();
    let to_b1 = |r: &Value| {
        r["direction"] == "egress"
            && r["source"]["ip"] == json!(w.a2.ip4)
            && r["destination"]["ip"] == json!(w.b1.ip4)
            && r["destination"]["port"] == json!(PORT)
    };
    let named = |r: &Value| {
        to_b1(r)
            && r["service"]["ip"] == json!(vip)
            && r["service"]["port"] == json!(PORT)
            && r["service"]["kind"] == "service"
            && r["service"]["namespace"] == "default"
            && r["service"]["name"] == "named"
    };
    let both = testbed::datapath::wait_until(Duration::from_secs(10), || {
        seen = records(&[]);
        seen.iter().any(named) && seen.iter().any(|r| to_b1(r) && r.get("service").is_none())
    });
    assert!(
        both,
        "no start through the Service and one straight to b1 among:\n{}\n{}",
        seen.iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        w.agent_logs()
    );
    // The Service filter finds the flow by the Service it asked for.
    let by_service = records(&["--service", "default/named"]);
    assert!(
        !by_service.is_empty() && by_service.iter().all(named),
        "{by_service:#?}"
    );
}
