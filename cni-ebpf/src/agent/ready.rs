//! Readiness of the agent (`GET /ready`, the DaemonSet's readiness probe): every watcher
//! the agent runs has made its first round from a complete view of the API (the Node
//! watcher its tunnel entries and routes, NetworkPolicy its rule sets), and every
//! network's datapath below the bpffs root is loaded completely. A node with no datapath
//! yet (no pod ADDed since boot) is ready: the first ADD loads it.
//!
//! A rolling update of the DaemonSet waits for each new agent to be ready before it
//! moves on, so an agent that cannot reach the API server or finds a half-loaded datapath
//! stops the rollout on its node instead of spreading.

use std::{collections::BTreeMap, path::Path, sync::Mutex};

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
}

impl Job {
    fn describe(self) -> &'static str {
        match self {
            Job::Nodes => "the Node watcher has not made its first round yet",
            Job::Policy => "NetworkPolicy has not made its first round yet",
            Job::Services => "the Service watcher has not made its first round yet",
        }
    }
}

/// Which jobs the agent runs and whether each has made its first round.
#[derive(Debug, Default)]
pub struct Readiness {
    jobs: Mutex<BTreeMap<Job, bool>>,
}

impl Readiness {
    fn jobs(&self) -> std::sync::MutexGuard<'_, BTreeMap<Job, bool>> {
        match self.jobs.lock() {
            Ok(g) => g,
            // A thread that panicked aborted the process (panic = "abort").
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The agent runs `job`: not ready until [`Readiness::done`] for it.
    pub fn wait_for(&self, job: Job) {
        self.jobs().entry(job).or_insert(false);
    }

    /// `job` has made its first round.
    pub fn done(&self, job: Job) {
        self.jobs().insert(job, true);
    }

    /// `Ok` when ready, else why not (every reason, one per line).
    ///
    /// # Errors
    /// The reasons it is not ready.
    pub fn check(&self, root: &Path, named: &[String]) -> Result<(), String> {
        let mut why: Vec<String> = self
            .jobs()
            .iter()
            .filter(|(_, done)| !**done)
            .map(|(job, _)| job.describe().to_owned())
            .collect();
        why.extend(datapaths_incomplete(root, named));
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("\n"))
        }
    }
}

/// The networks below `root` (those in `named`, or all) whose datapath is not completely
/// loaded, and why. Nothing below `root` (no ADD yet) is no reason.
fn datapaths_incomplete(root: &Path, named: &[String]) -> Vec<String> {
    let names = if named.is_empty() {
        match network_dirs(root) {
            Ok(names) => names,
            Err(e) => return vec![format!("listing {}: {e}", root.display())],
        }
    } else {
        named.to_vec()
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
