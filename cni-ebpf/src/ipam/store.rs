//! The on-disk store of one network: a checked directory, its lock, and the file primitives
//! the allocator builds on. The layout and the crash-safety argument are in the
//! [module documentation of `ipam`](super).
//!
//! Every path below the store directory is reached through directory file descriptors
//! opened with `O_NOFOLLOW` (`openat`/`linkat`/`unlinkat`/`renameat`), so once the chain
//! from `/` has been checked nothing can be swapped underneath us.

use std::{
    ffi::OsStr,
    fs::File,
    io::{ErrorKind, Read, Write},
    net::IpAddr,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::FileExt,
    },
    path::{Component, Path, PathBuf},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ipnet::IpNet;
use nix::{
    dir::Dir,
    errno::Errno,
    fcntl::{openat, renameat, AtFlags, Flock, FlockArg, OFlag, AT_FDCWD},
    sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag},
    unistd::{geteuid, linkat, unlinkat, UnlinkatFlags},
};
use serde::{Deserialize, Serialize};

use super::record::{parse_record, Record, Requester};
use crate::error::{Error, Result};

/// Version of the on-disk layout written in `meta`. A store with a newer version is refused.
pub const FORMAT: u32 = 1;

/// How long an operation waits for the store lock before failing with code 11.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the kernel publishes the id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Width of a cursor file: the longest address text (39 bytes) and a newline, padded.
const CURSOR_WIDTH: usize = 48;

/// Largest record we read back; anything bigger is not ours.
const MAX_RECORD: u64 = 64 * 1024;

/// Options of [`Store::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Bounded wait for the lock (then [`Error::TryAgain`]).
    pub lock_timeout: Duration,
    /// The boot id to record and compare; `None` reads [`BOOT_ID_PATH`]. Tests use this to
    /// simulate a reboot.
    pub boot_id: Option<String>,
    /// Create the store directory (and missing parents, mode 0700) when it does not exist.
    pub create: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            boot_id: None,
            create: true,
        }
    }
}

/// Identity of a file: device and inode. Two names with the same identity are hard links
/// of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ident {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl From<&FileStat> for Ident {
    fn from(st: &FileStat) -> Self {
        #[expect(
            clippy::useless_conversion,
            reason = "dev_t/ino_t widths differ between targets"
        )]
        Self {
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    format: u32,
    boot_id: String,
}

/// An open, locked store. The lock is held until the value is dropped.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    root: OwnedFd,
    ips: OwnedFd,
    keys: OwnedFd,
    tmp: OwnedFd,
    index: OwnedFd,
    _lock: Flock<File>,
    boot_id: String,
    previous_boot: Option<String>,
    tmp_seq: u32,
}

/// A temporary file in `tmp/`, removed by [`Store::remove_tmp`] (or, if the process dies
/// first, by the next [`Store::open`]: temporary files are only written under the lock, so
/// whatever `tmp/` holds when the lock is taken belongs to a process that died).
#[derive(Debug)]
pub struct TmpFile {
    name: String,
}

fn unsafe_path(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::config(
        "dataDir",
        format!("refusing the IPAM store path: {} {why}", path.display()),
    )
}

fn errno_io(context: impl Into<String>, e: Errno) -> Error {
    Error::io(context, std::io::Error::from(e))
}

/// Mode bits of a stat result.
fn mode_of(st: &FileStat) -> u32 {
    #[expect(
        clippy::useless_conversion,
        reason = "mode_t is u16 or u32 depending on the target"
    )]
    u32::from(st.st_mode)
}

