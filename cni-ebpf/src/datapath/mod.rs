//! The eBPF datapath: load-once-and-pin, attach, map updates and read-back.
//!
//! One [`Datapath`] is a handle on one network's pinned programs and maps (layout in
//! [`pins`]). Programs are verified once per network and node ([`Datapath::open_or_load`]);
//! later invocations open the pins and only attach links and write map entries.
//!
//! The programs (see `cni-ebpf-bpf`):
//! - `from_pod` on every host veth (ingress): pod → local pod straight into the peer
//!   (`bpf_redirect_peer`), hairpin to the node's host ports, everything else to the stack;
//! - `uplink_ingress`: reverse masquerade, DNAT of host ports, ICMP errors of translated flows;
//! - `uplink_egress`: masquerade of pod traffic leaving the cluster, replies of host ports.
//!
//! Pod traffic leaving the node is routed by the kernel (which needs
//! `net.ipv4.ip_forward=1`, set by [`Datapath::open_or_load`]) and translated on the
//! uplink, so routing, neighbours and TTL stay the kernel's business there.
//!
//! # Where things are
//! [`Datapath`] is one type; its methods are grouped by concern, one `impl Datapath` block
//! per file:
//! - this file: the handle itself — open, load, unload, pins, programs, map access — and
//!   the small helpers the other files share;
//! - `node_config.rs`: node-wide state the programs read ([`NodeConfigSpec`] → `NODE_CONFIG`,
//!   the node-address set `NODE_ADDRS`);
//! - `uplink.rs`: attaching the uplink programs once per node;
//! - `endpoints.rs`: a pod's interface ([`Endpoint`]): its endpoint entries, attaching
//!   `from_pod` to the host veth, and taking everything of a pod away again
//!   ([`Datapath::remove_pod`], [`Datapath::detach_endpoint`]);
//! - `flows.rs`: per-flow state keyed by addresses (the NAT table) and its purge when
//!   an address changes hands; a new per-flow map gets its purge there too;
//! - `portmaps.rs`: host ports (add, remove);
//! - `pacing.rs`: egress rates (`runtimeConfig.bandwidth`) and the uplink's `fq`;
//! - `check.rs`: CHECK's read-back of one attachment;
//! - `status.rs`: STATUS (and whether the datapath was ever loaded);
//! - `read_only.rs`: read-only views of every map for `inspect`, the agent's metrics and GC;
//! - `memory.rs`: each pinned map's capacity, fill and kernel memory (fdinfo).
//!
//! Lower layers, used by the files above: [`load`] (verify and pin), [`attach`] (clsact
//! filters or tcx links), [`maps`] (typed map access), [`node_facts`] (reading the node's
//! uplink and addresses over netlink), [`object`] (the embedded eBPF object), [`pins`]
//! (the bpffs layout).

pub mod attach;
mod bpf_syscall;
mod check;
mod endpoints;
mod family;
mod flows;
pub mod load;
pub mod maps;
pub mod memory;
pub mod netkit;
mod node_config;
pub mod node_facts;
pub mod object;
pub mod observe;
pub mod pacing;
pub mod pins;
pub mod policy;
mod portmaps;
mod read_only;
pub mod services;
mod sockets;
mod status;
pub mod tunnel;
pub mod upgrade;
mod uplink;
pub mod wireguard;

use std::{
    path::Path,
    sync::{Mutex, MutexGuard},
};

use aya::programs::SchedClassifier;
use cni_ebpf_common::{map as map_name, proto};
use ipnet::IpNet;

use self::maps::Maps;
pub use self::{
    attach::AttachMode,
    endpoints::{Endpoint, RemovedEntries},
    memory::MapStats,
    node_config::{snat_dest_cap, NodeConfigSpec},
    pins::Pins,
    read_only::{
        AttachmentState, EndpointView, FlowSummary, NatView, NodeConfigView, PortMappingView,
        ReasonCount, SnatUsage,
    },
    sockets::netns_cookie,
};
use crate::{
    cni::config::{AttachPolicy, NetConf},
    error::{Error, Result},
};

/// Handle on one network's pinned programs and maps.
pub struct Datapath {
    pins: Pins,
    maps: Mutex<Maps>,
    /// How programs get attached (`attach`; tc for handles not opened from a
    /// configuration).
    attach: AttachPolicy,
    /// The MTU of pods (set by [`Datapath::open_or_load_with`]; 0 otherwise).
    pod_mtu: u32,
    /// The node's tunnel device (set by [`Datapath::open_or_load_with`]; 0 otherwise,
    /// and in routed mode).
    tunnel_ifindex: u32,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("pins", &self.pins)
            .finish_non_exhaustive()
    }
}

