//! The configuration compiled into admission policies the API server runs itself
//! (`ephemeral-volume-injector policies`; admissionregistration.k8s.io/v1, Kubernetes 1.36+):
//! a MutatingAdmissionPolicy that adds the volumes, mounts, variables and status annotation a
//! pod's annotations ask for, ValidatingAdmissionPolicies that refuse what the webhook would
//! refuse (of a pod, of a pod controller's template) and one that warns of a pod past the
//! bounds, each with its binding. docs/policies.md says what they do and what only the
//! webhook does.
//!
//! What the compiler serves: profiles named by an annotation's whole value or with fields
//! (`profile=<name>,size=…`), and the key=value form (inline.rs) under the configuration's
//! `policy`, with mount path, readOnly, subPath, variables, `size=request` and the containers
//! and init containers each goes to; the volumes of the `rules` that match (rules.rs); under `onError:
//! warn` a refusal is a warning and the error annotation; `policyOverrides` by the request's
//! namespace (overrides.rs); `mode: audit` of the whole configuration as warnings. A
//! configuration that needs more (audit of some profiles or rules) is refused, naming the
//! key, rather than compiled into policies that
//! would treat pods otherwise; what no policy can do (the cluster checks, the webhook's
//! warnings, the JSON form) is said as a note.

mod cel;
mod inline;
mod overrides;
mod pod;
mod requests;
mod rules;
mod sources;
mod workloads;

use serde_json::{Value, json};

use crate::{
    config::{Config, Mode, OnError},
    decision::Decision,
    engine::{PodLocation, decide},
    pod::PodView,
    volume::{InitTargets, Profile},
    workload::TemplateAt,
};

use self::{pod::Cel, workloads::workload_policy};

/// A key of the configuration the policies would give another meaning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {why}")]
pub struct Unsupported {
    /// Where, as a path into the configuration (`policy.allowInline`, `profiles.shm.size`).
    pub key: String,
    /// Why the policies cannot serve it.
    pub why: String,
}

/// The compiled policies and what they leave to the webhook.
#[derive(Debug)]
pub struct Policies {
    /// The objects, in the order to apply them: the policies, then their bindings.
    pub documents: Vec<Value>,
    /// What the policies do not do that the webhook does, for this configuration.
    pub notes: Vec<String>,
}

impl Policies {
    /// The policies to run beside the webhook before switching to them: nothing is added (the
    /// mutating policy and its binding are left out: the webhook adds), and every refusal is
    /// a warning and an audit annotation instead (`validationActions: [Warn, Audit]`), so that
    /// a team sees where the policies would refuse what the webhook admits, or the other way.
    pub fn audit(self) -> Policies {
        self.without_mutation(
            "--audit: nothing is added and nothing refused: every refusal is a warning and an \
             audit annotation (validationActions Warn, Audit), for comparing with the webhook",
        )
    }

    /// The policies without the mutating policy and its binding, each refusal a warning and an
    /// audit annotation; `note` says so.
    fn without_mutation(mut self, note: &str) -> Policies {
        self.documents.retain(|d| {
            !matches!(
                d["kind"].as_str(),
                Some("MutatingAdmissionPolicy" | "MutatingAdmissionPolicyBinding")
            )
        });
        for d in &mut self.documents {
            if d["kind"] == "ValidatingAdmissionPolicyBinding"
                && d["spec"]["validationActions"] == json!(["Deny"])
            {
                d["spec"]["validationActions"] = json!(["Warn", "Audit"]);
            }
        }
        self.notes.push(note.to_owned());
        self
    }

