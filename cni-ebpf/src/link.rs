//! Typed netlink helpers (rtnetlink). Everything the plugin does to links, addresses and
//! routes goes through here; nothing shells out to `ip`.
//!
//! A [`Nl`] handle is bound to the network namespace its socket was created in, so one
//! handle can serve the node while another serves the container.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressScope},
    link::{
        InfoData, InfoKind, InfoNetkit, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo,
        LinkMessage, NetkitMode, NetkitPolicy,
    },
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope},
    AddressFamily,
};
use rtnetlink::{
    sys::AsyncSocket as _, Handle, LinkMessageBuilder, LinkNetkit, LinkUnspec, LinkVeth, LinkVxlan,
    RouteMessageBuilder,
};

use crate::{
    error::{Error, Result},
    netns::Netns,
};

/// Routes we install carry this protocol number, so they are recognisable as ours
/// (`ip route` shows `proto 206`).
pub const RTPROT_CNI_EBPF: u8 = 206;

/// Routes of the host-gw mode (`cni-ebpf metrics --host-gw`: another node's pod CIDR via
/// its InternalIP) carry this protocol number (`ip route` shows `proto 207`): it tells them
/// apart from the per-pod routes ([`RTPROT_CNI_EBPF`]) and from everyone else's, which
/// host-gw never changes.
pub const RTPROT_CNI_EBPF_HOST_GW: u8 = 207;

/// Routes of the cluster CIDRs to the tunnel device (`crossNode` `tunnel`,
/// `crossSubnet`) carry this protocol number (`ip route` shows `proto 208`).
pub const RTPROT_CNI_EBPF_TUNNEL: u8 = 208;

/// A failed link creation as an error about `what`: an existing name said plainly.
fn creating(what: String, e: rtnetlink::Error) -> Error {
    if is_errno(&e, libc::EEXIST) {
        Error::netlink(what, "a link of that name already exists")
    } else {
        Error::netlink(what, e)
    }
}

/// Whether a netlink error carries `errno`.
fn is_errno(e: &rtnetlink::Error, errno: i32) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -errno)
}

/// A link as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// ifindex.
    pub index: u32,
    /// Name.
    pub name: String,
    /// MAC address.
    pub mac: Vec<u8>,
    /// MTU.
    pub mtu: u32,
    /// `IFLA_LINK`: for a veth, the peer's ifindex (in the peer's namespace).
    pub peer_index: Option<u32>,
    /// `IFLA_INFO_KIND`, e.g. `veth`.
    pub kind: Option<String>,
    /// Administratively up.
    pub up: bool,
    /// `IFLA_IFALIAS`.
    pub alias: Option<String>,
    /// `IFLA_GROUP`, the device group (0 by default).
    pub group: u32,
    /// For a VXLAN device: its UDP port and whether it is in external (collect-metadata)
    /// mode.
    pub vxlan: Option<(u16, bool)>,
}

