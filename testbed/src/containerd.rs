//! containerd inside a simulated node, driven the way kubelet drives it (CRI v1 over its
//! gRPC socket) and the way `ctr run --cni` does.
//!
//! [`Containerd::start`] runs Debian's containerd (1.6, CRI plugin built in) as a child
//! process that is in the node's network namespace and in a **private mount namespace of
//! its own**, and nowhere else:
//!
//! - network: the node namespace, entered with `setns` only (never `ip netns exec`, which
//!   remounts `/sys` and hides the cgroup and bpffs mounts from runc and the plugin);
//! - mounts: a copy of the machine's, made with `unshare --mount=<pin>` and kept alive by a
//!   bind mount (a "pin") in the temp dir, so a restarted containerd finds the mounts of
//!   the first one. In it a tmpfs covers `/run` (containerd 1.6 puts its shims' sockets in
//!   `/run/containerd/s` whatever its config says, and runc its state in
//!   `/run/containerd/runc`), another covers `/opt`, and an overlay with a tmpfs upper layer
//!   covers `/etc`: `ctr run --cni` reads the fixed `/etc/cni/net.d` and `/opt/cni/bin`,
//!   which are bind mounts of this node's directories there. The machine's `/etc/cni`,
//!   `/opt/cni`, `/run/containerd` and `/var/lib/containerd` are never written.
//! - files: root and state directories, the gRPC socket, the CNI configuration directory,
//!   the images and the log in a temp dir; `cni.bin_dir` is the node's CNI bin dir (the
//!   plugin and the reference `loopback`, which the CRI plugin runs for every pod's `lo`);
//! - cgroups: every pod gets `cgroup_parent` `/cni-ebpf-cri-<tag>` (cgroupfs driver,
//!   `SystemdCgroup = false`); the empty directories runc leaves are removed on drop.
//!
//! Images are made offline from Debian's `busybox-static`: a one-layer OCI image written by
//! hand (layer tarball, config, manifest, index) holding `/bin/busybox` and a link per
//! applet, under two names: [`PAUSE_IMAGE`] (entrypoint `sleep`, the CRI sandbox image) and
//! [`BUSYBOX_IMAGE`] (`/bin/sh`), imported with `ctr images import`.
//!
//! Dropping a [`Containerd`] (also when a test panics) stops and removes every pod and
//! `ctr` task left, stops containerd by its PID (SIGTERM, then SIGKILL), kills by PID any
//! process left in its mount namespace or its cgroups (shims, containers), unpins the mount
//! namespace — which takes every mount containerd and runc made with it — and removes the
//! cgroup directories and the temp dir.

use std::{
    collections::HashMap,
    fmt,
    fs::File,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    KeyValue, LinuxPodSandboxConfig, ListImagesRequest, ListPodSandboxRequest, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatusRequest, PortMapping, Protocol, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest, VersionRequest,
};
use nix::{
    mount::{umount2, MntFlags},
    sched::{setns, CloneFlags},
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{
    node::SimNode,
    process::{command, run, run_cmd, Output, DEFAULT_TIMEOUT},
    testdir::TestDir,
    ConfBuilder,
};

/// The CRI sandbox ("pause") image: busybox whose entrypoint sleeps.
pub const PAUSE_IMAGE: &str = "localhost/cni-ebpf-test/pause:1";
/// The workload image: busybox, `/bin/sh` by default.
pub const BUSYBOX_IMAGE: &str = "localhost/cni-ebpf-test/busybox:1";
/// The containerd namespace the CRI plugin uses.
pub const K8S_NAMESPACE: &str = "k8s.io";
/// How long containerd may take to answer on its socket after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one CRI call (RunPodSandbox runs the plugin; ExecSync runs a command).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Where Debian's `busybox-static` puts its binary (usrmerge or not).
const BUSYBOX_PATHS: &[&str] = &["/usr/bin/busybox", "/bin/busybox"];

/// A pod as kubelet describes it to the CRI: Kubernetes metadata and host ports.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `(hostPort, containerPort)` TCP mappings.
    pub port_mappings: Vec<(u16, u16)>,
}

