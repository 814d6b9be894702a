//! Reading Node objects from the Kubernetes API server, for `install`'s pod-CIDR lookup and
//! the host-gw routes of `cni-ebpf agent --host-gw`.
//!
//! The client is the `kube` crate's typed API over a small HTTP stack of our own
//! ([`ApiClient::new`]), configured the way an in-cluster client is: the API server at
//! `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the ServiceAccount's
//! `token`, `ca.crt` and `namespace` from `/var/run/secrets/kubernetes.io/serviceaccount`.
//! Both the address and the directory can be overridden ([`ApiArgs`]), which is how the
//! tests point it at their stand-in API server.
//!
//! Every request is bounded by [`ApiArgs::api_timeout`] as a whole (connect, TLS, the
//! answer; nothing is retried within a request), and each way it can fail is an
//! [`ApiError`] that says what to do about it (RBAC for 403, the node name for 404, …).
//!
//! Nothing here is reachable from the CNI verbs: only `install` and the agent
//! subcommands build a client, so ADD/DEL never initialise TLS or an HTTP stack.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioExecutor};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{client::ConfigExt as _, Api, Client, Config};

pub mod credentials;
pub mod traffic;

/// Where a pod finds its ServiceAccount's credentials.
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Default [`ApiArgs::api_timeout`] in seconds.
pub const DEFAULT_API_TIMEOUT_SECS: u64 = 10;
/// Default [`ApiArgs::watch_timeout`] in seconds (client-go's and kube's, under the API
/// server's own limit).
pub const DEFAULT_WATCH_TIMEOUT_SECS: u32 = 290;
/// How much longer than its watch timeout an answer may stay silent: the API server ends
/// a watch at its timeout, so a body silent beyond it is on a dead connection. (The
/// watcher itself ends a silent watch 5 s after its timeout; this also bounds a list
/// whose body stalls.)
pub const WATCH_GRACE: Duration = Duration::from_secs(10);
/// TCP keepalive of the API connection: first probe after this much silence, then one
/// every [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] unanswered ones end it. A peer
/// gone without a word is noticed within 10 + 3 × 5 = 25 s.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEPALIVE_IDLE`].
pub const KEEPALIVE_PROBES: u32 = 3;

/// How to reach the API server (flattened into the subcommands that need it).
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The API server's URL (default: `https://$KUBERNETES_SERVICE_HOST:
    /// $KUBERNETES_SERVICE_PORT`, what every pod is given).
    #[arg(long, env = "CNI_EBPF_API_SERVER")]
    pub api_server: Option<String>,
    /// The directory holding the ServiceAccount's `token`, `ca.crt` (and `namespace`).
    #[arg(long, env = "CNI_EBPF_SERVICE_ACCOUNT_DIR", default_value = DEFAULT_SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
    /// A kubeconfig to reach the API server with instead of the ServiceAccount (its
    /// current context: server, CA, and a token, token file or client certificate);
    /// `--api-server` still overrides its server.
    #[arg(long, env = "CNI_EBPF_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Time limit of one API request, in seconds (connecting, TLS, retries and the answer).
    #[arg(long, default_value_t = DEFAULT_API_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub api_timeout: u64,
    /// How long the API server keeps one watch open, in seconds (`timeoutSeconds`); the
    /// watcher resumes it from its last resource version after, and starts it again when
    /// it stays silent this long plus 5 s. Any answer silent this long plus 10 s is cut
    /// off and retried.
    #[arg(long, env = "CNI_EBPF_WATCH_TIMEOUT", default_value_t = DEFAULT_WATCH_TIMEOUT_SECS, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub watch_timeout: u32,
}

impl ApiArgs {
    /// How a watcher of the agent lists and watches: the server keeps each watch open
    /// `--watch-timeout` seconds, with bookmarks.
    #[must_use]
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        kube::runtime::watcher::Config::default().timeout(self.watch_timeout)
    }

    /// How long an answer's body may stay silent before it is cut off: a watch's own
    /// timeout and [`WATCH_GRACE`].
    #[must_use]
    pub fn idle_limit(&self) -> Duration {
        Duration::from_secs(u64::from(self.watch_timeout)) + WATCH_GRACE
    }
}

