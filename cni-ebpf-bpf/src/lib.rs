#![no_std]
//! Host-side shell of the eBPF crate. The programs live in `main.rs` and are only
//! built for `bpfel-unknown-none` (through `cni-ebpf/build.rs`).
