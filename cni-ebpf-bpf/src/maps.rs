//! The pinned maps shared with userspace, and small typed reads of them.
//!
//! Maps are pinned by name below the directory userspace passes as the default map pin
//! directory (`<bpffsRoot>/<network>/v<LAYOUT_VERSION>/maps`), so every later invocation reuses them.

use aya_ebpf::{
    bindings::{BPF_F_NO_COMMON_LRU, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray,
        PerCpuHashMap, ProgramArray, RingBuf,
    },
};
use cni_ebpf_common::{
    Addr6, EndpointFlags, EndpointInfo, EndpointKey, EndpointKey6, EndpointStats, FlowEntry,
    NatDestKey, NatDestKey6, NatEntry, NatEntry6, NatKey, NatKey6, NatUse, NodeAddr, NodeConfig,
    NodeConfig6, NodeFlags, NodeState, Owner, Pacing, PolicyClassCounts, PolicyClassKey,
    PolicyCounts, PolicyDeny, PolicyDomainKey, PolicyEndpoint, PolicyEndpointKey, PolicyExactKey,
    PolicyFlow, PolicyFlowKey, PolicyLearned, PolicyLearnedKey, PolicyPeerKey, PolicyPortKey,
    PolicyState, PolicyTiers, PortKey, PortKey6, PortTarget, PortTarget6, Reason, SockKey,
    SockKey6, SockPeer, SockPeer6, SockRevKey, SockRevKey6, SockRevValue, SockRevValue6,
    SrcAllow6Key, SrcAllowKey, TunnelEndpoint, TunnelKey, WireguardPeer, MAX_CLUSTER_CIDRS,
    MAX_ENDPOINTS, MAX_ENDPOINTS6, MAX_FLOWS, MAX_FLOWS6, MAX_NAT, MAX_NAT6, MAX_NAT_DEST_USE,
    MAX_NAT_USE, MAX_NODE_ADDRS, MAX_NODE_ADDRS6, MAX_OWNERS, MAX_POLICY_CLASS_COUNTS,
    MAX_POLICY_COUNTS, MAX_POLICY_DOMAINS, MAX_POLICY_ENDPOINTS, MAX_POLICY_EXACT,
    MAX_POLICY_FLOWS, MAX_POLICY_LEARNED, MAX_POLICY_NAMESPACES, MAX_POLICY_PEERS,
    MAX_POLICY_PORTS, MAX_POLICY_TIERS, MAX_PORTMAPS, MAX_SOCK_REVNAT, MAX_SRC_ALLOW,
    MAX_SRC_ALLOW6, MAX_STACK_SOCKETS, MAX_STACK_SOCKETS6, MAX_TUNNEL_ENDPOINTS, MAX_TUNNEL_NODES,
    MAX_WIREGUARD_PEERS, POLICY_DENY_SLOTS, REASON_SLOTS,
};
use cni_ebpf_common::{
    Affinity, AffinityKey, Backend, BackendSlot, MemberKey, Service, ServiceKey, MAX_SERVICES,
    MAX_SERVICE_AFFINITY, MAX_SERVICE_BACKENDS, MAX_SERVICE_NETNS,
};
use cni_ebpf_common::{
    FlowConfig, FlowCpu, FlowLogEntry, FlowLogKey, FLOW_EVENTS_BYTES, MAX_FLOW_LOG,
};

/// Local pods: pod IPv4 → delivery information.
#[map]
pub(crate) static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// Per-pod counters, keyed by host veth ifindex.
#[map]
pub(crate) static EP_STATS: PerCpuHashMap<u32, EndpointStats> =
    PerCpuHashMap::pinned(MAX_ENDPOINTS, 0);

/// Host ports.
#[map]
pub(crate) static PORTMAPS: HashMap<PortKey, PortTarget> = HashMap::pinned(MAX_PORTMAPS, 0);

/// NAT flows (both directions). A plain hash, not LRU: the kernel never evicts an entry
/// (it would take a live flow of whichever pod); finished flows are removed by the
/// programs (see `nat::sweep`) and each pod's share is capped (`NAT_USE`).
#[map]
pub(crate) static NAT: HashMap<NatKey, NatEntry> = HashMap::pinned(MAX_NAT, 0);

