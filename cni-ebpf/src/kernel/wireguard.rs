//! The kernel's WireGuard devices through their generic netlink family (`wireguard`,
//! the interface `wg(8)` uses): reading a device (its key, port and peers with their
//! handshakes and counters) and changing it. Creating and deleting the device is
//! rtnetlink's (`kernel::link`).
//!
//! A [`Wg`] handle is bound to the network namespace its socket was created in.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, SystemTime},
};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_generic::{
    ctrl::{nlas::GenlCtrlAttrs, GenlCtrl, GenlCtrlCmd},
    GenlFamily, GenlMessage,
};
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};
use netlink_sys::protocols::NETLINK_GENERIC;

use super::netlink::Netlink;
use crate::error::{Error, Result};

/// A WireGuard key (private or public), 32 bytes.
pub type Key = [u8; 32];

/// Peers per `SET_DEVICE` message: a message must fit the socket's buffers, and a
/// peer with a handful of allowed prefixes takes under 200 bytes.
const PEERS_PER_MESSAGE: usize = 64;

/// A device as the kernel reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Device {
    /// Its public key (derived by the kernel from the private key); `None` without one.
    pub public_key: Option<Key>,
    /// Whether it has a private key.
    pub has_private_key: bool,
    /// Its UDP port (0: none yet).
    pub listen_port: u16,
    /// Its peers.
    pub peers: Vec<PeerState>,
}

/// A peer as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    pub public_key: Key,
    pub endpoint: Option<SocketAddr>,
    /// Sorted.
    pub allowed_ips: Vec<IpNet>,
    /// The last completed handshake (`None`: never).
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// A peer as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub public_key: Key,
    pub endpoint: SocketAddr,
    /// Sorted.
    pub allowed_ips: Vec<IpNet>,
}

impl PeerState {
    /// Whether the kernel's peer is `want` already.
    #[must_use]
    pub fn is(&self, want: &Peer) -> bool {
        self.public_key == want.public_key
            && self.endpoint == Some(want.endpoint)
            && self.allowed_ips == want.allowed_ips
    }
}

/// A generic netlink socket with the `wireguard` family resolved.
#[derive(Debug)]
pub struct Wg {
    nl: Netlink,
    family: u16,
}

