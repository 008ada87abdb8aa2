//! The offline preview (`mutate`): what kubectl would send — a Pod, a workload, a stream of
//! manifests — read, and each object's pod (template) through the same engine.

use serde_json::Value;

use crate::{
    cluster::KnownCluster,
    config::Config,
    decision::Decision,
    engine::{self, PodLocation},
    pod::PodView,
    workload::{TemplateAt, WORKLOADS, template_path},
};

/// An input `mutate` cannot preview.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Not YAML or JSON.
    #[error("cannot parse the input as YAML or JSON: document {document}: {source}")]
    Parse {
        /// Which document of the stream, from 1.
        document: usize,
        /// The parser's error.
        #[source]
        source: yaml_serde::Error,
    },
    /// Nested too deep to read.
    #[error("cannot parse the input: {0}")]
    TooDeep(#[from] crate::yaml_nesting::TooDeep),
    /// Not a Kubernetes object.
    #[error("the input is not a Kubernetes object (no apiVersion/kind)")]
    NotAnObject,
    #[error("kind {0:?} is not supported: give a Pod or one of {kinds}", kinds = supported_kinds())]
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
    #[error("the pod at {path} cannot be read: {source}")]
    BadPod {
        /// Where it is.
        path: String,
        /// What is wrong.
        #[source]
        source: serde_json::Error,
    },
    /// The patch does not apply to the object.
    #[error("the patch does not apply: {0}")]
    Apply(#[from] json_patch::PatchError),
    /// The patch cannot be written as RFC 6902 operations.
    #[error("the patch cannot be encoded: {0}")]
    Encode(#[source] serde_json::Error),
}

/// Where an object keeps its pod: a supported kind's place, else `spec.template` when it holds a
/// pod template (`spec.template.spec`), as custom workloads do (Argo Rollouts, Knative,
/// OpenKruise): previewed as a Deployment's would be.
pub fn template_path_of(object: &Value) -> Option<&'static str> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    template_path(kind).or_else(|| {
        object
            .pointer("/spec/template/spec")
            .is_some_and(Value::is_object)
            .then(|| TemplateAt::Spec.pointer())
    })
}

/// The supported workload kinds, for messages: `Job, CronJob, … or ReplicationController`.
fn supported_kinds() -> String {
    let kinds: Vec<&str> = WORKLOADS.iter().map(|w| w.kind).collect();
    match kinds.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Parses what kubectl takes: one object, a multi-document YAML stream (empty documents
/// skipped) or a `kind: List`, in order.
pub fn parse_objects(text: &str) -> Result<Vec<Value>, WorkloadError> {
    use serde::Deserialize as _;
    crate::yaml_nesting::check(text)?;
    let mut out = Vec::new();
    for (i, doc) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|source| WorkloadError::Parse {
            document: i + 1,
            source,
        })?;
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
    cluster: Option<KnownCluster<'_>>,
    object: &Value,
    namespace: Option<&str>,
) -> Result<Preview, WorkloadError> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let base =
        template_path_of(object).ok_or_else(|| WorkloadError::UnsupportedKind(kind.to_owned()))?;
    let pod_json = object
        .pointer(base)
        .ok_or_else(|| WorkloadError::NoTemplate {
            kind: kind.to_owned(),
            path: base.to_owned(),
        })?;
    let bad_pod = |source| WorkloadError::BadPod {
        path: if base.is_empty() { "/" } else { base }.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec(pod_json).map_err(bad_pod)?;
    let pod: PodView = serde_json::from_slice(&bytes).map_err(bad_pod)?;
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
        let ops = serde_json::to_value(patch).map_err(WorkloadError::Encode)?;
        let patch: json_patch::Patch =
            serde_json::from_value(ops).map_err(WorkloadError::Encode)?;
        json_patch::patch(&mut mutated, &patch)?;
    }
    Ok(Preview { decision, mutated })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_which_document_and_where_the_pod_is_and_keep_their_cause() {
        let err = parse_objects("kind: Pod\n---\nkind: [unclosed\n").unwrap_err();
        assert!(
            matches!(err, WorkloadError::Parse { document: 2, .. }),
            "{err:?}"
        );
        assert!(std::error::Error::source(&err).is_some());

        let job = serde_json::json!({"apiVersion": "batch/v1", "kind": "Job",
            "spec": {"template": {"spec": {"containers": "not a list"}}}});
        let err = preview(&Config::default(), None, &job, None).err().unwrap();
        match &err {
            WorkloadError::BadPod { path, source } => {
                assert_eq!(path, "/spec/template");
                assert!(source.is_data(), "{source}");
            }
            other => panic!("{other:?}"),
        }
        let err = preview(
            &Config::default(),
            None,
            &serde_json::json!({"kind": "JobSet"}),
            None,
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "kind \"JobSet\" is not supported: give a Pod or one of Job, CronJob, Deployment, \
             StatefulSet, DaemonSet, ReplicaSet or ReplicationController"
        );
    }
}
