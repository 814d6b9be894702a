//! Services without kube-proxy (`agent --kube-proxy-replacement`): the agent watches
//! Services and EndpointSlices (and its own Node, for its zone) and keeps every network's
//! Service maps (`crate::datapath::services`), which the socket programs translate
//! connections from the node and its pods from, and the uplink programs flows from
//! outside. Which frontends and backends a node gets is [`super::service_table`]'s; this
//! module watches, writes the maps, reports what is not handled, and answers the
//! health-check node ports of `externalTrafficPolicy: Local` Services
//! ([`super::health`]).
//!
//! With the mode off the agent empties the Service maps once at start, so a node switched
//! back to kube-proxy has none of them left.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use futures::{stream::select_all, Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::{
    runtime::{
        events::{Event, EventType, Recorder},
        reflector::{self, Store},
        watcher,
    },
    Api, Client, Resource as _,
};

use super::{
    health_check_ports::HealthChecks,
    ready::{Job, Readiness},
    service_objects::{EndpointSlice, Service},
    service_table::{table, Locality, Unhandled},
    watch::{networks, watch, without_apply_fields, Volume},
};
use crate::{
    datapath::{
        services::{ServiceTable, ServiceWriter},
        Datapath,
    },
    error::{Error, Result},
    k8s::ApiArgs,
};

/// How long a round waits after a change for more changes of the same burst.
const SETTLE: Duration = Duration::from_millis(20);
/// How often new networks (a first pod ADDed) are looked for.
const TICK: Duration = Duration::from_secs(1);
/// The Node label of its zone.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The stores the rounds read.
struct View {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    node: Option<Store<Node>>,
}

impl View {
    async fn ready(&self) -> bool {
        self.services.wait_until_ready().await.is_ok()
            && self.slices.wait_until_ready().await.is_ok()
            && match &self.node {
                Some(n) => n.wait_until_ready().await.is_ok(),
                None => true,
            }
    }

    fn locality(&self, node: &str) -> Locality {
        let zone = self.node.as_ref().and_then(|s| {
            s.state()
                .first()
                .and_then(|n| n.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned())
        });
        Locality {
            node: node.to_owned(),
            zone,
        }
    }
}

fn start(
    client: &Client,
    config: &watcher::Config,
    node: &str,
) -> (View, impl Stream<Item = bool> + Send) {
    let (services, svc_w) = reflector::store();
    let (slices, slice_w) = reflector::store();
    let mut streams = vec![
        watch(
            Api::<Service>::all(client.clone()),
            config.clone(),
            Volume::Large,
            Service::slim,
            svc_w,
        )
        .boxed(),
        watch(
            Api::<EndpointSlice>::all(client.clone()),
            config.clone(),
            Volume::Large,
            EndpointSlice::slim,
            slice_w,
        )
        .boxed(),
    ];
    let node_store = (!node.is_empty()).then(|| {
        let (store, w) = reflector::store();
        streams.push(
            watch(
                Api::<Node>::all(client.clone()),
                config.clone().fields(&format!("metadata.name={node}")),
                Volume::Small,
                without_apply_fields,
                w,
            )
            .boxed(),
        );
        store
    });
    (
        View {
            services,
            slices,
            node: node_store,
        },
        select_all(streams),
    )
}

/// Every network's writer, opened as networks appear.
#[derive(Default)]
struct Writers {
    open: BTreeMap<PathBuf, (Datapath, ServiceWriter)>,
}

impl Writers {
    /// Whether a network below `root` has no writer yet.
    fn missing(&self, root: &Path, named: &[String]) -> bool {
        networks(root, named)
            .iter()
            .any(|d| !self.open.contains_key(d))
    }

    /// Makes every network's maps hold `want`.
    fn apply(&mut self, root: &Path, named: &[String], want: &ServiceTable) {
        for dir in networks(root, named) {
            if !self.open.contains_key(&dir) {
                match Datapath::open_at(&dir) {
                    Ok(Some(dp)) => match ServiceWriter::resume(&dp) {
                        Ok(w) => {
                            self.open.insert(dir.clone(), (dp, w));
                        }
                        Err(e) => {
                            tracing::warn!("{}: reading the Service maps: {e}", dir.display());
                            continue;
                        }
                    },
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!("{}: {e}", dir.display());
                        continue;
                    }
                }
            }
            let Some((dp, w)) = self.open.get_mut(&dir) else {
                continue;
            };
            match w.apply(dp, want) {
                Ok(done) if done.frontends > 0 => tracing::info!(
                    "{}: {} Service frontends in force ({} changed, {} backend slots written \
                     or removed)",
                    dir.display(),
                    w.len(),
                    done.frontends,
                    done.slots
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("{}: writing the Service maps: {e}", dir.display());
                    // Resumed afresh next time (the pins may have been replaced).
                    self.open.remove(&dir);
                }
            }
        }
    }
}

