"""The release artifacts `make release` builds: the static binaries for linux/amd64 and
linux/arm64, the image index (OCI layout) and the SBOM.

The arm64 binary runs under qemu-user (Debian's qemu-user-static) on every golden case, as
`mutate` and `check-config`, and must print byte for byte what the amd64 binary prints, with the
same exit code; the amd64 binary's admitted objects must also be the golden outputs.

Run from the repository root after `make images sbom`: python3 -m pytest -q tests/release
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "release"))
import pgo  # noqa: E402  (release/pgo.py: the toolchain's llvm-profdata, found as the build finds it)

CONTEXT = ROOT / "target" / "release-context" / "linux"
OCI = ROOT / "target" / "oci"
SBOM = ROOT / "target" / "sbom" / "ephemeral-volume-injector.cdx.json"
GOLDEN = sorted(p for p in (ROOT / "tests" / "golden").iterdir() if p.is_dir())
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
# ELF e_machine values.
MACHINE = {"amd64": 62, "arm64": 183}


def binary(arch: str) -> Path:
    path = CONTEXT / arch / "ephemeral-volume-injector"
    assert path.is_file(), f"{path} is missing: make release-binaries builds it"
    return path


def run(arch: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(binary(arch)), *args]
    if arch == "arm64":
        assert QEMU, "qemu-aarch64-static is missing (Debian: qemu-user-static; make tools installs it)"
        cmd = [QEMU, *cmd]
    return subprocess.run(cmd, capture_output=True, cwd=ROOT, timeout=120)


def elf(data: bytes) -> tuple[int, bool]:
    """The ELF file's machine, and whether it names a program interpreter (dynamic linking)."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit little-endian ELF file"
    machine = int.from_bytes(data[18:20], "little")
    phoff = int.from_bytes(data[32:40], "little")
    phentsize, phnum = int.from_bytes(data[54:56], "little"), int.from_bytes(data[56:58], "little")
    types = [int.from_bytes(data[phoff + i * phentsize:phoff + i * phentsize + 4], "little") for i in range(phnum)]
    return machine, 3 in types  # PT_INTERP


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_each_binary_is_static_for_its_platform_and_reports_the_version(arch):
    machine, dynamic = elf(binary(arch).read_bytes())
    assert machine == MACHINE[arch]
    assert not dynamic, "the binary names a program interpreter: it is not static"
    p = run(arch, "--version")
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(rf"ephemeral-volume-injector {re.escape(VERSION)} \(commit ([0-9a-f]{{12}}|unknown)\)\n",
                        p.stdout.decode()), p.stdout


def golden_commands(case: Path) -> list[list[str]]:
    (source,) = [p for p in (case / "input.yaml", case / "input.json") if p.exists()]
    config = case / "config.yaml" if (case / "config.yaml").exists() else ROOT / "tests" / "data" / "config.yaml"
    base = ["mutate", "-f", str(source), "--config", str(config)]
    if (case / "cluster.yaml").exists():
        base += ["--cluster", str(case / "cluster.yaml")]
    return [base + ["-o", "json"], base + ["-o", "patch"], base + ["-o", "yaml"], ["check-config", str(config)]]


@pytest.mark.parametrize("case", GOLDEN, ids=[c.name for c in GOLDEN])
def test_arm64_under_qemu_answers_every_golden_case_as_amd64_does(case):
    for cmd in golden_commands(case):
        amd, arm = run("amd64", *cmd), run("arm64", *cmd)
        assert (arm.returncode, arm.stdout, arm.stderr) == (amd.returncode, amd.stdout, amd.stderr), cmd
        assert amd.returncode in (0, 1), amd.stderr.decode()
    out = case / "output.json"
    if out.exists():
        amd = run("amd64", *golden_commands(case)[0])
        assert json.loads(amd.stdout) == json.loads(out.read_text())


def blob(digest: str) -> bytes:
    return (OCI / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


def test_the_image_index_holds_one_image_per_platform_with_its_own_binary():
    # index.json is the index itself: what `crane push --index` sends, with the same digest.
    index = json.loads((OCI / "index.json").read_text())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert index["annotations"]["org.opencontainers.image.version"] == VERSION
    assert len(index["manifests"]) == 2
    platforms = {}
    for m in index["manifests"]:
        manifest = json.loads(blob(m["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        arch = m["platform"]["architecture"]
        assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert (m["platform"]["os"], config["os"], config["architecture"]) == ("linux", "linux", arch)
        assert config["config"]["User"] == "65532:65532"
        assert config["config"]["Entrypoint"] == ["/ephemeral-volume-injector"]
        assert config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
        (layer,) = manifest["layers"]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as tar:
            data = tar.extractfile("ephemeral-volume-injector").read()
        assert data == binary(arch).read_bytes(), f"the {arch} image does not hold the {arch} binary"
        platforms[arch] = elf(data)[0]
    assert platforms == MACHINE


def test_the_sbom_lists_the_binarys_dependencies_from_cargo_lock():
    sbom = json.loads(SBOM.read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["name"] == "ephemeral-volume-injector"
    assert sbom["metadata"]["component"]["version"] == VERSION
    lock = (ROOT / "Cargo.lock").read_text()
    locked = dict(re.findall(r'\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"', lock))
    components = {c["name"]: c["version"] for c in sbom["components"]}
    # Runtime dependencies, with the versions Cargo.lock holds; dev-dependencies are not shipped.
    for name in ("rustls", "kube-client", "axum", "ring", "serde_json", "mimalloc"):
        assert components.get(name) == locked[name], name
    for name in ("proptest", "criterion", "tempfile", "libtest-mimic"):
        assert name not in components, f"{name} is a dev-dependency, not part of the binary"
    purls = [c.get("purl", "") for c in sbom["components"]]
    assert all(p.startswith("pkg:cargo/") for p in purls), [p for p in purls if not p.startswith("pkg:cargo/")][:3]


PROFILE = ROOT / "target" / "pgo" / "evi.profdata"


# The request path's entry and the engine's decision, as their symbols are mangled (functions
# that CI's opt-level 1 does not inline into their callers before instrumenting either).
@pytest.mark.parametrize("function", ["3evi6review6handle", "3evi6engine16decide_for_scope"])
def test_the_profile_the_binaries_are_optimised_with_ran_the_request_path(function):
    """release/pgo.py's training reached the engine: the optimised build's profile counts each
    golden case's review in the functions every review passes through. A training that only
    failed (no TLS, a configuration refused) would optimise for the wrong paths."""
    if os.environ.get("EVI_PGO") == "off":
        pytest.skip("EVI_PGO=off: the binaries were built without a profile")
    assert PROFILE.is_file(), f"{PROFILE} is missing: make release-binaries writes it (release/pgo.py)"
    out = subprocess.run([str(pgo.llvm_profdata()), "show", "--counts", f"--function={function}", str(PROFILE)],
                         capture_output=True, text=True, check=True).stdout
    counts = [int(n) for line in out.splitlines() if "Block counts:" in line
              for n in re.findall(r"\d+", line.split(":", 1)[1])]
    assert counts, f"no function matching {function} in the profile:\n{out[:2000]}"
    # Every golden case is sent many times (release/pgo.py --rounds); each passes through both.
    assert max(counts) >= 10 * len(GOLDEN), out[:2000]
