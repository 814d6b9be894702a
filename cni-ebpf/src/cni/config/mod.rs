//! The network configuration on stdin: the spec's common fields and cni-ebpf's own.
//!
//! Invalid JSON is error 6; JSON of the wrong shape or with invalid values is error 7 and
//! names the field; an unsupported `cniVersion` is error 1. Unknown fields are tolerated.
//!
//! Here: [`NetConf`], how it is parsed and checked, the defaults, and the MAC and file
//! helpers the verbs share. The values the runtime passes per invocation
//! (`runtimeConfig`, `cni.dev/valid-attachments`) are in `runtime.rs`; the options that
//! select a mode (`crossNode`, the tunnel, `cgroupPath`, `attach`, `interface`,
//! `logOptions`) in `options.rs`.

use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::{
    env::{check_identifier, Command},
    result::{CniResult, Dns},
    version::Version,
};
use crate::error::{Error, Result};

mod options;
mod runtime;

use options::{log_rotation, RawLogOptions};
use runtime::{fold_go_capability_keys, with_runtime_ranges};

pub use options::{AttachPolicy, CgroupPath, CrossNode, EncryptionConf, InterfaceKind, TunnelConf};
pub use runtime::{Attachment, Bandwidth, EgressRate, PortMapping, RuntimeConfig};

/// Default root of the pinned eBPF objects.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/cni-ebpf";
/// Default root of the IPAM stores.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni-ebpf";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    cni_version: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "type")]
    plugin_type: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    nat_flows_per_pod: Option<u32>,
    #[serde(default)]
    nat_ports_per_destination: Option<u32>,
    #[serde(default)]
    uplink: Option<String>,
    #[serde(default)]
    ip_masq: Option<bool>,
    #[serde(default)]
    same_node_fast_path: Option<bool>,
    #[serde(default)]
    network_policy: Option<bool>,
    #[serde(default)]
    cross_node: Option<String>,
    #[serde(default)]
    tunnel_port: Option<u32>,
    #[serde(default)]
    tunnel_vni: Option<u32>,
    #[serde(default)]
    encryption: Option<String>,
    #[serde(default)]
    wireguard_port: Option<u32>,
    #[serde(default)]
    encryption_strict: Option<bool>,
    #[serde(default, rename = "clusterCIDRs")]
    cluster_cidrs: Option<Vec<IpNet>>,
    #[serde(default)]
    bpffs_root: Option<PathBuf>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    log_file: Option<PathBuf>,
    #[serde(default)]
    log_level: Option<String>,
    #[serde(default)]
    log_options: Option<RawLogOptions>,
    #[serde(default)]
    runtime_config: Option<RuntimeConfig>,
    #[serde(default)]
    prev_result: Option<Value>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    ipam: Option<Value>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
    #[serde(default)]
    cgroup_path: Option<PathBuf>,
    #[serde(default)]
    attach: Option<String>,
    #[serde(default)]
    interface: Option<String>,
    /// The conflist's capability declarations: for the runtime, not read here.
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "a known key, so that it is not reported as unknown"
    )]
    capabilities: Option<Value>,
}

