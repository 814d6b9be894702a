//! Names shared with the object: programs, maps and globals (also their pin names).

/// Names of the programs in the object (also their pin names).
pub mod prog {
    /// Host veth ingress (packets leaving a pod).
    pub const FROM_POD: &str = "from_pod";
    /// Uplink ingress (packets arriving at the node from outside).
    pub const UPLINK_INGRESS: &str = "uplink_ingress";
    /// Uplink egress (packets leaving the node).
    pub const UPLINK_EGRESS: &str = "uplink_egress";
    /// Host veth egress (packets the kernel delivers to a pod): NetworkPolicy.
    pub const TO_POD: &str = "to_pod";
    /// A netkit pod's transmit path (the netkit peer's program): [`FROM_POD`]'s work.
    pub const FROM_NETKIT: &str = "from_netkit";
    /// A netkit pod's host device transmitting to it (the netkit primary's program):
    /// [`TO_POD`]'s work.
    pub const TO_NETKIT: &str = "to_netkit";
    /// Tunnel device egress (packets routed to another node's pods): the node to send
    /// them to.
    pub const TO_TUNNEL: &str = "to_tunnel";
    /// Tunnel device ingress (packets out of the tunnel): checked against the node that
    /// sent them.
    pub const FROM_TUNNEL: &str = "from_tunnel";
    /// `connect()` of the node's own sockets (cgroup `connect4`).
    pub const SOCK_CONNECT4: &str = "sock_connect4";
    /// `sendmsg()` of the node's own unconnected UDP sockets (cgroup `sendmsg4`).
    pub const SOCK_SENDMSG4: &str = "sock_sendmsg4";
    /// `recvmsg()` of the node's own unconnected UDP sockets (cgroup `recvmsg4`).
    pub const SOCK_RECVMSG4: &str = "sock_recvmsg4";
    /// `getpeername()` of the node's own sockets (cgroup `getpeername4`).
    pub const SOCK_GETPEERNAME4: &str = "sock_getpeername4";
    /// `connect()` of the node's own IPv6 sockets (cgroup `connect6`), IPv4-mapped
    /// destinations included.
    pub const SOCK_CONNECT6: &str = "sock_connect6";
    /// `sendmsg()` of the node's own unconnected IPv6 UDP sockets (cgroup `sendmsg6`).
    pub const SOCK_SENDMSG6: &str = "sock_sendmsg6";
    /// `recvmsg()` of the node's own unconnected IPv6 UDP sockets (cgroup `recvmsg6`).
    pub const SOCK_RECVMSG6: &str = "sock_recvmsg6";
    /// `getpeername()` of the node's own IPv6 sockets (cgroup `getpeername6`).
    pub const SOCK_GETPEERNAME6: &str = "sock_getpeername6";
    /// The tc programs.
    pub const TC: [&str; 8] = [
        FROM_POD,
        UPLINK_INGRESS,
        UPLINK_EGRESS,
        TO_POD,
        FROM_NETKIT,
        TO_NETKIT,
        TO_TUNNEL,
        FROM_TUNNEL,
    ];
    /// The socket (cgroup sock_addr) programs.
    pub const SOCK: [&str; 8] = [
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
        SOCK_CONNECT6,
        SOCK_SENDMSG6,
        SOCK_RECVMSG6,
        SOCK_GETPEERNAME6,
    ];
    /// `from_pod` for IPv6 packets: a tail call of `from_pod` (slot
    /// [`CALL6_FROM_POD`] of the `CALLS6` program array), never attached itself.
    pub const FROM_POD6: &str = "from_pod6";
    /// `uplink_ingress` for IPv6 packets (tail call, slot [`CALL6_UPLINK_INGRESS`]).
    pub const UPLINK_INGRESS6: &str = "uplink_ingress6";
    /// `uplink_egress` for IPv6 packets (tail call, slot [`CALL6_UPLINK_EGRESS`]).
    pub const UPLINK_EGRESS6: &str = "uplink_egress6";
    /// Slot of [`FROM_POD6`] in the `CALLS6` program array.
    pub const CALL6_FROM_POD: u32 = 0;
    /// Slot of [`UPLINK_INGRESS6`].
    pub const CALL6_UPLINK_INGRESS: u32 = 1;
    /// Slot of [`UPLINK_EGRESS6`].
    pub const CALL6_UPLINK_EGRESS: u32 = 2;
    /// The reader of DNS answers delivered to a pod whose egress rules name domains: a
    /// tail call of `to_pod` and `to_netkit` (slot [`CALL_DNS_ANSWER`]), never attached
    /// itself; its loops are verified once, apart from the programs that call it.
    pub const DNS_ANSWER: &str = "dns_answer";
    /// Slot of [`DNS_ANSWER`] in the `CALLS6` program array.
    pub const CALL_DNS_ANSWER: u32 = 3;
    /// The tail-called programs (the IPv6 twins and the DNS answer reader), each at its
    /// slot of the `CALLS6` program array.
    pub const CALLS6: [(&str, u32); 4] = [
        (FROM_POD6, CALL6_FROM_POD),
        (UPLINK_INGRESS6, CALL6_UPLINK_INGRESS),
        (UPLINK_EGRESS6, CALL6_UPLINK_EGRESS),
        (DNS_ANSWER, CALL_DNS_ANSWER),
    ];
    /// Every program, in load order (the tail-called IPv6 programs first: a program that
    /// calls them finds them in place from its first packet).
    pub const ALL: [&str; 20] = [
        FROM_POD6,
        UPLINK_INGRESS6,
        UPLINK_EGRESS6,
        DNS_ANSWER,
        FROM_POD,
        UPLINK_INGRESS,
        UPLINK_EGRESS,
        TO_POD,
        FROM_NETKIT,
        TO_NETKIT,
        TO_TUNNEL,
        FROM_TUNNEL,
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
        SOCK_CONNECT6,
        SOCK_SENDMSG6,
        SOCK_RECVMSG6,
        SOCK_GETPEERNAME6,
    ];
}

