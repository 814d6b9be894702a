//! A stand-in Kubernetes API server, for the tests of `install`'s Node lookup, of the
//! host-gw routes and of clients that list and watch (no real API server can run on these
//! machines).
//!
//! It is the one thing in these tests that is not the real component, so it copies what
//! the client sees of the real one:
//! - HTTPS only (rustls, HTTP/1.1), with a certificate for the address it listens on,
//!   signed by a CA generated per server (rcgen); the CA is written as the
//!   ServiceAccount's `ca.crt`;
//! - `Authorization: Bearer <token>` checked against the ServiceAccount `token` it wrote
//!   (401 `Unauthorized` Status otherwise, as the API server answers a bad token);
//!   [`ApiServer::rotate_token`] writes a new one over it and accepts only that, as a
//!   projected token's rotation and the old one's expiry look to a client;
//! - a store of objects keyed by resource, namespace and name, with one global
//!   resourceVersion counter as etcd has it (every create, update and delete bumps it;
//!   objects carry `metadata.resourceVersion`, and a `uid` and `creationTimestamp` from
//!   their creation). Resources: `nodes`, `namespaces` (cluster-scoped), `pods`,
//!   `services`, `events` (core v1), `networkpolicies` (networking.k8s.io/v1),
//!   `endpointslices` (discovery.k8s.io/v1), `events` (events.k8s.io/v1, the same
//!   store as the core ones) and, once its CRD is installed
//!   ([`ApiServer::install_crd`]; before that, a 404 as for any resource the server does
//!   not serve), `clusternetworkpolicies` (policy.networking.k8s.io/v1alpha2), and the
//!   `customresourcedefinitions` (apiextensions.k8s.io/v1) installed;
//! - `GET` of one object (`…/{name}`), or a 404 Status shaped like the API server's
//!   (`nodes "x" not found`, reason `NotFound`, details);
//! - lists (`GET` of a collection, all namespaces or one): `<Kind>List` with
//!   `metadata.resourceVersion`; pages (`limit`, an opaque `continue` token served from a
//!   consistent snapshot, 410 `Expired` once compacted or if not one of ours);
//!   `resourceVersion` (+ `resourceVersionMatch`); `labelSelector` (`k=v`, `k==v`,
//!   `k!=v`, `k`, `!k`) and `fieldSelector` (`=`, `==`, `!=` on `metadata.name`,
//!   `metadata.namespace` and the fields the real server supports per resource, e.g. a
//!   pod's `spec.nodeName`; another field is a 400 `field label not supported`); a list
//!   from the watch cache (`resourceVersion=0`) ignores `limit`, as the API server's does;
//! - watches (`watch=true`): a chunked stream of `{"type":…,"object":…}` lines: every
//!   change after the `resourceVersion` asked for (synthetic `ADDED` events of the current
//!   objects for `0`, unset, or `sendInitialEvents=true` — closed by the
//!   `k8s.io/initial-events-end` bookmark), then each new change as it happens, filtered
//!   by namespace and selectors (an object leaving a selector is `DELETED`, one entering
//!   it `ADDED`); `BOOKMARK`s after every second of silence when `allowWatchBookmarks`;
//!   the stream ends after `timeoutSeconds` (1800 when not given). A watch from a version
//!   older than the history kept is a 200 stream with one `ERROR` event (410 `Expired`,
//!   `too old resource version: X (Y)`), as the real server's watch cache answers;
//! - `POST` (create: 201, 409 `AlreadyExists`, `generateName`), merge `PATCH` and
//!   `DELETE` of one object, for every resource (the events a client records go through
//!   here: [`ApiServer::events`]);
//! - `TokenReview` (authentication.k8s.io/v1) and `SubjectAccessReview`
//!   (authorization.k8s.io/v1) for a server that checks its own clients (the agent's
//!   flows endpoint): a token [`ApiServer::add_user`] registered names its user, any
//!   other is unauthenticated; a user's `get` of a non-resource path is allowed once
//!   [`ApiServer::grant`] granted it (as a ClusterRole with `nonResourceURLs` and its
//!   binding would), and nothing else is;
//! - [`ApiServer::forbid`]: every request answered 403 with the API server's RBAC message
//!   (`User "system:serviceaccount:…" cannot list resource "pods" …`);
//! - [`ApiServer::set_delay`]: answers held back (for the clients' time limits);
//!   [`ApiServer::fail_next`]: requests answered 429 (with `retryAfterSeconds`), 500 or
//!   503; [`ApiServer::freeze_watches`]: open watches silent for good, their connections
//!   kept; [`ApiServer::set_streaming_lists`]: `sendInitialEvents` refused with the 422 of
//!   a server without the WatchList feature;
//! - faults of a real cluster: [`ApiServer::compact`] (etcd compaction: old versions are
//!   gone), [`ApiServer::drop_watches`] (every watch connection cut, as a dropped
//!   connection looks), [`ApiServer::restart`] (connections cut and refused for a while,
//!   the store kept).
//!
//! It listens inside a network namespace the test created (the socket is made by a thread
//! that entered it), so nothing is bound in the machine's own namespace. Each connection
//! is served on its own thread; answers other than watches close the connection
//! (`Connection: close`), a watch that ended by its timeout keeps it for the next request.
//! Requests are logged ([`ApiServer::requests`]). Dropping the server stops the accept
//! loop and ends every connection (each polls for it every 100 ms); the service-account
//! directory is a temporary directory removed with it.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    ops::Bound,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};

use crate::net::in_netns;

/// The ServiceAccount the stand-in says the token belongs to (in RBAC messages).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:cni-ebpf";

/// Changes kept for watches and continued lists; older ones are compacted away (etcd
/// keeps about five minutes: a burst of ten thousand deletions is well within it).
const HISTORY: usize = 32_768;
/// How often every connection looks at the stop flag and the fault switches.
const POLL: Duration = Duration::from_millis(100);
/// Silence after which a watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// A watch's length when the client gives no `timeoutSeconds`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// Time limit of one write to a client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a new connection has to send its first request.
const FIRST_REQUEST: Duration = Duration::from_secs(10);
/// Time a kept connection may stay idle (above hyper's 90 s pool timeout).
const IDLE: Duration = Duration::from_secs(120);
/// The largest request body read.
const MAX_BODY: usize = 16 << 20;

/// A resource the stand-in serves, at one API group version.
#[derive(Debug)]
struct Resource {
    /// The plural name, also the key of its objects in the store.
    plural: &'static str,
    kind: &'static str,
    group: &'static str,
    api_version: &'static str,
    /// The path of the group version (`/api/v1`, `/apis/<group>/<version>`).
    prefix: &'static str,
    namespaced: bool,
    /// The field selectors supported beyond `metadata.name` and `metadata.namespace`.
    fields: &'static [&'static str],
    /// A custom resource: served only once its CRD is installed.
    crd: bool,
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Boolean fields that read `false` when absent.
const BOOL_FIELDS: &[&str] = &["spec.hostNetwork", "spec.unschedulable"];

