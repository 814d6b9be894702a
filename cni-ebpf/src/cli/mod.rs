//! The command line (when `CNI_COMMAND` is not set): `version`, `load`, `inspect`,
//! `agent` (NetworkPolicy, metrics and the opt-in host-gw routes of [`hostgw`]; `metrics`
//! is the agent without NetworkPolicy), `install`, `uninstall` (in [`install`]).

pub mod hostgw;
pub mod inspect;
pub mod install;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use clap::{Parser, Subcommand};
use serde_json::json;

use crate::{
    agent::ready::{Job, Readiness},
    cni::{
        config::{NetConf, DEFAULT_BPFFS_ROOT},
        env::Command,
    },
    datapath::Datapath,
    error::{Error, Result},
};

/// cni-ebpf: an eBPF-accelerated CNI plugin. Run by a container runtime with `CNI_COMMAND`
/// set, it is a CNI plugin; run by hand, it is this tool.
#[derive(Debug, Parser)]
#[command(name = "cni-ebpf", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, clap::Args)]
struct NetworkArgs {
    /// Network name (the conflist's `name`).
    #[arg(long)]
    network: String,
    /// `bpffsRoot` of the network.
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print the plugin version and the CNI spec versions it supports.
    Version,
    /// Load, verify and pin a network's programs and maps (what the first ADD does), attach
    /// the uplink programs, and print what is pinned.
    Load {
        #[command(flatten)]
        net: NetworkArgs,
        /// Uplink interface (default: the default route's device).
        #[arg(long)]
        uplink: Option<String>,
        /// Masquerade traffic leaving the cluster.
        #[arg(long)]
        ip_masq: bool,
        /// `cgroupPath`: the cgroup2 directory the socket hooks attach to; `""`: none
        /// (default: the cgroup2 root, as for ADD). Clap's path parser refuses an empty
        /// value, hence the plain one.
        #[arg(long, value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from))]
        cgroup_path: Option<PathBuf>,
    },
    /// Show a network's datapath: node config, endpoints with counters, host ports, NAT
    /// entries and per-reason counters.
    Inspect(inspect::InspectArgs),
    /// The node agent, the DaemonSet's main container: NetworkPolicy enforced from the API
    /// server's Namespaces, Pods and NetworkPolicies (watched), the tunnel entries and
    /// opt-in host-gw routes from the Nodes, the opt-in Service translation, Prometheus
    /// metrics (`GET /metrics`) and the probes (`GET /healthz`, `GET /ready`).
    Agent(AgentArgs),
    /// The agent without NetworkPolicy (`agent --policy=false`): metrics and the opt-in
    /// host-gw routes. Kept for manifests written before `agent`.
    Metrics(MetricsArgs),
    /// Install the plugin on this node (a DaemonSet's init container): copy this binary
    /// into the CNI binary directory and write the conflist, both atomically; idempotent.
    Install(Box<install::InstallArgs>),
    /// Remove the conflist and the binary; with --purge also the network's pins and IPAM
    /// store (only when no pods are left on it).
    Uninstall(install::UninstallArgs),
    /// The rest of a DEL, in a process of its own that DEL starts and does not wait for:
    /// purging the flows of the pod's addresses and deleting its retired veth pair.
    #[command(hide = true)]
    FinishDel {
        /// What is left, as DEL wrote it.
        job: String,
    },
}

