//! A second kernel: test binaries run again under Debian's 6.12 kernel, booted in qemu.
//!
//! The machine's own kernel lacks what some tests need: it has no `fq` qdisc
//! (`CONFIG_NET_SCH_FQ`), so the departure-time pacing of egress rates only ever
//! falls back to policing there. Debian's 6.12 kernel — the one Debian 12 nodes
//! upgrade to — has `fq` (as a module), and is a second verifier and kernel version for
//! the eBPF programs besides.
//!
//! The guest is the machine itself, read-only: the host's root file system is its lower
//! layer over 9p, with a tmpfs overlay on top, so the same binaries, test executables
//! and tools run unchanged, and nothing the guest does reaches the host. Only a work
//! directory is shared writable, for the script in and the logs out. qemu runs by
//! software emulation (TCG): this machine's /dev/kvm is nested and fails in the kernel's
//! decompressor ("KVM internal error … emulation failure"), and TCG boots in about 8 s.
//! The guest has no network device: every packet stays in the namespaces the tests make
//! inside it.

use std::{
    ffi::OsStr,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{cache_dir, run};

/// The meta package whose dependency is the current Debian 12 build of Linux 6.12.
const KERNEL_META: &str = "linux-image-6.12-amd64";

/// Modules the first stage loads to mount the host's root: 9p over virtio, overlayfs.
/// In dependency order (their `modules.dep` at the time of writing).
const BOOT_MODULES: &[&str] = &[
    "fs/netfs/netfs",
    "net/9p/9pnet",
    "net/9p/9pnet_virtio",
    "fs/9p/9p",
    "fs/overlayfs/overlay",
];

/// The whole guest run (boot, tests, power-off) must end within this.
const GUEST_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// A Debian kernel unpacked in the cache: its image, its modules (with `modules.dep`)
/// and the first-stage initramfs built for it.
pub struct Kernel {
    pub release: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
    initrd: PathBuf,
}

/// The concrete kernel package `KERNEL_META` depends on now.
fn kernel_package() -> Result<String> {
    let out = Command::new("apt-cache")
        .args(["depends", KERNEL_META])
        .output()
        .context("apt-cache depends")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-6.12."))
        .map(str::to_owned)
        .with_context(|| format!("apt-cache names no kernel that {KERNEL_META} depends on"))
}

/// Downloads and unpacks the kernel package into the cache unless it is there; builds
/// the initramfs (every time: it takes a moment, and follows changes to [`INIT`]).
/// Nothing is installed on the host. When apt names no kernel or its download fails (a
/// mirror that moved on to a newer build than the package lists name), the newest kernel
/// already in the cache is used.
pub fn ensure_kernel() -> Result<Kernel> {
    let base = cache_dir("vm");
    let fetched = kernel_package().and_then(|pkg| match unpacked(&base, &pkg) {
        Some(k) => Ok(k),
        None => fetch(&base, &pkg),
    });
    let kernel = match fetched {
        Ok(k) => k,
        Err(e) => {
            let cached = newest_cached(&base).ok_or(e)?;
            eprintln!("xtask: using the cached {cached} for the second-kernel tests");
            unpacked(&base, &cached).context("the cached kernel vanished")?
        }
    };
    build_initrd(
        &kernel,
        &base.join(format!("linux-image-{}", kernel.release)),
    )?;
    Ok(kernel)
}

/// The kernel of package `pkg` if it is unpacked in the cache (`base`).
fn unpacked(base: &Path, pkg: &str) -> Option<Kernel> {
    let dir = base.join(pkg);
    let release = pkg.trim_start_matches("linux-image-").to_owned();
    let kernel = Kernel {
        vmlinuz: dir.join(format!("root/boot/vmlinuz-{release}")),
        modules: dir.join("root/lib/modules"),
        initrd: dir.join("initrd.gz"),
        release,
    };
    let indexed = kernel
        .modules
        .join(&kernel.release)
        .join("modules.dep")
        .exists();
    (kernel.vmlinuz.exists() && indexed).then_some(kernel)
}

/// Downloads package `pkg` into the cache, unpacks it and indexes its modules.
fn fetch(base: &Path, pkg: &str) -> Result<Kernel> {
    eprintln!("xtask: fetching {pkg} for the second-kernel tests");
    let dir = base.join(pkg);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run(Command::new("apt-get")
        .args(["download", "-q", pkg])
        .current_dir(&dir))?;
    let deb = std::fs::read_dir(&dir)?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(dir.join("root")))?;
    std::fs::remove_file(&deb)?;
    let release = pkg.trim_start_matches("linux-image-");
    run(Command::new("depmod")
        .arg("-b")
        .arg(dir.join("root"))
        .arg(release))?;
    unpacked(base, pkg).with_context(|| format!("{pkg} unpacked without its kernel image"))
}

