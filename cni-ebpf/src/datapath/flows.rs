//! Per-flow state keyed by addresses: today the LRU NAT table. When an address changes
//! hands, its flows must go with it, or an old flow reaches the address's next holder.
//! That happens in two places, both calling into this file: [`Datapath::attach_endpoint`]
//! (state a previous holder left) and [`Datapath::forget`] (after DEL, GC or an undone ADD
//! removed a pod or its host ports). A new per-flow map keyed by pod addresses gets its
//! purge here, next to [`Datapath::purge_nat`], called from the same two places.

use std::{collections::HashSet, net::Ipv4Addr};

use cni_ebpf_common::map as map_name;

use super::{
    maps::{self, addr},
    Datapath,
};
use crate::error::Result;

impl Datapath {
    /// Deletes every NAT entry whose tuple (matched or rewritten) involves one of `addrs`.
    pub(super) fn purge_nat(&self, addrs: &[Ipv4Addr]) -> Result<()> {
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
