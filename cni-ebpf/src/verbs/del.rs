//! DEL: idempotent and best-effort. Works with no netns, a vanished netns, no
//! `prevResult` and an unknown container; keeps going past a failed step and reports every
//! failure at the end. Touches only state that names this (container ID, ifname).
//!
//! DEL returns once the pod is gone for everyone else, and leaves the slow rest to a
//! process of its own ([`FinishJob`], run as `cni-ebpf finish-del`):
//! - before it returns: the addresses are released; the pod's endpoint entries are
//!   tombstones, its host ports and counters are gone, so no packet reaches it or leaves
//!   it through the datapath; and its host veth is *retired*: down, which removes the
//!   routes through it and takes the carrier from the pod's end, and in the network's
//!   [`link::retired_group`];
//! - after: the veth pair is deleted (the kernel waits out RCU grace periods in that
//!   request, ≈ 20 ms here, however little else there is to do, and holds the RTNL lock
//!   every ADD and DEL needs for part of it, so in a burst of DELs they share one
//!   deletion: [`delete_retired_veths`]), then the flows of its addresses are purged and
//!   their tombstones dropped (a walk of the NAT table: the bulk of a DEL on a node with
//!   many open connections, so there the DELs of a moment share one walk:
//!   [`purge_flows`]).
//!
//! Every guarantee holds while the rest is pending, and after a kill -9 of either process
//! at any instant: an ADD that gets one of the addresses finds its tombstone and purges
//! its flows itself (under the flows lock, so never while the finishing process is
//! purging them); an ADD into the same namespace and interface deletes the retired pair
//! first; GC deletes every retired veth of the network and forgets attachments that are
//! not valid; and DEL again does it all again. While finishing processes run, each holds a
//! shared lock on `<dataDir>/<network>/teardowns.lock` (taken by DEL before it starts one),
//! so whoever needs the node settled takes it exclusively ([`settled`]).

use std::{
    collections::BTreeSet,
    fs::File,
    net::IpAddr,
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::{Error, Result},
    ipam,
    kernel::link::{self, Nl},
    kernel::netns::Netns,
};

/// Runs DEL.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let mut errors = Vec::new();
    let (cid, ifname) = (env.container_id.as_str(), env.ifname.as_str());
    let host_ifname = link::host_veth_name(cid, ifname);
    let mut rest = FinishJob {
        network: conf.name.clone(),
        network_dir: conf.pin_dir(),
        store_dir: conf.store_dir(),
        container_id: cid.to_owned(),
        ifname: ifname.to_owned(),
        datapath: false,
        addrs: Vec::new(),
        ifindexes: BTreeSet::new(),
        veth: None,
        log_file: conf.log_file.clone(),
        log_level: conf.log_level.clone(),
    };
    std::thread::scope(|s| {
        // Netlink on a thread of its own (it starts in the caller's network namespace, the
        // node's) while the IPAM store and the maps are worked on here.
        let (netns, host) = (env.netns.as_deref(), host_ifname.as_str());
        let retiring = s.spawn(move || retire_host_veth_of(&conf.name, cid, ifname, host, netns));
        // 1. Release the addresses first: whatever else fails, they are not leaked.
        let mut ips = ipam::del(conf, env, stdin).unwrap_or_else(|e| {
            errors.push(e);
            Vec::new()
        });
        if let Err(e) = crate::faults::point("del-ipam-released") {
            errors.push(e);
        }
        // With a delegated IPAM the addresses are only known from prevResult.
        if let Some(prev) = &conf.prev_result {
            for ip in &prev.ips {
                if !ips.contains(&ip.address.addr()) {
                    ips.push(ip.address.addr());
                }
            }
        }
        // 2. Datapath entries and host ports.
        match Datapath::open(conf) {
            Ok(Some(dp)) => {
                let taken = dp.take_pod(cid, ifname, &host_ifname, &ips, &mut errors);
                rest.addrs = taken.addrs;
                rest.ifindexes = taken.ifindexes;
                rest.datapath = true;
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        if let Err(e) = crate::faults::point("teardown-datapath-removed") {
            errors.push(e);
        }
        match retiring.join() {
            Ok(Ok(veth)) => rest.veth = veth,
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(Error::netlink("retiring the host veth", "thread panicked")),
        }
    });
    if rest.datapath || rest.veth.is_some() {
        if let Err(e) = rest.hand_over() {
            errors.push(e);
        }
    }
    Error::from_list(errors)
}

/// What DEL leaves to its finishing process: the flow state of the pod's addresses and
/// its owner record (when the datapath is loaded), and its retired host veth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinishJob {
    /// The network's name.
    pub network: String,
    /// The network's pin directory (`<bpffsRoot>/<network>`).
    pub network_dir: PathBuf,
    /// The network's IPAM store directory (`<dataDir>/<network>`): `teardowns.lock` and
    /// the flows purge's record ([`purge_flows`]).
    pub store_dir: PathBuf,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// Whether the datapath was loaded (then the owner record is dropped too).
    pub datapath: bool,
    /// The addresses DEL took from the datapath (their entries are tombstones), for the
    /// log.
    pub addrs: Vec<IpAddr>,
    /// The host interfaces the pod's endpoint entries named ([`release_what_is_left`]).
    pub ifindexes: BTreeSet<u32>,
    /// The retired host veth: ifindex and name.
    pub veth: Option<(u32, String)>,
    /// `logFile`.
    pub log_file: Option<PathBuf>,
    /// `logLevel`.
    pub log_level: String,
}

