//! Attaching pinned programs to interfaces: a tcx link pinned in bpffs (kernel ≥ 6.6), or
//! a legacy clsact filter where tcx is missing. Attachments survive the plugin process.

use std::{io, path::Path};

use aya::programs::{
    links::{FdLink, LinkError, PinnedLink},
    tc::{self, NlOptions, TcAttachOptions},
    LinkOrder, ProgramError, SchedClassifier, TcAttachType, TcError,
};

use super::load;
use crate::error::{Error, Result};

/// How a program ended up attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// A tcx link, pinned.
    Tcx,
    /// A legacy clsact filter (not pinnable; lives as long as the interface).
    Legacy,
}

fn errno_of(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    }
}

/// Attaches `program` to `ifname` in direction `dir` and pins the tcx link at `pin`.
/// A stale pin at `pin` (left by an interface that is gone) is replaced.
pub fn attach(
    program: &mut SchedClassifier,
    ifname: &str,
    dir: TcAttachType,
    pin: &Path,
) -> Result<AttachMode> {
    // Built only on failure: reading the program's name costs a syscall.
    let context = |program: &SchedClassifier| {
        format!("attaching {} to {ifname} ({dir:?})", program_name(program))
    };
    remove_pin(pin)?;
    // Dropping the last reference of a link (the pin just removed) detaches it
    // asynchronously; until the kernel has, attaching the same program to the same device
    // fails with EEXIST. Wait for it, bounded (50 × 2 ms).
    let mut tries = 0;
    let attached = loop {
        let r = program.attach_with_options(
            ifname,
            dir,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        );
        match &r {
            Err(e) if errno_of(e) == Some(libc::EEXIST) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            _ => break r,
        }
    };
    match attached {
        Ok(id) => {
            let link = program
                .take_link(id)
                .map_err(|e| Error::datapath(context(program), load::program_error(&e)))?;
            let fd_link: FdLink = link
                .try_into()
                .map_err(|e: LinkError| Error::datapath(context(program), load::chain(&e)))?;
            fd_link.pin(pin).map_err(|e| {
                Error::datapath(
                    format!(
                        "{}: pinning the link at {}",
                        context(program),
                        pin.display()
                    ),
                    load::chain(&e),
                )
            })?;
            Ok(AttachMode::Tcx)
        }
        // No tcx in this kernel: fall back to a clsact filter.
        Err(e) if matches!(errno_of(&e), Some(libc::EINVAL | libc::EOPNOTSUPP | 524)) => {
            attach_legacy(program, ifname, dir).map_err(|e2| {
                Error::datapath(
                    context(program),
                    format!(
                        "tcx failed ({}), legacy clsact failed too: {e2}",
                        load::program_error(&e)
                    ),
                )
            })?;
            Ok(AttachMode::Legacy)
        }
        Err(e) => Err(Error::datapath(context(program), load::program_error(&e))),
    }
}

fn attach_legacy(
    program: &mut SchedClassifier,
    ifname: &str,
    dir: TcAttachType,
) -> std::result::Result<(), String> {
    match tc::qdisc_add_clsact(ifname) {
        Ok(()) => {}
        Err(TcError::AlreadyAttached) => {}
        Err(TcError::NetlinkError(e)) if e.to_string().contains("exists") => {}
        Err(e) => return Err(format!("adding clsact: {}", load::chain(&e))),
    }
    let id = program
        .attach_with_options(ifname, dir, TcAttachOptions::Netlink(NlOptions::default()))
        .map_err(|e| load::program_error(&e))?;
    let link = program.take_link(id).map_err(|e| load::program_error(&e))?;
    // The filter must outlive this process: dropping the link would detach it.
    std::mem::forget(link);
    Ok(())
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
pub fn remove_pin(pin: &Path) -> Result<()> {
    match std::fs::remove_file(pin) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing link pin {}", pin.display()), e)),
    }
}

/// The program id a pinned link runs, if the pin exists.
pub fn pinned_link_program(pin: &Path) -> Result<Option<u32>> {
    if !pin.exists() {
        return Ok(None);
    }
    let link = PinnedLink::from_pin(pin).map_err(|e| {
        Error::datapath(
            format!("opening link pin {}", pin.display()),
            load::chain(&e),
        )
    })?;
    let fd: FdLink = link.into();
    let info = fd.info().map_err(|e| {
        Error::datapath(
            format!("reading link pin {}", pin.display()),
            load::chain(&e),
        )
    })?;
    // Dropping `fd` closes our descriptor only; the pin keeps the link.
    Ok(Some(info.program_id()))
}

/// Whether program `prog_id` is attached via tcx to `ifname` in `dir`. `Ok(None)` when the
/// kernel has no tcx (legacy attachments cannot be told apart this way).
pub fn tcx_attached(ifname: &str, dir: TcAttachType, prog_id: u32) -> Result<Option<bool>> {
    match SchedClassifier::query_tcx(ifname, dir) {
        Ok((_, progs)) => Ok(Some(progs.iter().any(|p| p.id() == prog_id))),
        Err(e) if matches!(errno_of(&e), Some(libc::EINVAL | libc::EOPNOTSUPP | 524)) => Ok(None),
        Err(ProgramError::TcError(TcError::IoError(e)))
            if e.raw_os_error() == Some(libc::ENODEV) =>
        {
            Ok(Some(false))
        }
        Err(e) => Err(Error::datapath(
            format!("querying tc programs on {ifname}"),
            load::program_error(&e),
        )),
    }
}

/// The kernel id of a program.
pub fn program_id(program: &SchedClassifier) -> Result<u32> {
    program
        .info()
        .map(|i| i.id())
        .map_err(|e| Error::datapath("reading program info", load::program_error(&e)))
}
