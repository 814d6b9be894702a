//! Typed access to the pinned maps, and the conversions between Rust types and the
//! network-order fields of `cni-ebpf-common`.

use std::net::Ipv4Addr;

use aya::maps::{
    lpm_trie::LpmTrie, Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap,
    PerCpuValues,
};
use cni_ebpf_common::{
    map, Addr6, EndpointInfo, EndpointKey, EndpointKey6, EndpointStats, FlowEntry, NatDestKey,
    NatDestKey6, NatEntry, NatEntry6, NatKey, NatKey6, NatUse, NodeAddr, NodeConfig, NodeConfig6,
    NodeState, Owner, Pacing, PolicyCounts, PolicyDeny, PolicyEndpoint, PolicyEndpointKey,
    PolicyExactKey, PolicyFlow, PolicyFlowKey, PolicyPeerKey, PolicyPortKey, PolicyState, PortKey,
    PortKey6, PortTarget, PortTarget6, SockKey, SockKey6, SockPeer, SockPeer6, SockRevKey,
    SockRevKey6, SockRevValue, SockRevValue6, SrcAllow6Key, SrcAllowKey, TunnelEndpoint, TunnelKey,
    OWNER_ID_LEN, OWNER_IFNAME_LEN,
};
use cni_ebpf_common::{
    Affinity, AffinityKey, Backend, BackendSlot, MemberKey, Service, ServiceKey,
};

use super::{load, pins::Pins};
use crate::error::{Error, Result};

/// How a map pin is opened (read-write or read-only descriptors).
type OpenMap = fn(&Pins, &str) -> Result<Map>;

/// Every map of one network, each opened from its pin on first use (an ADD touches about
/// half of them; opening one is two syscalls and a descriptor to close). [`Maps::open`]
/// and [`Maps::open_read_only`] open and check them all at once.
pub struct Maps {
    opener: Opener,
    slots: Slots,
}

/// Where and how the maps are opened.
struct Opener {
    pins: Pins,
    open: OpenMap,
}

impl Opener {
    /// The typed view of the map in `slot`, opened from its pin first if it is not yet.
    /// The view fails on a key/value size mismatch: a layout this binary does not know.
    fn typed<'a, T>(&self, slot: &'a mut Option<Map>, name: &str) -> Result<T>
    where
        T: TryFrom<&'a mut Map, Error = MapError>,
    {
        let map = match slot {
            Some(m) => m,
            None => slot.insert((self.open)(&self.pins, name)?),
        };
        T::try_from(map).map_err(|e| map_err(name, "open", e))
    }
}

/// The maps opened so far.
#[derive(Default)]
struct Slots {
    endpoints: Option<Map>,
    ep_stats: Option<Map>,
    portmaps: Option<Map>,
    nat: Option<Map>,
    node_config: Option<Map>,
    node_state: Option<Map>,
    node_addrs: Option<Map>,
    reasons: Option<Map>,
    owners: Option<Map>,
    flows: Option<Map>,
    stack_sockets: Option<Map>,
    sock_revnat: Option<Map>,
    src_allow: Option<Map>,
    pacing: Option<Map>,
    src_allow6: Option<Map>,
    nat_use: Option<Map>,
    nat_dest_use: Option<Map>,
    endpoints6: Option<Map>,
    nat6: Option<Map>,
    nat_dest_use6: Option<Map>,
    flows6: Option<Map>,
    stack_sockets6: Option<Map>,
    node_config6: Option<Map>,
    node_addrs6: Option<Map>,
    portmaps6: Option<Map>,
    policy_endpoints: Option<Map>,
    policy_state: Option<Map>,
    policy_peers: Option<Map>,
    policy_ports: Option<Map>,
    policy_exact: Option<Map>,
    policy_flows: Option<Map>,
    policy_namespaces: Option<Map>,
    policy_denies: Option<Map>,
    policy_counts: Option<Map>,
    tunnel_endpoints: Option<Map>,
    tunnel_nodes: Option<Map>,
    sock_revnat6: Option<Map>,
    services: Option<Map>,
    service_backends: Option<Map>,
    service_members: Option<Map>,
    service_affinity: Option<Map>,
    service_netns: Option<Map>,
}

fn map_err(name: &str, what: &str, e: MapError) -> Error {
    Error::datapath(format!("map {name}: {what}"), e)
}

impl Maps {
    /// Opens every map pin (checking key and value sizes against ours).
    pub fn open(pins: &Pins) -> Result<Self> {
        Self::open_with(pins, load::open_map)
    }

