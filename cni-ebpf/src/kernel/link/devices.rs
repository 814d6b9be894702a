//! Creating and removing links: veth and netkit pairs, VXLAN devices, setting them up,
//! labelling host ends with their alias, retiring and deleting them, and listing them by
//! device group or alias.

use futures::TryStreamExt;
use netlink_packet_route::link::{
    InfoData, InfoNetkit, InfoVeth, LinkAttribute, LinkMessage, NetkitMode, NetkitPolicy,
};
use rtnetlink::{LinkMessageBuilder, LinkNetkit, LinkUnspec, LinkVeth, LinkVxlan, LinkWireguard};

use super::{creating, is_errno, naming::is_pod_pair_end, retry_dump, Link, Nl};
use crate::{
    error::{Error, Result},
    kernel::netns::Netns,
};

/// A device pair to create ([`Nl::create_veth`], [`Nl::create_netkit`]).
#[derive(Debug, Clone, Copy)]
pub struct NewVeth<'a> {
    /// Host end name.
    pub host: &'a str,
    /// Host end MAC.
    pub host_mac: [u8; 6],
    /// Container end name.
    pub peer: &'a str,
    /// Container end MAC.
    pub peer_mac: [u8; 6],
    /// MTU of both ends.
    pub mtu: u32,
    /// Device group of the host end ([`unlabelled_group`](super::unlabelled_group)).
    pub group: u32,
}

impl NewVeth<'_> {
    /// The creating request's part for the container end: its name, MAC and MTU, and
    /// `peer_ns` to create it in.
    fn peer_message(&self, peer_ns: &Netns) -> LinkMessage {
        use std::os::fd::AsRawFd;
        LinkMessageBuilder::<LinkUnspec>::new()
            .name(self.peer.to_owned())
            .address(self.peer_mac.to_vec())
            .mtu(self.mtu)
            .setns_by_fd(peer_ns.file().as_raw_fd())
            .build()
    }
}

