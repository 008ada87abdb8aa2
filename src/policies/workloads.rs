//! The pod controllers (Job, CronJob, Deployment, …) refused at creation when their pods would
//! be, as the webhook's `/validate` does: the pod's validating policy read at the template.

use serde_json::{Value, json};

use crate::workload::{TemplateAt, WORKLOADS};

/// The refusal of a pod controller whose pod template would be refused, with the pod's
/// message (as `/validate` does): the pod's checks read from the template, at its creation
/// and at an update that changes the template. One policy per place a template is kept, so
/// that each is type-checked against the kinds that keep it there.
pub fn workload_policy(
    name: &str,
    at_template: TemplateAt,
    pod: &Value,
    asks: impl Fn(&str, &str) -> String,
) -> Value {
    let root = at_template.cel();
    let (suffix, old) = match at_template {
        TemplateAt::Spec => ("workloads", "oldObject.spec.template"),
        TemplateAt::JobSpec => ("cronjobs", "oldObject.spec.jobTemplate.spec.template"),
    };
    let rules: Vec<Value> = WORKLOADS
        .iter()
        .filter(|w| w.template == at_template)
        .map(|w| {
            json!({"apiGroups": [w.group], "apiVersions": [w.version],
                   "operations": ["CREATE", "UPDATE"], "resources": [w.resource]})
        })
        .collect();
    let rooted = pod.to_string().replace("object.", &format!("{root}."));
    let rooted: Value = serde_json::from_str(&rooted).unwrap_or(Value::Null);
    let has_path = |path: &str| {
        let mut out = Vec::new();
        let mut at = String::new();
        for part in path.split('.') {
            if !at.is_empty() {
                at.push('.');
            }
            at.push_str(part);
            if at.contains('.') {
                out.push(format!("has({at})"));
            }
        }
        out.join(" && ")
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": format!("{name}-{suffix}")},
        "spec": {
            "matchConstraints": {"resourceRules": rules},
            "matchConditions": [
                // An update that leaves the template as it was is not checked (as the chart's
                // workload webhook is not sent it).
                {"name": "creates-or-changes-the-template", "expression": format!(
                    "request.operation == 'CREATE' || !({}) || {root} != {old}", has_path(old))},
                {"name": "template-asks-for-volumes", "expression": asks(
                    &format!("{root}.metadata"), &has_path(&format!("{root}.metadata")))},
            ],
            "failurePolicy": "Fail",
            "variables": rooted["variables"],
            "validations": rooted["validations"],
        }
    })
}
