//! NetworkPolicy state in the pinned maps (see `cni-ebpf-bpf/src/policy.rs` for how the
//! programs read it and `crate::policy` for how rule sets are compiled):
//!
//! - each pod interface's entry in `POLICY_ENDPOINTS`, both slots, written by ADD (closed
//!   when the pod's namespace holds a policy, so that the pod sends and receives nothing
//!   before its rules are in force; open otherwise) and removed by DEL and GC;
//! - the rule tables of each rule set (`POLICY_PEERS`, `POLICY_PORTS`, `POLICY_EXACT`),
//!   written before any entry names them and removed after none does;
//! - the swap: every entry's slot not in force rewritten, then `POLICY_STATE` flipped to
//!   it with a new generation, so a packet sees the whole old or the whole new policy.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use aya::maps::lpm_trie::Key;
use cni_ebpf_common::{
    fnv1a64, map as map_name, PolicyClassCounts, PolicyClassKey, PolicyCounts, PolicyDeny,
    PolicyDomainKey, PolicyEndpoint, PolicyEndpointKey, PolicyExactKey, PolicyPeerKey,
    PolicyPortKey, PolicyState, PolicyTiers, POLICY_DENY_SLOTS, RULESET_CLOSED, RULESET_OPEN,
    TIERS_NETWORK_POLICY,
};

use super::{maps, Datapath};
use crate::{
    error::{Error, Result},
    ipam::record::PodRef,
    policy::{
        tables::{addr_bits, canonical, DomainPattern, PortPrefix, Prefix},
        Ruleset,
    },
};

/// `BPF_EXIST`: an update that never creates the key.
const BPF_EXIST: u64 = 2;

pub use crate::policy::cluster::pod_key;

/// The key of a namespace in `POLICY_NAMESPACES`.
#[must_use]
pub fn namespace_key(namespace: &str) -> u64 {
    fnv1a64(&[namespace.as_bytes()], 0)
}

fn peer_key(ruleset: u32, p: &Prefix) -> Key<PolicyPeerKey> {
    Key::new(
        32 + u32::from(p.len),
        PolicyPeerKey {
            ruleset,
            addr: p.addr.to_be_bytes(),
        },
    )
}

fn port_key(ruleset: u32, p: &PortPrefix) -> Key<PolicyPortKey> {
    let [_, proto, hi, lo] = p.bits.to_be_bytes();
    Key::new(
        32 + u32::from(p.len),
        PolicyPortKey {
            ruleset,
            proto,
            port: [hi, lo],
            _pad: 0,
        },
    )
}

fn domain_key(ruleset: u32, p: &DomainPattern) -> PolicyDomainKey {
    PolicyDomainKey {
        ruleset,
        kind: p.kind,
        hash: p.hash,
    }
}

fn exact_key(ruleset: u32, addr: IpAddr, proto: u8, port: u16) -> PolicyExactKey {
    PolicyExactKey {
        ruleset,
        addr: addr_bits(addr).to_be_bytes(),
        port: port.to_be_bytes(),
        proto,
        _pad: 0,
    }
}

impl Datapath {
    /// ADD: the entry of pod interface `ifindex` (owner `owner`) in both slots: closed
    /// when the pod's namespace holds a policy, or when the network enforces policy and
    /// no agent holds its lease (an agent gone for good: the policy is no longer kept
    /// current, so nothing new starts open); open otherwise, and for a pod the runtime
    /// did not name (no policy can select it). Written before the pod's address entries,
    /// so no packet reaches the pod before it. The agent opens a closed pod as its
    /// policies say once it knows the pod's object.
    pub fn put_policy_endpoint(
        &self,
        ifindex: u32,
        owner: u64,
        pod: Option<&PodRef>,
    ) -> Result<()> {
        let unleased = pod.is_some()
            && self.enforces_policy()?
            && self.agent_lease_s()? < super::node_facts::boottime_s();
        if unleased {
            tracing::warn!(
                "no agent holds this network's NetworkPolicy lease: the pod is closed until \
                 one does"
            );
        }
        let mut m = self.maps()?;
        let policed = unleased
            || match pod {
                Some(p) => maps::get(
                    &m.policy_namespaces()?,
                    &namespace_key(&p.namespace),
                    map_name::POLICY_NAMESPACES,
                )?
                .is_some(),
                None => false,
            };
        let rules = if policed {
            RULESET_CLOSED
        } else {
            RULESET_OPEN
        };
        let value = PolicyEndpoint {
            ingress: rules,
            egress: rules,
            owner,
            pod: pod.map_or(0, |p| pod_key(&p.namespace, &p.name)),
        };
        let mut h = m.policy_endpoints()?;
        for slot in 0..2 {
            h.insert(PolicyEndpointKey { ifindex, slot }, value, 0)
                .map_err(|e| maps::err(map_name::POLICY_ENDPOINTS, "insert", e))?;
        }
        Ok(())
    }

