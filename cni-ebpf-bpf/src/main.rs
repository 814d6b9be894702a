#![no_std]
#![no_main]
//! The tc programs of cni-ebpf.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use cni_ebpf_common::{Reason, REASON_SLOTS};

/// Per-CPU counters indexed by [`Reason`].
#[map]
static REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(REASON_SLOTS, 0);

#[inline(always)]
fn count(reason: Reason) {
    if let Some(slot) = REASONS.get_ptr_mut(reason as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Host veth ingress: traffic leaving a pod.
#[classifier]
pub fn from_pod(_ctx: TcContext) -> i32 {
    count(Reason::Seen);
    TC_ACT_OK
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
