//! The network configuration on stdin: the spec's common fields and cni-ebpf's own.
//!
//! Invalid JSON is error 6; JSON of the wrong shape or with invalid values is error 7 and
//! names the field; an unsupported `cniVersion` is error 1. Unknown fields are tolerated.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::{
    env::{check_identifier, Command},
    result::{CniResult, Dns},
    version::Version,
};
use crate::error::{Error, Result};

/// Default root of the pinned eBPF objects.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/cni-ebpf";
/// Default root of the IPAM stores.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni-ebpf";

/// `crossNode`: how pods reach the pods of other nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrossNode {
    /// Pod CIDRs are routed to their nodes by someone (a cloud route table, BGP, the
    /// agent's host-gw routes); pods' packets cross as they are.
    #[default]
    Routed,
    /// Through the node's VXLAN device to every other node.
    Tunnel,
    /// Directly to the nodes on the uplink's own subnet, through the tunnel to the others.
    CrossSubnet,
}

/// The tunnel device's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelConf {
    /// UDP port (`tunnelPort`, default 8472).
    pub port: u16,
    /// VXLAN network identifier (`tunnelVni`, default 1).
    pub vni: u32,
}

/// One `runtimeConfig.portMappings` entry (capability `portMappings`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// Port on the node.
    pub host_port: u16,
    /// Port in the pod.
    pub container_port: u16,
    /// `tcp` (default) or `udp`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Only traffic to this node address is mapped (default: any node address).
    #[serde(default, rename = "hostIP", deserialize_with = "empty_ip")]
    pub host_ip: Option<IpAddr>,
}

fn default_protocol() -> String {
    "tcp".into()
}

fn empty_ip<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<IpAddr>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// `runtimeConfig`: per-invocation values the runtime passes for our capabilities.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    /// Capability `portMappings`.
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    /// Capability `ips`: requested addresses (CIDR or bare).
    #[serde(default)]
    pub ips: Vec<String>,
    /// Capability `mac`: MAC for the container interface.
    #[serde(default)]
    pub mac: Option<String>,
    /// Capability `allowedSourceCIDRs`: source prefixes the pod may send from besides its
    /// own addresses (a router or VPN pod).
    #[serde(default, rename = "allowedSourceCIDRs")]
    pub allowed_source_cidrs: Vec<IpNet>,
    /// Capability `ipRanges` (host-local's schema: range sets), e.g. the node's pod CIDR
    /// from a runtime that knows it: served before `ipam.ranges`, so one conflist fits
    /// every node.
    #[serde(default, rename = "ipRanges")]
    pub ip_ranges: Option<Value>,
    /// Capability `bandwidth` (the reference `bandwidth` plugin's schema: bits per second
    /// and bits). Only the egress rate is enforced; see [`EgressRate`].
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
}

/// `runtimeConfig.bandwidth`, as Kubernetes passes it from the pod's
/// `kubernetes.io/{ingress,egress}-bandwidth` annotations.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    /// Rate into the pod (bits/s): not supported (error 2 when non-zero).
    #[serde(default)]
    pub ingress_rate: u64,
    /// Burst into the pod (bits).
    #[serde(default)]
    pub ingress_burst: u64,
    /// Rate out of the pod (bits/s); 0 = unlimited.
    #[serde(default)]
    pub egress_rate: u64,
    /// Burst out of the pod (bits); required with a rate.
    #[serde(default)]
    pub egress_burst: u64,
}

/// A pod's validated egress limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressRate {
    /// Bits per second (≥ 8).
    pub bits_per_s: u64,
    /// Burst in bits (> 0).
    pub burst_bits: u64,
}

