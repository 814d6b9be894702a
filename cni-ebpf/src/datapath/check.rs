//! CHECK's read-back: the live endpoint entries (both families), `from_pod` on the host
//! veth, the host ports, the uplink programs and the IPv6 programs' slots compared with
//! what ADD set up. Each mismatch is an
//! [`Error::Check`] naming it.

use std::net::IpAddr;

use aya::programs::TcAttachType;
use cni_ebpf_common::{map as map_name, owner_id, prog, EndpointFlags, EndpointInfo, SRC6_OWN};

use super::{
    attach,
    maps::{self, ipv4_from_map, ipv6_from_map, port_from_map},
    netkit::{self, NetkitHook},
    owner_label, proto_name, Datapath, Endpoint,
};
use crate::{
    cni::config::{format_mac, AttachPolicy, PortMapping},
    error::{Error, Result},
};

impl Datapath {
    /// Compares the live datapath with what ADD set up for `ep` and `mappings`; the first
    /// mismatch is an [`Error::Check`] naming it.
    pub fn check_endpoint(&self, ep: &Endpoint, mappings: &[PortMapping]) -> Result<()> {
        self.check_endpoint_accepting(ep, &[ep.pod_mac], mappings)
    }

    /// [`Datapath::check_endpoint`], with the endpoint entry's pod MAC allowed to be any of
    /// `pod_macs` (a later chained plugin may have changed the pod's MAC after ADD wrote
    /// the entry; the spec has CHECK allow that).
    pub fn check_endpoint_accepting(
        &self,
        ep: &Endpoint,
        pod_macs: &[[u8; 6]],
        mappings: &[PortMapping],
    ) -> Result<()> {
        let owner = owner_id(ep.container_id.as_bytes(), ep.ifname.as_bytes());
        {
            let mut m = self.maps()?;
            let mut found = Vec::new();
            for ip in &ep.ips {
                found.push((*ip, m.endpoint(*ip)?));
            }
            for (ip, v) in found {
                check_entry(&mut m, ep, owner, pod_macs, ip, v)?;
            }
        }

        self.check_sources(ep)?;
        self.check_endpoint_attachment(ep)?;
        self.check_pacing(ep.host_ifindex, ep.egress_rate.as_ref())?;
        check_no_chained_shaping(ep)?;
        self.check_port_mappings(owner, &ep.ips, mappings)?;
        self.check_uplink()
    }

    /// The pod's source entries (IPv4 allow-list, IPv6 own addresses and allow-list) and
    /// its NAT share are exactly what ADD wrote.
    fn check_sources(&self, ep: &Endpoint) -> Result<()> {
        let mut m = self.maps()?;
        let mut live4: Vec<String> = m
            .src_allow()?
            .keys()
            .filter_map(std::result::Result::ok)
            .filter(|k| u32::from_be(k.data().ifindex_be) == ep.host_ifindex)
            .map(|k| format!("{}/{}", ipv4_from_map(k.data().addr), k.prefix_len() - 32))
            .collect();
        let mut want4: Vec<String> = super::endpoints::v4_nets(&ep.allowed_sources)
            .map(|n| n.trunc().to_string())
            .collect();
        live4.sort();
        want4.sort();
        want4.dedup();
        if live4 != want4 {
            return Err(Error::Check(format!(
                "the IPv4 source allow-list of host veth {} is [{}], expected [{}]",
                ep.host_ifname,
                live4.join(", "),
                want4.join(", ")
            )));
        }
        let allow6 = m.src_allow6()?;
        let mut live6: Vec<String> = allow6
            .keys()
            .filter_map(std::result::Result::ok)
            .filter(|k| u32::from_be(k.data().ifindex_be) == ep.host_ifindex)
            .map(|k| {
                let own = allow6.get(&k, 0).is_ok_and(|v| v == SRC6_OWN);
                let a = std::net::Ipv6Addr::from(k.data().addr);
                format!(
                    "{a}/{}{}",
                    k.prefix_len() - 32,
                    if own { " (own)" } else { "" }
                )
            })
            .collect();
        let mut want6: Vec<String> = super::endpoints::sources6(ep)
            .into_iter()
            .map(|(n, what)| {
                format!(
                    "{}{}",
                    n.trunc(),
                    if what == SRC6_OWN { " (own)" } else { "" }
                )
            })
            .collect();
        live6.sort();
        want6.sort();
        if live6 != want6 {
            return Err(Error::Check(format!(
                "the IPv6 sources of host veth {} are [{}], expected [{}]",
                ep.host_ifname,
                live6.join(", "),
                want6.join(", ")
            )));
        }
        let share = maps::get(&m.nat_use()?, &ep.host_ifindex, map_name::NAT_USE)?;
        match share {
            None => Err(Error::Check(format!(
                "host veth {} has no NAT share (natFlowsPerPod)",
                ep.host_ifname
            ))),
            Some(u) if u.cap != ep.nat_flows.saturating_mul(2) => Err(Error::Check(format!(
                "the NAT share of host veth {} allows {} flows, expected {} (natFlowsPerPod)",
                ep.host_ifname,
                u.cap / 2,
                ep.nat_flows
            ))),
            Some(_) => Ok(()),
        }
    }

