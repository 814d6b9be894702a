//! Packet tests (BPF_PROG_TEST_RUN) of host ports: DNAT on uplink ingress keeping the
//! client address, replies restored on uplink egress, hairpin (also to itself), hostIP,
//! conflicts, that removed mappings never lead an old flow to a new pod, and that a new
//! flow whose rewrite fails is dropped with no NAT or flow state left.
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use cni_ebpf::datapath::{load::Faults, Endpoint};
use cni_ebpf_common::Reason;
use testbed::packet::*;

use crate::frames6::*;

/// Pod A serves 8080/tcp → 80 and 5353/udp → 53.
fn with_mappings() -> Fixture {
    with_mappings_on(Fixture::new())
}

/// [`with_mappings`] on fixture `fx`.
fn with_mappings_on(fx: Fixture) -> Fixture {
    fx.standard_node(true);
    fx.two_pods();
    fx.add_ports(
        "ctr-a",
        POD_A,
        &[pm(8080, 80, "tcp", None), pm(5353, 53, "udp", None)],
    );
    fx
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn tcp_host_port_reaches_the_pod_with_the_client_address() {
    let fx = with_mappings();
    let (v, out) = fx.run("uplink_ingress", &tcp_frame(EXT, 45000, NODE, 8080, SYN));
    assert_eq!(v, REDIRECT, "DNAT must deliver straight into the pod");
    let p = parse_checked(&out);
    assert_eq!(
        (p.src, p.sport),
        (EXT, 45000),
        "client address and port preserved"
    );
    assert_eq!((p.dst, p.dport), (POD_A, 80));
    assert_eq!((p.dmac, p.smac, p.ttl), (POD_MAC_A, HOST_MAC_A, 63));
    assert_eq!(fx.reason(Reason::DnatNew), 1);

    // Later packets of the flow, then the reply leaving the node.
    let (v, out) = fx.run("uplink_ingress", &tcp_frame(EXT, 45000, NODE, 8080, ACK));
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).dport, 80);
    // The reply passes from_pod to the stack (the client is outside)...
    fx.assert_passes_unchanged(
        "from_pod",
        &tcp_frame(POD_A, 80, EXT, 45000, SYN | ACK),
        "host-port reply at the veth",
    );
    // ...and is restored to node:hostPort on the uplink.
    let (v, out) = fx.run(
        "uplink_egress",
        &tcp_frame(POD_A, 80, EXT, 45000, SYN | ACK),
    );
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 8080, EXT, 45000));
    assert_eq!(fx.reason(Reason::DnatReply), 1);
    assert_eq!(
        fx.reason(Reason::SnatNew),
        0,
        "a host-port reply is not a new masquerade flow"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn udp_host_port_round_trip() {
    let fx = with_mappings();
    let (v, out) = fx.run("uplink_ingress", &udp_frame(EXT, 40053, NODE2, 5353));
    assert_eq!(
        v, REDIRECT,
        "a wildcard mapping answers on every node address"
    );
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (EXT, 40053, POD_A, 53));
    let (v, out) = fx.run("uplink_egress", &udp_frame(POD_A, 53, EXT, 40053));
    assert_eq!(v, OK);
    let p = parse_checked(&out);
    assert_eq!(
        (p.src, p.sport),
        (NODE2, 5353),
        "the reply comes from the address asked"
    );
    // The wrong protocol is not mapped.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 1, NODE, 5353, SYN),
        "tcp to a udp host port",
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn host_ip_limits_the_mapping_to_that_address() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    fx.add_ports("ctr-b", POD_B, &[pm(9090, 90, "tcp", Some("198.18.0.3"))]);
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 1000, NODE, 9090, SYN),
        "other node address",
    );
    let (v, out) = fx.run("uplink_ingress", &tcp_frame(EXT, 1000, NODE2, 9090, SYN));
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).dst, POD_B);
    // Not a node address at all: never DNATed (traffic routed through the node).
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 1000, EXT, 9090, SYN),
        "foreign destination",
    );
}

/// Pod B's SYN to node:8080 (served by pod A in [`with_mappings`]), from port 50000.
fn b_to_node_8080(payload: &[u8]) -> Vec<u8> {
    frame(
        HOST_MAC_B,
        POD_MAC_B,
        POD_B,
        NODE,
        TCP,
        &tcp(POD_B, NODE, 50000, 8080, SYN, payload),
    )
}