/// The newest kernel package already unpacked in the cache.
fn newest_cached(base: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(base)
        .ok()?
        .filter_map(std::result::Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| unpacked(base, n).is_some())
        .collect();
    names.sort();
    names.pop()
}

/// The first stage, `/init`: mounts the host's root read-only under a tmpfs overlay,
/// the kernel's modules and the work directory, then runs the work directory's
/// `run.sh` chrooted in it and powers off. The kernel's module loader goes through the
/// same chroot, so `ip link add … type veth` or `tc qdisc add … fq` load their modules
/// as on a real node. `/run` is a fresh tmpfs (the host's sockets and netns handles mean
/// nothing in the guest); `/tmp` is not, since a checkout (a CI clone) may live there:
/// the overlay makes it writable without writing to the host.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /lower /upper /root
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in netfs 9pnet 9pnet_virtio 9p overlay; do $B insmod /mod/$m.ko || echo "cebvm: insmod $m failed"; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower
$B mount -t tmpfs -o size=2g tmpfs /upper
$B mkdir -p /upper/u /upper/w
$B mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /root
$B mount -t proc proc /root/proc
$B mount -t sysfs sys /root/sys
$B mount -t devtmpfs dev /root/dev
$B mount -t tmpfs tmpfs /root/run
$B mount -t bpf bpf /root/sys/fs/bpf
$B mount -t cgroup2 cgroup2 /root/sys/fs/cgroup
$B mkdir -p /root/lib/modules
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro kmods /root/lib/modules
WORK=$($B sed -n 's/.*cebwork=\([^ ]*\).*/\1/p' /proc/cmdline)
$B mkdir -p /root$WORK
$B mount -t 9p -o trans=virtio,version=9p2000.L work /root$WORK
echo /modprobe > /proc/sys/kernel/modprobe
echo "cebvm: booted $($B uname -r)"
$B chroot /root /bin/sh $WORK/run.sh
echo "cebvm: run.sh exited $?"
echo o > /proc/sysrq-trigger
$B sleep 30
"#;

const MODPROBE: &str =
    "#!/bin/busybox sh\nexec /bin/busybox chroot /root /usr/sbin/modprobe \"$@\"\n";

/// Writes the initramfs: busybox (static), the boot modules uncompressed (busybox's
/// insmod reads plain ELF), `/init` and the module-loader shim.
fn build_initrd(kernel: &Kernel, dir: &Path) -> Result<()> {
    let tree = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(tree.join("bin"))?;
    std::fs::create_dir_all(tree.join("mod"))?;
    std::fs::copy("/bin/busybox", tree.join("bin/busybox"))
        .context("copying /bin/busybox (Debian's busybox-static)")?;
    let kdir = kernel.modules.join(&kernel.release).join("kernel");
    for m in BOOT_MODULES {
        let name = Path::new(m)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let out = std::fs::File::create(tree.join("mod").join(format!("{name}.ko")))?;
        run(Command::new("xz")
            .arg("-dc")
            .arg(kdir.join(format!("{m}.ko.xz")))
            .stdout(out))?;
    }
    write_exec(&tree.join("init"), INIT)?;
    write_exec(&tree.join("modprobe"), MODPROBE)?;
    let out = std::fs::File::create(dir.join("initrd.gz"))?;
    run(Command::new("sh")
        .args([
            "-c",
            "find . | busybox cpio -o -H newc 2>/dev/null | gzip -1",
        ])
        .current_dir(&tree)
        .stdout(out))?;
    Ok(())
}

