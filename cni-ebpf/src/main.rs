//! The `cni-ebpf` binary: a CNI plugin when `CNI_COMMAND` is set, a CLI otherwise.

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        cni_ebpf::cmd::main()
    } else {
        cni_ebpf::cli::main()
    }
}
