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

pub mod attach;
pub mod load;
pub mod maps;
pub mod node;
pub mod object;
pub mod pins;

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    path::Path,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use aya::programs::{SchedClassifier, TcAttachType};
use cni_ebpf_common::{
    map as map_name, owner_id, prog, proto, Cidr4, EndpointInfo, EndpointKey, EndpointStats,
    NodeAddr, NodeConfig, PortKey, PortTarget, Reason, CFG_F_MASQ, EP_F_ACTIVE, HOOK_POD,
    HOOK_UPLINK_IN, HOOK_UPLINK_OUT, MAX_CLUSTER_CIDRS, NAT_DNAT_FWD, NAT_DNAT_REV, NAT_F_FIN,
    NAT_F_FIRST_FIN, NAT_F_RST, NAT_HAIRPIN_FWD, NAT_HAIRPIN_REV, NAT_SNAT_FWD, NAT_SNAT_REV,
};
use ipnet::{IpNet, Ipv4Net};
use serde::Serialize;

pub use self::{attach::AttachMode, pins::Pins};
use self::{
    maps::{addr, to_addr, to_port, Maps},
    pins::Direction,
};
use crate::{
    cni::config::{format_mac, NetConf, PortMapping},
    error::{Error, Result},
};

/// [`NodeConfig::flags`] bit used by userspace only: the uplink programs were attached as
/// legacy clsact filters (which cannot be pinned or queried like tcx links).
const CFG_F_UPLINK_LEGACY: u32 = 1 << 16;

/// The uplink programs and where they go.
const UPLINK_PROGS: [(&str, Direction, TcAttachType); 2] = [
    (
        prog::UPLINK_INGRESS,
        Direction::Ingress,
        TcAttachType::Ingress,
    ),
    (prog::UPLINK_EGRESS, Direction::Egress, TcAttachType::Egress),
];

/// One pod interface as the datapath sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// ifindex of the host end of the veth.
    pub host_ifindex: u32,
    /// Name of the host end of the veth.
    pub host_ifname: String,
    /// MAC of the host end (gateway side).
    pub host_mac: [u8; 6],
    /// MAC of the pod's interface.
    pub pod_mac: [u8; 6],
    /// The pod's addresses (IPv4 ones get endpoint entries; IPv6 is routed by the kernel).
    pub ips: Vec<IpAddr>,
}

/// Node-wide settings written to the `NODE_CONFIG` map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    /// Masquerade source address; `None` disables masquerading.
    pub node_addr: Option<Ipv4Addr>,
    /// Uplink ifindex.
    pub uplink_ifindex: u32,
    /// `ipMasq`.
    pub ip_masq: bool,
    /// IPv4 `clusterCIDRs` (at most 16).
    pub cluster_cidrs: Vec<Ipv4Net>,
    /// SNAT port range (inclusive).
    pub snat_ports: (u16, u16),
}

/// An endpoint entry, for `inspect` and GC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointView {
    /// Pod IPv4 address.
    pub ip: Ipv4Addr,
    /// Host veth ifindex.
    pub host_ifindex: u32,
    /// Host veth MAC.
    pub host_mac: String,
    /// Pod MAC.
    pub pod_mac: String,
    /// Owner container ID (empty if the owner record is missing).
    pub container_id: String,
    /// Owner ifname.
    pub ifname: String,
    /// Packets from the pod.
    pub tx_packets: u64,
    /// Bytes from the pod.
    pub tx_bytes: u64,
    /// Packets redirected into the pod by our programs.
    pub rx_packets: u64,
    /// Bytes redirected into the pod.
    pub rx_bytes: u64,
}

/// A host-port entry, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortMappingView {
    /// `hostIP`, `None` = every node address.
    pub host_ip: Option<Ipv4Addr>,
    /// `hostPort`.
    pub host_port: u16,
    /// `tcp` / `udp`.
    pub protocol: String,
    /// Pod address.
    pub pod_ip: Ipv4Addr,
    /// `containerPort`.
    pub container_port: u16,
    /// Owner container ID.
    pub container_id: String,
    /// Owner ifname.
    pub ifname: String,
}

/// One NAT entry (one direction of a flow), for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NatView {
    /// `snat`, `snat-reply`, `dnat`, `dnat-reply`, `hairpin`, `hairpin-reply`.
    pub kind: &'static str,
    /// Program applying it: `from_pod`, `uplink_ingress`, `uplink_egress`.
    pub hook: &'static str,
    /// `tcp`, `udp`, `icmp`.
    pub protocol: String,
    /// Tuple matched: source address.
    pub src: Ipv4Addr,
    /// Source port (echo id for ICMP).
    pub sport: u16,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Destination port.
    pub dport: u16,
    /// Rewritten source address.
    pub new_src: Ipv4Addr,
    /// Rewritten source port.
    pub new_sport: u16,
    /// Rewritten destination address.
    pub new_dst: Ipv4Addr,
    /// Rewritten destination port.
    pub new_dport: u16,
    /// Time since the last packet, in milliseconds.
    pub idle_ms: u64,
    /// What this direction of a TCP flow has sent: `open`, `fin` (a FIN; `fin-first` if
    /// it closed first) or `rst`.
    pub state: &'static str,
}

/// A reason counter, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    /// Stable name.
    pub reason: &'static str,
    /// Numeric value (index in the map).
    pub code: u32,
    /// Sum over CPUs.
    pub count: u64,
}

