//! The cluster as `serve` knows it: CSIDriver and StorageClass objects watched through the
//! kube runtime (list, then watch, re-listing after a lost watch with backoff), each reduced to
//! the few fields the checks read. The request path only loads the current snapshot; it never
//! calls the API server.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures_util::StreamExt as _;
use k8s_openapi::api::{
    core::v1::Namespace,
    storage::v1::{CSIDriver, StorageClass},
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};

use super::{cluster_view::ClusterWatch, metrics::KindLabel, state::AppState};
use crate::cluster::{ClusterState, CsiDriverInfo, StorageClassInfo};

/// Starts the two watches; `w` fills in as the lists arrive.
/// They run through the drain and stop after it.
pub fn watch(
    client: Client,
    w: Arc<ClusterWatch>,
    state: Arc<AppState>,
    background: &super::tasks::Background,
    sync_timeout: std::time::Duration,
) {
    use super::tasks::Until;
    // KnownCluster from the start (at 0), so that the dashboard and alerts find them.
    for kind in [drivers().name, classes().name] {
        let label = KindLabel { kind };
        drop(state.metrics.cluster_objects.get_or_create(&label));
        drop(state.metrics.cluster_watch_errors.get_or_create(&label));
    }
    background.spawn(
        Until::Exit,
        "cluster checks: CSIDriver watch",
        run(
            Api::<CSIDriver>::all(client.clone()),
            w.clone(),
            state.clone(),
            drivers(),
        ),
    );
    background.spawn(
        Until::Exit,
        "cluster checks: StorageClass watch",
        run(
            Api::<StorageClass>::all(client.clone()),
            w.clone(),
            state.clone(),
            classes(),
        ),
    );
    // Namespaces only once a configuration has an override that selects them by label (the
    // chart grants the Namespace list and watch only then).
    background.spawn(
        Until::Exit,
        "policy overrides: Namespace watch",
        async move {
            // Readiness waits for the list only when the configuration the replica starts
            // with selects by label, as it waits for the CSIDriver and StorageClass lists
            // only at start: a reload that turns such an override on must not make every
            // replica unready at once (their pods are refused "try again" until it arrives).
            let at_start = state.config.load().uses_namespace_labels();
            while !state.config.load().uses_namespace_labels() {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            // Ready once the list arrives, or unready for at most the sync timeout (the
            // chart may not grant the list: a replica must not stay unready for it).
            w.namespaces_awaited.store(at_start, Ordering::SeqCst);
            let timer = w.clone();
            tokio::spawn(async move {
                tokio::time::sleep(sync_timeout).await;
                if timer.awaiting_namespaces() {
                    tracing::warn!(timeout = ?sync_timeout, "the Namespace list has not arrived: ready; pods whose annotations need a label-selected policyOverride are refused (try again) until it does");
                }
                timer.namespaces_awaited.store(false, Ordering::SeqCst);
            });
            let label = KindLabel {
                kind: namespaces().name,
            };
            drop(state.metrics.cluster_objects.get_or_create(&label));
            drop(state.metrics.cluster_watch_errors.get_or_create(&label));
            run(Api::<Namespace>::all(client), w, state, namespaces()).await;
        },
    );
}

/// Namespaces: their labels, for the policy overrides that select by label.
fn namespaces() -> Kind<Namespace, Map<String>> {
    Kind {
        name: "Namespace",
        reduce: |n: &Namespace| n.metadata.labels.clone().unwrap_or_default(),
        map: |s: &mut ClusterState| &mut s.namespaces,
        synced: |w: &ClusterWatch| &w.namespaces_synced,
    }
}

/// CSIDrivers: the volume lifecycle modes (is `Ephemeral` among them).
fn drivers() -> Kind<CSIDriver, CsiDriverInfo> {
    Kind {
        name: "CSIDriver",
        reduce: |d: &CSIDriver| {
            let modes = d
                .spec
                .volume_lifecycle_modes
                .as_ref()
                .map(|m| m.iter().map(String::as_str));
            CsiDriverInfo::from_modes(modes)
        },
        map: |s: &mut ClusterState| &mut s.csi_drivers,
        synced: |w: &ClusterWatch| &w.csi_synced,
    }
}

/// StorageClasses: the provisioner and the annotations the checks read.
fn classes() -> Kind<StorageClass, StorageClassInfo> {
    Kind {
        name: "StorageClass",
        reduce: |c: &StorageClass| {
            let annotations = c
                .metadata
                .annotations
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str()));
            StorageClassInfo::from_parts(&c.provisioner, annotations)
        },
        map: |s: &mut ClusterState| &mut s.storage_classes,
        synced: |w: &ClusterWatch| &w.classes_synced,
    }
}

type Map<V> = std::collections::BTreeMap<String, V>;

/// One kind the watches follow: its name in logs and metrics, what the checks keep of an
/// object, where that goes in the state, and the flag set once its first list is in.
struct Kind<K, V> {
    name: &'static str,
    reduce: fn(&K) -> V,
    map: fn(&mut ClusterState) -> &mut Map<V>,
    synced: fn(&ClusterWatch) -> &AtomicBool,
}

/// One kind's watch: a complete list replaces the map at once (`InitDone`); single changes
/// apply as they come. Errors are counted and retried with backoff, the last state kept.
async fn run<K, V>(api: Api<K>, w: Arc<ClusterWatch>, state: Arc<AppState>, kind: Kind<K, V>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    V: Clone + Send + 'static,
{
    let mut buffer: Map<V> = Map::new();
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        on_event(&kind, &w, &state.metrics, &mut buffer, event);
    }
}