    /// Every object `compile` may write under `name`, by kind, whatever the configuration: what
    /// `--apply` prunes and `--delete` removes.
    pub fn names(name: &str) -> [(&'static str, Vec<String>); 4] {
        let validating = ["", "-workloads", "-cronjobs", "-bounds"]
            .map(|suffix| format!("{name}{suffix}"))
            .to_vec();
        [
            ("MutatingAdmissionPolicy", vec![name.to_owned()]),
            ("ValidatingAdmissionPolicy", validating.clone()),
            ("MutatingAdmissionPolicyBinding", vec![name.to_owned()]),
            ("ValidatingAdmissionPolicyBinding", validating),
        ]
    }
}

/// The name of the status annotation's pointer in a JSON Patch (RFC 6901 escaping).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The configuration's keys the policies would serve otherwise, each named.
fn unsupported(cfg: &Config) -> Vec<Unsupported> {
    let mut out = Vec::new();
    let mut no = |key: String, why: &str| {
        out.push(Unsupported {
            key,
            why: why.to_owned(),
        })
    };
    // Audit all or nothing: a policy binding warns or refuses, for every volume of a pod.
    let audits = |p: &&String| (cfg.mode == Mode::Audit) != cfg.audited_profiles.contains(*p);
    for p in cfg.profiles.keys().filter(audits) {
        no(
            format!("profiles.{p}.mode"),
            "the policies audit everything (mode: audit at the top, no profile or rule \
             enforced) or nothing",
        );
    }
    out.extend(rules::unsupported(cfg));
    out
}

/// What the webhook does that the policies cannot, for this configuration.
fn notes(cfg: &Config) -> Vec<String> {
    let mut notes = vec![if cfg.policy.allow_inline {
        "the JSON form is read by the webhook only: the policies refuse it, naming the annotation"
    } else {
        "every form the configuration allows is served (the JSON form is not allowed: \
         policy.allowInline is false)"
    }
    .to_owned()];
    notes.extend([
        "the webhook's warnings (a near-miss annotation key, a variable the pod already sets, a \
         memory emptyDir without a size) have no policy equivalent: the policies say nothing"
            .to_owned(),
        "a volume of the pod's own by an asked-for name is compared on the fields the profile \
         or annotation sets only: one that differs in other fields only is kept and mounted, \
         where the webhook, comparing the whole source, may refuse it"
            .to_owned(),
    ]);
    if cfg.cluster_checks != crate::cluster::Mode::Off {
        notes.push(
            "clusterChecks: a policy cannot read CSIDriver or StorageClass objects: no cluster \
             checks"
                .to_owned(),
        );
    }
    notes
}

/// The webhook's refusal of a pod that asks for `profile` alone, if it refuses it whatever the
/// pod: what follows `annotation <key>: ` in its message (the profile against the policy).
fn refusal_of(cfg: &Config, profile: &str) -> Option<String> {
    let key = format!("{}/v", cfg.prefix);
    // A pod with the containers the profile names (whether a pod has them is the policies'
    // check, pod by pod).
    let mount = cfg.profiles.get(profile).map(|p| &p.mount);
    // With a request each (a profile's size may be the containers' request).
    let named = |names: Option<&Vec<String>>| -> Vec<Value> {
        let names = names.map_or_else(|| vec!["c".to_owned()], Clone::clone);
        names
            .into_iter()
            .map(|n| json!({"name": n, "resources": {"requests": {"ephemeral-storage": "1"}}}))
            .collect()
    };
    let init = match mount.and_then(|m| m.init_containers.as_ref()) {
        Some(InitTargets::Named(names)) => Some(names),
        _ => None,
    };
    let text = json!({"metadata": {"annotations": {&key: profile}},
                      "spec": {"containers": named(mount.and_then(|m| m.containers.as_ref())),
                               "initContainers": named(init)}})
    .to_string();
    let pod: PodView = serde_json::from_str(&text).ok()?;
    let at = PodLocation {
        namespace: "default",
        pointer: "",
    };
    // A profile by name is trusted: its refusal does not depend on the namespace's policy
    // (decided without the overrides, which would wait for the namespace's labels), nor on the
    // rules (none adds to this pod), nor on the mode (enforced: what enforcing would refuse).
    let mut cfg = cfg.clone();
    cfg.overrides.clear();
    cfg.rules.clear();
    cfg.mode = Mode::Enforce;
    cfg.audited_profiles.clear();
    // Under `onError: warn` the webhook admits such a pod, saying the same refusal.
    match decide(&cfg, None, &pod, at) {
        Decision::Denied(d) | Decision::AdmittedDespiteError { denial: d, .. } => {
            let head = format!("annotation {key}: ");
            Some(
                d.message
                    .strip_prefix(&head)
                    .unwrap_or(&d.message)
                    .to_owned(),
            )
        }
        _ => None,
    }
}

/// Compiles the configuration; `name` names the objects (the workload policies `<name>-workloads`
/// and `<name>-cronjobs`). With `policyOverrides`, one set of objects still: each expression that
/// reads a limit chooses the namespace's policy (overrides.rs).
pub fn compile(cfg: &Config, name: &str, exclude: &[String]) -> Result<Policies, Vec<Unsupported>> {
    let refused = unsupported(cfg);
    if !refused.is_empty() {
        return Err(refused);
    }
    let (served, refused): (Vec<_>, Vec<_>) = cfg
        .profiles
        .iter()
        .map(|(n, p)| (n.as_str(), p, refusal_of(cfg, n)))
        .partition(|(_, _, refusal)| refusal.is_none());
    let served: Vec<(&str, &Profile)> = served.into_iter().map(|(n, p, _)| (n, p)).collect();
    let refused: Vec<(&str, String)> = refused
        .into_iter()
        .filter_map(|(n, _, r)| r.map(|r| (n, r)))
        .collect();
    let variants: Vec<(&str, Vec<Value>)> = overrides::variants(cfg)
        .into_iter()
        .map(|(chosen, policy)| {
            let at = Cel::new(cfg, policy, &served);
            (chosen, documents(cfg, &at, name, exclude, &refused))
        })
        .collect();
    let documents = overrides::merge(cfg, variants);
    let too_long = too_long(cfg, &documents);
    if !too_long.is_empty() {
        return Err(too_long);
    }
    let compiled = Policies {
        documents,
        notes: notes(cfg),
    };
    Ok(match cfg.mode {
        Mode::Enforce => compiled,
        Mode::Audit => compiled.without_mutation(
            "mode: audit: nothing is added and nothing refused; what would be added or \
             refused is a warning and an audit annotation (validationActions Warn, Audit); \
             unlike the webhook, a pod past the 64 volume annotations a pod may have is \
             warned, not refused",
        ),
    })
}

/// The longest CEL expression the API server compiles, in code points: past it, it refuses the
/// whole object ("expression code point size exceeds limit").
const MAX_EXPRESSION: usize = 100_000;

/// Each expression of `documents` the API server would refuse as too long, named by object and
/// path, with what made it long: the overrides (each expression that reads a limit is there
/// once per policy) or, without them, the profiles.
fn too_long(cfg: &Config, documents: &[Value]) -> Vec<Unsupported> {
    let (key, grown) = if cfg.overrides.is_empty() {
        (
            "profiles",
            format!(
                "each profile has its checks in it ({}): fewer profiles, or the webhook",
                cfg.profiles.len()
            ),
        )
    } else {
        (
            "policyOverrides",
            format!(
                "each expression that reads a limit is there once per override and once for \
                 `policy` ({} times): fewer overrides, or the webhook for the namespaces that need them",
                cfg.overrides.len() + 1
            ),
        )
    };
    let mut out = Vec::new();
    for d in documents {
        let mut all = Vec::new();
        expressions(&d["spec"], "spec", &mut all);
        for (at, size) in all.into_iter().filter(|(_, size)| *size > MAX_EXPRESSION) {
            out.push(Unsupported {
                key: key.to_owned(),
                why: format!(
                    "{} {} {at}: a CEL expression of {size} characters, past the {MAX_EXPRESSION} \
                     the API server compiles (it would refuse the object); {grown}",
                    text_of(&d["kind"]),
                    text_of(&d["metadata"]["name"]),
                ),
            });
        }
    }
    out
}

/// Each CEL expression under `v` (a field whose name ends in `xpression`): where, as a path
/// from `path` (a list item by its index and name), and its length in code points.
fn expressions(v: &Value, path: &str, out: &mut Vec<(String, usize)>) {
    match v {
        Value::Object(fields) => {
            for (k, v) in fields {
                let at = format!("{path}.{k}");
                match v {
                    Value::String(e) if k.ends_with("xpression") => {
                        out.push((at, e.chars().count()))
                    }
                    _ => expressions(v, &at, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let at = match v.get("name").and_then(Value::as_str) {
                    Some(n) => format!("{path}[{i}] ({n})"),
                    None => format!("{path}[{i}]"),
                };
                expressions(v, &at, out);
            }
        }
        _ => {}
    }
}

fn text_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// The objects for one policy, bound in every namespace but `exclude`.
fn documents(
    cfg: &Config,
    at: &Cel,
    name: &str,
    exclude: &[String],
    refused: &[(&str, String)],
) -> Vec<Value> {
    let selector = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                 "operator": "NotIn", "values": exclude}]});
    let (mutating, validating) = pod_policies(cfg, name, at, refused);
    let binding = |kind: &str, policy: &str| {
        let mut spec = json!({"policyName": policy,
                              "matchResources": {"namespaceSelector": selector}});
        if kind.starts_with("Validating") {
            // Under `onError: warn` a refusal is a warning: the pod is admitted without its
            // volumes, the mutating policy writing the error annotation.
            spec["validationActions"] = match cfg.on_error {
                OnError::Deny => json!(["Deny"]),
                OnError::Warn => json!(["Warn"]),
            };
        }
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
               "metadata": {"name": policy}, "spec": spec})
    };
    let mut documents = vec![mutating, validating];
    let mut bindings = vec![
        binding("MutatingAdmissionPolicyBinding", name),
        binding("ValidatingAdmissionPolicyBinding", name),
    ];
    for at_template in [TemplateAt::Spec, TemplateAt::JobSpec] {
        let policy = workload_policy(
            name,
            at_template,
            &validating_spec(at, refused),
            |meta, guard| at.asks(meta, guard),
        );
        bindings.push(binding(
            "ValidatingAdmissionPolicyBinding",
            policy["metadata"]["name"].as_str().unwrap_or(name),
        ));
        documents.push(policy);
    }
    documents.push(too_many_annotations(name, &at.prefix, !at.rules.is_empty()));
    let mut warn = binding(
        "ValidatingAdmissionPolicyBinding",
        &format!("{name}-bounds"),
    );
    warn["spec"]["validationActions"] = json!(["Warn"]);
    bindings.push(warn);
    documents.extend(bindings);
    documents
}