/// Each pod's share of `NAT`, by host veth ifindex (key 0: the sweep clock).
#[map]
pub(crate) static NAT_USE: HashMap<u32, NatUse> = HashMap::pinned(MAX_NAT_USE, 0);

/// SNAT ports each pod holds towards each destination of its masqueraded flows (see
/// `nat::dest_room`). Plain hash: a key lives only while its count is above zero, so
/// there are never more keys than masqueraded flows. Not preallocated: a node holds a
/// few keys per pod, and the 65 536 slots preallocated would cost 5.5 MiB.
#[map]
pub(crate) static NAT_DEST_USE: HashMap<NatDestKey, u32> =
    HashMap::pinned(MAX_NAT_DEST_USE, BPF_F_NO_PREALLOC);

/// Pod flows: whether each may bypass the node's stack (see `flows`).
#[map]
pub(crate) static FLOWS: LruHashMap<NatKey, FlowEntry> = LruHashMap::pinned(MAX_FLOWS, 0);
/// Pod sockets whose traffic went through the stack, and the peer they addressed.
#[map]
pub(crate) static STACK_SOCKETS: LruHashMap<SockKey, SockPeer> =
    LruHashMap::pinned(MAX_STACK_SOCKETS, 0);
/// Node sockets translated to a pod by the socket hooks → the host port they asked for.
#[map]
pub(crate) static SOCK_REVNAT: LruHashMap<SockRevKey, SockRevValue> =
    LruHashMap::pinned(MAX_SOCK_REVNAT, 0);
/// As [`SOCK_REVNAT`], for node IPv6 sockets translated to a pod's IPv6 address.
#[map]
pub(crate) static SOCK_REVNAT6: LruHashMap<SockRevKey6, SockRevValue6> =
    LruHashMap::pinned(MAX_SOCK_REVNAT, 0);
/// Extra source prefixes per pod (host veth ifindex); see `source_allowed`.
#[map]
pub(crate) static SRC_ALLOW: LpmTrie<SrcAllowKey, u32> = LpmTrie::pinned(MAX_SRC_ALLOW, 0);
/// IPv6 sources per pod (host veth ifindex): its own addresses and its allow-list; see
/// `guard`.
#[map]
pub(crate) static SRC_ALLOW6: LpmTrie<SrcAllow6Key, u32> = LpmTrie::pinned(MAX_SRC_ALLOW6, 0);
/// Egress rates of pods, by host veth ifindex (see `pacing`).
#[map]
pub(crate) static PACING: HashMap<u32, Pacing> = HashMap::pinned(MAX_ENDPOINTS, 0);
/// Node configuration (index 0).
#[map]
pub(crate) static NODE_CONFIG: Array<NodeConfig> = Array::pinned(1, 0);

/// Userspace's node-wide bookkeeping (index 0); the programs never read it.
#[map]
pub(crate) static NODE_STATE: Array<NodeState> = Array::pinned(1, 0);

/// The node's own IPv4 addresses.
#[map]
pub(crate) static NODE_ADDRS: HashMap<u32, NodeAddr> = HashMap::pinned(MAX_NODE_ADDRS, 0);

/// Local pods by IPv6 address → delivery information (as [`ENDPOINTS`]).
#[map]
pub(crate) static ENDPOINTS6: HashMap<EndpointKey6, EndpointInfo> =
    HashMap::pinned(MAX_ENDPOINTS6, 0);

/// IPv6 NAT flows, as [`NAT`]. Not preallocated: a node without IPv6 pods pays nothing.
#[map]
pub(crate) static NAT6: HashMap<NatKey6, NatEntry6> = HashMap::pinned(MAX_NAT6, BPF_F_NO_PREALLOC);

/// As [`NAT_DEST_USE`], for IPv6 destinations.
#[map]
pub(crate) static NAT_DEST_USE6: HashMap<NatDestKey6, u32> =
    HashMap::pinned(MAX_NAT_DEST_USE, BPF_F_NO_PREALLOC);

/// IPv6 pod flows, as [`FLOWS`].
#[map]
pub(crate) static FLOWS6: LruHashMap<NatKey6, FlowEntry> = LruHashMap::pinned(MAX_FLOWS6, 0);

/// As [`STACK_SOCKETS`], for IPv6 pod sockets.
#[map]
pub(crate) static STACK_SOCKETS6: LruHashMap<SockKey6, SockPeer6> =
    LruHashMap::pinned(MAX_STACK_SOCKETS6, 0);