/// One event of a kind's watch, applied to the state (or to the list being received).
fn on_event<K: kube::Resource, V: Clone>(
    kind: &Kind<K, V>,
    w: &ClusterWatch,
    metrics: &super::metrics::Metrics,
    buffer: &mut Map<V>,
    event: Result<watcher::Event<K>, watcher::Error>,
) {
    let label = KindLabel { kind: kind.name };
    let name = |o: &K| o.meta().name.clone().unwrap_or_default();
    let map = kind.map;
    let count = match event {
        Ok(watcher::Event::Init) => {
            buffer.clear();
            return;
        }
        Ok(watcher::Event::InitApply(o)) => {
            buffer.insert(name(&o), (kind.reduce)(&o));
            return;
        }
        Ok(watcher::Event::InitDone) => {
            let list = std::mem::take(buffer);
            let count = list.len();
            w.update(|s| *map(s) = list);
            // The count is in before readiness can hear of the list.
            metrics
                .cluster_objects
                .get_or_create(&label)
                .set(i64::try_from(count).unwrap_or(i64::MAX));
            if !(kind.synced)(w).swap(true, Ordering::SeqCst) {
                tracing::info!(kind = kind.name, count, "cluster list received");
            }
            w.synced.notify_waiters();
            return;
        }
        Ok(watcher::Event::Apply(o)) => {
            let v = (kind.reduce)(&o);
            w.update(|s| {
                map(s).insert(name(&o), v);
            });
            objects(w, map)
        }
        Ok(watcher::Event::Delete(o)) => {
            w.update(|s| {
                map(s).remove(&name(&o));
            });
            objects(w, map)
        }
        Err(e) => {
            metrics.cluster_watch_errors.get_or_create(&label).inc();
            tracing::warn!(kind = kind.name, error = %e, "cluster watch failed; keeping the last known state and retrying");
            return;
        }
    };
    metrics.cluster_objects.get_or_create(&label).set(count);
}

fn objects<V>(w: &ClusterWatch, map: fn(&mut ClusterState) -> &mut Map<V>) -> i64 {
    let mut working = w.working.lock().unwrap_or_else(|p| p.into_inner());
    i64::try_from(map(&mut working).len()).unwrap_or(i64::MAX)
}

/// Readiness waits up to `timeout` for the first complete lists; past it the webhook is
/// ready with the checks in warn (and `evi_cluster_checks_degraded` at 1) until they arrive.
pub async fn await_sync(w: Arc<ClusterWatch>, state: Arc<AppState>, timeout: std::time::Duration) {
    let complete = tokio::time::timeout(timeout, w.wait_complete())
        .await
        .is_ok();
    state
        .cluster_ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    if !complete {
        state.metrics.cluster_degraded.set(1);
        tracing::warn!(timeout = ?timeout, "the cluster's CSIDriver and StorageClass lists have not arrived: ready, with the cluster checks in warn until they do");
        w.wait_complete().await;
        state.metrics.cluster_degraded.set(0);
        tracing::info!("cluster lists received: the cluster checks are as configured again");
    }
}

#[cfg(test)]
mod tests {

    use k8s_openapi::{
        api::storage::v1::CSIDriverSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;
    use crate::server::metrics::Metrics;

    fn driver(name: &str, modes: &[&str]) -> CSIDriver {
        CSIDriver {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSIDriverSpec {
                volume_lifecycle_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                ..Default::default()
            },
        }
    }

    fn count(metrics: &Metrics) -> i64 {
        metrics
            .cluster_objects
            .get_or_create(&KindLabel { kind: "CSIDriver" })
            .get()
    }

    #[test]
    fn a_list_replaces_the_state_only_when_complete_and_changes_apply_one_by_one() {
        let (kind, w, metrics) = (drivers(), ClusterWatch::new(), Metrics::default());
        let mut buffer = Map::new();
        let mut event = |e| on_event(&kind, &w, &metrics, &mut buffer, e);
        let names = |w: &ClusterWatch| w.snapshot().csi_drivers.keys().cloned().collect::<Vec<_>>();

        event(Ok(watcher::Event::Apply(driver(
            "old.csi.k8s.io",
            &["Persistent"],
        ))));
        event(Ok(watcher::Event::Init));
        event(Ok(watcher::Event::InitApply(driver(
            "secrets-store.csi.k8s.io",
            &["Ephemeral"],
        ))));
        assert_eq!(
            names(&w),
            ["old.csi.k8s.io"],
            "a list half received changes nothing"
        );
        assert!(!w.csi_synced.load(Ordering::SeqCst));

        event(Ok(watcher::Event::InitDone));
        assert_eq!(
            names(&w),
            ["secrets-store.csi.k8s.io"],
            "the list replaces the state"
        );
        assert!(w.csi_synced.load(Ordering::SeqCst));
        assert_eq!(count(&metrics), 1);
        let info = &w.snapshot().csi_drivers["secrets-store.csi.k8s.io"];
        assert_eq!(info, &CsiDriverInfo::from_modes(Some(["Ephemeral"])));

        event(Ok(watcher::Event::Apply(driver(
            "b.csi.k8s.io",
            &["Ephemeral"],
        ))));
        assert_eq!(count(&metrics), 2);
        event(Ok(watcher::Event::Delete(driver(
            "secrets-store.csi.k8s.io",
            &[],
        ))));
        assert_eq!(names(&w), ["b.csi.k8s.io"]);
        assert_eq!(count(&metrics), 1);

        event(Err(watcher::Error::NoResourceVersion));
        assert_eq!(
            names(&w),
            ["b.csi.k8s.io"],
            "a failed watch keeps the last state"
        );
        let errors = metrics
            .cluster_watch_errors
            .get_or_create(&KindLabel { kind: "CSIDriver" })
            .get();
        assert_eq!(errors, 1);
    }
}
