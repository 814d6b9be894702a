//! A reservation record — what `keys/<container ID>:<ifname>` holds (and, as hard links,
//! `ips/<address>`) — and the key file names; the store (`store.rs`) writes and reads
//! them, the allocator decides with them, `inspect` shows the pod they name.

use std::path::Path;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A reservation record as stored in `keys/<container ID>:<ifname>` (and shared, as a hard
/// link, by `ips/<address>` for each of its addresses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// `CNI_CONTAINERID`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The addresses with their range's prefix length, one per range set.
    pub addresses: Vec<IpNet>,
    /// `/proc/sys/kernel/random/boot_id` when the reservation was made.
    pub boot_id: String,
    /// `CNI_NETNS` at ADD time, for diagnostics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// Seconds since the Unix epoch when the reservation was made.
    #[serde(default)]
    pub created: u64,
    /// The Kubernetes pod the runtime named in `CNI_ARGS` (`K8S_POD_*`), for `inspect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A Kubernetes pod, as kubelet's runtime names it in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`, when the runtime passes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl PodRef {
    /// The pod named by `K8S_POD_NAMESPACE` and `K8S_POD_NAME`, if both are set.
    #[must_use]
    pub fn from_args(args: &crate::cni::env::CniArgs) -> Option<Self> {
        let namespace = args.get("K8S_POD_NAMESPACE").filter(|v| !v.is_empty())?;
        let name = args.get("K8S_POD_NAME").filter(|v| !v.is_empty())?;
        Some(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: args
                .get("K8S_POD_UID")
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
        })
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Who a reservation is for, beyond its key: kept in the record for diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    /// `CNI_NETNS` at ADD time.
    pub netns: Option<String>,
    /// The Kubernetes pod, if the runtime named one.
    pub pod: Option<PodRef>,
}

impl Record {
    /// The key file name of this record.
    pub fn key_name(&self) -> Result<String> {
        key_name(&self.container_id, &self.ifname)
    }
}

/// The file name of the key `(container ID, ifname)`: `<container ID>:<ifname>`. A
/// container ID never contains `:` (the spec restricts it to `[a-zA-Z0-9_.-]`), so the
/// name splits back unambiguously at the first `:`.
pub fn key_name(container_id: &str, ifname: &str) -> Result<String> {
    if container_id.is_empty() || container_id.contains(['/', ':', '\0']) {
        return Err(Error::env(
            "CNI_CONTAINERID",
            format!("{container_id:?} cannot name an IPAM reservation"),
        ));
    }
    if ifname.is_empty() || ifname.contains(['/', '\0']) {
        return Err(Error::env(
            "CNI_IFNAME",
            format!("{ifname:?} cannot name an IPAM reservation"),
        ));
    }
    let name = format!("{container_id}:{ifname}");
    if name.len() > 255 {
        // The room a container ID has next to this ifname and the ':'. The ifname comes
        // from a record on disk as well as from CNI_IFNAME, so it may leave none (found
        // by the `store_record` fuzz target: `254 - ifname.len()` overflowed).
        let room = 254usize.saturating_sub(ifname.len());
        if room == 0 {
            return Err(Error::env(
                "CNI_IFNAME",
                format!(
                    "is {} bytes long; too long to name an IPAM reservation",
                    ifname.len()
                ),
            ));
        }
        return Err(Error::env(
            "CNI_CONTAINERID",
            format!(
                "is {} bytes long; the IPAM store supports container IDs of up to {room} \
                 bytes with this interface name",
                container_id.len(),
            ),
        ));
    }
    Ok(name)
}

/// Splits a key file name back into `(container ID, ifname)`.
#[must_use]
pub fn split_key_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(':')
}

/// Parses the bytes of a record file (`keys/…`, `ips/…`). `None` for anything that is not
/// a whole record (a torn or foreign file): the allocator then treats the name as held by
/// an unreadable record and repairs it. Never fails otherwise; fuzzed by `fuzz/`'s
/// `store_record` target.
#[must_use]
pub fn parse_record(bytes: &[u8]) -> Option<Record> {
    serde_json::from_slice(bytes).ok()
}

/// The pod of each (container ID, ifname) the store at `store_dir` has a record for
/// (read without the store's lock: a record is written whole, by rename).
#[must_use]
pub fn pods_of(store_dir: &Path) -> std::collections::HashMap<(String, String), PodRef> {
    read_records_unlocked(store_dir)
        .into_iter()
        .filter_map(|r| Some(((r.container_id, r.ifname), r.pod?)))
        .collect()
}

/// The records under `keys/` of the store at `path`, read without taking the store's lock
/// (for `inspect`): each record file is replaced whole by a rename, so a record read is
/// either complete or skipped. Files that do not parse are skipped; a missing store is
/// empty.
#[must_use]
pub fn read_records_unlocked(path: &Path) -> Vec<Record> {
    let Ok(dir) = std::fs::read_dir(path.join("keys")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| parse_record(&b))
        .collect()
}

#[cfg(test)]
mod tests {
    #![expect(clippy::panic, reason = "tests")]

    use super::*;

    /// Minimized from the `store_record` fuzz target: a record whose ifname is longer than
    /// a key file name can be used to panic on an overflow computing the error message.
    #[test]
    fn record_with_an_overlong_ifname_is_refused_not_a_panic() {
        let ifname = "L".repeat(300);
        let bytes = format!(
            r#"{{"containerID":"abc123","ifname":"{ifname}","addresses":[],"bootId":"b"}}"#
        );
        let Some(record) = parse_record(bytes.as_bytes()) else {
            panic!("a well-formed record must parse");
        };
        match record.key_name() {
            Err(e) => assert!(e.to_string().contains("CNI_IFNAME"), "{e}"),
            Ok(name) => panic!("{name:?} cannot be a file name"),
        }
        // Exactly no room left for a container ID, and one byte of room.
        assert!(key_name("a", &"i".repeat(254)).is_err());
        match key_name("ab", &"i".repeat(253)) {
            Err(e) => assert!(e.to_string().contains("up to 1 bytes"), "{e}"),
            Ok(name) => panic!("{name:?} is longer than 255 bytes"),
        }
        assert!(key_name("a", &"i".repeat(253)).is_ok());
    }
}
