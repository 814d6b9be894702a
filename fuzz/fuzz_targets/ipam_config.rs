//! The `ipam` object of a network configuration.
//!
//! Properties: `Ipam::parse` never panics; every range of an accepted configuration is
//! well-formed (start ≤ end inside the subnet, same family, a non-zero size); the address
//! arithmetic the allocator builds on round-trips (`offset(nth(k)) == k`, `nth(k)` lies in
//! the range); requested addresses are assigned without a panic.

#![no_main]

use std::net::IpAddr;

use cni_ebpf::ipam::config::{Ipam, Requested};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(Ipam::Embedded(cfg)) = Ipam::parse(&value) else {
        return;
    };
    let _ = cfg.check_routes();
    // A salt from the input picks offsets inside each range.
    let salt = data
        .iter()
        .fold(0u128, |acc, b| acc.rotate_left(7) ^ u128::from(*b));
    let mut requests = Vec::new();
    for set in &cfg.range_sets {
        assert!(!set.ranges.is_empty(), "an empty range set was accepted");
        let _ = set.describe();
        for r in &set.ranges {
            let v4 = r.is_v4();
            assert_eq!(
                r.range_start.is_ipv4(),
                v4,
                "{}: start of another family",
                r.describe()
            );
            assert_eq!(
                r.range_end.is_ipv4(),
                v4,
                "{}: end of another family",
                r.describe()
            );
            assert!(
                r.subnet.contains(&r.range_start),
                "{}: start outside",
                r.describe()
            );
            assert!(
                r.subnet.contains(&r.range_end),
                "{}: end outside",
                r.describe()
            );
            let size = r.size();
            assert!(size > 0, "{}: empty range", r.describe());
            for k in [0, size - 1, salt % size] {
                let ip = r.nth(k);
                assert!(r.contains(ip), "{}: nth({k}) = {ip} outside", r.describe());
                assert_eq!(r.offset(ip), k, "{}: offset(nth({k}))", r.describe());
                let _ = r.with_prefix(ip);
                assert!(
                    set.range_for(ip).is_some(),
                    "{}: nth({k}) in no range",
                    r.describe()
                );
                let _ = set.is_gateway(ip);
                requests.push(Requested {
                    address: ip,
                    source: "fuzz",
                });
            }
        }
    }
    // One address per set, then everything at once (which may be refused, never a panic).
    let one: Vec<Requested> = cfg
        .range_sets
        .iter()
        .filter_map(|s| s.ranges.first())
        .map(|r| Requested {
            address: r.nth(salt % r.size()),
            source: "fuzz",
        })
        .collect();
    let _ = cfg.assign_requests(&one);
    let _ = cfg.assign_requests(&requests);
    let outside = Requested {
        address: IpAddr::from([0u8; 16]),
        source: "fuzz",
    };
    let _ = cfg.assign_requests(&[outside]);
});
