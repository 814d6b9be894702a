//! `cni-ebpf metrics`: a Prometheus endpoint over the pinned datapath, for the DaemonSet's
//! main container. It keeps no state of the datapath's own: every scrape opens each
//! network's pinned maps read-only, reads them and closes them again.
//!
//! - [`collect`]: one scrape's reading of the maps ([`collect::Snapshot`]) and the
//!   exporter that does it, logging and counting what it could not read;
//! - [`render`]: a snapshot as metric families — every metric is defined there — and the
//!   exporter as a `prometheus-client` collector, which writes the text format;
//! - [`server`]: the bounded HTTP/1 endpoint on hyper (`/metrics`, `/healthz`, `/ready`).
//!
//! Nothing here is reachable from the CNI verbs: the plugin's ADD/DEL/CHECK path neither
//! links a code path into it nor initialises anything of it.

pub mod collect;
pub mod render;
pub mod server;

pub use collect::{Exporter, NetworkSnapshot, Snapshot};
pub use server::serve;

/// Default listen address (the port the DaemonSet's manifest exposes).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9670";
