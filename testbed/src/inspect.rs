//! Reading what a test needs to compare: a CNI Result of any version in one shape, the
//! kernel state of a namespace (links, addresses, routes, sysctls), the IPAM store on disk
//! and the datapath as `cni-ebpf inspect` shows it.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::process::ip_json;

fn s(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// Strips a `/prefix` from an address.
#[must_use]
pub fn addr_of(cidr: &str) -> &str {
    cidr.split('/').next().unwrap_or(cidr)
}

/// An entry of a Result's `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultInterface {
    /// `name`.
    pub name: String,
    /// `mac`.
    pub mac: Option<String>,
    /// `mtu` (1.1.0).
    pub mtu: Option<u64>,
    /// `sandbox` (absent for host interfaces).
    pub sandbox: Option<String>,
}

/// An entry of a Result's `ips` (or a legacy `ip4`/`ip6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultIp {
    /// `address` (CIDR).
    pub address: String,
    /// `gateway`.
    pub gateway: Option<String>,
    /// `interface` (index into `interfaces`).
    pub interface: Option<u64>,
    /// `version` (0.3.x/0.4.0 only).
    pub version: Option<String>,
}

impl ResultIp {
    /// Whether this is an IPv6 address.
    #[must_use]
    pub fn is_v6(&self) -> bool {
        self.address.contains(':')
    }

    /// The address without its prefix length.
    #[must_use]
    pub fn ip(&self) -> &str {
        addr_of(&self.address)
    }
}

/// An entry of a Result's `routes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRoute {
    /// `dst` (CIDR).
    pub dst: String,
    /// `gw`.
    pub gw: Option<String>,
}

/// A CNI Result of any version (legacy `ip4`/`ip6` included) read into one shape.
#[derive(Debug, Clone)]
pub struct ResultView {
    /// `cniVersion`.
    pub version: String,
    /// `interfaces` (empty for legacy results).
    pub interfaces: Vec<ResultInterface>,
    /// `ips`, or `ip4` then `ip6`.
    pub ips: Vec<ResultIp>,
    /// `routes` (legacy: the routes of `ip4` and `ip6`).
    pub routes: Vec<ResultRoute>,
    /// `dns` as found (`Null` if absent).
    pub dns: Value,
    /// The document.
    pub raw: Value,
}

fn routes_of(v: Option<&Value>) -> Vec<ResultRoute> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| ResultRoute {
            dst: s(r, "dst").unwrap_or_default(),
            gw: s(r, "gw"),
        })
        .collect()
}

impl ResultView {
    /// Reads `doc`; panics if it is not an object with a `cniVersion`.
    #[track_caller]
    #[must_use]
    pub fn parse(doc: &Value) -> Self {
        let Some(version) = s(doc, "cniVersion") else {
            panic!("result has no cniVersion: {doc}");
        };
        let mut out = Self {
            version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: doc.get("dns").cloned().unwrap_or(Value::Null),
            raw: doc.clone(),
        };
        if out.is_legacy() {
            for key in ["ip4", "ip6"] {
                let Some(ipc) = doc.get(key) else { continue };
                out.ips.push(ResultIp {
                    address: s(ipc, "ip").unwrap_or_default(),
                    gateway: s(ipc, "gateway"),
                    interface: None,
                    version: None,
                });
                out.routes.extend(routes_of(ipc.get("routes")));
            }
            return out;
        }
        for i in doc
            .get("interfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.interfaces.push(ResultInterface {
                name: s(i, "name").unwrap_or_default(),
                mac: s(i, "mac"),
                mtu: i.get("mtu").and_then(Value::as_u64),
                sandbox: s(i, "sandbox").filter(|s| !s.is_empty()),
            });
        }
        for ip in doc
            .get("ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.ips.push(ResultIp {
                address: s(ip, "address").unwrap_or_default(),
                gateway: s(ip, "gateway"),
                interface: ip.get("interface").and_then(Value::as_u64),
                version: s(ip, "version"),
            });
        }
        out.routes = routes_of(doc.get("routes"));
        out
    }

    /// 0.1.0 / 0.2.0.
    #[must_use]
    pub fn is_legacy(&self) -> bool {
        self.version == "0.1.0" || self.version == "0.2.0"
    }

    /// The (first) address of a family; panics if the result has none.
    #[track_caller]
    #[must_use]
    pub fn ip(&self, v6: bool) -> &ResultIp {
        match self.ips.iter().find(|ip| ip.is_v6() == v6) {
            Some(ip) => ip,
            None => panic!(
                "result has no IPv{} address: {}",
                if v6 { 6 } else { 4 },
                self.raw
            ),
        }
    }

    /// The pod's IPv4 address without prefix.
    #[track_caller]
    #[must_use]
    pub fn ip4(&self) -> String {
        self.ip(false).ip().to_owned()
    }

    /// The pod's IPv6 address without prefix.
    #[track_caller]
    #[must_use]
    pub fn ip6(&self) -> String {
        self.ip(true).ip().to_owned()
    }

    /// The first interface without a sandbox (the host veth); panics if none.
    #[track_caller]
    #[must_use]
    pub fn host_interface(&self) -> &ResultInterface {
        match self.interfaces.iter().find(|i| i.sandbox.is_none()) {
            Some(i) => i,
            None => panic!("result lists no host interface: {}", self.raw),
        }
    }

    /// The interface named `ifname` with a sandbox; panics if none.
    #[track_caller]
    #[must_use]
    pub fn container_interface(&self, ifname: &str) -> (usize, &ResultInterface) {
        match self
            .interfaces
            .iter()
            .enumerate()
            .find(|(_, i)| i.name == ifname && i.sandbox.is_some())
        {
            Some(x) => x,
            None => panic!("result lists no container interface {ifname}: {}", self.raw),
        }
    }
}

