//! The Prometheus metrics of the datapath and the agent. They keep no state of the
//! datapath's own: every scrape opens each network's pinned maps read-only, reads them and
//! closes them again.
//!
//! - [`collect`]: one scrape's reading of the maps ([`collect::Snapshot`]) and the
//!   exporter that does it, logging and counting what it could not read;
//! - [`render`]: a snapshot as metric families, and the exporter as a
//!   `prometheus-client` collector, which writes the text format; the families themselves
//!   in [`network_families`] (each network's datapath) and [`agent_families`] (the agent's
//!   own state, its NetworkPolicy and WireGuard peers).
//!
//! They are served by the agent's HTTP endpoint ([`super::http`]). Nothing here is
//! reachable from the CNI verbs: the plugin's ADD/DEL/CHECK path neither links a code path
//! into it nor initialises anything of it.

mod agent_families;
pub mod collect;
#[cfg(test)]
mod fixture;
mod network_families;
pub mod render;

pub use collect::{Exporter, NetworkSnapshot, Snapshot};
