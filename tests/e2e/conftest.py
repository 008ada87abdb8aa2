"""Fixtures for the end-to-end tests: one real control plane for the session, the real chart
installed with helm, and the real webhook binary running beside it (the chart points the API
server at it with `webhook.url`, since no kube-proxy routes a Service here).

Run from the repository root: python3 -m pytest -q tests/e2e
Needs the control-plane binaries (tests/controlplane/build.sh), helm and kubectl
($EVI_TOOLS_DIR/bin, from .ci/install-tools.sh) and `cargo build` (target/debug).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from controlplane import ROOT, TOOLS_DIR, ControlPlane, free_port, start_process, stop_process, wait_for
from node import TAINT, Node, in_test_namespace
from registry import RELEASE_BIN, Registry, release_tools

CHART = ROOT / "charts" / "ephemeral-volume-injector"
BINARY = ROOT / "target" / "debug" / "ephemeral-volume-injector"
KUBECTL = shutil.which("kubectl") or str(TOOLS_DIR / "bin/kubectl")
HELM = shutil.which("helm") or str(TOOLS_DIR / "bin/helm")
RELEASE_NS = "evi-system"
OCI = ROOT / "target" / "oci"



def _stop_on_sigterm(signum, frame):
    """SIGTERM (a CI job stopped, `timeout`) ends the run as Ctrl-C does: pytest then runs every
    fixture's teardown — the node kills its pods, the control plane stops — where the default
    action would end the process at once and leave the node's containers running."""
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _stop_on_sigterm)

