//! Data plane (stub).
use std::path::Path;

use anyhow::Result;

use super::{report::Report, topo::Workspace};

/// Sizes of the data-plane phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Interleaved repeats.
    pub repeats: usize,
    /// Seconds per measurement.
    pub seconds: f64,
}

/// Runs the data-plane phase.
pub fn run(_ws: &Workspace, _p: &Params, report: &mut Report) -> Result<()> {
    report.notes.push("data plane: not implemented yet".into());
    Ok(())
}

/// Data-plane chart.
pub fn chart(_out: &Path, _report: &Report) -> Result<()> {
    Ok(())
}
