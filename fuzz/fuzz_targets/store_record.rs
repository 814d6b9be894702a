//! The IPAM store's files as read back from disk: reservation records (`keys/…` and their
//! hard links `ips/…`) and round-robin cursors. A crash, a full disk or another program
//! can leave any bytes there.
//!
//! Properties: the parsers never panic; an accepted record written back the way the store
//! writes it parses to the same record; what the allocator derives from a record (its key
//! name, the reservation it reports) never panics, and a key name splits back into the
//! record's container ID and ifname.

#![no_main]

use cni_ebpf::ipam::{
    record::{parse_record, split_key_name},
    store::parse_cursor,
    Reservation,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(ip) = parse_cursor(data) {
        assert_eq!(parse_cursor(ip.to_string().as_bytes()), Some(ip));
    }
    let Some(record) = parse_record(data) else {
        return;
    };
    let bytes = match serde_json::to_vec(&record) {
        Ok(b) => b,
        Err(e) => panic!("record {record:?} cannot be written: {e}"),
    };
    assert_eq!(
        parse_record(&bytes).as_ref(),
        Some(&record),
        "written as {bytes:?}"
    );
    if let Ok(name) = record.key_name() {
        assert_eq!(
            split_key_name(&name),
            Some((record.container_id.as_str(), record.ifname.as_str())),
            "key name {name:?}"
        );
        let _ = Reservation::from_key_name(&name);
    }
    let _ = Reservation::from(record);
});
