//! The agent's own families: its probes, its settings against the conflists and its
//! traffic with the API server, its NetworkPolicy totals, and its WireGuard peers.

use super::{
    collect::{AgentSnapshot, PolicySnapshot},
    render::Family,
};

/// The node's WireGuard peers, one sample each, labelled with the peer's node (one
/// series per other node of the cluster). What strict mode drops for nodes without a
/// key is `cni_ebpf_reason_packets_total{reason="drop_no_wireguard_key"}`.
pub(super) fn wireguard_families(peers: &[crate::agent::wireguard::PeerReport]) -> Vec<Family> {
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
pub(super) fn agent_families(a: &AgentSnapshot) -> Vec<Family> {
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
pub(super) fn policy_families(p: &PolicySnapshot) -> Vec<Family> {
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
        "ClusterNetworkPolicy verdicts, credited to the rule that decided (the first \
         matching rule of the tier that accepted or denied; consecutive rules of one \
         action with the same ports are credited together), per direction: flows \
         admitted (counted on their first packet) and packets denied.",
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

#[cfg(test)]
mod tests {
    use crate::agent::metrics::fixture::{lines, render, sample};

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
}
