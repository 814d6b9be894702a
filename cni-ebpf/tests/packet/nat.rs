//! Packet tests (BPF_PROG_TEST_RUN) of masquerade: SNAT on uplink egress, reverse NAT on
//! uplink ingress, ICMP echo and ICMP errors, what is never masqueraded, and packets whose
//! rewrite fails (dropped, no NAT state left).
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use std::net::Ipv6Addr;

use cni_ebpf::datapath::load::Faults;
use cni_ebpf_common::{NatKey6, Reason};
use testbed::packet::*;

use crate::frames6::*;

fn in_snat_range(p: u16) -> bool {
    (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&p)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn tcp_is_masqueraded_and_the_reply_reaches_the_pod() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();

    // Pod A → EXT:80, as it leaves through the uplink after the stack routed it.
    let syn = tcp_frame(POD_A, 40000, EXT, 80, SYN);
    let (v, out) = fx.egress(&syn);
    assert_eq!(v, OK, "masqueraded packets continue out of the uplink");
    let p = parse_checked(&out);
    assert_eq!(p.src, NODE, "source must be the node address");
    assert_eq!(p.dst, EXT);
    assert_eq!(p.dport, 80);
    assert!(
        in_snat_range(p.sport),
        "SNAT port {} outside {SNAT_PORTS:?}",
        p.sport
    );
    assert_eq!(p.ttl, 64, "the stack already routed it: no TTL change here");
    assert_eq!(out[..14], syn[..14], "L2 untouched");
    let nport = p.sport;
    assert_eq!(fx.reason(Reason::SnatNew), 1);

    // The next packet of the flow gets the same port.
    let (v, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, ACK));
    assert_eq!(v, OK);
    assert_eq!(
        parse_checked(&out).sport,
        nport,
        "same flow, same SNAT port"
    );
    assert_eq!(fx.reason(Reason::SnatForward), 1);

    // Another pod flow with the same source port gets a different one.
    let (_, out) = fx.egress(&tcp_frame(POD_B, 40000, EXT, 80, SYN));
    let other = parse_checked(&out).sport;
    assert_ne!(
        other, nport,
        "two flows to the same destination share an SNAT port"
    );

    // The reply, arriving on the uplink.
    let reply = tcp_frame(EXT, 80, NODE, nport, SYN | ACK);
    let (v, out) = fx.run("uplink_ingress", &reply);
    assert_eq!(v, REDIRECT, "the reply goes straight into the pod");
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (EXT, 80, POD_A, 40000));
    assert_eq!((p.dmac, p.smac), (POD_MAC_A, HOST_MAC_A), "L2 for pod A");
    assert_eq!(p.ttl, 63);
    assert_eq!(fx.reason(Reason::SnatReply), 1);

    let nat = fx.dp().nat_entries().unwrap();
    assert!(nat
        .iter()
        .any(|e| e.kind == "snat" && e.src == POD_A && e.new_src == NODE));
    assert!(nat
        .iter()
        .any(|e| e.kind == "snat-reply" && e.dst == NODE && e.new_dst == POD_A));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn udp_is_masqueraded_with_and_without_checksum() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();

    let (v, out) = fx.egress(&udp_frame(POD_A, 5353, EXT, 53));
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!(p.src, NODE);
    assert!(in_snat_range(p.sport));
    let nport = p.sport;

    let (v, out) = fx.run("uplink_ingress", &udp_frame(EXT, 53, NODE, nport));
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!((p.dst, p.dport), (POD_A, 5353));

    // A datagram without checksum keeps having none.
    let l4 = udp(POD_B, EXT, 7000, 53, b"no checksum", false);
    let (v, out) = fx.egress(&frame(UPLINK_MAC, EXT_MAC, POD_B, EXT, UDP, &l4));
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!(p.src, NODE);
    assert_eq!(p.l4[6..8], [0, 0], "a zero UDP checksum must stay zero");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn icmp_echo_is_masqueraded_by_identifier() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();

    let req = frame(UPLINK_MAC, EXT_MAC, POD_A, EXT, ICMP, &echo(8, 0x1234, 1));
    let (v, out) = fx.egress(&req);
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!((p.src, p.dst, p.icmp_type), (NODE, EXT, 8));
    assert!(
        in_snat_range(p.icmp_id),
        "echo id {} outside the SNAT range",
        p.icmp_id
    );
    let nid = p.icmp_id;

    let rep = frame(UPLINK_MAC, EXT_MAC, EXT, NODE, ICMP, &echo(0, nid, 1));
    let (v, out) = fx.run("uplink_ingress", &rep);
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!(
        (p.src, p.dst, p.icmp_type, p.icmp_id),
        (EXT, POD_A, 0, 0x1234)
    );
}

