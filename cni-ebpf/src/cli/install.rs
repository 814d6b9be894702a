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

use ipnet::IpNet;
use serde::Serialize;
use serde_json::Value;

use crate::{
    cni::{
        config::{NetConf, DEFAULT_BPFFS_ROOT, DEFAULT_DATA_DIR, DEFAULT_MTU},
        env::{check_identifier, Command},
    },
    datapath::{load::check_bpffs, Datapath},
    error::Error,
    ipam::{store::Store, Ipam, StoreOptions},
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
    /// `ipam.ranges` entry: one range set per family.
    #[arg(long = "pod-cidr", env = "CNI_EBPF_POD_CIDR", value_delimiter = ',')]
    pub pod_cidrs: Vec<IpNet>,
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
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidrs: Vec<IpNet>,
    /// `ipMasq`: masquerade pod traffic leaving the cluster.
    #[arg(long)]
    pub ip_masq: bool,
    /// `mtu` of both veth ends.
    #[arg(long, default_value_t = DEFAULT_MTU)]
    pub mtu: u32,
    /// `attach`: how programs are attached (`tc`, `tcx` or `auto`).
    #[arg(long, value_parser = ["tc", "tcx", "auto"])]
    pub attach: Option<String>,
    /// `bpffsRoot`.
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,
    /// `dataDir`.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// `logFile` (none by default).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// `logLevel`.
    #[arg(long)]
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
}

/// Why `install` or `uninstall` failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No pod CIDR was given.
    #[error(
        "no pod CIDR: pass the node's pod CIDR(s) with --pod-cidr (repeatable, IPv4 and/or \
         IPv6) or CNI_EBPF_POD_CIDR (comma-separated)"
    )]
    NoPodCidr,

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
}

// ------------------------------------------------------------------- the conflist

#[derive(Serialize)]
struct Conflist<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    name: &'a str,
    #[serde(rename = "cni-ebpf.dev/managed")]
    managed: bool,
    plugins: [Plugin<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Plugin<'a> {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    mtu: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    uplink: Option<&'a str>,
    ip_masq: bool,
    #[serde(rename = "clusterCIDRs", skip_serializing_if = "Vec::is_empty")]
    cluster_cidrs: Vec<String>,
    bpffs_root: &'a Path,
    data_dir: &'a Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_file: Option<&'a Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_level: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attach: Option<&'a str>,
    capabilities: BTreeMap<&'static str, bool>,
    ipam: IpamOut,
}

#[derive(Serialize)]
struct IpamOut {
    ranges: Vec<Vec<RangeOut>>,
    routes: Vec<RouteOut>,
}

#[derive(Serialize)]
struct RangeOut {
    subnet: String,
}

#[derive(Serialize)]
struct RouteOut {
    dst: &'static str,
}

/// The pod CIDRs as range sets: one set per family, in the order the families first
/// appear (a pod gets one address per set). Host bits and duplicates are refused.
fn range_sets(pod_cidrs: &[IpNet]) -> Result<Vec<Vec<IpNet>>> {
    if pod_cidrs.is_empty() {
        return Err(InstallError::NoPodCidr);
    }
    let mut sets: Vec<Vec<IpNet>> = Vec::new();
    for &cidr in pod_cidrs {
        if cidr.trunc() != cidr {
            return Err(InstallError::BadFlag {
                flag: "--pod-cidr",
                value: cidr.to_string(),
                reason: format!("has host bits set; the network is {}", cidr.trunc()),
            });
        }
        let v4 = matches!(cidr, IpNet::V4(_));
        match sets
            .iter_mut()
            .find(|s| s.first().is_some_and(|c| matches!(c, IpNet::V4(_)) == v4))
        {
            Some(set) if set.contains(&cidr) => {
                return Err(InstallError::BadFlag {
                    flag: "--pod-cidr",
                    value: cidr.to_string(),
                    reason: "is given twice".into(),
                })
            }
            Some(set) => set.push(cidr),
            None => sets.push(vec![cidr]),
        }
    }
    Ok(sets)
}

fn check_conf_name(name: &str) -> Result<()> {
    let reason = if name.contains('/') || name.starts_with('.') {
        Some("must be a plain file name (no `/`, not hidden)")
    } else if !name.ends_with(".conflist") || name.len() == ".conflist".len() {
        Some("must end in .conflist (runtimes read other suffixes as single configurations)")
    } else {
        None
    };
    match reason {
        Some(r) => Err(InstallError::BadFlag {
            flag: "--conf-name",
            value: name.to_owned(),
            reason: r.into(),
        }),
        None => Ok(()),
    }
}

