//! NetworkPolicy and cluster policies: from the API's objects to what the datapath
//! enforces.
//!
//! - [`selector`]: label selectors;
//! - [`cluster`]: the view of namespaces and pods that policies are compiled against;
//! - [`compile`]: NetworkPolicy's semantics, and every policy of a pod, tier by tier, to
//!   its rule sets;
//! - [`cluster_network_policy`]: `ClusterNetworkPolicy` (Admin and Baseline tiers), read
//!   and checked;
//! - [`classes`]: rules in evaluation order to classes, tables and tiers;
//! - [`tables`]: the form a rule set takes in the datapath (longest-prefix-match tables
//!   of peers and ports joined by class bits) and its lookup.

pub mod classes;
pub mod cluster;
pub mod cluster_network_policy;
pub mod compile;
pub mod selector;
pub mod tables;

pub use cluster::{Cluster, PodView};
pub use compile::{
    compile, compile_pod, parse_all, BrokenPolicy, Dir, PodPolicy, Policies, Policy, Verdicts,
};
pub use tables::Ruleset;