const RESOURCES: &[Resource] = &[
    Resource {
        plural: "nodes",
        kind: "Node",
        group: "",
        api_version: "v1",
        prefix: "/api/v1",
        namespaced: false,
        fields: &["spec.unschedulable"],
        crd: false,
    },
    Resource {
        plural: "namespaces",
        kind: "Namespace",
        group: "",
        api_version: "v1",
        prefix: "/api/v1",
        namespaced: false,
        fields: &["status.phase"],
        crd: false,
    },
    Resource {
        plural: "pods",
        kind: "Pod",
        group: "",
        api_version: "v1",
        prefix: "/api/v1",
        namespaced: true,
        fields: POD_FIELDS,
        crd: false,
    },
    Resource {
        plural: "services",
        kind: "Service",
        group: "",
        api_version: "v1",
        prefix: "/api/v1",
        namespaced: true,
        fields: &["spec.clusterIP", "spec.type"],
        crd: false,
    },
    Resource {
        plural: "events",
        kind: "Event",
        group: "",
        api_version: "v1",
        prefix: "/api/v1",
        namespaced: true,
        fields: EVENT_FIELDS,
        crd: false,
    },
    Resource {
        plural: "networkpolicies",
        kind: "NetworkPolicy",
        group: "networking.k8s.io",
        api_version: "networking.k8s.io/v1",
        prefix: "/apis/networking.k8s.io/v1",
        namespaced: true,
        fields: &[],
        crd: false,
    },
    Resource {
        plural: "endpointslices",
        kind: "EndpointSlice",
        group: "discovery.k8s.io",
        api_version: "discovery.k8s.io/v1",
        prefix: "/apis/discovery.k8s.io/v1",
        namespaced: true,
        fields: &[],
        crd: false,
    },
    Resource {
        plural: "events",
        kind: "Event",
        group: "events.k8s.io",
        api_version: "events.k8s.io/v1",
        prefix: "/apis/events.k8s.io/v1",
        namespaced: true,
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        crd: false,
    },
    Resource {
        plural: "clusternetworkpolicies",
        kind: "ClusterNetworkPolicy",
        group: "policy.networking.k8s.io",
        api_version: "policy.networking.k8s.io/v1alpha2",
        prefix: "/apis/policy.networking.k8s.io/v1alpha2",
        namespaced: false,
        fields: &[],
        crd: true,
    },
    Resource {
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        group: "apiextensions.k8s.io",
        api_version: "apiextensions.k8s.io/v1",
        prefix: "/apis/apiextensions.k8s.io/v1",
        namespaced: false,
        fields: &[],
        crd: false,
    },
];

impl Resource {
    /// The resource for the test controls (the first one of that plural name).
    #[track_caller]
    fn named(plural: &str) -> &'static Self {
        RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("the stand-in API server has no resource {plural:?}"))
    }

    /// `pods`, `networkpolicies.networking.k8s.io`: the name in error messages.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The `details` of a Status about this resource (and an object of it).
    fn details(&self, name: Option<&str>) -> Value {
        let mut d = serde_json::Map::new();
        if let Some(n) = name {
            d.insert("name".into(), json!(n));
        }
        if !self.group.is_empty() {
            d.insert("group".into(), json!(self.group));
        }
        d.insert("kind".into(), json!(self.plural));
        Value::Object(d)
    }

    /// `obj` as this group version serves it (with its kind and apiVersion).
    fn typed(&self, mut obj: Value) -> Value {
        if let Some(o) = obj.as_object_mut() {
            o.insert("kind".into(), json!(self.kind));
            o.insert("apiVersion".into(), json!(self.api_version));
        }
        obj
    }
}

/// The store key of an object: `namespace/name`, or `name` when cluster-scoped (the key
/// order of etcd, hence of lists).
fn object_key(res: &Resource, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if res.namespaced => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One change of the store, as etcd's history has it.
#[derive(Debug)]
struct Change {
    rv: u64,
    resource: &'static str,
    key: String,
    kind: ChangeType,
    /// The object after the change (for a delete: the last one, at the delete's version).
    object: Value,
    /// The object before the change.
    prev: Option<Value>,
}

#[derive(Debug, Default)]
struct State {
    /// Per resource, the objects by key.
    objects: BTreeMap<&'static str, BTreeMap<String, Value>>,
    resource_version: u64,
    /// The changes after `compacted`, oldest first.
    history: VecDeque<Change>,
    compacted: u64,
    /// Keys of the events created, in order.
    event_keys: Vec<String>,
    forbidden: bool,
    delay: Duration,
    requests: Vec<String>,
    /// Bumped by [`ApiServer::drop_watches`] (and restarts): watches of an older one end.
    watch_epoch: u64,
    /// Bumped by [`ApiServer::restart`]: connections of an older one end.
    restart_epoch: u64,
    /// Until when new connections are refused.
    down_until: Option<Instant>,
    /// The next requests answered with this status instead ([`ApiServer::fail_next`]).
    failing: Option<(u16, usize)>,
    /// Bumped by [`ApiServer::freeze_watches`]: watches of an older one fall silent.
    freeze_epoch: u64,
    /// Watches refuse `sendInitialEvents` (a server without streaming lists).
    no_streaming_lists: bool,
    /// The custom resources whose CRD is installed, by plural name.
    crds: BTreeSet<&'static str>,
    /// Tokens `TokenReview` authenticates, and the user each names.
    users: BTreeMap<String, String>,
    /// What `SubjectAccessReview` allows: (user, verb, non-resource path).
    grants: BTreeSet<(String, String, String)>,
}

/// What the accept loop, the connections and the test's handle share.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// The ServiceAccount token requests must carry (the latest one written).
    token: Mutex<String>,
    /// Signalled on every change of the store and every fault switched on.
    changed: Condvar,
    stop: AtomicBool,
    connections: AtomicUsize,
    watches: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Counts one of `counter` while alive.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }

    /// Takes over one counted already.
    fn adopt(counter: &'a AtomicUsize) -> Self {
        Self(counter)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running stand-in API server (see the module documentation).
#[derive(Debug)]
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    sa_dir: tempfile::TempDir,
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
    let ca = crate::tls::Authority::new("stand-in kubernetes CA");
    let server = ca.issue(
        "kube-apiserver",
        &["kubernetes", "kubernetes.default.svc"],
        &[ip],
    );
    (ca.ca_pem(), server.cert_der, server.key_der)
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

/// A uid as the API server makes them (a random UUID).
fn random_uid() -> String {
    format!(
        "{}-{}-{}-{}-{}",
        random_hex(4),
        random_hex(2),
        random_hex(2),
        random_hex(2),
        random_hex(6)
    )
}

/// The 5 characters `generateName` gets (the API server's alphabet: no vowels, no
/// look-alikes).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut buf = [0u8; 5];
    if let Err(e) = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)) {
        panic!("reading /dev/urandom: {e}");
    }
    buf.iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// Now, as RFC 3339 in UTC with seconds (`metadata.creationTimestamp`).
fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Fills in what the server sets on an object it stores: name, namespace, version, and
/// (kept from `prev`, or new) uid and creation time; kind and apiVersion if missing.
fn prepare(
    obj: &mut Value,
    res: &Resource,
    namespace: Option<&str>,
    name: &str,
    prev: Option<&Value>,
    rv: u64,
) {
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    o.entry("kind").or_insert_with(|| json!(res.kind));
    o.entry("apiVersion")
        .or_insert_with(|| json!(res.api_version));
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    let Some(m) = meta.as_object_mut() else {
        return;
    };
    m.insert("name".into(), json!(name));
    match namespace {
        Some(ns) if res.namespaced => {
            m.insert("namespace".into(), json!(ns));
        }
        _ => {
            m.remove("namespace");
        }
    }
    m.insert("resourceVersion".into(), json!(rv.to_string()));
    for (field, fresh) in [
        ("uid", random_uid as fn() -> String),
        ("creationTimestamp", now_rfc3339),
    ] {
        if m.get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            let old = prev
                .and_then(|p| p["metadata"][field].as_str())
                .map_or_else(fresh, str::to_owned);
            m.insert(field.into(), json!(old));
        }
    }
}

impl State {
    /// Creates, replaces (`Some`) or deletes (`None`) an object, bumping the version and
    /// recording the change. The object stored (or deleted), `None` if there was nothing
    /// to delete.
    fn write(
        &mut self,
        res: &'static Resource,
        namespace: Option<&str>,
        name: &str,
        new: Option<Value>,
    ) -> Option<Value> {
        let key = object_key(res, namespace, name);
        let map = self.objects.entry(res.plural).or_default();
        let prev = map.get(&key).cloned();
        let (kind, object) = match new {
            Some(mut obj) => {
                self.resource_version += 1;
                prepare(
                    &mut obj,
                    res,
                    namespace,
                    name,
                    prev.as_ref(),
                    self.resource_version,
                );
                map.insert(key.clone(), obj.clone());
                let kind = if prev.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                };
                (kind, obj)
            }
            None => {
                let mut obj = prev.clone()?;
                self.resource_version += 1;
                map.remove(&key);
                obj["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
                (ChangeType::Deleted, obj)
            }
        };
        if res.plural == "events" && kind == ChangeType::Added {
            self.event_keys.push(key.clone());
        }
        self.history.push_back(Change {
            rv: self.resource_version,
            resource: res.plural,
            key,
            kind,
            object: object.clone(),
            prev,
        });
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        Some(object)
    }

    /// The objects of `plural` as they were at version `at` (which must not be older than
    /// the compaction point): the current ones with the later changes undone.
    fn snapshot(&self, plural: &str, at: u64) -> BTreeMap<String, Value> {
        let mut map = self.objects.get(plural).cloned().unwrap_or_default();
        for c in self.history.iter().rev().take_while(|c| c.rv > at) {
            if c.resource != plural {
                continue;
            }
            match &c.prev {
                Some(p) => map.insert(c.key.clone(), p.clone()),
                None => map.remove(&c.key),
            };
        }
        map
    }
}

/// One requirement of a label or field selector.
#[derive(Debug, Clone)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

impl Requirement {
    fn matches(&self, value: impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Self::Equals(k, v) => value(k).as_deref() == Some(v.as_str()),
            Self::NotEquals(k, v) => value(k).as_deref() != Some(v.as_str()),
            Self::Exists(k) => value(k).is_some(),
            Self::Absent(k) => value(k).is_none(),
        }
    }
}

/// A request's namespace, label and field selectors.
#[derive(Debug, Clone, Default)]
struct Selector {
    namespace: Option<String>,
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

/// A label key (`[prefix/]name`) or a field path.
fn valid_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// Splits `k=v`, `k==v` or `k!=v`; a label's value is a label value (`[-_.A-Za-z0-9]`), a
/// field's any text without blanks (an IPv6 `status.podIP`).
fn split_requirement(term: &str, label: bool) -> Option<Requirement> {
    let valid_value = |s: &str| {
        s.chars().all(|c| {
            if label {
                c.is_ascii_alphanumeric() || "-_.".contains(c)
            } else {
                !c.is_whitespace()
            }
        })
    };
    let (k, v, eq) = if let Some((k, v)) = term.split_once("!=") {
        (k, v, false)
    } else if let Some((k, v)) = term.split_once("==") {
        (k, v, true)
    } else if let Some((k, v)) = term.split_once('=') {
        (k, v, true)
    } else {
        return None;
    };
    let (k, v) = (k.trim(), v.trim());
    if !valid_key(k) || !valid_value(v) {
        return None;
    }
    Some(if eq {
        Requirement::Equals(k.to_owned(), v.to_owned())
    } else {
        Requirement::NotEquals(k.to_owned(), v.to_owned())
    })
}

impl Selector {
    /// Parses the selectors of a request: the 400 message if one is not supported.
    fn parse(
        res: &Resource,
        namespace: Option<&str>,
        labels: &str,
        fields: &str,
    ) -> Result<Self, String> {
        let mut sel = Self {
            namespace: namespace.map(str::to_owned),
            ..Self::default()
        };
        for term in labels.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let unparsable = || format!("unable to parse requirement: {term:?}");
            if term.contains('(') || term.contains(')') {
                return Err(format!(
                    "{}: set-based requirements are not supported by the stand-in",
                    unparsable()
                ));
            }
            let req = if term.contains('=') {
                split_requirement(term, true).ok_or_else(unparsable)?
            } else if let Some(k) = term.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(unparsable());
                }
                Requirement::Absent(k.to_owned())
            } else if valid_key(term) {
                Requirement::Exists(term.to_owned())
            } else {
                return Err(unparsable());
            };
            sel.labels.push(req);
        }
        for term in fields.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let Some(req) = split_requirement(term, false) else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let (Requirement::Equals(k, _) | Requirement::NotEquals(k, _)) = &req else {
                return Err(format!("invalid selector: '{term}'"));
            };
            if !matches!(k.as_str(), "metadata.name" | "metadata.namespace")
                && !res.fields.contains(&k.as_str())
            {
                return Err(format!("field label not supported: {k}"));
            }
            sel.fields.push(req);
        }
        Ok(sel)
    }

    fn has_selectors(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    /// Whether `obj` (stored under `key`) is one the request asked for.
    fn matches(&self, key: &str, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if !key
                .strip_prefix(ns.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
            {
                return false;
            }
        }
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels[k].as_str().map(str::to_owned);
        let field = |path: &str| {
            let mut v = obj;
            for part in path.split('.') {
                v = &v[part];
            }
            Some(match v {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ if BOOL_FIELDS.contains(&path) => "false".to_owned(),
                _ => String::new(),
            })
        };
        self.labels.iter().all(|r| r.matches(label)) && self.fields.iter().all(|r| r.matches(field))
    }
}

/// `%xx` and `+` decoded (a query's keys and values).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request's query parameters.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Self {
        Self(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    /// The last value of `name`, `""` if absent.
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// A boolean parameter as Go's `strconv.ParseBool` reads it.
    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), "1" | "t" | "T" | "true" | "TRUE" | "True")
    }
}

/// A continue token as the API server makes them: base64url of
/// `{"v":"meta.k8s.io/v1","rv":<list version>,"start":"<next key>"}`.
fn encode_continue(rv: u64, start: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start});
    data_encoding::BASE64URL_NOPAD.encode(token.to_string().as_bytes())
}