/// Empties the Service maps of every network below `root` (all, or `named`): the mode is
/// off, and kube-proxy (or nothing) translates Services.
pub fn clear(root: &Path, named: &[String]) {
    for dir in networks(root, named) {
        let Ok(Some(dp)) = Datapath::open_at(&dir) else {
            continue;
        };
        match ServiceWriter::resume(&dp) {
            Ok(mut w) if !w.is_empty() => match w.apply(&dp, &ServiceTable::new()) {
                Ok(done) => tracing::info!(
                    "{}: Service translation off; {} frontends removed",
                    dir.display(),
                    done.frontends
                ),
                Err(e) => tracing::warn!("{}: emptying the Service maps: {e}", dir.display()),
            },
            Ok(_) => {}
            Err(e) => tracing::warn!("{}: reading the Service maps: {e}", dir.display()),
        }
    }
}

/// A Warning Event on each Service in `unhandled` not reported yet with the same text.
async fn report(
    recorder: &Recorder,
    view: &View,
    reported: &mut BTreeSet<Unhandled>,
    unhandled: Vec<Unhandled>,
) {
    for (svc, what) in unhandled {
        if reported.contains(&(svc.clone(), what.clone())) {
            continue;
        }
        let Some((ns, name)) = svc.split_once('/') else {
            continue;
        };
        let Some(object) = view.services.state().into_iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        }) else {
            continue;
        };
        tracing::warn!("Service {svc}: not translated by cni-ebpf: {what}");
        let event = Event {
            type_: EventType::Warning,
            reason: "ServiceFieldNotHandled".into(),
            note: Some(format!(
                "cni-ebpf's kube-proxy replacement does not translate {what}"
            )),
            action: "TranslateService".into(),
            secondary: None,
        };
        match recorder.publish(&event, &object.object_ref(&())).await {
            Ok(()) => {
                reported.insert((svc, what));
            }
            Err(e) => tracing::warn!("an Event on Service {svc}: {e}"),
        }
    }
}

/// Keeps the Service maps of the networks below `root` (all, or `named`) in step with the
/// API, forever, on the calling thread; tells `readiness` when its first round is made.
pub fn run(
    root: &Path,
    named: &[String],
    api: &ApiArgs,
    node: &str,
    readiness: &Readiness,
) -> Result<()> {
    let rt = crate::kernel::link::runtime()?;
    rt.block_on(async {
        let client = super::watch::client(api, "Services").await;
        let recorder = super::watch::recorder(&client);
        let (view, events) = start(&client, &api.watcher_config(), node);
        let changed = super::watch::wake_on(events);
        if !view.ready().await {
            return Err(Error::datapath("Services", "the watchers stopped"));
        }
        tracing::info!("Services: Services and EndpointSlices listed; watching");
        let mut writers = Writers::default();
        let mut health = HealthChecks::default();
        let mut reported = BTreeSet::new();
        let mut round = |writers: &mut Writers| {
            let r = table(
                &view.services.state(),
                &view.slices.state(),
                &view.locality(node),
            );
            writers.apply(root, named, &r.frontends);
            health.update(&r.health);
            r.unhandled
        };
        let unhandled = round(&mut writers);
        readiness.done(Job::Services);
        report(&recorder, &view, &mut reported, unhandled).await;
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                () = changed.notified() => tokio::time::sleep(SETTLE).await,
                _ = tick.tick() => {
                    crate::faults::hang("agent-services-loop");
                    readiness.beat(Job::Services);
                    if !writers.missing(root, named) {
                        continue;
                    }
                }
            }
            let unhandled = round(&mut writers);
            readiness.beat(Job::Services);
            report(&recorder, &view, &mut reported, unhandled).await;
        }
    })
}
