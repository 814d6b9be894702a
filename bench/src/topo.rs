//! The bench's simulated nodes: a `node` namespace (where the plugins run) joined to an
//! `ext` namespace (the outside world, 198.18.0.0/24) by `testbed::NodeNamespaces` (the tests' node plan), with its own pin
//! root, IPAM/data dir, libcni cache and `CNI_PATH` directory, and pod namespaces. Two
//! flavours of node run the same operations:
//!
//! - [`Variant::Ebpf`]: a conflist with cni-ebpf alone (`ipMasq`, host ports in eBPF);
//! - [`Variant::Reference`]: Debian's `bridge` (`isGateway`, `ipMasq`, host-local IPAM)
//!   followed by `portmap` (iptables DNAT/SNAT), as clusters run them today.
//!
//! Both at cniVersion 1.0.0 (the newest libcni 1.1.2 speaks) on the same IPv4 /16, so the
//! results compare like for like. Operations go through the libcni client or are executed
//! directly the way libcni would (each plugin of the chain in turn, `prevResult` passed on,
//! DEL in reverse order) — the direct path leaves out the client's own start-up cost.
//! The libcni client runs two ways: one process per operation ([`Via::Libcni`]), and as
//! runtimes run libcni, inside one long-lived process that loaded the conflist once
//! ([`Via::Embedded`]: containerd's go-cni and CRI-O's ocicni call libcni from their
//! daemon, so a pod's ADD never starts a Go program).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::proc::{self, Exec, Session, Spec};
use testbed::{NetNs, NodeNamespaces};

/// The pod subnet (both variants; a /16 so that 1 000+ pods fit).
pub const POD_SUBNET: &str = "10.244.0.0/16";
/// The IPv6 pod subnet of dual-stack nodes ([`BenchNode::create_dual_stack`]).
pub const POD_SUBNET6: &str = "fd00:10:244:1::/64";
/// The IPv6 cluster CIDR of dual-stack nodes.
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/48";
/// The node's IPv6 address on its uplink.
pub const NODE_IP6: &str = testbed::NODE_IP6;
/// The `ext` namespace's IPv6 address.
pub const EXT_IP6: &str = testbed::EXT_IP6;
/// The node's address on its uplink (the tests' node plan).
pub const NODE_IP: &str = testbed::NODE_IP4;
/// The `ext` namespace's address.
pub const EXT_IP: &str = testbed::EXT_IP4;
/// Bound for one plugin or client invocation.
pub const OP_TIMEOUT: Duration = Duration::from_secs(60);

/// Which plugin configuration a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// cni-ebpf.
    Ebpf,
    /// bridge + host-local + portmap.
    Reference,
}

impl Variant {
    /// Key used in tables and JSON.
    pub fn key(self) -> &'static str {
        match self {
            Self::Ebpf => "cni-ebpf",
            Self::Reference => "reference",
        }
    }

    /// The network name of its configuration.
    pub fn network(self) -> &'static str {
        match self {
            Self::Ebpf => "benchnet",
            Self::Reference => "refnet",
        }
    }

    /// Short tag for namespace names.
    fn tag(self) -> &'static str {
        match self {
            Self::Ebpf => "e",
            Self::Reference => "r",
        }
    }
}

/// How an operation reaches the plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The Go libcni client (a real runtime library), one process per operation.
    Libcni,
    /// The same libcni in one long-lived client per worker (`libcni-client serve`), as a
    /// runtime embeds it.
    Embedded,
    /// Executing each plugin ourselves, like libcni does.
    Direct,
}

impl Via {
    /// Key used in tables and JSON.
    pub fn key(self) -> &'static str {
        match self {
            Self::Libcni => "libcni",
            Self::Embedded => "embedded",
            Self::Direct => "direct",
        }
    }
}

/// One TCP host port mapping.
#[derive(Debug, Clone, Copy)]
pub struct PortMap {
    /// On the node.
    pub host: u16,
    /// In the pod.
    pub container: u16,
}

/// The `portMappings` capability argument.
pub fn port_mappings(ports: &[PortMap]) -> Value {
    Value::Array(
        ports
            .iter()
            .map(|p| json!({ "hostPort": p.host, "containerPort": p.container, "protocol": "tcp" }))
            .collect(),
    )
}

