//! Map types of Services translated at the socket (the agent's `--kube-proxy-replacement`
//! mode): see `cni-ebpf-bpf/src/sock.rs` for the programs and
//! `cni-ebpf/src/agent/services.rs` for who keeps the maps.
//!
//! Addresses of both families share one layout: IPv6, or IPv4-mapped IPv6
//! (`::ffff:a.b.c.d`), wire order, as in the tunnel maps.

use core::mem::size_of;

/// Capacity of [`crate::map::SERVICES`]: Service frontends (ClusterIP, port, protocol).
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

/// Key of [`crate::map::SERVICES`]: one frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The ClusterIP, IPv6 or IPv4-mapped, wire order.
    pub addr: [u8; 16],
    /// The Service port, network order.
    pub port: u16,
    /// IP protocol (`proto::TCP` or `proto::UDP`).
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
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

/// Key of [`crate::map::SERVICE_AFFINITY`]: a client (its network namespace: one pod, or
/// the node) and a frontend.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// `bpf_get_netns_cookie` of the client's socket.
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
