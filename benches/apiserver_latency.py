"""Latency the webhook adds to pod creation, seen through the real kube-apiserver.

Starts the control plane of the end-to-end tests, installs the chart with its webhook pointed
at the real binary (release build), and creates pods at a fixed rate, open loop, in two runs:

  without  no webhook configuration in the cluster (the same annotated pod)
  with     the chart installed: every pod is sent to the webhook and mutated

and reports, per run, the client's p50/p99 of `POST /api/v1/namespaces/*/pods` and the API
server's own `apiserver_admission_webhook_admission_duration_seconds` (a histogram whose
smallest bucket is 5 ms, so its quantiles are bucket bounds).

    cargo build --release && python3 benches/apiserver_latency.py [--rate 50] [--seconds 20]

A benchmark, not a test: the figures go in the README, nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import http.client
import json
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
from conftest import Cluster, Release  # noqa: E402 - after the sys.path insert above
from controlplane import ControlPlane  # noqa: E402 - after the sys.path insert above
from scale import bucket_quantile  # noqa: E402 - after the sys.path insert; scale.py's bucket bounds

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"generateName": "nf-", "annotations": {
        "ephemeral-volumes.io/scratch": "type=ephemeral,storageClass=gp3,size=100Gi,mountPath=/scratch,env=TMPDIR",
        "ephemeral-volumes.io/shm": "type=emptyDir,medium=Memory,size=2Gi,mountPath=/dev/shm"}},
    "spec": {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "quay.io/nextflow/bash", "args": ["bash", "-c", "true"],
        "resources": {"requests": {"cpu": "1", "memory": "4Gi", "ephemeral-storage": "10Gi"}}}]},
}
METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def webhook_histogram(cp: ControlPlane) -> dict[float, float]:
    """Cumulative bucket counts of the admission webhook histogram (summed over labels)."""
    conn = http.client.HTTPSConnection("127.0.0.1", cp.api_port, context=cp.ssl_context())
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{METRIC}_bucket{{") and 'type="admit"' in line:
            le = re.search(r'le="([^"]+)"', line).group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def run(cp: ControlPlane, namespace: str, rate: float, seconds: float) -> list[float]:
    """Creates pods at `rate` per second for `seconds`, open loop; the latencies in ms."""
    body = json.dumps(POD).encode()
    local = threading.local()
    latencies: list[float] = []
    errors = []

    def create(at: float):
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPSConnection("127.0.0.1", cp.api_port, context=cp.ssl_context())
        start = time.monotonic()
        local.conn.request("POST", f"/api/v1/namespaces/{namespace}/pods", body,
                           {"Content-Type": "application/json"})
        resp = local.conn.getresponse()
        resp.read()
        took = (time.monotonic() - start) * 1000
        if resp.status != 201:
            errors.append(resp.status)
        latencies.append(took)

    n = int(rate * seconds)
    t0 = time.monotonic() + 0.5
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(create, [t0 + i / rate for i in range(n)]))
    if errors:
        raise SystemExit(f"{len(errors)} pod creations failed: {errors[:5]}")
    return latencies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50, help="pods per second (default 50)")
    ap.add_argument("--seconds", type=float, default=20, help="seconds per run (default 20)")
    args = ap.parse_args()
    conftest.BINARY = ROOT / "target" / "release" / "ephemeral-volume-injector"
    if not conftest.BINARY.exists():
        raise SystemExit("build the webhook first: cargo build --release")

    with ControlPlane() as cp:
        cluster = Cluster(cp)
        results = {}
        for mode in ("without webhook", "with webhook", "without webhook, again"):
            ns = cluster.namespace("bench-" + "-".join(mode.replace(",", "").split()))
            release = None
            if mode == "with webhook":
                release = Release(cluster, "evi", {"config": {}}, cp.dir / "release").install()
                release.start_webhook()
                probe = dict(POD, metadata={**POD["metadata"], "namespace": ns})
                conftest.wait_for("the webhook to mutate",
                                  lambda probe=probe: "volumes" in cluster.create_pod(probe)["spec"]
                                  and any(v["name"] == "scratch" for v in cluster.create_pod(probe)["spec"]["volumes"]))
            run(cp, ns, args.rate, min(3.0, args.seconds))  # warm-up: connections, caches
            before = webhook_histogram(cp)
            lat = run(cp, ns, args.rate, args.seconds)
            after = webhook_histogram(cp)
            results[mode] = (lat, before, after)
            if release:
                release.uninstall()
                conftest.wait_for("the webhook configuration to be gone", lambda: cluster.kubectl(
                    "get", "mutatingwebhookconfigurations", "-o", "name").stdout.strip() == "")
        print(f"\n{int(args.rate * args.seconds)} pods per run at {args.rate:g}/s, open loop\n")
        print("| run | client p50 | client p99 | API server webhook p50 | webhook p99 |")
        print("|---|---|---|---|---|")
        for mode, (lat, before, after) in results.items():
            print(f"| {mode} | {statistics.median(lat):.1f} ms | {quantile(lat, 0.99):.1f} ms | "
                  f"{bucket_quantile(before, after, 0.5)} | {bucket_quantile(before, after, 0.99)} |")
        base = [x for m in ("without webhook", "without webhook, again") for x in results[m][0]]
        with_ = results["with webhook"][0]
        print(f"\nadded by the webhook: p50 {statistics.median(with_) - statistics.median(base):+.1f} ms, "
              f"p99 {quantile(with_, 0.99) - quantile(base, 0.99):+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
