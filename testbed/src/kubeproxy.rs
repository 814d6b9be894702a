//! kube-proxy's rules for a node, rendered the way kube-proxy itself writes them, and
//! loaded into a simulated node with the real tools (`iptables-restore`, `nft -f`).
//!
//! The datapath must keep every flow that netfilter translates on the kernel path, so the
//! tests need the rules a real node has, not a hand-written DNAT: the same chains, marks,
//! hooks and priorities, so that what conntrack, the masquerade mark and the filter hooks
//! do to a packet is what they do on a node running kube-proxy. The layouts follow
//! kube-proxy's `pkg/proxy/iptables` and `pkg/proxy/nftables` (the expected dumps in their
//! `proxier_test.go`); this is our own renderer of those layouts, for the subset of Service
//! features the tests use (ClusterIP, NodePort, external IPs and load-balancer addresses
//! with `externalTrafficPolicy`, several endpoints, TCP/UDP/SCTP, one family per rule
//! set) with kube-proxy's defaults:
//! masquerade bit 14 (`0x4000`), `--cluster-cidr` as the local-traffic detector,
//! `--random-fully` / `fully-random` masquerade, no `masqueradeAll`, localhost NodePorts
//! in iptables mode (hence `route_localnet=1`), NodePorts on every local address in
//! iptables mode and on the node's primary addresses in nftables mode (its default).
//! Not rendered: load-balancer source ranges (the firewall chains), session affinity,
//! topology hints, `nfacct` counters (kube-proxy skips those when the kernel has none).
//!
//! ```no_run
//! use testbed::kubeproxy::{self, Mode, ProxyNode, ServicePort, Protocol, TrafficPolicy};
//! let node = ProxyNode::new("node-a", &["198.18.0.1"], "10.244.0.0/16", "10.96.0.0/16");
//! let svc = ServicePort::new("default/web", "http", Protocol::Tcp, "10.96.0.10", 80)
//!     .endpoint("10.244.1.2:8080", "node-a")
//!     .node_port(30080, TrafficPolicy::Local);
//! println!("{}", kubeproxy::nftables(&node, &[svc.clone()]));
//! # let netns = std::path::Path::new("/run/netns/node-x");
//! kubeproxy::install(netns, Mode::Iptables, &node, &[svc]);
//! ```

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use crate::process::{command, in_netns, run_cmd, Output};

/// The masquerade mark (kube-proxy's default `--masquerade-bit=14`).
pub const MASQ_MARK: &str = "0x4000";

/// A Service port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP (netfilter's conntrack and NAT of it need no SCTP socket module).
    Sctp,
}

impl Protocol {
    /// The lower-case name kube-proxy uses in rules and chain names.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// `externalTrafficPolicy` of a Service with a NodePort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Any endpoint in the cluster; the client address is masqueraded.
    Cluster,
    /// Only endpoints on the receiving node; the client address is kept.
    Local,
}

/// One endpoint of a Service port: the pod's `ip:port` and the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Pod address and target port.
    pub addr: SocketAddr,
    /// Name of the node the pod runs on (compared with [`ProxyNode::name`]).
    pub node: String,
}

/// One port of a Service (kube-proxy's unit: a `ServicePortName` plus its endpoints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Name of the port (may be empty).
    pub port_name: String,
    /// Protocol of the port.
    pub protocol: Protocol,
    /// The ClusterIP.
    pub cluster_ip: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The NodePort, if the Service has one.
    pub node_port: Option<u16>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` (without `loadBalancerSourceRanges`).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy` (only meaningful with a NodePort, an external IP or a
    /// load-balancer address).
    pub external_traffic_policy: TrafficPolicy,
    /// Ready endpoints, in the order kube-proxy would list them.
    pub endpoints: Vec<Endpoint>,
}

impl ServicePort {
    /// A ClusterIP Service port `namespaced` (`"ns/name"`) / `port_name` on
    /// `cluster_ip:port`, without endpoints. Panics on a malformed name or address.
    #[track_caller]
    #[must_use]
    pub fn new(
        namespaced: &str,
        port_name: &str,
        protocol: Protocol,
        cluster_ip: &str,
        port: u16,
    ) -> Self {
        let Some((namespace, name)) = namespaced.split_once('/') else {
            panic!("Service name {namespaced:?} is not namespace/name");
        };
        let cluster_ip = cluster_ip
            .parse()
            .unwrap_or_else(|e| panic!("ClusterIP {cluster_ip:?}: {e}"));
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port_name: port_name.to_owned(),
            protocol,
            cluster_ip,
            port,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            external_traffic_policy: TrafficPolicy::Cluster,
            endpoints: Vec::new(),
        }
    }

    /// Adds the endpoint `addr` (`"ip:port"`) running on node `node`.
    #[track_caller]
    #[must_use]
    pub fn endpoint(mut self, addr: &str, node: &str) -> Self {
        self.endpoints.push(Endpoint {
            addr: crate::net::sock_addr(addr),
            node: node.to_owned(),
        });
        self
    }

    /// Makes it a NodePort Service on `port` with `externalTrafficPolicy: policy`.
    #[must_use]
    pub fn node_port(mut self, port: u16, policy: TrafficPolicy) -> Self {
        self.node_port = Some(port);
        self.external_traffic_policy = policy;
        self
    }

    /// Adds the external IP `ip` (`spec.externalIPs`), with `externalTrafficPolicy:
    /// policy`. Panics on a malformed address.
    #[track_caller]
    #[must_use]
    pub fn external_ip(mut self, ip: &str, policy: TrafficPolicy) -> Self {
        self.external_ips.push(parse_ip(ip));
        self.external_traffic_policy = policy;
        self
    }

    /// Adds the load-balancer address `ip` (as a cloud controller writes it to the
    /// Service's status), with `externalTrafficPolicy: policy`. Panics on a malformed
    /// address.
    #[track_caller]
    #[must_use]
    pub fn load_balancer_ip(mut self, ip: &str, policy: TrafficPolicy) -> Self {
        self.load_balancer_ips.push(parse_ip(ip));
        self.external_traffic_policy = policy;
        self
    }

    /// The external IPs and load-balancer addresses of this port's family, each with the
    /// word kube-proxy's comments use for it.
    fn external_addresses(&self) -> Vec<(IpAddr, &'static str)> {
        let v6 = self.v6();
        self.external_ips
            .iter()
            .map(|ip| (*ip, "external IP"))
            .chain(
                self.load_balancer_ips
                    .iter()
                    .map(|ip| (*ip, "loadbalancer IP")),
            )
            .filter(|(ip, _)| ip.is_ipv6() == v6)
            .collect()
    }

    /// `ServicePortName.String()`: `ns/name:port`, or `ns/name` for an unnamed port.
    #[must_use]
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    fn external_policy_local(&self) -> bool {
        self.externally_accessible() && self.external_traffic_policy == TrafficPolicy::Local
    }

    fn v6(&self) -> bool {
        self.cluster_ip.is_ipv6()
    }

    /// Whether this is an IPv6 Service port (its ClusterIP's family).
    #[must_use]
    pub fn is_ipv6(&self) -> bool {
        self.v6()
    }
}

