//! Delegation (spec section 4) to the reference `host-local` plugin, installed at
//! /usr/lib/cni/host-local: ADD/CHECK/DEL through it, its errors passed on, GC and STATUS
//! skipped for a plugin that does not speak 1.1.0, and a missing plugin.

use std::path::Path;

use crate::common::{data_dir, env, parse};
use cni_ebpf::{cni::env::Command, error::Error, ipam};
use serde_json::{json, Value};

const HOST_LOCAL: &str = "/usr/lib/cni/host-local";

fn doc(dir: &Path, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "delegated",
        "type": "cni-ebpf",
        "dataDir": dir.join("ours"),
        "ipam": {
            "type": "host-local",
            "dataDir": dir.join("host-local"),
            "ranges": [[{"subnet": "10.40.0.0/29"}]],
            "routes": [{"dst": "0.0.0.0/0"}]
        }
    })
}

fn require_host_local() {
    assert!(
        Path::new(HOST_LOCAL).is_file(),
        "{HOST_LOCAL} is missing: install the reference CNI plugins (containernetworking-plugins)"
    );
}

#[test]
fn add_check_del_through_host_local() {
    require_host_local();
    let dir = data_dir();
    let d = doc(dir.path(), "1.0.0");
    let stdin = d.to_string();
    let conf = parse(&d, Command::Add);
    let add_env = env("ADD", "c1", "eth0", &[]);
    ipam::validate(&conf, &add_env).unwrap_or_else(|e| panic!("validate: {e}"));
    let res = ipam::add(&conf, &add_env, stdin.as_bytes())
        .unwrap_or_else(|e| panic!("delegated ADD: {e}"));
    assert_eq!(res.ips.len(), 1, "{res:?}");
    assert_eq!(res.ips[0].address.to_string(), "10.40.0.2/29");
    assert_eq!(
        res.ips[0].gateway.map(|g| g.to_string()).as_deref(),
        Some("10.40.0.1")
    );
    assert_eq!(res.routes.len(), 1);
    // host-local's own store was used, ours was not created.
    assert!(dir.path().join("host-local/delegated/10.40.0.2").is_file());
    assert!(!dir.path().join("ours").exists());
    // list() knows nothing of a delegate's reservations.
    assert!(ipam::list(&conf)
        .unwrap_or_else(|e| panic!("{e}"))
        .is_empty());

    let check_conf = parse(&d, Command::Check);
    ipam::check(
        &check_conf,
        &env("CHECK", "c1", "eth0", &[]),
        stdin.as_bytes(),
        &[],
    )
    .unwrap_or_else(|e| panic!("delegated CHECK: {e}"));

    let del_conf = parse(&d, Command::Del);
    ipam::del(&del_conf, &env("DEL", "c1", "eth0", &[]), stdin.as_bytes())
        .unwrap_or_else(|e| panic!("delegated DEL: {e}"));
    assert!(!dir.path().join("host-local/delegated/10.40.0.2").exists());
    // DEL is idempotent through the delegate too.
    ipam::del(&del_conf, &env("DEL", "c1", "eth0", &[]), stdin.as_bytes())
        .unwrap_or_else(|e| panic!("second delegated DEL: {e}"));
    // CHECK now fails with host-local's error.
    match ipam::check(
        &check_conf,
        &env("CHECK", "c1", "eth0", &[]),
        stdin.as_bytes(),
        &[],
    ) {
        Err(Error::Delegate { plugin, msg, .. }) => {
            assert_eq!(plugin, "host-local");
            assert!(!msg.is_empty());
        }
        other => panic!("CHECK after DEL must fail in host-local: {other:?}"),
    }
}

#[test]
fn delegate_errors_are_passed_on() {
    require_host_local();
    let dir = data_dir();
    let d = doc(dir.path(), "1.0.0");
    let stdin = d.to_string();
    let conf = parse(&d, Command::Add);
    // An address outside the range, asked for through CNI_ARGS: host-local refuses it.
    let e = ipam::add(
        &conf,
        &env("ADD", "c1", "eth0", &[("CNI_ARGS", "IP=10.99.0.5")]),
        stdin.as_bytes(),
    );
    match e {
        Err(Error::Delegate { plugin, code, msg }) => {
            assert_eq!(plugin, "host-local");
            assert_ne!(code, 0);
            assert!(msg.contains("10.99.0.5"), "{msg}");
        }
        other => panic!("expected host-local's error, got {other:?}"),
    }
    // Exhaustion in host-local: /29 has five addresses after the gateway.
    for i in 0..5 {
        ipam::add(
            &conf,
            &env("ADD", &format!("c{i}"), "eth0", &[]),
            stdin.as_bytes(),
        )
        .unwrap_or_else(|e| panic!("ADD c{i}: {e}"));
    }
    match ipam::add(&conf, &env("ADD", "c9", "eth0", &[]), stdin.as_bytes()) {
        Err(e @ Error::Delegate { .. }) => {
            assert!(e.to_string().contains("host-local"), "{e}");
        }
        other => panic!("expected host-local's exhaustion error, got {other:?}"),
    }
}

#[test]
fn gc_and_status_skip_a_delegate_without_1_1_0() {
    require_host_local();
    let dir = data_dir();
    let mut d = doc(dir.path(), "1.1.0");
    d["cni.dev/valid-attachments"] = json!([]);
    let stdin = d.to_string();
    let released = ipam::gc(
        &parse(&d, Command::Gc),
        &env("GC", "", "", &[]),
        stdin.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("GC: {e}"));
    assert!(released.is_empty());
    ipam::status(
        &parse(&d, Command::Status),
        &env("STATUS", "", "", &[]),
        stdin.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("STATUS: {e}"));
}

#[test]
fn missing_delegate() {
    let dir = data_dir();
    let mut d = doc(dir.path(), "1.1.0");
    d["ipam"]["type"] = json!("no-such-ipam");
    let stdin = d.to_string();
    let conf = parse(&d, Command::Add);
    match ipam::add(&conf, &env("ADD", "c1", "eth0", &[]), stdin.as_bytes()) {
        Err(e @ Error::InvalidConfig { .. }) => {
            assert!(
                e.to_string()
                    .contains("\"no-such-ipam\" was not found in CNI_PATH"),
                "{e}"
            );
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    match ipam::status(
        &parse(&d, Command::Status),
        &env("STATUS", "", "", &[]),
        stdin.as_bytes(),
    ) {
        Err(e @ Error::NotAvailable(_)) => assert_eq!(e.code(), 50),
        other => panic!("STATUS with a missing delegate: {other:?}"),
    }
}
