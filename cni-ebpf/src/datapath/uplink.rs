//! The uplink programs (`uplink_ingress`, `uplink_egress`): attached once per node through
//! pinned links, by the first [`Datapath::open_or_load`] that finds them missing.

use aya::programs::TcAttachType;
use cni_ebpf_common::{prog, NodeConfig};

use super::{
    attach::{self, AttachMode},
    load,
    node_config::CFG_F_UPLINK_LEGACY,
    pins::Direction,
    Datapath,
};
use crate::error::Result;

/// The uplink programs and where they go.
const UPLINK_PROGS: [(&str, Direction, TcAttachType); 2] = [
    (
        prog::UPLINK_INGRESS,
        Direction::Ingress,
        TcAttachType::Ingress,
    ),
    (prog::UPLINK_EGRESS, Direction::Egress, TcAttachType::Egress),
];

impl Datapath {
    /// Attaches the uplink programs to `name` where they are not already. Returns whether
    /// legacy clsact was used.
    pub(super) fn ensure_uplink(&self, cfg: &NodeConfig, name: &str, ifindex: u32) -> Result<bool> {
        if cfg.flags & CFG_F_UPLINK_LEGACY != 0 && cfg.uplink_ifindex == ifindex {
            return Ok(true);
        }
        if self.uplink_attached(name)? {
            return Ok(false);
        }
        let _lock = load::LoadLock::acquire(&self.pins)?;
        let mut legacy = false;
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if self.uplink_dir_attached(name, p, dir, tc_dir)? {
                continue;
            }
            let mut program = self.program(p)?;
            let mode = attach::attach(
                &mut program,
                name,
                tc_dir,
                &self.pins.uplink_link(name, dir),
            )?;
            legacy |= mode == AttachMode::Legacy;
        }
        Ok(legacy)
    }

    /// Whether both uplink programs are attached to `name` through their pinned links.
    pub(super) fn uplink_attached(&self, name: &str) -> Result<bool> {
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if !self.uplink_dir_attached(name, p, dir, tc_dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn uplink_dir_attached(
        &self,
        name: &str,
        p: &str,
        dir: Direction,
        tc_dir: TcAttachType,
    ) -> Result<bool> {
        let id = attach::program_id(&self.program(p)?)?;
        if attach::pinned_link_program(&self.pins.uplink_link(name, dir))? != Some(id) {
            return Ok(false);
        }
        Ok(attach::tcx_attached(name, tc_dir, id)? != Some(false))
    }
}
