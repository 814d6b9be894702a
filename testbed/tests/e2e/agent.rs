//! The node agent at the edges, against the stand-in API server (`testbed::apiserver`), on
//! one node whose pods `a`, `b` and `c` (namespace `x`) live under one policy: `b` admits
//! only `a`. Throughout every fault, a prober finds `a` → `b` admitted and `c` → `b`
//! refused, every time, and what the API changed meanwhile is in force once the agent
//! has recovered by itself.
//!
//! - Probes: `/healthz` and `/ready` on the node's loopback only, `/metrics` where told;
//!   `/healthz` says "starting" until the first rounds, then fails once a job's loop is
//!   wedged (the fault-injection build hangs it), within `--stall-timeout`; the restarted
//!   agent changes nothing that did not change.
//! - The API server slow (seconds per answer), answering 429 and 500, and compacting its
//!   history under a large paged list (410 on the continue token).
//! - A watch whose connection went silent: the server frozen with the connection open
//!   (ended by the watcher's idle limit, `--watch-timeout` + 5 s), and the peer gone
//!   without a word (every packet of the open connections dropped: TCP keepalive, 25 s).

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use serde_json::json;
use testbed::{
    datapath::{masq_conf, pod_ip, wait_until, Mode, TaggedServer},
    net::http_get,
    netpol::{add_published, policy_object, probe::greets},
    process::Background,
    ApiServer, Pod, SimNode, EXT_IP4, NODE_IP4,
};

/// Where the agents of these tests serve `/metrics`: the node's address.
fn metrics_addr() -> SocketAddr {
    SocketAddr::new(NODE_IP4.parse().unwrap_or_else(|e| panic!("{e}")), 9670)
}

/// Where the probes are served by default: the node's loopback.
const PROBES: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9671);

/// One node, its API server, pods `a`, `b`, `c` of namespace `x` and `b`'s server.
struct World {
    node: SimNode,
    api: ApiServer,
    pods: Vec<(Pod, String)>,
    _server: TaggedServer,
    log: PathBuf,
}

