//! What the agent's metrics reads, on the packet-test fixture: SNAT port use after crafted
//! masqueraded flows (two to one destination, others elsewhere, a pod reaching itself
//! through its host port), each map's fill and kernel memory, and the read-only handle
//! the exporter uses — it reads what the plugin's handle reads and cannot write.
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use cni_ebpf::datapath::Datapath;
use cni_ebpf_common::{map, MAX_NAT, REASON_SLOTS};
use testbed::packet::*;

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn snat_use_map_fill_and_memory_through_a_read_only_handle() {
    let fx = Fixture::with_two_pods();
    fx.add_ports("ctr-a", POD_A, &[pm(8080, 80, "tcp", None)]);
    // Two flows to EXT:80/tcp, one to EXT:443/tcp, one to EXT:53/udp: four SNAT ports.
    for pkt in [
        tcp_frame(POD_A, 40000, EXT, 80, SYN),
        tcp_frame(POD_B, 40000, EXT, 80, SYN),
        tcp_frame(POD_A, 40001, EXT, 443, SYN),
        udp_frame(POD_A, 5000, EXT, 53),
    ] {
        let (v, out) = fx.egress(&pkt);
        assert_eq!(v, OK);
        assert_eq!(parse_checked(&out).src, NODE, "masqueraded");
    }
    // Pod A → node:8080, served by A itself: its source is translated too (a fifth port);
    // pod B → node:8080 is not (its address is kept).
    for (src, mac_h, mac_p) in [
        (POD_A, HOST_MAC_A, POD_MAC_A),
        (POD_B, HOST_MAC_B, POD_MAC_B),
    ] {
        let syn = frame(
            mac_h,
            mac_p,
            src,
            NODE,
            TCP,
            &tcp(src, NODE, 50000, 8080, SYN, b""),
        );
        assert_eq!(fx.run("from_pod", &syn).0, REDIRECT);
    }

    let ro = Datapath::open_read_only_at(fx.network_dir())
        .unwrap()
        .expect("loaded");
    let snat = ro.snat_usage().unwrap();
    assert_eq!(
        snat.range_size,
        u64::from(SNAT_PORTS.1 - SNAT_PORTS.0) + 1,
        "{snat:?}"
    );
    assert_eq!(snat.reservations, 5, "{snat:?}");
    assert_eq!(
        snat.max_per_destination, 2,
        "EXT:80/tcp holds two: {snat:?}"
    );
    // Ports are drawn at random per destination; the two towards EXT:80 differ.
    assert!((2..=5).contains(&snat.ports_in_use), "{snat:?}");

    let stats = ro.map_stats().unwrap();
    let names: Vec<&str> = stats.iter().map(|m| m.name.as_str()).collect();
    let mut all = map::ALL.to_vec();
    all.sort_unstable();
    assert_eq!(names, all, "every pinned map, sorted");
    let get = |n: &str| stats.iter().find(|m| m.name == n).unwrap();
    // Four masqueraded flows and two hairpin flows, two entries each.
    assert_eq!(get(map::NAT).entries, Some(12), "{:?}", get(map::NAT));
    assert_eq!(get(map::NAT).max_entries, MAX_NAT);
    assert_eq!(
        get(map::NAT).map_type,
        "hash",
        "a hash, never an LRU: a live translation is never evicted"
    );
    assert_eq!((get(map::NAT).key_size, get(map::NAT).value_size), (16, 32));
    assert!(get(map::NAT).memlock_bytes >= u64::from(MAX_NAT) * 40);
    assert_eq!(get(map::ENDPOINTS).entries, Some(2));
    assert_eq!(get(map::OWNERS).entries, Some(2));
    assert_eq!(get(map::PORTMAPS).entries, Some(1));
    assert_eq!(get(map::REASONS).entries, Some(u64::from(REASON_SLOTS)));
    assert_eq!(get(map::REASONS).map_type, "percpu_array");
    for m in &stats {
        // A ring has bytes, not entries.
        assert!(m.entries.is_some() || m.map_type == "ringbuf", "{m:?}");
        assert!(m.entries <= Some(u64::from(m.max_entries)), "{m:?}");
    }
    // The plugin's own handle sees the same.
    assert_eq!(fx.dp().map_stats().unwrap(), stats);
    assert_eq!(fx.dp().snat_usage().unwrap(), snat);
    assert_eq!(ro.endpoints().unwrap(), fx.dp().endpoints().unwrap());
    assert_eq!(
        ro.reason_counts().unwrap(),
        fx.dp().reason_counts().unwrap()
    );

    // Writes through the read-only handle are refused by the kernel and change nothing.
    let before = fx.dp().node_config_view().unwrap();
    let err = ro
        .add_node_addrs(&[(std::net::Ipv4Addr::new(192, 0, 2, 1).into(), 2)])
        .expect_err("a write through a read-only map descriptor");
    assert_eq!(err.errno(), Some(libc::EPERM), "{err:?}");
    let text = cni_ebpf::error::chain(&err);
    assert!(text.contains("Operation not permitted"), "{text}");
    assert!(ro.remove_port_mappings(("ctr-a", "eth0")).is_err());
    assert_eq!(fx.dp().node_config_view().unwrap(), before);
    assert_eq!(fx.dp().port_mappings().unwrap().len(), 1);
}
