//! The CEL of one configuration's policies for a pod: the variables that read its annotations
//! and the rules that match it, the problems of each, the clashes, the JSON Patch and the
//! refusal. The validating policies of the pod controllers are the same, read at the template.

use serde_json::{Value, json};

use super::{
    MAX_ANNOTATIONS,
    cel::{self, list, quote},
    inline::{self, Form},
    pointer_token,
    rules::Rules,
    sources,
};
use crate::{
    config::{Config, Mode, OnError, Policy},
    echo::MESSAGE_LIMIT,
    engine::{RuleVolume, bounds::MAX_VOLUMES},
    validate::MAX_PROBLEMS,
    volume::{InitTargets, Medium, Profile, VolumeKind},
};

/// The CEL of one configuration's policies.
pub(super) struct Cel<'c> {
    /// The annotation prefix with its `/`.
    pub(super) prefix: String,
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
    /// The rules' volumes.
    pub(super) rules: Rules<'c>,
    /// `onError: warn`: a pod with a problem is admitted without volumes.
    warn: bool,
    /// `mode: audit`: nothing is added or refused; both are said (the bindings warn).
    audit: bool,
}

impl<'c> Cel<'c> {
    /// The CEL of `cfg` under `policy` (the configuration's, or an override's).
    pub(super) fn new(
        cfg: &'c Config,
        policy: &'c Policy,
        served: &'c [(&'c str, &'c Profile)],
    ) -> Self {
        let prefix = format!("{}/", cfg.prefix);
        Cel {
            rules: Rules::new(cfg, policy, &prefix),
            warn: cfg.on_error == OnError::Warn,
            audit: cfg.mode == Mode::Audit,
            prefix,
            served,
            profiles: cfg.profiles.keys().map(String::as_str).collect(),
            all: cfg.profiles.iter().map(|(n, p)| (n.as_str(), p)).collect(),
            default_size: policy
                .require_size_limit
                .then_some(policy.default_size_limit_text.as_str()),
            max_volumes: policy.max_volumes_per_pod,
            form: Form::new(policy),
            allow_inline: policy.allow_inline,
            policy_origin: &policy.origin,
        }
    }

    /// The refusal of key `k`'s size=request (or a profile's) that found no request, in any
    /// form, as the webhook says it (a CEL list).
    fn no_request() -> String {
        let names = "variables.reqNames[k]";
        format!(
            "(k in variables.reqSpec && variables.requested[k] == '' ? ['size=request, but ' + ({names}.size() == 1 \
             ? 'container ' + {names}[0] + ' has no ephemeral-storage request' \
             : 'none of the containers ' + {names}.join(', ') + ' has an ephemeral-storage request') \
             + ' (set one, e.g. with Nextflow\\'s disk directive, or give a size)'] : [])"
        )
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
        by_rule: impl Fn(&RuleVolume) -> String,
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
        let annotation = match by_name {
            Some(by_name) => format!("(k in variables.kv ? {inline} : {by_name})"),
            None => inline,
        };
        if self.rules.is_empty() {
            annotation
        } else {
            format!(
                "(!(k in variables.annotations) ? ({}) : {annotation})",
                self.rules.chain(by_rule)
            )
        }
    }

    /// How messages name the request of key `k`: its annotation, or the rule that gives it
    /// (as the webhook names them).
    fn describe(&self, k: &str) -> String {
        if self.rules.is_empty() {
            format!("'annotation ' + {k}")
        } else {
            format!(
                "({k} in variables.annotations ? 'annotation ' + {k} : 'rule ' + variables.ruleOf[{k}] + ', volume ' + {k}.substring({}))",
                self.prefix.chars().count()
            )
        }
    }

