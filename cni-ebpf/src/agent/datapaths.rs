//! Datapaths appearing on the node. The agent's jobs act on a network as soon as its
//! first ADD has loaded it — a fresh node, a boot, a purge — not at their next periodic
//! check: a node whose tunnel entries waited for the Node watcher's interval cut its first
//! pods off from every other node for up to that long.
//!
//! An inotify watch on the bpffs root (or, until the plugin makes the root, on its parent)
//! sees a network's directory come and go. A network that appears (also one already there
//! when the watch on the root is made: the root may appear together with its first
//! network) is looked at every [`POLL`] until its datapath is complete (an ADD loads it
//! within a few seconds; [`WAIT`] at most), then every subscriber is woken; one that goes
//! wakes them at once.
//! The subscribers hold a [`tokio::sync::watch::Receiver`] whose value counts the changes.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::watch;

use crate::{
    datapath::Datapath,
    error::{Error, Result},
};

/// How often an appearing network is looked at until its datapath is complete.
const POLL: Duration = Duration::from_millis(50);
/// How long an appearing network is waited for.
const WAIT: Duration = Duration::from_secs(30);

/// Starts watching `root` on a thread of its own; the receiver's value grows by one each
/// time a network below it became complete or went away.
///
/// # Errors
/// The inotify instance or the thread could not be made.
pub fn watch(root: &Path) -> Result<watch::Receiver<u64>> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)
        .map_err(|e| Error::io("making an inotify instance for the bpffs root", e.into()))?;
    let (tx, rx) = watch::channel(0);
    let root = root.to_owned();
    std::thread::Builder::new()
        .name("datapaths".into())
        .spawn(move || run(&inotify, &root, &tx))
        .map_err(|e| Error::io("starting the datapath watcher thread", e))?;
    Ok(rx)
}

/// What the watch is on: the root itself, or its parent until the root exists.
#[derive(PartialEq, Eq)]
enum On {
    Root,
    Parent,
}

fn run(inotify: &Inotify, root: &Path, tx: &watch::Sender<u64>) {
    let name: OsString = root.file_name().map(ToOwned::to_owned).unwrap_or_default();
    let parent = root
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_owned);
    let dirs = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR;
    loop {
        let on = if inotify.add_watch(root, dirs).is_ok() {
            On::Root
        } else if inotify
            .add_watch(
                &parent,
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ONLYDIR,
            )
            .is_ok()
        {
            On::Parent
        } else {
            // Neither there yet (a node without bpffs mounted): look again later.
            std::thread::sleep(WAIT);
            continue;
        };
        if on == On::Root {
            // Networks made before the watch was (the root may have appeared together
            // with its first network): each is looked at once it is complete.
            for dir in crate::datapath::load::network_dirs(root).unwrap_or_default() {
                wait_complete(&root.join(dir));
            }
            tx.send_modify(|n| *n += 1);
        }
        // Until the root goes (then the watch on it ends and it is added again).
        'events: loop {
            let Ok(events) = inotify.read_events() else {
                std::thread::sleep(POLL);
                continue;
            };
            for e in events {
                if on == On::Parent {
                    if e.name.as_deref() == Some(name.as_os_str()) {
                        // The root appeared: watch it instead, and look at what it holds.
                        let _ = inotify.rm_watch(e.wd);
                        break 'events;
                    }
                    continue;
                }
                if e.mask.contains(AddWatchFlags::IN_DELETE_SELF)
                    || e.mask.contains(AddWatchFlags::IN_IGNORED)
                {
                    tx.send_modify(|n| *n += 1);
                    break 'events;
                }
                let Some(network) = e.name else {
                    continue;
                };
                if e.mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                {
                    wait_complete(&root.join(&network));
                }
                tx.send_modify(|n| *n += 1);
            }
        }
    }
}

/// Waits (at most [`WAIT`]) until the datapath at `dir` is completely loaded and its node
/// configuration written (its uplink, and its tunnel device in a tunnel mode: the last
/// step of the ADD that loads it).
fn wait_complete(dir: &Path) {
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        let configured = Datapath::open_at(dir)
            .ok()
            .flatten()
            .and_then(|dp| dp.node_config_view().ok())
            .is_some_and(|c| c.uplink_ifindex != 0);
        if configured {
            return;
        }
        std::thread::sleep(POLL);
    }
}
