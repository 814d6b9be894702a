//! The Service maps the socket programs translate from (`--kube-proxy-replacement`):
//! frontends (`SERVICES`), their backend slots (`SERVICE_BACKENDS`), the backends of
//! frontends with session affinity (`SERVICE_MEMBERS`), and the pods' network namespaces
//! whose sockets are translated (`SERVICE_NETNS`, written by ADD, removed with the pod's
//! endpoint entries).
//!
//! A frontend changes without a moment in which a connection could find it half-made:
//! its new backend slots are written first, then its entry (with the new count), then
//! the slots past the new count are removed. A connection racing the change picks a
//! backend of the old set or of the new one.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::Path,
};

use cni_ebpf_common::{
    map as map_name, Backend, BackendSlot, MemberKey, Service, ServiceKey, ANY_NODE_ADDR4,
    ANY_NODE_ADDR6, MAX_BACKENDS_PER_SERVICE, SCOPE_SOCKET, SCOPE_UPLINK,
};

use super::{maps, Datapath};
use crate::error::Result;

/// One frontend as the agent wants it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frontend {
    /// Its ready backends (at most [`MAX_BACKENDS_PER_SERVICE`] are used), in a stable
    /// order.
    pub backends: Vec<Backend>,
    /// `sessionAffinity: ClientIP`'s timeout in seconds; 0 without affinity.
    pub affinity_secs: u32,
}

/// Every frontend of the node.
pub type ServiceTable = BTreeMap<ServiceKey, Frontend>;

/// Where a frontend listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// One address: a ClusterIP, an external IP, a load-balancer address.
    Ip(IpAddr),
    /// A NodePort: every address of the node of one family (`true`: IPv6).
    Node { ipv6: bool },
}

/// Who a frontend is translated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The node's own processes and its pods, at the socket.
    Socket,
    /// Flows arriving from outside the node, at the uplink.
    Uplink,
}

/// A frontend's key from where it listens, its port, protocol (`proto::TCP`/`UDP`) and
/// scope.
#[must_use]
pub fn frontend_key(at: At, port: u16, proto: u8, scope: Scope) -> ServiceKey {
    ServiceKey {
        addr: match at {
            At::Ip(ip) => wire(ip),
            At::Node { ipv6: false } => ANY_NODE_ADDR4,
            At::Node { ipv6: true } => ANY_NODE_ADDR6,
        },
        port: port.to_be(),
        proto,
        scope: match scope {
            Scope::Socket => SCOPE_SOCKET,
            Scope::Uplink => SCOPE_UPLINK,
        },
    }
}

/// The key of a ClusterIP frontend (address, port, protocol), at the socket.
#[must_use]
pub fn service_key(ip: IpAddr, port: u16, proto: u8) -> ServiceKey {
    frontend_key(At::Ip(ip), port, proto, Scope::Socket)
}

/// A backend from its socket address.
#[must_use]
pub fn backend(addr: SocketAddr) -> Backend {
    Backend {
        addr: wire(addr.ip()),
        port: addr.port().to_be(),
        _pad: 0,
    }
}

/// The socket address of a backend.
#[must_use]
pub fn backend_addr(b: &Backend) -> SocketAddr {
    SocketAddr::new(unwire(b.addr), u16::from_be(b.port))
}

/// Where a frontend listens, its port (host order), protocol and scope.
#[must_use]
pub fn frontend_parts(k: &ServiceKey) -> (At, u16, u8, Scope) {
    let at = match k.addr {
        ANY_NODE_ADDR4 => At::Node { ipv6: false },
        ANY_NODE_ADDR6 => At::Node { ipv6: true },
        a => At::Ip(unwire(a)),
    };
    let scope = if k.scope == SCOPE_UPLINK {
        Scope::Uplink
    } else {
        Scope::Socket
    };
    (at, u16::from_be(k.port), k.proto, scope)
}

fn wire(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn unwire(b: [u8; 16]) -> IpAddr {
    let a = std::net::Ipv6Addr::from(b);
    a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
}

/// One frontend as `inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    /// `ip:port` (IPv6 in brackets); a NodePort: `node:port` (IPv4) or `[node]:port`
    /// (IPv6).
    pub frontend: String,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// `socket` (for the node and its pods) or `uplink` (for flows from outside).
    pub scope: &'static str,
    /// The backends, `ip:port`; empty: new connections are refused.
    pub backends: Vec<String>,
    /// `sessionAffinity: ClientIP`'s timeout in seconds, if the Service has affinity.
    pub affinity_secs: Option<u32>,
}

