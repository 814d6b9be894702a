//! The agent's HTTP endpoints, on hyper's HTTP/1 server: `GET /metrics` where the
//! operator scrapes, and the probes (`GET /healthz`, `GET /ready`) where the kubelet
//! probes, each on a listener of its own (by default both on the node's loopback;
//! [`Listeners`]), or all on one when both addresses are the same.
//!
//! Bounded in every direction: one request per connection (no keep-alive); a request head
//! of at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`] headers (hyper answers 431 beyond
//! that, and 400 to what is not HTTP/1), received within [`HEAD_DEADLINE`] in total (a
//! client trickling bytes is cut off then, unanswered); every connection closed
//! [`CONNECTION_DEADLINE`] after it was accepted, answered or not; at most
//! [`MAX_CONNECTIONS`] at once per listener (more wait in the listen backlog). Scrapes
//! and readiness checks read maps and pins on at most [`READERS`] threads of their own,
//! so neither a slow client nor a slow scrape holds up the others.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{encoding::prometheus_text::CONTENT_TYPE, registry::Registry};
use tokio::{net::TcpListener, sync::Semaphore};

use super::metrics::{collect::Exporter, render};
use crate::error::{Error, Result};

/// Default address of `/metrics`: the node's loopback. The DaemonSet's manifest serves it
/// on the node's address (`$(NODE_IP):9670`) for Prometheus; see docs/operations.md for
/// what it reveals.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9670";
/// Default address of the probes (`/healthz`, `/ready`): the node's loopback, where the
/// kubelet probes a host-network pod (`httpGet.host: 127.0.0.1`).
pub const DEFAULT_PROBE_LISTEN: &str = "127.0.0.1:9671";

/// A listen address: `<ip>:<port>`, an IPv6 address bracketed or not (`$(NODE_IP):9670`
/// from the downward API gives `fd00::1:9670`; the last `:` separates the port).
///
/// # Errors
/// What is not such an address, named.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let bad = || format!("{s:?} is not <address>:<port>");
    let (ip, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = ip.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(std::net::SocketAddr::new(ip, port))
}

/// Largest request head accepted (request line and headers).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Most headers accepted.
pub const MAX_HEADERS: usize = 32;
/// Time allowed to receive the whole request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Time a connection may take from accept to the last byte of its answer.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(15);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Threads reading maps and pins for scrapes and readiness checks.
pub const READERS: usize = 2;

const TEXT: &str = "text/plain; charset=utf-8";

/// What the endpoints answer from.
#[derive(Debug)]
struct App {
    /// The exporter as `prometheus-client`'s collector.
    registry: Registry,
    /// The same exporter, for `/ready` and `/healthz`.
    exporter: Arc<Exporter>,
}

/// Where the endpoints listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    /// `/metrics`.
    pub metrics: SocketAddr,
    /// `/healthz` and `/ready`.
    pub probes: SocketAddr,
}

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serves {
    Metrics,
    Probes,
    Both,
}

impl Serves {
    fn metrics(self) -> bool {
        self != Serves::Probes
    }

    fn probes(self) -> bool {
        self != Serves::Metrics
    }
}

/// Binds `listen` (one listener when both addresses are the same) and serves until the
/// process is killed. Fails only if it cannot start its runtime or bind.
pub fn serve(listen: Listeners, exporter: Exporter) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(READERS)
        .thread_name("metrics")
        .build()
        .map_err(|e| Error::io("starting the metrics runtime", e))?;
    runtime.block_on(async {
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| Error::io(format!("listening on {addr}"), e))
        };
        let app = app(Arc::new(exporter));
        if listen.metrics == listen.probes {
            let listener = bind(listen.metrics).await?;
            eprintln!(
                "cni-ebpf agent: serving /metrics, /healthz and /ready on http://{}",
                listen.metrics
            );
            run(listener, app, Serves::Both).await;
        } else {
            let (metrics, probes) = (bind(listen.metrics).await?, bind(listen.probes).await?);
            eprintln!(
                "cni-ebpf agent: serving /metrics on http://{}, /healthz and /ready on http://{}",
                listen.metrics, listen.probes
            );
            tokio::spawn(run(metrics, Arc::clone(&app), Serves::Metrics));
            run(probes, app, Serves::Probes).await;
        }
        Err(Error::datapath("metrics", "the server stopped"))
    })
}

fn app(exporter: Arc<Exporter>) -> Arc<App> {
    Arc::new(App {
        registry: render::registry(Arc::clone(&exporter)),
        exporter,
    })
}

/// An HTTP/1 server connection builder with the limits above: a bounded head, received
/// within [`HEAD_DEADLINE`], one request per connection.
#[must_use]
pub fn bounded_http1() -> http1::Builder {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .max_header_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(false);
    http
}

