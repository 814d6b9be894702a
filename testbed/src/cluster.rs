//! Two simulated nodes joined through a fabric (docs/testing.md, "The simulated node"):
//! pod CIDRs routed to each other by static routes (what a cloud route table or flannel's
//! host-gw does), an outside world that is both nodes' default gateway.
//!
//! ```text
//!                     ext-<tag>   eth0 198.18.0.2/24  fd00:198:18::2/64
//!                                  │   (the outside world, default gateway of both nodes)
//!   fabric-<tag>:  br0 ── to-ext ──┘
//!                   ├──── to-a ── uplink0 198.18.0.1/24 fd00:198:18::1/64  node-<tag>-a
//!                   │      pods 10.244.1.0/24, fd00:10:244:1::/64;
//!                   │      10.244.2.0/24 via 198.18.0.3, fd00:10:244:2::/64 via fd00:198:18::3
//!                   └──── to-b ── uplink0 198.18.0.3/24 fd00:198:18::3/64  node-<tag>-b
//!                          pods 10.244.2.0/24, fd00:10:244:2::/64; the reverse routes
//! ```
//!
//! [`Cluster::without_pod_routes`] leaves the two pod-CIDR routes out (for host-gw tests).
//! Each node is a [`SimNode`] (its own pin root, data dir, log, `CNI_PATH`) whose `ext` is
//! the cluster's shared `ext`, so everything a `SimNode` offers works on a
//! [`ClusterNode`] through `Deref`. Node A keeps the single node's addresses
//! ([`NODE_IP4`], [`EXT_IP4`] as gateway). Neighbours are resolved on creation (every
//! node, and `ext`, pings the others once), because a live node has them. Everything is
//! removed on drop, also on panic; the machine's own namespace is never touched.

