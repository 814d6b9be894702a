//! Egress rates (`runtimeConfig.bandwidth`): a pod's `PACING` entry, which `from_pod`
//! turns into departure times, and the `fq` qdisc on the uplink that holds each paced
//! packet until its time. Nothing here is needed by pods without a rate.

use cni_ebpf_common::{
    map as map_name, Pacing, PacingMode, PACING_LATENCY_NS, PACING_MAX_BURST_NS,
    PACING_POLICE_LIMIT_NS,
};

use super::{maps, Datapath};
use crate::{
    cni::config::EgressRate,
    error::{Error, Result},
    kernel::tc,
};

/// The qdisc that honours departure times.
const FQ: &str = "fq";

/// The `PACING` value of `rate`: bytes per second, and the burst as time at that rate
/// (capped at [`PACING_MAX_BURST_NS`]); and how it is enforced (`mode`).
#[must_use]
pub fn pacing_of(rate: &EgressRate, mode: PacingMode) -> Pacing {
    let burst_ns = u128::from(rate.burst_bits) * 1_000_000_000 / u128::from(rate.bits_per_s);
    Pacing {
        bytes_per_s: (rate.bits_per_s / 8).max(1),
        burst_ns: u64::try_from(burst_ns)
            .unwrap_or(u64::MAX)
            .min(PACING_MAX_BURST_NS),
        tat_ns: 0,
        limit_ns: if mode == PacingMode::BY_FQ {
            PACING_LATENCY_NS
        } else {
            PACING_POLICE_LIMIT_NS
        },
        mode,
        _pad: 0,
    }
}

impl Datapath {
    /// Writes the pod's `PACING` entry (host veth `ifindex`) and makes sure the uplink
    /// paces (or, on a kernel without `fq`, makes the entry police).
    pub(super) fn put_pacing(&self, ifindex: u32, rate: &EgressRate) -> Result<()> {
        let mode = if self.ensure_uplink_fq()? {
            PacingMode::BY_FQ
        } else {
            PacingMode::POLICE
        };
        let mut m = self.maps()?;
        m.pacing()?
            .insert(ifindex, pacing_of(rate, mode), 0)
            .map_err(|e| maps::err(map_name::PACING, "insert", e))
    }

    /// Removes the `PACING` entries of host veths `ifindexes`; missing ones are fine.
    pub(super) fn remove_pacing(&self, ifindexes: impl IntoIterator<Item = u32>) -> Result<()> {
        let mut m = self.maps()?;
        let mut h = m.pacing()?;
        for i in ifindexes {
            match h.remove(&i) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::PACING, "delete", e)),
            }
        }
        Ok(())
    }

    /// The uplink's qdiscs that would not honour departure times: its root, or each
    /// queue's qdisc under a multiqueue (`mq`) root, that is not `fq`. Returned as
    /// (parent, kind).
    fn uplink_unpaced(&self) -> Result<(u32, Vec<(u32, String)>)> {
        let uplink = self.node_config_raw()?.uplink_ifindex;
        let qdiscs = tc::qdiscs(uplink)
            .map_err(|e| Error::io(format!("listing the qdiscs of ifindex {uplink}"), e))?;
        let root = qdiscs.iter().find(|q| q.parent == tc::ROOT);
        let unpaced = match root {
            Some(r) if r.kind == "mq" => {
                let major = r.handle & 0xffff_0000;
                qdiscs
                    .iter()
                    .filter(|q| q.parent & 0xffff_0000 == major && q.parent != tc::ROOT)
                    .filter(|q| q.kind != FQ)
                    .map(|q| (q.parent, q.kind.clone()))
                    .collect()
            }
            Some(r) if r.kind == FQ => Vec::new(),
            Some(r) => vec![(tc::ROOT, r.kind.clone())],
            None => vec![(tc::ROOT, "none".to_owned())],
        };
        Ok((uplink, unpaced))
    }

    /// Puts `fq` where the uplink's packets are queued (the root, or each queue of a
    /// multiqueue root) unless it is there already. `Ok(false)` when this kernel has no
    /// `fq` (the kernel answers `ENOENT` for an unknown qdisc kind).
    pub fn ensure_uplink_fq(&self) -> Result<bool> {
        let (uplink, unpaced) = self.uplink_unpaced()?;
        for (parent, kind) in unpaced {
            tracing::info!(
                "egress rates: replacing qdisc {kind} (parent {parent:#x}) of the uplink \
                 (ifindex {uplink}) with fq, which honours departure times"
            );
            match tc::replace_qdisc(uplink, parent, FQ) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    tracing::warn!(
                        "this kernel has no fq qdisc (CONFIG_NET_SCH_FQ): egress rates are \
                         enforced by dropping what exceeds them (policing), not by pacing"
                    );
                    return Ok(false);
                }
                Err(e) => {
                    return Err(Error::io(
                        format!(
                            "setting fq as the uplink's qdisc (ifindex {uplink}, parent \
                             {parent:#x})"
                        ),
                        e,
                    ))
                }
            }
        }
        Ok(true)
    }

    /// CHECK of a pod's egress rate: its `PACING` entry matches `want` (or is absent
    /// without one), and a paced pod's uplink still has `fq`.
    pub(super) fn check_pacing(&self, ifindex: u32, want: Option<&EgressRate>) -> Result<()> {
        let live = {
            let mut m = self.maps()?;
            maps::get(&m.pacing()?, &ifindex, map_name::PACING)?
        };
        match (want, live) {
            (None, None) => Ok(()),
            (None, Some(p)) => Err(Error::Check(format!(
                "host veth ifindex {ifindex} has an egress rate of {} bytes/s the configuration \
                 does not ask for",
                p.bytes_per_s
            ))),
            (Some(r), None) => Err(Error::Check(format!(
                "the egress rate of {} bits/s is not in the datapath",
                r.bits_per_s
            ))),
            (Some(r), Some(p)) => {
                let w = pacing_of(r, p.mode);
                if (p.bytes_per_s, p.burst_ns, p.limit_ns)
                    != (w.bytes_per_s, w.burst_ns, w.limit_ns)
                {
                    return Err(Error::Check(format!(
                        "the egress rate is {} bytes/s with a {} ns burst, expected {} bytes/s \
                         with {} ns",
                        p.bytes_per_s, p.burst_ns, w.bytes_per_s, w.burst_ns
                    )));
                }
                if p.mode != PacingMode::BY_FQ {
                    // Policing: nothing on the uplink to check.
                    return Ok(());
                }
                let (uplink, unpaced) = self.uplink_unpaced()?;
                if let Some((parent, kind)) = unpaced.first() {
                    return Err(Error::Check(format!(
                        "the uplink (ifindex {uplink}) queues with {kind} at parent {parent:#x}, \
                         not fq: the pod's departure times are not honoured"
                    )));
                }
                Ok(())
            }
        }
    }
}
