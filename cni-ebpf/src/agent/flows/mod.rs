//! Flows (`--flows`, on by default): the agent turns the datapath's flow events on
//! (`cni-ebpf-bpf/src/observe.rs`), reads them, names their addresses ([`directory`]),
//! keeps the latest in a bounded [`window`], serves them to authorized readers
//! ([`serve`], [`authz`]) and, when asked, writes each as a JSON line for a log pipeline
//! (`--flow-log`). The record's schema: [`record`]; what the node's translations did to a
//! flow, remembered from its first record to its end: [`translated`].
//!
//! One loop on a thread of its own, every [`TICK`]: each network's ring is read to the
//! end (a network whose datapath appears is turned on and opened at once); every
//! [`SWEEP_EVERY`], the flows followed are walked, and those idle past
//! `--flow-idle-timeout` are reported as ended (`expired`) and forgotten. The datapath
//! never waits for this loop: a ring it does not empty in time fills, and the programs
//! count the events that found it full (`flow_event_ring_full`).
//!
//! The thread runs at a lower priority ([`FLOWS_NICE`]): what it does waits in the ring
//! for the next tick anyway, and the pods' own work should not wait for it. On a busy
//! node its burst of records each tick would otherwise take a core from a pod's
//! connection in the middle of its exchange.

pub mod authz;
pub mod directory;
pub mod metrics;
pub mod record;
pub mod serve;
pub mod translated;
pub mod window;

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use cni_ebpf_common::{
    FlowLogKey, DEFAULT_FLOW_EVENTS_PER_SEC, FLOW_ENDED, FLOW_EVENT_END, FLOW_EVENT_START,
};
use futures::StreamExt as _;

use self::{
    authz::{Auth, Authorizer},
    directory::Directory,
    record::{Context, Flow, Masquerade},
    translated::Translations,
    window::Window,
};
use super::{
    http::parse_listen,
    ready::{Job, Readiness},
    report::{read_state, NetworkState},
    tls::ServingCert,
};
use crate::{
    datapath::{
        observe::{FlowEvents, FlowSettings},
        Datapath,
    },
    error::{Error, Result},
    k8s::{ApiArgs, ApiClient},
};

/// Default address flows are served on: the node's loopback (the DaemonSet's manifest
/// serves them on `$(NODE_IP):9672`, for `cni-ebpf observe` across the cluster).
pub const DEFAULT_FLOWS_LISTEN: &str = "127.0.0.1:9672";
/// How often the rings are read.
pub const TICK: Duration = Duration::from_millis(100);
/// How often the flows followed are walked for idle ones.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// The flows thread's nice value: below the pods' and the agent's other jobs, never
/// idle-only (it still gets its share of a fully busy node, about a tenth of a nice-0
/// task's).
const FLOWS_NICE: libc::c_int = 10;
/// How often the bpffs is looked at for networks that came or went.
const NETWORKS_EVERY: Duration = Duration::from_secs(1);
/// How long an ended flow's entry is kept after its end (its last packets still counted).
const ENDED_LINGER_NS: u64 = 5_000_000_000;

/// `cni-ebpf agent`'s flow settings.
#[derive(Debug, Clone, clap::Args)]
pub struct FlowArgs {
    /// Follow pod flows and serve them (`--flows=false`: the programs follow nothing).
    #[arg(long = "flows", id = "flows", env = "CNI_EBPF_FLOWS", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Address and port `/flows` is served on.
    #[arg(long, env = "CNI_EBPF_FLOWS_LISTEN", default_value = DEFAULT_FLOWS_LISTEN, value_parser = parse_listen)]
    pub flows_listen: SocketAddr,
    /// Who may read flows: `kubernetes` (a bearer token the API server authenticates and
    /// authorizes for `get` on `/flows`) or `none` (a loopback listener only).
    #[arg(
        long,
        env = "CNI_EBPF_FLOWS_AUTH",
        value_enum,
        default_value = "kubernetes"
    )]
    pub flows_auth: Auth,
    /// Serve `/flows` over HTTPS with this certificate (PEM, the chain leaf first; read
    /// again when it changes). Without it, readers' tokens and flows cross the network in
    /// clear.
    #[arg(long, env = "CNI_EBPF_FLOWS_TLS_CERT", requires = "flows_tls_key")]
    pub flows_tls_cert: Option<PathBuf>,
    /// The private key of `--flows-tls-cert` (PEM).
    #[arg(long, env = "CNI_EBPF_FLOWS_TLS_KEY", requires = "flows_tls_cert")]
    pub flows_tls_key: Option<PathBuf>,
    /// Flow records the node keeps in memory for queries (about 1 KiB each).
    #[arg(long, env = "CNI_EBPF_FLOW_WINDOW", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub flow_window: u64,
    /// Flow events each CPU's programs may send per second (at most twice as many at
    /// once); what is beyond is counted as `flow_event_rate_limited`.
    #[arg(long, env = "CNI_EBPF_FLOW_EVENTS_PER_SECOND", default_value_t = DEFAULT_FLOW_EVENTS_PER_SEC, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub flow_events_per_second: u32,
    /// Seconds without a packet after which a flow is reported as ended (`expired`).
    #[arg(long, env = "CNI_EBPF_FLOW_IDLE_TIMEOUT", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub flow_idle_timeout: u64,
    /// Also write every flow record as a JSON line here (`-`: standard output).
    #[arg(long, env = "CNI_EBPF_FLOW_LOG")]
    pub flow_log: Option<PathBuf>,
}

