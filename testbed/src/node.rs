//! The simulated node (docs/testing.md, "The simulated node").
//!
//! ```text
//!   pod netns (one per Pod)        node-<tag>                     ext-<tag>
//!   eth0 (made by the plugin) ── host veths (plugin)
//!                                  uplink0 198.18.0.1/24  ──veth── eth0 198.18.0.2/24
//!                                          fd00:198:18::1/64       fd00:198:18::2/64
//!                                  default via 198.18.0.2 / fd00:198:18::2
//! ```
//!
//! Everything lives in namespaces the test creates; the machine's own network namespace
//! is never touched. Each node has its own pin root (`/sys/fs/bpf/cni-ebpf-test-<tag>`),
//! data dir, log file, libcni cache and `CNI_PATH` dir (in a temp dir), and removes all of
//! it on drop — also when the test panics, in which case it first prints the tail of the
//! plugin's log. Set `CNI_EBPF_TEST_KEEP=1` to keep the temp dir for a post-mortem.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use nix::sys::statfs::{statfs, BPF_FS_MAGIC};
use serde_json::Value;

use crate::{
    conf::ConfBuilder,
    inspect::{ResultView, StoreView},
    libcni::{client_bin, ClientOutput, REFERENCE_PLUGINS},
    netns::{CommandFailed, NetNs},
    plugin::{exec_plugin_in, plugin_bin, CniEnv, PluginOutput},
    process::{command, netns_exec, run, run_cmd, Background, Output, DEFAULT_TIMEOUT},
    snapshot::Snapshot,
    testdir::TestDir,
};

/// The node's uplink (its end of the veth to `ext`).
pub const UPLINK: &str = "uplink0";
/// The node's IPv4 address on the uplink.
pub const NODE_IP4: &str = "198.18.0.1";
/// The `ext` namespace's IPv4 address (the node's default gateway).
pub const EXT_IP4: &str = "198.18.0.2";
/// The node's IPv6 address on the uplink.
pub const NODE_IP6: &str = "fd00:198:18::1";
/// The `ext` namespace's IPv6 address (the node's default gateway).
pub const EXT_IP6: &str = "fd00:198:18::2";

/// Where bpffs is (or gets) mounted.
pub const BPFFS: &str = "/sys/fs/bpf";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name fragment unique to this test, process and call: `<short test name>-<pid>-<n>`.
/// Only letters, digits and `-`, so it is valid in netns names, container IDs and paths.
#[must_use]
pub fn unique_tag(test: &str) -> String {
    let short: String = test
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(16)
        .collect();
    format!(
        "{short}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Mounts bpffs at `/sys/fs/bpf` unless a bpf filesystem is already there.
#[track_caller]
pub fn ensure_bpffs() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        if statfs(BPFFS).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC) {
            return;
        }
        run(&["mount", "-t", "bpf", "bpf", BPFFS]).ok();
    });
}

/// A simulated node: `node` and `ext` namespaces joined by a veth, plus per-test pin,
/// data, log and cache locations.
#[derive(Debug)]
pub struct SimNode {
    tag: String,
    pin_root: PathBuf,
    // Field order is drop order: namespaces go before the temp dir. `ext` is shared by
    // the nodes of a [`crate::Cluster`]; the last one to go deletes it.
    node: NetNs,
    ext: Arc<NetNs>,
    dir: TestDir,
    cni_bin: OnceLock<PathBuf>,
    calls: AtomicUsize,
}

impl SimNode {
    /// Builds a node for the test `test` (a name fragment; uniqueness is added).
    #[track_caller]
    #[must_use]
    pub fn new(test: &str) -> Self {
        let tag = unique_tag(test);
        let ext = Arc::new(NetNs::create(&format!("ext-{tag}")));
        let sim = Self::unwired(tag.clone(), &format!("node-{tag}"), ext);
        sim.wire_uplink();
        sim
    }

