//! Many OS processes against one store: concurrency (no address twice, every release
//! returns its address, the store ends empty) and crash safety (SIGKILL at random points,
//! hundreds of times). The workers are this test binary re-executed in worker mode.

use std::{
    collections::{HashMap, HashSet},
    fs::{File, OpenOptions},
    io::Write,
    net::IpAddr,
    path::PathBuf,
    process::{Child, Command as Process, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::common::{audit_clean, data_dir, env, list, netconf, parse};
use cni_ebpf::{
    cni::{config::NetConf, env::Command},
    error::Error,
    ipam,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use serde_json::{json, Value};

/// Set in a re-executed child: what to do (JSON).
const WORKER_ENV: &str = "CNI_EBPF_IPAM_TEST_WORKER";

/// Small xorshift generator: reproducible from a logged seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    std::env::var("IPAM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

fn conc_ipam() -> Value {
    json!({"ranges": [[{"subnet": "10.30.0.0/24"}]]})
}

fn crash_ipam() -> Value {
    json!({"ranges": [[{"subnet": "10.31.0.0/24"}], [{"subnet": "fd00:31::/120"}]]})
}

/// Entry point of worker processes; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let spec: Value =
        serde_json::from_str(&spec).unwrap_or_else(|e| panic!("bad worker spec {spec}: {e}"));
    let code = match spec["mode"].as_str() {
        Some("concurrency") => concurrency_worker(&spec),
        Some("crash") => crash_worker(&spec),
        other => panic!("unknown worker mode {other:?}"),
    };
    std::process::exit(code);
}

fn spawn_worker(spec: &Value) -> Child {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    Process::new(exe)
        .args([
            "process::worker_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(WORKER_ENV, spec.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning a worker: {e}"))
}

fn conf_from(spec: &Value, ipam: Value) -> NetConf {
    let dir = PathBuf::from(spec["dataDir"].as_str().unwrap_or_default());
    netconf(&dir, ipam)
}

fn log_line(log: &mut File, line: &str) {
    // One write(2) per line: a SIGKILL cannot tear it.
    log.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("writing the worker log: {e}"));
}

/// Holds up to four keys at a time, adding and deleting at random. Every address it gets
/// is marked by creating `claims/<address>` with O_EXCL before anything else: if another
/// worker still holds it, that creation fails and the worker reports the duplicate.
fn concurrency_worker(spec: &Value) -> i32 {
    let conf = conf_from(spec, conc_ipam());
    let id = spec["id"].as_u64().unwrap_or_default();
    let ops = spec["ops"].as_u64().unwrap_or_default();
    let claims = PathBuf::from(spec["claims"].as_str().unwrap_or_default());
    let (mut log, mut rng) = log_and_rng(spec);
    let mut held: Vec<(String, IpAddr)> = Vec::new();
    let mut next = 0u64;
    let release = |cid: &str, ip: IpAddr, log: &mut File| -> Result<(), String> {
        std::fs::remove_file(claims.join(ip.to_string()))
            .map_err(|e| format!("removing the claim marker of {ip}: {e}"))?;
        let del_env = env("DEL", cid, "eth0", &[]);
        ipam::del(&conf, &del_env, b"{}").map_err(|e| format!("DEL {cid}: {e}"))?;
        // The address is no longer this key's.
        match ipam::check(&conf, &env("CHECK", cid, "eth0", &[]), b"{}", &[]) {
            Err(Error::Check(_)) => {}
            other => return Err(format!("{cid} still holds an address after DEL: {other:?}")),
        }
        log_line(log, &format!("del {cid} {ip}"));
        Ok(())
    };
    for _ in 0..ops {
        let do_add = held.is_empty() || (held.len() < 4 && rng.below(2) == 0);
        if do_add {
            next += 1;
            let cid = format!("w{id}-{next}");
            let res = match ipam::add(&conf, &env("ADD", &cid, "eth0", &[]), b"{}") {
                Ok(r) => r,
                Err(e) => {
                    log_line(&mut log, &format!("error ADD {cid}: {e}"));
                    return 2;
                }
            };
            let ip = res.ips[0].address.addr();
            if let Err(e) = File::options()
                .write(true)
                .create_new(true)
                .open(claims.join(ip.to_string()))
            {
                log_line(
                    &mut log,
                    &format!("DUPLICATE {ip} given to {cid} while held: {e}"),
                );
                return 3;
            }
            log_line(&mut log, &format!("add {cid} {ip}"));
            held.push((cid, ip));
        } else {
            let i = usize::try_from(rng.below(held.len() as u64)).unwrap_or(0);
            let (cid, ip) = held.swap_remove(i);
            if let Err(e) = release(&cid, ip, &mut log) {
                log_line(&mut log, &format!("error {e}"));
                return 4;
            }
        }
    }
    for (cid, ip) in std::mem::take(&mut held) {
        if let Err(e) = release(&cid, ip, &mut log) {
            log_line(&mut log, &format!("error {e}"));
            return 4;
        }
    }
    0
}

#[test]
fn eight_processes_share_one_slash_24() {
    const WORKERS: u64 = 8;
    const OPS: u64 = 250;
    let dir = data_dir();
    let claims = dir.path().join("claims");
    std::fs::create_dir(&claims).unwrap_or_else(|e| panic!("{e}"));
    let seed = seed();
    eprintln!("seed {seed} (set IPAM_TEST_SEED to reproduce)");
    let start = Instant::now();
    let children: Vec<(u64, Child, PathBuf)> = (0..WORKERS)
        .map(|id| {
            let log = dir.path().join(format!("worker-{id}.log"));
            let spec = json!({
                "mode": "concurrency", "dataDir": dir.path(), "id": id, "ops": OPS,
                "claims": claims, "log": log, "seed": seed.wrapping_add(id * 7919),
            });
            (id, spawn_worker(&spec), log)
        })
        .collect();
    let mut adds: HashMap<IpAddr, usize> = HashMap::new();
    let mut failures = Vec::new();
    for (id, mut child, log) in children {
        let status = child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for worker {id}: {e}"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if !status.success() {
            let tail: Vec<_> = text.lines().rev().take(3).collect();
            failures.push(format!("worker {id} exited with {status}: {tail:?}"));
        }
        for line in text.lines() {
            let mut w = line.split(' ');
            if w.next() == Some("add") {
                if let Some(ip) = w.nth(1).and_then(|s| s.parse().ok()) {
                    *adds.entry(ip).or_default() += 1;
                }
            }
        }
    }
    assert!(failures.is_empty(), "workers failed: {failures:#?}");
    let elapsed = start.elapsed();
    let total: usize = adds.values().sum();
    eprintln!(
        "{WORKERS} processes x {OPS} operations in {elapsed:?}: {total} ADDs over {} addresses",
        adds.len()
    );
    assert!(total >= usize::try_from(WORKERS * OPS / 2).unwrap_or(0));
    assert!(
        adds.values().any(|n| *n > 1),
        "released addresses must be handed out again"
    );

    // The store is empty and consistent, and every address is free again: exactly the
    // 253 usable addresses of the /24 can be allocated.
    let conf = netconf(dir.path(), conc_ipam());
    assert!(list(&conf).is_empty(), "{:?}", list(&conf));
    let audit = audit_clean(&conf);
    assert!(
        audit.orphans.is_empty() && audit.tmp_files == 0,
        "{audit:?}"
    );
    let claims_left = std::fs::read_dir(&claims).map(Iterator::count).unwrap_or(0);
    assert_eq!(claims_left, 0);
    let mut fresh = HashSet::new();
    for i in 0..253 {
        fresh.extend(crate::common::add(&conf, &format!("final-{i}")));
    }
    assert_eq!(fresh.len(), 253);
    let e = ipam::add(&conf, &env("ADD", "one-too-many", "eth0", &[]), b"{}");
    assert!(matches!(e, Err(Error::Ipam(_))), "{e:?}");
}

