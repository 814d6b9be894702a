//! What the source check and the NAT shares cost, measured in the kernel with
//! `BPF_PROG_TEST_RUN`'s repeat count (its `duration` is the average per run). Printed
//! (run with `--nocapture` to see them) and bounded loosely, so that a change making the
//! check or a sweep an order of magnitude dearer fails here. The figures in
//! docs/datapath.md ("What the checks cost") come from this test.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_ebpf::datapath::Endpoint;
use cni_ebpf_common::{NatEntry, NatKey, Reason, MAX_NAT, NAT_SWEEP_BUDGET};
use testbed::packet::*;

const REPEAT: u32 = 200_000;

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn the_source_check_costs_little_per_packet() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_A.into(), IpAddr::V6(POD_A6)],
            allowed_sources: vec!["192.0.2.0/24".parse().unwrap()],
            ..endpoint_a()
        })
        .unwrap();
    fx.dp().put_endpoint_entries(&endpoint_b()).unwrap();
    let ext6: Ipv6Addr = "2001:db8::100".parse().unwrap();
    let cases = [
        (
            "pod → pod, own IPv4 source",
            tcp_frame(POD_A, 4000, POD_B, 80, ACK),
            REDIRECT,
        ),
        (
            "pod → ext, own IPv4 source (kernel path)",
            udp_frame(POD_A, 4000, EXT, 53),
            PASS,
        ),
        (
            "pod → ext, allow-listed IPv4 source",
            udp_frame(Ipv4Addr::new(192, 0, 2, 9), 4000, EXT, 53),
            PASS,
        ),
        ("spoofed IPv4 source", udp_frame(POD_B, 4000, EXT, 53), SHOT),
        ("own IPv6 source", udp6_frame(POD_A6, ext6), PASS),
        (
            "link-local IPv6 source",
            udp6_frame("fe80::1".parse().unwrap(), ext6),
            PASS,
        ),
        (
            "spoofed IPv6 source",
            udp6_frame("fd00:10:244:1::3".parse().unwrap(), ext6),
            SHOT,
        ),
    ];
    for (what, pkt, want) in &cases {
        let (v, _) = fx.run_on("from_pod", IFINDEX_A, pkt);
        assert_eq!(v, *want, "{what}");
        let (_, ns) = fx.run_timed("from_pod", IFINDEX_A, pkt, REPEAT);
        eprintln!("from_pod, {what}: {ns} ns per packet");
        assert!(ns < 5_000, "from_pod, {what}: {ns} ns per packet");
    }
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_sweep_of_a_full_nat_table_takes_milliseconds_at_most() {
    let fx = Fixture::new();
    fx.standard_node(true);
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            nat_flows: 1,
            ..endpoint_a()
        })
        .unwrap();
    fx.dp().put_endpoint_entries(&endpoint_b()).unwrap();
    // Fill the table with open TCP flows (pairs of entries pointing at each other) last
    // seen 10 s ago: idle long enough that a sweep must read each one's partner to know,
    // too short for any to be over, so nothing is removed: the dearest table to sweep.
    let pairs = MAX_NAT / 2 - 64;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    let seen = (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64) - 10_000_000_000;
    {
        let mut map = fx.map("NAT");
        let mut nat: aya::maps::HashMap<_, NatKey, NatEntry> =
            aya::maps::HashMap::try_from(&mut map).unwrap();
        let x = u32::from_ne_bytes([203, 0, 113, 1]);
        let node = u32::from_ne_bytes(NODE.octets());
        for i in 0..pairs {
            let a = u32::from_ne_bytes([10, 250, (i >> 8) as u8, i as u8]);
            let [(k1, mut e1), (k2, mut e2)] =
                snat_tcp_pair((a, 1000), (x, 80), (node, (i % 60000) as u16));
            e1.last_seen_ns = seen;
            e2.last_seen_ns = seen;
            // Distinct keys: `i` picks the pod address (and the node port modulo 60000,
            // made unique by the pod address in the forward key; reverse keys differ
            // while i < 60000, the rest only add forward entries).
            nat.insert(k1, e1, 0).unwrap();
            let _ = nat.insert(k2, e2, 0);
        }
    }
    // Pod A's first flow fits its share of one; its second asks for room and sweeps.
    let (v, _) = fx.egress(&udp_frame(POD_A, 1000, EXT, 53));
    assert_eq!(v, OK);
    let sweeps = fx.reason(Reason::NatSweep);
    let second = udp_frame(POD_A, 1001, EXT, 53);
    fx.set_flow(&flow_key(&second), cni_ebpf_common::FlowFlags::PENDING);
    let (v, ns) = fx.run_timed("uplink_egress", 2, &second, 1);
    assert_eq!(v, SHOT, "pod A is at its cap");
    assert_eq!(fx.reason(Reason::NatSweep), sweeps + 1, "the refusal swept");
    assert_eq!(fx.reason(Reason::NatSweptEntry), 0, "open flows were swept");
    eprintln!(
        "one sweep slice of a full NAT table ({MAX_NAT} entries, {NAT_SWEEP_BUDGET} looked at): {ns} ns"
    );
    assert!(ns < 10_000_000, "a sweep slice took {ns} ns");
    // Within the second, the next refusal does not sweep: it costs a lookup.
    let (v, ns) = fx.run_timed("uplink_egress", 2, &second, 1000);
    assert_eq!(v, SHOT);
    eprintln!("a refusal without a sweep: {ns} ns");
    assert_eq!(fx.reason(Reason::NatSweep), sweeps + 1);
    // The next slices get further: every slice looks at entries the earlier ones did not,
    // and the pass ends within MAX_NAT / NAT_SWEEP_BUDGET + 1 slices.
    let mut slices = 1;
    let mut longest = 0;
    loop {
        age_clock(&fx);
        let (_, ns) = fx.run_timed("uplink_egress", 2, &second, 1);
        longest = longest.max(ns);
        slices += 1;
        let shares = fx.map("NAT_USE");
        let m: aya::maps::HashMap<_, u32, cni_ebpf_common::NatUse> =
            aya::maps::HashMap::try_from(&shares).unwrap();
        if m.get(&0, 0).unwrap().entries > 1 {
            break;
        }
        assert!(
            slices <= MAX_NAT / NAT_SWEEP_BUDGET + 1,
            "the pass never ended"
        );
    }
    eprintln!("a whole pass: {slices} slices, the longest {longest} ns");
    // The walk itself (bpf_for_each_map_elem from the table's start) is what a late
    // slice pays: bounded by the table's size, not by the budget.
    assert!(longest < 60_000_000, "a sweep slice took {longest} ns");
}

/// Makes the last sweep slice look a second older (the rate limit is one a second).
fn age_clock(fx: &Fixture) {
    let mut map = fx.map("NAT_USE");
    let mut m: aya::maps::HashMap<_, u32, cni_ebpf_common::NatUse> =
        aya::maps::HashMap::try_from(&mut map).unwrap();
    let mut clock = m.get(&0, 0).unwrap();
    clock.swept_ns = clock.swept_ns.saturating_sub(1_100_000_000).max(1);
    m.insert(0, clock, 0).unwrap();
}
