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
    NodeState, Owner, Pacing, PortKey, PortKey6, PortTarget, PortTarget6, SockKey, SockKey6,
    SockPeer, SockPeer6, SockRevKey, SockRevKey6, SockRevValue, SockRevValue6, SrcAllow6Key,
    SrcAllowKey, OWNER_ID_LEN, OWNER_IFNAME_LEN,
};

use super::{load, pins::Pins};
use crate::error::{Error, Result};

/// Every map of one network, opened from its pins.
pub struct Maps {
    pub(crate) endpoints: Map,
    pub(crate) ep_stats: Map,
    pub(crate) portmaps: Map,
    pub(crate) nat: Map,
    pub(crate) node_config: Map,
    pub(crate) node_state: Map,
    pub(crate) node_addrs: Map,
    pub(crate) reasons: Map,
    pub(crate) owners: Map,
    pub(crate) flows: Map,
    pub(crate) stack_sockets: Map,
    pub(crate) sock_revnat: Map,
    pub(crate) src_allow: Map,
    pub(crate) pacing: Map,
    pub(crate) src_allow6: Map,
    pub(crate) nat_use: Map,
    pub(crate) nat_dest_use: Map,
    pub(crate) endpoints6: Map,
    pub(crate) nat6: Map,
    pub(crate) nat_dest_use6: Map,
    pub(crate) flows6: Map,
    pub(crate) stack_sockets6: Map,
    pub(crate) node_config6: Map,
    pub(crate) node_addrs6: Map,
    pub(crate) portmaps6: Map,
    pub(crate) sock_revnat6: Map,
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

    fn open_with(pins: &Pins, open: fn(&Pins, &str) -> Result<Map>) -> Result<Self> {
        let mut m = Self {
            endpoints: open(pins, map::ENDPOINTS)?,
            ep_stats: open(pins, map::EP_STATS)?,
            portmaps: open(pins, map::PORTMAPS)?,
            nat: open(pins, map::NAT)?,
            node_config: open(pins, map::NODE_CONFIG)?,
            node_state: open(pins, map::NODE_STATE)?,
            node_addrs: open(pins, map::NODE_ADDRS)?,
            reasons: open(pins, map::REASONS)?,
            owners: open(pins, map::OWNERS)?,
            flows: open(pins, map::FLOWS)?,
            stack_sockets: open(pins, map::STACK_SOCKETS)?,
            sock_revnat: open(pins, map::SOCK_REVNAT)?,
            src_allow: open(pins, map::SRC_ALLOW)?,
            pacing: open(pins, map::PACING)?,
            src_allow6: open(pins, map::SRC_ALLOW6)?,
            nat_use: open(pins, map::NAT_USE)?,
            nat_dest_use: open(pins, map::NAT_DEST_USE)?,
            endpoints6: open(pins, map::ENDPOINTS6)?,
            nat6: open(pins, map::NAT6)?,
            nat_dest_use6: open(pins, map::NAT_DEST_USE6)?,
            flows6: open(pins, map::FLOWS6)?,
            stack_sockets6: open(pins, map::STACK_SOCKETS6)?,
            node_config6: open(pins, map::NODE_CONFIG6)?,
            node_addrs6: open(pins, map::NODE_ADDRS6)?,
            portmaps6: open(pins, map::PORTMAPS6)?,
            sock_revnat6: open(pins, map::SOCK_REVNAT6)?,
        };
        // Typed views fail on a key/value size mismatch: a layout this binary does not know.
        m.endpoints()?;
        m.ep_stats()?;
        m.portmaps()?;
        m.nat()?;
        m.node_config()?;
        m.node_state()?;
        m.node_addrs()?;
        m.reasons()?;
        m.owners()?;
        m.flows()?;
        m.stack_sockets()?;
        m.sock_revnat()?;
        m.src_allow()?;
        m.pacing()?;
        m.src_allow6()?;
        m.nat_use()?;
        m.nat_dest_use()?;
        m.endpoints6()?;
        m.nat6()?;
        m.nat_dest_use6()?;
        m.flows6()?;
        m.stack_sockets6()?;
        m.node_config6()?;
        m.node_addrs6()?;
        m.portmaps6()?;
        m.sock_revnat6()?;
        Ok(m)
    }

