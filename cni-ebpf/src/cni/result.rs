//! The CNI Result: one internal model (the 1.1.0 shape) and its JSON for every version.
//!
//! Conversions follow the spec texts: 0.1.0/0.2.0 carry `ip4`/`ip6` objects; 0.3.x and
//! 0.4.0 add `interfaces` and `ips[].version`; 1.0.0 drops `version`; 1.1.0 adds the
//! interface fields `mtu`, `socketPath`, `pciID` and the route fields `mtu`, `advmss`,
//! `priority`, `table`, `scope`.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Map, Value};

use super::version::Version;
use crate::error::{Error, Result};

/// An interface in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address, `aa:bb:..` lowercase.
    pub mac: Option<String>,
    /// MTU (1.1.0).
    pub mtu: Option<u32>,
    /// Netns path for container interfaces; `None` on the host.
    pub sandbox: Option<String>,
    /// vhost-user socket path (1.1.0).
    pub socket_path: Option<String>,
    /// PCI id (1.1.0).
    pub pci_id: Option<String>,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with prefix length.
    pub address: IpNet,
    /// Gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination.
    pub dst: IpNet,
    /// Next hop.
    pub gw: Option<IpAddr>,
    /// Route MTU (1.1.0).
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    pub advmss: Option<u32>,
    /// Metric (1.1.0).
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    pub table: Option<u32>,
    /// Scope (1.1.0).
    pub scope: Option<u32>,
}

impl Route {
    /// A plain route to `dst` via `gw`.
    #[must_use]
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        Self {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// A success result in the internal (1.1.0) model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// Interfaces created.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes created.
    pub routes: Vec<Route>,
    /// DNS settings.
    pub dns: Dns,
}

fn family(ip: &IpNet) -> &'static str {
    match ip {
        IpNet::V4(_) => "4",
        IpNet::V6(_) => "6",
    }
}

fn opt<T: Into<Value>>(obj: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        obj.insert(key.into(), v.into());
    }
}

