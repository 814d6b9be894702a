//! Data plane: single-stream TCP throughput (iperf3), TCP request/response (one
//! connection, 64-byte request and answer, one at a time: transactions/s and latency
//! percentiles) and TCP connect/request/close (a new connection per transaction:
//! connections/s), for
//! - pod → pod on one node (with the bare veth pair as the floor),
//! - pod → ext (masqueraded to the node address),
//! - ext → node:hostPort → pod.
//!
//! Repeats are interleaved (each repeat measures every figure of every variant, the
//! variants taking turns: iperf3 runs of 1 s, transactions in turns of 0.2 s, see
//! [`transact`]) and the median over repeats is reported, so the drifts and jumps of a
//! shared machine hit every variant alike. The transaction clients and the echo servers
//! are threads of this process that entered the right namespace; iperf3 runs as
//! processes.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::{
    chart,
    proc::{self, check_interrupt, Background},
    report::{median, Report},
    topo::{
        pod_ip, pod_ip6, BenchNode, Pod, PortMap, Variant, Via, Workspace, EXT_IP, EXT_IP6,
        NODE_IP, NODE_IP6,
    },
    transact::{self, Kind},
};
use testbed::{EchoServer, NetNs, Serving};

/// Sizes of the data-plane phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Interleaved repeats.
    pub repeats: usize,
    /// Seconds per measurement.
    pub seconds: f64,
}

/// iperf3 port in servers (pods, ext, bare).
pub const IPERF_PORT: u16 = 5201;
/// Echo server port (in pods, ext, bare; the Service phase's endpoint too).
pub const ECHO_PORT: u16 = 7000;
/// Host ports mapped to the server pod.
const IPERF_HOST_PORT: u16 = 15201;
const ECHO_HOST_PORT: u16 = 17000;
/// Single-stream iperf3 throughput in Gbit/s.
fn iperf(netns: &Path, ip: &str, port: u16, secs: f64) -> Result<f64> {
    let secs_arg = format!("{}", secs.max(1.0).round());
    let port_arg = port.to_string();
    let out = proc::exec(&proc::Spec {
        argv: [
            "iperf3",
            "-c",
            ip,
            "-p",
            &port_arg,
            "-t",
            &secs_arg,
            "-J",
            "--connect-timeout",
            "2000",
        ]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect(),
        env: Vec::new(),
        netns: Some(netns),
        stdin: b"",
        timeout: Duration::from_secs_f64(secs + 20.0),
    })?;
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64();
    match bps {
        Some(b) if out.ok() => Ok(b / 1e9),
        _ => bail!(
            "iperf3 to {ip}:{port} failed: {} {}",
            v["error"].as_str().unwrap_or_default(),
            out.stderr.trim()
        ),
    }
}

/// Where one variant's client runs and what it talks to, per scenario.
pub struct Target {
    /// The report column (variant) it measures.
    pub column: &'static str,
    /// The client's network namespace.
    pub client: PathBuf,
    /// The address it connects to.
    pub ip: String,
    /// iperf3 server port behind `ip`; `None` skips the throughput figure.
    pub iperf_port: Option<u16>,
    /// Echo server port behind `ip`.
    pub echo_port: u16,
}

/// The bare veth floor: two namespaces and a veth pair with static addresses.
struct Bare {
    a: NetNs,
    b: NetNs,
}

impl Bare {
    fn create(tag: &str) -> Result<Self> {
        let a = NetNs::create_replacing(&format!("{tag}-bare-a"))?;
        let b = NetNs::create_replacing(&format!("{tag}-bare-b"))?;
        a.sh(&[
            "ip",
            "link",
            "add",
            "veth0",
            "type",
            "veth",
            "peer",
            "name",
            "veth0",
            "netns",
            b.name(),
        ])?;
        a.sh(&["ip", "addr", "add", "10.99.0.1/24", "dev", "veth0"])?;
        b.sh(&["ip", "addr", "add", "10.99.0.2/24", "dev", "veth0"])?;
        a.sh(&[
            "ip",
            "addr",
            "add",
            "fd00:99::1/64",
            "dev",
            "veth0",
            "nodad",
        ])?;
        b.sh(&[
            "ip",
            "addr",
            "add",
            "fd00:99::2/64",
            "dev",
            "veth0",
            "nodad",
        ])?;
        a.sh(&["ip", "link", "set", "veth0", "up"])?;
        b.sh(&["ip", "link", "set", "veth0", "up"])?;
        client_sysctls(a.path())?;
        Ok(Self { a, b })
    }
}