/// Why the API server could not tell us what we asked.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No address was given and the pod's environment has none.
    #[error(
        "no API server address: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not \
         set (not running in a pod?) and --api-server / CNI_EBPF_API_SERVER is not given"
    )]
    NoServer,

    /// The address is not an `https://` URL.
    #[error("API server address {0:?} is not an https:// URL")]
    BadServer(String),

    /// A ServiceAccount file is missing or unreadable.
    #[error(
        "reading the ServiceAccount credentials {path}: {source} (is a ServiceAccount token \
         mounted? the pod needs serviceAccountName and automountServiceAccountToken not false)"
    )]
    Credentials {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// `ca.crt` holds no usable certificate.
    #[error("{path}: {reason}")]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },

    /// The client could not be set up (TLS configuration).
    #[error("setting up the API client for {server}: {reason}")]
    Client {
        /// The API server.
        server: String,
        /// Why.
        reason: String,
    },

    /// A kubeconfig that cannot be used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },

    /// The token file holds what cannot be an HTTP header.
    #[error("{0}: the ServiceAccount token holds characters an HTTP header cannot carry")]
    BadToken(PathBuf),

    /// 401: the token was refused.
    #[error(
        "the API server at {server} refused the ServiceAccount token from {token} (401 \
         Unauthorized: {message}); is the token current and issued by this cluster?"
    )]
    Unauthorized {
        /// The API server.
        server: String,
        /// The token file.
        token: PathBuf,
        /// The server's message.
        message: String,
    },

    /// 403: RBAC does not allow it.
    #[error(
        "the API server at {server} forbids {what} (403 Forbidden: {message}); RBAC: the \
         pod's ServiceAccount needs `{verb}` on `nodes` (a ClusterRole with apiGroups [\"\"], \
         resources [nodes], verbs [get, list, watch], bound to it by a ClusterRoleBinding; \
         deploy/base/rbac.yaml has one)"
    )]
    Forbidden {
        /// The API server.
        server: String,
        /// What was asked, e.g. `get node \"node-a\"`.
        what: String,
        /// The RBAC verb.
        verb: &'static str,
        /// The server's message.
        message: String,
    },

    /// 404 on a Node get.
    #[error(
        "node {name:?} not found at {server} (404 Not Found: {message}); the node name must be \
         the Node object's metadata.name: pass it with --node-name or NODE_NAME from the \
         downward API (fieldRef spec.nodeName)"
    )]
    NodeNotFound {
        /// The API server.
        server: String,
        /// The node name asked for.
        name: String,
        /// The server's message.
        message: String,
    },

    /// No complete answer within the time limit.
    #[error(
        "no answer from the API server at {server} within {secs} s (--api-timeout) while \
         asking for {what}: is the address right and the API server reachable from the node's \
         network?"
    )]
    Timeout {
        /// The API server.
        server: String,
        /// What was asked.
        what: String,
        /// The limit in seconds.
        secs: u64,
    },

    /// Any other error status.
    #[error("the API server at {server} answered {what} with {code} {reason}: {message}")]
    Status {
        /// The API server.
        server: String,
        /// What was asked.
        what: String,
        /// HTTP status.
        code: u16,
        /// The Status reason.
        reason: String,
        /// The Status message.
        message: String,
    },

    /// Connection, TLS or decoding failure.
    #[error("asking the API server at {server} for {what}: {reason}")]
    Transport {
        /// The API server.
        server: String,
        /// What was asked.
        what: String,
        /// The client's error with its whole chain of causes (connection refused, the
        /// certificate the CA does not vouch for, …): its top level alone says only
        /// "client error (Connect)".
        reason: String,
    },
}

/// A connected API client.
pub struct ApiClient {
    client: Client,
    server: String,
    token: PathBuf,
    timeout: Duration,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// The API server's URL: the flag, else the pod's environment.
fn server_url(args: &ApiArgs) -> Result<String, ApiError> {
    if let Some(s) = args.api_server.as_deref().filter(|s| !s.is_empty()) {
        return Ok(s.trim_end_matches('/').to_owned());
    }
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
    match (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) {
        (Some(h), Some(p)) => Ok(match h.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:{p}"),
            _ => format!("https://{h}:{p}"),
        }),
        _ => Err(ApiError::NoServer),
    }
}

