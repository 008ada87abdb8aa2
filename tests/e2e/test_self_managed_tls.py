"""tls.mode=selfManaged against the real control plane: the chart rendered with `helm template`
and applied with `kubectl apply`, as Argo CD does, and the webhook run as processes with the
rendered Deployment's own arguments and its ServiceAccount's token (so the chart's RBAC is what
they have). The API server calls them at webhook.url and checks their certificate against the
caBundle they set themselves."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import ssl
import time
from pathlib import Path

import certs
import pytest
import yaml
from conftest import (BINARY, CHART, Cluster, SteadyCreator, Webhook, free_port, pod, served_certificate,
                      service_account_kubeconfig, start_process, wait_for)

PODS_NS = "tls-pods"


class SelfManaged(Webhook):
    """One replica: the rendered Deployment's arguments, on loopback, with a kubeconfig."""

    def __init__(self, workdir: Path, config: str, args: list[str], kubeconfig: Path, port: int | None = None):
        super().__init__(workdir, b"", b"", config)
        if port:
            self.port = port
            self.url = f"https://127.0.0.1:{port}/mutate"
        local = ("--listen=", "--admin-listen=", "--config=", "--log-format=")
        self.args = [a for a in args[1:] if not a.startswith(local)]
        self.kubeconfig = kubeconfig

    def start(self, *extra: str, wait_ready: bool = True) -> "SelfManaged":
        self.proc = start_process([
            str(BINARY), "serve", "--listen", f"127.0.0.1:{self.port}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}", "--config", str(self.config_path),
            "--log-format", "json", "--kubeconfig", str(self.kubeconfig), *self.args, *extra,
        ], self.dir / "webhook.log")
        if wait_ready:
            wait_for("the webhook to be ready (a certificate from its Secret)",
                     lambda: self.admin("/readyz")[0] == 200, timeout=30, procs=self.proc,
                     log=self.dir / "webhook.log")
        return self

    def served(self) -> bytes:
        return served_certificate("127.0.0.1", self.port)

    def steps(self) -> list[str]:
        return [e["step"] for e in self.log() if "step" in e and e.get("message", "").startswith("self-managed TLS")]


