"""The webhook at a fleet's scale: Nextflow-shaped Jobs in bursts on a simulated 1,000-node cluster.

The end-to-end tests' control plane (etcd, kube-apiserver, kube-controller-manager) plus
kube-scheduler, and KWOK (sigs.k8s.io/kwok v0.8.0, tests/release/build-tools.sh kwok) managing
fake nodes: it marks them Ready, runs the pods the scheduler binds to them (Running, then
Succeeded for a Job's pod) and, with its own volume stages, provisions and binds the PVCs of
generic ephemeral volumes. The chart is installed with its webhooks pointed at the real binary
(1 replica, or 3 behind a per-connection round-robin balancer on loopback, as kube-proxy would
spread connections), and C clients create N Jobs as fast as they are answered. Each Job's pod asks
for three volumes (a disk emptyDir, a Memory emptyDir, a generic ephemeral volume of the
`kwok-volume` class).

A last run per client count installs no webhook but the admission policies `policies --apply`
compiles from the same configuration (what the chart's `policies.mode=policies` installs), so
that the two can be compared on the same Jobs; for it the API server's own time is its
admission plugins' (`apiserver_admission_controller_admission_duration_seconds`, the mutating and
the validating policy plugin).

For each run it reports: Jobs per second (the clients'), pods per second (the job controller
creating them through the webhook, until all N exist), the time until all are scheduled and
finished, Job creation latency at the client, the API server's own
`apiserver_admission_webhook_admission_duration_seconds` per webhook (bucket bounds: its
smallest bucket is 5 ms), failures (Jobs refused, pods without their volumes, PVCs not bound),
and each replica's CPU seconds, peak RSS and share of the reviews.

    cargo build --release && python3 benches/scale.py                      # 1,000 nodes
    python3 benches/scale.py --nodes 20 --jobs 30 --clients 10 --replicas 1 --json out.json

A benchmark, not a test: the figures go in benches/README.md and docs/operations.md; nothing
here asserts a time. tests/e2e/test_scale_smoke.py runs a small one and checks what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import conftest  # noqa: E402 - after the sys.path insert above
from conftest import Cluster, Release, Webhook, wait_for  # noqa: E402 - after the sys.path insert above
from controlplane import (  # noqa: E402 - after the sys.path insert above
    TOOLS_DIR, ControlPlane, pipe, start_process, start_scheduler, stop_process)

KWOK = TOOLS_DIR / "release" / "bin" / "kwok"
KWOK_STAGES = TOOLS_DIR / "release" / "kwok-stages"
METRIC = "apiserver_admission_webhook_admission_duration_seconds"
STORAGE_CLASS = "kwok-volume"  # the class KWOK's volume stages provision and bind
ANNOTATIONS = {
    "ephemeral-volumes.io/scratch": "type=emptyDir,size=20Gi,mountPath=/scratch,env=TMPDIR",
    "ephemeral-volumes.io/shm": "type=emptyDir,medium=Memory,size=1Gi,mountPath=/dev/shm",
    "ephemeral-volumes.io/work": f"type=ephemeral,storageClass={STORAGE_CLASS},size=10Gi,mountPath=/work",
}
VOLUMES = {"scratch", "shm", "work"}


def job(name: str) -> dict:
    """A Job as Nextflow's Kubernetes executor submits it (26.10+): a named Job whose pod template
    carries the task's annotations; the job controller makes the pod with generateName."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"nextflow.io/app": "nextflow", "nextflow.io/runName": "bench"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"nextflow.io/app": "nextflow"}, "annotations": ANNOTATIONS},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": name, "image": "quay.io/nextflow/bash",
                "command": ["/bin/bash", "-ue", ".command.run"], "workingDir": "/work",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}},
    }


def node(name: str) -> dict:
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


