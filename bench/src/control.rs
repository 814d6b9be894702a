//! Control plane: ADD, CHECK and DEL latency over N pods, through libcni (a client process
//! per operation, and libcni embedded in a long-lived client as runtimes run it) and by
//! direct exec, with 1 and 2 parallel workers; ADD throughput (pods/s) and the peak RSS
//! of one ADD. The headline rows are plain pods (no host port), the pods users create
//! most; pods holding one TCP host port each (the reference adds its `portmap` plugin's
//! iptables work) are their own rows, through libcni.
//!
//! Each run ADDs every pod (phase wall time gives pods/s), then CHECKs every pod, then DELs
//! every pod, so the node goes back to empty between runs. A warm-up ADD+DEL first does
//! what happens once per node (cni-ebpf: load and pin the programs; reference: create the
//! bridge and the iptables chains).

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

use super::{
    proc::{self, check_interrupt},
    report::{median, Report, Summary},
    topo::{BenchNode, Op, Pod, PortMap, Variant, Via, Workspace},
};

/// Sizes of the control-plane phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Pods per run.
    pub pods: usize,
    /// Worker counts (1 = sequential).
    pub workers: Vec<usize>,
    /// Paths measured.
    pub vias: Vec<Via>,
}

/// Which pods a run creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No host port.
    Plain,
    /// One TCP host port each.
    HostPort,
}

