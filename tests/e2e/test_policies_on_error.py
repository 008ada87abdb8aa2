"""`onError: warn` in the admission policies against the webhook, in the real API server (1.37):
a pod either would refuse is admitted without volumes, with the refusal in the error
annotation and a warning, the stored pods identical but for the annotation's wording, which
names the same annotations and rules; a pod neither refuses is served as under `deny`; a Job
whose pods would be refused is admitted with a warning either way."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml
from conftest import BINARY, nextflow_job, pod, release_fixture, wait_for
from test_policies import CASES, CONFIG, assert_same, named

P = "ephemeral-volumes.io"
WEBHOOK_NS = "warn-webhook"
POLICIES_NS = "warn-policies"
WARN = {**copy.deepcopy(CONFIG), "onError": "warn"}
WARN["rules"][0]["namespaces"] = [WEBHOOK_NS, POLICIES_NS]
ERROR = f"injector.{P}/error"

release = release_fixture("evi-warn", {"config": WARN, "webhook": {"excludeNamespaces": [POLICIES_NS]}})

# The refusals and a few admissions of the parity corpus.
WARN_CASES = [c for c in CASES if c[0].startswith("refused")] + [c for c in CASES if not c[0].startswith("refused")][::9]


@pytest.fixture(scope="module")
def policies(cluster, release, tmp_path_factory):
    path = tmp_path_factory.mktemp("warn") / "config.yaml"
    path.write_text(yaml.safe_dump(WARN))
    out = subprocess.run([str(BINARY), "policies", "--config", str(path), "--name", "evi-warn"],
                         capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for d in docs:
        if d["kind"].endswith("Binding"):
            d["spec"]["matchResources"] = {"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [POLICIES_NS]}]}}
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    for ns in (WEBHOOK_NS, POLICIES_NS):
        cluster.namespace(ns)
    cluster.kubectl("apply", "-f", "-", input=items)
    def warned_and_annotated():
        r = cluster.create(pod(namespace=POLICIES_NS, annotations={f"{P}/probe": "nope"}), "--dry-run=server")
        return "volumes not injected" in r.stderr and ERROR in json.loads(r.stdout)["metadata"]["annotations"]
    # The API server takes up the mutating and the validating policy each in its own time.
    wait_for("the policies to take effect", warned_and_annotated, timeout=30, interval=0.5)
    yield docs
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=items)


def created(cluster, ns: str, annotations: dict, spec: dict) -> subprocess.CompletedProcess:
    p = pod(namespace=ns, annotations=annotations, labels=spec.get("labels"))
    p["spec"].update({k: v for k, v in copy.deepcopy(spec).items() if k not in ("field", "labels")})
    return cluster.create(p, "--dry-run=server", check=False)


@pytest.mark.parametrize("label,annotations,spec", WARN_CASES, ids=[c[0] for c in WARN_CASES])
def test_under_on_error_warn_the_policies_admit_what_the_webhook_admits_and_say_the_same(cluster, release, policies,
                                                                                      label, annotations, spec):
    webhook, policy = (created(cluster, ns, annotations, spec) for ns in (WEBHOOK_NS, POLICIES_NS))
    assert webhook.returncode == 0, webhook.stderr
    assert policy.returncode == 0, policy.stderr
    stored = [json.loads(r.stdout) for r in (webhook, policy)]
    errors = [p["metadata"].get("annotations", {}).pop(ERROR, None) for p in stored]
    assert (errors[0] is None) == (errors[1] is None), errors
    assert_same(*stored, label)
    if errors[0] is not None:
        assert label.startswith("refused"), errors
        assert named(errors[0]) == named(errors[1]), errors
        for side, r in (("webhook", webhook), ("policies", policy)):
            assert "volumes not injected: " in r.stderr, (side, errors)
            assert named(r.stderr) == named(errors[0]), (r.stderr, errors)
        if "field" in spec:
            assert spec["field"] in errors[0] and spec["field"] in errors[1], errors
    else:
        assert not label.startswith("refused"), label


def test_a_job_whose_pods_would_be_refused_is_admitted_with_a_warning_either_way(cluster, release, policies):
    for ns in (WEBHOOK_NS, POLICIES_NS):
        result = cluster.create(nextflow_job(None, ns, {f"{P}/tmp": "nope"}), "--dry-run=server", check=False)
        assert result.returncode == 0, result.stderr
        assert "volumes not injected: " in result.stderr and f"annotation {P}/tmp" in result.stderr, result.stderr
