#![no_std]
//! Types shared by the eBPF programs (`cni-ebpf-bpf`) and userspace (`cni-ebpf`).
//!
//! Every map key/value is `#[repr(C)]` with explicit padding and a compile-time size
//! check; the byte order of each field is written in its doc comment.
//!
//! "Network order" below means: the bytes exactly as they appear on the wire, read as a
//! native integer (what the eBPF program gets from `ctx.load::<u32>()`). Userspace builds
//! such a value with `u32::from_ne_bytes(addr.octets())` / `u16::from_ne_bytes(port.to_be_bytes())`.

use core::mem::size_of;

/// Version of the pin layout and of every map layout below. Bump it whenever a map's
/// key/value layout, a map's name or the pin tree changes (a unit test of the maps' table,
/// `map_table!`, fails until it is); userspace refuses to use pins of another version (see
/// `cni-ebpf/src/datapath/pins.rs`).
pub const LAYOUT_VERSION: u32 = 12;

mod dns;
mod hash;
mod names;
mod nat;
mod observe;
mod policy;
mod reason;
mod service;
mod tunnel;

pub use dns::*;
pub use hash::{fnv1a64, owner_id};
pub use names::{global, map, prog};
pub use nat::*;
pub use observe::*;
pub use policy::*;
pub use reason::{Reason, REASON_SLOTS};
pub use service::*;
pub use tunnel::*;

/// Capacity of [`map::ENDPOINTS`] (pod addresses on one node).
pub const MAX_ENDPOINTS: u32 = 4096;
/// Capacity of [`map::PORTMAPS`].
pub const MAX_PORTMAPS: u32 = 8192;
/// Capacity of [`map::NAT`]; every translated flow takes two entries.
pub const MAX_NAT: u32 = 131_072;
/// Capacity of [`map::NODE_ADDRS`].
pub const MAX_NODE_ADDRS: u32 = 256;
/// Capacity of [`map::OWNERS`].
pub const MAX_OWNERS: u32 = 8192;
/// Capacity of [`map::FLOWS`].
pub const MAX_FLOWS: u32 = 131_072;
/// Capacity of [`map::STACK_SOCKETS`].
pub const MAX_STACK_SOCKETS: u32 = 65_536;
/// Capacity of [`map::SRC_ALLOW`].
pub const MAX_SRC_ALLOW: u32 = 4096;
/// Capacity of [`map::SRC_ALLOW6`] (pods' own IPv6 addresses and IPv6 allow-list prefixes).
pub const MAX_SRC_ALLOW6: u32 = 8192;
/// Capacity of [`map::NAT_USE`] (one entry per pod interface, plus the sweep clock).
pub const MAX_NAT_USE: u32 = MAX_ENDPOINTS + 1;
/// Capacity of [`map::NAT_DEST_USE`]: one key per (pod, destination) holding at least one
/// SNAT port, so never more than the masqueraded flows [`map::NAT`] can hold.
pub const MAX_NAT_DEST_USE: u32 = MAX_NAT / 2;
/// Default of `natFlowsPerPod`: translated flows one pod may hold at once. Each takes two
/// entries of [`map::NAT`], so a pod may hold an eighth of the table: no single pod can
/// fill it, and only eight pods at their cap together could. (A busy proxy pod holding
/// thousands of connections stays well below it: the end-to-end test holds 5 000.)
pub const DEFAULT_NAT_FLOWS_PER_POD: u32 = 8192;
/// A slice of the sweep for finished flows runs at most this often (ns), node-wide, and
/// only when a pod at its cap or a full table asks for room. A slice walks the table
/// (measured here: ≈ 1 ms when it stops early, up to ≈ 18 ms when it must walk a full
/// table to its end), so once a second bounds what sweeping can cost a node to about 2 %
/// of one CPU while pods sit at their caps, and to nothing otherwise.
pub const NAT_SWEEP_INTERVAL_NS: u64 = 1_000_000_000;
/// How many entries one slice of the sweep looks at closely (reads the flow's other entry
/// for): bounds the time one packet pays for a slice. Entries whose flow cannot be over
/// yet (seen too recently) and entries a slice of the same pass found live cost only the
/// visit.
pub const NAT_SWEEP_BUDGET: u32 = 2048;
/// Capacity of [`map::SOCK_REVNAT`] (and of [`map::SOCK_REVNAT6`]).
pub const MAX_SOCK_REVNAT: u32 = 65_536;
/// Number of `clusterCIDRs` the programs consider (per family).
pub const MAX_CLUSTER_CIDRS: usize = 16;
/// Capacity of [`map::ENDPOINTS6`].
pub const MAX_ENDPOINTS6: u32 = 2 * MAX_ENDPOINTS;
/// Capacity of [`map::NAT6`]. Not preallocated (a node without IPv6 pods pays nothing).
pub const MAX_NAT6: u32 = MAX_NAT;
/// Capacity of [`map::FLOWS6`] (an LRU, preallocated: a quarter of the IPv4 table's, so
/// that a node without IPv6 pods pays little for it).
pub const MAX_FLOWS6: u32 = MAX_FLOWS / 4;
/// Capacity of [`map::STACK_SOCKETS6`] (an LRU, preallocated, see [`MAX_FLOWS6`]).
pub const MAX_STACK_SOCKETS6: u32 = MAX_STACK_SOCKETS / 4;
/// Capacity of [`map::NODE_ADDRS6`].
pub const MAX_NODE_ADDRS6: u32 = MAX_NODE_ADDRS;