impl PodSpec {
    /// A pod `name` in namespace `default` with a uid derived from the name.
    #[must_use]
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: "default".into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            port_mappings: Vec::new(),
        }
    }

    /// Adds a TCP host port mapping.
    #[must_use]
    pub fn host_port(mut self, host: u16, container: u16) -> Self {
        self.port_mappings.push((host, container));
        self
    }
}

/// What `ExecSync` returned.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// The command, for messages.
    pub cmd: Vec<String>,
    /// Its exit code.
    pub exit_code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl ExecOutput {
    /// Panics with the output unless the command exited 0; returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(self.exit_code, 0, "exec failed: {self}");
        &self.stdout
    }
}

impl fmt::Display for ExecOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmd.join(" "),
            self.exit_code,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// A containerd daemon of a test's own inside a [`SimNode`]; see the module docs.
pub struct Containerd {
    tag: String,
    netns: PathBuf,
    dir: TestDir,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    channel: Option<Channel>,
    pinned: bool,
}

impl fmt::Debug for Containerd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.dir())
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish_non_exhaustive()
    }
}

impl Containerd {
    /// Starts containerd in `node`'s network namespace with `conf`'s conflist as the CRI
    /// plugin's (and `ctr run --cni`'s) only network, imports the images and waits until
    /// the CRI answers. Panics with containerd's log if it does not come up.
    #[track_caller]
    #[must_use]
    pub fn start(node: &SimNode, conf: &ConfBuilder) -> Self {
        let dir = TestDir::new(&format!("cni-ebpf-containerd-{}-", node.tag()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"));
        let mut me = Self {
            tag: node.tag().to_owned(),
            netns: node.netns().to_path_buf(),
            dir,
            child: None,
            rt,
            channel: None,
            pinned: false,
        };
        for sub in ["root", "state", "conf", "logs", "ns", "opt"] {
            let p = me.dir().join(sub);
            std::fs::create_dir(&p)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
        }
        let conflist = me.dir().join("conf/10-cni-ebpf.conflist");
        std::fs::write(&conflist, conf.conflist().to_string())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", conflist.display()));
        std::fs::write(me.config_path(), me.config_toml(node.cni_bin_dir()))
            .unwrap_or_else(|e| panic!("cannot write containerd's config: {e}"));
        me.make_mount_ns(node.cni_bin_dir());
        let images = build_images(&me.dir().join("image"));
        me.spawn();
        for ns in [K8S_NAMESPACE, "default"] {
            me.ctr(&[
                "-n",
                ns,
                "images",
                "import",
                "--snapshotter",
                "native",
                &images.to_string_lossy(),
            ])
            .ok();
        }
        me
    }

    /// The temp dir (state, root, socket, log, images).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's gRPC socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    fn config_path(&self) -> PathBuf {
        self.dir().join("config.toml")
    }

    fn mnt_pin(&self) -> PathBuf {
        self.dir().join("ns/mnt")
    }

    /// `cgroup_parent` of every pod of this daemon.
    #[must_use]
    pub fn cgroup_parent(&self) -> String {
        format!("/cni-ebpf-cri-{}", self.tag)
    }

    /// containerd's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// The daemon's PID while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn config_toml(&self, cni_bin: &Path) -> String {
        let d = self.dir().display().to_string();
        // Only what the CRI path needs: the snapshotters that need kernel or filesystem
        // support (and tracing) are off, so a start takes a fraction of a second.
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/containerd.sock"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  netns_mounts_under_state_dir = true
  # Sandboxes ask for oom_score_adj -998, which a process without CAP_SYS_RESOURCE (a
  # test run inside a container) may not set: clamp to containerd's own, as rootless
  # setups do.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{d}/conf"
    max_conf_num = 1
"#,
            bin = cni_bin.display()
        )
    }

    /// Creates the private mount namespace and pins it at [`Self::mnt_pin`]; see the
    /// module docs for what it covers.
    #[track_caller]
    fn make_mount_ns(&mut self, cni_bin: &Path) {
        let ns_dir = self.dir().join("ns");
        // A namespace pin must not sit on a shared mount (the bind would propagate into the
        // namespace it pins): the directory becomes a private mount of its own.
        run(&[Path::new("mount"), Path::new("--bind"), &ns_dir, &ns_dir]).ok();
        self.pinned = true;
        run(&[Path::new("mount"), Path::new("--make-private"), &ns_dir]).ok();
        File::create(self.mnt_pin()).unwrap_or_else(|e| panic!("cannot create the pin: {e}"));
        let d = self.dir().display().to_string();
        let script = format!(
            "set -e
mount -t tmpfs -o mode=0755 cni-ebpf-test-run /run
mount -t tmpfs -o mode=0755 cni-ebpf-test-opt /opt
mkdir -p /opt/cni/bin
mount --bind '{bin}' /opt/cni/bin
mkdir -p '{d}/etc'
mount -t tmpfs -o mode=0755 cni-ebpf-test-etc '{d}/etc'
mkdir '{d}/etc/upper' '{d}/etc/work'
mount -t overlay -o 'lowerdir=/etc,upperdir={d}/etc/upper,workdir={d}/etc/work' cni-ebpf-test-etc /etc
mkdir -p /etc/cni/net.d
mount --bind '{d}/conf' /etc/cni/net.d
",
            bin = cni_bin.display()
        );
        let pin = format!("--mount={}", self.mnt_pin().display());
        run(&[
            "unshare",
            &pin,
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ])
        .ok();
    }

    /// A command that runs in containerd's network and mount namespaces.
    #[track_caller]
    fn inside(&self, argv: &[&str]) -> Command {
        let mut cmd = command(argv);
        let net = File::open(&self.netns)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.netns.display()));
        let mnt = File::open(self.mnt_pin())
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.mnt_pin().display()));
        // SAFETY: the hook only calls setns(2), async-signal-safe, on descriptors opened
        // before fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                setns(&net, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
                setns(&mnt, CloneFlags::CLONE_NEWNS).map_err(std::io::Error::from)
            });
        }
        cmd
    }

    /// Starts the daemon and waits (bounded) until its CRI answers.
    #[track_caller]
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir().join("containerd.log"))
            .unwrap_or_else(|e| panic!("cannot open containerd's log: {e}"));
        let log2 = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
        let config = self.config_path().display().to_string();
        let mut cmd = self.inside(&["containerd", "--config", &config]);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        self.child = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start containerd: {e}")),
        );
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("containerd exited with {status}:\n{}", self.log());
                }
            }
            if self.socket().exists() && self.try_version().is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd's CRI did not answer within {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_version(&mut self) -> Result<String, String> {
        let socket = self.socket();
        let channel = self.rt.block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(2),
                Endpoint::from_static("http://[::]:50051").connect_with_connector(
                    tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            tokio::net::UnixStream::connect(socket)
                                .await
                                .map(TokioIo::new)
                        }
                    }),
                ),
            )
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
        })?;
        let mut client = RuntimeServiceClient::new(channel.clone());
        let v = self
            .rt
            .block_on(async move {
                tokio::time::timeout(
                    Duration::from_secs(2),
                    client.version(VersionRequest {
                        version: "v1".into(),
                    }),
                )
                .await
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?
            .into_inner();
        self.channel = Some(channel);
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    fn runtime(&self) -> RuntimeServiceClient<Channel> {
        match &self.channel {
            Some(c) => RuntimeServiceClient::new(c.clone()),
            None => panic!("containerd is not running"),
        }
    }

    /// Runs one CRI call to completion, bounded by [`CALL_TIMEOUT`].
    fn call<T, F>(&self, what: &str, f: F) -> Result<T, String>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match self
            .rt
            .block_on(async move { tokio::time::timeout(CALL_TIMEOUT, f).await })
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(format!("{what}: {status}")),
            Err(_) => Err(format!("{what}: no answer within {CALL_TIMEOUT:?}")),
        }
    }

    /// Like [`Self::call`], panicking with containerd's log tail on failure.
    #[track_caller]
    fn call_ok<T, F>(&self, what: &str, f: F) -> T
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match self.call(what, f) {
            Ok(v) => v,
            Err(e) => panic!(
                "CRI {e}\n--- containerd log (tail) ---\n{}",
                self.log_tail(30)
            ),
        }
    }

    fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().rev().take(n).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The CRI `Version` answer (`runtime_name runtime_version`).
    #[track_caller]
    #[must_use]
    pub fn version(&mut self) -> String {
        self.try_version()
            .unwrap_or_else(|e| panic!("CRI Version: {e}"))
    }

    /// The image names the CRI lists.
    #[track_caller]
    #[must_use]
    pub fn images(&self) -> Vec<String> {
        let Some(c) = &self.channel else {
            panic!("containerd is not running")
        };
        let mut client = ImageServiceClient::new(c.clone());
        let r = self.call_ok(
            "ListImages",
            client.list_images(ListImagesRequest { filter: None }),
        );
        r.images.into_iter().flat_map(|i| i.repo_tags).collect()
    }

    fn sandbox_config(&self, pod: &PodSpec) -> PodSandboxConfig {
        let log_dir = self.dir().join("logs").join(&pod.name);
        let _ = std::fs::create_dir_all(&log_dir);
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            hostname: pod.name.clone(),
            log_directory: log_dir.display().to_string(),
            port_mappings: pod
                .port_mappings
                .iter()
                .map(|&(host, ctr)| PortMapping {
                    protocol: Protocol::Tcp.into(),
                    container_port: i32::from(ctr),
                    host_port: i32::from(host),
                    host_ip: String::new(),
                })
                .collect(),
            labels: HashMap::from([("io.kubernetes.pod.name".to_owned(), pod.name.clone())]),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `RunPodSandbox`: the CRI plugin creates the netns and runs the CNI ADD. Returns the
    /// sandbox ID (the plugin's `CNI_CONTAINERID`).
    #[track_caller]
    pub fn run_pod(&self, pod: &PodSpec) -> String {
        let mut rs = self.runtime();
        self.call_ok(
            &format!("RunPodSandbox {}", pod.name),
            rs.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(self.sandbox_config(pod)),
                runtime_handler: String::new(),
            }),
        )
        .pod_sandbox_id
    }

    /// `CreateContainer` + `StartContainer` of busybox running `argv` (with `env`) in the
    /// sandbox `sandbox` of `pod`. Returns the container ID.
    #[track_caller]
    pub fn start_container(
        &self,
        sandbox: &str,
        pod: &PodSpec,
        name: &str,
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> String {
        let mut rs = self.runtime();
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: BUSYBOX_IMAGE.into(),
                ..Default::default()
            }),
            command: argv.iter().map(|s| (*s).to_owned()).collect(),
            envs: env
                .iter()
                .map(|(k, v)| KeyValue {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            log_path: format!("{name}.log"),
            ..Default::default()
        };
        let id = self
            .call_ok(
                &format!("CreateContainer {name}"),
                rs.create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox.to_owned(),
                    config: Some(config),
                    sandbox_config: Some(self.sandbox_config(pod)),
                }),
            )
            .container_id;
        self.call_ok(
            &format!("StartContainer {name}"),
            rs.start_container(StartContainerRequest {
                container_id: id.clone(),
            }),
        );
        id
    }

    /// `ExecSync` of `cmd` in container `id`, bounded by `timeout` (CRI's own timeout).
    #[track_caller]
    pub fn exec(&self, id: &str, cmd: &[&str], timeout: Duration) -> ExecOutput {
        let mut rs = self.runtime();
        let r = self.call_ok(
            &format!("ExecSync {cmd:?}"),
            rs.exec_sync(ExecSyncRequest {
                container_id: id.to_owned(),
                cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(10),
            }),
        );
        ExecOutput {
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            exit_code: r.exit_code,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
        }
    }

    /// `PodSandboxStatus` (verbose): the pod's addresses as the CRI reports them (`ip`
    /// then `additional_ips`) and its `info` document (sandbox PID, runtime spec, CNI
    /// result).
    #[track_caller]
    #[must_use]
    pub fn pod_status(&self, sandbox: &str) -> PodStatus {
        let mut rs = self.runtime();
        let r = self.call_ok(
            "PodSandboxStatus",
            rs.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.to_owned(),
                verbose: true,
            }),
        );
        let status = r
            .status
            .unwrap_or_else(|| panic!("PodSandboxStatus of {sandbox} has no status"));
        let mut ips = Vec::new();
        if let Some(n) = &status.network {
            if !n.ip.is_empty() {
                ips.push(n.ip.clone());
            }
            ips.extend(n.additional_ips.iter().map(|i| i.ip.clone()));
        }
        let info = r
            .info
            .get("info")
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        let metadata = status
            .metadata
            .map(|m| (m.name, m.namespace, m.uid))
            .unwrap_or_default();
        PodStatus {
            ready: status.state == 0,
            metadata,
            ips,
            info,
        }
    }

    /// The sandbox IDs the CRI lists.
    #[track_caller]
    #[must_use]
    pub fn pods(&self) -> Vec<String> {
        let mut rs = self.runtime();
        self.call_ok(
            "ListPodSandbox",
            rs.list_pod_sandbox(ListPodSandboxRequest { filter: None }),
        )
        .items
        .into_iter()
        .map(|p| p.id)
        .collect()
    }

    /// `StopPodSandbox` (the CNI DEL) then `RemovePodSandbox`.
    #[track_caller]
    pub fn stop_and_remove_pod(&self, sandbox: &str) {
        if let Err(e) = self.try_stop_and_remove_pod(sandbox) {
            panic!("{e}\n--- containerd log (tail) ---\n{}", self.log_tail(30));
        }
    }

    fn try_stop_and_remove_pod(&self, sandbox: &str) -> Result<(), String> {
        let mut rs = self.runtime();
        self.call(
            "StopPodSandbox",
            rs.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: sandbox.to_owned(),
            }),
        )?;
        self.call(
            "RemovePodSandbox",
            rs.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: sandbox.to_owned(),
            }),
        )?;
        Ok(())
    }

    /// Runs `ctr -a <socket> <args>` in containerd's namespaces (so `ctr run --cni` runs
    /// the plugin in the node namespace with `/etc/cni/net.d` and `/opt/cni/bin` this
    /// node's), bounded by [`DEFAULT_TIMEOUT`].
    #[track_caller]
    pub fn ctr(&self, args: &[&str]) -> Output {
        let socket = self.socket().display().to_string();
        let mut argv = vec!["ctr", "-a", socket.as_str()];
        argv.extend_from_slice(args);
        run_cmd(self.inside(&argv), None, DEFAULT_TIMEOUT)
    }

    /// Starts `ctr -a <socket> <args>` in containerd's namespaces without waiting; its
    /// output goes to `log`. The caller owns (and reaps) the child.
    #[track_caller]
    pub fn spawn_ctr(&self, args: &[&str], log: &Path) -> Child {
        let socket = self.socket().display().to_string();
        let mut argv = vec!["ctr", "-a", socket.as_str()];
        argv.extend_from_slice(args);
        let out =
            File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
        let mut cmd = self.inside(&argv);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", argv.join(" ")))
    }

    /// Stops containerd by its PID: SIGTERM, then SIGKILL after 10 s. Pods and their
    /// shims keep running (as with a restart of the service on a node).
    pub fn stop_daemon(&mut self) {
        self.channel = None;
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }

    /// Starts containerd again with the same configuration and state (after
    /// [`Self::stop_daemon`]).
    #[track_caller]
    pub fn restart_daemon(&mut self) {
        self.stop_daemon();
        self.spawn();
    }

    /// PIDs of the processes in containerd's mount namespace (it, its shims) or in its
    /// pods' cgroups (the containers): all started by this daemon.
    fn our_processes(&self) -> Vec<i32> {
        let Ok(pin) = nix::sys::stat::stat(&self.mnt_pin()) else {
            return Vec::new();
        };
        let cg = format!(":{}/", self.cgroup_parent());
        let me = std::process::id();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if u32::try_from(pid).is_ok_and(|p| p == me) {
                continue;
            }
            let in_ns = nix::sys::stat::stat(&e.path().join("ns/mnt"))
                .is_ok_and(|s| s.st_ino == pin.st_ino && s.st_dev == pin.st_dev);
            let in_cg =
                std::fs::read_to_string(e.path().join("cgroup")).is_ok_and(|c| c.contains(&cg));
            if in_ns || in_cg {
                out.push(pid);
            }
        }
        out
    }

    /// Removes `<hierarchy>/<cgroup parent>` (children first) from every cgroup hierarchy.
    fn remove_cgroups(&self) {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let rel = self.cgroup_parent();
        for l in mounts.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !matches!(f.get(2), Some(&("cgroup" | "cgroup2"))) {
                continue;
            }
            let Some(mnt) = f.get(1) else { continue };
            let top = Path::new(mnt).join(rel.trim_start_matches('/'));
            remove_cgroup_tree(&top);
        }
    }
}

