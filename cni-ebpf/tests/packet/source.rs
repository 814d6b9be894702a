//! A pod speaks only as itself. `from_pod` drops a packet whose source is not
//! one of the sending pod's addresses — IPv4 or IPv6, whatever path it would take,
//! fragments and packets with IP options included — and counts it; a per-attachment
//! allow-list (`allowedSourceCIDRs`) is the only way to send from other sources. IPv6
//! link-local and unspecified sources (neighbour discovery, DAD) always pass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_ebpf::datapath::Endpoint;
use cni_ebpf_common::Reason;
use testbed::packet::*;

fn node() -> Fixture {
    Fixture::with_two_pods()
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_sending_with_another_source_is_dropped_on_every_path() {
    let fx = node();
    let stranger = Ipv4Addr::new(10, 244, 1, 250);
    let cases = [
        ("as pod B, to pod B", tcp_frame(POD_B, 4000, POD_B, 80, SYN)),
        ("as pod B, to the outside", udp_frame(POD_B, 4000, EXT, 53)),
        (
            "as pod B, to the node",
            tcp_frame(POD_B, 4000, NODE, 22, SYN),
        ),
        (
            "as an unused pod address",
            udp_frame(stranger, 4000, EXT, 53),
        ),
        ("as the outside", tcp_frame(EXT, 4000, POD_B, 80, SYN)),
        (
            "from 0.0.0.0",
            udp_frame(Ipv4Addr::UNSPECIFIED, 68, EXT, 67),
        ),
        (
            "ICMP echo as pod B",
            frame(HOST_MAC_A, POD_MAC_A, POD_B, EXT, ICMP, &echo(8, 7, 1)),
        ),
    ];
    for (what, pkt) in &cases {
        let (v, _) = fx.run_on("from_pod", IFINDEX_A, pkt);
        assert_eq!(v, SHOT, "pod A {what}: verdict {v:#x}");
    }
    // A fragment and a header with options are dropped too (parsing stops short of them).
    let mut frag = udp_frame(POD_B, 4000, EXT, 53);
    frag[20] |= 0x20; // more fragments
    let mut opts = tcp_frame(POD_B, 4000, EXT, 80, SYN);
    opts[14] = 0x46; // IHL 6 (the checksum no longer matters: it is dropped first)
    for (what, pkt) in [("a fragment", frag), ("IP options", opts)] {
        let (v, _) = fx.run_on("from_pod", IFINDEX_A, &pkt);
        assert_eq!(v, SHOT, "pod A as pod B, {what}");
    }
    assert_eq!(fx.reason(Reason::DropSpoofedSource), cases.len() as u64 + 2);

    // Its own traffic is untouched, and ARP (not IPv4) passes.
    let (v, _) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp_frame(POD_A, 4000, POD_B, 80, SYN),
    );
    assert_eq!(v, REDIRECT, "pod A as itself to pod B");
    let arp = eth([0xff; 6], POD_MAC_A, 0x0806, &[0u8; 28]);
    fx.assert_passes_unchanged("from_pod", &arp, "ARP");
    assert_eq!(fx.reason(Reason::DropSpoofedSource), cases.len() as u64 + 2);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_host_veth_nobody_owns_is_counted_and_speaks_for_nobody() {
    // `from_pod` on an interface no attachment owns (an ADD not finished, a DEL that never
    // came): each packet is counted `unknown_endpoint`, and with no pod behind the
    // interface no source is its own, so pod A's address is refused there too.
    let fx = node();
    // The fixture namespace's loopback: an interface no attachment owns.
    const STRAY: u32 = 1;
    let (v, _) = fx.run_on("from_pod", STRAY, &tcp_frame(POD_A, 4000, POD_B, 80, SYN));
    assert_eq!(v, SHOT, "pod A's address from a stray interface");
    assert_eq!(fx.reason(Reason::UnknownEndpoint), 1);
    assert_eq!(fx.reason(Reason::DropSpoofedSource), 1);
    // A pod's own interface counts nothing of the kind.
    let (v, _) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp_frame(POD_A, 4000, POD_B, 80, SYN),
    );
    assert_eq!(v, REDIRECT);
    assert_eq!(fx.reason(Reason::UnknownEndpoint), 1);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_allow_list_lets_a_router_pod_send_its_prefixes_and_goes_with_the_pod() {
    let fx = node();
    // Pod A routes 192.0.2.0/24 (a VPN pod): its attachment carries that allow-list.
    let ep = Endpoint {
        allowed_sources: vec!["192.0.2.0/24".parse().unwrap()],
        ..endpoint_a()
    };
    fx.dp().put_endpoint_entries(&ep).unwrap();
    let routed = tcp_frame(Ipv4Addr::new(192, 0, 2, 9), 4000, POD_B, 80, SYN);
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &routed);
    assert_eq!(v, REDIRECT, "an allow-listed source is delivered");
    let other = tcp_frame(Ipv4Addr::new(192, 0, 3, 9), 4000, POD_B, 80, SYN);
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &other).0, SHOT);
    // The list is pod A's only: pod B may not send from it.
    assert_eq!(fx.run_on("from_pod", IFINDEX_B, &routed).0, SHOT);

    // Removing the pod removes its list.
    let mut errors = Vec::new();
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            allowed_sources: Vec::new(),
            egress_rate: None,
            ..ep
        })
        .unwrap();
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &routed).0, SHOT);
}