/// What one [`ServiceWriter::apply`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Frontends added, changed or removed.
    pub frontends: usize,
    /// Backend slots written or removed.
    pub slots: usize,
}

/// The frontends a network's maps hold, as last written: the agent's record, so that a
/// change writes only what differs.
#[derive(Debug, Default)]
pub struct ServiceWriter {
    current: BTreeMap<ServiceKey, (u32, Frontend)>,
    free_ids: Vec<u32>,
    next_id: u32,
}

impl ServiceWriter {
    /// The frontends `dp`'s maps hold now (after an agent restart: what the last one
    /// wrote).
    pub fn resume(dp: &Datapath) -> Result<Self> {
        let mut w = Self::default();
        for (k, (id, f)) in dp.frontends()? {
            w.next_id = w.next_id.max(id + 1);
            w.current.insert(k, (id, f));
        }
        let mut m = dp.maps()?;
        // Slots of no frontend (an agent killed while removing one) go now.
        let live: BTreeSet<u32> = w.current.values().map(|(id, _)| *id).collect();
        let mut h = m.service_backends()?;
        maps::remove_where(&mut h, map_name::SERVICE_BACKENDS, |k, _| {
            !live.contains(&k.id)
        })?;
        let mut h = m.service_members()?;
        maps::remove_where(&mut h, map_name::SERVICE_MEMBERS, |k, _| {
            !live.contains(&k.id)
        })?;
        Ok(w)
    }

    /// How many frontends the maps hold.
    #[must_use]
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Whether the maps hold no frontend.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    /// Makes `dp`'s maps hold exactly `want`.
    pub fn apply(&mut self, dp: &Datapath, want: &ServiceTable) -> Result<Applied> {
        let mut done = Applied::default();
        for (key, f) in want {
            let f = capped(f);
            match self.current.get(key) {
                Some((_, have)) if *have == f => {}
                Some((id, have)) => {
                    let (id, have) = (*id, have.clone());
                    done.slots += write(dp, key, id, &f, Some(&have))?;
                    done.frontends += 1;
                    self.current.insert(*key, (id, f));
                }
                None => {
                    let id = self.free_ids.pop().unwrap_or_else(|| {
                        self.next_id += 1;
                        self.next_id - 1
                    });
                    done.slots += write(dp, key, id, &f, None)?;
                    done.frontends += 1;
                    self.current.insert(*key, (id, f));
                }
            }
        }
        let gone: Vec<ServiceKey> = self
            .current
            .keys()
            .filter(|k| !want.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            if let Some((id, have)) = self.current.remove(&key) {
                done.slots += remove(dp, &key, id, &have)?;
                done.frontends += 1;
                self.free_ids.push(id);
            }
        }
        Ok(done)
    }
}

fn capped(f: &Frontend) -> Frontend {
    let mut f = f.clone();
    f.backends.truncate(MAX_BACKENDS_PER_SERVICE as usize);
    f
}

/// Writes frontend `key` (id `id`) as `f`, over `have` if it exists. Returns the slots
/// written or removed.
fn write(
    dp: &Datapath,
    key: &ServiceKey,
    id: u32,
    f: &Frontend,
    have: Option<&Frontend>,
) -> Result<usize> {
    let mut m = dp.maps()?;
    let mut n = 0;
    let old = have.map(|h| h.backends.as_slice()).unwrap_or_default();
    {
        let mut slots = m.service_backends()?;
        for (i, b) in f.backends.iter().enumerate() {
            if old.get(i) == Some(b) {
                continue;
            }
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            slots
                .insert(BackendSlot { id, index }, b, 0)
                .map_err(|e| maps::err(map_name::SERVICE_BACKENDS, "insert", e))?;
            n += 1;
        }
    }
    if f.affinity_secs != 0 {
        let mut members = m.service_members()?;
        for b in &f.backends {
            members
                .insert(MemberKey { id, backend: *b }, 1, 0)
                .map_err(|e| maps::err(map_name::SERVICE_MEMBERS, "insert", e))?;
        }
    }
    let entry = Service {
        id,
        count: u32::try_from(f.backends.len()).unwrap_or(MAX_BACKENDS_PER_SERVICE),
        affinity_secs: f.affinity_secs,
        _pad: 0,
    };
    m.services()?
        .insert(key, entry, 0)
        .map_err(|e| maps::err(map_name::SERVICES, "insert", e))?;
    {
        let mut slots = m.service_backends()?;
        for i in f.backends.len()..old.len() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            maps::remove(
                &mut slots,
                &BackendSlot { id, index },
                map_name::SERVICE_BACKENDS,
            )?;
            n += 1;
        }
    }
    let mut members = m.service_members()?;
    for b in old {
        if f.affinity_secs == 0 || !f.backends.contains(b) {
            maps::remove(
                &mut members,
                &MemberKey { id, backend: *b },
                map_name::SERVICE_MEMBERS,
            )?;
        }
    }
    Ok(n)
}