    /// The entries of `owner` on host interfaces `ifindexes` (both slots) and their
    /// verdict counts, one lookup each: what DEL removes, knowing the interfaces from the
    /// pod's address entries.
    pub fn remove_policy_endpoints_on(&self, owner: u64, ifindexes: &BTreeSet<u32>) -> Result<()> {
        if ifindexes.is_empty() || !self.pins.map(map_name::POLICY_ENDPOINTS).exists() {
            return Ok(());
        }
        let mut m = self.maps()?;
        let mut h = m.policy_endpoints()?;
        let mut doomed = Vec::new();
        for &ifindex in ifindexes {
            for slot in 0..2 {
                let k = PolicyEndpointKey { ifindex, slot };
                if maps::get(&h, &k, map_name::POLICY_ENDPOINTS)?.is_some_and(|v| v.owner == owner)
                {
                    doomed.push(k);
                }
            }
        }
        for k in &doomed {
            maps::remove(&mut h, k, map_name::POLICY_ENDPOINTS)?;
        }
        // The interfaces' verdict counts go with their entries (an index may be reused).
        if doomed.is_empty() || !self.pins.map(map_name::POLICY_COUNTS).exists() {
            return Ok(());
        }
        let mut counts = m.policy_counts()?;
        for k in &doomed {
            if let Err(e) = counts.remove(&k.ifindex) {
                if !maps::is_not_found(&e) {
                    return Err(maps::err(map_name::POLICY_COUNTS, "delete", e));
                }
            }
        }
        Ok(())
    }

    /// The host interfaces `owner` has policy entries on (a walk of the map).
    pub fn policy_interfaces_of(&self, owner: u64) -> Result<BTreeSet<u32>> {
        if !self.pins.map(map_name::POLICY_ENDPOINTS).exists() {
            return Ok(BTreeSet::new());
        }
        let mut m = self.maps()?;
        Ok(maps::entries(&m.policy_endpoints()?)
            .into_iter()
            .filter(|(_, v)| v.owner == owner)
            .map(|(k, _)| k.ifindex)
            .collect())
    }

    /// GC and ADD's undo: every entry of `owner`, on whatever interface (a crash may have
    /// left some without the address entries that name the interface), and their verdict
    /// counts. A walk of the map.
    pub fn remove_policy_endpoints(&self, owner: u64) -> Result<()> {
        self.remove_policy_endpoints_on(owner, &self.policy_interfaces_of(owner)?)
    }

    /// The policy's verdicts at each pod interface (by host veth ifindex), summed over
    /// the CPUs.
    pub fn policy_counts(&self) -> Result<BTreeMap<u32, PolicyCounts>> {
        let mut m = self.maps()?;
        let counts = m.policy_counts()?;
        let mut out = BTreeMap::new();
        for item in counts.iter() {
            let (ifindex, per_cpu) =
                item.map_err(|e| maps::err(map_name::POLICY_COUNTS, "read", e))?;
            let mut sum = PolicyCounts::default();
            for c in per_cpu.iter() {
                sum.ingress_admitted += c.ingress_admitted;
                sum.ingress_denied += c.ingress_denied;
                sum.egress_admitted += c.egress_admitted;
                sum.egress_denied += c.egress_denied;
            }
            out.insert(ifindex, sum);
        }
        Ok(out)
    }

