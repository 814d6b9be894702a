//! The stand-in API server (`testbed::apiserver`) as a real client sees it: kube-runtime's
//! watcher and reflector (`watcher::Config::default()`, `.default_backoff()`) and kube's
//! typed API, over cni-ebpf's own client stack (`cni_ebpf::k8s::ApiClient`), run on a
//! thread inside the test's network namespace where the stand-in listens.
//!
//! Shown here: the watcher lists once and then follows changes as they happen (one within
//! a second, no re-list); it resumes after its watch is cut (no re-list), after a
//! compaction at its own version (no re-list), relists after a compaction past it (410),
//! and comes back by itself after an API server restart. Also pages, selectors, errors,
//! bookmarks, a watch from a compacted version, and events recorded through the API.

use std::{
    collections::BTreeSet,
    fs::File,
    future::Future,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    core::v1::{ObjectReference, Pod},
    discovery::v1::EndpointSlice,
    networking::v1::NetworkPolicy,
};
use kube::{
    api::{Api, ListParams, WatchEvent, WatchParams},
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher, WatchStreamExt as _,
    },
    Client,
};
use nix::sched::{setns, CloneFlags};
use serde_json::{json, Value};
use testbed::{apiserver::ApiServer, node::unique_tag, NetNs};

/// Longest wait for the reflector to agree with the server.
const CONVERGE: Duration = Duration::from_secs(10);

/// A namespace with the stand-in on its loopback.
struct Setup {
    // Field order is drop order: the server (its threads) before its namespace.
    api: ApiServer,
    ns: NetNs,
}

impl Setup {
    fn new(test: &str) -> Self {
        let ns = NetNs::create(&format!("kapi-{}", unique_tag(test)));
        let api = ApiServer::start(ns.path(), "127.0.0.1");
        Self { api, ns }
    }

    /// Runs the future `f` makes on a current-thread tokio runtime, on a thread inside the
    /// namespace (the client's sockets are made there), with a client of the stand-in.
    fn run<R: Send, Fut: Future<Output = R>>(&self, f: impl FnOnce(Client) -> Fut + Send) -> R {
        let (netns, api) = (self.ns.path(), &self.api);
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                enter(netns);
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
                runtime.block_on(async {
                    let args = cni_ebpf::k8s::ApiArgs {
                        api_server: Some(api.url()),
                        service_account_dir: api.sa_dir().into(),
                        kubeconfig: None,
                        api_timeout: 10,
                        watch_timeout: cni_ebpf::k8s::DEFAULT_WATCH_TIMEOUT_SECS,
                    };
                    let client = cni_ebpf::k8s::ApiClient::new(&args)
                        .unwrap_or_else(|e| panic!("API client: {e}"))
                        .client();
                    f(client).await
                })
            });
            thread
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

#[track_caller]
fn enter(netns: &Path) {
    let file = File::open(netns).unwrap_or_else(|e| panic!("opening {}: {e}", netns.display()));
    if let Err(e) = setns(&file, CloneFlags::CLONE_NEWNET) {
        panic!("entering {}: {e}", netns.display());
    }
}

fn pod(namespace: &str, name: &str, app: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": "10.244.1.7"}
    })
}

/// (namespace, name, resourceVersion) of each object.
type Versions = BTreeSet<(String, String, String)>;

fn server_pods(api: &ApiServer, app: Option<&str>) -> Versions {
    api.list("pods", None)
        .iter()
        .filter(|p| app.is_none_or(|a| p["metadata"]["labels"]["app"] == a))
        .map(|p| {
            let m = &p["metadata"];
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (s(&m["namespace"]), s(&m["name"]), s(&m["resourceVersion"]))
        })
        .collect()
}

