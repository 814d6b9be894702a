//! NetworkPolicy: from the API's objects to what the datapath enforces.
//!
//! - [`selector`]: label selectors;
//! - [`cluster`]: the view of namespaces and pods that policies are compiled against;
//! - [`compile`]: the API's semantics, from policies to each pod's rule sets;
//! - [`tables`]: the form a rule set takes in the datapath (longest-prefix-match tables
//!   of peers and ports joined by class bits) and its lookup.

pub mod cluster;
pub mod compile;
pub mod selector;
pub mod tables;

pub use cluster::{Cluster, PodView};
pub use compile::{compile_pod, parse_all, BrokenPolicy, Dir, PodPolicy, Policy, Verdicts};
pub use tables::Ruleset;
