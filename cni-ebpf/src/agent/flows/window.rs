//! The flows a node keeps: the latest [`Window::capacity`] records in memory, the oldest
//! dropped first, and the live ones handed to every follower; and the filters a reader
//! narrows them by (the query string of `/flows`, the options of `cni-ebpf observe`).
//!
//! A follower that falls behind is never waited for: its channel holds
//! [`FOLLOWER_BACKLOG`] records, and the records it missed beyond that are counted and
//! told to it (a `{"lost": n}` line), as the datapath never waits for the agent either.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
};

use tokio::sync::broadcast;

use super::record::Flow;

/// Records a follower's channel holds before it loses the oldest.
pub const FOLLOWER_BACKLOG: usize = 4096;

/// The records a node keeps, and its followers.
#[derive(Debug)]
pub struct Window {
    kept: Mutex<VecDeque<Arc<Flow>>>,
    capacity: usize,
    live: broadcast::Sender<Arc<Flow>>,
}

impl Window {
    /// A window of `capacity` records.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        let (live, _) = broadcast::channel(FOLLOWER_BACKLOG);
        Self {
            kept: Mutex::new(VecDeque::with_capacity(capacity.min(65_536))),
            capacity: capacity.max(1),
            live,
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Flow>>> {
        match self.kept.lock() {
            Ok(g) => g,
            // A task that panicked aborted the process (panic = "abort").
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// How many records it keeps at most.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `flow`, dropping the oldest beyond the capacity, and hands it to the
    /// followers.
    pub fn push(&self, flow: Flow) {
        self.push_all(vec![Arc::new(flow)]);
    }

    /// Adds `flows` in order (the window locked once), as [`Self::push`] does each.
    pub fn push_all(&self, flows: Vec<Arc<Flow>>) {
        {
            let mut kept = self.lock();
            for flow in &flows {
                if kept.len() >= self.capacity {
                    kept.pop_front();
                }
                kept.push_back(Arc::clone(flow));
            }
        }
        if self.live.receiver_count() > 0 {
            for flow in flows {
                // A follower gone meanwhile: nothing to do.
                let _ = self.live.send(flow);
            }
        }
    }

    /// The records `filter` keeps, oldest first (at most its `last`).
    #[must_use]
    pub fn query(&self, filter: &Filter) -> Vec<Arc<Flow>> {
        let kept = self.lock();
        let mut out: Vec<Arc<Flow>> = kept.iter().filter(|f| filter.keeps(f)).cloned().collect();
        if let Some(n) = filter.last {
            out.drain(..out.len().saturating_sub(n));
        }
        out
    }

    /// A receiver of every record pushed from now on.
    #[must_use]
    pub fn follow(&self) -> broadcast::Receiver<Arc<Flow>> {
        self.live.subscribe()
    }
}

/// What a reader asks for: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// A pod on either side: `namespace/name`, or `name` in any namespace.
    pub pod: Option<String>,
    /// Either side in this namespace.
    pub namespace: Option<String>,
    /// Either side a pod of this workload (`Deployment/web`, or `web`).
    pub workload: Option<String>,
    /// Either side this Service (`namespace/name` or `name`), as addressed.
    pub service: Option<String>,
    /// `egress`, `ingress` or `node`.
    pub direction: Option<String>,
    /// `forwarded` or `dropped`.
    pub verdict: Option<String>,
    /// `start`, `end` or `drop`.
    pub kind: Option<String>,
    /// `TCP`, `UDP`, … (any case).
    pub protocol: Option<String>,
    /// Either side's port.
    pub port: Option<u16>,
    /// A drop's reason (`drop_policy_ingress`), or an end's.
    pub reason: Option<String>,
    /// Only records at or after this time (ns since the epoch).
    pub since_unix_nano: Option<u64>,
    /// Only records before this time.
    pub until_unix_nano: Option<u64>,
    /// Only the last `n` of those that match.
    pub last: Option<usize>,
}

impl Filter {
    /// Whether `f` matches.
    #[must_use]
    pub fn keeps(&self, f: &Flow) -> bool {
        let sides = [&f.source, &f.destination];
        let named = |want: &str, kind: &str| {
            sides.iter().copied().chain(f.service.as_ref()).any(|e| {
                e.kind == kind
                    && match want.split_once('/') {
                        Some((ns, n)) => {
                            e.namespace.as_deref() == Some(ns) && e.name.as_deref() == Some(n)
                        }
                        None => e.name.as_deref() == Some(want),
                    }
            })
        };
        self.pod.as_deref().is_none_or(|p| named(p, "pod"))
            && self.service.as_deref().is_none_or(|s| named(s, "service"))
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| sides.iter().any(|e| e.namespace.as_deref() == Some(ns)))
            && self.workload.as_deref().is_none_or(|w| {
                sides.iter().any(|e| {
                    e.workload
                        .as_deref()
                        .is_some_and(|x| x == w || x.rsplit_once('/').is_some_and(|(_, n)| n == w))
                })
            })
            && self.direction.as_deref().is_none_or(|d| f.direction == d)
            && self.verdict.as_deref().is_none_or(|v| f.verdict == v)
            && self.kind.as_deref().is_none_or(|k| f.kind == k)
            && self
                .protocol
                .as_deref()
                .is_none_or(|p| f.protocol.eq_ignore_ascii_case(p))
            && self
                .port
                .is_none_or(|p| f.source.port == p || f.destination.port == p)
            && self
                .reason
                .as_deref()
                .is_none_or(|r| f.reason.as_deref() == Some(r))
            && self.since_unix_nano.is_none_or(|t| f.time_unix_nano >= t)
            && self.until_unix_nano.is_none_or(|t| f.time_unix_nano < t)
    }

    /// The filter a query string asks for (`pod=shop/web&verdict=dropped&since=5m`);
    /// `follow` is the caller's. `now_unix_nano` resolves relative times.
    ///
    /// # Errors
    /// An unknown parameter or a value that does not parse, named.
    pub fn from_query(query: &str, now_unix_nano: u64) -> Result<(Self, bool), String> {
        let mut f = Filter::default();
        let mut follow = false;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let (k, v) = (k.as_ref(), v.into_owned());
            let time = |v: &str| {
                parse_time(v, now_unix_nano).ok_or_else(|| {
                    format!("{k}: {v:?} is not a time (RFC 3339, or a duration ago: 30s, 5m, 2h)")
                })
            };
            match k {
                "pod" => f.pod = Some(v),
                "namespace" => f.namespace = Some(v),
                "workload" => f.workload = Some(v),
                "service" => f.service = Some(v),
                "direction" => f.direction = Some(one_of(k, v, &["egress", "ingress", "node"])?),
                "verdict" => f.verdict = Some(one_of(k, v, &["forwarded", "dropped"])?),
                "kind" => f.kind = Some(one_of(k, v, &["start", "end", "drop"])?),
                "protocol" => f.protocol = Some(v),
                "port" => {
                    f.port = Some(
                        v.parse()
                            .map_err(|_| format!("port: {v:?} is not a port"))?,
                    );
                }
                "reason" => f.reason = Some(v),
                "since" => f.since_unix_nano = Some(time(&v)?),
                "until" => f.until_unix_nano = Some(time(&v)?),
                "last" => {
                    f.last = Some(
                        v.parse()
                            .map_err(|_| format!("last: {v:?} is not a count"))?,
                    );
                }
                "follow" => follow = matches!(v.as_str(), "" | "true" | "1"),
                _ => return Err(format!("unknown parameter {k:?}")),
            }
        }
        Ok((f, follow))
    }

