//! The `ipam` object of the network configuration: host-local's schema, validated.
//!
//! Accepted forms (all may be combined, the legacy range comes first, as in host-local):
//!
//! ```json
//! { "ranges": [ [ {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.99",
//!                  "gateway": "10.1.0.1"},
//!                 {"subnet": "10.2.0.0/24"} ],
//!               [ {"subnet": "fd00:1::/64"} ] ],
//!   "subnet": "10.3.0.0/16", "rangeStart": "...", "rangeEnd": "...", "gateway": "...",
//!   "routes": [ {"dst": "0.0.0.0/0"} ],
//!   "dns": { "nameservers": ["10.1.0.53"] }, "resolvConf": "/etc/resolv.conf" }
//! ```
//!
//! Each *range set* yields one address, so two range sets give a dual-stack pod. All ranges
//! of a set have one family; no two ranges (in a set or across sets) overlap.
//!
//! # Defaults and small subnets
//!
//! As host-local: the gateway defaults to the first usable address (network + 1), the range
//! runs from network + 1 to the last usable address (IPv4: broadcast − 1; IPv6: the last
//! address, IPv6 has no broadcast). The network address (IPv6: the subnet-router anycast
//! address), the IPv4 broadcast address and the gateway are never handed out; a
//! `rangeStart`/`rangeEnd`/`gateway` that names the network or broadcast address is refused
//! rather than silently moved. host-local refuses /31, /32, /127 and /128; we serve them:
//!
//! - **/31 and /127** (point-to-point links, RFC 3021 and RFC 6164): both addresses are
//!   usable, there is no network or broadcast address. The gateway defaults to the lower
//!   address, so exactly one address (the upper) is handed out.
//! - **/32 and /128**: the subnet is the one address, which is handed out; there is no
//!   default gateway (the result has none) and an explicit gateway is refused, since it
//!   would leave nothing to hand out. Useful for routed (`/32` per pod) designs.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    cni::{
        config::NetConf,
        env::Env,
        result::{parse_routes, Dns, Route},
    },
    error::{Error, Result},
};

/// The `ipam.type` (and the absence of one) that selects the embedded allocator.
pub const EMBEDDED_TYPE: &str = "cni-ebpf";

/// One range of a range set, canonicalised: every bound is filled in and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet; its prefix length is the prefix of the addresses handed out.
    pub subnet: IpNet,
    /// First address that may be handed out (inclusive).
    pub range_start: IpAddr,
    /// Last address that may be handed out (inclusive).
    pub range_end: IpAddr,
    /// The gateway (never handed out); `None` only for /32 and /128 subnets.
    pub gateway: Option<IpAddr>,
}

/// A list of ranges of one family from which one address is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    /// The ranges, in configuration order (round-robin walks them in this order).
    pub ranges: Vec<Range>,
}

/// The validated configuration of the embedded allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// The range sets; one address is reserved in each.
    pub range_sets: Vec<RangeSet>,
    /// `ipam.routes`, passed into the result unchanged (ADD first refuses a `gw` of the
    /// other family than its `dst`: [`IpamConfig::check_routes`]).
    pub routes: Vec<Route>,
    /// `ipam.dns`.
    pub dns: Dns,
    /// `ipam.resolvConf`: a resolv.conf whose settings fill the result's DNS when
    /// `ipam.dns` is empty.
    pub resolv_conf: Option<PathBuf>,
}

/// What the `ipam` object asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipam {
    /// No `ipam.type`, or `cni-ebpf`: the embedded allocator.
    Embedded(IpamConfig),
    /// Any other `ipam.type`: the IPAM plugin binary of that name, found in `CNI_PATH`.
    Delegate(String),
}

