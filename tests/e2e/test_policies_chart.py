"""The chart's policies modes against the real API server (1.37): the hook Jobs' commands, as the
chart renders them, run with the hook's own ServiceAccount and RBAC (rendered by the chart and
created here), apply the compiled policies (`policies.mode=policies`), switch them to audit
(`both`: no mutating policy, refusals as warnings) and delete them before uninstall. Here the
Jobs' command lines and permissions are judged without a node; the Jobs themselves run on one in
test_node.py (`test_the_policies_mode_installs_and_removes_the_policies_through_its_hook_jobs_on_the_node`)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import BINARY, HELM, ROOT, pod, service_account_kubeconfig, wait_for

P = "ephemeral-volumes.io"
RELEASE_NS = "evi-policies"
NS = "policies-chart"
CONFIG = {
    "profiles": {"shm": {"mountPath": "/dev/shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}},
    "policy": {"maxSize": {"emptyDir": "10Gi"}},
}
FULLNAME = "evi-ephemeral-volume-injector"


def render(cluster, tmp_path, mode: str) -> list[dict]:
    values = tmp_path / f"values-{mode}.yaml"
    values.write_text(yaml.safe_dump({"config": CONFIG, "policies": {"mode": mode}}))
    out = cluster.run(HELM, "template", "evi", ROOT / "charts" / "ephemeral-volume-injector", "-n", RELEASE_NS,
                      "--kube-version", "1.37.2", "-f", values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def job_args(docs: list[dict], which: str) -> list[str]:
    (job,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith(f"-policies-{which}")]
    return job["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.fixture(scope="module")
def hook(cluster, tmp_path_factory):
    """The hook's ServiceAccount, ClusterRole and binding as the chart renders them, created in
    the cluster, and a kubeconfig with the ServiceAccount's token."""
    tmp = tmp_path_factory.mktemp("policies-chart")
    docs = render(cluster, tmp, "policies")
    cluster.namespace(RELEASE_NS)
    cluster.namespace(NS)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
            and d["metadata"]["name"].endswith("-policies")]
    assert len(rbac) == 3
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac})
    cluster.kubectl("apply", "-f", "-", input=items)
    yield tmp, service_account_kubeconfig(cluster, RELEASE_NS, f"{FULLNAME}-policies", tmp / "hook-kubeconfig")
    cluster.run(BINARY, "policies", f"--name={FULLNAME}", "--delete", check=False)
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=items)


def run_job(cluster, tmp, kubeconfig, docs, which) -> subprocess.CompletedProcess:
    """The Job's args, with the rendered ConfigMap as the file the Job mounts."""
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-policies-config"))
    path = tmp / "configmap.yaml"
    path.write_text(yaml.safe_dump(configmap))
    args = [f"--config={path}" if a.startswith("--config=") else a for a in job_args(docs, which)]
    return cluster.run(BINARY, *args, "--kubeconfig", kubeconfig, check=False)


def policies_in_cluster(cluster) -> set[str]:
    out = cluster.kubectl("get", "mutatingadmissionpolicies,validatingadmissionpolicies,"
                          "mutatingadmissionpolicybindings,validatingadmissionpolicybindings", "-o", "json").stdout
    return {f"{i['kind']}/{i['metadata']['name']}" for i in json.loads(out)["items"]
            if i["metadata"]["name"].startswith(FULLNAME)}


def test_the_hook_commands_apply_audit_and_delete_the_policies_with_the_hooks_own_permissions(cluster, hook):
    tmp, kubeconfig = hook
    applied = run_job(cluster, tmp, kubeconfig, render(cluster, tmp, "policies"), "apply")
    assert applied.returncode == 0, applied.stderr
    assert len(policies_in_cluster(cluster)) == 10, policies_in_cluster(cluster)

    def served():
        stored = json.loads(cluster.create(pod(namespace=NS, annotations={f"{P}/shm": "shm"}), "--dry-run=server")
                            .stdout)
        return "shm" in {v["name"] for v in stored["spec"].get("volumes", [])}
    wait_for("the applied policies to serve a pod", served, timeout=30, interval=0.5)

    def refused():  # each binding takes effect when the API server's informer sees it
        p = cluster.create(pod(namespace=NS, annotations={f"{P}/big": "type=emptyDir,size=20Gi,mountPath=/b"}),
                           "--dry-run=server", check=False)
        return p if p.returncode != 0 else None
    refusal = wait_for("the applied policies to refuse a pod over the policy", refused, timeout=30, interval=0.5)
    assert "maxSize.emptyDir" in refusal.stderr, refusal.stderr
    # The release's namespace is left alone, as the webhook leaves it.
    quiet = cluster.create(pod(namespace=RELEASE_NS, annotations={f"{P}/big": "nope"}), "--dry-run=server",
                           check=False)
    assert quiet.returncode == 0, quiet.stderr

    # policies.mode=both: the mutating policy goes, refusals become warnings.
    audited = run_job(cluster, tmp, kubeconfig, render(cluster, tmp, "both"), "apply")
    assert audited.returncode == 0, audited.stderr
    assert "deleted MutatingAdmissionPolicy/" in audited.stdout
    assert not any(n.startswith("MutatingAdmissionPolicy") for n in policies_in_cluster(cluster))

    def warned():
        p = cluster.create(pod(namespace=NS, annotations={f"{P}/big": "type=emptyDir,size=20Gi,mountPath=/b"}),
                           "--dry-run=server", check=False)
        return p if p.returncode == 0 and "maxSize.emptyDir" in p.stderr else None
    warning = wait_for("the audited policies to warn instead of refusing", warned, timeout=30, interval=0.5)
    assert "Warning:" in warning.stderr and "big" not in {
        v["name"] for v in json.loads(warning.stdout)["spec"].get("volumes", [])}

    # pre-delete: every object of the release's name goes.
    deleted = run_job(cluster, tmp, kubeconfig, render(cluster, tmp, "both"), "delete")
    assert deleted.returncode == 0, deleted.stderr
    assert policies_in_cluster(cluster) == set()


def test_the_hooks_permissions_stop_at_the_releases_names(cluster, hook):
    """Least privilege: the hook's ServiceAccount cannot write an admission policy of another
    name (its ClusterRole names the release's own)."""
    tmp, kubeconfig = hook
    other = cluster.run(BINARY, "policies", "--name=someone-else", "--delete", "--kubeconfig", kubeconfig,
                        check=False)
    assert other.returncode == 1 and "forbidden" in other.stderr.lower(), other.stderr
