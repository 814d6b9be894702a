//! The embedded allocator against a real store on the real filesystem (one process):
//! results, round-robin, exhaustion, requested addresses, keys, CHECK, GC, STATUS, the
//! reboot rule, crash leftovers, the lock timeout and the path checks.

use std::{
    collections::HashSet,
    net::IpAddr,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    time::{Duration, Instant},
};

use crate::common::{add, audit_clean, data_dir, del, env, list, netconf, netconf_json, parse};
use cni_ebpf::{
    cni::env::Command,
    error::Error,
    ipam::{
        self,
        config::{Ipam, IpamConfig},
        store::{Store, StoreOptions},
        Allocator, Requester,
    },
};
use ipnet::IpNet;
use serde_json::{json, Value};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn v4(subnet: &str) -> Value {
    json!({"ranges": [[{"subnet": subnet}]]})
}

fn add_err(conf: &cni_ebpf::cni::config::NetConf, cid: &str, args: &[(&str, &str)]) -> Error {
    match ipam::add(conf, &env("ADD", cid, "eth0", args), b"{}") {
        Ok(r) => panic!("ADD {cid} should have failed, got {r:?}"),
        Err(e) => e,
    }
}

fn cfg_of(conf: &cni_ebpf::cni::config::NetConf) -> IpamConfig {
    match Ipam::parse(&conf.ipam) {
        Ok(Ipam::Embedded(c)) => c,
        other => panic!("not an embedded config: {other:?}"),
    }
}

#[test]
fn dual_stack_result() {
    let dir = data_dir();
    let mut doc = netconf_json(
        dir.path(),
        json!({
            "ranges": [[{"subnet": "10.10.0.0/24"}], [{"subnet": "fd00:10::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dns": {"nameservers": ["10.10.0.53"]}
        }),
    );
    doc["dns"] = json!({"nameservers": ["9.9.9.9"]});
    let conf = parse(&doc, Command::Add);
    let res = ipam::add(&conf, &env("ADD", "c1", "eth0", &[]), b"{}")
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    assert_eq!(res.ips.len(), 2, "{res:?}");
    assert_eq!(res.ips[0].address, net("10.10.0.2/24"));
    assert_eq!(res.ips[0].gateway, Some(ip("10.10.0.1")));
    assert_eq!(res.ips[0].interface, None);
    assert_eq!(res.ips[1].address, net("fd00:10::2/64"));
    assert_eq!(res.ips[1].gateway, Some(ip("fd00:10::1")));
    assert_eq!(res.routes.len(), 2);
    assert_eq!(res.dns.nameservers, vec!["10.10.0.53"], "ipam.dns wins");

    let all = list(&conf);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].container_id, "c1");
    assert_eq!(all[0].ifname, "eth0");
    assert_eq!(all[0].addresses, vec![ip("10.10.0.2"), ip("fd00:10::2")]);
    assert_eq!(all[0].netns.as_deref(), Some("/var/run/netns/c1"));
    assert!(!all[0].boot_id.is_empty());

    // Without ipam.dns the top-level dns is used.
    let dir2 = data_dir();
    let mut doc = netconf_json(dir2.path(), v4("10.11.0.0/24"));
    doc["dns"] = json!({"nameservers": ["9.9.9.9"]});
    let conf = parse(&doc, Command::Add);
    let res = ipam::add(&conf, &env("ADD", "c1", "eth0", &[]), b"{}")
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    assert_eq!(res.dns.nameservers, vec!["9.9.9.9"]);
}

#[test]
fn store_is_private() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.12.0.0/24"));
    add(&conf, "c1");
    let store = conf.store_dir();
    let mode = |p: &Path| {
        std::fs::symlink_metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode(&store), 0o700);
    for sub in ["ips", "keys", "tmp", "index"] {
        assert_eq!(mode(&store.join(sub)), 0o700, "{sub}");
    }
    for file in [
        "lock",
        "meta",
        "keys/c1:eth0",
        "ips/10.12.0.2",
        "last_reserved_ip.0",
    ] {
        assert_eq!(mode(&store.join(file)), 0o600, "{file}");
    }
    let uid = nix::unistd::geteuid().as_raw();
    let owner = std::fs::metadata(&store)
        .unwrap_or_else(|e| panic!("{e}"))
        .uid();
    assert_eq!(owner, uid);
}