/// The conflist `install` writes for `args`, byte for byte (pretty JSON, newline at the
/// end), checked with the plugin's own parser as a runtime would hand it over.
pub fn render_conflist(args: &InstallArgs) -> Result<Vec<u8>> {
    let sets = range_sets(&args.pod_cidrs)?;
    let mut routes = Vec::new();
    for set in &sets {
        routes.push(RouteOut {
            dst: match set.first() {
                Some(IpNet::V6(_)) => "::/0",
                _ => "0.0.0.0/0",
            },
        });
    }
    let doc = Conflist {
        cni_version: &args.cni_version,
        name: &args.network_name,
        managed: true,
        plugins: [Plugin {
            plugin_type: BINARY_NAME,
            mtu: args.mtu,
            uplink: args.uplink.as_deref(),
            ip_masq: args.ip_masq,
            cluster_cidrs: args.cluster_cidrs.iter().map(ToString::to_string).collect(),
            bpffs_root: &args.bpffs_root,
            data_dir: &args.data_dir,
            log_file: args.log_file.as_deref(),
            log_level: args.log_level.as_deref(),
            attach: args.attach.as_deref(),
            capabilities: CAPABILITIES.iter().map(|c| (*c, true)).collect(),
            ipam: IpamOut {
                ranges: sets
                    .iter()
                    .map(|s| {
                        s.iter()
                            .map(|c| RangeOut {
                                subnet: c.to_string(),
                            })
                            .collect()
                    })
                    .collect(),
                routes,
            },
        }],
    };
    let mut bytes = serde_json::to_vec_pretty(&doc).map_err(|e| {
        InstallError::Invalid(Error::Decode {
            what: "the conflist".into(),
            reason: e.to_string(),
        })
    })?;
    bytes.push(b'\n');
    validate(&bytes)?;
    Ok(bytes)
}

/// The plugin's configuration as a runtime hands it over: the first `cni-ebpf` plugin
/// object of the conflist with the list's `name` and `cniVersion` added.
pub fn plugin_config(conflist: &Value) -> Option<Value> {
    let mut plugin = conflist
        .get("plugins")?
        .as_array()?
        .iter()
        .find(|p| p.get("type").and_then(Value::as_str) == Some(BINARY_NAME))?
        .clone();
    let obj = plugin.as_object_mut()?;
    for key in ["name", "cniVersion"] {
        if let Some(v) = conflist.get(key) {
            obj.insert(key.into(), v.clone());
        }
    }
    Some(plugin)
}

/// Parses the conflist's plugin object with the plugin's parser (and its IPAM section with
/// the IPAM parser), as ADD would; an unknown key is an error here rather than a warning on
/// every ADD.
fn validate(conflist: &[u8]) -> Result<()> {
    let doc: Value = serde_json::from_slice(conflist).map_err(|e| {
        InstallError::Invalid(Error::Decode {
            what: "the conflist".into(),
            reason: e.to_string(),
        })
    })?;
    let plugin = plugin_config(&doc)
        .ok_or_else(|| InstallError::Invalid(Error::config("plugins", "has no cni-ebpf plugin")))?;
    let conf = NetConf::parse(plugin.to_string().as_bytes(), Command::Add)
        .map_err(InstallError::Invalid)?;
    if let Some(key) = conf.unknown_keys.first() {
        return Err(InstallError::Invalid(Error::config(
            key.clone(),
            "is not a key the plugin knows",
        )));
    }
    match Ipam::parse(&conf.ipam).map_err(InstallError::Invalid)? {
        Ipam::Embedded(_) => Ok(()),
        Ipam::Delegate(_) => Err(InstallError::Invalid(Error::config(
            "ipam.type",
            "must be the embedded allocator",
        ))),
    }
}

/// Whether `bytes` are a conflist `install` wrote.
#[must_use]
pub fn is_managed(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .is_ok_and(|v| v.get(MANAGED_KEY) == Some(&Value::Bool(true)))
}

// ------------------------------------------------------------------- files

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync'ed
/// and given `mode`, renamed over `path`; then the directory is fsync'ed. On failure the
/// temporary file is removed and `path` is as it was.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = parent(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(dir)
        .map_err(io_err(format!(
            "creating a temporary file in {}",
            dir.display()
        )))?;
    let what = format!("writing {}", tmp.path().display());
    tmp.write_all(bytes).map_err(io_err(what.clone()))?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(io_err(what.clone()))?;
    tmp.as_file().sync_all().map_err(io_err(what))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .map_err(io_err(format!("renaming into {}", path.display())))?;
    sync_dir(dir)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(format!("syncing {}", dir.display())))
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))
}

