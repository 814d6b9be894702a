//! Readiness of the agent (`GET /ready`, the DaemonSet's readiness probe): every watcher
//! the agent runs has made its first round from a complete view of the API (the Node
//! watcher its tunnel entries and routes, NetworkPolicy its rule sets), and every
//! network's datapath below the bpffs root is loaded completely. A node with no datapath
//! yet (no pod ADDed since boot) is ready: the first ADD loads it.
//!
//! Also not ready: a network that enforces NetworkPolicy (its conflist's `networkPolicy`)
//! whose policy is not in force yet — its pods are closed until it is — and the node's
//! cni-ebpf conflists disagreeing with the agent on where the pins and IPAM stores are or
//! on whether policy is enforced: an agent looking elsewhere would enforce nothing there,
//! and one without NetworkPolicy on a network that waits for it would leave its pods
//! closed. Each reason names the network or the conflist.
//!
//! A rolling update of the DaemonSet waits for each new agent to be ready before it
//! moves on, so an agent that cannot reach the API server or finds a half-loaded datapath
//! stops the rollout on its node instead of spreading.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Instant,
};

use serde_json::Value;

use crate::datapath::{load::network_dirs, Datapath};

/// A job of the agent that readiness waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Job {
    /// The Node watcher: tunnel entries and direct routes.
    Nodes,
    /// NetworkPolicy.
    Policy,
    /// Services (`--kube-proxy-replacement`).
    Services,
    /// Flows (`--flows`): the flow events read, named and served.
    Flows,
}

impl Job {
    fn describe(self) -> &'static str {
        match self {
            Job::Nodes => "the Node watcher has not made its first round yet",
            Job::Policy => "NetworkPolicy has not made its first round yet",
            Job::Services => "the Service watcher has not made its first round yet",
            Job::Flows => "the flow reader has not opened the datapaths' flow events yet",
        }
    }
}

impl Job {
    /// What the job watches (as [`crate::k8s::traffic`] names the resources).
    #[must_use]
    pub fn watches(self) -> &'static [&'static str] {
        match self {
            Job::Nodes => &["nodes"],
            Job::Policy => &[
                "namespaces",
                "pods",
                "nodes",
                "networking.k8s.io/networkpolicies",
                "policy.networking.k8s.io/clusternetworkpolicies",
            ],
            Job::Services => &["services", "discovery.k8s.io/endpointslices"],
            // Its watchers only name the flows' addresses, and run without an API server
            // to reach: their silence is not a stall (NetworkPolicy's watch of Pods and
            // Nodes is held to it).
            Job::Flows => &[],
        }
    }

    /// The job's thread, as its log lines name it.
    #[must_use]
    pub fn thread(self) -> &'static str {
        match self {
            Job::Nodes => "nodes",
            Job::Policy => "policy",
            Job::Services => "services",
            Job::Flows => "flows",
        }
    }

    /// The job's name in messages.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Job::Nodes => "the Node watcher",
            Job::Policy => "NetworkPolicy",
            Job::Services => "the Service watcher",
            Job::Flows => "the flow reader",
        }
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobState {
    /// It has made its first round.
    pub first_round: bool,
    /// When its loop last came round (a round, or a wake-up with nothing to do).
    pub last_beat: Option<Instant>,
}

/// Which jobs the agent runs, whether each has made its first round and when its loop
/// last came round, and the node's conflists to compare its settings with.
#[derive(Debug, Default)]
pub struct Readiness {
    jobs: Mutex<BTreeMap<Job, JobState>>,
    conflists: Option<Settings>,
}

/// The agent's settings its node's conflists must agree with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The directory of the node's CNI configurations (as mounted in the agent).
    pub conf_dir: PathBuf,
    /// The agent's `--bpffs-root`.
    pub bpffs_root: PathBuf,
    /// The agent's `--data-dir`.
    pub data_dir: PathBuf,
    /// Whether the agent enforces NetworkPolicy.
    pub policy: bool,
}

