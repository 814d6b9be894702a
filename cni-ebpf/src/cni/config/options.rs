//! The options that select how the plugin works: how pods reach other nodes
//! (`crossNode`) and the tunnel's settings, where the socket hooks go (`cgroupPath`), how
//! programs are attached (`attach`), the kind of a pod's device pair (`interface`), and
//! when the log file rotates (`logOptions`); each with how its value is read and checked.

use std::path::PathBuf;

use serde::Deserialize;

use super::absolute;
use crate::error::{Error, Result};

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

impl CrossNode {
    pub(super) fn parse(s: Option<&str>) -> Result<Self> {
        one_of(
            "crossNode",
            s,
            &[
                ("routed", Self::Routed),
                ("tunnel", Self::Tunnel),
                ("crossSubnet", Self::CrossSubnet),
            ],
        )
    }
}

/// The value named `s` among `choices` (the first when `s` is absent); any other name is
/// error 7 for `field`, listing the names.
fn one_of<T: Copy>(field: &str, s: Option<&str>, choices: &[(&str, T)]) -> Result<T> {
    let found = match s {
        None => choices.first(),
        Some(name) => choices.iter().find(|(n, _)| *n == name),
    };
    found.map(|(_, v)| *v).ok_or_else(|| {
        let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
        Error::config(
            field,
            format!(
                "{:?} is not one of {}",
                s.unwrap_or_default(),
                names.join(", ")
            ),
        )
    })
}

/// The tunnel device's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelConf {
    /// UDP port (`tunnelPort`, default 8472).
    pub port: u16,
    /// VXLAN network identifier (`tunnelVni`, default 1).
    pub vni: u32,
}

impl TunnelConf {
    /// `tunnelPort` and `tunnelVni` checked, with their defaults.
    pub(super) fn parse(port: Option<u32>, vni: Option<u32>) -> Result<Self> {
        let tunnel_port = port.unwrap_or(u32::from(cni_ebpf_common::DEFAULT_TUNNEL_PORT));
        let port = u16::try_from(tunnel_port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                Error::config("tunnelPort", format!("{tunnel_port} is outside 1..=65535"))
            })?;
        let vni = vni.unwrap_or(1);
        if !(1..=0x00ff_ffff).contains(&vni) {
            return Err(Error::config(
                "tunnelVni",
                format!("{vni} is outside 1..=16777215 (24 bits)"),
            ));
        }
        Ok(Self { port, vni })
    }
}

/// `encryption`, `wireguardPort`, `encryptionStrict`: pod traffic between nodes in
/// WireGuard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncryptionConf {
    /// The WireGuard device's UDP port (`wireguardPort`, default
    /// [`cni_ebpf_common::DEFAULT_WIREGUARD_PORT`]).
    pub port: u16,
    /// `encryptionStrict` (default true): a node that has published no key is
    /// unreachable; `false` reaches it in clear (logged by the agent, counted).
    pub strict: bool,
}

impl EncryptionConf {
    /// `encryption` (`"none"`, the default, or `"wireguard"`) with its settings checked;
    /// `None` without encryption. The settings of a mode that is off are still checked.
    pub(super) fn parse(
        mode: Option<&str>,
        port: Option<u32>,
        strict: Option<bool>,
    ) -> Result<Option<Self>> {
        let on = one_of("encryption", mode, &[("none", false), ("wireguard", true)])?;
        let wanted = port.unwrap_or(u32::from(cni_ebpf_common::DEFAULT_WIREGUARD_PORT));
        let port = u16::try_from(wanted)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                Error::config("wireguardPort", format!("{wanted} is outside 1..=65535"))
            })?;
        Ok(on.then_some(Self {
            port,
            strict: strict.unwrap_or(true),
        }))
    }
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

impl CgroupPath {
    pub(super) fn parse(p: Option<PathBuf>) -> Result<Self> {
        Ok(match p {
            None => Self::Root,
            Some(p) if p.as_os_str().is_empty() => Self::Off,
            Some(p) => Self::Dir(absolute("cgroupPath", Some(p), "")?),
        })
    }
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
    pub(super) fn parse(s: Option<&str>) -> Result<Self> {
        one_of(
            "interface",
            s,
            &[
                ("veth", Self::Veth),
                ("netkit", Self::Netkit),
                ("auto", Self::Auto),
            ],
        )
    }
}

impl AttachPolicy {
    pub(super) fn parse(s: Option<&str>) -> Result<Self> {
        one_of(
            "attach",
            s,
            &[("tc", Self::Tc), ("tcx", Self::Tcx), ("auto", Self::Auto)],
        )
    }
}

/// `logOptions` (the shape Multus uses): `maxSize` in MiB, `maxBackups` copies.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawLogOptions {
    #[serde(default)]
    max_size: Option<u64>,
    #[serde(default)]
    max_backups: Option<u32>,
}

/// `logOptions` checked: `maxSize` 0..=1 TiB (0: never rotate), `maxBackups` 1..=100.
pub(super) fn log_rotation(raw: RawLogOptions) -> Result<crate::logging::Rotation> {
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