/// Key of [`map::ENDPOINTS`]: one pod IPv4 address.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointKey {
    /// Pod IPv4 address, network order.
    pub addr: u32,
}
const _: () = assert!(size_of::<EndpointKey>() == 4);

/// Key of [`map::ENDPOINTS6`]: one pod IPv6 address (value: [`EndpointInfo`], as for
/// IPv4).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointKey6 {
    /// Pod IPv6 address, wire order.
    pub addr: Addr6,
}
const _: () = assert!(size_of::<EndpointKey6>() == 16);

bitflags::bitflags! {
    /// [`EndpointInfo::flags`] (native order).
    #[repr(transparent)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct EndpointFlags: u32 {
        /// The entry is complete and may be used by the programs. Without it the entry is
        /// a tombstone: its pod is being removed (DEL, GC, an undone ADD), and the flows of
        /// its address may not be purged yet. The programs treat it as absent; the entry
        /// itself goes once the purge is done, so an address without any entry has no
        /// flow state left (ADD's purge relies on that).
        const ACTIVE = 1;
        /// The pod has an egress rate ([`map::PACING`] has an entry for its host veth),
        /// so its packets are paced.
        const PACED = 2;
        /// The pod has no host ports, so no hairpin flow is served by it: its packets to
        /// other local pods skip the hairpin lookup. Negative on purpose: an entry
        /// without it (as builds before it wrote them) keeps the lookup.
        const NO_HOST_PORTS = 4;
        /// The pod's interface is a netkit pair (`interface: netkit`): `ifindex` is its
        /// host device, the netkit primary. Read by userspace only (`inspect`, CHECK).
        const NETKIT = 8;
        // Bits this build does not know are kept, not dropped.
        const _ = !0;
    }
}

/// How long a paced pod's packets may wait beyond its burst before they are dropped
/// instead (25 ms, the queueing latency the reference `bandwidth` plugin gives its tbf).
pub const PACING_LATENCY_NS: u64 = 25_000_000;
/// Where nothing paces (no `fq` in the kernel), how long beyond the burst a pod may run
/// ahead of its rate before its packets are dropped (300 ms). TCP needs that room to keep
/// its window open against a policer, with veth's 64 KiB GSO packets: measured at 20
/// Mbit/s, iperf3 TCP reached 18 % of the rate with 25 ms, 57 % with 100 ms and 101 % with
/// 300 ms, while UDP stayed at the rate with each.
pub const PACING_POLICE_LIMIT_NS: u64 = 300_000_000;
/// The longest burst honoured, in time at the pod's rate (1 s): Kubernetes passes a
/// burst of 2³¹ − 1 bits when the pod sets none, which would otherwise let a slow pod
/// send minutes of traffic at line rate after an idle spell.
pub const PACING_MAX_BURST_NS: u64 = 1_000_000_000;

