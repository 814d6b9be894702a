//! Allocation policy over a locked [`Store`]: round-robin search through the index
//! bitmaps, reservation, release, GC, the reboot sweep, repair and audit.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    net::IpAddr,
    os::unix::fs::FileExt,
    path::Path,
};

use ipnet::IpNet;

use super::{
    config::{IpamConfig, Range},
    record::{key_name, split_key_name, Record, Requester},
    store::{self, Ident, Store, StoreOptions},
    Reservation,
};
use crate::{
    cni::result::IpConfig,
    error::{Error, Result},
};

/// Ranges with at most this many addresses get an index bitmap (at most 2 MiB, sparse).
/// Larger ranges (IPv6 /64 and such) are searched by probing from the cursor, which finds a
/// free address at once because they are never densely used.
pub const BITMAP_MAX_ADDRESSES: u128 = 1 << 24;

/// Bytes read per index lookup.
const CHUNK: usize = 4096;

/// The index bitmap of one range: bit `i` set means "rangeStart + i is held". It is a
/// hint, maintained so that a set bit always means the address is held (bits are set
/// after the commit of an allocation and cleared before the commit of a release); a clear
/// bit may be wrong (a crash between steps) and is corrected when the address is probed.
#[derive(Debug)]
struct Bitmap {
    file: File,
}

impl Bitmap {
    fn len_for(range: &Range) -> u64 {
        u64::try_from(range.size().div_ceil(8)).unwrap_or(u64::MAX)
    }

    fn name_for(range: &Range) -> String {
        format!("{}-{}", range.range_start, range.range_end)
    }

    /// The first clear bit in `lo..=hi`.
    fn next_clear(&self, lo: u128, hi: u128) -> std::io::Result<Option<u128>> {
        let mut buf = [0u8; CHUNK];
        let mut pos = lo;
        while pos <= hi {
            let first_byte = pos / 8;
            let offset = u64::try_from(first_byte).unwrap_or(u64::MAX);
            store::read_at_full(&self.file, &mut buf, offset)?;
            for (i, byte) in buf.iter().enumerate() {
                let base = (first_byte + i as u128) * 8;
                if base > hi {
                    return Ok(None);
                }
                if *byte == 0xff {
                    continue;
                }
                for bit in 0..8u8 {
                    let p = base + u128::from(bit);
                    if p < pos {
                        continue;
                    }
                    if p > hi {
                        return Ok(None);
                    }
                    if byte & (1 << bit) == 0 {
                        return Ok(Some(p));
                    }
                }
            }
            pos = (first_byte + CHUNK as u128) * 8;
        }
        Ok(None)
    }

    fn set(&self, i: u128, value: bool) -> std::io::Result<()> {
        let offset = u64::try_from(i / 8).unwrap_or(u64::MAX);
        let mut b = [0u8; 1];
        store::read_at_full(&self.file, &mut b, offset)?;
        let mask = 1u8 << (i % 8);
        let new = if value { b[0] | mask } else { b[0] & !mask };
        if new != b[0] {
            self.file.write_all_at(&[new], offset)?;
        }
        Ok(())
    }
}

/// What a probe of one address found.
#[derive(Debug)]
enum Claim {
    /// No `ips/<address>`.
    Free,
    /// Claimed by a committed reservation.
    Held(Record),
    /// `ips/<address>` exists but no committed reservation owns it (a crash left it).
    Orphan,
}

/// Result of [`Allocator::repair`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// `ips/` entries no committed reservation owned, removed.
    pub orphans: usize,
    /// Leftover temporary files removed.
    pub tmp_files: usize,
    /// Entries of `ips/` that were not addresses, removed.
    pub garbage: usize,
}

