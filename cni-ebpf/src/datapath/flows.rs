//! Per-flow state keyed by addresses: the NAT table, the flow verdicts of `FLOWS`
//! (which flows may bypass the stack), the pod sockets of `STACK_SOCKETS` and the node
//! sockets of `SOCK_REVNAT`. When an address changes hands, its flows must go with it, or
//! an old flow reaches (or steers) the address's next holder. [`Datapath::forget`] (after
//! DEL, GC or an undone ADD removed a pod or its host ports) purges all of it while the
//! pod's endpoint entries are tombstones (the programs ignore them, so nothing opens a new
//! flow for the address meanwhile), and drops the tombstones after. An address with no
//! entry therefore has no flow state; [`Datapath::attach_endpoint`] purges only an address
//! it finds a tombstone for (a removal that stopped part-way), instead of walking the whole
//! NAT table on every ADD.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
};

use cni_ebpf_common::{map as map_name, NatDestKey, NatEntry, NatFlags, NatKey, NatKind};

use super::{
    maps::{self, ipv4_to_map},
    Datapath,
};
use crate::error::Result;

impl Datapath {
    /// Deletes every per-flow entry that involves one of `addrs`: NAT entries whose tuple
    /// (matched or rewritten) has one, flow verdicts, pod sockets and the sockets' peers,
    /// node sockets translated to one.
    pub(super) fn purge_flows(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        self.purge_nat(addrs)?;
        let set = addr_set(addrs);
        let has = |a: &u32| set.contains(a);
        let mut m = self.maps()?;
        maps::remove_where(&mut m.flows()?, map_name::FLOWS, |k, _| {
            has(&k.saddr) || has(&k.daddr)
        })?;
        maps::remove_where(&mut m.stack_sockets()?, map_name::STACK_SOCKETS, |k, v| {
            has(&k.addr) || has(&v.addr)
        })?;
        maps::remove_where(&mut m.sock_revnat()?, map_name::SOCK_REVNAT, |k, _| {
            has(&k.addr)
        })
    }

    /// Deletes every NAT entry whose tuple (matched or rewritten) has one of `addrs`.
    pub(super) fn purge_nat(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        let set = addr_set(addrs);
        let has = |a: &u32| set.contains(a);
        self.purge_nat_where(|k, v| {
            has(&k.saddr) || has(&k.daddr) || has(&v.saddr) || has(&v.daddr)
        })
        .map(|_| ())
    }

    /// Deletes the NAT entries charged to a pod that has no share any more: a removal took
    /// the pod's entries and share and then stopped before its purge, without leaving a
    /// tombstone (one by an earlier version of this plugin, which dropped the endpoint
    /// entries first). Only GC runs it: it walks the whole table. Returns how many went.
    pub fn purge_orphan_flows(&self) -> Result<usize> {
        let shares: HashSet<u32> = {
            let mut m = self.maps()?;
            maps::entries(&m.nat_use()?)
                .into_iter()
                .map(|(pod, _)| pod)
                .collect()
        };
        // A share is written before its pod's first flow can exist (ADD, before
        // `from_pod` is attached) and taken before the pod's flows are purged.
        self.purge_nat_where(|_, v| v.pod != 0 && !shares.contains(&v.pod))
    }

    /// Deletes the NAT entries `doomed` picks, giving back their charges; returns how many.
    fn purge_nat_where(&self, doomed: impl Fn(&NatKey, &NatEntry) -> bool) -> Result<usize> {
        let mut m = self.maps()?;
        let mut nat = m.nat()?;
        let doomed: Vec<_> = maps::entries(&nat)
            .into_iter()
            .filter(|(k, v)| doomed(k, v))
            .collect();
        let mut removed = 0;
        // Each removed entry gives its charge back to its pod's NAT share (a hairpin flow
        // of a pod that stays, towards one that goes, is charged to the one that stays),
        // and a masquerade reverse entry its port to the pod's count towards its
        // destination.
        let mut given_back: HashMap<u32, u32> = HashMap::new();
        let mut ports_back: HashMap<NatDestKey, u32> = HashMap::new();
        for (k, v) in doomed {
            if nat.remove(&k).is_err() {
                continue;
            }
            removed += 1;
            if v.pod != 0 && !v.flags.contains(NatFlags::UNCHARGED) {
                *given_back.entry(v.pod).or_default() += 1;
            }
            if v.pod != 0 && v.kind == NatKind::SNAT_REV {
                let d = NatDestKey {
                    pod: v.pod,
                    daddr: k.saddr,
                    dport: k.sport,
                    proto: k.proto,
                    _pad: 0,
                };
                *ports_back.entry(d).or_default() += 1;
            }
        }
        let mut dest_use = m.nat_dest_use()?;
        for (d, n) in ports_back {
            // As below; a count that reaches zero goes, as the programs do it.
            if let Ok(held) = dest_use.get(&d, 0) {
                let left = held.saturating_sub(n);
                let _ = if left == 0 {
                    dest_use.remove(&d)
                } else {
                    dest_use.insert(d, left, 0)
                };
            }
        }
        let mut shares = m.nat_use()?;
        for (pod, n) in given_back {
            // Not atomic with the programs' updates: a flow opened by the pod in the same
            // instant may be counted or not; either way the share stays within one flow.
            if let Ok(mut u) = shares.get(&pod, 0) {
                u.entries = u.entries.wrapping_sub(n);
                let _ = shares.insert(pod, u, 0);
            }
        }
        Ok(removed)
    }
}

fn addr_set(addrs: &[Ipv4Addr]) -> HashSet<u32> {
    addrs.iter().map(|a| ipv4_to_map(*a)).collect()
}
