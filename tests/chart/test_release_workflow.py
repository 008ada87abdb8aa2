"""The release workflow's split by privilege (docs/release.md, "The release workflow"), held as
the file says it: the job that builds can neither publish nor sign, the job that publishes runs
no build of the project, only the GitHub-release job may write to the repository, and nothing
restores a cache or keeps a token in the checkout. zizmor (make lint) and actionlint (make
chart) check the rest."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github/workflows/release.yml").read_text())
JOBS = WORKFLOW["jobs"]


def runs(job: str) -> str:
    return "\n".join(step.get("run", "") for step in JOBS[job]["steps"])


def uses(job: str) -> list[str]:
    return [step["uses"] for step in JOBS[job]["steps"] if "uses" in step]


def test_no_permission_by_default_and_each_job_only_its_own():
    assert WORKFLOW["permissions"] == {}
    assert JOBS["build"]["permissions"] == {"contents": "read"}
    assert JOBS["publish"]["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    assert JOBS["github-release"]["permissions"] == {"contents": "write"}


def test_the_build_runs_the_build_and_the_publish_job_only_what_was_built():
    assert "make release" in runs("build")
    assert "make advisories" in runs("build")
    assert JOBS["publish"]["needs"] == "build" and JOBS["github-release"]["needs"] == "publish"
    for job in ("publish", "github-release"):
        assert "make" not in runs(job).replace("make release", "") and "cargo" not in runs(job), job
    assert "release/publish.sh" in runs("publish")


def test_every_action_is_pinned_by_commit_and_no_cache_is_restored_or_token_kept():
    for job in JOBS:
        for ref in uses(job):
            name, _, sha = ref.partition("@")
            assert len(sha) == 40 and all(c in "0123456789abcdef" for c in sha), f"{job}: {ref}"
            assert not name.startswith("actions/cache"), f"{job}: {ref}"
        for step in JOBS[job]["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, job
    text = (ROOT / ".github/workflows/release.yml").read_text()
    for line in text.splitlines():
        if line.strip().startswith("- uses:") or line.strip().startswith("uses:"):
            assert "# v" in line, f"no version in a comment: {line.strip()}"