/// An ICMP error from a router about a datagram we masqueraded.
fn icmp_error_about(ty: u8, code: u8, quoted: &[u8]) -> Vec<u8> {
    let router = std::net::Ipv4Addr::new(198, 18, 0, 254);
    // The quote: the IPv4 header and the first 8 bytes of L4, as the router saw it.
    let l4 = icmp(ty, code, [0; 4], &quoted[14..14 + 28]);
    frame(UPLINK_MAC, EXT_MAC, router, NODE, ICMP, &l4)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn icmp_errors_about_masqueraded_flows_reach_the_pod() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();

    for (proto, first) in [
        (UDP, udp_frame(POD_A, 5353, EXT, 53)),
        (TCP, tcp_frame(POD_A, 40001, EXT, 443, SYN)),
        (
            ICMP,
            frame(UPLINK_MAC, EXT_MAC, POD_A, EXT, ICMP, &echo(8, 0x4321, 9)),
        ),
    ] {
        let (_, sent) = fx.egress(&first);
        let sent_p = parse_checked(&sent);
        assert_eq!(sent_p.src, NODE);
        for (ty, code) in [(3u8, 3u8), (11, 0), (3, 4)] {
            let err = icmp_error_about(ty, code, &sent);
            let (v, out) = fx.run("uplink_ingress", &err);
            assert_eq!(
                v, REDIRECT,
                "proto {proto}: ICMP {ty}/{code} must reach the pod"
            );
            let p = parse_checked(&out);
            assert_eq!(p.dst, POD_A, "outer destination must be the pod");
            assert_eq!(p.icmp_type, ty);
            // The quoted header, now as the pod sent it.
            let q = &p.l4[8..];
            assert_eq!(
                inet_csum(&[&q[..20]]),
                0,
                "quoted IPv4 header checksum is wrong"
            );
            assert_eq!(q[12..16], POD_A.octets(), "quoted source must be the pod");
            assert_eq!(q[16..20], EXT.octets(), "quoted destination unchanged");
            match proto {
                ICMP => assert_eq!(u16::from_be_bytes([q[24], q[25]]), 0x4321, "quoted echo id"),
                _ => {
                    let orig = parse_checked(&first);
                    assert_eq!(
                        u16::from_be_bytes([q[20], q[21]]),
                        orig.sport,
                        "quoted source port"
                    );
                    assert_eq!(
                        u16::from_be_bytes([q[22], q[23]]),
                        orig.dport,
                        "quoted destination port"
                    );
                }
            }
        }
    }
    assert_eq!(fx.reason(Reason::IcmpErrorTranslated), 9);

    // An ICMP error about nothing we translated passes untouched.
    let unrelated = tcp_frame(NODE, 33333, EXT, 22, SYN);
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &icmp_error_about(3, 3, &unrelated),
        "ICMP error about node traffic",
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn cluster_node_and_foreign_traffic_is_never_masqueraded() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    for (pkt, what) in [
        (
            tcp_frame(POD_A, 40000, REMOTE_POD, 80, SYN),
            "pod → clusterCIDR",
        ),
        (
            tcp_frame(POD_A, 40000, NODE2, 80, SYN),
            "pod → a node address",
        ),
        (
            tcp_frame(NODE, 40000, EXT, 80, SYN),
            "the node's own traffic",
        ),
        (
            tcp_frame(std::net::Ipv4Addr::new(10, 244, 1, 99), 40000, EXT, 80, SYN),
            "an address that is no local pod",
        ),
        (
            frame(
                UPLINK_MAC,
                EXT_MAC,
                POD_A,
                EXT,
                ICMP,
                &icmp(3, 3, [0; 4], &[0u8; 28]),
            ),
            "an ICMP error from a pod",
        ),
    ] {
        fx.assert_passes_unchanged("uplink_egress", &pkt, what);
    }
    // Replies to ports we never handed out.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 80, NODE, 62000, ACK),
        "unknown reply",
    );
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 80, NODE, 40000, ACK),
        "node socket traffic",
    );
    assert!(
        fx.dp().nat_entries().unwrap().is_empty(),
        "no NAT state created"
    );

    // ipMasq off: nothing is masqueraded.
    fx.standard_node(false);
    fx.assert_passes_unchanged(
        "uplink_egress",
        &tcp_frame(POD_A, 40000, EXT, 80, SYN),
        "ipMasq false",
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn detaching_a_pod_purges_its_flows() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    let (_, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN));
    let nport = parse_checked(&out).sport;
    fx.egress(&tcp_frame(POD_B, 40000, EXT, 80, SYN));
    assert_eq!(fx.dp().nat_entries().unwrap().len(), 4);

    fx.dp()
        .detach_endpoint("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()])
        .unwrap();
    let left = fx.dp().nat_entries().unwrap();
    assert_eq!(left.len(), 2, "only pod B's flow is left: {left:?}");
    assert!(left.iter().all(|e| e.src != POD_A && e.new_dst != POD_A));
    // A late reply of A's flow no longer goes anywhere near a pod.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 80, NODE, nport, ACK),
        "late reply after DEL",
    );
    // Idempotent, and B untouched.
    fx.dp()
        .detach_endpoint("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()])
        .unwrap();
    let eps = fx.dp().endpoints().unwrap();
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].container_id, "ctr-b");
    // Someone else's container ID never removes B.
    fx.dp()
        .detach_endpoint("ctr-x", "eth0", "veth-ctr-x", &[POD_B.into()])
        .unwrap();
    assert_eq!(
        fx.dp().endpoints().unwrap().len(),
        1,
        "B must survive a foreign DEL"
    );
}

