//! Which frontends and backends a node's Service maps hold (the agent's
//! `--kube-proxy-replacement`, [`super::services`]), from the Services and EndpointSlices
//! it watches. What each frontend gets follows kube-proxy (`pkg/proxy/topology.go`):
//! - its usable endpoints are the Ready ones (a missing condition counts as ready), else,
//!   when none is Ready, the Serving and Terminating ones; a Terminating endpoint gets no
//!   new connection while a Ready one exists;
//! - `internalTrafficPolicy: Local` (ClusterIPs), `externalTrafficPolicy: Local` (from
//!   outside): only this node's endpoints (none: refused, or dropped from outside);
//! - topology (`trafficDistribution`, or the hints the EndpointSlice controller writes):
//!   when every ready endpoint carries node hints and one names this node, those;
//!   else when every one carries zone hints and one names this node's zone
//!   (`topology.kubernetes.io/zone`), those; else all;
//! - `sessionAffinity: ClientIP` with its timeout (default 10 800 s), per client network
//!   namespace (a pod has one address per family, so that is its client IP).
//!
//! Skipped as kube-proxy skips them: headless Services, `ExternalName` Services, and
//! Services labelled `service.kubernetes.io/service-proxy-name` (another proxy's). What
//! the mode does not handle is named (a Warning Event on the Service,
//! `ServiceFieldNotHandled`): SCTP ports and `loadBalancerSourceRanges`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::{
    health_check_ports::HealthCheck,
    service_objects::{Endpoint, EndpointSlice, Service, ServiceSpec},
};
use crate::datapath::services::{
    backend, frontend_key, service_key, At, Frontend, Scope, ServiceTable,
};

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when not given (kube-proxy's).
const DEFAULT_AFFINITY_SECS: u32 = 10_800;

/// Where this node stands, for the policies that depend on it.
#[derive(Debug, Clone, Default)]
pub struct Locality {
    /// The node's name (`--node-name`).
    pub node: String,
    /// Its zone, if its Node has the label.
    pub zone: Option<String>,
}

/// A Service field the mode does not translate: (`namespace/name`, what).
pub type Unhandled = (String, String);

/// One endpoint of a Service port, as the rules above read it.
#[derive(Debug, Clone)]
struct Candidate {
    addr: SocketAddr,
    ready: bool,
    serving_terminating: bool,
    local: bool,
    node_hints: BTreeSet<String>,
    zone_hints: BTreeSet<String>,
}

/// What a node makes of the Services: its frontends, the health checks it answers and
/// the fields it leaves untranslated.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Every frontend with its backends.
    pub frontends: ServiceTable,
    /// The health-check node ports of `externalTrafficPolicy: Local` Services.
    pub health: BTreeMap<u16, HealthCheck>,
    /// Fields not translated, per Service.
    pub unhandled: Vec<Unhandled>,
}

/// The frontends of `services` with their backends from `slices`, for a node at `here`,
/// the health checks it answers and the fields left untranslated.
///
/// Per Service port, per family of its ClusterIPs:
/// - the ClusterIP, at the socket, with the endpoints for traffic from inside
///   (`internalTrafficPolicy`);
/// - its NodePort (on every node address of the family), external IPs and load-balancer
///   addresses (`status.loadBalancer.ingress[].ip`), each twice: at the socket for the
///   node and its pods, with the cluster-wide endpoints (as kube-proxy sends pod and node
///   traffic to external destinations), and at the uplink for flows from outside, with
///   the endpoints `externalTrafficPolicy` allows (`Local`: this node's only). A
///   load-balancer address with `ipMode: Proxy` is left to the load balancer from
///   inside.
#[must_use]
pub fn table(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
    here: &Locality,
) -> Rendered {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in slices {
        let (Some(ns), Some(svc)) = (s.metadata.namespace.as_deref(), s.service_name.as_deref())
        else {
            continue;
        };
        by_service.entry((ns, svc)).or_default().push(s);
    }
    let mut out = Rendered::default();
    for svc in services {
        service(&mut out, svc, &by_service, here);
    }
    out
}

