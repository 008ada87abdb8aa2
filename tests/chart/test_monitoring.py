"""The chart's alerts and dashboard: opt-in, one source for the PrometheusRule and the plain rule
file, every rule unit-tested by promtool (firing and not), every expression parsed by promtool
and naming only metrics the running webhook (or the API server) really exposes, and a runbook
for each alert."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_chart import BINARY, ROOT, by_kind, render

MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
DASHBOARD = ROOT / "charts" / "ephemeral-volume-injector" / "files" / "dashboard.json"
RUNBOOKS = ROOT / "docs" / "alerts.md"
TOOLS = Path(os.environ.get("EVI_TOOLS_DIR") or Path.home() / ".cache/evi-tools")
PROMTOOL = shutil.which("promtool") or str(TOOLS / "release" / "bin" / "promtool")
# The dashboard's Grafana variables, as Grafana would substitute them.
GRAFANA = {"$__rate_interval": "5m", "$namespace": ".*", "$prefix": "ephemeral-volumes\\\\.io"}


def promtool(*args, cwd=None):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd)


def alert_rules():
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out = []
    for e in exprs:
        for var, value in GRAFANA.items():
            e = e.replace(var, value)
        out.append(e)
    return out


def test_alerts_and_dashboard_are_opt_in_and_the_plain_rule_file_is_the_charts():
    kinds = {d["kind"] for d in render()}
    assert "PrometheusRule" not in kinds and "GrafanaDashboard" not in kinds
    assert not [d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]

    docs = render("--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.labels.release=kps")
    rule = by_kind(docs, "PrometheusRule")[0]
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text()), (
        "monitoring/alerts.yaml is stale: python3 monitoring/render-alerts.py")

    docs = render("--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.grafanaOperator.enabled=true")
    cm = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")][0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["ephemeral-volume-injector.json"]) == json.loads(DASHBOARD.read_text())
    gd = by_kind(docs, "GrafanaDashboard")[0]
    assert gd["spec"]["configMapRef"] == {"name": cm["metadata"]["name"], "key": "ephemeral-volume-injector.json"}


def test_thresholds_and_the_annotation_prefix_reach_the_rules_and_the_dashboard():
    docs = render(
        "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true",
        "--set", "config.annotationPrefix=scratch.example.org",
        "--set-json", "metrics.prometheusRule.thresholds.latencyP99Seconds=0.05",
        "--set", "metrics.prometheusRule.thresholds.certificateExpirySeconds=86400",
        "--set", "metrics.prometheusRule.runbookUrl=https://runbooks.example/evi.md",
    )
    rules = {r["alert"]: r for g in by_kind(docs, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]}
    assert rules["EphemeralVolumeInjectorSlowAdmission"]["expr"].endswith("> 0.05")
    assert rules["EphemeralVolumeInjectorCertificateExpiring"]["expr"] == "evi_certificate_expiry_seconds < 86400"
    assert 'name=~".+\\\\.scratch\\\\.example\\\\.org"' in rules["EphemeralVolumeInjectorAdmissionErrors"]["expr"]
    for name, rule in rules.items():
        assert rule["annotations"]["runbook_url"] == f"https://runbooks.example/evi.md#{name.lower()}"
    cm = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")][0]
    dash = json.loads(cm["data"]["ephemeral-volume-injector.json"])
    prefix = [v for v in dash["templating"]["list"] if v["name"] == "prefix"][0]
    # A regex (dots escaped) inside a PromQL string: each backslash doubled.
    assert prefix["query"] == "scratch\\\\.example\\\\.org"


def test_the_rules_pass_promtool_check_and_their_unit_tests():
    check = promtool("check", "rules", str(ALERTS))
    assert check.returncode == 0, check.stdout + check.stderr
    test = promtool("test", "rules", "alerts.test.yaml", cwd=MONITORING)
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_alert_is_unit_tested_firing_and_not_firing():
    tests = yaml.safe_load((MONITORING / "alerts.test.yaml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it stays quiet"


def test_a_broken_rule_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: the refusal threshold raised above the burst they feed."""
    for f in ("alerts.yaml", "alerts.test.yaml"):
        shutil.copy(MONITORING / f, tmp_path / f)
    text = (tmp_path / "alerts.yaml").read_text()
    assert "increase(evi_denials_total[10m])) >= 10" in text
    (tmp_path / "alerts.yaml").write_text(text.replace("increase(evi_denials_total[10m])) >= 10",
                                                       "increase(evi_denials_total[10m])) >= 100"))
    test = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert test.returncode != 0 and "EphemeralVolumeInjectorPodRefusals" in test.stdout + test.stderr


