//! Issue 15, first slice (IPv4): a pod speaks only as itself. `from_pod` drops a packet
//! whose source is not one of the sending pod's addresses — whatever path it would take,
//! fragments and packets with IP options included — and counts it; a per-attachment
//! allow-list (`allowedSourceCIDRs`) is the only way to send from other sources.

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

mod packet_support;

use std::net::Ipv4Addr;

use cni_ebpf::datapath::Endpoint;
use cni_ebpf_common::Reason;
use packet_support::*;

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
