//! What the agent tells about the policy in force, besides enforcing it:
//!
//! - a **state file per network** (`<state dir>/<network>.json`, replaced whole after
//!   every round that changed it): each pod interface, its pod, and per direction the
//!   rule set it is held to, the policies that select it and why it is closed, if it is.
//!   `cni-ebpf inspect --pod` reads it to name the policies; the datapath's maps keep no
//!   names;
//! - **verdict totals per policy** for the metrics: the datapath counts verdicts per pod
//!   interface (`POLICY_COUNTS`); every second the agent adds what each interface counted
//!   since the last reading to every policy that selects its pod in that direction (a
//!   pod's policies are a union: a flow one of them admits is admitted by the union, a
//!   packet none admits is refused by each). Kept in memory, so the totals only grow
//!   while the agent runs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use cni_ebpf_common::{PolicyClassCounts, PolicyClassKey, PolicyCounts};

use crate::{datapath::policy::describe_ruleset, error::Result};

/// Where the agent writes its state files unless told otherwise.
pub const DEFAULT_STATE_DIR: &str = "/run/cni-ebpf/policy";

/// One direction of a pod interface's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirectionState {
    /// The rule set in `POLICY_ENDPOINTS` (open, closed, or an id of the rule tables).
    #[serde(
        serialize_with = "ruleset_text",
        deserialize_with = "ruleset_from_text"
    )]
    pub ruleset: u32,
    /// The policies that select the pod for this direction (`namespace/name`).
    pub policies: Vec<String>,
    /// Why the pod is closed in this direction, when a policy cannot be held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<String>,
    /// What each class of the rule set stands for (the tier, the action and the rules),
    /// by class number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<crate::policy::classes::ClassOrigin>,
}

fn ruleset_text<S: serde::Serializer>(id: &u32, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&describe_ruleset(*id))
}

fn ruleset_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u32, D::Error> {
    let text: String = serde::Deserialize::deserialize(d)?;
    Ok(match text.as_str() {
        "open" => cni_ebpf_common::RULESET_OPEN,
        "closed" => cni_ebpf_common::RULESET_CLOSED,
        t => t
            .strip_prefix("rules #")
            .and_then(|n| n.parse().ok())
            .unwrap_or(cni_ebpf_common::RULESET_CLOSED),
    })
}

/// One pod interface whose pod the agent knows.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodState {
    /// The host veth's ifindex (the datapath's key).
    pub ifindex: u32,
    /// `namespace/name`.
    pub pod: String,
    pub ingress: DirectionState,
    pub egress: DirectionState,
}

/// A network's state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkState {
    /// The policy generation in force after the round that wrote it.
    pub generation: u32,
    /// Every pod interface whose pod is known, by ifindex.
    pub pods: Vec<PodState>,
    /// Policies that cannot be represented (`namespace/name`, why): the pods they select
    /// are closed.
    pub broken: Vec<(String, String)>,
}

/// The state file of `network` below `dir`.
#[must_use]
pub fn state_file(dir: &Path, network: &str) -> PathBuf {
    dir.join(format!("{network}.json"))
}

