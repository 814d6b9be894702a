//! The Service and EndpointSlice objects the kube-proxy replacement keeps: only the
//! fields [`super::service_table`] reads, under the API's own names, so everything else
//! an object carries is skipped while it is read and never kept. Every agent keeps every
//! Service and EndpointSlice of the cluster; as `k8s_openapi`'s types a Service with ten
//! endpoints holds about 10 KiB (an `Endpoint` alone is 352 bytes before its strings),
//! which at 10 000 Services is most of the agent's memory limit.

use std::{borrow::Cow, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{LoadBalancerStatus, ServicePort, SessionAffinityConfig},
        discovery::v1::{EndpointConditions, EndpointHints, EndpointPort},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    NamespaceResourceScope,
};
use serde::Deserialize;

/// The label that hands a Service to another proxy.
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Service {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
    /// Whether [`PROXY_NAME_LABEL`] hands it to another proxy (set by [`Self::slim`]).
    #[serde(skip)]
    pub other_proxy: bool,
}

impl Service {
    /// Keeps what its labels say in [`Self::other_proxy`] and drops the metadata no
    /// round reads (a label map alone is half a kilobyte).
    pub fn slim(&mut self) {
        self.other_proxy = self
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(PROXY_NAME_LABEL));
        slim_meta(&mut self.metadata);
    }
}

/// What a Service's spec says about where its traffic goes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    pub load_balancer_source_ranges: Option<Vec<String>>,
    pub internal_traffic_policy: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub session_affinity: Option<String>,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub ports: Option<Vec<ServicePort>>,
    pub health_check_node_port: Option<i32>,
}

/// A Service's load-balancer addresses.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    pub load_balancer: Option<LoadBalancerStatus>,
}

/// An EndpointSlice.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub address_type: String,
    pub endpoints: Option<Vec<Endpoint>>,
    pub ports: Option<Vec<EndpointPort>>,
    /// Its Service's name, from [`SERVICE_NAME_LABEL`] (set by [`Self::slim`]).
    #[serde(skip)]
    pub service_name: Option<String>,
}

impl EndpointSlice {
    /// Keeps its Service's name in [`Self::service_name`] and drops the metadata no
    /// round reads.
    pub fn slim(&mut self) {
        self.service_name = self
            .metadata
            .labels
            .as_mut()
            .and_then(|l| l.remove(SERVICE_NAME_LABEL));
        slim_meta(&mut self.metadata);
    }
}

/// `meta` with only what identifies the object (an Event about it names it).
fn slim_meta(meta: &mut ObjectMeta) {
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        ..ObjectMeta::default()
    };
}

/// One endpoint of a slice.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Its first address (the one kube-proxy uses), if it parses.
    #[serde(default, rename = "addresses", deserialize_with = "first_address")]
    pub address: Option<IpAddr>,
    pub conditions: Option<EndpointConditions>,
    pub hints: Option<EndpointHints>,
    pub node_name: Option<String>,
}

/// The first of a list of addresses, if it parses; the list itself is not kept.
fn first_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    let all: Option<Vec<String>> = Option::deserialize(d)?;
    Ok(all.unwrap_or_default().first().and_then(|a| a.parse().ok()))
}

/// `kube::Resource` as `k8s_openapi`'s own type of the same object has it.
macro_rules! resource {
    ($t:ty, $kind:literal, $group:literal, $version:literal, $plural:literal) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind((): &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group((): &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }

            fn version((): &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }

            fn plural((): &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource!(Service, "Service", "", "v1", "services");
resource!(
    EndpointSlice,
    "EndpointSlice",
    "discovery.k8s.io",
    "v1",
    "endpointslices"
);

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use kube::Resource as _;

    use super::*;

    #[test]
    fn the_urls_are_those_of_the_api_types() {
        use k8s_openapi::api::{core::v1, discovery::v1 as discovery};
        assert_eq!(
            Service::url_path(&(), Some("ns")),
            v1::Service::url_path(&(), Some("ns"))
        );
        assert_eq!(
            EndpointSlice::url_path(&(), Some("ns")),
            discovery::EndpointSlice::url_path(&(), Some("ns"))
        );
        assert_eq!(Service::kind(&()), v1::Service::kind(&()));
        assert_eq!(
            EndpointSlice::kind(&()),
            discovery::EndpointSlice::kind(&())
        );
    }

    #[test]
    fn what_the_table_reads_is_kept_and_the_rest_skipped() {
        let s: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-x", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1", "10.0.0.2"], "conditions": {"ready": false},
                           "nodeName": "n1", "zone": "z", "targetRef": {"kind": "Pod", "name": "p"},
                           "hints": {"forZones": [{"name": "z"}]}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }))
        .unwrap();
        let mut s = s;
        s.slim();
        assert_eq!(s.service_name.as_deref(), Some("web"));
        assert!(s.metadata.labels.is_none());
        let e = &s.endpoints.as_deref().unwrap()[0];
        assert_eq!(e.address, "10.0.0.1".parse().ok());
        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(false));
        assert_eq!(e.node_name.as_deref(), Some("n1"));
        assert_eq!(
            e.hints.as_ref().unwrap().for_zones.as_ref().unwrap()[0].name,
            "z"
        );
        assert_eq!(s.ports.as_ref().unwrap()[0].port, Some(8080));
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                     "externalIPs": ["192.0.2.1"], "healthCheckNodePort": 30001,
                     "externalTrafficPolicy": "Local",
                     "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "Proxy"}]}},
        }))
        .unwrap();
        let mut svc = svc;
        svc.slim();
        assert!(!svc.other_proxy);
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ips.unwrap(), ["10.96.0.1"]);
        assert_eq!(spec.external_ips.unwrap(), ["192.0.2.1"]);
        assert_eq!(spec.health_check_node_port, Some(30001));
        assert_eq!(spec.ports.unwrap()[0].node_port, Some(30080));
        let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("Proxy"));
    }
}
