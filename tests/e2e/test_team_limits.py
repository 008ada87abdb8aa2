"""Limits per team (`policyOverrides`) against the real API server: the webhook reads the
Namespaces' labels with the chart's own ServiceAccount (the chart's RBAC is what is tested),
gives each namespace its team's limits, names the override in a refusal, and follows a
namespace relabelled while pods are created."""

from __future__ import annotations

import time

import pytest
from conftest import SteadyCreator, installed, pod, wait_for

P = "ephemeral-volumes.io"
CONFIG = {
    # No cluster checks: the Namespace watch alone makes the webhook read the cluster.
    "clusterChecks": "off",
    "policy": {"maxSize": {"emptyDir": "1Gi"}},
    "policyOverrides": [
        {"name": "team-a", "namespaceSelector": {"matchLabels": {"team": "a"}},
         "policy": {"maxSize": {"emptyDir": "10Gi"}}},
        {"name": "team-b", "namespaceSelector": {"matchLabels": {"team": "b"}},
         "policy": {"maxSize": {"emptyDir": "2Gi"}, "types": ["emptyDir"]}},
        {"name": "special", "namespaces": ["teams-special"], "policy": {"maxSize": {"emptyDir": "50Gi"}}},
    ],
}


@pytest.fixture(scope="module")
def teams(cluster, tmp_path_factory):
    for name, labels in (("teams-a", {"team": "a"}), ("teams-none", {}), ("teams-special", {"team": "b"})):
        cluster.namespace(name, labels)
    with installed(cluster, "evi-teams", {"config": CONFIG}, tmp_path_factory.mktemp("teams"),
                   service_account=True) as r:
        yield r


def asking(ns: str, size: str) -> dict:
    return pod(namespace=ns, annotations={f"{P}/scratch": f"type=emptyDir,mountPath=/scratch,size={size}"})


def dry_run(cluster, obj: dict):
    return cluster.create(obj, "--dry-run=server", check=False)


def test_each_namespace_gets_its_teams_limits_and_a_refusal_names_the_override(cluster, teams):
    wait_for("the Namespace labels read", lambda: dry_run(cluster, asking("teams-a", "5Gi")).returncode == 0,
             timeout=20)
    cases = [
        ("teams-a", "5Gi", None),
        ("teams-a", "12Gi", "size 12Gi exceeds policyOverrides[team-a].policy.maxSize.emptyDir (10Gi)"),
        ("teams-none", "5Gi", "size 5Gi exceeds policy.maxSize.emptyDir (1Gi)"),
        ("teams-none", "512Mi", None),
        # Listed by name: wins over its team=b label.
        ("teams-special", "40Gi", None),
    ]
    for ns, size, want in cases:
        p = dry_run(cluster, asking(ns, size))
        if want is None:
            assert p.returncode == 0, (ns, size, p.stderr)
        else:
            assert p.returncode != 0 and want in p.stderr, (ns, size, p.stderr)
    # The chart grants exactly what the watch uses: list and watch, not get or update.
    who = f"system:serviceaccount:evi-system:{teams.fullname}"

    def can(*args) -> bool:
        return cluster.kubectl("auth", "can-i", "--as", who, *args, check=False).stdout.strip() == "yes"

    assert can("list", "namespaces") and can("watch", "namespaces")
    assert not can("get", "namespaces/teams-a") and not can("update", "namespaces/teams-a")


def test_a_namespace_relabelled_while_pods_are_created_moves_to_its_new_teams_limits(cluster, teams):
    """teams-a relabelled team=a → team=b while a 5Gi pod is created every 0.2 s: admitted
    under team-a (10Gi), then refused under team-b (2Gi) from the first request after the
    watch brings the change, never admitted again."""
    cluster.namespace("teams-move", {"team": "a"})
    obj = asking("teams-move", "5Gi")
    wait_for("admitted under team-a", lambda: dry_run(cluster, obj).returncode == 0, timeout=20)
    with SteadyCreator(cluster, obj, interval=0.2) as load:
        load.wait_sent(load.sent + 5)
        relabelled = time.monotonic()
        cluster.kubectl("label", "namespace", "teams-move", "team=b", "--overwrite")
        load.wait_sent(load.sent + 15)
    before = [o for o in load.outcomes if o[0] < relabelled]
    after = [o for o in load.outcomes if o[0] >= relabelled]
    first = next(i for i, o in enumerate(after) if not o[2])
    lag = after[first][0] - relabelled
    print(f"\nrelabelled team=a -> team=b: {len(before)} admitted before, the first refusal sent {lag:.2f} s "
          f"after the label, then {len(after) - first} refused of {len(after) - first}")
    assert before and all(o[2] for o in before)
    assert all(not o[2] and "policyOverrides[team-b].policy.maxSize.emptyDir (2Gi)" in o[3] for o in after[first:])
    assert lag < 5
    # And back: the relabel is followed both ways.
    cluster.kubectl("label", "namespace", "teams-move", "team-")
    wait_for("the global policy again", lambda: "policy.maxSize.emptyDir (1Gi)" in dry_run(cluster, obj).stderr,
             timeout=10)
