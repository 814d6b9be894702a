//! The IPv6 programs, one decision per test through `BPF_PROG_TEST_RUN`.
//!
//! The attached programs tail-call their IPv6 halves (`from_pod6`, `uplink_ingress6`,
//! `uplink_egress6`, slots of `CALLS6`): these tests run the attached ones, so the tail
//! calls are part of what is tested. Checksums are verified with this file's own
//! computation (RFC 1071 over the IPv6 pseudo-header), not the kernel's.
//!
//! The maps are written by the plugin's own code: `put_endpoint_entries` (ENDPOINTS6, as
//! ADD does) and `configure_node` (NODE_CONFIG6, as `open_or_load` does from the uplink's
//! global IPv6 address and the IPv6 `clusterCIDRs`).

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

mod packet_support;

use std::net::Ipv6Addr;

use cni_ebpf::datapath::{Endpoint, NodeConfigSpec};
use cni_ebpf_common::{FlowFlags, NatKey6, Reason};
use packet_support::*;

const NODE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
const EXT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 3);
const ICMPV6: u8 = 58;
const ECHO6_REQUEST: u8 = 128;
const ECHO6_REPLY: u8 = 129;

fn wire(a: Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// The IPv6 pseudo-header of an upper-layer checksum (RFC 8200 8.1).
fn pseudo6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&(len as u32).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, next]);
    p
}

/// L4 bytes with their checksum (at `csum_at`) computed over the pseudo-header.
fn l4_6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, mut s: Vec<u8>, csum_at: usize) -> Vec<u8> {
    s[csum_at..csum_at + 2].fill(0);
    let c = inet_csum(&[&pseudo6(src, dst, next, s.len()), &s]);
    s[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    s
}

fn frame6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[next, 64]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(l4);
    eth(UPLINK_MAC, EXT_MAC, 0x86dd, &ip)
}

fn tcp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, flags: u8) -> Vec<u8> {
    let mut s = vec![0u8; 20];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&1000u32.to_be_bytes());
    s[12] = 5 << 4;
    s[13] = flags;
    s[14..16].copy_from_slice(&65535u16.to_be_bytes());
    s.extend_from_slice(b"hello over six");
    frame6(src, dst, TCP, &l4_6(src, dst, TCP, s, 16))
}

fn udp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    let mut s = vec![0u8; 8];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(b"datagram!");
    let len = s.len() as u16;
    s[4..6].copy_from_slice(&len.to_be_bytes());
    frame6(src, dst, UDP, &l4_6(src, dst, UDP, s, 6))
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr, ty: u8, id: u16) -> Vec<u8> {
    let mut s = vec![ty, 0, 0, 0];
    s.extend_from_slice(&id.to_be_bytes());
    s.extend_from_slice(&7u16.to_be_bytes());
    s.extend_from_slice(b"ping six");
    frame6(src, dst, ICMPV6, &l4_6(src, dst, ICMPV6, s, 2))
}

/// A neighbour solicitation for `target` from `src` (to its solicited-node group).
fn neighbour_solicitation(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let dst = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let mut s = vec![135, 0, 0, 0, 0, 0, 0, 0];
    s.extend_from_slice(&t);
    s.extend_from_slice(&[1, 1]);
    s.extend_from_slice(&POD_MAC_A);
    let mut f = frame6(src, dst, ICMPV6, &l4_6(src, dst, ICMPV6, s, 2));
    f[14 + 7] = 255; // hop limit 255, as ND requires
    f
}

/// A parsed IPv6 frame: addresses, L4 ports (or echo id), and whether its L4 checksum
/// is right over the pseudo-header.
struct Seen6 {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    dport: u16,
    csum_ok: bool,
}

fn parse6(f: &[u8]) -> Seen6 {
    assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x86dd, "not IPv6");
    let ip = &f[14..];
    let len = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let next = ip[6];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    let l4 = &ip[40..40 + len];
    let csum_ok = inet_csum(&[&pseudo6(src, dst, next, len), l4]) == 0;
    let (sport, dport) = match next {
        ICMPV6 => (u16::from_be_bytes([l4[4], l4[5]]), 0),
        _ => (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        ),
    };
    Seen6 {
        src,
        dst,
        sport,
        dport,
        csum_ok,
    }
}

