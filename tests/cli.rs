#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should stop loudly
//! The `mutate` and `check-config` commands as a user runs them: exit codes, output formats,
//! stdin, and messages on stderr.

use std::{
    io::Write,
    path::Path,
    process::{Command, Output, Stdio},
};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ephemeral-volume-injector"))
}

/// `serve` on loopback ports the kernel picks.
fn serve_on_loopback() -> Command {
    let mut c = bin();
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    c
}

/// The input of a golden case.
fn golden_input(case: &str, ext: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case)
        .join(format!("input.{ext}"))
        .display()
        .to_string()
}

fn data(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(p)
        .display()
        .to_string()
}

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn mutate_prints_the_patch_the_mutated_object_in_json_and_yaml() {
    let input = golden_input("deployment", "yaml");
    let out = run(&["mutate", "-f", &input, "-o", "patch"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let patch: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(patch[0]["path"], "/spec/template/spec/volumes");

    let out = run(&["mutate", "-f", &input, "-o", "json"], None);
    let obj: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        obj["spec"]["template"]["spec"]["volumes"][0]["name"],
        "scratch"
    );

    let out = run(&["mutate", "-f", &input], None);
    assert_eq!(out.status.code(), Some(0));
    let obj: Value = yaml_serde::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(
        obj["spec"]["template"]["metadata"]["annotations"]["injector.ephemeral-volumes.io/injected"],
        "scratch"
    );
}

#[test]
fn mutate_reads_stdin_and_prints_an_empty_patch_when_nothing_is_asked() {
    let pod = std::fs::read_to_string(golden_input("no-request", "yaml")).unwrap();
    let out = run(&["mutate", "-f", "-", "-o", "patch"], Some(&pod));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout).trim(), "[]");
}

