//! One pod cannot starve the others of NAT state. Every translated flow is
//! charged to its pod's share (`natFlowsPerPod`); a pod at its cap gets its own new flows
//! refused (`drop_nat_pod_cap`) while other pods' existing and new flows are untouched;
//! nothing is ever evicted; finished flows are swept out when a pod at its cap asks for
//! room, and give its share back.

use std::time::Duration;

use cni_ebpf::datapath::Endpoint;
use cni_ebpf_common::{NatDestKey, NatUse, Reason};
use testbed::packet::*;

const FIN: u8 = 0x01;
const RST: u8 = 0x04;
/// A second outside address.
const EXT2: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 18, 0, 101);

/// Pods A (capped at `cap` flows) and B (default share), masquerade on.
fn node_with_cap(cap: u32) -> Fixture {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            nat_flows: cap,
            ..endpoint_a()
        })
        .unwrap();
    fx.dp().put_endpoint_entries(&endpoint_b()).unwrap();
    fx
}

/// Pod `ifindex`'s share as the programs keep it.
fn share(fx: &Fixture, ifindex: u32) -> NatUse {
    let map = fx.map("NAT_USE");
    let m: aya::maps::HashMap<_, u32, NatUse> = aya::maps::HashMap::try_from(&map).unwrap();
    m.get(&ifindex, 0).unwrap()
}

