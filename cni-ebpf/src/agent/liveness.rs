//! Liveness of the agent (`GET /healthz`, the DaemonSet's startup and liveness probes):
//! whether its jobs are still at work, so that a wedged agent is restarted and a busy or
//! cut-off one is not.
//!
//! - Until every job has made its first round (listed the cluster and put it in force),
//!   `/healthz` answers 503 "starting": the startup probe gives a large cluster's first
//!   sync its time, and the liveness probe only starts after it.
//! - Then it fails when a job's loop has not come round for [`Bounds::stall`] (each loop
//!   wakes at least every few seconds, round or not), or when a resource a job watches
//!   has seen no request, answer or byte for [`Bounds::silence`]: a watch is resumed at
//!   least every `--watch-timeout` seconds, and a failed one is retried with a backoff of
//!   at most 30 s, so only a watcher that stopped being driven stays silent that long.
//!
//! An unreachable API server is not a failure of liveness: the watchers keep retrying
//! (each attempt counts), the pinned state stays in force, and a restart would change
//! nothing. Readiness (`/ready`) says that the agent is not in step.

use std::time::{Duration, Instant};

use super::ready::Readiness;
use crate::k8s::traffic::Traffic;

/// Default [`Bounds::stall`], in seconds (`--stall-timeout`).
pub const DEFAULT_STALL_SECS: u64 = 120;

/// How long a job may go without a sign of life.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// A job's loop not come round for this long is stuck.
    pub stall: Duration,
    /// A watched resource without a request, an answer or a byte for this long has a
    /// watcher that is not driven: the watch timeout and `stall`.
    pub silence: Duration,
}

impl Bounds {
    /// The bounds for a loop stall of `stall` and watches kept open `watch_timeout`.
    #[must_use]
    pub fn new(stall: Duration, watch_timeout: Duration) -> Self {
        Self {
            stall,
            silence: watch_timeout + stall,
        }
    }
}

/// `Ok` while every job of `readiness` is alive at `now` by `bounds` and what `traffic`
/// holds; else why not, one reason per line ("starting: …" before the first rounds).
///
/// # Errors
/// Why the agent is starting or stuck.
pub fn check(
    readiness: &Readiness,
    traffic: &Traffic,
    bounds: Bounds,
    now: Instant,
) -> Result<(), String> {
    let jobs = readiness.jobs_now();
    let starting: Vec<String> = jobs
        .iter()
        .filter(|(_, s)| !s.first_round)
        .map(|(job, _)| format!("starting: {} has not made its first round yet", job.name()))
        .collect();
    if !starting.is_empty() {
        return Err(starting.join("\n"));
    }
    let exchanges = traffic.snapshot();
    let mut why = Vec::new();
    for (job, state) in &jobs {
        let since = state
            .last_beat
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t));
        if since > bounds.stall {
            why.push(format!(
                "{}: its loop has not come round for {} s (bound {} s)",
                job.name(),
                since.as_secs(),
                bounds.stall.as_secs()
            ));
        }
        for resource in job.watches() {
            let Some(e) = exchanges.get(*resource) else {
                continue;
            };
            let quiet = now.saturating_duration_since(e.last);
            if quiet > bounds.silence {
                why.push(format!(
                    "{}: no request, answer or byte for {resource} in {} s (bound {} s): \
                     its watcher is not driven",
                    job.name(),
                    quiet.as_secs(),
                    bounds.silence.as_secs()
                ));
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("\n"))
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::agent::ready::Job;

    #[test]
    fn starting_until_the_first_rounds_then_stuck_only_past_the_bounds() {
        let r = Readiness::default();
        let t = Traffic::default();
        let bounds = Bounds::new(Duration::from_secs(60), Duration::from_secs(290));
        let now = Instant::now();
        assert_eq!(check(&r, &t, bounds, now), Ok(()), "no jobs: alive");
        r.wait_for(Job::Policy);
        let why = check(&r, &t, bounds, now).unwrap_err();
        assert!(why.starts_with("starting: NetworkPolicy"), "{why}");
        r.done(Job::Policy);
        assert_eq!(check(&r, &t, bounds, Instant::now()), Ok(()));
        let later = Instant::now() + Duration::from_secs(61);
        let why = check(&r, &t, bounds, later).unwrap_err();
        assert!(why.contains("not come round for 6"), "{why}");
        r.beat(Job::Policy);
        assert_eq!(
            check(&r, &t, bounds, Instant::now() + Duration::from_secs(59)),
            Ok(())
        );
        // A watched resource silent past the watch timeout and the stall bound.
        t.note(&"pods".into(), |e| e.requests += 1);
        t.note(&"events.k8s.io/events".into(), |e| e.requests += 1);
        r.beat(Job::Policy);
        let silent = Instant::now() + Duration::from_secs(351);
        let why = check(
            &r,
            &t,
            Bounds::new(Duration::from_secs(400), Duration::from_secs(290)),
            silent,
        );
        assert_eq!(why, Ok(()), "within 290 + 400 s");
        let why = check(&r, &t, bounds, silent).unwrap_err();
        assert!(why.contains("for pods in 35"), "{why}");
        assert!(
            !why.contains("events"),
            "an unwatched resource is no reason: {why}"
        );
    }
}
