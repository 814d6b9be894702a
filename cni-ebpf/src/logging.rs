//! Logging: `tracing` to the configured log file (append) and to stderr, never stdout.
//!
//! The log file rotates by size (`logOptions`): every plugin process is short-lived and
//! opens the file once, so the process that finds it over `maxSize` renames it to `.1`
//! (shifting older copies up to `.maxBackups`, dropping the oldest) before opening a new
//! one. Concurrent plugin processes serialise the rotation on an advisory lock
//! (`<logFile>.lock`) and re-check the size under it, so two of them never rotate twice or
//! lose a copy. A process that opened the file before a rotation finishes its few lines in
//! `.1`. With `maxSize` 0 the plugin never rotates and logrotate can own the file: each
//! invocation opens it anew (`O_APPEND`), so logrotate's default `create` mode works
//! without `copytruncate` and without a signal.

use std::{
    fs::{self, File, OpenOptions},
    io,
    path::{Path, PathBuf},
    sync::Mutex,
};

use nix::fcntl::{Flock, FlockArg};
use tracing_subscriber::{fmt, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

/// How the log file rotates (`logOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate once the file reaches this many bytes; 0 = never (logrotate owns the file).
    pub max_bytes: u64,
    /// Rotated copies kept (`.1` … `.N`).
    pub backups: u32,
}

impl Default for Rotation {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_SIZE_MB * 1024 * 1024,
            backups: DEFAULT_MAX_BACKUPS,
        }
    }
}

/// `logOptions.maxSize` default, in MiB.
pub const DEFAULT_MAX_SIZE_MB: u64 = 10;
/// `logOptions.maxBackups` default.
pub const DEFAULT_MAX_BACKUPS: u32 = 3;

/// Installs the subscriber. The file gets `level`; stderr gets warnings and errors only,
/// so a runtime that captures stderr sees what matters. A log file that cannot be opened
/// or rotated is reported on stderr and otherwise ignored: logging must not fail an
/// operation.
pub fn init(level: &str, file: Option<&Path>, rotation: Rotation) {
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_filter(EnvFilter::new("warn"));
    let file_layer = file.and_then(|path| {
        if let Err(e) = rotate_if_due(path, rotation) {
            eprintln!("cni-ebpf: cannot rotate log file {}: {e}", path.display());
        }
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => Some(
                fmt::layer()
                    .with_writer(Mutex::new(f))
                    .with_ansi(false)
                    .with_target(false)
                    .with_filter(EnvFilter::new(level)),
            ),
            Err(e) => {
                eprintln!("cni-ebpf: cannot open log file {}: {e}", path.display());
                None
            }
        }
    });
    // A second init (tests) is harmless.
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file_layer)
        .try_init();
}

/// Logging of a long-running command (the agent): stderr only, at `level` (an
/// `EnvFilter` directive; an invalid one falls back to `info`).
pub fn init_stderr(level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(stderr).try_init();
}

/// `<path>.<n>`.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

fn over(path: &Path, max: u64) -> bool {
    fs::metadata(path).is_ok_and(|m| m.len() >= max)
}

/// Rotates `path` if it has reached `rotation.max_bytes`; see the module comment.
pub fn rotate_if_due(path: &Path, rotation: Rotation) -> io::Result<()> {
    if rotation.max_bytes == 0 || !over(path, rotation.max_bytes) {
        return Ok(());
    }
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(PathBuf::from(lock_path))?;
    let _held: Flock<File> =
        Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
    // Another process may have rotated while this one waited.
    if !over(path, rotation.max_bytes) {
        return Ok(());
    }
    let keep = rotation.backups.max(1);
    for n in (1..keep).rev() {
        match fs::rename(numbered(path, n), numbered(path, n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    // Renaming over `.keep` drops the oldest copy.
    fs::rename(path, numbered(path, 1))
}

#[cfg(test)]
mod tests {
    #![expect(clippy::panic, reason = "tests fail by panicking with a message")]

    use std::{fs, path::Path};

    use super::{numbered, rotate_if_due, Rotation};

    fn write(path: &Path, bytes: usize, tag: u8) {
        fs::write(path, vec![tag; bytes]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn tag_of(path: &Path) -> Option<u8> {
        fs::read(path).ok().and_then(|b| b.first().copied())
    }

    #[test]
    fn rotation_keeps_max_backups_newest_first() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("cni.log");
        let r = Rotation {
            max_bytes: 100,
            backups: 2,
        };
        write(&log, 50, b'a');
        rotate_if_due(&log, r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tag_of(&log), Some(b'a'), "under maxSize: left alone");
        for tag in [b'b', b'c', b'd'] {
            write(&log, 100, tag);
            rotate_if_due(&log, r).unwrap_or_else(|e| panic!("{e}"));
            assert!(!log.exists(), "rotated away");
        }
        assert_eq!(tag_of(&numbered(&log, 1)), Some(b'd'));
        assert_eq!(tag_of(&numbered(&log, 2)), Some(b'c'));
        assert!(
            !numbered(&log, 3).exists(),
            "only maxBackups copies are kept"
        );
    }

    #[test]
    fn max_size_zero_never_rotates() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("cni.log");
        write(&log, 10_000, b'a');
        rotate_if_due(
            &log,
            Rotation {
                max_bytes: 0,
                backups: 3,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tag_of(&log), Some(b'a'));
        assert!(!numbered(&log, 1).exists());
    }
}
