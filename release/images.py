#!/usr/bin/env python3
"""The webhook's image for linux/amd64 and linux/arm64, as one OCI image index on disk.

Each platform's image is built from the repository's Dockerfile (its `prebuilt` stage, from the
binaries `make release-binaries` laid out as `<context>/linux/<arch>/ephemeral-volume-injector`)
by `docker build --platform`; the runtime stage has no RUN step, so no emulator is needed. Docker
20.10 has no OCI exporter, so each image is read from `docker save` and written into an OCI
image layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md): gzip
layers, OCI media types, one index naming both platforms. `crane push --index` sends the layout
to a registry as one index (release/publish.sh).

  python3 release/images.py --context target/release-context --out target/oci --tag 0.1.0
      [--base scratch] [--private-dockerd DIR]

--private-dockerd starts Docker's daemon for this build only (root; what CI does), with no
network of its own; otherwise the daemon of DOCKER_HOST (or the default socket) builds.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ARCHES = ("amd64", "arm64")
ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Docker:
    """Docker's daemon started for one build and stopped after it (or the one already running)."""

    def __init__(self, private_dir: Path | None):
        self.dir = private_dir
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ, DOCKER_BUILDKIT="1")
        if private_dir:
            self.env["DOCKER_HOST"] = f"unix://{private_dir / 'docker.sock'}"
            self.env["PATH"] = PATH

    def __enter__(self) -> "Docker":
        if self.dir is None:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "dockerd.log", "ab")
        self.proc = subprocess.Popen([
            "dockerd", "--data-root", str(self.dir / "root"), "--exec-root", str(self.dir / "exec"),
            "--pidfile", str(self.dir / "docker.pid"), "--host", self.env["DOCKER_HOST"],
            # No network of its own, no iptables rules and no change to the host's forwarding
            # (dockerd turns net.ipv4.ip_forward on unless told not to): it only builds.
            "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
        ], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                tail = (self.dir / "dockerd.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"dockerd did not start:\n{tail}")
            time.sleep(0.3)
        return self

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
        p = subprocess.run([docker, *args], capture_output=True, text=True, env=self.env)
        if check and p.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        return p

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            # The daemon's images and build cache: the layout holds what was built.
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = None


class Layout:
    """An OCI image layout being written: content-addressed blobs, then index.json."""

    def __init__(self, out: Path):
        if out.exists():
            shutil.rmtree(out)
        (out / "blobs" / "sha256").mkdir(parents=True)
        (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        self.out = out

    def blob(self, data: bytes, media_type: str, **extra) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (self.out / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}

    def image(self, docker_save: bytes) -> dict:
        """One image from a `docker save` archive; returns its manifest's descriptor."""
        with tarfile.open(fileobj=io.BytesIO(docker_save)) as tar:
            (entry,) = json.loads(tar.extractfile("manifest.json").read())
            config = json.loads(tar.extractfile(entry["Config"]).read())
            layers = []
            for name in entry["Layers"]:
                raw = tar.extractfile(name).read()
                # mtime=0: the same layer compresses to the same bytes in every build.
                layers.append(self.blob(gzip.compress(raw, mtime=0), LAYER))
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": self.blob(json.dumps(config, separators=(",", ":")).encode(), CONFIG),
            "layers": layers,
        }
        platform = {"os": config["os"], "architecture": config["architecture"]}
        return self.blob(json.dumps(manifest, separators=(",", ":")).encode(), MANIFEST, platform=platform)

    def index(self, manifests: list[dict], tag: str) -> dict:
        """index.json is the image index itself (what `crane push --index` sends, byte for
        byte, so its digest is the index's); returns its descriptor."""
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests,
                 "annotations": {"org.opencontainers.image.version": tag}}
        data = json.dumps(index, separators=(",", ":")).encode()
        (self.out / "index.json").write_bytes(data)
        return self.blob(data, INDEX)


def build(context: Path, out: Path, tag: str, base: str, private: Path | None, commit: str) -> dict:
    for arch in ARCHES:
        binary = context / "linux" / arch / "ephemeral-volume-injector"
        if not binary.is_file():
            raise SystemExit(f"images: {binary} is missing (run `make release-binaries` first)")
    layout = Layout(out)
    manifests = []
    with Docker(private) as d:
        for arch in ARCHES:
            name = f"ephemeral-volume-injector:{tag}-{arch}"
            d.docker("build", "--platform", f"linux/{arch}", "--build-arg", "BINARY_FROM=prebuilt",
                     "--build-arg", f"RUNTIME_BASE={base}", "--build-arg", f"EVI_COMMIT={commit}",
                     "--label", f"org.opencontainers.image.version={tag}",
                     "--label", f"org.opencontainers.image.revision={commit}",
                     "-f", str(ROOT / "Dockerfile"), "-t", name, str(context))
            archive = out.parent / f"{out.name}-{arch}.tar"
            d.docker("save", "-o", str(archive), name)
            manifests.append(layout.image(archive.read_bytes()))
            archive.unlink()
    return layout.index(manifests, tag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--base", default="scratch", help="the runtime stage's base image (RUNTIME_BASE)")
    ap.add_argument("--private-dockerd", type=Path, help="start Docker's daemon in this directory")
    args = ap.parse_args()
    desc = build(args.context, args.out, args.tag, args.base, args.private_dockerd, args.commit)
    sizes = []
    index = json.loads((args.out / "index.json").read_bytes())
    for m in index["manifests"]:
        manifest = json.loads((args.out / "blobs" / "sha256" / m["digest"].split(":")[1]).read_bytes())
        size = sum(x["size"] for x in manifest["layers"]) + manifest["config"]["size"] + m["size"]
        sizes.append(f"{m['platform']['architecture']} {size / 1e6:.1f} MB compressed")
    print(f"{args.out}: index {desc['digest']} ({', '.join(sizes)})", file=sys.stderr)
    print(desc["digest"])


if __name__ == "__main__":
    main()