impl fmt::Display for ResultView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.raw)
    }
}

/// A link as `ip -j -d link show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// `ifname`.
    pub name: String,
    /// `ifindex`.
    pub index: u64,
    /// `address` (MAC).
    pub mac: String,
    /// `mtu`.
    pub mtu: u64,
    /// Administratively up (`UP` in `flags`).
    pub up: bool,
    /// `ifalias`.
    pub alias: Option<String>,
    /// `linkinfo.info_kind` (`veth`, …).
    pub kind: Option<String>,
    /// `link_index`: the peer's ifindex when the peer is in another namespace.
    pub peer_index: Option<u64>,
    /// The whole JSON object.
    pub raw: Value,
}

impl LinkInfo {
    fn from_json(v: &Value) -> Self {
        Self {
            name: s(v, "ifname").unwrap_or_default(),
            index: v.get("ifindex").and_then(Value::as_u64).unwrap_or(0),
            mac: s(v, "address").unwrap_or_default(),
            mtu: v.get("mtu").and_then(Value::as_u64).unwrap_or(0),
            up: v
                .get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x == "UP")),
            alias: s(v, "ifalias"),
            kind: v
                .get("linkinfo")
                .and_then(|l| l.get("info_kind"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            peer_index: v.get("link_index").and_then(Value::as_u64),
            raw: v.clone(),
        }
    }
}

/// Every link of the namespace at `netns`.
#[track_caller]
#[must_use]
pub fn links(netns: &Path) -> Vec<LinkInfo> {
    ip_json(netns, &["-d", "link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .map(LinkInfo::from_json)
        .collect()
}

/// The link `name` in the namespace at `netns`, if it exists.
#[track_caller]
#[must_use]
pub fn link(netns: &Path, name: &str) -> Option<LinkInfo> {
    links(netns).into_iter().find(|l| l.name == name)
}

/// Host veths of cni-ebpf (alias `cni-ebpf/…`) in the namespace at `netns`.
#[track_caller]
#[must_use]
pub fn host_veths(netns: &Path) -> Vec<LinkInfo> {
    links(netns)
        .into_iter()
        .filter(|l| {
            l.alias
                .as_deref()
                .is_some_and(|a| a.starts_with("cni-ebpf/"))
        })
        .collect()
}

/// The alias cni-ebpf gives the host veth of an attachment.
#[must_use]
pub fn host_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("cni-ebpf/{network}/{container_id}/{ifname}")
}

/// Whether `name` has the documented host veth form `ceb` + 12 lowercase hex digits.
#[must_use]
pub fn is_host_veth_name(name: &str) -> bool {
    name.len() == 15
        && name.starts_with("ceb")
        && name[3..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// An address as `ip -j addr show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrInfo {
    /// `inet` or `inet6`.
    pub family: String,
    /// `local`.
    pub local: String,
    /// `prefixlen`.
    pub prefix_len: u64,
    /// `scope`.
    pub scope: String,
    /// The whole JSON object (flags such as `nodad`, `tentative`).
    pub raw: Value,
}

impl AddrInfo {
    /// `local/prefixlen`.
    #[must_use]
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.local, self.prefix_len)
    }

    /// Whether a boolean flag (`nodad`, `tentative`, `dadfailed`, …) is set.
    #[must_use]
    pub fn flag(&self, name: &str) -> bool {
        self.raw.get(name).and_then(Value::as_bool).unwrap_or(false)
    }
}