use std::{
    ops::Deref,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use cni_ebpf::datapath::Datapath;

use serde_json::json;

use crate::{
    apiserver::ApiServer,
    conf::ConfBuilder,
    kubeproxy::{self, Mode, ProxyNode, ServicePort, TrafficPolicy},
    net::ping,
    netns::NetNs,
    node::{configure_link, unique_tag, SimNode, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6, UPLINK},
    process::{run, Background},
};

/// The cluster CIDR (`clusterCIDRs` of both nodes, kube-proxy's `--cluster-cidr`).
pub const CLUSTER_CIDR4: &str = "10.244.0.0/16";
/// The Service CIDR the tests allocate ClusterIPs from.
pub const SERVICE_CIDR4: &str = "10.96.0.0/16";
/// The IPv6 cluster CIDR (of dual-stack clusters: [`ClusterNode::conf_dual_stack`]).
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/48";
/// The IPv6 Service CIDR.
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";
/// Node A's IPv6 pod CIDR (the single node's `POD_SUBNET_V6`).
pub const NODE_A_POD_CIDR6: &str = "fd00:10:244:1::/64";
/// Node B's IPv6 pod CIDR.
pub const NODE_B_POD_CIDR6: &str = "fd00:10:244:2::/64";
/// Node A's pod CIDR.
pub const NODE_A_POD_CIDR4: &str = "10.244.1.0/24";
/// Node B's pod CIDR.
pub const NODE_B_POD_CIDR4: &str = "10.244.2.0/24";
/// Node A's address on the fabric (the single node's [`NODE_IP4`]).
pub const NODE_A_IP4: &str = NODE_IP4;
/// Node B's address on the fabric.
pub const NODE_B_IP4: &str = "198.18.0.3";
/// Node A's IPv6 address on the fabric.
pub const NODE_A_IP6: &str = NODE_IP6;
/// Node B's IPv6 address on the fabric.
pub const NODE_B_IP6: &str = "fd00:198:18::3";
/// Node B's address in [`Cluster::across_subnets`] (a subnet of its own, behind a router).
pub const OTHER_SUBNET_B_IP4: &str = "198.19.0.3";
/// Node B's IPv6 address in [`Cluster::across_subnets`].
pub const OTHER_SUBNET_B_IP6: &str = "fd00:198:19::3";
/// Node C's address ([`Cluster::three_nodes_across_subnets`]: node A's subnet).
pub const NODE_C_IP4: &str = "198.18.0.4";
/// Node C's IPv6 address.
pub const NODE_C_IP6: &str = "fd00:198:18::4";
/// Node C's pod CIDR.
pub const NODE_C_POD_CIDR4: &str = "10.244.3.0/24";
/// Node C's IPv6 pod CIDR.
pub const NODE_C_POD_CIDR6: &str = "fd00:10:244:3::/64";

/// One node of a [`Cluster`]: a [`SimNode`] plus its name and addresses in the cluster.
#[derive(Debug)]
pub struct ClusterNode {
    sim: SimNode,
    name: &'static str,
    ip4: &'static str,
    ip6: &'static str,
    pod_cidr4: &'static str,
    pod_cidr6: &'static str,
}

impl ClusterNode {
    /// The node's name (`node-a`, `node-b`): kube-proxy's hostname, endpoints' node.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The node's IPv4 address on the fabric.
    #[must_use]
    pub fn ip4(&self) -> &'static str {
        self.ip4
    }

    /// The node's IPv6 address on the fabric.
    #[must_use]
    pub fn ip6(&self) -> &'static str {
        self.ip6
    }

    /// The node's IPv4 pod CIDR.
    #[must_use]
    pub fn pod_cidr4(&self) -> &'static str {
        self.pod_cidr4
    }

    /// The node's IPv6 pod CIDR.
    #[must_use]
    pub fn pod_cidr6(&self) -> &'static str {
        self.pod_cidr6
    }

    /// The node's fabric address the Node object publishes as its InternalIP over
    /// `underlay`.
    #[must_use]
    pub fn underlay_ip(&self, underlay: Underlay) -> &'static str {
        match underlay {
            Underlay::V4 => self.ip4,
            Underlay::V6 => self.ip6,
        }
    }

    /// The datapath of the test network pinned on this node. Panics if there is none.
    #[track_caller]
    #[must_use]
    pub fn pinned_datapath(&self) -> Datapath {
        self.pinned_datapath_of("testnet")
    }

    /// The datapath of `network` pinned on this node. Panics if there is none.
    #[track_caller]
    #[must_use]
    pub fn pinned_datapath_of(&self, network: &str) -> Datapath {
        let dir = self.pin_root().join(network);
        Datapath::open_at(&dir)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("nothing pinned at {}", dir.display()))
    }

    /// The count of datapath reason `name` on this node (0 before the first).
    #[must_use]
    pub fn reason_count(&self, name: &str) -> u64 {
        self.pinned_datapath()
            .reason_counts()
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.reason == name)
            .map_or(0, |r| r.count)
    }

    /// Whether this node's tunnel entries send `other`'s IPv4 pod CIDR to `other`'s
    /// address over `underlay`.
    #[must_use]
    pub fn tunnels_to(&self, other: &ClusterNode, underlay: Underlay) -> bool {
        self.tunnels_to_in("testnet", other, underlay)
    }

    /// [`Self::tunnels_to`] in network `network`.
    #[must_use]
    pub fn tunnels_to_in(&self, network: &str, other: &ClusterNode, underlay: Underlay) -> bool {
        let Ok(want) = other.pod_cidr4.parse::<ipnet::IpNet>() else {
            return false;
        };
        self.pinned_datapath_of(network)
            .tunnel_endpoints()
            .unwrap_or_default()
            .iter()
            .any(|(net, node)| *net == want && node.to_string() == other.underlay_ip(underlay))
    }

    /// Starts `cni-ebpf agent` on this node with only its Node watcher (no
    /// NetworkPolicy), logging to `log`: it keeps the tunnel entries and the direct routes
    /// of the cross-node modes.
    #[must_use]
    pub fn start_node_agent(&self, api: &ApiServer, log: &Path) -> Background {
        self.start_node_agent_of(&crate::plugin::plugin_bin(), api, log)
    }

    /// [`Self::start_node_agent`] of the binary `bin`.
    #[must_use]
    pub fn start_node_agent_of(&self, bin: &Path, api: &ApiServer, log: &Path) -> Background {
        self.start_agent_of(
            bin,
            api,
            &[
                "agent",
                "--policy=false",
                "--listen",
                "127.0.0.1:0",
                "--probe-listen",
                "127.0.0.1:0",
                "--node-name",
                self.name,
                "--host-gw-interval",
                "30",
            ],
            log,
        )
    }

    /// Starts `cni-ebpf agent` on this node without NetworkPolicy, with
    /// `--kube-proxy-replacement` `on` or off, appending to `log`.
    #[must_use]
    pub fn start_service_agent(&self, api: &ApiServer, on: bool, log: &Path) -> Background {
        self.start_service_agent_of(&crate::plugin::plugin_bin(), api, on, log)
    }

    /// [`Self::start_service_agent`] of the binary `bin`.
    #[must_use]
    pub fn start_service_agent_of(
        &self,
        bin: &Path,
        api: &ApiServer,
        on: bool,
        log: &Path,
    ) -> Background {
        self.start_agent_of(
            bin,
            api,
            &[
                "agent",
                "--policy=false",
                if on {
                    "--kube-proxy-replacement=true"
                } else {
                    "--kube-proxy-replacement=false"
                },
                "--listen",
                "127.0.0.1:0",
                "--probe-listen",
                "127.0.0.1:0",
                "--node-name",
                self.name,
            ],
            log,
        )
    }

    /// Starts `cni-ebpf agent` on this node with both NetworkPolicy (its state in the
    /// node's directory) and `--kube-proxy-replacement`, appending to `log`.
    #[must_use]
    pub fn start_policy_service_agent(&self, api: &ApiServer, log: &Path) -> Background {
        self.start_policy_agent(api, true, log)
    }

    /// Starts `cni-ebpf agent` on this node as the DaemonSet runs it: NetworkPolicy (its
    /// state in the node's directory), the Node watcher (tunnel entries) and, when
    /// `replacement`, `--kube-proxy-replacement`; appending to `log`.
    #[must_use]
    pub fn start_policy_agent(&self, api: &ApiServer, replacement: bool, log: &Path) -> Background {
        let state = self.dir().join("policy-state").display().to_string();
        self.start_agent_of(
            &crate::plugin::plugin_bin(),
            api,
            &[
                "agent",
                if replacement {
                    "--kube-proxy-replacement=true"
                } else {
                    "--kube-proxy-replacement=false"
                },
                "--state-dir",
                &state,
                "--listen",
                "127.0.0.1:0",
                "--probe-listen",
                "127.0.0.1:0",
                "--node-name",
                self.name,
            ],
            log,
        )
    }

    /// Whether an agent turned flows on in `network` (false: not, or nothing is pinned).
    #[must_use]
    pub fn flows_on_of(&self, network: &str) -> bool {
        self.open_pinned(network)
            .and_then(|d| d.flow_config().ok())
            .is_some_and(|c| c.enabled == 1)
    }

    /// The datapath of `network` pinned on this node, if there is one.
    fn open_pinned(&self, network: &str) -> Option<Datapath> {
        Datapath::open_at(self.pin_root().join(network))
            .ok()
            .flatten()
    }

    /// The policy generation in force on `network` (0: no agent has swapped one in, or
    /// nothing is pinned).
    #[must_use]
    pub fn policy_generation_of(&self, network: &str) -> u32 {
        self.open_pinned(network)
            .and_then(|d| d.policy_state().ok())
            .map_or(0, |s| s.generation)
    }

    /// The pods' IPv4 gateway (first address of the pod CIDR, owned by every host veth).
    #[must_use]
    pub fn gateway4(&self) -> String {
        let net = self.pod_cidr4.split('/').next().unwrap_or(self.pod_cidr4);
        let prefix = net.rsplit_once('.').map_or(net, |(p, _)| p);
        format!("{prefix}.1")
    }

    /// The pods' IPv6 gateway (`::1` of the IPv6 pod CIDR).
    #[must_use]
    pub fn gateway6(&self) -> String {
        let net = self.pod_cidr6.split('/').next().unwrap_or(self.pod_cidr6);
        format!("{}1", net.trim_end_matches(':').to_owned() + "::")
    }

    /// The `SimNode` underneath (also reachable through `Deref`).
    #[must_use]
    pub fn sim(&self) -> &SimNode {
        &self.sim
    }

    /// This node's network configuration as a Kubernetes node would have it: spec 1.1.0,
    /// IPv4 pods from [`Self::pod_cidr4`], `ipMasq` with `clusterCIDRs` =
    /// [`CLUSTER_CIDR4`], and the node's pin root, data dir, log and uplink. (Shadows
    /// [`SimNode::conf`], which has the single node's dual-stack defaults.)
    #[must_use]
    pub fn conf(&self) -> ConfBuilder {
        self.sim
            .conf()
            .version("1.1.0")
            .subnets(&[self.pod_cidr4])
            .set("ipMasq", json!(true))
            .set("clusterCIDRs", json!([CLUSTER_CIDR4]))
    }

    /// [`Self::conf`] for dual-stack pods: IPv4 and IPv6 addresses from the node's pod
    /// CIDRs, both families' cluster CIDRs.
    #[must_use]
    pub fn conf_dual_stack(&self) -> ConfBuilder {
        self.conf()
            .subnets(&[self.pod_cidr4, self.pod_cidr6])
            .set("clusterCIDRs", json!([CLUSTER_CIDR4, CLUSTER_CIDR6]))
    }

    /// What kube-proxy on this node knows about it: its name, its fabric address, the
    /// cluster CIDR and the Service CIDR.
    #[must_use]
    pub fn proxy_node(&self) -> ProxyNode {
        ProxyNode::new(self.name, &[self.ip4], CLUSTER_CIDR4, SERVICE_CIDR4)
    }

    /// [`Self::proxy_node`] for IPv6 (kube-proxy's second family on a dual-stack node).
    #[must_use]
    pub fn proxy_node6(&self) -> ProxyNode {
        ProxyNode::new(self.name, &[self.ip6], CLUSTER_CIDR6, SERVICE_CIDR6)
    }

    /// Loads kube-proxy's rules for `services` in `mode` into this node (see
    /// [`kubeproxy::install`]): the IPv4 ones, and the IPv6 ones too when a Service is
    /// IPv6 (as kube-proxy runs one proxier per family on a dual-stack node).
    #[track_caller]
    pub fn install_kube_proxy(&self, mode: Mode, services: &[ServicePort]) {
        kubeproxy::install(self.netns(), mode, &self.proxy_node(), services);
        if services.iter().any(ServicePort::is_ipv6) {
            kubeproxy::install(self.netns(), mode, &self.proxy_node6(), services);
        }
    }
}

