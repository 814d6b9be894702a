//! Test-only fault points: named instants of ADD, DEL and GC where the test build (the
//! `fault-injection` feature, `cargo xtask test`'s `cni-ebpf-fault`) can fail or stop.
//!
//! - `CNI_EBPF_FAIL_AT=<point>`: the operation fails right after that point, so the tests
//!   prove ADD's rollback leaves nothing behind.
//! - `CNI_EBPF_PAUSE_AT=<point>`: the process stops itself (`SIGSTOP`) at that point, so
//!   the crash campaign can SIGKILL it exactly there instead of hoping a random delay
//!   lands in a window of a few microseconds.
//!
//! - `CNI_EBPF_HANG_AT=<point>` and `CNI_EBPF_HANG_WHEN=<file>`: the agent's thread that
//!   passes the point blocks for good once the file exists ([`hang`]), so the tests prove
//!   `/healthz` notices a wedged job.
//!
//! In the binaries runtimes execute (no feature) [`point`] and [`hang`] are empty inline
//! functions.

use crate::error::Result;

/// Every named point, in the order an operation passes them (the crash campaign visits
/// each one; a point listed here that an operation never reaches fails that test).
pub const POINTS: &[&str] = &[
    // ADD
    "load-maps-pinned",
    "ipam-record-written",
    "ipam-addresses-linked",
    "ipam",
    "veth",
    "veth-labelled",
    "host-routes",
    "container",
    "datapath-entries-written",
    "datapath",
    "port-mappings",
    // DEL
    // DEL and GC: a reservation's key is retired (the commit of its release); its address
    // claims are not removed yet
    "ipam-key-retired",
    "del-ipam-released",
    // DEL: the host veth is retired; the pod end still carries CNI_IFNAME
    "del-host-veth-retired",
    // GC
    "gc-ipam-released",
    // DEL and GC: an attachment's endpoint entries are tombstones, their flows not purged
    "teardown-endpoints-marked",
    // DEL and GC: an attachment's datapath entries are gone; its veth, retired (DEL) or
    // deleted (GC) meanwhile on another thread, may or may not be yet
    "teardown-datapath-removed",
    // DEL's finishing process, started: nothing of its work done yet
    "finish-started",
    // DEL's finishing process in a burst of DELs: it waited to share the deletion of the
    // retired veths and is about to unmark the pending deletion and do it
    "finish-veth-deferred",
    // DEL's finishing process: the retired veth is deleted; the flows are not purged, the
    // tombstones still there
    "finish-veth-deleted",
    // DEL's finishing process on a node whose flows are not cheap to walk: it waited to
    // share the purge and is about to unmark the pending purge and do it
    "finish-purge-deferred",
];

/// Passes the fault point `name`: a no-op unless this is the test build and the
/// environment names this point.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn point(_name: &'static str) -> Result<()> {
    Ok(())
}

/// Passes the fault point `name`: fails when `CNI_EBPF_FAIL_AT` names it, stops the
/// process when `CNI_EBPF_PAUSE_AT` names it.
#[cfg(feature = "fault-injection")]
pub fn point(name: &'static str) -> Result<()> {
    debug_assert!(POINTS.contains(&name), "unlisted fault point {name}");
    if std::env::var("CNI_EBPF_PAUSE_AT").is_ok_and(|s| s == name) {
        wait_for_orphaning();
        // The test sees the process stopped and kills it; nothing after this runs.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
    if std::env::var("CNI_EBPF_FAIL_AT").is_ok_and(|s| s == name) {
        return Err(crate::error::Error::Ipam(format!(
            "injected failure after step {name}"
        )));
    }
    Ok(())
}

/// The agent's points where a job's thread may be made to hang (`CNI_EBPF_HANG_AT`).
pub const HANG_POINTS: &[&str] = &[
    "agent-policy-loop",
    "agent-services-loop",
    "agent-nodes-loop",
];

/// Passes the agent's hang point `name`: a no-op unless this is the test build.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn hang(_name: &'static str) {}

/// Passes the agent's hang point `name`: blocks the calling thread for good when
/// `CNI_EBPF_HANG_AT` names it and the file `CNI_EBPF_HANG_WHEN` exists.
#[cfg(feature = "fault-injection")]
pub fn hang(name: &'static str) {
    debug_assert!(HANG_POINTS.contains(&name), "unlisted hang point {name}");
    let armed = std::env::var("CNI_EBPF_HANG_AT").is_ok_and(|s| s == name)
        && std::env::var_os("CNI_EBPF_HANG_WHEN")
            .is_some_and(|f| std::path::Path::new(&f).exists());
    if armed {
        tracing::warn!("fault injection: {name}: hanging");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// A process leading a process group of its own (DEL's finishing process) is continued
/// by the kernel (SIGHUP, then SIGCONT) if it is stopped when its parent exits and the
/// group becomes orphaned. Such a process waits here (at most 10 s) while its parent runs
/// this same executable (the DEL that started it), so its stop lasts until the test ends
/// it.
#[cfg(feature = "fault-injection")]
fn wait_for_orphaning() {
    use std::os::unix::fs::MetadataExt as _;

    use nix::unistd::{getpgrp, getpid, getppid};
    if getpgrp() != getpid() {
        return;
    }
    let parent_is_del = || {
        let ours = std::fs::metadata("/proc/self/exe");
        let parents = std::fs::metadata(format!("/proc/{}/exe", getppid()));
        matches!((ours, parents), (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino())
    };
    let started = std::time::Instant::now();
    while parent_is_del() && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
