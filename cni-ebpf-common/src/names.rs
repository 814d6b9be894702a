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
    /// The IPv6 programs, each at its slot of the `CALLS6` program array.
    pub const CALLS6: [(&str, u32); 3] = [
        (FROM_POD6, CALL6_FROM_POD),
        (UPLINK_INGRESS6, CALL6_UPLINK_INGRESS),
        (UPLINK_EGRESS6, CALL6_UPLINK_EGRESS),
    ];
    /// Every program, in load order (the tail-called IPv6 programs first: a program that
    /// calls them finds them in place from its first packet).
    pub const ALL: [&str; 19] = [
        FROM_POD6,
        UPLINK_INGRESS6,
        UPLINK_EGRESS6,
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

/// Names of the maps in the object (also their pin names).
pub mod map {
    /// [`crate::EndpointKey`] → [`crate::EndpointInfo`].
    pub const ENDPOINTS: &str = "ENDPOINTS";
    /// Host veth ifindex (`u32`) → per-CPU [`crate::EndpointStats`].
    pub const EP_STATS: &str = "EP_STATS";
    /// [`crate::PortKey`] → [`crate::PortTarget`].
    pub const PORTMAPS: &str = "PORTMAPS";
    /// [`crate::NatKey`] → [`crate::NatEntry`] (a plain hash: nothing is ever evicted;
    /// finished flows are reclaimed by the programs, see [`crate::NatUse`]).
    pub const NAT: &str = "NAT";
    /// Index 0 → [`crate::NodeConfig`].
    pub const NODE_CONFIG: &str = "NODE_CONFIG";
    /// Node IPv4 address (`u32`, network order) → [`crate::NodeAddr`].
    pub const NODE_ADDRS: &str = "NODE_ADDRS";
    /// Per-CPU `u64` counters indexed by [`crate::Reason`].
    pub const REASONS: &str = "REASONS";
    /// Owner id (`u64`, [`crate::owner_id`]) → [`crate::Owner`]; userspace only.
    pub const OWNERS: &str = "OWNERS";
    /// [`crate::NatKey`] (a pod flow's tuple as the pod sends it) → [`crate::FlowEntry`]
    /// (LRU): whether the flow may bypass the node's stack.
    pub const FLOWS: &str = "FLOWS";
    /// [`crate::SockKey`] (a pod's socket) → [`crate::SockPeer`] (LRU): the last peer
    /// that socket addressed through the node's stack.
    pub const STACK_SOCKETS: &str = "STACK_SOCKETS";
    /// [`crate::SockRevKey`] → [`crate::SockRevValue`] (LRU): what a node socket's host-port
    /// peer was before the socket hooks translated it.
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    /// LPM trie of [`crate::SrcAllowKey`] → `u32` (1): extra source prefixes a pod may
    /// send from (its own addresses need no entry).
    pub const SRC_ALLOW: &str = "SRC_ALLOW";
    /// Host veth ifindex (`u32`, native order) → [`crate::Pacing`]: a pod's egress rate
    /// (`runtimeConfig.bandwidth`).
    pub const PACING: &str = "PACING";
    /// LPM trie of [`crate::SrcAllow6Key`] → `u32` ([`crate::SRC6_OWN`] or
    /// [`crate::SRC6_ALLOWED`]): the IPv6 sources a pod may send from, its own addresses
    /// (/128) and its allow-list alike.
    pub const SRC_ALLOW6: &str = "SRC_ALLOW6";
    /// Host veth ifindex (`u32`, native order) → [`crate::NatUse`]: a pod's share of the
    /// NAT table (key 0: the node-wide sweep clock).
    pub const NAT_USE: &str = "NAT_USE";
    /// [`crate::NatDestKey`] (a pod and a destination of its masqueraded flows) → `u32`:
    /// how many SNAT ports the pod holds towards that destination (see
    /// [`crate::NodeConfig::snat_dest_cap`]). A key goes when its count reaches zero.
    pub const NAT_DEST_USE: &str = "NAT_DEST_USE";
    /// [`crate::NodeState`] (index 0): userspace's node-wide bookkeeping, never read by
    /// the programs.
    pub const NODE_STATE: &str = "NODE_STATE";
    /// [`crate::EndpointKey6`] → [`crate::EndpointInfo`]: local pods by IPv6 address.
    pub const ENDPOINTS6: &str = "ENDPOINTS6";
    /// [`crate::NatKey6`] → [`crate::NatEntry6`]: IPv6 NAT flows, as [`NAT`].
    pub const NAT6: &str = "NAT6";
    /// [`crate::NatDestKey6`] → `u32`: as [`NAT_DEST_USE`], for IPv6 destinations.
    pub const NAT_DEST_USE6: &str = "NAT_DEST_USE6";
    /// [`crate::NatKey6`] → [`crate::FlowEntry`] (LRU): as [`FLOWS`], for IPv6 flows.
    pub const FLOWS6: &str = "FLOWS6";
    /// [`crate::SockKey6`] → [`crate::SockPeer6`] (LRU): as [`STACK_SOCKETS`].
    pub const STACK_SOCKETS6: &str = "STACK_SOCKETS6";
    /// Index 0 → [`crate::NodeConfig6`].
    pub const NODE_CONFIG6: &str = "NODE_CONFIG6";
    /// Node IPv6 address ([`crate::Addr6`]) → [`crate::NodeAddr`].
    pub const NODE_ADDRS6: &str = "NODE_ADDRS6";
    /// [`crate::PortKey6`] → [`crate::PortTarget6`]: IPv6 host ports, as [`PORTMAPS`].
    pub const PORTMAPS6: &str = "PORTMAPS6";
    /// Program array: the IPv6 programs, tail-called by the attached ones (slots
    /// [`crate::prog::CALLS6`]). Each family's path is then its own program, with the
    /// verifier's whole 512-byte stack to itself.
    pub const CALLS6: &str = "CALLS6";
    /// [`crate::SockRevKey6`] → [`crate::SockRevValue6`] (LRU): as [`SOCK_REVNAT`], for
    /// the node's IPv6 sockets translated to a pod's IPv6 address. (An IPv6 socket sent to
    /// an IPv4-mapped address is in [`SOCK_REVNAT`].)
    pub const SOCK_REVNAT6: &str = "SOCK_REVNAT6";
    /// [`crate::PolicyEndpointKey`] → [`crate::PolicyEndpoint`]: each pod interface's
    /// rule sets, in two slots (the agent writes one while the other is in force).
    pub const POLICY_ENDPOINTS: &str = "POLICY_ENDPOINTS";
    /// Index 0 → [`crate::PolicyState`]: the slot in force and its generation.
    pub const POLICY_STATE: &str = "POLICY_STATE";
    /// LPM trie of [`crate::PolicyPeerKey`] → `u64`: the port classes each peer prefix
    /// of a rule set may use.
    pub const POLICY_PEERS: &str = "POLICY_PEERS";
    /// LPM trie of [`crate::PolicyPortKey`] → `u64`: the port classes each protocol and
    /// port prefix of a rule set belongs to.
    pub const POLICY_PORTS: &str = "POLICY_PORTS";
    /// [`crate::PolicyExactKey`] → `u32` (1): destinations an egress named port admits.
    pub const POLICY_EXACT: &str = "POLICY_EXACT";
    /// [`crate::PolicyFlowKey`] → [`crate::PolicyFlow`] (LRU): flows the policy admitted,
    /// whose replies pass.
    pub const POLICY_FLOWS: &str = "POLICY_FLOWS";
    /// `u64` ([`crate::fnv1a64`] of a namespace name) → `u32` (1): the namespaces some
    /// policy is in, kept by the agent; a pod ADD puts in one starts closed. Userspace
    /// only.
    pub const POLICY_NAMESPACES: &str = "POLICY_NAMESPACES";
    /// Per-CPU array of [`crate::PolicyDeny`]: each CPU's ring of the latest packets the
    /// policy refused ([`crate::POLICY_DENY_SLOTS`] each), read by `inspect`.
    pub const POLICY_DENIES: &str = "POLICY_DENIES";
    /// `u32` (a pod's host veth ifindex) → [`crate::PolicyCounts`] (per CPU, LRU): the
    /// policy's verdicts at each pod, read by the agent's metrics.
    pub const POLICY_COUNTS: &str = "POLICY_COUNTS";
    /// LPM trie of [`crate::TunnelKey`] → [`crate::TunnelEndpoint`]: the node that holds
    /// each other node's pod CIDRs, kept by the agent in the tunnel modes.
    pub const TUNNEL_ENDPOINTS: &str = "TUNNEL_ENDPOINTS";
    /// [`crate::TunnelKey`] (a node's underlay address) → `u32` (1): the other nodes, whose
    /// own traffic may come out of the tunnel (kept with [`TUNNEL_ENDPOINTS`]).
    pub const TUNNEL_NODES: &str = "TUNNEL_NODES";
    /// [`crate::ServiceKey`] → [`crate::Service`]: the Service frontends the socket
    /// programs translate, kept by the agent in `--kube-proxy-replacement` mode.
    pub const SERVICES: &str = "SERVICES";
    /// [`crate::BackendSlot`] → [`crate::Backend`]: each frontend's ready backends.
    pub const SERVICE_BACKENDS: &str = "SERVICE_BACKENDS";
    /// [`crate::MemberKey`] → `u32` (1): the backends of each frontend with
    /// `sessionAffinity: ClientIP`, to check a remembered choice against.
    pub const SERVICE_MEMBERS: &str = "SERVICE_MEMBERS";
    /// [`crate::AffinityKey`] → [`crate::Affinity`] (LRU): each client's backend per
    /// frontend with `sessionAffinity: ClientIP`.
    pub const SERVICE_AFFINITY: &str = "SERVICE_AFFINITY";
    /// Network namespace cookie (`u64`) → the pod's host ifindex (`u32`): the pods whose
    /// sockets the Service translation applies to (besides the node's), written at ADD.
    pub const SERVICE_NETNS: &str = "SERVICE_NETNS";
    /// Every map.
    pub const ALL: [&str; 43] = [
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
        NODE_STATE,
        ENDPOINTS6,
        NAT6,
        NAT_DEST_USE6,
        FLOWS6,
        STACK_SOCKETS6,
        NODE_CONFIG6,
        NODE_ADDRS6,
        CALLS6,
        PORTMAPS6,
        SOCK_REVNAT6,
        POLICY_ENDPOINTS,
        POLICY_STATE,
        POLICY_PEERS,
        POLICY_PORTS,
        POLICY_EXACT,
        POLICY_FLOWS,
        POLICY_NAMESPACES,
        POLICY_DENIES,
        POLICY_COUNTS,
        TUNNEL_ENDPOINTS,
        TUNNEL_NODES,
        SERVICES,
        SERVICE_BACKENDS,
        SERVICE_MEMBERS,
        SERVICE_AFFINITY,
        SERVICE_NETNS,
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
