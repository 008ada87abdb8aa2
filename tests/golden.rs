#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! Golden tests: realistic inputs through the engine (`mutate`'s library path), compared with
//! the files in `tests/golden/`. `UPDATE_GOLDEN=1 cargo test --test golden` rewrites them;
//! review the diff. CI validates every `*.out.json` against the Kubernetes schema.

use std::path::{Path, PathBuf};

use evi::{
    cluster::{ClusterState, Known},
    config::Config,
    workload,
};
use serde_json::{Value, json};

struct Case {
    name: &'static str,
    input: &'static str,
    config: &'static str,
    /// CSIDriver and StorageClass objects for the cluster checks (`mutate --cluster`); none
    /// when empty.
    cluster: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "cluster-nextflow-job-mode",
        input: "nextflow-job-mode.json",
        config: "config.yaml",
        cluster: "cluster.yaml",
    },
    Case {
        name: "cluster-missing",
        input: "cluster-missing.yaml",
        config: "",
        cluster: "cluster.yaml",
    },
    Case {
        name: "cluster-missing-warn",
        input: "cluster-missing.yaml",
        config: "config-cluster-warn.yaml",
        cluster: "cluster.yaml",
    },
    Case {
        name: "nextflow-pod-mode",
        input: "nextflow-pod-mode.json",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "nextflow-job-mode",
        input: "nextflow-job-mode.json",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "rule-only-job-pod",
        input: "rule-only-job-pod.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "multi-container",
        input: "multi-container.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "job",
        input: "job.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "cronjob",
        input: "cronjob.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "deployment",
        input: "deployment.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "statefulset",
        input: "statefulset.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "daemonset",
        input: "daemonset.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "replicaset",
        input: "replicaset.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "no-request",
        input: "no-request.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "conflict-volume",
        input: "conflict-volume.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "conflict-mountpath",
        input: "conflict-mountpath.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "policy-denied",
        input: "policy-denied.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "invalid-annotation",
        input: "invalid-annotation.yaml",
        config: "config.yaml",
        cluster: "",
    },
    Case {
        name: "invalid-annotation-warn",
        input: "invalid-annotation.yaml",
        config: "config-warn.yaml",
        cluster: "",
    },
    Case {
        name: "nextflow-pod-mode-defaults",
        input: "nextflow-pod-mode.json",
        config: "",
        cluster: "",
    },
];

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
}

fn golden(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(p)
}

fn check_golden(path: &Path, actual: &Value) {
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        serde_json::from_str::<Value>(&expected).unwrap(),
        *actual,
        "{} differs from the engine's output",
        path.display()
    );
}

/// The typed k8s-openapi object for the kind must accept the result.
fn deserializes_as_its_kind(v: &Value) {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    let kind = v["kind"].as_str().unwrap();
    let r = match kind {
        "Pod" => serde_json::from_value::<core::Pod>(v.clone()).map(|_| ()),
        "Job" => serde_json::from_value::<batch::Job>(v.clone()).map(|_| ()),
        "CronJob" => serde_json::from_value::<batch::CronJob>(v.clone()).map(|_| ()),
        "Deployment" => serde_json::from_value::<apps::Deployment>(v.clone()).map(|_| ()),
        "StatefulSet" => serde_json::from_value::<apps::StatefulSet>(v.clone()).map(|_| ()),
        "DaemonSet" => serde_json::from_value::<apps::DaemonSet>(v.clone()).map(|_| ()),
        "ReplicaSet" => serde_json::from_value::<apps::ReplicaSet>(v.clone()).map(|_| ()),
        other => panic!("unexpected kind {other}"),
    };
    r.unwrap_or_else(|e| panic!("{kind} does not deserialize: {e}"));
}

#[test]
fn golden_outputs_match_and_a_second_pass_changes_nothing() {
    for case in CASES {
        let cfg = if case.config.is_empty() {
            Config::default()
        } else {
            Config::load(&data(case.config)).unwrap()
        };
        let cluster = (!case.cluster.is_empty()).then(|| {
            ClusterState::parse(&std::fs::read_to_string(data(case.cluster)).unwrap()).unwrap()
        });
        let known = cluster.as_ref().map(|state| Known {
            state,
            complete: true,
        });
        let text = std::fs::read_to_string(data(&format!("inputs/{}", case.input))).unwrap();
        let [object] = <[_; 1]>::try_from(workload::parse_objects(&text).unwrap())
            .expect("one object per golden input");
        let preview = workload::preview(&cfg, known, &object, None).unwrap();
        let o = &preview.outcome;
        let summary = json!({
            "allowed": o.allowed(),
            "code": o.denial.as_ref().map(|d| d.code()),
            "message": o.denial.as_ref().map(|d| d.message.clone()),
            "warnings": o.warnings,
            "patch": o.patch,
        });
        check_golden(&golden(&format!("{}.json", case.name)), &summary);
        if !o.allowed() {
            assert!(
                o.patch.is_empty(),
                "{}: a denial carries no patch",
                case.name
            );
            continue;
        }
        check_golden(
            &golden(&format!("{}.out.json", case.name)),
            &preview.mutated,
        );
        deserializes_as_its_kind(&preview.mutated);

        let again = workload::preview(&cfg, known, &preview.mutated, None).unwrap();
        assert!(
            again.outcome.allowed(),
            "{}: second pass denied: {:?}",
            case.name,
            again.outcome.denial
        );
        assert!(
            again.outcome.patch.is_empty(),
            "{}: second pass is not idempotent: {:?}",
            case.name,
            again.outcome.patch
        );
    }
}
