//! A pod's egress rate (`runtimeConfig.bandwidth`) in `from_pod`, packet by
//! packet through `BPF_PROG_TEST_RUN`: within its burst a paced pod's packets go on as
//! before; beyond burst and limit they are dropped and counted (`drop_egress_rate`);
//! a pod without a rate is never touched; removing the pod removes its schedule.

use cni_ebpf::{cni::config::EgressRate, datapath::Endpoint};
use cni_ebpf_common::{Pacing, PacingMode, Reason};
use testbed::packet::*;

use crate::frames6::*;

/// Pod A's attachment (the fixture's), with `egress_rate`.
fn pod_a(egress_rate: Option<EgressRate>) -> Endpoint {
    Endpoint {
        egress_rate,
        ..endpoint_a()
    }
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn a_paced_pod_is_held_to_its_rate_and_an_unpaced_one_is_not() {
    let fx = Fixture::with_two_pods();
    // Pod A: 8 kbit/s (1 000 bytes/s) with a 8 kbit (1 s) burst. Each frame of n bytes
    // costs n ms of the schedule, so of a run of 40 frames sent at once the burst takes
    // 1 000 / n, the limit (300 ms where the kernel has no fq, 25 ms where it has) a few
    // more, and the rest must be dropped.
    let ep = pod_a(Some(EgressRate {
        bits_per_s: 8_000,
        burst_bits: 8_000,
    }));
    let mut errors = Vec::new();
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    fx.dp().put_endpoint_entries(&ep).unwrap();

    let frame = udp_frame(POD_A, 4000, POD_B, 53);
    let mut passed = 0;
    for _ in 0..40 {
        match fx.run_on("from_pod", IFINDEX_A, &frame).0 {
            SHOT => {}
            REDIRECT => passed += 1,
            v => panic!("unexpected verdict {v}"),
        }
    }
    let dropped = fx.reason(Reason::DropEgressRate);
    let cost_ms = frame.len() as f64;
    let (lo, hi) = (
        (1000.0 / cost_ms).floor() as usize,
        ((1000.0 + 300.0) / cost_ms).ceil() as usize + 1,
    );
    assert!(
        (lo..=hi).contains(&passed) && passed < 40,
        "the burst and limit let {passed} of 40 {}-byte frames through, expected {lo}..={hi}",
        frame.len()
    );
    assert_eq!(dropped, 40 - passed as u64, "every drop is counted");

    // Pod B has no rate: 200 frames at once all go.
    let back = udp_frame(POD_B, 53, POD_A, 4000);
    for _ in 0..200 {
        assert_eq!(fx.run_on("from_pod", IFINDEX_B, &back).0, REDIRECT);
    }
    assert_eq!(
        fx.reason(Reason::DropEgressRate),
        dropped,
        "pod B was never dropped"
    );

    // The schedule goes with the pod: put back without a rate, A is free again.
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let mut map = fx.map("PACING");
    let pacing: aya::maps::HashMap<_, u32, Pacing> =
        aya::maps::HashMap::try_from(&mut map).unwrap();
    assert!(
        pacing.get(&IFINDEX_A, 0).is_err(),
        "DEL removes the schedule"
    );
    // A schedule left on the ifindex by a crashed earlier interface does not apply to a
    // new interface without a rate.
    let mut pacing = pacing;
    let stale = cni_ebpf::datapath::pacing::pacing_of(&ep.egress_rate.unwrap(), PacingMode::POLICE);
    pacing.insert(IFINDEX_A, stale, 0).unwrap();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            egress_rate: None,
            ..ep
        })
        .unwrap();
    assert!(
        pacing.get(&IFINDEX_A, 0).is_err(),
        "the stale schedule was removed"
    );
    for _ in 0..40 {
        assert_eq!(fx.run_on("from_pod", IFINDEX_A, &frame).0, REDIRECT);
    }
}

/// Where the uplink has fq, the schedule is enforced by departure times: past the burst
/// each packet for the outside leaves `from_pod` with `skb->tstamp` one packet's worth of
/// time (its length at the rate) after the previous one, and only what would wait longer
/// than the limit (25 ms in the plugin, longer here) is dropped. A packet that stays on the
/// node (for pod B) passes no fq: it gets no departure time and is policed with the longer
/// limit of a kernel without fq. The entry is written in fq mode by hand; fq itself, which
/// honours the times, is the kernel's part (testbed/tests/e2e/bandwidth.rs runs it on a kernel
/// with fq: `cargo xtask test` boots one).
#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn with_fq_a_paced_pod_gets_departure_times_one_packet_apart() {
    let fx = Fixture::with_two_pods();
    let mut errors = Vec::new();
    fx.dp()
        .remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    // A burst of 10 frames, in fq mode.
    let out = udp_frame(POD_A, 4000, EXT, 53);
    let local = udp_frame(POD_A, 4000, POD_B, 53);
    assert_eq!(out.len(), local.len());
    let (rate, cost) = frame_rate(out.len(), 10);
    fx.dp().put_endpoint_entries(&pod_a(Some(rate))).unwrap();

    // To pod B, with the plugin's own fq-mode entry (25 ms limit): no departure times,
    // and past the burst 300 ms of schedule (6 frames) pass, not 25 ms (none).
    let entry = cni_ebpf::datapath::pacing::pacing_of(&rate, PacingMode::BY_FQ);
    assert_eq!(entry.limit_ns, cni_ebpf_common::PACING_LATENCY_NS);
    fx.put_pacing(IFINDEX_A, entry);
    let mut passed = 0;
    for _ in 0..30 {
        let (v, ts) = fx.run_tstamp("from_pod", IFINDEX_A, &local);
        assert_eq!(ts, 0, "a packet for a local pod got a departure time");
        match v {
            SHOT => {}
            REDIRECT => passed += 1,
            v => panic!("unexpected verdict {v}"),
        }
    }
    let police = (cni_ebpf_common::PACING_POLICE_LIMIT_NS / cost) as usize;
    assert!(
        (10 + police - 1..=10 + police + 2).contains(&passed),
        "{passed} of 30 frames to a local pod passed, expected the burst (10) and the \
         policing limit ({police})"
    );
    let dropped = fx.reason(Reason::DropEgressRate);
    assert_eq!(dropped, 30 - passed as u64);

    // To the outside, with room for 60 frames of schedule: departure times.
    let mut entry = entry;
    entry.limit_ns = 10 * 1_000_000_000;
    fx.put_pacing(IFINDEX_A, entry);
    let mut stamps = Vec::new();
    for _ in 0..60 {
        let (v, ts) = fx.run_tstamp("from_pod", IFINDEX_A, &out);
        assert_ne!(v, SHOT, "within its limit nothing is dropped");
        stamps.push(ts);
    }
    let unstamped = stamps.iter().take_while(|t| **t == 0).count();
    let burst_frames = 10;
    assert!(
        unstamped >= burst_frames - 1 && unstamped <= burst_frames + 3,
        "the burst should let ~{burst_frames} frames go at once, {unstamped} went"
    );
    // Past the burst: departure times exactly one frame's time apart.
    let later: Vec<u64> = stamps[unstamped + 1..].to_vec();
    assert!(
        later.len() > 30 && later.iter().all(|t| *t > 0),
        "{stamps:?}"
    );
    for w in later.windows(2) {
        assert_eq!(
            w[1] - w[0],
            cost,
            "departure times {} ns apart",
            w[1] - w[0]
        );
    }
    assert_eq!(fx.reason(Reason::DropEgressRate), dropped);
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
