//! cni-ebpf: an eBPF-accelerated CNI interface plugin.
//!
//! The binary runs as a CNI plugin when `CNI_COMMAND` is set and as a CLI otherwise.
//! Layout: [`cni`] (protocol), [`ipam`] (embedded allocator), [`netns`] and [`link`]
//! (kernel plumbing), [`datapath`] (eBPF load/pin/attach/maps), [`cmd`] (the verbs),
//! [`cli`] (the command line), [`metrics`] (the Prometheus endpoint of `cni-ebpf metrics`), [`k8s`] (Node objects
//! from the API server, for `install` and host-gw), [`policy`] (NetworkPolicy compiled to
//! the datapath's tables).

pub mod agent;
pub mod cli;
pub mod cmd;
pub mod cni;
pub mod datapath;
pub mod error;
pub mod faults;
pub mod ipam;
pub mod k8s;
pub mod logging;
pub mod metrics;
pub mod policy;

pub use error::{Error, Result};
pub mod link;
pub mod ndp;
pub mod netns;
pub mod tc;
