//! Flow events: what the programs report of every pod flow — its start, its end, its drops
//! — through the ring [`crate::map::FLOW_EVENTS`], aggregated per flow in
//! [`crate::map::FLOW_LOG`] and limited in rate per CPU (see `cni-ebpf-bpf/src/observe.rs`).

use core::mem::size_of;

/// Capacity of [`crate::map::FLOW_LOG`] (an LRU): flows followed at once on a node.
pub const MAX_FLOW_LOG: u32 = 65_536;
/// Size of the ring [`crate::map::FLOW_EVENTS`] in bytes (a power of two, whole pages):
/// about 8 000 events the agent has not read yet.
pub const FLOW_EVENTS_BYTES: u32 = 1 << 20;
/// Default events each CPU may put in the ring per second (the agent's
/// `--flow-events-per-second`); beyond it, and beyond its burst, an event is counted
/// (`flow_event_rate_limited`) and not sent, while its flow's counters are kept.
pub const DEFAULT_FLOW_EVENTS_PER_SEC: u32 = 5_000;

/// Value of [`crate::map::FLOW_CONFIG`] (index 0), written by the agent: whether the
/// programs follow flows, and how many events each CPU may send. All zero (a datapath no
/// agent configured): off.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowConfig {
    /// 1: follow flows and send their events; 0: nothing is followed.
    pub enabled: u32,
    /// Events each CPU may send per second, native order.
    pub events_per_sec: u32,
    /// Events each CPU may send at once after a quiet time (the bucket's depth).
    pub burst: u32,
    /// `FLOW_CONFIG_*` switches, native order.
    pub flags: u32,
}
const _: () = assert!(size_of::<FlowConfig>() == 16);

/// [`FlowConfig::flags`]: the node's socket hooks connect pods' sockets to Service
/// backends (`--kube-proxy-replacement`), so a flow a pod opens may have asked for a
/// Service its packets no longer name: its start looks up which (the socket's cookie and
/// the hooks' reverse map). Without it that lookup, which could only miss, is not made.
pub const FLOW_CONFIG_SOCKET_SERVICES: u32 = 1;

/// Value of [`crate::map::FLOW_CPU`] (per CPU): the rate limit's bucket and the drop
/// reason of the packet being handled.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCpu {
    /// Events the CPU may still send, in thousandths, native order.
    pub tokens_milli: u64,
    /// When the bucket was last filled (`bpf_ktime_get_ns`).
    pub filled_ns: u64,
    /// The last drop reason counted on this CPU ([`crate::Reason`]; 0: none since the last
    /// drop reported).
    pub drop_reason: u32,
    /// The low 32 bits of the kernel's tick count (`jiffies`) when the bucket was last
    /// looked at: it is filled once a tick.
    pub tick: u32,
}
const _: () = assert!(size_of::<FlowCpu>() == 24);

/// Key of [`crate::map::FLOW_LOG`]: a flow as one pod interface sees it (IPv4 addresses
/// mapped into IPv6). A flow between two pods of the node is followed at each of them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowLogKey {
    /// Host-side ifindex of the pod's interface (0: a packet no pod interface saw, such as
    /// one the uplink dropped), native order.
    pub ifindex: u32,
    /// IP protocol number.
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
    /// The pod's address (the uplink's drops: the packet's source), wire order.
    pub pod: [u8; 16],
    /// The other end's address, wire order.
    pub peer: [u8; 16],
    /// The pod's port (ICMP echo: the identifier; other ICMP: type and code), wire order.
    pub pod_port: u16,
    /// The other end's port (ICMP: as `pod_port`), wire order.
    pub peer_port: u16,
}
const _: () = assert!(size_of::<FlowLogKey>() == 44);

/// [`FlowLogEntry::flags`] and [`FlowEvent::flags`]: the pod opened the flow (its first
/// packet left the pod); else it came to the pod.
pub const FLOW_OPENED_BY_POD: u32 = 1;
/// The flow ended (a TCP FIN or RST was seen); its end was reported.
pub const FLOW_ENDED: u32 = 2;
/// Some packet of the flow was dropped (its first drop was reported).
pub const FLOW_DROPPED: u32 = 4;
/// The flow is IPv6.
pub const FLOW_IPV6: u32 = 8;
/// The pod sent a TCP FIN.
pub const FLOW_FIN_SENT: u32 = 16;
/// A TCP FIN was delivered to the pod.
pub const FLOW_FIN_RECEIVED: u32 = 32;

/// Value of [`crate::map::FLOW_LOG`]: one flow's counters, native order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowLogEntry {
    /// When its first packet was seen (`bpf_ktime_get_ns`).
    pub started_ns: u64,
    /// When its last packet was seen, to the kernel's tick (its first packet: exactly).
    pub last_ns: u64,
    /// Packets and bytes the pod sent.
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Packets and bytes delivered to the pod.
    pub received_packets: u64,
    pub received_bytes: u64,
    /// Packets dropped either way.
    pub dropped_packets: u64,
    /// `FLOW_*` flags.
    pub flags: u32,
    /// The reason of its latest drop ([`crate::Reason`]), 0: none.
    pub drop_reason: u32,
    /// The rule sets that judged its first packet at the pod's egress and ingress
    /// ([`crate::RULESET_OPEN`]: none), and the classes that decided
    /// ([`crate::NO_CLASS`]: none recorded).
    pub egress_ruleset: u32,
    pub ingress_ruleset: u32,
    pub egress_class: u8,
    pub ingress_class: u8,
    /// The Service port the pod's socket asked for, when the node's socket hooks sent it
    /// to the peer instead (`--kube-proxy-replacement`), wire order; 0: none.
    pub service_port: u16,
    /// The low 32 bits of the kernel's tick count (`jiffies`) when `last_ns` was last
    /// written: a packet in the same tick leaves `last_ns` as it is, without a clock read.
    pub last_tick: u32,
    /// The Service address it asked for (IPv4 mapped into IPv6), wire order; all zero:
    /// none.
    pub service: [u8; 16],
}
const _: () = assert!(size_of::<FlowLogEntry>() == 96);

/// [`FlowEvent::kind`]: a flow's first packet passed.
pub const FLOW_EVENT_START: u8 = 1;
/// A flow ended: the first TCP FIN or RST of it was seen; the agent also reports a flow
/// idle past its timeout with this kind ([`FLOW_END_EXPIRED`]).
pub const FLOW_EVENT_END: u8 = 2;
/// A packet was dropped: the first of its flow, or the first for another reason.
pub const FLOW_EVENT_DROP: u8 = 3;

/// [`FlowEvent::reason`] of an end: a FIN.
pub const FLOW_END_FIN: u32 = 1;
/// A RST.
pub const FLOW_END_RST: u32 = 2;
/// Idle past its timeout (reported by the agent, which removed the entry).
pub const FLOW_END_EXPIRED: u32 = 3;

/// One record of [`crate::map::FLOW_EVENTS`]: a flow's key and counters when the event
/// happened.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowEvent {
    /// `FLOW_EVENT_*`.
    pub kind: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
    /// A drop's [`crate::Reason`]; an end's `FLOW_END_*`; 0 for a start.
    pub reason: u32,
    /// When (`bpf_ktime_get_ns`).
    pub time_ns: u64,
    pub key: FlowLogKey,
    /// Explicit padding, always zero.
    pub _pad2: u32,
    pub entry: FlowLogEntry,
}
const _: () = assert!(size_of::<FlowEvent>() == 160);
