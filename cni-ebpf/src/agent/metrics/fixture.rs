//! The tests' metrics: a snapshot of every kind of network and agent state, and the text
//! it is served as.

#![expect(clippy::panic, reason = "tests")]

use std::{collections::BTreeSet, fmt, net::Ipv4Addr, time::Duration};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    collect::{AgentSnapshot, NetworkSnapshot, PolicySnapshot, Snapshot},
    render::{families, registry, text, Family},
};
use crate::datapath::{EndpointView, FlowSummary, MapStats, ReasonCount, SnatUsage};

/// A collector of fixed families.
#[derive(Debug)]
struct Fixed(Vec<Family>);

impl Collector for Fixed {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        self.0.iter().try_for_each(|f| f.encode(&mut encoder))
    }
}

pub fn encode(families: Vec<Family>) -> String {
    text(&registry(Fixed(families))).unwrap_or_else(|e| panic!("encoding: {e}"))
}

/// The snapshot as served.
pub fn render(s: &Snapshot) -> String {
    encode(families(s))
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

pub fn sample() -> Snapshot {
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

pub fn lines(out: &str) -> BTreeSet<&str> {
    out.lines().collect()
}
