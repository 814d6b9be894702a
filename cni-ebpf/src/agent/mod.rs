//! `cni-ebpf agent`: the node agent, the DaemonSet's long-running process. It owns
//! everything that runs beside the datapath rather than in a CNI verb:
//!
//! - [`run`] (this file): the wiring — one thread per job ([`Job`]), started the same way,
//!   and the HTTP endpoint on the main thread;
//! - [`http`]: the bounded HTTP/1 endpoint (`/metrics`, `/healthz`, `/ready`);
//!   [`metrics`]: what `/metrics` serves; [`ready`] and [`liveness`]: what the probes
//!   answer;
//! - [`watch`]: the watchers that keep the agent's view of the cluster, and NetworkPolicy's
//!   loop of rounds; [`reconcile`]: one NetworkPolicy round over the pinned maps;
//!   [`report`]: the state file `inspect` reads and the verdict totals per policy;
//! - [`nodes`]: the Node watcher, which keeps the tunnel entries and the direct routes of
//!   [`routes`] (host-gw, crossSubnet);
//! - [`services`]: Services translated at the socket in place of kube-proxy (opt-in), from
//!   the slim objects of [`service_objects`] through [`service_table`]; and
//!   [`health_check_ports`]: the health-check node ports of their
//!   `externalTrafficPolicy: Local` Services;
//! - [`datapaths`]: networks whose datapath appears on the node (a first ADD), so that
//!   every job acts on them at once.
//!
//! Nothing below the agent imports it: the datapath and the policy compiler know nothing
//! of it.

pub mod datapaths;
pub mod flows;
pub mod health_check_ports;
pub mod http;
pub mod liveness;
pub mod metrics;
pub mod nodes;
pub mod ready;
pub mod reconcile;
pub mod report;
pub mod routes;
pub mod service_objects;
pub mod service_table;
pub mod services;
pub mod tls;
pub mod watch;
pub mod wireguard;

use std::{path::PathBuf, sync::Arc, time::Duration};

pub use reconcile::{Reconciler, Round};

use self::ready::{Job, Readiness};
use crate::{
    cni::config::DEFAULT_BPFFS_ROOT,
    error::{Error, Result},
    k8s::ApiArgs,
};

/// `cni-ebpf agent`: its settings, every one also an environment variable the
/// DaemonSet's manifest sets.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Address and port `/metrics` is served on (what it reveals: docs/operations.md).
    #[arg(long, env = "CNI_EBPF_METRICS_LISTEN", default_value = http::DEFAULT_LISTEN, value_parser = http::parse_listen)]
    listen: std::net::SocketAddr,
    /// Address and port the probes (`/healthz`, `/ready`) are served on; the same as
    /// `--listen`: one listener serves all three.
    #[arg(long, env = "CNI_EBPF_PROBE_LISTEN", default_value = http::DEFAULT_PROBE_LISTEN, value_parser = http::parse_listen)]
    probe_listen: std::net::SocketAddr,
    /// `/healthz` fails when a job's loop has not come round for this many seconds, or a
    /// watched resource has seen no request, answer or byte for this long beyond
    /// `--watch-timeout` (docs/operations.md, "Probes").
    #[arg(long, env = "CNI_EBPF_STALL_TIMEOUT", default_value_t = liveness::DEFAULT_STALL_SECS, value_parser = clap::value_parser!(u64).range(1..=3600))]
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
    /// This node's name (NODE_NAME from the downward API): the Node watcher's own node
    /// (its pod CIDRs get no route or tunnel entry), and the node whose endpoints are
    /// local to the Service translation.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    #[command(flatten)]
    host_gw: routes::HostGwArgs,
    #[command(flatten)]
    wireguard: wireguard::WireguardArgs,
    #[command(flatten)]
    pub(crate) flows: flows::FlowArgs,
    /// Enforce NetworkPolicy (`--policy=false`: off; no policy is then put in force on
    /// this node, and the pinned state is left as it is). The conflist's
    /// `networkPolicy`, which `install` writes from the same setting, must agree: a
    /// network that enforces policy keeps its pods closed until an agent does.
    #[arg(long, env = "CNI_EBPF_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    policy: bool,
    /// Where the agent writes each network's NetworkPolicy state (`<network>.json`:
    /// each pod's rule sets and the policies that select it), which `inspect` reads.
    #[arg(long, default_value = report::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Seconds each renewal of the agent's lease on a network's policy holds (renewed
    /// every second): once an agent has been gone this long, ADD closes every new pod of
    /// a network that enforces policy until an agent is back.
    #[arg(long, env = "CNI_EBPF_POLICY_LEASE", default_value_t = 60, value_parser = clap::value_parser!(u64).range(2..=86400))]
    policy_lease: u64,
    /// The least time, in seconds, an address a pod learned from a DNS answer stays its
    /// peer for the cluster policy rules that name its domain, whatever shorter TTL the
    /// answer gave (resolvers and runtimes cache answers past their TTL). At most a day.
    #[arg(long, env = "CNI_EBPF_DNS_MIN_TTL", default_value_t = cni_ebpf_common::DEFAULT_DNS_MIN_TTL_S, value_parser = clap::value_parser!(u32).range(0..=86400))]
    dns_min_ttl: u32,
    /// Translate Services in place of kube-proxy: ClusterIPs at the socket, for the pods
    /// and the node's own processes (see docs/services.md). Off: the Service maps are
    /// emptied at start, and kube-proxy's rules are what translates Services.
    #[arg(long, env = "CNI_EBPF_KUBE_PROXY_REPLACEMENT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    kube_proxy_replacement: bool,
    /// What the agent logs to stderr (`error`, `warn`, `info`, `debug`, or a
    /// `tracing-subscriber` filter).
    #[arg(long, env = "CNI_EBPF_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    #[command(flatten)]
    api: ApiArgs,
}

