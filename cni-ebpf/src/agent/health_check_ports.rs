//! The health-check node ports of `externalTrafficPolicy: Local` Services
//! (`spec.healthCheckNodePort`), answered as kube-proxy answers them
//! (`pkg/proxy/healthcheck/service_health.go`), so that a cloud load balancer sends a
//! Service's traffic only to the nodes that have one of its endpoints: any `GET` gets
//! 200 while the node has a ready local endpoint of the Service, 503 while it has none,
//! with the count in `X-Load-Balancing-Endpoint-Weight` and a JSON body:
//!
//! ```json
//! {"service":{"namespace":"default","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}
//! ```
//!
//! Each port listens on every address of the node (`[::]`, IPv4 too; `0.0.0.0` where
//! IPv6 is off), on the Service job's runtime. A port that cannot be bound (kube-proxy
//! still holds it) is logged and tried again at the next round. Connections are bounded
//! as the metrics endpoint's are (`crate::agent::http`).

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, RwLock},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::HeaderValue,
    service::service_fn,
    Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::Semaphore, task::JoinHandle};

use crate::agent::http::{bounded_http1, CONNECTION_DEADLINE};

/// Connections one port serves at once.
const MAX_CONNECTIONS: usize = 16;

/// What one health-check node port answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Its ready endpoints on this node.
    pub local_endpoints: usize,
}

impl HealthCheck {
    /// The status and body of the answer.
    #[must_use]
    pub fn answer(&self) -> (StatusCode, String) {
        let status = if self.local_endpoints > 0 {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let body = serde_json::json!({
            "service": { "namespace": self.namespace, "name": self.name },
            "localEndpoints": self.local_endpoints,
            "serviceProxyHealthy": true,
        });
        (status, body.to_string())
    }
}

/// One port being answered.
struct Port {
    state: Arc<RwLock<HealthCheck>>,
    task: JoinHandle<()>,
}

/// The health-check node ports this node answers.
#[derive(Default)]
pub struct HealthChecks {
    ports: BTreeMap<u16, Port>,
}

impl HealthChecks {
    /// Answers exactly the ports of `want`, each with its state. Must run inside a tokio
    /// runtime.
    pub fn update(&mut self, want: &BTreeMap<u16, HealthCheck>) {
        self.ports.retain(|port, p| {
            let keep = want.contains_key(port);
            if !keep {
                p.task.abort();
                tracing::info!("health-check node port {port}: closed");
            }
            keep
        });
        for (port, check) in want {
            if let Some(p) = self.ports.get(port) {
                if let Ok(mut s) = p.state.write() {
                    if *s != *check {
                        *s = check.clone();
                    }
                }
                continue;
            }
            match bind(*port) {
                Ok(listener) => {
                    let state = Arc::new(RwLock::new(check.clone()));
                    let task = tokio::spawn(serve(listener, Arc::clone(&state)));
                    tracing::info!(
                        "health-check node port {port}: answering for {}/{}",
                        check.namespace,
                        check.name
                    );
                    self.ports.insert(*port, Port { state, task });
                }
                Err(e) => tracing::warn!(
                    "health-check node port {port} of {}/{}: {e}; tried again at the next \
                     change",
                    check.namespace,
                    check.name
                ),
            }
        }
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for p in self.ports.values() {
            p.task.abort();
        }
    }
}

/// A listener on every address of the node, `[::]` (dual-stack) else `0.0.0.0`.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    let std_listener = std::net::TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        .or_else(|_| {
            std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        })?;
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}

async fn serve(listener: TcpListener, state: Arc<RwLock<HealthCheck>>) {
    let http = bounded_http1();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let state = Arc::clone(&state);
        let service = service_fn(move |req| answer(Arc::clone(&state), req));
        let conn = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
            drop(slot);
        });
    }
}

async fn answer(
    state: Arc<RwLock<HealthCheck>>,
    _req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let check = state.read().map(|s| s.clone()).ok();
    let (status, body, weight) = match check {
        Some(c) => {
            let (status, body) = c.answer();
            (status, body, c.local_endpoints)
        }
        None => (StatusCode::SERVICE_UNAVAILABLE, String::new(), 0),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "x-load-balancing-endpoint-weight",
        HeaderValue::from(weight),
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_a_local_endpoint_answers_503() {
        let mut c = HealthCheck {
            namespace: "default".into(),
            name: "web".into(),
            local_endpoints: 2,
        };
        let (status, body) = c.answer();
        assert_eq!(status, StatusCode::OK);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(
            body,
            serde_json::json!({
                "service": { "namespace": "default", "name": "web" },
                "localEndpoints": 2,
                "serviceProxyHealthy": true,
            })
        );
        c.local_endpoints = 0;
        assert_eq!(c.answer().0, StatusCode::SERVICE_UNAVAILABLE);
    }
}