/// What kube-proxy knows about the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNode {
    /// `--hostname-override`: endpoints whose node has this name are local.
    pub name: String,
    /// The node's primary addresses (nftables mode accepts NodePorts on these).
    pub node_ips: Vec<IpAddr>,
    /// `--cluster-cidr` of this family: the local-traffic detector.
    pub cluster_cidr: String,
    /// The Service CIDR of this family (nftables mode drops traffic to unallocated
    /// ClusterIPs in it).
    pub service_cidr: String,
}

impl ProxyNode {
    /// A node named `name` with primary addresses `node_ips`; the family of the rules is
    /// that of `cluster_cidr`. Panics on a malformed address.
    #[track_caller]
    #[must_use]
    pub fn new(name: &str, node_ips: &[&str], cluster_cidr: &str, service_cidr: &str) -> Self {
        Self {
            name: name.to_owned(),
            node_ips: node_ips
                .iter()
                .map(|ip| {
                    ip.parse()
                        .unwrap_or_else(|e| panic!("node address {ip:?}: {e}"))
                })
                .collect(),
            cluster_cidr: cluster_cidr.to_owned(),
            service_cidr: service_cidr.to_owned(),
        }
    }

    fn v6(&self) -> bool {
        self.cluster_cidr.contains(':')
    }
}

/// kube-proxy's split of a Service's endpoints (`proxy.CategorizeEndpoints` without
/// topology): all of them for Cluster policy, this node's for Local policy.
struct Categorized<'a> {
    cluster: Vec<&'a Endpoint>,
    local: Vec<&'a Endpoint>,
    /// Every endpoint this node can route to under the Service's policies.
    reachable: Vec<&'a Endpoint>,
    has_endpoints: bool,
    has_external_endpoints: bool,
}

fn categorize<'a>(node: &ProxyNode, svc: &'a ServicePort) -> Categorized<'a> {
    // internalTrafficPolicy is always Cluster here, so ClusterIP traffic uses every
    // endpoint and the cluster set is always in use.
    let cluster: Vec<&Endpoint> = svc.endpoints.iter().collect();
    let local: Vec<&Endpoint> = if svc.external_policy_local() {
        svc.endpoints
            .iter()
            .filter(|e| e.node == node.name)
            .collect()
    } else {
        Vec::new()
    };
    let has_endpoints = !svc.endpoints.is_empty();
    Categorized {
        reachable: cluster.clone(),
        has_external_endpoints: has_endpoints
            && (!svc.external_policy_local() || !local.is_empty()),
        cluster,
        local,
        has_endpoints,
    }
}

/// `ip:port`, with brackets for IPv6 (Go's `net.JoinHostPort`).
fn join_host_port(addr: SocketAddr) -> String {
    addr.to_string()
}

#[track_caller]
fn parse_ip(ip: &str) -> IpAddr {
    ip.parse().unwrap_or_else(|e| panic!("address {ip:?}: {e}"))
}

// ------------------------------------------------------------------------------------
// iptables mode

/// A rule kube-proxy keeps in a built-in chain (it cannot own those chains, so it
/// checks for the rule and prepends it when missing instead of restoring it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpRule {
    /// `filter` or `nat`.
    pub table: &'static str,
    /// The built-in chain (`PREROUTING`, `INPUT`, …).
    pub chain: &'static str,
    /// The kube-proxy chain it jumps to (created first when missing).
    pub target: &'static str,
    /// The rule's arguments, ending in `-j <target>`.
    pub args: Vec<String>,
}

/// The iptables-mode rules of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesRules {
    /// Whether they are for `ip6tables`.
    pub ipv6: bool,
    /// Jumps from the built-in chains, in the order kube-proxy ensures them (each one is
    /// prepended, so the last one ends up first in its chain).
    pub jumps: Vec<JumpRule>,
    /// The `iptables-restore --noflush` input: `*filter` and `*nat`.
    pub restore: String,
}

/// kube-proxy's `iptablesJumpChains` and kubelet's `KUBE-FIREWALL` jumps.
const IPTABLES_JUMPS: &[(&str, &str, &str, &str, bool)] = &[
    // (table, target, built-in chain, comment, only new connections)
    (
        "filter",
        "KUBE-EXTERNAL-SERVICES",
        "INPUT",
        "kubernetes externally-visible service portals",
        true,
    ),
    (
        "filter",
        "KUBE-EXTERNAL-SERVICES",
        "FORWARD",
        "kubernetes externally-visible service portals",
        true,
    ),
    (
        "filter",
        "KUBE-NODEPORTS",
        "INPUT",
        "kubernetes health check service ports",
        false,
    ),
    (
        "filter",
        "KUBE-SERVICES",
        "FORWARD",
        "kubernetes service portals",
        true,
    ),
    (
        "filter",
        "KUBE-SERVICES",
        "OUTPUT",
        "kubernetes service portals",
        true,
    ),
    (
        "filter",
        "KUBE-FORWARD",
        "FORWARD",
        "kubernetes forwarding rules",
        false,
    ),
    (
        "filter",
        "KUBE-PROXY-FIREWALL",
        "INPUT",
        "kubernetes load balancer firewall",
        true,
    ),
    (
        "filter",
        "KUBE-PROXY-FIREWALL",
        "OUTPUT",
        "kubernetes load balancer firewall",
        true,
    ),
    (
        "filter",
        "KUBE-PROXY-FIREWALL",
        "FORWARD",
        "kubernetes load balancer firewall",
        true,
    ),
    (
        "nat",
        "KUBE-SERVICES",
        "OUTPUT",
        "kubernetes service portals",
        false,
    ),
    (
        "nat",
        "KUBE-SERVICES",
        "PREROUTING",
        "kubernetes service portals",
        false,
    ),
    (
        "nat",
        "KUBE-POSTROUTING",
        "POSTROUTING",
        "kubernetes postrouting rules",
        false,
    ),
    // kubelet's copies (no comment).
    ("filter", "KUBE-FIREWALL", "INPUT", "", false),
    ("filter", "KUBE-FIREWALL", "OUTPUT", "", false),
];

/// Chain names of one Service port in iptables mode: `KUBE-XXX-` + 16 characters of
/// `base32(sha256(portName + protocol))`.
struct IptChains {
    svc: String,
    svl: String,
    ext: String,
}

fn ipt_chains(svc: &ServicePort) -> IptChains {
    let hash = hash_prefix(
        &format!("{}{}", svc.port_name_string(), svc.protocol.name()),
        16,
    );
    IptChains {
        svc: format!("KUBE-SVC-{hash}"),
        svl: format!("KUBE-SVL-{hash}"),
        ext: format!("KUBE-EXT-{hash}"),
    }
}

/// `KUBE-SEP-` + 16 characters of `base32(sha256(portName + protocol + "ip:port"))`.
fn ipt_endpoint_chain(svc: &ServicePort, ep: &Endpoint) -> String {
    let hash = hash_prefix(
        &format!(
            "{}{}{}",
            svc.port_name_string(),
            svc.protocol.name(),
            join_host_port(ep.addr)
        ),
        16,
    );
    format!("KUBE-SEP-{hash}")
}

