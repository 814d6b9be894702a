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
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::Value;
use testbed::netpol::{
    cluster_cases::{self, cluster_cases, poke_addresses, universe_at, ClusterStep, Poke, Target},
    model, Protocol, Universe, PORTS, PROTOCOLS,
};

use crate::netpol::{service_ip, Compiled, MatrixProxy, MatrixWorld};

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

/// One probe of a poke: by the destination's address or through its Service, in one
/// family.
struct PokeProbe<'a> {
    poke: &'a Poke,
    v6: bool,
    via_service: bool,
}

/// Every case of the conformance suite end to end in a [`MatrixWorld`] of the conformance
/// universe (four namespaces of three pods over two nodes, the Nodes and forbidden-forrest's
/// host-network pods published, a server on each node's own address), with the CRD
/// installed and kube-proxy's nftables rules: for every step, the cluster policies,
/// NetworkPolicies and namespace labels go through the API; then each poke is made in
/// both families, to the pod's address and through its Service (a node peer: to the
/// node's address), and must find upstream's answer.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn conformance_cases_hold_end_to_end_on_two_nodes() {
    use std::time::{Duration, Instant};

    use testbed::{datapath::wait_until, kubeproxy::Mode, netpol::probe::MatrixServer};

    let mut world = MatrixWorld::of(
        "cnp_conf",
        false,
        MatrixProxy::KubeProxy(Mode::Nftables),
        &cluster_cases::universe(),
    );
    world.api.install_crd("clusternetworkpolicies");
    let node_servers: Vec<(String, MatrixServer)> = world
        .cluster
        .nodes()
        .iter()
        .map(|n| {
            (
                n.name().to_owned(),
                MatrixServer::start(n.netns(), n.name()),
            )
        })
        .collect();
    let started = Instant::now();
    let all = cluster_cases(&world.initial);
    let (mut steps, mut pokes, mut wrong) = (0, 0, Vec::new());
    let mut policies: Vec<NetworkPolicy> = Vec::new();
    let mut published = world.initial.clone();
    for case in &all {
        for (si, step) in case.steps.iter().enumerate() {
            steps += 1;
            let before: Vec<u32> = world
                .cluster
                .nodes()
                .iter()
                .map(|n| n.policy_generation())
                .collect();
            let changed = publish(&mut world, &mut published, &mut policies, step);
            if changed {
                // One swap of the agents' (most changes touch both nodes' rule sets;
                // the retries below cover a node that swaps later).
                wait_until(Duration::from_secs(2), || {
                    world
                        .cluster
                        .nodes()
                        .iter()
                        .zip(&before)
                        .any(|(n, g)| n.policy_generation() > *g)
                });
                std::thread::sleep(Duration::from_millis(100));
            }
            let universe = universe_at(&world.initial, step);
            let probes: Vec<PokeProbe<'_>> = step
                .pokes
                .iter()
                .flat_map(|poke| {
                    let vias: &[bool] = match poke.to {
                        Target::Pod(_) => &[false, true],
                        Target::OtherNode => &[false],
                    };
                    [false, true].into_iter().flat_map(move |v6| {
                        vias.iter().map(move |via_service| PokeProbe {
                            poke,
                            v6,
                            via_service: *via_service,
                        })
                    })
                })
                .collect();
            pokes += step.pokes.len();
            world.probes += probes.len();
            let mut pending: Vec<&PokeProbe<'_>> = probes.iter().collect();
            let deadline = Instant::now() + Duration::from_secs(6);
            let mut timeout = Duration::from_millis(250);
            loop {
                let found = probe_all(&world, &universe, &node_servers, &pending, timeout);
                pending = pending
                    .into_iter()
                    .zip(found)
                    .filter(|(p, got)| *got != p.poke.expected)
                    .map(|(p, _)| p)
                    .collect();
                if pending.is_empty() || Instant::now() >= deadline {
                    break;
                }
                world.retried += pending.len();
                timeout = Duration::from_secs(1);
                std::thread::sleep(Duration::from_millis(200));
            }
            wrong.extend(pending.into_iter().map(|p| {
                format!(
                    "{:?} step {si}: {} -> {:?}{} {}/{} over {}: upstream expects {}, found the opposite",
                    case.name(),
                    p.poke.from,
                    p.poke.to,
                    if p.via_service { " (its Service)" } else { "" },
                    p.poke.protocol.api_name(),
                    p.poke.port,
                    if p.v6 { "IPv6" } else { "IPv4" },
                    p.poke.expected,
                )
            }));
        }
    }
    eprintln!(
        "{} cases, {steps} steps, {pokes} pokes, {} probes ({} retried) in {:?}",
        all.len(),
        world.probes,
        world.retried,
        started.elapsed()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} probes found the wrong answer:\n{}\n{}",
        wrong.len(),
        world.probes,
        wrong.join("\n"),
        world.agent_logs()
    );
}

