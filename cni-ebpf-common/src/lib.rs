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
/// key/value layout, a map's name or the pin tree changes; userspace refuses to use pins
/// of another version (see `cni-ebpf/src/datapath/pins.rs`).
pub const LAYOUT_VERSION: u32 = 5;

/// Names of the programs in the object (also their pin names).
pub mod prog {
    /// Host veth ingress (packets leaving a pod).
    pub const FROM_POD: &str = "from_pod";
    /// Uplink ingress (packets arriving at the node from outside).
    pub const UPLINK_INGRESS: &str = "uplink_ingress";
    /// Uplink egress (packets leaving the node).
    pub const UPLINK_EGRESS: &str = "uplink_egress";
    /// `connect()` of the node's own sockets (cgroup `connect4`).
    pub const SOCK_CONNECT4: &str = "sock_connect4";
    /// `sendmsg()` of the node's own unconnected UDP sockets (cgroup `sendmsg4`).
    pub const SOCK_SENDMSG4: &str = "sock_sendmsg4";
    /// `recvmsg()` of the node's own unconnected UDP sockets (cgroup `recvmsg4`).
    pub const SOCK_RECVMSG4: &str = "sock_recvmsg4";
    /// `getpeername()` of the node's own sockets (cgroup `getpeername4`).
    pub const SOCK_GETPEERNAME4: &str = "sock_getpeername4";
    /// The tc programs.
    pub const TC: [&str; 3] = [FROM_POD, UPLINK_INGRESS, UPLINK_EGRESS];
    /// The socket (cgroup sock_addr) programs.
    pub const SOCK: [&str; 4] = [
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
    ];
    /// Every program, in load order.
    pub const ALL: [&str; 7] = [
        FROM_POD,
        UPLINK_INGRESS,
        UPLINK_EGRESS,
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
    ];
}

/// Names of the maps in the object (also their pin names).
pub mod map {
    /// [`super::EndpointKey`] → [`super::EndpointInfo`].
    pub const ENDPOINTS: &str = "ENDPOINTS";
    /// Host veth ifindex (`u32`) → per-CPU [`super::EndpointStats`].
    pub const EP_STATS: &str = "EP_STATS";
    /// [`super::PortKey`] → [`super::PortTarget`].
    pub const PORTMAPS: &str = "PORTMAPS";
    /// [`super::NatKey`] → [`super::NatEntry`] (a plain hash: nothing is ever evicted;
    /// finished flows are reclaimed by the programs, see [`super::NatUse`]).
    pub const NAT: &str = "NAT";
    /// Index 0 → [`super::NodeConfig`].
    pub const NODE_CONFIG: &str = "NODE_CONFIG";
    /// Node IPv4 address (`u32`, network order) → [`super::NodeAddr`].
    pub const NODE_ADDRS: &str = "NODE_ADDRS";
    /// Per-CPU `u64` counters indexed by [`super::Reason`].
    pub const REASONS: &str = "REASONS";
    /// Owner id (`u64`, [`super::owner_id`]) → [`super::Owner`]; userspace only.
    pub const OWNERS: &str = "OWNERS";
    /// [`super::NatKey`] (a pod flow's tuple as the pod sends it) → [`super::FlowEntry`]
    /// (LRU): whether the flow may bypass the node's stack.
    pub const FLOWS: &str = "FLOWS";
    /// [`super::SockKey`] (a pod's socket) → [`super::SockPeer`] (LRU): the last peer
    /// that socket addressed through the node's stack.
    pub const STACK_SOCKETS: &str = "STACK_SOCKETS";
    /// [`super::SockRevKey`] → [`super::SockRevValue`] (LRU): what a node socket's host-port
    /// peer was before the socket hooks translated it.
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    /// LPM trie of [`super::SrcAllowKey`] → `u32` (1): extra source prefixes a pod may
    /// send from (its own addresses need no entry).
    pub const SRC_ALLOW: &str = "SRC_ALLOW";
    /// Host veth ifindex (`u32`, native order) → [`super::Pacing`]: a pod's egress rate
    /// (`runtimeConfig.bandwidth`).
    pub const PACING: &str = "PACING";
    /// LPM trie of [`super::SrcAllow6Key`] → `u32` ([`super::SRC6_OWN`] or
    /// [`super::SRC6_ALLOWED`]): the IPv6 sources a pod may send from, its own addresses
    /// (/128) and its allow-list alike.
    pub const SRC_ALLOW6: &str = "SRC_ALLOW6";
    /// Host veth ifindex (`u32`, native order) → [`super::NatUse`]: a pod's share of the
    /// NAT table (key 0: the node-wide sweep clock).
    pub const NAT_USE: &str = "NAT_USE";
    /// [`super::NatDestKey`] (a pod and a destination of its masqueraded flows) → `u32`:
    /// how many SNAT ports the pod holds towards that destination (see
    /// [`super::NodeConfig::snat_dest_cap`]). A key goes when its count reaches zero.
    pub const NAT_DEST_USE: &str = "NAT_DEST_USE";
    /// Every map.
    pub const ALL: [&str; 16] = [
        ENDPOINTS,
        EP_STATS,
        PORTMAPS,
        NAT,
        NODE_CONFIG,
        NODE_ADDRS,
        REASONS,
        OWNERS,
        FLOWS,
        STACK_SOCKETS,
        SOCK_REVNAT,
        SRC_ALLOW,
        PACING,
        SRC_ALLOW6,
        NAT_USE,
        NAT_DEST_USE,
    ];
}