/// Many short connections from one namespace: reuse TIME_WAIT ports, use a wide range.
pub fn client_sysctls(netns: &Path) -> Result<()> {
    for s in [
        "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=1024 65000",
    ] {
        proc::run_in(
            Some(netns),
            &["sysctl", "-q", "-w", s],
            Duration::from_secs(30),
        )?;
    }
    Ok(())
}

/// A node with a client pod and a server pod (host ports mapped to the servers).
struct DpNode {
    node: BenchNode,
    client: Pod,
    server: Pod,
    server_ip: String,
    /// The server pod's IPv6 address (dual-stack nodes).
    server_ip6: Option<String>,
    server_result: Value,
}

impl DpNode {
    /// A node of `variant`; with IPv6 too when `dual_stack`.
    fn create(ws: &Workspace, variant: Variant, dual_stack: bool) -> Result<Self> {
        let node = if dual_stack {
            BenchNode::create_dual_stack(ws, variant, "dp6")?
        } else {
            BenchNode::create(ws, variant, "dp")?
        };
        let client = node.pod(0)?;
        let server = node.pod(1)?;
        node.op("ADD", Via::Direct, &client, &[], None)?;
        let r = node.op("ADD", Via::Direct, &server, &ports(), None)?;
        client_sysctls(&client.path())?;
        Ok(Self {
            server_ip: pod_ip(&r.result)?,
            server_ip6: if dual_stack {
                Some(pod_ip6(&r.result)?)
            } else {
                None
            },
            server_result: r.result,
            node,
            client,
            server,
        })
    }
}

impl Drop for DpNode {
    fn drop(&mut self) {
        // DEL so that the reference's iptables state and our pins go the regular way; the
        // namespaces and directories go anyway when the fields drop.
        let _ = self.node.op(
            "DEL",
            Via::Direct,
            &self.server,
            &ports(),
            Some(&self.server_result),
        );
    }
}

fn ports() -> [PortMap; 2] {
    [
        PortMap {
            host: IPERF_HOST_PORT,
            container: IPERF_PORT,
        },
        PortMap {
            host: ECHO_HOST_PORT,
            container: ECHO_PORT,
        },
    ]
}

/// Per scenario, metric and column: the value of each repeat.
pub type Samples = BTreeMap<String, BTreeMap<String, BTreeMap<String, Vec<f64>>>>;

/// The figures of one scenario: key, label, unit, higher is better.
const METRICS: [(&str, &str, &str, bool); 7] = [
    ("tput", "TCP throughput, 1 stream", "Gbit/s", true),
    ("rr_tps", "request/response", "transactions/s", true),
    ("rr_p50", "request/response latency p50", "µs", false),
    ("rr_p99", "request/response latency p99", "µs", false),
    ("crr_cps", "connect/request/close", "connections/s", true),
    ("crr_p50", "connect/request/close latency p50", "µs", false),
    ("crr_p99", "connect/request/close latency p99", "µs", false),
];