impl FlowArgs {
    /// `--flows-auth=none` on a listener other hosts can reach is refused; a serving
    /// certificate that does not load is.
    ///
    /// # Errors
    /// Those cases, naming the setting.
    pub fn check(&self) -> Result<()> {
        if self.enabled && self.flows_auth == Auth::None && !self.flows_listen.ip().is_loopback() {
            return Err(Error::config(
                "--flows-auth",
                format!(
                    "none serves flows to anyone who can connect: only on a loopback listener, not {}",
                    self.flows_listen
                ),
            ));
        }
        if let (true, Some(cert), Some(key)) =
            (self.enabled, &self.flows_tls_cert, &self.flows_tls_key)
        {
            ServingCert::load(cert, key)?;
        }
        Ok(())
    }
}

/// Where the loop finds its networks and names its records.
#[derive(Debug, Clone)]
pub struct Sources {
    pub bpffs_root: PathBuf,
    pub networks: Vec<String>,
    pub state_dir: PathBuf,
    pub node: String,
    /// The agent connects pods' sockets to Service backends (`--kube-proxy-replacement`):
    /// a flow's start asks the socket which Service it was for.
    pub socket_services: bool,
}

/// One network whose flows are read.
struct Network {
    dp: Datapath,
    ring: FlowEvents,
    /// Its policy state file's contents, and the file's modification time when read
    /// (read again as soon as it changes: a round writes it after each swap).
    state: Option<NetworkState>,
    state_written: Option<std::time::SystemTime>,
    /// What it masquerades, and when that was read (once a second).
    masquerade: Option<Masquerade>,
    masquerade_read: Option<Instant>,
}

