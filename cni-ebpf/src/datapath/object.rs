//! The eBPF object embedded in the binary by `build.rs`.

use crate::error::{Error, Result};

/// The object file built from `cni-ebpf-bpf`, or empty when the binary was built without
/// the eBPF toolchain (`AYA_BUILD_SKIP=1` or no `bpf-linker`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cni-ebpf"));

/// The embedded object, or a clear error if this binary carries none.
pub fn bytes() -> Result<&'static [u8]> {
    if OBJECT.is_empty() {
        return Err(Error::datapath(
            "loading the eBPF programs",
            "this cni-ebpf binary was built without its eBPF object (AYA_BUILD_SKIP=1 or \
             bpf-linker missing at build time); rebuild with `cargo xtask build`",
        ));
    }
    Ok(OBJECT)
}

/// Whether this binary carries its eBPF object.
#[must_use]
pub fn is_embedded() -> bool {
    !OBJECT.is_empty()
}