    /// A node namespace `netns_name` with this node's temp dir, pin root and caches, but
    /// no uplink yet; `ext` is the outside world it will be wired to (shared between the
    /// nodes of a [`crate::Cluster`]). `tag` names its pods, pins and temp dir.
    #[track_caller]
    pub(crate) fn unwired(tag: String, netns_name: &str, ext: Arc<NetNs>) -> Self {
        ensure_bpffs();
        let dir = TestDir::new(&format!("cni-ebpf-test-{tag}-"));
        for sub in ["data", "libcni-cache", "conf"] {
            if let Err(e) = std::fs::create_dir(dir.path().join(sub)) {
                panic!("cannot create {sub} in {}: {e}", dir.path().display());
            }
        }
        // Created before anything that can fail below, so that a failure still drops
        // (removes) what exists.
        let node = NetNs::create(netns_name);
        Self {
            pin_root: Path::new(BPFFS).join(format!("cni-ebpf-test-{tag}")),
            tag,
            node,
            ext,
            dir,
            cni_bin: OnceLock::new(),
            calls: AtomicUsize::new(0),
        }
    }

    fn wire_uplink(&self) {
        wire_uplink(&self.node, &self.ext).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The unique tag in every name this node created.
    #[must_use]
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// `/run/netns/node-<tag>`: where the plugin runs.
    #[must_use]
    pub fn netns(&self) -> &Path {
        self.node.path()
    }

    /// The node namespace's name under `/run/netns` (for `ip -n`).
    #[must_use]
    pub fn netns_name(&self) -> &str {
        self.node.name()
    }

    /// `/run/netns/ext-<tag>`: the outside world.
    #[must_use]
    pub fn ext_netns(&self) -> &Path {
        self.ext.path()
    }

    /// The test's temp dir (data, log, caches).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `bpffsRoot` for this test's configurations.
    #[must_use]
    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }

    /// `dataDir` for this test's configurations.
    #[must_use]
    pub fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// `logFile` for this test's configurations.
    #[must_use]
    pub fn log_file(&self) -> PathBuf {
        self.dir().join("cni-ebpf.log")
    }

    /// The plugin's log so far (empty if it wrote none).
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// A configuration builder with this node's pin root, data dir, log file and uplink.
    #[must_use]
    pub fn conf(&self) -> ConfBuilder {
        ConfBuilder::new(&self.pin_root, &self.data_dir(), &self.log_file()).uplink(UPLINK)
    }

    /// Creates a pod namespace `/run/netns/<name>-<tag>` (removed when the [`Pod`] drops).
    #[track_caller]
    #[must_use]
    pub fn pod(&self, name: &str) -> Pod {
        let id = format!("{name}-{}", self.tag);
        Pod {
            netns: NetNs::create(&id),
            container_id: id,
        }
    }

    /// Runs `argv` in the node namespace.
    #[track_caller]
    pub fn exec<S: AsRef<OsStr>>(&self, argv: &[S]) -> Output {
        netns_exec(self.netns(), argv)
    }

    /// The policy generation in force on network `testnet` (0: no agent has swapped one
    /// in, or nothing is pinned).
    #[must_use]
    pub fn policy_generation(&self) -> u32 {
        cni_ebpf::datapath::Datapath::open_at(self.pin_root().join("testnet"))
            .ok()
            .flatten()
            .and_then(|d| d.policy_state().ok())
            .map_or(0, |s| s.generation)
    }

    /// The argv of `cni-ebpf inspect` of network `testnet` on this node (its pin root and
    /// data dir), then `extra`.
    #[must_use]
    pub fn inspect_argv(&self, extra: &[&str]) -> Vec<String> {
        let mut argv: Vec<String> = vec![
            crate::plugin::plugin_bin().to_string_lossy().into_owned(),
            "inspect".into(),
            "--network".into(),
            "testnet".into(),
            "--bpffs-root".into(),
            self.pin_root().to_string_lossy().into_owned(),
            "--data-dir".into(),
            self.data_dir().to_string_lossy().into_owned(),
        ];
        argv.extend(extra.iter().map(|s| (*s).to_owned()));
        argv
    }

