//! The HTTP side of `cni-ebpf metrics`: `GET /metrics`, `GET /healthz`, nothing else.
//!
//! Bounded in every direction: a fixed pool of [`WORKERS`] threads, each accepting and
//! answering one connection at a time; one request per connection (`Connection: close`);
//! the request head (request line and headers) at most [`MAX_REQUEST_BYTES`] and
//! [`MAX_HEADERS`] headers, read within [`READ_DEADLINE`] in total (a client trickling
//! bytes cannot hold a worker longer), the answer written within [`WRITE_DEADLINE`].
//! Requests are parsed by `httparse` (hyper's parser); the rest of HTTP/1.1 that a scraper
//! needs is a status line and three headers.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use prometheus_client::{encoding::prometheus_text::CONTENT_TYPE, registry::Registry};

use super::{collect::Exporter, render};
use crate::error::{Error, Result};

/// Worker threads (each serves one connection at a time).
pub const WORKERS: usize = 2;
/// Largest request head accepted.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Most headers accepted.
pub const MAX_HEADERS: usize = 32;
/// Time allowed to receive the whole request head.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Time allowed to send the whole answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// A parsed request: what routing needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// The path without the query string.
    pub path: String,
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadError {
    /// The head is larger than [`MAX_REQUEST_BYTES`] or has more than [`MAX_HEADERS`]
    /// headers (answered 431).
    TooLarge,
    /// Not HTTP/1.x (answered 400).
    Malformed(String),
    /// The connection failed, closed or timed out first (nothing to answer).
    Io(io::Error),
}

/// Reads one request head from `r`, at most [`MAX_REQUEST_BYTES`].
pub fn read_request<R: Read>(r: &mut R) -> std::result::Result<Request, ReadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let room = MAX_REQUEST_BYTES.saturating_sub(buf.len());
        if room == 0 {
            return Err(ReadError::TooLarge);
        }
        let n = match r.read(&mut chunk[..room.min(1024)]) {
            Ok(0) => {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before the request was complete",
                )))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let path = req.path.unwrap_or("/");
                let path = path.split(['?', '#']).next().unwrap_or(path);
                return Ok(Request {
                    method: req.method.unwrap_or_default().to_owned(),
                    path: path.to_owned(),
                });
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(ReadError::TooLarge),
            Err(e) => return Err(ReadError::Malformed(e.to_string())),
        }
    }
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Extra header lines (`Name: value`).
    pub headers: Vec<String>,
    /// Body (not sent for `HEAD`).
    pub body: Vec<u8>,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// Writes status line, headers and (unless `head_only`) the body.
    pub fn write_to<W: Write>(&self, w: &mut W, head_only: bool) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason_phrase(self.status),
            self.content_type,
            self.body.len()
        );
        for h in &self.headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        w.write_all(head.as_bytes())?;
        if !head_only {
            w.write_all(&self.body)?;
        }
        w.flush()
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        431 => "Request Header Fields Too Large",
        _ => "",
    }
}

/// Routes a request; `scrape` renders the metrics (called only for `/metrics`), `ready`
/// says whether the agent is ready and why not (called only for `/ready`).
pub fn respond(
    req: &Request,
    scrape: impl FnOnce() -> String,
    ready: impl FnOnce() -> std::result::Result<(), String>,
) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        let mut r = Response::text(405, "only GET and HEAD\n");
        r.headers.push("Allow: GET, HEAD".into());
        return r;
    }
    match req.path.as_str() {
        "/metrics" => Response {
            status: 200,
            content_type: CONTENT_TYPE,
            headers: Vec::new(),
            body: scrape().into_bytes(),
        },
        "/healthz" => Response::text(200, "ok\n"),
        "/ready" => match ready() {
            Ok(()) => Response::text(200, "ready\n"),
            Err(why) => Response::text(503, &format!("not ready:\n{why}\n")),
        },
        "/" => Response::text(
            200,
            "cni-ebpf metrics\n/metrics  Prometheus metrics of the pinned datapath\n\
             /healthz  liveness\n/ready    readiness: first rounds made, datapaths loaded\n",
        ),
        _ => Response::text(404, "not found: try /metrics\n"),
    }
}

/// Answers one connection's request on `conn` (a stream or, in tests, a buffer pair).
pub fn exchange<C: Read + Write>(
    conn: &mut C,
    scrape: impl FnOnce() -> String,
    ready: impl FnOnce() -> std::result::Result<(), String>,
) -> io::Result<()> {
    let (resp, head_only) = match read_request(conn) {
        Ok(req) => (respond(&req, scrape, ready), req.method == "HEAD"),
        Err(ReadError::TooLarge) => (Response::text(431, "request head too large\n"), false),
        Err(ReadError::Malformed(e)) => {
            (Response::text(400, &format!("bad request: {e}\n")), false)
        }
        Err(ReadError::Io(e)) => return Err(e),
    };
    resp.write_to(conn, head_only)
}

/// A stream whose reads and writes all end by one deadline, however the peer paces them.
struct Deadlined<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
        } else {
            Ok(left)
        }
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let mut s: &TcpStream = self.stream;
        s.read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let mut s: &TcpStream = self.stream;
        s.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut s: &TcpStream = self.stream;
        s.flush()
    }
}

/// A read deadline for the request, then a fresh write deadline for the answer.
struct Conn<'a> {
    read: Deadlined<'a>,
    write: Option<Deadlined<'a>>,
}