/// A Service's addresses of every kind.
struct Addresses {
    /// `spec.clusterIPs` (or `spec.clusterIP`).
    cluster: Vec<IpAddr>,
    /// `spec.externalIPs`.
    external: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, each with whether it is translated from inside
    /// too (not with `ipMode: Proxy`).
    load_balancer: Vec<(IpAddr, bool)>,
}

impl Addresses {
    /// `None` when the Service has no ClusterIP (headless, or not allocated yet).
    fn of(svc: &Service, spec: &ServiceSpec) -> Option<Self> {
        let cluster: Vec<IpAddr> = spec
            .cluster_ips
            .clone()
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default()
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if cluster.is_empty() {
            return None;
        }
        let external = spec
            .external_ips
            .iter()
            .flatten()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        let load_balancer = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| {
                let ip = i.ip.as_deref()?.parse().ok()?;
                Some((ip, i.ip_mode.as_deref() != Some("Proxy")))
            })
            .collect();
        Some(Self {
            cluster,
            external,
            load_balancer,
        })
    }
}

/// How a Service's frontends choose among its endpoints.
struct Choice {
    /// `internalTrafficPolicy: Local`: the ClusterIP's frontends use this node's only.
    internal_local: bool,
    /// `externalTrafficPolicy: Local`: the frontends of flows from outside do.
    external_local: bool,
    /// `sessionAffinity: ClientIP`'s timeout; 0 without affinity.
    affinity_secs: u32,
}

impl Choice {
    fn of(spec: &ServiceSpec) -> Self {
        Self {
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            affinity_secs: if spec.session_affinity.as_deref() == Some("ClientIP") {
                spec.session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .and_then(|t| u32::try_from(t).ok())
                    .unwrap_or(DEFAULT_AFFINITY_SECS)
            } else {
                0
            },
        }
    }
}

/// One Service's frontends, its health-check node port and what of it is not translated.
fn service(
    out: &mut Rendered,
    svc: &Service,
    by_service: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
    here: &Locality,
) {
    let (Some(ns), Some(name), Some(spec)) = (
        svc.metadata.namespace.as_deref(),
        svc.metadata.name.as_deref(),
        svc.spec.as_ref(),
    ) else {
        return;
    };
    if svc.other_proxy || spec.type_.as_deref() == Some("ExternalName") {
        return;
    }
    let Some(addrs) = Addresses::of(svc, spec) else {
        return;
    };
    let mut not_done = BTreeSet::new();
    if !spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        not_done.insert("loadBalancerSourceRanges".to_owned());
    }
    let choice = Choice::of(spec);
    let slices = by_service
        .get(&(ns, name))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut local_ready = 0;
    for port in spec.ports.as_deref().unwrap_or_default() {
        match port_frontends(out, port, &addrs, &choice, slices, here) {
            Ok(ready) => local_ready = local_ready.max(ready),
            Err(unsupported) => {
                not_done.insert(unsupported);
            }
        }
    }
    if let Some(port) = spec
        .health_check_node_port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|_| choice.external_local)
    {
        out.health.insert(
            port,
            HealthCheck {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                local_endpoints: local_ready,
            },
        );
    }
    if !not_done.is_empty() {
        let fields: Vec<String> = not_done.into_iter().collect();
        out.unhandled
            .push((format!("{ns}/{name}"), fields.join(", ")));
    }
}