/// The validated network configuration.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// `cniVersion`.
    pub version: Version,
    /// `name`: the network; selects the pin and data directories.
    pub name: String,
    /// `type`.
    pub plugin_type: String,
    /// `mtu` of both veth ends; `None`: the path's, found on the node
    /// ([`crate::datapath::node_facts::pod_mtu`]).
    pub mtu: Option<u32>,
    /// `natFlowsPerPod`: translated flows (masquerade, host port, hairpin) one pod may
    /// hold in the NAT table at once.
    pub nat_flows_per_pod: u32,
    /// `natPortsPerDestination`: SNAT ports one pod may hold towards one destination
    /// (address, port, protocol); `None`: half the node's SNAT port range
    /// ([`crate::datapath::snat_dest_cap`]).
    pub nat_ports_per_destination: Option<u32>,
    /// `uplink`: the node's outward interface (default: the default route's device).
    pub uplink: Option<String>,
    /// `ipMasq`.
    pub ip_masq: bool,
    /// `sameNodeFastPath` (default true): pod → pod on one node straight into the
    /// destination pod; `false` sends that traffic through the node's netfilter (for an
    /// add-on NetworkPolicy enforcer's FORWARD rules).
    pub same_node_fast_path: bool,
    /// `networkPolicy` (default true): NetworkPolicy is enforced on this network, by the
    /// node's agent; until it has put the cluster's policy in force, every pod is closed
    /// but to its node's traffic. `false`: nothing is judged, and nothing waits for an
    /// agent.
    pub network_policy: bool,
    /// `crossNode`: how pods reach the pods of other nodes.
    pub cross_node: CrossNode,
    /// `tunnelPort`, `tunnelVni`: the tunnel device's UDP port and VXLAN network
    /// identifier (used by the tunnel modes).
    pub tunnel: TunnelConf,
    /// `encryption: wireguard` and its settings (`None`: pod traffic between nodes is
    /// not encrypted).
    pub encryption: Option<EncryptionConf>,
    /// `clusterCIDRs`: destinations never masqueraded.
    pub cluster_cidrs: Vec<IpNet>,
    /// `bpffsRoot`.
    pub bpffs_root: PathBuf,
    /// `dataDir`.
    pub data_dir: PathBuf,
    /// `logFile`.
    pub log_file: Option<PathBuf>,
    /// `logLevel`: error, warn, info, debug, trace.
    pub log_level: String,
    /// `logOptions`: when the log file rotates.
    pub log_rotation: crate::logging::Rotation,
    /// `runtimeConfig`.
    pub runtime_config: RuntimeConfig,
    /// `prevResult`, parsed.
    pub prev_result: Option<CniResult>,
    /// `args` (raw; `args.cni.ips` is read by IPAM).
    pub args: Value,
    /// `ipam` (raw; parsed by the IPAM module).
    pub ipam: Value,
    /// `dns`.
    pub dns: Dns,
    /// `cni.dev/valid-attachments` (GC); `None` when the key is absent.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// `cgroupPath`.
    pub cgroup_path: CgroupPath,
    /// `attach`.
    pub attach: AttachPolicy,
    /// `interface`.
    pub interface: InterfaceKind,
    /// The pod's egress limit (`runtimeConfig.bandwidth`).
    pub egress_rate: Option<EgressRate>,
    /// The pod's source allow-list: `runtimeConfig.allowedSourceCIDRs` and
    /// `args.cni.allowedSourceCIDRs` together.
    pub allowed_sources: Vec<IpNet>,
    /// Keys this plugin does not know, as paths (`ipMasquerade`, `runtimeConfig.foo`):
    /// ignored, and logged as a warning since a misspelt key silently falls back to its
    /// default.
    pub unknown_keys: Vec<String>,
}

impl NetConf {
    /// The (container ID, ifname) keys of `cni.dev/valid-attachments` (empty if absent).
    #[must_use]
    pub fn valid_attachment_keys(&self) -> std::collections::HashSet<(String, String)> {
        self.valid_attachments
            .iter()
            .flatten()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect()
    }

    /// Parses stdin for `command`. Error 6 for bytes that are not JSON, 7 for invalid
    /// fields, 1 for an unsupported version or a verb the version lacks.
    pub fn parse(bytes: &[u8], command: Command) -> Result<Self> {
        let (mut raw, unknown_keys) = decode(bytes)?;

        // A missing cniVersion means 0.1.0, as libcni and the reference plugins read it.
        let version = Version::parse(raw.cni_version.as_deref().unwrap_or("0.1.0"))?;
        check_verb(command, version, &raw)?;

        let name = raw.name.take().unwrap_or_default();
        if let Some(reason) = check_identifier(&name) {
            return Err(Error::config("name", reason));
        }

        let nat_flows_per_pod = check_nat_limits(&raw)?;
        let cluster_cidrs = raw.cluster_cidrs.take().unwrap_or_default();
        check_cluster_cidrs(&cluster_cidrs)?;
        let cross_node = CrossNode::parse(raw.cross_node.as_deref())?;
        let tunnel = TunnelConf::parse(raw.tunnel_port, raw.tunnel_vni)?;
        let encryption = EncryptionConf::parse(
            raw.encryption.as_deref(),
            raw.wireguard_port,
            raw.encryption_strict,
        )?;
        if let Some(e) = encryption {
            if cross_node != CrossNode::Routed && e.port == tunnel.port {
                return Err(Error::config(
                    "wireguardPort",
                    format!("{} is the tunnel's port too (tunnelPort)", e.port),
                ));
            }
        }
        let mtu = raw.mtu;
        if let Some(mtu) = mtu.filter(|m| !(68..=65535).contains(m)) {
            return Err(Error::config("mtu", format!("{mtu} is outside 68..=65535")));
        }
        if let Some(uplink) = &raw.uplink {
            if let Some(reason) = super::env::check_ifname(uplink) {
                return Err(Error::config("uplink", reason));
            }
        }
        let log_level = raw
            .log_level
            .unwrap_or_else(|| "info".into())
            .to_ascii_lowercase();
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(Error::config(
                "logLevel",
                format!("{log_level:?} is not one of error, warn, info, debug, trace"),
            ));
        }
        let bpffs_root = absolute("bpffsRoot", raw.bpffs_root, DEFAULT_BPFFS_ROOT)?;
        let data_dir = absolute("dataDir", raw.data_dir, DEFAULT_DATA_DIR)?;
        if let Some(f) = &raw.log_file {
            if !f.is_absolute() {
                return Err(Error::config(
                    "logFile",
                    format!("{} is not an absolute path", f.display()),
                ));
            }
        }

