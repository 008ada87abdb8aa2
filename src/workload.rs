//! The pod controllers the workload webhook checks, and where each keeps its pod template:
//! one table, read by the review, the CLI's preview, the metrics and the chart's tests.

use k8s_openapi::{
    Resource,
    api::{
        apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet},
        batch::v1::{CronJob, Job},
        core::v1::ReplicationController,
    },
};
use serde_json::Value;

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