/// Checks owner and write permissions of an opened directory or file. `strict` refuses a
/// sticky world-writable directory too (only ancestors such as `/tmp` may be sticky).
fn check_owner_mode(path: &Path, st: &FileStat, strict: bool) -> Result<()> {
    let euid = geteuid().as_raw();
    if st.st_uid != 0 && st.st_uid != euid {
        return Err(unsafe_path(
            path,
            format!(
                "is owned by uid {}, which is neither root nor the plugin's user (uid {euid})",
                st.st_uid
            ),
        ));
    }
    let mode = mode_of(st) & 0o7777;
    if mode & 0o022 != 0 {
        let sticky = mode & 0o1000 != 0;
        if strict || !sticky {
            return Err(unsafe_path(
                path,
                format!(
                    "is group- or world-writable (mode {mode:04o}); others could tamper with \
                     address reservations"
                ),
            ));
        }
    }
    Ok(())
}

/// Opens `name` in `parent` as a directory without following symlinks, creating it (mode
/// 0700) if `create`. Returns `None` when it does not exist and `create` is false.
fn open_dir_at(
    parent: &OwnedFd,
    name: &OsStr,
    full: &Path,
    create: bool,
    strict: bool,
) -> Result<Option<OwnedFd>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut created = false;
    let fd = loop {
        match openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => break fd,
            Err(Errno::ENOENT) if create && !created => {
                match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => created = true,
                    Err(e) => {
                        return Err(errno_io(format!("creating {}", full.display()), e));
                    }
                }
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let is_link = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
                    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK
                });
                return Err(unsafe_path(
                    full,
                    if is_link {
                        "is a symbolic link; symlinks are not followed in the store path"
                    } else {
                        "is not a directory"
                    },
                ));
            }
            Err(e) => return Err(errno_io(format!("opening {}", full.display()), e)),
        }
    };
    let st = fstat(&fd).map_err(|e| errno_io(format!("inspecting {}", full.display()), e))?;
    check_owner_mode(full, &st, strict)?;
    Ok(Some(fd))
}

/// Walks `path` from `/`, checking every component (no symlink, owned by root or us, not
/// group/world-writable except sticky ancestors). The last two components (the data
/// directory and the store itself) must not be writable by others even if sticky.
fn open_store_dir(path: &Path, create: bool) -> Result<Option<OwnedFd>> {
    if !path.is_absolute() {
        return Err(unsafe_path(path, "is not an absolute path"));
    }
    let mut names: Vec<&OsStr> = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            Component::Prefix(_) | Component::ParentDir => {
                return Err(unsafe_path(path, "contains `..`"));
            }
        }
    }
    let root = openat(
        AT_FDCWD,
        "/",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| errno_io("opening /", e))?;
    let st = fstat(&root).map_err(|e| errno_io("inspecting /", e))?;
    check_owner_mode(Path::new("/"), &st, names.is_empty())?;
    let mut fd = root;
    let mut full = PathBuf::from("/");
    let n = names.len();
    for (i, name) in names.into_iter().enumerate() {
        full.push(name);
        let strict = i + 2 >= n;
        match open_dir_at(&fd, name, &full, create, strict)? {
            Some(next) => fd = next,
            None => return Ok(None),
        }
    }
    Ok(Some(fd))
}

/// Checks the existing part of the store path (no symlink, no foreign owner, no
/// group/world write) without creating anything: ADD's validation before side effects.
pub fn check_path(path: &Path) -> Result<()> {
    open_store_dir(path, false).map(|_| ())
}

