//! `cargo xtask bench`: cni-ebpf side by side with the reference plugins (bridge with
//! `ipMasq` + host-local + portmap) and a bare veth pair, on simulated nodes.
//!
//! Phases (`--only` picks some):
//! - `ipam`: the IPAM allocate+release microbench (`cargo bench -p cni-ebpf --bench ipam`);
//! - `control`: ADD/CHECK/DEL latency percentiles, pods/s with 1 and 2 workers, peak RSS
//!   of one ADD — through libcni (a client process per operation, and embedded in a
//!   long-lived client as runtimes run it) and by direct exec — and a profile of one verb:
//!   CPU time, page faults and system calls per ADD and per DEL ([`control`]);
//! - `data`: TCP throughput (iperf3), request/response and connect/request/close rates for
//!   pod → pod, pod → ext (masquerade) and ext → node:hostPort → pod, interleaved repeats,
//!   medians ([`data`]);
//! - `scale`: ADD latency and host-port connect latency with growing numbers of pods that
//!   hold a host port, and pinned map memory per pod ([`scale`]);
//! - `service`: pod → ClusterIP → pod on the same node and across nodes, with kube-proxy's
//!   rules (iptables mode, and nftables mode as an extra) on two-node clusters, request/
//!   response and connect/request/close ([`service`]);
//! - `cross`: pod → pod across nodes, through the tunnel against the kernel's own VXLAN
//!   device with static routes (flannel's datapath), and routed against bare veth pods
//!   ([`cross`]);
//! - `policy`: NetworkPolicy with the real agent on a two-node cluster watching the
//!   tests' stand-in API server (1 000 Pod objects): API write → new verdict on both
//!   nodes, ADD → the new pod's policy in force, policy map memory per endpoint and per
//!   rule, and pod → pod request/response and connect rates with 0, 1, 100 and 1 000
//!   policies selecting the pair, each ÷ the 0-policy figure of the same repeat
//!   ([`policy`]);
//! - `agent-scale`: one real agent against the stand-in API server filled as a cluster of
//!   500, 1 000 and 5 000 nodes is (150 000 Pods, 10 000 Services, 100 000 endpoints,
//!   2 000 policies at 5 000): memory, start → policy in force, policy write → in force,
//!   10 000 pods deleted and created at once → current, CPU per pod event, bytes
//!   received ([`agent_scale`]).
//!
//! Everything runs in namespaces the bench creates (`cebb<pid>-…`, and `…-cebb-<pid>-…`
//! for the tests crate's cluster); the machine's own network namespace is never touched,
//! and no packet leaves those namespaces. Every loop is bounded; a Ctrl-C stops the
//! current step, then guards delete namespaces, pins and temp files. Results go to `results/bench-<UTC timestamp>/`: `report.md`, `report.json` and
//! SVG charts; the targets are printed as met / not met.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::SystemTime,
};

use anyhow::{Context, Result};
use clap::ValueEnum;
use serde_json::json;

mod agent_scale;
mod bandwidth;
mod chart;
mod control;
mod cross;
mod data;
mod policy;
mod proc;
mod report;
mod scale;
mod service;
mod topo;
mod transact;

use report::Report;
use topo::{Via, Workspace};

/// A phase of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// IPAM microbench (cargo bench).
    Ipam,
    /// ADD/CHECK/DEL latency, pods/s, peak RSS.
    Control,
    /// Throughput, transactions/s, connect rate.
    Data,
    /// Host-port pods: ADD and connect latency, map memory.
    Scale,
    /// pod → ClusterIP → pod with kube-proxy's rules: transactions/s, connect rate.
    Service,
    /// pod → pod across nodes: the tunnel against the kernel's VXLAN, routed against bare
    /// veth.
    Cross,
    /// pod → pod across nodes with flow events on against off, agents on both sides.
    Flows,
    /// NetworkPolicy with the real agent: data-path cost with 0–1000 policies, API write →
    /// enforced, ADD → in force, policy map memory.
    Policy,
    /// Egress rates: accuracy and CPU cost against the reference `bandwidth` plugin.
    Bandwidth,
    /// The agent against a cluster of thousands of nodes: memory, time to policy in
    /// force, churn.
    AgentScale,
}