/// Makes every NAT entry, and the last sweep, look `by` older (as if no packet had been
/// seen for that long).
fn age_nat(fx: &Fixture, by: Duration) {
    let mut map = fx.map("NAT_USE");
    let mut shares: aya::maps::HashMap<_, u32, NatUse> =
        aya::maps::HashMap::try_from(&mut map).unwrap();
    if let Ok(mut clock) = shares.get(&0, 0) {
        clock.swept_ns = clock.swept_ns.saturating_sub(by.as_nanos() as u64).max(1);
        shares.insert(0, clock, 0).unwrap();
    }
    use cni_ebpf_common::{NatEntry, NatKey};
    let mut map = fx.map("NAT");
    let mut nat: aya::maps::HashMap<_, NatKey, NatEntry> =
        aya::maps::HashMap::try_from(&mut map).unwrap();
    let all: Vec<(NatKey, NatEntry)> = nat.iter().map(Result::unwrap).collect();
    for (k, mut v) in all {
        v.last_seen_ns = v.last_seen_ns.saturating_sub(by.as_nanos() as u64);
        nat.insert(k, v, 0).unwrap();
    }
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_at_its_cap_is_refused_and_the_other_pods_are_not() {
    let fx = node_with_cap(3);
    // Pod B's long-lived connection to EXT:443, opened first.
    let b_conn = tcp_frame(POD_B, 50000, EXT, 443, SYN);
    assert_eq!(fx.egress(&b_conn).0, OK);

    // Pod A opens flows to EXT:53 until its share is full: 3 flows, 6 entries.
    for i in 0..3 {
        let (v, _) = fx.egress(&udp_frame(POD_A, 1000 + i, EXT, 53));
        assert_eq!(v, OK, "pod A's flow {i} within its cap");
    }
    assert_eq!(share(&fx, IFINDEX_A).entries, 6);
    for i in 3..10 {
        let (v, _) = fx.egress(&udp_frame(POD_A, 1000 + i, EXT, 53));
        assert_eq!(v, SHOT, "pod A's flow {i} beyond its cap is refused");
    }
    assert_eq!(fx.reason(Reason::DropNatPodCap), 7);
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        6,
        "refused flows charge nothing"
    );

    // Pod A's existing flows keep working, and so do pod B's, old and new, to the same
    // destination.
    let (v, out) = fx.egress(&udp_frame(POD_A, 1000, EXT, 53));
    assert_eq!(v, OK, "pod A's existing flow");
    assert_eq!(parse_checked(&out).src, NODE);
    let (v, out) = fx.egress(&tcp_frame(POD_B, 50000, EXT, 443, ACK));
    assert_eq!(v, OK, "pod B's long-lived connection");
    let b_port = parse_checked(&out).sport;
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 443, NODE, b_port, ACK));
    assert_eq!(v, REDIRECT, "the reply of pod B's connection reaches pod B");
    for i in 0..5 {
        let (v, _) = fx.egress(&udp_frame(POD_B, 2000 + i, EXT, 53));
        assert_eq!(v, OK, "pod B's new flow {i} to the same destination");
    }
    assert_eq!(share(&fx, IFINDEX_B).entries, 12);
    assert_eq!(fx.reason(Reason::DropNatPodCap), 7);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn finished_flows_are_swept_and_give_the_share_back() {
    let fx = node_with_cap(2);
    for i in 0..2 {
        assert_eq!(fx.egress(&udp_frame(POD_A, 1000 + i, EXT, 53)).0, OK);
    }
    // Pod B's TCP connection: open, so not over after the same idle time as a UDP flow.
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50000, EXT, 443, SYN)).0, OK);
    assert_eq!(fx.egress(&udp_frame(POD_A, 1002, EXT, 53)).0, SHOT);
    let sweeps = fx.reason(Reason::NatSweep);

    // 61 s later pod A's UDP flows are over (60 s idle); its next flow sweeps them out.
    age_nat(&fx, Duration::from_secs(61));
    let (v, _) = fx.egress(&udp_frame(POD_A, 1003, EXT, 53));
    assert_eq!(v, OK, "a pod whose flows are over gets a new one");
    assert!(fx.reason(Reason::NatSweep) > sweeps, "no sweep ran");
    assert_eq!(
        fx.reason(Reason::NatSweptEntry),
        4,
        "pod A's two old flows were swept"
    );
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        2,
        "only the new flow is charged"
    );
    // Pod B's open TCP connection was not taken.
    assert_eq!(share(&fx, IFINDEX_B).entries, 2);
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50000, EXT, 443, ACK)).0, OK);

    // Sweeps are rate-limited: at its cap again, pod A is refused without a new sweep.
    assert_eq!(fx.egress(&udp_frame(POD_A, 1004, EXT, 53)).0, OK);
    let sweeps = fx.reason(Reason::NatSweep);
    assert_eq!(fx.egress(&udp_frame(POD_A, 1005, EXT, 53)).0, SHOT);
    assert_eq!(
        fx.reason(Reason::NatSweep),
        sweeps,
        "a second sweep within a second"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn removing_a_pod_gives_its_peers_share_back() {
    // Pod A's flows are charged to A; removing pod A removes them and its share.
    let fx = node_with_cap(4);
    assert_eq!(fx.egress(&udp_frame(POD_A, 1000, EXT, 53)).0, OK);
    assert_eq!(share(&fx, IFINDEX_A).entries, 2);
    let mut errors = Vec::new();
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let map = fx.map("NAT_USE");
    let m: aya::maps::HashMap<_, u32, NatUse> = aya::maps::HashMap::try_from(&map).unwrap();
    assert!(m.get(&IFINDEX_A, 0).is_err(), "pod A's share outlived it");
    // A new pod on the same host veth index starts from an empty share.
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            nat_flows: 1,
            ..endpoint_a()
        })
        .unwrap();
    assert_eq!(share(&fx, IFINDEX_A).entries, 0);
    assert_eq!(share(&fx, IFINDEX_A).cap, 2);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_closed_connection_stops_counting_at_once_and_a_reopened_one_counts_again() {
    // The cap is on live flows: a pod opening and closing connections quickly is limited
    // by how many it holds open, not by how many wait out their grace time.
    let fx = node_with_cap(1);
    let (v, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN));
    assert_eq!(v, OK);
    let port = parse_checked(&out).sport;
    assert_eq!(share(&fx, IFINDEX_A).entries, 2);
    assert_eq!(
        fx.egress(&udp_frame(POD_A, 1000, EXT, 53)).0,
        SHOT,
        "at its cap"
    );
    // FIN from the pod: half closed, still live.
    assert_eq!(
        fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, FIN | ACK)).0,
        OK
    );
    assert_eq!(share(&fx, IFINDEX_A).entries, 2, "half closed counts");
    // FIN from the outside: closed, both entries given back (they stay for the port).
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 80, NODE, port, FIN | ACK));
    assert_eq!(v, REDIRECT);
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        0,
        "a closed flow counts no more"
    );
    assert_eq!(
        fx.egress(&udp_frame(POD_A, 1001, EXT, 53)).0,
        OK,
        "room again"
    );
    // The UDP flow (live) keeps counting.
    assert_eq!(share(&fx, IFINDEX_A).entries, 2);
    // The closed tuple opening again counts again.
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN)).0, OK);
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        4,
        "the reopened flow is live again"
    );
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn host_port_and_hairpin_flows_are_charged_to_their_pods() {
    // Pod A (cap 2) is behind host port 8080; outside clients' flows to it are charged to
    // pod A, and a flood of them uses up pod A's share only.
    let fx = node_with_cap(2);
    fx.add_ports("ctr-a", POD_A, &[pm(8080, 80, "tcp", None)]);
    for i in 0..2 {
        let (v, _) = fx.run(
            "uplink_ingress",
            &tcp_frame(EXT, 45000 + i, NODE, 8080, SYN),
        );
        assert_eq!(v, REDIRECT, "client flow {i} to pod A's host port");
    }
    assert_eq!(share(&fx, IFINDEX_A).entries, 4);
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 45002, NODE, 8080, SYN));
    assert_eq!(
        v, SHOT,
        "pod A's share is full: the third client is refused"
    );
    assert_eq!(fx.reason(Reason::DropNatPodCap), 1);
    // Pod B is untouched: its own masqueraded flows work...
    assert_eq!(fx.egress(&udp_frame(POD_B, 2000, EXT, 53)).0, OK);
    // ...and so does its hairpin flow to pod A's host port, charged to pod B (the client).
    let (v, _) = fx.run_on(
        "from_pod",
        IFINDEX_B,
        &tcp_frame(POD_B, 46000, NODE, 8080, SYN),
    );
    assert_eq!(v, REDIRECT, "pod B → node:8080 → pod A");
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        4,
        "pod B's hairpin is not pod A's"
    );
    assert_eq!(share(&fx, IFINDEX_B).entries, 4);
    // Pod A's own hairpin flow is charged to pod A, which is full: refused.
    let (v, _) = fx.run_on(
        "from_pod",
        IFINDEX_A,
        &tcp_frame(POD_A, 46001, NODE, 8080, SYN),
    );
    assert_eq!(v, SHOT, "pod A's hairpin beyond its cap");
    assert_eq!(fx.reason(Reason::DropNatPodCap), 2);
}

