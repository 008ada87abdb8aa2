"""The faults a real cluster throws at the webhook, on the real node, with pods created through
the API server at a steady rate: kube-apiserver killed and started again, etcd killed in the
middle of a self-managed CA rotation, the path to the webhook slower than `timeoutSeconds`
(under failurePolicy Fail and Ignore), and a replica killed at its memory limit. Each test
prints its counts; docs/operations.md ("Faults") keeps the table of what users see.

The releases here are the chart from the run's registry (selfManaged TLS, two replicas, each
with an annotation prefix of its own). Runs only inside the test run's network namespace."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import certs
import pytest
from conftest import RELEASE_NS, ROOT, SteadyCreator, install_release, nextflow_job, pod, release_pods, wait_for
from controlplane import free_port, start_process, stop_process

NS = "nf-faults"
WEBHOOK_PORT, ADMIN_PORT = 8443, 8080


class Release:
    """A release on the node: its pods, what they serve and the caBundle the API server has."""

    def __init__(self, cluster, name: str, prefix: str):
        self.cluster, self.name, self.prefix = cluster, name, prefix
        self.fullname = f"{name}-ephemeral-volume-injector"
        # The name the API server checks the certificate against (a Service reference).
        self.server_name = f"{self.fullname}.{RELEASE_NS}.svc"

    def pods(self, ready: bool = True) -> list[dict]:
        out = release_pods(self.cluster, self.name)
        if ready:
            out = [p for p in out if p["status"].get("phase") == "Running" and p["status"].get("podIP")
                   and all(c["ready"] for c in p["status"].get("containerStatuses", []))]
        return out

    def ca_bundles(self) -> list[bytes]:
        return [base64.b64decode(w["clientConfig"].get("caBundle", ""))
                for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
                for w in self.cluster.get(kind, self.fullname)["webhooks"]]

    def secret(self) -> dict[str, bytes]:
        data = self.cluster.get("secret", f"{self.fullname}-certs", "-n", RELEASE_NS).get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def asking_pod(self, **spec) -> dict:
        return pod(namespace=NS, annotations={f"{self.prefix}/scratch": "type=emptyDir,mountPath=/scratch,size=16Mi"},
                   **spec)

    def dry_run(self, obj: dict) -> subprocess.CompletedProcess:
        return self.cluster.create(obj, "--dry-run=server", check=False)


def install(cluster, published, tmp: Path, name: str, values: dict) -> Release:
    prefix = f"{name}.evi.test"
    config = {"annotationPrefix": prefix, "clusterChecks": "enforce", **values.pop("config", {})}
    tls = {"mode": "selfManaged", **values.pop("tls", {})}
    p = install_release(cluster, published, name, {"config": config, "tls": tls, **values}, tmp)
    assert p.returncode == 0, p.stderr + p.stdout
    cluster.namespace(NS)
    return Release(cluster, name, prefix)


@pytest.fixture(scope="module")
def faults(cluster, node, published, image, tmp_path_factory):
    """Two replicas, selfManaged TLS, cluster checks enforced, the API server's timeout 2 s."""
    rel = install(cluster, published, tmp_path_factory.mktemp("faults"), "evi-faults",
                  {"webhook": {"timeoutSeconds": 2}})
    yield rel
    cluster.helm("uninstall", rel.name, "-n", RELEASE_NS, "--wait", check=False)


class _Connection(http.client.HTTPSConnection):
    """HTTPS to a pod's address, the certificate checked against `server_name` (as the API
    server checks it for a Service reference)."""

    def __init__(self, ip: str, ctx: ssl.SSLContext, server_name: str, timeout: float):
        super().__init__(ip, WEBHOOK_PORT, timeout=timeout, context=ctx)
        self._ctx, self._name = ctx, server_name

    def connect(self):
        self.sock = self._ctx.wrap_socket(socket.create_connection((self.host, self.port), self.timeout),
                                          server_hostname=self._name)


def review_body(obj: dict) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": obj["metadata"]["namespace"], "object": obj}}).encode()