/// `Bearer <token>` as a sensitive header value; `None` when the token cannot be one.
fn bearer_header(token: &str) -> Option<http::HeaderValue> {
    let mut v = http::HeaderValue::try_from(format!("Bearer {token}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

impl ApiClient {
    /// Builds the client from the ServiceAccount (or the kubeconfig `args` names: see
    /// [`credentials`]). Must be called inside a tokio runtime (the client spawns its
    /// request buffer there). Reads nothing from the network yet.
    ///
    /// The HTTP stack is ours, not kube's `Client::try_from(Config)`: hyper-util's
    /// client over hyper-rustls (ring, HTTP/1.1, the given CA as the only root), the
    /// token as a bearer header or a client certificate, the base URL layer. kube's own
    /// stack would also link its exec-plugin machinery, which the agent never runs. The
    /// CA is read here; a token file here and again for every request, so a long-lived
    /// client (the agent's watches) follows its rotation.
    pub fn new(args: &ApiArgs) -> Result<Self, ApiError> {
        let creds = credentials::resolve(args)?;
        let server = creds.server.clone();
        let uri: http::Uri = server
            .parse()
            .ok()
            .filter(|u: &http::Uri| u.scheme_str() == Some("https"))
            .ok_or_else(|| ApiError::BadServer(server.clone()))?;
        let bad_ca = |reason: String| ApiError::BadCa {
            path: creds.ca_source.clone(),
            reason,
        };
        let roots = crate::tls::roots(&creds.ca_pem).map_err(bad_ca)?;
        let client_err = |e: &dyn std::fmt::Display| ApiError::Client {
            server: server.clone(),
            reason: e.to_string(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| client_err(&e))?
            .with_root_certificates(roots);
        let tls = match &creds.auth {
            credentials::Auth::ClientCert { chain, key } => {
                let chain = crate::tls::certificates(chain)
                    .map_err(|e| client_err(&format!("the client certificate {e}")))?;
                let key = crate::tls::private_key(key)
                    .map_err(|e| client_err(&format!("the client key {e}")))?;
                tls.with_client_auth_cert(chain, key)
                    .map_err(|e| client_err(&format!("the client certificate: {e}")))?
            }
            credentials::Auth::Bearer { .. } => tls.with_no_client_auth(),
        };
        let timeout = Duration::from_secs(args.api_timeout);
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(timeout));
        // A watch is silent for minutes on a quiet cluster: without keepalive, a peer that
        // vanished (a moved address, a dropped NAT entry) would never be noticed.
        tcp.set_keepalive(Some(KEEPALIVE_IDLE));
        tcp.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
        tcp.set_keepalive_retries(Some(KEEPALIVE_PROBES));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(tcp);
        let http_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build::<_, kube::client::Body>(https);
        let mut config = Config::new(uri);
        if let Some(ns) = &creds.namespace {
            config.default_namespace.clone_from(ns);
        }
        let (bearer, token_file) = match &creds.auth {
            credentials::Auth::Bearer { token, file } => {
                let source = file
                    .clone()
                    .unwrap_or_else(|| args.kubeconfig.clone().unwrap_or_default());
                let header = bearer_header(token).ok_or(ApiError::BadToken(source))?;
                (Some(header), file.clone())
            }
            credentials::Auth::ClientCert { .. } => (None, None),
        };
        let token_path = token_file
            .clone()
            .or_else(|| args.kubeconfig.clone())
            .unwrap_or_default();
        let idle = args.idle_limit();
        let counted = tower::service_fn(move |req| {
            let http = http_client.clone();
            traffic::counted(move |req| http.request(req), req, idle)
        });
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .map_request(move |mut req: http::Request<kube::client::Body>| {
                // The kubelet rewrites a projected token well before it expires: every
                // request (a watch lasts minutes, an agent for months) reads it anew, and
                // keeps the last good one if the file cannot be read.
                let fresh = token_file.as_ref().and_then(|f| {
                    std::fs::read(f)
                        .ok()
                        .and_then(|t| bearer_header(String::from_utf8_lossy(&t).trim()))
                });
                if let Some(value) = fresh.or_else(|| bearer.clone()) {
                    req.headers_mut().insert(http::header::AUTHORIZATION, value);
                }
                req
            })
            .service(counted);
        let client = Client::new(service, config.default_namespace);
        Ok(Self {
            client,
            server,
            token: token_path,
            timeout,
        })
    }

    /// The underlying `kube` client (for watchers: no time limit of its own, so a watch
    /// may stay open).
    #[must_use]
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The API server's URL.
    #[must_use]
    pub fn server(&self) -> &str {
        &self.server
    }

    /// `GET /api/v1/nodes/{name}`.
    pub async fn node(&self, name: &str) -> Result<Node, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let what = format!("get node {name:?}");
        self.bounded(&what, "get", Some(name), api.get(name)).await
    }

    async fn bounded<T>(
        &self,
        what: &str,
        verb: &'static str,
        node: Option<&str>,
        fut: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Result<T, ApiError> {
        let server = self.server.clone();
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_) => Err(ApiError::Timeout {
                server,
                what: what.to_owned(),
                secs: self.timeout.as_secs(),
            }),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kube::Error::Api(status))) => Err(match (status.code, node) {
                (401, _) => ApiError::Unauthorized {
                    server,
                    token: self.token.clone(),
                    message: status.message,
                },
                (403, _) => ApiError::Forbidden {
                    server,
                    what: what.to_owned(),
                    verb,
                    message: status.message,
                },
                (404, Some(name)) => ApiError::NodeNotFound {
                    server,
                    name: name.to_owned(),
                    message: status.message,
                },
                (code, _) => ApiError::Status {
                    server,
                    what: what.to_owned(),
                    code,
                    reason: status.reason,
                    message: status.message,
                },
            }),
            Ok(Err(source)) if is_timeout(&source) => Err(ApiError::Timeout {
                server,
                what: what.to_owned(),
                secs: self.timeout.as_secs(),
            }),
            Ok(Err(source)) => Err(ApiError::Transport {
                server,
                what: what.to_owned(),
                reason: crate::error::chain(&source),
            }),
        }
    }
}