#[test]
fn round_robin_and_release() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.13.0.0/24"));
    assert_eq!(add(&conf, "a"), vec![ip("10.13.0.2")]);
    assert_eq!(add(&conf, "b"), vec![ip("10.13.0.3")]);
    del(&conf, "a");
    // Round-robin: the freed .2 is not reused at once.
    assert_eq!(add(&conf, "c"), vec![ip("10.13.0.4")]);
    del(&conf, "b");
    del(&conf, "c");
    assert_eq!(add(&conf, "d"), vec![ip("10.13.0.5")]);
    // DEL is idempotent, also for keys never seen.
    del(&conf, "a");
    del(&conf, "never-added");
    assert_eq!(list(&conf).len(), 1);
    audit_clean(&conf);
}

#[test]
fn round_robin_wraps_across_ranges() {
    let dir = data_dir();
    let conf = netconf(
        dir.path(),
        json!({"ranges": [[
            {"subnet": "10.14.0.0/24", "rangeStart": "10.14.0.10", "rangeEnd": "10.14.0.11"},
            {"subnet": "10.14.1.0/24", "rangeStart": "10.14.1.10", "rangeEnd": "10.14.1.10"}
        ]]}),
    );
    assert_eq!(add(&conf, "a"), vec![ip("10.14.0.10")]);
    assert_eq!(add(&conf, "b"), vec![ip("10.14.0.11")]);
    assert_eq!(add(&conf, "c"), vec![ip("10.14.1.10")]);
    del(&conf, "a");
    assert_eq!(
        add(&conf, "d"),
        vec![ip("10.14.0.10")],
        "wraps to the first range"
    );
    let e = add_err(&conf, "e", &[]);
    assert_eq!(e.code(), 100);
    let msg = e.to_string();
    assert!(
        msg.contains("10.14.0.10-10.14.0.11") && msg.contains("10.14.1.10-10.14.1.10"),
        "exhaustion must name every range of the set: {msg}"
    );
}

#[test]
fn exhaustion_names_the_full_range_and_reserves_nothing() {
    let dir = data_dir();
    let conf = netconf(
        dir.path(),
        json!({"ranges": [[{"subnet": "10.15.0.0/24"}], [{"subnet": "fd00:15::/125"}]]}),
    );
    // fd00:15::/125: ::1 is the gateway, ::2..::7 are six addresses.
    for i in 0..6 {
        add(&conf, &format!("c{i}"));
    }
    let e = add_err(&conf, "c6", &[]);
    let msg = e.to_string();
    assert_eq!(e.code(), 100, "{msg}");
    assert!(
        msg.contains("range set 1") && msg.contains("fd00:15::/125"),
        "{msg}"
    );
    // The IPv4 address picked for c6 was not kept.
    assert_eq!(list(&conf).len(), 6);
    let audit = audit_clean(&conf);
    assert!(audit.orphans.is_empty(), "{:?}", audit.orphans);
    assert!(ipam::check(&conf, &env("CHECK", "c6", "eth0", &[]), b"{}", &[]).is_err());
    // STATUS reports the full set.
    match ipam::status(&conf, &env("STATUS", "", "", &[]), b"{}") {
        Err(e @ Error::NotAvailable(_)) => {
            assert_eq!(e.code(), 50);
            assert!(e.to_string().contains("range set 1"), "{e}");
        }
        other => panic!("STATUS of a full range set: {other:?}"),
    }
    del(&conf, "c3");
    ipam::status(&conf, &env("STATUS", "", "", &[]), b"{}")
        .unwrap_or_else(|e| panic!("STATUS with a free address: {e}"));
    add(&conf, "c6");
}

