//! What each pinned map holds and what it costs the node: its type, sizes, capacity and
//! kernel memory (the `memlock` the kernel charges for it, as `bpftool map show` reports
//! it — both read `/proc/<pid>/fdinfo/<map fd>`), and how many entries it holds now.
//! Read-only; for `inspect`, `metrics` and the bench.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::Path,
};

use aya::maps::{lpm_trie::LpmTrie, PerCpuHashMap};
use cni_ebpf_common::map as map_name;
use serde::Serialize;

use super::{bpf_syscall, maps, Datapath};
use crate::error::{Error, Result};

/// One pinned map, for `inspect --json`, `metrics` and the bench.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MapStats {
    /// Pin name (`NAT`, `ENDPOINTS`, …).
    pub name: String,
    /// Kernel map type, as bpftool names it (`hash`, `lru_hash`, `percpu_array`, …).
    #[serde(rename = "type")]
    pub map_type: String,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes (per CPU for per-CPU maps).
    pub value_size: u32,
    /// Capacity.
    pub max_entries: u32,
    /// Entries held now (arrays always hold `max_entries`); `None` for a map this binary
    /// does not know.
    pub entries: Option<u64>,
    /// Kernel memory charged for the map (fdinfo `memlock`), in bytes. Hash maps and
    /// arrays are preallocated, so theirs does not grow with `entries` (the LPM trie's
    /// does).
    pub memlock_bytes: u64,
}

/// What fdinfo says about one map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapFdInfo {
    /// `map_type` (numeric, `enum bpf_map_type`).
    pub map_type: u32,
    /// `key_size`.
    pub key_size: u32,
    /// `value_size`.
    pub value_size: u32,
    /// `max_entries`.
    pub max_entries: u32,
    /// `memlock`, bytes.
    pub memlock: u64,
}

/// Parses the text of `/proc/<pid>/fdinfo/<map fd>`; `None` unless it describes a map.
#[must_use]
pub fn parse_fdinfo(text: &str) -> Option<MapFdInfo> {
    let mut out = MapFdInfo::default();
    let mut is_map = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "map_type" => {
                out.map_type = value.parse().ok()?;
                is_map = true;
            }
            "key_size" => out.key_size = value.parse().ok()?,
            "value_size" => out.value_size = value.parse().ok()?,
            "max_entries" => out.max_entries = value.parse().ok()?,
            "memlock" => out.memlock = value.parse().ok()?,
            _ => {}
        }
    }
    is_map.then_some(out)
}

/// Reads fdinfo of a map descriptor of this process.
pub fn fdinfo(fd: BorrowedFd<'_>) -> Result<MapFdInfo> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {path}"), e))?;
    parse_fdinfo(&text)
        .ok_or_else(|| Error::datapath(format!("reading {path}"), "not a BPF map descriptor"))
}

/// fdinfo of the map pinned at `path` (opened read-only for the read).
pub fn pinned_fdinfo(path: &Path) -> Result<MapFdInfo> {
    let fd = bpf_syscall::obj_get_read_only(path)
        .map_err(|e| Error::io(format!("opening pinned map {}", path.display()), e))?;
    fdinfo(fd.as_fd())
}

/// bpftool's name of a kernel map type (`enum bpf_map_type`).
#[must_use]
pub fn map_type_name(t: u32) -> String {
    match t {
        1 => "hash".into(),
        2 => "array".into(),
        3 => "prog_array".into(),
        4 => "perf_event_array".into(),
        5 => "percpu_hash".into(),
        6 => "percpu_array".into(),
        7 => "stack_trace".into(),
        8 => "cgroup_array".into(),
        9 => "lru_hash".into(),
        10 => "lru_percpu_hash".into(),
        11 => "lpm_trie".into(),
        12 => "array_of_maps".into(),
        13 => "hash_of_maps".into(),
        27 => "ringbuf".into(),
        n => format!("type_{n}"),
    }
}

impl Datapath {
    /// Every pinned map of the network (sorted by name) with its capacity, fill and kernel
    /// memory. Reads every entry of every hash map (in batches), NAT and FLOWS included.
    pub fn map_stats(&self) -> Result<Vec<MapStats>> {
        let counts = self.entry_counts()?;
        let dir = self.pins().maps_dir();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?
            .filter_map(std::result::Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let info = pinned_fdinfo(&dir.join(&name))?;
            let map_type = map_type_name(info.map_type);
            let entries = if map_type.contains("array") {
                Some(u64::from(info.max_entries))
            } else {
                counts.get(name.as_str()).copied()
            };
            out.push(MapStats {
                name,
                map_type,
                key_size: info.key_size,
                value_size: info.value_size,
                max_entries: info.max_entries,
                entries,
                memlock_bytes: info.memlock,
            });
        }
        Ok(out)
    }