/// Converts an address to a number (IPv4 in the low 32 bits).
#[must_use]
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Converts a number back to an address of the given family (IPv4 uses the low 32 bits).
#[must_use]
pub fn u128_to_ip(value: u128, v4: bool) -> IpAddr {
    if v4 {
        let v = u32::try_from(value & 0xffff_ffff).unwrap_or(u32::MAX);
        IpAddr::V4(Ipv4Addr::from(v))
    } else {
        IpAddr::V6(Ipv6Addr::from(value))
    }
}

impl Range {
    /// Whether `ip` lies in `rangeStart..=rangeEnd` (same family).
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_v4()
            && ip_to_u128(ip) >= ip_to_u128(self.range_start)
            && ip_to_u128(ip) <= ip_to_u128(self.range_end)
    }

    /// Whether the range is IPv4.
    #[must_use]
    pub fn is_v4(&self) -> bool {
        self.subnet.addr().is_ipv4()
    }

    /// Number of addresses in `rangeStart..=rangeEnd` (gateway included). Never zero, and
    /// at most 2^128 − 1 since a range never contains the IPv6 network address of a /0.
    #[must_use]
    pub fn size(&self) -> u128 {
        ip_to_u128(self.range_end)
            .saturating_sub(ip_to_u128(self.range_start))
            .saturating_add(1)
    }

    /// The address at `offset` from `rangeStart`.
    #[must_use]
    pub fn nth(&self, offset: u128) -> IpAddr {
        u128_to_ip(
            ip_to_u128(self.range_start).wrapping_add(offset),
            self.is_v4(),
        )
    }

    /// The offset of `ip` from `rangeStart` (meaningful when [`Range::contains`] is true).
    #[must_use]
    pub fn offset(&self, ip: IpAddr) -> u128 {
        ip_to_u128(ip).wrapping_sub(ip_to_u128(self.range_start))
    }

    /// The address with this range's prefix length, as results carry it.
    #[must_use]
    pub fn with_prefix(&self, ip: IpAddr) -> IpNet {
        // The prefix length comes from a valid IpNet of the same family: cannot fail.
        IpNet::new(ip, self.subnet.prefix_len()).unwrap_or_else(|_| IpNet::from(ip))
    }

    /// Human-readable form, e.g. `10.0.0.0/24 (10.0.0.2-10.0.0.254)`.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("{} ({}-{})", self.subnet, self.range_start, self.range_end)
    }
}

impl RangeSet {
    /// The index of the range containing `ip`, if any.
    #[must_use]
    pub fn range_for(&self, ip: IpAddr) -> Option<usize> {
        self.ranges.iter().position(|r| r.contains(ip))
    }

    /// Human-readable form listing every range.
    #[must_use]
    pub fn describe(&self) -> String {
        self.ranges
            .iter()
            .map(Range::describe)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether `ip` is the gateway of any range of the set.
    #[must_use]
    pub fn is_gateway(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.gateway == Some(ip))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRange {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIpam {
    #[serde(default)]
    ranges: Option<Vec<Vec<RawRange>>>,
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    routes: Option<Value>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(default)]
    resolv_conf: Option<String>,
    #[serde(default)]
    data_dir: Option<Value>,
}

impl Ipam {
    /// Parses and validates the raw `ipam` object (`Value::Null` when absent). Errors are
    /// code 7 and name the field, e.g. `ipam.ranges[0][1].rangeStart`.
    pub fn parse(ipam: &Value) -> Result<Self> {
        if ipam.is_null() {
            return Err(Error::config(
                "ipam",
                "is missing; give at least `ipam.ranges` (or `ipam.subnet`)",
            ));
        }
        if !ipam.is_object() {
            return Err(Error::config("ipam", "is not a JSON object"));
        }
        // The type is read first: a delegated plugin's configuration is its own business.
        match ipam.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == EMBEDDED_TYPE => {}
            Some(Value::String(other)) => {
                check_plugin_name(other)?;
                return Ok(Self::Delegate(other.clone()));
            }
            Some(other) => {
                return Err(Error::config(
                    "ipam.type",
                    format!("{other} is not a string"),
                ));
            }
        }
        let raw: RawIpam = serde_path_to_error::deserialize(ipam).map_err(|e| {
            let path = e.path().to_string();
            Error::config(
                if path == "." {
                    "ipam".to_owned()
                } else {
                    format!("ipam.{path}")
                },
                e.inner().to_string(),
            )
        })?;
        IpamConfig::from_raw(raw).map(Self::Embedded)
    }
}

/// Checks that an `ipam.type` is a plain file name that can be looked up in `CNI_PATH`.
fn check_plugin_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::config(
            "ipam.type",
            format!("{name:?} is not a plugin name (a file name in CNI_PATH)"),
        ));
    }
    Ok(())
}