/// Where the bench's files and names live: one run tag (`cebb<pid>`), a temp dir and a pin
/// root, both removed on drop. A tag of a dead earlier run is swept at start.
pub struct Workspace {
    /// Prefix of every name the run creates.
    pub tag: String,
    /// Temp dir of the run.
    pub tmp: PathBuf,
    /// The plugin binary.
    pub plugin: PathBuf,
    /// The libcni client binary.
    pub client: PathBuf,
    /// Log level given to cni-ebpf.
    pub log_level: String,
    /// `attach` given to cni-ebpf (`None`: its default).
    pub attach: Option<String>,
}

impl Workspace {
    /// Creates the temp dir (and sweeps what a killed earlier run left).
    pub fn create(plugin: &Path, client: &Path, log_level: &str) -> Result<Self> {
        sweep_stale();
        let tag = format!("cebb{}", std::process::id());
        let tmp = std::env::temp_dir().join(&tag);
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            tag,
            tmp,
            plugin: plugin.to_path_buf(),
            client: client.to_path_buf(),
            log_level: log_level.to_owned(),
            attach: None,
        })
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Removes namespaces, pins and temp dirs of earlier bench runs whose process is gone
/// (killed with SIGKILL, so their guards never ran). Only our names are considered: those
/// that start with `cebb<pid>` (the bench's own) or hold `-cebb-<pid>-` (the tests crate's
/// cluster of the Service phase: `node-cebb-<pid>-<n>-a`, `cni-ebpf-test-cebb-<pid>-…`).
fn sweep_stale() {
    let dead = |name: &str| -> bool {
        let rest = if let Some(rest) = name.strip_prefix("cebb") {
            rest
        } else if let Some((_, rest)) = name.split_once("-cebb-") {
            rest
        } else {
            return false;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        !digits.is_empty()
            && rest[digits.len()..].chars().next().is_none_or(|c| c == '-')
            && !Path::new("/proc").join(&digits).exists()
    };
    for (dir, is_netns) in [
        (PathBuf::from("/run/netns"), true),
        (PathBuf::from("/sys/fs/bpf"), false),
        (std::env::temp_dir(), false),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !dead(&name) {
                continue;
            }
            if is_netns {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &name])
                    .status();
            } else {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A pod: a network namespace (removed on drop) and its container ID.
pub struct Pod {
    /// Its namespace.
    pub netns: NetNs,
    /// `CNI_CONTAINERID`.
    pub id: String,
}

impl Pod {
    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        self.netns.path().to_path_buf()
    }
}

/// The outcome of one verb on one pod (the whole chain).
#[derive(Debug, Clone, Default)]
pub struct Op {
    /// Wall time of the verb (sum over the chain's plugins on the direct path).
    pub wall: Duration,
    /// CPU time of the verb's processes, user and system (direct path; zero otherwise).
    pub cpu: Duration,
    /// Page faults of the verb's processes (direct path; zero otherwise).
    pub faults: u64,
    /// System calls of the verb's processes, counted by `strace -c` (traced runs only).
    pub syscalls: u64,
    /// Peak RSS of any process of the verb, KiB.
    pub maxrss_kib: u64,
    /// The final result (ADD), else `Null`.
    pub result: Value,
}

/// A simulated node running one [`Variant`].
pub struct BenchNode {
    /// What it runs.
    pub variant: Variant,
    /// node + ext namespaces.
    pub sim: NodeNamespaces,
    /// Short label, unique in the run.
    pub label: String,
    tag: String,
    dir: PathBuf,
    pins: PathBuf,
    plugin: PathBuf,
    client: PathBuf,
    log_level: String,
    attach: Option<String>,
    portmap_check_bug: AtomicBool,
    /// Pods get an IPv6 address too ([`POD_SUBNET6`]).
    dual_stack: bool,
    /// Idle long-lived libcni clients ([`Via::Embedded`]); a worker takes one per
    /// operation and puts it back.
    sessions: Mutex<Vec<Session>>,
}

impl Drop for BenchNode {
    fn drop(&mut self) {
        // Pins first (detaches the tcx links), the namespaces when `sim` drops.
        let _ = std::fs::remove_dir_all(&self.pins);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl BenchNode {
    /// Builds node + ext for `variant`; `label` makes names unique within the run.
    pub fn create(ws: &Workspace, variant: Variant, label: &str) -> Result<Self> {
        Self::build(ws, variant, label, false)
    }

    /// [`Self::create`] with dual-stack pods: an IPv6 address from [`POD_SUBNET6`] too,
    /// IPv6 masquerade and host ports (the reference chain: `bridge` and `portmap` with
    /// ip6tables).
    pub fn create_dual_stack(ws: &Workspace, variant: Variant, label: &str) -> Result<Self> {
        Self::build(ws, variant, label, true)
    }

    fn build(ws: &Workspace, variant: Variant, label: &str, dual_stack: bool) -> Result<Self> {
        let label = format!("{}{label}", variant.tag());
        let sim = NodeNamespaces::create(&format!("{}-{label}", ws.tag))?;
        let dir = ws.tmp.join(&label);
        let node = Self {
            variant,
            sim,
            pins: Path::new("/sys/fs/bpf").join(format!("{}-{label}", ws.tag)),
            tag: ws.tag.clone(),
            dir,
            label,
            plugin: ws.plugin.clone(),
            client: ws.client.clone(),
            log_level: ws.log_level.clone(),
            attach: ws.attach.clone(),
            portmap_check_bug: AtomicBool::new(false),
            dual_stack,
            sessions: Mutex::new(Vec::new()),
        };
        for sub in ["data", "cache", "cni-bin", "ipam"] {
            std::fs::create_dir_all(node.dir.join(sub))?;
        }
        fill_cni_bin(&node.dir.join("cni-bin"), &node.plugin)?;
        std::fs::write(
            node.conflist_path(),
            serde_json::to_vec_pretty(&node.conflist())?,
        )?;
        // Clients in this namespace may open many short connections.
        for (k, v) in [
            ("net.ipv4.tcp_tw_reuse", "1"),
            ("net.ipv4.ip_local_port_range", "1024 65000"),
        ] {
            for ns in [&node.sim.node, &node.sim.ext] {
                ns.sh(&["sysctl", "-q", "-w", &format!("{k}={v}")])?;
            }
        }
        Ok(node)
    }

    /// The node namespace path.
    pub fn netns(&self) -> PathBuf {
        self.sim.node.path().to_path_buf()
    }

    /// The ext namespace path.
    pub fn ext_netns(&self) -> PathBuf {
        self.sim.ext.path().to_path_buf()
    }

    /// The cni-ebpf binary.
    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    /// The pin root given to cni-ebpf.
    pub fn pin_root(&self) -> &Path {
        &self.pins
    }

    /// The network name.
    pub fn network(&self) -> &'static str {
        self.variant.network()
    }

    fn conflist_path(&self) -> PathBuf {
        self.dir.join("conflist.json")
    }

    /// The plugin objects of the conflist.
    fn plugins(&self) -> Vec<Value> {
        match self.variant {
            Variant::Ebpf => vec![ebpf_plugin(&EbpfConf {
                cgroup: None,
                subnet: POD_SUBNET,
                cluster_cidr: POD_SUBNET,
                v6: self.dual_stack.then_some((POD_SUBNET6, CLUSTER_CIDR6)),
                pins: &self.pins,
                data_dir: &self.dir.join("data"),
                log_file: &self.dir.join("cni-ebpf.log"),
                log_level: &self.log_level,
                attach: self.attach.as_deref(),
            })],
            Variant::Reference => reference_plugins(
                POD_SUBNET,
                self.dual_stack.then_some(POD_SUBNET6),
                &self.dir.join("ipam"),
            ),
        }
    }

    /// The direct-exec view of this node's chain with a pod egress rate (bits/s, bits):
    /// cni-ebpf takes it as `runtimeConfig.bandwidth`; the reference chain gets the
    /// reference `bandwidth` plugin appended (its static form: tbf behind an ifb).
    pub fn bandwidth_chain(&self, rate: u64, burst: u64) -> Chain<'_> {
        let bw = json!({ "egressRate": rate, "egressBurst": burst });
        let mut plugins = self.plugins();
        match self.variant {
            Variant::Ebpf => {
                if let Some(obj) = plugins.first_mut().and_then(Value::as_object_mut) {
                    obj.insert("runtimeConfig".into(), json!({ "bandwidth": bw }));
                }
            }
            Variant::Reference => {
                let mut b = json!({ "type": "bandwidth" });
                if let (Some(o), Some(src)) = (b.as_object_mut(), bw.as_object()) {
                    o.extend(src.clone());
                }
                plugins.push(b);
            }
        }
        Chain {
            network: self.network(),
            plugins,
            node_netns: self.sim.node.path().to_path_buf(),
            cni_path: self.dir.join("cni-bin"),
            cni_args: None,
            trace_dir: None,
        }
    }

    /// The direct-exec view of this node's chain.
    fn chain(&self) -> Chain<'_> {
        Chain {
            network: self.network(),
            plugins: self.plugins(),
            node_netns: self.sim.node.path().to_path_buf(),
            cni_path: self.dir.join("cni-bin"),
            cni_args: None,
            trace_dir: None,
        }
    }

    /// `verb` of `pod` by direct exec under `strace -c` ([`Op::syscalls`]), the plain pod
    /// way (no host port).
    pub fn traced(&self, verb: &str, pod: &Pod, prev: Option<&Value>) -> Result<Op> {
        let chain = Chain {
            trace_dir: Some(self.dir.clone()),
            ..self.chain()
        };
        chain.exec(verb, &pod.id, &pod.path(), &[], prev, |what, out| {
            self.expect_ok(what, pod, out)
        })
    }

    /// The conflist (cniVersion 1.0.0).
    pub fn conflist(&self) -> Value {
        json!({ "cniVersion": "1.0.0", "name": self.network(), "plugins": self.plugins() })
    }

    /// Creates pod namespace number `i` (name unique in the run).
    pub fn pod(&self, i: usize) -> Result<Pod> {
        let id = format!("{}-{}-p{i}", self.tag, self.label);
        Ok(Pod {
            netns: NetNs::create_replacing(&id)?,
            id,
        })
    }

    /// Runs a verb on `pod` through `path`. `prev` is the ADD result (CHECK, DEL).
    pub fn op(
        &self,
        verb: &str,
        path: Via,
        pod: &Pod,
        ports: &[PortMap],
        prev: Option<&Value>,
    ) -> Result<Op> {
        match path {
            Via::Libcni => self.libcni(verb, pod, ports),
            Via::Embedded => self.embedded(verb, pod, ports),
            Via::Direct => self.direct(verb, pod, ports, prev),
        }
    }

    /// Starts long-lived libcni clients until `n` are idle, each warmed by an ADD and a DEL
    /// of `warm` (a runtime has run pods before the ones measured).
    pub fn start_sessions(&self, n: usize, warm: &Pod) -> Result<()> {
        let mut started = Vec::new();
        let idle = self.sessions.lock().map(|g| g.len()).unwrap_or(0);
        for _ in idle..n {
            let mut s = self.new_session()?;
            for verb in ["ADD", "DEL"] {
                self.request(&mut s, verb, warm, &[])?;
            }
            started.push(s);
        }
        if let Ok(mut g) = self.sessions.lock() {
            g.extend(started);
        }
        Ok(())
    }

    /// A long-lived libcni client in the node namespace.
    fn new_session(&self) -> Result<Session> {
        Session::spawn(
            &self.netns(),
            &[self.client.as_os_str(), OsStr::new("serve")],
        )
    }

    fn embedded(&self, verb: &str, pod: &Pod, ports: &[PortMap]) -> Result<Op> {
        let idle = self.sessions.lock().ok().and_then(|mut g| g.pop());
        let mut session = match idle {
            Some(s) => s,
            None => self.new_session()?,
        };
        // A session that failed a request is dropped (killed), not put back.
        let op = self.request(&mut session, verb, pod, ports)?;
        if let Ok(mut g) = self.sessions.lock() {
            g.push(session);
        }
        Ok(op)
    }

    /// One operation through a long-lived client, timed from the request's write until its
    /// answer was read.
    fn request(&self, s: &mut Session, verb: &str, pod: &Pod, ports: &[PortMap]) -> Result<Op> {
        let req = json!({
            "verb": verb.to_ascii_lowercase(),
            "conflist": self.conflist_path(),
            "netns": pod.path(),
            "id": pod.id,
            "ifname": "eth0",
            "cniPath": self.dir.join("cni-bin"),
            "cacheDir": self.dir.join("cache"),
            "capArgs": { "portMappings": port_mappings(ports) },
        });
        let (line, wall) = s.request(&req.to_string(), OP_TIMEOUT)?;
        let answer: Value = serde_json::from_str(&line)
            .with_context(|| format!("the libcni client answered {line:?}"))?;
        if answer["ok"] != json!(true) && !self.known_failure_text(verb, &line) {
            bail!(
                "{} {verb} of {} failed: {}",
                self.variant.key(),
                pod.id,
                answer["error"]
            );
        }
        Ok(Op {
            wall,
            result: answer["result"].clone(),
            ..Op::default()
        })
    }

    fn libcni(&self, verb: &str, pod: &Pod, ports: &[PortMap]) -> Result<Op> {
        let conflist = self.conflist_path();
        let netns = pod.path();
        let cni_path = self.dir.join("cni-bin");
        let cache = self.dir.join("cache");
        let caps = json!({ "portMappings": port_mappings(ports) }).to_string();
        let verb_l = verb.to_ascii_lowercase();
        let argv: Vec<&OsStr> = vec![
            self.client.as_os_str(),
            OsStr::new(&verb_l),
            OsStr::new("--conflist"),
            conflist.as_os_str(),
            OsStr::new("--netns"),
            netns.as_os_str(),
            OsStr::new("--id"),
            OsStr::new(&pod.id),
            OsStr::new("--cni-path"),
            cni_path.as_os_str(),
            OsStr::new("--cache-dir"),
            cache.as_os_str(),
            OsStr::new("--cap-args"),
            OsStr::new(&caps),
        ];
        let node = self.netns();
        let out = proc::exec(&Spec {
            argv,
            env: Vec::new(),
            netns: Some(&node),
            stdin: b"",
            timeout: OP_TIMEOUT,
        })?;
        self.expect_ok(verb, pod, &out)?;
        Ok(Op {
            wall: out.wall,
            maxrss_kib: out.maxrss_kib,
            result: parse_result(&out.stdout),
            ..Op::default()
        })
    }

    fn direct(&self, verb: &str, pod: &Pod, ports: &[PortMap], prev: Option<&Value>) -> Result<Op> {
        self.chain()
            .exec(verb, &pod.id, &pod.path(), ports, prev, |what, out| {
                self.expect_ok(what, pod, out)
            })
    }

    fn expect_ok(&self, verb: &str, pod: &Pod, out: &Exec) -> Result<()> {
        if !out.ok() && self.known_failure(verb, out) {
            return Ok(());
        }
        if !out.ok() {
            bail!(
                "{} {verb} of {} failed ({}): {} {}",
                self.variant.key(),
                pod.id,
                out.failure(),
                out.stdout.trim(),
                out.stderr.trim()
            );
        }
        Ok(())
    }

    /// Debian's portmap 1.1.1 fails every CHECK of an IPv4 pod while looking for IPv6 rules
    /// it never made (containernetworking/plugins#819, fixed upstream later). It is the
    /// last plugin of the reference chain, so its CHECK did all its work when it fails
    /// that way: the bench counts it as done and says so in the report.
    fn known_failure(&self, verb: &str, out: &Exec) -> bool {
        !out.timed_out
            && (self.known_failure_text(verb, &out.stdout)
                || self.known_failure_text(verb, &out.stderr))
    }

    /// [`Self::known_failure`] on the text of a failure.
    fn known_failure_text(&self, verb: &str, text: &str) -> bool {
        let known = self.variant == Variant::Reference
            && verb.starts_with("CHECK")
            && text.contains("could not check ipv6 dnat");
        if known {
            self.portmap_check_bug.store(true, Ordering::Relaxed);
        }
        known
    }

    /// Whether a reference CHECK hit the portmap bug of [`Self::known_failure`].
    pub fn hit_portmap_check_bug(&self) -> bool {
        self.portmap_check_bug.load(Ordering::Relaxed)
    }
}