/// `cargo xtask bench` options. Defaults finish in well under 20 minutes on 2 cores;
/// `--quick` is a 1–2 minute smoke run.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Smoke preset: 20 pods, one 1 s data-plane and Service repeat, scale levels 0 and 50,
    /// no IPAM microbench. Explicit size flags still override it.
    #[arg(long)]
    pub quick: bool,
    /// Phases to run, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Phase>,
    /// Pods per control-plane run (≥ 100 for a meaningful p99) [default: 100].
    #[arg(long)]
    pub pods: Option<usize>,
    /// Control-plane worker counts, comma-separated [default: 1,2].
    #[arg(long, value_delimiter = ',')]
    pub workers: Vec<usize>,
    /// Interleaved data-plane and Service repeats (the median is reported; Services in
    /// kube-proxy's nftables mode run half as many, rounded up) [default: 5].
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Seconds per data-plane and Service measurement [default: 2].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Host-port pod counts of the scale phase, comma-separated [default: 0,200,1000].
    #[arg(long, value_delimiter = ',')]
    pub scale: Vec<usize>,
    /// Probe ADDs (and DELs) measured at each scale level [default: 30].
    #[arg(long)]
    pub scale_probes: Option<usize>,
    /// Connections measured at each scale level [default: 500].
    #[arg(long)]
    pub scale_connects: Option<usize>,
    /// Short masqueraded connections opened before ADD/DEL are measured again on a busy
    /// node (flow state in the NAT map / conntrack); 0 skips it [default: 30000].
    #[arg(long)]
    pub busy_flows: Option<usize>,
    /// NetworkPolicy writes timed from the API write until enforced on both nodes
    /// [default: 40].
    #[arg(long)]
    pub policy_writes: Option<usize>,
    /// Pods timed from ADD until their NetworkPolicy is in force [default: 30].
    #[arg(long)]
    pub policy_adds: Option<usize>,
    /// Cluster sizes (nodes) of the agent-scale phase, comma-separated
    /// [default: 500,1000,5000].
    #[arg(long, value_delimiter = ',')]
    pub agent_nodes: Vec<usize>,
    /// Policy writes timed at each agent-scale size [default: 20].
    #[arg(long)]
    pub agent_writes: Option<usize>,
    /// Pod objects deleted and created at once at each agent-scale size [default: 10000].
    #[arg(long)]
    pub agent_churn: Option<usize>,
    /// Results directory [default: results/bench-<UTC timestamp>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Benchmark this cni-ebpf binary instead of building one. [default: the static (musl)
    /// binary the container image ships, which is what the DaemonSet installs on nodes]
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Use this libcni client binary instead of building it.
    #[arg(long)]
    pub libcni_client: Option<PathBuf>,
    /// Run the bench inside Debian's 6.12 kernel, booted in qemu (software emulation), as
    /// `cargo xtask test` runs its second-kernel tests: for what this machine's kernel
    /// lacks — `fq`, so the `bandwidth` phase measures departure-time pacing instead of
    /// its policing fallback. Emulated CPUs: compare the columns of one run, never a
    /// figure with one from the machine's own kernel.
    #[arg(long)]
    pub second_kernel: bool,
    /// `logLevel` of cni-ebpf during the bench (it logs to a file in the bench's temp dir).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// cni-ebpf's `attach` field (how its programs are attached) [default: the plugin's
    /// default, `tc`].
    #[arg(long, value_parser = ["tc", "tcx", "auto"])]
    pub attach: Option<String>,
}

/// What the bench takes from the developer workflow that runs it: the binaries it
/// measures when no `--plugin` or `--libcni-client` names them.
pub trait Host {
    /// Builds the plugin users run (the image's static binary) and returns its path.
    fn build_plugin(&self) -> Result<PathBuf>;
    /// Builds the Go libcni client and returns its path.
    fn build_libcni_client(&self) -> Result<PathBuf>;
    /// Whether `bin` is a static executable (reported with the results).
    fn is_static(&self, bin: &Path) -> bool;
}

