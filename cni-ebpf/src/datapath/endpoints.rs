//! A pod's interface in the datapath: its endpoint entries (one per IPv4 address, with
//! the owner record and per-pod counters), `from_pod` attached to its host veth, and the
//! removal of all of it again (DEL, GC, ADD's undo).
//!
//! Removal ends in [`Datapath::forget`] (after DEL: [`Datapath::purge_removed`]): per-flow
//! state of the pod's addresses (see `flows.rs`) and the owner record once nothing refers
//! to it.

use std::{
    collections::{BTreeSet, HashSet},
    net::IpAddr,
};

use aya::{maps::lpm_trie::Key, programs::TcAttachType};
use cni_ebpf_common::{
    map as map_name, owner_id, prog, EndpointFlags, EndpointInfo, EndpointStats, NatUse,
    SrcAllow6Key, SrcAllowKey, SRC6_ALLOWED, SRC6_OWN,
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{
    attach,
    flows::FlowsLock,
    maps::{self, ipv4_to_map},
    netkit::{self, NetkitHook},
    owner_label, Datapath,
};
use crate::{
    cni::config::{AttachPolicy, EgressRate},
    error::{Error, Result},
    ipam::record::PodRef,
};

/// One pod interface as the datapath sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// ifindex of the host end of the veth (or netkit primary).
    pub host_ifindex: u32,
    /// Name of the host end of the veth.
    pub host_ifname: String,
    /// MAC of the host end (gateway side).
    pub host_mac: [u8; 6],
    /// MAC of the pod's interface.
    pub pod_mac: [u8; 6],
    /// The pod's addresses (each gets an endpoint entry of its family, `ENDPOINTS` or
    /// `ENDPOINTS6`, and IPv6 ones source entries).
    pub ips: Vec<IpAddr>,
    /// Source prefixes the pod may send from besides its own addresses
    /// (`allowedSourceCIDRs`).
    pub allowed_sources: Vec<IpNet>,
    /// Translated flows the pod may hold in the NAT table at once (`natFlowsPerPod`).
    pub nat_flows: u32,
    /// The pod's egress rate (`runtimeConfig.bandwidth`).
    pub egress_rate: Option<EgressRate>,
    /// Whether the pod has host ports (`runtimeConfig.portMappings`): only such a pod
    /// serves hairpin flows, whose replies `from_pod` must look up.
    pub host_ports: bool,
    /// Whether the pair is a netkit pair (`interface`): its programs are `from_netkit`
    /// and `to_netkit` on netkit links, not `from_pod` and `to_pod` at tc hooks.
    pub netkit: bool,
    /// The Kubernetes pod the runtime named (`K8S_POD_*` of `CNI_ARGS`): its namespace
    /// decides whether it starts closed to policy (see `policy`).
    pub pod: Option<PodRef>,
}

/// One of a pod's two programs ([`Datapath::pod_programs`]).
pub(super) struct PodProgram {
    /// Its name (and pin name).
    pub name: &'static str,
    /// Where it runs, seen from the host device: egress (what reaches the pod; a netkit
    /// primary's transmit) or ingress (what the pod sends; a netkit peer's transmit).
    pub dir: TcAttachType,
    /// The pin of its link (a tcx or netkit link; unused by a clsact filter).
    pub pin: std::path::PathBuf,
}

/// What [`Datapath::take_pod`] took of a pod.
#[derive(Debug, Default)]
pub struct RemovedEntries {
    /// The addresses whose entries became tombstones (and those of its host ports).
    pub addrs: Vec<IpAddr>,
    /// The host interfaces its endpoint entries named.
    pub ifindexes: BTreeSet<u32>,
}

