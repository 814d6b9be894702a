//! Host ports (`runtimeConfig.portMappings`): `PORTMAPS` entries hostIP:hostPort/proto →
//! podIP:containerPort, each owned by one (container ID, ifname).

use std::net::{IpAddr, Ipv4Addr};

use cni_ebpf_common::{map as map_name, owner_id, proto, PortKey, PortTarget};

use super::{
    maps::{self, ipv4_from_map, ipv4_to_map},
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

impl Datapath {
    /// Maps host ports to `pod_ip`. A port already mapped for another container (also a
    /// wildcard vs. a specific `hostIP` on the same port) is an error naming that
    /// container; nothing of this call stays behind on error.
    pub fn add_port_mappings(
        &self,
        owner: (&str, &str),
        pod_ip: Ipv4Addr,
        mappings: &[PortMapping],
    ) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        let record = maps::owner_record(owner.0, owner.1)?;
        let mut wanted = Vec::new();
        for pm in mappings {
            wanted.push((
                port_key(pm)?,
                PortTarget {
                    addr: ipv4_to_map(pod_ip),
                    port: maps::port_to_map(pm.container_port),
                    _pad: 0,
                    owner: oid,
                },
                pm,
            ));
        }
        let mut m = self.maps()?;
        let existing = maps::entries(&m.portmaps()?);
        for (k, _, pm) in &wanted {
            let clash = existing.iter().find(|(ek, ev)| {
                ev.owner != oid
                    && ek.port == k.port
                    && ek.proto == k.proto
                    && (ek.addr == k.addr || ek.addr == 0 || k.addr == 0)
            });
            if let Some((_, ev)) = clash {
                let who = owner_label(&mut m, ev.owner);
                return Err(Error::datapath(
                    format!(
                        "mapping hostPort {}/{}{}",
                        pm.host_port,
                        pm.protocol.to_ascii_lowercase(),
                        pm.host_ip.map(|i| format!(" on {i}")).unwrap_or_default()
                    ),
                    format!("the port is already mapped to {who}"),
                ));
            }
        }
        m.owners()?
            .insert(oid, record, 0)
            .map_err(|e| maps::err(map_name::OWNERS, "insert", e))?;
        let mut h = m.portmaps()?;
        let mut done = Vec::new();
        for (k, v, pm) in &wanted {
            if let Err(e) = h.insert(*k, *v, 0) {
                for d in &done {
                    let _ = h.remove(d);
                }
                return Err(maps::err(
                    map_name::PORTMAPS,
                    format!("insert hostPort {}", pm.host_port),
                    e,
                ));
            }
            done.push(*k);
        }
        Ok(())
    }

    /// Removes the host ports of `owner` and every NAT entry of the pods they pointed to,
    /// so an old flow never reaches a new pod. Idempotent.
    pub fn remove_port_mappings(&self, owner: (&str, &str)) -> Result<()> {
        let oid = owner_id(owner.0.as_bytes(), owner.1.as_bytes());
        let pods: Vec<IpAddr> = self
            .take_port_mappings(oid)?
            .into_iter()
            .map(IpAddr::V4)
            .collect();
        self.forget(oid, &pods)
    }

    /// Removes `owner`'s host ports; returns the pod addresses they led to.
    pub(super) fn take_port_mappings(&self, owner: u64) -> Result<Vec<Ipv4Addr>> {
        let mut pods = Vec::new();
        let mut m = self.maps()?;
        let mut h = m.portmaps()?;
        for (k, v) in maps::entries(&h) {
            if v.owner == owner {
                maps::remove(&mut h, &k, map_name::PORTMAPS)?;
                if !pods.contains(&ipv4_from_map(v.addr)) {
                    pods.push(ipv4_from_map(v.addr));
                }
            }
        }
        Ok(pods)
    }
}

/// The `PORTMAPS` key of a mapping: `hostIP` (0: every node address; unspecified counts
/// as unset), host port and protocol. An IPv6 `hostIP` is refused (error 2): the programs
/// have IPv4 host ports only.
pub(super) fn port_key(pm: &PortMapping) -> Result<PortKey> {
    let proto = proto_number(&pm.protocol)?;
    let addr = match pm.host_ip {
        None => 0,
        Some(IpAddr::V4(a)) if a.is_unspecified() => 0,
        Some(IpAddr::V4(a)) => ipv4_to_map(a),
        Some(IpAddr::V6(a)) if a.is_unspecified() => 0,
        Some(IpAddr::V6(a)) => {
            return Err(Error::UnsupportedField {
                field: "runtimeConfig.portMappings.hostIP".into(),
                value: format!("\"{a}\" (IPv6 host ports are not supported yet)"),
            })
        }
    };
    Ok(PortKey {
        addr,
        port: maps::port_to_map(pm.host_port),
        proto,
        _pad: 0,
    })
}