def direct_review(rel: Release, ip: str, ca: bytes, body: bytes, timeout: float = 10) -> tuple[int, dict]:
    """Posts a review to one replica, as the API server would (its CA, its server name)."""
    conn = _Connection(ip, ssl.create_default_context(cadata=ca.decode()), rel.server_name, timeout)
    try:
        conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def readyz(ip: str) -> int:
    try:
        conn = http.client.HTTPConnection(ip, ADMIN_PORT, timeout=3)
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    except OSError:
        return 0


def ready_endpoints(rel: Release) -> set[str]:
    """The addresses the release's Service lists ready (what the API server resolves it to)."""
    endpoints = rel.cluster.get("endpoints", rel.fullname, "-n", RELEASE_NS)
    return {a["ip"] for s in endpoints.get("subsets", []) for a in s.get("addresses", [])}


def outcomes_between(load: SteadyCreator, start: float, end: float) -> list[tuple]:
    """The requests sent in [start, end)."""
    return [o for o in load.outcomes if start <= o[0] < end]


def wait_answered_after(load: SteadyCreator, start: float, count: int) -> None:
    """Waits until `count` requests sent after `start` have been answered."""
    wait_for(f"{count} requests answered after the fault", lambda: len(outcomes_between(load, start, float("inf")))
             >= count, timeout=120, interval=0.2)


def issue_serving_certificate(rel: Release, tmp: Path) -> tuple[bytes, bytes]:
    """A serving certificate from the Secret's CA, for the names the pods serve, made by hand
    with more time left than the renewal threshold (so that no replica replaces it)."""
    stored = rel.secret()
    (tmp / "ca.crt").write_bytes(stored["ca.crt"])
    (tmp / "ca.key").write_bytes(stored["ca.key"])
    args = rel.pods()[0]["spec"]["containers"][0]["args"]
    names = next(a for a in args if a.startswith("--tls-name=")).split("=", 1)[1].split(",")
    certs.issue(tmp, "tls", certs.Pair(tmp / "ca.crt", tmp / "ca.key"), names=names, days=80)
    return (tmp / "tls.crt").read_bytes(), (tmp / "tls.key").read_bytes()


