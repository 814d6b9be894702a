//! Map types of Services translated without kube-proxy (the agent's
//! `--kube-proxy-replacement` mode): at the socket for the node and its pods (see
//! `cni-ebpf-bpf/src/sock.rs`), at the uplink for flows from outside the node (see
//! `cni-ebpf-bpf/src/nodeport.rs`); `cni-ebpf/src/agent/services.rs` keeps the maps.
//!
//! Addresses of both families share one layout: IPv6, or IPv4-mapped IPv6
//! (`::ffff:a.b.c.d`), wire order, as in the tunnel maps.

use core::mem::size_of;

/// Capacity of [`crate::map::SERVICES`]: Service frontends (address, port, protocol,
/// scope).
pub const MAX_SERVICES: u32 = 65_536;
/// Capacity of [`crate::map::SERVICE_BACKENDS`]: backend slots of every frontend.
pub const MAX_SERVICE_BACKENDS: u32 = 262_144;
/// Capacity of [`crate::map::SERVICE_AFFINITY`]: (client, frontend) pairs remembered for
/// `sessionAffinity: ClientIP` (an LRU).
pub const MAX_SERVICE_AFFINITY: u32 = 16_384;
/// Capacity of [`crate::map::SERVICE_NETNS`]: the pods' network namespaces.
pub const MAX_SERVICE_NETNS: u32 = 8192;
/// Most backends one frontend may have (a Service port with more is given this many).
pub const MAX_BACKENDS_PER_SERVICE: u32 = 4096;

/// [`ServiceKey::scope`]: a frontend the socket programs translate, for the node's own
/// processes and its pods (ClusterIPs, and the NodePorts, external IPs and load-balancer
/// addresses as reached from inside).
pub const SCOPE_SOCKET: u8 = 0;
/// [`ServiceKey::scope`]: a frontend the uplink translates, for new flows arriving from
/// outside the node (NodePorts, external IPs, load-balancer addresses).
pub const SCOPE_UPLINK: u8 = 1;

/// [`ServiceKey::addr`] of an IPv4 NodePort: any of the node's IPv4 addresses
/// (`::ffff:0.0.0.0`).
pub const ANY_NODE_ADDR4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0];
/// [`ServiceKey::addr`] of an IPv6 NodePort: any of the node's IPv6 addresses (`::`).
pub const ANY_NODE_ADDR6: [u8; 16] = [0; 16];

/// Key of [`crate::map::SERVICES`]: one frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The ClusterIP, external IP or load-balancer address, IPv6 or IPv4-mapped, wire
    /// order; a NodePort: [`ANY_NODE_ADDR4`] or [`ANY_NODE_ADDR6`].
    pub addr: [u8; 16],
    /// The Service port (or NodePort), network order.
    pub port: u16,
    /// IP protocol (`proto::TCP` or `proto::UDP`).
    pub proto: u8,
    /// [`SCOPE_SOCKET`] or [`SCOPE_UPLINK`].
    pub scope: u8,
}
const _: () = assert!(size_of::<ServiceKey>() == 20);

/// Value of [`crate::map::SERVICES`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Service {
    /// The frontend's id, the first half of its [`BackendSlot`]s' keys; stable while the
    /// frontend exists.
    pub id: u32,
    /// Backends to choose among (slots `0..count`); 0: refuse every new connection.
    pub count: u32,
    /// `sessionAffinity: ClientIP`'s timeout in seconds; 0: no affinity.
    pub affinity_secs: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Service>() == 16);

/// Key of [`crate::map::SERVICE_BACKENDS`]: one backend slot of a frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendSlot {
    /// [`Service::id`].
    pub id: u32,
    /// `0..Service::count`.
    pub index: u32,
}
const _: () = assert!(size_of::<BackendSlot>() == 8);

/// Value of [`crate::map::SERVICE_BACKENDS`] (and of [`crate::map::SERVICE_AFFINITY`]'s
/// entries): a ready endpoint.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// The endpoint's address, IPv6 or IPv4-mapped, wire order.
    pub addr: [u8; 16],
    /// The endpoint's port, network order.
    pub port: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<Backend>() == 20);

/// Key of [`crate::map::SERVICE_AFFINITY`]: a client and a frontend. Inside the node the
/// client is its network namespace (one pod, or the node); from outside, its address.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// `bpf_get_netns_cookie` of the client's socket, or, for a client outside the node,
    /// [`outside_client`] of its address.
    pub netns: u64,
    /// [`Service::id`].
    pub id: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 16);

/// Value of [`crate::map::SERVICE_AFFINITY`]: the backend last chosen and when.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Affinity {
    /// The backend.
    pub backend: Backend,
    /// Explicit padding, always zero.
    pub _pad: u32,
    /// `bpf_ktime_get_ns` of the last connection that used it.
    pub last_ns: u64,
}
const _: () = assert!(size_of::<Affinity>() == 32);

/// Key of [`crate::map::SERVICE_MEMBERS`]: a backend of a frontend, to tell whether a
/// remembered affinity still names one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberKey {
    /// [`Service::id`].
    pub id: u32,
    /// The backend.
    pub backend: Backend,
}
const _: () = assert!(size_of::<MemberKey>() == 24);

/// The [`AffinityKey::netns`] of a client outside the node: its address (wire order,
/// IPv4-mapped for IPv4) folded to 64 bits, with the top bit set, which no network
/// namespace cookie has (the kernel counts them up from 1).
#[inline(always)]
#[must_use]
pub fn outside_client(addr: &[u8; 16]) -> u64 {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&addr[..8]);
    lo.copy_from_slice(&addr[8..]);
    (u64::from_ne_bytes(hi).rotate_left(29) ^ u64::from_ne_bytes(lo)) | 1 << 63
}