/// The frontends of one port of a Service on every address of it; the most ready local
/// endpoints any of them has, or what is not translated (a protocol other than TCP and
/// UDP).
fn port_frontends(
    out: &mut Rendered,
    port: &k8s_openapi::api::core::v1::ServicePort,
    addrs: &Addresses,
    choice: &Choice,
    slices: &[&EndpointSlice],
    here: &Locality,
) -> Result<usize, String> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    let proto = match protocol {
        "TCP" => cni_ebpf_common::proto::TCP,
        "UDP" => cni_ebpf_common::proto::UDP,
        other => return Err(format!("protocol {other} (port {})", port.port)),
    };
    let Ok(svc_port) = u16::try_from(port.port) else {
        return Ok(0);
    };
    let node_port = port.node_port.and_then(|p| u16::try_from(p).ok());
    let mut local_ready = 0;
    for ip in &addrs.cluster {
        let candidates = candidates(slices, port.name.as_deref(), protocol, *ip, here);
        local_ready = local_ready.max(candidates.iter().filter(|c| c.local && c.ready).count());
        let set = |local_only: bool| Frontend {
            backends: backends(&candidates, local_only, here),
            affinity_secs: choice.affinity_secs,
        };
        let (cluster, external) = (set(false), set(choice.external_local));
        out.frontends.insert(
            service_key(*ip, svc_port, proto),
            set(choice.internal_local),
        );
        let mut outside = |at: At, port: u16, inside: bool, uplink: bool| {
            if inside {
                out.frontends.insert(
                    frontend_key(at, port, proto, Scope::Socket),
                    cluster.clone(),
                );
            }
            if uplink {
                out.frontends.insert(
                    frontend_key(at, port, proto, Scope::Uplink),
                    external.clone(),
                );
            }
        };
        if let Some(np) = node_port {
            // Without a usable endpoint anywhere, flows from outside to the NodePort go to
            // the node's stack, where nothing listens on it: a TCP reset or an ICMP port
            // unreachable refuses them at once, as kube-proxy's REJECT does. (External and
            // load-balancer addresses are not the node's: their flows are dropped instead.)
            let uplink = !cluster.backends.is_empty();
            outside(At::Node { ipv6: ip.is_ipv6() }, np, true, uplink);
        }
        for e in addrs
            .external
            .iter()
            .filter(|e| e.is_ipv6() == ip.is_ipv6())
        {
            outside(At::Ip(*e), svc_port, true, true);
        }
        for (lb, inside) in addrs
            .load_balancer
            .iter()
            .filter(|(l, _)| l.is_ipv6() == ip.is_ipv6())
        {
            outside(At::Ip(*lb), svc_port, *inside, true);
        }
    }
    Ok(local_ready)
}

/// The backends of one frontend, sorted: the usable candidates ([`usable`]).
fn backends(
    candidates: &[Candidate],
    local_only: bool,
    here: &Locality,
) -> Vec<cni_ebpf_common::Backend> {
    let mut b: Vec<_> = usable(candidates, local_only, here)
        .into_iter()
        .map(backend)
        .collect();
    b.sort_unstable();
    b.dedup();
    b
}

/// The endpoints of the slices' port `port_name`/`protocol`, of `ip`'s family.
fn candidates(
    slices: &[&EndpointSlice],
    port_name: Option<&str>,
    protocol: &str,
    ip: IpAddr,
    here: &Locality,
) -> Vec<Candidate> {
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    let mut out = Vec::new();
    for s in slices {
        if s.address_type != family {
            continue;
        }
        let Some(port) = s.ports.as_deref().unwrap_or_default().iter().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name.unwrap_or("")
                && p.protocol.as_deref().unwrap_or("TCP") == protocol
        }) else {
            continue;
        };
        let Some(target) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for e in s.endpoints.iter().flatten() {
            // kube-proxy uses an endpoint's first address.
            let Some(addr) = e.address else {
                continue;
            };
            out.push(candidate(e, SocketAddr::new(addr, target), here));
        }
    }
    out
}