class Rendered:
    """The chart as Argo CD deploys it: `helm template` for the cluster's version, then
    `kubectl apply` (client-side), in a namespace of its own."""

    def __init__(self, cluster: Cluster, name: str, workdir: Path, values: dict):
        self.cluster, self.name, self.dir = cluster, name, workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ns = f"{name}-system"
        self.fullname = f"{name}-ephemeral-volume-injector"
        self.port = free_port()
        self.prefix = f"{name}.evi.test"
        self.values = {**values, "webhook": {**values.get("webhook", {}), "url": f"https://127.0.0.1:{self.port}/mutate"},
                       "config": {**values.get("config", {}), "annotationPrefix": self.prefix},
                       "tls": {**values.get("tls", {}), "mode": "selfManaged"},
                       # Processes, not pods: no node runs the install check's hook Job.
                       "checkInstall": {"enabled": False}}
        version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        self.kube_version = version
        self.replicas: list[SelfManaged] = []

    def render(self, **extra_values) -> str:
        path = self.dir / "values.yaml"
        path.write_text(yaml.safe_dump({**self.values, **extra_values}))
        return self.cluster.helm("template", self.name, CHART, "-n", self.ns, "--kube-version", self.kube_version,
                                 "-f", path).stdout

    def apply(self, text: str) -> None:
        self.cluster.namespace(self.ns)
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=text)

    def docs(self, text: str) -> list[dict]:
        return [d for d in yaml.safe_load_all(text) if d]

    def start(self, text: str, n: int = 1, wait_ready: bool = True, kubeconfig: Path | None = None,
              extra: tuple = ()) -> list[SelfManaged]:
        docs = self.docs(text)
        (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        kubeconfig = kubeconfig or service_account_kubeconfig(self.cluster, self.ns, self.fullname,
                                                              self.dir / "sa-kubeconfig")
        new = []
        for i in range(n):
            port = self.port if not self.replicas and i == 0 else None
            r = SelfManaged(self.dir / f"replica-{len(self.replicas)}", cm["data"]["config.yaml"], args, kubeconfig, port)
            self.replicas.append(r)
            new.append(r)
        for r in new:  # started together; readiness awaited after
            r.start(*extra, wait_ready=False)
        if wait_ready:
            for r in new:
                wait_for("a replica ready", lambda r=r: r.admin("/readyz")[0] == 200, timeout=30, procs=r.proc,
                         log=r.dir / "webhook.log")
        return new

    def secret(self) -> dict:
        data = self.cluster.get("secret", f"{self.fullname}-certs", "-n", self.ns).get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def ca_bundles(self) -> list[bytes]:
        out = []
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            for w in self.cluster.get(kind, self.fullname)["webhooks"]:
                out.append(base64.b64decode(w["clientConfig"].get("caBundle", "")))
        return out

    def asking_pod(self) -> dict:
        return pod(namespace=PODS_NS, annotations={f"{self.prefix}/scratch": "type=emptyDir,mountPath=/scratch,size=1Gi"})

    def mutated(self) -> bool:
        stored = json.loads(self.cluster.create(self.asking_pod(), "--dry-run=server").stdout)
        return any(v["name"] == "scratch" for v in stored["spec"].get("volumes", []))

    def remove(self, text: str) -> None:
        for r in self.replicas:
            r.stop()
        self.cluster.kubectl("delete", "-n", self.ns, "--ignore-not-found", "--wait=false", "-f", "-", input=text,
                             check=False)


@contextlib.contextmanager
def applied(cluster: Cluster, name: str, workdir: Path, values: dict):
    """A release rendered and applied; its replicas stopped and its objects deleted after."""
    rel = Rendered(cluster, name, workdir, values)
    text = rel.render()
    rel.apply(text)
    try:
        yield rel, text
    finally:
        rel.remove(text)


def rejections(cluster: Cluster, prefix: str) -> float:
    """apiserver_admission_webhook_rejection_count for this release's webhooks."""
    total = 0.0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_admission_webhook_rejection_count{") and f'.{prefix}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def pods_ns(cluster):
    return cluster.namespace(PODS_NS)


def test_applied_twice_as_argo_cd_does_the_ca_bundle_never_changes_and_no_pod_is_refused(cluster, pods_ns, tmp_path):
    with applied(cluster, "gitops", tmp_path, {}) as (rel, first):
        second = rel.render()
        assert first == second, "two renders differ"
        (replica,) = rel.start(first)
        wait_for("the caBundle set by the webhook", lambda: all(rel.ca_bundles()), timeout=20)
        bundle = rel.ca_bundles()
        stored = rel.secret()
        assert all(b == stored["ca-bundle.crt"] for b in bundle)
        assert certs.verifies(stored["ca.crt"], replica.served(), tmp_path)
        assert rel.mutated(), "a pod that asks is mutated after the first apply"
        with SteadyCreator(cluster, rel.asking_pod()) as load:
            time.sleep(2)
            rel.apply(second)  # the next sync: the same bytes
            assert rel.ca_bundles() == bundle, "the second apply changed the caBundle"
            assert rel.mutated()
            # A sync that changes something (a profile): still the same caBundle.
            rel.apply(rel.render(config={"annotationPrefix": rel.prefix,
                                         "profiles": {"fast": {"mountPath": "/fast", "emptyDir": {}}}}))
            time.sleep(3)
            assert rel.ca_bundles() == bundle
            assert rel.mutated()
        print(f"\nGitOps applies: {load.sent} pods sent, {load.refused} refused")
        assert load.sent > 10 and load.refused == 0, load.errors[:3]
        assert rel.secret() == stored, "the applies changed the Secret's data"
        assert replica.steps() == ["created"], replica.steps()


def test_three_replicas_started_at_once_on_an_empty_secret_make_one_ca(cluster, pods_ns, tmp_path):
    with applied(cluster, "three", tmp_path, {}) as (rel, text):
        replicas = rel.start(text, n=3)
        stored = rel.secret()
        assert len(certs.der_certs(stored["ca.crt"])) == 1
        assert certs.der_certs(stored["ca-bundle.crt"]) == certs.der_certs(stored["ca.crt"])
        for r in replicas:
            assert certs.verifies(stored["ca.crt"], r.served(), tmp_path), f"replica {r.port} serves another CA's certificate"
        created = sum(r.metric("evi_tls_steps_total", step="created") for r in replicas)
        assert created == 1, f"{created} replicas wrote a CA"
        wait_for("the caBundle set", lambda: all(b == stored["ca-bundle.crt"] for b in rel.ca_bundles()), timeout=20)
        assert rel.mutated()


def test_a_blanked_or_replaced_ca_bundle_is_put_back_within_seconds(cluster, pods_ns, tmp_path):
    with applied(cluster, "restore", tmp_path, {}) as (rel, text):
        (replica,) = rel.start(text)
        wait_for("the caBundle set", lambda: all(rel.ca_bundles()), timeout=20)
        good = rel.ca_bundles()
        stranger = base64.b64encode(rel.secret()["ca.crt"].replace(b"A", b"B", 1)).decode()
        for what, value in (("blanked", None), ("replaced", stranger)):
            n = len(rel.cluster.get("mutatingwebhookconfiguration", rel.fullname)["webhooks"])
            # A JSON patch: a client-side apply leaves a field it never set, so it blanks nothing.
            ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value} if value
                   else {"op": "remove", "path": f"/webhooks/{i}/clientConfig/caBundle"} for i in range(n)]
            with SteadyCreator(cluster, rel.asking_pod(), interval=0.1) as load:
                start = time.monotonic()
                rel.cluster.kubectl("patch", "mutatingwebhookconfiguration", rel.fullname, "--type=json",
                                    "-p", json.dumps(ops))
                wait_for(f"the {what} caBundle put back", lambda: rel.ca_bundles() == good, timeout=15, interval=0.1)
                lag = time.monotonic() - start
                time.sleep(1)
            print(f"\ncaBundle {what}: put back after {lag:.2f} s; {load.sent} pods sent meanwhile, "
                  f"{load.refused} refused (failurePolicy Fail)")
            assert lag < 10
            assert rel.mutated()
        assert replica.metric("evi_ca_bundle_patches_total") >= 4  # two webhooks, twice