/// Names of the object's global variables, which userspace may set at load time.
pub mod global {
    /// Test-only fault injection (`u32`): `1` makes every L4 checksum update of the tc
    /// programs (`bpf_l4_csum_replace`) fail after the packet's tuple was written, as a
    /// failing helper would. The plugin never sets it (it stays `0`); the packet tests
    /// load the object with it to check that such packets are dropped
    /// (`drop_rewrite_failed`) and leave no NAT state.
    pub const FAULT_L4_CSUM: &str = "FAULT_L4_CSUM";
}

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
/// Capacity of [`map::SOCK_REVNAT`].
pub const MAX_SOCK_REVNAT: u32 = 65_536;
/// Number of `clusterCIDRs` the programs consider.
pub const MAX_CLUSTER_CIDRS: usize = 16;

/// Decision and drop reasons counted per CPU in the `REASONS` map (index = value).
/// Values start at 16 so they never collide with `TC_ACT_*` verdicts.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Packet seen by one of our programs.
    Seen = 16,
    /// Passed unchanged: not IPv4 (ARP, IPv6, …).
    PassNotIpv4 = 17,
    /// Passed unchanged: truncated or malformed header.
    PassMalformed = 18,
    /// Passed unchanged: IPv4 header with options.
    PassIpOptions = 19,
    /// Passed unchanged: IPv4 fragment.
    PassFragment = 20,
    /// Passed unchanged: nothing of ours applies (host-stack traffic).
    PassNoMatch = 21,
    /// Passed to the stack: TTL would expire (the stack sends the ICMP error).
    PassTtlExpired = 22,
    /// Same-node pod → pod redirected into the destination pod.
    RedirectPod = 23,
    /// New masquerade (SNAT) flow created.
    SnatNew = 24,
    /// Packet of an existing masqueraded flow translated (pod → outside).
    SnatForward = 25,
    /// Reply of a masqueraded flow translated back to the pod.
    SnatReply = 26,
    /// New host-port (DNAT) flow created.
    DnatNew = 27,
    /// Packet of an existing host-port flow translated (client → pod).
    DnatForward = 28,
    /// Reply of a host-port flow translated back to hostIP:hostPort.
    DnatReply = 29,
    /// New hairpin flow (pod → own node's hostPort) created.
    HairpinNew = 30,
    /// Packet of an existing hairpin flow translated.
    HairpinForward = 31,
    /// ICMP error about a translated flow translated.
    IcmpErrorTranslated = 32,
    /// Dropped: no free SNAT port for this destination.
    DropNoSnatPort = 33,
    /// Could not insert a NAT entry; packet passed unchanged.
    PassNatInsertFailed = 34,
    /// Translated packet handed to the stack (destination not a local pod).
    TranslatedToStack = 35,
    /// TCP packet to a hostPort without SYN and no flow entry: passed (never sent to a pod).
    PassStaleHostPortFlow = 36,
    /// A packet from a host veth that has no per-pod counters (`EP_STATS`): no finished
    /// attachment owns the interface (an ADD still under way, or one whose DEL never
    /// came). Counted by `from_pod`, whatever it then does with the packet.
    UnknownEndpoint = 37,
    /// Pod traffic leaving through the uplink, redirected straight to it (the kernel's
    /// forwarding path skipped; masquerade still applied by `uplink_egress`).
    RedirectUplink = 38,
    /// Pod traffic left to the kernel's routing: not routed via the uplink, next hop not
    /// resolved yet, too big for the uplink, TTL expiring or a source address that is not
    /// the sending pod's.
    PassKernelRoute = 39,
    /// A translated source port was taken back from a flow that is over (closed or
    /// idle) and given to a new flow.
    SnatPortReclaimed = 40,
    /// A pod's packet leaving the node on a flow not yet seen to leave unchanged (its
    /// first packets, a TCP SYN, or a flow the node's netfilter translates): handed to the
    /// stack so that netfilter (kube-proxy) sees it.
    PassUnverifiedFlow = 41,
    /// `uplink_egress` saw a pod flow's packet leave exactly as the pod sent it: netfilter
    /// did not translate it, so its later packets may take the fast path.
    FlowVerified = 42,
    /// A packet for a local pod's socket whose traffic goes through the stack to another
    /// peer (a reply of a Service flow): handed to the stack to be un-NATed.
    PassTranslatedReply = 43,
    /// A pod's reply in a flow opened from outside the cluster: left with the pod's own
    /// address (masquerade only translates flows the pod opened).
    PassInboundReply = 44,
    /// Reply of a masqueraded flow whose forward packets netfilter also translated: handed
    /// to the stack after our reverse NAT so that netfilter undoes its part.
    SnatReplyToStack = 45,
    /// A node socket's connect/sendmsg to nodeIP:hostPort (or 127.0.0.1:hostPort)
    /// translated to the pod.
    SockHostPort = 46,
    /// A packet from outside for a local pod, in a flow whose packets from the pod were
    /// seen leaving untranslated: redirected into the pod past the node's stack.
    RedirectFromUplink = 47,
    /// Dropped: a pod sent with a source address that is not one of its own (nor in its
    /// allow-list).
    DropSpoofedSource = 48,
    /// Dropped: rewriting a translated packet failed part-way (a checksum helper or a
    /// store refused), so its addresses or ports may be new while a checksum is stale.
    /// The NAT entries made for it, if it opened a flow, are removed again.
    DropRewriteFailed = 49,
    /// Dropped: the pod sends faster than its egress rate (`runtimeConfig.bandwidth`)
    /// allows, by more than its burst plus its limit ([`Pacing::limit_ns`]).
    DropEgressRate = 50,
    /// Dropped: the first packet of a translated flow (masquerade, host port, hairpin)
    /// of a pod that already holds its share of the NAT table (`natFlowsPerPod` flows).
    DropNatPodCap = 51,
    /// The NAT table was swept for finished flows (a pod at its cap or a full table
    /// asked for room; at most once per [`NAT_SWEEP_INTERVAL_NS`] node-wide).
    NatSweep = 52,
    /// An entry of a finished flow removed by a sweep (its pod's share given back).
    NatSweptEntry = 53,
    /// Dropped: the first packet of a masqueraded flow of a pod that already holds its
    /// share of the SNAT ports towards that destination (address, port, protocol;
    /// `natPortsPerDestination`).
    DropSnatDestCap = 54,
}

