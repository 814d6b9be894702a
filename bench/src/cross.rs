//! Across nodes: pod → pod from node A to node B, cni-ebpf against the kernel's own
//! datapath on the same kind of nodes, in the same run. Single-stream TCP throughput,
//! request/response and connect/request/close, with the data phase's interleaved repeats
//! and medians ([`data::measure_repeat`]).
//!
//! - `tunnel`: nodes in two subnets behind a router that routes no pod CIDR
//!   ([`Cluster::across_subnets`]). cni-ebpf with `crossNode: tunnel`, its agents keeping
//!   the tunnel entries from the Node objects on the tests' stand-in API server; against
//!   the kernel's VXLAN device with static routes, neighbour and FDB entries — flannel's
//!   VXLAN datapath (VNI 1, port 8472, a `/32` of the pod CIDR on the device), with bare
//!   veth pods instead of flannel's bridge, so the reference is the cheaper of the two.
//!   Both sides' pods have MTU 1450.
//! - `routed`: nodes on one segment whose pod CIDRs the fabric routes ([`Cluster::new`]).
//!   cni-ebpf in routed mode against bare veth pods (a veth pair, a host route, the
//!   node forwarding): the floor of any veth datapath.
//!
//! - `wireguard` (only where the kernel has WireGuard: `cargo xtask bench --second-kernel`):
//!   nodes as in `routed`; cni-ebpf with `encryption: wireguard` (its agents making and
//!   exchanging the keys) against cni-ebpf without encryption (the `routed` column) and
//!   against the kernel's own WireGuard device with static routes to it and bare veth
//!   pods (flannel's WireGuard backend's datapath, without its bridge). Pods and devices
//!   have MTU 1440.
//!
//! - `flows`: nodes as in `routed`; cni-ebpf with flow events on (an agent per node
//!   reading them, as the DaemonSet runs it) against cni-ebpf with an agent per node
//!   run with `--flows=false`: what following every flow costs, in the same run.
//!
//! Each column has a cluster of its own (the two tunnel columns would otherwise share
//! UDP port 8472). Names carry `cebb-<pid>`, so a later run sweeps what a killed one left.

use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::Result;
use serde_json::{json, Map, Value};
use testbed::{
    apiserver::ApiServer, cluster::Underlay, Cluster, ClusterNode, EchoServer, Serving, EXT_IP4,
};

use super::{
    data::{self, Samples, Target, ECHO_PORT, IPERF_PORT},
    proc::{self, check_interrupt, Background},
    report::Report,
    service::{add_pod_with, catch, chain},
    topo::{self, Variant, Workspace},
};

/// Sizes of the phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Interleaved repeats.
    pub repeats: usize,
    /// Seconds per measurement.
    pub seconds: f64,
}

/// Scenario keys and titles (`flows` is its own phase: [`run_flows`]).
const SCENARIOS: [(&str, &str); 4] = [
    (
        "tunnel",
        "pod → pod on another node, through the tunnel (nodes in two subnets)",
    ),
    (
        "routed",
        "pod → pod on another node, routed (the fabric routes the pod CIDRs)",
    ),
    (
        "wireguard",
        "pod → pod on another node, encrypted with WireGuard (routed nodes)",
    ),
    (
        "flows",
        "pod → pod on another node, flow events on and off (routed nodes)",
    ),
];

/// The report column of the kernel's VXLAN datapath.
pub const KERNEL_VXLAN: &str = "kernel VXLAN";
/// The report column of bare veth pods.
pub const BARE: &str = "bare veth";

/// The report column of the kernel's WireGuard device.
pub const KERNEL_WIREGUARD: &str = "kernel WireGuard";
/// The report column of cni-ebpf without encryption in the WireGuard scenario.
pub const EBPF_CLEAR: &str = "cni-ebpf, no encryption";
/// The report column of cni-ebpf with flow events off in the flows scenario (the one
/// with them on is `cni-ebpf`, as the DaemonSet runs it).
pub const FLOWS_OFF: &str = "cni-ebpf, flow events off";

/// The MTU of the bare pods and the kernel's VXLAN device over the fabric's 1500 bytes.
const TUNNEL_MTU: u32 = 1450;
/// The MTU of the pods and WireGuard devices over the fabric's 1500 bytes.
const WIREGUARD_MTU: u32 = 1440;

