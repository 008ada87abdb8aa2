//! The configuration compiled into admission policies the API server runs itself
//! (`ephemeral-volume-injector policies`; admissionregistration.k8s.io/v1, Kubernetes 1.36+):
//! a MutatingAdmissionPolicy that adds the volumes, mounts, variables and status annotation a
//! pod's annotations ask for by profile name, and a ValidatingAdmissionPolicy that refuses what
//! the webhook would refuse, each with its binding. docs/policies.md says what they do and
//! what only the webhook does.
//!
//! What the compiler serves: profiles named by an annotation's whole value and the key=value
//! form (inline.rs) under the configuration's `policy`, with mount path, readOnly, subPath and
//! variables, into every container. A configuration that needs more (rules, overrides, audit,
//! `onError: warn`, a profile's own container list or `size: request`) is refused, naming the
//! key, rather than compiled into policies that would treat pods otherwise; what no policy can
//! do (the cluster checks, the webhook's warnings, the JSON form) is said as a note.

mod cel;
mod inline;

use serde_json::{Value, json};

use crate::{
    config::{Config, Mode, OnError},
    decision::Decision,
    engine::bounds::MAX_VOLUMES,
    engine::{PodLocation, decide},
    pod::PodView,
    volume::{InitTargets, Profile, VolumeKind},
    workload::{TemplateAt, WORKLOADS},
};

use self::{
    cel::{list, quote, typed},
    inline::Form,
};

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
    if !cfg.rules.is_empty() {
        no("rules".into(), "rules are the webhook's only for now");
    }
    if !cfg.overrides.is_empty() {
        no(
            "policyOverrides".into(),
            "per-namespace policies are the webhook's only for now",
        );
    }
    if cfg.mode == Mode::Audit {
        no("mode".into(), "audit is the webhook's only for now");
    }
    for p in &cfg.audited_profiles {
        no(
            format!("profiles.{p}.mode"),
            "audit is the webhook's only for now",
        );
    }
    if cfg.on_error == OnError::Warn {
        no(
            "onError".into(),
            "warn: a policy refuses or admits, it cannot admit a pod without its volumes and say so",
        );
    }
    for (name, p) in &cfg.profiles {
        if p.mount.containers.is_some() {
            no(
                format!("profiles.{name}.containers"),
                "the policies mount into every container for now",
            );
        }
        if !matches!(p.mount.init_containers, None | Some(InitTargets::None)) {
            no(
                format!("profiles.{name}.initContainers"),
                "the policies mount into every container for now",
            );
        }
        if p.size_from_request {
            no(
                format!("profiles.{name}.size"),
                "request: a size from the containers' requests is the webhook's only for now",
            );
        }
    }
    out
}

/// What the webhook does that the policies cannot, for this configuration.
fn notes(cfg: &Config) -> Vec<String> {
    let mut notes =
        vec![if cfg.policy.allow_inline {
        "the JSON form, and in the key=value form a profile with fields (profile=<name>,…), \
         containers, initContainers and size=request, are read by the webhook only: the policies \
         refuse them, naming the annotation"
    } else {
        "a profile with fields (profile=<name>,…) is read by the webhook only: the policies \
         refuse it, naming the annotation"
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
    let text = json!({"metadata": {"annotations": {&key: profile}},
                      "spec": {"containers": [{"name": "c"}]}})
    .to_string();
    let pod: PodView = serde_json::from_str(&text).ok()?;
    let at = PodLocation {
        namespace: "default",
        pointer: "",
    };
    match decide(cfg, None, &pod, at) {
        Decision::Denied(d) => {
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
/// and `<name>-cronjobs`).
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
    let at = Cel::new(cfg, &served);
    let selector = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                 "operator": "NotIn", "values": exclude}]});
    let constraints = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                 "operations": ["CREATE"], "resources": ["pods"]}]});
    let conditions = json!([{"name": "asks", "expression": format!(
        "has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith({}))",
        quote(&at.prefix))}]);
    let mut variables = at.variables(&refused);
    if let Value::Array(v) = &mut variables {
        v.push(json!({"name": "missing", "expression": at.missing()}));
    }
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
        validating_spec(&at, &refused),
    ) {
        spec.extend(checks);
    }
    let binding = |kind: &str, policy: &str| {
        let mut spec = json!({"policyName": policy,
                              "matchResources": {"namespaceSelector": selector}});
        if kind.starts_with("Validating") {
            spec["validationActions"] = json!(["Deny"]);
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
            &at.prefix,
            at_template,
            &validating_spec(&at, &refused),
        );
        bindings.push(binding(
            "ValidatingAdmissionPolicyBinding",
            policy["metadata"]["name"].as_str().unwrap_or(name),
        ));
        documents.push(policy);
    }
    documents.extend(bindings);
    Ok(Policies {
        documents,
        notes: notes(cfg),
    })
}

