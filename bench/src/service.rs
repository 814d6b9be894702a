//! Services: pod → ClusterIP → pod with kube-proxy's rules for one ClusterIP
//! Service loaded on the nodes, the endpoint on the client's node and on the other node,
//! cni-ebpf against the reference chain. TCP request/response (transactions/s, p50/p99)
//! and connect/request/close (connections/s: the DNS-like short connections pods open to
//! Services), with the data phase's interleaved repeats and medians
//! ([`data::measure_repeat`]).
//!
//! The nodes are the tests crate's two-node [`tests::Cluster`] (node A 198.18.0.1 with pods
//! in 10.244.1.0/24, node B 198.18.0.3 with 10.244.2.0/24, a fabric bridge, `ext`, static
//! routes to each other's pod CIDR), and kube-proxy's rules are its renderer's
//! ([`tests::kubeproxy`]): the same topology and rules the end-to-end tests prove correct,
//! not a third copy. One cluster per variant, both nodes running the variant's
//! configuration of the other phases ([`topo::ebpf_plugin`], [`topo::reference_plugins`])
//! on the node's own pod CIDR, so the reference's bridge gateway (`.1`) and its pods sit in
//! the CIDR kube-proxy and the routes use. Pods: the endpoint `srv` (echo server) and a
//! client on node A, a client on node B.
//!
//! kube-proxy's iptables mode (its default) gives the headline rows; nftables mode is an
//! extra row with fewer repeats. Both modes run on the same clusters, nftables first,
//! because its rules go away cleanly with their table (`nft delete table ip kube-proxy`).
//! Before measuring, one request per path to a "who am I" port of the Service records
//! which source address the endpoint saw.
//!
//! The tests crate's helpers panic on failure; the set-up steps run under
//! [`catch_unwind`](std::panic::catch_unwind) and a panic becomes this phase's error (the
//! cluster's guards have removed what it made by then). Names carry `cebb-<pid>` so a
//! later run sweeps what a killed one left.

use std::{
    collections::BTreeMap,
    panic::AssertUnwindSafe,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Map, Value};
use tests::{
    cluster::CLUSTER_CIDR4,
    kubeproxy::{Mode, Protocol, ServicePort},
    Cluster, ClusterNode, EchoServer, Serving, TestCgroup, WhoAmIServer,
};

use super::{
    chart,
    data::{self, Samples, Target},
    proc::{self, check_interrupt},
    report::Report,
    topo::{self, pod_ip, Chain, EbpfConf, Variant, Workspace},
};

/// Sizes of the Service phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Interleaved repeats in iptables mode (the headline rows).
    pub repeats: usize,
    /// Interleaved repeats in nftables mode (0 skips it).
    pub nft_repeats: usize,
    /// Seconds per measurement.
    pub seconds: f64,
}

/// The Service's ClusterIP (in the tests' Service CIDR 10.96.0.0/16).
const CLUSTER_IP: &str = "10.96.0.10";
/// Service port → the endpoint's echo server.
const ECHO_SERVICE_PORT: u16 = 80;
/// Service port → the endpoint's "who am I" server.
const WHOAMI_SERVICE_PORT: u16 = 81;
/// The endpoint's "who am I" port.
const WHOAMI_PORT: u16 = 8080;
/// Bound of each step of the "who am I" request.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The paths measured: key, title, whether the client runs on the other node.
const PATHS: [(&str, &str, bool); 2] = [
    ("same", "pod → ClusterIP → pod, same node", false),
    ("cross", "pod → ClusterIP → pod, other node", true),
];

/// The ClusterIPs of the same Service that kube-proxy's rules translate while the agent's
/// replacement is measured (the agent does not know them, so the socket hooks leave them
/// to the rules), with the port of the echo server each goes to: iptables mode, nftables
/// mode.
const KUBE_PROXY_IPS: [(&str, Mode, u16); 2] = [
    ("10.96.0.20", Mode::Iptables, data::ECHO_PORT + 2),
    ("10.96.0.21", Mode::Nftables, data::ECHO_PORT + 3),
];
/// The port of the echo server the replacement rows' direct column talks to.
const DIRECT_ECHO_PORT: u16 = data::ECHO_PORT + 1;

/// Runs `f`, turning a panic of the tests crate's helpers into an error about `what`.
pub(super) fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned());
        anyhow!("{what}: {msg}")
    })
}

/// A running pod of the cluster and its address.
struct Running {
    pod: tests::Pod,
    ip: String,
}