impl Bandwidth {
    /// The egress limit, if any; ingress shaping and incomplete pairs are refused.
    fn egress(&self) -> Result<Option<EgressRate>> {
        const F: &str = "runtimeConfig.bandwidth";
        if self.ingress_rate != 0 || self.ingress_burst != 0 {
            let (field, value) = if self.ingress_rate != 0 {
                ("ingressRate", self.ingress_rate)
            } else {
                ("ingressBurst", self.ingress_burst)
            };
            return Err(Error::UnsupportedField {
                field: format!("{F}.{field}"),
                value: format!(
                    "{value} (cni-ebpf limits a pod's egress only; leave ingress unset)"
                ),
            });
        }
        match (self.egress_rate, self.egress_burst) {
            (0, 0) => Ok(None),
            (0, _) => Err(Error::config(
                format!("{F}.egressRate"),
                "must be set (bits per second) when egressBurst is",
            )),
            (_, 0) => Err(Error::config(
                format!("{F}.egressBurst"),
                "must be set (bits) when egressRate is",
            )),
            (r, _) if r < 8 => Err(Error::config(
                format!("{F}.egressRate"),
                format!("{r} bits/s is below the smallest rate, 8 bits/s"),
            )),
            (r, b) => Ok(Some(EgressRate {
                bits_per_s: r,
                burst_bits: b,
            })),
        }
    }
}

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// `logOptions` (the shape Multus uses): `maxSize` in MiB, `maxBackups` copies.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogOptions {
    #[serde(default)]
    max_size: Option<u64>,
    #[serde(default)]
    max_backups: Option<u32>,
}

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
    cross_node: Option<String>,
    #[serde(default)]
    tunnel_port: Option<u32>,
    #[serde(default)]
    tunnel_vni: Option<u32>,
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

/// Where the socket hooks (host ports for the node's own sockets) are attached
/// (`cgroupPath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupPath {
    /// Not set: the cgroup2 hierarchy's root, found in `/proc/self/mounts`.
    Root,
    /// `""`: no socket hooks (the node's own sockets cannot reach host ports).
    Off,
    /// This cgroup2 directory.
    Dir(PathBuf),
}

/// How the programs are attached to interfaces (`attach`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachPolicy {
    /// `"tc"` (the default): a `clsact` qdisc and a direct-action `cls_bpf` filter at a
    /// fixed priority. Well under a millisecond per interface; another tool's
    /// `tc qdisc del … clsact` removes it (CHECK reports that).
    #[default]
    Tc,
    /// `"tcx"`: a tcx link pinned in bpffs (kernel ≥ 6.6), which `tc` cannot remove. Each
    /// link creation waits for an RCU grace period while holding rtnl (10–15 ms here), so
    /// concurrent ADDs on a node queue behind each other.
    Tcx,
    /// `"auto"`: tcx where the kernel has it, else tc.
    Auto,
}

/// The kind of device pair a pod's interface is (`interface`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterfaceKind {
    /// `"veth"` (the default): a veth pair; `from_pod` and `to_pod` run at the host end's
    /// tc hooks (as `attach` says).
    #[default]
    Veth,
    /// `"netkit"`: a netkit pair (Linux ≥ 6.7 with `CONFIG_NETKIT`), its programs run in
    /// the pair's own transmit paths (netkit links pinned in bpffs), so a pod's packets
    /// reach the datapath without a second pass through a receive queue. A kernel without
    /// netkit fails ADD.
    Netkit,
    /// `"auto"`: netkit where the kernel has it, else veth.
    Auto,
}

impl InterfaceKind {
    fn parse(s: Option<&str>) -> Result<Self> {
        match s {
            None | Some("veth") => Ok(Self::Veth),
            Some("netkit") => Ok(Self::Netkit),
            Some("auto") => Ok(Self::Auto),
            Some(other) => Err(Error::config(
                "interface",
                format!("{other:?} is not one of \"veth\", \"netkit\", \"auto\""),
            )),
        }
    }
}

impl AttachPolicy {
    fn parse(s: Option<&str>) -> Result<Self> {
        match s {
            None | Some("tc") => Ok(Self::Tc),
            Some("tcx") => Ok(Self::Tcx),
            Some("auto") => Ok(Self::Auto),
            Some(other) => Err(Error::config(
                "attach",
                format!("{other:?} is not one of \"tc\", \"tcx\", \"auto\""),
            )),
        }
    }
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
    /// ([`crate::datapath::node::pod_mtu`]).
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
    /// `crossNode`: how pods reach the pods of other nodes.
    pub cross_node: CrossNode,
    /// `tunnelPort`, `tunnelVni`: the tunnel device's UDP port and VXLAN network
    /// identifier (used by the tunnel modes).
    pub tunnel: TunnelConf,
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

        // A missing cniVersion means 0.1.0, as libcni and the reference plugins read it.
        let version = Version::parse(raw.cni_version.as_deref().unwrap_or("0.1.0"))?;
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