/// Removes frontend `key` (entry first, then its slots and members).
fn remove(dp: &Datapath, key: &ServiceKey, id: u32, have: &Frontend) -> Result<usize> {
    let mut m = dp.maps()?;
    maps::remove(&mut m.services()?, key, map_name::SERVICES)?;
    {
        let mut slots = m.service_backends()?;
        for i in 0..have.backends.len() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            maps::remove(
                &mut slots,
                &BackendSlot { id, index },
                map_name::SERVICE_BACKENDS,
            )?;
        }
    }
    let mut members = m.service_members()?;
    for b in &have.backends {
        maps::remove(
            &mut members,
            &MemberKey { id, backend: *b },
            map_name::SERVICE_MEMBERS,
        )?;
    }
    Ok(have.backends.len())
}

impl Datapath {
    /// Makes the sockets of the pod network namespace `cookie` (host interface
    /// `host_ifindex`) ones the Service translation applies to (ADD).
    pub fn record_pod_netns(&self, cookie: u64, host_ifindex: u32) -> Result<()> {
        let inserted = self
            .maps()?
            .service_netns()?
            .insert(cookie, host_ifindex, 0);
        match inserted {
            Ok(()) => Ok(()),
            Err(e) if maps::is_full(&e) => {
                // Entries of pods gone without a DEL (cookies are never reused, so a stale
                // one matches nothing): make room from them.
                self.prune_pod_netns()?;
                let mut m = self.maps()?;
                m.service_netns()?
                    .insert(cookie, host_ifindex, 0)
                    .map_err(|e| maps::err(map_name::SERVICE_NETNS, "insert", e))
            }
            Err(e) => Err(maps::err(map_name::SERVICE_NETNS, "insert", e)),
        }
    }

    /// Records the network namespaces of the pods in `records` (the IPAM store's) that
    /// have an endpoint but no recorded namespace: pods an older binary ADDed, before ADD
    /// recorded them. Run by the carry-over to a new binary, as root in the node's
    /// namespace (entering a pod's takes `CAP_SYS_ADMIN`). A pod whose namespace cannot
    /// be entered is logged and left out: its sockets get no Service translation until it
    /// is recreated. Returns how many were recorded.
    pub fn adopt_pod_netns(&self, records: &[crate::ipam::record::Record]) -> usize {
        let known = match self
            .maps()
            .and_then(|mut m| Ok(maps::entries(&m.service_netns()?)))
        {
            Ok(e) => e.into_iter().map(|(_, i)| i).collect::<BTreeSet<u32>>(),
            Err(e) => {
                tracing::warn!("reading SERVICE_NETNS: {e}");
                return 0;
            }
        };
        let mut live: BTreeMap<u64, u32> = BTreeMap::new();
        if let Ok(mut m) = self.maps() {
            for (_, info) in m.endpoints().map(|h| maps::entries(&h)).unwrap_or_default() {
                live.insert(info.owner, info.ifindex);
            }
            for (_, info) in m
                .endpoints6()
                .map(|h| maps::entries(&h))
                .unwrap_or_default()
            {
                live.insert(info.owner, info.ifindex);
            }
        }
        let mut done = 0;
        for r in records {
            let owner = cni_ebpf_common::owner_id(r.container_id.as_bytes(), r.ifname.as_bytes());
            let (Some(&ifindex), Some(path)) = (live.get(&owner), r.netns.as_deref()) else {
                continue;
            };
            if known.contains(&ifindex) {
                continue;
            }
            let cookie = crate::kernel::netns::Netns::open(Path::new(path))
                .and_then(|ns| ns.run(super::netns_cookie));
            match cookie.and_then(|c| self.record_pod_netns(c, ifindex)) {
                Ok(()) => done += 1,
                Err(e) => tracing::warn!(
                    container = %r.container_id,
                    "the pod's namespace {path} was not recorded for Services: {e}"
                ),
            }
        }
        done
    }