    /// Opens every map pin with read-only descriptors: any write through them fails
    /// (`EPERM`), reads work as with [`Maps::open`].
    pub fn open_read_only(pins: &Pins) -> Result<Self> {
        Self::open_with(pins, load::open_map_read_only)
    }

    fn open_with(pins: &Pins, open: OpenMap) -> Result<Self> {
        let mut m = Self::lazy(pins, open);
        m.open_all()?;
        Ok(m)
    }

    /// Opens nothing yet: each map is opened (and its key and value sizes checked) by its
    /// accessor's first call.
    pub fn open_lazily(pins: &Pins) -> Self {
        Self::lazy(pins, load::open_map)
    }

    fn lazy(pins: &Pins, open: OpenMap) -> Self {
        Self {
            opener: Opener {
                pins: pins.clone(),
                open,
            },
            slots: Slots::default(),
        }
    }

    /// Opens every map; typed views fail on a key/value size mismatch (a layout this
    /// binary does not know).
    fn open_all(&mut self) -> Result<()> {
        self.endpoints()?;
        self.ep_stats()?;
        self.portmaps()?;
        self.nat()?;
        self.node_config()?;
        self.node_state()?;
        self.node_addrs()?;
        self.reasons()?;
        self.owners()?;
        self.flows()?;
        self.stack_sockets()?;
        self.sock_revnat()?;
        self.src_allow()?;
        self.pacing()?;
        self.src_allow6()?;
        self.nat_use()?;
        self.nat_dest_use()?;
        self.endpoints6()?;
        self.nat6()?;
        self.nat_dest_use6()?;
        self.flows6()?;
        self.stack_sockets6()?;
        self.node_config6()?;
        self.node_addrs6()?;
        self.portmaps6()?;
        self.sock_revnat6()?;
        self.policy_endpoints()?;
        self.policy_state()?;
        self.policy_peers()?;
        self.policy_ports()?;
        self.policy_exact()?;
        self.policy_flows()?;
        self.policy_namespaces()?;
        self.policy_denies()?;
        self.policy_counts()?;
        self.tunnel_endpoints()?;
        self.tunnel_nodes()?;
        self.services()?;
        self.service_backends()?;
        self.service_members()?;
        self.service_affinity()?;
        self.service_netns()?;
        Ok(())
    }

    /// [`map::ENDPOINTS`].
    pub fn endpoints(&mut self) -> Result<HashMap<&mut MapData, EndpointKey, EndpointInfo>> {
        self.opener.typed(&mut self.slots.endpoints, map::ENDPOINTS)
    }

    /// [`map::EP_STATS`].
    pub fn ep_stats(&mut self) -> Result<PerCpuHashMap<&mut MapData, u32, EndpointStats>> {
        self.opener.typed(&mut self.slots.ep_stats, map::EP_STATS)
    }

    /// [`map::PORTMAPS`].
    pub fn portmaps(&mut self) -> Result<HashMap<&mut MapData, PortKey, PortTarget>> {
        self.opener.typed(&mut self.slots.portmaps, map::PORTMAPS)
    }

    /// [`map::NAT`].
    pub fn nat(&mut self) -> Result<HashMap<&mut MapData, NatKey, NatEntry>> {
        self.opener.typed(&mut self.slots.nat, map::NAT)
    }

    /// [`map::NODE_CONFIG`].
    pub fn node_config(&mut self) -> Result<Array<&mut MapData, NodeConfig>> {
        self.opener
            .typed(&mut self.slots.node_config, map::NODE_CONFIG)
    }

    /// [`map::NODE_STATE`].
    pub fn node_state(&mut self) -> Result<Array<&mut MapData, NodeState>> {
        self.opener
            .typed(&mut self.slots.node_state, map::NODE_STATE)
    }

    /// [`map::NODE_ADDRS`].
    pub fn node_addrs(&mut self) -> Result<HashMap<&mut MapData, u32, NodeAddr>> {
        self.opener
            .typed(&mut self.slots.node_addrs, map::NODE_ADDRS)
    }

    /// [`map::REASONS`].
    pub fn reasons(&mut self) -> Result<PerCpuArray<&mut MapData, u64>> {
        self.opener.typed(&mut self.slots.reasons, map::REASONS)
    }

    /// [`map::OWNERS`].
    pub fn owners(&mut self) -> Result<HashMap<&mut MapData, u64, Owner>> {
        self.opener.typed(&mut self.slots.owners, map::OWNERS)
    }