/// Value of [`map::PACING`]: one pod's egress rate as a departure-time schedule (a token
/// bucket in time: "GCRA"). The programs give each packet a departure time (`skb->tstamp`)
/// that an `fq` qdisc where it leaves the node honours.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pacing {
    /// Rate in bytes per second, native order; never 0.
    pub bytes_per_s: u64,
    /// Burst as time at that rate (≤ [`PACING_MAX_BURST_NS`]), native order.
    pub burst_ns: u64,
    /// Theoretical arrival time (`CLOCK_MONOTONIC` ns) of the bucket: when it would be
    /// full again. Written by the programs; userspace writes 0.
    pub tat_ns: u64,
    /// How long a packet may wait beyond the burst before it is dropped (ns, native
    /// order): [`PACING_LATENCY_NS`] where fq paces, more where the schedule only polices.
    pub limit_ns: u64,
    /// How the schedule is enforced, native order.
    pub mode: PacingMode,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Pacing>() == 40);

/// [`Pacing::mode`]: how a pod's egress schedule is enforced (a newtype over the stored
/// word rather than a Rust enum, so that any value read from the map is valid; see
/// [`NatHook`]).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PacingMode(pub u32);

impl PacingMode {
    /// The kernel has no `fq` (`CONFIG_NET_SCH_FQ`), so nothing would honour a departure
    /// time: the schedule only polices (drops what exceeds burst and latency).
    pub const POLICE: Self = Self(0);
    /// An `fq` qdisc on the uplink honours departure times, so packets get one
    /// (`skb->tstamp`) and wait there; only packets beyond the latency are dropped.
    pub const BY_FQ: Self = Self(1);
}

/// Value of [`map::ENDPOINTS`]: where and how to deliver to a local pod.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Host-side veth ifindex (native order); `bpf_redirect_peer` target.
    pub ifindex: u32,
    /// What the entry is ready for.
    pub flags: EndpointFlags,
    /// MAC of the host-side veth (wire order): source MAC of frames delivered to the pod.
    pub host_mac: [u8; 6],
    /// MAC of the pod's interface (wire order): destination MAC of frames delivered to it.
    pub pod_mac: [u8; 6],
    /// Explicit padding, always zero.
    pub _pad: [u8; 4],
    /// Owner of the entry ([`owner_id`] of container ID and ifname, native order).
    pub owner: u64,
}
const _: () = assert!(size_of::<EndpointInfo>() == 32);

/// Value of [`map::EP_STATS`] (per CPU): traffic of one pod as seen by our programs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Packets from the pod (host veth ingress), native order.
    pub tx_packets: u64,
    /// Bytes from the pod, native order.
    pub tx_bytes: u64,
    /// Packets our programs redirected into the pod, native order.
    pub rx_packets: u64,
    /// Bytes redirected into the pod, native order.
    pub rx_bytes: u64,
}
const _: () = assert!(size_of::<EndpointStats>() == 32);

/// IP protocol numbers.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
}

/// Key of [`map::PORTMAPS`]: one host port.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortKey {
    /// `hostIP` (network order); 0 = every node address.
    pub addr: u32,
    /// `hostPort`, network order.
    pub port: u16,
    /// [`proto::TCP`] or [`proto::UDP`].
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<PortKey>() == 8);

/// Value of [`map::PORTMAPS`]: the pod behind a host port.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortTarget {
    /// Pod IPv4 address, network order.
    pub addr: u32,
    /// `containerPort`, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
    /// Owner ([`owner_id`]), native order.
    pub owner: u64,
}
const _: () = assert!(size_of::<PortTarget>() == 16);

/// Key of [`map::PORTMAPS6`]: an IPv6 host port (as [`PortKey`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PortKey6 {
    /// `hostIP`, wire order; `::` = every node IPv6 address.
    pub addr: Addr6,
    /// `hostPort`, network order.
    pub port: u16,
    /// [`proto::TCP`] or [`proto::UDP`].
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<PortKey6>() == 20);