    fn check_port_mappings(
        &self,
        owner: u64,
        ips: &[IpAddr],
        mappings: &[PortMapping],
    ) -> Result<()> {
        let mut m = self.maps()?;
        let live: Vec<_> = maps::entries(&m.portmaps()?)
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .collect();
        let live6: Vec<_> = maps::entries(&m.portmaps6()?)
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .collect();
        let mut expected = Vec::new();
        let mut expected6 = Vec::new();
        for pm in mappings {
            let plan = super::portmaps::plan(pm, ips, owner)?;
            let label = format!(
                "hostPort {}/{}{} → containerPort {}",
                pm.host_port,
                pm.protocol.to_ascii_lowercase(),
                pm.host_ip.map(|i| format!(" on {i}")).unwrap_or_default(),
                pm.container_port
            );
            let mut found = Vec::new();
            if let Some((k, want)) = plan.v4 {
                let v = maps::get(&m.portmaps()?, &k, map_name::PORTMAPS)?;
                found.push((
                    "IPv4",
                    v.map(|v| (v.owner, IpAddr::V4(ipv4_from_map(v.addr)), v.port)),
                    (IpAddr::V4(ipv4_from_map(want.addr)), want.port),
                ));
                expected.push(k);
            }
            if let Some((k, want)) = plan.v6 {
                let v = maps::get(&m.portmaps6()?, &k, map_name::PORTMAPS6)?;
                found.push((
                    "IPv6",
                    v.map(|v| (v.owner, IpAddr::V6(ipv6_from_map(v.addr)), v.port)),
                    (IpAddr::V6(ipv6_from_map(want.addr)), want.port),
                ));
                expected6.push(k);
            }
            for (family, got, (want_addr, want_port)) in found {
                let Some((who, addr, port)) = got else {
                    return Err(Error::Check(format!(
                        "port mapping {label} is missing ({family})"
                    )));
                };
                if who != owner {
                    let who = owner_label(&mut m, who);
                    return Err(Error::Check(format!(
                        "port mapping {label} belongs to {who} ({family})"
                    )));
                }
                if (addr, port) != (want_addr, want_port) {
                    return Err(Error::Check(format!(
                        "port mapping {label} points at {addr}:{} ({family})",
                        port_from_map(port)
                    )));
                }
            }
        }
        let unexpected = live
            .iter()
            .find(|(k, _)| !expected.contains(k))
            .map(|(k, v)| (k.port, k.proto, IpAddr::V4(ipv4_from_map(v.addr)), v.port))
            .or_else(|| {
                live6
                    .iter()
                    .find(|(k, _)| !expected6.contains(k))
                    .map(|(k, v)| (k.port, k.proto, IpAddr::V6(ipv6_from_map(v.addr)), v.port))
            });
        if let Some((hp, p, addr, port)) = unexpected {
            return Err(Error::Check(format!(
                "unexpected port mapping hostPort {}/{} → {addr}:{} (not in runtimeConfig.portMappings)",
                port_from_map(hp),
                proto_name(p),
                port_from_map(port)
            )));
        }
        Ok(())
    }