    /// [`map::FLOWS`].
    pub fn flows(&mut self) -> Result<HashMap<&mut MapData, NatKey, FlowEntry>> {
        self.opener.typed(&mut self.slots.flows, map::FLOWS)
    }

    /// [`map::STACK_SOCKETS`].
    pub fn stack_sockets(&mut self) -> Result<HashMap<&mut MapData, SockKey, SockPeer>> {
        self.opener
            .typed(&mut self.slots.stack_sockets, map::STACK_SOCKETS)
    }

    /// [`map::SRC_ALLOW`].
    pub fn src_allow(&mut self) -> Result<LpmTrie<&mut MapData, SrcAllowKey, u32>> {
        self.opener.typed(&mut self.slots.src_allow, map::SRC_ALLOW)
    }

    /// [`map::SRC_ALLOW6`].
    pub fn src_allow6(&mut self) -> Result<LpmTrie<&mut MapData, SrcAllow6Key, u32>> {
        self.opener
            .typed(&mut self.slots.src_allow6, map::SRC_ALLOW6)
    }

    /// [`map::NAT_USE`].
    pub fn nat_use(&mut self) -> Result<HashMap<&mut MapData, u32, NatUse>> {
        self.opener.typed(&mut self.slots.nat_use, map::NAT_USE)
    }

    /// [`map::NAT_DEST_USE`].
    pub fn nat_dest_use(&mut self) -> Result<HashMap<&mut MapData, NatDestKey, u32>> {
        self.opener
            .typed(&mut self.slots.nat_dest_use, map::NAT_DEST_USE)
    }

    /// [`map::PACING`].
    pub fn pacing(&mut self) -> Result<HashMap<&mut MapData, u32, Pacing>> {
        self.opener.typed(&mut self.slots.pacing, map::PACING)
    }

    /// [`map::ENDPOINTS6`].
    pub fn endpoints6(&mut self) -> Result<HashMap<&mut MapData, EndpointKey6, EndpointInfo>> {
        self.opener
            .typed(&mut self.slots.endpoints6, map::ENDPOINTS6)
    }

    /// [`map::NAT6`].
    pub fn nat6(&mut self) -> Result<HashMap<&mut MapData, NatKey6, NatEntry6>> {
        self.opener.typed(&mut self.slots.nat6, map::NAT6)
    }

    /// [`map::NAT_DEST_USE6`].
    pub fn nat_dest_use6(&mut self) -> Result<HashMap<&mut MapData, NatDestKey6, u32>> {
        self.opener
            .typed(&mut self.slots.nat_dest_use6, map::NAT_DEST_USE6)
    }

    /// [`map::FLOWS6`].
    pub fn flows6(&mut self) -> Result<HashMap<&mut MapData, NatKey6, FlowEntry>> {
        self.opener.typed(&mut self.slots.flows6, map::FLOWS6)
    }

    /// [`map::STACK_SOCKETS6`].
    pub fn stack_sockets6(&mut self) -> Result<HashMap<&mut MapData, SockKey6, SockPeer6>> {
        self.opener
            .typed(&mut self.slots.stack_sockets6, map::STACK_SOCKETS6)
    }

    /// [`map::NODE_CONFIG6`].
    pub fn node_config6(&mut self) -> Result<Array<&mut MapData, NodeConfig6>> {
        self.opener
            .typed(&mut self.slots.node_config6, map::NODE_CONFIG6)
    }

    /// [`map::NODE_ADDRS6`].
    pub fn node_addrs6(&mut self) -> Result<HashMap<&mut MapData, Addr6, NodeAddr>> {
        self.opener
            .typed(&mut self.slots.node_addrs6, map::NODE_ADDRS6)
    }

    /// [`map::PORTMAPS6`].
    pub fn portmaps6(&mut self) -> Result<HashMap<&mut MapData, PortKey6, PortTarget6>> {
        self.opener.typed(&mut self.slots.portmaps6, map::PORTMAPS6)
    }

    /// [`map::SOCK_REVNAT`].
    pub fn sock_revnat(&mut self) -> Result<HashMap<&mut MapData, SockRevKey, SockRevValue>> {
        self.opener
            .typed(&mut self.slots.sock_revnat, map::SOCK_REVNAT)
    }

    /// [`map::SOCK_REVNAT6`].
    pub fn sock_revnat6(&mut self) -> Result<HashMap<&mut MapData, SockRevKey6, SockRevValue6>> {
        self.opener
            .typed(&mut self.slots.sock_revnat6, map::SOCK_REVNAT6)
    }

