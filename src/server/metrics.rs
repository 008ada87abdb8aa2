//! Prometheus metrics (prometheus-client), served on the admin port.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// An audited decision: what was audited (`rule/<name>`, `profile/<name>`, …) and what
/// enforcing it would have done.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditLabel {
    pub source: String,
    pub result: &'static str,
}

/// The build a replica runs (`evi_build_info`, always 1).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabel {
    pub version: &'static str,
    pub commit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// A workload review (`POST /validate`): the workload's kind and the result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabel {
    pub kind: &'static str,
    pub result: &'static str,
}

/// A pod refused, by its controller's kind (`none` for a bare pod) and the reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwnerLabel {
    pub owner_kind: &'static str,
    pub reason: &'static str,
}

/// A reload's outcome and, for a failure, why (`read`, `invalid`, `key-mismatch`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    pub outcome: &'static str,
    pub reason: &'static str,
}

/// Why a connection was closed by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    HandshakeTimeout,
    HeaderTimeout,
    Idle,
    /// Not in a request, and closed to make room for a newcomer.
    Evicted,
    Malformed,
    /// A newcomer closed at once: its address held its share of the slots.
    Refused,
}

impl Cause {
    /// Every cause (the metrics start each at 0).
    pub const ALL: [Cause; 6] = [
        Cause::HandshakeTimeout,
        Cause::HeaderTimeout,
        Cause::Idle,
        Cause::Evicted,
        Cause::Malformed,
        Cause::Refused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::HandshakeTimeout => "handshake-timeout",
            Cause::HeaderTimeout => "header-timeout",
            Cause::Idle => "idle",
            Cause::Evicted => "evicted",
            Cause::Malformed => "malformed",
            Cause::Refused => "refused",
        }
    }
}

