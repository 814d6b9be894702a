//! What the node's translations did to pod flows, for their records: the address and
//! port a masqueraded flow leaves with (its SNAT entry's), and the backend the node's
//! netfilter (kube-proxy's DNAT) sent a flow to a Service's address to (asked of the
//! node's connection tracking).
//!
//! Each is remembered from the first record that finds it until the flow's end or
//! expiry: a closed connection's NAT and conntrack entries go with it, often before its
//! end is read, and its end still names where it went — with one question asked per
//! flow, not one per record. A flow's start forgets what an earlier flow of the same
//! tuple left. At most [`REMEMBERED`] flows are remembered (about 150 bytes each); past
//! that the oldest half goes, and their later records name what is still in the tables.

use std::{collections::HashMap, net::SocketAddr};

use cni_ebpf_common::FlowLogKey;

use crate::{
    datapath::observe::{flow_addr, flow_port},
    kernel::conntrack::{Conntrack, Original},
};

/// Flows whose translations are remembered at most.
pub const REMEMBERED: usize = 16_384;

/// What the translations of one flow were, as found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    snat: Option<SocketAddr>,
    dnat: Option<SocketAddr>,
}

/// The flows' translations remembered, and the node's connection tracking (opened when
/// first needed, and again after a failure).
#[derive(Debug, Default)]
pub struct Translations {
    /// Remembered since the older half was let go.
    recent: HashMap<FlowLogKey, Seen>,
    /// The older half: looked in, then let go when `recent` is full.
    older: HashMap<FlowLogKey, Seen>,
    conntrack: Option<Conntrack>,
    /// A failure to ask conntrack was logged (once, not at every flow).
    warned: bool,
}

impl Translations {
    /// A new flow of `key`'s tuple starts: what an earlier one left is forgotten.
    pub fn starts(&mut self, key: &FlowLogKey) {
        self.forget(key);
    }

    /// `key`'s flow ended or expired: its records are made.
    pub fn forget(&mut self, key: &FlowLogKey) {
        self.recent.remove(key);
        self.older.remove(key);
    }

    /// The address and port `key`'s flow is masqueraded to: as remembered, else as `ask`
    /// finds it now (its SNAT entry), then remembered.
    pub fn snat(
        &mut self,
        key: &FlowLogKey,
        ask: impl FnOnce(&FlowLogKey) -> Option<SocketAddr>,
    ) -> Option<SocketAddr> {
        if let Some(a) = self.seen(key).snat {
            return Some(a);
        }
        let found = ask(key)?;
        self.remember(key, |s| s.snat = Some(found));
        Some(found)
    }

    /// Where the node's netfilter sent `key`'s flow (the source of its reply tuple as the
    /// node's connection tracking has it): as remembered, else asked, then remembered.
    pub fn dnat(&mut self, key: &FlowLogKey) -> Option<SocketAddr> {
        if let Some(a) = self.seen(key).dnat {
            return Some(a);
        }
        let found = self.reply_source(key)?;
        self.remember(key, |s| s.dnat = Some(found));
        Some(found)
    }

    fn seen(&self, key: &FlowLogKey) -> Seen {
        self.recent
            .get(key)
            .or_else(|| self.older.get(key))
            .copied()
            .unwrap_or_default()
    }

    fn remember(&mut self, key: &FlowLogKey, set: impl FnOnce(&mut Seen)) {
        if let Some(r) = self.recent.get_mut(key) {
            set(r);
            return;
        }
        let mut s = self.older.remove(key).unwrap_or_default();
        if self.recent.len() >= REMEMBERED / 2 {
            self.older = std::mem::take(&mut self.recent);
        }
        set(&mut s);
        self.recent.insert(*key, s);
    }

