//! End to end through the eBPF datapath on the simulated node: the real binary, real
//! traffic between pod namespaces, the node and `ext`. One module per feature, its IPv4
//! and IPv6 cases together; what they share is the test-support crate's
//! (`testbed::datapath`).

mod flows;
mod forwarding;
mod hostports;
mod lifecycle;
mod verbs;
