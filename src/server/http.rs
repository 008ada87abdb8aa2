//! The HTTP pieces both ports share: JSON errors naming what a port serves, and every response
//! counted by port and status code.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use super::{metrics::CodeLabel, state::AppState};

/// The shared end of both routers: JSON 404 and 405 naming what the port serves, and every
/// response counted by port and status code.
pub(super) fn with_json_errors(
    router: Router<Arc<AppState>>,
    state: Arc<AppState>,
    port: &'static str,
    serves: &'static str,
) -> Router {
    router
        .method_not_allowed_fallback(move || async move {
            json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method not allowed: {serves}"),
            )
        })
        .fallback(move || async move {
            json_error(StatusCode::NOT_FOUND, &format!("not found: {serves}"))
        })
        .layer(axum::middleware::from_fn_with_state(
            (state.clone(), port),
            count_responses,
        ))
        .with_state(state)
}

/// Every response is counted by port and status code.
async fn count_responses(
    State((state, port)): State<(Arc<AppState>, &'static str)>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(req).await;
    state
        .metrics
        .responses
        .get_or_create(&CodeLabel {
            port,
            code: response.status().as_u16(),
        })
        .inc();
    response
}

/// Every error response is JSON with a reason: `{"error": "..."}`.
pub(super) fn json_error(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
