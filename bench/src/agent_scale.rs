//! The agent at cluster scale: one real agent (`cni-ebpf agent` with NetworkPolicy, the
//! Node watcher and `--kube-proxy-replacement`, as the DaemonSet runs it) on node A of the
//! tests crate's two-node [`Cluster`], watching the stand-in API server ([`ApiServer`])
//! filled as a cluster of `n` nodes is: `n` Node objects (labels, conditions, capacities,
//! images as a kubelet reports them), 30 Pods a node in `0.4 n` namespaces (Deployment
//! pods: owner, labels `app`/`tier`/`version`/`pod-template-hash`, one container with a
//! named port, a Running status), 2 Services a node with 10 endpoints each (one
//! EndpointSlice each) and one NetworkPolicy a namespace (its `app` pods admit the `web`
//! pods of a team's namespaces). At 5 000 nodes: 150 000 Pods in 2 000 namespaces, 10 000
//! Services, 100 000 endpoints, 2 000 policies. Made-up objects hold made-up addresses
//! (pods in 10.128.0.0/9, nodes in 100.64.0.0/10); nothing is ever sent to them.
//!
//! Two real pods of namespace `flip` on node A, `srv` (an echo server) and `cli`, show
//! what the agent has put in force: a policy selecting `srv` admits `cli` or no one.
//! Each size, in this order:
//!
//! 1. **Start → in force**: the pods are ADDed before the agent starts, so they are
//!    closed (checked: `cli` cannot reach `srv`); from the agent's start until the send
//!    of `cli`'s first connection to `srv` that completes (attempts every 5 ms).
//! 2. **Memory after the initial sync**: the agent's resident set (`VmRSS`) 2 s later;
//!    bytes received from the API server so far (the agent's
//!    `cni_ebpf_agent_api_received_bytes_total`, every resource).
//! 3. **Policy write → in force**: the policy is rewritten `writes` times, alternately
//!    to admit no one and `cli`; each timed from just before the API write until a fresh
//!    connection shows the new verdict (as the `policy` phase times it). p50, p99, and
//!    the bytes received per write.
//! 4. **Pods deleted at once → every verdict current**: `churn` made-up Pod objects are
//!    deleted in one burst, then `cli`'s own: timed from the burst's start until `cli`'s
//!    connections are dropped (the agent handles a watch's events in order, so then
//!    every earlier deletion is in force too). The agent's CPU time (user + system, from
//!    `/proc`) from the burst until 1 s after the verdict, per 1 000 events; bytes per
//!    event.
//! 5. **Pods created at once**: the same objects created again, `cli`'s last: until
//!    `cli` connects again; CPU and bytes as in 4.
//! 6. **Peak memory**: the agent's `VmHWM` at the end.
//!
//! The 5 000-node figures carry the targets: resident ≤ 128 MiB (the DaemonSet's limit)
//! after the sync and at peak, start → in force ≤ 15 s, write → in force p50 and p99
//! ≤ 1 s, deletion → current ≤ 5 s.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use testbed::{ApiServer, Cluster, ClusterNode, EchoServer, Serving, EXT_IP4};

use super::{
    policy::{add_pod_to, await_verdict, flip_policy, pod_object, probe, put, Seen, ECHO_PORT},
    proc::{self, check_interrupt},
    report::{percentile, Report},
    service::catch,
    topo::{self, Variant, Workspace},
};

/// Sizes of the phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Cluster sizes (nodes), each a run of its own.
    pub nodes: Vec<usize>,
    /// Policy writes timed until in force.
    pub writes: usize,
    /// Pod objects deleted (and created again) at once.
    pub churn: usize,
}

/// The report section of every row.
const SECTION: &str = "The agent at cluster scale (one agent, the stand-in API server)";
const COL: &str = "cni-ebpf";
/// Pods per node (Kubernetes' own limit of 150 000 pods at 5 000 nodes).
const PODS_PER_NODE: usize = 30;
/// Nodes per namespace (2 000 namespaces at 5 000 nodes).
const NODES_PER_NAMESPACE: f64 = 2.5;
/// Services per node, and endpoints per Service.
const SERVICES_PER_NODE: usize = 2;
const ENDPOINTS_PER_SERVICE: usize = 10;
/// Deployments (`app` labels) per namespace.
const APPS_PER_NAMESPACE: usize = 8;
/// Teams, the label of namespaces policies select by.
const TEAMS: usize = 40;
/// The agent's metrics port in node A's namespace.
const METRICS_PORT: u16 = 19_670;
/// Bound of the first sync, of one timed write and of one burst.
const SYNC_DEADLINE: Duration = Duration::from_secs(180);
const VERDICT_DEADLINE: Duration = Duration::from_secs(30);
/// Pause after each timed write.
const GAP: Duration = Duration::from_millis(200);