impl Deref for ClusterNode {
    type Target = SimNode;

    fn deref(&self) -> &SimNode {
        &self.sim
    }
}

/// The address family of the network between the nodes, which carries the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underlay {
    V4,
    V6,
}

/// Two nodes, a fabric and the outside world (see the module documentation).
#[derive(Debug)]
pub struct Cluster {
    tag: String,
    // Field order is drop order: the nodes first (their namespaces, pins and temp dirs),
    // then the fabric, then `ext` (its last reference).
    a: ClusterNode,
    b: ClusterNode,
    c: Option<ClusterNode>,
    fabric: NetNs,
    ext: Arc<NetNs>,
}

impl Cluster {
    /// Builds the cluster for the test `test` (a name fragment; uniqueness is added),
    /// wires it and resolves the neighbours. Panics if a node cannot reach the others.
    #[track_caller]
    #[must_use]
    pub fn new(test: &str) -> Self {
        Self::build(test, true)
    }

    /// Like [`Cluster::new`] but without the static routes to each other's pod CIDR: pods
    /// of one node cannot reach the other's until something (host-gw) routes them.
    #[track_caller]
    #[must_use]
    pub fn without_pod_routes(test: &str) -> Self {
        Self::build(test, false)
    }

    /// Two nodes on different subnets behind a router, and no route to any pod CIDR
    /// anywhere (only a tunnel can carry pod traffic between the nodes):
    ///
    /// ```text
    ///   fabric-<tag> (the router, forwarding):
    ///     br0 198.18.0.254/24 fd00:198:18::fe/64 ── ext (198.18.0.2), node A (198.18.0.1)
    ///     br1 198.19.0.254/24 fd00:198:19::fe/64 ── node B (198.19.0.3, fd00:198:19::3)
    /// ```
    ///
    /// Node A's default gateway is `ext` (as in [`Cluster::new`]); it and `ext` reach
    /// 198.19.0.0/24 through the router, which is node B's default gateway.
    #[track_caller]
    #[must_use]
    pub fn across_subnets(test: &str) -> Self {
        Self::routed_subnets(Self::unwired(test, OTHER_SUBNET_B_IP4, OTHER_SUBNET_B_IP6))
    }

