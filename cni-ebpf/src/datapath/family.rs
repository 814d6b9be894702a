//! IPv4 and IPv6 in userspace, written once. The decisions about a pod's addresses are the
//! same for both families; what differs is the map an address lives in and the shape of
//! its key. [`Family`] names those for each family (the eBPF crate's `Family` does the same
//! for the programs), and [`Maps`]' per-address methods below pick the family from the
//! address, so a caller loops over a pod's addresses once, whatever their families.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{HashMap, MapData};
use cni_ebpf_common::{map as map_name, EndpointInfo, EndpointKey, EndpointKey6};

use super::maps::{self, ipv4_from_map, ipv4_to_map, ipv6_from_map, ipv6_to_map, Maps};
use crate::error::Result;

/// What differs between the families for the per-address maps.
trait Family: Copy + Into<IpAddr> {
    /// The key of the family's endpoint map.
    type EndpointKey: aya::Pod + PartialEq;
    /// The name of the family's endpoint map (`ENDPOINTS`, `ENDPOINTS6`).
    const ENDPOINTS: &'static str;
    /// The family's endpoint map.
    fn endpoints(m: &mut Maps) -> Result<HashMap<&mut MapData, Self::EndpointKey, EndpointInfo>>;
    /// This address as the endpoint map's key.
    fn endpoint_key(self) -> Self::EndpointKey;
    /// The address of an endpoint map's key.
    fn of_endpoint_key(k: &Self::EndpointKey) -> Self;
}

impl Family for Ipv4Addr {
    type EndpointKey = EndpointKey;
    const ENDPOINTS: &'static str = map_name::ENDPOINTS;
    fn endpoints(m: &mut Maps) -> Result<HashMap<&mut MapData, EndpointKey, EndpointInfo>> {
        m.endpoints()
    }
    fn endpoint_key(self) -> EndpointKey {
        EndpointKey {
            addr: ipv4_to_map(self),
        }
    }
    fn of_endpoint_key(k: &EndpointKey) -> Self {
        ipv4_from_map(k.addr)
    }
}

impl Family for Ipv6Addr {
    type EndpointKey = EndpointKey6;
    const ENDPOINTS: &'static str = map_name::ENDPOINTS6;
    fn endpoints(m: &mut Maps) -> Result<HashMap<&mut MapData, EndpointKey6, EndpointInfo>> {
        m.endpoints6()
    }
    fn endpoint_key(self) -> EndpointKey6 {
        EndpointKey6 {
            addr: ipv6_to_map(self),
        }
    }
    fn of_endpoint_key(k: &EndpointKey6) -> Self {
        ipv6_from_map(k.addr)
    }
}

fn endpoint_of<F: Family>(m: &mut Maps, ip: F) -> Result<Option<EndpointInfo>> {
    maps::get(&F::endpoints(m)?, &ip.endpoint_key(), F::ENDPOINTS)
}

fn put_endpoint_of<F: Family>(m: &mut Maps, ip: F, info: EndpointInfo, what: &str) -> Result<()> {
    F::endpoints(m)?
        .insert(ip.endpoint_key(), info, 0)
        .map_err(|e| maps::err(F::ENDPOINTS, format!("{what} {}", ip.into()), e))
}

fn remove_endpoint_of<F: Family>(m: &mut Maps, ip: F) -> Result<()> {
    maps::remove(&mut F::endpoints(m)?, &ip.endpoint_key(), F::ENDPOINTS)
}

fn endpoints_of<F: Family>(m: &mut Maps, out: &mut Vec<(IpAddr, EndpointInfo)>) -> Result<()> {
    out.extend(
        maps::entries(&F::endpoints(m)?)
            .into_iter()
            .map(|(k, v)| (F::of_endpoint_key(&k).into(), v)),
    );
    Ok(())
}

impl Maps {
    /// The endpoint entry of `ip`, from its family's map.
    pub fn endpoint(&mut self, ip: IpAddr) -> Result<Option<EndpointInfo>> {
        match ip {
            IpAddr::V4(a) => endpoint_of(self, a),
            IpAddr::V6(a) => endpoint_of(self, a),
        }
    }

    /// Writes the endpoint entry of `ip` in its family's map; `what` names the write in
    /// an error.
    pub fn put_endpoint(&mut self, ip: IpAddr, info: EndpointInfo, what: &str) -> Result<()> {
        match ip {
            IpAddr::V4(a) => put_endpoint_of(self, a, info, what),
            IpAddr::V6(a) => put_endpoint_of(self, a, info, what),
        }
    }

    /// Removes the endpoint entry of `ip`, if there is one.
    pub fn remove_endpoint(&mut self, ip: IpAddr) -> Result<()> {
        match ip {
            IpAddr::V4(a) => remove_endpoint_of(self, a),
            IpAddr::V6(a) => remove_endpoint_of(self, a),
        }
    }

    /// Every endpoint entry of both families, by address.
    pub fn all_endpoints(&mut self) -> Result<Vec<(IpAddr, EndpointInfo)>> {
        let mut out = Vec::new();
        endpoints_of::<Ipv4Addr>(self, &mut out)?;
        endpoints_of::<Ipv6Addr>(self, &mut out)?;
        Ok(out)
    }
}