#[test]
fn mutate_exits_1_with_the_reason_when_denied() {
    let out = run(
        &[
            "mutate",
            "--config",
            &data("config.yaml"),
            "-f",
            &golden_input("policy-denied", "yaml"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("denied (403)"), "{err}");
    assert!(
        err.contains("annotation ephemeral-volumes.io/fast"),
        "{err}"
    );
}

#[test]
fn mutate_matches_rules_in_the_given_namespace() {
    let input = golden_input("rule-only-job-pod", "yaml");
    let cfg = data("config.yaml");
    let out = run(
        &["mutate", "--config", &cfg, "-f", &input, "-o", "patch"],
        None,
    );
    assert_eq!(
        serde_json::from_slice::<Vec<Value>>(&out.stdout)
            .unwrap()
            .len(),
        3
    );
    let out = run(
        &[
            "mutate",
            "--config",
            &cfg,
            "-n",
            "elsewhere",
            "-f",
            &input,
            "-o",
            "patch",
        ],
        None,
    );
    assert_eq!(text(&out.stdout).trim(), "[]");
    // Warnings go to stderr, the result to stdout.
    let out = run(&["mutate", "--config", &cfg, "-f", &input], None);
    assert!(
        text(&out.stderr).contains("warning: volume scratch: container"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn mutate_exits_2_on_bad_input_configuration_or_usage() {
    let cases: Vec<(Vec<String>, Option<&str>, &str)> = vec![
        (
            vec!["mutate".into(), "-f".into(), "-".into()],
            Some("kind: ["),
            "cannot parse",
        ),
        (
            vec!["mutate".into(), "-f".into(), "-".into()],
            Some("a: 1"),
            "no apiVersion/kind",
        ),
        (
            vec!["mutate".into(), "-f".into(), "-".into()],
            Some("apiVersion: apps/v1\nkind: Deployment\nspec: {}\n"),
            "no pod template at /spec/template",
        ),
        (
            vec!["mutate".into(), "-f".into(), "/nonexistent.yaml".into()],
            None,
            "cannot read /nonexistent.yaml",
        ),
        (
            vec![
                "mutate".into(),
                "--config".into(),
                golden_input("job", "yaml"),
                "-f".into(),
                golden_input("job", "yaml"),
            ],
            None,
            "configuration",
        ),
        (
            vec![
                "mutate".into(),
                "-f".into(),
                golden_input("job", "yaml"),
                "-o".into(),
                "xml".into(),
            ],
            None,
            "invalid value 'xml'",
        ),
        (vec!["mutate".into()], None, "<FILE>"),
        (vec!["frobnicate".into()], None, "unrecognized subcommand"),
    ];
    for (args, stdin, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args, stdin);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(want),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn check_config_lists_every_error() {
    let out = run(&["check-config", &data("config.yaml")], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The counts are the file's, read independently of the command.
    let file: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(data("config.yaml")).unwrap()).unwrap();
    let (profiles, rules) = (
        file["profiles"].as_object().unwrap().len(),
        file["rules"].as_array().unwrap().len(),
    );
    let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    let expected = format!(
        "valid ({}, {}, annotation prefix ephemeral-volumes.io)",
        plural(profiles, "profile"),
        plural(rules, "rule")
    );
    assert!(
        text(&out.stdout).contains(&expected),
        "{}",
        text(&out.stdout)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "profiles:\n  a: {mountPath: /a, emptyDir: {sizeLimt: 1Gi}}\npolicy:\n  maxSize: {memory: 1GB}\n",
    )
    .unwrap();
    let out = run(&["check-config", bad.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("profiles.a: unknown field emptyDir.sizeLimt"),
        "{err}"
    );
    assert!(
        err.contains("policy.maxSize.memory: invalid quantity \"1GB\""),
        "{err}"
    );

    let out = run(&["check-config", "/nonexistent.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
}

/// What a platform engineer has in hand: the chart's values file, or the ConfigMap `helm
/// template` prints among the other manifests; check-config says which it read and lists every
/// problem in it.
#[test]
fn check_config_reads_a_values_file_and_a_rendered_configmap() {
    let dir = tempfile::tempdir().unwrap();
    let config = "profiles:\n  scratch: {mountPath: /scratch, emptyDir: {sizeLimt: 1Gi}}\nrules:\n  - {namespaces: [nf], volumes: {s: {profile: scratch, sizee: 1Gi}}}\n";
    let indent = |n: usize| -> String {
        config
            .lines()
            .map(|l| format!("{}{l}\n", " ".repeat(n)))
            .collect()
    };
    let values = dir.path().join("my-values.yaml");
    std::fs::write(&values, format!("replicaCount: 2\nconfig:\n{}", indent(2))).unwrap();
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(
        &rendered,
        format!(
            "---\n# Source: ephemeral-volume-injector/templates/service.yaml\napiVersion: v1\nkind: Service\nmetadata: {{name: evi}}\n---\n# Source: ephemeral-volume-injector/templates/configmap.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: evi-config\ndata:\n  config.yaml: |\n{}",
            indent(4)
        ),
    )
    .unwrap();
    for (file, found) in [
        (&values, "the `config` value of a Helm values file"),
        (
            &rendered,
            "data.\"config.yaml\" of ConfigMap evi-config (document 2)",
        ),
    ] {
        let out = run(&["check-config", file.to_str().unwrap()], None);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!(
                "{}: {found}: invalid configuration\n",
                file.display()
            )),
            "{err}"
        );
        assert!(
            err.contains("profiles.scratch: unknown field emptyDir.sizeLimt"),
            "{err}"
        );
        assert!(err.contains("rules[0]: missing field name"), "{err}");
        assert!(err.contains("sizee"), "{err}");
        // Nothing of the wrapping is taken for a configuration field.
        for wrapper in [
            "replicaCount",
            "apiVersion",
            "\"data\"",
            "unknown field config",
        ] {
            assert!(!err.contains(wrapper), "{wrapper}: {err}");
        }
    }
    let good = dir.path().join("good-values.yaml");
    std::fs::write(
        &good,
        "config:\n  profiles:\n    scratch: {mountPath: /scratch, emptyDir: {sizeLimit: 1Gi}}\n",
    )
    .unwrap();
    let out = run(&["check-config", good.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout)
            .contains("the `config` value of a Helm values file: valid (1 profile, 0 rules"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn check_install_without_a_cluster_or_with_a_bad_kubeconfig_exits_2_saying_so() {
    let home = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["check-install"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("check-install: no cluster to check: no --kubeconfig, no KUBECONFIG, no ~/.kube/config, and not running in a pod"),
        "{err}"
    );
    let out = run(
        &["check-install", "--kubeconfig", "/nonexistent/kubeconfig"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("check-install: kubeconfig /nonexistent/kubeconfig:"),
        "{err}"
    );
}

/// A kubeconfig whose API server is port 1 on loopback: nothing listens, the connection is
/// refused at once.
const UNREACHABLE_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
    clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n\
    users: [{name: u, user: {token: t}}]\n\
    contexts: [{name: c, context: {cluster: k, user: u}}]\n";

/// `policies --apply` and `--delete` find their cluster as `check-install` does: exit 2 without
/// one or with a kubeconfig that cannot be read, exit 1 when the API server does not answer,
/// after naming the cluster they tried.
#[test]
fn policies_apply_and_delete_find_their_cluster_as_check_install_does() {
    let dir = tempfile::tempdir().unwrap();
    let policies = |extra: &[&str], kubeconfig: Option<&Path>| {
        let mut cmd = bin();
        cmd.arg("policies")
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", dir.path());
        match kubeconfig {
            Some(p) => cmd.env("KUBECONFIG", p),
            None => cmd.env_remove("KUBECONFIG"),
        };
        let out = cmd.output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    for action in ["--apply", "--delete"] {
        let (code, _, err) = policies(&[action], None);
        assert_eq!(code, Some(2), "{action}: {err}");
        assert!(
            err.contains("policies: no cluster: no --kubeconfig, no KUBECONFIG, no ~/.kube/config, and not running in a pod"),
            "{action}: {err}"
        );
        let (code, _, err) = policies(&[action, "--kubeconfig", "/nonexistent/kubeconfig"], None);
        assert_eq!(code, Some(2), "{action}: {err}");
        assert!(
            err.contains("policies: kubeconfig /nonexistent/kubeconfig:"),
            "{action}: {err}"
        );
    }
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, UNREACHABLE_KUBECONFIG).unwrap();
    let (code, out, err) = policies(&["--apply"], Some(&kubeconfig));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains(&format!(
            "policies: the cluster of KUBECONFIG={}",
            kubeconfig.display()
        )),
        "{out}"
    );
    assert!(err.contains("policies: FAILED: "), "{err}");
}

/// As kubectl: `$KUBECONFIG`, else `~/.kube/config`; an API server that does not answer is one
/// cause, said once.
#[test]
fn check_install_finds_its_cluster_as_kubectl_does_and_names_one_cause() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = UNREACHABLE_KUBECONFIG;
    let env_file = dir.path().join("env-kubeconfig");
    std::fs::write(&env_file, kubeconfig).unwrap();
    std::fs::create_dir_all(dir.path().join("home/.kube")).unwrap();
    std::fs::write(dir.path().join("home/.kube/config"), kubeconfig).unwrap();
    let check = |env: Option<&Path>| {
        let mut cmd = bin();
        cmd.args(["check-install", "--timeout-seconds", "0"])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", dir.path().join("home"));
        match env {
            Some(p) => cmd.env("KUBECONFIG", p),
            None => cmd.env_remove("KUBECONFIG"),
        };
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = check(Some(&env_file));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains(&format!(
            "check-install: the cluster of KUBECONFIG={}",
            env_file.display()
        )),
        "{out}"
    );
    assert!(
        err.contains("check-install: FAILED: pod webhook: cannot reach the API server"),
        "{err}"
    );
    assert!(err.contains("check-install: the client's error: "), "{err}");
    assert!(!err.contains("another reason"), "{err}");
    let (code, out, err) = check(None);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("/home/.kube/config"), "{out}");
}

const STREAM: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: first, annotations: {ephemeral-volumes.io/shm: "type=emptyDir,medium=Memory,size=2Gi,mountPath=/dev/shm"}}
spec:
  containers:
    - name: main
      image: busybox
      resources: {limits: {memory: 1073741824}, requests: {ephemeral-storage: 10737418240}}
---
---
apiVersion: batch/v1
kind: Job
metadata: {name: second}
spec:
  template:
    metadata: {annotations: {ephemeral-volumes.io/scratch: "type=emptyDir,mountPath=/scratch,size=1Gi"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: busybox}]}
"#;

#[test]
fn mutate_takes_a_multi_document_stream_with_integer_quantities_as_kubectl_does() {
    let out = run(&["mutate", "-f", "-", "-o", "json"], Some(STREAM));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        2,
        "the empty document is skipped, the order kept"
    );
    assert_eq!(items[0]["spec"]["volumes"][0]["name"], "shm");
    assert_eq!(
        items[1]["spec"]["template"]["spec"]["volumes"][0]["name"],
        "scratch"
    );
    // The integer memory limit (1 GiB) was read: the 2Gi RAM disk is over it.
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("document 1 (Pod/first): volume shm: Memory emptyDir size 2Gi exceeds the memory limit 1Gi"),
        "{stderr}"
    );

    let out = run(&["mutate", "-f", "-", "-o", "yaml"], Some(STREAM));
    let docs = text(&out.stdout);
    assert_eq!(docs.matches("---\n").count(), 2, "{docs}");

    let out = run(&["mutate", "-f", "-", "-o", "patch"], Some(STREAM));
    let patches: Vec<Vec<Value>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(patches.len(), 2);
    assert_eq!(patches[1][0]["path"], "/spec/template/spec/volumes");

    // One denied document: exit 1, and the message says which document.
    let bad = STREAM.replace("size=1Gi", "size=0");
    let out = run(&["mutate", "-f", "-"], Some(&bad));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("document 2 (Job/second): annotation ephemeral-volumes.io/scratch"),
        "{}",
        text(&out.stderr)
    );
}

fn pod_with(annotation: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"ephemeral-volumes.io/v": annotation}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    })
    .to_string()
}

