//! The cases of the upstream NetworkPolicy e2e suite (kubernetes
//! `test/e2e/network/netpol/network_policy.go`), re-expressed as data over [`Universe`]:
//! each case is a sequence of steps; a step changes the cluster (policies, labels) and
//! then probes the 3 × 3 pod matrix on one port and protocol, expecting the reachability
//! upstream expects.

use std::{collections::BTreeMap, net::Ipv4Addr};

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};

use super::{pod_string, Protocol, Universe, NAMESPACES, PODS};

/// One upstream test.
#[derive(Debug, Clone)]
pub struct Case {
    /// Upstream's test name (the `ginkgo.It` text).
    pub name: &'static str,
    /// What is done and probed, in order.
    pub steps: Vec<Step>,
}

/// Changes to the cluster, then probes of the result.
#[derive(Debug, Clone)]
pub struct Step {
    pub changes: Vec<Change>,
    pub probes: Vec<Probe>,
}

/// A change to the cluster's objects.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "a few dozen test-table values; the policy reads best unboxed"
)]
pub enum Change {
    /// Creates the policy, or replaces the one of the same namespace and name.
    Apply(NetworkPolicy),
    /// Deletes the policy `namespace/name`.
    Delete { namespace: String, name: String },
    /// Replaces a namespace's labels.
    NamespaceLabels {
        namespace: String,
        labels: Vec<(String, String)>,
    },
    /// Replaces a pod's labels.
    PodLabels {
        namespace: String,
        pod: String,
        labels: Vec<(String, String)>,
    },
}

/// Every pod connects to every pod on `port` over `protocol`; `reachability` says which
/// connections succeed.
#[derive(Debug, Clone)]
pub struct Probe {
    pub port: u16,
    pub protocol: Protocol,
    pub reachability: Reachability,
}

/// Which side of a probe a selector picks: a namespace, a pod name, both or neither
/// (upstream's `Peer{Namespace, Pod}`: an empty field matches every value).
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerSel<'a> {
    pub namespace: Option<&'a str>,
    pub pod: Option<&'a str>,
}

impl PeerSel<'_> {
    fn matches(&self, ns_pod: &str) -> bool {
        let (ns, pod) = ns_pod.split_once('/').unwrap_or((ns_pod, ""));
        self.namespace.is_none_or(|n| n == ns) && self.pod.is_none_or(|p| p == pod)
    }
}

/// The expected outcome of every (from, to) pair of pods, keyed by `ns/pod` strings
/// (upstream's `Reachability`). A pod always reaches itself (upstream probes loopback as
/// connected whatever the policies say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachability {
    pub expected: BTreeMap<(String, String), bool>,
}

impl Reachability {
    /// Every pair `connected`, loopback always connected.
    #[must_use]
    pub fn new(connected: bool) -> Self {
        let all = all_pods();
        let mut expected = BTreeMap::new();
        for from in &all {
            for to in &all {
                expected.insert((from.clone(), to.clone()), connected || from == to);
            }
        }
        Self { expected }
    }

    /// One pair.
    pub fn expect(&mut self, from: &str, to: &str, connected: bool) -> &mut Self {
        if from != to {
            self.expected
                .insert((from.to_owned(), to.to_owned()), connected);
        }
        self
    }

    /// Every pair whose source matches `from` and destination matches `to`.
    pub fn expect_peer(
        &mut self,
        from: PeerSel<'_>,
        to: PeerSel<'_>,
        connected: bool,
    ) -> &mut Self {
        for ((f, t), v) in &mut self.expected {
            if f != t && from.matches(f) && to.matches(t) {
                *v = connected;
            }
        }
        self
    }

    /// Every pair whose destination is `pod` (`ns/pod`).
    pub fn expect_all_ingress(&mut self, pod: &str, connected: bool) -> &mut Self {
        self.expect_peer(PeerSel::default(), split(pod), connected)
    }

    /// Every pair whose source is `pod` (`ns/pod`).
    pub fn expect_all_egress(&mut self, pod: &str, connected: bool) -> &mut Self {
        self.expect_peer(split(pod), PeerSel::default(), connected)
    }
}

fn split(ns_pod: &str) -> PeerSel<'_> {
    let (ns, pod) = ns_pod.split_once('/').unwrap_or((ns_pod, ""));
    PeerSel {
        namespace: Some(ns),
        pod: Some(pod),
    }
}