/// The nice value of a finishing process.
const FINISH_NICE: libc::c_int = 10;

/// How long [`settled`] waits for finishing processes.
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

impl FinishJob {
    /// Starts `cni-ebpf finish-del` on this, not waited for, holding a shared lock on the
    /// network's `teardowns.lock` (below `store_dir`) until it exits. Where it cannot be
    /// started, does the rest here.
    fn hand_over(&self) -> Result<()> {
        let held = lock_teardowns(&self.store_dir, libc::LOCK_SH)?;
        let job = serde_json::to_string(self)
            .map_err(|e| Error::io("encoding the rest of DEL", std::io::Error::other(e)))?;
        // The started process inherits the locked descriptor: the lock is held from here
        // until it exits (also by SIGKILL), with no gap for a waiter to slip through.
        nix::fcntl::fcntl(
            &held,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::io("passing on the teardowns lock", e.into()))?;
        // Our own binary (also when a newer one has been installed over it since), out of
        // the runtime's process group, with none of the runtime's descriptors: it must not
        // hold the pipe the runtime reads our result from.
        let started = Command::new("/proc/self/exe")
            .arg("finish-del")
            .arg(&job)
            .env_remove("CNI_COMMAND")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        drop(held);
        match started {
            // Not waited for: it is reparented (and reaped) when this process exits.
            Ok(_child) => Ok(()),
            Err(e) => {
                tracing::warn!("cannot start the rest of DEL ({e}); finishing it here");
                self.finish(Batch::AtOnce)
            }
        }
    }

