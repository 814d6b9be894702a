//! `cni-ebpf agent`: the node agent, the DaemonSet's long-running process. Its jobs:
//! the Prometheus metrics of the datapath, the host-gw routes (opt-in), NetworkPolicy and,
//! opt-in, Services in place of kube-proxy.
//!
//! - [`reconcile`]: one NetworkPolicy round over the pinned maps, changing only what
//!   differs;
//! - [`watch`]: the watchers that keep the agent's view of the cluster, and the loop of
//!   rounds;
//! - [`report`]: the state file `inspect` reads, and the verdict totals per policy the
//!   metrics serve;
//! - [`nodes`]: the Node watcher: tunnel entries and direct routes to other nodes;
//! - [`services`]: Services translated at the socket, without kube-proxy (opt-in);
//! - [`ready`]: readiness (`GET /ready`): every job's first round made, every datapath
//!   loaded;
//! - [`liveness`]: liveness (`GET /healthz`): every job's loop and watchers still at work;
//! - [`datapaths`]: networks whose datapath appears on the node (a first ADD), so that
//!   every job acts on them at once.

pub mod datapaths;
pub mod health;
pub mod liveness;
pub mod nodes;
pub mod ready;
pub mod reconcile;
pub mod report;
pub mod service_objects;
pub mod service_table;
pub mod services;
pub mod watch;

pub use reconcile::{Reconciler, Round};
