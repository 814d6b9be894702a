//! A [`Snapshot`] as metric families: every metric the agent's metrics serves is defined
//! here (and listed in docs/operations.md, "Metrics"). `prometheus-client` writes them in
//! the Prometheus text format (0.0.4): [`Exporter`] is its [`Collector`], reading the maps
//! anew for every scrape, so the registry holds no metric state of its own.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::collect::{AgentSnapshot, Exporter, NetworkSnapshot, PolicySnapshot, Snapshot};

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// An integer (counters, counts, bytes).
    Int(u64),
    /// A float (durations).
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Self::Int(u64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

/// One sample: label pairs (in output order) and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// `(name, value)` pairs; names are static identifiers, values anything.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Value,
}

/// A metric family: name, help, type and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Metric name as served (`cni_ebpf_…`; a counter's ends in `_total`).
    pub name: &'static str,
    /// One-line description.
    pub help: &'static str,
    /// [`MetricType::Counter`] or [`MetricType::Gauge`].
    pub kind: MetricType,
    /// Samples, in output order.
    pub samples: Vec<Sample>,
}

impl Family {
    /// An empty counter family.
    #[must_use]
    pub const fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Counter,
            samples: Vec::new(),
        }
    }

    /// An empty gauge family.
    #[must_use]
    pub const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Gauge,
            samples: Vec::new(),
        }
    }

    /// Adds a sample.
    pub fn push(&mut self, labels: &[(&'static str, &str)], value: impl Into<Value>) {
        self.samples.push(Sample {
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            value: value.into(),
        });
    }

    /// Writes the family through `encoder`; a family without samples is left out entirely
    /// (a series that is gone leaves no trace).
    fn encode(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        if self.samples.is_empty() {
            return Ok(());
        }
        // The encoder appends `_total` to a counter's name itself.
        let name = match self.kind {
            MetricType::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            _ => self.name,
        };
        let mut family = encoder.encode_descriptor(name, self.help, None, self.kind)?;
        for s in &self.samples {
            let sample = family.encode_family(&s.labels)?;
            match (self.kind, s.value) {
                (MetricType::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                (MetricType::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                (_, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                (_, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
            }
        }
        Ok(())
    }
}

/// Every scrape reads the maps and writes what it read.
impl Collector for Exporter {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        families(&self.scrape())
            .iter()
            .try_for_each(|f| f.encode(&mut encoder))
    }
}

/// A registry of `collector` alone.
#[must_use]
pub fn registry(collector: impl Collector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    registry
}

/// What `registry` reports, in the Prometheus text format (0.0.4).
///
/// # Errors
/// A value the format cannot hold.
pub fn text(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

/// Every family of the snapshot, in output order (families without samples included;
/// the encoding leaves them out).
#[must_use]
pub fn families(s: &Snapshot) -> Vec<Family> {
    let mut out = Vec::new();

    let mut f = Family::gauge(
        "cni_ebpf_build_info",
        "Always 1: the version of the cni-ebpf binary serving these metrics.",
    );
    f.push(&[("version", env!("CARGO_PKG_VERSION"))], 1_u64);
    out.push(f);
    let mut f = Family::gauge(
        "cni_ebpf_scrape_duration_seconds",
        "How long reading the pinned maps took for this scrape.",
    );
    f.push(&[], s.duration.as_secs_f64());
    out.push(f);
    let mut f = Family::counter(
        "cni_ebpf_discovery_errors_total",
        "Scrapes that could not list the networks below the bpffs root (see the log).",
    );
    if let Some(n) = s.discovery_errors_total {
        f.push(&[], n);
    }
    out.push(f);

    out.extend(network_families(&s.networks));
    if let Some(p) = &s.policy {
        out.extend(policy_families(p));
    }
    if let Some(a) = &s.agent {
        out.extend(agent_families(a));
    }
    if let Some(peers) = &s.wireguard {
        out.extend(wireguard_families(peers));
    }
    if let Some(t) = &s.flows {
        out.extend(crate::agent::flows::metrics::families(t));
    }
    out
}

/// The node's WireGuard peers, one sample each, labelled with the peer's node (one
/// series per other node of the cluster). What strict mode drops for nodes without a
/// key is `cni_ebpf_reason_packets_total{reason="drop_no_wireguard_key"}`.
fn wireguard_families(peers: &[crate::agent::wireguard::PeerReport]) -> Vec<Family> {
    let mut count = Family::gauge(
        "cni_ebpf_wireguard_peers",
        "Other nodes that are peers of this node's WireGuard device (published a key).",
    );
    count.push(&[], u64::try_from(peers.len()).unwrap_or(u64::MAX));
    let mut handshake = Family::gauge(
        "cni_ebpf_wireguard_peer_last_handshake_seconds",
        "Unix time of the last completed handshake with a peer node (0: none yet).",
    );
    let mut rx = Family::counter(
        "cni_ebpf_wireguard_peer_received_bytes_total",
        "Bytes received from a peer node through WireGuard.",
    );
    let mut tx = Family::counter(
        "cni_ebpf_wireguard_peer_sent_bytes_total",
        "Bytes sent to a peer node through WireGuard.",
    );
    for p in peers {
        let labels = [("node", p.node.as_str())];
        handshake.push(&labels, p.last_handshake.unwrap_or(0));
        rx.push(&labels, p.rx_bytes);
        tx.push(&labels, p.tx_bytes);
    }
    vec![count, handshake, rx, tx]
}

/// The agent's own state: its probes, its settings against the conflists, and its traffic
/// with the API server.
fn agent_families(a: &AgentSnapshot) -> Vec<Family> {
    let mut ready = Family::gauge(
        "cni_ebpf_agent_ready",
        "1 while /ready answers 200: every job's first round made, every datapath loaded, \
         policy in force, the conflists in agreement.",
    );
    ready.push(&[], a.ready);
    let mut alive = Family::gauge(
        "cni_ebpf_agent_alive",
        "1 while /healthz answers 200: every job's loop and watchers at work.",
    );
    alive.push(&[], a.alive);
    let mut conflists = Family::gauge(
        "cni_ebpf_agent_conflist_disagreements",
        "Settings of the node's cni-ebpf conflists (bpffsRoot, dataDir, networkPolicy) that \
         disagree with the agent's: each leaves a network unserved (/ready names them).",
    );
    conflists.push(&[], a.conflist_disagreements);
    let mut requests = Family::counter(
        "cni_ebpf_agent_api_requests_total",
        "Requests to the API server per resource (list pages, watches started or resumed, \
         gets, Events).",
    );
    let mut failures = Family::counter(
        "cni_ebpf_agent_api_failures_total",
        "Requests to the API server that failed before an answer or were answered with an \
         error status (403, 429, 5xx), and answers cut off (an error, or silent beyond \
         --watch-timeout), per resource.",
    );
    let mut bytes = Family::counter(
        "cni_ebpf_agent_api_received_bytes_total",
        "Bytes of answer bodies received from the API server, per resource.",
    );
    for (resource, (r, f, b)) in &a.api {
        requests.push(&[("resource", resource)], *r);
        failures.push(&[("resource", resource)], *f);
        bytes.push(&[("resource", resource)], *b);
    }
    vec![ready, alive, conflists, requests, failures, bytes]
}

/// The agent's NetworkPolicy totals.
fn policy_families(p: &PolicySnapshot) -> Vec<Family> {
    let mut verdicts = Family::counter(
        "cni_ebpf_policy_verdicts_total",
        "NetworkPolicy verdicts at the pods a policy selects, per direction: flows admitted \
         (counted on their first packet) and packets denied. A pod's policies are a union, \
         so each of them is credited with every verdict at that pod.",
    );
    for ((network, ns, name, dir, verdict), n) in &p.verdicts {
        verdicts.push(
            &[
                ("network", network),
                ("namespace", ns),
                ("policy", name),
                ("direction", dir),
                ("verdict", verdict),
            ],
            *n,
        );
    }
    let mut closed = Family::gauge(
        "cni_ebpf_policy_closed_pods",
        "Pod interfaces closed to all traffic but their node's because a policy that \
         selects them cannot be held (an Event on each pod says why).",
    );
    for (network, n) in &p.closed_pods {
        closed.push(&[("network", network)], *n);
    }
    let mut generation = Family::gauge(
        "cni_ebpf_policy_generation",
        "The NetworkPolicy generation in force (bumped on every change the agent swaps in).",
    );
    for (network, g) in &p.generation {
        generation.push(&[("network", network)], *g);
    }
    let mut cluster = Family::counter(
        "cni_ebpf_cluster_policy_verdicts_total",
        "ClusterNetworkPolicy verdicts, credited to the rule that decided (the first          matching rule of the tier that accepted or denied; consecutive rules of one          action with the same ports are credited together), per direction: flows          admitted (counted on their first packet) and packets denied.",
    );
    for (k, n) in &p.cluster_verdicts {
        cluster.push(
            &[
                ("network", &k.network),
                ("policy", &k.policy),
                ("rule", &k.rule),
                ("tier", &k.tier),
                ("action", &k.action),
                ("direction", k.direction),
                ("verdict", k.verdict),
            ],
            *n,
        );
    }
    vec![verdicts, cluster, closed, generation]
}

/// One family with one sample per network, labelled `network`.
fn per_network<V: Into<Value>>(
    nets: &[NetworkSnapshot],
    family: Family,
    value: impl Fn(&NetworkSnapshot) -> Option<V>,
) -> Family {
    let mut f = family;
    for n in nets {
        if let Some(v) = value(n) {
            f.push(&[("network", &n.name)], v);
        }
    }
    f
}

/// Every per-network family, in the order of the sections below.
fn network_families(nets: &[NetworkSnapshot]) -> Vec<Family> {
    let mut out = network_state(nets);
    out.extend(endpoint_families(nets));
    out.push(reason_family(nets));
    out.extend(map_families(nets));
    out.extend(snat_families(nets));
    out.extend(flow_families(nets));
    out
}

/// Whether each network was read, and what it holds as a whole.
fn network_state(nets: &[NetworkSnapshot]) -> Vec<Family> {
    vec![
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_up",
                "1 when every part of the network's datapath was read in this scrape \
                 (or nothing is pinned yet), 0 when a read failed (see the log).",
            ),
            |n| Some(n.failures.is_empty()),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_datapath_loaded",
                "1 when the network's programs and maps are pinned (loaded by the first ADD \
                 or `cni-ebpf load`).",
            ),
            |n| Some(n.loaded),
        ),
        per_network(
            nets,
            Family::counter(
                "cni_ebpf_scrape_errors_total",
                "Parts of the network's datapath that could not be read, summed over the \
                 scrapes since this exporter started.",
            ),
            |n| Some(n.errors_total),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_attachments",
                "Pod attachments (container ID, ifname) holding datapath state on this \
                 node: the pods per node.",
            ),
            |n| n.attachments,
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_host_ports",
                "Host-port entries (one per host IP, port and protocol).",
            ),
            |n| n.host_ports,
        ),
    ]
}

