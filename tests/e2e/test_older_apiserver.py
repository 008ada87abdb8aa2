"""The chart and the webhook against an older kube-apiserver (1.29, built like 1.37): its
matchConditions are beta there, and the patch must suit its validation. And the chart's
fallback for clusters without matchConditions (before 1.28): the objectSelector that sends
only labelled pods, applied to a real API server."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import CHART, HELM, RELEASE_NS, Cluster, Release, pod, volumes_by_name, wait_for
from controlplane import ControlPlane, older_apiserver

P = "ephemeral-volumes.io"


@pytest.fixture(scope="module")
def old_cluster(tmp_path_factory):
    # No controller manager: a 1.37 one would not talk to a 1.29 API server; the
    # ServiceAccounts it would create are created here.
    old = older_apiserver()
    assert old.name == "kube-apiserver-v1.29.15", old
    cp = ControlPlane(tmp_path_factory.mktemp("old-controlplane"), apiserver=str(old), controllers=False)
    cp.start()
    cluster = Cluster(cp)
    assert json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"] == "v1.29.15"
    for ns in ("nf", RELEASE_NS):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("create", "serviceaccount", "default", "-n", ns)
        cluster.namespaces.add(ns)
    yield cluster
    cp.stop()


def test_the_chart_and_webhook_work_on_kubernetes_1_29(old_cluster, tmp_path):
    release = Release(old_cluster, "evi", {"config": {}}, tmp_path / "release").install()
    try:
        mwc = old_cluster.get("mutatingwebhookconfiguration", release.fullname)
        assert mwc["webhooks"][0]["matchConditions"][0]["name"] == "asks-for-volumes"
        release.start_webhook()
        asks = pod(namespace="nf", annotations={f"{P}/scratch": "type=ephemeral,storageClass=gp3,size=10Gi,mountPath=/scratch"})
        stored = wait_for("the webhook configuration to take effect",
                          lambda: (p := old_cluster.create_pod(asks)) and "scratch" in volumes_by_name(p) and p)
        assert stored["metadata"]["annotations"][f"injector.{P}/injected"] == "scratch"
        nothing = old_cluster.create_pod(pod(namespace="nf"))
        assert "scratch" not in volumes_by_name(nothing)
    finally:
        release.uninstall()


def test_the_fallback_without_match_conditions_sends_only_labelled_pods(old_cluster, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"webhook": {"url": "https://127.0.0.1:1/mutate"}}))
    rendered = subprocess.run([HELM, "template", "evi-legacy", str(CHART), "-n", RELEASE_NS, "-f", str(values),
                               "--kube-version", "1.27.0", "--show-only", "templates/webhook.yaml"],
                              capture_output=True, text=True, check=True).stdout
    mwc = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "MutatingWebhookConfiguration")
    assert "matchConditions" not in mwc["webhooks"][0]
    old_cluster.create(mwc)
    try:
        labelled = pod(namespace="nf", labels={f"{P}/inject": "true"},
                       annotations={f"{P}/scratch": "type=emptyDir,mountPath=/s"})
        wait_for("the configuration to take effect",
                 lambda: old_cluster.create(labelled, "--dry-run=server", check=False).returncode != 0)
        refused = old_cluster.create(labelled, check=False)
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr
        # Without the label, nothing is sent: with the webhook down such a pod is admitted
        # unchanged, annotation or not (why the fallback asks users to label their pods).
        unlabelled = old_cluster.create_pod(pod(namespace="nf", annotations={f"{P}/scratch": "type=emptyDir,mountPath=/s"}))
        assert "scratch" not in volumes_by_name(unlabelled)
    finally:
        old_cluster.kubectl("delete", "mutatingwebhookconfiguration", mwc["metadata"]["name"])
