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
//! `policy`, with mount path, readOnly, subPath and variables, into every container. A configuration that needs more (rules, overrides, audit,
//! `onError: warn`, a profile's own container list or `size: request`) is refused, naming the
//! key, rather than compiled into policies that would treat pods otherwise; what no policy can
//! do (the cluster checks, the webhook's warnings, the JSON form) is said as a note.

mod cel;
mod inline;
mod sources;
mod workloads;

use serde_json::{Value, json};

use crate::{
    config::{Config, Mode, OnError},
    decision::Decision,
    echo::MESSAGE_LIMIT,
    engine::bounds::MAX_VOLUMES,
    engine::{PodLocation, decide},
    pod::PodView,
    validate::MAX_PROBLEMS,
    volume::{InitTargets, Medium, Profile, VolumeKind},
    workload::TemplateAt,
};

use self::{
    cel::{list, quote},
    inline::Form,
    workloads::workload_policy,
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

impl Policies {
    /// The policies to run beside the webhook before switching to them: nothing is added (the
    /// mutating policy and its binding are left out: the webhook adds), and every refusal is
    /// a warning and an audit annotation instead (`validationActions: [Warn, Audit]`), so that
    /// a team sees where the policies would refuse what the webhook admits, or the other way.
    pub fn audit(mut self) -> Policies {
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
        self.notes.push(
            "--audit: nothing is added and nothing refused: every refusal is a warning and an \
             audit annotation (validationActions Warn, Audit), for comparing with the webhook"
                .to_owned(),
        );
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
        "the JSON form, and in the key=value form containers, initContainers and size=request, \
         are read by the webhook only: the policies refuse them, naming the annotation"
    } else {
        "in the key=value form containers, initContainers and size=request are read by the \
         webhook only: the policies refuse them, naming the annotation"
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
    let (mutating, validating) = pod_policies(cfg, name, &at, &refused);
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
    documents.push(too_many_annotations(name, &at.prefix));
    let mut warn = binding(
        "ValidatingAdmissionPolicyBinding",
        &format!("{name}-bounds"),
    );
    warn["spec"]["validationActions"] = json!(["Warn"]);
    bindings.push(warn);
    documents.extend(bindings);
    Ok(Policies {
        documents,
        notes: notes(cfg),
    })
}

/// The pod's mutating and validating policies.
fn pod_policies(cfg: &Config, name: &str, at: &Cel, refused: &[(&str, String)]) -> (Value, Value) {
    let constraints = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                 "operations": ["CREATE"], "resources": ["pods"]}]});
    let conditions = json!([{"name": "asks", "expression": format!(
        "has(object.metadata.annotations) && size(object.metadata.annotations) <= {MAX_ANNOTATIONS} \
         && object.metadata.annotations.exists(k, k.startsWith({}))",
        quote(&at.prefix))}]);
    let mut variables = at.variables(refused);
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
fn too_many_annotations(name: &str, prefix: &str) -> Value {
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
                 {MAX_ANNOTATIONS} the admission policies read: no {prefix}* annotation of it is served'")}],
        }
    })
}

/// The validating policy's variables and validations, for a pod at `object`.
fn validating_spec(at: &Cel, refused: &[(&str, String)]) -> Value {
    json!({"variables": at.variables(refused), "validations": at.validations()})
}

/// The CEL of one configuration's policies.
struct Cel<'c> {
    /// The annotation prefix with its `/`.
    prefix: String,
    /// The profiles the policies serve by name alone.
    served: &'c [(&'c str, &'c Profile)],
    /// Every profile (one without a mount path is served with `profile=<name>,mountPath=…`).
    all: Vec<(&'c str, &'c Profile)>,
    /// The policy's default emptyDir size, when it requires one.
    default_size: Option<&'c str>,
    /// Every profile's name (a value that names another is not a profile).
    profiles: Vec<&'c str>,
    /// `policy.maxVolumesPerPod`.
    max_volumes: Option<usize>,
    /// The key=value form (without `policy.allowInline`, for `profile=<name>,…` only).
    form: Form<'c>,
    /// `policy.allowInline`: without it the key=value form is read for `profile=<name>,…` only.
    allow_inline: bool,
    /// `policy.allowInline`'s origin, for the refusal of the inline forms.
    policy_origin: &'c str,
}