/// A comment argument as kube-proxy writes it: quoted when it has spaces.
fn comment(text: &str) -> String {
    if text.contains(' ') {
        format!("-m comment --comment \"{text}\"")
    } else {
        format!("-m comment --comment {text}")
    }
}

/// Buffers of one `iptables-restore` table section.
#[derive(Default)]
struct Table {
    /// The chain declarations in order of first mention, and the set of them (a cluster
    /// of 10 000 Services declares over 100 000 chains).
    chains: Vec<String>,
    declared: std::collections::HashSet<String>,
    rules: Vec<String>,
}

impl Table {
    fn chain(&mut self, name: &str) {
        let line = format!(":{name} - [0:0]");
        if self.declared.insert(line.clone()) {
            self.chains.push(line);
        }
    }

    fn rule(&mut self, line: String) {
        self.rules.push(line);
    }

    fn write(&self, name: &str, out: &mut String) {
        let _ = writeln!(out, "*{name}");
        for l in self.chains.iter().chain(&self.rules) {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out, "COMMIT");
    }
}

/// kube-proxy's iptables-mode rules for `services` on `node` (one family: the node's).
#[must_use]
pub fn iptables(node: &ProxyNode, services: &[ServicePort]) -> IptablesRules {
    let v6 = node.v6();
    let mut filter = Table::default();
    let mut nat = Table::default();
    for c in [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
    ] {
        filter.chain(c);
    }
    for c in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        nat.chain(c);
    }
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"
    ));
    nat.rule(format!(
        "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"
    ));
    nat.rule(format!(
        "-A KUBE-POSTROUTING {} -j MASQUERADE --random-fully",
        comment("kubernetes service traffic requiring SNAT")
    ));
    nat.rule(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"));
    if !v6 {
        // Localhost NodePorts (the iptables-mode default) need route_localnet; this is the
        // mitigation kube-proxy and kubelet install with it.
        filter.chain("KUBE-FIREWALL");
        filter.rule(format!(
            "-A KUBE-FIREWALL {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            comment("block incoming localnet connections")
        ));
    }

    let cluster = &node.cluster_cidr;
    for svc in services.iter().filter(|s| s.v6() == v6) {
        let cat = categorize(node, svc);
        let name = svc.port_name_string();
        let proto = svc.protocol.name();
        let chains = ipt_chains(svc);
        let external_policy_chain = if svc.external_policy_local() {
            &chains.svl
        } else {
            &chains.svc
        };
        let dst = format!(
            "-m {proto} -p {proto} -d {} --dport {}",
            svc.cluster_ip, svc.port
        );

        // Capture the ClusterIP (no internal-policy Local here: internal endpoints are
        // all endpoints).
        if cat.has_endpoints {
            nat.rule(format!(
                "-A KUBE-SERVICES {} {dst} -j {}",
                comment(&format!("{name} cluster IP")),
                chains.svc
            ));
        } else {
            filter.rule(format!(
                "-A KUBE-SERVICES {} {dst} -j REJECT",
                comment(&format!("{name} has no endpoints"))
            ));
        }

        // Capture the external IPs and load-balancer addresses.
        for (ip, what) in svc.external_addresses() {
            let to = format!("-m {proto} -p {proto} -d {ip} --dport {}", svc.port);
            if cat.has_endpoints {
                nat.rule(format!(
                    "-A KUBE-SERVICES {} {to} -j {}",
                    comment(&format!("{name} {what}")),
                    chains.ext
                ));
            }
            if !cat.has_external_endpoints {
                let (why, verdict) = if cat.has_endpoints {
                    ("has no local endpoints", "DROP")
                } else {
                    ("has no endpoints", "REJECT")
                };
                filter.rule(format!(
                    "-A KUBE-EXTERNAL-SERVICES {} {to} -j {verdict}",
                    comment(&format!("{name} {why}"))
                ));
            }
        }

        // Capture the NodePort.
        if let Some(np) = svc.node_port {
            if cat.has_endpoints {
                nat.rule(format!(
                    "-A KUBE-NODEPORTS {} -m {proto} -p {proto} --dport {np} -j {}",
                    comment(&name),
                    chains.ext
                ));
            }
            if !cat.has_external_endpoints {
                let (why, verdict) = if cat.has_endpoints {
                    ("has no local endpoints", "DROP")
                } else {
                    ("has no endpoints", "REJECT")
                };
                filter.rule(format!(
                    "-A KUBE-EXTERNAL-SERVICES {} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {verdict}",
                    comment(&format!("{name} {why}"))
                ));
            }
        }

        if !cat.has_endpoints {
            continue;
        }

        // Internal traffic: masquerade what does not come from a pod.
        nat.chain(&chains.svc);
        nat.rule(format!(
            "-A {} {} {dst} ! -s {cluster} -j KUBE-MARK-MASQ",
            chains.svc,
            comment(&format!("{name} cluster IP"))
        ));

        // External traffic.
        if svc.externally_accessible() {
            let ext = &chains.ext;
            nat.chain(ext);
            if svc.external_policy_local() {
                nat.rule(format!(
                    "-A {ext} {} -s {cluster} -j {}",
                    comment(&format!("pod traffic for {name} external destinations")),
                    chains.svc
                ));
                nat.rule(format!(
                    "-A {ext} {} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                    comment(&format!(
                        "masquerade LOCAL traffic for {name} external destinations"
                    ))
                ));
                nat.rule(format!(
                    "-A {ext} {} -m addrtype --src-type LOCAL -j {}",
                    comment(&format!(
                        "route LOCAL traffic for {name} external destinations"
                    )),
                    chains.svc
                ));
            } else {
                nat.rule(format!(
                    "-A {ext} {} -j KUBE-MARK-MASQ",
                    comment(&format!(
                        "masquerade traffic for {name} external destinations"
                    ))
                ));
            }
            if cat.has_external_endpoints {
                nat.rule(format!("-A {ext} -j {external_policy_chain}"));
            }
        }

        // Load balancing over the endpoints of each policy chain in use (the local one
        // only exists with Local policy and local endpoints).
        for (chain, eps) in [(&chains.svc, &cat.cluster), (&chains.svl, &cat.local)] {
            if eps.is_empty() {
                continue;
            }
            nat.chain(chain);
            for (i, ep) in eps.iter().enumerate() {
                let mut line = format!(
                    "-A {chain} {}",
                    comment(&format!("{name} -> {}", join_host_port(ep.addr)))
                );
                let left = eps.len() - i;
                if left > 1 {
                    #[expect(clippy::cast_precision_loss, reason = "endpoint counts are tiny")]
                    let p = 1.0 / left as f64;
                    let _ = write!(line, " -m statistic --mode random --probability {p:.10}");
                }
                let _ = write!(line, " -j {}", ipt_endpoint_chain(svc, ep));
                nat.rule(line);
            }
        }

        // One chain per endpoint: hairpin masquerade, then DNAT.
        for ep in &cat.reachable {
            let sep = ipt_endpoint_chain(svc, ep);
            nat.chain(&sep);
            nat.rule(format!(
                "-A {sep} {} -s {} -j KUBE-MARK-MASQ",
                comment(&name),
                ep.addr.ip()
            ));
            nat.rule(format!(
                "-A {sep} {} -m {proto} -p {proto} -j DNAT --to-destination {}",
                comment(&name),
                join_host_port(ep.addr)
            ));
        }
    }

    // NodePorts on every local address; last rule of KUBE-SERVICES.
    let localhost_filter = if v6 { " ! -d ::1/128" } else { "" };
    nat.rule(format!(
        "-A KUBE-SERVICES {} -m addrtype --dst-type LOCAL{localhost_filter} -j KUBE-NODEPORTS",
        comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
    ));
    filter.rule("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP".to_owned());
    filter.rule(format!(
        "-A KUBE-FORWARD {} -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT",
        comment("kubernetes forwarding rules")
    ));
    filter.rule(format!(
        "-A KUBE-FORWARD {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("kubernetes forwarding conntrack rule")
    ));

    let mut restore = String::new();
    filter.write("filter", &mut restore);
    nat.write("nat", &mut restore);

    let jumps = IPTABLES_JUMPS
        .iter()
        .filter(|(_, target, ..)| !(v6 && *target == "KUBE-FIREWALL"))
        .map(|&(table, target, chain, text, new_only)| {
            let mut args: Vec<String> = Vec::new();
            if new_only {
                args.extend(["-m", "conntrack", "--ctstate", "NEW"].map(str::to_owned));
            }
            if !text.is_empty() {
                args.extend(["-m", "comment", "--comment", text].map(str::to_owned));
            }
            args.extend(["-j", target].map(str::to_owned));
            JumpRule {
                table,
                chain,
                target,
                args,
            }
        })
        .collect();
    IptablesRules {
        ipv6: v6,
        jumps,
        restore,
    }
}