impl AgentArgs {
    /// The node's name, when known.
    fn node(&self) -> Option<&str> {
        self.node_name.as_deref().filter(|n| !n.is_empty())
    }
}

/// Runs the agent: its jobs on threads of their own — the Node watcher (tunnel entries and
/// routes, whenever the node's name is known), NetworkPolicy (`--policy`), Services
/// (`--kube-proxy-replacement`; off, the Service maps are emptied) — and the HTTP
/// endpoint on this one. Returns only on a failure to start; a job that stops ends the
/// process.
///
/// # Errors
/// A setting that cannot work (`--host-gw` without the node's name), or a job or the
/// endpoint that cannot start.
pub fn run(args: &AgentArgs) -> Result<()> {
    let settings = ready::Settings {
        conf_dir: args.cni_conf_dir.clone(),
        bpffs_root: args.bpffs_root.clone(),
        data_dir: args.data_dir.clone(),
        policy: args.policy,
    };
    for why in ready::conflist_disagreements(&settings) {
        tracing::error!("{why}");
    }
    args.flows.check()?;
    let readiness = Arc::new(Readiness::default().with_conflists(settings));
    let datapaths = datapaths::watch(&args.bpffs_root)?;
    match (args.node(), args.host_gw.enabled) {
        (Some(own), _) => {
            let (args, own) = (args.clone(), own.to_owned());
            spawn(Job::Nodes, &readiness, move |readiness| {
                nodes::run(
                    &args.host_gw,
                    &args.wireguard,
                    &args.cni_conf_dir,
                    &args.api,
                    &own,
                    &args.bpffs_root,
                    readiness,
                    datapaths,
                )
            })?;
        }
        (None, true) => return Err(Error::config(
            "--node-name",
            "--host-gw needs this node's name (--node-name, or NODE_NAME from the downward API)",
        )),
        (None, false) => {}
    }
    if args.kube_proxy_replacement {
        let args = args.clone();
        spawn(Job::Services, &readiness, move |readiness| {
            let node = args.node().unwrap_or_default();
            services::run(&args.bpffs_root, &args.networks, &args.api, node, readiness)
        })?;
    } else {
        services::clear(&args.bpffs_root, &args.networks);
    }
    let flow_totals = flows::metrics::SharedFlowTotals::default();
    if args.flows.enabled {
        let (args, totals) = (args.clone(), flow_totals.clone());
        spawn(Job::Flows, &readiness, move |readiness| {
            let sources = flows::Sources {
                bpffs_root: args.bpffs_root.clone(),
                networks: args.networks.clone(),
                state_dir: args.state_dir.clone(),
                node: args.node().unwrap_or_default().to_owned(),
                socket_services: args.kube_proxy_replacement,
            };
            flows::run(&args.flows, &args.api, &sources, &totals, readiness)
        })?;
    } else {
        flows::turn_off(&args.bpffs_root, &args.networks);
    }
    let bounds = liveness::Bounds::new(
        Duration::from_secs(args.stall_timeout),
        Duration::from_secs(u64::from(args.api.watch_timeout)),
    );
    let mut exporter = metrics::Exporter::new(args.bpffs_root.clone(), args.networks.clone())
        .with_readiness(Arc::clone(&readiness))
        .with_liveness(bounds)
        .with_data_dir(args.data_dir.clone())
        .with_wireguard(args.wireguard.key.clone());
    if args.flows.enabled {
        exporter = exporter.with_flows(flow_totals);
    }
    if args.policy {
        let totals = report::SharedTotals::default();
        exporter = exporter.with_policy(totals.clone());
        let args = args.clone();
        spawn(Job::Policy, &readiness, move |readiness| {
            let holds = watch::Holds {
                lease: Duration::from_secs(args.policy_lease),
                dns_min_ttl_s: args.dns_min_ttl,
            };
            watch::run(
                &args.bpffs_root,
                &args.networks,
                &args.api,
                &args.state_dir,
                holds,
                totals,
                readiness,
            )
        })?;
    }
    http::serve(
        http::Listeners {
            metrics: args.listen,
            probes: args.probe_listen,
        },
        exporter,
    )
}

/// Starts one job on a thread of its own, in this thread's network namespace (the
/// node's), after telling `readiness` to wait for its first round. If the job ever stops,
/// the process exits: what it put in the pinned maps and the routing table stays in force
/// meanwhile, and a restarted agent resumes it.
fn spawn(
    job: Job,
    readiness: &Arc<Readiness>,
    work: impl FnOnce(&Readiness) -> Result<()> + Send + 'static,
) -> Result<()> {
    readiness.wait_for(job);
    let readiness = Arc::clone(readiness);
    std::thread::Builder::new()
        .name(job.thread().into())
        .spawn(move || {
            let why = match work(&readiness) {
                Ok(()) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            eprintln!("cni-ebpf {}: {why}; exiting", job.thread());
            std::process::exit(1);
        })
        .map(drop)
        .map_err(|e| Error::io(format!("starting the {} thread", job.name()), e))
}