/// Reads the current boot id.
pub fn current_boot_id() -> Result<String> {
    let s = std::fs::read_to_string(BOOT_ID_PATH)
        .map_err(|e| Error::io(format!("reading {BOOT_ID_PATH}"), e))?;
    let s = s.trim();
    if s.is_empty() {
        return Err(Error::io(
            format!("reading {BOOT_ID_PATH}"),
            std::io::Error::new(ErrorKind::InvalidData, "the boot id is empty"),
        ));
    }
    Ok(s.to_owned())
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Takes the exclusive lock on `file`, polling with backoff until `timeout`.
fn lock_with_timeout(mut file: File, path: &Path, timeout: Duration) -> Result<Flock<File>> {
    let deadline = Instant::now() + timeout;
    // Spread retries of concurrent waiters a little so they do not wake in lockstep.
    let jitter = u64::from(std::process::id() % 7);
    let mut wait = Duration::from_micros(200 + jitter * 50);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, Errno::EWOULDBLOCK | Errno::EINTR)) => {
                file = f;
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::TryAgain(format!(
                        "the IPAM store {} is locked by another operation; gave up after {} ms",
                        path.display(),
                        timeout.as_millis()
                    )));
                }
                thread::sleep(wait.min(deadline - now));
                wait = (wait * 2).min(Duration::from_millis(10));
            }
            Err((_, e)) => {
                return Err(errno_io(format!("locking {}/lock", path.display()), e));
            }
        }
    }
}

impl Store {
    /// Opens (creating if `opts.create`) the store directory `path`, checks it, takes the
    /// lock and reads the boot record. Returns `None` when the store does not exist and
    /// `opts.create` is false.
    pub fn open(path: &Path, opts: &StoreOptions) -> Result<Option<Self>> {
        let Some(root) = open_store_dir(path, opts.create)? else {
            return Ok(None);
        };
        let sub = |name: &str| -> Result<OwnedFd> {
            open_dir_at(&root, OsStr::new(name), &path.join(name), true, true)?.ok_or_else(|| {
                Error::io(
                    format!("opening {}/{name}", path.display()),
                    std::io::Error::from(ErrorKind::NotFound),
                )
            })
        };
        let lock_path = path.join("lock");
        let lock_fd = openat(
            &root,
            "lock",
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| match e {
            Errno::ELOOP => unsafe_path(&lock_path, "is a symbolic link"),
            e => errno_io(format!("opening {}", lock_path.display()), e),
        })?;
        let st = fstat(&lock_fd)
            .map_err(|e| errno_io(format!("inspecting {}", lock_path.display()), e))?;
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
            return Err(unsafe_path(&lock_path, "is not a regular file"));
        }
        check_owner_mode(&lock_path, &st, true)?;
        let lock = lock_with_timeout(File::from(lock_fd), path, opts.lock_timeout)?;

