//! The flows' metrics: records by namespace pair, kind and verdict, and drops by reason,
//! counted by the flow reader as records are made and served with `/metrics`.
//!
//! Label cardinality is bounded: a family holds at most [`MAX_SERIES`] label sets; a
//! record whose label set would be a new one beyond that is counted under
//! `source_namespace="other", destination_namespace="other"` (its kind, verdict and
//! reason kept). A side that is not a pod or Service has its kind as its namespace
//! (`world`, `node`). What the datapath held back (the rate limit, a full ring) is
//! `cni_ebpf_reason_packets_total{reason="flow_event_rate_limited"}` and
//! `{reason="flow_event_ring_full"}`.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use super::record::{Endpoint, Flow};
use crate::agent::metrics::render::Family;

/// Label sets a family holds at most.
pub const MAX_SERIES: usize = 2_000;

/// Separates the labels of a series' key (never in a namespace, kind, verdict or
/// reason).
const SEP: char = '\u{1f}';

/// What the flow reader counted, by series: the key is the series' label values joined
/// by [`SEP`] — records: source namespace, destination namespace, kind, verdict; drops:
/// source namespace, destination namespace, reason. One string, so that a record of a
/// series already counted is looked up without a copy of its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTotals {
    pub records: BTreeMap<String, u64>,
    pub drops: BTreeMap<String, u64>,
    /// Records in the window, and its capacity.
    pub window: (u64, u64),
    /// Where a record's key is written.
    scratch: String,
}

/// [`FlowTotals`] shared by the reader and the exporter.
pub type SharedFlowTotals = Arc<Mutex<FlowTotals>>;

fn namespace(e: &Endpoint) -> &str {
    e.namespace.as_deref().unwrap_or(&e.kind)
}

/// Writes the key of label values `labels` into `out`.
fn key_of(out: &mut String, labels: &[&str]) {
    out.clear();
    for (i, l) in labels.iter().enumerate() {
        if i > 0 {
            out.push(SEP);
        }
        out.push_str(l);
    }
}

/// Counts the series `labels` in `map`, under the "other" pair (the labels after the
/// first two kept) once the map is full.
fn bump(map: &mut BTreeMap<String, u64>, scratch: &mut String, labels: &mut [&str]) {
    key_of(scratch, labels);
    if let Some(n) = map.get_mut(scratch.as_str()) {
        *n += 1;
        return;
    }
    if map.len() >= MAX_SERIES {
        labels[0] = "other";
        labels[1] = "other";
        key_of(scratch, labels);
        if let Some(n) = map.get_mut(scratch.as_str()) {
            *n += 1;
            return;
        }
    }
    map.insert(scratch.clone(), 1);
}

impl FlowTotals {
    /// Counts one record.
    pub fn count(&mut self, f: &Flow) {
        let (src, dst) = (namespace(&f.source), namespace(&f.destination));
        bump(
            &mut self.records,
            &mut self.scratch,
            &mut [src, dst, &f.kind, &f.verdict],
        );
        if f.kind == "drop" {
            let reason = f.reason.as_deref().unwrap_or_default();
            bump(&mut self.drops, &mut self.scratch, &mut [src, dst, reason]);
        }
    }
}

/// The label values of series key `key`, `N` of them (missing ones empty).
fn labels<const N: usize>(key: &str) -> [&str; N] {
    let mut out = [""; N];
    for (slot, v) in out.iter_mut().zip(key.split(SEP)) {
        *slot = v;
    }
    out
}

/// The families of `t`.
#[must_use]
pub fn families(t: &FlowTotals) -> Vec<Family> {
    let mut records = Family::counter(
        "cni_ebpf_flow_records_total",
        "Flow records the node made (a start, an end, a drop), by the namespaces of their \
         source and destination (world, node: not a pod's), kind and verdict.",
    );
    for (key, n) in &t.records {
        let [src, dst, kind, verdict] = labels(key);
        records.push(
            &[
                ("source_namespace", src),
                ("destination_namespace", dst),
                ("kind", kind),
                ("verdict", verdict),
            ],
            *n,
        );
    }
    let mut drops = Family::counter(
        "cni_ebpf_flow_drops_total",
        "Flows the datapath dropped (each reported once per flow and reason), by the \
         namespaces of their source and destination and the drop reason.",
    );
    for (key, n) in &t.drops {
        let [src, dst, reason] = labels(key);
        drops.push(
            &[
                ("source_namespace", src),
                ("destination_namespace", dst),
                ("reason", reason),
            ],
            *n,
        );
    }
    let mut window = Family::gauge(
        "cni_ebpf_flow_window_records",
        "Flow records the node keeps for queries (at most --flow-window).",
    );
    window.push(&[], t.window.0);
    let mut capacity = Family::gauge(
        "cni_ebpf_flow_window_capacity",
        "The most flow records the node keeps (--flow-window).",
    );
    capacity.push(&[], t.window.1);
    vec![records, drops, window, capacity]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(src_ns: &str, kind: &str) -> Flow {
        let mut f = Flow {
            kind: kind.to_owned(),
            verdict: if kind == "drop" {
                "dropped"
            } else {
                "forwarded"
            }
            .to_owned(),
            reason: (kind == "drop").then(|| "drop_policy_ingress".to_owned()),
            ..Flow::default()
        };
        f.source.namespace = Some(src_ns.to_owned());
        f.source.kind = "pod".to_owned();
        f.destination.kind = "world".to_owned();
        f
    }

    #[test]
    fn records_are_counted_by_namespace_pair_and_bounded() {
        let mut t = FlowTotals::default();
        t.count(&flow("shop", "start"));
        t.count(&flow("shop", "start"));
        t.count(&flow("shop", "drop"));
        let key = |labels: &[&str]| labels.join(&SEP.to_string());
        assert_eq!(t.records[&key(&["shop", "world", "start", "forwarded"])], 2);
        assert_eq!(t.drops[&key(&["shop", "world", "drop_policy_ingress"])], 1);
        assert_eq!(t.drops.values().sum::<u64>(), 1);
        for i in 0..MAX_SERIES + 50 {
            t.count(&flow(&format!("ns{i}"), "start"));
        }
        assert!(t.records.len() <= MAX_SERIES + 1, "{}", t.records.len());
        assert!(t.records[&key(&["other", "other", "start", "forwarded"])] >= 50);
        let text: Vec<_> = families(&t).iter().map(|f| f.name).collect();
        assert_eq!(
            text,
            [
                "cni_ebpf_flow_records_total",
                "cni_ebpf_flow_drops_total",
                "cni_ebpf_flow_window_records",
                "cni_ebpf_flow_window_capacity"
            ]
        );
    }
}
