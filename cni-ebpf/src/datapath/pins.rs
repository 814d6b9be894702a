//! The one place that defines where everything of a network lives in bpffs.
//!
//! ```text
//! <bpffsRoot>/<network>/                 network directory; flock()ed while loading
//! <bpffsRoot>/<network>/v12/              layout version (cni_ebpf_common::LAYOUT_VERSION)
//!     maps/<MAP>                         every map of the object, pinned by name
//!     progs/<program>                    from_pod, uplink_ingress, uplink_egress, …
//!     links/ep-<host veth name>          tcx link of from_pod on a host veth (ingress),
//!                                        or netkit link of from_netkit (netkit pod)
//!     links/to-<host veth name>          tcx link of to_pod (egress), or netkit link of
//!                                        to_netkit
//!     links/uplink-<ifname>-ingress      tcx link of uplink_ingress
//!     links/uplink-<ifname>-egress       tcx link of uplink_egress
//!     links/tunnel-ingress, tunnel-egress tcx links of from_tunnel and to_tunnel on the
//!                                        tunnel device
//!     links/cgroup-<sock program>        cgroup link of a socket program (host ports for
//!                                        the node's own sockets)
//!     object-<x_y_z>-<hash>/             marker: the object whose programs are pinned
//!                                        (an empty directory; `upgrade.rs`)
//! ```
//! A binary only uses the `v<LAYOUT_VERSION>` tree; finding another `v*` directory means
//! another (older or newer) cni-ebpf owns this network's datapath and is reported as such.
//! Maps are pinned before programs and programs in a fixed order, so "every program pin
//! present" means "fully loaded".

use std::{
    io,
    path::{Path, PathBuf},
};

use cni_ebpf_common::{map, prog, LAYOUT_VERSION};

use crate::error::{Error, Result};

/// Name of the version directory this binary uses.
#[must_use]
pub fn version_dir_name() -> String {
    // The test build can play a binary of another layout (`testbed/tests/e2e/upgrade.rs`).
    #[cfg(feature = "fault-injection")]
    if let Ok(v) = std::env::var("CNI_EBPF_LAYOUT_VERSION") {
        return format!("v{v}");
    }
    format!("v{LAYOUT_VERSION}")
}

/// Paths of one network's pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    network: PathBuf,
}

/// Direction of an uplink attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// tc ingress.
    Ingress,
    /// tc egress.
    Egress,
}

impl Direction {
    /// `ingress` / `egress`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

impl Pins {
    /// The pins of the network whose directory is `network_dir` (`<bpffsRoot>/<network>`).
    #[must_use]
    pub fn new(network_dir: impl Into<PathBuf>) -> Self {
        Self {
            network: network_dir.into(),
        }
    }

    /// `<bpffsRoot>/<network>`.
    #[must_use]
    pub fn network_dir(&self) -> &Path {
        &self.network
    }

    /// `<bpffsRoot>/<network>/v<LAYOUT_VERSION>`.
    #[must_use]
    pub fn version_dir(&self) -> PathBuf {
        self.network.join(version_dir_name())
    }

    /// Directory of the map pins.
    #[must_use]
    pub fn maps_dir(&self) -> PathBuf {
        self.version_dir().join("maps")
    }

    /// Pin of map `name`.
    #[must_use]
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Directory of the program pins.
    #[must_use]
    pub fn progs_dir(&self) -> PathBuf {
        self.version_dir().join("progs")
    }

    /// Pin of program `name`.
    #[must_use]
    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }

    /// Directory of the link pins.
    #[must_use]
    pub fn links_dir(&self) -> PathBuf {
        self.version_dir().join("links")
    }

    /// Pin of the `from_pod` link on host veth `host_ifname` (`from_netkit`'s on a netkit
    /// pod's host device).
    #[must_use]
    pub fn endpoint_link(&self, host_ifname: &str) -> PathBuf {
        self.links_dir().join(format!("ep-{host_ifname}"))
    }

    /// Pin of the `to_pod` link on host veth `host_ifname` (its egress; `to_netkit`'s on a
    /// netkit pod's host device).
    #[must_use]
    pub fn endpoint_egress_link(&self, host_ifname: &str) -> PathBuf {
        self.links_dir().join(format!("to-{host_ifname}"))
    }

    /// Pin of an uplink program's link.
    #[must_use]
    pub fn uplink_link(&self, ifname: &str, dir: Direction) -> PathBuf {
        self.links_dir()
            .join(format!("uplink-{ifname}-{}", dir.as_str()))
    }

