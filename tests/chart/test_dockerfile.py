"""The Dockerfile's from-source build stage, as far as this machine can check it (no base image
can be pulled here): the build context .dockerignore leaves, with what the stage COPYs of it,
must be a crate Cargo can read — every target Cargo.toml names is there."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ignored(path: str, rules: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = path.split("/")
    out = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            out = not negate
    return out


def build_stage_copies() -> list[tuple[list[str], str]]:
    """The build stage's `COPY <sources…> <dest>` lines (the stage before the next FROM)."""
    copies, in_build = [], False
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            in_build = " AS build" in line
        elif in_build and line.startswith("COPY "):
            *sources, dest = line.split()[1:]
            copies.append((sources, dest))
    return copies


def test_the_build_stage_gets_a_crate_cargo_can_read(tmp_path):
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    context = tmp_path / "src"
    context.mkdir()
    for sources, dest in build_stage_copies():
        for source in sources:
            for path in [ROOT / source] if (ROOT / source).is_file() else sorted((ROOT / source).rglob("*")):
                rel = path.relative_to(ROOT).as_posix()
                if path.is_dir() or ignored(rel, rules):
                    continue
                # `COPY a b c ./` keeps each file's name; `COPY dir ./dir` its tree.
                target = context / (Path(dest) / path.name if len(sources) > 1 else
                                    Path(dest) / path.relative_to(ROOT / source) if (ROOT / source).is_dir()
                                    else Path(dest))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
    # A build of a binary that does not exist: Cargo reads the whole manifest and every target
    # it names first (where a missing one stops it), then stops at once, compiling nothing.
    p = subprocess.run(["cargo", "build", "--offline", "--bin", "no-such-binary"], cwd=context,
                       capture_output=True, text=True, env=dict(os.environ, CARGO_TARGET_DIR=str(tmp_path / "t")))
    assert "no bin target named `no-such-binary`" in p.stderr, p.stderr
    # And what the build stage trains its profile on is there, and the hashes it installs by.
    assert (context / "release/pgo.py").is_file() and (context / "tests/golden").is_dir()
    assert "--hash=sha256:" in (context / ".ci/requirements/build-stage.txt").read_text()


def test_the_build_stage_installs_the_versions_ci_installs_by_the_same_hashes():
    def entries(path: Path) -> dict[str, set[str]]:
        out, name = {}, None
        for line in path.read_text().splitlines():
            if "==" in line and not line.startswith((" ", "#")):
                name = line.split(" ")[0].lower()
                out[name] = set()
            elif line.strip().startswith("--hash=") and name:
                out[name].add(line.strip().rstrip(" \\"))
        return out
    stage = entries(ROOT / ".ci/requirements/build-stage.txt")
    tools = entries(ROOT / ".ci/requirements/tools.txt")
    assert set(stage) == {"ziglang==0.17.0", "cargo-zigbuild==0.24.0", "pyyaml==6.0.3"}
    for name, hashes in stage.items():
        assert hashes and hashes == tools[name], name


def test_the_dockerignore_rule_is_dockers():
    rules = ["tests", "!tests/golden", "!tests/golden.rs", "*.md"]
    assert ignored("tests/server.rs", rules)
    assert not ignored("tests/golden.rs", rules)
    assert not ignored("tests/golden/case/input.json", rules)
    assert ignored("README.md", rules)


def test_every_base_image_is_pinned_by_digest():
    """Each image a build pulls names its bytes (`@sha256:`), the tag it was taken from in a
    comment: a FROM of a registry image, and the RUNTIME_BASE a release builds on. A FROM of a
    stage or of an ARG is not an image."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    stages = {line.split()[-1] for line in lines if line.startswith("FROM ") and " AS " in line}
    pulled = []
    for i, line in enumerate(lines):
        if line.startswith("ARG RUNTIME_BASE="):
            pulled.append((i, line.split("=", 1)[1]))
        elif line.startswith("FROM "):
            image = [w for w in line.split()[1:] if not w.startswith("--")][0]
            if image not in stages and not image.startswith("$") and image != "scratch":
                pulled.append((i, image))
    assert len(pulled) == 2, pulled
    for i, image in pulled:
        assert "@sha256:" in image and len(image.split("@sha256:")[1]) == 64, f"line {i + 1}: {image}"
        assert lines[i - 1].startswith("# ") and ":" in lines[i - 1], f"line {i + 1}: no tag in a comment above"
