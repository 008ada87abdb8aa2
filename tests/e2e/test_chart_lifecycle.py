"""The chart through its life in a real API server: install with the default TLS mode, upgrade,
uninstall. Every object must be accepted and stored; the upgrade keeps the CA (the `lookup`
reuse); uninstall leaves no webhook configuration behind."""

from __future__ import annotations

import base64

import yaml
from conftest import CHART, RELEASE_NS

# Its own prefix, so that its webhook (whose Service has no endpoints here) never sees the other
# tests' pods.
# No node runs here: the install check's hook Job could not run (test_node.py runs it).
VALUES = ["--set", "config.annotationPrefix=lifecycle.example.com", "--set", "checkInstall.enabled=false"]


def manifest(cluster, release: str) -> list[dict]:
    out = cluster.helm("get", "manifest", release, "-n", RELEASE_NS).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_install_upgrade_uninstall_in_a_real_api_server(cluster):
    name = "evi-life"
    full = f"{name}-ephemeral-volume-injector"
    cluster.helm("install", name, CHART, "-n", RELEASE_NS, "--create-namespace", *VALUES)
    docs = manifest(cluster, name)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment",
                            "MutatingWebhookConfiguration", "PodDisruptionBudget", "Secret", "Service",
                            "ServiceAccount", "ValidatingWebhookConfiguration"]), kinds
    for d in docs:
        ns = ["-n", d["metadata"]["namespace"]] if "namespace" in d["metadata"] else []
        stored = cluster.get(d["kind"].lower(), d["metadata"]["name"], *ns)
        assert stored["metadata"]["uid"], d["kind"]

    secret = cluster.get("secret", f"{full}-tls", "-n", RELEASE_NS)
    mwc = cluster.get("mutatingwebhookconfiguration", full)
    ca = secret["data"]["ca.crt"]
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == ca
    assert mwc["webhooks"][0]["clientConfig"]["service"]["name"] == full
    assert b"BEGIN CERTIFICATE" in base64.b64decode(ca)
    # The API server compiled the matchConditions (it refuses a configuration whose CEL fails to).
    assert mwc["webhooks"][0]["matchConditions"][0]["name"] == "asks-for-volumes"
    vwc = cluster.get("validatingwebhookconfiguration", full)
    assert {w["name"] for w in vwc["webhooks"]} == {"workloads.lifecycle.example.com", "cronjobs.lifecycle.example.com"}
    for w in vwc["webhooks"]:
        assert w["clientConfig"]["caBundle"] == ca
        assert w["clientConfig"]["service"] == {"name": full, "namespace": RELEASE_NS, "path": "/validate", "port": 443}
        assert [c["name"] for c in w["matchConditions"]] == ["creates-or-changes-the-template",
                                                             "template-asks-for-volumes"]

    cluster.helm("upgrade", name, CHART, "-n", RELEASE_NS, *VALUES, "--set", "replicaCount=3")
    assert cluster.get("deployment", full, "-n", RELEASE_NS)["spec"]["replicas"] == 3
    after = cluster.get("secret", f"{full}-tls", "-n", RELEASE_NS)
    assert after["data"] == secret["data"], "the upgrade rotated the chart-generated certificate"
    mwc = cluster.get("mutatingwebhookconfiguration", full)
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == ca, "the upgrade changed the caBundle"
    vwc = cluster.get("validatingwebhookconfiguration", full)
    assert all(w["clientConfig"]["caBundle"] == ca for w in vwc["webhooks"])

    cluster.helm("uninstall", name, "-n", RELEASE_NS, "--wait")
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        left = cluster.kubectl("get", kind, full, check=False)
        assert left.returncode != 0 and "NotFound" in left.stderr, kind
    # The TLS Secret is kept on purpose (helm.sh/resource-policy: keep), so a reinstall keeps the CA.
    kept = cluster.get("secret", f"{full}-tls", "-n", RELEASE_NS)
    assert kept["data"]["ca.crt"] == ca
    cluster.kubectl("delete", "secret", f"{full}-tls", "-n", RELEASE_NS)