/// The objects of a cluster of `nodes` nodes.
#[derive(Debug, Clone, Copy)]
struct Shape {
    nodes: usize,
    namespaces: usize,
    pods: usize,
    services: usize,
}

impl Shape {
    fn of(nodes: usize) -> Self {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a few thousand namespaces"
        )]
        let namespaces = ((nodes as f64 / NODES_PER_NAMESPACE).round() as usize).max(1);
        Self {
            nodes,
            namespaces,
            pods: nodes * PODS_PER_NODE,
            services: nodes * SERVICES_PER_NODE,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p`th percentile of `v` (0 when empty).
fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        percentile(&v, p)
    }
}

fn octets(i: usize) -> (usize, usize, usize) {
    ((i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

/// Made-up node `i`: its name, pod CIDR (a /24 of 10.128.0.0/9) and InternalIP.
fn made_up_node(i: usize) -> (String, String, String) {
    let (a, b, _) = octets(i);
    let (x, y, z) = octets(i + 1);
    (
        format!("node-{i:05}"),
        format!("10.{}.{b}.0/24", 128 + a),
        format!("100.{}.{y}.{z}", 64 + x),
    )
}

/// A Node object as a kubelet reports it.
fn node_object(i: usize) -> Value {
    let (name, cidr, ip) = made_up_node(i);
    let zone = format!("zone-{}", i % 3);
    let images: Vec<Value> = (0..20)
        .map(|k| {
            json!({"names": [format!("registry.example/team-{}/app-{k}@sha256:{:064x}", k % 7, i * 31 + k),
                              format!("registry.example/team-{}/app-{k}:v1.{k}", k % 7)],
                   "sizeBytes": 10_000_000 + k * 1_000_003})
        })
        .collect();
    let conditions: Vec<Value> = [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
    ]
    .iter()
    .map(|t| {
        json!({"type": t, "status": if *t == "Ready" { "True" } else { "False" },
               "lastHeartbeatTime": "2026-11-29T10:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z",
               "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t}")})
    })
    .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                       "topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": "region-1"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "providerID": format!("example://{name}")},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110", "ephemeral-storage": "92Gi"},
            "conditions": conditions,
            "nodeInfo": {"kubeletVersion": "v1.31.4", "kubeProxyVersion": "v1.31.4",
                         "containerRuntimeVersion": "containerd://1.7.24", "osImage": "Debian GNU/Linux 12",
                         "kernelVersion": "6.1.0-28-amd64", "operatingSystem": "linux", "architecture": "amd64",
                         "machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"), "bootID": format!("{i:032x}")},
            "images": images,
        },
    })
}

fn namespace_name(k: usize) -> String {
    format!("ns-{k:04}")
}

fn namespace_object(k: usize) -> Value {
    let name = namespace_name(k);
    let env = ["prod", "staging", "dev"][k % 3];
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name,
                     "team": format!("team-{}", k % TEAMS),
                     "env": env}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Made-up pod `i`: its namespace, name, `app` and address (on node `i / 30`).
fn made_up_pod(shape: Shape, i: usize) -> (String, String, usize, String) {
    let ns = i % shape.namespaces;
    let app = (i / shape.namespaces) % APPS_PER_NAMESPACE;
    let node = i / PODS_PER_NODE;
    let (a, b, _) = octets(node);
    let ip = format!("10.{}.{b}.{}", 128 + a, 2 + i % PODS_PER_NODE);
    (
        namespace_name(ns),
        format!("app-{app}-5f7c9d{app:02x}b4-{i:05x}"),
        app,
        ip,
    )
}

/// A Deployment's running pod, as the API serves it.
fn made_up_pod_object(shape: Shape, i: usize) -> Value {
    let (ns, name, app, ip) = made_up_pod(shape, i);
    let node = i / PODS_PER_NODE;
    let (node_name, _, node_ip) = made_up_node(node);
    let tier = ["web", "api", "db"][app % 3];
    let hash = format!("5f7c9d{app:02x}b4");
    let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-11-29T09:00:01Z"}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "namespace": ns, "name": name,
            "labels": {"app": format!("app-{app}"), "tier": tier, "version": format!("v{}", app % 3),
                       "pod-template-hash": hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("app-{app}-{hash}"),
                                 "uid": format!("{:08x}-0000-4000-8000-{:012x}", app, i), "controller": true,
                                 "blockOwnerDeletion": true}],
        },
        "spec": {
            "nodeName": node_name, "serviceAccountName": "default", "restartPolicy": "Always",
            "containers": [{"name": "main", "image": format!("registry.example/app-{app}:v1.{app}"),
                            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                            "imagePullPolicy": "IfNotPresent"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running", "hostIP": node_ip, "hostIPs": [{"ip": node_ip}],
            "podIP": ip, "podIPs": [{"ip": ip}], "qosClass": "Burstable",
            "startTime": "2026-11-29T09:00:00Z",
            "conditions": conditions,
            "containerStatuses": [{"name": "main", "ready": true, "started": true, "restartCount": 0,
                                   "image": format!("registry.example/app-{app}:v1.{app}"),
                                   "imageID": format!("registry.example/app-{app}@sha256:{:064x}", app),
                                   "containerID": format!("containerd://{:064x}", i),
                                   "state": {"running": {"startedAt": "2026-11-29T09:00:01Z"}}}],
        },
    })
}

/// Service `s` (`10.96.0.0/16`) and its EndpointSlice: 10 of the pods of its namespace.
fn service_objects(shape: Shape, s: usize) -> (Value, Value) {
    let ns_index = s % shape.namespaces;
    let ns = namespace_name(ns_index);
    let app = (s / shape.namespaces) % APPS_PER_NAMESPACE;
    let name = format!("svc-{s:05}");
    let (_, b, c) = octets(s + 1);
    let cluster_ip = format!("10.96.{b}.{c}");
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name, "labels": {"app": format!("app-{app}")}},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
                 "internalTrafficPolicy": "Cluster",
                 "selector": {"app": format!("app-{app}")},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
        "status": {"loadBalancer": {}},
    });
    let endpoints: Vec<Value> = (0..ENDPOINTS_PER_SERVICE)
        .map(|e| {
            // Pods of the namespace, spread over the cluster.
            let i = (ns_index + shape.namespaces * (s * ENDPOINTS_PER_SERVICE + e))
                % shape.pods.max(1);
            let (_, pod, _, ip) = made_up_pod(shape, i);
            let (node, _, _) = made_up_node(i / PODS_PER_NODE);
            json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": node, "zone": format!("zone-{}", (i / PODS_PER_NODE) % 3),
                   "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}})
        })
        .collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": format!("{name}-abcde"),
                     "labels": {"kubernetes.io/service-name": name,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                          "uid": format!("00000000-0000-4000-8000-{s:012x}"), "controller": true}]},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    (service, slice)
}

/// Namespace `k`'s policy: its pods of one app admit the `web` pods of one team's
/// namespaces on the app's named port.
fn policy_object(k: usize) -> Value {
    testbed::netpol::policy_object(
        &namespace_name(k),
        "admit-web",
        json!({
            "podSelector": {"matchLabels": {"app": format!("app-{}", k % APPS_PER_NAMESPACE)}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("team-{}", (k + 1) % TEAMS)}},
                                   "podSelector": {"matchLabels": {"tier": "web"}}}],
                         "ports": [{"protocol": "TCP", "port": "http"}]}],
        }),
    )
}

/// Fills the API with the cluster of `shape` (node A and B as themselves).
fn populate(api: &ApiServer, cluster: &Cluster, shape: Shape) -> Result<()> {
    catch("filling the API server", || {
        for node in cluster.nodes() {
            api.set_node(node.name(), &[node.pod_cidr4()], &[node.ip4()]);
        }
        for i in 0..shape.nodes.saturating_sub(2) {
            api.put("nodes", node_object(i));
        }
        for k in 0..shape.namespaces {
            api.put("namespaces", namespace_object(k));
        }
        for i in 0..shape.pods {
            api.put("pods", made_up_pod_object(shape, i));
        }
        for s in 0..shape.services {
            let (service, slice) = service_objects(shape, s);
            api.put("services", service);
            api.put("endpointslices", slice);
        }
        for k in 0..shape.namespaces {
            api.put("networkpolicies", policy_object(k));
        }
    })
}

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn memory(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (has the agent exited?)"))?;
    let field = |name: &str| -> Result<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// User + system CPU seconds of `pid`.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces), from field 3 on.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("a /proc stat without a command")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |n: usize| -> Result<f64> {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("field {n} of /proc/{pid}/stat"))
    };
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[expect(clippy::cast_precision_loss, reason = "ticks per second")]
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Ok((ticks(14)? + ticks(15)?) / hz)
}

/// The bytes the agent on `netns` has received from the API server (every resource).
fn received_bytes(netns: &Path) -> Result<f64> {
    let text = proc::join(proc::in_netns(netns, || {
        let to = SocketAddr::from(([127, 0, 0, 1], METRICS_PORT));
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }))?;
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("cni_ebpf_agent_api_received_bytes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    if !text.contains("cni_ebpf_agent_api_received_bytes_total") {
        bail!("the agent's /metrics has no cni_ebpf_agent_api_received_bytes_total");
    }
    Ok(total)
}

/// Waits for `cli` → `srv` to show `open` from `since` on: the send of the first
/// connection that showed it, after `since`.
fn until_verdict(cli: &Path, srv: SocketAddr, open: bool, since: Instant) -> Result<Duration> {
    let shown = proc::join(await_verdict(cli, srv, open, since + VERDICT_DEADLINE))?;
    match shown {
        Some(at) => Ok(at.saturating_duration_since(since)),
        None => bail!(
            "cli → srv not {} within {} s",
            if open { "open" } else { "dropped" },
            VERDICT_DEADLINE.as_secs()
        ),
    }
}

/// What one size measured.
#[derive(Debug, Default)]
struct Figures {
    start_to_force_ms: f64,
    rss_synced_mib: f64,
    rss_peak_mib: f64,
    start_bytes: f64,
    write_ms: Vec<f64>,
    bytes_per_write: f64,
    delete_ms: f64,
    delete_cpu_per_1000: f64,
    delete_bytes_per_event: f64,
    create_ms: f64,
    create_cpu_per_1000: f64,
}

/// Runs the phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    let mut details = Map::new();
    let mut synced = Vec::new();
    for &nodes in &p.nodes {
        check_interrupt()?;
        let shape = Shape::of(nodes);
        eprintln!(
            "bench: agent-scale: {nodes} nodes, {} pods in {} namespaces, {} services, {} \
             endpoints, {} policies",
            shape.pods,
            shape.namespaces,
            shape.services,
            shape.services * ENDPOINTS_PER_SERVICE,
            shape.namespaces
        );
        match measure(ws, p, shape) {
            Ok(f) => {
                synced.push((shape.pods, f.rss_synced_mib));
                put_rows(report, &mut details, shape, p, &f);
            }
            Err(e) => {
                if proc::interrupted() {
                    return Err(e);
                }
                let msg = format!("agent at scale, {nodes} nodes: {e:#}");
                eprintln!("bench: {msg}");
                report.notes.push(msg);
            }
        }
    }
    // Resident memory per 10 000 pods: the growth between the smallest and largest size.
    if let (Some(first), Some(last)) = (synced.first(), synced.last()) {
        if last.0 > first.0 {
            #[expect(clippy::cast_precision_loss, reason = "pod counts")]
            let per = (last.1 - first.1) / (last.0 - first.0) as f64 * 10_000.0;
            report.put(
                "agent.rss_per_10k_pods",
                SECTION,
                "resident memory after the sync per 10 000 pods (growth between the \
                 smallest and the largest cluster)",
                "MiB",
                false,
                COL,
                per,
            );
        }
    }
    report
        .details
        .insert("agentScale".into(), Value::Object(details));
    Ok(())
}

fn put_rows(
    report: &mut Report,
    details: &mut Map<String, Value>,
    shape: Shape,
    p: &Params,
    f: &Figures,
) {
    let n = shape.nodes;
    let rows: [(&str, String, &str, f64); 12] = [
        (
            "start",
            "start → policy in force".into(),
            "ms",
            f.start_to_force_ms,
        ),
        (
            "rss_synced",
            "resident memory after the initial sync".into(),
            "MiB",
            f.rss_synced_mib,
        ),
        (
            "rss_peak",
            "resident memory, peak".into(),
            "MiB",
            f.rss_peak_mib,
        ),
        (
            "start_mib",
            "received from the API server until synced".into(),
            "MiB",
            f.start_bytes / 1_048_576.0,
        ),
        (
            "write.p50",
            "policy write → in force, p50".into(),
            "ms",
            pct(&f.write_ms, 50.0),
        ),
        (
            "write.p99",
            "policy write → in force, p99".into(),
            "ms",
            pct(&f.write_ms, 99.0),
        ),
        (
            "write_kib",
            "received per policy write".into(),
            "KiB",
            f.bytes_per_write / 1024.0,
        ),
        (
            "delete",
            format!("{} pods deleted at once → every verdict current", p.churn),
            "ms",
            f.delete_ms,
        ),
        (
            "create",
            format!("{} pods created at once → every verdict current", p.churn),
            "ms",
            f.create_ms,
        ),
        (
            "delete_cpu",
            "CPU per 1 000 pod deletions".into(),
            "s",
            f.delete_cpu_per_1000,
        ),
        (
            "create_cpu",
            "CPU per 1 000 pod creations".into(),
            "s",
            f.create_cpu_per_1000,
        ),
        (
            "event_kib",
            "received per pod deletion".into(),
            "KiB",
            f.delete_bytes_per_event / 1024.0,
        ),
    ];
    let mut d = Map::new();
    for (key, label, unit, v) in rows {
        report.put(
            &format!("agent.{n}.{key}"),
            SECTION,
            &format!("{n} nodes: {label}"),
            unit,
            false,
            COL,
            v,
        );
        d.insert(key.into(), json!(v));
    }
    d.insert("pods".into(), json!(shape.pods));
    d.insert("namespaces".into(), json!(shape.namespaces));
    d.insert("services".into(), json!(shape.services));
    d.insert("writesMs".into(), json!(f.write_ms));
    details.insert(format!("{n} nodes"), Value::Object(d));
}

/// The cluster of one size, its pods and its agent. Field order is drop order.
struct Setup {
    agent: Option<proc::Background>,
    _server: EchoServer,
    cli: testbed::Pod,
    _srv: testbed::Pod,
    srv_addr: SocketAddr,
    api: ApiServer,
    cluster: Cluster,
}

impl Setup {
    fn node(&self) -> &ClusterNode {
        self.cluster.a()
    }

    fn log(&self) -> std::path::PathBuf {
        self.node().dir().join("agent.log")
    }

    /// `e` with the last lines of the agent's log.
    fn with_log(&self, e: anyhow::Error) -> anyhow::Error {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        anyhow::anyhow!(
            "{e:#}\n--- agent ---\n{}",
            lines[lines.len().saturating_sub(10)..].join("\n")
        )
    }
}

fn measure(ws: &Workspace, p: &Params, shape: Shape) -> Result<Figures> {
    let cluster = catch("building the cluster", || Cluster::new("cebb"))?;
    topo::fill_cni_bin(&cluster.a().dir().join("bench-bin"), &ws.plugin)?;
    let api = catch("starting the stand-in API server", || {
        ApiServer::start(cluster.ext_netns(), EXT_IP4)
    })?;
    let filled = Instant::now();
    populate(&api, &cluster, shape)?;
    eprintln!(
        "bench: agent-scale: API filled in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let node = cluster.a();
    put(
        &api,
        "namespaces",
        serde_json::to_value(testbed::netpol::namespace("flip", &[("team", "flip")]))?,
    )?;
    let (srv, srv_ip) = add_pod_to(ws, node, "flip", "srv", true)?;
    let (cli, cli_ip) = add_pod_to(ws, node, "flip", "cli", true)?;
    let cli_object = pod_object("flip", "cli", &[("app", "cli")], &cli_ip)?;
    put(
        &api,
        "pods",
        pod_object("flip", "srv", &[("app", "srv")], &srv_ip)?,
    )?;
    put(&api, "pods", cli_object.clone())?;
    put(&api, "networkpolicies", flip_policy(true))?;
    let server = EchoServer::start(srv.netns(), ECHO_PORT, Serving::Concurrently)?;
    let srv_addr = SocketAddr::new(srv_ip.parse::<IpAddr>()?, ECHO_PORT);
    let mut s = Setup {
        agent: None,
        _server: server,
        cli,
        _srv: srv,
        srv_addr,
        api,
        cluster,
    };
    // Before any agent the pods are closed: the figure below is the agent's.
    let before = probe(s.cli.netns(), s.srv_addr, Duration::from_millis(100))?;
    if before != Seen::Dropped {
        bail!("before the agent started, cli → srv was {before:?}, not dropped");
    }
    let state = s.node().dir().join("policy-state").display().to_string();
    let listen = format!("127.0.0.1:{METRICS_PORT}");
    let argv = s.api.agent_argv(
        &ws.plugin,
        s.node().pin_root(),
        &[
            "agent",
            "--kube-proxy-replacement=true",
            "--state-dir",
            &state,
            "--listen",
            &listen,
            "--probe-listen",
            "127.0.0.1:0",
            "--node-name",
            s.node().name(),
            "--network",
            Variant::Ebpf.network(),
        ],
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let started = Instant::now();
    let agent = proc::Background::spawn_logged(s.node().netns(), &argv, &s.log())?;
    let pid = agent.pid();
    s.agent = Some(agent);
    let run = || -> Result<Figures> {
        let mut f = Figures::default();
        let opened = proc::join(await_verdict(
            s.cli.netns(),
            s.srv_addr,
            true,
            started + SYNC_DEADLINE,
        ))?
        .with_context(|| format!("not in force within {} s", SYNC_DEADLINE.as_secs()))?;
        f.start_to_force_ms = ms(opened.saturating_duration_since(started));
        std::thread::sleep(Duration::from_secs(2));
        f.rss_synced_mib = memory(pid)?.0;
        f.start_bytes = received_bytes(s.node().netns())?;
        eprintln!(
            "bench: agent-scale: in force after {:.0} ms, {:.1} MiB resident, {:.1} MiB received",
            f.start_to_force_ms,
            f.rss_synced_mib,
            f.start_bytes / 1_048_576.0
        );
        // Policy writes.
        let bytes0 = f.start_bytes;
        for i in 0..p.writes {
            check_interrupt()?;
            let admit = i % 2 == 1;
            let t = Instant::now();
            put(&s.api, "networkpolicies", flip_policy(admit))?;
            f.write_ms
                .push(ms(until_verdict(s.cli.netns(), s.srv_addr, admit, t)?));
            std::thread::sleep(GAP);
        }
        put(&s.api, "networkpolicies", flip_policy(true))?;
        until_verdict(s.cli.netns(), s.srv_addr, true, Instant::now())?;
        #[expect(clippy::cast_precision_loss, reason = "a few writes")]
        let writes = p.writes.max(1) as f64;
        f.bytes_per_write = (received_bytes(s.node().netns())? - bytes0) / writes;
        // Deleted at once, cli's own object last.
        let churn = p.churn.min(shape.pods);
        #[expect(clippy::cast_precision_loss, reason = "event counts")]
        let events = (churn + 1) as f64;
        let keys: Vec<(String, String)> = (0..churn)
            .map(|i| {
                let (ns, name, _, _) = made_up_pod(shape, i * (shape.pods / churn.max(1)));
                (ns, name)
            })
            .collect();
        let objects: Vec<Value> = keys
            .iter()
            .filter_map(|(ns, name)| s.api.get("pods", Some(ns), name))
            .collect();
        let (cpu0, bytes0) = (cpu_seconds(pid)?, received_bytes(s.node().netns())?);
        let t = Instant::now();
        catch("deleting the pods", || {
            for (ns, name) in &keys {
                s.api.delete("pods", Some(ns), name);
            }
            s.api.delete("pods", Some("flip"), "cli");
        })?;
        f.delete_ms = ms(until_verdict(s.cli.netns(), s.srv_addr, false, t)?);
        std::thread::sleep(Duration::from_secs(1));
        f.delete_cpu_per_1000 = (cpu_seconds(pid)? - cpu0) / events * 1000.0;
        f.delete_bytes_per_event = (received_bytes(s.node().netns())? - bytes0) / events;
        // Created again at once, cli's last.
        let cpu0 = cpu_seconds(pid)?;
        let t = Instant::now();
        catch("creating the pods", || {
            for o in &objects {
                let mut o = o.clone();
                if let Some(m) = o["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                    m.remove("uid");
                }
                s.api.put("pods", o);
            }
        })?;
        put(&s.api, "pods", cli_object.clone())?;
        f.create_ms = ms(until_verdict(s.cli.netns(), s.srv_addr, true, t)?);
        std::thread::sleep(Duration::from_secs(1));
        f.create_cpu_per_1000 = (cpu_seconds(pid)? - cpu0) / events * 1000.0;
        f.rss_peak_mib = memory(pid)?.1;
        eprintln!(
            "bench: agent-scale: writes p50 {:.0} ms p99 {:.0} ms; {churn} deletions {:.0} ms, \
             creations {:.0} ms; peak {:.1} MiB",
            pct(&f.write_ms, 50.0),
            pct(&f.write_ms, 99.0),
            f.delete_ms,
            f.create_ms,
            f.rss_peak_mib
        );
        Ok(f)
    };
    run().map_err(|e| s.with_log(e))
}
