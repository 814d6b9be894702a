//! Carrying a running node over to a binary whose eBPF programs differ.
//!
//! Each load pins a marker directory next to the programs, named after the object that
//! made them ([`object::stamp`]: crate version and a hash of the object, computed at
//! build time). An invocation whose own object is not the marked one (a newer binary was
//! installed while pods run) replaces the programs in place, once per node, under the
//! load lock:
//!
//! 1. the new object is loaded with the **pinned maps** (same layout version, so every
//!    map keeps its entries: endpoints, host ports, NAT state of open flows, counters);
//! 2. every attachment of an old program gets the new one atomically — a clsact filter
//!    is replaced at its priority and handle, a tcx link or a cgroup link swaps its
//!    program (`BPF_LINK_UPDATE`) — so no packet meets an empty hook;
//! 3. the program pins are replaced (pin beside, `rename(2)` over), then the marker.
//!
//! A crash anywhere leaves the old marker, so the next invocation redoes the whole step
//! (each part is idempotent); until then old and new programs share the maps, which is
//! safe because their layout is the same. An older binary never takes a node back: it
//! finds a marker of a newer version and uses the pinned programs as they are.
//!
//! A binary whose **map layout** differs (`LAYOUT_VERSION`) cannot reuse the maps; it
//! refuses every operation on the node and names the procedure (`mod.rs`,
//! `refuse_foreign`).

use aya::programs::{CgroupSockAddr, SchedClassifier, TcAttachType};
use cni_ebpf_common::prog;

use super::{
    attach::{self, AttachMode},
    bpf_syscall,
    load::{self, Loaded},
    netkit, object,
    pins::{Direction, Pins},
    Datapath,
};
use crate::{
    cni::config::AttachPolicy,
    error::{Error, Result},
    kernel::link,
};

/// Whether the programs pinned in `pins` were made by this binary's object.
#[must_use]
pub fn current(pins: &Pins) -> bool {
    pins.version_dir().join(object::stamp()).is_dir()
}

/// Makes the pinned programs this binary's (see the module comment); a no-op when they
/// are, or when a newer version's are pinned. With the IPAM `store` of the network, also
/// records the namespaces of pods an older binary ADDed ([`Datapath::adopt_pod_netns`]).
/// The caller holds the load lock.
pub fn carry_over(pins: &Pins, store: Option<&std::path::Path>) -> Result<()> {
    let ours = object::stamp();
    if current(pins) {
        return Ok(());
    }
    let pinned = pins.stamps()?;
    if let Some(newer) = pinned
        .iter()
        .find(|s| object::stamp_version(s) > object::stamp_version(&ours))
    {
        tracing::warn!(
            "the programs pinned in {} come from {newer}, newer than this binary ({ours}); \
             using them as they are",
            pins.version_dir().display()
        );
        return Ok(());
    }
    tracing::info!(
        "replacing the programs pinned in {} ({}) with this binary's ({ours})",
        pins.version_dir().display(),
        if pinned.is_empty() {
            "unmarked".to_owned()
        } else {
            pinned.join(", ")
        }
    );
    replace_programs(pins)?;
    if let Some(store) = store {
        let dp = Datapath::open_pins(pins.clone())?;
        dp.adopt_pod_netns(&crate::ipam::record::read_records_unlocked(store));
    }
    let marker = pins.version_dir().join(&ours);
    std::fs::create_dir(&marker)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(|e| Error::io(format!("creating {}", marker.display()), e))?;
    for old in pinned.iter().filter(|s| **s != ours) {
        let dir = pins.version_dir().join(old);
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::warn!("removing the old marker {}: {e}", dir.display());
        }
    }
    Ok(())
}

/// One attachment of a tc program: where it is and how to find it.
struct TcTarget {
    ifname: String,
    ifindex: u32,
    dir: TcAttachType,
    link_pin: std::path::PathBuf,
    handle: u32,
}

