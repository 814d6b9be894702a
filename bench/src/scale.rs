//! Scale: with 0, 200, 1 000 … pods each holding a TCP host port on the node, how long does
//! one more ADD (and DEL) take, and how long does ext take to connect to a host port? The
//! reference's portmap appends one iptables chain and DNAT jump per pod, so both grow with
//! the pod count there; cni-ebpf uses hash-map lookups. Also the pinned map memory per pod
//! (cni-ebpf, from its `inspect --json`) and the iptables rules per pod (reference).
//!
//! At each level the probe pods (ADD + DEL, timed) and the server pod (ADDed after all
//! holders, so its DNAT rule is the last one the reference evaluates) are fresh; the
//! holders stay and grow to the next level. Holders are ADDed by direct exec and their ADD
//! times are kept too (a continuous curve).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use ::testbed::{EchoServer, Serving};
use anyhow::{Context, Result};
use cni_ebpf_common::map;
use serde_json::{json, Map, Value};

use super::{
    chart, data,
    proc::{self, check_interrupt},
    report::{median, Report, Summary},
    topo::{self, BenchNode, Op, Pod, PortMap, Variant, Via, Workspace, EXT_IP, NODE_IP},
};

/// Sizes of the scale phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Host-port pod counts.
    pub levels: Vec<usize>,
    /// Probe ADDs per level.
    pub probes: usize,
    /// Connections per level.
    pub connects: usize,
    /// Masqueraded connections opened before the busy-node probes (0: skip).
    pub busy_flows: usize,
}

const SERVER_PORT: u16 = 7000;
const SERVER_HOST_PORT: u16 = 18_080;
const BUSY_PORT: u16 = 7001;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn holder_port(i: usize) -> PortMap {
    PortMap {
        host: 20_000 + u16::try_from(i % 20_000).unwrap_or(0),
        container: 80,
    }
}

fn probe_port(j: usize) -> PortMap {
    PortMap {
        host: 45_000 + u16::try_from(j % 10_000).unwrap_or(0),
        container: 80,
    }
}

/// `n` connect/request/close from `netns` to `to`: (connect µs, whole transaction µs).
fn connects(netns: &Path, to: SocketAddr, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    proc::join(proc::in_netns(netns, move || {
        ::testbed::servers::pin_to_last_cpu();
        let mut conn = Vec::with_capacity(n);
        let mut total = Vec::with_capacity(n);
        let req = [7u8; 64];
        let mut resp = [0u8; 64];
        for i in 0..n + 10 {
            let t = Instant::now();
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))
                .with_context(|| format!("connecting to {to}"))?;
            let c = t.elapsed();
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(&req)?;
            s.read_exact(&mut resp)?;
            drop(s);
            // The first few warm up neighbour and conntrack state.
            if i >= 10 {
                conn.push(c.as_secs_f64() * 1e6);
                total.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok((conn, total))
    }))
}

/// Pinned maps of the cni-ebpf network: (total memlock bytes, bytes held by live entries,
/// per map), from `cni-ebpf inspect --json`, whose `maps` are what the agent's metrics
/// serves (each map's fdinfo and entry count, read by the plugin's own code).
fn map_memory(node: &BenchNode) -> Result<(u64, u64, Map<String, Value>)> {
    let doc = data::inspect(
        node.plugin(),
        node.network(),
        node.pin_root(),
        &node.netns(),
    )?;
    let ncpu = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    Ok(map_memory_of(&doc["maps"], ncpu))
}