    /// Does the rest: deletes the retired veth ([`delete_retired_veths`]), then purges the
    /// flows and drops the tombstones and the owner record ([`purge_flows`]); each may wait
    /// to be shared with the DELs of the next moment when `batch` allows it. Idempotent.
    fn finish(&self, batch: Batch) -> Result<()> {
        let mut errors = Vec::new();
        if let Err(e) = crate::faults::point("finish-started") {
            errors.push(e);
        }
        if self.veth.is_some() {
            if let Err(e) = delete_retired_veths(self, batch) {
                errors.push(e);
            }
        }
        if let Err(e) = crate::faults::point("finish-veth-deleted") {
            errors.push(e);
        }
        if self.datapath {
            match Datapath::open_at(&self.network_dir) {
                Ok(Some(dp)) => {
                    if let Err(e) = release_what_is_left(&dp, self) {
                        errors.push(e);
                    }
                    if let Err(e) = purge_flows(&dp, self, batch) {
                        errors.push(e);
                    }
                }
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        Error::from_list(errors)
    }

    /// `cni-ebpf finish-del <job>`: the finishing process.
    pub fn run(job: &str) -> Result<()> {
        let this: Self = serde_json::from_str(job)
            .map_err(|e| Error::io("reading the rest of DEL", std::io::Error::other(e)))?;
        // No rotation here: the next verb rotates, never two processes at once.
        let rotation = crate::logging::Rotation {
            max_bytes: 0,
            backups: 0,
        };
        crate::logging::init(&this.log_level, this.log_file.as_deref(), rotation);
        // It outlives DEL, whose exit orphans its process group: a hangup sent to that
        // group must not end it halfway.
        // SAFETY: SIG_IGN installs no handler; nothing runs on a hangup.
        if let Err(e) = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGHUP,
                nix::sys::signal::SigHandler::SigIgn,
            )
        } {
            tracing::debug!("cannot ignore hangups: {e}");
        }
        // Background work: it yields the CPU to the verbs a runtime is waiting for (on a
        // busy node its purge walks tens of thousands of NAT entries). Not idle-only: an
        // ADD given one of its addresses waits for its purge.
        // SAFETY: plain syscall on this process.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, FINISH_NICE) } != 0 {
            tracing::debug!(
                "cannot lower the finishing process's priority: {}",
                std::io::Error::last_os_error()
            );
        }
        let out = this.finish(Batch::MayWait);
        match &out {
            Ok(()) => tracing::debug!(
                container = %this.container_id,
                "DEL finished: veth {1:?} deleted, flows of {0:?} purged or left to a pending \
                 purge",
                this.addrs,
                this.veth
            ),
            Err(e) => {
                tracing::warn!(container = %this.container_id, "finishing DEL failed: {e}")
            }
        }
        out
    }
}

/// Whether [`delete_retired_veths`] and [`purge_flows`] may wait for the DELs of the next
/// moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// A finishing process of its own: nothing waits for it.
    MayWait,
    /// DEL itself, which its runtime waits for.
    AtOnce,
}

/// What is left of the pod's host interfaces after DEL, each a walk of a map as large as
/// the node's pod count (which DEL leaves to this process): the pod namespaces recorded
/// for them (an entry of a namespace nobody else has recorded matches no socket once the
/// pod is gone, but holds a slot), and the policy entries of the attachment on an
/// interface that no longer exists (left by an ADD killed before an ADD that replaced its
/// pair; DEL removed those on the interfaces its address entries named). An interface
/// that exists may be a new ADD's of the same attachment, whose entries are written before
/// its addresses': those stay.
fn release_what_is_left(dp: &Datapath, job: &FinishJob) -> Result<()> {
    dp.forget_pod_netns(&job.ifindexes)?;
    let owner = cni_ebpf_common::owner_id(job.container_id.as_bytes(), job.ifname.as_bytes());
    let left = dp.policy_interfaces_of(owner)?;
    if left.is_empty() {
        return Ok(());
    }
    let gone = link::runtime()?.block_on(async {
        let node = Nl::connect()?;
        let mut gone = BTreeSet::new();
        for &i in &left {
            if node.link_by_index(i).await?.is_none() {
                gone.insert(i);
            }
        }
        Ok::<_, Error>(gone)
    })?;
    dp.remove_policy_endpoints_on(owner, &gone)
}

/// A DEL whose finishing process finds retired veths deleted less than this long ago is
/// one of a burst (a rollout, a drain, a job's pods ending together).
const VETH_BURST: Duration = Duration::from_secs(1);

/// How long a finishing process in a burst waits before deleting the retired veths, so
/// that the DELs of that moment share one deletion.
const VETH_DELAY: Duration = Duration::from_millis(100);

