//! The socket programs (`sock_connect4`, `sock_sendmsg4`, `sock_recvmsg4`,
//! `sock_getpeername4` and their IPv6 twins `sock_*6`): host ports for the node's own processes, attached once per
//! network to a cgroup2 directory (`cgroupPath`, by default the hierarchy's root) through
//! pinned links, by the first [`Datapath::open_or_load`] that finds them missing.
//!
//! A cgroup holds processes of every network namespace; the programs only translate
//! sockets of the node's namespace, whose cookie [`netns_cookie`] reads for
//! `NodeConfig::netns_cookie`.

use std::{
    fs::File,
    os::fd::{AsRawFd, FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr, CgroupSockAddrAttachType};
use cni_ebpf_common::prog;
// A typed constant: `f_type`'s width and signedness differ between glibc and musl.
use nix::sys::statfs::CGROUP2_SUPER_MAGIC;

use super::{load, Datapath};
use crate::{
    cni::config::CgroupPath,
    error::{Error, Result},
};

/// The socket programs and the hook each goes to.
const SOCKET_PROGS: [(&str, CgroupSockAddrAttachType); 8] = [
    (prog::SOCK_CONNECT4, CgroupSockAddrAttachType::Connect4),
    (prog::SOCK_SENDMSG4, CgroupSockAddrAttachType::UDPSendMsg4),
    (prog::SOCK_RECVMSG4, CgroupSockAddrAttachType::UDPRecvMsg4),
    (
        prog::SOCK_GETPEERNAME4,
        CgroupSockAddrAttachType::GetPeerName4,
    ),
    (prog::SOCK_CONNECT6, CgroupSockAddrAttachType::Connect6),
    (prog::SOCK_SENDMSG6, CgroupSockAddrAttachType::UDPSendMsg6),
    (prog::SOCK_RECVMSG6, CgroupSockAddrAttachType::UDPRecvMsg6),
    (
        prog::SOCK_GETPEERNAME6,
        CgroupSockAddrAttachType::GetPeerName6,
    ),
];

/// The cgroup2 directory `cfg` names, or `None` when the socket hooks are off.
pub fn cgroup_dir(cfg: &CgroupPath) -> Result<Option<PathBuf>> {
    let dir = match cfg {
        CgroupPath::Off => return Ok(None),
        CgroupPath::Dir(d) => d.clone(),
        CgroupPath::Root => cgroup2_root()?,
    };
    let fs = nix::sys::statfs::statfs(&dir)
        .map_err(|e| Error::config("cgroupPath", format!("{}: {e}", dir.display())))?;
    if fs.filesystem_type() != CGROUP2_SUPER_MAGIC {
        return Err(Error::config(
            "cgroupPath",
            format!("{} is not a cgroup2 directory", dir.display()),
        ));
    }
    Ok(Some(dir))
}

/// Where the cgroup2 hierarchy is mounted (`/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` on a hybrid one).
fn cgroup2_root() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")
        .map_err(|e| Error::io("reading /proc/self/mounts", e))?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(dir))
        })
        .min_by_key(|d| d.components().count())
        .ok_or_else(|| {
            Error::config(
                "cgroupPath",
                "no cgroup2 hierarchy is mounted (set cgroupPath to \"\" to run without the \
                 socket hooks: the node's own processes then cannot reach host ports)",
            )
        })
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, read from a
/// socket that is never bound).
pub fn netns_cookie() -> Result<u64> {
    // SAFETY: plain syscall; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::io(
            "opening a socket to read the netns cookie",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor no one else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of the sizes passed.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(Error::io(
            "reading the network namespace cookie (SO_NETNS_COOKIE)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(cookie)
}

impl Datapath {
    /// Attaches the socket programs to the cgroup `cfg` names where their link pins are
    /// missing; returns the netns cookie they act on (`known`, the one already configured,
    /// when every link is there; 0 when they are off).
    pub(super) fn ensure_socket_hooks(&self, cfg: &CgroupPath, known: u64) -> Result<u64> {
        let all_pinned = SOCKET_PROGS
            .iter()
            .all(|(p, _)| self.pins.socket_link(p).exists());
        if *cfg == CgroupPath::Off {
            return Ok(0);
        }
        if all_pinned && known != 0 {
            return Ok(known);
        }
        if !all_pinned {
            if let Some(dir) = cgroup_dir(cfg)? {
                self.attach_socket_programs(&dir)?;
            }
        }
        netns_cookie()
    }

    fn attach_socket_programs(&self, cgroup: &Path) -> Result<()> {
        let _lock = load::LoadLock::acquire(&self.pins)?;
        let dir = File::open(cgroup)
            .map_err(|e| Error::io(format!("opening cgroup {}", cgroup.display()), e))?;
        for (name, attach_type) in SOCKET_PROGS {
            let pin = self.pins.socket_link(name);
            if pin.exists() {
                continue;
            }
            let what = || format!("attaching {name} to cgroup {}", cgroup.display());
            // Once per network and node: `from_pin`'s feature probes do not matter here.
            let mut program = CgroupSockAddr::from_pin(self.pins.prog(name), attach_type)
                .map_err(|e| Error::datapath(what(), e))?;
            // A cgroup link (kernel ≥ 5.7) always shares the hook with other programs;
            // `Single` asks for no flags, which is what BPF_LINK_CREATE takes.
            let id = program
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(|e| Error::datapath(what(), e))?;
            let link = program
                .take_link(id)
                .map_err(|e| Error::datapath(what(), e))?;
            let link = FdLink::try_from(link).map_err(|e| Error::datapath(what(), e))?;
            link.pin(&pin)
                .map_err(|e| Error::datapath(format!("pinning {}", pin.display()), e))?;
        }
        Ok(())
    }
}