impl Wg {
    /// Connects in the caller's network namespace. A kernel without WireGuard (no
    /// `wireguard` family, the module absent) is an error that says so.
    pub fn connect() -> Result<Self> {
        let nl = Netlink::connect(NETLINK_GENERIC)
            .map_err(|e| Error::netlink("opening a generic netlink socket", e))?;
        let mut wg = Self { nl, family: 0 };
        let ask = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(
                WireguardMessage::family_name().to_owned(),
            )],
        });
        let answers = wg.request(ask, NLM_F_REQUEST | NLM_F_ACK).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOENT) {
                Error::netlink(
                    "finding the kernel's WireGuard",
                    "this kernel has no WireGuard (CONFIG_WIREGUARD, Linux 5.6 or later; \
                     the module wireguard.ko not loaded or not built)",
                )
            } else {
                Error::netlink("finding the kernel's WireGuard", e)
            }
        })?;
        wg.family = answers
            .iter()
            .flat_map(|m: &GenlMessage<GenlCtrl>| m.payload.nlas.iter())
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| {
                Error::netlink(
                    "finding the kernel's WireGuard",
                    "no family id in the answer",
                )
            })?;
        Ok(wg)
    }

    /// Sends `msg` with `flags` and collects the answers until the kernel's ACK or the
    /// end of a dump; an error answer is the error (with the kernel's errno).
    fn request<F>(
        &mut self,
        mut msg: GenlMessage<F>,
        flags: u16,
    ) -> std::io::Result<Vec<GenlMessage<F>>>
    where
        F: GenlFamily + netlink_packet_core::Emitable + std::fmt::Debug,
        F: netlink_packet_core::ParseableParametrized<[u8], netlink_packet_generic::GenlHeader>,
    {
        if self.family != 0 {
            msg.set_resolved_family_id(self.family);
        }
        self.nl.request(msg, flags)
    }

    /// Device `ifname` as the kernel has it.
    pub fn device(&mut self, ifname: &str) -> Result<Device> {
        let ask = GenlMessage::from_payload(WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::IfName(ifname.to_owned())],
        });
        let parts = self
            .request(ask, NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP)
            .map_err(|e| Error::netlink(format!("reading WireGuard device {ifname}"), e))?;
        let mut dev = Device::default();
        // A device with many peers comes in several messages, each with some of them (a
        // peer's allowed prefixes can be split over two).
        for part in parts {
            for attr in part.payload.attributes {
                match attr {
                    WireguardAttribute::PublicKey(k) => dev.public_key = Some(k),
                    WireguardAttribute::PrivateKey(k) => dev.has_private_key = k != [0; 32],
                    WireguardAttribute::ListenPort(p) => dev.listen_port = p,
                    WireguardAttribute::Peers(peers) => {
                        for p in peers {
                            merge_peer(&mut dev.peers, &p);
                        }
                    }
                    _ => {}
                }
            }
        }
        if dev.public_key == Some([0; 32]) {
            dev.public_key = None;
        }
        for p in &mut dev.peers {
            p.allowed_ips.sort();
        }
        Ok(dev)
    }

    /// Gives device `ifname` `private_key` and UDP port `port`.
    pub fn set_key_and_port(&mut self, ifname: &str, private_key: &Key, port: u16) -> Result<()> {
        self.set(
            ifname,
            vec![
                WireguardAttribute::PrivateKey(*private_key),
                WireguardAttribute::ListenPort(port),
            ],
        )
        .map_err(|e| Error::netlink(format!("setting the key and port of {ifname}"), e))
    }

    /// Makes each of `peers` a peer of device `ifname` as it says (its allowed prefixes
    /// replaced); other peers are left alone.
    pub fn set_peers(&mut self, ifname: &str, peers: &[Peer]) -> Result<()> {
        for chunk in peers.chunks(PEERS_PER_MESSAGE) {
            let list = chunk
                .iter()
                .map(|p| {
                    WireguardPeer(vec![
                        WireguardPeerAttribute::PublicKey(p.public_key),
                        WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
                        WireguardPeerAttribute::Endpoint(p.endpoint),
                        WireguardPeerAttribute::AllowedIps(
                            p.allowed_ips.iter().map(allowed_ip).collect(),
                        ),
                    ])
                })
                .collect();
            self.set(ifname, vec![WireguardAttribute::Peers(list)])
                .map_err(|e| Error::netlink(format!("setting peers of {ifname}"), e))?;
        }
        Ok(())
    }

    /// Removes the peers of `keys` from device `ifname`.
    pub fn remove_peers(&mut self, ifname: &str, keys: &[Key]) -> Result<()> {
        for chunk in keys.chunks(PEERS_PER_MESSAGE) {
            let list = chunk
                .iter()
                .map(|k| {
                    WireguardPeer(vec![
                        WireguardPeerAttribute::PublicKey(*k),
                        WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
                    ])
                })
                .collect();
            self.set(ifname, vec![WireguardAttribute::Peers(list)])
                .map_err(|e| Error::netlink(format!("removing peers of {ifname}"), e))?;
        }
        Ok(())
    }

    fn set(
        &mut self,
        ifname: &str,
        mut attributes: Vec<WireguardAttribute>,
    ) -> std::io::Result<()> {
        attributes.insert(0, WireguardAttribute::IfName(ifname.to_owned()));
        let msg = GenlMessage::from_payload(WireguardMessage {
            cmd: WireguardCmd::SetDevice,
            attributes,
        });
        self.request(msg, NLM_F_REQUEST | NLM_F_ACK).map(drop)
    }
}