/// Accepts connections on `listener` and answers them with what it `serves`, at most
/// [`MAX_CONNECTIONS`] at once. Returns only if its connection slots are gone (never, in
/// practice).
async fn run(listener: TcpListener, app: Arc<App>, serves: Serves) {
    let mut http = bounded_http1();
    http.title_case_headers(true);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Some((stream, peer, slot)) = accept(&listener, &slots, "metrics").await else {
            return;
        };
        let app = Arc::clone(&app);
        let service = service_fn(move |req| answer(Arc::clone(&app), req, serves));
        let conn = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("metrics: connection from {peer}: {e}"),
                Err(_) => tracing::debug!("metrics: connection from {peer}: deadline passed"),
            }
            drop(slot);
        });
    }
}

/// The next connection on `listener` once one of `slots` is free: the connection, its
/// peer and the slot it holds until dropped. `None` once the slots are gone (never, in
/// practice). A failed accept (EMFILE and the like) is logged as `what`'s and waited out.
pub async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    what: &str,
) -> Option<(
    tokio::net::TcpStream,
    SocketAddr,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => return Some((stream, peer, slot)),
            Err(e) => {
                // Back off instead of spinning.
                tracing::warn!("{what}: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Routes a request. `/metrics` and `/ready` read the maps and pins on a reader thread.
async fn answer(
    app: Arc<App>,
    req: Request<Incoming>,
    serves: Serves,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" if serves.metrics() => {
            match tokio::task::spawn_blocking(move || render::text(&app.registry)).await {
                Ok(Ok(body)) => reply(StatusCode::OK, CONTENT_TYPE, body),
                Ok(Err(e)) => failed(&format!("encoding the metrics: {e}")),
                Err(e) => failed(&format!("scraping: {e}")),
            }
        }
        "/healthz" if serves.probes() => match app.exporter.alive() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ok\n"),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
        "/ready" if serves.probes() => {
            match tokio::task::spawn_blocking(move || app.exporter.ready()).await {
                Ok(Ok(())) => reply(StatusCode::OK, TEXT, "ready\n"),
                Ok(Err(why)) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!("not ready:\n{why}\n"),
                ),
                Err(e) => failed(&format!("checking readiness: {e}")),
            }
        }
        "/" => reply(StatusCode::OK, TEXT, index(serves)),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found: try /\n"),
    })
}