#[test]
fn second_add_for_same_key_fails_and_keeps_the_first() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.16.0.0/24"));
    let first = add(&conf, "c1");
    let e = add_err(&conf, "c1", &[]);
    assert_eq!(e.code(), 100);
    assert!(e.to_string().contains("already holds 10.16.0.2/24"), "{e}");
    let all = list(&conf);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].addresses, first);
    // Another interface of the same container is another key.
    let other = ipam::add(&conf, &env("ADD", "c1", "net1", &[]), b"{}")
        .unwrap_or_else(|e| panic!("ADD c1/net1: {e}"));
    assert_eq!(other.ips[0].address, net("10.16.0.3/24"));
    audit_clean(&conf);
}

#[test]
fn requested_addresses() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.17.0.0/24"));
    let res = ipam::add(
        &conf,
        &env("ADD", "a", "eth0", &[("CNI_ARGS", "IP=10.17.0.77")]),
        b"{}",
    )
    .unwrap_or_else(|e| panic!("ADD with IP=: {e}"));
    assert_eq!(res.ips[0].address, net("10.17.0.77/24"));

    let e = add_err(&conf, "b", &[("CNI_ARGS", "IP=10.17.0.77")]);
    assert_eq!(e.code(), 100);
    assert!(
        e.to_string()
            .contains("10.17.0.77 is already reserved by container a interface eth0"),
        "{e}"
    );
    let e = add_err(&conf, "b", &[("CNI_ARGS", "IP=10.17.0.1")]);
    assert!(e.to_string().contains("gateway"), "{e}");
    let e = add_err(&conf, "b", &[("CNI_ARGS", "IP=10.99.0.1")]);
    assert!(
        e.to_string().contains("outside every configured range"),
        "{e}"
    );
    assert!(!list(&conf).iter().any(|r| r.container_id == "b"));

    // The dynamic search continues after the last reservation (host-local behaviour).
    assert_eq!(add(&conf, "c"), vec![ip("10.17.0.78")]);
    audit_clean(&conf);
}

#[test]
fn small_subnets_allocate_sensibly() {
    for (subnet, expected) in [
        ("10.18.0.0/31", "10.18.0.1/31"),
        ("10.18.0.7/32", "10.18.0.7/32"),
        ("fd00:18::/127", "fd00:18::1/127"),
        ("fd00:18::7/128", "fd00:18::7/128"),
    ] {
        let dir = data_dir();
        let conf = netconf(dir.path(), v4(subnet));
        let res = ipam::add(&conf, &env("ADD", "a", "eth0", &[]), b"{}")
            .unwrap_or_else(|e| panic!("ADD in {subnet}: {e}"));
        assert_eq!(res.ips[0].address, net(expected), "{subnet}");
        let e = add_err(&conf, "b", &[]);
        assert_eq!(e.code(), 100, "{subnet} holds one address: {e}");
        del(&conf, "a");
        add(&conf, "b");
    }
}

#[test]
fn check_compares_the_addresses_exactly() {
    let dir = data_dir();
    let conf = netconf(
        dir.path(),
        json!({"ranges": [[{"subnet": "10.19.0.0/24"}], [{"subnet": "fd00:19::/64"}]]}),
    );
    add(&conf, "c1");
    let chk =
        |expected: &[IpNet]| ipam::check(&conf, &env("CHECK", "c1", "eth0", &[]), b"{}", expected);
    chk(&[net("10.19.0.2/24"), net("fd00:19::2/64")]).unwrap_or_else(|e| panic!("CHECK: {e}"));
    // The plugin configures pods with host routes (/32, /128) and CHECKs with those: only
    // the addresses are compared.
    chk(&[net("10.19.0.2/32"), net("fd00:19::2/128")])
        .unwrap_or_else(|e| panic!("CHECK with host-route prefixes: {e}"));
    for (expected, needle) in [
        (vec![net("10.19.0.2/24")], "also holds fd00:19::2/64"),
        (
            vec![
                net("10.19.0.2/24"),
                net("fd00:19::2/64"),
                net("10.19.0.9/24"),
            ],
            "10.19.0.9/24 is not reserved",
        ),
    ] {
        match chk(&expected) {
            Err(e @ Error::Check(_)) => assert!(e.to_string().contains(needle), "{e}"),
            other => panic!("CHECK {expected:?} should fail with {needle:?}: {other:?}"),
        }
    }
    match ipam::check(&conf, &env("CHECK", "nobody", "eth0", &[]), b"{}", &[]) {
        Err(e @ Error::Check(_)) => assert!(e.to_string().contains("no address reservation")),
        other => panic!("CHECK of an unknown key: {other:?}"),
    }
}

