//! Packet tests (BPF_PROG_TEST_RUN) of NetworkPolicy enforcement: rule sets compiled
//! from real policy objects, swapped in as the agent does, and judged by the programs on
//! every path a packet takes into or out of a pod (the same-node fast path, the host
//! veth's egress for what the kernel delivers, the uplink's egress), in both families.
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use std::net::{IpAddr, Ipv6Addr};

use cni_ebpf::{
    datapath::Endpoint,
    policy::{
        cluster_network_policy::{self, ClusterNetworkPolicy},
        compile, parse_all, Cluster, Policies, Verdicts,
    },
};
use cni_ebpf_common::{owner_id, PolicyEndpoint, Reason, RULESET_CLOSED, RULESET_OPEN};
use serde_json::{json, Value};
use testbed::packet::*;

const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 3);
const EXT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x64);

/// Pod `x/<name>` with `ips`, label `app=<name>`, serving a named port `http` on TCP 8080.
fn pod(name: &str, ips: &[IpAddr]) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"}
        ]}]},
        "status": {"phase": "Running", "podIPs": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>()},
    }))
    .unwrap()
}

/// Namespace `x` (label `ns=x`).
fn namespace_x() -> k8s_openapi::api::core::v1::Namespace {
    serde_json::from_value(json!({"metadata": {"name": "x", "labels": {"ns": "x"}}})).unwrap()
}

/// Pods `x/a` and `x/b` (the fixture's pods A and B, dual-stack), each serving a named
/// port `http` on TCP 8080.
pub(crate) fn cluster() -> Cluster {
    Cluster::from_api(
        &[namespace_x()],
        &[
            pod("a", &[POD_A.into(), POD_A6.into()]),
            pod("b", &[POD_B.into(), POD_B6.into()]),
        ],
    )
}

fn policy(name: &str, spec: Value) -> k8s_openapi::api::networking::v1::NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// The fixture's pods with both families' addresses.
pub(crate) fn dual_stack_pods(fx: &Fixture) {
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_A.into(), POD_A6.into()],
            ..endpoint_a()
        })
        .unwrap();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_B.into(), POD_B6.into()],
            ..endpoint_b()
        })
        .unwrap();
}

/// Compiles `policies` and swaps them in as the agent does: each rule set under a fresh
/// id, then both pods' entries in the slot not in force, then the swap. Returns the ids
/// used (to be removed by a later swap).
pub(crate) fn enforce(
    fx: &Fixture,
    policies: &[k8s_openapi::api::networking::v1::NetworkPolicy],
    first_id: u32,
) {
    enforce_all(fx, policies, &[], first_id);
}

/// [`enforce`] with cluster policies too.
pub(crate) fn enforce_all(
    fx: &Fixture,
    policies: &[k8s_openapi::api::networking::v1::NetworkPolicy],
    cluster_policies: &[ClusterNetworkPolicy],
    first_id: u32,
) {
    let cluster = cluster();
    let (parsed, broken) = parse_all(policies);
    assert!(
        broken.is_empty(),
        "{:?}",
        broken.iter().map(|b| &b.error).collect::<Vec<_>>()
    );
    let (tiered, broken_tiered) = cluster_network_policy::parse_all(cluster_policies);
    assert!(broken_tiered.is_empty(), "{broken_tiered:?}");
    let all = Policies {
        network: &parsed,
        broken: &broken,
        cluster: &tiered,
        broken_cluster: &broken_tiered,
    };
    let mut next = first_id;
    let mut put = |v: &Verdicts| match v {
        Verdicts::Open => RULESET_OPEN,
        Verdicts::Closed(_) => RULESET_CLOSED,
        Verdicts::Enforced(rs) => {
            fx.dp().put_ruleset(next, rs).unwrap();
            next += 1;
            next - 1
        }
    };
    let mut entries = Vec::new();
    for (name, ifindex, ctr) in [("a", IFINDEX_A, "ctr-a"), ("b", IFINDEX_B, "ctr-b")] {
        let p = compile(&cluster, &all, cluster.pod("x", name).unwrap());
        entries.push((
            ifindex,
            PolicyEndpoint {
                ingress: put(&p.ingress),
                egress: put(&p.egress),
                owner: owner_id(ctr.as_bytes(), b"eth0"),
                pod: cni_ebpf::datapath::policy::pod_key("x", name),
            },
        ));
    }
    fx.dp().swap_policy(&entries).unwrap();
}

pub(crate) fn a_to_b(dport: u16, flags: u8) -> Vec<u8> {
    frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        TCP,
        &tcp(POD_A, POD_B, 40000, dport, flags, b"x"),
    )
}

pub(crate) fn b_to_a(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    frame(
        HOST_MAC_B,
        POD_MAC_B,
        POD_B,
        POD_A,
        TCP,
        &tcp(POD_B, POD_A, sport, dport, flags, b"y"),
    )
}