        let log_rotation = log_rotation(raw.log_options.unwrap_or_default())?;

        let runtime_config = raw.runtime_config.unwrap_or_default();
        // In the tunnel modes the tunnel's UDP port is not a host port a pod may map, nor
        // is WireGuard's with encryption on.
        let mut reserved = Vec::new();
        if cross_node != CrossNode::Routed {
            reserved.push((
                tunnel.port,
                format!(
                    "the tunnel's port on this node (tunnelPort, crossNode {:?})",
                    raw.cross_node.as_deref().unwrap_or_default()
                ),
            ));
        }
        if let Some(e) = encryption {
            reserved.push((
                e.port,
                "WireGuard's port on this node (wireguardPort, encryption \"wireguard\")"
                    .to_owned(),
            ));
        }
        runtime_config.check(&reserved)?;

        let cgroup_path = CgroupPath::parse(raw.cgroup_path)?;

        let attach = AttachPolicy::parse(raw.attach.as_deref())?;
        let interface = InterfaceKind::parse(raw.interface.as_deref())?;
        let egress_rate = match &runtime_config.bandwidth {
            Some(b) => b.egress()?,
            None => None,
        };

        let allowed_sources = allowed_sources(&runtime_config, raw.args.as_ref())?;

        let ipam = with_runtime_ranges(raw.ipam.unwrap_or(Value::Null), &runtime_config)?;

        let prev_result = raw
            .prev_result
            .as_ref()
            .filter(|v| !v.is_null())
            .map(|v| CniResult::from_json(v, version))
            .transpose()?;

        Ok(Self {
            version,
            name,
            plugin_type: raw.plugin_type.unwrap_or_else(|| "cni-ebpf".into()),
            mtu,
            nat_flows_per_pod,
            nat_ports_per_destination: raw.nat_ports_per_destination,
            uplink: raw.uplink,
            ip_masq: raw.ip_masq.unwrap_or(false),
            same_node_fast_path: raw.same_node_fast_path.unwrap_or(true),
            network_policy: raw.network_policy.unwrap_or(true),
            cross_node,
            tunnel,
            encryption,
            cluster_cidrs,
            bpffs_root,
            data_dir,
            log_file: raw.log_file,
            log_level,
            log_rotation,
            runtime_config,
            prev_result,
            args: raw.args.unwrap_or(Value::Null),
            ipam,
            dns: raw.dns.unwrap_or_default(),
            valid_attachments: raw.valid_attachments,
            cgroup_path,
            attach,
            interface,
            egress_rate,
            allowed_sources,
            unknown_keys,
        })
    }

    /// Where this network's eBPF objects are pinned.
    #[must_use]
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs_root.join(&self.name)
    }

    /// Where this network's IPAM store lives.
    #[must_use]
    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

/// The configuration's JSON as [`Raw`], and the keys no field of it takes (ignored, and
/// listed for a warning). Error 6 for what is not a JSON object, 7 for a field of the
/// wrong type (named by its path).
fn decode(bytes: &[u8]) -> Result<(Raw, Vec<String>)> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Decode {
            what: "network configuration".into(),
            reason: "stdin is empty; a JSON network configuration was expected".into(),
        });
    }
    let mut value: Value = serde_json::from_slice(bytes).map_err(|e| Error::Decode {
        what: "network configuration".into(),
        reason: e.to_string(),
    })?;
    if let Some(rc) = value.get_mut("runtimeConfig") {
        fold_go_capability_keys(rc);
    }
    if !value.is_object() {
        return Err(Error::Decode {
            what: "network configuration".into(),
            reason: "expected a JSON object".into(),
        });
    }
    // Keys no field of `Raw` takes are ignored, and listed for a warning.
    let mut unknown_keys = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| unknown_keys.push(path.to_string());
    let de = serde_ignored::Deserializer::new(&value, &mut note);
    let raw: Raw = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        Error::config(
            if path == "." {
                "(root)".to_owned()
            } else {
                path
            },
            e.inner().to_string(),
        )
    })?;
    Ok((raw, unknown_keys))
}