impl World {
    /// The pods ADDed, their objects and namespace `x` in the API, and `b-from-a`: `b`
    /// admits only `a`. No agent yet: on this network (`networkPolicy`) the pods stay
    /// closed until one has put the policy in force.
    fn new(test: &str) -> Self {
        let node = SimNode::new(test);
        let api = ApiServer::start(node.ext_netns(), EXT_IP4);
        let ns = testbed::netpol::namespace("x", &[("ns", "x")]);
        api.put("namespaces", serde_json::to_value(&ns).unwrap_or_default());
        let conf = masq_conf(&node).set("networkPolicy", json!(true));
        let mut pods = Vec::new();
        for name in ["a", "b", "c"] {
            let pod = node.pod(name);
            let ip = add_published(&node, &api, &conf.plugin(), &pod, "x", name);
            pods.push((pod, ip));
        }
        api.put(
            "networkpolicies",
            policy_object(
                "x",
                "b-from-a",
                json!({"podSelector": {"matchLabels": {"app": "b"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}),
            ),
        );
        let server = TaggedServer::start(pods[1].0.netns(), 8080, "b", Mode::Greet);
        let log = node.dir().join("agent.log");
        Self {
            node,
            api,
            pods,
            _server: server,
            log,
        }
    }

    /// `cni-ebpf agent` (the build `bin`) as its container runs it, with `extra`
    /// arguments and `env`, `/metrics` on the node's address, the probes on their
    /// default address.
    fn start_agent(&self, bin: &Path, extra: &[&str], env: &[(&str, String)]) -> Background {
        let (listen, state) = (
            metrics_addr().to_string(),
            self.state_dir().display().to_string(),
        );
        let mut args = vec!["agent", "--listen", &listen, "--state-dir", &state];
        args.extend_from_slice(extra);
        let argv = testbed::process::as_agent_container(self.api.agent_argv(
            bin,
            self.node.pin_root(),
            &args,
        ));
        let mut with_env: Vec<String> = vec!["env".into()];
        with_env.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        with_env.extend(argv);
        Background::spawn_logged(self.node.netns(), &with_env, &self.log)
    }

    fn state_dir(&self) -> PathBuf {
        self.node.dir().join("policy-state")
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` of the agent at `addr`, in the node's namespace: (status, body), or
    /// `(0, why)` when nothing answered.
    fn get(&self, addr: SocketAddr, path: &str) -> (u16, String) {
        http_get(self.node.netns(), addr, path, Duration::from_secs(2))
            .map_or_else(|e| (0, e.to_string()), |(status, _, body)| (status, body))
    }

    /// Waits (bounded) until `/ready` answers 200: the policy is in force.
    #[track_caller]
    fn wait_ready(&self, within: Duration) {
        let mut seen = (0, String::new());
        assert!(
            wait_until(within, || {
                seen = self.get(PROBES, "/ready");
                seen.0 == 200
            }),
            "the agent was not ready within {within:?}: {seen:?}\n{}",
            self.agent_log()
        );
    }

    fn to_b(&self) -> String {
        format!("{}:8080", self.pods[1].1)
    }

    /// Whether `a` reaches `b` (one retry against a slow machine) and `c` does not.
    fn verdicts_right(&self) -> bool {
        let to_b = self.to_b();
        let a = greets(self.pods[0].0.netns(), &to_b, Duration::from_secs(1))
            || greets(self.pods[0].0.netns(), &to_b, Duration::from_secs(2));
        let c = greets(self.pods[2].0.netns(), &to_b, Duration::from_millis(200));
        a && !c
    }

    /// Puts `a-from-b-<tag>`, a policy that selects `a` (so its state names it) and
    /// changes nothing of what `a` and `c` may send to `b`.
    fn put_marker(&self, tag: &str) {
        self.api.put(
            "networkpolicies",
            policy_object(
                "x",
                &format!("a-from-b-{tag}"),
                json!({"podSelector": {"matchLabels": {"app": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]}),
            ),
        );
    }

    /// Whether the marker `tag` is in force (the agent's state file names it for `a`).
    fn marker_in_force(&self, tag: &str) -> bool {
        std::fs::read_to_string(self.state_dir().join("testnet.json"))
            .is_ok_and(|s| s.contains(&format!("x/a-from-b-{tag}")))
    }

    /// Puts marker `tag` and waits until it is in force; returns how long that took.
    #[track_caller]
    fn marker_takes_effect(&self, tag: &str, within: Duration) -> Duration {
        let started = Instant::now();
        self.put_marker(tag);
        assert!(
            wait_until(within, || self.marker_in_force(tag)),
            "{tag}: the policy put was not in force within {within:?}\n{}",
            self.agent_log()
        );
        started.elapsed()
    }

    /// Runs `faults` while a prober checks the verdicts all along; panics on a wrong one.
    fn probed(&self, faults: impl FnOnce()) {
        let stop = AtomicBool::new(false);
        let (probes, wrong) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(240)
                {
                    probes.fetch_add(1, Ordering::Relaxed);
                    if !self.verdicts_right() {
                        wrong.fetch_add(1, Ordering::Relaxed);
                        eprintln!("wrong verdict at {:?}", started.elapsed());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            // Stops the prober also when `faults` panics, so the test ends at once.
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = StopOnDrop(&stop);
            faults();
        });
        let (probes, wrong) = (probes.into_inner(), wrong.into_inner());
        eprintln!("{probes} probe rounds over {:?}", started.elapsed());
        assert!(probes >= 5, "only {probes} probe rounds");
        assert_eq!(
            wrong,
            0,
            "{wrong} of {probes} probe rounds found a wrong verdict\n{}",
            self.agent_log()
        );
    }
}

/// The probes listen on the node's loopback and `/metrics` where told; `/healthz` is 503
/// "starting" while the agent cannot list the cluster, 200 once its first rounds are
/// made, and 503 naming the job within `--stall-timeout` of its loop being wedged; the
/// pinned policy stays in force meanwhile, and the agent restarted (as the kubelet
/// restarts it on a failed liveness probe) changes nothing, since nothing changed.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn healthz_says_starting_then_fails_within_its_bound_once_a_job_is_wedged() {
    let w = World::new("agent_healthz");
    let hang = w.node.dir().join("hang");
    w.api.forbid(true);
    let env = [
        ("CNI_EBPF_HANG_AT", "agent-policy-loop".to_owned()),
        ("CNI_EBPF_HANG_WHEN", hang.display().to_string()),
    ];
    let fault_bin = testbed::plugin::fault_bin();
    let stall = ["--stall-timeout", "3"];
    let agent = w.start_agent(&fault_bin, &stall, &env);

    // Starting: the API server refuses the agent's lists.
    let mut seen = (0, String::new());
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen = w.get(PROBES, "/healthz");
            seen.0 == 503
        }),
        "no 503 from /healthz while the agent cannot list: {seen:?}\n{}",
        w.agent_log()
    );
    assert_eq!(
        seen.1, "starting: NetworkPolicy has not made its first round yet\n",
        "{seen:?}"
    );
    // Where each endpoint is served, and where it is not.
    let (status, metrics) = w.get(metrics_addr(), "/metrics");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("\ncni_ebpf_agent_alive 0\n"), "{metrics}");
    assert!(
        metrics.contains("cni_ebpf_agent_api_failures_total{resource=\"pods\"}"),
        "the refused lists are counted: {metrics}"
    );
    assert_eq!(w.get(metrics_addr(), "/healthz").0, 404);
    let loopback_metrics = SocketAddr::new(PROBES.ip(), 9670);
    assert_eq!(
        w.get(loopback_metrics, "/metrics").0,
        0,
        "/metrics on loopback"
    );
    let node_probes = SocketAddr::new(metrics_addr().ip(), PROBES.port());
    assert_eq!(
        w.get(node_probes, "/healthz").0,
        0,
        "the probes must not listen on the node's address"
    );

    // Alive once the first round is made.
    w.api.forbid(false);
    assert!(
        wait_until(Duration::from_secs(30), || {
            seen = w.get(PROBES, "/healthz");
            seen == (200, "ok\n".to_owned())
        }),
        "/healthz not 200 after the API server let the agent in: {seen:?}\n{}",
        w.agent_log()
    );
    w.wait_ready(Duration::from_secs(10));
    assert!(w.verdicts_right(), "the policy is not in force");
    let generation = w.node.policy_generation();

    // Wedged: the policy loop hangs for good.
    std::fs::write(&hang, b"").unwrap_or_else(|e| panic!("{e}"));
    let wedged = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), || {
            seen = w.get(PROBES, "/healthz");
            seen.0 == 503
        }),
        "/healthz still {seen:?} 15 s after the policy loop hung\n{}",
        w.agent_log()
    );
    eprintln!(
        "/healthz failed {:?} after the policy loop hung (--stall-timeout 3): {}",
        wedged.elapsed(),
        seen.1.trim()
    );
    assert!(
        seen.1
            .contains("NetworkPolicy: its loop has not come round for")
            && seen.1.contains("(bound 3 s)"),
        "{seen:?}"
    );
    assert!(
        w.verdicts_right(),
        "the pinned policy left force with the wedged agent"
    );

    // Restarted as the kubelet would: alive again, and nothing swapped.
    drop(agent);
    std::fs::remove_file(&hang).unwrap_or_else(|e| panic!("{e}"));
    let _agent = w.start_agent(&fault_bin, &stall, &env);
    assert!(
        wait_until(Duration::from_secs(30), || w.get(PROBES, "/healthz").0
            == 200),
        "the restarted agent is not alive\n{}",
        w.agent_log()
    );
    w.wait_ready(Duration::from_secs(10));
    assert_eq!(
        w.node.policy_generation(),
        generation,
        "the restarted agent swapped although nothing changed"
    );
    assert!(w.verdicts_right());
}

/// The API server slow (2 s per answer), answering 429 and 500, and compacting its
/// history under the agent's paged relist of 2 000 pods (its continue token answered
/// 410): the agent recovers by itself each time, no verdict is wrong meanwhile, and what
/// changed during each fault is in force after it.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_agent_rides_out_a_slow_failing_and_compacting_api_server() {
    let w = World::new("agent_api_faults");
    // A server without streaming lists (the agent's first choice): the agent falls back
    // to lists, the Pods in pages, whose relists the compactions below interrupt.
    w.api.set_streaming_lists(false);
    // Enough pods elsewhere that a relist takes several pages (500 each).
    for i in 0..2000 {
        let ip: IpAddr = format!("10.250.{}.{}", i / 250, i % 250 + 1)
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let obj = testbed::netpol::pod("filler", &format!("f{i}"), &[("app", "filler")], &[ip]);
        w.api
            .put("pods", serde_json::to_value(&obj).unwrap_or_default());
    }
    let _agent = w.start_agent(&testbed::plugin_bin(), &[], &[]);
    w.wait_ready(Duration::from_secs(30));
    w.probed(|| {
        // Slow: every answer held back 2 s, watches cut so they must start again.
        w.api.set_delay(Duration::from_secs(2));
        w.api.drop_watches();
        let took = w.marker_takes_effect("slow", Duration::from_secs(30));
        eprintln!("slow API server: a policy put was in force after {took:?}");
        w.api.set_delay(Duration::ZERO);

        // Overloaded: 429, then failing: 500, each for the next 9 requests (three
        // failed attempts of each watcher, retried with its backoff).
        for code in [429, 500] {
            w.api.fail_next(code, 9);
            w.api.drop_watches();
            let took = w.marker_takes_effect(&code.to_string(), Duration::from_secs(60));
            eprintln!("{code} for 9 requests: a policy put was in force after {took:?}");
        }

        // Compacted under a paged relist: the resumed watches find their version gone
        // (an ERROR 410 event), the pods are listed again page by page (slowly), the
        // history is compacted once more after the first page, so the next page's
        // continue token is refused (410) and the list starts over. A pod added
        // meanwhile must be among `b`'s peers once the agent is through.
        let before = w.api.requests().len();
        w.api.set_delay(Duration::from_millis(300));
        w.api.drop_watches();
        // A change the dropped watches have not seen, compacted away: they cannot resume.
        let bump = testbed::netpol::namespace("bump", &[]);
        w.api.put(
            "namespaces",
            serde_json::to_value(&bump).unwrap_or_default(),
        );
        w.api.compact();
        let relisting = || {
            w.api.requests()[before..]
                .iter()
                .any(|r| r == "GET /api/v1/pods -> 200")
        };
        assert!(
            wait_until(Duration::from_secs(60), relisting),
            "the pods were not listed again after the compaction: {:?}\n{}",
            &w.api.requests()[before..],
            w.agent_log()
        );
        let late: IpAddr = "10.244.7.7".parse().unwrap_or_else(|e| panic!("{e}"));
        let obj = testbed::netpol::pod("x", "a-late", &[("app", "a")], &[late]);
        w.api
            .put("pods", serde_json::to_value(&obj).unwrap_or_default());
        w.put_marker("compacted");
        w.api.compact();
        let knows_late = || {
            w.marker_in_force("compacted")
                && w.node
                    .exec(&w.node.inspect_argv(&[]))
                    .stdout
                    .contains("10.244.7.7")
        };
        assert!(
            wait_until(Duration::from_secs(60), knows_late),
            "the pod added under the compactions is not among b's peers\n{}",
            w.agent_log()
        );
        w.api.set_delay(Duration::ZERO);
        let gone = w.api.requests()[before..]
            .iter()
            .filter(|r| *r == "GET /api/v1/pods -> 410")
            .count();
        eprintln!("compactions: {gone} continued pod lists answered 410");
        assert!(
            gone >= 1,
            "no continued pod list was refused: {:?}",
            &w.api.requests()[before..]
        );
    });
    let (status, body) = w.get(PROBES, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"), "{}", w.agent_log());
}

/// A watch whose server fell silent with the connection open is ended by the watcher's
/// idle limit (`--watch-timeout` 4 s + 5 s) and started again; the change made
/// meanwhile is in force within that bound and the retry's.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_silent_watch_is_cut_by_its_idle_limit_and_started_again() {
    let w = World::new("agent_frozen");
    let _agent = w.start_agent(&testbed::plugin_bin(), &["--watch-timeout", "4"], &[]);
    w.wait_ready(Duration::from_secs(30));
    w.probed(|| {
        w.api.freeze_watches();
        let took = w.marker_takes_effect("frozen", Duration::from_secs(30));
        eprintln!("frozen watches: a policy put was in force after {took:?} (idle limit 9 s)");
        assert!(
            took >= Duration::from_secs(5),
            "in force after {took:?}: the frozen watch cannot have told the agent"
        );
    });
}

/// The open connections to the API server dropped without a word (every packet of them
/// dropped on the node, as after a moved address or a lost NAT entry): TCP keepalive
/// ends them within 10 + 3 × 5 s, the watchers start again on new connections, and the
/// change made meanwhile is in force.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_dead_peer_is_noticed_by_keepalive_and_the_watches_start_again() {
    let w = World::new("agent_keepalive");
    let _agent = w.start_agent(&testbed::plugin_bin(), &[], &[]);
    w.wait_ready(Duration::from_secs(30));
    // The agent's connections now: local ports on the node to the API server.
    let ss = w
        .node
        .exec(&["ss", "-tnH", "state", "established", "dst", EXT_IP4]);
    let ports: Vec<String> = ss
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|local| local.rsplit_once(':').map(|(_, p)| p.to_owned()))
        .collect();
    assert!(
        !ports.is_empty(),
        "no connection to the API server: {}",
        ss.stdout
    );
    let set = ports.join(", ");
    let rules = format!(
        "table inet cut {{
            chain out {{ type filter hook output priority 0; tcp sport {{ {set} }} drop; }}
            chain in {{ type filter hook input priority 0; tcp dport {{ {set} }} drop; }}
        }}"
    );
    let nft =
        testbed::process::netns_exec_input(w.node.netns(), &["nft", "-f", "-"], rules.as_bytes());
    assert!(nft.success(), "nft: {}", nft.stderr);
    w.probed(|| {
        let took = w.marker_takes_effect("dead-peer", Duration::from_secs(60));
        eprintln!(
            "{} connections dropped silently: a policy put was in force after {took:?} \
             (keepalive: 25 s)",
            ports.len()
        );
        assert!(
            took >= Duration::from_secs(10),
            "in force after {took:?}: the dropped watch cannot have told the agent"
        );
    });
}

/// An agent gone for good (its DaemonSet deleted, or crash-looping beyond its lease):
/// once its lease on the policy has run out (`--policy-lease 3` here, 60 s by default),
/// ADD closes every new pod, also in a namespace without policies, since policies made
/// meanwhile would not be enforced; the pods it had opened keep their rules, and so do
/// those under policy. An agent back opens the new pods as their policies say.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn new_pods_are_closed_once_no_agent_holds_the_policy_lease() {
    let w = World::new("agent_lease");
    let free = testbed::netpol::namespace("free", &[("ns", "free")]);
    w.api.put(
        "namespaces",
        serde_json::to_value(&free).unwrap_or_default(),
    );
    let _c_server = TaggedServer::start(w.pods[2].0.netns(), 8080, "c", Mode::Greet);
    let to_c = format!("{}:8080", w.pods[2].1);
    let conf = masq_conf(&w.node).set("networkPolicy", json!(true));
    let add_free = |name: &str| {
        let pod = w.node.pod(name);
        let env = pod
            .env("eth0")
            .with_args(&format!("K8S_POD_NAMESPACE=free;K8S_POD_NAME={name}"));
        let ip = pod_ip(&w.node.exec_plugin("ADD", &env, &conf.plugin()).result());
        let addr: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"));
        let obj = testbed::netpol::pod("free", name, &[("app", name)], &[addr]);
        w.api
            .put("pods", serde_json::to_value(&obj).unwrap_or_default());
        pod
    };
    let lease = ["--policy-lease", "3"];
    let agent = w.start_agent(&testbed::plugin_bin(), &lease, &[]);
    w.wait_ready(Duration::from_secs(30));

    // With the agent: a pod of a namespace without policies starts open.
    let d1 = add_free("d1");
    assert!(
        greets(d1.netns(), &to_c, Duration::from_secs(1)),
        "d1 (no policy selects it) is not open with the agent running\n{}",
        w.agent_log()
    );

    // The agent gone, its lease run out: a new pod there is closed; the rest unchanged.
    drop(agent);
    std::thread::sleep(Duration::from_secs(4));
    let inspect = w.node.exec(&w.node.inspect_argv(&[]));
    assert!(
        inspect.stdout.contains("agent lease: ran out"),
        "{}",
        inspect.stdout
    );
    let d2 = add_free("d2");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert!(
            !greets(d2.netns(), &to_c, Duration::from_millis(200)),
            "d2 was open with no agent holding the policy lease"
        );
    }
    assert!(
        greets(d1.netns(), &to_c, Duration::from_secs(1)),
        "d1 lost its rules"
    );
    assert!(w.verdicts_right(), "the pinned policy left force");

    // An agent back opens it.
    let _agent = w.start_agent(&testbed::plugin_bin(), &lease, &[]);
    let back = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), || greets(
            d2.netns(),
            &to_c,
            Duration::from_millis(300)
        )),
        "d2 stayed closed with the agent back\n{}",
        w.agent_log()
    );
    eprintln!("the agent back opened d2 after {:?}", back.elapsed());
    let inspect = w.node.exec(&w.node.inspect_argv(&[]));
    assert!(
        inspect.stdout.contains("agent lease: held for"),
        "{}",
        inspect.stdout
    );
}