/// What `GET /` lists.
fn index(serves: Serves) -> String {
    let mut out = String::from("cni-ebpf agent\n");
    if serves.metrics() {
        out.push_str("/metrics  Prometheus metrics of the pinned datapath and the agent\n");
    }
    if serves.probes() {
        out.push_str(
            "/healthz  liveness: every job's loop and watchers at work (503 while starting)\n\
             /ready    readiness: first rounds made, datapaths loaded, policy in force\n",
        );
    }
    out
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn failed(what: &str) -> Response<Full<Bytes>> {
    tracing::warn!("metrics: {what}");
    reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("{what}\n"))
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
        path::PathBuf,
    };

    use super::*;
    use crate::agent::ready::{Job, Readiness};

    /// A server on a loopback port of its own, serving `exporter` for the test's runtime.
    async fn start(exporter: Exporter) -> SocketAddr {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"));
        tokio::spawn(run(listener, app(Arc::new(exporter)), Serves::Both));
        addr
    }

    /// An exporter of an empty bpffs root: nothing to read, ready unless `readiness` waits.
    fn exporter(root: PathBuf) -> Exporter {
        Exporter::new(root, Vec::new())
    }

    /// Sends `request` and reads the answer until the server closes.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let request = request.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap_or_else(|e| panic!("{e}"));
            // The server may answer (431, 400) and close before the whole request is sent.
            let _ = s.write_all(&request);
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
        .await
        .unwrap_or_else(|e| panic!("client: {e}"))
    }

    #[tokio::test]
    async fn metrics_are_served_in_the_text_format_and_the_connection_closed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = start(exporter(dir.path().into())).await;
        let out = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(
            head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}", body.len())),
            "{head}"
        );
        assert!(body.starts_with("# HELP cni_ebpf_build_info "), "{body}");
        // The root is no bpffs: the scrape says so and is served all the same.
        assert!(
            body.contains("\ncni_ebpf_discovery_errors_total 1\n"),
            "{body}"
        );
        // HTTP/1.0, a query string.
        let out = exchange(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.0 200 OK\r\n"), "{out}");
        assert!(out.contains("cni_ebpf_build_info{"), "{out}");
    }

    #[tokio::test]
    async fn healthz_head_index_and_refusals() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = start(exporter(dir.path().into())).await;
        let health = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
        let head = exchange(addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(head.contains("Content-Length: 3\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
        let index = exchange(addr, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(index.contains("/metrics  Prometheus metrics"), "{index}");
        let nope = exchange(addr, b"GET /nope HTTP/1.1\r\n\r\n").await;
        assert!(nope.starts_with("HTTP/1.1 404 Not Found\r\n"), "{nope}");
        let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
    }

    /// Scrapers reach `/metrics` only, probes `/healthz` and `/ready` only.
    #[tokio::test]
    async fn each_listener_serves_only_its_endpoints() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let app = app(Arc::new(exporter(dir.path().into())));
        let mut addrs = Vec::new();
        for serves in [Serves::Metrics, Serves::Probes] {
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .await
                .unwrap_or_else(|e| panic!("bind: {e}"));
            addrs.push(listener.local_addr().unwrap_or_else(|e| panic!("{e}")));
            tokio::spawn(run(listener, Arc::clone(&app), serves));
        }
        let (metrics, probes) = (addrs[0], addrs[1]);
        let status = |out: String| out.split("\r\n").next().unwrap_or_default().to_owned();
        for (addr, path, want) in [
            (metrics, "/metrics", "HTTP/1.1 200 OK"),
            (metrics, "/healthz", "HTTP/1.1 404 Not Found"),
            (metrics, "/ready", "HTTP/1.1 404 Not Found"),
            (probes, "/healthz", "HTTP/1.1 200 OK"),
            (probes, "/ready", "HTTP/1.1 200 OK"),
            (probes, "/metrics", "HTTP/1.1 404 Not Found"),
        ] {
            let out = exchange(addr, format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes()).await;
            assert_eq!(status(out), want, "{path} on {addr}");
        }
        let index = exchange(probes, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(
            index.contains("/healthz") && !index.contains("/metrics"),
            "{index}"
        );
    }

    /// `/healthz` says "starting" until the first rounds, then whether the loops still
    /// come round.
    #[tokio::test]
    async fn healthz_is_503_while_starting_and_when_a_loop_is_stuck() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let readiness = Arc::new(Readiness::default());
        readiness.wait_for(Job::Policy);
        let bounds = crate::agent::liveness::Bounds::new(
            Duration::from_millis(300),
            Duration::from_secs(290),
        );
        let ex = exporter(dir.path().into())
            .with_readiness(Arc::clone(&readiness))
            .with_liveness(bounds);
        let addr = start(ex).await;
        let out = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
        assert!(
            out.ends_with("starting: NetworkPolicy has not made its first round yet\n"),
            "{out}"
        );
        readiness.done(Job::Policy);
        let out = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let out = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
        assert!(
            out.contains("NetworkPolicy: its loop has not come round"),
            "{out}"
        );
        readiness.beat(Job::Policy);
        let out = exchange(addr, b"GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    }

    /// Only `/metrics` reads the maps: every scrape of an empty root counts one discovery
    /// error, so the count after other requests tells how many scrapes they caused.
    #[tokio::test]
    async fn scraping_only_happens_for_metrics() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = start(exporter(dir.path().into())).await;
        for request in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"HEAD /healthz HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET /nope HTTP/1.1\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        ] {
            exchange(addr, request).await;
        }
        for scrapes in 1..=2 {
            let out = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
            assert!(
                out.contains(&format!("\ncni_ebpf_discovery_errors_total {scrapes}\n")),
                "scrape {scrapes}: {out}"
            );
        }
    }

    #[tokio::test]
    async fn ready_answers_503_with_the_reasons_until_ready() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let readiness = Arc::new(Readiness::default());
        readiness.wait_for(Job::Policy);
        let ex = exporter(dir.path().into()).with_readiness(Arc::clone(&readiness));
        let addr = start(ex).await;
        let out = exchange(addr, b"GET /ready HTTP/1.1\r\n\r\n").await;
        assert!(
            out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{out}"
        );
        assert!(
            out.ends_with("\r\n\r\nnot ready:\nNetworkPolicy has not made its first round yet\n"),
            "{out}"
        );
        readiness.done(Job::Policy);
        let out = exchange(addr, b"GET /ready HTTP/1.1\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nready\n"), "{out}");
    }

    #[tokio::test]
    async fn oversized_and_malformed_requests_are_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = start(exporter(dir.path().into())).await;
        let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
        while big.len() <= MAX_HEAD_BYTES {
            big.extend_from_slice(
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        big.extend_from_slice(b"\r\n");
        let out = exchange(addr, &big).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        let out = exchange(addr, &many).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        let tls = exchange(addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03").await;
        assert!(tls.starts_with("HTTP/1.1 400 "), "{tls}");
    }

    #[tokio::test]
    async fn a_stalled_client_holds_up_no_other() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let addr = start(exporter(dir.path().into())).await;
        let stalled = tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
            s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                .unwrap_or_else(|e| panic!("{e}"));
            s
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..2 * READERS {
            let out = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
            assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        }
        drop(stalled);
    }
}

#[cfg(test)]
mod listen_tests {
    use super::parse_listen;

    #[test]
    fn listen_addresses_take_unbracketed_ipv6() {
        assert_eq!(
            parse_listen("127.0.0.1:9670").map(|a| a.to_string()),
            Ok("127.0.0.1:9670".into())
        );
        assert_eq!(
            parse_listen("[fd00::1]:9670").map(|a| a.to_string()),
            Ok("[fd00::1]:9670".into())
        );
        assert_eq!(
            parse_listen("fd00::1:9670").map(|a| a.to_string()),
            Ok("[fd00::1]:9670".into())
        );
        assert!(parse_listen("node:9670").is_err_and(|e| e.contains("\"node:9670\"")));
        assert!(parse_listen(":9670").is_err());
    }
}
