//! `cni-ebpf install` and `cni-ebpf uninstall`: put the plugin on a node (a DaemonSet's init
//! container runs `install` with the host's CNI directories mounted) and take it off again.
//!
//! What a runtime reads is replaced atomically: the binary and the conflist are each written
//! to a temporary file in the destination directory, fsync'ed, given their mode, renamed
//! over the old name, and the directory is fsync'ed. A runtime sees the old file or the new
//! one, never a half-written binary or conflist. Running `install` again with the same
//! inputs writes nothing (the bytes are compared first).
//!
//! Ownership: the conflist carries the top-level key [`MANAGED_KEY`] (`true`). A runtime
//! hands a plugin only its own object of the list plus `name` and `cniVersion`, so the key
//! never reaches the plugin's configuration parser. A conflist at the same path without
//! the key is someone else's: `install` and `uninstall` refuse to touch it unless told to
//! with `--force`.
//!
//! Pod CIDRs: `--pod-cidr` (or `CNI_EBPF_POD_CIDR`) when given; otherwise, with a node name
//! (`--node-name` / `NODE_NAME`), the Node object's `spec.podCIDRs` read from the API server
//! ([`node_lookup`]). The lookup happens before anything is written.
//!
//! `uninstall --purge` also removes a network's pins (`<bpffsRoot>/<network>`) and IPAM
//! store (`<dataDir>/<network>`), but only when no pod is left on it: no reservation of
//! this boot in the store (reservations of an earlier boot belong to namespaces that died
//! with it, see [`crate::ipam`]) and no entry in the datapath's owner map.

use std::{
    collections::BTreeMap,
    fs::{self, File, Permissions},
    io::{self, Write as _},
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, SystemTime},
};

mod conflist;
mod files;
mod node_lookup;
mod uninstall;

use ipnet::IpNet;
use serde::Serialize;
use serde_json::Value;

use self::{conflist::*, files::*};
pub use self::{
    conflist::{is_managed, plugin_config, render_conflist},
    uninstall::{uninstall, PurgeTarget, UninstallReport},
};
use crate::{
    cni::{
        config::{NetConf, DEFAULT_BPFFS_ROOT, DEFAULT_DATA_DIR},
        env::{check_identifier, Command},
    },
    datapath::{load::check_bpffs, Datapath},
    error::Error,
    ipam::{store::Store, Ipam, StoreOptions},
    k8s::{ApiArgs, ApiError},
};

/// The conflist key that marks a conflist as written by `cni-ebpf install`.
pub const MANAGED_KEY: &str = "cni-ebpf.dev/managed";
/// Default `--cni-bin-dir`.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Default `--cni-conf-dir`.
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// Default `--conf-name`.
pub const DEFAULT_CONF_NAME: &str = "10-cni-ebpf.conflist";
/// Default `--network-name`.
pub const DEFAULT_NETWORK_NAME: &str = "k8s-pod-network";
/// Default `--cni-version`: what libcni 1.1.2-based runtimes (containerd 1.6/1.7) can read.
pub const DEFAULT_CNI_VERSION: &str = "1.0.0";
/// The plugin's file name in the CNI binary directory (the conflist's `type`).
pub const BINARY_NAME: &str = "cni-ebpf";
/// Prefix of the temporary files `install` writes next to their destination.
pub const TMP_PREFIX: &str = ".cni-ebpf-install-";
/// A temporary file of ours older than this was left by a killed `install` and is removed.
const STALE_TMP: Duration = Duration::from_secs(600);
/// The capabilities the conflist declares (the runtime passes their arguments as
/// `runtimeConfig`).
const CAPABILITIES: [&str; 5] = ["portMappings", "ips", "mac", "bandwidth", "ipRanges"];

/// The host directories `install` and `uninstall` work on, as mounted in this container.
#[derive(Debug, Clone, clap::Args)]
pub struct HostDirs {
    /// The host's CNI binary directory (where the runtime looks for plugins).
    #[arg(long, default_value = DEFAULT_CNI_BIN_DIR)]
    pub cni_bin_dir: PathBuf,
    /// The host's CNI configuration directory.
    #[arg(long, default_value = DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// File name of the conflist in `--cni-conf-dir`. Runtimes use the first file in
    /// lexical order (containerd loads only that one by default).
    #[arg(long, default_value = DEFAULT_CONF_NAME)]
    pub conf_name: String,
}