/// The list version and start key of a continue token.
fn decode_continue(token: &str) -> Option<(u64, String)> {
    let raw = data_encoding::BASE64URL_NOPAD
        .decode(token.trim_end_matches('=').as_bytes())
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v["v"] != "meta.k8s.io/v1" {
        return None;
    }
    Some((v["rv"].as_u64()?, v["start"].as_str()?.to_owned()))
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
        let shared = Arc::new(Shared {
            token: Mutex::new(token),
            ..Shared::default()
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || accept_loop(&listener, &config, &shared))
        };
        Self {
            addr,
            shared,
            accept: Some(accept),
            sa_dir,
        }
    }

    /// The argv of the plugin binary `bin` running `args` (a subcommand and its own flags:
    /// `agent …`) against this server: its URL, ServiceAccount directory and a 5 s API
    /// timeout, with `pin_root` as the bpffs root, and (unless `args` name one) flows
    /// served on a free port of the loopback, so that agents of one namespace never
    /// contend for a port (the address is in the agent's log).
    #[must_use]
    pub fn agent_argv(&self, bin: &Path, pin_root: &Path, args: &[&str]) -> Vec<String> {
        let mut argv = vec![bin.display().to_string()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        if args.first() == Some(&"agent") && !args.iter().any(|a| a.starts_with("--flows-listen")) {
            argv.extend(["--flows-listen".to_owned(), "127.0.0.1:0".to_owned()]);
        }
        argv.extend([
            "--bpffs-root".to_owned(),
            pin_root.display().to_string(),
            "--api-server".to_owned(),
            self.url(),
            "--service-account-dir".to_owned(),
            self.sa_dir().display().to_string(),
            "--api-timeout".to_owned(),
            "5".to_owned(),
            // The node's CNI configurations the agent compares its settings with: none of
            // the machine's (a directory of the server's that holds no conflist).
            "--cni-conf-dir".to_owned(),
            self.sa_dir().display().to_string(),
        ]);
        argv
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
    pub fn token(&self) -> String {
        self.shared
            .token
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// Rotates the ServiceAccount token as the kubelet does: a new one is written over
    /// the `token` file (aside, then renamed), and from now on only it is accepted.
    pub fn rotate_token(&self) {
        let token = random_hex(24);
        let (path, tmp) = (
            self.sa_dir().join("token"),
            self.sa_dir().join(".token.new"),
        );
        std::fs::write(&tmp, &token)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .unwrap_or_else(|e| panic!("rotating the token: {e}"));
        if let Ok(mut t) = self.shared.token.lock() {
            *t = token;
        }
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
    pub fn put_node(&self, node: Value) {
        if node["metadata"]["name"].as_str().is_none() {
            panic!("a Node without metadata.name: {node}");
        }
        self.put("nodes", node);
    }

    /// Deletes a Node.
    pub fn remove_node(&self, name: &str) {
        self.delete("nodes", None, name);
    }

    /// Creates or replaces (by namespace and name) an object of `resource` (a plural name:
    /// `nodes`, `namespaces`, `pods`, `services`, `networkpolicies`, `endpointslices`,
    /// `events`), as given; the server sets `metadata.resourceVersion` (bumped), and a
    /// `uid` and `creationTimestamp` if missing (those of the object replaced, if any), and
    /// `kind`/`apiVersion` if missing. A namespaced object without a namespace goes to
    /// `default`. Watches see it `ADDED` or `MODIFIED`.
    #[track_caller]
    pub fn put(&self, resource: &str, obj: Value) {
        let res = Resource::named(resource);
        let Some(name) = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty() && !n.contains('/'))
            .map(str::to_owned)
        else {
            panic!("a {} without a valid metadata.name: {obj}", res.kind);
        };
        let namespace = obj["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
            .unwrap_or("default")
            .to_owned();
        if namespace.contains('/') {
            panic!("a {} in namespace {namespace:?}", res.kind);
        }
        let mut s = self.shared.lock();
        s.write(res, Some(&namespace), &name, Some(obj));
        self.shared.changed.notify_all();
    }

    /// Deletes an object (`namespace` `None` for cluster-scoped resources); watches see it
    /// `DELETED` (the last object, at the delete's version). Nothing if there is none.
    #[track_caller]
    pub fn delete(&self, resource: &str, namespace: Option<&str>, name: &str) {
        let res = Resource::named(resource);
        let mut s = self.shared.lock();
        s.write(res, namespace, name, None);
        self.shared.changed.notify_all();
    }

    /// The object stored, with its `kind` and `apiVersion`.
    #[track_caller]
    #[must_use]
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let res = Resource::named(resource);
        let s = self.shared.lock();
        s.objects
            .get(res.plural)?
            .get(&object_key(res, namespace, name))
            .cloned()
    }

    /// Every object of `resource` (in `namespace`, or all), in key order.
    #[track_caller]
    #[must_use]
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let res = Resource::named(resource);
        let sel = Selector {
            namespace: namespace.filter(|_| res.namespaced).map(str::to_owned),
            ..Selector::default()
        };
        let s = self.shared.lock();
        s.objects
            .get(res.plural)
            .into_iter()
            .flatten()
            .filter(|(k, o)| sel.matches(k, o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The store's current resourceVersion (0 before the first write).
    #[must_use]
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version
    }

    /// The events created through the API (`POST …/events`, either group), as stored now,
    /// in the order they were created.
    #[must_use]
    pub fn events(&self) -> Vec<Value> {
        let s = self.shared.lock();
        let mut seen = BTreeSet::new();
        let Some(events) = s.objects.get("events") else {
            return Vec::new();
        };
        s.event_keys
            .iter()
            .filter(|k| seen.insert(k.as_str()))
            .filter_map(|k| events.get(k).cloned())
            .collect()
    }

    /// Compacts the history up to the current version, as etcd's compaction does: a
    /// watch or a continued list from an older version is then 410 `Expired`.
    pub fn compact(&self) {
        let mut s = self.shared.lock();
        s.compacted = s.resource_version;
        s.history.clear();
        self.shared.changed.notify_all();
    }

    /// Cuts every open watch stream mid-stream (the TCP connection closed, no final chunk,
    /// no TLS close_notify), as a dropped connection looks to the client.
    pub fn drop_watches(&self) {
        let mut s = self.shared.lock();
        s.watch_epoch += 1;
        self.shared.changed.notify_all();
    }

    /// An API server restart: every open connection cut (watches mid-stream), every new one
    /// refused (reset right after accept) for `downtime`, the store kept as etcd keeps it.
    /// Returns once the open watches are gone (at most a second).
    pub fn restart(&self, downtime: Duration) {
        {
            let mut s = self.shared.lock();
            s.watch_epoch += 1;
            s.restart_epoch += 1;
            s.down_until = Some(Instant::now() + downtime);
            self.shared.changed.notify_all();
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.watch_count() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The watch streams open now.
    #[must_use]
    pub fn watch_count(&self) -> usize {
        self.shared.watches.load(Ordering::SeqCst)
    }

    /// A token `TokenReview` authenticates as `user`.
    pub fn add_user(&self, token: &str, user: &str) {
        self.shared
            .lock()
            .users
            .insert(token.to_owned(), user.to_owned());
    }

    /// Lets `user` `verb` the non-resource URL `path` (what `SubjectAccessReview` answers).
    pub fn grant(&self, user: &str, verb: &str, path: &str) {
        self.shared
            .lock()
            .grants
            .insert((user.to_owned(), verb.to_owned(), path.to_owned()));
    }

    /// Answers every request 403 (RBAC denies the ServiceAccount) while `on`.
    pub fn forbid(&self, on: bool) {
        self.shared.lock().forbidden = on;
    }

    /// Answers the next `count` requests (of any client, any verb) with `code` instead:
    /// 429 `TooManyRequests` (with `retryAfterSeconds`), 503, or 500 `InternalError`.
    pub fn fail_next(&self, code: u16, count: usize) {
        self.shared.lock().failing = (count > 0).then_some((code, count));
    }

    /// Every watch open now falls silent for good: no event, no bookmark, no end, the
    /// connection kept open (a peer that stopped answering without closing). New watches
    /// are served as usual.
    pub fn freeze_watches(&self) {
        let mut s = self.shared.lock();
        s.freeze_epoch += 1;
        self.shared.changed.notify_all();
    }

    /// Installs the CRD of custom resource `plural`: it is served from now on, and its
    /// CustomResourceDefinition object is created (as `kubectl apply` of the CRD does).
    #[track_caller]
    pub fn install_crd(&self, plural: &str) {
        let res = Resource::named(plural);
        assert!(res.crd, "{plural} is not a custom resource");
        self.shared.lock().crds.insert(res.plural);
        let version = res.api_version.rsplit('/').next().unwrap_or_default();
        self.put(
            "customresourcedefinitions",
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{}.{}", res.plural, res.group)},
                "spec": {
                    "group": res.group,
                    "names": {"plural": res.plural, "kind": res.kind},
                    "scope": if res.namespaced { "Namespaced" } else { "Cluster" },
                    "versions": [{"name": version, "served": true, "storage": true}],
                },
            }),
        );
    }

    /// Whether watches accept `sendInitialEvents` (streaming lists; on by default): off,
    /// they are refused with the API server's 422 for a server without the feature.
    pub fn set_streaming_lists(&self, on: bool) {
        self.shared.lock().no_streaming_lists = !on;
    }

    /// Holds every answer back by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.lock().delay = delay;
    }

    /// Requests served so far: `"<method> <path> -> <status>"` (the path without its
    /// query; `"GET <path>?watch -> <status>"` for a watch,
    /// `"GET <path>?watch&sendInitialEvents -> <status>"` for a streaming list), in order.
    #[must_use]
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // The connections see the flag within a poll (or a write's time limit).
        let deadline = Instant::now() + WRITE_TIMEOUT;
        while self.shared.connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
    }
}

fn accept_loop(listener: &TcpListener, config: &Arc<rustls::ServerConfig>, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let down = shared.lock().down_until;
                if down.is_some_and(|t| Instant::now() < t) {
                    // Restarting: the connection reset, as a port nobody listens on.
                    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                    drop(stream);
                    continue;
                }
                let (config, shared) = (Arc::clone(config), Arc::clone(shared));
                // Counted before the thread starts, so that a drop right now waits for it.
                shared.connections.fetch_add(1, Ordering::SeqCst);
                thread::spawn(move || {
                    let _live = Counted::adopt(&shared.connections);
                    serve(stream, config, &shared);
                });
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

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// A request as read from a connection.
#[derive(Debug)]
struct Request {
    method: String,
    /// The path, without the query.
    path: String,
    query: String,
    auth: Option<String>,
    content_type: String,
    body: Vec<u8>,
}

/// Whether a connection of `epoch` must end: the server stops, or restarted since.
fn ended(shared: &Shared, epoch: u64) -> bool {
    shared.stop.load(Ordering::SeqCst) || shared.lock().restart_epoch != epoch
}

/// Closes the TCP connection under the TLS session (no close_notify, no final chunk), as
/// a lost connection looks.
fn cut(tls: &Tls) {
    let _ = tls.sock.shutdown(Shutdown::Both);
}

/// Whether the client of a watch closed its side or sent something (its close_notify:
/// an HTTP/1.1 client sends nothing else while a response streams).
fn client_gone(sock: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: recv(2) peeks at most one byte into a local buffer, without blocking, on a
    // descriptor the stream owns and keeps open for the call.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        );
    }
    true
}

/// The head of the request at the start of `buf` if complete: the request (without its
/// body) and the lengths of head and body; `Err` for a request not to be served.
fn parse_head(buf: &[u8]) -> Result<Option<(Request, usize, usize)>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() <= 64 * 1024 => return Ok(None),
        Ok(httparse::Status::Partial) | Err(_) => return Err(()),
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_owned())
    };
    // Chunked request bodies: no client of the stand-in sends them.
    if header("transfer-encoding").is_some() {
        return Err(());
    }
    let body_len = match header("content-length") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= MAX_BODY)
            .ok_or(())?,
        None => 0,
    };
    let target = req.path.unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let request = Request {
        method: req.method.unwrap_or_default().to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
        auth: header("authorization"),
        content_type: header("content-type").unwrap_or_default(),
        body: Vec::new(),
    };
    Ok(Some((request, head_len, body_len)))
}

