//! Each network's families: whether its datapath is loaded and could be read, its
//! endpoints' counters, the packets of each reason, its maps, its SNAT ports and its flows.

use super::{
    collect::NetworkSnapshot,
    render::{Family, Value},
};

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
pub(super) fn network_families(nets: &[NetworkSnapshot]) -> Vec<Family> {
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
mod tests {
    use crate::agent::metrics::fixture::{lines, render, sample};

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
}
