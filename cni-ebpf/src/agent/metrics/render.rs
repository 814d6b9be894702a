//! A [`Snapshot`] as metric families (every metric is listed in docs/operations.md,
//! "Metrics"): the exporter's own here, the networks' in [`super::network_families`], the
//! agent's in [`super::agent_families`], the flows' in `agent::flows::metrics`.
//! `prometheus-client` writes them in the Prometheus text format (0.0.4): [`Exporter`] is
//! its [`Collector`], reading the maps anew for every scrape, so the registry holds no
//! metric state of its own.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    agent_families::{agent_families, policy_families, wireguard_families},
    collect::{Exporter, Snapshot},
    network_families::network_families,
};

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// An integer (counters, counts, bytes).
    Int(u64),
    /// A float (durations).
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Self::Int(u64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

/// One sample: label pairs (in output order) and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// `(name, value)` pairs; names are static identifiers, values anything.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Value,
}

/// A metric family: name, help, type and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Metric name as served (`cni_ebpf_…`; a counter's ends in `_total`).
    pub name: &'static str,
    /// One-line description.
    pub help: &'static str,
    /// [`MetricType::Counter`] or [`MetricType::Gauge`].
    pub kind: MetricType,
    /// Samples, in output order.
    pub samples: Vec<Sample>,
}