impl IpamConfig {
    fn from_raw(raw: RawIpam) -> Result<Self> {
        if raw.data_dir.is_some() {
            return Err(Error::config(
                "ipam.dataDir",
                "is host-local's store location and is not used by the embedded allocator; \
                 remove it and set the top-level `dataDir` instead (the store lives in \
                 <dataDir>/<network name>/)",
            ));
        }
        let mut raw_sets: Vec<(String, Vec<(String, RawRange)>)> = Vec::new();
        let legacy_used = raw.subnet.is_some()
            || raw.range_start.is_some()
            || raw.range_end.is_some()
            || raw.gateway.is_some();
        if legacy_used {
            let r = RawRange {
                subnet: raw.subnet,
                range_start: raw.range_start,
                range_end: raw.range_end,
                gateway: raw.gateway,
            };
            raw_sets.push(("ipam".into(), vec![("ipam".into(), r)]));
        }
        for (i, set) in raw.ranges.unwrap_or_default().into_iter().enumerate() {
            let field = format!("ipam.ranges[{i}]");
            if set.is_empty() {
                return Err(Error::config(
                    field,
                    "is an empty range set; give at least one {\"subnet\": ...}",
                ));
            }
            let ranges = set
                .into_iter()
                .enumerate()
                .map(|(j, r)| (format!("{field}[{j}]"), r))
                .collect();
            raw_sets.push((field, ranges));
        }
        if raw_sets.is_empty() {
            return Err(Error::config(
                "ipam.ranges",
                "no address ranges configured; give `ipam.ranges` (or the legacy `ipam.subnet`)",
            ));
        }

        let mut range_sets: Vec<(String, RangeSet, Vec<String>)> = Vec::new();
        for (set_field, raw_ranges) in raw_sets {
            let mut ranges: Vec<Range> = Vec::new();
            let mut fields: Vec<String> = Vec::new();
            for (field, raw_range) in raw_ranges {
                let range = canonicalize(&field, &raw_range)?;
                if let Some(first) = ranges.first() {
                    if first.is_v4() != range.is_v4() {
                        return Err(Error::config(
                            format!("{field}.subnet"),
                            format!(
                                "{} is not of the same IP family as {} in {set_field}; \
                                 a range set holds one family (use another range set for \
                                 dual stack)",
                                range.subnet, first.subnet
                            ),
                        ));
                    }
                }
                for (other, other_field) in ranges.iter().zip(&fields) {
                    if overlaps(other, &range) {
                        return Err(Error::config(
                            field.clone(),
                            format!(
                                "range {} overlaps {other_field} ({})",
                                range.describe(),
                                other.describe()
                            ),
                        ));
                    }
                }
                ranges.push(range);
                fields.push(field);
            }
            for (prev_field, prev, prev_fields) in &range_sets {
                for (r, f) in ranges.iter().zip(&fields) {
                    for (p, pf) in prev.ranges.iter().zip(prev_fields) {
                        if overlaps(p, r) {
                            return Err(Error::config(
                                f.clone(),
                                format!(
                                    "range {} overlaps {pf} ({}) of range set {prev_field}; \
                                     range sets must not overlap",
                                    r.describe(),
                                    p.describe()
                                ),
                            ));
                        }
                    }
                }
            }
            range_sets.push((set_field, RangeSet { ranges }, fields));
        }

        let routes = match &raw.routes {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_routes(v, "ipam.routes")?,
        };
        let resolv_conf = match raw.resolv_conf {
            None => None,
            Some(s) if s.is_empty() => None,
            Some(s) => {
                let p = PathBuf::from(&s);
                if !p.is_absolute() {
                    return Err(Error::config(
                        "ipam.resolvConf",
                        format!("{s:?} is not an absolute path"),
                    ));
                }
                Some(p)
            }
        };
        Ok(Self {
            range_sets: range_sets.into_iter().map(|(_, s, _)| s).collect(),
            routes,
            dns: raw.dns.unwrap_or_default(),
            resolv_conf,
        })
    }

