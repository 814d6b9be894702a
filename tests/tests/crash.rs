//! Issue 11, first slice: a runtime may SIGKILL the plugin at any instant of ADD (a
//! timeout, an OOM kill, a node shutting down) and then calls DEL for the same container,
//! with no `prevResult`, while the netns still exists. Nothing may stay behind: no host
//! veth, no container interface, no datapath entry, no reservation, no temporary file in
//! the store; afterwards every address of the range can be handed out again.
//!
//! `CNI_EBPF_CRASH_ROUNDS` sets the number of kills (default 60, as the report).

#![expect(clippy::panic, reason = "tests fail by panicking with a message")]

use std::{
    io::Write,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tests::{
    inspect::{host_veths, is_host_veth_name, links},
    process::in_netns,
    CniEnv, SimNode,
};

/// Rounds of "ADD killed after a random delay, then DEL".
fn rounds() -> usize {
    std::env::var("CNI_EBPF_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// A small xorshift generator: the delays only need to spread over the ADD.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
            | 1;
        eprintln!("crash delays seeded with {seed}");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Starts `verb` as a runtime would and SIGKILLs it after `delay` (if it is still
/// running). Returns whether it was killed (rather than finished first).
fn killed(node: &SimNode, verb: &str, env: &CniEnv, stdin: &[u8], delay: Duration) -> bool {
    let bin = node.cni_bin_dir().join("cni-ebpf");
    let mut c = Command::new(&bin);
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", node.cni_bin_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    in_netns(&mut c, node.netns());
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(stdin);
    }
    let start = Instant::now();
    while start.elapsed() < delay {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let finished = matches!(child.try_wait(), Ok(Some(_)));
    // Our own child, by its PID.
    let _ = child.kill();
    let _ = child.wait();
    !finished
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kill_9_anywhere_in_add_then_del_leaves_nothing() {
    let node = SimNode::new("crash");
    // A /27: 29 addresses for pods, so the final full-range cycle is quick.
    let conf = node.conf().version("1.1.0").subnets(&["10.244.1.0/27"]);
    let plugin = conf.plugin().to_string().into_bytes();
    let mut rng = Rng::new();
    let (n, mut kills) = (rounds(), 0);
    // How long one ADD takes here: the kills are spread over 1.5 times that.
    node.warm_up(&conf);
    // Timed the way the kills run it (spawned and polled, not through the harness, whose
    // own overhead would stretch the window past the ADD); the median of three.
    let add_time = {
        let mut times: Vec<Duration> = (0..3)
            .map(|k| {
                let probe = node.pod(&format!("probe{k}"));
                let env = CniEnv::new(&format!("probe{k}"), probe.netns(), "eth0");
                let started = Instant::now();
                let was_killed = killed(&node, "ADD", &env, &plugin, Duration::from_secs(30));
                let took = started.elapsed();
                assert!(!was_killed, "probe ADD {k} did not finish in 30 s");
                assert!(node.exec_plugin_raw("DEL", &env, &plugin).success());
                took
            })
            .collect();
        times.sort();
        times[1]
    };
    let spread = (add_time.as_micros() as u64 * 3 / 2).max(1);
    for i in 0..n {
        let cid = format!("crash-{}-{i}", std::process::id());
        let pod = node.pod(&format!("p{i}"));
        let env = CniEnv::new(&cid, pod.netns(), "eth0");
        if i == 0 {
            // The first kill lands while the datapath is being loaded and pinned (its pins
            // removed after the warm-up): the next ADD must finish the job.
            let dir = node.pin_root().join("testnet");
            std::fs::remove_dir_all(&dir)
                .unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
        }
        // Round 0 kills within the first load (≈ 5× an ADD), the others within an ADD.
        let window = if i == 0 { spread * 4 } else { spread };
        if killed(
            &node,
            "ADD",
            &env,
            &plugin,
            Duration::from_micros(rng.below(window)),
        ) {
            kills += 1;
        }
        // The DEL that follows, in the ways a runtime may send it.
        let (variant, del_env) = match i % 4 {
            0 => ("netns present", env.clone()),
            // The pod's namespace is gone already (the runtime tore the sandbox down).
            1 => ("netns gone", env.clone()),
            2 => ("empty CNI_NETNS", env.clone().with_netns("")),
            _ => ("a killed DEL first", env.clone()),
        };
        let pod_gone = i % 4 == 1;
        let pod = if pod_gone {
            drop(pod);
            None
        } else {
            Some(pod)
        };
        if i % 4 == 3 {
            let delay = Duration::from_micros(rng.below(spread * 2));
            killed(&node, "DEL", &del_env, &plugin, delay);
        }
        let del = node.exec_plugin_raw("DEL", &del_env, &plugin);
        assert!(
            del.success(),
            "round {i} ({variant}): DEL after a killed ADD failed: {}",
            del.raw
        );
        // Labelled or not: a killed ADD may have left the pair before its alias was set.
        let left: Vec<_> = links(node.netns())
            .into_iter()
            .filter(|l| is_host_veth_name(&l.name))
            .collect();
        assert!(
            left.is_empty(),
            "round {i} ({variant}): DEL after a killed ADD left host veths: {left:?}"
        );
        if let Some(pod) = &pod {
            let ctr = pod.exec(&["ip", "-o", "link", "show", "eth0"]);
            assert!(
                !ctr.success(),
                "round {i} ({variant}): the pod still has its interface: {}",
                ctr.stdout
            );
        }
        if i == 0 {
            // Whatever the killed load left, the next complete ADD loads it all.
            node.warm_up(&conf);
        }
    }
    eprintln!(
        "{n} rounds, {kills} ADDs killed before they finished (ADD ≈ {add_time:?}, kills \
         spread over {spread} µs)"
    );
    assert!(
        kills * 3 >= n,
        "only {kills} of {n} ADDs were killed: the delays missed the ADD"
    );

    node.store("testnet")
        .assert_empty(&format!("after {n} killed ADDs"));
    let eps = node.endpoints("testnet");
    assert!(eps.is_empty(), "endpoint entries left: {eps:?}");

    // Every address of the range is free again: a full range of pods gets addresses.
    let pods: Vec<_> = (0..29).map(|i| node.pod(&format!("f{i}"))).collect();
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("full-{i}"), p.netns(), "eth0");
        let add = node.exec_plugin_raw("ADD", &env, &plugin);
        assert!(add.success(), "full-range pod {i}: {}", add.raw);
    }
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("full-{i}"), p.netns(), "eth0");
        assert!(node.exec_plugin_raw("DEL", &env, &plugin).success());
    }
    node.store("testnet")
        .assert_empty("after the full-range cycle");
    assert!(host_veths(node.netns()).is_empty());
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kill_9_during_gc_then_gc_leaves_nothing() {
    let node = SimNode::new("crashgc");
    let conf = node.conf().version("1.1.0").subnets(&["10.244.1.0/27"]);
    let plugin = conf.plugin().to_string().into_bytes();
    node.warm_up(&conf);
    let mut rng = Rng::new();
    // Stale attachments GC must collect: complete ones, and ADDs killed half-way.
    let pods: Vec<_> = (0..12).map(|i| node.pod(&format!("g{i}"))).collect();
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("stale-{i}"), p.netns(), "eth0");
        if i % 2 == 0 {
            assert!(node.exec_plugin_raw("ADD", &env, &plugin).success());
        } else {
            killed(
                &node,
                "ADD",
                &env,
                &plugin,
                Duration::from_micros(rng.below(20_000)),
            );
        }
    }
    let gc = conf
        .clone()
        .set("cni.dev/valid-attachments", serde_json::json!([]))
        .plugin()
        .to_string()
        .into_bytes();
    // GC killed at random points, several times, then one that runs to the end.
    let mut gc_kills = 0;
    for _ in 0..5 {
        if killed(
            &node,
            "GC",
            &CniEnv::default(),
            &gc,
            Duration::from_micros(rng.below(30_000)),
        ) {
            gc_kills += 1;
        }
    }
    let out = node.exec_plugin_raw("GC", &CniEnv::default(), &gc);
    assert!(out.success(), "GC after {gc_kills} killed GCs: {}", out.raw);
    eprintln!("{gc_kills} of 5 GCs killed before they finished");
    node.store("testnet").assert_empty("after GC");
    let eps = node.endpoints("testnet");
    assert!(eps.is_empty(), "endpoint entries left after GC: {eps:?}");
    let labelled = host_veths(node.netns());
    assert!(
        labelled.is_empty(),
        "GC left labelled host veths: {labelled:?}"
    );
    // A killed ADD's unlabelled pair is the DEL's to collect (GC cannot tell whose it
    // is): the runtime's DEL for those containers removes them.
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("stale-{i}"), p.netns(), "eth0");
        assert!(node.exec_plugin_raw("DEL", &env, &plugin).success());
    }
    let left: Vec<_> = links(node.netns())
        .into_iter()
        .filter(|l| is_host_veth_name(&l.name))
        .collect();
    assert!(left.is_empty(), "host veths left: {left:?}");
}