/// The pod's mutating and validating policies.
fn pod_policies(cfg: &Config, name: &str, at: &Cel, refused: &[(&str, String)]) -> (Value, Value) {
    let constraints = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                 "operations": ["CREATE"], "resources": ["pods"]}]});
    let conditions = json!([{"name": "asks", "expression": at.asks("object.metadata", "")}]);
    let variables = at.variables(refused);
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"matchConstraints": constraints, "matchConditions": conditions,
                 "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
                 "variables": variables,
                 "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": at.patch(cfg)}}]}
    });
    let mut validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"matchConstraints": constraints, "matchConditions": conditions,
                 "failurePolicy": "Fail"}
    });
    if let (Some(spec), Value::Object(checks)) = (
        validating["spec"].as_object_mut(),
        validating_spec(at, refused),
    ) {
        spec.extend(checks);
    }
    (mutating, validating)
}

/// The most annotations of a pod (or a pod template) the policies read. The API server's CEL
/// iterates a map of annotations in time that grows with the square of their number (48,000
/// cost it ~4 s, 6,000 nothing measurable); past this bound the policies do not look at them,
/// so that no pod, asking or not, costs the API server more than a few milliseconds in them.
pub const MAX_ANNOTATIONS: usize = 4096;

/// A warning for a pod with more annotations than the policies read: it is admitted as it
/// is (a pod that asks for nothing is never refused), and told that none is served.
fn too_many_annotations(name: &str, prefix: &str, rules: bool) -> Value {
    let rules = if rules {
        ", nor any volume of a rule"
    } else {
        ""
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": format!("{name}-bounds")},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": [{"name": "too-many-annotations", "expression": format!(
                "has(object.metadata.annotations) && size(object.metadata.annotations) > {MAX_ANNOTATIONS}")}],
            "failurePolicy": "Fail",
            "validations": [{"expression": "false", "messageExpression": format!(
                "'the pod has ' + string(size(object.metadata.annotations)) + ' annotations, more than the \
                 {MAX_ANNOTATIONS} the admission policies read: no {prefix}* annotation of it is served{rules}'")}],
        }
    })
}

/// The validating policy's variables and validations, for a pod at `object`.
fn validating_spec(at: &Cel, refused: &[(&str, String)]) -> Value {
    json!({"variables": at.variables(refused), "validations": at.validations()})
}

#[cfg(test)]
mod tests;