/// The plugin and the libcni client the bench runs: `--plugin` and `--libcni-client`, or
/// built. Absolute: the bench links them into its own directories.
pub fn plugin_and_client(args: &Args, host: &dyn Host) -> Result<(PathBuf, PathBuf)> {
    let plugin = match &args.plugin {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("--plugin {}", p.display()))?,
        // The binary users run: the image's static one. (A glibc build spends about 0.5 ms
        // more per exec in the dynamic loader and libc's CPU feature probing, which every
        // ADD and DEL pays; the bench reports what a node pays.)
        None => host.build_plugin()?,
    };
    let client = match &args.libcni_client {
        Some(p) => {
            std::fs::canonicalize(p).with_context(|| format!("--libcni-client {}", p.display()))?
        }
        None => host.build_libcni_client()?,
    };
    Ok((plugin, client))
}

/// Resolved sizes.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Control plane.
    pub control: control::Params,
    /// Data plane.
    pub data: data::Params,
    /// Scale.
    pub scale: scale::Params,
    /// Services.
    pub service: service::Params,
    /// Across nodes.
    pub cross: cross::Params,
    /// Egress rates.
    pub bandwidth: bandwidth::Params,
    /// NetworkPolicy.
    pub policy: policy::Params,
    /// The agent at cluster scale.
    pub agent_scale: agent_scale::Params,
}

impl Args {
    fn phases(&self) -> Vec<Phase> {
        if !self.only.is_empty() {
            return self.only.clone();
        }
        // Services before scale: the kernel tears down a phase's namespaces for a while
        // after it ends, and the scale phase leaves a thousand pods behind.
        if self.quick {
            vec![
                Phase::Control,
                Phase::Data,
                Phase::Service,
                Phase::Cross,
                Phase::Flows,
                Phase::Policy,
                Phase::Bandwidth,
                Phase::Scale,
                Phase::AgentScale,
            ]
        } else {
            vec![
                Phase::Ipam,
                Phase::Control,
                Phase::Data,
                Phase::Service,
                Phase::Cross,
                Phase::Flows,
                Phase::Policy,
                Phase::Bandwidth,
                Phase::Scale,
                Phase::AgentScale,
            ]
        }
    }

    fn sizes(&self) -> Sizes {
        let q = self.quick;
        let pick =
            |v: Option<usize>, quick: usize, full: usize| v.unwrap_or(if q { quick } else { full });
        let data = data::Params {
            repeats: pick(self.repeats, 1, 5),
            seconds: self.seconds.unwrap_or(if q { 1.0 } else { 2.0 }),
        };
        Sizes {
            service: service::Params {
                repeats: data.repeats,
                nft_repeats: data.repeats.div_ceil(2),
                seconds: data.seconds,
            },
            cross: cross::Params {
                repeats: data.repeats,
                seconds: data.seconds,
            },
            bandwidth: bandwidth::Params {
                seconds: if q { 2.0 } else { 4.0 },
            },
            policy: policy::Params {
                repeats: data.repeats,
                seconds: data.seconds,
                writes: pick(self.policy_writes, 10, 40),
                adds: pick(self.policy_adds, 10, 30),
                endpoints: if q { 10 } else { 40 },
            },
            agent_scale: agent_scale::Params {
                nodes: if !self.agent_nodes.is_empty() {
                    self.agent_nodes.clone()
                } else if q {
                    vec![100]
                } else {
                    vec![500, 1000, 5000]
                },
                writes: pick(self.agent_writes, 6, 20),
                churn: pick(self.agent_churn, 2000, 10_000),
            },
            control: control::Params {
                pods: pick(self.pods, 20, 100),
                workers: if self.workers.is_empty() {
                    vec![1, 2]
                } else {
                    self.workers.clone()
                },
                vias: vec![Via::Direct, Via::Libcni, Via::Embedded],
            },
            data,
            scale: scale::Params {
                levels: if !self.scale.is_empty() {
                    self.scale.clone()
                } else if q {
                    vec![0, 50]
                } else {
                    vec![0, 200, 1000]
                },
                probes: pick(self.scale_probes, 5, 30),
                connects: pick(self.scale_connects, 100, 500),
                busy_flows: pick(self.busy_flows, 3000, 30_000),
            },
        }
    }
}

