//! The Go libcni client (`testbed/libcni-client`): building it offline and reading its output.
//!
//! Unless `$LIBCNI_CLIENT` names a binary (as `cargo xtask test` does), the client is built
//! once per test process by `testbed/libcni-client/build.sh` from Debian's libcni source in
//! GOPATH mode (`GOPATH=/usr/share/gocode GO111MODULE=off`, no network) into
//! `<target>/libcni-client`.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
    time::SystemTime,
};

use serde_json::Value;

use crate::{
    plugin::{workspace_root, CniError},
    process::{command, run_cmd, Output, DEFAULT_TIMEOUT},
};

/// Reference plugins (tuning, bandwidth, host-local, …) from Debian's
/// `containernetworking-plugins`.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

static CLIENT: OnceLock<PathBuf> = OnceLock::new();

/// Cargo's target directory: `$CARGO_TARGET_DIR` or `<workspace>/target`.
#[must_use]
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The libcni client binary: `$LIBCNI_CLIENT`, or built on first use into
/// `<target>/libcni-client` (where `cargo xtask` puts it too), rebuilt when its sources are
/// newer than the binary.
#[track_caller]
pub fn client_bin() -> &'static Path {
    CLIENT.get_or_init(|| {
        if let Some(p) = std::env::var_os("LIBCNI_CLIENT") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "LIBCNI_CLIENT={} does not exist", p.display());
            return p;
        }
        build_client(&target_dir().join("libcni-client"))
    })
}

fn mtime(p: &Path) -> Option<SystemTime> {
    p.metadata().and_then(|m| m.modified()).ok()
}

/// Builds the client to `out` with `testbed/libcni-client/build.sh` unless `out` is newer
/// than `main.go` and `build.sh`.
#[track_caller]
pub fn build_client(out: &Path) -> PathBuf {
    let src = workspace_root().join("testbed/libcni-client");
    let script = src.join("build.sh");
    let newest_src = [src.join("main.go"), script.clone()]
        .iter()
        .filter_map(|p| mtime(p))
        .max();
    if let (Some(bin), Some(srcs)) = (mtime(out), newest_src) {
        if bin >= srcs {
            return out.to_path_buf();
        }
    }
    let mut cmd = command(&["bash"]);
    cmd.arg(&script).arg(out);
    let built = run_cmd(cmd, None, DEFAULT_TIMEOUT * 5);
    assert!(
        built.success(),
        "building the libcni client failed (needs Debian's golang-go and \
         golang-github-appc-cni-dev): {built}"
    );
    out.to_path_buf()
}

/// A failure reported by the client on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFailure {
    /// The plugin's CNI error code, or 0 if libcni itself failed.
    pub code: u64,
    /// The plugin's `msg` (or libcni's message).
    pub msg: String,
    /// The plugin's `details`.
    pub details: String,
    /// libcni's full wrapped message (names the failing plugin).
    pub error: String,
}

/// The outcome of one client invocation.
#[derive(Debug, Clone)]
pub struct ClientOutput {
    /// The raw process output.
    pub raw: Output,
}

impl ClientOutput {
    /// Whether the client exited 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.raw.success()
    }

    /// The printed JSON of a successful `add`/`version`/`cached`; panics otherwise.
    #[track_caller]
    #[must_use]
    pub fn result(&self) -> Value {
        assert!(self.success(), "libcni client failed: {}", self.raw);
        self.raw.json()
    }

    /// Panics unless a `check`/`del` succeeded.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.success(), "libcni client failed: {}", self.raw);
    }

    /// The failure of an unsuccessful operation (exit 1); panics if it succeeded or was a
    /// usage error.
    #[track_caller]
    #[must_use]
    pub fn failure(&self) -> ClientFailure {
        assert_eq!(
            self.raw.status.code(),
            Some(1),
            "expected an operation failure (exit 1): {}",
            self.raw
        );
        let line = self.raw.stderr.lines().rev().find(|l| !l.trim().is_empty());
        let parsed: Option<Value> = line.and_then(|l| serde_json::from_str(l).ok());
        let Some(v) = parsed else {
            panic!(
                "client stderr does not end in a failure JSON line: {}",
                self.raw
            );
        };
        let cni = CniError::from_json(&v).unwrap_or(CniError {
            code: 0,
            msg: String::new(),
            details: String::new(),
        });
        ClientFailure {
            code: cni.code,
            msg: cni.msg,
            details: cni.details,
            error: v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }
    }

    /// Panics unless the operation failed with the plugin's error `code`.
    #[track_caller]
    pub fn assert_error(&self, code: u64) -> ClientFailure {
        let f = self.failure();
        assert_eq!(f.code, code, "wrong error code: {}", self.raw);
        f
    }
}
