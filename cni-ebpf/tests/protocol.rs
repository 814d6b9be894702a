//! Protocol tests (tier 1, no root): results in every version against golden documents
//! written by hand from the spec texts, `prevResult` round trips, and a table of bad
//! inputs run through the real binary, each with its expected code and message fragment.
#![expect(clippy::panic, reason = "tests panic with a message")]

use std::{
    io::Write,
    process::{Command, Stdio},
};

use cni_ebpf::cni::{
    result::{CniResult, Dns, Interface, IpConfig, Route},
    version::{Version, SUPPORTED},
};
use serde_json::{json, Value};

fn golden(version: &str) -> Value {
    let path = format!(
        "{}/tests/golden/result-{version}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// The model that the golden documents describe.
fn model() -> CniResult {
    let net = |s: &str| s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    let ip = |s: &str| Some(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")));
    CniResult {
        interfaces: vec![
            Interface {
                name: "ceb0123456789ab".into(),
                mac: Some("02:11:22:33:44:55".into()),
                mtu: Some(1500),
                ..Interface::default()
            },
            Interface {
                name: "eth0".into(),
                mac: Some("02:aa:bb:cc:dd:ee".into()),
                mtu: Some(1500),
                sandbox: Some("/run/netns/pod1".into()),
                ..Interface::default()
            },
        ],
        ips: vec![
            IpConfig {
                address: net("10.244.1.5/32"),
                gateway: ip("10.244.1.1"),
                interface: Some(1),
            },
            IpConfig {
                address: net("fd00:10:244:1::5/128"),
                gateway: ip("fd00:10:244:1::1"),
                interface: Some(1),
            },
        ],
        routes: vec![
            Route {
                mtu: Some(1400),
                advmss: Some(1360),
                priority: Some(100),
                table: Some(254),
                scope: Some(0),
                ..Route::new(net("0.0.0.0/0"), ip("10.244.1.1"))
            },
            Route::new(net("::/0"), ip("fd00:10:244:1::1")),
        ],
        dns: Dns {
            nameservers: vec!["10.96.0.10".into()],
            domain: Some("cluster.local".into()),
            search: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        },
    }
}

#[test]
fn results_match_golden_documents_in_every_version() {
    for v in SUPPORTED {
        let version = Version::parse(v).unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(
            model().to_json(version),
            golden(v),
            "result for cniVersion {v} differs from the golden document"
        );
    }
}

#[test]
fn prev_result_round_trips_in_every_version() {
    for v in SUPPORTED {
        let version = Version::parse(v).unwrap_or_else(|e| panic!("{v}: {e}"));
        let doc = golden(v);
        let parsed =
            CniResult::from_json(&doc, version).unwrap_or_else(|e| panic!("parsing {v}: {e}"));
        assert_eq!(
            parsed.to_json(version),
            doc,
            "round trip of a {v} prevResult changed it"
        );
        if version == Version::V110 {
            assert_eq!(parsed, model(), "1.1.0 parse must keep every field");
        }
    }
}

#[test]
fn a_prev_result_is_read_in_its_own_version() {
    // A 0.3.1 prevResult inside a 1.0.0 configuration carries `ips[].version`.
    let parsed =
        CniResult::from_json(&golden("0.3.1"), Version::V100).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.ips.len(), 2);
    assert_eq!(parsed.ips[0].interface, Some(1));
    // A legacy 0.2.0 result becomes ips + routes without interfaces.
    let legacy =
        CniResult::from_json(&golden("0.2.0"), Version::V100).unwrap_or_else(|e| panic!("{e}"));
    assert!(legacy.interfaces.is_empty());
    assert_eq!(legacy.ips.len(), 2);
    assert_eq!(legacy.routes.len(), 2);
}

#[test]
fn bad_prev_results_name_the_field() {
    let cases = [
        (
            json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]}),
            "prevResult.ips[0].address",
        ),
        (
            json!({"cniVersion": "1.0.0", "interfaces": [], "ips": [{"address": "10.0.0.1/32", "interface": 3}]}),
            "prevResult.ips[0].interface",
        ),
        (
            json!({"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]}),
            "prevResult.routes[0].dst",
        ),
        (
            json!({"cniVersion": "0.2.0", "ip4": {"ip": 5}}),
            "prevResult.ip4.ip",
        ),
    ];
    for (doc, field) in cases {
        let err = CniResult::from_json(&doc, Version::V100)
            .err()
            .unwrap_or_else(|| panic!("{doc} accepted"));
        assert_eq!(err.code(), 7, "{doc}: {err}");
        assert!(
            err.to_string().contains(field),
            "{doc}: message {err} does not name {field}"
        );
    }
}

/// The plugin binary as a command: `$CNI_EBPF_BIN` (`cargo xtask test` points it at the
/// binary it built), else the one cargo built with this test. `CNI_EBPF_RUNNER`, when set,
/// is the program (and its arguments, separated by spaces) that runs it, as cargo's target
/// runner runs this test: `qemu-aarch64` for the aarch64 binary on an x86_64 machine.
fn plugin_command() -> Command {
    let bin =
        std::env::var_os("CNI_EBPF_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_cni-ebpf").into());
    let runner = std::env::var("CNI_EBPF_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// Runs the plugin binary with exactly `env` and `stdin`; returns (exit ok, stdout JSON).
fn plugin(env: &[(&str, &str)], stdin: &str) -> (bool, Value) {
    let mut child = plugin_command()
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning the plugin: {e}"));
    if let Some(mut i) = child.stdin.take() {
        // The plugin may exit before reading stdin; a broken pipe is fine then.
        let _ = i.write_all(stdin.as_bytes());
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for the plugin: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout must be exactly one JSON document, got {text:?}: {e}"));
    (out.status.success(), doc)
}

fn conf(version: &str, name: &str) -> String {
    json!({
        "cniVersion": version, "name": name, "type": "cni-ebpf",
        "dataDir": "/nonexistent/cni-ebpf-protocol-test", "bpffsRoot": "/nonexistent/bpffs",
        "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] }
    })
    .to_string()
}

#[test]
fn version_lists_every_supported_version() {
    let (ok, doc) = plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert!(ok);
    assert_eq!(
        doc,
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]})
    );
    let (ok, doc) = plugin(&[("CNI_COMMAND", "VERSION")], "");
    assert!(ok);
    assert_eq!(doc["supportedVersions"].as_array().map(Vec::len), Some(7));
}