const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 3);

/// Pods A and B with an IPv6 address each besides their IPv4 one.
fn dual_stack_node() -> Fixture {
    let fx = Fixture::new();
    fx.standard_node(true);
    for ep in [endpoint_a(), endpoint_b()] {
        let v6 = if ep.host_ifindex == IFINDEX_A {
            POD_A6
        } else {
            POD_B6
        };
        let ep = Endpoint {
            ips: vec![ep.ips[0], IpAddr::V6(v6)],
            ..ep
        };
        fx.dp().put_endpoint_entries(&ep).unwrap();
    }
    fx
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_ipv6_packet_from_another_source_is_dropped_and_neighbour_discovery_passes() {
    let fx = dual_stack_node();
    let ext6: Ipv6Addr = "2001:db8::100".parse().unwrap();
    let cases = [
        ("as pod B, to pod B", udp6_frame(POD_B6, POD_B6)),
        ("as pod B, to the outside", udp6_frame(POD_B6, ext6)),
        (
            "as an unused pod address",
            udp6_frame("fd00:10:244:1::fa".parse().unwrap(), ext6),
        ),
        ("as the outside", udp6_frame(ext6, POD_B6)),
        (
            "as pod A's IPv4-mapped address",
            udp6_frame("::ffff:10.244.1.2".parse().unwrap(), POD_B6),
        ),
    ];
    for (what, pkt) in &cases {
        let (v, _) = fx.run_on("from_pod", IFINDEX_A, pkt);
        assert_eq!(v, SHOT, "pod A {what}: verdict {v:#x}");
    }
    assert_eq!(fx.reason(Reason::DropSpoofedSource), cases.len() as u64);

    // Its own address, link-local (neighbour discovery) and `::` (DAD) pass to the kernel
    // (or, to a pod of the node, straight into it).
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &udp6_frame(POD_A6, POD_B6));
    assert_eq!(v, REDIRECT, "pod A as itself to pod B: into pod B");
    let ll: Ipv6Addr = "fe80::a:2".parse().unwrap();
    let all_routers: Ipv6Addr = "ff02::2".parse().unwrap();
    for (what, pkt) in [
        ("as itself", udp6_frame(POD_A6, ext6)),
        ("link-local", udp6_frame(ll, all_routers)),
        (
            "unspecified (DAD)",
            udp6_frame(Ipv6Addr::UNSPECIFIED, all_routers),
        ),
    ] {
        fx.assert_passes_unchanged("from_pod", &pkt, what);
    }
    // Pod B's own address is B's only: from B's veth it passes.
    let (v, _) = fx.run_on("from_pod", IFINDEX_B, &udp6_frame(POD_B6, POD_A6));
    assert_ne!(v, SHOT, "pod B as itself");
    assert_eq!(fx.reason(Reason::DropSpoofedSource), cases.len() as u64);

    // An IPv6 allow-list entry lets pod A send from that prefix, and nothing more.
    let ep = Endpoint {
        ips: vec![POD_A.into(), IpAddr::V6(POD_A6)],
        allowed_sources: vec!["2001:db8:77::/48".parse().unwrap()],
        ..endpoint_a()
    };
    fx.dp().put_endpoint_entries(&ep).unwrap();
    let routed = udp6_frame("2001:db8:77::9".parse().unwrap(), ext6);
    fx.assert_passes_unchanged("from_pod", &routed, "an allow-listed IPv6 source");
    let (v, _) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &udp6_frame("2001:db8:78::9".parse().unwrap(), ext6),
    );
    assert_eq!(v, SHOT, "outside the allow-listed prefix");

    // Removing the pod removes its IPv6 sources with it.
    let mut errors = Vec::new();
    fx.dp().remove_pod(
        "ctr-a",
        "eth0",
        "veth-ctr-a",
        &[POD_A.into(), IpAddr::V6(POD_A6)],
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &udp6_frame(POD_A6, POD_B6));
    assert_eq!(
        v, SHOT,
        "a removed pod's IPv6 address is no longer its source"
    );
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &routed);
    assert_eq!(v, SHOT, "a removed pod's IPv6 allow-list is gone");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn an_ipv6_only_pod_is_found_and_cleaned_by_its_ipv6_address() {
    let fx = Fixture::new();
    fx.standard_node(true);
    let ep = Endpoint {
        ips: vec![IpAddr::V6(POD_A6)],
        ..endpoint_a()
    };
    fx.dp().put_endpoint_entries(&ep).unwrap();
    fx.assert_passes_unchanged("from_pod", &udp6_frame(POD_A6, POD_B6), "as itself");
    let mut errors = Vec::new();
    fx.dp().remove_pod(
        "ctr-a",
        "eth0",
        "veth-ctr-a",
        &[IpAddr::V6(POD_A6)],
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let (v, _) = fx.run_on("from_pod", IFINDEX_A, &udp6_frame(POD_A6, POD_B6));
    assert_eq!(v, SHOT, "the IPv6-only pod's source entry went with it");
}
