//! End to end: thousands of concurrent masqueraded flows. One pod holds 5000 TCP
//! connections and 2000 UDP flows to `ext` open at the same time; every one must succeed,
//! be seen by ext as coming from the node on a distinct SNAT port, and have its NAT entry.
//! And many more short connections to one destination than there are SNAT ports all
//! succeed, because the ports of closed flows are handed out again.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::Instant,
};

use testbed::datapath::{
    add, del, inspect, ip_of, list, many_udp, masq_conf, nofile, open_many_tcp, pod_ip,
    raise_nofile, read_line, reason, seen_peer, Mode, TaggedServer,
};
use testbed::{SimNode, WhoAmIServer, EXT_IP4, NODE_IP4};

const TCP_FLOWS: usize = 5000;
const UDP_FLOWS: usize = 2000;
/// Destination ports in ext: each holds a third of the flows, well inside the SNAT range.
const PORTS: [u16; 3] = [7001, 7002, 7003];
/// UDP servers (a WhoAmIServer also binds TCP, so not on [`PORTS`]).
const UDP_PORTS: [u16; 3] = [7101, 7102, 7103];
const THREADS: usize = 32;

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn thousands_of_concurrent_masqueraded_flows_all_succeed() {
    raise_nofile();
    let need = u64::try_from(2 * TCP_FLOWS + UDP_FLOWS + 256).unwrap_or(u64::MAX);
    assert!(
        nofile() >= need,
        "open-file limit {} is below the {need} this test needs",
        nofile()
    );
    let node = SimNode::new("dp_flows");
    let conf = masq_conf(&node);
    let a = node.pod("a");
    let ip = pod_ip(&add(&node, &a, &conf));
    let servers: Vec<TaggedServer> = PORTS
        .iter()
        .map(|p| TaggedServer::start(node.ext_netns(), *p, "ext", Mode::Greet))
        .collect();
    let udp_servers: Vec<WhoAmIServer> = UDP_PORTS
        .iter()
        .map(|p| WhoAmIServer::start(node.ext_netns(), *p))
        .collect();
    let ext = |ports: &[u16]| -> Vec<SocketAddr> {
        ports
            .iter()
            .map(|p| SocketAddr::new(EXT_IP4.parse().unwrap_or([0, 0, 0, 0].into()), *p))
            .collect()
    };
    let (targets, udp_targets) = (ext(&PORTS), ext(&UDP_PORTS));
    let before = inspect(&node);

    // TCP: all connections open at once.
    let started = Instant::now();
    let conns = open_many_tcp(a.netns(), &targets, TCP_FLOWS, THREADS);
    let connect_time = started.elapsed();
    let failed: Vec<String> = conns
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.as_ref().err().map(|e| format!("#{i}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {TCP_FLOWS} TCP connections failed (first: {:?})",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let doc = inspect(&node);
    let snat_tcp: Vec<_> = list(&doc, "nat")
        .iter()
        .filter(|n| n["kind"] == "snat" && n["protocol"] == "tcp" && n["src"] == ip.as_str())
        .collect();
    assert!(
        snat_tcp.len() >= TCP_FLOWS,
        "{} TCP SNAT entries for {TCP_FLOWS} open connections",
        snat_tcp.len()
    );
    let replies = list(&doc, "nat")
        .iter()
        .filter(|n| {
            n["kind"] == "snat-reply" && n["protocol"] == "tcp" && n["new_dst"] == ip.as_str()
        })
        .count();
    assert!(replies >= TCP_FLOWS, "{replies} TCP reverse entries");

    // Every server greeting names the node as the peer, on a distinct port per destination.
    let mut ports: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (i, c) in conns.iter().enumerate() {
        let Ok(c) = c else { continue };
        let line = read_line(c).unwrap_or_else(|e| format!("<read error {e}>"));
        let peer = seen_peer(&line);
        if ip_of(&peer) != NODE_IP4 {
            wrong.push(format!("#{i}: {line:?}"));
        }
        let dport = c.peer_addr().map(|a| a.port()).unwrap_or(0);
        ports.entry(dport).or_default().insert(peer);
    }
    assert!(
        wrong.is_empty(),
        "{} of {TCP_FLOWS} flows not seen as {NODE_IP4} (first: {:?})",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    let distinct: usize = ports.values().map(BTreeSet::len).sum();
    assert_eq!(
        distinct, TCP_FLOWS,
        "each flow needs its own node port per destination: {distinct} distinct"
    );
    let accepted: usize = servers.iter().map(TaggedServer::accepted).sum();
    assert_eq!(accepted, TCP_FLOWS, "ext accepted {accepted}");
    drop(conns);

    // UDP: every flow keeps its socket while the others run.
    let started = Instant::now();
    let (answers, socks) = many_udp(a.netns(), &udp_targets, UDP_FLOWS, THREADS);
    let udp_time = started.elapsed();
    let bad: Vec<String> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Ok(s) if ip_of(&seen_peer(s)) == NODE_IP4 => None,
            Ok(s) => Some(format!("#{i}: seen as {s:?}")),
            Err(e) => Some(format!("#{i}: {e}")),
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {UDP_FLOWS} UDP flows failed (first: {:?})",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(socks.len(), UDP_FLOWS);
    let doc = inspect(&node);
    let snat_udp = list(&doc, "nat")
        .iter()
        .filter(|n| n["kind"] == "snat" && n["protocol"] == "udp" && n["src"] == ip.as_str())
        .count();
    assert!(
        snat_udp >= UDP_FLOWS,
        "{snat_udp} UDP SNAT entries for {UDP_FLOWS} flows"
    );
    let dropped = reason(&doc, "drop_no_snat_port") - reason(&before, "drop_no_snat_port");
    let failed_inserts =
        reason(&doc, "pass_nat_insert_failed") - reason(&before, "pass_nat_insert_failed");
    assert_eq!(
        (dropped, failed_inserts),
        (0, 0),
        "no flow may have been refused a port or a NAT entry"
    );
    eprintln!(
        "{TCP_FLOWS} TCP connections open in {connect_time:?}, {UDP_FLOWS} UDP exchanges in \
         {udp_time:?}; NAT entries: {}",
        list(&doc, "nat").len()
    );
    drop((socks, servers, udp_servers));
    del(&node, &a, &conf);
    let nat = list(&inspect(&node), "nat").len();
    assert_eq!(nat, 0, "DEL must purge the pod's NAT entries");
}

/// A TCP server in `ext` for short connections the client closes first: greets with the
/// peer it sees, then waits for the client's FIN before closing (so ext never holds the
/// tuple in TIME_WAIT). One connection at a time; stops after `n`.
fn client_closes_first_server(
    node: &SimNode,
    port: u16,
    n: usize,
) -> std::thread::JoinHandle<Vec<SocketAddr>> {
    use std::io::{Read, Write};
    let bind = SocketAddr::from(([0, 0, 0, 0], port));
    let listener =
        testbed::net::in_netns(node.ext_netns(), move || std::net::TcpListener::bind(bind))
            .unwrap_or_else(|e| panic!("bind {bind} in ext: {e}"));
    std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..n {
            let Ok((mut c, peer)) = listener.accept() else {
                break;
            };
            peers.push(peer);
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = c.write_all(format!("ext {peer}\n").as_bytes());
            let mut b = [0u8; 64];
            while matches!(c.read(&mut b), Ok(n) if n > 0) {}
        }
        peers
    })
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn short_connections_beyond_the_snat_port_count_all_succeed() {
    let node = SimNode::new("dp_reuse");
    // 1 024 SNAT ports: the node's local range leaves only 64512-65535 free.
    let out = node.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 64511"]);
    assert!(out.status.success(), "{out:?}");
    // The whole range for this pod: the test is about ports coming back, and by default
    // a pod may hold only half of them towards one destination.
    let conf = masq_conf(&node).set("natPortsPerDestination", serde_json::json!(1024));
    let a = node.pod("a");
    let _ = pod_ip(&add(&node, &a, &conf));
    let out = a.exec(&[
        "sysctl",
        "-qw",
        "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=1024 65000",
    ]);
    assert!(out.status.success(), "{out:?}");
    let doc = inspect(&node);
    assert_eq!(
        doc["node"]["snat_ports"],
        serde_json::json!([64512, 65535]),
        "{doc:#}"
    );

    // Three rounds of 900 (2 700 connections for 1 024 ports); between rounds the
    // closed flows pass their 1 s grace.
    const ROUND: usize = 900;
    let srv = client_closes_first_server(&node, 7201, 3 * ROUND);
    let before = inspect(&node);
    let mut ports = BTreeSet::new();
    for round in 0..3 {
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
        let failures: Vec<String> = testbed::net::in_netns(a.netns(), move || {
            let to = SocketAddr::new(EXT_IP4.parse().unwrap_or([0, 0, 0, 0].into()), 7201);
            let mut bad = Vec::new();
            for i in 0..ROUND {
                let r =
                    std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(3))
                        .and_then(|s| read_line(&s));
                if let Err(e) = r {
                    bad.push(format!("#{i}: {e}"));
                }
            }
            bad
        });
        assert!(
            failures.is_empty(),
            "round {round}: {} of {ROUND} failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }
    let peers = srv
        .join()
        .unwrap_or_else(|_| panic!("server thread panicked"));
    assert_eq!(peers.len(), 3 * ROUND);
    for p in &peers {
        assert_eq!(
            p.ip().to_canonical().to_string(),
            NODE_IP4,
            "masqueraded: {p}"
        );
        ports.insert(p.port());
    }
    assert!(
        ports.iter().all(|p| (64512..=65535).contains(p)),
        "ports outside the SNAT range"
    );
    assert!(ports.len() <= 1024);
    let after = inspect(&node);
    // Every new translation beyond the 1 024 ports needed a port taken back. (Not every
    // connection is a new translation: with tcp_tw_reuse the pod may reuse a source port
    // towards the same server, and its flow's translation is then reused too.)
    let delta = |r: &str| reason(&after, r) - reason(&before, r);
    let (new, reclaimed) = (delta("snat_new"), delta("snat_port_reclaimed"));
    assert!(
        new > 1024 + ROUND as u64,
        "only {new} new translations for {} connections: the test did not run out of ports: {:#}",
        3 * ROUND,
        after["reasons"]
    );
    assert!(
        reclaimed >= new - 1024,
        "{new} new translations on 1024 ports, but only {reclaimed} ports were taken back: {:#}",
        after["reasons"]
    );
    assert_eq!(
        reason(&after, "drop_no_snat_port"),
        reason(&before, "drop_no_snat_port"),
        "{:#}",
        after["reasons"]
    );
    del(&node, &a, &conf);
}
