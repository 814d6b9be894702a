//! Read-only views of the maps, for `inspect`, the agent's metrics and GC: endpoints with their
//! counters, host ports, NAT entries and SNAT port use, reason counters, the node
//! configuration, and what the maps hold per (container ID, ifname). Nothing here writes
//! a map.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use cni_ebpf_common::{
    map as map_name, EndpointFlags, EndpointInfo, EndpointStats, FlowFlags, NatDeliver, NatKind,
    NodeFlags, Reason, MAX_CLUSTER_CIDRS,
};
use serde::Serialize;

use super::{
    maps::{self, ipv4_from_map, ipv6_from_map, port_from_map},
    proto_name, Datapath,
};
use crate::{cni::config::format_mac, error::Result};

/// An endpoint entry, for `inspect` and GC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointView {
    /// Pod address (either family).
    pub ip: IpAddr,
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
    /// Egress rate (bits/s) when the pod has one.
    pub egress_rate_bits: Option<u64>,
    /// How the rate is enforced: `fq` (departure times honoured by the uplink's fq) or
    /// `police` (the kernel has no fq: drops beyond burst and limit).
    pub egress_rate_mode: Option<&'static str>,
    /// Translated flows charged to the pod's NAT share (entries ÷ 2), when it has one.
    pub nat_flows: Option<u32>,
    /// Most flows the pod may hold (`natFlowsPerPod`), when it has a share.
    pub nat_flows_cap: Option<u32>,
    /// A tombstone: the pod is being removed and its address's flows may not be purged
    /// yet (a DEL or GC stopped part-way; the next one, or the address's next ADD,
    /// finishes it). The programs ignore the entry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub removing: bool,
    /// The pod's device pair: `veth` or `netkit` (`interface`).
    pub interface: &'static str,
}

/// A host-port entry, for `inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortMappingView {
    /// `hostIP`, `None` = every node address of the family of `pod_ip`.
    pub host_ip: Option<IpAddr>,
    /// `hostPort`.
    pub host_port: u16,
    /// `tcp` / `udp`.
    pub protocol: String,
    /// Pod address.
    pub pod_ip: IpAddr,
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
    pub src: IpAddr,
    /// Source port (echo id for ICMP).
    pub sport: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// Rewritten source address.
    pub new_src: IpAddr,
    /// Rewritten source port.
    pub new_sport: u16,
    /// Rewritten destination address.
    pub new_dst: IpAddr,
    /// Rewritten destination port.
    pub new_dport: u16,
    /// Time since the last packet, in milliseconds.
    pub idle_ms: u64,
    /// What this direction of a TCP flow has sent: `open`, `fin` (a FIN; `fin-first` if
    /// it closed first) or `rst`.
    pub state: &'static str,
    /// Where a translated packet goes next: `direct` (straight into the local pod) or
    /// `stack` (netfilter translated the flow too and must undo its part).
    pub deliver: &'static str,
    /// Host veth ifindex of the pod whose NAT share the entry counts against (0: none).
    pub pod_ifindex: u32,
}

/// How many pod flows the datapath knows in each state, for `inspect`: what takes the
/// fast path and what stays on the kernel path (living next to netfilter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FlowSummary {
    /// Seen leaving untranslated: fast path both ways.
    pub verified: u64,
    /// Handed to the stack and not (yet) seen leaving untranslated: a new flow, or one
    /// netfilter translates (kept on the kernel path).
    pub pending: u64,
    /// Opened from outside the cluster (never masqueraded).
    pub inbound: u64,
    /// Pod sockets talking to a peer through the stack (their replies go to the stack).
    pub stack_sockets: u64,
    /// Node sockets connected to a host port by the socket hooks.
    pub host_port_sockets: u64,
}