#[test]
fn stale_release_never_frees_another_keys_address() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.20.0.0/24"));
    add(&conf, "old");
    del(&conf, "old");
    // The address is handed out again (a /30 would do it at once; here: request it).
    let res = ipam::add(
        &conf,
        &env("ADD", "new", "eth0", &[("CNI_ARGS", "IP=10.20.0.2")]),
        b"{}",
    )
    .unwrap_or_else(|e| panic!("ADD new: {e}"));
    assert_eq!(res.ips[0].address, net("10.20.0.2/24"));
    // A late DEL for the old container.
    del(&conf, "old");
    // Worse: a stale record of the old key that still lists the address (as a store
    // edited by hand or written by another program could have).
    let store = conf.store_dir();
    std::fs::write(
        store.join("keys/old:eth0"),
        json!({"containerID": "old", "ifname": "eth0", "addresses": ["10.20.0.2/24"],
               "bootId": list(&conf)[0].boot_id})
        .to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    del(&conf, "old");
    let all = list(&conf);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].container_id, "new");
    ipam::check(
        &conf,
        &env("CHECK", "new", "eth0", &[]),
        b"{}",
        &[net("10.20.0.2/24")],
    )
    .unwrap_or_else(|e| panic!("the new owner lost its address: {e}"));
    audit_clean(&conf);
}

#[test]
fn gc_releases_unlisted_keys_only() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.21.0.0/24"));
    for c in ["keep1", "drop1", "keep2", "drop2"] {
        add(&conf, c);
    }
    let store = conf.store_dir();
    let cursor_before =
        std::fs::read_to_string(store.join("last_reserved_ip.0")).unwrap_or_else(|e| panic!("{e}"));
    let lock_ino = std::fs::metadata(store.join("lock"))
        .unwrap_or_else(|e| panic!("{e}"))
        .ino();
    let mut doc = netconf_json(dir.path(), v4("10.21.0.0/24"));
    doc["cni.dev/valid-attachments"] = json!([
        {"containerID": "keep1", "ifname": "eth0"},
        {"containerID": "keep2", "ifname": "eth0"},
        {"containerID": "drop1", "ifname": "net9"}
    ]);
    let gc_conf = parse(&doc, Command::Gc);
    let released =
        ipam::gc(&gc_conf, &env("GC", "", "", &[]), b"{}").unwrap_or_else(|e| panic!("GC: {e}"));
    let mut names: Vec<_> = released.iter().map(|r| r.container_id.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["drop1", "drop2"]);
    assert!(released.iter().all(|r| r.addresses.len() == 1));
    let left: Vec<_> = list(&conf).into_iter().map(|r| r.container_id).collect();
    assert_eq!(left, vec!["keep1", "keep2"]);
    assert_eq!(
        std::fs::read_to_string(store.join("last_reserved_ip.0")).unwrap_or_default(),
        cursor_before,
        "GC must not touch the round-robin state"
    );
    assert_eq!(
        std::fs::metadata(store.join("lock")).map(|m| m.ino()).ok(),
        Some(lock_ino),
        "GC must not touch the lock"
    );
    audit_clean(&conf);
    // GC of a network that never allocated: nothing, and no store is created.
    let empty = data_dir();
    let mut doc = netconf_json(empty.path(), v4("10.21.0.0/24"));
    doc["cni.dev/valid-attachments"] = json!([]);
    let released = ipam::gc(&parse(&doc, Command::Gc), &env("GC", "", "", &[]), b"{}")
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert!(released.is_empty());
    assert!(!empty.path().join(crate::common::NETWORK).exists());
}