impl Reason {
    /// Every reason, for userspace listings.
    pub const ALL: [Reason; 39] = [
        Reason::Seen,
        Reason::PassNotIpv4,
        Reason::PassMalformed,
        Reason::PassIpOptions,
        Reason::PassFragment,
        Reason::PassNoMatch,
        Reason::PassTtlExpired,
        Reason::RedirectPod,
        Reason::SnatNew,
        Reason::SnatForward,
        Reason::SnatReply,
        Reason::DnatNew,
        Reason::DnatForward,
        Reason::DnatReply,
        Reason::HairpinNew,
        Reason::HairpinForward,
        Reason::IcmpErrorTranslated,
        Reason::DropNoSnatPort,
        Reason::PassNatInsertFailed,
        Reason::TranslatedToStack,
        Reason::PassStaleHostPortFlow,
        Reason::UnknownEndpoint,
        Reason::RedirectUplink,
        Reason::PassKernelRoute,
        Reason::SnatPortReclaimed,
        Reason::PassUnverifiedFlow,
        Reason::FlowVerified,
        Reason::PassTranslatedReply,
        Reason::PassInboundReply,
        Reason::SnatReplyToStack,
        Reason::SockHostPort,
        Reason::RedirectFromUplink,
        Reason::DropSpoofedSource,
        Reason::DropRewriteFailed,
        Reason::DropEgressRate,
        Reason::DropNatPodCap,
        Reason::NatSweep,
        Reason::NatSweptEntry,
        Reason::DropSnatDestCap,
    ];