/// One repeat of scenario `scen` (`title` in notes), each figure `secs` long per target,
/// the targets taking turns (in an order rotated by `rep` and by round, so that no variant
/// always goes first): throughput (if the target has an iperf3 port) as iperf3 runs of
/// 1 s, then request/response and connect/request/close in turns of 0.2 s
/// ([`transact::in_turns`]). A failed figure becomes a note and the others go on; only an
/// interrupt stops it.
pub fn measure_repeat(
    scen: &str,
    title: &str,
    mut targets: Vec<Target>,
    rep: usize,
    secs: f64,
    samples: &mut Samples,
    notes: &mut Vec<String>,
) -> Result<()> {
    let mut push = |metric: &str, col: &str, v: f64| {
        samples
            .entry(scen.to_owned())
            .or_default()
            .entry(metric.to_owned())
            .or_default()
            .entry(col.to_owned())
            .or_default()
            .push(v);
    };
    if !targets.is_empty() {
        let k = rep % targets.len();
        targets.rotate_left(k);
    }
    let mut clients: Vec<(&Path, SocketAddr)> = Vec::with_capacity(targets.len());
    for t in &targets {
        let ip: IpAddr =
            t.ip.parse()
                .with_context(|| format!("{title}: {} is not an address", t.ip))?;
        clients.push((&t.client, SocketAddr::new(ip, t.echo_port)));
    }
    // Throughput: iperf3 runs of 1 s, the targets taking turns, as many rounds as `secs`.
    let rounds = secs.round().max(1.0) as usize;
    let mut tput: Vec<Result<f64>> = targets.iter().map(|_| Ok(0.0)).collect();
    for round in 0..rounds {
        for k in 0..targets.len() {
            check_interrupt()?;
            let i = (round + k) % targets.len();
            let t = &targets[i];
            let (Some(port), Ok(sum)) = (t.iperf_port, &mut tput[i]) else {
                continue;
            };
            match iperf(&t.client, &t.ip, port, 1.0) {
                Ok(g) => *sum += g,
                Err(e) => tput[i] = Err(e),
            }
        }
    }
    for (t, r) in targets.iter().zip(tput) {
        match (t.iperf_port, r) {
            (None, _) => {}
            (Some(_), Ok(sum)) => push("tput", t.column, sum / rounds as f64),
            (Some(_), Err(e)) => notes.push(format!("{title}, {}: {e:#}", t.column)),
        }
    }
    let figures = [
        (Kind::RequestResponse, "rr", "tps", "request/response"),
        (
            Kind::ConnectRequestClose,
            "crr",
            "cps",
            "connect/request/close",
        ),
    ];
    for (kind, key, rate, what) in figures {
        check_interrupt()?;
        let results = transact::in_turns(kind, &clients, secs)?;
        for (t, r) in targets.iter().zip(results) {
            match r {
                Ok(r) => {
                    push(&format!("{key}_{rate}"), t.column, r.per_s);
                    push(&format!("{key}_p50"), t.column, r.lat.p50);
                    push(&format!("{key}_p99"), t.column, r.lat.p99);
                }
                Err(e) => notes.push(format!("{title} {what}, {}: {e:#}", t.column)),
            }
        }
    }
    Ok(())
}

/// The median over repeats of every figure of `scen` in `samples`, as rows `<key>.<metric>`
/// of the report section `section`.
pub fn put_medians(report: &mut Report, samples: &Samples, scen: &str, key: &str, section: &str) {
    for (metric, label, unit, higher) in METRICS {
        let Some(cols) = samples.get(scen).and_then(|m| m.get(metric)) else {
            continue;
        };
        let row = format!("{key}.{metric}");
        for (col, v) in cols {
            report.put(&row, section, label, unit, higher, col, median(v));
        }
        // Each repeat measured the columns taking turns: the median of its ratios.
        let Some(e) = cols.get("cni-ebpf") else {
            continue;
        };
        for (col, v) in cols {
            if col != "cni-ebpf" && v.len() == e.len() && v.iter().all(|x| *x != 0.0) {
                let ratios: Vec<f64> = e.iter().zip(v).map(|(a, b)| a / b).collect();
                report.put_paired(&row, col, median(&ratios));
            }
        }
    }
}

/// Scenario keys and titles.
const SCENARIOS: [(&str, &str); 6] = [
    ("pod2pod", "pod → pod (same node)"),
    ("pod2ext", "pod → ext (masquerade)"),
    ("hostport", "ext → node:hostPort → pod"),
    ("pod2pod6", "pod → pod over IPv6 (same node)"),
    ("pod2ext6", "pod → ext over IPv6 (masquerade)"),
    ("hostport6", "ext → [node]:hostPort → pod over IPv6"),
];