#[test]
fn reboot_reclaims_reservations_of_the_previous_boot() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.22.0.0/24"));
    let cfg = cfg_of(&conf);
    let boot = |id: &str| StoreOptions {
        boot_id: Some(id.into()),
        ..StoreOptions::default()
    };
    {
        let mut a = Allocator::open(&conf.store_dir(), "t", &cfg, &boot("boot-1"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no store"));
        a.allocate("c1", "eth0", Requester::default(), &[None])
            .unwrap_or_else(|e| panic!("{e}"));
        a.allocate("c2", "eth0", Requester::default(), &[None])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    {
        // Same boot: nothing is reclaimed.
        let a = Allocator::open(&conf.store_dir(), "t", &cfg, &boot("boot-1"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no store"));
        assert!(a.swept().is_empty());
        assert_eq!(a.list().unwrap_or_else(|e| panic!("{e}")).len(), 2);
    }
    {
        let mut a = Allocator::open(&conf.store_dir(), "t", &cfg, &boot("boot-2"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no store"));
        let mut swept: Vec<_> = a.swept().iter().map(|r| r.container_id.clone()).collect();
        swept.sort();
        assert_eq!(swept, vec!["c1", "c2"]);
        assert!(a.list().unwrap_or_else(|e| panic!("{e}")).is_empty());
        // The same container can be added again after the reboot.
        a.allocate("c1", "eth0", Requester::default(), &[None])
            .unwrap_or_else(|e| panic!("{e}"));
        let audit = a.audit().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            audit.problems.is_empty() && audit.orphans.is_empty(),
            "{audit:?}"
        );
    }
    let meta = std::fs::read_to_string(conf.store_dir().join("meta")).unwrap_or_default();
    assert!(meta.contains("boot-2"), "{meta}");
}

#[test]
fn crash_leftovers_are_reclaimed() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.23.0.0/29"));
    // .1 gateway, .2-.6 usable. One real allocation builds the index and moves the cursor.
    add(&conf, "c0");
    del(&conf, "c0");
    // Simulate an allocation killed after claiming .3 and .4 but before its commit: the
    // claims and the temporary record stay behind, the index knows nothing of them.
    {
        let mut store = Store::open(&conf.store_dir(), &StoreOptions::default())
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no store"));
        let rec = store.new_record(
            "ghost",
            "eth0",
            vec![net("10.23.0.3/29")],
            Requester::default(),
        );
        let tmp = store
            .write_tmp_record(&rec)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(store
            .link_ip(&tmp, ip("10.23.0.3"))
            .unwrap_or_else(|e| panic!("{e}")));
        assert!(store
            .link_ip(&tmp, ip("10.23.0.4"))
            .unwrap_or_else(|e| panic!("{e}")));
        // Dropped without commit or cleanup: exactly what kill -9 leaves.
    }
    // The temporary record is there until the next process takes the lock...
    let tmp_dir = conf.store_dir().join("tmp");
    let left = || std::fs::read_dir(&tmp_dir).map_or(0, Iterator::count);
    assert_eq!(left(), 1);
    // ...which removes it (here the audit's): only the lock holder writes there. With it
    // goes the claim its record names (.3); .4, linked here beyond what the record says
    // (no real allocation does that), stays an orphan for the search to reuse.
    let audit = audit_clean(&conf);
    assert_eq!(
        left(),
        0,
        "the next store open must remove a killed process's temp file"
    );
    assert!(
        !conf.store_dir().join("ips/10.23.0.3").exists(),
        "the killed allocation's claim of 10.23.0.3 is still there"
    );
    assert_eq!(audit.orphans.len(), 1, "{audit:?}");
    assert_eq!(audit.tmp_files, 0);
    assert!(audit.reservations.is_empty());
    // The orphans are not held: the search reaches them first and reuses them.
    assert_eq!(add(&conf, "c1"), vec![ip("10.23.0.3")]);
    assert_eq!(add(&conf, "c2"), vec![ip("10.23.0.4")]);
    let mut got = HashSet::new();
    for i in 3..6 {
        got.extend(add(&conf, &format!("c{i}")));
    }
    assert_eq!(got.len(), 3);
    let audit = audit_clean(&conf);
    assert!(audit.orphans.is_empty());
    assert_eq!(audit.tmp_files, 0, "{audit:?}");
    let mut doc = netconf_json(dir.path(), v4("10.23.0.0/29"));
    doc["cni.dev/valid-attachments"] = json!([]);
    ipam::gc(&parse(&doc, Command::Gc), &env("GC", "", "", &[]), b"{}")
        .unwrap_or_else(|e| panic!("GC: {e}"));
    let audit = audit_clean(&conf);
    assert_eq!((audit.tmp_files, audit.reservations.len()), (0, 0));
}

#[test]
fn stale_index_is_corrected() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.24.0.0/29"));
    for i in 0..5 {
        add(&conf, &format!("c{i}"));
    }
    for i in 0..5 {
        del(&conf, &format!("c{i}"));
    }
    // Corrupt the index so it claims every address is taken (a /29 range of six
    // addresses has a one-byte bitmap): the search rebuilds it before reporting exhaustion.
    let index = conf.store_dir().join("index");
    for e in std::fs::read_dir(&index).unwrap_or_else(|e| panic!("{e}")) {
        let p = e.unwrap_or_else(|e| panic!("{e}")).path();
        std::fs::write(&p, vec![0xffu8; 1]).unwrap_or_else(|e| panic!("{e}"));
    }
    for i in 0..5 {
        add(&conf, &format!("d{i}"));
    }
    audit_clean(&conf);
}

#[test]
fn lock_timeout_is_try_again() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.25.0.0/24"));
    add(&conf, "c1");
    let holder = Store::open(&conf.store_dir(), &StoreOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no store"));
    let opts = StoreOptions {
        lock_timeout: Duration::from_millis(300),
        ..StoreOptions::default()
    };
    let start = Instant::now();
    match Store::open(&conf.store_dir(), &opts) {
        Err(e @ Error::TryAgain(_)) => {
            assert_eq!(e.code(), 11);
            assert!(e.to_string().contains("locked by another operation"), "{e}");
        }
        other => panic!("a held lock must give error 11: {other:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "waited {waited:?}"
    );
    drop(holder);
    add(&conf, "c2");
}

#[test]
fn unsafe_store_paths_are_refused() {
    let dir = data_dir();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap_or_else(|e| panic!("{e}"));

    // A symlink anywhere on the path.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap_or_else(|e| panic!("{e}"));
    let conf = netconf(&link, v4("10.26.0.0/24"));
    let e = add_err(&conf, "c1", &[]);
    assert_eq!(e.code(), 7);
    // ADD's validation already sees it, before any side effect.
    let v = ipam::validate(&conf, &env("ADD", "c1", "eth0", &[]));
    assert!(
        matches!(&v, Err(Error::InvalidConfig { field, .. }) if field == "dataDir"),
        "{v:?}"
    );
    assert!(
        e.to_string()
            .contains(&format!("{} is a symbolic link", link.display())),
        "{e}"
    );
    // The store directory itself as a symlink.
    let conf = netconf(&real, v4("10.26.0.0/24"));
    std::os::unix::fs::symlink(dir.path(), real.join(crate::common::NETWORK))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = add_err(&conf, "c1", &[]);
    assert!(e.to_string().contains("is a symbolic link"), "{e}");
    std::fs::remove_file(real.join(crate::common::NETWORK)).unwrap_or_else(|e| panic!("{e}"));

    // Group- or world-writable data directory (sticky or not).
    for mode in [0o777, 0o1777, 0o770] {
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("{e}"));
        let e = add_err(&conf, "c1", &[]);
        assert!(
            e.to_string()
                .contains(&format!("{} is group- or world-writable", real.display())),
            "mode {mode:o}: {e}"
        );
    }
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));

    // A foreign owner (needs root to arrange).
    if nix::unistd::geteuid().is_root() {
        let store = conf.store_dir();
        std::fs::create_dir(&store).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&store, Some(4242), Some(4242)).unwrap_or_else(|e| panic!("{e}"));
        let e = add_err(&conf, "c1", &[]);
        assert!(e.to_string().contains("is owned by uid 4242"), "{e}");
        std::os::unix::fs::chown(&store, Some(0), Some(0)).unwrap_or_else(|e| panic!("{e}"));
    }
    // A sticky world-writable ancestor (like /tmp) is fine.
    let sticky = dir.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777))
        .unwrap_or_else(|e| panic!("{e}"));
    let conf = netconf(&sticky.join("data"), v4("10.26.0.0/24"));
    add(&conf, "c1");
    // And the now fixed original path works.
    let conf = netconf(&real, v4("10.26.0.0/24"));
    add(&conf, "c1");
}