/// `cni-ebpf install`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub dirs: HostDirs,
    /// The node's pod CIDR; repeat (or separate with commas) for dual stack. Each becomes an
    /// `ipam.ranges` entry: one range set per family. When given, the Node is not read.
    #[arg(long = "pod-cidr", env = "CNI_EBPF_POD_CIDR", value_delimiter = ',')]
    pub pod_cidrs: Vec<IpNet>,
    /// This node's name (the Node object's metadata.name; in a DaemonSet, NODE_NAME from the
    /// downward API, fieldRef spec.nodeName). Without --pod-cidr, the pod CIDRs are read
    /// from this Node's spec.podCIDRs.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
    /// The network's `name` (selects the pin and IPAM store directories).
    #[arg(long, default_value = DEFAULT_NETWORK_NAME)]
    pub network_name: String,
    /// The conflist's `cniVersion`. 1.0.0 suits every runtime; containerd ≥ 2.0.1 and
    /// CRI-O can use 1.1.0 (STATUS, GC), which libcni 1.1.2-based runtimes cannot read.
    #[arg(long, default_value = DEFAULT_CNI_VERSION)]
    pub cni_version: String,
    /// `uplink` (default: the device of the default route).
    #[arg(long)]
    pub uplink: Option<String>,
    /// `clusterCIDRs`: destinations never masqueraded (the cluster's pod CIDR, …); repeat or
    /// separate with commas.
    #[arg(
        long = "cluster-cidr",
        env = "CNI_EBPF_CLUSTER_CIDR",
        value_delimiter = ','
    )]
    pub cluster_cidrs: Vec<IpNet>,
    /// `ipMasq`: masquerade pod traffic leaving the cluster.
    #[arg(long, env = "CNI_EBPF_IP_MASQ")]
    pub ip_masq: bool,
    /// `networkPolicy`: NetworkPolicy enforced on the network by the node's agent, pods
    /// closed until it has put the policy in force (the agent's `--policy` reads the same
    /// setting, `CNI_EBPF_NETWORK_POLICY`).
    #[arg(long, env = "CNI_EBPF_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    pub network_policy: bool,
    /// `mtu` of both veth ends; by default none is written, and pods get the path's MTU
    /// (the uplink's, less the tunnel's headers in the tunnel modes), found on the node.
    #[arg(long, env = "CNI_EBPF_MTU")]
    pub mtu: Option<u32>,
    /// `crossNode`: how pods reach other nodes' pods (`routed`, `tunnel`, `crossSubnet`);
    /// by default none is written (routed).
    #[arg(long, env = "CNI_EBPF_CROSS_NODE", value_parser = ["routed", "tunnel", "crossSubnet"])]
    pub cross_node: Option<String>,
    /// `encryption`: `wireguard` puts pod traffic between nodes inside WireGuard (the
    /// agent makes and publishes the keys); by default none is written (no encryption).
    #[arg(long, env = "CNI_EBPF_ENCRYPTION", value_parser = ["none", "wireguard"])]
    pub encryption: Option<String>,
    /// `encryptionStrict`: `false` reaches a node without a published key in clear
    /// (default: unreachable). Written only with `--encryption wireguard`.
    #[arg(long, env = "CNI_EBPF_ENCRYPTION_STRICT", action = clap::ArgAction::Set)]
    pub encryption_strict: Option<bool>,
    /// `attach`: how programs are attached (`tc`, `tcx` or `auto`).
    #[arg(long, value_parser = ["tc", "tcx", "auto"])]
    pub attach: Option<String>,
    /// `bpffsRoot` (the agent's `--bpffs-root` reads the same setting).
    #[arg(long, env = "CNI_EBPF_BPFFS_ROOT", default_value = DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,
    /// `dataDir` (the agent's `--data-dir` reads the same setting).
    #[arg(long, env = "CNI_EBPF_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// `logFile` (none by default).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// `logLevel`.
    #[arg(long, env = "CNI_EBPF_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Replace a conflist at the same path that `install` did not write.
    #[arg(long)]
    pub force: bool,
}