/// The validating policy's variables and validations, for a pod at `object`.
fn validating_spec(at: &Cel, refused: &[(&str, String)]) -> Value {
    json!({"variables": at.variables(refused), "validations": at.validations()})
}

/// The refusal of a pod controller whose pod template would be refused, with the pod's
/// message (as `/validate` does): the pod's checks read from the template, at its creation
/// and at an update that changes the template. One policy per place a template is kept, so
/// that each is type-checked against the kinds that keep it there.
fn workload_policy(name: &str, prefix: &str, at_template: TemplateAt, pod: &Value) -> Value {
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
                {"name": "template-asks-for-volumes", "expression": format!(
                    "{} && {root}.metadata.annotations.exists(k, k.startsWith({}))",
                    has_path(&format!("{root}.metadata.annotations")), quote(prefix))},
            ],
            "failurePolicy": "Fail",
            "variables": rooted["variables"],
            "validations": rooted["validations"],
        }
    })
}

/// The CEL of one configuration's policies.
struct Cel<'c> {
    /// The annotation prefix with its `/`.
    prefix: String,
    /// The profiles the policies serve, by name.
    served: &'c [(&'c str, &'c Profile)],
    /// Every profile's name (a value that names another is not a profile).
    profiles: Vec<&'c str>,
    /// `policy.maxVolumesPerPod`.
    max_volumes: Option<usize>,
    /// The key=value form, when `policy.allowInline` lets pods write it.
    inline: Option<Form<'c>>,
    /// `policy.allowInline`'s origin, for the refusal of the inline forms.
    policy_origin: &'c str,
}

impl<'c> Cel<'c> {
    fn new(cfg: &'c Config, served: &'c [(&'c str, &'c Profile)]) -> Self {
        Cel {
            prefix: format!("{}/", cfg.prefix),
            served,
            profiles: cfg.profiles.keys().map(String::as_str).collect(),
            max_volumes: cfg.policy.max_volumes_per_pod,
            inline: cfg.policy.allow_inline.then(|| Form::new(&cfg.policy)),
            policy_origin: &cfg.policy.origin,
        }
    }

    /// The volume name of annotation key `k` (a CEL expression).
    fn volume(&self) -> String {
        format!("k.substring({})", self.prefix.chars().count())
    }