impl Datapath {
    /// Writes the endpoint's map entries (owner record, per-pod counters, one entry per
    /// address, in `ENDPOINTS` or `ENDPOINTS6`) without attaching anything. An address held by another container is
    /// an error naming it.
    pub fn put_endpoint_entries(&self, ep: &Endpoint) -> Result<()> {
        let owner = owner_id(ep.container_id.as_bytes(), ep.ifname.as_bytes());
        let record = maps::owner_record(&ep.container_id, &ep.ifname)?;
        let mut m = self.maps()?;
        for ip in &ep.ips {
            // Another pod's tombstone is taken over: that pod no longer holds the address
            // (IPAM gave it to us), and `attach_endpoint` purged its flows.
            if let Some(old) = m.endpoint(*ip)? {
                if old.owner != owner && old.flags.contains(EndpointFlags::ACTIVE) {
                    let who = owner_label(&mut m, old.owner);
                    return Err(Error::datapath(
                        format!("adding endpoint {ip}"),
                        format!("the address is already attached to {who}"),
                    ));
                }
            }
        }
        m.owners()?
            .insert(owner, record, 0)
            .map_err(|e| maps::err(map_name::OWNERS, "insert", e))?;
        // Before the entries that flag the pod as paced; without a rate, a schedule left
        // on this ifindex by an earlier interface (a crash before its removal) must not
        // apply to the new one. (The map lock is released: both take it.)
        drop(m);
        // Before the address entries: a pod its namespace's policies may select sends
        // and receives nothing until the agent has put its rules in force.
        self.put_policy_endpoint(ep.host_ifindex, owner, ep.pod.as_ref())?;
        match &ep.egress_rate {
            Some(rate) => self.put_pacing(ep.host_ifindex, rate)?,
            None => self.remove_pacing([ep.host_ifindex])?,
        }
        m = self.maps()?;
        // A fresh share: whatever an earlier interface with this ifindex was charged is
        // not this pod's. Before the entries that let the pod's packets open flows (GC
        // takes a flow charged to an ifindex without a share for an orphan).
        let share = NatUse {
            entries: 0,
            cap: ep.nat_flows.saturating_mul(2),
            swept_ns: 0,
        };
        m.nat_use()?
            .insert(ep.host_ifindex, share, 0)
            .map_err(|e| maps::err(map_name::NAT_USE, "insert", e))?;
        let zero = maps::zero_percpu::<EndpointStats>()?;
        m.ep_stats()?
            .insert(ep.host_ifindex, zero, 0)
            .map_err(|e| maps::err(map_name::EP_STATS, "insert", e))?;
        let mut flags = EndpointFlags::ACTIVE;
        flags.set(EndpointFlags::PACED, ep.egress_rate.is_some());
        flags.set(EndpointFlags::NO_HOST_PORTS, !ep.host_ports);
        flags.set(EndpointFlags::NETKIT, ep.netkit);
        let info = EndpointInfo {
            ifindex: ep.host_ifindex,
            flags,
            host_mac: ep.host_mac,
            pod_mac: ep.pod_mac,
            _pad: [0; 4],
            owner,
        };
        for ip in &ep.ips {
            m.put_endpoint(*ip, info, "insert")?;
        }
        let mut allow = m.src_allow()?;
        for net in v4_nets(&ep.allowed_sources) {
            let key = src_allow_key(ep.host_ifindex, net);
            allow
                .insert(&key, 1, 0)
                .map_err(|e| maps::err(map_name::SRC_ALLOW, format!("insert {net}"), e))?;
        }
        let mut allow6 = m.src_allow6()?;
        for (net, what) in sources6(ep) {
            let key = src_allow6_key(ep.host_ifindex, net);
            allow6
                .insert(&key, what, 0)
                .map_err(|e| maps::err(map_name::SRC_ALLOW6, format!("insert {net}"), e))?;
        }
        Ok(())
    }