def served_der(ip: str) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((ip, WEBHOOK_PORT), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
        return tls.getpeercert(binary_form=True)


def test_the_api_server_killed_and_started_again(cluster, faults, tmp_path):
    """kube-apiserver SIGKILLed for 8 s and started again, while pods that ask are created
    every 0.2 s: the replicas keep answering the reviews they get (sent straight to them while
    the API server is down), stay ready, and once the API server is ready again nothing is
    refused; the cluster-check watch (a StorageClass created after the restart) and the
    self-managed Secret watch (a certificate stored in it) resume."""
    cp, rel = cluster.cp, faults
    late = "evi-faults-late"
    late_pod = rel.asking_pod()
    late_pod["metadata"]["annotations"][f"{rel.prefix}/data"] = (
        f"type=ephemeral,storageClass={late},size=1Gi,mountPath=/data")
    refused = rel.dry_run(late_pod)
    assert refused.returncode != 0 and f'StorageClass "{late}" does not exist' in refused.stderr, refused.stderr
    ca = rel.ca_bundles()[0]
    ips = [p["status"]["podIP"] for p in rel.pods()]
    assert len(ips) == 2
    body = review_body(rel.asking_pod())
    direct = []
    with SteadyCreator(cluster, rel.asking_pod(), interval=0.2, request_timeout="10s") as load:
        load.wait_sent(load.sent + 10)
        killed = time.monotonic()
        cp.stop_component("kube-apiserver")
        while time.monotonic() < killed + 8:
            for ip in ips:
                status, answer = direct_review(rel, ip, ca, body)
                direct.append((status, answer.get("response", {}).get("allowed"),
                               bool(answer.get("response", {}).get("patch")), readyz(ip)))
            time.sleep(0.5)
        restarted = time.monotonic()
        ready_after = cp.start_component("kube-apiserver")
        ready = time.monotonic()
        wait_answered_after(load, ready, 30)
    down = outcomes_between(load, killed, ready)
    after = outcomes_between(load, ready, float("inf"))
    failed_down = [o for o in down if not o[2]]
    refused_after = [o[3] for o in after if not o[2]]
    print(f"\nkube-apiserver killed for {restarted - killed:.1f} s, ready {ready_after:.1f} s after its start: "
          f"{len(down)} pods sent meanwhile, {len(failed_down)} failed "
          f"({sum('refused' in o[3] or 'EOF' in o[3] or 'connect' in o[3] for o in failed_down)} could not reach it); "
          f"{len(after)} sent after, {len(refused_after)} refused; {len(direct)} reviews answered straight by the "
          f"replicas while it was down")
    assert direct and all(d == (200, True, True, 200) for d in direct), direct
    assert len(after) >= 30 and not refused_after, refused_after[:3]

    # The watches resumed: a StorageClass made now is seen by the cluster checks...
    started = time.monotonic()
    cluster.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": late},
                    "provisioner": "csi.evi.test", "volumeBindingMode": "WaitForFirstConsumer"})
    try:
        wait_for("the StorageClass seen by every replica", lambda: all(
            rel.dry_run(late_pod).returncode == 0 for _ in range(6)), timeout=60, interval=0.5)
        seen = time.monotonic() - started
        # ...and a certificate stored in the Secret is served by both replicas.
        crt, key = issue_serving_certificate(rel, tmp_path)
        want = ssl.PEM_cert_to_DER_cert(crt.decode())
        started = time.monotonic()
        patch = {"data": {"tls.crt": base64.b64encode(crt).decode(), "tls.key": base64.b64encode(key).decode()}}
        cluster.kubectl("patch", "secret", f"{rel.fullname}-certs", "-n", RELEASE_NS, "--type=merge",
                        "-p", json.dumps(patch))
        wait_for("the stored certificate served by both replicas", lambda: all(served_der(ip) == want for ip in ips),
                 timeout=60, interval=0.2)
        print(f"after the restart: a new StorageClass seen in {seen:.1f} s, a stored certificate served in "
              f"{time.monotonic() - started:.1f} s")
    finally:
        cluster.kubectl("delete", "storageclass", late, "--wait=false", check=False)
    assert ips == [p["status"]["podIP"] for p in rel.pods()], "no replica restarted"


def pids_serving(ips: list[str]) -> dict[str, int]:
    """The webhook process of each pod address (read from the process's network namespace)."""
    own = Path("/proc/self/ns/net").resolve()
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if not (proc / "comm").read_text().startswith("ephemeral-volum") or (proc / "ns/net").resolve() == own:
                continue
        except OSError:
            continue
        addrs = subprocess.run(["nsenter", "-t", proc.name, "-n", "ip", "-4", "-o", "addr", "show"],
                               capture_output=True, text=True).stdout
        for ip in ips:
            if f" {ip}/" in addrs:
                out[ip] = int(proc.name)
    return out


class SlowPath:
    """Every byte the API server sends to the replicas arrives `delay` s late: in each pod's
    network namespace, an iptables REDIRECT sends new connections to the webhook's port
    through tests/e2e/delay_proxy.py, and connections made before are reset (the API server
    reconnects, through the proxy). Undone on exit."""

    REDIRECT = ["-t", "nat", "PREROUTING", "-p", "tcp", "--dport", str(WEBHOOK_PORT), "-j", "REDIRECT",
                "--to-ports"]

    def __init__(self, ips: list[str], delay: float, workdir: Path):
        self.pids = pids_serving(ips)
        assert sorted(self.pids) == sorted(ips), (self.pids, ips)
        self.delay, self.dir, self.procs, self.rules = delay, workdir, [], []

    def _iptables(self, pid: int, op: str, rule: list[str]) -> None:
        table = rule[:2] if rule[0] == "-t" else []
        rest = rule[2:] if table else rule
        subprocess.run(["nsenter", "-t", str(pid), "-n", "iptables", *table, op, *rest], check=True,
                       capture_output=True)

    def __enter__(self):
        for ip, pid in self.pids.items():
            port = free_port()
            self.procs.append(start_process(
                ["nsenter", "-t", str(pid), "-n", sys.executable, str(ROOT / "tests/e2e/delay_proxy.py"),
                 "--listen", str(port), "--upstream", f"127.0.0.1:{WEBHOOK_PORT}", "--delay", str(self.delay)],
                self.dir / f"proxy-{ip}.log"))
            wait_for("the delay proxy", lambda ip=ip: "listening" in (self.dir / f"proxy-{ip}.log").read_text(),
                     timeout=10)
            for rule in ([*self.REDIRECT, str(port)],
                         ["INPUT", "-i", "eth0", "-p", "tcp", "--dport", str(WEBHOOK_PORT), "-j", "REJECT",
                          "--reject-with", "tcp-reset"]):
                self._iptables(pid, "-A", rule)
                self.rules.append((pid, rule))
        return self

    def __exit__(self, *exc):
        for pid, rule in reversed(self.rules):
            self._iptables(pid, "-D", rule)
        for p in self.procs:
            stop_process(p)