/// The table of every map: its pin name (also its name in the object), the accessor
/// userspace opens it with, its kind and its key and value types, in the order of
/// [`map::ALL`]. Everything that lists the maps follows from it: the name constants of
/// [`map`] here, and in userspace the typed accessors, the check that opens them all and
/// the entry counts (`cni-ebpf/src/datapath/maps.rs`, which expands the table with a
/// callback of its own). The eBPF programs declare each map under the same name
/// (`cni-ebpf-bpf/src/maps.rs`).
///
/// Adding a map: one line here, its declaration in the object, its users; then
/// [`crate::LAYOUT_VERSION`] goes up (the layout fingerprint test says so).
#[macro_export]
macro_rules! map_table {
    ($callback:ident) => {
        $callback! {
            /// [`crate::EndpointKey`] → [`crate::EndpointInfo`].
            ENDPOINTS endpoints: Hash<$crate::EndpointKey, $crate::EndpointInfo>;
            /// Host veth ifindex (`u32`) → per-CPU [`crate::EndpointStats`].
            EP_STATS ep_stats: PerCpuHash<u32, $crate::EndpointStats>;
            /// [`crate::PortKey`] → [`crate::PortTarget`].
            PORTMAPS portmaps: Hash<$crate::PortKey, $crate::PortTarget>;
            /// [`crate::NatKey`] → [`crate::NatEntry`] (a plain hash: nothing is ever evicted;
            /// finished flows are reclaimed by the programs, see [`crate::NatUse`]).
            NAT nat: Hash<$crate::NatKey, $crate::NatEntry>;
            /// Index 0 → [`crate::NodeConfig`].
            NODE_CONFIG node_config: Array<$crate::NodeConfig>;
            /// Node IPv4 address (`u32`, network order) → [`crate::NodeAddr`].
            NODE_ADDRS node_addrs: Hash<u32, $crate::NodeAddr>;
            /// Per-CPU `u64` counters indexed by [`crate::Reason`].
            REASONS reasons: PerCpuArray<u64>;
            /// Owner id (`u64`, [`crate::owner_id`]) → [`crate::Owner`]; userspace only.
            OWNERS owners: Hash<u64, $crate::Owner>;
            /// [`crate::NatKey`] (a pod flow's tuple as the pod sends it) → [`crate::FlowEntry`]
            /// (LRU): whether the flow may bypass the node's stack.
            FLOWS flows: Hash<$crate::NatKey, $crate::FlowEntry>;
            /// [`crate::SockKey`] (a pod's socket) → [`crate::SockPeer`] (LRU): the last peer
            /// that socket addressed through the node's stack.
            STACK_SOCKETS stack_sockets: Hash<$crate::SockKey, $crate::SockPeer>;
            /// [`crate::SockRevKey`] → [`crate::SockRevValue`] (LRU): what a node socket's host-port
            /// peer was before the socket hooks translated it.
            SOCK_REVNAT sock_revnat: Hash<$crate::SockRevKey, $crate::SockRevValue>;
            /// LPM trie of [`crate::SrcAllowKey`] → `u32` (1): extra source prefixes a pod may
            /// send from (its own addresses need no entry).
            SRC_ALLOW src_allow: LpmTrie<$crate::SrcAllowKey, u32>;
            /// Host veth ifindex (`u32`, native order) → [`crate::Pacing`]: a pod's egress rate
            /// (`runtimeConfig.bandwidth`).
            PACING pacing: Hash<u32, $crate::Pacing>;
            /// LPM trie of [`crate::SrcAllow6Key`] → `u32` ([`crate::SRC6_OWN`] or
            /// [`crate::SRC6_ALLOWED`]): the IPv6 sources a pod may send from, its own addresses
            /// (/128) and its allow-list alike.
            SRC_ALLOW6 src_allow6: LpmTrie<$crate::SrcAllow6Key, u32>;
            /// Host veth ifindex (`u32`, native order) → [`crate::NatUse`]: a pod's share of the
            /// NAT table (key 0: the node-wide sweep clock).
            NAT_USE nat_use: Hash<u32, $crate::NatUse>;
            /// [`crate::NatDestKey`] (a pod and a destination of its masqueraded flows) → `u32`:
            /// how many SNAT ports the pod holds towards that destination (see
            /// [`crate::NodeConfig::snat_dest_cap`]). A key goes when its count reaches zero.
            NAT_DEST_USE nat_dest_use: Hash<$crate::NatDestKey, u32>;
            /// [`crate::NodeState`] (index 0): userspace's node-wide bookkeeping, never read by
            /// the programs.
            NODE_STATE node_state: Array<$crate::NodeState>;
            /// [`crate::EndpointKey6`] → [`crate::EndpointInfo`]: local pods by IPv6 address.
            ENDPOINTS6 endpoints6: Hash<$crate::EndpointKey6, $crate::EndpointInfo>;
            /// [`crate::NatKey6`] → [`crate::NatEntry6`]: IPv6 NAT flows, as [`NAT`].
            NAT6 nat6: Hash<$crate::NatKey6, $crate::NatEntry6>;
            /// [`crate::NatDestKey6`] → `u32`: as [`NAT_DEST_USE`], for IPv6 destinations.
            NAT_DEST_USE6 nat_dest_use6: Hash<$crate::NatDestKey6, u32>;
            /// [`crate::NatKey6`] → [`crate::FlowEntry`] (LRU): as [`FLOWS`], for IPv6 flows.
            FLOWS6 flows6: Hash<$crate::NatKey6, $crate::FlowEntry>;
            /// [`crate::SockKey6`] → [`crate::SockPeer6`] (LRU): as [`STACK_SOCKETS`].
            STACK_SOCKETS6 stack_sockets6: Hash<$crate::SockKey6, $crate::SockPeer6>;
            /// Index 0 → [`crate::NodeConfig6`].
            NODE_CONFIG6 node_config6: Array<$crate::NodeConfig6>;
            /// Node IPv6 address ([`crate::Addr6`]) → [`crate::NodeAddr`].
            NODE_ADDRS6 node_addrs6: Hash<$crate::Addr6, $crate::NodeAddr>;
            /// Program array: the IPv6 programs and the DNS answer reader, tail-called by the
            /// attached ones (slots [`crate::prog::CALLS6`]). Each family's path is then its
            /// own program, with the verifier's whole 512-byte stack to itself.
            CALLS6 calls6: ProgramArray<>;
            /// [`crate::PortKey6`] → [`crate::PortTarget6`]: IPv6 host ports, as [`PORTMAPS`].
            PORTMAPS6 portmaps6: Hash<$crate::PortKey6, $crate::PortTarget6>;
            /// [`crate::SockRevKey6`] → [`crate::SockRevValue6`] (LRU): as [`SOCK_REVNAT`], for
            /// the node's IPv6 sockets translated to a pod's IPv6 address. (An IPv6 socket sent to
            /// an IPv4-mapped address is in [`SOCK_REVNAT`].)
            SOCK_REVNAT6 sock_revnat6: Hash<$crate::SockRevKey6, $crate::SockRevValue6>;
            /// [`crate::PolicyEndpointKey`] → [`crate::PolicyEndpoint`]: each pod interface's
            /// rule sets, in two slots (the agent writes one while the other is in force).
            POLICY_ENDPOINTS policy_endpoints: Hash<$crate::PolicyEndpointKey, $crate::PolicyEndpoint>;
            /// Index 0 → [`crate::PolicyState`]: the slot in force and its generation.
            POLICY_STATE policy_state: Array<$crate::PolicyState>;
            /// LPM trie of [`crate::PolicyPeerKey`] → `u64`: the port classes each peer prefix
            /// of a rule set may use.
            POLICY_PEERS policy_peers: LpmTrie<$crate::PolicyPeerKey, u64>;
            /// LPM trie of [`crate::PolicyPortKey`] → `u64`: the port classes each protocol and
            /// port prefix of a rule set belongs to.
            POLICY_PORTS policy_ports: LpmTrie<$crate::PolicyPortKey, u64>;
            /// [`crate::PolicyExactKey`] → `u64`: the classes whose egress rules' named ports
            /// name a destination.
            POLICY_EXACT policy_exact: Hash<$crate::PolicyExactKey, u64>;
            /// [`crate::PolicyFlowKey`] → [`crate::PolicyFlow`] (LRU): flows the policy admitted,
            /// whose replies pass.
            POLICY_FLOWS policy_flows: Hash<$crate::PolicyFlowKey, $crate::PolicyFlow>;
            /// `u64` ([`crate::fnv1a64`] of a namespace name) → `u32` (1): the namespaces some
            /// policy is in, kept by the agent; a pod ADD puts in one starts closed. Userspace
            /// only.
            POLICY_NAMESPACES policy_namespaces: Hash<u64, u32>;
            /// Per-CPU array of [`crate::PolicyDeny`]: each CPU's ring of the latest packets the
            /// policy refused ([`crate::POLICY_DENY_SLOTS`] each), read by `inspect`.
            POLICY_DENIES policy_denies: PerCpuArray<$crate::PolicyDeny>;
            /// `u32` (a pod's host veth ifindex) → [`crate::PolicyCounts`] (per CPU, LRU): the
            /// policy's verdicts at each pod, read by the agent's metrics.
            POLICY_COUNTS policy_counts: PerCpuHash<u32, $crate::PolicyCounts>;
            /// LPM trie of [`crate::TunnelKey`] → [`crate::TunnelEndpoint`]: the node that holds
            /// each other node's pod CIDRs, kept by the agent in the tunnel modes.
            TUNNEL_ENDPOINTS tunnel_endpoints: LpmTrie<$crate::TunnelKey, $crate::TunnelEndpoint>;
            /// [`crate::TunnelKey`] (a node's underlay address) → `u32` (1): the other nodes, whose
            /// own traffic may come out of the tunnel (kept with [`TUNNEL_ENDPOINTS`]).
            TUNNEL_NODES tunnel_nodes: Hash<$crate::TunnelKey, u32>;
            /// LPM trie of [`crate::TunnelKey`] → [`crate::WireguardPeer`]: with encryption on,
            /// every other node's pod CIDRs and whether the node has a key, kept by the
            /// agent; a cluster destination outside it is a node with no key.
            WIREGUARD_PEERS wireguard_peers: LpmTrie<$crate::TunnelKey, $crate::WireguardPeer>;
            /// [`crate::ServiceKey`] → [`crate::Service`]: the Service frontends the socket
            /// programs translate, kept by the agent in `--kube-proxy-replacement` mode.
            SERVICES services: Hash<$crate::ServiceKey, $crate::Service>;
            /// [`crate::BackendSlot`] → [`crate::Backend`]: each frontend's ready backends.
            SERVICE_BACKENDS service_backends: Hash<$crate::BackendSlot, $crate::Backend>;
            /// [`crate::MemberKey`] → `u32` (1): the backends of each frontend with
            /// `sessionAffinity: ClientIP`, to check a remembered choice against.
            SERVICE_MEMBERS service_members: Hash<$crate::MemberKey, u32>;
            /// [`crate::AffinityKey`] → [`crate::Affinity`] (LRU): each client's backend per
            /// frontend with `sessionAffinity: ClientIP`.
            SERVICE_AFFINITY service_affinity: Hash<$crate::AffinityKey, $crate::Affinity>;
            /// Network namespace cookie (`u64`) → the pod's host ifindex (`u32`): the pods whose
            /// sockets the Service translation applies to (besides the node's), written at ADD.
            SERVICE_NETNS service_netns: Hash<u64, u32>;
            /// Rule set id (`u32`) → [`crate::PolicyTiers`]: how the classes of a rule set
            /// that cluster policies take part in decide.
            POLICY_TIERS policy_tiers: Hash<u32, $crate::PolicyTiers>;
            /// [`crate::PolicyDomainKey`] → `u64`: the classes whose egress rules name a
            /// domain (exact, or the part after `*.`).
            POLICY_DOMAINS policy_domains: Hash<$crate::PolicyDomainKey, u64>;
            /// [`crate::PolicyLearnedKey`] → [`crate::PolicyLearned`] (LRU): the addresses each
            /// pod learned from DNS answers, under which rule names, until when.
            POLICY_LEARNED policy_learned: Hash<$crate::PolicyLearnedKey, $crate::PolicyLearned>;
            /// [`crate::PolicyClassKey`] → [`crate::PolicyClassCounts`] (per CPU, LRU): the
            /// verdicts each cluster policy rule decided, read by the agent's metrics.
            POLICY_CLASS_COUNTS policy_class_counts: PerCpuHash<$crate::PolicyClassKey, $crate::PolicyClassCounts>;
            /// [`crate::FlowLogKey`] → [`crate::FlowLogEntry`] (LRU): each pod flow's counters,
            /// as each pod interface sees it; the agent removes flows idle past their timeout.
            FLOW_LOG flow_log: Hash<$crate::FlowLogKey, $crate::FlowLogEntry>;
            /// Ring buffer of [`crate::FlowEvent`] records ([`crate::FLOW_EVENTS_BYTES`]), read
            /// by the agent.
            FLOW_EVENTS flow_events: RingBuf<>;
            /// Index 0 → [`crate::FlowConfig`]: whether flows are followed, written by the agent.
            FLOW_CONFIG flow_config: Array<$crate::FlowConfig>;
            /// Per-CPU [`crate::FlowCpu`]: the flow events' rate limit, and the drop reason of
            /// the packet being handled.
            FLOW_CPU flow_cpu: PerCpuArray<$crate::FlowCpu>;
        }
    };
}