/// Every pod of the universe as `ns/pod`.
#[must_use]
pub fn all_pods() -> Vec<String> {
    NAMESPACES
        .iter()
        .flat_map(|ns| PODS.iter().map(move |p| pod_string(ns, p)))
        .collect()
}

/// The upstream cases, over `universe` (whose pod addresses the ipBlock cases use).
///
/// Source: kubernetes `test/e2e/network/netpol/network_policy.go`, the three `Describe`
/// blocks (TCP, `[LinuxOnly]` UDP, `[Feature:SCTPConnectivity]` SCTP): 48 `It`s, all
/// expressed here, in upstream's order. None needs anything outside this universe
/// (upstream's newer revisions create only the pods a case looks at; the older ones and
/// this table run every case over all 9 pods). Translation notes:
///
/// - Expectations are those of the 9-pod revision of the suite (every pod of x, y, z
///   probed). They equal the newer subset revision's on the pods it keeps; two calls
///   that only matter with all pods present come from the 9-pod revision: "should
///   enforce policy to allow ingress traffic for a target" also denies all ingress to
///   x/c, and "should enforce policy based on Multiple PodSelectors and
///   NamespaceSelectors" also denies z/a → x/a.
/// - Upstream selects namespaces by `kubernetes.io/metadata.name=<ns>`; here by the
///   universe's `ns=<ns>` label (the same namespaces). The two "…using default ns label"
///   cases are about that automatic label itself, so their first step adds it to x, y
///   and z (`NamespaceLabels`) before applying a policy that selects by it.
/// - Upstream's label additions (`AddNamespaceLabel`, `AddPodLabels`) merge into the
///   existing labels; [`Change::NamespaceLabels`]/[`Change::PodLabels`] replace them, so
///   they carry the original `ns=`/`pod=` label too.
/// - ipBlock cases use the IPv4 address of the pod upstream reads the address of; the
///   large CIDR of the except cases is upstream's `makeLargeCIDRForIP`: the /4 holding
///   that address, network address masked.
/// - The UDP and SCTP blocks reuse It texts of the TCP block, so their names are
///   prefixed with their `Context` text ("NetworkPolicy between server and client using
///   UDP " / "… using SCTP ") to keep names unique.
/// - Upstream's `cleanNetworkPolicies` ("should stop enforcing policies after they are
///   deleted") deletes every policy; the only one present is `x/deny-all`, so the step
///   deletes that.
#[must_use]
pub fn cases(universe: &Universe) -> Vec<Case> {
    use Protocol::{Sctp, Tcp, Udp};

    let mut cases = vec![
        case(
            "should support a 'default-deny-ingress' policy",
            vec![step(
                vec![apply("x", "deny-ingress", deny_ingress_spec())],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ANY, ns("x"), false);
                    }),
                )],
            )],
        ),
        case(
            "should support a 'default-deny-all' policy",
            vec![step(
                vec![apply("x", "deny-all", deny_all_spec())],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ANY, ns("x"), false)
                            .expect_peer(ns("x"), ANY, false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy to allow traffic from pods within server namespace based on \
                PodSelector",
            vec![step(
                vec![apply(
                    "x",
                    "x-a-allows-x-b",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": pod_is("b")}]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false)
                            .expect("x/b", "x/a", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic for a target",
            vec![step(
                vec![
                    apply("x", "deny-all", deny_ingress_spec()),
                    apply(
                        "x",
                        "allow-all-to-a",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {}}]}],
                        }),
                    ),
                ],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", true)
                            .expect_all_ingress("x/b", false)
                            .expect_all_ingress("x/c", false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy to allow ingress traffic from pods in all namespaces",
            vec![step(
                vec![apply(
                    "x",
                    "allow-from-another-ns",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {}}}]}],
                    }),
                )],
                vec![probe(80, Tcp, Reachability::new(true))],
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a different namespace, based on \
                NamespaceSelector",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-ns-selector",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"namespaceSelector": ns_is("y")}]}],
                    }),
                )],
                vec![probe(80, Tcp, only_y_reaches_xa())],
            )],
        ),
        case(
            "should enforce policy based on PodSelector with MatchExpressions",
            vec![step(
                vec![apply(
                    "x",
                    "x-a-allows-x-b",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": label_in("pod", &["b"])}]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false)
                            .expect("x/b", "x/a", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-match-selector",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"namespaceSelector": label_in("ns", &["y"])}]}],
                    }),
                )],
                vec![probe(80, Tcp, only_y_reaches_xa())],
            )],
        ),
        case(
            "should enforce policy based on PodSelector or NamespaceSelector",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-match-selector",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [
                            {"namespaceSelector": label_not_in("ns", &["x"])},
                            {"podSelector": pod_is("b")},
                        ]}],
                    }),
                )],
                // Upstream also expects x/a → x/a denied: loopback, ignored.
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect("x/c", "x/a", false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy based on PodSelector and NamespaceSelector",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-podselector-and-nsselector",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{
                            "namespaceSelector": label_not_in("ns", &["x"]),
                            "podSelector": pod_is("b"),
                        }]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false)
                            .expect("y/b", "x/a", true)
                            .expect("z/b", "x/a", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-z-pod-b-c",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{
                            "namespaceSelector": label_not_in("ns", &["x"]),
                            "podSelector": label_in("pod", &["b", "c"]),
                        }]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ns("x"), the("x", "a"), false)
                            .expect("y/a", "x/a", false)
                            .expect("z/a", "x/a", false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy based on any PodSelectors",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-x-pod-b-c",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [
                            {"podSelector": pod_is("b")},
                            {"podSelector": pod_is("c")},
                        ]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false)
                            .expect("x/b", "x/a", true)
                            .expect("x/c", "x/a", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy to allow traffic only from a pod in a different namespace \
                based on PodSelector and NamespaceSelector",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-pod-a-via-namespace-pod-selector",
                    only_ya_to_xa_spec(),
                )],
                vec![probe(80, Tcp, only_ya_reaches_xa())],
            )],
        ),
        case(
            "should enforce policy based on Ports",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-ns-selector",
                    from_y_on_port_spec(json!(81), Tcp),
                )],
                vec![probe(81, Tcp, only_y_reaches_xa())],
            )],
        ),
        case(
            "should enforce multiple, stacked policies with overlapping podSelectors",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-ns-selector",
                        from_y_on_port_spec(json!(81), Tcp),
                    )],
                    vec![
                        probe(81, Tcp, only_y_reaches_xa()),
                        probe(
                            80,
                            Tcp,
                            reach(|r| {
                                r.expect_all_ingress("x/a", false);
                            }),
                        ),
                    ],
                ),
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-ns-selector-80",
                        from_y_on_port_spec(json!(80), Tcp),
                    )],
                    vec![probe(80, Tcp, only_y_reaches_xa())],
                ),
            ],
        ),
        case(
            "should support allow-all policy",
            vec![step(
                vec![apply("x", "allow-all", allow_all_ingress_spec())],
                vec![
                    probe(80, Tcp, Reachability::new(true)),
                    probe(81, Tcp, Reachability::new(true)),
                ],
            )],
        ),
        case(
            "should allow ingress access on one named port",
            vec![step(
                vec![apply(
                    "x",
                    "allow-all",
                    json!({
                        "podSelector": {},
                        "policyTypes": ["Ingress"],
                        "ingress": [{"ports": [{"port": "serve-81-tcp"}]}],
                    }),
                )],
                vec![
                    probe(81, Tcp, Reachability::new(true)),
                    probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ANY, ns("x"), false);
                        }),
                    ),
                ],
            )],
        ),
        case(
            "should allow ingress access from namespace on one named port",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-ns-selector-80",
                    from_y_on_port_spec(json!("serve-80-tcp"), Tcp),
                )],
                vec![
                    probe(80, Tcp, only_y_reaches_xa()),
                    probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false);
                        }),
                    ),
                ],
            )],
        ),
        case(
            "should allow egress access on one named port",
            vec![step(
                vec![apply(
                    "x",
                    "allow-egress",
                    json!({
                        "podSelector": {},
                        "policyTypes": ["Egress"],
                        "egress": [{"ports": [{"port": "serve-80-tcp"}]}],
                    }),
                )],
                vec![
                    probe(80, Tcp, Reachability::new(true)),
                    probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ns("x"), ANY, false);
                        }),
                    ),
                ],
            )],
        ),
        case(
            "should enforce updated policy",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-all-mutate-to-deny-all",
                        allow_all_ingress_spec(),
                    )],
                    vec![probe(81, Tcp, Reachability::new(true))],
                ),
                step(
                    vec![apply(
                        "x",
                        "allow-all-mutate-to-deny-all",
                        deny_ingress_spec(),
                    )],
                    vec![probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ANY, ns("x"), false);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should allow ingress access from updated namespace",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-ns-selector",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [
                                {"namespaceSelector": {"matchLabels": {"ns2": "updated"}}},
                            ]}],
                        }),
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false);
                        }),
                    )],
                ),
                step(
                    vec![namespace_labels("y", &[("ns", "y"), ("ns2", "updated")])],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false)
                                .expect_peer(ns("y"), ANY, true);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should allow ingress access from updated pod",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-pod-selector",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [
                                {"podSelector": {"matchLabels": {"pod": "b", "pod2": "updated"}}},
                            ]}],
                        }),
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false);
                        }),
                    )],
                ),
                step(
                    vec![pod_labels("x", "b", &[("pod", "b"), ("pod2", "updated")])],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false)
                                .expect("x/b", "x/a", true);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should deny ingress from pods on other namespaces",
            vec![step(
                vec![apply(
                    "x",
                    "deny-empty-policy",
                    json!({
                        "podSelector": {},
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {}}}]}],
                    }),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ns("y"), ns("x"), false)
                            .expect_peer(ns("z"), ns("x"), false);
                    }),
                )],
            )],
        ),
        case(
            "should deny ingress access to updated pod",
            vec![
                step(
                    vec![apply(
                        "x",
                        "deny-ingress-via-label-selector",
                        json!({
                            "podSelector": {"matchLabels": {"target": "isolated"}},
                            "policyTypes": ["Ingress"],
                            "ingress": [],
                        }),
                    )],
                    vec![probe(80, Tcp, Reachability::new(true))],
                ),
                step(
                    vec![pod_labels(
                        "x",
                        "a",
                        &[("pod", "a"), ("target", "isolated")],
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should deny egress from pods based on PodSelector",
            vec![step(
                vec![apply(
                    "x",
                    "deny-egress-pod-a",
                    json!({"podSelector": pod_is("a"), "policyTypes": ["Egress"], "egress": []}),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_egress("x/a", false);
                    }),
                )],
            )],
        ),
        case(
            "should deny egress from all pods in a namespace",
            vec![step(
                vec![apply(
                    "x",
                    "deny-egress-ns-x",
                    json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": []}),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ns("x"), ANY, false);
                    }),
                )],
            )],
        ),
        case(
            "should work with Ingress, Egress specified together",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-pod-selector",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Egress", "Ingress"],
                        "ingress": [{"from": [{"podSelector": pod_is("b")}]}],
                        "egress": [{"ports": [{"port": 80}]}],
                    }),
                )],
                vec![
                    probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false)
                                .expect("x/b", "x/a", true);
                        }),
                    ),
                    probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false)
                                .expect_all_egress("x/a", false)
                                .expect("x/b", "x/a", true);
                        }),
                    ),
                ],
            )],
        ),
        case(
            "should support denying of egress traffic on the client side (even if the server \
                explicitly allows this traffic)",
            vec![step(
                vec![
                    apply("x", "allow-to-ns-y-pod-a", only_xa_to_ya_spec()),
                    apply(
                        "y",
                        "allow-from-xa-on-ya-match-selector",
                        only_from_xa_spec("a"),
                    ),
                    apply(
                        "y",
                        "allow-from-xa-on-yb-match-selector",
                        only_from_xa_spec("b"),
                    ),
                ],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(the("x", "a"), ANY, false)
                            .expect_peer(ANY, the("y", "a"), false)
                            .expect_peer(the("x", "a"), the("y", "a"), true)
                            .expect_peer(ANY, the("y", "b"), false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce egress policy allowing traffic to a server in a different namespace \
                based on PodSelector and NamespaceSelector",
            vec![step(
                vec![apply("x", "allow-to-ns-y-pod-a", only_xa_to_ya_spec())],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_egress("x/a", false).expect("x/a", "y/a", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce ingress policy allowing any port traffic to a server on a specific \
                protocol",
            vec![step(
                vec![apply(
                    "x",
                    "allow-ingress-by-proto",
                    json!({
                        "podSelector": pod_is("a"),
                        "policyTypes": ["Ingress"],
                        "ingress": [{"ports": [{"protocol": "TCP"}]}],
                    }),
                )],
                vec![
                    probe(80, Tcp, Reachability::new(true)),
                    probe(
                        80,
                        Udp,
                        reach(|r| {
                            r.expect_peer(ANY, the("x", "a"), false);
                        }),
                    ),
                ],
            )],
        ),
        case(
            "should enforce multiple ingress policies with ingress allow-all policy taking \
                precedence",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-ingress-port-80",
                        json!({
                            "podSelector": {},
                            "policyTypes": ["Ingress"],
                            "ingress": [{"ports": [{"port": 80}]}],
                        }),
                    )],
                    vec![probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ANY, ns("x"), false);
                        }),
                    )],
                ),
                step(
                    vec![apply("x", "allow-ingress", allow_all_ingress_spec())],
                    vec![probe(81, Tcp, Reachability::new(true))],
                ),
            ],
        ),
        case(
            "should enforce multiple egress policies with egress allow-all policy taking \
                precedence",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-egress-port-80",
                        json!({
                            "podSelector": {},
                            "policyTypes": ["Egress"],
                            "egress": [{"ports": [{"port": 80}]}],
                        }),
                    )],
                    vec![probe(
                        81,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ns("x"), ANY, false);
                        }),
                    )],
                ),
                step(
                    vec![apply(
                        "x",
                        "allow-egress",
                        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
                    )],
                    vec![probe(81, Tcp, Reachability::new(true))],
                ),
            ],
        ),
        case(
            "should stop enforcing policies after they are deleted",
            vec![
                step(
                    vec![apply("x", "deny-all", deny_all_spec())],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_peer(ns("x"), ANY, false)
                                .expect_peer(ANY, ns("x"), false);
                        }),
                    )],
                ),
                step(
                    vec![delete("x", "deny-all")],
                    vec![probe(80, Tcp, Reachability::new(true))],
                ),
            ],
        ),
        case(
            "should allow egress access to server in CIDR block",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-cidr-egress-rule",
                    xa_egress_to_ip_block(json!({"cidr": host_cidr(universe, "y", "b")})),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_all_egress("x/a", false).expect("x/a", "y/b", true);
                    }),
                )],
            )],
        ),
        case(
            "should enforce except clause while egress access to server in CIDR block",
            vec![step(
                vec![apply(
                    "x",
                    "allow-client-a-via-cidr-egress-rule",
                    xa_egress_to_ip_block(json!({
                        "cidr": large_cidr(universe, "x", "b"),
                        "except": [host_cidr(universe, "x", "b")],
                    })),
                )],
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect("x/a", "x/b", false);
                    }),
                )],
            )],
        ),
        case(
            "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-cidr-egress-rule",
                        xa_egress_to_ip_block(json!({
                            "cidr": large_cidr(universe, "x", "b"),
                            "except": [host_cidr(universe, "x", "b")],
                        })),
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect("x/a", "x/b", false);
                        }),
                    )],
                ),
                // Upstream updates the same policy (same name) to allow only x/b's /32.
                step(
                    vec![apply(
                        "x",
                        "allow-client-a-via-cidr-egress-rule",
                        xa_egress_to_ip_block(json!({"cidr": host_cidr(universe, "x", "b")})),
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_egress("x/a", false).expect("x/a", "x/b", true);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should enforce policies to check ingress and egress policies can be controlled \
                independently based on PodSelector",
            vec![
                step(
                    vec![apply(
                        "x",
                        "allow-egress-for-target",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Egress"],
                            "egress": [{}],
                        }),
                    )],
                    vec![probe(80, Tcp, Reachability::new(true))],
                ),
                step(
                    vec![apply(
                        "x",
                        "deny-ingress-via-label-selector",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Ingress"],
                            "ingress": [],
                        }),
                    )],
                    vec![probe(
                        80,
                        Tcp,
                        reach(|r| {
                            r.expect_all_ingress("x/a", false);
                        }),
                    )],
                ),
            ],
        ),
        case(
            "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the \
                plugin doesn't support SCTP",
            vec![step(
                vec![
                    apply("x", "deny-ingress", deny_ingress_spec()),
                    apply(
                        "x",
                        "allow-only-sctp-ingress-on-port-81",
                        xa_ingress_on_port_spec(81, Sctp),
                    ),
                ],
                vec![probe(
                    81,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(ANY, ns("x"), false);
                    }),
                )],
            )],
        ),
        case(
            "should properly isolate pods that are selected by a policy allowing SCTP, even if \
                the plugin doesn't support SCTP",
            vec![step(
                vec![apply(
                    "x",
                    "allow-only-sctp-ingress-on-port-80",
                    xa_ingress_on_port_spec(80, Sctp),
                )],
                vec![probe(
                    81,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false);
                    }),
                )],
            )],
        ),
        case(
            "should not allow access by TCP when a policy specifies only UDP",
            vec![step(
                vec![apply(
                    "x",
                    "allow-only-udp-ingress-on-port-81",
                    xa_ingress_on_port_spec(81, Udp),
                )],
                vec![probe(
                    81,
                    Tcp,
                    reach(|r| {
                        r.expect_all_ingress("x/a", false);
                    }),
                )],
            )],
        ),
        case(
            "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels \
                using default ns label",
            vec![step(
                {
                    let mut changes = default_ns_labels();
                    changes.push(apply(
                        "x",
                        "allow-client-a-via-ns-selector-for-immutable-ns-label",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [
                                {"namespaceSelector": {"matchLabels": {METADATA_NAME: "y"}}},
                            ]}],
                        }),
                    ));
                    changes
                },
                vec![probe(80, Tcp, only_y_reaches_xa())],
            )],
        ),
        case(
            "should enforce policy based on NamespaceSelector with MatchExpressions using \
                default ns label",
            vec![step(
                {
                    let mut changes = default_ns_labels();
                    changes.push(apply(
                        "x",
                        "allow-ns-y-match-selector-for-immutable-ns-label",
                        json!({
                            "podSelector": pod_is("a"),
                            "policyTypes": ["Egress"],
                            "egress": [{"to": [
                                {"namespaceSelector": label_not_in(METADATA_NAME, &["y"])},
                            ]}],
                        }),
                    ));
                    changes
                },
                vec![probe(
                    80,
                    Tcp,
                    reach(|r| {
                        r.expect_peer(the("x", "a"), ns("y"), false);
                    }),
                )],
            )],
        ),
    ];

    // The UDP and SCTP blocks: the same three cases, over their protocol.
    for (protocol, names) in [
        (
            Udp,
            [
                "NetworkPolicy between server and client using UDP should support a \
                    'default-deny-ingress' policy",
                "NetworkPolicy between server and client using UDP should enforce policy based \
                    on Ports",
                "NetworkPolicy between server and client using UDP should enforce policy to \
                    allow traffic only from a pod in a different namespace based on PodSelector \
                    and NamespaceSelector",
            ],
        ),
        (
            Sctp,
            [
                "NetworkPolicy between server and client using SCTP should support a \
                    'default-deny-ingress' policy",
                "NetworkPolicy between server and client using SCTP should enforce policy based \
                    on Ports",
                "NetworkPolicy between server and client using SCTP should enforce policy to \
                    allow traffic only from a pod in a different namespace based on PodSelector \
                    and NamespaceSelector",
            ],
        ),
    ] {
        let [deny, ports, pod_and_ns] = names;
        cases.push(case(
            deny,
            vec![step(
                vec![apply("x", "deny-all", deny_ingress_spec())],
                vec![probe(
                    80,
                    protocol,
                    reach(|r| {
                        r.expect_peer(ANY, ns("x"), false);
                    }),
                )],
            )],
        ));
        cases.push(case(
            ports,
            vec![step(
                vec![apply(
                    "x",
                    "allow-ingress-on-port-81-ns-x",
                    from_y_on_port_spec(json!(81), protocol),
                )],
                vec![probe(81, protocol, only_y_reaches_xa())],
            )],
        ));
        cases.push(case(
            pod_and_ns,
            vec![step(
                vec![apply(
                    "x",
                    "allow-ns-y-pod-a-via-namespace-pod-selector",
                    only_ya_to_xa_spec(),
                )],
                vec![probe(80, protocol, only_ya_reaches_xa())],
            )],
        ));
    }

    cases
}