impl Link {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Self {
            index: msg.header.index,
            name: String::new(),
            mac: Vec::new(),
            mtu: 0,
            peer_index: None,
            kind: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            alias: None,
            group: 0,
            vxlan: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name.clone_from(n),
                LinkAttribute::Address(a) => link.mac.clone_from(a),
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Link(l) => link.peer_index = Some(*l),
                LinkAttribute::IfAlias(a) => link.alias = Some(a.clone()),
                LinkAttribute::Group(g) => link.group = *g,
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(k) => link.kind = Some(k.to_string()),
                            LinkInfo::Data(InfoData::Vxlan(data)) => {
                                let (mut port, mut external) = (0, false);
                                for d in data {
                                    match d {
                                        InfoVxlan::Port(p) => port = *p,
                                        InfoVxlan::CollectMetadata(m) => external = *m,
                                        _ => {}
                                    }
                                }
                                link.vxlan = Some((port, external));
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

/// A route as read back from the kernel (main table unless stated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// Destination.
    pub dst: IpNet,
    /// Gateway.
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: Option<u32>,
    /// Table id.
    pub table: u32,
    /// Scope (`RT_SCOPE_*` value).
    pub scope: u8,
    /// Protocol (`RTPROT_*` value: who installed it).
    pub protocol: u8,
}

/// A route to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRoute {
    /// Destination.
    pub dst: IpNet,
    /// Gateway, if any.
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: u32,
    /// Scope (`RT_SCOPE_*`); `None` = the kernel's default for the route (universe, or
    /// link for a route without gateway). On-link host routes use [`RT_SCOPE_LINK`].
    pub scope: Option<u8>,
    /// Metric.
    pub priority: Option<u32>,
    /// Route MTU.
    pub mtu: Option<u32>,
    /// Advertised MSS (`RTAX_ADVMSS`).
    pub advmss: Option<u32>,
    /// Routing table; `None` = main.
    pub table: Option<u32>,
}

/// `RT_SCOPE_LINK`: a destination on the link itself.
pub const RT_SCOPE_LINK: u8 = 253;

/// `RT_TABLE_MAIN`: the table a route goes to when none is named.
pub const RT_TABLE_MAIN: u32 = 254;

/// `RT_TABLE_LOCAL`: the kernel's routes to the node's own addresses.
const RT_TABLE_LOCAL: u32 = 255;

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
    /// Device group of the host end ([`unlabelled_group`]).
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

/// A netlink handle bound to one network namespace.
pub struct Nl {
    handle: Handle,
}

impl Nl {
    /// Connects in the current thread's namespace. Must be called inside a tokio runtime.
    pub fn connect() -> Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| Error::netlink("opening a netlink socket", e))?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Connects like [`Nl::connect`] with netlink strict checking on: the kernel then
    /// honours the filters of dump requests (e.g. one interface's addresses) instead of
    /// dumping everything for us to discard. Route dumps as [`Nl::routes`] sends them are
    /// refused in this mode.
    pub fn connect_strict() -> Result<Self> {
        let (mut conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| Error::netlink("opening a netlink socket", e))?;
        conn.socket_mut()
            .socket_mut()
            .set_netlink_get_strict_chk(true)
            .map_err(|e| Error::netlink("enabling strict netlink checking", e))?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Connects inside `ns`: the socket is created there and stays bound to it.
    pub fn connect_in(ns: &Netns) -> Result<Self> {
        let _guard = ns.enter()?;
        Self::connect()
    }

    /// The link called `name`, if it exists.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(Link::from_message(&msg))),
            Ok(None) => Ok(None),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("looking up link {name}"), e)),
        }
    }

    /// The link with ifindex `index`, if it exists.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut stream = self.handle.link().get().match_index(index).execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(Link::from_message(&msg))),
            Ok(None) => Ok(None),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("looking up link #{index}"), e)),
        }
    }

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

    /// Adds or replaces the main-table route `dst dev oif` marked with `protocol`.
    pub async fn replace_device_route(&self, dst: IpNet, oif: u32, protocol: u8) -> Result<()> {
        let refused = |e: &dyn std::fmt::Display| {
            Error::netlink(
                format!("building the route to {dst} on link #{oif}"),
                e.to_string(),
            )
        };
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .map_err(|e| refused(&e))?
            .output_interface(oif)
            .table_id(RT_TABLE_MAIN)
            .protocol(RouteProtocol::Other(protocol))
            .build();
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("adding route to {dst} on link #{oif}"), e))
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

    /// Adds a route. A route to the same destination that already exists (another
    /// network's default route in the pod, the same network attached twice, a duplicate
    /// pod address on the node) is an error that says so: replacing it would break
    /// someone else's traffic, and ignoring it would report a route we did not install.
    pub async fn add_route(&self, route: &NewRoute) -> Result<()> {
        let msg = build_route(route)?;
        let context = || format!("adding route to {} on link #{}", route.dst, route.oif);
        match self.handle.route().add(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::EEXIST) => Err(Error::netlink(
                context(),
                format!(
                    "a route to {} already exists (is this network already attached, or does \
                     another one own that route?)",
                    route.dst
                ),
            )),
            Err(e) => Err(Error::netlink(context(), e)),
        }
    }

    /// Adds (`replace`: or replaces) the main-table route `dst via gw` marked with
    /// `protocol`; the kernel picks the device that reaches `gw` on-link.
    pub async fn add_gateway_route(
        &self,
        dst: IpNet,
        gw: IpAddr,
        protocol: u8,
        replace: bool,
    ) -> Result<()> {
        let msg = gateway_route(dst, gw, protocol)?;
        let req = self.handle.route().add(msg);
        let req = if replace { req.replace() } else { req };
        req.execute()
            .await
            .map_err(|e| Error::netlink(format!("adding route to {dst} via {gw}"), e))
    }

    /// Deletes the main-table route `dst via gw` with `protocol` (the kernel matches the
    /// protocol, so a route someone else installed is never removed); a missing route is
    /// not an error.
    pub async fn del_gateway_route(&self, dst: IpNet, gw: IpAddr, protocol: u8) -> Result<()> {
        let msg = gateway_route(dst, gw, protocol)?;
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_errno(&e, libc::ESRCH) => Ok(()),
            Err(e) => Err(Error::netlink(
                format!("deleting route to {dst} via {gw}"),
                e,
            )),
        }
    }

    /// Every route of both families in every table but `local` (the kernel's own).
    pub async fn routes(&self) -> Result<Vec<RouteInfo>> {
        let mut out = Vec::new();
        for v6 in [false, true] {
            let msg = if v6 {
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
            } else {
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
            };
            let msgs: Vec<RouteMessage> = retry_dump("listing routes", || async {
                self.handle
                    .route()
                    .get(msg.clone())
                    .execute()
                    .try_collect()
                    .await
            })
            .await?;
            out.extend(
                msgs.iter()
                    .filter_map(route_info)
                    .filter(|r| r.table != RT_TABLE_LOCAL),
            );
        }
        Ok(out)
    }

    /// The ifindex of the device of the IPv4 default route, if there is one.
    pub async fn default_route_device(&self) -> Result<Option<u32>> {
        Ok(self
            .routes()
            .await?
            .into_iter()
            .find(|r| r.table == RT_TABLE_MAIN && r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4())
            .and_then(|r| r.oif))
    }
}

