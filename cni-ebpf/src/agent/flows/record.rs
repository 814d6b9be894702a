//! One flow record as the agent serves it and `cni-ebpf observe` reads it (the schema in
//! docs/observability.md): a datapath event ([`cni_ebpf_common::FlowEvent`]) with its
//! addresses named, its time on the wall clock, and the policies that decided it.

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use cni_ebpf_common::{
    proto, FlowEvent, FlowLogEntry, FlowLogKey, Reason, FLOW_END_EXPIRED, FLOW_END_FIN,
    FLOW_END_RST, FLOW_EVENT_DROP, FLOW_EVENT_END, FLOW_EVENT_START, FLOW_OPENED_BY_POD, NO_CLASS,
    RULESET_CLOSED, RULESET_OPEN,
};
use serde::{Deserialize, Serialize};

use super::directory::{Directory, Identity};
use crate::{
    agent::report::NetworkState,
    datapath::observe::{flow_addr, flow_port},
};

/// One flow record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    /// When it happened, RFC 3339 in UTC with nanoseconds.
    pub time: String,
    /// The same, in nanoseconds since the Unix epoch (for ordering and windows).
    pub time_unix_nano: u64,
    /// The node whose datapath saw it.
    pub node: String,
    /// The CNI network.
    pub network: String,
    /// `start`, `end` or `drop`.
    pub kind: String,
    /// `forwarded` or `dropped`.
    pub verdict: String,
    /// A drop's reason (`drop_policy_ingress`, …), an end's (`fin`, `rst`, `expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where it was seen: `egress` (leaving the source pod), `ingress` (entering the
    /// destination pod), or `node` (the node's uplink or tunnel dropped it).
    pub direction: String,
    /// `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6`, or the protocol number.
    pub protocol: String,
    /// The side that opened the flow.
    pub source: Endpoint,
    /// The side it was opened to.
    pub destination: Endpoint,
    /// The Service the source asked for, when the node's socket hooks connected it to
    /// `destination`, one of the Service's backends, instead (the agent's kube-proxy
    /// replacement). Under kube-proxy's rules the source's egress sees the Service's
    /// address as the destination (`kind: service`) and the backend's ingress the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Endpoint>,
    /// The address the node masquerades the source to, for a pod's flow leaving the
    /// cluster (the network's `ipMasq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masqueraded_as: Option<IpAddr>,
    /// The source port it is masqueraded to (its SNAT entry's), when the agent found the
    /// entry: a start or drop read while the flow is open; not after its close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masqueraded_port: Option<u16>,
    /// The NetworkPolicy rule sets that judged its first packet, when any did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyDecision>,
    /// Packets and bytes each way and dropped, so far (a start: its first packet).
    pub counters: Counters,
    /// When its first packet was seen (RFC 3339).
    pub started: String,
    /// Seconds from its first packet to this event.
    pub duration_seconds: f64,
}

/// One side of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub ip: IpAddr,
    /// 0: none (ICMP: the echo identifier or the type and code).
    pub port: u16,
    /// `pod`, `service`, `node` or `world`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod, Service or node name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A pod's controller (`Deployment/web`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// A pod's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Default for Flow {
    fn default() -> Self {
        Self {
            time: String::new(),
            time_unix_nano: 0,
            node: String::new(),
            network: String::new(),
            kind: String::new(),
            verdict: String::new(),
            reason: None,
            direction: String::new(),
            protocol: String::new(),
            source: Endpoint::default(),
            destination: Endpoint::default(),
            service: None,
            masqueraded_as: None,
            masqueraded_port: None,
            policy: None,
            counters: Counters::default(),
            started: String::new(),
            duration_seconds: 0.0,
        }
    }
}

impl Default for Endpoint {
    fn default() -> Self {
        Self {
            ip: IpAddr::from([0, 0, 0, 0]),
            port: 0,
            kind: String::new(),
            namespace: None,
            name: None,
            workload: None,
            node: None,
        }
    }
}

impl Endpoint {
    /// `namespace/name` of a pod or Service, a node's name, or the address.
    #[must_use]
    pub fn label(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            (None, Some(n)) => n.clone(),
            _ => self.ip.to_string(),
        }
    }

    /// What the live map draws it as: a workload (`namespace/Deployment/web`), a pod
    /// without one, a Service, a node, or `world`.
    #[must_use]
    pub fn group(&self) -> String {
        match (self.kind.as_str(), &self.namespace, &self.workload) {
            ("pod", Some(ns), Some(w)) => format!("{ns}/{w}"),
            ("service", Some(ns), _) => {
                format!("{ns}/Service/{}", self.name.as_deref().unwrap_or(""))
            }
            ("world", _, _) => "world".to_owned(),
            _ => self.label(),
        }
    }
}

