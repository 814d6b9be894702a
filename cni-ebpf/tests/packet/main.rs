//! eBPF packet tests: each program run through `BPF_PROG_TEST_RUN` with crafted packets,
//! the verdict and the rewritten bytes asserted, checksums verified by an independent
//! userspace implementation. One module per feature, its IPv4 and IPv6 cases together;
//! the fixture (the real object loaded into a private bpffs and network namespace) and the
//! IPv4 frames are the test-support crate's (`testbed::packet`), the IPv6 frames `frames6`.
//!
//! Root and the eBPF object are needed: run through `cargo xtask test`.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod frames6;

mod attach;
mod dns;
mod flows;
mod fuzz;
mod guard_cost;
mod hostport;
mod metrics;
mod nat;
mod natshare;
mod observe;
mod pacing;
mod policy;
mod routing;
mod source;
mod wireguard;