impl Family {
    /// An empty counter family.
    #[must_use]
    pub const fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Counter,
            samples: Vec::new(),
        }
    }

    /// An empty gauge family.
    #[must_use]
    pub const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Gauge,
            samples: Vec::new(),
        }
    }

    /// Adds a sample.
    pub fn push(&mut self, labels: &[(&'static str, &str)], value: impl Into<Value>) {
        self.samples.push(Sample {
            labels: labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            value: value.into(),
        });
    }

    /// Writes the family through `encoder`; a family without samples is left out entirely
    /// (a series that is gone leaves no trace).
    pub(super) fn encode(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        if self.samples.is_empty() {
            return Ok(());
        }
        // The encoder appends `_total` to a counter's name itself.
        let name = match self.kind {
            MetricType::Counter => self.name.strip_suffix("_total").unwrap_or(self.name),
            _ => self.name,
        };
        let mut family = encoder.encode_descriptor(name, self.help, None, self.kind)?;
        for s in &self.samples {
            let sample = family.encode_family(&s.labels)?;
            match (self.kind, s.value) {
                (MetricType::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                (MetricType::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                (_, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                (_, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
            }
        }
        Ok(())
    }
}

/// Every scrape reads the maps and writes what it read.
impl Collector for Exporter {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        families(&self.scrape())
            .iter()
            .try_for_each(|f| f.encode(&mut encoder))
    }
}

/// A registry of `collector` alone.
#[must_use]
pub fn registry(collector: impl Collector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    registry
}

/// What `registry` reports, in the Prometheus text format (0.0.4).
///
/// # Errors
/// A value the format cannot hold.
pub fn text(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

/// Every family of the snapshot, in output order (families without samples included;
/// the encoding leaves them out).
#[must_use]
pub fn families(s: &Snapshot) -> Vec<Family> {
    let mut out = Vec::new();

    let mut f = Family::gauge(
        "cni_ebpf_build_info",
        "Always 1: the version of the cni-ebpf binary serving these metrics.",
    );
    f.push(&[("version", env!("CARGO_PKG_VERSION"))], 1_u64);
    out.push(f);
    let mut f = Family::gauge(
        "cni_ebpf_scrape_duration_seconds",
        "How long reading the pinned maps took for this scrape.",
    );
    f.push(&[], s.duration.as_secs_f64());
    out.push(f);
    let mut f = Family::counter(
        "cni_ebpf_discovery_errors_total",
        "Scrapes that could not list the networks below the bpffs root (see the log).",
    );
    if let Some(n) = s.discovery_errors_total {
        f.push(&[], n);
    }
    out.push(f);

    out.extend(network_families(&s.networks));
    if let Some(p) = &s.policy {
        out.extend(policy_families(p));
    }
    if let Some(a) = &s.agent {
        out.extend(agent_families(a));
    }
    if let Some(peers) = &s.wireguard {
        out.extend(wireguard_families(peers));
    }
    if let Some(t) = &s.flows {
        out.extend(crate::agent::flows::metrics::families(t));
    }
    out
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests")]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::agent::metrics::fixture::{encode, render, sample};

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    fn valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting `__` (reserved).
    fn valid_label_name(name: &str) -> bool {
        let mut chars = name.chars();
        !name.starts_with("__")
            && chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    #[test]
    fn families_are_written_in_the_text_format_in_order() {
        let mut c = Family::counter("x_packets_total", "Packets.");
        c.push(&[("network", "n1"), ("reason", "seen")], 7_u64);
        c.push(&[("network", "n1"), ("reason", "pass")], 0_u64);
        let mut g = Family::gauge("x_up", "Up (\"quoted\").");
        g.push(&[], true);
        let mut d = Family::gauge("x_seconds", "Duration.");
        d.push(&[], 0.25);
        let empty = Family::gauge("x_empty", "Nothing.");
        assert_eq!(
            encode(vec![c, empty, g, d]),
            "# HELP x_packets_total Packets.\n\
             # TYPE x_packets_total counter\n\
             x_packets_total{network=\"n1\",reason=\"seen\"} 7\n\
             x_packets_total{network=\"n1\",reason=\"pass\"} 0\n\
             # HELP x_up Up (\"quoted\").\n\
             # TYPE x_up gauge\n\
             x_up 1\n\
             # HELP x_seconds Duration.\n\
             # TYPE x_seconds gauge\n\
             x_seconds 0.25\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut g = Family::gauge("x", "h");
        g.push(&[("v", "a\\b\"c\nd"), ("w", "plain-ü 10.0.0.1")], 1_u64);
        assert_eq!(
            encode(vec![g]),
            "# HELP x h\n# TYPE x gauge\nx{v=\"a\\\\b\\\"c\\nd\",w=\"plain-ü 10.0.0.1\"} 1\n"
        );
    }

    #[test]
    fn every_family_follows_the_naming_rules() {
        let fams = families(&sample());
        let mut names = BTreeSet::new();
        for f in &fams {
            assert!(names.insert(f.name), "{} defined twice", f.name);
            assert!(valid_metric_name(f.name), "{}", f.name);
            assert!(f.name.starts_with("cni_ebpf_"), "{}", f.name);
            assert!(
                !f.help.is_empty() && !f.help.contains('\n') && !f.help.contains("  "),
                "{}: {:?}",
                f.name,
                f.help
            );
            match f.kind {
                MetricType::Counter => assert!(f.name.ends_with("_total"), "{}", f.name),
                MetricType::Gauge => assert!(!f.name.ends_with("_total"), "{}", f.name),
                other => panic!("{}: {other:?}", f.name),
            }
            // Every sample has the same label names, valid ones, and a distinct label set.
            let mut sets = BTreeSet::new();
            let first: Option<Vec<&str>> = f
                .samples
                .first()
                .map(|s| s.labels.iter().map(|(k, _)| *k).collect());
            for s in &f.samples {
                let keys: Vec<&str> = s.labels.iter().map(|(k, _)| *k).collect();
                if f.name != "cni_ebpf_endpoint_egress_rate_bytes_per_second" {
                    assert_eq!(Some(&keys), first.as_ref(), "{}", f.name);
                }
                for k in &keys {
                    assert!(valid_label_name(k), "{}: label {k}", f.name);
                }
                assert!(
                    sets.insert(s.labels.clone()),
                    "{}: duplicate series {:?}",
                    f.name,
                    s.labels
                );
            }
        }
        // Units as suffixes.
        for n in names
            .iter()
            .filter(|n| n.contains("bytes") || n.contains("packets"))
        {
            assert!(
                n.ends_with("_bytes")
                    || n.ends_with("_bytes_per_second")
                    || n.ends_with("_bytes_total")
                    || n.ends_with("_packets_total"),
                "{n}"
            );
        }
    }

    #[test]
    fn every_line_is_a_comment_or_a_sample_of_the_family_announced_before_it() {
        let out = render(&sample());
        let mut current = "";
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                current = rest.split(' ').next().unwrap_or_default();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next(), Some(current), "{line}");
                assert!(matches!(it.next(), Some("counter" | "gauge")), "{line}");
            } else {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                assert_eq!(name, current, "sample outside its family: {line}");
                let value = line.rsplit(' ').next().unwrap_or_default();
                assert!(value.parse::<f64>().is_ok(), "bad value: {line}");
            }
        }
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn an_empty_node_still_reports_the_exporter() {
        let out = render(&Snapshot::default());
        assert!(out.contains("cni_ebpf_build_info{"), "{out}");
        assert!(!out.contains("cni_ebpf_up"), "{out}");
        assert!(
            !out.contains("cni_ebpf_discovery_errors_total"),
            "named networks: {out}"
        );
    }
}