/// Reads the next request (head and body) within `limit`; `None` if the client closes,
/// errs or is too slow, or the connection must end.
fn read_request(
    tls: &mut Tls,
    buf: &mut Vec<u8>,
    shared: &Shared,
    epoch: u64,
    limit: Duration,
) -> Option<Request> {
    let deadline = Instant::now() + limit;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if !buf.is_empty() {
            if let Some((mut req, head, body)) = parse_head(buf).ok()? {
                if buf.len() >= head + body {
                    req.body = buf[head..head + body].to_vec();
                    buf.drain(..head + body);
                    return Some(req);
                }
            }
        }
        match tls.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= deadline || ended(shared, epoch) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

/// Serves the requests of one connection (TLS): answers end it, a watch that ends by its
/// timeout keeps it for the next request. Bounded by socket timeouts, polling for the
/// server's end and restarts.
fn serve(tcp: TcpStream, config: Arc<rustls::ServerConfig>, shared: &Shared) {
    let epoch = shared.lock().restart_epoch;
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(POLL));
    let _ = tcp.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    let mut limit = FIRST_REQUEST;
    loop {
        let Some(req) = read_request(&mut tls, &mut buf, shared, epoch, limit) else {
            cut(&tls);
            return;
        };
        limit = IDLE;
        let delay = shared.lock().delay;
        let until = Instant::now() + delay;
        while Instant::now() < until && !ended(shared, epoch) {
            thread::sleep(Duration::from_millis(20));
        }
        if ended(shared, epoch) {
            cut(&tls);
            return;
        }
        let query = Query::parse(&req.query);
        let logged = if req.method == "GET" && query.flag("watch") {
            if query.flag("sendInitialEvents") {
                format!("{}?watch&sendInitialEvents", req.path)
            } else {
                format!("{}?watch", req.path)
            }
        } else {
            req.path.clone()
        };
        let answer = answer(shared, &req, &query);
        let code = match &answer {
            Answer::Full(code, _) => *code,
            Answer::Watch(_) => 200,
        };
        shared
            .lock()
            .requests
            .push(format!("{} {logged} -> {code}", req.method));
        match answer {
            Answer::Full(code, body) => {
                respond(&mut tls, code, &body);
                return;
            }
            Answer::Watch(w) => {
                if !stream_watch(&mut tls, shared, epoch, *w) {
                    cut(&tls);
                    return;
                }
            }
        }
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Internal Server Error",
    }
}