def test_a_ca_rotation_with_short_lifetimes_refuses_no_pod(cluster, pods_ns, tmp_path):
    """Lifetimes in seconds, set as chart values: the serving certificate is renewed, a next CA
    is trusted, switched to, and the old one removed, while pods are created at a steady rate."""
    with applied(cluster, "rotate", tmp_path, {"tls": {"selfManaged": {
        "caLifetime": "60s", "caRenewBefore": "40s", "certLifetime": "30s", "certRenewBefore": "15s",
        "caOverlap": "8s"}}}) as (rel, text):
        replicas = rel.start(text, n=2)
        wait_for("the caBundle set", lambda: all(rel.ca_bundles()), timeout=20)
        first_ca = rel.secret()["ca.crt"]
        before = rejections(cluster, rel.prefix)
        with SteadyCreator(cluster, rel.asking_pod(), interval=0.2) as load:
            wait_for("a whole CA rotation", lambda: "old-cas-removed" in sum((r.steps() for r in replicas), []),
                     timeout=90, interval=1)
            time.sleep(2)
        after = rejections(cluster, rel.prefix)
        steps = [e for r in replicas for e in r.log() if "step" in e]
        steps.sort(key=lambda e: e.get("timestamp", ""))
        names = [e["step"] for e in steps]
        print(f"\nrotation: {names}; {load.sent} pods sent, {load.refused} refused")
        rotation = [n for n in names if n in ("next-ca-added", "next-ca-trusted", "ca-switched", "old-cas-removed")]
        assert rotation[:4] == ["next-ca-added", "next-ca-trusted", "ca-switched", "old-cas-removed"], names
        assert "serving-renewed" in names, names
        assert load.sent > 50 and load.refused == 0, load.errors[:3]
        assert after == before, f"the API server counted {after - before} rejections"
        stored = rel.secret()
        assert stored["ca.crt"] != first_ca
        for r in replicas:
            assert certs.verifies(stored["ca.crt"], r.served(), tmp_path)
            assert 0 < r.metric("evi_certificate_expiry_seconds", certificate="ca") <= 60
            assert 0 < r.metric("evi_certificate_expiry_seconds", certificate="serving") <= 30


