//! Loading the object once per network, pinning it, and opening the pins.
//!
//! Loading is serialised by an exclusive `flock` on the network's pin directory (flock
//! works on any inode, bpffs directories included), with a bounded wait. Maps are created
//! by aya's by-name pinning below `v1/maps` (existing pins are reused, so map contents
//! survive a reload), then each program is verified and pinned. Readers that find every
//! program pin present need no lock.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    maps::{Map, MapData, ProgramArray},
    programs::{CgroupSockAddr, Program, ProgramError, ProgramInfo, SchedClassifier},
    Ebpf, EbpfLoader,
};
use cni_ebpf_common::{global, map, prog};
// A typed constant: `f_type`'s width and signedness differ between glibc and musl.
use nix::sys::statfs::BPF_FS_MAGIC;

use super::{object, pins::Pins};
use crate::error::{Error, Result};

/// How long a loader waits for another one holding the lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The networks below `root` (directories, in no particular order). A root that does not
/// exist yet (no network loaded since bpffs was mounted) has none.
pub fn network_dirs(root: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(entries
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}

/// Checks that `dir` (or, if it does not exist yet, its nearest existing ancestor) is on a
/// bpf filesystem.
pub fn check_bpffs(dir: &Path) -> Result<()> {
    let mut probe = dir;
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p,
            None => break,
        }
    }
    let fs = nix::sys::statfs::statfs(probe).map_err(|e| {
        Error::NotAvailable(format!("cannot stat bpffsRoot {}: {e}", probe.display()))
    })?;
    let magic = fs.filesystem_type();
    if magic != BPF_FS_MAGIC {
        return Err(Error::NotAvailable(format!(
            "{} is not on a bpf filesystem (bpffsRoot {}); mount one, e.g. \
             `mount -t bpf bpf /sys/fs/bpf`",
            probe.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// An exclusive lock on the network's pin directory, released on drop.
pub struct LoadLock {
    _file: File,
}

impl LoadLock {
    /// Takes the lock, waiting at most [`LOCK_WAIT`] (then error 11, try again).
    pub fn acquire(pins: &Pins) -> Result<Self> {
        let dir = pins.network_dir();
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let file = lock_dir(dir, || {
            format!(
                "another cni-ebpf is loading the datapath of {} (lock held for more than {}s)",
                dir.display(),
                LOCK_WAIT.as_secs()
            )
        })?;
        Ok(Self { _file: file })
    }
}

/// An exclusive `flock` on directory `dir`, released when the returned file is closed;
/// waits at most [`LOCK_WAIT`], then fails with error 11 (try again) and `busy()`.
pub(super) fn lock_dir(dir: &Path, busy: impl Fn() -> String) -> Result<File> {
    let start = Instant::now();
    loop {
        if let Some(file) = try_lock_dir(dir)? {
            return Ok(file);
        }
        if start.elapsed() > LOCK_WAIT {
            return Err(Error::TryAgain(busy()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// [`lock_dir`] without waiting: `None` while another process holds the lock (or the
/// attempt was interrupted).
pub(super) fn try_lock_dir(dir: &Path) -> Result<Option<File>> {
    let file = File::open(dir).map_err(|e| Error::io(format!("opening {}", dir.display()), e))?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK)
        || err.kind() == std::io::ErrorKind::Interrupted
    {
        return Ok(None);
    }
    Err(Error::io(format!("locking {}", dir.display()), err))
}

/// Formats a program error, verifier log included.
pub fn program_error(e: &ProgramError) -> String {
    crate::error::program_text(e)
}

/// Test-only faults the programs can be loaded with, for the packet tests
/// ([`load_and_pin_with`]). The plugin always loads with none (`Faults::default()`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every L4 checksum update of the tc programs fails after the packet's tuple was
    /// written (global `FAULT_L4_CSUM`), as a failing `bpf_l4_csum_replace` would.
    pub l4_csum: bool,
}

/// Loads and pins whatever is missing. The caller holds the [`LoadLock`].
pub fn load_and_pin(pins: &Pins) -> Result<()> {
    load_and_pin_with(pins, Faults::default())
}

/// [`load_and_pin`] with test-only `faults` set in the programs it loads (programs already
/// pinned are kept as they are). Only the packet tests ask for faults.
#[doc(hidden)]
pub fn load_and_pin_with(pins: &Pins, faults: Faults) -> Result<()> {
    pins.create_dirs()?;
    let mut ebpf = load_object(pins, faults)?;
    crate::faults::point("load-maps-pinned")?;
    let fresh = !prog::ALL.iter().any(|p| pins.prog(p).exists());
    let mut calls6 = calls6(&mut ebpf)?;
    for name in prog::ALL {
        let pin = pins.prog(name);
        let slot = call6_slot(name);
        if pin.exists() {
            // A loader killed between a slot and the next pin left the slot set, or not.
            if let Some(slot) = slot {
                set_call6(&mut calls6, slot, open_program(pins, name)?.fd(), name)?;
            }
            continue;
        }
        let mut loaded = load_program(&mut ebpf, name)?;
        // The slot before the pin: a pinned tail-call program is always in its slot, so a
        // datapath whose pins are complete never lacks one.
        if let (Some(slot), Loaded::Tc(p)) = (slot, &loaded) {
            set_call6(&mut calls6, slot, p.fd(), name)?;
        }
        loaded.pin(&pin).map_err(|e| {
            Error::datapath(format!("pinning program {name} at {}", pin.display()), e)
        })?;
    }
    // Mark the pins as this object's only if every program is: a load killed half-way by
    // another binary left some of its own, which the carry-over replaces (`upgrade.rs`).
    if fresh {
        let marker = pins.version_dir().join(super::object::stamp());
        match std::fs::create_dir(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("creating {}", marker.display()), e)),
        }
    }
    Ok(())
}

/// The `CALLS6` program array of `ebpf` (its pinned map), opened apart from the object
/// so that its slots can be set while the object's programs are borrowed.
pub fn calls6(ebpf: &mut Ebpf) -> Result<ProgramArray<MapData>> {
    let map = ebpf.take_map(map::CALLS6).ok_or_else(|| {
        Error::datapath(
            format!("opening map {}", map::CALLS6),
            "the embedded object has no such map",
        )
    })?;
    ProgramArray::try_from(map)
        .map_err(|e| Error::datapath(format!("opening map {}", map::CALLS6), e))
}

/// The `CALLS6` slot of program `name`, if it is tail-called.
#[must_use]
pub fn call6_slot(name: &str) -> Option<u32> {
    prog::CALLS6
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, slot)| *slot)
}

/// Puts program `name` (its descriptor `fd`) in `slot` of `CALLS6`: the attached
/// programs tail-call it from their next packet on (an atomic swap for a replaced one).
pub fn set_call6(
    calls6: &mut ProgramArray<MapData>,
    slot: u32,
    fd: std::result::Result<&aya::programs::ProgramFd, ProgramError>,
    name: &str,
) -> Result<()> {
    let what = || format!("setting slot {slot} of {} to {name}", map::CALLS6);
    let fd = fd.map_err(|e| Error::datapath(what(), e))?;
    calls6
        .set(slot, fd, 0)
        .map_err(|e| Error::datapath(what(), e))
}

/// The embedded object loaded with its maps bound to the pins in `pins` (aya's by-name
/// pinning: existing pins are reused with their contents, missing ones created), and
/// test-only `faults` set in its globals.
pub fn load_object(pins: &Pins, faults: Faults) -> Result<Ebpf> {
    let bytes = object::bytes()?;
    let maps_dir = pins.maps_dir();
    let fault_l4_csum = u32::from(faults.l4_csum);
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(&maps_dir);
    if faults != Faults::default() {
        loader.override_global(global::FAULT_L4_CSUM, &fault_l4_csum, true);
    }
    loader.load(bytes).map_err(|e| {
        Error::datapath(
            format!(
                "loading the eBPF object (maps pinned in {})",
                maps_dir.display()
            ),
            e,
        )
    })
}

/// A program of the object, verified: a tc classifier or a cgroup socket program.
pub enum Loaded<'a> {
    /// `from_pod`, `uplink_ingress`, `uplink_egress`.
    Tc(&'a mut SchedClassifier),
    /// The host-port hooks of the node's own sockets.
    Sock(&'a mut CgroupSockAddr),
}

impl Loaded<'_> {
    /// Pins the program at `path`.
    pub fn pin(&mut self, path: &Path) -> std::result::Result<(), aya::pin::PinError> {
        match self {
            Self::Tc(p) => p.pin(path),
            Self::Sock(p) => p.pin(path),
        }
    }
}

/// Verifies (loads into the kernel) program `name` of `ebpf`.
pub fn load_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<Loaded<'a>> {
    let verify = |e: ProgramError| Error::datapath(format!("verifying program {name}"), e);
    match ebpf.program_mut(name) {
        Some(Program::SchedClassifier(p)) => {
            p.load().map_err(verify)?;
            Ok(Loaded::Tc(p))
        }
        Some(Program::CgroupSockAddr(p)) => {
            p.load().map_err(verify)?;
            Ok(Loaded::Sock(p))
        }
        Some(_) => Err(Error::datapath(
            format!("loading program {name}"),
            "the embedded object's program has an unexpected type",
        )),
        None => Err(Error::datapath(
            format!("loading program {name}"),
            "the embedded object has no such program",
        )),
    }
}

/// Opens a pinned map.
pub fn open_map(pins: &Pins, name: &str) -> Result<Map> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::datapath(format!("opening pinned map {}", path.display()), e))?;
    Map::from_map_data(data)
        .map_err(|e| Error::datapath(format!("opening pinned map {}", path.display()), e))
}

