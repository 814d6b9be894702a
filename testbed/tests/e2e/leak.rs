//! Leak check: many ADD+DEL cycles leave the node with the same links, routes and
//! addresses, the same pins, an empty datapath and an empty store.

use std::time::Instant;

use testbed::{inspect::host_veths, CniEnv, SimNode};

const CYCLES: usize = 200;

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn two_hundred_add_del_cycles_leak_nothing() {
    let node = SimNode::new("leak");
    let conf = node.conf().version("1.1.0");
    let plugin = conf.plugin();
    node.warm_up(&conf);
    let before = node.snapshot();
    let pins_before = node.pins();
    let pod = node.pod("p");
    let pod_before = pod.snapshot();

    let started = Instant::now();
    for i in 0..CYCLES {
        // A new container ID each time (64 hex digits, as Kubernetes runtimes make them):
        // new host veth names, aliases and reservation keys.
        let cid = format!("{:032x}{:032x}", std::process::id(), i);
        let env = CniEnv::new(&cid, pod.netns(), "eth0");
        let add = node.exec_plugin("ADD", &env, &plugin);
        assert!(add.success(), "cycle {i}: ADD failed: {}", add.raw);
        let del = node.exec_plugin("DEL", &env, &plugin);
        assert!(
            del.success() && del.raw.stdout.trim().is_empty(),
            "cycle {i}: DEL failed: {}",
            del.raw
        );
    }
    eprintln!(
        "{CYCLES} ADD+DEL cycles in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let d = node.snapshot().diff(&before);
    assert!(
        d.is_empty(),
        "after {CYCLES} cycles the node differs:\n{}",
        d.join("\n")
    );
    pod.snapshot().assert_same_as(&pod_before);
    assert!(host_veths(node.netns()).is_empty(), "host veths left");
    assert_eq!(
        node.pins(),
        pins_before,
        "pins changed over {CYCLES} cycles"
    );
    let eps = node.endpoints("testnet");
    assert!(eps.is_empty(), "endpoint entries left: {eps:?}");
    node.store("testnet")
        .assert_empty(&format!("after {CYCLES} cycles"));
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn concurrent_adds_on_a_fresh_node_all_succeed() {
    // A node that just booted gets many pods at once: the first ADDs race to load and pin
    // the programs and to create the store. Every one must succeed with its own address.
    const PODS: usize = 8;
    let node = SimNode::new("concurrent");
    let conf = node.conf();
    let pods: Vec<testbed::Pod> = (0..PODS).map(|i| node.pod(&format!("c{i}"))).collect();
    let results: Vec<testbed::ResultView> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| s.spawn(|| node.add(p, "eth0", &conf)))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(e) => std::panic::resume_unwind(e),
            })
            .collect()
    });
    let mut ips: Vec<String> = results.iter().map(testbed::ResultView::ip4).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), PODS, "addresses handed out twice: {ips:?}");
    for r in &results {
        testbed::assert_ping(node.netns(), &r.ip4());
    }
    for (p, r) in pods.iter().zip(&results) {
        node.check(p, "eth0", &conf, &r.raw).assert_empty_success();
    }
    std::thread::scope(|s| {
        for p in &pods {
            s.spawn(|| node.del(p, "eth0", &conf));
        }
    });
    assert!(host_veths(node.netns()).is_empty(), "host veths left");
    node.store("testnet").assert_empty("after concurrent DELs");
}
