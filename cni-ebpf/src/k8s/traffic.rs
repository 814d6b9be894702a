//! What the process's API clients exchange with the API server, per resource: requests
//! made, answers and failures, bytes received, and when anything last happened. The
//! agent's liveness reads it (a watcher that neither receives nor retries is wedged), its
//! metrics export it, and the scale bench reads the bytes.
//!
//! Every client [`super::ApiClient`] builds counts here ([`counted`]), and cuts off an
//! answer whose body has been silent for its idle limit: a watch whose connection died
//! without a word (a moved address, a dropped NAT entry) ends in an error the watcher
//! retries, instead of waiting forever.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{Request, Response};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tower_http::timeout::TimeoutBody;

/// One resource's exchanges since the process started.
#[derive(Debug, Clone, Copy)]
pub struct Exchanges {
    /// Requests sent (a list page, a watch started or resumed, a get, an Event).
    pub requests: u64,
    /// Requests that failed before an answer or were answered with an error status, and
    /// answers whose body failed or was cut off for silence.
    pub failures: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// When a request was last sent, answered, failed or received bytes.
    pub last: Instant,
}

/// The process's exchanges, by resource (`pods`, `networking.k8s.io/networkpolicies`, …).
#[derive(Debug, Default)]
pub struct Traffic {
    by_resource: Mutex<BTreeMap<Arc<str>, Exchanges>>,
}

impl Traffic {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Arc<str>, Exchanges>> {
        match self.by_resource.lock() {
            Ok(g) => g,
            // A thread that panicked aborted the process (panic = "abort").
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Counts an exchange about `resource` (`f` says what), now.
    pub(crate) fn note(&self, resource: &Arc<str>, f: impl FnOnce(&mut Exchanges)) {
        let mut map = self.lock();
        let now = Instant::now();
        let e = map.entry(Arc::clone(resource)).or_insert(Exchanges {
            requests: 0,
            failures: 0,
            bytes: 0,
            last: now,
        });
        e.last = now;
        f(e);
    }

    /// Every resource's exchanges so far.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<String, Exchanges> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }
}

/// The process's [`Traffic`].
#[must_use]
pub fn traffic() -> &'static Traffic {
    static TRAFFIC: OnceLock<Traffic> = OnceLock::new();
    TRAFFIC.get_or_init(Traffic::default)
}

/// The resource a request path names: `pods` for `/api/v1/pods` and
/// `/api/v1/namespaces/x/pods/y`, `namespaces` for `/api/v1/namespaces/x`, and
/// `<group>/<resource>` for a named group (`/apis/discovery.k8s.io/v1/endpointslices`).
#[must_use]
pub fn resource_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => (None, rest),
        ["apis", group, _version, rest @ ..] => (Some(*group), rest),
        _ => return path.to_owned(),
    };
    let resource = match rest {
        ["namespaces", _ns, resource, ..] => *resource,
        [resource, ..] => *resource,
        [] => "",
    };
    match group {
        Some(g) => format!("{g}/{resource}"),
        None => resource.to_owned(),
    }
}

/// An answer's body as a counted client hands it on: its bytes counted frame by frame
/// under its resource, and cut off (an error) after its idle limit without a frame.
pub struct CountedBody {
    body: Pin<Box<TimeoutBody<Incoming>>>,
    resource: Arc<str>,
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = self.body.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len) as u64;
                traffic().note(&self.resource, |e| e.bytes += n);
            }
            Poll::Ready(Some(Err(_))) => traffic().note(&self.resource, |e| e.failures += 1),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Sends `req` with `send` (the HTTP client), counting it under its resource, and hands
/// on the answer with a [`CountedBody`] cut off after `idle` without a frame.
///
/// # Errors
/// The client's, counted as a failure.
pub async fn counted<F>(
    send: impl FnOnce(Request<kube::client::Body>) -> F,
    req: Request<kube::client::Body>,
    idle: Duration,
) -> Result<Response<CountedBody>, hyper_util::client::legacy::Error>
where
    F: Future<Output = Result<Response<Incoming>, hyper_util::client::legacy::Error>>,
{
    let resource: Arc<str> = resource_of(req.uri().path()).into();
    let t = traffic();
    t.note(&resource, |e| e.requests += 1);
    match send(req).await {
        Ok(resp) => {
            // An error status (403, 429, 500, …) is a failed request too.
            let failed = !resp.status().is_success();
            t.note(&resource, |e| e.failures += u64::from(failed));
            Ok(resp.map(|body| CountedBody {
                body: Box::pin(TimeoutBody::new(idle, body)),
                resource,
            }))
        }
        Err(err) => {
            t.note(&resource, |e| e.failures += 1);
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn requests_are_counted_under_the_resource_they_name() {
        for (path, resource) in [
            ("/api/v1/pods", "pods"),
            ("/api/v1/namespaces/kube-system/pods/coredns-1", "pods"),
            ("/api/v1/namespaces", "namespaces"),
            ("/api/v1/namespaces/default", "namespaces"),
            ("/api/v1/nodes/node-a", "nodes"),
            (
                "/apis/networking.k8s.io/v1/networkpolicies",
                "networking.k8s.io/networkpolicies",
            ),
            (
                "/apis/discovery.k8s.io/v1/namespaces/x/endpointslices",
                "discovery.k8s.io/endpointslices",
            ),
            (
                "/apis/events.k8s.io/v1/namespaces/x/events",
                "events.k8s.io/events",
            ),
        ] {
            assert_eq!(resource_of(path), resource, "{path}");
        }
    }
}
