//! End to end: one pod cannot starve the others of NAT state. A pod with a small
//! `natFlowsPerPod` opening UDP flows to the outside past its cap gets exactly its cap
//! answered; another pod's long-lived connection to the same server and its new flows
//! (more than the first pod's cap) keep working; and a pod cannot take every SNAT port
//! towards one destination.

use std::{
    net::{SocketAddr, UdpSocket},
    path::Path,
    thread,
    time::Duration,
};

use serde_json::json;
use testbed::datapath::{
    add, connect, del, greet, inspect, masq_conf, read_line, reason, Mode, TaggedServer,
};
use testbed::{net::in_netns, SimNode, WhoAmIServer, EXT_IP4};

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_pod_past_its_nat_cap_cannot_starve_the_others() {
    const CAP: usize = 10;
    let node = SimNode::new("sg_natcap");
    // Pod h's attachment has a small share; pod v keeps the default (8192 flows).
    let conf = masq_conf(&node).set("natFlowsPerPod", json!(CAP));
    let v_conf = masq_conf(&node);
    let (h, v) = (node.pod("h"), node.pod("v"));
    add(&node, &h, &conf);
    add(&node, &v, &v_conf);
    let whoami = WhoAmIServer::start(node.ext_netns(), 7100);
    let echo = TaggedServer::start(node.ext_netns(), 7101, "ext", Mode::Echo);

    // Pod v's long-lived connection, opened before the flood.
    let mut long = connect(v.netns(), &format!("{EXT_IP4}:7101"))
        .unwrap_or_else(|e| panic!("pod v's long-lived connection: {e}"));
    let hello = read_line(&long).unwrap();
    assert!(hello.starts_with("ext "), "{hello:?}");

    // Pod h opens 4 × its cap of UDP flows to the same server, one datagram each.
    let before = inspect(&node);
    let to: SocketAddr = format!("{EXT_IP4}:7100").parse().unwrap();
    let answered = udp_flood(h.netns(), to, 4 * CAP);
    assert_eq!(
        answered, CAP,
        "pod h got answers on {answered} flows; its cap is {CAP}"
    );
    let after = inspect(&node);
    let refused = reason(&after, "drop_nat_pod_cap") - reason(&before, "drop_nat_pod_cap");
    assert!(
        refused >= (3 * CAP) as u64,
        "drop_nat_pod_cap grew by {refused}, expected ≥ {}: {:#}",
        3 * CAP,
        after["reasons"]
    );

    // Pod v: its long-lived connection still carries data, and new connections and UDP
    // flows to the same outside host work.
    use std::io::Write as _;
    long.write_all(b"still there?\n").unwrap();
    let echoed = read_line(&long).unwrap_or_else(|e| panic!("pod v's long-lived connection: {e}"));
    assert!(echoed.contains("still there?"), "{echoed:?}");
    for i in 0..2 * CAP {
        greet(v.netns(), &format!("{EXT_IP4}:7101"))
            .unwrap_or_else(|e| panic!("pod v's new connection {i}: {e}"));
    }
    let (answers, _socks) = testbed::datapath::many_udp(v.netns(), &[to], CAP, 2);
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(ok, CAP, "pod v's new UDP flows: {answers:?}");
    // And pod h is still refused.
    let still = testbed::datapath::udp_exchange(h.netns(), &format!("{EXT_IP4}:7100"), b"more");
    assert!(
        still.is_err(),
        "pod h beyond its cap got an answer: {still:?}"
    );

    drop(long);
    drop((whoami, echo));
    del(&node, &h, &conf);
    del(&node, &v, &v_conf);
}