    /// [`map::ENDPOINTS`].
    pub fn endpoints(&mut self) -> Result<HashMap<&mut MapData, EndpointKey, EndpointInfo>> {
        HashMap::try_from(&mut self.endpoints).map_err(|e| map_err(map::ENDPOINTS, "open", e))
    }

    /// [`map::EP_STATS`].
    pub fn ep_stats(&mut self) -> Result<PerCpuHashMap<&mut MapData, u32, EndpointStats>> {
        PerCpuHashMap::try_from(&mut self.ep_stats).map_err(|e| map_err(map::EP_STATS, "open", e))
    }

    /// [`map::PORTMAPS`].
    pub fn portmaps(&mut self) -> Result<HashMap<&mut MapData, PortKey, PortTarget>> {
        HashMap::try_from(&mut self.portmaps).map_err(|e| map_err(map::PORTMAPS, "open", e))
    }

    /// [`map::NAT`].
    pub fn nat(&mut self) -> Result<HashMap<&mut MapData, NatKey, NatEntry>> {
        HashMap::try_from(&mut self.nat).map_err(|e| map_err(map::NAT, "open", e))
    }

    /// [`map::NODE_CONFIG`].
    pub fn node_config(&mut self) -> Result<Array<&mut MapData, NodeConfig>> {
        Array::try_from(&mut self.node_config).map_err(|e| map_err(map::NODE_CONFIG, "open", e))
    }

    /// [`map::NODE_STATE`].
    pub fn node_state(&mut self) -> Result<Array<&mut MapData, NodeState>> {
        Array::try_from(&mut self.node_state).map_err(|e| map_err(map::NODE_STATE, "open", e))
    }

    /// [`map::NODE_ADDRS`].
    pub fn node_addrs(&mut self) -> Result<HashMap<&mut MapData, u32, NodeAddr>> {
        HashMap::try_from(&mut self.node_addrs).map_err(|e| map_err(map::NODE_ADDRS, "open", e))
    }

    /// [`map::REASONS`].
    pub fn reasons(&mut self) -> Result<PerCpuArray<&mut MapData, u64>> {
        PerCpuArray::try_from(&mut self.reasons).map_err(|e| map_err(map::REASONS, "open", e))
    }

    /// [`map::OWNERS`].
    pub fn owners(&mut self) -> Result<HashMap<&mut MapData, u64, Owner>> {
        HashMap::try_from(&mut self.owners).map_err(|e| map_err(map::OWNERS, "open", e))
    }

    /// [`map::FLOWS`].
    pub fn flows(&mut self) -> Result<HashMap<&mut MapData, NatKey, FlowEntry>> {
        HashMap::try_from(&mut self.flows).map_err(|e| map_err(map::FLOWS, "open", e))
    }

    /// [`map::STACK_SOCKETS`].
    pub fn stack_sockets(&mut self) -> Result<HashMap<&mut MapData, SockKey, SockPeer>> {
        HashMap::try_from(&mut self.stack_sockets)
            .map_err(|e| map_err(map::STACK_SOCKETS, "open", e))
    }

    /// [`map::SRC_ALLOW`].
    pub fn src_allow(&mut self) -> Result<LpmTrie<&mut MapData, SrcAllowKey, u32>> {
        LpmTrie::try_from(&mut self.src_allow).map_err(|e| map_err(map::SRC_ALLOW, "open", e))
    }

    /// [`map::SRC_ALLOW6`].
    pub fn src_allow6(&mut self) -> Result<LpmTrie<&mut MapData, SrcAllow6Key, u32>> {
        LpmTrie::try_from(&mut self.src_allow6).map_err(|e| map_err(map::SRC_ALLOW6, "open", e))
    }

