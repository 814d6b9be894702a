//! Flows end to end: two nodes whose agents follow flows (NetworkPolicy in force,
//! kube-proxy's iptables rules for a ClusterIP), known traffic between pods named in
//! the API server, and what `cni-ebpf observe` reads from every node at once (found
//! through the API server, each agent checking the reader with TokenReview and
//! SubjectAccessReview): allowed flows started and ended at each pod with both ways
//! counted (across nodes, within one, over IPv6), refused ones with the policy that
//! refused them (IPv4 and IPv6), one to a Service's ClusterIP found by its name and
//! named with the backend kube-proxy sent it to (the name's lookup through the DNS
//! Service reported so too), a masqueraded one, drops for a full NAT share; filters,
//! `--follow`, a reader that never reads, unauthorized readers; and the live map in a
//! real headless Chromium.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use testbed::{
    apiserver::ApiServer,
    browser::Browser,
    datapath::{greet, many_udp, wait_until, Mode as Serving, TaggedServer},
    dns::{DnsServer, Record},
    kubeproxy::{Mode, Protocol, ServicePort},
    net::{in_netns, tcp_request},
    process::{netns_exec, Background, Output},
    service_objects, Cluster, ClusterNode, ConfBuilder, Pod, ResultView, WhoAmIServer, EXT_IP4,
};

/// Where every agent serves flows (on its node's address).
const FLOWS_PORT: u16 = 9672;
/// The web pods' port.
const WEB: u16 = 8080;
/// The Service in front of them.
const CLUSTER_IP: &str = "10.96.0.50";
/// The DNS Service (`shop/dns`, in front of pod `dns` on node B), and the web Service's
/// name in it.
const DNS_IP: &str = "10.96.0.10";
/// The DNS Service's IPv6 ClusterIP (a dual-stack Service).
const DNS_IP6: &str = "fd00:10:96::10";
const WEB_NAME: &str = "web.shop.svc.cluster.local";
/// The resolver the pods' names are looked up with.
const NETCLIENT: &str = env!("CARGO_BIN_EXE_cni-ebpf-netclient");
/// A server outside the cluster (in `ext`).
const OUTSIDE: u16 = 7100;
/// Tokens: a reader granted `get /flows`, a user without the grant.
const READER: &str = "flows-reader-token";
const STRANGER: &str = "stranger-token";
/// The NAT share of pod `a3`.
const NAT_CAP: usize = 4;
/// Longest wait for the agents.
const WAIT: Duration = Duration::from_secs(15);
/// Where each agent serves `/metrics` (in its node's namespace).
const METRICS: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 19_670);

/// A pod and its addresses.
struct Running {
    pod: Pod,
    ip4: String,
    ip6: String,
}

/// Pods `shop/a1` (web, of Deployment `web`), `a2` (client), `a3` (client, a NAT share of
/// [`NAT_CAP`]) on node A; `b1` (web, Deployment `web`), `b2` (other) on node B; a policy
/// that lets clients (only) reach the web pods on [`WEB`]; kube-proxy's rules for
/// `shop/web` at [`CLUSTER_IP`]:80 and for `shop/dns` at [`DNS_IP`]:53 and [`DNS_IP6`]:53
/// (pod `dns` on node B, which knows [`WEB_NAME`]); each node's agent. Field order is drop
/// order.
struct World {
    agents: Vec<Background>,
    _servers: Vec<TaggedServer>,
    _dns: DnsServer,
    _outside: WhoAmIServer,
    api: ApiServer,
    logs: tempfile::TempDir,
    a1: Running,
    a2: Running,
    a3: Running,
    b1: Running,
    b2: Running,
    /// The DNS pod's IPv6 address.
    dns_ip6: String,
    cluster: Cluster,
}

fn conf(n: &ClusterNode) -> ConfBuilder {
    n.conf_dual_stack().set("ipMasq", json!(true))
}

fn world(test: &str) -> World {
    world_serving(test, None)
}

