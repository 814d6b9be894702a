//! The Prometheus metrics of the datapath and the agent. They keep no state of the
//! datapath's own: every scrape opens each network's pinned maps read-only, reads them and
//! closes them again.
//!
//! - [`collect`]: one scrape's reading of the maps ([`collect::Snapshot`]) and the
//!   exporter that does it, logging and counting what it could not read;
//! - [`render`]: a snapshot as metric families — every metric is defined there — and the
//!   exporter as a `prometheus-client` collector, which writes the text format.
//!
//! They are served by the agent's HTTP endpoint ([`super::http`]). Nothing here is
//! reachable from the CNI verbs: the plugin's ADD/DEL/CHECK path neither links a code path
//! into it nor initialises anything of it.

pub mod collect;
pub mod render;

pub use collect::{Exporter, NetworkSnapshot, Snapshot};
