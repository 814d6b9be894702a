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

/// (source namespace, destination namespace, kind, verdict).
type RecordKey = (String, String, String, String);
/// (source namespace, destination namespace, reason).
type DropKey = (String, String, String);

/// What the flow reader counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTotals {
    pub records: BTreeMap<RecordKey, u64>,
    pub drops: BTreeMap<DropKey, u64>,
    /// Records in the window, and its capacity.
    pub window: (u64, u64),
}

/// [`FlowTotals`] shared by the reader and the exporter.
pub type SharedFlowTotals = Arc<Mutex<FlowTotals>>;

fn namespace(e: &Endpoint) -> String {
    e.namespace.clone().unwrap_or_else(|| e.kind.clone())
}

/// Counts `key` in `map`, under the "other" pair once the map is full.
fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K, other: impl FnOnce() -> K) {
    if map.len() < MAX_SERIES || map.contains_key(&key) {
        *map.entry(key).or_default() += 1;
    } else {
        *map.entry(other()).or_default() += 1;
    }
}

impl FlowTotals {
    /// Counts one record.
    pub fn count(&mut self, f: &Flow) {
        let (src, dst) = (namespace(&f.source), namespace(&f.destination));
        let other = || "other".to_owned();
        bump(
            &mut self.records,
            (src.clone(), dst.clone(), f.kind.clone(), f.verdict.clone()),
            || (other(), other(), f.kind.clone(), f.verdict.clone()),
        );
        if f.kind == "drop" {
            let reason = f.reason.clone().unwrap_or_default();
            bump(&mut self.drops, (src, dst, reason.clone()), || {
                (other(), other(), reason)
            });
        }
    }
}

/// The families of `t`.
#[must_use]
pub fn families(t: &FlowTotals) -> Vec<Family> {
    let mut records = Family::counter(
        "cni_ebpf_flow_records_total",
        "Flow records the node made (a start, an end, a drop), by the namespaces of their \
         source and destination (world, node: not a pod's), kind and verdict.",
    );
    for ((src, dst, kind, verdict), n) in &t.records {
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
    for ((src, dst, reason), n) in &t.drops {
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
        let key = |k: &str, v: &str| {
            (
                "shop".to_owned(),
                "world".to_owned(),
                k.to_owned(),
                v.to_owned(),
            )
        };
        assert_eq!(t.records[&key("start", "forwarded")], 2);
        assert_eq!(t.drops.values().sum::<u64>(), 1);
        for i in 0..MAX_SERIES + 50 {
            t.count(&flow(&format!("ns{i}"), "start"));
        }
        assert!(t.records.len() <= MAX_SERIES + 1, "{}", t.records.len());
        let other = (
            "other".to_owned(),
            "other".to_owned(),
            "start".to_owned(),
            "forwarded".to_owned(),
        );
        assert!(t.records[&other] >= 50);
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