class Api:
    """Keep-alive HTTPS connections to the API server, one per thread."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.local = threading.local()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
        for attempt in (1, 2):
            if not hasattr(self.local, "conn"):
                self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.cp.api_port,
                                                              context=self.cp.ssl_context(), timeout=60)
            try:
                self.local.conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                                        {"Content-Type": "application/json"})
                resp = self.local.conn.getresponse()
                data = resp.read()
                return resp.status, (json.loads(data) if data else None)
            except (http.client.HTTPException, OSError):
                del self.local.conn  # a connection the server closed: once more on a new one
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def text(self, path: str) -> str:
        conn = http.client.HTTPSConnection("127.0.0.1", self.cp.api_port, context=self.cp.ssl_context())
        conn.request("GET", path)
        return conn.getresponse().read().decode()

    def items(self, path: str) -> list[dict]:
        status, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body["items"]


def webhook_histograms(api: Api) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts of the admission webhook histogram, per webhook name."""
    out: dict[str, dict[float, float]] = {}
    for line in api.text("/metrics").splitlines():
        if line.startswith(f"{METRIC}_bucket{{"):
            name = re.search(r'name="([^"]+)"', line).group(1)
            le = re.search(r'le="([^"]+)"', line).group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets = out.setdefault(name, {})
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# The API server's own time in its admission plugins, by plugin (the policies run in two).
PLUGIN_METRIC = "apiserver_admission_controller_admission_duration_seconds"
POLICY_PLUGINS = ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")


def policy_histograms(api: Api) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts of the admission plugin histogram for the two policy plugins,
    CREATE only (the runs' Jobs and pods)."""
    out: dict[str, dict[float, float]] = {}
    for line in api.text("/metrics").splitlines():
        if line.startswith(f"{PLUGIN_METRIC}_bucket{{") and 'operation="CREATE"' in line:
            name = re.search(r'name="([^"]+)"', line).group(1)
            if name not in POLICY_PLUGINS:
                continue
            le = re.search(r'le="([^"]+)"', line).group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets = out.setdefault(name, {})
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict, after: dict, q: float) -> str:
    delta = sorted((b, after.get(b, 0) - before.get(b, 0)) for b in after)
    if not delta or delta[-1][1] == 0:
        return "-"
    target = q * delta[-1][1]
    for bound, count in delta:
        if count >= target:
            return f"≤ {bound * 1000:g} ms" if bound != float("inf") else "> the largest bucket"
    return "-"


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Balancer:
    """A per-connection round-robin TCP balancer on loopback (kube-proxy spreads connections, not
    requests): the API server's HTTP/2 connections are shared out among the replicas."""

    def __init__(self, port: int, backends: list[int]):
        self.port, self.backends, self.next = port, backends, 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _conn(self, reader, writer) -> None:
        backend = self.backends[self.next % len(self.backends)]
        self.next += 1
        try:
            br, bw = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            writer.close()
            return

        await asyncio.gather(pipe(reader, bw), pipe(br, writer))

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.stop()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        self.thread.join(5)
        self.loop.close()


