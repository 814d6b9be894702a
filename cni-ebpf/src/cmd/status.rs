//! STATUS (1.1.0): is the plugin ready to serve ADDs? Cheap checks only.

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::Result,
    ipam,
};

/// Runs STATUS: the datapath (bpffs, pins) and the IPAM store (writable, addresses left).
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    Datapath::status(conf)?;
    ipam::status(conf, env, stdin)
}