/// The label the API server puts on every namespace (upstream's `v1.LabelMetadataName`).
const METADATA_NAME: &str = "kubernetes.io/metadata.name";

/// Matches any namespace or pod.
const ANY: PeerSel<'static> = PeerSel {
    namespace: None,
    pod: None,
};

/// Every pod of namespace `namespace`.
fn ns(namespace: &str) -> PeerSel<'_> {
    PeerSel {
        namespace: Some(namespace),
        pod: None,
    }
}

/// The pod `namespace/pod`.
fn the<'a>(namespace: &'a str, pod: &'a str) -> PeerSel<'a> {
    PeerSel {
        namespace: Some(namespace),
        pod: Some(pod),
    }
}

fn case(name: &'static str, steps: Vec<Step>) -> Case {
    Case { name, steps }
}

fn step(changes: Vec<Change>, probes: Vec<Probe>) -> Step {
    Step { changes, probes }
}

fn probe(port: u16, protocol: Protocol, reachability: Reachability) -> Probe {
    Probe {
        port,
        protocol,
        reachability,
    }
}

/// Everything connected, then `edit`.
fn reach(edit: impl FnOnce(&mut Reachability)) -> Reachability {
    let mut r = Reachability::new(true);
    edit(&mut r);
    r
}

/// Only namespace y reaches x/a (x and z do not); the rest is connected.
fn only_y_reaches_xa() -> Reachability {
    reach(|r| {
        r.expect_peer(ns("x"), the("x", "a"), false)
            .expect_peer(ns("z"), the("x", "a"), false);
    })
}