/// `b` admits only `a` on TCP 80 and sends nothing of its own.
pub(crate) fn b_admits_a_on_80() -> Vec<k8s_openapi::api::networking::v1::NetworkPolicy> {
    vec![policy(
        "b-from-a",
        json!({
            "podSelector": {"matchLabels": {"app": "b"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}],
                         "ports": [{"port": 80}]}],
        }),
    )]
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_of_a_namespace_with_policies_starts_closed_once_the_agent_runs() {
    let fx = Fixture::new();
    fx.standard_node(true);
    // ADD of a pod in namespace `x`, which holds a policy: its entry is closed.
    fx.dp()
        .set_policy_namespaces(&["x".to_owned()].into())
        .unwrap();
    let pod_b = |name: &str| cni_ebpf::ipam::record::PodRef {
        namespace: "x".into(),
        name: name.into(),
        uid: None,
    };
    fx.dp().put_endpoint_entries(&endpoint_a()).unwrap();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            pod: Some(pod_b("b")),
            ..endpoint_b()
        })
        .unwrap();
    let entry = fx
        .dp()
        .policy_endpoints()
        .unwrap()
        .into_iter()
        .find(|(k, _)| k.ifindex == IFINDEX_B)
        .unwrap()
        .1;
    assert_eq!(
        (entry.ingress, entry.egress),
        (RULESET_CLOSED, RULESET_CLOSED)
    );
    assert_eq!(entry.pod, cni_ebpf::datapath::policy::pod_key("x", "b"));
    // Before the agent's first swap nothing is judged on a network that does not
    // enforce policy (`networkPolicy: false`, the fixture's).
    assert_eq!(fx.dp().policy_state().unwrap().generation, 0);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    // The agent's first swap, which has not opened b yet.
    fx.dp().swap_policy(&[]).unwrap();
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT, "b is closed");
    assert_eq!(
        fx.run("from_pod", &b_to_a(5555, 80, SYN)).0,
        SHOT,
        "both ways"
    );
    // Pod a's namespace entry was written before the namespace held a policy: open.
    let to_a = udp_frame(EXT, 4000, POD_A, 53);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &to_a).0, PASS);
    // DEL removes the entries.
    fx.dp()
        .remove_policy_endpoints(owner_id(b"ctr-b", b"eth0"))
        .unwrap();
    assert!(fx
        .dp()
        .policy_endpoints()
        .unwrap()
        .iter()
        .all(|(k, _)| k.ifindex != IFINDEX_B));
}

/// On a network that enforces policy (`networkPolicy`, the default), every pod is closed
/// until the agent's first swap: the maps were made since (a boot, a purge), so the
/// cluster's policy is not in force yet. Only the node's traffic passes. After the swap,
/// the rule sets decide.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn before_the_agents_first_swap_every_pod_is_closed_where_policy_is_enforced() {
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        network_policy: true,
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    fx.two_pods();
    assert_eq!(fx.dp().policy_state().unwrap().generation, 0);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT, "pod → pod");
    assert_eq!(
        fx.run("from_pod", &b_to_a(5555, 80, SYN)).0,
        SHOT,
        "both ways"
    );
    let (v, _) = fx.egress(&udp_frame(POD_A, 4000, EXT, 53));
    assert_eq!(v, SHOT, "pod → outside");
    let to_a = |src| udp_frame(src, 4000, POD_A, 53);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &to_a(EXT)).0,
        SHOT,
        "outside → pod"
    );
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &to_a(NODE)).0,
        PASS,
        "the node's traffic (kubelet's probes) passes"
    );
    assert_eq!(
        fx.reason(Reason::DropPolicyIngress) + fx.reason(Reason::DropPolicyEgress),
        4
    );
    // The agent's first swap: no policy selects a or b.
    fx.dp().swap_policy(&[]).unwrap();
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &to_a(EXT)).0, PASS);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn same_node_traffic_is_judged_by_ingress_and_egress_and_replies_pass() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &b_admits_a_on_80(), 1);
    let (v, _) = fx.run("from_pod", &a_to_b(80, SYN));
    assert_eq!(v, REDIRECT, "a → b:80 is admitted");
    assert_eq!(fx.reason(Reason::PolicyAdmitted), 1);
    let (v, _) = fx.run("from_pod", &a_to_b(80, ACK));
    assert_eq!(v, REDIRECT, "its later packets too");
    assert_eq!(fx.reason(Reason::PolicyAdmitted), 1, "on the recorded flow");
    let (v, _) = fx.run("from_pod", &b_to_a(80, 40000, SYN | ACK));
    assert_eq!(
        v, REDIRECT,
        "b's reply passes although b's egress admits nothing"
    );
    let (v, _) = fx.run("from_pod", &a_to_b(81, SYN));
    assert_eq!(v, SHOT, "a → b:81 is refused by b's ingress");
    assert_eq!(fx.reason(Reason::DropPolicyIngress), 1);
    let (v, _) = fx.run("from_pod", &b_to_a(5555, 80, SYN));
    assert_eq!(
        v, SHOT,
        "b opening a flow of its own is refused by its egress"
    );
    assert_eq!(fx.reason(Reason::DropPolicyEgress), 1);
}

/// A cluster policy of `tier` whose subject is pod `b`, with `ingress` rules.
fn cnp_on_b(name: &str, tier: &str, priority: i32, ingress: Value) -> ClusterNetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "tier": tier,
            "priority": priority,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b"}}}},
            "ingress": ingress,
        },
    }))
    .unwrap()
}

