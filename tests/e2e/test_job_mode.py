"""Nextflow's Job mode against the real API server and kube-controller-manager's job controller:
a workload whose pods would be refused is refused at its own creation (the workload webhook,
POST /validate), a good one is stored as submitted and its pods get their volumes, and a refusal
only the pod can show (a StorageClass deleted after the Job was admitted) reaches the Job's
FailedCreate event word for word, counted by owner kind and logged with the owner."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import BINARY, RELEASE_NS, Release, installed, nextflow_job, volumes_by_name, wait_for

P = "ephemeral-volumes.io"
NS = "nf-jobs"
BAD_SIZE = "type=emptyDir,mountPath=/scratch,size=10Gii"
GOOD = "type=emptyDir,mountPath=/scratch,size=1Gi,env=TMPDIR"
CLASS = "jobs-gp3"
OBJECTS = [
    {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "jobs.csi.example.com"},
     "spec": {"attachRequired": False, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}},
    {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
     "provisioner": "jobs.csi.example.com"},
    # A custom workload with its pod template at spec.template, as Argo Rollouts defines one.
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": "rollouts.argoproj.io"},
     "spec": {"group": "argoproj.io", "scope": "Namespaced",
              "names": {"plural": "rollouts", "singular": "rollout", "kind": "Rollout"},
              "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                            "schema": {"openAPIV3Schema": {"type": "object",
                                                           "x-kubernetes-preserve-unknown-fields": True}}}]}},
]


def cronjob(name: str, annotations: dict) -> dict:
    job = nextflow_job(name, NS, annotations)
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": job["spec"]}}}


def deployment(name: str, annotations: dict) -> dict:
    template = nextflow_job(name, NS, annotations)["spec"]["template"]
    template["metadata"]["labels"]["app"] = name
    template["spec"]["restartPolicy"] = "Always"
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template}}


def preview_denial(release: Release, obj: dict) -> str:
    """The message `mutate` gives for the object with the release's configuration."""
    cfg = release.dir / "preview-config.yaml"
    cfg.write_text(release.config())
    out = subprocess.run([str(BINARY), "mutate", "--config", str(cfg), "-n", NS, "-f", "-"],
                         input=json.dumps(obj), capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("denied ("))
    return line.split("): ", 1)[1]


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": OBJECTS}))
    values = {"webhook": {"workloads": {"customResources": [{"apiGroups": ["argoproj.io"], "resources": ["rollouts"]}]}},
              "config": {"clusterChecks": "enforce", "profiles": {
        "disk": {"mountPath": "/scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
            "resources": {"requests": {"storage": "1Gi"}}}}}}}}}
    with installed(cluster, "evi-jobs", values, tmp_path_factory.mktemp("jobs"),
                   "--cluster-sync-timeout-seconds", "20", service_account=True) as r:
        cluster.namespace(NS)
        probe = nextflow_job("probe", NS, {f"{P}/s": BAD_SIZE})
        wait_for("the workload webhook to take effect",
                 lambda: cluster.create(probe, "--dry-run=server", check=False).returncode != 0)
        yield r
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": OBJECTS}))


def refused(cluster, obj: dict) -> str:
    out = cluster.create(obj, check=False)
    assert out.returncode != 0, f"{obj['kind']} {obj['metadata']['name']} was admitted"
    return out.stderr