/// Removes temporary files a killed `install` left in `dir` (older than [`STALE_TMP`], so
/// that a concurrent `install`'s file in the making is never touched).
fn sweep_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(std::result::Result::ok) {
        let stale = e.file_name().to_string_lossy().starts_with(TMP_PREFIX)
            && e.metadata().is_ok_and(|m| {
                m.is_file()
                    && m.modified()
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age > STALE_TMP)
            });
        if stale {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Reads `path` if it is a regular file (`None`: nothing there). A symlink or anything
/// else is returned as foreign content (`Some(None)`).
fn read_existing(path: &Path) -> Result<Option<Option<Vec<u8>>>> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("inspecting {}", path.display()))(e)),
        Ok(m) if !m.is_file() => Ok(Some(None)),
        Ok(_) => fs::read(path)
            .map(|b| Some(Some(b)))
            .map_err(io_err(format!("reading {}", path.display()))),
    }
}

/// Copies this binary to `<bin dir>/cni-ebpf` unless it already has these bytes (then only
/// its mode is fixed if needed).
fn install_binary(bin_dir: &Path) -> Result<(PathBuf, Outcome)> {
    let target = bin_dir.join(BINARY_NAME);
    let exe = Path::new("/proc/self/exe");
    let bytes = fs::read(exe).map_err(io_err("reading this binary (/proc/self/exe)"))?;
    create_dir(bin_dir)?;
    sweep_stale_tmp(bin_dir);
    let outcome = match read_existing(&target)? {
        None => Outcome::Written,
        Some(Some(old)) if old == bytes => {
            let meta = fs::metadata(&target)
                .map_err(io_err(format!("inspecting {}", target.display())))?;
            if meta.mode() & 0o7777 != 0o755 {
                fs::set_permissions(&target, Permissions::from_mode(0o755))
                    .map_err(io_err(format!("setting the mode of {}", target.display())))?;
            }
            return Ok((target, Outcome::Unchanged));
        }
        Some(_) => Outcome::Replaced,
    };
    write_atomic(&target, &bytes, 0o755)?;
    Ok((target, outcome))
}

/// Writes the conflist unless it already has these bytes; a foreign one at the path is
/// refused unless `force`.
fn install_conflist(path: &Path, bytes: &[u8], force: bool) -> Result<Outcome> {
    let outcome = match read_existing(path)? {
        None => Outcome::Written,
        Some(Some(old)) if old == bytes => return Ok(Outcome::Unchanged),
        Some(Some(old)) if is_managed(&old) => Outcome::Replaced,
        Some(_) if force => Outcome::Replaced,
        Some(_) => {
            return Err(InstallError::Foreign {
                path: path.to_owned(),
                action: "replace",
            })
        }
    };
    write_atomic(path, bytes, 0o644)?;
    Ok(outcome)
}

/// The configuration files in `dir` a runtime would consider (`.conf`, `.conflist`,
/// `.json`, as libcni lists them), sorted as runtimes sort them.
fn config_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(std::result::Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            !n.starts_with('.')
                && [".conf", ".conflist", ".json"]
                    .iter()
                    .any(|s| n.ends_with(s))
        })
        .collect();
    names.sort();
    names
}

/// `cni-ebpf install`: the binary first (a conflist must never name a plugin that is not
/// there yet), then the conflist.
pub fn install(args: &InstallArgs) -> Result<InstallReport> {
    check_conf_name(&args.dirs.conf_name)?;
    // Everything is checked before anything is written.
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
    })
}

// ------------------------------------------------------------------- uninstall

/// What `uninstall` did.
#[derive(Debug, Clone, Default)]
pub struct UninstallReport {
    /// The conflist, if one was removed.
    pub conflist_removed: Option<PathBuf>,
    /// The binary, if it was removed.
    pub binary_removed: Option<PathBuf>,
    /// Other conflists still using the binary (it was kept).
    pub binary_kept_for: Vec<String>,
    /// What `--purge` removed.
    pub purged: Vec<PathBuf>,
    /// Filters taken off interfaces by `--purge`.
    pub filters_removed: usize,
}

/// The network `--purge` works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeTarget {
    /// Network name.
    pub network: String,
    /// `bpffsRoot`.
    pub bpffs_root: PathBuf,
    /// `dataDir`.
    pub data_dir: PathBuf,
}

impl PurgeTarget {
    fn pin_dir(&self) -> PathBuf {
        self.bpffs_root.join(&self.network)
    }

    fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.network)
    }
}