/// A connection closed by the server: which port, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub port: &'static str,
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabel {
    pub port: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabel {
    pub certificate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub port: &'static str,
    pub code: u16,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<ResultLabel, Counter>,
    pub duration: Histogram,
    pub volumes: Family<KindLabel, Counter>,
    pub denials: Family<ReasonLabel, Counter>,
    pub workload_reviews: Family<WorkloadLabel, Counter>,
    pub denials_by_owner: Family<OwnerLabel, Counter>,
    pub config_reloads: Family<ReloadLabel, Counter>,
    pub cert_reloads: Family<ReloadLabel, Counter>,
    pub cert_not_after: Gauge,
    /// Self-managed TLS: the signing CA's expiry (0 in the other modes).
    pub ca_not_after: Gauge,
    /// Time left, computed from the two expiries at each scrape.
    pub cert_expiry: Family<CertificateLabel, Gauge>,
    pub tls_steps: Family<StepLabel, Counter>,
    pub tls_errors: Family<OperationLabel, Counter>,
    pub ca_bundle_patches: Counter,
    /// Requests that waited for room under --max-inflight-body-bytes.
    pub body_budget_waits: Counter,
    pub connections_closed: Family<CauseLabel, Counter>,
    pub connections_open: Family<PortLabel, Gauge>,
    pub at_capacity: Family<PortLabel, Counter>,
    pub responses: Family<CodeLabel, Counter>,
    pub cluster_objects: Family<KindLabel, Gauge>,
    pub cluster_watch_errors: Family<KindLabel, Counter>,
    pub cluster_degraded: Gauge,
    /// 1 when the last configuration reload was put in force (or none was tried), 0 when it
    /// was refused.
    pub config_last_reload_ok: Gauge,
    /// What `/readyz` answers, set at each scrape.
    pub ready: Gauge,
    pub audit_decisions: Family<AuditLabel, Counter>,
}

/// The controller kinds a pod refusal is counted under; any other is `other` (the label's
/// values stay few whatever clients write in `ownerReferences`), a bare pod `none`.
pub const OWNER_KINDS: [&str; 6] = [
    "Job",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "ReplicationController",
    "CronJob",
];

/// Every result of a pod review.
const RESULTS: [&str; 5] = [
    "mutated",
    "unchanged",
    "denied",
    "admitted-on-error",
    "invalid",
];

/// Every result of a workload review.
const WORKLOAD_RESULTS: [&str; 4] = ["allowed", "denied", "admitted-on-error", "invalid"];

/// Admission decisions take microseconds; buckets from 10 µs to 1 s.
const BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.1, 0.25, 1.0,
];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("evi");
        let requests = Family::<ResultLabel, Counter>::default();
        registry.register(
            "admission_requests",
            "AdmissionReview requests by result (mutated, unchanged, denied, admitted-on-error, invalid)",
            requests.clone(),
        );
        let duration = Histogram::new(BUCKETS);
        registry.register(
            "admission_duration_seconds",
            "Time to decode, decide and encode one AdmissionReview",
            duration.clone(),
        );
        let volumes = Family::<KindLabel, Counter>::default();
        registry.register(
            "volumes_injected",
            "Volumes injected, by kind (emptyDir, csi, ephemeral)",
            volumes.clone(),
        );
        let denials = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "denials",
            "Pods refused (or, with onError warn, admitted without volumes), by reason",
            denials.clone(),
        );
        let workload_reviews = Family::<WorkloadLabel, Counter>::default();
        registry.register(
            "workload_reviews",
            "Pod controllers checked at POST /validate, by kind (Job, CronJob, Deployment, …) and result (allowed, denied, admitted-on-error, invalid)",
            workload_reviews.clone(),
        );
        let denials_by_owner = Family::<OwnerLabel, Counter>::default();
        registry.register(
            "pod_denials_by_owner",
            "Pods refused at POST /mutate, by the kind of their controller (Job, ReplicaSet, …; none for a bare pod; other for any other kind) and reason",
            denials_by_owner.clone(),
        );
        let config_reloads = Family::<ReloadLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads by outcome (success, failure) and reason of a failure",
            config_reloads.clone(),
        );
        let cert_reloads = Family::<ReloadLabel, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads by outcome (success, failure) and reason of a failure",
            cert_reloads.clone(),
        );
        let connections_closed = Family::<CauseLabel, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections the server closed, by port and cause (handshake-timeout, header-timeout, idle, evicted, malformed, refused)",
            connections_closed.clone(),
        );
        let connections_open = Family::<PortLabel, Gauge>::default();
        registry.register(
            "connections_open",
            "Connections being served, by port",
            connections_open.clone(),
        );
        let at_capacity = Family::<PortLabel, Counter>::default();
        registry.register(
            "connections_at_capacity",
            "Times a newcomer found its port at the connection cap with no connection it could close (every one in a request); it waits for a slot up to the header bound",
            at_capacity.clone(),
        );
        let responses = Family::<CodeLabel, Counter>::default();
        registry.register(
            "http_responses",
            "HTTP responses by port and status code",
            responses.clone(),
        );
        let cert_not_after = Gauge::default();
        registry.register(
            "certificate_not_after_timestamp_seconds",
            "Expiry of the serving certificate, Unix time",
            cert_not_after.clone(),
        );
        let ca_not_after = Gauge::default();
        registry.register(
            "ca_not_after_timestamp_seconds",
            "Self-managed TLS: expiry of the CA that signs the serving certificate, Unix time (0 in the other modes)",
            ca_not_after.clone(),
        );
        let cert_expiry = Family::<CertificateLabel, Gauge>::default();
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the serving certificate (certificate=serving) or, self-managed, its CA (certificate=ca) expires",
            cert_expiry.clone(),
        );
        let tls_steps = Family::<StepLabel, Counter>::default();
        registry.register(
            "tls_steps",
            "Self-managed TLS: changes this replica wrote to its Secret, by step (created, next-ca-added, next-ca-trusted, next-ca-untrusted, ca-switched, old-cas-removed, serving-renewed, bundle-repaired)",
            tls_steps.clone(),
        );
        let tls_errors = Family::<OperationLabel, Counter>::default();
        registry.register(
            "tls_errors",
            "Self-managed TLS: failures, by operation (read-secret, write-secret, read-webhook-configuration, patch-webhook-configuration, watch, generate, unusable-secret); the certificate in use stays",
            tls_errors.clone(),
        );
        let ca_bundle_patches = Counter::default();
        registry.register(
            "ca_bundle_patches",
            "Self-managed TLS: webhooks whose caBundle this replica set (at the start, at a rotation, or back after something else changed it)",
            ca_bundle_patches.clone(),
        );
        let body_budget_waits = Counter::default();
        registry.register(
            "body_budget_waits",
            "Requests whose body waited for room: the bodies held at once reached --max-inflight-body-bytes",
            body_budget_waits.clone(),
        );
        let cluster_objects = Family::<KindLabel, Gauge>::default();
        registry.register(
            "cluster_objects",
            "CSIDriver and StorageClass objects known to the cluster checks, by kind",
            cluster_objects.clone(),
        );
        let cluster_watch_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "cluster_watch_errors",
            "Failures of the CSIDriver and StorageClass watches (retried with backoff; the last state is kept)",
            cluster_watch_errors.clone(),
        );
        let cluster_degraded = Gauge::default();
        registry.register(
            "cluster_checks_degraded",
            "1 while the cluster lists have not arrived after the sync timeout (checks in warn meanwhile)",
            cluster_degraded.clone(),
        );
        let config_last_reload_ok = Gauge::default();
        config_last_reload_ok.set(1);
        registry.register(
            "config_last_reload_successful",
            "1 when the last configuration reload was put in force (or none was tried yet), 0 when it was refused (the previous configuration stays in force)",
            config_last_reload_ok.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 while this replica is ready (what /readyz answers), 0 otherwise",
            ready.clone(),
        );
        let build_info = Family::<BuildLabel, Gauge>::default();
        registry.register(
            "build_info",
            "The build this replica runs (always 1): version and commit",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                commit: env!("EVI_COMMIT"),
            })
            .set(1);
        let audit_decisions = Family::<AuditLabel, Counter>::default();
        registry.register(
            "audit_decisions",
            "Decisions that an audited rule, profile or default (mode: audit) would have changed, by what was audited (rule/<name>, profile/<name>, mode/audit for inline annotation volumes under the default) and what enforcing it would have done (mutated, denied, admitted-on-error, unchanged), counted for the sources that cause it",
            audit_decisions.clone(),
        );
        let metrics = Metrics {
            audit_decisions,
            registry,
            requests,
            duration,
            volumes,
            denials,
            workload_reviews,
            denials_by_owner,
            config_reloads,
            cert_reloads,
            cert_not_after,
            ca_not_after,
            cert_expiry,
            tls_steps,
            tls_errors,
            ca_bundle_patches,
            body_budget_waits,
            connections_closed,
            connections_open,
            at_capacity,
            responses,
            cluster_objects,
            cluster_watch_errors,
            cluster_degraded,
            ready,
            config_last_reload_ok,
        };
        metrics.start_at_zero();
        metrics
    }
}

