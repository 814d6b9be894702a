#![no_std]
//! Types shared by the eBPF programs (`cni-ebpf-bpf`) and userspace (`cni-ebpf`).
//!
//! Every map key/value is `#[repr(C)]` with explicit padding and a compile-time size
//! check; the byte order of each field is written in its doc comment.

/// Decision and drop reasons counted per CPU in the `REASONS` map (index = value).
/// Values start at 16 so they never collide with `TC_ACT_*` verdicts.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Packet seen by a program at all.
    Seen = 16,
    /// Passed to the stack unchanged (not ours, or not IP).
    PassNotIp = 17,
    /// Passed: malformed or truncated header.
    PassMalformed = 18,
}

/// Number of slots in the reasons map (must exceed every [`Reason`] value).
pub const REASON_SLOTS: u32 = 64;
