//! The manifests in `deploy/`, as `kubectl kustomize` renders them: the base (routed
//! mode), each overlay and the uninstall DaemonSet.
//!
//! - Every rendered object is one the Kubernetes API knows: it parses into its
//!   `k8s-openapi` type (every required field present) and serializes back to exactly the
//!   same document (no field the API would drop).
//! - The base holds what a CNI DaemonSet needs (host network, node-critical priority,
//!   tolerations of a node that is not Ready, read-only RBAC, an unprivileged agent with
//!   the capabilities it uses and the host mounts it reads).
//! - The containers' arguments and the ConfigMap's settings are ones the real binary
//!   accepts: `install` is run with them (the host paths moved into a temporary root) in
//!   every mode, and the conflist it writes is parsed by the plugin; the agent's host-gw
//!   toggle reaches it; the uninstall DaemonSet's command removes what `install` wrote
//!   and stays running.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use cni_ebpf::{
    cli::install::plugin_config,
    cni::{config::NetConf, env::Command as Verb},
};
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    serde::{de::DeserializeOwned, Deserialize, Serialize},
};
use serde_json::Value;

/// The kustomizations: the directory below `deploy/`, and the `crossNode` and host-gw
/// setting it stands for (`None`: not a mode, the uninstall DaemonSet).
const RENDERINGS: &[(&str, Option<(&str, bool)>)] = &[
    ("base", Some(("routed", false))),
    ("overlays/host-gw", Some(("routed", true))),
    ("overlays/tunnel", Some(("tunnel", false))),
    ("overlays/cross-subnet", Some(("crossSubnet", false))),
    ("uninstall", None),
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every document `kubectl kustomize deploy/<dir>` renders, as JSON values.
fn rendered(dir: &str) -> Vec<Value> {
    let path = deploy_dir().join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("kubectl kustomize (cargo xtask setup installs kubectl): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{dir}: {e}")))
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

/// `doc` parses as a `T` and serializes back to itself.
fn round_trips<T: DeserializeOwned + Serialize>(dir: &str, doc: &Value) {
    let name = format!("{dir}: {} {}", doc["kind"], doc["metadata"]["name"]);
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{name} is not a valid object: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, doc,
        "{name}: a field the API does not know (it was dropped on the way through)"
    );
}

#[test]
fn every_rendering_is_made_of_objects_the_api_knows() {
    for (dir, _) in RENDERINGS {
        let docs = rendered(dir);
        assert!(!docs.is_empty(), "{dir} renders nothing");
        for doc in &docs {
            match doc["kind"].as_str().unwrap_or_default() {
                "ServiceAccount" => round_trips::<ServiceAccount>(dir, doc),
                "ClusterRole" => round_trips::<ClusterRole>(dir, doc),
                "ClusterRoleBinding" => round_trips::<ClusterRoleBinding>(dir, doc),
                "ConfigMap" => round_trips::<ConfigMap>(dir, doc),
                "DaemonSet" => round_trips::<DaemonSet>(dir, doc),
                other => panic!("{dir}: a {other} the test does not know"),
            }
        }
    }
}

