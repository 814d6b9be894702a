//! Packet tests (BPF_PROG_TEST_RUN) of routing decisions and pass-through.
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use std::net::Ipv6Addr;

use cni_ebpf::datapath::Endpoint;
use cni_ebpf_common::{FlowFlags, NatKey6, Reason};
use testbed::packet::*;

use crate::frames6::*;

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn pod_to_local_pod_is_redirected_into_the_peer() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    let pkt = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        TCP,
        &tcp(POD_A, POD_B, 40000, 80, SYN, b"x"),
    );
    let (v, out) = fx.run("from_pod", &pkt);
    assert_eq!(v, REDIRECT, "pod → local pod must be redirected");
    let p = parse_checked(&out);
    assert_eq!(p.dmac, POD_MAC_B, "destination MAC must be pod B's");
    assert_eq!(p.smac, HOST_MAC_B, "source MAC must be B's host veth");
    assert_eq!(p.ttl, 63, "TTL must be decremented");
    assert_eq!((p.src, p.dst, p.sport, p.dport), (POD_A, POD_B, 40000, 80));
    assert_eq!(out[14 + 20..], pkt[14 + 20..], "L4 must be untouched");
    assert_eq!(fx.reason(Reason::RedirectPod), 1);

    // UDP and ICMP too.
    let pkt = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        UDP,
        &udp(POD_A, POD_B, 5353, 53, b"q", true),
    );
    let (v, out) = fx.run("from_pod", &pkt);
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).ttl, 63);
    let pkt = frame(HOST_MAC_A, POD_MAC_A, POD_A, POD_B, ICMP, &echo(8, 7, 1));
    let (v, out) = fx.run("from_pod", &pkt);
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).icmp_id, 7);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn pod_traffic_not_for_a_local_pod_goes_to_the_stack_unchanged() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    for (dst, what) in [
        (
            EXT,
            "outside the cluster (masqueraded later, on the uplink)",
        ),
        (REMOTE_POD, "pod on another node"),
        (NODE, "the node itself, no host port"),
        (GATEWAY, "the gateway"),
    ] {
        let pkt = frame(
            HOST_MAC_A,
            POD_MAC_A,
            POD_A,
            dst,
            TCP,
            &tcp(POD_A, dst, 40000, 80, SYN, b""),
        );
        fx.assert_passes_unchanged("from_pod", &pkt, what);
    }
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn expiring_ttl_is_left_to_the_stack() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    let pkt = eth(
        POD_MAC_A,
        HOST_MAC_A,
        0x0800,
        &ipv4(POD_A, POD_B, UDP, 1, &udp(POD_A, POD_B, 1, 2, b"", true)),
    );
    let (v, out) = fx.run("from_pod", &pkt);
    assert_eq!(
        v, OK,
        "TTL 1 must go to the stack (which sends time-exceeded)"
    );
    assert_eq!(out, pkt, "and unchanged");
    assert_eq!(fx.reason(Reason::PassTtlExpired), 1);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn unknown_and_malformed_input_passes_unchanged_everywhere() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    let good = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        TCP,
        &tcp(POD_A, POD_B, 40000, 80, SYN, b"abc"),
    );

    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    cases.push(("ARP".into(), eth([0xff; 6], POD_MAC_A, 0x0806, &[0u8; 28])));
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
    v6.extend_from_slice(&[0u8; 32]);
    v6.extend_from_slice(&[0u8; 8]);
    cases.push(("IPv6".into(), eth(POD_MAC_B, POD_MAC_A, 0x86dd, &v6)));
    cases.push((
        "VLAN-tagged".into(),
        eth(POD_MAC_B, POD_MAC_A, 0x8100, &good[12..]),
    ));
    // BPF_PROG_TEST_RUN itself refuses frames with an IPv4 ethertype and less than a full
    // IPv4 header (EINVAL), so truncation is tested from the L4 header on; `parse` checks
    // the shorter cases the same way (every load is bounds-checked by the helper).
    cases.push(("TCP header cut short".into(), good[..34 + 10].to_vec()));
    cases.push(("IPv4 header alone, TCP missing".into(), good[..34].to_vec()));
    let u = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        UDP,
        &udp(POD_A, POD_B, 1, 2, b"", true),
    );
    cases.push(("UDP header cut short".into(), u[..34 + 5].to_vec()));
    let i = frame(HOST_MAC_A, POD_MAC_A, POD_A, POD_B, ICMP, &echo(8, 1, 1));
    cases.push(("ICMP header cut short".into(), i[..34 + 6].to_vec()));
    // tot_len larger than the frame.
    let mut long = good.clone();
    long[16..18].copy_from_slice(&1400u16.to_be_bytes());
    cases.push(("IPv4 total length beyond the frame".into(), long));
    // IPv4 with options (IHL 6): header rebuilt with a NOP/EOL option word.
    let l4 = tcp(POD_A, POD_B, 40000, 80, SYN, b"abc");
    let mut ip = ipv4(POD_A, POD_B, TCP, 64, &l4);
    ip.splice(20..20, [1u8, 1, 1, 0]);
    ip[0] = 0x46;
    ip[2..4].copy_from_slice(&((24 + l4.len()) as u16).to_be_bytes());
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = inet_csum(&[&ip[..24]]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    cases.push((
        "IPv4 options".into(),
        eth(POD_MAC_B, POD_MAC_A, 0x0800, &ip),
    ));
    // Fragments: first (MF) and a later one (offset).
    for (frag, what) in [
        (0x2000u16, "first fragment (MF)"),
        (0x0010u16, "later fragment"),
    ] {
        let mut ip = ipv4(POD_A, POD_B, TCP, 64, &l4);
        ip[6..8].copy_from_slice(&frag.to_be_bytes());
        ip[10..12].copy_from_slice(&[0, 0]);
        let c = inet_csum(&[&ip[..20]]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        cases.push((what.into(), eth(POD_MAC_B, POD_MAC_A, 0x0800, &ip)));
    }
    // Version 6 in an IPv4 ethertype, IHL 4.
    let mut bad = good.clone();
    bad[14] = 0x65;
    cases.push(("IPv4 ethertype with version 6".into(), bad));
    let mut bad = good.clone();
    bad[14] = 0x44;
    cases.push(("IHL below 5".into(), bad));
    // Unknown L4 protocol to the outside (SCTP): nothing to translate.
    cases.push((
        "SCTP to the outside".into(),
        frame(UPLINK_MAC, EXT_MAC, POD_A, EXT, 132, &[0u8; 16]),
    ));

    for prog in ALL_PROGS {
        for (what, pkt) in &cases {
            fx.assert_passes_unchanged(prog, pkt, what);
        }
    }
    assert!(fx.reason(Reason::PassMalformed) > 0);
    assert!(fx.reason(Reason::PassIpOptions) > 0);
    assert!(fx.reason(Reason::PassFragment) > 0);
    assert!(fx.reason(Reason::PassNotIpv4) > 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn loading_twice_reuses_the_pins_and_unload_removes_them() {
    let fx = Fixture::new();
    let first = fx.dp().program("from_pod").unwrap();
    let again = cni_ebpf::datapath::Datapath::load_at(fx.network_dir()).unwrap();
    let id = |p: &aya::programs::SchedClassifier| p.info().unwrap().id();
    assert_eq!(
        id(&first),
        id(&again.program("from_pod").unwrap()),
        "no second load"
    );
    drop(again);
    drop(first);
    cni_ebpf::datapath::Datapath::unload_at(fx.network_dir()).unwrap();
    assert!(
        cni_ebpf::datapath::Datapath::open_at(fx.network_dir())
            .unwrap()
            .is_none(),
        "nothing left pinned"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_from_a_pod_reaches_its_own_program_and_is_tracked() {
    let fx = dual_stack_node();
    let syn = tcp6(POD_A6, 40000, EXT6, 80, SYN);
    fx.assert_passes_unchanged("from_pod", &syn, "a pod's IPv6 SYN leaving the node");
    assert_eq!(
        fx.reason(Reason::PassIpv6NotLoaded),
        0,
        "the tail call must land"
    );
    // `from_pod6` ran: the flow is recorded as opened by the pod, not yet verified.
    let key = NatKey6 {
        saddr: wire(POD_A6),
        daddr: wire(EXT6),
        sport: 40000u16.to_be(),
        dport: 80u16.to_be(),
        proto: TCP,
        _pad: [0; 3],
    };
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_empty_ipv6_slot_passes_the_packet_and_says_so() {
    let fx = dual_stack_node();
    let pin = fx
        .network_dir()
        .join(format!("v{}", cni_ebpf_common::LAYOUT_VERSION))
        .join("maps")
        .join("CALLS6");
    let mut m = aya::maps::Map::ProgramArray(aya::maps::MapData::from_pin(&pin).unwrap());
    let mut calls: aya::maps::ProgramArray<_> = aya::maps::ProgramArray::try_from(&mut m).unwrap();
    calls
        .clear_index(&cni_ebpf_common::prog::CALL6_UPLINK_EGRESS)
        .unwrap();
    let syn = tcp6(POD_A6, 40001, EXT6, 80, SYN);
    fx.assert_passes_unchanged("uplink_egress", &syn, "IPv6 with its program missing");
    assert_eq!(fx.reason(Reason::PassIpv6NotLoaded), 1);
    assert_eq!(nat6_len(&fx), 0, "nothing translated without the program");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn neighbour_discovery_passes_every_program_untouched() {
    let fx = dual_stack_node();
    let ns = neighbour_solicitation(POD_A6, Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 1));
    for prog in ALL_PROGS {
        fx.assert_passes_unchanged(prog, &ns, "a neighbour solicitation");
    }
    assert_eq!(nat6_len(&fx), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_to_another_pod_of_the_node_goes_straight_into_it() {
    let fx = dual_stack_node();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_B.into(), std::net::IpAddr::V6(POD_B6)],
            ..endpoint_b()
        })
        .unwrap();
    let syn = tcp6(POD_A6, 40000, POD_B6, 80, SYN);
    let (v, out) = fx.run("from_pod", &syn);
    assert_eq!(v, REDIRECT, "into pod B (bpf_redirect_peer)");
    assert_eq!(out[0..6], POD_MAC_B, "to pod B's MAC");
    assert_eq!(out[6..12], HOST_MAC_B, "from its host veth's");
    assert_eq!(out[14 + 7], 63, "hop limit decremented (a routed hop)");
    let s = parse6(&out);
    assert_eq!((s.src, s.dst), (POD_A6, POD_B6));
    assert!(
        s.csum_ok,
        "the tuple is untouched, the checksum still right"
    );
    assert_eq!(fx.reason(Reason::RedirectPod), 1);
}
