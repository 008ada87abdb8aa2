//! The compiler's unit tests: what it writes for each field and limit (the API server's own
//! verdict is tests/e2e/test_policies.py's).

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
         rules:\n  - name: x\n    volumes:\n      v: {profile: r}\n  - name: y\n    mode: audit\n    \
         volumes:\n      w: type=emptyDir,mountPath=/w,size=request\n",
    )
    .unwrap();
    let keys: Vec<String> = compile(&cfg, "evi", &[])
        .unwrap_err()
        .into_iter()
        .map(|u| u.key)
        .collect();
    assert_eq!(keys, ["rules[y].mode"]);
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
            "ValidatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
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
fn a_profile_the_webhook_refuses_by_name_is_refused_with_its_reason_and_never_added_by_name() {
    // A profile without a mount path is served as profile=bare,mountPath=… only.
    let p = compiled("  maxVolumesPerPod: 3\n");
    let m = p.documents[0]["spec"]["mutations"].to_string();
    assert!(!m.contains("variables.values[k] == 'bare'"), "{m}");
    assert!(m.contains("variables.kv[k]['profile'] == 'bare'"), "{m}");
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
fn without_allow_inline_only_a_profile_with_fields_is_read_in_the_key_value_form() {
    let closed = compiled("");
    let v = text(&closed, "ValidatingAdmissionPolicy");
    assert!(v.contains("policy.allowInline is false"), "{v}");
    // profile=<name>,… names a profile: the webhook serves it whatever allowInline says.
    assert!(v.contains("('profile' in variables.kv[k]) ? ("), "{v}");
    let cfg = Config::parse(PROFILES).unwrap();
    let open = compile(&cfg, "evi", &[]).unwrap();
    let v = text(&open, "ValidatingAdmissionPolicy");
    assert!(!v.contains("policy.allowInline is false"), "{v}");
}

#[test]
fn a_profile_with_fields_takes_the_annotations_size_mount_and_variables() {
    let p =
        compiled("  maxSize: {memory: 8Gi}\n  requireSizeLimit: true\n  defaultSizeLimit: 4Gi\n");
    let m = text(&p, "MutatingAdmissionPolicy");
    for part in [
        // shm's sizeLimit, scratch's storage: the annotation's size, else the profile's
        "sizeLimit: variables.kv[k][?'size'].orValue('1Gi')",
        "{'storage': variables.kv[k][?'size'].orValue('200Gi')}",
        // bare (no mount path of its own) as it is, with the annotation's mount path
        "variables.kv[k]['profile'] == 'bare'",
        "variables.envs[k] : ['TMPDIR']",
    ] {
        assert!(m.contains(part), "{part} not in {m}");
    }
    let v = text(&p, "ValidatingAdmissionPolicy");
    for part in [
        "size does not apply to a CSI inline volume",
        "exceeds policy.maxSize.memory (8Gi)",
        "mountPath is required: profile \\\"bare\\\" does not set one",
    ] {
        assert!(v.contains(part), "{part} not in {v}");
    }
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
        "does not apply to profile=",
        "a profile fixes the volume source",
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
        "startsWith('HugePages') ? '' : '4Gi')",
        "?fsType: variables.kv[k][?'fsType']",
        "f.startsWith('attr.') && f.size() > 5, {f.substring(5): x}",
        "accessModes: [variables.kv[k][?'accessMode'].orValue('ReadWriteOnce')]",
        "?storageClassName: variables.kv[k][?'storageClass']",
        "split('/').filter(x, x != '' && x != '.').join('/')",
        "f['env'].split(';')",
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

#[test]
fn a_pod_past_the_annotations_read_is_never_iterated_and_only_warned() {
    let p = compiled("");
    for d in p
        .documents
        .iter()
        .filter(|d| !d["kind"].as_str().unwrap().ends_with("Binding"))
    {
        let conditions = d["spec"]["matchConditions"].to_string();
        let name = d["metadata"]["name"].as_str().unwrap();
        if name == "evi-bounds" {
            assert!(
                conditions.contains("size(object.metadata.annotations) > 4096"),
                "{conditions}"
            );
            assert!(!conditions.contains("exists"), "{conditions}");
        } else {
            // The size first: the map is iterated only when it is small.
            let size = conditions.find("<= 4096").unwrap_or(usize::MAX);
            let exists = conditions.find(".exists(").unwrap();
            assert!(size < exists, "{name}: {conditions}");
        }
    }
    let warn = p
        .documents
        .iter()
        .find(|d| {
            d["metadata"]["name"] == "evi-bounds" && d["kind"] == "ValidatingAdmissionPolicyBinding"
        })
        .unwrap();
    assert_eq!(warn["spec"]["validationActions"], json!(["Warn"]));
}

#[test]
fn a_rules_volumes_are_added_as_the_webhook_resolves_them_where_the_rule_matches() {
    let p = compiled(
        "  requireSizeLimit: true\n  defaultSizeLimit: 4Gi\n  maxVolumesPerPod: 4\nrules:\n  - name: nf\n    namespaces: [nf, ok]\n    \
         podSelector: {matchLabels: {app: nextflow}, matchExpressions: [{key: tier, operator: NotIn, values: [gold]}]}\n    \
         volumes:\n      tmp: profile=scratch,env=SCRATCH\n      work: {mountPath: /work, emptyDir: {}}\n  \
         - name: later\n    volumes:\n      tmp: {profile: shm}\n",
    );
    let mutating = text(&p, "MutatingAdmissionPolicy");
    // Matched as the webhook matches: the request's namespace, then the labels.
    for part in [
        "request.namespace in ['nf', 'ok']",
        r#"(\"app\" in variables.labels && variables.labels[\"app\"] == \"nextflow\")"#,
        r#"(!(\"tier\" in variables.labels) || !(variables.labels[\"tier\"] in [\"gold\"]))"#,
        // The first matching rule gives a name, an annotation of that name wins.
        "? 'nf' : (true) ? 'later' : ''",
        "!(k in variables.annotations)",
        // The rule's variable, the policy's default size on its emptyDir, its mount path.
        "['SCRATCH']",
        "emptyDir{sizeLimit: '4Gi'}",
        "'/work'",
    ] {
        assert!(mutating.contains(part), "{part} not in {mutating}");
    }
    // Sent to the policies without an annotation when a rule matches.
    let conditions = p.documents[0]["spec"]["matchConditions"].to_string();
    assert!(conditions.contains("request.namespace in"), "{conditions}");
    // A refusal names the rule as the webhook does.
    let validating = text(&p, "ValidatingAdmissionPolicy");
    assert!(
        validating.contains("'rule ' + variables.ruleOf[k] + ', volume '"),
        "{validating}"
    );
    // maxVolumesPerPod counts the rules' volumes with the annotations'.
    assert!(
        validating.contains("(variables.asked.size() + variables.ruled.size()) > 4"),
        "{validating}"
    );
}

#[test]
fn under_on_error_warn_a_refusal_is_a_warning_and_the_error_annotation() {
    let cfg = Config::parse(&format!("onError: warn\n{PROFILES}")).unwrap();
    let p = compile(&cfg, "evi", &[]).unwrap();
    let actions: Vec<&Value> = p
        .documents
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .map(|d| &d["spec"]["validationActions"])
        .collect();
    assert_eq!(actions.len(), 4);
    assert!(
        actions.iter().all(|a| **a == json!(["Warn"])),
        "{actions:?}"
    );
    let patch = text(&p, "MutatingAdmissionPolicy");
    assert!(
        patch.contains("variables.refusal == '' ? [] :")
            && patch.contains("/metadata/annotations/injector.ephemeral-volumes.io~1error"),
        "{patch}"
    );
    let message = text(&p, "ValidatingAdmissionPolicy");
    assert!(
        message.contains("'volumes not injected: ' + variables.refusal"),
        "{message}"
    );
    // Under deny, neither.
    let deny = compiled("");
    assert!(!text(&deny, "MutatingAdmissionPolicy").contains("~1error"));
    assert!(!text(&deny, "ValidatingAdmissionPolicy").contains("volumes not injected"));
}

#[test]
fn policy_overrides_branch_on_the_namespaces_policy_in_the_same_objects() {
    let overrides = "policyOverrides:
  - name: b
    namespaceSelector: {matchLabels: {team: b}}
    policy: {maxSize: {emptyDir: 2Gi}}
  - name: b-gpu
    namespaceSelector: {matchLabels: {team: b}, matchExpressions: [{key: gpu, operator: Exists}]}
    policy: {maxSize: {emptyDir: 5Gi}}
  - name: named
    namespaces: [special]
    policy: {maxSize: {emptyDir: 50Gi}}
";
    let plain = compiled("");
    let p = compiled(overrides);
    // The same objects, by kind and name.
    let names = |p: &Policies| -> Vec<String> {
        p.documents
            .iter()
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect()
    };
    assert_eq!(names(&p), names(&plain));
    let mutating = &p.documents[0]["spec"]["variables"];
    assert_eq!(mutating[0]["name"], "policy");
    let chooser = mutating[0]["expression"].as_str().unwrap();
    // By name first; then the selector with the most requirements; else the policy.
    let at = |s: &str| {
        chooser
            .find(s)
            .unwrap_or_else(|| panic!("{s} not in {chooser}"))
    };
    assert!(at("request.namespace in ['special'] ? 'named'") < at("? 'b-gpu'"));
    assert!(at("? 'b-gpu'") < at("? 'b' :"));
    assert!(chooser.ends_with(": ''"), "{chooser}");
    // A limit is read from the namespace's policy, named in the refusal as its own.
    let validating = text(&p, "ValidatingAdmissionPolicy");
    for part in [
        "variables.policy == 'b' ? (",
        "policyOverrides[b-gpu].policy.maxSize.emptyDir",
        "policyOverrides[named].policy.maxSize.emptyDir",
    ] {
        assert!(validating.contains(part), "{part}");
    }
    // Without overrides, no branch.
    assert!(!text(&plain, "ValidatingAdmissionPolicy").contains("variables.policy"));
}

#[test]
fn a_mount_goes_to_the_containers_a_request_names_each_of_which_the_pod_must_have() {
    let cfg = Config::parse(&format!(
        "{PROFILES}  side: {{mountPath: /side, containers: [sidecar], initContainers: true, emptyDir: {{}}}}\n"
    ))
    .unwrap();
    let p = compile(&cfg, "evi", &[]).unwrap();
    let v = text(&p, "ValidatingAdmissionPolicy");
    for part in [
        // The key=value lists, `true` for every init container, a profile's own lists.
        "variables.kv[k]['containers'].split(';')",
        "variables.kv[k]['initContainers'] == 'true' ? [';']",
        "['sidecar']",
        // Each named one must be in the pod, said as the webhook says it.
        "' not in the pod (' + (variables.names.size() == 0 ? 'the pod has no containers'",
        "'init container",
        // Two requests clash at a path only in a container both go to.
        "variables.aimed[j].exists(x, x in variables.aimed[k])",
    ] {
        assert!(v.contains(part), "{part} not in {v}");
    }
    let m = text(&p, "MutatingAdmissionPolicy");
    for part in [
        "variables.served.filter(k, c.name in variables.aimed[k])",
        "'/spec/initContainers/' + string(i) + '/volumeMounts/-'",
        "Object.spec.initContainers.volumeMounts{",
        "'/spec/initContainers/' + string(i) + '/env/-'",
    ] {
        assert!(m.contains(part), "{part} not in {m}");
    }
}

#[test]
fn under_mode_audit_nothing_is_added_or_refused_and_both_are_said() {
    let cfg = Config::parse(&format!("mode: audit\n{PROFILES}")).unwrap();
    let p = compile(&cfg, "evi", &[]).unwrap();
    assert!(
        p.documents
            .iter()
            .all(|d| !d["kind"].as_str().unwrap().starts_with("Mutating"))
    );
    for d in p
        .documents
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
    {
        let warns = if d["metadata"]["name"] == "evi-bounds" {
            json!(["Warn"])
        } else {
            json!(["Warn", "Audit"])
        };
        assert_eq!(d["spec"]["validationActions"], warns, "{d}");
    }
    let v = text(&p, "ValidatingAdmissionPolicy");
    assert!(
        v.contains("'audit: would refuse the pod: ' + variables.refusal"),
        "{v}"
    );
    assert!(
        v.contains("'audit: would inject ' + variables.wanted"),
        "{v}"
    );
    // Audit all or nothing: a profile or rule enforced under audit, or audited under enforce.
    let mixed = Config::parse(
        "mode: audit\nprofiles:\n  a: {mode: enforce, mountPath: /a, emptyDir: {}}\n  b: {mountPath: /b, emptyDir: {}}\n\
         rules:\n  - name: r\n    mode: enforce\n    volumes:\n      v: {profile: b}\n",
    )
    .unwrap();
    let keys: Vec<String> = compile(&mixed, "evi", &[])
        .unwrap_err()
        .into_iter()
        .map(|u| u.key)
        .collect();
    assert_eq!(keys, ["profiles.a.mode", "rules[r].mode"]);
    let one =
        Config::parse("profiles:\n  a: {mode: audit, mountPath: /a, emptyDir: {}}\n").unwrap();
    assert_eq!(
        compile(&one, "evi", &[]).unwrap_err()[0].key,
        "profiles.a.mode"
    );
}

#[test]
fn size_request_reads_the_largest_request_of_the_targeted_containers_as_spelt() {
    let cfg = Config::parse(&format!(
        "{PROFILES}  disk: {{mountPath: /disk, size: request, ephemeral: {{volumeClaimTemplate: {{spec: {{accessModes: [ReadWriteOnce]}}}}}}}}\n\
         policy:\n  maxSize: {{emptyDir: 100Gi, ephemeral: 1Ti}}\n"
    ))
    .unwrap();
    let p = compile(&cfg, "evi", &[]).unwrap();
    let v = text(&p, "ValidatingAdmissionPolicy");
    for part in [
        // Asked by the inline form (not on a CSI volume), by profile=<name>,size=request (not
        // on a CSI profile), and by a profile whose size is the request, by name or with
        // fields but no size.
        "(!('profile' in f) ? (f[?'size'] == optional.of('request') && f[?'type'].orValue('') != 'csi'",
        "!(f['profile'] in ['secrets'])",
        "(f['profile'] in ['disk'] && !('size' in f))",
        "(k in variables.values && variables.values[k] in ['disk'] ?",
        // The targeted containers and init containers, their positive requests.
        "string(c.resources.requests['ephemeral-storage'])",
        "quantity(q).isGreaterThan(quantity('0'))",
        // The largest, the first of equal ones, as spelt; then read as the size.
        "rs.filter(q, quantity(q).asApproximateFloat() == variables.reqMax[k])[0]",
        "+ [['size', variables.requested[k]]]",
        // None found, in any form, and a profile's over the cap: said as the webhook says it.
        "' has no ephemeral-storage request'",
        "v == 'disk' && k in variables.requested ?",
        "' exceeds policy.maxSize.ephemeral (1Ti)'",
    ] {
        assert!(v.contains(part), "{part} not in {v}");
    }
    // The profile's volume by name takes the request as its size.
    let m = text(&p, "MutatingAdmissionPolicy");
    assert!(
        m.contains("requests: {'storage': variables.requested[k]}"),
        "{m}"
    );
}

#[test]
fn policies_past_the_api_servers_expression_limit_are_refused_naming_the_overrides() {
    let with = |n: usize| {
        let mut text = String::from("policy: {maxSize: {emptyDir: 1Gi}}\npolicyOverrides:\n");
        for i in 0..n {
            text.push_str(&format!(
                "  - {{name: t{i}, namespaceSelector: {{matchLabels: {{team: t{i}}}}}, \
                 policy: {{maxSize: {{emptyDir: {}Gi}}, types: [emptyDir]}}}}\n",
                i + 2
            ));
        }
        compile(&Config::parse(&text).unwrap(), "evi", &[])
    };
    let longest = |p: &Policies| {
        let mut all = Vec::new();
        for d in &p.documents {
            expressions(d, "", &mut all);
        }
        all.into_iter().map(|(_, size)| size).max().unwrap_or(0)
    };
    // Each override makes the longest expression longer; as many as fit are compiled.
    let fits = (1..40).take_while(|n| with(*n).is_ok()).last().unwrap();
    assert!(fits >= 4, "only {fits} overrides fit");
    let last = with(fits).unwrap();
    assert!(longest(&last) <= MAX_EXPRESSION);
    assert!(longest(&last) > longest(&with(fits - 1).unwrap()));
    // One more is refused before the API server would refuse it: each object and expression
    // named, with its length and what made it long.
    let refused = with(fits + 1).unwrap_err();
    assert!(
        refused.iter().all(|u| u.key == "policyOverrides"),
        "{refused:?}"
    );
    let said: Vec<String> = refused.iter().map(ToString::to_string).collect();
    for kind in [
        "MutatingAdmissionPolicy evi ",
        "ValidatingAdmissionPolicy evi ",
    ] {
        assert!(
            said.iter().any(|s| s.contains(kind)
                && s.contains("(problems).expression: a CEL expression of ")
                && s.contains(&format!("past the {MAX_EXPRESSION}"))
                && s.contains(&format!("({} times)", fits + 2))),
            "{kind}: {said:#?}"
        );
    }
}
