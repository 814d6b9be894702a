//! What the IPAM tests share: configurations, environments and data
//! directories below the target directory (whose ancestors pass the store's path checks,
//! unlike a sticky world-writable /tmp used as `dataDir` itself).

use std::{collections::HashMap, ffi::OsString, net::IpAddr, path::Path};

use cni_ebpf::{
    cni::{
        config::NetConf,
        env::{Command, Env},
    },
    ipam::{self, Reservation},
};
use serde_json::{json, Value};
use tempfile::TempDir;

/// The network name used by the tests.
pub const NETWORK: &str = "testnet";

/// A fresh data directory below the target directory.
pub fn data_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("ipam-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|e| panic!("creating a data directory: {e}"))
}

/// A network configuration (cniVersion 1.1.0) with this `ipam` object.
pub fn netconf_json(data_dir: &Path, ipam: Value) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "cni-ebpf",
        "dataDir": data_dir,
        "ipam": ipam,
    })
}

/// Parses a configuration document for `command`, panicking with the error.
pub fn parse(doc: &Value, command: Command) -> NetConf {
    NetConf::parse(doc.to_string().as_bytes(), command)
        .unwrap_or_else(|e| panic!("parsing {doc}: {e}"))
}

/// The parsed configuration for ADD.
pub fn netconf(data_dir: &Path, ipam: Value) -> NetConf {
    parse(&netconf_json(data_dir, ipam), Command::Add)
}

/// A validated environment for `command` on `(container_id, ifname)`, with extra
/// variables (e.g. `CNI_ARGS`).
pub fn env(command: &str, container_id: &str, ifname: &str, extra: &[(&str, &str)]) -> Env {
    let mut vars: HashMap<String, String> = HashMap::new();
    vars.insert("CNI_COMMAND".into(), command.into());
    vars.insert("CNI_CONTAINERID".into(), container_id.into());
    vars.insert("CNI_IFNAME".into(), ifname.into());
    vars.insert("CNI_NETNS".into(), format!("/var/run/netns/{container_id}"));
    vars.insert("CNI_PATH".into(), "/usr/lib/cni".into());
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    Env::from_lookup(|k| vars.get(k).map(OsString::from))
        .unwrap_or_else(|e| panic!("building the {command} environment: {e}"))
}

/// ADD for `container_id`/eth0; returns the addresses.
pub fn add(conf: &NetConf, container_id: &str) -> Vec<IpAddr> {
    let env = env("ADD", container_id, "eth0", &[]);
    ipam::add(conf, &env, b"{}")
        .unwrap_or_else(|e| panic!("ADD {container_id}: {e}"))
        .ips
        .iter()
        .map(|ip| ip.address.addr())
        .collect()
}

/// DEL for `container_id`/eth0.
pub fn del(conf: &NetConf, container_id: &str) {
    let env = env("DEL", container_id, "eth0", &[]);
    ipam::del(conf, &env, b"{}").unwrap_or_else(|e| panic!("DEL {container_id}: {e}"));
}

/// Every reservation, panicking on error.
pub fn list(conf: &NetConf) -> Vec<Reservation> {
    ipam::list(conf).unwrap_or_else(|e| panic!("listing reservations: {e}"))
}

/// Asserts the store is consistent (no duplicates, no dangling entries) and returns the
/// audit.
pub fn audit_clean(conf: &NetConf) -> ipam::Audit {
    let audit = ipam::audit(conf)
        .unwrap_or_else(|e| panic!("auditing the store: {e}"))
        .unwrap_or_else(|| panic!("the store does not exist"));
    assert!(
        audit.problems.is_empty(),
        "the store is inconsistent: {:#?}",
        audit.problems
    );
    audit
}
