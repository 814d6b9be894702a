//! Services: pod → ClusterIP → pod with kube-proxy's rules for one ClusterIP
//! Service loaded on the nodes, the endpoint on the client's node and on the other node,
//! cni-ebpf against the reference chain. TCP request/response (transactions/s, p50/p99)
//! and connect/request/close (connections/s: the DNS-like short connections pods open to
//! Services), with the data phase's interleaved repeats and medians
//! ([`data::measure_repeat`]).
//!
//! The nodes are the tests crate's two-node [`testbed::Cluster`] (node A 198.18.0.1 with pods
//! in 10.244.1.0/24, node B 198.18.0.3 with 10.244.2.0/24, a fabric bridge, `ext`, static
//! routes to each other's pod CIDR), and kube-proxy's rules are its renderer's
//! ([`testbed::kubeproxy`]): the same topology and rules the end-to-end tests prove correct,
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
use testbed::{
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
    pod: testbed::Pod,
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
) -> Result<(testbed::Pod, String)> {
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

    /// The stand-in API server in `ext` holding `services`, and the agents of both nodes
    /// with `--kube-proxy-replacement` watching it, once their maps hold them. The agents'
    /// logs go with node A's directory.
    fn replace_kube_proxy(
        &self,
        ws: &Workspace,
        services: &[ServicePort],
    ) -> Result<(testbed::ApiServer, [testbed::process::Background; 2])> {
        let api = catch("starting the API server", || {
            testbed::ApiServer::start(self.cluster.ext_netns(), testbed::EXT_IP4)
        })?;
        let logs = self.cluster.a().dir().to_path_buf();
        let agents = catch("starting the agents", || {
            self.cluster.replace_kube_proxy_of(
                &ws.plugin,
                self.variant.network(),
                &api,
                services,
                &logs,
            )
        })?;
        Ok((api, agents))
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
            testbed::tcp_request(&client, &addr, b"bench", CHECK_TIMEOUT)
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
    let mut at_scale = Value::Null;
    if p.repeats > 0 {
        eprintln!("bench: services at scale: {} Services", scale::SERVICES);
        match scale::run(ws, &clusters[0], &clusters[1], report) {
            Ok(v) => at_scale = v,
            Err(e) if !proc::interrupted() => report
                .notes
                .push(format!("Services at scale stopped: {e:#}")),
            Err(e) => return Err(e),
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
    details.insert("atScale".into(), at_scale);
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
        let (_api, _agents) = c.replace_kube_proxy(ws, &c.services())?;
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

/// The replacement at scale, against kube-proxy's sync of the same cluster.
mod scale {
    use super::*;
    use testbed::kubeproxy::Iptables;

    /// Services written to the API server.
    pub(super) const SERVICES: usize = 10_000;
    /// Endpoints per Service (none of them dialled).
    pub(super) const PER: usize = 10;
    /// EndpointSlice changes timed.
    const CHANGES: usize = 20;

    /// The Services: `s<i>` on ClusterIP `10.97.<i/250>.<i%250+1>` port 80, each with
    /// [`PER`] endpoints on node B.
    fn services(version: usize) -> Vec<ServicePort> {
        (0..SERVICES)
            .map(|i| {
                let mut s = ServicePort::new(
                    &format!("default/s{i}"),
                    "http",
                    Protocol::Tcp,
                    &cluster_ip(i),
                    80,
                );
                for j in 0..PER {
                    s = s.endpoint(
                        &format!("10.250.{}.{}:{}", i % 250, j + 1 + version, 8080),
                        "node-b",
                    );
                }
                s
            })
            .collect()
    }

    fn cluster_ip(i: usize) -> String {
        format!("10.97.{}.{}", i / 250, i % 250 + 1)
    }

    /// [`SERVICES`] Services with [`PER`] endpoints each: how long the agents of `c` take
    /// to load them, how long one EndpointSlice change takes from the API write to the
    /// datapath (median of [`CHANGES`]), and the Service maps' memory per frontend and per
    /// endpoint; against them, on node A of `reference` (which runs no agent), how long
    /// the rules kube-proxy renders for the same cluster take to load, as its full sync
    /// loads them: the whole `iptables-restore` (iptables mode) and `nft -f` (nftables
    /// mode), the first time and again with every Service's endpoints moved. kube-proxy's
    /// own work before the load (rendering included) comes on top of its figures. The
    /// iptables mode loads through `iptables-legacy-restore`: the nf_tables backend of
    /// Debian's iptables 1.8.9 did not load these 310 000 rules within five minutes.
    pub(super) fn run(
        ws: &Workspace,
        c: &SvcCluster,
        reference: &SvcCluster,
        report: &mut Report,
    ) -> Result<Value> {
        let (api, _agents) = c.replace_kube_proxy(ws, &[])?;
        let all = services(0);
        eprintln!("bench: services at scale: writing {SERVICES} Services to the API");
        let started = Instant::now();
        for (resource, obj) in testbed::service_objects::objects(&all) {
            api.put(resource, obj);
        }
        let network = c.variant.network();
        let loaded = |n: &ClusterNode| {
            n.pinned_datapath_of(network)
                .service_table()
                .is_ok_and(|t| t.len() == SERVICES && t.values().all(|f| f.backends.len() == PER))
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        while !c.cluster.nodes().iter().all(|n| loaded(n)) {
            check_interrupt()?;
            if Instant::now() > deadline {
                bail!("{SERVICES} Services not loaded after 300 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let load_ms = started.elapsed().as_secs_f64() * 1e3;
        // One change at a time: Service s<k>'s endpoints move by one address.
        let a = c.cluster.a();
        let mut change_ms = Vec::new();
        for n in 0..CHANGES {
            check_interrupt()?;
            let k = (n * 487) % SERVICES;
            let mut moved = all[k].clone();
            moved.endpoints.clear();
            for j in 0..PER {
                moved = moved.endpoint(&format!("10.250.{}.{}:8080", k % 250, j + 100), "node-b");
            }
            let mut want: Vec<[u8; 16]> = moved
                .endpoints
                .iter()
                .map(|e| match e.addr.ip() {
                    std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                    std::net::IpAddr::V6(v6) => v6.octets(),
                })
                .collect();
            want.sort_unstable();
            let want = Some(want);
            let key = cni_ebpf_common::ServiceKey {
                addr: cni_ebpf_common::mapped4(u32::from_ne_bytes(
                    cluster_ip(k)
                        .parse::<std::net::Ipv4Addr>()
                        .map(|a| a.octets())
                        .unwrap_or_default(),
                )),
                port: 80u16.to_be(),
                proto: cni_ebpf_common::proto::TCP,
                scope: cni_ebpf_common::SCOPE_SOCKET,
            };
            let written = Instant::now();
            for (resource, obj) in testbed::service_objects::objects(&[moved]) {
                if resource == "endpointslices" {
                    api.put(resource, obj);
                }
            }
            let dp = a.pinned_datapath_of(network);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let have = dp.service_frontend(&key).ok().flatten().map(|f| {
                    let mut v: Vec<[u8; 16]> = f.backends.iter().map(|b| b.addr).collect();
                    v.sort_unstable();
                    v
                });
                if have == want {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("a change of s{k} not in force after 30 s");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            change_ms.push(written.elapsed().as_secs_f64() * 1e3);
        }
        let stats = a
            .pinned_datapath_of(network)
            .map_stats()
            .unwrap_or_default();
        let bytes = |name: &str| {
            stats
                .iter()
                .find(|m| m.name == name)
                .map_or(0.0, |m| m.memlock_bytes as f64)
        };
        let endpoints = (SERVICES * PER) as f64;
        let per_frontend = bytes(cni_ebpf_common::map::SERVICES) / SERVICES as f64;
        let per_endpoint = bytes(cni_ebpf_common::map::SERVICE_BACKENDS) / endpoints;
        let change = crate::report::median(&change_ms);
        eprintln!(
            "bench: services at scale: loaded in {load_ms:.0} ms, a change in force after \
             {change:.1} ms (median), {per_frontend:.0} B per frontend, \
             {per_endpoint:.0} B per endpoint"
        );
        let times = |report: &mut Report, column: &str, load: f64, change: f64| {
            report.put(LOAD_KEY, SECTION, LOAD_LABEL, "ms", false, column, load);
            report.put(
                CHANGE_KEY,
                SECTION,
                CHANGE_LABEL,
                "ms",
                false,
                column,
                change,
            );
        };
        times(report, "cni-ebpf", load_ms, change);
        report.put(
            "svc.scale.bytes_per_frontend",
            SECTION,
            "Service map memory per frontend (SERVICES)",
            "B",
            false,
            "cni-ebpf",
            per_frontend,
        );
        report.put(
            "svc.scale.bytes_per_endpoint",
            SECTION,
            "Service map memory per endpoint (SERVICE_BACKENDS)",
            "B",
            false,
            "cni-ebpf",
            per_endpoint,
        );
        // kube-proxy's iptables mode, on the reference's node A. Its nftables mode is not
        // timed: `nft -f` (nftables 1.0.6) did not load the table of these Services within
        // five minutes.
        let node = reference.cluster.a();
        let mut kube_proxy_ms = Vec::new();
        for version in [0, 1] {
            check_interrupt()?;
            let rules =
                testbed::kubeproxy::render(Mode::Iptables, &node.proxy_node(), &services(version));
            let t = Instant::now();
            catch(
                &format!("loading kube-proxy's iptables rules for {SERVICES} Services"),
                || testbed::kubeproxy::load_with(node.netns(), &rules, Iptables::Legacy),
            )?;
            kube_proxy_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (first, again) = (kube_proxy_ms[0], kube_proxy_ms[1]);
        eprintln!(
            "bench: services at scale: kube-proxy's iptables rules loaded in {first:.0} ms, \
             reloaded in {again:.0} ms"
        );
        times(report, replacement::IPTABLES, first, again);
        let kube_proxy = json!({ "iptablesLegacy": { "firstMs": first, "changeMs": again } });
        Ok(json!({
            "services": SERVICES,
            "endpointsPerService": PER,
            "loadMs": load_ms,
            "changeMs": change_ms,
            "bytesPerFrontend": per_frontend,
            "bytesPerEndpoint": per_endpoint,
            "kubeProxyLoad": kube_proxy,
        }))
    }

    const SECTION: &str = "Services at scale: 10 000 Services, 100 000 endpoints (cni-ebpf: the agent's replacement, API write → maps on both nodes; kube-proxy: loading the rules it renders, on one node)";
    pub(crate) const LOAD_KEY: &str = "svc.scale.load_ms";
    const LOAD_LABEL: &str = "every Service loaded";
    pub(crate) const CHANGE_KEY: &str = "svc.scale.change_ms";
    const CHANGE_LABEL: &str =
        "one EndpointSlice change in force (cni-ebpf: median of 20; kube-proxy: a full resync)";
}