/// Replaces `network`'s state file below `dir` (written aside, then renamed over it, so
/// a reader sees the old or the new file whole).
pub fn write_state(dir: &Path, network: &str, state: &NetworkState) -> Result<()> {
    let io = |what: &str, e| crate::error::Error::io(format!("{what} {}", dir.display()), e);
    std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
    let path = state_file(dir, network);
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(state).unwrap_or_default();
    std::fs::write(&tmp, text).map_err(|e| io("writing in", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("renaming in", e))
}

/// `network`'s state file below `dir`, if the agent wrote one.
#[must_use]
pub fn read_state(dir: &Path, network: &str) -> Option<NetworkState> {
    let text = std::fs::read(state_file(dir, network)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The key of one total: network, policy namespace, policy name, direction, verdict.
pub type TotalKey = (String, String, String, &'static str, &'static str);

/// The key of one cluster policy total: the rule that decided, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterTotalKey {
    pub network: String,
    /// The cluster policy's name.
    pub policy: String,
    /// The rule's `name` (empty when it has none).
    pub rule: String,
    /// `Admin` or `Baseline`.
    pub tier: String,
    /// `Accept` or `Deny`.
    pub action: String,
    pub direction: &'static str,
    /// `admitted` (flows) or `denied` (packets).
    pub verdict: &'static str,
}

/// Verdict totals per policy, and what each network's last round left closed.
#[derive(Debug, Default)]
pub struct Totals {
    /// Per policy, direction and verdict (`admitted`: flows, `denied`: packets).
    pub verdicts: BTreeMap<TotalKey, u64>,
    /// Per cluster policy rule that decided, direction and verdict.
    pub cluster_verdicts: BTreeMap<ClusterTotalKey, u64>,
    /// Per network: pod interfaces closed because a policy cannot be held.
    pub closed_pods: BTreeMap<String, u64>,
    /// Per network: the policy generation in force.
    pub generation: BTreeMap<String, u32>,
    /// The counts last read per (network, ifindex).
    last: BTreeMap<(String, u32), PolicyCounts>,
    /// The class counts last read per network.
    last_classes: BTreeMap<(String, PolicyClassKey), PolicyClassCounts>,
}

/// [`Totals`] shared between the policy thread and the metrics server.
pub type SharedTotals = Arc<Mutex<Totals>>;

/// What a counter counted since `then`; all of `now` when it is lower (its entry was
/// created again).
fn delta(now: u64, then: u64) -> u64 {
    if now >= then {
        now - then
    } else {
        now
    }
}

impl Totals {
    /// Adds what `network`'s interfaces counted since the last call to the policies
    /// `state` says select them. A count lower than the last one is an interface whose
    /// entry was created again (a new pod on a reused index): all of it is new.
    pub fn account(
        &mut self,
        network: &str,
        state: &NetworkState,
        counts: &BTreeMap<u32, PolicyCounts>,
    ) {
        self.generation.insert(network.to_owned(), state.generation);
        let closed = state
            .pods
            .iter()
            .filter(|p| p.ingress.closed.is_some() || p.egress.closed.is_some())
            .count();
        self.closed_pods.insert(
            network.to_owned(),
            u64::try_from(closed).unwrap_or(u64::MAX),
        );
        for pod in &state.pods {
            let Some(now) = counts.get(&pod.ifindex) else {
                continue;
            };
            let then = self
                .last
                .insert((network.to_owned(), pod.ifindex), *now)
                .unwrap_or_default();
            for (dir, side, admitted, denied) in [
                (
                    "ingress",
                    &pod.ingress,
                    delta(now.ingress_admitted, then.ingress_admitted),
                    delta(now.ingress_denied, then.ingress_denied),
                ),
                (
                    "egress",
                    &pod.egress,
                    delta(now.egress_admitted, then.egress_admitted),
                    delta(now.egress_denied, then.egress_denied),
                ),
            ] {
                // NetworkPolicies only: a cluster policy's rules are ranked, not a
                // union, so crediting it with every verdict at its pods would be wrong.
                for policy in side
                    .policies
                    .iter()
                    .filter(|p| !p.starts_with("clusternetworkpolicy/"))
                {
                    let (ns, name) = policy.split_once('/').unwrap_or(("", policy));
                    for (verdict, n) in [("admitted", admitted), ("denied", denied)] {
                        let key = (
                            network.to_owned(),
                            ns.to_owned(),
                            name.to_owned(),
                            dir,
                            verdict,
                        );
                        // Every policy of the pod gets a sample, also at 0.
                        *self.verdicts.entry(key).or_default() += n;
                    }
                }
            }
        }
        // Interfaces gone from the network: their last counts are kept in the totals.
        self.last
            .retain(|(n, i), _| n != network || state.pods.iter().any(|p| p.ifindex == *i));
    }

    /// Adds what each cluster policy rule's class of `network`'s rule sets decided since
    /// the last call (`counts`, from the datapath) to the rules `state` says the class
    /// stands for. The datapath counts the class of the first rule that matched in the
    /// tier that decided; consecutive rules of one action with the same ports share a
    /// class, and are credited together. A class count lower than the last one belongs to
    /// a rule set written again under a reused id: all of it is new.
    pub fn account_classes(
        &mut self,
        network: &str,
        state: &NetworkState,
        counts: &BTreeMap<PolicyClassKey, PolicyClassCounts>,
    ) {
        for (key, now) in counts {
            let then = self
                .last_classes
                .insert((network.to_owned(), *key), *now)
                .unwrap_or_default();
            let (direction, side): (&'static str, fn(&PodState) -> &DirectionState) =
                if key.egress == 1 {
                    ("egress", |p| &p.egress)
                } else {
                    ("ingress", |p| &p.ingress)
                };
            let Some(origin) = state
                .pods
                .iter()
                .map(side)
                .find(|d| d.ruleset == key.ruleset)
                .and_then(|d| d.classes.get(usize::from(key.class)))
            else {
                continue;
            };
            if origin.tier == "NetworkPolicy" {
                continue;
            }
            for label in &origin.rules {
                let (policy, rule) = label.split_once('/').unwrap_or((label, ""));
                for (verdict, n) in [
                    ("admitted", delta(now.admitted, then.admitted)),
                    ("denied", delta(now.denied, then.denied)),
                ] {
                    let k = ClusterTotalKey {
                        network: network.to_owned(),
                        policy: policy.to_owned(),
                        rule: rule.to_owned(),
                        tier: origin.tier.clone(),
                        action: origin.action.clone(),
                        direction,
                        verdict,
                    };
                    *self.cluster_verdicts.entry(k).or_default() += n;
                }
            }
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn pod(ifindex: u32, ingress: &[&str], egress: &[&str]) -> PodState {
        let side = |p: &[&str]| DirectionState {
            ruleset: 7,
            policies: p.iter().map(|s| (*s).to_owned()).collect(),
            closed: None,
            classes: Vec::new(),
        };
        PodState {
            ifindex,
            pod: format!("x/p{ifindex}"),
            ingress: side(ingress),
            egress: side(egress),
        }
    }

    #[test]
    fn totals_add_each_interfaces_new_counts_to_every_policy_of_its_pod() {
        let state = NetworkState {
            generation: 3,
            pods: vec![pod(10, &["x/a", "x/b"], &[]), pod(11, &["x/a"], &["x/e"])],
            broken: Vec::new(),
        };
        let mut t = Totals::default();
        let counts = |ia, id, ea, ed| PolicyCounts {
            ingress_admitted: ia,
            ingress_denied: id,
            egress_admitted: ea,
            egress_denied: ed,
        };
        t.account(
            "n",
            &state,
            &[(10, counts(2, 5, 0, 0)), (11, counts(1, 0, 4, 1))].into(),
        );
        t.account(
            "n",
            &state,
            &[(10, counts(3, 5, 0, 0)), (11, counts(1, 0, 4, 1))].into(),
        );
        let get = |t: &Totals, ns: &str, name: &str, dir, verdict| {
            t.verdicts[&("n".to_owned(), ns.to_owned(), name.to_owned(), dir, verdict)]
        };
        assert_eq!(get(&t, "x", "a", "ingress", "admitted"), 4);
        assert_eq!(get(&t, "x", "a", "ingress", "denied"), 5);
        assert_eq!(get(&t, "x", "b", "ingress", "admitted"), 3);
        assert_eq!(get(&t, "x", "e", "egress", "admitted"), 4);
        assert_eq!(get(&t, "x", "e", "egress", "denied"), 1);
        // An interface counted from zero again (its entry created anew).
        t.account("n", &state, &[(10, counts(1, 0, 0, 0))].into());
        assert_eq!(get(&t, "x", "b", "ingress", "admitted"), 4);
        assert_eq!(t.generation["n"], 3);
    }

    #[test]
    fn a_state_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = NetworkState {
            generation: 9,
            pods: vec![pod(4, &["x/a"], &[])],
            broken: vec![("x/bad".into(), "an ipBlock of /33".into())],
        };
        state.pods[0].egress.ruleset = cni_ebpf_common::RULESET_CLOSED;
        state.pods[0].egress.closed = Some("x/bad cannot be held".into());
        write_state(dir.path(), "net", &state).unwrap();
        assert_eq!(read_state(dir.path(), "net"), Some(state));
        assert_eq!(read_state(dir.path(), "other"), None);
    }

    #[test]
    fn cluster_totals_credit_the_rules_of_the_class_that_decided() {
        use crate::policy::classes::ClassOrigin;
        let origin = |tier: &str, action: &str, rules: &[&str]| ClassOrigin {
            tier: tier.to_owned(),
            action: action.to_owned(),
            rules: rules.iter().map(|r| (*r).to_owned()).collect(),
        };
        let mut p = pod(10, &[], &[]);
        p.egress.ruleset = 5;
        p.egress.classes = vec![
            origin(
                "Admin",
                "Deny",
                &["no-metadata/deny-169-254", "no-metadata/deny-other"],
            ),
            origin("NetworkPolicy", "Accept", &["x/allow"]),
            origin("Baseline", "Accept", &["tenants"]),
        ];
        let state = NetworkState {
            generation: 1,
            pods: vec![p],
            broken: Vec::new(),
        };
        let key = |class: u8, egress: u8| PolicyClassKey {
            ruleset: 5,
            class,
            egress,
            _pad: [0; 2],
        };
        let counts = |admitted, denied| PolicyClassCounts { admitted, denied };
        let mut t = Totals::default();
        t.account_classes(
            "n",
            &state,
            &[
                (key(0, 1), counts(0, 3)),
                (key(1, 1), counts(7, 0)),
                (key(2, 1), counts(2, 0)),
                (key(0, 0), counts(0, 9)),
            ]
            .into(),
        );
        t.account_classes("n", &state, &[(key(0, 1), counts(0, 5))].into());
        let get = |policy: &str, rule: &str, verdict| {
            t.cluster_verdicts
                .iter()
                .find(|(k, _)| k.policy == policy && k.rule == rule && k.verdict == verdict)
                .map(|(k, n)| (k.tier.clone(), k.action.clone(), k.direction, *n))
        };
        // Both rules of the deciding class, with every denial once: 3, then 2 more.
        let denied = Some(("Admin".to_owned(), "Deny".to_owned(), "egress", 5));
        assert_eq!(get("no-metadata", "deny-169-254", "denied"), denied);
        assert_eq!(get("no-metadata", "deny-other", "denied"), denied);
        assert_eq!(
            get("tenants", "", "admitted"),
            Some(("Baseline".to_owned(), "Accept".to_owned(), "egress", 2))
        );
        // NetworkPolicy's classes are not cluster policies; a class of a rule set no pod
        // holds in that direction (ingress here) is not credited.
        assert!(t
            .cluster_verdicts
            .keys()
            .all(|k| k.policy != "x" && k.direction == "egress"));
    }
}
