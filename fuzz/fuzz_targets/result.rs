//! prevResult / result conversion between every spec version.
//!
//! The input is a JSON document read as a result of each version in turn (a `cniVersion`
//! inside it wins, as for a prevResult). Each parsed result is emitted at every version.
//! Properties: nothing panics; whatever we emit parses back at the version it claims;
//! emit → parse → emit at one version gives the same document (a conversion may drop
//! what the target version cannot carry, but only once: converting again changes nothing).

#![no_main]

use cni_ebpf::cni::{result::CniResult, version::Version};
use libfuzzer_sys::fuzz_target;

const VERSIONS: [Version; 7] = Version::ALL;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for from in VERSIONS {
        let Ok(parsed) = CniResult::from_json(&value, from) else {
            continue;
        };
        for to in VERSIONS {
            let emitted = parsed.to_json(to);
            let back = match CniResult::from_json(&emitted, to) {
                Ok(r) => r,
                Err(e) => panic!("our {to} result {emitted} does not parse back: {e}"),
            };
            let again = back.to_json(to);
            assert_eq!(again, emitted, "{to} result changed on a round trip");
            // The projection onto a version is idempotent on the model too.
            match CniResult::from_json(&again, to) {
                Ok(r) => assert_eq!(r, back, "{to} result model changed on a round trip"),
                Err(e) => panic!("our {to} result {again} does not parse back: {e}"),
            }
        }
    }
});
