//! What the webhook's decisions must always do, one section per guarantee (each headed by
//! what it guards), each case with the message a user gets. Driven through the AdmissionReview codec, as the API server calls it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use evi::{
    config::{Config, ConfigError},
    review,
};
use serde_json::{Value, json};

/// A Nextflow task pod as the API server sends it: defaulted, with its work PVC mounted.
fn pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "nf-", "namespace": "nf", "annotations": annotations,
                     "labels": {"nextflow.io/app": "nextflow"}},
        "spec": {
            "containers": [{
                "name": "main", "image": "quay.io/nextflow/bash",
                "resources": {"requests": {"memory": "4Gi", "ephemeral-storage": "10Gi"},
                              "limits": {"memory": "4Gi"}},
                "volumeMounts": [{"name": "vol-1", "mountPath": "/workspace"},
                                 {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
            }],
            "volumes": [{"name": "vol-1", "persistentVolumeClaim": {"claimName": "nf-work"}},
                        {"name": "kube-api-access-x7k2p", "projected": {"sources": []}}],
        }
    })
}

struct Decision {
    /// The decision's label, and the denial's reason if there is one: `denied:conflict`.
    verdict: String,
    code: Option<u64>,
    message: String,
    warnings: Vec<String>,
    mutated: Value,
}