/// The addresses on `dev` in the namespace at `netns` (empty if `dev` does not exist).
#[track_caller]
#[must_use]
pub fn addresses(netns: &Path, dev: &str) -> Vec<AddrInfo> {
    ip_json(netns, &["addr", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l.get("ifname").and_then(Value::as_str) == Some(dev))
        .flat_map(|l| {
            l.get("addr_info")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .map(|a| AddrInfo {
            family: s(&a, "family").unwrap_or_default(),
            local: s(&a, "local").unwrap_or_default(),
            prefix_len: a.get("prefixlen").and_then(Value::as_u64).unwrap_or(0),
            scope: s(&a, "scope").unwrap_or_default(),
            raw: a,
        })
        .collect()
}

/// The global-scope addresses on `dev` as `addr/prefix`, sorted (link-local left out).
#[track_caller]
#[must_use]
pub fn global_addresses(netns: &Path, dev: &str) -> Vec<String> {
    let mut v: Vec<String> = addresses(netns, dev)
        .iter()
        .filter(|a| a.scope == "global")
        .map(AddrInfo::cidr)
        .collect();
    v.sort();
    v
}

/// A route as `ip -j route show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    /// `dst` (`default` normalised to `0.0.0.0/0` or `::/0`; host routes without prefix
    /// get `/32` or `/128`).
    pub dst: String,
    /// `gateway`.
    pub gw: Option<String>,
    /// `dev`.
    pub dev: Option<String>,
    /// `protocol` (`kernel`, `boot`, `206`, …).
    pub protocol: Option<String>,
    /// `scope` (`link`, … ; absent means universe).
    pub scope: Option<String>,
    /// `type` (absent means unicast).
    pub kind: Option<String>,
    /// The whole JSON object.
    pub raw: Value,
}

impl fmt::Display for RouteInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.raw)
    }
}

/// Normalises a route destination: `default` → `0.0.0.0/0` / `::/0`, a bare address →
/// host prefix.
#[must_use]
pub fn normalise_dst(dst: &str, v6: bool) -> String {
    if dst == "default" {
        return if v6 { "::/0" } else { "0.0.0.0/0" }.to_owned();
    }
    if dst.contains('/') {
        return dst.to_owned();
    }
    format!("{dst}/{}", if v6 { 128 } else { 32 })
}

/// The routes of one family in `table` (`main`, `local`, `all`) of the namespace at `netns`.
#[track_caller]
#[must_use]
pub fn routes(netns: &Path, v6: bool, table: &str) -> Vec<RouteInfo> {
    let fam = if v6 { "-6" } else { "-4" };
    ip_json(netns, &[fam, "route", "show", "table", table])
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| RouteInfo {
            dst: normalise_dst(&s(r, "dst").unwrap_or_default(), v6),
            gw: s(r, "gateway"),
            dev: s(r, "dev"),
            protocol: r.get("protocol").map(|p| match p {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
            scope: s(r, "scope"),
            kind: s(r, "type"),
            raw: r.clone(),
        })
        .collect()
}

/// Both families of the main table.
#[track_caller]
#[must_use]
pub fn main_routes(netns: &Path) -> Vec<RouteInfo> {
    let mut v = routes(netns, false, "main");
    v.extend(routes(netns, true, "main"));
    v
}

/// Reads one sysctl (`net.ipv4.ip_forward` form) as seen inside the namespace at `netns`;
/// `None` if it does not exist there.
#[track_caller]
#[must_use]
pub fn sysctl(netns: &Path, key: &str) -> Option<String> {
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    crate::net::in_netns(netns, move || {
        std::fs::read_to_string(&path)
            .ok()
            .map(|v| v.trim().to_owned())
    })
}

/// Writes one sysctl (`net.ipv6.conf.x.accept_dad` form) inside the namespace at `netns`;
/// panics if it cannot.
#[track_caller]
pub fn set_sysctl(netns: &Path, key: &str, value: &str) {
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    let value = value.to_owned();
    let res = crate::net::in_netns(netns, move || std::fs::write(&path, value));
    if let Err(e) = res {
        panic!("cannot set {key} in {}: {e}", netns.display());
    }
}

/// Every readable sysctl below `net.` inside the namespace at `netns`, with its value.
#[track_caller]
#[must_use]
pub fn net_sysctls(netns: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&p, out),
                Ok(t) if t.is_file() => {
                    if let (Ok(v), Ok(rel)) =
                        (std::fs::read_to_string(&p), p.strip_prefix("/proc/sys"))
                    {
                        let key = rel.to_string_lossy().replace('/', ".");
                        out.insert(key, v.trim().to_owned());
                    }
                }
                _ => {}
            }
        }
    }
    crate::net::in_netns(netns, || {
        let mut out = BTreeMap::new();
        walk(Path::new("/proc/sys/net"), &mut out);
        out
    })
}

