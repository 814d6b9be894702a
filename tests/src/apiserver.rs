//! A stand-in Kubernetes API server, for the tests of `install`'s Node lookup and of the
//! host-gw routes (no real API server can run on these machines).
//!
//! It is the one thing in these tests that is not the real component, so it copies what
//! the client sees of the real one, for the two requests the plugin makes:
//! - HTTPS only (rustls), with a certificate for the address it listens on, signed by a CA
//!   generated per server (rcgen); the CA is written as the ServiceAccount's `ca.crt`;
//! - `Authorization: Bearer <token>` checked against the ServiceAccount `token` it wrote
//!   (401 `Unauthorized` Status otherwise, as the API server answers a bad token);
//! - `GET /api/v1/nodes/{name}`: the Node object (`kind: Node`, `apiVersion: v1`,
//!   `metadata.resourceVersion`, `spec.podCIDR(s)`, `status.addresses`), or a 404 Status
//!   shaped like the API server's (`nodes "x" not found`, reason `NotFound`, details);
//! - `GET /api/v1/nodes`: a `NodeList` with `metadata.resourceVersion`;
//! - [`ApiServer::forbid`]: every request answered 403 with the API server's RBAC message
//!   (`User "system:serviceaccount:…" cannot get resource "nodes" …`);
//! - [`ApiServer::set_delay`]: answers held back (for the clients' time limits).
//!
//! It listens inside a network namespace the test created (the socket is made by a thread
//! that entered it), so nothing is bound in the machine's own namespace. Requests are
//! served one per connection (`Connection: close`), each on its own thread, and logged
//! ([`ApiServer::requests`]). Dropping it stops the accept loop; the service-account
//! directory is a temporary directory removed with it.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::net::in_netns;

/// The ServiceAccount the stand-in says the token belongs to (in RBAC messages).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cni-ebpf";

#[derive(Debug, Default)]
struct State {
    nodes: BTreeMap<String, Value>,
    resource_version: u64,
    forbidden: bool,
    delay: Duration,
    requests: Vec<String>,
}

/// A running stand-in API server (see the module documentation).
#[derive(Debug)]
pub struct ApiServer {
    addr: SocketAddr,
    token: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    sa_dir: tempfile::TempDir,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A random hex string from the kernel's generator.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if let Err(e) = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)) {
        panic!("reading /dev/urandom: {e}");
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A CA and a server certificate for `ip` (and the in-cluster DNS names) signed by it:
/// (CA PEM, server certificate DER, server key DER).
fn certificates(ip: std::net::IpAddr) -> (String, Vec<u8>, Vec<u8>) {
    let fail = |e: rcgen::Error| -> ! { panic!("generating the stand-in's certificates: {e}") };
    let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail(e));
    let mut ca_params =
        rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| fail(e));
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "stand-in kubernetes CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap_or_else(|e| fail(e));
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail(e));
    let mut params = rcgen::CertificateParams::new(vec![
        "kubernetes".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])
    .unwrap_or_else(|e| fail(e));
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let cert = params.signed_by(&key, &issuer).unwrap_or_else(|e| fail(e));
    (ca_cert.pem(), cert.der().to_vec(), key.serialize_der())
}

/// A Node object as the API server serves it. `pod_cidrs` become `spec.podCIDRs` (and the
/// first `spec.podCIDR`); `internal_ips` the `InternalIP` entries of `status.addresses`.
#[must_use]
pub fn node_object(name: &str, pod_cidrs: &[&str], internal_ips: &[&str]) -> Value {
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    let mut spec = json!({});
    if let Some(first) = pod_cidrs.first() {
        spec = json!({"podCIDR": first, "podCIDRs": pod_cidrs});
    }
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("{}-{}-{}-{}-{}", random_hex(4), random_hex(2), random_hex(2), random_hex(2), random_hex(6)),
            "creationTimestamp": "2026-11-23T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        },
        "spec": spec,
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.34.0", "operatingSystem": "linux", "architecture": "amd64"}
        }
    })
}