/// [`map_memory`] of an inspect document's `maps`, with `ncpu` copies of each per-CPU
/// value.
fn map_memory_of(maps: &Value, ncpu: u64) -> (u64, u64, Map<String, Value>) {
    let mut memlock = 0;
    let mut live = 0;
    let mut per_map = Map::new();
    for m in maps.as_array().into_iter().flatten() {
        let ty = m["type"].as_str().unwrap_or_default().to_owned();
        // Arrays always hold max_entries values (inspect reports them so).
        let entries = m["entries"].as_u64().unwrap_or(0);
        let k = m["keySize"].as_u64().unwrap_or(0);
        let v = m["valueSize"].as_u64().unwrap_or(0);
        let per_entry = k + v * if ty.starts_with("percpu") { ncpu } else { 1 };
        let bytes = m["memlockBytes"].as_u64().unwrap_or(0);
        memlock += bytes;
        live += entries * per_entry;
        per_map.insert(
            m["name"].as_str().unwrap_or_default().to_owned(),
            json!({ "type": ty, "maxEntries": m["maxEntries"], "entries": entries,
                    "bytesPerEntry": per_entry, "bytesMemlock": bytes }),
        );
    }
    (memlock, live, per_map)
}

/// iptables rules in the node namespace (all tables).
fn iptables_rules(node: &BenchNode) -> Result<u64> {
    let out = proc::run_in(
        Some(&node.netns()),
        &["iptables-save"],
        Duration::from_secs(60),
    )?;
    Ok(out.lines().filter(|l| l.starts_with("-A")).count() as u64)
}

/// What one level measured.
#[derive(Default, Clone)]
struct Level {
    pods: usize,
    add: Vec<f64>,
    del: Vec<f64>,
    /// CPU time of each ADD and DEL process (user and system), ms: where wall time grows
    /// and this does not, the verb waited (a lock, the scheduler), not worked.
    add_cpu: Vec<f64>,
    del_cpu: Vec<f64>,
    connect: Vec<f64>,
    crr: Vec<f64>,
}

impl Level {
    /// One ADD and one DEL of each probe pod (host port [`probe_port`]), timed.
    fn probe(&mut self, node: &BenchNode, probes: &[Pod]) -> Result<()> {
        for (j, pod) in probes.iter().enumerate() {
            check_interrupt()?;
            let ports = [probe_port(j)];
            let a: Op = node.op("ADD", Via::Direct, pod, &ports, None)?;
            let d = node.op("DEL", Via::Direct, pod, &ports, Some(&a.result))?;
            self.add.push(ms(a.wall));
            self.del.push(ms(d.wall));
            self.add_cpu.push(ms(a.cpu));
            self.del_cpu.push(ms(d.cpu));
        }
        Ok(())
    }

    /// The p50 CPU time per ADD and per DEL as rows `key("add")` and `key("del")` of
    /// column `col`, labelled `when` ("with 500 pods").
    fn record_cpu(&self, report: &mut Report, col: &str, key: impl Fn(&str) -> String, when: &str) {
        for (verb, cpu) in [("ADD", &self.add_cpu), ("DEL", &self.del_cpu)] {
            report.put(
                &key(&verb.to_lowercase()),
                "Scale: host-port pods",
                &format!("CPU per {verb} p50 {when} (user + system)"),
                "ms",
                false,
                col,
                median(cpu),
            );
        }
    }
}

