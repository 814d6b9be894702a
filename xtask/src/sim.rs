//! Simulated-node plumbing used by `load`, `demo` and `test`: namespaces that xtask
//! creates and always removes, and the libcni test client build.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{run, workspace_root};

/// Builds the Go libcni client offline against Debian's libcni source.
pub fn build_libcni_client() -> Result<PathBuf> {
    let root = workspace_root();
    let out = root.join("target/libcni-client");
    let script = root.join("tests/libcni-client/build.sh");
    if !script.exists() {
        bail!("{} is missing", script.display());
    }
    run(Command::new("bash").arg(&script).arg(&out))?;
    Ok(out)
}

/// A network namespace created by xtask, deleted on drop.
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates `name` (removing a stale one left by a crashed earlier run).
    pub fn create(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Self {
            name: name.to_owned(),
        };
        ns.sh(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs `argv` inside this namespace (network namespace only, so /sys/fs/bpf stays
    /// visible), failing on a non-zero exit.
    pub fn sh(&self, argv: &[&str]) -> Result<()> {
        run(&mut self.cmd(argv))
    }

    /// A command that runs `argv` inside this namespace.
    pub fn cmd(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .args(argv);
        c
    }

    /// Runs `argv` and returns its stdout.
    pub fn output(&self, argv: &[&str]) -> Result<String> {
        let o = self
            .cmd(argv)
            .output()
            .with_context(|| format!("running {argv:?}"))?;
        if !o.status.success() {
            bail!(
                "{argv:?} in {} failed: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A node namespace with an uplink veth to an `ext` namespace (198.18.0.0/24), like the
/// test topology of DESIGN.md.
pub struct Node {
    /// The node.
    pub node: Netns,
    /// The outside world.
    pub ext: Netns,
}

impl Node {
    /// Creates node + ext with the given name prefix.
    pub fn create(prefix: &str) -> Result<Self> {
        let node = Netns::create(&format!("{prefix}-node"))?;
        let ext = Netns::create(&format!("{prefix}-ext"))?;
        node.sh(&[
            "ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "ext0", "netns",
            &ext.name,
        ])?;
        node.sh(&["ip", "addr", "add", "198.18.0.1/24", "dev", "uplink0"])?;
        node.sh(&["ip", "link", "set", "uplink0", "up"])?;
        node.sh(&["ip", "route", "add", "default", "via", "198.18.0.2"])?;
        ext.sh(&["ip", "addr", "add", "198.18.0.2/24", "dev", "ext0"])?;
        ext.sh(&["ip", "link", "set", "ext0", "up"])?;
        Ok(Self { node, ext })
    }
}

/// `cargo xtask load`: load and pin into a throwaway node, print the pins, clean up.
pub fn load(bin: &Path) -> Result<()> {
    let node = Node::create("xtask-load")?;
    let pins = format!("/sys/fs/bpf/cni-ebpf-xtask-load-{}", std::process::id());
    let out = node.node.output(&[
        &bin.to_string_lossy(),
        "load",
        "--network",
        "xtask",
        "--bpffs-root",
        &pins,
        "--uplink",
        "uplink0",
    ]);
    let _ = std::fs::remove_dir_all(&pins);
    print!("{}", out?);
    Ok(())
}
