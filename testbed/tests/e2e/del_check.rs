//! DEL is idempotent in every case the spec names and restores the node exactly; CHECK
//! notices each kind of damage with its own error 104 and passes again after DEL + ADD.

use serde_json::json;
use testbed::{
    assert_ping,
    inspect::{host_veths, link, links},
    ConfBuilder, Pod, ResultView, SimNode,
};

/// Panics unless nothing of `pod`'s attachment is left: host veth, endpoint entries,
/// reservation; and the node is back to `before`.
#[track_caller]
fn assert_gone(
    node: &SimNode,
    pod: &Pod,
    before: &(testbed::Snapshot, Vec<std::path::PathBuf>),
    what: &str,
) {
    let (before, pins_before) = before;
    // A deleted namespace is torn down asynchronously by the kernel: allow it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut d = node.snapshot().diff(before);
    while !d.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        d = node.snapshot().diff(before);
    }
    assert!(
        d.is_empty(),
        "{what}: the node differs from before ADD:\n{}",
        d.join("\n")
    );
    assert!(
        host_veths(node.netns()).is_empty(),
        "{what}: host veth left"
    );
    assert_eq!(
        &node.pins(),
        pins_before,
        "{what}: pins differ from before ADD"
    );
    let store = node.store("testnet");
    assert!(
        !store.has_key(pod.container_id(), "eth0") && store.ips.is_empty(),
        "{what}: reservation left: {store:?}"
    );
    let eps = node.endpoints("testnet");
    assert!(
        !eps.iter()
            .any(|e| e.to_string().contains(pod.container_id())),
        "{what}: endpoint entries left: {eps:?}"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn del_is_idempotent_and_restores_the_node_in_every_case() {
    let node = SimNode::new("del_cases");
    let conf = node.conf();
    node.warm_up(&conf);
    let before = (node.snapshot(), node.pins());
    let other = node.pod("other");

    // 1. With prevResult, then again (nothing left to delete), then without prevResult.
    let pod = node.pod("p1");
    let r = node.add(&pod, "eth0", &conf);
    let with_prev = conf.clone().set("prevResult", r.raw.clone()).plugin();
    for round in 0..2 {
        node.exec_plugin("DEL", &pod.env("eth0"), &with_prev)
            .assert_empty_success();
        assert_gone(
            &node,
            &pod,
            &before,
            &format!("DEL with prevResult #{round}"),
        );
    }
    node.del(&pod, "eth0", &conf);

    // 2. Empty CNI_NETNS (the runtime lost the namespace), no prevResult.
    let pod = node.pod("p2");
    node.add(&pod, "eth0", &conf);
    let env = pod.env("eth0").with_netns("");
    for _ in 0..2 {
        node.exec_plugin("DEL", &env, &conf.plugin())
            .assert_empty_success();
    }
    assert_gone(&node, &pod, &before, "DEL with an empty CNI_NETNS");
    assert!(
        link(pod.netns(), "eth0").is_none(),
        "eth0 left in the pod after DEL without CNI_NETNS"
    );

    // 3. The namespace was deleted before DEL.
    let pod = node.pod("p3");
    let r = node.add(&pod, "eth0", &conf);
    let path = pod.netns().to_path_buf();
    testbed::process::run(&["ip", "netns", "del", pod.name()]).ok();
    assert!(!path.exists(), "netns {} still there", path.display());
    let with_prev = conf.clone().set("prevResult", r.raw.clone()).plugin();
    for _ in 0..2 {
        node.exec_plugin("DEL", &pod.env("eth0"), &with_prev)
            .assert_empty_success();
    }
    assert_gone(&node, &pod, &before, "DEL after the netns was deleted");

    // 4. CNI_NETNS names something that is not a network namespace (any more).
    let pod = node.pod("p4");
    node.add(&pod, "eth0", &conf);
    let file = node.dir().join("stale-netns");
    std::fs::write(&file, b"").ok();
    node.exec_plugin("DEL", &pod.env("eth0").with_netns(&file), &conf.plugin())
        .assert_empty_success();
    assert_gone(&node, &pod, &before, "DEL with a non-netns CNI_NETNS");

    // 5. A container this network never saw, while another pod is attached: success,
    //    and the other pod keeps everything.
    let ro = node.add(&other, "eth0", &conf);
    let with_other = node.snapshot();
    let ghost = testbed::CniEnv::new("never-added", other.netns(), "eth0");
    node.exec_plugin("DEL", &ghost, &conf.plugin())
        .assert_empty_success();
    let ghost_if = testbed::CniEnv::new(other.container_id(), other.netns(), "eth1");
    node.exec_plugin("DEL", &ghost_if, &conf.plugin())
        .assert_empty_success();
    node.snapshot().assert_same_as(&with_other);
    assert!(
        node.store("testnet").has_key(other.container_id(), "eth0"),
        "DEL of another container released this one's reservation"
    );
    assert_ping(other.netns(), "10.244.1.1");
    node.check(&other, "eth0", &conf, &ro.raw)
        .assert_empty_success();
    node.del(&other, "eth0", &conf);
    assert_gone(&node, &other, &before, "final DEL");
    node.store("testnet").assert_empty("after every DEL");
}

/// ADD with a fresh DEL first; returns the result, after asserting CHECK passes.
#[track_caller]
fn fresh(node: &SimNode, pod: &Pod, conf: &ConfBuilder) -> ResultView {
    node.del(pod, "eth0", conf);
    let r = node.add(pod, "eth0", conf);
    node.check(pod, "eth0", conf, &r.raw).assert_empty_success();
    r
}

/// CHECK fails with 104 and a message containing every fragment.
#[track_caller]
fn assert_check_fails(
    node: &SimNode,
    pod: &Pod,
    conf: &ConfBuilder,
    r: &ResultView,
    fragments: &[&str],
) {
    let out = node.check(pod, "eth0", conf, &r.raw);
    let e = out.assert_error(104);
    let text = format!("{} {}", e.msg, e.details);
    for f in fragments {
        assert!(text.contains(f), "CHECK error should mention {f:?}: {e:?}");
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn check_reports_each_kind_of_damage_and_passes_after_del_add() {
    let node = SimNode::new("check_damage");
    let conf = node.conf().version("1.0.0").set("mtu", json!(1400));
    let pod = node.pod("p");
    let mut r = fresh(&node, &pod, &conf);

    // A missing address in the container (each family).
    for v6 in [false, true] {
        let ip = r.ip(v6).address.clone();
        pod.exec(&["ip", "addr", "del", &ip, "dev", "eth0"]).ok();
        assert_check_fails(&node, &pod, &conf, &r, &["address", &ip, "missing"]);
        r = fresh(&node, &pod, &conf);
    }

    // A missing route in the container.
    pod.exec(&["ip", "route", "del", "default"]).ok();
    assert_check_fails(&node, &pod, &conf, &r, &["route", "0.0.0.0/0", "missing"]);
    r = fresh(&node, &pod, &conf);
    pod.exec(&["ip", "-6", "route", "del", "default"]).ok();
    assert_check_fails(&node, &pod, &conf, &r, &["route", "::/0", "missing"]);
    r = fresh(&node, &pod, &conf);

    // A changed MTU.
    pod.exec(&["ip", "link", "set", "eth0", "mtu", "1300"]).ok();
    assert_check_fails(&node, &pod, &conf, &r, &["MTU", "1300"]);
    r = fresh(&node, &pod, &conf);

    // A changed MAC.
    pod.exec(&["ip", "link", "set", "eth0", "address", "0a:58:00:00:00:77"])
        .ok();
    assert_check_fails(&node, &pod, &conf, &r, &["MAC", "0a:58:00:00:00:77"]);
    r = fresh(&node, &pod, &conf);

    // The interface down.
    pod.exec(&["ip", "link", "set", "eth0", "down"]).ok();
    assert_check_fails(&node, &pod, &conf, &r, &["down"]);
    r = fresh(&node, &pod, &conf);

    // A missing host route on the node.
    let host = r.host_interface().name.clone();
    let ip4 = r.ip4();
    node.exec(&["ip", "route", "del", &format!("{ip4}/32"), "dev", &host])
        .ok();
    assert_check_fails(&node, &pod, &conf, &r, &["node route", &ip4, "missing"]);
    r = fresh(&node, &pod, &conf);

    // The host veth gone (renamed: the container end stays, its peer is not ours).
    node.exec(&["ip", "link", "set", &host, "name", "renamed0"])
        .ok();
    assert_check_fails(
        &node,
        &pod,
        &conf,
        &r,
        &["host veth", &host, "does not exist"],
    );
    node.exec(&["ip", "link", "set", "renamed0", "name", &host])
        .ok();
    r = fresh(&node, &pod, &conf);

    // The container interface gone altogether (deleting it takes the host end too).
    pod.exec(&["ip", "link", "del", "eth0"]).ok();
    assert_check_fails(&node, &pod, &conf, &r, &["eth0", "does not exist"]);
    r = fresh(&node, &pod, &conf);

    // prevResult that does not match: an address this pod does not have.
    let mut wrong = r.raw.clone();
    wrong["ips"][0]["address"] = json!("10.244.1.250/32");
    let out = node.check(&pod, "eth0", &conf, &wrong);
    let e = out.assert_error(104);
    assert!(format!("{e:?}").contains("10.244.1.250"), "{e:?}");

    node.check(&pod, "eth0", &conf, &r.raw)
        .assert_empty_success();
    node.del(&pod, "eth0", &conf);
    node.store("testnet").assert_empty("after DEL");
}

/// When DEL returns, the container holds no interface of `CNI_IFNAME`, for every
/// cniVersion, even while the pair waits for its finishing process: another plugin's ADD of
/// that name into the namespace (a runtime reconnecting the container to another network)
/// succeeds at once. On the node, only the retired host veth (down, no address, no route)
/// remains, until the finishing process deletes it within the bound tests settle by.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn when_del_returns_the_container_has_no_interface_of_that_name_in_every_version() {
    let node = SimNode::new("del_ifname");
    let base = node.conf();
    node.warm_up(&base);
    let ptp = json!({
        "cniVersion": "1.0.0",
        "name": "another",
        "type": "ptp",
        "ipam": {
            "type": "host-local",
            "subnet": "10.99.0.0/24",
            "dataDir": node.dir().join("host-local"),
        },
    });
    let ptp_bin = std::path::Path::new("/usr/lib/cni/ptp");
    let mut lingered = Vec::new();
    for version in testbed::ALL_VERSIONS {
        let conf = base.clone().version(version);
        let pod = node.pod(&format!("v{}", version.replace('.', "")));
        node.add(&pod, "eth0", &conf);
        let host = cni_ebpf::kernel::link::host_veth_name(pod.container_id(), "eth0");
        node.del_unsettled(&pod, "eth0", &conf)
            .assert_empty_success();
        let returned = std::time::Instant::now();
        let in_pod: Vec<String> = links(pod.netns()).into_iter().map(|l| l.name).collect();
        assert!(
            !in_pod.iter().any(|n| n == "eth0"),
            "{version}: eth0 is still in the container after DEL returned: {in_pod:?}"
        );
        // What may remain on the node: the retired host veth, down, without routes.
        if let Some(l) = link(node.netns(), &host) {
            assert!(
                !l.up,
                "{version}: the retired host veth {host} is up: {l:?}"
            );
            let routes = node.exec(&["ip", "route", "show", "dev", &host]).stdout;
            assert!(
                routes.trim().is_empty(),
                "{version}: routes through the retired {host}: {routes}"
            );
        }
        // Another network's plugin takes the name at once.
        let other = testbed::CniEnv::new(&format!("other-{version}"), pod.netns(), "eth0");
        let add = node.exec_plugin_bin(ptp_bin, "ADD", &other, &ptp);
        assert!(
            add.success(),
            "{version}: another plugin's ADD of eth0 right after DEL failed: {}",
            add.raw
        );
        node.exec_plugin_bin(ptp_bin, "DEL", &other, &ptp)
            .assert_empty_success();
        // The finishing process deletes the retired pair.
        while link(node.netns(), &host).is_some() {
            assert!(
                returned.elapsed() < testbed::plugin::SETTLE_WAIT,
                "{version}: the retired {host} outlived {:?}",
                testbed::plugin::SETTLE_WAIT
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        lingered.push(returned.elapsed());
    }
    lingered.sort();
    eprintln!(
        "retired host veths deleted {:?} .. {:?} after DEL returned",
        lingered.first(),
        lingered.last()
    );
    testbed::plugin::settle_network(&base.plugin());
    assert!(host_veths(node.netns()).is_empty(), "host veths left");
    node.store("testnet").assert_empty("after every DEL");
}

/// A burst of concurrent ADDs and DELs (a rollout): when each DEL returns its container
/// has no `eth0`; the retired pairs share the deletions of the burst, and none outlives
/// it.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_burst_of_dels_leaves_no_interface_in_the_containers_and_no_veth_after_it() {
    const PODS: usize = 48;
    const THREADS: usize = 8;
    let node = SimNode::new("del_burst");
    let conf = node.conf();
    node.warm_up(&conf);
    let before = (node.snapshot(), node.pins());
    let pods: Vec<Pod> = (0..PODS).map(|i| node.pod(&format!("b{i}"))).collect();
    let left_in_pods = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for chunk in pods.chunks(PODS / THREADS) {
            let (node, conf, left) = (&node, &conf, &left_in_pods);
            s.spawn(move || {
                for p in chunk {
                    node.add(p, "eth0", conf);
                }
                for p in chunk {
                    node.del_unsettled(p, "eth0", conf).assert_empty_success();
                    if link(p.netns(), "eth0").is_some() {
                        left.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(p.name().to_owned());
                    }
                }
            });
        }
    });
    let returned = std::time::Instant::now();
    let left = left_in_pods.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(
        left.is_empty(),
        "eth0 still in containers after DEL returned: {left:?}"
    );
    testbed::plugin::settle_network(&conf.plugin());
    eprintln!(
        "{PODS} concurrent DELs: the last retired pair gone {:?} after the last DEL returned",
        returned.elapsed()
    );
    assert_gone(&node, &pods[0], &before, "after the burst");
}
