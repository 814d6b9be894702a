//! The command line (when `CNI_COMMAND` is not set): `version`, `load`, `inspect`,
//! `metrics`, `install`, `uninstall` (in [`install`]).

pub mod install;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use serde_json::json;

use crate::{
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
    },
    /// Show a network's datapath: node config, endpoints with counters, host ports, NAT
    /// entries and per-reason counters.
    Inspect {
        #[command(flatten)]
        net: NetworkArgs,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Serve Prometheus metrics of the pinned datapath (`GET /metrics`, `GET /healthz`):
    /// per-endpoint and per-reason counters, map fill and memory, SNAT port use. Reads the
    /// pinned maps read-only on every scrape; keeps no state.
    Metrics {
        /// Address and port to listen on.
        #[arg(long, default_value = crate::metrics::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
        /// `bpffsRoot` of the networks.
        #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
        bpffs_root: PathBuf,
        /// A network to report (repeatable); default: every network found below
        /// `--bpffs-root` at each scrape.
        #[arg(long = "network")]
        networks: Vec<String>,
    },
    /// Install the plugin on this node (a DaemonSet's init container): copy this binary
    /// into the CNI binary directory and write the conflist, both atomically; idempotent.
    Install(install::InstallArgs),
    /// Remove the conflist and the binary; with --purge also the network's pins and IPAM
    /// store (only when no pods are left on it).
    Uninstall(install::UninstallArgs),
}

/// Runs the CLI.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::logging::init("warn", None);
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
                "MISSING (built without bpf-linker)"
            };
            println!("eBPF programs: {embedded}");
            Ok(())
        }
        Cmd::Load {
            net,
            uplink,
            ip_masq,
        } => load(&net, uplink, ip_masq),
        Cmd::Inspect { net, json } => inspect(&net, json),
        Cmd::Metrics {
            listen,
            bpffs_root,
            networks,
        } => crate::metrics::serve(listen, crate::metrics::Exporter::new(bpffs_root, networks)),
        Cmd::Install(args) => return install::run_install(&args),
        Cmd::Uninstall(args) => return install::run_uninstall(&args),
    };
    match out {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-ebpf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(net: &NetworkArgs, uplink: Option<String>, ip_masq: bool) -> Result<()> {
    let conf = json!({
        "cniVersion": crate::cni::version::LATEST,
        "name": net.network,
        "type": "cni-ebpf",
        "bpffsRoot": net.bpffs_root,
        "uplink": uplink,
        "ipMasq": ip_masq,
    });
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

fn inspect(net: &NetworkArgs, as_json: bool) -> Result<()> {
    let dir = net.bpffs_root.join(&net.network);
    let dp = Datapath::open_at(&dir)?.ok_or_else(|| {
        Error::datapath(
            "inspect",
            format!("nothing is pinned under {}", dir.display()),
        )
    })?;
    let node = dp.node_view()?;
    let endpoints = dp.endpoints()?;
    let ports = dp.port_mappings()?;
    let nat = dp.nat_entries()?;
    let reasons = dp.reason_counts()?;
    let flows = dp.flow_summary()?;
    let maps = dp.map_stats()?;
    if as_json {
        let doc = json!({ "node": node, "endpoints": endpoints, "portMappings": ports, "nat": nat, "flows": flows, "reasons": reasons, "maps": maps });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    }
    let addr = node
        .node_addr
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    println!(
        "node: address {addr}, uplink #{}, ipMasq {}, clusterCIDRs [{}], SNAT ports {}-{}",
        node.uplink_ifindex,
        node.ip_masq,
        node.cluster_cidrs.join(", "),
        node.snat_ports.0,
        node.snat_ports.1
    );
    println!("\nENDPOINTS ({})", endpoints.len());
    println!(
        "{:<16} {:<8} {:<18} {:<18} {:<28} {:>10} {:>12} {:>10} {:>12}  EGRESS RATE",
        "IP",
        "HOSTIF",
        "HOST MAC",
        "POD MAC",
        "OWNER",
        "TX PKTS",
        "TX BYTES",
        "RX PKTS",
        "RX BYTES"
    );
    for e in &endpoints {
        let owner = format!("{}/{}", short(&e.container_id), e.ifname);
        println!(
            "{:<16} {:<8} {:<18} {:<18} {:<28} {:>10} {:>12} {:>10} {:>12}  {}  {}",
            e.ip,
            e.host_ifindex,
            e.host_mac,
            e.pod_mac,
            owner,
            e.tx_packets,
            e.tx_bytes,
            e.rx_packets,
            e.rx_bytes,
            match (e.egress_rate_bits, e.egress_rate_mode) {
                (Some(r), Some(m)) => format!("{r} bit/s ({m})"),
                _ => "-".to_owned(),
            },
            match (e.nat_flows, e.nat_flows_cap) {
                (Some(n), Some(c)) => format!("nat {n}/{c}"),
                _ => String::new(),
            }
        );
    }
    println!("\nHOST PORTS ({})", ports.len());
    println!(
        "{:<16} {:<6} {:<5} {:<22} {:<28}",
        "HOST IP", "PORT", "PROTO", "POD", "OWNER"
    );
    for p in &ports {
        let hip = p.host_ip.map_or_else(|| "*".to_owned(), |a| a.to_string());
        let owner = format!("{}/{}", short(&p.container_id), p.ifname);
        println!(
            "{hip:<16} {:<6} {:<5} {:<22} {owner:<28}",
            p.host_port,
            p.protocol,
            format!("{}:{}", p.pod_ip, p.container_port)
        );
    }
    println!("\nNAT ({})", nat.len());
    println!(
        "{:<14} {:<15} {:<5} {:<22} {:<22} {:<22} {:<22} {:>8} {:<9} {:<7}",
        "KIND", "HOOK", "PROTO", "SRC", "DST", "NEW SRC", "NEW DST", "IDLE MS", "STATE", "DELIVER"
    );
    for n in &nat {
        println!(
            "{:<14} {:<15} {:<5} {:<22} {:<22} {:<22} {:<22} {:>8} {:<9} {:<7}",
            n.kind,
            n.hook,
            n.protocol,
            format!("{}:{}", n.src, n.sport),
            format!("{}:{}", n.dst, n.dport),
            format!("{}:{}", n.new_src, n.new_sport),
            format!("{}:{}", n.new_dst, n.new_dport),
            n.idle_ms,
            n.state,
            n.deliver
        );
    }
    println!(
        "\nFLOWS: {} fast-pathed (verified untranslated), {} on the kernel path (new or \
         translated by netfilter), {} opened from outside; {} pod sockets talking through \
         the stack, {} node sockets on host ports",
        flows.verified, flows.pending, flows.inbound, flows.stack_sockets, flows.host_port_sockets
    );
    println!("\nMAPS");
    println!(
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "NAME", "TYPE", "ENTRIES", "MAX", "MEMLOCK"
    );
    for m in &maps {
        let entries = m.entries.map_or_else(|| "-".to_owned(), |n| n.to_string());
        println!(
            "  {:<14} {:<16} {:>10} {:>10} {:>12}",
            m.name, m.map_type, entries, m.max_entries, m.memlock_bytes
        );
    }
    println!(
        "  {:<14} {:<16} {:>10} {:>10} {:>12}",
        "total",
        "",
        "",
        "",
        maps.iter().map(|m| m.memlock_bytes).sum::<u64>()
    );
    println!("\nREASONS");
    for r in reasons.iter().filter(|r| r.count > 0) {
        println!("  {:<28} {:>12}", r.reason, r.count);
    }
    Ok(())
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