#[test]
fn verbs_on_a_missing_store_create_nothing() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.27.0.0/24"));
    del(&conf, "c1");
    assert!(list(&conf).is_empty());
    assert!(ipam::audit(&conf)
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    assert!(!conf.store_dir().exists());
    // STATUS creates and probes it.
    ipam::status(&conf, &env("STATUS", "", "", &[]), b"{}").unwrap_or_else(|e| panic!("{e}"));
    assert!(conf.store_dir().is_dir());
}

#[test]
fn validate_has_no_side_effects() {
    let dir = data_dir();
    let conf = netconf(dir.path(), v4("10.28.0.0/24"));
    ipam::validate(
        &conf,
        &env("ADD", "c1", "eth0", &[("CNI_ARGS", "IP=10.28.0.9")]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!conf.store_dir().exists());
    let e = ipam::validate(
        &conf,
        &env("ADD", "c1", "eth0", &[("CNI_ARGS", "IP=10.29.0.9")]),
    );
    assert!(matches!(e, Err(Error::Ipam(_))), "{e:?}");
    let bad = netconf(dir.path(), json!({"type": "no-such-ipam-plugin"}));
    match ipam::validate(&bad, &env("ADD", "c1", "eth0", &[])) {
        Err(e @ Error::InvalidConfig { .. }) => {
            assert!(
                e.to_string()
                    .contains("not found in CNI_PATH (/usr/lib/cni)"),
                "{e}"
            );
        }
        other => panic!("a missing delegate must be a config error: {other:?}"),
    }
}

/// Unmounts (lazily) on drop, also when the test panics.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("unmounting {}: {e}", self.0.display());
        }
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn full_filesystem_is_a_clear_error_and_the_store_survives() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test mounts a tmpfs and must run as root"
    );
    let dir = data_dir();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap_or_else(|e| panic!("{e}"));
    nix::mount::mount(
        Some("tmpfs"),
        &mnt,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some("size=64k,mode=0755"),
    )
    .unwrap_or_else(|e| panic!("mounting a tmpfs on {}: {e}", mnt.display()));
    let _guard = Mount(mnt.clone());

    let conf = netconf(&mnt, v4("10.50.0.0/24"));
    let mut held = Vec::new();
    let err = loop {
        let cid = format!("c{}", held.len());
        match ipam::add(&conf, &env("ADD", &cid, "eth0", &[]), b"{}") {
            Ok(r) => held.push((cid, r.ips[0].address)),
            Err(e) => break e,
        }
        assert!(held.len() < 250, "a 64 KiB tmpfs never filled up");
    };
    assert!(!held.is_empty(), "nothing fit at all: {err}");
    let msg = err.to_string();
    eprintln!("full after {} reservations: {msg}", held.len());
    assert_eq!(err.code(), 5, "{msg}");
    assert!(
        msg.contains("No space left on device")
            && msg.contains(&format!("container c{}", held.len())),
        "the error must say the disk is full and for whom: {msg}"
    );
    // The store is intact: every earlier reservation is there, nothing else.
    let audit = audit_clean(&conf);
    assert_eq!(audit.reservations.len(), held.len());
    assert!(audit.orphans.is_empty(), "{:?}", audit.orphans);
    for (cid, addr) in &held {
        ipam::check(&conf, &env("CHECK", cid, "eth0", &[]), b"{}", &[*addr])
            .unwrap_or_else(|e| panic!("{cid} lost {addr}: {e}"));
    }
    // Releasing frees space; allocation works again.
    let (cid, _) = held.remove(0);
    del(&conf, &cid);
    add(&conf, "after-full");
    audit_clean(&conf);
}

