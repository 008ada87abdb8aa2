"""failurePolicy: Fail with the webhook down: only pods that ask are refused. And the chart's
matchConditions, compiled and evaluated by the API server's own CEL, agree with the webhook's
own rule matching for every rule shape the chart can generate."""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest
import yaml
from conftest import BINARY, CHART, HELM, RELEASE_NS, installed, nextflow_job, pod, wait_for

P = "ephemeral-volumes.io"


@pytest.fixture(scope="module")
def stopped(cluster, tmp_path_factory):
    """The chart installed, its webhook URL pointing at a port where nothing listens."""
    values = {"config": {"rules": [{"name": "nf", "namespaces": ["nf-down"],
                                    "podSelector": {"matchLabels": {"nextflow.io/app": "nextflow"}},
                                    "volumes": {"scratch": "type=emptyDir,mountPath=/scratch,size=1Gi"}}]},
              "webhook": {"excludeNamespaces": ["excluded"], "failurePolicy": "Fail"}}
    with installed(cluster, "evi-down", values, tmp_path_factory.mktemp("down"), start=False) as r:
        ns = cluster.namespace("nf-down")
        probe = pod(namespace=ns, annotations={f"{P}/x": "type=emptyDir,mountPath=/x"})
        wait_for("the webhook configuration to take effect",
                 lambda probe=probe: cluster.create(probe, "--dry-run=server", check=False).returncode != 0)
        yield r


def test_with_the_webhook_down_only_pods_that_ask_are_refused(cluster, stopped):
    ns = "nf-down"
    asks = cluster.create(pod(namespace=ns, annotations={f"{P}/scratch": "type=emptyDir,mountPath=/s"}), check=False)
    assert asks.returncode != 0
    assert "failed calling webhook" in asks.stderr and f"volumes.{P}" in asks.stderr
    by_rule = cluster.create(pod(namespace=ns, labels={"nextflow.io/app": "nextflow"}), check=False)
    assert by_rule.returncode != 0, "a pod a rule matches must not be created without its volume"

    # Pods that asked for nothing are admitted and stored unchanged.
    nothing = cluster.create_pod(pod(namespace=ns, annotations={"other.example.com/a": "b"}, labels={"app": "x"}))
    assert "annotations" in nothing["metadata"] and "volumes" in nothing["spec"]
    bare = pod(namespace=ns)
    bare["metadata"].pop("annotations", None)
    bare["metadata"].pop("labels", None)
    stored = cluster.create_pod(bare)
    assert "labels" not in stored["metadata"] and "annotations" not in stored["metadata"]
    # The same labels outside the rule's namespace: not sent.
    other = cluster.namespace("nf-down-other")
    cluster.create_pod(pod(namespace=other, labels={"nextflow.io/app": "nextflow"}))
    # Excluded namespaces: never sent, even when they ask.
    for ns in ("kube-system", RELEASE_NS, cluster.namespace("excluded")):
        cluster.create_pod(pod(namespace=ns, annotations={f"{P}/scratch": "type=emptyDir,mountPath=/s"}))


def test_with_the_webhook_down_a_job_that_asks_is_refused_at_creation(cluster, stopped):
    ns = "nf-down"
    asks = cluster.create(nextflow_job(None, ns, {f"{P}/scratch": "type=emptyDir,mountPath=/s"}, labels=None), check=False)
    assert asks.returncode != 0, "a Job whose pods can never be admitted must not be created"
    assert "failed calling webhook" in asks.stderr and f"workloads.{P}" in asks.stderr, asks.stderr
    by_rule = cluster.create(nextflow_job(None, ns, labels={"nextflow.io/app": "nextflow"}), check=False)
    assert by_rule.returncode != 0 and f"workloads.{P}" in by_rule.stderr, by_rule.stderr
    # A Job that asks for nothing is never sent.
    nothing = json.loads(cluster.create(nextflow_job(None, ns, {"other.example.com/a": "b"}, labels={"app": "x"})).stdout)
    assert nothing["kind"] == "Job"
    cluster.kubectl("delete", "job", nothing["metadata"]["name"], "-n", ns, "--wait=false")
    # Excluded namespaces: neither pods nor workloads are ever sent.
    for ns in (RELEASE_NS, "excluded"):
        cluster.create(nextflow_job(None, ns, {f"{P}/scratch": "type=emptyDir,mountPath=/s"}, labels=None), "--dry-run=server")


