//! Allocate+release latency of the embedded IPAM through the public API (`ipam::add` then
//! `ipam::del`, each opening, checking and locking the store like a plugin process does),
//! with 0, 1 000 and 60 000 existing reservations in a /16.
//!
//! Run: `cargo bench -p cni-ebpf --bench ipam` (set `IPAM_BENCH_DIR` to measure on another
//! filesystem; `IPAM_BENCH_ITERATIONS` to change the sample count).

#![expect(
    clippy::panic,
    reason = "a benchmark fails by panicking with a message"
)]

use std::{
    collections::HashMap,
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cni_ebpf::{
    cni::{
        config::NetConf,
        env::{Command, Env},
    },
    ipam::{self, config::Ipam, Allocator, Requester, StoreOptions},
};
use serde_json::json;

fn env(command: &str, container_id: &str) -> Env {
    let vars: HashMap<&str, String> = HashMap::from([
        ("CNI_COMMAND", command.to_owned()),
        ("CNI_CONTAINERID", container_id.to_owned()),
        ("CNI_IFNAME", "eth0".to_owned()),
        ("CNI_NETNS", format!("/var/run/netns/{container_id}")),
        ("CNI_PATH", "/usr/lib/cni".to_owned()),
    ]);
    Env::from_lookup(|k| vars.get(k).map(OsString::from))
        .unwrap_or_else(|e| panic!("environment: {e}"))
}

fn conf(dir: &Path) -> NetConf {
    let doc = json!({
        "cniVersion": "1.1.0", "name": "bench", "type": "cni-ebpf", "dataDir": dir,
        "ipam": {"ranges": [[{"subnet": "10.128.0.0/16"}]]}
    });
    NetConf::parse(doc.to_string().as_bytes(), Command::Add)
        .unwrap_or_else(|e| panic!("config: {e}"))
}

fn populate(conf: &NetConf, n: usize) {
    let Ok(Ipam::Embedded(cfg)) = Ipam::parse(&conf.ipam) else {
        panic!("not an embedded config");
    };
    let mut alloc = Allocator::open(
        &conf.store_dir(),
        &conf.name,
        &cfg,
        &StoreOptions::default(),
    )
    .unwrap_or_else(|e| panic!("opening the store: {e}"))
    .unwrap_or_else(|| panic!("no store"));
    for i in 0..n {
        alloc
            .allocate(
                &format!("existing-{i}"),
                "eth0",
                Requester::default(),
                &[None],
            )
            .unwrap_or_else(|e| panic!("populating #{i}: {e}"));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() {
    // `cargo test --benches` runs this with `--test`-ish flags; keep that quick.
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    let base: PathBuf = std::env::var_os("IPAM_BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    let iterations: usize = std::env::var("IPAM_BENCH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 20 } else { 2000 });
    let sizes: &[usize] = if quick {
        &[0, 100]
    } else {
        &[0, 1_000, 60_000]
    };
    println!(
        "ipam allocate+release through ipam::add + ipam::del, {iterations} samples, store under {}",
        base.display()
    );
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "existing", "p50", "p90", "p99", "max", "populate"
    );
    for &n in sizes {
        let dir = tempfile::Builder::new()
            .prefix("ipam-bench-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| panic!("temp dir in {}: {e}", base.display()));
        let conf = conf(dir.path());
        let t = Instant::now();
        populate(&conf, n);
        let populate_time = t.elapsed();
        // Warm up (first use of the index, page cache).
        for i in 0..10 {
            let cid = format!("warm-{i}");
            ipam::add(&conf, &env("ADD", &cid), b"{}").unwrap_or_else(|e| panic!("{e}"));
            ipam::del(&conf, &env("DEL", &cid), b"{}").unwrap_or_else(|e| panic!("{e}"));
        }
        let mut samples = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let cid = format!("bench-{i}");
            let add_env = env("ADD", &cid);
            let del_env = env("DEL", &cid);
            let t = Instant::now();
            let res = ipam::add(&conf, &add_env, b"{}");
            ipam::del(&conf, &del_env, b"{}").unwrap_or_else(|e| panic!("DEL: {e}"));
            samples.push(t.elapsed());
            res.unwrap_or_else(|e| panic!("ADD with {n} existing: {e}"));
        }
        samples.sort_unstable();
        println!(
            "{n:>12} {:>10.3?} {:>10.3?} {:>10.3?} {:>10.3?} {:>12.2?}",
            percentile(&samples, 0.5),
            percentile(&samples, 0.9),
            percentile(&samples, 0.99),
            samples[samples.len() - 1],
            populate_time
        );
        let left = ipam::list(&conf).unwrap_or_else(|e| panic!("{e}")).len();
        assert_eq!(
            left, n,
            "the benchmark must leave exactly the populated reservations"
        );
    }
}