/// A `Status` object as the API server sends with an error code.
fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code
    });
    if let (Some(d), Some(obj)) = (details, s.as_object_mut()) {
        obj.insert("details".into(), d);
    }
    s
}

impl ApiServer {
    /// Starts a server inside `netns` on `ip` (a port is picked), with a fresh CA, token and
    /// ServiceAccount directory. Panics if it cannot.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path, ip: &str) -> Self {
        let ip: std::net::IpAddr = ip
            .parse()
            .unwrap_or_else(|e| panic!("stand-in API server address {ip}: {e}"));
        let (ca_pem, cert, key) = certificates(ip);
        let token = random_hex(24);
        let sa_dir = tempfile::Builder::new()
            .prefix("apiserver-sa-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating the ServiceAccount directory: {e}"));
        for (name, content) in [
            ("token", token.as_str()),
            ("ca.crt", ca_pem.as_str()),
            ("namespace", "kube-system"),
        ] {
            std::fs::write(sa_dir.path().join(name), content)
                .unwrap_or_else(|e| panic!("writing {name}: {e}"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_no_client_auth().with_single_cert(
                    vec![cert.into()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
                )
            })
            .unwrap_or_else(|e| panic!("the stand-in's TLS configuration: {e}"));
        let config = Arc::new(config);
        let listener = in_netns(netns, move || TcpListener::bind(SocketAddr::new(ip, 0)))
            .unwrap_or_else(|e| panic!("binding the stand-in API server on {ip}: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("stand-in API server address: {e}"));
        if let Err(e) = listener.set_nonblocking(true) {
            panic!("stand-in API server: {e}");
        }
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, stop, token) = (Arc::clone(&state), Arc::clone(&stop), token.clone());
            thread::spawn(move || accept_loop(&listener, &config, &state, &stop, &token))
        };
        Self {
            addr,
            token,
            state,
            stop,
            accept: Some(accept),
            sa_dir,
        }
    }

    /// `https://<ip>:<port>` (IPv6 in brackets).
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ServiceAccount directory (`token`, `ca.crt`, `namespace`) a client should use.
    #[must_use]
    pub fn sa_dir(&self) -> &Path {
        self.sa_dir.path()
    }

    /// The token the server accepts.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A ServiceAccount directory whose `token` the server does not accept (same CA).
    #[must_use]
    pub fn wrong_sa_dir(&self) -> PathBuf {
        let dir = self.sa_dir.path().join("wrong");
        let _ = std::fs::create_dir(&dir);
        for name in ["ca.crt", "namespace"] {
            if let Err(e) = std::fs::copy(self.sa_dir.path().join(name), dir.join(name)) {
                panic!("copying {name}: {e}");
            }
        }
        if let Err(e) = std::fs::write(dir.join("token"), random_hex(24)) {
            panic!("writing the wrong token: {e}");
        }
        dir
    }

    /// A ServiceAccount directory with the right token but the CA of another cluster.
    #[must_use]
    pub fn foreign_ca_sa_dir(&self) -> PathBuf {
        let dir = self.sa_dir.path().join("foreign-ca");
        let _ = std::fs::create_dir(&dir);
        for name in ["token", "namespace"] {
            if let Err(e) = std::fs::copy(self.sa_dir.path().join(name), dir.join(name)) {
                panic!("copying {name}: {e}");
            }
        }
        let (other_ca, _, _) = certificates(self.addr.ip());
        if let Err(e) = std::fs::write(dir.join("ca.crt"), other_ca) {
            panic!("writing the foreign CA: {e}");
        }
        dir
    }

    /// Adds or replaces a Node (see [`node_object`]); bumps the resource version.
    pub fn set_node(&self, name: &str, pod_cidrs: &[&str], internal_ips: &[&str]) {
        self.put_node(node_object(name, pod_cidrs, internal_ips));
    }

    /// Adds or replaces the Node object `node` as given; bumps the resource version.
    #[track_caller]
    pub fn put_node(&self, mut node: Value) {
        let Some(name) = node["metadata"]["name"].as_str().map(str::to_owned) else {
            panic!("a Node without metadata.name: {node}");
        };
        let mut s = lock(&self.state);
        s.resource_version += 1;
        node["metadata"]["resourceVersion"] = json!(s.resource_version.to_string());
        s.nodes.insert(name, node);
    }

    /// Deletes a Node.
    pub fn remove_node(&self, name: &str) {
        let mut s = lock(&self.state);
        s.resource_version += 1;
        s.nodes.remove(name);
    }

    /// Answers every request 403 (RBAC denies the ServiceAccount) while `on`.
    pub fn forbid(&self, on: bool) {
        lock(&self.state).forbidden = on;
    }

    /// Holds every answer back by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }

    /// Requests served so far: `"<method> <path> -> <status>"`, in order.
    #[must_use]
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    config: &Arc<rustls::ServerConfig>,
    state: &Arc<Mutex<State>>,
    stop: &Arc<AtomicBool>,
    token: &str,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (config, state, stop, token) = (
                    Arc::clone(config),
                    Arc::clone(state),
                    Arc::clone(stop),
                    token.to_owned(),
                );
                thread::spawn(move || serve(stream, config, &state, &stop, &token));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                eprintln!("stand-in API server: accept: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Serves one request on `tcp` (TLS), bounded by socket timeouts.
fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    state: &Mutex<State>,
    stop: &AtomicBool,
    token: &str,
) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(10)));
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // The request head (the clients send no body with GET).
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (method, path, auth) = loop {
        if buf.len() > 64 * 1024 {
            return;
        }
        match tls.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let auth = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned());
                break (
                    req.method.unwrap_or_default().to_owned(),
                    req.path.unwrap_or_default().to_owned(),
                    auth,
                );
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return,
        }
    };
    let delay = lock(state).delay;
    let until = Instant::now() + delay;
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20));
    }
    let (code, body) = answer(state, &method, &path, auth.as_deref(), token);
    lock(state)
        .requests
        .push(format!("{method} {path} -> {code}"));
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = tls.write_all(head.as_bytes());
    let _ = tls.write_all(body.as_bytes());
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// The status code and JSON body the API server would give.
fn answer(
    state: &Mutex<State>,
    method: &str,
    path: &str,
    auth: Option<&str>,
    token: &str,
) -> (u16, Value) {
    if auth != Some(format!("Bearer {token}").as_str()) {
        return (401, status(401, "Unauthorized", "Unauthorized", None));
    }
    let path = path.split('?').next().unwrap_or(path);
    let s = lock(state);
    let name = path
        .strip_prefix("/api/v1/nodes/")
        .filter(|n| !n.is_empty() && !n.contains('/'));
    let list = path == "/api/v1/nodes";
    if method != "GET" {
        return (
            405,
            status(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                None,
            ),
        );
    }
    if s.forbidden && (list || name.is_some()) {
        let (verb, obj) = match name {
            Some(n) => ("get", format!("nodes {n:?}")),
            None => ("list", "nodes".to_owned()),
        };
        let message = format!(
            "{obj} is forbidden: User \"{SERVICE_ACCOUNT}\" cannot {verb} resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let details = match name {
            Some(n) => json!({"name": n, "kind": "nodes"}),
            None => json!({"kind": "nodes"}),
        };
        return (403, status(403, "Forbidden", &message, Some(details)));
    }
    if let Some(n) = name {
        return match s.nodes.get(n) {
            Some(node) => (200, node.clone()),
            None => (
                404,
                status(
                    404,
                    "NotFound",
                    &format!("nodes {n:?} not found"),
                    Some(json!({"name": n, "kind": "nodes"})),
                ),
            ),
        };
    }
    if list {
        let items: Vec<Value> = s
            .nodes
            .values()
            .map(|n| {
                let mut n = n.clone();
                if let Some(o) = n.as_object_mut() {
                    // Items of a list carry no kind/apiVersion of their own.
                    o.remove("kind");
                    o.remove("apiVersion");
                }
                n
            })
            .collect();
        return (
            200,
            json!({
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": s.resource_version.to_string()},
                "items": items
            }),
        );
    }
    (
        404,
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        ),
    )
}