/// Deletes the network's retired veths ([`link::retired_group`]): the one of this DEL and
/// any other retired by then, in one request ([`Nl::del_group`]).
///
/// The kernel deletes veth pairs under the RTNL lock, and every request pays the same fixed
/// costs there however many it deletes: it flushes each CPU's backlog and waits out two
/// RCU grace periods. Meanwhile every ADD and DEL on the node, and the node's own link
/// changes, wait for the lock. So in a burst (the last deletion less than [`VETH_BURST`]
/// ago, the mtime of `<store_dir>/veths-delete`), the first finishing process marks a
/// deletion pending (an exclusive lock on that file), waits [`VETH_DELAY`], unmarks it and
/// deletes the group; a finishing process that finds a deletion pending leaves its veth to
/// it. Its veth was retired before it looked, and the pending one deletes only after it
/// unmarked, so it finds every veth of a DEL that saw the mark.
///
/// A retired veth is down, carries no route and belongs to no pod, so the wait keeps every
/// guarantee; killed -9 while waiting, the finishing process leaves the retired veths to
/// the next DEL's deletion, an ADD into the same namespace, or GC.
fn delete_retired_veths(job: &FinishJob, batch: Batch) -> Result<()> {
    let record = job.store_dir.join("veths-delete");
    let in_burst = std::fs::metadata(&record)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|since| since < VETH_BURST);
    if batch == Batch::MayWait
        && in_burst
        && !wait_unless_pending(&record, VETH_DELAY, "finish-veth-deferred")?
    {
        tracing::debug!("a deletion is pending; it takes this DEL's veth too");
        return Ok(());
    }
    let group = link::retired_group(&job.network);
    link::runtime()?.block_on(async { Nl::connect()?.del_group(group).await })?;
    // Its mtime is the time of the last deletion.
    let recorded = open_lock_file(&record).and_then(|f| {
        f.set_modified(SystemTime::now())
            .map_err(|e| Error::io(format!("setting the time of {}", record.display()), e))
    });
    if let Err(e) = recorded {
        tracing::debug!("cannot record the deletion: {e}");
    }
    Ok(())
}

/// NAT entries below which a walk of the tables costs about a millisecond: the flows are
/// then purged at once.
const PURGE_AT_ONCE_BELOW: usize = 4096;

/// How long a finishing process waits before a purge that is not cheap, so that the DELs
/// of that moment share one walk.
const PURGE_DELAY: Duration = Duration::from_secs(1);

/// The purge after a DEL: the flow state of every tombstoned address, the tombstones and
/// the owner records ([`Datapath::purge_removed`]).
///
/// Each purge is a walk of the whole NAT table. On a node with tens of thousands of flows
/// that walk costs tens of milliseconds, and one per DEL slowed the verbs around it by
/// half. So where the table is not cheap to walk ([`walk_is_costly`]), the first
/// finishing process marks a purge pending (an exclusive lock on `<store_dir>/flows-purge`,
/// which holds the last walk's size), waits [`PURGE_DELAY`], unmarks it, and purges every
/// tombstone there is then; a finishing process that finds a purge pending leaves its
/// tombstones to it. The pending one lists the tombstones only after it unmarked, so it
/// finds every tombstone of a DEL that saw the mark; a DEL after that starts its own.
///
/// Meanwhile the tombstones keep every guarantee (`flows.rs`): nothing opens a flow for
/// their addresses, and an ADD given one of them purges its flows first. A kill -9 of the
/// waiting process leaves them to the next DEL's purge, an ADD of the address, or GC.
fn purge_flows(dp: &Datapath, job: &FinishJob, batch: Batch) -> Result<()> {
    let record = job.store_dir.join("flows-purge");
    if batch == Batch::MayWait
        && walk_is_costly(dp, &record)?
        && !wait_unless_pending(&record, PURGE_DELAY, "finish-purge-deferred")?
    {
        tracing::debug!("a purge is pending; it takes this DEL's tombstones too");
        return dp.drop_owner_record(&job.container_id, &job.ifname);
    }
    dp.purge_removed(|read| {
        // In place: the file's lock is the pending mark, and stays with its inode.
        if let Err(e) = std::fs::write(&record, read.to_string()) {
            tracing::debug!(
                "cannot record the purge's size in {}: {e}",
                record.display()
            );
        }
    })?;
    dp.drop_owner_record(&job.container_id, &job.ifname)
}