// ------------------------------------------------------------------------------------
// nftables mode

/// Chain names of one Service port in nftables mode: `<kind>-` + 8 characters of
/// `base32(sha256(base))` + `-` + `base`, with `base` = `ns/name/proto/port`.
fn nft_chain_base(svc: &ServicePort) -> String {
    let base = format!(
        "{}/{}/{}/{}",
        svc.namespace,
        svc.name,
        svc.protocol.name(),
        svc.port_name
    );
    format!("{}-{base}", hash_prefix(&base, 8))
}

/// `endpoint-` chain of `ep`: the base is `ns/name/proto/port__ip/port` (IPv6 colons
/// turned into dots).
fn nft_endpoint_chain(svc: &ServicePort, ep: &Endpoint) -> String {
    let base = format!(
        "{}/{}/{}/{}__{}/{}",
        svc.namespace,
        svc.name,
        svc.protocol.name(),
        svc.port_name,
        ep.addr.ip().to_string().replace(':', "."),
        ep.addr.port()
    );
    format!("endpoint-{}-{base}", hash_prefix(&base, 8))
}

/// `numgen random mod N vmap { 0 : goto a , 1 : goto b }`.
fn nft_balance(chains: &[String]) -> String {
    let arms: Vec<String> = chains
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{i} : goto {c}"))
        .collect();
    format!(
        "numgen random mod {} vmap {{ {} }}",
        chains.len(),
        arms.join(" , ")
    )
}