/// Pods A and B with their default shares, and at most `cap` SNAT ports per pod and
/// destination.
fn node_with_dest_cap(cap: u32) -> Fixture {
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        snat_dest_cap: cap,
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    fx.two_pods();
    fx
}

/// The SNAT ports pod `ifindex` holds towards `daddr:dport` (TCP) as the programs count
/// them (`None`: no key, i.e. none).
fn ports_held(fx: &Fixture, ifindex: u32, daddr: std::net::Ipv4Addr, dport: u16) -> Option<u32> {
    let map = fx.map("NAT_DEST_USE");
    let m: aya::maps::HashMap<_, NatDestKey, u32> = aya::maps::HashMap::try_from(&map).unwrap();
    let key = NatDestKey {
        pod: ifindex,
        daddr: u32::from_ne_bytes(daddr.octets()),
        dport: dport.to_be(),
        proto: 6,
        _pad: 0,
    };
    m.get(&key, 0).ok()
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_at_its_port_cap_towards_a_destination_is_refused_there_and_nowhere_else() {
    let fx = node_with_dest_cap(3);
    // Pod B's long-lived connection to EXT:443, opened first.
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50000, EXT, 443, SYN)).0, OK);

    // Pod A takes its three ports towards EXT:443; the fourth flow there is refused.
    for i in 0..3 {
        let (v, _) = fx.egress(&tcp_frame(POD_A, 40000 + i, EXT, 443, SYN));
        assert_eq!(v, OK, "pod A's flow {i} to EXT:443 within the cap");
    }
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 443), Some(3));
    for i in 3..6 {
        let (v, _) = fx.egress(&tcp_frame(POD_A, 40000 + i, EXT, 443, SYN));
        assert_eq!(v, SHOT, "pod A's flow {i} to EXT:443 beyond the cap");
    }
    assert_eq!(fx.reason(Reason::DropSnatDestCap), 3);
    assert_eq!(fx.reason(Reason::DropNatPodCap), 0, "not the flow cap");
    assert_eq!(
        share(&fx, IFINDEX_A).entries,
        6,
        "refused flows charge nothing"
    );
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 443), Some(3));

    // Other destinations (another port, another address) are other shares.
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40010, EXT, 444, SYN)).0, OK);
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40011, EXT2, 443, SYN)).0, OK);
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 444), Some(1));

    // Pod A's existing flows keep their ports; pod B's connection and new flows to the
    // same destination are untouched.
    let (v, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 443, ACK));
    assert_eq!(v, OK, "pod A's existing flow");
    assert_eq!(parse_checked(&out).src, NODE);
    let (v, out) = fx.egress(&tcp_frame(POD_B, 50000, EXT, 443, ACK));
    assert_eq!(v, OK, "pod B's long-lived connection");
    let b_port = parse_checked(&out).sport;
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 443, NODE, b_port, ACK));
    assert_eq!(v, REDIRECT, "the reply of pod B's connection reaches pod B");
    for i in 0..2 {
        let (v, _) = fx.egress(&tcp_frame(POD_B, 51000 + i, EXT, 443, SYN));
        assert_eq!(v, OK, "pod B's new flow {i} to EXT:443");
    }
    assert_eq!(ports_held(&fx, IFINDEX_B, EXT, 443), Some(3));
    assert_eq!(fx.reason(Reason::DropSnatDestCap), 3);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_closed_flows_port_counts_until_it_is_free_again() {
    // Unlike the flow cap (live flows), the cap per destination is on ports held: a
    // closed flow's port is not free for its grace time (the peer's TIME_WAIT when the
    // peer closed first), so a pod whose peers close first cannot take every port
    // towards them by opening and closing connections.
    let fx = node_with_dest_cap(1);
    let (v, out) = fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN));
    assert_eq!(v, OK);
    let port = parse_checked(&out).sport;
    // The peer closes first, then the pod: closed, uncharged from the flow share...
    let (v, _) = fx.run("uplink_ingress", &tcp_frame(EXT, 80, NODE, port, FIN | ACK));
    assert_eq!(v, REDIRECT);
    assert_eq!(
        fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, FIN | ACK)).0,
        OK
    );
    assert_eq!(share(&fx, IFINDEX_A).entries, 0);
    // ...but its port is held: a new flow to EXT:80 is refused.
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 80), Some(1));
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40001, EXT, 80, SYN)).0, SHOT);
    assert_eq!(fx.reason(Reason::DropSnatDestCap), 1);

    // Past the peer's TIME_WAIT (60 s) the flow is over: the pod's next flow sweeps it
    // out, and the port counts no more.
    age_nat(&fx, Duration::from_secs(61));
    let (v, _) = fx.egress(&tcp_frame(POD_A, 40002, EXT, 80, SYN));
    assert_eq!(v, OK, "the port is free again");
    assert_eq!(fx.reason(Reason::NatSweptEntry), 2);
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 80), Some(1));
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn ports_given_back_leave_no_count_behind() {
    let fx = node_with_dest_cap(1);
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40000, EXT, 80, SYN)).0, OK);
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50000, EXT, 80, SYN)).0, OK);
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50001, EXT, 81, SYN)).0, OK);
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 80), Some(1));

    // Removing pod A (DEL, GC) gives its ports back: its counts go with it.
    let mut errors = Vec::new();
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        ports_held(&fx, IFINDEX_A, EXT, 80),
        None,
        "pod A's count outlived it"
    );
    assert_eq!(
        ports_held(&fx, IFINDEX_B, EXT, 80),
        Some(1),
        "pod B's is its own"
    );

    // Pod B resets both its connections; past their grace a new flow to EXT:80, at
    // the cap, sweeps them out: the count for EXT:81 reaches zero and its key goes.
    for (sport, dport) in [(50000, 80), (50001, 81)] {
        assert_eq!(
            fx.egress(&tcp_frame(POD_B, sport, EXT, dport, RST | ACK)).0,
            OK
        );
    }
    age_nat(&fx, Duration::from_secs(2));
    assert_eq!(fx.egress(&tcp_frame(POD_B, 50002, EXT, 80, SYN)).0, OK);
    assert_eq!(fx.reason(Reason::NatSweptEntry), 4);
    assert_eq!(ports_held(&fx, IFINDEX_B, EXT, 80), Some(1));
    assert_eq!(ports_held(&fx, IFINDEX_B, EXT, 81), None);
    let map = fx.map("NAT_DEST_USE");
    let m: aya::maps::HashMap<_, NatDestKey, u32> = aya::maps::HashMap::try_from(&map).unwrap();
    assert_eq!(m.keys().count(), 1, "one key: pod B → EXT:80");
}

