#!/usr/bin/env python3
"""The alerts as a plain Prometheus rule file, for a Prometheus without the operator: the
chart's PrometheusRule (templates/_alerts.tpl) rendered with the default values, its `spec`
written to monitoring/alerts.yaml. One source, so the two never disagree.

  python3 monitoring/render-alerts.py          # rewrite monitoring/alerts.yaml
  python3 monitoring/render-alerts.py --check  # fail if it is stale
  python3 monitoring/render-alerts.py --set k=v ... --out FILE   # other values (tests)
Needs helm 3 on PATH (`make tools-base` installs it; any helm 3 will do), and PyYAML.
`make chart` runs the check.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "ephemeral-volume-injector"
OUT = ROOT / "monitoring" / "alerts.yaml"
HEADER = """\
# The webhook's alerts as a Prometheus rule file (rule_files: in prometheus.yml). Runbooks:
# docs/alerts.md. Generated from the chart (templates/_alerts.tpl) with its default values by
# monitoring/render-alerts.py; with the Prometheus Operator, set metrics.prometheusRule.enabled
# in the chart instead.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as literal blocks, as a person writes them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def render(sets: list[str]) -> str:
    args = ["helm", "template", "evi", str(CHART), "--set", "metrics.prometheusRule.enabled=true"]
    for s in sets:
        args += ["--set", s]
    args += ["--show-only", "templates/prometheusrule.yaml"]
    if shutil.which("helm") is None:
        raise SystemExit(
            "render-alerts: helm is needed (it renders the chart's PrometheusRule) and is not on PATH: "
            "install helm 3, or run `make tools-base`"
        )
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"render-alerts: helm template failed:\n{done.stderr.strip()}")
    out = done.stdout
    rule = yaml.safe_load(out)
    return HEADER + yaml.dump(rule["spec"], Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = render(args.set)
    if args.check:
        if args.out.read_text() != text:
            print(f"{args.out.relative_to(ROOT)} is stale: run python3 monitoring/render-alerts.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