/// Whether a purge's walk of the NAT tables costs more than about a millisecond: the last
/// walk (its size in `record`, written before the walk's lock is released) or the
/// entries the pods' accounts tell of now ([`Datapath::accounted_nat_entries`]) reach
/// [`PURGE_AT_ONCE_BELOW`], or a walk is running (the DELs that come during a walk of a
/// table that has grown since the last would otherwise queue behind it for a full walk
/// each).
fn walk_is_costly(dp: &Datapath, record: &Path) -> Result<bool> {
    let last_walk: Option<usize> = std::fs::read_to_string(record)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok(last_walk.is_some_and(|n| n >= PURGE_AT_ONCE_BELOW)
        || dp.purge_running()?
        || dp.accounted_nat_entries()? >= PURGE_AT_ONCE_BELOW)
}

/// The mark of work the finishing processes of a moment share (a veth deletion, a purge):
/// an exclusive lock on `record`. When no other process holds it, takes it, waits `delay`
/// (passing fault point `point` at its end) and unmarks it (closes the only descriptor of
/// the lock) before it returns `true`: the caller then does the work, and finds everything
/// of every process that saw the mark. `false`: another process holds the mark and does
/// the work for this one too.
fn wait_unless_pending(record: &Path, delay: Duration, point: &'static str) -> Result<bool> {
    let pending = open_lock_file(record)?;
    match flock(&pending, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => {
            std::thread::sleep(delay);
            crate::faults::point(point)?;
            drop(pending);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(Error::io(format!("locking {}", record.display()), e)),
    }
}

/// `<store_dir>/teardowns.lock`, locked as `how` asks (`LOCK_SH` or `LOCK_EX`, with
/// `LOCK_NB` or not). The lock belongs to the open file, so it lasts while any process
/// holds a descriptor of it (closing one copy releases nothing; a `Flock` guard would
/// unlock it for every copy when dropped).
fn lock_teardowns(store_dir: &Path, how: libc::c_int) -> Result<File> {
    let path = store_dir.join("teardowns.lock");
    std::fs::create_dir_all(store_dir)
        .map_err(|e| Error::io(format!("creating {}", store_dir.display()), e))?;
    let file = open_lock_file(&path)?;
    flock(&file, how).map_err(|e| Error::io(format!("locking {}", path.display()), e))?;
    Ok(file)
}

/// `flock(2)` on `file` as `how` asks, retried when a signal interrupts it.
fn flock(file: &File, how: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Opens `path` (created if missing, its content kept) to take a `flock` on it.
fn open_lock_file(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))
}

/// Waits until no DEL of the network (IPAM store `store_dir`) has a finishing process
/// left, at most `wait`; whether it got there.
pub fn settled(store_dir: &Path, wait: Duration) -> Result<bool> {
    let started = Instant::now();
    loop {
        match lock_teardowns(store_dir, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(_) => return Ok(true),
            Err(_) if started.elapsed() < wait => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => return Ok(false),
        }
    }
}

/// Retires the host veth of (container ID, ifname) ([`Nl::retire_host_veth`]) when it is
/// that attachment's (as [`delete_host_veth_of`] decides); returns its ifindex and name.
fn retire_host_veth_of(
    network: &str,
    container_id: &str,
    ifname: &str,
    host_ifname: &str,
    netns: Option<&Path>,
) -> Result<Option<(u32, String)>> {
    let rt = link::runtime()?;
    rt.block_on(async {
        let node = Nl::connect()?;
        let Some(l) = node.link_by_name(host_ifname).await? else {
            return Ok(None);
        };
        if !owned(&node, &l, network, container_id, ifname).await? {
            return Ok(None);
        }
        node.retire_host_veth(l.index, link::retired_group(network))
            .await?;
        crate::faults::point("del-host-veth-retired")?;
        // The spec's DEL removes CNI_IFNAME from the container: the pair's deletion waits
        // for the finishing process, so its pod end steps out of the way now. Without the
        // pod's namespace (gone, or CNI_NETNS empty) there is no container to clear.
        if let Some(ns) = netns
            .filter(|p| !p.as_os_str().is_empty())
            .and_then(|p| Netns::open(p).ok())
        {
            let pod = Nl::connect_in(&ns)?;
            let (group, name) = (
                link::retired_group(network),
                link::retired_pod_end_name(container_id, ifname),
            );
            pod.retire_pod_end(&l, ifname, group, &name).await?;
        }
        Ok(Some((l.index, l.name)))
    })
}

