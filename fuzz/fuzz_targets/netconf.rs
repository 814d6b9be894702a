//! The network configuration on stdin, parsed for every verb.
//!
//! Property: `NetConf::parse` never panics, whatever the bytes; what a successful parse
//! yields (its prevResult, its `ipam` object, its paths) goes on through the code that
//! consumes it on the verbs' paths, which must not panic either.

#![no_main]

use cni_ebpf::{
    cni::{config::NetConf, env::Command, version::Version},
    ipam::config::Ipam,
};
use libfuzzer_sys::fuzz_target;

const COMMANDS: [Command; 6] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Version,
    Command::Status,
    Command::Gc,
];

const VERSIONS: [Version; 7] = Version::ALL;

fuzz_target!(|data: &[u8]| {
    for command in COMMANDS {
        let Ok(conf) = NetConf::parse(data, command) else {
            continue;
        };
        let _ = conf.pin_dir();
        let _ = conf.store_dir();
        let _ = conf.valid_attachment_keys();
        if let Some(prev) = &conf.prev_result {
            for v in VERSIONS {
                let _ = prev.to_json(v);
            }
        }
        if let Ok(Ipam::Embedded(cfg)) = Ipam::parse(&conf.ipam) {
            let _ = cfg.check_routes();
        }
    }
});
