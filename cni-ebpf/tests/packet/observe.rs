//! Flow events (`cni-ebpf-bpf/src/observe.rs`): each kind of event from the programs —
//! a flow's start at each pod it crosses, its end with the counters of both ways, a drop
//! with its reason and the rule set that refused it — in both families and for TCP, UDP
//! and ICMP; the rate limit and a full ring, which hold events back without touching a
//! packet's verdict.

use std::net::{IpAddr, Ipv4Addr};

use cni_ebpf::datapath::observe::{flow_addr, flow_port, FlowSettings};
use cni_ebpf_common::{
    FlowEvent, Reason, FLOW_DROPPED, FLOW_ENDED, FLOW_END_FIN, FLOW_END_RST, FLOW_EVENT_DROP,
    FLOW_EVENT_END, FLOW_EVENT_START, FLOW_IPV6, FLOW_OPENED_BY_POD, RULESET_OPEN,
};
use testbed::packet::*;

use crate::{
    frames6::{echo6, POD_B6},
    policy::{a_to_b, b_admits_a_on_80, b_to_a, dual_stack_pods, enforce},
};

/// TCP FIN and RST.
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

/// A node with pods A and B whose programs follow flows, `rate` events a second per
/// CPU.
fn following(rate: u32, burst: u32) -> Fixture {
    let fx = Fixture::with_two_pods();
    follow(&fx, true, rate, burst);
    fx
}

/// Turns following flows on or off on `fx`'s node (`rate` events a second per CPU, a
/// bucket `burst` deep).
fn follow(fx: &Fixture, on: bool, rate: u32, burst: u32) {
    fx.dp()
        .set_flow_config(&FlowSettings {
            enabled: on,
            events_per_sec: rate,
            burst,
            socket_services: false,
        })
        .unwrap();
}

/// The events waiting in the ring.
fn events(fx: &Fixture) -> Vec<FlowEvent> {
    fx.dp().flow_events().unwrap().drain()
}

/// The event of `kind` seen at pod interface `ifindex`.
fn one(evs: &[FlowEvent], kind: u8, ifindex: u32) -> FlowEvent {
    let found: Vec<_> = evs
        .iter()
        .filter(|e| e.kind == kind && e.key.ifindex == ifindex)
        .collect();
    assert_eq!(found.len(), 1, "one event {kind} at {ifindex} in {evs:#?}");
    *found[0]
}