        let boot_id = match &opts.boot_id {
            Some(b) => b.clone(),
            None => current_boot_id()?,
        };
        let mut store = Self {
            path: path.to_owned(),
            ips: sub("ips")?,
            keys: sub("keys")?,
            tmp: sub("tmp")?,
            index: sub("index")?,
            root,
            _lock: lock,
            boot_id,
            previous_boot: None,
            tmp_seq: 0,
        };
        match store.read_meta()? {
            Some(meta) if meta.format > FORMAT => {
                return Err(Error::Ipam(format!(
                    "the IPAM store {} has format {} but this plugin understands only up to \
                     {FORMAT}; it was written by a newer cni-ebpf",
                    path.display(),
                    meta.format
                )));
            }
            Some(meta) if meta.boot_id == store.boot_id => {}
            Some(meta) => store.previous_boot = Some(meta.boot_id),
            // No (or an unreadable) boot record: treat as a new boot; the sweep keeps
            // every record made in this boot, so this is always safe.
            None => store.previous_boot = Some(String::new()),
        }
        // Only the lock holder writes temporary files, so whatever `tmp/` holds now was
        // left by a killed process: a record never linked (its address was never claimed),
        // one already linked into `ips/` and `keys/` (those names keep it), or a released
        // one whose claims are still to be removed.
        let swept = store.clear_tmp()?;
        if swept > 0 {
            tracing::info!(
                "removed {swept} temporary file(s) a killed process left in {}/tmp",
                path.display()
            );
        }
        Ok(Some(store))
    }

    /// The store directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The boot id of this boot.
    #[must_use]
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// `Some(previous boot id)` when the store was last used in another boot (empty when
    /// unknown), i.e. a reboot sweep is due.
    #[must_use]
    pub fn previous_boot(&self) -> Option<&str> {
        self.previous_boot.as_deref()
    }

    fn read_meta(&self) -> Result<Option<Meta>> {
        let Some(bytes) = read_small(&self.root, "meta", &self.path.join("meta"))? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// Records the current boot id (after a completed sweep).
    pub fn write_meta(&mut self) -> Result<()> {
        let meta = Meta {
            format: FORMAT,
            boot_id: self.boot_id.clone(),
        };
        let mut bytes = serde_json::to_vec(&meta).map_err(|e| Error::Decode {
            what: "IPAM store meta".into(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        let tmp = self.write_tmp_bytes(&bytes, "meta", false)?;
        let res = renameat(&self.tmp, tmp.name.as_str(), &self.root, "meta")
            .map_err(|e| errno_io(format!("replacing {}/meta", self.path.display()), e));
        if res.is_err() {
            self.remove_tmp(&tmp);
        }
        res?;
        self.previous_boot = None;
        Ok(())
    }

    /// A new record for `(container_id, ifname)` in this boot.
    #[must_use]
    pub fn new_record(
        &self,
        container_id: &str,
        ifname: &str,
        addresses: Vec<IpNet>,
        requester: Requester,
    ) -> Record {
        Record {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
            addresses,
            boot_id: self.boot_id.clone(),
            netns: requester.netns,
            created: now_unix(),
            pod: requester.pod,
        }
    }

    fn next_tmp_name(&mut self, what: &str) -> String {
        self.tmp_seq += 1;
        format!("{what}.{}.{}", std::process::id(), self.tmp_seq)
    }

    /// Writes `bytes` to a new temporary file. `sparse`: only the non-zero 4 KiB blocks are
    /// written (index bitmaps of large, mostly free ranges stay small on disk).
    fn write_tmp_bytes(&mut self, bytes: &[u8], what: &str, sparse: bool) -> Result<TmpFile> {
        let name = self.next_tmp_name(what);
        let full = self.path.join("tmp").join(&name);
        let create = || {
            openat(
                &self.tmp,
                name.as_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
        };
        let fd = match create() {
            // A leftover of a killed process that had our PID: we hold the lock, so no
            // temporary file is in flight and it can go.
            Err(Errno::EEXIST) => {
                unlink_at(&self.tmp, &name, &self.path.join("tmp"))?;
                create()
            }
            other => other,
        }
        .map_err(|e| errno_io(format!("creating {}", full.display()), e))?;
        let tmp = TmpFile { name };
        let mut file = File::from(fd);
        let written = if sparse {
            file.set_len(bytes.len() as u64).and_then(|()| {
                bytes
                    .chunks(4096)
                    .enumerate()
                    .filter(|(_, chunk)| chunk.iter().any(|b| *b != 0))
                    .try_for_each(|(i, chunk)| file.write_all_at(chunk, (i * 4096) as u64))
            })
        } else {
            file.write_all(bytes)
        };
        if let Err(e) = written {
            self.remove_tmp(&tmp);
            return Err(Error::io(format!("writing {}", full.display()), e));
        }
        Ok(tmp)
    }

    /// Writes `record` to a new temporary file (the inode every name of the reservation
    /// will share).
    pub fn write_tmp_record(&mut self, record: &Record) -> Result<TmpFile> {
        let mut bytes = serde_json::to_vec(record).map_err(|e| Error::Decode {
            what: "IPAM record".into(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        self.write_tmp_bytes(&bytes, "rec", false)
    }

    /// Removes a temporary file; failures are logged (the next repair removes leftovers).
    pub fn remove_tmp(&self, tmp: &TmpFile) {
        if let Err(e) = unlinkat(&self.tmp, tmp.name.as_str(), UnlinkatFlags::NoRemoveDir) {
            if e != Errno::ENOENT {
                tracing::warn!("removing {}/tmp/{}: {e}", self.path.display(), tmp.name);
            }
        }
    }

    /// Claims `ip` by linking the temporary record as `ips/<ip>`. `Ok(false)` when the
    /// address is already claimed (the link is atomic: of two claimants exactly one wins).
    pub fn link_ip(&self, tmp: &TmpFile, ip: IpAddr) -> Result<bool> {
        let name = ip.to_string();
        match linkat(
            &self.tmp,
            tmp.name.as_str(),
            &self.ips,
            name.as_str(),
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(errno_io(
                format!("claiming {}/ips/{name}", self.path.display()),
                e,
            )),
        }
    }

    /// Commits the reservation by linking the temporary record as `keys/<key>`. This link
    /// is the commit point. `Ok(false)` when the key already exists.
    pub fn commit(&self, tmp: &TmpFile, key: &str) -> Result<bool> {
        match linkat(
            &self.tmp,
            tmp.name.as_str(),
            &self.keys,
            key,
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(errno_io(
                format!("committing {}/keys/{key}", self.path.display()),
                e,
            )),
        }
    }

    /// The identity of `ips/<ip>`, if it exists.
    pub fn ip_ident(&self, ip: IpAddr) -> Result<Option<Ident>> {
        stat_ident(&self.ips, &ip.to_string(), &self.path.join("ips"))
    }

    /// The identity of `keys/<key>`, if it exists.
    pub fn key_ident(&self, key: &str) -> Result<Option<Ident>> {
        stat_ident(&self.keys, key, &self.path.join("keys"))
    }

    /// Reads `keys/<key>`: the record (or `None` if it does not parse) and its identity.
    /// `Ok(None)` when there is no such key.
    pub fn read_key(&self, key: &str) -> Result<Option<(Option<Record>, Ident)>> {
        read_record_at(&self.keys, key, &self.path.join("keys"))
    }

    /// Reads `ips/<ip>`: the record of the reservation that claimed it (or `None` if it
    /// does not parse) and its identity. `Ok(None)` when the address is not claimed.
    pub fn read_ip(&self, ip: IpAddr) -> Result<Option<(Option<Record>, Ident)>> {
        read_record_at(&self.ips, &ip.to_string(), &self.path.join("ips"))
    }

    /// Removes `ips/<ip>` (missing is fine).
    pub fn unlink_ip(&self, ip: IpAddr) -> Result<()> {
        unlink_at(&self.ips, &ip.to_string(), &self.path.join("ips"))
    }

    /// Moves `keys/<key>` into `tmp/`: the commit point of a release (atomic, and the
    /// record keeps its inode). Until the caller removes the returned file, a kill leaves
    /// it in `tmp/`, where the next [`Store::open`] finds it uncommitted and removes the
    /// address claims that are still its inode ([`Store::clear_tmp`]): a release killed
    /// after its commit is finished by whichever operation comes next. `Ok(None)` when
    /// there is no such key.
    pub fn retire_key(&mut self, key: &str) -> Result<Option<TmpFile>> {
        let name = self.next_tmp_name("released");
        match renameat(&self.keys, key, &self.tmp, name.as_str()) {
            Ok(()) => Ok(Some(TmpFile { name })),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno_io(
                format!("releasing {}/keys/{key}", self.path.display()),
                e,
            )),
        }
    }

    /// Removes `keys/<key>` (missing is fine).
    pub fn unlink_key(&self, key: &str) -> Result<()> {
        unlink_at(&self.keys, key, &self.path.join("keys"))
    }

    /// Every key file with its identity.
    pub fn list_keys(&self) -> Result<Vec<(String, Ident)>> {
        list_dir(&self.keys, &self.path.join("keys"))
    }

    /// Every entry of `ips/` with its identity (names that are not addresses too).
    pub fn list_ips(&self) -> Result<Vec<(String, Ident)>> {
        list_dir(&self.ips, &self.path.join("ips"))
    }

    /// Removes an entry of `ips/` by name (for names that are not addresses).
    pub fn unlink_ip_name(&self, name: &str) -> Result<()> {
        unlink_at(&self.ips, name, &self.path.join("ips"))
    }

    /// Removes every temporary file (leftovers of killed processes: a lock holder has none
    /// in flight), and with each the addresses its allocation claimed but never committed,
    /// or its release did not remove yet: an `ips/` link to the very same file with no
    /// `keys/` link to it. (A record whose key exists was committed: its claims are a
    /// reservation DEL releases.) Returns how many temporary files were removed.
    pub fn clear_tmp(&self) -> Result<usize> {
        let tmp_dir = self.path.join("tmp");
        let entries = list_dir(&self.tmp, &tmp_dir)?;
        for (name, ident) in &entries {
            if let Some((Some(rec), _)) = read_record_at(&self.tmp, name, &tmp_dir)? {
                let committed = match rec.key_name() {
                    Ok(key) => {
                        stat_ident(&self.keys, &key, &self.path.join("keys"))? == Some(*ident)
                    }
                    Err(_) => false,
                };
                if !committed {
                    let ips_dir = self.path.join("ips");
                    for a in &rec.addresses {
                        let ip = a.addr().to_string();
                        if stat_ident(&self.ips, &ip, &ips_dir)? == Some(*ident) {
                            tracing::info!(
                                "releasing {ip}: claimed by an allocation or a release \
                                 that was killed"
                            );
                            unlink_at(&self.ips, &ip, &ips_dir)?;
                        }
                    }
                }
            }
            unlink_at(&self.tmp, name, &tmp_dir)?;
        }
        Ok(entries.len())
    }

    /// Number of leftover temporary files (for audits).
    pub fn count_tmp(&self) -> Result<usize> {
        Ok(list_dir(&self.tmp, &self.path.join("tmp"))?.len())
    }

    /// The round-robin cursor of range set `set` (`last_reserved_ip.<set>`, as host-local
    /// names it). A missing or unreadable cursor is `None`: it is only a hint.
    #[must_use]
    pub fn read_cursor(&self, set: usize) -> Option<IpAddr> {
        let name = format!("last_reserved_ip.{set}");
        let bytes = read_small(&self.root, &name, &self.path.join(&name)).ok()??;
        parse_cursor(&bytes)
    }

    /// Stores the round-robin cursor of range set `set`. Best effort: a failure is logged.
    ///
    /// The address is written in place, padded to a fixed width, rather than through
    /// `O_TRUNC`: ext4 flushes a file that was truncated and rewritten on close
    /// (`auto_da_alloc`), and the next truncation then waits for that write-back, which
    /// costs milliseconds per allocation.
    pub fn write_cursor(&self, set: usize, ip: IpAddr) {
        let name = format!("last_reserved_ip.{set}");
        let mut text = format!("{ip}\n").into_bytes();
        text.resize(CURSOR_WIDTH, b' ');
        let res = openat(
            &self.root,
            name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(std::io::Error::from)
        .and_then(|fd| File::from(fd).write_all_at(&text, 0));
        if let Err(e) = res {
            tracing::warn!("updating {}/{name}: {e}", self.path.display());
        }
    }

    /// Opens the index bitmap `index/<name>` if it exists with exactly `len` bytes.
    pub fn open_bitmap(&self, name: &str, len: u64) -> Result<Option<File>> {
        let full = self.path.join("index").join(name);
        match openat(
            &self.index,
            name,
            OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => {
                let file = File::from(fd);
                let actual = file
                    .metadata()
                    .map_err(|e| Error::io(format!("inspecting {}", full.display()), e))?
                    .len();
                Ok((actual == len).then_some(file))
            }
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno_io(format!("opening {}", full.display()), e)),
        }
    }

    /// Atomically replaces the index bitmap `index/<name>` with `bytes`.
    pub fn write_bitmap(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let tmp = self.write_tmp_bytes(bytes, "index", true)?;
        let res = renameat(&self.tmp, tmp.name.as_str(), &self.index, name)
            .map_err(|e| errno_io(format!("replacing {}/index/{name}", self.path.display()), e));
        if res.is_err() {
            self.remove_tmp(&tmp);
        }
        res
    }

    /// Removes every index bitmap not named in `keep`.
    pub fn prune_bitmaps(&self, keep: &[String]) -> Result<()> {
        for (name, _) in list_dir(&self.index, &self.path.join("index"))? {
            if !keep.contains(&name) {
                unlink_at(&self.index, &name, &self.path.join("index"))?;
            }
        }
        Ok(())
    }

    /// Checks that the store accepts a new file (STATUS): creates and removes a probe.
    pub fn probe_writable(&mut self) -> Result<()> {
        let tmp = self.write_tmp_bytes(b"probe\n", "probe", false)?;
        self.remove_tmp(&tmp);
        Ok(())
    }
}

fn stat_ident(dir: &OwnedFd, name: &str, dir_path: &Path) -> Result<Option<Ident>> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Ident::from(&st))),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(errno_io(
            format!("inspecting {}", dir_path.join(name).display()),
            e,
        )),
    }
}

fn unlink_at(dir: &OwnedFd, name: &str, dir_path: &Path) -> Result<()> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(errno_io(
            format!("removing {}", dir_path.join(name).display()),
            e,
        )),
    }
}

