//! Map types of the tunnel between nodes (`crossNode` `tunnel` and `crossSubnet`): see
//! `cni-ebpf-bpf/src/tunnel.rs` for the programs and `cni-ebpf/src/agent/nodes.rs` for who
//! keeps the map.

use core::mem::size_of;

/// Capacity of [`crate::map::TUNNEL_ENDPOINTS`]: pod CIDRs of the other nodes.
pub const MAX_TUNNEL_ENDPOINTS: u32 = 16_384;
/// Capacity of [`crate::map::TUNNEL_NODES`].
pub const MAX_TUNNEL_NODES: u32 = 16_384;

/// The UDP port of the node's VXLAN device unless configured (Linux's VXLAN default, and
/// flannel's).
pub const DEFAULT_TUNNEL_PORT: u16 = 8472;

/// Bytes a VXLAN encapsulation adds over an IPv4 underlay (outer IPv4 20, UDP 8, VXLAN
/// 8, inner Ethernet 14).
pub const VXLAN_OVERHEAD4: u32 = 50;
/// Bytes it adds over an IPv6 underlay (outer IPv6 40).
pub const VXLAN_OVERHEAD6: u32 = 70;

/// The UDP port of the node's WireGuard device unless configured (`wireguardPort`;
/// Calico's and flannel's default is 51820, Cilium's 51871: this one avoids both).
pub const DEFAULT_WIREGUARD_PORT: u16 = 51_872;

/// Bytes WireGuard adds to a packet over an IPv4 underlay (outer IPv4 20, UDP 8,
/// WireGuard's header 16 and authentication tag 16).
pub const WIREGUARD_OVERHEAD4: u32 = 60;
/// Bytes it adds over an IPv6 underlay (outer IPv6 40).
pub const WIREGUARD_OVERHEAD6: u32 = 80;

/// Capacity of [`crate::map::WIREGUARD_PEERS`]: the other nodes' pod CIDRs.
pub const MAX_WIREGUARD_PEERS: u32 = 16_384;

/// Value of [`crate::map::WIREGUARD_PEERS`] (key: a [`TunnelKey`] prefix).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WireguardPeer {
    /// [`WIREGUARD_KEYED`]; native order.
    pub flags: u32,
}
const _: () = assert!(size_of::<WireguardPeer>() == 4);

/// [`WireguardPeer::flags`]: the node has published its key and is a peer of the node's
/// WireGuard device; without it the node is known but keyless.
pub const WIREGUARD_KEYED: u32 = 1;

/// Data of a [`crate::map::TUNNEL_ENDPOINTS`] key (an LPM trie; prefix length = 0..=128
/// bits of the address).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TunnelKey {
    /// A pod address, IPv6 or IPv4-mapped IPv6 (`::ffff:a.b.c.d`), wire order.
    pub addr: [u8; 16],
}
const _: () = assert!(size_of::<TunnelKey>() == 16);

/// Value of [`crate::map::TUNNEL_ENDPOINTS`]: the node that holds a pod CIDR.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TunnelEndpoint {
    /// Its underlay address, IPv6 or IPv4-mapped IPv6, wire order.
    pub node: [u8; 16],
    /// [`TUNNEL_IPV6`] when `node` is an IPv6 address, native order.
    pub flags: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<TunnelEndpoint>() == 24);

/// [`TunnelEndpoint::flags`]: the node's underlay address is IPv6.
pub const TUNNEL_IPV6: u32 = 1;
