//! The conflist `install` writes: its shape, the pod CIDRs as range sets, and its check
//! with the plugin's own parsers.

use super::*;

#[derive(Serialize)]
pub(super) struct Conflist<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    name: &'a str,
    #[serde(rename = "cni-ebpf.dev/managed")]
    managed: bool,
    plugins: [Plugin<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Plugin<'a> {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cross_node: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    encryption: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    encryption_strict: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uplink: Option<&'a str>,
    ip_masq: bool,
    network_policy: bool,
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
pub(super) struct IpamOut {
    ranges: Vec<Vec<RangeOut>>,
    routes: Vec<RouteOut>,
}

#[derive(Serialize)]
pub(super) struct RangeOut {
    subnet: String,
}

#[derive(Serialize)]
pub(super) struct RouteOut {
    dst: &'static str,
}

/// The pod CIDRs as range sets: one set per family, in the order the families first
/// appear (a pod gets one address per set). Host bits and duplicates are refused.
pub(super) fn range_sets(pod_cidrs: &[IpNet]) -> Result<Vec<Vec<IpNet>>> {
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

pub(super) fn check_conf_name(name: &str) -> Result<()> {
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
            cross_node: args.cross_node.as_deref(),
            encryption: args.encryption.as_deref(),
            encryption_strict: args
                .encryption_strict
                .filter(|_| args.encryption.as_deref() == Some("wireguard")),
            uplink: args.uplink.as_deref(),
            ip_masq: args.ip_masq,
            network_policy: args.network_policy,
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
pub(super) fn validate(conflist: &[u8]) -> Result<()> {
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