    /// The verdicts each cluster policy rule's class decided, summed over the CPUs.
    pub fn policy_class_counts(&self) -> Result<BTreeMap<PolicyClassKey, PolicyClassCounts>> {
        let mut m = self.maps()?;
        let counts = m.policy_class_counts()?;
        let mut out = BTreeMap::new();
        for item in counts.iter() {
            let (key, per_cpu) =
                item.map_err(|e| maps::err(map_name::POLICY_CLASS_COUNTS, "read", e))?;
            let mut sum = PolicyClassCounts::default();
            for c in per_cpu.iter() {
                sum.admitted += c.admitted;
                sum.denied += c.denied;
            }
            out.insert(key, sum);
        }
        Ok(out)
    }

    /// The latest packets the policy refused, every CPU's ring, oldest first.
    pub fn policy_denies(&self) -> Result<Vec<DenyView>> {
        let mut m = self.maps()?;
        let ring = m.policy_denies()?;
        let now_mono = monotonic_ns();
        let now_wall = std::time::SystemTime::now();
        let mut out = Vec::new();
        for slot in 0..POLICY_DENY_SLOTS {
            let per_cpu = ring
                .get(&slot, 0)
                .map_err(|e| maps::err(map_name::POLICY_DENIES, "lookup", e))?;
            for (cpu, d) in per_cpu.iter().enumerate() {
                if d.seq == 0 {
                    continue;
                }
                let ago = std::time::Duration::from_nanos(now_mono.saturating_sub(d.time_ns));
                out.push(DenyView::new(cpu, d, now_wall.checked_sub(ago)));
            }
        }
        out.sort_by_key(|d| (d.time_ns, d.cpu, d.seq));
        Ok(out)
    }

    /// Every pod interface's entries, both slots.
    pub fn policy_endpoints(&self) -> Result<Vec<(PolicyEndpointKey, PolicyEndpoint)>> {
        let mut m = self.maps()?;
        Ok(maps::entries(&m.policy_endpoints()?))
    }

    /// The slot in force and its generation.
    pub fn policy_state(&self) -> Result<PolicyState> {
        let mut m = self.maps()?;
        m.policy_state()?
            .get(&0, 0)
            .map_err(|e| maps::err(map_name::POLICY_STATE, "lookup", e))
    }

    /// Writes the tables of rule set `id`. A full table is an error naming it (the caller
    /// closes the pods that would have used it).
    pub fn put_ruleset(&self, id: u32, rs: &Ruleset) -> Result<()> {
        if id == RULESET_OPEN || id == RULESET_CLOSED {
            return Err(Error::datapath(
                format!("writing rule set {id}"),
                "the id is reserved",
            ));
        }
        let mut m = self.maps()?;
        let mut peers = m.policy_peers()?;
        for (p, mask) in &rs.peers {
            peers
                .insert(&peer_key(id, p), mask, 0)
                .map_err(|e| maps::err(map_name::POLICY_PEERS, "insert", e))?;
        }
        let mut ports = m.policy_ports()?;
        for (p, mask) in &rs.ports {
            ports
                .insert(&port_key(id, p), mask, 0)
                .map_err(|e| maps::err(map_name::POLICY_PORTS, "insert", e))?;
        }
        let mut exact = m.policy_exact()?;
        for ((addr, proto, port), mask) in &rs.exact {
            exact
                .insert(exact_key(id, *addr, *proto, *port), mask, 0)
                .map_err(|e| maps::err(map_name::POLICY_EXACT, "insert", e))?;
        }
        let mut domains = m.policy_domains()?;
        for (pattern, mask) in &rs.domains {
            domains
                .insert(domain_key(id, pattern), mask, 0)
                .map_err(|e| maps::err(map_name::POLICY_DOMAINS, "insert", e))?;
        }
        // The tiers last: the datapath reads a rule set's names once its tiers say so.
        if let Some(tiers) = &rs.tiers {
            m.policy_tiers()?
                .insert(id, tiers, 0)
                .map_err(|e| maps::err(map_name::POLICY_TIERS, "insert", e))?;
        }
        Ok(())
    }

