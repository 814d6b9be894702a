//! What the runtime passes per invocation: `runtimeConfig` (port mappings, requested
//! addresses and MAC, allowed source prefixes, IP ranges, bandwidth) and how it is
//! checked, the GC's `cni.dev/valid-attachments`, and the reading of go-cni's
//! capability keys.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use super::parse_mac;
use crate::error::{Error, Result};

/// One `runtimeConfig.portMappings` entry (capability `portMappings`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// Port on the node.
    pub host_port: u16,
    /// Port in the pod.
    pub container_port: u16,
    /// `tcp` (default) or `udp`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Only traffic to this node address is mapped (default: any node address).
    #[serde(default, rename = "hostIP", deserialize_with = "empty_ip")]
    pub host_ip: Option<IpAddr>,
}

fn default_protocol() -> String {
    "tcp".into()
}

fn empty_ip<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<IpAddr>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// `runtimeConfig`: per-invocation values the runtime passes for our capabilities.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    /// Capability `portMappings`.
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    /// Capability `ips`: requested addresses (CIDR or bare).
    #[serde(default)]
    pub ips: Vec<String>,
    /// Capability `mac`: MAC for the container interface.
    #[serde(default)]
    pub mac: Option<String>,
    /// Capability `allowedSourceCIDRs`: source prefixes the pod may send from besides its
    /// own addresses (a router or VPN pod).
    #[serde(default, rename = "allowedSourceCIDRs")]
    pub allowed_source_cidrs: Vec<IpNet>,
    /// Capability `ipRanges` (host-local's schema: range sets), e.g. the node's pod CIDR
    /// from a runtime that knows it: served before `ipam.ranges`, so one conflist fits
    /// every node.
    #[serde(default, rename = "ipRanges")]
    pub ip_ranges: Option<Value>,
    /// Capability `bandwidth` (the reference `bandwidth` plugin's schema: bits per second
    /// and bits). Only the egress rate is enforced; see [`EgressRate`].
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
}

impl RuntimeConfig {
    /// Checks the port mappings and the MAC: both ports set, `tcp` or `udp`, no host
    /// port mapped twice, and no UDP host port on one of the node's `reserved` ones (the
    /// tunnel's, WireGuard's: the port and what it is, as the error says it).
    pub(super) fn check(&self, reserved: &[(u16, String)]) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for (i, pm) in self.port_mappings.iter().enumerate() {
            let field = format!("runtimeConfig.portMappings[{i}]");
            if pm.host_port == 0 {
                return Err(Error::config(
                    format!("{field}.hostPort"),
                    "must be 1..=65535",
                ));
            }
            if pm.container_port == 0 {
                return Err(Error::config(
                    format!("{field}.containerPort"),
                    "must be 1..=65535",
                ));
            }
            let proto = pm.protocol.to_ascii_lowercase();
            if proto != "tcp" && proto != "udp" {
                return Err(Error::config(
                    format!("{field}.protocol"),
                    format!("{:?} is not supported (tcp or udp)", pm.protocol),
                ));
            }
            if let Some((_, what)) = reserved.iter().find(|(p, _)| *p == pm.host_port) {
                if proto == "udp" {
                    return Err(Error::config(
                        format!("{field}.hostPort"),
                        format!("{}/udp is {what}", pm.host_port),
                    ));
                }
            }
            if !seen.insert((pm.host_port, proto, pm.host_ip)) {
                return Err(Error::config(
                    format!("{field}.hostPort"),
                    format!("{}/{} is mapped twice", pm.host_port, pm.protocol),
                ));
            }
        }
        if let Some(mac) = &self.mac {
            if parse_mac(mac).is_none() {
                return Err(Error::config(
                    "runtimeConfig.mac",
                    format!("{mac:?} is not a MAC address"),
                ));
            }
        }
        Ok(())
    }
}

/// `runtimeConfig.bandwidth`, as Kubernetes passes it from the pod's
/// `kubernetes.io/{ingress,egress}-bandwidth` annotations.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    /// Rate into the pod (bits/s): not supported (error 2 when non-zero).
    #[serde(default)]
    pub ingress_rate: u64,
    /// Burst into the pod (bits).
    #[serde(default)]
    pub ingress_burst: u64,
    /// Rate out of the pod (bits/s); 0 = unlimited.
    #[serde(default)]
    pub egress_rate: u64,
    /// Burst out of the pod (bits); required with a rate.
    #[serde(default)]
    pub egress_burst: u64,
}

