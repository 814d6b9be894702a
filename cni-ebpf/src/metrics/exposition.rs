//! The Prometheus text exposition format, version 0.0.4: one `# HELP` and one `# TYPE`
//! line per metric family, then one line per sample, `name{label="value",…} number`.
//!
//! Written here rather than taken from a crate: `prometheus-client` speaks OpenMetrics
//! (`# EOF`, another content type) and, like `prometheus`, is built around a registry of
//! long-lived metric objects, where this exporter renders a fresh snapshot per scrape and
//! keeps no state. The format itself is a few escaping rules, tested below.

use std::fmt::Write as _;

/// `Content-Type` of a response in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the datapath is reloaded); name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Kind {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
        }
    }
}

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

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Self::Int(u64::try_from(v).unwrap_or(u64::MAX))
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
    /// Metric name (`cni_ebpf_…`).
    pub name: &'static str,
    /// One-line description.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
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
            kind: Kind::Counter,
            samples: Vec::new(),
        }
    }

    /// An empty gauge family.
    #[must_use]
    pub const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: Kind::Gauge,
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
}

/// Renders families in order. A family without samples is left out entirely (a series
/// that is gone leaves no trace).
#[must_use]
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(f.help));
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.as_str());
        for s in &f.samples {
            out.push_str(f.name);
            if !s.labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in s.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
                }
                out.push('}');
            }
            out.push(' ');
            write_value(&mut out, s.value);
            out.push('\n');
        }
    }
    out
}

fn write_value(out: &mut String, v: Value) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) if f.is_nan() => out.push_str("NaN"),
        Value::Float(f) if f.is_infinite() => {
            out.push_str(if f > 0.0 { "+Inf" } else { "-Inf" });
        }
        Value::Float(f) => {
            let _ = write!(out, "{f}");
        }
    }
}

/// `# HELP` text: backslash and line feed escaped.
#[must_use]
pub fn escape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A label value: backslash, double quote and line feed escaped.
#[must_use]
pub fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `name` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
#[must_use]
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not starting `__`).
#[must_use]
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_help_type_and_samples() {
        let mut c = Family::counter("x_packets_total", "Packets.");
        c.push(&[("network", "n1"), ("reason", "seen")], 7_u64);
        c.push(&[("network", "n1"), ("reason", "pass")], 0_u64);
        let mut g = Family::gauge("x_up", "Up.");
        g.push(&[], true);
        let mut d = Family::gauge("x_seconds", "Duration.");
        d.push(&[], 0.25);
        assert_eq!(
            render(&[c, g, d]),
            "# HELP x_packets_total Packets.\n\
             # TYPE x_packets_total counter\n\
             x_packets_total{network=\"n1\",reason=\"seen\"} 7\n\
             x_packets_total{network=\"n1\",reason=\"pass\"} 0\n\
             # HELP x_up Up.\n\
             # TYPE x_up gauge\n\
             x_up 1\n\
             # HELP x_seconds Duration.\n\
             # TYPE x_seconds gauge\n\
             x_seconds 0.25\n"
        );
    }

    #[test]
    fn a_family_without_samples_is_left_out() {
        let mut g = Family::gauge("x_a", "A.");
        g.push(&[], 1_u64);
        let out = render(&[Family::gauge("x_empty", "Nothing."), g]);
        assert!(!out.contains("x_empty"), "{out}");
        assert!(out.starts_with("# HELP x_a A.\n"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut g = Family::gauge("x", "h");
        g.push(&[("v", "a\\b\"c\nd")], 1_u64);
        assert!(
            render(&[g]).contains("x{v=\"a\\\\b\\\"c\\nd\"} 1\n"),
            "backslash, quote and newline escaped"
        );
        assert_eq!(escape_label_value("plain-ü 10.0.0.1"), "plain-ü 10.0.0.1");
    }

    #[test]
    fn help_is_escaped_but_keeps_quotes() {
        assert_eq!(escape_help("a \"q\" \\ b\nc"), "a \"q\" \\\\ b\\nc");
    }

    #[test]
    fn special_floats_use_prometheus_spelling() {
        let mut g = Family::gauge("x", "h");
        g.push(&[("k", "nan")], f64::NAN);
        g.push(&[("k", "inf")], f64::INFINITY);
        g.push(&[("k", "-inf")], f64::NEG_INFINITY);
        g.push(&[("k", "small")], 0.000_5);
        let out = render(&[g]);
        for line in [
            "x{k=\"nan\"} NaN\n",
            "x{k=\"inf\"} +Inf\n",
            "x{k=\"-inf\"} -Inf\n",
            "x{k=\"small\"} 0.0005\n",
        ] {
            assert!(out.contains(line), "{line:?} missing in {out}");
        }
    }

    #[test]
    fn name_rules() {
        assert!(valid_metric_name("cni_ebpf_up"));
        assert!(valid_metric_name("a:b_c9"));
        assert!(!valid_metric_name("9a"));
        assert!(!valid_metric_name("a-b"));
        assert!(!valid_metric_name(""));
        assert!(valid_label_name("pod_ip"));
        assert!(!valid_label_name("__name__"));
        assert!(!valid_label_name("a:b"));
        assert!(!valid_label_name("1a"));
    }
}