/// Value of [`map::PORTMAPS6`]: the pod behind an IPv6 host port (as [`PortTarget`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortTarget6 {
    /// Pod IPv6 address, wire order.
    pub addr: Addr6,
    /// `containerPort`, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: [u16; 3],
    /// Owner ([`owner_id`]), native order.
    pub owner: u64,
}
const _: () = assert!(size_of::<PortTarget6>() == 32);

/// Value of [`map::SRC_ALLOW6`]: one of the pod's own addresses.
pub const SRC6_OWN: u32 = 2;
/// Value of [`map::SRC_ALLOW6`]: a prefix of the pod's allow-list.
pub const SRC6_ALLOWED: u32 = 1;

/// Data of a [`map::SRC_ALLOW6`] key (after the LPM prefix length, which counts the 32
/// bits of `ifindex` plus the prefix of `addr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SrcAllow6Key {
    /// Host veth ifindex of the pod, big-endian (the trie matches bytes in order).
    pub ifindex_be: u32,
    /// Source prefix, wire order.
    pub addr: [u8; 16],
}
const _: () = assert!(size_of::<SrcAllow6Key>() == 20);

bitflags::bitflags! {
    /// [`FlowEntry::flags`] (native order).
    #[repr(transparent)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct FlowFlags: u32 {
        /// `from_pod` handed a packet of this flow to the stack and waits for
        /// `uplink_egress` to see it leave unchanged.
        const PENDING = 1;
        /// A packet of this flow left the uplink exactly as the pod sent it (netfilter did
        /// not translate it): later packets may bypass the stack.
        const VERIFIED = 2;
        /// The flow was opened from outside the cluster towards the pod; its packets
        /// from the pod are never masqueraded.
        const INBOUND = 4;
        // Bits this build does not know are kept, not dropped.
        const _ = !0;
    }
}

/// Value of [`map::FLOWS`], keyed by a pod flow's [`NatKey`] as the pod sends it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowEntry {
    /// Where the flow stands.
    pub flags: FlowFlags,
    /// When a segment of the flow that the tunnel device merges (GRO) last came out of
    /// the tunnel, native order: `bpf_ktime_get_ns` / 1024, wrapping (0: never). The
    /// flow's packets right after it go through the device too, so that none overtakes
    /// it (see `tunnel::decap4` in the programs).
    pub merged_at: u32,
    /// `bpf_ktime_get_ns` of the last packet that used the entry, native order.
    pub last_seen_ns: u64,
}
const _: () = assert!(size_of::<FlowEntry>() == 16);

/// Key of [`map::STACK_SOCKETS`] (`A` = [`Addr4`]): one pod socket.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockKeyOf<A> {
    /// Pod address, network order.
    pub addr: A,
    /// Pod port (or ICMP echo id), network order.
    pub port: u16,
    /// IP protocol ([`proto`]).
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
}
/// The IPv4 pod socket key.
pub type SockKey = SockKeyOf<Addr4>;
/// The IPv6 pod socket key.
pub type SockKey6 = SockKeyOf<Addr6>;
const _: () = assert!(size_of::<SockKey>() == 8);
const _: () = assert!(size_of::<SockKey6>() == 20);

/// Value of [`map::STACK_SOCKETS`]: the peer a pod socket last addressed through the stack.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SockPeerOf<A> {
    /// Peer address as the pod addressed it, network order.
    pub addr: A,
    /// Peer port as the pod addressed it, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
/// The IPv4 peer.
pub type SockPeer = SockPeerOf<Addr4>;
/// The IPv6 peer.
pub type SockPeer6 = SockPeerOf<Addr6>;
const _: () = assert!(size_of::<SockPeer>() == 8);
const _: () = assert!(size_of::<SockPeer6>() == 20);

/// Data of a [`map::SRC_ALLOW`] key (after the LPM prefix length, which counts the 32
/// bits of `ifindex` plus the prefix of `addr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SrcAllowKey {
    /// Host veth ifindex of the pod, big-endian (the trie matches bytes in order).
    pub ifindex_be: u32,
    /// Source prefix, network order.
    pub addr: u32,
}
const _: () = assert!(size_of::<SrcAllowKey>() == 8);