/// An ingress rule of `action` from pod `a`, on TCP `port` or every port.
fn from_a(action: &str, port: Option<u16>) -> Value {
    let mut rule = json!({"action": action,
        "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "a"}}}}]});
    if let Some(p) = port {
        rule["protocols"] = json!([{"tcp": {"destinationPort": {"number": p}}}]);
    }
    rule
}

/// The programs rank a rule set's classes by tier: the Admin tier's first matching rule,
/// then NetworkPolicy where one selects the pod, then the Baseline tier's, then admitted;
/// with a fresh verdict after each swap.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn cluster_policy_tiers_decide_before_and_after_network_policy() {
    let fx = Fixture::with_two_pods();
    let verdict = |port: u16| fx.run("from_pod", &a_to_b(port, SYN)).0;
    // NetworkPolicy admits a → b:80 only; an Admin Deny of port 80 overrides it.
    let deny_80 = cnp_on_b("deny-80", "Admin", 10, json!([from_a("Deny", Some(80))]));
    enforce_all(&fx, &b_admits_a_on_80(), std::slice::from_ref(&deny_80), 1);
    assert_eq!(
        verdict(80),
        SHOT,
        "the Admin tier denies before NetworkPolicy"
    );
    assert!(fx.reason(Reason::DropPolicyIngress) > 0);
    // An Admin Accept of higher precedence wins over the Deny, and admits port 81
    // NetworkPolicy would not.
    let accept = cnp_on_b("accept", "Admin", 5, json!([from_a("Accept", None)]));
    enforce_all(&fx, &b_admits_a_on_80(), &[deny_80.clone(), accept], 10);
    assert_eq!(verdict(80), REDIRECT);
    assert_eq!(
        verdict(81),
        REDIRECT,
        "Accept is final: NetworkPolicy is not asked"
    );
    // Pass: on to NetworkPolicy, which admits 80 and not 81.
    let pass = cnp_on_b("pass", "Admin", 5, json!([from_a("Pass", None)]));
    enforce_all(&fx, &b_admits_a_on_80(), &[deny_80, pass], 20);
    assert_eq!(
        verdict(80),
        REDIRECT,
        "passed to NetworkPolicy, which admits"
    );
    assert_eq!(verdict(81), SHOT);
    // The Baseline tier decides where no NetworkPolicy selects the pod, and not where
    // one does.
    let baseline = cnp_on_b("baseline", "Baseline", 0, json!([from_a("Deny", Some(81))]));
    enforce_all(&fx, &[], std::slice::from_ref(&baseline), 30);
    assert_eq!(verdict(80), REDIRECT, "nothing matches: admitted");
    assert_eq!(verdict(81), SHOT, "the Baseline tier denies");
    let allow_81 = policy(
        "b-81",
        json!({"podSelector": {"matchLabels": {"app": "b"}},
               "ingress": [{"ports": [{"port": 81}]}]}),
    );
    enforce_all(&fx, &[allow_81], &[baseline], 40);
    assert_eq!(
        verdict(81),
        REDIRECT,
        "NetworkPolicy overrides the Baseline tier"
    );
    assert_eq!(verdict(80), SHOT, "and isolates the pod");
}

/// The programs count each verdict a cluster policy rule decided under its class: flows
/// it admitted (once per flow) and packets it refused; NetworkPolicy's verdicts and the
/// default are not counted there.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn the_cluster_policy_rule_that_decided_is_counted() {
    let fx = Fixture::with_two_pods();
    let deny_80 = cnp_on_b("deny-80", "Admin", 10, json!([from_a("Deny", Some(80))]));
    let accept = cnp_on_b("accept", "Admin", 20, json!([from_a("Accept", Some(81))]));
    enforce_all(&fx, &[], &[deny_80, accept], 1);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);
    assert_eq!(fx.run("from_pod", &a_to_b(81, SYN)).0, REDIRECT);
    assert_eq!(fx.run("from_pod", &a_to_b(81, ACK)).0, REDIRECT);
    assert_eq!(
        fx.run("from_pod", &a_to_b(82, SYN)).0,
        REDIRECT,
        "no rule: admitted"
    );
    let counts: Vec<_> = fx
        .dp()
        .policy_class_counts()
        .unwrap()
        .into_iter()
        .map(|(k, c)| (k.class, k.egress, c.admitted, c.denied))
        .collect();
    assert_eq!(
        counts,
        [(0, 0, 0, 2), (1, 0, 1, 0)],
        "class 0 (the Deny) refused two packets at b's ingress, class 1 (the Accept) \
         admitted one flow"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_verdict_does_not_outlive_the_policy_that_gave_it() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &b_admits_a_on_80(), 1);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    // The policy now admits port 81 only: the recorded flow is judged again.
    let mut p = b_admits_a_on_80();
    p[0].spec.as_mut().unwrap().ingress.as_mut().unwrap()[0].ports =
        Some(serde_json::from_value(json!([{"port": 81}])).unwrap());
    enforce(&fx, &p, 100);
    assert_eq!(fx.dp().policy_state().unwrap().generation, 2);
    assert_eq!(fx.run("from_pod", &a_to_b(80, ACK)).0, SHOT, "refused now");
    assert_eq!(
        fx.run("from_pod", &b_to_a(80, 40000, ACK)).0,
        SHOT,
        "and so are its replies"
    );
    assert_eq!(fx.run("from_pod", &a_to_b(81, SYN)).0, REDIRECT);
    // No policy: everything passes again.
    enforce(&fx, &[], 200);
    assert_eq!(fx.run("from_pod", &a_to_b(80, ACK)).0, REDIRECT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn what_the_kernel_delivers_is_judged_on_the_host_veths_egress() {
    let fx = Fixture::with_two_pods();
    enforce(
        &fx,
        &[policy(
            "b-from-ext",
            json!({
                "podSelector": {"matchLabels": {"app": "b"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.0/24",
                                                   "except": ["198.18.0.100/32"]}}],
                             "ports": [{"protocol": "UDP", "port": 53}]}],
            }),
        )],
        1,
    );
    let to_b = |src, dport| {
        frame(
            HOST_MAC_B,
            UPLINK_MAC,
            src,
            POD_B,
            UDP,
            &udp(src, POD_B, 4000, dport, b"q", true),
        )
    };
    let other = std::net::Ipv4Addr::new(198, 18, 0, 7);
    assert_eq!(fx.run_on("to_pod", IFINDEX_B, &to_b(other, 53)).0, PASS);
    assert_eq!(fx.run_on("to_pod", IFINDEX_B, &to_b(other, 54)).0, SHOT);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_B, &to_b(EXT, 53)).0,
        SHOT,
        "the excepted address"
    );
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_B, &to_b(NODE, 9)).0,
        PASS,
        "the node's own traffic is never judged"
    );
    // Pod a through the stack (a Service after kube-proxy's DNAT): b's ingress has no
    // rule for it.
    assert_eq!(fx.run_on("to_pod", IFINDEX_B, &to_b(POD_A, 53)).0, SHOT);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &to_b(other, 53)).0,
        PASS,
        "pod a is selected by no policy"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pods_traffic_leaving_the_node_is_judged_by_its_egress_before_masquerade() {
    let fx = Fixture::with_two_pods();
    enforce(
        &fx,
        &[policy(
            "a-dns-only",
            json!({
                "podSelector": {"matchLabels": {"app": "a"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": "198.18.0.100/32"}}],
                            "ports": [{"protocol": "UDP", "port": 53}]}],
            }),
        )],
        1,
    );
    let (v, out) = fx.egress(&udp_frame(POD_A, 4000, EXT, 53));
    assert_ne!(v, SHOT, "a → ext:53/UDP is admitted");
    assert_eq!(parse_checked(&out).src, NODE, "and masqueraded");
    let (v, _) = fx.egress(&udp_frame(POD_A, 4000, EXT, 80));
    assert_eq!(v, SHOT, "a → ext:80 is refused");
    assert_eq!(fx.reason(Reason::DropPolicyEgress), 1);
    // Pod b is not selected.
    let (v, _) = fx.egress(&udp_frame(POD_B, 4000, EXT, 80));
    assert_ne!(v, SHOT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn named_ports_resolve_on_the_destination_pod() {
    let fx = Fixture::with_two_pods();
    enforce(
        &fx,
        &[policy(
            "a-to-http",
            json!({
                "podSelector": {"matchLabels": {"app": "a"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}],
            }),
        )],
        1,
    );
    assert_eq!(fx.run("from_pod", &a_to_b(8080, SYN)).0, REDIRECT);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn closed_and_stale_entries_refuse_everything_but_the_node() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &[], 1);
    let owner_b = owner_id(b"ctr-b", b"eth0");
    // As ADD writes a pod of a namespace with policies: closed in both slots.
    let m = PolicyEndpoint {
        ingress: RULESET_CLOSED,
        egress: RULESET_CLOSED,
        owner: owner_b,
        pod: 0,
    };
    fx.dp().swap_policy(&[(IFINDEX_B, m)]).unwrap();
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);
    let from_node = frame(
        HOST_MAC_B,
        UPLINK_MAC,
        NODE,
        POD_B,
        TCP,
        &tcp(NODE, POD_B, 40000, 10250, SYN, b"probe"),
    );
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_B, &from_node).0,
        PASS,
        "a kubelet probe from the node passes"
    );
    // An entry another attachment's owner wrote (an interface index reused) is closed.
    let stale = PolicyEndpoint {
        ingress: RULESET_OPEN,
        egress: RULESET_OPEN,
        owner: 12345,
        pod: 0,
    };
    fx.dp().remove_policy_endpoints(owner_b).unwrap();
    fx.dp().put_policy_endpoint(IFINDEX_B, 12345, None).unwrap();
    fx.dp().swap_policy(&[(IFINDEX_B, stale)]).unwrap();
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);
}

