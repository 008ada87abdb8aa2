//! The offline preview (`mutate`): a Pod or a workload's pod template through the same engine.

use k8s_openapi::{
    Resource,
    api::{
        apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet},
        batch::v1::{CronJob, Job},
        core::v1::ReplicationController,
    },
};
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
    #[error("cannot parse the input as YAML or JSON: document {document}: {source}")]
    Parse {
        /// Which document of the stream, from 1.
        document: usize,
        /// The parser's error.
        #[source]
        source: yaml_serde::Error,
    },
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

/// Where a pod controller keeps its pod template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateAt {
    /// `spec.template`: Job, Deployment, StatefulSet, DaemonSet, ReplicaSet,
    /// ReplicationController.
    Spec,
    /// `spec.jobTemplate.spec.template`: CronJob.
    JobSpec,
}

impl TemplateAt {
    /// The template's JSON pointer in the object (where a workload's patch would point).
    pub const fn pointer(self) -> &'static str {
        match self {
            Self::Spec => "/spec/template",
            Self::JobSpec => "/spec/jobTemplate/spec/template",
        }
    }

    /// The template as a CEL path (the chart's matchConditions).
    pub const fn cel(self) -> &'static str {
        match self {
            Self::Spec => "object.spec.template",
            Self::JobSpec => "object.spec.jobTemplate.spec.template",
        }
    }
}

/// A pod controller the workload webhook (`POST /validate`) checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadKind {
    /// Its API group (`""` for the core group).
    pub group: &'static str,
    /// The API version k8s-openapi knows it at.
    pub version: &'static str,
    /// Its kind.
    pub kind: &'static str,
    /// Its resource (the plural a webhook rule names).
    pub resource: &'static str,
    /// Where it keeps its pod template.
    pub template: TemplateAt,
}

const fn workload<K: Resource>(template: TemplateAt) -> WorkloadKind {
    WorkloadKind {
        group: K::GROUP,
        version: K::VERSION,
        kind: K::KIND,
        resource: K::URL_PATH_SEGMENT,
        template,
    }
}

/// The pod controllers the workload webhook checks, from k8s-openapi's types: the one list
/// the engine, the CLI, the metrics and (through `print-workloads`) the chart's test read.
pub const WORKLOADS: [WorkloadKind; 7] = [
    workload::<Job>(TemplateAt::Spec),
    workload::<CronJob>(TemplateAt::JobSpec),
    workload::<Deployment>(TemplateAt::Spec),
    workload::<StatefulSet>(TemplateAt::Spec),
    workload::<DaemonSet>(TemplateAt::Spec),
    workload::<ReplicaSet>(TemplateAt::Spec),
    workload::<ReplicationController>(TemplateAt::Spec),
];

/// The workload of this API group and kind, if the webhook checks it.
pub fn find(group: &str, kind: &str) -> Option<&'static WorkloadKind> {
    WORKLOADS
        .iter()
        .find(|w| w.group == group && w.kind == kind)
}

/// Where each supported kind keeps its pod (`""` for a Pod), by kind alone: a manifest's
/// `apiVersion` is not needed to preview it.
pub fn template_path(kind: &str) -> Option<&'static str> {
    if kind == "Pod" {
        return Some("");
    }
    WORKLOADS
        .iter()
        .find(|w| w.kind == kind)
        .map(|w| w.template.pointer())
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

/// The table as JSON (`print-workloads`, a hidden command): what the chart's webhook rules
/// and CEL paths are checked against.
pub fn table_json() -> Value {
    WORKLOADS
        .iter()
        .map(|w| {
            serde_json::json!({
                "group": w.group,
                "version": w.version,
                "kind": w.kind,
                "resource": w.resource,
                "templatePointer": w.template.pointer(),
                "templateCel": w.template.cel(),
            })
        })
        .collect()
}

/// Parses what kubectl takes: one object, a multi-document YAML stream (empty documents
/// skipped) or a `kind: List`, in order.
pub fn parse_objects(text: &str) -> Result<Vec<Value>, WorkloadError> {
    use serde::Deserialize as _;
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
    cluster: Option<Known<'_>>,
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