/// The packets and bytes of a flow so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// From the source to the destination.
    pub packets_to_destination: u64,
    pub bytes_to_destination: u64,
    /// Back.
    pub packets_to_source: u64,
    pub bytes_to_source: u64,
    pub dropped_packets: u64,
}

/// The policy side that judged a flow, as the agent's state names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    /// The source pod's egress: `rules #n` and the policies that select it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<PolicySide>,
    /// The destination pod's ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<PolicySide>,
}

/// One side's rule set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySide {
    /// `rules #n` or `closed`.
    pub ruleset: String,
    /// The policies that select the pod on this side (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// The cluster policy rule that decided (`Admin Deny cnp/rule`), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

/// What a record is made from besides its event.
pub struct Context<'a> {
    pub node: &'a str,
    pub network: &'a str,
    pub directory: &'a Directory,
    /// The agent's NetworkPolicy state of the network, if it wrote one.
    pub state: Option<&'a NetworkState>,
    /// Wall-clock nanoseconds minus `CLOCK_MONOTONIC` nanoseconds, now.
    pub clock_offset_ns: i128,
    /// What the network masquerades, if it does.
    pub masquerade: Option<&'a Masquerade>,
    /// The address and port a pod's flow is masqueraded to now (its SNAT entry), if it
    /// has an entry.
    pub snat: Option<&'a Translation<'a>>,
    /// Where the node's netfilter sent a pod's flow to a Service's address (kube-proxy's
    /// DNAT, as the node's connection tracking has it), if it did.
    pub dnat: Option<&'a Translation<'a>>,
}

/// Finds the address and port a translation put in a pod's flow (see [`Context::snat`],
/// [`Context::dnat`]).
pub type Translation<'a> = dyn Fn(&FlowLogKey) -> Option<SocketAddr> + 'a;

/// A network's masquerade: pod traffic for addresses outside its cluster CIDRs (and not
/// the nodes') leaves with the node's address of its family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Masquerade {
    pub node4: Option<std::net::Ipv4Addr>,
    pub node6: Option<std::net::Ipv6Addr>,
    pub cluster: Vec<ipnet::IpNet>,
    pub node_addrs: Vec<IpAddr>,
}

impl Masquerade {
    /// The address a pod's flow to `dst` leaves with, if it is masqueraded.
    #[must_use]
    pub fn source_for(&self, dst: IpAddr) -> Option<IpAddr> {
        if self.cluster.iter().any(|n| n.contains(&dst)) || self.node_addrs.contains(&dst) {
            return None;
        }
        // Link-local and multicast destinations (neighbour discovery, mDNS) never leave
        // the pod's link through the uplink.
        let on_link = match dst {
            IpAddr::V4(a) => a.is_link_local() || a.is_multicast() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_unicast_link_local() || a.is_multicast(),
        };
        if on_link {
            return None;
        }
        match dst {
            IpAddr::V4(_) => self.node4.map(IpAddr::V4),
            IpAddr::V6(_) => self.node6.map(IpAddr::V6),
        }
    }
}

/// The record of datapath event `ev`.
#[must_use]
pub fn from_event(ev: &FlowEvent, cx: &Context<'_>) -> Flow {
    let kind = match ev.kind {
        FLOW_EVENT_START => "start",
        FLOW_EVENT_END => "end",
        FLOW_EVENT_DROP => "drop",
        _ => "unknown",
    };
    let reason = match ev.kind {
        FLOW_EVENT_DROP => Some(
            Reason::from_u32(ev.reason)
                .map_or_else(|| format!("reason {}", ev.reason), |r| r.name().to_owned()),
        ),
        FLOW_EVENT_END => Some(end_reason(ev.reason).to_owned()),
        _ => None,
    };
    make(&ev.key, &ev.entry, kind, reason, ev.time_ns, ev.time_ns, cx)
}

/// The record of a flow the agent found idle past its timeout (its entry removed): its
/// duration runs to its last packet (the datapath's tick-precise time of it), not to now.
#[must_use]
pub fn expired(key: &FlowLogKey, entry: &FlowLogEntry, now_ns: u64, cx: &Context<'_>) -> Flow {
    let reason = Some(end_reason(FLOW_END_EXPIRED).to_owned());
    make(key, entry, "end", reason, now_ns, entry.last_ns, cx)
}

