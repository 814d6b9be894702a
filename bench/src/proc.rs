//! Running programs for the bench: inside a network namespace (started from a thread that
//! entered it, so only the network namespace changes and `/sys/fs/bpf` stays visible), in
//! their own process group (a Ctrl-C reaches only xtask, which then stops cleanly), bounded
//! in time, and reaped with `wait4` so the child's resource use (peak RSS, CPU time, page
//! faults) comes with its exit.
//!
//! stdin, stdout and stderr are anonymous memory files rather than pipes: no reader threads
//! run while a child is timed, and a chatty child can never block on a full pipe.

use std::{
    ffi::OsStr,
    fs::File,
    io::{Read, Seek, SeekFrom, Write},
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::process::CommandExt,
    },
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use nix::sched::{setns, CloneFlags};

/// Set by SIGINT/SIGTERM; every loop of the bench checks it and stops early so that the
/// cleanup guards run.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT/SIGTERM handler that sets [`interrupted`].
pub fn install_signal_handler() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }.context("installing the signal handler")?;
    }
    Ok(())
}

/// Whether the bench was asked to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails when the bench was asked to stop (call between steps of a loop).
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted: stopping and cleaning up");
    }
    Ok(())
}

/// An anonymous in-memory file.
fn memfd(name: &str) -> Result<File> {
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: a valid NUL-terminated name; the returned descriptor is owned by the File.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// What a finished program left.
#[derive(Debug, Clone)]
pub struct Exec {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Whether it was killed for outliving its timeout.
    pub timed_out: bool,
    /// From just before spawn until its exit was seen.
    pub wall: Duration,
    /// `ru_maxrss` from `wait4`, KiB: the peak RSS of the child (and of the waited-for
    /// children it had).
    pub maxrss_kib: u64,
    /// CPU time, user and system (`ru_utime` + `ru_stime`).
    pub cpu: Duration,
    /// Page faults, minor and major (`ru_minflt` + `ru_majflt`).
    pub faults: u64,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Exec {
    /// Exit 0 in time.
    pub fn ok(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// How it failed, for messages: `timed out` or `exit <code>`.
    pub fn failure(&self) -> String {
        if self.timed_out {
            "timed out".to_owned()
        } else {
            format!("exit {:?}", self.code)
        }
    }
}

/// A program to run.
pub struct Spec<'a> {
    /// argv.
    pub argv: Vec<&'a OsStr>,
    /// Extra environment.
    pub env: Vec<(&'a str, &'a OsStr)>,
    /// Network namespace to run in.
    pub netns: Option<&'a Path>,
    /// Bytes on stdin.
    pub stdin: &'a [u8],
    /// Bound on its run time.
    pub timeout: Duration,
}

fn command(spec: &Spec<'_>) -> Result<Command> {
    let Some((prog, args)) = spec.argv.split_first() else {
        bail!("empty argv");
    };
    let mut cmd = Command::new(prog);
    cmd.args(args).process_group(0);
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Starts `cmd` in `netns` (or here) and returns it with the instant just before the start.
///
/// The child is started the way container runtimes start plugins: by `posix_spawn` (a
/// `vfork`-style clone that shares the parent's memory until the exec; Go's runtime does
/// the same), from a thread that has entered `netns`: a new process starts in its
/// creating thread's network namespace. A `fork` with a `pre_exec` hook instead would
/// copy the bench's page tables for every plugin it times, a cost no runtime pays.
fn start(mut cmd: Command, netns: Option<&Path>) -> Result<(Child, Instant)> {
    let Some(ns) = netns else {
        let started = Instant::now();
        return Ok((cmd.spawn()?, started));
    };
    let fd = File::open(ns).with_context(|| format!("opening {}", ns.display()))?;
    std::thread::scope(|s| {
        s.spawn(move || -> Result<(Child, Instant)> {
            setns(&fd, CloneFlags::CLONE_NEWNET).context("entering the network namespace")?;
            let started = Instant::now();
            Ok((cmd.spawn()?, started))
        })
        .join()
        .unwrap_or_else(|_| bail!("the spawning thread panicked"))
    })
    .with_context(|| format!("in {}", ns.display()))
}

/// Waits for `child` at most `timeout` (pidfd + poll), killing it through the pidfd if it
/// takes longer; then reaps it with `wait4`. Returns (wait status, rusage, timed out).
fn wait_bounded(child: &Child, timeout: Duration) -> Result<(i32, libc::rusage, bool)> {
    let pid = i32::try_from(child.id()).context("pid")?;
    // SAFETY: plain syscall; a negative return is an error.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error()).context("pidfd_open");
    }
    let pidfd = i32::try_from(pidfd).context("pidfd")?;
    // SAFETY: owned from here on, closed on drop.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let timed_out = !readable_by(pidfd.as_raw_fd(), Instant::now() + timeout);
    if timed_out {
        // Kill exactly this child (the pidfd cannot name a recycled pid).
        // SAFETY: plain syscall on our pidfd.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid value for the out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid out-pointers; pid is our unreaped child.
        let r = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("wait4");
        }
    }
    Ok((status, usage, timed_out))
}

fn timeval(t: libc::timeval) -> Duration {
    Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
        + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
}

fn read_all(mut f: File) -> String {
    let mut s = String::new();
    let _ = f.seek(SeekFrom::Start(0));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    s.push_str(&String::from_utf8_lossy(&buf));
    s
}

/// Runs `spec` to completion (bounded), timing it and collecting its peak RSS.
pub fn exec(spec: &Spec<'_>) -> Result<Exec> {
    let mut cmd = command(spec)?;
    let mut stdin = memfd("stdin")?;
    stdin.write_all(spec.stdin)?;
    stdin.seek(SeekFrom::Start(0))?;
    let stdout = memfd("stdout")?;
    let stderr = memfd("stderr")?;
    cmd.stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout.try_clone()?))
        .stderr(Stdio::from(stderr.try_clone()?));
    let (child, started) =
        start(cmd, spec.netns).with_context(|| format!("starting {:?}", spec.argv))?;
    let (status, usage, timed_out) = wait_bounded(&child, spec.timeout)?;
    let wall = started.elapsed();
    // Dropping the std Child after wait4 is fine: it does not wait or kill on drop.
    drop(child);
    let code = if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    };
    Ok(Exec {
        code,
        timed_out,
        wall,
        maxrss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        cpu: timeval(usage.ru_utime) + timeval(usage.ru_stime),
        faults: u64::try_from(usage.ru_minflt.saturating_add(usage.ru_majflt)).unwrap_or(0),
        stdout: read_all(stdout),
        stderr: read_all(stderr),
    })
}