/// What differs between cni-ebpf configurations: the node's pod subnet, the cluster CIDR
/// it never masquerades, and the node's own pin root, data dir and log.
pub struct EbpfConf<'a> {
    /// IPAM subnet of the node's pods.
    pub subnet: &'a str,
    /// `clusterCIDRs` (one IPv4 CIDR).
    pub cluster_cidr: &'a str,
    /// Dual stack: the IPv6 subnet of the node's pods and the IPv6 cluster CIDR.
    pub v6: Option<(&'a str, &'a str)>,
    /// `bpffsRoot`.
    pub pins: &'a Path,
    /// `dataDir`.
    pub data_dir: &'a Path,
    /// `logFile`.
    pub log_file: &'a Path,
    /// `logLevel`.
    pub log_level: &'a str,
    /// `attach` (`None`: the plugin's default).
    pub attach: Option<&'a str>,
    /// `cgroupPath` (`None`: no socket hooks).
    pub cgroup: Option<&'a Path>,
}

/// The cni-ebpf plugin object the bench runs: `ipMasq`, host ports in eBPF, default route.
pub fn ebpf_plugin(c: &EbpfConf<'_>) -> Value {
    let mut ranges = vec![json!([{ "subnet": c.subnet }])];
    let mut routes = vec![json!({ "dst": "0.0.0.0/0" })];
    let mut cluster = vec![c.cluster_cidr];
    if let Some((subnet6, cluster6)) = c.v6 {
        ranges.push(json!([{ "subnet": subnet6 }]));
        routes.push(json!({ "dst": "::/0" }));
        cluster.push(cluster6);
    }
    let mut plugin = json!({
        "type": "cni-ebpf",
        "mtu": 1500,
        "uplink": "uplink0",
        "ipMasq": true,
        "clusterCIDRs": cluster,
        "bpffsRoot": c.pins,
        "dataDir": c.data_dir,
        "logFile": c.log_file,
        "logLevel": c.log_level,
        "capabilities": { "portMappings": true },
        // No socket hooks on the machine's cgroup2 root: only on a cgroup of the bench's
        // own, where the Service phase measures sockets translated at connect().
        "cgroupPath": c.cgroup.map_or(json!(""), |p| json!(p)),
        // Pods open from the start: the policy phase's agents put its policies in force,
        // the other phases run no agent.
        "networkPolicy": false,
        "ipam": { "ranges": ranges, "routes": routes },
    });
    if let Some(a) = c.attach {
        plugin["attach"] = json!(a);
    }
    plugin
}