/// The netlink message for `r`. The builder refuses what the kernel could not install as
/// asked (an IPv4 gateway on an IPv6 destination); that is an error here, never a route
/// quietly built without the part that was refused.
fn build_route(r: &NewRoute) -> Result<RouteMessage> {
    // rtnetlink does not export its error type (`InvalidRouteMessage`); keep its text.
    let refused = |e: &dyn std::fmt::Display| {
        let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
        Error::netlink(
            format!("building the route to {}{via}", r.dst),
            e.to_string(),
        )
    };
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix_len())
        .map_err(|e| refused(&e))?;
    if let Some(gw) = r.gw {
        b = b.gateway(gw).map_err(|e| refused(&e))?;
    }
    b = b
        .output_interface(r.oif)
        .protocol(RouteProtocol::Other(RTPROT_CNI_EBPF));
    if let Some(scope) = r.scope {
        b = b.scope(RouteScope::from(scope));
    }
    if let Some(p) = r.priority {
        b = b.priority(p);
    }
    if let Some(t) = r.table {
        b = b.table_id(t);
    }
    let mut msg = b.build();
    let metrics: Vec<RouteMetric> = [
        r.mtu.map(RouteMetric::Mtu),
        r.advmss.map(RouteMetric::Advmss),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !metrics.is_empty() {
        msg.attributes.push(RouteAttribute::Metrics(metrics));
    }
    Ok(msg)
}

/// The message of a main-table route `dst via gw` with `protocol` and no device.
fn gateway_route(dst: IpNet, gw: IpAddr, protocol: u8) -> Result<RouteMessage> {
    let refused = |e: &dyn std::fmt::Display| {
        Error::netlink(
            format!("building the route to {dst} via {gw}"),
            e.to_string(),
        )
    };
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .map_err(|e| refused(&e))?
        .gateway(gw)
        .map_err(|e| refused(&e))?
        .table_id(RT_TABLE_MAIN)
        .protocol(RouteProtocol::Other(protocol))
        .build())
}

fn route_info(m: &RouteMessage) -> Option<RouteInfo> {
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    let mut table = u32::from(m.header.table);
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let dst = match (dst, m.header.address_family) {
        (Some(ip), _) => IpNet::new(ip, m.header.destination_prefix_length).ok()?,
        (None, AddressFamily::Inet) => IpNet::new(IpAddr::V4(0.into()), 0).ok()?,
        (None, AddressFamily::Inet6) => IpNet::new(IpAddr::V6(0.into()), 0).ok()?,
        (None, _) => return None,
    };
    Some(RouteInfo {
        dst,
        gw,
        oif,
        table,
        scope: u8::from(m.header.scope),
        protocol: u8::from(m.header.protocol),
    })
}