/// Runs `cmd` (a shell line of `ip`/`bridge` commands) in `netns`.
fn sh(netns: &Path, cmd: &str) -> Result<()> {
    proc::run_in(Some(netns), &["sh", "-ec", cmd], topo::OP_TIMEOUT).map(|_| ())
}

/// A routed cluster with an agent per node: the cluster, the client pod, the server pod
/// and its address, the agents, the stand-in API server.
type WithAgents = (
    Cluster,
    testbed::Pod,
    (testbed::Pod, String),
    Vec<testbed::Background>,
    ApiServer,
);

/// One column: a cluster, the client pod on node A and the server pod on node B with its
/// iperf3 and echo servers. Field order is drop order: servers and agents first, then the
/// pods' namespaces, then the cluster.
struct Side {
    column: &'static str,
    _servers: (Background, EchoServer),
    _agents: Vec<testbed::Background>,
    _api: Option<ApiServer>,
    client: testbed::Pod,
    _server: testbed::Pod,
    server_ip: String,
    cluster: Cluster,
}

impl Side {
    fn cluster(tunnel: bool) -> Result<Cluster> {
        catch("building the two-node cluster", || {
            if tunnel {
                Cluster::across_subnets("cebb")
            } else {
                Cluster::new("cebb")
            }
        })
    }

    fn serve(
        column: &'static str,
        cluster: Cluster,
        client: testbed::Pod,
        server: (testbed::Pod, String),
        agents: Vec<testbed::Background>,
        api: Option<ApiServer>,
    ) -> Result<Self> {
        let netns = server.0.netns().to_path_buf();
        let servers = (
            Background::spawn(&netns, &["iperf3", "-s", "-p", &IPERF_PORT.to_string()])?,
            EchoServer::start(&netns, ECHO_PORT, Serving::OneAtATimePinned)?,
        );
        Ok(Self {
            column,
            _servers: servers,
            _agents: agents,
            _api: api,
            client,
            _server: server.0,
            server_ip: server.1,
            cluster,
        })
    }

    /// cni-ebpf in `crossNode: tunnel` (with an agent per node) or routed mode.
    fn ebpf(ws: &Workspace, tunnel: bool) -> Result<Self> {
        let cluster = Self::cluster(tunnel)?;
        for node in cluster.nodes() {
            topo::fill_cni_bin(&node.dir().join("bench-bin"), &ws.plugin)?;
        }
        let mode = if tunnel { "tunnel" } else { "routed" };
        let add = |node: &ClusterNode, name: &str| {
            let mut c = chain(ws, Variant::Ebpf, node);
            if let Some(p) = c.plugins.first_mut().and_then(Value::as_object_mut) {
                p.insert("crossNode".into(), json!(mode));
                // The pods take the path's MTU (less the tunnel's headers).
                p.remove("mtu");
            }
            add_pod_with(&c, Variant::Ebpf, node, name)
        };
        let (client, _) = add(cluster.a(), "cross-cli")?;
        let server = add(cluster.b(), "cross-srv")?;
        let (mut agents, mut api) = (Vec::new(), None);
        if tunnel {
            let server = catch("starting the stand-in API server", || {
                ApiServer::start(cluster.ext_netns(), EXT_IP4)
            })?;
            let logs = cluster.a().dir();
            agents.extend(catch("joining the nodes by the tunnel", || {
                cluster.join_by_tunnel_of(
                    &ws.plugin,
                    Variant::Ebpf.network(),
                    &server,
                    Underlay::V4,
                    logs,
                )
            })?);
            api = Some(server);
        }
        Self::serve("cni-ebpf", cluster, client, server, agents, api)
    }

