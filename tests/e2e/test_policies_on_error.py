"""`onError: warn` in the admission policies against the webhook, in the real API server (1.37):
a pod either would refuse is admitted without volumes, with the refusal in the error
annotation and a warning, the stored pods identical but for the annotation's wording, which
names the same annotations and rules; a pod neither refuses is served as under `deny`; a Job
whose pods would be refused is admitted with a warning either way."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import nextflow_job, pod, release_fixture, wait_for
from test_policies import CASES, CONFIG, applied_policies, assert_same, both, named

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
    for ns in (WEBHOOK_NS, POLICIES_NS):
        cluster.namespace(ns)
    with applied_policies(cluster, WARN, "evi-warn", [POLICIES_NS], tmp_path_factory.mktemp("warn")) as docs:
        def warned_and_annotated():
            r = cluster.create(pod(namespace=POLICIES_NS, annotations={f"{P}/probe": "nope"}), "--dry-run=server")
            return "volumes not injected" in r.stderr and ERROR in json.loads(r.stdout)["metadata"]["annotations"]
        # The API server takes up the mutating and the validating policy each in its own time.
        wait_for("the policies to take effect", warned_and_annotated, timeout=30, interval=0.5)
        yield docs


@pytest.mark.parametrize("label,annotations,spec", WARN_CASES, ids=[c[0] for c in WARN_CASES])
def test_under_on_error_warn_the_policies_admit_what_the_webhook_admits_and_say_the_same(cluster, release, policies,
                                                                                      label, annotations, spec):
    webhook, policy = both(cluster, annotations, spec, (WEBHOOK_NS, POLICIES_NS))
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
