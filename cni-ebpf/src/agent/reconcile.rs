//! Puts a cluster's NetworkPolicy in force on this node's datapath, changing only what
//! differs from what the pinned maps hold.
//!
//! One [`Reconciler::reconcile`] round:
//! 1. the namespaces that hold a policy go to `POLICY_NAMESPACES` first (a pod ADD puts
//!    in one from then on starts closed);
//! 2. each pod interface in the slot in force is matched to its pod (by the
//!    `namespace/name` ADD recorded) and compiled; an interface whose pod the view does
//!    not know keeps what it has (ADD's closed entry stays closed until the pod is
//!    known);
//! 3. each rule set is kept under the id it already has (same content, same id) or
//!    written under a new one before anything names it; one the maps cannot hold closes
//!    the pods that need it, and says so;
//! 4. if any interface's rule sets differ, every interface's entry goes to the slot not
//!    in force and the slots swap (one write, a new generation);
//! 5. after in-flight packets are done with the old slot, rule sets no entry names are
//!    removed.
//!
//! After a restart [`Reconciler::resume`] reads the rule sets back from the maps, so the
//! first round of a new agent swaps nothing when nothing changed meanwhile.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use cni_ebpf_common::{PolicyEndpoint, RULESET_CLOSED, RULESET_OPEN, TIERS_DOMAINS};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::report::{DirectionState, PodState};
use crate::{
    datapath::Datapath,
    error::Result,
    policy::{
        cluster_network_policy::{self, ClusterNetworkPolicy},
        compile, parse_all, Cluster, Dir, Policies, Ruleset, Verdicts,
    },
};

/// The namespaces whose new pods ADD starts closed: those that hold a NetworkPolicy, and
/// those a cluster policy's subject selects (every one, for a policy whose subject cannot
/// be read).
fn closed_namespaces(
    cluster: &Cluster,
    policies: &[NetworkPolicy],
    all: &Policies<'_>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = policies
        .iter()
        .filter_map(|p| p.metadata.namespace.clone())
        .collect();
    for (name, labels) in cluster.namespaces() {
        let selected = all.cluster.iter().any(|p| p.namespaces.matches(labels))
            || all
                .broken_cluster
                .iter()
                .any(|b| b.subject.as_ref().is_none_or(|(ns, _)| ns.matches(labels)));
        if selected {
            out.insert(name.to_owned());
        }
    }
    out
}

/// How long a swapped-out slot may still be read by packets in flight. A program run
/// takes microseconds; this leaves a wide margin before their rule sets go.
const GRACE: Duration = Duration::from_millis(20);

/// The agent's memory of the rule sets in the maps.
#[derive(Debug, Default)]
pub struct Reconciler {
    ids: BTreeMap<Ruleset, u32>,
    next_id: u32,
    /// The floor of a learned address's lifetime its rule sets with domain names carry.
    dns_min_ttl_s: u32,
}

/// What one round found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Whether the slots were swapped (some pod's rule sets changed).
    pub swapped: bool,
    /// The generation in force after the round.
    pub generation: u32,
    /// Pods closed because their policy cannot be held, with the reason.
    pub closed: Vec<(String, String)>,
    /// Policies that cannot be represented, with the reason.
    pub broken: Vec<(String, String)>,
    /// Rule sets in the maps after the round.
    pub rulesets: usize,
    /// Pod interfaces on the node, and how many of them some policy selects.
    pub interfaces: usize,
    pub selected: usize,
    /// What each pod interface the view knows the pod of is now held to, and why.
    pub pods: Vec<PodState>,
}

impl Reconciler {
    /// The rule sets the maps hold now (after a restart, or a first start); rule sets
    /// written from now on that name domains keep their learned addresses at least
    /// `dns_min_ttl_s` seconds.
    pub fn resume(dp: &Datapath, dns_min_ttl_s: u32) -> Result<Self> {
        let ids: BTreeMap<Ruleset, u32> = dp
            .policy_rulesets()?
            .into_iter()
            .map(|(id, rs)| (rs, id))
            .collect();
        let next_id = ids
            .values()
            .copied()
            .max()
            .unwrap_or(0)
            .saturating_add(1)
            .max(1);
        Ok(Self {
            ids,
            next_id,
            dns_min_ttl_s,
        })
    }

    fn fresh_id(&mut self) -> u32 {
        let used: BTreeSet<u32> = self.ids.values().copied().collect();
        loop {
            let id = self.next_id;
            self.next_id = match self.next_id.wrapping_add(1) {
                RULESET_CLOSED => 1,
                n => n,
            };
            if id != RULESET_OPEN && id != RULESET_CLOSED && !used.contains(&id) {
                return id;
            }
        }
    }