/// The flags, else the conflist's values, else the defaults.
fn purge_target(args: &UninstallArgs, conflist: Option<&Value>) -> Result<PurgeTarget> {
    let plugin = conflist.and_then(plugin_config);
    let from_conf = |key: &str| {
        plugin
            .as_ref()
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let network = args
        .network_name
        .clone()
        .or_else(|| from_conf("name"))
        .unwrap_or_else(|| DEFAULT_NETWORK_NAME.to_owned());
    if let Some(reason) = check_identifier(&network) {
        return Err(InstallError::BadFlag {
            flag: "--network-name",
            value: network,
            reason,
        });
    }
    let path = |flag: &'static str, given: &Option<PathBuf>, key: &str, default: &str| {
        let p = given
            .clone()
            .or_else(|| from_conf(key).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(default));
        if p.is_absolute()
            && !p
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            Ok(p)
        } else {
            Err(InstallError::BadFlag {
                flag,
                value: p.display().to_string(),
                reason: "must be an absolute path without `..`".into(),
            })
        }
    };
    Ok(PurgeTarget {
        bpffs_root: path(
            "--bpffs-root",
            &args.bpffs_root,
            "bpffsRoot",
            DEFAULT_BPFFS_ROOT,
        )?,
        data_dir: path("--data-dir", &args.data_dir, "dataDir", DEFAULT_DATA_DIR)?,
        network,
    })
}

/// Other configuration files in `dir` with a `cni-ebpf` plugin (they still need the
/// binary).
fn other_users(dir: &Path, ours: &str) -> Vec<String> {
    config_files(dir)
        .into_iter()
        .filter(|n| n != ours)
        .filter(|n| {
            let Ok(bytes) = fs::read(dir.join(n)) else {
                return false;
            };
            let Ok(doc) = serde_json::from_slice::<Value>(&bytes) else {
                return false;
            };
            doc.get("type").and_then(Value::as_str) == Some(BINARY_NAME)
                || plugin_config(&doc).is_some()
        })
        .collect()
}

fn remove_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(format!("removing {}", path.display()))(e)),
    }
}

/// `cni-ebpf uninstall`: the conflist (runtimes stop using the network), the binary, and
/// with `--purge` the network's pins and IPAM store. With `--purge`, pods left on the
/// network are looked for before anything is removed, and again (under the store's lock)
/// before the pins and the store go.
pub fn uninstall(args: &UninstallArgs) -> Result<UninstallReport> {
    check_conf_name(&args.dirs.conf_name)?;
    let conf_path = args.dirs.cni_conf_dir.join(&args.dirs.conf_name);
    let existing = read_existing(&conf_path)?;
    let doc = match &existing {
        Some(Some(bytes)) => serde_json::from_slice::<Value>(bytes).ok(),
        _ => None,
    };
    if let Some(content) = &existing {
        if !args.force && !content.as_deref().is_some_and(is_managed) {
            return Err(InstallError::Foreign {
                path: conf_path,
                action: "remove",
            });
        }
    }
    let target = args
        .purge
        .then(|| purge_target(args, doc.as_ref()))
        .transpose()?;
    if let Some(t) = &target {
        // Nothing is removed while pods are left.
        let pods = Purge::open(t)?.pods()?;
        if !pods.is_empty() {
            return Err(InstallError::PodsLeft {
                network: t.network.clone(),
                pods,
                done: "nothing was removed",
            });
        }
    }

    let mut report = UninstallReport::default();
    if existing.is_some() && remove_file(&conf_path)? {
        sync_dir(&args.dirs.cni_conf_dir)?;
        report.conflist_removed = Some(conf_path);
    }
    report.binary_kept_for = other_users(&args.dirs.cni_conf_dir, &args.dirs.conf_name);
    if args.force || report.binary_kept_for.is_empty() {
        report.binary_kept_for.clear();
        let bin = args.dirs.cni_bin_dir.join(BINARY_NAME);
        if remove_file(&bin)? {
            sync_dir(&args.dirs.cni_bin_dir)?;
            report.binary_removed = Some(bin);
        }
    }
    if let Some(t) = &target {
        let purge = Purge::open(t)?;
        let pods = purge.pods()?;
        if !pods.is_empty() {
            return Err(InstallError::PodsLeft {
                network: t.network.clone(),
                pods,
                done: "the conflist and the binary were removed, the pins and the store kept",
            });
        }
        let (purged, filters) = purge.remove()?;
        report.purged = purged;
        report.filters_removed = filters;
    }
    Ok(report)
}

/// A network about to be purged: its store opened and locked (while this lives no CNI
/// operation of the network runs) and its pins opened.
struct Purge<'a> {
    target: &'a PurgeTarget,
    store: Option<Store>,
    datapath: Option<Datapath>,
    pins_exist: bool,
}