/// Per pod interface: its counters, its egress rate and its share of the NAT table.
fn endpoint_families(nets: &[NetworkSnapshot]) -> [Family; 7] {
    let mut tx_p = Family::counter(
        "cni_ebpf_endpoint_tx_packets_total",
        "Packets sent by the pod (seen by from_pod on its host veth).",
    );
    let mut tx_b = Family::counter(
        "cni_ebpf_endpoint_tx_bytes_total",
        "Bytes sent by the pod (seen by from_pod on its host veth).",
    );
    let mut rx_p = Family::counter(
        "cni_ebpf_endpoint_rx_packets_total",
        "Packets the eBPF programs redirected into the pod (packets the node's stack \
         delivers are not counted).",
    );
    let mut rx_b = Family::counter(
        "cni_ebpf_endpoint_rx_bytes_total",
        "Bytes the eBPF programs redirected into the pod.",
    );
    let mut rate = Family::gauge(
        "cni_ebpf_endpoint_egress_rate_bytes_per_second",
        "The pod's egress rate limit (runtimeConfig.bandwidth), enforced by fq pacing or \
         by policing (mode); absent when the pod has none.",
    );
    let mut nat = Family::gauge(
        "cni_ebpf_endpoint_nat_flows",
        "Translated flows (masquerade, host port, hairpin) charged to the pod's share of \
         the NAT table; new flows are refused (drop_nat_pod_cap) at \
         cni_ebpf_endpoint_nat_flows_max.",
    );
    let mut nat_max = Family::gauge(
        "cni_ebpf_endpoint_nat_flows_max",
        "Most translated flows the pod may hold at once (natFlowsPerPod).",
    );
    for n in nets {
        for e in &n.endpoints {
            let ip = e.ip.to_string();
            let ifindex = e.host_ifindex.to_string();
            // An endpoint whose pod the store does not name (no Kubernetes pod) has
            // `namespace` and `pod` empty, which Prometheus reads as no label: every
            // series of a family keeps the same label names.
            let pod = n.pods.get(&(e.container_id.clone(), e.ifname.clone()));
            let labels = [
                ("network", n.name.as_str()),
                ("namespace", pod.map_or("", |p| p.namespace.as_str())),
                ("pod", pod.map_or("", |p| p.name.as_str())),
                ("pod_ip", ip.as_str()),
                ("container_id", e.container_id.as_str()),
                ("ifname", e.ifname.as_str()),
                ("host_ifindex", ifindex.as_str()),
            ];
            tx_p.push(&labels, e.tx_packets);
            tx_b.push(&labels, e.tx_bytes);
            rx_p.push(&labels, e.rx_packets);
            rx_b.push(&labels, e.rx_bytes);
            if let (Some(bits), Some(mode)) = (e.egress_rate_bits, e.egress_rate_mode) {
                let mut with_mode = labels.to_vec();
                with_mode.push(("mode", mode));
                rate.push(&with_mode, bits / 8);
            }
            if let (Some(used), Some(cap)) = (e.nat_flows, e.nat_flows_cap) {
                nat.push(&labels, u64::from(used));
                nat_max.push(&labels, u64::from(cap));
            }
        }
    }
    [tx_p, tx_b, rx_p, rx_b, rate, nat, nat_max]
}

