"""Peak memory under the largest reviews the API server can send: a pod that asks for a volume,
grown with environment values to just under the API server's request body limit (3 MiB), posted
by N senders at once (each a new TLS connection), for N in 1, 4, 16, 32, 64. Prints the
webhook's peak RSS (VmHWM) after each step: what the chart's memory limit is set from.

    python3 benches/largest_reviews.py            # builds the release binary first
    python3 benches/largest_reviews.py --binary target/x86_64-unknown-linux-musl/release/ephemeral-volume-injector
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_SERVER_BODY_LIMIT = 3 * 1024 * 1024


def largest_review(shape: str = "env") -> bytes:
    """`env`: one container with long environment values (what a real large pod looks like);
    `containers`: the most minimal containers that fit (the view's worst bytes-to-memory
    ratio: benches/README.md, "Worst-case inputs")."""
    room = API_SERVER_BODY_LIMIT - 64 * 1024
    if shape == "containers":
        containers = [{"name": f"c{i}"} for i in range(room // 16)]
    else:
        value = "x" * 4000
        env = [{"name": f"V{i}", "value": value} for i in range(room // 4030)]
        containers = [{"name": "main", "image": "busybox", "env": env}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "nf-", "namespace": "default",
                        "annotations": {"ephemeral-volumes.io/scratch": "type=emptyDir,mountPath=/scratch,size=1Gi"}},
           "spec": {"containers": containers}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "default", "object": pod}}).encode()


def post(port: int, body: bytes, ctx: ssl.SSLContext, out: list) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s, \
                ctx.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            data = b""
            while chunk := t.recv(65536):
                data += chunk
        out.append(data.split(b" ", 2)[1].decode())
    except OSError as e:
        out.append(type(e).__name__)


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target/release/ephemeral-volume-injector")
    ap.add_argument("--senders", default="1,4,16,32,64")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of N at once, per step")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="a flag for `serve` (repeatable), e.g. --serve-arg=--max-inflight-body-bytes=8388608")
    ap.add_argument("--shape", choices=["env", "containers"], default="env",
                    help="what fills the review (largest_review's docstring)")
    args = ap.parse_args()
    if args.binary == ROOT / "target/release/ephemeral-volume-injector":
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "ephemeral-volume-injector"], cwd=ROOT,
                       check=True)
    work = Path(tempfile.mkdtemp(prefix="evi-largest-"))
    port, admin = 18443, 18080
    env = dict(os.environ, TMPDIR=str(work))
    proc = subprocess.Popen([str(args.binary), "serve", "--listen", f"127.0.0.1:{port}",
                             "--admin-listen", f"127.0.0.1:{admin}", *args.serve_arg], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(work / "webhook.log", "wb"))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        ctx = ssl.create_default_context(cafile=str(work / f"ephemeral-volume-injector-{port}-ca.crt"))
        body = largest_review(args.shape)
        print(f"review {len(body) / 2**20:.2f} MiB; idle peak RSS {peak_kib(proc.pid) / 1024:.1f} MiB")
        print("| senders at once | answers | peak RSS |\n|---|---|---|")
        for n in map(int, args.senders.split(",")):
            out: list = []
            for _ in range(args.rounds):
                threads = [threading.Thread(target=post, args=(port, body, ctx, out)) for _ in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            counts = {k: out.count(k) for k in sorted(set(out))}
            print(f"| {n} | {counts} | {peak_kib(proc.pid) / 1024:.1f} MiB |", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