/// kube-proxy's nftables-mode transaction (`nft -f` input) for `services` on `node`: its
/// own `table ip kube-proxy` (or `ip6`), base chains at the `dstnat`/`srcnat`/`filter`
/// priorities, the `services` dispatch through the `service-ips` and
/// `service-nodeports` verdict maps, service/external/local/endpoint chains and the
/// `mark-for-masquerade` / `masquerading` pair.
#[must_use]
pub fn nftables(node: &ProxyNode, services: &[ServicePort]) -> String {
    let v6 = node.v6();
    let (fam, ip, addr_type, no_localhost) = if v6 {
        ("ip6", "ip6", "ipv6_addr", "ip6 daddr != ::1")
    } else {
        ("ip", "ip", "ipv4_addr", "ip daddr != 127.0.0.0/8")
    };
    let t = format!("{fam} kube-proxy");
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };

    line(format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    line(format!(
        "add set {t} cluster-ips {{ type {addr_type} ; comment \"Active ClusterIPs\" ; }}"
    ));
    line(format!(
        "add set {t} nodeport-ips {{ type {addr_type} ; comment \"IPs that accept NodePort traffic\" ; }}"
    ));
    for (map, key, text) in [
        (
            "firewall-ips",
            format!("{addr_type} . inet_proto . inet_service"),
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            "no-endpoint-nodeports",
            "inet_proto . inet_service".to_owned(),
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            "no-endpoint-services",
            format!("{addr_type} . inet_proto . inet_service"),
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            "service-ips",
            format!("{addr_type} . inet_proto . inet_service"),
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            "service-nodeports",
            "inet_proto . inet_service".to_owned(),
            "NodePort traffic",
        ),
    ] {
        line(format!(
            "add map {t} {map} {{ type {key} : verdict ; comment \"{text}\" ; }}"
        ));
    }
    // Named priorities where nft accepts them (`dstnat` only exists for prerouting, `srcnat`
    // for postrouting); the output hook gets the same values as numbers (dstnat = -100).
    for (chain, spec) in [
        ("cluster-ips-check", ""),
        (
            "filter-prerouting-pre-dnat",
            "type filter hook prerouting priority dstnat - 10",
        ),
        (
            "filter-output-pre-dnat",
            "type filter hook output priority -110",
        ),
        ("filter-forward", "type filter hook forward priority filter"),
        ("filter-input", "type filter hook input priority filter"),
        ("filter-output", "type filter hook output priority filter"),
        ("firewall-check", ""),
        ("mark-for-masquerade", ""),
        ("masquerading", ""),
        ("nat-output", "type nat hook output priority -100"),
        (
            "nat-postrouting",
            "type nat hook postrouting priority srcnat",
        ),
        ("nat-prerouting", "type nat hook prerouting priority dstnat"),
        ("nodeport-endpoints-check", ""),
        (
            "reject-chain",
            "comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"",
        ),
        ("services", ""),
        ("service-endpoints-check", ""),
    ] {
        if spec.is_empty() {
            line(format!("add chain {t} {chain}"));
        } else {
            line(format!("add chain {t} {chain} {{ {spec} ; }}"));
        }
    }
    let svc_cidr = &node.service_cidr;
    for rule in [
        format!("cluster-ips-check {ip} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
        format!("cluster-ips-check {ip} daddr {{ {svc_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\""),
        "filter-prerouting-pre-dnat ct state new jump firewall-check".to_owned(),
        "filter-forward ct state new jump service-endpoints-check".to_owned(),
        "filter-forward ct state new jump cluster-ips-check".to_owned(),
        "filter-input ct state new jump nodeport-endpoints-check".to_owned(),
        "filter-input ct state new jump service-endpoints-check".to_owned(),
        "filter-output ct state new jump service-endpoints-check".to_owned(),
        "filter-output-pre-dnat ct state new jump firewall-check".to_owned(),
        "filter-output ct state new jump cluster-ips-check".to_owned(),
        format!("firewall-check {ip} daddr . meta l4proto . th dport vmap @firewall-ips"),
        format!("mark-for-masquerade mark set mark or {MASQ_MARK}"),
        format!("masquerading mark and {MASQ_MARK} == 0 return"),
        format!("masquerading mark set mark xor {MASQ_MARK}"),
        "masquerading masquerade fully-random".to_owned(),
        "nat-output jump services".to_owned(),
        "nat-postrouting jump masquerading".to_owned(),
        "nat-prerouting jump services".to_owned(),
        if node.node_ips.is_empty() {
            format!("nodeport-endpoints-check {no_localhost} meta l4proto . th dport vmap @no-endpoint-nodeports")
        } else {
            format!("nodeport-endpoints-check {ip} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports")
        },
        "reject-chain reject".to_owned(),
        format!("services {ip} daddr . meta l4proto . th dport vmap @service-ips"),
        if node.node_ips.is_empty() {
            format!("services fib daddr type local {no_localhost} meta l4proto . th dport vmap @service-nodeports")
        } else {
            format!("services {ip} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
        },
        format!("service-endpoints-check {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services"),
    ] {
        line(format!("add rule {t} {rule}"));
    }
    let node_ips: Vec<String> = node
        .node_ips
        .iter()
        .filter(|a| a.is_ipv6() == v6 && !a.is_loopback())
        .map(ToString::to_string)
        .collect();
    if !node_ips.is_empty() {
        line(format!(
            "add element {t} nodeport-ips {{ {} }}",
            node_ips.join(", ")
        ));
    }

    let cluster = &node.cluster_cidr;
    for svc in services.iter().filter(|s| s.v6() == v6) {
        let cat = categorize(node, svc);
        let name = svc.port_name_string();
        let proto = svc.protocol.name();
        let base = nft_chain_base(svc);
        let (service, local, external) = (
            format!("service-{base}"),
            format!("local-{base}"),
            format!("external-{base}"),
        );
        let cip = svc.cluster_ip;
        line(format!("# {name}"));
        line(format!("add element {t} cluster-ips {{ {cip} }}"));
        if !cat.has_endpoints {
            line(format!(
                "add element {t} no-endpoint-services {{ {cip} . {proto} . {} comment \"{name}\" : goto reject-chain }}",
                svc.port
            ));
            for (ip, _) in svc.external_addresses() {
                line(format!(
                    "add element {t} no-endpoint-services {{ {ip} . {proto} . {} comment \"{name}\" : goto reject-chain }}",
                    svc.port
                ));
            }
            if let Some(np) = svc.node_port {
                line(format!(
                    "add element {t} no-endpoint-nodeports {{ {proto} . {np} comment \"{name}\" : goto reject-chain }}"
                ));
            }
            continue;
        }

        // Chains first: rules and map elements may only name existing chains.
        let endpoint_chains: Vec<(String, &Endpoint)> = cat
            .reachable
            .iter()
            .map(|ep| (nft_endpoint_chain(svc, ep), *ep))
            .collect();
        for (c, _) in &endpoint_chains {
            line(format!("add chain {t} {c}"));
        }
        line(format!("add chain {t} {service}"));
        if !cat.local.is_empty() {
            line(format!("add chain {t} {local}"));
        }
        if svc.externally_accessible() {
            line(format!("add chain {t} {external}"));
        }

        line(format!(
            "add rule {t} {service} {ip} daddr {cip} {ip} saddr != {cluster} jump mark-for-masquerade"
        ));
        let chain_of = |ep: &Endpoint| nft_endpoint_chain(svc, ep);
        let cluster_chains: Vec<String> = cat.cluster.iter().map(|e| chain_of(e)).collect();
        line(format!(
            "add rule {t} {service} {}",
            nft_balance(&cluster_chains)
        ));
        if !cat.local.is_empty() {
            let local_chains: Vec<String> = cat.local.iter().map(|e| chain_of(e)).collect();
            line(format!(
                "add rule {t} {local} {}",
                nft_balance(&local_chains)
            ));
        }
        if svc.externally_accessible() {
            if svc.external_policy_local() {
                line(format!(
                    "add rule {t} {external} {ip} saddr {cluster} goto {service} comment \"short-circuit pod traffic\""
                ));
                line(format!(
                    "add rule {t} {external} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\""
                ));
                line(format!(
                    "add rule {t} {external} fib saddr type local goto {service} comment \"short-circuit local traffic\""
                ));
                if cat.has_external_endpoints {
                    line(format!("add rule {t} {external} goto {local}"));
                }
            } else {
                line(format!("add rule {t} {external} jump mark-for-masquerade"));
                line(format!("add rule {t} {external} goto {service}"));
            }
        }
        for (c, ep) in &endpoint_chains {
            line(format!(
                "add rule {t} {c} {ip} saddr {} jump mark-for-masquerade",
                ep.addr.ip()
            ));
            line(format!(
                "add rule {t} {c} meta l4proto {proto} dnat to {}",
                join_host_port(ep.addr)
            ));
        }

        line(format!(
            "add element {t} service-ips {{ {cip} . {proto} . {} : goto {service} }}",
            svc.port
        ));
        for (ip, _) in svc.external_addresses() {
            line(format!(
                "add element {t} service-ips {{ {ip} . {proto} . {} : goto {external} }}",
                svc.port
            ));
            if !cat.has_external_endpoints {
                line(format!(
                    "add element {t} no-endpoint-services {{ {ip} . {proto} . {} comment \"{name}\" : drop }}",
                    svc.port
                ));
            }
        }
        if let Some(np) = svc.node_port {
            line(format!(
                "add element {t} service-nodeports {{ {proto} . {np} : goto {external} }}"
            ));
            if !cat.has_external_endpoints {
                line(format!(
                    "add element {t} no-endpoint-nodeports {{ {proto} . {np} comment \"{name}\" : drop }}"
                ));
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------
// IPVS mode

/// The IPVS-mode state of one family: what kube-proxy's `pkg/proxy/ipvs` proxier keeps
/// for the ClusterIPs of `services` (NodePorts, external and load-balancer addresses are
/// not rendered in this mode). Its addresses are bound to the dummy `kube-ipvs0`, each
/// Service port is an IPVS virtual server scheduling round robin over its endpoints in
/// masquerading (NAT) mode, and a few iptables rules over ipsets masquerade what needs
/// it: traffic to a ClusterIP from outside the cluster CIDR, and hairpin traffic (an
/// endpoint reaching itself, `KUBE-LOOP-BACK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsRules {
    /// Whether they are for IPv6.
    pub ipv6: bool,
    /// The Services' addresses, bound to `kube-ipvs0`.
    pub addresses: Vec<IpAddr>,
    /// `ipset restore` input: the sets and their members.
    pub ipsets: String,
    /// `ipvsadm -R` input: virtual servers and real servers.
    pub ipvs: String,
    /// Jumps from the built-in chains.
    pub jumps: Vec<JumpRule>,
    /// `iptables-restore --noflush` input: `*nat` and `*filter`.
    pub restore: String,
}

/// kube-proxy's IPVS-mode state for `services` on `node` (one family: the node's).
#[must_use]
pub fn ipvs(node: &ProxyNode, services: &[ServicePort]) -> IpvsRules {
    let v6 = node.v6();
    // The IPv6 proxier's sets carry `KUBE-6-` where the IPv4 one's carry `KUBE-`.
    let set = |name: &str| {
        if v6 {
            name.replacen("KUBE-", "KUBE-6-", 1)
        } else {
            name.to_owned()
        }
    };
    let (cluster_ip_set, loop_back_set) = (set("KUBE-CLUSTER-IP"), set("KUBE-LOOP-BACK"));
    let family = if v6 { "inet6" } else { "inet" };
    let mut ipsets = format!(
        "create {cluster_ip_set} hash:ip,port family {family} hashsize 1024 maxelem 65536\n\
         create {loop_back_set} hash:ip,port,ip family {family} hashsize 1024 maxelem 65536\n"
    );
    let mut ipvs = String::new();
    let mut addresses = Vec::new();
    for svc in services
        .iter()
        .filter(|s| s.v6() == v6 && !s.endpoints.is_empty())
    {
        let proto = svc.protocol.name();
        let flag = match svc.protocol {
            Protocol::Tcp => "-t",
            Protocol::Udp => "-u",
            Protocol::Sctp => "--sctp-service",
        };
        let vip = SocketAddr::new(svc.cluster_ip, svc.port);
        if !addresses.contains(&svc.cluster_ip) {
            addresses.push(svc.cluster_ip);
        }
        let _ = writeln!(
            ipsets,
            "add {cluster_ip_set} {},{proto}:{}",
            svc.cluster_ip, svc.port
        );
        let _ = writeln!(ipvs, "-A {flag} {vip} -s rr");
        for ep in &svc.endpoints {
            let _ = writeln!(ipvs, "-a {flag} {vip} -r {} -m -w 1", ep.addr);
            if ep.node == node.name {
                let ip = ep.addr.ip();
                let _ = writeln!(
                    ipsets,
                    "add {loop_back_set} {ip},{proto}:{},{ip}",
                    ep.addr.port()
                );
            }
        }
    }
    let mut nat = Table::default();
    let mut filter = Table::default();
    for c in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-NODE-PORT",
    ] {
        nat.chain(c);
    }
    filter.chain("KUBE-FORWARD");
    nat.rule(format!(
        "-A KUBE-POSTROUTING {} -m set --match-set {loop_back_set} dst,dst,src -j MASQUERADE",
        comment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose")
    ));
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"
    ));
    nat.rule(format!(
        "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"
    ));
    nat.rule(format!(
        "-A KUBE-POSTROUTING {} -j MASQUERADE --random-fully",
        comment("kubernetes service traffic requiring SNAT")
    ));
    nat.rule(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"));
    nat.rule(format!(
        "-A KUBE-SERVICES ! -s {} {} -m set --match-set {cluster_ip_set} dst,dst -j KUBE-MARK-MASQ",
        node.cluster_cidr,
        comment("Kubernetes service cluster ip + port for masquerade purpose")
    ));
    nat.rule("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT".to_owned());
    nat.rule(format!(
        "-A KUBE-SERVICES -m set --match-set {cluster_ip_set} dst,dst -j ACCEPT"
    ));
    filter.rule(format!(
        "-A KUBE-FORWARD {} -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT",
        comment("kubernetes forwarding rules")
    ));
    filter.rule(format!(
        "-A KUBE-FORWARD {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("kubernetes forwarding conntrack rule")
    ));
    let mut restore = String::new();
    nat.write("nat", &mut restore);
    filter.write("filter", &mut restore);
    let jump = |table, chain, target, text: &str| JumpRule {
        table,
        chain,
        target,
        args: ["-m", "comment", "--comment", text, "-j", target]
            .map(str::to_owned)
            .to_vec(),
    };
    IpvsRules {
        ipv6: v6,
        addresses,
        ipsets,
        ipvs,
        jumps: vec![
            jump(
                "nat",
                "PREROUTING",
                "KUBE-SERVICES",
                "kubernetes service portals",
            ),
            jump(
                "nat",
                "OUTPUT",
                "KUBE-SERVICES",
                "kubernetes service portals",
            ),
            jump(
                "nat",
                "POSTROUTING",
                "KUBE-POSTROUTING",
                "kubernetes postrouting rules",
            ),
            jump(
                "filter",
                "FORWARD",
                "KUBE-FORWARD",
                "kubernetes forwarding rules",
            ),
        ],
        restore,
    }
}

/// Binds `addresses` to the dummy device `kube-ipvs0` in `netns` (made first if missing),
/// as IPVS-mode kube-proxy binds every Service address. Panics if a step fails.
#[track_caller]
pub fn bind_ipvs_addresses(netns: &Path, addresses: &[IpAddr]) {
    if !exec_in(netns, &["ip", "link", "show", "kube-ipvs0"], None).success() {
        let out = exec_in(
            netns,
            &["ip", "link", "add", "kube-ipvs0", "type", "dummy"],
            None,
        );
        assert!(out.success(), "kube-ipvs0 in {}: {out}", netns.display());
    }
    for a in addresses {
        let cidr = if a.is_ipv6() {
            format!("{a}/128")
        } else {
            format!("{a}/32")
        };
        let mut argv = vec!["ip", "addr", "replace", cidr.as_str(), "dev", "kube-ipvs0"];
        if a.is_ipv6() {
            argv.push("nodad");
        }
        let out = exec_in(netns, &argv, None);
        assert!(
            out.success(),
            "{cidr} on kube-ipvs0 in {}: {out}",
            netns.display()
        );
    }
}

/// Whether the kernel of the calling process's namespace has IPVS (its `/proc/net/ip_vs`,
/// after `ipvsadm` asked for the module where modules can be loaded).
#[must_use]
pub fn ipvs_available(netns: &Path) -> bool {
    exec_in(netns, &["ipvsadm", "-L", "-n"], None).success()
}

// ------------------------------------------------------------------------------------
// Loading

/// Which of kube-proxy's backends wrote the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--proxy-mode=iptables`: chains in the `filter` and `nat` tables, jumps from the
    /// built-in chains.
    Iptables,
    /// `--proxy-mode=nftables`: its own `kube-proxy` table.
    Nftables,
    /// `--proxy-mode=ipvs`: IPVS virtual servers, ipsets and a few iptables rules (see
    /// [`ipvs`]).
    Ipvs,
}

impl Mode {
    /// `iptables` / `nftables`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Ipvs => "ipvs",
        }
    }
}

