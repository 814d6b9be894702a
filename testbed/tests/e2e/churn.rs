//! Churn under load. Two workers add and delete pods in a loop (one in
//! five with a host port) while two long-lived pods keep talking — to each other over a
//! persistent TCP connection and to the outside over a masqueraded one — and the
//! agent's metrics endpoint is scraped. Afterwards: no leaked link, address, route,
//! pin, map entry, reservation or store file, the exporter holds as many descriptors as
//! before, and neither connection ever stalled or broke.
//!
//! `CNI_EBPF_CHURN_SECS` sets how long the churn runs (default 30; e.g. 600 for a
//! ten-minute campaign).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::json;
use testbed::{
    net::{converse, in_netns},
    plugin_bin,
    process::Background,
    EchoServer, SimNode, EXT_IP4, POD_SUBNET_V4,
};

fn churn_secs() -> u64 {
    std::env::var("CNI_EBPF_CHURN_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The exporter's descriptor count once a scrape has finished: the fewest seen over a
/// second (the connection of the scrape just answered may still be closing).
fn settled_fds(netns: &Path, addr: SocketAddr, pid: u32) -> usize {
    let _ = scrape(netns, addr);
    (0..10)
        .map(|_| {
            thread::sleep(Duration::from_millis(100));
            fd_count(pid)
        })
        .min()
        .unwrap_or(0)
}

/// `GET /metrics` from inside `netns`; the body.
fn scrape(netns: &Path, addr: SocketAddr) -> String {
    in_netns(netns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut raw = String::new();
        s.take(16 << 20).read_to_string(&mut raw)?;
        Ok::<_, std::io::Error>(raw)
    })
    .unwrap_or_else(|e| panic!("scrape: {e}"))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn churn_under_load_leaks_nothing_and_never_breaks_running_pods() {
    let node = SimNode::new("churn");
    let conf = node
        .conf()
        .version("1.0.0")
        .subnets(&[POD_SUBNET_V4])
        .masquerading("10.244.0.0/16");
    node.warm_up(&conf);
    let a = node.pod("stable-a");
    let b = node.pod("stable-b");
    node.add(&a, "eth0", &conf);
    let rb = node.add(&b, "eth0", &conf);
    let b_ip = rb.ips[0]
        .address
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();

    // The exporter, as the DaemonSet runs it.
    let addr = SocketAddr::from(([127, 0, 0, 1], 9465));
    let bin = plugin_bin().to_string_lossy().into_owned();
    let root = node.pin_root().to_string_lossy().into_owned();
    let exporter = Background::spawn(
        node.netns(),
        &[
            bin.as_str(),
            "agent",
            "--policy=false",
            "--listen",
            "127.0.0.1:9465",
            "--bpffs-root",
            &root,
        ],
    );
    let up = Instant::now();
    while !scrape_ok(node.netns(), addr) {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "the exporter did not start"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // After a first full scrape: whatever the exporter sets up once is in place.
    let fds_before = settled_fds(node.netns(), addr, exporter.pid());

    let secs = churn_secs();
    let limit = Duration::from_secs(secs + 60);
    let stop = Arc::new(AtomicBool::new(false));
    let servers = [
        EchoServer::concurrent(b.netns(), 7000),
        EchoServer::concurrent(node.ext_netns(), 7001),
    ];
    let (pod_to_pod, h1) = converse(
        a.netns(),
        format!("{b_ip}:7000")
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
        stop.clone(),
        limit,
    );
    let (pod_to_ext, h2) = converse(
        a.netns(),
        SocketAddr::from((
            EXT_IP4
                .parse::<std::net::Ipv4Addr>()
                .unwrap_or_else(|e| panic!("{e}")),
            7001,
        )),
        stop.clone(),
        limit,
    );
    thread::sleep(Duration::from_millis(300));

    // Baselines with the two stable pods and their flows in place.
    let snap = node.snapshot();
    let pins = node.pins();
    let endpoints_before = node.endpoints("testnet").len();

    let cycles = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    thread::scope(|s| {
        for w in 0..2 {
            let (node, conf, cycles) = (&node, &conf, cycles.clone());
            s.spawn(move || {
                let mut i = 0usize;
                while Instant::now() < deadline {
                    let pod = node.pod(&format!("c{w}-{i}"));
                    let c = if i.is_multiple_of(5) {
                        conf.clone().set(
                            "runtimeConfig",
                            json!({ "portMappings": [{ "hostPort": 20000 + w * 1000 + (i % 1000), "containerPort": 80, "protocol": "tcp" }] }),
                        )
                    } else {
                        conf.clone()
                    };
                    node.add(&pod, "eth0", &c);
                    node.del(&pod, "eth0", &c);
                    cycles.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        // The exporter is scraped throughout.
        s.spawn(|| {
            while Instant::now() < deadline {
                let body = scrape(node.netns(), addr);
                assert!(body.contains("cni_ebpf_up"), "scrape during churn: {body}");
                thread::sleep(Duration::from_millis(500));
            }
        });
    });
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let _ = h1.join();
    let _ = h2.join();
    drop(servers);

    let n = cycles.load(Ordering::Relaxed);
    eprintln!(
        "{n} pod ADD/DEL cycles in {secs} s by 2 workers; pod→pod {} exchanges (worst {} µs), \
         pod→ext {} exchanges (worst {} µs)",
        pod_to_pod.exchanges.load(Ordering::Relaxed),
        pod_to_pod.worst_rtt_us.load(Ordering::Relaxed),
        pod_to_ext.exchanges.load(Ordering::Relaxed),
        pod_to_ext.worst_rtt_us.load(Ordering::Relaxed),
    );
    for (what, c) in [
        ("pod → pod", &pod_to_pod),
        ("pod → ext (masqueraded)", &pod_to_ext),
    ] {
        if let Ok(f) = c.failure.lock() {
            assert!(f.is_none(), "{what} broke during churn: {f:?}");
        }
        assert!(
            c.exchanges.load(Ordering::Relaxed) > secs * 20,
            "{what}: too few exchanges"
        );
        assert!(
            c.worst_rtt_us.load(Ordering::Relaxed) < 1_000_000,
            "{what} stalled for {} µs",
            c.worst_rtt_us.load(Ordering::Relaxed)
        );
    }
    assert!(n as u64 >= secs * 2, "only {n} cycles in {secs} s");

    // Nothing leaked.
    node.snapshot().assert_same_as(&snap);
    assert_eq!(node.pins(), pins, "pins changed");
    assert_eq!(
        node.endpoints("testnet").len(),
        endpoints_before,
        "endpoint entries"
    );
    let dp = node.datapath("testnet").unwrap_or_default();
    let ports = dp["portMappings"].as_array().cloned().unwrap_or_default();
    assert!(ports.is_empty(), "host ports left: {ports:?}");
    let store = node.store("testnet");
    assert_eq!(store.keys.len(), 2, "reservations: {store:?}");
    assert!(
        store.tmp.is_empty() && store.unexpected.is_empty(),
        "{store:?}"
    );
    let fds_after = settled_fds(node.netns(), addr, exporter.pid());
    assert_eq!(fds_after, fds_before, "the exporter's descriptors grew");
    drop(exporter);

    node.del(&a, "eth0", &conf);
    node.del(&b, "eth0", &conf);
    node.store("testnet")
        .assert_empty("after the stable pods' DEL");
}

fn scrape_ok(netns: &Path, addr: SocketAddr) -> bool {
    let netns: PathBuf = netns.to_path_buf();
    in_netns(&netns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
}