/// Adds (and often deletes) keys as fast as it can until killed, logging `A <cid>` before
/// and `a <cid>` after each ADD, `D`/`d` around each DEL.
/// A worker's log (appended to) and random generator, as its spec names them.
fn log_and_rng(spec: &Value) -> (std::fs::File, Rng) {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(spec["log"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("opening the log: {e}"));
    (log, Rng::new(spec["seed"].as_u64().unwrap_or(1)))
}

fn crash_worker(spec: &Value) -> i32 {
    let conf = conf_from(spec, crash_ipam());
    let prefix = spec["prefix"].as_str().unwrap_or_default().to_owned();
    let (mut log, mut rng) = log_and_rng(spec);
    for i in 0.. {
        let cid = format!("{prefix}-{i}");
        log_line(&mut log, &format!("A {cid}"));
        match ipam::add(&conf, &env("ADD", &cid, "eth0", &[]), b"{}") {
            Ok(_) => log_line(&mut log, &format!("a {cid}")),
            Err(Error::Ipam(_)) => {
                // Full: make room, as the parent will also do between rounds.
                log_line(&mut log, &format!("x {cid}"));
                if let Ok(all) = ipam::list(&conf) {
                    if let Some(r) = all.first() {
                        let victim = r.container_id.clone();
                        log_line(&mut log, &format!("D {victim}"));
                        let _ = ipam::del(&conf, &env("DEL", &victim, "eth0", &[]), b"{}");
                        log_line(&mut log, &format!("d {victim}"));
                    }
                }
                continue;
            }
            Err(e) => {
                log_line(&mut log, &format!("error ADD {cid}: {e}"));
                return 2;
            }
        }
        if rng.below(10) < 7 {
            log_line(&mut log, &format!("D {cid}"));
            if let Err(e) = ipam::del(&conf, &env("DEL", &cid, "eth0", &[]), b"{}") {
                log_line(&mut log, &format!("error DEL {cid}: {e}"));
                return 2;
            }
            log_line(&mut log, &format!("d {cid}"));
        }
    }
    0
}

/// What the logs say about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// ADD completed, no DEL started.
    Present,
    /// DEL completed (or ADD failed cleanly).
    Absent,
    /// ADD or DEL in flight when the worker died: fully present or absent.
    Either,
}

