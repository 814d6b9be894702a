//! Network namespaces: validating `CNI_NETNS` and entering a namespace on this thread.
//!
//! `setns(2)` changes the namespace of the calling *thread* only, so [`NetnsGuard`] is
//! `!Send`: it must be dropped (which restores the original namespace) on the thread that
//! created it. The original is taken from `/proc/thread-self/ns/net`, never
//! `/proc/self/ns/net`, which names the main thread's namespace.

use std::{
    fs::File,
    marker::PhantomData,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};
// `NSFS_MAGIC`: the filesystem of namespace files; `PROC_SUPER_MAGIC`: `/proc/<pid>/ns/net`
// files report procfs. Typed constants: `f_type`'s width and signedness differ between
// glibc and musl.
use nix::sys::statfs::{NSFS_MAGIC, PROC_SUPER_MAGIC};

use crate::error::{Error, Result};

/// `NS_GET_NSTYPE` ioctl (`_IO(0xb7, 0x3)`); the request's type differs between glibc
/// (`c_ulong`) and musl (`c_int`).
const NS_GET_NSTYPE: libc::Ioctl = 0xb703;

/// An open, validated network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

fn ns_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Netns {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

impl Netns {
    /// Opens `path` and checks that it is a network namespace other than our own.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ns_err(path, format!("cannot open: {e}")))?;
        let fs = nix::sys::statfs::fstatfs(file.as_fd())
            .map_err(|e| ns_err(path, format!("fstatfs: {e}")))?;
        let magic = fs.filesystem_type();
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(ns_err(path, "is not a namespace file (not on nsfs)"));
        }
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd.
        let kind = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), NS_GET_NSTYPE) };
        if kind < 0 {
            return Err(ns_err(
                path,
                "is not a namespace file (NS_GET_NSTYPE failed)",
            ));
        }
        if kind != libc::CLONE_NEWNET {
            return Err(ns_err(path, "is a namespace, but not a network namespace"));
        }
        let ns = Self {
            file,
            path: path.to_owned(),
        };
        if ns.is_current()? {
            return Err(ns_err(path, "is the plugin's own network namespace"));
        }
        Ok(ns)
    }

    /// Whether this is the namespace the current thread is in.
    pub fn is_current(&self) -> Result<bool> {
        let own = Path::new("/proc/thread-self/ns/net");
        let a = std::fs::metadata(own).map_err(|e| ns_err(own, e.to_string()))?;
        let b = self
            .file
            .metadata()
            .map_err(|e| ns_err(&self.path, e.to_string()))?;
        Ok(a.dev() == b.dev() && a.ino() == b.ino())
    }

    /// The path it was opened from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open namespace file (for `IFLA_NET_NS_FD`).
    #[must_use]
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Moves the current thread into this namespace until the guard is dropped.
    pub fn enter(&self) -> Result<NetnsGuard> {
        let own = Path::new("/proc/thread-self/ns/net");
        let original = File::open(own).map_err(|e| ns_err(own, format!("cannot open: {e}")))?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| ns_err(&self.path, format!("setns: {e}")))?;
        Ok(NetnsGuard {
            original,
            _not_send: PhantomData,
        })
    }

    /// Runs `f` inside this namespace and comes back.
    pub fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _guard = self.enter()?;
        f()
    }
}

/// While alive, the current thread is in another network namespace. Dropping it returns
/// the thread to the namespace it came from. Not `Send`: namespaces are per thread.
#[derive(Debug)]
pub struct NetnsGuard {
    original: File,
    _not_send: PhantomData<*const ()>,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.original.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Continuing in the wrong namespace would configure the wrong network;
            // there is no safe way on, so stop the process here.
            tracing::error!("cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}
