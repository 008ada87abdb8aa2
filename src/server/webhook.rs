//! The webhook port's two routes: `POST /mutate` (pods, patched) and `POST /validate` (pod
//! controllers' templates, admitted or refused), an AdmissionReview in, one out. The body is
//! read within its size and time bounds, the decision is made by [`crate::review`], and the
//! outcome is counted and logged.

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};

use super::{
    bodies,
    http::{json_error, with_json_errors},
    metrics::{
        AuditLabel, KindLabel, Metrics, OwnerLabel, ReasonLabel, ResultLabel, WorkloadLabel,
    },
    state::AppState,
};
use crate::{
    decision::Decision,
    echo::{self, ForLog},
    review,
};

/// The webhook port's router.
pub fn router(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate));
    with_json_errors(
        router,
        state,
        "webhook",
        "the webhook is POST /mutate (pods) and POST /validate (pod controllers)",
    )
}

/// A review of a body over this is large: decided alone among large ones (its view of the pod
/// is the most memory one review takes).
const SMALL_BODY: u64 = 256 << 10;

async fn mutate(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    review_at(&state, review::Endpoint::Mutate, req).await
}

async fn validate(State(state): State<Arc<AppState>>, req: axum::extract::Request) -> Response {
    review_at(&state, review::Endpoint::Validate, req).await
}

async fn review_at(
    state: &AppState,
    endpoint: review::Endpoint,
    req: axum::extract::Request,
) -> Response {
    // Room for its body, held until the answer is built (bodies.rs).
    let declared = bodies::declared_length(&req);
    let connection = req.extensions().get::<bodies::ConnectionBodies>().cloned();
    let _room = match state
        .bodies
        .room(declared, connection, &state.metrics)
        .await
    {
        Ok(room) => room,
        Err(e) => return json_error(e.status(), &e.to_string()),
    };
    let body = match state.bodies.read(req, declared).await {
        Ok(b) => b,
        Err(e) => return json_error(e.status(), &e.to_string()),
    };
    // At most a few reviews at once (`AppState::reviews`): the others wait here, holding only
    // their bodies (bounded by the body budget).
    // A large body is decided alone among large ones: its view is the most memory one review
    // can take (~20 times the body for the worst shape), so only one such is held at a time.
    let _large = match body.len() as u64 > SMALL_BODY {
        true => match state.large_review.acquire().await {
            Ok(slot) => Some(slot),
            Err(_) => return json_error(StatusCode::SERVICE_UNAVAILABLE, "no review slot"),
        },
        false => None,
    };
    let Ok(_slot) = state.reviews.acquire().await else {
        return json_error(StatusCode::SERVICE_UNAVAILABLE, "no review slot");
    };
    let start = Instant::now();
    let config = state.config.load();
    let m = &state.metrics;
    let snapshot = state.cluster.as_ref().map(|w| (w.snapshot(), w.complete()));
    let known = snapshot
        .as_ref()
        .map(|(s, complete)| crate::cluster::KnownCluster {
            state: s,
            complete: *complete,
        });
    // A review is CPU work, microseconds for a pod's few KiB and milliseconds for the largest
    // bodies. It runs on this worker: large ones one at a time (above), so at most one worker
    // is ever busy with one while the others (which steal this one's queued tasks) keep every
    // connection's I/O moving, and the admin port has a thread of its own. (Not
    // `block_in_place`: each review would run on another thread, and the allocator's
    // per-thread caches would hold ~45 MiB more at the worst shape's peak.)
    let response = answer(m, endpoint, review::handle(&config, known, endpoint, &body));
    m.duration.observe(start.elapsed().as_secs_f64());
    response
}

