#!/usr/bin/env python3
"""What the webhook costs a pod that runs: pod creation to Running, with and without the
webhook, on the end-to-end tests' real node (kubelet, containerd), the chart installed from the
image built from the Dockerfile.

Every pod asks for a scratch emptyDir by annotation. With the webhook, it is injected (the API
server calls the webhook's pods through their Service); without it (the webhook configurations
deleted), the pod is created unchanged. Rounds alternate between the two, pods are created one
at a time, and each pod's time is measured by this client from the create request to the watch
event that shows it Running.

Run as root from the repository root, after `make images`:
    bash tests/e2e/in-netns.sh python3 benches/pod_startup.py [--pods 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from conftest import CHART, RELEASE_NS, Cluster, wait_for  # noqa: E402 - after the sys.path insert above
from controlplane import ControlPlane  # noqa: E402 - after the sys.path insert above
from node import BUSYBOX_IMAGE, TAINT, Node  # noqa: E402 - after the sys.path insert above
from registry import Registry  # noqa: E402 - after the sys.path insert above

NS = "startup"
RELEASE = "evi-bench"
FULL = f"{RELEASE}-ephemeral-volume-injector"


class Watch(threading.Thread):
    """Records when each pod of the namespace is first seen Running."""

    def __init__(self, cp: ControlPlane):
        super().__init__(daemon=True)
        self.cp, self.running, self.stop = cp, {}, threading.Event()

    def run(self):
        ctx = self.cp.ssl_context()
        url = f"{self.cp.url}/api/v1/namespaces/{NS}/pods?watch=1&allowWatchBookmarks=false"
        with urllib.request.urlopen(url, context=ctx, timeout=3600) as r:
            for line in r:
                if self.stop.is_set():
                    return
                event = json.loads(line)
                pod = event["object"]
                name = pod["metadata"]["name"]
                if pod.get("status", {}).get("phase") == "Running" and name not in self.running:
                    self.running[name] = time.monotonic()


def create(cp: ControlPlane, ctx: ssl.SSLContext, name: str) -> float:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS,
           "annotations": {"ephemeral-volumes.io/scratch": "type=emptyDir,mountPath=/scratch,size=16Mi"}},
           "spec": {"tolerations": [TAINT], "terminationGracePeriodSeconds": 0, "containers": [{
               "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
               "command": ["/bin/sleep", "3600"]}]}}
    req = urllib.request.Request(f"{cp.url}/api/v1/namespaces/{NS}/pods", data=json.dumps(pod).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    start = time.monotonic()
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        r.read()
    return start


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=40, help="pods per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each mode, alternated")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evi-startup-"))
    cp = ControlPlane(work / "cp", node_ip=__import__("os").environ.get("EVI_NODE_IP")).start()
    node = Node(cp, work / "node")
    registry = Registry(work / "registry")
    try:
        node.start()
        # The image index of `make images`, pulled by the node from a registry of the run's own.
        registry.start()
        node.use_registry(registry.host)
        digest = registry.push_index(ROOT / "target" / "oci", "ephemeral-volume-injector", "bench")
        cluster = Cluster(cp)
        repo = f"{registry.host}/ephemeral-volume-injector"
        cluster.helm("install", RELEASE, CHART, "-n", RELEASE_NS, "--create-namespace", "--wait", "--timeout", "110s",
                     "--set", f"image.repository={repo}", "--set", f"image.digest={digest}",
                     "--set-json", f"tolerations=[{json.dumps(TAINT)}]")
        configs = {kind: cluster.get(kind, FULL) for kind in ("mutatingwebhookconfiguration",
                                                               "validatingwebhookconfiguration")}
        for c in configs.values():
            for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
                c["metadata"].pop(k, None)
        cluster.namespace(NS)
        watch = Watch(cp)
        watch.start()
        ctx = cp.ssl_context()
        results: dict[str, list[float]] = {"with the webhook": [], "without": []}
        n = 0
        for round_ in range(args.rounds):
            for mode in ("with the webhook", "without"):
                present = cluster.kubectl("get", "mutatingwebhookconfiguration", FULL, check=False).returncode == 0
                if mode == "without" and present:
                    for kind in configs:
                        cluster.kubectl("delete", kind, FULL)
                elif mode != "without" and not present:
                    for c in configs.values():
                        cluster.create(c)
                time.sleep(2)  # the API server's webhook configuration informer
                names = []
                for _ in range(args.pods):
                    n += 1
                    name = f"p{n}"
                    started = create(cp, ctx, name)
                    wait_for(f"{name} Running", lambda name=name: watch.running.get(name), timeout=60, interval=0.005)
                    results[mode].append(watch.running[name] - started)
                    names.append(name)
                injected = cluster.get("pod", names[-1], "-n", NS)["spec"].get("volumes", [])
                assert any(v["name"] == "scratch" for v in injected) == (mode != "without"), mode
                cluster.kubectl("delete", "pods", "--all", "-n", NS, "--wait=false")
                print(f"round {round_ + 1}, {mode}: p50 {statistics.median(results[mode][-args.pods:]) * 1e3:.0f} ms",
                      file=sys.stderr)
        print("\n| run | pods | p50 | p99 |\n|---|---|---|---|")
        for mode, values in results.items():
            print(f"| {mode} | {len(values)} | {percentile(values, 50) * 1e3:.0f} ms | {percentile(values, 99) * 1e3:.0f} ms |")
        return 0
    finally:
        node.stop(check=False)
        registry.stop()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