impl Metrics {
    /// Every series of a closed set of label values, at 0 from the start: Prometheus sees
    /// a counter's first increase (`increase()` of a series that appears at 1 is 0), and the
    /// alerts and dashboard find the names they query on a replica that has served nothing.
    fn start_at_zero(&self) {
        use crate::{decision::DenyReason, volume::VolumeKind, workload::WORKLOADS};
        for result in RESULTS {
            drop(self.requests.get_or_create(&ResultLabel { result }));
        }
        for kind in VolumeKind::ALL {
            drop(self.volumes.get_or_create(&KindLabel {
                kind: kind.as_str(),
            }));
        }
        let reasons = DenyReason::ALL.map(DenyReason::as_str);
        for reason in reasons.into_iter().chain(["admitted-on-error"]) {
            drop(self.denials.get_or_create(&ReasonLabel { reason }));
        }
        for owner_kind in OWNER_KINDS.into_iter().chain(["other", "none"]) {
            for reason in reasons {
                drop(
                    self.denials_by_owner
                        .get_or_create(&OwnerLabel { owner_kind, reason }),
                );
            }
        }
        for kind in WORKLOADS.map(|w| w.kind) {
            for result in WORKLOAD_RESULTS {
                drop(
                    self.workload_reviews
                        .get_or_create(&WorkloadLabel { kind, result }),
                );
            }
        }
        for (outcome, reason) in [("success", ""), ("failure", "read"), ("failure", "invalid")] {
            let label = ReloadLabel { outcome, reason };
            drop(self.config_reloads.get_or_create(&label));
            drop(self.cert_reloads.get_or_create(&label));
        }
        for port in ["webhook", "admin"] {
            drop(self.connections_open.get_or_create(&PortLabel { port }));
            drop(self.at_capacity.get_or_create(&PortLabel { port }));
            for cause in Cause::ALL {
                let cause = cause.as_str();
                drop(
                    self.connections_closed
                        .get_or_create(&CauseLabel { port, cause }),
                );
            }
        }
    }

    /// The metrics in Prometheus' text format; `ready` is what `/readyz` answers now.
    pub fn encode(&self, ready: bool) -> String {
        self.ready.set(i64::from(ready));
        let now = super::certs::unix_now();
        for (certificate, not_after) in [
            ("serving", &self.cert_not_after),
            ("ca", &self.ca_not_after),
        ] {
            if not_after.get() != 0 {
                self.cert_expiry
                    .get_or_create(&CertificateLabel { certificate })
                    .set(not_after.get() - now);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