fn replace_programs(pins: &Pins) -> Result<()> {
    let mut ebpf = load::load_object(pins, load::Faults::default())?;
    let dp = Datapath::open_pins(pins.clone())?;
    let mut calls6 = load::calls6(&mut ebpf)?;
    for name in prog::ALL {
        match load::load_program(&mut ebpf, name)? {
            // A tail-called program is swapped in its slot (atomically: the attached
            // programs call the old one or the new one), then its pin.
            Loaded::Tc(p) if load::call6_slot(name).is_some() => {
                if let Some(slot) = load::call6_slot(name) {
                    load::set_call6(&mut calls6, slot, p.fd(), name)?;
                }
                pin_over(pins, name, |tmp| p.pin(tmp))?;
            }
            // A netkit pair's program: swapped in its links.
            Loaded::Tc(p) if name == prog::FROM_NETKIT || name == prog::TO_NETKIT => {
                for pin in netkit_links(&dp, name)? {
                    netkit::update(p, &pin)?;
                }
                pin_over(pins, name, |tmp| p.pin(tmp))?;
            }
            // A program the old object did not have: attached where it belongs, in the
            // mode the pod's other program runs in.
            Loaded::Tc(p) if !pins.prog(name).exists() => {
                let beside = attach::program_id(&load::open_program(pins, prog::FROM_POD)?)?;
                for t in tc_targets(&dp, name)? {
                    attach_beside(p, beside, &dp, &t)?;
                }
                pin_over(pins, name, |tmp| p.pin(tmp))?;
            }
            Loaded::Tc(p) => {
                let old_id = attach::program_id(&load::open_program(pins, name)?)?;
                for t in tc_targets(&dp, name)? {
                    swap_tc(p, old_id, &t)?;
                }
                pin_over(pins, name, |tmp| p.pin(tmp))?;
            }
            Loaded::Sock(p) => {
                swap_cgroup_link(p, &pins.socket_link(name))?;
                pin_over(pins, name, |tmp| p.pin(tmp))?;
            }
        }
        tracing::debug!("replaced program {name} at {}", pins.prog(name).display());
    }
    Ok(())
}

/// The live pods of one interface kind (`inspect`'s `veth` or `netkit`), each once: its
/// host device's name and ifindex.
fn live_pods(dp: &Datapath, interface: &str) -> Result<Vec<(String, u32)>> {
    let mut seen = std::collections::HashSet::new();
    Ok(dp
        .endpoints()?
        .into_iter()
        .filter(|e| {
            !e.container_id.is_empty()
                && !e.removing
                && e.interface == interface
                && seen.insert(e.host_ifindex)
        })
        .map(|e| {
            (
                link::host_veth_name(&e.container_id, &e.ifname),
                e.host_ifindex,
            )
        })
        .collect())
}

/// The pins of the netkit links that run program `name` (`from_netkit` or
/// `to_netkit`): one per netkit pod.
fn netkit_links(dp: &Datapath, name: &str) -> Result<Vec<std::path::PathBuf>> {
    Ok(live_pods(dp, "netkit")?
        .into_iter()
        .map(|(ifname, _)| {
            if name == prog::FROM_NETKIT {
                dp.pins.endpoint_link(&ifname)
            } else {
                dp.pins.endpoint_egress_link(&ifname)
            }
        })
        .collect())
}

/// Where program `name` may be attached: `from_pod` and `to_pod` on every veth pod's
/// host veth (ingress, egress), the uplink programs on the uplink, the tunnel programs on
/// the tunnel device.
fn tc_targets(dp: &Datapath, name: &str) -> Result<Vec<TcTarget>> {
    let mut out = Vec::new();
    if name == prog::FROM_POD || name == prog::TO_POD {
        for (ifname, ifindex) in live_pods(dp, "veth")? {
            let (link_pin, dir) = if name == prog::FROM_POD {
                (dp.pins.endpoint_link(&ifname), TcAttachType::Ingress)
            } else {
                (dp.pins.endpoint_egress_link(&ifname), TcAttachType::Egress)
            };
            out.push(TcTarget {
                link_pin,
                ifname,
                ifindex,
                dir,
                handle: attach::TC_HANDLE,
            });
        }
        return Ok(out);
    }
    if name == prog::FROM_TUNNEL || name == prog::TO_TUNNEL {
        let ifindex = dp.node_config_view()?.tunnel_ifindex;
        if ifindex == 0 {
            return Ok(out);
        }
        let (dir, tc_dir) = if name == prog::FROM_TUNNEL {
            (Direction::Ingress, TcAttachType::Ingress)
        } else {
            (Direction::Egress, TcAttachType::Egress)
        };
        out.push(TcTarget {
            link_pin: dp.pins.tunnel_link(dir),
            ifname: super::tunnel::TUNNEL_DEVICE.to_owned(),
            ifindex,
            dir: tc_dir,
            handle: attach::uplink_handle(dp.pins.network_dir()),
        });
        return Ok(out);
    }
    let (dir, tc_dir) = match name {
        prog::UPLINK_INGRESS => (Direction::Ingress, TcAttachType::Ingress),
        prog::UPLINK_EGRESS => (Direction::Egress, TcAttachType::Egress),
        _ => return Ok(out),
    };
    let ifindex = dp.node_config_view()?.uplink_ifindex;
    if ifindex == 0 {
        return Ok(out);
    }
    let Ok(ifname) = nix::net::if_::if_indextoname(ifindex) else {
        return Ok(out);
    };
    let ifname = ifname.to_string_lossy().into_owned();
    out.push(TcTarget {
        link_pin: dp.pins.uplink_link(&ifname, dir),
        ifname,
        ifindex,
        dir: tc_dir,
        handle: attach::uplink_handle(dp.pins.network_dir()),
    });
    Ok(out)
}