    /// `from_pod` runs on the host veth's ingress and `to_pod` on its egress, each exactly
    /// once: as our clsact filter or through the tcx link pinned for it. (A clsact filter
    /// goes when someone runs `tc qdisc del dev <veth> clsact`; a tcx link only with its
    /// pin or the device.)
    fn check_endpoint_attachment(&self, ep: &Endpoint) -> Result<()> {
        if ep.netkit {
            return self.check_netkit_attachment(ep);
        }
        // `from_pod` first: the pod's own traffic is what a missing program shows first.
        for p in self.pod_programs(ep).into_iter().rev() {
            let (prog_name, dir, pin) = (p.name, p.dir, p.pin);
            let hook = if dir == TcAttachType::Egress {
                "egress"
            } else {
                "ingress"
            };
            let id = attach::program_id(&self.program(prog_name)?)?;
            let name = &ep.host_ifname;
            let index = ep.host_ifindex;
            let handle = attach::TC_HANDLE;
            if attach::attached(name, index, dir, id, &pin, handle)?.is_none() {
                return Err(Error::Check(format!(
                    "the cni-ebpf program ({prog_name}, id {id}) is not attached to host veth \
                     {name} ({hook}): neither a clsact filter at priority {} handle {:#x} nor \
                     a tcx link pinned at {} runs it (was its clsact qdisc deleted?)",
                    attach::TC_PRIORITY,
                    attach::TC_HANDLE,
                    pin.display()
                )));
            }
            if attach::attached_twice(name, index, dir, id, handle)? {
                return Err(Error::Check(format!(
                    "the cni-ebpf program ({prog_name}, id {id}) runs twice on host veth \
                     {name} ({hook}): as a clsact filter and as a tcx link"
                )));
            }
        }
        Ok(())
    }

    /// A netkit pair: `from_netkit` runs in the pod's transmit path and `to_netkit` in its
    /// host device's, each through the netkit link pinned for it. (Without them the pair
    /// drops every packet.)
    fn check_netkit_attachment(&self, ep: &Endpoint) -> Result<()> {
        for p in self.pod_programs(ep).into_iter().rev() {
            let (prog_name, hook, pin) = (p.name, NetkitHook::of(p.dir), p.pin);
            let id = attach::program_id(&self.program(prog_name)?)?;
            let name = &ep.host_ifname;
            let found = netkit::pinned(&pin)?;
            // A link names the device whose transmit runs its program: the host device
            // for `to_netkit`, the pod's interface (an index in the pod's namespace) for
            // `from_netkit`. A link whose device is gone names none (0).
            let attached = found.is_some_and(|(index, h, prog)| {
                h == Some(hook)
                    && prog == id
                    && match hook {
                        NetkitHook::Primary => index == ep.host_ifindex,
                        NetkitHook::Peer => index != 0,
                    }
            });
            if !attached {
                return Err(Error::Check(format!(
                    "the cni-ebpf program ({prog_name}, id {id}) is not attached to netkit \
                     {name} (#{}, {hook:?}) through the link pinned at {}: found {}",
                    ep.host_ifindex,
                    pin.display(),
                    match found {
                        None => "no netkit link".to_owned(),
                        Some((index, hook, prog)) => {
                            format!("a link on #{index} ({hook:?}) running program {prog}")
                        }
                    }
                )));
            }
        }
        Ok(())
    }

    fn check_uplink(&self) -> Result<()> {
        self.check_calls6()?;
        let cfg = self.node_config_raw()?;
        let name = ifname_of(cfg.uplink_ifindex).ok_or_else(|| {
            Error::Check(format!(
                "the uplink (ifindex {}) the programs were configured for no longer exists",
                cfg.uplink_ifindex
            ))
        })?;
        if !self.uplink_attached(&name, cfg.uplink_ifindex, AttachPolicy::Auto)? {
            return Err(Error::Check(format!(
                "the uplink programs are not attached to {name}"
            )));
        }
        Ok(())
    }
}

impl Datapath {
    /// Every slot of `CALLS6` holds its pinned IPv6 program: an empty or foreign slot
    /// would pass (or misroute) every IPv6 packet of the node.
    fn check_calls6(&self) -> Result<()> {
        let pin = self.pins.map(map_name::CALLS6);
        let data = aya::maps::MapData::from_pin(&pin)
            .map_err(|e| Error::datapath(format!("opening {}", pin.display()), e))?;
        // A program array reads back, from userspace, as the id of the program in a slot.
        let map = aya::maps::Map::Array(data);
        let slots: aya::maps::Array<&aya::maps::MapData, u32> = aya::maps::Array::try_from(&map)
            .map_err(|e| Error::datapath(format!("opening {}", pin.display()), e))?;
        for (name, slot) in prog::CALLS6 {
            let want = attach::program_id(&self.program(name)?)?;
            match slots.get(&slot, 0) {
                Ok(id) if id == want => {}
                Ok(id) => {
                    return Err(Error::Check(format!(
                        "slot {slot} of {} holds program id {id}, not {name} (id {want})",
                        map_name::CALLS6
                    )))
                }
                Err(_) => {
                    return Err(Error::Check(format!(
                        "slot {slot} of {} is empty: {name} is not called, IPv6 packets pass \
                         unhandled",
                        map_name::CALLS6
                    )))
                }
            }
        }
        Ok(())
    }
}