    /// [`map::POLICY_ENDPOINTS`].
    pub fn policy_endpoints(
        &mut self,
    ) -> Result<HashMap<&mut MapData, PolicyEndpointKey, PolicyEndpoint>> {
        self.opener
            .typed(&mut self.slots.policy_endpoints, map::POLICY_ENDPOINTS)
    }

    /// [`map::POLICY_STATE`].
    pub fn policy_state(&mut self) -> Result<Array<&mut MapData, PolicyState>> {
        self.opener
            .typed(&mut self.slots.policy_state, map::POLICY_STATE)
    }

    /// [`map::POLICY_PEERS`].
    pub fn policy_peers(&mut self) -> Result<LpmTrie<&mut MapData, PolicyPeerKey, u64>> {
        self.opener
            .typed(&mut self.slots.policy_peers, map::POLICY_PEERS)
    }

    /// [`map::POLICY_PORTS`].
    pub fn policy_ports(&mut self) -> Result<LpmTrie<&mut MapData, PolicyPortKey, u64>> {
        self.opener
            .typed(&mut self.slots.policy_ports, map::POLICY_PORTS)
    }

    /// [`map::POLICY_EXACT`].
    pub fn policy_exact(&mut self) -> Result<HashMap<&mut MapData, PolicyExactKey, u32>> {
        self.opener
            .typed(&mut self.slots.policy_exact, map::POLICY_EXACT)
    }

    /// [`map::POLICY_FLOWS`].
    pub fn policy_flows(&mut self) -> Result<HashMap<&mut MapData, PolicyFlowKey, PolicyFlow>> {
        self.opener
            .typed(&mut self.slots.policy_flows, map::POLICY_FLOWS)
    }

    /// [`map::POLICY_NAMESPACES`].
    pub fn policy_namespaces(&mut self) -> Result<HashMap<&mut MapData, u64, u32>> {
        self.opener
            .typed(&mut self.slots.policy_namespaces, map::POLICY_NAMESPACES)
    }

    /// [`map::POLICY_DENIES`].
    pub fn policy_denies(&mut self) -> Result<PerCpuArray<&mut MapData, PolicyDeny>> {
        self.opener
            .typed(&mut self.slots.policy_denies, map::POLICY_DENIES)
    }

    /// [`map::POLICY_COUNTS`].
    pub fn policy_counts(&mut self) -> Result<PerCpuHashMap<&mut MapData, u32, PolicyCounts>> {
        self.opener
            .typed(&mut self.slots.policy_counts, map::POLICY_COUNTS)
    }

    /// [`map::TUNNEL_ENDPOINTS`].
    pub fn tunnel_endpoints(&mut self) -> Result<LpmTrie<&mut MapData, TunnelKey, TunnelEndpoint>> {
        self.opener
            .typed(&mut self.slots.tunnel_endpoints, map::TUNNEL_ENDPOINTS)
    }

    /// [`map::TUNNEL_NODES`].
    pub fn tunnel_nodes(&mut self) -> Result<HashMap<&mut MapData, TunnelKey, u32>> {
        self.opener
            .typed(&mut self.slots.tunnel_nodes, map::TUNNEL_NODES)
    }

    /// [`map::SERVICES`].
    pub fn services(&mut self) -> Result<HashMap<&mut MapData, ServiceKey, Service>> {
        self.opener.typed(&mut self.slots.services, map::SERVICES)
    }

    /// [`map::SERVICE_BACKENDS`].
    pub fn service_backends(&mut self) -> Result<HashMap<&mut MapData, BackendSlot, Backend>> {
        self.opener
            .typed(&mut self.slots.service_backends, map::SERVICE_BACKENDS)
    }

    /// [`map::SERVICE_MEMBERS`].
    pub fn service_members(&mut self) -> Result<HashMap<&mut MapData, MemberKey, u32>> {
        self.opener
            .typed(&mut self.slots.service_members, map::SERVICE_MEMBERS)
    }

    /// [`map::SERVICE_AFFINITY`].
    pub fn service_affinity(&mut self) -> Result<HashMap<&mut MapData, AffinityKey, Affinity>> {
        self.opener
            .typed(&mut self.slots.service_affinity, map::SERVICE_AFFINITY)
    }

    /// [`map::SERVICE_NETNS`].
    pub fn service_netns(&mut self) -> Result<HashMap<&mut MapData, u64, u32>> {
        self.opener
            .typed(&mut self.slots.service_netns, map::SERVICE_NETNS)
    }
}

