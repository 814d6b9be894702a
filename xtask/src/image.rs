//! `cargo xtask image`: the container image of `deploy/Containerfile`, built offline.
//!
//! The image is `FROM scratch` with nothing but the binary, so the binary must be static:
//! the musl target links it so (a plain static executable, no interpreter), and [`check_static`] makes
//! sure before anything is built. The build context is a fresh directory holding only the
//! binary and LICENSE, never the workspace (whose `target/` is gigabytes).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{run, workspace_root};

/// The target the image's binary is built for.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// `cargo xtask image` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image name and tag.
    #[arg(long, default_value = concat!("localhost/cni-ebpf:", env!("CARGO_PKG_VERSION")))]
    pub tag: String,
    /// Also write the image as an OCI archive to this path (for `ctr images import` or
    /// `podman load` on a node).
    #[arg(long)]
    pub oci_archive: Option<PathBuf>,
}

/// Builds the static release binary (eBPF object embedded) and returns its path.
pub fn build_static() -> Result<PathBuf> {
    eprintln!("xtask: building the static ({STATIC_TARGET}) binary for the container image");
    let target_dir = crate::cache_dir("static-nopie");
    run(Command::new("cargo")
        .args([
            "build",
            "--release",
            "-p",
            "cni-ebpf",
            "--target",
            STATIC_TARGET,
            // A plain static executable, not static-pie: a static-pie binary relocates
            // itself at every start (22 689 relocations here, 110 more page faults), which
            // cost 1.2-1.6 ms of each 5.5 ms ADD (`perf stat`, 30 ADDs each way). The
            // plugin runs once per verb, so its start is on every runtime's critical path.
            // The stack, heap and mappings stay randomised; only the binary's own image
            // is at a fixed address, as in the reference plugins' release builds.
            "--config",
            r#"target.x86_64-unknown-linux-musl.rustflags=["-C","relocation-model=static","-C","target-feature=+crt-static"]"#,
            "--target-dir",
        ])
        .arg(&target_dir)
        // ring (rustls' crypto) compiles C for the target; cc looks for
        // x86_64-linux-musl-gcc, Debian's musl-tools calls it musl-gcc.
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc"))?;
    let bin = target_dir.join(STATIC_TARGET).join("release/cni-ebpf");
    crate::check_embedded(&bin)?;
    check_static(&bin)?;
    Ok(bin)
}

/// Fails unless `bin` is an x86-64 ELF executable without a program interpreter (a binary
/// that needs no dynamic loader or shared library, as a `FROM scratch` image requires).
pub fn check_static(bin: &Path) -> Result<()> {
    let bytes = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    match has_interpreter(&bytes) {
        Some(false) => Ok(()),
        Some(true) => bail!(
            "{} is dynamically linked (it has a PT_INTERP program header); the image needs \
             a static binary",
            bin.display()
        ),
        None => bail!("{} is not a 64-bit little-endian ELF file", bin.display()),
    }
}

/// Whether a 64-bit little-endian ELF file has a `PT_INTERP` program header; `None` when
/// the bytes are not such a file.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let phoff = usize::try_from(u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let entsize = usize::from(u16_at(0x36)?);
    let count = usize::from(u16_at(0x38)?);
    for i in 0..count {
        if u32_at(phoff.checked_add(i.checked_mul(entsize)?)?)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// Writes the build context for `deploy/Containerfile` into `dir`: the binary as
/// `cni-ebpf` and LICENSE.
pub fn stage_context(bin: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::copy(bin, dir.join("cni-ebpf")).context("staging the binary")?;
    std::fs::copy(workspace_root().join("LICENSE"), dir.join("LICENSE"))
        .context("staging LICENSE")?;
    Ok(())
}

/// `cargo xtask image`.
pub fn run_image(args: &Args) -> Result<()> {
    if Command::new("buildah").arg("--version").output().is_err() {
        bail!("buildah is not installed (`cargo xtask setup` installs it)");
    }
    let bin = build_static()?;
    let ctx = workspace_root().join("target/image-context");
    let _ = std::fs::remove_dir_all(&ctx);
    stage_context(&bin, &ctx)?;
    let containerfile = workspace_root().join("deploy/Containerfile");
    eprintln!("xtask: building {} with buildah", args.tag);
    run(Command::new("buildah")
        .arg("bud")
        .arg("--build-arg")
        .arg(format!("VERSION={}", env!("CARGO_PKG_VERSION")))
        .arg("-f")
        .arg(&containerfile)
        .arg("-t")
        .arg(&args.tag)
        .arg(&ctx))?;
    if let Some(path) = &args.oci_archive {
        let _ = std::fs::remove_file(path);
        run(Command::new("buildah")
            .arg("push")
            .arg(&args.tag)
            .arg(format!("oci-archive:{}:{}", path.display(), args.tag)))?;
        eprintln!("xtask: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::has_interpreter;

    #[test]
    fn elf_interpreter_is_found() {
        // A minimal ELF64 header with one program header of type PT_INTERP at 0x40.
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(has_interpreter(&elf), Some(true));
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(has_interpreter(&elf), Some(false));
        assert_eq!(has_interpreter(b"#!/bin/sh"), None);
    }
}