/// Writes the name constants of the maps and the list of them all.
macro_rules! map_names {
    ($($(#[$doc:meta])* $name:ident $accessor:ident: $kind:ident<$($ty:ty),*>;)*) => {
        /// Names of the maps in the object (also their pin names), from [`map_table`].
        pub mod map {
            $($(#[$doc])* pub const $name: &str = stringify!($name);)*
            /// Every map, in the table's order.
            pub const ALL: &[&str] = &[$($name),*];
        }
    };
}

map_table!(map_names);

/// Names of the object's global variables, which userspace may set at load time.
pub mod global {
    /// Test-only fault injection (`u32`): `1` makes every L4 checksum update of the tc
    /// programs (`bpf_l4_csum_replace`) fail after the packet's tuple was written, as a
    /// failing helper would. The plugin never sets it (it stays `0`); the packet tests
    /// load the object with it to check that such packets are dropped
    /// (`drop_rewrite_failed`) and leave no NAT state.
    pub const FAULT_L4_CSUM: &str = "FAULT_L4_CSUM";
}

#[cfg(test)]
mod tests {
    use crate::{fnv1a64, LAYOUT_VERSION};

    /// The table's names, kinds and key and value sizes, hashed.
    macro_rules! fingerprint {
        ($($(#[$doc:meta])* $name:ident $accessor:ident: $kind:ident<$($ty:ty),*>;)*) => {{
            let mut h = 0_u64;
            $(
                h = fnv1a64(&[&h.to_le_bytes(), stringify!($name).as_bytes(), stringify!($kind).as_bytes()], b' ');
                $(h = fnv1a64(&[&h.to_le_bytes(), &core::mem::size_of::<$ty>().to_le_bytes()], b' ');)*
            )*
            h
        }};
    }

    /// A map added, removed, renamed or resized changes the layout, which pins of an older
    /// binary must not be mistaken for: the version goes up with it.
    #[test]
    fn a_changed_map_table_raises_the_layout_version() {
        assert_eq!(
            (LAYOUT_VERSION, map_table!(fingerprint)),
            (12, 10_846_283_048_719_641_504),
            "the maps' table changed: raise LAYOUT_VERSION, then write the new pair here"
        );
    }
}
