"""A real Prometheus (3.16, built by tests/release/build-tools.sh) for the end-to-end tests: it
scrapes targets the test names (file service discovery, rewritten as pods come and go, as
Kubernetes discovery would), evaluates a rule file, and answers through its HTTP API."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from controlplane import TOOLS_DIR, free_port, start_process, stop_process, wait_until_answers

PROMETHEUS = TOOLS_DIR / "release" / "bin" / "prometheus"


class Prometheus:
    def __init__(self, workdir: Path, rules: Path, interval: str = "1s", apiserver=None):
        """`apiserver`: the test control plane (controlplane.ControlPlane), scraped as a
        cluster's Prometheus scrapes kube-apiserver (its /metrics, with a client certificate),
        for the alerts on the API server's own webhook metrics."""
        if not PROMETHEUS.exists():
            raise RuntimeError(f"{PROMETHEUS} is missing: tests/release/build-tools.sh (make tools-go) builds it")
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        jobs = [{"job_name": "ephemeral-volume-injector",
                 "file_sd_configs": [{"files": [str(self.dir / "targets-*.json")], "refresh_interval": "1s"}]}]
        if apiserver is not None:
            pki = apiserver.pki
            jobs.append({"job_name": "apiserver", "scheme": "https",
                         "static_configs": [{"targets": [apiserver.url.removeprefix("https://")]}],
                         "tls_config": {"ca_file": str(pki.ca_crt), "cert_file": str(pki.admin_crt),
                                        "key_file": str(pki.admin_key)}})
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(rules)],
            "scrape_configs": jobs,
        }))

    def set_targets(self, group: str, targets: list[str], labels: dict | None = None) -> None:
        """One group of targets, replaced whole (written then renamed: Prometheus never reads half)."""
        path = self.dir / f"targets-{group}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": labels or {}}] if targets else []))
        os.replace(tmp, path)

    def start(self) -> "Prometheus":
        self.proc = start_process([
            str(PROMETHEUS), f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
        ], self.dir / "prometheus.log")
        wait_until_answers(self.proc, f"{self.url}/-/ready", "Prometheus", self.dir / "prometheus.log")
        return self

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
            self.proc = None

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, expr: str) -> float | None:
        """An instant query's single value (None when the result is empty)."""
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else None

    def alerts(self, state: str = "firing") -> list[dict]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def firing(self, name: str) -> list[dict]:
        return [a for a in self.alerts() if a["labels"]["alertname"] == name]
