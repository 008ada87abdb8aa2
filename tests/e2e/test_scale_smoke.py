"""A small run of the scale benchmark (benches/scale.py), so that it keeps working: KWOK's fake
nodes, kube-scheduler and the job controller, Nextflow-shaped Jobs created by concurrent clients
without and with the webhook (1 replica, then 2 behind the round-robin balancer). It asserts
what the benchmark made, never a time: every Job admitted, every pod of the webhook's runs with
its three volumes and its PVC bound by KWOK's volume stage, none in the run without it, and the
reviews counted by the replicas."""

from __future__ import annotations

import json
import subprocess
import sys

from controlplane import ROOT
from registry import release_tools

import conftest


def test_the_scale_benchmark_runs_and_every_pod_gets_its_volumes(tmp_path):
    release_tools("kwok")
    out = tmp_path / "scale.json"
    jobs = 24
    run = subprocess.run(
        [sys.executable, str(ROOT / "benches" / "scale.py"), "--nodes", "30", "--jobs", str(jobs),
         "--clients", "6", "--replicas", "1,2", "--timeout", "120", "--settle", "120", "--binary", str(conftest.BINARY),
         "--json", str(out), "--dir", str(tmp_path / "cluster")],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"benches/scale.py failed:\n{run.stderr[-6000:]}\n{run.stdout[-2000:]}"
    results = json.loads(out.read_text())["results"]
    assert [r["run"] for r in results] == ["without the webhook", "webhook, 1 replica", "webhook, 2 replicas",
                                           "policies instead of the webhook"]
    for r in results:
        assert r["jobs_refused"] == 0, r["refusals"]
        assert r["pods"] == jobs, r
        assert r["all_running_s"] is not None, f"{r['run']}: not every pod ran on a KWOK node"
    without, *with_webhook, policies = results
    assert without["pods_with_volumes"] == 0 and without["pvcs_bound"] == 0
    assert without["apiserver"] == {}, "no webhook was called in the run without it"
    for r in with_webhook:
        assert r["pods_with_volumes"] == jobs, r
        assert r["pvcs_bound"] == jobs, r
        assert set(r["apiserver"]) == {"volumes.ephemeral-volumes.io", "workloads.ephemeral-volumes.io"}
        # Each Job was reviewed (at /validate) and each of its pods (at /mutate), by some replica.
        assert sum(x["reviews"] for x in r["replicas"]) == 2 * jobs, r["replicas"]
    # The admission policies the same configuration compiles to, without the webhook: every pod
    # served by the API server's own plugins.
    assert policies["pods_with_volumes"] == jobs and policies["pvcs_bound"] == jobs, policies
    assert policies["replicas"] == [] and "MutatingAdmissionPolicy" in policies["apiserver"], policies
    assert "| policies instead of the webhook | 6 |" in run.stdout
    # The table the README's figures come from.
    assert "| webhook, 2 replicas | 6 |" in run.stdout
