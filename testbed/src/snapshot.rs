//! Snapshots of a namespace's links, addresses and routes (both families), for leak
//! checks: take one before, one after, and compare.

use std::{collections::BTreeSet, fmt, path::Path};

use serde_json::Value;

use crate::process::ip_json;

/// Fields that change without anyone leaking anything (counters, timers, indexes that
/// the kernel hands out anew).
const VOLATILE: &[&str] = &[
    "ifindex",
    "link_index",
    "valid_life_time",
    "preferred_life_time",
    "expires",
    "operstate",
    "stats",
    "stats64",
    "link_netnsid",
    "protinfo",
];

/// The normalised kernel state of one network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `ip -j link show`, one normalised line per link.
    pub links: BTreeSet<String>,
    /// `ip -j addr show`, one line per (link, address).
    pub addrs: BTreeSet<String>,
    /// `ip -j -4/-6 route show table all`, one normalised line per route.
    pub routes: BTreeSet<String>,
}

fn normalise(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), normalise(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalise).collect()),
        other => other.clone(),
    }
}

fn lines(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .map(|a| a.iter().map(|e| normalise(e).to_string()).collect())
        .unwrap_or_default()
}

impl Snapshot {
    /// Reads the state of the namespace at `netns`.
    #[track_caller]
    #[must_use]
    pub fn take(netns: &Path) -> Self {
        let links = lines(&ip_json(netns, &["link", "show"]));
        let mut addrs = BTreeSet::new();
        for link in ip_json(netns, &["addr", "show"])
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = link.get("ifname").and_then(Value::as_str).unwrap_or("?");
            for a in link
                .get("addr_info")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                addrs.insert(format!("{name} {}", normalise(a)));
            }
        }
        let mut routes = lines(&ip_json(netns, &["-4", "route", "show", "table", "all"]));
        routes.extend(lines(&ip_json(
            netns,
            &["-6", "route", "show", "table", "all"],
        )));
        Self {
            links,
            addrs,
            routes,
        }
    }

    /// What differs from `before`: `+ …` appeared, `- …` vanished.
    #[must_use]
    pub fn diff(&self, before: &Self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, b, a) in [
            ("link", &before.links, &self.links),
            ("addr", &before.addrs, &self.addrs),
            ("route", &before.routes, &self.routes),
        ] {
            out.extend(a.difference(b).map(|l| format!("+ {what} {l}")));
            out.extend(b.difference(a).map(|l| format!("- {what} {l}")));
        }
        out
    }

    /// Panics, listing the differences, unless the state equals `before`.
    #[track_caller]
    pub fn assert_same_as(&self, before: &Self) {
        let d = self.diff(before);
        assert!(d.is_empty(), "namespace state changed:\n{}", d.join("\n"));
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.links {
            writeln!(f, "link {l}")?;
        }
        for a in &self.addrs {
            writeln!(f, "addr {a}")?;
        }
        for r in &self.routes {
            writeln!(f, "route {r}")?;
        }
        Ok(())
    }
}
