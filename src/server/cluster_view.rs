//! The cluster as the request path sees it: the latest snapshot of what the watches
//! (watch.rs) keep, swapped whole, and whether their lists are complete.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use arc_swap::ArcSwap;

use crate::cluster::ClusterState;

/// The latest snapshot, and whether both lists have been received in full.
pub struct ClusterWatch {
    snapshot: ArcSwap<ClusterState>,
    /// Written by the two watch tasks; each write publishes a new snapshot.
    pub(super) working: Mutex<ClusterState>,
    pub(super) csi_synced: AtomicBool,
    pub(super) classes_synced: AtomicBool,
    /// The Namespace list arrived (watched only while an override selects by label).
    pub(super) namespaces_synced: AtomicBool,
    /// A configuration selects namespaces by label and the sync timeout for their list has
    /// not passed yet: readiness waits for the list meanwhile.
    pub(super) namespaces_awaited: AtomicBool,
    pub(super) synced: tokio::sync::Notify,
}

impl Default for ClusterWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterWatch {
    pub fn new() -> Self {
        ClusterWatch {
            snapshot: ArcSwap::from_pointee(ClusterState::default()),
            working: Mutex::new(ClusterState::default()),
            csi_synced: AtomicBool::new(false),
            classes_synced: AtomicBool::new(false),
            namespaces_synced: AtomicBool::new(false),
            namespaces_awaited: AtomicBool::new(false),
            synced: tokio::sync::Notify::new(),
        }
    }

    /// What the checks read on the request path.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<ClusterState>> {
        self.snapshot.load()
    }

    /// Both lists arrived complete at least once (later losses keep the last state).
    pub fn complete(&self) -> bool {
        self.csi_synced.load(Ordering::SeqCst) && self.classes_synced.load(Ordering::SeqCst)
    }

    /// A configuration selects namespaces by label, their list has not arrived, and the sync
    /// timeout has not passed: the pods those namespaces' overrides decide would be refused
    /// ("try again"), so the replica is not ready yet.
    pub fn awaiting_namespaces(&self) -> bool {
        self.namespaces_awaited.load(Ordering::SeqCst)
            && !self.namespaces_synced.load(Ordering::SeqCst)
    }

    /// A configuration that selects namespaces by label is in force: readiness waits for
    /// their list (for at most the sync timeout: [`watch`] ends the wait).
    #[cfg(test)]
    pub(crate) fn await_namespaces(&self, awaited: bool) {
        self.namespaces_awaited.store(awaited, Ordering::SeqCst);
    }

    /// The Namespace list arrived.
    #[cfg(test)]
    pub(crate) fn namespaces_arrived(&self) {
        self.namespaces_synced.store(true, Ordering::SeqCst);
    }

    /// Resolves once [`complete`](Self::complete).
    pub async fn wait_complete(&self) {
        loop {
            let notified = self.synced.notified();
            if self.complete() {
                return;
            }
            notified.await;
        }
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut ClusterState)) {
        let mut working = self.working.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut working);
        self.snapshot.store(Arc::new(working.clone()));
    }
}
