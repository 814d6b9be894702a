//! The command line (when `CNI_COMMAND` is not set).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// cni-ebpf: an eBPF-accelerated CNI plugin. Run by a container runtime with `CNI_COMMAND`
/// set, it is a CNI plugin; run by hand, it is this tool.
#[derive(Debug, Parser)]
#[command(name = "cni-ebpf", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print the plugin version and the CNI spec versions it supports.
    Version,
}

/// Size of the embedded eBPF object (0 when built without the eBPF toolchain).
const EBPF_OBJECT_LEN: usize = include_bytes!(concat!(env!("OUT_DIR"), "/cni-ebpf")).len();

/// Runs the CLI.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Version => {
            println!("cni-ebpf {}", env!("CARGO_PKG_VERSION"));
            println!(
                "CNI spec versions: {}",
                crate::cni::version::SUPPORTED.join(", ")
            );
            let embedded = if EBPF_OBJECT_LEN > 0 {
                "embedded"
            } else {
                "MISSING (built without bpf-linker)"
            };
            println!("eBPF programs: {embedded}");
            ExitCode::SUCCESS
        }
    }
}
