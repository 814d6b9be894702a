//! Running programs: bounded in time, optionally inside a network namespace.
//!
//! Entering a namespace is done with `setns(CLONE_NEWNET)` in a `pre_exec` hook, which
//! switches only the network namespace — unlike `ip netns exec`, which also unshares the
//! mount namespace and remounts `/sys`, hiding `/sys/fs/bpf` (see docs/testing.md).

use std::{
    ffi::OsStr,
    fmt,
    fs::File,
    io::{Read, Write},
    os::unix::process::{CommandExt, ExitStatusExt},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::sched::{setns, CloneFlags};
use serde_json::Value;

/// Default bound for any helper command (`ip`, `ping`, the plugin, the client).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a finished (or killed) program left behind.
#[derive(Debug, Clone)]
pub struct Output {
    /// The command line, for messages.
    pub argv: Vec<String>,
    /// Exit status; a program killed on timeout shows `SIGKILL`.
    pub status: ExitStatus,
    /// Whether the program was killed because it outlived its timeout.
    pub timed_out: bool,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

impl Output {
    /// Whether the program exited with status 0 in time.
    #[must_use]
    pub fn success(&self) -> bool {
        self.status.success() && !self.timed_out
    }

    /// Panics with the full output unless the program succeeded; returns stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert!(self.success(), "command failed: {self}");
        &self.stdout
    }

    /// Parses stdout as JSON, panicking with the full output if it is not.
    #[track_caller]
    #[must_use]
    pub fn json(&self) -> Value {
        match serde_json::from_str(&self.stdout) {
            Ok(v) => v,
            Err(e) => panic!("stdout is not JSON ({e}): {self}"),
        }
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ", self.argv.join(" "))?;
        if self.timed_out {
            write!(f, "timed out and was killed")?;
        } else if let Some(code) = self.status.code() {
            write!(f, "exited with {code}")?;
        } else {
            write!(f, "died of signal {:?}", self.status.signal())?;
        }
        write!(
            f,
            "\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// Makes `cmd` enter the network namespace at `netns` (a `/run/netns/…` path) before it
/// executes. Panics if the namespace cannot be opened.
#[track_caller]
pub fn in_netns(cmd: &mut Command, netns: &Path) {
    let fd = match File::open(netns) {
        Ok(f) => f,
        Err(e) => panic!("cannot open network namespace {}: {e}", netns.display()),
    };
    // SAFETY: the hook only calls setns(2), which is async-signal-safe, on a descriptor
    // opened before fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || setns(&fd, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from));
    }
}

/// Runs `cmd` to completion with `stdin` fed to it, killing it (by its PID) if it takes
/// longer than `timeout`.
#[track_caller]
pub fn run_cmd(mut cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let argv: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s: &OsStr| s.to_string_lossy().into_owned())
        .collect();
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot start `{}`: {e}", argv.join(" ")),
    };
    let writer = stdin.map(|data| {
        let data = data.to_vec();
        let mut pipe = child.stdin.take();
        thread::spawn(move || {
            if let Some(p) = pipe.as_mut() {
                // A program that exits without reading its stdin is not our concern here.
                let _ = p.write_all(&data);
            }
        })
    });
    let out_reader = reader(child.stdout.take());
    let err_reader = reader(child.stderr.take());
    let (status, timed_out) = wait_bounded(&mut child, timeout);
    if let Some(w) = writer {
        let _ = w.join();
    }
    Output {
        argv,
        status,
        timed_out,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

fn wait_bounded(child: &mut Child, timeout: Duration) -> (ExitStatus, bool) {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return (status, false),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            _ => {
                // Only the child we spawned, by its PID.
                let _ = child.kill();
                let status = child.wait().unwrap_or_else(|_| ExitStatus::from_raw(9));
                return (status, true);
            }
        }
    }
}

/// Builds a [`Command`] from an argv slice.
#[track_caller]
#[must_use]
pub fn command<S: AsRef<OsStr>>(argv: &[S]) -> Command {
    let Some((prog, args)) = argv.split_first() else {
        panic!("empty argv");
    };
    let mut cmd = Command::new(prog);
    cmd.args(args);
    cmd
}

/// Runs `argv` in the machine's own namespaces (for `ip netns add/del` and the like).
#[track_caller]
pub fn run<S: AsRef<OsStr>>(argv: &[S]) -> Output {
    run_cmd(command(argv), None, DEFAULT_TIMEOUT)
}

/// Runs `argv` inside the network namespace at `netns`, bounded by [`DEFAULT_TIMEOUT`].
#[track_caller]
pub fn netns_exec<S: AsRef<OsStr>>(netns: &Path, argv: &[S]) -> Output {
    let mut cmd = command(argv);
    in_netns(&mut cmd, netns);
    run_cmd(cmd, None, DEFAULT_TIMEOUT)
}

/// [`netns_exec`] with `input` on stdin (`nft -f -`, `iptables-restore`).
#[track_caller]
pub fn netns_exec_input<S: AsRef<OsStr>>(netns: &Path, argv: &[S], input: &[u8]) -> Output {
    let mut cmd = command(argv);
    in_netns(&mut cmd, netns);
    run_cmd(cmd, Some(input), DEFAULT_TIMEOUT)
}

/// Runs `argv` inside `netns` and panics with its output unless it succeeds; returns
/// stdout.
#[track_caller]
pub fn netns_exec_ok<S: AsRef<OsStr>>(netns: &Path, argv: &[S]) -> String {
    netns_exec(netns, argv).ok().to_owned()
}

/// Runs `ip -j <args>` inside `netns` and returns the parsed JSON (an array).
#[track_caller]
#[must_use]
pub fn ip_json(netns: &Path, args: &[&str]) -> Value {
    let mut argv = vec!["ip", "-j"];
    argv.extend_from_slice(args);
    let out = netns_exec(netns, &argv);
    out.ok();
    if out.stdout.trim().is_empty() {
        return Value::Array(Vec::new());
    }
    out.json()
}

/// Packets `dev` in `netns` has itself transmitted (`"tx"`) or received (`"rx"`): its
/// driver's counters.
#[track_caller]
#[must_use]
pub fn device_packets(netns: &Path, dev: &str, direction: &str) -> u64 {
    let doc = ip_json(netns, &["-s", "link", "show", dev]);
    doc[0]["stats64"][direction]["packets"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {direction} counter for {dev}: {doc}"))
}

/// A long-running program we started (a server in the `ext` namespace, a traffic loop).
/// Dropping it kills it by its PID and reaps it.
#[derive(Debug)]
pub struct Background {
    child: Child,
    argv: String,
}

impl Background {
    /// Starts `argv` inside `netns` with stdio discarded.
    #[track_caller]
    pub fn spawn<S: AsRef<OsStr>>(netns: &Path, argv: &[S]) -> Self {
        Self::spawn_with(netns, argv, Stdio::null, Stdio::null)
    }

    /// Starts `argv` inside `netns` with stdin discarded and stdout and stderr appended
    /// to the file `log` (read it with [`std::fs::read_to_string`] when something fails).
    #[track_caller]
    pub fn spawn_logged<S: AsRef<OsStr>>(netns: &Path, argv: &[S], log: &Path) -> Self {
        let open = || {
            Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display())),
            )
        };
        Self::spawn_with(netns, argv, open, open)
    }

    #[track_caller]
    fn spawn_with<S: AsRef<OsStr>>(
        netns: &Path,
        argv: &[S],
        stdout: impl Fn() -> Stdio,
        stderr: impl Fn() -> Stdio,
    ) -> Self {
        let mut cmd = command(argv);
        in_netns(&mut cmd, netns);
        cmd.stdin(Stdio::null()).stdout(stdout()).stderr(stderr());
        let argv: Vec<String> = argv
            .iter()
            .map(|s| s.as_ref().to_string_lossy().into_owned())
            .collect();
        let argv = argv.join(" ");
        match cmd.spawn() {
            Ok(child) => Self { child, argv },
            Err(e) => panic!("cannot start `{argv}`: {e}"),
        }
    }

    /// The PID of the program.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.running() {
            if let Err(e) = self.child.kill() {
                eprintln!(
                    "warning: cannot kill `{}` (pid {}): {e}",
                    self.argv,
                    self.child.id()
                );
            }
        }
        let _ = self.child.wait();
    }
}

/// The capabilities the DaemonSet gives the agent's container, which runs unprivileged
/// (`deploy/base/daemonset.yaml`; `cni-ebpf/tests/deploy.rs` checks that the manifest
/// names exactly these): `NET_ADMIN` for routes and neighbour entries, `BPF` for `bpf()`
/// on kernels before 5.19 with `kernel.unprivileged_bpf_disabled` set (every command then
/// needs it; later kernels ask for it only to create maps and load programs).
pub const AGENT_CAPABILITIES: &[&str] = &["net_admin", "bpf"];

/// `argv` run as the agent's container runs it: root with no capability but
/// [`AGENT_CAPABILITIES`] (every other one out of the bounding set, none inheritable) and
/// no new privileges (`setpriv`, util-linux).
#[must_use]
pub fn as_agent_container(argv: Vec<String>) -> Vec<String> {
    let keep: Vec<String> = AGENT_CAPABILITIES.iter().map(|c| format!("+{c}")).collect();
    let mut out: Vec<String> = vec![
        "setpriv".into(),
        "--bounding-set".into(),
        format!("-all,{}", keep.join(",")),
        "--inh-caps".into(),
        "-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ];
    out.extend(argv);
    out
}