/// The programs' decisions, by reason.
fn reason_family(nets: &[NetworkSnapshot]) -> Family {
    let mut reasons = Family::counter(
        "cni_ebpf_reason_packets_total",
        "Packets by the decision the eBPF programs took (reason: drop_*, pass_*, \
         redirect_*, snat_*, …; seen counts every packet a program saw).",
    );
    for n in nets {
        for r in &n.reasons {
            reasons.push(&[("network", &n.name), ("reason", r.reason)], r.count);
        }
    }
    reasons
}

/// Each pinned map's fill and memory, and the network's total.
fn map_families(nets: &[NetworkSnapshot]) -> [Family; 4] {
    let mut entries = Family::gauge(
        "cni_ebpf_map_entries",
        "Entries a pinned map holds (arrays: always their size; LRU maps evict only when \
         full).",
    );
    let mut max = Family::gauge(
        "cni_ebpf_map_max_entries",
        "Capacity of a pinned map (e.g. map=\"NAT\": the NAT table).",
    );
    let mut mem = Family::gauge(
        "cni_ebpf_map_memory_bytes",
        "Kernel memory charged for a pinned map (fdinfo memlock; hash maps and arrays are \
         preallocated, so theirs does not grow with the entries).",
    );
    for n in nets {
        for m in &n.maps {
            let labels = [("network", n.name.as_str()), ("map", m.name.as_str())];
            if let Some(e) = m.entries {
                entries.push(&labels, e);
            }
            max.push(&labels, m.max_entries);
            mem.push(&labels, m.memlock_bytes);
        }
    }
    let total = per_network(
        nets,
        Family::gauge(
            "cni_ebpf_maps_memory_bytes",
            "Kernel memory charged for all of the network's pinned maps (the sum of \
             cni_ebpf_map_memory_bytes).",
        ),
        |n| (!n.maps.is_empty()).then(|| n.maps.iter().map(|m| m.memlock_bytes).sum::<u64>()),
    );
    [entries, max, mem, total]
}

