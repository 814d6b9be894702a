//! `cargo xtask image`: the container image of `deploy/Containerfile` for x86_64 and
//! aarch64, built offline as one OCI image index.
//!
//! The image is `FROM scratch` with nothing but the binary, so the binary must be static:
//! the musl targets link it so (a plain static executable, no interpreter), and
//! [`check_static_for`] makes sure, for the right machine, before anything is built. Each
//! architecture's image is built from a build context of its own, a fresh directory holding
//! only that binary and LICENSE, never the workspace (whose `target/` is gigabytes); the
//! Containerfile has no `RUN`, so building the foreign architecture's image needs no
//! emulation.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::{run, workspace_root};

/// An architecture the static binary and the image are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Rust's name of the architecture (`std::env::consts::ARCH`).
    pub name: &'static str,
    /// The musl target the static binary is built for.
    pub target: &'static str,
    /// The architecture in the OCI image's platform (`GOARCH`).
    pub oci: &'static str,
    /// `e_machine` of the ELF header.
    pub elf_machine: u16,
    /// The build cache under `~/.cache/cni-ebpf` (kept across runs and clones).
    cache: &'static str,
    /// The environment of the build: the C compiler and archiver of ring's C and
    /// assembly (the TLS of the Kubernetes API client), as cc looks them up.
    cc_env: &'static [(&'static str, &'static str)],
    /// The linker, when not the host's `cc`.
    linker: Option<&'static str>,
    /// The qemu-user emulator that runs its binaries on a machine of another architecture.
    emulator: &'static str,
}

/// x86_64. ring's C is compiled by `musl-gcc` (Debian's musl-tools; cc looks for
/// `x86_64-linux-musl-gcc`); the host's `cc` links.
pub const X86_64: Arch = Arch {
    name: "x86_64",
    target: "x86_64-unknown-linux-musl",
    oci: "amd64",
    elf_machine: 62,
    cache: "static-nopie",
    cc_env: &[("CC_x86_64_unknown_linux_musl", "musl-gcc")],
    linker: None,
    emulator: "qemu-x86_64",
};

/// aarch64. ring's C is compiled by clang (`clang-22`, the LLVM that bpf-linker is built
/// against; cc passes it `--target`, and ring's C needs only the compiler's own headers),
/// archived by `llvm-ar-22`, and rustc links with the `rust-lld` of its toolchain, which
/// takes musl's start files and libc from the Rust target (self-contained): no aarch64
/// cross toolchain is needed.
pub const AARCH64: Arch = Arch {
    name: "aarch64",
    target: "aarch64-unknown-linux-musl",
    oci: "arm64",
    elf_machine: 183,
    cache: "static-aarch64",
    cc_env: &[
        ("CC_aarch64_unknown_linux_musl", "clang-22"),
        ("AR_aarch64_unknown_linux_musl", "llvm-ar-22"),
    ],
    linker: Some("rust-lld"),
    emulator: "qemu-aarch64",
};

/// Every architecture the image is built for, in the order of its index.
pub const ARCHES: [Arch; 2] = [X86_64, AARCH64];

/// The architectures whose binaries run here only under emulation.
pub fn foreign_arches() -> impl Iterator<Item = Arch> {
    ARCHES.into_iter().filter(|a| a.runner().is_some())
}

impl Arch {
    /// This machine's architecture.
    pub fn host() -> Result<Self> {
        Self::named(std::env::consts::ARCH).with_context(|| {
            format!(
                "no static build for this machine's architecture ({})",
                std::env::consts::ARCH
            )
        })
    }

    /// The architecture called `name` (Rust's name, or the OCI one).
    pub fn named(name: &str) -> Option<Self> {
        ARCHES.into_iter().find(|a| a.name == name || a.oci == name)
    }

