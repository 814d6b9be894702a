//! `deploy/cni-ebpf.yaml` parses as the four objects it promises, with what a CNI DaemonSet
//! needs (host network, node-critical priority, tolerations of a node that is not Ready,
//! the host mounts, read-only RBAC on Nodes), and its init container's arguments are ones
//! the real binary accepts: they are run, with the host paths moved into a temporary
//! root, and the conflist they write is parsed by the plugin.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::{path::Path, process::Command};

use cni_ebpf::{
    cli::install::plugin_config,
    cni::{config::NetConf, env::Command as Verb},
};
use serde::Deserialize;
use serde_json::Value;

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/cni-ebpf.yaml");

/// Every document of the manifest, as JSON values.
fn documents() -> Vec<Value> {
    let text = std::fs::read_to_string(MANIFEST).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{MANIFEST}: {e}")))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap_or_else(|| panic!("not a string: {s}")))
        .collect()
}

#[test]
fn the_manifest_holds_rbac_and_a_daemonset() {
    let docs = documents();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet"
        ]
    );

    let sa = kind(&docs, "ServiceAccount");
    let ns = sa["metadata"]["namespace"].as_str().unwrap();
    let role = kind(&docs, "ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(
        rules.len(),
        3,
        "read access to what install, host-gw and policy read; Events"
    );
    assert_eq!(strings(&rules[0]["apiGroups"]), [""]);
    assert_eq!(
        strings(&rules[0]["resources"]),
        ["nodes", "namespaces", "pods"]
    );
    assert_eq!(strings(&rules[1]["apiGroups"]), ["networking.k8s.io"]);
    assert_eq!(strings(&rules[1]["resources"]), ["networkpolicies"]);
    for r in &rules[..2] {
        assert_eq!(strings(&r["verbs"]), ["get", "list", "watch"], "read only");
    }
    assert_eq!(strings(&rules[2]["apiGroups"]), ["events.k8s.io"]);
    assert_eq!(strings(&rules[2]["resources"]), ["events"]);
    assert_eq!(
        strings(&rules[2]["verbs"]),
        ["create", "patch"],
        "Events only"
    );
    let binding = kind(&docs, "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], ns);

    let ds = kind(&docs, "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], ns);
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let tolerations = pod["tolerations"].as_array().unwrap();
    for effect in ["NoSchedule", "NoExecute"] {
        assert!(
            tolerations.iter().any(|t| t["operator"] == "Exists"
                && t["effect"] == effect
                && t.get("key").is_none()),
            "tolerates every {effect} taint"
        );
    }
    assert!(tolerations
        .iter()
        .any(|t| t["key"] == "node.kubernetes.io/not-ready" && t["operator"] == "Exists"));

    // Host paths: the CNI directories, bpffs, the IPAM data, the log directory and the
    // agent's NetworkPolicy state.
    let volumes = pod["volumes"].as_array().unwrap();
    let host_path = |name: &str| -> String {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))["hostPath"]["path"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let mut paths: Vec<String> = volumes
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/etc/cni/net.d",
            "/opt/cni/bin",
            "/run/cni-ebpf/policy",
            "/sys/fs/bpf",
            "/var/lib/cni-ebpf",
            "/var/log"
        ]
    );

    // Every container has resource requests; the one mounting bpffs bidirectionally is
    // privileged (the API server refuses Bidirectional otherwise).
    let containers: Vec<&Value> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["containers"].as_array().unwrap())
        .collect();
    for c in &containers {
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "{}",
            c["name"]
        );
        assert!(
            c["resources"]["requests"]["memory"].is_string(),
            "{}",
            c["name"]
        );
        for m in c["volumeMounts"].as_array().unwrap() {
            assert!(
                volumes.iter().any(|v| v["name"] == m["name"]),
                "mount of an unknown volume {m}"
            );
            if m["mountPropagation"] == "Bidirectional" {
                assert_eq!(c["securityContext"]["privileged"], true, "{}", c["name"]);
            }
        }
    }
    let main = &pod["containers"][0];
    assert_eq!(strings(&main["args"])[0], "agent");
    let bpffs = main["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/sys/fs/bpf")
        .expect("bpffs mounted in the main container");
    assert_eq!(bpffs["mountPropagation"], "Bidirectional");
    assert_eq!(host_path(bpffs["name"].as_str().unwrap()), "/sys/fs/bpf");
}