/// Runs the CLI.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Cmd::Agent(args) => crate::logging::init_stderr(&args.log_level),
        // It logs where the DEL that started it does.
        Cmd::FinishDel { .. } => {}
        _ => crate::logging::init("warn", None, crate::logging::Rotation::default()),
    }
    let out = match cli.command {
        Cmd::Version => {
            println!("cni-ebpf {}", env!("CARGO_PKG_VERSION"));
            println!(
                "CNI spec versions: {}",
                crate::cni::version::SUPPORTED.join(", ")
            );
            let embedded = if crate::datapath::object::is_embedded() {
                "embedded"
            } else {
                "MISSING (built with AYA_BUILD_SKIP=1 or without the ebpf feature)"
            };
            println!("eBPF programs: {embedded}");
            Ok(())
        }
        Cmd::Load {
            net,
            uplink,
            ip_masq,
            cgroup_path,
        } => load(&net, uplink, ip_masq, cgroup_path),
        Cmd::Inspect(args) => inspect::run(&args),
        Cmd::Agent(args) => run_agent(
            &args.metrics,
            args.policy.then_some(PolicyArgs {
                state_dir: &args.state_dir,
                lease: std::time::Duration::from_secs(args.policy_lease),
            }),
            Some(args.kube_proxy_replacement),
        ),
        Cmd::Metrics(args) => run_agent(&args, None, None),
        Cmd::Install(args) => return install::run_install(&args),
        Cmd::Uninstall(args) => return install::run_uninstall(&args),
        Cmd::FinishDel { job } => crate::cmd::del::Unfinished::run_job(&job),
    };
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-ebpf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the agent serves: metrics, and the host-gw routes when asked.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Address and port `/metrics` is served on (what it reveals: docs/operations.md).
    #[arg(long, env = "CNI_EBPF_METRICS_LISTEN", default_value = crate::metrics::DEFAULT_LISTEN, value_parser = crate::metrics::parse_listen)]
    listen: std::net::SocketAddr,
    /// Address and port the probes (`/healthz`, `/ready`) are served on; the same as
    /// `--listen`: one listener serves all three.
    #[arg(long, env = "CNI_EBPF_PROBE_LISTEN", default_value = crate::metrics::DEFAULT_PROBE_LISTEN, value_parser = crate::metrics::parse_listen)]
    probe_listen: std::net::SocketAddr,
    /// `/healthz` fails when a job's loop has not come round for this many seconds, or a
    /// watched resource has seen no request, answer or byte for this long beyond
    /// `--watch-timeout` (docs/operations.md, "Probes").
    #[arg(long, env = "CNI_EBPF_STALL_TIMEOUT", default_value_t = crate::agent::liveness::DEFAULT_STALL_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
    stall_timeout: u64,
    /// `bpffsRoot` of the networks (the conflist's, which `install` writes from the same
    /// setting).
    #[arg(long, env = "CNI_EBPF_BPFFS_ROOT", default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// `dataDir` of the networks: their IPAM stores name each endpoint's pod (the
    /// metrics' `namespace` and `pod` labels).
    #[arg(long, env = "CNI_EBPF_DATA_DIR", default_value = crate::cni::config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// A network to report and enforce policy on (repeatable); default: every network
    /// found below `--bpffs-root`.
    #[arg(long = "network")]
    networks: Vec<String>,
    /// The node's CNI configuration directory (as mounted): its cni-ebpf conflists must
    /// agree with the agent's `bpffsRoot`, `dataDir` and NetworkPolicy, or the agent is
    /// not ready and says why.
    #[arg(long, env = "CNI_EBPF_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    #[command(flatten)]
    host_gw: hostgw::HostGwArgs,
}

/// `cni-ebpf agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    metrics: MetricsArgs,
    /// Enforce NetworkPolicy (`--policy=false`: off; no policy is then put in force on
    /// this node, and the pinned state is left as it is). The conflist's
    /// `networkPolicy`, which `install` writes from the same setting, must agree: a
    /// network that enforces policy keeps its pods closed until an agent does.
    #[arg(long, env = "CNI_EBPF_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    policy: bool,
    /// Where the agent writes each network's NetworkPolicy state (`<network>.json`:
    /// each pod's rule sets and the policies that select it), which `inspect` reads.
    #[arg(long, default_value = crate::agent::report::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Seconds each renewal of the agent's lease on a network's policy holds (renewed
    /// every second): once an agent has been gone this long, ADD closes every new pod of
    /// a network that enforces policy until an agent is back.
    #[arg(long, env = "CNI_EBPF_POLICY_LEASE", default_value_t = 60, value_parser = clap::value_parser!(u64).range(2..=86400))]
    policy_lease: u64,
    /// Translate Services in place of kube-proxy: ClusterIPs at the socket, for the pods
    /// and the node's own processes (see docs/services.md). Off: the Service maps are
    /// emptied at start, and kube-proxy's rules are what translates Services.
    #[arg(long, env = "CNI_EBPF_KUBE_PROXY_REPLACEMENT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    kube_proxy_replacement: bool,
    /// What the agent logs to stderr (`error`, `warn`, `info`, `debug`, or a
    /// `tracing-subscriber` filter).
    #[arg(long, env = "CNI_EBPF_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

