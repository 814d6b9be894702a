//! The eBPF object embedded in the binary by `build.rs`.

use crate::error::{Error, Result};

/// The object file built from `cni-ebpf-bpf`, or empty when the binary was built without
/// it (`AYA_BUILD_SKIP=1`, or without the `ebpf` feature).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cni-ebpf"));

/// The embedded object, or a clear error if this binary carries none.
pub fn bytes() -> Result<&'static [u8]> {
    if OBJECT.is_empty() {
        return Err(Error::datapath(
            "loading the eBPF programs",
            "this cni-ebpf binary was built without its eBPF object (AYA_BUILD_SKIP=1, or \
             without the `ebpf` feature); rebuild with `cargo xtask build`",
        ));
    }
    Ok(OBJECT)
}

/// Whether this binary carries its eBPF object.
#[must_use]
pub fn is_embedded() -> bool {
    !OBJECT.is_empty()
}

/// The identity of the embedded object: `object-<major>_<minor>_<patch>-<hash of the
/// object>` (bpffs refuses names with a `.`), the name of the marker directory a load
/// pins next to the programs (`pins.rs`). The test build (`fault-injection`) appends
/// `$CNI_EBPF_OBJECT_SALT`, so that the tests can play a second build without compiling
/// one.
#[must_use]
pub fn stamp() -> String {
    let version = env!("CARGO_PKG_VERSION").replace('.', "_");
    let base = format!("object-{version}-{}", env!("CNI_EBPF_OBJECT_HASH"));
    #[cfg(feature = "fault-injection")]
    if let Ok(salt) = std::env::var("CNI_EBPF_OBJECT_SALT") {
        return format!("{base}{salt}");
    }
    base
}

/// The crate version a stamp names, as (major, minor, patch); `None` if it names none.
#[must_use]
pub fn stamp_version(stamp: &str) -> Option<(u64, u64, u64)> {
    let rest = stamp.strip_prefix("object-")?;
    let (version, _) = rest.split_once('-')?;
    let mut it = version.split('_').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

#[cfg(test)]
mod tests {
    use super::{stamp, stamp_version};

    #[test]
    fn a_stamp_names_its_version() {
        assert_eq!(stamp_version("object-1_22_3-00ff"), Some((1, 22, 3)));
        assert!(
            !stamp().contains('.'),
            "bpffs refuses names with a dot: {}",
            stamp()
        );
        assert_eq!(stamp_version("object-x-00ff"), None);
        assert_eq!(stamp_version("v3"), None);
        assert!(stamp_version(&stamp()).is_some(), "{}", stamp());
    }
}