fn store_pods(store: &Store<Pod>) -> Versions {
    store
        .state()
        .iter()
        .map(|p| {
            let m = &p.metadata;
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
                m.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits (bounded by [`CONVERGE`]) until the reflector holds what the server holds (of
/// `app`, or all); how long it took.
async fn converge(api: &ApiServer, store: &Store<Pod>, app: Option<&str>, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (want, got) = (server_pods(api, app), store_pods(store));
        if want == got {
            return start.elapsed();
        }
        if start.elapsed() > CONVERGE {
            panic!(
                "{what}: after {CONVERGE:?} the reflector holds {got:?}, the server {want:?}\nrequests: {:#?}",
                api.requests()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded) until `n` watches are open.
async fn watches_open(api: &ApiServer, n: usize, what: &str) {
    let start = Instant::now();
    while api.watch_count() != n {
        if start.elapsed() > CONVERGE {
            panic!(
                "{what}: {} watches open, expected {n}\nrequests: {:#?}",
                api.watch_count(),
                api.requests()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn count(api: &ApiServer, request: &str) -> usize {
    api.requests().iter().filter(|r| *r == request).count()
}

const LIST: &str = "GET /api/v1/pods -> 200";
const WATCH: &str = "GET /api/v1/pods?watch -> 200";

/// Starts a reflector over every pod (or those of `app`), driven on the runtime; its
/// errors are collected.
fn reflect(client: Client, app: Option<&str>) -> (Store<Pod>, Arc<Mutex<Vec<String>>>) {
    let (store, writer) = reflector::store::<Pod>();
    let mut config = watcher::Config::default();
    if let Some(a) = app {
        config = config.labels(&format!("app={a}"));
    }
    let errors = Arc::new(Mutex::new(Vec::new()));
    let stream = watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .reflect(writer);
    let seen = Arc::clone(&errors);
    tokio::spawn(async move {
        stream
            .for_each(|ev| {
                if let Err(e) = ev {
                    seen.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(format!("{e:?}"));
                }
                async {}
            })
            .await;
    });
    (store, errors)
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn a_kube_runtime_watcher_follows_the_stand_in_through_its_faults() {
    let s = Setup::new("watcher");
    let api = &s.api;
    api.put("pods", pod("ns-a", "p1", "web", "node-a"));
    api.put("pods", pod("ns-b", "p2", "db", "node-b"));
    s.run(|client| async move {
        let (store, errors) = reflect(client, None);
        converge(api, &store, None, "the initial list").await;
        watches_open(api, 1, "after the initial list").await;
        assert_eq!(count(api, LIST), 1, "{:#?}", api.requests());

        // A change arrives within a second: watched, not re-listed.
        api.put("pods", pod("ns-a", "p3", "web", "node-a"));
        let took = converge(api, &store, None, "a new pod").await;
        assert!(
            took < Duration::from_secs(1),
            "a new pod seen after {took:?}"
        );
        let mut p1 = pod("ns-a", "p1", "web", "node-a");
        p1["metadata"]["labels"]["tier"] = json!("front");
        api.put("pods", p1);
        converge(api, &store, None, "a changed pod").await;
        api.delete("pods", Some("ns-b"), "p2");
        let took = converge(api, &store, None, "a deleted pod").await;
        assert!(
            took < Duration::from_secs(1),
            "a delete seen after {took:?}"
        );
        assert_eq!(count(api, LIST), 1, "{:#?}", api.requests());

        // Bookmarks keep an idle watch alive and current.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(api.watch_count(), 1);

        // The watch cut: resumed from its version, no re-list.
        let watches = count(api, WATCH);
        api.drop_watches();
        api.put("pods", pod("ns-c", "p4", "web", "node-b"));
        converge(api, &store, None, "after the watches were dropped").await;
        watches_open(api, 1, "after the watches were dropped").await;
        assert!(count(api, WATCH) > watches, "{:#?}", api.requests());
        assert_eq!(count(api, LIST), 1, "{:#?}", api.requests());

        // A compaction at the watcher's own version: still no re-list.
        api.compact();
        api.drop_watches();
        api.put("pods", pod("ns-c", "p5", "web", "node-b"));
        converge(api, &store, None, "after a compaction at its version").await;
        assert_eq!(count(api, LIST), 1, "{:#?}", api.requests());

        // Changes it has not seen compacted away: 410, re-list, converged again.
        api.set_delay(Duration::from_millis(300));
        api.drop_watches();
        api.put("pods", pod("ns-c", "p6", "db", "node-b"));
        api.delete("pods", Some("ns-a"), "p3");
        api.compact();
        tokio::time::sleep(Duration::from_millis(100)).await;
        api.set_delay(Duration::ZERO);
        converge(api, &store, None, "after a compaction past its version").await;
        assert_eq!(count(api, LIST), 2, "{:#?}", api.requests());
        let errs = errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        assert!(
            errs.iter()
                .any(|e| e.contains("410") && e.contains("too old resource version")),
            "{errs:#?}"
        );
        watches_open(api, 1, "after the re-list").await;

        // A restart: refused for 1.5 s, back by itself (backoff), resumed without re-list.
        let down = Instant::now();
        api.restart(Duration::from_millis(1500));
        assert_eq!(api.watch_count(), 0);
        api.put("pods", pod("ns-d", "p7", "web", "node-a"));
        converge(api, &store, None, "after a restart").await;
        assert!(
            down.elapsed() >= Duration::from_millis(1400),
            "{:?}",
            down.elapsed()
        );
        watches_open(api, 1, "after the restart").await;
        assert_eq!(count(api, LIST), 2, "{:#?}", api.requests());
        api.put("pods", pod("ns-d", "p8", "web", "node-a"));
        let took = converge(api, &store, None, "a new pod after the restart").await;
        assert!(
            took < Duration::from_secs(1),
            "a new pod seen after {took:?}"
        );
        let errs = errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        eprintln!("watcher errors: {errs:#?}");
        eprintln!("requests: {:#?}", api.requests());
    });
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_stand_in_pages_selects_refuses_and_records_as_the_api_server() {
    let s = Setup::new("typedapi");
    let api = &s.api;
    for (i, ns) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        api.put("pods", pod(ns, &format!("p{i}"), "web", node));
    }
    api.put(
        "networkpolicies",
        json!({"metadata": {"name": "deny", "namespace": "a"}, "spec": {"podSelector": {}}}),
    );
    api.put(
        "endpointslices",
        json!({
            "metadata": {"name": "svc-x1", "namespace": "a", "labels": {"kubernetes.io/service-name": "svc"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.7"]}]
        }),
    );
    s.run(|client| async move {
        let pods: Api<Pod> = Api::all(client.clone());

        // Pages of two, from one snapshot: a pod added between pages is not in them.
        let mut lp = ListParams::default().limit(2);
        let mut names = Vec::new();
        let mut versions = BTreeSet::new();
        loop {
            let page = pods.list(&lp).await.unwrap_or_else(|e| panic!("list: {e}"));
            names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap_or_default()));
            versions.insert(page.metadata.resource_version.clone().unwrap_or_default());
            if names.len() == 2 {
                api.put("pods", pod("e", "late", "web", "node-a"));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = ListParams::default().limit(2).continue_token(&c),
                None => break,
            }
        }
        assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
        assert_eq!(versions.len(), 1, "every page at the first one's version: {versions:?}");

        // A continue token not ours, or compacted: 410 Expired.
        let garbage = ListParams::default().limit(2).continue_token("bm90LWEtdG9rZW4");
        match pods.list(&garbage).await {
            Err(kube::Error::Api(st)) => assert_eq!((st.code, st.reason.as_str()), (410, "Expired")),
            other => panic!("a garbage continue token: {other:?}"),
        }
        let first = pods.list(&ListParams::default().limit(2)).await.unwrap_or_else(|e| panic!("{e}"));
        api.put("pods", pod("b", "later", "web", "node-a"));
        api.compact();
        let next = ListParams::default()
            .limit(2)
            .continue_token(first.metadata.continue_.as_deref().unwrap_or_default());
        match pods.list(&next).await {
            Err(kube::Error::Api(st)) => assert_eq!((st.code, st.reason.as_str()), (410, "Expired")),
            other => panic!("a compacted continue token: {other:?}"),
        }

        // Selectors: labels, fields; an unsupported field is a 400.
        let on_b = pods
            .list(&ListParams::default().fields("spec.nodeName=node-b"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut names: Vec<_> = on_b.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
        names.sort();
        assert_eq!(names, ["p1", "p3"]);
        let in_a: Api<Pod> = Api::namespaced(client.clone(), "a");
        let web = in_a
            .list(&ListParams::default().labels("app=web,app!=db"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(web.items.len(), 1, "p0");
        match pods.list(&ListParams::default().fields("spec.foo=bar")).await {
            Err(kube::Error::Api(st)) => {
                assert_eq!(st.code, 400);
                assert_eq!(st.message, "field label not supported: spec.foo");
            }
            other => panic!("an unsupported field selector: {other:?}"),
        }

        // Objects of the other groups, and their 404.
        let nps: Api<NetworkPolicy> = Api::namespaced(client.clone(), "a");
        let deny = nps.get("deny").await.unwrap_or_else(|e| panic!("{e}"));
        assert!(deny.metadata.uid.is_some() && deny.metadata.creation_timestamp.is_some());
        match nps.get("nope").await {
            Err(kube::Error::Api(st)) => {
                assert_eq!(st.code, 404);
                assert_eq!(st.message, "networkpolicies.networking.k8s.io \"nope\" not found");
            }
            other => panic!("a missing NetworkPolicy: {other:?}"),
        }
        let slices: Api<EndpointSlice> = Api::all(client.clone());
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=svc"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list.items.len(), 1);

        // A watch from a compacted version: a 200 stream with one 410 ERROR event.
        let mut stream = pods
            .watch(&WatchParams::default(), "1")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .boxed();
        match stream.try_next().await {
            Ok(Some(WatchEvent::Error(st))) => {
                assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
                assert!(st.message.starts_with("too old resource version: 1 ("), "{}", st.message);
            }
            other => panic!("a watch from a compacted version: {:?}", other.map(|e| e.map(|_| ()))),
        }
        assert!(matches!(stream.try_next().await, Ok(None)), "the stream ends");

        // A watch from now: a bookmark at the current version after a second of silence.
        let rv = api.resource_version().to_string();
        let mut stream = pods
            .watch(&WatchParams::default().timeout(5), &rv)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .boxed();
        let next = tokio::time::timeout(Duration::from_secs(3), stream.try_next()).await;
        match next {
            Ok(Ok(Some(WatchEvent::Bookmark(b)))) => assert_eq!(b.metadata.resource_version, rv),
            other => panic!("no bookmark: {:?}", other.map(|r| r.map(|e| e.map(|_| ())))),
        }
        drop(stream);

        // A watch that ends by its timeout ends cleanly (final chunk): its connection,
        // kept, serves the next request.
        let rv = api.resource_version().to_string();
        let started = Instant::now();
        let stream = pods
            .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let events = tokio::time::timeout(Duration::from_secs(4), stream.collect::<Vec<_>>())
            .await
            .unwrap_or_else(|_| panic!("a watch of 1 s still open after 4 s"));
        assert!(events.is_empty(), "{} events", events.len());
        assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
        pods.list(&ListParams::default().labels("!tier,app"))
            .await
            .unwrap_or_else(|e| panic!("a list after a watch's end: {e}"));

        // A watcher of one label: a pod leaving it is gone from the store, entering it back.
        let (store, _errors) = reflect(client.clone(), Some("web"));
        converge(api, &store, Some("web"), "the web pods").await;
        api.put("pods", pod("c", "p2", "db", "node-a"));
        converge(api, &store, Some("web"), "a pod leaving the selector").await;
        api.put("pods", pod("c", "p2", "web", "node-a"));
        converge(api, &store, Some("web"), "a pod entering the selector").await;

        // Forbidden: the RBAC message names verb and resource.
        api.forbid(true);
        match in_a.list(&ListParams::default()).await {
            Err(kube::Error::Api(st)) => {
                assert_eq!(st.code, 403);
                assert_eq!(
                    st.message,
                    format!("pods is forbidden: User \"{}\" cannot list resource \"pods\" in API group \"\" in the namespace \"a\"", testbed::apiserver::SERVICE_ACCOUNT)
                );
            }
            other => panic!("a forbidden list: {other:?}"),
        }
        api.forbid(false);

        // Events through kube-runtime's recorder: created, then patched as a series.
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "cni-ebpf".into(),
                instance: Some("node-a".into()),
            },
        );
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("p0".into()),
            namespace: Some("a".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "PolicyFailed".into(),
            note: Some("a note".into()),
            action: "Compile".into(),
            secondary: None,
        };
        for _ in 0..2 {
            recorder
                .publish(&event, &reference)
                .await
                .unwrap_or_else(|e| panic!("publishing an event: {e}"));
        }
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:#?}");
        assert_eq!(events[0]["reason"], "PolicyFailed");
        assert_eq!(events[0]["series"]["count"], 2, "{events:#?}");
    });
    let requests = api.requests();
    assert!(
        requests.contains(&"POST /apis/events.k8s.io/v1/namespaces/a/events -> 201".to_owned()),
        "{requests:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("PATCH /apis/events.k8s.io/v1/namespaces/a/events/p0.")),
        "{requests:#?}"
    );
}
