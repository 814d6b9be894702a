//! Host ports (`runtimeConfig.portMappings`): `PORTMAPS` entries hostIP:hostPort/proto →
//! podIP:containerPort (IPv4) and `PORTMAPS6` the same for IPv6, each owned by one
//! (container ID, ifname).
//!
//! Families as the reference `portmap` plugin has them: a mapping without `hostIP` is a
//! host port on every node address of each family the pod has an address of; an IPv4
//! `hostIP` (`0.0.0.0` included) maps IPv4 only, an IPv6 one (`::` included) IPv6 only.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_ebpf_common::{
    map as map_name, owner_id, proto, PortKey, PortKey6, PortTarget, PortTarget6,
};

use super::{
    maps::{self, ipv4_from_map, ipv4_to_map, ipv6_from_map, ipv6_to_map},
    owner_label, Datapath,
};
use crate::{
    cni::config::PortMapping,
    error::{Error, Result},
};

pub(super) fn proto_number(p: &str) -> Result<u8> {
    match p.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        other => Err(Error::config(
            "runtimeConfig.portMappings.protocol",
            format!("{other:?} is not supported (tcp or udp)"),
        )),
    }
}

/// The map entries of one mapping for a pod with addresses `pod_ips`: at most one per
/// family. A mapping that gets none (an IPv6 `hostIP` for a pod with no IPv6 address,
/// …) is error 7 naming it.
pub(super) struct Planned {
    pub(super) v4: Option<(PortKey, PortTarget)>,
    pub(super) v6: Option<(PortKey6, PortTarget6)>,
}

pub(super) fn plan(pm: &PortMapping, pod_ips: &[IpAddr], owner: u64) -> Result<Planned> {
    let proto = proto_number(&pm.protocol)?;
    let port = maps::port_to_map(pm.host_port);
    let cport = maps::port_to_map(pm.container_port);
    let pod4 = pod_ips.iter().find_map(|ip| match ip {
        IpAddr::V4(a) => Some(*a),
        IpAddr::V6(_) => None,
    });
    let pod6 = pod_ips.iter().find_map(|ip| match ip {
        IpAddr::V6(a) => Some(*a),
        IpAddr::V4(_) => None,
    });
    let (want4, want6, host4, host6) = match pm.host_ip {
        None => (true, true, Ipv4Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED),
        Some(IpAddr::V4(a)) => (true, false, a, Ipv6Addr::UNSPECIFIED),
        Some(IpAddr::V6(a)) => (false, true, Ipv4Addr::UNSPECIFIED, a),
    };
    let v4 = pod4.filter(|_| want4).map(|pod| {
        (
            PortKey {
                addr: ipv4_to_map(host4),
                port,
                proto,
                _pad: 0,
            },
            PortTarget {
                addr: ipv4_to_map(pod),
                port: cport,
                _pad: 0,
                owner,
            },
        )
    });
    let v6 = pod6.filter(|_| want6).map(|pod| {
        (
            PortKey6 {
                addr: ipv6_to_map(host6),
                port,
                proto,
                _pad: 0,
            },
            PortTarget6 {
                addr: ipv6_to_map(pod),
                port: cport,
                _pad: [0; 3],
                owner,
            },
        )
    });
    if v4.is_none() && v6.is_none() {
        let family = match pm.host_ip {
            Some(IpAddr::V6(_)) => "an IPv6 hostIP needs an IPv6 pod address",
            Some(IpAddr::V4(_)) => "an IPv4 hostIP needs an IPv4 pod address",
            None => "the pod has no address",
        };
        return Err(Error::config(
            "runtimeConfig.portMappings.hostIP",
            format!("hostPort {}: {family}", pm.host_port),
        ));
    }
    Ok(Planned { v4, v6 })
}

/// A label for error messages: `hostPort 8080/tcp on 192.0.2.1`.
fn label(pm: &PortMapping) -> String {
    format!(
        "hostPort {}/{}{}",
        pm.host_port,
        pm.protocol.to_ascii_lowercase(),
        pm.host_ip.map(|i| format!(" on {i}")).unwrap_or_default()
    )
}