    /// `cni-ebpf uninstall --purge` of network `testnet` on this node, with CNI
    /// directories of its own (created here).
    #[track_caller]
    pub fn uninstall_purge(&self) -> Output {
        let (bin_dir, conf_dir) = (self.dir().join("host-bin"), self.dir().join("host-net.d"));
        for d in [&bin_dir, &conf_dir] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        }
        self.exec(&[
            crate::plugin::plugin_bin().to_string_lossy().as_ref(),
            "uninstall",
            "--purge",
            "--network-name",
            "testnet",
            "--bpffs-root",
            &self.pin_root().to_string_lossy(),
            "--data-dir",
            &self.data_dir().to_string_lossy(),
            "--cni-bin-dir",
            &bin_dir.to_string_lossy(),
            "--cni-conf-dir",
            &conf_dir.to_string_lossy(),
        ])
    }

    /// Starts the plugin binary's `args` (a subcommand and its own flags: `agent …`,
    /// `metrics --host-gw …`) in this node's namespace against `api`, with this node's
    /// pin root, logging to `log`; stopped when dropped.
    #[track_caller]
    pub fn start_agent(
        &self,
        api: &crate::apiserver::ApiServer,
        args: &[&str],
        log: &Path,
    ) -> crate::process::Background {
        self.start_agent_of(&crate::plugin::plugin_bin(), api, args, log)
    }

    /// [`Self::start_agent`] of the binary `bin`.
    #[track_caller]
    pub fn start_agent_of(
        &self,
        bin: &Path,
        api: &crate::apiserver::ApiServer,
        args: &[&str],
        log: &Path,
    ) -> crate::process::Background {
        let argv = api.agent_argv(bin, self.pin_root(), args);
        crate::process::Background::spawn_logged(self.netns(), &argv, log)
    }

    /// Runs `argv` in the `ext` namespace.
    #[track_caller]
    pub fn ext_exec<S: AsRef<OsStr>>(&self, argv: &[S]) -> Output {
        netns_exec(self.ext_netns(), argv)
    }

    /// Starts a server (or any long-running program) in `ext`; killed when dropped.
    #[track_caller]
    pub fn spawn_ext<S: AsRef<OsStr>>(&self, argv: &[S]) -> Background {
        Background::spawn(self.ext_netns(), argv)
    }

    /// Links, addresses and routes of the node namespace.
    #[track_caller]
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::take(self.netns())
    }

    /// Every file and directory below the pin root (relative paths, sorted).
    #[must_use]
    pub fn pins(&self) -> Vec<PathBuf> {
        list_tree(&self.pin_root)
    }

    /// Every file and directory below the data dir (relative paths, sorted).
    #[must_use]
    pub fn store_files(&self) -> Vec<PathBuf> {
        list_tree(&self.data_dir())
    }

    /// The IPAM store of `network` (`<dataDir>/<network>/`), classified.
    #[must_use]
    pub fn store(&self, network: &str) -> StoreView {
        StoreView::read(&self.data_dir().join(network))
    }

    /// The datapath of `network` as `cni-ebpf inspect --json` shows it (node config,
    /// `endpoints`, `portMappings`, `nat`, `reasons`), or `None` when nothing is pinned.
    #[track_caller]
    #[must_use]
    pub fn datapath(&self, network: &str) -> Option<Value> {
        if !self.pin_root.join(network).exists() {
            return None;
        }
        let bin = plugin_bin();
        let root = self.pin_root.to_string_lossy().into_owned();
        let data = self.data_dir().to_string_lossy().into_owned();
        let out = netns_exec(
            self.netns(),
            &[
                bin.to_string_lossy().as_ref(),
                "inspect",
                "--network",
                network,
                "--bpffs-root",
                &root,
                "--data-dir",
                &data,
                "--json",
            ],
        );
        assert!(out.success(), "cni-ebpf inspect failed: {out}");
        Some(out.json())
    }

    /// The `endpoints` of [`Self::datapath`] (empty when nothing is pinned).
    #[track_caller]
    #[must_use]
    pub fn endpoints(&self, network: &str) -> Vec<Value> {
        self.datapath(network)
            .and_then(|d| d.get("endpoints").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    }

    /// ADD `pod`'s `ifname` with the single-plugin configuration of `conf`; panics with
    /// the plugin's output unless it succeeds. Returns the result.
    #[track_caller]
    pub fn add(&self, pod: &Pod, ifname: &str, conf: &ConfBuilder) -> ResultView {
        let out = self.exec_plugin("ADD", &pod.env(ifname), &conf.plugin());
        ResultView::parse(&out.result())
    }

    /// DEL `pod`'s `ifname` (no prevResult); panics unless it succeeds with empty stdout.
    #[track_caller]
    pub fn del(&self, pod: &Pod, ifname: &str, conf: &ConfBuilder) {
        self.exec_plugin("DEL", &pod.env(ifname), &conf.plugin())
            .assert_empty_success();
    }

    /// CHECK `pod`'s `ifname` against `prev` (a result).
    #[track_caller]
    pub fn check(&self, pod: &Pod, ifname: &str, conf: &ConfBuilder, prev: &Value) -> PluginOutput {
        let conf = conf.clone().set("prevResult", prev.clone());
        self.exec_plugin("CHECK", &pod.env(ifname), &conf.plugin())
    }

    /// ADDs and DELs a throwaway pod with `conf`, so that what the first ADD does once per
    /// node (loading and pinning the programs, attaching the uplink, enabling forwarding,
    /// and the anycast routes forwarding brings) is in place before a test takes its
    /// baseline [`Snapshot`]. Panics if either fails.
    #[track_caller]
    pub fn warm_up(&self, conf: &ConfBuilder) {
        let pod = self.pod("warmup");
        self.add(&pod, "eth0", conf);
        self.del(&pod, "eth0", conf);
    }

    /// Runs another build of the plugin (e.g. the fault-injection one) like
    /// [`Self::exec_plugin`].
    #[track_caller]
    pub fn exec_plugin_bin(
        &self,
        bin: &Path,
        cmd: &str,
        env: &CniEnv,
        conf: &Value,
    ) -> PluginOutput {
        let mut env = env.clone();
        if env.path.is_none() {
            env.path = Some(self.cni_bin_dir().to_string_lossy().into_owned());
        }
        exec_plugin_in(
            self.netns(),
            bin,
            cmd,
            &env,
            conf.to_string().as_bytes(),
            DEFAULT_TIMEOUT,
        )
    }

    /// A `CNI_PATH` directory holding the plugin (as `cni-ebpf`) and the reference
    /// plugins of `/usr/lib/cni`, all as symlinks. Created on first use.
    #[track_caller]
    pub fn cni_bin_dir(&self) -> &Path {
        self.cni_bin.get_or_init(|| {
            let dir = self.dir().join("cni-bin");
            let link = |target: &Path, name: &OsStr| {
                if let Err(e) = std::os::unix::fs::symlink(target, dir.join(name)) {
                    panic!(
                        "cannot link {} into {}: {e}",
                        target.display(),
                        dir.display()
                    );
                }
            };
            if let Err(e) = std::fs::create_dir(&dir) {
                panic!("cannot create {}: {e}", dir.display());
            }
            if let Ok(entries) = std::fs::read_dir(REFERENCE_PLUGINS) {
                for e in entries.flatten() {
                    link(&e.path(), &e.file_name());
                }
            }
            link(&plugin_bin(), OsStr::new("cni-ebpf"));
            dir
        })
    }

    /// Runs the plugin with `CNI_COMMAND=cmd` in the node namespace, `conf` on stdin.
    /// `CNI_PATH` defaults to [`Self::cni_bin_dir`].
    #[track_caller]
    pub fn exec_plugin(&self, cmd: &str, env: &CniEnv, conf: &Value) -> PluginOutput {
        self.exec_plugin_raw(cmd, env, conf.to_string().as_bytes())
    }

    /// [`Self::exec_plugin`] with arbitrary stdin bytes (malformed-input tests).
    #[track_caller]
    pub fn exec_plugin_raw(&self, cmd: &str, env: &CniEnv, stdin: &[u8]) -> PluginOutput {
        let mut env = env.clone();
        if env.path.is_none() {
            env.path = Some(self.cni_bin_dir().to_string_lossy().into_owned());
        }
        let bin = self.cni_bin_dir().join("cni-ebpf");
        exec_plugin_in(self.netns(), &bin, cmd, &env, stdin, DEFAULT_TIMEOUT)
    }

    /// DEL of `pod`'s `ifname` as a runtime sees it: returns when DEL does, while its
    /// finishing process may still be deleting the retired pair (every other helper waits
    /// for that: [`crate::plugin::settle`]).
    #[track_caller]
    pub fn del_unsettled(&self, pod: &Pod, ifname: &str, conf: &ConfBuilder) -> PluginOutput {
        let mut env = pod.env(ifname);
        env.path = Some(self.cni_bin_dir().to_string_lossy().into_owned());
        let bin = self.cni_bin_dir().join("cni-ebpf");
        let stdin = conf.plugin().to_string();
        crate::plugin::exec_plugin_unsettled(
            self.netns(),
            &bin,
            "DEL",
            &env,
            stdin.as_bytes(),
            DEFAULT_TIMEOUT,
        )
    }

    /// Runs the libcni client verb (`add`, `check`, `del`, `cached`, `validate`) on
    /// `conflist` in the node namespace, with this node's `CNI_PATH` and libcni cache.
    /// `env.extra` is passed to the client, and libcni passes it on to every plugin.
    #[track_caller]
    pub fn libcni(
        &self,
        verb: &str,
        conflist: &Value,
        env: &CniEnv,
        cap_args: Option<&Value>,
    ) -> ClientOutput {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let file = self
            .dir()
            .join("conf")
            .join(format!("{n:04}-{verb}.conflist"));
        if let Err(e) = std::fs::write(&file, conflist.to_string()) {
            panic!("cannot write {}: {e}", file.display());
        }
        let mut args: Vec<String> = vec![
            verb.into(),
            "--conflist".into(),
            file.to_string_lossy().into_owned(),
            "--id".into(),
            env.container_id.clone(),
            "--netns".into(),
            env.netns.clone(),
            "--ifname".into(),
            env.ifname.clone(),
        ];
        if let Some(p) = &env.path {
            args.extend(["--cni-path".into(), p.clone()]);
        }
        if let Some(a) = &env.args {
            args.extend(["--args".into(), a.clone()]);
        }
        if let Some(c) = cap_args {
            args.extend(["--cap-args".into(), c.to_string()]);
        }
        let out = self.libcni_raw(&args, &env.extra);
        if verb == "del" && out.success() {
            crate::plugin::settle_network(conflist);
        }
        out
    }

    /// The plugin's VERSION answer through libcni (`GetVersionInfo`).
    #[track_caller]
    pub fn libcni_version(&self, plugin_type: &str) -> ClientOutput {
        self.libcni_raw(&["version", "--type", plugin_type], &[])
    }

    /// Runs the client with `args` in the node namespace; `--cni-path` and `--cache-dir`
    /// default to this node's (flags given later in `args` win).
    #[track_caller]
    pub fn libcni_raw<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        extra_env: &[(String, String)],
    ) -> ClientOutput {
        let mut cmd = std::process::Command::new(client_bin());
        let Some((verb, rest)) = args.split_first() else {
            panic!("libcni_raw needs a verb");
        };
        cmd.arg(verb)
            .arg("--cni-path")
            .arg(self.cni_bin_dir())
            .arg("--cache-dir")
            .arg(self.dir().join("libcni-cache"))
            .args(rest);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        crate::process::in_netns(&mut cmd, self.netns());
        ClientOutput {
            raw: run_cmd(cmd, None, DEFAULT_TIMEOUT + Duration::from_secs(30)),
        }
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        if std::thread::panicking() && self.log_file().exists() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- SimNode {}: last plugin log lines ({}) ---",
                self.tag,
                self.log_file().display()
            );
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        if self.pin_root.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.pin_root) {
                eprintln!("warning: cannot remove {}: {e}", self.pin_root.display());
            }
        }
        // The namespaces and the temp dir are removed (or kept) by their own Drop.
    }
}

