//! Domain names in cluster policy egress rules, end to end: two nodes with the real
//! agents, a DNS server in a pod on the other node behind a `kube-dns` Service that
//! kube-proxy's nftables rules translate (the path a cluster's DNS takes), sites outside
//! the cluster, and a client pod whose egress an Admin policy limits to its DNS server and
//! two names. The client resolves with the C library's resolver, as applications do, then
//! connects: what its DNS answers said is what it may reach, for as long as their TTLs
//! say.

use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use testbed::{
    datapath::wait_until,
    dns::{DnsServer, Record},
    kubeproxy::{Mode, Protocol as P, ServicePort},
    netpol::{namespace, pod},
    ApiServer, Cluster, WhoAmIServer, EXT_IP4,
};

/// The one-shot client process (see `src/bin/cni-ebpf-netclient.rs`).
const NETCLIENT: &str = env!("CARGO_BIN_EXE_cni-ebpf-netclient");
/// The `kube-dns` Service's ClusterIPs.
const DNS_IPS: [&str; 2] = ["10.96.0.10", "fd00:10:96::a"];
/// The sites' port (a server in `ext` on every address).
const SITE_PORT: u16 = 8080;
/// Addresses outside the cluster that the names resolve to (on `ext`'s loopback).
const SITES4: [&str; 4] = [
    "203.0.113.10",
    "203.0.113.11",
    "203.0.113.12",
    "203.0.113.13",
];
const SITES6: [&str; 2] = ["2001:db8:113::10", "2001:db8:113::11"];
/// Where the agents serve their metrics (in their node's namespace).
const AGENT_METRICS: std::net::SocketAddr =
    std::net::SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9670);
/// How long a probe waits.
const T: Duration = Duration::from_secs(2);

/// The Admin policy: the client may reach its DNS server, `site.example.com` and every
/// name below `apps.example.org`, and nothing else outside.
fn client_policy() -> serde_json::Value {
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "client-egress"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}},
            "egress": [
                {"name": "dns", "action": "Accept",
                 "to": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "dns"}}}}],
                 "protocols": [{"udp": {"destinationPort": {"number": 53}}},
                               {"tcp": {"destinationPort": {"number": 53}}}]},
                {"name": "sites", "action": "Accept",
                 "to": [{"domainNames": ["site.example.com", "*.apps.example.org"]}]},
                {"name": "nothing-else", "action": "Deny",
                 "to": [{"networks": ["0.0.0.0/0", "::/0"]}]},
            ],
        },
    })
}

/// Resolver configurations naming the `kube-dns` Service: over UDP (`udp4.conf`,
/// `udp6.conf`) and over TCP (`tcp4.conf`: `use-vc`); and naming the DNS server pod at
/// `local` directly (`local4.conf`).
fn resolver_configs(local: &IpAddr) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a resolver directory: {e}"));
    let local = local.to_string();
    for (file, server, extra) in [
        ("udp4.conf", DNS_IPS[0], ""),
        ("udp6.conf", DNS_IPS[1], ""),
        ("tcp4.conf", DNS_IPS[0], " use-vc"),
        ("local4.conf", local.as_str(), ""),
    ] {
        let text = format!("nameserver {server}\noptions timeout:1 attempts:2{extra}\n");
        std::fs::write(dir.path().join(file), text).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    dir
}

/// The addresses the C library's resolver in `netns` finds for `name` with resolver
/// configuration `conf`.
fn resolve(netns: &Path, conf: &Path, name: &str) -> Vec<IpAddr> {
    let conf = conf.display().to_string();
    let out = testbed::netns_exec(netns, &[NETCLIENT, "resolve", name, &conf, "4000"]);
    assert!(out.success(), "resolving {name}: {out}");
    out.stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether a TCP connection from `netns` to `addr` on the sites' port gets an answer.
fn reaches(netns: &Path, addr: &str) -> bool {
    let to = match addr.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("[{a}]:{SITE_PORT}"),
        _ => format!("{addr}:{SITE_PORT}"),
    };
    testbed::net::tcp_request(netns, &to, b"hello", T).is_ok_and(|a| !a.is_empty())
}