    /// Entries held by each (non-array) map this binary knows.
    fn entry_counts(&self) -> Result<BTreeMap<&'static str, u64>> {
        let mut m = self.maps()?;
        let n = |len: usize| u64::try_from(len).unwrap_or(u64::MAX);
        let mut out = BTreeMap::new();
        out.insert(map_name::ENDPOINTS, n(maps::entries(&m.endpoints()?).len()));
        out.insert(map_name::PORTMAPS, n(maps::entries(&m.portmaps()?).len()));
        out.insert(map_name::NAT, n(maps::entries(&m.nat()?).len()));
        out.insert(
            map_name::NODE_ADDRS,
            n(maps::entries(&m.node_addrs()?).len()),
        );
        out.insert(map_name::OWNERS, n(maps::entries(&m.owners()?).len()));
        out.insert(map_name::FLOWS, n(maps::entries(&m.flows()?).len()));
        out.insert(
            map_name::STACK_SOCKETS,
            n(maps::entries(&m.stack_sockets()?).len()),
        );
        out.insert(
            map_name::SOCK_REVNAT,
            n(maps::entries(&m.sock_revnat()?).len()),
        );
        out.insert(map_name::PACING, n(maps::entries(&m.pacing()?).len()));
        let stats: PerCpuHashMap<_, u32, cni_ebpf_common::EndpointStats> = m.ep_stats()?;
        out.insert(
            map_name::EP_STATS,
            n(stats.keys().filter_map(std::result::Result::ok).count()),
        );
        let allow: LpmTrie<_, cni_ebpf_common::SrcAllowKey, u32> = m.src_allow()?;
        out.insert(
            map_name::SRC_ALLOW,
            n(allow.keys().filter_map(std::result::Result::ok).count()),
        );
        let allow6: LpmTrie<_, cni_ebpf_common::SrcAllow6Key, u32> = m.src_allow6()?;
        out.insert(
            map_name::SRC_ALLOW6,
            n(allow6.keys().filter_map(std::result::Result::ok).count()),
        );
        out.insert(map_name::NAT_USE, n(maps::entries(&m.nat_use()?).len()));
        out.insert(
            map_name::NAT_DEST_USE,
            n(maps::entries(&m.nat_dest_use()?).len()),
        );
        out.insert(
            map_name::ENDPOINTS6,
            n(maps::entries(&m.endpoints6()?).len()),
        );
        out.insert(map_name::NAT6, n(maps::entries(&m.nat6()?).len()));
        out.insert(
            map_name::NAT_DEST_USE6,
            n(maps::entries(&m.nat_dest_use6()?).len()),
        );
        out.insert(map_name::FLOWS6, n(maps::entries(&m.flows6()?).len()));
        out.insert(
            map_name::STACK_SOCKETS6,
            n(maps::entries(&m.stack_sockets6()?).len()),
        );
        out.insert(
            map_name::NODE_ADDRS6,
            n(maps::entries(&m.node_addrs6()?).len()),
        );
        out.insert(map_name::PORTMAPS6, n(maps::entries(&m.portmaps6()?).len()));
        out.insert(
            map_name::SOCK_REVNAT6,
            n(maps::entries(&m.sock_revnat6()?).len()),
        );
        out.insert(
            map_name::POLICY_ENDPOINTS,
            n(maps::entries(&m.policy_endpoints()?).len()),
        );
        let peers: LpmTrie<_, cni_ebpf_common::PolicyPeerKey, u64> = m.policy_peers()?;
        out.insert(
            map_name::POLICY_PEERS,
            n(peers.keys().filter_map(std::result::Result::ok).count()),
        );
        let ports: LpmTrie<_, cni_ebpf_common::PolicyPortKey, u64> = m.policy_ports()?;
        out.insert(
            map_name::POLICY_PORTS,
            n(ports.keys().filter_map(std::result::Result::ok).count()),
        );
        out.insert(
            map_name::POLICY_EXACT,
            n(maps::entries(&m.policy_exact()?).len()),
        );
        out.insert(
            map_name::POLICY_FLOWS,
            n(maps::entries(&m.policy_flows()?).len()),
        );
        out.insert(
            map_name::POLICY_NAMESPACES,
            n(maps::entries(&m.policy_namespaces()?).len()),
        );
        let tunnel: LpmTrie<_, cni_ebpf_common::TunnelKey, cni_ebpf_common::TunnelEndpoint> =
            m.tunnel_endpoints()?;
        out.insert(
            map_name::TUNNEL_ENDPOINTS,
            n(tunnel.keys().filter_map(std::result::Result::ok).count()),
        );
        out.insert(
            map_name::TUNNEL_NODES,
            n(maps::entries(&m.tunnel_nodes()?).len()),
        );
        out.insert(map_name::SERVICES, n(maps::entries(&m.services()?).len()));
        out.insert(
            map_name::SERVICE_BACKENDS,
            n(maps::entries(&m.service_backends()?).len()),
        );
        out.insert(
            map_name::SERVICE_MEMBERS,
            n(maps::entries(&m.service_members()?).len()),
        );
        out.insert(
            map_name::SERVICE_AFFINITY,
            n(maps::entries(&m.service_affinity()?).len()),
        );
        out.insert(
            map_name::SERVICE_NETNS,
            n(maps::entries(&m.service_netns()?).len()),
        );
        let counts: PerCpuHashMap<_, u32, cni_ebpf_common::PolicyCounts> = m.policy_counts()?;
        out.insert(
            map_name::POLICY_COUNTS,
            n(counts.keys().filter_map(std::result::Result::ok).count()),
        );
        Ok(out)
    }
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_of_a_map_is_parsed() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2057\nmap_type:\t9\n\
                    key_size:\t16\nvalue_size:\t24\nmax_entries:\t131072\nmap_flags:\t0x0\n\
                    map_extra:\t0x0\nmemlock:\t14176256\nmap_id:\t42\nfrozen:\t0\n";
        let info = parse_fdinfo(text).unwrap_or_else(|| panic!("not parsed"));
        assert_eq!(
            info,
            MapFdInfo {
                map_type: 9,
                key_size: 16,
                value_size: 24,
                max_entries: 131_072,
                memlock: 14_176_256,
            }
        );
        assert_eq!(map_type_name(info.map_type), "lru_hash");
    }

    #[test]
    fn fdinfo_of_something_else_is_not_a_map() {
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t1\n"), None);
        assert_eq!(parse_fdinfo("map_type:\tx\n"), None);
    }
}