impl Read for Conn<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read.read(buf)
    }
}

impl Write for Conn<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let stream = self.read.stream;
        self.write
            .get_or_insert_with(|| Deadlined {
                stream,
                until: Instant::now() + WRITE_DEADLINE,
            })
            .write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.write {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

fn serve_connection(
    stream: &TcpStream,
    peer: SocketAddr,
    exporter: &Exporter,
    registry: &Registry,
) {
    let mut conn = Conn {
        read: Deadlined {
            stream,
            until: Instant::now() + READ_DEADLINE,
        },
        write: None,
    };
    if let Err(e) = exchange(
        &mut conn,
        || {
            render::text(registry).unwrap_or_else(|e| {
                tracing::warn!("metrics: encoding: {e}");
                String::new()
            })
        },
        || exporter.ready(),
    ) {
        tracing::debug!("metrics: connection from {peer}: {e}");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Binds `listen` and serves until the process is killed. Fails only if it cannot bind
/// or start its workers.
pub fn serve(listen: SocketAddr, exporter: Exporter) -> Result<()> {
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::io(format!("listening on {listen}"), e))?;
    let exporter = Arc::new(exporter);
    let registry = Arc::new(render::registry(Arc::clone(&exporter)));
    let mut workers = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let l = listener
            .try_clone()
            .map_err(|e| Error::io("cloning the listening socket", e))?;
        let (ex, reg) = (Arc::clone(&exporter), Arc::clone(&registry));
        let h = thread::Builder::new()
            .name(format!("metrics-{i}"))
            .spawn(move || worker(&l, &ex, &reg))
            .map_err(|e| Error::io("starting a metrics worker", e))?;
        workers.push(h);
    }
    eprintln!("cni-ebpf metrics: serving /metrics on http://{listen}");
    for h in workers {
        let _ = h.join();
    }
    Err(Error::datapath("metrics", "every worker stopped"))
}

fn worker(listener: &TcpListener, exporter: &Exporter, registry: &Registry) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => serve_connection(&stream, peer, exporter, registry),
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("metrics: accept: {e}");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    /// A connection in memory: reads from `input` (in `step`-byte pieces), writes to
    /// `output`.
    struct Mem {
        input: Vec<u8>,
        pos: usize,
        step: usize,
        output: Vec<u8>,
    }

    impl Mem {
        fn new(input: &[u8], step: usize) -> Self {
            Self {
                input: input.to_vec(),
                pos: 0,
                step,
                output: Vec::new(),
            }
        }
    }

    impl Read for Mem {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.input.len() - self.pos);
            buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    impl Write for Mem {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn answer(input: &[u8], step: usize) -> String {
        let mut c = Mem::new(input, step);
        exchange(&mut c, || "m 1\n".to_owned(), || Ok(())).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&c.output).into_owned()
    }

    #[test]
    fn metrics_are_served_with_the_text_format_content_type() {
        let out = answer(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
            4096,
        );
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 4\r\nConnection: close\r\n\r\nm 1\n"
        );
    }

    #[test]
    fn a_request_arriving_byte_by_byte_is_read_whole() {
        let out = answer(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", 1);
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nm 1\n"), "{out}");
    }

    #[test]
    fn healthz_head_and_unknown_paths() {
        assert!(answer(b"GET /healthz HTTP/1.1\r\n\r\n", 64).ends_with("\r\n\r\nok\n"));
        let head = answer(b"HEAD /metrics HTTP/1.1\r\n\r\n", 64);
        assert!(head.contains("Content-Length: 4\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head}");
        assert!(answer(b"GET /nope HTTP/1.1\r\n\r\n", 64).starts_with("HTTP/1.1 404 "));
        let post = answer(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 64);
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
    }

    #[test]
    fn scraping_only_happens_for_metrics() {
        let mut c = Mem::new(b"GET /healthz HTTP/1.1\r\n\r\n", 64);
        exchange(
            &mut c,
            || panic!("scraped for /healthz"),
            || panic!("readiness asked for /healthz"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn ready_answers_503_with_the_reasons_until_ready() {
        let mut c = Mem::new(b"GET /ready HTTP/1.1\r\n\r\n", 64);
        exchange(
            &mut c,
            || panic!("scraped for /ready"),
            || Err("NetworkPolicy has not made its first round yet".into()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let out = String::from_utf8_lossy(&c.output).into_owned();
        assert!(
            out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{out}"
        );
        assert!(
            out.ends_with("not ready:\nNetworkPolicy has not made its first round yet\n"),
            "{out}"
        );
        assert!(answer(b"GET /ready HTTP/1.1\r\n\r\n", 64).ends_with("\r\n\r\nready\n"));
    }

    #[test]
    fn oversized_and_malformed_requests_are_refused() {
        let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
        while big.len() <= MAX_REQUEST_BYTES {
            big.extend_from_slice(
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        assert!(answer(&big, 4096).starts_with("HTTP/1.1 431 "));
        let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(answer(&many, 4096).starts_with("HTTP/1.1 431 "));
        assert!(answer(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 64)
            .starts_with("HTTP/1.1 400 "));
    }

    #[test]
    fn a_connection_closed_early_gets_no_answer() {
        let mut c = Mem::new(b"GET /metrics HTTP/1.1\r\nHost:", 64);
        let e = exchange(&mut c, String::new, || Ok(())).err();
        assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::UnexpectedEof));
        assert!(c.output.is_empty());
    }
}