/// A read-only consistency report of the store (see [`Allocator::audit`]).
#[derive(Debug, Default, Clone)]
pub struct Audit {
    /// Every committed reservation.
    pub reservations: Vec<Reservation>,
    /// Addresses claimed in `ips/` without a committed owner (crash leftovers; reclaimed
    /// when probed or at the next repair). Not a problem.
    pub orphans: Vec<String>,
    /// Leftover temporary files (not a problem).
    pub tmp_files: usize,
    /// Inconsistencies: an address held twice, a listed address not claimed by its
    /// reservation, an index bit set for an address nobody holds, unreadable records.
    pub problems: Vec<String>,
}

/// The allocator of one network over its locked store.
#[derive(Debug)]
pub struct Allocator<'a> {
    store: Store,
    cfg: &'a IpamConfig,
    network: String,
    bitmaps: HashMap<(usize, usize), Option<Bitmap>>,
    swept: Vec<Reservation>,
}

impl<'a> Allocator<'a> {
    /// Opens and locks the store at `path` for the network `network`, then runs the
    /// reboot sweep if this is the first operation of a new boot. `None` when the store
    /// does not exist and `opts.create` is false.
    pub fn open(
        path: &Path,
        network: &str,
        cfg: &'a IpamConfig,
        opts: &StoreOptions,
    ) -> Result<Option<Self>> {
        let Some(store) = Store::open(path, opts)? else {
            return Ok(None);
        };
        let mut alloc = Self {
            store,
            cfg,
            network: network.to_owned(),
            bitmaps: HashMap::new(),
            swept: Vec::new(),
        };
        if alloc.store.previous_boot().is_some() {
            alloc.sweep()?;
        }
        Ok(Some(alloc))
    }

    /// Reservations released by the reboot sweep of this open (empty unless this was the
    /// first operation after a reboot).
    #[must_use]
    pub fn swept(&self) -> &[Reservation] {
        &self.swept
    }

