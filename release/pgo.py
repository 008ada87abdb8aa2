#!/usr/bin/env python3
"""The profile a release build is optimised with (profile-guided optimisation, PGO).

An instrumented build of the webhook for this machine serves a training set on loopback, as
the chart runs it (TLS, JSON logs at info; the test configuration, then the built-in
defaults): the reviews of every golden
case (tests/golden: Nextflow's Job-mode and Pod-mode pods, pods that ask for nothing, refusals,
conflicts, and the workloads at /validate), over HTTP/2 as the API server sends them and over
HTTP/1.1 keep-alive, plus the admin endpoints a kubelet and Prometheus call. The webhook then
stops on SIGTERM (the profile is written at exit) and the counts are merged into one profile:

  python3 release/pgo.py --out target/pgo/evi.profdata [--rounds 200] [--binary INSTRUMENTED]

With --baseline it trains the load benchmark's bare TLS server (benches/tls_baseline.rs) on the
same requests instead, so that the benchmark can compare the webhook with a baseline optimised
the same way (benches/README.md; the release uses no such profile).

A release build then reads it: RUSTFLAGS="-Cprofile-use=$PWD/target/pgo/evi.profdata"
(`make release-binaries` does; so does the Dockerfile). The profile is measured on code paths,
not on the benchmarks' review (tests/data/review.json is not in the training set), and changes
no behaviour: tests/release checks the optimised binaries against every golden output.

Without --binary the instrumented build is made here (cargo, the release profile, this
machine's target, CARGO_TARGET_DIR=target/pgo/build). llvm-profdata is the Rust toolchain's
(the `llvm-tools` component, listed in rust-toolchain.toml). Needs curl (HTTP/2) and PyYAML.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
CONFIG = ROOT / "tests" / "data" / "config.yaml"
BIN = "ephemeral-volume-injector"
BASELINE = "tls-baseline"
# The cases whose pods the training must see mutated (Nextflow's two ways of asking).
MUST_PATCH = {"nextflow-job-mode", "nextflow-pod-mode"}


class TrainingError(Exception):
    """A step of the training failed; the message says which and why."""


def llvm_profdata() -> Path:
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    host = subprocess.run(["rustc", "--print", "host-tuple"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    tool = Path(sysroot) / "lib" / "rustlib" / host / "bin" / "llvm-profdata"
    if not tool.exists():
        raise TrainingError(f"{tool} is missing: install the toolchain's llvm-tools component "
                            "(rustup component add llvm-tools; rust-toolchain.toml lists it)")
    return tool


def instrumented_build(baseline: bool) -> Path:
    target_dir = ROOT / "target" / "pgo" / ("baseline" if baseline else "build")
    # A fixed path, so that cargo reuses the build (the profile's file is set at run time).
    env = dict(os.environ, CARGO_TARGET_DIR=str(target_dir),
               RUSTFLAGS=f"-Cprofile-generate={target_dir / 'raw'}")
    what = ["--bin", BASELINE if baseline else BIN]
    cmd = ["cargo", "build", "--release", "--locked", *what]
    print("pgo: the instrumented build:", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        raise TrainingError("the instrumented build failed (above)")
    return target_dir / "release" / (BASELINE if baseline else BIN)


def review(obj: dict) -> tuple[str, bytes]:
    """The AdmissionReview the API server sends for a CREATE of `obj`, and its endpoint."""
    kind = obj.get("kind", "Pod")
    api_version = obj.get("apiVersion", "v1")
    group, _, version = api_version.rpartition("/")
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "namespace": obj.get("metadata", {}).get("namespace", "nf"),
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:nf:nextflow",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
    endpoint = "/mutate" if kind == "Pod" else "/validate"
    return endpoint, json.dumps(body, separators=(",", ":")).encode()


def training_set() -> list[tuple[str, str, bytes]]:
    """(case, endpoint, body) for every golden case's input."""
    try:
        import yaml
    except ImportError as e:
        raise TrainingError("PyYAML is needed to read the golden YAML inputs (pip install pyyaml)") from e
    cases = []
    for case in sorted(p for p in GOLDEN.iterdir() if p.is_dir()):
        inputs = [p for p in (case / "input.json", case / "input.yaml") if p.exists()]
        if len(inputs) != 1:
            raise TrainingError(f"{case}: expected one input.json or input.yaml, found {len(inputs)}")
        text = inputs[0].read_text()
        obj = json.loads(text) if inputs[0].suffix == ".json" else yaml.safe_load(text)
        if not isinstance(obj, dict):
            raise TrainingError(f"{inputs[0]}: not an object")
        endpoint, body = review(obj)
        cases.append((case.name, endpoint, body))
    if not cases:
        raise TrainingError(f"no golden cases under {GOLDEN}")
    return cases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrainingError(f"the instrumented server exited with {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TrainingError(f"the instrumented server did not listen on {port} within its deadline")


def train(binary: Path, work: Path, rounds: int, baseline: bool, config: Path | None) -> None:
    """Serves the training set `rounds` times, with `config` (None: the built-in defaults)."""
    cases = training_set()
    port, admin = free_port(), free_port()
    # The flags below only: no EVI_* setting of the caller's, and no cluster even when the build
    # runs in a pod (the in-cluster service account would turn the cluster checks on).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVI_", "KUBERNETES_SERVICE_"))}
    env.update(LLVM_PROFILE_FILE=str(work / "raw" / "evi-%p-%m.profraw"),
               MIMALLOC_ARENA_EAGER_COMMIT="0")
    log = (work / "webhook.log").open("wb")
    # The bare server answers every request with one constant response: no admin endpoints.
    cmd = [str(binary), f"127.0.0.1:{port}", str(work / "ca.crt")] if baseline else [
        str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
        "--ca-out", str(work / "ca.crt"), *(["--config", str(config)] if config else []),
        "--log-format", "json", "--log-level", "info"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port, time.monotonic() + 30)
        ctx = ssl.create_default_context(cafile=str(work / "ca.crt"))
        answered = 0
        patched: set[str] = set()
        # HTTP/1.1 keep-alive (what the load benchmark sends), and a new connection now and then.
        for r in range(rounds):
            conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
            for case, endpoint, body in cases:
                conn.request("POST", endpoint, body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200 or b'"response"' not in data:
                    raise TrainingError(f"{case}: {endpoint} answered {resp.status}: {data[:300]!r}")
                if b'"patch"' in data:
                    patched.add(case)
                answered += 1
            conn.close()
            if r % 20 == 0 and not baseline:
                for path in ("/readyz", "/healthz", "/metrics"):
                    c = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
                    c.request("GET", path)
                    c.getresponse().read()
                    c.close()
        # A profile of refusals only would optimise the wrong paths: both Nextflow modes must
        # have been mutated.
        missing = set() if baseline or config is None else MUST_PATCH - patched
        if missing:
            raise TrainingError(f"no patch for {', '.join(sorted(missing))}: the training did not "
                                "reach the mutation path; the webhook's log ends: "
                                f"{(work / 'webhook.log').read_text()[-2000:]}")
        # HTTP/2, several streams at once on one connection: how the API server calls.
        files = []
        for case, endpoint, body in cases:
            f = work / f"{case}.json"
            f.write_bytes(body)
            files.append((endpoint, f))
        groups = []
        for _ in range(max(1, rounds // 4)):
            for endpoint, f in files:
                groups.append(["--silent", "--show-error", "--fail", "--http2", "--cacert",
                               str(work / "ca.crt"), "-o", "/dev/null", "-H",
                               "Content-Type: application/json", "--data-binary", f"@{f}",
                               f"https://localhost:{port}{endpoint}"])
        args = ["curl", "--parallel", "--parallel-max", "16"] + groups[0]
        for g in groups[1:]:
            args += ["--next", *g]
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            raise TrainingError(f"curl over HTTP/2 failed ({p.returncode}): {p.stderr.strip()}")
        answered += len(files) * max(1, rounds // 4)
        print(f"pgo: {answered} reviews answered ({len(cases)} golden cases)", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise TrainingError("the instrumented server did not stop within 60 s of SIGTERM") from None
        log.close()
    if code != 0:
        raise TrainingError(f"the instrumented server exited with {code}: "
                            f"{(work / 'webhook.log').read_text()[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the merged profile (.profdata)")
    ap.add_argument("--rounds", type=int, default=200, help="times each golden review is sent")
    ap.add_argument("--binary", type=Path, help="an instrumented build to train (default: build one)")
    ap.add_argument("--baseline", action="store_true",
                    help="train the load benchmark's bare TLS server instead of the webhook")
    args = ap.parse_args()
    if shutil.which("curl") is None:
        print("pgo: curl is needed (HTTP/2 training)", file=sys.stderr)
        return 2
    try:
        profdata = llvm_profdata()
        with tempfile.TemporaryDirectory(prefix="evi-pgo-") as tmp:
            work = Path(tmp)
            (work / "raw").mkdir()
            binary = args.binary or instrumented_build(args.baseline)
            # The test configuration, then the built-in defaults (no profiles, inline volumes
            # allowed, no limits): a path only the defaults take would otherwise be cold code,
            # compiled for size, in every binary run without a configuration file.
            train(binary, work, args.rounds, args.baseline, CONFIG)
            if not args.baseline:
                train(binary, work, max(1, args.rounds // 2), args.baseline, None)
            raws = sorted((work / "raw").glob("*.profraw"))
            if not raws:
                raise TrainingError("the server wrote no profile: was it built with -Cprofile-generate?")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            # Not --sparse: the functions the training never ran stay in the profile with zero
            # counts, so LLVM optimises them for size as cold code (the binary 11.4 MB against
            # 12.3 MB without a profile; a sparse profile leaves them at opt-level 3: 14.2 MB).
            subprocess.run([str(profdata), "merge", "-o", str(args.out), *map(str, raws)], check=True)
        print(f"pgo: {args.out} ({args.out.stat().st_size} bytes)")
        return 0
    except TrainingError as e:
        print(f"pgo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
