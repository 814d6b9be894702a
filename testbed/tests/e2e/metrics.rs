//! The agent's metrics on the simulated node. The exporter runs inside the
//! node namespace on loopback (as the DaemonSet's main container does on the node), pods
//! are added, talk to each other and to the outside, and `/metrics` is scraped over HTTP
//! from inside the same namespace: per-endpoint counters, reason counters, pods and host
//! ports, map fill and memory, SNAT port use; after a DEL the pod's series are gone.

use std::{
    collections::BTreeMap,
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
};

use testbed::datapath::{
    add, del, greet, masq_conf, pod_ip, tcp_udp, wait_until, with_ports, Mode, TaggedServer, NET, T,
};
use testbed::{assert_ping, net::in_netns, plugin_bin, process::Background, SimNode, EXT_IP4};

/// One sample of a scrape.
#[derive(Debug, Clone)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape: the raw text and its samples.
#[derive(Debug)]
struct Scrape {
    text: String,
    series: Vec<Series>,
}

impl Scrape {
    /// Samples of `name` whose labels include every pair of `with`.
    fn find(&self, name: &str, with: &[(&str, &str)]) -> Vec<&Series> {
        self.series
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                with.iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .collect()
    }

    /// The value of the one sample of `name` with `with`; panics unless there is exactly one.
    #[track_caller]
    fn value(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        match self.find(name, with).as_slice() {
            [s] => s.value,
            other => panic!(
                "{} samples of {name} with {with:?} (expected 1): {other:?}\n{}",
                other.len(),
                self.text
            ),
        }
    }
}

/// Parses the text format: checks that each family's samples follow its `# HELP` and
/// `# TYPE` lines, and unescapes label values.
#[track_caller]
fn parse(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    let (mut helped, mut typed) = (String::new(), String::new());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped = rest.split(' ').next().unwrap_or_default().to_owned();
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            typed = it.next().unwrap_or_default().to_owned();
            assert_eq!(typed, helped, "TYPE without HELP: {line}");
            let kind = it.next().unwrap_or_default();
            assert!(
                (kind == "counter") == typed.ends_with("_total") && !kind.is_empty(),
                "{line}: counters and only counters end in _total"
            );
            continue;
        }
        let (head, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (
                n,
                parse_labels(
                    rest.strip_suffix('}')
                        .unwrap_or_else(|| panic!("bad labels {line:?}")),
                ),
            ),
            None => (head, BTreeMap::new()),
        };
        assert!(name.starts_with("cni_ebpf_"), "{line}");
        assert_eq!(name, typed, "sample outside its family: {line}");
        out.push(Series {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}

#[track_caller]
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(
            chars.next(),
            Some('"'),
            "label {key} of {s:?} is not quoted"
        );
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("dangling escape in {s:?}"),
                },
                Some('"') => break,
                Some(c) => value.push(c),
                None => panic!("unterminated value in {s:?}"),
            }
        }
        out.insert(key, value);
        match chars.next() {
            Some(',') | None => {}
            Some(c) => panic!("unexpected {c:?} after a label in {s:?}"),
        }
    }
    out
}

fn http_get(netns: &Path, addr: SocketAddr, path: &str) -> io::Result<(u16, String, String)> {
    testbed::net::http_get(netns, addr, path, T)
}

/// The exporter, running in the node namespace until dropped.
struct Exporter {
    _proc: Background,
    addr: SocketAddr,
    log: std::path::PathBuf,
    netns: std::path::PathBuf,
}

