//! Per-flow state keyed by addresses: the NAT table, the flow verdicts of `FLOWS`
//! (which flows may bypass the stack), the pod sockets of `STACK_SOCKETS` and the node
//! sockets of `SOCK_REVNAT`. When an address changes hands, its flows must go with it, or
//! an old flow reaches (or steers) the address's next holder. [`Datapath::purge_removed`]
//! (after GC or an undone ADD removed a pod or its host ports, and in DEL's finishing
//! process, which on a busy node shares one purge with the DELs of the same moment)
//! purges all of it while the pod's endpoint entries are tombstones (the programs ignore
//! them, so nothing opens a new flow for the address meanwhile), and drops the tombstones
//! after. An address with no entry therefore has no flow state; [`Datapath::attach_endpoint`]
//! purges only an address it finds a tombstone for (a removal that stopped part-way or
//! has not purged yet), instead of walking the whole NAT table on every ADD.

use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
    net::IpAddr,
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use cni_ebpf_common::{map as map_name, NatDestKeyOf, NatEntryOf, NatFlags, NatKeyOf, NatKind};

use super::{
    load::{lock_dir, try_lock_dir},
    maps::{self, ipv4_to_map, ipv6_to_map, Maps},
    pins::Pins,
    Datapath,
};
use crate::error::Result;

/// The network's flows lock, an exclusive `flock` on its maps directory: held while the
/// flows of removed addresses are purged and their tombstones dropped
/// ([`Datapath::purge_removed`]), and by an ADD that finds a tombstone for one of its
/// addresses while it purges and takes the address over. So an address is never taken
/// over while its old flows are being purged (the purge would remove the new pod's flows
/// too).
pub(super) struct FlowsLock {
    _file: std::fs::File,
}

impl FlowsLock {
    /// Takes the lock (waits at most `load::LOCK_WAIT`, then error 11, try again).
    pub(super) fn acquire(pins: &Pins) -> Result<Self> {
        let dir = pins.maps_dir();
        let file = lock_dir(&dir, || {
            format!(
                "the flows of removed pods in {} have been purged for too long",
                dir.display()
            )
        })?;
        Ok(Self { _file: file })
    }
}

impl Datapath {
    /// Whether a purge of removed addresses' flows (or an ADD taking such an address
    /// over) is walking the NAT table now: another process holds the flows lock.
    pub fn purge_running(&self) -> Result<bool> {
        // Taken here, nobody else holds it; released as the file drops.
        Ok(try_lock_dir(&self.pins.maps_dir())?.is_none())
    }

    /// The NAT entries the tables hold now as far as the pods' accounts tell, read before
    /// walking them: the entries charged to the pods' shares (`NAT_USE`, open flows) or
    /// two per SNAT port the pods hold towards a destination (`NAT_DEST_USE`, masqueraded
    /// flows open or closed until their entries go), whichever is more. Each a read of a
    /// map as large as the pod count or the pods' destinations.
    pub fn accounted_nat_entries(&self) -> Result<usize> {
        let mut m = self.maps()?;
        let charged: usize = maps::entries(&m.nat_use()?)
            .into_iter()
            // Key 0 is the sweep clock; a share read below zero counts as zero.
            .filter(|(pod, _)| *pod != 0)
            .map(|(_, u)| usize::try_from(u.entries.cast_signed()).unwrap_or(0))
            .sum();
        let ports = |n: u32| usize::try_from(n.cast_signed()).unwrap_or(0);
        let held: usize = maps::entries(&m.nat_dest_use()?)
            .into_iter()
            .map(|(_, n)| ports(n))
            .chain(
                maps::entries(&m.nat_dest_use6()?)
                    .into_iter()
                    .map(|(_, n)| ports(n)),
            )
            .sum();
        Ok(charged.max(2 * held))
    }

    /// Deletes every per-flow entry that involves one of `addrs`: NAT entries whose tuple
    /// (matched or rewritten) has one, flow verdicts, pod sockets and the sockets' peers,
    /// node sockets translated to one. Both families. Returns how many NAT entries it read.
    pub(super) fn purge_flows(&self, addrs: &[IpAddr]) -> Result<usize> {
        if addrs.is_empty() {
            return Ok(0);
        }
        let read = self.purge_nat(addrs)?;
        let (v4, v6) = addr_sets(addrs);
        let mut m = self.maps()?;
        if !v4.is_empty() {
            let has = |a: &u32| v4.contains(a);
            maps::remove_where(&mut m.flows()?, map_name::FLOWS, |k, _| {
                has(&k.saddr) || has(&k.daddr)
            })?;
            maps::remove_where(&mut m.stack_sockets()?, map_name::STACK_SOCKETS, |k, v| {
                has(&k.addr) || has(&v.addr)
            })?;
            maps::remove_where(&mut m.sock_revnat()?, map_name::SOCK_REVNAT, |k, _| {
                has(&k.addr)
            })?;
        }
        if !v6.is_empty() {
            let has = |a: &[u32; 4]| v6.contains(a);
            maps::remove_where(&mut m.flows6()?, map_name::FLOWS6, |k, _| {
                has(&k.saddr) || has(&k.daddr)
            })?;
            maps::remove_where(
                &mut m.stack_sockets6()?,
                map_name::STACK_SOCKETS6,
                |k, v| has(&k.addr) || has(&v.addr),
            )?;
            maps::remove_where(&mut m.sock_revnat6()?, map_name::SOCK_REVNAT6, |k, _| {
                has(&k.addr)
            })?;
        }
        Ok(read)
    }

