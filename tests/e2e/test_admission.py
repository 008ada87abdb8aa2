"""The webhook as the cluster runs it: the real chart installed with helm, the real binary
serving, the real kube-apiserver calling it and storing what it patched, the real controllers
acting on the result. Every assertion is on what the API server stored or answered."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, NEXTFLOW_LABELS, mounts_by_path, nextflow_job, pod, release_fixture, volumes_by_name, wait_for

P = "ephemeral-volumes.io"
INJECTED = f"injector.{P}/injected"

# The Nextflow installation (the chart tests render the same file).
VALUES = yaml.safe_load((ROOT / "tests" / "data" / "nextflow-values.yaml").read_text())

release = release_fixture("evi", VALUES)


# === Pod mode: each volume kind, key=value and JSON ===

KINDS = [
    ("disk emptyDir, key=value", "type=emptyDir,mountPath=/scratch,size=20Gi,env=TMPDIR",
     "/scratch", {"emptyDir": {"sizeLimit": "20Gi"}}),
    ("Memory emptyDir, key=value", "type=emptyDir,medium=Memory,mountPath=/dev/shm,size=2Gi",
     "/dev/shm", {"emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}),
    ("CSI inline, key=value",
     "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=vault-db,mountPath=/mnt/secrets,readOnly=true",
     "/mnt/secrets", {"csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                              "volumeAttributes": {"secretProviderClass": "vault-db"}}}),
    ("generic ephemeral, key=value", "type=ephemeral,storageClass=gp3,size=100Gi,mountPath=/scratch",
     "/scratch", {"ephemeral": {"volumeClaimTemplate": {"metadata": {}, "spec": {
         "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3", "volumeMode": "Filesystem",
         "resources": {"requests": {"storage": "100Gi"}}}}}}),
    ("generic ephemeral, JSON",
     json.dumps({"mountPath": "/scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
         "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
         "resources": {"requests": {"storage": "1024Gi"}}}}}}),
     "/scratch", {"ephemeral": {"volumeClaimTemplate": {"metadata": {}, "spec": {
         "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3", "volumeMode": "Filesystem",
         "resources": {"requests": {"storage": "1Ti"}}}}}}),
    ("a profile by name", "ebs-200g", "/scratch", {"ephemeral": {"volumeClaimTemplate": {"metadata": {}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3", "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": "200Gi"}}}}}}),
    ("a profile with overrides, key=value", "profile=vault-db,mountPath=/secrets",
     "/secrets", {"csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                          "volumeAttributes": {"secretProviderClass": "vault-db"}}}),
]


@pytest.mark.parametrize("label,value,path,source", KINDS, ids=[k[0] for k in KINDS])
def test_pod_mode_pod_is_stored_with_the_volume_it_asked_for(cluster, release, label, value, path, source):
    ns = cluster.namespace("nf")
    stored = cluster.create_pod(pod(namespace=ns, annotations={f"{P}/vol": value}))
    vol = volumes_by_name(stored)["vol"]
    assert {k: v for k, v in vol.items() if k != "name"} == source, label
    main = stored["spec"]["containers"][0]
    assert mounts_by_path(main)[path]["name"] == "vol"
    # The service-account volume the API server added is still there, and still mounted.
    assert any(v["name"].startswith("kube-api-access-") for v in stored["spec"]["volumes"])
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts_by_path(main)
    assert stored["metadata"]["annotations"][INJECTED] == "vol"
    if "env=TMPDIR" in value:
        assert {"name": "TMPDIR", "value": path} in main["env"]
        assert {"name": "NXF_OWNER", "value": "1000:1000"} in main["env"]


def test_two_volumes_and_the_record_of_both(cluster, release):
    ns = cluster.namespace("nf")
    stored = cluster.create_pod(pod(namespace=ns, annotations={
        f"{P}/scratch": "ebs-200g", f"{P}/secrets": "vault-db", "unrelated.example.com/x": "y"}))
    assert {"scratch", "secrets"} <= set(volumes_by_name(stored))
    assert stored["metadata"]["annotations"][INJECTED] == "scratch,secrets"
    assert stored["metadata"]["annotations"]["unrelated.example.com/x"] == "y"


# === Job mode: the real job controller and ephemeral-volume controller ===

def test_job_pod_is_mutated_and_its_pvc_is_created_by_the_ephemeral_volume_controller(cluster, release):
    ns = cluster.namespace("nf")
    job = cluster.create(nextflow_job("nf-3f2a9c0e1b7d4a5f8e6c2d1b0a9f8e7d", ns, {f"{P}/scratch": "ebs-200g"}, labels={
        **NEXTFLOW_LABELS, "nextflow.io/runName": "happy_turing", "nextflow.io/taskName": "BWA_MEM_1",
        "nextflow.io/processName": "BWA_MEM"}))
    job = json.loads(job.stdout)

    def job_pod():
        pods = cluster.get("pods", "-n", ns, "-l", f"batch.kubernetes.io/job-name={job['metadata']['name']}")
        return pods["items"][0] if pods["items"] else None

    stored = wait_for("the job controller's pod", job_pod)
    # The pod came from the job controller, with generateName and no name of its own in the request.
    assert stored["metadata"]["generateName"] == f"{job['metadata']['name']}-"
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert stored["metadata"]["annotations"][INJECTED] == "scratch"
    assert "ephemeral" in volumes_by_name(stored)["scratch"]
    pvc_name = f"{stored['metadata']['name']}-scratch"
    pvc = wait_for(f"PVC {pvc_name}", lambda: cluster.get("pvc", pvc_name, "-n", ns))
    assert pvc["spec"]["storageClassName"] == "gp3"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "200Gi"
    owner = pvc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod", stored["metadata"]["name"], stored["metadata"]["uid"], True)


# === Rules ===

def test_rules_inject_without_annotations_and_leave_other_pods_alone(cluster, release):
    ns = cluster.namespace("nf-rules")
    other = cluster.namespace("other")
    nf = {"nextflow.io/app": "nextflow"}
    in_rule = cluster.create_pod(pod(namespace=ns, labels=nf))
    assert volumes_by_name(in_rule)["scratch"]["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "gp3"
    assert in_rule["metadata"]["annotations"][INJECTED] == "scratch"
    # namespaces: the same labels elsewhere get nothing.
    outside = cluster.create_pod(pod(namespace=other, labels=nf))
    assert "scratch" not in volumes_by_name(outside)
    assert INJECTED not in outside["metadata"].get("annotations", {})
    # matchLabels: other labels in the namespace get nothing.
    unlabelled = cluster.create_pod(pod(namespace=ns, labels={"app": "web"}))
    assert "scratch" not in volumes_by_name(unlabelled)
    # matchExpressions, in any namespace: In matches, other values do not.
    gpu = cluster.create_pod(pod(namespace=other, labels={"accelerator": "h100"}))
    assert volumes_by_name(gpu)["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    cpu = cluster.create_pod(pod(namespace=other, labels={"accelerator": "none"}))
    assert "shm" not in volumes_by_name(cpu)
    # Both rules, and an annotation that wins over a rule for the same name.
    both = cluster.create_pod(pod(namespace=ns, labels={**nf, "accelerator": "a100"},
                                  annotations={f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=5Gi"}))
    assert volumes_by_name(both)["scratch"]["emptyDir"] == {"sizeLimit": "5Gi"}
    assert both["metadata"]["annotations"][INJECTED] == "scratch,shm"


# === Refusals and dry runs ===

def test_a_refused_pod_shows_the_message_naming_the_annotation(cluster, release):
    ns = cluster.namespace("nf")
    bad = pod(name="refused", namespace=ns, annotations={f"{P}/scratch": "type=emptyDir,mountpath=/scratch"})
    p = cluster.create(bad, check=False)
    assert p.returncode != 0
    assert "admission webhook" in p.stderr and "denied the request" in p.stderr
    assert f"annotation {P}/scratch" in p.stderr and "mountpath" in p.stderr
    assert cluster.kubectl("get", "pod", "refused", "-n", ns, check=False).returncode != 0
    # Over policy: 403 in the webhook's status, shown by kubectl.
    big = pod(name="too-big", namespace=ns, annotations={f"{P}/scratch": "type=ephemeral,storageClass=gp3,size=2Ti,mountPath=/s"})
    p = cluster.create(big, check=False)
    assert p.returncode != 0 and "policy.maxSize.ephemeral" in p.stderr


def test_a_server_side_dry_run_shows_the_injection_and_stores_nothing(cluster, release):
    ns = cluster.namespace("nf")
    before = release.webhook.metric("evi_admission_requests_total", result="mutated")
    p = cluster.create(pod(name="dry", namespace=ns, annotations={f"{P}/scratch": "ebs-200g"}), "--dry-run=server")
    shown = json.loads(p.stdout)
    assert "scratch" in volumes_by_name(shown)
    assert shown["metadata"]["annotations"][INJECTED] == "scratch"
    assert cluster.kubectl("get", "pod", "dry", "-n", ns, check=False).returncode != 0
    assert release.webhook.metric("evi_admission_requests_total", result="mutated") == before + 1
    release.webhook.wait_log("the dry run's decision in the log",
                             lambda line: line.get("dry_run") is True and line["message"] == "mutated")


# === Pods that asked for nothing ===

def test_pods_that_ask_for_nothing_never_reach_the_webhook(cluster, release):
    ns = cluster.namespace("nf")
    before = release.webhook.metric("evi_admission_requests_total")
    bare = pod(namespace=ns)
    del bare["metadata"]["generateName"]
    bare["metadata"]["name"] = "bare"
    stored = cluster.create_pod(bare)
    assert "annotations" not in stored["metadata"]
    cluster.create_pod(pod(namespace=ns, annotations={"other.example.com/x": "1"}, labels={"app": "x"}))
    # The matchConditions filtered both out in the API server: the webhook saw no request.
    assert release.webhook.metric("evi_admission_requests_total") == before


# === Reinvocation: a later mutator adds a container ===

MAP = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
    "metadata": {"name": "evi-test-add-sidecar"},
    "spec": {
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                 "operations": ["CREATE"], "resources": ["pods"]}]},
        "matchConditions": [{"name": "test-namespace", "expression": "object.metadata.namespace == 'reinvoke'"}],
        "failurePolicy": "Fail",
        "reinvocationPolicy": "IfNeeded",
        # The API server runs policies before webhooks: the first call adds nothing; once our
        # webhook has mutated the pod the policy is called again (IfNeeded), adds a container,
        # and so makes the API server call our webhook again.
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression":
            f"has(object.metadata.annotations) && '{INJECTED}' in object.metadata.annotations"
            " && !object.spec.containers.exists(c, c.name == 'added')"
            " ? [JSONPatch{op: 'add', path: '/spec/containers/-',"
            " value: Object.spec.containers{name: 'added', image: 'busybox'}}] : []"}}],
    },
}
MAP_BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
    "metadata": {"name": "evi-test-add-sidecar"},
    "spec": {"policyName": "evi-test-add-sidecar"},
}


def test_reinvocation_after_a_later_mutator_adds_a_container(cluster, release):
    ns = cluster.namespace("reinvoke")
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [MAP, MAP_BINDING]}))
    try:
        calls = release.webhook.metric("evi_admission_requests_total")

        def created():
            # The policy takes effect once the API server's policy informer has it.
            # On the second call the API server has defaulted and canonicalised what we added
            # (volumeMode, template metadata, 1024Gi -> 1Ti): still the same volume, not a conflict.
            p = cluster.create_pod(pod(namespace=ns, annotations={
                f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=1024Mi,env=TMPDIR",
                f"{P}/disk": "type=ephemeral,storageClass=gp3,size=1024Gi,mountPath=/disk"}))
            return p if len(p["spec"]["containers"]) == 2 else cluster.kubectl(
                "delete", "pod", p["metadata"]["name"], "-n", ns, "--wait=false") and None

        stored = wait_for("the MutatingAdmissionPolicy to add its container", created, timeout=30, interval=1)
        main, added = stored["spec"]["containers"]
        assert added["name"] == "added"
        # Called again for the new container: it gets the mount and env the annotation asks for.
        assert mounts_by_path(added)["/scratch"]["name"] == "scratch"
        assert {"name": "TMPDIR", "value": "/scratch"} in added["env"]
        assert mounts_by_path(main)["/scratch"]["name"] == "scratch"
        assert mounts_by_path(added)["/disk"]["name"] == "disk"
        names = [v["name"] for v in stored["spec"]["volumes"]]
        assert names.count("scratch") == 1 and names.count("disk") == 1
        assert volumes_by_name(stored)["disk"]["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"] == {
            "requests": {"storage": "1Ti"}}
        assert stored["metadata"]["annotations"][INJECTED] == "disk,scratch"
        assert release.webhook.metric("evi_admission_requests_total") - calls >= 2
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [MAP_BINDING, MAP]}))


# === kubectl debug: ephemeral containers are never touched ===

def test_kubectl_debug_on_a_mutated_pod_is_neither_refused_nor_changed(cluster, release):
    ns = cluster.namespace("nf")
    stored = cluster.create_pod(pod(name="debugged", namespace=ns, annotations={
        f"{P}/scratch": "type=emptyDir,mountPath=/scratch,size=1Gi"}))
    calls = release.webhook.metric("evi_admission_requests_total")
    cluster.kubectl("debug", "debugged", "-n", ns, "--image=busybox", "--container=dbg", "--profile=general",
                    "--", "sleep", "1")
    after = cluster.get("pod", "debugged", "-n", ns)
    (dbg,) = after["spec"]["ephemeralContainers"]
    assert dbg["name"] == "dbg" and "volumeMounts" not in dbg
    assert after["spec"]["volumes"] == stored["spec"]["volumes"]
    assert after["spec"]["containers"] == stored["spec"]["containers"]
    assert release.webhook.metric("evi_admission_requests_total") == calls


# === What the API server would refuse, the webhook refuses first, naming the annotation ===

PVC_SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
REFUSED_BY_BOTH = [
    ("template metadata other than labels and annotations",
     {"ephemeral": {"volumeClaimTemplate": {"metadata": {"name": "x"}, "spec": PVC_SPEC}}}),
    ("a misspelt volumeMode",
     {"ephemeral": {"volumeClaimTemplate": {"spec": {**PVC_SPEC, "volumeMode": "FileSystem"}}}}),
    ("an unknown access mode",
     {"ephemeral": {"volumeClaimTemplate": {"spec": {**PVC_SPEC, "accessModes": ["ReadWriteSometimes"]}}}}),
    ("no storage request",
     {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}),
    ("a zero storage request",
     {"ephemeral": {"volumeClaimTemplate": {"spec": {**PVC_SPEC, "resources": {"requests": {"storage": "0"}}}}}}),
    ("a storage class that is not a DNS subdomain",
     {"ephemeral": {"volumeClaimTemplate": {"spec": {**PVC_SPEC, "storageClassName": "GP3"}}}}),
    ("a bad template label", {"ephemeral": {"volumeClaimTemplate": {
        "metadata": {"labels": {"bad key!": "x"}}, "spec": PVC_SPEC}}}),
    ("a CSI driver name that is not a DNS subdomain", {"csi": {"driver": "Secrets_Store"}}),
    ("a CSI driver name over 63 characters", {"csi": {"driver": "a" * 61 + ".io"}}),
]


@pytest.mark.parametrize("label,source", REFUSED_BY_BOTH, ids=[c[0] for c in REFUSED_BY_BOTH])
def test_what_the_api_server_refuses_is_refused_by_the_webhook_first(cluster, release, label, source):
    ns = cluster.namespace("nf")
    # The API server itself, with the volume written into the pod (no annotation: not sent).
    raw = pod(name="raw", namespace=ns)
    raw["spec"]["volumes"] = [{"name": "scratch", **source}]
    raw["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    direct = cluster.create(raw, "--dry-run=server", check=False)
    assert direct.returncode != 0 and "is invalid" in direct.stderr, f"{label}: the API server accepted it"
    # The same volume asked for in the JSON form: refused by the webhook, naming the annotation.
    asked = pod(name="asked", namespace=ns, annotations={f"{P}/scratch": json.dumps({"mountPath": "/scratch", **source})})
    refused = cluster.create(asked, "--dry-run=server", check=False)
    assert refused.returncode != 0, f"{label}: the webhook let it through to the API server"
    assert "denied the request" in refused.stderr and f"annotation {P}/scratch" in refused.stderr, refused.stderr


def test_a_misspelt_medium_that_the_api_server_stores_is_refused_by_the_webhook(cluster, release):
    """The API server does not check emptyDir.medium: `memory` is stored and fails at the
    kubelet, with the pod stuck in ContainerCreating. The webhook refuses it at admission."""
    ns = cluster.namespace("nf")
    raw = pod(name="raw-medium", namespace=ns)
    raw["spec"]["volumes"] = [{"name": "shm", "emptyDir": {"medium": "memory"}}]
    assert cluster.create(raw, "--dry-run=server", check=False).returncode == 0
    asked = pod(name="asked-medium", namespace=ns, annotations={f"{P}/shm": "type=emptyDir,medium=memory,mountPath=/dev/shm"})
    refused = cluster.create(asked, "--dry-run=server", check=False)
    assert refused.returncode != 0 and "is not one of" in refused.stderr and "memory" in refused.stderr, refused.stderr