# === the chart's CEL against the webhook's matcher ===

RULE_SHAPES = [
    {"namespaces": ["a"]},
    {"namespaces": ["a", "b"]},
    {"podSelector": {}},
    {},
    {"podSelector": {"matchLabels": {"k": "v"}}},
    {"podSelector": {"matchLabels": {"k": "v", "k2": "v2"}}},
    {"namespaces": ["b"], "podSelector": {"matchLabels": {"k": "v"}}},
    {"podSelector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v", "w"]}]}},
    {"podSelector": {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["v"]}]}},
    {"podSelector": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}},
    {"podSelector": {"matchExpressions": [{"key": "k", "operator": "DoesNotExist"}]}},
    {"namespaces": ["a"], "podSelector": {"matchLabels": {"k2": "v2"},
                                          "matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["v"]}]}},
]
LABELS = [None, {}, {"k": "v"}, {"k": "w"}, {"k": "x"}, {"k2": "v2"}, {"k": "v", "k2": "v2"}]
NAMESPACES = ["a", "b", "c"]


def webhook_config_for(shape: dict, release: str, prefix: str, kind: str, tmp_path) -> tuple[dict, dict]:
    """A configuration with one rule of this shape (its own prefix and webhook names, apart
    from any other release's), and the chart's webhook configuration of `kind` rendered for it,
    pointing at a closed port."""
    config = {"annotationPrefix": prefix, "rules": [{"name": "r", **shape,
                                                     "volumes": {"v": "type=emptyDir,mountPath=/v,size=1Gi"}}]}
    values = tmp_path / f"values-{release}.yaml"
    values.write_text(yaml.safe_dump({"config": config, "webhook": {"url": "https://127.0.0.1:1/mutate"}}))
    rendered = subprocess.run([HELM, "template", release, str(CHART), "-n", RELEASE_NS, "-f", str(values),
                               "--kube-version", "1.37.0", "--show-only", "templates/webhook.yaml"],
                              capture_output=True, text=True, check=True).stdout
    return config, next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == kind)


