//! The CNI protocol: environment, configuration, results and versions.

pub mod config;
pub mod env;
pub mod result;
pub mod version;
