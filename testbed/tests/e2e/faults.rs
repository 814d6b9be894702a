//! ADD is a transaction: a failure after any step rolls back every earlier one. Each step
//! is made to fail in turn with the fault-injection build of the plugin
//! (`$CNI_EBPF_FAULT_BIN`, `CNI_EBPF_FAIL_AT=<step>`), and an exhausted range is a real
//! cause; afterwards the node, the pod, the store and the datapath are as before.

use std::path::PathBuf;

use serde_json::{json, Value};
use testbed::{
    assert_ping, fault_bin,
    inspect::{host_veths, link},
    ConfBuilder, PluginOutput, Pod, ResultView, SimNode,
};

/// The ADD steps the fault-injection build can fail after, in order.
const STEPS: &[&str] = &[
    "ipam",
    "veth",
    "host-routes",
    "container",
    "datapath",
    "port-mappings",
];

struct Faulty<'a> {
    node: &'a SimNode,
    bin: PathBuf,
}

impl Faulty<'_> {
    fn run(&self, cmd: &str, pod: &Pod, conf: &Value, fail_at: Option<&str>) -> PluginOutput {
        let mut env = pod.env("eth0");
        if let Some(step) = fail_at {
            env = env.with_env("CNI_EBPF_FAIL_AT", step);
        }
        self.node.exec_plugin_bin(&self.bin, cmd, &env, conf)
    }
}

/// Whether the datapath holds anything naming `container_id` (endpoints, host ports).
fn datapath_mentions(node: &SimNode, container_id: &str) -> Vec<String> {
    let Some(dp) = node.datapath("testnet") else {
        return Vec::new();
    };
    ["endpoints", "portMappings"]
        .iter()
        .flat_map(|k| {
            dp.get(*k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .map(|e| e.to_string())
        .filter(|e| e.contains(container_id))
        .collect()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_failure_after_each_add_step_rolls_everything_back() {
    let node = SimNode::new("fault_steps");
    let f = Faulty {
        node: &node,
        bin: fault_bin(),
    };
    let base = node.conf();
    let conf = base
        .clone()
        .set(
            "runtimeConfig",
            json!({ "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }] }),
        )
        .plugin();

    // Node-wide one-time work done, and a neighbour pod that must not be disturbed.
    let other = node.pod("other");
    let _ = f.run("ADD", &other, &base.plugin(), None).result();
    let before = node.snapshot();
    let pins_before = node.pins();
    let pod = node.pod("p");
    let pod_before = pod.snapshot();

    for step in STEPS {
        let out = f.run("ADD", &pod, &conf, Some(step));
        let e = out.error();
        assert!(
            format!("{} {}", e.msg, e.details)
                .contains(&format!("injected failure after step {step}")),
            "ADD failing at {step} should return the injected error: {}",
            out.raw
        );
        let d = node.snapshot().diff(&before);
        assert!(
            d.is_empty(),
            "failure after {step}: the node kept:\n{}",
            d.join("\n")
        );
        let d = pod.snapshot().diff(&pod_before);
        assert!(
            d.is_empty(),
            "failure after {step}: the pod kept:\n{}",
            d.join("\n")
        );
        let store = node.store("testnet");
        assert!(
            !store.has_key(pod.container_id(), "eth0") && store.ips.len() == 2 && store.tmp.is_empty(),
            "failure after {step}: the store should hold only the neighbour's two addresses: {store:#?}"
        );
        assert_eq!(
            node.pins(),
            pins_before,
            "failure after {step}: pins changed"
        );
        let left = datapath_mentions(&node, pod.container_id());
        assert!(
            left.is_empty(),
            "failure after {step}: the datapath kept {left:?}"
        );
        assert!(
            log_has_rollback(&node, step),
            "failure after {step}: the log shows no rollback"
        );
    }

    // Nothing left blocks a clean ADD of the same attachment, and the neighbour is fine.
    let r = ResultView::parse(&f.run("ADD", &pod, &conf, None).result());
    assert_ping(pod.netns(), "10.244.1.1");
    assert_ping(other.netns(), &r.ip4());
    f.run("DEL", &pod, &conf, None).assert_empty_success();
    f.run("DEL", &other, &base.plugin(), None)
        .assert_empty_success();
    node.store("testnet").assert_empty("after every DEL");
}

fn log_has_rollback(node: &SimNode, step: &str) -> bool {
    node.log()
        .lines()
        .any(|l| l.contains("rolling back") && l.contains(step))
}

#[track_caller]
fn exhausted(node: &SimNode, conf: &ConfBuilder) {
    let (a, b) = (node.pod("a"), node.pod("b"));
    let ra = node.add(&a, "eth0", conf);
    assert_eq!(ra.ip4(), "10.244.9.2", "the only usable address: {ra}");
    let before = node.snapshot();
    let b_before = b.snapshot();
    let out = node.exec_plugin("ADD", &b.env("eth0"), &conf.plugin());
    let e = out.error();
    let text = format!("{} {}", e.msg, e.details);
    assert!(
        text.contains("10.244.9."),
        "the exhaustion error should name the range: {}",
        out.raw
    );
    node.snapshot().assert_same_as(&before);
    b.snapshot().assert_same_as(&b_before);
    let store = node.store("testnet");
    assert_eq!(
        store.keys,
        [format!("{}:eth0", a.container_id())],
        "only pod a holds a reservation: {store:#?}"
    );
    assert!(store.tmp.is_empty(), "{store:#?}");
    assert!(
        host_veths(node.netns()).len() == 1 && link(b.netns(), "eth0").is_none(),
        "pod b got an interface"
    );
    node.del(&a, "eth0", conf);
    // Released: b fits now.
    let rb = node.add(&b, "eth0", conf);
    assert_eq!(rb.ip4(), "10.244.9.2");
    node.del(&b, "eth0", conf);
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn an_exhausted_range_fails_cleanly() {
    // A /30 has two usable addresses; the gateway takes one.
    let node = SimNode::new("exhausted");
    exhausted(&node, &node.conf().subnets(&["10.244.9.0/30"]));
    // Dual stack with the IPv6 range first: its address must be released again when the
    // IPv4 range turns out to be full.
    let node = SimNode::new("exhausted6");
    exhausted(
        &node,
        &node
            .conf()
            .subnets(&["fd00:10:244:9::/64", "10.244.9.0/30"]),
    );
}