    /// The condition on a pod (or a template) whose metadata is at `meta` (`guard`: `has()`
    /// tests that it exists, for a template) for the policies to look at it: it has an
    /// annotation of the prefix, or a rule matches it — never a pod with more annotations than
    /// they read.
    pub(super) fn asks(&self, meta: &str, guard: &str) -> String {
        let guard = if guard.is_empty() {
            String::new()
        } else {
            format!("{guard} && ")
        };
        let has = format!("{guard}has({meta}.annotations)");
        let annotations = format!(
            "{has} && size({meta}.annotations) <= {MAX_ANNOTATIONS} \
             && {meta}.annotations.exists(k, k.startsWith({}))",
            quote(&self.prefix)
        );
        if self.rules.is_empty() {
            return annotations;
        }
        let labels = format!("({guard}has({meta}.labels) ? {meta}.labels : {{}})");
        format!(
            "!({has} && size({meta}.annotations) > {MAX_ANNOTATIONS}) && (({annotations}) || {})",
            self.rules.any(&labels)
        )
    }

    /// A map from each annotation without problems to `value` of it (a CEL expression of `k`).
    fn each_known(value: String) -> String {
        format!("variables.known.transformMapEntry(i, k, {{k: {value}}})")
    }

    /// A profile's source as the webhook writes it: with the policy's default size when the
    /// policy requires one and the profile's emptyDir has none (not HugePages).
    fn source_of(&self, p: &Profile) -> Value {
        let mut source: Value = serde_json::from_str(p.compiled.json.get()).unwrap_or(Value::Null);
        // A size from the containers' requests takes the default's place.
        if let (Some(default), VolumeKind::EmptyDir, false) =
            (self.default_size, p.compiled.kind, p.size_from_request)
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
            |r| {
                sources::same(
                    &sources::without_size(r.source.clone(), r.kind),
                    r.kind,
                    false,
                )
            },
        );
        let this = self.describe("k");
        // Two requests clash at a path only in a container both go to.
        let before = format!(
            "j < k && variables.paths[j] == {path} && (variables.aimed[j].exists(x, x in variables.aimed[k]) \
             || variables.aimedInit[j].exists(x, x in variables.aimedInit[k]))"
        );
        let other = self.describe(&format!("variables.known.filter(j, {before})[0]"));
        let mounts = |list: &str, aimed: &str| {
            format!(
                "{list}.exists(c, c.name in variables.{aimed}[k] && has(c.volumeMounts) \
                 && c.volumeMounts.exists(m, {own} == {path} && m.name != {n}))"
            )
        };
        format!(
            "variables.unaimed + variables.known.map(k, \
             variables.known.exists(j, {before}) \
             ? 'volume \"' + {n} + '\" (' + {this} + '): it is mounted at ' + {path} + ', as the volume of ' + {other} + ' is' \
             : {} || (has(object.spec.initContainers) && {}) \
             ? 'volume \"' + {n} + '\" (' + {this} + '): a container already mounts another volume at ' + {path} \
             : has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {n} && !({same})) \
             ? 'volume \"' + {n} + '\" (' + {this} + '): the pod already has a volume with this name, with other settings; rename one of them' \
             : '').filter(m, m != '')",
            mounts("object.spec.containers", "aimed"),
            mounts("object.spec.initContainers", "aimedInit"),
        )
    }

    /// The containers and init containers each request's mount goes to (`targets`, with
    /// [`cel::ALL`] for every one; `aimed`, by name), and the refusal of a request that names
    /// one the pod does not have, as the webhook says it (`unaimed`).
    fn targets(&self) -> Vec<Value> {
        let containers = |p: &Profile, fields: bool| {
            let own = match &p.mount.containers {
                Some(names) => list(names.iter().map(String::as_str)),
                None => cel::ALL.to_owned(),
            };
            if fields {
                Form::containers_or(&own)
            } else {
                own
            }
        };
        let inits = |targets: Option<&InitTargets>| match targets {
            None | Some(InitTargets::None) => "[]".to_owned(),
            Some(InitTargets::All) => cel::ALL.to_owned(),
            Some(InitTargets::Named(names)) => list(names.iter().map(String::as_str)),
        };
        let init_containers = |p: &Profile, fields: bool| {
            let own = inits(p.mount.init_containers.as_ref());
            if fields {
                Form::init_containers_or(&own)
            } else {
                own
            }
        };
        let all = cel::ALL;
        let missing = |what: &str, list: &str, present: &str| {
            format!(
                "(variables.{list}[k].filter(x, x != ';' && !(x in variables.{present})).size() == 0 ? [] : \
                 [(variables.{list}[k].filter(x, x != ';' && !(x in variables.{present})).size() == 1 \
                 ? '{what} \"' + variables.{list}[k].filter(x, x != ';' && !(x in variables.{present}))[0] + '\" is' \
                 : '{what}s ' + variables.{list}[k].filter(x, x != ';' && !(x in variables.{present})).map(x, '\"' + x + '\"').join(', ') + ' are') \
                 + ' not in the pod (' + (variables.{present}.size() == 0 ? 'the pod has no {what}s' : 'its {what}s: ' + variables.{present}.join(', ')) + ')'])"
            )
        };
        vec![
            json!({"name": "names", "expression": "object.spec.containers.map(c, c.name)"}),
            json!({"name": "initNames",
                   "expression": "has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []"}),
            json!({"name": "targets",
                   "expression": Self::each_known(self.per_annotation(|_| Form::containers_or(all), containers,
                       |r| r.containers.as_ref().map_or_else(|| all.to_owned(), |n| list(n.iter().map(String::as_str)))))}),
            json!({"name": "initTargets",
                   "expression": Self::each_known(self.per_annotation(|_| Form::init_containers_or("[]"),
                       init_containers, |r| inits(Some(&r.init_containers))))}),
            json!({"name": "aimed",
                   "expression": format!("variables.targets.transformMap(k, l, l == {all} ? variables.names : l)")}),
            json!({"name": "aimedInit",
                   "expression": format!("variables.initTargets.transformMap(k, l, l == {all} ? variables.initNames : l)")}),
            json!({"name": "unaimed",
                   "expression": format!(
                       "variables.known.map(k, ({} + {}{}).map(x, {} + ': ' + x)).flatten()",
                       missing("container", "targets", "names"),
                       missing("init container", "initTargets", "initNames"),
                       self.rule_requests(),
                       self.describe("k"))}),
        ]
    }

    /// Of a rule's volume whose size is the containers' request: none found, or one past the
    /// policy's cap (as the webhook holds a rule's size=request to the policy), else nothing.
    fn rule_requests(&self) -> String {
        if self.rules.is_empty() {
            return String::new();
        }
        let over = self.rules.chain(|r| {
            if r.size_from_request {
                self.form
                    .over_cap(r.kind, r.medium, "variables.requested[k]")
            } else {
                "[]".to_owned()
            }
        });
        format!(
            " + (k in variables.annotations ? [] : {} + (k in variables.requested ? ({over}) : []))",
            Self::no_request()
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
            let origin = self.policy_origin;
            let count = if self.rules.is_empty() {
                "variables.asked.size()"
            } else {
                "(variables.asked.size() + variables.ruled.size())"
            };
            out.push_str(&format!(
                "{count} > {max} ? string({count}) + \
                 ' volumes requested, {origin}.maxVolumesPerPod allows {max}' : "
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
        // A profile whose size is the containers' request: that size under the policy's cap.
        let requested = "variables.requested[k]";
        for (profile, p) in self.all.iter().filter(|(_, p)| p.size_from_request) {
            by_name.push_str(&format!(
                " : v == {} && k in variables.requested ? {}",
                quote(profile),
                self.form
                    .over_cap(p.compiled.kind, p.compiled.medium, requested)
            ));
        }
        let no_request = Self::no_request();
        format!(
            "(!({}) ? ['volume name \"' + {n} + '\" must be a DNS-1123 label'] : [])\n + {no_request}\n + ({inline}\n : {by_name} : [])",
            self.good_name()
        )
    }

    pub(super) fn variables(&self, refused: &[(&str, String)]) -> Value {
        let mut out = vec![
            json!({"name": "annotations",
                   "expression": "has(object.metadata) && has(object.metadata.annotations) ? object.metadata.annotations : {}"}),
            json!({"name": "asked",
                   "expression": format!("variables.annotations.filter(k, k.startsWith({})).sort()",
                                         quote(&self.prefix))}),
        ];
        if !self.rules.is_empty() {
            // The volumes of the rules that match, but those an annotation asks for by name.
            out.extend([
                json!({"name": "labels",
                       "expression": "has(object.metadata) && has(object.metadata.labels) ? object.metadata.labels : {}"}),
                json!({"name": "ruleOf", "expression": self.rules.rule_of("variables.labels")}),
                json!({"name": "ruled",
                       "expression": "variables.ruleOf.filter(k, variables.ruleOf[k] != '' && !(k in variables.annotations)).sort()"}),
            ]);
        }
        out.extend([
            json!({"name": "over", "expression": self.over()}),
            // Past a count nothing more is read: the pod is refused for it alone.
            json!({"name": "values",
                   "expression": "variables.over != '' ? {} : \
                                  variables.asked.transformMapEntry(i, k, {k: variables.annotations[k].trim()})"}),
        ]);
        for (name, expression) in Form::variables(&self.all, self.rule_forms()) {
            out.push(json!({"name": name, "expression": expression}));
        }
        let (plus_ruled, ruled_size) = if self.rules.is_empty() {
            ("", "")
        } else {
            (" + variables.ruled", " + variables.ruled.size()")
        };

        out.extend([
            json!({"name": "problems",
                   "expression": format!("variables.values.transformMap(k, v, {})", self.problems(refused))}),
            json!({"name": "known",
                   "expression": format!("(variables.asked.filter(k, k in variables.problems && variables.problems[k].size() == 0){plus_ruled}).sort()")}),
        ]);
        out.extend(self.mounts());
        out.extend(self.targets());
        out.extend([
            json!({"name": "clashes", "expression": self.clashes()}),
            // Nothing is added to a pod with a problem: the validating policy refuses it,
            // naming the annotation, instead of the API server refusing an invalid pod.
            json!({"name": "served",
                   "expression": format!("variables.over == '' && variables.known.size() == variables.asked.size(){ruled_size} \
                                  && variables.clashes.size() == 0 ? variables.known : []")}),
            json!({"name": "wanted",
                   "expression": format!(
                       "variables.served.filter(k, \
                        !(has(object.spec.volumes) && object.spec.volumes.exists(v, v.name == {})))",
                       self.volume())}),
            json!({"name": "missing", "expression": self.missing()}),
            json!({"name": "refusal", "expression": self.refusal()}),
        ]);
        Value::Array(out)
    }

    /// The pairs each rule's volume that takes its size from the requests would have (a CEL
    /// chain by key), when the configuration has rules.
    fn rule_forms(&self) -> Option<String> {
        (!self.rules.is_empty()).then(|| {
            self.rules.chain(|r| {
                if !r.size_from_request {
                    return "{}".to_owned();
                }
                let mut pairs = vec![("size", "request".to_owned())];
                if let Some(names) = &r.containers {
                    pairs.push(("containers", names.join(";")));
                }
                match &r.init_containers {
                    InitTargets::None => {}
                    InitTargets::All => pairs.push(("initContainers", "true".to_owned())),
                    InitTargets::Named(names) => pairs.push(("initContainers", names.join(";"))),
                }
                let pairs: Vec<String> = pairs
                    .iter()
                    .map(|(k, v)| format!("{}: {}", quote(k), quote(v)))
                    .collect();
                format!("{{{}}}", pairs.join(", "))
            })
        })
    }

    /// Each served request's mount: its path, readOnly, subPath and variables — the
    /// profile's, or with `profile=<name>,…` the annotation's where it sets one, or the
    /// key=value form's, or the rule's.
    fn mounts(&self) -> Vec<Value> {
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
        vec![
            json!({"name": "paths",
                   "expression": Self::each_known(self.per_annotation(|_| Form::path(), mount_path,
                       |r| quote(&r.mount_path)))}),
            json!({"name": "readOnly",
                   "expression": Self::each_known(self.per_annotation(|_| Form::read_only(), read_only,
                       |r| quote(&r.read_only.map(|r| r.to_string()).unwrap_or_default())))}),
            json!({"name": "subPaths",
                   "expression": Self::each_known(self.per_annotation(|_| Form::sub_path(), sub_path,
                       |r| quote(r.sub_path.as_deref().unwrap_or(""))))}),
            json!({"name": "env",
                   "expression": Self::each_known(self.per_annotation(|_| Form::env(), env,
                       |r| list(r.env.iter().map(String::as_str))))}),
        ]
    }

    /// The mounts and variables of the containers of `list` (`containers`, `initContainers`)
    /// that each served request goes to (`aimed`: its targets by name), but those there.
    fn each_container(&self, list: &str, aimed: &str) -> String {
        let n = self.volume();
        let at = format!("'/spec/{list}/' + string(i)");
        let mine = format!("variables.served.filter(k, c.name in variables.{aimed}[k])");
        let mount = format!(
            "Object.spec.{list}.volumeMounts{{name: {n}, mountPath: variables.paths[k], \
             ?readOnly: variables.readOnly[k] == '' ? optional.none() : optional.of(variables.readOnly[k] == 'true'), \
             ?subPath: variables.subPaths[k] == '' ? optional.none() : optional.of(variables.subPaths[k])}}"
        );
        // Variables: any profile, and any annotation, may name some.
        let added = format!(
            "{mine}.map(k, variables.env[k].filter(e, !(has(c.env) && c.env.exists(x, x.name == e)))\
             .map(e, JSONPatch{{op: 'add', path: {at} + '/env/-', \
             value: Object.spec.{list}.env{{name: e, value: variables.paths[k]}}}})).flatten()"
        );
        format!(
            "object.spec.{list}.transformList(i, c,\n  \
             ({mine}.size() == 0 || has(c.volumeMounts) ? [] : \
             [JSONPatch{{op: 'add', path: {at} + '/volumeMounts', value: []}}])\n  \
             + {mine}.filter(k, !(has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == {n})))\
             .map(k, JSONPatch{{op: 'add', path: {at} + '/volumeMounts/-', value: {mount}}})\n  \
             + ({added}.size() == 0 || has(c.env) ? [] : [JSONPatch{{op: 'add', path: {at} + '/env', value: []}}])\n  \
             + {added}).flatten()"
        )
    }

    /// Whether the pod lacks anything the annotations ask for: a volume, a container's mount
    /// or variable.
    pub(super) fn missing(&self) -> String {
        let n = self.volume();
        let lacks = |list: &str, aimed: &str| {
            format!(
                "{list}.exists(c, variables.served.exists(k, c.name in variables.{aimed}[k] \
                 && (!(has(c.volumeMounts) && c.volumeMounts.exists(m, m.name == {n})) \
                 || variables.env[k].exists(e, !(has(c.env) && c.env.exists(x, x.name == e))))))"
            )
        };
        format!(
            "variables.wanted.size() > 0 || {} || (has(object.spec.initContainers) && {})",
            lacks("object.spec.containers", "aimed"),
            lacks("object.spec.initContainers", "aimedInit")
        )
    }

    /// The JSON Patch: the volumes, each container's mounts and variables, and the status
    /// annotation; nothing for a pod that has them all.
    pub(super) fn patch(&self, cfg: &Config) -> String {
        let n = self.volume();
        let volume = self.per_annotation(
            |form| form.volume(&n),
            |p, fields| match (p.size_from_request, fields) {
                (true, false) => sources::volume_sized(
                    self.source_of(p),
                    p.compiled.kind,
                    "variables.requested[k]",
                    &n,
                ),
                _ => sources::volume(self.source_of(p), p.compiled.kind, fields, &n),
            },
            |r| match r.size_from_request {
                true => {
                    sources::volume_sized(r.source.clone(), r.kind, "variables.requested[k]", &n)
                }
                false => sources::volume(r.source.clone(), r.kind, false, &n),
            },
        );
        let mut out = format!(
            "(variables.wanted.size() == 0 || has(object.spec.volumes) ? [] : \
             [JSONPatch{{op: 'add', path: '/spec/volumes', value: []}}])\n\
             + variables.wanted.map(k, JSONPatch{{op: 'add', path: '/spec/volumes/-', value: {volume}}})\n\
             + {}\n+ (has(object.spec.initContainers) ? {} : [])",
            self.each_container("containers", "aimed"),
            self.each_container("initContainers", "aimedInit"),
        );
        // The status annotation names every volume the annotations ask for, written whenever
        // anything else is (as the webhook writes it), so never on a pod that has it all.
        let names = format!("variables.served.map(k, {n}).join(',')");
        out.push_str(&format!(
            "\n+ (!variables.missing ? [] : {})",
            annotate(&cfg.injected.key, &names)
        ));
        // Under `onError: warn` a pod the policies would refuse is admitted without volumes,
        // with the refusal in the error annotation (the validating policy warns).
        if cfg.on_error == OnError::Warn {
            out.push_str(&format!(
                "\n+ (variables.refusal == '' ? [] : {})",
                annotate(&cfg.error.key, "variables.refusal")
            ));
        }
        out
    }

    /// The refusal of the pod, every problem of every annotation and rule in one message (as
    /// the webhook says them all at once, at most MAX_PROBLEMS of each and of the pod, and
    /// MESSAGE_LIMIT characters), else `''`.
    pub(super) fn refusal(&self) -> String {
        let problems = format!(
            "(variables.over != '' ? [variables.over] : \
             (variables.asked.filter(k, k in variables.problems && variables.problems[k].size() > 0)\
             .map(k, 'annotation ' + k + ': ' + variables.problems[k].transformList(i, m, i < {MAX_PROBLEMS}, m).join('; ')) \
             + variables.clashes).transformList(i, m, i < {MAX_PROBLEMS}, m)).join('; ')"
        );
        format!(
            "{problems}.size() > {MESSAGE_LIMIT} ? {problems}.substring(0, {MESSAGE_LIMIT}) + '…' : {problems}"
        )
    }

    /// The refusal, every problem of every annotation in one message (as the webhook says
    /// them all at once), each annotation's problems after its name.
    pub(super) fn validations(&self) -> Value {
        // Under `onError: warn` the refusal is a warning (the binding's action), said as the
        // webhook says it.
        let said = if self.audit {
            "'audit: would refuse the pod: ' + "
        } else if self.warn {
            "'volumes not injected: ' + "
        } else {
            ""
        };
        let mut out = vec![json!({
            "expression": "variables.refusal == ''",
            "messageExpression": format!("{said}variables.refusal"),
            "reason": "Invalid",
        })];
        if self.audit {
            // As the webhook says it: the volumes it would add, else that it would add mounts.
            out.push(json!({
                "expression": "!variables.missing",
                "messageExpression": format!(
                    "variables.wanted.size() > 0 ? 'audit: would inject ' + variables.wanted.map(k, {}).join(', ') \
                     : 'audit: would change the pod otherwise'",
                    self.volume()
                ),
            }));
        }
        Value::Array(out)
    }
}

/// The JSON Patch (a CEL list) that sets annotation `key` to `value` (a CEL string); a pod
/// without annotations (one only a rule asks for) is given the map with it.
fn annotate(key: &str, value: &str) -> String {
    format!(
        "(has(object.metadata.annotations) \
         ? [JSONPatch{{op: 'add', path: {}, value: {value}}}] \
         : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{{}: {value}}}}}])",
        quote(&format!("/metadata/annotations/{}", pointer_token(key))),
        quote(key)
    )
}