/// Runs the scale phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    let mut levels = p.levels.clone();
    levels.sort_unstable();
    levels.dedup();
    let mut details = Map::new();
    for variant in [Variant::Ebpf, Variant::Reference] {
        let node = BenchNode::create(ws, variant, "sc")?;
        let probes = (0..p.probes)
            .map(|j| node.pod(100_000 + j))
            .collect::<Result<Vec<Pod>>>()?;
        let server = node.pod(200_000)?;
        let mut holders: Vec<Pod> = Vec::new();
        let mut holder_add: Vec<f64> = Vec::new();
        let mut results: Vec<Level> = Vec::new();
        let mut vd = Map::new();
        let mut mem0: Option<(u64, u64, usize)> = None;
        for &level in &levels {
            eprintln!(
                "bench: scale, {}: growing to {level} host-port pods",
                variant.key()
            );
            while holders.len() < level {
                check_interrupt()?;
                let i = holders.len();
                let pod = node.pod(i)?;
                let op = node.op("ADD", Via::Direct, &pod, &[holder_port(i)], None)?;
                holder_add.push(ms(op.wall));
                holders.push(pod);
            }
            let mut lv = Level {
                pods: level,
                ..Level::default()
            };
            // Probe ADD + DEL.
            lv.probe(&node, &probes)?;
            // Connect latency ext → node:hostPort → the newest pod.
            check_interrupt()?;
            let sports = [PortMap {
                host: SERVER_HOST_PORT,
                container: SERVER_PORT,
            }];
            let added = node.op("ADD", Via::Direct, &server, &sports, None)?;
            let measured = (|| -> Result<(Vec<f64>, Vec<f64>)> {
                let _srv =
                    EchoServer::start(&server.path(), SERVER_PORT, Serving::OneAtATimePinned)?;
                let to: SocketAddr = format!("{NODE_IP}:{SERVER_HOST_PORT}").parse()?;
                connects(&node.ext_netns(), to, p.connects)
            })();
            node.op("DEL", Via::Direct, &server, &sports, Some(&added.result))?;
            let (c, t) = measured?;
            lv.connect = c;
            lv.crr = t;
            // Memory.
            let mut ld = Map::new();
            match variant {
                Variant::Ebpf => match map_memory(&node) {
                    Ok((memlock, live, per_map)) => {
                        ld.insert("bytesMemlock".into(), json!(memlock));
                        ld.insert("bytesLiveEntries".into(), json!(live));
                        ld.insert("maps".into(), Value::Object(per_map));
                        if let Some((m0, l0, n0)) = mem0 {
                            if level > n0 {
                                let per = (live - l0.min(live)) as f64 / (level - n0) as f64;
                                let per_memlock =
                                    memlock.saturating_sub(m0) as f64 / (level - n0) as f64;
                                report.put(
                                    "scale.mem.live_per_pod",
                                    "Scale: host-port pods",
                                    "pinned map entry bytes per pod",
                                    "bytes",
                                    false,
                                    variant.key(),
                                    per,
                                );
                                report.put(
                                    "scale.mem.memlock_per_pod",
                                    "Scale: host-port pods",
                                    "pinned map memlock growth per pod",
                                    "bytes",
                                    false,
                                    variant.key(),
                                    per_memlock,
                                );
                            }
                        } else {
                            mem0 = Some((memlock, live, level));
                        }
                        report.put(
                            "scale.mem.memlock",
                            "Scale: host-port pods",
                            "pinned map memlock, total (preallocated)",
                            "MiB",
                            false,
                            variant.key(),
                            memlock as f64 / 1_048_576.0,
                        );
                    }
                    Err(e) => report.notes.push(format!("map memory: {e:#}")),
                },
                Variant::Reference => match iptables_rules(&node) {
                    Ok(n) => {
                        ld.insert("iptablesRules".into(), json!(n));
                        if let Some((_, r0, n0)) = mem0 {
                            if level > n0 {
                                report.put(
                                    "scale.rules_per_pod",
                                    "Scale: host-port pods",
                                    "iptables rules per pod",
                                    "rules",
                                    false,
                                    variant.key(),
                                    (n.saturating_sub(r0)) as f64 / (level - n0) as f64,
                                );
                            }
                        } else {
                            mem0 = Some((0, n, level));
                        }
                    }
                    Err(e) => report.notes.push(format!("iptables rules: {e:#}")),
                },
            }
            record(report, variant, &lv, p);
            ld.insert("add".into(), Summary::of(&lv.add).json());
            ld.insert("del".into(), Summary::of(&lv.del).json());
            ld.insert("connectUs".into(), Summary::of(&lv.connect).json());
            ld.insert("connectRequestCloseUs".into(), Summary::of(&lv.crr).json());
            vd.insert(level.to_string(), Value::Object(ld));
            results.push(lv);
        }
        if p.busy_flows > 0 {
            check_interrupt()?;
            match busy_node(&node, &probes, p) {
                Ok((live, lv)) => {
                    let col = variant.key();
                    let s = "Scale: host-port pods";
                    let what = match variant {
                        Variant::Ebpf => "NAT map",
                        Variant::Reference => "conntrack",
                    };
                    if lv.pods < p.busy_flows {
                        report.notes.push(format!(
                            "busy node, {}: only {} of {} masqueraded connections could be \
                             opened; its busy-node ADD/DEL figures are of a node with that \
                             many flows, not comparable with the other column's",
                            variant.key(),
                            lv.pods,
                            p.busy_flows
                        ));
                    }
                    report.put(
                        "scale.busy.add.p50",
                        s,
                        &format!(
                            "ADD p50 on a busy node (after {} masqueraded connections)",
                            p.busy_flows
                        ),
                        "ms",
                        false,
                        col,
                        median(&lv.add),
                    );
                    report.put(
                        "scale.busy.del.p50",
                        s,
                        "DEL p50 on a busy node",
                        "ms",
                        false,
                        col,
                        median(&lv.del),
                    );
                    lv.record_cpu(
                        report,
                        col,
                        |verb| format!("scale.busy.{verb}.cpu"),
                        "on a busy node",
                    );
                    report.put(
                        "scale.busy.opened",
                        s,
                        "connections opened on the busy node (stops early when the flow table is full)",
                        "connections",
                        true,
                        col,
                        lv.pods as f64,
                    );
                    report.put(
                        "scale.busy.entries",
                        s,
                        "live flow entries on the busy node (NAT map / conntrack)",
                        "entries",
                        false,
                        col,
                        live as f64,
                    );
                    if let Some(first) = results.first() {
                        for (key, verb, busy, idle) in [
                            ("add", "ADD", &lv.add, &first.add),
                            ("del", "DEL", &lv.del, &first.del),
                        ] {
                            let idle = median(idle);
                            if idle > 0.0 {
                                report.put(
                                    &format!("scale.busy.{key}.growth"),
                                    s,
                                    &format!(
                                        "{verb} p50 on the busy node ÷ at {} pods",
                                        first.pods
                                    ),
                                    "×",
                                    false,
                                    col,
                                    median(busy) / idle,
                                );
                            }
                        }
                    }
                    vd.insert(
                        "busy".into(),
                        json!({ "flowTable": what, "liveEntries": live,
                        "add": Summary::of(&lv.add).json(), "del": Summary::of(&lv.del).json() }),
                    );
                }
                Err(e) => {
                    if proc::interrupted() {
                        return Err(e);
                    }
                    report
                        .notes
                        .push(format!("busy node, {}: {e:#}", variant.key()));
                }
            }
        }
        if let (Some(first), Some(last)) = (results.first(), results.last()) {
            let a0 = median(&first.add);
            if a0 > 0.0 && last.pods > first.pods {
                report.put(
                    "scale.add.growth",
                    "Scale: host-port pods",
                    &format!("ADD p50 at {} pods ÷ at {}", last.pods, first.pods),
                    "×",
                    false,
                    variant.key(),
                    median(&last.add) / a0,
                );
            }
        }
        vd.insert("holderAddMs".into(), json!(holder_add));
        details.insert(variant.key().into(), Value::Object(vd));
        // Holders are not DELed one by one: dropping the node and pod namespaces, pins and
        // directories removes everything, much faster.
        drop(holders);
        drop(probes);
        drop(server);
        drop(node);
    }
    report
        .details
        .insert("scale".into(), Value::Object(details));
    Ok(())
}

