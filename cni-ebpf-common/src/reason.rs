//! The decisions and drop reasons the programs count (`REASONS`), and their names.

/// Decision and drop reasons counted per CPU in the `REASONS` map (index = value).
/// The map has [`REASON_SLOTS`] slots: the datapath's reasons take 16..67, the Service
/// translations' and the NetworkPolicy replies' and DNS answers' 1..16; slot 0 is unused.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A new flow from outside to a Service frontend (NodePort, external IP,
    /// load-balancer address), sent to a backend on this node with the client's address
    /// kept.
    ServiceNew = 1,
    /// A new flow from outside to a Service frontend, sent on to a backend on another
    /// node from the node's own address.
    ServiceNewRouted = 2,
    /// A packet of a flow from outside sent on to a Service backend on another node, or
    /// of its reply, translated and routed out.
    ServiceRouted = 3,
    /// Dropped: a new flow from outside to a Service frontend with no usable backend
    /// (none at all, or `externalTrafficPolicy: Local` and none on this node).
    DropServiceNoBackend = 4,
    /// Dropped: a translated packet from outside that no route leads out of the uplink
    /// or the tunnel device for, or that is too big for it.
    DropServiceUnroutable = 5,
    /// A socket call (`connect`, `sendmsg`) sent to a Service backend.
    SockService = 6,
    /// A socket call to a Service frontend without a usable backend, refused.
    SockServiceRefused = 7,
    /// A packet handed to the stack for a local pod (or a node address) that is the reply
    /// of a flow NetworkPolicy admitted, marked so that it passes `to_pod` whatever
    /// address translation netfilter applies in between (kube-proxy's un-DNAT).
    PolicyReplyMarked = 8,
    /// A packet `to_pod` let into its pod because it was marked as the reply of an
    /// admitted flow before the stack translated it.
    PolicyReplyPassed = 9,
    /// An address a pod learned from a DNS answer it received, for a name its egress
    /// rules name (one per address record).
    PolicyDnsLearned = 10,
    /// A DNS answer for a pod whose egress rules name domains that taught nothing: not
    /// readable (malformed, truncated, a TCP message not whole in one segment, a name of
    /// more labels than are read) or an error answer.
    PolicyDnsUnread = 11,
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
    /// forwarding path skipped; masquerade still applied by `uplink_egress`), or through
    /// the tunnel device, redirected straight to that (`to_tunnel` still applied).
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
    /// A packet from outside (through the uplink or out of the tunnel) for a local pod,
    /// in a flow whose packets from the pod were seen leaving untranslated: redirected
    /// into the pod past the node's stack.
    RedirectFromUplink = 47,
    /// Dropped: a pod sent with a source address that is not one of its own (nor in its
    /// allow-list).
    DropSpoofedSource = 48,
    /// Dropped: rewriting a translated packet failed part-way (a checksum helper or a
    /// store refused), so its addresses or ports may be new while a checksum is stale.
    /// The NAT entries made for it, if it opened a flow, are removed again. Also a
    /// packet whose tunnel headers could not be written once room for them was made.
    DropRewriteFailed = 49,
    /// Dropped: the pod sends faster than its egress rate (`runtimeConfig.bandwidth`)
    /// allows, by more than its burst plus its limit ([`crate::Pacing::limit_ns`]).
    DropEgressRate = 50,
    /// Dropped: the first packet of a translated flow (masquerade, host port, hairpin)
    /// of a pod that already holds its share of the NAT table (`natFlowsPerPod` flows).
    DropNatPodCap = 51,
    /// The NAT table was swept for finished flows (a pod at its cap or a full table
    /// asked for room; at most once per [`crate::NAT_SWEEP_INTERVAL_NS`] node-wide).
    NatSweep = 52,
    /// An entry of a finished flow removed by a sweep (its pod's share given back).
    NatSweptEntry = 53,
    /// Dropped: the first packet of a masqueraded flow of a pod that already holds its
    /// share of the SNAT ports towards that destination (address, port, protocol;
    /// `natPortsPerDestination`).
    DropSnatDestCap = 54,
    /// Passed unchanged: an IPv6 packet whose program is not in the `CALLS6` program
    /// array (a datapath being loaded, or one a crash left half-loaded: CHECK reports it).
    PassIpv6NotLoaded = 55,
    /// Dropped: NetworkPolicy does not admit the packet leaving its pod (nor is it a
    /// reply of a flow it admitted).
    DropPolicyEgress = 56,
    /// Dropped: NetworkPolicy does not admit the packet to its pod (nor is it a reply of
    /// a flow it admitted).
    DropPolicyIngress = 57,
    /// A flow to or from a pod that some policy selects, admitted by its rules and
    /// recorded, so its later packets and its replies pass on one lookup.
    PolicyAdmitted = 58,
    /// Same-node pod → pod handed to the stack, as `sameNodeFastPath: false` asks (so
    /// that the node's netfilter sees it).
    PassPodTrafficToStack = 59,
    /// A packet routed to the tunnel device, given the address of the node that holds
    /// its destination (over an IPv4 underlay encapsulated by the program and sent from
    /// the uplink, else encapsulated by the device).
    TunnelEncap = 60,
    /// Dropped: routed to the tunnel device, but no node holds its destination.
    DropNoTunnelEndpoint = 61,
    /// A packet that came out of the tunnel from the node that holds its source.
    TunnelDecap = 62,
    /// Dropped: came out of the tunnel with a source that is neither the sending node's
    /// address nor in that node's pod CIDRs.
    DropTunnelSpoofed = 63,
    /// A packet for another node's pod (or, from a pod, for another node) handed to the
    /// node's WireGuard device, which encrypts it to that node's key.
    WireguardEncrypt = 64,
    /// Dropped: encryption is on and the node that holds the destination has published
    /// no key (or is unknown), so it would have left the node in clear.
    DropNoWireguardKey = 65,
    /// Sent in clear to a node without a published key, as `encryptionStrict: false`
    /// allows.
    WireguardClearToKeyless = 66,
    /// A flow event not sent: its CPU had used its share of events per second
    /// (`--flow-events-per-second`). The flow's counters are kept.
    FlowEventRateLimited = 67,
    /// A flow event not sent: the ring was full (the agent reads too slowly, or none
    /// reads). The flow's counters are kept.
    FlowEventRingFull = 68,
}