impl Readiness {
    fn jobs(&self) -> std::sync::MutexGuard<'_, BTreeMap<Job, JobState>> {
        match self.jobs.lock() {
            Ok(g) => g,
            // A thread that panicked aborted the process (panic = "abort").
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The agent runs `job`: not ready until [`Readiness::done`] for it.
    pub fn wait_for(&self, job: Job) {
        self.jobs().entry(job).or_default();
    }

    /// `job` has made a round (its first, or another); its loop came round.
    pub fn done(&self, job: Job) {
        self.jobs().insert(
            job,
            JobState {
                first_round: true,
                last_beat: Some(Instant::now()),
            },
        );
    }

    /// `job`'s loop came round without a round to make (liveness: it is not stuck).
    pub fn beat(&self, job: Job) {
        self.jobs().entry(job).or_default().last_beat = Some(Instant::now());
    }

    /// Every job's state.
    #[must_use]
    pub fn jobs_now(&self) -> BTreeMap<Job, JobState> {
        self.jobs().clone()
    }

    /// Also compares the node's cni-ebpf conflists with `settings` (see the module).
    #[must_use]
    pub fn with_conflists(mut self, settings: Settings) -> Self {
        self.conflists = Some(settings);
        self
    }

    /// Where the node's conflists disagree with the agent's settings (none when it was
    /// given none to compare).
    #[must_use]
    pub fn conflist_disagreements(&self) -> Vec<String> {
        self.conflists
            .as_ref()
            .map(conflist_disagreements)
            .unwrap_or_default()
    }

    /// `Ok` when ready, else why not (every reason, one per line).
    ///
    /// # Errors
    /// The reasons it is not ready.
    pub fn check(&self, root: &Path, named: &[String]) -> Result<(), String> {
        let mut why: Vec<String> = self
            .jobs()
            .iter()
            .filter(|(_, state)| !state.first_round)
            .map(|(job, _)| job.describe().to_owned())
            .collect();
        why.extend(datapaths_incomplete(root, named));
        let policy = self.jobs().contains_key(&Job::Policy);
        why.extend(policy_waiting(root, named, policy));
        if let Some(s) = &self.conflists {
            why.extend(conflist_disagreements(s));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}

/// The networks below `root`: those in `named`, or all of them.
fn networks(root: &Path, named: &[String]) -> Result<Vec<String>, String> {
    if named.is_empty() {
        network_dirs(root).map_err(|e| format!("listing {}: {e}", root.display()))
    } else {
        Ok(named.to_vec())
    }
}

/// Whether the loaded network at `dir` enforces NetworkPolicy with none in force yet
/// (its pods closed until the agent's first swap).
#[must_use]
pub fn waits_for_policy(dir: &Path) -> bool {
    let Ok(Some(dp)) = Datapath::open_at(dir) else {
        return false;
    };
    dp.enforces_policy().unwrap_or(false) && dp.policy_state().is_ok_and(|s| s.generation == 0)
}

/// The networks (below `root`, those in `named` or all) that enforce NetworkPolicy and
/// have none in force yet: with `policy` (this agent enforces it) until its next round,
/// without it for good.
fn policy_waiting(root: &Path, named: &[String], policy: bool) -> Vec<String> {
    let Ok(names) = networks(root, named) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter(|name| waits_for_policy(&root.join(name)))
        .map(|name| {
            if policy {
                format!(
                    "network {name}: its NetworkPolicy is not in force yet; its pods are closed \
                     until it is"
                )
            } else {
                format!(
                    "network {name} enforces NetworkPolicy (its conflist's networkPolicy), but \
                     this agent runs with --policy=false: its pods stay closed"
                )
            }
        })
        .collect()
}

/// Where the node's cni-ebpf conflists (in `s.conf_dir`) disagree with the agent's
/// settings, one line each naming the file, the field and both values.
#[must_use]
pub fn conflist_disagreements(s: &Settings) -> Vec<String> {
    let mut out = Vec::new();
    for (file, plugin) in cni_ebpf_plugins(&s.conf_dir) {
        let path_of = |key: &str, default: &str| {
            PathBuf::from(plugin.get(key).and_then(Value::as_str).unwrap_or(default))
        };
        let bpffs = path_of("bpffsRoot", crate::cni::config::DEFAULT_BPFFS_ROOT);
        if bpffs != s.bpffs_root {
            out.push(format!(
                "conflist {file}: bpffsRoot {}, but this agent reads {} \
                 (CNI_EBPF_BPFFS_ROOT): it enforces nothing on that network",
                bpffs.display(),
                s.bpffs_root.display()
            ));
        }
        let data = path_of("dataDir", crate::cni::config::DEFAULT_DATA_DIR);
        if data != s.data_dir {
            out.push(format!(
                "conflist {file}: dataDir {}, but this agent reads {} (CNI_EBPF_DATA_DIR)",
                data.display(),
                s.data_dir.display()
            ));
        }
        let wants_policy = plugin
            .get("networkPolicy")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        if wants_policy && !s.policy {
            out.push(format!(
                "conflist {file}: networkPolicy is on, but this agent runs with \
                 --policy=false (CNI_EBPF_NETWORK_POLICY): its pods stay closed"
            ));
        }
        let wants_wireguard = plugin.get("encryption").and_then(Value::as_str) == Some("wireguard");
        if wants_wireguard {
            if let Err(e) = crate::kernel::wireguard::Wg::connect() {
                out.push(format!(
                    "conflist {file}: encryption is \"wireguard\", but {e}: every ADD fails \
                     and no pod of this node has a network"
                ));
            }
        }
    }
    out
}

/// The cni-ebpf plugin objects of the node's CNI configurations in `conf_dir`, each
/// with its file's name, in the files' order.
#[must_use]
pub fn cni_ebpf_plugins(conf_dir: &Path) -> Vec<(String, Value)> {
    let Ok(dir) = std::fs::read_dir(conf_dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = dir
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "conflist" || x == "conf" || x == "json")
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|f| {
            let plugin = std::fs::read(&f)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|doc| cni_ebpf_plugin(&doc))?;
            let file = f
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            Some((file, plugin))
        })
        .collect()
}

/// The cni-ebpf plugin object of a conflist (`plugins`) or of a single configuration.
fn cni_ebpf_plugin(doc: &Value) -> Option<Value> {
    let is_ours = |p: &Value| p.get("type").and_then(Value::as_str) == Some("cni-ebpf");
    match doc.get("plugins").and_then(Value::as_array) {
        Some(plugins) => plugins.iter().find(|p| is_ours(p)).cloned(),
        None => is_ours(doc).then(|| doc.clone()),
    }
}

/// The networks below `root` (those in `named`, or all) whose datapath is not completely
/// loaded, and why. Nothing below `root` (no ADD yet) is no reason.
fn datapaths_incomplete(root: &Path, named: &[String]) -> Vec<String> {
    let names = match networks(root, named) {
        Ok(names) => names,
        Err(e) => return vec![e],
    };
    names
        .into_iter()
        .filter_map(|name| match Datapath::open_at(root.join(&name)) {
            Ok(Some(_)) => None,
            Ok(None) if !root.join(&name).exists() => None,
            Ok(None) => Some(format!(
                "network {name}: its datapath is not completely loaded"
            )),
            Err(e) => Some(format!("network {name}: {e}")),
        })
        .collect()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_expected_job_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let r = Readiness::default();
        assert_eq!(r.check(dir.path(), &[]), Ok(()));
        r.wait_for(Job::Nodes);
        r.wait_for(Job::Policy);
        let why = r.check(dir.path(), &[]).unwrap_err();
        assert!(
            why.contains("Node watcher") && why.contains("NetworkPolicy"),
            "{why}"
        );
        r.done(Job::Policy);
        let why = r.check(dir.path(), &[]).unwrap_err();
        assert!(
            why.contains("Node watcher") && !why.contains("NetworkPolicy"),
            "{why}"
        );
        r.done(Job::Nodes);
        assert_eq!(r.check(dir.path(), &[]), Ok(()));
    }