impl Nl {
    /// Creates a veth pair in one request: the host end here, the peer directly inside
    /// `peer_ns`, each with its name and MAC, both with the MTU; the host end in the
    /// device group. Neither is set up.
    pub async fn create_veth(&self, v: &NewVeth<'_>, peer_ns: &Netns) -> Result<()> {
        let msg = LinkVeth::new(v.host, v.peer)
            .address(v.host_mac.to_vec())
            .mtu(v.mtu)
            .link_group(v.group)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(v.peer_message(peer_ns))))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| creating(format!("creating veth {}/{}", v.host, v.peer), e))
    }

    /// Creates a netkit pair in one request, as [`Nl::create_veth`] a veth pair: the host
    /// end (the primary) here, the peer inside `peer_ns`, in L2 mode (each end has its
    /// MAC, and the pod resolves its gateway as on a veth). Both ends drop every packet
    /// while no program is attached to them, so the pod has no network until the datapath
    /// has its programs in place, and none once DEL has taken them. `Ok(false)`: this
    /// kernel has no netkit devices.
    pub async fn create_netkit(&self, v: &NewVeth<'_>, peer_ns: &Netns) -> Result<bool> {
        let msg = LinkNetkit::new(v.host, v.peer, NetkitMode::L2)
            .address(v.host_mac.to_vec())
            .mtu(v.mtu)
            .link_group(v.group)
            .set_info_data(InfoData::Netkit(vec![
                InfoNetkit::Mode(NetkitMode::L2),
                InfoNetkit::Policy(NetkitPolicy::Drop),
                InfoNetkit::PeerPolicy(NetkitPolicy::Drop),
                InfoNetkit::Peer(v.peer_message(peer_ns)),
            ]))
            .build();
        match self.handle.link().add(msg).execute().await {
            Ok(()) => Ok(true),
            // The kernel knows no link kind "netkit" (and no module provides one).
            Err(e) if is_errno(&e, libc::EOPNOTSUPP) => Ok(false),
            Err(e) => Err(creating(
                format!("creating netkit {}/{}", v.host, v.peer),
                e,
            )),
        }
    }

    /// Creates the VXLAN device `name` in external (collect-metadata) mode on UDP `port`:
    /// no learning, no ARP (the programs give every packet its remote), MTU `mtu`, down
    /// and unlabelled (see [`Nl::label_and_set_up`]).
    pub async fn create_vxlan(&self, name: &str, port: u16, mtu: u32) -> Result<()> {
        let msg = LinkVxlan::new(name, 0)
            .port(port)
            .collect_metadata(true)
            .learning(false)
            .mtu(mtu)
            .arp(false)
            .build();
        self.handle.link().add(msg).execute().await.map_err(|e| {
            creating(
                format!("creating VXLAN device {name} on UDP port {port}"),
                e,
            )
        })
    }

    /// Creates the WireGuard device `name` with MTU `mtu`, down and unlabelled (no key,
    /// port or peer: the agent gives it those). `Ok(false)`: this kernel has no
    /// WireGuard (no link kind "wireguard", and no module provides one).
    pub async fn create_wireguard(&self, name: &str, mtu: u32) -> Result<bool> {
        let msg = LinkWireguard::new(name).mtu(mtu).build();
        match self.handle.link().add(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if is_errno(&e, libc::EOPNOTSUPP) => Ok(false),
            Err(e) => Err(creating(format!("creating WireGuard device {name}"), e)),
        }
    }

    /// Sets link `index`'s MTU.
    pub async fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("setting link #{index}'s MTU to {mtu}"), e))
    }

    /// Labels link `index` with `alias` and sets it up (the kernel takes an alias on a
    /// change only, not on creation). Setting a VXLAN device up is when it binds its UDP
    /// port, so a port another device holds fails here.
    pub async fn label_and_set_up(&self, index: u32, alias: &str) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .alias(alias.to_owned())
            .up()
            .build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("labelling link #{index} and setting it up"), e))
    }

    /// Sets link `index` up.
    pub async fn set_up(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("setting link #{index} up"), e))
    }

    /// Deletes link `index`; a link that is already gone is not an error.
    pub async fn del_link(&self, index: u32) -> Result<()> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(()),
            Err(e) => Err(Error::netlink(format!("deleting link #{index}"), e)),
        }
    }

    /// Deletes every link of this namespace in device group `group` (a veth takes its peer
    /// along), in one request: the kernel then flushes the CPUs' backlogs and waits out
    /// its RCU grace periods once for all of them. A group with no link is no error.
    pub async fn del_group(&self, group: u32) -> Result<()> {
        let mut req = self.handle.link().del(0);
        req.message_mut()
            .attributes
            .push(LinkAttribute::Group(group));
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(()),
            Err(e) => Err(Error::netlink(
                format!("deleting the links of device group {group}"),
                e,
            )),
        }
    }

    /// Retires host veth `index`: down, which removes the routes through it and takes the
    /// carrier from its pod end, and in device group `group`
    /// ([`retired_group`](super::retired_group)), in one request. Its alias stays, so it
    /// is still known as the attachment's.
    pub async fn retire_host_veth(&self, index: u32, group: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .down()
            .link_group(group)
            .build();
        match self.handle.link().set(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(()),
            Err(e) => Err(Error::netlink(format!("retiring link #{index}"), e)),
        }
    }

    /// On a connection inside the pod's namespace: takes the pod end of host veth `host`
    /// out of the pod's way, down and into device group `group` (the network's retired
    /// group, so an ADD into the namespace finds it), then renamed from `ifname` to
    /// `name`, so that no interface of the pod's `CNI_IFNAME` is left while the pair waits
    /// for its deletion. Only the link that is `host`'s peer (a pod pair end named
    /// `ifname` whose peer is `host`) is touched; nothing to do (`Ok`) when there is none,
    /// it is gone, or it was renamed before.
    pub async fn retire_pod_end(
        &self,
        host: &Link,
        ifname: &str,
        group: u32,
        name: &str,
    ) -> Result<()> {
        let Some(peer) = host.peer_index else {
            return Ok(());
        };
        let Some(end) = self.link_by_index(peer).await? else {
            return Ok(());
        };
        if end.name != ifname || end.peer_index != Some(host.index) || !super::is_pod_pair_end(&end)
        {
            return Ok(());
        }
        let down = LinkUnspec::new_with_index(end.index)
            .down()
            .link_group(group)
            .build();
        match self.handle.link().set(down).execute().await {
            Ok(()) => {}
            Err(e) if is_errno(&e, libc::ENODEV) => return Ok(()),
            Err(e) => {
                return Err(Error::netlink(
                    format!("setting the pod end {ifname} of {} down", host.name),
                    e,
                ))
            }
        }
        let rename = LinkUnspec::new_with_index(end.index)
            .name(name.to_owned())
            .build();
        match self.handle.link().set(rename).execute().await {
            // ENODEV: gone meanwhile.
            Err(e) if !is_errno(&e, libc::ENODEV) => Err(Error::netlink(
                format!("renaming the pod end {ifname} of {} to {name}", host.name),
                e,
            )),
            _ => Ok(()),
        }
    }

    /// Labels host veth `index`: its alias (`IFLA_IFALIAS`) names the owner, and its
    /// device group goes back to the default 0
    /// ([`unlabelled_group`](super::unlabelled_group)), in one request.
    pub async fn label_host_veth(&self, index: u32, alias: &str) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .alias(alias.to_owned())
            .link_group(0)
            .build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("labelling link #{index} {alias:?}"), e))
    }

    /// Every link of this namespace, as the kernel describes it.
    async fn link_messages(&self) -> Result<Vec<LinkMessage>> {
        retry_dump("listing links", || async {
            self.handle.link().get().execute().try_collect().await
        })
        .await
    }

    /// Pod pair ends in device group `group`.
    pub async fn pair_ends_in_group(&self, group: u32) -> Result<Vec<Link>> {
        Ok(self
            .link_messages()
            .await?
            .iter()
            .map(Link::from_message)
            .filter(|l| l.group == group && super::is_pod_pair_end(l))
            .collect())
    }

    /// Veths (and netkit devices) in device group `group` without an alias: host ends of
    /// the network whose [`unlabelled_group`](super::unlabelled_group) that is, created
    /// by an ADD that has not labelled them (yet).
    pub async fn unlabelled_veths(&self, group: u32) -> Result<Vec<Link>> {
        Ok(self
            .link_messages()
            .await?
            .iter()
            .filter(|m| {
                m.attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::Group(g) if *g == group))
                    && !m
                        .attributes
                        .iter()
                        .any(|a| matches!(a, LinkAttribute::IfAlias(s) if !s.is_empty()))
            })
            .map(Link::from_message)
            .filter(is_pod_pair_end)
            .collect())
    }

    /// The veths and netkit devices in device group `group` (e.g.
    /// [`retired_group`](super::retired_group)).
    pub async fn veths_in_group(&self, group: u32) -> Result<Vec<Link>> {
        Ok(self
            .link_messages()
            .await?
            .iter()
            .map(Link::from_message)
            .filter(|l| l.group == group && is_pod_pair_end(l))
            .collect())
    }

    /// The alias of link `index`, if any.
    pub async fn alias(&self, index: u32) -> Result<Option<String>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(msg.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfAlias(s) => Some(s.clone()),
                _ => None,
            })),
            Ok(None) => Ok(None),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(
                format!("reading the alias of link #{index}"),
                e,
            )),
        }
    }

    /// Every link whose alias starts with `prefix`, with its alias.
    pub async fn links_with_alias(&self, prefix: &str) -> Result<Vec<(Link, String)>> {
        Ok(self
            .link_messages()
            .await?
            .iter()
            .filter_map(|m| {
                let alias = m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfAlias(s) if s.starts_with(prefix) => Some(s.clone()),
                    _ => None,
                })?;
                Some((Link::from_message(m), alias))
            })
            .collect())
    }
}
