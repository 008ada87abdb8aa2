"""mode: audit against the real API server: an audited rule or profile is decided as if
enforced, changes nothing in the stored pod, refuses nothing, and what it would have done
reaches kubectl as a warning, the decision log and evi_audit_decisions_total."""

from __future__ import annotations

import json

from conftest import pod, release_fixture, volumes_by_name, wait_for

P = "audit.evi.test"
INJECTED = f"injector.{P}/injected"

VALUES = {
    "config": {
        "annotationPrefix": P,
        "profiles": {
            "big": {"mode": "audit", "mountPath": "/big", "emptyDir": {"sizeLimit": "1Gi"}},
        },
        "rules": [
            {"name": "audited-scratch", "mode": "audit", "namespaces": ["nf-audit"],
             "podSelector": {"matchLabels": {"nextflow.io/app": "nextflow"}},
             "volumes": {"scratch": "type=emptyDir,mountPath=/scratch,size=1Gi"}},
        ],
        "policy": {"maxSize": {"emptyDir": "2Gi"}},
    },
}


release = release_fixture("evi-audit", VALUES)


def create(cluster, obj: dict) -> tuple[dict, list[str]]:
    """Creates through kubectl: the object as stored, and the warnings kubectl printed."""
    p = cluster.create(obj)
    warnings = [line.removeprefix("Warning: ") for line in p.stderr.splitlines() if line.startswith("Warning: ")]
    return json.loads(p.stdout), warnings


def test_an_audited_rule_injects_nothing_and_says_what_it_would_inject(cluster, release):
    ns = cluster.namespace("nf-audit")
    before = release.webhook.metric("evi_audit_decisions_total", source="rule/audited-scratch", result="mutated")
    audited_before = len([e for e in release.webhook.log() if e.get("message") == "audited"])
    stored, warnings = create(cluster, pod(namespace=ns, labels={"nextflow.io/app": "nextflow"}))
    assert warnings == ["audit (rule/audited-scratch): would inject scratch"]
    assert "scratch" not in volumes_by_name(stored)
    assert INJECTED not in stored["metadata"].get("annotations", {})
    assert release.webhook.metric("evi_audit_decisions_total", source="rule/audited-scratch",
                                  result="mutated") == before + 1
    def audited_since():  # the log is written in batches, a few ms after the decision
        return [e for e in release.webhook.log() if e.get("message") == "audited"][audited_before:]
    logged = wait_for("this pod's audit in the log", audited_since, timeout=5, interval=0.05)
    assert logged[-1]["sources"] == "rule/audited-scratch" and logged[-1]["result"] == "mutated", logged[-1:]


def test_an_audited_profile_over_policy_is_admitted_with_the_refusal_it_would_meet(cluster, release):
    ns = cluster.namespace("nf")
    stored, warnings = create(cluster, pod(namespace=ns, annotations={f"{P}/big": "profile=big,size=3Gi"}))
    assert warnings == [f"audit (profile/big): would refuse the pod (403): annotation {P}/big: "
                        "size 3Gi exceeds policy.maxSize.emptyDir (2Gi)"]
    assert "big" not in volumes_by_name(stored)
    # An enforced request beside the audited one is served as always.
    stored, warnings = create(cluster, pod(namespace=ns, annotations={
        f"{P}/big": "big", f"{P}/tmp": "type=emptyDir,mountPath=/tmp/x,size=1Gi"}))
    assert warnings == ["audit (profile/big): would inject big"]
    assert "tmp" in volumes_by_name(stored) and "big" not in volumes_by_name(stored)
    assert stored["metadata"]["annotations"][INJECTED] == "tmp"


def test_a_would_be_refusal_is_credited_only_to_the_source_that_causes_it(cluster, release):
    """The audited rule matches the pod too, but only the audited profile over policy would
    refuse it: the warning and the counter name the profile, never the rule."""
    ns = cluster.namespace("nf-audit")
    metric = release.webhook.metric
    rule_before = metric("evi_audit_decisions_total", source="rule/audited-scratch", result="denied")
    profile_before = metric("evi_audit_decisions_total", source="profile/big", result="denied")
    stored, warnings = create(cluster, pod(namespace=ns, labels={"nextflow.io/app": "nextflow"},
                                           annotations={f"{P}/big": "profile=big,size=3Gi"}))
    assert warnings == [f"audit (profile/big): would refuse the pod (403): annotation {P}/big: "
                        "size 3Gi exceeds policy.maxSize.emptyDir (2Gi)"]
    assert "big" not in volumes_by_name(stored) and "scratch" not in volumes_by_name(stored)
    assert metric("evi_audit_decisions_total", source="profile/big", result="denied") == profile_before + 1
    assert metric("evi_audit_decisions_total", source="rule/audited-scratch", result="denied") == rule_before