/// The node configuration as the programs see it, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    /// Masquerade source.
    pub node_addr: Option<Ipv4Addr>,
    /// Uplink ifindex.
    pub uplink_ifindex: u32,
    /// `ipMasq`.
    pub ip_masq: bool,
    /// Cluster CIDRs.
    pub cluster_cidrs: Vec<String>,
    /// SNAT port range.
    pub snat_ports: (u16, u16),
    /// The node addresses the programs treat as "this node".
    pub node_addrs: Vec<Ipv4Addr>,
}

/// Everything the datapath holds for one (container ID, ifname), for GC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttachmentState {
    /// Container ID.
    pub container_id: String,
    /// Ifname.
    pub ifname: String,
    /// Endpoint addresses.
    pub ips: Vec<Ipv4Addr>,
    /// Host veth ifindexes of its endpoint entries.
    pub host_ifindexes: Vec<u32>,
    /// Number of host ports.
    pub port_mappings: usize,
}

/// Handle on one network's pinned programs and maps.
pub struct Datapath {
    pins: Pins,
    maps: Mutex<Maps>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("pins", &self.pins)
            .finish_non_exhaustive()
    }
}

fn v4s(ips: &[IpAddr]) -> Vec<Ipv4Addr> {
    ips.iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .collect()
}