// ---------------------------------------------------------------------------------------
// SNAT ports of flows that are over are handed out again.

const FIN: u8 = 0x01;
const RST: u8 = 0x04;
const ONE_PORT: u16 = 61000;

/// A node whose SNAT range is the single port [`ONE_PORT`], so that a second flow to the
/// same destination needs the first one's port.
fn one_port_node() -> Fixture {
    one_port_node_on(Fixture::new())
}

/// [`one_port_node`] on fixture `fx`.
fn one_port_node_on(fx: Fixture) -> Fixture {
    fx.standard_node(true);
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        snat_ports: (ONE_PORT, ONE_PORT),
        snat_dest_cap: cni_ebpf::datapath::snat_dest_cap(None, (ONE_PORT, ONE_PORT)),
        ..standard_settings(true)
    });
    fx.two_pods();
    fx
}

/// Makes every NAT entry look `by` older (as if no packet had been seen for that long).
fn age_nat(fx: &Fixture, by: std::time::Duration) {
    use aya::maps::{HashMap, Map, MapData};
    use cni_ebpf_common::{NatEntry, NatKey};
    let pin = fx
        .network_dir()
        .join(format!("v{}/maps/NAT", cni_ebpf_common::LAYOUT_VERSION));
    let data = MapData::from_pin(&pin).unwrap();
    let mut nat: HashMap<MapData, NatKey, NatEntry> =
        HashMap::try_from(Map::LruHashMap(data)).unwrap();
    let all: Vec<(NatKey, NatEntry)> = nat.iter().map(Result::unwrap).collect();
    assert!(!all.is_empty(), "no NAT entries to age");
    for (k, mut v) in all {
        v.last_seen_ns = v.last_seen_ns.saturating_sub(by.as_nanos() as u64);
        nat.insert(k, v, 0).unwrap();
    }
}

/// Pod A opens a TCP flow to EXT:80 on [`ONE_PORT`].
fn open_a(fx: &Fixture) {
    let (v, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN));
    assert_eq!(v, OK);
    assert_eq!(parse_checked(&out).sport, ONE_PORT);
}

/// Pod B's SYN to EXT:80: the verdict and, when it got through, its SNAT port.
fn syn_b(fx: &Fixture) -> (u32, u16) {
    let (v, out) = fx.egress(&tcp_frame(POD_B, 40001, EXT, 80, SYN));
    (
        v,
        if v == OK {
            parse_checked(&out).sport
        } else {
            0
        },
    )
}

fn fin_from_pod_a(fx: &Fixture) {
    let (v, _) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, FIN | ACK));
    assert_eq!(v, OK);
}