    /// Stable snake-case name (used by `inspect`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Seen => "seen",
            Reason::PassNotIpv4 => "pass_not_ipv4",
            Reason::PassMalformed => "pass_malformed",
            Reason::PassIpOptions => "pass_ip_options",
            Reason::PassFragment => "pass_fragment",
            Reason::PassNoMatch => "pass_no_match",
            Reason::PassTtlExpired => "pass_ttl_expired",
            Reason::RedirectPod => "redirect_pod",
            Reason::SnatNew => "snat_new",
            Reason::SnatForward => "snat_forward",
            Reason::SnatReply => "snat_reply",
            Reason::DnatNew => "dnat_new",
            Reason::DnatForward => "dnat_forward",
            Reason::DnatReply => "dnat_reply",
            Reason::HairpinNew => "hairpin_new",
            Reason::HairpinForward => "hairpin_forward",
            Reason::IcmpErrorTranslated => "icmp_error_translated",
            Reason::DropNoSnatPort => "drop_no_snat_port",
            Reason::PassNatInsertFailed => "pass_nat_insert_failed",
            Reason::TranslatedToStack => "translated_to_stack",
            Reason::PassStaleHostPortFlow => "pass_stale_hostport_flow",
            Reason::UnknownEndpoint => "unknown_endpoint",
            Reason::RedirectUplink => "redirect_uplink",
            Reason::PassKernelRoute => "pass_kernel_route",
            Reason::SnatPortReclaimed => "snat_port_reclaimed",
            Reason::PassUnverifiedFlow => "pass_unverified_flow",
            Reason::FlowVerified => "flow_verified",
            Reason::PassTranslatedReply => "pass_translated_reply",
            Reason::PassInboundReply => "pass_inbound_reply",
            Reason::SnatReplyToStack => "snat_reply_to_stack",
            Reason::SockHostPort => "sock_host_port",
            Reason::RedirectFromUplink => "redirect_from_uplink",
            Reason::DropSpoofedSource => "drop_spoofed_source",
            Reason::DropRewriteFailed => "drop_rewrite_failed",
            Reason::DropEgressRate => "drop_egress_rate",
            Reason::DropNatPodCap => "drop_nat_pod_cap",
            Reason::NatSweep => "nat_sweep",
            Reason::NatSweptEntry => "nat_swept_entry",
            Reason::DropSnatDestCap => "drop_snat_dest_cap",
        }
    }
}

/// Number of slots in the reasons map (must exceed every [`Reason`] value).
pub const REASON_SLOTS: u32 = 64;
const _: () = assert!((Reason::DropSnatDestCap as u32) < REASON_SLOTS);

/// Key of [`map::ENDPOINTS`]: one pod IPv4 address.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointKey {
    /// Pod IPv4 address, network order.
    pub addr: u32,
}
const _: () = assert!(size_of::<EndpointKey>() == 4);

/// [`EndpointInfo::flags`]: the entry is complete and may be used by the programs.
pub const EP_F_ACTIVE: u32 = 1;
/// [`EndpointInfo::flags`]: the pod has an egress rate ([`map::PACING`] has an entry for
/// its host veth), so its packets are paced.
pub const EP_F_PACED: u32 = 2;

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
    /// [`PACING_BY_FQ`] or [`PACING_POLICE`], native order.
    pub mode: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Pacing>() == 40);

/// [`Pacing::mode`]: an `fq` qdisc on the uplink honours departure times, so packets get
/// one (`skb->tstamp`) and wait there; only packets beyond the latency are dropped.
pub const PACING_BY_FQ: u32 = 1;
/// [`Pacing::mode`]: the kernel has no `fq` (`CONFIG_NET_SCH_FQ`), so nothing would
/// honour a departure time: the schedule only polices (drops what exceeds burst and
/// latency).
pub const PACING_POLICE: u32 = 0;