fn proto_number(p: &str) -> Result<u8> {
    match p.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        other => Err(Error::config(
            "runtimeConfig.portMappings.protocol",
            format!("{other:?} is not supported (tcp or udp)"),
        )),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        proto::TCP => "tcp".into(),
        proto::UDP => "udp".into(),
        proto::ICMP => "icmp".into(),
        n => n.to_string(),
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of `bpf_ktime_get_ns`.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    let d = Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    );
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Datapath {
    // ---------------------------------------------------------------- loading / opening

    /// Loads, verifies and pins the network's programs and maps once per node (race-safe:
    /// concurrent callers on a fresh node load once), attaches the uplink programs once
    /// (uplink from `conf.uplink`, else the default route's device), enables IPv4
    /// forwarding and refreshes the node configuration (masquerade address, clusterCIDRs,
    /// ipMasq, node addresses). Cheap when already loaded: no verifier work.
    pub fn open_or_load(conf: &NetConf) -> Result<Self> {
        load::check_bpffs(&conf.bpffs_root)
            .map_err(|e| Error::datapath("checking bpffsRoot", e))?;
        let dp = Self::load_at(conf.pin_dir())?;
        // Every node address is listed at most every NODE_ADDRS_EVERY_S (a node with 1 000
        // pods has 1 000 gateway addresses on host veths: ~3 ms per listing); in between,
        // only the uplink's, and each ADD adds its own gateway address.
        let now = node::boottime_s();
        let old = dp.node_config_raw()?;
        let listed = old.addrs_listed_s;
        let mut all = listed == 0 || now.saturating_sub(listed) >= node::NODE_ADDRS_EVERY_S;
        // A `hostIP` the datapath does not know as a node address yet: list them all now.
        for pm in &conf.runtime_config.port_mappings {
            if let Some(IpAddr::V4(a)) = pm.host_ip {
                if !all && !a.is_unspecified() && !dp.is_node_addr(a)? {
                    all = true;
                }
            }
        }
        let facts = node::read(conf.uplink.as_deref(), all)?;
        let (uplink_name, uplink_ifindex) = facts
            .uplink
            .clone()
            .ok_or_else(|| Error::config("uplink", "could not determine the uplink interface"))?;
        let mut cidrs = Vec::new();
        for c in &conf.cluster_cidrs {
            if let IpNet::V4(v4) = c {
                cidrs.push(v4.trunc());
            }
        }
        if cidrs.len() > MAX_CLUSTER_CIDRS {
            return Err(Error::config(
                "clusterCIDRs",
                format!("at most {MAX_CLUSTER_CIDRS} IPv4 CIDRs are supported"),
            ));
        }
        if conf.ip_masq && facts.uplink_addr.is_none() {
            tracing::warn!(
                "uplink {uplink_name} has no IPv4 address: masquerading is disabled until it has one"
            );
        }
        crate::link::write_sysctl("net.ipv4.ip_forward", "1")?;
        let legacy = dp.ensure_uplink(&old, &uplink_name, uplink_ifindex)?;
        let settings = NodeSettings {
            node_addr: facts.uplink_addr,
            uplink_ifindex,
            ip_masq: conf.ip_masq,
            cluster_cidrs: cidrs,
            snat_ports: node::snat_port_range(),
        };
        dp.write_node_config(&old, &settings, legacy, all.then_some(now))?;
        if all {
            dp.set_node_addrs(&facts.addrs)?;
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
        let pins = Pins::new(network_dir.as_ref());
        refuse_foreign(&pins)?;
        if !pins.complete() {
            return Ok(None);
        }
        let maps = Maps::open(&pins)?;
        Ok(Some(Self {
            pins,
            maps: Mutex::new(maps),
        }))
    }

    /// Loads and pins below `network_dir` if needed (under the load lock) and opens the
    /// pins. Attaches nothing and writes no configuration (tests, `cni-ebpf load`).
    pub fn load_at(network_dir: impl AsRef<Path>) -> Result<Self> {
        let pins = Pins::new(network_dir.as_ref());
        refuse_foreign(&pins)?;
        if !pins.complete() {
            let _lock = load::LoadLock::acquire(&pins)?;
            refuse_foreign(&pins)?;
            if !pins.complete() {
                load::load_and_pin(&pins)?;
            }
        }
        let maps = Maps::open(&pins)?;
        Ok(Self {
            pins,
            maps: Mutex::new(maps),
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
        remove_dir(&v)
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

    // ---------------------------------------------------------------- node

    /// Attaches the uplink programs to `name` where they are not already. Returns whether
    /// legacy clsact was used.
    fn ensure_uplink(&self, cfg: &NodeConfig, name: &str, ifindex: u32) -> Result<bool> {
        if cfg.flags & CFG_F_UPLINK_LEGACY != 0 && cfg.uplink_ifindex == ifindex {
            return Ok(true);
        }
        if self.uplink_attached(name)? {
            return Ok(false);
        }
        let _lock = load::LoadLock::acquire(&self.pins)?;
        let mut legacy = false;
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if self.uplink_dir_attached(name, p, dir, tc_dir)? {
                continue;
            }
            let mut program = self.program(p)?;
            let mode = attach::attach(
                &mut program,
                name,
                tc_dir,
                &self.pins.uplink_link(name, dir),
            )?;
            legacy |= mode == AttachMode::Legacy;
        }
        Ok(legacy)
    }

    /// Whether both uplink programs are attached to `name` through their pinned links.
    fn uplink_attached(&self, name: &str) -> Result<bool> {
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if !self.uplink_dir_attached(name, p, dir, tc_dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn uplink_dir_attached(
        &self,
        name: &str,
        p: &str,
        dir: Direction,
        tc_dir: TcAttachType,
    ) -> Result<bool> {
        let id = attach::program_id(&self.program(p)?)?;
        if attach::pinned_link_program(&self.pins.uplink_link(name, dir))? != Some(id) {
            return Ok(false);
        }
        Ok(attach::tcx_attached(name, tc_dir, id)? != Some(false))
    }

    fn node_config_raw(&self) -> Result<NodeConfig> {
        let mut m = self.maps()?;
        let arr = m.node_config()?;
        arr.get(&0, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG, "read", &e))
    }

    /// Writes the node configuration the programs use (keeps userspace-only flags).
    pub fn configure_node(&self, s: &NodeSettings) -> Result<()> {
        self.write_node_config(&self.node_config_raw()?, s, false, None)
    }

    /// Writes the node configuration for `s` over `old` (the current one): the legacy
    /// uplink flag is kept while the uplink stays and set when `legacy`; the time of the
    /// last full node-address listing is `addrs_listed_s`, else kept. Nothing is written
    /// when nothing changes.
    fn write_node_config(
        &self,
        old: &NodeConfig,
        s: &NodeSettings,
        legacy: bool,
        addrs_listed_s: Option<u32>,
    ) -> Result<()> {
        if s.cluster_cidrs.len() > MAX_CLUSTER_CIDRS {
            return Err(Error::config(
                "clusterCIDRs",
                format!("at most {MAX_CLUSTER_CIDRS} IPv4 CIDRs are supported"),
            ));
        }
        let same_uplink = old.uplink_ifindex == s.uplink_ifindex;
        let legacy = legacy || (same_uplink && old.flags & CFG_F_UPLINK_LEGACY != 0);
        let mut cfg = NodeConfig {
            node_addr: s.node_addr.map_or(0, addr),
            uplink_ifindex: s.uplink_ifindex,
            flags: if legacy { CFG_F_UPLINK_LEGACY } else { 0 }
                | if s.ip_masq { CFG_F_MASQ } else { 0 },
            n_cidrs: u32::try_from(s.cluster_cidrs.len()).unwrap_or(0),
            snat_port_min: s.snat_ports.0,
            snat_port_max: s.snat_ports.1,
            addrs_listed_s: addrs_listed_s.unwrap_or(old.addrs_listed_s),
            cluster_cidrs: [Cidr4::default(); MAX_CLUSTER_CIDRS],
            netns_cookie: old.netns_cookie,
        };
        for (slot, c) in cfg.cluster_cidrs.iter_mut().zip(&s.cluster_cidrs) {
            *slot = Cidr4 {
                addr: addr(c.network()),
                mask: addr(c.netmask()),
            };
        }
        if cfg == *old {
            return Ok(());
        }
        let mut m = self.maps()?;
        let mut arr = m.node_config()?;
        arr.set(0, cfg, 0)
            .map_err(|e| maps::err(map_name::NODE_CONFIG, "write", &e))
    }

    /// Replaces the set of addresses the programs treat as "this node" (host-port
    /// destinations, never masqueraded).
    pub fn set_node_addrs(&self, addrs: &[(Ipv4Addr, u32)]) -> Result<()> {
        let mut m = self.maps()?;
        let mut h = m.node_addrs()?;
        let want: BTreeMap<u32, u32> = addrs.iter().map(|(a, i)| (addr(*a), *i)).collect();
        let have: BTreeMap<u32, u32> = maps::entries(&h)
            .into_iter()
            .map(|(k, v)| (k, v.ifindex))
            .collect();
        for k in have.keys() {
            if !want.contains_key(k) {
                maps::remove(&mut h, k, map_name::NODE_ADDRS)?;
            }
        }
        for (k, i) in want {
            if have.get(&k) == Some(&i) {
                continue;
            }
            h.insert(k, NodeAddr { ifindex: i }, 0)
                .map_err(|e| maps::err(map_name::NODE_ADDRS, "insert", &e))?;
        }
        Ok(())
    }

    /// Whether `a` is in the node-address map.
    fn is_node_addr(&self, a: Ipv4Addr) -> Result<bool> {
        let mut m = self.maps()?;
        let h = m.node_addrs()?;
        Ok(maps::get(&h, &addr(a), map_name::NODE_ADDRS)?.is_some())
    }

    /// Adds addresses to the set the programs treat as "this node" (the uplink's, and the
    /// gateway addresses ADD puts on a new host veth), without removing any: `open_or_load`
    /// replaces the whole set from a full listing at most every
    /// [`node::NODE_ADDRS_EVERY_S`].
    pub fn add_node_addrs(&self, addrs: &[(Ipv4Addr, u32)]) -> Result<()> {
        let mut m = self.maps()?;
        let mut h = m.node_addrs()?;
        for (a, i) in addrs {
            let k = addr(*a);
            if maps::get(&h, &k, map_name::NODE_ADDRS)?.is_some() {
                continue;
            }
            h.insert(k, NodeAddr { ifindex: *i }, 0)
                .map_err(|e| maps::err(map_name::NODE_ADDRS, "insert", &e))?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- endpoints

    /// Writes the endpoint's map entries (owner record, per-pod counters, one entry per
    /// IPv4 address) without attaching anything. An address held by another container is
    /// an error naming it.
    pub fn put_endpoint_entries(&self, ep: &Endpoint) -> Result<()> {
        let owner = owner_id(ep.container_id.as_bytes(), ep.ifname.as_bytes());
        let record = maps::owner_record(&ep.container_id, &ep.ifname)?;
        let ips = v4s(&ep.ips);
        let mut m = self.maps()?;
        {
            let h = m.endpoints()?;
            for ip in &ips {
                if let Some(old) =
                    maps::get(&h, &EndpointKey { addr: addr(*ip) }, map_name::ENDPOINTS)?
                {
                    if old.owner != owner {
                        let who = owner_label(&mut m, old.owner);
                        return Err(Error::datapath(
                            format!("adding endpoint {ip}"),
                            format!("the address is already attached to {who}"),
                        ));
                    }
                }
            }
        }
        m.owners()?
            .insert(owner, record, 0)
            .map_err(|e| maps::err(map_name::OWNERS, "insert", &e))?;
        let zero = maps::zero_percpu::<EndpointStats>()?;
        m.ep_stats()?
            .insert(ep.host_ifindex, zero, 0)
            .map_err(|e| maps::err(map_name::EP_STATS, "insert", &e))?;
        let mut h = m.endpoints()?;
        for ip in &ips {
            let info = EndpointInfo {
                ifindex: ep.host_ifindex,
                flags: EP_F_ACTIVE,
                host_mac: ep.host_mac,
                pod_mac: ep.pod_mac,
                _pad: [0; 4],
                owner,
            };
            h.insert(EndpointKey { addr: addr(*ip) }, info, 0)
                .map_err(|e| maps::err(map_name::ENDPOINTS, format!("insert {ip}"), &e))?;
        }
        Ok(())
    }

    /// Makes a pod reachable: endpoint map entries, per-pod counters, stale NAT state of
    /// its addresses purged, and `from_pod` attached to the host veth's ingress (tcx link
    /// pinned; legacy clsact fallback).
    pub fn attach_endpoint(&self, ep: &Endpoint) -> Result<()> {
        if ep.host_ifindex == 0 {
            return Err(Error::datapath(
                format!("attaching {}", ep.host_ifname),
                "host ifindex 0",
            ));
        }
        // An old flow of a previous holder of these addresses must not reach this pod.
        self.purge_nat(&v4s(&ep.ips))?;
        self.put_endpoint_entries(ep)?;
        let mut program = self.program(prog::FROM_POD)?;
        attach::attach(
            &mut program,
            &ep.host_ifname,
            TcAttachType::Ingress,
            &self.pins.endpoint_link(&ep.host_ifname),
        )?;
        Ok(())
    }

    /// Removes everything of (container ID, ifname): endpoint entries (those of `ips` and
    /// any other it owns), counters, the host veth's link pin, NAT state of its addresses.
    /// Idempotent; never touches entries owned by another container.
    pub fn detach_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
        host_ifname: &str,
        ips: &[IpAddr],
    ) -> Result<()> {
        let owner = owner_id(container_id.as_bytes(), ifname.as_bytes());
        let gone = self.take_endpoint_entries(owner, ips)?;
        attach::remove_pin(&self.pins.endpoint_link(host_ifname))?;
        self.forget(owner, &gone)
    }

    /// Everything DEL and GC remove of (container ID, ifname) — host ports, endpoint
    /// entries, counters, the link pin, NAT state, the owner record — reading each map
    /// once (the NAT table is scanned once for all the pod's addresses). Best effort: every
    /// step is tried and each failure lands in `errors`.
    pub fn remove_pod(
        &self,
        container_id: &str,
        ifname: &str,
        host_ifname: &str,
        ips: &[IpAddr],
        errors: &mut Vec<Error>,
    ) {
        let owner = owner_id(container_id.as_bytes(), ifname.as_bytes());
        let mut addrs = Vec::new();
        for taken in [
            self.take_port_mappings(owner),
            self.take_endpoint_entries(owner, ips),
        ] {
            match taken {
                Ok(a) => addrs.extend(a),
                Err(e) => errors.push(e),
            }
        }
        for r in [
            attach::remove_pin(&self.pins.endpoint_link(host_ifname)),
            self.forget(owner, &addrs),
        ] {
            if let Err(e) = r {
                errors.push(e);
            }
        }
    }

    /// Removes `owner`'s endpoint entries (those of `ips` and any other it owns) and their
    /// counters; returns the addresses removed.
    fn take_endpoint_entries(&self, owner: u64, ips: &[IpAddr]) -> Result<Vec<Ipv4Addr>> {
        let mut m = self.maps()?;
        let mut h = m.endpoints()?;
        let mut doomed: Vec<(EndpointKey, EndpointInfo)> = maps::entries(&h)
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .collect();
        for ip in v4s(ips) {
            let k = EndpointKey { addr: addr(ip) };
            if !doomed.iter().any(|(dk, _)| *dk == k) {
                if let Some(v) = maps::get(&h, &k, map_name::ENDPOINTS)? {
                    if v.owner == owner {
                        doomed.push((k, v));
                    }
                }
            }
        }
        let mut gone = Vec::new();
        let mut ifindexes = HashSet::new();
        for (k, v) in doomed {
            ifindexes.insert(v.ifindex);
            maps::remove(&mut h, &k, map_name::ENDPOINTS)?;
            gone.push(to_addr(k.addr));
        }
        let mut st = m.ep_stats()?;
        for i in &ifindexes {
            match st.remove(i) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::EP_STATS, "delete", &e)),
            }
        }
        Ok(gone)
    }

    /// After `owner`'s entries are gone: the NAT state of `addrs`, and the owner record
    /// if nothing refers to it any more.
    fn forget(&self, owner: u64, addrs: &[Ipv4Addr]) -> Result<()> {
        self.purge_nat(addrs)?;
        self.drop_owner_if_unused(owner)
    }

    fn drop_owner_if_unused(&self, owner: u64) -> Result<()> {
        let mut m = self.maps()?;
        let used_ep = maps::entries(&m.endpoints()?)
            .iter()
            .any(|(_, v)| v.owner == owner);
        let used_pm = maps::entries(&m.portmaps()?)
            .iter()
            .any(|(_, v)| v.owner == owner);
        if !used_ep && !used_pm {
            maps::remove(&mut m.owners()?, &owner, map_name::OWNERS)?;
        }
        Ok(())
    }

    /// Deletes every NAT entry whose tuple (matched or rewritten) involves one of `addrs`.
    fn purge_nat(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        let set: HashSet<u32> = addrs.iter().map(|a| addr(*a)).collect();
        let mut m = self.maps()?;
        let mut nat = m.nat()?;
        let doomed: Vec<_> = maps::entries(&nat)
            .into_iter()
            .filter(|(k, v)| {
                set.contains(&k.saddr)
                    || set.contains(&k.daddr)
                    || set.contains(&v.saddr)
                    || set.contains(&v.daddr)
            })
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            maps::remove(&mut nat, &k, map_name::NAT)?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- host ports

    /// Maps host ports to `pod_ip`. A port already mapped for another container (also a
    /// wildcard vs. a specific `hostIP` on the same port) is an error naming that
    /// container; nothing of this call stays behind on error.
    pub fn add_port_mappings(
        &self,
        owner: (&str, &str),
        pod_ip: Ipv4Addr,
        mappings: &[PortMapping],
    ) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        let record = maps::owner_record(owner.0, owner.1)?;
        let mut wanted = Vec::new();
        for pm in mappings {
            let p = proto_number(&pm.protocol)?;
            let host = match pm.host_ip {
                None => 0,
                Some(IpAddr::V4(a)) if a.is_unspecified() => 0,
                Some(IpAddr::V4(a)) => addr(a),
                Some(IpAddr::V6(a)) if a.is_unspecified() => 0,
                Some(IpAddr::V6(a)) => {
                    return Err(Error::UnsupportedField {
                        field: "runtimeConfig.portMappings.hostIP".into(),
                        value: format!("\"{a}\" (IPv6 host ports are not supported yet)"),
                    })
                }
            };
            wanted.push((
                PortKey {
                    addr: host,
                    port: maps::port(pm.host_port),
                    proto: p,
                    _pad: 0,
                },
                PortTarget {
                    addr: addr(pod_ip),
                    port: maps::port(pm.container_port),
                    _pad: 0,
                    owner: oid,
                },
                pm,
            ));
        }
        let mut m = self.maps()?;
        let existing = maps::entries(&m.portmaps()?);
        for (k, _, pm) in &wanted {
            let clash = existing.iter().find(|(ek, ev)| {
                ev.owner != oid
                    && ek.port == k.port
                    && ek.proto == k.proto
                    && (ek.addr == k.addr || ek.addr == 0 || k.addr == 0)
            });
            if let Some((_, ev)) = clash {
                let who = owner_label(&mut m, ev.owner);
                return Err(Error::datapath(
                    format!(
                        "mapping hostPort {}/{}{}",
                        pm.host_port,
                        pm.protocol.to_ascii_lowercase(),
                        pm.host_ip.map(|i| format!(" on {i}")).unwrap_or_default()
                    ),
                    format!("the port is already mapped to {who}"),
                ));
            }
        }
        m.owners()?
            .insert(oid, record, 0)
            .map_err(|e| maps::err(map_name::OWNERS, "insert", &e))?;
        let mut h = m.portmaps()?;
        let mut done = Vec::new();
        for (k, v, pm) in &wanted {
            if let Err(e) = h.insert(*k, *v, 0) {
                for d in &done {
                    let _ = h.remove(d);
                }
                return Err(maps::err(
                    map_name::PORTMAPS,
                    format!("insert hostPort {}", pm.host_port),
                    &e,
                ));
            }
            done.push(*k);
        }
        Ok(())
    }

    /// Removes the host ports of `owner` and every NAT entry of the pods they pointed to,
    /// so an old flow never reaches a new pod. Idempotent.
    pub fn remove_port_mappings(&self, owner: (&str, &str)) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        let pods = self.take_port_mappings(oid)?;
        self.forget(oid, &pods)
    }

    /// Removes `owner`'s host ports; returns the pod addresses they led to.
    fn take_port_mappings(&self, owner: u64) -> Result<Vec<Ipv4Addr>> {
        let mut pods = Vec::new();
        let mut m = self.maps()?;
        let mut h = m.portmaps()?;
        for (k, v) in maps::entries(&h) {
            if v.owner == owner {
                maps::remove(&mut h, &k, map_name::PORTMAPS)?;
                if !pods.contains(&to_addr(v.addr)) {
                    pods.push(to_addr(v.addr));
                }
            }
        }
        Ok(pods)
    }

    // ---------------------------------------------------------------- CHECK / STATUS

    /// Compares the live datapath with what ADD set up for `ep` and `mappings`; the first
    /// mismatch is an [`Error::Check`] naming it.
    pub fn check_endpoint(&self, ep: &Endpoint, mappings: &[PortMapping]) -> Result<()> {
        self.check_endpoint_accepting(ep, &[ep.pod_mac], mappings)
    }

    /// [`Datapath::check_endpoint`], with the endpoint entry's pod MAC allowed to be any of
    /// `pod_macs` (a later chained plugin may have changed the pod's MAC after ADD wrote
    /// the entry; the spec has CHECK allow that).
    pub fn check_endpoint_accepting(
        &self,
        ep: &Endpoint,
        pod_macs: &[[u8; 6]],
        mappings: &[PortMapping],
    ) -> Result<()> {
        let owner = owner_id(ep.container_id.as_bytes(), ep.ifname.as_bytes());
        let ips = v4s(&ep.ips);
        {
            let mut m = self.maps()?;
            let h = m.endpoints()?;
            for ip in &ips {
                let Some(v) = maps::get(&h, &EndpointKey { addr: addr(*ip) }, map_name::ENDPOINTS)?
                else {
                    return Err(Error::Check(format!(
                        "the endpoint map has no entry for {ip} (container {}, {})",
                        ep.container_id, ep.ifname
                    )));
                };
                if v.owner != owner {
                    let who = owner_label(&mut m, v.owner);
                    return Err(Error::Check(format!(
                        "the endpoint entry for {ip} belongs to {who}, not container {} ({})",
                        ep.container_id, ep.ifname
                    )));
                }
                if v.ifindex != ep.host_ifindex {
                    return Err(Error::Check(format!(
                        "the endpoint entry for {ip} points at ifindex {}, but host veth {} is ifindex {}",
                        v.ifindex, ep.host_ifname, ep.host_ifindex
                    )));
                }
                if v.host_mac != ep.host_mac {
                    return Err(Error::Check(format!(
                        "the endpoint entry for {ip} has host MAC {}, expected {}",
                        format_mac(&v.host_mac),
                        format_mac(&ep.host_mac)
                    )));
                }
                if !pod_macs.contains(&v.pod_mac) {
                    return Err(Error::Check(format!(
                        "the endpoint entry for {ip} has pod MAC {}, expected {}",
                        format_mac(&v.pod_mac),
                        format_mac(&ep.pod_mac)
                    )));
                }
                if v.flags & EP_F_ACTIVE == 0 {
                    return Err(Error::Check(format!(
                        "the endpoint entry for {ip} is not active"
                    )));
                }
            }
        }

        // Our program on the host veth.
        let id = attach::program_id(&self.program(prog::FROM_POD)?)?;
        let pin = self.pins.endpoint_link(&ep.host_ifname);
        match attach::tcx_attached(&ep.host_ifname, TcAttachType::Ingress, id)? {
            Some(true) => {}
            Some(false) => {
                return Err(Error::Check(format!(
                    "the cni-ebpf program is not attached to host veth {} (ingress)",
                    ep.host_ifname
                )))
            }
            None => {} // legacy clsact: not queryable this way
        }
        if attach::tcx_attached(&ep.host_ifname, TcAttachType::Ingress, id)?.is_some()
            && attach::pinned_link_program(&pin)? != Some(id)
        {
            return Err(Error::Check(format!(
                "the pinned link {} of host veth {} is missing or runs another program",
                pin.display(),
                ep.host_ifname
            )));
        }

        self.check_port_mappings(owner, &ips, mappings)?;
        self.check_uplink()
    }

    fn check_port_mappings(
        &self,
        owner: u64,
        ips: &[Ipv4Addr],
        mappings: &[PortMapping],
    ) -> Result<()> {
        let mut m = self.maps()?;
        let live: Vec<_> = maps::entries(&m.portmaps()?)
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .collect();
        let mut expected = Vec::new();
        for pm in mappings {
            let p = proto_number(&pm.protocol)?;
            let host = match pm.host_ip {
                Some(IpAddr::V4(a)) if !a.is_unspecified() => addr(a),
                _ => 0,
            };
            let key = PortKey {
                addr: host,
                port: maps::port(pm.host_port),
                proto: p,
                _pad: 0,
            };
            let label = format!(
                "hostPort {}/{}{} → containerPort {}",
                pm.host_port,
                proto_name(p),
                pm.host_ip.map(|i| format!(" on {i}")).unwrap_or_default(),
                pm.container_port
            );
            let found = maps::get(&m.portmaps()?, &key, map_name::PORTMAPS)?;
            let Some(v) = found else {
                return Err(Error::Check(format!("port mapping {label} is missing")));
            };
            if v.owner != owner {
                let who = owner_label(&mut m, v.owner);
                return Err(Error::Check(format!(
                    "port mapping {label} belongs to {who}"
                )));
            }
            if to_port(v.port) != pm.container_port || !ips.contains(&to_addr(v.addr)) {
                return Err(Error::Check(format!(
                    "port mapping {label} points at {}:{}",
                    to_addr(v.addr),
                    to_port(v.port)
                )));
            }
            expected.push(key);
        }
        if let Some((k, v)) = live.iter().find(|(k, _)| !expected.contains(k)) {
            return Err(Error::Check(format!(
                "unexpected port mapping hostPort {}/{} → {}:{} (not in runtimeConfig.portMappings)",
                to_port(k.port),
                proto_name(k.proto),
                to_addr(v.addr),
                to_port(v.port)
            )));
        }
        Ok(())
    }

    fn check_uplink(&self) -> Result<()> {
        let cfg = self.node_config_raw()?;
        if cfg.flags & CFG_F_UPLINK_LEGACY != 0 {
            return Ok(());
        }
        let name = ifname_of(cfg.uplink_ifindex).ok_or_else(|| {
            Error::Check(format!(
                "the uplink (ifindex {}) the programs were configured for no longer exists",
                cfg.uplink_ifindex
            ))
        })?;
        if !self.uplink_attached(&name)? {
            return Err(Error::Check(format!(
                "the uplink programs are not attached to {name}"
            )));
        }
        Ok(())
    }

    /// Whether this network's datapath has never been loaded since bpffs was mounted (the
    /// node booted): no version directory under `<bpffsRoot>/<network>`. The first ADD
    /// loads it. bpffs itself must be usable.
    pub fn never_loaded(conf: &NetConf) -> Result<bool> {
        load::check_bpffs(&conf.bpffs_root)?;
        Ok(!Pins::new(conf.pin_dir()).version_dir().exists())
    }

    /// STATUS: bpffs mounted, object embedded, pins present and of our layout; otherwise
    /// [`Error::NotAvailable`] with the reason.
    pub fn status(conf: &NetConf) -> Result<()> {
        load::check_bpffs(&conf.bpffs_root)?;
        if !object::is_embedded() {
            return Err(Error::NotAvailable(
                "this binary was built without its eBPF programs".into(),
            ));
        }
        let pins = Pins::new(conf.pin_dir());
        refuse_foreign(&pins).map_err(|e| Error::NotAvailable(e.to_string()))?;
        let missing = pins.missing();
        if !missing.is_empty() {
            return Err(Error::NotAvailable(format!(
                "the eBPF datapath of network {} is not loaded (missing {}); run `cni-ebpf load` or ADD a pod",
                conf.name,
                missing
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Maps::open(&pins).map_err(|e| Error::NotAvailable(e.to_string()))?;
        Ok(())
    }

    // ---------------------------------------------------------------- inspect / GC

    /// Every endpoint entry with its owner and counters.
    pub fn endpoints(&self) -> Result<Vec<EndpointView>> {
        let mut m = self.maps()?;
        let eps = maps::entries(&m.endpoints()?);
        let stats = m.ep_stats()?;
        let stats: BTreeMap<u32, EndpointStats> = stats
            .iter()
            .filter_map(std::result::Result::ok)
            .map(|(k, v)| (k, maps::sum_stats(&v)))
            .collect();
        let owners = m.owners()?;
        let mut out: Vec<_> = eps
            .into_iter()
            .map(|(k, v)| {
                let (container_id, ifname) = maps::get(&owners, &v.owner, map_name::OWNERS)
                    .ok()
                    .flatten()
                    .map(|o| maps::owner_names(&o))
                    .unwrap_or_default();
                let s = stats.get(&v.ifindex).copied().unwrap_or_default();
                EndpointView {
                    ip: to_addr(k.addr),
                    host_ifindex: v.ifindex,
                    host_mac: format_mac(&v.host_mac),
                    pod_mac: format_mac(&v.pod_mac),
                    container_id,
                    ifname,
                    tx_packets: s.tx_packets,
                    tx_bytes: s.tx_bytes,
                    rx_packets: s.rx_packets,
                    rx_bytes: s.rx_bytes,
                }
            })
            .collect();
        out.sort_by_key(|e| e.ip);
        Ok(out)
    }

    /// Every host port.
    pub fn port_mappings(&self) -> Result<Vec<PortMappingView>> {
        let mut m = self.maps()?;
        let pms = maps::entries(&m.portmaps()?);
        let owners = m.owners()?;
        let mut out: Vec<_> = pms
            .into_iter()
            .map(|(k, v)| {
                let (container_id, ifname) = maps::get(&owners, &v.owner, map_name::OWNERS)
                    .ok()
                    .flatten()
                    .map(|o| maps::owner_names(&o))
                    .unwrap_or_default();
                PortMappingView {
                    host_ip: (k.addr != 0).then(|| to_addr(k.addr)),
                    host_port: to_port(k.port),
                    protocol: proto_name(k.proto),
                    pod_ip: to_addr(v.addr),
                    container_port: to_port(v.port),
                    container_id,
                    ifname,
                }
            })
            .collect();
        out.sort_by(|a, b| (a.host_port, &a.protocol).cmp(&(b.host_port, &b.protocol)));
        Ok(out)
    }

    /// Every NAT entry.
    pub fn nat_entries(&self) -> Result<Vec<NatView>> {
        let now = now_ns();
        let mut m = self.maps()?;
        let nat = m.nat()?;
        Ok(maps::entries(&nat)
            .into_iter()
            .map(|(k, v)| NatView {
                kind: match v.kind {
                    NAT_SNAT_FWD => "snat",
                    NAT_SNAT_REV => "snat-reply",
                    NAT_DNAT_FWD => "dnat",
                    NAT_DNAT_REV => "dnat-reply",
                    NAT_HAIRPIN_FWD => "hairpin",
                    NAT_HAIRPIN_REV => "hairpin-reply",
                    _ => "unknown",
                },
                hook: match v.hook {
                    HOOK_POD => prog::FROM_POD,
                    HOOK_UPLINK_IN => prog::UPLINK_INGRESS,
                    HOOK_UPLINK_OUT => prog::UPLINK_EGRESS,
                    _ => "unknown",
                },
                protocol: proto_name(k.proto),
                src: to_addr(k.saddr),
                sport: to_port(k.sport),
                dst: to_addr(k.daddr),
                dport: to_port(k.dport),
                new_src: to_addr(v.saddr),
                new_sport: to_port(v.sport),
                new_dst: to_addr(v.daddr),
                new_dport: to_port(v.dport),
                idle_ms: now.saturating_sub(v.last_seen_ns) / 1_000_000,
                state: if v.flags & NAT_F_RST != 0 {
                    "rst"
                } else if v.flags & NAT_F_FIRST_FIN != 0 {
                    "fin-first"
                } else if v.flags & NAT_F_FIN != 0 {
                    "fin"
                } else {
                    "open"
                },
            })
            .collect())
    }

    /// Per-reason counters summed over CPUs.
    pub fn reason_counts(&self) -> Result<Vec<ReasonCount>> {
        let mut m = self.maps()?;
        let arr = m.reasons()?;
        let mut out = Vec::new();
        for r in Reason::ALL {
            let code = r as u32;
            let v = arr
                .get(&code, 0)
                .map_err(|e| maps::err(map_name::REASONS, "read", &e))?;
            out.push(ReasonCount {
                reason: r.name(),
                code,
                count: v.iter().sum(),
            });
        }
        Ok(out)
    }

    /// The count of one reason (summed over CPUs).
    pub fn reason_count(&self, reason: Reason) -> Result<u64> {
        Ok(self
            .reason_counts()?
            .into_iter()
            .find(|c| c.code == reason as u32)
            .map_or(0, |c| c.count))
    }

    /// The node configuration as the programs see it.
    pub fn node_view(&self) -> Result<NodeView> {
        let cfg = self.node_config_raw()?;
        let mut m = self.maps()?;
        let mut node_addrs: Vec<_> = maps::entries(&m.node_addrs()?)
            .into_iter()
            .map(|(k, _)| to_addr(k))
            .collect();
        node_addrs.sort();
        let n = (cfg.n_cidrs as usize).min(MAX_CLUSTER_CIDRS);
        Ok(NodeView {
            node_addr: (cfg.node_addr != 0).then(|| to_addr(cfg.node_addr)),
            uplink_ifindex: cfg.uplink_ifindex,
            ip_masq: cfg.flags & CFG_F_MASQ != 0,
            cluster_cidrs: cfg.cluster_cidrs[..n]
                .iter()
                .map(|c| {
                    let prefix = u32::from_be_bytes(c.mask.to_ne_bytes()).count_ones();
                    format!("{}/{prefix}", to_addr(c.addr))
                })
                .collect(),
            snat_ports: (cfg.snat_port_min, cfg.snat_port_max),
            node_addrs,
        })
    }

    /// Every (container ID, ifname) the maps hold state for (GC compares this with
    /// `cni.dev/valid-attachments`).
    pub fn attachments(&self) -> Result<Vec<AttachmentState>> {
        let mut m = self.maps()?;
        let owners = maps::entries(&m.owners()?);
        let eps = maps::entries(&m.endpoints()?);
        let pms = maps::entries(&m.portmaps()?);
        Ok(owners
            .into_iter()
            .map(|(id, o)| {
                let (container_id, ifname) = maps::owner_names(&o);
                let mine: Vec<_> = eps.iter().filter(|(_, v)| v.owner == id).collect();
                AttachmentState {
                    container_id,
                    ifname,
                    ips: mine.iter().map(|(k, _)| to_addr(k.addr)).collect(),
                    host_ifindexes: mine.iter().map(|(_, v)| v.ifindex).collect(),
                    port_mappings: pms.iter().filter(|(_, v)| v.owner == id).count(),
                }
            })
            .collect())
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
                "they use pin layout {} but this binary uses {}; unload them with the binary \
                 that made them (or remove the directory) first",
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

fn ifname_of(ifindex: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..len].to_vec()).ok()
}