fn fin_from_ext(fx: &Fixture) {
    let (v, _) = fx.run(
        "uplink_ingress",
        &tcp_frame(EXT, 80, NODE, ONE_PORT, FIN | ACK),
    );
    assert_eq!(v, REDIRECT, "ext's FIN reaches pod A");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn snat_port_of_a_flow_the_pod_closed_is_reused_after_a_second() {
    let fx = one_port_node();
    open_a(&fx);
    assert_eq!(syn_b(&fx).0, SHOT, "the only port is held by A's open flow");
    assert_eq!(fx.reason(Reason::DropNoSnatPort), 1);
    fin_from_pod_a(&fx);
    fin_from_ext(&fx);
    let nat = fx.dp().nat_entries().unwrap();
    let state = |kind: &str| {
        nat.iter()
            .find(|e| e.kind == kind)
            .map(|e| e.state)
            .unwrap_or("missing")
    };
    assert_eq!(state("snat"), "fin-first", "the pod closed first: {nat:#?}");
    assert_eq!(state("snat-reply"), "fin", "{nat:#?}");
    assert_eq!(
        syn_b(&fx).0,
        SHOT,
        "closed this instant: in-flight packets may follow"
    );
    age_nat(&fx, std::time::Duration::from_secs(2));
    assert_eq!(syn_b(&fx), (OK, ONE_PORT), "A's port, taken back");
    assert_eq!(fx.reason(Reason::SnatPortReclaimed), 1);

    // The port now leads to B, and A's old forward entry is gone.
    let (v, out) = fx.run(
        "uplink_ingress",
        &tcp_frame(EXT, 80, NODE, ONE_PORT, SYN | ACK),
    );
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!((p.dst, p.dport), (POD_B, 40001));
    let nat = fx.dp().nat_entries().unwrap();
    assert!(
        !nat.iter().any(|e| e.src == POD_A),
        "A's entries must be gone: {nat:#?}"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn snat_port_of_a_flow_the_outside_closed_first_waits_out_time_wait() {
    let fx = one_port_node();
    open_a(&fx);
    fin_from_ext(&fx);
    fin_from_pod_a(&fx);
    age_nat(&fx, std::time::Duration::from_secs(2));
    assert_eq!(
        syn_b(&fx).0,
        SHOT,
        "ext holds the tuple in TIME_WAIT: the port may not be reused yet"
    );
    age_nat(&fx, std::time::Duration::from_secs(60));
    assert_eq!(syn_b(&fx), (OK, ONE_PORT));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn snat_port_of_a_reset_flow_is_reused_and_open_flows_keep_theirs() {
    let fx = one_port_node();
    open_a(&fx);
    // Open and quiet for an hour: still A's (TCP idles for 2 h 4 min).
    age_nat(&fx, std::time::Duration::from_secs(3600));
    assert_eq!(syn_b(&fx).0, SHOT, "an open TCP flow keeps its port");
    // Half-closed by the pod only: still open.
    fin_from_pod_a(&fx);
    age_nat(&fx, std::time::Duration::from_secs(2));
    assert_eq!(syn_b(&fx).0, SHOT, "a half-closed flow keeps its port");
    // A RST ends it.
    let (v, _) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, RST));
    assert_eq!(v, OK);
    age_nat(&fx, std::time::Duration::from_secs(2));
    assert_eq!(syn_b(&fx), (OK, ONE_PORT));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_closed_flow_reopened_with_the_same_tuple_keeps_its_port() {
    let fx = one_port_node();
    open_a(&fx);
    fin_from_pod_a(&fx);
    fin_from_ext(&fx);
    // The pod reuses its source port at once (tcp_tw_reuse): same tuple, open again.
    open_a(&fx);
    age_nat(&fx, std::time::Duration::from_secs(2));
    assert_eq!(
        syn_b(&fx).0,
        SHOT,
        "the reopened flow is open: its port may not be handed out"
    );
    assert_eq!(fx.reason(Reason::SnatPortReclaimed), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn udp_snat_ports_are_reused_after_a_minute_of_silence() {
    let fx = one_port_node();
    let (v, out) = fx.egress(&udp_frame(POD_A, 5000, EXT, 53));
    assert_eq!(v, OK);
    assert_eq!(parse_checked(&out).sport, ONE_PORT);
    let b = || fx.egress(&udp_frame(POD_B, 5001, EXT, 53)).0;
    age_nat(&fx, std::time::Duration::from_secs(30));
    assert_eq!(b(), SHOT, "30 s of silence: A's UDP flow keeps its port");
    age_nat(&fx, std::time::Duration::from_secs(31));
    assert_eq!(b(), OK, "61 s of silence: the port is B's");
}

/// A node like [`one_port_node`] whose programs were loaded with every L4 checksum update
/// failing ([`Faults::l4_csum`]): the state a real helper failure leaves, which no real
/// packet produces here (`parse` keeps the checksum field inside the packet).
fn one_port_node_failing_checksums() -> Fixture {
    one_port_node_on(Fixture::with_faults(Faults { l4_csum: true }))
}

fn addr(a: std::net::Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_new_masqueraded_flow_whose_rewrite_fails_is_dropped_and_leaves_no_nat_state() {
    let fx = one_port_node_failing_checksums();

    // TCP, UDP and ICMP echo, from two pods to the same destination: with one SNAT port,
    // a reverse entry left behind by a failed first packet would hold it, and the next
    // flow would find no port (drop_no_snat_port) instead of its own rewrite failure.
    let cases = [
        tcp_frame(POD_A, 40000, EXT, 80, SYN),
        tcp_frame(POD_B, 40001, EXT, 80, SYN),
        udp_frame(POD_A, 5353, EXT, 53),
        udp_frame(POD_B, 5354, EXT, 53),
        frame(UPLINK_MAC, EXT_MAC, POD_A, EXT, ICMP, &echo(8, 0x1234, 1)),
        frame(UPLINK_MAC, EXT_MAC, POD_B, EXT, ICMP, &echo(8, 0x1235, 1)),
    ];
    for (i, pkt) in cases.iter().enumerate() {
        let (v, out) = fx.egress(pkt);
        fx.assert_rewrite_failed(i, "uplink_egress", v, pkt);
        if i == 0 {
            // The fault struck where a real one would: after the tuple was written, so the
            // packet is half rewritten (new source, stale checksum) — hence the drop.
            assert_eq!(out[26..30], NODE.octets(), "the source was already written");
            let l4 = &out[34..];
            let pseudo = [
                &out[26..34],
                &[0, TCP],
                &(l4.len() as u16).to_be_bytes()[..],
            ]
            .concat();
            assert_ne!(
                inet_csum(&[&pseudo, l4]),
                0,
                "the TCP checksum must not have been fixed"
            );
        }
    }
    assert_eq!(
        fx.reason(Reason::DropNoSnatPort),
        0,
        "the port was freed each time"
    );
    assert_eq!(fx.reason(Reason::SnatNew), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_packet_of_an_existing_flow_whose_rewrite_fails_is_dropped() {
    let fx = one_port_node_failing_checksums();

    // Pod A's masqueraded flow POD_A:40000 → EXT:80 on NODE:ONE_PORT, set up by hand (no
    // packet can set it up under the fault).
    let out_pkt = tcp_frame(POD_A, 40000, EXT, 80, ACK);
    let reply = tcp_frame(EXT, 80, NODE, ONE_PORT, ACK);
    let pair = snat_tcp_pair(
        (addr(POD_A), 40000),
        (addr(EXT), 80),
        (addr(NODE), ONE_PORT),
    );
    assert_eq!(
        (pair[0].0, pair[1].0),
        (flow_key(&out_pkt), flow_key(&reply))
    );
    for (key, entry) in pair {
        fx.set_nat(&key, entry);
    }

    let (v, _) = fx.egress(&out_pkt);
    assert_eq!(v, SHOT, "pod → outside: dropped, not passed half rewritten");
    let (v, _) = fx.run("uplink_ingress", &reply);
    assert_eq!(v, SHOT, "reply → pod: dropped, not passed half rewritten");
    // An ICMP error about the flow: its outer destination is written before the ICMP
    // checksum fails.
    let sent = tcp_frame(NODE, ONE_PORT, EXT, 80, ACK);
    let (v, out) = fx.run("uplink_ingress", &icmp_error_about(3, 4, &sent));
    assert_eq!(
        v, SHOT,
        "ICMP error → pod: dropped, not passed half translated"
    );
    assert_eq!(
        out[30..34],
        POD_A.octets(),
        "the outer destination was already written"
    );

    assert_eq!(fx.reason(Reason::DropRewriteFailed), 3);
    assert_eq!(fx.reason(Reason::SnatForward), 0);
    assert_eq!(fx.reason(Reason::SnatReply), 0);
    assert_eq!(fx.reason(Reason::IcmpErrorTranslated), 0);
    // The flow was not made for these packets: it stays for the next ones.
    assert!(fx.nat(&flow_key(&out_pkt)).is_some(), "forward entry kept");
    assert!(fx.nat(&flow_key(&reply)).is_some(), "reverse entry kept");
}

/// Masquerades `out` (pod A → EXT6) at the uplink and sends `reply` (built from the
/// translated packet by `make_reply`) back in; checks both rewrites and checksums.
fn masquerade_round_trip(
    fx: &Fixture,
    out: &[u8],
    make_reply: impl Fn(&Seen6) -> Vec<u8>,
    echo: bool,
) {
    let before = parse6(out);
    assert!(before.csum_ok, "the test's own packet");
    let (v, sent) = fx.run("uplink_egress", out);
    assert_eq!(v, OK, "a new masqueraded flow");
    let s = parse6(&sent);
    assert_eq!(s.src, NODE6, "leaves with the node's IPv6 address");
    assert_eq!(s.dst, EXT6);
    assert!(
        (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&s.sport),
        "SNAT port {} in range",
        s.sport
    );
    if !echo {
        assert_eq!(s.dport, before.dport);
    }
    assert!(s.csum_ok, "L4 checksum right over the new pseudo-header");
    assert_eq!(fx.reason(Reason::SnatNew), 1);
    assert_eq!(nat6_len(fx), 2, "forward and reverse entries");

    let reply = make_reply(&s);
    let (v, back) = fx.run("uplink_ingress", &reply);
    assert_eq!(v, OK, "the reply, translated back and handed to the stack");
    let b = parse6(&back);
    assert_eq!(b.dst, POD_A6, "back to the pod");
    assert_eq!(b.src, EXT6);
    if echo {
        assert_eq!(b.sport, before.sport, "the pod's echo id restored");
    } else {
        assert_eq!(b.dport, before.sport, "the pod's port restored");
    }
    assert!(
        b.csum_ok,
        "the reply's checksum right over the pod's pseudo-header"
    );
    // The flow reached the uplink without `from_pod` seeing it (as one netfilter
    // translated would): its replies go back through the stack.
    assert_eq!(fx.reason(Reason::SnatReplyToStack), 1);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn tcp_over_ipv6_is_masqueraded_and_the_reply_reaches_the_pod() {
    let fx = dual_stack_node();
    masquerade_round_trip(
        &fx,
        &tcp6(POD_A6, 40000, EXT6, 443, SYN),
        |s| tcp6(EXT6, 443, NODE6, s.sport, SYN | ACK),
        false,
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn udp_over_ipv6_is_masqueraded_and_the_reply_reaches_the_pod() {
    let fx = dual_stack_node();
    masquerade_round_trip(
        &fx,
        &udp6(POD_A6, 5353, EXT6, 53),
        |s| udp6(EXT6, 53, NODE6, s.sport),
        false,
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn icmpv6_echo_is_masqueraded_by_identifier() {
    let fx = dual_stack_node();
    masquerade_round_trip(
        &fx,
        &echo6(POD_A6, EXT6, ECHO6_REQUEST, 0x1234),
        |s| echo6(EXT6, NODE6, ECHO6_REPLY, s.sport),
        true,
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_inside_the_cluster_or_from_another_source_is_never_masqueraded() {
    let fx = dual_stack_node();
    // To another pod of the cluster (pod B's address, not local in ENDPOINTS6).
    fx.assert_passes_unchanged(
        "uplink_egress",
        &tcp6(POD_A6, 40000, POD_B6, 80, SYN),
        "pod → pod inside clusterCIDRs",
    );
    // The node's own traffic (not a local pod's source).
    fx.assert_passes_unchanged(
        "uplink_egress",
        &tcp6(NODE6, 40000, EXT6, 80, SYN),
        "the node's own connection",
    );
    assert_eq!(nat6_len(&fx), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn icmpv6_errors_about_masqueraded_flows_reach_the_pod() {
    let fx = dual_stack_node();
    let router = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
    let mut errors_seen = 0;
    for (what, out, ty, code, rest) in [
        (
            "packet too big about TCP",
            tcp6(POD_A6, 40000, EXT6, 443, ACK),
            2u8,
            0u8,
            1280u32.to_be_bytes(),
        ),
        (
            "port unreachable about UDP",
            udp6(POD_A6, 5353, EXT6, 53),
            1,
            4,
            [0; 4],
        ),
        (
            "time exceeded about an echo request",
            echo6(POD_A6, EXT6, ECHO6_REQUEST, 0x4321),
            3,
            0,
            [0; 4],
        ),
    ] {
        let (v, sent) = fx.run("uplink_egress", &out);
        assert_eq!(v, OK, "{what}: masqueraded");
        let s = parse6(&sent);
        // The quote: the translated packet as it left, cut after 8 bytes of L4 header as
        // many routers do (the quoted L4 checksum is then partly missing).
        let quoted = &sent[14..14 + 40 + 8];
        let err = icmp6_error(router, NODE6, ty, code, rest, quoted);
        assert_eq!(quote_of(&err), (NODE6, EXT6, s.sport));
        let (v, back) = fx.run("uplink_ingress", &err);
        assert_eq!(v, OK, "{what}: translated and handed to the stack");
        errors_seen += 1;
        let b = parse6(&back);
        assert_eq!(b.dst, POD_A6, "{what}: the error goes to the pod");
        assert_eq!(b.src, router, "{what}: from the router that sent it");
        assert!(
            b.csum_ok,
            "{what}: ICMPv6 checksum right over the new pseudo-header and quote"
        );
        let before = parse6(&out);
        assert_eq!(
            quote_of(&back),
            (POD_A6, EXT6, before.sport),
            "{what}: the quote is the packet as the pod sent it"
        );
        assert_eq!(
            back[14 + 40..14 + 40 + 8][4..8],
            rest,
            "{what}: the MTU field untouched"
        );
        assert_eq!(fx.reason(Reason::IcmpErrorTranslated), errors_seen);
    }
    // An error about a flow we never translated passes unchanged.
    let foreign = tcp6(NODE6, 33333, EXT6, 443, ACK);
    let err = icmp6_error(
        router,
        NODE6,
        2,
        0,
        1280u32.to_be_bytes(),
        &foreign[14..14 + 48],
    );
    fx.assert_passes_unchanged("uplink_ingress", &err, "an error about the node's own flow");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn removing_a_dual_stack_pod_purges_its_ipv6_flows_and_entries() {
    let fx = dual_stack_node();
    let (v, _) = fx.run("uplink_egress", &udp6(POD_A6, 5353, EXT6, 53));
    assert_eq!(v, OK);
    fx.run("from_pod", &tcp6(POD_A6, 40000, EXT6, 80, SYN));
    assert_eq!(nat6_len(&fx), 2);
    let view = fx.dp().node_config_view().unwrap();
    assert_eq!(
        view.node_addr6,
        Some(NODE6),
        "inspect shows the IPv6 masquerade source"
    );
    assert!(view.cluster_cidrs.contains(&"fd00:10:244::/48".to_owned()));
    let attachments = fx.dp().attachments().unwrap();
    let a = attachments
        .iter()
        .find(|a| a.container_id == "ctr-a")
        .unwrap();
    assert!(
        a.ips.contains(&std::net::IpAddr::V6(POD_A6)),
        "GC sees the IPv6 entry"
    );

    let ips = [POD_A.into(), std::net::IpAddr::V6(POD_A6)];
    fx.dp()
        .detach_endpoint("ctr-a", "eth0", "veth-ctr-a", &ips)
        .unwrap();
    assert_eq!(nat6_len(&fx), 0, "the masqueraded flow's entries are gone");
    let m = fx.map("FLOWS6");
    let flows: aya::maps::HashMap<_, NatKey6, cni_ebpf_common::FlowEntry> =
        aya::maps::HashMap::try_from(&m).unwrap();
    assert_eq!(flows.keys().count(), 0, "and the pod's flow verdicts");
    let m = fx.map("ENDPOINTS6");
    let eps: aya::maps::HashMap<_, cni_ebpf_common::EndpointKey6, cni_ebpf_common::EndpointInfo> =
        aya::maps::HashMap::try_from(&m).unwrap();
    assert_eq!(eps.keys().count(), 0, "no tombstone left behind");
    // The address is free for the next pod: its packets open nothing of the old one's.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &udp6(EXT6, 53, NODE6, 1024),
        "a late reply to the gone pod's flow",
    );
}
