//! `cni-ebpf inspect` names the Kubernetes pod of each endpoint (from the
//! `K8S_POD_*` args of its ADD, kept in the IPAM record) and shows one pod or one namespace
//! on request: its endpoints, host ports and NAT entries only.

use serde_json::{json, Value};
use testbed::{assert_ping, Pod, SimNode, EXT_IP4, POD_SUBNET_V4};

/// `cni-ebpf inspect` with `extra` arguments, in the node namespace.
fn inspect(node: &SimNode, extra: &[&str]) -> testbed::Output {
    node.exec(&node.inspect_argv(extra))
}

fn json_of(node: &SimNode, extra: &[&str]) -> Value {
    let mut a = extra.to_vec();
    a.push("--json");
    let out = inspect(node, &a);
    assert!(out.success(), "inspect {extra:?} failed: {out}");
    out.json()
}

fn pods_in(doc: &Value) -> Vec<String> {
    let mut v: Vec<String> = doc["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| match (&e["pod"]["namespace"], &e["pod"]["name"]) {
            (Value::String(ns), Value::String(n)) => format!("{ns}/{n}"),
            _ => "-".to_owned(),
        })
        .collect();
    v.sort();
    v
}

fn add_as(
    node: &SimNode,
    pod: &Pod,
    conf: &testbed::ConfBuilder,
    k8s: Option<(&str, &str)>,
) -> Value {
    let mut env = pod.env("eth0");
    if let Some((ns, name)) = k8s {
        env = env.with_args(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};\
             K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=uid-{name}",
            pod.container_id()
        ));
    }
    node.exec_plugin("ADD", &env, &conf.plugin()).result()
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn inspect_names_each_pod_and_shows_one_pod_on_request() {
    let node = SimNode::new("inspect_pods");
    let conf = node
        .conf()
        .version("1.0.0")
        .subnets(&[POD_SUBNET_V4])
        .masquerading("10.244.0.0/16");
    let web = node.pod("web");
    let db = node.pod("db");
    let bare = node.pod("bare");
    let web_conf = conf.clone().set(
        "runtimeConfig",
        json!({ "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }] }),
    );
    add_as(&node, &web, &web_conf, Some(("shop", "web-7d9f")));
    add_as(&node, &db, &conf, Some(("data", "db-0")));
    // Not every runtime is kubelet: a pod without K8S_POD_* has no name, and says so.
    add_as(&node, &bare, &conf, None);
    // A masqueraded flow of web's, so that it has NAT entries to show.
    assert_ping(web.netns(), EXT_IP4);

    let all = json_of(&node, &[]);
    assert_eq!(
        pods_in(&all),
        ["-", "data/db-0", "shop/web-7d9f"],
        "{all:#}"
    );
    let web_ep = all["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["pod"]["name"] == "web-7d9f")
        .cloned()
        .unwrap_or_default();
    assert_eq!(web_ep["pod"]["uid"], "uid-web-7d9f", "{web_ep}");
    let text = inspect(&node, &[]).ok().to_owned();
    assert!(
        text.contains("shop/web-7d9f") && text.contains("data/db-0"),
        "the table names the pods: {text}"
    );

    // One pod: its endpoint, its host port, its NAT entries; nobody else's.
    for sel in [
        &["--pod", "shop/web-7d9f"][..],
        &["--pod", "web-7d9f"],
        &["-n", "shop"],
    ] {
        let one = json_of(&node, sel);
        assert_eq!(pods_in(&one), ["shop/web-7d9f"], "{sel:?}: {one:#}");
        let ports = one["portMappings"].as_array().cloned().unwrap_or_default();
        assert_eq!(ports.len(), 1, "{sel:?}: web's host port: {one:#}");
        let ip = web_ep["ip"].as_str().unwrap_or_default();
        let nat = one["nat"].as_array().cloned().unwrap_or_default();
        assert!(
            !nat.is_empty(),
            "{sel:?}: web's masqueraded ping has NAT entries: {one:#}"
        );
        assert!(
            nat.iter()
                .all(|n| [&n["src"], &n["dst"], &n["new_src"], &n["new_dst"]]
                    .iter()
                    .any(|a| a.as_str() == Some(ip))),
            "{sel:?}: only NAT entries of web ({ip}): {nat:#?}"
        );
    }
    let db_only = json_of(&node, &["--pod", "db-0"]);
    assert_eq!(pods_in(&db_only), ["data/db-0"]);
    assert!(
        db_only["portMappings"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "db has no host port: {db_only:#}"
    );
    assert!(
        db_only["nat"].as_array().is_some_and(Vec::is_empty),
        "{db_only:#}"
    );

    // A pod that is not there is an error that says how pods are known.
    let none = inspect(&node, &["--pod", "shop/nope"]);
    assert!(
        !none.success(),
        "inspect of a missing pod succeeded: {none}"
    );
    assert!(
        none.stderr.contains("pod shop/nope") && none.stderr.contains("K8S_POD_NAME"),
        "{none}"
    );
    // Wrong namespace for an existing name: not found either.
    assert!(!inspect(&node, &["--pod", "data/web-7d9f"]).success());

    for p in [&web, &db, &bare] {
        node.exec_plugin("DEL", &p.env("eth0"), &conf.plugin())
            .assert_empty_success();
    }
    assert!(pods_in(&json_of(&node, &[])).is_empty());
}