    /// Removes the tables of rule set `id` (once no entry in either slot names it).
    pub fn remove_ruleset(&self, id: u32, rs: &Ruleset) -> Result<()> {
        let mut m = self.maps()?;
        let mut peers = m.policy_peers()?;
        for p in rs.peers.keys() {
            match peers.remove(&peer_key(id, p)) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::POLICY_PEERS, "delete", e)),
            }
        }
        let mut ports = m.policy_ports()?;
        for p in rs.ports.keys() {
            match ports.remove(&port_key(id, p)) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::POLICY_PORTS, "delete", e)),
            }
        }
        let mut exact = m.policy_exact()?;
        for (addr, proto, port) in rs.exact.keys() {
            maps::remove(
                &mut exact,
                &exact_key(id, *addr, *proto, *port),
                map_name::POLICY_EXACT,
            )?;
        }
        let mut domains = m.policy_domains()?;
        for pattern in rs.domains.keys() {
            maps::remove(
                &mut domains,
                &domain_key(id, pattern),
                map_name::POLICY_DOMAINS,
            )?;
        }
        maps::remove(&mut m.policy_tiers()?, &id, map_name::POLICY_TIERS)?;
        Ok(())
    }

    /// Puts `entries` (pod interface → its rule sets) in the slot not in force, then makes
    /// that slot the one in force under a new generation. An interface whose entry is
    /// gone (its pod was deleted meanwhile) or names another owner (reused) keeps what
    /// ADD wrote. Returns the state now in force.
    pub fn swap_policy(&self, entries: &[(u32, PolicyEndpoint)]) -> Result<PolicyState> {
        let current = self.policy_state()?;
        let next = PolicyState {
            slot: (current.slot & 1) ^ 1,
            generation: current.generation.wrapping_add(1).max(1),
        };
        let mut m = self.maps()?;
        let mut h = m.policy_endpoints()?;
        for (ifindex, value) in entries {
            let live = maps::get(
                &h,
                &PolicyEndpointKey {
                    ifindex: *ifindex,
                    slot: current.slot & 1,
                },
                map_name::POLICY_ENDPOINTS,
            )?;
            if live.is_none_or(|l| l.owner != value.owner) {
                continue;
            }
            // Only over an existing entry: one DEL removed meanwhile stays removed.
            match h.insert(
                PolicyEndpointKey {
                    ifindex: *ifindex,
                    slot: next.slot,
                },
                value,
                BPF_EXIST,
            ) {
                Ok(()) => {}
                Err(e) if maps::is_not_found(&e) => {}
                Err(e) => return Err(maps::err(map_name::POLICY_ENDPOINTS, "insert", e)),
            }
        }
        m.policy_state()?
            .set(0, next, 0)
            .map_err(|e| maps::err(map_name::POLICY_STATE, "update", e))?;
        Ok(next)
    }

    /// Every rule set the tables hold, by id (read back as the agent wrote them).
    pub fn policy_rulesets(&self) -> Result<BTreeMap<u32, Ruleset>> {
        /// One rule set's entries, as the tables hold them.
        #[derive(Default)]
        struct Entries {
            peers: Vec<(u8, [u8; 16], u64)>,
            ports: Vec<(u8, u8, [u8; 2], u64)>,
            exact: Vec<([u8; 16], u8, [u8; 2], u64)>,
            domains: BTreeMap<DomainPattern, u64>,
            tiers: Option<PolicyTiers>,
        }
        let mut m = self.maps()?;
        let mut by_id: BTreeMap<u32, Entries> = BTreeMap::new();
        let peers = m.policy_peers()?;
        for k in peers.keys().filter_map(std::result::Result::ok) {
            let d = k.data();
            let Ok(mask) = peers.get(&k, 0) else { continue };
            let len = u8::try_from(k.prefix_len().saturating_sub(32)).unwrap_or(128);
            by_id
                .entry(d.ruleset)
                .or_default()
                .peers
                .push((len, d.addr, mask));
        }
        let ports = m.policy_ports()?;
        for k in ports.keys().filter_map(std::result::Result::ok) {
            let d = k.data();
            let Ok(mask) = ports.get(&k, 0) else { continue };
            let len = u8::try_from(k.prefix_len().saturating_sub(32)).unwrap_or(24);
            by_id
                .entry(d.ruleset)
                .or_default()
                .ports
                .push((len, d.proto, d.port, mask));
        }
        for (k, mask) in maps::entries(&m.policy_exact()?) {
            by_id
                .entry(k.ruleset)
                .or_default()
                .exact
                .push((k.addr, k.proto, k.port, mask));
        }
        for (k, mask) in maps::entries(&m.policy_domains()?) {
            by_id.entry(k.ruleset).or_default().domains.insert(
                DomainPattern {
                    kind: k.kind,
                    hash: k.hash,
                },
                mask,
            );
        }
        for (id, tiers) in maps::entries(&m.policy_tiers()?) {
            by_id.entry(id).or_default().tiers = Some(tiers);
        }
        Ok(by_id
            .into_iter()
            .map(|(id, e)| {
                let mut rs = ruleset_from_entries(e.peers, e.ports, e.exact, e.tiers);
                rs.domains = e.domains;
                (id, rs)
            })
            .collect())
    }

    /// What pods learned from DNS answers: (pod key, address, the names' (kind, hash,
    /// expiry in `CLOCK_MONOTONIC` ns) still in the entry), in no particular order.
    pub fn policy_learned(&self) -> Result<Vec<LearnedView>> {
        let mut m = self.maps()?;
        Ok(maps::entries(&m.policy_learned()?)
            .into_iter()
            .map(|(k, v)| LearnedView {
                pod: k.pod,
                addr: canonical(IpAddr::from(k.addr)),
                names: v
                    .names
                    .iter()
                    .filter(|n| n.hash != 0)
                    .map(|n| {
                        (
                            DomainPattern {
                                kind: n.kind,
                                hash: n.hash,
                            },
                            n.expires_ns,
                        )
                    })
                    .collect(),
            })
            .collect())
    }

    /// Makes `namespaces` the set ADD closes new pods in.
    pub fn set_policy_namespaces(&self, namespaces: &BTreeSet<String>) -> Result<()> {
        let want: BTreeSet<u64> = namespaces.iter().map(|n| namespace_key(n)).collect();
        let mut m = self.maps()?;
        let mut h = m.policy_namespaces()?;
        for k in &want {
            h.insert(k, 1, 0)
                .map_err(|e| maps::err(map_name::POLICY_NAMESPACES, "insert", e))?;
        }
        maps::remove_where(&mut h, map_name::POLICY_NAMESPACES, |k, _| {
            !want.contains(k)
        })
    }
}