class Cluster:
    """kubectl and helm against the control plane."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig), HELM_CACHE_HOME=str(cp.dir / "helm-cache"),
                        HELM_CONFIG_HOME=str(cp.dir / "helm-config"), HELM_DATA_HOME=str(cp.dir / "helm-data"))
        self.namespaces: set[str] = set()

    def run(self, tool: str, *args, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([tool, *map(str, args)], input=input, capture_output=True, text=True,
                           env=self.env, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"{Path(tool).name} {' '.join(map(str, args))} failed ({p.returncode}):\n"
                                 f"{p.stderr}{p.stdout}")
        return p

    def kubectl(self, *args, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(KUBECTL, *args, input=input, check=check)

    def helm(self, *args, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(HELM, *args, check=check)

    def get(self, *args) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def create(self, obj: dict, *args, check: bool = True) -> subprocess.CompletedProcess:
        return self.kubectl("create", "-f", "-", "-o", "json", *args, input=json.dumps(obj), check=check)

    def create_pod(self, pod: dict) -> dict:
        """Creates a pod and returns it as the API server stored it."""
        return json.loads(self.create(pod).stdout)

    def namespace(self, name: str, labels: dict | None = None) -> str:
        """Creates a namespace (once) and waits for its default ServiceAccount, without which the
        ServiceAccount admission plugin refuses every pod."""
        if name not in self.namespaces:
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
            self.create(ns)
            wait_for(f"the default ServiceAccount in {name}",
                     lambda: self.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0)
            self.namespaces.add(name)
        return name


class Webhook:
    """The real binary, serving on loopback with the given certificate and configuration."""

    def __init__(self, workdir: Path, cert: bytes, key: bytes, config: str):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tls.crt").write_bytes(cert)
        (self.dir / "tls.key").write_bytes(key)
        self.config_path = self.dir / "config.yaml"
        self.config_path.write_text(config)
        self.port = free_port()
        self.admin_port = free_port()
        self.url = f"https://127.0.0.1:{self.port}/mutate"
        self.proc = None

    def start(self, *extra: str, wait_ready: bool = True) -> "Webhook":
        self.proc = start_process([
            str(BINARY), "serve", "--listen", f"127.0.0.1:{self.port}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--tls-cert", str(self.dir / "tls.crt"), "--tls-key", str(self.dir / "tls.key"),
            "--config", str(self.config_path), "--log-format", "json", "--reload-poll-seconds", "1",
            *extra,
        ], self.dir / "webhook.log")
        if wait_ready:
            wait_for("the webhook to be ready", lambda: self.admin("/readyz")[0] == 200, timeout=20,
                     procs=self.proc, log=self.dir / "webhook.log")
        else:
            wait_for("the webhook to answer", lambda: self.admin("/healthz")[0] == 200, timeout=20,
                     procs=self.proc, log=self.dir / "webhook.log")
        return self

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
            self.proc = None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def review(self, pod: dict, namespace: str, ca: bytes) -> dict:
        """Posts an AdmissionReview for `pod` straight to the webhook (not through the API server)."""
        import ssl
        import uuid
        ctx = ssl.create_default_context(cadata=ca.decode())
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
            "namespace": namespace, "object": pod}}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return json.loads(r.read())["response"]

    def admin(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, **labels) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for line in self.admin("/metrics")[1].splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def log(self) -> list[dict]:
        out = []
        for line in (self.dir / "webhook.log").read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    def wait_log(self, what: str, match, timeout: float = 5) -> list[dict]:
        """The log lines that `match`, once there is one: the webhook writes its lines in
        batches, a few milliseconds after the event."""
        return wait_for(what, lambda: [line for line in self.log() if match(line)], timeout=timeout,
                        interval=0.05, procs=self.proc)


class Release:
    """The chart installed with helm, its webhook pointed at the binary running on loopback with
    the TLS Secret and the configuration the chart created (read back from the API server)."""

    def __init__(self, cluster: Cluster, name: str, values: dict, workdir: Path):
        self.cluster, self.name, self.values, self.dir = cluster, name, values, workdir
        self.fullname = f"{name}-ephemeral-volume-injector"
        self.port = free_port()
        self.webhook: Webhook | None = None

    def install(self, *extra) -> "Release":
        self.dir.mkdir(parents=True, exist_ok=True)
        vals = dict(self.values)
        vals.setdefault("webhook", {})
        vals["webhook"] = {**vals["webhook"], "url": f"https://127.0.0.1:{self.port}/mutate"}
        # The webhook is a process here, and no node runs the install check's hook Job.
        vals.setdefault("checkInstall", {"enabled": False})
        path = self.dir / "values.yaml"
        path.write_text(yaml.safe_dump(vals))
        self.cluster.helm("upgrade", "--install", self.name, CHART, "-n", RELEASE_NS, "--create-namespace",
                          "-f", path, "--wait=false", *extra)
        return self

    def secret(self) -> dict:
        return self.cluster.get("secret", f"{self.fullname}-tls", "-n", RELEASE_NS)

    def config(self) -> str:
        return self.cluster.get("configmap", f"{self.fullname}-config", "-n", RELEASE_NS)["data"]["config.yaml"]

    def start_webhook(self, *extra: str) -> Webhook:
        data = self.secret()["data"]
        wh = Webhook(self.dir / "webhook", base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]),
                     self.config())
        wh.port = self.port
        wh.url = f"https://127.0.0.1:{self.port}/mutate"
        self.webhook = wh.start(*extra)
        return wh

    def service_account_kubeconfig(self, server: str | None = None) -> Path:
        """A kubeconfig with a token of the chart's ServiceAccount: the webhook reads the cluster
        with exactly the permissions the chart grants it."""
        return service_account_kubeconfig(self.cluster, RELEASE_NS, self.fullname, self.dir / "sa-kubeconfig", server)

    def uninstall(self) -> None:
        if self.webhook:
            self.webhook.stop()
        self.cluster.helm("uninstall", self.name, "-n", RELEASE_NS, "--wait=false", check=False)


@contextlib.contextmanager
def installed(cluster: Cluster, name: str, values: dict, workdir: Path, *webhook_args: str,
              service_account: bool = False, start: bool = True):
    """The chart installed with `values` and (unless `start` is false) its webhook started with
    `webhook_args` — and the release's ServiceAccount kubeconfig with `service_account` —;
    uninstalled afterwards, whatever happened."""
    r = Release(cluster, name, values, workdir).install()
    try:
        if start:
            sa = ["--kubeconfig", str(r.service_account_kubeconfig())] if service_account else []
            r.start_webhook(*sa, *webhook_args)
        yield r
    finally:
        r.uninstall()


def release_fixture(name: str, values: dict, *webhook_args: str, service_account: bool = False):
    """A module's release (`release = release_fixture(...)` at module level): installed and
    started once for the module."""
    @pytest.fixture(scope="module")
    def release(cluster, tmp_path_factory):
        with installed(cluster, name, values, tmp_path_factory.mktemp(name), *webhook_args,
                       service_account=service_account) as r:
            yield r
    return release


def service_account_kubeconfig(cluster: Cluster, namespace: str, name: str, path: Path,
                               server: str | None = None) -> Path:
    """A kubeconfig with a token of that ServiceAccount."""
    token = cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server or cluster.cp.url}", certificate-authority: "{cluster.cp.pki.ca_crt}"}}
users:
- name: u
  user: {{token: "{token}"}}
contexts:
- name: c
  context: {{cluster: c, user: u}}
current-context: c
""")
    return path