/// Runs `argv` in `netns` (or here), failing with its output unless it exits 0.
pub fn run_in(netns: Option<&Path>, argv: &[&str], timeout: Duration) -> Result<String> {
    let spec = Spec {
        argv: argv.iter().map(OsStr::new).collect(),
        env: Vec::new(),
        netns,
        stdin: b"",
        timeout,
    };
    let out = exec(&spec)?;
    if !out.ok() {
        bail!(
            "{argv:?} failed ({}): {}{}",
            out.failure(),
            out.stdout.trim(),
            out.stderr.trim()
        );
    }
    Ok(out.stdout)
}

/// A long-running program we started (a server); killed by its PID and reaped on drop.
pub struct Background {
    child: Child,
    what: String,
}

impl Background {
    /// Starts `argv` in `netns` with stdio discarded.
    pub fn spawn(netns: &Path, argv: &[&str]) -> Result<Self> {
        let argv_os: Vec<&OsStr> = argv.iter().map(OsStr::new).collect();
        let child = spawn_in(
            netns,
            &argv_os,
            [Stdio::null(), Stdio::null(), Stdio::null()],
        )?;
        Ok(Self {
            child,
            what: argv.join(" "),
        })
    }

    /// Starts `argv` in `netns` with stdin discarded and stdout and stderr appended to
    /// `log` (a long-running component whose log explains a failure: the agent).
    pub fn spawn_logged(netns: &Path, argv: &[&str], log: &Path) -> Result<Self> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .with_context(|| format!("opening {}", log.display()))
        };
        let argv_os: Vec<&OsStr> = argv.iter().map(OsStr::new).collect();
        let child = spawn_in(
            netns,
            &argv_os,
            [Stdio::null(), Stdio::from(open()?), Stdio::from(open()?)],
        )?;
        Ok(Self {
            child,
            what: argv.join(" "),
        })
    }
}