#[test]
fn large_ranges() {
    let dir = data_dir();
    let conf = netconf(
        dir.path(),
        json!({"ranges": [[{"subnet": "10.0.0.0/8"}], [{"subnet": "fd00:60::/64"}]]}),
    );
    assert_eq!(add(&conf, "a"), vec![ip("10.0.0.2"), ip("fd00:60::2")]);
    assert_eq!(add(&conf, "b"), vec![ip("10.0.0.3"), ip("fd00:60::3")]);
    del(&conf, "a");
    assert_eq!(add(&conf, "c"), vec![ip("10.0.0.4"), ip("fd00:60::4")]);
    // The /8 has a 2 MiB index bitmap, written sparse; the /64 has none (probed).
    let index = conf.store_dir().join("index");
    let entries: Vec<_> = std::fs::read_dir(&index)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let meta = std::fs::metadata(&entries[0]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(meta.len(), (1u64 << 24) / 8);
    assert!(meta.blocks() * 512 <= 64 * 1024, "{} blocks", meta.blocks());
    audit_clean(&conf);
}

#[test]
fn runtime_ip_ranges_serve_one_conflist_on_every_node() {
    // One conflist for the whole cluster (no ranges of its own); the runtime
    // passes each node's pod CIDR as the `ipRanges` capability, in host-local's schema.
    for (node_cidr, want) in [("10.61.1.0/24", "10.61.1.2"), ("10.61.2.0/24", "10.61.2.2")] {
        let dir = data_dir();
        let mut doc = netconf_json(dir.path(), json!({ "routes": [{ "dst": "0.0.0.0/0" }] }));
        doc["runtimeConfig"] = json!({ "ipRanges": [[{ "subnet": node_cidr }]] });
        let conf = parse(&doc, Command::Add);
        assert_eq!(add(&conf, "c0"), vec![ip(want)], "node with {node_cidr}");
        del(&conf, "c0");
    }
    // With ranges of its own, the runtime's come first (as host-local serves them).
    let dir = data_dir();
    let mut doc = netconf_json(dir.path(), v4("10.62.0.0/24"));
    doc["runtimeConfig"] = json!({ "ipRanges": [[{ "subnet": "fd00:62::/64" }]] });
    let conf = parse(&doc, Command::Add);
    let got = add(&conf, "c1");
    assert_eq!(
        got,
        vec![ip("fd00:62::2"), ip("10.62.0.2")],
        "runtime range set first"
    );
    // The node's pod CIDR both in `ipam.ranges` (as `cni-ebpf install` writes it) and
    // passed by the runtime is served once: one address, not an overlap error.
    let dir = data_dir();
    let mut doc = netconf_json(dir.path(), v4("10.64.0.0/24"));
    doc["runtimeConfig"] = json!({ "ipRanges": [[{ "subnet": "10.64.0.0/24" }]] });
    let conf = parse(&doc, Command::Add);
    assert_eq!(
        add(&conf, "c2"),
        vec![ip("10.64.0.2")],
        "one set, served once"
    );
    // A runtime range that overlaps without being the same set is still refused.
    doc["runtimeConfig"] = json!({ "ipRanges": [[{ "subnet": "10.64.0.0/16" }]] });
    let err = cni_ebpf::cni::config::NetConf::parse(doc.to_string().as_bytes(), Command::Add)
        .and_then(|c| cni_ebpf::ipam::Ipam::parse(&c.ipam))
        .err()
        .unwrap_or_else(|| panic!("an overlapping runtime range was accepted"));
    assert_eq!(err.code(), 7, "{err}");
    assert!(err.to_string().contains("overlap"), "{err}");
    // A bad runtime range is error 7 naming it.
    let mut bad = netconf_json(dir.path(), json!({}));
    bad["runtimeConfig"] = json!({ "ipRanges": [[{ "subnet": "10.63.0.0/33" }]] });
    let err = cni_ebpf::cni::config::NetConf::parse(bad.to_string().as_bytes(), Command::Add)
        .err()
        .unwrap_or_else(|| panic!("a /33 runtime range was accepted"));
    assert_eq!(err.code(), 7, "{err}");
    assert!(
        err.to_string()
            .contains("runtimeConfig.ipRanges[0][0].subnet"),
        "{err}"
    );
}
