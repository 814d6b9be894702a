//! The hash behind deterministic names and ids.

/// 64-bit FNV-1a over `parts` joined by the byte `sep`: the one hash behind every
/// deterministic name, id and MAC (not security relevant). Its results are lasting
/// contracts — owner ids live in pinned maps, veth names and MACs on live interfaces — so
/// each user keeps its separator: 0 for owner ids, 0xff for interface names and MACs.
#[must_use]
pub fn fnv1a64(parts: &[&[u8]], sep: u8) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h ^= u64::from(sep);
            h = h.wrapping_mul(PRIME);
        }
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// Owner id of (container ID, ifname): [`fnv1a64`] of the two joined by a 0 byte. Never 0.
#[must_use]
pub fn owner_id(container_id: &[u8], ifname: &[u8]) -> u64 {
    match fnv1a64(&[container_id, ifname], 0) {
        0 => 1,
        h => h,
    }
}