    /// The query string that asks for this filter (`follow` added when asked).
    #[must_use]
    pub fn to_query(&self, follow: bool) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                query.append_pair(k, &v);
            }
        };
        put("pod", self.pod.clone());
        put("namespace", self.namespace.clone());
        put("workload", self.workload.clone());
        put("service", self.service.clone());
        put("direction", self.direction.clone());
        put("verdict", self.verdict.clone());
        put("kind", self.kind.clone());
        put("protocol", self.protocol.clone());
        put("port", self.port.map(|p| p.to_string()));
        put("reason", self.reason.clone());
        put("since", self.since_unix_nano.map(super::record::rfc3339));
        put("until", self.until_unix_nano.map(super::record::rfc3339));
        put("last", self.last.map(|n| n.to_string()));
        if follow {
            put("follow", Some("true".to_owned()));
        }
        query.finish()
    }
}

fn one_of(k: &str, v: String, allowed: &[&str]) -> Result<String, String> {
    if allowed.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(format!("{k}: {v:?} is not one of {}", allowed.join(", ")))
    }
}

/// A time: RFC 3339, or a duration ago (`90s`, `5m`, `2h`, `1d`).
#[must_use]
pub fn parse_time(v: &str, now_unix_nano: u64) -> Option<u64> {
    if let Ok(t) = v.parse::<jiff::Timestamp>() {
        return u64::try_from(t.as_nanosecond()).ok();
    }
    let (n, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return None,
    };
    Some(now_unix_nano.saturating_sub(secs.saturating_mul(1_000_000_000)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

    use super::*;
    use crate::agent::flows::record::Endpoint;

    fn flow(t: u64, src: (&str, &str), verdict: &str, port: u16) -> Flow {
        Flow {
            time_unix_nano: t,
            kind: if verdict == "dropped" {
                "drop"
            } else {
                "start"
            }
            .to_owned(),
            verdict: verdict.to_owned(),
            direction: "egress".to_owned(),
            protocol: "TCP".to_owned(),
            source: Endpoint {
                kind: "pod".to_owned(),
                namespace: Some(src.0.to_owned()),
                name: Some(src.1.to_owned()),
                workload: Some("Deployment/web".to_owned()),
                ..Endpoint::default()
            },
            destination: Endpoint {
                kind: "world".to_owned(),
                port,
                ..Endpoint::default()
            },
            ..Flow::default()
        }
    }

    #[test]
    fn the_window_keeps_the_latest_and_filters_them() {
        let w = Window::new(3);
        for i in 0..5 {
            w.push(flow(
                i,
                ("shop", "web"),
                if i % 2 == 0 { "forwarded" } else { "dropped" },
                80 + i as u16,
            ));
        }
        assert_eq!(w.len(), 3);
        let all = w.query(&Filter::default());
        assert_eq!(
            all.iter().map(|f| f.time_unix_nano).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        let (f, follow) = Filter::from_query("verdict=dropped&pod=shop%2Fweb", 0).unwrap();
        assert!(!follow);
        assert_eq!(w.query(&f).len(), 1);
        let (f, _) = Filter::from_query("workload=web&last=1&port=84", 0).unwrap();
        assert_eq!(w.query(&f)[0].time_unix_nano, 4);
        assert!(Filter::from_query("colour=red", 0)
            .unwrap_err()
            .contains("colour"));
        assert!(Filter::from_query("verdict=maybe", 0)
            .unwrap_err()
            .contains("forwarded"));
    }

    #[test]
    fn a_query_string_round_trips_and_times_are_relative_or_absolute() {
        let now = 10_000_000_000_000;
        let (f, follow) = Filter::from_query("since=5m&namespace=a%20b&follow=true", now).unwrap();
        assert!(follow);
        assert_eq!(f.since_unix_nano, Some(now - 300_000_000_000));
        assert_eq!(f.namespace.as_deref(), Some("a b"));
        let (back, _) = Filter::from_query(&f.to_query(false), now).unwrap();
        assert_eq!(back, f);
        assert_eq!(
            parse_time("2026-11-30T00:00:00Z", 0),
            Some(1_795_996_800_000_000_000)
        );
    }

    #[tokio::test]
    async fn a_follower_that_falls_behind_loses_the_oldest_and_never_blocks() {
        let w = Window::new(10);
        let mut rx = w.follow();
        for i in 0..(FOLLOWER_BACKLOG as u64 + 10) {
            w.push(flow(i, ("a", "b"), "forwarded", 1));
        }
        match rx.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("{other:?}"),
        }
        assert_eq!(rx.recv().await.unwrap().time_unix_nano, 10);
    }
}