/// A pod: a network namespace the plugin attaches interfaces to. Removed on drop.
#[derive(Debug)]
pub struct Pod {
    netns: NetNs,
    container_id: String,
}

impl Pod {
    /// The namespace path (`CNI_NETNS`).
    #[must_use]
    pub fn netns(&self) -> &Path {
        self.netns.path()
    }

    /// The namespace name under `/run/netns`.
    #[must_use]
    pub fn name(&self) -> &str {
        self.netns.name()
    }

    /// A container ID unique to this pod (`<name>-<tag>`).
    #[must_use]
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The CNI environment attaching `ifname` in this pod.
    #[must_use]
    pub fn env(&self, ifname: &str) -> CniEnv {
        CniEnv::new(&self.container_id, self.netns(), ifname)
    }

    /// Runs `argv` inside the pod.
    #[track_caller]
    pub fn exec<S: AsRef<OsStr>>(&self, argv: &[S]) -> Output {
        netns_exec(self.netns(), argv)
    }

    /// Links, addresses and routes inside the pod.
    #[track_caller]
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::take(self.netns())
    }
}

/// Gives `dev` in the namespace `/run/netns/<ns>` the addresses `v4`/24 and `v6`/64 and
/// brings it up. IPv6 without DAD: the link-local and global addresses are final at once,
/// so snapshots taken early do not see them change from `tentative` later. Panics if a
/// step fails.
#[track_caller]
pub(crate) fn configure_link(ns: &str, dev: &str, v4: &str, v6: &str) {
    try_configure_link(ns, dev, v4, v6).unwrap_or_else(|e| panic!("{e}"));
}

