//! A real runtime client: libcni 1.1.2 (the library containerd and CRI-O embed) drives
//! ADD / CHECK / DEL of conflists with cni-ebpf first, alone and chained with the
//! reference `tuning` plugin, with capability arguments (`bandwidth` taken by cni-ebpf);
//! the reference `bandwidth` plugin chained after cni-ebpf is refused loudly.

use serde_json::{json, Value};
use testbed::{
    assert_ping,
    inspect::{host_veths, link, sysctl},
    ResultView, SimNode, LIBCNI_VERSIONS,
};

fn has_check(version: &str) -> bool {
    !matches!(version, "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1")
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn libcni_adds_checks_and_deletes_in_every_version_it_speaks() {
    let node = SimNode::new("libcni_versions");
    let pod = node.pod("p");
    let env = pod.env("eth0");
    for version in LIBCNI_VERSIONS {
        let conflist = node.conf().version(version).conflist();
        let r = ResultView::parse(&node.libcni("add", &conflist, &env, None).result());
        assert_eq!(r.version, *version, "libcni converts nothing here: {r}");
        assert!(
            r.ip4().starts_with("10.244.1.") && r.ip6().starts_with("fd00:10:244:1::"),
            "{r}"
        );
        assert_ping(pod.netns(), "10.244.1.1");
        let cached = node.libcni("cached", &conflist, &env, None).result();
        assert_eq!(
            ResultView::parse(&cached).ips,
            r.ips,
            "libcni's cached result"
        );
        if has_check(version) {
            node.libcni("check", &conflist, &env, None).assert_success();
        }
        node.libcni("del", &conflist, &env, None).assert_success();
        assert!(
            link(pod.netns(), "eth0").is_none(),
            "{version}: eth0 left after DEL"
        );
        assert!(
            host_veths(node.netns()).is_empty(),
            "{version}: host veth left after DEL"
        );
        node.store("testnet")
            .assert_empty(&format!("{version}: after DEL"));
        // A runtime may repeat DEL (e.g. after a restart): still success.
        node.libcni("del", &conflist, &env, None).assert_success();
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn capability_args_mac_and_ips_reach_the_plugin() {
    let node = SimNode::new("libcni_caps");
    let pod = node.pod("p");
    let env = pod.env("eth0");
    let conflist = node.conf().version("1.0.0").conflist();
    let mac = "0a:58:0a:f4:01:5c";
    let caps = json!({ "mac": mac, "ips": ["10.244.1.77/24", "fd00:10:244:1::77/64"] });
    let r = ResultView::parse(&node.libcni("add", &conflist, &env, Some(&caps)).result());
    assert_eq!(r.ip4(), "10.244.1.77", "runtimeConfig.ips (IPv4): {r}");
    assert_eq!(
        r.ip6(),
        "fd00:10:244:1::77",
        "runtimeConfig.ips (IPv6): {r}"
    );
    let (_, ctr) = r.container_interface("eth0");
    assert_eq!(ctr.mac.as_deref(), Some(mac), "runtimeConfig.mac: {r}");
    let Some(c) = link(pod.netns(), "eth0") else {
        panic!("no eth0 in the pod")
    };
    assert_eq!(c.mac, mac);
    node.libcni("check", &conflist, &env, Some(&caps))
        .assert_success();
    node.libcni("del", &conflist, &env, Some(&caps))
        .assert_success();
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn chain_with_tuning_passes_prev_result_through_and_bandwidth_reaches_cni_ebpf() {
    let node = SimNode::new("libcni_chain");
    // cni-ebpf does not take the `mac` capability here, so the MAC is tuning's alone: the
    // final result can only show it if prevResult flowed through tuning.
    let base = node.conf().version("1.0.0").set(
        "capabilities",
        json!({ "ips": true, "portMappings": true, "bandwidth": true }),
    );
    node.warm_up(&base);
    let before = node.snapshot();
    let conflist = base
        .clone()
        .then(json!({
            "type": "tuning",
            "capabilities": { "mac": true },
            "sysctl": { "net.ipv4.conf.eth0.arp_notify": "1" },
        }))
        .conflist();
    let a = node.pod("a");
    let env = a.env("eth0");
    let mac = "0a:58:0a:f4:01:aa";
    let caps = json!({
        "mac": mac,
        "bandwidth": { "egressRate": 80_000_000, "egressBurst": 800_000 },
    });

    let out = node.libcni("add", &conflist, &env, Some(&caps));
    let r = ResultView::parse(&out.result());
    assert_eq!(r.version, "1.0.0", "{r}");
    // cni-ebpf's part survived tuning...
    assert!(r.interfaces.len() >= 2, "{r}");
    assert_eq!(r.container_interface("eth0").0, 1, "{r}");
    let host = r.host_interface().name.clone();
    assert!(
        r.ip4().starts_with("10.244.1.") && r.ip6().starts_with("fd00:10:244:1::"),
        "{r}"
    );
    assert!(r.routes.iter().any(|x| x.dst == "0.0.0.0/0"), "{r}");
    // ... and tuning's MAC change is in the final result and the kernel.
    let (_, ctr) = r.container_interface("eth0");
    assert_eq!(
        ctr.mac.as_deref(),
        Some(mac),
        "tuning's MAC in the final result: {r}"
    );
    let Some(c) = link(a.netns(), "eth0") else {
        panic!("no eth0 in pod a")
    };
    assert_eq!(c.mac, mac, "tuning's MAC in the kernel");
    assert_eq!(
        sysctl(a.netns(), "net.ipv4.conf.eth0.arp_notify").as_deref(),
        Some("1"),
        "tuning's sysctl"
    );
    // The egress rate reached cni-ebpf through libcni's capability arguments.
    let doc = node
        .datapath("testnet")
        .unwrap_or_else(|| panic!("no datapath loaded"));
    let ep = doc["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["ip"] == r.ip4())
        .unwrap_or_else(|| panic!("no endpoint for {} in {doc:#}", r.ip4()));
    assert_eq!(ep["egress_rate_bits"], 80_000_000, "{ep:#}");
    let qdiscs = node
        .exec(&["tc", "qdisc", "show", "dev", &host])
        .ok()
        .to_owned();
    assert!(
        !qdiscs.contains("tbf") && !qdiscs.contains("ingress"),
        "{qdiscs}"
    );
    let cached: Value = node.libcni("cached", &conflist, &env, None).result();
    assert_eq!(cached, r.raw, "libcni caches the chain's final result");

    // CHECK of the whole chain (every plugin gets the final result as prevResult).
    let check = node.libcni("check", &conflist, &env, Some(&caps));
    assert!(
        check.success(),
        "CHECK of cni-ebpf → tuning failed after tuning changed the MAC: {}",
        check.raw
    );

    // The pod still talks to a neighbour and the node with its new MAC.
    let b = node.pod("b");
    let rb = node.add(&b, "eth0", &base);
    for dst in [rb.ip4(), rb.ip6()] {
        assert_ping(a.netns(), &dst);
    }
    for dst in [r.ip4(), r.ip6()] {
        assert_ping(b.netns(), &dst);
        assert_ping(node.netns(), &dst);
    }

    node.libcni("del", &conflist, &env, Some(&caps))
        .assert_success();
    node.del(&b, "eth0", &base);
    let d = node.snapshot().diff(&before);
    assert!(
        d.is_empty(),
        "the chain's DEL left the node changed:\n{}",
        d.join("\n")
    );
    node.store("testnet").assert_empty("after the chain's DEL");
    node.libcni("del", &conflist, &env, Some(&caps))
        .assert_success();
}

/// The reference `bandwidth` plugin chained after cni-ebpf would be bypassed by its
/// redirects: with `attach: "tc"` its ADD fails (our clsact qdisc holds the hook it wants)
/// and nothing is left; with `"tcx"` it gets in, and CHECK names the conflict and the fix.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn reference_bandwidth_chained_after_cni_ebpf_is_refused_loudly() {
    let node = SimNode::new("libcni_bw");
    for attach in ["tc", "tcx"] {
        let base = node.conf().version("1.0.0").set("attach", json!(attach));
        node.warm_up(&base);
        let before = node.snapshot();
        let conflist = base
            .clone()
            .then(json!({
                "type": "bandwidth",
                "egressRate": 80_000_000, "egressBurst": 800_000,
            }))
            .conflist();
        let p = node.pod(&format!("p{attach}"));
        let env = p.env("eth0");
        let out = node.libcni("add", &conflist, &env, None);
        if attach == "tc" {
            let f = out.assert_error(999);
            assert!(f.msg.contains("ingress qdisc"), "{f:?}");
        } else {
            out.assert_success();
            let check = node.libcni("check", &conflist, &env, None);
            let f = check.assert_error(104);
            assert!(
                f.msg.contains("another shaper") && f.msg.contains("\"bandwidth\": true"),
                "{f:?}"
            );
        }
        node.libcni("del", &conflist, &env, None).assert_success();
        let d = node.snapshot().diff(&before);
        assert!(d.is_empty(), "{attach}: left behind:\n{}", d.join("\n"));
    }
}

/// `libcni-client serve`, the long-lived runtime the bench times ADD through (as containerd
/// and CRI-O embed libcni): one process, the conflist read once, requests answered in
/// order, a plugin's failure reported with its CNI code and nothing of it left behind.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_long_lived_libcni_client_serves_pods_in_order() {
    let node = SimNode::new("libcni_serve");
    let (a, b) = (node.pod("a"), node.pod("b"));
    let conf = node.conf().version("1.0.0").conflist();
    let conflist = node.dir().join("serve.conflist");
    if let Err(e) = std::fs::write(&conflist, conf.to_string()) {
        panic!("cannot write {}: {e}", conflist.display());
    }
    let request = |verb: &str, id: &str, netns: &std::path::Path| {
        json!({
            "verb": verb, "conflist": conflist, "netns": netns, "id": id, "ifname": "eth0",
            "cniPath": node.cni_bin_dir(), "cacheDir": node.dir().join("libcni-cache"),
        })
        .to_string()
    };
    let missing = std::path::Path::new("/run/netns/cni-ebpf-test-does-not-exist");
    let lines = [
        request("add", a.container_id(), a.netns()),
        request("add", b.container_id(), b.netns()),
        request("add", "c", missing),
        request("check", a.container_id(), a.netns()),
        request("del", a.container_id(), a.netns()),
        request("cached", b.container_id(), b.netns()),
        "not json".to_owned(),
    ];
    let mut cmd = std::process::Command::new(testbed::libcni::client_bin());
    cmd.arg("serve");
    testbed::process::in_netns(&mut cmd, node.netns());
    let input = lines.join("\n") + "\n";
    let out = testbed::process::run_cmd(
        cmd,
        Some(input.as_bytes()),
        std::time::Duration::from_secs(90),
    );
    assert!(out.status.success(), "{out:?}");
    let answers: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(
        answers.len(),
        lines.len(),
        "one answer per request: {out:?}"
    );
    let ok: Vec<bool> = answers.iter().map(|a| a["ok"] == json!(true)).collect();
    assert_eq!(
        ok,
        [true, true, false, true, true, true, false],
        "{answers:#?}"
    );
    let ra = ResultView::parse(&answers[0]["result"]);
    let rb = ResultView::parse(&answers[1]["result"]);
    assert!(
        ra.ip4().starts_with("10.244.1.") && ra.ip4() != rb.ip4(),
        "{ra} {rb}"
    );
    assert_eq!(
        answers[2]["error"]["code"],
        json!(4),
        "bad CNI_NETNS: {}",
        answers[2]
    );
    assert_eq!(
        ResultView::parse(&answers[5]["result"]).ips,
        rb.ips,
        "b's cached result"
    );
    // The DEL answered; its finishing process deletes the veth pair after.
    testbed::plugin::settle_network(&conf);
    assert!(link(a.netns(), "eth0").is_none(), "a's eth0 left after DEL");
    assert_ping(b.netns(), "10.244.1.1");
    assert_eq!(host_veths(node.netns()).len(), 1, "only b's veth is left");
    node.libcni("del", &conf, &b.env("eth0"), None)
        .assert_success();
    node.store("testnet").assert_empty("after both DELs");
}