#[test]
fn mutate_cluster_refuses_what_the_cluster_cannot_provide() {
    let cluster = data("cluster.yaml");
    // (annotation, exit code, message on stderr)
    for (annotation, code, want) in [
        (
            "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=db,mountPath=/s,readOnly=true",
            0,
            "",
        ),
        (
            "type=csi,driver=missing.csi.io,mountPath=/s",
            1,
            "denied (422): annotation ephemeral-volumes.io/v: CSIDriver \"missing.csi.io\" does not exist in the cluster",
        ),
        (
            "type=csi,driver=ebs.csi.aws.com,mountPath=/s",
            1,
            "CSIDriver \"ebs.csi.aws.com\" does not list Ephemeral in volumeLifecycleModes",
        ),
        (
            "type=ephemeral,storageClass=gp3,size=1Gi,mountPath=/s",
            0,
            "",
        ),
        ("type=ephemeral,size=1Gi,mountPath=/s", 0, ""),
        (
            "type=ephemeral,storageClass=io2,size=1Gi,mountPath=/s",
            1,
            "StorageClass \"io2\" does not exist: the PVC would stay Pending",
        ),
        (
            "type=ephemeral,storageClass=nfs,size=1Gi,mountPath=/s",
            0,
            "warning: volume v: StorageClass \"nfs\" uses provisioner \"nfs.csi.example.com\", which has no CSIDriver object",
        ),
    ] {
        let out = run(
            &["mutate", "--cluster", &cluster, "-f", "-", "-o", "patch"],
            Some(&pod_with(annotation)),
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{annotation}: {stderr}");
        assert!(
            stderr.contains(want),
            "{annotation}: want {want:?} in {stderr}"
        );
    }
    // No default class: a PVC without a class is refused.
    let no_default = std::fs::read_to_string(&cluster)
        .unwrap()
        .replace("\"true\"", "\"false\"");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, no_default).unwrap();
    let out = run(
        &["mutate", "--cluster", path.to_str().unwrap(), "-f", "-"],
        Some(&pod_with("type=ephemeral,size=1Gi,mountPath=/s")),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the cluster has no default StorageClass"),
        "{}",
        text(&out.stderr)
    );
    // Without --cluster, nothing is known and nothing is checked.
    let out = run(
        &["mutate", "-f", "-"],
        Some(&pod_with("type=csi,driver=missing.csi.io,mountPath=/s")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn cluster_checks_warn_admits_with_a_warning_and_the_status_annotation_and_off_skips() {
    let cluster = data("cluster.yaml");
    let dir = tempfile::tempdir().unwrap();
    for (mode, annotated) in [("warn", true), ("off", false)] {
        let config = dir.path().join(format!("{mode}.yaml"));
        std::fs::write(&config, format!("clusterChecks: {mode}\n")).unwrap();
        let out = run(
            &[
                "mutate",
                "--config",
                config.to_str().unwrap(),
                "--cluster",
                &cluster,
                "-f",
                "-",
                "-o",
                "json",
            ],
            Some(&pod_with("type=csi,driver=missing.csi.io,mountPath=/s")),
        );
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", text(&out.stderr));
        let pod: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            pod["spec"]["volumes"][0]["csi"]["driver"], "missing.csi.io",
            "{mode}: injected all the same"
        );
        let status = &pod["metadata"]["annotations"]["injector.ephemeral-volumes.io/cluster-check"];
        assert_eq!(status.is_string(), annotated, "{mode}: {status}");
        assert_eq!(
            text(&out.stderr).contains("warning: annotation ephemeral-volumes.io/v: CSIDriver"),
            annotated,
            "{mode}"
        );
    }
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "clusterChecks: sometimes\n").unwrap();
    let out = run(&["check-config", bad.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("clusterChecks: unknown variant `sometimes`"),
        "{}",
        text(&out.stderr)
    );
}

/// `mutate` on a workload prints the decision the workload webhook (`POST /validate`) makes on
/// it: the same code and message when refused, admitted when it admits.
#[test]
fn mutate_on_a_workload_decides_as_the_workload_webhook() {
    #[path = "common/mod.rs"]
    mod common;
    let cfg_text = std::fs::read_to_string(data("config.yaml")).unwrap();
    let cfg = evi::config::Config::parse(&cfg_text).unwrap();
    for (annotation, denied) in [
        ("type=emptyDir,mountPath=/s,size=10Gii", true),
        ("type=emptyDir,mountPath=/s,size=1Gi", false),
    ] {
        let pod = serde_json::json!({
            "metadata": {"annotations": {"ephemeral-volumes.io/s": annotation}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}
        });
        for kind in evi::workload::WORKLOADS.map(|w| w.kind) {
            let object = common::workload_of(kind, &pod);
            let body = serde_json::to_vec(&common::workload_review(&object, None, "nf")).unwrap();
            let webhook =
                evi::review::handle(&cfg, None, evi::review::Endpoint::Validate, &body).unwrap();
            let out = run(
                &[
                    "mutate",
                    "--config",
                    &data("config.yaml"),
                    "--namespace",
                    "nf",
                    "-f",
                    "-",
                ],
                Some(&object.to_string()),
            );
            let err = text(&out.stderr);
            match webhook.decision.denial() {
                Some(d) if denied => {
                    assert_eq!(out.status.code(), Some(1), "{kind}: {err}");
                    assert!(
                        err.contains(&format!("denied ({}): {}", d.code(), d.message)),
                        "{kind}: {err}"
                    );
                }
                other => {
                    assert!(!denied && other.is_none(), "{kind}: {:?}", webhook.decision);
                    assert_eq!(out.status.code(), Some(0), "{kind}: {err}");
                }
            }
        }
    }
}

/// A kubeconfig whose client certificate is X.509 v1 (kubectl accepts it, rustls does not):
/// with the cluster checks on, `serve` refuses to start and names the cause; with them off it
/// serves. Before, it served with the checks silently off.
#[test]
fn serve_refuses_to_start_when_the_checks_cannot_have_a_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            text(&out.stderr)
        );
    };
    openssl(&[
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-subj", "/CN=ca", "-days", "1",
    ]);
    openssl(&[
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "c.key", "-out", "c.csr", "-subj",
        "/CN=u",
    ]);
    // No extensions: OpenSSL writes a version 1 certificate.
    openssl(&[
        "x509",
        "-req",
        "-in",
        "c.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "c.crt",
        "-days",
        "1",
    ]);
    let kubeconfig = d.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"https://127.0.0.1:1\", certificate-authority: \"{0}/ca.crt\"}}\nusers:\n- name: u\n  user: {{client-certificate: \"{0}/c.crt\", client-key: \"{0}/c.key\"}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            d.display()
        ),
    )
    .unwrap();
    let serve = |checks: &str| {
        let config = d.join(format!("{checks}.yaml"));
        std::fs::write(&config, format!("clusterChecks: {checks}\n")).unwrap();
        let mut child = serve_on_loopback()
            .args(["--log-format", "text", "--ca-out"])
            .arg(d.join("out-ca.crt"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Give it time to start or to fail.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            if checks == "off"
                && std::time::Instant::now() + std::time::Duration::from_secs(8) > deadline
            {
                break;
            }
        }
        let status = child.try_wait().unwrap();
        if status.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        (status.and_then(|s| s.code()), text(&out.stderr))
    };
    for checks in ["enforce", "warn"] {
        let (code, err) = serve(checks);
        assert_eq!(code, Some(2), "{checks}: {err}");
        assert!(
            err.contains("no API client can be built") && err.contains("UnsupportedCertVersion"),
            "{checks}: {err}"
        );
    }
    let (code, err) = serve("off");
    assert_eq!(code, None, "serves with the checks off: {err}");
    assert!(err.contains("listening"), "{err}");
}