def test_every_dashboard_expression_parses(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AUDITED = """\
rules:
  - name: tmp-for-all
    mode: audit
    volumes:
      tmp: "type=emptyDir,mountPath=/evi-audit-tmp,size=1Gi"
"""


@pytest.fixture(scope="module")
def live_metrics(tmp_path_factory):
    """The names the running webhook exposes: started as the README's first command does, with
    the cluster checks pointed at an API server that is not there (their watches start and
    fail) and an audited rule, after one review that the rule would have changed."""
    work = tmp_path_factory.mktemp("serve")
    (work / "config.yaml").write_text(AUDITED)
    (work / "kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "none", "user": {"token": "none"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}))
    admin, port = free_port(), free_port()
    proc = subprocess.Popen(
        [str(BINARY), "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--config", str(work / "config.yaml"), "--kubeconfig", str(work / "kubeconfig")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, TMPDIR=str(work)))
    try:
        def get(path):
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}{path}", timeout=2) as r:
                return r.read().decode()
        deadline = time.monotonic() + 30
        while True:
            try:
                get("/healthz")
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "the webhook did not start"
                time.sleep(0.2)
        review = json.loads((ROOT / "tests/data/review.json").read_text())
        ctx = ssl.create_default_context(cafile=str(work / f"ephemeral-volume-injector-{port}-ca.crt"))
        req = urllib.request.Request(f"https://localhost:{port}/mutate", data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            assert json.loads(r.read())["response"]["allowed"]
        text = get("/metrics")
    finally:
        proc.terminate()
        proc.wait(10)
    names = set()
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(kind, [""])
        names |= {family + s for s in suffixes}
    return names


# The API server's admission metrics, as k8s.io/apiserver declares them.
APISERVER = {"apiserver_admission_webhook_" + n for n in (
    "rejection_count", "fail_open_count", "request_total",
    "admission_duration_seconds_count", "admission_duration_seconds_bucket")}


def metric_names(expr):
    return set(re.findall(r"\b((?:evi|apiserver)_[a-z_]+)\b", expr))


def test_every_expression_names_only_metrics_that_exist(live_metrics):
    assert {"evi_ready", "evi_build_info", "evi_admission_requests_total"} <= live_metrics
    for expr in [r["expr"] for r in alert_rules()] + dashboard_exprs():
        names = metric_names(expr)
        assert names, expr
        unknown = {n for n in names if n.startswith("evi_")} - live_metrics
        assert not unknown, f"{expr}: the webhook exposes no {sorted(unknown)}"
        unknown = {n for n in names if n.startswith("apiserver_")} - APISERVER
        assert not unknown, f"{expr}: the API server exposes no {sorted(unknown)}"


def test_the_api_server_metrics_named_are_the_ones_it_declares():
    """APISERVER above, against the k8s.io/apiserver source the control plane is built from."""
    gomod = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    version = re.search(r"k8s.io/apiserver v(\S+)", (ROOT / "tests/controlplane/go.mod").read_text()).group(1)
    source = Path(gomod) / f"k8s.io/apiserver@v{version}" / "pkg/admission/metrics/metrics.go"
    if not source.exists():
        subprocess.run(["go", "mod", "download", f"k8s.io/apiserver@v{version}"], check=True,
                       cwd=ROOT / "tests/controlplane", capture_output=True)
    declared = set(re.findall(r'Name:\s+"(webhook_[a-z_]+)"', source.read_text()))
    for name in APISERVER:
        base = name.removeprefix("apiserver_admission_")
        base = re.sub(r"_(count|bucket)$", "", base) if "duration" in base else base
        assert base in declared, f"{name}: k8s.io/apiserver {version} declares {sorted(declared)}"


def test_every_alert_has_a_runbook():
    text = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for rule in alert_rules():
        body = sections.get(rule["alert"])
        assert body, f"docs/alerts.md has no section ## {rule['alert']}"
        for part in ("What you see", "Likely causes", "What to do"):
            assert f"**{part}**" in body, f"{rule['alert']}: no **{part}** in its runbook"


def test_render_alerts_without_helm_says_it_needs_helm(tmp_path):
    # A PATH with python3 but no helm: one line naming what is missing, not a traceback.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    done = subprocess.run([str(bin_dir / "python3"), str(MONITORING / "render-alerts.py"), "--check"],
                          env={**os.environ, "PATH": str(bin_dir)}, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "helm is needed" in done.stderr and "Traceback" not in done.stderr, done.stderr
