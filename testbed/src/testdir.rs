//! A test's temp dir: removed when dropped, kept (and its path printed) when
//! `CNI_EBPF_TEST_KEEP` is set, for a look after a failure.

use std::path::Path;

use tempfile::TempDir;

/// A temp dir owned by one harness part (a node, a containerd).
#[derive(Debug)]
pub struct TestDir(Option<TempDir>);

impl TestDir {
    /// Creates `/tmp/<prefix>XXXXXX`; panics if it cannot.
    #[track_caller]
    #[must_use]
    pub fn new(prefix: &str) -> Self {
        match tempfile::Builder::new().prefix(prefix).tempdir() {
            Ok(d) => Self(Some(d)),
            Err(e) => panic!("cannot create a temp dir {prefix}*: {e}"),
        }
    }

    /// Its path.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.0
            .as_ref()
            .map_or(Path::new("/nonexistent"), TempDir::path)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::env::var_os("CNI_EBPF_TEST_KEEP").is_some() {
            if let Some(d) = self.0.take() {
                eprintln!("keeping {}", d.keep().display());
            }
        }
    }
}

/// Where a test keeps what it made for a reader (a screenshot for the docs):
/// `target/test-artifacts/<name>` of the workspace, created if missing.
#[must_use]
pub fn artifact(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}