/// The files of one network's IPAM store (`<dataDir>/<network>/`), classified.
///
/// Layout (cni-ebpf's `ipam` module): `lock` (flock target), `meta` (format and boot
/// id), `last_reserved_ip.<n>` (round-robin cursors, host-local's name), `index/<range>`
/// (bitmaps: a set bit means "held"), `keys/<container ID>:<ifname>` (one per
/// reservation), `ips/<address>` (one per held address), `tmp/` (in-flight writes).
#[derive(Debug, Clone)]
pub struct StoreView {
    /// The store directory.
    pub dir: PathBuf,
    /// Names in `keys/`: one per reservation.
    pub keys: Vec<String>,
    /// Names in `ips/`: one per held address.
    pub ips: Vec<String>,
    /// Names in `tmp/`.
    pub tmp: Vec<String>,
    /// `index/` bitmaps with at least one set bit, with the count of set bits.
    pub set_bits: Vec<(String, u32)>,
    /// Files outside the documented layout.
    pub unexpected: Vec<PathBuf>,
}

impl StoreView {
    /// Reads the store at `dir` (all lists empty if it does not exist).
    #[must_use]
    pub fn read(dir: &Path) -> Self {
        let mut v = Self {
            dir: dir.to_path_buf(),
            keys: Vec::new(),
            ips: Vec::new(),
            tmp: Vec::new(),
            set_bits: Vec::new(),
            unexpected: Vec::new(),
        };
        for rel in crate::node::list_tree(dir) {
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match parts.as_slice() {
                [d] if ["ips", "keys", "tmp", "index"].contains(&d.as_str()) => {}
                [f] if f == "lock"
                    || f == "meta"
                    || f == "veths.lock"
                    || f == "teardowns.lock"
                    || f == "flows-purge"
                    || f == "veths-delete"
                    || f.starts_with("last_reserved_ip.") => {}
                [d, f] if d == "keys" => v.keys.push(f.clone()),
                [d, f] if d == "ips" => v.ips.push(f.clone()),
                [d, f] if d == "tmp" => v.tmp.push(f.clone()),
                [d, f] if d == "index" => {
                    let bytes = std::fs::read(dir.join(&rel)).unwrap_or_default();
                    let n: u32 = bytes.iter().map(|b| b.count_ones()).sum();
                    if n > 0 {
                        v.set_bits.push((f.clone(), n));
                    }
                }
                _ => v.unexpected.push(rel),
            }
        }
        v
    }

    /// Whether `(container_id, ifname)` holds a reservation.
    #[must_use]
    pub fn has_key(&self, container_id: &str, ifname: &str) -> bool {
        self.keys.contains(&format!("{container_id}:{ifname}"))
    }

    /// Panics unless the store holds nothing: no reservation, no held address, no set
    /// index bit, no temp file and nothing outside the layout. What may remain after
    /// every reservation is released: the directories, `lock`, `meta`, the cursors and
    /// all-zero index bitmaps.
    #[track_caller]
    pub fn assert_empty(&self, context: &str) {
        assert!(
            self.keys.is_empty()
                && self.ips.is_empty()
                && self.tmp.is_empty()
                && self.set_bits.is_empty()
                && self.unexpected.is_empty(),
            "{context}: the IPAM store {} is not empty: {self:#?}",
            self.dir.display()
        );
    }
}