fn end_reason(r: u32) -> &'static str {
    match r {
        FLOW_END_FIN => "fin",
        FLOW_END_RST => "rst",
        FLOW_END_EXPIRED => "expired",
        _ => "unknown",
    }
}

fn make(
    key: &FlowLogKey,
    e: &FlowLogEntry,
    kind: &str,
    reason: Option<String>,
    at_ns: u64,
    until_ns: u64,
    cx: &Context<'_>,
) -> Flow {
    let pod = endpoint(flow_addr(&key.pod), flow_port(key.pod_port), cx.directory);
    let peer = endpoint(flow_addr(&key.peer), flow_port(key.peer_port), cx.directory);
    let opened_by_pod = e.flags & FLOW_OPENED_BY_POD != 0;
    let elsewhere = key.ifindex == 0;
    let (source, destination, direction) = if opened_by_pod || elsewhere {
        (pod, peer, if elsewhere { "node" } else { "egress" })
    } else {
        (peer, pod, "ingress")
    };
    let (to_dst, to_src) = if opened_by_pod || elsewhere {
        (
            (e.sent_packets, e.sent_bytes),
            (e.received_packets, e.received_bytes),
        )
    } else {
        (
            (e.received_packets, e.received_bytes),
            (e.sent_packets, e.sent_bytes),
        )
    };
    let service = (e.service_port != 0).then(|| {
        endpoint(
            flow_addr(&e.service),
            flow_port(e.service_port),
            cx.directory,
        )
    });
    // A flow the pod sent to a Service's address that the node's own rules (kube-proxy)
    // translated: the backend they chose is the destination, beside the Service, as when
    // the socket hooks connected the socket to it.
    let (destination, service) = match cx.dnat {
        Some(dnat) if service.is_none() && opened_by_pod && destination.kind == "service" => {
            match dnat(key) {
                Some(backend) => (
                    endpoint(backend.ip(), backend.port(), cx.directory),
                    Some(destination),
                ),
                None => (destination, None),
            }
        }
        _ => (destination, service),
    };
    // The network's masquerade address; the flow's own SNAT entry, when it has one, says
    // exactly (address and port).
    let masqueraded_to = cx
        .masquerade
        .filter(|_| opened_by_pod && source.kind == "pod")
        .and_then(|m| m.source_for(destination.ip));
    let translated = masqueraded_to.and(cx.snat).and_then(|f| f(key));
    let wall = |ns: u64| u64::try_from(i128::from(ns) + cx.clock_offset_ns).unwrap_or(0);
    let time_unix_nano = wall(at_ns);
    Flow {
        time: rfc3339(time_unix_nano),
        time_unix_nano,
        node: cx.node.to_owned(),
        network: cx.network.to_owned(),
        kind: kind.to_owned(),
        verdict: if kind == "drop" {
            "dropped"
        } else {
            "forwarded"
        }
        .to_owned(),
        reason,
        direction: direction.to_owned(),
        protocol: protocol_name(key.proto),
        masqueraded_as: translated.map(|t| t.ip()).or(masqueraded_to),
        masqueraded_port: translated.map(|t| t.port()),
        policy: decision(e, cx.state),
        source,
        destination,
        service,
        counters: Counters {
            packets_to_destination: to_dst.0,
            bytes_to_destination: to_dst.1,
            packets_to_source: to_src.0,
            bytes_to_source: to_src.1,
            dropped_packets: e.dropped_packets,
        },
        started: rfc3339(wall(e.started_ns)),
        duration_seconds: until_ns.saturating_sub(e.started_ns) as f64 / 1e9,
    }
}

/// The endpoint at `ip`:`port`, named from `dir`.
fn endpoint(ip: IpAddr, port: u16, dir: &Directory) -> Endpoint {
    let mut ep = Endpoint {
        ip,
        port,
        kind: "world".to_owned(),
        ..Endpoint::default()
    };
    match dir.lookup(ip) {
        Some(Identity::Pod {
            namespace,
            name,
            workload,
            node,
        }) => {
            ep.kind = "pod".to_owned();
            ep.namespace = Some(namespace.to_string());
            ep.name = Some(name.to_string());
            ep.workload = workload.map(|w| w.to_string());
            ep.node = node.map(|n| n.to_string());
        }
        Some(Identity::Service { namespace, name }) => {
            ep.kind = "service".to_owned();
            ep.namespace = Some(namespace.to_string());
            ep.name = Some(name.to_string());
        }
        Some(Identity::Node { name }) => {
            ep.kind = "node".to_owned();
            ep.name = Some(name.to_string());
        }
        None => {}
    }
    ep
}

