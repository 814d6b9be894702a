//! Builds the eBPF programs of `cni-ebpf-bpf` with aya-build and leaves the object at
//! `$OUT_DIR/cni-ebpf`, which `src/datapath/object.rs` embeds.
//!
//! With the `ebpf` feature (the default) a missing toolchain (no `bpf-linker`) fails the
//! build, naming `cargo xtask setup`; `AYA_BUILD_SKIP=1` is the explicit opt-out, which
//! builds a binary without programs (it refuses every datapath operation, saying so).
//! Without the feature (the crates that use cni-ebpf as a library: the tests' helpers,
//! xtask, the fuzz targets) no object is built or wanted, and no toolchain is needed.

#![expect(clippy::panic, reason = "a build script reports failure by panicking")]

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=PATH");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let object = out_dir.join("cni-ebpf");

    let wanted = env::var_os("CARGO_FEATURE_EBPF").is_some();
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if !wanted || skip {
        if wanted {
            println!(
                "cargo:warning=building cni-ebpf WITHOUT eBPF programs: AYA_BUILD_SKIP is set"
            );
        }
        if let Err(e) = fs::write(&object, []) {
            panic!(
                "cannot write the empty eBPF object {}: {e}",
                object.display()
            );
        }
        println!("cargo:rustc-env=CNI_EBPF_OBJECT_HASH=none");
        return;
    }
    let linker = match which::which("bpf-linker") {
        Ok(path) => path,
        Err(_) => panic!(
            "cannot build the eBPF programs: bpf-linker is not on PATH. Run `cargo xtask \
             setup` (it installs LLVM and bpf-linker), or set AYA_BUILD_SKIP=1 to build a \
             cni-ebpf without its eBPF programs (it then refuses every datapath operation)"
        ),
    };
    println!("cargo:rerun-if-changed={}", linker.display());

    let metadata = match cargo_metadata::MetadataCommand::new().no_deps().exec() {
        Ok(m) => m,
        Err(e) => panic!("cargo metadata failed: {e}"),
    };
    let Some(package) = metadata
        .packages
        .into_iter()
        .find(|p| p.name == "cni-ebpf-bpf")
    else {
        panic!("package cni-ebpf-bpf not found in the workspace");
    };
    let root_dir = package
        .manifest_path
        .parent()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let package = aya_build::Package {
        name: "cni-ebpf-bpf",
        root_dir: &root_dir,
        ..Default::default()
    };
    if let Err(e) = aya_build::build_ebpf([package], aya_build::Toolchain::Nightly) {
        panic!("building the eBPF programs failed: {e:#}");
    }
    // The object's identity, computed once here rather than on every ADD: a node whose
    // pinned programs came from another object is carried over (datapath/upgrade.rs).
    let bytes = match fs::read(&object) {
        Ok(b) => b,
        Err(e) => panic!("reading the eBPF object {}: {e}", object.display()),
    };
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    println!("cargo:rustc-env=CNI_EBPF_OBJECT_HASH={hash:016x}");
}