/// Only y/a reaches x/a; the rest is connected.
fn only_ya_reaches_xa() -> Reachability {
    reach(|r| {
        r.expect_all_ingress("x/a", false)
            .expect("y/a", "x/a", true);
    })
}

/// The NetworkPolicy `namespace/name` with `spec`, as the API takes it.
fn policy(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
    let object = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    });
    serde_json::from_value(object)
        .unwrap_or_else(|e| panic!("malformed NetworkPolicy {namespace}/{name}: {e}"))
}

fn apply(namespace: &str, name: &str, spec: Value) -> Change {
    Change::Apply(policy(namespace, name, spec))
}

fn delete(namespace: &str, name: &str) -> Change {
    Change::Delete {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

fn owned_labels(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn namespace_labels(namespace: &str, labels: &[(&str, &str)]) -> Change {
    Change::NamespaceLabels {
        namespace: namespace.to_owned(),
        labels: owned_labels(labels),
    }
}

fn pod_labels(namespace: &str, pod: &str, labels: &[(&str, &str)]) -> Change {
    Change::PodLabels {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        labels: owned_labels(labels),
    }
}

/// Gives x, y and z the `kubernetes.io/metadata.name` label the API server would have
/// set, next to their `ns` label.
fn default_ns_labels() -> Vec<Change> {
    NAMESPACES
        .iter()
        .map(|n| namespace_labels(n, &[("ns", n), (METADATA_NAME, n)]))
        .collect()
}

/// `{"matchLabels": {"pod": name}}`.
fn pod_is(name: &str) -> Value {
    json!({"matchLabels": {"pod": name}})
}

/// `{"matchLabels": {"ns": name}}`.
fn ns_is(name: &str) -> Value {
    json!({"matchLabels": {"ns": name}})
}

/// A selector with the one requirement `key In values`.
fn label_in(key: &str, values: &[&str]) -> Value {
    json!({"matchExpressions": [{"key": key, "operator": "In", "values": values}]})
}

/// A selector with the one requirement `key NotIn values`.
fn label_not_in(key: &str, values: &[&str]) -> Value {
    json!({"matchExpressions": [{"key": key, "operator": "NotIn", "values": values}]})
}

/// Isolates every pod of the namespace for ingress, allowing nothing.
fn deny_ingress_spec() -> Value {
    json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []})
}

/// Isolates every pod of the namespace both ways, allowing nothing.
fn deny_all_spec() -> Value {
    json!({
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    })
}

/// Every pod of the namespace accepts everything.
fn allow_all_ingress_spec() -> Value {
    json!({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]})
}