/// Value of [`map::ENDPOINTS`]: where and how to deliver to a local pod.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Host-side veth ifindex (native order); `bpf_redirect_peer` target.
    pub ifindex: u32,
    /// `EP_F_*` bits (native order).
    pub flags: u32,
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

/// Key of [`map::NAT`]: the 5-tuple of a packet as it arrives at a program.
///
/// For ICMP echo, the identifier plays the port: a request is `(sport = id, dport = 0)`,
/// a reply `(sport = 0, dport = id)`, so that a reply's tuple is the request's reversed.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NatKey {
    /// Source address, network order.
    pub saddr: u32,
    /// Destination address, network order.
    pub daddr: u32,
    /// Source port (or echo id), network order.
    pub sport: u16,
    /// Destination port (or echo id), network order.
    pub dport: u16,
    /// IP protocol ([`proto`]).
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<NatKey>() == 16);

/// [`NatEntry::hook`]: applied by `from_pod` (hairpin flows).
pub const HOOK_POD: u8 = 1;
/// [`NatEntry::hook`]: applied by `uplink_ingress`.
pub const HOOK_UPLINK_IN: u8 = 2;
/// [`NatEntry::hook`]: applied by `uplink_egress`.
pub const HOOK_UPLINK_OUT: u8 = 3;

/// [`NatEntry::kind`]: masquerade, pod → outside (forward direction).
pub const NAT_SNAT_FWD: u8 = 1;
/// [`NatEntry::kind`]: masquerade, reply to the pod.
pub const NAT_SNAT_REV: u8 = 2;
/// [`NatEntry::kind`]: host port, client → pod.
pub const NAT_DNAT_FWD: u8 = 3;
/// [`NatEntry::kind`]: host port, reply to the client.
pub const NAT_DNAT_REV: u8 = 4;
/// [`NatEntry::kind`]: hairpin, client pod → backend pod.
pub const NAT_HAIRPIN_FWD: u8 = 5;
/// [`NatEntry::kind`]: hairpin, reply to the client pod.
pub const NAT_HAIRPIN_REV: u8 = 6;

/// [`NatEntry::flags`]: a FIN was seen in this entry's direction.
pub const NAT_F_FIN: u8 = 1;
/// [`NatEntry::flags`]: a RST was seen in this entry's direction.
pub const NAT_F_RST: u8 = 2;
/// [`NatEntry::flags`]: this direction sent the first FIN (its peer ends in TIME_WAIT
/// on the other side of the translation).
pub const NAT_F_FIRST_FIN: u8 = 4;
/// [`NatEntry::flags`]: the (TCP) flow is closed (RST, or FIN both ways), so this entry no
/// longer counts against its pod's share ([`NatEntry::pod`]): a pod's cap is on live
/// flows, and a closed flow's entries only wait out their grace time for the port.
pub const NAT_F_UNCHARGED: u8 = 8;

/// [`NatEntry::deliver`]: straight into the local pod it is now addressed to, if any.
pub const NAT_DELIVER_DIRECT: u8 = 0;
/// [`NatEntry::deliver`]: to the node's stack, because netfilter translated this flow
/// too (its other direction reached us already translated) and must undo its part.
pub const NAT_DELIVER_STACK: u8 = 1;

/// A translated source port whose flow closed with a RST, or with FINs both ways where
/// the pod closed first, may be handed out again after this long (in-flight packets).
pub const NAT_CLOSED_GRACE_NS: u64 = 1_000_000_000;
/// … and after this long when the outside peer closed first: it holds the tuple in
/// TIME_WAIT (60 s on Linux) and could refuse a new connection reusing it.
pub const NAT_TIME_WAIT_NS: u64 = 60_000_000_000;
/// … and after this long without a packet for an open TCP flow (just above the default
/// 2 h TCP keepalive time, so kept-alive idle connections keep their port).
pub const NAT_TCP_IDLE_NS: u64 = 7_440_000_000_000;
/// … for UDP.
pub const NAT_UDP_IDLE_NS: u64 = 60_000_000_000;
/// … for ICMP echo.
pub const NAT_ICMP_IDLE_NS: u64 = 30_000_000_000;