/// Runs the flows job: the reader loop and the server. Returns only on a failure.
///
/// # Errors
/// The runtime or the listener cannot start.
pub fn run(
    args: &FlowArgs,
    api: &ApiArgs,
    sources: &Sources,
    totals: &metrics::SharedFlowTotals,
    readiness: &Readiness,
) -> Result<()> {
    // Linux's nice value is per thread: this one, and the threads the runtime starts.
    // SAFETY: plain syscall on the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, FLOWS_NICE) } != 0 {
        tracing::debug!(
            "flows: cannot lower the thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the flows runtime", e))?;
    runtime.block_on(async {
        let directory = Directory::default();
        let authorizer = match args.flows_auth {
            Auth::None => Authorizer::open(),
            Auth::Kubernetes => Authorizer::kubernetes(api.clone()),
        };
        tokio::spawn(keep_names(api.clone(), directory.clone()));
        let window = Arc::new(Window::new(
            usize::try_from(args.flow_window).unwrap_or(20_000),
        ));
        let listener = tokio::net::TcpListener::bind(args.flows_listen)
            .await
            .map_err(|e| Error::io(format!("listening on {}", args.flows_listen), e))?;
        let bound = listener.local_addr().unwrap_or(args.flows_listen);
        let tls = match (&args.flows_tls_cert, &args.flows_tls_key) {
            (Some(cert), Some(key)) => {
                let t = ServingCert::load(cert, key)?;
                if t.waiting() {
                    tracing::warn!(
                        "flows: no serving certificate at {} yet: /flows serves no \
                         connection until it and {} are there",
                        cert.display(),
                        key.display()
                    );
                }
                Some(Arc::new(t))
            }
            _ => None,
        };
        if tls.is_some() {
            eprintln!("cni-ebpf agent: serving /flows on https://{bound}");
        } else {
            eprintln!("cni-ebpf agent: serving /flows on http://{bound}");
            if args.flows_auth == Auth::Kubernetes && !bound.ip().is_loopback() {
                tracing::warn!(
                    "flows: readers' tokens and the flows cross the network in clear on \
                     {bound}: give --flows-tls-cert and --flows-tls-key"
                );
            }
        }
        tokio::spawn(serve::run(
            listener,
            Arc::clone(&window),
            Arc::new(authorizer),
            sources.node.clone(),
            tls,
        ));
        let mut sink = open_sink(args.flow_log.as_deref())?;
        let mut networks: BTreeMap<String, Network> = BTreeMap::new();
        let translations = std::cell::RefCell::new(Translations::default());
        let mut last_sweep = Instant::now();
        let mut last_scan: Option<Instant> = None;
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            if last_scan.is_none_or(|t| t.elapsed() >= NETWORKS_EVERY) {
                open_networks(args, sources, &mut networks);
                last_scan = Some(Instant::now());
            }
            let sweep = last_sweep.elapsed() >= SWEEP_EVERY;
            if sweep {
                last_sweep = Instant::now();
            }
            for (name, n) in &mut networks {
                let flows = read(name, n, sources, &directory, &translations, args, sweep);
                if !flows.is_empty() {
                    let mut t = totals
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    for f in &flows {
                        t.count(f);
                    }
                }
                if let Some(s) = sink.as_mut() {
                    for flow in &flows {
                        write_line(s, flow);
                    }
                }
                window.push_all(flows);
            }
            totals
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .window = (window.len() as u64, window.capacity() as u64);
            readiness.done(Job::Flows);
        }
    })
}

