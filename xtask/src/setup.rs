//! `cargo xtask setup`: installs what is missing, says what it did, skips the rest.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Result};

use crate::run as run_cmd;

/// What a command needs set up: each includes the toolchain that builds the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The plugin's build (`build`).
    Build,
    /// The build and the namespaces of a simulated node (`load`, `demo`).
    Node,
    /// The build, the static builds for every architecture and buildah (`image`).
    Image,
    /// cargo-fuzz and the nightly toolchain (`fuzz`).
    Fuzz,
    /// Everything (`setup`, `test`, `bench`).
    All,
}

/// LLVM 22, which bpf-linker is built against.
const BUILD_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev", "libzstd-dev"];

/// A simulated node: namespaces, links and routes, and the demo's pings.
const NODE_PACKAGES: &[&str] = &["iproute2", "iputils-ping", "util-linux"];

/// The container image: buildah builds it, runc runs it (the image test). ring's C and
/// assembly (the TLS of the Kubernetes API client) are compiled by musl-gcc for the x86_64
/// static build and by clang for the aarch64 one (which links with rustc's own rust-lld,
/// and archives with LLVM 22's llvm-ar, there for bpf-linker); qemu-user runs the aarch64
/// binary and its tests here (called by name: nothing registers it with binfmt_misc, and
/// its recommended qemu-user-binfmt is left out).
const IMAGE_PACKAGES: &[&str] = &["buildah", "runc", "musl-tools", "clang-22", "qemu-user"];

/// What the tests and the benches use besides.
const TEST_PACKAGES: &[&str] = &[
    "golang-go",
    "golang-github-appc-cni-dev",
    "containernetworking-plugins",
    "iperf3",
    "sockperf",
    // The bench's count of system calls per verb.
    "strace",
    "bpftool",
    "iptables",
    "nftables",
    // kube-proxy's IPVS mode (testbed/tests/e2e/kubernetes.rs, under the second kernel).
    "ipvsadm",
    "ipset",
    "socat",
    // containerd's CRI path (testbed/tests/e2e/cri.rs): containerd 1.6 with the CRI plugin built
    // in, runc (above), the images' busybox, and protoc for the k8s-cri crate's bindings.
    // The tests run a containerd of their own; the package's service is never used (on a
    // machine whose systemd starts services, the install starts it; here nothing does).
    "containerd",
    "busybox-static",
    "protobuf-compiler",
    // The live map of `cni-ebpf observe --ui` in a real browser (testbed/src/browser.rs):
    // headless Chromium driven through ChromeDriver.
    "chromium",
    "chromium-driver",
    // The second kernel (xtask/src/vm.rs): Debian's 6.12 kernel, unpacked into the cache
    // (not installed), booted in qemu; depmod indexes its modules, xz unpacks the boot
    // ones.
    "qemu-system-x86",
    "kmod",
    "xz-utils",
];

/// The Debian packages `need` takes.
fn packages(need: Need) -> Vec<&'static str> {
    let groups: &[&[&str]] = match need {
        Need::Build | Need::Fuzz => &[BUILD_PACKAGES],
        Need::Node => &[BUILD_PACKAGES, NODE_PACKAGES],
        Need::Image => &[BUILD_PACKAGES, IMAGE_PACKAGES],
        Need::All => &[BUILD_PACKAGES, NODE_PACKAGES, IMAGE_PACKAGES, TEST_PACKAGES],
    };
    groups.concat()
}

/// Puts `~/.cargo/bin` on PATH for this process and its children (bpf-linker lives there).
pub fn ensure_path() {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    let cargo_bin = home.join(".cargo/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut parts: Vec<PathBuf> = std::env::split_paths(&path).collect();
    if !parts.contains(&cargo_bin) {
        parts.insert(0, cargo_bin);
        if let Ok(joined) = std::env::join_paths(parts) {
            // SAFETY: single-threaded at this point (called first thing in main).
            unsafe { std::env::set_var("PATH", joined) };
        }
    }
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn has_rust_src() -> bool {
    Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("rust-src"))
        .unwrap_or(false)
}

fn has_target(target: &str) -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.trim() == target)
        })
        .unwrap_or(false)
}

