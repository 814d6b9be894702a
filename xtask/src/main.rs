//! `cargo xtask`: the developer workflow of cni-ebpf.
//!
//! Every command first runs `setup`, which installs what the eBPF build and the tests need
//! when it is missing, so a fresh machine needs nothing else.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Instant,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod checkout;
mod demo;
mod emulated;
mod fuzz;
mod image;
mod setup;
mod sim;
mod vm;

use setup::Need;

#[derive(Parser)]
#[command(about = "cni-ebpf developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per run; the bench's flags are the large variant"
)]
enum Cmd {
    /// Install the eBPF toolchain and test dependencies that are missing.
    Setup,
    /// Build the release binary (with the eBPF programs embedded).
    Build,
    /// Load, verify and pin the programs into a throwaway simulated node; print what was
    /// pinned; clean up.
    Load,
    /// Run every test: unit tests, eBPF packet tests and privileged end-to-end tests.
    Test {
        /// Extra arguments for the test binaries (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Fuzz the plugin's input parsers (cargo-fuzz targets in `fuzz/`) for a bounded time
    /// each, then report; fails when a target finds a crash.
    Fuzz(fuzz::Args),
    /// Demo: a simulated node with two pods networked by cni-ebpf.
    Demo,
    /// Benchmarks: the IPAM microbench, then cni-ebpf side by side with the reference
    /// plugins and a bare veth on simulated nodes (control plane, data plane, scale).
    Bench(cni_ebpf_bench::Args),
    /// Run a command of this machine under the second kernel (Debian's 6.12 in qemu, as
    /// the test run's second pass does), e.g. one test binary with a filter; its output
    /// is printed when the guest ends.
    Guest {
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// Build the container image (deploy/Containerfile: FROM scratch and the static
    /// binary) offline with buildah.
    Image(image::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // `cargo xtask` (cargo run) gives this process the xtask's own CARGO_MANIFEST_DIR, which
    // every cargo it starts would inherit. ring's build script reruns when that variable
    // changes, and it names the clone's path: each clean clone rebuilt ring and the rustls
    // crates above it in every build directory. The builds below are not inside a package.
    std::env::remove_var("CARGO_MANIFEST_DIR");
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    setup::ensure_path();
    match cli.cmd {
        Cmd::Setup => setup::run(Need::All, true),
        Cmd::Build => {
            setup::run(Need::Build, false)?;
            build_release()?;
            Ok(())
        }
        Cmd::Load => {
            setup::run(Need::Node, false)?;
            require_root("cargo xtask load")?;
            ensure_bpffs()?;
            let bin = build_release()?;
            sim::load(&bin)
        }
        Cmd::Test { args } => {
            setup::run(Need::All, false)?;
            test(&args)
        }
        Cmd::Fuzz(args) => {
            setup::run(Need::Fuzz, false)?;
            let targets: Vec<&str> = match &args.target {
                Some(t) => vec![t.as_str()],
                None => fuzz::TARGETS.to_vec(),
            };
            fuzz::run(args.seconds, &targets)
        }
        Cmd::Demo => {
            setup::run(Need::Node, false)?;
            require_root("cargo xtask demo")?;
            ensure_bpffs()?;
            let bin = build_release()?;
            demo::run(&bin)
        }
        Cmd::Bench(args) => {
            setup::run(Need::All, false)?;
            require_root("cargo xtask bench")?;
            bench::run(&args)
        }
        Cmd::Guest { argv } => {
            setup::run(Need::Node, false)?;
            let kernel = vm::ensure_kernel()?;
            vm::run_command(&kernel, &argv, &[])
        }
        Cmd::Image(args) => {
            setup::run(Need::Image, false)?;
            image::run_image(&args)
        }
    }
}

/// A build cache kept across runs on this machine (like `bpf-linker` in `~/.cargo/bin`):
/// `$HOME/.cache/cni-ebpf/<name>` (under `target/` without a home). The instrumented fuzz
/// builds, the static musl builds and the test executables of `cargo xtask test` would
/// otherwise start cold in every fresh clone (9, 6 and over 10 minutes on two cores);
/// cargo's fingerprints keep a shared target directory correct across clones (a clone's
/// own crates rebuild, dependencies are reused).
pub fn cache_dir(name: &str) -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map_or_else(
            || workspace_root().join("target").join("cache"),
            |h| PathBuf::from(h).join(".cache/cni-ebpf"),
        )
        .join(name)
}

/// The tree `cargo xtask test` builds from once it has made its build checkout (see
/// `checkout.rs`).
static BUILD_ROOT: OnceLock<PathBuf> = OnceLock::new();

/// The workspace root: the build checkout once `cargo xtask test` made it, else the
/// parent of this crate's manifest dir.
pub fn workspace_root() -> PathBuf {
    if let Some(root) = BUILD_ROOT.get() {
        return root.clone();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Moves this run into the build checkout at a fixed path (see `checkout.rs`): brought up
/// to date with this tree, locked, and from then on the workspace root and the working
/// directory of every build. A run started inside the checkout builds where it is.
fn enter_build_checkout() -> Result<Option<checkout::Checkout>> {
    let dest = cache_dir("checkout");
    let src = workspace_root();
    if src.canonicalize().ok() == dest.canonicalize().ok() {
        return Ok(None);
    }
    let checkout = checkout::sync(&src, &dest)?;
    std::env::set_current_dir(&checkout.root)?;
    if BUILD_ROOT.set(checkout.root.clone()).is_err() {
        bail!("the build checkout was entered twice");
    }
    Ok(Some(checkout))
}

/// Runs a command, failing with its command line when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn build_release() -> Result<PathBuf> {
    eprintln!("xtask: building the release binary");
    run(Command::new("cargo").args(["build", "--release", "-p", "cni-ebpf"]))?;
    // Where cargo put it: `CARGO_TARGET_DIR` when set (as `.ci/run` sets it).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let bin = target.join("release/cni-ebpf");
    check_embedded(&bin)?;
    Ok(bin)
}

/// Runs `f`, then says how long `what` took.
fn timed<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let out = f();
    eprintln!("xtask: {what}: {:.0?}", started.elapsed());
    out
}

/// The cargo profile of the test build (see the workspace's Cargo.toml): release's
/// optimisation, incremental.
const TEST_PROFILE: &str = "test-release";

/// Builds the test-only binary with the `fault-injection` feature (ADD fails after the
/// step named in `CNI_EBPF_FAIL_AT`) in `target_dir` and sets it aside as
/// `cni-ebpf-fault`.
fn build_fault_binary(target_dir: &Path) -> Result<PathBuf> {
    eprintln!("xtask: building the fault-injection test binary");
    run(Command::new("cargo")
        .args([
            "build",
            "--profile",
            TEST_PROFILE,
            "-p",
            "cni-ebpf",
            "--features",
            "fault-injection",
            "--target-dir",
        ])
        .arg(target_dir))?;
    let dir = target_dir.join(TEST_PROFILE);
    let fault = dir.join("cni-ebpf-fault");
    std::fs::copy(dir.join("cni-ebpf"), &fault)
        .context("copying the fault-injection binary aside")?;
    check_embedded(&fault)?;
    Ok(fault)
}

fn check_embedded(bin: &Path) -> Result<()> {
    check_embedded_via(bin, None)
}

/// Fails unless `bin version` says the eBPF programs are embedded; `runner` (qemu-user)
/// runs a binary of another architecture.
pub fn check_embedded_via(bin: &Path, runner: Option<&str>) -> Result<()> {
    let mut cmd = match runner {
        Some(r) => {
            let mut c = Command::new(r);
            c.arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let object_ok = cmd
        .args(["version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("eBPF programs: embedded"))
        .unwrap_or(false);
    if !object_ok {
        bail!(
            "{} was built without its eBPF programs (is bpf-linker on PATH?)",
            bin.display()
        );
    }
    Ok(())
}

/// Mounts bpffs at /sys/fs/bpf when nothing is mounted there (the plugin refuses to pin
/// elsewhere than on bpffs).
fn ensure_bpffs() -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mounted = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"/sys/fs/bpf") && f.get(2) == Some(&"bpf")
    });
    if !mounted {
        eprintln!("xtask: mounting bpffs at /sys/fs/bpf");
        run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    Ok(())
}

fn require_root(what: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("{what} needs root (network namespaces, bpffs, eBPF loading); run it as root");
    }
    Ok(())
}

fn test(args: &[String]) -> Result<()> {
    require_root("cargo xtask test")?;
    ensure_bpffs()?;
    let started = Instant::now();
    let _checkout = timed("the build checkout", enter_build_checkout)?;
    let target_dir = cache_dir("target");
    let fault = timed("the fault-injection binary", || {
        build_fault_binary(&target_dir)
    })?;
    // The plugin under test is the static binary the image ships.
    let static_bin = timed("the static binary", image::build_static)?;
    // The image's other architectures: their static binaries, and the image index of all
    // (testbed/tests/e2e/image.rs takes its OCI archive apart).
    let mut statics = vec![(image::Arch::host()?, static_bin.clone())];
    for arch in image::foreign_arches() {
        let built = timed(&format!("the {} static binary", arch.name), || {
            image::build_static_for(arch)
        })?;
        statics.push((arch, built));
    }
    let archive = timed("the image archive", || image::test_archive(&statics))?;
    let client = timed("the libcni client", sim::build_libcni_client)?;
    eprintln!("xtask: running unit, packet and privileged end-to-end tests");
    // One optimised run covers everything: plain tests and the privileged ones that
    // plain `cargo test` lists as ignored.
    let target_dir = target_dir.to_string_lossy();
    let cargo_test = [
        "test",
        "--profile",
        TEST_PROFILE,
        "--no-fail-fast",
        "--workspace",
        "--exclude",
        "cni-ebpf-bpf",
        // The containerd tests: their CRI client needs protoc, which setup installed.
        "--features",
        "testbed/cri",
        "--target-dir",
        &target_dir,
    ];
    let env: [(&str, &OsStr); 5] = [
        ("CNI_EBPF_BIN", static_bin.as_os_str()),
        ("CNI_EBPF_FAULT_BIN", fault.as_os_str()),
        ("CNI_EBPF_STATIC_BIN", static_bin.as_os_str()),
        ("CNI_EBPF_IMAGE_ARCHIVE", archive.as_os_str()),
        ("LIBCNI_CLIENT", client.as_os_str()),
    ];
    // Built first on their own, so that the build's time and the tests' are told apart.
    timed("the test build", || {
        run(Command::new("cargo").args(cargo_test).arg("--no-run"))
    })?;
    let mut cmd = Command::new("cargo");
    cmd.args(cargo_test)
        .args(["--", "--include-ignored"])
        .args(args)
        .envs(env)
        .env("RUST_BACKTRACE", "1");
    let mut tests = timed("the tests", || run(&mut cmd));
    // The same executables again under a kernel with fq (a filter given to this run
    // applies there too).
    let second = timed("the second kernel's tests", || {
        second_kernel(&cargo_test, &env, args)
    });
    if let Err(e) = second {
        tests = match tests {
            Ok(()) => Err(e),
            Err(t) => Err(t.context(format!("and on the second kernel: {e:#}"))),
        };
    }
    // The other architectures' tier 1 under qemu-user.
    if let Err(e) = timed("the emulated tests", || emulated::run_tests(&statics, args)) {
        tests = match tests {
            Ok(()) => Err(e),
            Err(t) => Err(t.context(format!("and under emulation: {e:#}"))),
        };
    }
    // The bounded fuzz slice runs even when a test failed, so one run reports both; either
    // failing fails `cargo xtask test`.
    let fuzz = timed("the fuzz slice", fuzz_slice);
    eprintln!("xtask: cargo xtask test took {:.0?}", started.elapsed());
    match (tests, fuzz) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(t), Err(f)) => Err(t.context(format!("and the fuzz slice failed too: {f:#}"))),
    }
}