impl Background {
    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child, &self.what);
    }
}

/// A long-lived program spoken to in lines: one request line on its stdin, one answer line
/// on its stdout, in order (the libcni client's `serve`, a runtime that embeds libcni).
/// Its stderr is the bench's. Killed by its PID and reaped on drop.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// Bytes read past the last answer line.
    pending: Vec<u8>,
    what: String,
}

impl Session {
    /// Starts `argv` in `netns`.
    pub fn spawn(netns: &Path, argv: &[&OsStr]) -> Result<Self> {
        let mut child = spawn_in(
            netns,
            argv,
            [Stdio::piped(), Stdio::piped(), Stdio::inherit()],
        )?;
        let what = format!("{argv:?}");
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            kill_and_reap(&mut child, &what);
            bail!("{what}: no pipes");
        };
        Ok(Self {
            child,
            stdin,
            stdout,
            pending: Vec::new(),
            what,
        })
    }

    /// Sends `line` and waits at most `timeout` for the answer line; returns it and the
    /// time from the write until it was read. After an error the session is unusable.
    pub fn request(&mut self, line: &str, timeout: Duration) -> Result<(String, Duration)> {
        let started = Instant::now();
        let deadline = started + timeout;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| self.stdin.flush())
            .with_context(|| format!("writing to {}", self.what))?;
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let wall = started.elapsed();
                let answer: Vec<u8> = self.pending.drain(..=end).collect();
                return Ok((String::from_utf8_lossy(&answer).trim_end().to_owned(), wall));
            }
            if !readable_by(self.stdout.as_raw_fd(), deadline) {
                bail!("{} gave no answer within {timeout:?}", self.what);
            }
            let mut buf = [0u8; 65536];
            let got = self
                .stdout
                .read(&mut buf)
                .with_context(|| format!("reading from {}", self.what))?;
            if got == 0 {
                bail!("{} exited", self.what);
            }
            self.pending.extend_from_slice(&buf[..got]);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child, &self.what);
    }
}

/// Starts `argv` in `netns`, unbounded, with stdin, stdout and stderr from `io`.
fn spawn_in(netns: &Path, argv: &[&OsStr], io: [Stdio; 3]) -> Result<Child> {
    let spec = Spec {
        argv: argv.to_vec(),
        env: Vec::new(),
        netns: Some(netns),
        stdin: b"",
        timeout: Duration::ZERO,
    };
    let mut cmd = command(&spec)?;
    let [stdin, stdout, stderr] = io;
    cmd.stdin(stdin).stdout(stdout).stderr(stderr);
    start(cmd, Some(netns))
        .map(|(child, _)| child)
        .with_context(|| format!("starting {argv:?}"))
}

/// Waits until `fd` is readable or `deadline` passes, retrying after a signal; whether it
/// became readable (a failed poll counts as not).
fn readable_by(fd: std::os::fd::RawFd, deadline: Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Rounded up, so that an early wake-up is never taken for the deadline.
        let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return false;
    }
}

/// Kills `child` (ours, by its PID) unless it already ended, and reaps it.
fn kill_and_reap(child: &mut Child, what: &str) {
    if matches!(child.try_wait(), Ok(None)) {
        if let Err(e) = child.kill() {
            eprintln!("bench: cannot kill `{what}` ({}): {e}", child.id());
        }
    }
    let _ = child.wait();
}

/// Runs `f` on a new thread that has entered the network namespace `netns` (sockets it
/// opens live there); the calling thread's namespace is untouched.
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::thread::JoinHandle<Result<T>> {
    let path = netns.to_path_buf();
    std::thread::spawn(move || {
        let fd = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        setns(&fd, CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering {}", path.display()))?;
        f()
    })
}

/// Joins a thread started by [`in_netns`].
pub fn join<T>(h: std::thread::JoinHandle<Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(_) => bail!("a bench thread panicked"),
    }
}