/// Runs the data-plane phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    eprintln!(
        "bench: data plane: setting up bare veth, cni-ebpf and reference nodes (IPv4, and \
         dual-stack for the IPv6 rows)"
    );
    let bare = Bare::create(&ws.tag)?;
    let nodes = [
        DpNode::create(ws, Variant::Ebpf, false)?,
        DpNode::create(ws, Variant::Reference, false)?,
    ];
    let nodes6 = [
        DpNode::create(ws, Variant::Ebpf, true)?,
        DpNode::create(ws, Variant::Reference, true)?,
    ];
    // Servers (iperf3 and the echo server listen on both families): in the bare server
    // namespace, in each server pod and in each ext.
    let mut servers: Vec<(Background, EchoServer)> = Vec::new();
    let mut server_nss: Vec<PathBuf> = vec![bare.b.path().to_path_buf()];
    for n in nodes.iter().chain(&nodes6) {
        server_nss.push(n.server.path());
        server_nss.push(n.node.ext_netns());
    }
    let iperf_port = IPERF_PORT.to_string();
    for ns in &server_nss {
        servers.push((
            Background::spawn(ns, &["iperf3", "-s", "-p", &iperf_port])?,
            EchoServer::start(ns, ECHO_PORT, Serving::OneAtATimePinned)?,
        ));
    }
    std::thread::sleep(Duration::from_millis(300));

    let targets = |scenario: &str| -> Vec<Target> {
        let v6 = scenario.ends_with('6');
        let mut t = Vec::new();
        if scenario.starts_with("pod2pod") {
            t.push(Target {
                column: "bare veth",
                client: bare.a.path().to_path_buf(),
                ip: if v6 { "fd00:99::2" } else { "10.99.0.2" }.into(),
                iperf_port: Some(IPERF_PORT),
                echo_port: ECHO_PORT,
            });
        }
        for n in if v6 { &nodes6 } else { &nodes } {
            let column = n.node.variant.key();
            let server_ip = if v6 {
                n.server_ip6.clone().unwrap_or_default()
            } else {
                n.server_ip.clone()
            };
            t.push(match scenario.trim_end_matches('6') {
                "pod2pod" => Target {
                    column,
                    client: n.client.path(),
                    ip: server_ip,
                    iperf_port: Some(IPERF_PORT),
                    echo_port: ECHO_PORT,
                },
                "pod2ext" => Target {
                    column,
                    client: n.client.path(),
                    ip: if v6 { EXT_IP6 } else { EXT_IP }.into(),
                    iperf_port: Some(IPERF_PORT),
                    echo_port: ECHO_PORT,
                },
                _ => Target {
                    column,
                    client: n.node.ext_netns(),
                    ip: if v6 { NODE_IP6 } else { NODE_IP }.into(),
                    iperf_port: Some(IPERF_HOST_PORT),
                    echo_port: ECHO_HOST_PORT,
                },
            });
        }
        t
    };

    // samples[scenario][metric][column] = per-repeat values
    let mut samples: Samples = BTreeMap::new();
    for rep in 0..p.repeats {
        for (scen, title) in SCENARIOS {
            eprintln!(
                "bench: data plane repeat {}/{}: {title}",
                rep + 1,
                p.repeats
            );
            measure_repeat(
                scen,
                title,
                targets(scen),
                rep,
                p.seconds,
                &mut samples,
                &mut report.notes,
            )?;
        }
    }
    for (scen, title) in SCENARIOS {
        put_medians(
            report,
            &samples,
            scen,
            &format!("dp.{scen}"),
            &format!("Data plane: {title} (median of {} repeats)", p.repeats),
        );
    }
    let mut details = Map::new();
    details.insert("perRepeat".into(), json!(samples));
    if let Some(counters) = ebpf_reasons(&nodes[0].node) {
        details.insert("cniEbpfReasonCounters".into(), counters);
    }
    if let Some(counters) = ebpf_reasons(&nodes6[0].node) {
        details.insert("cniEbpfReasonCountersDualStack".into(), counters);
    }
    report
        .details
        .insert("dataPlane".into(), Value::Object(details));
    drop(servers);
    Ok(())
}