fn expectations(logs: &[PathBuf]) -> HashMap<String, Expect> {
    let mut out = HashMap::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines() {
            let Some((op, cid)) = line.split_once(' ') else {
                continue;
            };
            let state = match op {
                "A" | "D" => Expect::Either,
                "a" => Expect::Present,
                "d" | "x" => Expect::Absent,
                _ => continue,
            };
            out.insert(cid.to_owned(), state);
        }
    }
    out
}

#[test]
fn sigkill_at_random_points_loses_nothing() {
    const ROUNDS: u64 = 200;
    const WORKERS: u64 = 2;
    let dir = data_dir();
    let conf = netconf(dir.path(), crash_ipam());
    let seed = seed();
    eprintln!("seed {seed} (set IPAM_TEST_SEED to reproduce)");
    let mut rng = Rng::new(seed);
    let mut logs: Vec<PathBuf> = Vec::new();
    let mut in_flight_kills = 0u64;
    let mut parent_deleted: HashSet<String> = HashSet::new();
    let mut rounds_with_leftovers = 0u64;
    let mut leftovers = 0usize;
    let start = Instant::now();
    for round in 0..ROUNDS {
        let mut children = Vec::new();
        for w in 0..WORKERS {
            let log = dir.path().join(format!("r{round}-w{w}.log"));
            let spec = json!({
                "mode": "crash", "dataDir": dir.path(), "prefix": format!("r{round}w{w}"),
                "log": log, "seed": rng.next(),
            });
            children.push(spawn_worker(&spec));
            logs.push(log);
        }
        // Wait until every worker has begun its first operation (exec and the test
        // harness take a while on a loaded machine), let them run a random while, kill.
        let round_logs = &logs[logs.len() - children.len()..];
        let deadline = Instant::now() + Duration::from_secs(30);
        while !round_logs
            .iter()
            .all(|l| std::fs::metadata(l).is_ok_and(|m| m.len() > 0))
        {
            assert!(
                Instant::now() < deadline,
                "workers did not start within 30 s"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
        for child in &mut children {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
            kill(pid, Signal::SIGKILL).unwrap_or_else(|e| panic!("killing worker {pid}: {e}"));
        }
        for mut child in children {
            let status = child.wait().unwrap_or_else(|e| panic!("waiting: {e}"));
            assert!(
                status.code().is_none(),
                "a worker exited by itself ({status}) instead of being killed: see {:?}",
                &logs[logs.len() - usize::try_from(WORKERS).unwrap_or(1)..]
            );
        }
        // Kills that landed inside an ADD or DEL.
        for log in &logs[logs.len() - usize::try_from(WORKERS).unwrap_or(1)..] {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("A ") || l.starts_with("D "))
            {
                in_flight_kills += 1;
            }
        }
        let now = verify(&conf, &logs, &parent_deleted, round);
        if now > leftovers {
            rounds_with_leftovers += 1;
        }
        leftovers = now;
        // Keep the store from filling up: release a random half between rounds.
        if round % 10 == 9 {
            for r in list(&conf) {
                if rng.below(2) == 0 {
                    crate::common::del(&conf, &r.container_id);
                    parent_deleted.insert(r.container_id);
                }
            }
        }
    }
    let kills = ROUNDS * WORKERS;
    eprintln!(
        "{kills} SIGKILLs in {:?}, {in_flight_kills} inside an ADD or DEL, \
         {rounds_with_leftovers} left new uncommitted claims or temporary files",
        start.elapsed()
    );
    assert!(
        in_flight_kills * 4 >= kills,
        "too few kills landed inside an operation ({in_flight_kills} of {kills})"
    );

    // Nothing is lost for good: after releasing everything and a GC, every address of
    // both range sets can be allocated again (253 IPv4 = the limit; IPv6 /120 has 254).
    for r in list(&conf) {
        crate::common::del(&conf, &r.container_id);
    }
    let mut doc = crate::common::netconf_json(dir.path(), crash_ipam());
    doc["cni.dev/valid-attachments"] = json!([]);
    ipam::gc(&parse(&doc, Command::Gc), &env("GC", "", "", &[]), b"{}")
        .unwrap_or_else(|e| panic!("GC: {e}"));
    let audit = audit_clean(&conf);
    assert!(
        audit.orphans.is_empty() && audit.tmp_files == 0,
        "{audit:?}"
    );
    let mut v4 = HashSet::new();
    for i in 0..253 {
        v4.insert(crate::common::add(&conf, &format!("final-{i}"))[0]);
    }
    assert_eq!(v4.len(), 253);
}

/// Checks the store after a round; returns the crash leftovers it holds (uncommitted
/// claims plus temporary files).
fn verify(conf: &NetConf, logs: &[PathBuf], parent_deleted: &HashSet<String>, round: u64) -> usize {
    let audit = audit_clean(conf);
    let held: HashMap<&str, &ipam::Reservation> = audit
        .reservations
        .iter()
        .map(|r| (r.container_id.as_str(), r))
        .collect();
    for r in &audit.reservations {
        assert_eq!(
            r.addresses.len(),
            2,
            "round {round}: {} is only partly present: {r:?}",
            r.container_id
        );
        assert!(
            r.addresses[0].is_ipv4() && r.addresses[1].is_ipv6(),
            "{r:?}"
        );
    }
    let mut expect = expectations(logs);
    for cid in parent_deleted {
        expect.insert(cid.clone(), Expect::Absent);
    }
    for (cid, e) in &expect {
        let present = held.contains_key(cid.as_str());
        match e {
            Expect::Present => assert!(
                present,
                "round {round}: {cid} completed its ADD but is gone ({})",
                describe(logs, cid)
            ),
            Expect::Absent => assert!(
                !present,
                "round {round}: {cid} completed its DEL but is still there ({})",
                describe(logs, cid)
            ),
            Expect::Either => {}
        }
    }
    for cid in held.keys() {
        assert!(
            expect.contains_key(*cid),
            "round {round}: {cid} is reserved but no worker ever asked for it"
        );
    }
    audit.orphans.len() + audit.tmp_files
}

fn describe(logs: &[PathBuf], cid: &str) -> String {
    logs.iter()
        .filter_map(|l| std::fs::read_to_string(l).ok())
        .flat_map(|t| {
            t.lines()
                .filter(|l| l.ends_with(&format!(" {cid}")))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join(", ")
}
