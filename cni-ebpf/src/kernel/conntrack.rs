//! The kernel's connection tracking through ctnetlink (`NETLINK_NETFILTER`, what
//! `conntrack -G` asks): where a connection the node's netfilter translated went. A
//! connection kube-proxy's rules sent from a Service's address to one of its backends is
//! tracked with that backend as the source of its reply tuple.
//!
//! A [`Conntrack`] handle is bound to the network namespace its socket was created in,
//! and asks for one connection at a time (a lookup by tuple, never a dump of the table).

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple},
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::netlink::Netlink;
use crate::error::{Error, Result};

/// A ctnetlink socket.
#[derive(Debug)]
pub struct Conntrack {
    nl: Netlink,
}

/// A connection's original direction: its protocol number, source and destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Original {
    pub proto: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl Conntrack {
    /// Connects in the caller's network namespace (`CAP_NET_ADMIN` there to ask).
    ///
    /// # Errors
    /// The socket cannot be opened, bound or connected.
    pub fn connect() -> Result<Self> {
        let nl = Netlink::connect(NETLINK_NETFILTER)
            .map_err(|e| Error::netlink("opening a netfilter netlink socket", e))?;
        Ok(Self { nl })
    }

    /// The source of the reply tuple of the tracked connection `orig` — where the node
    /// sent it (a Service's backend, after a DNAT) — if it is tracked and is TCP, UDP or
    /// SCTP of one family.
    ///
    /// # Errors
    /// The kernel's answer is an error other than "no such connection", or unreadable.
    pub fn reply_source(&mut self, orig: &Original) -> std::io::Result<Option<SocketAddr>> {
        let protocol = match orig.proto {
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            132 => Protocol::Sctp,
            _ => return Ok(None),
        };
        let family = match (orig.src.ip(), orig.dst.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => NetfilterProtoFamily::IPv4,
            (IpAddr::V6(_), IpAddr::V6(_)) => NetfilterProtoFamily::IPv6,
            _ => return Ok(None),
        };
        let ask = ConntrackMessage::Get(vec![ConntrackAttribute::CtaTupleOrig(vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(orig.src.ip()),
                IPTuple::DestinationAddress(orig.dst.ip()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(protocol),
                ProtoTuple::SourcePort(orig.src.port()),
                ProtoTuple::DestinationPort(orig.dst.port()),
            ]),
        ])]);
        let ask = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), ask);
        match self.nl.request(ask, NLM_F_REQUEST | NLM_F_ACK) {
            Ok(answer) => Ok(answer.iter().find_map(reply_source)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The reply tuple's source address and port in a ctnetlink answer (the kernel answers
/// a get with a connection's description, typed as a new one).
fn reply_source(m: &NetfilterMessage) -> Option<SocketAddr> {
    let attrs = match &m.inner {
        NetfilterMessageInner::Conntrack(
            ConntrackMessage::New(attrs) | ConntrackMessage::Get(attrs),
        ) => attrs,
        _ => return None,
    };
    let reply = attrs.iter().find_map(|a| match a {
        ConntrackAttribute::CtaTupleReply(t) => Some(t),
        _ => None,
    })?;
    let ip = reply.iter().find_map(|t| match t {
        Tuple::Ip(parts) => parts.iter().find_map(|p| match p {
            IPTuple::SourceAddress(a) => Some(*a),
            _ => None,
        }),
        _ => None,
    })?;
    let port = reply.iter().find_map(|t| match t {
        Tuple::Proto(parts) => parts.iter().find_map(|p| match p {
            ProtoTuple::SourcePort(p) => Some(*p),
            _ => None,
        }),
        _ => None,
    })?;
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_its_reply_source() {
        // As the kernel answers a get: typed as a new connection.
        let m = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
            ConntrackMessage::New(vec![
                ConntrackAttribute::CtaTupleOrig(vec![Tuple::Ip(vec![IPTuple::SourceAddress(
                    IpAddr::from([10, 244, 1, 2]),
                )])]),
                ConntrackAttribute::CtaTupleReply(vec![
                    Tuple::Ip(vec![
                        IPTuple::SourceAddress(IpAddr::from([10, 244, 2, 7])),
                        IPTuple::DestinationAddress(IpAddr::from([10, 244, 1, 2])),
                    ]),
                    Tuple::Proto(vec![
                        ProtoTuple::Protocol(Protocol::Tcp),
                        ProtoTuple::SourcePort(8080),
                        ProtoTuple::DestinationPort(40000),
                    ]),
                ]),
            ]),
        );
        assert_eq!(
            reply_source(&m),
            Some(SocketAddr::from(([10, 244, 2, 7], 8080)))
        );
        let none = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
            ConntrackMessage::Get(Vec::new()),
        );
        assert_eq!(reply_source(&none), None);
    }
}