/// The per-reason packet counters of cni-ebpf after the runs (which path packets took).
fn ebpf_reasons(node: &BenchNode) -> Option<Value> {
    reason_counters(
        node.plugin(),
        node.network(),
        node.pin_root(),
        &node.netns(),
    )
}

/// The per-reason packet counters of cni-ebpf's network `network` pinned below `pins`,
/// read by `plugin inspect` inside the node namespace `netns`.
pub fn reason_counters(plugin: &Path, network: &str, pins: &Path, netns: &Path) -> Option<Value> {
    inspect(plugin, network, pins, netns)
        .ok()
        .map(|v| v["reasons"].clone())
}

/// The non-zero packet counters of the ebpf variant's network on `node` (which path the
/// packets took), by reason name.
pub fn nonzero_reasons(plugin: &Path, node: &testbed::ClusterNode) -> Option<Map<String, Value>> {
    let reasons = reason_counters(
        plugin,
        Variant::Ebpf.network(),
        node.pin_root(),
        node.netns(),
    )?;
    Some(
        reasons
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["count"].as_u64().is_some_and(|n| n > 0))
            .filter_map(|r| Some((r["reason"].as_str()?.to_owned(), r["count"].clone())))
            .collect(),
    )
}

/// `plugin inspect --json` of cni-ebpf's network `network` pinned below `pins`, run inside
/// the node namespace `netns`.
pub fn inspect(plugin: &Path, network: &str, pins: &Path, netns: &Path) -> Result<Value> {
    let out = proc::exec(&proc::Spec {
        argv: vec![
            plugin.as_os_str(),
            std::ffi::OsStr::new("inspect"),
            std::ffi::OsStr::new("--json"),
            std::ffi::OsStr::new("--network"),
            std::ffi::OsStr::new(network),
            std::ffi::OsStr::new("--bpffs-root"),
            pins.as_os_str(),
        ],
        env: Vec::new(),
        netns: Some(netns),
        stdin: b"",
        timeout: Duration::from_secs(30),
    })?;
    if out.code != Some(0) || out.timed_out {
        bail!(
            "cni-ebpf inspect failed ({:?}): {}",
            out.code,
            out.stderr.trim()
        );
    }
    serde_json::from_str(&out.stdout).context("cni-ebpf inspect --json printed no JSON")
}

fn short_name(scenario: &str) -> &'static str {
    match scenario {
        "pod2pod" => "pod→pod",
        "pod2ext" => "pod→ext",
        "hostport" => "ext→hostPort",
        "pod2pod6" => "pod→pod v6",
        "pod2ext6" => "pod→ext v6",
        _ => "ext→hostPort v6",
    }
}

/// Bars of the main data-plane figures, normalised to the reference (= 1).
pub fn chart(out: &Path, report: &Report) -> Result<()> {
    let mut groups = Vec::new();
    for (scen, _) in SCENARIOS {
        for (metric, short) in [
            ("tput", "Gbit/s"),
            ("rr_tps", "trans/s"),
            ("crr_cps", "conn/s"),
        ] {
            let Some(row) = report
                .rows
                .iter()
                .find(|r| r.key == format!("dp.{scen}.{metric}"))
            else {
                continue;
            };
            groups.extend(chart::Group::relative(
                format!("{} {short}", short_name(scen)),
                &row.values,
            ));
        }
    }
    if groups.is_empty() {
        return Ok(());
    }
    chart::grouped_bars(
        &out.join("data-plane.svg"),
        "Data plane relative to the reference chain (= 1, higher is better)",
        "× reference",
        &groups,
        &["bare veth", "cni-ebpf", "reference"],
    )
}