    /// Deletes every NAT entry whose tuple (matched or rewritten) has one of `addrs`;
    /// returns how many entries it read.
    pub(super) fn purge_nat(&self, addrs: &[IpAddr]) -> Result<usize> {
        let (v4, v6) = addr_sets(addrs);
        let mut read = 0;
        if !v4.is_empty() {
            let has = |a: &u32| v4.contains(a);
            read += self
                .purge_nat_where(Family::V4, |k: &NatKeyOf<u32>, v: &NatEntryOf<u32>| {
                    has(&k.saddr) || has(&k.daddr) || has(&v.saddr) || has(&v.daddr)
                })?
                .read;
        }
        if !v6.is_empty() {
            let has = |a: &[u32; 4]| v6.contains(a);
            read += self
                .purge_nat_where(
                    Family::V6,
                    |k: &NatKeyOf<[u32; 4]>, v: &NatEntryOf<[u32; 4]>| {
                        has(&k.saddr) || has(&k.daddr) || has(&v.saddr) || has(&v.daddr)
                    },
                )?
                .read;
        }
        Ok(read)
    }

    /// Deletes the NAT entries (both families) charged to a pod that has no share any
    /// more: a removal took the pod's entries and share and then stopped before its purge,
    /// without leaving a tombstone (maps written by another binary, or by hand). Only GC
    /// runs it: it walks the whole tables. Returns how many went.
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
        let v4 = self.purge_nat_where(Family::V4, |_, v: &NatEntryOf<u32>| {
            v.pod != 0 && !shares.contains(&v.pod)
        })?;
        let v6 = self.purge_nat_where(Family::V6, |_, v: &NatEntryOf<[u32; 4]>| {
            v.pod != 0 && !shares.contains(&v.pod)
        })?;
        Ok(v4.removed + v6.removed)
    }

    /// Deletes the NAT entries of `family`'s table that `doomed` picks, giving back their
    /// charges.
    fn purge_nat_where<A: NatAddr>(
        &self,
        family: Family<A>,
        doomed: impl Fn(&NatKeyOf<A>, &NatEntryOf<A>) -> bool,
    ) -> Result<Walk>
    where
        NatKeyOf<A>: aya::Pod,
        NatEntryOf<A>: aya::Pod,
        NatDestKeyOf<A>: aya::Pod + Eq + Hash,
    {
        let mut m = self.maps()?;
        let mut nat = (family.nat)(&mut m)?;
        let all = maps::entries(&nat);
        let read = all.len();
        let doomed: Vec<_> = all.into_iter().filter(|(k, v)| doomed(k, v)).collect();
        let mut removed = 0;
        // Each removed entry gives its charge back to its pod's NAT share (a hairpin flow
        // of a pod that stays, towards one that goes, is charged to the one that stays),
        // and a masquerade reverse entry its port to the pod's count towards its
        // destination.
        let mut given_back: HashMap<u32, u32> = HashMap::new();
        let mut ports_back: HashMap<NatDestKeyOf<A>, u32> = HashMap::new();
        for (k, v) in doomed {
            if nat.remove(&k).is_err() {
                continue;
            }
            removed += 1;
            if v.pod != 0 && !v.flags.contains(NatFlags::UNCHARGED) {
                *given_back.entry(v.pod).or_default() += 1;
            }
            if v.pod != 0 && v.kind == NatKind::SNAT_REV {
                let d = NatDestKeyOf {
                    pod: v.pod,
                    daddr: k.saddr,
                    dport: k.sport,
                    proto: k.proto,
                    _pad: 0,
                };
                *ports_back.entry(d).or_default() += 1;
            }
        }
        let mut dest_use = (family.dest_use)(&mut m)?;
        for (d, n) in ports_back {
            // As below; a count that reaches zero goes, as the programs do it.
            if let Ok(held) = dest_use.get(&d, 0) {
                let left: u32 = held.saturating_sub(n);
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
        Ok(Walk { read, removed })
    }
}

/// What one walk of a NAT table did.
struct Walk {
    /// Entries read: the walk's cost.
    read: usize,
    /// Entries deleted.
    removed: usize,
}

/// An address type of the NAT tables (wire order): `u32` or `[u32; 4]`.
pub(super) trait NatAddr: aya::Pod + Copy + Eq + Hash {}
impl NatAddr for u32 {}
impl NatAddr for [u32; 4] {}

/// One family's NAT table and destination port counts, as [`Maps`] opens them.
pub(super) struct Family<A: NatAddr> {
    nat: NatTable<A>,
    dest_use: DestUseTable<A>,
}

type NatTable<A> =
    for<'a> fn(&'a mut Maps) -> Result<BpfHashMap<&'a mut MapData, NatKeyOf<A>, NatEntryOf<A>>>;
type DestUseTable<A> =
    for<'a> fn(&'a mut Maps) -> Result<BpfHashMap<&'a mut MapData, NatDestKeyOf<A>, u32>>;

impl Family<u32> {
    const V4: Self = Self {
        nat: Maps::nat,
        dest_use: Maps::nat_dest_use,
    };
}

impl Family<[u32; 4]> {
    const V6: Self = Self {
        nat: Maps::nat6,
        dest_use: Maps::nat_dest_use6,
    };
}

/// `addrs` as the maps hold them, per family.
fn addr_sets(addrs: &[IpAddr]) -> (HashSet<u32>, HashSet<[u32; 4]>) {
    let mut v4 = HashSet::new();
    let mut v6 = HashSet::new();
    for a in addrs {
        match a {
            IpAddr::V4(a) => {
                v4.insert(ipv4_to_map(*a));
            }
            IpAddr::V6(a) => {
                v6.insert(ipv6_to_map(*a));
            }
        }
    }
    (v4, v6)
}