/// The rule sets of `e` named from the agent's `state` (the pod whose rule set has that
/// id on that side).
fn decision(e: &FlowLogEntry, state: Option<&NetworkState>) -> Option<PolicyDecision> {
    let side = |ruleset: u32, class: u8, egress: bool| -> Option<PolicySide> {
        if ruleset == RULESET_OPEN {
            return None;
        }
        let text = if ruleset == RULESET_CLOSED {
            "closed".to_owned()
        } else {
            format!("rules #{ruleset}")
        };
        let mut out = PolicySide {
            ruleset: text,
            ..PolicySide::default()
        };
        let found = state.and_then(|s| {
            s.pods.iter().find_map(|p| {
                let d = if egress { &p.egress } else { &p.ingress };
                (d.ruleset == ruleset).then_some(d)
            })
        });
        if let Some(d) = found {
            out.policies.clone_from(&d.policies);
            if u32::from(class) != NO_CLASS {
                out.decided_by = d
                    .classes
                    .get(usize::from(class))
                    .map(|c| format!("{} {} {}", c.tier, c.action, c.rules.join(", ")));
            }
        }
        Some(out)
    };
    let d = PolicyDecision {
        egress: side(e.egress_ruleset, e.egress_class, true),
        ingress: side(e.ingress_ruleset, e.ingress_class, false),
    };
    (d.egress.is_some() || d.ingress.is_some()).then_some(d)
}

/// A protocol's name (its number when unnamed).
#[must_use]
pub fn protocol_name(p: u8) -> String {
    match p {
        proto::TCP => "TCP".to_owned(),
        proto::UDP => "UDP".to_owned(),
        132 => "SCTP".to_owned(),
        proto::ICMP => "ICMP".to_owned(),
        proto::ICMPV6 => "ICMPv6".to_owned(),
        n => n.to_string(),
    }
}

/// `ns` nanoseconds since the epoch as RFC 3339, UTC, with nanoseconds.
#[must_use]
pub fn rfc3339(ns: u64) -> String {
    let t = jiff::Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{t:.9}")
}