    /// The underlying store.
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The reboot rule: every reservation recorded under another boot id is released (its
    /// network namespace cannot have survived the reboot), then the store is repaired and
    /// the new boot id recorded. Interrupted, it simply runs again at the next operation.
    fn sweep(&mut self) -> Result<()> {
        let boot = self.store.boot_id().to_owned();
        let previous = self.store.previous_boot().unwrap_or_default().to_owned();
        for (name, _) in self.store.list_keys()? {
            let Some((record, _)) = self.store.read_key(&name)? else {
                continue;
            };
            if record.as_ref().is_some_and(|r| r.boot_id == boot) {
                continue;
            }
            let released = match split_key_name(&name) {
                Some((cid, ifname)) => self.release(cid, ifname)?,
                None => None,
            };
            if released.is_none() {
                self.store.unlink_key(&name)?;
            }
            self.swept.push(match record {
                Some(r) => Reservation::from(r),
                None => Reservation::from_key_name(&name),
            });
        }
        self.repair()?;
        self.store.write_meta()?;
        if !self.swept.is_empty() {
            tracing::info!(
                network = %self.network,
                previous_boot = %previous,
                "reclaimed {} address reservation(s) made before the last reboot",
                self.swept.len()
            );
        }
        Ok(())
    }

    /// Rebuilds everything derived from the committed reservations: removes orphaned
    /// claims and temporary files left by killed processes, and rewrites the index
    /// bitmaps. Never touches the lock or the round-robin cursors.
    pub fn repair(&mut self) -> Result<RepairReport> {
        let mut report = RepairReport::default();
        let key_idents: HashSet<Ident> = self
            .store
            .list_keys()?
            .into_iter()
            .map(|(_, ident)| ident)
            .collect();
        let mut held: Vec<IpAddr> = Vec::new();
        for (name, ident) in self.store.list_ips()? {
            match name.parse::<IpAddr>() {
                Ok(ip) if key_idents.contains(&ident) => held.push(ip),
                Ok(ip) => {
                    self.store.unlink_ip(ip)?;
                    report.orphans += 1;
                }
                Err(_) => {
                    self.store.unlink_ip_name(&name)?;
                    report.garbage += 1;
                }
            }
        }
        report.tmp_files = self.store.clear_tmp()?;
        self.bitmaps.clear();
        let mut keep = Vec::new();
        for range in self.cfg.all_ranges() {
            if range.size() > BITMAP_MAX_ADDRESSES {
                continue;
            }
            let name = Bitmap::name_for(range);
            let len = usize::try_from(Bitmap::len_for(range)).unwrap_or(0);
            let mut bytes = vec![0u8; len];
            for ip in held.iter().filter(|ip| range.contains(**ip)) {
                let off = range.offset(*ip);
                if let Some(b) = usize::try_from(off / 8).ok().and_then(|i| bytes.get_mut(i)) {
                    *b |= 1 << (off % 8);
                }
            }
            // The index is a hint: without it the search probes every address, slower but
            // correct. A full disk must not fail the operation here.
            match self.store.write_bitmap(&name, &bytes) {
                Ok(()) => keep.push(name),
                Err(e) => tracing::warn!("rebuilding the IPAM index: {e}"),
            }
        }
        self.store.prune_bitmaps(&keep)?;
        if report != RepairReport::default() {
            tracing::info!(
                network = %self.network,
                orphans = report.orphans,
                tmp_files = report.tmp_files,
                garbage = report.garbage,
                "repaired the IPAM store"
            );
        }
        Ok(report)
    }

    /// The index bitmap of range `r` of set `s`, opened (or built) on first use.
    fn bitmap(&mut self, s: usize, r: usize) -> Result<Option<&Bitmap>> {
        if !self.bitmaps.contains_key(&(s, r)) {
            let range = &self.cfg.range_sets[s].ranges[r];
            let bitmap = if range.size() > BITMAP_MAX_ADDRESSES {
                None
            } else {
                let name = Bitmap::name_for(range);
                let len = Bitmap::len_for(range);
                match self.store.open_bitmap(&name, len)? {
                    Some(file) => Some(Bitmap { file }),
                    None => {
                        // Missing (new range, first use) or stale: rebuild from the claims.
                        self.repair()?;
                        self.store
                            .open_bitmap(&name, len)?
                            .map(|file| Bitmap { file })
                    }
                }
            };
            self.bitmaps.insert((s, r), bitmap);
        }
        Ok(self.bitmaps.get(&(s, r)).and_then(Option::as_ref))
    }

    /// Sets or clears the index bit of `ip` (best effort: the index is a hint).
    fn mark(&mut self, ip: IpAddr, held: bool) {
        let Some((s, r)) = self.locate(ip) else {
            return;
        };
        let off = self.cfg.range_sets[s].ranges[r].offset(ip);
        match self.bitmap(s, r) {
            Ok(Some(bm)) => {
                if let Err(e) = bm.set(off, held) {
                    tracing::warn!("updating the IPAM index for {ip}: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("opening the IPAM index for {ip}: {e}"),
        }
    }

    /// The (set, range) containing `ip`.
    fn locate(&self, ip: IpAddr) -> Option<(usize, usize)> {
        self.cfg
            .range_sets
            .iter()
            .enumerate()
            .find_map(|(s, set)| set.range_for(ip).map(|r| (s, r)))
    }

    /// Probes one address.
    fn probe(&self, ip: IpAddr) -> Result<Claim> {
        let Some((record, ident)) = self.store.read_ip(ip)? else {
            return Ok(Claim::Free);
        };
        // Content is written before the first link, so a committed claim always parses.
        let Some(record) = record else {
            return Ok(Claim::Orphan);
        };
        let Ok(key) = record.key_name() else {
            return Ok(Claim::Orphan);
        };
        Ok(match self.store.key_ident(&key)? {
            Some(k) if k == ident => Claim::Held(record),
            _ => Claim::Orphan,
        })
    }

    /// The next index candidate in `lo..=hi` of range `r` of set `s`.
    fn candidate(&mut self, s: usize, r: usize, lo: u128, hi: u128) -> Result<Option<u128>> {
        let path = self.store.path().join("index");
        match self.bitmap(s, r)? {
            Some(bm) => bm
                .next_clear(lo, hi)
                .map_err(|e| Error::io(format!("reading the index in {}", path.display()), e)),
            None => Ok((lo <= hi).then_some(lo)),
        }
    }

    /// Round-robin search of set `s` from just after its cursor, through every range of
    /// the set in order and back round to the cursor, like host-local. Returns the first
    /// address that is free (or only orphaned, when `claim` is true the orphan is removed)
    /// with the index of its range.
    fn scan(&mut self, s: usize, claim: bool) -> Result<Option<(IpAddr, usize)>> {
        let cfg = self.cfg;
        let set = &cfg.range_sets[s];
        let n = set.ranges.len();
        let start = self
            .store
            .read_cursor(s)
            .and_then(|c| set.range_for(c).map(|r| (r, set.ranges[r].offset(c))))
            .map_or((0, 0), |(r, off)| {
                if off + 1 < set.ranges[r].size() {
                    (r, off + 1)
                } else {
                    ((r + 1) % n, 0)
                }
            });
        let (r0, o0) = start;
        let mut segments = vec![(r0, o0, set.ranges[r0].size() - 1)];
        for k in 1..n {
            let r = (r0 + k) % n;
            segments.push((r, 0, set.ranges[r].size() - 1));
        }
        if o0 > 0 {
            segments.push((r0, 0, o0 - 1));
        }
        for (r, lo, hi) in segments {
            let mut pos = lo;
            while let Some(off) = self.candidate(s, r, pos, hi)? {
                let ip = set.ranges[r].nth(off);
                if !set.is_gateway(ip) {
                    match self.probe(ip)? {
                        Claim::Free => return Ok(Some((ip, r))),
                        Claim::Orphan => {
                            if claim {
                                self.store.unlink_ip(ip)?;
                            }
                            return Ok(Some((ip, r)));
                        }
                        // A stale clear bit: correct it and go on.
                        Claim::Held(_) => self.mark(ip, true),
                    }
                }
                if off >= hi {
                    break;
                }
                pos = off + 1;
            }
        }
        Ok(None)
    }

    /// A free address of set `s`, repairing the index once if it claims the set is full.
    fn find_free(&mut self, s: usize, claim: bool) -> Result<Option<(IpAddr, usize)>> {
        if let Some(found) = self.scan(s, claim)? {
            return Ok(Some(found));
        }
        self.repair()?;
        self.scan(s, claim)
    }

    fn describe_key(container_id: &str, ifname: &str) -> String {
        format!("container {container_id} interface {ifname}")
    }

    /// One address per range set: the requested one (`requested[s]`, checked free and in
    /// the set) or the next free one; as (range set, range, address). Nothing is reserved
    /// yet; `who` names the caller in errors.
    fn choose(
        &mut self,
        requested: &[Option<IpAddr>],
        who: &str,
    ) -> Result<Vec<(usize, usize, IpAddr)>> {
        let mut chosen: Vec<(usize, usize, IpAddr)> = Vec::new();
        for s in 0..self.cfg.range_sets.len() {
            let want = requested.get(s).copied().flatten();
            if let Some(ip) = want {
                let r = self.cfg.range_sets[s].range_for(ip).ok_or_else(|| {
                    Error::Ipam(format!("requested address {ip} is outside range set {s}"))
                })?;
                match self.probe(ip)? {
                    Claim::Free => {}
                    Claim::Orphan => self.store.unlink_ip(ip)?,
                    Claim::Held(owner) => {
                        return Err(Error::Ipam(format!(
                            "requested address {ip} is already reserved by {}; nothing was \
                             reserved for {who}",
                            Self::describe_key(&owner.container_id, &owner.ifname)
                        )));
                    }
                }
                chosen.push((s, r, ip));
            } else {
                let Some((ip, r)) = self.find_free(s, true)? else {
                    let set = &self.cfg.range_sets[s];
                    let total: u128 = set.ranges.iter().map(Range::size).sum();
                    return Err(Error::Ipam(format!(
                        "no free address in range set {s} of network {}: {} \
                         ({total} addresses, all reserved or gateways); nothing was reserved \
                         for {who}",
                        self.network,
                        set.describe()
                    )));
                };
                chosen.push((s, r, ip));
            }
        }
        Ok(chosen)
    }

    /// Reserves one address in every range set for `(container_id, ifname)`:
    /// `requested[i]` (if any) in set `i`, else the next free one round-robin. All or
    /// nothing: on any error no address stays reserved. A key that already holds a
    /// reservation is refused and its reservation left intact.
    pub fn allocate(
        &mut self,
        container_id: &str,
        ifname: &str,
        requester: Requester,
        requested: &[Option<IpAddr>],
    ) -> Result<Vec<IpConfig>> {
        let key = key_name(container_id, ifname)?;
        let who = Self::describe_key(container_id, ifname);
        if let Some((record, _)) = self.store.read_key(&key)? {
            let held = record
                .map(|r| {
                    r.addresses
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_else(|| "an unreadable reservation".into());
            return Err(Error::Ipam(format!(
                "{who} already holds {held} in network {}; a second ADD for the same \
                 container and interface is refused (DEL it first)",
                self.network
            )));
        }

        let chosen = self.choose(requested, &who)?;

        let configs: Vec<IpConfig> = chosen
            .iter()
            .map(|&(s, r, ip)| {
                let range = &self.cfg.range_sets[s].ranges[r];
                IpConfig {
                    address: range.with_prefix(ip),
                    gateway: range.gateway,
                    interface: None,
                }
            })
            .collect();
        let record = self.store.new_record(
            container_id,
            ifname,
            configs.iter().map(|c| c.address).collect(),
            requester,
        );
        let tmp = self.store.write_tmp_record(&record).map_err(|e| match e {
            Error::Io { context, source } => Error::Io {
                context: format!("reserving addresses for {who}: {context}"),
                source,
            },
            e => e,
        })?;
        let mut linked: Vec<IpAddr> = Vec::new();
        let mut outcome = crate::faults::point("ipam-record-written");
        if outcome.is_ok() {
            for &(_, _, ip) in &chosen {
                match self.store.link_ip(&tmp, ip) {
                    Ok(true) => linked.push(ip),
                    Ok(false) => {
                        outcome = Err(Error::Ipam(format!(
                            "address {ip} was claimed while the store was locked; refusing to \
                             continue (is another program writing {}?)",
                            self.store.path().display()
                        )));
                        break;
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
        }
        if outcome.is_ok() {
            outcome = crate::faults::point("ipam-addresses-linked");
        }
        if outcome.is_ok() {
            outcome = match self.store.commit(&tmp, &key) {
                Ok(true) => Ok(()),
                Ok(false) => Err(Error::Ipam(format!(
                    "{who} already holds a reservation in network {}",
                    self.network
                ))),
                Err(e) => Err(e),
            };
        }
        if let Err(e) = outcome {
            for ip in linked {
                if let Err(e) = self.store.unlink_ip(ip) {
                    tracing::warn!("rolling back the claim of {ip}: {e}");
                }
            }
            self.store.remove_tmp(&tmp);
            return Err(e);
        }
        self.store.remove_tmp(&tmp);
        for &(s, _, ip) in &chosen {
            self.mark(ip, true);
            self.store.write_cursor(s, ip);
        }
        Ok(configs)
    }

    /// Releases the reservation of `(container_id, ifname)`, if any, and returns it.
    /// Idempotent. Only addresses still claimed by this very reservation are freed: an
    /// address that now belongs to another key is never touched.
    pub fn release(&mut self, container_id: &str, ifname: &str) -> Result<Option<Reservation>> {
        let Ok(key) = key_name(container_id, ifname) else {
            // Such a key cannot have been stored.
            return Ok(None);
        };
        let Some((record, ident)) = self.store.read_key(&key)? else {
            return Ok(None);
        };
        let mut mine = Vec::new();
        if let Some(record) = &record {
            for net in &record.addresses {
                let ip = net.addr();
                if self.store.ip_ident(ip)? == Some(ident) {
                    mine.push(ip);
                }
            }
        }
        // Index bits first, so a set bit always means "held" even if we die here.
        for ip in &mine {
            self.mark(*ip, false);
        }
        // The commit point of the release. From here a kill leaves the record in `tmp/`,
        // and the next open of the store removes the claims below.
        let Some(retired) = self.store.retire_key(&key)? else {
            return Ok(None);
        };
        crate::faults::point("ipam-key-retired")?;
        let mut cleared = true;
        for ip in &mine {
            if let Err(e) = self.store.unlink_ip(*ip) {
                tracing::warn!("removing the claim of {ip}: {e}");
                cleared = false;
            }
        }
        // Only a record whose claims are all gone leaves `tmp/`; otherwise the next open
        // of the store finishes the release.
        if cleared {
            self.store.remove_tmp(&retired);
        }
        Ok(Some(match record {
            Some(r) => Reservation::from(r),
            None => Reservation::from_key_name(&key),
        }))
    }

    /// The committed reservation of `(container_id, ifname)`, if any.
    pub fn get(&self, container_id: &str, ifname: &str) -> Result<Option<Reservation>> {
        let Ok(key) = key_name(container_id, ifname) else {
            return Ok(None);
        };
        Ok(self.store.read_key(&key)?.map(|(record, _)| match record {
            Some(r) => Reservation::from(r),
            None => Reservation::from_key_name(&key),
        }))
    }

    /// CHECK: the key holds exactly the addresses of `expected` (prefix lengths are not
    /// compared), and every one is still claimed by it. Error 104 naming the difference.
    pub fn check(&self, container_id: &str, ifname: &str, expected: &[IpNet]) -> Result<()> {
        let who = Self::describe_key(container_id, ifname);
        let key = key_name(container_id, ifname)?;
        let Some((record, ident)) = self.store.read_key(&key)? else {
            return Err(Error::Check(format!(
                "{who} has no address reservation in network {}",
                self.network
            )));
        };
        let Some(record) = record else {
            return Err(Error::Check(format!(
                "the reservation of {who} in {} is unreadable",
                self.store.path().display()
            )));
        };
        for net in &record.addresses {
            if self.store.ip_ident(net.addr())? != Some(ident) {
                return Err(Error::Check(format!(
                    "{} is recorded for {who} but is not claimed by it in the store",
                    net
                )));
            }
        }
        for want in expected {
            // Only the address is compared: the pod carries it as a host route (/32,
            // /128) while the reservation records the range's prefix.
            if !record.addresses.iter().any(|a| a.addr() == want.addr()) {
                return Err(Error::Check(format!(
                    "{want} is not reserved for {who} (it holds {})",
                    join(&record.addresses)
                )));
            }
        }
        if let Some(extra) = record
            .addresses
            .iter()
            .find(|a| !expected.iter().any(|e| e.addr() == a.addr()))
        {
            return Err(Error::Check(format!(
                "{who} also holds {extra}, which the expected addresses ({}) do not list",
                join(expected)
            )));
        }
        Ok(())
    }

    /// Every committed reservation, sorted by key.
    pub fn list(&self) -> Result<Vec<Reservation>> {
        let mut out = Vec::new();
        for (name, _) in self.store.list_keys()? {
            match self.store.read_key(&name)? {
                Some((Some(r), _)) => out.push(Reservation::from(r)),
                Some((None, _)) => {
                    tracing::warn!(
                        "unreadable reservation {}/keys/{name}",
                        self.store.path().display()
                    );
                    out.push(Reservation::from_key_name(&name));
                }
                None => {}
            }
        }
        out.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        Ok(out)
    }

    /// GC: releases every reservation whose key is not in `valid`, then repairs the store
    /// (crash leftovers, index). The lock file and the round-robin cursors are not touched.
    pub fn gc(&mut self, valid: &HashSet<(String, String)>) -> Result<Vec<Reservation>> {
        let mut released = Vec::new();
        for (name, _) in self.store.list_keys()? {
            let Some((cid, ifname)) = split_key_name(&name) else {
                tracing::warn!(
                    "ignoring {}/keys/{name}: not a reservation name",
                    self.store.path().display()
                );
                continue;
            };
            if valid.contains(&(cid.to_owned(), ifname.to_owned())) {
                continue;
            }
            let (cid, ifname) = (cid.to_owned(), ifname.to_owned());
            if let Some(r) = self.release(&cid, &ifname)? {
                released.push(r);
            }
        }
        self.repair()?;
        Ok(released)
    }

    /// STATUS: `Ok(())` if every range set has a free address, else the first full set
    /// as an [`Error::NotAvailable`].
    pub fn status(&mut self) -> Result<()> {
        self.store.probe_writable()?;
        for s in 0..self.cfg.range_sets.len() {
            if self.find_free(s, false)?.is_none() {
                return Err(Error::NotAvailable(format!(
                    "range set {s} of network {} has no free address: {}",
                    self.network,
                    self.cfg.range_sets[s].describe()
                )));
            }
        }
        Ok(())
    }

    /// A read-only consistency check of the whole store (for tests and `inspect`).
    pub fn audit(&mut self) -> Result<Audit> {
        let mut audit = Audit::default();
        let mut owners: HashMap<IpAddr, String> = HashMap::new();
        let mut key_idents: HashSet<Ident> = HashSet::new();
        for (name, ident) in self.store.list_keys()? {
            key_idents.insert(ident);
            let Some((record, ident)) = self.store.read_key(&name)? else {
                continue;
            };
            let Some(record) = record else {
                audit.problems.push(format!("keys/{name} does not parse"));
                continue;
            };
            if record.key_name().ok().as_deref() != Some(name.as_str()) {
                audit
                    .problems
                    .push(format!("keys/{name} holds the record of another key"));
            }
            for net in &record.addresses {
                let ip = net.addr();
                if let Some(other) = owners.insert(ip, name.clone()) {
                    audit.problems.push(format!(
                        "{ip} is listed by both keys/{other} and keys/{name}"
                    ));
                }
                if self.store.ip_ident(ip)? != Some(ident) {
                    audit.problems.push(format!(
                        "{ip} is listed by keys/{name} but ips/{ip} is not that reservation"
                    ));
                }
            }
            audit.reservations.push(Reservation::from(record));
        }
        for (name, ident) in self.store.list_ips()? {
            if name.parse::<IpAddr>().is_err() {
                audit.problems.push(format!("ips/{name} is not an address"));
            } else if !key_idents.contains(&ident) {
                audit.orphans.push(name);
            }
        }
        audit.tmp_files = self.store.count_tmp()?;
        let cfg = self.cfg;
        for range in cfg.all_ranges() {
            if range.size() > BITMAP_MAX_ADDRESSES {
                continue;
            }
            let Some(file) = self
                .store
                .open_bitmap(&Bitmap::name_for(range), Bitmap::len_for(range))?
            else {
                continue;
            };
            let mut buf = vec![0u8; 64 * 1024];
            let mut byte = 0u128;
            while byte * 8 < range.size() {
                store::read_at_full(&file, &mut buf, u64::try_from(byte).unwrap_or(u64::MAX))
                    .map_err(|e| {
                        Error::io(format!("reading the index of {}", range.describe()), e)
                    })?;
                for (i, b) in buf.iter().enumerate().filter(|(_, b)| **b != 0) {
                    for bit in 0..8u8 {
                        let off = (byte + i as u128) * 8 + u128::from(bit);
                        if b & (1 << bit) != 0 && off < range.size() {
                            let ip = range.nth(off);
                            if !owners.contains_key(&ip) {
                                audit.problems.push(format!(
                                    "the index marks {ip} as held but no reservation holds it"
                                ));
                            }
                        }
                    }
                }
                byte += buf.len() as u128;
            }
        }
        audit
            .reservations
            .sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        Ok(audit)
    }
}

fn join(nets: &[IpNet]) -> String {
    if nets.is_empty() {
        return "nothing".into();
    }
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
