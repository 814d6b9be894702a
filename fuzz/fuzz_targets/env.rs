//! The `CNI_*` environment and `CNI_ARGS`.
//!
//! The input is split at NUL bytes into the values of `CNI_COMMAND`, `CNI_CONTAINERID`,
//! `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` (raw bytes: an environment need not
//! be UTF-8; a missing field is an unset variable). Properties: `Env::from_lookup` and
//! `CniArgs::parse` never panic; parsed `CNI_ARGS` written back as `K=V;…` parse to the
//! same pairs; a parsed command's name parses back to it.

#![no_main]

use std::{ffi::OsString, os::unix::ffi::OsStringExt};

use cni_ebpf::cni::env::{check_identifier, check_ifname, CniArgs, Command, Env};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn check_args(raw: &str) {
    let Ok(args) = CniArgs::parse(raw) else {
        return;
    };
    let _ = args.ips();
    let again: String = args
        .pairs
        .iter()
        .map(|(k, v)| format!("{k}={v};"))
        .collect();
    match CniArgs::parse(&again) {
        Ok(back) => assert_eq!(back, args, "CNI_ARGS {raw:?} re-emitted as {again:?}"),
        Err(e) => panic!("CNI_ARGS {raw:?} re-emitted as {again:?} no longer parses: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let fields: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    let value = |name: &str| -> Option<OsString> {
        let i = NAMES.iter().position(|n| *n == name)?;
        fields.get(i).map(|f| OsString::from_vec(f.to_vec()))
    };
    if let Ok(env) = Env::from_lookup(value) {
        let _ = env.args.ips();
        assert_eq!(Command::parse(env.command.as_str()).ok(), Some(env.command));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        check_args(text);
        let _ = check_identifier(text);
        let _ = check_ifname(text);
        if let Ok(c) = Command::parse(text) {
            assert_eq!(c.as_str(), text);
        }
    }
    for field in &fields {
        if let Ok(text) = std::str::from_utf8(field) {
            check_args(text);
        }
    }
});
