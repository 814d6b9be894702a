//! `cni-ebpf inspect`: a network's datapath as its pinned maps hold it (node config,
//! endpoints with counters, host ports, NAT entries, flows, NetworkPolicy rule sets, the
//! Service frontends translated at the socket, map fill, reason counters), with the NetworkPolicy state the agent wrote (the policies
//! that select each pod) and the latest packets the policy refused (`--follow` streams
//! them),
//! each endpoint with the Kubernetes pod it belongs to, optionally for one pod only.
//!
//! The pod comes from the IPAM store's record of the endpoint (`K8S_POD_NAMESPACE` and
//! `K8S_POD_NAME` of the ADD): the maps the programs read keep no names.

mod report;
mod text;

use std::{collections::HashSet, fmt, path::PathBuf};

use self::report::{Report, Shown};
use super::NetworkArgs;
use crate::{
    agent::report::read_state,
    cni::config::DEFAULT_DATA_DIR,
    datapath::{policy::DenyView, Datapath},
    error::{Error, Result},
    ipam::PodRef,
};

/// Arguments of `cni-ebpf inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    net: NetworkArgs,
    /// `dataDir` of the network (where the IPAM store names each endpoint's pod).
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Only this pod: `NAMESPACE/NAME`, or `NAME` in any namespace. Its endpoints, host
    /// ports and NAT entries; node-wide sections (maps, reasons) stay whole.
    #[arg(long)]
    pod: Option<String>,
    /// Only pods of this Kubernetes namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Where the agent writes its NetworkPolicy state (which policies select each pod).
    #[arg(long, default_value = crate::agent::report::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// The agent's WireGuard key file (`peers.json` next to it names the peers).
    #[command(flatten)]
    wireguard: crate::agent::wireguard::WireguardArgs,
    /// Streams the packets NetworkPolicy refuses (of the pods `--pod`/`--namespace`
    /// select, or all), one line each (`--json`: one object each), until interrupted.
    #[arg(long)]
    follow: bool,
}

impl InspectArgs {
    fn filter(&self) -> Option<PodFilter> {
        let (ns, name) = match self
            .pod
            .as_deref()
            .map(|p| p.split_once('/').map_or((None, p), |(n, p)| (Some(n), p)))
        {
            Some((ns, name)) => (
                ns.map(str::to_owned).or_else(|| self.namespace.clone()),
                Some(name.to_owned()),
            ),
            None => (self.namespace.clone(), None),
        };
        (ns.is_some() || name.is_some()).then_some(PodFilter {
            namespace: ns,
            name,
        })
    }
}

/// Which pods `--pod` / `--namespace` select.
struct PodFilter {
    namespace: Option<String>,
    name: Option<String>,
}

impl PodFilter {
    fn matches(&self, pod: Option<&PodRef>) -> bool {
        pod.is_some_and(|p| {
            self.namespace.as_ref().is_none_or(|n| *n == p.namespace)
                && self.name.as_ref().is_none_or(|n| *n == p.name)
        })
    }
}

impl fmt::Display for PodFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, "pod {ns}/{name}"),
            (None, Some(name)) => write!(f, "a pod named {name}"),
            (Some(ns), None) => write!(f, "namespace {ns}"),
            (None, None) => write!(f, "any pod"),
        }
    }
}

/// Runs `cni-ebpf inspect`: gathers one [`Report`] and renders it as text or JSON, or
/// follows the refusals.
pub fn run(args: &InspectArgs) -> Result<()> {
    let net = &args.net;
    let dir = net.bpffs_root.join(&net.network);
    let dp = Datapath::open_at(&dir)?.ok_or_else(|| {
        Error::datapath(
            "inspect",
            format!("nothing is pinned under {}", dir.display()),
        )
    })?;
    let shown = Shown::select(&dp, args)?;
    if args.follow {
        // The agent's state and the rule sets are read once per batch of new refusals.
        let explain = |denies: &mut [DenyView]| {
            if let Some(state) = read_state(&args.state_dir, &args.net.network) {
                let _ = report::explain(&dp, &state, denies);
            }
        };
        return follow(&dp, &|d| shown.concerns(d), &explain, args.json);
    }
    let report = Report::gather(&dp, args, shown)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        print!("{}", text::render(&report));
    }
    Ok(())
}

/// How often `--follow` reads the deny rings.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// `--follow`: every deny event `concerns` keeps, the ones in the rings now and then each
/// new one, in time order, until the process is interrupted.
fn follow(
    dp: &Datapath,
    concerns: &dyn Fn(&DenyView) -> bool,
    explain: &dyn Fn(&mut [DenyView]),
    json: bool,
) -> Result<()> {
    use std::io::Write as _;
    let mut seen: HashSet<(usize, u64, u64)> = HashSet::new();
    loop {
        let denies = dp.policy_denies()?;
        let mut out = std::io::stdout().lock();
        let now: HashSet<(usize, u64, u64)> =
            denies.iter().map(|d| (d.cpu, d.seq, d.time_ns)).collect();
        let mut new: Vec<DenyView> = denies
            .iter()
            .filter(|d| !seen.contains(&(d.cpu, d.seq, d.time_ns)) && concerns(d))
            .cloned()
            .collect();
        explain(&mut new);
        for d in &new {
            let line = if json {
                serde_json::to_string(d).unwrap_or_default()
            } else {
                d.to_string()
            };
            // A closed pipe (`| head`) ends the stream.
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
        seen = now;
        drop(out);
        std::thread::sleep(FOLLOW_EVERY);
    }
}
