"""The webhook as users run it, on a real node: the image built from the repository's
Dockerfile, the chart installed with helm (no webhook.url: the API server calls the webhook's
pods through their Service), and Nextflow-shaped tasks that run with their volumes, checked
from inside their containers and from the objects and events the API server keeps.

Runs only inside the test run's network namespace (make e2e; tests/e2e/in-netns.sh)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import BINARY, CHART, RELEASE_NS, ROOT, wait_for
from node import BUSYBOX_IMAGE, TAINT, WEBHOOK_IMAGE, webhook_image

P = "ephemeral-volumes.io"
NS = "nf-node"
MUSL_BINARY = ROOT / "target" / "x86_64-unknown-linux-musl" / "release" / "ephemeral-volume-injector"
RELEASE = "evi-node"
FULL = f"{RELEASE}-ephemeral-volume-injector"


@pytest.fixture(scope="module")
def image(node, tmp_path_factory):
    assert MUSL_BINARY.exists(), f"{MUSL_BINARY} is missing: make musl builds it"
    archive, size = webhook_image(tmp_path_factory.mktemp("image"), MUSL_BINARY, ROOT / "Dockerfile")
    node.import_image(archive)
    print(f"\nwebhook image {WEBHOOK_IMAGE}: {size / 1e6:.2f} MB", flush=True)
    return size


@pytest.fixture(scope="module")
def chart(cluster, node, image, tmp_path_factory):
    """The chart as users install it: the image, two replicas, TLS from the chart's Secret, the
    configuration from its ConfigMap, the cluster checks on the pods' ServiceAccount."""
    values = tmp_path_factory.mktemp("chart") / "values.yaml"
    values.write_text(json.dumps({
        "image": {"repository": WEBHOOK_IMAGE.split(":")[0], "tag": WEBHOOK_IMAGE.split(":")[1],
                  "pullPolicy": "Never"},
        "config": {"clusterChecks": "enforce", "profiles": {
            "shm": {"mountPath": "/dev/shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}}},
        # One node: the pods' anti-affinity is only preferred, so both replicas run on it.
        "tolerations": [TAINT],
    }))
    cluster.helm("install", RELEASE, CHART, "-n", RELEASE_NS, "--create-namespace", "-f", values,
                 "--wait", "--timeout", "180s")
    cluster.namespace(NS)
    yield
    cluster.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", check=False)


def pods_of(cluster, namespace: str, selector: str) -> list[dict]:
    return cluster.get("pods", "-n", namespace, "-l", selector)["items"]


def test_the_charts_own_pods_run_from_the_image_and_serve_through_their_service(cluster, chart, image):
    pods = pods_of(cluster, RELEASE_NS, f"app.kubernetes.io/instance={RELEASE}")
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for p in pods:
        assert p["status"]["phase"] == "Running", p["status"]
        (c,) = p["status"]["containerStatuses"]
        assert c["ready"] and c["image"].endswith(WEBHOOK_IMAGE.split("/", 1)[1]), c
        spec = p["spec"]["containers"][0]
        assert spec["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsNonRoot"] is True or p["spec"]["securityContext"].get("runAsNonRoot")
    pdb = cluster.get("pdb", FULL, "-n", RELEASE_NS)
    assert pdb["status"]["currentHealthy"] == 2 and pdb["status"]["disruptionsAllowed"] == 1, pdb["status"]
    mwc = cluster.get("mutatingwebhookconfiguration", FULL)
    assert "service" in mwc["webhooks"][0]["clientConfig"], mwc["webhooks"][0]["clientConfig"]

    # The API server reaches the pods through the Service (its endpoints; no kube-proxy here),
    # over the TLS of the chart's Secret, mounted by the kubelet.
    asks = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "probe-", "namespace": NS,
            "annotations": {f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=16Mi"}},
            "spec": {"containers": [{"name": "main", "image": BUSYBOX_IMAGE}], "tolerations": [TAINT]}}
    stored = json.loads(cluster.create(asks, "--dry-run=server").stdout)
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "16Mi"}} in stored["spec"]["volumes"]

    # The cluster checks read the cluster with the pods' own ServiceAccount token.
    missing = dict(asks)
    missing["metadata"] = dict(asks["metadata"], annotations={
        f"{P}/scratch": "type=ephemeral,storageClass=nowhere,size=1Gi,mountPath=/scratch"})
    refused = cluster.create(missing, "--dry-run=server", check=False)
    assert refused.returncode != 0 and 'StorageClass "nowhere" does not exist' in refused.stderr, refused.stderr


TASK_SCRIPT = r"""
set -u
out=/dev/termination-log
check() { echo "$1=$2" >> $out; }
check user "$(id -u)"
check tmpdir "$TMPDIR"
echo data > "$TMPDIR/written" && check scratch_write ok || check scratch_write failed
check scratch_mount "$(grep -c ' /scratch ' /proc/mounts)"
check shm_fs "$(grep ' /dev/shm ' /proc/mounts | cut -d' ' -f3)"
check shm_kib "$(df -k /dev/shm | tail -n 1 | awk '{print $2}')"
touch /ro/x 2>/dev/null && check ro_write allowed || check ro_write refused
check sub "$(cat /sub/marker 2>/dev/null || echo absent)"
"""


def nextflow_job(name: str, annotations: dict, script: str, init: list[dict] | None = None) -> dict:
    """A Job as Nextflow 26.10 submits it: backoffLimit 0, the task's annotations in the pod
    template, a .command.run-style script run as the task's user."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"nextflow.io/app": "nextflow"}},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {"nextflow.io/app": "nextflow"}, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                    "tolerations": [TAINT],
                    "initContainers": init or [],
                    "containers": [{
                        "name": name, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", script],
                        "terminationMessagePolicy": "File",
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi", "ephemeral-storage": "64Mi"},
                                      "limits": {"memory": "128Mi", "ephemeral-storage": "256Mi"}},
                    }]}}}}


def finished_pod(cluster, job: str, timeout: float = 120) -> dict:
    def done():
        pods = pods_of(cluster, NS, f"job-name={job}")
        if pods and pods[0]["status"].get("phase") in ("Succeeded", "Failed"):
            return pods[0]
        return None
    return wait_for(f"the pod of Job {job} to finish", done, timeout=timeout, interval=1)


def termination_report(pod: dict, container: str) -> dict:
    statuses = pod["status"].get("containerStatuses", []) + pod["status"].get("initContainerStatuses", [])
    (status,) = [s for s in statuses if s["name"] == container]
    message = status["state"]["terminated"].get("message", "")
    return dict(line.split("=", 1) for line in message.splitlines() if "=" in line)


def test_a_nextflow_task_runs_with_its_volumes_seen_from_inside(cluster, chart):
    annotations = {
        f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=64Mi,env=TMPDIR,initContainers=true",
        f"{P}/shm": "shm",
        f"{P}/ro": "type=emptyDir,mountPath=/ro,readOnly=true",
        f"{P}/sub": "type=emptyDir,mountPath=/sub,subPath=part,initContainers=true",
    }
    init = [
        # An init container that asked: it sees the scratch disk, and prepares the subPath.
        {"name": "stage", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
         "command": ["/bin/sh", "-c", "echo staged > /scratch/staged && echo here > /sub/marker"]},
    ]
    job = nextflow_job("nf-task-volumes", annotations,
                       TASK_SCRIPT + 'check staged "$(cat /scratch/staged)"\n', init=init)
    cluster.create(job)
    pod = finished_pod(cluster, "nf-task-volumes")
    assert pod["metadata"]["generateName"] == "nf-task-volumes-"
    report = termination_report(pod, "nf-task-volumes")
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], report)
    assert report["user"] == "1000"
    assert report["tmpdir"] == "/scratch" and report["scratch_write"] == "ok", report
    assert report["scratch_mount"] == "1", report
    assert report["staged"] == "staged", report
    # The profile's RAM disk: a tmpfs of the size asked (64 MiB).
    assert report["shm_fs"] == "tmpfs" and report["shm_kib"] == "65536", report
    assert report["ro_write"] == "refused", report
    assert report["sub"] == "here", report


def test_a_task_past_its_disk_limit_is_evicted_with_a_message_the_user_can_read(cluster, chart):
    annotations = {f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=8Mi"}
    script = "dd if=/dev/zero of=/scratch/big bs=1048576 count=32 2>/dev/null; sleep 600"
    cluster.create(nextflow_job("nf-task-too-big", annotations, script))
    pod = finished_pod(cluster, "nf-task-too-big", timeout=180)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"].get("reason") == "Evicted", pod["status"]
    message = pod["status"]["message"]
    print(f"\neviction message: {message}")
    assert 'Usage of EmptyDir volume "scratch" exceeds the limit "8Mi"' in message, message
