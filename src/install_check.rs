//! `check-install`: is the webhook really wired? Asks the API server, as a pipeline author
//! would, for a server-side dry-run create of a pod that requests a volume and of a Job whose
//! template the workload webhook must refuse; passes only when the pod comes back with the
//! volume and the Job is refused with the webhook's message. The chart runs it as a
//! post-install/post-upgrade hook Job (so `helm install --wait` fails on a miswired install)
//! and as its `helm test`.
//!
//! A failure names its cause from what the API server said: a caBundle that does not match
//! the served certificate, a webhook it cannot reach in time (a NetworkPolicy, a firewall, a
//! CNI whose pod IPs the control plane cannot reach), no ready replica, a refused connection,
//! the check's own request refused by the cluster's policy, or RBAC. Each check is retried
//! until `--timeout-seconds`, since a webhook that has just become ready may not yet be in
//! its Service's endpoints.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use kube::{Api, Client, api::PostParams};
use serde_json::json;

/// The volume name both checks ask for.
const VOLUME: &str = "evi-install-check";

/// `check-install`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CheckInstallArgs {
    /// The namespace the dry-run pod and Job are created in: one the webhook serves (not the
    /// release's own namespace, which the chart excludes).
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The annotation prefix of the webhook's configuration.
    #[arg(long, default_value = "ephemeral-volumes.io")]
    pub prefix: String,
    /// The annotation value of the dry-run pod: a request this cluster's policy allows.
    #[arg(
        long,
        default_value = "type=emptyDir,mountPath=/evi-install-check,size=1Mi"
    )]
    pub request: String,
    /// Do not check the workload webhook (the chart's `webhook.workloads.enabled=false`).
    #[arg(long)]
    pub skip_workloads: bool,
    /// How long to keep trying before reporting the last cause.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
    /// The API server's kubeconfig. Without it, as kubectl: `$KUBECONFIG`, else
    /// `~/.kube/config`, else the pod's service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Why a check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Cause {
    /// The API server does not trust the certificate the webhook serves.
    #[error(
        "the API server does not trust the webhook's certificate: the caBundle of the webhook configuration does not match the CA that signed the certificate the webhook serves (tls.caBundle or the TLS Secret; with cert-manager, is its CA injector running?)"
    )]
    CaBundle,
    /// The call timed out or found no route.
    #[error(
        "the API server got no answer from the webhook in time: a NetworkPolicy that blocks traffic from the control plane to the webhook's port, a firewall, or a CNI whose pod IPs the control plane cannot reach (then set hostNetwork: true; docs/helm.md)"
    )]
    Unreachable,
    /// The Service has no ready endpoint.
    #[error(
        "the webhook's Service has no ready endpoint: no replica is ready (scaled to zero, crash-looping, or its image cannot be pulled; kubectl get pods in the release's namespace)"
    )]
    NoEndpoints,
    /// Nothing listens where the Service points.
    #[error(
        "the webhook refused the connection: nothing listens on the Service's target port (a port changed on one side only, or the pod is restarting)"
    )]
    ConnectionRefused,
    /// The webhook answered, and refused the check's own pod.
    #[error(
        "the webhook answered but refused the check's pod: its request {request:?} is not allowed by this cluster's configuration; give the check one that is (the chart's checkInstall.request)"
    )]
    RequestRefused {
        /// The check's annotation value.
        request: String,
    },
    /// The pod was admitted without the volume.
    #[error(
        "the pod was admitted without the volume: the API server did not send it to the webhook (its namespace is excluded, or the matchConditions do not match the prefix {prefix:?}), or the webhook failed under failurePolicy: Ignore"
    )]
    NotMutated {
        /// The annotation prefix the check used.
        prefix: String,
    },
    /// The Job was admitted although its template asks for an impossible volume.
    #[error(
        "the Job was admitted although its pod template asks for a volume of an unknown type: the workload webhook is not registered or does not match (with webhook.workloads.enabled=false, run the check with --skip-workloads)"
    )]
    JobNotRefused,
    /// The check may not create what it asks for.
    #[error(
        "the check's ServiceAccount may not create pods or Jobs in the namespace (RBAC); the chart grants it in checkInstall.namespace"
    )]
    Forbidden,
    /// No answer from the API server itself.
    #[error(
        "cannot reach the API server: is the kubeconfig's server address right, and is it reachable from here?"
    )]
    ApiServerUnreachable,
    /// Anything else the API server said.
    #[error("the API server refused the dry run for another reason")]
    Other,
}

/// A failed check: its cause, and the API server's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Why.
    pub cause: Cause,
    /// What the API server said, or the client's error when there was no answer (empty when
    /// there is nothing to add).
    pub detail: String,
}