/// Bound for each rule-loading command (the bench loads the rules of 10 000 Services).
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);

#[track_caller]
fn exec_in(netns: &Path, argv: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = command(argv);
    in_netns(&mut cmd, netns);
    run_cmd(cmd, stdin, LOAD_TIMEOUT)
}

/// kube-proxy's rules of one family, rendered for one of its modes.
pub enum Rendered {
    /// The iptables mode's jump rules and `iptables-restore` input.
    Iptables(IptablesRules),
    /// The nftables mode's `nft -f` input.
    Nftables(String),
    /// The IPVS mode's state.
    Ipvs(IpvsRules),
}

/// The rules kube-proxy in `mode` on `node` writes for `services`.
#[must_use]
pub fn render(mode: Mode, node: &ProxyNode, services: &[ServicePort]) -> Rendered {
    match mode {
        Mode::Iptables => Rendered::Iptables(iptables(node, services)),
        Mode::Nftables => Rendered::Nftables(nftables(node, services)),
        Mode::Ipvs => Rendered::Ipvs(ipvs(node, services)),
    }
}

/// Does in the network namespace at `netns` what kube-proxy in `mode` does at start-up
/// and on its first sync for `services`: see [`load`].
#[track_caller]
pub fn install(netns: &Path, mode: Mode, node: &ProxyNode, services: &[ServicePort]) {
    load(netns, &render(mode, node, services));
}