#[test]
fn the_base_holds_rbac_a_config_map_and_a_daemonset() {
    let docs = rendered("base");
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );

    let sa = kind(&docs, "ServiceAccount");
    let ns = sa["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(ns, "kube-system");
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "cni-ebpf")
        .unwrap();
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(role["metadata"]["name"], "cni-ebpf");
    assert_eq!(
        rules.len(),
        10,
        "read access to what install, host-gw, policy and the Service watcher read; \
         Events; the Node's WireGuard key; the flows readers' reviews"
    );
    let read: [(&str, &[&str]); 6] = [
        ("", &["nodes", "namespaces", "pods"]),
        ("networking.k8s.io", &["networkpolicies"]),
        ("policy.networking.k8s.io", &["clusternetworkpolicies"]),
        ("apiextensions.k8s.io", &["customresourcedefinitions"]),
        ("", &["services"]),
        ("discovery.k8s.io", &["endpointslices"]),
    ];
    for (r, (group, resources)) in rules.iter().zip(read) {
        assert_eq!(strings(&r["apiGroups"]), [group]);
        assert_eq!(strings(&r["resources"]), resources);
        assert_eq!(strings(&r["verbs"]), ["get", "list", "watch"], "read only");
    }
    assert_eq!(strings(&rules[6]["apiGroups"]), ["events.k8s.io"]);
    assert_eq!(strings(&rules[6]["resources"]), ["events"]);
    assert_eq!(
        strings(&rules[6]["verbs"]),
        ["create", "patch"],
        "Events only"
    );
    assert_eq!(strings(&rules[7]["apiGroups"]), [""]);
    assert_eq!(strings(&rules[7]["resources"]), ["nodes"]);
    assert_eq!(
        strings(&rules[7]["verbs"]),
        ["patch"],
        "the agent's own Node: its WireGuard key"
    );
    for (r, (group, resource)) in rules[8..].iter().zip([
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ]) {
        assert_eq!(strings(&r["apiGroups"]), [group]);
        assert_eq!(strings(&r["resources"]), [resource]);
        assert_eq!(strings(&r["verbs"]), ["create"], "reviews only");
    }
    let reader = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "cni-ebpf-flows-reader")
        .unwrap();
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/flows"], "verbs": ["get"]}])
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

    // Host paths: the CNI directories, bpffs, the IPAM data, the agent's NetworkPolicy
    // state and its WireGuard key; beside them one Secret (/flows' certificate, below);
    // every one mounted by some container.
    let volumes = pod["volumes"].as_array().unwrap();
    let mut paths: Vec<&str> = volumes
        .iter()
        .filter(|v| v["secret"].is_null())
        .map(|v| v["hostPath"]["path"].as_str().unwrap())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "/etc/cni/net.d",
            "/opt/cni/bin",
            "/run/cni-ebpf/policy",
            "/run/cni-ebpf/wireguard",
            "/sys/fs/bpf",
            "/var/lib/cni-ebpf",
        ]
    );
    let containers: Vec<&Value> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["containers"].as_array().unwrap())
        .collect();
    for v in volumes {
        assert!(
            containers.iter().any(|c| c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == v["name"])),
            "volume {} is mounted by no container",
            v["name"]
        );
    }
    // Every container: resource requests, the ConfigMap's settings, nothing privileged,
    // every capability dropped but the ones it names.
    let config = kind(&docs, "ConfigMap")["metadata"]["name"].clone();
    for c in &containers {
        let name = &c["name"];
        assert!(c["resources"]["requests"]["cpu"].is_string(), "{name}");
        assert!(c["resources"]["requests"]["memory"].is_string(), "{name}");
        assert_eq!(c["envFrom"][0]["configMapRef"]["name"], config, "{name}");
        let sec = &c["securityContext"];
        assert_ne!(sec["privileged"], true, "{name}");
        assert_eq!(sec["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sec["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(strings(&sec["capabilities"]["drop"]), ["ALL"], "{name}");
        for m in c["volumeMounts"].as_array().unwrap() {
            assert!(
                volumes.iter().any(|v| v["name"] == m["name"]),
                "mount of an unknown volume {m}"
            );
            assert_ne!(m["mountPropagation"], "Bidirectional", "{name}: {m}");
        }
    }
    let main = &pod["containers"][0];
    assert_eq!(strings(&main["args"])[0], "agent");
    assert_eq!(
        strings(&main["securityContext"]["capabilities"]["add"]),
        // The ones testbed/src/process.rs runs the agent with in the NetworkPolicy and
        // metrics suites (AGENT_CAPABILITIES).
        ["NET_ADMIN", "BPF"]
    );
    let mount = |path: &str| {
        main["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("{path} is not mounted in the agent"))
            .clone()
    };
    assert_eq!(mount("/sys/fs/bpf")["mountPropagation"], "HostToContainer");
    assert_eq!(mount("/var/lib/cni-ebpf")["readOnly"], true);
    // The probes reach the agent's probe listener on the node's loopback (its default),
    // /metrics is on the node's address the downward API gives.
    let env = container_env(&docs, main);
    assert!(!env.contains_key("CNI_EBPF_PROBE_LISTEN"), "{env:?}");
    let probes: std::net::SocketAddr = cni_ebpf::agent::http::DEFAULT_PROBE_LISTEN.parse().unwrap();
    assert!(probes.ip().is_loopback());
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/ready"),
    ] {
        let get = &main[probe]["httpGet"];
        assert_eq!(get["host"], probes.ip().to_string(), "{probe}");
        assert_eq!(get["port"], probes.port(), "{probe}");
        assert_eq!(get["path"], path, "{probe}");
    }
    assert_eq!(
        env.get("CNI_EBPF_METRICS_LISTEN").map(String::as_str),
        Some("198.18.0.1:9670"),
        "{env:?}"
    );
    assert_eq!(main["ports"][0]["containerPort"], 9670);
    assert_eq!(
        env.get("CNI_EBPF_FLOWS_LISTEN").map(String::as_str),
        Some("198.18.0.1:9672"),
        "{env:?}"
    );
    assert_eq!(main["ports"][1]["containerPort"], 9672);
    // /flows over HTTPS only, with the certificate of an optional Secret: mounted where
    // the agent's settings look, never a reason for the agent not to start.
    let tls = mount("/etc/cni-ebpf/flows-tls");
    assert_eq!(tls["readOnly"], true);
    assert_eq!(
        env.get("CNI_EBPF_FLOWS_TLS_CERT").map(String::as_str),
        Some("/etc/cni-ebpf/flows-tls/tls.crt")
    );
    assert_eq!(
        env.get("CNI_EBPF_FLOWS_TLS_KEY").map(String::as_str),
        Some("/etc/cni-ebpf/flows-tls/tls.key")
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == tls["name"])
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "cni-ebpf-flows-tls");
    assert_eq!(volume["secret"]["optional"], true);
}