/// The IPv6 half of the node configuration (index 0).
#[map]
pub(crate) static NODE_CONFIG6: Array<NodeConfig6> = Array::pinned(1, 0);

/// The node's own IPv6 addresses.
#[map]
pub(crate) static NODE_ADDRS6: HashMap<Addr6, NodeAddr> = HashMap::pinned(MAX_NODE_ADDRS6, 0);

/// IPv6 host ports, as [`PORTMAPS`].
#[map]
pub(crate) static PORTMAPS6: HashMap<PortKey6, PortTarget6> = HashMap::pinned(MAX_PORTMAPS, 0);

/// The IPv6 host port `daddr:dport` of `proto_` (a `hostIP` entry, else the wildcard).
#[inline(always)]
pub(crate) fn port_mapping6(daddr: Addr6, dport: u16, proto_: u8) -> Option<PortTarget6> {
    let mut key = PortKey6 {
        addr: daddr,
        port: dport,
        proto: proto_,
        _pad: 0,
    };
    // SAFETY: values are copied out at once.
    if let Some(t) = unsafe { PORTMAPS6.get(&key) } {
        return Some(*t);
    }
    key.addr = [0; 4];
    unsafe { PORTMAPS6.get(&key) }.copied()
}

/// The IPv6 programs and the DNS answer reader, tail-called by the attached ones (slots
/// `prog::CALLS6`): each family's path is its own program, with the verifier's 512-byte
/// stack to itself.
#[map]
pub(crate) static CALLS6: ProgramArray = ProgramArray::pinned(4, 0);

/// Per-CPU counters indexed by [`Reason`].
#[map]
pub(crate) static REASONS: PerCpuArray<u64> = PerCpuArray::pinned(REASON_SLOTS, 0);

/// Owner names; written and read by userspace only, declared here so it is pinned with
/// the rest.
#[map]
pub(crate) static OWNERS: HashMap<u64, Owner> = HashMap::pinned(MAX_OWNERS, 0);

/// Each pod interface's NetworkPolicy rule sets, two slots (see `policy`).
#[map]
pub(crate) static POLICY_ENDPOINTS: HashMap<PolicyEndpointKey, PolicyEndpoint> =
    HashMap::pinned(MAX_POLICY_ENDPOINTS, 0);
/// The slot of `POLICY_ENDPOINTS` in force and its generation (index 0).
#[map]
pub(crate) static POLICY_STATE: Array<PolicyState> = Array::pinned(1, 0);
/// Peer prefixes of every rule set → port classes.
#[map]
pub(crate) static POLICY_PEERS: LpmTrie<PolicyPeerKey, u64> = LpmTrie::pinned(MAX_POLICY_PEERS, 0);
/// `proto · port` prefixes of every rule set → port classes.
#[map]
pub(crate) static POLICY_PORTS: LpmTrie<PolicyPortKey, u64> = LpmTrie::pinned(MAX_POLICY_PORTS, 0);
/// Destinations egress named ports name → the classes of their rules.
#[map]
pub(crate) static POLICY_EXACT: HashMap<PolicyExactKey, u64> =
    HashMap::pinned(MAX_POLICY_EXACT, BPF_F_NO_PREALLOC);
/// How the classes of a rule set that cluster policies take part in decide, by tier.
#[map]
pub(crate) static POLICY_TIERS: HashMap<u32, PolicyTiers> =
    HashMap::pinned(MAX_POLICY_TIERS, BPF_F_NO_PREALLOC);
/// Flows the policy admitted, with the generation they were judged under.
#[map]
pub(crate) static POLICY_FLOWS: LruHashMap<PolicyFlowKey, PolicyFlow> =
    LruHashMap::pinned(MAX_POLICY_FLOWS, 0);
/// The verdicts each cluster policy rule's class decided (per CPU, LRU).
#[map]
pub(crate) static POLICY_CLASS_COUNTS: LruPerCpuHashMap<PolicyClassKey, PolicyClassCounts> =
    LruPerCpuHashMap::pinned(MAX_POLICY_CLASS_COUNTS, 0);
/// Domain names of every rule set (exact, or after `*.`) → the classes of their rules.
#[map]
pub(crate) static POLICY_DOMAINS: HashMap<PolicyDomainKey, u64> =
    HashMap::pinned(MAX_POLICY_DOMAINS, BPF_F_NO_PREALLOC);