/// The node: IPv4 as the other packet tests have it, pod A dual-stack, plus the IPv6
/// half of the configuration (masquerade address NODE6, cluster fd00:10:244::/48).
fn dual_stack_node() -> Fixture {
    let fx = Fixture::new();
    fx.configure_node(&NodeConfigSpec {
        node_addr6: Some(NODE6),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    fx.dp().add_node_addrs(&[(NODE6.into(), 2)]).unwrap();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_A.into(), std::net::IpAddr::V6(POD_A6)],
            ..endpoint_a()
        })
        .unwrap();
    fx.dp().put_endpoint_entries(&endpoint_b()).unwrap();
    fx
}

fn flow6(fx: &Fixture, key: &NatKey6) -> Option<FlowFlags> {
    let m = fx.map("FLOWS6");
    let flows: aya::maps::HashMap<_, NatKey6, cni_ebpf_common::FlowEntry> =
        aya::maps::HashMap::try_from(&m).unwrap();
    flows.get(key, 0).ok().map(|e| e.flags)
}

fn nat6_len(fx: &Fixture) -> usize {
    let m = fx.map("NAT6");
    let nat: aya::maps::HashMap<_, NatKey6, cni_ebpf_common::NatEntry6> =
        aya::maps::HashMap::try_from(&m).unwrap();
    nat.keys().count()
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
fn the_reply_of_a_flow_opened_from_outside_keeps_the_pods_ipv6_address() {
    let fx = dual_stack_node();
    // An outside client opens a connection to the pod (routed to it by the stack).
    let syn = tcp6(EXT6, 50000, POD_A6, 8080, SYN);
    fx.assert_passes_unchanged("uplink_ingress", &syn, "inbound SYN to a pod");
    // The pod's answer leaves with its own address: MASQUERADE only translates flows the
    // pod opened.
    let synack = tcp6(POD_A6, 8080, EXT6, 50000, SYN | ACK);
    fx.assert_passes_unchanged("uplink_egress", &synack, "the pod's SYN-ACK");
    let ack = tcp6(POD_A6, 8080, EXT6, 50000, ACK);
    fx.assert_passes_unchanged("uplink_egress", &ack, "the pod's next segment");
    assert_eq!(nat6_len(&fx), 0);
    assert!(fx.reason(Reason::PassInboundReply) >= 1);
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

/// An ICMPv6 error (`ty`, `code`, 4 bytes of `rest`) from `from` to `to` quoting
/// `quoted` (an IPv6 packet, from its header on).
fn icmp6_error(
    from: Ipv6Addr,
    to: Ipv6Addr,
    ty: u8,
    code: u8,
    rest: [u8; 4],
    quoted: &[u8],
) -> Vec<u8> {
    let mut s = vec![ty, code, 0, 0];
    s.extend_from_slice(&rest);
    s.extend_from_slice(quoted);
    frame6(from, to, ICMPV6, &l4_6(from, to, ICMPV6, s, 2))
}

/// The quoted packet of ICMPv6 error frame `f`: source, destination, source port (or
/// echo id) as the error carries them.
fn quote_of(f: &[u8]) -> (Ipv6Addr, Ipv6Addr, u16) {
    let q = &f[14 + 40 + 8..];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&q[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&q[24..40]).unwrap());
    let l4 = &q[40..];
    let sport = if q[6] == ICMPV6 {
        u16::from_be_bytes([l4[4], l4[5]])
    } else {
        u16::from_be_bytes([l4[0], l4[1]])
    };
    (src, dst, sport)
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
fn an_ipv6_host_port_reaches_the_pod_with_the_clients_address() {
    let fx = dual_stack_node();
    let pod_ips = [POD_A.into(), std::net::IpAddr::V6(POD_A6)];
    fx.dp()
        .add_port_mappings(
            ("ctr-a", "eth0"),
            &pod_ips,
            &[pm(8080, 80, "tcp", None), pm(5353, 53, "udp", None)],
        )
        .unwrap();
    let views = fx.dp().port_mappings().unwrap();
    assert_eq!(views.len(), 4, "no hostIP: both families: {views:#?}");
    for (what, syn, reply) in [
        (
            "TCP",
            tcp6(EXT6, 50000, NODE6, 8080, SYN),
            tcp6(POD_A6, 80, EXT6, 50000, SYN | ACK),
        ),
        (
            "UDP",
            udp6(EXT6, 50001, NODE6, 5353),
            udp6(POD_A6, 53, EXT6, 50001),
        ),
    ] {
        let (v, inb) = fx.run("uplink_ingress", &syn);
        assert_eq!(
            v, REDIRECT,
            "{what}: DNATed and delivered into the pod past the stack"
        );
        assert_eq!(inb[0..6], POD_MAC_A, "{what}: to pod A's MAC");
        assert_eq!(inb[14 + 7], 63, "{what}: a routed hop");
        let i = parse6(&inb);
        assert_eq!(
            (i.src, i.dst),
            (EXT6, POD_A6),
            "{what}: the client's address kept"
        );
        assert_eq!(i.dport, if what == "TCP" { 80 } else { 53 });
        assert!(i.csum_ok, "{what}: checksum over the new pseudo-header");
        // Netfilter never saw the flow: the pod's reply takes the uplink fast path (whose
        // FIB lookup, outside any node here, may leave it to the kernel route) and is
        // never judged by the flow check.
        let unverified = fx.reason(Reason::PassUnverifiedFlow);
        let fast = fx.reason(Reason::RedirectUplink) + fx.reason(Reason::PassKernelRoute);
        fx.run("from_pod", &reply);
        assert_eq!(fx.reason(Reason::PassUnverifiedFlow), unverified, "{what}");
        assert_eq!(
            fx.reason(Reason::RedirectUplink) + fx.reason(Reason::PassKernelRoute),
            fast + 1,
            "{what}: the reply reaches the uplink fast path"
        );
        let (v, out) = fx.run("uplink_egress", &reply);
        assert_eq!(v, OK, "{what}: the reply restored");
        let o = parse6(&out);
        assert_eq!(
            (o.src, o.dst),
            (NODE6, EXT6),
            "{what}: the reply leaves as the node"
        );
        assert_eq!(o.sport, if what == "TCP" { 8080 } else { 5353 });
        assert!(o.csum_ok, "{what}: reply checksum");
    }
    assert_eq!(fx.reason(Reason::DnatNew), 2);
    // An IPv6 hostIP maps IPv6 only, and only there.
    fx.dp()
        .add_port_mappings(
            ("ctr-b", "eth0"),
            &[POD_B.into(), std::net::IpAddr::V6(POD_B6)],
            &[pm(9090, 90, "tcp", Some("2001:db8::2"))],
        )
        .unwrap();
    let (v, inb) = fx.run("uplink_ingress", &tcp6(EXT6, 50002, NODE6, 9090, SYN));
    assert_eq!(v, OK);
    assert_eq!(parse6(&inb).dst, POD_B6);
    assert_eq!(
        fx.dp().port_mappings().unwrap().len(),
        5,
        "one entry, IPv6 only"
    );
    // The same port on IPv4 is free still (another family, another map).
    fx.add_ports("ctr-c", POD_B, &[pm(9090, 91, "tcp", None)]);
    // An IPv6 hostIP for a pod without an IPv6 address is refused, naming hostIP.
    let err = fx
        .dp()
        .add_port_mappings(
            ("ctr-d", "eth0"),
            &[POD_B.into()],
            &[pm(7070, 70, "tcp", Some("2001:db8::2"))],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("hostIP") && err.to_string().contains("IPv6"),
        "{err}"
    );
    // Taken: the wildcard IPv6 8080 is ctr-a's.
    let err = fx
        .dp()
        .add_port_mappings(
            ("ctr-e", "eth0"),
            &[std::net::IpAddr::V6(POD_B6)],
            &[pm(8080, 80, "tcp", Some("2001:db8::2"))],
        )
        .unwrap_err();
    assert!(err.to_string().contains("ctr-a"), "{err}");
    // Removal takes both families' entries.
    fx.dp().remove_port_mappings(("ctr-a", "eth0")).unwrap();
    assert!(
        !fx.dp()
            .port_mappings()
            .unwrap()
            .iter()
            .any(|v| v.container_id == "ctr-a"),
        "ctr-a's host ports are gone"
    );
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp6(EXT6, 50003, NODE6, 8080, SYN),
        "a removed IPv6 host port",
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn pods_reach_an_ipv6_host_port_of_their_node_including_their_own() {
    let fx = dual_stack_node();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_B.into(), std::net::IpAddr::V6(POD_B6)],
            ..endpoint_b()
        })
        .unwrap();
    fx.dp()
        .add_port_mappings(
            ("ctr-a", "eth0"),
            &[POD_A.into(), std::net::IpAddr::V6(POD_A6)],
            &[pm(8080, 80, "tcp", None)],
        )
        .unwrap();
    // Pod B → [node]:8080 → pod A: B's address kept, delivered into A.
    let (v, out) = fx.run_on(
        "from_pod",
        IFINDEX_B,
        &tcp6(POD_B6, 41000, NODE6, 8080, SYN),
    );
    assert_eq!(v, REDIRECT, "into pod A");
    let o = parse6(&out);
    assert_eq!((o.src, o.dst, o.dport), (POD_B6, POD_A6, 80));
    assert!(o.csum_ok);
    // A's reply comes back as [node]:8080.
    let (v, back) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp6(POD_A6, 80, POD_B6, 41000, SYN | ACK),
    );
    assert_eq!(v, REDIRECT, "into pod B");
    let b = parse6(&back);
    assert_eq!((b.src, b.sport, b.dst), (NODE6, 8080, POD_B6));
    assert!(b.csum_ok);
    // Pod A → its own host port: the source becomes the node's (a node port), so A sees a
    // peer that is not itself, and its reply is restored.
    let (v, out) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp6(POD_A6, 42000, NODE6, 8080, SYN),
    );
    assert_eq!(v, REDIRECT, "back into pod A");
    let o = parse6(&out);
    assert_eq!((o.src, o.dst, o.dport), (NODE6, POD_A6, 80));
    assert!(
        (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&o.sport),
        "a node port: {}",
        o.sport
    );
    assert!(o.csum_ok);
    let (v, back) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp6(POD_A6, 80, NODE6, o.sport, SYN | ACK),
    );
    assert_eq!(v, REDIRECT);
    let b = parse6(&back);
    assert_eq!(
        (b.src, b.sport, b.dst, b.dport),
        (NODE6, 8080, POD_A6, 42000)
    );
    assert!(b.csum_ok);
    assert_eq!(fx.reason(Reason::HairpinNew), 2);
}