/// The iptables of the iptables mode: the system's (`iptables`, here its nf_tables
/// backend) or the legacy one (`iptables-legacy`), which kube-proxy uses on nodes that do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Iptables {
    System,
    Legacy,
}

/// Loads `rules` into the network namespace at `netns` as kube-proxy's sync does: sets
/// the sysctl it needs (`net.ipv4.conf.all.route_localnet=1` in iptables mode, for
/// localhost NodePorts), then ensures its jump rules (`iptables -N`, `-C`, `-I`) and
/// loads its tables with `iptables-restore --noflush --counters`, or loads its table with
/// `nft -f`. Panics with the tool's output if anything fails.
#[track_caller]
pub fn load(netns: &Path, rules: &Rendered) {
    load_with(netns, rules, Iptables::System);
}

/// [`load`] with the iptables `iptables`.
#[track_caller]
pub fn load_with(netns: &Path, rules: &Rendered, iptables: Iptables) {
    match rules {
        Rendered::Iptables(rules) => {
            let (tool, restore) = match (rules.ipv6, iptables) {
                (true, Iptables::System) => ("ip6tables", "ip6tables-restore"),
                (true, Iptables::Legacy) => ("ip6tables-legacy", "ip6tables-legacy-restore"),
                (false, Iptables::System) => ("iptables", "iptables-restore"),
                (false, Iptables::Legacy) => ("iptables-legacy", "iptables-legacy-restore"),
            };
            if !rules.ipv6 {
                crate::inspect::set_sysctl(netns, "net.ipv4.conf.all.route_localnet", "1");
            }
            for j in &rules.jumps {
                // EnsureChain: "already exists" is fine.
                let _ = exec_in(netns, &[tool, "-w", "-t", j.table, "-N", j.target], None);
                let mut check = vec![tool, "-w", "-t", j.table, "-C", j.chain];
                check.extend(j.args.iter().map(String::as_str));
                if !exec_in(netns, &check, None).success() {
                    let mut insert = vec![tool, "-w", "-t", j.table, "-I", j.chain];
                    insert.extend(j.args.iter().map(String::as_str));
                    exec_in(netns, &insert, None).ok();
                }
            }
            let out = exec_in(
                netns,
                &[restore, "-w", "--noflush", "--counters"],
                Some(rules.restore.as_bytes()),
            );
            assert!(
                out.success(),
                "{restore} of kube-proxy's rules failed in {}: {out}\n--- input ---\n{}",
                netns.display(),
                head(&rules.restore)
            );
        }
        Rendered::Nftables(input) => {
            let out = exec_in(netns, &["nft", "-f", "-"], Some(input.as_bytes()));
            assert!(
                out.success(),
                "nft -f of kube-proxy's table failed in {}: {out}\n--- input ---\n{}",
                netns.display(),
                head(input)
            );
        }
        Rendered::Ipvs(rules) => load_ipvs(netns, rules, iptables),
    }
}

/// Loads IPVS-mode state as kube-proxy's sync does: the sysctls it sets (conntrack of
/// IPVS connections, needed for its masquerade; ARP for the addresses of the dummy
/// device answered only on it), `kube-ipvs0` with the Services' addresses, the ipsets,
/// the iptables rules and the virtual servers. Panics with the tool's output if any step
/// fails.
#[track_caller]
fn load_ipvs(netns: &Path, rules: &IpvsRules, iptables: Iptables) {
    let run = |argv: &[&str], stdin: Option<&[u8]>, what: &str| {
        let out = exec_in(netns, argv, stdin);
        assert!(out.success(), "{what} in {}: {out}", netns.display());
    };
    // `ipvsadm` asks the kernel for the module first; the sysctls exist only then.
    run(&["ipvsadm", "-L", "-n"], None, "IPVS");
    for (key, value) in [
        ("net.ipv4.vs.conntrack", "1"),
        ("net.ipv4.vs.conn_reuse_mode", "0"),
        ("net.ipv4.vs.expire_nodest_conn", "1"),
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
    ] {
        crate::inspect::set_sysctl(netns, key, value);
    }
    bind_ipvs_addresses(netns, &rules.addresses);
    run(
        &["ipset", "restore", "-exist"],
        Some(rules.ipsets.as_bytes()),
        "ipset restore",
    );
    let (tool, restore) = match (rules.ipv6, iptables) {
        (true, Iptables::System) => ("ip6tables", "ip6tables-restore"),
        (true, Iptables::Legacy) => ("ip6tables-legacy", "ip6tables-legacy-restore"),
        (false, Iptables::System) => ("iptables", "iptables-restore"),
        (false, Iptables::Legacy) => ("iptables-legacy", "iptables-legacy-restore"),
    };
    for j in &rules.jumps {
        let _ = exec_in(netns, &[tool, "-w", "-t", j.table, "-N", j.target], None);
        let mut check = vec![tool, "-w", "-t", j.table, "-C", j.chain];
        check.extend(j.args.iter().map(String::as_str));
        if !exec_in(netns, &check, None).success() {
            let mut insert = vec![tool, "-w", "-t", j.table, "-I", j.chain];
            insert.extend(j.args.iter().map(String::as_str));
            exec_in(netns, &insert, None).ok();
        }
    }
    run(
        &[restore, "-w", "--noflush", "--counters"],
        Some(rules.restore.as_bytes()),
        "iptables-restore of kube-proxy's IPVS-mode rules",
    );
    // `ipvsadm -R`, not `ipvsadm-restore`, which clears the other family's servers first.
    run(
        &["ipvsadm", "-R"],
        Some(rules.ipvs.as_bytes()),
        "ipvsadm -R",
    );
}

/// The first 200 lines of `input`, for a message.
fn head(input: &str) -> String {
    input.lines().take(200).collect::<Vec<_>>().join("\n")
}