/// Pod A's SYN-ACK to pod B's port 50000, as A sends it (from its own port 80).
fn a_answers_b() -> Vec<u8> {
    frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        POD_B,
        TCP,
        &tcp(POD_A, POD_B, 80, 50000, SYN | ACK, b""),
    )
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn hairpin_from_another_pod() {
    let fx = with_mappings();
    // Pod B → node:8080 (served by A).
    let (v, out) = fx.run("from_pod", &b_to_node_8080(b"hi"));
    assert_eq!(v, REDIRECT, "hairpin goes straight to the backend pod");
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (POD_B, 50000, POD_A, 80));
    assert_eq!((p.dmac, p.smac), (POD_MAC_A, HOST_MAC_A));
    // A's reply, entering A's host veth, goes back to B as node:8080.
    let (v, out) = fx.run("from_pod", &a_answers_b());
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 8080, POD_B, 50000));
    assert_eq!((p.dmac, p.smac), (POD_MAC_B, HOST_MAC_B));
    assert_eq!(fx.reason(Reason::HairpinNew), 1);
    assert_eq!(fx.reason(Reason::HairpinForward), 1);

    // Through the gateway address too.
    let (v, out) = fx.run(
        "from_pod",
        &frame(
            HOST_MAC_B,
            POD_MAC_B,
            POD_B,
            GATEWAY,
            UDP,
            &udp(POD_B, GATEWAY, 50001, 5353, b"q", true),
        ),
    );
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).dst, POD_A);
}