def test_rbac_limits_the_service_account_to_its_own_secret_and_configurations(cluster, pods_ns, tmp_path):
    with applied(cluster, "rbac", tmp_path, {}) as (rel, text):
        who = f"system:serviceaccount:{rel.ns}:{rel.fullname}"
        cluster.kubectl("create", "secret", "generic", "someone-elses", "-n", rel.ns, "--from-literal=k=v")

        def can(*args) -> bool:
            return cluster.kubectl("auth", "can-i", "--as", who, *args, check=False).stdout.strip() == "yes"
        assert can("get", f"secret/{rel.fullname}-certs", "-n", rel.ns)
        assert can("update", f"secret/{rel.fullname}-certs", "-n", rel.ns)
        assert can("patch", f"mutatingwebhookconfiguration/{rel.fullname}")
        assert can("patch", f"validatingwebhookconfiguration/{rel.fullname}")
        # Exactly the verbs the code uses (a Secret replaced, configurations patched).
        assert not can("patch", f"secret/{rel.fullname}-certs", "-n", rel.ns)
        assert not can("update", f"mutatingwebhookconfiguration/{rel.fullname}")
        assert not can("update", f"validatingwebhookconfiguration/{rel.fullname}")
        assert not can("get", "secret/someone-elses", "-n", rel.ns)
        assert not can("list", "secrets", "-n", rel.ns)
        assert not can("create", "secrets", "-n", rel.ns)
        assert not can("delete", f"secret/{rel.fullname}-certs", "-n", rel.ns)
        assert not can("get", "secret/anything", "-n", "kube-system")
        assert not can("patch", "mutatingwebhookconfiguration/someone-elses")
        assert not can("create", "mutatingwebhookconfigurations")
        # And for real: the token cannot read another Secret.
        kc = service_account_kubeconfig(cluster, rel.ns, rel.fullname, tmp_path / "kc")
        out = cluster.kubectl("--kubeconfig", kc, "get", "secret", "someone-elses", "-n", rel.ns, check=False)
        assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out.stderr


def test_a_replica_without_access_keeps_its_certificate_and_one_without_any_is_not_ready(cluster, pods_ns, tmp_path):
    with applied(cluster, "failsafe", tmp_path, {}) as (rel, text):
        (replica,) = rel.start(text)
        wait_for("the caBundle set", lambda: all(rel.ca_bundles()), timeout=20)
        served = replica.served()
        # The ServiceAccount loses its access; a change to the configuration wakes the replica.
        for kind in ("rolebinding", "clusterrolebinding"):
            args = [kind, f"{rel.fullname}-certificates"] + (["-n", rel.ns] if kind == "rolebinding" else [])
            cluster.kubectl("delete", *args)
        cluster.kubectl("label", "mutatingwebhookconfiguration", rel.fullname, "poke=1")
        wait_for("the failure counted", lambda: replica.metric("evi_tls_errors_total") > 0, timeout=30)
        assert replica.admin("/readyz")[0] == 200, "a replica with a valid certificate stays ready"
        assert replica.served() == served
        assert rel.mutated()
        # A replica with no access at all from the start has no certificate: not ready, and says why.
        nobody = tmp_path / "nobody"
        cluster.kubectl("create", "serviceaccount", "nobody", "-n", rel.ns)
        kc = service_account_kubeconfig(cluster, rel.ns, "nobody", nobody)
        (blind,) = rel.start(text, wait_ready=False, kubeconfig=kc)
        wait_for("the read failure counted", lambda: blind.metric("evi_tls_errors_total", operation="read-secret") > 0,
                 timeout=30)
        code, body = blind.admin("/readyz")
        assert code == 503 and "no valid serving certificate" in body, (code, body)


