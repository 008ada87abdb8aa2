//! The admin port (plain HTTP): `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    routing::get,
};

use super::{http::with_json_errors, state::AppState};

/// The admin port's router.
pub fn router(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(s): State<Arc<AppState>>| async move {
                match s.unready_reason() {
                    Some(why) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {why}\n"),
                    ),
                    None => (StatusCode::OK, "ready\n".to_owned()),
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Arc<AppState>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    s.metrics.encode(s.unready_reason().is_none()),
                )
            }),
        );
    with_json_errors(
        router,
        state,
        "admin",
        "the admin endpoints are GET /healthz, /readyz, /metrics",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::http::Request;
    use tower::ServiceExt as _;

    use super::*;
    use crate::server::state::test_state;

    async fn get(state: &Arc<AppState>, method: &str, path: &str) -> (StatusCode, String, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let kind = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, kind, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readiness_waits_for_the_namespace_list_while_it_is_awaited() {
        let w = Arc::new(crate::server::cluster_view::ClusterWatch::new());
        let state = crate::server::state::test_state_watching("", Some(w.clone()));
        assert_eq!(get(&state, "GET", "/readyz").await.0, StatusCode::OK);
        // A configuration that selects namespaces by label came into force.
        w.await_namespaces(true);
        let (status, _, body) = get(&state, "GET", "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("waiting for the Namespace list"), "{body}");
        // The list arrived: ready.
        w.namespaces_arrived();
        assert_eq!(get(&state, "GET", "/readyz").await.0, StatusCode::OK);
        // Or it never did, and the sync timeout passed: ready all the same.
        let w = Arc::new(crate::server::cluster_view::ClusterWatch::new());
        let state = crate::server::state::test_state_watching("", Some(w.clone()));
        w.await_namespaces(true);
        assert_eq!(
            get(&state, "GET", "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        w.await_namespaces(false);
        assert_eq!(get(&state, "GET", "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn readiness_says_why_it_is_not_ready() {
        let state = test_state("");
        assert_eq!(get(&state, "GET", "/healthz").await.0, StatusCode::OK);
        assert_eq!(get(&state, "GET", "/readyz").await.2, "ready\n");
        let unready = |flag: &AtomicBool, set: bool| flag.store(set, Ordering::SeqCst);
        for (flag, ready_when, why) in [
            (&state.ready, true, "starting or shutting down"),
            (
                &state.cluster_ready,
                true,
                "cluster's CSIDriver and StorageClass lists",
            ),
        ] {
            unready(flag, !ready_when);
            let (status, _, body) = get(&state, "GET", "/readyz").await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{why}");
            assert!(body.contains(why), "{why}: {body}");
            // Live all the same: the kubelet must not restart a draining or waiting webhook.
            assert_eq!(get(&state, "GET", "/healthz").await.0, StatusCode::OK);
            // The alerts see what the probe sees.
            let metrics = get(&state, "GET", "/metrics").await.2;
            assert!(metrics.contains("\nevi_ready 0\n"), "{why}: {metrics}");
            unready(flag, ready_when);
        }
        assert_eq!(get(&state, "GET", "/readyz").await.0, StatusCode::OK);
        let metrics = get(&state, "GET", "/metrics").await.2;
        assert!(metrics.contains("\nevi_ready 1\n"), "{metrics}");
        let build = format!(
            "\nevi_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            env!("EVI_COMMIT")
        );
        assert!(metrics.contains(&build), "{metrics}");
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_and_other_paths_json_errors() {
        let state = test_state("");
        let (status, kind, body) = get(&state, "GET", "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        for (method, path, code) in [
            ("POST", "/metrics", StatusCode::METHOD_NOT_ALLOWED),
            ("GET", "/mutate", StatusCode::NOT_FOUND),
        ] {
            let (status, kind, body) = get(&state, method, path).await;
            assert_eq!(
                (status, kind.as_str()),
                (code, "application/json"),
                "{method} {path}"
            );
            let error: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(
                error["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("GET /healthz, /readyz, /metrics")),
                "{body}"
            );
        }
        let text = state.metrics.encode(true);
        assert!(
            text.contains("evi_http_responses_total{port=\"admin\",code=\"405\"} 1"),
            "{text}"
        );
    }
}