/// What the kubelet gives `fieldRef` environment variables on the node these tests
/// pretend to be.
fn downward(field: &str) -> Option<&'static str> {
    match field {
        "spec.nodeName" => Some("node-a"),
        "status.hostIP" => Some("198.18.0.1"),
        _ => None,
    }
}

/// `value` with each `$(NAME)` of `env` expanded, as the kubelet expands dependent
/// variables (an unknown one stays as written).
fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = value.to_owned();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// The environment a container of `docs`' DaemonSet gets: its ConfigMap's data, then its
/// `env` entries in order (literal values with `$(NAME)` expanded, downward API fields).
fn container_env(docs: &[Value], container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let name = &from["configMapRef"]["name"];
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("no ConfigMap {name}"));
        for (k, v) in cm["data"].as_object().unwrap() {
            env.insert(k.clone(), v.as_str().unwrap().to_owned());
        }
    }
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        if let Some(v) = e["value"].as_str() {
            let v = expand(v, &env);
            env.insert(name, v);
        } else if let Some(v) = e["valueFrom"]["fieldRef"]["fieldPath"]
            .as_str()
            .and_then(downward)
        {
            env.insert(name, v.to_owned());
        }
    }
    env
}

/// `container`'s arguments with each host-directory flag moved into `root`.
fn args_in_root(pod: &Value, container: &Value, root: &Path) -> Vec<String> {
    let mounts = container["volumeMounts"].as_array().unwrap();
    let volumes = pod["volumes"].as_array().unwrap();
    // Container path → host path of each mount.
    let host_of = |container_path: &str| -> Option<String> {
        let m = mounts.iter().find(|m| m["mountPath"] == container_path)?;
        let v = volumes.iter().find(|v| v["name"] == m["name"])?;
        v["hostPath"]["path"].as_str().map(str::to_owned)
    };
    strings(&container["args"])
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some((flag @ ("--cni-bin-dir" | "--cni-conf-dir"), path)) => {
                let host = host_of(path).unwrap_or_else(|| panic!("{flag}={path} is not a mount"));
                let expected = if flag == "--cni-bin-dir" {
                    "/opt/cni/bin"
                } else {
                    "/etc/cni/net.d"
                };
                assert_eq!(host, expected, "{flag}");
                format!("{flag}={}", root.join(&host[1..]).display())
            }
            _ => a.to_owned(),
        })
        .collect()
}