def test_a_certificate_stored_in_the_secret_is_served_at_once_through_the_watch(cluster, pods_ns, tmp_path):
    """No kubelet volume in between: a serving certificate written into the Secret (here by
    hand, from the same CA, with more time left than the renewal threshold) is served as soon as
    the watch brings it, and kept."""
    with applied(cluster, "watch", tmp_path, {}) as (rel, text):
        (replica,) = rel.start(text)
        stored = rel.secret()
        (tmp_path / "ca.crt").write_bytes(stored["ca.crt"])
        (tmp_path / "ca.key").write_bytes(stored["ca.key"])
        names = next(a for a in replica.args if a.startswith("--tls-name=")).split("=", 1)[1].split(",")
        certs.issue(tmp_path, "tls", certs.Pair(tmp_path / "ca.crt", tmp_path / "ca.key"), names=names, days=80)
        new_der = ssl.PEM_cert_to_DER_cert((tmp_path / "tls.crt").read_text())
        assert replica.served() != new_der
        patch = {"data": {k: base64.b64encode((tmp_path / k).read_bytes()).decode() for k in ("tls.crt", "tls.key")}}
        start = time.monotonic()
        cluster.kubectl("patch", "secret", f"{rel.fullname}-certs", "-n", rel.ns, "--type=merge", "-p", json.dumps(patch))
        wait_for("the stored certificate served", lambda: replica.served() == new_der, timeout=10, interval=0.05)
        lag = time.monotonic() - start
        print(f"\na certificate stored in the Secret was served after {lag:.2f} s")
        assert lag < 5
        time.sleep(1)
        assert replica.served() == new_der and replica.steps() == ["created"], replica.steps()
        assert rel.mutated()


def test_a_terminating_replica_leaves_the_ca_bundle_to_its_successors(cluster, pods_ns, tmp_path):
    """After SIGTERM a replica drains (here 6 s) but writes nothing more: a caBundle changed
    meanwhile (by the replica replacing it, of another TLS mode, say) is not put back, while a
    running replica puts it back within a second (the test above). It still exits cleanly."""
    with applied(cluster, "terminating", tmp_path, {"server": {"drainDelaySeconds": 6}}) as (rel, text):
        (replica,) = rel.start(text)
        wait_for("the caBundle set", lambda: all(rel.ca_bundles()), timeout=20)
        patches = replica.metric("evi_ca_bundle_patches_total")
        replica.proc.send_signal(signal.SIGTERM)
        wait_for("the replica unready (draining)", lambda: replica.admin("/readyz")[0] == 503, timeout=5, interval=0.05)
        mwc = rel.cluster.get("mutatingwebhookconfiguration", rel.fullname)
        # Removed outright (a JSON patch: a client-side apply would leave a field it never set).
        remove = [{"op": "remove", "path": f"/webhooks/{i}/clientConfig/caBundle"} for i in range(len(mwc["webhooks"]))]
        rel.cluster.kubectl("patch", "mutatingwebhookconfiguration", rel.fullname, "--type=json", "-p", json.dumps(remove))
        time.sleep(4)
        assert replica.admin("/healthz")[0] == 200, "still draining"
        mutating = [base64.b64decode(w["clientConfig"].get("caBundle", ""))
                    for w in rel.cluster.get("mutatingwebhookconfiguration", rel.fullname)["webhooks"]]
        assert not any(mutating), "a terminating replica put the caBundle back"
        assert replica.metric("evi_ca_bundle_patches_total") == patches
        assert replica.proc.wait(20) == 0
        messages = [e.get("message") for e in replica.log()]
        assert "background tasks stopped" in messages, messages[-5:]
        replica.proc = None