/// Reads a small file in `dir` without following symlinks; `None` if it does not exist.
fn read_small(dir: &OwnedFd, name: &str, full: &Path) -> Result<Option<Vec<u8>>> {
    match openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => {
            let mut bytes = Vec::new();
            File::from(fd)
                .take(MAX_RECORD)
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io(format!("reading {}", full.display()), e))?;
            Ok(Some(bytes))
        }
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP) => Err(unsafe_path(full, "is a symbolic link")),
        Err(e) => Err(errno_io(format!("opening {}", full.display()), e)),
    }
}

fn read_record_at(
    dir: &OwnedFd,
    name: &str,
    dir_path: &Path,
) -> Result<Option<(Option<Record>, Ident)>> {
    let full = dir_path.join(name);
    let fd = match openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(unsafe_path(&full, "is a symbolic link")),
        Err(e) => return Err(errno_io(format!("opening {}", full.display()), e)),
    };
    let st = fstat(&fd).map_err(|e| errno_io(format!("inspecting {}", full.display()), e))?;
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_RECORD)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", full.display()), e))?;
    Ok(Some((parse_record(&bytes), Ident::from(&st))))
}

/// Parses the bytes of a cursor file (`last_reserved_ip.<set>`): an address, padded with
/// whitespace. `None` for anything else (the cursor is only a hint).
#[must_use]
pub fn parse_cursor(bytes: &[u8]) -> Option<IpAddr> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

fn list_dir(dir: &OwnedFd, dir_path: &Path) -> Result<Vec<(String, Ident)>> {
    let mut d = Dir::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| errno_io(format!("listing {}", dir_path.display()), e))?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| errno_io(format!("listing {}", dir_path.display()), e))?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let name = String::from_utf8_lossy(bytes).into_owned();
        if let Some(ident) = stat_ident(dir, &name, dir_path)? {
            out.push((name, ident));
        }
    }
    Ok(out)
}

/// Reads `len` bytes at `offset` of an index file (short reads past the end give zeros).
pub fn read_at_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cursor parser takes the store's padded form and nothing else.
    #[test]
    fn cursor_bytes() {
        let padded = format!("{:<48}", "10.0.0.7\n");
        assert_eq!(parse_cursor(padded.as_bytes()), "10.0.0.7".parse().ok());
        assert_eq!(parse_cursor(b"\xff10.0.0.7"), None);
        assert_eq!(parse_cursor(b""), None);
    }
}
