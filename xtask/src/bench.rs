//! `cargo xtask bench`: runs the bench crate (`bench/`) on this machine's kernel, or again
//! inside the second kernel's guest with `--second-kernel`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use cni_ebpf_bench::Args;

use crate::{image, sim, vm, workspace_root};

/// The binaries the bench measures, built as `cargo xtask test` builds them.
struct Xtask;

impl cni_ebpf_bench::Host for Xtask {
    fn build_plugin(&self) -> Result<PathBuf> {
        image::build_static()
    }

    fn build_libcni_client(&self) -> Result<PathBuf> {
        sim::build_libcni_client()
    }

    fn is_static(&self, bin: &Path) -> bool {
        image::check_static(bin).is_ok()
    }
}

/// `cargo xtask bench`.
pub fn run(args: &Args) -> Result<()> {
    if args.second_kernel {
        return run_in_second_kernel(args);
    }
    crate::ensure_bpffs()?;
    cni_ebpf_bench::run(args, &Xtask)
}

/// `--second-kernel`: builds what the bench runs here, then runs this same xtask with
/// the same flags in the guest, results into the shared work directory, copied to
/// `--out` (or `results/bench-<timestamp>-linux-<release>`) afterwards.
fn run_in_second_kernel(args: &Args) -> Result<()> {
    let kernel = vm::ensure_kernel()?;
    let (plugin, client) = cni_ebpf_bench::plugin_and_client(args, &Xtask)?;
    let out = args.out.clone().unwrap_or_else(|| {
        workspace_root().join("results").join(format!(
            "bench-{}-linux-{}",
            cni_ebpf_bench::timestamp(),
            kernel.release
        ))
    });
    let guest_out = vm::work_dir().join("bench");
    // The same flags, minus the ones this side resolved.
    let mut argv: Vec<String> = vec![std::env::current_exe()?.display().to_string()];
    let mut skip = false;
    for a in std::env::args().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--second-kernel" {
            continue;
        }
        if ["--out", "--plugin", "--libcni-client"].contains(&a.as_str()) {
            skip = true;
            continue;
        }
        if ["--out=", "--plugin=", "--libcni-client="]
            .iter()
            .any(|p| a.starts_with(p))
        {
            continue;
        }
        argv.push(a);
    }
    for (flag, v) in [
        ("--plugin", &plugin),
        ("--libcni-client", &client),
        ("--out", &guest_out),
    ] {
        argv.push(flag.to_owned());
        argv.push(v.display().to_string());
    }
    let env = [("CNI_EBPF_SKIP_SETUP", std::ffi::OsStr::new("1"))];
    let result = vm::run_command(&kernel, &argv, &env);
    if guest_out.exists() {
        std::fs::create_dir_all(&out)?;
        for e in std::fs::read_dir(&guest_out)? {
            let e = e?;
            std::fs::copy(e.path(), out.join(e.file_name()))?;
        }
        eprintln!("bench: results of the guest in {}", out.display());
    }
    result
}