/// Egress by domain name holds end to end: before the client resolves a name its rule
/// names, the name's address is refused; once it has, the address answers, the rule's
/// other addresses stay refused; a wildcard matches names below it, through a CNAME
/// chain, over TCP too; AAAA answers open IPv6 addresses; a name that moves to a new
/// address opens the new one, and the old one closes once its TTL (above the agents'
/// `--dns-min-ttl` of 1 s) has passed, not before.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn egress_by_domain_name_follows_what_the_pods_dns_answers_say() {
    let cluster = Cluster::new("dnsname");
    let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
    api.install_crd("clusternetworkpolicies");
    let ext = cluster.ext_netns();
    for addr in SITES4
        .iter()
        .map(|a| format!("{a}/32"))
        .chain(SITES6.iter().map(|a| format!("{a}/128")))
    {
        testbed::netns_exec_ok(ext, &["ip", "addr", "add", &addr, "dev", "lo"]);
    }
    let _site = WhoAmIServer::start(ext, SITE_PORT);
    api.put(
        "namespaces",
        serde_json::to_value(namespace("x", &[("ns", "x")])).unwrap_or_default(),
    );
    let add = |node: &testbed::ClusterNode, name: &str| {
        let handle = node.pod(name);
        let env = handle
            .env("eth0")
            .with_args(&format!("K8S_POD_NAMESPACE=x;K8S_POD_NAME={name}"));
        let result = node
            .exec_plugin("ADD", &env, &node.conf_dual_stack().plugin())
            .result();
        let ips: Vec<IpAddr> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
            .collect();
        assert_eq!(ips.len(), 2, "{name} is not dual-stack: {result}");
        api.put(
            "pods",
            serde_json::to_value(pod("x", name, &[("app", name)], &ips)).unwrap_or_default(),
        );
        (handle, ips)
    };
    let (client, _) = add(cluster.a(), "client");
    let (dns_pod, dns_ips) = add(cluster.b(), "dns");
    // A second DNS server pod on the client's node, asked by its address: its answers
    // take the same-node path straight between the pods.
    let (local_pod, local_ips) = add(cluster.a(), "dns-local");
    api.put(
        "pods",
        serde_json::to_value(pod("x", "dns-local", &[("app", "dns")], &local_ips))
            .unwrap_or_default(),
    );
    let servers = [
        DnsServer::start(dns_pod.netns()),
        DnsServer::start(local_pod.netns()),
    ];
    let set = |name: &str, records: Vec<Record>| {
        for s in &servers {
            s.set(name, records.clone());
        }
    };
    let mut services = Vec::new();
    for (cluster_ip, backend) in DNS_IPS.iter().zip(&dns_ips) {
        let ep = std::net::SocketAddr::new(*backend, 53).to_string();
        for (name, proto) in [("dns", P::Udp), ("dns-tcp", P::Tcp)] {
            services.push(
                ServicePort::new("kube-system/kube-dns", name, proto, cluster_ip, 53)
                    .endpoint(&ep, cluster.b().name()),
            );
        }
    }
    cluster.install_kube_proxy(Mode::Nftables, &services);
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let agents: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|n| {
            let state = n.dir().join("policy-state").display().to_string();
            n.start_agent_of(
                &testbed::plugin_bin(),
                &api,
                &[
                    "agent",
                    "--state-dir",
                    &state,
                    "--listen",
                    &AGENT_METRICS.to_string(),
                    "--probe-listen",
                    &AGENT_METRICS.to_string(),
                    "--node-name",
                    n.name(),
                    "--dns-min-ttl",
                    "1",
                ],
                &logs.path().join(format!("agent-{}.log", n.name())),
            )
        })
        .collect();
    let agent_logs = || {
        cluster
            .nodes()
            .iter()
            .map(|n| {
                std::fs::read_to_string(logs.path().join(format!("agent-{}.log", n.name())))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n--- node b ---\n")
    };
    let resolv = resolver_configs(&local_ips[0]);
    let conf = |f: &str| resolv.path().join(f);
    let netns = client.netns();
    set("site.example.com", vec![addr(SITES4[0], 4)]);
    set(
        "*.apps.example.org",
        vec![Record::Cname("edge.cdn.test".to_owned(), 30)],
    );
    set(
        "edge.cdn.test",
        vec![addr(SITES4[2], 30), addr(SITES6[1], 30)],
    );
    set("other.example.net", vec![addr(SITES4[3], 30)]);
    // Before the policy: everything outside answers.
    assert!(
        wait_until(Duration::from_secs(10), || reaches(netns, SITES4[0])),
        "the site answers without a policy:\n{}",
        agent_logs()
    );
    api.put("clusternetworkpolicies", client_policy());
    assert!(
        wait_until(Duration::from_secs(10), || !reaches(netns, SITES4[0])),
        "the policy never came into force:\n{}",
        agent_logs()
    );
    let mut wrong = Vec::new();
    let mut check = |what: &str, ok: bool| {
        if !ok {
            wrong.push(what.to_owned());
        }
    };
    // A name the rule names: resolved over UDP through the Service, then reachable.
    let got = resolve(netns, &conf("udp4.conf"), "site.example.com");
    check(
        &format!("site.example.com resolves to {} (got {got:?})", SITES4[0]),
        got.contains(&SITES4[0].parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
    );
    check("the resolved site answers", reaches(netns, SITES4[0]));
    check(
        "an address no answer gave is refused",
        !reaches(netns, SITES4[1]),
    );
    // A name no rule names teaches nothing.
    let _ = resolve(netns, &conf("udp4.conf"), "other.example.net");
    check(
        "a name no rule names stays refused",
        !reaches(netns, SITES4[3]),
    );
    // A wildcard, through a CNAME chain, over TCP; its AAAA over IPv6.
    let got = resolve(netns, &conf("tcp4.conf"), "shop.eu.apps.example.org");
    check(
        &format!("the wildcard's name resolves over TCP (got {got:?})"),
        !got.is_empty(),
    );
    check(
        "the CNAME chain's address answers",
        reaches(netns, SITES4[2]),
    );
    check(
        "the chain's IPv6 address answers",
        reaches(netns, SITES6[1]),
    );
    check("the other IPv6 site is refused", !reaches(netns, SITES6[0]));
    // Asked of the DNS server pod on the client's node.
    let got = resolve(netns, &conf("local4.conf"), "other.example.net");
    check(
        &format!("the local server answers (got {got:?})"),
        !got.is_empty(),
    );
    check(
        "a name no rule names stays refused, whoever answers",
        !reaches(netns, SITES4[3]),
    );
    set("other.example.net", vec![]);
    // `site.example.com` asked of the local server, moved to the fourth site there.
    servers[1].set("site.example.com", vec![addr(SITES4[3], 30)]);
    let _ = resolve(netns, &conf("local4.conf"), "site.example.com");
    check(
        "an answer from a pod on the same node is read too",
        reaches(netns, SITES4[3]),
    );
    servers[1].set("site.example.com", vec![addr(SITES4[0], 4)]);
    // The name moves: the new address opens at once, the old one closes with its TTL
    // (4 s, renewed by a lookup just before the move), not before.
    let _ = resolve(netns, &conf("udp4.conf"), "site.example.com");
    let renewed = Instant::now();
    set("site.example.com", vec![addr(SITES4[1], 4)]);
    let _ = resolve(netns, &conf("udp6.conf"), "site.example.com");
    check("the new address answers", reaches(netns, SITES4[1]));
    check(
        "the old address answers within its TTL",
        renewed.elapsed() > Duration::from_secs(3) || reaches(netns, SITES4[0]),
    );
    check(
        "the old address closes once its TTL has passed",
        wait_until(Duration::from_secs(10), || !reaches(netns, SITES4[0])),
    );
    check(
        &format!("and not before ({:?})", renewed.elapsed()),
        renewed.elapsed() >= Duration::from_secs(3),
    );
    // The metrics credit each verdict to the rule that decided it.
    let metric = |rule: &str, verdict: &str| {
        testbed::net::metric_value(
            cluster.a().netns(),
            AGENT_METRICS,
            "cni_ebpf_cluster_policy_verdicts_total",
            &[
                ("policy", "client-egress"),
                ("rule", rule),
                ("direction", "egress"),
                ("verdict", verdict),
            ],
        )
    };
    check(
        "the metrics credit the rules that decided",
        wait_until(Duration::from_secs(5), || {
            metric("sites", "admitted") >= 3.0
                && metric("dns", "admitted") >= 1.0
                && metric("nothing-else", "denied") >= 1.0
        }),
    );
    drop(agents);
    assert!(
        wrong.is_empty(),
        "{}\nDNS questions: {:?} {:?}\n{}",
        wrong.join("\n"),
        servers[0].questions(),
        servers[1].questions(),
        agent_logs()
    );
}

/// An address record of the DNS server's table.
fn addr(ip: &str, ttl: u32) -> Record {
    Record::Addr(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")), ttl)
}
