//! Programs on a netkit pair (`interface: netkit`): `from_netkit` runs in the pod's
//! transmit path (`BPF_NETKIT_PEER`), `to_netkit` in its host device's
//! (`BPF_NETKIT_PRIMARY`), each through a BPF link on the host device (the netkit
//! primary), pinned in bpffs like a tcx link so that it outlives the plugin process.
//! A pair drops every packet while no program is attached to it (see
//! `link::Nl::create_netkit`), so a pod is closed until both links are in place and
//! again once DEL has removed their pins.
//!
//! aya attaches tc programs through clsact and tcx only, so a netkit link is made with
//! `bpf()` commands of our own (`bpf_syscall.rs`): `BPF_LINK_CREATE`, `BPF_OBJ_PIN`,
//! `BPF_LINK_UPDATE` (a live upgrade swaps the program in place) and
//! `BPF_OBJ_GET_INFO_BY_FD` (CHECK).

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    path::Path,
};

use aya::programs::{SchedClassifier, TcAttachType};

use super::bpf_syscall;
use crate::error::{Error, Result};

/// Where on the pair a program runs (uapi `enum bpf_attach_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetkitHook {
    /// `BPF_NETKIT_PRIMARY`: the host device transmitting to the pod.
    Primary,
    /// `BPF_NETKIT_PEER`: the pod transmitting.
    Peer,
}

impl NetkitHook {
    /// The hook of a program that runs at `dir` of a veth pod's host veth: egress (what
    /// reaches the pod) is the primary's transmit, ingress (what the pod sends) the
    /// peer's.
    #[must_use]
    pub fn of(dir: TcAttachType) -> Self {
        match dir {
            TcAttachType::Egress => Self::Primary,
            _ => Self::Peer,
        }
    }

    fn attach_type(self) -> u32 {
        match self {
            Self::Primary => 54,
            Self::Peer => 55,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Peer => "peer",
        }
    }
}

/// uapi `BPF_LINK_TYPE_NETKIT`.
const BPF_LINK_TYPE_NETKIT: u32 = 13;

/// `union bpf_attr` as `BPF_LINK_CREATE` reads it, for a netkit link: no relative
/// program, no expected revision (appended after the programs already there).
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    _pad: u32,
    expected_revision: u64,
}

/// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
#[repr(C)]
#[derive(Default)]
struct GetInfo {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `struct bpf_link_info` of a netkit link (the union member at offset 16), with room for
/// the rest of the structure, which the kernel fills only up to `info_len`.
#[repr(C)]
#[derive(Default, Debug)]
struct LinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    ifindex: u32,
    attach_type: u32,
    _rest: [u64; 6],
}

/// The descriptor of a loaded program.
fn program_fd(program: &SchedClassifier) -> Result<BorrowedFd<'_>> {
    program
        .fd()
        .map(AsFd::as_fd)
        .map_err(|e| Error::datapath("a program's descriptor", e))
}

/// Attaches `program` at `hook` of the netkit pair whose host device is `ifindex`, and
/// pins the link at `pin` (a pin left there by an earlier pair of that name goes first).
pub fn attach(program: &SchedClassifier, ifindex: u32, hook: NetkitHook, pin: &Path) -> Result<()> {
    let what = || format!("attaching a program to netkit #{ifindex} ({})", hook.name());
    super::attach::remove_pin(pin)?;
    let mut attr = LinkCreate {
        prog_fd: program_fd(program)?.as_raw_fd().unsigned_abs(),
        target_ifindex: ifindex,
        attach_type: hook.attach_type(),
        ..LinkCreate::default()
    };
    // SAFETY: `attr` is BPF_LINK_CREATE's layout for a netkit link, with no pointers.
    let link =
        unsafe { bpf_syscall::link_create(&mut attr) }.map_err(|e| Error::datapath(what(), e))?;
    bpf_syscall::obj_pin(link.as_fd(), pin).map_err(|e| {
        Error::datapath(
            format!("{}: pinning the link at {}", what(), pin.display()),
            e,
        )
    })?;
    // Closing our descriptor leaves the pin holding the link.
    Ok(())
}

/// Swaps `program` into the link pinned at `pin` in one step: the pod's packets run the
/// old program or the new one, never none.
pub fn update(program: &SchedClassifier, pin: &Path) -> Result<()> {
    let what = || format!("updating the link pinned at {}", pin.display());
    let link = bpf_syscall::obj_get(pin).map_err(|e| Error::datapath(what(), e))?;
    bpf_syscall::link_update(link.as_fd(), program_fd(program)?)
        .map_err(|e| Error::datapath(what(), e))
}

/// What the link pinned at `pin` is: `(ifindex, hook, program id)`, or `None` when it
/// is not a netkit link (or the pin is missing). The ifindex is of the device whose
/// transmit path runs the program: the primary for [`NetkitHook::Primary`], the peer (in
/// its own namespace) for [`NetkitHook::Peer`]; 0 once that device is gone.
pub fn pinned(pin: &Path) -> Result<Option<(u32, Option<NetkitHook>, u32)>> {
    if !pin.exists() {
        return Ok(None);
    }
    let link = bpf_syscall::obj_get(pin)
        .map_err(|e| Error::datapath(format!("opening link pin {}", pin.display()), e))?;
    let mut info = LinkInfo::default();
    let mut attr = GetInfo {
        bpf_fd: link.as_raw_fd().unsigned_abs(),
        info_len: u32::try_from(std::mem::size_of::<LinkInfo>()).unwrap_or(u32::MAX),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: the kernel writes at most `info_len` bytes into `info`, alive for the call.
    unsafe { bpf_syscall::bpf(bpf_syscall::BPF_OBJ_GET_INFO_BY_FD, &mut attr) }
        .map_err(|e| Error::datapath(format!("reading link pin {}", pin.display()), e))?;
    if info.link_type != BPF_LINK_TYPE_NETKIT {
        return Ok(None);
    }
    let hook = [NetkitHook::Primary, NetkitHook::Peer]
        .into_iter()
        .find(|h| h.attach_type() == info.attach_type);
    Ok(Some((info.ifindex, hook, info.prog_id)))
}