    /// Makes a pod reachable: endpoint map entries, per-pod counters, stale NAT state of
    /// its addresses purged, and `from_pod` attached to the host veth's ingress and
    /// `to_pod` to its egress as the configuration's `attach` asks (clsact filters, or
    /// pinned tcx links).
    pub fn attach_endpoint(&self, ep: &Endpoint) -> Result<()> {
        if ep.host_ifindex == 0 {
            return Err(Error::datapath(
                format!("attaching {}", ep.host_ifname),
                "host ifindex 0",
            ));
        }
        // An old flow of a previous holder of these addresses must not reach this pod. Its
        // removal purges them before it drops its tombstones; only a tombstone tells of a
        // removal not finished (a full purge is a walk of the whole NAT table, the bulk of
        // an ADD on a node with many open flows).
        let _lock;
        let mut previous_owners = HashSet::new();
        if !self.tombstoned(&ep.ips)?.is_empty() {
            // A removal still purging them (DEL's finishing process) holds the lock until
            // it is done and has dropped its tombstones; whatever is left then is a
            // removal's that stopped or has not purged yet.
            _lock = FlowsLock::acquire(&self.pins)?;
            let stale = self.tombstoned(&ep.ips)?;
            if !stale.is_empty() {
                let addrs: Vec<IpAddr> = stale.iter().map(|(ip, _)| *ip).collect();
                tracing::info!("purging the flows a removal of {addrs:?} left behind");
                self.purge_flows(&addrs)?;
                previous_owners = stale.into_iter().map(|(_, owner)| owner).collect();
            }
        }
        self.put_endpoint_entries(ep)?;
        // The tombstones are this pod's entries now: the pods that left them may have
        // nothing else that refers to their owner records, which no purge would find.
        previous_owners.remove(&owner_id(ep.container_id.as_bytes(), ep.ifname.as_bytes()));
        if let Err(e) = self.drop_owners_if_unused(&previous_owners) {
            tracing::warn!("dropping the owner records of removed pods: {e}");
        }
        crate::faults::point("datapath-entries-written")?;
        let programs = self.pod_programs(ep);
        if ep.netkit {
            // Until `from_netkit` is attached the pair drops what the pod sends.
            for p in &programs {
                let hook = NetkitHook::of(p.dir);
                netkit::attach(&self.program(p.name)?, ep.host_ifindex, hook, &p.pin)?;
            }
            return Ok(());
        }
        let mut loaded = Vec::with_capacity(programs.len());
        for p in &programs {
            loaded.push(self.program(p.name)?);
        }
        if self.attach == AttachPolicy::Tc {
            let tc: Vec<attach::TcProgram<'_>> = programs
                .iter()
                .zip(&loaded)
                .map(|(p, program)| attach::TcProgram {
                    program,
                    name: p.name,
                    dir: p.dir,
                    pin: &p.pin,
                })
                .collect();
            return attach::attach_tc_all(&ep.host_ifname, ep.host_ifindex, attach::TC_HANDLE, &tc);
        }
        for (p, mut program) in programs.iter().zip(loaded) {
            attach::attach(
                &mut program,
                &ep.host_ifname,
                ep.host_ifindex,
                p.dir,
                &p.pin,
                attach::TC_HANDLE,
                self.attach,
            )?;
        }
        Ok(())
    }

    /// The two programs of pod `ep`, in attach order: the one judging what reaches the
    /// pod first, since once the pod's own program runs its packets may be answered.
    /// `from_pod`/`to_pod` on a veth pod, `from_netkit`/`to_netkit` on a netkit pod.
    pub(super) fn pod_programs(&self, ep: &Endpoint) -> [PodProgram; 2] {
        let (to, from) = if ep.netkit {
            (prog::TO_NETKIT, prog::FROM_NETKIT)
        } else {
            (prog::TO_POD, prog::FROM_POD)
        };
        [
            PodProgram {
                name: to,
                dir: TcAttachType::Egress,
                pin: self.pins.endpoint_egress_link(&ep.host_ifname),
            },
            PodProgram {
                name: from,
                dir: TcAttachType::Ingress,
                pin: self.pins.endpoint_link(&ep.host_ifname),
            },
        ]
    }

