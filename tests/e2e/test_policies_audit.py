"""`mode: audit` in the admission policies against the webhook, in the real API server (1.37):
every case of the parity corpus is admitted as it is either way, and what enforcing would do
is said as a warning — the volumes it would inject, or the refusal naming the same
annotations and rules. The one documented difference: past the 64 volume annotations a pod
may have, the webhook still refuses (a bound of its own work), the policies warn."""

from __future__ import annotations

import copy
import json
import re

import pytest
from conftest import nextflow_job, pod, release_fixture, wait_for
from test_policies import CASES, CONFIG, applied_policies, assert_same, both, named

P = "ephemeral-volumes.io"
WEBHOOK_NS = "audit-webhook"
POLICIES_NS = "audit-policies"
AUDIT = {**copy.deepcopy(CONFIG), "mode": "audit"}
AUDIT["rules"][0]["namespaces"] = [WEBHOOK_NS, POLICIES_NS]

release = release_fixture("evi-audit", {"config": AUDIT, "webhook": {"excludeNamespaces": [POLICIES_NS]}})

AUDIT_CASES = [c for c in CASES if "more annotations than any pod may have" not in c[0]]


@pytest.fixture(scope="module")
def policies(cluster, release, tmp_path_factory):
    for ns in (WEBHOOK_NS, POLICIES_NS):
        cluster.namespace(ns)
    with applied_policies(cluster, AUDIT, "evi-audit", [POLICIES_NS], tmp_path_factory.mktemp("audit")) as docs:
        assert not [d for d in docs if d["kind"].startswith("Mutating")]
        wait_for("the policies to warn", lambda: "would refuse" in cluster.create(
            pod(namespace=POLICIES_NS, annotations={f"{P}/probe": "nope"}), "--dry-run=server").stderr,
            timeout=30, interval=0.5)
        yield docs


def said(stderr: str) -> tuple[set[str], set[str]]:
    """What the warnings say enforcing would do: the volumes injected, and what a refusal names."""
    injected, refused = set(), set()
    for line in stderr.splitlines():
        if m := re.search(r"would inject (.*)$", line):
            injected |= set(m.group(1).split(", "))
        if "would refuse the pod" in line:
            refused |= named(line) or {"(the pod)"}
    return injected, refused


@pytest.mark.parametrize("label,annotations,spec", AUDIT_CASES, ids=[c[0] for c in AUDIT_CASES])
def test_under_mode_audit_both_admit_unchanged_and_say_what_enforcing_would_do(cluster, release, policies, label,
                                                                             annotations, spec):
    webhook, policy = both(cluster, annotations, spec, (WEBHOOK_NS, POLICIES_NS))
    assert webhook.returncode == 0, webhook.stderr
    assert policy.returncode == 0, policy.stderr
    assert_same(json.loads(webhook.stdout), json.loads(policy.stdout), label)
    assert said(webhook.stderr) == said(policy.stderr), (webhook.stderr, policy.stderr)
    injected, refused = said(webhook.stderr)
    assert bool(refused) == label.startswith("refused"), webhook.stderr
    assert bool(injected) != bool(refused) or not (injected or refused), webhook.stderr


def test_a_job_whose_pods_would_be_refused_is_admitted_with_the_refusal_said_either_way(cluster, release, policies):
    for ns in (WEBHOOK_NS, POLICIES_NS):
        result = cluster.create(nextflow_job(None, ns, {f"{P}/tmp": "nope"}), "--dry-run=server", check=False)
        assert result.returncode == 0, result.stderr
        assert said(result.stderr)[1] == {f"{P}/tmp"}, result.stderr