def served_certificate(host: str, port: int = 8443) -> bytes:
    """The certificate a webhook serves (DER), read over TLS without verifying it."""
    import socket
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
        return tls.getpeercert(binary_form=True)


class SteadyCreator:
    """Creates `pod` (one that asks for a volume) through the API server (server-side dry run)
    at a steady rate in a thread, and counts the refused."""

    def __init__(self, cluster, pod: dict, interval: float = 0.25, request_timeout: str | None = None):
        import threading
        self.cluster, self.pod, self.interval = cluster, pod, interval
        self.sent = self.refused = 0
        self.errors: list[str] = []
        self.times: list[float] = []  # when each request was answered (time.monotonic())
        # (when it was sent, when answered, admitted or not, the error): for tests that tell
        # apart the requests made while a component was down.
        self.outcomes: list[tuple[float, float, bool, str]] = []
        # kubectl --request-timeout (while the API server waits on a stopped etcd, say).
        self.extra = [f"--request-timeout={request_timeout}"] if request_timeout else []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        pod = json.dumps(self.pod)
        while not self._stop.is_set():
            sent = time.monotonic()
            out = self.cluster.kubectl("create", "--dry-run=server", "-o", "name", *self.extra, "-f", "-", input=pod,
                                       check=False)
            self.sent += 1
            self.times.append(time.monotonic())
            self.outcomes.append((sent, self.times[-1], out.returncode == 0, out.stderr.strip()))
            if out.returncode != 0:
                self.refused += 1
                self.errors.append(out.stderr.strip()[:300])
            self._stop.wait(self.interval)

    def wait_sent(self, count: int, timeout: float = 60):
        """Waits until `count` requests in all have been answered."""
        wait_for(f"{count} pods sent", lambda: self.sent >= count, timeout=timeout, interval=0.1)

    def during(self, step, around: int = 5) -> int:
        """Runs `step()` with `around` requests answered before and after it, however fast the
        machine, and returns how many were answered while it ran."""
        self.wait_sent(self.sent + around)
        start = time.monotonic()
        step()
        end = time.monotonic()
        self.wait_sent(self.sent + around)
        return sum(1 for t in self.times if start <= t <= end)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="session")
def controlplane(tmp_path_factory):
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane"), node_ip=os.environ.get("EVI_NODE_IP"))
    cp.start()
    print(f"\ncontrol plane up in {cp.startup_seconds:.1f} s ({cp.dir})", file=sys.stderr)
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def cluster(controlplane) -> Cluster:
    return Cluster(controlplane)


