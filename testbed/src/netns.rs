//! Named network namespaces (`/run/netns/<name>`) that remove themselves on drop.

use std::{
    ffi::OsStr,
    fmt,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use crate::process::{command, in_netns, run, run_cmd, DEFAULT_TIMEOUT};

/// A command of the harness failed (its full output is in the message). The tests panic
/// with it; `xtask` (demo, bench) returns it as an error.
#[derive(Debug)]
pub struct CommandFailed(pub String);

impl fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommandFailed {}

/// Runs `cmd` (bounded by [`DEFAULT_TIMEOUT`]); its stdout, or the failure.
pub(crate) fn checked(cmd: Command) -> Result<String, CommandFailed> {
    let out = run_cmd(cmd, None, DEFAULT_TIMEOUT);
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(CommandFailed(format!("command failed: {out}")))
    }
}

/// Where `ip netns` keeps its bind mounts.
pub const NETNS_DIR: &str = "/run/netns";

/// `ip netns add` sets up the shared `/run/netns` mount on first use; serialise it so
/// parallel tests in one process do not race on that.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

/// A named network namespace we created. Dropping it runs `ip netns del`.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
}

impl NetNs {
    /// Creates `/run/netns/<name>` with its loopback up. Panics if it exists already:
    /// names are unique per test, so an existing one is a leak from an earlier run.
    #[track_caller]
    #[must_use]
    pub fn create(name: &str) -> Self {
        Self::try_create(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Self::create`], returning the failure.
    pub fn try_create(name: &str) -> Result<Self, CommandFailed> {
        let path = Path::new(NETNS_DIR).join(name);
        if path.exists() {
            return Err(CommandFailed(format!(
                "network namespace {} already exists (leaked by an earlier run? `ip netns del {name}`)",
                path.display()
            )));
        }
        {
            let _guard = NETNS_LOCK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            checked(command(&["ip", "netns", "add", name]))?;
        }
        // From here on, dropping `ns` removes it again.
        let ns = Self {
            name: name.to_owned(),
            path,
        };
        ns.sh(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Creates `name` after removing one an earlier, killed run left behind: for the
    /// fixed names of `cargo xtask demo` and the bench's per-run names.
    pub fn create_replacing(name: &str) -> Result<Self, CommandFailed> {
        if Path::new(NETNS_DIR).join(name).exists() {
            let _guard = NETNS_LOCK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            checked(command(&["ip", "netns", "del", name]))?;
        }
        Self::try_create(name)
    }

    /// A command that runs `argv` inside this namespace (its network namespace only, so
    /// `/sys/fs/bpf` and the file system stay the caller's).
    #[track_caller]
    #[must_use]
    pub fn command<S: AsRef<OsStr>>(&self, argv: &[S]) -> Command {
        let mut cmd = command(argv);
        in_netns(&mut cmd, &self.path);
        cmd
    }

    /// Runs `argv` inside this namespace, bounded by [`DEFAULT_TIMEOUT`]; its stdout, or
    /// the failure with the full output.
    pub fn sh<S: AsRef<OsStr>>(&self, argv: &[S]) -> Result<String, CommandFailed> {
        checked(self.command(argv))
    }

    /// The name under `/run/netns`.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's path, as passed in `CNI_NETNS`.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _guard = NETNS_LOCK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A test may have deleted it on purpose (DEL with a vanished netns).
        if !self.path.exists() {
            return;
        }
        let out = run(&["ip", "netns", "del", &self.name]);
        if !out.success() {
            eprintln!("warning: cannot delete netns {}: {out}", self.name);
        }
    }
}
