//! One netlink socket's requests and their answers, for each family this module speaks
//! (rtnetlink in [`super::tc`], generic netlink in [`super::wireguard`], netfilter in
//! [`super::conntrack`]): a request numbered and sent, the messages of its answer read
//! up to its end.

use std::io;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::{Socket, SocketAddr};

/// A netlink socket of one protocol, bound and connected to the kernel in the network
/// namespace it was opened in, and the sequence number of its last request.
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Netlink {
    /// Opens, binds and connects a socket of `protocol` (`netlink_sys::protocols`) in
    /// the caller's network namespace.
    ///
    /// # Errors
    /// The step that failed, as its `io::Error`.
    pub fn connect(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends `payload` with `flags` and returns the messages of its answer. `flags` must
    /// make the answer end: `NLM_F_DUMP` (ended by `Done`) or `NLM_F_ACK` (by the ack);
    /// without either, the kernel's answer to a request that succeeds has no end.
    ///
    /// # Errors
    /// Sending or receiving failed, an answer is unreadable, or the kernel answered with
    /// an error (its errno, as the `io::Error`).
    pub fn request<T>(&mut self, payload: T, flags: u16) -> io::Result<Vec<T>>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full()?;
            for m in messages::<T>(&data)? {
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => return Ok(out),
                    _ => {}
                }
            }
        }
    }

    /// The socket, for requests sent as one datagram ([`super::tc`]'s batches).
    pub fn socket(&self) -> &Socket {
        &self.socket
    }
}

/// The messages of netlink datagram `data`, in order.
///
/// # Errors
/// A message is unreadable or says its length is 0.
pub fn messages<T: NetlinkDeserializable>(data: &[u8]) -> io::Result<Vec<NetlinkMessage<T>>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < data.len() {
        let rest = data.get(off..).unwrap_or_default();
        let m = NetlinkMessage::<T>::deserialize(rest)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let len = usize::try_from(m.header.length).unwrap_or(0);
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a netlink message of length 0",
            ));
        }
        off += (len + 3) & !3;
        out.push(m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{DoneMessage, NLM_F_MULTIPART};
    use netlink_packet_route::{link::LinkMessage, RouteNetlinkMessage};

    use super::*;

    fn encoded(payload: NetlinkPayload<RouteNetlinkMessage>, seq: u32, flags: u16) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        header.flags = flags;
        let mut m = NetlinkMessage::new(header, payload);
        m.finalize();
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    #[test]
    fn a_datagram_of_several_messages_is_read_whole_and_in_order() {
        let mut data = encoded(
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(LinkMessage::default())),
            7,
            NLM_F_MULTIPART,
        );
        data.extend(encoded(
            NetlinkPayload::Done(DoneMessage::default()),
            7,
            NLM_F_MULTIPART,
        ));
        let got = messages::<RouteNetlinkMessage>(&data).unwrap_or_default();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(
            got[0].payload,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(_))
        ));
        assert!(matches!(got[1].payload, NetlinkPayload::Done(_)));
    }

    #[test]
    fn a_message_of_length_0_or_cut_short_is_an_error() {
        let data = encoded(
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(LinkMessage::default())),
            1,
            0,
        );
        let mut zero = data.clone();
        zero[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(messages::<RouteNetlinkMessage>(&zero).is_err());
        assert!(messages::<RouteNetlinkMessage>(&data[..data.len() - 4]).is_err());
        assert!(messages::<RouteNetlinkMessage>(&[]).is_ok_and(|m| m.is_empty()));
    }
}