    /// `by_form` for an annotation in key=value form, else `pick(p)` for the profile its
    /// value names (a chain of conditionals, the last served profile without a test: only
    /// annotations without problems are asked).
    fn per_annotation(
        &self,
        by_form: impl Fn(&Form<'c>) -> String,
        pick: impl Fn(&Profile) -> String,
    ) -> String {
        let profile = match self.served.split_last() {
            None => None,
            Some(((_, last), rest)) => {
                let mut out = String::new();
                for (name, p) in rest {
                    out.push_str(&format!(
                        "variables.values[k] == {} ? {} : ",
                        quote(name),
                        pick(p)
                    ));
                }
                out.push_str(&pick(last));
                Some(out)
            }
        };
        match (&self.inline, profile) {
            (Some(form), Some(profile)) => {
                format!("(k in variables.kv ? {} : {profile})", by_form(form))
            }
            (Some(form), None) => by_form(form),
            (None, Some(profile)) => format!("({profile})"),
            (None, None) => "null".to_owned(),
        }
    }

    /// A map from each annotation without problems to `value` of it (a CEL expression of `k`).
    fn each_known(value: String) -> String {
        format!("variables.known.transformMapEntry(i, k, {{k: {value}}})")
    }

    /// What the pod holds already that an asked-for volume would clash with, as the webhook
    /// says it: another asked-for volume at its mount path, a mount of the pod's own at it,
    /// a volume of the pod's own by its name with other settings.
    fn clashes(&self) -> String {
        let n = self.volume();
        let path = "variables.paths[k]";
        // Compared as the webhook compares paths: `//`, `/./` and a trailing `/` aside.
        let own = inline::normalized("m.mountPath");
        let same = self.per_annotation(
            |f| f.same(),
            |p| {
                let source: Value =
                    serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
                let field = kind_field(p.compiled.kind);
                let mut checks = vec![format!("has(v.{field})")];
                cel::same_as(&format!("v.{field}"), &source, &mut checks);
                format!("({})", checks.join(" && "))
            },
        );
        format!(
            "variables.known.map(k, \
             variables.known.exists(j, j < k && variables.paths[j] == {path}) \
             ? 'volume \"' + {n} + '\" (annotation ' + k + '): it is mounted at ' + {path} + ', as the volume of annotation ' \
               + variables.known.filter(j, j < k && variables.paths[j] == {path})[0] + ' is' \
             : object.spec.containers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, {own} == {path} && m.name != {n})) \
             ? 'volume \"' + {n} + '\" (annotation ' + k + '): a container already mounts another volume at ' + {path} \
             : has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {n} && !({same})) \
             ? 'volume \"' + {n} + '\" (annotation ' + k + '): the pod already has a volume with this name, with other settings; rename one of them' \
             : '').filter(m, m != '')"
        )
    }

    /// Whether annotation `k`'s volume name is a DNS-1123 label (the pod's volumes' names).
    fn good_name(&self) -> String {
        let n = self.volume();
        format!("{n}.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && {n}.size() <= 63")
    }

    /// The refusal for more annotations than a pod may have, counted before anything is read
    /// (as the webhook counts: its own bound first, then the policy's), else `''`.
    fn over(&self) -> String {
        let prefix = &self.prefix;
        let mut out = format!(
            "variables.asked.size() > {MAX_VOLUMES} ? string(variables.asked.size()) + \
             ' annotations {prefix}*: a pod may ask for at most {MAX_VOLUMES} volumes' : "
        );
        if let Some(max) = self.max_volumes {
            out.push_str(&format!(
                "variables.asked.size() > {max} ? string(variables.asked.size()) + \
                 ' volumes requested, policy.maxVolumesPerPod allows {max}' : "
            ));
        }
        out.push_str("''");
        out
    }

    /// Every problem of annotation `k` whose trimmed value is `v`: a CEL list of messages
    /// (the webhook's refusals of a profile by name passed as `refused`).
    fn problems(&self, refused: &[(&str, String)]) -> String {
        let n = self.volume();
        let known = list(self.profiles.iter().copied());
        let defined = self.profiles.join(", ");
        let origin = self.policy_origin;
        let inline = match &self.inline {
            Some(form) => format!(
                "v.startsWith('{{') ? ['the JSON form is read by the webhook only: write key=value pairs or a profile name'] \
                 : v.contains('=') ? ({})",
                form.problems()
            ),
            None => format!(
                "v.contains('profile=') ? ['the admission policies read a profile name only: profile=<name> with fields needs the webhook'] \
                 : v.contains('=') || v.startsWith('{{') ? ['{origin}.allowInline is false: name one of the cluster\\'s profiles']"
            ),
        };
        let mut by_name = format!(
            "!(v in {known}) ? ['profile \"' + v + '\" is not defined (defined: {defined})']"
        );
        for (profile, why) in refused {
            by_name.push_str(&format!(" : v == {} ? [{}]", quote(profile), quote(why)));
        }
        format!(
            "(!({}) ? ['volume name \"' + {n} + '\" must be a DNS-1123 label'] : [])\n + ({inline}\n : {by_name} : [])",
            self.good_name()
        )
    }

    fn variables(&self, refused: &[(&str, String)]) -> Value {
        let mut out = vec![
            json!({"name": "annotations",
                   "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"}),
            json!({"name": "asked",
                   "expression": format!("variables.annotations.filter(k, k.startsWith({})).sort()",
                                         quote(&self.prefix))}),
            json!({"name": "over", "expression": self.over()}),
            // Past a count nothing more is read: the pod is refused for it alone.
            json!({"name": "values",
                   "expression": "variables.over != '' ? {} : \
                                  variables.asked.transformMapEntry(i, k, {k: variables.annotations[k].trim()})"}),
        ];
        if self.inline.is_some() {
            for (name, expression) in Form::variables() {
                out.push(json!({"name": name, "expression": expression}));
            }
        }
        let mount_path = |p: &Profile| quote(p.mount.mount_path.as_deref().unwrap_or(""));
        let read_only =
            |p: &Profile| quote(&p.mount.read_only.map(|r| r.to_string()).unwrap_or_default());
        let sub_path = |p: &Profile| quote(p.mount.sub_path.as_deref().unwrap_or(""));
        let env = |p: &Profile| list(p.mount.env.iter().flatten().map(String::as_str));
        out.extend([
            json!({"name": "problems",
                   "expression": format!("variables.values.transformMap(k, v, {})", self.problems(refused))}),
            json!({"name": "known",
                   "expression": "variables.asked.filter(k, k in variables.problems && variables.problems[k].size() == 0)"}),
            json!({"name": "paths",
                   "expression": Self::each_known(self.per_annotation(|_| Form::path(), mount_path))}),
            json!({"name": "readOnly",
                   "expression": Self::each_known(self.per_annotation(|_| Form::read_only(), read_only))}),
            json!({"name": "subPaths",
                   "expression": Self::each_known(self.per_annotation(|_| Form::sub_path(), sub_path))}),
            json!({"name": "env",
                   "expression": Self::each_known(self.per_annotation(|_| Form::env(), env))}),
            json!({"name": "clashes", "expression": self.clashes()}),
            // Nothing is added to a pod with a problem: the validating policy refuses it,
            // naming the annotation, instead of the API server refusing an invalid pod.
            json!({"name": "served",
                   "expression": "variables.over == '' && variables.known.size() == variables.asked.size() \
                                  && variables.clashes.size() == 0 ? variables.known : []"}),
            json!({"name": "wanted",
                   "expression": format!(
                       "variables.served.filter(k, \
                        !(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {})))",
                       self.volume())}),
        ]);
        Value::Array(out)
    }

    /// Whether the pod lacks anything the annotations ask for: a volume, a container's mount
    /// or variable.
    fn missing(&self) -> String {
        let n = self.volume();
        format!(
            "variables.wanted.size() > 0 || object.spec.containers.exists(c, variables.served.exists(k, \
             !(has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == {n})) \
             || variables.env[k].exists(e, !(has(c.env) && c.env.exists(x, x.name == e)))))"
        )
    }

    /// The JSON Patch: the volumes, each container's mounts and variables, and the status
    /// annotation; nothing for a pod that has them all.
    fn patch(&self, cfg: &Config) -> String {
        let n = self.volume();
        let volume = self.per_annotation(
            |form| form.volume(&n),
            |p| {
                let source: Value =
                    serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
                let field = kind_field(p.compiled.kind);
                format!(
                    "Object.spec.volumes{{name: {n}, {field}: {}}}",
                    typed(&format!("Object.spec.volumes.{field}"), &source)
                )
            },
        );
        let mount = format!(
            "Object.spec.containers.volumeMounts{{name: {n}, mountPath: variables.paths[k], \
             ?readOnly: variables.readOnly[k] == '' ? optional.none() : optional.of(variables.readOnly[k] == 'true'), \
             ?subPath: variables.subPaths[k] == '' ? optional.none() : optional.of(variables.subPaths[k])}}"
        );
        let mut out = format!(
            "(variables.wanted.size() == 0 || has(object.spec.volumes) ? [] : \
             [JSONPatch{{op: 'add', path: '/spec/volumes', value: []}}])\n\
             + variables.wanted.map(k, JSONPatch{{op: 'add', path: '/spec/volumes/-', value: {volume}}})\n\
             + object.spec.containers.transformList(i, c,\n  \
             (variables.served.size() == 0 || has(c.volumeMounts) ? [] : \
             [JSONPatch{{op: 'add', path: '/spec/containers/' + string(i) + '/volumeMounts', value: []}}])\n  \
             + variables.served.filter(k, !(has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == {n})))\
             .map(k, JSONPatch{{op: 'add', path: '/spec/containers/' + string(i) + '/volumeMounts/-', value: {mount}}})\
             ).flatten()"
        );
        if self.inline.is_some()
            || self
                .served
                .iter()
                .any(|(_, p)| p.mount.env.as_ref().is_some_and(|e| !e.is_empty()))
        {
            let added = "variables.served.map(k, variables.env[k].filter(e, !(has(c.env) && c.env.exists(x, x.name == e)))\
                 .map(e, JSONPatch{op: 'add', path: '/spec/containers/' + string(i) + '/env/-', \
                 value: Object.spec.containers.env{name: e, value: variables.paths[k]}})).flatten()";
            out.push_str(&format!(
                "\n+ object.spec.containers.transformList(i, c,\n  ({added}.size() == 0 || has(c.env) ? [] : \
                 [JSONPatch{{op: 'add', path: '/spec/containers/' + string(i) + '/env', value: []}}])\n  + {added}).flatten()"
            ));
        }
        // The status annotation names every volume the annotations ask for, written whenever
        // anything else is (as the webhook writes it), so never on a pod that has it all.
        format!(
            "{out}\n+ (variables.missing ? [JSONPatch{{op: 'add', path: {}, \
             value: variables.served.map(k, {n}).join(',')}}] : [])",
            quote(&format!(
                "/metadata/annotations/{}",
                pointer_token(&cfg.injected.key)
            ))
        )
    }

    /// The refusal, every problem of every annotation in one message (as the webhook says
    /// them all at once), each annotation's problems after its name.
    fn validations(&self) -> Value {
        let problems = "variables.over != '' ? [variables.over] : \
             variables.asked.filter(k, k in variables.problems && variables.problems[k].size() > 0)\
             .map(k, 'annotation ' + k + ': ' + variables.problems[k].join('; ')) + variables.clashes";
        json!([{
            "expression": format!("({problems}).size() == 0"),
            "messageExpression": format!("({problems}).join('; ')"),
            "reason": "Invalid",
        }])
    }
}

/// The volume's field for a source of this kind.
fn kind_field(kind: VolumeKind) -> &'static str {
    match kind {
        VolumeKind::EmptyDir => "emptyDir",
        VolumeKind::Csi => "csi",
        VolumeKind::Ephemeral => "ephemeral",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILES: &str = "profiles:
  scratch: {mountPath: /scratch, env: [TMPDIR], ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], storageClassName: gp3, resources: {requests: {storage: 200Gi}}}}}}
  shm: {mountPath: /dev/shm, emptyDir: {medium: Memory, sizeLimit: 1Gi}}
  secrets: {mountPath: /mnt/secrets, readOnly: true, csi: {driver: secrets-store.csi.k8s.io, volumeAttributes: {secretProviderClass: db}}}
  bare: {emptyDir: {sizeLimit: 5Gi}}