    #[test]
    fn conflists_that_disagree_with_the_agent_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let conflist = |bpffs: &str, policy: bool| {
            serde_json::json!({
                "cniVersion": "1.0.0", "name": "k8s-pod-network",
                "plugins": [{ "type": "cni-ebpf", "bpffsRoot": bpffs, "networkPolicy": policy }],
            })
            .to_string()
        };
        std::fs::write(
            dir.path().join("10-cni-ebpf.conflist"),
            conflist("/sys/fs/bpf/other", true),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("20-other.conflist"),
            r#"{"plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let settings = |policy| Settings {
            conf_dir: dir.path().to_owned(),
            bpffs_root: "/sys/fs/bpf/cni-ebpf".into(),
            data_dir: crate::cni::config::DEFAULT_DATA_DIR.into(),
            policy,
        };
        let why = conflist_disagreements(&settings(true));
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(
            why[0].contains("10-cni-ebpf.conflist") && why[0].contains("/sys/fs/bpf/other"),
            "{why:?}"
        );
        let why = conflist_disagreements(&settings(false));
        assert!(why.iter().any(|w| w.contains("--policy=false")), "{why:?}");
        std::fs::write(
            dir.path().join("10-cni-ebpf.conflist"),
            conflist("/sys/fs/bpf/cni-ebpf", false),
        )
        .unwrap();
        assert!(conflist_disagreements(&settings(false)).is_empty());
        let r = Readiness::default().with_conflists(settings(true));
        std::fs::write(
            dir.path().join("10-cni-ebpf.conflist"),
            conflist("/elsewhere", true),
        )
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        assert!(r
            .check(root.path(), &[])
            .unwrap_err()
            .contains("/elsewhere"));
    }

    #[test]
    fn a_half_loaded_network_is_not_ready_and_a_missing_root_is() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("half")).unwrap();
        let r = Readiness::default();
        let why = r.check(dir.path(), &[]).unwrap_err();
        assert!(why.contains("network half"), "{why}");
        assert_eq!(r.check(&dir.path().join("absent"), &[]), Ok(()));
        assert_eq!(r.check(dir.path(), &["other".to_owned()]), Ok(()));
    }
}