/// The cause of a failed dry run, from the API server's status code and message.
pub fn classify(code: u16, message: &str, request: &str) -> Cause {
    let m = message.to_ascii_lowercase();
    if m.contains("failed calling webhook") || m.contains("failed to call webhook") {
        if m.contains("x509:")
            || m.contains("certificate signed by unknown authority")
            || m.contains("tls:")
        {
            Cause::CaBundle
        } else if m.contains("no endpoints available") {
            Cause::NoEndpoints
        } else if m.contains("connection refused") {
            Cause::ConnectionRefused
        } else if m.contains("deadline exceeded")
            || m.contains("i/o timeout")
            || m.contains("client.timeout exceeded")
            || m.contains("no route to host")
            || m.contains("network is unreachable")
        {
            Cause::Unreachable
        } else {
            Cause::Other
        }
    } else if m.contains("denied the request") && m.contains(VOLUME) {
        Cause::RequestRefused {
            request: request.to_owned(),
        }
    } else if code == 403 && m.contains("forbidden") && !m.contains("admission webhook") {
        Cause::Forbidden
    } else {
        Cause::Other
    }
}

fn check_pod(args: &CheckInstallArgs) -> Pod {
    let key = format!("{}/{VOLUME}", args.prefix);
    // Restricted by Pod Security's standard, with small requests and limits, so that no
    // admission plugin but the webhook has a reason to refuse it.
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "evi-install-check-", "namespace": args.namespace,
                     "annotations": {key: args.request}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "check", "image": "evi-install-check.invalid/none:dry-run",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "1m", "memory": "1Mi", "ephemeral-storage": "1Mi"},
                              "limits": {"cpu": "1m", "memory": "1Mi", "ephemeral-storage": "1Mi"}},
            }],
        },
    }))
    .unwrap_or_default()
}

fn check_job(args: &CheckInstallArgs) -> Job {
    let mut template = serde_json::to_value(check_pod(args)).unwrap_or_default();
    if let Some(meta) = template.get_mut("metadata") {
        *meta = json!({"annotations": {format!("{}/{VOLUME}", args.prefix):
            "type=evi-install-check-must-be-refused,mountPath=/evi-install-check"}});
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": "evi-install-check-", "namespace": args.namespace},
        "spec": {"backoffLimit": 0, "template": template},
    }))
    .unwrap_or_default()
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: Some("evi-check-install".into()),
    }
}

fn api_failure(e: kube::Error, request: &str) -> Failure {
    match e {
        kube::Error::Api(status) => Failure {
            cause: classify(status.code, &status.message, request),
            detail: status.message.clone(),
        },
        other => Failure {
            cause: Cause::ApiServerUnreachable,
            detail: other.to_string(),
        },
    }
}

/// The pod check: the pod comes back with the volume, mounted in its container.
async fn pod_check(client: &Client, args: &CheckInstallArgs) -> Result<String, Failure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &args.namespace);
    let pod = pods
        .create(&dry_run(), &check_pod(args))
        .await
        .map_err(|e| api_failure(e, &args.request))?;
    let spec = pod.spec.unwrap_or_default();
    let volume = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == VOLUME);
    let mount = spec
        .containers
        .iter()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .find(|m| m.name == VOLUME);
    match (volume, mount) {
        (Some(v), Some(m)) => {
            let kind = serde_json::to_value(&v)
                .ok()
                .and_then(|v| v.as_object()?.keys().find(|k| *k != "name").cloned())
                .unwrap_or_default();
            Ok(format!(
                "a pod asking for volume {VOLUME:?} came back with it ({kind}, mounted at {})",
                m.mount_path
            ))
        }
        _ => Err(Failure {
            cause: Cause::NotMutated {
                prefix: args.prefix.clone(),
            },
            detail: String::new(),
        }),
    }
}

/// The Job check: refused by the workload webhook, with the webhook's message.
async fn job_check(client: &Client, args: &CheckInstallArgs) -> Result<String, Failure> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), &args.namespace);
    match jobs.create(&dry_run(), &check_job(args)).await {
        Ok(_) => Err(Failure {
            cause: Cause::JobNotRefused,
            detail: String::new(),
        }),
        Err(kube::Error::Api(status))
            if status.message.contains("denied the request")
                && status
                    .message
                    .contains(&format!("{}/{VOLUME}", args.prefix)) =>
        {
            Ok(format!(
                "a Job whose template asks for an impossible volume was refused: {}",
                status.message
            ))
        }
        Err(e) => Err(api_failure(e, &args.request)),
    }
}

