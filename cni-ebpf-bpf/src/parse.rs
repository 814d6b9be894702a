//! Header layout and parsing: Ethernet + IPv4 + the L4 fields the programs decide on.

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{proto, Addr4, Addr6, NatKeyOf, Reason};

pub(crate) const ETH_HLEN: usize = 14;

/// Offset of the EtherType in an Ethernet header.
pub(crate) const ETH_TYPE_OFF: usize = 12;

pub(crate) const ETH_P_IP: u16 = 0x0800;

pub(crate) const ETH_P_IPV6: u16 = 0x86dd;

pub(crate) const IP_OFF: usize = ETH_HLEN;

pub(crate) const IP_HLEN: usize = 20;

pub(crate) const L4_OFF: usize = IP_OFF + IP_HLEN;

/// Offsets of the IPv4 header's fields, from the header's start ([`Iphdr`]).
pub(crate) const IP_TOS: usize = core::mem::offset_of!(Iphdr, tos);
pub(crate) const IP_TTL: usize = core::mem::offset_of!(Iphdr, ttl);
pub(crate) const IP_PROTO: usize = core::mem::offset_of!(Iphdr, proto);
pub(crate) const IP_FRAG_OFF: usize = core::mem::offset_of!(Iphdr, frag_off);
pub(crate) const IP_CSUM: usize = core::mem::offset_of!(Iphdr, csum);
pub(crate) const IP_SADDR: usize = core::mem::offset_of!(Iphdr, saddr);
pub(crate) const IP_DADDR: usize = core::mem::offset_of!(Iphdr, daddr);
/// Offset of the source address in an IPv6 header.
pub(crate) const IP6_SADDR: usize = core::mem::offset_of!(Ip6hdr, saddr);
/// Offset of the destination address in an IPv6 header.
pub(crate) const IP6_DADDR: usize = core::mem::offset_of!(Ip6hdr, daddr);
/// Offset of the hop limit in an IPv6 header.
pub(crate) const IP6_HOP_LIMIT: usize = core::mem::offset_of!(Ip6hdr, hop_limit);
/// Length of the IPv6 header (without extension headers).
pub(crate) const IP6_HLEN: usize = 40;
/// Offset of the L4 header of an IPv6 packet without extension headers.
pub(crate) const L4_OFF6: usize = IP_OFF + IP6_HLEN;
/// ICMPv6 echo request and reply.
pub(crate) const ICMP6_ECHO_REQUEST: u8 = 128;
/// ICMPv6 error types (RFC 4443) about a packet sent: destination unreachable, packet too
/// big, time exceeded, parameter problem (every error type is below 128).
pub(crate) const ICMP6_DEST_UNREACH: u8 = 1;
pub(crate) const ICMP6_PACKET_TOO_BIG: u8 = 2;
pub(crate) const ICMP6_TIME_EXCEEDED: u8 = 3;
pub(crate) const ICMP6_PARAM_PROB: u8 = 4;
/// Offset of the quoted IPv6 header in an ICMPv6 error (after the 8-byte ICMPv6 header).
pub(crate) const INNER6_IP_OFF: usize = L4_OFF6 + 8;
/// Offset of the quoted packet's L4 header.
pub(crate) const INNER6_L4_OFF: usize = INNER6_IP_OFF + IP6_HLEN;
pub(crate) const ICMP6_ECHO_REPLY: u8 = 129;

/// Offsets of L4 fields, from the L4 header's start: ports (TCP, UDP) come first.
pub(crate) const L4_SPORT: usize = 0;
pub(crate) const L4_DPORT: usize = 2;
/// The TCP flags byte.
pub(crate) const TCP_FLAGS: usize = 13;
/// The TCP checksum.
pub(crate) const TCP_CSUM: usize = 16;
/// The UDP checksum.
pub(crate) const UDP_CSUM: usize = 6;
/// The ICMP checksum.
pub(crate) const ICMP_CSUM: usize = 2;
/// The ICMP echo identifier.
pub(crate) const ICMP_ECHO_ID: usize = 4;
/// The first bytes of every L4 header the programs translate: the ports (TCP, UDP) or
/// the echo identifier (ICMP) are within them.
pub(crate) const L4_TRANSLATED_LEN: usize = 8;
/// Length of an ICMP header (also of a UDP header): the quoted packet of an ICMP error
/// starts after it.
pub(crate) const ICMP_HLEN: usize = 8;

/// Offset of the inner IPv4 header in an ICMP error.
pub(crate) const INNER_IP_OFF: usize = L4_OFF + ICMP_HLEN;

pub(crate) const INNER_L4_OFF: usize = INNER_IP_OFF + IP_HLEN;

pub(crate) const ICMP_ECHO_REPLY: u8 = 0;

pub(crate) const ICMP_DEST_UNREACH: u8 = 3;

pub(crate) const ICMP_ECHO: u8 = 8;

