//! NetworkPolicy: what enforcing it costs the data path, how soon a change is in force,
//! and what the policy maps take. The real agent (`cni-ebpf agent`, the bench's plugin
//! binary) runs on both nodes of the tests crate's two-node [`Cluster`] and watches the
//! tests crate's stand-in API server ([`ApiServer`], listening in the cluster's `ext`) as
//! it would watch a real one. Pods are ADDed by cni-ebpf with kubelet's `CNI_ARGS`
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`) and published as Pod objects with their
//! addresses, as kubelet reports them. The API holds [`POD_OBJECTS`] Pod objects: the few
//! real pods and, in namespace `bulk`, made-up ones (addresses of the cluster CIDR that
//! no node hands out, nothing ever sent to them) for the rules' selectors to match.
//!
//! In this order (a part that fails becomes a note and the next one runs):
//!
//! 1. **API write → enforced**: a policy admitting client → server on port 7000 of a
//!    pod pair on each node is rewritten `writes` times, alternately to admit no one and
//!    the client again. Each write is timed from just before the API write until a fresh
//!    connection from the client shows the new verdict on both nodes: the send of the
//!    first attempt whose handshake completes, or of the first of two attempts in a row
//!    whose SYN is dropped (no answer within 50 ms). p50 and p99.
//! 2. **ADD → in force**: in a namespace with a default-deny policy (both directions) and
//!    policies admitting the pods labelled `app=new` to a peer pod on port 7000, `adds`
//!    pods are ADDed one by one on the peer's node, each Pod object published as soon as
//!    its ADD returns; each is timed from the start of ADD until the send of the new
//!    pod's first connection attempt to the peer whose handshake completes (attempts of
//!    10 ms every 5 ms). p50 and p99.
//! 3. **Memory**: the `memlock` the kernel charges for the pinned `POLICY_*` maps (fdinfo,
//!    as `cni-ebpf inspect --json` reports it) and the bytes of their live entries (key +
//!    value), on node B: before and after `endpoints` pods selected by a one-rule policy,
//!    and with one pod selected by a policy of 100 and then of 1 000 ingress rules (one
//!    ipBlock peer and one of 16 ports each); the growth ÷ the pods, ÷ the 900 rules. The
//!    hash maps, the LRUs and the arrays are preallocated (their memlock is fixed at
//!    load), the LPM tries and the unpreallocated hashes grow with their entries, and pods
//!    whose rule sets are equal share one; so the preallocated `POLICY_ENDPOINTS`' memlock
//!    ÷ the pods it has room for is reported too.
//! 4. **Cost on the data path**: four client/server pairs on node A, each pair in a
//!    namespace of its own whose 0, 1, 100 or 1 000 policies select both pods (ingress and
//!    egress) and all admit the pair: one admits it, the others admit other pods (by label,
//!    or by namespace and label), other addresses (ipBlock) and other ports. First every
//!    pair is checked in force (the client reaches the server's port 7000 and its port
//!    7001 — no listener — is refused where no policy selects the pair and dropped where
//!    policies do). Then request/response and connect/request/close as the data phase
//!    measures them ([`data::measure_repeat`]: in each repeat the four pairs take turns,
//!    in an order rotated per repeat); each figure ÷ the 0-policy pair's of the same
//!    repeat, median over repeats.
//! 5. **Through a ClusterIP**: on each node a client/server pair reached through a
//!    Service's ClusterIP, translated by kube-proxy's rules (iptables mode on node A,
//!    nftables mode on node B, rendered by the tests crate): one pair in namespace `svc`
//!    without policies, one in `svcnp`, where `default-deny-ingress` selects every pod (the
//!    client's ingress refuses all but the replies of its own connections, which come back
//!    un-DNATed from the ClusterIP) and a policy admits the client to the server's port.
//!    After checking the policy in force (the server's connection to the client is
//!    dropped), request/response and connect/request/close as in part 4; each figure ÷ the
//!    same node's pair without policies in the same repeat, median over repeats.
//!
//! The tests crate's helpers panic on failure; they run under
//! [`catch`](service::catch) and a panic becomes this phase's error. Names carry
//! `cebb-<pid>` (the cluster's), so a later run sweeps what a killed one left; the agents
//! are killed by their PID and every namespace, pin and directory goes with the cluster.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::ErrorKind,
    net::{IpAddr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use cni_ebpf_common::{map, PolicyState};
use serde_json::{json, Map, Value};
use testbed::{ApiServer, Cluster, ClusterNode, EchoServer, Serving, EXT_IP4};

use super::{
    data::{self, Samples, Target},
    proc::{self, check_interrupt},
    report::{median, Report, Summary},
    service::{self, catch},
    topo::{self, pod_ip, Variant, Workspace},
};

/// Sizes of the NetworkPolicy phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Interleaved repeats of the data-path figures.
    pub repeats: usize,
    /// Seconds per data-path measurement.
    pub seconds: f64,
    /// Policy writes timed until enforced on both nodes.
    pub writes: usize,
    /// Pods timed from ADD until their policy is in force.
    pub adds: usize,
    /// Pods ADDed for the memory per endpoint.
    pub endpoints: usize,
}

/// The report section of every row.
const SECTION: &str = "NetworkPolicy (the agent on two nodes, a stand-in API server)";
/// The one column the rows fill.
const COL: &str = "cni-ebpf";
/// A measured pair (a client and a server pod in a namespace of their own) and the
/// policies that select both of its pods.
struct Pair {
    /// Its namespace.
    ns: &'static str,
    /// NetworkPolicies selecting both pods (one admits the pair, the rest are decoys).
    policies: usize,
    /// ClusterNetworkPolicies selecting both pods (decoys in both tiers, and an Admin
    /// rule that passes the pair's traffic on to NetworkPolicy).
    cluster: usize,
    /// Its column in the samples.
    column: &'static str,
    /// Its key in the report's ratios.
    key: &'static str,
}

/// The measured pairs; the first has no policy and is the reference.
const PAIRS: [Pair; 5] = [
    Pair {
        ns: "np0",
        policies: 0,
        cluster: 0,
        column: "0 policies",
        key: "0",
    },
    Pair {
        ns: "np1",
        policies: 1,
        cluster: 0,
        column: "1 policy",
        key: "1",
    },
    Pair {
        ns: "np100",
        policies: 100,
        cluster: 0,
        column: "100 policies",
        key: "100",
    },
    Pair {
        ns: "np1000",
        policies: 1000,
        cluster: 0,
        column: "1000 policies",
        key: "1000",
    },
    Pair {
        ns: "cnp100",
        policies: 100,
        cluster: 100,
        column: "100 cluster policies + 100 policies",
        key: "100c",
    },
];
/// Pod objects in the API while writes are timed (real pods first, the rest made up).
pub const POD_OBJECTS: usize = 1000;
/// Distinct `app` labels of the made-up pods (each decoy rule that selects them by label
/// matches one in this many).
const LABELS: usize = 50;
/// The port every server listens on and the admitting rules name.
pub(crate) const ECHO_PORT: u16 = data::ECHO_PORT;
/// A port no server listens on and no rule admits: refused when no policy selects the
/// server, dropped when one does.
const SHUT_PORT: u16 = 7001;
/// First of the ports decoy rules admit.
const DECOY_PORT: u16 = 8000;
/// How many decoy ports (each a port class of its own: far below the 64 a rule set holds).
const DECOY_PORTS: usize = 8;
/// Rules of the memory phase's policy: two sizes, the cost per rule is their difference.
const RULES: [usize; 2] = [100, 1000];
/// A connection attempt waiting for an admitted flow gives up after this.
const OPEN_WAIT: Duration = Duration::from_millis(10);
/// An attempt that gets no answer within this had its SYN dropped (a same-node handshake
/// takes well under a millisecond).
const DROP_WAIT: Duration = Duration::from_millis(50);
/// Pause between two attempts (leaves the CPUs to the agents).
const PROBE_GAP: Duration = Duration::from_millis(5);
/// Bound of one attempt of the in-force checks.
const CHECK_WAIT: Duration = Duration::from_millis(200);
/// Bound of one timed write or ADD.
const VERDICT_DEADLINE: Duration = Duration::from_secs(10);
/// Bound of waiting for a set of policies to be in force.
const IN_FORCE_DEADLINE: Duration = Duration::from_secs(120);
/// Pause after each timed write or ADD.
const GAP: Duration = Duration::from_millis(200);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A pod the bench ADDed: its namespace (removed on drop) and its address.
struct Real {
    pod: testbed::Pod,
    ip: String,
}

/// The cluster, the API server, the agents and the pods. Field order is drop order: the
/// servers stop, the agents are killed, the pods' namespaces go, then the API server and
/// the cluster (namespaces, pins, directories).
struct Setup {
    servers: Vec<EchoServer>,
    agents: Vec<proc::Background>,
    pods: BTreeMap<String, Real>,
    api: ApiServer,
    cluster: Cluster,
}

/// A node of the cluster.
#[derive(Debug, Clone, Copy)]
enum On {
    A,
    B,
}

/// A NetworkPolicy object.
pub(crate) fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    })
}

/// `[{protocol: TCP, port}]`.
pub(crate) fn tcp_port(port: u16) -> Value {
    json!([{"protocol": "TCP", "port": port}])
}

/// The policy of a rate pair that admits it: the client to the server's echo port, both
/// directions (it selects both pods).
fn admitting(namespace: &str) -> Value {
    policy(
        namespace,
        "admit-pair",
        json!({
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                         "ports": tcp_port(ECHO_PORT)}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "srv"}}}],
                        "ports": tcp_port(ECHO_PORT)}],
        }),
    )
}

/// Decoy `i` of a rate pair's namespace: selects both pods (by the empty selector or by
/// an expression), admits in both directions a peer that is neither of them — pods of
/// its own namespace by label, made-up pods of `bulk` by namespace and label, or an
/// address block — on one of [`DECOY_PORTS`] other ports.
fn decoy(namespace: &str, i: usize) -> Value {
    let label = format!("other-{}", i % LABELS);
    let peer = match i % 3 {
        0 => json!({"podSelector": {"matchLabels": {"app": label}}}),
        1 => json!({"ipBlock": {"cidr": format!("100.64.{}.{}/32", (i / 256) % 256, i % 256)}}),
        _ => json!({"namespaceSelector": {"matchLabels": {"team": "bulk"}},
                     "podSelector": {"matchLabels": {"app": label}}}),
    };
    let selector = if i.is_multiple_of(2) {
        json!({})
    } else {
        json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["srv", "cli"]}]})
    };
    let port = DECOY_PORT + u16::try_from(i % DECOY_PORTS).unwrap_or(0);
    policy(
        namespace,
        &format!("decoy-{i}"),
        json!({
            "podSelector": selector,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [peer.clone()], "ports": tcp_port(port)}],
            "egress": [{"to": [peer], "ports": tcp_port(port)}],
        }),
    )
}

/// Cluster policy `i` of a rate pair's namespace: selects both pods (by namespace, or by
/// namespace and an expression on `app`), in the Admin tier for even `i` and the Baseline
/// tier for odd (of `count`); decoy rules in both directions with every action for peers
/// that are neither pod (a label of its own namespace, made-up pods of `bulk`, an address block)
/// on one of [`DECOY_PORTS`] other ports; and, in the Admin tier's first policy, a rule
/// that passes the pair's traffic on to NetworkPolicy.
fn cluster_decoy(namespace: &str, i: usize, count: usize) -> Value {
    let label = format!("other-{}", i % LABELS);
    let port = DECOY_PORT + u16::try_from(i % DECOY_PORTS).unwrap_or(0);
    let protocols = json!([{"tcp": {"destinationPort": {"number": port}}}]);
    let pods = |ns: Value| json!({"pods": {"namespaceSelector": ns, "podSelector": {"matchLabels": {"app": label}}}});
    let own = json!({"matchLabels": {"ns": namespace}});
    let (from, to) = match i % 3 {
        0 => (pods(own.clone()), pods(own.clone())),
        1 => (
            pods(json!({"matchLabels": {"team": "bulk"}})),
            json!({"networks": [format!("100.64.{}.{}/32", (i / 256) % 256, i % 256)]}),
        ),
        _ => (
            json!({"namespaces": {"matchLabels": {"team": "bulk"}}}),
            pods(json!({"matchLabels": {"team": "bulk"}})),
        ),
    };
    // Grouped by priority, as a platform team's tiers are: the first third of each tier
    // deny, the next accepts, the last passes (consecutive rules with one action share
    // classes; a rule set holds 64).
    let action = ["Deny", "Accept", "Pass"][(i * 3 / count).min(2)];
    let mut ingress =
        vec![json!({"name": "decoy", "action": action, "from": [from], "protocols": protocols})];
    let egress =
        vec![json!({"name": "decoy", "action": action, "to": [to], "protocols": protocols})];
    if i == 0 {
        ingress.insert(0, json!({"name": "to-networkpolicy", "action": "Pass",
            "from": [{"pods": {"namespaceSelector": own, "podSelector": {"matchLabels": {"app": "cli"}}}}],
            "protocols": [{"tcp": {"destinationPort": {"number": ECHO_PORT}}}]}));
    }
    let subject = if i.is_multiple_of(2) {
        json!({"namespaces": own})
    } else {
        json!({"pods": {"namespaceSelector": own,
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["srv", "cli"]}]}}})
    };
    json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": format!("{namespace}-{i}")},
        "spec": {
            "tier": if i.is_multiple_of(2) { "Admin" } else { "Baseline" },
            "priority": i % 1000,
            "subject": subject,
            "ingress": ingress,
            "egress": egress,
        },
    })
}

/// The policy the enforcement writes rewrite: the servers admit the clients (`admit`) or
/// no one, on the echo port.
pub(crate) fn flip_policy(admit: bool) -> Value {
    let from = if admit { "cli" } else { "nobody" };
    policy(
        "flip",
        "flip",
        json!({
            "podSelector": {"matchLabels": {"app": "srv"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": from}}}],
                         "ports": tcp_port(ECHO_PORT)}],
        }),
    )
}

/// The memory phase's policy: `rules` ingress rules for the pod `mem/mem-0`, each one
/// address on one of 16 ports.
fn rules_policy(rules: usize) -> Value {
    let ingress: Vec<Value> = (0..rules)
        .map(|i| {
            let port = 9000 + u16::try_from(i % 16).unwrap_or(0);
            json!({"from": [{"ipBlock": {"cidr": format!("100.65.{}.{}/32", (i / 256) % 256, i % 256)}}],
                   "ports": tcp_port(port)})
        })
        .collect();
    policy(
        "mem",
        "rules",
        json!({
            "podSelector": {"matchLabels": {"app": "mem", "idx": "0"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        }),
    )
}

/// A Namespace object.
pub(crate) fn namespace_object(name: &str, labels: &[(&str, &str)]) -> Result<Value> {
    Ok(serde_json::to_value(testbed::netpol::namespace(
        name, labels,
    ))?)
}

/// A running Pod object with address `ip`.
pub(crate) fn pod_object(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    ip: &str,
) -> Result<Value> {
    let addr: IpAddr = ip
        .parse()
        .with_context(|| format!("{ip} is not an address"))?;
    Ok(serde_json::to_value(testbed::netpol::pod(
        namespace,
        name,
        labels,
        &[addr],
    ))?)
}

/// Creates or replaces `obj` in the API.
pub(crate) fn put(api: &ApiServer, resource: &str, obj: Value) -> Result<()> {
    catch(&format!("publishing a {resource} object"), || {
        api.put(resource, obj);
    })
}

/// Creates the namespace of pod `namespace/name` on `node` and ADDs it as kubelet would
/// (the pod named in `CNI_ARGS`): the pod and its address.
fn add_pod(
    ws: &Workspace,
    node: &ClusterNode,
    namespace: &str,
    name: &str,
) -> Result<(testbed::Pod, String)> {
    add_pod_to(ws, node, namespace, name, false)
}

/// [`add_pod`] on a network whose `networkPolicy` is `enforcing` (a pod ADDed before
/// the agent's first sync is closed until then).
pub(crate) fn add_pod_to(
    ws: &Workspace,
    node: &ClusterNode,
    namespace: &str,
    name: &str,
    enforcing: bool,
) -> Result<(testbed::Pod, String)> {
    let pod = catch(&format!("creating pod {namespace}/{name}"), || {
        node.pod(&format!("{namespace}-{name}"))
    })?;
    let mut chain = service::chain(ws, Variant::Ebpf, node);
    for plugin in &mut chain.plugins {
        plugin["networkPolicy"] = json!(enforcing);
    }
    chain.cni_args = Some(format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"));
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
                "cni-ebpf {what} of {namespace}/{name} on {} failed ({}): {} {}",
                node.name(),
                out.failure(),
                out.stdout.trim(),
                out.stderr.trim()
            )
        },
    )?;
    Ok((pod, pod_ip(&op.result)?))
}

/// What one connection attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The handshake completed.
    Open,
    /// No answer in time: the SYN was dropped.
    Dropped,
    /// Refused: nothing listens, nothing dropped it.
    Refused,
    /// Any other failure.
    Failed,
}

/// One connection attempt to `to` from the calling thread's namespace.
pub(crate) fn attempt(to: SocketAddr, wait: Duration) -> Seen {
    match TcpStream::connect_timeout(&to, wait) {
        Ok(_) => Seen::Open,
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => Seen::Dropped,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Seen::Refused,
        Err(_) => Seen::Failed,
    }
}

/// One connection attempt to `to` from `netns`.
pub(crate) fn probe(netns: &Path, to: SocketAddr, wait: Duration) -> Result<Seen> {
    proc::join(proc::in_netns(netns, move || Ok(attempt(to, wait))))
}

/// A thread in `netns` that tries fresh connections to `to` until they show the verdict
/// `open` (a completed handshake; or two attempts in a row without an answer) and returns
/// when the first attempt that showed it was sent; `None` if none did by `deadline`.
pub(crate) fn await_verdict(
    netns: &Path,
    to: SocketAddr,
    open: bool,
    deadline: Instant,
) -> JoinHandle<Result<Option<Instant>>> {
    proc::in_netns(netns, move || loop {
        if Instant::now() >= deadline || proc::interrupted() {
            return Ok(None);
        }
        let sent = Instant::now();
        let shown = if open {
            attempt(to, OPEN_WAIT) == Seen::Open
        } else {
            attempt(to, DROP_WAIT) == Seen::Dropped && attempt(to, DROP_WAIT) == Seen::Dropped
        };
        if shown {
            return Ok(Some(sent));
        }
        std::thread::sleep(PROBE_GAP);
    })
}

/// Polls `done` every 200 ms until it holds: how long that took; an error after `bound`.
pub(crate) fn wait_until(
    what: &str,
    bound: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        check_interrupt()?;
        if done()? {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= bound {
            bail!("{what}: not within {} s", bound.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The generation of the policy in force on `node` (0: the agent never swapped one in),
/// from the pinned `POLICY_STATE`.
fn generation(node: &ClusterNode) -> Result<u32> {
    let pin = topo::maps_dir(node.pin_root(), Variant::Ebpf.network()).join(map::POLICY_STATE);
    if !pin.exists() {
        return Ok(0);
    }
    let out = proc::run_in(
        None,
        &[
            "bpftool",
            "-j",
            "map",
            "dump",
            "pinned",
            &pin.to_string_lossy(),
        ],
        Duration::from_secs(10),
    )?;
    let doc: Value = serde_json::from_str(&out).context("bpftool map dump printed no JSON")?;
    let bytes: Vec<u8> = doc[0]["value"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|b| u8::from_str_radix(b.trim_start_matches("0x"), 16).ok())
        .collect();
    let at = std::mem::offset_of!(PolicyState, generation);
    let field = bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .with_context(|| format!("POLICY_STATE holds {bytes:?}"))?;
    Ok(u32::from_ne_bytes(field))
}

/// `cni-ebpf inspect --json` of `node`'s network with `filter` (`--pod …`,
/// `--namespace …`).
fn inspect(ws: &Workspace, node: &ClusterNode, filter: &[&str]) -> Result<Value> {
    let pins = node.pin_root().to_string_lossy().into_owned();
    let data_dir = node.data_dir().to_string_lossy().into_owned();
    let plugin = ws.plugin.to_string_lossy().into_owned();
    let mut argv = vec![
        plugin.as_str(),
        "inspect",
        "--json",
        "--network",
        Variant::Ebpf.network(),
        "--bpffs-root",
        &pins,
        "--data-dir",
        &data_dir,
    ];
    argv.extend_from_slice(filter);
    let out = proc::run_in(Some(node.netns()), &argv, Duration::from_secs(60))?;
    serde_json::from_str(&out).context("cni-ebpf inspect --json printed no JSON")
}

/// The pinned `POLICY_*` maps: kernel memory, bytes of the live entries, peer prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PolicyMemory {
    memlock: u64,
    live: u64,
    peers: u64,
    per_map: Map<String, Value>,
}

impl PolicyMemory {
    /// From an inspect document's `maps`.
    fn of(doc: &Value) -> Self {
        let ncpu = std::thread::available_parallelism().map_or(1, usize::from) as u64;
        let mut m = Self::default();
        for entry in doc["maps"].as_array().into_iter().flatten() {
            let name = entry["name"].as_str().unwrap_or_default();
            if !name.starts_with("POLICY_") {
                continue;
            }
            let entries = entry["entries"].as_u64().unwrap_or(0);
            // A per-CPU map holds a value per CPU.
            let copies = if entry["type"].as_str().is_some_and(|t| t.contains("percpu")) {
                ncpu
            } else {
                1
            };
            let bytes = entry["keySize"].as_u64().unwrap_or(0)
                + entry["valueSize"].as_u64().unwrap_or(0) * copies;
            let memlock = entry["memlockBytes"].as_u64().unwrap_or(0);
            m.memlock += memlock;
            m.live += entries * bytes;
            if name == map::POLICY_PEERS {
                m.peers = entries;
            }
            m.per_map.insert(
                name.to_owned(),
                json!({ "type": entry["type"], "maxEntries": entry["maxEntries"],
                        "entries": entries, "bytesPerEntry": bytes, "bytesMemlock": memlock }),
            );
        }
        m
    }

    fn json(&self) -> Value {
        json!({ "bytesMemlock": self.memlock, "bytesLiveEntries": self.live,
                "maps": self.per_map })
    }
}

/// The policy maps of `node` once two readings 300 ms apart agree (a round in progress
/// settles); `filter` keeps inspect's output small (a pod of the node).
fn settled_memory(ws: &Workspace, node: &ClusterNode, filter: &[&str]) -> Result<PolicyMemory> {
    let mut last = PolicyMemory::of(&inspect(ws, node, filter)?);
    for _ in 0..20 {
        check_interrupt()?;
        std::thread::sleep(Duration::from_millis(300));
        let now = PolicyMemory::of(&inspect(ws, node, filter)?);
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    bail!("the policy maps of {} never settled", node.name())
}

impl Setup {
    /// The cluster, the API server with every namespace and [`POD_OBJECTS`] Pod objects,
    /// the pods of the four parts (but the timed ones) with their servers, and an agent
    /// per node whose first round is done.
    fn create(ws: &Workspace) -> Result<Self> {
        let cluster = catch("building the two-node cluster", || Cluster::new("cebb"))?;
        for node in cluster.nodes() {
            topo::fill_cni_bin(&node.dir().join("bench-bin"), &ws.plugin)?;
        }
        let api = catch("starting the stand-in API server", || {
            let api = ApiServer::start(cluster.ext_netns(), EXT_IP4);
            api.install_crd("clusternetworkpolicies");
            api
        })?;
        let mut s = Self {
            servers: Vec::new(),
            agents: Vec::new(),
            pods: BTreeMap::new(),
            api,
            cluster,
        };
        let mut namespaces: Vec<(String, Vec<(&str, String)>)> = PAIRS
            .iter()
            .map(|p| (p.ns.to_owned(), vec![("ns", p.ns.to_owned())]))
            .collect();
        for ns in ["flip", "newpods", "mem", "svc", "svcnp"] {
            namespaces.push((ns.to_owned(), vec![("ns", ns.to_owned())]));
        }
        namespaces.push(("bulk".to_owned(), vec![("team", "bulk".to_owned())]));
        for (ns, labels) in &namespaces {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            put(&s.api, "namespaces", namespace_object(ns, &labels)?)?;
        }
        for p in &PAIRS {
            s.add(ws, On::A, p.ns, "srv", &[("app", "srv")])?;
            s.add(ws, On::A, p.ns, "cli", &[("app", "cli")])?;
        }
        s.add(ws, On::A, "flip", "srv-a", &[("app", "srv")])?;
        s.add(ws, On::A, "flip", "cli-a", &[("app", "cli")])?;
        s.add(ws, On::B, "flip", "srv-b", &[("app", "srv")])?;
        s.add(ws, On::B, "flip", "cli-b", &[("app", "cli")])?;
        s.add(ws, On::A, "newpods", "peer", &[("app", "peer")])?;
        for (on, node) in [(On::A, "a"), (On::B, "b")] {
            for ns in ["svc", "svcnp"] {
                s.add(ws, on, ns, &format!("srv-{node}"), &[("app", "srv")])?;
                s.add(ws, on, ns, &format!("cli-{node}"), &[("app", "cli")])?;
            }
        }
        for k in 0..POD_OBJECTS.saturating_sub(s.pods.len()) {
            let ip = format!("10.244.{}.{}", 100 + k / 250, 1 + k % 250);
            let label = format!("other-{}", k % LABELS);
            let obj = pod_object("bulk", &format!("other-{k}"), &[("app", &label)], &ip)?;
            put(&s.api, "pods", obj)?;
        }
        for (key, serving) in PAIRS
            .iter()
            .map(|p| (format!("{}/srv", p.ns), Serving::OneAtATimePinned))
            .chain(
                ["flip/srv-a", "flip/srv-b", "newpods/peer"]
                    .map(|k| (k.to_owned(), Serving::Concurrently)),
            )
            .chain(
                ["svc/srv-a", "svcnp/srv-a", "svc/srv-b", "svcnp/srv-b"]
                    .map(|k| (k.to_owned(), Serving::OneAtATimePinned)),
            )
        {
            let netns = s.real(&key)?.pod.netns().to_path_buf();
            s.servers
                .push(EchoServer::start(&netns, ECHO_PORT, serving)?);
        }
        for key in s.pods.keys().filter(|k| k.contains("/cli")) {
            data::client_sysctls(s.real(key)?.pod.netns())?;
        }
        for node in s.cluster.nodes() {
            let log = node.dir().join("agent.log");
            let argv = s.api.agent_argv(
                &ws.plugin,
                node.pin_root(),
                &["agent", "--listen", "127.0.0.1:0"],
            );
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let agent = proc::Background::spawn_logged(node.netns(), &argv, &log)?;
            s.agents.push(agent);
        }
        wait_until("the agents' first rounds", Duration::from_secs(60), || {
            Ok(generation(s.cluster.a())? >= 1 && generation(s.cluster.b())? >= 1)
        })
        .map_err(|e| s.with_logs(e))?;
        Ok(s)
    }

    /// ADDs pod `namespace/name` on node `on` and publishes its Pod object.
    fn add(
        &mut self,
        ws: &Workspace,
        on: On,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Result<()> {
        let node = match on {
            On::A => self.cluster.a(),
            On::B => self.cluster.b(),
        };
        let (pod, ip) = add_pod(ws, node, namespace, name)?;
        put(&self.api, "pods", pod_object(namespace, name, labels, &ip)?)?;
        self.pods
            .insert(format!("{namespace}/{name}"), Real { pod, ip });
        Ok(())
    }

    fn real(&self, key: &str) -> Result<&Real> {
        self.pods.get(key).with_context(|| format!("no pod {key}"))
    }

    fn netns(&self, key: &str) -> Result<PathBuf> {
        Ok(self.real(key)?.pod.netns().to_path_buf())
    }

    fn addr(&self, key: &str, port: u16) -> Result<SocketAddr> {
        let ip: IpAddr = self.real(key)?.ip.parse()?;
        Ok(SocketAddr::new(ip, port))
    }

    fn put(&self, resource: &str, obj: Value) -> Result<()> {
        put(&self.api, resource, obj)
    }

    /// `e` with the last lines of both agents' logs.
    fn with_logs(&self, e: anyhow::Error) -> anyhow::Error {
        let mut tail = String::new();
        for node in self.cluster.nodes() {
            let log = std::fs::read_to_string(node.dir().join("agent.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let _ = write!(tail, "\n--- agent on {} ---\n", node.name());
            tail.push_str(&lines[lines.len().saturating_sub(8)..].join("\n"));
        }
        anyhow!("{e:#}{tail}")
    }
}

/// Runs the NetworkPolicy phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    eprintln!(
        "bench: policy: a two-node cluster, the stand-in API server with {POD_OBJECTS} Pod \
         objects, an agent per node"
    );
    let started = Instant::now();
    let mut s = Setup::create(ws)?;
    eprintln!(
        "bench: policy: ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut details = Map::new();
    details.insert("podObjects".into(), json!(POD_OBJECTS));
    let parts: [(&str, PartFn); 6] = [
        ("API write → enforced", enforcement),
        ("ADD → in force", add_to_open),
        ("memory", memory),
        ("cost on the data path", rates),
        ("through a ClusterIP", through_cluster_ip),
        ("DNS answers", dns_answers),
    ];
    for (what, part) in parts {
        check_interrupt()?;
        if let Err(e) = part(&mut s, ws, p, report, &mut details) {
            if proc::interrupted() {
                return Err(e);
            }
            let msg = format!("NetworkPolicy, {what}: {:#}", s.with_logs(e));
            eprintln!("bench: {msg}");
            report.notes.push(msg);
        }
    }
    report
        .details
        .insert("policy".into(), Value::Object(details));
    Ok(())
}

/// One part of the phase.
type PartFn =
    fn(&mut Setup, &Workspace, &Params, &mut Report, &mut Map<String, Value>) -> Result<()>;

/// API write → the new verdict on both nodes.
fn enforcement(
    s: &mut Setup,
    _ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    eprintln!(
        "bench: policy: API write → enforced on both nodes, {} writes",
        p.writes
    );
    let mut pairs = Vec::new();
    for (cli, srv) in [("flip/cli-a", "flip/srv-a"), ("flip/cli-b", "flip/srv-b")] {
        pairs.push((
            s.netns(cli)?,
            s.addr(srv, ECHO_PORT)?,
            s.addr(srv, SHUT_PORT)?,
        ));
    }
    s.put("networkpolicies", flip_policy(true))?;
    wait_until("the first flip policy in force", IN_FORCE_DEADLINE, || {
        for (netns, open, shut) in &pairs {
            if probe(netns, *open, CHECK_WAIT)? != Seen::Open
                || probe(netns, *shut, CHECK_WAIT)? != Seen::Dropped
            {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    let mut took = Vec::with_capacity(p.writes);
    let mut missed = 0;
    for w in 0..p.writes {
        check_interrupt()?;
        // The first write closes what is open.
        let admit = w % 2 == 1;
        let written = Instant::now();
        s.put("networkpolicies", flip_policy(admit))?;
        let deadline = written + VERDICT_DEADLINE;
        let watchers: Vec<_> = pairs
            .iter()
            .map(|(netns, open, _)| await_verdict(netns, *open, admit, deadline))
            .collect();
        let mut last = Some(written);
        for h in watchers {
            last = match (last, proc::join(h)?) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        match last {
            Some(t) => took.push(ms(t.duration_since(written))),
            None => {
                missed += 1;
                took.push(ms(VERDICT_DEADLINE));
            }
        }
        std::thread::sleep(GAP);
    }
    if missed > 0 {
        report.notes.push(format!(
            "NetworkPolicy, API write → enforced: {missed} of {} writes showed no new verdict \
             on both nodes within {} s (counted as {} s)",
            p.writes,
            VERDICT_DEADLINE.as_secs(),
            VERDICT_DEADLINE.as_secs()
        ));
    }
    let sum = Summary::of(&took);
    let what = format!(
        "API write → new verdict on both nodes ({} writes, {POD_OBJECTS} Pod objects)",
        took.len()
    );
    for (key, label, v) in [
        ("p50", format!("{what}, p50"), sum.p50),
        ("p99", format!("{what}, p99"), sum.p99),
        ("max", format!("{what}, max"), sum.max),
    ] {
        report.put(
            &format!("policy.enforce.{key}"),
            SECTION,
            &label,
            "ms",
            false,
            COL,
            v,
        );
    }
    details.insert(
        "enforce".into(),
        json!({ "ms": took, "missed": missed, "summary": sum.json() }),
    );
    Ok(())
}

/// ADD → the new pod reaches its peer under default deny.
fn add_to_open(
    s: &mut Setup,
    ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    eprintln!(
        "bench: policy: ADD → in force under default deny, {} pods",
        p.adds
    );
    let ns = "newpods";
    for obj in [
        policy(
            ns,
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        ),
        policy(
            ns,
            "new-to-peer",
            json!({"podSelector": {"matchLabels": {"app": "new"}},
                   "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "peer"}}}],
                               "ports": tcp_port(ECHO_PORT)}]}),
        ),
        policy(
            ns,
            "peer-from-new",
            json!({"podSelector": {"matchLabels": {"app": "peer"}},
                   "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "new"}}}],
                                "ports": tcp_port(ECHO_PORT)}]}),
        ),
    ] {
        s.put("networkpolicies", obj)?;
    }
    // In force when a pod of another namespace (no policy selects it) no longer reaches
    // the peer.
    let peer = s.addr("newpods/peer", ECHO_PORT)?;
    let outsider = s.netns(&format!("{}/cli", PAIRS[0].ns))?;
    wait_until("the default deny in force", IN_FORCE_DEADLINE, || {
        Ok(probe(&outsider, peer, CHECK_WAIT)? == Seen::Dropped)
    })?;
    let mut open_ms = Vec::with_capacity(p.adds);
    let mut add_ms = Vec::with_capacity(p.adds);
    let mut missed = 0;
    for i in 0..p.adds {
        check_interrupt()?;
        let name = format!("new-{i}");
        let started = Instant::now();
        let (pod, ip) = add_pod(ws, s.cluster.a(), ns, &name)?;
        let added = started.elapsed();
        s.put("pods", pod_object(ns, &name, &[("app", "new")], &ip)?)?;
        let seen = proc::join(await_verdict(
            pod.netns(),
            peer,
            true,
            started + VERDICT_DEADLINE,
        ))?;
        s.pods.insert(format!("{ns}/{name}"), Real { pod, ip });
        add_ms.push(ms(added));
        match seen {
            Some(t) => open_ms.push(ms(t.duration_since(started))),
            None => {
                missed += 1;
                open_ms.push(ms(VERDICT_DEADLINE));
            }
        }
        std::thread::sleep(GAP);
    }
    if missed > 0 {
        report.notes.push(format!(
            "NetworkPolicy, ADD → in force: {missed} of {} pods never reached their peer \
             within {} s (counted as {} s)",
            p.adds,
            VERDICT_DEADLINE.as_secs(),
            VERDICT_DEADLINE.as_secs()
        ));
    }
    let open = Summary::of(&open_ms);
    let add = Summary::of(&add_ms);
    let what = format!(
        "ADD start → the new pod reaches its peer, default deny ({} pods)",
        open_ms.len()
    );
    for (key, label, v) in [
        ("p50", format!("{what}, p50"), open.p50),
        ("p99", format!("{what}, p99"), open.p99),
        (
            "add_p50",
            "of which the ADD itself, p50".to_owned(),
            add.p50,
        ),
    ] {
        report.put(
            &format!("policy.add_open.{key}"),
            SECTION,
            &label,
            "ms",
            false,
            COL,
            v,
        );
    }
    details.insert(
        "addToOpen".into(),
        json!({ "ms": open_ms, "addMs": add_ms, "missed": missed,
                "summary": open.json(), "add": add.json() }),
    );
    Ok(())
}

/// The policy maps' memory per endpoint and per rule, on node B.
fn memory(
    s: &mut Setup,
    ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    eprintln!(
        "bench: policy: memory of the policy maps, {} endpoints, {:?} rules",
        p.endpoints, RULES
    );
    let node = s.cluster.b();
    // Any pod of node B: inspect's pod filter keeps its output small.
    let small = ["--pod", "flip/cli-b"];
    let namespaces = |m: &PolicyMemory| {
        m.per_map
            .get(map::POLICY_NAMESPACES)
            .and_then(|v| v["entries"].as_u64())
    };
    let marked = namespaces(&PolicyMemory::of(&inspect(ws, node, &small)?));
    s.put(
        "networkpolicies",
        policy(
            "mem",
            "base",
            json!({"podSelector": {"matchLabels": {"app": "mem"}},
                   "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
                                "ports": tcp_port(80)}]}),
        ),
    )?;
    // Pods ADDed once the agent has marked namespace `mem` as holding a policy start
    // closed, then get the policy's rule set.
    wait_until(
        "namespace mem marked as holding a policy",
        IN_FORCE_DEADLINE,
        || {
            let now = namespaces(&PolicyMemory::of(&inspect(ws, node, &small)?));
            Ok(now > marked)
        },
    )?;
    let base = settled_memory(ws, node, &small)?;
    for i in 0..p.endpoints {
        check_interrupt()?;
        let (ns, name, idx) = ("mem", format!("mem-{i}"), i.to_string());
        let (pod, ip) = add_pod(ws, node, ns, &name)?;
        put(
            &s.api,
            "pods",
            pod_object(ns, &name, &[("app", "mem"), ("idx", &idx)], &ip)?,
        )?;
        s.pods.insert(format!("{ns}/{name}"), Real { pod, ip });
    }
    let n = p.endpoints;
    wait_until(
        "the endpoints' rule sets in force",
        IN_FORCE_DEADLINE,
        || {
            let doc = inspect(ws, node, &["--namespace", "mem"])?;
            let with_rules = doc["policy"]["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| {
                    e["ingress"]
                        .as_str()
                        .is_some_and(|r| r.starts_with("rules"))
                })
                .count();
            Ok(with_rules >= n)
        },
    )?;
    let with_endpoints = settled_memory(ws, node, &small)?;
    let mut with_rules = Vec::new();
    for rules in RULES {
        check_interrupt()?;
        let peers_before = with_endpoints.peers;
        s.put("networkpolicies", rules_policy(rules))?;
        wait_until(
            &format!("the policy of {rules} rules in force"),
            IN_FORCE_DEADLINE,
            || {
                let m = PolicyMemory::of(&inspect(ws, node, &small)?);
                Ok(m.peers >= peers_before + rules as u64)
            },
        )?;
        with_rules.push(settled_memory(ws, node, &small)?);
    }
    let per = |a: u64, b: u64, n: usize| b.saturating_sub(a) as f64 / n.max(1) as f64;
    report.put(
        "policy.mem.start",
        SECTION,
        "policy maps memlock before the measured pods and rules (hash maps, LRU and \
         array preallocated)",
        "MiB",
        false,
        COL,
        base.memlock as f64 / 1_048_576.0,
    );
    let rows = [
        (
            "endpoint.memlock",
            format!("policy maps memlock growth per endpoint ({n} pods, one-rule policy)"),
            per(base.memlock, with_endpoints.memlock, n),
        ),
        (
            "endpoint.entries",
            "policy map entry bytes per endpoint".to_owned(),
            per(base.live, with_endpoints.live, n),
        ),
    ];
    // What each pod's entries take in the preallocated POLICY_ENDPOINTS (two slots per
    // pod): charged at load for every pod the node could have, whether it has it or not.
    let endpoints_map = with_endpoints.per_map.get(map::POLICY_ENDPOINTS);
    let capacity = endpoints_map
        .and_then(|m| m["maxEntries"].as_u64())
        .unwrap_or(0)
        / 2;
    let prealloc = endpoints_map.and_then(|m| m["bytesMemlock"].as_u64());
    let rows = rows.into_iter().chain(prealloc.filter(|_| capacity > 0).map(|bytes| {
        (
            "endpoint.prealloc",
            format!(
                "POLICY_ENDPOINTS memlock per pod it has room for (preallocated for {capacity} pods)"
            ),
            bytes as f64 / capacity as f64,
        )
    }));
    for (key, label, v) in rows {
        report.put(
            &format!("policy.mem.{key}"),
            SECTION,
            &label,
            "bytes",
            false,
            COL,
            v,
        );
    }
    if let [small_set, large_set] = with_rules.as_slice() {
        let added = RULES[1] - RULES[0];
        let rows = [
            (
                "rule.memlock",
                format!(
                    "policy maps memlock growth per rule ({} → {} ingress rules, one \
                     address and one port each)",
                    RULES[0], RULES[1]
                ),
                per(small_set.memlock, large_set.memlock, added),
            ),
            (
                "rule.entries",
                "policy map entry bytes per rule".to_owned(),
                per(small_set.live, large_set.live, added),
            ),
        ];
        for (key, label, v) in rows {
            report.put(
                &format!("policy.mem.{key}"),
                SECTION,
                &label,
                "bytes",
                false,
                COL,
                v,
            );
        }
    }
    let mut rules_json = Map::new();
    for (rules, m) in RULES.iter().zip(&with_rules) {
        rules_json.insert(rules.to_string(), m.json());
    }
    details.insert(
        "memory".into(),
        json!({ "node": node.name(), "start": base.json(),
                "endpoints": { "count": n, "maps": with_endpoints.json() },
                "rules": rules_json }),
    );
    Ok(())
}

/// Request/response and connect/request/close with 0, 1, 100 and 1 000 policies.
fn rates(
    s: &mut Setup,
    _ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    let total: usize = PAIRS.iter().map(|p| p.policies + p.cluster).sum();
    eprintln!("bench: policy: publishing {total} policies for the data-path figures");
    let published = Instant::now();
    for pair in &PAIRS {
        if pair.policies > 0 {
            s.put("networkpolicies", admitting(pair.ns))?;
        }
        for i in 1..pair.policies {
            s.put("networkpolicies", decoy(pair.ns, i))?;
        }
        for i in 0..pair.cluster {
            s.put(
                "clusternetworkpolicies",
                cluster_decoy(pair.ns, i, pair.cluster),
            )?;
        }
    }
    let mut pairs = Vec::new();
    for pair in &PAIRS {
        let srv = format!("{}/srv", pair.ns);
        pairs.push((
            pair.policies + pair.cluster,
            pair.column,
            s.netns(&format!("{}/cli", pair.ns))?,
            s.addr(&srv, ECHO_PORT)?,
            s.addr(&srv, SHUT_PORT)?,
            s.real(&srv)?.ip.clone(),
        ));
    }
    wait_until(
        &format!("{total} policies in force"),
        IN_FORCE_DEADLINE,
        || {
            for (n, _, netns, open, shut, _) in &pairs {
                let closed = if *n == 0 {
                    Seen::Refused
                } else {
                    Seen::Dropped
                };
                if probe(netns, *open, CHECK_WAIT)? != Seen::Open
                    || probe(netns, *shut, CHECK_WAIT)? != closed
                {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )?;
    let in_force = published.elapsed();
    eprintln!(
        "bench: policy: {total} policies in force {:.1} s after the first was published",
        in_force.as_secs_f64()
    );
    report.put(
        "policy.bulk_in_force",
        SECTION,
        &format!("{total} policies published at once → in force (checked by probes every 0.2 s)"),
        "s",
        false,
        COL,
        in_force.as_secs_f64(),
    );
    let mut samples: Samples = BTreeMap::new();
    let title = "pod → pod (same node) with NetworkPolicies";
    for rep in 0..p.repeats {
        check_interrupt()?;
        eprintln!("bench: policy repeat {}/{}: {title}", rep + 1, p.repeats);
        let targets = pairs
            .iter()
            .map(|(_, column, netns, _, _, ip)| Target {
                column,
                client: netns.clone(),
                ip: ip.clone(),
                iperf_port: None,
                echo_port: ECHO_PORT,
            })
            .collect();
        data::measure_repeat(
            "pod2pod",
            title,
            targets,
            rep,
            p.seconds,
            &mut samples,
            &mut report.notes,
        )?;
    }
    for (metric, what, unit) in [
        ("rr_tps", "request/response", "transactions/s"),
        ("crr_cps", "connect/request/close", "connections/s"),
    ] {
        let Some(cols) = samples.get("pod2pod").and_then(|m| m.get(metric)) else {
            continue;
        };
        let Some(none) = cols.get(PAIRS[0].column) else {
            continue;
        };
        report.put(
            &format!("policy.{metric}.0"),
            SECTION,
            &format!(
                "pod → pod {what}, no policy (median of {} repeats)",
                none.len()
            ),
            unit,
            true,
            COL,
            median(none),
        );
        for Pair { column, key, .. } in &PAIRS[1..] {
            let Some(with) = cols.get(*column) else {
                continue;
            };
            if with.len() != none.len() {
                report.notes.push(format!(
                    "NetworkPolicy, {what} with {column}: {} of {} repeats measured; no ratio",
                    with.len(),
                    none.len()
                ));
                continue;
            }
            let ratios: Vec<f64> = with
                .iter()
                .zip(none)
                .filter(|(_, b)| **b > 0.0)
                .map(|(a, b)| a / b)
                .collect();
            report.put(
                &format!("policy.{metric}.ratio.{key}"),
                SECTION,
                &format!("{what} with {column} selecting both pods ÷ with none"),
                "×",
                true,
                COL,
                median(&ratios),
            );
        }
    }
    details.insert(
        "rates".into(),
        json!({ "perRepeat": samples, "inForceSeconds": in_force.as_secs_f64() }),
    );
    Ok(())
}

/// The ClusterIPs of the part through a ClusterIP: `(namespace, node, ClusterIP)`; each
/// Service's endpoint is `<namespace>/srv-<node>`'s echo port.
const SERVICES: [(&str, &str, &str); 4] = [
    ("svc", "a", "10.96.7.1"),
    ("svcnp", "a", "10.96.7.2"),
    ("svc", "b", "10.96.7.3"),
    ("svcnp", "b", "10.96.7.4"),
];

/// Request/response and connect/request/close through a ClusterIP, kube-proxy's
/// iptables rules on node A and nftables rules on node B, with the client's namespace
/// under `default-deny-ingress` ÷ without policies.
fn through_cluster_ip(
    s: &mut Setup,
    _ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    use testbed::kubeproxy::{Mode, Protocol, ServicePort};

    let mut ports = Vec::new();
    for (ns, node, ip) in SERVICES {
        let ep = s.addr(&format!("{ns}/srv-{node}"), ECHO_PORT)?.to_string();
        let name = if node == "a" { "node-a" } else { "node-b" };
        ports.push(
            ServicePort::new(
                &format!("{ns}/echo-{node}"),
                "echo",
                Protocol::Tcp,
                ip,
                ECHO_PORT,
            )
            .endpoint(&ep, name),
        );
    }
    catch("loading kube-proxy's rules", || {
        s.cluster.a().install_kube_proxy(Mode::Iptables, &ports);
        s.cluster.b().install_kube_proxy(Mode::Nftables, &ports);
    })?;
    s.put(
        "networkpolicies",
        policy(
            "svcnp",
            "default-deny-ingress",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        ),
    )?;
    s.put(
        "networkpolicies",
        policy(
            "svcnp",
            "admit-cli",
            json!({
                "podSelector": {"matchLabels": {"app": "srv"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                             "ports": tcp_port(ECHO_PORT)}],
            }),
        ),
    )?;
    let mut targets = Vec::new();
    for (ns, node, ip) in SERVICES {
        let column: &'static str = match (ns, node) {
            ("svc", "a") => "iptables, no policy",
            ("svcnp", "a") => "iptables, default-deny-ingress",
            ("svc", _) => "nftables, no policy",
            _ => "nftables, default-deny-ingress",
        };
        targets.push((
            column,
            s.netns(&format!("{ns}/cli-{node}"))?,
            s.netns(&format!("{ns}/srv-{node}"))?,
            s.addr(&format!("{ns}/cli-{node}"), SHUT_PORT)?,
            SocketAddr::new(ip.parse()?, ECHO_PORT),
            ns == "svcnp",
        ));
    }
    // In force: every client reaches its ClusterIP; the server's connection to the
    // client is refused (no listener) without policies and dropped under them.
    wait_until(
        "the ClusterIP pairs' policies in force",
        IN_FORCE_DEADLINE,
        || {
            for (_, cli, srv, cli_addr, vip, policed) in &targets {
                let closed = if *policed {
                    Seen::Dropped
                } else {
                    Seen::Refused
                };
                if probe(cli, *vip, CHECK_WAIT)? != Seen::Open
                    || probe(srv, *cli_addr, CHECK_WAIT)? != closed
                {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )?;
    let mut samples: Samples = BTreeMap::new();
    let title = "pod → ClusterIP → pod (same node), kube-proxy";
    for rep in 0..p.repeats {
        check_interrupt()?;
        eprintln!("bench: policy repeat {}/{}: {title}", rep + 1, p.repeats);
        let t = targets
            .iter()
            .map(|(column, cli, _, _, vip, _)| Target {
                column,
                client: cli.clone(),
                ip: vip.ip().to_string(),
                iperf_port: None,
                echo_port: ECHO_PORT,
            })
            .collect();
        data::measure_repeat(
            "clusterip",
            title,
            t,
            rep,
            p.seconds,
            &mut samples,
            &mut report.notes,
        )?;
    }
    for (metric, what, unit) in [
        ("rr_tps", "request/response", "transactions/s"),
        ("crr_cps", "connect/request/close", "connections/s"),
    ] {
        let Some(cols) = samples.get("clusterip").and_then(|m| m.get(metric)) else {
            continue;
        };
        for mode in ["iptables", "nftables"] {
            let (Some(none), Some(with)) = (
                cols.get(&format!("{mode}, no policy") as &str),
                cols.get(&format!("{mode}, default-deny-ingress") as &str),
            ) else {
                continue;
            };
            report.put(
                &format!("policy.clusterip.{mode}.{metric}.0"),
                SECTION,
                &format!("pod → ClusterIP → pod {what}, kube-proxy {mode}, no policy (median)"),
                unit,
                true,
                COL,
                median(none),
            );
            if with.len() != none.len() {
                report.notes.push(format!(
                    "NetworkPolicy through a ClusterIP, {mode} {what}: {} of {} repeats measured; no ratio",
                    with.len(),
                    none.len()
                ));
                continue;
            }
            let ratios: Vec<f64> = with
                .iter()
                .zip(none)
                .filter(|(_, b)| **b > 0.0)
                .map(|(a, b)| a / b)
                .collect();
            report.put(
                &format!("policy.clusterip.{mode}.{metric}.ratio"),
                SECTION,
                &format!(
                    "pod → ClusterIP → pod {what}, kube-proxy {mode}, client under default-deny-ingress ÷ no policy"
                ),
                "×",
                true,
                COL,
                median(&ratios),
            );
        }
    }
    details.insert("clusterIp".into(), json!({ "perRepeat": samples }));
    Ok(())
}

/// The name the DNS part's client asks for, and what it resolves to.
const DNS_NAME: &str = "bench.example.com";

/// A DNS query (id `id`, recursion desired) for an A record of [`DNS_NAME`].
fn dns_query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in DNS_NAME.split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(0));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// DNS questions asked one after the other from `netns` of `server` for `seconds`, each
/// waiting for its answer: answers per second.
fn dns_rate(netns: &Path, server: SocketAddr, seconds: f64) -> Result<f64> {
    let netns = netns.to_path_buf();
    let run = move || -> std::io::Result<f64> {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
        sock.connect(server)?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = [0u8; 512];
        let (start, mut answered) = (Instant::now(), 0u64);
        let mut id = 0u16;
        while start.elapsed().as_secs_f64() < seconds {
            id = id.wrapping_add(1);
            sock.send(&dns_query(id))?;
            if matches!(sock.recv(&mut buf), Ok(n) if n > 12 && buf[..2] == id.to_be_bytes()) {
                answered += 1;
            }
        }
        Ok(answered as f64 / start.elapsed().as_secs_f64())
    };
    testbed::net::in_netns(&netns, run).context("asking the DNS server")
}

/// What reading DNS answers costs a pod whose egress rules name domains: DNS questions
/// asked one after the other of a DNS server pod on the same node, answered with an A
/// record, from a client whose Admin cluster policy names the domain (every answer read
/// in the datapath, its address learned) and from one no policy selects, taking turns in
/// each repeat; the rate with ÷ without, median over repeats.
fn dns_answers(
    s: &mut Setup,
    ws: &Workspace,
    p: &Params,
    report: &mut Report,
    details: &mut Map<String, Value>,
) -> Result<()> {
    s.put("namespaces", namespace_object("dns", &[("ns", "dns")])?)?;
    s.add(ws, On::A, "dns", "server", &[("app", "dns-server")])?;
    s.add(ws, On::A, "dns", "named", &[("app", "named")])?;
    s.add(ws, On::A, "dns", "plain", &[("app", "plain")])?;
    let dns = testbed::dns::DnsServer::start(&s.netns("dns/server")?);
    dns.set(
        DNS_NAME,
        vec![testbed::dns::Record::Addr(
            IpAddr::from([203, 0, 113, 10]),
            300,
        )],
    );
    let before = generation(s.cluster.a())?;
    s.put(
        "clusternetworkpolicies",
        json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "bench-by-name"},
            "spec": {
                "tier": "Admin",
                "priority": 1,
                "subject": {"pods": {"namespaceSelector": {"matchLabels": {"ns": "dns"}},
                                     "podSelector": {"matchLabels": {"app": "named"}}}},
                "egress": [
                    {"action": "Accept", "to": [{"domainNames": [DNS_NAME]}]},
                    {"action": "Accept",
                     "to": [{"pods": {"namespaceSelector": {"matchLabels": {"ns": "dns"}},
                                      "podSelector": {"matchLabels": {"app": "dns-server"}}}}],
                     "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                ],
            },
        }),
    )?;
    let server = s.addr("dns/server", 53)?;
    let (named, plain) = (s.netns("dns/named")?, s.netns("dns/plain")?);
    wait_until("the domain rule in force", VERDICT_DEADLINE, || {
        Ok(generation(s.cluster.a())? > before && dns_rate(&named, server, 0.05)? > 0.0)
    })?;
    // The pods' own rounds may have bumped the generation first: one more round's time.
    std::thread::sleep(Duration::from_secs(1));
    let mut ratios = Vec::new();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for rep in 0..p.repeats {
        check_interrupt()?;
        eprintln!(
            "bench: policy repeat {}/{}: DNS answers",
            rep + 1,
            p.repeats
        );
        let (w, wo) = if rep % 2 == 0 {
            let w = dns_rate(&named, server, p.seconds)?;
            (w, dns_rate(&plain, server, p.seconds)?)
        } else {
            let wo = dns_rate(&plain, server, p.seconds)?;
            (dns_rate(&named, server, p.seconds)?, wo)
        };
        with.push(w);
        without.push(wo);
        if wo > 0.0 {
            ratios.push(w / wo);
        }
    }
    let (w, wo) = (
        crate::report::median(&with),
        crate::report::median(&without),
    );
    for (key, label, v) in [
        ("policy.dns.without", "DNS answers/s, the client's rules name no domain", wo),
        ("policy.dns.with", "DNS answers/s, the client's rules name the domain (each answer read, its address learned)", w),
    ] {
        report.put(key, SECTION, label, "/s", true, COL, v);
    }
    report.put(
        "policy.dns.ratio",
        SECTION,
        "DNS answers/s with domain rules ÷ without (same repeat, median)",
        "×",
        true,
        COL,
        crate::report::median(&ratios),
    );
    details.insert(
        "dnsAnswers".into(),
        json!({"with": with, "without": without}),
    );
    Ok(())
}