/// Key of [`map::SOCK_REVNAT`]: a node socket and the pod address it was sent to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockRevKey {
    /// `bpf_get_socket_cookie` of the socket, native order.
    pub cookie: u64,
    /// Pod address, network order.
    pub addr: u32,
    /// Pod port, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevKey>() == 16);

/// Value of [`map::SOCK_REVNAT`]: the host-port address the socket asked for.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SockRevValue {
    /// Address the socket addressed (a node address or 127.0.0.0/8), network order.
    pub addr: u32,
    /// Host port, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevValue>() == 8);

/// Key of [`map::SOCK_REVNAT6`]: a node socket and the IPv6 pod address it was sent to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockRevKey6 {
    /// `bpf_get_socket_cookie` of the socket, native order.
    pub cookie: u64,
    /// Pod address, network order.
    pub addr: Addr6,
    /// Pod port, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
    /// Explicit padding, always zero.
    pub _pad2: u32,
}
const _: () = assert!(size_of::<SockRevKey6>() == 32);

/// Value of [`map::SOCK_REVNAT6`]: the IPv6 host-port address the socket asked for.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SockRevValue6 {
    /// Address the socket addressed (a node address or `::1`), network order.
    pub addr: Addr6,
    /// Host port, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevValue6>() == 20);

bitflags::bitflags! {
    /// [`NodeConfig::flags`] (native order).
    #[repr(transparent)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct NodeFlags: u32 {
        /// Masquerade traffic leaving the cluster (`ipMasq`).
        const MASQ = 1;
        /// Same-node pod → pod goes through the node's stack, so that its netfilter (an
        /// add-on NetworkPolicy enforcer's FORWARD rules) sees it (`sameNodeFastPath:
        /// false`).
        const POD_TRAFFIC_TO_STACK = 2;
        /// `crossNode: crossSubnet`: nodes on the uplink's own subnet are reached
        /// directly, the others through the tunnel (the agent's routes decide; the
        /// programs only read it to report it).
        const CROSS_SUBNET = 4;
        /// `networkPolicy` (the default): NetworkPolicy is enforced on this network. Until
        /// the agent has put the cluster's policy in force since the maps were made
        /// (`PolicyState::generation` 0: a boot, a purge, a new layout), every pod is
        /// closed but to its node's traffic. Without it, generation 0 judges nothing.
        const ENFORCE_POLICY = 8;
        /// `encryption: wireguard`: pod traffic to other nodes goes through the node's
        /// WireGuard device (`wireguard_ifindex`); a cluster destination whose node has
        /// no key is dropped.
        const WIREGUARD = 16;
        /// With [`Self::WIREGUARD`]: a node without a key is reached in clear instead
        /// (`encryptionStrict: false`).
        const WIREGUARD_CLEAR_TO_KEYLESS = 32;
        // Bits this build does not know are kept, not dropped.
        const _ = !0;
    }
}

/// One `clusterCIDRs` entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cidr4 {
    /// Network address, network order.
    pub addr: u32,
    /// Netmask, network order (e.g. `/16` is the bytes ff ff 00 00).
    pub mask: u32,
}
const _: () = assert!(size_of::<Cidr4>() == 8);

/// One IPv6 `clusterCIDRs` entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cidr6 {
    /// Network address, wire order.
    pub addr: Addr6,
    /// Netmask, wire order.
    pub mask: Addr6,
}
const _: () = assert!(size_of::<Cidr6>() == 32);

impl Cidr6 {
    /// Whether `a` is inside this prefix.
    #[must_use]
    pub fn contains(&self, a: &Addr6) -> bool {
        (a[0] & self.mask[0]) == self.addr[0]
            && (a[1] & self.mask[1]) == self.addr[1]
            && (a[2] & self.mask[2]) == self.addr[2]
            && (a[3] & self.mask[3]) == self.addr[3]
    }
}

/// Value of [`map::NODE_CONFIG6`] (one entry, index 0): the IPv6 half of the node's
/// configuration (the switches, ports and uplink in [`NodeConfig`] hold for both).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeConfig6 {
    /// Node IPv6 address used as the masquerade source (the uplink's global address),
    /// wire order; `::` = no IPv6 masquerade.
    pub node_addr: Addr6,
    /// Number of valid entries in `cluster_cidrs`, native order.
    pub n_cidrs: u32,
    /// Padding (zero).
    pub _pad: u32,
    /// `clusterCIDRs` (IPv6 ones), never masqueraded.
    pub cluster_cidrs: [Cidr6; MAX_CLUSTER_CIDRS],
}
const _: () = assert!(size_of::<NodeConfig6>() == 24 + 32 * MAX_CLUSTER_CIDRS);