/// How much of the SNAT port range masquerade (and hairpin of a pod to its own host
/// port) holds, for the agent's metrics. A translated port is reserved per destination (address,
/// port, protocol): one port serves many destinations at once, and masquerade to one
/// destination fails (`drop_no_snat_port`) when `max_per_destination` reaches
/// `range_size`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SnatUsage {
    /// Ports in the configured range (`snat_ports`, both ends included; 0 when unset).
    pub range_size: u64,
    /// Port reservations held (one per translated flow).
    pub reservations: u64,
    /// Distinct ports of the range held by at least one flow.
    pub ports_in_use: u64,
    /// The most ports held towards any one destination.
    pub max_per_destination: u64,
    /// Most ports one pod may hold towards one destination (`natPortsPerDestination`
    /// in force; 0: no cap); a pod's masquerade to it fails (`drop_snat_dest_cap`) at it.
    pub pod_destination_cap: u64,
    /// The most ports one pod holds towards one destination, as the programs count them.
    pub max_per_pod_destination: u64,
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
pub struct NodeConfigView {
    /// Masquerade source.
    pub node_addr: Option<Ipv4Addr>,
    /// IPv6 masquerade source.
    pub node_addr6: Option<std::net::Ipv6Addr>,
    /// Uplink ifindex.
    pub uplink_ifindex: u32,
    /// `ipMasq`.
    pub ip_masq: bool,
    /// Cluster CIDRs (IPv4, then IPv6).
    pub cluster_cidrs: Vec<String>,
    /// SNAT port range.
    pub snat_ports: (u16, u16),
    /// Most SNAT ports one pod may hold towards one destination (0: no cap).
    pub snat_dest_cap: u32,
    /// The node addresses the programs treat as "this node" (IPv4, then IPv6).
    pub node_addrs: Vec<std::net::IpAddr>,
    /// The tunnel device's ifindex (0: other nodes' pods are routed, not tunnelled).
    pub tunnel_ifindex: u32,
    /// `crossNode: crossSubnet`: the nodes of the uplink's own subnet are routed
    /// directly.
    pub cross_subnet: bool,
    /// `networkPolicy`: NetworkPolicy enforced, pods closed until the agent's first swap.
    pub network_policy: bool,
    /// The WireGuard device's ifindex (0: no encryption).
    pub wireguard_ifindex: u32,
    /// The WireGuard device's UDP port.
    pub wireguard_port: u16,
    /// `encryptionStrict`: a node without a key is unreachable (else reached in clear).
    pub wireguard_strict: bool,
}