    /// The source of the reply tuple of the pod's flow `key` as the node tracks it.
    fn reply_source(&mut self, key: &FlowLogKey) -> Option<SocketAddr> {
        let orig = Original {
            proto: key.proto,
            src: SocketAddr::new(flow_addr(&key.pod), flow_port(key.pod_port)),
            dst: SocketAddr::new(flow_addr(&key.peer), flow_port(key.peer_port)),
        };
        let found = match self.conntrack.take() {
            Some(c) => Ok(c),
            None => Conntrack::connect().map_err(|e| e.to_string()),
        }
        .and_then(|mut c| {
            let found = c.reply_source(&orig).map_err(|e| e.to_string())?;
            // Kept only while it answers: a failed socket is opened afresh next time.
            self.conntrack = Some(c);
            Ok(found)
        });
        found.unwrap_or_else(|e| {
            if !self.warned {
                tracing::warn!(
                    "flows: the node's connection tracking cannot be asked where a \
                     Service's flow went ({e}): its records name the Service only"
                );
                self.warned = true;
            }
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn key(port: u16) -> FlowLogKey {
        FlowLogKey {
            ifindex: 7,
            pod_port: port.to_be(),
            peer_port: 53u16.to_be(),
            proto: 17,
            ..FlowLogKey::default()
        }
    }

    impl Translations {
        fn len(&self) -> usize {
            self.recent.len() + self.older.len()
        }
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    #[test]
    fn a_flows_snat_is_asked_once_and_named_after_its_entry_went() {
        let mut t = Translations::default();
        let asked = Cell::new(0);
        let ask = |_: &FlowLogKey| {
            asked.set(asked.get() + 1);
            Some(addr(40_000))
        };
        assert_eq!(t.snat(&key(1), ask), Some(addr(40_000)));
        // Its end, after the entry went: named as the start found it, nothing asked.
        let gone = |_: &FlowLogKey| {
            asked.set(asked.get() + 1);
            None
        };
        assert_eq!(t.snat(&key(1), gone), Some(addr(40_000)));
        assert_eq!(asked.get(), 1);
        t.forget(&key(1));
        assert_eq!(t.snat(&key(1), gone), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_new_flow_of_the_tuple_asks_again() {
        let mut t = Translations::default();
        assert_eq!(t.snat(&key(1), |_| Some(addr(40_000))), Some(addr(40_000)));
        t.starts(&key(1));
        assert_eq!(t.snat(&key(1), |_| Some(addr(40_001))), Some(addr(40_001)));
    }

    #[test]
    fn nothing_found_is_not_remembered() {
        let mut t = Translations::default();
        assert_eq!(t.snat(&key(1), |_| None), None);
        assert_eq!(t.len(), 0);
        assert_eq!(t.snat(&key(1), |_| Some(addr(40_000))), Some(addr(40_000)));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn at_most_remembered_flows_are_kept_the_latest_ones() {
        let mut t = Translations::default();
        let n = u16::try_from(REMEMBERED).unwrap_or(u16::MAX);
        for p in 0..=n {
            t.snat(&key(p), |_| Some(addr(p)));
            assert!(t.len() <= REMEMBERED, "{} at {p}", t.len());
        }
        // The latest are still there; the first ones went with the older half.
        assert_eq!(t.snat(&key(n), |_| None), Some(addr(n)));
        assert_eq!(t.snat(&key(n / 2), |_| None), Some(addr(n / 2)));
        assert_eq!(t.snat(&key(n / 2 - 1), |_| None), None);
        assert_eq!(t.snat(&key(0), |_| None), None);
        // A flow found in the older half stays remembered as it moves to the recent one.
        let mut t = Translations::default();
        t.snat(&key(0), |_| Some(addr(0)));
        for p in 1..=n / 2 {
            t.snat(&key(p), |_| Some(addr(p)));
        }
        assert_eq!(t.snat(&key(0), |_| None), Some(addr(0)));
        t.remember(&key(0), |s| s.dnat = Some(addr(1)));
        assert_eq!(
            t.seen(&key(0)),
            Seen {
                snat: Some(addr(0)),
                dnat: Some(addr(1))
            }
        );
    }
}