fn tcp6_frame(
    src: Ipv6Addr,
    sport: u16,
    dst: Ipv6Addr,
    dport: u16,
    smac: [u8; 6],
    dmac: [u8; 6],
) -> Vec<u8> {
    let mut l4 = vec![0u8; 20];
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    l4[2..4].copy_from_slice(&dport.to_be_bytes());
    l4[12] = 5 << 4;
    l4[13] = SYN;
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[TCP, 64]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&l4);
    eth(dmac, smac, 0x86dd, &ip)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_is_judged_on_every_path_as_ipv4_is() {
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        node_addr6: Some("fd00:18::2".parse().unwrap()),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    dual_stack_pods(&fx);
    enforce(&fx, &b_admits_a_on_80(), 1);
    let a_b = |dport| tcp6_frame(POD_A6, 40000, POD_B6, dport, POD_MAC_A, HOST_MAC_A);
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &a_b(80)).0, REDIRECT);
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &a_b(81)).0, SHOT);
    let ext_b = |dport| tcp6_frame(EXT6, 40000, POD_B6, dport, UPLINK_MAC, HOST_MAC_B);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_B, &ext_b(80)).0,
        SHOT,
        "ext is no pod a"
    );
    let b_ext = tcp6_frame(POD_B6, 40000, EXT6, 443, POD_MAC_B, HOST_MAC_B);
    assert_eq!(
        fx.run("uplink_egress", &b_ext).0,
        SHOT,
        "b's egress admits nothing"
    );
    let a_ext = tcp6_frame(POD_A6, 40000, EXT6, 443, POD_MAC_A, HOST_MAC_A);
    assert_ne!(fx.run("uplink_egress", &a_ext).0, SHOT, "a is not selected");
    // Neighbour discovery from the host veth's link-local address passes.
    let ns = tcp6_frame(
        "fe80::1".parse().unwrap(),
        1,
        POD_B6,
        1,
        HOST_MAC_B,
        POD_MAC_B,
    );
    assert_eq!(fx.run_on("to_pod", IFINDEX_B, &ns).0, PASS);
}