        let name = raw.name.unwrap_or_default();
        if let Some(reason) = check_identifier(&name) {
            return Err(Error::config("name", reason));
        }

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
        let cluster_cidrs = raw.cluster_cidrs.unwrap_or_default();
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
        let cross_node = match raw.cross_node.as_deref() {
            None | Some("routed") => CrossNode::Routed,
            Some("tunnel") => CrossNode::Tunnel,
            Some("crossSubnet") => CrossNode::CrossSubnet,
            Some(other) => {
                return Err(Error::config(
                    "crossNode",
                    format!("{other:?} is not one of \"routed\", \"tunnel\", \"crossSubnet\""),
                ))
            }
        };
        let tunnel_port = raw
            .tunnel_port
            .unwrap_or(u32::from(cni_ebpf_common::DEFAULT_TUNNEL_PORT));
        let port = u16::try_from(tunnel_port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                Error::config("tunnelPort", format!("{tunnel_port} is outside 1..=65535"))
            })?;
        let vni = raw.tunnel_vni.unwrap_or(1);
        if !(1..=0x00ff_ffff).contains(&vni) {
            return Err(Error::config(
                "tunnelVni",
                format!("{vni} is outside 1..=16777215 (24 bits)"),
            ));
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
        let mut seen = std::collections::HashSet::new();
        for (i, pm) in runtime_config.port_mappings.iter().enumerate() {
            let field = format!("runtimeConfig.portMappings[{i}]");
            if pm.host_port == 0 {
                return Err(Error::config(
                    format!("{field}.hostPort"),
                    "must be 1..=65535",
                ));
            }
            if pm.container_port == 0 {
                return Err(Error::config(
                    format!("{field}.containerPort"),
                    "must be 1..=65535",
                ));
            }
            let proto = pm.protocol.to_ascii_lowercase();
            if proto != "tcp" && proto != "udp" {
                return Err(Error::config(
                    format!("{field}.protocol"),
                    format!("{:?} is not supported (tcp or udp)", pm.protocol),
                ));
            }
            if cross_node != CrossNode::Routed && proto == "udp" && pm.host_port == port {
                return Err(Error::config(
                    format!("{field}.hostPort"),
                    format!(
                        "{}/udp is the tunnel's port on this node (tunnelPort, crossNode \
                         {:?})",
                        pm.host_port,
                        raw.cross_node.as_deref().unwrap_or_default()
                    ),
                ));
            }
            if !seen.insert((pm.host_port, proto, pm.host_ip)) {
                return Err(Error::config(
                    format!("{field}.hostPort"),
                    format!("{}/{} is mapped twice", pm.host_port, pm.protocol),
                ));
            }
        }
        if let Some(mac) = &runtime_config.mac {
            if parse_mac(mac).is_none() {
                return Err(Error::config(
                    "runtimeConfig.mac",
                    format!("{mac:?} is not a MAC address"),
                ));
            }
        }

        let cgroup_path = match raw.cgroup_path {
            None => CgroupPath::Root,
            Some(p) if p.as_os_str().is_empty() => CgroupPath::Off,
            Some(p) => CgroupPath::Dir(absolute("cgroupPath", Some(p), "")?),
        };

        let attach = AttachPolicy::parse(raw.attach.as_deref())?;
        let interface = InterfaceKind::parse(raw.interface.as_deref())?;
        let egress_rate = match &runtime_config.bandwidth {
            Some(b) => b.egress()?,
            None => None,
        };

        let mut allowed_sources: Vec<IpNet> = runtime_config
            .allowed_source_cidrs
            .iter()
            .map(IpNet::trunc)
            .collect();
        if let Some(v) = raw
            .args
            .as_ref()
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
            cross_node,
            tunnel: TunnelConf { port, vni },
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

/// Gives the capability arguments that runtimes built on go-cni (containerd's CRI plugin
/// and `ctr`) pass our field names. go-cni marshals its Go structs without JSON tags, so
/// `portMappings` entries arrive as `{"HostPort", "ContainerPort", "Protocol", "HostIP"}`,
/// `ipRanges` as `{"Subnet", "RangeStart", "RangeEnd", "Gateway"}` (unset ones as `""`)
/// and `bandwidth` as `{"IngressRate", …}`. The reference plugins read them because Go's
/// JSON decoder matches field names case-insensitively; this does the same for exactly
/// these objects: a key equal to one of ours but for case is renamed (ours wins when both
/// are there), and an empty `rangeStart`/`rangeEnd`/`gateway` means unset, as in
/// host-local.
fn fold_go_capability_keys(rc: &mut Value) {
    fn fold(obj: &mut Value, names: &[&str]) {
        let Some(map) = obj.as_object_mut() else {
            return;
        };
        for name in names {
            if map.contains_key(*name) {
                continue;
            }
            let other = map.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned();
            if let Some(v) = other.and_then(|k| map.remove(&k)) {
                map.insert((*name).to_owned(), v);
            }
        }
    }
    const PORT: &[&str] = &["hostPort", "containerPort", "protocol", "hostIP"];
    const RANGE: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway"];
    const BANDWIDTH: &[&str] = &["ingressRate", "ingressBurst", "egressRate", "egressBurst"];
    if let Some(Value::Array(list)) = rc.get_mut("portMappings") {
        list.iter_mut().for_each(|pm| fold(pm, PORT));
    }
    if let Some(bw) = rc.get_mut("bandwidth") {
        fold(bw, BANDWIDTH);
    }
    if let Some(Value::Array(sets)) = rc.get_mut("ipRanges") {
        for set in sets.iter_mut().filter_map(Value::as_array_mut) {
            for range in set.iter_mut() {
                fold(range, RANGE);
                if let Some(map) = range.as_object_mut() {
                    for k in ["rangeStart", "rangeEnd", "gateway"] {
                        if map.get(k).and_then(Value::as_str) == Some("") {
                            map.remove(k);
                        }
                    }
                }
            }
        }
    }
}

/// The `ipam` object with `runtimeConfig.ipRanges` served first, as host-local does:
/// the runtime's range sets, then the legacy single range, then `ipam.ranges` (less the
/// sets the runtime passed too). Only for
/// the embedded allocator; a delegated IPAM plugin gets `runtimeConfig` on its stdin and
/// reads the capability itself. Errors in the runtime's ranges name
/// `runtimeConfig.ipRanges[…]`.
fn with_runtime_ranges(mut ipam: Value, rc: &RuntimeConfig) -> Result<Value> {
    let Some(ranges) = &rc.ip_ranges else {
        return Ok(ipam);
    };
    let Some(sets) = ranges.as_array() else {
        return Err(Error::config(
            "runtimeConfig.ipRanges",
            "is not an array of range sets",
        ));
    };
    if sets.is_empty() {
        return Ok(ipam);
    }
    let embedded = match ipam.get("type") {
        None | Some(Value::Null) => true,
        Some(t) => t.as_str() == Some(crate::ipam::config::EMBEDDED_TYPE),
    };
    if !embedded {
        return Ok(ipam);
    }
    // The runtime's ranges on their own first, so that an error names them.
    crate::ipam::config::Ipam::parse(&serde_json::json!({ "ranges": sets })).map_err(
        |e| match e {
            Error::InvalidConfig { field, reason } => Error::InvalidConfig {
                field: field.replacen("ipam.ranges", "runtimeConfig.ipRanges", 1),
                reason,
            },
            other => other,
        },
    )?;
    let Some(obj) = ipam.as_object_mut() else {
        return Ok(serde_json::json!({ "ranges": sets }));
    };
    // A range set of the configuration that the runtime passes too, written the same way
    // (a node's pod CIDR both in `ipam.ranges`, as `cni-ebpf install` writes it, and in
    // the capability), is served once; host-local would refuse it as an overlap and fail
    // every ADD on that node. Any other overlap is still refused by the parser.
    let mut merged = sets.clone();
    if let Some(subnet) = obj.remove("subnet") {
        let mut legacy = serde_json::Map::new();
        legacy.insert("subnet".into(), subnet);
        for k in ["rangeStart", "rangeEnd", "gateway"] {
            if let Some(v) = obj.remove(k) {
                legacy.insert(k.into(), v);
            }
        }
        let legacy = Value::Array(vec![Value::Object(legacy)]);
        if !sets.contains(&legacy) {
            merged.push(legacy);
        }
    }
    if let Some(Value::Array(existing)) = obj.remove("ranges") {
        merged.extend(existing.into_iter().filter(|set| !sets.contains(set)));
    }
    obj.insert("ranges".into(), Value::Array(merged));
    Ok(ipam)
}

/// `logOptions` checked: `maxSize` 0..=1 TiB (0: never rotate), `maxBackups` 1..=100.
fn log_rotation(raw: RawLogOptions) -> Result<crate::logging::Rotation> {
    use crate::logging::{DEFAULT_MAX_BACKUPS, DEFAULT_MAX_SIZE_MB};
    let mb = raw.max_size.unwrap_or(DEFAULT_MAX_SIZE_MB);
    if mb > 1024 * 1024 {
        return Err(Error::config(
            "logOptions.maxSize",
            format!("{mb} MiB is more than 1 TiB (0 turns rotation off)"),
        ));
    }
    let backups = raw.max_backups.unwrap_or(DEFAULT_MAX_BACKUPS);
    if !(1..=100).contains(&backups) {
        return Err(Error::config(
            "logOptions.maxBackups",
            format!("{backups} is outside 1..=100 (set maxSize 0 to leave rotation to logrotate)"),
        ));
    }
    Ok(crate::logging::Rotation {
        max_bytes: mb * 1024 * 1024,
        backups,
    })
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

#[cfg(test)]
#[expect(clippy::panic, reason = "tests panic with a message")]
mod tests {
    use serde_json::json;

    use super::{Command, NetConf};

    fn parse(runtime_config: &serde_json::Value) -> NetConf {
        let conf = json!({
            "cniVersion": "1.0.0", "name": "n", "type": "cni-ebpf",
            "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] },
            "runtimeConfig": runtime_config,
        });
        match NetConf::parse(conf.to_string().as_bytes(), Command::Add) {
            Ok(c) => c,
            Err(e) => panic!("{runtime_config}: {e}"),
        }
    }

    /// What containerd's CRI plugin (go-cni 1.1) writes for a pod with a host port, an
    /// egress limit and the node's pod CIDR: Go field names, empty strings for unset.
    #[test]
    fn go_cni_capability_args_are_read_like_go_reads_them() {
        let go = parse(&json!({
            "portMappings": [{ "HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "" }],
            "bandwidth": { "IngressRate": 0, "IngressBurst": 0, "EgressRate": 1_000_000, "EgressBurst": 10_000 },
            "ipRanges": [[{ "Subnet": "10.244.1.0/24", "RangeStart": "", "RangeEnd": "", "Gateway": "" }]],
        }));
        let ours = parse(&json!({
            "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }],
            "bandwidth": { "egressRate": 1_000_000, "egressBurst": 10_000 },
            "ipRanges": [[{ "subnet": "10.244.1.0/24" }]],
        }));
        assert_eq!(
            go.runtime_config.port_mappings,
            ours.runtime_config.port_mappings
        );
        assert_eq!(go.runtime_config.bandwidth, ours.runtime_config.bandwidth);
        assert_eq!(go.egress_rate, ours.egress_rate);
        // The same range set in the configuration and the capability is served once.
        assert_eq!(go.ipam, ours.ipam);
        assert_eq!(
            go.ipam["ranges"].as_array().map(Vec::len),
            Some(1),
            "{}",
            go.ipam
        );
    }

    #[test]
    fn our_spelling_wins_over_another_case() {
        let c = parse(&json!({
            "portMappings": [{ "hostPort": 8080, "HOSTPORT": 9090, "containerPort": 80 }],
        }));
        assert_eq!(c.runtime_config.port_mappings[0].host_port, 8080);
    }

    #[test]
    fn a_udp_host_port_on_the_tunnel_port_is_refused_in_the_tunnel_modes() {
        let conf = |mode: &str, proto: &str| {
            json!({
                "cniVersion": "1.0.0", "name": "n", "type": "cni-ebpf", "crossNode": mode,
                "tunnelPort": 4789,
                "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] },
                "runtimeConfig": { "portMappings": [
                    { "hostPort": 4789, "containerPort": 53, "protocol": proto }
                ] },
            })
            .to_string()
        };
        for mode in ["tunnel", "crossSubnet"] {
            let err = match NetConf::parse(conf(mode, "udp").as_bytes(), Command::Add) {
                Ok(_) => panic!("{mode}: a udp host port on the tunnel port was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains("runtimeConfig.portMappings[0].hostPort") && err.contains("4789"),
                "{err}"
            );
            assert!(NetConf::parse(conf(mode, "tcp").as_bytes(), Command::Add).is_ok());
        }
        assert!(NetConf::parse(conf("routed", "udp").as_bytes(), Command::Add).is_ok());
    }
}