fn has_bpf_linker() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn has_kustomize() -> bool {
    Command::new("kubectl")
        .args(["kustomize", "--help"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn has_cargo_fuzz() -> bool {
    Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Installs what `need` takes and is missing. With `verbose`, also reports what was
/// already there.
pub fn run(need: Need, verbose: bool) -> Result<()> {
    // Inside the second kernel's guest (vm.rs), whose machine is this one, read-only and
    // offline: what setup would install is there already.
    if std::env::var("CNI_EBPF_SKIP_SETUP").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let wanted = packages(need);
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        if verbose {
            eprintln!("setup: Debian packages present ({})", wanted.join(", "));
        }
    } else {
        eprintln!("setup: installing Debian packages: {}", missing.join(" "));
        apt_install(&missing)?;
    }

    if need == Need::All {
        ensure_kustomize(verbose)?;
    }

    if has_rust_src() {
        if verbose {
            eprintln!("setup: nightly toolchain with rust-src present");
        }
    } else {
        let has_nightly = Command::new("rustup")
            .args(["toolchain", "list"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.starts_with("nightly"))
            })
            .unwrap_or(false);
        if has_nightly {
            // Only the component: reinstalling the toolchain could fetch a newer nightly
            // whose LLVM no longer matches bpf-linker's.
            eprintln!("setup: adding rust-src to the nightly toolchain");
            run_cmd(Command::new("rustup").args([
                "component",
                "add",
                "rust-src",
                "--toolchain",
                "nightly",
            ]))?;
        } else {
            eprintln!("setup: installing the nightly toolchain with rust-src");
            run_cmd(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
                "--component",
                "rust-src",
            ]))?;
        }
    }

    if matches!(need, Need::Image | Need::All) {
        for arch in crate::image::ARCHES {
            ensure_target(verbose, arch.target)?;
        }
    }

    if has_bpf_linker() {
        if verbose {
            eprintln!("setup: bpf-linker present");
        }
    } else {
        eprintln!("setup: building bpf-linker against LLVM 22 (takes about 5 minutes)");
        run_cmd(
            Command::new("cargo")
                .args([
                    "install",
                    "bpf-linker",
                    "--version",
                    "^0.13",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )?;
        if !has_bpf_linker() {
            bail!("bpf-linker was installed but is not runnable from PATH");
        }
    }

    if matches!(need, Need::Fuzz | Need::All) {
        ensure_cargo_fuzz(verbose)?;
    }
    Ok(())
}

fn ensure_kustomize(verbose: bool) -> Result<()> {
    // `kubectl kustomize` renders deploy/ in the manifest tests (cni-ebpf/tests/deploy.rs).
    // Any kubectl with kustomize will do; Debian's comes with kubernetes-client.
    if present(verbose, "kubectl with kustomize", has_kustomize()) {
        return Ok(());
    }
    eprintln!("setup: installing Debian package kubernetes-client (kubectl kustomize)");
    apt_install(&["kubernetes-client"])
}

fn ensure_target(verbose: bool, target: &str) -> Result<()> {
    // The container image's binaries are static: built for the musl targets, whose
    // standard library, start files and libc rustup ships (self-contained); only ring's C
    // needs a C compiler for the target (IMAGE_PACKAGES).
    if present(
        verbose,
        &format!("Rust target {target}"),
        has_target(target),
    ) {
        return Ok(());
    }
    eprintln!("setup: adding the Rust target {target}");
    run_cmd(Command::new("rustup").args(["target", "add", target]))
}

fn ensure_cargo_fuzz(verbose: bool) -> Result<()> {
    // cargo-fuzz drives the fuzz targets of `fuzz/` (`cargo xtask fuzz`, and a short slice
    // in `cargo xtask test`). Like bpf-linker it lands in ~/.cargo/bin, which survives
    // between runs on one machine, so it is built once (about 2 minutes).
    if present(verbose, "cargo-fuzz", has_cargo_fuzz()) {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz (takes about 2 minutes)");
    run_cmd(Command::new("cargo").args([
        "install",
        "cargo-fuzz",
        "--version",
        "^0.13",
        "--locked",
    ]))?;
    if !has_cargo_fuzz() {
        bail!("cargo-fuzz was installed but `cargo +nightly fuzz` does not run");
    }
    Ok(())
}

/// Whether `what` is there already (said so when `verbose`).
fn present(verbose: bool, what: &str, there: bool) -> bool {
    if there && verbose {
        eprintln!("setup: {what} present");
    }
    there
}

/// `apt-get install`s `packages` after an `apt-get update`. No package may start its
/// service while installing (containerd's would run in the machine's own namespaces): a
/// policy-rc.d that refuses every start, removed again afterwards, unless the machine
/// already has one.
fn apt_install(packages: &[&str]) -> Result<()> {
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    let policy = std::path::Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists()
        && std::fs::write(
            policy,
            "#!/bin/sh\n# cargo xtask setup: no service starts\nexit 101\n",
        )
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755))
        })
        .is_ok();
    let installed = run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    installed
}
