//! Running the plugin binary the way a runtime does: `CNI_*` environment, config on stdin.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::process::{in_netns, run_cmd, Output, DEFAULT_TIMEOUT};

/// The workspace root (parent of this crate).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// The plugin binary under test: `$CNI_EBPF_BIN`, else `<workspace>/target/release/cni-ebpf`.
/// Panics with instructions if it does not exist.
#[track_caller]
#[must_use]
pub fn plugin_bin() -> PathBuf {
    let (path, from_env) = match std::env::var_os("CNI_EBPF_BIN") {
        Some(p) => (PathBuf::from(p), true),
        None => (workspace_root().join("target/release/cni-ebpf"), false),
    };
    if !path.is_file() {
        if from_env {
            panic!("CNI_EBPF_BIN={} does not exist", path.display());
        }
        panic!(
            "plugin binary {} not found: run the privileged tests through `cargo xtask test`, \
             or build it (`cargo build --release -p cni-ebpf`) or point CNI_EBPF_BIN at one",
            path.display()
        );
    }
    path
}

/// The environment variable naming the plugin built with `--features fault-injection`.
pub const FAULT_BIN_ENV: &str = "CNI_EBPF_FAULT_BIN";

/// The fault-injection build of the plugin (`$CNI_EBPF_FAULT_BIN`): with
/// `CNI_EBPF_FAIL_AT=<step>` in its environment, ADD fails right after that step and rolls
/// back. Panics with instructions when it is not set or does not exist.
#[track_caller]
#[must_use]
pub fn fault_bin() -> PathBuf {
    let Some(p) = std::env::var_os(FAULT_BIN_ENV) else {
        panic!(
            "{FAULT_BIN_ENV} is not set: the fault-injection tests need the plugin built with \
             `cargo build --release -p cni-ebpf --features fault-injection`, copied aside, and \
             {FAULT_BIN_ENV} pointing at the copy (`cargo xtask test` does this)"
        );
    };
    let p = PathBuf::from(p);
    assert!(
        p.is_file(),
        "{FAULT_BIN_ENV}={} does not exist",
        p.display()
    );
    p
}

/// The `CNI_*` environment of one invocation (everything but `CNI_COMMAND`).
#[derive(Debug, Clone, Default)]
pub struct CniEnv {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS` (a path; empty for a DEL without namespace).
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS` (`K=V;K2=V2`), if any.
    pub args: Option<String>,
    /// `CNI_PATH`; defaults to the directory holding the plugin binary.
    pub path: Option<String>,
    /// Extra environment variables (e.g. a test-only fault-injection switch).
    pub extra: Vec<(String, String)>,
}

impl CniEnv {
    /// An environment for `container_id`, attaching `ifname` in the namespace at `netns`.
    #[must_use]
    pub fn new(container_id: &str, netns: impl AsRef<Path>, ifname: &str) -> Self {
        Self {
            container_id: container_id.to_owned(),
            netns: netns.as_ref().to_string_lossy().into_owned(),
            ifname: ifname.to_owned(),
            ..Self::default()
        }
    }

    /// Sets `CNI_ARGS`.
    #[must_use]
    pub fn with_args(mut self, args: &str) -> Self {
        self.args = Some(args.to_owned());
        self
    }

    /// Sets `CNI_NETNS` (e.g. empty or a non-namespace path for negative tests).
    #[must_use]
    pub fn with_netns(mut self, netns: impl AsRef<Path>) -> Self {
        self.netns = netns.as_ref().to_string_lossy().into_owned();
        self
    }

    /// Sets `CNI_PATH` (for the libcni client: its plugin search path).
    #[must_use]
    pub fn with_path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_string_lossy().into_owned());
        self
    }

    /// Adds an extra environment variable.
    #[must_use]
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.extra.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// A CNI error document, as printed by a plugin (or surfaced by libcni).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// The spec error code.
    pub code: u64,
    /// `msg`.
    pub msg: String,
    /// `details` (empty if absent).
    pub details: String,
}

impl CniError {
    /// Reads `{code, msg, details}` from a JSON object, if it has a numeric `code`.
    #[must_use]
    pub fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            code: v.get("code")?.as_u64()?,
            msg: v
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            details: v
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }
}

/// The outcome of one plugin invocation.
#[derive(Debug, Clone)]
pub struct PluginOutput {
    /// The raw process output (status, stdout, stderr).
    pub raw: Output,
}