def own_buckets(hook: Webhook) -> dict[float, float]:
    """The replica's own decision-time histogram (`evi_admission_duration_seconds`: body read to
    answer built, what the SlowAdmission alert watches), cumulative per bucket bound."""
    out: dict[float, float] = {}
    for line in hook.admin("/metrics")[1].splitlines():
        if line.startswith("evi_admission_duration_seconds_bucket{"):
            le = re.search(r'le="([^"]+)"', line).group(1)
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Bench:
    def __init__(self, args):
        self.args = args
        self.cp = ControlPlane(args.dir, controller_args=(
            # The job controller and the rest talk to the API server as fast as a busy cluster's
            # do (the defaults, 20 requests/s, would be the bottleneck measured).
            "--kube-api-qps", "500", "--kube-api-burst", "1000", "--concurrent-job-syncs", "50",
            # Pods' PVCs: the ephemeral-volume controller makes them, the PV controller binds
            # them to what KWOK's stage provisioned.
            "--concurrent-ephemeralvolume-syncs", "20",
        ))
        self.procs: dict[str, object] = {}
        self.results: list[dict] = []

    # === the cluster ===

    def start(self) -> None:
        self.cp.start()
        self.cluster = Cluster(self.cp)
        self.api = Api(self.cp)
        kc = str(self.cp.kubeconfig)
        self.procs["kube-scheduler"] = start_scheduler(self.cp, self.cp.dir / "kube-scheduler.log",
                                                       "--kube-api-qps", "500", "--kube-api-burst", "1000")
        if not KWOK.exists():
            raise SystemExit(f"{KWOK} is missing: bash tests/release/build-tools.sh kwok")
        stages = self.cp.dir / "kwok.yaml"
        stages.write_text("\n---\n".join(
            f.read_text() for f in sorted(KWOK_STAGES.glob("*.yaml")) if f.name != "storage-class.yaml"))
        self.procs["kwok"] = start_process([
            str(KWOK), "--kubeconfig", kc, "--config", str(stages),
            "--manage-nodes-with-label-selector", "type=kwok", "--node-lease-duration-seconds", "40",
            # Pod addresses are written into pod status only; nothing is ever sent to them.
            "--cidr", "10.64.0.1/10",
        ], self.cp.dir / "kwok.log")
        self.cluster.kubectl("apply", "-f", str(KWOK_STAGES / "storage-class.yaml"))
        started = time.monotonic()
        names = [f"kwok-node-{i:04d}" for i in range(self.args.nodes)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            codes = list(pool.map(lambda n: self.api.request("POST", "/api/v1/nodes", node(n))[0], names))
        assert all(c == 201 for c in codes), f"nodes refused: {[c for c in codes if c != 201][:5]}"
        wait_for(f"{self.args.nodes} KWOK nodes Ready", lambda: sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            for n in self.api.items("/api/v1/nodes?labelSelector=type%3Dkwok")) == self.args.nodes,
            timeout=120, interval=1)
        print(f"{self.args.nodes} KWOK nodes Ready in {time.monotonic() - started:.1f} s", file=sys.stderr)

    def stop(self) -> None:
        for p in self.procs.values():
            stop_process(p)
        self.cp.stop()

    # === the webhook ===

    def install(self, replicas: int) -> tuple[Release, list[Webhook], Balancer | None]:
        release = Release(self.cluster, "evi", {"config": {}}, self.cp.dir / f"release-{replicas}").install()
        data = release.secret()["data"]
        cert, key = base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])
        hooks = [Webhook(self.cp.dir / f"webhook-{replicas}-{i}", cert, key, release.config())
                 for i in range(replicas)]
        balancer = None
        if replicas == 1:
            hooks[0].port = release.port  # where the chart's webhook.url points
        for h in hooks:
            h.start()
        if replicas > 1:
            balancer = Balancer(release.port, [h.port for h in hooks])
        ns = self.cluster.namespace("bench-probe")
        wait_for("the webhook to inject", lambda: VOLUMES <= {
            v["name"] for v in self.cluster.create_pod({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "probe-", "namespace": ns, "annotations": ANNOTATIONS},
                "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": "none"}})["spec"]["volumes"]})
        return release, hooks, balancer

    def uninstall(self, release: Release, hooks: list[Webhook], balancer: Balancer | None) -> None:
        release.uninstall()
        wait_for("the webhook configurations to be gone", lambda: not any(
            "ephemeral-volume-injector" in line for kind in ("mutatingwebhookconfigurations",
                                                              "validatingwebhookconfigurations")
            for line in self.cluster.kubectl("get", kind, "-o", "name").stdout.splitlines()))
        if balancer:
            balancer.stop()
        for h in hooks:
            h.stop()

    # === one run ===

    def run(self, label: str, clients: int, hooks: list[Webhook], policies: bool = False) -> dict:
        n = self.args.jobs
        ns = self.cluster.namespace(f"bench-{len(self.results)}")
        histograms = policy_histograms if policies else webhook_histograms
        before = histograms(self.api)
        cpu0 = [proc_cpu_seconds(h.proc.pid) for h in hooks]
        reviews0 = [h.metric("evi_admission_requests_total") + h.metric("evi_workload_reviews_total")
                    for h in hooks]
        own0 = [own_buckets(h) for h in hooks]
        latencies: list[float] = []
        refused: list[str] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            for i in range(k, n, clients):
                start = time.monotonic()
                status, body = self.api.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job(f"nf-{i:05d}"))
                took = time.monotonic() - start
                with lock:
                    latencies.append(took * 1000)
                    if status != 201:
                        refused.append(f"{status}: {(body or {}).get('message', '')[:200]}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        jobs_done = time.monotonic() - t0
        created = n - len(refused)
        pods_all = done_all = None
        pods: list[dict] = []
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline:
            pods = self.api.items(f"/api/v1/namespaces/{ns}/pods")
            if pods_all is None and len(pods) >= created:
                pods_all = time.monotonic() - t0
                # Once every pod exists, its scheduling waits on its PVC, which the simulated
                # cluster binds slowly (the PV controller, a few per second here): wait
                # --settle seconds more at most, and report how far it got.
                deadline = min(deadline, time.monotonic() + self.args.settle)
            if len(pods) >= created and all(p["status"].get("phase") in ("Running", "Succeeded") for p in pods):
                done_all = time.monotonic() - t0
                break
            time.sleep(0.25)
        after = histograms(self.api)
        with_volumes = sum(VOLUMES <= {v["name"] for v in p["spec"].get("volumes", [])} for p in pods)
        pvcs = self.api.items(f"/api/v1/namespaces/{ns}/persistentvolumeclaims")
        result = {
            "run": label, "clients": clients, "jobs": n, "jobs_refused": len(refused),
            "serves": bool(hooks) or policies,
            "refusals": refused[:3], "jobs_per_s": created / jobs_done,
            "pods": len(pods), "pods_per_s": len(pods) / pods_all if pods_all else None,
            "all_running_s": done_all, "pods_with_volumes": with_volumes,
            "pods_running": sum(p["status"].get("phase") in ("Running", "Succeeded") for p in pods),
            "settled_s": time.monotonic() - t0,
            "pvcs_bound": sum(p["status"].get("phase") == "Bound" for p in pvcs),
            "client_p50_ms": statistics.median(latencies), "client_p95_ms": quantile(latencies, 0.95),
            "client_p99_ms": quantile(latencies, 0.99),
            "apiserver": {name: {q: bucket_quantile(before.get(name, {}), b, q) for q in (0.5, 0.95, 0.99)}
                          for name, b in after.items()
                          if sum(b.values()) > sum(before.get(name, {}).values())},
            "replicas": [{
                "cpu_s": proc_cpu_seconds(h.proc.pid) - c0,
                "peak_rss_mib": proc_hwm_mib(h.proc.pid),
                "reviews": h.metric("evi_admission_requests_total") + h.metric("evi_workload_reviews_total") - r0,
                "own_p99": bucket_quantile(b0, own_buckets(h), 0.99),
            } for h, c0, r0, b0 in zip(hooks, cpu0, reviews0, own0, strict=True)],
        }
        self.results.append(result)
        print(json.dumps(result), file=sys.stderr)
        # The next run starts on a quiet cluster: this one's Jobs, pods and PVCs deleted first.
        self.cluster.kubectl("delete", "namespace", ns, "--wait=false")
        wait_for(f"namespace {ns} to be deleted", lambda: self.cluster.kubectl(
            "get", "namespace", ns, check=False).returncode != 0, timeout=300, interval=1)
        return result

    def main(self) -> None:
        self.start()
        clients = [int(c) for c in self.args.clients.split(",")]
        if not self.args.no_baseline:
            for c in clients:
                self.run("without the webhook", c, [])
        for replicas in [int(r) for r in self.args.replicas.split(",")]:
            release, hooks, balancer = self.install(replicas)
            try:
                for c in clients:
                    self.run(f"webhook, {replicas} replica{'s' if replicas > 1 else ''}", c, hooks)
            finally:
                self.uninstall(release, hooks, balancer)
        if not self.args.no_policies:
            self.apply_policies()
            try:
                for c in clients:
                    self.run("policies instead of the webhook", c, [], policies=True)
            finally:
                self.policies_command("--delete")

    # === the admission policies (`policies.mode=policies`) ===

    def policies_command(self, *args: str) -> None:
        self.cluster.run(self.args.binary, "policies", *args, "--exclude-namespace=kube-system")

    def apply_policies(self) -> None:
        """The webhook's configuration (the built-in defaults) compiled and applied, as the
        chart's hook does; ready when a probe pod gets its volumes."""
        self.policies_command("--apply")
        ns = self.cluster.namespace("bench-probe")
        wait_for("the policies to inject", lambda: VOLUMES <= {
            v["name"] for v in self.cluster.create_pod({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "probe-", "namespace": ns, "annotations": ANNOTATIONS},
                "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": "none"}})["spec"]["volumes"]},
            timeout=60, interval=0.5)