/// The first `n` characters of base32(SHA-256(`name`)) (RFC 4648 alphabet, as Go's
/// `base32.StdEncoding`): kube-proxy's chain-name hash.
fn hash_prefix(name: &str, n: usize) -> String {
    use sha2::Digest as _;
    data_encoding::BASE32_NOPAD
        .encode(&sha2::Sha256::digest(name.as_bytes()))
        .chars()
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    //! The expected lines below are those of kube-proxy's own tests
    //! (`TestOverallIPTablesRules`, `TestOverallNFTablesRules`, same Services, same
    //! addresses): our renderer must produce kube-proxy's chain names and rules.

    use super::{iptables, nftables, Protocol, ProxyNode, ServicePort, TrafficPolicy};

    fn node() -> ProxyNode {
        ProxyNode::new("test-node", &["192.168.0.2"], "10.0.0.0/8", "172.30.0.0/16")
    }

    /// kube-proxy's test Services svc1 (ClusterIP), svc2 (NodePort, external IP and
    /// load-balancer address, Local policy, endpoint on another node), svc3 (NodePort,
    /// Cluster policy) and svc4 (two endpoints).
    fn services() -> Vec<ServicePort> {
        vec![
            ServicePort::new("ns1/svc1", "p80", Protocol::Tcp, "172.30.0.41", 80)
                .endpoint("10.180.0.1:80", "other"),
            ServicePort::new("ns2/svc2", "p80", Protocol::Tcp, "172.30.0.42", 80)
                .endpoint("10.180.0.2:80", "other")
                .node_port(3001, TrafficPolicy::Local)
                .external_ip("192.168.99.22", TrafficPolicy::Local)
                .load_balancer_ip("1.2.3.4", TrafficPolicy::Local),
            ServicePort::new("ns3/svc3", "p80", Protocol::Tcp, "172.30.0.43", 80)
                .endpoint("10.180.0.3:80", "other")
                .node_port(3003, TrafficPolicy::Cluster),
            ServicePort::new("ns4/svc4", "p80", Protocol::Tcp, "172.30.0.44", 80)
                .endpoint("10.180.0.4:80", "other")
                .endpoint("10.180.0.5:80", "test-node"),
        ]
    }

    #[track_caller]
    fn assert_lines(rendered: &str, expected: &str) {
        let have: Vec<&str> = rendered.lines().map(str::trim).collect();
        for want in expected.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(
                have.contains(&want),
                "missing kube-proxy line:\n{want}\nin:\n{rendered}"
            );
        }
    }

    #[test]
    fn iptables_rules_match_kube_proxy_s_layout() {
        let rules = iptables(&node(), &services());
        assert_lines(
            &rules.restore,
            r#"
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP
            -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
            -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
            -A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK
            -A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
            -A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
            -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
            -A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
            -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
            -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
            -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
            -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
            -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
            -A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
            -A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
            -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
            "#,
        );
        // svc2's endpoint is on another node: no KUBE-SVL chain, and the EXT chain has
        // no fall-through to a policy chain.
        assert!(!rules.restore.contains("KUBE-SVL-"), "{}", rules.restore);
        assert!(
            !rules.restore.contains("-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j "),
            "{}",
            rules.restore
        );
        let jumps: Vec<String> = rules
            .jumps
            .iter()
            .map(|j| format!("{} {} {}", j.table, j.chain, j.args.join(" ")))
            .collect();
        for want in [
            "nat PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "nat OUTPUT -m comment --comment kubernetes service portals -j KUBE-SERVICES",
            "nat POSTROUTING -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING",
            "filter FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD",
            "filter FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        ] {
            assert!(jumps.iter().any(|j| j == want), "no jump {want:?}: {jumps:#?}");
        }
    }

    #[test]
    fn local_endpoints_get_a_local_policy_chain() {
        let svc = ServicePort::new("ns2/svc2", "p80", Protocol::Tcp, "172.30.0.42", 80)
            .endpoint("10.180.0.2:80", "test-node")
            .endpoint("10.180.0.9:80", "other")
            .node_port(3001, TrafficPolicy::Local);
        let rules = iptables(&node(), std::slice::from_ref(&svc));
        assert_lines(
            &rules.restore,
            r#"
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT
            -A KUBE-SVL-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
            "#,
        );
        assert!(
            !rules.restore.contains("has no local endpoints"),
            "{}",
            rules.restore
        );
        let nft = nftables(&node(), &[svc]);
        assert_lines(
            &nft,
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
             add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }",
        );
    }

    #[test]
    fn nftables_rules_match_kube_proxy_s_layout() {
        let nft = nftables(&node(), &services());
        assert_lines(
            &nft,
            r#"
            add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
            add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
            add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
            add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
            add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
            add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
            add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
            add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
            add rule ip kube-proxy masquerading mark set mark xor 0x4000
            add rule ip kube-proxy masquerading masquerade fully-random
            add rule ip kube-proxy nat-output jump services
            add rule ip kube-proxy nat-postrouting jump masquerading
            add rule ip kube-proxy nat-prerouting jump services
            add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
            add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
            add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
            add element ip kube-proxy nodeport-ips { 192.168.0.2 }
            add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
            add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
            add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
            add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
            add element ip kube-proxy cluster-ips { 172.30.0.41 }
            add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
            add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
            add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
            add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
            add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
            add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
            add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
            add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
            add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
            add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
            add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
            add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
            add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
            "#,
        );
    }

    #[test]
    fn ipv6_rules_use_the_ipv6_forms() {
        let node = ProxyNode::new(
            "test-node",
            &["2001:db8::1"],
            "fd00:10::/64",
            "fd00:10:96::/112",
        );
        let svc = ServicePort::new("ns1/svc1", "p80", Protocol::Udp, "fd00:10:96::10", 53)
            .endpoint("[fd00:10::2]:5353", "test-node")
            .node_port(3001, TrafficPolicy::Cluster);
        // An IPv4 Service is not this family's business.
        let v4 = ServicePort::new("ns1/svc4", "p80", Protocol::Tcp, "172.30.0.41", 80)
            .endpoint("10.180.0.1:80", "test-node");
        let rules = iptables(&node, &[svc.clone(), v4.clone()]);
        assert!(rules.ipv6);
        assert!(!rules.restore.contains("172.30.0.41"), "{}", rules.restore);
        assert!(
            !rules.restore.contains("KUBE-FIREWALL"),
            "{}",
            rules.restore
        );
        assert_lines(
            &rules.restore,
            r#"
            -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS
            "#,
        );
        assert!(
            rules
                .restore
                .lines()
                .any(|l| l.ends_with("-m udp -p udp -j DNAT --to-destination [fd00:10::2]:5353")),
            "{}",
            rules.restore
        );
        let nft = nftables(&node, &[svc, v4]);
        assert!(!nft.contains("172.30.0.41"), "{nft}");
        assert!(nft.contains("add table ip6 kube-proxy"), "{nft}");
        assert!(
            nft.contains("add element ip6 kube-proxy nodeport-ips { 2001:db8::1 }"),
            "{nft}"
        );
        assert!(
            nft.contains("/udp/p80__fd00.10..2/5353 meta l4proto udp dnat to [fd00:10::2]:5353"),
            "{nft}"
        );
        assert!(
            nft.contains(
                "ip6 daddr fd00:10:96::10 ip6 saddr != fd00:10::/64 jump mark-for-masquerade"
            ),
            "{nft}"
        );
    }

    #[test]
    fn services_without_endpoints_are_rejected() {
        let svc = ServicePort::new("ns6/svc6", "p80", Protocol::Tcp, "172.30.0.46", 80);
        let rules = iptables(&node(), std::slice::from_ref(&svc));
        assert_lines(
            &rules.restore,
            r#"-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT"#,
        );
        assert_lines(
            &nftables(&node(), &[svc]),
            r#"add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }"#,
        );
    }
}
