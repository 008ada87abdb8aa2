"""The test run's own OCI registry (distribution/v3's `registry`, plain HTTP on the loopback of
the run's network namespace) and the release steps a maintainer runs against a real one
(release/publish.sh): the image index pushed with crane, the chart with `helm push`, both signed
with cosign and a key pair made for the run, the SBOM attached as a signed attestation.

No transparency log is reachable here: signing skips the upload (`--tlog-upload=false`) and
verifying skips the inclusion check (`--insecure-ignore-tlog`). docs/release.md says what a real
release adds (keyless signing through Fulcio and Rekor, or a key with a transparency log).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from controlplane import TOOLS_DIR, free_port, start_process, stop_process, wait_until_answers

RELEASE_BIN = TOOLS_DIR / "release" / "bin"
COSIGN_ENV = {"COSIGN_PASSWORD": "", "COSIGN_YES": "true", "COSIGN_EXPERIMENTAL": "0"}


def release_tools(*names: str) -> None:
    """Builds the release tools named if missing (tests/release/build-tools.sh), or waits while
    CI's background build makes them (.ci/go-tools.sh); cached."""
    subprocess.run(["bash", str(Path(__file__).resolve().parents[2] / "tests/release/build-tools.sh"), *names],
                   check=True, capture_output=True, text=True)


def tool(name: str) -> str:
    path = RELEASE_BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: tests/release/build-tools.sh (make tools) builds it")
    return str(path)


class Registry:
    def __init__(self, workdir: Path):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "Registry":
        config = self.dir / "config.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.host},
        }))
        self.proc = start_process([tool("registry"), "serve", str(config)], self.dir / "registry.log")
        wait_until_answers(self.proc, f"http://{self.host}/v2/", "the registry", self.log, timeout=20)
        return self

    def log(self) -> str:
        return (self.dir / "registry.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
            self.proc = None

    def run(self, name: str, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        p = subprocess.run([tool(name), *args], capture_output=True, text=True, timeout=180,
                           env=dict(os.environ, **(env or {})))
        if check and p.returncode != 0:
            raise AssertionError(f"{name} {' '.join(args)} failed ({p.returncode}):\n{p.stderr}{p.stdout}")
        return p

    def crane(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("crane", *args, "--insecure", check=check)

    def push_index(self, layout: Path, repo: str, tag: str) -> str:
        """Pushes an OCI layout's index; returns the index's digest as the registry reports it."""
        ref = f"{self.host}/{repo}:{tag}"
        self.crane("push", "--index", str(layout), ref)
        return self.crane("digest", ref).stdout.strip()

    def cosign(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("cosign", *args, check=check, env=COSIGN_ENV)


def helm_push(helm, chart_dir: Path, out: Path, registry: Registry) -> tuple[str, str]:
    """`helm package` + `helm push` to oci://<registry>/charts; returns (the chart's oci:// URL
    without version, its digest)."""
    out.mkdir(parents=True, exist_ok=True)
    helm("package", chart_dir, "-d", out)
    (tgz,) = out.glob("*.tgz")
    p = helm("push", tgz, f"oci://{registry.host}/charts", "--plain-http")
    digest = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", p.stdout + p.stderr)
    assert digest, p.stdout + p.stderr
    name = tgz.name.rsplit("-", 1)[0]
    return f"oci://{registry.host}/charts/{name}", digest.group(1)