/// UTC `YYYYMMDD-HHMMSS`.
/// The current UTC time as `YYYYMMDD-HHMMSS`, for result directories.
pub fn timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

fn sh(argv: &[&str]) -> String {
    Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The IPAM microbench, its output kept in the results dir.
fn ipam_microbench(out: &Path) -> Result<()> {
    eprintln!("bench: IPAM microbench (cargo bench -p cni-ebpf --bench ipam)");
    let o = Command::new("cargo")
        .args(["bench", "-p", "cni-ebpf", "--bench", "ipam"])
        .output()
        .context("running cargo bench")?;
    let text = String::from_utf8_lossy(&o.stdout);
    print!("{text}");
    std::fs::write(out.join("ipam.txt"), text.as_bytes())?;
    if !o.status.success() {
        anyhow::bail!(
            "the IPAM microbench failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// Runs the bench on this machine's kernel (the caller runs it as root, with bpffs
/// mounted; `--second-kernel` is the caller's to act on, by running the bench again in
/// the guest).
pub fn run(args: &Args, host: &dyn Host) -> Result<()> {
    let phases = args.phases();
    let sizes = args.sizes();
    let out = args.out.clone().unwrap_or_else(|| {
        workspace_root()
            .join("results")
            .join(format!("bench-{}", timestamp()))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut report = Report::default();
    let started = std::time::Instant::now();
    if phases.contains(&Phase::Ipam) {
        if let Err(e) = ipam_microbench(&out) {
            report.notes.push(format!("IPAM microbench: {e:#}"));
        } else {
            report
                .notes
                .push("IPAM microbench output: ipam.txt in this directory.".into());
        }
    }
    let net_phases: Vec<Phase> = phases
        .iter()
        .copied()
        .filter(|p| *p != Phase::Ipam)
        .collect();
    let mut result = Ok(());
    if !net_phases.is_empty() {
        let (plugin, client) = plugin_and_client(args, host)?;
        proc::install_signal_handler()?;
        fill_meta(&mut report, args, &sizes, &plugin, host);
        let mut ws = Workspace::create(&plugin, &client, &args.log_level)?;
        ws.attach = args.attach.clone();
        for phase in &net_phases {
            let r = match phase {
                Phase::Control => control::run(&ws, &sizes.control, &mut report),
                Phase::Data => data::run(&ws, &sizes.data, &mut report),
                Phase::Scale => scale::run(&ws, &sizes.scale, &mut report),
                Phase::Service => service::run(&ws, &sizes.service, &mut report),
                Phase::Cross => cross::run(&ws, &sizes.cross, &mut report),
                Phase::Flows => cross::run_flows(&ws, &sizes.cross, &mut report),
                Phase::Bandwidth => bandwidth::run(&ws, &sizes.bandwidth, &mut report),
                Phase::Policy => policy::run(&ws, &sizes.policy, &mut report),
                Phase::AgentScale => agent_scale::run(&ws, &sizes.agent_scale, &mut report),
                Phase::Ipam => Ok(()),
            };
            if let Err(e) = r {
                let msg = format!("{phase:?} phase stopped: {e:#}");
                eprintln!("bench: {msg}");
                report.notes.push(msg);
                if proc::interrupted() {
                    result = Err(e);
                    break;
                }
            }
        }
        drop(ws);
    }
    report.meta.insert(
        "bench duration".into(),
        json!(format!("{:.0} s", started.elapsed().as_secs_f64())),
    );
    write_outputs(&out, &report)?;
    print!("{}", report.markdown("cni-ebpf benchmark"));
    report.print_targets();
    println!("\nresults: {}", out.display());
    result
}

fn fill_meta(report: &mut Report, args: &Args, sizes: &Sizes, plugin: &Path, host: &dyn Host) {
    let m = &mut report.meta;
    m.insert("date (UTC)".into(), json!(timestamp()));
    m.insert("kernel".into(), json!(sh(&["uname", "-r"])));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    m.insert("cpu".into(), json!(format!("{cpu} × {}", sh(&["nproc"]))));
    let version = sh(&[&plugin.to_string_lossy(), "version"]);
    let linkage = if host.is_static(plugin) {
        "static"
    } else {
        "dynamically linked"
    };
    m.insert(
        "cni-ebpf".into(),
        json!(format!(
            "{} ({linkage}: {})",
            version.lines().next().unwrap_or_default(),
            plugin.display()
        )),
    );
    m.insert(
        "ratios".into(),
        json!(
            "data plane, Services and NetworkPolicy: the median of the per-repeat ratios \
             (each repeat measures the variants taking turns); elsewhere the ratio of the \
             medians"
        ),
    );
    m.insert(
        "cni-ebpf attach".into(),
        json!(args
            .attach
            .as_deref()
            .unwrap_or("the plugin's default (tc)")),
    );
    m.insert(
        "reference".into(),
        json!(format!(
            "containernetworking-plugins {} (bridge ipMasq + host-local + portmap), {}",
            sh(&[
                "dpkg-query",
                "-W",
                "-f=${Version}",
                "containernetworking-plugins"
            ]),
            sh(&["iptables", "--version"])
        )),
    );
    m.insert(
        "sizes".into(),
        json!(format!(
            "{} pods per control-plane run, workers {:?}; data plane {} repeats × {} s; scale levels {:?} with {} probe ADDs and {} connects, busy node after {} connections; Services {} repeats (nftables mode {}) × {} s; NetworkPolicy {} repeats × {} s, {} writes, {} ADDs, {} endpoints{}",
            sizes.control.pods,
            sizes.control.workers,
            sizes.data.repeats,
            sizes.data.seconds,
            sizes.scale.levels,
            sizes.scale.probes,
            sizes.scale.connects,
            sizes.scale.busy_flows,
            sizes.service.repeats,
            sizes.service.nft_repeats,
            sizes.service.seconds,
            sizes.policy.repeats,
            sizes.policy.seconds,
            sizes.policy.writes,
            sizes.policy.adds,
            sizes.policy.endpoints,
            if args.quick { " (--quick)" } else { "" }
        )),
    );
}

fn write_outputs(out: &Path, report: &Report) -> Result<()> {
    std::fs::write(
        out.join("report.json"),
        serde_json::to_vec_pretty(&report.json())?,
    )?;
    std::fs::write(out.join("report.md"), report.markdown("cni-ebpf benchmark"))?;
    if let Err(e) = charts(out, report) {
        eprintln!("bench: charts: {e:#}");
    }
    Ok(())
}

fn charts(out: &Path, report: &Report) -> Result<()> {
    // Control-plane latency percentiles (direct exec and libcni, sequential).
    for via in ["direct", "libcni", "embedded"] {
        let mut groups = Vec::new();
        for verb in ["add", "check", "del"] {
            for p in ["p50", "p90", "p99"] {
                let key = format!("cp.{via}.w1.{verb}.{p}");
                let Some(row) = report.rows.iter().find(|r| r.key == key) else {
                    continue;
                };
                groups.push(chart::Group {
                    label: format!("{} {p}", verb.to_uppercase()),
                    bars: row.values.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                });
            }
        }
        if !groups.is_empty() {
            chart::grouped_bars(
                &out.join(format!("control-latency-{via}.svg")),
                &format!("ADD / CHECK / DEL latency, {via}, sequential (lower is better)"),
                "ms",
                &groups,
                &["cni-ebpf", "reference"],
            )?;
        }
    }
    scale::chart(out, report)?;
    data::chart(out, report)?;
    service::chart(out, report)?;
    Ok(())
}

/// The workspace root (parent of this crate's manifest dir).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