/// Whether a map error means "no such key".
#[must_use]
pub fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Whether a map error is "the map is full" (`E2BIG` from an insert of a new key).
pub fn is_full(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// Wraps a map error with context, keeping it typed (`Error::source`, the errno).
pub fn err(name: &str, what: impl AsRef<str>, e: MapError) -> Error {
    map_err(name, what.as_ref(), e)
}

/// Looks a key up, mapping "not found" to `None`.
pub fn get<K: aya::Pod, V: aya::Pod>(
    m: &HashMap<&mut MapData, K, V>,
    key: &K,
    name: &str,
) -> Result<Option<V>> {
    match m.get(key, 0) {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(map_err(name, "lookup", e)),
    }
}

/// Removes every entry for which `doomed(key, value)` holds (read in one batch).
pub fn remove_where<K: aya::Pod, V: aya::Pod>(
    m: &mut HashMap<&mut MapData, K, V>,
    name: &str,
    doomed: impl Fn(&K, &V) -> bool,
) -> Result<()> {
    let keys: Vec<K> = entries(m)
        .into_iter()
        .filter(|(k, v)| doomed(k, v))
        .map(|(k, _)| k)
        .collect();
    for k in keys {
        remove(m, &k, name)?;
    }
    Ok(())
}

/// Removes a key; a missing key is fine.
pub fn remove<K: aya::Pod, V: aya::Pod>(
    m: &mut HashMap<&mut MapData, K, V>,
    key: &K,
    name: &str,
) -> Result<()> {
    match m.remove(key) {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(map_err(name, "delete", e)),
    }
}

/// Every (key, value) of a hash map (entries that vanish while iterating are skipped).
///
/// Read with `BPF_MAP_LOOKUP_BATCH`, a few thousand entries per syscall: DEL and GC scan
/// the NAT table, which can hold 100 000 live flows, and one `get_next_key` + `lookup`
/// pair per entry made them slow down with the node's traffic. Kernels without batch
/// support for the map fall back to plain iteration.
pub fn entries<K: aya::Pod, V: aya::Pod>(m: &HashMap<&mut MapData, K, V>) -> Vec<(K, V)> {
    use aya::maps::IterableMap as _;
    match lookup_batch::<K, V>(m.map()) {
        Some(all) => all,
        None => m.iter().filter_map(std::result::Result::ok).collect(),
    }
}

/// `union bpf_attr` as `BPF_MAP_*_BATCH` reads it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries per batch; also bounds how many entries one hash bucket may hold (ENOSPC
/// otherwise), far above what a bucket ever holds.
const BATCH: usize = 4096;

/// Reads the whole map in batches; `None` when the kernel cannot batch this map.
fn lookup_batch<K: aya::Pod, V: aya::Pod>(map: &MapData) -> Option<Vec<(K, V)>> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let fd = u32::try_from(map.fd().as_fd().as_raw_fd()).ok()?;
    let mut keys: Vec<K> = Vec::with_capacity(BATCH);
    let mut values: Vec<V> = Vec::with_capacity(BATCH);
    let mut out = Vec::new();
    // htab batches are resumed by bucket number (a u32 token).
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_ref(&token_in) as u64
            },
            out_batch: std::ptr::from_mut(&mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(BATCH).ok()?,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: the kernel writes at most `count` keys and values into buffers of that
        // capacity, and a bucket token into `token_out`; `attr` outlives the call.
        let rc =
            unsafe { super::bpf_syscall::bpf(super::bpf_syscall::BPF_MAP_LOOKUP_BATCH, &mut attr) };
        let errno = rc.as_ref().err().and_then(std::io::Error::raw_os_error);
        let rc = rc.unwrap_or(-1);
        if rc < 0 && errno != Some(libc::ENOENT) {
            // EINVAL/ENOTSUPP: no batch support; ENOSPC: a bucket larger than BATCH.
            return None;
        }
        let n = usize::try_from(attr.count).ok()?.min(BATCH);
        // SAFETY: the kernel initialised the first `n` elements of both buffers, and K and
        // V are plain-old-data types of the map's key and value sizes.
        unsafe {
            keys.set_len(n);
            values.set_len(n);
        }
        out.extend(keys.drain(..).zip(values.drain(..)));
        if errno == Some(libc::ENOENT) {
            return Some(out);
        }
        token_in = token_out;
        first = false;
    }
}

