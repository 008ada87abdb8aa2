//! The configuration compiled into admission policies the API server runs itself
//! (`ephemeral-volume-injector policies`; admissionregistration.k8s.io/v1, Kubernetes 1.36+):
//! a MutatingAdmissionPolicy that adds the volumes, mounts, variables and status annotation a
//! pod's annotations ask for by profile name, and a ValidatingAdmissionPolicy that refuses what
//! the webhook would refuse, each with its binding. docs/policies.md says what they do and
//! what only the webhook does.
//!
//! What this first compiler serves: profiles named by an annotation's whole value, with their
//! mount path, readOnly, subPath and variables, into every container. A configuration that
//! needs more (inline volumes, rules, overrides, audit, `onError: warn`, a profile's own
//! container list or `size: request`) is refused, naming the key, rather than compiled into
//! policies that would treat pods otherwise; what no policy can do (the cluster checks, the
//! webhook's warnings) is said as a note.

mod cel;

use serde_json::{Value, json};

use crate::{
    config::{Config, Mode, OnError},
    decision::Decision,
    engine::bounds::MAX_VOLUMES,
    engine::{PodLocation, decide},
    pod::PodView,
    volume::{InitTargets, Profile, VolumeKind},
};

use self::cel::{list, quote, typed};

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
    /// The four objects, in the order to apply them: the policies, then their bindings.
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
    if cfg.policy.allow_inline {
        no(
            "policy.allowInline".into(),
            "true: the policies read profile names only (the key=value and JSON forms are the \
             webhook's); set it to false to compile",
        );
    }
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
    let mut notes = vec![
        "the key=value form with a profile (profile=<name>,<field>=…) is not compiled yet: the \
         policies refuse it, naming the annotation"
            .to_owned(),
        "the webhook's warnings (a near-miss annotation key, a variable the pod already sets) \
         have no policy equivalent: the policies say nothing"
            .to_owned(),
        "a volume of the pod's own by an asked-for name is compared on the fields the profile \
         sets only: one that differs in other fields only is kept and mounted, where the \
         webhook, comparing the whole source, may refuse it"
            .to_owned(),
    ];
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

/// Compiles the configuration; `name` names the four objects.
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
    let mut variables = at.variables();
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
    let validating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"matchConstraints": constraints, "matchConditions": conditions,
                 "failurePolicy": "Fail", "variables": at.variables(),
                 "validations": at.validations(cfg, &refused)}
    });
    let binding = |kind: &str, extra: Value| {
        let mut spec = json!({"policyName": name,
                              "matchResources": {"namespaceSelector": selector}});
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
               "metadata": {"name": name}, "spec": spec})
    };
    Ok(Policies {
        documents: vec![
            mutating,
            validating,
            binding("MutatingAdmissionPolicyBinding", json!({})),
            binding(
                "ValidatingAdmissionPolicyBinding",
                json!({"validationActions": ["Deny"]}),
            ),
        ],
        notes: notes(cfg),
    })
}

/// The CEL of one configuration's policies.
struct Cel<'c> {
    /// The annotation prefix with its `/`.
    prefix: String,
    /// The profiles the policies serve, by name.
    served: &'c [(&'c str, &'c Profile)],
    /// `policy.maxVolumesPerPod`.
    max_volumes: Option<usize>,
}

impl<'c> Cel<'c> {
    fn new(cfg: &Config, served: &'c [(&'c str, &'c Profile)]) -> Self {
        Cel {
            prefix: format!("{}/", cfg.prefix),
            served,
            max_volumes: cfg.policy.max_volumes_per_pod,
        }
    }

    /// The volume name of annotation key `k` (a CEL expression).
    fn volume(&self) -> String {
        format!("k.substring({})", self.prefix.chars().count())
    }

    /// `pick(p)` for the profile annotation `k` names, as a chain of conditionals (the last
    /// served profile without a test: `served` holds served profiles only).
    fn choose(&self, pick: impl Fn(&Profile) -> String) -> String {
        self.choose_for("k", pick)
    }