    /// Pin of a tunnel program's link (bpffs names cannot hold the device name's dot).
    #[must_use]
    pub fn tunnel_link(&self, dir: Direction) -> PathBuf {
        self.links_dir().join(format!("tunnel-{}", dir.as_str()))
    }

    /// Pin of a socket program's cgroup link.
    #[must_use]
    pub fn socket_link(&self, prog_name: &str) -> PathBuf {
        self.links_dir().join(format!("cgroup-{prog_name}"))
    }

    /// The object markers (`object-…` directories, [`super::object::stamp`]) in the
    /// version directory: normally one, the object whose programs are pinned.
    pub fn stamps(&self) -> Result<Vec<String>> {
        let mut v: Vec<String> = names_in(&self.version_dir())?
            .into_iter()
            .filter(|n| n.starts_with("object-"))
            .collect();
        v.sort();
        Ok(v)
    }

    /// Every program pin present.
    #[must_use]
    pub fn programs_pinned(&self) -> bool {
        all_present(&self.progs_dir(), &prog::ALL)
    }

    /// Every map pin present.
    #[must_use]
    pub fn maps_pinned(&self) -> bool {
        all_present(&self.maps_dir(), map::ALL)
    }

    /// Fully loaded: every map and program pinned.
    #[must_use]
    pub fn complete(&self) -> bool {
        self.maps_pinned() && self.programs_pinned()
    }

    /// The missing pins, for error messages.
    #[must_use]
    pub fn missing(&self) -> Vec<PathBuf> {
        map::ALL
            .iter()
            .map(|m| self.map(m))
            .chain(prog::ALL.iter().map(|p| self.prog(p)))
            .filter(|p| !p.exists())
            .collect()
    }

    /// Layout versions other than ours found in the network directory.
    pub fn foreign_versions(&self) -> Result<Vec<String>> {
        let ours = version_dir_name();
        Ok(names_in(&self.network)?
            .into_iter()
            .filter(|n| {
                n.len() > 1 && n.starts_with('v') && n[1..].bytes().all(|b| b.is_ascii_digit())
            })
            .filter(|n| *n != ours)
            .collect())
    }

    /// Creates the directory tree (idempotent).
    pub fn create_dirs(&self) -> Result<()> {
        for d in [self.maps_dir(), self.progs_dir(), self.links_dir()] {
            std::fs::create_dir_all(&d)
                .map_err(|e| Error::io(format!("creating pin directory {}", d.display()), e))?;
        }
        Ok(())
    }

    /// Host veth names that have a pinned endpoint link.
    pub fn endpoint_links(&self) -> Result<Vec<String>> {
        Ok(names_in(&self.links_dir())?
            .into_iter()
            .filter_map(|n| n.strip_prefix("ep-").map(str::to_owned))
            .collect())
    }
}

/// Whether directory `dir` holds an entry for each of `names`: one listing, rather than
/// a `stat` per pin (every ADD checks the 40 pins). An unreadable directory holds none.
fn all_present(dir: &Path, names: &[&str]) -> bool {
    let Ok(have) = names_in(dir) else {
        return false;
    };
    names.iter().all(|n| have.iter().any(|h| h == n))
}

/// The (UTF-8) names in directory `dir`; none when it does not exist.
fn names_in(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
    };
    Ok(entries
        .filter_map(std::result::Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let p = Pins::new("/sys/fs/bpf/cni-ebpf/net1");
        assert_eq!(
            p.map("NAT"),
            Path::new("/sys/fs/bpf/cni-ebpf/net1/v12/maps/NAT")
        );
        assert_eq!(
            p.prog("from_pod"),
            Path::new("/sys/fs/bpf/cni-ebpf/net1/v12/progs/from_pod")
        );
        assert_eq!(
            p.endpoint_link("veth1234"),
            Path::new("/sys/fs/bpf/cni-ebpf/net1/v12/links/ep-veth1234")
        );
        assert_eq!(
            p.uplink_link("eth0", Direction::Egress),
            Path::new("/sys/fs/bpf/cni-ebpf/net1/v12/links/uplink-eth0-egress")
        );
    }

    #[test]
    fn foreign_versions_of_missing_dir_is_empty() {
        let p = Pins::new("/nonexistent/cni-ebpf/x");
        assert!(matches!(p.foreign_versions(), Ok(v) if v.is_empty()));
    }
}