/// Value of [`map::NODE_CONFIG`] (one entry, index 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeConfig {
    /// Node IPv4 address used as the masquerade source, network order; 0 = no SNAT.
    pub node_addr: u32,
    /// Uplink ifindex, native order.
    pub uplink_ifindex: u32,
    /// Node-wide switches.
    pub flags: NodeFlags,
    /// Number of valid entries in `cluster_cidrs`, native order.
    pub n_cidrs: u32,
    /// First SNAT port (inclusive), native order.
    pub snat_port_min: u16,
    /// Last SNAT port (inclusive), native order.
    pub snat_port_max: u16,
    /// Most SNAT ports one pod may hold towards one destination (address, port,
    /// protocol), native order (`natPortsPerDestination`; 0: no cap).
    pub snat_dest_cap: u32,
    /// ifindex of the node's tunnel device (`crossNode` `tunnel` or `crossSubnet`),
    /// native order; 0: pods of other nodes are routed, not tunnelled.
    pub tunnel_ifindex: u32,
    /// The tunnel's VXLAN network identifier, native order.
    pub tunnel_vni: u32,
    /// The tunnel's UDP port, native order (0: no tunnel). The uplink programs pass the
    /// node's own encapsulated packets on this port at once.
    pub tunnel_port: u16,
    /// The WireGuard device's UDP port, native order (0: no encryption). The uplink
    /// programs pass the node's own WireGuard packets on this port at once.
    pub wireguard_port: u16,
    /// `clusterCIDRs` (IPv4 ones), never masqueraded.
    pub cluster_cidrs: [Cidr4; MAX_CLUSTER_CIDRS],
    /// ifindex of the node's WireGuard device (`encryption: wireguard`), native order;
    /// 0: none.
    pub wireguard_ifindex: u32,
    /// Cookie of the node's network namespace (`SO_NETNS_COOKIE`), native order: the
    /// socket hooks translate only sockets of this namespace (0: none).
    pub netns_cookie: u64,
}
const _: () = assert!(size_of::<NodeConfig>() == 36 + 8 * MAX_CLUSTER_CIDRS + 4 + 8);

/// Value of [`map::NODE_STATE`] (one entry, index 0): node-wide bookkeeping of userspace
/// that the programs never read, kept apart from [`NodeConfig`] so that everything the
/// kernel reads is what the programs act on.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeState {
    /// When userspace last listed every node address (`CLOCK_BOOTTIME` seconds, native
    /// order; 0 = never).
    pub addrs_listed_s: u32,
    /// Until when the node's agent holds its lease on the network's NetworkPolicy
    /// (`CLOCK_BOOTTIME` seconds, native order; 0 = never held): the agent renews it
    /// every second; ADD closes the new pods of a network that enforces policy once it
    /// has run out (no agent keeps the policy current).
    pub agent_lease_s: u32,
}
const _: () = assert!(size_of::<NodeState>() == 8);

/// Value of [`map::NODE_ADDRS`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeAddr {
    /// ifindex the address is on, native order (informational).
    pub ifindex: u32,
}
const _: () = assert!(size_of::<NodeAddr>() == 4);

/// Longest container ID kept in an [`Owner`] record (longer IDs are refused by userspace).
pub const OWNER_ID_LEN: usize = 240;
/// Longest interface name kept in an [`Owner`] record.
pub const OWNER_IFNAME_LEN: usize = 16;