/// An address a pod learned from DNS answers ([`Datapath::policy_learned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedView {
    /// The pod ([`pod_key`]).
    pub pod: u64,
    pub addr: IpAddr,
    /// The rule names it was learned under, each with its expiry (`CLOCK_MONOTONIC` ns).
    pub names: Vec<(DomainPattern, u64)>,
}

/// What one direction of a pod interface's entry says, for `inspect`.
#[must_use]
pub fn describe_ruleset(id: u32) -> String {
    match id {
        RULESET_OPEN => "open".to_owned(),
        RULESET_CLOSED => "closed".to_owned(),
        id => format!("rules #{id}"),
    }
}

/// The NetworkPolicy state of a network, for `inspect`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyView {
    /// The generation in force (0: the agent never swapped one in; nothing is judged).
    pub generation: u32,
    /// The slot in force.
    pub slot: u32,
    /// Seconds the agent's lease on the policy still holds (negative: ran out that long
    /// ago; `None`: never held).
    pub lease_left_s: Option<i64>,
    /// Each pod interface's rule sets in the slot in force.
    pub endpoints: Vec<PolicyEndpointView>,
    /// Each rule set the entries name: its tables, as text.
    pub rulesets: BTreeMap<u32, RulesetView>,
}

/// One pod interface's entry in the slot in force.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyEndpointView {
    pub host_ifindex: u32,
    pub ingress: String,
    pub egress: String,
}

