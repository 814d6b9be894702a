//! Network configuration builders: the cni-ebpf plugin object, alone (stdin for a direct
//! invocation) or in a conflist with chained plugins (for libcni).

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// Default IPv4 pod subnet of a simulated node.
pub const POD_SUBNET_V4: &str = "10.244.1.0/24";
/// Default IPv6 pod subnet of a simulated node.
pub const POD_SUBNET_V6: &str = "fd00:10:244:1::/64";
/// Every spec version the plugin claims.
pub const ALL_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// The versions libcni 1.1.2 can parse results of (it stops at 1.0.0).
pub const LIBCNI_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// Builds the configuration of one network, pointing every path at a test's own dirs.
#[derive(Debug, Clone)]
pub struct ConfBuilder {
    cni_version: String,
    name: String,
    subnets: Vec<String>,
    bpffs_root: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    uplink: Option<String>,
    extra: Map<String, Value>,
    ipam: Option<Value>,
    chain: Vec<Value>,
}

impl ConfBuilder {
    /// cniVersion 1.0.0, network `testnet`, dual stack on the default subnets, with pins,
    /// store and log below the given paths.
    #[must_use]
    pub fn new(bpffs_root: &Path, data_dir: &Path, log_file: &Path) -> Self {
        Self {
            cni_version: "1.0.0".into(),
            name: "testnet".into(),
            subnets: vec![POD_SUBNET_V4.into(), POD_SUBNET_V6.into()],
            bpffs_root: bpffs_root.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            log_file: log_file.to_path_buf(),
            uplink: None,
            extra: Map::new(),
            ipam: None,
            chain: Vec::new(),
        }
    }

    /// Sets `cniVersion`.
    #[must_use]
    pub fn version(mut self, v: &str) -> Self {
        v.clone_into(&mut self.cni_version);
        self
    }

    /// Sets the network `name`.
    #[must_use]
    pub fn name(mut self, n: &str) -> Self {
        n.clone_into(&mut self.name);
        self
    }

    /// One range set per subnet (`ipam.ranges`).
    #[must_use]
    pub fn subnets(mut self, subnets: &[&str]) -> Self {
        self.subnets = subnets.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Sets the plugin's `uplink`.
    #[must_use]
    pub fn uplink(mut self, dev: &str) -> Self {
        self.uplink = Some(dev.to_owned());
        self
    }

    /// Masquerades traffic leaving `cluster_cidr` (`ipMasq`, `clusterCIDRs`).
    #[must_use]
    pub fn masquerading(self, cluster_cidr: &str) -> Self {
        self.set("ipMasq", Value::Bool(true)).set(
            "clusterCIDRs",
            Value::Array(vec![Value::String(cluster_cidr.to_owned())]),
        )
    }

    /// Sets (or overrides) any field of the cni-ebpf plugin object; `Value::Null` removes
    /// it (for testing defaults and missing fields).
    #[must_use]
    pub fn set(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// Replaces the whole `ipam` object.
    #[must_use]
    pub fn ipam(mut self, ipam: Value) -> Self {
        self.ipam = Some(ipam);
        self
    }

    /// Appends a plugin after cni-ebpf in the conflist (e.g. `{"type": "tuning", …}`).
    #[must_use]
    pub fn then(mut self, plugin: Value) -> Self {
        self.chain.push(plugin);
        self
    }

    /// The cni-ebpf plugin object as it appears in a conflist (no name/cniVersion).
    #[must_use]
    pub fn plugin_object(&self) -> Value {
        let ranges: Vec<Value> = self
            .subnets
            .iter()
            .map(|s| json!([{ "subnet": s }]))
            .collect();
        let mut routes = Vec::new();
        if self.subnets.iter().any(|s| !s.contains(':')) {
            routes.push(json!({ "dst": "0.0.0.0/0" }));
        }
        if self.subnets.iter().any(|s| s.contains(':')) {
            routes.push(json!({ "dst": "::/0" }));
        }
        let mut obj = json!({
            "type": "cni-ebpf",
            "bpffsRoot": self.bpffs_root,
            "dataDir": self.data_dir,
            "logFile": self.log_file,
            "logLevel": "debug",
            "capabilities": { "portMappings": true, "ips": true, "mac": true },
            // No socket hooks by default: without `cgroupPath` they go on the machine's
            // cgroup2 root. Tests of the node's own sockets pass a cgroup of their own.
            "cgroupPath": "",
            // Pods open until an agent swaps a policy in, as before the first sync on a
            // network that does not wait for one; the tests of the fail-closed start set
            // it (the plugin's default is `true`).
            "networkPolicy": false,
            "ipam": self.ipam.clone().unwrap_or_else(|| json!({ "ranges": ranges, "routes": routes })),
        });
        let Value::Object(map) = &mut obj else {
            unreachable!("json! object literal")
        };
        if let Some(u) = &self.uplink {
            map.insert("uplink".into(), json!(u));
        }
        for (k, v) in &self.extra {
            if v.is_null() {
                map.remove(k);
            } else {
                map.insert(k.clone(), v.clone());
            }
        }
        obj
    }

    /// The plugin's stdin for a direct invocation: the plugin object with `cniVersion`
    /// and `name`, as a runtime injects them.
    #[must_use]
    pub fn plugin(&self) -> Value {
        let mut obj = self.plugin_object();
        if let Value::Object(map) = &mut obj {
            map.insert("cniVersion".into(), json!(self.cni_version));
            map.insert("name".into(), json!(self.name));
        }
        obj
    }

    /// The conflist: cni-ebpf first, then the chained plugins.
    #[must_use]
    pub fn conflist(&self) -> Value {
        let mut plugins = vec![self.plugin_object()];
        plugins.extend(self.chain.iter().cloned());
        json!({ "cniVersion": self.cni_version, "name": self.name, "plugins": plugins })
    }
}