/// Puts what `step` has in force through the API, changing only what differs from what
/// is published (`published`'s namespace labels, `policies`); whether anything changed.
fn publish(
    world: &mut MatrixWorld,
    published: &mut Universe,
    policies: &mut Vec<NetworkPolicy>,
    step: &ClusterStep,
) -> bool {
    let mut changed = false;
    let wanted = universe_at(&world.initial, step);
    for ns in &wanted.namespaces {
        let name = ns.metadata.name.as_deref().unwrap_or_default();
        if published.namespace(name).map(|n| &n.metadata.labels) != Some(&ns.metadata.labels) {
            world
                .api
                .put("namespaces", serde_json::to_value(ns).unwrap_or_default());
            changed = true;
        }
    }
    published.namespaces.clone_from(&wanted.namespaces);
    let key = |p: &NetworkPolicy| (p.metadata.namespace.clone(), p.metadata.name.clone());
    for old in policies.iter() {
        if !step.policies.iter().any(|p| key(p) == key(old)) {
            world.api.delete(
                "networkpolicies",
                old.metadata.namespace.as_deref(),
                old.metadata.name.as_deref().unwrap_or_default(),
            );
            changed = true;
        }
    }
    for p in &step.policies {
        if !policies.contains(p) {
            world.api.put(
                "networkpolicies",
                serde_json::to_value(p).unwrap_or_default(),
            );
            changed = true;
        }
    }
    policies.clone_from(&step.policies);
    changed |= world.cluster_policies() != step.cluster_policies.as_slice();
    world.set_cluster_policies(step.cluster_policies.clone());
    changed
}

/// Makes `probes` all at once (a thread each) and returns what each found.
fn probe_all(
    world: &MatrixWorld,
    universe: &Universe,
    node_servers: &[(String, testbed::netpol::probe::MatrixServer)],
    probes: &[&PokeProbe<'_>],
    timeout: std::time::Duration,
) -> Vec<bool> {
    use testbed::netpol::probe::{probe, Target as ProbeTarget};
    std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let from = &world.pods[world.index(&p.poke.from)];
                    let (_, dst) = poke_addresses(universe, p.poke, p.v6);
                    let (addr, server) = match &p.poke.to {
                        Target::Pod(to) => {
                            let i = world.index(to);
                            let addr = if p.via_service {
                                service_ip(i, p.v6)
                            } else {
                                dst
                            };
                            (addr, &world.pods[i].servers)
                        }
                        Target::OtherNode => {
                            let server = cluster_cases::other_node_server(universe, &p.poke.from);
                            let node = server
                                .spec
                                .as_ref()
                                .and_then(|s| s.node_name.as_deref())
                                .unwrap_or_default();
                            let servers = node_servers
                                .iter()
                                .find(|(n, _)| n == node)
                                .map(|(_, s)| s)
                                .unwrap_or_else(|| panic!("no server on {node}"));
                            (dst, servers)
                        }
                    };
                    let target = ProbeTarget {
                        addr,
                        port: p.poke.port,
                        server,
                    };
                    probe(from.pod.netns(), target, p.poke.protocol, timeout)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect()
    })
}
