//! Attaching pinned programs to interfaces, as the configuration's `attach` asks: a
//! `clsact` filter at our fixed priority and handle (`tc`), or a tcx link pinned in bpffs
//! (`tcx`, kernel ≥ 6.6). Either outlives the plugin process. Re-attaching is atomic in
//! both modes: a filter is replaced in place, a tcx link's program is swapped through
//! its pin.

use std::{io, path::Path};

use aya::programs::{
    links::{FdLink, LinkError, PinnedLink},
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    LinkOrder, ProgramError, SchedClassifier, TcAttachType, TcError,
};

use super::load;
use crate::{
    cni::config::AttachPolicy,
    error::{Error, Result},
    kernel::tc::{self as tcnl, Hook},
};

/// The priority of our clsact filters. 1 runs before filters other tools add with the
/// kernel's default priorities (49152 and up), as a tcx link appended to an empty list
/// would.
pub const TC_PRIORITY: u16 = 1;
/// The handle of our clsact filter on a host veth within [`TC_PRIORITY`] (`0xcb0f`, "cni
/// bpf"). A host veth belongs to one network; the uplink is shared by every network on the
/// node, so each network's uplink filters get a handle of their own ([`uplink_handle`]).
pub const TC_HANDLE: u32 = 0xcb0f;

/// The handle of a network's clsact filters on the uplink: `0xcb0f_xxxx`, the low half
/// from the network's pin directory (FNV-1a, as owner ids), never [`TC_HANDLE`].
#[must_use]
pub fn uplink_handle(network_dir: &Path) -> u32 {
    let h = cni_ebpf_common::owner_id(network_dir.as_os_str().as_encoded_bytes(), b"uplink");
    0xcb0f_0000 | (h as u32 & 0xffff)
}

/// `ENOTSUPP` (524), the kernel-internal errno a BPF link type this kernel lacks returns;
/// not in libc because userspace is not meant to see it.
const ENOTSUPP: i32 = 524;

/// How a program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// A tcx link, pinned.
    Tcx,
    /// A clsact filter at [`TC_PRIORITY`] (lives as long as the interface).
    Tc,
}

/// The errno behind an aya program error, where there is one.
fn errno_of(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        ProgramError::TcError(TcError::NetlinkError(n)) => n.raw_os_error(),
        ProgramError::TcError(TcError::IoError(e)) => e.raw_os_error(),
        _ => None,
    }
}

/// Whether an errno says "this kernel has no tcx".
fn no_tcx(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP))
}

fn hook(dir: TcAttachType) -> Hook {
    match dir {
        TcAttachType::Egress => Hook::Egress,
        _ => Hook::Ingress,
    }
}

/// Attaches `program` to `ifname` (`ifindex`) in direction `dir` as `policy` asks; a tcx
/// link is pinned at `pin`. An attachment of the other mode left by an earlier
/// configuration is removed, so the program never runs twice.
pub fn attach(
    program: &mut SchedClassifier,
    ifname: &str,
    ifindex: u32,
    dir: TcAttachType,
    pin: &Path,
    handle: u32,
    policy: AttachPolicy,
) -> Result<AttachMode> {
    // Built only on failure: reading the program's name costs a syscall.
    let context = |program: &SchedClassifier| {
        format!("attaching {} to {ifname} ({dir:?})", program_name(program))
    };
    match policy {
        AttachPolicy::Tc => {
            attach_tc(program, ifname, dir, handle)
                .map_err(|e| Error::datapath(context(program), e))?;
            drop_tcx_link(program, ifname, dir, pin)?;
            Ok(AttachMode::Tc)
        }
        AttachPolicy::Tcx | AttachPolicy::Auto => match attach_tcx(program, ifname, dir, pin) {
            Ok(()) => {
                tcnl::delete_filter(ifindex, hook(dir), TC_PRIORITY, handle).map_err(|e| {
                    Error::io(
                        format!("{}: removing our clsact filter", context(program)),
                        e,
                    )
                })?;
                Ok(AttachMode::Tcx)
            }
            Err(TcxError::Unsupported(e)) if policy == AttachPolicy::Auto => {
                attach_tc(program, ifname, dir, handle).map_err(|e2| {
                    Error::datapath(
                        context(program),
                        format!(
                            "tcx failed ({}), a clsact filter failed too: {}",
                            load::program_error(&e),
                            load::program_error(&e2)
                        ),
                    )
                })?;
                Ok(AttachMode::Tc)
            }
            Err(TcxError::Unsupported(e)) => Err(Error::datapath(
                context(program),
                format!(
                    "this kernel has no tcx ({}); tcx needs Linux 6.6 or later: set \"attach\" \
                     to \"tc\" or \"auto\"",
                    load::program_error(&e)
                ),
            )),
            Err(TcxError::Failed(e)) => Err(Error::datapath(context(program), e)),
        },
    }
}