/// `cni-ebpf uninstall`.
#[derive(Debug, Clone, clap::Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub dirs: HostDirs,
    /// Remove a conflist at the path that `install` did not write, and the binary even
    /// when another conflist still uses it.
    #[arg(long)]
    pub force: bool,
    /// Also remove the network's pins and IPAM store (refused while pods are left).
    #[arg(long)]
    pub purge: bool,
    /// The network to purge (default: the conflist's `name`, else k8s-pod-network).
    #[arg(long)]
    pub network_name: Option<String>,
    /// Its `bpffsRoot` (default: the conflist's, else /sys/fs/bpf/cni-ebpf).
    #[arg(long)]
    pub bpffs_root: Option<PathBuf>,
    /// Its `dataDir` (default: the conflist's, else /var/lib/cni-ebpf).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Once done, keep running until stopped (the uninstall DaemonSet's container: a pod
    /// Ready on every node means every node is clean; a failure exits and restarts).
    #[arg(long)]
    pub stay: bool,
}

/// Why `install` or `uninstall` failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No pod CIDR was given.
    #[error(
        "no pod CIDR: pass the node's pod CIDR(s) with --pod-cidr (repeatable, IPv4 and/or \
         IPv6) or CNI_EBPF_POD_CIDR (comma-separated), or the node's name with --node-name or \
         NODE_NAME to read them from its Node object"
    )]
    NoPodCidr,

    /// The Node lookup failed.
    #[error("reading the pod CIDRs of node {node:?} from the API server: {source}")]
    NodeLookup {
        /// The node name.
        node: String,
        /// Why (boxed: it is large and rare).
        #[source]
        source: Box<ApiError>,
    },

    /// The Node has no usable pod CIDR.
    #[error("node {node:?} {reason}")]
    NodeCidr {
        /// The node name.
        node: String,
        /// What is wrong with its spec.podCIDRs.
        reason: String,
    },

    /// A flag's value is unusable.
    #[error("{flag} {value}: {reason}")]
    BadFlag {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// Why.
        reason: String,
    },

    /// The conflist path holds a file `install` did not write.
    #[error(
        "{path} was not written by cni-ebpf install (it has no \"{MANAGED_KEY}\": true); \
         refusing to {action} it without --force"
    )]
    Foreign {
        /// The conflist path.
        path: PathBuf,
        /// `replace` or `remove`.
        action: &'static str,
    },

    /// The conflist `install` would write does not pass the plugin's own parser.
    #[error("the conflist would be invalid: {0}")]
    Invalid(#[source] Error),

    /// `uninstall --purge` found pods on the network.
    #[error(
        "network {network} still has {} pod attachment(s): {}; delete those pods (or drain \
         the node) first: {done}",
        pods.len(),
        pods.join(", ")
    )]
    PodsLeft {
        /// The network.
        network: String,
        /// The attachments, `<container ID>/<ifname> (<addresses>)`.
        pods: Vec<String>,
        /// What was already done when this was found.
        done: &'static str,
    },

    /// A path `--purge` would remove is not what it should be.
    #[error("refusing to purge {path}: {reason}")]
    Unsafe {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },

    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// An error of the plugin's own machinery (IPAM store, datapath).
    #[error(transparent)]
    Plugin(#[from] Error),
}

type Result<T, E = InstallError> = std::result::Result<T, E>;

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> InstallError {
    let context = context.into();
    move |source| InstallError::Io { context, source }
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// There was none; it was written.
    Written,
    /// There was another one; it was replaced.
    Replaced,
    /// It already had these bytes; nothing was written.
    Unchanged,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Replaced => "replaced",
            Self::Unchanged => "unchanged",
        }
    }
}

/// What `install` did.
#[derive(Debug, Clone)]
pub struct InstallReport {
    /// The binary's path and what happened to it.
    pub binary: (PathBuf, Outcome),
    /// The conflist's path and what happened to it.
    pub conflist: (PathBuf, Outcome),
    /// Configuration files that sort before ours (a runtime would use the first one).
    pub shadowed_by: Vec<String>,
    /// The pod CIDRs written.
    pub pod_cidrs: Vec<IpNet>,
    /// The Node they were read from (`None`: from the flags).
    pub from_node: Option<String>,
}