    /// [`Cel::choose`] for the annotation key in the CEL variable `key`.
    fn choose_for(&self, key: &str, pick: impl Fn(&Profile) -> String) -> String {
        let mut out = String::new();
        let Some(((_, last), rest)) = self.served.split_last() else {
            return "null".to_owned();
        };
        for (name, p) in rest {
            out.push_str(&format!(
                "variables.annotations[{key}].trim() == {} ? {} : ",
                quote(name),
                pick(p)
            ));
        }
        out.push_str(&pick(last));
        out
    }

    /// What the pod holds already that an asked-for volume would clash with, as the webhook
    /// says it: another asked-for volume at its mount path, a mount of the pod's own at it,
    /// a volume of the pod's own by its name with other settings.
    fn clashes(&self) -> String {
        let n = self.volume();
        let path = self.choose(|p| quote(p.mount.mount_path.as_deref().unwrap_or("")));
        let other = self.choose_for("j", |p| quote(p.mount.mount_path.as_deref().unwrap_or("")));
        let same = self.choose(|p| {
            let source: Value = serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
            let field = kind_field(p.compiled.kind);
            let mut checks = vec![format!("has(v.{field})")];
            cel::same_as(&format!("v.{field}"), &source, &mut checks);
            format!("({})", checks.join(" && "))
        });
        format!(
            "variables.known.map(k, \
             variables.known.exists(j, j < k && ({other}) == ({path})) \
             ? 'volume \"' + {n} + '\" (annotation ' + k + '): it is mounted at ' + ({path}) + ', as the volume of annotation ' \
               + variables.known.filter(j, j < k && ({other}) == ({path}))[0] + ' is' \
             : object.spec.containers.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, m.mountPath == ({path}) && m.name != {n})) \
             ? 'volume \"' + {n} + '\" (annotation ' + k + '): a container already mounts another volume at ' + ({path}) \
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

    fn names(&self) -> String {
        list(self.served.iter().map(|(n, _)| *n))
    }

    fn variables(&self) -> Value {
        json!([
            {"name": "annotations",
             "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
            {"name": "asked",
             "expression": format!("variables.annotations.filter(k, k.startsWith({})).sort()",
                                   quote(&self.prefix))},
            {"name": "over", "expression": self.over()},
            // Past a count nothing more is read: the pod is refused for it alone.
            {"name": "known",
             "expression": format!(
                 "variables.over != '' ? [] : \
                  variables.asked.filter(k, variables.annotations[k].trim() in {} && {})",
                 self.names(), self.good_name())},
            {"name": "clashes", "expression": self.clashes()},
            // Nothing is added to a pod with a clash: the validating policy refuses it, naming
            // the annotation, instead of the API server refusing an invalid pod.
            {"name": "served",
             "expression": "variables.clashes.size() == 0 ? variables.known : []"},
            {"name": "wanted",
             "expression": format!(
                 "variables.served.filter(k, \
                  !(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {})))",
                 self.volume())},
        ])
    }

    /// Whether the pod lacks anything the annotations ask for: a volume, a container's mount
    /// or variable.
    fn missing(&self) -> String {
        let n = self.volume();
        let env = self.choose(|p| list(p.mount.env.iter().flatten().map(String::as_str)));
        format!(
            "variables.wanted.size() > 0 || object.spec.containers.exists(c, variables.served.exists(k, \
             !(has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == {n})) \
             || ({env}).exists(e, !(has(c.env) && c.env.exists(x, x.name == e)))))"
        )
    }

    /// The JSON Patch: the volumes, each container's mounts and variables, and the status
    /// annotation; nothing for a pod that has them all.
    fn patch(&self, cfg: &Config) -> String {
        let n = self.volume();
        let volume = self.choose(|p| {
            let source: Value = serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
            let field = kind_field(p.compiled.kind);
            format!(
                "Object.spec.volumes{{name: {n}, {field}: {}}}",
                typed(&format!("Object.spec.volumes.{field}"), &source)
            )
        });
        let mount = self.choose(|p| {
            let m = &p.mount;
            let mut fields = vec![
                format!("name: {n}"),
                format!(
                    "mountPath: {}",
                    quote(m.mount_path.as_deref().unwrap_or(""))
                ),
            ];
            if let Some(ro) = m.read_only {
                fields.push(format!("readOnly: {ro}"));
            }
            if let Some(sub) = &m.sub_path {
                fields.push(format!("subPath: {}", quote(sub)));
            }
            format!(
                "Object.spec.containers.volumeMounts{{{}}}",
                fields.join(", ")
            )
        });
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
        if self
            .served
            .iter()
            .any(|(_, p)| p.mount.env.as_ref().is_some_and(|e| !e.is_empty()))
        {
            let names = self.choose(|p| list(p.mount.env.iter().flatten().map(String::as_str)));
            let path = self.choose(|p| quote(p.mount.mount_path.as_deref().unwrap_or("")));
            let added = format!(
                "variables.served.map(k, ({names}).filter(e, !(has(c.env) && c.env.exists(x, x.name == e)))\
                 .map(e, JSONPatch{{op: 'add', path: '/spec/containers/' + string(i) + '/env/-', \
                 value: Object.spec.containers.env{{name: e, value: {path}}}}})).flatten()"
            );
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

    /// The refusals, every problem of every annotation in one message (as the webhook says
    /// them all at once): a volume name that is not a DNS label, a value that is not a
    /// profile, a profile the policy refuses; more volumes than the policy allows.
    fn validations(&self, cfg: &Config, refused: &[(&str, String)]) -> Value {
        let n = self.volume();
        let value = "variables.annotations[k].trim()";
        let known = list(cfg.profiles.keys().map(String::as_str));
        let defined = cfg.profiles.keys().cloned().collect::<Vec<_>>().join(", ");
        let mut problem = format!(
            "!({}) ? 'annotation ' + k + ': volume name \"' + {n} + '\" must be a DNS-1123 label'\n\
             : !({value} in {known}) ? 'annotation ' + k + ': ' + (variables.annotations[k].contains('profile=') \
             ? 'the admission policies read a profile name only: profile=<name> with fields needs the webhook' \
             : variables.annotations[k].contains('=') || {value}.startsWith('{{') \
             ? 'policy.allowInline is false: name one of the cluster\\'s profiles' \
             : 'profile \"' + {value} + '\" is not defined (defined: {defined})')\n",
            self.good_name()
        );
        for (profile, why) in refused {
            problem.push_str(&format!(
                ": {value} == {} ? 'annotation ' + k + ': ' + {}\n",
                quote(profile),
                quote(why)
            ));
        }
        problem.push_str(": ''");
        let problems = format!(
            "variables.over != '' ? [variables.over] : \
             variables.asked.map(k, ({problem})).filter(m, m != '') + variables.clashes"
        );
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
                "policy.allowInline",
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
                "MutatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding"
            ]
        );
        let m = text(&p, "MutatingAdmissionPolicy");
        for part in [
            "Object.spec.volumes.ephemeral.volumeClaimTemplate.spec{accessModes: ['ReadWriteOnce']",
            "emptyDir: Object.spec.volumes.emptyDir{medium: 'Memory', sizeLimit: '1Gi'}",
            "csi: Object.spec.volumes.csi{driver: 'secrets-store.csi.k8s.io', volumeAttributes: {'secretProviderClass': 'db'}}",
            "mountPath: '/mnt/secrets', readOnly: true",
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
        let m = text(&p, "MutatingAdmissionPolicy");
        assert!(!m.contains("'bare'") && !m.contains("5Gi"), "{m}");
        let v = text(&p, "ValidatingAdmissionPolicy");
        assert!(
            v.contains("== 'bare' ? 'annotation ' + k + ': ' + 'mountPath is required: profile \\\"bare\\\" does not set one'"),
            "{v}"
        );
        assert!(v.contains("policy.maxVolumesPerPod allows 3"), "{v}");
    }
}