def test_a_nextflow_job_with_a_bad_size_is_refused_at_creation_and_nothing_is_stored(cluster, jobs):
    job = nextflow_job("nf-bad-size", NS, {f"{P}/scratch": BAD_SIZE})
    err = refused(cluster, job)
    message = preview_denial(jobs, job)
    assert "annotation ephemeral-volumes.io/scratch" in message and "10Gii" in message, message
    # The API server's words around ours: which webhook, and our message unchanged.
    assert f'admission webhook "workloads.{P}" denied the request: {message}' in err, err
    # The status code and reason the pod would get (400, BadRequest), passed on by the API server.
    assert "Error from server (BadRequest)" in err, err
    gone = cluster.kubectl("get", "job", "nf-bad-size", "-n", NS, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
    assert jobs.webhook.metric("evi_workload_reviews_total", kind="Job", result="denied") >= 1


def test_four_mistakes_in_one_annotation_are_all_in_the_first_refusal(cluster, jobs):
    """What a pipeline author's first failed run prints: every mistake of the annotation, not one
    per try — a misspelt key (its field named), a misspelt key whose value is still checked as
    its field (a relative path), a value in the wrong case (the medium meant named), and a
    container the pod does not have."""
    value = "type=emptyDir,sizee=10Gi,mountpath=scratch,medium=memory,containers=mian"
    job = nextflow_job("nf-four-mistakes", NS, {f"{P}/scratch": value})
    err = refused(cluster, job)
    assert f'admission webhook "workloads.{P}" denied the request: annotation {P}/scratch: ' in err, err
    for mistake in ['unknown field "sizee": did you mean size?',
                    'unknown field "mountpath": did you mean mountPath?',
                    'mountPath "scratch" must be an absolute path',
                    'medium "memory" is not one of "" (node disk), Memory, HugePages: did you mean Memory?',
                    'container "mian" is not in the pod (its containers: main)']:
        assert mistake in err, f"{mistake!r} not in: {err}"
    # The status the worst of them decides: the annotation cannot be read (400).
    assert "Error from server (BadRequest)" in err, err
    assert preview_denial(jobs, job) in err


def test_a_custom_workload_listed_in_the_chart_is_refused_at_creation_as_a_deployment(cluster, jobs):
    def rollout(name: str, value: str) -> dict:
        template = deployment(name, {f"{P}/scratch": value})["spec"]["template"]
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": name, "namespace": NS},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": template}}
    wait_for("the Rollout kind to be served", lambda: cluster.kubectl(
        "get", "rollouts.argoproj.io", "-n", NS, check=False).returncode == 0)
    bad = rollout("nf-rollout-bad", BAD_SIZE)
    err = refused(cluster, bad)
    as_deployment = refused(cluster, deployment("nf-deploy-bad", {f"{P}/scratch": BAD_SIZE}))
    message = as_deployment.split("denied the request: ", 1)[1].strip()
    assert f'admission webhook "workloads.{P}" denied the request: {message}' in err, err
    stored = cluster.create(rollout("nf-rollout-good", GOOD))
    assert stored.returncode == 0, stored.stderr
    assert jobs.webhook.metric("evi_workload_reviews_total", kind="custom", result="denied") >= 1
    cluster.kubectl("delete", "rollouts.argoproj.io", "nf-rollout-good", "-n", NS, "--ignore-not-found")