/// `cni-ebpf install`: the binary first (a conflist must never name a plugin that is not
/// there yet), then the conflist.
pub fn install(args: &InstallArgs) -> Result<InstallReport> {
    check_conf_name(&args.dirs.conf_name)?;
    // Everything is checked, and the Node read, before anything is written.
    let looked_up;
    let (args, from_node) = match (&args.node_name, args.pod_cidrs.is_empty()) {
        (Some(node), true) if !node.is_empty() => {
            let mut a = args.clone();
            a.pod_cidrs = node_lookup::pod_cidrs_from_node(args, node)?;
            looked_up = a;
            (&looked_up, Some(node.clone()))
        }
        _ => (args, None),
    };
    let conflist = render_conflist(args)?;
    let conf_dir = &args.dirs.cni_conf_dir;
    let conf_path = conf_dir.join(&args.dirs.conf_name);
    if !args.force {
        if let Some(existing) = read_existing(&conf_path)? {
            if !existing.as_deref().is_some_and(is_managed) {
                return Err(InstallError::Foreign {
                    path: conf_path,
                    action: "replace",
                });
            }
        }
    }
    let binary = install_binary(&args.dirs.cni_bin_dir)?;
    create_dir(conf_dir)?;
    sweep_stale_tmp(conf_dir);
    let outcome = install_conflist(&conf_path, &conflist, args.force)?;
    let shadowed_by = config_files(conf_dir)
        .into_iter()
        .take_while(|n| *n != args.dirs.conf_name)
        .collect();
    Ok(InstallReport {
        binary,
        conflist: (conf_path, outcome),
        shadowed_by,
        pod_cidrs: args.pod_cidrs.clone(),
        from_node,
    })
}

// ------------------------------------------------------------------- entry points

/// Runs `cni-ebpf install` and reports on stdout.
#[must_use]
pub fn run_install(args: &InstallArgs) -> ExitCode {
    match install(args) {
        Ok(r) => {
            println!("binary {}: {}", r.binary.0.display(), r.binary.1.as_str());
            println!(
                "conflist {}: {} (network {}, cniVersion {}, pod CIDRs {}{})",
                r.conflist.0.display(),
                r.conflist.1.as_str(),
                args.network_name,
                args.cni_version,
                r.pod_cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                r.from_node
                    .as_ref()
                    .map(|n| format!(" from Node {n:?}"))
                    .unwrap_or_default()
            );
            if !r.shadowed_by.is_empty() {
                eprintln!(
                    "cni-ebpf install: warning: {} sort(s) before {} in {}; runtimes use the \
                     first configuration file, so cni-ebpf is not the one in use",
                    r.shadowed_by.join(", "),
                    args.dirs.conf_name,
                    args.dirs.cni_conf_dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail("install", &e),
    }
}

/// Runs `cni-ebpf uninstall` and reports on stdout.
#[must_use]
pub fn run_uninstall(args: &UninstallArgs) -> ExitCode {
    match uninstall(args) {
        Ok(r) => {
            match &r.conflist_removed {
                Some(p) => println!("conflist {}: removed", p.display()),
                None => println!("conflist: none to remove"),
            }
            match (&r.binary_removed, r.binary_kept_for.is_empty()) {
                (Some(p), _) => println!("binary {}: removed", p.display()),
                (None, false) => println!(
                    "binary: kept, still used by {} (--force removes it)",
                    r.binary_kept_for.join(", ")
                ),
                (None, true) => println!("binary: none to remove"),
            }
            for p in &r.purged {
                println!("purged {}", p.display());
            }
            if args.purge {
                println!("tc filters removed: {}", r.filters_removed);
                println!("routes to other nodes' pods removed: {}", r.routes_removed);
            }
            if args.stay {
                println!("done; staying until stopped");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail("uninstall", &e),
    }
}

fn fail(what: &str, e: &InstallError) -> ExitCode {
    // Every variant's message already carries its cause.
    eprintln!("cni-ebpf {what}: {e}");
    ExitCode::FAILURE
}
