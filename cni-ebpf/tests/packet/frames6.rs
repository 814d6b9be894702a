//! IPv6 frames for the packet tests, with their checksums computed here (RFC 1071 over the
//! IPv6 pseudo-header), not by the kernel; the parse of a frame a program gave back; and
//! the dual-stack node the IPv6 cases run on.
//!
//! The attached programs tail-call their IPv6 halves (`from_pod6`, `uplink_ingress6`,
//! `uplink_egress6`, slots of `CALLS6`): the tests run the attached ones, so the tail calls
//! are part of what is tested. The maps are written by the plugin's own code:
//! `put_endpoint_entries` (ENDPOINTS6, as ADD does) and `configure_node` (NODE_CONFIG6, as
//! `open_or_load` does from the uplink's global IPv6 address and the IPv6 `clusterCIDRs`).

#![allow(dead_code, reason = "each module uses a different subset")]

use std::net::Ipv6Addr;

use cni_ebpf::datapath::{Endpoint, NodeConfigSpec};
use cni_ebpf_common::{FlowFlags, NatKey6};

use testbed::packet::*;

pub(crate) const NODE6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
pub(crate) const EXT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
pub(crate) const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 3);
pub(crate) const ICMPV6: u8 = 58;
pub(crate) const ECHO6_REQUEST: u8 = 128;
pub(crate) const ECHO6_REPLY: u8 = 129;

pub(crate) fn wire(a: Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

/// The IPv6 pseudo-header of an upper-layer checksum (RFC 8200 8.1).
pub(crate) fn pseudo6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&(len as u32).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, next]);
    p
}

/// L4 bytes with their checksum (at `csum_at`) computed over the pseudo-header.
pub(crate) fn l4_6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    mut s: Vec<u8>,
    csum_at: usize,
) -> Vec<u8> {
    s[csum_at..csum_at + 2].fill(0);
    let c = inet_csum(&[&pseudo6(src, dst, next, s.len()), &s]);
    s[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    s
}

pub(crate) fn frame6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[next, 64]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(l4);
    eth(UPLINK_MAC, EXT_MAC, 0x86dd, &ip)
}

pub(crate) fn tcp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, flags: u8) -> Vec<u8> {
    let mut s = vec![0u8; 20];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&1000u32.to_be_bytes());
    s[12] = 5 << 4;
    s[13] = flags;
    s[14..16].copy_from_slice(&65535u16.to_be_bytes());
    s.extend_from_slice(b"hello over six");
    frame6(src, dst, TCP, &l4_6(src, dst, TCP, s, 16))
}

pub(crate) fn udp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    let mut s = vec![0u8; 8];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(b"datagram!");
    let len = s.len() as u16;
    s[4..6].copy_from_slice(&len.to_be_bytes());
    frame6(src, dst, UDP, &l4_6(src, dst, UDP, s, 6))
}

pub(crate) fn echo6(src: Ipv6Addr, dst: Ipv6Addr, ty: u8, id: u16) -> Vec<u8> {
    let mut s = vec![ty, 0, 0, 0];
    s.extend_from_slice(&id.to_be_bytes());
    s.extend_from_slice(&7u16.to_be_bytes());
    s.extend_from_slice(b"ping six");
    frame6(src, dst, ICMPV6, &l4_6(src, dst, ICMPV6, s, 2))
}

/// A neighbour solicitation for `target` from `src` (to its solicited-node group).
pub(crate) fn neighbour_solicitation(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let dst = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let mut s = vec![135, 0, 0, 0, 0, 0, 0, 0];
    s.extend_from_slice(&t);
    s.extend_from_slice(&[1, 1]);
    s.extend_from_slice(&POD_MAC_A);
    let mut f = frame6(src, dst, ICMPV6, &l4_6(src, dst, ICMPV6, s, 2));
    f[14 + 7] = 255; // hop limit 255, as ND requires
    f
}