fn temp_root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("deploy-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Runs the init container of `docs`' DaemonSet into `root`; the conflist's plugin.
fn run_install(docs: &[Value], root: &Path) -> NetConf {
    let pod = &kind(docs, "DaemonSet")["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    let args = args_in_root(pod, init, root);
    assert_eq!(args[0], "install");
    // The pod CIDRs come from the Node named by the downward API (the lookup itself runs
    // against the stand-in API server in testbed/tests/e2e/node_lookup.rs). No API server here:
    // this run gives the CIDR as the documented override, CNI_EBPF_POD_CIDR.
    assert_node_name_from_downward_api(init["env"].as_array().unwrap());
    let env = container_env(docs, init);
    assert!(
        !env.contains_key("CNI_EBPF_POD_CIDR"),
        "the manifest uses the Node lookup, not a fixed CIDR"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cni-ebpf"))
        .args(&args)
        .env_remove("CNI_COMMAND")
        .env_remove("NODE_NAME")
        .envs(env)
        .env("CNI_EBPF_POD_CIDR", "10.244.0.0/24")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conflist = root.join("etc/cni/net.d/10-cni-ebpf.conflist");
    let doc: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    let plugin = plugin_config(&doc).unwrap();
    let conf = NetConf::parse(plugin.to_string().as_bytes(), Verb::Add).unwrap();
    assert!(conf.unknown_keys.is_empty(), "{:?}", conf.unknown_keys);
    assert!(root.join("opt/cni/bin/cni-ebpf").exists());
    conf
}

#[test]
fn install_writes_each_modes_settings_from_the_config_map() {
    for (dir, mode) in RENDERINGS {
        let Some((cross_node, _)) = mode else {
            continue;
        };
        let docs = rendered(dir);
        let root = temp_root();
        let conf = run_install(&docs, root.path());
        assert_eq!(
            conf.version.as_str(),
            "1.0.0",
            "the cniVersion every runtime reads"
        );
        assert!(conf.ip_masq, "{dir}");
        assert_eq!(
            conf.cluster_cidrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.244.0.0/16"],
            "{dir}"
        );
        assert_eq!(
            format!("{:?}", conf.cross_node).to_lowercase(),
            cross_node.to_lowercase(),
            "{dir}"
        );
        assert_eq!(conf.mtu, None, "{dir}: the MTU is found on the node");
    }
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
fn the_agents_host_gw_toggle_comes_from_the_config_map_and_reaches_the_binary() {
    for (dir, mode) in RENDERINGS {
        let Some((_, host_gw)) = mode else {
            continue;
        };
        let docs = rendered(dir);
        let pod = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
        let main = &pod["containers"][0];
        assert_node_name_from_downward_api(main["env"].as_array().unwrap());
        let mut env = container_env(&docs, main);
        assert_eq!(
            env.get("CNI_EBPF_HOST_GW").map(String::as_str),
            Some(if *host_gw { "true" } else { "false" }),
            "{dir}: host-gw is opt-in"
        );
        if !host_gw {
            continue;
        }
        // Switched on without a node name, the container's own arguments fail at once,
        // naming what is missing: the variable is read by `agent`, before it listens.
        env.remove("NODE_NAME");
        let out = Command::new(env!("CARGO_BIN_EXE_cni-ebpf"))
            .args(strings(&main["args"]))
            .env_remove("CNI_COMMAND")
            .env_remove("NODE_NAME")
            .envs(env)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--host-gw needs this node's name"), "{err}");
    }
}

#[test]
fn the_uninstall_daemonset_removes_what_install_wrote_and_stays() {
    let root = temp_root();
    run_install(&rendered("base"), root.path());
    let docs = rendered("uninstall");
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let c = &pod["containers"][0];
    let mut args = args_in_root(pod, c, root.path());
    assert_eq!(args[..1], ["uninstall"]);
    for flag in ["--purge", "--stay"] {
        assert!(args.iter().any(|a| a == flag), "{args:?}");
    }
    // The network's pins and store as the conflist names them are the machine's; this
    // run's are directories of its own (where no datapath is loaded, so the purge touches
    // no interface and no route).
    args.push(format!(
        "--bpffs-root={}",
        root.path().join("bpf").display()
    ));
    args.push(format!("--data-dir={}", root.path().join("data").display()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_cni-ebpf"))
        .args(&args)
        .env_remove("CNI_COMMAND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.contains("staying until stopped");
        lines.push(line);
        if done {
            break;
        }
    }
    // Still running once done: the pod stays Ready.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let status = child.wait().unwrap();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    assert!(still_running, "exited ({status}): {lines:?}\nstderr: {err}");
    let text = lines.join("\n");
    assert!(text.contains("removed"), "{text}");
    assert!(!root
        .path()
        .join("etc/cni/net.d/10-cni-ebpf.conflist")
        .exists());
    assert!(!root.path().join("opt/cni/bin/cni-ebpf").exists());
}