/// Self-managed TLS flags that cannot work stop `serve` at the start (exit 2), naming the flag.
#[test]
fn serve_refuses_self_managed_tls_flags_that_cannot_work() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--tls-secret", "no-namespace", "--tls-name", "evi.evi.svc"],
            "--tls-secret must be NAMESPACE/NAME",
        ),
        (&["--tls-secret", "evi/certs"], "--tls-name"),
        (
            &["--tls-secret", "evi/certs", "--tls-name", "not a name"],
            "--tls-name \"not a name\"",
        ),
        (
            &[
                "--tls-secret",
                "evi/certs",
                "--tls-name",
                "evi.evi.svc",
                "--cert-lifetime",
                "50h",
                "--cert-renew-before",
                "100h",
            ],
            "renewal threshold (100h) must be positive and shorter than its lifetime (50h)",
        ),
        (
            &[
                "--tls-secret",
                "evi/certs",
                "--tls-name",
                "evi.evi.svc",
                "--ca-lifetime",
                "365d",
            ],
            "not a duration like 8760h",
        ),
        (
            &["--tls-secret", "evi/certs", "--tls-name", "evi.evi.svc"],
            "--tls-secret needs --mutating-webhook-configuration",
        ),
        (
            &[
                "--tls-secret",
                "evi/certs",
                "--tls-name",
                "evi.evi.svc",
                "--mutating-webhook-configuration",
                "evi",
            ],
            "--tls-secret needs the API server",
        ),
        (
            &[
                "--tls-secret",
                "evi/certs",
                "--tls-name",
                "evi.evi.svc",
                "--tls-cert",
                "a",
                "--tls-key",
                "b",
            ],
            "cannot be used with",
        ),
        (
            &[
                "--tls-secret",
                "evi/certs",
                "--tls-name",
                "evi.evi.svc",
                "--ca-lifetime",
                "80000000h",
            ],
            "\"80000000h\": a certificate issued now would expire after the year 9999",
        ),
        (&["--cert-lifetime", "9999999999999h"], "\"9999999999999h\""),
        // A bare word is a tracing target: it would silence every line, the fatal one too.
        (
            &["--log-level", "verbose"],
            "\"verbose\" is not a log level or a target=level directive",
        ),
        (
            &["--log-level", "info,evi=loud"],
            "\"evi=loud\" is not a log level",
        ),
        // A body of the largest size could never get room.
        (
            &["--max-inflight-body-bytes", "1048576"],
            "--max-inflight-body-bytes (1048576) must be at least --max-body-bytes (4194304)",
        ),
    ];
    for (args, want) in cases {
        let out = serve_on_loopback()
            .args(*args)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// What `helm template` or `kustomize build` prints: other kinds pass through unchanged, in
/// their place, with a note; FILE works as check-config takes it.
#[test]
fn mutate_passes_other_kinds_through_in_order_and_takes_file_positionally() {
    let stream = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc}}\nspec: {{ports: [{{port: 80}}]}}\n---\n{}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm}}\ndata: {{a: b}}\n",
        pod_with("type=emptyDir,mountPath=/s,size=1Gi")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &stream).unwrap();
    let out = run(&["mutate", file.to_str().unwrap(), "-o", "json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["Service", "Pod", "ConfigMap"]);
    assert_eq!(
        list["items"][0],
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})
    );
    assert_eq!(list["items"][1]["spec"]["volumes"][0]["name"], "v");
    assert_eq!(
        text(&out.stderr),
        "note: document 1 (Service/svc): Service has no pod template; passed through unchanged\n\
         note: document 3 (ConfigMap/cm): ConfigMap has no pod template; passed through unchanged\n"
    );
    // FILE and -f FILE are one argument.
    let out = run(
        &[
            "mutate",
            "-f",
            file.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// A custom workload with a pod template at `spec.template` (an Argo Rollout) is previewed as
/// a Deployment's would be: its template patched, or refused with the reason its pods would get
/// (it was passed through with "has no pod template", exit 0 even with --strict).
#[test]
fn mutate_previews_a_custom_workloads_pod_template_as_a_deployments() {
    let rollout = |value: &str| {
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {{name: r}}\nspec:\n  template:\n    \
             metadata:\n      annotations: {{ephemeral-volumes.io/s: \"{value}\"}}\n    spec:\n      \
             containers: [{{name: main, image: busybox}}]\n"
        )
    };
    let out = run(
        &["mutate", "-", "-o", "json"],
        Some(&rollout("type=emptyDir,mountPath=/s,size=1Gi")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["spec"]["template"]["spec"]["volumes"][0]["name"], "s");
    assert!(
        text(&out.stderr).contains("Rollout is a custom workload")
            && text(&out.stderr).contains("webhook.workloads.customResources"),
        "{}",
        text(&out.stderr)
    );
    let out = run(
        &["mutate", "-", "--strict"],
        Some(&rollout("type=emptyDir,mountPath=/s,size=10GB")),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("invalid quantity \"10GB\""),
        "{}",
        text(&out.stderr)
    );
}

/// Requests the webhook would never see: a warning each (exit 0), and with --strict exit 1.
#[test]
fn mutate_warns_of_annotations_the_webhook_never_reads() {
    let job = serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nf-task", "annotations": {"ephemeral-volumes.io/scratch": "type=emptyDir,mountPath=/s"}},
        "spec": {"template": {
            "metadata": {
                "labels": {"ephemeral-volumes.io/tmp": "type=emptyDir"},
                "annotations": {"ephemeral-volume.io/work": "type=emptyDir,mountPath=/w"},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
        }},
    })
    .to_string();
    let out = run(&["mutate", "-f", "-", "-o", "patch"], Some(&job));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
    assert_eq!(
        text(&out.stderr),
        "warning: annotation ephemeral-volumes.io/scratch is on the Job itself, which the webhook does not read: \
         put it on the pod template (spec.template.metadata.annotations)\n\
         warning: annotation ephemeral-volume.io/work is not read: the annotation prefix is ephemeral-volumes.io; \
         did you mean ephemeral-volumes.io/work?\n\
         warning: label ephemeral-volumes.io/tmp is not read: volumes are asked for with annotations; make it an annotation\n"
    );
    let out = run(
        &["mutate", "--strict", "-f", "-", "-o", "patch"],
        Some(&job),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).ends_with("error: warnings, and --strict\n"));
    // Nothing near: no warning, and --strict is content.
    let out = run(
        &["mutate", "--strict", "-f", "-"],
        Some(&pod_with("type=emptyDir,mountPath=/s,size=1Gi")),
    );
    assert_eq!(
        (out.status.code(), text(&out.stderr)),
        (Some(0), String::new())
    );
}

/// Limits per team: the namespace's labels (from `--cluster`'s Namespace objects) choose the
/// override, whose name the refusal gives; a namespace listed by name needs no labels; one
/// whose labels are unknown is refused with that reason, not given another team's limits.
#[test]
fn mutate_applies_the_policy_override_of_the_pods_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "policy: {maxSize: {emptyDir: 100Gi}}\n\
         policyOverrides:\n\
         - {name: genomics, namespaceSelector: {matchLabels: {team: genomics}}, policy: {maxSize: {emptyDir: 500Gi}}}\n\
         - {name: training, namespaces: [training], policy: {maxSize: {emptyDir: 20Gi}}}\n",
    )
    .unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: v1\nkind: NamespaceList\nitems:\n\
         - {apiVersion: v1, kind: Namespace, metadata: {name: gx, labels: {team: genomics}}}\n\
         - {apiVersion: v1, kind: Namespace, metadata: {name: other}}\n",
    )
    .unwrap();
    let (config, cluster) = (config.to_str().unwrap(), cluster.to_str().unwrap());
    let mutate = |ns: &str, size: &str, with_cluster: bool| {
        let mut args = vec![
            "mutate", "--config", config, "-n", ns, "-f", "-", "-o", "patch",
        ];
        if with_cluster {
            args.extend(["--cluster", cluster]);
        }
        let out = run(
            &args,
            Some(&pod_with(&format!(
                "type=emptyDir,mountPath=/s,size={size}"
            ))),
        );
        (out.status.code(), text(&out.stderr))
    };
    // genomics: 500Gi allowed, 600Gi refused naming the override.
    assert_eq!(mutate("gx", "400Gi", true).0, Some(0));
    let (code, err) = mutate("gx", "600Gi", true);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "size 600Gi exceeds policyOverrides[genomics].policy.maxSize.emptyDir (500Gi)"
        ),
        "{err}"
    );
    // A namespace without the label: the global policy.
    let (code, err) = mutate("other", "400Gi", true);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("size 400Gi exceeds policy.maxSize.emptyDir (100Gi)"),
        "{err}"
    );
    // Listed by name: no labels needed.
    let (code, err) = mutate("training", "30Gi", false);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("exceeds policyOverrides[training].policy.maxSize.emptyDir (20Gi)"),
        "{err}"
    );
    // Labels unknown (no such Namespace in --cluster, or no --cluster): refused with the reason.
    for with_cluster in [true, false] {
        let (code, err) = mutate("unknown", "1Gi", with_cluster);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("the labels of namespace \"unknown\" are not known"),
            "{err}"
        );
    }
}