/// Pods a and b with the pod names ADD records (`x/a`, `x/b`).
fn named_pods(fx: &Fixture) {
    for (ep, name) in [(endpoint_a(), "a"), (endpoint_b(), "b")] {
        fx.dp()
            .put_endpoint_entries(&Endpoint {
                pod: Some(cni_ebpf::ipam::record::PodRef {
                    namespace: "x".into(),
                    name: name.into(),
                    uid: None,
                }),
                ..ep
            })
            .unwrap();
    }
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn the_agent_changes_only_what_differs_also_after_a_restart() {
    use cni_ebpf::agent::Reconciler;
    let fx = Fixture::new();
    fx.standard_node(true);
    named_pods(&fx);
    let cluster = cluster();
    let mut agent = Reconciler::resume(fx.dp(), cni_ebpf_common::DEFAULT_DNS_MIN_TTL_S).unwrap();
    let round = agent
        .reconcile(fx.dp(), &cluster, &b_admits_a_on_80())
        .unwrap();
    assert!(round.swapped && round.generation == 1, "{round:?}");
    // b's ingress rules; its egress admits nothing, which needs no tables.
    assert_eq!(
        (round.interfaces, round.selected, round.rulesets),
        (2, 1, 1),
        "{round:?}"
    );
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    assert_eq!(fx.run("from_pod", &a_to_b(81, SYN)).0, SHOT);
    // What `inspect` shows of it.
    let view = fx.dp().policy_view().unwrap();
    assert_eq!(view.generation, 1);
    let b = view
        .endpoints
        .iter()
        .find(|e| e.host_ifindex == IFINDEX_B)
        .unwrap();
    assert_eq!(b.egress, "closed");
    let id: u32 = b.ingress.trim_start_matches("rules #").parse().unwrap();
    let rs = &view.rulesets[&id];
    assert!(
        rs.peers
            .iter()
            .any(|l| l.starts_with(&format!("{POD_A}/32 "))),
        "{rs:?}"
    );
    assert!(rs.ports.iter().any(|l| l.starts_with("6/80 ")), "{rs:?}");
    assert_eq!(
        view.endpoints
            .iter()
            .find(|e| e.host_ifindex == IFINDEX_A)
            .map(|e| (e.ingress.as_str(), e.egress.as_str())),
        Some(("open", "open"))
    );

    let again = agent
        .reconcile(fx.dp(), &cluster, &b_admits_a_on_80())
        .unwrap();
    assert!(!again.swapped, "nothing changed: {again:?}");

    // A new agent process: it reads the rule sets back and changes nothing.
    let mut restarted =
        Reconciler::resume(fx.dp(), cni_ebpf_common::DEFAULT_DNS_MIN_TTL_S).unwrap();
    let round = restarted
        .reconcile(fx.dp(), &cluster, &b_admits_a_on_80())
        .unwrap();
    assert!(!round.swapped, "a restart changes no verdict: {round:?}");
    assert_eq!(round.generation, 1);

    // A changed policy: swapped, and the rule set no pod needs any more is gone.
    let mut p = b_admits_a_on_80();
    p[0].spec.as_mut().unwrap().ingress.as_mut().unwrap()[0].ports =
        Some(serde_json::from_value(json!([{"port": 81}])).unwrap());
    let round = restarted.reconcile(fx.dp(), &cluster, &p).unwrap();
    assert!(round.swapped && round.generation == 2, "{round:?}");
    assert_eq!(round.rulesets, 1, "{round:?}");
    assert_eq!(fx.dp().policy_rulesets().unwrap().len(), 1);
    assert_eq!(fx.run("from_pod", &a_to_b(81, SYN)).0, REDIRECT);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, SHOT);

    // No policy: everything open, no rule set left.
    let round = restarted.reconcile(fx.dp(), &cluster, &[]).unwrap();
    assert_eq!((round.selected, round.rulesets), (0, 0), "{round:?}");
    assert!(fx.dp().policy_rulesets().unwrap().is_empty());
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_the_agent_does_not_know_yet_stays_closed_and_is_opened_once_known() {
    use cni_ebpf::agent::Reconciler;
    let fx = Fixture::new();
    fx.standard_node(true);
    let mut agent = Reconciler::resume(fx.dp(), cni_ebpf_common::DEFAULT_DNS_MIN_TTL_S).unwrap();
    let mut cluster = cluster();
    cluster.delete_pod("x", "b");
    // The namespace holds a policy that does not select b; b's ADD comes before the
    // agent has seen its pod object.
    let only_a = vec![policy(
        "a-closed",
        json!({"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"]}),
    )];
    agent.reconcile(fx.dp(), &cluster, &only_a).unwrap();
    named_pods(&fx);
    agent.reconcile(fx.dp(), &cluster, &only_a).unwrap();
    assert_eq!(
        fx.run("from_pod", &b_to_a(5555, 80, SYN)).0,
        SHOT,
        "b is closed while its pod is unknown"
    );
    assert!(fx.reason(Reason::DropPolicyEgress) >= 1);
    cluster.apply_pod(&pod("b", &[POD_B.into(), POD_B6.into()]));
    let round = agent.reconcile(fx.dp(), &cluster, &only_a).unwrap();
    assert!(round.swapped, "{round:?}");
    let to_b = udp_frame(EXT, 4000, POD_B, 53);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_B, &to_b).0,
        PASS,
        "b is open now"
    );
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &udp_frame(EXT, 4000, POD_A, 53))
            .0,
        SHOT,
        "a admits nothing"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn with_the_same_node_fast_path_off_pod_traffic_goes_to_the_stack() {
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        same_node_fast_path: false,
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    dual_stack_pods(&fx);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, PASS);
    let a_b6 = tcp6_frame(POD_A6, 40000, POD_B6, 80, POD_MAC_A, HOST_MAC_A);
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &a_b6).0, PASS);
    assert_eq!(fx.reason(Reason::PassPodTrafficToStack), 2);
    assert_eq!(fx.reason(Reason::RedirectPod), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn icmp_errors_about_an_admitted_flow_pass_and_others_do_not() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &b_admits_a_on_80(), 1);
    // a → b:80 admitted; b's stack answers "port unreachable" (b's egress admits nothing).
    let a_b = a_to_b(80, SYN);
    assert_eq!(fx.run("from_pod", &a_b).0, REDIRECT);
    let quote = |f: &[u8]| f[14..14 + 28].to_vec();
    let unreach = |about: &[u8]| {
        frame(
            HOST_MAC_B,
            POD_MAC_B,
            POD_B,
            POD_A,
            ICMP,
            &icmp(3, 3, [0; 4], &quote(about)),
        )
    };
    // ICMP errors between pods go through the stack (which the kernel delivers to a by
    // its host veth's egress).
    assert_eq!(fx.run("from_pod", &unreach(&a_b)).0, PASS);
    assert_eq!(
        fx.run_on("to_pod", IFINDEX_A, &unreach(&a_b)).0,
        PASS,
        "an error about the admitted flow passes as its reply"
    );
    // An error about a flow a never opened is b opening something of its own.
    let never = a_to_b(9999, SYN);
    assert_eq!(fx.run_on("to_pod", IFINDEX_A, &unreach(&never)).0, SHOT);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn replies_of_a_flow_no_rule_judged_pass_the_other_directions_rules() {
    let fx = Fixture::with_two_pods();
    // b admits nothing in; b's egress is open, a is not selected.
    enforce(
        &fx,
        &[policy(
            "b-closed",
            json!({"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"]}),
        )],
        1,
    );
    assert_eq!(fx.run("from_pod", &b_to_a(5555, 8080, SYN)).0, REDIRECT);
    assert_eq!(
        fx.run("from_pod", &a_to_b(8080, SYN | ACK)).0,
        SHOT,
        "a packet to b on another tuple is refused"
    );
    let reply = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        TCP,
        &tcp(POD_A, POD_B, 8080, 5555, SYN | ACK, b"r"),
    );
    assert_eq!(
        fx.run("from_pod", &reply).0,
        REDIRECT,
        "the reply of b's own connection passes b's ingress"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_new_connection_on_an_old_flows_reverse_tuple_is_no_reply() {
    let fx = Fixture::with_two_pods();
    // a may send to b on port 81 only; b is not selected.
    let a_to_81 = [policy(
        "a-to-81",
        json!({"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"port": 81}]}]}),
    )];
    enforce(&fx, &a_to_81, 1);
    // b:80 → a:40000, admitted by no rule, is recorded (a's egress has rules) ...
    assert_eq!(
        fx.run("from_pod", &b_to_a(80, 40000, SYN | ACK)).0,
        REDIRECT
    );
    // ... then the policy is swapped in again (a new generation).
    enforce(&fx, &a_to_81, 10);
    assert_eq!(
        fx.run("from_pod", &a_to_b(80, SYN)).0,
        SHOT,
        "a SYN on the reverse tuple opens a connection a's egress refuses"
    );
    assert_eq!(
        fx.run("from_pod", &a_to_b(80, ACK)).0,
        REDIRECT,
        "a later packet of that tuple is the old flow's reply"
    );

    // The refusal is in the deny log and counted at a.
    let denies = fx.dp().policy_denies().unwrap();
    assert_eq!(denies.len(), 1, "{denies:?}");
    let d = &denies[0];
    assert_eq!(
        (d.direction, d.host_ifindex, d.protocol.as_str()),
        ("egress", IFINDEX_A, "tcp")
    );
    assert_eq!(
        (d.source, d.source_port, d.destination, d.destination_port),
        (IpAddr::from(POD_A), 40000, IpAddr::from(POD_B), 80)
    );
    assert!(d.ruleset.starts_with("rules #"), "{}", d.ruleset);
    let counts = fx.dp().policy_counts().unwrap();
    assert_eq!(counts[&IFINDEX_A].egress_denied, 1, "{counts:?}");
    assert_eq!(counts[&IFINDEX_A].egress_admitted, 0, "{counts:?}");
    assert!(
        !counts.contains_key(&IFINDEX_B),
        "b has no rules: {counts:?}"
    );
}

/// `to_netkit`, a netkit pod's host device's transmit path, judges as `to_pod` does, but
/// finds the pod by destination: the device it runs for is the pod's own interface,
/// whose index (here 2, as in many pods) says nothing. A packet for no pod's address is
/// dropped while policy is enforced.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_netkit_pods_host_device_judges_by_destination() {
    let fx = Fixture::with_two_pods();
    enforce(
        &fx,
        &[policy(
            "b-from-ext",
            json!({
                "podSelector": {"matchLabels": {"app": "b"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": "198.18.0.0/24"}}],
                             "ports": [{"protocol": "UDP", "port": 53}]}],
            }),
        )],
        1,
    );
    let to = |src, dst, dport| {
        frame(
            HOST_MAC_B,
            UPLINK_MAC,
            src,
            dst,
            UDP,
            &udp(src, dst, 4000, dport, b"q", true),
        )
    };
    const POD_IFINDEX: u32 = 2;
    let other = std::net::Ipv4Addr::new(198, 18, 0, 7);
    assert_eq!(
        fx.run_on("to_netkit", POD_IFINDEX, &to(other, POD_B, 53)).0,
        PASS
    );
    assert_eq!(
        fx.run_on("to_netkit", POD_IFINDEX, &to(other, POD_B, 54)).0,
        SHOT
    );
    assert_eq!(
        fx.run_on("to_netkit", POD_IFINDEX, &to(other, POD_A, 54)).0,
        PASS,
        "pod a is selected by no policy"
    );
    assert_eq!(
        fx.run_on("to_netkit", POD_IFINDEX, &to(NODE, POD_B, 9)).0,
        PASS,
        "the node's own traffic is never judged"
    );
    let nobody = std::net::Ipv4Addr::new(10, 244, 1, 99);
    assert_eq!(
        fx.run_on("to_netkit", POD_IFINDEX, &to(other, nobody, 53))
            .0,
        SHOT,
        "no pod has the destination"
    );
}

/// `skb->mark`'s bit for "the reply of an admitted flow, judged before the stack
/// translated it" (`cni-ebpf-bpf/src/policy.rs`, `REPLY_MARK`).
const REPLY_MARK: u32 = 1 << 21;

/// Pod a under `default-deny-ingress` (its ingress refuses all but replies), pod b
/// admitting a on TCP 80.
fn a_closed_b_admits_a_on_80() -> Vec<k8s_openapi::api::networking::v1::NetworkPolicy> {
    let mut p = b_admits_a_on_80();
    p.push(policy(
        "a-deny-ingress",
        json!({
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Ingress"],
        }),
    ));
    p
}

/// A TCP segment `src:sport → dst:dport` with `flags`, arriving on the device whose MACs
/// are `smac`/`dmac`.
fn seg(
    src: std::net::Ipv4Addr,
    sport: u16,
    dst: std::net::Ipv4Addr,
    dport: u16,
    flags: u8,
) -> Vec<u8> {
    frame(
        HOST_MAC_A,
        POD_MAC_A,
        src,
        dst,
        TCP,
        &tcp(src, dst, sport, dport, flags, b"z"),
    )
}

/// A Service connection through kube-proxy, packet by packet as the node's programs see
/// it: a's SYN to the ClusterIP (to the stack, unjudged), the DNATed SYN into b (judged,
/// admitted), b's SYN-ACK (to the stack, being the reply of a Service flow: marked as the
/// reply of the admitted flow), and the SYN-ACK as netfilter's un-DNAT leaves it (from the
/// ClusterIP): into a with the mark, refused by a's ingress without it. A connection the
/// policy refuses (to b's port 81) leaves nothing for its reply-shaped packets to be
/// marked by.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn replies_of_a_service_flow_are_marked_before_the_stack_translates_them() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &a_closed_b_admits_a_on_80(), 1);
    let vip = std::net::Ipv4Addr::new(10, 96, 0, 10);
    const SYN_ACK: u8 = 0x12;

    let (v, _, mark) = fx.run_marked("from_pod", IFINDEX_A, &seg(POD_A, 40000, vip, 80, SYN), 0);
    assert_eq!(
        (v, mark),
        (PASS, 0),
        "a → ClusterIP goes to the stack unmarked"
    );
    let (v, _, _) = fx.run_marked("to_pod", IFINDEX_B, &seg(POD_A, 40000, POD_B, 80, SYN), 0);
    assert_eq!(v, PASS, "the DNATed SYN into b is admitted");
    let (v, _, mark) = fx.run_marked(
        "from_pod",
        IFINDEX_B,
        &seg(POD_B, 80, POD_A, 40000, SYN_ACK),
        0,
    );
    assert_eq!(v, PASS, "b's reply to a Service client goes to the stack");
    assert_eq!(
        mark & REPLY_MARK,
        REPLY_MARK,
        "and is marked as the reply of the admitted flow"
    );
    assert_eq!(fx.reason(Reason::PolicyReplyMarked), 1);

    let un_dnat = seg(vip, 80, POD_A, 40000, SYN_ACK);
    let (v, _, left) = fx.run_marked("to_pod", IFINDEX_A, &un_dnat, REPLY_MARK | 0x4000);
    assert_eq!(v, PASS, "the un-DNATed reply passes with the mark");
    assert_eq!(left, 0x4000, "the bit is taken off, other bits left alone");
    assert_eq!(fx.reason(Reason::PolicyReplyPassed), 1);
    let (v, _, _) = fx.run_marked("to_pod", IFINDEX_A, &un_dnat, 0);
    assert_eq!(v, SHOT, "unmarked, a's ingress refuses it");

    // Refused: a → ClusterIP → b:81.
    let _ = fx.run_marked("from_pod", IFINDEX_A, &seg(POD_A, 40001, vip, 81, SYN), 0);
    let (v, _, _) = fx.run_marked("to_pod", IFINDEX_B, &seg(POD_A, 40001, POD_B, 81, SYN), 0);
    assert_eq!(v, SHOT, "b admits nothing on 81");
    let (v, _, mark) = fx.run_marked(
        "from_pod",
        IFINDEX_B,
        &seg(POD_B, 81, POD_A, 40001, SYN_ACK),
        0,
    );
    assert_eq!(
        (v, mark & REPLY_MARK),
        (PASS, 0),
        "a reply-shaped packet of a refused flow is not marked"
    );
    let (v, _, _) = fx.run_marked("to_pod", IFINDEX_A, &seg(vip, 81, POD_A, 40001, SYN_ACK), 0);
    assert_eq!(v, SHOT, "and is refused by a's ingress once translated");

    // A new policy generation: the flow is judged again, and still admitted.
    enforce(&fx, &a_closed_b_admits_a_on_80(), 10);
    let (_, _, mark) = fx.run_marked("from_pod", IFINDEX_B, &seg(POD_B, 80, POD_A, 40000, ACK), 0);
    assert_eq!(
        mark & REPLY_MARK,
        REPLY_MARK,
        "admitted again under the new generation"
    );
    // One that refuses a: no longer marked.
    enforce(
        &fx,
        &[
            policy(
                "a-deny-ingress",
                json!({"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"]}),
            ),
            policy(
                "b-deny-ingress",
                json!({"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"]}),
            ),
        ],
        20,
    );
    let (_, _, mark) = fx.run_marked("from_pod", IFINDEX_B, &seg(POD_B, 80, POD_A, 40000, ACK), 0);
    assert_eq!(
        mark & REPLY_MARK,
        0,
        "a verdict never outlives the policy that gave it"
    );
}

