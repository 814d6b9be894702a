//! `cni-ebpf install` reads the node's pod CIDRs from its Node object.
//!
//! The API server is the stand-in of `testbed::apiserver` (HTTPS with its own CA, bearer
//! token checked, Node objects and Status errors shaped like the API server's), listening
//! on 127.0.0.1 of a network namespace the test creates; `install` runs inside that
//! namespace with a temporary host root, as the DaemonSet's init container would with the
//! ServiceAccount mounted and NODE_NAME from the downward API. Each failure (403, 404, a
//! Node without pod CIDRs, a wrong token, a server too slow) must be a clear error that
//! writes nothing: no binary, no conflist, no temporary file.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    apiserver::{node_object, ApiServer},
    node::unique_tag,
    plugin_bin,
    process::{in_netns, run_cmd, Output},
    NetNs,
};

/// A namespace with the stand-in on its loopback, and a temporary host root.
struct Setup {
    // Field order is drop order: the server (its threads) before its namespace.
    api: ApiServer,
    ns: NetNs,
    root: tempfile::TempDir,
}

impl Setup {
    fn new(test: &str) -> Self {
        let ns = NetNs::create(&format!("kapi-{}", unique_tag(test)));
        let api = ApiServer::start(ns.path(), "127.0.0.1");
        let root = tempfile::Builder::new()
            .prefix("node-lookup-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a host root: {e}"));
        Self { api, ns, root }
    }

    fn conf_dir(&self) -> PathBuf {
        self.root.path().join("etc/cni/net.d")
    }

    /// Runs `cni-ebpf install` inside the namespace with `args` and `env` only (the
    /// machine's own NODE_NAME, KUBERNETES_* and pod-CIDR variables removed).
    fn install(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let root = self.root.path();
        let mut cmd = Command::new(plugin_bin());
        cmd.arg("install")
            .arg(format!(
                "--cni-bin-dir={}",
                root.join("opt/cni/bin").display()
            ))
            .arg(format!("--cni-conf-dir={}", self.conf_dir().display()))
            .arg(format!("--bpffs-root={}", root.join("bpffs").display()))
            .arg(format!("--data-dir={}", root.join("data").display()))
            .args(args);
        for var in [
            "CNI_COMMAND",
            "CNI_EBPF_POD_CIDR",
            "NODE_NAME",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "CNI_EBPF_API_SERVER",
            "CNI_EBPF_SERVICE_ACCOUNT_DIR",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        in_netns(&mut cmd, self.ns.path());
        run_cmd(cmd, None, Duration::from_secs(60))
    }

    /// `install --node-name <node> --api-server … --service-account-dir …` plus `extra`.
    fn install_from(&self, node: &str, sa_dir: &Path, extra: &[&str]) -> Output {
        let url = self.api.url();
        let sa = sa_dir.display().to_string();
        let mut args = vec![
            "--node-name",
            node,
            "--api-server",
            &url,
            "--service-account-dir",
            &sa,
        ];
        args.extend_from_slice(extra);
        self.install(&args, &[])
    }

    /// The conflist's IPAM ranges, one list of subnets per range set.
    fn ranges(&self) -> Vec<Vec<String>> {
        let path = self.conf_dir().join("10-cni-ebpf.conflist");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let doc: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        doc["plugins"][0]["ipam"]["ranges"]
            .as_array()
            .unwrap_or_else(|| panic!("no ipam.ranges in {text}"))
            .iter()
            .map(|set| {
                set.as_array()
                    .unwrap_or_else(|| panic!("a range set is not a list: {text}"))
                    .iter()
                    .map(|r| r["subnet"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .collect()
    }

    /// Nothing was written below the host root.
    #[track_caller]
    fn nothing_written(&self, what: &str) {
        for sub in ["opt", "etc"] {
            let p = self.root.path().join(sub);
            assert!(!p.exists(), "{what}: {} was created", p.display());
        }
    }
}

/// Asserts `out` failed cleanly (nothing on stdout) with every `needle` in stderr.
#[track_caller]
fn fails_with(out: &Output, needles: &[&str]) {
    assert!(!out.success(), "should have failed: {out}");
    assert!(!out.timed_out, "{out}");
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout when failing: {out}"
    );
    for n in needles {
        assert!(out.stderr.contains(n), "expected {n:?} in the error: {out}");
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn install_reads_the_pod_cidrs_of_its_node_with_the_pods_credentials() {
    let s = Setup::new("lookup_ok");
    s.api.set_node(
        "node-a",
        &["10.244.1.0/24", "fd00:10:244:1::/64"],
        &["198.18.0.1", "fd00:198:18::1"],
    );
    s.api
        .set_node("node-b", &["10.244.2.0/24"], &["198.18.0.3"]);
    // As in the DaemonSet: the address from KUBERNETES_SERVICE_HOST/PORT, the node from
    // NODE_NAME; only the ServiceAccount directory is moved (the real one is not ours).
    let port = s.api.addr().port().to_string();
    let sa = s.api.sa_dir().display().to_string();
    let out = s.install(
        &[],
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
            ("NODE_NAME", "node-a"),
            ("CNI_EBPF_SERVICE_ACCOUNT_DIR", &sa),
        ],
    );
    let stdout = out.ok();
    assert!(
        stdout.contains("pod CIDRs 10.244.1.0/24, fd00:10:244:1::/64 from Node \"node-a\""),
        "{out}"
    );
    assert_eq!(
        s.ranges(),
        [
            vec!["10.244.1.0/24".to_owned()],
            vec!["fd00:10:244:1::/64".to_owned()]
        ]
    );
    assert!(s.root.path().join("opt/cni/bin/cni-ebpf").is_file());
    assert_eq!(
        s.api.requests(),
        ["GET /api/v1/nodes/node-a -> 200"],
        "one authenticated get of its own Node"
    );

    // Node B through the flags, and an object with only the older spec.podCIDR.
    let mut old = node_object("node-old", &[], &["198.18.0.9"]);
    old["spec"] = serde_json::json!({"podCIDR": "10.244.9.0/24"});
    s.api.put_node(old);
    s.install_from("node-old", s.api.sa_dir(), &[]).ok();
    assert_eq!(s.ranges(), [vec!["10.244.9.0/24".to_owned()]]);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_pod_cidr_flag_wins_and_the_api_server_is_not_asked() {
    let s = Setup::new("lookup_flag");
    s.api
        .set_node("node-a", &["10.244.1.0/24"], &["198.18.0.1"]);
    s.install_from("node-a", s.api.sa_dir(), &["--pod-cidr", "10.244.7.0/24"])
        .ok();
    assert_eq!(s.ranges(), [vec!["10.244.7.0/24".to_owned()]]);
    assert!(s.api.requests().is_empty(), "{:?}", s.api.requests());
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn rbac_denial_a_missing_node_and_a_node_without_cidrs_are_clear_errors_that_write_nothing() {
    let s = Setup::new("lookup_err");
    s.api
        .set_node("node-a", &["10.244.1.0/24"], &["198.18.0.1"]);
    s.api.set_node("node-new", &[], &["198.18.0.5"]);
    let url = s.api.url();

    let out = s.install_from("node-gone", s.api.sa_dir(), &[]);
    fails_with(
        &out,
        &[
            "node \"node-gone\" not found",
            &url,
            "404",
            "NODE_NAME",
            "spec.nodeName",
        ],
    );
    s.nothing_written("404");

    let out = s.install_from("node-new", s.api.sa_dir(), &[]);
    fails_with(
        &out,
        &[
            "node \"node-new\" has no spec.podCIDRs yet",
            "controller-manager",
            "--pod-cidr",
        ],
    );
    s.nothing_written("no pod CIDR");

    s.api.forbid(true);
    let out = s.install_from("node-a", s.api.sa_dir(), &[]);
    fails_with(
        &out,
        &[
            "403 Forbidden",
            "cannot get resource \"nodes\"",
            "RBAC",
            "needs `get` on `nodes`",
            &url,
        ],
    );
    s.nothing_written("403");
    s.api.forbid(false);

    // The same server then serves the same node: the failures above were the server's.
    s.install_from("node-a", s.api.sa_dir(), &[]).ok();
    assert_eq!(s.ranges(), [vec!["10.244.1.0/24".to_owned()]]);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_wrong_token_a_foreign_ca_and_a_slow_server_are_clear_errors_that_write_nothing() {
    let s = Setup::new("lookup_auth");
    s.api
        .set_node("node-a", &["10.244.1.0/24"], &["198.18.0.1"]);
    let url = s.api.url();

    let wrong = s.api.wrong_sa_dir();
    let out = s.install_from("node-a", &wrong, &[]);
    fails_with(
        &out,
        &["401 Unauthorized", "refused the ServiceAccount token", &url],
    );
    s.nothing_written("401");
    assert_eq!(s.api.requests(), ["GET /api/v1/nodes/node-a -> 401"]);

    // The CA of another cluster: the server's certificate is refused, and the error
    // says why rather than only "client error (Connect)".
    let out = s.install_from("node-a", &s.api.foreign_ca_sa_dir(), &[]);
    fails_with(&out, &[&url, "invalid peer certificate"]);
    s.nothing_written("foreign CA");

    // No ServiceAccount mounted at all.
    let out = s.install_from("node-a", &s.root.path().join("no-sa"), &[]);
    fails_with(&out, &["ServiceAccount credentials", "no-sa/token"]);
    s.nothing_written("no ServiceAccount");

    s.api.set_delay(Duration::from_secs(20));
    let started = Instant::now();
    let out = s.install_from("node-a", s.api.sa_dir(), &["--api-timeout", "2"]);
    let took = started.elapsed();
    fails_with(
        &out,
        &["no answer from the API server at", &url, "within 2 s"],
    );
    assert!(
        took < Duration::from_secs(10),
        "the time limit held: {took:?}"
    );
    s.nothing_written("timeout");
    s.api.set_delay(Duration::ZERO);
}