    /// Removes the recorded pod network namespaces of host interfaces `ifindexes` (a
    /// removed pod's; a walk of the map). A new pod in the same namespace has recorded it
    /// with its own interface, which stays.
    pub fn forget_pod_netns(&self, ifindexes: &BTreeSet<u32>) -> Result<()> {
        if ifindexes.is_empty() {
            return Ok(());
        }
        let mut m = self.maps()?;
        let mut h = m.service_netns()?;
        maps::remove_where(&mut h, map_name::SERVICE_NETNS, |_, i| {
            ifindexes.contains(i)
        })
    }

    /// Removes the recorded pod network namespaces whose host interface is no pod's
    /// (ADD when the map is full; DEL's finishing process removes a pod's own,
    /// [`Self::forget_pod_netns`]).
    pub fn prune_pod_netns(&self) -> Result<()> {
        let mut m = self.maps()?;
        let mut live: BTreeSet<u32> = maps::entries(&m.endpoints()?)
            .iter()
            .map(|(_, info)| info.ifindex)
            .collect();
        live.extend(
            maps::entries(&m.endpoints6()?)
                .iter()
                .map(|(_, info)| info.ifindex),
        );
        let mut h = m.service_netns()?;
        maps::remove_where(&mut h, map_name::SERVICE_NETNS, |_, ifindex| {
            !live.contains(ifindex)
        })
    }

    /// Frontend `key` as the maps hold it now, if they do (one lookup per backend).
    pub fn service_frontend(&self, key: &ServiceKey) -> Result<Option<Frontend>> {
        let mut m = self.maps()?;
        let Some(s) = maps::get(&m.services()?, key, map_name::SERVICES)? else {
            return Ok(None);
        };
        let slots = m.service_backends()?;
        let mut backends = Vec::new();
        for index in 0..s.count {
            let slot = BackendSlot { id: s.id, index };
            if let Some(b) = maps::get(&slots, &slot, map_name::SERVICE_BACKENDS)? {
                backends.push(b);
            }
        }
        Ok(Some(Frontend {
            backends,
            affinity_secs: s.affinity_secs,
        }))
    }

    /// The frontends the maps hold now, as `inspect` shows them.
    pub fn service_views(&self) -> Result<Vec<ServiceView>> {
        Ok(self
            .service_table()?
            .iter()
            .map(|(k, f)| {
                let (at, port, proto, scope) = frontend_parts(k);
                ServiceView {
                    frontend: match at {
                        At::Ip(ip) => SocketAddr::new(ip, port).to_string(),
                        At::Node { ipv6: false } => format!("node:{port}"),
                        At::Node { ipv6: true } => format!("[node]:{port}"),
                    },
                    protocol: if proto == cni_ebpf_common::proto::UDP {
                        "udp"
                    } else {
                        "tcp"
                    },
                    scope: match scope {
                        Scope::Socket => "socket",
                        Scope::Uplink => "uplink",
                    },
                    backends: f
                        .backends
                        .iter()
                        .map(|b| backend_addr(b).to_string())
                        .collect(),
                    affinity_secs: (f.affinity_secs != 0).then_some(f.affinity_secs),
                }
            })
            .collect())
    }

    /// The frontends the maps hold now, with their backends (for `inspect` and tests).
    pub fn service_table(&self) -> Result<ServiceTable> {
        Ok(self
            .frontends()?
            .into_iter()
            .map(|(k, (_, f))| (k, f))
            .collect())
    }

    /// Every frontend the maps hold, with its id and its backends in slot order.
    fn frontends(&self) -> Result<BTreeMap<ServiceKey, (u32, Frontend)>> {
        let mut m = self.maps()?;
        let services = maps::entries(&m.services()?);
        let mut by_id: BTreeMap<u32, BTreeMap<u32, Backend>> = BTreeMap::new();
        for (k, b) in maps::entries(&m.service_backends()?) {
            by_id.entry(k.id).or_default().insert(k.index, b);
        }
        Ok(services
            .into_iter()
            .map(|(k, s)| {
                let backends = by_id
                    .get(&s.id)
                    .map(|m| m.range(..s.count).map(|(_, b)| *b).collect())
                    .unwrap_or_default();
                let f = Frontend {
                    backends,
                    affinity_secs: s.affinity_secs,
                };
                (k, (s.id, f))
            })
            .collect())
    }
}
