//! The unit and protocol tests of the static build's other architectures (aarch64 on an
//! x86_64 machine), run under qemu-user.
//!
//! They are built in the cache of that architecture's static build, with its flags
//! ([`Arch::cargo`]): static test executables, which qemu-user runs without a sysroot. The
//! protocol tests run the image's binary (`CNI_EBPF_BIN`), and the tests themselves are
//! built in the dev profile without the `ebpf` feature: a release test build would compile
//! every dependency a second time (with unwinding, where the binary aborts) and the plugin
//! crate three more times at full optimisation, about five minutes of CPU for each change
//! on two cores, against seconds for an incremental dev build; and no unit test needs the
//! eBPF object, which would otherwise be built once more for that profile.
//!
//! cargo runs the test executables through the emulator (its target runner); the protocol
//! tests run the plugin through it too (`CNI_EBPF_RUNNER`), as nothing here registers a
//! binfmt handler. qemu-user cannot load eBPF programs or create namespaces, and the tests
//! that need them are ignored in these targets, so these are the tests that need no root
//! (tier 1).

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{image::Arch, run};

/// The test targets run under emulation: the unit tests of the plugin and of the types it
/// shares with the kernel, and the protocol tests of the binary.
const TESTS: &[&str] = &[
    "-p",
    "cni-ebpf",
    "-p",
    "cni-ebpf-common",
    "--lib",
    "--test",
    "protocol",
];

/// Builds and runs [`TESTS`] under its emulator for every foreign architecture among
/// `statics` (each with its static binary), with `args` for the test executables (a
/// filter); fails naming the architectures that failed.
pub fn run_tests(statics: &[(Arch, PathBuf)], args: &[String]) -> Result<()> {
    let mut failed = Vec::new();
    for (arch, bin) in statics {
        let Some(runner) = arch.runner() else {
            continue;
        };
        eprintln!(
            "xtask: running the {} unit and protocol tests under {runner}",
            arch.name
        );
        let mut args_before = vec!["test", "--no-fail-fast", "--no-default-features"];
        args_before.extend_from_slice(TESTS);
        let result = run(arch
            .cargo(&args_before)
            .arg("--")
            .args(args)
            .env("CNI_EBPF_BIN", bin)
            .env("CNI_EBPF_RUNNER", runner)
            .env("RUST_BACKTRACE", "1"));
        if let Err(e) = result {
            eprintln!("xtask: {e:#}");
            failed.push(arch.name);
        }
    }
    if !failed.is_empty() {
        bail!("the tests under emulation failed for {failed:?}");
    }
    Ok(())
}