impl Reason {
    /// Every reason, for userspace listings.
    pub const ALL: [Reason; 64] = [
        Reason::ServiceNew,
        Reason::ServiceNewRouted,
        Reason::ServiceRouted,
        Reason::DropServiceNoBackend,
        Reason::DropServiceUnroutable,
        Reason::SockService,
        Reason::SockServiceRefused,
        Reason::PolicyReplyMarked,
        Reason::PolicyReplyPassed,
        Reason::PolicyDnsLearned,
        Reason::PolicyDnsUnread,
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
        Reason::PassIpv6NotLoaded,
        Reason::DropPolicyEgress,
        Reason::DropPolicyIngress,
        Reason::PolicyAdmitted,
        Reason::PassPodTrafficToStack,
        Reason::TunnelEncap,
        Reason::DropNoTunnelEndpoint,
        Reason::TunnelDecap,
        Reason::DropTunnelSpoofed,
        Reason::WireguardEncrypt,
        Reason::DropNoWireguardKey,
        Reason::WireguardClearToKeyless,
        Reason::FlowEventRateLimited,
        Reason::FlowEventRingFull,
    ];

    /// Whether the packet counted is dropped for it.
    #[must_use]
    pub const fn is_drop(self) -> bool {
        matches!(
            self,
            Reason::DropServiceNoBackend
                | Reason::DropServiceUnroutable
                | Reason::DropNoSnatPort
                | Reason::DropSpoofedSource
                | Reason::DropRewriteFailed
                | Reason::DropEgressRate
                | Reason::DropNatPodCap
                | Reason::DropSnatDestCap
                | Reason::DropPolicyEgress
                | Reason::DropPolicyIngress
                | Reason::DropNoTunnelEndpoint
                | Reason::DropTunnelSpoofed
                | Reason::DropNoWireguardKey
        )
    }

    /// The reason of value `v`, if any.
    #[must_use]
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| *r as u32 == v)
    }

    /// Stable snake-case name (used by `inspect`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Reason::ServiceNew => "service_new",
            Reason::ServiceNewRouted => "service_new_routed",
            Reason::ServiceRouted => "service_routed",
            Reason::DropServiceNoBackend => "drop_service_no_backend",
            Reason::DropServiceUnroutable => "drop_service_unroutable",
            Reason::SockService => "sock_service",
            Reason::SockServiceRefused => "sock_service_refused",
            Reason::PolicyReplyMarked => "policy_reply_marked",
            Reason::PolicyReplyPassed => "policy_reply_passed",
            Reason::PolicyDnsLearned => "policy_dns_learned",
            Reason::PolicyDnsUnread => "policy_dns_unread",
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
            Reason::PassIpv6NotLoaded => "pass_ipv6_not_loaded",
            Reason::DropPolicyEgress => "drop_policy_egress",
            Reason::DropPolicyIngress => "drop_policy_ingress",
            Reason::PolicyAdmitted => "policy_admitted",
            Reason::PassPodTrafficToStack => "pass_pod_traffic_to_stack",
            Reason::TunnelEncap => "tunnel_encap",
            Reason::DropNoTunnelEndpoint => "drop_no_tunnel_endpoint",
            Reason::TunnelDecap => "tunnel_decap",
            Reason::DropTunnelSpoofed => "drop_tunnel_spoofed",
            Reason::WireguardEncrypt => "wireguard_encrypt",
            Reason::DropNoWireguardKey => "drop_no_wireguard_key",
            Reason::WireguardClearToKeyless => "wireguard_clear_to_keyless",
            Reason::FlowEventRateLimited => "flow_event_rate_limited",
            Reason::FlowEventRingFull => "flow_event_ring_full",
        }
    }
}

/// Number of slots in the reasons map (must exceed every [`Reason`] value).
pub const REASON_SLOTS: u32 = 80;
const _: () = assert!((Reason::FlowEventRingFull as u32) < REASON_SLOTS);
const _: () = assert!((Reason::PassPodTrafficToStack as u32) < REASON_SLOTS);

#[cfg(test)]
mod tests {
    use super::{Reason, REASON_SLOTS};

    /// `Reason::ALL` lists every reason once, in value order with no gap within its two
    /// ranges (a reason missing from it would never be shown by `inspect`), and every
    /// name is distinct.
    #[test]
    fn reason_table_is_complete_and_names_are_unique() {
        let services = Reason::ALL.iter().take_while(|r| (**r as u32) < 16).count();
        for (i, r) in Reason::ALL.iter().enumerate() {
            let expected = if i < services {
                1 + i as u32
            } else {
                16 + (i - services) as u32
            };
            assert_eq!(*r as u32, expected, "{r:?} out of order in Reason::ALL");
            assert!((*r as u32) < REASON_SLOTS);
            for other in &Reason::ALL[..i] {
                assert_ne!(r.name(), other.name(), "two reasons named {}", r.name());
            }
        }
    }
}