fn key6(saddr: Ipv6Addr, sport: u16, daddr: Ipv6Addr, dport: u16, proto: u8) -> NatKey6 {
    NatKey6 {
        saddr: wire(saddr),
        daddr: wire(daddr),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        _pad: [0; 3],
    }
}

/// The uplink fast path's count: a redirect to the uplink, or (the FIB lookup, outside
/// any node here, finding no route out of the uplink) the kernel route.
fn uplink_fast_path(fx: &Fixture) -> u64 {
    fx.reason(Reason::RedirectUplink) + fx.reason(Reason::PassKernelRoute)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_untranslated_ipv6_flow_is_verified_then_fast_pathed_both_ways() {
    let fx = dual_stack_node();
    let syn = tcp6(POD_A6, 40000, EXT6, 443, SYN);
    fx.assert_passes_unchanged("from_pod", &syn, "the first packet goes to the stack");
    let key = key6(POD_A6, 40000, EXT6, 443, TCP);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
    // The stack forwarded it unchanged: uplink_egress sees the pod's very tuple (and
    // masquerades it).
    let (v, out) = fx.run("uplink_egress", &syn);
    assert_eq!(v, OK);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::VERIFIED));
    assert_eq!(fx.reason(Reason::FlowVerified), 1);
    let nport = parse6(&out).sport;

    // Later packets skip the stack and the flow check.
    let ack = tcp6(POD_A6, 40000, EXT6, 443, ACK);
    let before = fx.reason(Reason::PassUnverifiedFlow);
    fx.run("from_pod", &ack);
    assert_eq!(
        fx.reason(Reason::PassUnverifiedFlow),
        before,
        "ACK of a verified flow"
    );
    assert_eq!(
        uplink_fast_path(&fx),
        1,
        "the verified flow's packet took the fast path"
    );

    // The reply, translated back, goes straight into the pod: the stack saw neither
    // direction after the first packet.
    let reply = tcp6(EXT6, 443, NODE6, nport, SYN | ACK);
    let (v, back) = fx.run("uplink_ingress", &reply);
    assert_eq!(v, REDIRECT, "into pod A (bpf_redirect_peer)");
    assert_eq!(back[0..6], POD_MAC_A);
    assert_eq!(back[14 + 7], 63, "hop limit decremented");
    let b = parse6(&back);
    assert_eq!((b.src, b.dst, b.dport), (EXT6, POD_A6, 40000));
    assert!(b.csum_ok);

    // A SYN is judged afresh (a new connection on a reused tuple).
    fx.assert_passes_unchanged("from_pod", &syn, "SYN of a verified tuple");
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_ipv6_flow_netfilter_translates_stays_on_the_kernel_path() {
    let fx = dual_stack_node();
    let vip = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 10);
    let remote = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 5);
    let to_vip = tcp6(POD_A6, 40000, vip, 80, SYN);
    fx.assert_passes_unchanged("from_pod", &to_vip, "pod → IPv6 ClusterIP");
    // kube-proxy DNATs it to a pod of another node: the uplink sees another tuple.
    let dnated = tcp6(POD_A6, 40000, remote, 8080, SYN);
    fx.assert_passes_unchanged("uplink_egress", &dnated, "DNATed to a cluster pod");
    let key = key6(POD_A6, 40000, vip, 80, TCP);
    assert_eq!(flow6(&fx, &key), Some(FlowFlags::PENDING));
    assert_eq!(fx.reason(Reason::FlowVerified), 0);
    for _ in 0..3 {
        fx.assert_passes_unchanged(
            "from_pod",
            &tcp6(POD_A6, 40000, vip, 80, ACK),
            "a later packet of a translated flow",
        );
    }
    assert_eq!(fx.reason(Reason::PassUnverifiedFlow), 4);
    assert_eq!(uplink_fast_path(&fx), 0);
    // The endpoint's reply (remote → pod, before netfilter's un-DNAT) is not for a
    // verified flow: the stack gets it.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp6(remote, 8080, POD_A6, 40000, SYN | ACK),
        "the reply of a translated flow",
    );
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_verified_ipv6_flow_to_another_node_comes_back_straight_into_the_pod() {
    let fx = dual_stack_node();
    let remote = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 5);
    let out = udp6(POD_A6, 40000, remote, 53);
    fx.assert_passes_unchanged("from_pod", &out, "the first packet");
    // Inside the cluster: verified, never masqueraded.
    fx.assert_passes_unchanged("uplink_egress", &out, "a pod → pod packet across nodes");
    assert_eq!(nat6_len(&fx), 0);
    assert_eq!(
        flow6(&fx, &key6(POD_A6, 40000, remote, 53, UDP)),
        Some(FlowFlags::VERIFIED)
    );
    let (v, back) = fx.run("uplink_ingress", &udp6(remote, 53, POD_A6, 40000));
    assert_eq!(v, REDIRECT, "the reply goes straight into pod A");
    assert_eq!(back[0..6], POD_MAC_A);
    assert_eq!(fx.reason(Reason::RedirectFromUplink), 1);
    // A packet of another flow from the same peer goes to the stack.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &udp6(remote, 54, POD_A6, 40000),
        "a flow the pod never opened",
    );
}

