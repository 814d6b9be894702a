//! STATUS (1.1.0): is the plugin ready to serve ADDs? Cheap checks only.
//!
//! - bpffs unusable, the object missing, or the pins damaged (partly there, another
//!   layout): 50.
//! - Never loaded since bpffs was mounted (a fresh node, or after a reboot, since bpffs
//!   does not persist): ready, because the first ADD loads the programs — unless pods
//!   already hold addresses of this boot, which then have no datapath: 51.
//! - IPAM store not writable or a range set without a free address: 50.

use crate::{
    cni::{config::NetConf, env::Env},
    datapath::Datapath,
    error::{Error, Result},
    ipam,
};

/// Runs STATUS.
pub fn run(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    if Datapath::never_loaded(conf)? {
        let held = ipam::list(conf)?.len();
        if held > 0 {
            return Err(Error::LimitedConnectivity(format!(
                "{held} attachment(s) of network {} hold addresses but its eBPF datapath is not \
                 loaded under {}; run `cni-ebpf load --network {}`",
                conf.name,
                conf.pin_dir().display(),
                conf.name
            )));
        }
    } else {
        Datapath::status(conf)?;
    }
    ipam::status(conf, env, stdin)
}