    /// Removes everything of (container ID, ifname): endpoint entries (those of `ips` and
    /// any other it owns), counters, `from_pod` on the host veth (link pin or clsact
    /// filter), NAT state of its addresses. Idempotent; never touches entries owned by
    /// another container.
    pub fn detach_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
        host_ifname: &str,
        ips: &[IpAddr],
    ) -> Result<()> {
        let owner = owner_id(container_id.as_bytes(), ifname.as_bytes());
        let ifindexes = self.take_endpoint_entries(owner, ips)?.1;
        self.release_interfaces(owner, &ifindexes)?;
        attach::remove_pin(&self.pins.endpoint_link(host_ifname))?;
        attach::remove_pin(&self.pins.endpoint_egress_link(host_ifname))?;
        attach::remove_filter(host_ifname, TcAttachType::Ingress, attach::TC_HANDLE)?;
        attach::remove_filter(host_ifname, TcAttachType::Egress, attach::TC_HANDLE)?;
        self.forget(owner)
    }

    /// Everything DEL and GC remove of (container ID, ifname) — host ports, endpoint
    /// entries, counters, the link pin, NAT state, the owner record — reading each map
    /// once (the NAT table is scanned once for all the pod's addresses). Best effort: every
    /// step is tried and each failure lands in `errors`.
    pub fn remove_pod(
        &self,
        container_id: &str,
        ifname: &str,
        host_ifname: &str,
        ips: &[IpAddr],
        errors: &mut Vec<Error>,
    ) {
        let taken = self.take_pod(container_id, ifname, host_ifname, ips, errors);
        let owner = owner_id(container_id.as_bytes(), ifname.as_bytes());
        if let Err(e) = self.release_interfaces(owner, &taken.ifindexes) {
            errors.push(e);
        }
        if let Err(e) = self.forget_pod(container_id, ifname) {
            errors.push(e);
        }
    }

    /// What is left of `owner`'s host interfaces `ifindexes` once [`Self::take_pod`] has
    /// taken its entries: the pod namespaces recorded for them, and any policy entry of
    /// `owner` (also on an interface no address entry names any more). Each is a walk of
    /// a map as large as the node's pod count, which is why DEL leaves this to its
    /// finishing process (`cmd::del`), where it also spares an interface that exists.
    pub fn release_interfaces(&self, owner: u64, ifindexes: &BTreeSet<u32>) -> Result<()> {
        self.forget_pod_netns(ifindexes)?;
        self.remove_policy_endpoints(owner)
    }

    /// The part of [`Self::remove_pod`] after which the pod is unreachable and nothing
    /// opens a flow for its addresses: its host ports and endpoint entries are taken (the
    /// addresses' entries become tombstones), its counters, its policy entries on the
    /// interfaces those entries name, and the link pins go. Returns the addresses
    /// removed, whose flow state [`Self::forget_pod`] purges, and those interfaces, for
    /// [`Self::release_interfaces`]. Best effort, as `remove_pod`.
    pub fn take_pod(
        &self,
        container_id: &str,
        ifname: &str,
        host_ifname: &str,
        ips: &[IpAddr],
        errors: &mut Vec<Error>,
    ) -> RemovedEntries {
        let owner = owner_id(container_id.as_bytes(), ifname.as_bytes());
        let mut taken = RemovedEntries::default();
        match self.take_port_mappings(owner) {
            Ok(a) => taken.addrs.extend(a),
            Err(e) => errors.push(e),
        }
        match self.take_endpoint_entries(owner, ips) {
            Ok((a, ifindexes)) => {
                taken.addrs.extend(a);
                taken.ifindexes = ifindexes;
            }
            Err(e) => errors.push(e),
        }
        if let Err(e) = self.remove_policy_endpoints_on(owner, &taken.ifindexes) {
            errors.push(e);
        }
        if let Err(e) = crate::faults::point("teardown-endpoints-marked") {
            errors.push(e);
        }
        for r in [
            attach::remove_pin(&self.pins.endpoint_link(host_ifname)),
            attach::remove_pin(&self.pins.endpoint_egress_link(host_ifname)),
        ] {
            if let Err(e) = r {
                errors.push(e);
            }
        }
        taken
    }

    /// The rest of [`Self::remove_pod`] after [`Self::take_pod`]: the flow state of the
    /// tombstoned addresses, the tombstones, and the owner record of (container ID, ifname)
    /// once nothing refers to it ([`Self::forget`]).
    fn forget_pod(&self, container_id: &str, ifname: &str) -> Result<()> {
        self.forget(owner_id(container_id.as_bytes(), ifname.as_bytes()))
    }

    /// Drops the owner record of (container ID, ifname) unless an entry (a tombstone
    /// too) still refers to it.
    pub fn drop_owner_record(&self, container_id: &str, ifname: &str) -> Result<()> {
        self.drop_owner_if_unused(owner_id(container_id.as_bytes(), ifname.as_bytes()))
    }

    /// Removes `owner`'s endpoint entries (those of `ips` and any other it owns) and their
    /// counters; returns the addresses removed and the host interfaces their entries
    /// named.
    fn take_endpoint_entries(
        &self,
        owner: u64,
        ips: &[IpAddr],
    ) -> Result<(Vec<IpAddr>, BTreeSet<u32>)> {
        let mut m = self.maps()?;
        let mut gone = Vec::new();
        let mut ifindexes = BTreeSet::new();
        let mut doomed: Vec<(IpAddr, EndpointInfo)> = m
            .all_endpoints()?
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .collect();
        for ip in ips {
            if !doomed.iter().any(|(d, _)| d == ip) {
                if let Some(v) = m.endpoint(*ip)? {
                    if v.owner == owner {
                        doomed.push((*ip, v));
                    }
                }
            }
        }
        for (ip, mut v) in doomed {
            ifindexes.insert(v.ifindex);
            // A tombstone until the address's flows are purged ([`Self::purge_removed`]).
            v.flags.remove(EndpointFlags::ACTIVE);
            m.put_endpoint(ip, v, "mark as removed")?;
            gone.push(ip);
        }
        Self::take_sources6(&mut m, ips, &mut ifindexes)?;
        let mut allow = m.src_allow()?;
        let doomed: Vec<_> = allow
            .keys()
            .filter_map(std::result::Result::ok)
            .filter(|k| ifindexes.contains(&u32::from_be(k.data().ifindex_be)))
            .collect();
        for k in doomed {
            match allow.remove(&k) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::SRC_ALLOW, "delete", e)),
            }
        }
        let mut st = m.ep_stats()?;
        for i in &ifindexes {
            match st.remove(i) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::EP_STATS, "delete", e)),
            }
        }
        let mut shares = m.nat_use()?;
        for i in &ifindexes {
            match shares.remove(i) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::NAT_USE, "delete", e)),
            }
        }
        drop(m);
        self.remove_pacing(ifindexes.iter().copied())?;
        Ok((gone, ifindexes))
    }

    /// After `owner`'s entries are taken: the flow state of every tombstoned address, then
    /// those tombstones ([`Self::purge_removed`]), then `owner`'s record if nothing refers
    /// to it any more.
    pub(super) fn forget(&self, owner: u64) -> Result<()> {
        self.purge_removed(|_| {})?;
        self.drop_owner_if_unused(owner)
    }

    /// Purges the flow state of every tombstoned address, drops those tombstones, and the
    /// owner records of the pods they were left by once nothing refers to them. Gives
    /// `walked` how many NAT entries the purge read (not called when there was no
    /// tombstone, so no walk) before it releases the flows lock: whoever records that size
    /// does so before another process can find no walk running and an older size recorded.
    ///
    /// Under the flows lock ([`FlowsLock`]): an ADD that finds a tombstone waits for it,
    /// so it never takes an address over while its flows are being purged.
    ///
    /// Every tombstone is purged, not only one pod's: removals waiting for the lock (DELs'
    /// finishing processes, many at once when pods churn) then find theirs done, and a node
    /// walks its NAT table once for all of them. Any tombstone may go at any time: nothing
    /// opens a flow for its address. An address without an entry has no flow state (its
    /// removal purged it before dropping the tombstone), and one with a live entry belongs
    /// to a pod whose ADD purged it, under this lock, before its first flow: both are left
    /// alone.
    pub fn purge_removed(&self, walked: impl FnOnce(usize)) -> Result<()> {
        let owners = {
            let _lock = FlowsLock::acquire(&self.pins)?;
            let doomed = self.tombstones()?;
            if doomed.is_empty() {
                return Ok(());
            }
            let addrs: Vec<IpAddr> = doomed.iter().map(|(ip, _)| *ip).collect();
            let read = self.purge_flows(&addrs)?;
            self.clear_tombstones(&addrs)?;
            walked(read);
            doomed
                .into_iter()
                .map(|(_, owner)| owner)
                .collect::<HashSet<u64>>()
        };
        self.drop_owners_if_unused(&owners)
    }

    /// Every address whose endpoint entry is a tombstone, both families, with the owner
    /// that left it.
    fn tombstones(&self) -> Result<Vec<(IpAddr, u64)>> {
        let mut m = self.maps()?;
        Ok(m.all_endpoints()?
            .into_iter()
            .filter(|(_, v)| !v.flags.contains(EndpointFlags::ACTIVE))
            .map(|(ip, v)| (ip, v.owner))
            .collect())
    }

    /// The endpoint entry of each of `addrs` (of its family's map), if any.
    fn entries_of(&self, addrs: &[IpAddr]) -> Result<Vec<(IpAddr, Option<EndpointInfo>)>> {
        let mut m = self.maps()?;
        addrs.iter().map(|ip| Ok((*ip, m.endpoint(*ip)?))).collect()
    }

    /// Removes the entries of `addrs` that are still tombstones (whoever's).
    fn clear_tombstones(&self, addrs: &[IpAddr]) -> Result<()> {
        let mut m = self.maps()?;
        for ip in addrs {
            if m.endpoint(*ip)?
                .is_some_and(|v| !v.flags.contains(EndpointFlags::ACTIVE))
            {
                m.remove_endpoint(*ip)?;
            }
        }
        Ok(())
    }

    /// Which of `addrs` have a tombstone: a removal of their previous holder stopped
    /// before it purged their flows (killed, or failed part-way). Every other address
    /// either has a live entry or none, and then no flow state either.
    fn tombstoned(&self, addrs: &[IpAddr]) -> Result<Vec<(IpAddr, u64)>> {
        Ok(self
            .entries_of(addrs)?
            .into_iter()
            .filter_map(|(ip, v)| {
                v.filter(|v| !v.flags.contains(EndpointFlags::ACTIVE))
                    .map(|v| (ip, v.owner))
            })
            .collect())
    }

    fn drop_owner_if_unused(&self, owner: u64) -> Result<()> {
        self.drop_owners_if_unused(&HashSet::from([owner]))
    }

    /// Drops the owner record of each of `owners` that no endpoint or host-port entry
    /// (a tombstone too) refers to, reading each of those maps once for all of them.
    fn drop_owners_if_unused(&self, owners: &HashSet<u64>) -> Result<()> {
        if owners.is_empty() {
            return Ok(());
        }
        let mut m = self.maps()?;
        let mut used: HashSet<u64> = HashSet::new();
        used.extend(m.all_endpoints()?.iter().map(|(_, v)| v.owner));
        used.extend(maps::entries(&m.portmaps()?).iter().map(|(_, v)| v.owner));
        used.extend(maps::entries(&m.portmaps6()?).iter().map(|(_, v)| v.owner));
        let mut records = m.owners()?;
        for owner in owners.difference(&used) {
            maps::remove(&mut records, owner, map_name::OWNERS)?;
        }
        Ok(())
    }
}

