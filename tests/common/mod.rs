//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde_json::{Value, json};

/// An AdmissionReview as the API server sends it for a pod CREATE.
pub fn review_for(pod: &Value, namespace: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"].clone(),
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:job-controller",
                "uid": "2f4a1c0e-8d9b-4e7f-a6c5-b4d3e2f1a0b9",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// A pod controller of `kind` (`Job`, `CronJob`, `Deployment`, …) whose pod template is `pod`
/// (its name and namespace dropped, as in a template), Nextflow-shaped for a Job.
pub fn workload_of(kind: &str, pod: &Value) -> Value {
    let mut template = pod.clone();
    if let Some(meta) = template["metadata"].as_object_mut() {
        meta.remove("name");
        meta.remove("namespace");
        meta.remove("generateName");
    }
    let w = evi::workload::WORKLOADS
        .iter()
        .find(|w| w.kind == kind)
        .unwrap_or_else(|| panic!("{kind} is not in evi::workload::WORKLOADS"));
    // What each kind's API validation asks for beside its template.
    let spec = match kind {
        "Job" => json!({"backoffLimit": 0}),
        "CronJob" => {
            json!({"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"backoffLimit": 0}}})
        }
        "ReplicationController" => json!({"replicas": 1}),
        _ => json!({"replicas": 1, "selector": {"matchLabels": {"app": "x"}}}),
    };
    let api_version = match w.group {
        "" => w.version.to_owned(),
        group => format!("{group}/{}", w.version),
    };
    let mut object = json!({"apiVersion": api_version, "kind": kind,
           "metadata": {"name": "nf-task-1", "labels": {"nextflow.io/app": "nextflow"}},
           "spec": spec});
    // The template where the table says this kind keeps it.
    let mut at = &mut object;
    for key in w.template.pointer().split('/').skip(1) {
        at = &mut at[key];
    }
    *at = template;
    object
}

/// The bytes of a pod CREATE review of golden case `case`'s pod in namespace `nf`, as the
/// benchmarks send it: the object defaulted, with the client's `managedFields` (the field
/// manager runs before admission), in the job controller's name.
pub fn pod_review_bytes(case: &str) -> Vec<u8> {
    serde_json::to_vec(&review_for(
        &read_input(case),
        "nf",
        "705ab4f5-6393-11e8-b7cc-42010a800002",
    ))
    .unwrap()
}

/// An AdmissionReview as the API server sends it to the workload webhook for `operation`
/// (`CREATE`, or `UPDATE` with `old`) of `object`.
pub fn workload_review(object: &Value, old: Option<&Value>, namespace: &str) -> Value {
    let kind = object["kind"].as_str().unwrap_or_default();
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5c1e2d3f-0000-4000-8000-000000000002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"].clone(),
            "namespace": namespace,
            "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
            "userInfo": {"username": "nextflow", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

/// Checks the response envelope and applies its patch (if any) to `pod`.
pub fn apply_response(request: &Value, response: &Value, pod: &Value) -> Value {
    assert_eq!(response["apiVersion"], request["apiVersion"]);
    assert_eq!(response["kind"], request["kind"]);
    let r = &response["response"];
    assert_eq!(r["uid"], request["request"]["uid"]);
    let has_patch = r.get("patch").is_some();
    assert_eq!(
        has_patch,
        r.get("patchType").is_some(),
        "patch and patchType go together: {r}"
    );
    let mut out = pod.clone();
    if has_patch {
        assert_eq!(r["patchType"], "JSONPatch");
        let bytes = STANDARD
            .decode(r["patch"].as_str().expect("patch is a base64 string"))
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        json_patch::patch(&mut out, &patch).unwrap();
    }
    out
}

/// The configuration most tests and the benches run with (`tests/data/config.yaml`).
pub fn test_config() -> evi::config::Config {
    evi::config::Config::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/config.yaml"
    )))
    .unwrap()
}

/// The input object of a golden case (`tests/golden/<case>/input.yaml` or `input.json`).
pub fn read_input(case: &str) -> Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case);
    let text = std::fs::read_to_string(dir.join("input.yaml"))
        .or_else(|_| std::fs::read_to_string(dir.join("input.json")))
        .unwrap_or_else(|e| panic!("{}: no input: {e}", dir.display()));
    yaml_serde::from_str(&text).unwrap()
}

/// The line src/server/webhook.rs logs for a mutated pod, with realistic values (the log
/// line benches: benches/log_line.rs and benches/allocations.rs).
pub fn decision_line() {
    use std::hint::black_box;
    tracing::info!(
        uid = %black_box("0d5c7a1e-8b7e-4d3c-9a51-3c1f2e4b5a60"),
        namespace = %black_box("nextflow"),
        pod = %black_box("nf-3f2a9c0e5b7d41a6-x7k2p"),
        owner = %black_box("Job/nf-3f2a9c0e5b7d41a6"),
        dry_run = black_box(false),
        volumes = %black_box("scratch,ramdisk"),
        "mutated"
    );
}

/// The JSON log formats the webhook has had, each writing into `io::sink`: the one it writes
/// (src/server/json_log.rs) and `tracing-subscriber`'s, with the options it was used with.
pub fn log_formats() -> [(&'static str, tracing::Dispatch); 2] {
    let library = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .finish();
    let ours = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .event_format(evi::server::json_log::JsonLines)
        .finish();
    [
        ("tracing-subscriber json", tracing::Dispatch::new(library)),
        ("json_log", tracing::Dispatch::new(ours)),
    ]
}