/// What NetworkPolicy enforcement is given.
struct PolicyArgs<'a> {
    state_dir: &'a Path,
    lease: std::time::Duration,
}

/// Runs the agent: host-gw, NetworkPolicy (when given its settings) and Services
/// (`services`: `Some(true)` keeps the Service maps, `Some(false)` empties them, `None`
/// leaves them alone) on threads of their own, metrics on this one.
fn run_agent(
    args: &MetricsArgs,
    policy: Option<PolicyArgs<'_>>,
    services: Option<bool>,
) -> Result<()> {
    let settings = crate::agent::ready::Settings {
        conf_dir: args.cni_conf_dir.clone(),
        bpffs_root: args.bpffs_root.clone(),
        data_dir: args.data_dir.clone(),
        policy: policy.is_some(),
    };
    for why in crate::agent::ready::conflist_disagreements(&settings) {
        tracing::error!("{why}");
    }
    let readiness = Arc::new(Readiness::default().with_conflists(settings));
    let datapaths = crate::agent::datapaths::watch(&args.bpffs_root)?;
    start_host_gw(&args.host_gw, &args.bpffs_root, &readiness, datapaths)?;
    match services {
        Some(true) => start_services(args, &readiness)?,
        Some(false) => crate::agent::services::clear(&args.bpffs_root, &args.networks),
        None => {}
    }
    let bounds = crate::agent::liveness::Bounds::new(
        std::time::Duration::from_secs(args.stall_timeout),
        std::time::Duration::from_secs(u64::from(args.host_gw.api.watch_timeout)),
    );
    let mut exporter =
        crate::metrics::Exporter::new(args.bpffs_root.clone(), args.networks.clone())
            .with_readiness(Arc::clone(&readiness))
            .with_liveness(bounds)
            .with_data_dir(args.data_dir.clone());
    if let Some(policy) = policy {
        let totals = crate::agent::report::SharedTotals::default();
        start_policy(args, &policy, Arc::clone(&totals), &readiness)?;
        exporter = exporter.with_policy(totals);
    }
    crate::metrics::serve(
        crate::metrics::Listeners {
            metrics: args.listen,
            probes: args.probe_listen,
        },
        exporter,
    )
}

