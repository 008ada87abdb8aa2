//! The offline preview (`mutate`): a Pod or a workload's pod template through the same engine.

use serde_json::Value;

use crate::{
    cluster::Known,
    config::Config,
    decision::Decision,
    engine::{self, PodLocation},
    pod::PodView,
};

/// An input `mutate` cannot preview.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Not YAML or JSON.
    #[error("cannot parse the input as YAML or JSON: {0}")]
    Parse(String),
    /// Not a Kubernetes object.
    #[error("the input is not a Kubernetes object (no apiVersion/kind)")]
    NotAnObject,
    #[error(
        "kind {0:?} is not supported: give a Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet or ReplicationController"
    )]
    /// A kind without a pod template the webhook knows.
    UnsupportedKind(String),
    /// A workload without its pod template.
    #[error("{kind} has no pod template at {path}")]
    NoTemplate {
        /// The kind.
        kind: String,
        /// Where the template should be.
        path: String,
    },
    /// A pod (template) that is not a pod.
    #[error("the pod at {path} cannot be read: {message}")]
    BadPod {
        /// Where it is.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The patch does not apply to the object.
    #[error("the patch does not apply: {0}")]
    Apply(String),
}

/// The pod controllers the workload webhook (`POST /validate`) checks: API group, kind, and the
/// JSON pointer to the pod template each keeps.
pub const WORKLOADS: [(&str, &str, &str); 7] = [
    ("batch", "Job", "/spec/template"),
    ("batch", "CronJob", "/spec/jobTemplate/spec/template"),
    ("apps", "Deployment", "/spec/template"),
    ("apps", "StatefulSet", "/spec/template"),
    ("apps", "DaemonSet", "/spec/template"),
    ("apps", "ReplicaSet", "/spec/template"),
    ("", "ReplicationController", "/spec/template"),
];

/// Where a workload of this API group and kind keeps its pod template.
pub fn template_pointer(group: &str, kind: &str) -> Option<&'static str> {
    WORKLOADS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map(|(_, _, pointer)| *pointer)
}

/// Where each supported kind keeps its pod (`""` for a Pod), by kind alone: a manifest's
/// `apiVersion` is not needed to preview it.
pub fn template_path(kind: &str) -> Option<&'static str> {
    if kind == "Pod" {
        return Some("");
    }
    WORKLOADS
        .iter()
        .find(|(_, k, _)| *k == kind)
        .map(|(_, _, pointer)| *pointer)
}

/// Parses what kubectl takes: one object, a multi-document YAML stream (empty documents
/// skipped) or a `kind: List`, in order.
pub fn parse_objects(text: &str) -> Result<Vec<Value>, WorkloadError> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc)
            .map_err(|e| WorkloadError::Parse(format!("document {}: {e}", i + 1)))?;
        match value {
            Value::Null => {}
            v if v.get("kind").and_then(Value::as_str) == Some("List") => match v.get("items") {
                Some(Value::Array(items)) => out.extend(items.iter().cloned()),
                _ => return Err(WorkloadError::NotAnObject),
            },
            v if v.get("kind").and_then(Value::as_str).is_some() => out.push(v),
            _ => return Err(WorkloadError::NotAnObject),
        }
    }
    if out.is_empty() {
        return Err(WorkloadError::NotAnObject);
    }
    Ok(out)
}

/// What the engine decides for an object's pod, and the object with the patch applied.
pub struct Preview {
    /// The decision for the object's pod (template).
    pub decision: Decision,
    /// The object as the patch leaves it (unchanged without one).
    pub mutated: Value,
}

/// Runs the engine on the object's pod and applies the patch to the whole object.
pub fn preview(
    cfg: &Config,
    cluster: Option<Known<'_>>,
    object: &Value,
    namespace: Option<&str>,
) -> Result<Preview, WorkloadError> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let base =
        template_path(kind).ok_or_else(|| WorkloadError::UnsupportedKind(kind.to_owned()))?;
    let pod_json = object
        .pointer(base)
        .ok_or_else(|| WorkloadError::NoTemplate {
            kind: kind.to_owned(),
            path: base.to_owned(),
        })?;
    let bytes = serde_json::to_vec(pod_json).map_err(|e| WorkloadError::BadPod {
        path: base.to_owned(),
        message: e.to_string(),
    })?;
    let pod: PodView = serde_json::from_slice(&bytes).map_err(|e| WorkloadError::BadPod {
        path: if base.is_empty() {
            "/".into()
        } else {
            base.to_owned()
        },
        message: e.to_string(),
    })?;
    let ns = namespace
        .or_else(|| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
        })
        .unwrap_or("default");
    let decision = engine::decide(
        cfg,
        cluster,
        &pod,
        PodLocation {
            namespace: ns,
            pointer: base,
        },
    );
    let mut mutated = object.clone();
    if let Some(patch) = decision.patch() {
        let ops = serde_json::to_value(patch).map_err(|e| WorkloadError::Apply(e.to_string()))?;
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(|e| WorkloadError::Apply(e.to_string()))?;
        json_patch::patch(&mut mutated, &patch).map_err(|e| WorkloadError::Apply(e.to_string()))?;
    }
    Ok(Preview { decision, mutated })
}