impl Exporter {
    /// Starts the agent's metrics on `127.0.0.1:port` with `extra` arguments and waits
    /// (bounded) until `/healthz` answers.
    #[track_caller]
    fn start(node: &SimNode, port: u16, extra: &[&str]) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let bin = plugin_bin();
        let root = node.pin_root().to_string_lossy().into_owned();
        let listen = addr.to_string();
        let mut argv = vec![
            bin.to_string_lossy().into_owned(),
            "agent".into(),
            "--policy=false".into(),
            "--listen".into(),
            listen.clone(),
            "--probe-listen".into(),
            listen,
            "--flows-listen".into(),
            "127.0.0.1:0".into(),
            "--bpffs-root".into(),
            root,
            "--data-dir".into(),
            node.data_dir().to_string_lossy().into_owned(),
        ];
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        // With the agent container's capabilities only: scrapes need nothing more.
        let argv = testbed::process::as_agent_container(argv);
        let log = node.dir().join(format!("metrics-{port}.log"));
        let proc = Background::spawn_logged(node.netns(), &argv, &log);
        let netns = node.netns().to_path_buf();
        let up = wait_until(T * 3, || {
            http_get(&netns, addr, "/healthz").is_ok_and(|(s, _, b)| s == 200 && b == "ok\n")
        });
        let me = Self {
            _proc: proc,
            addr,
            log,
            netns,
        };
        assert!(
            up,
            "the exporter did not answer /healthz: {}",
            me.log_text()
        );
        me
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Scrapes `/metrics`, checking the status and content type.
    #[track_caller]
    fn scrape(&self) -> Scrape {
        let (status, head, text) = http_get(&self.netns, self.addr, "/metrics")
            .unwrap_or_else(|e| panic!("GET /metrics: {e}; exporter log: {}", self.log_text()));
        assert_eq!(status, 200, "{head}\n{text}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        let series = parse(&text);
        Scrape { text, series }
    }
}

const ENDPOINT_COUNTERS: [&str; 4] = [
    "cni_ebpf_endpoint_tx_packets_total",
    "cni_ebpf_endpoint_tx_bytes_total",
    "cni_ebpf_endpoint_rx_packets_total",
    "cni_ebpf_endpoint_rx_bytes_total",
];

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn metrics_report_pods_counters_reasons_and_map_memory_and_forget_deleted_pods() {
    let node = SimNode::new("metrics");
    // Started before anything is loaded: every scrape discovers the networks anew.
    let exp = Exporter::start(&node, 9670, &[]);
    let empty = exp.scrape();
    assert!(empty.find("cni_ebpf_up", &[]).is_empty(), "{}", empty.text);
    assert_eq!(empty.value("cni_ebpf_discovery_errors_total", &[]), 0.0);
    assert_eq!(
        empty.value("cni_ebpf_build_info", &[("version", "0.1.0")]),
        1.0
    );

    let conf = masq_conf(&node);
    let (a, b) = (node.pod("a"), node.pod("b"));
    let ra = add(&node, &a, &conf);
    // b is a Kubernetes pod (the runtime names it in CNI_ARGS), a is not.
    let rb = node
        .exec_plugin(
            "ADD",
            &b.env("eth0")
                .with_args("K8S_POD_NAMESPACE=team-b;K8S_POD_NAME=web-0"),
            &with_ports(&conf, &tcp_udp(8080, 80, None)).plugin(),
        )
        .result();
    let (ipa, ipb) = (pod_ip(&ra), pod_ip(&rb));
    let before = exp.scrape();
    let net = [("network", NET)];
    assert_eq!(before.value("cni_ebpf_up", &net), 1.0, "{}", before.text);
    assert_eq!(before.value("cni_ebpf_datapath_loaded", &net), 1.0);
    assert_eq!(before.value("cni_ebpf_scrape_errors_total", &net), 0.0);
    let redirected_before = before.value(
        "cni_ebpf_reason_packets_total",
        &[("network", NET), ("reason", "redirect_pod")],
    );

    // Bounded traffic: pings both ways, one TCP exchange a → b, one masqueraded TCP
    // connection a → ext.
    assert_ping(a.netns(), &ipb);
    assert_ping(b.netns(), &ipa);
    let srv = TaggedServer::start(b.netns(), 8080, "b", Mode::Greet);
    greet(a.netns(), &format!("{ipb}:8080")).unwrap_or_else(|e| panic!("a → b: {e}"));
    let ext = TaggedServer::start(node.ext_netns(), 8080, "ext", Mode::Greet);
    greet(a.netns(), &format!("{EXT_IP4}:8080")).unwrap_or_else(|e| panic!("a → ext: {e}"));
    drop((srv, ext));

    let after = exp.scrape();
    println!("--- a scrape after traffic ---\n{}", after.text);
    for (pod, ip) in [(&a, &ipa), (&b, &ipb)] {
        let who = [("network", NET), ("pod_ip", ip.as_str())];
        for name in ENDPOINT_COUNTERS {
            let s = after.find(name, &who);
            assert_eq!(s.len(), 1, "{name} of {ip}: {s:?}\n{}", after.text);
            assert!(s[0].value > 0.0, "{name} of {ip} is 0\n{}", after.text);
            assert_eq!(s[0].labels["container_id"], pod.container_id());
            assert_eq!(s[0].labels["ifname"], "eth0");
            // The pod, as the IPAM store names it; empty (no label) for a pod the
            // runtime did not name.
            let named = std::ptr::eq(pod, &b);
            assert_eq!(s[0].labels["namespace"], if named { "team-b" } else { "" });
            assert_eq!(s[0].labels["pod"], if named { "web-0" } else { "" });
            assert!(
                s[0].labels["host_ifindex"]
                    .parse::<u32>()
                    .is_ok_and(|i| i > 1),
                "{s:?}"
            );
        }
    }
    let redirected = after.value(
        "cni_ebpf_reason_packets_total",
        &[("network", NET), ("reason", "redirect_pod")],
    );
    assert!(
        redirected >= redirected_before + 8.0,
        "redirect_pod went {redirected_before} → {redirected}, expected ≥ +8 (pings both ways + TCP)"
    );
    // Every reason is reported, zeros included.
    assert_eq!(
        after.find("cni_ebpf_reason_packets_total", &net).len(),
        cni_ebpf_common::Reason::ALL.len(),
        "{}",
        after.text
    );
    assert_eq!(after.value("cni_ebpf_attachments", &net), 2.0);
    assert_eq!(after.value("cni_ebpf_host_ports", &net), 2.0, "tcp + udp");
    let map = |m: &'static str| [("network", NET), ("map", m)];
    assert_eq!(after.value("cni_ebpf_map_entries", &map("ENDPOINTS")), 2.0);
    assert_eq!(after.value("cni_ebpf_map_entries", &map("OWNERS")), 2.0);
    assert_eq!(after.value("cni_ebpf_map_entries", &map("PORTMAPS")), 2.0);
    assert!(after.value("cni_ebpf_map_entries", &map("NAT")) >= 2.0);
    assert_eq!(
        after.value("cni_ebpf_map_max_entries", &map("NAT")),
        f64::from(cni_ebpf_common::MAX_NAT)
    );
    assert_eq!(
        after.value("cni_ebpf_map_max_entries", &map("FLOWS")),
        f64::from(cni_ebpf_common::MAX_FLOWS)
    );
    let total = after.value("cni_ebpf_maps_memory_bytes", &net);
    let per_map: f64 = after
        .find("cni_ebpf_map_memory_bytes", &net)
        .iter()
        .map(|s| s.value)
        .sum();
    assert!(total > 0.0, "map memory is 0\n{}", after.text);
    assert_eq!(total, per_map, "the total is the sum over the maps");
    assert_eq!(
        after.find("cni_ebpf_map_memory_bytes", &net).len(),
        cni_ebpf_common::map::ALL.len()
    );
    // The masqueraded connection holds one SNAT port.
    assert!(after.value("cni_ebpf_snat_port_range_size", &net) > 1000.0);
    assert!(after.value("cni_ebpf_snat_flows", &net) >= 1.0);
    assert!(after.value("cni_ebpf_snat_ports_in_use", &net) >= 1.0);
    assert!(after.value("cni_ebpf_snat_ports_max_per_destination", &net) >= 1.0);
    assert!(
        after.value("cni_ebpf_flows", &[("network", NET), ("state", "verified")])
            + after.value("cni_ebpf_flows", &[("network", NET), ("state", "pending")])
            >= 1.0
    );

    // DEL of a: its series are gone, b's stay.
    del(&node, &a, &conf);
    let gone = exp.scrape();
    for name in ENDPOINT_COUNTERS {
        assert!(
            gone.find(name, &[("pod_ip", ipa.as_str())]).is_empty(),
            "{name} of the deleted pod {ipa} is still served\n{}",
            gone.text
        );
        assert_eq!(gone.find(name, &[("pod_ip", ipb.as_str())]).len(), 1);
    }
    assert!(
        !gone.text.contains(a.container_id()),
        "the deleted pod's container ID is still served\n{}",
        gone.text
    );
    assert_eq!(gone.value("cni_ebpf_attachments", &net), 1.0);
    assert_eq!(gone.value("cni_ebpf_up", &net), 1.0);
    del(&node, &b, &with_ports(&conf, &tcp_udp(8080, 80, None)));
    let none = exp.scrape();
    assert_eq!(none.value("cni_ebpf_attachments", &net), 0.0);
    assert_eq!(none.value("cni_ebpf_host_ports", &net), 0.0);
    assert!(none.find(ENDPOINT_COUNTERS[0], &[]).is_empty());
    let log = exp.log_text();
    assert!(!log.contains("WARN"), "the exporter logged warnings: {log}");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn metrics_of_named_networks_report_an_unloaded_one_and_refuse_other_requests() {
    let node = SimNode::new("metrics_named");
    let conf = masq_conf(&node);
    let a = node.pod("a");
    add(&node, &a, &conf);
    let exp = Exporter::start(
        &node,
        9671,
        &["--network", NET, "--network", "not-loaded-yet"],
    );
    let s = exp.scrape();
    assert_eq!(
        s.value("cni_ebpf_datapath_loaded", &[("network", NET)]),
        1.0
    );
    assert_eq!(s.value("cni_ebpf_attachments", &[("network", NET)]), 1.0);
    let other = [("network", "not-loaded-yet")];
    assert_eq!(s.value("cni_ebpf_datapath_loaded", &other), 0.0);
    assert_eq!(
        s.value("cni_ebpf_up", &other),
        1.0,
        "not loaded yet is not an error"
    );
    assert!(s.find("cni_ebpf_attachments", &other).is_empty());
    // Named networks: no discovery.
    assert!(s.find("cni_ebpf_discovery_errors_total", &[]).is_empty());

    let (status, _, _) = http_get(&exp.netns, exp.addr, "/nothing-here")
        .unwrap_or_else(|e| panic!("GET /nothing-here: {e}"));
    assert_eq!(status, 404);
    // A request that never ends its head is cut off after the read deadline, and the
    // exporter keeps serving.
    let (netns, addr) = (exp.netns.clone(), exp.addr);
    let cut = in_netns(
        &netns,
        move || -> io::Result<(usize, std::time::Duration)> {
            let mut s = TcpStream::connect_timeout(&addr, T)?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")?;
            s.set_read_timeout(Some(T * 3))?;
            let started = std::time::Instant::now();
            let mut buf = Vec::new();
            let n = s.read_to_end(&mut buf).unwrap_or(0);
            Ok((n, started.elapsed()))
        },
    )
    .unwrap_or_else(|e| panic!("slow request: {e}"));
    assert_eq!(cut.0, 0, "an unfinished request gets no answer");
    assert!(
        cut.1 < T * 3,
        "the unfinished request was not cut off: {:?}",
        cut.1
    );
    assert_eq!(exp.scrape().value("cni_ebpf_up", &[("network", NET)]), 1.0);

    // `inspect` shows the same map figures (text and JSON).
    let bin = plugin_bin();
    let root = node.pin_root().to_string_lossy().into_owned();
    let argv = [
        bin.to_string_lossy().into_owned(),
        "inspect".into(),
        "--network".into(),
        NET.into(),
        "--bpffs-root".into(),
        root,
    ];
    let text = node.exec(&argv);
    let out = text.ok();
    assert!(out.contains("\nMAPS\n"), "{out}");
    let nat_line = out
        .lines()
        .skip_while(|l| *l != "MAPS")
        .find(|l| l.trim_start().starts_with("NAT "))
        .unwrap_or_else(|| panic!("no NAT line under MAPS: {out}"));
    // A plain hash: nothing is ever evicted.
    assert!(nat_line.contains(" hash "), "{nat_line}");
    let doc = testbed::datapath::inspect(&node);
    let maps = doc["maps"].as_array().cloned().unwrap_or_default();
    assert_eq!(maps.len(), cni_ebpf_common::map::ALL.len(), "{doc:#}");
    let total: u64 = maps
        .iter()
        .map(|m| m["memlockBytes"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        total as f64,
        exp.scrape()
            .value("cni_ebpf_maps_memory_bytes", &[("network", NET)])
    );
    del(&node, &a, &conf);
}