/// The addresses each pod learned from DNS answers, under which names, until when.
#[map]
pub(crate) static POLICY_LEARNED: LruHashMap<PolicyLearnedKey, PolicyLearned> =
    LruHashMap::pinned(MAX_POLICY_LEARNED, 0);
/// Namespaces that hold a policy (userspace only; pinned with the rest).
#[map]
pub(crate) static POLICY_NAMESPACES: HashMap<u64, u32> =
    HashMap::pinned(MAX_POLICY_NAMESPACES, BPF_F_NO_PREALLOC);
/// Each CPU's ring of the latest packets the policy refused.
#[map]
pub(crate) static POLICY_DENIES: PerCpuArray<PolicyDeny> =
    PerCpuArray::pinned(POLICY_DENY_SLOTS, 0);
/// The policy's verdicts at each pod interface (per CPU; an entry appears on its first
/// verdict).
#[map]
pub(crate) static POLICY_COUNTS: LruPerCpuHashMap<u32, PolicyCounts> =
    LruPerCpuHashMap::pinned(MAX_POLICY_COUNTS, 0);
/// The node that holds each other node's pod CIDRs (the tunnel modes).
#[map]
pub(crate) static TUNNEL_ENDPOINTS: LpmTrie<TunnelKey, TunnelEndpoint> =
    LpmTrie::pinned(MAX_TUNNEL_ENDPOINTS, BPF_F_NO_PREALLOC);
/// The other nodes' underlay addresses.
#[map]
pub(crate) static TUNNEL_NODES: HashMap<TunnelKey, u32> =
    HashMap::pinned(MAX_TUNNEL_NODES, BPF_F_NO_PREALLOC);
/// With encryption on: the other nodes' pod CIDRs, and whether each node has a key.
#[map]
pub(crate) static WIREGUARD_PEERS: LpmTrie<TunnelKey, WireguardPeer> =
    LpmTrie::pinned(MAX_WIREGUARD_PEERS, BPF_F_NO_PREALLOC);
/// Service frontends translated at the socket (`--kube-proxy-replacement`).
#[map]
pub(crate) static SERVICES: HashMap<ServiceKey, Service> =
    HashMap::pinned(MAX_SERVICES, BPF_F_NO_PREALLOC);
/// Each frontend's backends, by slot.
#[map]
pub(crate) static SERVICE_BACKENDS: HashMap<BackendSlot, Backend> =
    HashMap::pinned(MAX_SERVICE_BACKENDS, BPF_F_NO_PREALLOC);
/// The backends of each frontend with session affinity.
#[map]
pub(crate) static SERVICE_MEMBERS: HashMap<MemberKey, u32> =
    HashMap::pinned(MAX_SERVICE_BACKENDS, BPF_F_NO_PREALLOC);
/// Each client's backend per frontend with session affinity.
#[map]
pub(crate) static SERVICE_AFFINITY: LruHashMap<AffinityKey, Affinity> =
    LruHashMap::pinned(MAX_SERVICE_AFFINITY, 0);
/// The network namespaces of the pods, whose sockets get Services translated.
#[map]
pub(crate) static SERVICE_NETNS: HashMap<u64, u32> =
    HashMap::pinned(MAX_SERVICE_NETNS, BPF_F_NO_PREALLOC);
/// Per-CPU room for the keys of one judgement (not pinned: nothing outlives a packet).
#[map]
pub(crate) static POLICY_SCRATCH: PerCpuArray<crate::policy::Scratch> =
    PerCpuArray::with_max_entries(1, 0);

/// Pod flows' counters, as each pod interface sees them (see `observe`).
#[map]
pub(crate) static FLOW_LOG: LruHashMap<FlowLogKey, FlowLogEntry> =
    LruHashMap::pinned(MAX_FLOW_LOG, BPF_F_NO_COMMON_LRU);
/// Flow events for the agent.
#[map]
pub(crate) static FLOW_EVENTS: RingBuf = RingBuf::pinned(FLOW_EVENTS_BYTES, 0);
/// Whether flows are followed, and their events' rate (index 0; the agent writes it).
#[map]
pub(crate) static FLOW_CONFIG: Array<FlowConfig> = Array::pinned(1, 0);
/// Each CPU's share of flow events, and the drop reason of its packet.
#[map]
pub(crate) static FLOW_CPU: PerCpuArray<FlowCpu> = PerCpuArray::pinned(1, 0);