/// Egress rates over IPv6: in fq mode a paced pod's packets for the outside get departure
/// times, and those that stay on the node (for one of its IPv6 addresses) none, since no
/// fq holds them.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ipv6_packets_leaving_the_node_are_stamped_and_local_ones_are_not() {
    use cni_ebpf_common::PacingMode;

    let fx = dual_stack_node();
    let out = udp6(POD_A6, 5353, EXT6, 53);
    let local = udp6(POD_A6, 5353, NODE6, 53);
    assert_eq!(out.len(), local.len());
    // A burst of 2 frames, room for 10 s of schedule.
    let (rate, cost) = frame_rate(out.len(), 2);
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_A.into(), std::net::IpAddr::V6(POD_A6)],
            egress_rate: Some(rate),
            ..endpoint_a()
        })
        .unwrap();
    let mut entry = cni_ebpf::datapath::pacing::pacing_of(&rate, PacingMode::BY_FQ);
    entry.limit_ns = 10 * 1_000_000_000;
    fx.put_pacing(IFINDEX_A, entry);

    // Five frames for the node: past the burst, still no departure time.
    for i in 0..5 {
        let (v, ts) = fx.run_tstamp("from_pod", IFINDEX_A, &local);
        assert_ne!(v, SHOT, "frame {i} for the node dropped");
        assert_eq!(ts, 0, "frame {i} for the node got a departure time");
    }
    // The same schedule, now past its burst: every frame for the outside is stamped, one
    // frame's time apart.
    let stamps: Vec<u64> = (0..5)
        .map(|i| {
            let (v, ts) = fx.run_tstamp("from_pod", IFINDEX_A, &out);
            assert_ne!(v, SHOT, "frame {i} for the outside dropped");
            ts
        })
        .collect();
    assert!(stamps.iter().all(|t| *t > 0), "{stamps:?}");
    for w in stamps.windows(2) {
        assert_eq!(w[1] - w[0], cost, "{stamps:?}");
    }
    assert_eq!(fx.reason(Reason::DropEgressRate), 0);
}