/// Without --tls-cert, `serve` writes its development CA only once it holds its port, to a
/// file named after that port: a second server that cannot bind the same port fails without
/// touching the first one's CA (which the README's `curl` reads), and says why.
#[test]
fn serve_writes_its_ca_only_once_it_holds_its_port_to_a_file_named_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ca = tmp
        .path()
        .join(format!("ephemeral-volume-injector-{port}-ca.crt"));
    let serve = |admin: &str| {
        let mut c = bin();
        c.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", admin, "--log-format", "text"])
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    /// Killed when the test ends, passed or failed.
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut first = Running(serve("127.0.0.1:0").spawn().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !ca.exists() {
        assert!(
            first.0.try_wait().unwrap().is_none(),
            "the first server exited"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no CA at {}",
            ca.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let written = std::fs::read(&ca).unwrap();
    assert!(text(&written).contains("BEGIN CERTIFICATE"));

    let second = serve("127.0.0.1:0").output().unwrap();
    drop(first);
    assert_eq!(second.status.code(), Some(2), "{}", text(&second.stderr));
    assert!(
        text(&second.stderr).contains(&format!("cannot bind 127.0.0.1:{port}")),
        "{}",
        text(&second.stderr)
    );
    assert_eq!(
        std::fs::read(&ca).unwrap(),
        written,
        "the second server overwrote the CA"
    );
    let files: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
}

#[test]
fn mutate_says_once_what_a_label_selected_override_cannot_decide_without_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "rules:\n  - name: scratch\n    volumes:\n      s: type=emptyDir,size=1Gi,mountPath=/s\n\
         policyOverrides:\n  - name: team\n    namespaceSelector: {matchLabels: {team: a}}\n    policy: {maxVolumesPerPod: 1}\n",
    )
    .unwrap();
    let config = config.display().to_string();
    // Two pods, neither asking for a volume itself: both get the rule's volume.
    let quiet = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    .to_string();
    let two = format!("{quiet}\n---\n{quiet}\n");
    let out = run(
        &["mutate", "-", "--config", &config, "-o", "patch"],
        Some(&two),
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("policyOverrides select namespaces by label")
            .count(),
        1,
        "{stderr}"
    );
    assert!(text(&out.stdout).contains("/s"), "{}", text(&out.stdout));
    // One that asks for a volume itself is refused until the labels are known.
    let out = run(
        &["mutate", "-", "--config", &config],
        Some(&pod_with("type=emptyDir,size=1Gi,mountPath=/v")),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("try again in a moment"));
}

#[test]
fn serve_refuses_to_write_its_ca_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("victim");
    std::fs::write(&target, "precious").unwrap();
    let link = dir.path().join("ca.crt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--ca-out",
            link.to_str().unwrap(),
        ],
        None,
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("symbolic link") && err.contains(link.to_str().unwrap()),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Nothing left beside it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn deeply_nested_yaml_is_refused_at_once_naming_where() {
    // 3 MB of flow nesting: the YAML reader's cost grows with the square of the depth (it
    // would run for minutes); the readers refuse it before reading.
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep.yaml");
    let depth = 1_500_000;
    std::fs::write(
        &deep,
        format!("profiles: {}{}\n", "[".repeat(depth), "]".repeat(depth)),
    )
    .unwrap();
    let deep = deep.to_str().unwrap();
    for args in [
        vec!["check-config", deep],
        vec!["mutate", "-f", deep],
        vec![
            "mutate",
            "-f",
            &data("../golden/deployment/input.yaml"),
            "--config",
            deep,
        ],
        vec!["policies", "--config", deep],
    ] {
        let out = run(&args, None);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains("line 1, column 139: flow collections") && err.contains("128 deep"),
            "{args:?}: {err}"
        );
    }
}