/// The reply of a Service flow whose backend is on another node comes back by the uplink
/// before the stack un-DNATs it: marked there. So is the reply of a flow the node opened
/// to a pod (its own socket, or a pod's connection netfilter masqueraded to the node's
/// address: hairpin, an external IP): the node's flow is recorded where it leaves the
/// stack (`to_pod`), and the pod's reply to the node's address is marked on its way
/// back. A packet to the node that replies to nothing is not.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn replies_from_other_nodes_and_to_the_node_are_marked_too() {
    let fx = Fixture::with_two_pods();
    enforce(&fx, &a_closed_b_admits_a_on_80(), 1);
    let remote = std::net::Ipv4Addr::new(10, 244, 2, 5);
    // a → a pod of another node, as the DNAT leaves it: a tuple a never sent, so no flow
    // of a's is verified by it and its replies take the stack.
    let (v, _) = fx.run("uplink_egress", &seg(POD_A, 40002, remote, 80, SYN));
    assert_ne!(v, SHOT, "a → a pod of another node (after the DNAT) leaves");
    let back = frame(
        UPLINK_MAC,
        EXT_MAC,
        remote,
        POD_A,
        TCP,
        &tcp(remote, POD_A, 80, 40002, 0x12, b"r"),
    );
    let (v, _, mark) = fx.run_marked("uplink_ingress", 1, &back, 0);
    assert_eq!(v, PASS, "the reply goes to the stack (an unverified flow)");
    assert_eq!(mark & REPLY_MARK, REPLY_MARK);

    // The node opens a flow to a (masqueraded to the pods' gateway, as kube-proxy does a
    // hairpin): recorded where it reaches a.
    let (v, _, _) = fx.run_marked(
        "to_pod",
        IFINDEX_A,
        &seg(GATEWAY, 5000, POD_A, 8080, SYN),
        0,
    );
    assert_eq!(v, PASS, "the node's traffic is never judged");
    let (v, _, mark) = fx.run_marked(
        "from_pod",
        IFINDEX_A,
        &seg(POD_A, 8080, GATEWAY, 5000, 0x12),
        0,
    );
    assert_eq!(
        (v, mark & REPLY_MARK),
        (PASS, REPLY_MARK),
        "a's reply to the node is marked"
    );
    let (_, _, mark) = fx.run_marked(
        "from_pod",
        IFINDEX_A,
        &seg(POD_A, 8080, GATEWAY, 5001, 0x12),
        0,
    );
    assert_eq!(
        mark & REPLY_MARK,
        0,
        "a packet to the node that answers nothing is not"
    );
}