fn write_exec(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// One test executable to run in the guest, with its filter (empty: all of it).
pub struct GuestTest {
    pub name: String,
    pub exe: PathBuf,
    /// The package directory it runs in (as cargo runs it).
    pub cwd: PathBuf,
    pub filter: Vec<String>,
}

/// Where the guest's script, logs and results are exchanged (shared writable).
pub fn work_dir() -> PathBuf {
    crate::workspace_root().join("target/vm-work")
}

/// The `export` lines that give the guest's script this machine's `PATH` and `env`.
fn exports(env: &[(&str, &OsStr)]) -> Result<String> {
    let mut s = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root RUST_BACKTRACE=1 CNI_EBPF_EXPECT_FQ=1 CNI_EBPF_EXPECT_NETKIT=1 CNI_EBPF_EXPECT_WIREGUARD=1 \
         CNI_EBPF_EXPECT_IPVS=1\n",
    );
    for (k, v) in env {
        writeln!(s, "export {k}='{}'", v.to_string_lossy())?;
    }
    Ok(s)
}

/// Boots `kernel` and runs `script` (sh, chrooted in the guest's copy of this machine)
/// with [`work_dir`] emptied first; returns once the guest powered off. Fails when the
/// script did not run to its end.
fn boot(kernel: &Kernel, script: &str) -> Result<()> {
    let work = work_dir();
    let done = work.join("done");
    std::fs::write(
        work.join("run.sh"),
        format!("{script}\necho done > '{}'\n", done.display()),
    )?;
    let share = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=none,multidevs=remap{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    let console = std::fs::File::create(work.join("console.log"))?;
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "3G"])
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&kernel.initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 quiet cebwork={}",
            work.display()
        ))
        .arg("-virtfs")
        .arg(share(Path::new("/"), "hostroot", true))
        .arg("-virtfs")
        .arg(share(&kernel.modules, "kmods", true))
        .arg("-virtfs")
        .arg(share(&work, "work", false))
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("starting qemu-system-x86_64 (Debian's qemu-system-x86)")?;
    let started = std::time::Instant::now();
    let finished = loop {
        if child.try_wait()?.is_some() {
            break true;
        }
        if started.elapsed() > GUEST_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "xtask: the guest (Linux {}) ran for {:.0} s",
        kernel.release,
        started.elapsed().as_secs_f64()
    );
    if !finished || !done.exists() {
        let console = std::fs::read_to_string(work.join("console.log")).unwrap_or_default();
        let mut tail: Vec<&str> = console.lines().rev().take(40).collect();
        tail.reverse();
        bail!(
            "the guest (Linux {}) did not finish its script ({}); console:\n{}",
            kernel.release,
            if finished {
                "powered off early"
            } else {
                "killed after the timeout"
            },
            tail.join("\n")
        );
    }
    Ok(())
}