    /// cni-ebpf on routed nodes with `setting` in its conflist entry (if any), an agent per
    /// node run with `agent_args` besides the usual ones (`key`: each node's WireGuard
    /// key file as a further argument's value, after `--wireguard-key`), its Node object
    /// on the stand-in API server. Returns the cluster's client, server, agents and API
    /// server.
    fn ebpf_with_agents(
        ws: &Workspace,
        setting: Option<(&str, Value)>,
        agent_args: &[&str],
        wireguard_key: bool,
    ) -> Result<WithAgents> {
        let cluster = Self::cluster(false)?;
        for node in cluster.nodes() {
            topo::fill_cni_bin(&node.dir().join("bench-bin"), &ws.plugin)?;
        }
        let add = |node: &ClusterNode, name: &str| {
            let mut c = chain(ws, Variant::Ebpf, node);
            if let Some(p) = c.plugins.first_mut().and_then(Value::as_object_mut) {
                if let Some((k, v)) = &setting {
                    p.insert((*k).into(), v.clone());
                }
                p.remove("mtu");
            }
            add_pod_with(&c, Variant::Ebpf, node, name)
        };
        let (client, _) = add(cluster.a(), "cross-cli")?;
        let server = add(cluster.b(), "cross-srv")?;
        let api = catch("starting the stand-in API server", || {
            ApiServer::start(cluster.ext_netns(), EXT_IP4)
        })?;
        for n in cluster.nodes() {
            api.set_node(n.name(), &[n.pod_cidr4()], &[n.ip4()]);
        }
        let mut agents = Vec::new();
        for n in cluster.nodes() {
            let key = n.dir().join("wireguard/private.key").display().to_string();
            let log = n.dir().join("agent.log");
            let mut args = vec![
                "agent",
                "--policy=false",
                "--network",
                Variant::Ebpf.network(),
                "--listen",
                "127.0.0.1:0",
                "--probe-listen",
                "127.0.0.1:0",
                "--node-name",
                n.name(),
            ];
            args.extend_from_slice(agent_args);
            if wireguard_key {
                args.extend(["--wireguard-key", &key]);
            }
            agents.push(catch("starting an agent", || {
                n.start_agent_of(&ws.plugin, &api, &args, &log)
            })?);
        }
        Ok((cluster, client, server, agents, api))
    }

    /// cni-ebpf on routed nodes, an agent per node following flows (its defaults: every
    /// flow's events read, named and kept) when `on`, else run with `--flows=false`.
    fn ebpf_flows(ws: &Workspace, on: bool) -> Result<Self> {
        let flows = if on { "--flows=true" } else { "--flows=false" };
        let (cluster, client, server, agents, api) =
            Self::ebpf_with_agents(ws, None, &[flows, "--flows-auth", "none"], false)?;
        // Flows are on (off) once each agent opened its network's ring (turned it off).
        let ready = |n: &ClusterNode| n.flows_on_of(Variant::Ebpf.network()) == on;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !cluster.nodes().iter().all(|n| ready(n)) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the agents did not turn flow events {}",
                if on { "on" } else { "off" }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let column = if on { "cni-ebpf" } else { FLOWS_OFF };
        Self::serve(column, cluster, client, server, agents, Some(api))
    }

