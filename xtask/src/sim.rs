//! What `load` and `test` need around the simulated node (the node itself is the tests
//! crate's [`testbed::NodeNamespaces`], shared with the demo and the bench): the throwaway
//! node of `cargo xtask load`, and the libcni test client build.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Result};

use crate::{run, workspace_root};

/// Builds the Go libcni client offline against Debian's libcni source.
pub fn build_libcni_client() -> Result<PathBuf> {
    let root = workspace_root();
    let out = root.join("target/libcni-client");
    let script = root.join("testbed/libcni-client/build.sh");
    if !script.exists() {
        bail!("{} is missing", script.display());
    }
    run(Command::new("bash").arg(&script).arg(&out))?;
    Ok(out)
}

/// `cargo xtask load`: load and pin into a throwaway node, print the pins, clean up.
pub fn load(bin: &Path) -> Result<()> {
    let node = testbed::NodeNamespaces::create("xtask-load")?;
    let pins = format!("/sys/fs/bpf/cni-ebpf-xtask-load-{}", std::process::id());
    let out = node.node.sh(&[
        bin.to_string_lossy().as_ref(),
        "load",
        "--network",
        "xtask",
        "--bpffs-root",
        &pins,
        "--uplink",
        "uplink0",
        // No socket hooks on the machine's cgroup2 root: the throwaway node has no
        // cgroup of its own, and the machine is left alone.
        "--cgroup-path",
        "",
    ]);
    let _ = std::fs::remove_dir_all(&pins);
    print!("{}", out?);
    Ok(())
}