/// One endpoint entry of `ep` (address `ip`, `v` as found) is what ADD wrote.
fn check_entry(
    m: &mut maps::Maps,
    ep: &Endpoint,
    owner: u64,
    pod_macs: &[[u8; 6]],
    ip: IpAddr,
    v: Option<EndpointInfo>,
) -> Result<()> {
    let Some(v) = v else {
        return Err(Error::Check(format!(
            "the endpoint map has no entry for {ip} (container {}, {})",
            ep.container_id, ep.ifname
        )));
    };
    if v.owner != owner {
        let who = owner_label(m, v.owner);
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} belongs to {who}, not container {} ({})",
            ep.container_id, ep.ifname
        )));
    }
    if v.ifindex != ep.host_ifindex {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} points at ifindex {}, but host veth {} is ifindex {}",
            v.ifindex, ep.host_ifname, ep.host_ifindex
        )));
    }
    if v.host_mac != ep.host_mac {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} has host MAC {}, expected {}",
            format_mac(&v.host_mac),
            format_mac(&ep.host_mac)
        )));
    }
    if !pod_macs.contains(&v.pod_mac) {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} has pod MAC {}, expected {}",
            format_mac(&v.pod_mac),
            format_mac(&ep.pod_mac)
        )));
    }
    if !v.flags.contains(EndpointFlags::ACTIVE) {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} is not active"
        )));
    }
    if v.flags.contains(EndpointFlags::PACED) != ep.egress_rate.is_some() {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} is {}marked as paced (egress rate)",
            if ep.egress_rate.is_some() { "not " } else { "" }
        )));
    }
    if v.flags.contains(EndpointFlags::NETKIT) != ep.netkit {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} says the pod's interface is a {} pair, but it is a \
             {} pair",
            if ep.netkit { "veth" } else { "netkit" },
            if ep.netkit { "netkit" } else { "veth" },
        )));
    }
    // The other way round is what entries of older builds say, and only costs a lookup.
    if v.flags.contains(EndpointFlags::NO_HOST_PORTS) && ep.host_ports {
        return Err(Error::Check(format!(
            "the endpoint entry for {ip} is marked as having no host ports, but the pod has \
             port mappings: replies of its hairpin flows would not be translated"
        )));
    }
    Ok(())
}

/// The reference `bandwidth` plugin chained after cni-ebpf shapes with an `ingress` qdisc
/// (redirecting to an ifb) and a root `tbf` on the host veth. Our programs redirect the
/// pod's packets before the first and past the second, so its limits would silently not
/// hold (with `attach: "tc"` its ADD already fails: our clsact qdisc owns that hook).
fn check_no_chained_shaping(ep: &Endpoint) -> Result<()> {
    let qdiscs = crate::kernel::tc::qdiscs(ep.host_ifindex).map_err(|e| {
        Error::io(
            format!("listing the qdiscs of host veth {}", ep.host_ifname),
            e,
        )
    })?;
    let foreign: Vec<&str> = qdiscs
        .iter()
        .filter(|q| q.kind == "ingress" || (q.kind == "tbf" && q.parent == crate::kernel::tc::ROOT))
        .map(|q| q.kind.as_str())
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    Err(Error::Check(format!(
        "host veth {} has {} qdisc(s) of another shaper (the reference bandwidth plugin?): \
         cni-ebpf's redirects bypass them, so their limits do not hold. Remove that plugin \
         from the chain and give cni-ebpf the capability instead (\"capabilities\": \
         {{\"bandwidth\": true}}): it enforces runtimeConfig.bandwidth.egressRate itself",
        ep.host_ifname,
        foreign.join(" and ")
    )))
}

fn ifname_of(ifindex: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..len].to_vec()).ok()
}