impl Datapath {
    /// Maps host ports to the pod with addresses `pod_ips` (see the module's families). A
    /// port already mapped for another container (also a wildcard vs. a specific `hostIP`
    /// on the same port) is an error naming that container; nothing of this call stays
    /// behind on error.
    pub fn add_port_mappings(
        &self,
        owner: (&str, &str),
        pod_ips: &[IpAddr],
        mappings: &[PortMapping],
    ) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        let record = maps::owner_record(owner.0, owner.1)?;
        let mut wanted = Vec::new();
        for pm in mappings {
            wanted.push((plan(pm, pod_ips, oid)?, pm));
        }
        let mut m = self.maps()?;
        let existing = maps::entries(&m.portmaps()?);
        let existing6 = maps::entries(&m.portmaps6()?);
        for (p, pm) in &wanted {
            let clash4 = p.v4.and_then(|(k, _)| {
                existing.iter().find(|(ek, ev)| {
                    ev.owner != oid
                        && ek.port == k.port
                        && ek.proto == k.proto
                        && (ek.addr == k.addr || ek.addr == 0 || k.addr == 0)
                })
            });
            let clash6 = p.v6.and_then(|(k, _)| {
                existing6.iter().find(|(ek, ev)| {
                    ev.owner != oid
                        && ek.port == k.port
                        && ek.proto == k.proto
                        && (ek.addr == k.addr || ek.addr == [0; 4] || k.addr == [0; 4])
                })
            });
            let who = clash4
                .map(|(_, v)| v.owner)
                .or_else(|| clash6.map(|(_, v)| v.owner));
            if let Some(who) = who {
                let who = owner_label(&mut m, who);
                return Err(Error::datapath(
                    format!("mapping {}", label(pm)),
                    format!("the port is already mapped to {who}"),
                ));
            }
        }
        m.owners()?
            .insert(oid, record, 0)
            .map_err(|e| maps::err(map_name::OWNERS, "insert", e))?;
        let mut done4 = Vec::new();
        let mut done6 = Vec::new();
        let mut failed = None;
        for (p, pm) in &wanted {
            if let Some((k, v)) = p.v4 {
                match m.portmaps()?.insert(k, v, 0) {
                    Ok(()) => done4.push(k),
                    Err(e) => {
                        failed = Some(maps::err(
                            map_name::PORTMAPS,
                            format!("insert {}", label(pm)),
                            e,
                        ));
                        break;
                    }
                }
            }
            if let Some((k, v)) = p.v6 {
                match m.portmaps6()?.insert(k, v, 0) {
                    Ok(()) => done6.push(k),
                    Err(e) => {
                        failed = Some(maps::err(
                            map_name::PORTMAPS6,
                            format!("insert {}", label(pm)),
                            e,
                        ));
                        break;
                    }
                }
            }
        }
        if let Some(e) = failed {
            let mut h = m.portmaps()?;
            for d in &done4 {
                let _ = h.remove(d);
            }
            let mut h6 = m.portmaps6()?;
            for d in &done6 {
                let _ = h6.remove(d);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Removes the host ports of `owner` (ADD's undo). Their flows go with the pod's
    /// endpoint entries, which the undo removes next ([`Datapath::detach_endpoint`]).
    /// Idempotent.
    pub fn remove_port_mappings(&self, owner: (&str, &str)) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        self.take_port_mappings(oid)?;
        self.forget(oid)
    }

    /// Removes `owner`'s host ports (both families); returns the pod addresses they led to.
    pub(super) fn take_port_mappings(&self, owner: u64) -> Result<Vec<IpAddr>> {
        let mut pods: Vec<IpAddr> = Vec::new();
        let mut m = self.maps()?;
        let mut h = m.portmaps()?;
        for (k, v) in maps::entries(&h) {
            if v.owner == owner {
                maps::remove(&mut h, &k, map_name::PORTMAPS)?;
                let pod = IpAddr::V4(ipv4_from_map(v.addr));
                if !pods.contains(&pod) {
                    pods.push(pod);
                }
            }
        }
        let mut h6 = m.portmaps6()?;
        for (k, v) in maps::entries(&h6) {
            if v.owner == owner {
                maps::remove(&mut h6, &k, map_name::PORTMAPS6)?;
                let pod = IpAddr::V6(ipv6_from_map(v.addr));
                if !pods.contains(&pod) {
                    pods.push(pod);
                }
            }
        }
        Ok(pods)
    }
}