#[test]
fn the_init_container_runs_install_with_arguments_the_binary_accepts() {
    let docs = documents();
    let pod = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    let args = strings(&init["args"]);
    assert_eq!(args[0], "install");
    let mounts = init["volumeMounts"].as_array().unwrap();
    let volumes = pod["volumes"].as_array().unwrap();
    // Container path → host path of each mount.
    let host_of = |container_path: &str| -> Option<String> {
        let m = mounts.iter().find(|m| m["mountPath"] == container_path)?;
        let v = volumes.iter().find(|v| v["name"] == m["name"])?;
        v["hostPath"]["path"].as_str().map(str::to_owned)
    };

    let root = tempfile::Builder::new()
        .prefix("deploy-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    // The flags naming container paths: each must be a mount of the host's directory, and
    // is moved into the temporary root for the run.
    let mut run_args = Vec::new();
    for a in &args {
        match a.split_once('=') {
            Some((flag @ ("--cni-bin-dir" | "--cni-conf-dir"), path)) => {
                let host = host_of(path).unwrap_or_else(|| panic!("{flag}={path} is not a mount"));
                let expected = if flag == "--cni-bin-dir" {
                    "/opt/cni/bin"
                } else {
                    "/etc/cni/net.d"
                };
                assert_eq!(host, expected, "{flag}");
                run_args.push(format!("{flag}={}", root.path().join(&host[1..]).display()));
            }
            _ => run_args.push((*a).to_owned()),
        }
    }
    // The pod CIDRs come from the Node named by the downward API (the lookup itself runs
    // against the stand-in API server in tests/tests/node_lookup.rs). No API server here:
    // this run gives the CIDR as the documented override, CNI_EBPF_POD_CIDR.
    let env = init["env"].as_array().unwrap();
    assert_node_name_from_downward_api(env);
    assert!(
        !env.iter().any(|e| e["name"] == "CNI_EBPF_POD_CIDR"),
        "the manifest uses the Node lookup, not a fixed CIDR"
    );
    let literal: Vec<(String, String)> = env
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_cni-ebpf"))
        .args(&run_args)
        .env_remove("CNI_COMMAND")
        .env_remove("NODE_NAME")
        .envs(literal)
        .env("CNI_EBPF_POD_CIDR", "10.244.0.0/24")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{run_args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conflist = root.path().join("etc/cni/net.d/10-cni-ebpf.conflist");
    let doc: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    let plugin = plugin_config(&doc).unwrap();
    let conf = NetConf::parse(plugin.to_string().as_bytes(), Verb::Add).unwrap();
    assert!(conf.unknown_keys.is_empty(), "{:?}", conf.unknown_keys);
    assert_eq!(
        conf.version.as_str(),
        "1.0.0",
        "the cniVersion every runtime reads"
    );
    assert!(conf.ip_masq);
    assert!(Path::new(&root.path().join("opt/cni/bin/cni-ebpf")).exists());
}

/// `NODE_NAME` is set from the downward API's `spec.nodeName`.
fn assert_node_name_from_downward_api(env: &[Value]) {
    let node_name = env
        .iter()
        .find(|e| e["name"] == "NODE_NAME")
        .unwrap_or_else(|| panic!("no NODE_NAME in {env:?}"));
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName",
        "{node_name}"
    );
}

#[test]
fn the_main_container_has_host_gw_off_and_its_toggle_reaches_the_binary() {
    let docs = documents();
    let pod = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let main = &pod["containers"][0];
    let env = main["env"].as_array().unwrap();
    assert_node_name_from_downward_api(env);
    let toggle = env
        .iter()
        .find(|e| e["name"] == "CNI_EBPF_HOST_GW")
        .unwrap_or_else(|| panic!("no CNI_EBPF_HOST_GW in {env:?}"));
    assert_eq!(toggle["value"], "false", "host-gw is opt-in");
    // Switched on without a node name, the container's own arguments fail at once, naming
    // what is missing: the variable is read by `agent`, before it listens.
    let args = strings(&main["args"]);
    let out = Command::new(env!("CARGO_BIN_EXE_cni-ebpf"))
        .args(&args)
        .env_remove("CNI_COMMAND")
        .env_remove("NODE_NAME")
        .env("CNI_EBPF_HOST_GW", "true")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--host-gw needs this node's name"), "{err}");
}
