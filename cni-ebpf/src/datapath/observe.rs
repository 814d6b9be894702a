//! The maps of the flow events (see `cni-ebpf-bpf/src/observe.rs`): whether flows are
//! followed and how many events a CPU may send (`FLOW_CONFIG`, the agent's to write), the
//! flows followed (`FLOW_LOG`), and the ring the events arrive by (`FLOW_EVENTS`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use aya::maps::{MapData, RingBuf};
use cni_ebpf_common::{
    map as map_name, FlowConfig, FlowEvent, FlowLogEntry, FlowLogKey, NatKey, NatKey6, NatKind,
    FLOW_CONFIG_SOCKET_SERVICES,
};

use super::{load, maps, Datapath};

/// What [`Datapath::set_flow_config`] writes; the default turns flows off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowSettings {
    /// Follow flows and send their events.
    pub enabled: bool,
    /// Events each CPU may send a second.
    pub events_per_sec: u32,
    /// Events each CPU may send at once after a quiet time.
    pub burst: u32,
    /// The node's socket hooks connect pods' sockets to Service backends: a flow's start
    /// names the Service its socket asked for.
    pub socket_services: bool,
}
use crate::error::Result;

impl Datapath {
    /// Turns flows on or off as `settings` say.
    pub fn set_flow_config(&self, settings: &FlowSettings) -> Result<()> {
        let mut m = self.maps()?;
        let mut a = m.flow_config()?;
        let cfg = FlowConfig {
            enabled: u32::from(settings.enabled),
            events_per_sec: settings.events_per_sec,
            burst: settings.burst,
            flags: if settings.socket_services {
                FLOW_CONFIG_SOCKET_SERVICES
            } else {
                0
            },
        };
        a.set(0, cfg, 0)
            .map_err(|e| maps::err(map_name::FLOW_CONFIG, "write", e))
    }

    /// What `FLOW_CONFIG` says.
    pub fn flow_config(&self) -> Result<FlowConfig> {
        let mut m = self.maps()?;
        let a = m.flow_config()?;
        a.get(&0, 0)
            .map_err(|e| maps::err(map_name::FLOW_CONFIG, "read", e))
    }

    /// Every flow followed.
    pub fn flow_log(&self) -> Result<Vec<(FlowLogKey, FlowLogEntry)>> {
        let mut m = self.maps()?;
        let h = m.flow_log()?;
        let mut out = Vec::new();
        for item in h.iter() {
            match item {
                Ok(kv) => out.push(kv),
                // An LRU entry evicted while the walk passed it.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(maps::err(map_name::FLOW_LOG, "read", e)),
            }
        }
        Ok(out)
    }

    /// Stops following `key` (its next packet starts it afresh). Gone already is fine.
    pub fn forget_flow(&self, key: &FlowLogKey) -> Result<()> {
        let mut m = self.maps()?;
        let mut h = m.flow_log()?;
        match h.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(maps::err(map_name::FLOW_LOG, "delete", e)),
        }
    }

    /// The address and port pod flow `key` (as the pod sees it) leaves the node with when
    /// it is masqueraded: its SNAT entry's, while it has one (`None`: no entry, or the
    /// maps could not be read).
    #[must_use]
    pub fn masqueraded_source(&self, key: &FlowLogKey) -> Option<SocketAddr> {
        let mut m = self.maps().ok()?;
        let (pod, peer) = (Ipv6Addr::from(key.pod), Ipv6Addr::from(key.peer));
        let (addr, port) = match (pod.to_ipv4_mapped(), peer.to_ipv4_mapped()) {
            (Some(pod), Some(peer)) => {
                let k = NatKey {
                    saddr: u32::from_ne_bytes(pod.octets()),
                    daddr: u32::from_ne_bytes(peer.octets()),
                    sport: key.pod_port,
                    dport: key.peer_port,
                    proto: key.proto,
                    _pad: [0; 3],
                };
                let v = m.nat().ok()?.get(&k, 0).ok()?;
                (v.kind == NatKind::SNAT_FWD)
                    .then(|| (IpAddr::from(maps::ipv4_from_map(v.saddr)), v.sport))?
            }
            (None, None) => {
                let k = NatKey6 {
                    saddr: maps::ipv6_to_map(pod),
                    daddr: maps::ipv6_to_map(peer),
                    sport: key.pod_port,
                    dport: key.peer_port,
                    proto: key.proto,
                    _pad: [0; 3],
                };
                let v = m.nat6().ok()?.get(&k, 0).ok()?;
                (v.kind == NatKind::SNAT_FWD)
                    .then(|| (IpAddr::from(maps::ipv6_from_map(v.saddr)), v.sport))?
            }
            _ => return None,
        };
        Some(SocketAddr::new(addr, maps::port_from_map(port)))
    }

    /// The ring the flow events arrive by, to read on its own (it is not shared with the
    /// datapath's other maps). The datapath sends no wakeups: a reader drains it on a
    /// timer.
    pub fn flow_events(&self) -> Result<FlowEvents> {
        let map = load::open_map(self.pins(), map_name::FLOW_EVENTS)?;
        let ring =
            RingBuf::try_from(map).map_err(|e| maps::err(map_name::FLOW_EVENTS, "open", e))?;
        Ok(FlowEvents { ring })
    }
}

/// The consumer side of `FLOW_EVENTS`.
pub struct FlowEvents {
    ring: RingBuf<MapData>,
}

impl std::fmt::Debug for FlowEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowEvents")
    }
}

impl FlowEvents {
    /// The next event waiting, if any. A record of another size (never written by this
    /// object) is skipped.
    pub fn next_event(&mut self) -> Option<FlowEvent> {
        loop {
            let item = self.ring.next()?;
            if item.len() != size_of::<FlowEvent>() {
                continue;
            }
            // SAFETY: a `FlowEvent` (plain integers, any bit pattern valid) of the right
            // size, read unaligned.
            return Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<FlowEvent>()) });
        }
    }

    /// Every event waiting.
    pub fn drain(&mut self) -> Vec<FlowEvent> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}

/// An address of a flow key (IPv4 mapped into IPv6 shown as IPv4).
#[must_use]
pub fn flow_addr(a: &[u8; 16]) -> IpAddr {
    Ipv6Addr::from(*a).to_canonical()
}

/// A port of a flow key, in host order.
#[must_use]
pub fn flow_port(p: u16) -> u16 {
    u16::from_be(p)
}
