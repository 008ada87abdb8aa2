#!/usr/bin/env python3
"""The chart's values, documented once: `values.yaml` is the one source. Each value carries a
helm-docs style comment (`# -- description`, continued by `#` lines) on the lines just above
it. From that this script writes, in `values.schema.json`, the `description` and `default` of
each value's schema node, and in the chart's README the table between the `values:start` and
`values:end` markers.

  python3 charts/values-doc.py          # rewrite the schema and the README
  python3 charts/values-doc.py --check  # fail if either is stale or a value is undocumented
`make chart` runs the check.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent / "ephemeral-volume-injector"
VALUES = HERE / "values.yaml"
SCHEMA = HERE / "values.schema.json"
README = HERE / "README.md"
START, END = "<!-- values:start -->", "<!-- values:end -->"
# Maps documented as one value (their keys are the user's, not the chart's).
UNITS = {
    "resources",
    "nodeSelector",
    "webhook.legacyObjectSelector",
    "metrics.dashboard.labels",
    "metrics.dashboard.grafanaOperator.instanceSelector",
}


def comments(text: str) -> dict[str, str]:
    """Each key path's `# --` description, from the comment lines just above it."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and pending:
            # A continuation, unless it is commented-out YAML (an example).
            body = stripped[1:]
            if body.startswith(" ") and not body.startswith("  "):
                pending.append(body.strip())
            continue
        m = re.match(r"^( *)([A-Za-z0-9_.-]+):", line)
        if not m:
            if stripped and not stripped.startswith("#"):
                pending = []
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        path = ".".join(k for _, k in stack)
        if pending:
            out[path] = " ".join(pending)
        pending = []
    return out


def leaves(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    """The documented values: scalars, lists, empty maps and the UNITS, in file order."""
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in UNITS:
            out.extend(leaves(value, path + "."))
        else:
            out.append((path, value))
    return out


def schema_node(schema: dict, path: str) -> dict | None:
    node = schema
    for key in path.split("."):
        node = node.get("properties", {}).get(key)
        if node is None:
            return None
    return node


def cell(value: object) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`".replace("|", "\\|")


def render() -> tuple[str, str, list[str]]:
    """The schema and README as they should be, and the problems found."""
    text = VALUES.read_text()
    values = yaml.safe_load(text)
    described = comments(text)
    schema = json.loads(SCHEMA.read_text())
    problems, rows = [], []
    for path, default in leaves(values):
        description = described.get(path)
        if not description:
            problems.append(f"values.yaml: {path} has no `# --` description")
            continue
        node = schema_node(schema, path)
        if node is None:
            problems.append(f"values.schema.json: no schema for {path}")
            continue
        node["description"] = description
        node["default"] = default
        escaped = description.replace("|", "\\|")
        rows.append(f"| `{path}` | {cell(default)} | {escaped} |")
    table = "\n".join(["| value | default | description |", "|---|---|---|", *rows])
    readme = README.read_text()
    if START not in readme or END not in readme:
        problems.append(f"README.md: the {START} and {END} markers are missing")
        new_readme = readme
    else:
        head, rest = readme.split(START, 1)
        _, tail = rest.split(END, 1)
        new_readme = f"{head}{START}\n{table}\n{END}{tail}"
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n", new_readme, problems


def main() -> int:
    schema, readme, problems = render()
    for p in problems:
        print(p, file=sys.stderr)
    stale = [f.name for f, new in ((SCHEMA, schema), (README, readme)) if f.read_text() != new]
    if "--check" in sys.argv[1:]:
        for name in stale:
            print(f"{name} is stale: run python3 charts/values-doc.py", file=sys.stderr)
        return 1 if problems or stale else 0
    SCHEMA.write_text(schema)
    README.write_text(readme)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