/// A busy node: a pod opens `p.busy_flows` short masqueraded connections to ext (bounded
/// to 60 s), leaving that many flows in the NAT map (cni-ebpf) or in conntrack (reference,
/// TIME_WAIT entries live 120 s); then the probe pods are ADDed and DELed again. Returns
/// the live flow entries and the probe timings.
fn busy_node(node: &BenchNode, probes: &[Pod], p: &Params) -> Result<(u64, Level)> {
    eprintln!(
        "bench: scale, {}: busy node ({} masqueraded connections)",
        node.variant.key(),
        p.busy_flows
    );
    let client = node.pod(300_000)?;
    let added = node.op("ADD", Via::Direct, &client, &[], None)?;
    super::data::client_sysctls(&client.path())?;
    let opened = (|| -> Result<usize> {
        let _srv = EchoServer::start(&node.ext_netns(), BUSY_PORT, Serving::OneAtATimePinned)?;
        let to: SocketAddr = format!("{EXT_IP}:{BUSY_PORT}").parse()?;
        let n = p.busy_flows;
        proc::join(proc::in_netns(&client.path(), move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut buf = [0u8; 8];
            let mut opened = 0;
            for _ in 0..n {
                if Instant::now() > deadline || proc::interrupted() {
                    break;
                }
                // A full flow table (e.g. masquerade out of source ports towards one
                // destination) ends the filling; the probes then run on what is there.
                let mut one = || -> std::io::Result<()> {
                    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(1))?;
                    s.set_read_timeout(Some(Duration::from_secs(1)))?;
                    s.write_all(b"busy....")?;
                    s.read_exact(&mut buf)
                };
                if one().is_err() {
                    break;
                }
                opened += 1;
            }
            Ok(opened)
        }))
    })();
    let live = live_flows(node).unwrap_or(0);
    let mut lv = Level::default();
    let measured = opened.and_then(|opened| {
        lv.pods = opened;
        lv.probe(node, probes)?;
        Ok(())
    });
    node.op("DEL", Via::Direct, &client, &[], Some(&added.result))?;
    measured?;
    // lv.pods carries the number of connections actually opened.
    Ok((live, lv))
}