/// Keeps `directory` from the API server. Without one to reach (none configured, no
/// credentials), flows are served with addresses only: said once, then looked for again
/// every 30 s without a word.
async fn keep_names(api: ApiArgs, directory: Directory) {
    let mut said = false;
    let client = loop {
        match ApiClient::new(&api) {
            Ok(c) => break c.client(),
            Err(e) if !said => {
                tracing::info!("flows: no API server to name the flows' addresses with: {e}");
                said = true;
            }
            Err(e) => tracing::debug!("flows: still no API server: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    };
    let mut watchers = directory::watch(&client, &api.watcher_config(), &directory);
    while watchers.next().await.is_some() {}
}

/// Turns flows on (at the configured rate) in every network with pins, and opens its
/// ring; a network whose pins are gone is dropped.
fn open_networks(args: &FlowArgs, sources: &Sources, networks: &mut BTreeMap<String, Network>) {
    let found = super::watch::networks(&sources.bpffs_root, &sources.networks);
    networks.retain(|name, _| found.iter().any(|p| network_name(p) == *name));
    for dir in found {
        let name = network_name(&dir);
        if networks.contains_key(&name) {
            continue;
        }
        let dp = match Datapath::open_at(&dir) {
            Ok(Some(dp)) => dp,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("flows: network {name}: {e}");
                continue;
            }
        };
        let rate = args.flow_events_per_second;
        let on = dp
            .set_flow_config(&FlowSettings {
                enabled: args.enabled,
                events_per_sec: rate,
                burst: rate.saturating_mul(2),
                socket_services: sources.socket_services,
            })
            .and_then(|()| dp.flow_events());
        match on {
            Ok(ring) if args.enabled => {
                networks.insert(
                    name,
                    Network {
                        dp,
                        ring,
                        state: None,
                        state_written: None,
                        masquerade: None,
                        masquerade_read: None,
                    },
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("flows: network {name}: {e}"),
        }
    }
}

fn network_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The records of network `name`'s waiting events, and (`sweep`) of its flows idle past
/// the timeout, which it forgets.
fn read(
    name: &str,
    n: &mut Network,
    sources: &Sources,
    directory: &Directory,
    translations: &std::cell::RefCell<Translations>,
    args: &FlowArgs,
    sweep: bool,
) -> Vec<Arc<Flow>> {
    let written = std::fs::metadata(super::report::state_file(&sources.state_dir, name))
        .and_then(|m| m.modified())
        .ok();
    if written != n.state_written {
        n.state = read_state(&sources.state_dir, name);
        n.state_written = written;
    }
    if n.masquerade_read
        .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
    {
        n.masquerade = masquerade(&n.dp);
        n.masquerade_read = Some(Instant::now());
    }
    let (offset, now_mono) = clock_offset();
    let cx = Context {
        node: &sources.node,
        network: name,
        directory,
        state: n.state.as_ref(),
        clock_offset_ns: offset,
        masquerade: n.masquerade.as_ref(),
        snat: Some(&|key: &FlowLogKey| {
            translations
                .borrow_mut()
                .snat(key, |k| n.dp.masqueraded_source(k))
        }),
        dnat: Some(&|key: &FlowLogKey| translations.borrow_mut().dnat(key)),
    };
    // Each event read from the ring straight into its record, in the memory the window
    // keeps it in: no list of events or of records copied on the way (at full rate a
    // tick's thousand records would be a fresh mapping of pages each time).
    let mut out: Vec<Arc<Flow>> = std::iter::from_fn(|| n.ring.next_event())
        .map(|ev| {
            if ev.kind == FLOW_EVENT_START {
                translations.borrow_mut().starts(&ev.key);
            }
            let flow = record::from_event(&ev, &cx);
            if ev.kind == FLOW_EVENT_END {
                translations.borrow_mut().forget(&ev.key);
            }
            Arc::new(flow)
        })
        .collect();
    if sweep {
        let idle_ns = args.flow_idle_timeout.saturating_mul(1_000_000_000);
        match n.dp.flow_log() {
            Ok(flows) => {
                for (key, entry) in flows {
                    let quiet = now_mono.saturating_sub(entry.last_ns);
                    let ended = entry.flags & FLOW_ENDED != 0;
                    if (ended && quiet >= ENDED_LINGER_NS) || (!ended && quiet >= idle_ns) {
                        if !ended {
                            out.push(Arc::new(record::expired(&key, &entry, now_mono, &cx)));
                            translations.borrow_mut().forget(&key);
                        }
                        if let Err(e) = n.dp.forget_flow(&key) {
                            tracing::warn!("flows: network {name}: {e}");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("flows: network {name}: {e}"),
        }
        out.sort_by_key(|f| f.time_unix_nano);
    }
    out
}

/// What `dp`'s network masquerades (`None`: nothing, or its configuration unreadable).
fn masquerade(dp: &Datapath) -> Option<Masquerade> {
    let c = dp.node_config_view().ok()?;
    c.ip_masq.then(|| Masquerade {
        node4: c.node_addr,
        node6: c.node_addr6,
        cluster: c
            .cluster_cidrs
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect(),
        node_addrs: c.node_addrs.clone(),
    })
}

/// (wall clock − `CLOCK_MONOTONIC`, `CLOCK_MONOTONIC`) in nanoseconds, now.
fn clock_offset() -> (i128, u64) {
    let ns = |clock| {
        nix::time::clock_gettime(clock)
            .map(|t| i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
            .unwrap_or(0)
    };
    let mono = ns(nix::time::ClockId::CLOCK_MONOTONIC);
    let wall = ns(nix::time::ClockId::CLOCK_REALTIME);
    (wall - mono, u64::try_from(mono).unwrap_or(0))
}

/// Where `--flow-log` writes.
fn open_sink(path: Option<&Path>) -> Result<Option<Box<dyn std::io::Write + Send>>> {
    let Some(path) = path else {
        return Ok(None);
    };
    if path == Path::new("-") {
        return Ok(Some(Box::new(std::io::stdout())));
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening --flow-log {}", path.display()), e))?;
    Ok(Some(Box::new(std::io::LineWriter::new(f))))
}

fn write_line(sink: &mut Box<dyn std::io::Write + Send>, flow: &Flow) {
    let Ok(mut line) = serde_json::to_vec(flow) else {
        return;
    };
    line.push(b'\n');
    if let Err(e) = sink.write_all(&line) {
        tracing::warn!("flows: writing --flow-log: {e}");
    }
}

/// `--flows=false`: the programs of every network found stop following flows.
pub fn turn_off(bpffs_root: &Path, networks: &[String]) {
    for dir in super::watch::networks(bpffs_root, networks) {
        if let Ok(Some(dp)) = Datapath::open_at(&dir) {
            if let Err(e) = dp.set_flow_config(&FlowSettings::default()) {
                tracing::warn!("flows: network {}: {e}", network_name(&dir));
            }
        }
    }
}