/// The tests that depend on the kernel's features beyond this machine's: egress rates
/// with `fq` (the bandwidth tests end to end, the pacing packet tests), netkit pods,
/// WireGuard between nodes and kube-proxy's IPVS mode: each test binary with the filters that pick them.
const SECOND_KERNEL_TESTS: &[(&str, &[&str])] = &[
    (
        "e2e",
        &[
            "bandwidth::",
            "netkit::",
            "kubernetes::kube_proxy_ipvs",
            "wireguard::",
        ],
    ),
    ("packet", &["pacing::"]),
];

/// Runs [`SECOND_KERNEL_TESTS`] under Debian's 6.12 kernel in qemu (see `vm.rs`); with
/// `CNI_EBPF_SECOND_KERNEL=all` every eBPF packet test instead of the pacing ones (about
/// 10 minutes under emulation), but the `guard_cost` ones, whose per-packet time bounds
/// mean nothing on an emulated CPU. A filter given to `cargo xtask test` replaces theirs.
fn second_kernel(cargo_test: &[&str], env: &[(&str, &OsStr)], args: &[String]) -> Result<()> {
    let kernel = vm::ensure_kernel()?;
    let all = std::env::var("CNI_EBPF_SECOND_KERNEL").is_ok_and(|v| v == "all");
    let filter = |name: &str| -> Option<Vec<String>> {
        let (_, wanted) = SECOND_KERNEL_TESTS.iter().find(|(n, _)| *n == name)?;
        if !args.is_empty() {
            return Some(args.to_vec());
        }
        Some(match (all, name) {
            (true, "packet") => vec!["--skip".to_owned(), "guard_cost::".to_owned()],
            _ => wanted.iter().map(|w| (*w).to_owned()).collect(),
        })
    };
    let tests: Vec<vm::GuestTest> = vm::test_executables(cargo_test)?
        .into_iter()
        .filter_map(|t| {
            let filter = filter(&t.name)?;
            Some(vm::GuestTest { filter, ..t })
        })
        .collect();
    if !SECOND_KERNEL_TESTS
        .iter()
        .all(|(n, _)| tests.iter().any(|t| t.name == *n))
    {
        bail!(
            "expected the test binaries {SECOND_KERNEL_TESTS:?}, found {:?}",
            tests.iter().map(|t| &t.name).collect::<Vec<_>>()
        );
    }
    vm::run_tests(&kernel, &tests, env)
}

/// The short fuzz run of `cargo xtask test`: [`fuzz::TEST_SECONDS`] per target, or
/// `CNI_EBPF_FUZZ_SECONDS` (0 skips it).
fn fuzz_slice() -> Result<()> {
    let seconds = match std::env::var("CNI_EBPF_FUZZ_SECONDS") {
        Ok(s) => s
            .parse()
            .with_context(|| format!("CNI_EBPF_FUZZ_SECONDS={s:?} is not a number"))?,
        Err(_) => fuzz::TEST_SECONDS,
    };
    if seconds == 0 {
        eprintln!("xtask: fuzz slice skipped (CNI_EBPF_FUZZ_SECONDS=0)");
        return Ok(());
    }
    eprintln!("xtask: fuzzing each parser for {seconds} s");
    fuzz::run(seconds, fuzz::TARGETS)
}