/// Everything the datapath holds for one (container ID, ifname), for GC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttachmentState {
    /// Container ID.
    pub container_id: String,
    /// Ifname.
    pub ifname: String,
    /// Endpoint addresses (both families).
    pub ips: Vec<std::net::IpAddr>,
    /// Host veth ifindexes of its endpoint entries.
    pub host_ifindexes: Vec<u32>,
    /// Number of host ports.
    pub port_mappings: usize,
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
    /// Every endpoint entry with its owner and counters.
    pub fn endpoints(&self) -> Result<Vec<EndpointView>> {
        let mut m = self.maps()?;
        let eps = endpoint_entries(&mut m)?;
        let stats = m.ep_stats()?;
        let stats: BTreeMap<u32, EndpointStats> = stats
            .iter()
            .filter_map(std::result::Result::ok)
            .map(|(k, v)| (k, maps::sum_stats(&v)))
            .collect();
        let pacing: BTreeMap<u32, cni_ebpf_common::Pacing> =
            maps::entries(&m.pacing()?).into_iter().collect();
        let shares: BTreeMap<u32, cni_ebpf_common::NatUse> =
            maps::entries(&m.nat_use()?).into_iter().collect();
        let owners = m.owners()?;
        let mut out: Vec<_> = eps
            .into_iter()
            .map(|(ip, v)| {
                let (container_id, ifname) = owner_names_of(&owners, v.owner);
                let s = stats.get(&v.ifindex).copied().unwrap_or_default();
                EndpointView {
                    ip,
                    host_ifindex: v.ifindex,
                    host_mac: format_mac(&v.host_mac),
                    pod_mac: format_mac(&v.pod_mac),
                    container_id,
                    ifname,
                    tx_packets: s.tx_packets,
                    tx_bytes: s.tx_bytes,
                    rx_packets: s.rx_packets,
                    rx_bytes: s.rx_bytes,
                    egress_rate_bits: pacing.get(&v.ifindex).map(|p| p.bytes_per_s * 8),
                    egress_rate_mode: pacing.get(&v.ifindex).map(|p| {
                        if p.mode == cni_ebpf_common::PacingMode::BY_FQ {
                            "fq"
                        } else {
                            "police"
                        }
                    }),
                    // Signed: a racing give-back may leave a share just below zero.
                    nat_flows: shares
                        .get(&v.ifindex)
                        .map(|u| u32::try_from(u.entries.cast_signed().max(0)).unwrap_or(0) / 2),
                    nat_flows_cap: shares.get(&v.ifindex).map(|u| u.cap / 2),
                    removing: !v.flags.contains(EndpointFlags::ACTIVE),
                    interface: if v.flags.contains(EndpointFlags::NETKIT) {
                        "netkit"
                    } else {
                        "veth"
                    },
                }
            })
            .collect();
        out.sort_by_key(|e| e.ip);
        Ok(out)
    }

    /// Every host port, IPv4 then IPv6.
    pub fn port_mappings(&self) -> Result<Vec<PortMappingView>> {
        let mut m = self.maps()?;
        let pms = maps::entries(&m.portmaps()?);
        let pms6 = maps::entries(&m.portmaps6()?);
        let owners = m.owners()?;
        let view =
            |owner: u64, host_ip: Option<IpAddr>, port: u16, p: u8, pod: IpAddr, cport: u16| {
                let (container_id, ifname) = owner_names_of(&owners, owner);
                PortMappingView {
                    host_ip,
                    host_port: port_from_map(port),
                    protocol: proto_name(p),
                    pod_ip: pod,
                    container_port: port_from_map(cport),
                    container_id,
                    ifname,
                }
            };
        let mut out: Vec<_> = pms
            .into_iter()
            .map(|(k, v)| {
                let host = (k.addr != 0).then(|| ipv4_from_map(k.addr).into());
                view(
                    v.owner,
                    host,
                    k.port,
                    k.proto,
                    ipv4_from_map(v.addr).into(),
                    v.port,
                )
            })
            .chain(pms6.into_iter().map(|(k, v)| {
                let host = (k.addr != [0; 4]).then(|| ipv6_from_map(k.addr).into());
                view(
                    v.owner,
                    host,
                    k.port,
                    k.proto,
                    ipv6_from_map(v.addr).into(),
                    v.port,
                )
            }))
            .collect();
        out.sort_by(|a, b| (a.host_port, &a.protocol).cmp(&(b.host_port, &b.protocol)));
        Ok(out)
    }

    /// Every NAT entry, IPv4 then IPv6.
    pub fn nat_entries(&self) -> Result<Vec<NatView>> {
        let now = now_ns();
        let mut m = self.maps()?;
        let v4 = maps::entries(&m.nat()?);
        let v6 = maps::entries(&m.nat6()?);
        Ok(v4
            .into_iter()
            .map(|(k, v)| nat_view(&k, &v, now, |a| ipv4_from_map(a).into()))
            .chain(
                v6.into_iter()
                    .map(|(k, v)| nat_view(&k, &v, now, |a| ipv6_from_map(a).into())),
            )
            .collect())
    }

    /// SNAT port use (see [`SnatUsage`]): the reverse entries that reserve a translated
    /// port — masquerade replies, and replies of a pod reaching itself through its own host
    /// port (the only hairpin flows whose source is translated).
    pub fn snat_usage(&self) -> Result<SnatUsage> {
        let cfg = self.node_config_raw()?;
        let (lo, hi) = (cfg.snat_port_min, cfg.snat_port_max);
        let range_size = if lo == 0 || hi < lo {
            0
        } else {
            u64::from(hi - lo) + 1
        };
        let mut m = self.maps()?;
        // Hash sets: a full NAT table has 131 072 entries (a B-tree doubled the cost).
        let mut ports = std::collections::HashSet::new();
        let mut per_dest: std::collections::HashMap<(u32, u16, u8), u64> =
            std::collections::HashMap::new();
        let mut reservations = 0;
        for (k, v) in maps::entries(&m.nat()?) {
            // A reverse entry's key is the reply: peer → translated address:port.
            let reserves = match v.kind {
                NatKind::SNAT_REV | NatKind::SERVICE_REV => true,
                NatKind::HAIRPIN_REV => k.saddr == v.daddr,
                _ => false,
            };
            if !reserves {
                continue;
            }
            reservations += 1;
            ports.insert((k.proto, k.dport));
            *per_dest.entry((k.saddr, k.sport, k.proto)).or_default() += 1;
        }
        let max_per_pod_destination = maps::entries(&m.nat_dest_use()?)
            .into_iter()
            .map(|(_, n)| u64::from(n))
            .max()
            .unwrap_or(0);
        Ok(SnatUsage {
            range_size,
            reservations,
            ports_in_use: ports.len() as u64,
            max_per_destination: per_dest.values().copied().max().unwrap_or(0),
            pod_destination_cap: u64::from(cfg.snat_dest_cap),
            max_per_pod_destination,
        })
    }

    /// Counts of the flow-tracking maps (see [`FlowSummary`]).
    pub fn flow_summary(&self) -> Result<FlowSummary> {
        let mut m = self.maps()?;
        let mut out = FlowSummary::default();
        for (_, f) in maps::entries(&m.flows()?) {
            if f.flags.contains(FlowFlags::VERIFIED) {
                out.verified += 1;
            } else if f.flags.contains(FlowFlags::PENDING) {
                out.pending += 1;
            }
            if f.flags.contains(FlowFlags::INBOUND) {
                out.inbound += 1;
            }
        }
        out.stack_sockets = maps::entries(&m.stack_sockets()?).len() as u64;
        out.host_port_sockets = (maps::entries(&m.sock_revnat()?).len()
            + maps::entries(&m.sock_revnat6()?).len()) as u64;
        Ok(out)
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
                .map_err(|e| maps::err(map_name::REASONS, "read", e))?;
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
    pub fn node_config_view(&self) -> Result<NodeConfigView> {
        let cfg = self.node_config_raw()?;
        let cfg6 = self.node_config6_raw()?;
        let mut m = self.maps()?;
        let mut node_addrs: Vec<std::net::IpAddr> = maps::entries(&m.node_addrs()?)
            .into_iter()
            .map(|(k, _)| ipv4_from_map(k).into())
            .chain(
                maps::entries(&m.node_addrs6()?)
                    .into_iter()
                    .map(|(k, _)| ipv6_from_map(k).into()),
            )
            .collect();
        node_addrs.sort();
        let n = (cfg.n_cidrs as usize).min(MAX_CLUSTER_CIDRS);
        let n6 = (cfg6.n_cidrs as usize).min(MAX_CLUSTER_CIDRS);
        let cidrs4 = cfg.cluster_cidrs[..n].iter().map(|c| {
            let prefix = u32::from_be_bytes(c.mask.to_ne_bytes()).count_ones();
            format!("{}/{prefix}", ipv4_from_map(c.addr))
        });
        let cidrs6 = cfg6.cluster_cidrs[..n6].iter().map(|c| {
            let prefix: u32 = c.mask.iter().map(|w| w.count_ones()).sum();
            format!("{}/{prefix}", ipv6_from_map(c.addr))
        });
        Ok(NodeConfigView {
            node_addr: (cfg.node_addr != 0).then(|| ipv4_from_map(cfg.node_addr)),
            node_addr6: (cfg6.node_addr != [0; 4]).then(|| ipv6_from_map(cfg6.node_addr)),
            uplink_ifindex: cfg.uplink_ifindex,
            ip_masq: cfg.flags.contains(NodeFlags::MASQ),
            cluster_cidrs: cidrs4.chain(cidrs6).collect(),
            snat_ports: (cfg.snat_port_min, cfg.snat_port_max),
            snat_dest_cap: cfg.snat_dest_cap,
            node_addrs,
            tunnel_ifindex: cfg.tunnel_ifindex,
            cross_subnet: cfg.flags.contains(NodeFlags::CROSS_SUBNET),
            wireguard_ifindex: cfg.wireguard_ifindex,
            wireguard_port: cfg.wireguard_port,
            wireguard_strict: cfg.flags.contains(NodeFlags::WIREGUARD)
                && !cfg.flags.contains(NodeFlags::WIREGUARD_CLEAR_TO_KEYLESS),
            network_policy: cfg.flags.contains(NodeFlags::ENFORCE_POLICY),
        })
    }

    /// Every (container ID, ifname) the maps hold state for (GC compares this with
    /// `cni.dev/valid-attachments`).
    pub fn attachments(&self) -> Result<Vec<AttachmentState>> {
        let mut m = self.maps()?;
        let owners = maps::entries(&m.owners()?);
        let eps = endpoint_entries(&mut m)?;
        let pms = maps::entries(&m.portmaps()?);
        let pms6 = maps::entries(&m.portmaps6()?);
        Ok(owners
            .into_iter()
            .map(|(id, o)| {
                let (container_id, ifname) = maps::owner_names(&o);
                let mine: Vec<_> = eps.iter().filter(|(_, v)| v.owner == id).collect();
                let mut host_ifindexes: Vec<u32> = mine.iter().map(|(_, v)| v.ifindex).collect();
                host_ifindexes.sort_unstable();
                host_ifindexes.dedup();
                AttachmentState {
                    container_id,
                    ifname,
                    ips: mine.iter().map(|(a, _)| *a).collect(),
                    host_ifindexes,
                    port_mappings: pms.iter().filter(|(_, v)| v.owner == id).count()
                        + pms6.iter().filter(|(_, v)| v.owner == id).count(),
                }
            })
            .collect())
    }
}

