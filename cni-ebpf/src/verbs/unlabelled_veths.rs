//! Host veths that a killed ADD left half-made, and how GC tells them from an ADD that is
//! still running.
//!
//! The kernel takes no alias in the request that creates a veth pair, so for a moment
//! every host veth exists without the alias that names its owner. ADD closes that gap on
//! both sides:
//! - the creating request puts the host end in the network's device group
//!   ([`link::unlabelled_group`]), so an unlabelled pair is recognisably this network's;
//!   labelling it (alias + group 0, one request) ends the state;
//! - from just before the pair is created until it is labelled, ADD holds a shared lock on
//!   `<dataDir>/<network>/veths.lock` ([`InFlight`]). Shared: ADDs never wait for each
//!   other. The kernel drops the lock when the process dies, also by SIGKILL.
//!
//! GC takes that lock exclusively ([`sweep`]): once it has it, no ADD of the network is
//! between creating and labelling a pair, so every unlabelled veth in the network's group
//! was left by an ADD that died there, and GC deletes it (its container end goes with
//! it). The DEL of the same container collects it too (`del.rs`: by name and derived
//! MAC). If GC cannot get the lock within [`SWEEP_WAIT`] (an ADD stuck or stopped in that
//! window), it leaves the sweep to its next run instead of failing.

use std::{
    fs::{File, OpenOptions},
    path::PathBuf,
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};

use crate::{
    cni::config::NetConf,
    error::{Error, Result},
    kernel::link::{self, Nl},
};

/// How long GC waits for ADDs to leave the unlabelled window before skipping the sweep.
pub const SWEEP_WAIT: Duration = Duration::from_secs(2);

fn lock_path(conf: &NetConf) -> PathBuf {
    conf.store_dir().join("veths.lock")
}

fn open_lock(conf: &NetConf) -> Result<File> {
    let path = lock_path(conf);
    let dir = conf.store_dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))
}

/// ADD's shared hold on the network's veth lock while its pair is unlabelled.
#[derive(Debug)]
pub struct InFlight {
    _held: Flock<File>,
}

impl InFlight {
    /// Takes the shared hold (waits only while a GC holds the lock for its sweep).
    pub fn enter(conf: &NetConf) -> Result<Self> {
        let file = open_lock(conf)?;
        let held = Flock::lock(file, FlockArg::LockShared).map_err(|(_, e)| {
            Error::io(
                format!("locking {} (shared)", lock_path(conf).display()),
                std::io::Error::from(e),
            )
        })?;
        Ok(Self { _held: held })
    }
}

/// Deletes the host veths of `conf`'s network that an ADD left unlabelled when it died.
/// Returns their names; an empty list also when the sweep was skipped (see the module
/// comment).
pub fn sweep(conf: &NetConf) -> Result<Vec<String>> {
    let mut file = open_lock(conf)?;
    let started = Instant::now();
    let _held = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => break held,
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if started.elapsed() < SWEEP_WAIT => {
                file = f;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                tracing::warn!(
                    "GC: an ADD of network {} has held a new veth unlabelled for over {:?}; \
                     leaving half-made veths to the next GC",
                    conf.name,
                    SWEEP_WAIT
                );
                return Ok(Vec::new());
            }
            Err((_, e)) => {
                return Err(Error::io(
                    format!("locking {}", lock_path(conf).display()),
                    std::io::Error::from(e),
                ))
            }
        }
    };
    let group = link::unlabelled_group(&conf.name);
    link::runtime()?.block_on(async {
        let node = Nl::connect()?;
        let mut removed = Vec::new();
        for l in node.unlabelled_veths(group).await? {
            tracing::warn!(
                "GC: deleting {}: a host veth of network {} that its ADD never labelled",
                l.name,
                conf.name
            );
            node.del_link(l.index).await?;
            removed.push(l.name);
        }
        Ok(removed)
    })
}