/// One variant's cluster with its pods. Field order is drop order: the server stops before
/// the pods' namespaces go, and those before the cluster's.
struct SvcCluster {
    variant: Variant,
    _echo: EchoServer,
    server: Running,
    client_a: Running,
    client_b: Running,
    cluster: Cluster,
}

/// The variant's configuration on `node`: its pod CIDR, its pin root, data dir and log.
pub(super) fn chain<'a>(ws: &Workspace, variant: Variant, node: &'a ClusterNode) -> Chain<'a> {
    chain_in(ws, variant, node, None)
}

/// [`chain`], cni-ebpf's with its socket hooks on `cgroup`.
fn chain_in<'a>(
    ws: &Workspace,
    variant: Variant,
    node: &'a ClusterNode,
    cgroup: Option<&Path>,
) -> Chain<'a> {
    let plugins = match variant {
        Variant::Ebpf => vec![topo::ebpf_plugin(&EbpfConf {
            cgroup,
            subnet: node.pod_cidr4(),
            cluster_cidr: CLUSTER_CIDR4,
            v6: None,
            pins: node.pin_root(),
            data_dir: &node.data_dir(),
            log_file: &node.log_file(),
            log_level: &ws.log_level,
            attach: ws.attach.as_deref(),
        })],
        Variant::Reference => {
            topo::reference_plugins(node.pod_cidr4(), None, &node.dir().join("ipam"))
        }
    };
    Chain {
        network: variant.network(),
        plugins,
        node_netns: node.netns().to_path_buf(),
        cni_path: node.dir().join("bench-bin"),
        cni_args: None,
        trace_dir: None,
    }
}

/// Creates pod `name` on `node` and ADDs it through the variant's chain (cni-ebpf's with
/// its socket hooks on `cgroup`).
fn add_pod(
    ws: &Workspace,
    variant: Variant,
    node: &ClusterNode,
    name: &str,
    cgroup: Option<&Path>,
) -> Result<Running> {
    let (pod, ip) = add_pod_with(&chain_in(ws, variant, node, cgroup), variant, node, name)?;
    Ok(Running { pod, ip })
}

/// Creates pod `name` on `node`, ADDs it through `chain` (of `variant`) and sets the
/// client sysctls in it; returns it with its IPv4 address.
pub(super) fn add_pod_with(
    chain: &Chain<'_>,
    variant: Variant,
    node: &ClusterNode,
    name: &str,
) -> Result<(tests::Pod, String)> {
    let pod = catch(&format!("creating pod {name}"), || node.pod(name))?;
    let op = chain.exec(
        "ADD",
        pod.container_id(),
        pod.netns(),
        &[],
        None,
        |what, out| {
            if out.ok() {
                return Ok(());
            }
            bail!(
                "{} {what} of {name} on {} failed ({}): {} {}",
                variant.key(),
                node.name(),
                out.failure(),
                out.stdout.trim(),
                out.stderr.trim()
            )
        },
    )?;
    let ip = pod_ip(&op.result)?;
    data::client_sysctls(pod.netns())?;
    Ok((pod, ip))
}

impl SvcCluster {
    fn create(ws: &Workspace, variant: Variant, cgroup: Option<&Path>) -> Result<Self> {
        let cluster = catch("building the two-node cluster", || Cluster::new("cebb"))?;
        for node in cluster.nodes() {
            topo::fill_cni_bin(&node.dir().join("bench-bin"), &ws.plugin)?;
        }
        let (a, b) = (cluster.a(), cluster.b());
        let name = |what: &str| format!("{}-{what}", variant.key());
        let server = add_pod(ws, variant, a, &name("srv"), cgroup)?;
        let client_a = add_pod(ws, variant, a, &name("cli"), cgroup)?;
        let client_b = add_pod(ws, variant, b, &name("cli"), cgroup)?;
        let echo = EchoServer::start(
            server.pod.netns(),
            data::ECHO_PORT,
            Serving::OneAtATimePinned,
        )?;
        Ok(Self {
            variant,
            _echo: echo,
            server,
            client_a,
            client_b,
            cluster,
        })
    }

    /// The Service: ClusterIP port 80 → the echo server, port 81 → "who am I", both on
    /// the single endpoint `srv` on node A.
    fn services(&self) -> Vec<ServicePort> {
        self.services_at("default/echo", CLUSTER_IP, data::ECHO_PORT)
    }

