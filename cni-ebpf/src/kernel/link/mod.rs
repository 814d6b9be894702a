//! Typed netlink helpers (rtnetlink). Everything the plugin does to links, addresses and
//! routes goes through here; nothing shells out to `ip`.
//!
//! A [`Nl`] handle is bound to the network namespace its socket was created in, so one
//! handle can serve the node while another serves the container.
//!
//! Here: the handle, looking links up, the route protocol and table numbers, and the
//! error handling the other files share. The rest, by concern:
//! - `devices.rs`: creating device pairs and VXLAN devices, setting links up, labelling,
//!   retiring and deleting them, and listing them by device group or alias;
//! - `addresses.rs`: addresses and neighbour entries;
//! - `routes.rs`: installing, deleting and listing routes;
//! - `naming.rs`: the names, aliases, MACs and device groups derived from an attachment,
//!   and which link kinds are a pod's device pair.

use futures::TryStreamExt;
use netlink_packet_route::link::{
    InfoData, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::{sys::AsyncSocket as _, Handle};

use crate::{
    error::{Error, Result},
    kernel::netns::Netns,
};

mod addresses;
mod devices;
mod naming;
mod routes;

pub use devices::NewVeth;
pub use naming::{
    alias_prefix, derived_mac, host_veth_alias, host_veth_name, is_netkit, is_pod_pair_end,
    is_veth, retired_group, retired_pod_end_name, unlabelled_group, NETKIT,
};
pub use routes::{NewRoute, RouteInfo};

/// Routes we install carry this protocol number, so they are recognisable as ours
/// (`ip route` shows `proto 206`).
pub const RTPROT_CNI_EBPF: u8 = 206;

/// Routes of the host-gw mode (`cni-ebpf agent --host-gw`: another node's pod CIDR via
/// its InternalIP) carry this protocol number (`ip route` shows `proto 207`): it tells them
/// apart from the per-pod routes ([`RTPROT_CNI_EBPF`]) and from everyone else's, which
/// host-gw never changes.
pub const RTPROT_CNI_EBPF_HOST_GW: u8 = 207;

/// Routes of the cluster CIDRs to the tunnel device (`crossNode` `tunnel`,
/// `crossSubnet`) carry this protocol number (`ip route` shows `proto 208`).
pub const RTPROT_CNI_EBPF_TUNNEL: u8 = 208;

/// `RT_SCOPE_LINK`: a destination on the link itself.
pub const RT_SCOPE_LINK: u8 = 253;

/// `RT_TABLE_MAIN`: the table a route goes to when none is named.
pub const RT_TABLE_MAIN: u32 = 254;

/// `RT_TABLE_LOCAL`: the kernel's routes to the node's own addresses.
const RT_TABLE_LOCAL: u32 = 255;

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