impl Flow {
    /// One line of text: time, node, verdict, the two sides with their ports, protocol,
    /// and what decided or ended it.
    #[must_use]
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} {} {:<5} {} {}:{} -> {}:{} {}",
            &self.time.get(..23).unwrap_or(&self.time),
            self.node,
            self.kind.to_uppercase(),
            self.direction,
            self.source.label(),
            self.source.port,
            self.destination.label(),
            self.destination.port,
            self.protocol,
        );
        if let Some(s) = &self.service {
            let _ = write!(out, " via {}:{}", s.label(), s.port);
        }
        match (self.masqueraded_as, self.masqueraded_port) {
            (Some(a), Some(p)) => {
                let _ = write!(out, " as {}", SocketAddr::new(a, p));
            }
            (Some(a), None) => {
                let _ = write!(out, " as {a}");
            }
            _ => {}
        }
        if let Some(r) = &self.reason {
            let _ = write!(out, " {r}");
        }
        if let Some(p) = &self.policy {
            for (side, s) in [("egress", &p.egress), ("ingress", &p.ingress)] {
                if let Some(s) = s {
                    let _ = write!(out, " {side}:{}", s.ruleset);
                    if !s.policies.is_empty() {
                        let _ = write!(out, "({})", s.policies.join(","));
                    }
                }
            }
        }
        if self.kind == "end" {
            let c = &self.counters;
            let _ = write!(
                out,
                " {}p/{}B -> {}p/{}B <- {:.1}s",
                c.packets_to_destination,
                c.bytes_to_destination,
                c.packets_to_source,
                c.bytes_to_source,
                self.duration_seconds
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use cni_ebpf_common::mapped4;

    use super::*;

    fn key(pod: [u8; 4], peer: [u8; 4], ports: (u16, u16), ifindex: u32) -> FlowLogKey {
        FlowLogKey {
            ifindex,
            proto: proto::TCP,
            pod: mapped4(u32::from_ne_bytes(pod)),
            peer: mapped4(u32::from_ne_bytes(peer)),
            pod_port: ports.0.to_be(),
            peer_port: ports.1.to_be(),
            ..FlowLogKey::default()
        }
    }

    /// A context of node `node-a` naming from `dir`, nothing masqueraded.
    fn context(dir: &Directory, clock_offset_ns: i128) -> Context<'_> {
        Context {
            node: "node-a",
            network: "net",
            directory: dir,
            state: None,
            clock_offset_ns,
            masquerade: None,
            snat: None,
            dnat: None,
        }
    }

    #[test]
    fn an_end_seen_at_the_destination_pod_is_written_from_the_source() {
        let dir = Directory::default();
        let cx = context(&dir, 1_000_000_000_000_000_000);
        let ev = FlowEvent {
            kind: FLOW_EVENT_END,
            reason: FLOW_END_FIN,
            time_ns: 3_500_000_000,
            key: key([10, 244, 1, 3], [10, 244, 1, 2], (80, 40000), 3),
            entry: FlowLogEntry {
                started_ns: 1_000_000_000,
                sent_packets: 1,
                sent_bytes: 60,
                received_packets: 3,
                received_bytes: 180,
                egress_ruleset: RULESET_OPEN,
                ingress_ruleset: 7,
                ..FlowLogEntry::default()
            },
            ..FlowEvent::default()
        };
        let f = from_event(&ev, &cx);
        assert_eq!((f.kind.as_str(), f.direction.as_str()), ("end", "ingress"));
        assert_eq!(f.source.ip.to_string(), "10.244.1.2");
        assert_eq!((f.source.port, f.destination.port), (40000, 80));
        assert_eq!(f.counters.packets_to_destination, 3);
        assert_eq!(f.counters.bytes_to_source, 60);
        assert_eq!(f.reason.as_deref(), Some("fin"));
        assert!((f.duration_seconds - 2.5).abs() < 1e-9);
        assert_eq!(f.time, "2001-09-09T01:46:43.500000000Z");
        let p = f.policy.clone().unwrap();
        assert!(p.egress.is_none());
        assert_eq!(p.ingress.unwrap().ruleset, "rules #7");
        let back: Flow = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
        assert!(
            f.text()
                .contains("10.244.1.2:40000 -> 10.244.1.3:80 TCP fin"),
            "{}",
            f.text()
        );
    }

    #[test]
    fn an_idle_flow_lasted_until_its_last_packet_not_until_it_was_found_idle() {
        let dir = Directory::default();
        let cx = context(&dir, 0);
        let entry = FlowLogEntry {
            started_ns: 1_000_000_000,
            last_ns: 1_750_000_000,
            sent_packets: 2,
            flags: FLOW_OPENED_BY_POD,
            ..FlowLogEntry::default()
        };
        let k = key([10, 244, 1, 2], [10, 244, 2, 9], (40000, 53), 3);
        let f = expired(&k, &entry, 301_000_000_000, &cx);
        assert_eq!(f.reason.as_deref(), Some("expired"));
        assert!(
            (f.duration_seconds - 0.75).abs() < 1e-9,
            "{}",
            f.duration_seconds
        );
        assert_eq!(f.time_unix_nano, 301_000_000_000);
    }

    #[test]
    fn a_masqueraded_flow_names_the_address_and_port_of_its_snat_entry() {
        let dir = Directory::default();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "a2"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.1.2"}]},
        }))
        .unwrap();
        dir.apply_pod(&pod);
        let masq = Masquerade {
            node4: Some("192.0.2.10".parse().unwrap()),
            cluster: vec!["10.244.0.0/16".parse().unwrap()],
            ..Masquerade::default()
        };
        let entry = FlowLogEntry {
            flags: FLOW_OPENED_BY_POD,
            sent_packets: 1,
            ..FlowLogEntry::default()
        };
        let outside = key([10, 244, 1, 2], [198, 51, 100, 7], (40000, 53), 3);
        let seen = std::cell::Cell::new(None);
        let snat = |k: &FlowLogKey| {
            seen.set(Some(*k));
            Some("192.0.2.10:61001".parse().unwrap())
        };
        let mut cx = Context {
            masquerade: Some(&masq),
            snat: Some(&snat),
            ..context(&dir, 0)
        };
        let ev = FlowEvent {
            kind: FLOW_EVENT_START,
            key: outside,
            entry,
            ..FlowEvent::default()
        };
        let f = from_event(&ev, &cx);
        assert_eq!(seen.get(), Some(outside), "looked up by the pod's tuple");
        assert_eq!(f.masqueraded_as, Some("192.0.2.10".parse().unwrap()));
        assert_eq!(f.masqueraded_port, Some(61001));
        assert!(f.text().contains(" as 192.0.2.10:61001"), "{}", f.text());
        // Without an entry (the flow closed): the network's address, no port.
        let none = |_: &FlowLogKey| None;
        cx.snat = Some(&none);
        let f = from_event(&ev, &cx);
        assert_eq!(
            (f.masqueraded_as, f.masqueraded_port),
            (Some("192.0.2.10".parse().unwrap()), None)
        );
        // Inside the cluster: nothing masqueraded, nothing looked up.
        seen.set(None);
        cx.snat = Some(&snat);
        let inside = FlowEvent {
            key: key([10, 244, 1, 2], [10, 244, 2, 9], (40000, 80), 6),
            ..ev
        };
        let f = from_event(&inside, &cx);
        assert_eq!((f.masqueraded_as, f.masqueraded_port), (None, None));
        assert_eq!(seen.get(), None);
        // Nor a link-local or multicast destination.
        for peer in [[169, 254, 1, 1], [224, 0, 0, 251]] {
            let on_link = FlowEvent {
                key: key([10, 244, 1, 2], peer, (5353, 5353), 17),
                ..ev
            };
            assert_eq!(from_event(&on_link, &cx).masqueraded_as, None, "{peer:?}");
        }
        let v6 = Masquerade {
            node6: Some("fd00::10".parse().unwrap()),
            ..Masquerade::default()
        };
        for dst in ["fe80::1", "ff02::1"] {
            assert_eq!(v6.source_for(dst.parse().unwrap()), None, "{dst}");
        }
        assert!(v6.source_for("2001:db8::1".parse().unwrap()).is_some());
    }

    #[test]
    fn a_flow_to_a_service_address_names_the_backend_the_node_sent_it_to() {
        let dir = Directory::default();
        for (name, ip) in [("a2", "10.244.1.2"), ("web-1", "10.244.2.9")] {
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "shop", "name": name},
                "spec": {"containers": []},
                "status": {"phase": "Running", "podIPs": [{"ip": ip}]},
            }))
            .unwrap();
            dir.apply_pod(&pod);
        }
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"]},
        }))
        .unwrap();
        dir.apply_service(&svc);
        let seen = std::cell::Cell::new(None);
        let dnat = |k: &FlowLogKey| {
            seen.set(Some(*k));
            Some("10.244.2.9:8080".parse().unwrap())
        };
        let cx = Context {
            dnat: Some(&dnat),
            ..context(&dir, 0)
        };
        let ev = FlowEvent {
            kind: FLOW_EVENT_START,
            key: key([10, 244, 1, 2], [10, 96, 0, 20], (40000, 80), 3),
            entry: FlowLogEntry {
                flags: FLOW_OPENED_BY_POD,
                sent_packets: 1,
                ..FlowLogEntry::default()
            },
            ..FlowEvent::default()
        };
        let f = from_event(&ev, &cx);
        assert_eq!(seen.get(), Some(ev.key), "asked by the pod's tuple");
        let service = f.service.as_ref().unwrap();
        assert_eq!(
            (service.kind.as_str(), service.name.as_deref(), service.port),
            ("service", Some("web"), 80)
        );
        assert_eq!(
            (f.destination.name.as_deref(), f.destination.port),
            (Some("web-1"), 8080)
        );
        // Not translated (no tracked connection): the Service stays the destination.
        let none = |_: &FlowLogKey| None;
        let cx = Context {
            dnat: Some(&none),
            ..context(&dir, 0)
        };
        let f = from_event(&ev, &cx);
        assert_eq!(
            (f.destination.kind.as_str(), f.service.is_none()),
            ("service", true)
        );
        // A flow to a pod's address is not asked about.
        seen.set(None);
        let cx = Context {
            dnat: Some(&dnat),
            ..context(&dir, 0)
        };
        let direct = FlowEvent {
            key: key([10, 244, 1, 2], [10, 244, 2, 9], (40000, 8080), 3),
            ..ev
        };
        assert_eq!(
            from_event(&direct, &cx).destination.name.as_deref(),
            Some("web-1")
        );
        assert_eq!(seen.get(), None);
    }
}