    /// [`Cluster::across_subnets`] with a third node, C (`node-c`, [`NODE_C_IP4`], pods
    /// in [`NODE_C_POD_CIDR4`]), on node A's subnet: A and C share a segment, B sits
    /// behind the router.
    #[track_caller]
    #[must_use]
    pub fn three_nodes_across_subnets(test: &str) -> Self {
        let mut cluster = Self::unwired(test, OTHER_SUBNET_B_IP4, OTHER_SUBNET_B_IP6);
        cluster.c = Some(ClusterNode {
            sim: SimNode::unwired(
                format!("{}-c", cluster.tag),
                &format!("node-{}-c", cluster.tag),
                Arc::clone(&cluster.ext),
            ),
            name: "node-c",
            ip4: NODE_C_IP4,
            ip6: NODE_C_IP6,
            pod_cidr4: NODE_C_POD_CIDR4,
            pod_cidr6: NODE_C_POD_CIDR6,
        });
        Self::routed_subnets(cluster)
    }

    #[track_caller]
    fn routed_subnets(cluster: Self) -> Self {
        let f = cluster.fabric.name();
        for (br, v4, v6) in [
            ("br0", "198.18.0.254", "fd00:198:18::fe"),
            ("br1", "198.19.0.254", "fd00:198:19::fe"),
        ] {
            run(&["ip", "-n", f, "link", "add", br, "type", "bridge"]).ok();
            configure_link(f, br, v4, v6);
        }
        for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
            let path = std::path::Path::new("/proc/sys").join(key);
            crate::net::in_netns(cluster.fabric.path(), move || std::fs::write(path, "1"))
                .unwrap_or_else(|e| panic!("forwarding in the router: {e}"));
        }
        for (port, br, ns, dev, v4, v6) in [
            (
                "to-ext",
                "br0",
                cluster.ext.name(),
                "eth0",
                EXT_IP4,
                EXT_IP6,
            ),
            (
                "to-a",
                "br0",
                cluster.a.netns_name(),
                UPLINK,
                cluster.a.ip4,
                cluster.a.ip6,
            ),
            (
                "to-b",
                "br1",
                cluster.b.netns_name(),
                UPLINK,
                cluster.b.ip4,
                cluster.b.ip6,
            ),
        ]
        .into_iter()
        .chain(
            cluster
                .c
                .as_ref()
                .map(|c| ("to-c", "br0", c.netns_name(), UPLINK, c.ip4, c.ip6)),
        ) {
            run(&[
                "ip", "-n", f, "link", "add", port, "type", "veth", "peer", "name", dev, "netns",
                ns,
            ])
            .ok();
            run(&["ip", "-n", f, "link", "set", port, "master", br, "up"]).ok();
            configure_link(ns, dev, v4, v6);
        }
        let (b, x) = (cluster.b.netns_name(), cluster.ext.name());
        let route = |ns: &str, dst: &str, via: &str| {
            let family = if via.contains(':') { "-6" } else { "-4" };
            run(&["ip", "-n", ns, family, "route", "add", dst, "via", via]).ok();
        };
        for n in std::iter::once(&cluster.a).chain(cluster.c.as_ref()) {
            let n = n.netns_name();
            route(n, "default", EXT_IP4);
            route(n, "default", EXT_IP6);
            route(n, "198.19.0.0/24", "198.18.0.254");
            route(n, "fd00:198:19::/64", "fd00:198:18::fe");
        }
        route(b, "default", "198.19.0.254");
        route(b, "default", "fd00:198:19::fe");
        route(x, "198.19.0.0/24", "198.18.0.254");
        route(x, "fd00:198:19::/64", "fd00:198:18::fe");
        cluster.offload_like_nics();
        cluster.resolve_neighbours();
        cluster
    }

    /// The namespaces of a cluster whose node B has the fabric addresses `b_ip4`,
    /// `b_ip6`, nothing wired yet.
    #[track_caller]
    fn unwired(test: &str, b_ip4: &'static str, b_ip6: &'static str) -> Self {
        let tag = unique_tag(test);
        let fabric = NetNs::create(&format!("fabric-{tag}"));
        let ext = Arc::new(NetNs::create(&format!("ext-{tag}")));
        let node = |suffix: &str, name, ip4, ip6, pod_cidr4, pod_cidr6| ClusterNode {
            sim: SimNode::unwired(
                format!("{tag}-{suffix}"),
                &format!("node-{tag}-{suffix}"),
                Arc::clone(&ext),
            ),
            name,
            ip4,
            ip6,
            pod_cidr4,
            pod_cidr6,
        };
        let a = node(
            "a",
            "node-a",
            NODE_A_IP4,
            NODE_A_IP6,
            NODE_A_POD_CIDR4,
            NODE_A_POD_CIDR6,
        );
        let b = node(
            "b",
            "node-b",
            b_ip4,
            b_ip6,
            NODE_B_POD_CIDR4,
            NODE_B_POD_CIDR6,
        );
        Self {
            tag,
            a,
            b,
            c: None,
            fabric,
            ext,
        }
    }

    #[track_caller]
    fn build(test: &str, pod_routes: bool) -> Self {
        let cluster = Self::unwired(test, NODE_B_IP4, NODE_B_IP6);
        cluster.wire(pod_routes);
        cluster.offload_like_nics();
        cluster.resolve_neighbours();
        cluster
    }

    /// Makes the links between the fabric and the nodes behave as wires and NICs do: the
    /// fabric's port towards a node sends frames of the MTU (no TCP segmentation offload,
    /// so a run of segments is cut up before it reaches the node), and the node's uplink
    /// merges what it receives (GRO in a NAPI poll, TCP segments and, with a VXLAN socket
    /// open, tunnelled ones), as a NIC's driver does. A veth takes that path only for
    /// packets from a peer without TSO. Without this, runs of segments would cross
    /// between nodes unsegmented on the routed path, and arrive segmented and unmerged
    /// through a tunnel (the router's bridge cuts up tunnelled runs).
    #[track_caller]
    fn offload_like_nics(&self) {
        for (port, node) in [("to-a", &self.a), ("to-b", &self.b)]
            .into_iter()
            .chain(self.c.as_ref().map(|c| ("to-c", c)))
        {
            crate::net::set_offload(self.fabric.path(), port, crate::net::Offload::Tso, false)
                .unwrap_or_else(|e| panic!("TSO off on {port} in the fabric: {e}"));
            crate::net::set_offload(node.netns(), UPLINK, crate::net::Offload::Gro, true)
                .unwrap_or_else(|e| panic!("GRO on {UPLINK} of {}: {e}", node.name));
        }
    }

    fn wire(&self, pod_routes: bool) {
        let f = self.fabric.name();
        run(&["ip", "-n", f, "link", "add", "br0", "type", "bridge"]).ok();
        run(&["ip", "-n", f, "link", "set", "br0", "up"]).ok();
        for (port, ns, dev, v4, v6) in [
            ("to-ext", self.ext.name(), "eth0", EXT_IP4, EXT_IP6),
            ("to-a", self.a.netns_name(), UPLINK, self.a.ip4, self.a.ip6),
            ("to-b", self.b.netns_name(), UPLINK, self.b.ip4, self.b.ip6),
        ] {
            run(&[
                "ip", "-n", f, "link", "add", port, "type", "veth", "peer", "name", dev, "netns",
                ns,
            ])
            .ok();
            run(&["ip", "-n", f, "link", "set", port, "master", "br0", "up"]).ok();
            configure_link(ns, dev, v4, v6);
        }
        for (node, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            let n = node.netns_name();
            run(&["ip", "-n", n, "route", "add", "default", "via", EXT_IP4]).ok();
            run(&[
                "ip", "-n", n, "-6", "route", "add", "default", "via", EXT_IP6,
            ])
            .ok();
            // What a cloud route table or host-gw provides: the other node's pods are
            // behind the other node.
            if !pod_routes {
                continue;
            }
            run(&[
                "ip",
                "-n",
                n,
                "route",
                "add",
                peer.pod_cidr4,
                "via",
                peer.ip4,
            ])
            .ok();
            run(&[
                "ip",
                "-n",
                n,
                "-6",
                "route",
                "add",
                peer.pod_cidr6,
                "via",
                peer.ip6,
            ])
            .ok();
        }
    }

    /// Sets the MTU of every link between the nodes and `ext` (the nodes' uplinks,
    /// `ext`'s `eth0`, the fabric's ports and bridges) to `mtu`.
    #[track_caller]
    pub fn set_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        let f = self.fabric.name();
        let mut links: Vec<(&str, &str)> = vec![
            (self.a.netns_name(), UPLINK),
            (self.b.netns_name(), UPLINK),
            (self.ext.name(), "eth0"),
        ];
        links.extend(["to-ext", "to-a", "to-b"].map(|port| (f, port)));
        for (ns, dev) in links {
            run(&["ip", "-n", ns, "link", "set", dev, "mtu", &mtu]).ok();
        }
        for br in ["br0", "br1"] {
            // (`br1` exists only across subnets.)
            let _ = run(&["ip", "-n", f, "link", "set", br, "mtu", &mtu]);
        }
    }

    /// Every node and `ext` pings every other once (IPv4 and IPv6), so the neighbour
    /// tables are filled as on a live cluster. Panics naming the pair that got no answer.
    #[track_caller]
    pub fn resolve_neighbours(&self) {
        let mut members = vec![
            ("node-a", self.a.netns(), self.a.ip4),
            ("node-b", self.b.netns(), self.b.ip4),
            ("ext", self.ext.path(), EXT_IP4),
            ("node-a", self.a.netns(), self.a.ip6),
            ("node-b", self.b.netns(), self.b.ip6),
            ("ext", self.ext.path(), EXT_IP6),
        ];
        if let Some(c) = &self.c {
            members.push(("node-c", c.netns(), c.ip4));
            members.push(("node-c", c.netns(), c.ip6));
        }
        for (from, ns, _) in &members {
            for (to, _, addr) in &members {
                if from != to {
                    assert!(
                        ping(ns, addr, 3),
                        "{from} cannot reach {to} ({addr}) over the fabric"
                    );
                }
            }
        }
    }

    /// The unique tag in the fabric's and `ext`'s names.
    #[must_use]
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Node A (`node-a`, [`NODE_A_IP4`], pods in [`NODE_A_POD_CIDR4`]).
    #[must_use]
    pub fn a(&self) -> &ClusterNode {
        &self.a
    }

    /// Node B (`node-b`, [`NODE_B_IP4`], pods in [`NODE_B_POD_CIDR4`]).
    #[must_use]
    pub fn b(&self) -> &ClusterNode {
        &self.b
    }

    /// Node C of [`Cluster::three_nodes_across_subnets`]; panics on a two-node cluster.
    #[track_caller]
    #[must_use]
    pub fn c(&self) -> &ClusterNode {
        self.c
            .as_ref()
            .unwrap_or_else(|| panic!("this cluster has no node C"))
    }

    /// Nodes A and B (node C, when there is one, is [`Cluster::c`]).
    #[must_use]
    pub fn nodes(&self) -> [&ClusterNode; 2] {
        [&self.a, &self.b]
    }

    /// `/run/netns/ext-<tag>`: the outside world.
    #[must_use]
    pub fn ext_netns(&self) -> &Path {
        self.ext.path()
    }

    /// `/run/netns/fabric-<tag>`: the bridge joining the nodes and `ext`.
    #[must_use]
    pub fn fabric_netns(&self) -> &Path {
        self.fabric.path()
    }

    /// Publishes both Node objects on `api` (both pod CIDRs; the InternalIP of
    /// `underlay`), starts a Node-watching agent on each ([`ClusterNode::start_node_agent`],
    /// logs in `logs`) and waits until each node's tunnel entries lead to the other.
    /// Panics, showing the agents' logs, if that takes more than five seconds.
    #[track_caller]
    #[must_use]
    pub fn join_by_tunnel(
        &self,
        api: &ApiServer,
        underlay: Underlay,
        logs: &Path,
    ) -> [Background; 2] {
        self.join_by_tunnel_of(&crate::plugin::plugin_bin(), "testnet", api, underlay, logs)
    }

    /// [`Self::join_by_tunnel`] with the agents of binary `bin`, for the network
    /// `network`.
    #[track_caller]
    #[must_use]
    pub fn join_by_tunnel_of(
        &self,
        bin: &Path,
        network: &str,
        api: &ApiServer,
        underlay: Underlay,
        logs: &Path,
    ) -> [Background; 2] {
        self.publish_nodes(api, underlay);
        let log = |n: &ClusterNode| logs.join(format!("agent-{}.log", n.name));
        let agents = [
            self.a.start_node_agent_of(bin, api, &log(&self.a)),
            self.b.start_node_agent_of(bin, api, &log(&self.b)),
        ];
        self.wait_for_tunnels(network, underlay, logs);
        agents
    }

    /// Publishes both Node objects on `api`: both pod CIDRs, the InternalIP of `underlay`.
    fn publish_nodes(&self, api: &ApiServer, underlay: Underlay) {
        for n in self.nodes() {
            api.set_node(
                n.name,
                &[n.pod_cidr4, n.pod_cidr6],
                &[n.underlay_ip(underlay)],
            );
        }
    }

    /// Waits until each node's tunnel entries of `network` lead to the other; panics,
    /// showing the agents' logs in `logs`, after five seconds.
    #[track_caller]
    fn wait_for_tunnels(&self, network: &str, underlay: Underlay, logs: &Path) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for (n, other) in [(&self.a, &self.b), (&self.b, &self.a)] {
            while !n.tunnels_to_in(network, other, underlay) {
                if Instant::now() > deadline {
                    panic!(
                        "{}'s tunnel entries do not lead to {} after 5 s; agent logs:\n{}",
                        n.name,
                        other.name,
                        agent_logs(logs)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Publishes `services` (Services and EndpointSlices) on `api`, starts an agent with
    /// `--kube-proxy-replacement` on each node (logs in `logs`) and waits until each
    /// node's Service maps hold every frontend with every backend. Panics, showing the
    /// agents' logs, if that takes more than ten seconds.
    #[track_caller]
    #[must_use]
    pub fn replace_kube_proxy(
        &self,
        api: &ApiServer,
        services: &[ServicePort],
        logs: &Path,
    ) -> [Background; 2] {
        self.replace_kube_proxy_of(&crate::plugin::plugin_bin(), "testnet", api, services, logs)
    }

    /// [`Self::replace_kube_proxy`] with the agents of binary `bin`, watching the maps of
    /// network `network`.
    #[track_caller]
    #[must_use]
    pub fn replace_kube_proxy_of(
        &self,
        bin: &Path,
        network: &str,
        api: &ApiServer,
        services: &[ServicePort],
        logs: &Path,
    ) -> [Background; 2] {
        for (resource, obj) in crate::service_objects::objects(services) {
            api.put(resource, obj);
        }
        let log = |n: &ClusterNode| logs.join(format!("agent-{}.log", n.name));
        let agents = [
            self.a.start_service_agent_of(bin, api, true, &log(&self.a)),
            self.b.start_service_agent_of(bin, api, true, &log(&self.b)),
        ];
        self.wait_for_service_maps(network, services, logs);
        agents
    }

    /// Starts the DaemonSet's agent on each node ([`ClusterNode::start_policy_agent`]: logs
    /// in `logs`), which enforces the NetworkPolicies `api` holds, keeps the tunnel entries
    /// when `underlay` is given (its Node objects published first) and translates
    /// `services` in place of kube-proxy when given (published first). Waits until each
    /// node has a policy generation in force, tunnel entries to the other node and whole
    /// Service maps, as asked; panics, showing the agents' logs, if that takes too long.
    #[track_caller]
    #[must_use]
    pub fn start_policy_agents(
        &self,
        api: &ApiServer,
        underlay: Option<Underlay>,
        services: Option<&[ServicePort]>,
        logs: &Path,
    ) -> [Background; 2] {
        if let Some(u) = underlay {
            self.publish_nodes(api, u);
        }
        for (resource, obj) in crate::service_objects::objects(services.unwrap_or_default()) {
            api.put(resource, obj);
        }
        let log = |n: &ClusterNode| logs.join(format!("agent-{}.log", n.name));
        let replacement = services.is_some();
        let agents = [
            self.a.start_policy_agent(api, replacement, &log(&self.a)),
            self.b.start_policy_agent(api, replacement, &log(&self.b)),
        ];
        let deadline = Instant::now() + Duration::from_secs(10);
        for n in self.nodes() {
            while n.policy_generation_of("testnet") == 0 {
                if Instant::now() > deadline {
                    panic!(
                        "{} has no policy generation in force after 10 s; agent logs:\n{}",
                        n.name,
                        agent_logs(logs)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if let Some(u) = underlay {
            self.wait_for_tunnels("testnet", u, logs);
        }
        if let Some(services) = services {
            self.wait_for_service_maps("testnet", services, logs);
        }
        agents
    }

    /// Waits until each node's Service maps of `network` hold every frontend of
    /// `services` with every backend; panics, showing the agents' logs in `logs`, after
    /// ten seconds.
    #[track_caller]
    fn wait_for_service_maps(&self, network: &str, services: &[ServicePort], logs: &Path) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for n in self.nodes() {
            // Each port's ClusterIP; a NodePort twice (for the node and its pods with every
            // endpoint, from outside with those `externalTrafficPolicy` allows here), once
            // without endpoints (the node's stack refuses it from outside); each external
            // IP and load-balancer address of the port's family twice, as a NodePort.
            let (mut frontends, mut backends) = (0, 0);
            for s in services {
                frontends += 1;
                backends += s.endpoints.len();
                let external = match s.external_traffic_policy {
                    TrafficPolicy::Cluster => s.endpoints.len(),
                    TrafficPolicy::Local => s.endpoints.iter().filter(|e| e.node == n.name).count(),
                };
                if s.node_port.is_some() {
                    frontends += if s.endpoints.is_empty() { 1 } else { 2 };
                    backends += s.endpoints.len() + external;
                }
                let addresses = s
                    .external_ips
                    .iter()
                    .chain(&s.load_balancer_ips)
                    .filter(|ip| ip.is_ipv6() == s.is_ipv6())
                    .count();
                frontends += 2 * addresses;
                backends += addresses * (s.endpoints.len() + external);
            }
            loop {
                let table = n
                    .pinned_datapath_of(network)
                    .service_table()
                    .unwrap_or_default();
                let held: usize = table.values().map(|f| f.backends.len()).sum();
                if table.len() == frontends && held == backends {
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "{}'s Service maps hold {} frontends with {held} backends after 10 s, \
                         not {} with {backends}; agent logs:\n{}",
                        n.name,
                        table.len(),
                        frontends,
                        agent_logs(logs)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Loads kube-proxy's rules for `services` in `mode` into both nodes, each with its
    /// own view (its name decides which endpoints are local).
    #[track_caller]
    pub fn install_kube_proxy(&self, mode: Mode, services: &[ServicePort]) {
        for node in self.nodes() {
            node.install_kube_proxy(mode, services);
        }
    }
}

/// The agents' logs in `dir` (`agent-<node>.log`), one after the other.
#[must_use]
pub fn agent_logs(dir: &Path) -> String {
    ["node-a", "node-b"]
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(format!("agent-{n}.log"))).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}