/// The same over IPv6: a Service reply from b marked on its way to the stack, and the
/// un-DNATed reply let into a by its mark alone.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_replies_of_a_service_flow_are_marked_as_ipv4_ones() {
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        node_addr6: Some("fd00:18::2".parse().unwrap()),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    dual_stack_pods(&fx);
    enforce(&fx, &a_closed_b_admits_a_on_80(), 1);
    let vip: Ipv6Addr = "fd00:10:96::10".parse().unwrap();
    let with_flags = |mut f: Vec<u8>, flags: u8| {
        // The TCP flags byte: Ethernet 14 + IPv6 40 + 13.
        f[14 + 40 + 13] = flags;
        f
    };
    let syn_to_vip = tcp6_frame(POD_A6, 40000, vip, 80, POD_MAC_A, HOST_MAC_A);
    let (v, _, mark) = fx.run_marked("from_pod", IFINDEX_A, &syn_to_vip, 0);
    assert_eq!((v, mark), (PASS, 0));
    let dnat = tcp6_frame(POD_A6, 40000, POD_B6, 80, UPLINK_MAC, HOST_MAC_B);
    assert_eq!(fx.run_marked("to_pod", IFINDEX_B, &dnat, 0).0, PASS);
    let reply = with_flags(
        tcp6_frame(POD_B6, 80, POD_A6, 40000, POD_MAC_B, HOST_MAC_B),
        0x12,
    );
    let (v, _, mark) = fx.run_marked("from_pod", IFINDEX_B, &reply, 0);
    assert_eq!((v, mark & REPLY_MARK), (PASS, REPLY_MARK));
    let un_dnat = with_flags(
        tcp6_frame(vip, 80, POD_A6, 40000, UPLINK_MAC, HOST_MAC_A),
        0x12,
    );
    assert_eq!(
        fx.run_marked("to_pod", IFINDEX_A, &un_dnat, REPLY_MARK).0,
        PASS
    );
    assert_eq!(fx.run_marked("to_pod", IFINDEX_A, &un_dnat, 0).0, SHOT);
}
