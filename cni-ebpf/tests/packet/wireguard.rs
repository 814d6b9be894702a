//! Encryption between nodes (`cni-ebpf-bpf/src/wireguard.rs`): which packets the uplink's
//! egress and the tunnel device's egress hand to the WireGuard device, which they drop
//! for a node without a key, and which they leave alone.

use cni_ebpf::datapath::{tunnel::TunnelState, wireguard::WireguardState, NodeConfigSpec};
use cni_ebpf_common::{Reason, WireguardPeer, WIREGUARD_KEYED};
use testbed::packet::*;

use crate::frames6::NODE6;

/// The WireGuard device's ifindex and port the node configuration names.
const WG_IFINDEX: u32 = 9;
const WG_PORT: u16 = 51_872;
/// A pod of a third node, which the agent knows of as keyless.
const KEYLESS_POD: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 3, 5);
/// A cluster address no known node holds.
const UNKNOWN_POD: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 4, 5);
/// Node B's IPv6 pod.
const REMOTE_POD6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 5);

/// A node with encryption (`strict` as given), both families' cluster CIDRs, and
/// `WIREGUARD_PEERS` holding node B (10.244.2.0/24, fd00:10:244:2::/64) with a key and
/// a third node (10.244.3.0/24) without one.
fn encrypting(strict: bool, tunnel: bool) -> Fixture {
    let fx = Fixture::new();
    fx.configure_node(&NodeConfigSpec {
        node_addr6: Some(NODE6),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        wireguard: Some(WireguardState {
            ifindex: WG_IFINDEX,
            port: WG_PORT,
            strict,
        }),
        tunnel: tunnel.then_some(TunnelState {
            ifindex: 8,
            vni: 1,
            port: 8472,
            cross_subnet: false,
        }),
        ..standard_settings(false)
    });
    fx.standard_node_addrs();
    let keyed = WireguardPeer {
        flags: WIREGUARD_KEYED,
    };
    fx.dp()
        .set_wireguard_peers(&[
            ("10.244.2.0/24".parse().unwrap(), keyed),
            ("fd00:10:244:2::/64".parse().unwrap(), keyed),
            ("10.244.3.0/24".parse().unwrap(), WireguardPeer { flags: 0 }),
        ])
        .unwrap();
    fx
}

#[test]
fn a_pods_packet_for_a_keyed_node_goes_into_wireguard_in_both_families() {
    let fx = encrypting(true, false);
    let before = fx.reason(Reason::WireguardEncrypt);
    for f in [
        tcp_frame(POD_A, 40_000, REMOTE_POD, 80, SYN),
        udp_frame(POD_A, 40_000, REMOTE_POD, 53),
        udp6_frame(POD_A6, REMOTE_POD6),
    ] {
        assert_eq!(fx.run("uplink_egress", &f).0, REDIRECT);
    }
    assert_eq!(fx.reason(Reason::WireguardEncrypt), before + 3);
    assert_eq!(fx.dp().wireguard_peers().unwrap().len(), 3);
}

#[test]
fn without_a_key_strict_mode_drops_and_nothing_leaves_in_clear() {
    let fx = encrypting(true, false);
    let before = fx.reason(Reason::DropNoWireguardKey);
    for dst in [KEYLESS_POD, UNKNOWN_POD] {
        let f = tcp_frame(POD_A, 40_000, dst, 80, SYN);
        assert_eq!(fx.run("uplink_egress", &f).0, SHOT, "to {dst}");
    }
    assert_eq!(fx.reason(Reason::DropNoWireguardKey), before + 2);
    assert_eq!(fx.reason(Reason::WireguardEncrypt), 0);
}

#[test]
fn the_opt_out_reaches_a_keyless_node_in_clear_and_counts_it() {
    let fx = encrypting(false, false);
    let f = tcp_frame(POD_A, 40_000, KEYLESS_POD, 80, SYN);
    let (verdict, out) = fx.run("uplink_egress", &f);
    assert!(verdict != SHOT && verdict != REDIRECT, "{verdict}");
    assert_eq!(out, f, "left as it was");
    assert_eq!(fx.reason(Reason::WireguardClearToKeyless), 1);
    // A keyed node is still reached through WireGuard.
    let f = tcp_frame(POD_A, 40_000, REMOTE_POD, 80, SYN);
    assert_eq!(fx.run("uplink_egress", &f).0, REDIRECT);
}

#[test]
fn the_nodes_own_traffic_and_traffic_leaving_the_cluster_are_left_alone() {
    let fx = encrypting(true, false);
    for f in [
        // The node's own address to a pod of another node, and to another node.
        tcp_frame(NODE, 40_000, REMOTE_POD, 80, SYN),
        tcp_frame(NODE, 40_000, NODE2, 10_250, SYN),
        // A pod to the outside world (no masquerade on this node).
        tcp_frame(POD_A, 40_000, EXT, 443, SYN),
        // The node's WireGuard packets themselves.
        udp_frame(NODE, WG_PORT, NODE2, WG_PORT),
    ] {
        let verdict = fx.run("uplink_egress", &f).0;
        assert!(verdict != SHOT && verdict != REDIRECT, "{verdict}");
    }
    assert_eq!(fx.reason(Reason::WireguardEncrypt), 0);
    assert_eq!(fx.reason(Reason::DropNoWireguardKey), 0);
    // Arriving WireGuard packets pass the uplink's ingress untouched.
    let f = udp_frame(NODE2, WG_PORT, NODE, WG_PORT);
    let (verdict, out) = fx.run("uplink_ingress", &f);
    assert_eq!((verdict, out), (PASS, f));
}

#[test]
fn in_the_tunnel_modes_wireguard_carries_the_packet_in_place_of_vxlan() {
    let fx = encrypting(true, true);
    let f = tcp_frame(POD_A, 40_000, REMOTE_POD, 80, SYN);
    assert_eq!(fx.run("to_tunnel", &f).0, REDIRECT);
    assert_eq!(fx.reason(Reason::WireguardEncrypt), 1);
    assert_eq!(fx.reason(Reason::TunnelEncap), 0, "not encapsulated");
    let f = tcp_frame(POD_A, 40_000, KEYLESS_POD, 80, SYN);
    assert_eq!(fx.run("to_tunnel", &f).0, SHOT);
    assert_eq!(fx.reason(Reason::DropNoWireguardKey), 1);
}

#[test]
fn without_encryption_nothing_is_steered() {
    let fx = Fixture::new();
    fx.standard_node(false);
    fx.standard_node_addrs();
    fx.dp()
        .set_wireguard_peers(&[(
            "10.244.2.0/24".parse().unwrap(),
            WireguardPeer {
                flags: WIREGUARD_KEYED,
            },
        )])
        .unwrap();
    let f = tcp_frame(POD_A, 40_000, REMOTE_POD, 80, SYN);
    let verdict = fx.run("uplink_egress", &f).0;
    assert!(verdict != SHOT && verdict != REDIRECT, "{verdict}");
    assert_eq!(fx.reason(Reason::WireguardEncrypt), 0);
}