    /// The program that runs this architecture's binaries here: none on a machine of this
    /// architecture, its qemu-user emulator elsewhere.
    pub fn runner(self) -> Option<&'static str> {
        (self.name != std::env::consts::ARCH).then_some(self.emulator)
    }

    /// The target directory of this architecture's static build.
    pub fn target_dir(self) -> PathBuf {
        crate::cache_dir(self.cache)
    }

    /// `cargo <args>` for this architecture's static build: the target, the flags of a plain
    /// static executable, the C compiler and linker, the cached target directory, and the
    /// emulator as cargo's runner where one is needed (for `cargo test`).
    pub fn cargo(self, args: &[&str]) -> Command {
        let mut cmd = Command::new("cargo");
        let target = self.target;
        cmd.args(args)
            .args(["--target", target, "--config"])
            // A plain static executable, not static-pie: a static-pie binary relocates
            // itself at every start (22 689 relocations here, 110 more page faults), which
            // cost 1.2-1.6 ms of each 5.5 ms ADD (`perf stat`, 30 ADDs each way). The
            // plugin runs once per verb, so its start is on every runtime's critical path.
            // The stack, heap and mappings stay randomised; only the binary's own image
            // is at a fixed address, as in the reference plugins' release builds.
            .arg(format!(
                r#"target.{target}.rustflags=["-C","relocation-model=static","-C","target-feature=+crt-static"]"#
            ));
        if let Some(linker) = self.linker {
            cmd.arg("--config")
                .arg(format!(r#"target.{target}.linker="{linker}""#));
        }
        if let Some(runner) = self.runner() {
            cmd.arg("--config")
                .arg(format!(r#"target.{target}.runner="{runner}""#));
        }
        cmd.arg("--target-dir")
            .arg(self.target_dir())
            .envs(self.cc_env.iter().copied());
        cmd
    }
}

/// `cargo xtask image` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image name and tag (of the image index).
    #[arg(long, default_value = concat!("localhost/cni-ebpf:", env!("CARGO_PKG_VERSION")))]
    pub tag: String,
    /// Also write the image index with its images as an OCI archive to this path (for
    /// `ctr images import` or `podman load` on a node).
    #[arg(long)]
    pub oci_archive: Option<PathBuf>,
    /// Build only for this architecture (`x86_64` or `aarch64`; repeatable). Default: both.
    #[arg(long = "arch", value_parser = parse_arch)]
    pub arches: Vec<Arch>,
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::named(name).ok_or_else(|| {
        let known: Vec<&str> = ARCHES.iter().map(|a| a.name).collect();
        format!("unknown architecture {name:?}, expected one of {known:?}")
    })
}

/// Builds the static release binary (eBPF object embedded) for this machine's
/// architecture and returns its path.
pub fn build_static() -> Result<PathBuf> {
    build_static_for(Arch::host()?)
}

/// Builds the static release binary (eBPF object embedded) for `arch` and returns its
/// path; checks that it is a static executable for `arch` that carries its eBPF programs
/// (running it under qemu-user on another architecture).
pub fn build_static_for(arch: Arch) -> Result<PathBuf> {
    eprintln!(
        "xtask: building the static ({}) binary for the container image",
        arch.target
    );
    run(&mut arch.cargo(&["build", "--release", "-p", "cni-ebpf"]))?;
    let bin = arch.target_dir().join(arch.target).join("release/cni-ebpf");
    check_static_for(&bin, arch)?;
    crate::check_embedded_via(&bin, arch.runner())?;
    Ok(bin)
}

/// Fails unless `bin` is an ELF executable for this machine's architecture without a
/// program interpreter.
pub fn check_static(bin: &Path) -> Result<()> {
    check_static_for(bin, Arch::host()?)
}

/// Fails unless `bin` is an ELF executable for `arch` without a program interpreter (a
/// binary that needs no dynamic loader or shared library, as a `FROM scratch` image
/// requires).
pub fn check_static_for(bin: &Path, arch: Arch) -> Result<()> {
    let bytes = std::fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    let Some(elf) = Elf::parse(&bytes) else {
        bail!("{} is not a 64-bit little-endian ELF file", bin.display());
    };
    if elf.machine != arch.elf_machine {
        bail!(
            "{} is built for ELF machine {}, not {} ({})",
            bin.display(),
            elf.machine,
            arch.name,
            arch.elf_machine
        );
    }
    if elf.interpreter {
        bail!(
            "{} is dynamically linked (it has a PT_INTERP program header); the image needs \
             a static binary",
            bin.display()
        );
    }
    Ok(())
}

/// What [`check_static_for`] reads of an ELF file.
#[derive(Debug, PartialEq, Eq)]
struct Elf {
    /// `e_machine`.
    machine: u16,
    /// Whether it has a `PT_INTERP` program header.
    interpreter: bool,
}

impl Elf {
    /// Reads a 64-bit little-endian ELF file's header and program headers; `None` when the
    /// bytes are not such a file.
    fn parse(elf: &[u8]) -> Option<Self> {
        const PT_INTERP: u32 = 3;
        if elf.get(..4)? != b"\x7fELF" || *elf.get(4)? != 2 || *elf.get(5)? != 1 {
            return None;
        }
        let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |o: usize| {
            elf.get(o..o + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let machine = u16_at(0x12)?;
        let phoff =
            usize::try_from(u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?)).ok()?;
        let entsize = usize::from(u16_at(0x36)?);
        let count = usize::from(u16_at(0x38)?);
        let mut interpreter = false;
        for i in 0..count {
            interpreter |= u32_at(phoff.checked_add(i.checked_mul(entsize)?)?)? == PT_INTERP;
        }
        Some(Self {
            machine,
            interpreter,
        })
    }
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

/// buildah, with the machine's container storage or with storage of its own.
struct Buildah {
    /// `--root` and `--runroot` under this directory (vfs: plain directories, no overlay
    /// mount to leave behind), or the machine's storage when `None`.
    storage: Option<PathBuf>,
}

impl Buildah {
    fn cmd(&self) -> Command {
        let mut c = Command::new("buildah");
        if let Some(dir) = &self.storage {
            c.arg("--root")
                .arg(dir.join("storage"))
                .arg("--runroot")
                .arg(dir.join("run"))
                .args(["--storage-driver", "vfs"]);
        }
        c
    }
}

/// Builds the image of each `(arch, static binary)` and the OCI image index `tag` that
/// lists them (replacing an image or index of that name), and writes the index with its
/// images to `archive` when given.
fn build_index(
    buildah: &Buildah,
    images: &[(Arch, PathBuf)],
    tag: &str,
    archive: Option<&Path>,
) -> Result<()> {
    let containerfile = workspace_root().join("deploy/Containerfile");
    let contexts = workspace_root().join("target/image-context");
    let _ = std::fs::remove_dir_all(&contexts);
    // A list or an image left by an earlier build under this name: `manifest create`
    // refuses a taken name. Neither being there is the usual case, not an error.
    for rm in [&["manifest", "rm"][..], &["rmi", "--force"][..]] {
        let _ = buildah
            .cmd()
            .args(rm)
            .arg(tag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    run(buildah.cmd().args(["manifest", "create", tag]))?;
    for (arch, bin) in images {
        let ctx = contexts.join(arch.name);
        stage_context(bin, &ctx)?;
        eprintln!("xtask: building the linux/{} image of {tag}", arch.oci);
        run(buildah
            .cmd()
            .arg("bud")
            .arg("--platform")
            .arg(format!("linux/{}", arch.oci))
            .arg("--build-arg")
            .arg(format!("VERSION={}", env!("CARGO_PKG_VERSION")))
            .arg("-f")
            .arg(&containerfile)
            .args(["--manifest", tag])
            .arg(&ctx))?;
    }
    if let Some(path) = archive {
        let _ = std::fs::remove_file(path);
        run(buildah
            .cmd()
            .args(["manifest", "push", "--all", "--format", "oci", tag])
            .arg(format!("oci-archive:{}:{tag}", path.display())))?;
        eprintln!("xtask: wrote {}", path.display());
    }
    Ok(())
}

/// `cargo xtask image`.
pub fn run_image(args: &Args) -> Result<()> {
    if Command::new("buildah").arg("--version").output().is_err() {
        bail!("buildah is not installed (`cargo xtask setup` installs it)");
    }
    let arches = if args.arches.is_empty() {
        ARCHES.to_vec()
    } else {
        ARCHES
            .into_iter()
            .filter(|a| args.arches.contains(a))
            .collect()
    };
    let images = arches
        .into_iter()
        .map(|a| Ok((a, build_static_for(a)?)))
        .collect::<Result<Vec<_>>>()?;
    eprintln!("xtask: building {} with buildah", args.tag);
    build_index(
        &Buildah { storage: None },
        &images,
        &args.tag,
        args.oci_archive.as_deref(),
    )
}

/// The image index of `images` as `cargo xtask image --oci-archive` writes it, built in
/// buildah storage of its own (removed afterwards, with root's blob-info cache in
/// `/var/lib/containers` when this created it), for `testbed/tests/e2e/image.rs` to take apart.
/// Returns the archive's path.
pub fn test_archive(images: &[(Arch, PathBuf)]) -> Result<PathBuf> {
    const SYSTEM_CACHE: &str = "/var/lib/containers";
    let dir = workspace_root().join("target/image-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let archive = dir.join("cni-ebpf.oci.tar");
    let buildah = Buildah {
        storage: Some(dir.join("buildah")),
    };
    let made_system_cache = !Path::new(SYSTEM_CACHE).exists();
    eprintln!("xtask: building the image index for the image test");
    let built = build_index(
        &buildah,
        images,
        &format!("localhost/cni-ebpf-test:{}", std::process::id()),
        Some(&archive),
    );
    let _ = buildah
        .cmd()
        .args(["rmi", "--all", "--force"])
        .stdout(Stdio::null())
        .status();
    if let Some(storage) = &buildah.storage {
        let _ = std::fs::remove_dir_all(storage);
    }
    if made_system_cache {
        let _ = std::fs::remove_dir_all(SYSTEM_CACHE);
    }
    built?;
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::{Elf, AARCH64, ARCHES, X86_64};

    /// A minimal ELF64 header for `machine` with one program header of type `p_type` at
    /// 0x40.
    fn elf(machine: u16, p_type: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&p_type.to_le_bytes());
        elf
    }

    #[test]
    fn elf_machine_and_interpreter_are_read() {
        assert_eq!(
            Elf::parse(&elf(62, 3)),
            Some(Elf {
                machine: 62,
                interpreter: true
            })
        );
        assert_eq!(
            Elf::parse(&elf(183, 1)),
            Some(Elf {
                machine: 183,
                interpreter: false
            })
        );
        assert_eq!(Elf::parse(b"#!/bin/sh"), None);
        assert_eq!(Elf::parse(&elf(62, 3)[..0x30]), None, "truncated");
    }

    #[test]
    fn the_static_check_refuses_another_machine() {
        let dir = std::env::temp_dir().join(format!("xtask-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let bin = dir.join("bin");
        for arch in ARCHES {
            std::fs::write(&bin, elf(arch.elf_machine, 1)).unwrap_or_else(|e| panic!("{e}"));
            assert!(super::check_static_for(&bin, arch).is_ok(), "{arch:?}");
            let other = if arch == X86_64 { AARCH64 } else { X86_64 };
            let err = super::check_static_for(&bin, other)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(&format!("not {}", other.name)), "{err}");
            std::fs::write(&bin, elf(arch.elf_machine, 3)).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                super::check_static_for(&bin, arch).is_err(),
                "dynamic {arch:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
