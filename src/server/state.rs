//! What every request shares ([`AppState`]): the configuration in force, the metrics, the
//! certificates, readiness, and the bounds on what reviews hold at once.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use arc_swap::ArcSwap;

use super::{bodies::Bodies, cluster_view::ClusterWatch, metrics::Metrics, tls::CertStore};
use crate::config::Config;

/// Shared by every request; swapped pieces are behind `ArcSwap`.
pub(crate) struct AppState {
    pub config: ArcSwap<Config>,
    pub metrics: Metrics,
    pub certs: Arc<CertStore>,
    pub ready: AtomicBool,
    /// The bounds on request bodies: size, time, and room for those held at once.
    pub bodies: Bodies,
    /// Reviews decided at once ([`reviews_at_once`]): what a review costs beyond its body (the
    /// pod's view, up to ~20 times the body for the worst shape) is held by at most this many.
    pub reviews: tokio::sync::Semaphore,
    /// One review of a large body (over 256 KiB) at a time.
    pub large_review: tokio::sync::Semaphore,
    /// The cluster as the watches see it; `None` without API access (checks off).
    pub cluster: Option<Arc<ClusterWatch>>,
    /// The first cluster lists arrived, or the sync timeout passed (readiness waits for it).
    pub cluster_ready: AtomicBool,
    /// Why there is no API client although one was asked for (`--kubeconfig`, or a pod's
    /// service account) while the checks were off: a reload that turns them on is refused.
    pub no_client: Option<String>,
    /// A valid serving certificate is in use (self-managed TLS starts without one).
    pub tls_ready: AtomicBool,
}

impl AppState {
    /// Why the replica is not ready (`/readyz` answers 503 with it; `evi_ready` is 0), or
    /// `None` when it is.
    pub fn unready_reason(&self) -> Option<&'static str> {
        if !self.ready.load(Ordering::SeqCst) {
            Some("starting or shutting down")
        } else if !self.tls_ready.load(Ordering::SeqCst) {
            Some("no valid serving certificate (self-managed TLS: see the log)")
        } else if !self.cluster_ready.load(Ordering::SeqCst) {
            Some("waiting for the cluster's CSIDriver and StorageClass lists")
        } else if self
            .cluster
            .as_ref()
            .is_some_and(|w| w.awaiting_namespaces())
        {
            Some("waiting for the Namespace list (policyOverrides select namespaces by label)")
        } else {
            None
        }
    }
}

/// How many reviews are decided at once: one per CPU the process may use, at most 4 (a review
/// is CPU work of microseconds to milliseconds; more at once would only hold more memory).
pub(crate) fn reviews_at_once() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .clamp(1, MAX_REVIEWS_AT_ONCE)
}

/// The most reviews decided at once, however many CPUs.
pub(crate) const MAX_REVIEWS_AT_ONCE: usize = 4;

/// An application state for in-process tests of the routers: ready, with a self-signed
/// certificate and this configuration.
#[cfg(test)]
pub(crate) fn test_state(config: &str) -> Arc<AppState> {
    test_state_watching(config, None)
}

/// [`test_state`] with the cluster seen through `cluster`.
#[cfg(test)]
pub(crate) fn test_state_watching(
    config: &str,
    cluster: Option<Arc<ClusterWatch>>,
) -> Arc<AppState> {
    let pair = super::tls::self_signed(&["localhost"]).unwrap();
    let loaded = super::tls::load_pem(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).unwrap();
    Arc::new(AppState {
        config: ArcSwap::from_pointee(Config::parse(config).unwrap()),
        metrics: Metrics::default(),
        certs: Arc::new(CertStore::new(loaded.key)),
        ready: AtomicBool::new(true),
        bodies: Bodies {
            max_bytes: 1 << 20,
            timeout: std::time::Duration::from_secs(5),
            budget: super::bodies::BodyBudget::new(32 << 20),
        },
        reviews: tokio::sync::Semaphore::new(reviews_at_once()),
        large_review: tokio::sync::Semaphore::new(1),
        cluster,
        cluster_ready: AtomicBool::new(true),
        no_client: None,
        tls_ready: AtomicBool::new(true),
    })
}