/// Live flow entries: the NAT map (cni-ebpf) or the node namespace's conntrack count.
fn live_flows(node: &BenchNode) -> Result<u64> {
    match node.variant {
        Variant::Ebpf => {
            let nat = topo::maps_dir(node.pin_root(), node.network()).join(map::NAT);
            let dump: Value = serde_json::from_str(&proc::run_in(
                None,
                &[
                    "bpftool",
                    "-j",
                    "map",
                    "dump",
                    "pinned",
                    &nat.to_string_lossy(),
                ],
                Duration::from_secs(120),
            )?)?;
            Ok(dump.as_array().map_or(0, |a| a.len() as u64))
        }
        Variant::Reference => Ok(proc::run_in(
            Some(&node.netns()),
            &["cat", "/proc/sys/net/netfilter/nf_conntrack_count"],
            Duration::from_secs(10),
        )?
        .trim()
        .parse()
        .unwrap_or(0)),
    }
}

fn record(report: &mut Report, variant: Variant, lv: &Level, p: &Params) {
    let col = variant.key();
    let s = "Scale: host-port pods";
    let n = lv.pods;
    let add = Summary::of(&lv.add);
    let del = Summary::of(&lv.del);
    let con = Summary::of(&lv.connect);
    let crr = Summary::of(&lv.crr);
    report.put(
        &format!("scale.add.p50.{n}"),
        s,
        &format!("ADD p50 with {n} pods ({} probes)", p.probes),
        "ms",
        false,
        col,
        add.p50,
    );
    report.put(
        &format!("scale.del.p50.{n}"),
        s,
        &format!("DEL p50 with {n} pods"),
        "ms",
        false,
        col,
        del.p50,
    );
    lv.record_cpu(
        report,
        col,
        |verb| format!("scale.{verb}.cpu.{n}"),
        &format!("with {n} pods"),
    );
    report.put(
        &format!("scale.connect.p50.{n}"),
        s,
        &format!(
            "ext → hostPort connect p50 with {n} pods ({} connects)",
            p.connects
        ),
        "µs",
        false,
        col,
        con.p50,
    );
    report.put(
        &format!("scale.connect.p99.{n}"),
        s,
        &format!("ext → hostPort connect p99 with {n} pods"),
        "µs",
        false,
        col,
        con.p99,
    );
    report.put(
        &format!("scale.crr.p50.{n}"),
        s,
        &format!("ext → hostPort connect/request/close p50 with {n} pods"),
        "µs",
        false,
        col,
        crr.p50,
    );
}