impl Datapath {
    /// Loads, verifies and pins the network's programs and maps once per node (race-safe:
    /// concurrent callers on a fresh node load once), attaches the uplink programs once
    /// (uplink from `conf.uplink`, else the default route's device), enables IPv4
    /// forwarding and refreshes the node configuration (masquerade address, clusterCIDRs,
    /// ipMasq, node addresses). Cheap when already loaded: no verifier work.
    ///
    /// For callers outside a tokio runtime; ADD uses [`Datapath::open_or_load_with`] on the
    /// connection it already has.
    pub fn open_or_load(conf: &NetConf) -> Result<Self> {
        crate::kernel::link::runtime()?.block_on(async {
            let nl = crate::kernel::link::Nl::connect()?;
            Self::open_or_load_with(conf, &nl).await
        })
    }

    /// [`Datapath::open_or_load`], reading the node through `nl` (a netlink connection in
    /// the node's namespace, on the caller's runtime).
    pub async fn open_or_load_with(conf: &NetConf, nl: &crate::kernel::link::Nl) -> Result<Self> {
        load::check_bpffs(&conf.bpffs_root)
            .map_err(|e| Error::datapath("checking bpffsRoot", e.to_string()))?;
        let mut dp = Self::load_carrying(&conf.pin_dir(), Some(&conf.store_dir()))?;
        dp.attach = conf.attach;
        // Every node address is listed at most every NODE_ADDRS_EVERY_S (a node with 1 000
        // pods has 1 000 gateway addresses on host veths: ~3 ms per listing); in between,
        // only the uplink's, and each ADD adds its own gateway address.
        let now = node_facts::boottime_s();
        let old = dp.node_config_raw()?;
        let listed = dp.addrs_listed_s()?;
        let mut all = listed == 0 || now.saturating_sub(listed) >= node_facts::NODE_ADDRS_EVERY_S;
        // A `hostIP` the datapath does not know as a node address yet: list them all now.
        for pm in &conf.runtime_config.port_mappings {
            if let Some(a) = pm.host_ip {
                if !all && !a.is_unspecified() && !dp.is_node_addr(a)? {
                    all = true;
                }
            }
        }
        let facts = node_facts::read(nl, conf.uplink.as_deref(), all).await?;
        let (uplink_name, uplink_ifindex) = facts
            .uplink
            .clone()
            .ok_or_else(|| Error::config("uplink", "could not determine the uplink interface"))?;
        let mut cidrs = Vec::new();
        let mut cidrs6 = Vec::new();
        for c in &conf.cluster_cidrs {
            match c {
                IpNet::V4(v4) => cidrs.push(v4.trunc()),
                IpNet::V6(v6) => cidrs6.push(v6.trunc()),
            }
        }
        if conf.ip_masq && facts.uplink_addr.is_none() {
            tracing::warn!(
                "uplink {uplink_name} has no IPv4 address: masquerading is disabled until it has one"
            );
        }
        if conf.ip_masq && facts.uplink_addr6.is_none() && !cidrs6.is_empty() {
            tracing::warn!(
                "uplink {uplink_name} has no usable global IPv6 address: IPv6 masquerading is \
                 disabled until it has one"
            );
        }
        crate::kernel::link::write_sysctl("net.ipv4.ip_forward", "1")?;
        dp.ensure_uplink(&uplink_name, uplink_ifindex)?;
        let (pod_mtu, too_big) =
            node_facts::pod_mtu(conf, facts.uplink_mtu, facts.uplink_addr.is_some());
        if let Some(w) = too_big {
            tracing::warn!("{w}");
        }
        dp.pod_mtu = pod_mtu;
        let tunnel_mtu = facts
            .uplink_mtu
            .saturating_sub(if facts.uplink_addr.is_some() {
                cni_ebpf_common::VXLAN_OVERHEAD4
            } else {
                cni_ebpf_common::VXLAN_OVERHEAD6
            });
        let tunnel = dp
            .ensure_tunnel(nl, conf, tunnel_mtu, old.tunnel_ifindex)
            .await?;
        dp.tunnel_ifindex = tunnel.map_or(0, |t| t.ifindex);
        let wireguard_mtu = facts
            .uplink_mtu
            .saturating_sub(if facts.uplink_addr.is_some() {
                cni_ebpf_common::WIREGUARD_OVERHEAD4
            } else {
                cni_ebpf_common::WIREGUARD_OVERHEAD6
            });
        let wireguard = dp.ensure_wireguard(nl, conf, wireguard_mtu).await?;
        let netns_cookie = dp.ensure_socket_hooks(&conf.cgroup_path, old.netns_cookie)?;
        let avoid: Vec<u16> = tunnel
            .map(|t| t.port)
            .into_iter()
            .chain(wireguard.map(|w| w.port))
            .collect();
        let snat_ports = node_facts::snat_port_range(&avoid);
        let settings = NodeConfigSpec {
            node_addr: facts.uplink_addr,
            uplink_ifindex,
            ip_masq: conf.ip_masq,
            same_node_fast_path: conf.same_node_fast_path,
            network_policy: conf.network_policy,
            cluster_cidrs: cidrs,
            node_addr6: facts.uplink_addr6,
            cluster_cidrs6: cidrs6,
            snat_ports,
            snat_dest_cap: node_config::snat_dest_cap(conf.nat_ports_per_destination, snat_ports),
            netns_cookie,
            tunnel,
            wireguard,
        };
        dp.write_node_config(&old, &settings)?;
        if all {
            dp.set_node_addrs(&facts.addrs, uplink_ifindex)?;
            dp.set_addrs_listed_s(now)?;
        } else {
            dp.add_node_addrs(&facts.addrs)?;
        }
        Ok(dp)
    }