    /// [`map::NAT_USE`].
    pub fn nat_use(&mut self) -> Result<HashMap<&mut MapData, u32, NatUse>> {
        HashMap::try_from(&mut self.nat_use).map_err(|e| map_err(map::NAT_USE, "open", e))
    }

    /// [`map::NAT_DEST_USE`].
    pub fn nat_dest_use(&mut self) -> Result<HashMap<&mut MapData, NatDestKey, u32>> {
        HashMap::try_from(&mut self.nat_dest_use).map_err(|e| map_err(map::NAT_DEST_USE, "open", e))
    }

    /// [`map::PACING`].
    pub fn pacing(&mut self) -> Result<HashMap<&mut MapData, u32, Pacing>> {
        HashMap::try_from(&mut self.pacing).map_err(|e| map_err(map::PACING, "open", e))
    }

    /// [`map::ENDPOINTS6`].
    pub fn endpoints6(&mut self) -> Result<HashMap<&mut MapData, EndpointKey6, EndpointInfo>> {
        HashMap::try_from(&mut self.endpoints6).map_err(|e| map_err(map::ENDPOINTS6, "open", e))
    }

    /// [`map::NAT6`].
    pub fn nat6(&mut self) -> Result<HashMap<&mut MapData, NatKey6, NatEntry6>> {
        HashMap::try_from(&mut self.nat6).map_err(|e| map_err(map::NAT6, "open", e))
    }

    /// [`map::NAT_DEST_USE6`].
    pub fn nat_dest_use6(&mut self) -> Result<HashMap<&mut MapData, NatDestKey6, u32>> {
        HashMap::try_from(&mut self.nat_dest_use6)
            .map_err(|e| map_err(map::NAT_DEST_USE6, "open", e))
    }

    /// [`map::FLOWS6`].
    pub fn flows6(&mut self) -> Result<HashMap<&mut MapData, NatKey6, FlowEntry>> {
        HashMap::try_from(&mut self.flows6).map_err(|e| map_err(map::FLOWS6, "open", e))
    }

    /// [`map::STACK_SOCKETS6`].
    pub fn stack_sockets6(&mut self) -> Result<HashMap<&mut MapData, SockKey6, SockPeer6>> {
        HashMap::try_from(&mut self.stack_sockets6)
            .map_err(|e| map_err(map::STACK_SOCKETS6, "open", e))
    }

    /// [`map::NODE_CONFIG6`].
    pub fn node_config6(&mut self) -> Result<Array<&mut MapData, NodeConfig6>> {
        Array::try_from(&mut self.node_config6).map_err(|e| map_err(map::NODE_CONFIG6, "open", e))
    }

    /// [`map::NODE_ADDRS6`].
    pub fn node_addrs6(&mut self) -> Result<HashMap<&mut MapData, Addr6, NodeAddr>> {
        HashMap::try_from(&mut self.node_addrs6).map_err(|e| map_err(map::NODE_ADDRS6, "open", e))
    }

    /// [`map::PORTMAPS6`].
    pub fn portmaps6(&mut self) -> Result<HashMap<&mut MapData, PortKey6, PortTarget6>> {
        HashMap::try_from(&mut self.portmaps6).map_err(|e| map_err(map::PORTMAPS6, "open", e))
    }

    /// [`map::SOCK_REVNAT`].
    pub fn sock_revnat(&mut self) -> Result<HashMap<&mut MapData, SockRevKey, SockRevValue>> {
        HashMap::try_from(&mut self.sock_revnat).map_err(|e| map_err(map::SOCK_REVNAT, "open", e))
    }

    /// [`map::SOCK_REVNAT6`].
    pub fn sock_revnat6(&mut self) -> Result<HashMap<&mut MapData, SockRevKey6, SockRevValue6>> {
        HashMap::try_from(&mut self.sock_revnat6).map_err(|e| map_err(map::SOCK_REVNAT6, "open", e))
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

/// `BPF_MAP_LOOKUP_BATCH` from `linux/bpf.h`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
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
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                std::ptr::from_mut(&mut attr),
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let errno = if rc < 0 {
            std::io::Error::last_os_error().raw_os_error()
        } else {
            None
        };
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