/// The reference chain the bench runs: `bridge` (`cni0`, `isGateway`, `ipMasq`, hairpin)
/// with `host-local` on `subnet` (and `subnet6`, dual stack; state in `ipam_dir`), then
/// `portmap`.
pub fn reference_plugins(subnet: &str, subnet6: Option<&str>, ipam_dir: &Path) -> Vec<Value> {
    let mut ranges = vec![json!([{ "subnet": subnet }])];
    let mut routes = vec![json!({ "dst": "0.0.0.0/0" })];
    if let Some(s6) = subnet6 {
        ranges.push(json!([{ "subnet": s6 }]));
        routes.push(json!({ "dst": "::/0" }));
    }
    vec![
        json!({
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "mtu": 1500,
            "ipam": {
                "type": "host-local",
                "ranges": ranges,
                "routes": routes,
                "dataDir": ipam_dir,
            },
        }),
        json!({ "type": "portmap", "capabilities": { "portMappings": true }, "snat": true }),
    ]
}

/// Creates `dir` as a `CNI_PATH`: the reference plugins of `/usr/lib/cni` and `plugin` as
/// `cni-ebpf`, side by side (symlinks).
pub fn fill_cni_bin(dir: &Path, plugin: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for e in std::fs::read_dir("/usr/lib/cni").context("reading /usr/lib/cni")? {
        let e = e?;
        std::os::unix::fs::symlink(e.path(), dir.join(e.file_name()))?;
    }
    std::os::unix::fs::symlink(plugin, dir.join("cni-ebpf"))?;
    Ok(())
}

