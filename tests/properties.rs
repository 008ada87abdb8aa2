#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! Property tests: for generated pods and annotations, through the AdmissionReview codec,
//! every admitted patch applies, the result is a valid Pod with no duplicate volume names or
//! mount paths, and a second pass returns no patch.

mod common;

use std::collections::BTreeSet;

use evi::{config::Config, review};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

const NAMES: [&str; 5] = ["scratch", "shm", "secrets", "cache", "work-tmp"];
const PATHS: [&str; 6] = [
    "/scratch",
    "/dev/shm",
    "/mnt/secrets",
    "/data/0",
    "/tmp/x",
    "/scratch/",
];

fn annotation_value() -> impl Strategy<Value = String> {
    let path = prop::sample::select(PATHS.to_vec());
    let size = prop::sample::select(vec!["", "1Gi", "512Mi", "2G", "1.5Gi", "300Gi"]);
    let target = prop::sample::select(vec![
        "",
        ",containers=c0",
        ",containers=c1;c0",
        ",initContainers=true",
        ",containers=nope",
    ]);
    let env = prop::sample::select(vec![
        "",
        ",env=TMPDIR",
        ",env=TMPDIR;SCRATCH",
        ",env=NXF_OWNER",
    ]);
    let source = prop::sample::select(vec![
        "type=emptyDir".to_owned(),
        "type=emptyDir,medium=Memory".to_owned(),
        "type=ephemeral,storageClass=gp3".to_owned(),
        "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=db,readOnly=true"
            .to_owned(),
        "profile=shm".to_owned(),
        "shm".to_owned(),
        "type=emptyDir,sizee=1Gi".to_owned(),
    ]);
    (source, path, size, target, env).prop_map(|(source, path, size, target, env)| {
        if !source.contains('=') {
            return source;
        }
        let size = if size.is_empty() || source.starts_with("type=csi") {
            String::new()
        } else {
            format!(",size={size}")
        };
        let size = if source.starts_with("type=ephemeral") && size.is_empty() {
            ",size=10Gi".into()
        } else {
            size
        };
        format!("{source},mountPath={path}{size}{target}{env}")
    })
}

/// A volume named `cache` already in the pod, of a kind or with settings no generated request
/// (and no default the test configuration adds) matches: never to be reused.
const EXISTING_CACHE: [&str; 5] = [
    r#"{"emptyDir": {}}"#,
    r#"{"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}"#,
    r#"{"persistentVolumeClaim": {"claimName": "data"}}"#,
    r#"{"hostPath": {"path": "/var/lib/data"}}"#,
    r#"{"csi": {"driver": "other.csi.k8s.io"}}"#,
];

fn container(name: String, mounts: Vec<usize>, env: bool, sidecar: bool) -> Value {
    let mut c = json!({
        "name": name,
        "image": "busybox:1.36",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"memory": "1Gi"}}
    });
    if !mounts.is_empty() {
        c["volumeMounts"] = mounts
            .iter()
            .map(|i| json!({"name": format!("vol-{i}"), "mountPath": format!("/data/{i}")}))
            .collect();
    }
    if env {
        c["env"] = json!([{"name": "NXF_OWNER", "value": "1000:1000"}]);
    }
    if sidecar {
        c["restartPolicy"] = json!("Always");
    }
    c
}

prop_compose! {
    fn pod()(
        n_containers in 1usize..3,
        n_init in 0usize..3,
        n_volumes in 0usize..3,
        env in any::<bool>(),
        generate_name in any::<bool>(),
        annotations in prop::collection::btree_map(prop::sample::select(NAMES.to_vec()), annotation_value(), 0..4),
        with_annotations_map in any::<bool>(),
        existing_same_name in prop::option::of(prop::sample::select(EXISTING_CACHE.to_vec())),
    ) -> Value {
        let mounts: Vec<usize> = (0..n_volumes).collect();
        let containers: Vec<Value> = (0..n_containers).map(|i| container(format!("c{i}"), mounts.clone(), env, false)).collect();
        let inits: Vec<Value> = (0..n_init).map(|i| container(format!("init{i}"), vec![], false, i == 1)).collect();
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": "nf", "labels": {"nextflow.io/app": "nextflow"}},
            "spec": {"containers": containers, "restartPolicy": "Never"}
        });
        if generate_name {
            pod["metadata"]["generateName"] = json!("nf-abc-");
        } else {
            pod["metadata"]["name"] = json!("nf-abc-12345");
        }
        if !inits.is_empty() {
            pod["spec"]["initContainers"] = json!(inits);
        }
        let mut volumes: Vec<Value> = (0..n_volumes)
            .map(|i| json!({"name": format!("vol-{i}"), "persistentVolumeClaim": {"claimName": format!("pvc-{i}")}}))
            .collect();
        if let Some(existing) = existing_same_name {
            let mut v: Value = serde_json::from_str(existing).unwrap();
            v["name"] = json!("cache");
            volumes.push(v);
        }
        if !volumes.is_empty() {
            pod["spec"]["volumes"] = json!(volumes);
        }
        if with_annotations_map || !annotations.is_empty() {
            pod["metadata"]["annotations"] = annotations
                .into_iter()
                .map(|(k, v)| (format!("ephemeral-volumes.io/{k}"), Value::String(v)))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        pod
    }
}

