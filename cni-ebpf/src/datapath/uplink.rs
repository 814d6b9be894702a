//! The uplink programs (`uplink_ingress`, `uplink_egress`): attached once per node through
//! clsact filters or pinned tcx links (`attach`), by the first [`Datapath::open_or_load`]
//! that finds them missing.

use aya::programs::TcAttachType;
use cni_ebpf_common::prog;

use super::{
    attach::{self, AttachMode},
    load,
    pins::Direction,
    Datapath,
};
use crate::{cni::config::AttachPolicy, error::Result};

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
    /// Attaches the uplink programs to `name` (`ifindex`) where they are not attached the
    /// way the configuration's `attach` asks (a change of mode re-attaches them).
    pub(super) fn ensure_uplink(&self, name: &str, ifindex: u32) -> Result<()> {
        if self.uplink_attached(name, ifindex, self.attach)? {
            return Ok(());
        }
        let _lock = load::LoadLock::acquire(&self.pins)?;
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if wanted(
                self.uplink_mode(name, ifindex, p, dir, tc_dir)?,
                self.attach,
            ) {
                continue;
            }
            let mut program = self.program(p)?;
            attach::attach(
                &mut program,
                name,
                ifindex,
                tc_dir,
                &self.pins.uplink_link(name, dir),
                attach::uplink_handle(self.pins.network_dir()),
                self.attach,
            )?;
        }
        Ok(())
    }

    /// Whether both uplink programs are attached to `name` in a mode `policy` accepts.
    pub(super) fn uplink_attached(
        &self,
        name: &str,
        ifindex: u32,
        policy: AttachPolicy,
    ) -> Result<bool> {
        for (p, dir, tc_dir) in UPLINK_PROGS {
            if !wanted(self.uplink_mode(name, ifindex, p, dir, tc_dir)?, policy) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn uplink_mode(
        &self,
        name: &str,
        ifindex: u32,
        p: &str,
        dir: Direction,
        tc_dir: TcAttachType,
    ) -> Result<Option<AttachMode>> {
        let id = attach::pinned_program_id(&self.pins.prog(p))?;
        attach::attached(
            name,
            ifindex,
            tc_dir,
            id,
            &self.pins.uplink_link(name, dir),
            attach::uplink_handle(self.pins.network_dir()),
        )
    }
}

/// Whether an attachment in `mode` is what `policy` asks for.
fn wanted(mode: Option<AttachMode>, policy: AttachPolicy) -> bool {
    matches!(
        (mode, policy),
        (Some(AttachMode::Tc), AttachPolicy::Tc)
            | (Some(AttachMode::Tcx), AttachPolicy::Tcx)
            | (Some(_), AttachPolicy::Auto)
    )
}
