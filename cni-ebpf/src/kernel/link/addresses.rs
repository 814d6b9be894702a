//! Addresses on links (adding, and listing per family with the kernel's flags) and
//! permanent neighbour entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressScope},
    AddressFamily,
};

use super::{is_errno, retry_dump, Nl};
use crate::error::{Error, Result};

impl Nl {
    /// Adds `addr` to link `index`. With `nodad`, IPv6 duplicate address detection is
    /// skipped so the address is usable at once.
    pub async fn add_address(&self, index: u32, addr: IpNet, nodad: bool) -> Result<()> {
        let mut req = self
            .handle
            .address()
            .add(index, addr.addr(), addr.prefix_len());
        if nodad && addr.addr().is_ipv6() {
            let msg = req.message_mut();
            msg.header.flags |= AddressHeaderFlags::Nodad;
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::EEXIST) => Ok(()),
            Err(e) => Err(Error::netlink(
                format!("adding address {addr} to link #{index}"),
                e,
            )),
        }
    }

    /// A permanent neighbour entry on link `index`: `ip` is at `mac`. Replaces an entry
    /// that is already there.
    pub async fn add_permanent_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: [u8; 6],
    ) -> Result<()> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .map_err(|e| {
                Error::netlink(
                    format!("adding the neighbour entry {ip} on link #{index}"),
                    e,
                )
            })
    }

    /// The addresses on link `index` (global and link scope).
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNet>> {
        let msgs: Vec<_> = retry_dump("listing addresses", || async {
            self.handle
                .address()
                .get()
                .set_link_index_filter(index)
                .execute()
                .try_collect()
                .await
        })
        .await?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                let addr = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })?;
                IpNet::new(addr, m.header.prefix_len).ok()
            })
            .collect())
    }

    /// IPv4 addresses with their ifindex: every interface's, or `index`'s only (filtered by
    /// the kernel on a [`Nl::connect_strict`] handle, here otherwise). The family is
    /// filtered by the kernel in any mode: each host veth also carries IPv6 addresses.
    pub async fn ipv4_addresses(&self, index: Option<u32>) -> Result<Vec<(Ipv4Addr, u32)>> {
        let msgs: Vec<_> = retry_dump("listing the node's IPv4 addresses", || async {
            let mut req = self.handle.address().get();
            req.message_mut().header.family = AddressFamily::Inet;
            if let Some(i) = index {
                req.message_mut().header.index = i;
            }
            req.execute().try_collect().await
        })
        .await?;
        Ok(msgs
            .iter()
            .filter(|m| index.is_none_or(|i| m.header.index == i))
            .filter_map(|m| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip))
                    | AddressAttribute::Address(IpAddr::V4(ip)) => Some((*ip, m.header.index)),
                    _ => None,
                })
            })
            .collect())
    }

    /// Every IPv6 address of the node (or of device `index`) with its ifindex, and
    /// whether it may source the node's traffic: global scope, and neither tentative
    /// (duplicate address detection under way), failed DAD nor deprecated.
    pub async fn ipv6_addresses(&self, index: Option<u32>) -> Result<Vec<(Ipv6Addr, u32, bool)>> {
        let msgs: Vec<_> = retry_dump("listing the node's IPv6 addresses", || async {
            let mut req = self.handle.address().get();
            req.message_mut().header.family = AddressFamily::Inet6;
            if let Some(i) = index {
                req.message_mut().header.index = i;
            }
            req.execute().try_collect().await
        })
        .await?;
        let unusable = AddressHeaderFlags::Tentative
            | AddressHeaderFlags::Dadfailed
            | AddressHeaderFlags::Deprecated;
        Ok(msgs
            .iter()
            .filter(|m| index.is_none_or(|i| m.header.index == i))
            .filter_map(|m| {
                let usable = m.header.scope == AddressScope::Universe
                    && !m.header.flags.intersects(unusable);
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(IpAddr::V6(ip)) => {
                        Some((*ip, m.header.index, usable))
                    }
                    _ => None,
                })
            })
            .collect())
    }
}