pub(crate) const ICMP_TIME_EXCEEDED: u8 = 11;

pub(crate) const ICMP_PARAMETER_PROB: u8 = 12;

pub(crate) const TCP_FIN: u8 = 0x01;

pub(crate) const TCP_SYN: u8 = 0x02;

pub(crate) const TCP_RST: u8 = 0x04;

pub(crate) const TCP_ACK: u8 = 0x10;

/// The IPv4 header (no options).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Iphdr {
    pub(crate) vihl: u8,
    pub(crate) tos: u8,
    pub(crate) tot_len: u16,
    pub(crate) id: u16,
    pub(crate) frag_off: u16,
    pub(crate) ttl: u8,
    pub(crate) proto: u8,
    pub(crate) csum: u16,
    pub(crate) saddr: u32,
    pub(crate) daddr: u32,
}

/// What the programs need to know about an IP packet of the family whose address type is
/// `A` ([`crate::family::Family`]). Addresses and ports network order.
#[derive(Clone, Copy)]
pub(crate) struct Pkt<A = Addr4> {
    pub(crate) saddr: A,
    pub(crate) daddr: A,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
    /// ICMP type (0xff if not ICMP).
    pub(crate) icmp_type: u8,
    /// TCP flags (0 if not TCP).
    pub(crate) tcp_flags: u8,
    /// The packet has ports (TCP, UDP) or an echo id (ICMP echo): it can be translated.
    pub(crate) natable: bool,
}

impl<A: Copy> Pkt<A> {
    #[inline(always)]
    pub(crate) fn key(&self) -> NatKeyOf<A> {
        NatKeyOf {
            saddr: self.saddr,
            daddr: self.daddr,
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            _pad: [0; 3],
        }
    }

    #[inline(always)]
    pub(crate) fn is_tcp_syn(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// A packet that may open a host-port flow: TCP SYN or any UDP datagram.
    #[inline(always)]
    pub(crate) fn opens_hostport_flow(&self) -> bool {
        (self.proto == proto::TCP && self.is_tcp_syn()) || self.proto == proto::UDP
    }
}

/// The IPv6 header (its layout: the programs read and write it field by field).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code, reason = "a layout, read through its offsets")]
pub(crate) struct Ip6hdr {
    /// Version, traffic class and flow label.
    pub(crate) vtcfl: u32,
    pub(crate) payload_len: u16,
    pub(crate) next_header: u8,
    pub(crate) hop_limit: u8,
    pub(crate) saddr: Addr6,
    pub(crate) daddr: Addr6,
}

const _: () = assert!(core::mem::size_of::<Ip6hdr>() == IP6_HLEN);

/// Reads a `T` at `off`: straight from the packet when those bytes are in its linear part
/// (no helper call), else with `bpf_skb_load_bytes`.
#[inline(always)]
pub(crate) fn read<T: Copy>(ctx: &TcContext, off: usize) -> Result<T, ()> {
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() <= ctx.data_end() {
        // SAFETY: within [data, data_end), checked just above; any alignment.
        return Ok(unsafe { core::ptr::read_unaligned((start + off) as *const T) });
    }
    ctx.load(off).map_err(|_| ())
}

/// The byte at `off`, or 0 when the packet has none there. Unlike [`read`], the value is
/// defined on every path (a failed `bpf_skb_load_bytes` leaves its buffer unwritten, and
/// the compiler may compute with it before it branches), so a test of it can be folded
/// into a select without reading an uninitialised register.
#[inline(always)]
pub(crate) fn byte_or_zero(ctx: &TcContext, off: usize) -> u8 {
    let start = ctx.data();
    if start + off < ctx.data_end() {
        // SAFETY: within [data, data_end), checked just above.
        return unsafe { *((start + off) as *const u8) };
    }
    let mut b: u8 = 0;
    // SAFETY: one byte into a local the helper may write.
    let ret = unsafe {
        aya_ebpf::helpers::bpf_skb_load_bytes(
            ctx.skb.skb as *const _,
            off as u32,
            (&raw mut b).cast(),
            1,
        )
    };
    if ret == 0 {
        b
    } else {
        0
    }
}

/// Parses Ethernet + IPv4 (+ the L4 ports). `Err` carries the reason to pass unchanged.
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Result<Pkt, Reason> {
    let ethertype: u16 = read(ctx, ETH_TYPE_OFF).map_err(|_| Reason::PassMalformed)?;
    if ethertype != ETH_P_IP.to_be() {
        return Err(Reason::PassNotIpv4);
    }
    let ip: Iphdr = read(ctx, IP_OFF).map_err(|_| Reason::PassMalformed)?;
    if ip.vihl >> 4 != 4 {
        return Err(Reason::PassMalformed);
    }
    let ihl = ip.vihl & 0x0f;
    if ihl < 5 {
        return Err(Reason::PassMalformed);
    }
    if ihl != 5 {
        return Err(Reason::PassIpOptions);
    }
    // More-fragments bit or a fragment offset.
    if ip.frag_off & 0x3fffu16.to_be() != 0 {
        return Err(Reason::PassFragment);
    }
    let tot_len = u16::from_be(ip.tot_len) as u32;
    if tot_len < IP_HLEN as u32 || tot_len + ETH_HLEN as u32 > ctx.len() {
        return Err(Reason::PassMalformed);
    }
    let mut p = Pkt {
        saddr: ip.saddr,
        daddr: ip.daddr,
        sport: 0,
        dport: 0,
        proto: ip.proto,
        icmp_type: 0xff,
        tcp_flags: 0,
        natable: false,
    };
    let l4_len = tot_len - IP_HLEN as u32;
    match ip.proto {
        proto::TCP => {
            if l4_len < 20 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.tcp_flags = read(ctx, L4_OFF + TCP_FLAGS).map_err(|_| Reason::PassMalformed)?;
            p.natable = true;
        }
        proto::UDP => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.natable = true;
        }
        proto::ICMP => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ty: u8 = read(ctx, L4_OFF).map_err(|_| Reason::PassMalformed)?;
            p.icmp_type = ty;
            if ty == ICMP_ECHO || ty == ICMP_ECHO_REPLY {
                let id: u16 =
                    read(ctx, L4_OFF + ICMP_ECHO_ID).map_err(|_| Reason::PassMalformed)?;
                if ty == ICMP_ECHO {
                    p.sport = id;
                } else {
                    p.dport = id;
                }
                p.natable = true;
            }
        }
        _ => {}
    }
    Ok(p)
}

