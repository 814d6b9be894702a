//! Named network namespaces (`/run/netns/<name>`) that remove themselves on drop.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use crate::process::run;

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
        let path = Path::new(NETNS_DIR).join(name);
        assert!(
            !path.exists(),
            "network namespace {} already exists (leaked by an earlier run? `ip netns del {name}`)",
            path.display()
        );
        {
            let _guard = NETNS_LOCK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            run(&["ip", "netns", "add", name]).ok();
        }
        let ns = Self {
            name: name.to_owned(),
            path,
        };
        run(&["ip", "-n", name, "link", "set", "lo", "up"]).ok();
        ns
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