/// Sends a whole answer and closes the connection (`Connection: close`, close_notify).
fn respond(tls: &mut Tls, code: u16, body: &Value) {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason_phrase(code),
        body.len()
    );
    let _ = tls.write_all(head.as_bytes());
    let _ = tls.write_all(body.as_bytes());
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// What a request gets.
#[derive(Debug)]
enum Answer {
    /// A status code and a JSON body.
    Full(u16, Value),
    /// A watch stream.
    Watch(Box<Watch>),
}

/// A watch about to stream.
#[derive(Debug)]
struct Watch {
    res: &'static Resource,
    selector: Selector,
    /// Changes after this version are sent.
    from: u64,
    /// Sent first as `ADDED` (the current objects, for a watch from `0` or unset), each
    /// event already a JSON line: rendered while the store is read, so a list of a large
    /// cluster is never a second copy of every object.
    initial: Vec<String>,
    /// A `k8s.io/initial-events-end` bookmark after them (`sendInitialEvents`).
    initial_end: bool,
    bookmarks: bool,
    timeout: Duration,
    /// A watch from a compacted version: this `ERROR` event, then the end.
    expired: Option<Value>,
    /// The [`State::watch_epoch`] it started in.
    watch_epoch: u64,
    /// The [`State::freeze_epoch`] it started in.
    freeze_epoch: u64,
}

/// The resource, namespace and name a path names.
#[derive(Debug)]
struct Route {
    res: &'static Resource,
    namespace: Option<String>,
    name: Option<String>,
}

fn route(path: &str) -> Option<Route> {
    RESOURCES.iter().find_map(|res| {
        let rest = path.strip_prefix(res.prefix)?.strip_prefix('/')?;
        let segs: Vec<&str> = rest.split('/').collect();
        let (namespace, name) = match segs.as_slice() {
            [p] if *p == res.plural => (None, None),
            [p, n] if *p == res.plural && !res.namespaced && !n.is_empty() => (None, Some(*n)),
            ["namespaces", ns, p] if *p == res.plural && res.namespaced && !ns.is_empty() => {
                (Some(*ns), None)
            }
            ["namespaces", ns, p, n]
                if *p == res.plural && res.namespaced && !ns.is_empty() && !n.is_empty() =>
            {
                (Some(*ns), Some(*n))
            }
            _ => return None,
        };
        Some(Route {
            res,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
        })
    })
}

fn bad_request(message: &str) -> Value {
    status(400, "BadRequest", message, None)
}

fn not_found(res: &Resource, name: &str) -> Value {
    status(
        404,
        "NotFound",
        &format!("{} {name:?} not found", res.qualified()),
        Some(res.details(Some(name))),
    )
}

fn invalid(res: &Resource, name: &str, field: &str, message: &str) -> Value {
    let mut details = res.details(Some(name));
    details["causes"] =
        json!([{"reason": "FieldValueRequired", "message": message, "field": field}]);
    status(
        422,
        "Invalid",
        &format!("{} {name:?} is invalid: {field}: {message}", res.kind),
        Some(details),
    )
}

/// A `TokenReview` or `SubjectAccessReview` (created, never stored: 201 with its
/// `status`), or `None` for any other request.
fn review(shared: &Shared, req: &Request) -> Option<Answer> {
    let kind = match req.path.as_str() {
        "/apis/authentication.k8s.io/v1/tokenreviews" => "TokenReview",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => "SubjectAccessReview",
        _ => return None,
    };
    if req.method != "POST" {
        return Some(Answer::Full(
            405,
            status(405, "MethodNotAllowed", "only create", None),
        ));
    }
    let Ok(mut obj) = serde_json::from_slice::<Value>(&req.body) else {
        return Some(Answer::Full(400, bad_request("the body is not JSON")));
    };
    let s = shared.lock();
    let spec = obj["spec"].clone();
    obj["status"] = if kind == "TokenReview" {
        match spec["token"].as_str().and_then(|t| s.users.get(t)) {
            Some(user) => {
                json!({"authenticated": true, "user": {"username": user, "groups": ["system:authenticated"]}})
            }
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        }
    } else {
        let user = spec["user"].as_str().unwrap_or_default().to_owned();
        let attrs = &spec["nonResourceAttributes"];
        let verb = attrs["verb"].as_str().unwrap_or_default().to_owned();
        let path = attrs["path"].as_str().unwrap_or_default().to_owned();
        let allowed = s.grants.contains(&(user, verb, path));
        json!({"allowed": allowed})
    };
    obj["apiVersion"] = json!(if kind == "TokenReview" {
        "authentication.k8s.io/v1"
    } else {
        "authorization.k8s.io/v1"
    });
    obj["kind"] = json!(kind);
    Some(Answer::Full(201, obj))
}

/// The answer the API server would give `req` (`query` parsed from it).
fn answer(shared: &Shared, req: &Request, query: &Query) -> Answer {
    use Answer::Full;
    let token = shared.token.lock().map(|t| t.clone()).unwrap_or_default();
    if req.auth.as_deref() != Some(format!("Bearer {token}").as_str()) {
        return Full(401, status(401, "Unauthorized", "Unauthorized", None));
    }
    if let Some(review) = review(shared, req) {
        return review;
    }
    let Some(route) =
        route(&req.path).filter(|r| !r.res.crd || shared.lock().crds.contains(r.res.plural))
    else {
        return Full(
            404,
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                Some(json!({})),
            ),
        );
    };
    let (res, ns, name) = (
        route.res,
        route.namespace.as_deref(),
        route.name.as_deref().unwrap_or_default(),
    );
    let verb = match (req.method.as_str(), route.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if query.flag("watch") => "watch",
        ("GET", false) => "list",
        ("POST", false) if ns.is_some() || !res.namespaced => "create",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        _ => {
            return Full(
                405,
                status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    None,
                ),
            )
        }
    };
    let mut s = shared.lock();
    if s.forbidden {
        let obj = match route.name.as_deref() {
            Some(n) => format!("{} {n:?}", res.qualified()),
            None => res.qualified(),
        };
        let scope = match ns {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_owned(),
        };
        let message = format!(
            "{obj} is forbidden: User \"{SERVICE_ACCOUNT}\" cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
            res.plural, res.group
        );
        let details = res.details(route.name.as_deref());
        return Full(403, status(403, "Forbidden", &message, Some(details)));
    }
    if let Some((code, left)) = s.failing {
        s.failing = (left > 1).then_some((code, left - 1));
        let (reason, message, details) = match code {
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
                Some(json!({"retryAfterSeconds": 1})),
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
                None,
            ),
            _ => (
                "InternalError",
                "Internal error occurred: injected by the test",
                None,
            ),
        };
        return Full(code, status(code, reason, message, details));
    }
    let (code, body) = match verb {
        "get" => match s
            .objects
            .get(res.plural)
            .and_then(|m| m.get(&object_key(res, ns, name)))
        {
            Some(o) => (200, res.typed(o.clone())),
            None => (404, not_found(res, name)),
        },
        "list" => list(&s, res, ns, query),
        "watch" => return watch(&s, res, ns, query),
        "create" => create(&mut s, res, ns, req),
        "patch" => patch(&mut s, res, ns, name, req),
        _ => match s.write(res, ns, name, None) {
            Some(o) => (200, res.typed(o)),
            None => (404, not_found(res, name)),
        },
    };
    if code < 300 && verb != "get" && verb != "list" {
        shared.changed.notify_all();
    }
    Full(code, body)
}