/// Value of [`map::NAT`]: the tuple a matching packet is rewritten to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NatEntry {
    /// Translated source address, network order.
    pub saddr: u32,
    /// Translated destination address, network order.
    pub daddr: u32,
    /// Translated source port (or echo id), network order.
    pub sport: u16,
    /// Translated destination port (or echo id), network order.
    pub dport: u16,
    /// Which program applies the entry (`HOOK_*`).
    pub hook: u8,
    /// What the entry is (`NAT_*`), for inspection.
    pub kind: u8,
    /// `NAT_F_*`: how far the (TCP) flow has closed, as seen by this entry's direction.
    pub flags: u8,
    /// `NAT_DELIVER_*`: where a translated packet goes next.
    pub deliver: u8,
    /// `bpf_ktime_get_ns` of the last packet that used the entry, native order.
    pub last_seen_ns: u64,
    /// Host veth ifindex of the pod whose share ([`map::NAT_USE`]) this entry is charged
    /// to, native order; 0: charged to nobody. Whoever removes the entry gives it back,
    /// unless [`NAT_F_UNCHARGED`] says the flow's close gave it back already.
    pub pod: u32,
    /// The sweep pass that last found this entry's flow still live (native order; 0:
    /// none): later slices of the same pass skip it (see [`NatUse::entries`] of key 0).
    pub swept: u32,
}
const _: () = assert!(size_of::<NatEntry>() == 32);

/// Key of [`map::NAT_DEST_USE`]: a pod and one destination of its masqueraded flows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NatDestKey {
    /// Host veth ifindex of the pod, native order.
    pub pod: u32,
    /// Destination IPv4 address, network order.
    pub daddr: u32,
    /// Destination port (ICMP: the echo id), network order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// Padding (zero).
    pub _pad: u8,
}
const _: () = assert!(size_of::<NatDestKey>() == 12);

/// Value of [`map::NAT_USE`]: one pod's share of the NAT table.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NatUse {
    /// NAT entries charged to the pod (two per flow), native order, updated atomically by
    /// the programs. Read as signed: a give-back racing another can leave it a little
    /// below zero, which counts as zero. Key 0 (the sweep clock): the number of the
    /// sweep pass under way (from 1).
    pub entries: u32,
    /// Most entries the pod may hold (`2 × natFlowsPerPod`), native order; written by
    /// userspace at ADD. Unused for key 0.
    pub cap: u32,
    /// Key 0 only: `bpf_ktime_get_ns` of the last sweep slice, native order.
    pub swept_ns: u64,
}
const _: () = assert!(size_of::<NatUse>() == 16);

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

/// [`FlowEntry::flags`]: `from_pod` handed a packet of this flow to the stack and waits
/// for `uplink_egress` to see it leave unchanged.
pub const FLOW_F_PENDING: u32 = 1;
/// [`FlowEntry::flags`]: a packet of this flow left the uplink exactly as the pod sent it
/// (netfilter did not translate it): later packets may bypass the stack.
pub const FLOW_F_VERIFIED: u32 = 2;
/// [`FlowEntry::flags`]: the flow was opened from outside the cluster towards the pod;
/// its packets from the pod are never masqueraded.
pub const FLOW_F_INBOUND: u32 = 4;

/// Value of [`map::FLOWS`], keyed by a pod flow's [`NatKey`] as the pod sends it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowEntry {
    /// `FLOW_F_*` bits, native order.
    pub flags: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
    /// `bpf_ktime_get_ns` of the last packet that used the entry, native order.
    pub last_seen_ns: u64,
}
const _: () = assert!(size_of::<FlowEntry>() == 16);

/// Key of [`map::STACK_SOCKETS`]: one pod socket.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockKey {
    /// Pod address, network order.
    pub addr: u32,
    /// Pod port (or ICMP echo id), network order.
    pub port: u16,
    /// IP protocol ([`proto`]).
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<SockKey>() == 8);

/// Value of [`map::STACK_SOCKETS`]: the peer a pod socket last addressed through the stack.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SockPeer {
    /// Peer address as the pod addressed it, network order.
    pub addr: u32,
    /// Peer port as the pod addressed it, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockPeer>() == 8);

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

/// [`NodeConfig::flags`]: masquerade traffic leaving the cluster (`ipMasq`).
pub const CFG_F_MASQ: u32 = 1;

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