impl Datapath {
    /// Removes the IPv6 source entries (own addresses and allow-list) of the pods behind
    /// host veths `ifindexes`, which it first extends with the host veths that hold one of
    /// `ips` (IPv6) as their own: a pod with no IPv4 address has no endpoint entry to
    /// find its host veth by.
    fn take_sources6(
        m: &mut maps::Maps,
        ips: &[IpAddr],
        ifindexes: &mut BTreeSet<u32>,
    ) -> Result<()> {
        let mut allow6 = m.src_allow6()?;
        let own: HashSet<[u8; 16]> = ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V6(a) => Some(a.octets()),
                IpAddr::V4(_) => None,
            })
            .collect();
        for k in allow6.keys().filter_map(std::result::Result::ok) {
            if k.prefix_len() == 160 && own.contains(&k.data().addr) {
                let own_entry = allow6.get(&k, 0).is_ok_and(|v| v == SRC6_OWN);
                if own_entry {
                    ifindexes.insert(u32::from_be(k.data().ifindex_be));
                }
            }
        }
        let doomed: Vec<_> = allow6
            .keys()
            .filter_map(std::result::Result::ok)
            .filter(|k| ifindexes.contains(&u32::from_be(k.data().ifindex_be)))
            .collect();
        for k in doomed {
            match allow6.remove(&k) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::SRC_ALLOW6, "delete", e)),
            }
        }
        Ok(())
    }
}

