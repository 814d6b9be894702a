//! End to end: pods speak only as themselves. A pod that sends with a neighbour pod's
//! IPv4 or IPv6 address (added to its own interface, so its kernel sends real datagrams
//! from it) reaches nobody — not another pod, not the node, not the outside — and
//! `drop_spoofed_source` counts them, while the same datagrams from its own addresses
//! arrive; a router pod sends from its allow-listed prefixes (both families).

use std::{
    net::{Ipv6Addr, SocketAddr, UdpSocket},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use serde_json::{json, Value};
use testbed::datapath::{add, del, dump_map, inspect, masq_conf, reason, wait_until};
use testbed::{
    net::in_netns, Pod, SimNode, EXT_IP4, EXT_IP6, NODE_IP4, NODE_IP6, POD_SUBNET_V4, POD_SUBNET_V6,
};

/// A UDP listener on `[::]:port` in a namespace that records the source address of every
/// datagram. Stopped and joined on drop.
struct Arrivals {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Arrivals {
    #[track_caller]
    fn start(netns: &Path, port: u16) -> Self {
        let bind = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
        let sock = in_netns(netns, move || UdpSocket::bind(bind))
            .unwrap_or_else(|e| panic!("bind udp {bind} in {}: {e}", netns.display()));
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (Arc::clone(&stop), Arc::clone(&seen));
        let thread = thread::spawn(move || {
            let mut buf = [0u8; 256];
            while !s.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                    if let Ok(mut v) = v.lock() {
                        v.push(peer.ip().to_canonical().to_string());
                    }
                }
            }
        });
        Self {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn from(&self, src: &str) -> usize {
        self.seen
            .lock()
            .map(|v| v.iter().filter(|s| *s == src).count())
            .unwrap_or(0)
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends `n` datagrams from `netns`, bound to `src`, to `dst:port`. Errors are returned
/// (a local refusal would show up here, not as a missing arrival).
fn send_from(netns: &Path, src: &str, dst: &str, port: u16, n: usize) {
    let bind: SocketAddr = SocketAddr::new(src.parse().unwrap(), 0);
    let to = SocketAddr::new(dst.parse().unwrap(), port);
    let r = in_netns(netns, move || -> std::io::Result<()> {
        let s = UdpSocket::bind(bind)?;
        for _ in 0..n {
            s.send_to(b"who am i", to)?;
        }
        Ok(())
    });
    r.unwrap_or_else(|e| panic!("sending from {src} to {dst}:{port}: {e}"));
}

/// The address of `family` (`4` or `6`) in an ADD result.
fn addr_of(result: &Value, family: u8) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| a.contains(':') == (family == 6))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no IPv{family} address in the result: {result}"))
}

fn exec_ok(pod: &Pod, argv: &[&str]) {
    let out = pod.exec(argv);
    assert!(out.status.success(), "{argv:?}: {out:?}");
}

const PORT: u16 = 7001;
#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_pod_spoofing_a_neighbour_reaches_nobody_in_either_family() {
    let node = SimNode::new("sg_spoof");
    let conf = masq_conf(&node).subnets(&[POD_SUBNET_V4, POD_SUBNET_V6]);
    let router_conf = conf.clone().set(
        "runtimeConfig",
        json!({ "allowedSourceCIDRs": ["192.0.2.0/24", "2001:db8:77::/48"] }),
    );
    let (a, b, c, r) = (node.pod("a"), node.pod("b"), node.pod("c"), node.pod("r"));
    let ra = add(&node, &a, &conf);
    let rb = add(&node, &b, &conf);
    let rc = add(&node, &c, &conf);
    let rr = add(&node, &r, &router_conf);
    let (a4, a6) = (addr_of(&ra, 4), addr_of(&ra, 6));
    let (b4, b6) = (addr_of(&rb, 4), addr_of(&rb, 6));
    let (c4, c6) = (addr_of(&rc, 4), addr_of(&rc, 6));
    let _ = addr_of(&rr, 4);

    let at_c = Arrivals::start(c.netns(), PORT);
    let at_node = Arrivals::start(node.netns(), PORT);
    let at_ext = Arrivals::start(node.ext_netns(), PORT);

    // Pod a takes pod b's addresses onto its own interface: its kernel now sends real
    // datagrams from them.
    exec_ok(
        &a,
        &["ip", "addr", "add", &format!("{b4}/32"), "dev", "eth0"],
    );
    exec_ok(
        &a,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{b6}/128"),
            "dev",
            "eth0",
            "nodad",
        ],
    );
    let before = inspect(&node);
    let targets = [
        (&c4, &c6, "pod c"),
        (&NODE_IP4.to_owned(), &NODE_IP6.to_owned(), "the node"),
        (&EXT_IP4.to_owned(), &EXT_IP6.to_owned(), "the outside"),
    ];
    for (t4, t6, _) in &targets {
        send_from(a.netns(), &b4, t4, PORT, 3);
        send_from(a.netns(), &b6, t6, PORT, 3);
    }
    // The same from pod a's own addresses: these arrive (the outside sees both families
    // from the node's addresses: masqueraded).
    for (t4, t6, _) in &targets {
        send_from(a.netns(), &a4, t4, PORT, 1);
        send_from(a.netns(), &a6, t6, PORT, 1);
    }
    let arrived = wait_until(Duration::from_secs(3), || {
        at_c.from(&a4) >= 1
            && at_c.from(&a6) >= 1
            && at_node.from(&a4) >= 1
            && at_node.from(&a6) >= 1
            && at_ext.from(NODE_IP4) >= 1
            && at_ext.from(NODE_IP6) >= 1
    });
    assert!(
        arrived,
        "pod a's own datagrams: at c {:?}, at the node {:?}, outside {:?}",
        at_c.seen.lock().map(|v| v.clone()),
        at_node.seen.lock().map(|v| v.clone()),
        at_ext.seen.lock().map(|v| v.clone())
    );
    for (at, where_) in [
        (&at_c, "pod c"),
        (&at_node, "the node"),
        (&at_ext, "the outside"),
    ] {
        for spoofed in [&b4, &b6] {
            assert_eq!(
                at.from(spoofed),
                0,
                "a datagram pod a sent as pod b ({spoofed}) reached {where_}"
            );
        }
    }
    // The outside saw pod a's own datagrams masqueraded exactly once per family: no SNAT
    // entry was made for the spoofed ones (they would have arrived from the node's
    // address too).
    assert_eq!(at_ext.from(NODE_IP4), 1, "{:?}", at_ext.seen.lock());
    assert_eq!(at_ext.from(NODE_IP6), 1, "{:?}", at_ext.seen.lock());
    let after = inspect(&node);
    let dropped = reason(&after, "drop_spoofed_source") - reason(&before, "drop_spoofed_source");
    assert!(
        dropped >= 18,
        "drop_spoofed_source grew by {dropped}, expected ≥ 18 (3 × 3 targets × 2 families): {:#}",
        after["reasons"]
    );

    // The router pod sends from its allow-listed prefixes, in both families.
    exec_ok(&r, &["ip", "addr", "add", "192.0.2.7/32", "dev", "eth0"]);
    exec_ok(
        &r,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            "2001:db8:77::7/128",
            "dev",
            "eth0",
            "nodad",
        ],
    );
    send_from(r.netns(), "192.0.2.7", &c4, PORT, 1);
    send_from(r.netns(), "2001:db8:77::7", &c6, PORT, 1);
    let arrived = wait_until(Duration::from_secs(3), || {
        at_c.from("192.0.2.7") >= 1 && at_c.from("2001:db8:77::7") >= 1
    });
    assert!(arrived, "allow-listed sources: at c {:?}", at_c.seen.lock());

    drop((at_c, at_node, at_ext));
    del(&node, &a, &conf);
    del(&node, &b, &conf);
    del(&node, &c, &conf);
    del(&node, &r, &router_conf);
    // DEL took every pod's source entries (own IPv6 addresses, both allow-lists) and NAT
    // share with it (NAT_USE keys 0 and u32::MAX are the node-wide sweep clocks of the
    // IPv4 and IPv6 NAT tables).
    for map in ["SRC_ALLOW", "SRC_ALLOW6", "NAT_USE"] {
        let mut left = dump_map(&node, map);
        left.retain(|(k, _)| {
            !(map == "NAT_USE" && (k.iter().all(|b| *b == 0) || k.iter().all(|b| *b == 0xff)))
        });
        assert!(
            left.is_empty(),
            "{map} keeps {} entries after DEL",
            left.len()
        );
    }
}
