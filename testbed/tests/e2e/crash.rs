//! A runtime may SIGKILL the plugin at any instant of ADD (a
//! timeout, an OOM kill, a node shutting down) and then calls DEL for the same container,
//! with no `prevResult`, while the netns still exists. Nothing may stay behind: no host
//! veth, no container interface, no datapath entry, no reservation, no temporary file in
//! the store; afterwards every address of the range can be handed out again.
//!
//! Two campaigns, together over 1 000 kills in the default run:
//! - random delays: `CNI_EBPF_CRASH_ROUNDS` ADDs (default 800) each SIGKILLed after a random
//!   delay within 1.5× an ADD's duration (about half of them die before finishing);
//! - named steps: the fault-injection build stops itself at each named point of ADD, DEL
//!   and GC (`cni_ebpf::faults::POINTS`, `CNI_EBPF_PAUSE_AT`) and is killed exactly there,
//!   `CNI_EBPF_CRASH_STEP_PASSES` times over (default 4 × 75 kills).
//!
//! Each kill is followed by DEL (or GC) and a check that nothing is left; each campaign
//! ends with a full-range cycle. DEL's finishing process (`cni-ebpf finish-del`, which
//! purges the pod's flows and deletes its retired veth after DEL returned) is killed at
//! each of its points by a test of its own. Longer campaigns: raise both variables, e.g.
//! `CNI_EBPF_CRASH_ROUNDS=10000 CNI_EBPF_CRASH_STEP_PASSES=100 cargo xtask test crash`.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use testbed::datapath::nat_mentioning;
use testbed::{
    inspect::{host_veths, is_host_veth_name, links},
    process::in_netns,
    CniEnv, SimNode,
};

/// A GC of `conf`'s network with no valid attachment: everything of it is stale.
fn gc_of_nothing(conf: &testbed::ConfBuilder) -> Vec<u8> {
    conf.clone()
        .set("cni.dev/valid-attachments", serde_json::json!([]))
        .plugin()
        .to_string()
        .into_bytes()
}