/// A pod's validated egress limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressRate {
    /// Bits per second (≥ 8).
    pub bits_per_s: u64,
    /// Burst in bits (> 0).
    pub burst_bits: u64,
}
impl Bandwidth {
    /// The egress limit, if any; ingress shaping and incomplete pairs are refused.
    pub(super) fn egress(&self) -> Result<Option<EgressRate>> {
        const F: &str = "runtimeConfig.bandwidth";
        if self.ingress_rate != 0 || self.ingress_burst != 0 {
            let (field, value) = if self.ingress_rate != 0 {
                ("ingressRate", self.ingress_rate)
            } else {
                ("ingressBurst", self.ingress_burst)
            };
            return Err(Error::UnsupportedField {
                field: format!("{F}.{field}"),
                value: format!(
                    "{value} (cni-ebpf limits a pod's egress only; leave ingress unset)"
                ),
            });
        }
        match (self.egress_rate, self.egress_burst) {
            (0, 0) => Ok(None),
            (0, _) => Err(Error::config(
                format!("{F}.egressRate"),
                "must be set (bits per second) when egressBurst is",
            )),
            (_, 0) => Err(Error::config(
                format!("{F}.egressBurst"),
                "must be set (bits) when egressRate is",
            )),
            (r, _) if r < 8 => Err(Error::config(
                format!("{F}.egressRate"),
                format!("{r} bits/s is below the smallest rate, 8 bits/s"),
            )),
            (r, b) => Ok(Some(EgressRate {
                bits_per_s: r,
                burst_bits: b,
            })),
        }
    }
}

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// Gives the capability arguments that runtimes built on go-cni (containerd's CRI plugin
/// and `ctr`) pass our field names. go-cni marshals its Go structs without JSON tags, so
/// `portMappings` entries arrive as `{"HostPort", "ContainerPort", "Protocol", "HostIP"}`,
/// `ipRanges` as `{"Subnet", "RangeStart", "RangeEnd", "Gateway"}` (unset ones as `""`)
/// and `bandwidth` as `{"IngressRate", …}`. The reference plugins read them because Go's
/// JSON decoder matches field names case-insensitively; this does the same for exactly
/// these objects: a key equal to one of ours but for case is renamed (ours wins when both
/// are there), and an empty `rangeStart`/`rangeEnd`/`gateway` means unset, as in
/// host-local.
pub(super) fn fold_go_capability_keys(rc: &mut Value) {
    fn fold(obj: &mut Value, names: &[&str]) {
        let Some(map) = obj.as_object_mut() else {
            return;
        };
        for name in names {
            if map.contains_key(*name) {
                continue;
            }
            let other = map.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned();
            if let Some(v) = other.and_then(|k| map.remove(&k)) {
                map.insert((*name).to_owned(), v);
            }
        }
    }
    const PORT: &[&str] = &["hostPort", "containerPort", "protocol", "hostIP"];
    const RANGE: &[&str] = &["subnet", "rangeStart", "rangeEnd", "gateway"];
    const BANDWIDTH: &[&str] = &["ingressRate", "ingressBurst", "egressRate", "egressBurst"];
    if let Some(Value::Array(list)) = rc.get_mut("portMappings") {
        list.iter_mut().for_each(|pm| fold(pm, PORT));
    }
    if let Some(bw) = rc.get_mut("bandwidth") {
        fold(bw, BANDWIDTH);
    }
    if let Some(Value::Array(sets)) = rc.get_mut("ipRanges") {
        for set in sets.iter_mut().filter_map(Value::as_array_mut) {
            for range in set.iter_mut() {
                fold(range, RANGE);
                if let Some(map) = range.as_object_mut() {
                    for k in ["rangeStart", "rangeEnd", "gateway"] {
                        if map.get(k).and_then(Value::as_str) == Some("") {
                            map.remove(k);
                        }
                    }
                }
            }
        }
    }
}

