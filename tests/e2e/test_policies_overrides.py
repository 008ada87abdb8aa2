"""`policyOverrides` in the admission policies against the webhook, in the real API server (1.37):
each namespace gets its team's limits either way — the override naming the namespace, else the
labelled override with the most requirements, else `policy` — the policies reading the
Namespace's labels from `namespaceObject`, the webhook from its Namespace watch. Every case is
created in a namespace of each kind twice (one the webhook serves, one only the policies
serve): the stored pods identical, or both refused naming the same annotations and the same
override; and a namespace relabelled moves to its new team's limits at its next pod."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import installed, pod, wait_for
from test_policies import applied_policies, assert_same, named

P = "ephemeral-volumes.io"
KINDS = {"a": {"team": "a"}, "none": {}, "special": {"team": "b"}, "b": {"team": "b"}, "bgpu": {"team": "b", "gpu": "1"}}
CONFIG = {
    "clusterChecks": "off",
    "profiles": {"shm": {"mountPath": "/dev/shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}},
    "policy": {"maxSize": {"emptyDir": "1Gi", "memory": "2Gi"}, "maxVolumesPerPod": 3, "requireSizeLimit": True,
               "defaultSizeLimit": "512Mi", "storageClasses": ["gp3"]},
    "policyOverrides": [
        {"name": "team-a", "namespaceSelector": {"matchLabels": {"team": "a"}},
         "policy": {"maxSize": {"emptyDir": "10Gi"}, "defaultSizeLimit": "2Gi"}},
        {"name": "team-b", "namespaceSelector": {"matchLabels": {"team": "b"}},
         "policy": {"maxSize": {"emptyDir": "2Gi"}, "types": ["emptyDir"], "maxVolumesPerPod": 1}},
        # More requirements than team-b: wins where both select.
        {"name": "team-b-gpu", "namespaceSelector": {"matchLabels": {"team": "b"},
                                                     "matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
         "policy": {"maxSize": {"emptyDir": "5Gi", "memory": "8Gi"}, "storageClasses": ["gp3", "io2"]}},
        # By name: wins over its team=b label.
        {"name": "special", "namespaces": ["ovw-special", "ovp-special"], "policy": {"maxSize": {"emptyDir": "50Gi"}}},
    ],
}
VALUES = [
    "type=emptyDir,mountPath=/s",
    "type=emptyDir,size=1536Mi,mountPath=/s",
    "type=emptyDir,size=4Gi,mountPath=/s",
    "type=emptyDir,size=40Gi,mountPath=/s",
    "type=emptyDir,medium=Memory,size=4Gi,mountPath=/m",
    "type=ephemeral,size=1Gi,storageClass=io2,mountPath=/e",
    "profile=shm,size=3Gi",
    "shm",
]
CASES = [(kind, {f"{P}/v": value}) for kind, value in itertools.product(KINDS, VALUES)] + [
    (kind, {f"{P}/v": "shm", f"{P}/w": "type=emptyDir,size=1Gi,mountPath=/w"}) for kind in KINDS]


@pytest.fixture(scope="module")
def both_served(cluster, tmp_path_factory):
    """The webhook serving ovw-*, the policies ovp-*; every namespace labelled as its kind."""
    for kind, labels in KINDS.items():
        for side in ("ovw", "ovp"):
            cluster.namespace(f"{side}-{kind}", labels)
    policies_ns = [f"ovp-{kind}" for kind in KINDS] + ["ovp-move"]
    tmp = tmp_path_factory.mktemp("overrides")
    values = {"config": CONFIG, "webhook": {"excludeNamespaces": policies_ns}}
    with applied_policies(cluster, CONFIG, "evi-ov", policies_ns, tmp), \
            installed(cluster, "evi-ov", values, tmp, service_account=True):
        big = pod(annotations={f"{P}/v": "type=emptyDir,size=40Gi,mountPath=/s"})
        for side in ("ovw", "ovp"):
            wait_for(f"{side}-special served", lambda side=side: cluster.create(
                {**big, "metadata": {**big["metadata"], "namespace": f"{side}-special"}}, "--dry-run=server",
                check=False).returncode == 0, timeout=30, interval=0.5)
        # The webhook's Namespace watch has listed the labels.
        wait_for("team-a's limits in ovw-a", lambda: cluster.create(pod(namespace="ovw-a", annotations={
            f"{P}/v": "type=emptyDir,size=4Gi,mountPath=/s"}), "--dry-run=server", check=False).returncode == 0,
            timeout=30, interval=0.5)
        # The API server compiles each policy in its own time: with these four overrides every
        # expression that reads a limit is there five times; on two cores `kubectl apply` takes
        # ~20 s (the expressions are checked) and the policies are in force ~30 s after it,
        # twice that with a build beside it. Both must be: the validating one refuses, the
        # mutating one injects.
        shm = pod(namespace="ovp-none", annotations={f"{P}/v": "shm"})

        def in_force():
            out = cluster.create({**big, "metadata": {**big["metadata"], "namespace": "ovp-none"}},
                                 "--dry-run=server", check=False)
            if "ValidatingAdmissionPolicy" not in out.stderr:
                raise AssertionError(f"the big pod: exit {out.returncode}: {out.stderr.strip() or out.stdout[:300]}")
            volumes = json.loads(cluster.create(shm, "--dry-run=server").stdout)["spec"].get("volumes", [])
            if "v" not in {v["name"] for v in volumes}:
                raise AssertionError(f"the shm pod's volumes: {volumes}")
            return True
        wait_for("the policies in force in ovp-none", in_force, timeout=300, interval=1)
        yield


def origins(message: str) -> set[str]:
    """The policies a refusal names: an override's, or the configuration's."""
    import re
    return set(re.findall(r"(policyOverrides\[[a-z-]+\]\.policy|(?<![\w\].])policy)\.(?:maxSize|types|storageClasses|"
                          r"maxVolumesPerPod)", message))


@pytest.mark.parametrize("kind,asks", CASES, ids=[f"{k}: {sorted(a.values())}" for k, a in CASES])
def test_each_namespace_gets_its_teams_limits_either_way(cluster, both_served, kind, asks):
    webhook, policy = (cluster.create(pod(namespace=f"{side}-{kind}", annotations=asks), "--dry-run=server",
                                      check=False) for side in ("ovw", "ovp"))
    if webhook.returncode == 0:
        assert policy.returncode == 0, f"the webhook admits, the policies refuse:\n{policy.stderr}"
        assert_same(json.loads(webhook.stdout), json.loads(policy.stdout), kind)
    else:
        assert policy.returncode != 0, f"the webhook refuses, the policies admit:\n{webhook.stderr}"
        assert named(policy.stderr) == named(webhook.stderr), (webhook.stderr, policy.stderr)
        assert origins(policy.stderr) == origins(webhook.stderr) != set(), (webhook.stderr, policy.stderr)


def test_the_corpus_meets_every_policy(cluster, both_served):
    """Each override and the configuration's policy refuses something in the corpus."""
    said = set()
    for kind, asks in CASES:
        said |= origins(cluster.create(pod(namespace=f"ovw-{kind}", annotations=asks), "--dry-run=server",
                                       check=False).stderr)
    assert said == {"policy", "policyOverrides[team-a].policy", "policyOverrides[team-b].policy",
                    "policyOverrides[team-b-gpu].policy", "policyOverrides[special].policy"}, said


def test_a_namespace_relabelled_moves_to_its_new_teams_limits_at_its_next_pod(cluster, both_served):
    cluster.namespace("ovp-move", {"team": "a"})
    asks = pod(namespace="ovp-move", annotations={f"{P}/v": "type=emptyDir,size=4Gi,mountPath=/s"})
    wait_for("admitted under team-a", lambda: cluster.create(asks, "--dry-run=server", check=False).returncode == 0,
             timeout=30, interval=0.5)
    cluster.kubectl("label", "namespace", "ovp-move", "team=b", "--overwrite")
    # The API server reads namespaceObject from its own cache of Namespaces: at once, or nearly.
    refused = wait_for("refused under team-b", lambda: (lambda r: r if r.returncode != 0 else None)(
        cluster.create(asks, "--dry-run=server", check=False)), timeout=10, interval=0.2)
    assert "policyOverrides[team-b].policy.maxSize.emptyDir (2Gi)" in refused.stderr, refused.stderr