/// Rounds of "ADD killed after a random delay, then DEL".
fn rounds() -> usize {
    std::env::var("CNI_EBPF_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(800)
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

/// Starts `bin` with `CNI_COMMAND=verb` as a runtime would (in the node namespace, a
/// clean environment plus `extra`), `stdin` written to it.
fn spawn_plugin(
    node: &SimNode,
    bin: &std::path::Path,
    verb: &str,
    env: &CniEnv,
    stdin: &[u8],
    extra: &[(&str, &str)],
) -> std::process::Child {
    let mut c = Command::new(bin);
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_PATH", node.cni_bin_dir())
        .envs(extra.iter().copied())
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
    child
}

/// Starts `verb` as a runtime would and SIGKILLs it after `delay` (if it is still
/// running). Returns whether it was killed (rather than finished first).
fn killed(node: &SimNode, verb: &str, env: &CniEnv, stdin: &[u8], delay: Duration) -> bool {
    let bin = node.cni_bin_dir().join("cni-ebpf");
    let mut child = spawn_plugin(node, &bin, verb, env, stdin, &[]);
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

/// A plugin process of the fault-injection build stopped at a named fault point.
struct Paused {
    child: std::process::Child,
}

impl Paused {
    /// SIGKILLs it where it stands (our own child, by its PID) and reaps it.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `verb` with the fault-injection build told to stop at `point`
/// (`CNI_EBPF_PAUSE_AT`), and waits (at most 20 s) until it has stopped there. `None`
/// if it finished without reaching the point.
fn pause_at(node: &SimNode, verb: &str, env: &CniEnv, stdin: &[u8], point: &str) -> Option<Paused> {
    let mut child = spawn_plugin(
        node,
        &testbed::fault_bin(),
        verb,
        env,
        stdin,
        &[("CNI_EBPF_PAUSE_AT", point)],
    );
    let stat = format!("/proc/{}/stat", child.id());
    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        // `pid (comm) S ...`: the state follows the last `)`.
        let stopped = std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false);
        if stopped {
            return Some(Paused { child });
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{verb} neither stopped at {point} nor finished in 20 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The fault points of ADD, in order, read from the plugin's own list
/// (`cni-ebpf/src/faults.rs`: the quoted names between `// ADD` and `// DEL` in
/// `POINTS`), so a point added there is visited here. `load-maps-pinned` is only passed by
/// the ADD that loads the datapath.
fn add_points() -> Vec<&'static str> {
    const SOURCE: &str = include_str!("../../../cni-ebpf/src/faults.rs");
    let list = SOURCE
        .split_once("pub const POINTS")
        .and_then(|(_, rest)| rest.split_once("// ADD"))
        .and_then(|(_, rest)| rest.split_once("// DEL"))
        .map_or("", |(add, _)| add);
    let points: Vec<&'static str> = list
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.split_once('"').map(|(p, _)| p))
        .collect();
    assert!(
        points.len() >= 10 && points[0] == "load-maps-pinned",
        "could not read ADD's fault points from faults.rs: {points:?}"
    );
    points
}

/// Passes over every ADD, DEL and GC fault point (`CNI_EBPF_CRASH_STEP_PASSES`, default
/// 4, about 2.5 minutes; one pass is 11 ADD points × 5 DEL variants (netns present, gone, empty
/// `CNI_NETNS`, a killed DEL first — one more kill —, with a prevResult) + 5 DEL points +
/// 4 GC points = 75 kills).
fn step_passes() -> usize {
    std::env::var("CNI_EBPF_CRASH_STEP_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// Panics unless nothing of any attachment is left on `node`: no host veth (labelled or
/// not), no endpoint entry, no host port, nothing in the IPAM store.
#[track_caller]
fn assert_nothing_left(node: &SimNode, what: &str) {
    let left: Vec<_> = links(node.netns())
        .into_iter()
        .filter(|l| is_host_veth_name(&l.name))
        .collect();
    assert!(left.is_empty(), "{what}: host veths left: {left:?}");
    node.store("testnet").assert_empty(what);
    // After a first load killed half-way nothing is completely pinned yet: no entries.
    let progs = node.pin_root().join(format!(
        "testnet/v{}/progs",
        cni_ebpf_common::LAYOUT_VERSION
    ));
    let loaded =
        std::fs::read_dir(&progs).is_ok_and(|d| d.count() == cni_ebpf_common::prog::ALL.len());
    if let Some(dp) = loaded.then(|| node.datapath("testnet")).flatten() {
        for key in ["endpoints", "portMappings"] {
            let v = dp[key].as_array().cloned().unwrap_or_default();
            assert!(v.is_empty(), "{what}: {key} left: {v:?}");
        }
    }
}

/// Every address of the /27 is free again: a full range of pods gets addresses.
fn full_range_cycle(node: &SimNode, plugin: &[u8]) {
    let pods: Vec<_> = (0..29).map(|i| node.pod(&format!("f{i}"))).collect();
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("full-{i}"), p.netns(), "eth0");
        let add = node.exec_plugin_raw("ADD", &env, plugin);
        assert!(add.success(), "full-range pod {i}: {}", add.raw);
    }
    for (i, p) in pods.iter().enumerate() {
        let env = CniEnv::new(&format!("full-{i}"), p.netns(), "eth0");
        assert!(node.exec_plugin_raw("DEL", &env, plugin).success());
    }
    assert_nothing_left(node, "after the full-range cycle");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn kill_9_at_every_named_step_then_del_or_gc_leaves_nothing() {
    let node = SimNode::new("crashsteps");
    let conf = node.conf().version("1.1.0").subnets(&["10.244.1.0/27"]);
    let hostport = conf.clone().set(
        "runtimeConfig",
        serde_json::json!({ "portMappings": [{ "hostPort": 18080, "containerPort": 80, "protocol": "tcp" }] }),
    );
    let plugin = hostport.plugin().to_string().into_bytes();
    let plain = conf.plugin().to_string().into_bytes();
    let gc = gc_of_nothing(&conf);
    node.warm_up(&conf);
    let started = Instant::now();
    let (passes, mut kills, mut round) = (step_passes(), 0usize, 0usize);
    for pass in 0..passes {
        for point in add_points() {
            for variant in 0..5 {
                round += 1;
                let what = format!("pass {pass}, ADD killed at {point}, DEL variant {variant}");
                if point == "load-maps-pinned" {
                    // Only the first ADD on a node loads: start from no pins.
                    let dir = node.pin_root().join("testnet");
                    std::fs::remove_dir_all(&dir)
                        .unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
                }
                let cid = format!("step-{round}");
                let pod = node.pod(&format!("s{round}"));
                let env = CniEnv::new(&cid, pod.netns(), "eth0");
                let Some(paused) = pause_at(&node, "ADD", &env, &plugin, point) else {
                    panic!("{what}: ADD finished without passing {point}");
                };
                paused.kill();
                kills += 1;
                let del_env = match variant {
                    2 => env.clone().with_netns(""),
                    _ => env.clone(),
                };
                let pod = if variant == 1 {
                    drop(pod);
                    None
                } else {
                    Some(pod)
                };
                if variant == 3 {
                    // A DEL killed half-way first.
                    if let Some(p) =
                        pause_at(&node, "DEL", &del_env, &plugin, "teardown-datapath-removed")
                    {
                        p.kill();
                        kills += 1;
                    }
                }
                // Variant 4: DEL with a prevResult (a runtime that cached what it expected):
                // the reservation's address if the killed ADD made one, else one it never
                // got — DEL must clean up by its own records and touch nothing else.
                let stdin = if variant == 4 {
                    let store = node.store("testnet");
                    let held = store
                        .keys
                        .iter()
                        .any(|k| k.starts_with(&format!("{cid}:")))
                        .then(|| store.ips.first().cloned())
                        .flatten()
                        .unwrap_or_else(|| "10.244.1.30".to_owned());
                    hostport
                        .clone()
                        .set(
                            "prevResult",
                            serde_json::json!({
                                "cniVersion": "1.1.0",
                                "interfaces": [{ "name": "eth0", "sandbox": env.netns }],
                                "ips": [{ "address": format!("{held}/27"), "gateway": "10.244.1.1", "interface": 0 }],
                            }),
                        )
                        .plugin()
                        .to_string()
                        .into_bytes()
                } else {
                    plugin.clone()
                };
                let del = node.exec_plugin_raw("DEL", &del_env, &stdin);
                assert!(del.success(), "{what}: DEL failed: {}", del.raw);
                assert_nothing_left(&node, &what);
                if let Some(pod) = &pod {
                    let ctr = pod.exec(&["ip", "-o", "link", "show", "eth0"]);
                    assert!(
                        !ctr.success(),
                        "{what}: the pod still has eth0: {}",
                        ctr.stdout
                    );
                }
                if point == "load-maps-pinned" {
                    node.warm_up(&conf);
                }
            }
        }
        // DEL killed at each of its points, then DEL again.
        for point in [
            "ipam-key-retired",
            "del-ipam-released",
            "del-host-veth-retired",
            "teardown-endpoints-marked",
            "teardown-datapath-removed",
        ] {
            round += 1;
            let what = format!("pass {pass}, DEL killed at {point}");
            let pod = node.pod(&format!("d{round}"));
            let env = CniEnv::new(&format!("del-{round}"), pod.netns(), "eth0");
            assert!(
                node.exec_plugin_raw("ADD", &env, &plugin).success(),
                "{what}"
            );
            let Some(p) = pause_at(&node, "DEL", &env, &plugin, point) else {
                panic!("{what}: DEL finished without passing {point}");
            };
            p.kill();
            kills += 1;
            assert!(
                node.exec_plugin_raw("DEL", &env, &plugin).success(),
                "{what}"
            );
            assert_nothing_left(&node, &what);
        }
        // GC killed at each of its points (with stale attachments to collect), then GC.
        for point in [
            "ipam-key-retired",
            "gc-ipam-released",
            "teardown-endpoints-marked",
            "teardown-datapath-removed",
        ] {
            round += 1;
            let what = format!("pass {pass}, GC killed at {point}");
            let pods: Vec<_> = (0..3).map(|k| node.pod(&format!("g{round}-{k}"))).collect();
            for (k, p) in pods.iter().enumerate() {
                let env = CniEnv::new(&format!("gc-{round}-{k}"), p.netns(), "eth0");
                // The one with the host port, the others plain (one port, one owner).
                let pl = if k == 0 { &plugin } else { &plain };
                assert!(node.exec_plugin_raw("ADD", &env, pl).success(), "{what}");
            }
            let Some(p) = pause_at(&node, "GC", &CniEnv::default(), &gc, point) else {
                panic!("{what}: GC finished without passing {point}");
            };
            p.kill();
            kills += 1;
            let out = node.exec_plugin_raw("GC", &CniEnv::default(), &gc);
            assert!(out.success(), "{what}: {}", out.raw);
            assert_nothing_left(&node, &what);
        }
    }
    eprintln!(
        "{kills} kills at named steps in {passes} passes, {:?}",
        started.elapsed()
    );
    full_range_cycle(&node, &plain);
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn gc_collects_a_killed_adds_unlabelled_pair_but_never_one_in_flight() {
    let node = SimNode::new("halfmade");
    let conf = node.conf().version("1.1.0").subnets(&["10.244.1.0/27"]);
    let other = node
        .conf()
        .version("1.1.0")
        .name("othernet")
        .subnets(&["10.245.1.0/27"]);
    let plugin = conf.plugin().to_string().into_bytes();
    let other_plugin = other.plugin().to_string().into_bytes();
    // The runtime knows both ADDs (they are its own, in flight or failed): GC's own
    // bookkeeping leaves them alone, so only the sweep of unlabelled pairs is on trial.
    let gc = conf
        .clone()
        .set(
            "cni.dev/valid-attachments",
            serde_json::json!([
                { "containerID": "live", "ifname": "eth0" },
                { "containerID": "dead", "ifname": "eth0" },
            ]),
        )
        .plugin()
        .to_string()
        .into_bytes();
    node.warm_up(&conf);
    node.warm_up(&other);
    let unlabelled = |node: &SimNode| -> Vec<String> {
        links(node.netns())
            .into_iter()
            .filter(|l| is_host_veth_name(&l.name) && l.alias.is_none())
            .map(|l| l.name)
            .collect()
    };

    // An ADD stopped between creating its pair and labelling it: alive, holding the lock.
    let live = node.pod("live");
    let live_env = CniEnv::new("live", live.netns(), "eth0");
    let Some(in_flight) = pause_at(&node, "ADD", &live_env, &plugin, "veth") else {
        panic!("ADD finished without passing `veth`")
    };
    // A dead one of this network, and a dead one of another network on the node.
    let dead = node.pod("dead");
    let dead_env = CniEnv::new("dead", dead.netns(), "eth0");
    let Some(p) = pause_at(&node, "ADD", &dead_env, &plugin, "veth") else {
        panic!("ADD finished without passing `veth`")
    };
    let foreign = node.pod("foreign");
    let foreign_env = CniEnv::new("foreign", foreign.netns(), "eth0");
    let Some(f) = pause_at(&node, "ADD", &foreign_env, &other_plugin, "veth") else {
        panic!("ADD finished without passing `veth`")
    };
    f.kill();
    assert_eq!(unlabelled(&node).len(), 3, "three unlabelled pairs");

    // While the live ADD holds the lock, GC may not tell the dead pair from the live one:
    // it leaves both (within its bounded wait) and still succeeds.
    let t = Instant::now();
    let out = node.exec_plugin_raw("GC", &CniEnv::default(), &gc);
    assert!(out.success(), "GC beside an ADD in flight: {}", out.raw);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "GC waited {:?}",
        t.elapsed()
    );
    assert_eq!(
        unlabelled(&node).len(),
        3,
        "GC touched a pair while an ADD was in flight"
    );

    // The dead ADD is killed too: now GC collects this network's dead pairs only.
    p.kill();
    in_flight.kill();
    let out = node.exec_plugin_raw("GC", &CniEnv::default(), &gc);
    assert!(out.success(), "GC: {}", out.raw);
    let left = unlabelled(&node);
    assert_eq!(
        left.len(),
        1,
        "GC left {left:?}: expected only the other network's pair"
    );
    assert!(
        !links(dead.netns()).iter().any(|l| l.name == "eth0"),
        "the dead pair's container end went with it"
    );
    // That network's own GC collects it; the runtime's DELs then find nothing to do.
    let other_gc = gc_of_nothing(&other);
    assert!(node
        .exec_plugin_raw("GC", &CniEnv::default(), &other_gc)
        .success());
    assert!(unlabelled(&node).is_empty(), "{:?}", unlabelled(&node));
    for (env, pl) in [
        (&live_env, &plugin),
        (&dead_env, &plugin),
        (&foreign_env, &other_plugin),
    ] {
        assert!(node.exec_plugin_raw("DEL", env, pl).success());
    }
    node.store("testnet").assert_empty("after GC and DEL");
    node.store("othernet").assert_empty("after GC and DEL");
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
    let time_add = |round: usize| {
        let mut times: Vec<Duration> = (0..3)
            .map(|k| {
                let probe = node.pod(&format!("probe{round}-{k}"));
                let env = CniEnv::new(&format!("probe{round}-{k}"), probe.netns(), "eth0");
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
    let mut add_time = time_add(0);
    let mut spread = (add_time.as_micros() as u64 * 3 / 2).max(1);
    // The machine's load changes over a run (other tests, other work): an ADD timed once
    // may no longer be what the kills race. Each block of rounds that killed too few is
    // followed by timing the ADD again.
    const BLOCK: usize = 50;
    let mut block_kills = 0;
    for i in 0..n {
        if i > 0 && i % BLOCK == 0 {
            if block_kills * 3 < BLOCK {
                add_time = time_add(i);
                spread = (add_time.as_micros() as u64 * 3 / 2).max(1);
            }
            block_kills = 0;
        }
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
            block_kills += 1;
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
        "{n} rounds, {kills} ADDs killed before they finished (ADD ≈ {add_time:?} when last \
         timed, kills spread over {spread} µs)"
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
    let gc = gc_of_nothing(&conf);
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
    // GC also collected the pairs the killed ADDs never labelled (`unlabelled_veths`).
    let left: Vec<_> = links(node.netns())
        .into_iter()
        .filter(|l| is_host_veth_name(&l.name))
        .collect();
    assert!(left.is_empty(), "GC left unlabelled host veths: {left:?}");
    // The runtime's DELs for those containers then find nothing to do.
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

/// A node whose network (`testnet`, a /27) masquerades what leaves the cluster, warmed up;
/// with its configuration and that as a plugin's stdin.
fn masquerading_node(name: &str) -> (SimNode, testbed::ConfBuilder, Vec<u8>) {
    let node = SimNode::new(name);
    let conf = node
        .conf()
        .version("1.1.0")
        .subnets(&["10.244.1.0/27"])
        .set("ipMasq", serde_json::json!(true))
        .set("clusterCIDRs", serde_json::json!(["10.244.0.0/16"]));
    let plain = conf.plugin().to_string().into_bytes();
    node.warm_up(&conf);
    (node, conf, plain)
}

/// ADDs `env` (pod namespace `netns`) and pings ext from it, which leaves masquerade
/// entries of its address; returns the address with and without its prefix.
#[track_caller]
fn add_and_ping_out(
    node: &SimNode,
    env: &CniEnv,
    netns: &std::path::Path,
    stdin: &[u8],
) -> (String, String) {
    let add = node.exec_plugin_raw("ADD", env, stdin);
    assert!(add.success(), "ADD {}: {}", env.container_id, add.raw);
    let cidr = add.json()["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ip = cidr.split('/').next().unwrap_or_default().to_owned();
    testbed::assert_ping(netns, testbed::EXT_IP4);
    (cidr, ip)
}

/// `conf`'s plugin configuration asking for address `cidr` (capability `ips`), as a
/// runtime gives a pod a chosen address.
fn with_address(conf: &testbed::ConfBuilder, cidr: &str) -> Vec<u8> {
    conf.clone()
        .set("runtimeConfig", serde_json::json!({ "ips": [cidr] }))
        .plugin()
        .to_string()
        .into_bytes()
}

/// ADDs `env` (pod namespace `netns`) with address `cidr`, which a removed pod's
/// tombstone still holds: the ADD succeeds, none of the old flows of the address is left,
/// `env`'s container owns its entry, and the pod reaches ext. Returns the configuration
/// it was ADDed with.
#[track_caller]
fn add_taking_over(
    node: &SimNode,
    conf: &testbed::ConfBuilder,
    env: &CniEnv,
    netns: &std::path::Path,
    cidr: &str,
) -> Vec<u8> {
    let ip = cidr.split('/').next().unwrap_or_default();
    let stdin = with_address(conf, cidr);
    let who = &env.container_id;
    let add = node.exec_plugin_raw("ADD", env, &stdin);
    assert!(
        add.success(),
        "ADD {who} with the removed pod's {ip}: {}",
        add.raw
    );
    let left = nat_of(node, ip);
    assert!(
        left.is_empty(),
        "the removed pod's flows reached {who}: {left:#?}"
    );
    let ep = endpoint_of(node, ip).unwrap_or_else(|| panic!("no entry for {ip}"));
    assert_eq!(
        ep["container_id"], *who,
        "{who} took the entry over: {ep:#}"
    );
    testbed::assert_ping(netns, testbed::EXT_IP4);
    stdin
}

/// The NAT entries of `node`'s network whose tuple (either side) has `ip`.
fn nat_of(node: &SimNode, ip: &str) -> Vec<serde_json::Value> {
    nat_mentioning(&node.datapath("testnet").unwrap_or_default(), ip)
}

/// The endpoint entry of `ip`, as `inspect` lists it.
fn endpoint_of(node: &SimNode, ip: &str) -> Option<serde_json::Value> {
    let doc = node.datapath("testnet")?;
    doc["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["ip"] == ip)
        .cloned()
}

/// A DEL killed after it marked its pod's endpoint entries as removed (tombstones) but
/// before it purged their flows: the address is free in IPAM, its old flows are still in
/// the NAT table. ADD purges an address's flows only when it finds such a tombstone (a
/// clean removal purged them before dropping the entry), so the next pod given the
/// address must start without them, take the entry over, and be left alone by the old
/// pod's DEL when the runtime runs it again.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_next_pod_given_a_killed_dels_address_starts_without_its_flows() {
    let (node, conf, plain) = masquerading_node("tombstone");

    let a = node.pod("a");
    let env_a = CniEnv::new("tomb-a", a.netns(), "eth0");
    let (cidr, ip) = add_and_ping_out(&node, &env_a, a.netns(), &plain);
    assert!(
        !nat_of(&node, &ip).is_empty(),
        "a's ping to ext should have left masquerade entries for {ip}"
    );

    let Some(p) = pause_at(&node, "DEL", &env_a, &plain, "teardown-endpoints-marked") else {
        panic!("DEL finished without passing teardown-endpoints-marked");
    };
    p.kill();
    // DEL deletes the veth on another thread, which the kill may or may not have beaten.
    // Gone is the state this test is about: with the old veth (and its host route to the
    // address) still there, the next ADD of the address fails until the DEL is retried.
    for l in host_veths(node.netns()) {
        let mut c = Command::new("ip");
        c.args(["link", "del", &l.name]);
        in_netns(&mut c, node.netns());
        let st = c
            .status()
            .unwrap_or_else(|e| panic!("ip link del {}: {e}", l.name));
        assert!(st.success(), "ip link del {}: {st}", l.name);
    }
    let tomb = endpoint_of(&node, &ip).unwrap_or_else(|| panic!("no entry left for {ip}"));
    assert_eq!(tomb["removing"], true, "a tombstone for {ip}: {tomb:#}");
    assert!(
        !nat_of(&node, &ip).is_empty(),
        "the killed DEL should not have purged {ip}'s flows yet"
    );

    // The runtime gives a's address to b (capability `ips`).
    let b = node.pod("b");
    let env_b = CniEnv::new("tomb-b", b.netns(), "eth0");
    let b_conf = add_taking_over(&node, &conf, &env_b, b.netns(), &cidr);
    let ep = endpoint_of(&node, &ip).unwrap_or_else(|| panic!("no entry for {ip}"));
    assert!(ep.get("removing").is_none(), "b's entry is live: {ep:#}");

    // a's DEL again: it finds nothing of its own left at that address.
    let del = node.exec_plugin_raw("DEL", &env_a, &plain);
    assert!(del.success(), "DEL a again: {}", del.raw);
    let ep = endpoint_of(&node, &ip).unwrap_or_else(|| panic!("a's DEL removed b's {ip}"));
    assert_eq!(ep["container_id"], "tomb-b", "{ep:#}");
    assert!(!nat_of(&node, &ip).is_empty(), "a's DEL purged b's flows");
    testbed::assert_ping(b.netns(), testbed::EXT_IP4);

    let del = node.exec_plugin_raw("DEL", &env_b, &b_conf);
    assert!(del.success(), "DEL b: {}", del.raw);
    assert_nothing_left(&node, "after both DELs");
}

/// The finishing process a DEL of `env` started (`cni-ebpf finish-del`, its job naming
/// the container): its PID, once it has stopped itself at the fault point it was told
/// (the state after the last `)` of `/proc/<pid>/stat` is `T`). Waits at most 20 s.
fn stopped_finisher(container_id: &str) -> i32 {
    let needle = format!("\"container_id\":\"{container_id}\"");
    let started = Instant::now();
    loop {
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.get(1).map(String::as_str) != Some("finish-del")
                || !args.get(2).is_some_and(|j| j.contains(&needle))
            {
                continue;
            }
            let stopped = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with('T'))
                })
                .unwrap_or(false);
            if stopped {
                return pid;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no finishing process of {container_id} stopped in 20 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// DEL of `env` by the fault-injection build, whose finishing process stops itself at
/// `point`: DEL must return success at once; then the finishing process is SIGKILLed
/// where it stands (by its PID: a process this test started) and waited for until gone.
fn del_killing_its_finisher(node: &SimNode, env: &CniEnv, stdin: &[u8], point: &str) {
    let pid = del_stopping_its_finisher(node, env, stdin, point);
    signal_and_wait(pid, libc::SIGKILL);
}

/// Sends `signal` to `pid` (a finishing process this test started) and waits until it has
/// exited and been reaped (at most 20 s).
fn signal_and_wait(pid: i32, signal: libc::c_int) {
    // SAFETY: plain syscall; the PID is of a process this test started (DEL's child).
    assert_eq!(
        unsafe { libc::kill(pid, signal) },
        0,
        "kill -{signal} {pid}"
    );
    let proc_dir = format!("/proc/{pid}");
    let started = Instant::now();
    while std::path::Path::new(&proc_dir).exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the finishing process {pid} did not end in 20 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// DEL of `env` by the fault-injection build, whose finishing process stops itself at
/// `point`: DEL must return success at once. Returns the stopped finishing process.
fn del_stopping_its_finisher(node: &SimNode, env: &CniEnv, stdin: &[u8], point: &str) -> i32 {
    let mut del = spawn_plugin(
        node,
        &testbed::fault_bin(),
        "DEL",
        env,
        stdin,
        &[("CNI_EBPF_PAUSE_AT", point)],
    );
    let started = Instant::now();
    let status = loop {
        if let Ok(Some(st)) = del.try_wait() {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "DEL did not return in 20 s with its finishing process stopped at {point}"
        );
        std::thread::sleep(Duration::from_micros(200));
    };
    assert!(
        status.success(),
        "DEL with its finisher stopped at {point}: {status}"
    );
    stopped_finisher(&env.container_id)
}

/// DEL returns before its pod's flows are purged and its veth pair deleted, and leaves
/// that to a process of its own. Killed at either of its points (before anything, and
/// with the retired veth deleted but the flows not purged), nothing is lost: the pod was
/// unreachable from the moment DEL returned; a new pod ADDed into the same namespace and
/// interface with the same address gets none of the old flows and replaces a retired
/// pair left; GC collects a retired pair nobody replaced and the flows nobody purged; and
/// nothing is left after.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_dels_finishing_process_killed_anywhere_loses_nothing() {
    let (node, conf, plain) = masquerading_node("finisher");
    let gc = gc_of_nothing(&conf);
    for (round, point) in ["finish-started", "finish-veth-deleted"]
        .into_iter()
        .flat_map(|p| [(0, p), (1, p)])
    {
        let what = format!("finisher killed at {point}, then {}", ["ADD", "GC"][round]);
        let pod = node.pod(&format!("{point}-{round}"));
        let env_a = CniEnv::new(&format!("fin-a-{point}-{round}"), pod.netns(), "eth0");
        let (cidr, ip) = add_and_ping_out(&node, &env_a, pod.netns(), &plain);
        assert!(!nat_of(&node, &ip).is_empty(), "{what}: no flows of {ip}");

        del_killing_its_finisher(&node, &env_a, &plain, point);
        // The pod is cut off: its host veth is down (no route to it on the node).
        let veths = host_veths(node.netns());
        assert!(
            veths.iter().all(|l| !l.up),
            "{what}: a host veth is still up: {veths:?}"
        );
        testbed::assert_no_ping(pod.netns(), testbed::EXT_IP4);
        let tomb = endpoint_of(&node, &ip).unwrap_or_else(|| panic!("{what}: no entry"));
        assert_eq!(tomb["removing"], true, "{what}: a tombstone: {tomb:#}");
        assert!(!nat_of(&node, &ip).is_empty(), "{what}: flows purged early");
        let retired = usize::from(point == "finish-started");
        assert_eq!(veths.len(), retired, "{what}: the retired pair: {veths:?}");

        if round == 0 {
            // The runtime puts a new sandbox into the same namespace, with a's address.
            let env_b = CniEnv::new(&format!("fin-b-{point}"), pod.netns(), "eth0");
            let b_conf = with_address(&conf, &cidr);
            let add = node.exec_plugin_raw("ADD", &env_b, &b_conf);
            assert!(add.success(), "{what}: ADD b: {}", add.raw);
            let left = nat_of(&node, &ip);
            assert!(left.is_empty(), "{what}: a's flows reached b: {left:#?}");
            assert_eq!(host_veths(node.netns()).len(), 1, "{what}: b's veth only");
            testbed::assert_ping(pod.netns(), testbed::EXT_IP4);
            let del = node.exec_plugin_raw("DEL", &env_b, &b_conf);
            assert!(del.success(), "{what}: DEL b: {}", del.raw);
        } else {
            let out = node.exec_plugin_raw("GC", &CniEnv::default(), &gc);
            assert!(out.success(), "{what}: GC: {}", out.raw);
        }
        assert_nothing_left(&node, &what);
    }
}

/// One UDP datagram from `netns` to each of `n` ports of ext, from one socket: `n`
/// masqueraded flows, two NAT entries each.
fn open_udp_flows(netns: &std::path::Path, n: u16) {
    let sent = testbed::net::in_netns(netns, move || -> std::io::Result<()> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        for i in 0..n {
            s.send_to(b"flow", format!("{}:{}", testbed::EXT_IP4, 20_000 + i))?;
        }
        Ok(())
    });
    if let Err(e) = sent {
        panic!("sending {n} datagrams to ext: {e}");
    }
}

/// Waits until no finishing process of `container_id` runs any more (at most 20 s).
fn finisher_gone(container_id: &str) {
    let needle = format!("\"container_id\":\"{container_id}\"");
    let started = Instant::now();
    loop {
        let running = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .any(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("finish-del") && c.contains(&needle)
            });
        if !running {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the finishing process of {container_id} still runs after 20 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// DEL of `env` by the release build, not waiting for the node to settle (another DEL's
/// finishing process may be stopped): it must succeed, and its own finishing process end
/// (within 20 s).
fn del_until_finished(node: &SimNode, env: &CniEnv, stdin: &[u8]) {
    let id = &env.container_id;
    let mut del = spawn_plugin(node, &testbed::plugin_bin(), "DEL", env, stdin, &[]);
    let st = del
        .wait()
        .unwrap_or_else(|e| panic!("waiting for DEL {id}: {e}"));
    assert!(st.success(), "DEL {id}: {st}");
    finisher_gone(id);
}

/// On a node whose NAT table is not cheap to walk (known from the pods' NAT shares before
/// any walk of it), the DELs of a moment share one purge: the first finishing process
/// waits a second with the purge marked pending, and one that finds it pending leaves its
/// tombstones to it. Meanwhile nothing stale reaches a new
/// pod: an ADD given a pending address purges its flows first. The pending one killed -9,
/// its tombstones go with the next DEL's purge, which leaves the address a new pod took
/// over alone; nothing is left after.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn on_a_busy_node_dels_share_one_purge_and_no_stale_flow_reaches_a_new_pod() {
    let (node, conf, plain) = masquerading_node("sharedpurge");
    // A pod whose flows keep the table large all along.
    let keeper = node.pod("keeper");
    let env_keeper = CniEnv::new("shared-keeper", keeper.netns(), "eth0");
    let (_, keeper_ip) = add_and_ping_out(&node, &env_keeper, keeper.netns(), &plain);
    open_udp_flows(keeper.netns(), 2500);
    let held = nat_of(&node, &keeper_ip).len();
    assert!(
        held >= 5000,
        "the keeper holds {held} NAT entries, not 5000"
    );

    // No walk of the table is known yet, but the pods' NAT shares tell its size: x's
    // finishing process marks a purge pending rather than walking at once. Resumed, it
    // purges and records the walk's size; everything of x is gone.
    let x = node.pod("x");
    let env_x = CniEnv::new("shared-x", x.netns(), "eth0");
    let (_, x_ip) = add_and_ping_out(&node, &env_x, x.netns(), &plain);
    let pending_x = del_stopping_its_finisher(&node, &env_x, &plain, "finish-purge-deferred");
    assert!(!nat_of(&node, &x_ip).is_empty(), "x's flows purged at once");
    signal_and_wait(pending_x, libc::SIGCONT);
    assert!(endpoint_of(&node, &x_ip).is_none(), "x's entry left");
    assert!(nat_of(&node, &x_ip).is_empty(), "x's flows left");

    // a's finishing process marks the purge pending and stops there.
    let a = node.pod("a");
    let env_a = CniEnv::new("shared-a", a.netns(), "eth0");
    let (a_cidr, a_ip) = add_and_ping_out(&node, &env_a, a.netns(), &plain);
    let pending = del_stopping_its_finisher(&node, &env_a, &plain, "finish-purge-deferred");
    let tomb = endpoint_of(&node, &a_ip).unwrap_or_else(|| panic!("no entry for {a_ip}"));
    assert_eq!(tomb["removing"], true, "a's tombstone: {tomb:#}");
    assert!(!nat_of(&node, &a_ip).is_empty(), "a's flows purged early");

    // b's finishing process finds the purge pending and leaves its tombstone to it.
    let b = node.pod("b");
    let env_b = CniEnv::new("shared-b", b.netns(), "eth0");
    let (_, b_ip) = add_and_ping_out(&node, &env_b, b.netns(), &plain);
    del_until_finished(&node, &env_b, &plain);
    // a's and b's finishing processes deleted their veths before the purge.
    let veths = host_veths(node.netns());
    assert_eq!(veths.len(), 1, "only the keeper's veth: {veths:?}");
    let tomb = endpoint_of(&node, &b_ip).unwrap_or_else(|| panic!("no entry for {b_ip}"));
    assert_eq!(
        tomb["removing"], true,
        "b's tombstone, left to the pending purge: {tomb:#}"
    );
    assert!(
        !nat_of(&node, &b_ip).is_empty(),
        "b's flows were purged by b's own walk"
    );

    // The runtime gives a's address to c while a's purge is pending.
    let c = node.pod("c");
    let env_c = CniEnv::new("shared-c", c.netns(), "eth0");
    let c_conf = add_taking_over(&node, &conf, &env_c, c.netns(), &a_cidr);
    let c_flows = nat_of(&node, &a_ip).len();
    assert!(c_flows > 0, "c's ping left no flows");

    // The pending purge killed -9: b's tombstone waits for the next DEL's purge.
    signal_and_wait(pending, libc::SIGKILL);
    let d = node.pod("d");
    let env_d = CniEnv::new("shared-d", d.netns(), "eth0");
    let (_, d_ip) = add_and_ping_out(&node, &env_d, d.netns(), &plain);
    let del = node.exec_plugin_raw("DEL", &env_d, &plain);
    assert!(del.success(), "DEL d: {}", del.raw);
    for (who, ip) in [("b", &b_ip), ("d", &d_ip)] {
        assert!(endpoint_of(&node, ip).is_none(), "{who}'s tombstone left");
        assert!(nat_of(&node, ip).is_empty(), "{who}'s flows left");
    }
    assert_eq!(
        nat_of(&node, &a_ip).len(),
        c_flows,
        "the shared purge touched the flows of c, which took a's address over"
    );
    assert!(
        nat_of(&node, &keeper_ip).len() >= held,
        "the keeper's flows were purged"
    );
    testbed::assert_ping(c.netns(), testbed::EXT_IP4);

    for (env, stdin) in [(&env_c, &c_conf), (&env_keeper, &plain)] {
        let del = node.exec_plugin_raw("DEL", env, stdin);
        assert!(del.success(), "DEL {}: {}", env.container_id, del.raw);
    }
    assert!(
        nat_of(&node, &keeper_ip).is_empty(),
        "the keeper's flows left"
    );
    assert_nothing_left(&node, "after the last DEL");
}

/// Holds the network's flows lock (an exclusive `flock` on its maps directory), as a
/// finishing process holds it while its purge walks the NAT table, until dropped.
fn hold_flows_lock(node: &SimNode) -> std::fs::File {
    let dir = testbed::datapath::pin_dir(node).join("maps");
    let file =
        std::fs::File::open(&dir).unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()));
    // SAFETY: flock on a descriptor this test owns.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) };
    assert_eq!(rc, 0, "locking {}", dir.display());
    file
}

/// DELs that come while a purge walks the NAT table do not queue for a walk each, even
/// where no walk's size is known yet (a node's first walk of a large table): the first
/// finishing process marks a purge pending, and the next leaves its tombstones to it and
/// exits while the walk still runs. Resumed, the pending purge takes both pods' flows and
/// tombstones; nothing is left after.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn dels_during_a_running_purge_share_one_pending_purge() {
    let (node, _conf, plain) = masquerading_node("walkpurge");
    let a = node.pod("a");
    let env_a = CniEnv::new("walking-a", a.netns(), "eth0");
    let (_, a_ip) = add_and_ping_out(&node, &env_a, a.netns(), &plain);
    let b = node.pod("b");
    let env_b = CniEnv::new("walking-b", b.netns(), "eth0");
    let (_, b_ip) = add_and_ping_out(&node, &env_b, b.netns(), &plain);

    // A walk is running (its lock held here); the table is small and no walk of it is
    // recorded, so only the running walk tells a's finishing process to wait.
    let walking = hold_flows_lock(&node);
    let pending = del_stopping_its_finisher(&node, &env_a, &plain, "finish-purge-deferred");
    // b's finishing process ends while the walk still holds the lock: it did not queue
    // for a walk of its own.
    del_until_finished(&node, &env_b, &plain);
    for (who, ip) in [("a", &a_ip), ("b", &b_ip)] {
        let tomb = endpoint_of(&node, ip).unwrap_or_else(|| panic!("no entry for {ip}"));
        assert_eq!(tomb["removing"], true, "{who}'s tombstone: {tomb:#}");
        assert!(!nat_of(&node, ip).is_empty(), "{who}'s flows purged early");
    }

    // The walk ends; the pending purge resumes and takes both.
    drop(walking);
    signal_and_wait(pending, libc::SIGCONT);
    for (who, ip) in [("a", &a_ip), ("b", &b_ip)] {
        assert!(endpoint_of(&node, ip).is_none(), "{who}'s tombstone left");
        assert!(nat_of(&node, ip).is_empty(), "{who}'s flows left");
    }
    assert_nothing_left(&node, "after the shared purge");
}

/// In a burst of DELs their finishing processes share one deletion of the retired veths:
/// the first after a recent deletion marks one pending and waits, and one that finds it
/// pending leaves its veth to it. Resumed, the pending one deletes both pairs; killed -9,
/// the pairs it held wait, retired, for the next DEL's deletion; nothing is left after.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn in_a_burst_dels_share_one_veth_deletion_and_a_killed_one_loses_nothing() {
    let (node, _, plain) = masquerading_node("sharedveths");
    for (round, signal) in [("resumed", libc::SIGCONT), ("killed", libc::SIGKILL)] {
        let envs: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|p| {
                let pod = node.pod(&format!("{p}-{round}"));
                let env = CniEnv::new(&format!("veths-{p}-{round}"), pod.netns(), "eth0");
                add_and_ping_out(&node, &env, pod.netns(), &plain);
                (pod, env)
            })
            .collect();
        let [(_, env_a), (_, env_b), (_, env_c)] = &envs[..] else {
            unreachable!("three pods")
        };
        // a's finishing process deletes its veth (at once or after a wait) and records when.
        let del = node.exec_plugin_raw("DEL", env_a, &plain);
        assert!(del.success(), "{round}: DEL a: {}", del.raw);
        let deleted = Instant::now();
        // b's, within the burst, marks a deletion pending and stops there.
        let pending = del_stopping_its_finisher(&node, env_b, &plain, "finish-veth-deferred");
        // c's finds it pending and leaves its veth to it.
        del_until_finished(&node, env_c, &plain);
        let took = deleted.elapsed();
        assert!(
            took < Duration::from_millis(900),
            "{round}: b's and c's DELs took {took:?} after a's deletion: no burst to test"
        );
        let veths = host_veths(node.netns());
        let names: Vec<_> = veths.iter().map(|l| l.alias.clone()).collect();
        assert_eq!(
            veths.len(),
            2,
            "{round}: b's and c's retired veths wait for the pending deletion: {names:?}"
        );
        assert!(
            veths.iter().all(|l| !l.up),
            "{round}: a retired veth is up: {veths:?}"
        );

        signal_and_wait(pending, signal);
        if signal == libc::SIGCONT {
            let veths = host_veths(node.netns());
            assert!(
                veths.is_empty(),
                "{round}: b's finishing process left veths: {veths:?}"
            );
        } else {
            assert_eq!(host_veths(node.netns()).len(), 2, "{round}: the held veths");
            let d = node.pod(&format!("d-{round}"));
            let env_d = CniEnv::new(&format!("veths-d-{round}"), d.netns(), "eth0");
            add_and_ping_out(&node, &env_d, d.netns(), &plain);
            let del = node.exec_plugin_raw("DEL", &env_d, &plain);
            assert!(del.success(), "{round}: DEL d: {}", del.raw);
        }
        assert_nothing_left(&node, round);
    }
}

/// A DEL's finishing process that runs late, after a new pod in the same namespace took
/// the address over and opened flows: it leaves that address alone (the new pod's ADD
/// purged the old flows itself), so the new pod keeps its flows and its connectivity.
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_late_finishing_process_leaves_a_taken_over_address_alone() {
    let (node, conf, plain) = masquerading_node("latefinish");
    let pod = node.pod("late");
    // The same container again, as a runtime that retries a sandbox does.
    let env = CniEnv::new("late", pod.netns(), "eth0");
    let (cidr, ip) = add_and_ping_out(&node, &env, pod.netns(), &plain);
    let finisher = del_stopping_its_finisher(&node, &env, &plain, "finish-started");

    let again = with_address(&conf, &cidr);
    let add = node.exec_plugin_raw("ADD", &env, &again);
    assert!(add.success(), "ADD again with the address: {}", add.raw);
    assert!(
        nat_of(&node, &ip).is_empty(),
        "the old flows reached the new pod"
    );
    testbed::assert_ping(pod.netns(), testbed::EXT_IP4);
    let flows = nat_of(&node, &ip);
    assert!(!flows.is_empty(), "the new pod's ping left no flows");

    signal_and_wait(finisher, libc::SIGCONT);
    assert_eq!(
        nat_of(&node, &ip).len(),
        flows.len(),
        "the late finishing process purged the new pod's flows"
    );
    let ep = endpoint_of(&node, &ip).unwrap_or_else(|| panic!("no entry for {ip}"));
    assert!(
        ep.get("removing").is_none(),
        "the new pod's entry is live: {ep:#}"
    );
    testbed::assert_ping(pod.netns(), testbed::EXT_IP4);
    let del = node.exec_plugin_raw("DEL", &env, &again);
    assert!(del.success(), "DEL: {}", del.raw);
    assert_nothing_left(&node, "after the last DEL");
}