/// Runs the checks until both pass or the time is up; prints what it found.
pub fn run(args: &CheckInstallArgs) -> ExitCode {
    crate::server::with_cluster(
        "check-install",
        "no cluster to check",
        args.kubeconfig.as_deref(),
        |client| async move {
            let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                let pod = pod_check(&client, args).await;
                let job = match (&pod, args.skip_workloads) {
                    (Ok(_), false) => Some(job_check(&client, args).await),
                    _ => None,
                };
                let failure = match (&pod, &job) {
                    (Err(f), _) => Some(("pod webhook", f.clone())),
                    (Ok(_), Some(Err(f))) => Some(("workload webhook", f.clone())),
                    _ => None,
                };
                match failure {
                    None => {
                        if let Ok(p) = &pod {
                            println!("check-install: pod webhook: ok: {p}");
                        }
                        match &job {
                            Some(Ok(j)) => println!("check-install: workload webhook: ok: {j}"),
                            _ => println!(
                                "check-install: workload webhook: not checked (--skip-workloads)"
                            ),
                        }
                        println!(
                            "check-install: the webhook is wired (namespace {}, {attempts} attempt(s))",
                            args.namespace
                        );
                        return ExitCode::SUCCESS;
                    }
                    Some((which, f)) if Instant::now() >= deadline => {
                        eprintln!("check-install: FAILED: {which}: {}", f.cause);
                        if !f.detail.is_empty() {
                            let whose = match f.cause {
                                Cause::ApiServerUnreachable => "the client's error",
                                _ => "the API server said",
                            };
                            eprintln!("check-install: {whose}: {}", f.detail);
                        }
                        eprintln!(
                            "check-install: {attempts} attempt(s) over {} s in namespace {}",
                            args.timeout_seconds, args.namespace
                        );
                        return ExitCode::from(1);
                    }
                    Some((which, f)) => {
                        eprintln!("check-install: {which}: not yet ({}); retrying", f.cause);
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: &str = "type=emptyDir,mountPath=/x";

    // The API server's messages, as kube-apiserver 1.37 writes them for a webhook it cannot call.
    fn call(err: &str) -> String {
        format!(
            "Internal error occurred: failed calling webhook \"volumes.ephemeral-volumes.io\": failed to call webhook: Post \"https://evi.evi-system.svc:443/mutate?timeout=5s\": {err}"
        )
    }

    #[test]
    fn each_failed_call_is_named_by_its_cause() {
        let cases = [
            (
                "tls: failed to verify certificate: x509: certificate signed by unknown authority",
                Cause::CaBundle,
            ),
            ("context deadline exceeded", Cause::Unreachable),
            ("dial tcp 10.0.0.7:443: i/o timeout", Cause::Unreachable),
            (
                "dial tcp 10.214.0.9:8443: connect: no route to host",
                Cause::Unreachable,
            ),
            (
                "dial tcp 10.214.0.9:8443: connect: connection refused",
                Cause::ConnectionRefused,
            ),
            ("something new", Cause::Other),
        ];
        for (err, want) in cases {
            assert_eq!(classify(500, &call(err), REQ), want, "{err}");
        }
        assert_eq!(
            classify(
                500,
                "Internal error occurred: failed calling webhook \"volumes.ephemeral-volumes.io\": failed to call webhook: Post \"https://evi.evi-system.svc:443/mutate?timeout=5s\": no endpoints available for service \"evi\"",
                REQ
            ),
            Cause::NoEndpoints
        );
    }

    #[test]
    fn a_denial_of_the_checks_own_pod_and_rbac_are_told_apart_from_wiring() {
        let denied = "admission webhook \"volumes.ephemeral-volumes.io\" denied the request: annotation ephemeral-volumes.io/evi-install-check: type emptyDir is not allowed by policy.types";
        assert_eq!(
            classify(403, denied, REQ),
            Cause::RequestRefused {
                request: REQ.into()
            }
        );
        let rbac = "pods is forbidden: User \"system:serviceaccount:evi:check\" cannot create resource \"pods\" in API group \"\" in the namespace \"default\"";
        assert_eq!(classify(403, rbac, REQ), Cause::Forbidden);
        let other_webhook = "admission webhook \"other.example.com\" denied the request: no";
        assert_eq!(classify(403, other_webhook, REQ), Cause::Other);
    }

    #[test]
    fn the_dry_run_objects_ask_for_the_volume_and_for_an_impossible_one() {
        let args = CheckInstallArgs {
            namespace: "team-a".into(),
            prefix: "volumes.example.org".into(),
            request: REQ.into(),
            skip_workloads: false,
            timeout_seconds: 1,
            kubeconfig: None,
        };
        let pod = check_pod(&args);
        let annotations = pod.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("volumes.example.org/evi-install-check")
                .map(String::as_str),
            Some(REQ)
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("team-a"));
        let job = check_job(&args);
        let template = job.spec.unwrap_or_default().template;
        let value = template
            .metadata
            .unwrap_or_default()
            .annotations
            .unwrap_or_default();
        assert!(
            value["volumes.example.org/evi-install-check"]
                .starts_with("type=evi-install-check-must-be-refused")
        );
        assert_eq!(template.spec.unwrap_or_default().containers.len(), 1);
    }
}