#[inline(always)]
pub(crate) fn count(reason: Reason) {
    if let Some(slot) = REASONS.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
    if reason.is_drop() {
        crate::observe::note_drop(reason);
    }
}

#[inline(always)]
pub(crate) fn add_stats(ifindex: u32, bytes: u32, rx: bool) {
    let Some(s) = EP_STATS.get_ptr_mut(ifindex) else {
        // A host veth our program is attached to but that no attachment owns (an ADD
        // not finished yet, or one whose DEL never came): worth an operator's look.
        if !rx {
            count(Reason::UnknownEndpoint);
        }
        return;
    };
    // SAFETY: per-CPU value, no concurrent writer on this CPU.
    unsafe {
        if rx {
            (*s).rx_packets += 1;
            (*s).rx_bytes += bytes as u64;
        } else {
            (*s).tx_packets += 1;
            (*s).tx_bytes += bytes as u64;
        }
    }
}

#[inline(always)]
pub(crate) fn local_endpoint(addr: u32) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once.
    let ep = unsafe { ENDPOINTS.get(EndpointKey { addr }) }.copied()?;
    if !ep.flags.contains(EndpointFlags::ACTIVE) {
        return None;
    }
    Some(ep)
}

#[inline(always)]
pub(crate) fn node_config() -> Option<&'static NodeConfig> {
    // A reference into the map value, not a copy: the value is 168 bytes, and a copy on
    // `uplink_egress`'s stack left too little of the verifier's 512 for the NAT calls.
    // (A copy was no more consistent: userspace rewrites it in place either way.)
    NODE_CONFIG.get(0)
}

/// Whether same-node pod → pod traffic must go through the node's stack
/// (`sameNodeFastPath: false`).
#[inline(always)]
pub(crate) fn pod_traffic_to_stack() -> bool {
    node_config().is_some_and(|c| c.flags.contains(NodeFlags::POD_TRAFFIC_TO_STACK))
}

#[inline(always)]
pub(crate) fn is_node_addr(addr: u32) -> bool {
    // SAFETY: only presence is read.
    unsafe { NODE_ADDRS.get(addr) }.is_some()
}

#[inline(always)]
pub(crate) fn in_cluster(cfg: &NodeConfig, addr: u32) -> bool {
    let n = cfg.n_cidrs as usize;
    for i in 0..MAX_CLUSTER_CIDRS {
        if i >= n {
            break;
        }
        let c = cfg.cluster_cidrs[i];
        if addr & c.mask == c.addr {
            return true;
        }
    }
    false
}

#[inline(always)]
pub(crate) fn port_mapping(daddr: u32, dport: u16, proto_: u8) -> Option<PortTarget> {
    let mut key = PortKey {
        addr: daddr,
        port: dport,
        proto: proto_,
        _pad: 0,
    };
    // SAFETY: values are copied out at once.
    if let Some(t) = unsafe { PORTMAPS.get(key) } {
        return Some(*t);
    }
    key.addr = 0;
    unsafe { PORTMAPS.get(key) }.copied()
}

/// Whose address a pod's packet carries as its source.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// One of the sending pod's own addresses; `paced` when the pod has an egress rate,
    /// `host_ports` unless the pod is known to have none (it may serve hairpin flows).
    Own { paced: bool, host_ports: bool },
    /// A prefix of the pod's allow-list (`allowedSourceCIDRs`): sent, never fast-pathed
    /// or recorded.
    AllowListed,
}

/// Whether the pod behind host veth `ifindex` may send from `saddr`, and as what; `None`
/// when it may not.
#[inline(always)]
pub(crate) fn source_of(saddr: u32, ifindex: u32) -> Option<Source> {
    if let Some(ep) = local_endpoint(saddr) {
        if ep.ifindex == ifindex {
            return Some(Source::Own {
                paced: ep.flags.contains(EndpointFlags::PACED),
                host_ports: !ep.flags.contains(EndpointFlags::NO_HOST_PORTS),
            });
        }
    }
    let key = Key::new(
        64,
        SrcAllowKey {
            ifindex_be: ifindex.to_be(),
            addr: saddr,
        },
    );
    SRC_ALLOW.get(key).map(|_| Source::AllowListed)
}
