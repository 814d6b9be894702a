//! `cni-ebpf install` and `uninstall` run as the real binary against a temporary "host
//! root" (its `opt/cni/bin`, `etc/cni/net.d`, `var/lib/cni-ebpf` below the target
//! directory, whose ancestors pass the IPAM store's path checks): atomic writes that leave
//! no temporary file, exact bytes, idempotency, ownership of the conflist, and `--purge`
//! of the IPAM store. The pins part of `--purge` needs a bpffs and the eBPF object and is
//! ignored unless run as root (`cargo xtask test`).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, SystemTime},
};

use cni_ebpf::{
    cli::install::{plugin_config, MANAGED_KEY, TMP_PREFIX},
    cni::{config::NetConf, env::Command as Verb},
    ipam::{Allocator, Ipam, IpamConfig, Requester, StoreOptions},
};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_cni-ebpf");
const CONF: &str = "10-cni-ebpf.conflist";

/// A temporary host root.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("install-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap_or_else(|e| panic!("creating a host root: {e}"));
        Self { dir }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn bin_dir(&self) -> PathBuf {
        self.root().join("opt/cni/bin")
    }
    fn conf_dir(&self) -> PathBuf {
        self.root().join("etc/cni/net.d")
    }
    fn conflist(&self) -> PathBuf {
        self.conf_dir().join(CONF)
    }
    fn binary(&self) -> PathBuf {
        self.bin_dir().join("cni-ebpf")
    }
    fn data_dir(&self) -> PathBuf {
        self.root().join("var/lib/cni-ebpf")
    }
    fn bpffs_root(&self) -> PathBuf {
        self.root().join("sys/fs/bpf/cni-ebpf")
    }

    /// Runs `cni-ebpf <verb> --cni-bin-dir … --cni-conf-dir … <args>`.
    fn run(&self, verb: &str, args: &[&str]) -> Output {
        self.run_env(verb, args, &[])
    }
    fn run_env(&self, verb: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg(verb)
            .arg("--cni-bin-dir")
            .arg(self.bin_dir())
            .arg("--cni-conf-dir")
            .arg(self.conf_dir())
            .args(args)
            .env_remove("CNI_COMMAND")
            .env_remove("CNI_EBPF_POD_CIDR")
            // Without a pod CIDR, a node name would make install ask an API server.
            .env_remove("NODE_NAME");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("running {BIN} {verb}: {e}"))
    }
    /// Runs and asserts success; returns stdout.
    fn ok(&self, verb: &str, args: &[&str]) -> String {
        let out = self.run(verb, args);
        assert!(
            out.status.success(),
            "cni-ebpf {verb} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// Runs and asserts failure; returns stderr.
    fn fails(&self, verb: &str, args: &[&str]) -> String {
        let out = self.run(verb, args);
        assert!(
            !out.status.success(),
            "cni-ebpf {verb} {args:?} should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "nothing on stdout when failing");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
    /// `install` with the paths of this root for the pins and the store.
    fn install(&self, extra: &[&str]) -> String {
        let (bpffs, data) = (self.bpffs_root(), self.data_dir());
        let mut args = vec![
            "--bpffs-root",
            bpffs.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.ok("install", &args)
    }
    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
    fn no_tmp_files(&self) {
        for dir in [self.bin_dir(), self.conf_dir()] {
            let left: Vec<_> = Self::names(&dir)
                .into_iter()
                .filter(|n| n.starts_with(TMP_PREFIX))
                .collect();
            assert!(
                left.is_empty(),
                "temporary files left in {}: {left:?}",
                dir.display()
            );
        }
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn doc(path: &Path) -> Value {
    serde_json::from_slice(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// (inode, mtime in ns): a rewrite (temp file + rename) changes the inode.
fn identity(path: &Path) -> (u64, i64, i64) {
    let m = std::fs::metadata(path).unwrap();
    (m.ino(), m.mtime(), m.mtime_nsec())
}

/// The plugin's configuration as a runtime passes it, parsed by the plugin's own parser.
fn parse_as_runtime_passes_it(conflist: &Value) -> NetConf {
    let plugin = plugin_config(conflist).unwrap_or_else(|| panic!("no plugin in {conflist}"));
    assert!(
        plugin.get(MANAGED_KEY).is_none(),
        "the ownership mark is conflist-level"
    );
    NetConf::parse(plugin.to_string().as_bytes(), Verb::Add)
        .unwrap_or_else(|e| panic!("the plugin refuses its own conflist: {e}\n{plugin}"))
}

#[test]
fn install_writes_the_binary_and_the_conflist_exactly() {
    let host = Host::new();
    let out = host.install(&[
        "--pod-cidr",
        "10.244.1.0/24",
        "--pod-cidr",
        "fd00:10:244:1::/64",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/56",
        "--ip-masq",
        "--mtu",
        "1450",
        "--uplink",
        "eth1",
        "--attach",
        "auto",
        "--log-file",
        "/var/log/cni-ebpf.log",
    ]);
    assert!(out.contains("binary") && out.contains(": written"), "{out}");

    // The binary: this very binary, byte for byte, 0755, nothing else in the directory.
    assert_eq!(read(&host.binary()), read(Path::new(BIN)), "binary bytes");
    assert_eq!(mode(&host.binary()), 0o755);
    assert_eq!(Host::names(&host.bin_dir()), vec!["cni-ebpf"]);
    assert_eq!(Host::names(&host.conf_dir()), vec![CONF]);
    host.no_tmp_files();
    assert_eq!(mode(&host.conflist()), 0o644);

    // The conflist, exactly.
    let expected = json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        MANAGED_KEY: true,
        "plugins": [{
            "type": "cni-ebpf",
            "mtu": 1450,
            "uplink": "eth1",
            "ipMasq": true,
            "networkPolicy": true,
            "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"],
            "bpffsRoot": host.bpffs_root(),
            "dataDir": host.data_dir(),
            "logFile": "/var/log/cni-ebpf.log",
            "attach": "auto",
            "capabilities": {
                "bandwidth": true, "ipRanges": true, "ips": true, "mac": true,
                "portMappings": true
            },
            "ipam": {
                "ranges": [[{ "subnet": "10.244.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
            }
        }]
    });
    let bytes = read(&host.conflist());
    let got: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(got, expected);
    assert!(bytes.ends_with(b"}\n"), "one newline at the end");
    // Key order as written for people: version, name, the mark, then the plugin.
    let text = String::from_utf8(bytes).unwrap();
    let pos = |k: &str| text.find(k).unwrap_or_else(|| panic!("{k} missing"));
    assert!(pos("cniVersion") < pos("\"name\"") && pos("\"name\"") < pos(MANAGED_KEY));
    assert!(pos(MANAGED_KEY) < pos("plugins"));
}

#[test]
fn the_conflist_parses_with_the_plugins_parser_without_warnings() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.3.0/24", "--pod-cidr", "fd00:3::/64"]);
    let conflist = doc(&host.conflist());
    let conf = parse_as_runtime_passes_it(&conflist);
    assert_eq!(conf.name, "k8s-pod-network");
    assert!(
        conf.unknown_keys.is_empty(),
        "keys the plugin would warn about on every ADD: {:?}",
        conf.unknown_keys
    );
    assert_eq!(conf.store_dir(), host.data_dir().join("k8s-pod-network"));
    assert_eq!(conf.pin_dir(), host.bpffs_root().join("k8s-pod-network"));
    let Ok(Ipam::Embedded(cfg)) = Ipam::parse(&conf.ipam) else {
        panic!("not the embedded allocator: {}", conf.ipam)
    };
    assert_eq!(cfg.range_sets.len(), 2, "one range set per family");

    // Capability arguments as a runtime adds them parse too, and the node's own range
    // passed again through ipRanges is served once.
    let mut plugin = plugin_config(&conflist).unwrap();
    plugin["runtimeConfig"] = json!({
        "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }],
        "ipRanges": [[{ "subnet": "10.244.3.0/24" }]],
        "bandwidth": { "egressRate": 1_000_000, "egressBurst": 100_000 },
    });
    let conf = NetConf::parse(plugin.to_string().as_bytes(), Verb::Add).unwrap();
    assert!(conf.unknown_keys.is_empty(), "{:?}", conf.unknown_keys);
    let Ok(Ipam::Embedded(cfg)) = Ipam::parse(&conf.ipam) else {
        panic!("{}", conf.ipam)
    };
    assert_eq!(cfg.range_sets.len(), 2, "{:?}", conf.ipam);

    // cniVersion 1.1.0 on request; the plugin then accepts STATUS and GC with it.
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.3.0/24", "--cni-version", "1.1.0"]);
    let mut plugin = plugin_config(&doc(&host.conflist())).unwrap();
    assert_eq!(plugin["cniVersion"], "1.1.0");
    NetConf::parse(plugin.to_string().as_bytes(), Verb::Status).unwrap();
    plugin["cni.dev/valid-attachments"] = json!([]);
    NetConf::parse(plugin.to_string().as_bytes(), Verb::Gc).unwrap();
}

#[test]
fn a_second_run_with_the_same_inputs_writes_nothing() {
    let host = Host::new();
    let args = ["--pod-cidr", "10.244.1.0/24", "--ip-masq"];
    host.install(&args);
    let (bin, conf) = (identity(&host.binary()), identity(&host.conflist()));
    let (bin_bytes, conf_bytes) = (read(&host.binary()), read(&host.conflist()));
    std::thread::sleep(Duration::from_millis(20));
    let out = host.install(&args);
    assert_eq!(out.matches(": unchanged").count(), 2, "{out}");
    assert_eq!(identity(&host.binary()), bin, "binary rewritten");
    assert_eq!(identity(&host.conflist()), conf, "conflist rewritten");
    assert_eq!(read(&host.binary()), bin_bytes);
    assert_eq!(read(&host.conflist()), conf_bytes);
    host.no_tmp_files();

    // The same pod CIDRs through the environment, comma-separated, are the same inputs.
    let (bpffs, data) = (host.bpffs_root(), host.data_dir());
    let out = host.run_env(
        "install",
        &[
            "--ip-masq",
            "--bpffs-root",
            bpffs.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[("CNI_EBPF_POD_CIDR", "10.244.1.0/24")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(identity(&host.conflist()), conf, "conflist rewritten");
}

#[test]
fn changed_inputs_replace_our_conflist_atomically() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.1.0/24"]);
    let before = identity(&host.conflist());
    let out = host.install(&["--pod-cidr", "10.244.9.0/24", "--mtu", "9000"]);
    assert!(out.contains(": replaced"), "{out}");
    assert_ne!(
        identity(&host.conflist()).0,
        before.0,
        "a new file renamed over the old"
    );
    let conf = parse_as_runtime_passes_it(&doc(&host.conflist()));
    assert_eq!(conf.mtu, Some(9000));
    assert_eq!(
        conf.ipam["ranges"],
        json!([[{ "subnet": "10.244.9.0/24" }]])
    );
    host.no_tmp_files();
    assert_eq!(Host::names(&host.conf_dir()), vec![CONF]);
}

#[test]
fn a_different_binary_is_replaced_and_stale_temporary_files_are_swept() {
    let host = Host::new();
    std::fs::create_dir_all(host.bin_dir()).unwrap();
    std::fs::write(host.binary(), b"#!/bin/sh\necho an older cni-ebpf\n").unwrap();
    std::fs::set_permissions(host.binary(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // What a killed install leaves: old (swept) and fresh (another install may be writing
    // it: kept).
    let stale = host.bin_dir().join(format!("{TMP_PREFIX}stale"));
    let fresh = host.bin_dir().join(format!("{TMP_PREFIX}fresh"));
    std::fs::write(&stale, b"half").unwrap();
    std::fs::write(&fresh, b"half").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();

    let out = host.install(&["--pod-cidr", "10.244.1.0/24"]);
    assert!(out.contains("cni-ebpf: replaced"), "{out}");
    assert_eq!(read(&host.binary()), read(Path::new(BIN)));
    assert_eq!(mode(&host.binary()), 0o755);
    assert!(!stale.exists(), "a stale temporary file is swept");
    assert!(fresh.exists(), "a fresh one is left to its writer");

    // Same bytes with a wrong mode: the mode is fixed, the file is not rewritten.
    std::fs::set_permissions(host.binary(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let ino = identity(&host.binary()).0;
    let out = host.install(&["--pod-cidr", "10.244.1.0/24"]);
    assert!(out.contains("cni-ebpf: unchanged"), "{out}");
    assert_eq!(identity(&host.binary()).0, ino);
    assert_eq!(mode(&host.binary()), 0o755);
}

#[test]
fn a_foreign_conflist_is_refused_unless_forced() {
    let host = Host::new();
    std::fs::create_dir_all(host.conf_dir()).unwrap();
    let foreign = br#"{"cniVersion":"0.4.0","name":"cbr0","plugins":[{"type":"flannel"}]}"#;
    std::fs::write(host.conflist(), foreign).unwrap();

    let err = host.fails("install", &["--pod-cidr", "10.244.1.0/24"]);
    assert!(
        err.contains("was not written by cni-ebpf install") && err.contains("--force"),
        "{err}"
    );
    assert!(
        err.contains(&host.conflist().display().to_string()),
        "{err}"
    );
    assert_eq!(read(&host.conflist()), foreign, "left untouched");
    assert!(!host.binary().exists(), "nothing is written when refusing");

    // A symlink at the path is not ours either.
    let other = host.conf_dir().join("elsewhere.json");
    std::fs::rename(host.conflist(), &other).unwrap();
    std::os::unix::fs::symlink(&other, host.conflist()).unwrap();
    let err = host.fails("install", &["--pod-cidr", "10.244.1.0/24"]);
    assert!(err.contains("was not written by cni-ebpf install"), "{err}");
    std::fs::remove_file(host.conflist()).unwrap();
    std::fs::rename(&other, host.conflist()).unwrap();

    // uninstall refuses it the same way.
    let err = host.fails("uninstall", &[]);
    assert!(
        err.contains("refusing to remove it without --force"),
        "{err}"
    );
    assert_eq!(read(&host.conflist()), foreign);

    // --force takes it over; from then on it is ours.
    let out = host.install(&["--pod-cidr", "10.244.1.0/24", "--force"]);
    assert!(out.contains(": replaced"), "{out}");
    assert_eq!(doc(&host.conflist())[MANAGED_KEY], true);
    host.install(&["--pod-cidr", "10.244.2.0/24"]);
    host.no_tmp_files();
}

#[test]
fn bad_inputs_are_refused_before_anything_is_written() {
    let host = Host::new();
    for (args, needle) in [
        (vec![], "no pod CIDR"),
        (
            vec!["--pod-cidr", "10.244.1.5/24"],
            "has host bits set; the network is 10.244.1.0/24",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "10.244.1.0/24"],
            "is given twice",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "10.244.0.0/16"],
            "overlaps",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/33"],
            "invalid value '10.244.1.0/33'",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--mtu", "70000"],
            "`mtu`: 70000 is outside",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--cni-version", "2.0.0"],
            "cniVersion \"2.0.0\"",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--network-name", "a/b"],
            "`name`",
        ),
        (
            vec![
                "--pod-cidr",
                "10.244.1.0/24",
                "--uplink",
                "a-very-long-interface",
            ],
            "`uplink`",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--log-level", "loud"],
            "`logLevel`",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--data-dir", "relative"],
            "`dataDir`",
        ),
        (
            vec!["--pod-cidr", "10.244.1.0/24", "--conf-name", "10-x.conf"],
            "must end in .conflist",
        ),
        (
            vec![
                "--pod-cidr",
                "10.244.1.0/24",
                "--conf-name",
                "../x.conflist",
            ],
            "plain file name",
        ),
    ] {
        let err = host.fails("install", &args);
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
        assert!(
            !host.root().join("opt").exists(),
            "{args:?} wrote something"
        );
        assert!(
            !host.root().join("etc").exists(),
            "{args:?} wrote something"
        );
    }
}

#[test]
fn another_configuration_sorting_first_is_warned_about() {
    let host = Host::new();
    std::fs::create_dir_all(host.conf_dir()).unwrap();
    std::fs::write(host.conf_dir().join("05-other.conflist"), b"{}").unwrap();
    let out = host.run("install", &["--pod-cidr", "10.244.1.0/24"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("05-other.conflist sort(s) before 10-cni-ebpf.conflist"),
        "{err}"
    );
}

#[test]
fn uninstall_removes_our_conflist_and_the_binary() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.1.0/24"]);
    let out = host.ok("uninstall", &[]);
    assert!(out.contains("removed"), "{out}");
    assert!(Host::names(&host.conf_dir()).is_empty());
    assert!(Host::names(&host.bin_dir()).is_empty());
    // Again: nothing to do, still a success.
    let out = host.ok("uninstall", &[]);
    assert!(out.contains("none to remove"), "{out}");
}

#[test]
fn uninstall_keeps_the_binary_another_conflist_uses() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.1.0/24"]);
    let second = json!({
        "cniVersion": "1.0.0", "name": "second",
        "plugins": [{ "type": "cni-ebpf", "ipam": { "ranges": [[{ "subnet": "10.99.0.0/24" }]] } }]
    });
    std::fs::write(
        host.conf_dir().join("20-second.conflist"),
        second.to_string(),
    )
    .unwrap();
    let out = host.ok("uninstall", &[]);
    assert!(
        out.contains("kept, still used by 20-second.conflist"),
        "{out}"
    );
    assert!(!host.conflist().exists());
    assert!(host.binary().exists());
    host.ok("uninstall", &["--force"]);
    assert!(!host.binary().exists());
}

fn embedded_cfg(subnet: &str) -> IpamConfig {
    match Ipam::parse(&json!({ "ranges": [[{ "subnet": subnet }]] })) {
        Ok(Ipam::Embedded(c)) => c,
        other => panic!("{other:?}"),
    }
}

/// Reserves an address for `(cid, eth0)` in the store of `network` below `data_dir`, as
/// ADD would; `boot` simulates a reservation of an earlier boot.
fn reserve(data_dir: &Path, network: &str, cid: &str, boot: Option<&str>) {
    let cfg = embedded_cfg("10.244.1.0/24");
    let opts = StoreOptions {
        boot_id: boot.map(str::to_owned),
        ..StoreOptions::default()
    };
    let mut a = Allocator::open(&data_dir.join(network), network, &cfg, &opts)
        .unwrap()
        .unwrap();
    a.allocate(cid, "eth0", Requester::default(), &[None])
        .unwrap();
}

fn release(data_dir: &Path, network: &str, cid: &str) {
    let cfg = embedded_cfg("10.244.1.0/24");
    let mut a = Allocator::open(
        &data_dir.join(network),
        network,
        &cfg,
        &StoreOptions::default(),
    )
    .unwrap()
    .unwrap();
    a.release(cid, "eth0").unwrap();
}

#[test]
fn purge_refuses_while_pods_hold_addresses_then_removes_the_store() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.1.0/24"]);
    let store = host.data_dir().join("k8s-pod-network");
    reserve(&host.data_dir(), "k8s-pod-network", "ctr-one", None);
    reserve(&host.data_dir(), "k8s-pod-network", "ctr-two", None);

    let err = host.fails("uninstall", &["--purge"]);
    assert!(
        err.contains("network k8s-pod-network still has 2 pod attachment(s)")
            && err.contains("ctr-one/eth0 (10.244.1.")
            && err.contains("ctr-two/eth0 (10.244.1.")
            && err.contains("nothing was removed"),
        "{err}"
    );
    assert!(host.conflist().exists() && host.binary().exists() && store.exists());

    release(&host.data_dir(), "k8s-pod-network", "ctr-one");
    release(&host.data_dir(), "k8s-pod-network", "ctr-two");
    // The network's paths come from the conflist being removed.
    let out = host.ok("uninstall", &["--purge"]);
    assert!(
        out.contains(&format!("purged {}", store.display())),
        "{out}"
    );
    assert!(!store.exists());
    assert!(host.data_dir().exists(), "only the network's store goes");
    assert!(!host.conflist().exists() && !host.binary().exists());
}

#[test]
fn purge_ignores_reservations_of_an_earlier_boot() {
    let host = Host::new();
    host.install(&["--pod-cidr", "10.244.1.0/24", "--network-name", "net2"]);
    reserve(
        &host.data_dir(),
        "net2",
        "ctr-before-reboot",
        Some("an-earlier-boot"),
    );
    host.ok("uninstall", &["--purge"]);
    assert!(!host.data_dir().join("net2").exists());
}

#[test]
fn purge_without_a_conflist_uses_the_flags_and_refuses_a_directory_that_is_no_store() {
    let host = Host::new();
    let (data, bpffs) = (host.data_dir(), host.bpffs_root());
    let (data_s, bpffs_s) = (data.to_str().unwrap(), bpffs.to_str().unwrap());
    std::fs::create_dir_all(data.join("k8s-pod-network")).unwrap();
    std::fs::write(data.join("k8s-pod-network/precious"), b"not a store").unwrap();
    let err = host.fails(
        "uninstall",
        &["--purge", "--data-dir", data_s, "--bpffs-root", bpffs_s],
    );
    assert!(
        err.contains("does not look like a cni-ebpf IPAM store"),
        "{err}"
    );
    assert!(data.join("k8s-pod-network/precious").exists());

    // A real store of another network, named by the flags.
    reserve(&data, "other", "ctr", Some("an-earlier-boot"));
    let out = host.ok(
        "uninstall",
        &[
            "--purge",
            "--data-dir",
            data_s,
            "--bpffs-root",
            bpffs_s,
            "--network-name",
            "other",
        ],
    );
    assert!(out.contains("purged"), "{out}");
    assert!(!data.join("other").exists());
    let err = host.fails(
        "uninstall",
        &["--purge", "--data-dir", "relative", "--bpffs-root", bpffs_s],
    );
    assert!(
        err.contains("--data-dir relative: must be an absolute path"),
        "{err}"
    );
}

// ------------------------------------------------------------------- pins (privileged)

/// The `bpf` filters of `dev`'s `hook` as (handle, program id), read with `tc` (the
/// fixture's namespace is this thread's, which the child inherits).
fn bpf_filters(dev: &str, hook: &str) -> Vec<(u32, u64)> {
    let out = Command::new("tc")
        .args(["-j", "filter", "show", "dev", dev, hook])
        .output()
        .expect("running tc");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == "bpf")
        .filter_map(|f| {
            let h = f["options"]["handle"].as_str()?;
            let h = u32::from_str_radix(h.trim_start_matches("0x"), 16).ok()?;
            Some((h, f["options"]["prog"]["id"].as_u64().unwrap_or(0)))
        })
        .collect()
}

/// Runs `tool` (`ip`, `tc`) with `args` in the fixture's namespace; its output.
fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) -> String {
    run("ip", args)
}

fn tc(args: &[&str]) {
    run("tc", args);
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn purge_removes_pins_and_filters_only_when_no_pod_is_left() {
    use cni_ebpf::datapath::{
        attach::{uplink_handle, TC_HANDLE},
        Pins,
    };
    use testbed::packet::{Fixture, POD_A, POD_B};

    let fx = Fixture::with_two_pods();
    let net_dir = fx.network_dir();
    let bpffs_root = net_dir.parent().unwrap().to_owned();
    let host = Host::new();
    let (root, data) = (bpffs_root.to_str().unwrap(), host.data_dir());
    let data = data.to_str().unwrap();
    host.ok(
        "install",
        &[
            "--pod-cidr",
            "10.244.1.0/24",
            "--network-name",
            "net",
            "--bpffs-root",
            root,
            "--data-dir",
            data,
        ],
    );
    // Filters as ADD and the uplink attachment leave them (veth-a stands for the uplink,
    // veth-b for a host veth a killed DEL left), and a foreign filter running our program
    // at another handle, which is not ours to remove.
    let handle = uplink_handle(&net_dir);
    let pins = Pins::new(&net_dir);
    let progs = |name: &str| pins.prog(name);
    let (ingress, egress, from_pod) = (
        progs("uplink_ingress"),
        progs("uplink_egress"),
        progs("from_pod"),
    );
    for dev in ["veth-a", "veth-b"] {
        tc(&["qdisc", "add", "dev", dev, "clsact"]);
    }
    for (dev, hook, handle, pin) in [
        ("veth-a", "ingress", handle, &ingress),
        ("veth-a", "egress", handle, &egress),
        ("veth-b", "ingress", TC_HANDLE, &from_pod),
        ("veth-b", "ingress", 0x1234, &from_pod),
    ] {
        let handle = format!("{handle:#x}");
        tc(&[
            "filter",
            "add",
            "dev",
            dev,
            hook,
            "prio",
            "1",
            "handle",
            &handle,
            "bpf",
            "object-pinned",
            pin.to_str().unwrap(),
            "da",
        ]);
    }
    assert_eq!(bpf_filters("veth-b", "ingress").len(), 2);
    // A route to another node's pods as the agent keeps it (proto 207), and one of
    // someone else's: only ours goes.
    for args in [
        &["link", "set", "veth-a", "up"][..],
        &["link", "set", "veth-b", "up"],
        &["addr", "add", "192.0.2.1/24", "dev", "veth-a"],
        &[
            "route",
            "add",
            "198.51.100.0/24",
            "via",
            "192.0.2.2",
            "proto",
            "207",
        ],
        &["route", "add", "203.0.113.0/24", "via", "192.0.2.2"],
    ] {
        ip(args);
    }

    // Two pods in the owner map: refused, nothing removed.
    let err = host.fails("uninstall", &["--purge"]);
    assert!(
        err.contains("still has 2 pod attachment(s)")
            && err.contains(&format!("ctr-a/eth0 ({POD_A})"))
            && err.contains(&format!("ctr-b/eth0 ({POD_B})")),
        "{err}"
    );
    assert!(pins.complete() && host.conflist().exists());

    let dp = fx.dp();
    let mut errors = Vec::new();
    dp.remove_pod("ctr-a", "eth0", "veth-ctr-a", &[POD_A.into()], &mut errors);
    dp.remove_pod("ctr-b", "eth0", "veth-ctr-b", &[POD_B.into()], &mut errors);
    assert!(errors.is_empty(), "{errors:?}");

    let out = host.ok("uninstall", &["--purge"]);
    assert!(out.contains("tc filters removed: 3"), "{out}");
    assert!(
        out.contains("routes to other nodes' pods removed: 1"),
        "{out}"
    );
    let routes = ip(&["route", "show"]);
    assert!(!routes.contains("198.51.100.0/24"), "{routes}");
    assert!(routes.contains("203.0.113.0/24"), "{routes}");
    assert!(
        out.contains(&format!("purged {}", net_dir.display())),
        "{out}"
    );
    assert!(
        !net_dir.exists(),
        "pin directory left: {}",
        net_dir.display()
    );
    assert!(bpf_filters("veth-a", "ingress").is_empty());
    assert!(bpf_filters("veth-a", "egress").is_empty());
    let left = bpf_filters("veth-b", "ingress");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, 0x1234, "only the foreign filter is left");
    assert!(!host.conflist().exists() && !host.binary().exists());
}