def timed(fn) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    out = fn()
    return time.monotonic() - start, out


def test_a_webhook_slower_than_its_timeout_under_fail_and_ignore(cluster, faults, tmp_path):
    """The API server's calls to both replicas delayed 6 s (timeoutSeconds 2): a pod and a
    Job that ask are refused after the timeout under Fail, and admitted *without their volume*
    after the timeout under Ignore; a pod that asks for nothing is never sent, so never slowed.
    Measured with a delay of 0.5 s too (slower, within the timeout: admitted with the volume)."""
    rel = faults
    asks = {f"{rel.prefix}/scratch": "type=emptyDir,mountPath=/scratch,size=16Mi"}
    nothing = pod(namespace=NS, annotations={"other.example.com/a": "b"})
    ips = [p["status"]["podIP"] for p in rel.pods()]
    kinds = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
    webhooks = {kind: cluster.get(kind, rel.fullname)["webhooks"] for kind in kinds}
    assert {w["failurePolicy"] for ws in webhooks.values() for w in ws} == {"Fail"}
    assert {w["timeoutSeconds"] for ws in webhooks.values() for w in ws} == {2}

    def policy(value: str) -> None:
        """Set on the live configurations (the pods' and the workloads' webhooks), as
        `helm upgrade --set webhook.failurePolicy=…` would."""
        for kind, ws in webhooks.items():
            patch = [{"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": value} for i in range(len(ws))]
            cluster.kubectl("patch", kind, rel.fullname, "--type=json", "-p", json.dumps(patch))

    reset = 0

    def case(label: str, past_timeout: bool) -> dict:
        nonlocal reset
        out = {}
        for name, obj in (("pod that asks", rel.asking_pod()), ("Job that asks", nextflow_job(None, NS, asks, labels=None)),
                          ("pod that asks nothing", nothing)):
            # The injection resets the connections the API server made before it (it dials a
            # new one, through the proxy, for the next request; a write to one that was reset
            # fails with "broken pipe", a read with "reset by peer"): such an answer is the
            # injection's artefact, not the slow path's (a slow network resets nothing). Under
            # Ignore the reset is hidden: an answer to a request that asks, faster than the
            # timeout while every byte is 6 s late, can only be one.
            for _ in range(5):
                seconds, p = timed(lambda obj=obj: rel.dry_run(obj))
                artefact = any(m in p.stderr for m in ("reset by peer", "broken pipe", "connection lost",
                                                       "closed network", ": EOF"))
                hidden = past_timeout and p.returncode == 0 and seconds < 1 and name != "pod that asks nothing"
                if not artefact and not hidden:
                    break
                reset += 1
            volumes = json.loads(p.stdout)["spec"].get("volumes", []) if p.returncode == 0 else []
            out[name] = (seconds, p.returncode == 0, any(v["name"] == "scratch" for v in volumes), p.stderr.strip())
            # A Job gets its volumes at its pods' creation; the pods are admitted as above.
            volume = f", {'with' if out[name][2] else 'WITHOUT'} its volume" if name == "pod that asks" else ""
            print(f"  {label}, {name}: {'admitted' if p.returncode == 0 else 'refused'} in {seconds:.2f} s"
                  + (volume if p.returncode == 0 else f": {p.stderr.strip()[:160]}"))
        return out

    print()
    try:
        with SlowPath(ips, 0.5, tmp_path):
            within = case("delay 0.5 s, Fail", False)
        with SlowPath(ips, 6, tmp_path):
            fail = case("delay 6 s, Fail", True)
            policy("Ignore")
            ignore = case("delay 6 s, Ignore", True)
    finally:
        policy("Fail")
    print(f"  ({reset} requests met a connection the injection reset, and were sent again)")
    # Within the timeout: slower, and served.
    assert within["pod that asks"][1:3] == (True, True) and within["Job that asks"][1]
    # Past it, Fail: refused after about timeoutSeconds, naming the webhook and the deadline.
    for name in ("pod that asks", "Job that asks"):
        seconds, admitted, _, err = fail[name]
        assert not admitted and 1.5 < seconds < 6, (name, seconds, err)
        assert "failed calling webhook" in err and ("deadline" in err or "timeout" in err.lower()), err
    # Ignore: admitted after the timeout, the pod without its volume.
    for name in ("pod that asks", "Job that asks"):
        seconds, admitted, _, err = ignore[name]
        assert admitted and 1.5 < seconds < 6, (name, seconds, err)
    assert not ignore["pod that asks"][2]
    # A pod that asks for nothing is never sent: as fast with the path slowed as without.
    for result in (within, fail, ignore):
        assert result["pod that asks nothing"][1] and result["pod that asks nothing"][0] < 1.5, result
    # The path restored: served again at once.
    wait_for("the webhook served again", lambda: rel.dry_run(rel.asking_pod()).returncode == 0, timeout=20)