/// The SNAT port range and its use.
fn snat_families(nets: &[NetworkSnapshot]) -> [Family; 6] {
    [
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_port_range_size",
                "Ports in the SNAT (masquerade) port range.",
            ),
            |n| n.snat.as_ref().map(|s| s.range_size),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_ports_in_use",
                "Distinct ports of the SNAT range held by at least one translated flow.",
            ),
            |n| n.snat.as_ref().map(|s| s.ports_in_use),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_ports_max_per_destination",
                "The most SNAT ports held towards one destination (address, port, \
                 protocol); masquerade to it fails when this reaches the range size.",
            ),
            |n| n.snat.as_ref().map(|s| s.max_per_destination),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_ports_per_pod_destination_cap",
                "Most SNAT ports one pod may hold towards one destination \
                 (natPortsPerDestination; 0: no cap).",
            ),
            |n| n.snat.as_ref().map(|s| s.pod_destination_cap),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_ports_max_per_pod_destination",
                "The most SNAT ports one pod holds towards one destination; its new flows \
                 there are refused (drop_snat_dest_cap) when this reaches the cap.",
            ),
            |n| n.snat.as_ref().map(|s| s.max_per_pod_destination),
        ),
        per_network(
            nets,
            Family::gauge(
                "cni_ebpf_snat_flows",
                "Translated flows holding a SNAT port (one port reservation each).",
            ),
            |n| n.snat.as_ref().map(|s| s.reservations),
        ),
    ]
}