fn decide(cfg: &Config, pod: &Value) -> Decision {
    let request = common::review_for(pod, "nf", "5e0c1a2b-0000-4000-8000-00000000000a");
    let body = serde_json::to_vec(&request).unwrap();
    let handled = review::handle(cfg, None, review::Endpoint::Mutate, &body).unwrap();
    let response: Value = serde_json::from_slice(&handled.body).unwrap();
    let r = &response["response"];
    Decision {
        verdict: match handled.decision.denial() {
            Some(d) => format!("{}:{}", handled.decision.label(), d.reason.as_str()),
            None => handled.decision.label().to_owned(),
        },
        code: r["status"]["code"].as_u64(),
        message: r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        warnings: r["warnings"]
            .as_array()
            .map(|w| w.iter().map(|w| w.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default(),
        mutated: common::apply_response(&request, &response, pod),
    }
}

/// The pod's volume of that name.
fn volume(pod: &Value, name: &str) -> Value {
    pod["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no volume {name} in {pod}"))
}

fn cfg(yaml: &str) -> Config {
    Config::parse(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn config_errors(yaml: &str) -> String {
    match Config::parse(yaml) {
        Err(ConfigError::Invalid(errors)) => errors.join("\n"),
        other => panic!("{yaml}: expected an invalid configuration, got {other:?}"),
    }
}

fn with_volume(volume: Value, annotation: &str) -> Value {
    let mut p = pod(json!({"ephemeral-volumes.io/scratch": annotation}));
    p["spec"]["volumes"].as_array_mut().unwrap().push(volume);
    p
}

// === Guards: a pod's own volume is never taken for ours, unless it is exactly what we would inject ===

#[test]
fn an_existing_volume_of_the_same_name_is_reused_only_when_identical() {
    let c = Config::default();
    // (existing volume, annotation, refused with)
    for (existing, annotation, refused) in [
        (
            json!({"name": "scratch", "persistentVolumeClaim": {"claimName": "data"}}),
            "type=emptyDir,mountPath=/other",
            Some("of kind persistentVolumeClaim, not emptyDir"),
        ),
        (
            json!({"name": "scratch", "hostPath": {"path": "/var/lib"}}),
            "type=emptyDir,mountPath=/other",
            Some("of kind hostPath, not emptyDir"),
        ),
        (
            json!({"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}),
            "type=emptyDir,mountPath=/other",
            Some("with other emptyDir settings"),
        ),
        (
            json!({"name": "scratch", "emptyDir": {"sizeLimit": "64Gi"}}),
            "type=emptyDir,mountPath=/other,size=1Gi",
            Some("with other emptyDir settings"),
        ),
        (
            json!({"name": "scratch", "csi": {"driver": "other.csi.k8s.io"}}),
            "type=csi,driver=secrets-store.csi.k8s.io,mountPath=/s",
            Some("with other csi settings"),
        ),
        (
            json!({"name": "scratch", "emptyDir": {}}),
            "type=ephemeral,size=1Gi,mountPath=/s",
            Some("of kind emptyDir, not ephemeral"),
        ),
        // Identical, allowing for what the API server does between two calls.
        (
            json!({"name": "scratch", "emptyDir": {}}),
            "type=emptyDir,mountPath=/s",
            None,
        ),
        (
            json!({"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}),
            "type=emptyDir,mountPath=/s,size=1024Mi",
            None,
        ),
        (
            json!({"name": "scratch", "emptyDir": {"medium": "", "sizeLimit": "1Gi"}}),
            "type=emptyDir,mountPath=/s,size=1Gi",
            None,
        ),
        (
            json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"metadata": {}, "spec": {
            "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "1Ti"}}}}}}),
            "type=ephemeral,size=1024Gi,mountPath=/s",
            None,
        ),
    ] {
        let d = decide(&c, &with_volume(existing.clone(), annotation));
        match refused {
            Some(why) => {
                assert_eq!(d.verdict, "denied:conflict", "{existing} / {annotation}");
                assert_eq!(d.code, Some(422));
                assert!(
                    d.message.contains("volume \"scratch\"") && d.message.contains(why),
                    "{existing} / {annotation}: {}",
                    d.message
                );
                assert_eq!(
                    d.mutated,
                    with_volume(existing, annotation),
                    "nothing is patched"
                );
            }
            None => {
                assert_eq!(
                    d.verdict, "mutated",
                    "{existing} / {annotation}: {}",
                    d.message
                );
                let vols = d.mutated["spec"]["volumes"].as_array().unwrap();
                assert_eq!(vols.iter().filter(|v| v["name"] == "scratch").count(), 1);
            }
        }
    }
}

// === Guards: a configuration that would refuse pods that asked for nothing never loads ===

#[test]
fn configurations_that_can_never_inject_are_refused_naming_the_place() {
    for (yaml, want) in [
        (
            "rules: [{name: r, volumes: {scratch: \"type=emptyDir,size=1Gi\"}}]",
            "rules[0] (r).volumes.scratch: no mountPath; every pod the rule matches would be denied",
        ),
        (
            "profiles: {p: {emptyDir: {}}}\nrules: [{name: r, volumes: {scratch: {profile: p}}}]",
            "rules[0] (r).volumes.scratch: no mountPath: profile \"p\" does not set one",
        ),
        (
            "rules: [{name: r, namespaces: [], volumes: {s: \"type=emptyDir,mountPath=/s\"}}]",
            "rules[0] (r).namespaces is empty, so the rule matches no pod",
        ),
        (
            "rules: [{name: r, volumes: {}}]",
            "rules[0] (r).volumes is empty",
        ),
        ("rules: [{name: r}]", "rules[0] (r).volumes is empty"),
        (
            "policy: {maxVolumesPerPod: 1}\nrules: [{name: r, volumes: {a: \"type=emptyDir,mountPath=/a\", b: \"type=emptyDir,mountPath=/b\"}}]",
            "more than policy.maxVolumesPerPod (1)",
        ),
        (
            "profiles: {s: {mountPath: /s, csi: {driver: x.csi.k8s.io}}}\nrules: [{name: r, volumes: {s: \"profile=s,size=1Gi\"}}]",
            "size does not apply to profile \"s\", a CSI inline volume",
        ),
        (
            "profiles: {s: {mountPath: /s, csi: {driver: x.csi.k8s.io}}}\nrules: [{name: r, volumes: {s: \"profile=s,size=request\"}}]",
            "size does not apply to profile \"s\", a CSI inline volume",
        ),
    ] {
        let errors = config_errors(yaml);
        assert!(
            errors.contains(want),
            "{yaml}\nwant: {want}\ngot:  {errors}"
        );
    }
}

// === Guards: a size limit is a limit (policy caps, defaults, units compared exactly) ===

#[test]
fn zero_sizes_are_refused_everywhere() {
    let c = Config::default();
    for annotation in [
        "type=emptyDir,mountPath=/s,size=0",
        "type=emptyDir,mountPath=/s,size=0Gi",
        "type=ephemeral,mountPath=/s,size=0",
        r#"{"mountPath":"/s","emptyDir":{"sizeLimit":"0"}}"#,
        r#"{"mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"0Mi"}}}}}}"#,
    ] {
        let d = decide(
            &c,
            &pod(json!({"ephemeral-volumes.io/scratch": annotation})),
        );
        assert_eq!(d.code, Some(400), "{annotation}");
        assert!(
            d.message.contains("is zero, which is no limit at all"),
            "{annotation}: {}",
            d.message
        );
    }
    for yaml in [
        "policy: {maxSize: {emptyDir: \"0\"}}",
        "profiles: {z: {mountPath: /z, emptyDir: {sizeLimit: \"0\"}}}",
    ] {
        assert!(config_errors(yaml).contains("is zero"), "{yaml}");
    }
}

#[test]
fn default_size_limits_respect_every_cap_and_skip_huge_pages() {
    let errors = config_errors(
        "policy: {requireSizeLimit: true, defaultSizeLimit: 10Gi, maxSize: {memory: 8Gi}}",
    );
    assert!(
        errors.contains("policy.defaultSizeLimit 10Gi exceeds policy.maxSize.memory 8Gi"),
        "{errors}"
    );

    let c =
        cfg("policy: {requireSizeLimit: true, defaultSizeLimit: 1Gi, maxSize: {emptyDir: 2Gi}}");
    // HugePages are not disk: no disk cap, no disk default, no disk warning.
    let p = pod(
        json!({"ephemeral-volumes.io/hp": "type=emptyDir,medium=HugePages-2Mi,mountPath=/hugepages,size=4Gi"}),
    );
    let d = decide(&c, &p);
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    let vol = volume(&d.mutated, "hp");
    assert_eq!(
        vol["emptyDir"],
        json!({"medium": "HugePages-2Mi", "sizeLimit": "4Gi"})
    );
    let mut p = pod(
        json!({"ephemeral-volumes.io/hp": "type=emptyDir,medium=HugePages,mountPath=/hugepages"}),
    );
    p["spec"]["containers"][0]["resources"] = json!({});
    let d = decide(&c, &p);
    let vol = volume(&d.mutated, "hp");
    assert_eq!(
        vol["emptyDir"],
        json!({"medium": "HugePages"}),
        "no disk default for huge pages"
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    // A disk emptyDir over the cap is refused.
    let d = decide(
        &c,
        &pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s,size=4Gi"})),
    );
    assert_eq!(d.code, Some(403));
    assert!(
        d.message.contains("exceeds policy.maxSize.emptyDir (2Gi)"),
        "{}",
        d.message
    );
}

#[test]
fn sizes_that_are_almost_certainly_slips_are_warned_about() {
    let c = Config::default();
    for (size, warned) in [
        ("100m", true),
        ("512", true),
        ("100M", false),
        ("1Mi", false),
        ("20Gi", false),
    ] {
        let d = decide(
            &c,
            &pod(
                json!({"ephemeral-volumes.io/s": format!("type=emptyDir,mountPath=/s,size={size}")}),
            ),
        );
        assert_eq!(d.verdict, "mutated", "{size}");
        let w = d
            .warnings
            .iter()
            .any(|w| w.contains("less than a kibibyte or a fraction of a byte"));
        assert_eq!(w, warned, "{size}: {:?}", d.warnings);
    }
}

// === Guards: a mount path has one spelling (a trailing `/` is the same path) ===

#[test]
fn mount_paths_have_one_spelling() {
    let c = Config::default();
    for (annotation, code, want) in [
        ("type=emptyDir,mountPath=/", 400, "is the container's root"),
        ("type=emptyDir,mountPath=//", 400, "is the container's root"),
        (
            "type=emptyDir,mountPath=/./",
            400,
            "is the container's root",
        ),
        (
            "type=emptyDir,mountPath=/workspace/",
            422,
            "already mounts the pod's volume \"vol-1\" at /workspace",
        ),
        (
            "type=emptyDir,mountPath=//workspace",
            422,
            "already mounts the pod's volume \"vol-1\" at /workspace",
        ),
        (
            "type=emptyDir,mountPath=/./workspace/.",
            422,
            "already mounts the pod's volume \"vol-1\" at /workspace",
        ),
    ] {
        let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": annotation})));
        assert_eq!(d.code, Some(code), "{annotation}: {}", d.message);
        assert!(d.message.contains(want), "{annotation}: {}", d.message);
    }
    // Two new volumes at one path, spelt two ways.
    let d = decide(
        &c,
        &pod(
            json!({"ephemeral-volumes.io/a": "type=emptyDir,mountPath=/scratch/",
                                  "ephemeral-volumes.io/b": "type=emptyDir,mountPath=/scratch//"}),
        ),
    );
    assert_eq!(d.code, Some(422), "{}", d.message);
    // The path is written in its one spelling.
    let d = decide(
        &c,
        &pod(json!({"ephemeral-volumes.io/a": "type=emptyDir,mountPath=/scratch//tmp/./"})),
    );
    let mounts = d.mutated["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        mounts.contains(&json!({"name": "a", "mountPath": "/scratch/tmp"})),
        "{mounts:?}"
    );
}

// === Guards: the JSON form refuses what key=value refuses ===

#[test]
fn a_repeated_json_key_is_an_error_naming_the_field() {
    let c = Config::default();
    for (annotation, field) in [
        (
            r#"{"mountPath":"/a","mountPath":"/b","emptyDir":{}}"#,
            "field mountPath is given twice",
        ),
        (
            r#"{"mountPath":"/a","emptyDir":{"sizeLimit":"1Gi","sizeLimit":"9Ti"}}"#,
            "field emptyDir.sizeLimit is given twice",
        ),
        (
            r#"{"mountPath":"/a","csi":{"driver":"d.io","volumeAttributes":{"k":"1","k":"2"}}}"#,
            "field csi.volumeAttributes.k is given twice",
        ),
    ] {
        let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": annotation})));
        assert_eq!(d.code, Some(400), "{annotation}");
        assert!(
            d.message.contains("annotation ephemeral-volumes.io/s") && d.message.contains(field),
            "{annotation}: {}",
            d.message
        );
    }
    assert!(
        config_errors("profiles:\n  p: {mountPath: /a, mountPath: /b, emptyDir: {}}\n")
            .contains("mountPath")
    );
}

// === Guards: what the API server would refuse after admission is refused at admission, with our message ===

#[test]
fn what_the_api_server_would_refuse_is_refused_naming_the_annotation() {
    let c = Config::default();
    for (annotation, want) in [
        (
            r#"{"mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"metadata":{"name":"x"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}}}"#,
            "ephemeral.volumeClaimTemplate.metadata.name cannot be set for an ephemeral volume",
        ),
        (
            r#"{"mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"metadata":{"namespace":"x"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}}}"#,
            "metadata.namespace cannot be set",
        ),
        (
            r#"{"mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"metadata":{"labels":{"bad key!":"x"}},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}}}"#,
            "is not a valid key",
        ),
        (
            r#"{"mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"spec":{"volumeMode":"FileSystem","accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}}}"#,
            "volumeMode \"FileSystem\" is not Filesystem",
        ),
        (
            "type=ephemeral,size=1Gi,accessMode=ReadWriteSometimes,mountPath=/s",
            "accessMode \"ReadWriteSometimes\"",
        ),
        (
            "type=ephemeral,size=1Gi,storageClass=GP3,mountPath=/s",
            "storageClass \"GP3\"",
        ),
        (
            "type=emptyDir,medium=memory,mountPath=/s",
            "medium \"memory\"",
        ),
        (
            "type=csi,driver=Secrets_Store,mountPath=/s",
            "CSI driver \"Secrets_Store\"",
        ),
        (
            &format!("type=csi,driver={}.io,mountPath=/s", "a".repeat(61)),
            "longer than 63 characters",
        ),
        (
            "type=emptyDir,mountPath=/s,subPath=/abs",
            "subPath \"/abs\" must be a relative path",
        ),
        (
            "type=emptyDir,mountPath=/s,subPath=a/../b",
            "must not contain '..'",
        ),
        (
            "type=emptyDir,mountPath=relative",
            "must be an absolute path",
        ),
    ] {
        let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": annotation})));
        assert_eq!(d.code, Some(400), "{annotation}: {}", d.message);
        assert!(
            d.message.contains("annotation ephemeral-volumes.io/s") && d.message.contains(want),
            "{annotation}: {}",
            d.message
        );
    }
}

// === Guards: Windows pods never get a RAM disk ===

#[test]
fn a_windows_pod_is_refused_a_memory_medium() {
    let c = Config::default();
    let mut p = pod(
        json!({"ephemeral-volumes.io/shm": "type=emptyDir,medium=Memory,size=1Gi,mountPath=/dev/shm"}),
    );
    p["spec"]["os"] = json!({"name": "windows"});
    let d = decide(&c, &p);
    assert_eq!(d.code, Some(422));
    assert!(
        d.message.contains("cannot be mounted in a Windows pod"),
        "{}",
        d.message
    );
    // A disk emptyDir is fine on Windows; a RAM disk is fine on Linux.
    let mut p =
        pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,size=1Gi,mountPath=C:/scratch"}));
    p["spec"]["os"] = json!({"name": "windows"});
    assert_eq!(
        decide(&c, &p).code,
        Some(400),
        "':' stays refused in mount paths"
    );
    let mut p = pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,size=1Gi,mountPath=/scratch"}));
    p["spec"]["os"] = json!({"name": "windows"});
    assert_eq!(decide(&c, &p).verdict, "mutated");
    let mut p = pod(
        json!({"ephemeral-volumes.io/shm": "type=emptyDir,medium=Memory,size=1Gi,mountPath=/dev/shm"}),
    );
    p["spec"]["os"] = json!({"name": "linux"});
    assert_eq!(decide(&c, &p).verdict, "mutated");
}

// === Guards: onError: warn stays one warning and one status annotation under reinvocation ===

#[test]
fn on_error_warn_counts_a_reinvoked_pod_like_the_first_time() {
    let c = cfg("onError: warn");
    let p = pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,mountpath=/s"}));
    let first = decide(&c, &p);
    assert!(
        first.verdict.starts_with("admitted-on-error:"),
        "{:?}",
        first.verdict
    );
    let error = &first.mutated["metadata"]["annotations"]["injector.ephemeral-volumes.io/error"];
    assert!(
        error
            .as_str()
            .unwrap()
            .contains("unknown field \"mountpath\""),
        "{error}"
    );
    // The API server calls again with the status annotation in place: nothing to patch, but the
    // same verdict (logged and counted), not "unchanged".
    let again = decide(&c, &first.mutated);
    assert_eq!(again.verdict, first.verdict);
    assert_eq!(again.mutated, first.mutated);
    assert!(
        again
            .warnings
            .iter()
            .any(|w| w.contains("volumes not injected"))
    );
}

// === Guards: check-config lists every error, type errors included ===

#[test]
fn check_config_lists_every_error_including_type_errors() {
    let errors = config_errors(
        r#"
onError: maybe
annotationPrefix: [not, a, string]
colour: red
profiles:
  typo: {mountPath: /x, emptyDir: {sizeLimt: 1Gi}}
rules:
  - {name: a, namespaces: "nf", volumes: {s: "type=emptyDir,mountPath=/s"}}
  - {name: b, namespaces: [], volumes: {s: "type=emptyDir,mountPath=/s"}}
policy:
  allowInline: perhaps
  maxVolumesPerPod: -1
  maxSize: {emptyDir: 10GB}
"#,
    );
    for want in [
        "onError: unknown variant `maybe`",
        "annotationPrefix: invalid type",
        "unknown field \"colour\"",
        "profiles.typo: unknown field emptyDir.sizeLimt",
        "rules[0]: invalid type",
        "rules[1] (b).namespaces is empty",
        "policy.allowInline: invalid type",
        "policy.maxVolumesPerPod: invalid value",
        "policy.maxSize.emptyDir: invalid quantity \"10GB\"",
    ] {
        assert!(errors.contains(want), "missing {want:?} in:\n{errors}");
    }
}

// === Guards: echoes of user input in messages are bounded ===

#[test]
fn a_huge_annotation_value_comes_back_cut_with_its_length() {
    // Past the bound on one value: refused before it is read, saying so.
    let huge = format!("type=emptyDir,mountPath=/s,{}=1", "k".repeat(1 << 20));
    let d = decide(
        &Config::default(),
        &pod(json!({"ephemeral-volumes.io/s": huge})),
    );
    assert_eq!(d.code, Some(400));
    assert_eq!(
        d.message,
        format!(
            "annotation ephemeral-volumes.io/s: the value is {} bytes, more than the 16384 a volume annotation may have",
            (1 << 20) + 29
        )
    );
    // Within it, a long unknown key is quoted cut.
    let value = format!("type=emptyDir,mountPath=/s,{}=1", "k".repeat(15_000));
    let d = decide(
        &Config::default(),
        &pod(json!({"ephemeral-volumes.io/s": value})),
    );
    assert_eq!(d.code, Some(400));
    assert!(d.message.len() < 700, "{} bytes", d.message.len());
    assert!(
        d.message
            .starts_with("annotation ephemeral-volumes.io/s: unknown field"),
        "{:.80}",
        d.message
    );
    assert!(d.message.contains("bytes in all)"), "{:.600}", d.message);
    // Many bad annotations together stay within the message bound too.
    let many: serde_json::Map<String, Value> = (0..64)
        .map(|i| {
            (
                format!("ephemeral-volumes.io/v{i}"),
                json!(format!("{}=1", "k".repeat(600))),
            )
        })
        .collect();
    let d = decide(&Config::default(), &pod(Value::Object(many)));
    assert!(
        d.message.len() <= evi::echo::MESSAGE_LIMIT + 40,
        "{} bytes",
        d.message.len()
    );
}

// === Guards: size=request follows the pod's own ephemeral-storage request ===

fn two_containers(first: Option<&str>, second: Option<&str>, annotations: Value) -> Value {
    let mut p = pod(annotations);
    let c = |name: &str, req: Option<&str>| {
        let mut c = json!({"name": name, "image": "busybox"});
        if let Some(r) = req {
            c["resources"] = json!({"requests": {"ephemeral-storage": r}});
        }
        c
    };
    p["spec"]["containers"] = json!([c("a", first), c("b", second)]);
    p
}

#[test]
fn size_request_takes_the_largest_ephemeral_storage_request_of_the_targets() {
    let c = cfg(r#"
profiles:
  scratch:
    mountPath: /scratch
    size: request
    ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], storageClassName: gp3}}}
policy: {maxSize: {ephemeral: 100Gi}}
"#);
    let storage = |d: &Decision, name: &str| {
        volume(&d.mutated, name)["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"].clone()
    };
    // The Nextflow pod's one container asks for 10Gi (its disk directive).
    for (annotation, want) in [
        (
            "type=ephemeral,storageClass=gp3,size=request,mountPath=/s",
            json!("10Gi"),
        ),
        (
            r#"{"size":"request","mountPath":"/s","ephemeral":{"volumeClaimTemplate":{"spec":{"accessModes":["ReadWriteOnce"]}}}}"#,
            json!("10Gi"),
        ),
        ("scratch", json!("10Gi")),
        ("profile=scratch,size=50Gi", json!("50Gi")),
    ] {
        let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": annotation})));
        assert_eq!(d.verdict, "mutated", "{annotation}: {}", d.message);
        assert_eq!(storage(&d, "s"), want, "{annotation}");
        // Idempotent: the second call finds the same size already there.
        let again = decide(&c, &d.mutated);
        assert_eq!(again.mutated, d.mutated, "{annotation}");
    }
    let d = decide(
        &c,
        &pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,size=request,mountPath=/s"})),
    );
    assert_eq!(
        volume(&d.mutated, "s")["emptyDir"],
        json!({"sizeLimit": "10Gi"})
    );
    // Several targets: the largest; named targets: theirs.
    let d = decide(
        &c,
        &two_containers(
            Some("5Gi"),
            Some("20Gi"),
            json!({"ephemeral-volumes.io/s": "scratch"}),
        ),
    );
    assert_eq!(storage(&d, "s"), json!("20Gi"));
    let d = decide(
        &c,
        &two_containers(
            Some("5Gi"),
            Some("20Gi"),
            json!({"ephemeral-volumes.io/s": "profile=scratch,containers=a"}),
        ),
    );
    assert_eq!(storage(&d, "s"), json!("5Gi"));
    let d = decide(
        &c,
        &two_containers(
            None,
            Some("3Gi"),
            json!({"ephemeral-volumes.io/s": "scratch"}),
        ),
    );
    assert_eq!(storage(&d, "s"), json!("3Gi"));
    // As the container spells it (what Nextflow wrote, and what a policy can copy): a decimal
    // request stays decimal; of equal ones, the first.
    for (first, second, want) in [
        ("5Gi", "10G", "10G"),
        ("10240Mi", "10Gi", "10240Mi"),
        ("1500M", "1.5G", "1500M"),
    ] {
        let d = decide(
            &c,
            &two_containers(
                Some(first),
                Some(second),
                json!({"ephemeral-volumes.io/s": "scratch"}),
            ),
        );
        assert_eq!(storage(&d, "s"), json!(want), "{first} {second}");
    }
}

#[test]
fn size_request_without_a_request_or_over_policy_is_refused() {
    let c = cfg(
        "policy: {maxSize: {ephemeral: 15Gi}}\nrules: [{name: nf, podSelector: {matchLabels: {nextflow.io/app: nextflow}}, volumes: {work: \"type=ephemeral,size=request,mountPath=/work\"}}]",
    );
    for (p, code, want) in [
        (
            two_containers(
                None,
                None,
                json!({"ephemeral-volumes.io/s": "type=emptyDir,size=request,mountPath=/s"}),
            ),
            400,
            "size=request, but none of the containers a, b has an ephemeral-storage request",
        ),
        (
            two_containers(
                None,
                Some("1Gi"),
                json!({"ephemeral-volumes.io/s": "type=emptyDir,size=request,mountPath=/s,containers=a"}),
            ),
            400,
            "size=request, but container a has no ephemeral-storage request",
        ),
        (
            two_containers(Some("20Gi"), None, json!({})),
            403,
            "rule nf, volume work: size 20Gi exceeds policy.maxSize.ephemeral (15Gi)",
        ),
        (
            pod(
                json!({"ephemeral-volumes.io/s": "type=csi,driver=d.io,size=request,mountPath=/s"}),
            ),
            400,
            "size=request does not apply to a CSI inline volume",
        ),
    ] {
        let d = decide(&c, &p);
        assert_eq!(d.code, Some(code), "{want}: {}", d.message);
        assert!(d.message.contains(want), "want {want:?}, got {}", d.message);
    }
    // The rule's own request-sized volume within policy.
    let d = decide(&c, &two_containers(Some("10Gi"), None, json!({})));
    assert_eq!(d.verdict, "mutated", "{}", d.message);
}

// === Guards: every mistake is reported in one answer, naming what the user wrote ===

/// Each of a request's N independent mistakes is one reason of the one answer.
#[test]
fn a_request_with_n_mistakes_gets_n_reasons() {
    let c = Config::default();
    // One annotation, three mistakes.
    let d = decide(
        &c,
        &pod(
            json!({"ephemeral-volumes.io/a": "type=emptyDir,size=10GB,mountPath=scratch,medium=ram"}),
        ),
    );
    assert_eq!(d.code, Some(400));
    assert_eq!(
        d.message,
        "annotation ephemeral-volumes.io/a: medium \"ram\" is not one of \"\" (node disk), Memory, HugePages; \
         size: invalid quantity \"10GB\": unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or m); \
         did you mean 10G (powers of 1000) or 10Gi (powers of 1024)?; mountPath \"scratch\" must be an absolute path"
    );
    // Three annotations: two volumes at one path, a third for a container the pod lacks.
    let d = decide(
        &c,
        &pod(json!({
            "ephemeral-volumes.io/a": "type=emptyDir,mountPath=/scratch",
            "ephemeral-volumes.io/b": "type=emptyDir,mountPath=/scratch",
            "ephemeral-volumes.io/c": "type=emptyDir,mountPath=/c,containers=nope",
        })),
    );
    assert_eq!(d.code, Some(422));
    assert_eq!(
        d.message,
        "annotation ephemeral-volumes.io/c: container \"nope\" is not in the pod (its containers: main); \
         volume \"b\" (annotation ephemeral-volumes.io/b): container \"main\" already mounts \
         volume \"a\" (annotation ephemeral-volumes.io/a) at /scratch"
    );
    // Kinds mixed: every reason, the code of the worst (400).
    let d = decide(
        &c,
        &pod(json!({
            "ephemeral-volumes.io/a": "type=emptyDir,mountPath=/workspace",
            "ephemeral-volumes.io/b": "type=emptyDir,mountPath=/b,sizee=1Gi",
        })),
    );
    assert_eq!(d.code, Some(400));
    assert_eq!(
        d.message,
        "annotation ephemeral-volumes.io/b: unknown field \"sizee\": did you mean size?; \
         volume \"a\" (annotation ephemeral-volumes.io/a): container \"main\" already mounts \
         the pod's volume \"vol-1\" at /workspace"
    );
    // A refused annotation keeps its name: a rule's volume of that name is not injected
    // instead (nor blamed for a clash the author did not write).
    let ruled =
        cfg("rules:\n  - name: scratch\n    volumes:\n      s: type=emptyDir,mountPath=/s\n");
    let d = decide(
        &ruled,
        &pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=s"})),
    );
    assert_eq!(
        d.message,
        "annotation ephemeral-volumes.io/s: mountPath \"s\" must be an absolute path"
    );
    // A clash with a volume a rule injects names the rule.
    let d = decide(
        &ruled,
        &pod(json!({"ephemeral-volumes.io/x": "type=emptyDir,mountPath=/s"})),
    );
    assert_eq!(
        d.message,
        "volume \"x\" (annotation ephemeral-volumes.io/x): container \"main\" already mounts \
         volume \"s\" (rule scratch, volume s) at /s"
    );
}

#[test]
fn a_quoted_value_is_cut_never_the_reason() {
    // A CSI annotation of 683 bytes with `;` for `,`: the value is cut, the reason is whole.
    // (Before the separator hint the reason was `type "csi;driver=…"… is not one of …`.)
    let attrs: String = (0..40)
        .map(|i| format!(";attr.k{i:02}=value-{i:03}"))
        .collect();
    let value = format!("type=csi;driver=secrets-store.csi.k8s.io{attrs},mountPath=/m");
    let d = decide(
        &Config::default(),
        &pod(json!({"ephemeral-volumes.io/s": value})),
    );
    // The reason first and whole: the separators, and the fix, itself checked by the parser
    // (accepted: "did you mean"), quoted cut and without the attributes' values.
    let fixed = value.replace(';', ",");
    assert_eq!(
        d.message,
        format!(
            "annotation ephemeral-volumes.io/s: pairs are separated by commas, not by semicolons or spaces: did you mean {}?",
            evi::echo::quoted(&evi::echo::without_attributes(&fixed))
        )
    );
    assert!(d.message.contains("bytes in all)"), "{}", d.message);
    assert!(!d.message.contains("value-0"), "{}", d.message);
}

#[test]
fn near_misses_get_the_string_that_was_meant() {
    let c = Config::default();
    for (value, want) in [
        (
            "[type:emptyDir, mountPath:/scratch, size:1Gi]",
            "annotation ephemeral-volumes.io/s: \"[type:emptyDir, mountPath:/scratch, size:1Gi]\" looks like key:value pairs \
             (or a Groovy map written as a string); write key=value pairs separated by commas: \
             did you mean \"type=emptyDir,mountPath=/scratch,size=1Gi\"?",
        ),
        (
            "type:emptyDir,size:1Gi",
            "annotation ephemeral-volumes.io/s: \"type:emptyDir,size:1Gi\" looks like key:value pairs \
             (or a Groovy map written as a string); write key=value pairs separated by commas: \
             did you mean \"type=emptyDir,size=1Gi\"?",
        ),
        (
            "type=emptyDir,size:1Gi,mountPath=/s",
            "annotation ephemeral-volumes.io/s: \"size:1Gi\" is not a key=value pair: did you mean size=1Gi?",
        ),
        (
            "type=emptyDir,mountpath=/s",
            "annotation ephemeral-volumes.io/s: unknown field \"mountpath\": did you mean mountPath?",
        ),
        (
            "type=ephemeral,storageclass=gp3,size=1Gi,mountPath=/s",
            "annotation ephemeral-volumes.io/s: unknown field \"storageclass\": did you mean storageClass?",
        ),
    ] {
        let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": value})));
        assert_eq!((d.code, d.message.as_str()), (Some(400), want), "{value}");
    }
    // A profile name is still a profile name (no colon, no hint).
    let d = decide(&c, &pod(json!({"ephemeral-volumes.io/s": "ebs-200g"})));
    assert!(d.message.contains("profile \"ebs-200g\""), "{}", d.message);
}

#[test]
fn errors_name_the_field_as_written() {
    assert_eq!(
        config_errors(
            "profiles:\n  big:\n    mountPath: scratch\n    ephemeral:\n      volumeClaimTemplate:\n        spec:\n          accessModes: [ReadWriteOnce]\n          resources: {requests: {storage: 10GB}}\n  zero:\n    mountPath: /z\n    emptyDir: {sizeLimit: \"0\"}\n"
        ),
        "profiles.big: ephemeral.volumeClaimTemplate.spec.resources.requests.storage: invalid quantity \"10GB\": \
         unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E or m); did you mean 10G (powers of 1000) or 10Gi \
         (powers of 1024)?; mountPath \"scratch\" must be an absolute path\n\
         profiles.zero: emptyDir.sizeLimit \"0\" is zero, which is no limit at all; give a size above zero"
    );
    // A rule whose only volume is misspelt hears of the misspelling, not of an empty rule.
    assert_eq!(
        config_errors(
            "rules:\n  - name: r\n    volumes:\n      s: {type: emptyDir, mountpath: /s}\n"
        ),
        "rules[0] (r).volumes.s: unknown field \"mountpath\": did you mean mountPath?"
    );
    // No empty list in a message.
    let d = decide(
        &Config::default(),
        &pod(
            json!({"ephemeral-volumes.io/s": "type=emptyDir,mountPath=/s,initContainers=setup;fetch"}),
        ),
    );
    assert_eq!(
        d.message,
        "annotation ephemeral-volumes.io/s: init containers \"setup\", \"fetch\" are not in the pod (the pod has no init containers)"
    );
}

/// A pod that reaches the webhook hears of its near-miss keys in the API server's warnings.
#[test]
fn near_miss_keys_reach_the_api_servers_warnings() {
    let mut p = pod(json!({
        "ephemeral-volumes.io/a": "type=emptyDir,mountPath=/a,size=1Gi",
        "ephemeral-volume.io/b": "type=emptyDir,mountPath=/b,size=1Gi",
        "injector.ephemeral-volumes.io/injected": "a",
        "example.com/other": "x",
    }));
    p["metadata"]["labels"]["ephemeral-volumes.io/c"] = json!("shm");
    let d = decide(&Config::default(), &p);
    assert_eq!(d.verdict, "mutated");
    assert_eq!(
        d.warnings,
        [
            "annotation ephemeral-volume.io/b is not read: the annotation prefix is ephemeral-volumes.io; did you mean ephemeral-volumes.io/b?",
            "label ephemeral-volumes.io/c is not read: volumes are asked for with annotations; make it an annotation",
        ]
    );
}

/// The other ways a prefix is missed: without its domain, with another separator, alone, and
/// the webhook's own status prefix set by hand. Its own status annotations are not hinted at.
#[test]
fn every_kind_of_near_miss_key_is_named_with_the_key_that_was_meant() {
    let p = pod(json!({
        "ephemeral-volumes/a": "type=emptyDir,mountPath=/a",
        "ephemeral-volumes.io.b": "type=emptyDir,mountPath=/b",
        "ephemeral-volumes.io": "type=emptyDir,mountPath=/c",
        "injector.ephemeral-volumes.io/d": "type=emptyDir,mountPath=/d",
        "injector.ephemeral-volumes.io/injected": "x",
    }));
    let d = decide(&Config::default(), &p);
    assert_eq!(d.verdict, "unchanged");
    assert_eq!(
        d.warnings,
        [
            "annotation ephemeral-volumes.io is not read: it names no volume; write ephemeral-volumes.io/<volume name>",
            "annotation ephemeral-volumes.io.b is not read: the annotation prefix is ephemeral-volumes.io; did you mean ephemeral-volumes.io/b?",
            "annotation ephemeral-volumes/a is not read: the annotation prefix is ephemeral-volumes.io; did you mean ephemeral-volumes.io/a?",
            "annotation injector.ephemeral-volumes.io/d is not read: injector.ephemeral-volumes.io/ is the webhook's own status; did you mean ephemeral-volumes.io/d?",
        ]
    );
}

// === Guards: an audited rule, profile or default decides as enforced, and changes nothing ===

#[test]
fn audit_mode_decides_as_enforce_injects_nothing_and_refuses_nothing() {
    let audited = cfg(
        "profiles:\n  big:\n    mode: audit\n    mountPath: /big\n    emptyDir: {sizeLimit: 1Gi}\n\
         rules:\n  - name: scratch\n    mode: audit\n    namespaces: [nf]\n    volumes:\n      s: type=emptyDir,mountPath=/s,size=1Gi\n\
         policy:\n  maxSize: {emptyDir: 2Gi}\n",
    );
    // An audited rule: the pod is left as it is, and told what the rule would do.
    let d = decide(&audited, &pod(json!({})));
    assert_eq!(d.verdict, "unchanged");
    assert_eq!(d.warnings, ["audit (rule/scratch): would inject s"]);
    // With an enforced annotation: that one is injected, the rule's volume is not.
    let d = decide(
        &audited,
        &pod(json!({"ephemeral-volumes.io/a": "type=emptyDir,mountPath=/a,size=1Gi"})),
    );
    assert_eq!(d.verdict, "mutated");
    let names: Vec<&str> = d.mutated["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vol-1", "kube-api-access-x7k2p", "a"]);
    assert_eq!(d.warnings, ["audit (rule/scratch): would inject s"]);
    // An audited profile asked for by annotation, over policy: admitted, with the refusal it
    // would have met — credited to the profile that would be refused, not to the audited rule
    // beside it (which would only have injected).
    let d = decide(
        &audited,
        &pod(json!({"ephemeral-volumes.io/b": "profile=big,size=3Gi"})),
    );
    assert_eq!((d.verdict.as_str(), d.code), ("unchanged", None));
    assert_eq!(d.warnings.len(), 1);
    assert!(
        d.warnings[0].starts_with(
            "audit (profile/big): would refuse the pod (403): annotation ephemeral-volumes.io/b: size 3Gi exceeds policy.maxSize.emptyDir (2Gi)"
        ),
        "{:?}",
        d.warnings
    );
    // The whole configuration in audit (the default of every rule and profile), and a rule
    // that says enforce: only that one acts.
    let all = cfg(
        "mode: audit\nrules:\n  - name: kept\n    mode: enforce\n    volumes:\n      k: type=emptyDir,mountPath=/k,size=1Gi\n",
    );
    let d = decide(
        &all,
        &pod(json!({"ephemeral-volumes.io/x": "type=emptyDir,mountPath=scratch"})),
    );
    assert_eq!(d.verdict, "mutated");
    assert_eq!(d.mutated["spec"]["volumes"][2]["name"], "k");
    assert_eq!(
        d.warnings,
        [
            "audit (mode/audit): would refuse the pod (400): annotation ephemeral-volumes.io/x: mountPath \"scratch\" must be an absolute path"
        ]
    );
    // An inline volume under the default audit: its source is the mode, never the pod's own
    // annotation key (a metric label pods could multiply).
    let d = decide(
        &all,
        &pod(json!({"ephemeral-volumes.io/x-1234": "type=emptyDir,mountPath=/x,size=1Gi"})),
    );
    assert_eq!(d.warnings, ["audit (mode/audit): would inject x-1234"]);
    // The whole configuration in audit with an audited rule beside the pod's own annotation:
    // the refusal is the annotation's (the default's), never the rule's; a 400 for an
    // annotation that cannot be read too.
    let nextflow = cfg(
        "mode: audit\nrules:\n  - name: nextflow-scratch\n    volumes:\n      s: type=emptyDir,mountPath=/s,size=1Gi\n\
         policy:\n  maxSize: {emptyDir: 2Gi}\n",
    );
    for (value, code) in [
        ("type=emptyDir,mountPath=/x,size=10Gi", "403"),
        ("type=emptyDir,mountPath=/x,size=10Gii", "400"),
    ] {
        let d = decide(&nextflow, &pod(json!({"ephemeral-volumes.io/x": value})));
        assert_eq!(d.verdict, "unchanged");
        assert!(
            d.warnings[0].starts_with(&format!(
                "audit (mode/audit): would refuse the pod ({code})"
            )),
            "{value}: {:?}",
            d.warnings
        );
    }
    // A name that is no profile is an error of the annotation, audited under the default:
    // trying audit mode, a typo in a profile's name is told, not refused; the source is the
    // mode, not the name the pod chose (a metric label). Under enforce it is refused.
    let d = decide(
        &nextflow,
        &pod(json!({"ephemeral-volumes.io/x": "ebs-200gg"})),
    );
    assert_eq!((d.verdict.as_str(), d.code), ("unchanged", None));
    assert!(
        d.warnings[0].starts_with(
            "audit (mode/audit): would refuse the pod (400): annotation ephemeral-volumes.io/x: profile \"ebs-200gg\" is not defined"
        ),
        "{:?}",
        d.warnings
    );
    let enforced =
        cfg("profiles:\n  big:\n    mode: audit\n    mountPath: /big\n    emptyDir: {}\n");
    let d = decide(&enforced, &pod(json!({"ephemeral-volumes.io/x": "bigg"})));
    assert_eq!((d.verdict.as_str(), d.code), ("denied:invalid", Some(400)));
    // The rule alone: the would-be volume is the rule's.
    let d = decide(&nextflow, &pod(json!({})));
    assert_eq!(
        d.warnings,
        ["audit (rule/nextflow-scratch): would inject s"]
    );
    // Nothing audited touches this pod: no warning.
    let profile_only = cfg(
        "profiles:\n  big:\n    mode: audit\n    mountPath: /big\n    emptyDir: {sizeLimit: 1Gi}\n",
    );
    let d = decide(
        &profile_only,
        &pod(json!({"ephemeral-volumes.io/a": "type=emptyDir,mountPath=/a,size=1Gi"})),
    );
    assert_eq!((d.verdict.as_str(), d.warnings.len()), ("mutated", 0));
}

#[test]
fn a_mode_is_enforce_or_audit() {
    assert_eq!(
        config_errors(
            "mode: audti\nprofiles:\n  p:\n    mode: off\n    emptyDir: {}\nrules:\n  - name: r\n    mode: dry\n    volumes: {s: shm}\n"
        ),
        "mode: unknown variant `audti`, expected `enforce` or `audit`\n\
         rules[0]: unknown variant `dry`, expected `enforce` or `audit`\n\
         profiles.p.mode: unknown variant `off`, expected `enforce` or `audit`"
    );
}

// === Bounds: each checked before the work it caps; a pod that asks for nothing is never held to them ===

/// `count` volume annotations asking for a scratch directory each.
fn volume_annotations(count: usize) -> Value {
    Value::Object(
        (0..count)
            .map(|i| {
                (
                    format!("ephemeral-volumes.io/v{i}"),
                    json!(format!("type=emptyDir,size=1Gi,mountPath=/v{i}")),
                )
            })
            .collect(),
    )
}

#[test]
fn more_volume_annotations_than_the_built_in_bound_are_refused_before_any_is_read() {
    let cfg = Config::default();
    let at_the_bound = decide(&cfg, &pod(volume_annotations(64)));
    assert_eq!(at_the_bound.verdict, "mutated", "{}", at_the_bound.message);
    let mut past = volume_annotations(65);
    // An unreadable one among them is not read: the count alone refuses.
    past["ephemeral-volumes.io/v3"] = json!("type=nope");
    let d = decide(&cfg, &pod(past));
    assert_eq!(d.code, Some(403));
    assert_eq!(
        d.message,
        "65 annotations ephemeral-volumes.io/*: a pod may ask for at most 64 volumes"
    );
}

#[test]
fn max_volumes_per_pod_refuses_before_anything_is_resolved() {
    // Two requests, one naming a profile that does not exist: over the limit, the pod hears
    // of the limit (and of annotations it could not read), not of the profile.
    let cfg = cfg("policy: {maxVolumesPerPod: 1}");
    let d = decide(
        &cfg,
        &pod(json!({"ephemeral-volumes.io/a": "no-such-profile",
                    "ephemeral-volumes.io/b": "type=emptyDir,size=1Gi,mountPath=/b",
                    "ephemeral-volumes.io/c": "type=nope"})),
    );
    assert_eq!(d.code, Some(400), "{}", d.message);
    assert!(
        d.message
            .contains("2 volumes requested, policy.maxVolumesPerPod allows 1"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("annotation ephemeral-volumes.io/c"),
        "{}",
        d.message
    );
    assert!(!d.message.contains("no-such-profile"), "{}", d.message);
}

#[test]
fn a_patch_the_api_server_would_refuse_is_refused_first_naming_the_bound() {
    let containers: Vec<Value> = (0..5001)
        .map(|i| json!({"name": format!("c{i}"), "image": "busybox"}))
        .collect();
    let mut many = pod(json!({"ephemeral-volumes.io/s": "type=emptyDir,size=1Gi,mountPath=/s"}));
    many["spec"]["containers"] = Value::Array(containers.clone());
    many["spec"]["volumes"] = json!([]);
    let d = decide(&Config::default(), &many);
    // 5,001 mounts and the volume: within the API server's 10,000 operations.
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    // With a variable too, each container gets two operations: past it.
    many["metadata"]["annotations"]["ephemeral-volumes.io/s"] =
        json!("type=emptyDir,size=1Gi,mountPath=/s,env=TMPDIR");
    let d = decide(&Config::default(), &many);
    assert_eq!(d.code, Some(403));
    assert!(
        d.message
            .starts_with("the patch would have up to 10011 operations")
            && d.message
                .contains("more than the 10000 the API server accepts"),
        "{}",
        d.message
    );
    // Naming the containers keeps it small.
    many["metadata"]["annotations"]["ephemeral-volumes.io/s"] =
        json!("type=emptyDir,size=1Gi,mountPath=/s,env=TMPDIR,containers=c7");
    let d = decide(&Config::default(), &many);
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    assert_eq!(
        d.mutated["spec"]["containers"][7]["volumeMounts"][0]["mountPath"],
        "/s"
    );
    assert!(
        d.mutated["spec"]["containers"][8]
            .get("volumeMounts")
            .is_none()
    );
}

#[test]
fn a_long_containers_list_is_matched_by_name_and_a_missing_one_named_in_a_short_message() {
    let containers: Vec<Value> = (0..2000)
        .map(|i| json!({"name": format!("c{i}"), "image": "busybox"}))
        .collect();
    // As many names as a list may have (1,024), in the reverse of the pod's order.
    let listed: Vec<String> = (0..1024).rev().map(|i| format!("c{i}")).collect();
    let mut p = pod(json!({"ephemeral-volumes.io/s":
        format!("type=emptyDir,size=1Gi,mountPath=/s,containers={}", listed.join(";"))}));
    p["spec"]["containers"] = Value::Array(containers);
    let d = decide(&Config::default(), &p);
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    assert_eq!(
        d.mutated["spec"]["containers"][1023]["volumeMounts"][0]["name"],
        "s"
    );
    assert!(
        d.mutated["spec"]["containers"][1024]
            .get("volumeMounts")
            .is_none()
    );
    // Names the pod does not have: the first ones named, the rest counted, and its own too.
    let missing: Vec<String> = (0..500).map(|i| format!("x{i}")).collect();
    p["metadata"]["annotations"]["ephemeral-volumes.io/s"] = json!(format!(
        "type=emptyDir,size=1Gi,mountPath=/s,containers={}",
        missing.join(";")
    ));
    let d = decide(&Config::default(), &p);
    assert_eq!(d.code, Some(422));
    assert!(
        d.message.len() < 1000,
        "{} bytes: {}",
        d.message.len(),
        d.message
    );
    assert!(d.message.contains("\"x0\", \"x1\""), "{}", d.message);
    assert!(
        d.message.contains(" and 480 more are not in the pod"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("c0, c1") && d.message.contains("and 1980 more"),
        "{}",
        d.message
    );
}

#[test]
fn warnings_are_bounded_however_many_near_misses_a_pod_has() {
    let mut annotations: serde_json::Map<String, Value> = (0..500)
        .map(|i| (format!("ephemeral-volume.io/v{i}"), json!("x")))
        .collect();
    annotations.insert(
        "ephemeral-volumes.io/s".into(),
        json!("type=emptyDir,size=1Gi,mountPath=/s"),
    );
    let d = decide(&Config::default(), &pod(Value::Object(annotations)));
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    assert_eq!(d.warnings.len(), 16, "{:?}", d.warnings);
    assert!(
        d.warnings.iter().all(|w| w.len() <= 600),
        "{:?}",
        d.warnings
    );
    assert!(
        d.warnings.iter().any(
            |w| w.contains("more annotations whose prefix is a near miss")
                || w.contains("more warnings")
        ),
        "{:?}",
        d.warnings
    );
}

#[test]
fn a_label_selected_override_does_not_hold_back_rule_volumes_or_pods_that_ask_for_nothing() {
    // docs/configuration.md's kind of override, with no cluster access: the namespace's labels
    // are not known.
    let cfg = cfg(
        "rules:\n  - name: scratch\n    volumes:\n      s: type=emptyDir,size=1Gi,mountPath=/s\n\
         policyOverrides:\n  - name: team\n    namespaceSelector: {matchLabels: {team: a}}\n    policy: {maxVolumesPerPod: 1}\n",
    );
    // Rule volumes only: the admin's, decided under the top-level policy.
    let d = decide(&cfg, &pod(json!({})));
    assert_eq!(d.verdict, "mutated", "{}", d.message);
    assert_eq!(volume(&d.mutated, "s")["emptyDir"]["sizeLimit"], "1Gi");
    // An annotation of the pod's own still waits for the labels.
    let d = decide(
        &cfg,
        &pod(json!({"ephemeral-volumes.io/t": "type=emptyDir,size=1Gi,mountPath=/t"})),
    );
    assert_eq!(d.code, Some(422));
    assert!(d.message.contains("try again in a moment"), "{}", d.message);
    // A pod that matches no rule and asks for nothing.
    let quiet = self::cfg(
        "policyOverrides:\n  - name: team\n    namespaceSelector: {matchLabels: {team: a}}\n    policy: {maxVolumesPerPod: 1}\n",
    );
    let d = decide(&quiet, &pod(json!({})));
    assert_eq!(d.verdict, "unchanged", "{}", d.message);
}