impl CniResult {
    /// The result as the JSON document of `version`.
    #[must_use]
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), version.as_str().into());
        if version.is_legacy() {
            for (key, v4) in [("ip4", true), ("ip6", false)] {
                let Some(ip) = self
                    .ips
                    .iter()
                    .find(|ip| matches!(ip.address, IpNet::V4(_)) == v4)
                else {
                    continue;
                };
                let mut obj = Map::new();
                obj.insert("ip".into(), ip.address.to_string().into());
                opt(&mut obj, "gateway", ip.gateway.map(|g| g.to_string()));
                let routes: Vec<Value> = self
                    .routes
                    .iter()
                    .filter(|r| matches!(r.dst, IpNet::V4(_)) == v4)
                    .map(|r| {
                        let mut o = Map::new();
                        o.insert("dst".into(), r.dst.to_string().into());
                        opt(&mut o, "gw", r.gw.map(|g| g.to_string()));
                        Value::Object(o)
                    })
                    .collect();
                if !routes.is_empty() {
                    obj.insert("routes".into(), routes.into());
                }
                out.insert(key.into(), Value::Object(obj));
            }
        } else {
            let v11 = version >= Version::V110;
            if !self.interfaces.is_empty() {
                let ifs: Vec<Value> = self
                    .interfaces
                    .iter()
                    .map(|i| {
                        let mut o = Map::new();
                        o.insert("name".into(), i.name.clone().into());
                        opt(&mut o, "mac", i.mac.clone());
                        if v11 {
                            opt(&mut o, "mtu", i.mtu);
                        }
                        opt(&mut o, "sandbox", i.sandbox.clone());
                        if v11 {
                            opt(&mut o, "socketPath", i.socket_path.clone());
                            opt(&mut o, "pciID", i.pci_id.clone());
                        }
                        Value::Object(o)
                    })
                    .collect();
                out.insert("interfaces".into(), ifs.into());
            }
            if !self.ips.is_empty() {
                let ips: Vec<Value> = self
                    .ips
                    .iter()
                    .map(|ip| {
                        let mut o = Map::new();
                        if version < Version::V100 {
                            o.insert("version".into(), family(&ip.address).into());
                        }
                        opt(&mut o, "interface", ip.interface);
                        o.insert("address".into(), ip.address.to_string().into());
                        opt(&mut o, "gateway", ip.gateway.map(|g| g.to_string()));
                        Value::Object(o)
                    })
                    .collect();
                out.insert("ips".into(), ips.into());
            }
            if !self.routes.is_empty() {
                let routes: Vec<Value> = self
                    .routes
                    .iter()
                    .map(|r| {
                        let mut o = Map::new();
                        o.insert("dst".into(), r.dst.to_string().into());
                        opt(&mut o, "gw", r.gw.map(|g| g.to_string()));
                        if v11 {
                            opt(&mut o, "mtu", r.mtu);
                            opt(&mut o, "advmss", r.advmss);
                            opt(&mut o, "priority", r.priority);
                            opt(&mut o, "table", r.table);
                            opt(&mut o, "scope", r.scope);
                        }
                        Value::Object(o)
                    })
                    .collect();
                out.insert("routes".into(), routes.into());
            }
        }
        if !self.dns.is_empty() {
            out.insert("dns".into(), json!(self.dns));
        }
        Value::Object(out)
    }

    /// Parses a result (e.g. a `prevResult`, or a delegated IPAM plugin's output) that is
    /// in the shape of `version`. A `cniVersion` inside the document takes precedence.
    pub fn from_json(value: &Value, version: Version) -> Result<Self> {
        let what = "prevResult";
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config(what, "is not a JSON object"))?;
        let version = match obj.get("cniVersion").and_then(Value::as_str) {
            Some(v) => Version::parse(v)?,
            None => version,
        };
        let mut res = Self::default();
        if let Some(dns) = obj.get("dns") {
            res.dns = serde_json::from_value(dns.clone())
                .map_err(|e| Error::config(format!("{what}.dns"), e.to_string()))?;
        }
        if version.is_legacy() {
            for key in ["ip4", "ip6"] {
                let Some(ipc) = obj.get(key) else { continue };
                let field = format!("{what}.{key}");
                let address = parse_net(ipc.get("ip"), &format!("{field}.ip"))?;
                let gateway = parse_opt_ip(ipc.get("gateway"), &format!("{field}.gateway"))?;
                res.ips.push(IpConfig {
                    address,
                    gateway,
                    interface: None,
                });
                if let Some(routes) = ipc.get("routes") {
                    res.routes
                        .extend(parse_routes(routes, &format!("{field}.routes"))?);
                }
            }
            return Ok(res);
        }
        if let Some(ifs) = obj.get("interfaces") {
            let arr = ifs
                .as_array()
                .ok_or_else(|| Error::config(format!("{what}.interfaces"), "is not an array"))?;
            for (i, v) in arr.iter().enumerate() {
                let field = format!("{what}.interfaces[{i}]");
                let name = v.get("name").and_then(Value::as_str).ok_or_else(|| {
                    Error::config(format!("{field}.name"), "is missing or not a string")
                })?;
                res.interfaces.push(Interface {
                    name: name.to_owned(),
                    mac: opt_str(v, "mac"),
                    mtu: opt_u32(v, "mtu", &field)?,
                    sandbox: opt_str(v, "sandbox").filter(|s| !s.is_empty()),
                    socket_path: opt_str(v, "socketPath"),
                    pci_id: opt_str(v, "pciID"),
                });
            }
        }
        if let Some(ips) = obj.get("ips") {
            let arr = ips
                .as_array()
                .ok_or_else(|| Error::config(format!("{what}.ips"), "is not an array"))?;
            for (i, v) in arr.iter().enumerate() {
                let field = format!("{what}.ips[{i}]");
                let address = parse_net(v.get("address"), &format!("{field}.address"))?;
                let gateway = parse_opt_ip(v.get("gateway"), &format!("{field}.gateway"))?;
                let interface = match v.get("interface") {
                    None | Some(Value::Null) => None,
                    Some(n) => Some(
                        n.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| {
                                Error::config(format!("{field}.interface"), "is not an index")
                            })?,
                    ),
                };
                if let Some(idx) = interface {
                    if idx >= res.interfaces.len() {
                        return Err(Error::config(
                            format!("{field}.interface"),
                            format!(
                                "index {idx} is out of range ({} interfaces)",
                                res.interfaces.len()
                            ),
                        ));
                    }
                }
                res.ips.push(IpConfig {
                    address,
                    gateway,
                    interface,
                });
            }
        }
        if let Some(routes) = obj.get("routes") {
            res.routes = parse_routes(routes, &format!("{what}.routes"))?;
        }
        Ok(res)
    }
}

fn opt_str(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn opt_u32(v: &Value, key: &str, field: &str) -> Result<Option<u32>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                Error::config(
                    format!("{field}.{key}"),
                    format!("{n} is not a 32-bit unsigned number"),
                )
            }),
    }
}

/// Parses `a.b.c.d/len` (or a bare address, taken as a host prefix) in field `field`.
pub fn parse_net(v: Option<&Value>, field: &str) -> Result<IpNet> {
    let s = v
        .and_then(Value::as_str)
        .ok_or_else(|| Error::config(field, "is missing or not a string"))?;
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| Error::config(field, format!("{s:?} is not an address in CIDR notation")))
}

fn parse_opt_ip(v: Option<&Value>, field: &str) -> Result<Option<IpAddr>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| Error::config(field, format!("{s:?} is not an IP address"))),
        Some(other) => Err(Error::config(field, format!("{other} is not a string"))),
    }
}

/// Parses a `routes` array (`dst`, optional `gw` and the 1.1.0 fields).
pub fn parse_routes(v: &Value, field: &str) -> Result<Vec<Route>> {
    let arr = v
        .as_array()
        .ok_or_else(|| Error::config(field, "is not an array"))?;
    arr.iter()
        .enumerate()
        .map(|(i, r)| {
            let f = format!("{field}[{i}]");
            Ok(Route {
                dst: parse_net(r.get("dst"), &format!("{f}.dst"))?,
                gw: parse_opt_ip(r.get("gw"), &format!("{f}.gw"))?,
                mtu: opt_u32(r, "mtu", &f)?,
                advmss: opt_u32(r, "advmss", &f)?,
                priority: opt_u32(r, "priority", &f)?,
                table: opt_u32(r, "table", &f)?,
                scope: opt_u32(r, "scope", &f)?,
            })
        })
        .collect()
}