/// Starts NetworkPolicy enforcement on a thread of its own (in this thread's network
/// namespace, the node's). If it ever stops, the process exits: the pinned policy stays in
/// force meanwhile, and a restarted agent resumes it.
fn start_policy(
    args: &MetricsArgs,
    policy: &PolicyArgs<'_>,
    totals: crate::agent::report::SharedTotals,
    readiness: &Arc<Readiness>,
) -> Result<()> {
    let (root, networks, api, state_dir, lease) = (
        args.bpffs_root.clone(),
        args.networks.clone(),
        args.host_gw.api.clone(),
        policy.state_dir.to_owned(),
        policy.lease,
    );
    readiness.wait_for(Job::Policy);
    let readiness = Arc::clone(readiness);
    std::thread::Builder::new()
        .name("policy".into())
        .spawn(move || {
            let err = match crate::agent::watch::run(
                &root, &networks, &api, &state_dir, lease, totals, &readiness,
            ) {
                Ok(()) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            eprintln!("cni-ebpf policy: {err}; exiting");
            std::process::exit(1);
        })
        .map(drop)
        .map_err(|e| Error::io("starting the NetworkPolicy thread", e))
}

/// Starts the Service watcher (`crate::agent::services`) on a thread of its own. If it
/// ever stops, the process exits: the maps stay as they are meanwhile, and a restarted
/// agent resumes them.
fn start_services(args: &MetricsArgs, readiness: &Arc<Readiness>) -> Result<()> {
    let (root, networks, api) = (
        args.bpffs_root.clone(),
        args.networks.clone(),
        args.host_gw.api.clone(),
    );
    let node = args.host_gw.node_name.clone().unwrap_or_default();
    readiness.wait_for(Job::Services);
    let readiness = Arc::clone(readiness);
    std::thread::Builder::new()
        .name("services".into())
        .spawn(move || {
            let err = match crate::agent::services::run(&root, &networks, &api, &node, &readiness) {
                Ok(()) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            eprintln!("cni-ebpf services: {err}; exiting");
            std::process::exit(1);
        })
        .map(drop)
        .map_err(|e| Error::io("starting the Service watcher thread", e))
}

/// Starts the Node watcher (`crate::agent::nodes`: host-gw routes, tunnel entries) on a
/// thread of its own when `--host-gw` is given or the node's name is known. The thread is
/// created in this thread's network namespace (the node's) and stays there. If it ever
/// stops, the process exits: a main container without its routes must restart.
fn start_host_gw(
    args: &hostgw::HostGwArgs,
    root: &Path,
    readiness: &Arc<Readiness>,
    datapaths: tokio::sync::watch::Receiver<u64>,
) -> Result<()> {
    if !crate::agent::nodes::wanted(args) {
        return Ok(());
    }
    let own = hostgw::check(args)?;
    readiness.wait_for(Job::Nodes);
    let (args, root, readiness) = (args.clone(), root.to_owned(), Arc::clone(readiness));
    std::thread::Builder::new()
        .name("nodes".into())
        .spawn(move || {
            let err = match crate::agent::nodes::run(&args, &own, &root, &readiness, datapaths) {
                Ok(()) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            eprintln!("cni-ebpf nodes: {err}; exiting");
            std::process::exit(1);
        })
        .map(drop)
        .map_err(|e| Error::io("starting the Node watcher thread", e))
}

fn load(
    net: &NetworkArgs,
    uplink: Option<String>,
    ip_masq: bool,
    cgroup_path: Option<PathBuf>,
) -> Result<()> {
    let mut conf = json!({
        "cniVersion": crate::cni::version::LATEST,
        "name": net.network,
        "type": "cni-ebpf",
        "bpffsRoot": net.bpffs_root,
        "uplink": uplink,
        "ipMasq": ip_masq,
    });
    if let Some(p) = cgroup_path {
        conf["cgroupPath"] = json!(p);
    }
    let conf = NetConf::parse(conf.to_string().as_bytes(), Command::Add)?;
    let started = std::time::Instant::now();
    let dp = Datapath::open_or_load(&conf)?;
    println!(
        "loaded network {} in {:.1} ms",
        conf.name,
        started.elapsed().as_secs_f64() * 1e3
    );
    let root = dp.pins().version_dir();
    println!("pins under {}:", root.display());
    for dir in ["progs", "maps", "links"] {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .map_err(|e| Error::io(format!("listing {}", root.join(dir).display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match dir {
                "progs" => match aya::programs::ProgramInfo::from_pin(&p) {
                    Ok(info) => println!(
                        "  prog {name:<24} id {:<6} {} bytes jitted, {} instructions verified",
                        info.id(),
                        info.size_jitted(),
                        info.verified_instruction_count().unwrap_or(0)
                    ),
                    Err(e) => println!("  prog {name:<24} ({e})"),
                },
                "maps" => match aya::maps::MapInfo::from_pin(&p) {
                    Ok(info) => println!(
                        "  map  {name:<24} id {:<6} {}, {} entries × ({} + {}) bytes",
                        info.id(),
                        info.map_type()
                            .map_or_else(|e| e.to_string(), |t| format!("{t:?}")),
                        info.max_entries(),
                        info.key_size(),
                        info.value_size()
                    ),
                    Err(e) => println!("  map  {name:<24} ({e})"),
                },
                _ => println!("  link {name}"),
            }
        }
    }
    Ok(())
}