#[test]
fn bad_inputs_get_the_right_code_and_name_the_culprit() {
    let good = conf("1.0.0", "net1");
    let add = |cid: &str, netns: &str, ifname: &str| {
        vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", ifname),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect::<Vec<_>>()
    };
    let with = |mut base: Vec<(String, String)>, k: &str, v: &str| {
        base.retain(|(key, _)| key != k);
        base.push((k.to_owned(), v.to_owned()));
        base
    };
    let without = |mut base: Vec<(String, String)>, k: &str| {
        base.retain(|(key, _)| key != k);
        base
    };
    let ok_add = add("c1", "/run/netns/x", "eth0");
    let del = vec![
        ("CNI_COMMAND".to_owned(), "DEL".to_owned()),
        ("CNI_CONTAINERID".to_owned(), "c1".to_owned()),
        ("CNI_IFNAME".to_owned(), "eth0".to_owned()),
    ];
    let cmd = |c: &str| vec![("CNI_COMMAND".to_owned(), c.to_owned())];

    // (what, environment, stdin, expected code, fragment the message must contain)
    type Case<'a> = (&'a str, Vec<(String, String)>, String, u32, &'a str);
    let cases: Vec<Case> = vec![
        ("empty CNI_COMMAND", cmd(""), good.clone(), 4, "CNI_COMMAND"),
        ("unknown CNI_COMMAND", cmd("FROB"), good.clone(), 4, "CNI_COMMAND"),
        ("ADD without CNI_CONTAINERID", without(ok_add.clone(), "CNI_CONTAINERID"), good.clone(), 4, "CNI_CONTAINERID"),
        ("empty container ID", add("", "/run/netns/x", "eth0"), good.clone(), 4, "CNI_CONTAINERID"),
        ("container ID ../x", add("../x", "/run/netns/x", "eth0"), good.clone(), 4, "CNI_CONTAINERID"),
        ("container ID 'a b'", add("a b", "/run/netns/x", "eth0"), good.clone(), 4, "CNI_CONTAINERID"),
        ("container ID -x", add("-x", "/run/netns/x", "eth0"), good.clone(), 4, "CNI_CONTAINERID"),
        ("ADD without CNI_NETNS", without(ok_add.clone(), "CNI_NETNS"), good.clone(), 4, "CNI_NETNS"),
        ("relative CNI_NETNS", with(ok_add.clone(), "CNI_NETNS", "netns/x"), good.clone(), 4, "CNI_NETNS"),
        ("ADD without CNI_IFNAME", without(ok_add.clone(), "CNI_IFNAME"), good.clone(), 4, "CNI_IFNAME"),
        ("16-byte ifname", add("c1", "/run/netns/x", "a234567890123456"), good.clone(), 4, "CNI_IFNAME"),
        ("ifname ..", add("c1", "/run/netns/x", ".."), good.clone(), 4, "CNI_IFNAME"),
        ("ifname a/b", add("c1", "/run/netns/x", "a/b"), good.clone(), 4, "CNI_IFNAME"),
        ("ifname 'eth 0'", add("c1", "/run/netns/x", "eth 0"), good.clone(), 4, "CNI_IFNAME"),
        ("DEL without CNI_CONTAINERID", without(del.clone(), "CNI_CONTAINERID"), good.clone(), 4, "CNI_CONTAINERID"),
        ("DEL without CNI_IFNAME", without(del.clone(), "CNI_IFNAME"), good.clone(), 4, "CNI_IFNAME"),
        ("CHECK without CNI_NETNS", with(without(ok_add.clone(), "CNI_NETNS"), "CNI_COMMAND", "CHECK"), good.clone(), 4, "CNI_NETNS"),
        ("GC without CNI_PATH", cmd("GC"), conf("1.1.0", "net1"), 4, "CNI_PATH"),
        ("unknown CNI_ARGS key", with(ok_add.clone(), "CNI_ARGS", "FOO=bar"), good.clone(), 4, "CNI_ARGS"),
        ("malformed CNI_ARGS", with(ok_add.clone(), "CNI_ARGS", "novalue"), good.clone(), 4, "CNI_ARGS"),
        ("non-JSON stdin", ok_add.clone(), "{not json".into(), 6, "network configuration"),
        ("empty stdin", ok_add.clone(), String::new(), 6, "empty"),
        ("JSON that is not an object", ok_add.clone(), "[1,2]".into(), 6, "object"),
        ("cniVersion 9.9.9", ok_add.clone(), conf("9.9.9", "net1"), 1, "9.9.9"),
        ("CHECK with 0.3.1", with(ok_add.clone(), "CNI_COMMAND", "CHECK"), conf("0.3.1", "net1"), 1, "CHECK"),
        ("STATUS with 1.0.0", cmd("STATUS"), conf("1.0.0", "net1"), 1, "STATUS"),
        ("GC with 1.0.0", with(cmd("GC"), "CNI_PATH", "/usr/lib/cni"), conf("1.0.0", "net1"), 1, "GC"),
        (
            "GC without cni.dev/valid-attachments",
            with(cmd("GC"), "CNI_PATH", "/usr/lib/cni"),
            conf("1.1.0", "net1"),
            7,
            "cni.dev/valid-attachments",
        ),
        ("network name with /", ok_add.clone(), conf("1.0.0", "a/b"), 7, "name"),
        ("empty network name", ok_add.clone(), conf("1.0.0", ""), 7, "name"),
        ("mtu of the wrong type", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"mtu\":\"big\""), 7, "mtu"),
        ("mtu too small", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"mtu\":10"), 7, "mtu"),
        ("unknown interface kind", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"interface\":\"macvlan\""), 7, "interface"),
        ("bad logLevel", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"logLevel\":\"loud\""), 7, "logLevel"),
        ("relative dataDir", ok_add.clone(), good.replace("/nonexistent/cni-ebpf-protocol-test", "rel/dir"), 7, "dataDir"),
        (
            "port mapping with protocol sctp",
            ok_add.clone(),
            good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"runtimeConfig\":{\"portMappings\":[{\"hostPort\":80,\"containerPort\":80,\"protocol\":\"sctp\"}]}"),
            7,
            "runtimeConfig.portMappings[0].protocol",
        ),
        (
            "port mapping with hostPort 0",
            ok_add.clone(),
            good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"runtimeConfig\":{\"portMappings\":[{\"hostPort\":0,\"containerPort\":80}]}"),
            7,
            "hostPort",
        ),
        ("bad runtimeConfig.mac", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"runtimeConfig\":{\"mac\":\"zz\"}"), 7, "runtimeConfig.mac"),
        ("bad runtimeConfig.allowedSourceCIDRs", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"runtimeConfig\":{\"allowedSourceCIDRs\":[\"10.0.0.0/33\"]}"), 7, "runtimeConfig.allowedSourceCIDRs[0]"),
        ("bad args.cni.allowedSourceCIDRs", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"args\":{\"cni\":{\"allowedSourceCIDRs\":[\"nope\"]}}"), 7, "args.cni.allowedSourceCIDRs[0]"),
        ("natFlowsPerPod 0", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"natFlowsPerPod\":0"), 7, "natFlowsPerPod"),
        ("natFlowsPerPod beyond the table", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"natFlowsPerPod\":65537"), 7, "natFlowsPerPod"),
        ("an unknown crossNode mode", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"crossNode\":\"geneve\""), 7, "crossNode"),
        ("a tunnelVni over 24 bits", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"crossNode\":\"tunnel\",\"tunnelVni\":16777216"), 7, "tunnelVni"),
        ("tunnelPort 0", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"crossNode\":\"tunnel\",\"tunnelPort\":0"), 7, "tunnelPort"),
        ("17 IPv4 clusterCIDRs", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"clusterCIDRs\":[\"10.0.0.0/16\",\"10.1.0.0/16\",\"10.2.0.0/16\",\"10.3.0.0/16\",\"10.4.0.0/16\",\"10.5.0.0/16\",\"10.6.0.0/16\",\"10.7.0.0/16\",\"10.8.0.0/16\",\"10.9.0.0/16\",\"10.10.0.0/16\",\"10.11.0.0/16\",\"10.12.0.0/16\",\"10.13.0.0/16\",\"10.14.0.0/16\",\"10.15.0.0/16\",\"10.16.0.0/16\"]"), 7, "clusterCIDRs"),
        ("natPortsPerDestination 0", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"natPortsPerDestination\":0"), 7, "natPortsPerDestination"),
        ("natPortsPerDestination beyond a port", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"natPortsPerDestination\":65536"), 7, "natPortsPerDestination"),
        ("bad IPv6 runtimeConfig.allowedSourceCIDRs", ok_add.clone(), good.replace("\"type\":\"cni-ebpf\"", "\"type\":\"cni-ebpf\",\"runtimeConfig\":{\"allowedSourceCIDRs\":[\"fd00::/129\"]}"), 7, "runtimeConfig.allowedSourceCIDRs[0]"),
        ("bad ipam subnet", ok_add.clone(), good.replace("10.244.1.0/24", "10.244.1.0/33"), 7, "subnet"),
        (
            "ipam route with a gateway of the other family",
            ok_add.clone(),
            good.replace("\"ranges\"", "\"routes\":[{\"dst\":\"2001:db8::/64\",\"gw\":\"10.244.1.1\"}],\"ranges\""),
            7,
            "ipam.routes[0].gw`: the route to 2001:db8::/64 via 10.244.1.1",
        ),
        ("CNI_NETNS that is a regular file", with(ok_add.clone(), "CNI_NETNS", "/etc/hostname"), good.clone(), 4, "CNI_NETNS"),
        ("CNI_NETNS that does not exist", with(ok_add.clone(), "CNI_NETNS", "/run/netns/does-not-exist-cni-ebpf"), good.clone(), 4, "CNI_NETNS"),
    ];
    let mut failures = Vec::new();
    for (what, env, stdin, code, fragment) in &cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (ok, doc) = plugin(&env, stdin);
        let msg = doc["msg"].as_str().unwrap_or_default().to_owned()
            + " "
            + doc["details"].as_str().unwrap_or_default();
        if ok || doc["code"] != json!(code) || !msg.contains(fragment) {
            failures.push(format!(
                "{what}: expected code {code} naming {fragment:?}, got exit ok={ok} {doc}"
            ));
        }
        if doc.get("cniVersion").and_then(Value::as_str).is_none() {
            failures.push(format!("{what}: error has no cniVersion: {doc}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