/// Opens `n` UDP flows from `netns` to `to` (a socket each, one datagram each, sent in
/// bursts of 32) and counts those answered within 1.5 s. The sockets stay open until then, so every
/// flow holds its translation meanwhile.
fn udp_flood(netns: &Path, to: SocketAddr, n: usize) -> usize {
    in_netns(netns, move || -> std::io::Result<usize> {
        let socks: Vec<UdpSocket> = (0..n)
            .map(|_| UdpSocket::bind("0.0.0.0:0"))
            .collect::<Result<_, _>>()?;
        for (i, s) in socks.iter().enumerate() {
            s.send_to(b"flow", to)?;
            // In bursts of 32: the server's socket buffer holds a few hundred datagrams,
            // and a loaded machine may not drain it as fast as they come.
            if i % 32 == 31 {
                thread::sleep(Duration::from_millis(2));
            }
        }
        thread::sleep(Duration::from_millis(1500));
        let mut answered = 0;
        for s in &socks {
            s.set_nonblocking(true)?;
            let mut buf = [0u8; 256];
            if s.recv_from(&mut buf).is_ok() {
                answered += 1;
            }
        }
        Ok(answered)
    })
    .unwrap_or_else(|e| panic!("UDP flows to {to}: {e}"))
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_pod_cannot_take_every_snat_port_towards_one_destination() {
    // 1 024 SNAT ports (the node's local range leaves 64512-65535), so the default cap
    // per pod and destination is 512: without it pod h's 700 flows to one server would
    // leave pod v 324 ports there, fewer than the 400 it opens below.
    const FLOOD: usize = 700;
    const CAP: usize = 512;
    let node = SimNode::new("sg_destcap");
    let out = node.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 64511"]);
    assert!(out.status.success(), "{out:?}");
    let conf = masq_conf(&node);
    let (h, v) = (node.pod("h"), node.pod("v"));
    add(&node, &h, &conf);
    add(&node, &v, &conf);
    let doc = inspect(&node);
    assert_eq!(doc["node"]["snat_ports"], json!([64512, 65535]), "{doc:#}");
    assert_eq!(doc["node"]["snat_dest_cap"], json!(CAP), "{doc:#}");
    let whoami = WhoAmIServer::start(node.ext_netns(), 7100);
    let echo = TaggedServer::start(node.ext_netns(), 7101, "ext", Mode::Echo);
    let to: SocketAddr = format!("{EXT_IP4}:7100").parse().unwrap();

    // Pod v's long-lived connection to the same outside host, opened before the flood.
    let mut long = connect(v.netns(), &format!("{EXT_IP4}:7101"))
        .unwrap_or_else(|e| panic!("pod v's long-lived connection: {e}"));
    let hello = read_line(&long).unwrap();
    assert!(hello.starts_with("ext "), "{hello:?}");

    // Pod h: exactly its share of ports towards EXT:7100 is answered, the rest refused.
    let before = inspect(&node);
    let answered = udp_flood(h.netns(), to, FLOOD);
    assert_eq!(
        answered, CAP,
        "pod h got answers on {answered} flows to one destination; its cap is {CAP}"
    );
    let after = inspect(&node);
    let refused = reason(&after, "drop_snat_dest_cap") - reason(&before, "drop_snat_dest_cap");
    assert!(
        refused >= (FLOOD - CAP) as u64,
        "drop_snat_dest_cap grew by {refused}, expected ≥ {}: {:#}",
        FLOOD - CAP,
        after["reasons"]
    );
    assert_eq!(
        reason(&after, "drop_nat_pod_cap"),
        reason(&before, "drop_nat_pod_cap"),
        "the flow cap (8192) is not what refused them"
    );

    // Pod v, while pod h's flows are live (60 s): its long-lived connection carries data,
    // and 400 new flows to the very same destination, and new connections to the host,
    // all work.
    use std::io::Write as _;
    long.write_all(b"still there?\n").unwrap();
    let echoed = read_line(&long).unwrap_or_else(|e| panic!("pod v's long-lived connection: {e}"));
    assert!(echoed.contains("still there?"), "{echoed:?}");
    let (answers, _socks) = testbed::datapath::many_udp(v.netns(), &[to], 400, 2);
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(ok, 400, "pod v's new flows to EXT:7100");
    for i in 0..20 {
        greet(v.netns(), &format!("{EXT_IP4}:7101"))
            .unwrap_or_else(|e| panic!("pod v's new connection {i}: {e}"));
    }
    // The programs' counts: one per pod and destination holding ports.
    let held = map_entries(&inspect(&node), "NAT_DEST_USE");
    assert_eq!(held, 3, "h → :7100, v → :7100, v → :7101");

    drop(long);
    drop((whoami, echo));
    del(&node, &h, &conf);
    del(&node, &v, &conf);
    assert_eq!(
        map_entries(&inspect(&node), "NAT_DEST_USE"),
        0,
        "DEL leaves no count"
    );
}

/// Entries of map `name` in an inspect document.
fn map_entries(doc: &serde_json::Value, name: &str) -> u64 {
    doc["maps"]
        .as_array()
        .and_then(|maps| maps.iter().find(|m| m["name"] == name))
        .and_then(|m| m["entries"].as_u64())
        .unwrap_or_else(|| panic!("no {name} in {:#}", doc["maps"]))
}