/// The IPv4 prefixes of `nets`.
pub(crate) fn v4_nets(nets: &[IpNet]) -> impl Iterator<Item = Ipv4Net> + '_ {
    nets.iter().filter_map(|n| match n {
        IpNet::V4(v4) => Some(*v4),
        IpNet::V6(_) => None,
    })
}

/// The IPv6 sources of `ep` as `SRC_ALLOW6` holds them: its own addresses (/128,
/// [`SRC6_OWN`]) and its IPv6 allow-list ([`SRC6_ALLOWED`]).
pub(crate) fn sources6(ep: &Endpoint) -> Vec<(Ipv6Net, u32)> {
    let own = ep.ips.iter().filter_map(|ip| match ip {
        IpAddr::V6(a) => Some((Ipv6Net::from(*a), SRC6_OWN)),
        IpAddr::V4(_) => None,
    });
    let allowed = ep.allowed_sources.iter().filter_map(|n| match n {
        IpNet::V6(v6) => Some((*v6, SRC6_ALLOWED)),
        IpNet::V4(_) => None,
    });
    // An own address also in the allow-list: one entry, as its own.
    let mut out: Vec<(Ipv6Net, u32)> = own.collect();
    for (net, what) in allowed {
        if !out.iter().any(|(n, _)| *n == net) {
            out.push((net, what));
        }
    }
    out
}

/// The `SRC_ALLOW6` key of prefix `net` for the pod behind host veth `ifindex`.
pub(crate) fn src_allow6_key(ifindex: u32, net: Ipv6Net) -> Key<SrcAllow6Key> {
    Key::new(
        32 + u32::from(net.prefix_len()),
        SrcAllow6Key {
            ifindex_be: ifindex.to_be(),
            addr: net.network().octets(),
        },
    )
}

/// The `SRC_ALLOW` key of prefix `net` for the pod behind host veth `ifindex`.
pub(crate) fn src_allow_key(ifindex: u32, net: Ipv4Net) -> Key<SrcAllowKey> {
    Key::new(
        32 + u32::from(net.prefix_len()),
        SrcAllowKey {
            ifindex_be: ifindex.to_be(),
            addr: ipv4_to_map(net.network()),
        },
    )
}