impl PluginOutput {
    /// Whether the plugin exited 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.raw.success()
    }

    /// stdout parsed as JSON; panics if it is not exactly one JSON document.
    #[track_caller]
    #[must_use]
    pub fn json(&self) -> Value {
        self.raw.json()
    }

    /// The result document of a successful invocation; panics with the plugin's output
    /// otherwise.
    #[track_caller]
    #[must_use]
    pub fn result(&self) -> Value {
        assert!(self.success(), "plugin failed: {}", self.raw);
        self.json()
    }

    /// Panics unless the plugin succeeded with an empty stdout (DEL, CHECK).
    #[track_caller]
    pub fn assert_empty_success(&self) {
        assert!(
            self.success() && self.raw.stdout.trim().is_empty(),
            "expected success with empty stdout: {}",
            self.raw
        );
    }

    /// The error of a failed invocation; panics if the plugin succeeded or stdout is not
    /// a spec error document.
    #[track_caller]
    #[must_use]
    pub fn error(&self) -> CniError {
        assert!(
            !self.success(),
            "plugin succeeded but an error was expected: {}",
            self.raw
        );
        match CniError::from_json(&self.json()) {
            Some(e) => e,
            None => panic!("stdout is not a CNI error document: {}", self.raw),
        }
    }

    /// Panics unless the plugin failed with error `code`; returns the error.
    #[track_caller]
    pub fn assert_error(&self, code: u64) -> CniError {
        let e = self.error();
        assert_eq!(e.code, code, "wrong error code: {}", self.raw);
        e
    }
}

/// Runs the plugin `bin` with `CNI_COMMAND=cmd` and `env`, feeding `stdin`, inside the
/// network namespace `netns` (the node), bounded by `timeout`.
#[track_caller]
pub fn exec_plugin_in(
    netns: &Path,
    bin: &Path,
    cmd: &str,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> PluginOutput {
    let out = exec_plugin_unsettled(netns, bin, cmd, env, stdin, timeout);
    if cmd == "DEL" && out.success() {
        settle(stdin);
    }
    out
}

/// [`exec_plugin_in`] as a runtime sees it: returns when the plugin does, and a DEL's
/// finishing process may still be at work.
#[track_caller]
pub fn exec_plugin_unsettled(
    netns: &Path,
    bin: &Path,
    cmd: &str,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> PluginOutput {
    let c = plugin_command(netns, bin, cmd, env);
    PluginOutput {
        raw: run_cmd(c, Some(stdin), timeout),
    }
}

/// The plugin `bin` run for `cmd` in `netns` with `env` and nothing else of ours.
fn plugin_command(netns: &Path, bin: &Path, cmd: &str, env: &CniEnv) -> Command {
    let mut c = Command::new(bin);
    let default_path = bin
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    c.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", env.path.as_deref().unwrap_or(&default_path));
    if let Some(args) = &env.args {
        c.env("CNI_ARGS", args);
    }
    for (k, v) in &env.extra {
        c.env(k, v);
    }
    in_netns(&mut c, netns);
    c
}

/// How long [`settle`] waits for a DEL's finishing process (the plugin's own bound).
pub const SETTLE_WAIT: Duration = cni_ebpf::verbs::del::SETTLE_WAIT;

/// Waits until the network that `stdin` configures has no DEL's finishing process left
/// (`cni-ebpf finish-del`, which purges the pod's flows and deletes its retired veth after
/// DEL has returned): each holds a shared lock on `<dataDir>/<network>/teardowns.lock`, so
/// an exclusive one is had once all have ended. [`exec_plugin_in`] waits so after every
/// DEL, and what a test checks next is the finished state. Panics after [`SETTLE_WAIT`].
#[track_caller]
pub fn settle(stdin: &[u8]) {
    if let Ok(conf) = serde_json::from_slice::<Value>(stdin) {
        settle_network(&conf);
    }
}

/// [`settle`] for a network configuration: one plugin's, or a conflist (its `name`, and the
/// `dataDir` of its `cni-ebpf` plugin).
#[track_caller]
pub fn settle_network(conf: &Value) {
    let Some(name) = conf["name"].as_str() else {
        return;
    };
    let plugin = conf["plugins"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["type"] == "cni-ebpf"))
        .unwrap_or(conf);
    if plugin["type"] != "cni-ebpf" {
        return;
    }
    let data_dir = plugin["dataDir"].as_str().unwrap_or("/var/lib/cni-ebpf");
    let store = Path::new(data_dir).join(name);
    if !store.join("teardowns.lock").exists() {
        return;
    }
    match cni_ebpf::verbs::del::settled(&store, SETTLE_WAIT) {
        Ok(true) => {}
        Ok(false) => panic!(
            "a DEL's finishing process of {} still runs after {SETTLE_WAIT:?}",
            store.display()
        ),
        Err(e) => panic!("waiting for DEL's finishing processes: {e}"),
    }
}

/// [`exec_plugin_in`] with the default timeout and a JSON stdin.
#[track_caller]
pub fn exec_plugin_json(
    netns: &Path,
    bin: &Path,
    cmd: &str,
    env: &CniEnv,
    stdin: &Value,
) -> PluginOutput {
    let bytes = stdin.to_string().into_bytes();
    exec_plugin_in(netns, bin, cmd, env, &bytes, DEFAULT_TIMEOUT)
}