";

    fn compiled(policy: &str) -> Policies {
        let cfg = Config::parse(&format!(
            "{PROFILES}policy:\n  allowInline: false\n{policy}"
        ))
        .unwrap();
        compile(&cfg, "evi", &["kube-system".to_owned()]).unwrap()
    }

    fn text(p: &Policies, kind: &str) -> String {
        let doc = p.documents.iter().find(|d| d["kind"] == kind).unwrap();
        doc.to_string()
    }

    #[test]
    fn a_configuration_the_policies_would_serve_otherwise_is_refused_naming_each_key() {
        let cfg = Config::parse(
            "onError: warn\nprofiles:\n  r: {mountPath: /r, size: request, emptyDir: {}}\n  \
             c: {mountPath: /c, containers: [main], emptyDir: {}}\n\
             rules:\n  - name: x\n    volumes:\n      v: {profile: c}\n",
        )
        .unwrap();
        let keys: Vec<String> = compile(&cfg, "evi", &[])
            .unwrap_err()
            .into_iter()
            .map(|u| u.key)
            .collect();
        assert_eq!(
            keys,
            [
                "rules",
                "onError",
                "profiles.c.containers",
                "profiles.r.size"
            ]
        );
    }

    #[test]
    fn every_profile_is_added_as_its_typed_source_with_its_mount_and_variables() {
        let p = compiled("");
        let kinds: Vec<&str> = p
            .documents
            .iter()
            .map(|d| d["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "MutatingAdmissionPolicy",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding"
            ]
        );
        let m = text(&p, "MutatingAdmissionPolicy");
        for part in [
            "Object.spec.volumes.ephemeral.volumeClaimTemplate.spec{accessModes: ['ReadWriteOnce']",
            "emptyDir: Object.spec.volumes.emptyDir{medium: 'Memory', sizeLimit: '1Gi'}",
            "csi: Object.spec.volumes.csi{driver: 'secrets-store.csi.k8s.io', volumeAttributes: {'secretProviderClass': 'db'}}",
            "variables.values[k] == 'secrets' ? '/mnt/secrets'",
            "variables.values[k] == 'secrets' ? 'true'",
            "?readOnly: variables.readOnly[k] == '' ? optional.none()",
            "['TMPDIR']",
            "/metadata/annotations/injector.ephemeral-volumes.io~1injected",
            "\"reinvocationPolicy\":\"IfNeeded\"",
        ] {
            assert!(m.contains(part), "{part} not in {m}");
        }
        let binding = text(&p, "ValidatingAdmissionPolicyBinding");
        assert!(
            binding.contains("\"validationActions\":[\"Deny\"]") && binding.contains("kube-system"),
            "{binding}"
        );
    }

    #[test]
    fn a_profile_the_webhook_refuses_by_name_is_refused_with_its_reason_and_never_added() {
        // A profile without a mount path needs profile=bare,mountPath=… (the webhook's only).
        let p = compiled("  maxVolumesPerPod: 3\n");
        let m = p.documents[0]["spec"]["mutations"].to_string();
        assert!(!m.contains("'bare'") && !m.contains("5Gi"), "{m}");
        let v = text(&p, "ValidatingAdmissionPolicy");
        assert!(
            v.contains(
                "v == 'bare' ? ['mountPath is required: profile \\\"bare\\\" does not set one']"
            ),
            "{v}"
        );
        assert!(v.contains("policy.maxVolumesPerPod allows 3"), "{v}");
    }

    #[test]
    fn the_key_value_form_is_read_only_when_the_policy_allows_it() {
        let closed = compiled("");
        let v = text(&closed, "ValidatingAdmissionPolicy");
        assert!(v.contains("policy.allowInline is false"), "{v}");
        assert!(!v.contains("variables.kv"), "{v}");
        let cfg = Config::parse(PROFILES).unwrap();
        let open = compile(&cfg, "evi", &[]).unwrap();
        let v = text(&open, "ValidatingAdmissionPolicy");
        assert!(
            !v.contains("policy.allowInline is false") && v.contains("variables.kv"),
            "{v}"
        );
    }

    #[test]
    fn every_field_of_the_key_value_form_is_checked_and_every_limit_compiled() {
        let cfg = Config::parse(&format!(
            "{PROFILES}policy:\n  types: [emptyDir, ephemeral]\n  csiDrivers: [secrets-store.csi.k8s.io]\n  \
             storageClasses: [gp3]\n  maxSize: {{emptyDir: 100Gi, memory: 8Gi, ephemeral: 1Ti}}\n  \
             requireSizeLimit: true\n  defaultSizeLimit: 4Gi\n"
        ))
        .unwrap();
        let p = compile(&cfg, "evi", &[]).unwrap();
        let v = text(&p, "ValidatingAdmissionPolicy");
        for part in [
            // each field: read, checked, or refused as the webhook's only
            "is not a key=value pair",
            "unknown field",
            "is given twice",
            "is empty",
            "attr. needs a key",
            "needs the JSON form",
            "in ['profile', 'containers', 'initContainers']",
            "size=request: the admission policies",
            "no volume source",
            "is not one of emptyDir, csi, ephemeral",
            "does not apply to type=",
            "isQuantity(variables.kv[k]['size'])",
            "is zero, which is no limit at all",
            "is not one of \\\"\\\" (node disk), Memory, HugePages",
            "is not one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod",
            "is not a DNS-1123 subdomain",
            "type=ephemeral needs size=",
            "type=csi needs driver=",
            "mountPath is required",
            "must be an absolute path",
            "is the container\\\\'s root",
            "readOnly must be true or false",
            "must be a relative path",
            "is not a valid environment variable name",
            // each limit, with its value
            "is not allowed by policy.types (emptyDir, ephemeral)",
            "in ['secrets-store.csi.k8s.io']",
            "is not in policy.csiDrivers (secrets-store.csi.k8s.io)",
            "is not in policy.storageClasses (gp3)",
            "a storage class is required by policy.storageClasses (gp3)",
            "isGreaterThan(quantity('100Gi'))",
            "exceeds policy.maxSize.memory (8Gi)",
            "exceeds policy.maxSize.ephemeral (1Ti)",
        ] {
            assert!(v.contains(part), "{part} not in {v}");
        }
        let m = text(&p, "MutatingAdmissionPolicy");
        for part in [
            "?medium: variables.kv[k][?'medium']",
            ": optional.of('4Gi'))",
            "?fsType: variables.kv[k][?'fsType']",
            "f.startsWith('attr.') && f.size() > 5, {f.substring(5): x}",
            "accessModes: [variables.kv[k][?'accessMode'].orValue('ReadWriteOnce')]",
            "?storageClassName: variables.kv[k][?'storageClass']",
            "split('/').filter(x, x != '' && x != '.').join('/')",
            "variables.kv[k]['env'].split(';')",
        ] {
            assert!(m.contains(part), "{part} not in {m}");
        }
        // Without limits, none is compiled.
        let free = text(
            &compile(&Config::parse(PROFILES).unwrap(), "evi", &[]).unwrap(),
            "ValidatingAdmissionPolicy",
        );
        for part in ["maxSize", "storageClasses", "csiDrivers", "4Gi"] {
            assert!(!free.contains(part), "{part} in {free}");
        }
    }

    #[test]
    fn a_workload_is_checked_at_its_template_with_the_pods_checks() {
        let p = compiled("");
        let policy = |name: &str| {
            p.documents
                .iter()
                .find(|d| d["metadata"]["name"] == name && d["kind"] == "ValidatingAdmissionPolicy")
                .unwrap()
        };
        let pod = policy("evi");
        for (name, root, kinds) in [
            ("evi-workloads", "object.spec.template", 6),
            ("evi-cronjobs", "object.spec.jobTemplate.spec.template", 1),
        ] {
            let w = policy(name);
            assert_eq!(
                w["spec"]["matchConstraints"]["resourceRules"]
                    .as_array()
                    .unwrap()
                    .len(),
                kinds
            );
            let checks = w["spec"]["validations"].to_string();
            assert_eq!(
                checks,
                pod["spec"]["validations"]
                    .to_string()
                    .replace("object.", &format!("{root}."))
            );
            let variables = w["spec"]["variables"].to_string();
            assert!(
                !variables
                    .replace(&format!("{root}."), "")
                    .contains("object."),
                "{variables}"
            );
            assert!(
                w["spec"]["matchConditions"]
                    .to_string()
                    .contains("request.operation == 'CREATE'")
            );
            let bound = p.documents.iter().any(|d| {
                d["kind"] == "ValidatingAdmissionPolicyBinding" && d["spec"]["policyName"] == name
            });
            assert!(bound, "{name} has no binding");
        }
    }
}