/// Sum of per-CPU values.
#[must_use]
pub fn sum_stats(v: &PerCpuValues<EndpointStats>) -> EndpointStats {
    v.iter().fold(EndpointStats::default(), |mut a, s| {
        a.tx_packets += s.tx_packets;
        a.tx_bytes += s.tx_bytes;
        a.rx_packets += s.rx_packets;
        a.rx_bytes += s.rx_bytes;
        a
    })
}

/// Zeroed per-CPU values.
pub fn zero_percpu<T: aya::Pod + Default>() -> Result<PerCpuValues<T>> {
    let n = aya::util::nr_cpus()
        .map_err(|(what, e)| Error::io(format!("reading the CPU count ({what})"), e))?;
    PerCpuValues::try_from(vec![T::default(); n])
        .map_err(|e| Error::io("building per-CPU values", e))
}

/// An IPv4 address as a network-order map field.
#[must_use]
pub fn ipv4_to_map(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// A network-order map field as an IPv4 address.
#[must_use]
pub fn ipv4_from_map(a: u32) -> Ipv4Addr {
    Ipv4Addr::from(a.to_ne_bytes())
}

/// An IPv6 address as a wire-order map field ([`Addr6`]).
#[must_use]
pub fn ipv6_to_map(a: std::net::Ipv6Addr) -> Addr6 {
    let o = a.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// A wire-order map field ([`Addr6`]) as an IPv6 address.
#[must_use]
pub fn ipv6_from_map(a: Addr6) -> std::net::Ipv6Addr {
    let mut o = [0u8; 16];
    for (chunk, w) in o.chunks_exact_mut(4).zip(a) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    std::net::Ipv6Addr::from(o)
}

/// A port as a network-order map field.
#[must_use]
pub fn port_to_map(p: u16) -> u16 {
    u16::from_ne_bytes(p.to_be_bytes())
}

/// A network-order map field as a port.
#[must_use]
pub fn port_from_map(p: u16) -> u16 {
    u16::from_be_bytes(p.to_ne_bytes())
}

/// Builds an [`Owner`] record; container IDs and ifnames that do not fit are refused.
pub fn owner_record(container_id: &str, ifname: &str) -> Result<Owner> {
    let id = container_id.as_bytes();
    let ifn = ifname.as_bytes();
    if id.len() > OWNER_ID_LEN {
        return Err(Error::datapath(
            "recording the endpoint owner",
            format!("container ID is longer than {OWNER_ID_LEN} bytes"),
        ));
    }
    if ifn.len() > OWNER_IFNAME_LEN {
        return Err(Error::datapath(
            "recording the endpoint owner",
            format!("ifname {ifname:?} is longer than {OWNER_IFNAME_LEN} bytes"),
        ));
    }
    let mut o = Owner {
        id_len: u32::try_from(id.len()).unwrap_or(0),
        ifname_len: u32::try_from(ifn.len()).unwrap_or(0),
        container_id: [0; OWNER_ID_LEN],
        ifname: [0; OWNER_IFNAME_LEN],
    };
    o.container_id[..id.len()].copy_from_slice(id);
    o.ifname[..ifn.len()].copy_from_slice(ifn);
    Ok(o)
}

/// (container ID, ifname) of an [`Owner`] record.
#[must_use]
pub fn owner_names(o: &Owner) -> (String, String) {
    let id_len = (o.id_len as usize).min(OWNER_ID_LEN);
    let if_len = (o.ifname_len as usize).min(OWNER_IFNAME_LEN);
    (
        String::from_utf8_lossy(&o.container_id[..id_len]).into_owned(),
        String::from_utf8_lossy(&o.ifname[..if_len]).into_owned(),
    )
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn byte_order_round_trips() {
        let a = Ipv4Addr::new(10, 244, 1, 5);
        assert_eq!(ipv4_to_map(a).to_ne_bytes(), [10, 244, 1, 5]);
        assert_eq!(ipv4_from_map(ipv4_to_map(a)), a);
        assert_eq!(port_to_map(8080).to_ne_bytes(), [0x1f, 0x90]);
        assert_eq!(port_from_map(port_to_map(8080)), 8080);
    }

    #[test]
    fn owner_round_trip() {
        let o = owner_record("abc123", "eth0").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(owner_names(&o), ("abc123".to_owned(), "eth0".to_owned()));
        assert!(owner_record(&"x".repeat(OWNER_ID_LEN + 1), "eth0").is_err());
    }
}