    /// cni-ebpf with `encryption: wireguard` on routed nodes, an agent per node making
    /// and exchanging the keys.
    fn ebpf_wireguard(ws: &Workspace) -> Result<Self> {
        let (cluster, client, server, agents, api) =
            Self::ebpf_with_agents(ws, Some(("encryption", json!("wireguard"))), &[], true)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !testbed::net::ping(client.netns(), &server.1, 1) {
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "the WireGuard peers did not come up in 10 s; agent logs:\n{}",
                    testbed::cluster::agent_logs(cluster.a().dir())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Self::serve("cni-ebpf", cluster, client, server, agents, Some(api))
    }

    /// Bare veth pods on routed nodes, each node's kernel WireGuard device keyed by
    /// hand and routing the other node's pod CIDR.
    fn kernel_wireguard() -> Result<Self> {
        let cluster = Self::cluster(false)?;
        let (a, b) = (cluster.a(), cluster.b());
        let key = |i: u8| {
            let mut k = [i; 32];
            k[0] &= 248;
            k[31] = (k[31] & 127) | 64;
            k
        };
        for (n, i, peer, j) in [(a, 1, b, 2), (b, 2, a, 1)] {
            sh(
                n.netns(),
                &format!(
                    "ip link add wg0 mtu {WIREGUARD_MTU} type wireguard
                     ip link set wg0 up
                     ip route replace {cidr} dev wg0",
                    cidr = peer.pod_cidr4(),
                ),
            )?;
            let (private, peer_key) = (key(i), key(j));
            let endpoint: std::net::SocketAddr = format!("{}:51820", peer.ip4()).parse()?;
            let allowed = vec![peer.pod_cidr4().parse()?];
            testbed::net::in_netns(n.netns(), move || {
                use cni_ebpf::kernel::wireguard::{Peer, Wg};
                let mut wg = Wg::connect()?;
                wg.set_key_and_port("wg0", &private, 51820)?;
                wg.set_peers(
                    "wg0",
                    &[Peer {
                        public_key: cni_ebpf::agent::wireguard::public_key(&peer_key),
                        endpoint,
                        allowed_ips: allowed,
                    }],
                )
            })
            .map_err(|e| anyhow::anyhow!("keying the kernel's WireGuard: {e}"))?;
        }
        let client = bare_pod(a, "cross-cli", 1, WIREGUARD_MTU)?;
        let server = bare_pod(b, "cross-srv", 2, WIREGUARD_MTU)?;
        Self::serve(
            KERNEL_WIREGUARD,
            cluster,
            client,
            (server, "10.244.2.200".to_owned()),
            Vec::new(),
            None,
        )
    }

    /// Bare veth pods; across subnets with the kernel's VXLAN device between the nodes.
    fn kernel(tunnel: bool) -> Result<Self> {
        let cluster = Self::cluster(tunnel)?;
        let (a, b) = (cluster.a(), cluster.b());
        let mtu = if tunnel { TUNNEL_MTU } else { 1500 };
        if tunnel {
            for (n, i, peer, j) in [(a, 1, b, 2), (b, 2, a, 1)] {
                sh(
                    n.netns(),
                    &format!(
                        "ip link add vx0 address 02:00:00:00:00:0{i} mtu {mtu} type vxlan id 1 \
                         dstport 8472 local {local} dev uplink0 nolearning
                         ip addr add 10.244.{i}.0/32 dev vx0
                         ip link set vx0 up
                         ip route add {cidr} via 10.244.{j}.0 dev vx0 onlink
                         ip neigh add 10.244.{j}.0 lladdr 02:00:00:00:00:0{j} dev vx0 nud permanent
                         bridge fdb append 02:00:00:00:00:0{j} dev vx0 dst {remote}",
                        local = n.ip4(),
                        cidr = peer.pod_cidr4(),
                        remote = peer.ip4(),
                    ),
                )?;
            }
        }
        let client = bare_pod(a, "cross-cli", 1, mtu)?;
        let server = bare_pod(b, "cross-srv", 2, mtu)?;
        let column = if tunnel { KERNEL_VXLAN } else { BARE };
        Self::serve(
            column,
            cluster,
            client,
            (server, "10.244.2.200".to_owned()),
            Vec::new(),
            None,
        )
    }
}

/// Runs the flows phase into `report`: the `flows` scenario of [`SCENARIOS`], its two
/// columns measured in turns, the medians under `cross.flows`.
pub fn run_flows(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    let (scen, title) = SCENARIOS[3];
    eprintln!("bench: flow events: two two-node clusters, agents following flows and not");
    let flows = [Side::ebpf_flows(ws, true)?, Side::ebpf_flows(ws, false)?];
    std::thread::sleep(Duration::from_millis(300));
    let mut samples: Samples = BTreeMap::new();
    for rep in 0..p.repeats {
        eprintln!(
            "bench: flow events repeat {}/{}: {title}",
            rep + 1,
            p.repeats
        );
        let targets = flows.iter().map(|s| target(s, s.column)).collect();
        check_interrupt()?;
        data::measure_repeat(
            scen,
            title,
            targets,
            rep,
            p.seconds,
            &mut samples,
            &mut report.notes,
        )?;
    }
    put_medians(report, &samples, (scen, title), p.repeats);
    let times = program_times(&flows, |targets| {
        let mut scratch: Samples = BTreeMap::new();
        data::measure_repeat(
            scen,
            title,
            targets,
            0,
            p.seconds,
            &mut scratch,
            &mut Vec::new(),
        )
    });
    let sides = flows.iter().map(|s| (s.column, s));
    put_details(ws, report, "flows", samples, sides);
    match times {
        Ok(times) => {
            if let Some(Value::Object(d)) = report.details.get_mut("flows") {
                d.insert("programNsPerRun".into(), times);
            }
        }
        Err(e) => report.notes.push(format!(
            "flow events: the programs' run times were not measured: {e:#}"
        )),
    }
    Ok(())
}

/// The programs whose run time per packet the flows phase reports.
const TIMED_PROGRAMS: [&str; 4] = ["from_pod", "uplink_ingress", "uplink_egress", "to_pod"];

/// Each side's programs' average run time per packet (ns, both nodes together), over
/// one more repeat run by `repeat` with the kernel's run-time statistics on
/// (`BPF_ENABLE_STATS`). Not part of the figures: the statistics add a clock read or
/// two to every run of every program, which would narrow the gap the figures measure.
/// Where flows cost a connection, per program, in the same turns as the figures.
fn program_times(
    sides: &[Side],
    repeat: impl FnOnce(Vec<data::Target>) -> Result<()>,
) -> Result<Value> {
    eprintln!("bench: flow events: one more repeat, the programs' run times measured");
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| anyhow::anyhow!("BPF_ENABLE_STATS: {e}"))?;
    let before: Vec<_> = sides.iter().map(run_times).collect::<Result<_>>()?;
    check_interrupt()?;
    repeat(sides.iter().map(|s| target(s, s.column)).collect())?;
    let after: Vec<_> = sides.iter().map(run_times).collect::<Result<_>>()?;
    drop(stats);
    let mut out = Map::new();
    for ((side, b), a) in sides.iter().zip(before).zip(after) {
        let mut per = Map::new();
        for (name, (ns, runs)) in a {
            let (ns0, runs0) = b.get(name).copied().unwrap_or_default();
            let runs = runs.saturating_sub(runs0);
            if runs > 0 {
                let avg = ns.saturating_sub(ns0) as f64 / runs as f64;
                eprintln!(
                    "bench:   {:<28} {name:<16} {avg:>7.1} ns ({runs} runs)",
                    side.column
                );
                per.insert(name.to_owned(), json!({ "ns": avg, "runs": runs }));
            }
        }
        out.insert(side.column.to_owned(), Value::Object(per));
    }
    Ok(Value::Object(out))
}

