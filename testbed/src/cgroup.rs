//! A cgroup-v2 directory of a test's own, for socket-level (cgroup) eBPF hooks.
//!
//! The plugin's socket hook (`cgroupPath` in its configuration) only sees sockets of
//! processes inside that cgroup, so a test that checks it creates a child directory under
//! the cgroup2 mount, passes it to the plugin, and runs its client as a *process* inside it
//! (cgroup membership is per process: a thread cannot join on its own). Nothing else in the
//! machine's cgroup tree is touched: the directory is created empty, only processes the
//! test starts are moved into it, and it is removed on drop (after they exited).

use std::{
    ffi::OsStr,
    fs::{File, OpenOptions},
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::process::{command, in_netns, run_cmd, Output, DEFAULT_TIMEOUT};

/// The cgroup2 mount point as `/proc/self/mounts` lists it (on hybrid hierarchies
/// `/sys/fs/cgroup/unified`, on unified ones `/sys/fs/cgroup`), if there is one.
#[must_use]
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f.get(1).copied().unwrap_or("")))
    })
}

/// `<cgroup2 mount>/cni-ebpf-test-<tag>`, removed on drop.
#[derive(Debug)]
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// Creates the directory. Panics if there is no cgroup2 mount or it exists already
    /// (a leak of an earlier run: remove it with `rmdir`).
    #[track_caller]
    #[must_use]
    pub fn create(tag: &str) -> Self {
        let Some(mount) = cgroup2_mount() else {
            panic!("no cgroup2 filesystem in /proc/self/mounts: the socket-hook tests need one");
        };
        let path = mount.join(format!("cni-ebpf-test-{tag}"));
        if let Err(e) = std::fs::create_dir(&path) {
            panic!("cannot create cgroup {}: {e}", path.display());
        }
        Self { path }
    }

    /// The directory (what the plugin gets as `cgroupPath`).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `cmd` move itself into this cgroup before it executes (by writing `0`, "the
    /// writing process", to `cgroup.procs`). Panics if that file cannot be opened.
    #[track_caller]
    pub fn enter_on_exec(&self, cmd: &mut Command) {
        let procs = self.path.join("cgroup.procs");
        let mut file: File = match OpenOptions::new().write(true).open(&procs) {
            Ok(f) => f,
            Err(e) => panic!("cannot open {}: {e}", procs.display()),
        };
        // SAFETY: the hook only calls write(2), which is async-signal-safe, on a
        // descriptor opened before fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || file.write_all(b"0"));
        }
    }

    /// Runs `argv` inside the network namespace at `netns` and inside this cgroup, bounded
    /// by [`DEFAULT_TIMEOUT`].
    #[track_caller]
    pub fn exec_in<S: AsRef<OsStr>>(&self, netns: &Path, argv: &[S]) -> Output {
        let mut cmd = command(argv);
        in_netns(&mut cmd, netns);
        self.enter_on_exec(&mut cmd);
        run_cmd(cmd, None, DEFAULT_TIMEOUT)
    }
}

/// While alive, the calling process is a member of a [`TestCgroup`] ([`TestCgroup::join`]);
/// dropping it moves the process back to the cgroup it came from.
#[derive(Debug)]
pub struct Joined {
    back: PathBuf,
}

impl TestCgroup {
    /// Moves the calling process (all its threads: cgroup2 membership is per process) into
    /// this cgroup, so that its own sockets meet the hooks attached here, until the guard
    /// is dropped. Panics if the move fails.
    #[track_caller]
    #[must_use]
    pub fn join(&self) -> Joined {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/')
            .to_owned();
        let Some(mount) = cgroup2_mount() else {
            panic!("no cgroup2 filesystem to come back to");
        };
        let back = mount.join(rel);
        write_pid(&self.path);
        Joined { back }
    }
}

/// Writes `0` (the writing process) to `dir/cgroup.procs`. Panics if it cannot.
#[track_caller]
fn write_pid(dir: &Path) {
    let procs = dir.join("cgroup.procs");
    if let Err(e) = OpenOptions::new()
        .write(true)
        .open(&procs)
        .and_then(|mut f| f.write_all(b"0"))
    {
        panic!("cannot move this process into {}: {e}", dir.display());
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        let procs = self.back.join("cgroup.procs");
        if let Err(e) = OpenOptions::new()
            .write(true)
            .open(&procs)
            .and_then(|mut f| f.write_all(b"0"))
        {
            eprintln!("warning: cannot move back to {}: {e}", self.back.display());
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A process that just exited may still be listed for a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() >= deadline => {
                    eprintln!("warning: cannot remove cgroup {}: {e}", self.path.display());
                    return;
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}
