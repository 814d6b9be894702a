//! What an attachment's links are called and recognised by: the host veth's name and
//! alias, the derived MACs, the device groups of unlabelled and retired host ends (all
//! stable hashes of the attachment, so DEL and GC find them with no state), and which
//! link kinds are a pod's device pair.

use netlink_packet_route::link::InfoKind;

use super::Link;

/// `IFLA_INFO_KIND` of a netkit device.
pub const NETKIT: &str = "netkit";

/// Whether `link` is a veth.
#[must_use]
pub fn is_veth(link: &Link) -> bool {
    link.kind.as_deref() == Some(&InfoKind::Veth.to_string())
}

/// Whether `link` is a netkit device.
#[must_use]
pub fn is_netkit(link: &Link) -> bool {
    link.kind.as_deref() == Some(NETKIT)
}

/// Whether `link` may be an end of a pod's device pair: a veth or a netkit device.
#[must_use]
pub fn is_pod_pair_end(link: &Link) -> bool {
    is_veth(link) || is_netkit(link)
}

/// The hash of interface names and MACs: [`cni_ebpf_common::fnv1a64`] with 0xff between
/// the parts (a lasting contract: DEL and GC find existing pods' veths by it).
fn fnv1a(parts: &[&str]) -> u64 {
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
    cni_ebpf_common::fnv1a64(&bytes, 0xff)
}

/// The host-side veth name of an attachment: `ceb` + 12 hex digits of a hash of
/// (container ID, ifname). Stable across calls, so DEL and GC find it with no state;
/// 15 bytes, the kernel's limit.
#[must_use]
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    format!(
        "ceb{:012x}",
        fnv1a(&[container_id, ifname]) & 0xffff_ffff_ffff
    )
}

/// The name DEL gives the pod end of an attachment's veth pair inside the container
/// when it retires the pair, so that no interface of the attachment's `ifname` remains
/// there while the pair waits for its deletion: `cebr` + 11 hex digits of a hash of
/// (container ID, ifname), 15 bytes.
#[must_use]
pub fn retired_pod_end_name(container_id: &str, ifname: &str) -> String {
    format!(
        "cebr{:011x}",
        fnv1a(&["retired", container_id, ifname]) & 0x7ff_ffff_ffff
    )
}

/// The alias written on every host veth we create:
/// `cni-ebpf/<network>/<container ID>/<ifname>` (none of these may contain `/`). DEL and GC
/// delete a link only when its alias names the attachment they work for.
#[must_use]
pub fn host_veth_alias(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{}{container_id}/{ifname}", alias_prefix(network))
}

/// The alias prefix of every host veth of `network`.
#[must_use]
pub fn alias_prefix(network: &str) -> String {
    format!("cni-ebpf/{network}/")
}

/// A deterministic, locally administered unicast MAC for (container ID, ifname, role).
#[must_use]
pub fn derived_mac(container_id: &str, ifname: &str, role: &str) -> [u8; 6] {
    let h = fnv1a(&[container_id, ifname, role]).to_be_bytes();
    [(h[0] & 0xfe) | 0x02, h[1], h[2], h[3], h[4], h[5]]
}

/// The device group (`IFLA_GROUP`) a host veth of `network` carries from the request that
/// creates it until ADD labels it with its alias: the kernel takes a group, but no alias,
/// in the creating request, so this is what marks a pair that a killed ADD left unlabelled
/// as this network's (GC collects those: `cmd::unlabelled_veths`). Never 0, the default group.
#[must_use]
pub fn unlabelled_group(network: &str) -> u32 {
    // The low 32 bits of the hash; `| 1` keeps it off 0.
    (fnv1a(&["cni-ebpf unlabelled", network]) & 0xffff_ffff) as u32 | 1
}

/// The device group of a host veth of `network` that DEL has retired: set down (which
/// takes its routes with it) and left for the deleting process DEL starts (`cmd::del`).
/// Never 0 and never [`unlabelled_group`]. The whole group is deleted in one request, so
/// nothing else may ever be put in it.
#[must_use]
pub fn retired_group(network: &str) -> u32 {
    let g = (fnv1a(&["cni-ebpf retired", network]) & 0xffff_ffff) as u32 | 1;
    if g == unlabelled_group(network) {
        g ^ 2
    } else {
        g
    }
}

#[cfg(test)]
mod tests {
    use super::host_veth_name;

    /// Names and ids are lasting contracts: DEL and GC of a pod made by an older binary
    /// find its veth by name, and its map entries by owner id. Fixed values, computed
    /// once by the separate implementations these replaced.
    #[test]
    fn veth_names_and_owner_ids_never_change() {
        assert_eq!(host_veth_name("abc123", "eth0"), "ceb561682a75b5f");
        assert_eq!(
            cni_ebpf_common::owner_id(b"abc123", b"eth0"),
            0xd35a_c051_2423_e986
        );
    }
}