    /// [`Self::services`] as Service `name` on `cluster_ip`, port 80 going to the echo
    /// server on `echo_port`.
    fn services_at(&self, name: &str, cluster_ip: &str, echo_port: u16) -> Vec<ServicePort> {
        let ep = |port: u16| format!("{}:{port}", self.server.ip);
        vec![
            ServicePort::new(name, "echo", Protocol::Tcp, cluster_ip, ECHO_SERVICE_PORT)
                .endpoint(&ep(echo_port), self.cluster.a().name()),
            ServicePort::new(
                name,
                "whoami",
                Protocol::Tcp,
                cluster_ip,
                WHOAMI_SERVICE_PORT,
            )
            .endpoint(&ep(WHOAMI_PORT), self.cluster.a().name()),
        ]
    }

    fn client(&self, cross: bool) -> &Running {
        if cross {
            &self.client_b
        } else {
            &self.client_a
        }
    }

    /// Loads kube-proxy's rules in `mode` on both nodes.
    fn install(&self, mode: Mode) -> Result<()> {
        let services = self.services();
        catch(
            &format!("loading kube-proxy's {} rules", mode.name()),
            || self.cluster.install_kube_proxy(mode, &services),
        )
    }

    /// Removes kube-proxy's nftables-mode table from both nodes (also where loading it
    /// failed half-way: adding an existing table is a no-op, so the pair always works).
    fn uninstall_nftables(&self) -> Result<()> {
        for node in self.cluster.nodes() {
            proc::run_in(
                Some(node.netns()),
                &["nft", "add table ip kube-proxy; delete table ip kube-proxy"],
                topo::OP_TIMEOUT,
            )?;
        }
        Ok(())
    }

    /// Which source address the endpoint sees for a connection from the client of `cross`
    /// to the Service: `Ok(address)` or why there was no answer.
    fn endpoint_sees(&self, cross: bool) -> Result<String> {
        let client = self.client(cross).pod.netns().to_path_buf();
        let addr = format!("{CLUSTER_IP}:{WHOAMI_SERVICE_PORT}");
        let answer = catch("the who-am-I request", || {
            tests::tcp_request(&client, &addr, b"bench", CHECK_TIMEOUT)
        })?
        .map_err(|e| anyhow!("no answer through {addr}: {e}"))?;
        let peer = answer.lines().next().unwrap_or_default().trim();
        Ok(peer.rsplit_once(':').map_or(peer, |(ip, _)| ip).to_owned())
    }
}

/// Runs the Service phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    eprintln!("bench: services: setting up a two-node cluster each for cni-ebpf and the reference");
    let started = Instant::now();
    let cgroup = catch("creating the bench's cgroup", || {
        TestCgroup::create(&format!("cebb-svc-{}", std::process::id()))
    })?;
    let clusters = [
        SvcCluster::create(ws, Variant::Ebpf, Some(cgroup.path()))?,
        SvcCluster::create(ws, Variant::Reference, None)?,
    ];
    eprintln!(
        "bench: services: clusters ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut samples: Samples = BTreeMap::new();
    let mut seen = Map::new();
    // The agent's replacement first, before kube-proxy's own rows load their rules.
    if p.repeats > 0 {
        match replacement::run(
            ws,
            &clusters[0],
            &cgroup,
            p.repeats,
            p.seconds,
            &mut samples,
        ) {
            Ok(s) => {
                seen.insert("replacement".to_owned(), s);
                for (path, title, _) in PATHS {
                    let scen = format!("kpr.{path}");
                    data::put_medians(
                        report,
                        &samples,
                        &scen,
                        &format!("svc.{scen}"),
                        &format!(
                            "Services without kube-proxy (the agent's replacement): {title} \
                             (median of {} repeats)",
                            p.repeats
                        ),
                    );
                }
            }
            Err(e) if !proc::interrupted() => report
                .notes
                .push(format!("Services, the agent's replacement stopped: {e:#}")),
            Err(e) => return Err(e),
        }
    }
    let mut done: Vec<(Mode, usize)> = Vec::new();
    for (mode, repeats) in [(Mode::Nftables, p.nft_repeats), (Mode::Iptables, p.repeats)] {
        if repeats == 0 {
            continue;
        }
        match run_mode(&clusters, mode, repeats, p.seconds, &mut samples, report) {
            Ok(s) => {
                seen.insert(mode.name().to_owned(), s);
                done.push((mode, repeats));
            }
            Err(e) if !proc::interrupted() => report.notes.push(format!(
                "Services, kube-proxy {} mode stopped: {e:#}",
                mode.name()
            )),
            Err(e) => return Err(e),
        }
        if mode == Mode::Nftables {
            for c in &clusters {
                c.uninstall_nftables()?;
            }
        }
    }
    // The headline (iptables) rows first.
    done.sort_by_key(|(m, _)| *m != Mode::Iptables);
    for (mode, repeats) in done {
        for (path, title, _) in PATHS {
            let scen = format!("{}.{path}", mode.name());
            data::put_medians(
                report,
                &samples,
                &scen,
                &format!("svc.{scen}"),
                &format!(
                    "Services, kube-proxy {} mode: {title} (median of {repeats} repeats)",
                    mode.name()
                ),
            );
        }
    }
    let mut details = Map::new();
    details.insert("perRepeat".into(), json!(samples));
    details.insert("endpointSaw".into(), Value::Object(seen));
    let ebpf = &clusters[0];
    let mut counters = Map::new();
    for node in ebpf.cluster.nodes() {
        if let Some(nonzero) = data::nonzero_reasons(&ws.plugin, node) {
            counters.insert(node.name().to_owned(), Value::Object(nonzero));
        }
    }
    details.insert("cniEbpfReasonCounters".into(), Value::Object(counters));
    report
        .details
        .insert("services".into(), Value::Object(details));
    Ok(())
}