/// The answer to a review, counted and logged.
fn answer(
    m: &Metrics,
    endpoint: review::Endpoint,
    handled: Result<review::Handled<'_>, review::ReviewError>,
) -> Response {
    match handled {
        Ok(h) => {
            match endpoint {
                review::Endpoint::Mutate => record(m, &h),
                review::Endpoint::Validate => record_workload(m, &h),
            }
            record_audit(m, &h);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                h.body,
            )
                .into_response()
        }
        Err(e) => {
            match endpoint {
                review::Endpoint::Mutate => {
                    m.requests.get_or_create(&ResultLabel { result: "invalid" })
                }
                review::Endpoint::Validate => m.workload_reviews.get_or_create(&WorkloadLabel {
                    kind: "unknown",
                    result: "invalid",
                }),
            }
            .inc();
            tracing::debug!(error = %e, "bad request");
            json_error(StatusCode::BAD_REQUEST, &e.to_string())
        }
    }
}

fn owner_kind(h: &review::Handled<'_>) -> &'static str {
    match &h.subject.owner {
        None => "none",
        Some((kind, _)) => super::metrics::OWNER_KINDS
            .iter()
            .find(|k| **k == kind.as_ref())
            .copied()
            .unwrap_or("other"),
    }
}

/// The pod's controller as `Kind/name` for the decision log (empty for a bare pod), written
/// straight into the log line.
struct Owner<'h>(&'h review::Handled<'h>);

impl std::fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0.subject.owner {
            Some((kind, name)) => write!(f, "{kind}/{name}"),
            None => Ok(()),
        }
    }
}

fn owner<'h>(h: &'h review::Handled<'h>) -> Owner<'h> {
    Owner(h)
}

/// The injected volumes' names, comma-separated, written straight into the log line.
struct Volumes<'d, K>(&'d [(String, K)]);

impl<K> std::fmt::Display for Volumes<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, _)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

/// A workload review in the metrics and the decision log.
fn record_workload(m: &Metrics, h: &review::Handled<'_>) {
    let d = &h.decision;
    let kind = crate::workload::WORKLOADS
        .iter()
        .map(|w| w.kind)
        .find(|k| *k == h.subject.kind)
        // A custom resource's kind is the cluster's to name: one label for all of them.
        .unwrap_or(if h.subject.kind.is_empty() {
            "unknown"
        } else {
            "custom"
        });
    let result = match d {
        Decision::Denied(_) => "denied",
        Decision::AdmittedDespiteError { .. } => "admitted-on-error",
        Decision::Unchanged { .. } | Decision::Mutated { .. } => "allowed",
    };
    m.workload_reviews
        .get_or_create(&WorkloadLabel { kind, result })
        .inc();
    let workload = format!("{}/{}", h.subject.kind, h.subject.name);
    match d.denial() {
        Some(denial) if !d.allowed() => {
            tracing::info!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), workload = %ForLog::name(&workload), dry_run = h.dry_run,
                reason = denial.reason.as_str(), denial = %ForLog(denial.message.as_str(), echo::MESSAGE_LIMIT), "workload denied");
        }
        Some(denial) => {
            tracing::warn!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), workload = %ForLog::name(&workload), dry_run = h.dry_run,
                reason = denial.reason.as_str(), denial = %ForLog(denial.message.as_str(), echo::MESSAGE_LIMIT),
                "workload admitted; its pods will get no volumes (onError: warn)");
        }
        None => {
            tracing::debug!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), workload = %ForLog::name(&workload),
                volumes = %Volumes(d.injected()), "workload allowed");
        }
    }
}

/// What an audited rule or profile would have done: counted per source, logged at info.
fn record_audit(m: &Metrics, h: &review::Handled<'_>) {
    let Some(audit) = &h.audit else {
        return;
    };
    for source in &audit.sources {
        m.audit_decisions
            .get_or_create(&AuditLabel {
                source: source.clone(),
                result: audit.result,
            })
            .inc();
    }
    tracing::info!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), kind = h.subject.kind, name = %ForLog::name(&h.subject.name),
        dry_run = h.dry_run, sources = %audit.sources.join(","), result = audit.result,
        audit = %ForLog(audit.message.as_str(), echo::MESSAGE_LIMIT), "audited");
}