impl<'a> Purge<'a> {
    fn open(target: &'a PurgeTarget) -> Result<Self> {
        let store_dir = target.store_dir();
        let store = match fs::symlink_metadata(&store_dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(format!("inspecting {}", store_dir.display()))(e)),
            Ok(_) => {
                // Only a directory that is an IPAM store is ever removed: it has the meta
                // record every store gets on its first use.
                let meta = fs::symlink_metadata(store_dir.join("meta"));
                if !meta.is_ok_and(|m| m.is_file()) {
                    return Err(InstallError::Unsafe {
                        path: store_dir,
                        reason: "it does not look like a cni-ebpf IPAM store (no `meta` \
                                 file); remove it by hand if it is one"
                            .into(),
                    });
                }
                let opts = StoreOptions {
                    create: false,
                    ..StoreOptions::default()
                };
                Store::open(&store_dir, &opts)?
            }
        };
        let pin_dir = target.pin_dir();
        let pins_exist = pin_dir.exists();
        let datapath = if pins_exist {
            check_bpffs(&target.bpffs_root).map_err(|e| InstallError::Unsafe {
                path: pin_dir.clone(),
                reason: e.to_string(),
            })?;
            Datapath::open_at(&pin_dir)?
        } else {
            None
        };
        Ok(Self {
            target,
            store,
            datapath,
            pins_exist,
        })
    }

    /// The pod attachments left: reservations of this boot in the store, entries in the
    /// datapath's owner map. `<container ID>/<ifname> (<addresses>)`, sorted.
    fn pods(&self) -> Result<Vec<String>> {
        let mut pods: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        if let Some(store) = &self.store {
            for (key, _) in store.list_keys()? {
                match store.read_key(&key)? {
                    Some((Some(r), _)) if r.boot_id != store.boot_id() => {}
                    Some((Some(r), _)) => {
                        let addrs = r.addresses.iter().map(|a| a.addr().to_string());
                        pods.entry((r.container_id.clone(), r.ifname.clone()))
                            .or_default()
                            .extend(addrs);
                    }
                    // Unreadable: counted, since it cannot be shown to be of an earlier boot.
                    Some((None, _)) => {
                        let (cid, ifname) =
                            crate::ipam::store::split_key_name(&key).unwrap_or((&key, ""));
                        pods.entry((cid.to_owned(), ifname.to_owned())).or_default();
                    }
                    None => {}
                }
            }
        }
        if let Some(dp) = &self.datapath {
            for a in dp.attachments()? {
                pods.entry((a.container_id, a.ifname))
                    .or_default()
                    .extend(a.ips.iter().map(ToString::to_string));
            }
        }
        Ok(pods
            .into_iter()
            .map(|((cid, ifname), mut addrs)| {
                addrs.sort();
                addrs.dedup();
                if addrs.is_empty() {
                    format!("{cid}/{ifname}")
                } else {
                    format!("{cid}/{ifname} ({})", addrs.join(", "))
                }
            })
            .collect())
    }

    /// Removes the filters, the pins and the store; returns the directories removed and
    /// the number of filters.
    fn remove(self) -> Result<(Vec<PathBuf>, usize)> {
        let mut removed = Vec::new();
        let mut filters = 0;
        let pin_dir = self.target.pin_dir();
        if self.pins_exist {
            if let Some(dp) = &self.datapath {
                filters = dp.remove_filters()?;
            }
            drop(self.datapath);
            Datapath::unload_at(&pin_dir)?;
            match fs::remove_dir(&pin_dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(format!("removing {}", pin_dir.display()))(e)),
            }
            removed.push(pin_dir);
        }
        if let Some(store) = self.store {
            // Removed under the store's lock; the lock goes with the directory.
            let dir = store.path().to_owned();
            fs::remove_dir_all(&dir).map_err(io_err(format!("removing {}", dir.display())))?;
            drop(store);
            sync_dir(&self.target.data_dir)?;
            removed.push(dir);
        }
        Ok((removed, filters))
    }
}

// ------------------------------------------------------------------- entry points

/// Runs `cni-ebpf install` and reports on stdout.
#[must_use]
pub fn run_install(args: &InstallArgs) -> ExitCode {
    match install(args) {
        Ok(r) => {
            println!("binary {}: {}", r.binary.0.display(), r.binary.1.as_str());
            println!(
                "conflist {}: {} (network {}, cniVersion {}, pod CIDRs {})",
                r.conflist.0.display(),
                r.conflist.1.as_str(),
                args.network_name,
                args.cni_version,
                args.pod_cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
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