/// Whether kube's error is one of its own timeouts (connect/read), which carry no type we
/// can match on: their chain says "timed out" / "deadline".
fn is_timeout(e: &kube::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    for _ in 0..16 {
        let Some(err) = cur else { break };
        let text = err.to_string().to_ascii_lowercase();
        if text.contains("timed out")
            || text.contains("timeout")
            || text.contains("deadline has elapsed")
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A Node's pod CIDRs: `spec.podCIDRs`, else the older single `spec.podCIDR`. Values that
/// do not parse are returned as errors naming them.
pub fn pod_cidrs(node: &Node) -> Result<Vec<IpNet>, String> {
    let spec = node.spec.as_ref();
    let list: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()) {
        Some(l) if !l.is_empty() => l,
        _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect(),
    };
    list.iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| format!("spec.podCIDRs holds {s:?}: {e}"))
        })
        .collect()
}

/// A Node's `InternalIP` addresses from `status.addresses`, in order.
#[must_use]
pub fn internal_ips(node: &Node) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|addrs| {
            addrs
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A Node's `metadata.name`.
#[must_use]
pub fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// `node` reduced to what [`pod_cidrs`], [`internal_ips`] and [`name`] read (and the
/// metadata a watch and an Event need): a kept Node is a few hundred bytes instead of its
/// images, conditions and capacities, so every node of a large cluster fits.
pub fn slim_node(node: &mut Node) {
    let meta = &mut node.metadata;
    meta.managed_fields = None;
    // Only the node's WireGuard key is read.
    let key = crate::agent::wireguard::PUBLIC_KEY_ANNOTATION;
    meta.annotations = meta
        .annotations
        .take()
        .and_then(|mut a| a.remove_entry(key))
        .map(|kv| [kv].into());
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(spec) = node.spec.as_mut() {
        spec.taints = None;
        spec.config_source = None;
        spec.provider_id = None;
    }
    if let Some(status) = node.status.as_mut() {
        let addresses = status.addresses.take().map(|mut a| {
            a.retain(|a| a.type_ == "InternalIP");
            a
        });
        *status = k8s_openapi::api::core::v1::NodeStatus {
            addresses,
            ..Default::default()
        };
    }
}

#[cfg(test)]
#[expect(clippy::panic, clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn node(doc: serde_json::Value) -> Node {
        match serde_json::from_value(doc) {
            Ok(n) => n,
            Err(e) => panic!("not a Node: {e}"),
        }
    }

    #[test]
    fn pod_cidrs_prefer_the_list_and_fall_back_to_the_single_field() {
        let n = node(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24", "fd00::/64"]}
        }));
        assert_eq!(
            pod_cidrs(&n),
            Ok(vec![
                "10.0.0.0/24".parse().unwrap(),
                "fd00::/64".parse().unwrap()
            ])
        );
        let n = node(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"podCIDR": "10.0.1.0/24"}}),
        );
        assert_eq!(pod_cidrs(&n).map(|v| v.len()), Ok(1));
        let n = node(serde_json::json!({"metadata": {"name": "a"}, "spec": {}}));
        assert_eq!(pod_cidrs(&n), Ok(vec![]));
        let n = node(serde_json::json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["x"]}}));
        assert!(pod_cidrs(&n).is_err_and(|e| e.contains("\"x\"")));
    }

    #[test]
    fn internal_ips_skip_other_address_types() {
        let n = node(serde_json::json!({
            "metadata": {"name": "a"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "a"},
                {"type": "ExternalIP", "address": "203.0.113.1"},
                {"type": "InternalIP", "address": "198.18.0.1"},
                {"type": "InternalIP", "address": "fd00::1"}
            ]}
        }));
        assert_eq!(
            internal_ips(&n),
            vec![
                IpAddr::from([198, 18, 0, 1]),
                "fd00::1".parse::<IpAddr>().unwrap()
            ]
        );
    }

    #[test]
    fn the_server_comes_from_the_flag_or_the_pods_environment() {
        let args = ApiArgs {
            api_server: Some("https://127.0.0.1:6443/".into()),
            service_account_dir: PathBuf::from("/nonexistent"),
            kubeconfig: None,
            api_timeout: 1,
            watch_timeout: DEFAULT_WATCH_TIMEOUT_SECS,
        };
        assert_eq!(
            server_url(&args).ok().as_deref(),
            Some("https://127.0.0.1:6443")
        );
    }
}