/// Pods `pod=a` accept namespace y on `port` (number or name) over `protocol`.
fn from_y_on_port_spec(port: Value, protocol: Protocol) -> Value {
    json!({
        "podSelector": pod_is("a"),
        "policyTypes": ["Ingress"],
        "ingress": [{
            "from": [{"namespaceSelector": ns_is("y")}],
            "ports": [{"port": port, "protocol": protocol.api_name()}],
        }],
    })
}

/// Pods `pod=a` accept anyone on `port` over `protocol`.
fn xa_ingress_on_port_spec(port: u16, protocol: Protocol) -> Value {
    json!({
        "podSelector": pod_is("a"),
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"port": port, "protocol": protocol.api_name()}]}],
    })
}

/// Pods `pod=a` accept only y/a (namespace and pod selector in one peer).
fn only_ya_to_xa_spec() -> Value {
    json!({
        "podSelector": pod_is("a"),
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": ns_is("y"), "podSelector": pod_is("a")}]}],
    })
}

/// Pods `pod=a` may only connect to y/a.
fn only_xa_to_ya_spec() -> Value {
    json!({
        "podSelector": pod_is("a"),
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": ns_is("y"), "podSelector": pod_is("a")}]}],
    })
}

/// Pods `pod=<pod>` accept only x/a.
fn only_from_xa_spec(pod: &str) -> Value {
    json!({
        "podSelector": pod_is(pod),
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": ns_is("x"), "podSelector": pod_is("a")}]}],
    })
}