/// Marks the sweep as just run, so that none runs for a second.
fn sweep_just_ran(fx: &Fixture) {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    let now_ns = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
    let mut map = fx.map("NAT_USE");
    let mut shares: aya::maps::HashMap<_, u32, NatUse> =
        aya::maps::HashMap::try_from(&mut map).unwrap();
    let clock = NatUse {
        entries: shares.get(&0, 0).map_or(1, |c| c.entries),
        swept_ns: now_ns,
        ..NatUse::default()
    };
    shares.insert(0, clock, 0).unwrap();
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_pod_at_its_port_cap_takes_back_its_own_finished_ports() {
    // 8 SNAT ports, at most 4 per pod and destination.
    let fx = Fixture::new();
    fx.configure_node(&cni_ebpf::datapath::NodeConfigSpec {
        snat_ports: (65528, 65535),
        snat_dest_cap: 4,
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    fx.two_pods();
    for i in 0..4 {
        assert_eq!(fx.egress(&tcp_frame(POD_A, 40000 + i, EXT, 80, SYN)).0, OK);
    }
    // All four live: at the cap, refused although four ports are free.
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40010, EXT, 80, SYN)).0, SHOT);
    assert_eq!(fx.reason(Reason::DropSnatDestCap), 1);
    // Pod A resets them; past their grace they are over, but no sweep may run (one just
    // did): the pod's next flow takes back one of its own ports instead of a free one.
    for i in 0..4 {
        assert_eq!(
            fx.egress(&tcp_frame(POD_A, 40000 + i, EXT, 80, RST | ACK))
                .0,
            OK
        );
    }
    age_nat(&fx, Duration::from_secs(2));
    sweep_just_ran(&fx);
    let sweeps = fx.reason(Reason::NatSweep);
    let reclaimed = fx.reason(Reason::SnatPortReclaimed);
    for i in 0..4 {
        let (v, _) = fx.egress(&tcp_frame(POD_A, 40020 + i, EXT, 80, SYN));
        assert_eq!(
            v, OK,
            "pod A's new flow {i} at its cap, on a port of its own"
        );
    }
    assert_eq!(fx.reason(Reason::NatSweep), sweeps, "no sweep ran");
    assert_eq!(fx.reason(Reason::SnatPortReclaimed), reclaimed + 4);
    assert_eq!(ports_held(&fx, IFINDEX_A, EXT, 80), Some(4));
    assert_eq!(fx.reason(Reason::DropSnatDestCap), 1);
    // Now all live again: refused; the free ports stay for pod B.
    assert_eq!(fx.egress(&tcp_frame(POD_A, 40030, EXT, 80, SYN)).0, SHOT);
    for i in 0..4 {
        assert_eq!(fx.egress(&tcp_frame(POD_B, 50000 + i, EXT, 80, SYN)).0, OK);
    }
}