/// A list (one page of it).
fn list(s: &State, res: &'static Resource, ns: Option<&str>, q: &Query) -> (u16, Value) {
    let sel = match Selector::parse(res, ns, q.get("labelSelector"), q.get("fieldSelector")) {
        Ok(sel) => sel,
        Err(m) => return (400, bad_request(&m)),
    };
    let limit = match q.get("limit") {
        "" => 0,
        l => match l.parse::<usize>() {
            Ok(n) => n,
            Err(_) => return (400, bad_request(&format!("invalid limit: {l:?}"))),
        },
    };
    // A list from the watch cache (resourceVersion=0) cannot be paged there: the API
    // server ignores `limit` and answers every item at once (KEP-4988).
    let limit = if q.get("resourceVersion") == "0" && q.get("continue").is_empty() {
        0
    } else {
        limit
    };
    let current = s.resource_version;
    let (at, start) = match q.get("continue") {
        "" => match q.get("resourceVersion") {
            "" | "0" => (current, None),
            rv => {
                let Ok(n) = rv.parse::<u64>() else {
                    return (
                        400,
                        bad_request(&format!("invalid resource version: {rv:?}")),
                    );
                };
                if n > current {
                    let message = format!("Too large resource version: {n}, current: {current}");
                    let details = json!({
                        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                        "retryAfterSeconds": 1
                    });
                    return (504, status(504, "Timeout", &message, Some(details)));
                }
                let matching = q.get("resourceVersionMatch");
                let exact = matching == "Exact" || (matching.is_empty() && limit > 0);
                if !exact {
                    (current, None)
                } else if n < s.compacted {
                    let message = format!("too old resource version: {n} ({})", s.compacted);
                    return (410, status(410, "Expired", &message, None));
                } else {
                    (n, None)
                }
            }
        },
        token => match decode_continue(token) {
            Some((at, start)) if at >= s.compacted && at <= current => (at, Some(start)),
            _ => {
                let message = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.";
                return (410, status(410, "Expired", message, None));
            }
        },
    };
    let snapshot;
    let empty = BTreeMap::new();
    let objects = if at == current {
        s.objects.get(res.plural).unwrap_or(&empty)
    } else {
        snapshot = s.snapshot(res.plural, at);
        &snapshot
    };
    let lower = start.map_or(Bound::Unbounded, Bound::Included);
    let in_scope = |k: &str| {
        sel.namespace
            .as_deref()
            .is_none_or(|n| k.strip_prefix(n).is_some_and(|r| r.starts_with('/')))
    };
    let (mut items, mut last, mut remaining) = (Vec::new(), None, 0usize);
    for (k, o) in objects.range::<String, _>((lower, Bound::Unbounded)) {
        if !in_scope(k) {
            continue;
        }
        if limit > 0 && items.len() == limit {
            remaining += 1;
            continue;
        }
        if sel.matches(k, o) {
            let mut item = o.clone();
            if let Some(obj) = item.as_object_mut() {
                // Items of a list carry no kind/apiVersion of their own.
                obj.remove("kind");
                obj.remove("apiVersion");
            }
            items.push(item);
            last = Some(k.as_str());
        }
    }
    let mut meta = json!({"resourceVersion": at.to_string()});
    if remaining > 0 {
        if let Some(last) = last {
            meta["continue"] = json!(encode_continue(at, &format!("{last}\u{0}")));
            if !sel.has_selectors() {
                meta["remainingItemCount"] = json!(remaining);
            }
        }
    }
    (
        200,
        json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": items
        }),
    )
}

/// A watch's start (or its 400).
fn watch(s: &State, res: &'static Resource, ns: Option<&str>, q: &Query) -> Answer {
    let selector = match Selector::parse(res, ns, q.get("labelSelector"), q.get("fieldSelector")) {
        Ok(sel) => sel,
        Err(m) => return Answer::Full(400, bad_request(&m)),
    };
    let timeout = match q.get("timeoutSeconds") {
        "" | "0" => DEFAULT_WATCH_TIMEOUT,
        t => match t.parse::<u64>() {
            Ok(n) => Duration::from_secs(n),
            Err(_) => {
                return Answer::Full(400, bad_request(&format!("invalid timeoutSeconds: {t:?}")))
            }
        },
    };
    let initial_end = q.flag("sendInitialEvents");
    if initial_end && s.no_streaming_lists {
        // The API server's validation without the WatchList feature.
        let message = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        let details = json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": [{"reason": "FieldValueForbidden", "message": "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled", "field": "sendInitialEvents"}]});
        return Answer::Full(422, status(422, "Invalid", message, Some(details)));
    }
    let mut w = Watch {
        res,
        selector,
        from: s.resource_version,
        initial: Vec::new(),
        initial_end,
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout,
        expired: None,
        watch_epoch: s.watch_epoch,
        freeze_epoch: s.freeze_epoch,
    };
    match q.get("resourceVersion") {
        _ if initial_end => {}
        "" | "0" => {}
        rv => {
            let Ok(n) = rv.parse::<u64>() else {
                return Answer::Full(
                    400,
                    bad_request(&format!("invalid resource version: {rv:?}")),
                );
            };
            if n < s.compacted {
                let message = format!("too old resource version: {n} ({})", s.compacted);
                w.expired = Some(status(410, "Expired", &message, None));
            }
            w.from = n;
            return Answer::Watch(Box::new(w));
        }
    }
    w.initial = s
        .objects
        .get(res.plural)
        .into_iter()
        .flatten()
        .filter(|(k, o)| w.selector.matches(k, o))
        .map(|(_, o)| {
            // Stored objects carry their kind and apiVersion ([`prepare`]).
            if o.get("kind").is_some() && o.get("apiVersion").is_some() {
                format!("{{\"type\":\"ADDED\",\"object\":{o}}}\n")
            } else {
                format!(
                    "{}\n",
                    json!({"type": "ADDED", "object": res.typed(o.clone())})
                )
            }
        })
        .collect();
    Answer::Watch(Box::new(w))
}

