//! Per-flow state keyed by addresses: the LRU NAT table, the flow verdicts of `FLOWS`
//! (which flows may bypass the stack), the pod sockets of `STACK_SOCKETS` and the node
//! sockets of `SOCK_REVNAT`. When an address changes hands, its flows must go with it, or
//! an old flow reaches (or steers) the address's next holder. That happens in two places,
//! both calling [`Datapath::purge_flows`]: [`Datapath::attach_endpoint`] (state a previous
//! holder left) and [`Datapath::forget`] (after DEL, GC or an undone ADD removed a pod or
//! its host ports).

use std::{collections::HashSet, net::Ipv4Addr};

use cni_ebpf_common::map as map_name;

use super::{
    maps::{self, addr},
    Datapath,
};
use crate::error::Result;

impl Datapath {
    /// Deletes every per-flow entry that involves one of `addrs`.
    pub(super) fn purge_flows(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        self.purge_nat(addrs)?;
        let set: HashSet<u32> = addrs.iter().map(|a| addr(*a)).collect();
        let mut m = self.maps()?;
        let mut flows = m.flows()?;
        let doomed: Vec<_> = maps::entries(&flows)
            .into_iter()
            .filter(|(k, _)| set.contains(&k.saddr) || set.contains(&k.daddr))
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            maps::remove(&mut flows, &k, map_name::FLOWS)?;
        }
        let mut socks = m.stack_sockets()?;
        let doomed: Vec<_> = maps::entries(&socks)
            .into_iter()
            .filter(|(k, v)| set.contains(&k.addr) || set.contains(&v.addr))
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            maps::remove(&mut socks, &k, map_name::STACK_SOCKETS)?;
        }
        let mut revnat = m.sock_revnat()?;
        let doomed: Vec<_> = maps::entries(&revnat)
            .into_iter()
            .filter(|(k, _)| set.contains(&k.addr))
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            maps::remove(&mut revnat, &k, map_name::SOCK_REVNAT)?;
        }
        Ok(())
    }

    /// Deletes every NAT entry whose tuple (matched or rewritten) involves one of `addrs`.
    fn purge_nat(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        if addrs.is_empty() {
            return Ok(());
        }
        let set: HashSet<u32> = addrs.iter().map(|a| addr(*a)).collect();
        let mut m = self.maps()?;
        let mut nat = m.nat()?;
        let doomed: Vec<_> = maps::entries(&nat)
            .into_iter()
            .filter(|(k, v)| {
                set.contains(&k.saddr)
                    || set.contains(&k.daddr)
                    || set.contains(&v.saddr)
                    || set.contains(&v.daddr)
            })
            .map(|(k, _)| k)
            .collect();
        for k in doomed {
            maps::remove(&mut nat, &k, map_name::NAT)?;
        }
        Ok(())
    }
}