/// The accumulated run time (ns) and runs of [`TIMED_PROGRAMS`] on `side`'s two nodes.
fn run_times(side: &Side) -> Result<BTreeMap<&'static str, (u64, u64)>> {
    let mut out = BTreeMap::new();
    for node in [side.cluster.a(), side.cluster.b()] {
        let dp = node.pinned_datapath_of(Variant::Ebpf.network());
        for name in TIMED_PROGRAMS {
            // A program the node does not have (no such pin) is left out.
            let Ok(prog) = dp.program(name) else {
                continue;
            };
            let info = prog.info()?;
            let e: &mut (u64, u64) = out.entry(name).or_default();
            e.0 += u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            e.1 += info.run_count();
        }
    }
    Ok(out)
}

/// Whether the kernel of `netns` has WireGuard (a device made and deleted there).
fn kernel_has_wireguard(netns: &Path) -> bool {
    sh(
        netns,
        "ip link add wgprobe0 type wireguard; ip link del wgprobe0",
    )
    .is_ok()
}

/// A pod on `node` wired by hand: a veth pair of MTU `mtu`, the pod at `10.244.<i>.200`,
/// the node side owning `10.244.<i>.254` (the pod's gateway) and routing the pod's
/// address to it, the node forwarding.
fn bare_pod(node: &ClusterNode, name: &str, i: u8, mtu: u32) -> Result<testbed::Pod> {
    let pod = catch(&format!("creating pod {name}"), || node.pod(name))?;
    let (ip, gw) = (format!("10.244.{i}.200"), format!("10.244.{i}.254"));
    sh(
        node.netns(),
        &format!(
            "sysctl -qw net.ipv4.ip_forward=1
             ip link add bare0 mtu {mtu} type veth peer name eth0 mtu {mtu} netns {ns}
             ip addr add {gw}/32 dev bare0
             ip link set bare0 up
             ip route add {ip}/32 dev bare0",
            ns = pod.netns().display(),
        ),
    )?;
    sh(
        pod.netns(),
        &format!(
            "ip link set lo up
             ip link set eth0 up
             ip addr add {ip}/32 dev eth0
             ip route add {gw} dev eth0 scope link
             ip route add default via {gw}"
        ),
    )?;
    data::client_sysctls(pod.netns())?;
    Ok(pod)
}