/// [`world`], its agents serving `/flows` over HTTPS with `tls` (certificate and key
/// files) when given.
#[expect(clippy::panic, reason = "tests fail by panicking with a message")]
fn world_serving(test: &str, tls: Option<(&Path, &Path)>) -> World {
    let cluster = Cluster::new(test);
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.add_user(READER, "alice");
    api.grant("alice", "get", "/flows");
    api.add_user(STRANGER, "mallory");
    let ns = testbed::netpol::namespace("shop", &[("ns", "shop")]);
    api.put("namespaces", serde_json::to_value(&ns).unwrap_or_default());
    for n in cluster.nodes() {
        api.set_node(n.name(), &[n.pod_cidr4()], &[n.ip4()]);
    }
    let add =
        |n: &ClusterNode, name: &str, label: (&str, &str), deployment: bool, cap: Option<usize>| {
            let pod = n.pod(name);
            let env = pod
                .env("eth0")
                .with_args(&format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name}"));
            let mut c = conf(n);
            if let Some(cap) = cap {
                c = c.set("natFlowsPerPod", json!(cap));
            }
            let r = ResultView::parse(&n.exec_plugin("ADD", &env, &c.plugin()).result());
            let ips: Vec<IpAddr> = [r.ip4(), r.ip6()]
                .iter()
                .filter_map(|ip| ip.parse().ok())
                .collect();
            let mut object =
                serde_json::to_value(testbed::netpol::pod("shop", name, &[label], &ips))
                    .unwrap_or_default();
            if deployment {
                object["metadata"]["labels"]["pod-template-hash"] = json!("5d8f7");
                object["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": "web-5d8f7", "uid": "rs-web", "controller": true}]);
            }
            object["spec"]["nodeName"] = json!(n.name());
            api.put("pods", object);
            Running {
                pod,
                ip4: r.ip4(),
                ip6: r.ip6(),
            }
        };
    let (a, b) = (cluster.a(), cluster.b());
    let (web, client, other) = (("app", "web"), ("role", "client"), ("role", "other"));
    let a1 = add(a, "a1", web, true, None);
    let a2 = add(a, "a2", client, false, None);
    let a3 = add(a, "a3", client, false, Some(NAT_CAP));
    let b1 = add(b, "b1", web, true, None);
    let b2 = add(b, "b2", other, false, None);
    let dns_pod = add(b, "dns", ("app", "dns"), false, None);
    let dns = DnsServer::start(dns_pod.pod.netns());
    let web_ip: IpAddr = CLUSTER_IP.parse().unwrap_or_else(|e| panic!("{e}"));
    dns.set(WEB_NAME, vec![Record::Addr(web_ip, 30)]);
    put_web_policy(&api, WEB);
    let servers = [(&a1, "a1"), (&b1, "b1")]
        .iter()
        .map(|(p, tag)| TaggedServer::start(p.pod.netns(), WEB, tag, Serving::Greet))
        .collect();
    let outside = WhoAmIServer::start(cluster.ext_netns(), OUTSIDE);
    let services = [
        ServicePort::new("shop/web", "http", Protocol::Tcp, CLUSTER_IP, 80)
            .endpoint(&format!("{}:{WEB}", a1.ip4), a.name())
            .endpoint(&format!("{}:{WEB}", b1.ip4), b.name()),
        ServicePort::new("shop/dns", "dns", Protocol::Udp, DNS_IP, 53)
            .endpoint(&format!("{}:53", dns_pod.ip4), b.name()),
        ServicePort::new("shop/dns", "dns", Protocol::Udp, DNS_IP6, 53)
            .endpoint(&format!("[{}]:53", dns_pod.ip6), b.name()),
    ];
    for (resource, obj) in service_objects::objects(&services) {
        api.put(resource, obj);
    }
    cluster.install_kube_proxy(Mode::Iptables, &services);
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("a log directory: {e}"));
    let agents = cluster
        .nodes()
        .iter()
        .map(|n| {
            let state = n.dir().join("policy-state").display().to_string();
            let flows = format!("{}:{FLOWS_PORT}", n.ip4());
            let metrics = METRICS.to_string();
            let mut args = vec![
                "agent",
                "--state-dir",
                &state,
                "--listen",
                &metrics,
                "--probe-listen",
                "127.0.0.1:0",
                "--node-name",
                n.name(),
                "--flows-listen",
                &flows,
                "--flow-idle-timeout",
                "2",
            ];
            let files = tls.map(|(c, k)| (c.display().to_string(), k.display().to_string()));
            if let Some((cert, key)) = &files {
                args.extend(["--flows-tls-cert", cert, "--flows-tls-key", key]);
            }
            n.start_agent_of(
                &testbed::plugin_bin(),
                &api,
                &args,
                &logs.path().join(format!("agent-{}.log", n.name())),
            )
        })
        .collect();
    let w = World {
        agents,
        _servers: servers,
        _dns: dns,
        _outside: outside,
        api,
        logs,
        a1,
        a2,
        a3,
        b1,
        b2,
        dns_ip6: dns_pod.ip6.clone(),
        cluster,
    };
    w.wait_for_policy(1);
    w.wait_for_flows();
    w
}

/// `shop/web`: pods `app=web` admit `role=client` pods on `port` only.
fn put_web_policy(api: &ApiServer, port: u16) {
    api.put(
        "networkpolicies",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"protocol": "TCP", "port": port}]}],
            },
        }),
    );
}

impl World {
    /// Where node A's agent serves `/flows`.
    fn flows_of_a(&self) -> SocketAddr {
        let ip = self
            .cluster
            .a()
            .ip4()
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        SocketAddr::new(ip, FLOWS_PORT)
    }

    fn agent_logs(&self) -> String {
        testbed::cluster::agent_logs(self.logs.path())
    }

    /// Waits until every node's agent turned flows on (its flows thread runs at a lower
    /// priority than the policy's: a flow sent before would be seen by one node only).
    #[track_caller]
    fn wait_for_flows(&self) {
        for n in self.cluster.nodes() {
            let on = wait_until(WAIT, || n.flows_on_of("testnet"));
            assert!(
                on,
                "{} never turned flows on:\n{}",
                n.name(),
                self.agent_logs()
            );
        }
    }