/// Pods `pod=a` may only connect to `ip_block`.
fn xa_egress_to_ip_block(ip_block: Value) -> Value {
    json!({
        "podSelector": pod_is("a"),
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": ip_block}]}],
    })
}

/// The IPv4 address of pod `namespace/pod` (panics if the universe gives it none).
fn pod_ipv4(universe: &Universe, namespace: &str, pod: &str) -> Ipv4Addr {
    universe
        .pod(namespace, pod)
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .find_map(|ip| ip.ip.parse::<Ipv4Addr>().ok())
        .unwrap_or_else(|| panic!("pod {namespace}/{pod} has no IPv4 address"))
}

/// `<ip>/32` of pod `namespace/pod`.
fn host_cidr(universe: &Universe, namespace: &str, pod: &str) -> String {
    format!("{}/32", pod_ipv4(universe, namespace, pod))
}

/// The /4 holding the address of pod `namespace/pod` (upstream's `makeLargeCIDRForIP`).
fn large_cidr(universe: &Universe, namespace: &str, pod: &str) -> String {
    let ip = u32::from(pod_ipv4(universe, namespace, pod));
    format!("{}/4", Ipv4Addr::from(ip & !(u32::MAX >> 4)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_upstream_case_once() {
        let all = cases(&Universe::upstream());
        assert_eq!(all.len(), 48);
        let names: BTreeSet<_> = all.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), all.len(), "case names must be unique");
        for name in names {
            assert!(name.starts_with("should ") || name.starts_with("NetworkPolicy "));
            assert!(!name.contains("  ") && !name.contains('\\'), "{name:?}");
        }
    }

    #[test]
    fn cases_are_well_formed() {
        let universe = Universe::upstream();
        for case in cases(&universe) {
            assert!(!case.steps.is_empty(), "{}", case.name);
            for step in &case.steps {
                assert!(!step.probes.is_empty(), "{}", case.name);
                for change in &step.changes {
                    if let Change::Apply(p) = change {
                        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                        assert!(universe.namespace(ns).is_some(), "{}", case.name);
                        assert!(p.spec.is_some(), "{}", case.name);
                    }
                }
                for probe in &step.probes {
                    assert_eq!(probe.reachability.expected.len(), 81, "{}", case.name);
                }
            }
        }
    }

    #[test]
    fn default_ns_label_cases_select_by_that_label() {
        let all = cases(&Universe::upstream());
        let c = all
            .iter()
            .find(|c| c.name.ends_with("with MatchLabels using default ns label"))
            .unwrap_or_else(|| panic!("case missing"));
        let labels = c.steps[0].changes.iter().find_map(|change| match change {
            Change::Apply(p) => p
                .spec
                .as_ref()
                .and_then(|s| s.ingress.as_ref())
                .and_then(|rules| rules[0].from.as_ref())
                .and_then(|from| from[0].namespace_selector.as_ref())
                .and_then(|sel| sel.match_labels.clone()),
            _ => None,
        });
        let want = BTreeMap::from([(METADATA_NAME.to_owned(), "y".to_owned())]);
        assert_eq!(labels, Some(want));
    }

    #[test]
    fn ip_blocks_use_pod_addresses() {
        let universe = Universe::upstream();
        assert_eq!(host_cidr(&universe, "x", "b"), "10.244.1.11/32");
        assert_eq!(host_cidr(&universe, "y", "b"), "10.244.1.14/32");
        assert_eq!(large_cidr(&universe, "x", "b"), "0.0.0.0/4");
    }

    #[test]
    fn expectations_match_upstream_tables() {
        let all = cases(&Universe::upstream());
        let find = |name: &str| {
            all.iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no case {name}"))
        };
        // The client-side egress case's table, as upstream draws it: rows are sources,
        // columns destinations (x/a x/b x/c y/a y/b y/c z/a z/b z/c), `.` connected.
        let table = [
            "X X X . X X X X X",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
            ". . . X X . . . .",
        ];
        let c = find(
            "should support denying of egress traffic on the client side \
             (even if the server explicitly allows this traffic)",
        );
        let r = &c.steps[0].probes[0].reachability;
        let pods = all_pods();
        for (from, row) in pods.iter().zip(table) {
            for (to, cell) in pods.iter().zip(row.split(' ')) {
                let want = from == to || cell == ".";
                assert_eq!(
                    r.expected[&(from.clone(), to.clone())],
                    want,
                    "{from} -> {to}"
                );
            }
        }
    }
}