/// Runs a dump, retrying when the kernel reports it was interrupted by a concurrent change
/// (`NLM_F_DUMP_INTR` surfaces as `EINTR`/`EBUSY`).
async fn retry_dump<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, rtnetlink::Error>>,
{
    let mut last = None;
    for _ in 0..5 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if is_errno(&e, libc::EINTR) || is_errno(&e, libc::EBUSY) => last = Some(e),
            Err(e) => return Err(Error::netlink(what, e)),
        }
    }
    Err(Error::netlink(
        what,
        last.map_or_else(|| "interrupted".to_owned(), |e| e.to_string()),
    ))
}

/// A `tokio` current-thread runtime for one plugin invocation. Everything runs on the
/// calling thread, which keeps namespace switches (thread-local) predictable.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("creating the async runtime", e))
}

/// Writes a sysctl under `/proc/sys` in the current thread's network namespace, skipping
/// the write when it already has the value.
pub fn write_sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|e| Error::io(format!("writing {path}"), e))
}

/// `IFLA_INFO_KIND` of a netkit device.
pub const NETKIT: &str = "netkit";

/// Whether `link` is a veth.
#[must_use]
pub fn is_veth(link: &Link) -> bool {
    link.kind.as_deref() == Some(&InfoKind::Veth.to_string())
}

/// Whether `link` is a netkit device.
#[must_use]
pub fn is_netkit(link: &Link) -> bool {
    link.kind.as_deref() == Some(NETKIT)
}

/// Whether `link` may be an end of a pod's device pair: a veth or a netkit device.
#[must_use]
pub fn is_pod_pair_end(link: &Link) -> bool {
    is_veth(link) || is_netkit(link)
}

/// The hash of interface names and MACs: [`cni_ebpf_common::fnv1a64`] with 0xff between
/// the parts (a lasting contract: DEL and GC find existing pods' veths by it).
fn fnv1a(parts: &[&str]) -> u64 {
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
    cni_ebpf_common::fnv1a64(&bytes, 0xff)
}

/// The host-side veth name of an attachment: `ceb` + 12 hex digits of a hash of
/// (container ID, ifname). Stable across calls, so DEL and GC find it with no state;
/// 15 bytes, the kernel's limit.
#[must_use]
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    format!(
        "ceb{:012x}",
        fnv1a(&[container_id, ifname]) & 0xffff_ffff_ffff
    )
}

/// The alias written on every host veth we create:
/// `cni-ebpf/<network>/<container ID>/<ifname>` (none of these may contain `/`). DEL and GC
/// delete a link only when its alias names the attachment they work for.
#[must_use]
pub fn host_veth_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{}{container_id}/{ifname}", alias_prefix(network))
}

/// The alias prefix of every host veth of `network`.
#[must_use]
pub fn alias_prefix(network: &str) -> String {
    format!("cni-ebpf/{network}/")
}

/// A deterministic, locally administered unicast MAC for (container ID, ifname, role).
#[must_use]
pub fn derived_mac(container_id: &str, ifname: &str, role: &str) -> [u8; 6] {
    let h = fnv1a(&[container_id, ifname, role]).to_be_bytes();
    [(h[0] & 0xfe) | 0x02, h[1], h[2], h[3], h[4], h[5]]
}

/// The device group (`IFLA_GROUP`) a host veth of `network` carries from the request that
/// creates it until ADD labels it with its alias: the kernel takes a group, but no alias,
/// in the creating request, so this is what marks a pair that a killed ADD left unlabelled
/// as this network's (GC collects those: `cmd::half_made`). Never 0, the default group.
#[must_use]
pub fn unlabelled_group(network: &str) -> u32 {
    // The low 32 bits of the hash; `| 1` keeps it off 0.
    (fnv1a(&["cni-ebpf unlabelled", network]) & 0xffff_ffff) as u32 | 1
}