fn candidate(e: &Endpoint, addr: SocketAddr, here: &Locality) -> Candidate {
    let c = e.conditions.as_ref();
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let serving = c.and_then(|c| c.serving).unwrap_or(true);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    let hints = e.hints.as_ref();
    Candidate {
        addr,
        ready,
        serving_terminating: serving && terminating,
        local: !here.node.is_empty() && e.node_name.as_deref() == Some(here.node.as_str()),
        node_hints: hints
            .and_then(|h| h.for_nodes.as_ref())
            .map(|v| v.iter().map(|n| n.name.clone()).collect())
            .unwrap_or_default(),
        zone_hints: hints
            .and_then(|h| h.for_zones.as_ref())
            .map(|v| v.iter().map(|z| z.name.clone()).collect())
            .unwrap_or_default(),
    }
}

/// The endpoints a new connection from this node may go to (kube-proxy's
/// `CategorizeEndpoints` for traffic from inside the cluster).
fn usable(all: &[Candidate], local_only: bool, here: &Locality) -> Vec<SocketAddr> {
    let pick = |f: &dyn Fn(&Candidate) -> bool| -> Vec<SocketAddr> {
        all.iter().filter(|c| f(c)).map(|c| c.addr).collect()
    };
    if local_only {
        let ready = pick(&|c| c.local && c.ready);
        return if ready.is_empty() {
            pick(&|c| c.local && c.serving_terminating)
        } else {
            ready
        };
    }
    let ready: Vec<&Candidate> = all.iter().filter(|c| c.ready).collect();
    let zone = here.zone.as_deref().unwrap_or("");
    let by_node = !ready.is_empty()
        && ready.iter().all(|c| !c.node_hints.is_empty())
        && ready.iter().any(|c| c.node_hints.contains(&here.node));
    let by_zone = !by_node
        && !ready.is_empty()
        && ready.iter().all(|c| !c.zone_hints.is_empty())
        && ready.iter().any(|c| c.zone_hints.contains(zone));
    let chosen = if by_node {
        pick(&|c| c.ready && c.node_hints.contains(&here.node))
    } else if by_zone {
        pick(&|c| c.ready && c.zone_hints.contains(zone))
    } else {
        pick(&|c| c.ready)
    };
    if chosen.is_empty() {
        pick(&|c| c.serving_terminating)
    } else {
        chosen
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::datapath::services::backend_addr;

    fn svc(name: &str, spec: Value) -> Arc<Service> {
        let mut s: Service = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "default" },
            "spec": spec,
        }))
        .unwrap();
        s.slim();
        Arc::new(s)
    }

    fn web(extra: Value) -> Arc<Service> {
        let mut spec = json!({
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00:10:96::10"],
            "ports": [
                { "name": "http", "protocol": "TCP", "port": 80 },
                { "name": "dns", "protocol": "UDP", "port": 53 },
            ],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        svc("web", spec)
    }

    fn slice(name: &str, family: &str, endpoints: Value) -> Arc<EndpointSlice> {
        let mut s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": { "kubernetes.io/service-name": "web" },
            },
            "addressType": family,
            "endpoints": endpoints,
            "ports": [
                { "name": "http", "protocol": "TCP", "port": 8080 },
                { "name": "dns", "protocol": "UDP", "port": 5353 },
            ],
        }))
        .unwrap();
        s.slim();
        Arc::new(s)
    }

    fn ep(ip: &str, node: &str, ready: bool, terminating: bool) -> Value {
        json!({
            "addresses": [ip],
            "nodeName": node,
            "conditions": { "ready": ready, "serving": true, "terminating": terminating },
        })
    }

    fn here() -> Locality {
        Locality {
            node: "node-a".into(),
            zone: Some("zone-1".into()),
        }
    }

    /// The backends of frontend `ip:port/proto`, as `ip:port` strings.
    fn backends(t: &ServiceTable, ip: &str, port: u16, proto: u8) -> Option<Vec<String>> {
        t.get(&service_key(ip.parse().unwrap(), port, proto))
            .map(|f| {
                f.backends
                    .iter()
                    .map(|b| backend_addr(b).to_string())
                    .collect()
            })
    }

    const TCP: u8 = cni_ebpf_common::proto::TCP;
    const UDP: u8 = cni_ebpf_common::proto::UDP;

    #[test]
    fn every_cluster_ip_port_and_family_gets_its_ready_endpoints() {
        let slices = [
            slice(
                "web-v4",
                "IPv4",
                json!([
                    ep("10.244.1.2", "node-a", true, false),
                    ep("10.244.2.2", "node-b", true, false),
                    ep("10.244.2.3", "node-b", false, false),
                ]),
            ),
            slice(
                "web-v6",
                "IPv6",
                json!([ep("fd00::2", "node-b", true, false)]),
            ),
        ];
        let Rendered {
            frontends: t,
            unhandled,
            ..
        } = table(&[web(json!({}))], &slices, &here());
        assert_eq!(t.len(), 4);
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.2:8080", "10.244.2.2:8080"]
        );
        assert_eq!(
            backends(&t, "10.96.0.10", 53, UDP).unwrap(),
            ["10.244.1.2:5353", "10.244.2.2:5353"]
        );
        assert_eq!(
            backends(&t, "fd00:10:96::10", 80, TCP).unwrap(),
            ["[fd00::2]:8080"]
        );
        assert!(unhandled.is_empty(), "{unhandled:?}");
    }

    #[test]
    fn terminating_endpoints_serve_only_when_nothing_is_ready() {
        let both = [slice(
            "s",
            "IPv4",
            json!([
                ep("10.244.1.2", "node-a", true, false),
                ep("10.244.1.3", "node-a", false, true),
            ]),
        )];
        let Rendered { frontends: t, .. } = table(&[web(json!({}))], &both, &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.2:8080"]
        );
        let only_terminating = [slice(
            "s",
            "IPv4",
            json!([ep("10.244.1.3", "node-a", false, true)]),
        )];
        let Rendered { frontends: t, .. } = table(&[web(json!({}))], &only_terminating, &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.3:8080"]
        );
        // No endpoint at all: a frontend with no backend (refused), not a missing one.
        let Rendered { frontends: t, .. } = table(&[web(json!({}))], &[], &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn internal_traffic_policy_local_keeps_this_nodes_endpoints_only() {
        let slices = [slice(
            "s",
            "IPv4",
            json!([
                ep("10.244.1.2", "node-a", true, false),
                ep("10.244.2.2", "node-b", true, false),
            ]),
        )];
        let local = web(json!({ "internalTrafficPolicy": "Local" }));
        let Rendered { frontends: t, .. } = table(std::slice::from_ref(&local), &slices, &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.2:8080"]
        );
        let elsewhere = Locality {
            node: "node-c".into(),
            zone: None,
        };
        let Rendered { frontends: t, .. } = table(&[local], &slices, &elsewhere);
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn topology_hints_narrow_the_choice_only_when_every_endpoint_has_one() {
        let hinted = |ip: &str, node: &str, zone: &str| {
            let mut e = ep(ip, node, true, false);
            e["hints"] = json!({ "forZones": [{ "name": zone }] });
            e
        };
        let svc = web(json!({ "trafficDistribution": "PreferClose" }));
        let slices = [slice(
            "s",
            "IPv4",
            json!([
                hinted("10.244.1.2", "node-a", "zone-1"),
                hinted("10.244.2.2", "node-b", "zone-2"),
            ]),
        )];
        let Rendered { frontends: t, .. } = table(std::slice::from_ref(&svc), &slices, &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.2:8080"]
        );
        // One endpoint without a hint: hints ignored.
        let slices = [slice(
            "s",
            "IPv4",
            json!([
                hinted("10.244.1.2", "node-a", "zone-1"),
                ep("10.244.2.2", "node-b", true, false),
            ]),
        )];
        let Rendered { frontends: t, .. } = table(std::slice::from_ref(&svc), &slices, &here());
        assert_eq!(backends(&t, "10.96.0.10", 80, TCP).unwrap().len(), 2);
        // Node hints win over zone hints when every endpoint has them.
        let mut a = hinted("10.244.1.2", "node-a", "zone-9");
        a["hints"]["forNodes"] = json!([{ "name": "node-a" }]);
        let mut b = hinted("10.244.2.2", "node-b", "zone-1");
        b["hints"]["forNodes"] = json!([{ "name": "node-b" }]);
        let Rendered { frontends: t, .. } =
            table(&[svc], &[slice("s", "IPv4", json!([a, b]))], &here());
        assert_eq!(
            backends(&t, "10.96.0.10", 80, TCP).unwrap(),
            ["10.244.1.2:8080"]
        );
    }

    #[test]
    fn session_affinity_carries_its_timeout() {
        let slices = [slice(
            "s",
            "IPv4",
            json!([ep("10.244.1.2", "node-a", true, false)]),
        )];
        let Rendered { frontends: t, .. } = table(
            &[web(json!({ "sessionAffinity": "ClientIP" }))],
            &slices,
            &here(),
        );
        let key = service_key("10.96.0.10".parse().unwrap(), 80, TCP);
        assert_eq!(t[&key].affinity_secs, DEFAULT_AFFINITY_SECS);
        let Rendered { frontends: t, .. } = table(
            &[web(json!({
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": { "clientIP": { "timeoutSeconds": 30 } },
            }))],
            &slices,
            &here(),
        );
        assert_eq!(t[&key].affinity_secs, 30);
        let Rendered { frontends: t, .. } = table(&[web(json!({}))], &slices, &here());
        assert_eq!(t[&key].affinity_secs, 0);
    }

    #[test]
    fn headless_external_name_and_other_proxies_services_are_skipped() {
        let headless = web(json!({ "clusterIP": "None", "clusterIPs": ["None"] }));
        let external = web(json!({ "type": "ExternalName", "externalName": "example.org" }));
        let mut other = (*web(json!({}))).clone();
        other.metadata.labels = Some(
            [(
                super::super::service_objects::PROXY_NAME_LABEL.to_owned(),
                "someone-else".to_owned(),
            )]
            .into_iter()
            .collect(),
        );
        other.slim();
        for s in [headless, external, Arc::new(other)] {
            let Rendered { frontends: t, .. } = table(&[s], &[], &here());
            assert!(t.is_empty(), "{t:?}");
        }
    }

    /// The backends of frontend `at:port/proto` in `scope`, as `ip:port` strings.
    fn at(t: &ServiceTable, at: At, port: u16, proto: u8, scope: Scope) -> Option<Vec<String>> {
        t.get(&frontend_key(at, port, proto, scope)).map(|f| {
            f.backends
                .iter()
                .map(|b| backend_addr(b).to_string())
                .collect()
        })
    }

    fn two_nodes() -> [Arc<EndpointSlice>; 1] {
        [slice(
            "web-v4",
            "IPv4",
            json!([
                ep("10.244.1.2", "node-a", true, false),
                ep("10.244.2.2", "node-b", true, false),
            ]),
        )]
    }

    #[test]
    fn a_node_port_is_translated_from_inside_and_from_outside() {
        let s = web(json!({
            "type": "NodePort",
            "ports": [{ "name": "http", "protocol": "TCP", "port": 80, "nodePort": 30080 }],
        }));
        let Rendered {
            frontends: t,
            health,
            unhandled,
        } = table(&[s], &two_nodes(), &here());
        let both = Some(vec![
            "10.244.1.2:8080".to_owned(),
            "10.244.2.2:8080".to_owned(),
        ]);
        let node4 = At::Node { ipv6: false };
        assert_eq!(at(&t, node4, 30080, TCP, Scope::Socket), both);
        assert_eq!(at(&t, node4, 30080, TCP, Scope::Uplink), both);
        // The IPv6 family has its NodePort too, with no endpoint: refused at the socket
        // from inside, left to the node's stack (which refuses it) from outside.
        let node6 = At::Node { ipv6: true };
        assert_eq!(at(&t, node6, 30080, TCP, Scope::Socket), Some(vec![]));
        assert_eq!(at(&t, node6, 30080, TCP, Scope::Uplink), None);
        assert!(health.is_empty());
        assert!(unhandled.is_empty(), "{unhandled:?}");
    }

    #[test]
    fn external_traffic_policy_local_keeps_outside_flows_on_the_node_and_answers_its_health_check()
    {
        let s = web(json!({
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
            "externalIPs": ["192.0.2.10"],
            "ports": [{ "name": "http", "protocol": "TCP", "port": 80, "nodePort": 30080 }],
        }));
        let mut s = (*s).clone();
        s.status = serde_json::from_value(json!({
            "loadBalancer": { "ingress": [
                { "ip": "203.0.113.7" },
                { "ip": "203.0.113.8", "ipMode": "Proxy" },
                { "hostname": "lb.example.org" },
            ] }
        }))
        .unwrap();
        let s = Arc::new(s);
        let Rendered {
            frontends: t,
            health,
            ..
        } = table(std::slice::from_ref(&s), &two_nodes(), &here());
        let local = Some(vec!["10.244.1.2:8080".to_owned()]);
        let both = Some(vec![
            "10.244.1.2:8080".to_owned(),
            "10.244.2.2:8080".to_owned(),
        ]);
        let node4 = At::Node { ipv6: false };
        let ip = |a: &str| At::Ip(a.parse().unwrap());
        for (frontend, port) in [
            (node4, 30080),
            (ip("192.0.2.10"), 80),
            (ip("203.0.113.7"), 80),
            (ip("203.0.113.8"), 80),
        ] {
            assert_eq!(
                at(&t, frontend, port, TCP, Scope::Uplink),
                local,
                "{frontend:?}"
            );
        }
        // From inside, the cluster's endpoints; a Proxy-mode address is the load
        // balancer's to answer.
        for (frontend, port) in [
            (node4, 30080),
            (ip("192.0.2.10"), 80),
            (ip("203.0.113.7"), 80),
        ] {
            assert_eq!(
                at(&t, frontend, port, TCP, Scope::Socket),
                both,
                "{frontend:?}"
            );
        }
        assert_eq!(at(&t, ip("203.0.113.8"), 80, TCP, Scope::Socket), None);
        assert_eq!(
            health.get(&32000),
            Some(&HealthCheck {
                namespace: "default".into(),
                name: "web".into(),
                local_endpoints: 1
            })
        );
        // On a node without an endpoint: nothing from outside, and a failing check.
        let elsewhere = Locality {
            node: "node-c".into(),
            zone: None,
        };
        let Rendered {
            frontends: t,
            health,
            ..
        } = table(&[s], &two_nodes(), &elsewhere);
        assert_eq!(at(&t, node4, 30080, TCP, Scope::Uplink), Some(vec![]));
        assert_eq!(at(&t, node4, 30080, TCP, Scope::Socket), both);
        assert_eq!(health[&32000].local_endpoints, 0);
    }

    #[test]
    fn untranslated_fields_are_named() {
        let s = web(json!({
            "type": "LoadBalancer",
            "loadBalancerSourceRanges": ["198.51.100.0/24"],
            "ports": [
                { "name": "http", "protocol": "TCP", "port": 80, "nodePort": 30080 },
                { "name": "sctp", "protocol": "SCTP", "port": 9 },
            ],
        }));
        let Rendered {
            frontends: t,
            unhandled,
            ..
        } = table(&[s], &[], &here());
        // The rest still works.
        assert!(backends(&t, "10.96.0.10", 80, TCP).is_some());
        assert!(at(&t, At::Node { ipv6: false }, 30080, TCP, Scope::Socket).is_some());
        assert_eq!(unhandled.len(), 1);
        let (svc, what) = &unhandled[0];
        assert_eq!(svc, "default/web");
        for field in ["loadBalancerSourceRanges", "protocol SCTP"] {
            assert!(what.contains(field), "{what}");
        }
    }
}
