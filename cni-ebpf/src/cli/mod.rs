//! The command line (when `CNI_COMMAND` is not set): it parses and dispatches —
//! `version`, `load`, `inspect` ([`inspect`]), `agent` ([`crate::agent`]), `install` and
//! `uninstall` ([`install`]), and DEL's finishing process.

pub mod inspect;
pub mod install;
pub mod observe;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use serde_json::json;

use crate::{
    agent::AgentArgs,
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
    /// server's Namespaces, Pods and NetworkPolicies (watched); the tunnel entries and the
    /// opt-in host-gw routes from the Nodes; the opt-in Service translation in place of
    /// kube-proxy (ClusterIPs at the socket, health-check node ports) from Services and
    /// EndpointSlices; Prometheus metrics (`GET /metrics`) and the probes (`GET /healthz`,
    /// `GET /ready`).
    Agent(Box<AgentArgs>),
    /// Install the plugin on this node (a DaemonSet's init container): copy this binary
    /// into the CNI binary directory and write the conflist, both atomically; idempotent.
    Install(Box<install::InstallArgs>),
    /// Remove the conflist and the binary; with --purge also the network's pins and IPAM
    /// store (only when no pods are left on it).
    Uninstall(install::UninstallArgs),
    /// The flows the agents saw: one node's, several, or every node's (`--all-nodes`),
    /// merged in time order; `--follow` streams them; `--ui` serves the live map of who
    /// talks to whom.
    Observe(Box<observe::ObserveArgs>),
    /// The node's WireGuard key (`encryption: wireguard`).
    #[command(subcommand)]
    Wireguard(WireguardCmd),
    /// The rest of a DEL, in a process of its own that DEL starts and does not wait for:
    /// purging the flows of the pod's addresses and deleting its retired veth pair.
    #[command(hide = true)]
    FinishDel {
        /// What is left, as DEL wrote it.
        job: String,
    },
}

#[derive(Debug, Subcommand)]
enum WireguardCmd {
    /// Make a new key pair for this node: a new private key in the agent's key file. The
    /// node's agent puts it in force and publishes the public key within a second; each
    /// other node follows from its Node watch.
    RotateKey {
        #[command(flatten)]
        key: crate::agent::wireguard::WireguardArgs,
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
        Cmd::Observe(args) => observe::run(&args),
        Cmd::Agent(args) => crate::agent::run(&args),
        Cmd::Install(args) => return install::run_install(&args),
        Cmd::Uninstall(args) => return install::run_uninstall(&args),
        Cmd::Wireguard(WireguardCmd::RotateKey { key }) => {
            crate::agent::wireguard::rotate(&key.key).map(|public| {
                println!(
                    "new key pair in {}: public key {}",
                    key.key.display(),
                    crate::agent::wireguard::encode(&public)
                );
            })
        }
        Cmd::FinishDel { job } => crate::verbs::del::FinishJob::run(&job),
    };
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-ebpf: {e}");
            ExitCode::FAILURE
        }
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use clap::{CommandFactory as _, Parser as _};

    use super::{Cli, Cmd};

    /// The command line is well formed (every argument's id unique across the flattened
    /// settings), and the agent starts from its defaults alone.
    #[test]
    fn the_command_line_is_consistent_and_the_agent_needs_no_argument() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["cni-ebpf", "agent"]).unwrap();
        let Cmd::Agent(args) = cli.command else {
            unreachable!("parsed as agent");
        };
        assert!(args.flows.enabled);
        let off = Cli::try_parse_from(["cni-ebpf", "agent", "--flows=false", "--host-gw"]).unwrap();
        let Cmd::Agent(args) = off.command else {
            unreachable!("parsed as agent");
        };
        assert!(!args.flows.enabled);
    }
}