/// Value of [`map::OWNERS`]: who an owner id stands for (read by userspace only).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Length of `container_id` in bytes, native order.
    pub id_len: u32,
    /// Length of `ifname` in bytes, native order.
    pub ifname_len: u32,
    /// Container ID bytes (ASCII), zero-padded.
    pub container_id: [u8; OWNER_ID_LEN],
    /// Interface name bytes (`CNI_IFNAME`), zero-padded.
    pub ifname: [u8; OWNER_IFNAME_LEN],
}
const _: () = assert!(size_of::<Owner>() == 8 + OWNER_ID_LEN + OWNER_IFNAME_LEN);

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): `#[repr(C)]`, only integer fields and explicit padding, no implicit
    // padding (checked by the size asserts), every bit pattern valid.
    unsafe impl aya::Pod for super::EndpointKey {}
    unsafe impl aya::Pod for super::PolicyEndpointKey {}
    unsafe impl aya::Pod for super::PolicyEndpoint {}
    unsafe impl aya::Pod for super::PolicyState {}
    unsafe impl aya::Pod for super::PolicyPeerKey {}
    unsafe impl aya::Pod for super::PolicyPortKey {}
    unsafe impl aya::Pod for super::PolicyExactKey {}
    unsafe impl aya::Pod for super::PolicyFlowKey {}
    unsafe impl aya::Pod for super::PolicyFlow {}
    unsafe impl aya::Pod for super::FlowConfig {}
    unsafe impl aya::Pod for super::FlowCpu {}
    unsafe impl aya::Pod for super::FlowLogKey {}
    unsafe impl aya::Pod for super::FlowLogEntry {}
    unsafe impl aya::Pod for super::FlowEvent {}
    unsafe impl aya::Pod for super::PolicyTiers {}
    unsafe impl aya::Pod for super::PolicyDomainKey {}
    unsafe impl aya::Pod for super::PolicyLearnedKey {}
    unsafe impl aya::Pod for super::PolicyLearned {}
    unsafe impl aya::Pod for super::PolicyClassKey {}
    unsafe impl aya::Pod for super::PolicyClassCounts {}
    unsafe impl aya::Pod for super::PolicyDeny {}
    unsafe impl aya::Pod for super::PolicyCounts {}
    unsafe impl aya::Pod for super::TunnelKey {}
    unsafe impl aya::Pod for super::TunnelEndpoint {}
    // SAFETY: `#[repr(C)]`, plain integers, no padding.
    unsafe impl aya::Pod for super::WireguardPeer {}
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::Service {}
    unsafe impl aya::Pod for super::BackendSlot {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::Affinity {}
    unsafe impl aya::Pod for super::MemberKey {}
    unsafe impl aya::Pod for super::EndpointInfo {}
    unsafe impl aya::Pod for super::EndpointStats {}
    unsafe impl aya::Pod for super::PortKey {}
    unsafe impl aya::Pod for super::PortTarget {}
    unsafe impl aya::Pod for super::NatKey {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::NatKey6 {}
    unsafe impl aya::Pod for super::NatEntry6 {}
    unsafe impl aya::Pod for super::NatDestKey6 {}
    unsafe impl aya::Pod for super::EndpointKey6 {}
    unsafe impl aya::Pod for super::PortKey6 {}
    unsafe impl aya::Pod for super::PortTarget6 {}
    unsafe impl aya::Pod for super::Cidr6 {}
    unsafe impl aya::Pod for super::NodeConfig6 {}
    unsafe impl aya::Pod for super::SockKey6 {}
    unsafe impl aya::Pod for super::SockPeer6 {}
    unsafe impl aya::Pod for super::Cidr4 {}
    unsafe impl aya::Pod for super::NodeState {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl aya::Pod for super::NodeAddr {}
    unsafe impl aya::Pod for super::Owner {}
    unsafe impl aya::Pod for super::FlowEntry {}
    unsafe impl aya::Pod for super::SockKey {}
    unsafe impl aya::Pod for super::SockPeer {}
    unsafe impl aya::Pod for super::SockRevKey {}
    unsafe impl aya::Pod for super::SockRevValue {}
    unsafe impl aya::Pod for super::SockRevKey6 {}
    unsafe impl aya::Pod for super::SockRevValue6 {}
    unsafe impl aya::Pod for super::SrcAllowKey {}
    unsafe impl aya::Pod for super::Pacing {}
    unsafe impl aya::Pod for super::NatUse {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NatDestKey {}
    unsafe impl aya::Pod for super::SrcAllow6Key {}
}
