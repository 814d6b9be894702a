//! Service and EndpointSlice objects, as the API server holds them, for the tests of the
//! agent's kube-proxy replacement: the same Services the kube-proxy renderer
//! ([`crate::kubeproxy`]) turns into rules, written to the stand-in API server instead.
//!
//! Each Service gets one EndpointSlice per address family, named `<service>-ipv4` /
//! `<service>-ipv6`, labelled `kubernetes.io/service-name` as the EndpointSlice controller
//! labels them; every endpoint is Ready (the renderer's endpoints are ready ones).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::kubeproxy::{ServicePort, TrafficPolicy};

/// The Service objects and EndpointSlices of `ports` (resource, object), Services first.
#[must_use]
pub fn objects(ports: &[ServicePort]) -> Vec<(&'static str, Value)> {
    let mut by_service: BTreeMap<(String, String), Vec<&ServicePort>> = BTreeMap::new();
    for p in ports {
        by_service
            .entry((p.namespace.clone(), p.name.clone()))
            .or_default()
            .push(p);
    }
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for ((ns, name), ports) in by_service {
        services.push(("services", service(&ns, &name, &ports)));
        for (family, v6) in [("IPv4", false), ("IPv6", true)] {
            let fam: Vec<&ServicePort> = ports
                .iter()
                .copied()
                .filter(|p| p.is_ipv6() == v6)
                .collect();
            if !fam.is_empty() {
                slices.push(("endpointslices", slice(&ns, &name, family, &fam)));
            }
        }
    }
    services.extend(slices);
    services
}

fn protocol(p: &ServicePort) -> &'static str {
    match p.protocol {
        crate::kubeproxy::Protocol::Tcp => "TCP",
        crate::kubeproxy::Protocol::Udp => "UDP",
        crate::kubeproxy::Protocol::Sctp => "SCTP",
    }
}

/// The Service `ns/name` with the ports of `ports` (one per name and protocol; the
/// ClusterIPs of both families).
#[must_use]
pub fn service(ns: &str, name: &str, ports: &[&ServicePort]) -> Value {
    let mut ips: Vec<String> = Vec::new();
    let mut spec_ports: Vec<Value> = Vec::new();
    let mut node_port_policy = None;
    let (mut external_ips, mut lb_ips): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut external_policy = None;
    for p in ports {
        let ip = p.cluster_ip.to_string();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
        for (from, into) in [
            (&p.external_ips, &mut external_ips),
            (&p.load_balancer_ips, &mut lb_ips),
        ] {
            for a in from {
                external_policy = Some(p.external_traffic_policy);
                if !into.contains(&a.to_string()) {
                    into.push(a.to_string());
                }
            }
        }
        let port = json!({
            "name": p.port_name,
            "protocol": protocol(p),
            "port": p.port,
            "targetPort": p.endpoints.first().map_or(p.port, |e| e.addr.port()),
        });
        let mut port = port;
        if let Some(np) = p.node_port {
            port["nodePort"] = json!(np);
            node_port_policy = Some(p.external_traffic_policy);
        }
        if !spec_ports
            .iter()
            .any(|q| q["name"] == port["name"] && q["protocol"] == port["protocol"])
        {
            spec_ports.push(port);
        }
    }
    // IPv4 first, as a dual-stack Service lists its primary family first.
    ips.sort_by_key(|ip| ip.contains(':'));
    let families: Vec<&str> = ips
        .iter()
        .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
        .collect();
    let kind = if !lb_ips.is_empty() {
        "LoadBalancer"
    } else if node_port_policy.is_some() {
        "NodePort"
    } else {
        "ClusterIP"
    };
    let mut spec = json!({
        "type": kind,
        "clusterIP": ips[0],
        "clusterIPs": ips,
        "ipFamilies": families,
        "ipFamilyPolicy": if ips.len() > 1 { "PreferDualStack" } else { "SingleStack" },
        "ports": spec_ports,
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
    });
    if let Some(policy) = node_port_policy.or(external_policy) {
        spec["externalTrafficPolicy"] = json!(match policy {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        });
    }
    if !external_ips.is_empty() {
        spec["externalIPs"] = json!(external_ips);
    }
    let mut service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": ns },
        "spec": spec,
    });
    if !lb_ips.is_empty() {
        let ingress: Vec<Value> = lb_ips.iter().map(|ip| json!({ "ip": ip })).collect();
        service["status"] = json!({ "loadBalancer": { "ingress": ingress } });
    }
    service
}

/// The EndpointSlice of `ns/name` for `family` (`IPv4`/`IPv6`) with the endpoints of
/// `ports` (all of that family), each Ready.
#[must_use]
pub fn slice(ns: &str, name: &str, family: &str, ports: &[&ServicePort]) -> Value {
    let mut endpoints: Vec<Value> = Vec::new();
    let mut slice_ports: Vec<Value> = Vec::new();
    for p in ports {
        for e in &p.endpoints {
            let ip = e.addr.ip().to_string();
            if !endpoints.iter().any(|v| v["addresses"][0] == json!(ip)) {
                endpoints.push(endpoint(&ip, &e.node, true, false));
            }
        }
        let port = json!({
            "name": p.port_name,
            "protocol": protocol(p),
            "port": p.endpoints.first().map_or(p.port, |e| e.addr.port()),
        });
        if !slice_ports.contains(&port) {
            slice_ports.push(port);
        }
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-{}", family.to_lowercase()),
            "namespace": ns,
            "labels": { "kubernetes.io/service-name": name },
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": slice_ports,
    })
}

/// One endpoint of an EndpointSlice: `ip` on `node`, with its conditions.
#[must_use]
pub fn endpoint(ip: &str, node: &str, ready: bool, terminating: bool) -> Value {
    json!({
        "addresses": [ip],
        "nodeName": node,
        "conditions": { "ready": ready, "serving": ready || terminating, "terminating": terminating },
    })
}