/// Attaches `new` where the program `old_id` is attached at `t`, in the same mode,
/// replacing it atomically. Not attached there: left alone (CHECK reports it).
fn swap_tc(new: &mut SchedClassifier, old_id: u32, t: &TcTarget) -> Result<()> {
    let mode = attach::attached(&t.ifname, t.ifindex, t.dir, old_id, &t.link_pin, t.handle)?;
    attach_in(new, t, mode)
}

/// Attaches `new` at `t` (a pod's host veth) in the mode `from_pod` (`from_pod_id`)
/// runs in on that interface; not running there: left alone (CHECK reports it).
fn attach_beside(
    new: &mut SchedClassifier,
    from_pod_id: u32,
    dp: &Datapath,
    t: &TcTarget,
) -> Result<()> {
    let from_pod_pin = dp.pins.endpoint_link(&t.ifname);
    let mode = attach::attached(
        &t.ifname,
        t.ifindex,
        TcAttachType::Ingress,
        from_pod_id,
        &from_pod_pin,
        t.handle,
    )?;
    attach_in(new, t, mode)
}

/// Attaches `new` at `t` in `mode` (`None`: not at all).
fn attach_in(new: &mut SchedClassifier, t: &TcTarget, mode: Option<AttachMode>) -> Result<()> {
    let policy = match mode {
        Some(AttachMode::Tc) => AttachPolicy::Tc,
        Some(AttachMode::Tcx) => AttachPolicy::Tcx,
        None => return Ok(()),
    };
    attach::attach(
        new,
        &t.ifname,
        t.ifindex,
        t.dir,
        &t.link_pin,
        t.handle,
        policy,
    )?;
    Ok(())
}

/// Pins program `name` beside its pin and renames it over the old one: the pin never
/// goes missing (a reader between the two sees the old or the new program).
fn pin_over(
    pins: &Pins,
    name: &str,
    pin: impl FnOnce(&std::path::Path) -> std::result::Result<(), aya::pin::PinError>,
) -> Result<()> {
    let path = pins.prog(name);
    let tmp = pins.progs_dir().join(format!("{name}-next"));
    let _ = std::fs::remove_file(&tmp);
    pin(&tmp).map_err(|e| Error::datapath(format!("pinning {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(format!("replacing {}", path.display()), e))
}

/// Swaps `new` into the cgroup link pinned at `pin` (aya has no call for it). No pin: the
/// socket hooks are off on this node, nothing to swap.
fn swap_cgroup_link(new: &CgroupSockAddr, pin: &std::path::Path) -> Result<()> {
    use std::os::fd::AsFd as _;
    let link = match bpf_syscall::obj_get(pin) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("opening {}", pin.display()), e)),
    };
    let prog = new
        .fd()
        .map_err(|e| Error::datapath("replacing a socket program", e))?;
    bpf_syscall::link_update(link.as_fd(), prog.as_fd()).map_err(|e| {
        Error::io(
            format!("swapping the program of the cgroup link {}", pin.display()),
            e,
        )
    })
}
