//! The agent's kube-proxy replacement (`agent --kube-proxy-replacement`) on two simulated
//! nodes with no kube-proxy, beyond the rows of the Kubernetes matrix
//! (`kubernetes.rs`): how backends are chosen (uniformly, ready before terminating,
//! `sessionAffinity: ClientIP`, `internalTrafficPolicy: Local`), a Service without
//! endpoints refusing at once, connections that live through endpoint churn, an agent
//! restart, the switch over from kube-proxy and back, the Event on a Service field the
//! mode does not translate, and 10 000 Services with 100 000 endpoints.
//!
//! Services and EndpointSlices are written to the stand-in API server in `ext`; each
//! node's agent watches them. Every client runs as a process inside the test's cgroup,
//! where both nodes' socket hooks are attached.
#![expect(clippy::panic, reason = "tests fail by panicking with a message")]

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::{
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
    let cluster = Cluster::new(test);
    let cgroup = TestCgroup::create(cluster.tag());
    let conf = |n: &ClusterNode| {
        n.conf_dual_stack()
            .set("cgroupPath", json!(cgroup.path().to_string_lossy()))
    };
    let add = |n: &ClusterNode, name: &str| {
        let pod = n.pod(name);
        let r = n.add(&pod, "eth0", &conf(n));
        Running { pod, ip4: r.ip4() }
    };
    let (a, b) = (cluster.a(), cluster.b());
    let (a1, a2, a3, b1, b2) = (
        add(a, "a1"),
        add(a, "a2"),
        add(a, "a3"),
        add(b, "b1"),
        add(b, "b2"),
    );
    let servers = [&a1, &a3, &b1]
        .iter()
        .map(|p| WhoAmIServer::named(p.pod.netns(), PORT, &p.ip4))
        .collect();
    let echo = [&a1, &a3, &b1]
        .iter()
        .map(|p| EchoServer::concurrent(p.pod.netns(), ECHO_PORT))
        .collect();
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("a log directory: {e}"));
    let agents = cluster.replace_kube_proxy(&api, &[], logs.path()).into();
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
        tests::cluster::agent_logs(self.logs.path())
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

    /// Writes the IPv4 EndpointSlice of Service `name` with `endpoints` (port `PORT`, and
    /// `ECHO_PORT` as port `echo`).
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
                    { "name": "echo", "protocol": "TCP", "port": ECHO_PORT },
                ],
            }),
        );
    }

    /// Waits until `node`'s maps give frontend `ip:port` (TCP) exactly `backends`
    /// (`ip:port`, any order). Panics with the agents' logs after ten seconds.
    #[track_caller]
    fn wait_for(&self, node: &ClusterNode, ip: &str, port: u16, backends: &[String]) {
        let mut want: Vec<String> = backends.to_vec();
        want.sort();
        let key = cni_ebpf::datapath::services::service_key(
            ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
            port,
            cni_ebpf_common::proto::TCP,
        );
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
        let out = self
            .cgroup
            .exec_in(netns, &[NETCLIENT, "tcp", addr, "hello", "2000"]);
        if !out.success() {
            return Err(out.stderr.trim().to_owned());
        }
        let mut lines = out.stdout.lines();
        let from = lines.next().unwrap_or_default();
        if from != format!("from {addr}") {
            return Err(format!("getpeername showed {from}, not {addr}"));
        }
        // The who-am-I server answers the client's address, then its name (its address).
        Ok(lines.nth(1).unwrap_or_default().trim().to_owned())
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
    let doc = tests::datapath::inspect(w.cluster.a());
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
    w.put_service(
        "empty",
        vip,
        &json!({
            "ports": [
                { "name": "http", "protocol": "TCP", "port": PORT, "targetPort": PORT },
                { "name": "dns", "protocol": "UDP", "port": PORT, "targetPort": PORT },
            ],
        }),
    );
    w.put_slice("empty", &[]);
    w.wait_everywhere(vip, PORT, &[]);
    for (who, netns) in [
        ("pod a2", w.a2.pod.netns()),
        ("node A", w.cluster.a().netns()),
    ] {
        for proto in ["tcp", "udp"] {
            let started = Instant::now();
            let out = w
                .cgroup
                .exec_in(netns, &[NETCLIENT, proto, &at(vip), "hello", "3000"]);
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
    // An endpoint appears: served.
    w.put_slice("empty", &[ready(&w.a1.ip4, "node-a")]);
    w.wait_everywhere(vip, PORT, &[at(&w.a1.ip4)]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at(vip)),
        Ok(w.a1.ip4.clone())
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
            tests::process::in_netns(&mut cmd, netns);
            w.cgroup.enter_on_exec(&mut cmd);
            std::thread::spawn(move || tests::process::run_cmd(cmd, None, Duration::from_secs(60)))
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
    for (resource, obj) in tests::service_objects::objects(std::slice::from_ref(&svc)) {
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
            tests::process::in_netns(&mut cmd, netns);
            w.cgroup.enter_on_exec(&mut cmd);
            std::thread::spawn(move || tests::process::run_cmd(cmd, None, Duration::from_secs(60)))
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

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_field_the_mode_does_not_translate_is_reported_on_the_service() {
    let w = world("svc_event");
    w.put_service(
        "np",
        "10.96.1.6",
        &json!({
            "type": "NodePort",
            "ports": [{ "name": "http", "protocol": "TCP", "port": PORT, "nodePort": 30999 }],
        }),
    );
    w.put_slice("np", &[ready(&w.a1.ip4, "node-a")]);
    // The ClusterIP part works …
    w.wait_everywhere("10.96.1.6", PORT, &[at(&w.a1.ip4)]);
    assert_eq!(
        w.served_by(w.a2.pod.netns(), &at("10.96.1.6")),
        Ok(w.a1.ip4.clone())
    );
    // … and the NodePort is named in a Warning Event on the Service.
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
            assert!(text.contains("nodePort 30999"), "{text}");
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