/// Gives `dev` in namespace `ns` the addresses `v4`/24 and `v6`/64 (no DAD) and sets it up.
fn try_configure_link(ns: &str, dev: &str, v4: &str, v6: &str) -> Result<(), CommandFailed> {
    let ip = |args: &[&str]| -> Result<(), CommandFailed> {
        let mut argv = vec!["ip", "-n", ns];
        argv.extend_from_slice(args);
        crate::netns::checked(command(&argv)).map(|_| ())
    };
    ip(&["addr", "add", &format!("{v4}/24"), "dev", dev])?;
    ip(&["addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"])?;
    let key = PathBuf::from("/proc/sys/net/ipv6/conf")
        .join(dev)
        .join("accept_dad");
    crate::net::in_netns(&Path::new(crate::netns::NETNS_DIR).join(ns), move || {
        std::fs::write(&key, "0")
    })
    .map_err(|e| CommandFailed(format!("accept_dad of {dev} in {ns}: {e}")))?;
    ip(&["link", "set", dev, "up"])
}

/// Wires a node namespace to the outside world as the simulated node has it: a
/// veth `uplink0` (198.18.0.1/24, fd00:198:18::1/64) ↔ `eth0` in `ext` (198.18.0.2,
/// fd00:198:18::2), and the node's default routes through `ext`.
pub fn wire_uplink(node: &NetNs, ext: &NetNs) -> Result<(), CommandFailed> {
    node.sh(&[
        "ip",
        "link",
        "add",
        UPLINK,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ext.name(),
    ])?;
    try_configure_link(node.name(), UPLINK, NODE_IP4, NODE_IP6)?;
    try_configure_link(ext.name(), "eth0", EXT_IP4, EXT_IP6)?;
    node.sh(&["ip", "route", "add", "default", "via", EXT_IP4])?;
    node.sh(&["ip", "-6", "route", "add", "default", "via", EXT_IP6])?;
    Ok(())
}

/// The two namespaces of a simulated node, wired by [`wire_uplink`], without the test's
/// directories and caches: what `cargo xtask demo` and the bench build their nodes on
/// (they keep their own pins and data directories).
#[derive(Debug)]
pub struct NodeNamespaces {
    /// The node (dropped first).
    pub node: NetNs,
    /// The outside world.
    pub ext: NetNs,
}

impl NodeNamespaces {
    /// Creates `<prefix>-node` and `<prefix>-ext` (replacing ones a killed run left).
    pub fn create(prefix: &str) -> Result<Self, CommandFailed> {
        let node = NetNs::create_replacing(&format!("{prefix}-node"))?;
        let ext = NetNs::create_replacing(&format!("{prefix}-ext"))?;
        wire_uplink(&node, &ext)?;
        Ok(Self { node, ext })
    }
}

/// All paths below `root`, relative and sorted; empty if `root` does not exist.
#[must_use]
pub fn list_tree(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_path_buf());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}
