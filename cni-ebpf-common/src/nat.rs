//! The NAT table's key and entry, its per-pod shares and port counts, and their flags.
//!
//! The key, entry and port-count key are generic over the address family's address type
//! ([`Addr4`] or [`Addr6`], both as they are on the wire): one layout, one set of rules,
//! one table per family (`NAT`, `NAT6`).

use core::mem::size_of;

/// An IPv4 address as the programs keep it: the four wire bytes read as one native word.
pub type Addr4 = u32;

/// An IPv6 address as the programs keep it: the sixteen wire bytes read as four native
/// words.
pub type Addr6 = [u32; 4];

/// Key of [`crate::map::NAT`] (`A` = [`Addr4`]) and `NAT6` ([`Addr6`]): the 5-tuple of a
/// packet as it arrives at a program.
///
/// For ICMP echo, the identifier plays the port: a request is `(sport = id, dport = 0)`,
/// a reply `(sport = 0, dport = id)`, so that a reply's tuple is the request's reversed.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NatKeyOf<A> {
    /// Source address, network order.
    pub saddr: A,
    /// Destination address, network order.
    pub daddr: A,
    /// Source port (or echo id), network order.
    pub sport: u16,
    /// Destination port (or echo id), network order.
    pub dport: u16,
    /// IP protocol ([`crate::proto`]).
    pub proto: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
}
/// The IPv4 NAT key.
pub type NatKey = NatKeyOf<Addr4>;
/// The IPv6 NAT key.
pub type NatKey6 = NatKeyOf<Addr6>;
const _: () = assert!(size_of::<NatKey>() == 16);
const _: () = assert!(size_of::<NatKey6>() == 40);

impl<A: Copy> NatKeyOf<A> {
    /// The key of the other direction of this tuple's flow.
    #[must_use]
    pub const fn reversed(&self) -> Self {
        Self {
            saddr: self.daddr,
            daddr: self.saddr,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
            _pad: [0; 3],
        }
    }
}

/// [`NatEntry::hook`]: which program applies the entry.
///
/// The kind, hook and delivery codes of a NAT entry are newtypes over the byte the
/// kernel stores, with one associated constant per value, rather than Rust enums like
/// [`crate::Reason`]: a `Reason` is only ever written by the programs, but these bytes
/// are read back from a map, and a Rust enum holding a byte it does not list would be
/// undefined behaviour. The newtype keeps every byte valid and still gives each value a
/// name and a type of its own.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NatHook(pub u8);

impl NatHook {
    /// Applied by `from_pod` (hairpin flows).
    pub const POD: Self = Self(1);
    /// Applied by `uplink_ingress`.
    pub const UPLINK_IN: Self = Self(2);
    /// Applied by `uplink_egress`.
    pub const UPLINK_OUT: Self = Self(3);

    /// The program's name (as `inspect` shows it), or `"unknown"`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::POD => crate::prog::FROM_POD,
            Self::UPLINK_IN => crate::prog::UPLINK_INGRESS,
            Self::UPLINK_OUT => crate::prog::UPLINK_EGRESS,
            _ => "unknown",
        }
    }
}

/// [`NatEntry::kind`]: what the entry translates (see [`NatHook`] for why a newtype).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NatKind(pub u8);

impl NatKind {
    /// Masquerade, pod → outside (forward direction).
    pub const SNAT_FWD: Self = Self(1);
    /// Masquerade, reply to the pod.
    pub const SNAT_REV: Self = Self(2);
    /// Host port, client → pod.
    pub const DNAT_FWD: Self = Self(3);
    /// Host port, reply to the client.
    pub const DNAT_REV: Self = Self(4);
    /// Hairpin, client pod → backend pod.
    pub const HAIRPIN_FWD: Self = Self(5);
    /// Hairpin, reply to the client pod.
    pub const HAIRPIN_REV: Self = Self(6);
    /// A flow from outside to a Service, sent on to a backend on another node from the
    /// node's address (client → backend).
    pub const SERVICE_FWD: Self = Self(7);
    /// Its reply, back to the client from the Service's address.
    pub const SERVICE_REV: Self = Self(8);

    /// The kind's name (as `inspect` shows it), or `"unknown"`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::SNAT_FWD => "snat",
            Self::SNAT_REV => "snat-reply",
            Self::DNAT_FWD => "dnat",
            Self::DNAT_REV => "dnat-reply",
            Self::HAIRPIN_FWD => "hairpin",
            Self::HAIRPIN_REV => "hairpin-reply",
            Self::SERVICE_FWD => "service",
            Self::SERVICE_REV => "service-reply",
            _ => "unknown",
        }
    }
}

bitflags::bitflags! {
    /// [`NatEntry::flags`]: how far the (TCP) flow has closed, as seen by this entry's
    /// direction. Any byte is a valid value (unknown bits are kept).
    #[repr(transparent)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct NatFlags: u8 {
        /// A FIN was seen in this entry's direction.
        const FIN = 1;
        /// A RST was seen in this entry's direction.
        const RST = 2;
        /// This direction sent the first FIN (its peer ends in TIME_WAIT on the other
        /// side of the translation).
        const FIRST_FIN = 4;
        /// The (TCP) flow is closed (RST, or FIN both ways), so this entry no longer
        /// counts against its pod's share ([`NatEntry::pod`]): a pod's cap is on live
        /// flows, and a closed flow's entries only wait out their grace time for the port.
        const UNCHARGED = 8;
        // Bits the programs do not know are kept, not dropped.
        const _ = !0;
    }
}

