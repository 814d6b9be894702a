//! Builds the eBPF programs of `cni-ebpf-bpf` with aya-build and leaves the object at
//! `$OUT_DIR/cni-ebpf`, which `src/datapath/object.rs` embeds.
//!
//! When the eBPF toolchain is missing (no `bpf-linker`) or `AYA_BUILD_SKIP=1`, an empty
//! object is written instead so that `cargo check`, `clippy` and unit tests work anywhere;
//! the binary then refuses every datapath operation with a clear error.

#![expect(clippy::panic, reason = "a build script reports failure by panicking")]

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=PATH");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let object = out_dir.join("cni-ebpf");

    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let linker = which::which("bpf-linker");
    if skip || linker.is_err() {
        let why = if skip {
            "AYA_BUILD_SKIP is set"
        } else {
            "bpf-linker is not on PATH (run `cargo xtask setup`)"
        };
        println!("cargo:warning=building cni-ebpf WITHOUT eBPF programs: {why}");
        if let Err(e) = fs::write(&object, []) {
            panic!("cannot write eBPF stub {}: {e}", object.display());
        }
        println!("cargo:rustc-env=CNI_EBPF_OBJECT_HASH=none");
        return;
    }
    if let Ok(path) = linker {
        println!("cargo:rerun-if-changed={}", path.display());
    }

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