@pytest.fixture(scope="session")
def node(controlplane, tmp_path_factory):
    """A real node (kubelet, containerd, kube-scheduler) joined to the control plane; only in
    the test run's own network namespace (make e2e runs the tests through in-netns.sh). With
    EVI_REQUIRE_NODE=1 (CI) its absence fails instead of skipping."""
    if not in_test_namespace():
        message = "no node: run the end-to-end tests through tests/e2e/in-netns.sh (make e2e)"
        if os.environ.get("EVI_REQUIRE_NODE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    n = Node(controlplane, tmp_path_factory.mktemp("node"))
    n.start()
    print(f"\nnode Ready in {n.startup_seconds:.1f} s ({n.dir})", file=sys.stderr)
    yield n
    n.stop()


@dataclass
class Published:
    registry: Registry
    image: str  # <registry>/ephemeral-volume-injector@sha256:… (the index)
    digest: str
    chart: str  # oci://<registry>/charts/ephemeral-volume-injector
    chart_digest: str
    version: str
    chart_version: str
    public_key: Path

    @property
    def repository(self) -> str:
        return self.image.split("@")[0]


@pytest.fixture(scope="session")
def published(node, tmp_path_factory):
    """A release as release/publish.sh makes it, into the run's own registry, signed with a
    key pair made for the run; the node's containerd pulls from that registry (for the whole
    session: the node's modules install the chart from it)."""
    assert (OCI / "index.json").exists(), f"{OCI} is missing: make images builds it"
    release_tools("registry", "crane", "cosign")
    work = tmp_path_factory.mktemp("release")
    registry = Registry(work / "registry").start()
    node.use_registry(registry.host)
    try:
        registry.cosign("generate-key-pair", "--output-key-prefix", str(work / "cosign"))
        env = dict(os.environ, COSIGN_PASSWORD="", PATH=f"{RELEASE_BIN}:{Path(HELM).parent}:{os.environ['PATH']}",
                   HELM_REGISTRY_CONFIG=str(work / "helm-registry.json"), HELM_CACHE_HOME=str(work / "helm-cache"))
        p = subprocess.run(["bash", str(ROOT / "release" / "publish.sh"), "--registry", registry.host,
                            "--key", str(work / "cosign.key"), "--plain-http", "--no-tlog"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-4000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        yield Published(registry, out["image"], out["digest"], out["chart"], out["chartDigest"], out["version"],
                        out["chartVersion"], work / "cosign.pub")
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def image(node, published):
    """The image index's digest; the size of each platform's image as the registry holds it."""
    sizes = {}
    for m in json.loads(published.registry.crane("manifest", published.image).stdout)["manifests"]:
        manifest = json.loads(published.registry.crane("manifest", f"{published.repository}@{m['digest']}").stdout)
        sizes[m["platform"]["architecture"]] = sum(x["size"] for x in manifest["layers"]) + manifest["config"]["size"]
    print(f"\nwebhook image {published.image}: " + ", ".join(f"{a} {s / 1e6:.2f} MB" for a, s in sorted(sizes.items())),
          flush=True)
    return sizes


def pods_of(cluster, namespace: str, selector: str) -> list[dict]:
    return cluster.get("pods", "-n", namespace, "-l", selector)["items"]


def install_release(cluster, published, release: str, values: dict, workdir: Path, timeout: str = "150s"):
    """A release of its own from the published chart, its image pinned by digest, its pods on
    the node; `helm install --wait --wait-for-jobs` (the install check included). Returns helm's
    result: the caller judges it."""
    path = workdir / f"values-{release}.yaml"
    path.write_text(json.dumps({"image": {"repository": published.repository, "digest": published.digest},
                                "tolerations": [TAINT], **values}))
    return cluster.helm("install", release, published.chart, "--version", published.chart_version, "--plain-http",
                        "-n", RELEASE_NS, "--create-namespace", "-f", path, "--wait", "--wait-for-jobs", "--timeout", timeout,
                        check=False)


def release_pods(cluster, release: str) -> list[dict]:
    return pods_of(cluster, RELEASE_NS, f"app.kubernetes.io/name=ephemeral-volume-injector,"
                                        f"app.kubernetes.io/instance={release}")


NEXTFLOW_LABELS = {"nextflow.io/app": "nextflow"}


def nextflow_job(name: str | None, namespace: str, annotations: dict | None = None,
                 labels: dict | None = NEXTFLOW_LABELS, spec: dict | None = None, **job_spec) -> dict:
    """A Job as Nextflow 26.10 submits it (PodSpecBuilder.buildAsJob): backoffLimit 0, the task's
    annotations and labels on the pod template (its pods arrive with generateName and no name),
    the labels on the Job too. Named, or `generateName: nf-` when `name` is None; `spec` replaces
    the task's pod spec (a task that runs on the node); `job_spec` adds to the Job's spec."""
    task = pod(namespace=namespace, annotations=annotations, labels=dict(labels) if labels else None)
    template = {"metadata": {k: v for k, v in task["metadata"].items() if k in ("annotations", "labels")},
                "spec": spec or task["spec"]}
    meta: dict = {"namespace": namespace, **({"name": name} if name else {"generateName": "nf-"})}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"backoffLimit": 0, **job_spec, "template": template}}


def pod(name: str | None = None, namespace: str = "default", annotations: dict | None = None,
        labels: dict | None = None, containers: list[dict] | None = None, **spec) -> dict:
    """A pod shaped like a Nextflow task (Pod mode) unless told otherwise."""
    meta: dict = {"namespace": namespace}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "nf-"
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "containers": containers or [{
                "name": name or "main", "image": "quay.io/nextflow/bash",
                "args": ["/bin/bash", "-ue", "-c", "bash .command.run"],
                "resources": {"requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "10Gi"},
                              "limits": {"memory": "2Gi", "ephemeral-storage": "10Gi"}},
                "env": [{"name": "NXF_OWNER", "value": "1000:1000"}],
            }],
            **spec,
        },
    }


def volumes_by_name(stored: dict) -> dict:
    return {v["name"]: v for v in stored["spec"].get("volumes", [])}


def mounts_by_path(container: dict) -> dict:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}