/// The device group of a host veth of `network` that DEL has retired: set down (which
/// takes its routes with it) and left for the deleting process DEL starts (`cmd::del`).
/// Never 0 and never [`unlabelled_group`].
#[must_use]
pub fn retired_group(network: &str) -> u32 {
    let g = (fnv1a(&["cni-ebpf retired", network]) & 0xffff_ffff) as u32 | 1;
    if g == unlabelled_group(network) {
        g ^ 2
    } else {
        g
    }
}

impl Nl {
    /// Retires host veth `index`: down, which removes the routes through it and takes the
    /// carrier from its pod end, and in device group `group` ([`retired_group`]), in one
    /// request. Its alias stays, so it is still known as the attachment's.
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

    /// Labels host veth `index`: its alias (`IFLA_IFALIAS`) names the owner, and its
    /// device group goes back to the default 0 ([`unlabelled_group`]), in one request.
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

    /// Veths (and netkit devices) in device group `group` without an alias: host ends of
    /// the network whose [`unlabelled_group`] that is, created by an ADD that has not
    /// labelled them (yet).
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

    /// The veths and netkit devices in device group `group` (e.g. [`retired_group`]).
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

#[cfg(test)]
#[expect(clippy::panic, reason = "tests fail by panicking with a message")]
mod tests {
    use super::{build_route, host_veth_name, NewRoute, RouteAttribute, RouteMetric, RouteScope};
    use crate::error::Error;

    /// Names and ids are lasting contracts: DEL and GC of a pod made by an older binary
    /// find its veth by name, and its map entries by owner id. Fixed values, computed
    /// once by the separate implementations these replaced.
    #[test]
    fn veth_names_and_owner_ids_never_change() {
        assert_eq!(host_veth_name("abc123", "eth0"), "ceb561682a75b5f");
        assert_eq!(
            cni_ebpf_common::owner_id(b"abc123", b"eth0"),
            0xd35a_c051_2423_e986
        );
    }

    fn route(dst: &str, gw: &str) -> NewRoute {
        NewRoute {
            dst: dst.parse().unwrap_or_else(|e| panic!("{dst}: {e}")),
            gw: Some(gw.parse().unwrap_or_else(|e| panic!("{gw}: {e}"))),
            oif: 2,
            scope: None,
            priority: None,
            mtu: None,
            advmss: None,
            table: None,
        }
    }

    #[test]
    fn a_route_keeps_its_gateway_or_is_an_error() {
        let msg = build_route(&route("10.0.0.0/8", "10.244.1.1"))
            .unwrap_or_else(|e| panic!("a same-family route was refused: {e}"));
        assert!(
            msg.attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Gateway(_))),
            "the gateway is missing from {msg:?}"
        );
        // The builder cannot put an IPv4 gateway on an IPv6 route; that used to yield a
        // route without a gateway.
        match build_route(&route("2001:db8::/64", "10.244.1.1")) {
            Err(Error::Netlink { context, .. }) => {
                assert!(
                    context.contains("2001:db8::/64 via 10.244.1.1"),
                    "{context}"
                );
            }
            Err(e) => panic!("refused with the wrong error: {e}"),
            Ok(msg) => panic!("built without complaint: {msg:?}"),
        }
    }

    #[test]
    fn every_field_of_a_route_reaches_the_message() {
        let r = NewRoute {
            scope: Some(0),
            priority: Some(7),
            mtu: Some(1400),
            advmss: Some(1300),
            table: Some(1000),
            ..route("192.0.2.0/24", "10.244.1.1")
        };
        let msg = build_route(&r).unwrap_or_else(|e| panic!("refused: {e}"));
        let has = |f: &dyn Fn(&RouteAttribute) -> bool| msg.attributes.iter().any(f);
        assert!(
            has(&|a| matches!(a, RouteAttribute::Priority(7))),
            "{msg:?}"
        );
        assert!(
            has(&|a| matches!(a, RouteAttribute::Table(1000))),
            "{msg:?}"
        );
        assert!(
            has(&|a| matches!(a, RouteAttribute::Metrics(m)
                if m.contains(&RouteMetric::Mtu(1400)) && m.contains(&RouteMetric::Advmss(1300)))),
            "{msg:?}"
        );
        assert_eq!(msg.header.scope, RouteScope::Universe);
    }
}