impl NatFlags {
    /// How far the flow has closed in this direction, as `inspect` shows it: `rst`,
    /// `fin-first`, `fin` or `open`.
    #[must_use]
    pub const fn close_state(self) -> &'static str {
        if self.contains(Self::RST) {
            "rst"
        } else if self.contains(Self::FIRST_FIN) {
            "fin-first"
        } else if self.contains(Self::FIN) {
            "fin"
        } else {
            "open"
        }
    }
}

/// [`NatEntry::deliver`]: where a translated packet goes next (see [`NatHook`] for why a
/// newtype).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NatDeliver(pub u8);

impl NatDeliver {
    /// Straight into the local pod it is now addressed to, if any.
    pub const DIRECT: Self = Self(0);
    /// To the node's stack, because netfilter translated this flow too (its other
    /// direction reached us already translated) and must undo its part.
    pub const STACK: Self = Self(1);
    /// Routed out again (the uplink or the tunnel device, as the FIB says): a flow from
    /// outside sent on to a Service backend on another node, and its replies.
    pub const ROUTE: Self = Self(2);
}

/// A translated source port whose flow closed with a RST, or with FINs both ways where
/// the pod closed first, may be handed out again after this long (in-flight packets).
pub const NAT_CLOSED_GRACE_NS: u64 = 1_000_000_000;
/// … and after this long when the outside peer closed first: it holds the tuple in
/// TIME_WAIT (60 s on Linux) and could refuse a new connection reusing it.
pub const NAT_TIME_WAIT_NS: u64 = 60_000_000_000;
/// … and after this long without a packet for an open TCP flow (just above the default
/// 2 h TCP keepalive time, so kept-alive idle connections keep their port).
pub const NAT_TCP_IDLE_NS: u64 = 7_440_000_000_000;
/// … for UDP.
pub const NAT_UDP_IDLE_NS: u64 = 60_000_000_000;
/// … for ICMP echo.
pub const NAT_ICMP_IDLE_NS: u64 = 30_000_000_000;

/// Value of [`crate::map::NAT`] and `NAT6`: the tuple a matching packet is rewritten to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NatEntryOf<A> {
    /// Translated source address, network order.
    pub saddr: A,
    /// Translated destination address, network order.
    pub daddr: A,
    /// Translated source port (or echo id), network order.
    pub sport: u16,
    /// Translated destination port (or echo id), network order.
    pub dport: u16,
    /// Which program applies the entry.
    pub hook: NatHook,
    /// What the entry translates.
    pub kind: NatKind,
    /// How far the (TCP) flow has closed, as seen by this entry's direction.
    pub flags: NatFlags,
    /// Where a translated packet goes next.
    pub deliver: NatDeliver,
    /// `bpf_ktime_get_ns` of the last packet that used the entry, native order.
    pub last_seen_ns: u64,
    /// Host veth ifindex of the pod whose share ([`crate::map::NAT_USE`]) this entry is charged
    /// to, native order; 0: charged to nobody. Whoever removes the entry gives it back,
    /// unless [`NatFlags::UNCHARGED`] says the flow's close gave it back already.
    pub pod: u32,
    /// The sweep pass that last found this entry's flow still live (native order; 0:
    /// none): later slices of the same pass skip it (see [`NatUse::entries`] of key 0).
    pub swept: u32,
}
/// The IPv4 NAT entry.
pub type NatEntry = NatEntryOf<Addr4>;
/// The IPv6 NAT entry.
pub type NatEntry6 = NatEntryOf<Addr6>;
const _: () = assert!(size_of::<NatEntry>() == 32);
const _: () = assert!(size_of::<NatEntry6>() == 56);

/// Key of [`crate::map::NAT_DEST_USE`]: a pod and one destination of its masqueraded flows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NatDestKeyOf<A> {
    /// Host veth ifindex of the pod, native order.
    pub pod: u32,
    /// Destination address, network order.
    pub daddr: A,
    /// Destination port (ICMP: the echo id), network order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// Padding (zero).
    pub _pad: u8,
}
/// The IPv4 port-count key.
pub type NatDestKey = NatDestKeyOf<Addr4>;
/// The IPv6 port-count key.
pub type NatDestKey6 = NatDestKeyOf<Addr6>;
const _: () = assert!(size_of::<NatDestKey>() == 12);
const _: () = assert!(size_of::<NatDestKey6>() == 24);

/// Value of [`crate::map::NAT_USE`]: one pod's share of the NAT table.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NatUse {
    /// NAT entries charged to the pod (two per flow), native order, updated atomically by
    /// the programs. Read as signed: a give-back racing another can leave it a little
    /// below zero, which counts as zero. Key 0 (the sweep clock): the number of the
    /// sweep pass under way (from 1).
    pub entries: u32,
    /// Most entries the pod may hold (`2 × natFlowsPerPod`), native order; written by
    /// userspace at ADD. Unused for key 0.
    pub cap: u32,
    /// Key 0 only: `bpf_ktime_get_ns` of the last sweep slice, native order.
    pub swept_ns: u64,
}
const _: () = assert!(size_of::<NatUse>() == 16);