/// Opens a pinned map read-only (`BPF_OBJ_GET` with `BPF_F_RDONLY`): lookups and
/// iteration work, every update or delete through it is refused by the kernel. For
/// readers that must never change the datapath (the agent's metrics).
pub fn open_map_read_only(pins: &Pins, name: &str) -> Result<Map> {
    let path = pins.map(name);
    let err = |e: &dyn std::error::Error| {
        Error::datapath(
            format!("opening pinned map {} read-only", path.display()),
            crate::error::chain(e),
        )
    };
    let fd = super::bpf_syscall::obj_get_read_only(&path).map_err(|e| err(&e))?;
    let data = MapData::from_fd(fd).map_err(|e| err(&e))?;
    Map::from_map_data(data).map_err(|e| err(&e))
}

/// Opens a pinned program. (Through `ProgramInfo`: `SchedClassifier::from_pin` reads the
/// name with `name_as_str`, which makes aya probe kernel features — ~17 syscalls — in
/// every process.)
pub fn open_program(pins: &Pins, name: &str) -> Result<SchedClassifier> {
    let path = pins.prog(name);
    let err =
        |e: ProgramError| Error::datapath(format!("opening pinned program {}", path.display()), e);
    let info = ProgramInfo::from_pin(&path).map_err(err)?;
    SchedClassifier::from_program_info(info, name.to_owned().into()).map_err(err)
}