def table(results: list[dict], nodes: int) -> str:
    out = [f"{nodes} KWOK nodes, {results[0]['jobs']} Jobs per run (3 volume requests each)\n",
           "| run | clients | Jobs/s | pods/s | running (PVCs bound) | Job create p50 / p95 / p99 | "
           "API server: pods' webhook (policies: mutating plugin) p50 / p99 | Jobs' webhook (policies: "
           "validating plugin, pods and Jobs) p50 / p99 | failures | "
           "per replica: CPU s, peak RSS, reviews, own decision p99 |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        hooks = r["apiserver"]
        if "MutatingAdmissionPolicy" in hooks or "ValidatingAdmissionPolicy" in hooks:
            # The policies: the API server's own plugins (the mutating one sees pods only).
            pods, jobs = hooks.get("MutatingAdmissionPolicy"), hooks.get("ValidatingAdmissionPolicy")
        else:
            pods = next((v for k, v in hooks.items() if not k.startswith("workloads.")), None)
            jobs = next((v for k, v in hooks.items() if k.startswith("workloads.")), None)
        # Jobs refused, and with the webhook or the policies, pods created without their volumes.
        fails = r["jobs_refused"] + (r["pods"] - r["pods_with_volumes"] if r["serves"] else 0)
        running = (f"all in {r['all_running_s']:.0f} s" if r["all_running_s"] is not None
                   else f"{r['pods_running']} at {r['settled_s']:.0f} s")
        if r["serves"]:
            running += f" ({r['pvcs_bound']})"
        reps = "; ".join(f"{x['cpu_s']:.1f} s, {x['peak_rss_mib']:.0f} MiB, {x['reviews']:.0f}, {x['own_p99']}"
                         for x in r["replicas"])
        out.append(
            f"| {r['run']} | {r['clients']} | {r['jobs_per_s']:.0f} | {r['pods_per_s'] or 0:.0f} | {running} | "
            f"{r['client_p50_ms']:.0f} / {r['client_p95_ms']:.0f} / {r['client_p99_ms']:.0f} ms | "
            f"{pods[0.5] + ' / ' + pods[0.99] if pods else '-'} | {jobs[0.5] + ' / ' + jobs[0.99] if jobs else '-'} | "
            f"{fails} | {reps or '-'} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000, help="KWOK nodes (default 1000)")
    ap.add_argument("--jobs", type=int, default=1000, help="Jobs per run (default 1000)")
    ap.add_argument("--clients", default="10,50,200", help="concurrent clients per run, comma-separated")
    ap.add_argument("--replicas", default="1,3", help="webhook replicas, comma-separated (default 1,3)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the runs without the webhook")
    ap.add_argument("--no-policies", action="store_true",
                    help="skip the runs with the admission policies instead of the webhook")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for a run's pods to exist")
    ap.add_argument("--settle", type=float, default=20,
                    help="seconds to wait, once they all exist, for all to run (default 20)")
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "ephemeral-volume-injector")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--dir", type=Path, help="the cluster's directory (logs, etcd), kept; "
                                             "without it a temporary one, removed at the end")
    args = ap.parse_args()
    conftest.BINARY = args.binary
    if not args.binary.exists():
        raise SystemExit(f"{args.binary} is missing: cargo build --release")
    bench = Bench(args)
    try:
        bench.main()
    finally:
        bench.stop()
    if args.json:
        args.json.write_text(json.dumps({"nodes": args.nodes, "results": bench.results}, indent=1))
    print(table(bench.results, args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