fn config() -> Config {
    Config::parse(
        r#"
profiles:
  shm: {mountPath: /dev/shm, emptyDir: {medium: Memory, sizeLimit: 1Gi}}
rules:
  - name: nf
    podSelector: {matchLabels: {nextflow.io/app: nextflow}}
    volumes:
      work-tmp: "type=emptyDir,mountPath=/work-tmp,size=5Gi"
policy:
  maxSize: {emptyDir: 100Gi, memory: 2Gi}
  requireSizeLimit: true
  defaultSizeLimit: 1Gi
"#,
    )
    .unwrap()
}

fn run(cfg: &Config, pod: &Value) -> (Value, Value) {
    let request = common::review_for(pod, "nf", "1b7d6e9a-0000-4000-8000-000000000001");
    let body = serde_json::to_vec(&request).unwrap();
    let handled = review::handle(cfg, None, review::Endpoint::Mutate, &body).unwrap();
    let response: Value = serde_json::from_slice(&handled.body).unwrap();
    let mutated = common::apply_response(&request, &response, pod);
    (response, mutated)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn admitted_patches_apply_and_are_idempotent(pod in pod()) {
        let cfg = config();
        let (response, mutated) = run(&cfg, &pod);
        let r = &response["response"];
        let asks_for_cache = pod["metadata"]["annotations"].get("ephemeral-volumes.io/cache").is_some();
        let had_cache = pod["spec"]["volumes"].as_array().is_some_and(|v| v.iter().any(|v| v["name"] == "cache"));
        if r["allowed"] == json!(false) {
            let code = r["status"]["code"].as_u64().unwrap();
            prop_assert!([400, 403, 422].contains(&code), "code {code}");
            let message = r["status"]["message"].as_str().unwrap();
            // Every denial names what it is about: an annotation, a volume or a container.
            // Every denial names what it is about: one of the pod's own annotations, the rule
            // that asked for a volume, or a volume the pod asked for (a clash with the pod).
            let annotations = pod["metadata"]["annotations"].as_object().into_iter().flatten();
            let origins: Vec<String> = annotations
                .flat_map(|(k, _)| {
                    let name = k.trim_start_matches("ephemeral-volumes.io/");
                    [format!("annotation {k}"), format!("volume {name:?}")]
                })
                .chain(["rule \"nf\"".to_owned(), "volume \"work-tmp\"".to_owned()])
                .collect();
            prop_assert!(origins.iter().any(|o| message.contains(o.as_str())), "names no annotation or rule of the pod: {message}");
            prop_assert!(r.get("patch").is_none());
            return Ok(());
        }
        // A volume already in the pod under the requested name is never mounted as if injected.
        if had_cache {
            prop_assert!(!asks_for_cache, "admitted a request for cache over a different existing volume: {r}");
            for c in mutated["spec"]["containers"].as_array().unwrap() {
                let mounts = c["volumeMounts"].as_array().map(Vec::as_slice).unwrap_or_default();
                prop_assert!(!mounts.iter().any(|m| m["name"] == "cache"), "existing cache volume mounted");
            }
        }
        let typed: Pod = serde_json::from_value(mutated.clone()).map_err(|e| TestCaseError::fail(format!("not a Pod: {e}\n{mutated}")))?;
        let spec = typed.spec.unwrap();
        let names: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        prop_assert_eq!(names.len(), unique.len(), "duplicate volume names: {:?}", names);
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            let paths: Vec<String> = c.volume_mounts.iter().flatten().map(|m| m.mount_path.trim_end_matches('/').to_owned()).collect();
            let unique: BTreeSet<&String> = paths.iter().collect();
            prop_assert_eq!(paths.len(), unique.len(), "duplicate mountPaths in {}: {:?}", c.name, paths);
            for m in c.volume_mounts.iter().flatten() {
                prop_assert!(names.contains(&m.name.as_str()), "mount of a missing volume {}", m.name);
            }
            let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
            let unique_env: BTreeSet<&&str> = env.iter().collect();
            prop_assert_eq!(env.len(), unique_env.len(), "duplicate env in {}", c.name);
        }
        let (again, twice) = run(&cfg, &mutated);
        prop_assert_eq!(&again["response"]["allowed"], &json!(true));
        prop_assert!(again["response"].get("patch").is_none(), "second pass patched: {}", again);
        prop_assert_eq!(twice, mutated);
    }

    /// The workload webhook decides on a template exactly as the pod webhook on its pod: the
    /// same verdict, status code, message and warnings, and never a patch.
    #[test]
    fn a_workload_gets_the_verdict_of_its_pod(pod in pod(), kind in prop::sample::select(evi::workload::WORKLOADS.map(|w| w.kind).to_vec())) {
        let cfg = config();
        let (pod_response, _) = run(&cfg, &pod);
        let workload = common::workload_of(kind, &pod);
        let body = serde_json::to_vec(&common::workload_review(&workload, None, "nf")).unwrap();
        let handled = review::handle(&cfg, None, review::Endpoint::Validate, &body).unwrap();
        let response: Value = serde_json::from_slice(&handled.body).unwrap();
        let (p, w) = (&pod_response["response"], &response["response"]);
        prop_assert_eq!(&w["allowed"], &p["allowed"], "{} vs {}", w, p);
        prop_assert_eq!(&w["status"], &p["status"]);
        prop_assert_eq!(&w["warnings"], &p["warnings"]);
        prop_assert!(w.get("patch").is_none() && w.get("patchType").is_none(), "{}", w);
    }

    #[test]
    fn arbitrary_annotation_values_never_panic(value in ".{0,120}") {
        let pod = json!({
            "metadata": {"annotations": {"ephemeral-volumes.io/x": value}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        });
        let (response, _) = run(&config(), &pod);
        prop_assert!(response["response"]["allowed"].is_boolean());
    }
}