/// kube-proxy in `mode` on every node, the source-address check, then `repeats`
/// interleaved repeats of every path. Returns what the endpoint saw per path and variant.
fn run_mode(
    clusters: &[SvcCluster],
    mode: Mode,
    repeats: usize,
    secs: f64,
    samples: &mut Samples,
    report: &mut Report,
) -> Result<Value> {
    for c in clusters {
        c.install(mode)?;
    }
    let mut seen = Map::new();
    {
        let _whoami = clusters
            .iter()
            .map(|c| {
                catch("starting the who-am-I server", || {
                    WhoAmIServer::start(c.server.pod.netns(), WHOAMI_PORT)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for (path, title, cross) in PATHS {
            let mut per = Map::new();
            for c in clusters {
                let client = &c.client(cross).ip;
                let what = match c.endpoint_sees(cross) {
                    Ok(ip) if &ip == client => format!("{ip} (the client pod)"),
                    Ok(ip) => {
                        report.notes.push(format!(
                            "Services, kube-proxy {} mode, {title}, {}: the endpoint saw \
                             {ip}, not the client pod {client}{}",
                            mode.name(),
                            c.variant.key(),
                            if c.variant == Variant::Reference && cross {
                                " (bridge's ipMasq masquerades everything leaving the \
                                 node's own pod subnet, other nodes' pods too)"
                            } else {
                                ""
                            }
                        ));
                        ip
                    }
                    Err(e) => {
                        report.notes.push(format!(
                            "Services, kube-proxy {} mode, {title}, {}: {e:#}",
                            mode.name(),
                            c.variant.key()
                        ));
                        format!("no answer: {e:#}")
                    }
                };
                per.insert(c.variant.key().to_owned(), json!(what));
            }
            seen.insert(path.to_owned(), Value::Object(per));
        }
    }
    for rep in 0..repeats {
        for (i, (path, title, cross)) in PATHS.into_iter().enumerate() {
            let title = format!("{title} (kube-proxy {})", mode.name());
            eprintln!("bench: services repeat {}/{repeats}: {title}", rep + 1);
            let targets = clusters
                .iter()
                .map(|c| Target {
                    column: c.variant.key(),
                    client: c.client(cross).pod.netns().to_path_buf(),
                    ip: CLUSTER_IP.to_owned(),
                    iperf_port: None,
                    echo_port: ECHO_SERVICE_PORT,
                })
                .collect();
            check_interrupt()?;
            data::measure_repeat(
                &format!("{}.{path}", mode.name()),
                &title,
                targets,
                // Offset by path: even with one repeat, no variant always goes first.
                rep + i,
                secs,
                samples,
                &mut report.notes,
            )?;
        }
    }
    Ok(Value::Object(seen))
}

/// Transactions/s and connections/s of every Service path, relative to the reference.
pub fn chart(out: &Path, report: &Report) -> Result<()> {
    let mut groups = Vec::new();
    for mode in ["iptables", "nftables"] {
        for (path, _, cross) in PATHS {
            for (metric, short) in [("rr_tps", "trans/s"), ("crr_cps", "conn/s")] {
                let key = format!("svc.{mode}.{path}.{metric}");
                let Some(row) = report.rows.iter().find(|r| r.key == key) else {
                    continue;
                };
                let label = format!(
                    "{} {} {short}",
                    if mode == "iptables" { "ipt" } else { "nft" },
                    if cross { "other node" } else { "same node" }
                );
                groups.extend(chart::Group::relative(label, &row.values));
            }
        }
    }
    if groups.is_empty() {
        return Ok(());
    }
    chart::grouped_bars(
        &out.join("services.svg"),
        "pod → ClusterIP → pod relative to the reference chain (= 1, higher is better)",
        "× reference",
        &groups,
        &["cni-ebpf", "reference"],
    )
}

/// The agent's kube-proxy replacement, measured against pod → pod without a Service and
/// against kube-proxy's rules on the same nodes, in the same turns.
mod replacement {
    use super::*;

    /// The agents (with `--kube-proxy-replacement`) on both nodes of `c`, serving the
    /// Service on [`CLUSTER_IP`]; kube-proxy's rules for the same Service on
    /// [`KUBE_PROXY_IPS`]; then `repeats` repeats of every path with this process inside
    /// `cgroup` (where the socket hooks are), the columns taking turns: the Service through
    /// the replacement (`cni-ebpf`), the endpoint directly, and the Service through each
    /// kube-proxy mode. Returns which source address the endpoint saw through the
    /// replacement.
    pub(super) fn run(
        ws: &Workspace,
        c: &SvcCluster,
        cgroup: &TestCgroup,
        repeats: usize,
        secs: f64,
        samples: &mut Samples,
    ) -> Result<Value> {
        let api = catch("starting the API server", || {
            tests::ApiServer::start(c.cluster.ext_netns(), tests::EXT_IP4)
        })?;
        // The agents' logs go with node A's directory.
        let logs = c.cluster.a().dir().to_path_buf();
        let _agents = catch("starting the agents", || {
            c.cluster.replace_kube_proxy_of(
                &ws.plugin,
                c.variant.network(),
                &api,
                &c.services(),
                &logs,
            )
        })?;
        for (ip, mode, port) in KUBE_PROXY_IPS {
            let services = c.services_at(&format!("default/echo-{}", mode.name()), ip, port);
            catch(
                &format!("loading kube-proxy's {} rules", mode.name()),
                || c.cluster.install_kube_proxy(mode, &services),
            )?;
        }
        // An echo server per column: each serves one connection at a time, and the
        // columns' clients keep theirs open while the others take their turns.
        let _echo = [DIRECT_ECHO_PORT, KUBE_PROXY_IPS[0].2, KUBE_PROXY_IPS[1].2]
            .into_iter()
            .map(|port| EchoServer::start(c.server.pod.netns(), port, Serving::OneAtATimePinned))
            .collect::<std::io::Result<Vec<_>>>()?;
        let _whoami = catch("starting the who-am-I server", || {
            WhoAmIServer::start(c.server.pod.netns(), WHOAMI_PORT)
        })?;
        let _inside = catch("joining the bench's cgroup", || cgroup.join())?;
        let mut seen = Map::new();
        for (path, _, cross) in PATHS {
            let what = match c.endpoint_sees(cross) {
                Ok(ip) if ip == c.client(cross).ip => format!("{ip} (the client pod)"),
                Ok(ip) => bail!("{path}: the endpoint saw {ip}, not the client pod"),
                Err(e) => bail!("{path}: {e:#}"),
            };
            seen.insert(path.to_owned(), json!(what));
        }
        let mut notes = Vec::new();
        for rep in 0..repeats {
            for (i, (path, title, cross)) in PATHS.into_iter().enumerate() {
                let title = format!("{title} (kube-proxy replacement)");
                eprintln!("bench: services repeat {}/{repeats}: {title}", rep + 1);
                let client = c.client(cross).pod.netns().to_path_buf();
                let target = |column: &'static str, ip: &str, echo_port: u16| Target {
                    column,
                    client: client.clone(),
                    ip: ip.to_owned(),
                    iperf_port: None,
                    echo_port,
                };
                let targets = vec![
                    target("cni-ebpf", CLUSTER_IP, ECHO_SERVICE_PORT),
                    target(DIRECT, &c.server.ip, DIRECT_ECHO_PORT),
                    target(IPTABLES, KUBE_PROXY_IPS[0].0, ECHO_SERVICE_PORT),
                    target(NFTABLES, KUBE_PROXY_IPS[1].0, ECHO_SERVICE_PORT),
                ];
                check_interrupt()?;
                data::measure_repeat(
                    &format!("kpr.{path}"),
                    &title,
                    targets,
                    rep + i,
                    secs,
                    samples,
                    &mut notes,
                )?;
            }
        }
        if let Some(n) = notes.first() {
            bail!("{n}");
        }
        Ok(Value::Object(seen))
    }

    /// The report's columns of these rows.
    pub(crate) const DIRECT: &str = "direct pod → pod";
    pub(crate) const IPTABLES: &str = "kube-proxy iptables";
    pub(crate) const NFTABLES: &str = "kube-proxy nftables";
}
