//! ClusterNetworkPolicy: every case of the network-policy-api conformance suite
//! (`testbed/src/netpol/cluster_cases.rs`) against the reference model, the compiler and
//! the datapath.
//!
//! - The model must give each poke upstream's answer, in both families (so the model is
//!   right where upstream says what is right).
//! - The compiled rule sets, looked up as the datapath looks them up, must give each poke
//!   upstream's answer too, and agree with the model on the whole four-namespace world at
//!   every step: every pod pair and the Nodes' addresses, ports 80 and 81, TCP, UDP and
//!   SCTP, both families.
//! - End to end on two nodes with the real agents: every step's policies go through the
//!   API and each poke is made by the pod's address and through its Service, in both
//!   families, and must find upstream's answer.

use std::net::IpAddr;

use cni_ebpf::policy::cluster_network_policy::ClusterNetworkPolicy;
use serde_json::Value;
use testbed::netpol::{
    cluster_cases::{self, cluster_cases, poke_addresses, universe_at, ClusterStep},
    model, Protocol, Universe, PORTS, PROTOCOLS,
};

use crate::netpol::Compiled;

/// The typed form of `cluster_policies` (panics naming one the product cannot read).
fn typed(cluster_policies: &[Value]) -> Vec<ClusterNetworkPolicy> {
    cluster_policies
        .iter()
        .map(|v| {
            serde_json::from_value(v.clone())
                .unwrap_or_else(|e| panic!("{}: {e}", v["metadata"]["name"]))
        })
        .collect()
}

/// Every step of every case, with the universe as it is at that step: (case name, step
/// index, universe, step).
fn steps(base: &Universe) -> Vec<(String, usize, Universe, ClusterStep)> {
    cluster_cases(base)
        .into_iter()
        .flat_map(|case| {
            let name = case.name();
            case.steps
                .into_iter()
                .enumerate()
                .map(move |(i, step)| (name.clone(), i, step))
        })
        .map(|(name, i, step)| (name, i, universe_at(base, &step), step))
        .collect()
}

/// Every poke of every step through `decide` (the model or the compiler), in both
/// families; returns how many were made and the wrong ones, one line each.
fn run_pokes(
    decide: impl Fn(&Universe, &ClusterStep, IpAddr, IpAddr, Protocol, u16) -> bool,
) -> (usize, Vec<String>) {
    let base = cluster_cases::universe();
    let (mut made, mut wrong) = (0, Vec::new());
    for (name, si, universe, step) in steps(&base) {
        for poke in &step.pokes {
            for v6 in [false, true] {
                made += 1;
                let (src, dst) = poke_addresses(&universe, poke, v6);
                let got = decide(&universe, &step, src, dst, poke.protocol, poke.port);
                if got != poke.expected {
                    wrong.push(format!(
                        "{name:?} step {si}: {} -> {:?} ({dst}) {}/{}: upstream expects {}, got {got}",
                        poke.from,
                        poke.to,
                        poke.protocol.api_name(),
                        poke.port,
                        poke.expected,
                    ));
                }
            }
        }
    }
    (made, wrong)
}

#[test]
fn conformance_cases_agree_with_the_model() {
    let (made, wrong) = run_pokes(|u, step, src, dst, proto, port| {
        model::allowed_with_cluster_policies(
            u,
            &step.policies,
            &step.cluster_policies,
            src,
            dst,
            proto,
            port,
        )
    });
    assert_eq!(made, 2 * 301, "every upstream poke in both families");
    assert!(
        wrong.is_empty(),
        "{} of {made} pokes:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn conformance_cases_compile_to_what_upstream_expects() {
    let (made, wrong) = run_pokes(|u, step, src, dst, proto, port| {
        Compiled::with_cluster_policies(u, &step.policies, &typed(&step.cluster_policies))
            .allowed(src, dst, proto, port)
    });
    assert_eq!(made, 2 * 301, "every upstream poke in both families");
    assert!(
        wrong.is_empty(),
        "{} of {made} pokes:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The ends the whole-world comparison takes: every address of every pod that is a
/// policy target, and the Nodes' addresses.
fn ends(universe: &Universe) -> Vec<IpAddr> {
    let pods = universe.pods.iter().filter(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.host_network)
            .is_none_or(|host| !host)
    });
    let pod_ips = pods.flat_map(|p| {
        [false, true]
            .into_iter()
            .map(move |v6| cluster_cases::address(p, v6))
    });
    let node_ips = universe
        .nodes
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .filter_map(|a| a.address.parse::<IpAddr>().ok());
    pod_ips.chain(node_ips).collect()
}

#[test]
fn conformance_cases_compile_to_what_the_model_allows_everywhere() {
    let base = cluster_cases::universe();
    let (mut checked, mut denied, mut wrong) = (0u64, 0u64, Vec::new());
    for (name, si, universe, step) in steps(&base) {
        let compiled = Compiled::with_cluster_policies(
            &universe,
            &step.policies,
            &typed(&step.cluster_policies),
        );
        let ends = ends(&universe);
        for src in &ends {
            for dst in ends
                .iter()
                .filter(|d| *d != src && d.is_ipv6() == src.is_ipv6())
            {
                for proto in PROTOCOLS {
                    for port in PORTS {
                        let want = model::allowed_with_cluster_policies(
                            &universe,
                            &step.policies,
                            &step.cluster_policies,
                            *src,
                            *dst,
                            proto,
                            port,
                        );
                        let got = compiled.allowed(*src, *dst, proto, port);
                        checked += 1;
                        denied += u64::from(!want);
                        if got != want && wrong.len() < 40 {
                            wrong.push(format!(
                                "{name:?} step {si}: {src} -> {dst} {}/{port}: model says {want}, \
                                 compiled {got}\n  compiled: {}",
                                proto.api_name(),
                                compiled.explain(*src, *dst),
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        denied > 0 && denied < checked,
        "{denied} of {checked} denied"
    );
    assert!(
        wrong.is_empty(),
        "the first {} disagreements of {checked} checks:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