/// `p` (one message's part of a peer) into `peers`.
fn merge_peer(peers: &mut Vec<PeerState>, p: &WireguardPeer) {
    let Some(key) = p.0.iter().find_map(|a| match a {
        WireguardPeerAttribute::PublicKey(k) => Some(*k),
        _ => None,
    }) else {
        return;
    };
    let i = match peers.iter().position(|q| q.public_key == key) {
        Some(i) => i,
        None => {
            peers.push(PeerState {
                public_key: key,
                endpoint: None,
                allowed_ips: Vec::new(),
                last_handshake: None,
                rx_bytes: 0,
                tx_bytes: 0,
            });
            peers.len() - 1
        }
    };
    let Some(peer) = peers.get_mut(i) else {
        return;
    };
    for a in &p.0 {
        match a {
            WireguardPeerAttribute::Endpoint(e) => peer.endpoint = Some(*e),
            WireguardPeerAttribute::LastHandshake(t) if t.seconds > 0 => {
                peer.last_handshake = u64::try_from(t.seconds).ok().map(|s| {
                    SystemTime::UNIX_EPOCH
                        + Duration::from_secs(s)
                        + Duration::from_nanos(u64::try_from(t.nano_seconds).unwrap_or(0))
                });
            }
            WireguardPeerAttribute::RxBytes(b) => peer.rx_bytes = *b,
            WireguardPeerAttribute::TxBytes(b) => peer.tx_bytes = *b,
            WireguardPeerAttribute::AllowedIps(ips) => {
                peer.allowed_ips.extend(ips.iter().filter_map(prefix));
            }
            _ => {}
        }
    }
}

/// An allowed prefix as the kernel takes it.
fn allowed_ip(net: &IpNet) -> WireguardAllowedIp {
    let family = if net.addr().is_ipv4() {
        WireguardAddressFamily::Ipv4
    } else {
        WireguardAddressFamily::Ipv6
    };
    WireguardAllowedIp(vec![
        WireguardAllowedIpAttr::Family(family),
        WireguardAllowedIpAttr::IpAddr(net.network()),
        WireguardAllowedIpAttr::Cidr(net.prefix_len()),
    ])
}

/// An allowed prefix as the kernel reports it.
fn prefix(ip: &WireguardAllowedIp) -> Option<IpNet> {
    let (mut addr, mut len): (Option<IpAddr>, Option<u8>) = (None, None);
    for a in &ip.0 {
        match a {
            WireguardAllowedIpAttr::IpAddr(x) => addr = Some(*x),
            WireguardAllowedIpAttr::Cidr(c) => len = Some(*c),
            _ => {}
        }
    }
    IpNet::new(addr?, len?).ok()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// A peer reported in two parts (its allowed prefixes split over two messages, as a
    /// dump with many peers does) is one peer with every prefix.
    #[test]
    fn a_peer_split_over_two_messages_is_merged() {
        let key = [7; 32];
        let part = |net: &str| {
            WireguardPeer(vec![
                WireguardPeerAttribute::PublicKey(key),
                WireguardPeerAttribute::AllowedIps(vec![allowed_ip(&net.parse().unwrap())]),
            ])
        };
        let mut peers = Vec::new();
        merge_peer(&mut peers, &part("10.244.2.0/24"));
        merge_peer(&mut peers, &part("fd00:244:2::/64"));
        assert_eq!(peers.len(), 1);
        assert_eq!(
            peers[0].allowed_ips,
            vec![
                "10.244.2.0/24".parse::<IpNet>().unwrap(),
                "fd00:244:2::/64".parse().unwrap(),
            ]
        );
    }

    #[test]
    fn prefixes_survive_the_round_trip() {
        for net in ["10.244.2.0/24", "192.168.1.7/32", "fd00::/48", "::/0"] {
            let net: IpNet = net.parse().unwrap();
            assert_eq!(prefix(&allowed_ip(&net)), Some(net));
        }
    }
}