def test_a_good_job_is_stored_as_submitted_and_its_pod_gets_the_volume(cluster, jobs):
    job = nextflow_job("nf-good", NS, {f"{P}/scratch": GOOD})
    stored = json.loads(cluster.create(job).stdout)
    template = stored["spec"]["template"]
    # As submitted: the workload webhook never patches (the pod webhook writes the volume).
    assert "volumes" not in template["spec"], template["spec"]
    assert "volumeMounts" not in template["spec"]["containers"][0]
    assert template["metadata"]["annotations"] == {f"{P}/scratch": GOOD}
    pods = wait_for("the job controller's pod", lambda: cluster.get(
        "pods", "-n", NS, "-l", "job-name=nf-good")["items"], timeout=60)
    (p,) = pods
    assert p["metadata"]["generateName"].startswith("nf-good-"), p["metadata"]
    assert p["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert volumes_by_name(p)["scratch"]["emptyDir"] == {"sizeLimit": "1Gi"}
    c = p["spec"]["containers"][0]
    assert {"name": "scratch", "mountPath": "/scratch"} in c["volumeMounts"]
    assert {"name": "TMPDIR", "value": "/scratch"} in c["env"]
    # The pod's decision is logged with its owner.
    line = wait_for("the pod's decision in the log", lambda: next(
        (e for e in jobs.webhook.log() if e.get("message") == "mutated" and e.get("owner") == "Job/nf-good"), None))
    assert line["pod"] == "nf-good-*", line


def test_cronjobs_and_deployments_are_refused_and_an_update_is_judged_on_its_template(cluster, jobs):
    bad = {f"{P}/scratch": BAD_SIZE}
    for obj, webhook in ((cronjob("nf-cron", bad), "cronjobs"), (deployment("nf-deploy", bad), "workloads")):
        err = refused(cluster, obj)
        assert f'admission webhook "{webhook}.{P}" denied the request: {preview_denial(jobs, obj)}' in err, err

    good = deployment("nf-deploy-2", {f"{P}/scratch": GOOD})
    cluster.create(good)
    # An UPDATE that introduces a bad annotation: refused; one that removes it: admitted.
    bad_update = cluster.kubectl("patch", "deployment", "nf-deploy-2", "-n", NS, "--type=merge", "-p", json.dumps(
        {"spec": {"template": {"metadata": {"annotations": bad}}}}), check=False)
    assert bad_update.returncode != 0 and "10Gii" in bad_update.stderr, bad_update.stderr
    removed = cluster.kubectl("patch", "deployment", "nf-deploy-2", "-n", NS, "--type=json", "-p", json.dumps(
        [{"op": "remove", "path": "/spec/template/metadata/annotations"}]))
    assert removed.returncode == 0
    stored = cluster.get("deployment", "nf-deploy-2", "-n", NS)
    assert "annotations" not in stored["spec"]["template"]["metadata"]
    # A label on the Deployment itself (the template unchanged) is never judged.
    cluster.kubectl("label", "deployment", "nf-deploy-2", "-n", NS, "team=x")
    cluster.kubectl("delete", "deployment", "nf-deploy-2", "-n", NS, "--wait=false")


def test_a_job_asking_for_a_missing_storage_class_is_refused_at_creation(cluster, jobs):
    job = nextflow_job("nf-no-class", NS, {f"{P}/scratch": "type=ephemeral,storageClass=nope,size=1Gi,mountPath=/s"})
    err = refused(cluster, job)
    assert 'StorageClass "nope" does not exist' in err, err
    assert "The request is invalid" in err, err  # kubectl's words for 422 (Invalid), as for the pod
    assert f'admission webhook "workloads.{P}" denied the request' in err, err


def test_a_refusal_only_the_pod_can_show_reaches_the_jobs_failed_create_event(cluster, jobs):
    """A suspended Job admitted while its StorageClass exists; the class is deleted; on resume
    the pod is refused, and the job controller's FailedCreate event carries our message."""
    job = nextflow_job("nf-resume", NS, {f"{P}/scratch": "disk"}, suspend=True)
    cluster.create(job)
    before = jobs.webhook.metric("evi_pod_denials_by_owner_total", owner_kind="Job", reason="cluster")
    cluster.kubectl("delete", "storageclass", CLASS, "--wait=true")
    try:
        probe = nextflow_job("probe-class", NS, {f"{P}/scratch": "disk"})
        wait_for("the webhook to see the class deleted",
                 lambda: cluster.create(probe, "--dry-run=server", check=False).returncode != 0)
        cluster.kubectl("patch", "job", "nf-resume", "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":false}}')

        def failed_create():
            events = cluster.get("events", "-n", NS, "--field-selector",
                                 "involvedObject.kind=Job,involvedObject.name=nf-resume,reason=FailedCreate")
            return [e["message"] for e in events["items"]]

        (message, *_) = wait_for("the Job's FailedCreate event", failed_create, timeout=60)
        ours = f'StorageClass "{CLASS}" does not exist'
        assert f'admission webhook "volumes.{P}" denied the request: ' in message, message
        assert ours in message and len(message) < 2048, message
        print(f"\nFailedCreate event: {message}")
        assert jobs.webhook.metric("evi_pod_denials_by_owner_total", owner_kind="Job",
                                   reason="cluster") > before
        jobs.webhook.wait_log("the refusal in the log, with its owner", lambda e: e.get("message") == "denied"
                              and e.get("owner") == "Job/nf-resume" and ours in e.get("denial", ""))
        # `kubectl describe job` is where a pipeline author finds it.
        described = cluster.kubectl("describe", "job", "nf-resume", "-n", NS).stdout
        assert "FailedCreate" in described and ours in described, described
    finally:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(OBJECTS[1]))
        cluster.kubectl("delete", "job", "nf-resume", "-n", NS, "--wait=false", check=False)


def test_excluded_namespaces_never_send_workloads(cluster, jobs):
    job = nextflow_job("nf-excluded", NS, {f"{P}/scratch": BAD_SIZE})
    job["metadata"]["namespace"] = RELEASE_NS
    job["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    cluster.create(job, "--dry-run=server")