/// Pod flows by state.
fn flow_families(nets: &[NetworkSnapshot]) -> [Family; 2] {
    let mut flows = Family::gauge(
        "cni_ebpf_flows",
        "Pod flows leaving the node, by state: verified (seen leaving untranslated, fast \
         path) or pending (on the kernel path: new, or translated by netfilter).",
    );
    for n in nets {
        if let Some(f) = &n.flows {
            flows.push(&[("network", &n.name), ("state", "verified")], f.verified);
            flows.push(&[("network", &n.name), ("state", "pending")], f.pending);
        }
    }
    let inbound = per_network(
        nets,
        Family::gauge(
            "cni_ebpf_flows_inbound",
            "Tracked flows opened from outside the cluster towards a pod (never \
             masqueraded).",
        ),
        |n| n.flows.as_ref().map(|f| f.inbound),
    );
    [flows, inbound]
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use std::{collections::BTreeSet, net::Ipv4Addr, time::Duration};

    use super::*;
    use crate::datapath::{EndpointView, FlowSummary, MapStats, ReasonCount, SnatUsage};

    /// A collector of fixed families.
    #[derive(Debug)]
    struct Fixed(Vec<Family>);

    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
            self.0.iter().try_for_each(|f| f.encode(&mut encoder))
        }
    }

    fn encode(families: Vec<Family>) -> String {
        text(&registry(Fixed(families))).unwrap_or_else(|e| panic!("encoding: {e}"))
    }

    /// The snapshot as served.
    fn render(s: &Snapshot) -> String {
        encode(families(s))
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    fn valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting `__` (reserved).
    fn valid_label_name(name: &str) -> bool {
        let mut chars = name.chars();
        !name.starts_with("__")
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    #[test]
    fn families_are_written_in_the_text_format_in_order() {
        let mut c = Family::counter("x_packets_total", "Packets.");
        c.push(&[("network", "n1"), ("reason", "seen")], 7_u64);
        c.push(&[("network", "n1"), ("reason", "pass")], 0_u64);
        let mut g = Family::gauge("x_up", "Up (\"quoted\").");
        g.push(&[], true);
        let mut d = Family::gauge("x_seconds", "Duration.");
        d.push(&[], 0.25);
        let empty = Family::gauge("x_empty", "Nothing.");
        assert_eq!(
            encode(vec![c, empty, g, d]),
            "# HELP x_packets_total Packets.\n\
             # TYPE x_packets_total counter\n\
             x_packets_total{network=\"n1\",reason=\"seen\"} 7\n\
             x_packets_total{network=\"n1\",reason=\"pass\"} 0\n\
             # HELP x_up Up (\"quoted\").\n\
             # TYPE x_up gauge\n\
             x_up 1\n\
             # HELP x_seconds Duration.\n\
             # TYPE x_seconds gauge\n\
             x_seconds 0.25\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut g = Family::gauge("x", "h");
        g.push(&[("v", "a\\b\"c\nd"), ("w", "plain-ü 10.0.0.1")], 1_u64);
        assert_eq!(
            encode(vec![g]),
            "# HELP x h\n# TYPE x gauge\nx{v=\"a\\\\b\\\"c\\nd\",w=\"plain-ü 10.0.0.1\"} 1\n"
        );
    }

    fn endpoint(ip: [u8; 4], id: &str, ifindex: u32, rate: Option<u64>) -> EndpointView {
        EndpointView {
            ip: Ipv4Addr::from(ip).into(),
            host_ifindex: ifindex,
            host_mac: "02:00:00:00:00:01".into(),
            pod_mac: "02:00:00:00:00:02".into(),
            container_id: id.into(),
            ifname: "eth0".into(),
            tx_packets: 10,
            tx_bytes: 1000,
            rx_packets: 20,
            rx_bytes: 2000,
            egress_rate_bits: rate,
            egress_rate_mode: rate.map(|_| "police"),
            nat_flows: Some(3),
            nat_flows_cap: Some(8192),
            removing: false,
            interface: "veth",
        }
    }

    fn sample() -> Snapshot {
        let loaded = NetworkSnapshot {
            name: "k8s-pod-network".into(),
            loaded: true,
            wireguard: false,
            failures: Vec::new(),
            errors_total: 0,
            endpoints: vec![
                endpoint([10, 244, 1, 2], "abc", 7, None),
                endpoint([10, 244, 1, 3], "def\"x", 8, Some(20_000_000)),
            ],
            reasons: vec![
                ReasonCount {
                    reason: "seen",
                    code: 16,
                    count: 99,
                },
                ReasonCount {
                    reason: "redirect_pod",
                    code: 23,
                    count: 42,
                },
            ],
            maps: vec![
                MapStats {
                    name: "NAT".into(),
                    map_type: "lru_hash".into(),
                    key_size: 16,
                    value_size: 24,
                    max_entries: 131_072,
                    entries: Some(4),
                    memlock_bytes: 1_000_000,
                },
                MapStats {
                    name: "REASONS".into(),
                    map_type: "percpu_array".into(),
                    key_size: 4,
                    value_size: 8,
                    max_entries: 64,
                    entries: Some(64),
                    memlock_bytes: 2_000,
                },
            ],
            snat: Some(SnatUsage {
                range_size: 31_744,
                reservations: 2,
                ports_in_use: 2,
                max_per_destination: 1,
                pod_destination_cap: 15_872,
                max_per_pod_destination: 1,
            }),
            flows: Some(FlowSummary {
                verified: 3,
                pending: 1,
                inbound: 0,
                stack_sockets: 0,
                host_port_sockets: 0,
            }),
            attachments: Some(2),
            host_ports: Some(1),
            pods: [(
                ("def\"x".to_owned(), "eth0".to_owned()),
                crate::ipam::PodRef {
                    namespace: "team".into(),
                    name: "web-1".into(),
                    uid: None,
                },
            )]
            .into_iter()
            .collect(),
        };
        let broken = NetworkSnapshot {
            name: "other".into(),
            loaded: true,
            failures: vec![("maps", "map NAT: read: boom".into())],
            errors_total: 3,
            attachments: Some(0),
            ..NetworkSnapshot::default()
        };
        let absent = NetworkSnapshot {
            name: "unloaded".into(),
            ..NetworkSnapshot::default()
        };
        Snapshot {
            networks: vec![loaded, broken, absent],
            discovery_errors_total: Some(0),
            duration: Duration::from_millis(12),
            wireguard: None,
            flows: None,
            policy: Some(PolicySnapshot {
                verdicts: [(
                    (
                        "k8s-pod-network".to_owned(),
                        "x".to_owned(),
                        "deny-all".to_owned(),
                        "ingress",
                        "denied",
                    ),
                    4,
                )]
                .into(),
                cluster_verdicts: [(
                    crate::agent::report::ClusterTotalKey {
                        network: "k8s-pod-network".to_owned(),
                        policy: "no-metadata".to_owned(),
                        rule: "deny-169-254".to_owned(),
                        tier: "Admin".to_owned(),
                        action: "Deny".to_owned(),
                        direction: "egress",
                        verdict: "denied",
                    },
                    9,
                )]
                .into(),
                closed_pods: [("k8s-pod-network".to_owned(), 1)].into(),
                generation: [("k8s-pod-network".to_owned(), 12)].into(),
            }),
            agent: Some(AgentSnapshot {
                ready: false,
                alive: true,
                conflist_disagreements: 1,
                api: [("pods".to_owned(), (3, 1, 52_000))].into(),
            }),
        }
    }

    #[test]
    fn the_agents_probes_conflists_and_api_traffic() {
        let out = render(&sample());
        let l = lines(&out);
        for want in [
            "cni_ebpf_agent_ready 0",
            "cni_ebpf_agent_alive 1",
            "cni_ebpf_agent_conflist_disagreements 1",
            "cni_ebpf_agent_api_requests_total{resource=\"pods\"} 3",
            "cni_ebpf_agent_api_failures_total{resource=\"pods\"} 1",
            "cni_ebpf_agent_api_received_bytes_total{resource=\"pods\"} 52000",
        ] {
            assert!(l.contains(want), "missing {want}:\n{out}");
        }
    }

    #[test]
    fn policy_totals_carry_the_policy_and_direction() {
        let out = render(&sample());
        let l = lines(&out);
        for want in [
            "cni_ebpf_policy_verdicts_total{network=\"k8s-pod-network\",namespace=\"x\",policy=\"deny-all\",direction=\"ingress\",verdict=\"denied\"} 4",
            "cni_ebpf_policy_closed_pods{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_policy_generation{network=\"k8s-pod-network\"} 12",
            "cni_ebpf_cluster_policy_verdicts_total{network=\"k8s-pod-network\",policy=\"no-metadata\",rule=\"deny-169-254\",tier=\"Admin\",action=\"Deny\",direction=\"egress\",verdict=\"denied\"} 9",
        ] {
            assert!(l.contains(want), "missing {want}:\n{out}");
        }
    }

    fn lines(out: &str) -> BTreeSet<&str> {
        out.lines().collect()
    }

    #[test]
    fn endpoint_counters_carry_their_labels() {
        let out = render(&sample());
        let l = lines(&out);
        for want in [
            "cni_ebpf_endpoint_tx_packets_total{network=\"k8s-pod-network\",namespace=\"\",pod=\"\",pod_ip=\"10.244.1.2\",container_id=\"abc\",ifname=\"eth0\",host_ifindex=\"7\"} 10",
            "cni_ebpf_endpoint_tx_bytes_total{network=\"k8s-pod-network\",namespace=\"\",pod=\"\",pod_ip=\"10.244.1.2\",container_id=\"abc\",ifname=\"eth0\",host_ifindex=\"7\"} 1000",
            "cni_ebpf_endpoint_rx_packets_total{network=\"k8s-pod-network\",namespace=\"\",pod=\"\",pod_ip=\"10.244.1.2\",container_id=\"abc\",ifname=\"eth0\",host_ifindex=\"7\"} 20",
            "cni_ebpf_endpoint_rx_bytes_total{network=\"k8s-pod-network\",namespace=\"\",pod=\"\",pod_ip=\"10.244.1.2\",container_id=\"abc\",ifname=\"eth0\",host_ifindex=\"7\"} 2000",
            // A quote in a label value is escaped.
            "cni_ebpf_endpoint_tx_packets_total{network=\"k8s-pod-network\",namespace=\"team\",pod=\"web-1\",pod_ip=\"10.244.1.3\",container_id=\"def\\\"x\",ifname=\"eth0\",host_ifindex=\"8\"} 10",
            "cni_ebpf_endpoint_egress_rate_bytes_per_second{network=\"k8s-pod-network\",namespace=\"team\",pod=\"web-1\",pod_ip=\"10.244.1.3\",container_id=\"def\\\"x\",ifname=\"eth0\",host_ifindex=\"8\",mode=\"police\"} 2500000",
            "# TYPE cni_ebpf_endpoint_tx_packets_total counter",
            "# TYPE cni_ebpf_endpoint_egress_rate_bytes_per_second gauge",
        ] {
            assert!(l.contains(want), "missing {want}\n{out}");
        }
        // Only the paced pod has a rate.
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("cni_ebpf_endpoint_egress_rate_bytes_per_second{"))
                .count(),
            1,
            "{out}"
        );
    }

    #[test]
    fn network_gauges_reasons_maps_snat_and_flows() {
        let out = render(&sample());
        let l = lines(&out);
        for want in [
            "cni_ebpf_build_info{version=\"0.1.0\"} 1",
            "cni_ebpf_scrape_duration_seconds 0.012",
            "cni_ebpf_discovery_errors_total 0",
            "cni_ebpf_up{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_up{network=\"other\"} 0",
            "cni_ebpf_up{network=\"unloaded\"} 1",
            "cni_ebpf_datapath_loaded{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_datapath_loaded{network=\"unloaded\"} 0",
            "cni_ebpf_scrape_errors_total{network=\"other\"} 3",
            "cni_ebpf_scrape_errors_total{network=\"k8s-pod-network\"} 0",
            "cni_ebpf_attachments{network=\"k8s-pod-network\"} 2",
            "cni_ebpf_attachments{network=\"other\"} 0",
            "cni_ebpf_host_ports{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_reason_packets_total{network=\"k8s-pod-network\",reason=\"redirect_pod\"} 42",
            "cni_ebpf_reason_packets_total{network=\"k8s-pod-network\",reason=\"seen\"} 99",
            "cni_ebpf_map_entries{network=\"k8s-pod-network\",map=\"NAT\"} 4",
            "cni_ebpf_map_max_entries{network=\"k8s-pod-network\",map=\"NAT\"} 131072",
            "cni_ebpf_map_memory_bytes{network=\"k8s-pod-network\",map=\"NAT\"} 1000000",
            "cni_ebpf_map_memory_bytes{network=\"k8s-pod-network\",map=\"REASONS\"} 2000",
            "cni_ebpf_maps_memory_bytes{network=\"k8s-pod-network\"} 1002000",
            "cni_ebpf_snat_port_range_size{network=\"k8s-pod-network\"} 31744",
            "cni_ebpf_snat_ports_in_use{network=\"k8s-pod-network\"} 2",
            "cni_ebpf_snat_ports_max_per_destination{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_snat_ports_per_pod_destination_cap{network=\"k8s-pod-network\"} 15872",
            "cni_ebpf_snat_ports_max_per_pod_destination{network=\"k8s-pod-network\"} 1",
            "cni_ebpf_snat_flows{network=\"k8s-pod-network\"} 2",
            "cni_ebpf_flows{network=\"k8s-pod-network\",state=\"verified\"} 3",
            "cni_ebpf_flows{network=\"k8s-pod-network\",state=\"pending\"} 1",
            "cni_ebpf_flows_inbound{network=\"k8s-pod-network\"} 0",
        ] {
            assert!(l.contains(want), "missing {want}\n{out}");
        }
        // What a network could not read is absent, not zero.
        assert!(
            !out.contains("cni_ebpf_maps_memory_bytes{network=\"other\"}"),
            "{out}"
        );
        assert!(
            !out.contains("cni_ebpf_snat_flows{network=\"unloaded\"}"),
            "{out}"
        );
    }

    #[test]
    fn every_family_follows_the_naming_rules() {
        let fams = families(&sample());
        let mut names = BTreeSet::new();
        for f in &fams {
            assert!(names.insert(f.name), "{} defined twice", f.name);
            assert!(valid_metric_name(f.name), "{}", f.name);
            assert!(f.name.starts_with("cni_ebpf_"), "{}", f.name);
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
            match f.kind {
                MetricType::Counter => assert!(f.name.ends_with("_total"), "{}", f.name),
                MetricType::Gauge => assert!(!f.name.ends_with("_total"), "{}", f.name),
                other => panic!("{}: {other:?}", f.name),
            }
            // Every sample has the same label names, valid ones, and a distinct label set.
            let mut sets = BTreeSet::new();
            let first: Option<Vec<&str>> = f
                .samples
                .first()
                .map(|s| s.labels.iter().map(|(k, _)| *k).collect());
            for s in &f.samples {
                let keys: Vec<&str> = s.labels.iter().map(|(k, _)| *k).collect();
                if f.name != "cni_ebpf_endpoint_egress_rate_bytes_per_second" {
                    assert_eq!(Some(&keys), first.as_ref(), "{}", f.name);
                }
                for k in &keys {
                    assert!(valid_label_name(k), "{}: label {k}", f.name);
                }
                assert!(
                    sets.insert(s.labels.clone()),
                    "{}: duplicate series {:?}",
                    f.name,
                    s.labels
                );
            }
        }
        // Units as suffixes.
        for n in names
            .iter()
            .filter(|n| n.contains("bytes") || n.contains("packets"))
        {
            assert!(
                n.ends_with("_bytes")
                    || n.ends_with("_bytes_per_second")
                    || n.ends_with("_bytes_total")
                    || n.ends_with("_packets_total"),
                "{n}"
            );
        }
    }

    #[test]
    fn every_line_is_a_comment_or_a_sample_of_the_family_announced_before_it() {
        let out = render(&sample());
        let mut current = "";
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                current = rest.split(' ').next().unwrap_or_default();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next(), Some(current), "{line}");
                assert!(matches!(it.next(), Some("counter" | "gauge")), "{line}");
            } else {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                assert_eq!(name, current, "sample outside its family: {line}");
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(value.parse::<f64>().is_ok(), "bad value: {line}");
            }
        }
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn an_empty_node_still_reports_the_exporter() {
        let out = render(&Snapshot::default());
        assert!(out.contains("cni_ebpf_build_info{"), "{out}");
        assert!(!out.contains("cni_ebpf_up"), "{out}");
        assert!(
            !out.contains("cni_ebpf_discovery_errors_total"),
            "named networks: {out}"
        );
    }
}