/// One rule set's tables: `prefix classes` lines.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RulesetView {
    pub peers: Vec<String>,
    pub ports: Vec<String>,
    pub named: Vec<String>,
}

impl Datapath {
    /// The NetworkPolicy state as the maps hold it.
    pub fn policy_view(&self) -> Result<PolicyView> {
        let state = self.policy_state()?;
        let slot = state.slot & 1;
        let mut endpoints: Vec<PolicyEndpointView> = self
            .policy_endpoints()?
            .into_iter()
            .filter(|(k, _)| k.slot == slot)
            .map(|(k, e)| PolicyEndpointView {
                host_ifindex: k.ifindex,
                ingress: describe_ruleset(e.ingress),
                egress: describe_ruleset(e.egress),
            })
            .collect();
        endpoints.sort_by_key(|e| e.host_ifindex);
        let rulesets = self
            .policy_rulesets()?
            .into_iter()
            .map(|(id, rs)| {
                let peers = rs
                    .peers
                    .iter()
                    .map(|(p, m)| format!("{} classes {m:#x}", prefix_text(p)))
                    .collect();
                let ports = rs
                    .ports
                    .iter()
                    .map(|(p, m)| format!("{} classes {m:#x}", port_text(p)))
                    .collect();
                let named = rs
                    .exact
                    .iter()
                    .map(|((a, proto, port), m)| format!("{a} {proto}/{port} classes {m:#x}"))
                    .chain(rs.tiers.iter().map(tiers_text))
                    .collect();
                (
                    id,
                    RulesetView {
                        peers,
                        ports,
                        named,
                    },
                )
            })
            .collect();
        let lease = self.agent_lease_s()?;
        Ok(PolicyView {
            generation: state.generation,
            slot,
            lease_left_s: (lease != 0)
                .then(|| i64::from(lease) - i64::from(super::node_facts::boottime_s())),
            endpoints,
            rulesets,
        })
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the eBPF side's `bpf_ktime_get_ns`).
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
    })
}

/// One packet the policy refused, as `inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DenyView {
    /// When (RFC 3339, UTC), from the monotonic time the datapath took.
    pub time: String,
    #[serde(skip)]
    pub time_ns: u64,
    #[serde(skip)]
    pub cpu: usize,
    #[serde(skip)]
    pub seq: u64,
    /// `ingress` (the destination pod's rules refused it) or `egress` (the source pod's).
    pub direction: &'static str,
    /// Host veth ifindex of the pod whose rules refused it.
    pub host_ifindex: u32,
    /// The rule set that refused it (`closed`, or `rules #<id>`).
    pub ruleset: String,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, or the protocol number.
    pub protocol: String,
    pub source: IpAddr,
    pub destination: IpAddr,
    /// Ports (ICMP echo: the identifier on the requester's side).
    pub source_port: u16,
    pub destination_port: u16,
    /// The IP protocol number.
    #[serde(skip)]
    pub proto: u8,
    /// The id behind `ruleset`.
    #[serde(skip)]
    pub ruleset_id: u32,
    /// What decided, when `inspect` could tell from the agent's state: the tier and the
    /// rules that refused it, or that no rule admits it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
}

