"""Cluster-aware admission against the real API server: the webhook watches CSIDriver and
StorageClass objects with the chart's own ServiceAccount (so the chart's RBAC is what is
tested), refuses what the kubelet or the PVC would hang on, follows changes within seconds, and
becomes ready as documented when the API server is not reachable at first."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import pytest
from conftest import Webhook, free_port, installed, pod, volumes_by_name, wait_for
from controlplane import pipe

P = "ephemeral-volumes.io"
CHECK = f"injector.{P}/cluster-check"


def csidriver(name: str, ephemeral: bool) -> dict:
    spec = {"attachRequired": False}
    if ephemeral:
        spec["volumeLifecycleModes"] = ["Ephemeral"]
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": name}, "spec": spec}


def storageclass(name: str, provisioner: str, default: bool = False) -> dict:
    meta = {"name": name}
    if default:
        meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta, "provisioner": provisioner}


OBJECTS = [
    csidriver("inline.csi.example.com", True),
    csidriver("persistent.csi.example.com", False),
    storageclass("gp3", "persistent.csi.example.com", default=True),
    storageclass("fast", "fast.csi.example.com"),
]


def apply(cluster, objects):
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


@pytest.fixture(scope="module")
def checked(cluster, tmp_path_factory):
    apply(cluster, OBJECTS)
    with installed(cluster, "evi", {"config": {"clusterChecks": "enforce"}}, tmp_path_factory.mktemp("checks"),
                   "--cluster-sync-timeout-seconds", "20", service_account=True) as r:
        yield r
    cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": OBJECTS}))


def create(cluster, annotation: str, ns: str = "nf"):
    return cluster.create(pod(namespace=cluster.namespace(ns), annotations={f"{P}/v": annotation}), check=False)


CASES = [
    ("type=csi,driver=inline.csi.example.com,mountPath=/s", None),
    ("type=csi,driver=persistent.csi.example.com,mountPath=/s",
     'CSIDriver \\"persistent.csi.example.com\\" does not list Ephemeral'),
    ("type=csi,driver=missing.csi.example.com,mountPath=/s",
     'CSIDriver \\"missing.csi.example.com\\" does not exist in the cluster'),
    ("type=ephemeral,storageClass=gp3,size=1Gi,mountPath=/s", None),
    ("type=ephemeral,size=1Gi,mountPath=/s", None),
    ("type=ephemeral,storageClass=io2,size=1Gi,mountPath=/s", 'StorageClass \\"io2\\" does not exist'),
]


@pytest.mark.parametrize("annotation,refused", CASES, ids=[c[0] for c in CASES])
def test_pods_are_refused_or_admitted_by_what_the_cluster_has(cluster, checked, annotation, refused):
    p = create(cluster, annotation)
    if refused is None:
        assert p.returncode == 0, p.stderr
        assert "v" in volumes_by_name(json.loads(p.stdout))
    else:
        assert p.returncode != 0, f"{annotation} was admitted"
        assert f"annotation {P}/v" in p.stderr and refused.replace("\\", "") in p.stderr.replace("\\", ""), p.stderr


def test_a_provisioner_without_its_csidriver_is_a_warning(cluster, checked):
    p = create(cluster, "type=ephemeral,storageClass=fast,size=1Gi,mountPath=/s")
    assert p.returncode == 0, p.stderr
    assert "fast.csi.example.com" in p.stderr and "no CSIDriver object" in p.stderr  # kubectl prints warnings


def test_changes_in_the_cluster_change_decisions_within_seconds(cluster, checked):
    late = "type=csi,driver=late.csi.example.com,mountPath=/s"
    assert create(cluster, late).returncode != 0
    apply(cluster, [csidriver("late.csi.example.com", True)])
    wait_for("a new CSIDriver to be seen", lambda: create(cluster, late).returncode == 0, timeout=10, interval=0.3)
    # Replaced by one without Ephemeral (a CSIDriver's spec is immutable).
    cluster.kubectl("delete", "csidriver", "late.csi.example.com")
    apply(cluster, [csidriver("late.csi.example.com", False)])
    wait_for("a changed CSIDriver to be seen", lambda: create(cluster, late).returncode != 0, timeout=10, interval=0.3)
    # Deleted: the default class; a PVC without a class is then refused.
    cluster.kubectl("annotate", "storageclass", "gp3", "storageclass.kubernetes.io/is-default-class=false", "--overwrite")
    no_class = "type=ephemeral,size=1Gi,mountPath=/s"
    wait_for("the default class to be gone", lambda: create(cluster, no_class).returncode != 0, timeout=10, interval=0.3)
    assert "no default StorageClass" in create(cluster, no_class).stderr
    cluster.kubectl("annotate", "storageclass", "gp3", "storageclass.kubernetes.io/is-default-class=true", "--overwrite")
    wait_for("the default class to be back", lambda: create(cluster, no_class).returncode == 0, timeout=10, interval=0.3)
    cluster.kubectl("delete", "csidriver", "late.csi.example.com")


def test_a_thousand_classes_and_drivers_are_watched_in_bounded_memory(cluster, checked):
    wh = checked.webhook
    before = wh.rss_kib()
    many = [csidriver(f"d{i}.csi.example.com", i % 2 == 0) for i in range(1000)]
    many += [storageclass(f"class-{i}", f"d{i}.csi.example.com") for i in range(1000)]
    for i in range(0, len(many), 250):
        apply(cluster, many[i:i + 250])
    try:
        wait_for("1,000 more of each in the webhook's state",
                 lambda: wh.metric("evi_cluster_objects", kind="StorageClass") >= 1002
                 and wh.metric("evi_cluster_objects", kind="CSIDriver") >= 1002, timeout=60, interval=0.5)
        after = wh.rss_kib()
        print(f"\nwebhook RSS: {before} KiB before, {after} KiB with 1,000 more CSIDrivers and StorageClasses")
        (checked.dir / "rss.txt").write_text(f"{before} {after}\n")
        # The last ones are known: decisions still right at that size.
        assert create(cluster, "type=csi,driver=d998.csi.example.com,mountPath=/s").returncode == 0
        assert create(cluster, "type=csi,driver=d999.csi.example.com,mountPath=/s").returncode != 0
        assert create(cluster, "type=ephemeral,storageClass=class-999,size=1Gi,mountPath=/s").returncode == 0
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", check=False,
                        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": many}))


class Forwarder:
    """A TCP port that refuses connections until `open()`, then forwards them to `target`."""

    def __init__(self, target: int):
        self.port = free_port()
        self.target = target
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def open(self):
        async def handle(r, w):
            tr, tw = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(pipe(r, tw), pipe(tr, w), return_exceptions=True)

        async def serve():
            self.server = await asyncio.start_server(handle, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(serve(), self.loop).result(5)


def test_started_before_the_api_server_is_reachable_it_becomes_ready_in_warn(cluster, checked, tmp_path):
    forwarder = Forwarder(cluster.cp.api_port)
    secret = checked.secret()["data"]
    cert, key, ca = (base64.b64decode(secret[k]) for k in ("tls.crt", "tls.key", "ca.crt"))
    wh = Webhook(tmp_path / "early", cert, key, "clusterChecks: enforce\n")
    wh.url = f"https://127.0.0.1:{wh.port}/mutate"
    kubeconfig = checked.service_account_kubeconfig(server=f"https://127.0.0.1:{forwarder.port}")
    wh.start("--kubeconfig", str(kubeconfig), "--cluster-sync-timeout-seconds", "3", wait_ready=False)
    try:
        status, body = wh.admin("/readyz")
        assert status == 503 and "cluster" in body, body
        wait_for("ready after the sync timeout", lambda: wh.admin("/readyz")[0] == 200, timeout=10)
        assert wh.metric("evi_cluster_checks_degraded") == 1
        wh.wait_log("the degraded checks in the log", lambda line: "have not arrived" in line.get("message", ""))
        asks = pod(namespace="nf", annotations={f"{P}/v": "type=csi,driver=missing.csi.example.com,mountPath=/s"})
        # Lists incomplete: enforce acts as warn (admitted, with the warning and the annotation).
        r = wh.review(asks, "nf", ca)
        assert r["allowed"] is True and any("does not exist" in w for w in r.get("warnings", [])), r
        # The API server becomes reachable: the lists arrive, the checks enforce again.
        forwarder.open()
        wait_for("the lists to arrive", lambda: wh.metric("evi_cluster_checks_degraded") == 0, timeout=30, interval=0.5)
        r = wh.review(asks, "nf", ca)
        assert r["allowed"] is False and r["status"]["code"] == 422, r
        assert wh.metric("evi_cluster_watch_errors_total") >= 1, "the failed first attempts are counted"
    finally:
        wh.stop()