def one_ca(pem: bytes) -> bool:
    return pem.count(b"-----BEGIN CERTIFICATE-----") == 1


def test_etcd_killed_in_the_middle_of_a_ca_rotation(cluster, node, published, image, tmp_path):
    """A release whose CA lives 80 s (a rotation 40 s after each CA is made): etcd SIGKILLed
    for 10 s as soon as the next CA is in the Secret (`next-ca-added`), while pods that ask are
    created every 0.2 s. After it: the rotation completes with exactly one CA, in the Secret
    and in every caBundle; both replicas serve a certificate from it that passes the API
    server's own check (its CA, its server name); nothing is refused once the API server is
    ready again."""
    cp = cluster.cp
    rel = install(cluster, published, tmp_path, "evi-rotate", {"tls": {"selfManaged": {
        "caLifetime": "80s", "caRenewBefore": "40s", "certLifetime": "40s", "certRenewBefore": "15s",
        "caOverlap": "5s"}}})
    try:
        first_ca = rel.secret()["ca.crt"]
        ips = [p["status"]["podIP"] for p in rel.pods()]
        assert len(ips) == 2

        def rotated() -> bool:
            stored = rel.secret()
            return ("next-ca.crt" not in stored and stored["ca.crt"] != first_ca and one_ca(stored["ca-bundle.crt"])
                    and stored["ca.crt"].strip() in stored["ca-bundle.crt"]
                    and all(b == stored["ca-bundle.crt"] for b in rel.ca_bundles()))

        with SteadyCreator(cluster, rel.asking_pod(), interval=0.2, request_timeout="10s") as load:
            wait_for("a rotation under way (the next CA in the Secret)", lambda: "next-ca.crt" in rel.secret(),
                     timeout=120, interval=0.2)
            killed = time.monotonic()
            cp.stop_component("etcd")
            time.sleep(10)
            ready_after = cp.start_component("etcd")
            ready = time.monotonic()
            wait_for("the rotation completed: one CA in the Secret and in every caBundle", rotated, timeout=60,
                     interval=0.5)
            completed = time.monotonic()
            stored = rel.secret()
            served = {ip: direct_review(rel, ip, stored["ca-bundle.crt"], review_body(rel.asking_pod()))[0]
                      for ip in ips}
            wait_answered_after(load, ready, 10)
        down = outcomes_between(load, killed, ready)
        after = outcomes_between(load, ready, float("inf"))
        refused_after = [o[3] for o in after if not o[2]]
        print(f"\netcd killed for 10 s mid-rotation, the API server ready {ready_after:.1f} s after its start; "
              f"rotation completed {completed - ready:.1f} s after; {len(down)} pods sent while down, "
              f"{sum(not o[2] for o in down)} failed; {len(after)} sent after, {len(refused_after)} refused")
        assert served == {ip: 200 for ip in ips}, served
        assert len(after) >= 10 and not refused_after, refused_after[:3]
        assert [p["status"]["podIP"] for p in rel.pods()] == ips, "no replica restarted"
    finally:
        cluster.helm("uninstall", rel.name, "-n", RELEASE_NS, "--wait", check=False)