/// What [`Containerd::pod_status`] returns.
#[derive(Debug, Clone)]
pub struct PodStatus {
    /// `SANDBOX_READY`.
    pub ready: bool,
    /// `metadata`: (name, namespace, uid).
    pub metadata: (String, String, String),
    /// `network.ip` then `network.additional_ips`.
    pub ips: Vec<String>,
    /// The verbose `info` document.
    pub info: Value,
}

impl PodStatus {
    /// The sandbox's PID (its pause process), from the verbose info.
    #[track_caller]
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or_else(|| panic!("no pid in the sandbox info: {:#}", self.info))
    }

    /// `/proc/<sandbox pid>/ns/net`: the pod's network namespace as this process sees it.
    #[must_use]
    pub fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }

    /// The IPv4 address the CRI reports.
    #[track_caller]
    #[must_use]
    pub fn ip4(&self) -> &str {
        self.ips
            .iter()
            .find(|i| !i.contains(':'))
            .unwrap_or_else(|| panic!("no IPv4 address in {:?}", self.ips))
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    // cgroupfs directories are removed with rmdir (their files are not removable).
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = std::fs::remove_dir(dir) {
        if Instant::now() >= deadline {
            eprintln!("warning: cannot remove cgroup {}: {e}", dir.display());
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- containerd {} (tail of {}) ---\n{}",
                self.tag,
                self.dir().join("containerd.log").display(),
                self.log_tail(40)
            );
        }
        // What a test left running: pods through the CRI (their CNI DEL runs), `ctr` tasks
        // by force.
        if self.channel.is_some() {
            let pods = {
                let mut rs = self.runtime();
                self.call(
                    "ListPodSandbox",
                    rs.list_pod_sandbox(ListPodSandboxRequest { filter: None }),
                )
                .map(|r| r.items.into_iter().map(|p| p.id).collect::<Vec<_>>())
                .unwrap_or_default()
            };
            for p in pods {
                if let Err(e) = self.try_stop_and_remove_pod(&p) {
                    eprintln!("warning: cleaning up pod {p}: {e}");
                }
            }
            let tasks = self.ctr(&["-n", "default", "tasks", "ls", "-q"]);
            for t in tasks.stdout.lines().filter(|l| !l.trim().is_empty()) {
                let _ = self.ctr(&["-n", "default", "tasks", "kill", "-s", "SIGKILL", t]);
                let _ = self.ctr(&["-n", "default", "tasks", "delete", "-f", t]);
            }
            let ctrs = self.ctr(&["-n", "default", "containers", "ls", "-q"]);
            for c in ctrs.stdout.lines().filter(|l| !l.trim().is_empty()) {
                let _ = self.ctr(&["-n", "default", "containers", "delete", c]);
            }
        }
        self.stop_daemon();
        // Shims and containers that outlived the cleanup above: ours by their mount
        // namespace or cgroup, killed by PID (bounded: a few rounds).
        for _ in 0..5 {
            let left = self.our_processes();
            if left.is_empty() {
                break;
            }
            for pid in &left {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            thread::sleep(Duration::from_millis(200));
        }
        if self.pinned {
            // The mount namespace, and every mount in it, goes with its last reference.
            let _ = umount2(&self.mnt_pin(), MntFlags::MNT_DETACH);
            let _ = umount2(&self.dir().join("ns"), MntFlags::MNT_DETACH);
            self.pinned = false;
        }
        self.remove_cgroups();
    }
}

