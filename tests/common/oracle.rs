//! The review handler's oracle, shared by the `review` fuzz target (fuzz/, through `#[path]`)
//! and its stable replay in tests/fuzz_smoke.rs: every response is a valid AdmissionReview,
//! and every returned patch applies to the request's object.

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde_json::Value;

pub fn check_review(cfg: &evi::config::Config, data: &[u8]) {
    let Ok(handled) = evi::review::handle(cfg, None, evi::review::Endpoint::Mutate, data) else {
        return;
    };
    let response: Value = serde_json::from_slice(&handled.body).expect("response is JSON");
    let r = &response["response"];
    assert!(r["allowed"].is_boolean());
    assert_eq!(r.get("patch").is_some(), r.get("patchType").is_some());
    if let Some(patch) = r.get("patch").and_then(Value::as_str) {
        let bytes = STANDARD.decode(patch).expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("RFC 6902");
        // serde skips ignored fields without checking their escapes; a body only that lenient
        // parse accepts cannot be replayed here (the API server never sends one).
        let Ok(request) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let mut object = request["request"]["object"].clone();
        json_patch::patch(&mut object, &patch).expect("the patch applies to the object");
    }
}
