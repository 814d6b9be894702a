//! The spec 1.1.0 verbs, invoked directly (libcni 1.1.2 has neither): STATUS reports
//! readiness with error 50 when ADD could not work; GC removes every attachment not listed
//! as valid and leaves the listed ones working.

use serde_json::json;
use testbed::{
    assert_ping,
    inspect::{host_alias, host_veths, link, main_routes},
    CniEnv, ConfBuilder, Pod, ResultView, SimNode, NODE_IP4, NODE_IP6,
};

/// STATUS: no container, only `CNI_COMMAND` and `CNI_PATH` matter (the others are set but
/// empty, as libcni does).
fn status(node: &SimNode, conf: &ConfBuilder) -> testbed::PluginOutput {
    node.exec_plugin("STATUS", &CniEnv::default(), &conf.plugin())
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn status_succeeds_on_a_fresh_node_before_any_add() {
    // Nothing pinned, no store yet: ADD would load and create them, so the plugin is
    // ready (spec: STATUS succeeds when the plugin can service ADD). A runtime that gates
    // pods on STATUS would otherwise never start the first pod.
    let node = SimNode::new("status_fresh");
    let conf = node.conf().version("1.1.0");
    status(&node, &conf).assert_empty_success();
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn status_succeeds_when_healthy_and_fails_with_50_when_add_could_not_work() {
    let node = SimNode::new("status");
    let conf = node.conf().version("1.1.0");
    let pod = node.pod("p");
    node.add(&pod, "eth0", &conf);
    status(&node, &conf).assert_empty_success();

    // The data dir cannot be created (its parent is a regular file).
    let file = node.dir().join("regular-file");
    std::fs::write(&file, b"").ok();
    let bad = conf.clone().set("dataDir", json!(file.join("data")));
    let e = status(&node, &bad).assert_error(50);
    assert!(!e.msg.is_empty(), "{e:?}");

    // bpffsRoot is not on a bpf filesystem.
    let bad = conf
        .clone()
        .set("bpffsRoot", json!(node.dir().join("no-bpffs")));
    let e = status(&node, &bad).assert_error(50);
    assert!(
        format!("{e:?}").contains("bpf"),
        "the error should say bpffs is missing: {e:?}"
    );

    // No address left: a /30 whose one usable address is taken.
    let small = conf.clone().name("smallnet").subnets(&["10.244.9.0/30"]);
    let p2 = node.pod("q");
    node.add(&p2, "eth0", &small);
    let e = status(&node, &small).assert_error(50);
    assert!(
        format!("{e:?}").contains("10.244.9."),
        "name the full range: {e:?}"
    );
    node.del(&p2, "eth0", &small);
    status(&node, &small).assert_empty_success();
    node.del(&pod, "eth0", &conf);
}

fn gc(node: &SimNode, conf: &ConfBuilder, valid: &[&Pod]) {
    let attachments: Vec<_> = valid
        .iter()
        .map(|p| json!({ "containerID": p.container_id(), "ifname": "eth0" }))
        .collect();
    let conf = conf
        .clone()
        .set("cni.dev/valid-attachments", json!(attachments));
    node.exec_plugin("GC", &CniEnv::default(), &conf.plugin())
        .assert_empty_success();
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn gc_removes_what_is_not_valid_and_keeps_the_valid_pod_working() {
    let node = SimNode::new("gc");
    let conf = node.conf().version("1.1.0");
    node.warm_up(&conf);
    let before = node.snapshot();
    let pins_before = node.pins();
    let (a, b) = (node.pod("a"), node.pod("b"));
    let ra: ResultView = node.add(&a, "eth0", &conf);
    let rb: ResultView = node.add(&b, "eth0", &conf);
    let b_host = rb.host_interface().name.clone();

    gc(&node, &conf, &[&a]);

    // b: host veth (and so its eth0), node routes, reservation, endpoint entries gone.
    let veths: Vec<Option<String>> = host_veths(node.netns())
        .into_iter()
        .map(|l| l.alias)
        .collect();
    assert_eq!(
        veths,
        [Some(host_alias("testnet", a.container_id(), "eth0"))],
        "only a's host veth may remain"
    );
    assert!(link(b.netns(), "eth0").is_none(), "b's eth0 survived GC");
    let stale: Vec<String> = main_routes(node.netns())
        .iter()
        .filter(|r| {
            r.dev.as_deref() == Some(b_host.as_str())
                || r.dst == format!("{}/32", rb.ip4())
                || r.dst == format!("{}/128", rb.ip6())
        })
        .map(ToString::to_string)
        .collect();
    assert!(stale.is_empty(), "b's node routes survived GC: {stale:?}");
    let store = node.store("testnet");
    assert_eq!(
        store.keys,
        [format!("{}:eth0", a.container_id())],
        "only a's reservation may remain: {store:#?}"
    );
    assert_eq!(store.ips.len(), 2, "a's two addresses: {store:#?}");
    let eps = node.endpoints("testnet");
    assert!(
        !eps.iter().any(|e| e.to_string().contains(b.container_id())),
        "b's endpoint entries survived GC: {eps:?}"
    );
    let pins: Vec<_> = node
        .pins()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&b_host))
        .collect();
    assert!(pins.is_empty(), "b's pins survived GC: {pins:?}");

    // a keeps working and CHECK still agrees.
    for dst in [NODE_IP4, NODE_IP6, "10.244.1.1"] {
        assert_ping(a.netns(), dst);
    }
    assert_ping(node.netns(), &ra.ip4());
    assert_ping(node.netns(), &ra.ip6());
    node.check(&a, "eth0", &conf, &ra.raw)
        .assert_empty_success();

    // GC with nothing valid: the node is as before the pods.
    gc(&node, &conf, &[]);
    let d = node.snapshot().diff(&before);
    assert!(d.is_empty(), "GC of everything left:\n{}", d.join("\n"));
    node.store("testnet").assert_empty("after GC of everything");
    assert_eq!(node.pins(), pins_before, "pins after GC of everything");
    assert!(
        node.endpoints("testnet").is_empty(),
        "endpoint entries left"
    );
    // DEL after GC is still fine.
    node.del(&a, "eth0", &conf);
    node.del(&b, "eth0", &conf);
}