/// The `ipam` object with `runtimeConfig.ipRanges` served first, as host-local does:
/// the runtime's range sets, then the legacy single range, then `ipam.ranges` (less the
/// sets the runtime passed too). Only for
/// the embedded allocator; a delegated IPAM plugin gets `runtimeConfig` on its stdin and
/// reads the capability itself. Errors in the runtime's ranges name
/// `runtimeConfig.ipRanges[…]`.
pub(super) fn with_runtime_ranges(mut ipam: Value, rc: &RuntimeConfig) -> Result<Value> {
    let Some(ranges) = &rc.ip_ranges else {
        return Ok(ipam);
    };
    let Some(sets) = ranges.as_array() else {
        return Err(Error::config(
            "runtimeConfig.ipRanges",
            "is not an array of range sets",
        ));
    };
    if sets.is_empty() {
        return Ok(ipam);
    }
    let embedded = match ipam.get("type") {
        None | Some(Value::Null) => true,
        Some(t) => t.as_str() == Some(crate::ipam::config::EMBEDDED_TYPE),
    };
    if !embedded {
        return Ok(ipam);
    }
    // The runtime's ranges on their own first, so that an error names them.
    crate::ipam::config::Ipam::parse(&serde_json::json!({ "ranges": sets })).map_err(
        |e| match e {
            Error::InvalidConfig { field, reason } => Error::InvalidConfig {
                field: field.replacen("ipam.ranges", "runtimeConfig.ipRanges", 1),
                reason,
            },
            other => other,
        },
    )?;
    let Some(obj) = ipam.as_object_mut() else {
        return Ok(serde_json::json!({ "ranges": sets }));
    };
    // A range set of the configuration that the runtime passes too, written the same way
    // (a node's pod CIDR both in `ipam.ranges`, as `cni-ebpf install` writes it, and in
    // the capability), is served once; host-local would refuse it as an overlap and fail
    // every ADD on that node. Any other overlap is still refused by the parser.
    let mut merged = sets.clone();
    if let Some(subnet) = obj.remove("subnet") {
        let mut legacy = serde_json::Map::new();
        legacy.insert("subnet".into(), subnet);
        for k in ["rangeStart", "rangeEnd", "gateway"] {
            if let Some(v) = obj.remove(k) {
                legacy.insert(k.into(), v);
            }
        }
        let legacy = Value::Array(vec![Value::Object(legacy)]);
        if !sets.contains(&legacy) {
            merged.push(legacy);
        }
    }
    if let Some(Value::Array(existing)) = obj.remove("ranges") {
        merged.extend(existing.into_iter().filter(|set| !sets.contains(set)));
    }
    obj.insert("ranges".into(), Value::Array(merged));
    Ok(ipam)
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests panic with a message")]
mod tests {
    use serde_json::json;

    use crate::cni::{config::NetConf, env::Command};

    fn parse(runtime_config: &serde_json::Value) -> NetConf {
        let conf = json!({
            "cniVersion": "1.0.0", "name": "n", "type": "cni-ebpf",
            "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] },
            "runtimeConfig": runtime_config,
        });
        match NetConf::parse(conf.to_string().as_bytes(), Command::Add) {
            Ok(c) => c,
            Err(e) => panic!("{runtime_config}: {e}"),
        }
    }

    /// What containerd's CRI plugin (go-cni 1.1) writes for a pod with a host port, an
    /// egress limit and the node's pod CIDR: Go field names, empty strings for unset.
    #[test]
    fn go_cni_capability_args_are_read_like_go_reads_them() {
        let go = parse(&json!({
            "portMappings": [{ "HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "" }],
            "bandwidth": { "IngressRate": 0, "IngressBurst": 0, "EgressRate": 1_000_000, "EgressBurst": 10_000 },
            "ipRanges": [[{ "Subnet": "10.244.1.0/24", "RangeStart": "", "RangeEnd": "", "Gateway": "" }]],
        }));
        let ours = parse(&json!({
            "portMappings": [{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }],
            "bandwidth": { "egressRate": 1_000_000, "egressBurst": 10_000 },
            "ipRanges": [[{ "subnet": "10.244.1.0/24" }]],
        }));
        assert_eq!(
            go.runtime_config.port_mappings,
            ours.runtime_config.port_mappings
        );
        assert_eq!(go.runtime_config.bandwidth, ours.runtime_config.bandwidth);
        assert_eq!(go.egress_rate, ours.egress_rate);
        // The same range set in the configuration and the capability is served once.
        assert_eq!(go.ipam, ours.ipam);
        assert_eq!(
            go.ipam["ranges"].as_array().map(Vec::len),
            Some(1),
            "{}",
            go.ipam
        );
    }

    #[test]
    fn our_spelling_wins_over_another_case() {
        let c = parse(&json!({
            "portMappings": [{ "hostPort": 8080, "HOSTPORT": 9090, "containerPort": 80 }],
        }));
        assert_eq!(c.runtime_config.port_mappings[0].host_port, 8080);
    }

    #[test]
    fn a_udp_host_port_on_the_tunnel_port_is_refused_in_the_tunnel_modes() {
        let conf = |mode: &str, proto: &str| {
            json!({
                "cniVersion": "1.0.0", "name": "n", "type": "cni-ebpf", "crossNode": mode,
                "tunnelPort": 4789,
                "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] },
                "runtimeConfig": { "portMappings": [
                    { "hostPort": 4789, "containerPort": 53, "protocol": proto }
                ] },
            })
            .to_string()
        };
        for mode in ["tunnel", "crossSubnet"] {
            let err = match NetConf::parse(conf(mode, "udp").as_bytes(), Command::Add) {
                Ok(_) => panic!("{mode}: a udp host port on the tunnel port was accepted"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains("runtimeConfig.portMappings[0].hostPort") && err.contains("4789"),
                "{err}"
            );
            assert!(NetConf::parse(conf(mode, "tcp").as_bytes(), Command::Add).is_ok());
        }
        assert!(NetConf::parse(conf("routed", "udp").as_bytes(), Command::Add).is_ok());
    }

    /// `encryption`: its values, its port's range and conflicts, named in the error.
    #[test]
    fn encryption_settings_are_checked_and_named() {
        let parse = |extra: serde_json::Value| {
            let mut conf = json!({
                "cniVersion": "1.0.0", "name": "n", "type": "cni-ebpf",
                "ipam": { "ranges": [[{ "subnet": "10.244.1.0/24" }]] },
            });
            if let (Some(c), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
                c.extend(e.clone());
            }
            NetConf::parse(conf.to_string().as_bytes(), Command::Add).map_err(|e| e.to_string())
        };
        let on = parse(json!({"encryption": "wireguard"})).unwrap_or_else(|e| panic!("{e}"));
        let enc = on.encryption.unwrap_or_else(|| panic!("encryption is off"));
        assert_eq!((enc.port, enc.strict), (51_872, true));
        assert!(parse(json!({})).is_ok_and(|c| c.encryption.is_none()));
        assert!(parse(json!({"encryption": "none"})).is_ok_and(|c| c.encryption.is_none()));
        let off = parse(json!({"encryption": "wireguard", "encryptionStrict": false}));
        assert!(off.is_ok_and(|c| c.encryption.is_some_and(|e| !e.strict)));
        let refused = [
            (json!({"encryption": "ipsec"}), "encryption"),
            (
                json!({"encryption": "wireguard", "wireguardPort": 0}),
                "wireguardPort",
            ),
            (
                json!({"encryption": "wireguard", "wireguardPort": 70000}),
                "wireguardPort",
            ),
            (
                json!({"encryption": "wireguard", "crossNode": "tunnel", "wireguardPort": 8472}),
                "wireguardPort",
            ),
            (
                json!({"encryption": "wireguard", "runtimeConfig": {"portMappings": [
                    {"hostPort": 51872, "containerPort": 53, "protocol": "udp"}]}}),
                "runtimeConfig.portMappings[0].hostPort",
            ),
        ];
        for (extra, field) in refused {
            match parse(extra.clone()) {
                Ok(_) => panic!("{extra} was accepted"),
                Err(e) => assert!(e.contains(field), "{extra}: {e}"),
            }
        }
    }
}