fn ip(a: Ipv4Addr) -> IpAddr {
    a.into()
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_flow_starts_and_ends_at_each_pod_with_both_ways_counted() {
    let fx = following(1000, 1000);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    let evs = events(&fx);
    assert_eq!(evs.len(), 2, "{evs:#?}");
    // Pod a opened it; pod b received it: one start at each, as each sees it.
    let a = one(&evs, FLOW_EVENT_START, IFINDEX_A);
    assert_eq!(
        (flow_addr(&a.key.pod), flow_addr(&a.key.peer)),
        (ip(POD_A), ip(POD_B))
    );
    assert_eq!(
        (flow_port(a.key.pod_port), flow_port(a.key.peer_port)),
        (40000, 80)
    );
    assert_eq!(a.entry.flags & FLOW_OPENED_BY_POD, FLOW_OPENED_BY_POD);
    assert_eq!((a.entry.sent_packets, a.entry.received_packets), (1, 0));
    let b = one(&evs, FLOW_EVENT_START, IFINDEX_B);
    assert_eq!(
        (flow_addr(&b.key.pod), flow_addr(&b.key.peer)),
        (ip(POD_B), ip(POD_A))
    );
    assert_eq!(b.entry.flags & FLOW_OPENED_BY_POD, 0, "b did not open it");
    assert_eq!((b.entry.sent_packets, b.entry.received_packets), (0, 1));
    // The rest of the connection sends nothing until its end.
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert_eq!(
        fx.run("from_pod", &b_to_a(80, 40000, SYN | ACK)).0,
        REDIRECT
    );
    assert_eq!(fx.run("from_pod", &a_to_b(80, ACK)).0, REDIRECT);
    assert!(events(&fx).is_empty(), "no event per packet");
    // Each packet moves the time it was last seen (the kernel's last tick, at most a few
    // ms behind): what the idle timeout reads.
    let log = fx.dp().flow_log().unwrap();
    let (_, e) = log
        .iter()
        .find(|(k, _)| k.ifindex == IFINDEX_A && flow_port(k.peer_port) == 80)
        .expect("a's entry");
    assert!(
        e.last_ns >= e.started_ns + 40_000_000,
        "last seen {} ns after the start",
        e.last_ns.saturating_sub(e.started_ns)
    );
    assert_eq!(fx.run("from_pod", &a_to_b(80, FIN | ACK)).0, REDIRECT);
    let evs = events(&fx);
    let a = one(&evs, FLOW_EVENT_END, IFINDEX_A);
    assert_eq!(a.reason, FLOW_END_FIN);
    assert_eq!((a.entry.sent_packets, a.entry.received_packets), (3, 1));
    assert!(a.entry.sent_bytes > 3 * 54 && a.entry.received_bytes > 54);
    let b = one(&evs, FLOW_EVENT_END, IFINDEX_B);
    assert_eq!((b.entry.sent_packets, b.entry.received_packets), (1, 3));
    assert_eq!(b.entry.flags & FLOW_ENDED, FLOW_ENDED);
    assert!(b.time_ns >= b.entry.started_ns);
    // The close: b's FIN, then a's last ACK. The entries go with that ACK, at each pod,
    // and nothing more is reported.
    let followed = |fx: &Fixture| {
        fx.dp()
            .flow_log()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| flow_port(k.peer_port) == 80 || flow_port(k.pod_port) == 80)
            .count()
    };
    assert_eq!(followed(&fx), 2, "a's and b's entries");
    assert_eq!(
        fx.run("from_pod", &b_to_a(80, 40000, FIN | ACK)).0,
        REDIRECT
    );
    assert_eq!(followed(&fx), 2, "the last ACK is still to come");
    assert_eq!(fx.run("from_pod", &a_to_b(80, ACK)).0, REDIRECT);
    assert_eq!(followed(&fx), 0, "closed: both entries gone");
    // A FIN retransmitted after the close starts nothing.
    assert_eq!(
        fx.run("from_pod", &b_to_a(80, 40000, FIN | ACK)).0,
        REDIRECT
    );
    assert!(events(&fx).is_empty());
    assert_eq!(followed(&fx), 0);
    // A new connection on the same tuple is a new flow.
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    let evs = events(&fx);
    assert_eq!(one(&evs, FLOW_EVENT_START, IFINDEX_A).entry.sent_packets, 1);
    // A RST ends it and takes its entries at once.
    assert_eq!(fx.run("from_pod", &a_to_b(80, RST | ACK)).0, REDIRECT);
    let evs = events(&fx);
    assert_eq!(one(&evs, FLOW_EVENT_END, IFINDEX_A).reason, FLOW_END_RST);
    assert_eq!(followed(&fx), 0);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_syn_sent_again_is_counted_and_one_on_an_ended_tuple_starts_a_new_flow() {
    let fx = following(1000, 1000);
    let a_entry = |fx: &Fixture| {
        fx.dp()
            .flow_log()
            .unwrap()
            .into_iter()
            .find(|(k, _)| k.ifindex == IFINDEX_A && flow_port(k.peer_port) == 80)
            .map(|(_, e)| e)
    };
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    assert_eq!(events(&fx).len(), 2);
    // The SYN retransmitted: the flow's second packet at each pod, no second start.
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    assert!(events(&fx).is_empty(), "no start for a SYN sent again");
    let e = a_entry(&fx).expect("a's entry");
    assert_eq!((e.sent_packets, e.received_packets), (2, 0));
    // Ended by a's FIN, its entry kept until the close: a SYN on the tuple now opens a
    // new flow in its place, started afresh.
    assert_eq!(fx.run("from_pod", &a_to_b(80, FIN | ACK)).0, REDIRECT);
    let evs = events(&fx);
    assert_eq!(one(&evs, FLOW_EVENT_END, IFINDEX_A).entry.sent_packets, 3);
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    let evs = events(&fx);
    let a = one(&evs, FLOW_EVENT_START, IFINDEX_A);
    assert_eq!((a.entry.sent_packets, a.entry.flags & FLOW_ENDED), (1, 0));
    assert_eq!(
        one(&evs, FLOW_EVENT_START, IFINDEX_B)
            .entry
            .received_packets,
        1
    );
    let e = a_entry(&fx).expect("a's new entry");
    assert_eq!((e.sent_packets, e.flags & FLOW_ENDED), (1, 0));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_refused_flow_is_one_drop_event_naming_the_rule_set() {
    let fx = following(1000, 1000);
    enforce(&fx, &b_admits_a_on_80(), 1);
    for _ in 0..3 {
        assert_eq!(fx.run("from_pod", &a_to_b(81, SYN)).0, SHOT);
    }
    let evs = events(&fx);
    assert_eq!(evs.len(), 1, "the retries add to its counters: {evs:#?}");
    let d = one(&evs, FLOW_EVENT_DROP, IFINDEX_A);
    assert_eq!(d.reason, Reason::DropPolicyIngress as u32);
    assert_ne!(
        d.entry.ingress_ruleset, RULESET_OPEN,
        "b's ingress refused it"
    );
    assert_eq!(d.entry.flags & FLOW_DROPPED, FLOW_DROPPED);
    let log = fx.dp().flow_log().unwrap();
    let (_, e) = log
        .iter()
        .find(|(k, _)| k.ifindex == IFINDEX_A && flow_port(k.peer_port) == 81)
        .unwrap();
    assert_eq!(e.dropped_packets, 3);
    // The admitted flow names the rule set that admitted it.
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    let evs = events(&fx);
    let s = one(&evs, FLOW_EVENT_START, IFINDEX_B);
    assert_eq!(s.entry.ingress_ruleset, d.entry.ingress_ruleset);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn udp_icmp_and_ipv6_flows_are_followed() {
    let fx = following(1000, 1000);
    dual_stack_pods(&fx);
    // UDP to the outside (masquerade is the uplink's, after the pod's side is seen).
    let (v, _) = fx.run("from_pod", &udp_frame(POD_A, 5353, EXT, 53));
    assert_ne!(v, SHOT);
    // An ICMP echo: its flow is its identifier.
    let ping = frame(HOST_MAC_A, POD_MAC_A, POD_A, EXT, ICMP, &echo(8, 77, 1));
    assert_ne!(fx.run("from_pod", &ping).0, SHOT);
    // IPv6: UDP from a to b, and an echo.
    assert_ne!(fx.run("from_pod", &udp6_frame(POD_A6, POD_B6)).0, SHOT);
    assert_ne!(fx.run("from_pod", &echo6(POD_A6, POD_B6, 128, 99)).0, SHOT);
    let evs = events(&fx);
    let starts: Vec<_> = evs
        .iter()
        .filter(|e| e.kind == FLOW_EVENT_START && e.key.ifindex == IFINDEX_A)
        .map(|e| {
            (
                e.key.proto,
                flow_addr(&e.key.peer),
                flow_port(e.key.peer_port),
                e.entry.flags & FLOW_IPV6 != 0,
            )
        })
        .collect();
    assert!(starts.contains(&(UDP, ip(EXT), 53, false)), "{starts:?}");
    assert!(starts.contains(&(ICMP, ip(EXT), 77, false)), "{starts:?}");
    assert!(
        starts
            .iter()
            .any(|s| s.0 == UDP && s.1 == IpAddr::from(POD_B6) && s.3),
        "{starts:?}"
    );
    assert!(
        starts.contains(&(58, IpAddr::from(POD_B6), 99, true)),
        "{starts:?}"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_drop_of_another_kind_names_its_reason() {
    let fx = following(1000, 1000);
    // Pod A sending as pod B: the source check drops it.
    let spoofed = tcp_frame(POD_B, 40000, EXT, 443, SYN);
    assert_eq!(fx.run_on("from_pod", IFINDEX_A, &spoofed).0, SHOT);
    let evs = events(&fx);
    let d = one(&evs, FLOW_EVENT_DROP, IFINDEX_A);
    assert_eq!(d.reason, Reason::DropSpoofedSource as u32);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn the_rate_limit_holds_events_back_and_keeps_the_counters() {
    let fx = following(1, 3);
    for port in 0..10 {
        let f = tcp_frame(POD_A, 41000 + port, EXT, 443, SYN);
        assert_ne!(fx.run("from_pod", &f).0, SHOT);
    }
    let evs = events(&fx);
    assert_eq!(evs.len(), 3, "the burst: {evs:#?}");
    assert_eq!(fx.reason(Reason::FlowEventRateLimited), 7);
    let followed = fx
        .dp()
        .flow_log()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.ifindex == IFINDEX_A)
        .count();
    assert_eq!(followed, 10, "every flow is still followed");

    // The bucket fills again as time goes by (from the kernel's tick), up to its depth.
    let fx = following(100, 2);
    let mut port = 42000;
    let mut burst = |n: u16| {
        for _ in 0..n {
            let f = tcp_frame(POD_A, port, EXT, 443, SYN);
            port += 1;
            assert_ne!(fx.run("from_pod", &f).0, SHOT);
        }
        events(&fx).len()
    };
    assert_eq!(burst(4), 2, "the burst");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(burst(4), 2, "filled again, to the bucket's depth");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_full_ring_holds_events_back_and_no_verdict_changes() {
    let fx = following(1_000_000, 1_000_000);
    let ring_records =
        cni_ebpf_common::FLOW_EVENTS_BYTES as usize / (std::mem::size_of::<FlowEvent>() + 8);
    let flows = u16::try_from(ring_records + 500).unwrap();
    for i in 0..flows {
        let f = udp_frame(POD_A, 1024 + i, EXT, 53);
        assert_ne!(fx.run("from_pod", &f).0, SHOT);
    }
    let full = fx.reason(Reason::FlowEventRingFull);
    assert!(full >= 500, "{full} events found the ring full");
    let read = events(&fx).len();
    assert_eq!(read as u64 + full, u64::from(flows));
    // Read, the ring takes events again.
    let f = udp_frame(POD_A, 9, EXT, 53);
    assert_ne!(fx.run("from_pod", &f).0, SHOT);
    assert_eq!(events(&fx).len(), 1);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn with_flows_off_nothing_is_followed() {
    let fx = Fixture::with_two_pods();
    assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
    assert!(events(&fx).is_empty());
    assert!(fx.dp().flow_log().unwrap().is_empty());
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn following_a_flow_costs_little_per_packet() {
    // A packet of an open flow between two pods of the node: followed where pod A sends
    // it and where pod B receives it (two flow entries), measured with flows off and on
    // (`BPF_PROG_TEST_RUN`'s average of many runs). Printed (`--nocapture`) for
    // docs/observability.md and bounded loosely, so that a change making it an order of
    // magnitude dearer fails here.
    const REPEAT: u32 = 200_000;
    let fx = Fixture::with_two_pods();
    let pkt = a_to_b(80, ACK);
    let mut cost = Vec::new();
    for on in [false, true, false, true] {
        follow(&fx, on, 1000, 1000);
        assert_eq!(fx.run("from_pod", &a_to_b(80, SYN)).0, REDIRECT);
        assert_eq!(fx.run_on("from_pod", IFINDEX_A, &pkt).0, REDIRECT);
        let (_, ns) = fx.run_timed("from_pod", IFINDEX_A, &pkt, REPEAT);
        eprintln!(
            "from_pod, pod → pod, flows {}: {ns} ns per packet",
            if on { "on" } else { "off" }
        );
        cost.push(ns);
    }
    let (off, on) = (cost[0].min(cost[2]), cost[1].min(cost[3]));
    assert!(
        on < off + 1_000,
        "following a flow costs {} ns per packet ({on} against {off})",
        on.saturating_sub(off)
    );
    let evs = events(&fx);
    assert!(
        evs.iter().all(|e| e.kind == FLOW_EVENT_START),
        "nothing but the starts of its two sides: {evs:#?}"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_flows_whole_life_costs_little_per_packet() {
    // Short connections between two pods of the node, each a SYN (two new flows: where
    // pod A sends it, where pod B receives it), an ACK (both counted) and a RST (both
    // reported ended and removed), each packet run once (`BPF_PROG_TEST_RUN`) with flows
    // off and on, the averages of a few thousand connections on distinct ports: what a
    // flow's start, its packets and its end cost where the caches are not warmed by
    // repeating one packet. Printed (`--nocapture`) for docs/benchmarks.md and bounded
    // loosely, so that a change making one an order of magnitude dearer fails here.
    const CONNECTIONS: u16 = 3000;
    let fx = Fixture::with_two_pods();
    let mut cost = Vec::new();
    for on in [false, true, false, true] {
        follow(&fx, on, 1_000_000, 1_000_000);
        let mut ns = [0u64; 3];
        for i in 0..CONNECTIONS {
            let port = 10_000 + i;
            for (sum, flags) in ns.iter_mut().zip([SYN, ACK, RST | ACK]) {
                let pkt = tcp_frame(POD_A, port, POD_B, 80, flags);
                let (v, t) = fx.run_timed("from_pod", IFINDEX_A, &pkt, 1);
                assert_eq!(v, REDIRECT);
                *sum += u64::from(t);
            }
            if i % 500 == 0 {
                events(&fx);
            }
        }
        let [syn, ack, rst] = ns.map(|t| t / u64::from(CONNECTIONS));
        eprintln!(
            "from_pod, pod → pod, flows {}: SYN {syn} ns, ACK {ack} ns, RST {rst} ns",
            if on { "on" } else { "off" }
        );
        cost.push([syn, ack, rst]);
        assert!(fx.dp().flow_log().unwrap().is_empty(), "every flow removed");
    }
    for (i, what) in ["SYN", "ACK", "RST"].into_iter().enumerate() {
        let (off, on) = (cost[0][i].min(cost[2][i]), cost[1][i].min(cost[3][i]));
        assert!(
            on < off + 5_000,
            "following costs {} ns per {what} ({on} against {off})",
            on.saturating_sub(off)
        );
    }
}