    /// Opens existing pins only (DEL, CHECK, GC, inspect). `Ok(None)` when nothing (or
    /// not everything) is pinned, or bpffs is not there.
    pub fn open(conf: &NetConf) -> Result<Option<Self>> {
        if load::check_bpffs(&conf.bpffs_root).is_err() {
            return Ok(None);
        }
        Self::open_at(conf.pin_dir())
    }

    /// Opens the pins below `network_dir` (`<bpffsRoot>/<network>`); `Ok(None)` if not
    /// (completely) loaded. Another layout version there is an error.
    pub fn open_at(network_dir: impl AsRef<Path>) -> Result<Option<Self>> {
        Self::open_existing(network_dir.as_ref(), Maps::open)
    }

    /// Like [`Datapath::open_at`], each map opened at its first use: for a reader of a
    /// few maps that looks often (the agent's check of the node configuration).
    pub fn open_lazily_at(network_dir: impl AsRef<Path>) -> Result<Option<Self>> {
        Self::open_existing(network_dir.as_ref(), |p| Ok(Maps::open_lazily(p)))
    }

    /// Like [`Datapath::open_at`], with read-only map descriptors: a handle for readers
    /// that must never change the datapath (the agent's metrics); every write through it
    /// fails.
    pub fn open_read_only_at(network_dir: impl AsRef<Path>) -> Result<Option<Self>> {
        Self::open_existing(network_dir.as_ref(), Maps::open_read_only)
    }

    fn open_existing(network_dir: &Path, open: fn(&Pins) -> Result<Maps>) -> Result<Option<Self>> {
        let pins = Pins::new(network_dir);
        refuse_foreign(&pins)?;
        if !pins.complete() {
            return Ok(None);
        }
        let maps = open(&pins)?;
        Ok(Some(Self {
            pins,
            maps: Mutex::new(maps),
            attach: AttachPolicy::default(),
            pod_mtu: 0,
            tunnel_ifindex: 0,
        }))
    }

    /// Loads and pins below `network_dir` if needed (under the load lock) and opens the
    /// pins. Attaches nothing and writes no configuration (tests, `cni-ebpf load`).
    ///
    /// Pins made by another object of the same layout (a newer binary was installed) are
    /// carried over to this binary's programs in place ([`upgrade`]).
    pub fn load_at(network_dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_carrying(network_dir.as_ref(), None)
    }

    /// [`Self::load_at`]; a carry-over also records the namespaces of the pods in the IPAM
    /// store at `store` ([`Self::adopt_pod_netns`]).
    fn load_carrying(network_dir: &Path, store: Option<&Path>) -> Result<Self> {
        let pins = Pins::new(network_dir);
        refuse_foreign(&pins)?;
        if !pins.complete() || !upgrade::current(&pins) {
            let _lock = load::LoadLock::acquire(&pins)?;
            refuse_foreign(&pins)?;
            if !pins.complete() {
                load::load_and_pin(&pins)?;
            }
            upgrade::carry_over(&pins, store)?;
        }
        Self::open_pins(pins)
    }

    /// A handle on complete pins; each map is opened on first use (ADD's path: it uses
    /// about half of them).
    fn open_pins(pins: Pins) -> Result<Self> {
        let maps = Maps::open_lazily(&pins);
        Ok(Self {
            pins,
            maps: Mutex::new(maps),
            attach: AttachPolicy::default(),
            pod_mtu: 0,
            tunnel_ifindex: 0,
        })
    }