/// Whether `command` can run on a configuration of `version` (error 1 when the version
/// lacks the verb), and GC's required list.
fn check_verb(command: Command, version: Version, raw: &Raw) -> Result<()> {
    match command {
        Command::Check if version < Version::V040 => {
            return Err(Error::IncompatibleVersion(format!(
                "CHECK needs cniVersion 0.4.0 or later, the configuration has {version}"
            )))
        }
        Command::Status | Command::Gc if version < Version::V110 => {
            return Err(Error::IncompatibleVersion(format!(
                "{} needs cniVersion 1.1.0 or later, the configuration has {version}",
                command.as_str()
            )))
        }
        Command::Gc if raw.valid_attachments.is_none() => {
            // Without the list every attachment would look stale; refuse rather than
            // release everything.
            return Err(Error::config(
                "cni.dev/valid-attachments",
                "is required for GC (an empty list releases every attachment)",
            ));
        }
        _ => {}
    }
    Ok(())
}

/// `natFlowsPerPod` (defaulted) and `natPortsPerDestination`, each within what the NAT
/// table can hold.
fn check_nat_limits(raw: &Raw) -> Result<u32> {
    let nat_flows_per_pod = raw
        .nat_flows_per_pod
        .unwrap_or(cni_ebpf_common::DEFAULT_NAT_FLOWS_PER_POD);
    let max_flows = cni_ebpf_common::MAX_NAT / 2;
    if !(1..=max_flows).contains(&nat_flows_per_pod) {
        return Err(Error::config(
            "natFlowsPerPod",
            format!(
                "{nat_flows_per_pod} is outside 1..={max_flows} (the NAT table holds {max_flows} flows)"
            ),
        ));
    }
    if let Some(n) = raw.nat_ports_per_destination {
        if !(1..=65535).contains(&n) {
            return Err(Error::config(
                "natPortsPerDestination",
                format!("{n} is outside 1..=65535 (a port number's range)"),
            ));
        }
    }
    Ok(nat_flows_per_pod)
}

/// At most [`cni_ebpf_common::MAX_CLUSTER_CIDRS`] clusterCIDRs per family.
fn check_cluster_cidrs(cluster_cidrs: &[IpNet]) -> Result<()> {
    for (family, v6) in [("IPv4", false), ("IPv6", true)] {
        let n = cluster_cidrs
            .iter()
            .filter(|c| matches!(c, IpNet::V6(_)) == v6)
            .count();
        if n > cni_ebpf_common::MAX_CLUSTER_CIDRS {
            return Err(Error::config(
                "clusterCIDRs",
                format!(
                    "{n} {family} CIDRs; at most {} per family are supported",
                    cni_ebpf_common::MAX_CLUSTER_CIDRS
                ),
            ));
        }
    }
    Ok(())
}

/// The sources a pod may send from besides its own addresses: `allowedSourceCIDRs` of the
/// runtime, then `args.cni.allowedSourceCIDRs` of the configuration (each truncated to
/// its prefix).
fn allowed_sources(runtime_config: &RuntimeConfig, args: Option<&Value>) -> Result<Vec<IpNet>> {
    let mut allowed_sources: Vec<IpNet> = runtime_config
        .allowed_source_cidrs
        .iter()
        .map(IpNet::trunc)
        .collect();
    if let Some(v) = args
        .and_then(|a| a.get("cni"))
        .and_then(|c| c.get("allowedSourceCIDRs"))
    {
        let list = v
            .as_array()
            .ok_or_else(|| Error::config("args.cni.allowedSourceCIDRs", "is not an array"))?;
        for (i, c) in list.iter().enumerate() {
            let field = format!("args.cni.allowedSourceCIDRs[{i}]");
            let net: IpNet = c
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Error::config(&field, format!("{c} is not a CIDR")))?;
            allowed_sources.push(net.trunc());
        }
    }
    Ok(allowed_sources)
}

fn absolute(field: &str, value: Option<PathBuf>, default: &str) -> Result<PathBuf> {
    let p = value.unwrap_or_else(|| PathBuf::from(default));
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::config(
            field,
            format!("{} must be an absolute path without `..`", p.display()),
        ));
    }
    Ok(p)
}

/// Parses `aa:bb:cc:dd:ee:ff` (also `-` separated); refuses multicast and all-zero MACs.
#[must_use]
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for b in &mut out {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    if parts.next().is_some() || out[0] & 1 == 1 || out == [0; 6] {
        return None;
    }
    Some(out)
}

/// Formats a MAC the way results carry it.
#[must_use]
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Reads a small file, mapping errors to I/O errors naming the path.
pub fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))
}
