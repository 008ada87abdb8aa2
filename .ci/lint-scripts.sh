#!/usr/bin/env bash
# The scripts' lint (make lint): shellcheck on every shell script, ruff on every Python file
# (ruff.toml), zizmor (offline, its default persona) on the GitHub workflows, and no lint
# disabled without a reason on the same line: a `# noqa: CODE` or a `# shellcheck disable=SC…`
# must be followed by ` - why` or `# why`. Installs the pinned linters from PyPI first, checked
# by hash (.ci/requirements/lint.txt; seconds, pip's cache keeps them).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  --require-hashes -r .ci/requirements/lint.txt
mapfile -t shell < <(git ls-files '*.sh' .ci/run .ci/test)
mapfile -t python < <(git ls-files '*.py')
shellcheck --severity=style "${shell[@]}"
echo "shellcheck: ${#shell[@]} scripts clean"
python3 -m ruff check --quiet "${python[@]}"
echo "ruff: ${#python[@]} files clean"
# The workflows: unpinned actions, excessive permissions, persisted credentials, template
# injection, cache poisoning... (offline: no lookups of what a pinned commit is).
zizmor --offline --no-progress .github/workflows/
# A disable with nothing after its codes (a reason starts with '-' or '#').
bare="$(grep -nE '#[[:space:]]*(noqa(:[[:space:]]*[A-Z0-9, ]+)?|shellcheck disable=[A-Z0-9,]+)[[:space:]]*$' \
  "${shell[@]}" "${python[@]}" || true)"
if [ -n "$bare" ]; then
  printf 'a lint disabled without a reason on the same line:\n%s\n' "$bare" >&2
  exit 1
fi
echo "every disabled lint says why"
