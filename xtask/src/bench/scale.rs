//! Scale (stub).
use std::path::Path;

use anyhow::Result;

use super::{report::Report, topo::Workspace};

/// Sizes of the scale phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Host-port pod counts.
    pub levels: Vec<usize>,
    /// Probe ADDs per level.
    pub probes: usize,
    /// Connections per level.
    pub connects: usize,
}

/// Runs the scale phase.
pub fn run(_ws: &Workspace, _p: &Params, report: &mut Report) -> Result<()> {
    report.notes.push("scale: not implemented yet".into());
    Ok(())
}

/// Scaling chart.
pub fn chart(_out: &Path, _report: &Report) -> Result<()> {
    Ok(())
}