def webhook_matches(config: dict, namespace: str, labels: dict | None, tmp_path) -> bool:
    """The webhook's own rule matching, through `mutate` with the same configuration."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    p = pod(name="p", namespace=namespace, labels=labels)
    out = subprocess.run([str(BINARY), "mutate", "--config", str(cfg), "-n", namespace, "-f", "-", "-o", "patch"],
                         input=json.dumps(p), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) != []


def test_chart_match_conditions_agree_with_the_webhook_on_every_rule_shape(cluster, tmp_path):
    for ns in NAMESPACES:
        cluster.namespace(ns)
    disagreements = []
    for i, shape in enumerate(RULE_SHAPES):
        # The chart's MutatingWebhookConfiguration alone, rendered for this rule, pointing at a
        # closed port: the API server refuses exactly the pods its CEL sends.
        config, mwc = webhook_config_for(shape, f"cel{i}", "cel.example.com", "MutatingWebhookConfiguration", tmp_path)
        cluster.create(mwc)
        probe = pod(namespace="a", annotations={"cel.example.com/x": "type=emptyDir,mountPath=/x"})
        wait_for("the configuration to take effect",
                 lambda probe=probe: cluster.create(probe, "--dry-run=server", check=False).returncode != 0)
        try:
            for ns, labels in itertools.product(NAMESPACES, LABELS):
                p = pod(namespace=ns, labels=labels)
                p["metadata"].pop("annotations", None)
                api = cluster.create(p, "--dry-run=server", check=False)
                sent = api.returncode != 0
                if sent:
                    assert "failed calling webhook" in api.stderr, api.stderr
                ours = webhook_matches(config, ns, labels, tmp_path)
                if sent != ours:
                    disagreements.append(f"rule {shape}, namespace {ns}, labels {labels}: "
                                         f"API server CEL {'sends' if sent else 'skips'}, webhook "
                                         f"{'matches' if ours else 'does not match'}")
        finally:
            cluster.kubectl("delete", "mutatingwebhookconfiguration", mwc["metadata"]["name"], "--wait=true")
            wait_for("the configuration to be gone",
                     lambda probe=probe: cluster.create(probe, "--dry-run=server", check=False).returncode == 0)
    assert not disagreements, "\n".join(disagreements)


def workload_of(kind: str, name: str, namespace: str, labels: dict | None) -> dict:
    """A workload of `kind` whose pod template has `labels` and no annotations."""
    template = {"metadata": {"labels": dict(labels)} if labels is not None else {},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
                "spec": {"backoffLimit": 0, "template": template}}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": namespace},
                "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": template}}}}
    template["spec"]["restartPolicy"] = "Always"
    template["metadata"].setdefault("labels", {})["sel"] = name
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"sel": name}}, "template": template}}


def test_chart_workload_match_conditions_agree_with_the_webhook_on_every_rule_shape(cluster, tmp_path):
    """The ValidatingWebhookConfiguration's CEL (template labels, one level deeper for CronJob),
    compiled by the API server, against the webhook's own matcher on the same templates."""
    for ns in NAMESPACES:
        cluster.namespace(ns)
    cases = list(itertools.product(NAMESPACES, range(len(LABELS))))
    disagreements = []
    for i, shape in enumerate(RULE_SHAPES):
        config, vwc = webhook_config_for(shape, f"celw{i}", "celw.example.com", "ValidatingWebhookConfiguration",
                                         tmp_path)
        cluster.create(vwc)
        probe = workload_of("Job", "probe", "a", None)
        probe["spec"]["template"]["metadata"]["annotations"] = {"celw.example.com/x": "type=emptyDir,mountPath=/x"}
        wait_for("the configuration to take effect",
                 lambda probe=probe: cluster.create(probe, "--dry-run=server", check=False).returncode != 0)
        ours = {(ns, j): webhook_matches(config, ns, LABELS[j], tmp_path) for ns, j in cases}
        try:
            for kind in ("Job", "CronJob", "Deployment"):
                # One kubectl call per kind: every (namespace, labels) case in a List; the API
                # server refuses exactly those its CEL sends to the closed port.
                items = [workload_of(kind, f"w-{ns}-{j}", ns, LABELS[j]) for ns, j in cases]
                out = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(
                    {"apiVersion": "v1", "kind": "List", "items": items}), check=False)
                admitted = {line.rsplit("/", 1)[-1] for line in out.stdout.split()}
                assert "is invalid" not in out.stderr, out.stderr
                for ns, j in cases:
                    name = f"w-{ns}-{j}"
                    sent = name not in admitted
                    if sent:
                        assert "failed calling webhook" in out.stderr, out.stderr
                    if sent != ours[ns, j]:
                        disagreements.append(f"{kind}, rule {shape}, namespace {ns}, labels {LABELS[j]}: "
                                             f"API server CEL {'sends' if sent else 'skips'}, webhook "
                                             f"{'matches' if ours[ns, j] else 'does not match'}")
        finally:
            cluster.kubectl("delete", "validatingwebhookconfiguration", vwc["metadata"]["name"], "--wait=true")
            wait_for("the configuration to be gone",
                     lambda probe=probe: cluster.create(probe, "--dry-run=server", check=False).returncode == 0)
    assert not disagreements, "\n".join(disagreements)
