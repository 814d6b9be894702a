//! The `bpf()` commands aya does not make for us, or not the way we need them: opening a
//! pin read-only (`BPF_OBJ_GET` with `BPF_F_RDONLY`), pinning a link aya did not create
//! (`BPF_OBJ_PIN`), swapping a link's program (`BPF_LINK_UPDATE`), and the raw call that
//! the netkit links (`netkit.rs`) and batched map reads (`maps.rs`) make with their own
//! `union bpf_attr` layouts.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

// uapi `enum bpf_cmd`.
pub const BPF_OBJ_PIN: libc::c_long = 6;
pub const BPF_OBJ_GET: libc::c_long = 7;
pub const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
pub const BPF_LINK_CREATE: libc::c_long = 28;
pub const BPF_LINK_UPDATE: libc::c_long = 29;

/// `BPF_F_RDONLY`: a descriptor that may only read.
const BPF_F_RDONLY: u32 = 1 << 3;

/// `bpf(cmd, attr, size_of(attr))`, the kernel's answer or the errno.
///
/// # Safety
///
/// `attr` must be a `repr(C)` prefix of `union bpf_attr` as `cmd` reads it, and every
/// pointer in it must be valid for what the kernel does with it during the call (reads
/// of paths, writes of up to the stated counts into buffers).
pub unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: as the caller guarantees; the size passed is the attribute's own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A descriptor the kernel just returned.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: a new descriptor from the kernel, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `union bpf_attr` as `BPF_OBJ_GET` and `BPF_OBJ_PIN` read it.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn obj_get_with(path: &Path, file_flags: u32) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        file_flags,
        ..ObjAttr::default()
    };
    // SAFETY: BPF_OBJ_GET reads the NUL-terminated path `c` (alive for the call).
    owned(unsafe { bpf(BPF_OBJ_GET, &mut attr) }?)
}

/// Opens the bpffs object pinned at `path` (read-write).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    obj_get_with(path, 0)
}

/// Opens the bpffs object pinned at `path` with a read-only descriptor.
pub fn obj_get_read_only(path: &Path) -> io::Result<OwnedFd> {
    obj_get_with(path, BPF_F_RDONLY)
}

/// Pins the object of `fd` at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd().unsigned_abs(),
        ..ObjAttr::default()
    };
    // SAFETY: BPF_OBJ_PIN reads the NUL-terminated path `c` (alive for the call) and the
    // open descriptor.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// `union bpf_attr` as `BPF_LINK_UPDATE` reads it.
#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Swaps program `prog` into link `link` in one step: what the link runs is the old
/// program or the new one, never none.
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd().unsigned_abs(),
        new_prog_fd: prog.as_raw_fd().unsigned_abs(),
        ..LinkUpdateAttr::default()
    };
    // SAFETY: BPF_LINK_UPDATE reads the two open descriptors `attr` names.
    unsafe { bpf(BPF_LINK_UPDATE, &mut attr) }.map(drop)
}

/// Makes a link: `attr` is `BPF_LINK_CREATE`'s layout for the link's kind; returns the
/// new link's descriptor.
///
/// # Safety
///
/// As [`bpf`] for `BPF_LINK_CREATE`.
pub unsafe fn link_create<T>(attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: as the caller guarantees.
    owned(unsafe { bpf(BPF_LINK_CREATE, attr) }?)
}
