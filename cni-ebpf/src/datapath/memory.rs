//! What each pinned map holds and what it costs the node: its type, sizes, capacity and
//! kernel memory (the `memlock` the kernel charges for it, as `bpftool map show` reports
//! it — both read `/proc/<pid>/fdinfo/<map fd>`), and how many entries it holds now.
//! Read-only; for `inspect`, the agent's metrics and the bench.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
    path::Path,
};

use serde::Serialize;

use super::{bpf_syscall, Datapath};
use crate::error::{Error, Result};

/// One pinned map, for `inspect --json`, the agent's metrics and the bench.
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
        let counts = self.maps()?.entry_counts()?;
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