/// Boots `kernel` and runs each job (`name`, directory, argv) in it one after the other
/// with `env`, each one's output logged to the work directory; prints every log after
/// the guest ends; fails when a job did not exit 0 or the guest did not finish.
fn run_jobs(
    kernel: &Kernel,
    jobs: &[(&str, &Path, Vec<String>)],
    env: &[(&str, &OsStr)],
) -> Result<()> {
    let work = work_dir();
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let mut script = exports(env)?;
    for (i, (_, cwd, argv)) in jobs.iter().enumerate() {
        let log = work.join(format!("{i}.log"));
        let quoted: Vec<String> = argv.iter().map(|a| format!("'{a}'")).collect();
        writeln!(
            script,
            "(cd '{}' && {}) > '{}' 2>&1; echo \"rc=$?\" >> '{}'",
            cwd.display(),
            quoted.join(" "),
            log.display(),
            log.display()
        )?;
    }
    let names: Vec<&str> = jobs.iter().map(|j| j.0).collect();
    eprintln!(
        "xtask: booting Linux {} in qemu for {names:?}",
        kernel.release
    );
    let mut booted = boot(kernel, &script);
    // The emulated kernel can die while it boots, before the script starts: seen once, a
    // panic in the timer code under `arp_init` 1.7 s into boot (TCG). No job ran then (the
    // first one's log does not exist), so booting once more runs them all; a guest that
    // failed after its jobs started is not booted again, as a rule.
    //
    // Nor is a guest whose kernel died of an `int3` Oops: the breakpoint the kernel puts
    // in its own text while it patches a static branch or an alternative, met by the other
    // vCPU in code the multi-threaded emulator translated before the patch (seen once, in
    // `__alloc_skb` under a TCP send). Nothing the tests load sets breakpoints (no kprobe,
    // no ftrace), so the jobs are run again from the start, once.
    if let Err(e) = &booted {
        let console = std::fs::read_to_string(work.join("console.log")).unwrap_or_default();
        let again = if !jobs.is_empty() && !work.join("0.log").exists() {
            Some("no job ran")
        } else if console.contains("Oops: int3") {
            Some("the emulated kernel died of an int3 Oops (text patching under TCG)")
        } else {
            None
        };
        if let Some(why) = again {
            eprintln!("xtask: {e:#}\nxtask: {why}; booting the guest once more");
            for i in 0..jobs.len() {
                let _ = std::fs::remove_file(work.join(format!("{i}.log")));
            }
            booted = boot(kernel, &script);
        }
    }
    let mut failed = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let log = std::fs::read_to_string(work.join(format!("{i}.log"))).unwrap_or_default();
        eprintln!("---- {name} on Linux {} ----\n{log}", kernel.release);
        if !log.lines().any(|l| l == "rc=0") {
            failed.push(*name);
        }
    }
    booted?;
    if !failed.is_empty() {
        bail!("on Linux {}: {} failed", kernel.release, failed.join(", "));
    }
    Ok(())
}

/// Boots `kernel` and runs `tests` in it one after the other, each with `env` (see
/// [`run_jobs`]).
pub fn run_tests(kernel: &Kernel, tests: &[GuestTest], env: &[(&str, &OsStr)]) -> Result<()> {
    let jobs: Vec<(&str, &Path, Vec<String>)> = tests
        .iter()
        .map(|t| {
            let mut argv = vec![
                t.exe.display().to_string(),
                "--include-ignored".to_owned(),
                "--test-threads=1".to_owned(),
                "--nocapture".to_owned(),
            ];
            argv.extend(t.filter.iter().cloned());
            (t.name.as_str(), t.cwd.as_path(), argv)
        })
        .collect();
    run_jobs(kernel, &jobs, env)
}

/// Boots `kernel` and runs `argv` (a program of this machine) in it from the workspace
/// root, with `env` (see [`run_jobs`]).
pub fn run_command(kernel: &Kernel, argv: &[String], env: &[(&str, &OsStr)]) -> Result<()> {
    let root = crate::workspace_root();
    let name = argv.first().map_or("command", String::as_str);
    run_jobs(kernel, &[(name, &root, argv.to_vec())], env)
}

/// The test executables of the workspace's test run (`cargo_args`, which must be the
/// same as the run that built them, so nothing is rebuilt) as [`GuestTest`]s without a
/// filter, each to run in its package's directory (as cargo runs it).
pub fn test_executables(cargo_args: &[&str]) -> Result<Vec<GuestTest>> {
    let out = Command::new("cargo")
        .args(cargo_args)
        .args(["--no-run", "--message-format=json"])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed: {}", out.status);
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name), Some(cwd)) = (
            v["executable"].as_str(),
            v["target"]["name"].as_str(),
            v["manifest_path"]
                .as_str()
                .and_then(|m| Path::new(m).parent()),
        ) else {
            continue;
        };
        found.push(GuestTest {
            name: name.to_owned(),
            exe: PathBuf::from(exe),
            cwd: cwd.to_path_buf(),
            filter: Vec::new(),
        });
    }
    Ok(found)
}