/// The decision in the metrics and the decision log.
fn record(m: &Metrics, h: &review::Handled<'_>) {
    let d = &h.decision;
    m.requests
        .get_or_create(&ResultLabel { result: d.label() })
        .inc();
    for (_, kind) in d.injected() {
        m.volumes
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc();
    }
    match d {
        Decision::Denied(denial) => {
            m.denials
                .get_or_create(&ReasonLabel {
                    reason: denial.reason.as_str(),
                })
                .inc();
            m.denials_by_owner
                .get_or_create(&OwnerLabel {
                    owner_kind: owner_kind(h),
                    reason: denial.reason.as_str(),
                })
                .inc();
            tracing::info!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), pod = %ForLog::name(&h.subject.name), owner = %ForLog::name(&owner(h)),
                dry_run = h.dry_run, reason = denial.reason.as_str(), denial = %ForLog(denial.message.as_str(), echo::MESSAGE_LIMIT), "denied");
        }
        Decision::AdmittedDespiteError { denial, .. } => {
            m.denials
                .get_or_create(&ReasonLabel { reason: d.label() })
                .inc();
            tracing::warn!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), pod = %ForLog::name(&h.subject.name), owner = %ForLog::name(&owner(h)), dry_run = h.dry_run,
                reason = denial.reason.as_str(), denial = %ForLog(denial.message.as_str(), echo::MESSAGE_LIMIT),
                "admitted without volumes (onError: warn)");
        }
        Decision::Mutated { injected, .. } => {
            tracing::info!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), pod = %ForLog::name(&h.subject.name), owner = %ForLog::name(&owner(h)), dry_run = h.dry_run,
                volumes = %Volumes(injected), "mutated");
        }
        Decision::Unchanged { .. } => {
            tracing::debug!(uid = %ForLog::name(h.uid), namespace = %ForLog::name(&*h.namespace), pod = %ForLog::name(&h.subject.name), "unchanged");
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt as _;

    use std::time::Duration;

    use axum::body::Bytes;

    use super::*;
    use crate::server::{
        bodies::{BodyBudget, CONNECTION_BODY_BYTES, ConnectionBodies},
        state::test_state as state,
    };

    /// Posts a review to `path`; the answer must be a 200 with a JSON body.
    async fn post_to(
        state: &Arc<AppState>,
        path: &str,
        body: &serde_json::Value,
    ) -> serde_json::Value {
        let request = axum::http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    async fn post(state: &Arc<AppState>, body: &serde_json::Value) -> serde_json::Value {
        post_to(state, "/mutate", body).await
    }

    fn review(annotations: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0d5c7a1e-0000-4000-8000-000000000001",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE", "namespace": "nf",
                "object": {"metadata": {"generateName": "nf-", "annotations": annotations},
                           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
            }
        })
    }

    #[tokio::test]
    async fn each_verdict_is_counted_under_its_own_result_and_reason() {
        let state = state("onError: warn");
        let ok =
            serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s,size=1Gi"});
        let bad = serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountpath=/s"});
        post(&state, &review(ok.clone())).await;
        post(&state, &review(serde_json::json!({"other": "x"}))).await;
        let warned = post(&state, &review(bad.clone())).await;
        assert_eq!(warned["response"]["allowed"], true);
        // Called again with the error annotation already there (reinvocation): counted the same.
        let mut again = bad.clone();
        again["injector.ephemeral-volumes.io/error"] = serde_json::json!("x");
        post(&state, &review(again)).await;
        let text = state.metrics.encode(true);
        for line in [
            "evi_admission_requests_total{result=\"mutated\"} 1",
            "evi_admission_requests_total{result=\"unchanged\"} 1",
            "evi_admission_requests_total{result=\"admitted-on-error\"} 2",
            "evi_denials_total{reason=\"admitted-on-error\"} 2",
            "evi_volumes_injected_total{kind=\"emptyDir\"} 1",
            "evi_admission_duration_seconds_count 4",
            "evi_http_responses_total{port=\"webhook\",code=\"200\"} 4",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }

        let state = self::state("");
        let denied = post(&state, &review(bad)).await;
        assert_eq!(denied["response"]["status"]["code"], 400);
        let text = state.metrics.encode(true);
        assert!(
            text.contains("evi_admission_requests_total{result=\"denied\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("evi_denials_total{reason=\"invalid\"} 1"),
            "{text}"
        );
        // Every other outcome is there, at 0 (Prometheus sees their first increase).
        assert!(
            text.contains("evi_admission_requests_total{result=\"admitted-on-error\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("evi_denials_total{reason=\"admitted-on-error\"} 0"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn workloads_are_counted_by_kind_and_refused_pods_by_their_owner() {
        let state = state("");
        let bad = serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountpath=/s"});
        let good = serde_json::json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s"});
        let job = |annotations: &serde_json::Value| {
            let mut r = review(annotations.clone());
            let pod = r["request"]["object"].take();
            r["request"]["kind"] =
                serde_json::json!({"group": "batch", "version": "v1", "kind": "Job"});
            r["request"]["object"] =
                serde_json::json!({"metadata": {"name": "nf-1"}, "spec": {"template": pod}});
            r
        };
        let refused = post_to(&state, "/validate", &job(&bad)).await;
        assert_eq!(refused["response"]["allowed"], false);
        assert_eq!(refused["response"]["status"]["code"], 400);
        let admitted = post_to(&state, "/validate", &job(&good)).await;
        assert_eq!(admitted["response"]["allowed"], true);
        assert!(admitted["response"].get("patch").is_none());
        // The pod of a Job, refused at creation (its template changed since, say).
        let mut pod = review(bad.clone());
        pod["request"]["object"]["metadata"]["ownerReferences"] = serde_json::json!([
            {"apiVersion": "batch/v1", "kind": "Job", "name": "nf-1", "uid": "1", "controller": true}]);
        post_to(&state, "/mutate", &pod).await;
        post_to(&state, "/mutate", &review(bad)).await;
        let text = state.metrics.encode(true);
        for line in [
            "evi_workload_reviews_total{kind=\"Job\",result=\"denied\"} 1",
            "evi_workload_reviews_total{kind=\"Job\",result=\"allowed\"} 1",
            "evi_pod_denials_by_owner_total{owner_kind=\"Job\",reason=\"invalid\"} 1",
            "evi_pod_denials_by_owner_total{owner_kind=\"none\",reason=\"invalid\"} 1",
            // Workload reviews are not pod admissions.
            "evi_admission_requests_total{result=\"denied\"} 2",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }

    #[tokio::test]
    async fn a_body_without_a_length_is_refused_when_it_passes_the_limit() {
        let state = state("");
        let request = axum::http::Request::post("/mutate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(vec![b' '; (1 << 20) + 1]))
            .unwrap();
        assert!(request.headers().get(header::CONTENT_LENGTH).is_none());
        let response = router(state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("--max-body-bytes"),
            "{body}"
        );
        assert!(
            state
                .metrics
                .encode(true)
                .contains("evi_http_responses_total{port=\"webhook\",code=\"413\"} 1")
        );
    }

    /// A request to the router, in-process: its status and JSON body.
    async fn send(
        state: &Arc<AppState>,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/json",
            "{method} {path}"
        );
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn bad_requests_get_a_status_and_a_json_reason() {
        let mut limited = Arc::into_inner(state("")).unwrap();
        limited.bodies.max_bytes = 65_536;
        let state = Arc::new(limited);
        let error = |v: &serde_json::Value| v["error"].as_str().unwrap_or_default().to_owned();

        let (s, b) = send(&state, "POST", "/mutate", b"{not json".to_vec()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(error(&b).contains("not an AdmissionReview"), "{b}");
        let no_request = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        let (s, b) = send(&state, "POST", "/mutate", no_request.to_vec()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(error(&b).contains("no request"), "{b}");
        let (s, b) = send(&state, "POST", "/mutate", vec![0xff, b'{']).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(error(&b).contains("not UTF-8"), "{b}");

        let (s, b) = send(&state, "GET", "/mutate", vec![]).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        assert!(error(&b).contains("POST /mutate"), "{b}");
        let (s, b) = send(&state, "POST", "/other", vec![]).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert!(error(&b).contains("POST /mutate"), "{b}");

        // An UPDATE review twice the limit, with its length declared.
        let (s, b) = send(&state, "POST", "/mutate", vec![b' '; 131_072]).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(error(&b).contains("65536 bytes (--max-body-bytes)"), "{b}");

        let text = state.metrics.encode(true);
        for line in [
            "evi_admission_requests_total{result=\"invalid\"} 3",
            "evi_http_responses_total{port=\"webhook\",code=\"400\"} 3",
            "evi_http_responses_total{port=\"webhook\",code=\"405\"} 1",
            "evi_http_responses_total{port=\"webhook\",code=\"404\"} 1",
            "evi_http_responses_total{port=\"webhook\",code=\"413\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_a_408() {
        let mut slow = Arc::into_inner(state("")).unwrap();
        slow.bodies.timeout = Duration::from_millis(50);
        let state = Arc::new(slow);
        // A body stream that never ends.
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = axum::body::Body::from_stream(tokio_stream_of(rx));
        let request = axum::http::Request::post("/mutate").body(body).unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    }

    /// A request whose body arrives in two parts, the second when told.
    fn streamed(
        body: &[u8],
    ) -> (
        axum::http::Request<axum::body::Body>,
        impl FnOnce() -> tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
        let (first, rest) = body.split_at(body.len() / 2);
        let (first, rest) = (Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest));
        let request = axum::http::Request::post("/mutate")
            .header("content-type", "application/json")
            .header(header::CONTENT_LENGTH, body.len())
            .body(axum::body::Body::from_stream(tokio_stream_of(rx)))
            .unwrap();
        tx.try_send(Ok(first)).unwrap();
        (request, move || {
            tokio::spawn(async move {
                tx.send(Ok(rest)).await.unwrap();
            })
        })
    }

    #[tokio::test]
    async fn bodies_past_the_inflight_budget_wait_for_room_and_are_then_served() {
        let mut small = Arc::into_inner(state("")).unwrap();
        let body = serde_json::to_vec(&review(serde_json::json!({
            "ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s",
            "example.com/large": "x".repeat(300 << 10),
        })))
        .unwrap();
        // Room for one such body and a half.
        small.bodies.budget = BodyBudget::new(body.len() * 3 / 2);
        let state = Arc::new(small);
        let (first, finish_first) = streamed(&body);
        let (second, finish_second) = streamed(&body);
        let first = tokio::spawn(router(state.clone()).oneshot(first));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = tokio::spawn(router(state.clone()).oneshot(second));
        finish_second();
        // The second's body is all there, but the first holds the room it needs.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "the second request did not wait");
        assert!(
            state
                .metrics
                .encode(true)
                .contains("evi_body_budget_waits_total 1")
        );
        finish_first();
        for handle in [first, second] {
            let response = handle.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        // Every share given back: a body of the whole budget's size gets room at once.
        assert_eq!(
            post(&state, &review(serde_json::json!({}))).await["response"]["allowed"],
            true
        );
        assert!(
            state
                .metrics
                .encode(true)
                .contains("evi_body_budget_waits_total 1")
        );
    }

    #[tokio::test]
    async fn a_request_that_finds_no_room_in_time_gets_a_503_naming_the_flag() {
        let mut small = Arc::into_inner(state("")).unwrap();
        small.bodies.budget = BodyBudget::new(512 << 10);
        small.bodies.timeout = Duration::from_millis(50);
        let state = Arc::new(small);
        // Held by the requests being served.
        let _held = state.bodies.budget.room.try_acquire_many(512).unwrap();
        let spaces = vec![b' '; 300 << 10];
        let (large, _rest) = streamed(&spaces);
        let response = router(state.clone()).oneshot(large).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        assert!(
            String::from_utf8_lossy(&bytes).contains("--max-inflight-body-bytes"),
            "{bytes:?}"
        );
        // A small body takes no share: answered while the large ones wait.
        let (s, _) = send(&state, "POST", "/mutate", b"{}".to_vec()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn a_connections_bodies_share_its_own_allowance_and_never_wait_for_another_connections() {
        let mut quick = Arc::into_inner(state("")).unwrap();
        quick.bodies.timeout = Duration::from_millis(200);
        let state = Arc::new(quick);
        let on = |conn: &ConnectionBodies, mut req: axum::extract::Request| {
            req.extensions_mut().insert(conn.clone());
            req
        };
        let (one, other) = (ConnectionBodies::new(), ConnectionBodies::new());
        // Streams of the first connection hold 60 KiB of bodies being read.
        let held = one.0.clone().try_acquire_many_owned(60).unwrap();
        // Another stream of the same connection finds no room for its 8 KiB in time.
        let eight = [b' '; 8 << 10];
        let (second, _rest) = streamed(&eight);
        let response = router(state.clone())
            .oneshot(on(&one, second))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        assert!(
            String::from_utf8_lossy(&bytes).contains("this connection's other requests"),
            "{bytes:?}"
        );
        // A review on another connection is answered at once, and the budget was not touched.
        let body = serde_json::to_vec(&review(serde_json::json!({}))).unwrap();
        let request = |body: &[u8]| {
            axum::http::Request::post("/mutate")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_vec()))
                .unwrap()
        };
        let response = router(state.clone())
            .oneshot(on(&other, request(&body)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            state.bodies.budget.room.available_permits(),
            state.bodies.budget.total_kib as usize
        );
        // Once they are answered, the first connection's reviews are served, and its room is
        // whole again after each.
        drop(held);
        let response = router(state.clone())
            .oneshot(on(&one, request(&body)))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            one.0.available_permits(),
            (CONNECTION_BODY_BYTES / 1024) as usize
        );
    }

    #[tokio::test]
    async fn a_body_past_the_connection_allowance_takes_a_budget_share_and_one_of_unknown_length_the_allowance()
     {
        let mut small = Arc::into_inner(state("")).unwrap();
        small.bodies.budget = BodyBudget::new(4 << 20);
        small.bodies.timeout = Duration::from_millis(50);
        let state = Arc::new(small);
        let unknown = |bytes: Vec<u8>| {
            let mut request = axum::http::Request::post("/mutate")
                .header("content-type", "application/json")
                .body(axum::body::Body::from_stream(futures_util::stream::iter([
                    Ok::<_, std::io::Error>(Bytes::from(bytes)),
                ])))
                .unwrap();
            request.extensions_mut().insert(ConnectionBodies::new());
            request
        };
        // 100 KiB (over the connection's 64) waits for the budget, held by others here.
        let held = state.bodies.budget.room.try_acquire_many(4 << 10).unwrap();
        let spaces = vec![b' '; 100 << 10];
        let (mut past, _rest) = streamed(&spaces);
        past.extensions_mut().insert(ConnectionBodies::new());
        let response = router(state.clone()).oneshot(past).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        // A body of unknown length is read on its connection's allowance, not the budget's...
        let (status, _) = {
            let response = router(state.clone())
                .oneshot(unknown(b"{}".to_vec()))
                .await
                .unwrap();
            (response.status(), ())
        };
        assert_eq!(status, StatusCode::BAD_REQUEST);
        drop(held);
        // ... and only up to it: past 64 KiB it is refused, asking for its length.
        let response = router(state.clone())
            .oneshot(unknown(vec![b' '; (64 << 10) + 1]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        assert!(
            String::from_utf8_lossy(&bytes).contains("send its Content-Length"),
            "{bytes:?}"
        );
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