/// Only a pod with host ports serves hairpin flows, so only its packets to a local pod
/// are looked up as hairpin replies. A pod whose entry says it has none (as ADD writes a
/// pod without `portMappings`) skips that lookup: its packets go as sent. CHECK finds an
/// entry that says so for a pod with host ports.
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn only_pods_with_host_ports_have_their_packets_looked_up_as_hairpin_replies() {
    let fx = with_mappings();
    // B → node:8080 (served by A) opens a hairpin flow.
    assert_eq!(fx.run("from_pod", &b_to_node_8080(b"")).0, REDIRECT);
    let reply = a_answers_b();
    let (v, out) = fx.run("from_pod", &reply);
    assert_eq!(v, REDIRECT);
    assert_eq!(
        parse_checked(&out).src,
        NODE,
        "A has host ports: its reply is the hairpin flow's"
    );
    assert_eq!(fx.reason(Reason::HairpinForward), 1);

    // A's entry as if A had no host ports: the same reply is not looked up.
    let mut a = endpoint_a();
    a.host_ports = false;
    fx.dp().put_endpoint_entries(&a).unwrap();
    let (v, out) = fx.run("from_pod", &reply);
    assert_eq!(v, REDIRECT, "still straight into B");
    let p = parse_checked(&out);
    assert_eq!(
        (p.src, p.sport, p.dst, p.dport),
        (POD_A, 80, POD_B, 50000),
        "not looked up: delivered as sent"
    );
    assert_eq!((p.dmac, p.smac), (POD_MAC_B, HOST_MAC_B));
    assert_eq!(fx.reason(Reason::HairpinForward), 1);
    assert_eq!(fx.reason(Reason::RedirectPod), 1);

    // CHECK of A, which has host ports, finds the entry wrong.
    let err = fx
        .dp()
        .check_endpoint(&endpoint_a(), &[pm(8080, 80, "tcp", None)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no host ports"), "{err}");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn hairpin_to_itself() {
    let fx = with_mappings();
    // Pod A → node:8080, served by A itself.
    let syn = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        NODE,
        TCP,
        &tcp(POD_A, NODE, 50000, 8080, SYN, b""),
    );
    let (v, out) = fx.run("from_pod", &syn);
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!((p.dst, p.dport), (POD_A, 80));
    assert_eq!(
        p.src, NODE,
        "the pod must not see its own address as source"
    );
    assert!((SNAT_PORTS.0..=SNAT_PORTS.1).contains(&p.sport));
    let np = p.sport;
    // A (as server) replies to node:np; it returns to A (as client) from node:8080.
    let reply = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        NODE,
        TCP,
        &tcp(POD_A, NODE, 80, np, SYN | ACK, b""),
    );
    let (v, out) = fx.run("from_pod", &reply);
    assert_eq!(v, REDIRECT);
    let p = parse_checked(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 8080, POD_A, 50000));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn taken_host_port_names_the_owner() {
    let fx = with_mappings();
    let err = fx
        .dp()
        .add_port_mappings(
            ("ctr-b", "eth0"),
            &[POD_B.into()],
            &[pm(8080, 8080, "tcp", None)],
        )
        .expect_err("8080/tcp is taken by ctr-a");
    assert!(
        err.to_string().contains("ctr-a"),
        "error must name the owner: {err}"
    );
    // A specific hostIP collides with the wildcard as well.
    let err = fx
        .dp()
        .add_port_mappings(
            ("ctr-b", "eth0"),
            &[POD_B.into()],
            &[pm(8080, 80, "tcp", Some("198.18.0.2"))],
        )
        .expect_err("wildcard 8080/tcp is taken");
    assert!(err.to_string().contains("ctr-a"), "{err}");
    // Same port, other protocol: fine. A failed call left nothing behind.
    fx.add_ports("ctr-b", POD_B, &[pm(8080, 80, "udp", None)]);
    let all = fx.dp().port_mappings().unwrap();
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all
        .iter()
        .any(|m| m.container_id == "ctr-b" && m.protocol == "udp"));
    // The owner re-adding its own mapping is idempotent.
    fx.add_ports("ctr-a", POD_A, &[pm(8080, 80, "tcp", None)]);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn removed_mapping_never_leads_an_old_flow_to_a_new_pod() {
    let fx = with_mappings();
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 45000, NODE, 8080, SYN));
    assert_eq!(v, REDIRECT);
    // The pod goes away.
    fx.dp().remove_port_mappings(("ctr-a", "eth0")).unwrap();
    fx.dp()
        .detach_endpoint("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()])
        .unwrap();
    assert!(fx.dp().port_mappings().unwrap().is_empty());
    assert!(
        fx.dp().nat_entries().unwrap().is_empty(),
        "flows of the pod are gone"
    );
    // A new pod (B) takes the host port.
    fx.add_ports("ctr-b", POD_B, &[pm(8080, 80, "tcp", None)]);
    // The old client's next segment is not a new connection: never sent to B.
    fx.assert_passes_unchanged(
        "uplink_ingress",
        &tcp_frame(EXT, 45000, NODE, 8080, ACK),
        "old flow after DEL",
    );
    assert_eq!(fx.reason(Reason::PassStaleHostPortFlow), 1);
    // A new connection is.
    let (v, out) = fx.run("uplink_ingress", &tcp_frame(EXT, 45001, NODE, 8080, SYN));
    assert_eq!(v, REDIRECT);
    assert_eq!(parse_checked(&out).dst, POD_B);
    // Removing is idempotent.
    fx.dp().remove_port_mappings(("ctr-a", "eth0")).unwrap();
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn snat_never_picks_a_host_port() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.two_pods();
    // Map every other port of the SNAT range as a host port: each random try hits a host
    // port half the time, so avoiding them is exercised on almost every flow, while a
    // flow fails to find a port only with probability 2^-16 (16 tries).
    let maps: Vec<_> = (SNAT_PORTS.0..=SNAT_PORTS.1)
        .step_by(2)
        .map(|p| pm(p, 80, "tcp", None))
        .collect();
    fx.add_ports("ctr-b", POD_B, &maps);
    let mut got = 0;
    for sport in 1000..1040 {
        let (v, out) = fx.run("uplink_egress", &tcp_frame(POD_A, sport, EXT, 80, SYN));
        if v == OK {
            let p = parse_checked(&out);
            assert!(
                (p.sport - SNAT_PORTS.0) % 2 == 1,
                "SNAT port {} is a host port",
                p.sport
            );
            got += 1;
        } else {
            assert_eq!(v, SHOT, "no port found: counted drop");
        }
    }
    assert!(
        got >= 38,
        "only {got} of 40 flows found one of the free ports"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_new_host_port_flow_whose_rewrite_fails_is_dropped_and_leaves_no_state() {
    // Every L4 checksum update fails (after the tuple was written), as a failing helper
    // would; no real packet does that here (`parse` keeps the checksum field inside it).
    let fx = with_mappings_on(Fixture::with_faults(Faults { l4_csum: true }));

    // From outside (DNAT), TCP and UDP.
    let tcp_in = tcp_frame(EXT, 12345, NODE, 8080, SYN);
    let udp_in = udp_frame(EXT, 12346, NODE, 5353);
    // Hairpin from pod B, and from pod A to its own host port (SNAT to the node).
    let from_b = frame(
        HOST_MAC_B,
        POD_MAC_B,
        POD_B,
        NODE,
        TCP,
        &tcp(POD_B, NODE, 50000, 8080, SYN, b""),
    );
    let from_a = frame(
        HOST_MAC_A,
        POD_MAC_A,
        POD_A,
        NODE,
        TCP,
        &tcp(POD_A, NODE, 50001, 8080, SYN, b""),
    );
    for (i, (prog, pkt)) in [
        ("uplink_ingress", &tcp_in),
        ("uplink_ingress", &udp_in),
        ("from_pod", &from_b),
        ("from_pod", &from_a),
    ]
    .into_iter()
    .enumerate()
    {
        let (v, _) = fx.run(prog, pkt);
        fx.assert_rewrite_failed(i, prog, v, pkt);
    }
    // Nor is the DNAT flow recorded as one the pod's replies may bypass the stack for.
    for (sport, proto, cport) in [(12345u16, TCP, 80u16), (12346, UDP, 53)] {
        let reply = cni_ebpf_common::NatKey {
            saddr: u32::from_ne_bytes(POD_A.octets()),
            daddr: u32::from_ne_bytes(EXT.octets()),
            sport: cport.to_be(),
            dport: sport.to_be(),
            proto,
            _pad: [0; 3],
        };
        assert_eq!(fx.flow(&reply), None, "flow record left for {reply:?}");
    }
    assert_eq!(fx.reason(Reason::DnatNew), 0);
    assert_eq!(fx.reason(Reason::HairpinNew), 0);
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
