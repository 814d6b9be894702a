//! The flows' HTTP endpoint (`--flows-listen`; HTTPS with `--flows-tls-cert` and
//! `--flows-tls-key`, see [`ServingCert`]), each request checked by [`Authorizer`]:
//!
//! - `GET /flows?<filter>`: the records the node keeps that match, oldest first, as a
//!   JSON array (the filter: [`Filter::from_query`]);
//! - `GET /flows?follow=true&<filter>`: the same, then every new record that matches as
//!   it comes, one JSON object per line, until the reader goes; a reader that falls
//!   behind gets a `{"lost": n}` line for the records it missed (never waited for);
//!
//! (The live map of who talks to whom is `cni-ebpf observe --ui`'s, which holds the
//! reader's token: a browser would have none to present here.)
//!
//! The limits of the agent's other endpoints apply ([`bounded_http1`]): a bounded request
//! head received in time, one request per connection, at most [`MAX_CONNECTIONS`]
//! connections at once; an answer that is not a follow is cut off
//! [`CONNECTION_DEADLINE`] after the connection was accepted.

use std::{convert::Infallible, sync::Arc, time::SystemTime};

use futures::StreamExt as _;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    body::{Bytes, Frame, Incoming},
    header::{self, HeaderValue},
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::Semaphore};

use super::{
    authz::Authorizer,
    window::{Filter, Window},
};
use crate::agent::{
    http::{accept, bounded_http1, CONNECTION_DEADLINE, MAX_CONNECTIONS},
    tls::ServingCert,
};

type Body = BoxBody<Bytes, Infallible>;

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
const JSON_LINES: &str = "application/jsonl";

/// Accepts connections on `listener` and answers them (over TLS with `tls`), at most
/// [`MAX_CONNECTIONS`] at once. Returns only if its connection slots are gone (never, in
/// practice).
pub async fn run(
    listener: TcpListener,
    window: Arc<Window>,
    auth: Arc<Authorizer>,
    node: String,
    tls: Option<Arc<ServingCert>>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let node: Arc<str> = Arc::from(node);
    loop {
        let Some((stream, peer, slot)) = accept(&listener, &slots, "flows").await else {
            return;
        };
        let (window, auth, node) = (Arc::clone(&window), Arc::clone(&auth), Arc::clone(&node));
        let acceptor = match tls.as_ref().map(|t| t.acceptor()) {
            Some(None) => {
                // HTTPS is configured and its certificate not there yet: nothing is
                // served, least of all in clear.
                tracing::debug!("flows: connection from {peer} closed: no serving certificate");
                continue;
            }
            Some(Some(a)) => Some(a),
            None => None,
        };
        tokio::spawn(async move {
            let deadline = tokio::time::sleep(CONNECTION_DEADLINE);
            tokio::pin!(deadline);
            match acceptor {
                Some(acceptor) => {
                    // The handshake within the connection's deadline too.
                    let handshake = tokio::select! {
                        r = acceptor.accept(stream) => r,
                        () = &mut deadline => {
                            tracing::debug!("flows: connection from {peer}: no TLS handshake in time");
                            return;
                        }
                    };
                    match handshake {
                        Ok(s) => serve_one(s, peer, deadline, window, auth, node).await,
                        Err(e) => tracing::debug!("flows: connection from {peer}: TLS: {e}"),
                    }
                }
                None => serve_one(stream, peer, deadline, window, auth, node).await,
            }
            drop(slot);
        });
    }
}

/// Answers the request of one connection `io`, cut off at `deadline` unless it follows.
async fn serve_one<I>(
    io: I,
    peer: std::net::SocketAddr,
    mut deadline: std::pin::Pin<&mut tokio::time::Sleep>,
    window: Arc<Window>,
    auth: Arc<Authorizer>,
    node: Arc<str>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let following = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let marked = Arc::clone(&following);
    let service = service_fn(move |req| {
        answer(
            Arc::clone(&window),
            Arc::clone(&auth),
            Arc::clone(&node),
            Arc::clone(&marked),
            req,
        )
    });
    let conn = bounded_http1().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // A follow outlives the deadline; anything else is cut off by it.
    let mut bounded = true;
    loop {
        tokio::select! {
            r = &mut conn => {
                if let Err(e) = r {
                    tracing::debug!("flows: connection from {peer}: {e}");
                }
                break;
            }
            () = &mut deadline, if bounded => {
                if following.load(std::sync::atomic::Ordering::Relaxed) {
                    bounded = false;
                } else {
                    tracing::debug!("flows: connection from {peer}: deadline passed");
                    break;
                }
            }
        }
    }
}

/// Answers one request.
async fn answer(
    window: Arc<Window>,
    auth: Arc<Authorizer>,
    node: Arc<str>,
    following: Arc<std::sync::atomic::AtomicBool>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() != Method::GET {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return Ok(r);
    }
    let path = req.uri().path().to_owned();
    if path == "/" {
        return Ok(reply(
            StatusCode::OK,
            TEXT,
            format!(
                "cni-ebpf agent on {node}\n\
                 /flows   flow records (JSON; ?follow=true: JSON lines as they come)\n"
            ),
        ));
    }
    if path != "/flows" {
        return Ok(reply(StatusCode::NOT_FOUND, TEXT, "not found: try /\n"));
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = match auth.check(authorization).await {
        Ok(u) => u,
        Err(r) => {
            let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FORBIDDEN);
            let mut resp = reply(status, TEXT, format!("{}\n", r.message));
            if r.status == 401 {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            return Ok(resp);
        }
    };
    let (filter, follow) =
        match Filter::from_query(req.uri().query().unwrap_or(""), now_unix_nano()) {
            Ok(f) => f,
            Err(e) => return Ok(reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n"))),
        };
    tracing::debug!("flows: {user} reads {}", req.uri());
    if !follow {
        let kept = window.query(&filter);
        let kept: Vec<&super::record::Flow> = kept.iter().map(|f| &**f).collect();
        let body = serde_json::to_vec(&kept).unwrap_or_default();
        return Ok(reply(StatusCode::OK, JSON, body));
    }
    following.store(true, std::sync::atomic::Ordering::Relaxed);
    // Subscribed before the query: nothing falls between the two (a record in both is
    // sent once, by its time).
    let rx = window.follow();
    let history = if filter.since_unix_nano.is_some() || filter.last.is_some() {
        window.query(&filter)
    } else {
        Vec::new()
    };
    let after = history.last().map_or(0, |f| f.time_unix_nano);
    let live_filter = Filter {
        last: None,
        ..filter
    };
    let first = futures::stream::iter(history.into_iter().map(|f| line(&f)));
    let live = futures::stream::unfold(rx, move |mut rx| {
        let filter = live_filter.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(f) if f.time_unix_nano > after && filter.keeps(&f) => {
                        return Some((line(&f), rx));
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        return Some((Bytes::from(format!("{{\"lost\":{n}}}\n")), rx));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let frames = first
        .chain(live)
        .map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_LINES));
    Ok(r)
}

fn line(f: &super::record::Flow) -> Bytes {
    let mut v = serde_json::to_vec(f).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Nanoseconds since the epoch, now.
#[must_use]
pub fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