/// Value of [`map::NODE_CONFIG`] (one entry, index 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeConfig {
    /// Node IPv4 address used as the masquerade source, network order; 0 = no SNAT.
    pub node_addr: u32,
    /// Uplink ifindex, native order.
    pub uplink_ifindex: u32,
    /// `CFG_F_*` bits, native order.
    pub flags: u32,
    /// Number of valid entries in `cluster_cidrs`, native order.
    pub n_cidrs: u32,
    /// First SNAT port (inclusive), native order.
    pub snat_port_min: u16,
    /// Last SNAT port (inclusive), native order.
    pub snat_port_max: u16,
    /// When userspace last listed every node address (`CLOCK_BOOTTIME` seconds, native
    /// order; 0 = never). Userspace only.
    pub addrs_listed_s: u32,
    /// Most SNAT ports one pod may hold towards one destination (address, port,
    /// protocol), native order (`natPortsPerDestination`; 0: no cap).
    pub snat_dest_cap: u32,
    /// Padding (zero).
    pub _pad: u32,
    /// `clusterCIDRs` (IPv4 ones), never masqueraded.
    pub cluster_cidrs: [Cidr4; MAX_CLUSTER_CIDRS],
    /// Cookie of the node's network namespace (`SO_NETNS_COOKIE`), native order: the
    /// socket hooks translate only sockets of this namespace (0: none).
    pub netns_cookie: u64,
}
const _: () = assert!(size_of::<NodeConfig>() == 32 + 8 * MAX_CLUSTER_CIDRS + 8);

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

/// 64-bit FNV-1a over `parts` joined by the byte `sep`: the one hash behind every
/// deterministic name, id and MAC (not security relevant). Its results are lasting
/// contracts — owner ids live in pinned maps, veth names and MACs on live interfaces — so
/// each user keeps its separator: 0 for owner ids, 0xff for interface names and MACs.
#[must_use]
pub fn fnv1a64(parts: &[&[u8]], sep: u8) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h ^= u64::from(sep);
            h = h.wrapping_mul(PRIME);
        }
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// Owner id of (container ID, ifname): [`fnv1a64`] of the two joined by a 0 byte. Never 0.
#[must_use]
pub fn owner_id(container_id: &[u8], ifname: &[u8]) -> u64 {
    match fnv1a64(&[container_id, ifname], 0) {
        0 => 1,
        h => h,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): `#[repr(C)]`, only integer fields and explicit padding, no implicit
    // padding (checked by the size asserts), every bit pattern valid.
    unsafe impl aya::Pod for super::EndpointKey {}
    unsafe impl aya::Pod for super::EndpointInfo {}
    unsafe impl aya::Pod for super::EndpointStats {}
    unsafe impl aya::Pod for super::PortKey {}
    unsafe impl aya::Pod for super::PortTarget {}
    unsafe impl aya::Pod for super::NatKey {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::Cidr4 {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl aya::Pod for super::NodeAddr {}
    unsafe impl aya::Pod for super::Owner {}
    unsafe impl aya::Pod for super::FlowEntry {}
    unsafe impl aya::Pod for super::SockKey {}
    unsafe impl aya::Pod for super::SockPeer {}
    unsafe impl aya::Pod for super::SockRevKey {}
    unsafe impl aya::Pod for super::SockRevValue {}
    unsafe impl aya::Pod for super::SrcAllowKey {}
    unsafe impl aya::Pod for super::Pacing {}
    unsafe impl aya::Pod for super::NatUse {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NatDestKey {}
    unsafe impl aya::Pod for super::SrcAllow6Key {}
}

#[cfg(test)]
mod tests {
    use super::{Reason, REASON_SLOTS};

    /// `Reason::ALL` lists every reason once, in value order with no gap (a reason
    /// missing from it would never be shown by `inspect`), and every name is distinct.
    #[test]
    fn reason_table_is_complete_and_names_are_unique() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(
                *r as u32,
                16 + i as u32,
                "{r:?} out of order in Reason::ALL"
            );
            assert!((*r as u32) < REASON_SLOTS);
            for other in &Reason::ALL[..i] {
                assert_ne!(r.name(), other.name(), "two reasons named {}", r.name());
            }
        }
    }
}
