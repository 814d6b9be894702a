//! cni-ebpf: an eBPF-accelerated CNI interface plugin.
//!
//! The binary runs as a CNI plugin when `CNI_COMMAND` is set and as a CLI otherwise.
//! Layout, from the bottom up:
//! - [`kernel`]: kernel plumbing — network namespaces, links, addresses, routes, tc and
//!   neighbour discovery over netlink;
//! - [`cni`] (the protocol: configuration, environment, results), [`ipam`] (the embedded
//!   allocator), [`k8s`] (the API server client and its objects);
//! - [`datapath`]: the eBPF programs loaded, pinned and attached, and their maps;
//! - [`policy`]: NetworkPolicy compiled to the datapath's tables;
//! - [`verbs`]: the CNI verbs (ADD, DEL, CHECK, GC, STATUS, VERSION);
//! - [`agent`]: the node agent, the DaemonSet's long-running process;
//! - [`cli`]: the command line, which parses and dispatches.
//!
//! Nothing imports a module above it: the verbs and the datapath never reach into the
//! agent, and only [`cli`] sees them all.

pub mod agent;
pub mod cli;
pub mod cni;
pub mod datapath;
pub mod error;
pub mod faults;
pub mod ipam;
pub mod k8s;
pub mod kernel;
pub mod logging;
pub mod policy;
pub mod tls;
pub mod verbs;

pub use error::{Error, Result};