/// Parses Ethernet + IPv6 (+ the L4 ports). `Err` carries the reason to pass unchanged.
///
/// Only a fixed header directly followed by TCP, UDP or ICMPv6 is translated: a packet
/// with extension headers (a fragment among them) is the kernel's, which walks them
/// (`PassIpOptions`). Neighbour discovery, router advertisements and MLD are ICMPv6
/// without an echo id: parsed, never natable, so no rule of the programs takes them.
#[inline(always)]
pub(crate) fn parse6(ctx: &TcContext) -> Result<Pkt<Addr6>, Reason> {
    let ethertype: u16 = read(ctx, ETH_TYPE_OFF).map_err(|_| Reason::PassMalformed)?;
    if ethertype != ETH_P_IPV6.to_be() {
        return Err(Reason::PassNotIpv4);
    }
    // Field by field, not the whole header: the 40 bytes of an `Ip6hdr` copy would sit
    // in every IPv6 frame next to the `Pkt` (the verifier's stack is 512 bytes).
    let head: [u8; 8] = read(ctx, IP_OFF).map_err(|_| Reason::PassMalformed)?;
    if head[0] >> 4 != 6 {
        return Err(Reason::PassMalformed);
    }
    let l4_len = u16::from_be_bytes([head[4], head[5]]) as u32;
    let next_header = head[6];
    if l4_len + (IP6_HLEN + ETH_HLEN) as u32 > ctx.len() {
        return Err(Reason::PassMalformed);
    }
    let mut p = Pkt {
        saddr: read(ctx, IP_OFF + IP6_SADDR).map_err(|_| Reason::PassMalformed)?,
        daddr: read(ctx, IP_OFF + IP6_DADDR).map_err(|_| Reason::PassMalformed)?,
        sport: 0,
        dport: 0,
        proto: next_header,
        icmp_type: 0xff,
        tcp_flags: 0,
        natable: false,
    };
    match next_header {
        proto::TCP => {
            if l4_len < 20 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF6).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.tcp_flags = read(ctx, L4_OFF6 + TCP_FLAGS).map_err(|_| Reason::PassMalformed)?;
            p.natable = true;
        }
        proto::UDP => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ports: [u16; 2] = read(ctx, L4_OFF6).map_err(|_| Reason::PassMalformed)?;
            p.sport = ports[0];
            p.dport = ports[1];
            p.natable = true;
        }
        proto::ICMPV6 => {
            if l4_len < 8 {
                return Err(Reason::PassMalformed);
            }
            let ty: u8 = read(ctx, L4_OFF6).map_err(|_| Reason::PassMalformed)?;
            p.icmp_type = ty;
            if ty == ICMP6_ECHO_REQUEST || ty == ICMP6_ECHO_REPLY {
                let id: u16 =
                    read(ctx, L4_OFF6 + ICMP_ECHO_ID).map_err(|_| Reason::PassMalformed)?;
                if ty == ICMP6_ECHO_REQUEST {
                    p.sport = id;
                } else {
                    p.dport = id;
                }
                p.natable = true;
            }
        }
        // Hop-by-hop, routing, fragment, destination options, …: the kernel's.
        0 | 43 | 44 | 60 | 51 | 50 | 135 | 139 | 140 => return Err(Reason::PassIpOptions),
        _ => {}
    }
    Ok(p)
}