/// A conflist executed the way libcni does it, without libcni: each plugin in turn with
/// `prevResult` passed on, DEL in reverse order, inside the node namespace.
pub struct Chain<'a> {
    /// Network name.
    pub network: &'a str,
    /// The plugin objects, in conflist order.
    pub plugins: Vec<Value>,
    /// Where the plugins run.
    pub node_netns: PathBuf,
    /// `CNI_PATH`.
    pub cni_path: PathBuf,
    /// `CNI_ARGS` of every invocation (`K8S_POD_NAMESPACE=…;K8S_POD_NAME=…`, as kubelet
    /// names the pod), if any.
    pub cni_args: Option<String>,
    /// Run every plugin under `strace -f -c`, its summary written into this directory, and
    /// count the system calls ([`Op::syscalls`]); timings of such a run mean nothing.
    pub trace_dir: Option<PathBuf>,
}

impl Chain<'_> {
    /// Runs `verb` for container `id` in `netns` (`eth0`), with host `ports` for the plugins
    /// that take `portMappings`; `prev` is the ADD result (CHECK, DEL). `judge` sees every
    /// plugin's outcome (`"<verb> (<type>)"`) and decides whether it is a failure.
    pub fn exec(
        &self,
        verb: &str,
        id: &str,
        netns: &Path,
        ports: &[PortMap],
        prev: Option<&Value>,
        judge: impl Fn(&str, &Exec) -> Result<()>,
    ) -> Result<Op> {
        let mut plugins = self.plugins.clone();
        if verb == "DEL" {
            plugins.reverse();
        }
        let mut op = Op::default();
        let mut prev_result = prev.cloned();
        for mut p in plugins {
            let ty = p["type"].as_str().unwrap_or_default().to_owned();
            let obj = p.as_object_mut().context("plugin object")?;
            obj.insert("cniVersion".into(), json!("1.0.0"));
            obj.insert("name".into(), json!(self.network));
            let wants_ports = obj
                .get("capabilities")
                .and_then(|c| c.get("portMappings"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if wants_ports && !ports.is_empty() {
                obj.insert(
                    "runtimeConfig".into(),
                    json!({ "portMappings": port_mappings(ports) }),
                );
            }
            if let Some(prev) = &prev_result {
                obj.insert("prevResult".into(), prev.clone());
            }
            let stdin = p.to_string();
            let bin = self.cni_path.join(&ty);
            let mut env = vec![
                ("CNI_COMMAND", OsStr::new(verb)),
                ("CNI_CONTAINERID", OsStr::new(id)),
                ("CNI_NETNS", netns.as_os_str()),
                ("CNI_IFNAME", OsStr::new("eth0")),
                ("CNI_PATH", self.cni_path.as_os_str()),
            ];
            if let Some(args) = &self.cni_args {
                env.push(("CNI_ARGS", OsStr::new(args)));
            }
            let trace = self
                .trace_dir
                .as_ref()
                .map(|d| d.join(format!("{ty}-{verb}.strace")));
            let mut argv: Vec<&OsStr> = Vec::new();
            if let Some(t) = &trace {
                argv.extend(["strace", "-f", "-c", "-o"].map(OsStr::new));
                argv.push(t.as_os_str());
            }
            argv.push(bin.as_os_str());
            let out = proc::exec(&Spec {
                argv,
                env,
                netns: Some(&self.node_netns),
                stdin: stdin.as_bytes(),
                timeout: OP_TIMEOUT,
            })?;
            judge(&format!("{verb} ({ty})"), &out)?;
            op.wall += out.wall;
            op.cpu += out.cpu;
            op.faults += out.faults;
            if let Some(t) = &trace {
                op.syscalls += strace_calls(t)?;
            }
            op.maxrss_kib = op.maxrss_kib.max(out.maxrss_kib);
            if verb == "ADD" {
                let r = parse_result(&out.stdout);
                prev_result = Some(r.clone());
                op.result = r;
            }
        }
        Ok(op)
    }
}

/// The number of system calls in the summary `strace -c -o <path>` wrote: the `calls`
/// column of its `total` line.
fn strace_calls(path: &Path) -> Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let total = text
        .lines()
        .find(|l| l.trim_end().ends_with(" total"))
        .with_context(|| format!("no total line in {}", path.display()))?;
    total
        .split_whitespace()
        .nth(3)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no call count in {total:?}"))
}

fn parse_result(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or(Value::Null)
}

/// Where cni-ebpf pins the maps of network `network` below the pin root `pins`
/// (`<bpffsRoot>/<network>/v<layout version>/maps`).
pub fn maps_dir(pins: &Path, network: &str) -> PathBuf {
    pins.join(network)
        .join(format!("v{}", cni_ebpf_common::LAYOUT_VERSION))
        .join("maps")
}

/// The pod's first IPv4 address in an ADD result.
pub fn pod_ip(result: &Value) -> Result<String> {
    pod_ip_of(result, '.').with_context(|| format!("no IPv4 address in {result}"))
}

/// The pod's first IPv6 address in an ADD result.
pub fn pod_ip6(result: &Value) -> Result<String> {
    pod_ip_of(result, ':').with_context(|| format!("no IPv6 address in {result}"))
}

/// The first address in an ADD result whose text has `mark` (`.` IPv4, `:` IPv6).
fn pod_ip_of(result: &Value, mark: char) -> Option<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(mark))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
}