def largest_pod(rel: Release, limit: int = 3 * 1024 * 1024) -> dict:
    """A pod that asks, as large as the API server takes (its request body limit, 3 MiB):
    long environment values, as a pipeline passing data through the environment would make."""
    p = rel.asking_pod()
    base = len(json.dumps(p))
    value = "x" * 4000
    count = (limit - base - 64 * 1024) // (len(value) + 30)
    p["spec"]["containers"][0]["env"] += [{"name": f"V{i}", "value": value} for i in range(count)]
    return p


def metric(ip: str, name: str) -> float:
    conn = http.client.HTTPConnection(ip, ADMIN_PORT, timeout=5)
    conn.request("GET", "/metrics")
    for line in conn.getresponse().read().decode().splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


class Flood:
    """`senders` threads posting the largest review to one replica, over and over."""

    def __init__(self, rel: Release, ip: str, ca: bytes, body: bytes, senders: int = 16):
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()

        def send():
            while not self._stop.is_set():
                try:
                    key = str(direct_review(rel, ip, ca, body, timeout=20)[0])
                except (OSError, http.client.HTTPException) as e:
                    key = type(e).__name__
                self.answers[key] = self.answers.get(key, 0) + 1

        self._threads = [threading.Thread(target=send, daemon=True) for _ in range(senders)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_a_flood_of_the_largest_reviews_waits_for_room_and_a_replica_killed_anyway_restarts(
        cluster, node, published, image, tmp_path):
    """One replica flooded with the largest reviews the API server can send (3 MiB; 16 senders
    at once, straight to its address) while pods that ask are created through the API server
    every 0.2 s. With the chart's limits (192 MiB; bodies held at once capped at 8 MiB) it
    is never killed: the flood waits for room, its peak RSS is measured, nothing is refused.
    With the cap raised past what the limit holds (256 MiB of bodies under 64 MiB) the kernel
    kills it: the other replica serves, the kubelet restarts it, and the only pods refused are
    those the API server sent to its address while its endpoints still listed it (before the
    kubelet's unready status reached them), or had in flight there when it was killed
    (failurePolicy Fail; the API server retries neither); none once it serves again."""
    rel = install(cluster, published, tmp_path, "evi-oom", {})
    try:
        big = largest_pod(rel)
        through = rel.dry_run(big)  # the API server takes it, and the webhook serves it
        assert through.returncode == 0, through.stderr[-500:]
        body = review_body(big)

        def replicas():
            pods = sorted(rel.pods(), key=lambda p: p["metadata"]["name"])
            assert len(pods) == 2
            return pods

        def restarts(name: str) -> tuple[int, str]:
            status = cluster.get("pod", name, "-n", RELEASE_NS)["status"]["containerStatuses"][0]
            return status["restartCount"], status.get("lastState", {}).get("terminated", {}).get("reason", "")

        # The chart's limits: the flood waits, the replica lives.
        target, other = replicas()
        ip = target["status"]["podIP"]
        with SteadyCreator(cluster, rel.asking_pod(), interval=0.2, request_timeout="10s") as load:
            with Flood(rel, ip, rel.ca_bundles()[0], body) as flood:
                time.sleep(20)
            load.wait_sent(load.sent + 5)
        (pid,) = pids_serving([ip]).values()
        peak = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM:"))
        waits = metric(ip, "evi_body_budget_waits_total")
        print(f"\nthe chart's limits: a replica flooded for 20 s with {len(body) / 2**20:.2f} MiB reviews answered "
              f"{flood.answers}, {waits:.0f} waited for room, peak RSS {peak / 1024:.1f} MiB of its 192 MiB limit; "
              f"{load.sent} pods sent through the API server, {load.refused} refused")
        assert restarts(target["metadata"]["name"])[0] == 0 and flood.answers.get("200", 0) > 20, flood.answers
        assert waits > 0 and peak < 150 * 1024
        assert load.refused == 0, load.errors[:3]

        # The cap raised past what the limit holds: killed, and survived.
        upgrade = cluster.helm("upgrade", rel.name, published.chart, "--version", published.chart_version,
                               "--plain-http", "-n", RELEASE_NS, "--reuse-values", "--set",
                               "resources.limits.memory=64Mi,server.maxInflightBodyBytes=268435456",
                               "--wait", "--wait-for-jobs", "--timeout", "150s", check=False)
        assert upgrade.returncode == 0, upgrade.stderr
        wait_for("two replicas of the upgrade", lambda: len(rel.pods()) == 2 and all(
            "--max-inflight-body-bytes=268435456" in p["spec"]["containers"][0]["args"] for p in rel.pods()),
            timeout=90, interval=1)
        target, other = replicas()
        ip = target["status"]["podIP"]
        with SteadyCreator(cluster, rel.asking_pod(), interval=0.2, request_timeout="10s") as load:
            load.wait_sent(load.sent + 5)
            started = time.monotonic()
            with Flood(rel, ip, rel.ca_bundles()[0], body) as flood:
                wait_for("the flooded replica killed", lambda: restarts(target["metadata"]["name"])[0] >= 1,
                         timeout=120, interval=0.2)
            killed = time.monotonic()
            # Back means serving again where the API server sends reviews: the restarted
            # process answers on its own address and the Service's endpoints list it ready.
            # (restartCount moves when the kubelet starts the new container, before it
            # listens, and the endpoints reach the API server later still: a review refused
            # in that window is the cluster's routing, not the webhook.)
            wait_for("the killed replica serving again", lambda: readyz(ip) == 200 and ip in ready_endpoints(rel),
                     timeout=60, interval=0.2)
            back = time.monotonic()
            load.wait_sent(load.sent + 10)
        count, reason = restarts(target["metadata"]["name"])
        refused = [o for o in load.outcomes if not o[2]]
        print(f"a cap past the limit: killed ({reason}) {killed - started:.1f} s into the flood (seen by then), "
              f"serving again {back - killed:.1f} s later; {load.sent} pods sent through the API server, "
              f"{len(refused)} refused: " + "; ".join(f"{o[0] - started:+.1f} s: {o[3][-70:]}" for o in refused))
        assert reason == "OOMKilled", reason
        assert restarts(other["metadata"]["name"])[0] == 0, "the other replica was not killed"
        # Refused only by the killed replica: a new connection to its address refused, or one
        # the kill cut while a review was on it (reset, broken pipe, EOF before the answer).
        cut = (f"dial tcp {ip}:8443: connect: connection refused", f"->{ip}:8443: read: connection reset by peer",
               f"->{ip}:8443: write: broken pipe", f"->{ip}:8443: read: EOF")
        for o in refused:
            assert any(c in o[3] for c in cut), o[3]
            assert o[0] < back, "a pod refused after the restarted replica served again"
        assert rel.dry_run(rel.asking_pod()).returncode == 0
    finally:
        cluster.helm("uninstall", rel.name, "-n", RELEASE_NS, "--wait", check=False)


TENANT_NS = "nf-tenant"


def worst_pods(rel: Release) -> list[tuple[str, dict, str, str]]:
    """The pods a tenant who may only create pods writes to hurt (tests/complexity.rs's
    families, as large as the API server passes them to admission), each with the status
    reason and the words of its documented refusal (docs/operations.md, "Bounds of one
    review")."""
    p = rel.prefix
    hundred = [{"name": f"c{i}", "image": "busybox"} for i in range(100)]
    many = {f"{p}/v{i}": f"type=emptyDir,size=1Gi,mountPath=/v{i}" for i in range(3000)}
    long_key = json.dumps({"type": "emptyDir", "mountPath": "/s", "x": {"k" * 400_000: [0] * 200_000}})
    wide = [{"name": f"c{i}", "image": "busybox"} for i in range(6000)]
    return [
        ("3,000 volume annotations, 100 containers",
         pod(namespace=TENANT_NS, annotations=many, containers=hundred),
         "Forbidden", "a pod may ask for at most 64 volumes"),
        (f"a {len(long_key) / 2**20:.1f} MiB JSON value, one long key over a long array",
         pod(namespace=TENANT_NS, annotations={f"{p}/s": long_key}),
         "BadRequest", "more than the 16384 a volume annotation may have"),
        ("one volume and a variable for each of 6,000 containers",
         pod(namespace=TENANT_NS, annotations={f"{p}/s": "type=emptyDir,size=1Gi,mountPath=/s,env=TMPDIR"},
             containers=wide),
         "Forbidden", "more than the 10000 the API server accepts"),
    ]


def test_a_tenants_flood_of_the_worst_pods_is_refused_and_nobody_else_notices(
        cluster, node, published, image, tmp_path):
    """A tenant floods the worst pods there are through the API server (four senders at once,
    for 30 s) while another namespace creates Nextflow-shaped Jobs and their pods at a steady
    rate: every flood pod is refused with its documented 4xx, none of the other namespace's is,
    and neither replica restarts or reports unready (its /readyz sampled throughout)."""
    rel = install(cluster, published, tmp_path, "evi-flood", {})
    cluster.namespace(TENANT_NS)
    try:
        worst = worst_pods(rel)
        replicas = {p["metadata"]["name"]: p["status"]["podIP"] for p in rel.pods()}
        assert len(replicas) == 2, replicas
        job = nextflow_job("nf-steady", NS, {f"{rel.prefix}/scratch": "type=emptyDir,mountPath=/scratch,size=16Mi"})
        stop = threading.Event()
        flood: dict[str, list[str]] = {name: [] for name, *_ in worst}
        unready: list[tuple[str, int]] = []

        def send(offset: int):
            i = offset
            while not stop.is_set():
                name, obj, *_ = worst[i % len(worst)]
                out = cluster.kubectl("create", "--dry-run=server", "-o", "name", "--request-timeout=20s", "-f", "-",
                                      input=json.dumps(obj), check=False)
                flood[name].append("admitted" if out.returncode == 0 else out.stderr.strip())
                i += 1

        def watch_readiness():
            while not stop.is_set():
                for name, ip in replicas.items():
                    if (status := readyz(ip)) != 200:
                        unready.append((name, status))
                stop.wait(0.5)

        with SteadyCreator(cluster, rel.asking_pod(), interval=0.2, request_timeout="10s") as pods, \
                SteadyCreator(cluster, job, interval=0.5, request_timeout="10s") as jobs:
            threads = [threading.Thread(target=send, args=(k,), daemon=True) for k in range(4)]
            threads.append(threading.Thread(target=watch_readiness, daemon=True))
            for t in threads:
                t.start()
            time.sleep(30)
            stop.set()
            for t in threads:
                t.join(60)
            pods.wait_sent(pods.sent + 3)
        restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
                    for p in rel.pods(ready=False)}
        print("\na tenant's flood for 30 s: " + "; ".join(f"{name}: {len(out)} sent" for name, out in flood.items())
              + f"; the other namespace: {pods.sent} pods and {jobs.sent} Jobs sent, "
              f"{pods.refused + jobs.refused} refused; restarts {restarts}; unready samples {len(unready)}")
        assert pods.refused == 0, pods.errors[:3]
        assert jobs.refused == 0, jobs.errors[:3]
        assert pods.sent > 20 and jobs.sent > 10
        assert set(restarts) == set(replicas) and not any(restarts.values()), restarts
        assert not unready, unready[:5]
        for name, reason, words in ((n, r, w) for n, _, r, w in worst):
            assert flood[name], f"{name}: never sent"
            for out in flood[name]:
                assert f"({reason})" in out and words in out, f"{name}: {out[-400:]}"
    finally:
        cluster.helm("uninstall", rel.name, "-n", RELEASE_NS, "--wait", check=False)
