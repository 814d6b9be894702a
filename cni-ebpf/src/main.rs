//! The `cni-ebpf` binary: a CNI plugin when `CNI_COMMAND` is set, a CLI otherwise.

use std::process::ExitCode;

/// dlmalloc rather than the C library's allocator: the static (musl) binary the image
/// ships would otherwise map and unmap memory for many of a verb's allocations (every
/// netlink receive buffer is 64 KiB), about a tenth of an ADD's CPU time. dlmalloc grows
/// its heap in 64 KiB steps and keeps what is freed for reuse; a verb's process exits
/// long before any of it would be worth giving back, and the agent's heap stays at its
/// working size (it trims only beyond 2 MiB of free space at the top).
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        cni_ebpf::verbs::main()
    } else {
        cni_ebpf::cli::main()
    }
}
