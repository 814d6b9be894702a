//! `cni-ebpf uninstall`, and `--purge` of a network with no pod left.

use super::*;

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
    /// Routes to other nodes' pod CIDRs (host-gw, crossSubnet: `proto 207`) removed by
    /// `--purge`.
    pub routes_removed: usize,
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
pub(super) fn purge_target(args: &UninstallArgs, conflist: Option<&Value>) -> Result<PurgeTarget> {
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
pub(super) fn other_users(dir: &Path, ours: &str) -> Vec<String> {
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

pub(super) fn remove_file(path: &Path) -> Result<bool> {
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
        let (purged, filters, routes) = purge.remove()?;
        report.purged = purged;
        report.filters_removed = filters;
        report.routes_removed = routes;
    }
    Ok(report)
}

/// A network about to be purged: its store opened and locked (while this lives no CNI
/// operation of the network runs) and its pins opened.
pub(super) struct Purge<'a> {
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
                // DELs' finishing processes still purging flows and deleting veths end
                // first (they are quick; one stuck holds nothing up for long).
                if !crate::verbs::del::settled(&store_dir, crate::verbs::del::SETTLE_WAIT)? {
                    tracing::warn!(
                        "a DEL's finishing process of {} is still running after {:?}",
                        store_dir.display(),
                        crate::verbs::del::SETTLE_WAIT
                    );
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
                            crate::ipam::record::split_key_name(&key).unwrap_or((&key, ""));
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

    /// Removes the filters, the tunnel device (if this network made one), the routes to
    /// other nodes' pods, the pins and the store; returns the directories removed, the
    /// number of filters and of routes. Routes are looked at only on a node where the
    /// network's datapath is loaded.
    fn remove(self) -> Result<(Vec<PathBuf>, usize, usize)> {
        let mut removed = Vec::new();
        let mut filters = 0;
        let mut routes = 0;
        let pin_dir = self.target.pin_dir();
        if self.pins_exist {
            if let Some(dp) = &self.datapath {
                filters = dp.remove_filters()?;
                if dp.remove_tunnel()? {
                    tracing::info!(
                        "removed the tunnel device {} and its routes",
                        crate::datapath::tunnel::TUNNEL_DEVICE
                    );
                }
                if dp.remove_wireguard()? {
                    tracing::info!(
                        "removed the WireGuard device {}",
                        crate::datapath::wireguard::WIREGUARD_DEVICE
                    );
                }
                routes = crate::kernel::link::runtime()?.block_on(async {
                    crate::agent::routes::remove_all_routes(&crate::kernel::link::Nl::connect()?).await
                })?;
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
        Ok((removed, filters, routes))
    }
}