/// Removes the tcx link an earlier configuration pinned at `pin` for `program`, if any;
/// the kernel releases it asynchronously: returns once the program runs only once.
fn drop_tcx_link(
    program: &SchedClassifier,
    ifname: &str,
    dir: TcAttachType,
    pin: &Path,
) -> Result<()> {
    if remove_pin(pin)? {
        let id = program_id(program)?;
        for _ in 0..50 {
            if tcx_attached(ifname, dir, id)? != Some(true) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    Ok(())
}

/// One program for [`attach_tc_all`]: its name, hook, and where a tcx link of an earlier
/// configuration would be pinned.
pub struct TcProgram<'a> {
    pub program: &'a SchedClassifier,
    pub name: &'a str,
    pub dir: TcAttachType,
    pub pin: &'a Path,
}

/// [`attach`] with `attach: "tc"` for several programs on one device at once: the clsact
/// qdisc and every filter (at [`TC_PRIORITY`]/`handle`) in one netlink round trip, then
/// any tcx link an earlier configuration left removed.
pub fn attach_tc_all(
    ifname: &str,
    ifindex: u32,
    handle: u32,
    programs: &[TcProgram<'_>],
) -> Result<()> {
    use std::os::fd::AsFd;
    let mut filters = Vec::with_capacity(programs.len());
    for p in programs {
        let fd = p
            .program
            .fd()
            .map_err(|e| Error::datapath(format!("attaching {} to {ifname}", p.name), e))?;
        filters.push(tcnl::BpfFilter {
            hook: hook(p.dir),
            prog_fd: fd.as_fd(),
            name: p.name,
        });
    }
    tcnl::attach_filters(ifindex, TC_PRIORITY, handle, &filters).map_err(|e| {
        let names: Vec<&str> = programs.iter().map(|p| p.name).collect();
        Error::datapath(format!("attaching {names:?} to {ifname}"), e)
    })?;
    for p in programs {
        drop_tcx_link(p.program, ifname, p.dir, p.pin)?;
    }
    Ok(())
}

enum TcxError {
    /// The kernel has no tcx.
    Unsupported(ProgramError),
    /// Anything else, described.
    Failed(String),
}

/// Attaches through a tcx link pinned at `pin`. A link already pinned there (ours, from
/// an earlier load or another program version) gets the program swapped in atomically;
/// a pin whose link no longer has a device (the interface was deleted) is replaced.
fn attach_tcx(
    program: &mut SchedClassifier,
    ifname: &str,
    dir: TcAttachType,
    pin: &Path,
) -> std::result::Result<(), TcxError> {
    if let Ok(Some(link)) = live_pinned_link(pin, ifname, dir) {
        let id = program
            .attach_to_link(link)
            .map_err(|e| TcxError::Failed(load::program_error(&e)))?;
        // Dropping our handle closes our descriptor only: the pin keeps the link.
        drop(
            program
                .take_link(id)
                .map_err(|e| TcxError::Failed(load::program_error(&e)))?,
        );
        return Ok(());
    }
    remove_pin(pin).map_err(|e| TcxError::Failed(e.to_string()))?;
    // Dropping the last reference of a link (the pin just removed) detaches it
    // asynchronously; until the kernel has, attaching the same program to the same device
    // fails with EEXIST. Wait for it, bounded (50 × 2 ms).
    let mut tries = 0;
    let id = loop {
        match program.attach_with_options(
            ifname,
            dir,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        ) {
            Err(e) if errno_of(&e) == Some(libc::EEXIST) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) if no_tcx(errno_of(&e)) => return Err(TcxError::Unsupported(e)),
            Err(e) => return Err(TcxError::Failed(load::program_error(&e))),
            Ok(id) => break id,
        }
    };
    let link = program
        .take_link(id)
        .map_err(|e| TcxError::Failed(load::program_error(&e)))?;
    let fd_link: FdLink = link
        .try_into()
        .map_err(|e: LinkError| TcxError::Failed(crate::error::chain(&e)))?;
    fd_link.pin(pin).map_err(|e| {
        TcxError::Failed(format!(
            "pinning the link at {}: {}",
            pin.display(),
            crate::error::chain(&e)
        ))
    })?;
    Ok(())
}

/// The tcx link pinned at `pin` if it is still attached to `ifname` in `dir`.
fn live_pinned_link(
    pin: &Path,
    ifname: &str,
    dir: TcAttachType,
) -> Result<Option<SchedClassifierLink>> {
    let Some(prog_id) = pinned_link_program(pin)? else {
        return Ok(None);
    };
    if tcx_attached(ifname, dir, prog_id)? != Some(true) {
        return Ok(None);
    }
    let fd = open_pinned_link(pin)?;
    Ok(Some(SchedClassifierLink::try_from(fd).map_err(|e| {
        Error::datapath(format!("link pin {}", pin.display()), e)
    })?))
}

/// Attaches as a direct-action filter at [`TC_PRIORITY`]/`handle` of the device's
/// clsact qdisc (added if missing). Our filter already there is replaced in place, so
/// packets never see the hook empty.
fn attach_tc(
    program: &mut SchedClassifier,
    ifname: &str,
    dir: TcAttachType,
    handle: u32,
) -> std::result::Result<(), ProgramError> {
    match tc::qdisc_add_clsact(ifname) {
        Ok(()) | Err(TcError::AlreadyAttached) => {}
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let options = NlOptions {
        priority: TC_PRIORITY,
        handle: TcHandle::from(handle),
        ..NlOptions::default()
    };
    let id = match program.attach_with_options(ifname, dir, TcAttachOptions::Netlink(options)) {
        Err(e) if errno_of(&e) == Some(libc::EEXIST) => {
            let ours = SchedClassifierLink::attached(
                ifname,
                dir,
                TC_PRIORITY,
                TcHandle::from(handle),
                None,
            )
            .map_err(TcError::IoError)?;
            program.attach_to_link(ours)?
        }
        r => r?,
    };
    let link = program.take_link(id)?;
    // The filter must outlive this process: dropping the link would detach it.
    std::mem::forget(link);
    Ok(())
}

/// Removes our clsact filter (`handle`) from `ifname` in `dir`; a device or filter that
/// is not there is fine.
pub fn remove_filter(ifname: &str, dir: TcAttachType, handle: u32) -> Result<()> {
    let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname) else {
        return Ok(());
    };
    tcnl::delete_filter(ifindex, hook(dir), TC_PRIORITY, handle)
        .map_err(|e| Error::io(format!("removing our tc filter from {ifname}"), e))
}

/// Removes from `ifindex`'s `dir` hook each of our clsact filters (`(prog_id, handle)`
/// at [`TC_PRIORITY`]) that runs its program; a filter at the same address running another
/// program is left alone. The hook is listed once. Returns how many were removed.
pub fn remove_filters_running(
    ifindex: u32,
    dir: TcAttachType,
    ours: &[(u32, u32)],
) -> Result<usize> {
    let filters = tcnl::filters(ifindex, hook(dir))
        .map_err(|e| Error::io(format!("listing the tc filters of ifindex {ifindex}"), e))?;
    let mut removed = 0;
    for &(prog_id, handle) in ours {
        if filters.iter().any(|f| is_ours(f, prog_id, handle)) {
            tcnl::delete_filter(ifindex, hook(dir), TC_PRIORITY, handle).map_err(|e| {
                Error::io(format!("removing our tc filter from ifindex {ifindex}"), e)
            })?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// How `prog_id` is attached to `ifname` (`ifindex`) in `dir`: through the tcx link
/// pinned at `pin`, as our clsact filter, or (`None`) not at all. A program attached both
/// ways is reported as tcx (CHECK's [`attached_twice`] tells).
pub fn attached(
    ifname: &str,
    ifindex: u32,
    dir: TcAttachType,
    prog_id: u32,
    pin: &Path,
    handle: u32,
) -> Result<Option<AttachMode>> {
    if pinned_link_program(pin)? == Some(prog_id)
        && tcx_attached(ifname, dir, prog_id)? == Some(true)
    {
        return Ok(Some(AttachMode::Tcx));
    }
    Ok(our_filter(ifindex, dir, prog_id, handle)?.then_some(AttachMode::Tc))
}

/// Whether `prog_id` runs both as a tcx link and as our clsact filter on the device.
pub fn attached_twice(
    ifname: &str,
    ifindex: u32,
    dir: TcAttachType,
    prog_id: u32,
    handle: u32,
) -> Result<bool> {
    Ok(tcx_attached(ifname, dir, prog_id)? == Some(true)
        && our_filter(ifindex, dir, prog_id, handle)?)
}

/// Whether our clsact filter on the device runs `prog_id`.
fn our_filter(ifindex: u32, dir: TcAttachType, prog_id: u32, handle: u32) -> Result<bool> {
    let filters = tcnl::filters(ifindex, hook(dir))
        .map_err(|e| Error::io(format!("listing the tc filters of ifindex {ifindex}"), e))?;
    Ok(filters.iter().any(|f| is_ours(f, prog_id, handle)))
}

/// Whether `f` is our filter at `handle` running `prog_id`.
fn is_ours(f: &tcnl::Filter, prog_id: u32, handle: u32) -> bool {
    f.priority == TC_PRIORITY && f.handle == handle && f.prog_id == Some(prog_id)
}

/// The program's kernel name. (`ProgramInfo::name_as_str` would make aya probe kernel
/// features first: ~17 syscalls in every process that calls it.)
fn program_name(program: &SchedClassifier) -> String {
    program
        .info()
        .ok()
        .map(|i| String::from_utf8_lossy(i.name()).into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "program".into())
}

/// Removes a link pin (detaching the link if nothing else holds it); missing is fine.
/// Returns whether there was one.
pub fn remove_pin(pin: &Path) -> Result<bool> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(format!("removing link pin {}", pin.display()), e)),
    }
}

/// Opens the link pinned at `pin`.
fn open_pinned_link(pin: &Path) -> Result<FdLink> {
    PinnedLink::from_pin(pin)
        .map(Into::into)
        .map_err(|e| Error::datapath(format!("opening link pin {}", pin.display()), e))
}

/// The program id a pinned link runs, if the pin exists.
pub fn pinned_link_program(pin: &Path) -> Result<Option<u32>> {
    if !pin.exists() {
        return Ok(None);
    }
    let fd = open_pinned_link(pin)?;
    let info = fd
        .info()
        .map_err(|e| Error::datapath(format!("reading link pin {}", pin.display()), e))?;
    // Dropping `fd` closes our descriptor only; the pin keeps the link.
    Ok(Some(info.program_id()))
}

/// Whether program `prog_id` is attached via tcx to `ifname` in `dir`. `Ok(None)` when the
/// kernel has no tcx (legacy attachments cannot be told apart this way).
pub fn tcx_attached(ifname: &str, dir: TcAttachType, prog_id: u32) -> Result<Option<bool>> {
    match SchedClassifier::query_tcx(ifname, dir) {
        Ok((_, progs)) => Ok(Some(progs.iter().any(|p| p.id() == prog_id))),
        Err(e) if no_tcx(errno_of(&e)) => Ok(None),
        Err(ProgramError::TcError(TcError::IoError(e)))
            if e.raw_os_error() == Some(libc::ENODEV) =>
        {
            Ok(Some(false))
        }
        Err(e) => Err(Error::datapath(
            format!("querying tc programs on {ifname}"),
            e,
        )),
    }
}

/// The id of the program pinned at `pin`: one open and one info query, no program handle
/// (the per-ADD check that the uplink programs are attached needs only their ids).
pub fn pinned_program_id(pin: &Path) -> Result<u32> {
    aya::programs::ProgramInfo::from_pin(pin)
        .map(|i| i.id())
        .map_err(|e| Error::datapath(format!("reading the info of {}", pin.display()), e))
}

/// The kernel id of a program.
pub fn program_id(program: &SchedClassifier) -> Result<u32> {
    program
        .info()
        .map(|i| i.id())
        .map_err(|e| Error::datapath("reading program info", e))
}