    /// Waits until both nodes' policy is at a generation past `after`.
    #[track_caller]
    fn wait_for_policy(&self, after: u32) {
        for n in self.cluster.nodes() {
            let ok = wait_until(WAIT, || n.policy_generation_of("testnet") >= after);
            assert!(
                ok,
                "{}'s policy never came in force:\n{}",
                n.name(),
                self.agent_logs()
            );
        }
    }

    /// The argv of `cni-ebpf observe` against every node (found through the API server),
    /// with `args`.
    fn observe_argv(&self, args: &[&str]) -> Vec<String> {
        let mut argv: Vec<String> = vec![
            testbed::plugin_bin().display().to_string(),
            "observe".into(),
            "--all-nodes".into(),
            "--api-server".into(),
            self.api.url(),
            "--service-account-dir".into(),
            self.api.sa_dir().display().to_string(),
        ];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv
    }

    /// `cni-ebpf observe` from `ext` against every node, with `args`.
    fn observe(&self, args: &[&str]) -> Output {
        netns_exec(self.cluster.ext_netns(), &self.observe_argv(args))
    }

    /// The records `observe -o json` prints for `args` (as the reader).
    #[track_caller]
    fn records(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["--token", READER, "-o", "json"];
        all.extend_from_slice(args);
        let out = self.observe(&all);
        assert!(
            out.success(),
            "observe failed: {out}\n{}",
            self.agent_logs()
        );
        out.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    /// Waits until the records of `args` hold one that `want` accepts; all of them.
    #[track_caller]
    fn wait_record(&self, what: &str, args: &[&str], want: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        let ok = wait_until(WAIT, || {
            seen = self.records(args);
            seen.iter().any(&want)
        });
        assert!(
            ok,
            "no record of {what} among {}:\n{}\n{}",
            seen.len(),
            seen.iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            self.agent_logs()
        );
        seen
    }
}

/// `namespace/name` of a record's side.
fn side(r: &Value, which: &str) -> String {
    format!(
        "{}/{}",
        r[which]["namespace"].as_str().unwrap_or("-"),
        r[which]["name"].as_str().unwrap_or("-")
    )
}

/// `address:port` a record says its flow was masqueraded to.
fn left_as(r: &Value) -> String {
    format!(
        "{}:{}",
        r["masqueradedAs"].as_str().unwrap_or(""),
        r["masqueradedPort"]
    )
}

/// One TCP exchange with a tagged echo server at `addr`: its greeting.
#[track_caller]
fn exchange(netns: &Path, addr: &str) -> String {
    greet(netns, addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

/// The addresses the C library's resolver in `netns` finds for `name`, asking the DNS
/// Service ([`DNS_IP`]); `conf` is where its configuration is written.
#[track_caller]
fn resolve(netns: &Path, conf: &Path, name: &str) -> Vec<IpAddr> {
    resolve_with(netns, conf, DNS_IP, name)
}

/// [`resolve`], asking the DNS Service at `server` (either of its ClusterIPs).
#[track_caller]
fn resolve_with(netns: &Path, conf: &Path, server: &str, name: &str) -> Vec<IpAddr> {
    std::fs::write(
        conf,
        format!("nameserver {server}\noptions timeout:1 attempts:2\n"),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", conf.display()));
    let conf = conf.display().to_string();
    let out = netns_exec(netns, &[NETCLIENT, "resolve", name, &conf, "4000"]);
    assert!(out.success(), "resolving {name}: {out}");
    out.stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn observe_names_every_kind_of_flow_from_every_node() {
    let w = world("ob_kinds");
    let (a2, b1_addr) = (&w.a2, format!("{}:{WEB}", w.b1.ip4));

    // Allowed, across nodes: a start at a2 (node A) and at b1 (node B), an end with
    // both ways counted once the connection closed.
    assert!(exchange(a2.pod.netns(), &b1_addr).starts_with("b1"));
    let seen = w.wait_record("a2 → b1's end", &["--pod", "shop/a2"], |r| {
        r["kind"] == "end" && side(r, "destination") == "shop/b1" && r["node"] == "node-a"
    });
    let start = seen
        .iter()
        .find(|r| {
            r["kind"] == "start" && side(r, "destination") == "shop/b1" && r["node"] == "node-a"
        })
        .unwrap_or_else(|| panic!("no start at a2: {seen:?}"));
    assert_eq!(start["direction"], "egress");
    assert_eq!(start["source"]["kind"], "pod");
    assert_eq!(start["destination"]["workload"], "Deployment/web");
    assert_eq!(start["destination"]["node"], "node-b");
    assert_eq!(start["protocol"], "TCP");
    assert_eq!(start["verdict"], "forwarded");
    let end = seen
        .iter()
        .find(|r| {
            r["kind"] == "end" && r["node"] == "node-a" && side(r, "destination") == "shop/b1"
        })
        .unwrap_or_else(|| panic!("no end: {seen:?}"));
    assert!(
        end["counters"]["packetsToDestination"].as_u64() >= Some(3),
        "{end}"
    );
    assert!(
        end["counters"]["packetsToSource"].as_u64() >= Some(2),
        "{end}"
    );
    assert!(
        end["counters"]["bytesToSource"].as_u64() > Some(100),
        "{end}"
    );
    assert!(
        matches!(end["reason"].as_str(), Some("fin" | "rst")),
        "{end}"
    );
    let at_b1 = w.wait_record("a2 → b1 at b1", &["--pod", "shop/b1"], |r| {
        r["node"] == "node-b" && r["direction"] == "ingress" && side(r, "source") == "shop/a2"
    });
    let ingress = at_b1
        .iter()
        .find(|r| r["kind"] == "start" && r["node"] == "node-b" && side(r, "source") == "shop/a2")
        .unwrap_or_else(|| panic!("no start at b1: {at_b1:?}"));
    let policies = &ingress["policy"]["ingress"]["policies"];
    assert_eq!(policies, &json!(["shop/web"]), "{ingress}");

    // Between two pods of one node: a start where a2 sends it and where a1 receives it.
    assert!(exchange(a2.pod.netns(), &format!("{}:{WEB}", w.a1.ip4)).starts_with("a1"));
    let same = w.wait_record(
        "a2 → a1 at a1",
        &["--pod", "shop/a1", "--kind", "start"],
        |r| r["direction"] == "ingress" && side(r, "source") == "shop/a2",
    );
    assert!(
        same.iter().any(|r| r["direction"] == "egress"
            && r["node"] == "node-a"
            && side(r, "source") == "shop/a2"
            && side(r, "destination") == "shop/a1"),
        "no start at a2: {same:?}"
    );

    // Over IPv6: a2's echo to b2 (no policy selects b2) starts at each end, named;
    // one to b1 (its policy admits TCP on the web port only) is refused at node B.
    assert!(testbed::net::ping(a2.pod.netns(), &w.b2.ip6, 3));
    // (Each node's agent reads its ring on its own timer: waited for at both ends.)
    let at_b2 =
        |r: &Value| r["kind"] == "start" && r["node"] == "node-b" && r["direction"] == "ingress";
    let at_a2 = |r: &Value| {
        r["kind"] == "start"
            && r["node"] == "node-a"
            && r["direction"] == "egress"
            && r["destination"]["ip"] == json!(w.b2.ip6)
            && side(r, "source") == "shop/a2"
            && side(r, "destination") == "shop/b2"
    };
    let mut six = Vec::new();
    let both = wait_until(WAIT, || {
        six = w.records(&["--pod", "shop/b2", "--protocol", "ICMPv6"]);
        six.iter().any(at_b2) && six.iter().any(at_a2)
    });
    assert!(both, "a2 → b2 over IPv6 not started at both ends: {six:?}");
    assert!(!testbed::net::ping(a2.pod.netns(), &w.b1.ip6, 1));
    w.wait_record(
        "a2 → b1 over IPv6, refused",
        &["--verdict", "dropped", "--protocol", "ICMPv6"],
        |r| {
            r["reason"] == "drop_policy_ingress"
                && r["destination"]["ip"] == json!(w.b1.ip6)
                && side(r, "source") == "shop/a2"
                && side(r, "destination") == "shop/b1"
        },
    );

    // Refused: b2 is not a client. Dropped at node A with the policy named.
    assert!(greet(w.b2.pod.netns(), &format!("{}:{WEB}", w.a1.ip4)).is_err());
    let refused = w.wait_record(
        "b2 → a1 refused",
        &["--verdict", "dropped", "--pod", "shop/b2"],
        |r| r["reason"] == "drop_policy_ingress" && side(r, "destination") == "shop/a1",
    );
    let drop = &refused[0];
    assert_eq!(drop["node"], "node-a");
    assert_eq!(drop["kind"], "drop");
    assert_eq!(
        drop["policy"]["ingress"]["policies"],
        json!(["shop/web"]),
        "{drop}"
    );
    assert!(
        refused.iter().all(|r| r["verdict"] == "dropped"),
        "the filter keeps only drops"
    );

    // To the Service by its name, as an application reaches it: the name looked up with
    // the C library's resolver through the DNS Service (that lookup a flow of its own, at
    // a2 to the Service and at the DNS pod from a2), then the address it gave.
    let resolved = resolve(a2.pod.netns(), &w.logs.path().join("resolv.conf"), WEB_NAME);
    assert_eq!(
        resolved,
        [CLUSTER_IP
            .parse::<IpAddr>()
            .unwrap_or_else(|e| panic!("{e}"))]
    );
    // Each node's agent reads its ring on its own timer: waited for at both. At a2 the
    // lookup names the Service it was sent to and the backend kube-proxy's DNAT chose
    // (the node's connection tracking says which).
    let at_a2 = |r: &Value| {
        r["kind"] == "start"
            && r["node"] == "node-a"
            && side(r, "source") == "shop/a2"
            && r["service"]["kind"] == "service"
            && r["service"]["ip"] == DNS_IP
            && side(r, "service") == "shop/dns"
            && r["destination"]["kind"] == "pod"
            && side(r, "destination") == "shop/dns"
            && r["destination"]["port"] == 53
            && r["protocol"] == "UDP"
    };
    let at_dns = |r: &Value| {
        r["kind"] == "start" && side(r, "destination") == "shop/dns" && r["node"] == "node-b"
    };
    let mut lookups = Vec::new();
    let both = wait_until(WAIT, || {
        lookups = w.records(&["--port", "53"]);
        lookups.iter().any(at_a2) && lookups.iter().any(at_dns)
    });
    assert!(
        both,
        "a2's lookup not seen at a2 and at the DNS pod: {lookups:?}\n{}",
        w.agent_logs()
    );
    let answered = lookups
        .iter()
        .find(|r| at_dns(r))
        .unwrap_or_else(|| panic!("{lookups:?}"));
    assert_eq!(
        (side(answered, "source"), answered["direction"].as_str()),
        ("shop/a2".to_owned(), Some("ingress")),
        "{answered}"
    );
    // The same lookup over IPv6, to the DNS Service's IPv6 ClusterIP: kube-proxy's
    // ip6tables DNAT, the backend asked of the node's IPv6 connection tracking.
    let resolved6 = resolve_with(
        a2.pod.netns(),
        &w.logs.path().join("resolv6.conf"),
        DNS_IP6,
        WEB_NAME,
    );
    assert_eq!(resolved, resolved6);
    let dns6 = w.dns_ip6.clone();
    w.wait_record("a2's lookup over IPv6", &["--port", "53"], |r| {
        r["kind"] == "start"
            && r["node"] == "node-a"
            && side(r, "source") == "shop/a2"
            && r["service"]["ip"] == DNS_IP6
            && side(r, "service") == "shop/dns"
            && side(r, "destination") == "shop/dns"
            && r["destination"]["ip"] == dns6.as_str()
            && r["protocol"] == "UDP"
    });
    // Named at a2 by the Service and by the backend that answered.
    let answer = exchange(a2.pod.netns(), &format!("{}:80", resolved[0]));
    let backend = if answer.starts_with("a1") {
        "shop/a1"
    } else {
        assert!(answer.starts_with("b1"), "{answer}");
        "shop/b1"
    };
    w.wait_record("a2 → the Service", &["--service", "shop/web"], |r| {
        r["kind"] == "start"
            && side(r, "source") == "shop/a2"
            && side(r, "service") == "shop/web"
            && r["service"]["ip"] == CLUSTER_IP
            && side(r, "destination") == backend
            && r["destination"]["kind"] == "pod"
    });

    // Leaving the cluster: masqueraded to node A's address.
    let outside = format!("{EXT_IP4}:{OUTSIDE}");
    let (answers, _socks) = many_udp(
        a2.pod.netns(),
        &[outside.parse().unwrap_or_else(|e| panic!("{e}"))],
        1,
        1,
    );
    assert!(answers[0].is_ok(), "{answers:?}");
    let masq = w.wait_record(
        "a2 → outside",
        &["--pod", "shop/a2", "--protocol", "udp"],
        |r| r["destination"]["kind"] == "world" && r["destination"]["port"] == OUTSIDE,
    );
    let m = masq
        .iter()
        .find(|r| r["destination"]["kind"] == "world")
        .unwrap_or_else(|| panic!("{masq:?}"));
    assert_eq!(m["masqueradedAs"], w.cluster.a().ip4(), "{m}");
    // The port is the one the outside saw (its answer names the peer it saw).
    let seen_from = answers[0]
        .as_ref()
        .map_or("", |a| a.lines().next().unwrap_or(""));
    let start = masq
        .iter()
        .find(|r| r["destination"]["kind"] == "world" && r["kind"] == "start")
        .unwrap_or_else(|| panic!("{masq:?}"));
    assert_eq!(left_as(start), seen_from, "{start}");
    // A masqueraded TCP connection, closed: its end names the address and port it left
    // with as its start did, though its SNAT entry may have gone with the close.
    let answer = tcp_request(a2.pod.netns(), &outside, b"x", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("a2 → {outside} over TCP: {e}"));
    let seen_from = answer.lines().next().unwrap_or("").to_owned();
    let closed = w.wait_record(
        "a2's closed connection to outside",
        &["--pod", "shop/a2", "--protocol", "tcp"],
        |r| r["destination"]["kind"] == "world" && r["kind"] == "end",
    );
    let end = closed
        .iter()
        .find(|r| r["destination"]["kind"] == "world" && r["kind"] == "end")
        .unwrap_or_else(|| panic!("{closed:?}"));
    assert_eq!(left_as(end), seen_from, "{end}");

    // A full NAT share: a3's flows beyond its share are dropped, each reported once.
    let to: SocketAddr = outside.parse().unwrap_or_else(|e| panic!("{e}"));
    let (answers, _socks) = many_udp(w.a3.pod.netns(), &[to], 3 * NAT_CAP, 2);
    let answered = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(answered, NAT_CAP, "{answers:?}");
    let capped = w.wait_record(
        "a3's capped flows",
        &["--reason", "drop_nat_pod_cap"],
        |r| side(r, "source") == "shop/a3",
    );
    let flows: std::collections::BTreeSet<_> = capped
        .iter()
        .filter(|r| side(r, "source") == "shop/a3")
        .map(|r| r["source"]["port"].as_u64())
        .collect();
    assert!(
        flows.len() >= 2 * NAT_CAP,
        "{} of {} capped flows reported: {capped:?}",
        flows.len(),
        2 * NAT_CAP
    );
    assert!(capped
        .iter()
        .all(|r| r["direction"] == "node" && r["node"] == "node-a"));

    // Both nodes' records, merged in time order; `--last` of them all.
    let all = w.records(&["--since", "10m"]);
    let nodes: std::collections::BTreeSet<_> = all.iter().map(|r| r["node"].to_string()).collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let times: Vec<u64> = all
        .iter()
        .filter_map(|r| r["timeUnixNano"].as_u64())
        .collect();
    assert!(times.windows(2).all(|t| t[0] <= t[1]), "not in time order");
    assert_eq!(w.records(&["--last", "3"]).len(), 3);
    // Metrics: the records by namespace pair, the drops by reason.
    let (_, _, metrics) = testbed::net::http_get(
        w.cluster.a().netns(),
        METRICS,
        "/metrics",
        Duration::from_secs(3),
    )
    .unwrap_or_else(|e| panic!("/metrics: {e}"));
    for want in [
        "cni_ebpf_flow_records_total{source_namespace=\"shop\",destination_namespace=\"shop\",kind=\"start\",verdict=\"forwarded\"}",
        "cni_ebpf_flow_records_total{source_namespace=\"shop\",destination_namespace=\"world\",kind=\"start\",verdict=\"forwarded\"}",
        "cni_ebpf_flow_drops_total{source_namespace=\"shop\",destination_namespace=\"shop\",reason=\"drop_policy_ingress\"}",
        "cni_ebpf_flow_drops_total{source_namespace=\"shop\",destination_namespace=\"world\",reason=\"drop_nat_pod_cap\"}",
        "cni_ebpf_flow_window_capacity 20000",
    ] {
        assert!(metrics.contains(want), "no {want} in:\n{metrics}");
    }
    // Text: one line each, the sides named.
    let text = w.observe(&[
        "--token",
        READER,
        "--pod",
        "shop/b2",
        "--verdict",
        "dropped",
    ]);
    assert!(
        text.stdout.lines().any(|l| l.contains("DROP")
            && l.contains("shop/b2")
            && l.contains("drop_policy_ingress")),
        "{text}"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn only_an_authorized_reader_gets_flows_and_a_follower_gets_them_as_they_come() {
    let w = world("ob_auth");
    let out = w.observe(&["--token", STRANGER]);
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("403") && out.stderr.contains("may not get /flows"),
        "{out}"
    );
    let out = w.observe(&["--token", "not-a-token"]);
    assert!(!out.success() && out.stderr.contains("401"), "{out}");
    // Straight to an agent without a token.
    let node_a = w.flows_of_a();
    let (status, _, body) = testbed::net::http_get(
        w.cluster.ext_netns(),
        node_a,
        "/flows",
        Duration::from_secs(3),
    )
    .unwrap_or_else(|e| panic!("GET /flows: {e}"));
    assert_eq!(status, 401, "{body}");

    // A follower that never reads holds no one up: its connection open, flows go on and
    // other readers are answered.
    let ext = w.cluster.ext_netns().to_path_buf();
    let mut stalled = in_netns(&ext, move || {
        TcpStream::connect_timeout(&node_a, Duration::from_secs(2))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let req = format!("GET /flows?follow=true HTTP/1.1\r\nHost: {node_a}\r\nAuthorization: Bearer {READER}\r\n\r\n");
    stalled
        .write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));

    // `--follow`: records as they come.
    let log = w.logs.path().join("follow.log");
    let argv = w.observe_argv(&[
        "--token", READER, "--follow", "--pod", "shop/a2", "-o", "json",
    ]);
    let follower = Background::spawn_logged(w.cluster.ext_netns(), &argv, &log);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let b1 = format!("{}:{WEB}", w.b1.ip4);
    for _ in 0..200 {
        assert!(exchange(w.a2.pod.netns(), &b1).starts_with("b1"));
    }
    let spent = started.elapsed();
    let followed = wait_until(WAIT, || {
        std::fs::read_to_string(&log).is_ok_and(|t| {
            t.lines()
                .filter(|l| l.contains("\"kind\":\"start\"") && l.contains("\"node\":\"node-b\""))
                .count()
                >= 200
        })
    });
    assert!(
        followed,
        "the follower missed flows:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        spent < Duration::from_secs(20),
        "200 connections took {spent:?}"
    );
    assert!(
        w.records(&["--last", "1"]).len() == 1,
        "another reader is answered"
    );
    let mut buf = [0u8; 64];
    stalled.set_read_timeout(Some(Duration::from_secs(1))).ok();
    assert!(
        stalled.read(&mut buf).is_ok_and(|n| n > 0),
        "the stalled follower's connection is open"
    );
    drop(follower);

    // The records are made by a thread that yields to the pods (nice 10), the agent's
    // other jobs keeping their priority.
    let threads = threads_nice(w.agents[0].pid());
    let flows: Vec<_> = threads.iter().filter(|(name, _)| name == "flows").collect();
    assert!(
        !flows.is_empty() && flows.iter().all(|(_, nice)| *nice == 10),
        "{threads:?}"
    );
    assert!(
        threads
            .iter()
            .any(|(name, nice)| name != "flows" && *nice == 0),
        "{threads:?}"
    );
}

/// The name and nice value of each thread of process `pid`.
fn threads_nice(pid: u32) -> Vec<(String, i64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("the agent's threads: {e}"));
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // The fields after the name (which ends with the last `)`): nice is the 17th.
            let nice = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()?;
            Some((name.trim().to_owned(), nice))
        })
        .collect()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_live_map_shows_the_traffic_and_a_refusal_in_chromium() {
    let mut w = world("ob_ui");
    let ui = w.logs.path().join("ui.log");
    let argv = w.observe_argv(&["--token", READER, "--ui", "--ui-listen", "127.0.0.1:9680"]);
    let _ui = Background::spawn_logged(w.cluster.ext_netns(), &argv, &ui);
    let b1 = format!("{}:{WEB}", w.b1.ip4);
    assert!(exchange(w.a2.pod.netns(), &b1).starts_with("b1"));
    assert!(greet(w.b2.pod.netns(), &format!("{}:{WEB}", w.a1.ip4)).is_err());
    assert!(exchange(w.a2.pod.netns(), &format!("{CLUSTER_IP}:80")).len() > 1);

    let browser = Browser::start(w.cluster.ext_netns(), 9515, 1280, 800);
    browser.open("http://127.0.0.1:9680/");
    let edge = |from: &str, to: &str, state: &str| {
        format!(
            "return [...document.querySelectorAll('.edge')].some(e => e.dataset.from === '{from}' \
             && e.dataset.to === '{to}' && e.dataset.state === '{state}');"
        )
    };
    let shown = browser.wait_for(&edge("shop/a2", "shop/Deployment/web", "forwarded"), WAIT)
        && browser.wait_for(&edge("shop/b2", "shop/Deployment/web", "refused"), WAIT)
        && browser.wait_for(&edge("shop/a2", "shop/Service/web", "forwarded"), WAIT);
    let edges = browser.eval(
        "return [...document.querySelectorAll('.edge')].map(e => [e.dataset.from, e.dataset.to, e.dataset.state]);",
    );
    assert!(
        shown,
        "edges drawn: {edges}\n{}",
        std::fs::read_to_string(&ui).unwrap_or_default()
    );

    // A click on an edge lists its flows and what decided them.
    browser.click(".edge[data-from='shop/b2'] text");
    let listed = browser.wait_for(
        "const t = document.getElementById('edge-flows'); \
         return !!t && t.textContent.includes('drop_policy_ingress') && t.textContent.includes('shop/web');",
        WAIT,
    );
    assert!(
        listed,
        "{}",
        browser.eval("return document.getElementById('detail').textContent;")
    );

    // The policy stops admitting a2 (its port moves): the edge turns refused.
    put_web_policy(&w.api, 9999);
    w.wait_for_policy(2);
    assert!(greet(w.a2.pod.netns(), &b1).is_err(), "a2 is refused now");
    let refused = browser.wait_for(&edge("shop/a2", "shop/Deployment/web", "refused"), WAIT);
    assert!(
        refused,
        "{}",
        browser.eval("return document.getElementById('status').textContent;")
    );

    let errors = browser.eval("return document.getElementById('errors').textContent;");
    assert_eq!(errors, json!(""), "the page reported errors");
    let console: Vec<_> = browser
        .console()
        .into_iter()
        .filter(|(level, _)| level == "SEVERE")
        .collect();
    assert!(console.is_empty(), "console errors: {console:?}");
    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let kept = testbed::testdir::artifact("observe-ui.png");
    std::fs::write(&kept, &png).unwrap_or_else(|e| panic!("writing {}: {e}", kept.display()));
    eprintln!("the live map: {}", kept.display());
    w.agents.clear();
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn over_tls_flows_and_tokens_go_only_between_agents_and_readers_that_trust_them() {
    let files = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = |name: &str| files.path().join(name);
    let write = |name: &str, text: &str| {
        std::fs::write(path(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
    };
    // One certificate for every agent (as a DaemonSet mounts one Secret): the nodes'
    // addresses and a name of its own.
    let nodes: Vec<IpAddr> = [testbed::cluster::NODE_A_IP4, testbed::cluster::NODE_B_IP4]
        .iter()
        .map(|ip| ip.parse().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let ca = testbed::tls::Authority::new("flows CA");
    let issued = ca.issue("cni-ebpf agent", &["agents.flows.cni-ebpf"], &nodes);
    write("ca.pem", &ca.ca_pem());
    let ca_file = path("ca.pem").display().to_string();
    // The agents start before their certificate is there (an optional Secret the
    // operator makes after the install): they serve nothing meanwhile, not even in
    // clear, and the certificate is taken up once it comes.
    let w = world_serving("ob_tls", Some((&path("tls.crt"), &path("tls.key"))));
    let waiting = wait_until(WAIT, || {
        w.cluster.nodes().iter().all(|n| {
            let log = w.logs.path().join(format!("agent-{}.log", n.name()));
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains("no serving certificate at")
        })
    });
    assert!(
        waiting,
        "both agents say what they wait for:\n{}",
        w.agent_logs()
    );
    let plain = testbed::net::http_get(
        w.cluster.ext_netns(),
        w.flows_of_a(),
        "/flows",
        Duration::from_secs(3),
    );
    assert!(
        plain.as_ref().map_or(true, |(status, _, _)| *status == 0),
        "answered without a certificate: {plain:?}"
    );
    let out = w.observe(&["--token", READER, "--flows-ca", &ca_file, "--last", "1"]);
    assert!(!out.success() && out.stdout.is_empty(), "{out}");
    write("tls.key", &issued.key_pem);
    write("tls.crt", &issued.cert_pem);
    for n in w.cluster.nodes() {
        assert!(
            nodes.contains(&n.ip4().parse().unwrap_or_else(|e| panic!("{e}"))),
            "the certificate names {nodes:?}, not {}",
            n.ip4()
        );
    }
    assert!(exchange(w.a2.pod.netns(), &format!("{}:{WEB}", w.b1.ip4)).starts_with("b1"));
    let trusting = ["--flows-ca", ca_file.as_str(), "--pod", "shop/a2"];
    let seen = w.wait_record("a2 → b1 over TLS", &trusting, |r| {
        r["kind"] == "start" && side(r, "destination") == "shop/b1" && r["node"] == "node-a"
    });
    assert!(
        seen.iter()
            .all(|r| side(r, "source") == "shop/a2" || side(r, "destination") == "shop/a2"),
        "{seen:?}"
    );
    // The certificate's own name instead of the address.
    let named = [
        "--flows-ca",
        ca_file.as_str(),
        "--flows-server-name",
        "agents.flows.cni-ebpf",
        "--last",
        "1",
    ];
    assert_eq!(w.records(&named).len(), 1);

    // Nothing in clear: a plain request gets no HTTP answer, and `observe` without the CA
    // (plain HTTP) reads no node.
    let node_a = w.flows_of_a();
    let plain = testbed::net::http_get(
        w.cluster.ext_netns(),
        node_a,
        "/flows",
        Duration::from_secs(3),
    );
    // (At most a TLS alert: no HTTP status.)
    assert!(
        plain.as_ref().map_or(true, |(status, _, _)| *status == 0),
        "answered in clear: {plain:?}"
    );
    let out = w.observe(&["--token", READER]);
    assert!(!out.success() && out.stdout.is_empty(), "{out}");
    // Another CA: the agents do not prove themselves, and are not sent the token.
    let other = testbed::tls::Authority::new("another CA");
    write("other.pem", &other.ca_pem());
    let other_file = path("other.pem").display().to_string();
    let out = w.observe(&["--token", READER, "--flows-ca", &other_file]);
    assert!(
        !out.success() && out.stderr.contains("TLS with") && out.stderr.contains("UnknownIssuer"),
        "{out}"
    );
    // A wrong name: refused too.
    let out = w.observe(&[
        "--token",
        READER,
        "--flows-ca",
        &ca_file,
        "--flows-server-name",
        "elsewhere.example",
    ]);
    assert!(!out.success() && out.stderr.contains("TLS with"), "{out}");

    // A rotation: the files replaced by a certificate of the other CA (key first, as a
    // Secret's files change one by one) are served from the next connection on, without
    // a restart.
    let rotated = other.issue("cni-ebpf agent", &[], &nodes);
    write("tls.key", &rotated.key_pem);
    write("tls.crt", &rotated.cert_pem);
    let served = wait_until(WAIT, || {
        w.observe(&["--token", READER, "--flows-ca", &other_file, "--last", "1"])
            .success()
    });
    assert!(
        served,
        "the new certificate is not served:\n{}",
        w.agent_logs()
    );
    let out = w.observe(&["--token", READER, "--flows-ca", &ca_file]);
    assert!(
        !out.success() && out.stderr.contains("UnknownIssuer"),
        "{out}"
    );
}