/// Builds the OCI archive holding [`PAUSE_IMAGE`] and [`BUSYBOX_IMAGE`] in `dir` (see the
/// module docs) and returns its path. Panics if busybox-static is missing.
#[track_caller]
#[must_use]
pub fn build_images(dir: &Path) -> PathBuf {
    let busybox = BUSYBOX_PATHS
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("busybox not found in {BUSYBOX_PATHS:?} (`cargo xtask setup` installs busybox-static)")
        });
    let rootfs = dir.join("rootfs");
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    for d in ["bin", "dev", "etc", "proc", "sys", "tmp", "root"] {
        std::fs::create_dir_all(rootfs.join(d))
            .unwrap_or_else(|e| panic!("cannot create the image root: {e}"));
    }
    std::fs::create_dir_all(&blobs)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", blobs.display()));
    std::fs::copy(busybox, rootfs.join("bin/busybox"))
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", busybox.display()));
    let list = run(&[busybox.to_string_lossy().as_ref(), "--list"]);
    for applet in list.ok().lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
    }
    let layer = dir.join("layer.tar");
    let mut tar = command(&["tar", "--numeric-owner", "--owner=0", "--group=0", "-C"]);
    tar.arg(&rootfs).arg("-cf").arg(&layer).arg(".");
    run_cmd(tar, None, DEFAULT_TIMEOUT).ok();
    let write_blob = |bytes: &[u8]| -> (String, usize) {
        let digest = format!("sha256:{:x}", Sha256::digest(bytes));
        let path = blobs.join(digest.trim_start_matches("sha256:"));
        std::fs::write(&path, bytes)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        (digest, bytes.len())
    };
    let layer_bytes =
        std::fs::read(&layer).unwrap_or_else(|e| panic!("cannot read the layer: {e}"));
    let (layer_digest, layer_size) = write_blob(&layer_bytes);
    let mut manifests = Vec::new();
    for (name, config) in [
        // The sandbox's process only has to stay alive; StopPodSandbox kills it.
        (
            PAUSE_IMAGE,
            json!({ "Entrypoint": ["/bin/sleep", "2147483647"], "Env": ["PATH=/bin"] }),
        ),
        (
            BUSYBOX_IMAGE,
            json!({ "Cmd": ["/bin/sh"], "Env": ["PATH=/bin"] }),
        ),
    ] {
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        });
        let (cd, cs) = write_blob(config.to_string().as_bytes());
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs },
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size }],
        });
        let (md, ms) = write_blob(manifest.to_string().as_bytes());
        manifests.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md,
            "size": ms,
            "platform": { "architecture": "amd64", "os": "linux" },
            // containerd names an imported image after this annotation.
            "annotations": { "io.containerd.image.name": name },
        }));
    }
    let index = json!({ "schemaVersion": 2, "manifests": manifests });
    std::fs::write(layout.join("index.json"), index.to_string())
        .unwrap_or_else(|e| panic!("cannot write index.json: {e}"));
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap_or_else(|e| panic!("cannot write oci-layout: {e}"));
    let archive = dir.join("images.tar");
    let mut tar = command(&["tar", "-C"]);
    tar.arg(&layout).arg("-cf").arg(&archive).arg(".");
    run_cmd(tar, None, DEFAULT_TIMEOUT).ok();
    archive
}
