//! Typed access to the pinned maps, and the conversions between Rust types and the
//! network-order fields of `cni-ebpf-common`.

use std::{collections::BTreeMap, net::Ipv4Addr};

use aya::maps::{
    lpm_trie::LpmTrie, Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap,
    PerCpuValues,
};
use cni_ebpf_common::{map, Addr6, EndpointStats, Owner, OWNER_ID_LEN, OWNER_IFNAME_LEN};

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
            slots: std::array::from_fn(|_| None),
        }
    }
}

/// The aya type of a map of the table's kind, borrowing its descriptor.
macro_rules! typed {
    (Hash, $k:ty, $v:ty) => { HashMap<&'a mut MapData, $k, $v> };
    (PerCpuHash, $k:ty, $v:ty) => { PerCpuHashMap<&'a mut MapData, $k, $v> };
    (LpmTrie, $k:ty, $v:ty) => { LpmTrie<&'a mut MapData, $k, $v> };
    (Array, $v:ty) => { Array<&'a mut MapData, $v> };
    (PerCpuArray, $v:ty) => { PerCpuArray<&'a mut MapData, $v> };
}

/// The accessor of one map of the table (none for the program array, which only the
/// loader fills).
macro_rules! accessor {
    (ProgramArray, $name:ident $accessor:ident) => {};
    (RingBuf, $name:ident $accessor:ident) => {};
    ($kind:ident, $name:ident $accessor:ident $($ty:ty),+) => {
        #[doc = concat!("[`map::", stringify!($name), "`], opened on first use.")]
        pub fn $accessor<'a>(&'a mut self) -> Result<typed!($kind, $($ty),+)> {
            self.opener.typed(&mut self.slots[Slot::$name as usize], map::$name)
        }
    };
}

/// Opens one map of the table through its accessor.
macro_rules! open {
    (ProgramArray, $m:ident . $accessor:ident) => {};
    (RingBuf, $m:ident . $accessor:ident) => {};
    ($kind:ident, $m:ident . $accessor:ident) => {
        $m.$accessor()?;
    };
}

/// How many entries one map of the table holds; `None` for arrays, which always hold
/// `max_entries`.
macro_rules! count {
    (Hash, $m:ident . $accessor:ident) => {
        Some(entries(&$m.$accessor()?).len())
    };
    (PerCpuHash, $m:ident . $accessor:ident) => {
        Some(
            $m.$accessor()?
                .keys()
                .filter_map(std::result::Result::ok)
                .count(),
        )
    };
    (LpmTrie, $m:ident . $accessor:ident) => {
        Some(
            $m.$accessor()?
                .keys()
                .filter_map(std::result::Result::ok)
                .count(),
        )
    };
    ($array:ident, $m:ident . $accessor:ident) => {
        None::<usize>
    };
}

/// Everything of [`Maps`] that follows from the table: a slot per map, an accessor per
/// map, opening them all, counting their entries.
macro_rules! maps_from_table {
    ($($(#[$doc:meta])* $name:ident $accessor:ident: $kind:ident<$($ty:ty),*>;)*) => {
        /// Each map's place in [`Slots`] (its place in the table).
        #[expect(clippy::upper_case_acronyms, reason = "the maps' names")]
        #[derive(Clone, Copy)]
        enum Slot {
            $($name,)*
        }

        /// The maps opened so far, one slot per map of the table.
        type Slots = [Option<Map>; [$(Slot::$name),*].len()];

        impl Maps {
            $(accessor!($kind, $name $accessor $($ty),*);)*

            /// Opens every map; typed views fail on a key/value size mismatch (a layout
            /// this binary does not know).
            fn open_all(&mut self) -> Result<()> {
                $(open!($kind, self.$accessor);)*
                Ok(())
            }

            /// Entries held by each map of the table that is not an array.
            pub fn entry_counts(&mut self) -> Result<BTreeMap<&'static str, u64>> {
                let mut out = BTreeMap::new();
                $(
                    if let Some(n) = count!($kind, self.$accessor) {
                        out.insert(map::$name, u64::try_from(n).unwrap_or(u64::MAX));
                    }
                )*
                Ok(out)
            }
        }
    };
}

cni_ebpf_common::map_table!(maps_from_table);

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