/// Runs the phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    eprintln!("bench: across nodes: setting up four two-node clusters (tunnel and routed)");
    let tunnel = [Side::ebpf(ws, true)?, Side::kernel(true)?];
    let routed = [Side::ebpf(ws, false)?, Side::kernel(false)?];
    let wireguard = if kernel_has_wireguard(routed[1].cluster.a().netns()) {
        eprintln!("bench: across nodes: two more, with WireGuard (cni-ebpf and the kernel's)");
        vec![Side::ebpf_wireguard(ws)?, Side::kernel_wireguard()?]
    } else {
        report.notes.push(
            "Across nodes, WireGuard: not measured, this kernel has no WireGuard (run \
             `cargo xtask bench --second-kernel --only cross`)."
                .to_owned(),
        );
        Vec::new()
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut samples: Samples = BTreeMap::new();
    for rep in 0..p.repeats {
        for (i, (scen, title)) in SCENARIOS.into_iter().enumerate() {
            if scen == "flows" {
                continue;
            }
            eprintln!(
                "bench: across nodes repeat {}/{}: {title}",
                rep + 1,
                p.repeats
            );
            let targets: Vec<Target> = match scen {
                "tunnel" => tunnel.iter().map(|s| target(s, s.column)).collect(),
                "routed" => routed.iter().map(|s| target(s, s.column)).collect(),
                _ if wireguard.is_empty() => continue,
                _ => wireguard
                    .iter()
                    .map(|s| target(s, s.column))
                    .chain([target(&routed[0], EBPF_CLEAR)])
                    .collect(),
            };
            check_interrupt()?;
            data::measure_repeat(
                scen,
                title,
                targets,
                rep + i,
                p.seconds,
                &mut samples,
                &mut report.notes,
            )?;
        }
    }
    for (scen, title) in SCENARIOS {
        if scen == "flows" || scen == "wireguard" && wireguard.is_empty() {
            continue;
        }
        put_medians(report, &samples, (scen, title), p.repeats);
    }
    let sides = [("tunnel", &tunnel[0]), ("routed", &routed[0])];
    let sides = sides
        .into_iter()
        .chain(wireguard.first().map(|s| ("wireguard", s)));
    put_details(ws, report, "crossNode", samples, sides);
    Ok(())
}

/// The target of column `column` measured on `s`'s pods.
fn target(s: &Side, column: &'static str) -> Target {
    Target {
        column,
        client: s.client.netns().to_path_buf(),
        ip: s.server_ip.clone(),
        iperf_port: Some(IPERF_PORT),
        echo_port: ECHO_PORT,
    }
}

/// The medians of scenario `(key, title)` as the rows `cross.<key>`.
fn put_medians(
    report: &mut Report,
    samples: &Samples,
    (scen, title): (&str, &str),
    repeats: usize,
) {
    data::put_medians(
        report,
        samples,
        scen,
        &format!("cross.{scen}"),
        &format!("Across nodes: {title} (median of {repeats} repeats)"),
    );
}

/// `samples` and node A's non-zero reason counters of each named side (which path
/// cni-ebpf's packets took on the sending node), as `report.details[name]`.
fn put_details<'a>(
    ws: &Workspace,
    report: &mut Report,
    name: &str,
    samples: Samples,
    sides: impl Iterator<Item = (&'a str, &'a Side)>,
) {
    let mut counters = Map::new();
    for (key, side) in sides {
        let nonzero = data::nonzero_reasons(&ws.plugin, side.cluster.a()).unwrap_or_default();
        counters.insert(key.to_owned(), Value::Object(nonzero));
    }
    let mut details = Map::new();
    details.insert("perRepeat".into(), json!(samples));
    details.insert("cniEbpfReasonCountersNodeA".into(), Value::Object(counters));
    report.details.insert(name.into(), Value::Object(details));
}