/// `POST` of a new object.
fn create(s: &mut State, res: &'static Resource, ns: Option<&str>, req: &Request) -> (u16, Value) {
    let unknown = "the body of the request was in an unknown format - accepted media types include: application/json";
    let mut obj = match serde_json::from_slice::<Value>(&req.body) {
        Ok(v) if v.is_object() => v,
        _ => return (400, bad_request(unknown)),
    };
    let meta_ns = obj["metadata"]["namespace"]
        .as_str()
        .filter(|n| !n.is_empty());
    if res.namespaced && meta_ns.is_some_and(|m| Some(m) != ns) {
        return (
            400,
            bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ),
        );
    }
    let name = match (
        obj["metadata"]["name"].as_str().filter(|n| !n.is_empty()),
        obj["metadata"]["generateName"]
            .as_str()
            .filter(|n| !n.is_empty()),
    ) {
        (Some(n), _) => n.to_owned(),
        (None, Some(g)) => format!("{g}{}", random_suffix()),
        (None, None) => {
            let message = "name or generateName is required";
            return (422, invalid(res, "", "metadata.name", message));
        }
    };
    if name.contains('/') {
        let message = "may not contain '/'";
        return (422, invalid(res, &name, "metadata.name", message));
    }
    let key = object_key(res, ns, &name);
    if s.objects
        .get(res.plural)
        .is_some_and(|m| m.contains_key(&key))
    {
        let message = format!("{} {name:?} already exists", res.qualified());
        return (
            409,
            status(
                409,
                "AlreadyExists",
                &message,
                Some(res.details(Some(&name))),
            ),
        );
    }
    if let Some(m) = obj["metadata"].as_object_mut() {
        // The server's to set.
        for field in ["uid", "resourceVersion", "creationTimestamp"] {
            m.remove(field);
        }
    }
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), json!(res.kind));
        o.insert("apiVersion".into(), json!(res.api_version));
    }
    match s.write(res, ns, &name, Some(obj)) {
        Some(stored) => (201, res.typed(stored)),
        None => (500, status(500, "InternalError", "not stored", None)),
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `PATCH` of an object: merge patches (`application/merge-patch+json`; a strategic
/// merge patch is taken as one), with `metadata.resourceVersion` as a precondition.
fn patch(
    s: &mut State,
    res: &'static Resource,
    ns: Option<&str>,
    name: &str,
    req: &Request,
) -> (u16, Value) {
    let media = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if !matches!(
        media,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        let message = format!(
            "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (the stand-in's), not {media:?}"
        );
        return (415, status(415, "UnsupportedMediaType", &message, None));
    }
    let Ok(p) = serde_json::from_slice::<Value>(&req.body) else {
        return (400, bad_request("the body of the request is not JSON"));
    };
    let key = object_key(res, ns, name);
    let Some(mut obj) = s.objects.get(res.plural).and_then(|m| m.get(&key)).cloned() else {
        return (404, not_found(res, name));
    };
    if let Some(want) = p["metadata"]["resourceVersion"].as_str() {
        if Some(want) != obj["metadata"]["resourceVersion"].as_str() {
            let message = format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                res.qualified()
            );
            return (
                409,
                status(409, "Conflict", &message, Some(res.details(Some(name)))),
            );
        }
    }
    merge_patch(&mut obj, &p);
    match s.write(res, ns, name, Some(obj)) {
        Some(stored) => (200, res.typed(stored)),
        None => (500, status(500, "InternalError", "not stored", None)),
    }
}

/// A `BOOKMARK` event at `rv`.
fn bookmark(res: &Resource, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({
        "type": "BOOKMARK",
        "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}
    })
}

/// The events of the changes after `from` that a watch of `res` with `sel` sees: an
/// object that leaves the selection is `DELETED` (its previous state at the change's
/// version), one that enters it `ADDED`, as the API server's watch cache has it.
fn changes_since(s: &State, res: &Resource, sel: &Selector, from: u64, out: &mut Vec<Value>) {
    let first = s.history.partition_point(|c| c.rv <= from);
    for c in s.history.range(first..) {
        if c.resource != res.plural {
            continue;
        }
        let now_in = c.kind != ChangeType::Deleted && sel.matches(&c.key, &c.object);
        let was_in = c.prev.as_ref().is_some_and(|p| sel.matches(&c.key, p));
        let (kind, object) = match (was_in, now_in) {
            (true, true) => ("MODIFIED", c.object.clone()),
            (false, true) => ("ADDED", c.object.clone()),
            (true, false) if c.kind == ChangeType::Deleted => ("DELETED", c.object.clone()),
            (true, false) => {
                let mut old = c.prev.clone().unwrap_or_default();
                old["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                ("DELETED", old)
            }
            (false, false) => continue,
        };
        out.push(json!({"type": kind, "object": res.typed(object)}));
    }
}

/// Sends `events` as chunks of one JSON line each.
fn send(tls: &mut Tls, events: &[Value]) -> bool {
    let lines: Vec<String> = events.iter().map(|e| format!("{e}\n")).collect();
    send_lines(tls, &lines)
}

/// Sends `lines` (each a JSON event and its newline) as one chunk each.
fn send_lines(tls: &mut Tls, lines: &[String]) -> bool {
    let mut out = Vec::new();
    for line in lines {
        out.extend_from_slice(format!("{:x}\r\n", line.len()).as_bytes());
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    tls.write_all(&out).and_then(|()| tls.flush()).is_ok()
}

/// The final chunk: the stream ends as the API server ends it.
fn finish(tls: &mut Tls) -> bool {
    tls.write_all(b"0\r\n\r\n")
        .and_then(|()| tls.flush())
        .is_ok()
}

/// Streams a watch. `true` if it ended by itself (timeout, expired) with the final
/// chunk, the connection fit for the next request; `false` if it must be cut.
fn stream_watch(tls: &mut Tls, shared: &Shared, epoch: u64, w: Watch) -> bool {
    let _open = Counted::new(&shared.watches);
    let head = "HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    if tls
        .write_all(head.as_bytes())
        .and_then(|()| tls.flush())
        .is_err()
    {
        return false;
    }
    let res = w.res;
    let mut from = w.from;
    // In batches: a streaming list of a large cluster is one event per object.
    if w.initial.chunks(1000).any(|batch| !send_lines(tls, batch)) {
        return false;
    }
    let mut first: Vec<Value> = Vec::new();
    if w.initial_end {
        first.push(bookmark(res, from, true));
    }
    if let Some(err) = w.expired {
        first.push(json!({"type": "ERROR", "object": err}));
        return send(tls, &first) && finish(tls);
    }
    if !first.is_empty() && !send(tls, &first) {
        return false;
    }
    let deadline = Instant::now() + w.timeout;
    let mut last_sent = Instant::now();
    loop {
        let mut events = Vec::new();
        // Whether the stream ends after these events.
        let end = {
            let mut s = shared.lock();
            loop {
                if shared.stop.load(Ordering::SeqCst)
                    || s.restart_epoch != epoch
                    || s.watch_epoch != w.watch_epoch
                {
                    return false;
                }
                if s.freeze_epoch != w.freeze_epoch {
                    // Silent for good, the connection kept: as a watch behind a peer
                    // that stopped answering looks from here.
                    drop(s);
                    while !shared.stop.load(Ordering::SeqCst) && !client_gone(&tls.sock) {
                        thread::sleep(POLL);
                    }
                    return false;
                }
                if from < s.compacted {
                    // Changes it has not seen yet were compacted away under it.
                    let message = format!("too old resource version: {from} ({})", s.compacted);
                    let err = status(410, "Expired", &message, None);
                    events.push(json!({"type": "ERROR", "object": err}));
                    break true;
                }
                changes_since(&s, res, &w.selector, from, &mut events);
                from = from.max(s.resource_version);
                let now = Instant::now();
                let timed_out = now >= deadline;
                if timed_out || !events.is_empty() {
                    break timed_out;
                }
                if w.bookmarks && now.duration_since(last_sent) >= BOOKMARK_EVERY {
                    events.push(bookmark(res, from, false));
                    break false;
                }
                if client_gone(&tls.sock) {
                    return false;
                }
                let wait = POLL.min(deadline - now);
                s = match shared.changed.wait_timeout(s, wait) {
                    Ok((s, _)) => s,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        };
        if !events.is_empty() && !send(tls, &events) {
            return false;
        }
        last_sent = Instant::now();
        if end {
            return finish(tls);
        }
    }
}