/// Whether host veth `l` is the one of (container ID, ifname): its alias names the
/// attachment, or it has no alias and the MAC ADD derives for it (a killed ADD's
/// half-made pair).
async fn owned(
    node: &Nl,
    l: &link::Link,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<bool> {
    let want = link::host_veth_alias(network, container_id, ifname);
    Ok(match node.alias(l.index).await? {
        Some(alias) if alias == want => true,
        // No alias yet: an ADD of this attachment killed between creating the pair and
        // labelling it (the kernel takes no alias in the creating request). Ownership is
        // proven by what the creating request did set: both the name and the MAC are
        // derived from (container ID, ifname); a foreign link that merely took the name
        // has another MAC. (The runtime never runs ADD and DEL of one container at once,
        // so this is no ADD in progress.)
        None if link::is_pod_pair_end(l)
            && l.mac == link::derived_mac(container_id, ifname, "host") =>
        {
            tracing::warn!(
                "{}: unlabelled, left by an interrupted ADD of {container_id}/{ifname}",
                l.name
            );
            true
        }
        other => {
            tracing::warn!(
                "not removing {}: its alias {other:?} does not name {container_id}/{ifname}",
                l.name
            );
            false
        }
    })
}

/// Removes the datapath entries, host ports and host veth of (container ID, ifname),
/// collecting failures in `errors` and carrying on (GC), all of it before it returns.
pub fn teardown(
    conf: &NetConf,
    dp: Option<&Datapath>,
    container_id: &str,
    ifname: &str,
    ips: &[IpAddr],
    errors: &mut Vec<Error>,
) {
    while_deleting_veth(conf, container_id, ifname, errors, |errors| {
        if let Some(dp) = dp {
            let host_ifname = link::host_veth_name(container_id, ifname);
            dp.remove_pod(container_id, ifname, &host_ifname, ips, errors);
        }
    });
}

/// Runs `work` while the host veth of (container ID, ifname) is deleted on a thread of its
/// own, and returns when both are done, every failure in `errors` (GC's teardown).
///
/// `work` (the datapath entries) touches only maps and bpffs, never rtnl, so nothing in it
/// waits for the deletion. Each part is idempotent, so a GC killed at any instant leaves
/// the next one as much to do: the crash campaign kills GC at `teardown-datapath-removed`
/// with the veth either deleted or not. (A new thread starts in the caller's network
/// namespace: the node's.)
fn while_deleting_veth(
    conf: &NetConf,
    container_id: &str,
    ifname: &str,
    errors: &mut Vec<Error>,
    work: impl FnOnce(&mut Vec<Error>),
) {
    let host_ifname = link::host_veth_name(container_id, ifname);
    let veth = std::thread::scope(|s| {
        let deleting =
            s.spawn(|| delete_host_veth_of(&conf.name, container_id, ifname, &host_ifname));
        work(errors);
        if let Err(e) = crate::faults::point("teardown-datapath-removed") {
            errors.push(e);
        }
        deleting
            .join()
            .unwrap_or_else(|_| Err(Error::netlink("deleting the host veth", "thread panicked")))
    });
    if let Err(e) = veth {
        errors.push(e);
    }
}

/// Deletes the host veth of (container ID, ifname) when it is that attachment's
/// ([`owned`]).
fn delete_host_veth_of(
    network: &str,
    container_id: &str,
    ifname: &str,
    host_ifname: &str,
) -> Result<()> {
    let rt = link::runtime()?;
    rt.block_on(async {
        let node = Nl::connect()?;
        let Some(l) = node.link_by_name(host_ifname).await? else {
            return Ok(());
        };
        if owned(&node, &l, network, container_id, ifname).await? {
            node.del_link(l.index).await?;
        }
        Ok(())
    })
}