impl DenyView {
    fn new(cpu: usize, d: &PolicyDeny, at: Option<std::time::SystemTime>) -> Self {
        let addr = |b: [u8; 16]| canonical(IpAddr::from(b));
        Self {
            time: at
                .and_then(|t| jiff::Timestamp::try_from(t).ok())
                .map_or_else(String::new, |t| format!("{t:.3}")),
            time_ns: d.time_ns,
            cpu,
            seq: d.seq,
            direction: if d.egress == 1 { "egress" } else { "ingress" },
            host_ifindex: d.ifindex,
            ruleset: describe_ruleset(d.ruleset),
            protocol: match d.flow.proto {
                6 => "tcp".to_owned(),
                17 => "udp".to_owned(),
                132 => "sctp".to_owned(),
                1 => "icmp".to_owned(),
                58 => "icmpv6".to_owned(),
                p => p.to_string(),
            },
            source: addr(d.flow.saddr),
            destination: addr(d.flow.daddr),
            source_port: u16::from_be(d.flow.sport),
            destination_port: u16::from_be(d.flow.dport),
            proto: d.flow.proto,
            ruleset_id: d.ruleset,
            decided_by: None,
        }
    }
}

impl std::fmt::Display for DenyView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ep = |a: &IpAddr, p: u16| match a {
            IpAddr::V6(_) => format!("[{a}]:{p}"),
            IpAddr::V4(_) => format!("{a}:{p}"),
        };
        write!(
            f,
            "{} {} {} {} -> {} refused by {} of host if {} ({})",
            self.time,
            self.direction,
            self.protocol,
            ep(&self.source, self.source_port),
            ep(&self.destination, self.destination_port),
            self.direction,
            self.host_ifindex,
            self.ruleset
        )?;
        match &self.decided_by {
            Some(why) => write!(f, ": {why}"),
            None => Ok(()),
        }
    }
}

fn prefix_text(p: &Prefix) -> String {
    let addr = std::net::Ipv6Addr::from(p.addr);
    match addr.to_ipv4_mapped() {
        Some(v4) if p.len >= 96 => format!("{v4}/{}", p.len - 96),
        _ => format!("{addr}/{}", p.len),
    }
}

/// How a rule set's classes rank, as `inspect` shows it.
fn tiers_text(t: &PolicyTiers) -> String {
    format!(
        "tiers: admin {:#x}, networkPolicy {:#x}{}, baseline {:#x}; accept {:#x}, deny {:#x}",
        t.admin,
        t.network_policy,
        if t.flags & TIERS_NETWORK_POLICY != 0 {
            " (selects the pod)"
        } else {
            ""
        },
        t.baseline,
        t.accept,
        t.deny
    )
}

fn port_text(p: &PortPrefix) -> String {
    if p.len == 0 {
        return "any protocol".to_owned();
    }
    let proto = p.bits >> 16;
    if p.len <= 8 {
        return format!("protocol {proto}, any port");
    }
    let lo = p.bits & 0xffff;
    let hi = lo | ((1u32 << (24 - u32::from(p.len))) - 1);
    if lo == hi {
        format!("{proto}/{lo}")
    } else {
        format!("{proto}/{lo}-{hi}")
    }
}

/// A rule set read back from the maps: the inverse of `Datapath::put_ruleset`.
#[must_use]
pub fn ruleset_from_entries(
    peers: impl IntoIterator<Item = (u8, [u8; 16], u64)>,
    ports: impl IntoIterator<Item = (u8, u8, [u8; 2], u64)>,
    exact: impl IntoIterator<Item = ([u8; 16], u8, [u8; 2], u64)>,
    tiers: Option<PolicyTiers>,
) -> Ruleset {
    Ruleset {
        peers: peers
            .into_iter()
            .map(|(len, addr, mask)| (Prefix::new(u128::from_be_bytes(addr), len), mask))
            .collect(),
        ports: ports
            .into_iter()
            .map(|(len, proto, port, mask)| {
                (
                    PortPrefix::from_bits(
                        (u32::from(proto) << 16) | u32::from(u16::from_be_bytes(port)),
                        len,
                    ),
                    mask,
                )
            })
            .collect(),
        exact: exact
            .into_iter()
            .map(|(addr, proto, port, mask)| {
                (
                    (
                        canonical(IpAddr::from(addr)),
                        proto,
                        u16::from_be_bytes(port),
                    ),
                    mask,
                )
            })
            .collect(),
        domains: BTreeMap::new(),
        tiers,
    }
}
