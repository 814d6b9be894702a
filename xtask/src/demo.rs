//! `cargo xtask demo`: a simulated node with two pods networked by cni-ebpf.

use std::path::Path;

use anyhow::{bail, Result};

/// Runs the demo.
pub fn run(_bin: &Path) -> Result<()> {
    bail!("the demo needs ADD, which is being built")
}
