#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! Golden tests: one directory of `tests/golden/` per case, one test per directory, through
//! the engine (`mutate`'s library path). A case is:
//!
//! - `input.yaml` or `input.json`: one object (a Pod, or a workload with a pod template);
//! - `config.yaml` (optional): the configuration; without one, `tests/data/config.yaml`;
//! - `cluster.yaml` (optional): CSIDriver and StorageClass objects for the cluster checks;
//!   without one, no checks;
//! - `decision.json`: allowed, code, message, warnings and patch;
//! - `output.json`: the object as the patch leaves it (when the pod is admitted).
//!
//! A new case is a new directory with its input (and a config if it needs its own):
//! `UPDATE_GOLDEN=1 cargo test --test golden` writes the expectations; review them. CI
//! validates every `output.json` against the Kubernetes schema, and a second pass over each
//! output must change nothing.

use std::path::{Path, PathBuf};

use evi::{
    cli::preview,
    cluster::{ClusterState, KnownCluster},
    config::Config,
};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::{Value, json};

fn main() {
    let args = Arguments::from_args();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases under {}", root.display());
    let trials = cases
        .into_iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            Trial::test(name, move || run(&dir).map_err(Failed::from))
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

fn run(dir: &Path) -> Result<(), String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let config = dir.join("config.yaml");
    let config = if config.exists() {
        config
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config.yaml")
    };
    let cfg = Config::load(&config).map_err(|e| format!("{}: {e}", config.display()))?;
    let cluster = dir.join("cluster.yaml");
    let cluster = match cluster.exists() {
        true => Some(ClusterState::parse(&read(&cluster)?).map_err(|e| e.to_string())?),
        false => None,
    };
    let known = cluster.as_ref().map(|state| KnownCluster {
        state,
        complete: true,
    });
    let input = ["input.yaml", "input.json"]
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.exists())
        .ok_or_else(|| format!("{}: no input.yaml or input.json", dir.display()))?;
    let objects = preview::parse_objects(&read(&input)?).map_err(|e| e.to_string())?;
    let [object] = <[_; 1]>::try_from(objects).map_err(|_| "one object per input".to_owned())?;

    let preview = preview::preview(&cfg, known, &object, None).map_err(|e| e.to_string())?;
    let d = &preview.decision;
    let summary = json!({
        "allowed": d.allowed(),
        "code": d.denial().map(|denial| denial.code()),
        "message": d.denial().map(|denial| denial.message.clone()),
        "warnings": d.warnings(),
        "patch": d.patch().map_or(json!([]), |p| serde_json::to_value(p).unwrap()),
    });
    check_golden(&dir.join("decision.json"), &summary)?;
    if !d.allowed() {
        return Ok(());
    }
    check_golden(&dir.join("output.json"), &preview.mutated)?;
    deserializes_as_its_kind(&preview.mutated)?;

    let again = preview::preview(&cfg, known, &preview.mutated, None).map_err(|e| e.to_string())?;
    match again.decision.patch() {
        _ if !again.decision.allowed() => Err(format!("second pass denied: {:?}", again.decision)),
        Some(p) => Err(format!("second pass is not idempotent: {p:?}")),
        None => Ok(()),
    }
}

fn check_golden(path: &Path, actual: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &text).unwrap();
        return Ok(());
    }
    let expected = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    })?;
    let expected: Value =
        serde_json::from_str(&expected).map_err(|e| format!("{}: {e}", path.display()))?;
    if expected != *actual {
        return Err(format!(
            "{} differs from the engine's output:\n{text}",
            path.display()
        ));
    }
    Ok(())
}

/// The typed k8s-openapi object for the kind must accept the result.
fn deserializes_as_its_kind(v: &Value) -> Result<(), String> {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    let kind = v["kind"].as_str().unwrap_or_default();
    let r = match kind {
        "Pod" => serde_json::from_value::<core::Pod>(v.clone()).map(|_| ()),
        "Job" => serde_json::from_value::<batch::Job>(v.clone()).map(|_| ()),
        "CronJob" => serde_json::from_value::<batch::CronJob>(v.clone()).map(|_| ()),
        "Deployment" => serde_json::from_value::<apps::Deployment>(v.clone()).map(|_| ()),
        "StatefulSet" => serde_json::from_value::<apps::StatefulSet>(v.clone()).map(|_| ()),
        "DaemonSet" => serde_json::from_value::<apps::DaemonSet>(v.clone()).map(|_| ()),
        "ReplicaSet" => serde_json::from_value::<apps::ReplicaSet>(v.clone()).map(|_| ()),
        other => return Err(format!("unexpected kind {other}")),
    };
    r.map_err(|e| format!("{kind} does not deserialize: {e}"))
}