impl Kind {
    fn ports_of(self, i: usize) -> Vec<PortMap> {
        match self {
            Self::Plain => Vec::new(),
            Self::HostPort => vec![PortMap {
                host: 10_000 + u16::try_from(i % 50_000).unwrap_or(0),
                container: 80,
            }],
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Samples of one run.
#[derive(Default)]
struct Samples {
    add: Vec<f64>,
    check: Vec<f64>,
    del: Vec<f64>,
    /// CPU time (ms) and page faults of each ADD and DEL (direct exec only).
    add_cpu: Vec<f64>,
    add_faults: Vec<f64>,
    del_cpu: Vec<f64>,
    del_faults: Vec<f64>,
    add_rss: Vec<f64>,
    add_wall: f64,
    del_wall: f64,
}

/// Runs `verb` over `pods` with `workers` threads (pod i goes to worker i mod W); returns
/// the ops in pod order and the phase's wall time.
fn phase(
    node: &BenchNode,
    via: Via,
    kind: Kind,
    verb: &str,
    pods: &[Pod],
    workers: usize,
    prev: &[Option<Value>],
) -> Result<(Vec<Op>, Duration)> {
    let slots: Mutex<Vec<Option<Op>>> = Mutex::new(vec![None; pods.len()]);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let slots = &slots;
                s.spawn(move || -> Result<()> {
                    for (i, pod) in pods.iter().enumerate().skip(w).step_by(workers) {
                        check_interrupt()?;
                        let op = node.op(verb, via, pod, &kind.ports_of(i), prev[i].as_ref())?;
                        if let Ok(mut g) = slots.lock() {
                            g[i] = Some(op);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(r) => r?,
                Err(_) => anyhow::bail!("a control-plane worker panicked"),
            }
        }
        Ok(())
    })?;
    let wall = started.elapsed();
    let ops = slots
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .into_iter()
        .map(|o| o.context("an operation did not run"))
        .collect::<Result<Vec<Op>>>()?;
    Ok((ops, wall))
}

fn one_run(
    node: &BenchNode,
    via: Via,
    kind: Kind,
    pods: &[Pod],
    workers: usize,
) -> Result<Samples> {
    let none = vec![None; pods.len()];
    let (adds, add_wall) = phase(node, via, kind, "ADD", pods, workers, &none)?;
    let results: Vec<Option<Value>> = adds.iter().map(|o| Some(o.result.clone())).collect();
    let (checks, _) = phase(node, via, kind, "CHECK", pods, workers, &results)?;
    let (dels, del_wall) = phase(node, via, kind, "DEL", pods, workers, &results)?;
    Ok(Samples {
        add: adds.iter().map(|o| ms(o.wall)).collect(),
        add_rss: adds.iter().map(|o| o.maxrss_kib as f64).collect(),
        check: checks.iter().map(|o| ms(o.wall)).collect(),
        del: dels.iter().map(|o| ms(o.wall)).collect(),
        add_cpu: adds.iter().map(|o| ms(o.cpu)).collect(),
        add_faults: adds.iter().map(|o| o.faults as f64).collect(),
        del_cpu: dels.iter().map(|o| ms(o.cpu)).collect(),
        del_faults: dels.iter().map(|o| o.faults as f64).collect(),
        add_wall: add_wall.as_secs_f64(),
        del_wall: del_wall.as_secs_f64(),
    })
}

/// Best-effort DEL of every pod (after a failed run), so the next run starts empty.
fn del_all(node: &BenchNode, via: Via, kind: Kind, pods: &[Pod]) {
    for (i, pod) in pods.iter().enumerate() {
        let _ = node.op("DEL", via, pod, &kind.ports_of(i), None);
    }
}

/// The spawn floor: wall time and peak RSS of `/bin/true` started the way the plugins are.
fn spawn_floor(node: &BenchNode) -> Result<(f64, f64)> {
    let mut walls = Vec::new();
    let mut rss = 0;
    let ns = node.netns();
    for _ in 0..20 {
        let out = proc::exec(&proc::Spec {
            argv: vec![std::ffi::OsStr::new("/bin/true")],
            env: Vec::new(),
            netns: Some(&ns),
            stdin: b"",
            timeout: Duration::from_secs(10),
        })?;
        walls.push(ms(out.wall));
        rss = rss.max(out.maxrss_kib);
    }
    Ok((median(&walls), rss as f64))
}

/// Plain pods ADDed and DELed under `strace -c` for [`syscalls`].
const TRACED_PODS: usize = 5;

/// The section of the per-verb profile rows.
const PROFILE: &str = "Profile of one verb (direct exec, plain pods, 1 worker; p50)";

/// System calls per ADD and per DEL, the median over [`TRACED_PODS`] pods run under
/// `strace -f -c` (numbered after the `first` pods of the timed runs); those runs are not
/// timed.
fn syscalls(report: &mut Report, node: &BenchNode, first: usize) -> Result<()> {
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..TRACED_PODS {
        check_interrupt()?;
        let pod = node.pod(first + 1 + i)?;
        let added = node.traced("ADD", &pod, None)?;
        let deleted = node.traced("DEL", &pod, Some(&added.result))?;
        adds.push(added.syscalls as f64);
        dels.push(deleted.syscalls as f64);
    }
    let col = node.variant.key();
    for (verb, n) in [("add", &adds), ("del", &dels)] {
        report.put(
            &format!("cp.profile.{verb}.syscalls"),
            PROFILE,
            &format!("system calls per {} (strace -c)", verb.to_uppercase()),
            "calls",
            false,
            col,
            median(n),
        );
    }
    Ok(())
}

/// Runs the control-plane phase for both variants into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    let mut details = Map::new();
    for variant in [Variant::Ebpf, Variant::Reference] {
        check_interrupt()?;
        eprintln!("bench: control plane, {} ({} pods)", variant.key(), p.pods);
        let node = BenchNode::create(ws, variant, "cp")?;
        let pods = (0..p.pods)
            .map(|i| {
                check_interrupt()?;
                node.pod(i)
            })
            .collect::<Result<Vec<Pod>>>()?;
        if variant == Variant::Ebpf {
            let (wall, rss) = spawn_floor(&node)?;
            report.meta.insert(
                "spawn floor (/bin/true in the node netns)".into(),
                json!(format!("{wall:.2} ms, {rss:.0} KiB maxrss")),
            );
        }
        // Warm-up: once-per-node work, not measured.
        let warm = node.pod(p.pods)?;
        let r = node.op("ADD", Via::Direct, &warm, &[], None)?;
        node.op("DEL", Via::Direct, &warm, &[], Some(&r.result))?;
        if p.vias.contains(&Via::Direct) {
            syscalls(report, &node, p.pods)?;
        }
        if p.vias.contains(&Via::Embedded) {
            let most = p.workers.iter().copied().max().unwrap_or(1);
            node.start_sessions(most, &warm)?;
        }
        drop(warm);
        let mut vdetails = Map::new();
        let runs = p.vias.iter().map(|&v| (Kind::Plain, v)).chain(
            p.vias
                .contains(&Via::Libcni)
                .then_some((Kind::HostPort, Via::Libcni)),
        );
        for (kind, via) in runs {
            for &w in &p.workers {
                check_interrupt()?;
                let s = match one_run(&node, via, kind, &pods, w) {
                    Ok(s) => s,
                    Err(e) => {
                        if proc::interrupted() {
                            return Err(e);
                        }
                        let msg = format!(
                            "control plane {} ({kind:?} pods) via {} with {w} worker(s) failed: {e:#}",
                            variant.key(),
                            via.key()
                        );
                        eprintln!("bench: {msg}");
                        report.notes.push(msg);
                        del_all(&node, via, kind, &pods);
                        continue;
                    }
                };
                record(report, &mut vdetails, variant, via, kind, w, &s);
            }
        }
        if node.hit_portmap_check_bug() {
            report.notes.push(
                "Debian's portmap 1.1.1 fails CHECK of IPv4 pods looking for IPv6 rules \
                 (containernetworking/plugins#819); as the last plugin of the chain it has \
                 done all its work by then, so the reference CHECK is timed to that failure."
                    .into(),
            );
        }
        details.insert(variant.key().into(), Value::Object(vdetails));
    }
    report
        .details
        .insert("controlPlane".into(), Value::Object(details));
    Ok(())
}

fn record(
    report: &mut Report,
    details: &mut Map<String, Value>,
    variant: Variant,
    via: Via,
    kind: Kind,
    w: usize,
    s: &Samples,
) {
    let col = variant.key();
    let section = format!(
        "Control plane, {} via {} ({} worker{})",
        match kind {
            Kind::Plain => "plain pods",
            Kind::HostPort => "pods with one hostPort each",
        },
        match via {
            Via::Libcni => "the libcni client (one process per operation)",
            Via::Embedded => "libcni in a long-lived client (as runtimes embed it)",
            Via::Direct => "direct exec",
        },
        w,
        if w == 1 { "" } else { "s" }
    );
    let base = match kind {
        Kind::Plain => format!("cp.{}.w{w}", via.key()),
        Kind::HostPort => format!("cp.hostport.{}.w{w}", via.key()),
    };
    let mut d = Map::new();
    for (verb, samples) in [("add", &s.add), ("check", &s.check), ("del", &s.del)] {
        let sum = Summary::of(samples);
        d.insert(verb.into(), sum.json());
        for (p, v) in [
            ("p50", sum.p50),
            ("p90", sum.p90),
            ("p99", sum.p99),
            ("max", sum.max),
        ] {
            report.put(
                &format!("{base}.{verb}.{p}"),
                &section,
                &format!("{} {p}", verb.to_uppercase()),
                "ms",
                false,
                col,
                v,
            );
        }
    }
    let add = Summary::of(&s.add);
    if add.p50 > 0.0 {
        report.put(
            &format!("{base}.add.tail"),
            &section,
            "ADD p99 ÷ p50",
            "×",
            false,
            col,
            add.p99 / add.p50,
        );
    }
    let n = s.add.len() as f64;
    let add_pps = if s.add_wall > 0.0 {
        n / s.add_wall
    } else {
        0.0
    };
    let del_pps = if s.del_wall > 0.0 {
        n / s.del_wall
    } else {
        0.0
    };
    report.put(
        &format!("{base}.add.pods_per_s"),
        &section,
        "ADD throughput",
        "pods/s",
        true,
        col,
        add_pps,
    );
    report.put(
        &format!("{base}.del.pods_per_s"),
        &section,
        "DEL throughput",
        "pods/s",
        true,
        col,
        del_pps,
    );
    let rss = Summary::of(&s.add_rss);
    if via == Via::Direct && w == 1 && kind == Kind::Plain {
        for (key, what, unit, samples) in [
            (
                "add.cpu",
                "CPU time per ADD (user + system)",
                "ms",
                &s.add_cpu,
            ),
            ("add.faults", "page faults per ADD", "faults", &s.add_faults),
            (
                "del.cpu",
                "CPU time per DEL (user + system)",
                "ms",
                &s.del_cpu,
            ),
            ("del.faults", "page faults per DEL", "faults", &s.del_faults),
        ] {
            report.put(
                &format!("cp.profile.{key}"),
                PROFILE,
                what,
                unit,
                false,
                col,
                median(samples),
            );
        }
        report.put(
            "cp.add.maxrss",
            "Peak RSS of one ADD (direct exec, wait4 ru_maxrss, largest process of the chain)",
            "ADD peak RSS, median",
            "MiB",
            false,
            col,
            rss.p50 / 1024.0,
        );
        report.put(
            "cp.add.maxrss.max",
            "Peak RSS of one ADD (direct exec, wait4 ru_maxrss, largest process of the chain)",
            "ADD peak RSS, max",
            "MiB",
            false,
            col,
            rss.max / 1024.0,
        );
    }
    d.insert("addMaxrssKiB".into(), rss.json());
    d.insert("addPodsPerSecond".into(), json!(add_pps));
    d.insert("delPodsPerSecond".into(), json!(del_pps));
    d.insert("addSamplesMs".into(), json!(s.add));
    let name = match kind {
        Kind::Plain => format!("{}-w{w}", via.key()),
        Kind::HostPort => format!("hostport-{}-w{w}", via.key()),
    };
    details.insert(name, Value::Object(d));
}
