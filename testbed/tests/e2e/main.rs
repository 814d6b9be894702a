//! The end-to-end tests: the real binary on simulated nodes (network namespaces), with
//! the real agent, kube-proxy's rules, containerd and the stand-in API server where a test
//! needs them. One module per feature; what they share is the testbed crate's. Most need
//! root and are listed as ignored by plain `cargo test`: `cargo xtask test` runs them all.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    reason = "tests fail by panicking with a message"
)]

mod agent;
mod apiserver;
mod bandwidth;
mod churn;
mod cnp_conformance;
mod connectivity;
mod crash;
#[cfg(feature = "cri")]
mod cri;
mod datapath;
mod del_check;
mod domain_names;
mod faults;
mod harness;
mod host_gw;
mod image;
mod inspect;
mod interface;
mod kubernetes;
mod leak;
mod libcni;
mod logging;
mod metrics;
mod nat_share;
mod netkit;
mod netpol;
mod node_lookup;
mod observe;
mod services;
mod source_guard;
mod status_gc;
mod tunnel;
mod upgrade;
mod wireguard;