/// A parsed IPv6 frame: addresses, L4 ports (or echo id), and whether its L4 checksum
/// is right over the pseudo-header.
pub(crate) struct Seen6 {
    pub(crate) src: Ipv6Addr,
    pub(crate) dst: Ipv6Addr,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) csum_ok: bool,
}

pub(crate) fn parse6(f: &[u8]) -> Seen6 {
    assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x86dd, "not IPv6");
    let ip = &f[14..];
    let len = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let next = ip[6];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    let l4 = &ip[40..40 + len];
    let csum_ok = inet_csum(&[&pseudo6(src, dst, next, len), l4]) == 0;
    let (sport, dport) = match next {
        ICMPV6 => (u16::from_be_bytes([l4[4], l4[5]]), 0),
        _ => (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        ),
    };
    Seen6 {
        src,
        dst,
        sport,
        dport,
        csum_ok,
    }
}

/// The node: IPv4 as the other packet tests have it, pod A dual-stack, plus the IPv6
/// half of the configuration (masquerade address NODE6, cluster fd00:10:244::/48).
pub(crate) fn dual_stack_node() -> Fixture {
    let fx = Fixture::new();
    fx.configure_node(&NodeConfigSpec {
        node_addr6: Some(NODE6),
        cluster_cidrs6: vec!["fd00:10:244::/48".parse().unwrap()],
        ..standard_settings(true)
    });
    fx.standard_node_addrs();
    fx.dp().add_node_addrs(&[(NODE6.into(), 2)]).unwrap();
    fx.dp()
        .put_endpoint_entries(&Endpoint {
            ips: vec![POD_A.into(), std::net::IpAddr::V6(POD_A6)],
            ..endpoint_a()
        })
        .unwrap();
    fx.dp().put_endpoint_entries(&endpoint_b()).unwrap();
    fx
}

pub(crate) fn flow6(fx: &Fixture, key: &NatKey6) -> Option<FlowFlags> {
    let m = fx.map("FLOWS6");
    let flows: aya::maps::HashMap<_, NatKey6, cni_ebpf_common::FlowEntry> =
        aya::maps::HashMap::try_from(&m).unwrap();
    flows.get(key, 0).ok().map(|e| e.flags)
}

pub(crate) fn nat6_len(fx: &Fixture) -> usize {
    let m = fx.map("NAT6");
    let nat: aya::maps::HashMap<_, NatKey6, cni_ebpf_common::NatEntry6> =
        aya::maps::HashMap::try_from(&m).unwrap();
    nat.keys().count()
}

/// An ICMPv6 error (`ty`, `code`, 4 bytes of `rest`) from `from` to `to` quoting
/// `quoted` (an IPv6 packet, from its header on).
pub(crate) fn icmp6_error(
    from: Ipv6Addr,
    to: Ipv6Addr,
    ty: u8,
    code: u8,
    rest: [u8; 4],
    quoted: &[u8],
) -> Vec<u8> {
    let mut s = vec![ty, code, 0, 0];
    s.extend_from_slice(&rest);
    s.extend_from_slice(quoted);
    frame6(from, to, ICMPV6, &l4_6(from, to, ICMPV6, s, 2))
}

/// The quoted packet of ICMPv6 error frame `f`: source, destination, source port (or
/// echo id) as the error carries them.
pub(crate) fn quote_of(f: &[u8]) -> (Ipv6Addr, Ipv6Addr, u16) {
    let q = &f[14 + 40 + 8..];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&q[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&q[24..40]).unwrap());
    let l4 = &q[40..];
    let sport = if q[6] == ICMPV6 {
        u16::from_be_bytes([l4[4], l4[5]])
    } else {
        u16::from_be_bytes([l4[0], l4[1]])
    };
    (src, dst, sport)
}

pub(crate) fn key6(saddr: Ipv6Addr, sport: u16, daddr: Ipv6Addr, dport: u16, proto: u8) -> NatKey6 {
    NatKey6 {
        saddr: wire(saddr),
        daddr: wire(daddr),
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        _pad: [0; 3],
    }
}