/// Every endpoint entry of both families, by address.
fn endpoint_entries(m: &mut maps::Maps) -> Result<Vec<(IpAddr, EndpointInfo)>> {
    let v4 = maps::entries(&m.endpoints()?)
        .into_iter()
        .map(|(k, v)| (IpAddr::from(ipv4_from_map(k.addr)), v));
    let v6 = maps::entries(&m.endpoints6()?)
        .into_iter()
        .map(|(k, v)| (IpAddr::from(ipv6_from_map(k.addr)), v));
    Ok(v4.chain(v6).collect())
}

/// One NAT entry as `inspect` shows it (`addr`: the family's address conversion).
fn nat_view<A: Copy>(
    k: &cni_ebpf_common::NatKeyOf<A>,
    v: &cni_ebpf_common::NatEntryOf<A>,
    now: u64,
    addr: impl Fn(A) -> IpAddr,
) -> NatView {
    NatView {
        kind: v.kind.name(),
        hook: v.hook.name(),
        protocol: proto_name(k.proto),
        src: addr(k.saddr),
        sport: port_from_map(k.sport),
        dst: addr(k.daddr),
        dport: port_from_map(k.dport),
        new_src: addr(v.saddr),
        new_sport: port_from_map(v.sport),
        new_dst: addr(v.daddr),
        new_dport: port_from_map(v.dport),
        idle_ms: now.saturating_sub(v.last_seen_ns) / 1_000_000,
        state: v.flags.close_state(),
        deliver: match v.deliver {
            NatDeliver::STACK => "stack",
            NatDeliver::ROUTE => "route",
            _ => "direct",
        },
        pod_ifindex: v.pod,
    }
}

/// The (container ID, ifname) of an owner id (empty when its record is missing).
fn owner_names_of(
    owners: &aya::maps::HashMap<&mut aya::maps::MapData, u64, cni_ebpf_common::Owner>,
    owner: u64,
) -> (String, String) {
    maps::get(owners, &owner, map_name::OWNERS)
        .ok()
        .flatten()
        .map(|o| maps::owner_names(&o))
        .unwrap_or_default()
}