    /// Removes every pin of the network below `network_dir` (links first, which detaches
    /// them). Idempotent.
    pub fn unload_at(network_dir: impl AsRef<Path>) -> Result<()> {
        let pins = Pins::new(network_dir.as_ref());
        let _lock = load::LoadLock::acquire(&pins)?;
        let v = pins.version_dir();
        for d in [pins.links_dir(), pins.progs_dir(), pins.maps_dir()] {
            if let Ok(entries) = std::fs::read_dir(&d) {
                for e in entries.filter_map(std::result::Result::ok) {
                    attach::remove_pin(&e.path())?;
                }
            }
            remove_dir(&d)?;
        }
        for marker in pins.stamps()? {
            remove_dir(&v.join(marker))?;
        }
        remove_dir(&v)
    }

    /// Removes this network's clsact filters from every interface of the current network
    /// namespace: the uplink programs' (the network's [`attach::uplink_handle`], on the
    /// uplink or on an earlier one) and `from_pod`'s ([`attach::TC_HANDLE`], on host veths
    /// a killed DEL left). A filter is ours when it sits at our priority and handle and runs
    /// one of this network's pinned programs. Pinned tcx and cgroup links are not touched:
    /// removing their pins ([`Datapath::unload_at`]) detaches them. For `uninstall --purge`,
    /// before the pins go: a filter keeps its program running after the pins are gone.
    /// Returns how many filters were removed.
    pub fn remove_filters(&self) -> Result<usize> {
        use aya::programs::TcAttachType;
        use cni_ebpf_common::prog;

        let uplink = attach::uplink_handle(self.pins.network_dir());
        let id = |name: &str| attach::program_id(&self.program(name)?);
        // Per hook, the (program, handle) pairs that may sit there.
        let hooks = [
            (
                TcAttachType::Ingress,
                vec![
                    (id(prog::FROM_POD)?, attach::TC_HANDLE),
                    (id(prog::UPLINK_INGRESS)?, uplink),
                    (id(prog::FROM_TUNNEL)?, uplink),
                ],
            ),
            (
                TcAttachType::Egress,
                vec![
                    (id(prog::UPLINK_EGRESS)?, uplink),
                    (id(prog::TO_POD)?, attach::TC_HANDLE),
                    (id(prog::TO_TUNNEL)?, uplink),
                ],
            ),
        ];
        let interfaces = nix::net::if_::if_nameindex()
            .map_err(|e| Error::io("listing the network interfaces", e.into()))?;
        let mut removed = 0;
        for iface in &interfaces {
            for (dir, ours) in &hooks {
                removed += attach::remove_filters_running(iface.index(), *dir, ours)?;
            }
        }
        Ok(removed)
    }

    /// The MTU pods get (after [`Datapath::open_or_load_with`]).
    #[must_use]
    pub fn pod_mtu(&self) -> u32 {
        self.pod_mtu
    }

    /// The pin layout of this network.
    #[must_use]
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Opens one of the pinned programs (e.g. for `BPF_PROG_TEST_RUN`).
    pub fn program(&self, name: &str) -> Result<SchedClassifier> {
        load::open_program(&self.pins, name)
    }

    fn maps(&self) -> Result<MutexGuard<'_, Maps>> {
        self.maps
            .lock()
            .map_err(|_| Error::datapath("map access", "a previous map operation panicked"))
    }
}

fn refuse_foreign(pins: &Pins) -> Result<()> {
    let foreign = pins.foreign_versions()?;
    if foreign.is_empty() {
        Ok(())
    } else {
        Err(Error::datapath(
            format!("opening the pins in {}", pins.network_dir().display()),
            format!(
                "they use map layout {} but this binary uses {}, so it cannot take over \
                 the running pods' maps; install the binary that made them again, or move \
                 the node to this one: drain it, then run `cni-ebpf uninstall --purge` \
                 with the old binary (README: \"Upgrades\")",
                foreign.join(", "),
                pins::version_dir_name()
            ),
        ))
    }
}

fn remove_dir(d: &Path) -> Result<()> {
    match std::fs::remove_dir(d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", d.display()), e)),
    }
}

// Helpers shared by the files of this module.

fn owner_label(m: &mut Maps, owner: u64) -> String {
    match m
        .owners()
        .and_then(|o| maps::get(&o, &owner, map_name::OWNERS))
    {
        Ok(Some(o)) => {
            let (id, ifname) = maps::owner_names(&o);
            format!("container {id} ({ifname})")
        }
        _ => format!("an unknown container (owner id {owner:#x})"),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        proto::TCP => "tcp".into(),
        proto::UDP => "udp".into(),
        proto::ICMP => "icmp".into(),
        proto::ICMPV6 => "icmpv6".into(),
        n => n.to_string(),
    }
}