impl<'c> Cel<'c> {
    fn new(cfg: &'c Config, served: &'c [(&'c str, &'c Profile)]) -> Self {
        Cel {
            prefix: format!("{}/", cfg.prefix),
            served,
            profiles: cfg.profiles.keys().map(String::as_str).collect(),
            all: cfg.profiles.iter().map(|(n, p)| (n.as_str(), p)).collect(),
            default_size: cfg
                .policy
                .require_size_limit
                .then_some(cfg.policy.default_size_limit_text.as_str()),
            max_volumes: cfg.policy.max_volumes_per_pod,
            form: Form::new(&cfg.policy),
            allow_inline: cfg.policy.allow_inline,
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
        pick: impl Fn(&Profile, bool) -> String,
    ) -> String {
        // A chain of conditionals on `of`, the last profile without a test.
        let chain = |of: &str, profiles: &[(&str, &Profile)], fields: bool| {
            let ((_, last), rest) = profiles.split_last()?;
            let mut out = String::new();
            for (name, p) in rest {
                out.push_str(&format!("{of} == {} ? {} : ", quote(name), pick(p, fields)));
            }
            out.push_str(&pick(last, fields));
            Some(out)
        };
        let by_name = chain("variables.values[k]", self.served, false);
        let with_fields = chain("variables.kv[k]['profile']", &self.all, true);
        let inline = match &with_fields {
            Some(w) => format!(
                "('profile' in variables.kv[k] ? ({w}) : {})",
                by_form(&self.form)
            ),
            None => by_form(&self.form),
        };
        match by_name {
            Some(by_name) => format!("(k in variables.kv ? {inline} : {by_name})"),
            None => inline,
        }
    }

    /// A map from each annotation without problems to `value` of it (a CEL expression of `k`).
    fn each_known(value: String) -> String {
        format!("variables.known.transformMapEntry(i, k, {{k: {value}}})")
    }

    /// A profile's source as the webhook writes it: with the policy's default size when the
    /// policy requires one and the profile's emptyDir has none (not HugePages).
    fn source_of(&self, p: &Profile) -> Value {
        let mut source: Value = serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
        if let (Some(default), VolumeKind::EmptyDir) = (self.default_size, p.compiled.kind)
            && p.compiled.medium != Medium::HugePages
            && source.get("sizeLimit").is_none()
        {
            source["sizeLimit"] = json!(default);
        }
        source
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
            |p, fields| sources::same(&self.source_of(p), p.compiled.kind, fields),
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
        let json = if self.allow_inline {
            "the JSON form is read by the webhook only: write key=value pairs or a profile name"
                .to_owned()
        } else {
            format!("{origin}.allowInline is false: name one of the cluster\\'s profiles")
        };
        let inline = format!(
            "v.startsWith('{{') ? ['{json}'] \
                 : v.contains('=') && v.size() > {max} ? ['the value is ' + string(v.size()) + ' characters long; \
                 the admission policies read key=value values of at most {max} (a profile holds a longer one)'] \
                 : v.contains('=') && v.split(',').size() > {pairs} ? ['the value has ' + string(v.split(',').size()) + \
                 ' comma-separated parts; the admission policies read key=value values of at most {pairs} (a profile holds more)'] \
                 : v.contains('=') ? ({})",
            self.form.problems(&self.all),
            max = inline::MAX_VALUE,
            pairs = inline::MAX_PAIRS,
        );
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
        for (name, expression) in Form::variables() {
            out.push(json!({"name": name, "expression": expression}));
        }
        // The profile's, or with `profile=<name>,…` the annotation's where it sets one.
        let mount_path = |p: &Profile, fields: bool| {
            let path = quote(p.mount.mount_path.as_deref().unwrap_or(""));
            if fields { Form::path_or(&path) } else { path }
        };
        let read_only = |p: &Profile, fields: bool| {
            let ro = quote(&p.mount.read_only.map(|r| r.to_string()).unwrap_or_default());
            if fields {
                Form::field_or("readOnly", &ro)
            } else {
                ro
            }
        };
        let sub_path = |p: &Profile, fields: bool| {
            let sub = quote(p.mount.sub_path.as_deref().unwrap_or(""));
            if fields {
                Form::field_or("subPath", &sub)
            } else {
                sub
            }
        };
        let env = |p: &Profile, fields: bool| {
            let env = list(p.mount.env.iter().flatten().map(String::as_str));
            if fields { Form::env_or(&env) } else { env }
        };

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
            |p, fields| sources::volume(self.source_of(p), p.compiled.kind, fields, &n),
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
        // Variables: any profile, and any annotation, may name some.
        let added = "variables.served.map(k, variables.env[k].filter(e, !(has(c.env) && c.env.exists(x, x.name == e)))\
             .map(e, JSONPatch{op: 'add', path: '/spec/containers/' + string(i) + '/env/-', \
             value: Object.spec.containers.env{name: e, value: variables.paths[k]}})).flatten()";
        out.push_str(&format!(
            "\n+ object.spec.containers.transformList(i, c,\n  ({added}.size() == 0 || has(c.env) ? [] : \
             [JSONPatch{{op: 'add', path: '/spec/containers/' + string(i) + '/env', value: []}}])\n  + {added}).flatten()"
        ));
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
        // At most MAX_PROBLEMS of each annotation and of the pod, as the webhook says them.
        let problems = format!(
            "variables.over != '' ? [variables.over] : \
             (variables.asked.filter(k, k in variables.problems && variables.problems[k].size() > 0)\
             .map(k, 'annotation ' + k + ': ' + variables.problems[k].transformList(i, m, i < {MAX_PROBLEMS}, m).join('; ')) \
             + variables.clashes).transformList(i, m, i < {MAX_PROBLEMS}, m)"
        );
        json!([{
            "expression": format!("({problems}).size() == 0"),
            "messageExpression": format!(
                "({problems}).join('; ').size() > {MESSAGE_LIMIT} ? ({problems}).join('; ').substring(0, {MESSAGE_LIMIT}) + '…' \
                 : ({problems}).join('; ')"
            ),
            "reason": "Invalid",
        }])
    }
}

#[cfg(test)]
mod tests;