/// The host-port scaling curve: ADD p50 and connect p50 against the pod count.
pub fn chart(out: &Path, report: &Report) -> Result<()> {
    let series = |prefix: &str, col: &str| -> Vec<(f64, f64)> {
        let mut pts: Vec<(f64, f64)> = report
            .rows
            .iter()
            .filter_map(|r| {
                let n: f64 = r.key.strip_prefix(prefix)?.parse().ok()?;
                Some((n, *r.values.get(col)?))
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts
    };
    let holder_curve = |col: &str| -> Vec<(f64, f64)> {
        let Some(v) = report
            .details
            .get("scale")
            .and_then(|s| s.get(col))
            .and_then(|c| c.get("holderAddMs"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        let v: Vec<f64> = v.iter().filter_map(Value::as_f64).collect();
        // Rolling median over windows of 25 ADDs.
        v.chunks(25)
            .enumerate()
            .map(|(i, c)| ((i * 25 + c.len() / 2) as f64, median(c)))
            .collect()
    };
    let mut add_lines = Vec::new();
    let mut con_lines = Vec::new();
    for col in ["cni-ebpf", "reference"] {
        let (add, con) = (&mut add_lines, &mut con_lines);
        let probe = series("scale.add.p50.", col);
        chart::push_line(add, format!("{col} probe ADD p50"), probe, false);
        let holders = holder_curve(col);
        chart::push_line(
            add,
            format!("{col} holder ADDs (median of 25)"),
            holders,
            true,
        );
        let p50 = series("scale.connect.p50.", col);
        chart::push_line(con, format!("{col} connect p50"), p50, false);
        let p99 = series("scale.connect.p99.", col);
        chart::push_line(con, format!("{col} connect p99"), p99, true);
    }
    if add_lines.is_empty() {
        return Ok(());
    }
    chart::line_panels(
        &out.join("hostport-scaling.svg"),
        "pods holding a host port",
        &[
            (
                "ADD latency with N host-port pods (lower is better)".into(),
                "ms".into(),
                add_lines,
            ),
            (
                "ext → node:hostPort connect latency (lower is better)".into(),
                "µs".into(),
                con_lines,
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_memory_sums_memlock_and_live_entry_bytes() {
        let maps = json!([
            { "name": "NAT", "type": "lru_hash", "keySize": 16, "valueSize": 24,
              "maxEntries": 131072, "entries": 10, "memlockBytes": 1000 },
            { "name": "EP_STATS", "type": "percpu_hash", "keySize": 4, "valueSize": 32,
              "maxEntries": 4096, "entries": 2, "memlockBytes": 200 },
            { "name": "REASONS", "type": "percpu_array", "keySize": 4, "valueSize": 8,
              "maxEntries": 64, "entries": 64, "memlockBytes": 30 },
        ]);
        let (memlock, live, per_map) = map_memory_of(&maps, 2);
        assert_eq!(memlock, 1230);
        assert_eq!(live, 10 * 40 + 2 * (4 + 64) + 64 * (4 + 16));
        assert_eq!(per_map["NAT"]["bytesPerEntry"], 40);
        assert_eq!(per_map["EP_STATS"]["bytesMemlock"], 200);
        assert_eq!(per_map["REASONS"]["maxEntries"], 64);
    }
}