    /// Every range of every set, in order.
    pub fn all_ranges(&self) -> impl Iterator<Item = &Range> {
        self.range_sets.iter().flat_map(|s| s.ranges.iter())
    }

    /// Maps requested addresses to range sets: element `i` of the result is the address
    /// requested in set `i`, if any. Every address must lie in some range (between
    /// `rangeStart` and `rangeEnd`), must not be a gateway, and no two may fall in one set.
    pub fn assign_requests(&self, requests: &[Requested]) -> Result<Vec<Option<IpAddr>>> {
        let mut out: Vec<Option<(IpAddr, &str)>> = vec![None; self.range_sets.len()];
        for req in requests {
            let Some(set) = self
                .range_sets
                .iter()
                .position(|s| s.range_for(req.address).is_some())
            else {
                let in_subnet = self.all_ranges().find(|r| r.subnet.contains(&req.address));
                return Err(Error::Ipam(match in_subnet {
                    Some(r) => format!(
                        "requested address {} ({}) is in subnet {} but outside its range \
                         {}-{}; nothing was reserved",
                        req.address, req.source, r.subnet, r.range_start, r.range_end
                    ),
                    None => format!(
                        "requested address {} ({}) is outside every configured range ({}); \
                         nothing was reserved",
                        req.address,
                        req.source,
                        self.range_sets
                            .iter()
                            .map(RangeSet::describe)
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                }));
            };
            if self.range_sets[set].is_gateway(req.address) {
                return Err(Error::Ipam(format!(
                    "requested address {} ({}) is the gateway of range set {set} and is never \
                     handed out; nothing was reserved",
                    req.address, req.source
                )));
            }
            match out[set] {
                Some((prev, _)) if prev == req.address => {}
                Some((prev, prev_source)) => {
                    return Err(Error::Ipam(format!(
                        "requested addresses {prev} ({prev_source}) and {} ({}) both fall in \
                         range set {set} ({}); one address is reserved per range set, so at \
                         most one may be requested in each; nothing was reserved",
                        req.address,
                        req.source,
                        self.range_sets[set].describe()
                    )));
                }
                None => out[set] = Some((req.address, req.source)),
            }
        }
        Ok(out.into_iter().map(|o| o.map(|(ip, _)| ip)).collect())
    }

    /// Refuses (error 7, naming the route) a route whose `gw` is not of its `dst`'s family.
    /// The builder cannot put an IPv4 gateway on an IPv6 route, and an IPv6 gateway on an
    /// IPv4 route would be an `RTA_VIA` route that CHECK does not read back; the Result must
    /// never report a route that was not installed as asked.
    ///
    /// ADD's check, not the parser's: DEL and GC still parse such a configuration, so a
    /// pod is released whatever its configuration's routes say.
    pub fn check_routes(&self) -> Result<()> {
        let family = |ip: IpAddr| if ip.is_ipv6() { "IPv6" } else { "IPv4" };
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(scope) = r.scope.filter(|s| *s > u32::from(u8::MAX)) {
                return Err(Error::config(
                    format!("ipam.routes[{i}].scope"),
                    format!(
                        "the route to {} has scope {scope}; a route scope is 0-255",
                        r.dst
                    ),
                ));
            }
            let Some(gw) = r.gw else { continue };
            if gw.is_ipv6() != r.dst.addr().is_ipv6() {
                return Err(Error::config(
                    format!("ipam.routes[{i}].gw"),
                    format!(
                        "the route to {} via {gw} mixes families: gw is {} but dst is {}",
                        r.dst,
                        family(gw),
                        family(r.dst.addr())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The DNS settings of the result: `ipam.dns` if it sets anything, else the
    /// `ipam.resolvConf` file if configured, else the top-level `dns` of the network.
    pub fn result_dns(&self, conf: &NetConf) -> Result<Dns> {
        if !self.dns.is_empty() {
            return Ok(self.dns.clone());
        }
        if let Some(path) = &self.resolv_conf {
            return parse_resolv_conf(path);
        }
        Ok(conf.dns.clone())
    }
}

/// Parses the `nameserver`, `domain`, `search` and `options` lines of a resolv.conf.
pub fn parse_resolv_conf(path: &Path) -> Result<Dns> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading ipam.resolvConf {}", path.display()), e))?;
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.nameservers.extend(words.next().map(str::to_owned)),
            Some("domain") => dns.domain = words.next().map(str::to_owned),
            Some("search") => dns.search = words.map(str::to_owned).collect(),
            Some("options") => dns.options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    Ok(dns)
}

/// An address asked for by the runtime, with where it came from (for error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    /// The address.
    pub address: IpAddr,
    /// `CNI_ARGS IP`, `args.cni.ips` or `runtimeConfig.ips`.
    pub source: &'static str,
}

/// Collects requested addresses from `CNI_ARGS IP=a[,b]`, `args.cni.ips` and
/// `runtimeConfig.ips` (in that order; an address named twice counts once). A CIDR suffix
/// (`10.0.0.5/24`) is accepted and ignored: the prefix always comes from the range.
pub fn requested_ips(conf: &NetConf, env: &Env) -> Result<Vec<Requested>> {
    let mut out: Vec<Requested> = Vec::new();
    let mut push = |address: IpAddr, source: &'static str| {
        if !out.iter().any(|r| r.address == address) {
            out.push(Requested { address, source });
        }
    };
    for ip in env.args.ips()? {
        push(ip, "CNI_ARGS IP");
    }
    match conf.args.get("cni").and_then(|c| c.get("ips")) {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let field = format!("args.cni.ips[{i}]");
                let s = item
                    .as_str()
                    .ok_or_else(|| Error::config(&field, "is not a string"))?;
                push(parse_requested(s, &field)?, "args.cni.ips");
            }
        }
        Some(_) => return Err(Error::config("args.cni.ips", "is not an array")),
    }
    for (i, s) in conf.runtime_config.ips.iter().enumerate() {
        push(
            parse_requested(s, &format!("runtimeConfig.ips[{i}]"))?,
            "runtimeConfig.ips",
        );
    }
    Ok(out)
}

fn parse_requested(s: &str, field: &str) -> Result<IpAddr> {
    let addr = s.split_once('/').map_or(s, |(a, _)| a).trim();
    addr.parse::<IpAddr>()
        .map_err(|_| Error::config(field, format!("{s:?} is not an IP address")))
}

fn parse_ip(field: &str, value: &str) -> Result<IpAddr> {
    value
        .trim()
        .parse::<IpAddr>()
        .map_err(|_| Error::config(field, format!("{value:?} is not an IP address")))
}

/// Whether two ranges share an address (host-local's rule: ranges, not subnets, count, so
/// two ranges may split one subnet).
fn overlaps(a: &Range, b: &Range) -> bool {
    a.is_v4() == b.is_v4()
        && ip_to_u128(a.range_start) <= ip_to_u128(b.range_end)
        && ip_to_u128(b.range_start) <= ip_to_u128(a.range_end)
}

/// Fills in and validates one range; `field` is its path (e.g. `ipam.ranges[0][1]`).
fn canonicalize(field: &str, raw: &RawRange) -> Result<Range> {
    let subnet_field = format!("{field}.subnet");
    let Some(subnet_str) = raw.subnet.as_deref() else {
        return Err(Error::config(subnet_field, "is required"));
    };
    let subnet: IpNet = subnet_str.trim().parse().map_err(|_| {
        Error::config(
            &subnet_field,
            format!("{subnet_str:?} is not a subnet in CIDR notation (e.g. 10.1.0.0/24)"),
        )
    })?;
    if subnet.addr() != subnet.network() {
        return Err(Error::config(
            &subnet_field,
            format!(
                "{subnet} has host bits set; did you mean {}?",
                subnet.trunc()
            ),
        ));
    }
    let v4 = subnet.addr().is_ipv4();
    let host_bits = u32::from(subnet.max_prefix_len() - subnet.prefix_len());
    let network = ip_to_u128(subnet.network());
    let last = ip_to_u128(subnet.broadcast());
    // Usable bounds: network and (IPv4) broadcast excluded when the subnet has them.
    let (usable_lo, usable_hi) = match host_bits {
        0 | 1 => (network, last),
        _ if v4 => (network + 1, last - 1),
        _ => (network + 1, last),
    };
    let kind = |ip: u128| -> Option<&'static str> {
        if host_bits < 2 {
            None
        } else if ip == network {
            Some(if v4 {
                "the network address"
            } else {
                "the subnet-router anycast (network) address"
            })
        } else if v4 && ip == last {
            Some("the broadcast address")
        } else {
            None
        }
    };
    let bound = |name: &str, value: &Option<String>| -> Result<Option<IpAddr>> {
        let Some(s) = value.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let f = format!("{field}.{name}");
        let ip = parse_ip(&f, s)?;
        if ip.is_ipv4() != v4 {
            return Err(Error::config(
                f,
                format!("{ip} is not of the same IP family as subnet {subnet}"),
            ));
        }
        if !subnet.contains(&ip) {
            return Err(Error::config(f, format!("{ip} is outside subnet {subnet}")));
        }
        if let Some(what) = kind(ip_to_u128(ip)) {
            return Err(Error::config(
                f,
                format!("{ip} is {what} of {subnet} and cannot be used"),
            ));
        }
        Ok(Some(ip))
    };
    let start = bound("rangeStart", &raw.range_start)?;
    let end = bound("rangeEnd", &raw.range_end)?;
    let explicit_gateway = bound("gateway", &raw.gateway)?;
    if host_bits == 0 && explicit_gateway.is_some() {
        return Err(Error::config(
            format!("{field}.gateway"),
            format!(
                "subnet {subnet} holds a single address; a gateway in it would leave nothing \
                 to hand out (omit the gateway for /32 and /128 subnets)"
            ),
        ));
    }
    let gateway = explicit_gateway.or_else(|| {
        (host_bits > 0).then(|| u128_to_ip(if host_bits == 1 { network } else { network + 1 }, v4))
    });
    let range_start = start.unwrap_or_else(|| u128_to_ip(usable_lo, v4));
    let range_end = end.unwrap_or_else(|| u128_to_ip(usable_hi, v4));
    if ip_to_u128(range_start) > ip_to_u128(range_end) {
        return Err(Error::config(
            format!("{field}.rangeStart"),
            format!("{range_start} is after rangeEnd {range_end}"),
        ));
    }
    let range = Range {
        subnet,
        range_start,
        range_end,
        gateway,
    };
    let gateway_inside = gateway.is_some_and(|g| range.contains(g));
    if range.size() == 1 && gateway_inside {
        return Err(Error::config(
            field,
            format!(
                "range {range_start}-{range_end} holds only the gateway; there is no address \
                 to hand out"
            ),
        ));
    }
    Ok(range)
}