    /// The id a pod's verdicts for `dir` are put in force under: open, closed, or a rule
    /// set's — the one it already has, or one written now under a fresh id. A rule set
    /// the maps cannot hold closes the pod; the reason a pod is closed is returned and
    /// recorded in `round`.
    fn ruleset_id(
        &mut self,
        dp: &Datapath,
        verdicts: Verdicts,
        dir: Dir,
        pod: &str,
        round: &mut Round,
    ) -> Result<(u32, Option<String>)> {
        let mut close = |reason: String| {
            round
                .closed
                .push((pod.to_owned(), format!("{}: {reason}", dir.as_str())));
            Ok((RULESET_CLOSED, Some(reason)))
        };
        match verdicts {
            Verdicts::Open => Ok((RULESET_OPEN, None)),
            Verdicts::Closed(reason) => close(reason),
            // Rules that admit nothing (a policy type without rules): no tables, the
            // closed entry says the same.
            Verdicts::Enforced(rs) if rs.entries() == 0 => Ok((RULESET_CLOSED, None)),
            Verdicts::Enforced(mut rs) => {
                if let Some(t) = rs.tiers.as_mut().filter(|t| t.flags & TIERS_DOMAINS != 0) {
                    t.dns_min_ttl_s = self.dns_min_ttl_s;
                }
                if let Some(id) = self.ids.get(&rs) {
                    return Ok((*id, None));
                }
                let id = self.fresh_id();
                match dp.put_ruleset(id, &rs) {
                    Ok(()) => {
                        self.ids.insert(rs, id);
                        Ok((id, None))
                    }
                    Err(e) => {
                        // What was written of it goes again; the pod is closed.
                        dp.remove_ruleset(id, &rs)?;
                        close(format!("rule set not held: {e}"))
                    }
                }
            }
        }
    }

    /// One round with NetworkPolicies alone (see the module comment).
    pub fn reconcile(
        &mut self,
        dp: &Datapath,
        cluster: &Cluster,
        policies: &[NetworkPolicy],
    ) -> Result<Round> {
        self.reconcile_all(dp, cluster, policies, &[])
    }

    /// One round (see the module comment) with NetworkPolicies and cluster policies.
    pub fn reconcile_all(
        &mut self,
        dp: &Datapath,
        cluster: &Cluster,
        policies: &[NetworkPolicy],
        cluster_policies: &[ClusterNetworkPolicy],
    ) -> Result<Round> {
        let (parsed, broken) = parse_all(policies);
        let (tiered, broken_tiered) = cluster_network_policy::parse_all(cluster_policies);
        let mut round = Round {
            broken: broken
                .iter()
                .map(|b| (format!("{}/{}", b.namespace, b.name), b.error.clone()))
                .chain(
                    broken_tiered
                        .iter()
                        .map(|b| (format!("clusternetworkpolicy/{}", b.name), b.error.clone())),
                )
                .collect(),
            ..Round::default()
        };
        let all = Policies {
            network: &parsed,
            broken: &broken,
            cluster: &tiered,
            broken_cluster: &broken_tiered,
        };
        dp.set_policy_namespaces(&closed_namespaces(cluster, policies, &all))?;

        let state = dp.policy_state()?;
        let active = state.slot & 1;
        let current: Vec<(u32, PolicyEndpoint)> = dp
            .policy_endpoints()?
            .into_iter()
            .filter(|(k, _)| k.slot == active)
            .map(|(k, v)| (k.ifindex, v))
            .collect();

        let mut wanted = Vec::with_capacity(current.len());
        for (ifindex, now) in &current {
            let Some(pod) = cluster.pod_by_key(now.pod) else {
                wanted.push((*ifindex, *now));
                continue;
            };
            let compiled = compile(cluster, &all, pod);
            let name = format!("{}/{}", pod.namespace, pod.name);
            let (ingress, ingress_closed) =
                self.ruleset_id(dp, compiled.ingress, Dir::Ingress, &name, &mut round)?;
            let (egress, egress_closed) =
                self.ruleset_id(dp, compiled.egress, Dir::Egress, &name, &mut round)?;
            round.pods.push(PodState {
                ifindex: *ifindex,
                pod: name,
                ingress: DirectionState {
                    ruleset: ingress,
                    policies: compiled.ingress_policies,
                    closed: ingress_closed,
                    classes: compiled.ingress_classes,
                },
                egress: DirectionState {
                    ruleset: egress,
                    policies: compiled.egress_policies,
                    closed: egress_closed,
                    classes: compiled.egress_classes,
                },
            });
            wanted.push((
                *ifindex,
                PolicyEndpoint {
                    ingress,
                    egress,
                    ..*now
                },
            ));
        }
        round.interfaces = wanted.len();
        round.selected = wanted
            .iter()
            .filter(|(_, e)| e.ingress != RULESET_OPEN || e.egress != RULESET_OPEN)
            .count();

        let differs = wanted.iter().zip(&current).any(|(w, c)| w != c);
        // A node whose agent never swapped enforces nothing yet: the first round swaps
        // even when every entry stays as ADD wrote it.
        if differs || state.generation == 0 {
            let now = dp.swap_policy(&wanted)?;
            round.swapped = true;
            round.generation = now.generation;
            std::thread::sleep(GRACE);
        } else {
            round.generation = state.generation;
        }

        let named: BTreeSet<u32> = wanted
            .iter()
            .flat_map(|(_, e)| [e.ingress, e.egress])
            .collect();
        let unused: Vec<(Ruleset, u32)> = self
            .ids
            .iter()
            .filter(|(_, id)| !named.contains(id))
            .map(|(rs, id)| (rs.clone(), *id))
            .collect();
        for (rs, id) in unused {
            dp.remove_ruleset(id, &rs)?;
            self.ids.remove(&rs);
        }
        round.rulesets = self.ids.len();
        Ok(round)
    }
}
